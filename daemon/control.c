/* hpud's timers and signals: the tick (submitters gone silent, stalled
 * output, quarantined uids), SIGHUP's reload of the configuration and the
 * key, SIGTERM's stop; loading the key, the workers' user and the
 * devices, which start-up (hpud.c) shares. Calls jobs.c and logging.c
 * (daemon/hpud.h). */
#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/trust.h"
#include "common/clock.h"
#include "daemon/hpud.h"

/* ---- timers and signals ---- */

void hpud__on_tick(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)revents;
	(void)loop;
	double now = hpu__mono_s();
	hpud__quarantine_check(&hpud__D.quarantine);
	/* a time hpud itself did not run (stopped, a stalled machine) is
	 * not the submitters' silence: their pings of it wait in the socket,
	 * read after this tick; it counts from when hpud runs again */
	ev_tstamp gap = now - hpud__D.last_tick;
	hpud__D.last_tick = now;
	if (gap > 2 * t->repeat) {
		hpud__logmsg(HPUD_LOG_INFO, "hpud did not run for %.1f s (stopped, or the machine "
			     "stalled): the submitters' silence counts from now", gap);
		for (int i = 0; i < MAX_JOBS; i++) { /* nor the reader's of output */
			hpud__D.jobs[i].last_ping += gap - t->repeat;
			hpud__D.jobs[i].out_moved += gap - t->repeat;
		}
	}
	for (int i = 0; i < MAX_JOBS; i++) {
		job *j = &hpud__D.jobs[i];
		double silent = now - j->last_ping;
		if (j->used && j->ended && !j->nj && silent > hpud__D.conf.submitter_timeout_s) {
			/* retired, its last messages waiting for a silent submitter */
			hpud__logmsg(HPUD_LOG_WARN, "job %s: the submitter (%s) went away: %ld messages to it dropped",
				     j->id, j->peer_addr, j->out.messages);
			hpud__release_job(j);
			continue;
		}
		if (!j->used || !j->nj || j->ended)
			continue;
		if (j->held && (j->peer_gone || now - j->out_moved >= OUTPUT_STALL_S))
			hpud__jobout_stall(&hpud__D.out, j, now - j->out_moved);
		if (silent > hpud__D.conf.submitter_timeout_s) {
			char reason[200];
			snprintf(reason, sizeof reason,
				 "the submitter (%s) went away: no ping for %.0f s", j->peer_addr,
				 silent);
			hpud__logmsg(HPUD_LOG_WARN, "job %s: %s", j->id, reason);
			hpu__nodejob_cancel(j->nj, reason, 2);
			j->last_ping = now + 3600; /* say it once */
			j->peer_gone = 1;
			if (j->held)
				hpud__jobout_stall(&hpud__D.out, j, now - j->out_moved);
		}
	}
}

/* The key changed (SIGHUP): new requests need it; the jobs running
 * under the one before may go on with theirs, the older ones may not. */
static void key_rotated(void)
{
	hpud__D.key_gen++;
	int prev = 0;
	for (int i = 0; i < MAX_JOBS; i++) {
		job *j = &hpud__D.jobs[i];
		if (!j->used)
			continue;
		if (j->key_gen + 1 == hpud__D.key_gen) {
			prev++;
			continue;
		}
		hpud__logmsg(HPUD_LOG_WARN, "job %s: started two key rotations ago: its submitter's key is no longer accepted, so its pings are not either",
			     j->id);
	}
	hpud__logmsg(HPUD_LOG_INFO, "reload: a new key: requests need it; %d job%s started under the previous key may go on with it (pings, cancels)",
		     prev, prev == 1 ? "" : "s");
}

/* The replay cache's size for a clock window of window_s: the nonces of
 * REPLAY_RATE requests a second over the window (twice the pings of
 * MAX_JOBS jobs, one a second each), at least 65536. At the largest
 * window, 3600 s, 460,800 nonces: about 17 MB. */
#define REPLAY_RATE (2 * MAX_JOBS)
static size_t replay_cache_size(double window_s)
{
	double n = REPLAY_RATE * window_s;
	return n > 65536 ? (size_t)n : 65536;
}

/* The key of the configuration, and its clock_window: at start, a new
 * verifier; on SIGHUP, the window applied (the nonces still in it kept)
 * and the key rotated if it changed. */
int hpud__load_key(char *err, size_t errlen)
{
	uint8_t key[HPU_AUTH_KEY_BYTES];
	double w = hpud__D.conf.clock_window_s;
	if (hpu__auth_load_key(hpud__D.conf.key_path, key, err, errlen) < 0)
		return -1;
	int rc = 0;
	if (!hpud__D.auth) {
		hpud__D.auth = hpu__auth_new(key, (int64_t)(w * 1000), replay_cache_size(w));
		rc = hpud__D.auth ? 0 : -1;
	} else if (w != hpud__D.window_s) {
		rc = hpu__auth_resize(hpud__D.auth, (int64_t)(w * 1000), replay_cache_size(w),
				      hpu__auth_now_ms());
		if (!rc)
			hpud__logmsg(HPUD_LOG_INFO, "reload: clock_window is now %g s (was %g s)", w,
				     hpud__D.window_s);
	}
	if (!rc && hpu__auth_rotate(hpud__D.auth, key))
		key_rotated();
	memset(key, 0, sizeof key);
	if (rc < 0) {
		snprintf(err, errlen, "out of memory for the replay cache of a clock_window of %g s", w);
		return -1;
	}
	hpud__D.window_s = w;
	return 0;
}

/* job_uids must be uids of nobody: a job would act as their owner. */
static int check_job_uids(const hpud_conf *c, char *err, size_t errlen)
{
	if (!c->job_uid_first)
		return 0;
	struct passwd *pw;
	int bad = 0;
	setpwent();
	while (!bad && (pw = getpwent()) != NULL)
		if (pw->pw_uid >= c->job_uid_first && pw->pw_uid <= c->job_uid_last) {
			snprintf(err, errlen, "%s: job_uids %u-%u holds uid %u, which belongs to user '%s': choose uids no user has",
				 hpud__D.conf_path, c->job_uid_first, c->job_uid_last,
				 (unsigned)pw->pw_uid, pw->pw_name);
			bad = 1;
		}
	endpwent();
	return bad ? -1 : 0;
}

/* The user workers run as. Root runs workers as root only when told so. */
int hpud__resolve_user(const hpud_conf *c, char *err, size_t errlen)
{
	hpud__D.set_user = 0;
	if (c->job_uid_first && geteuid() != 0) {
		snprintf(err, errlen, "%s: job_uids needs hpud to run as root (it switches each job's workers to a uid of its own)",
			 hpud__D.conf_path);
		return -1;
	}
	if (c->job_uid_first && !c->user[0]) {
		snprintf(err, errlen, "%s: job_uids needs 'user = NAME': the jobs' group is that user's",
			 hpud__D.conf_path);
		return -1;
	}
	if (!c->user[0]) {
		if (geteuid() == 0) {
			snprintf(err, errlen, "hpud runs as root: set 'user = NAME' in %s for the workers (or 'user = root' to run them as root)",
				 hpud__D.conf_path);
			return -1;
		}
		return 0;
	}
	struct passwd *pw = getpwnam(c->user);
	if (!pw) {
		snprintf(err, errlen, "%s: user '%s' does not exist", hpud__D.conf_path, c->user);
		return -1;
	}
	if (geteuid() != 0) {
		if (pw->pw_uid != geteuid()) {
			snprintf(err, errlen, "%s: user '%s': hpud is not root and cannot switch workers to another user",
				 hpud__D.conf_path, c->user);
			return -1;
		}
		return 0;
	}
	hpud__D.set_user = 1;
	hpud__D.uid = pw->pw_uid;
	hpud__D.gid = pw->pw_gid;
	return check_job_uids(c, err, errlen);
}

/* The worker program of c into out (PATH_MAX): its `worker`, or the
 * hpu-worker next to this program; it must be executable. */
int hpud__find_worker(const hpud_conf *c, char *out, char *err, size_t errlen)
{
	if (c->worker[0]) {
		snprintf(out, PATH_MAX, "%s", c->worker);
	} else {
		char self[PATH_MAX];
		ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
		char *slash = n > 0 ? (self[n] = 0, strrchr(self, '/')) : NULL;
		if (!slash) {
			snprintf(err, errlen, "cannot find hpu-worker: set 'worker = PATH'");
			return -1;
		}
		*slash = 0;
		if (strlen(self) + sizeof "/hpu-worker" > PATH_MAX) {
			snprintf(err, errlen, "the path of hpud is too long: set 'worker = PATH'");
			return -1;
		}
		memcpy(out, self, strlen(self));
		memcpy(out + strlen(self), "/hpu-worker", sizeof "/hpu-worker");
	}
	struct stat st = {0};
	if (access(out, X_OK) != 0) {
		/* a file that is there: what is wrong is its mode */
		if (errno == EACCES && stat(out, &st) == 0 && S_ISREG(st.st_mode))
			snprintf(err, errlen, "the worker program %.600s: not executable (mode %04o)",
				 out, (unsigned)(st.st_mode & 07777));
		else
			snprintf(err, errlen, "the worker program %.600s: %s", out, strerror(errno));
		return -1;
	}
	/* a directory passes access(X_OK): --check said "fine", and every
	 * rank of every job failed with 127 */
	if (stat(out, &st) != 0 || !S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "the worker program %.600s: not a regular file%s", out,
			 S_ISDIR(st.st_mode) ? " (a directory)" : "");
		return -1;
	}
	return 0;
}

/* devices = auto: the devices counted with the worker program, as
 * hpulaunch counts them (daemon/conf.h); the count is logged. */
int hpud__count_devices(hpud_conf *c, const char *worker, char *err, size_t errlen)
{
	char note[1024], why[1024];
	if (hpud__conf_count_devices(c, worker, note, sizeof note, why, sizeof why) < 0) {
		snprintf(err, errlen, "%.200s: %.800s", hpud__D.conf_path, why);
		return -1;
	}
	if (note[0])
		hpud__logmsg(HPUD_LOG_INFO, "%s", note);
	return 0;
}

static void reload(void)
{
	char err[1024], worker[PATH_MAX];
	hpud_conf c = hpud__D.conf;
	if (hpud__trust_path(hpud__D.conf_path, "the configuration", err, sizeof err) < 0 ||
	    hpud__conf_load(&c, hpud__D.conf_path, err, sizeof err) < 0 ||
	    hpud__find_worker(&c, worker, err, sizeof err) < 0 ||
	    hpud__trust_path(worker, "the worker program", err, sizeof err) < 0 ||
	    hpud__count_devices(&c, worker, err, sizeof err) < 0) {
		hpud__logmsg(HPUD_LOG_ERROR, "reload refused, keeping the old configuration: %s", err);
		return;
	}
	int moved = strcmp(c.listen, hpud__D.conf.listen) || c.port != hpud__D.conf.port;
	hpud_conf old = hpud__D.conf;
	hpud__D.conf = c;
	snprintf(hpud__D.conf.listen, sizeof hpud__D.conf.listen, "%s", old.listen);
	hpud__D.conf.port = old.port;
	/* the key last: it is rotated only when the reload takes */
	if (hpud__resolve_user(&hpud__D.conf, err, sizeof err) < 0 ||
	    hpud__trust_path(hpud__D.conf.key_path, "the key file", err, sizeof err) < 0 ||
	    hpud__load_key(err, sizeof err) < 0) {
		hpud__logmsg(HPUD_LOG_ERROR, "reload refused, keeping the old configuration: %s", err);
		hpud__D.conf = old;
		hpud__resolve_user(&hpud__D.conf, err, sizeof err);
		return;
	}
	/* said once the reload takes (a refused one changes nothing) */
	if (moved)
		hpud__logmsg(HPUD_LOG_WARN, "reload: listen/port changes take effect after a restart");
	for (int i = hpud__D.conf.devices; i < old.devices; i++)
		if (hpud__D.busy[i])
			hpud__logmsg(HPUD_LOG_WARN, "reload: device %d is still in use by a job", i);
	if (strcmp(worker, hpud__D.worker))
		hpud__logmsg(HPUD_LOG_INFO, "reload: the worker program is now %s (was %s; running jobs keep theirs)",
			     worker, hpud__D.worker);
	memcpy(hpud__D.worker, worker, sizeof worker);
	hpud__apply_log_level();
	hpud__logmsg(HPUD_LOG_INFO, "configuration reloaded from %s", hpud__D.conf_path);
}

/* SIGHUP: rereads the configuration and the key (systemd hears that hpud
 * reloads, and then that it is ready again, whether the reload took). */
void hpud__on_hup(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	hpud__notify("RELOADING=1");
	reload();
	hpud__notify("READY=1");
}

void hpud__on_term(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)revents;
	if (hpud__D.stopping) {
		ev_break(loop, EVBREAK_ALL);
		return;
	}
	hpud__D.stopping = 1;
	hpud__logmsg(HPUD_LOG_INFO, "%s: cancelling the jobs and stopping",
		     w->signum == SIGTERM ? "SIGTERM" : "SIGINT");
	hpud__notify("STOPPING=1");
	int left = 0;
	for (int i = 0; i < MAX_JOBS; i++)
		if (hpud__D.jobs[i].used && hpud__D.jobs[i].nj && !hpud__D.jobs[i].ended) {
			hpu__nodejob_cancel(hpud__D.jobs[i].nj, "hpud is shutting down", 2);
			left++;
		}
	if (!left)
		ev_break(loop, EVBREAK_ALL);
}
