/* The agent (agent.h): making one, starting and stopping its workers,
 * cleaning up after them, freeing it; the descriptions of a worker's end.
 * The rest is in files of their own (agent/agent_impl.h says which calls
 * which): spawn.c starts a worker, streams.c reads its output and sees
 * it end, sweep.c ends what it left, statuspipe.c reads its records. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/output.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/shmname.h"
#include "agent/agent_impl.h"

/* Every agent of this process: a process left behind becomes a child of
 * this process, whichever agent's job it came from. */
hpu_agent *hpu__agents;

hpu_agent *hpu__agent_new(struct ev_loop *loop, const hpu_agent_cfg *cfg)
{
	hpu_agent *a = calloc(1, sizeof *a);
	if (!a)
		return NULL;
	a->loop = loop;
	a->cfg = *cfg;
	if (a->cfg.world <= 0) {
		a->cfg.rank_base = cfg->node_rank * cfg->devices;
		a->cfg.world = cfg->nodes * cfg->devices;
	}
	a->w = calloc((size_t)cfg->devices, sizeof *a->w);
	if (!a->w) {
		free(a);
		return NULL;
	}
	a->next = hpu__agents;
	hpu__agents = a;
	return a;
}

int hpu__agent_rank(const hpu_agent *a, int local)
{
	return a->cfg.rank_base + local;
}

int hpu__agent_live(const hpu_agent *a)
{
	return a->live;
}

void hpu__describe_status(int status, char *out, size_t outlen)
{
	if (status == HPU_AGENT_LEFT_EARLY)
		snprintf(out, outlen, "exited with code 0 before the job ended");
	else if (WIFEXITED(status))
		snprintf(out, outlen, "exited with code %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(out, outlen, "was killed by signal %d (%s)",
			 WTERMSIG(status), strsignal(WTERMSIG(status)));
	else
		snprintf(out, outlen, "ended with status 0x%x", status);
}

void hpu__describe_blame(int culprit, hpu_blame how, const char *who, const char *where,
			 int reporter, int apart, char *out, size_t outlen)
{
	/* across nodes a lost connection is also what a partition looks like */
	if (how == HPU_BLAME_DIED)
		snprintf(out, outlen, "rank %d%s %s%s%s; rank %d found it gone", culprit, who,
			 apart ? "died or its node became unreachable" : "died",
			 *where ? " " : "", where, reporter);
	else if (how == HPU_BLAME_FAILED)
		snprintf(out, outlen, "rank %d%s failed first%s%s (its own error says why); rank %d "
				      "stopped because of it",
			 culprit, who, *where ? " " : "", where, reporter);
	else
		snprintf(out, outlen, "rank %d%s stopped answering%s%s; rank %d gave up waiting for it",
			 culprit, who, *where ? " " : "", where, reporter);
}

void hpu__describe_position(long step, long total, int phase, char *out, size_t outlen)
{
	char of[48] = "";
	if (total > 0)
		snprintf(of, sizeof of, " of %ld", total);
	if (phase == HPU_PHASE_SETUP)
		snprintf(out, outlen, "during setup, before step %ld%s", step + 1, of);
	else if (phase == HPU_PHASE_EVAL)
		snprintf(out, outlen, "in evaluation, after step %ld%s", step, of);
	else if (phase == HPU_PHASE_SAVE)
		snprintf(out, outlen, "while saving the checkpoint of step %ld%s", step, of);
	else if (phase == HPU_PHASE_DONE || (total > 0 && step >= total))
		snprintf(out, outlen, "after step %ld%s", step, of);
	else
		snprintf(out, outlen, "in step %ld%s", step + 1, of);
}

int hpu__agent_start(hpu_agent *a, char *err, size_t errlen)
{
	char names[256];
	int swept;

	/* What a worker leaves behind becomes our child, not init's, and can
	 * be found and ended (setsid or not). */
	prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
	a->started = 1;
	if ((swept = hpu__agent_sweep_ipc(a, names, sizeof names)) > 0)
		hpu__log(HPU_LOG_NOTICE, "removed %d ZeroMQ ipc file%s left in /tmp by jobs that ended without cleaning up (%s)",
			 swept, swept == 1 ? "" : "s", names);
	for (int i = 0; i < a->cfg.devices; i++) {
		worker *w = &a->w[i];
		w->a = a;
		w->local = i;
		w->rank = hpu__agent_rank(a, i);
		w->out.fd = w->err.fd = w->st.fd = -1;
		w->culprit = -1;
		w->prefix_len = (size_t)snprintf(w->prefix, sizeof w->prefix,
						 "[rank %d] ", w->rank);
		if (hpu__agent_spawn(a, w, err, errlen) < 0) {
			hpu__agent_stop(a, 0);
			return -1;
		}
	}
	hpu__agent_silence_start(a);
	return 0;
}

static void signal_all(hpu_agent *a, int sig)
{
	for (int i = 0; i < a->cfg.devices; i++)
		if (a->w[i].pid > 0 && !a->w[i].reaped)
			kill(-a->w[i].pid, sig);
}

/* The state letter of a /proc .../stat file ('?' where it cannot be
 * read). */
static char stat_state(const char *path)
{
	char buf[512];
	FILE *f = fopen(path, "r");
	if (!f)
		return '?';
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *paren = strrchr(buf, ')'); /* the name may hold spaces */
	return paren && paren[1] == ' ' && paren[2] ? paren[2] : '?';
}

/* The process's state: D where any of its threads is in D (after SIGKILL
 * the main thread is a zombie while an I/O thread waits in the kernel),
 * else the main thread's. */
static char proc_state(pid_t pid)
{
	char path[300];
	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "/proc/%d/task/%.32s/stat", (int)pid, e->d_name);
		if (stat_state(path) == 'D') {
			closedir(d);
			return 'D';
		}
	}
	if (d)
		closedir(d);
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	return stat_state(path);
}

#define STUCK_S 10.0

/* At the grace's end: SIGKILL what is left. Then, every STUCK_S, a
 * worker that still has not exited is said once, with its state: one
 * in D waits in the kernel (I/O to a hung disk or network filesystem),
 * where no signal reaches it, and the job ends only when it does (it
 * waited in silence). */
static void on_kill_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)revents;
	hpu_agent *a = t->data;
	if (!a->sigkill_at) {
		signal_all(a, SIGKILL);
		a->sigkill_at = hpu__mono_s();
		t->repeat = STUCK_S;
		ev_timer_again(loop, t);
		return;
	}
	for (int i = 0; i < a->cfg.devices; i++) {
		worker *w = &a->w[i];
		if (w->pid <= 0 || w->reaped || w->stuck_said)
			continue;
		w->stuck_said = 1;
		char st = proc_state(w->pid);
		hpu__log(HPU_LOG_WARNING,
			 "rank %d (pid %d) has not exited %.0f s after SIGKILL: its state is %c%s", w->rank,
			 (int)w->pid, hpu__mono_s() - a->sigkill_at, st,
			 st == 'D' ? " (uninterruptible: waiting in the kernel, most likely on I/O to a "
				     "hung disk or network filesystem, such as --nvme-path's or "
				     "--checkpoint-dir's, or in a frozen cgroup); it ends when that "
				     "does"
				   : "");
	}
}

/* SIGKILL sent now: the kill timer reports, every STUCK_S, what has not
 * exited. */
static void killed_now(hpu_agent *a)
{
	a->sigkill_at = hpu__mono_s();
	ev_timer_stop(a->loop, &a->kill_timer);
	ev_timer_init(&a->kill_timer, on_kill_timer, STUCK_S, STUCK_S);
	a->kill_timer.data = a;
	ev_timer_start(a->loop, &a->kill_timer);
}

void hpu__agent_stop(hpu_agent *a, double grace_s)
{
	/* no worker started to give it to (a node still waiting for node
	 * 0): the grace only delayed the exit by 2 s */
	if (!a->started)
		grace_s = 0;
	if (grace_s <= 0)
		a->impatient = 1;
	if (a->stopping && grace_s <= 0) { /* again, impatient: no more grace */
		signal_all(a, SIGKILL);
		a->kill_at = hpu__mono_s();
		killed_now(a);
	} else if (!a->stopping && grace_s <= 0) {
		signal_all(a, SIGKILL);
		killed_now(a);
	} else if (!a->stopping) {
		signal_all(a, SIGTERM);
		ev_timer_init(&a->kill_timer, on_kill_timer, grace_s, 0);
		a->kill_timer.data = a;
		ev_timer_start(a->loop, &a->kill_timer);
	}
	a->stopping = 1;
	/* The workers are gone already, not what they left: end it now. */
	if (a->draining)
		hpu__agent_end_leftovers(a);
}

/* Whether name is "hpucoll-<job>-<session>-n<node>" (shmname.h): this
 * node's segment of the job, whatever the coordinator's session was. */
static int is_node_seg(const char *name, const char *job, int node)
{
	int session = 0;
	return hpu__shm_seg_node(name, job, &session) == node && session;
}

/* The uid the workers run as: only their files are ever removed. */
static uid_t workers_uid(const hpu_agent *a)
{
	return a->cfg.set_user ? (uid_t)a->cfg.uid : geteuid();
}

/* Removes path when it is (itself, links not followed) the workers' user's;
 * a file another user made at that name stays. Returns 1 when removed. */
static int unlink_if_workers(const hpu_agent *a, int dirfd, const char *path)
{
	struct stat st;

	if (fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
	    st.st_uid != workers_uid(a) || S_ISDIR(st.st_mode))
		return 0;
	return unlinkat(dirfd, path, 0) == 0;
}

/* The job's segments (is_node_seg) some process has open or mapped (a
 * descriptor of one that has not mapped it yet counts): another job of
 * the same job id whose ranks are attaching, whose segments are not ours
 * to remove. One walk over /proc for all of them, made at the first
 * candidate. */
struct held {
	char **names;
	int n, cap, scanned;
};

/* Adds the segment s names ("/dev/shm/NAME" then ' ', '\n' or the end:
 * a deleted one reads "NAME (deleted)") when it is one of the job's. */
static void held_add(struct held *h, const hpu_agent *a, const char *s)
{
	char name[256];
	size_t n = strcspn(s, " \n");
	if (n == 0 || n >= sizeof name)
		return;
	memcpy(name, s, n);
	name[n] = 0;
	if (!is_node_seg(name, a->cfg.job_id, a->cfg.node_rank))
		return;
	if (h->n == h->cap) {
		int cap = h->cap ? 2 * h->cap : 8;
		char **more = realloc(h->names, (size_t)cap * sizeof *more);
		if (!more)
			return;
		h->names = more, h->cap = cap;
	}
	if ((h->names[h->n] = strdup(name)))
		h->n++;
}

static void held_scan(struct held *h, const hpu_agent *a)
{
	static const char shm[] = "/dev/shm/";
	char path[300], link[400], line[700];
	DIR *proc = opendir("/proc");
	struct dirent *p;
	h->scanned = 1;
	while (proc && (p = readdir(proc)) != NULL) {
		if (p->d_name[0] < '0' || p->d_name[0] > '9')
			continue;
		snprintf(path, sizeof path, "/proc/%s/fd", p->d_name);
		DIR *fds = opendir(path);
		struct dirent *f;
		while (fds && (f = readdir(fds)) != NULL) {
			char fp[600];
			snprintf(fp, sizeof fp, "%s/%s", path, f->d_name);
			ssize_t k = readlink(fp, link, sizeof link - 1);
			if (k > 0) {
				link[k] = 0;
				if (!strncmp(link, shm, sizeof shm - 1))
					held_add(h, a, link + sizeof shm - 1);
			}
		}
		if (fds)
			closedir(fds);
		snprintf(path, sizeof path, "/proc/%s/maps", p->d_name);
		FILE *m = fopen(path, "r");
		while (m && fgets(line, sizeof line, m)) {
			const char *at = strstr(line, shm);
			if (at)
				held_add(h, a, at + sizeof shm - 1);
		}
		if (m)
			fclose(m);
	}
	if (proc)
		closedir(proc);
}

static int seg_in_use(struct held *h, const hpu_agent *a, const char *name)
{
	if (!h->scanned)
		held_scan(h, a);
	for (int i = 0; i < h->n; i++)
		if (!strcmp(h->names[i], name))
			return 1;
	return 0;
}

int hpu__agent_cleanup(const hpu_agent *a)
{
	char path[512];
	int n = 0;
	DIR *dir = opendir("/dev/shm");
	struct dirent *e;
	struct held held = {0};
	while (dir && (e = readdir(dir)) != NULL) {
		/* only the workers' user's: never another user's file at our
		 * name; and not one a live process holds: the name matches any
		 * session of the job id (the agent does not learn its job's),
		 * so another job of the same id, its ranks attaching, lost its
		 * segment to this one's end and waited a minute for nothing */
		if (is_node_seg(e->d_name, a->cfg.job_id, a->cfg.node_rank) &&
		    !seg_in_use(&held, a, e->d_name))
			n += unlink_if_workers(a, dirfd(dir), e->d_name);
	}
	if (dir)
		closedir(dir);
	for (int i = 0; i < held.n; i++)
		free(held.names[i]);
	free(held.names);
	for (int i = 0; i < a->cfg.devices; i++) {
		char lock[520];
		snprintf(path, sizeof path, "/tmp/hpucoll-%s-r%d", a->cfg.job_id,
			 hpu__agent_rank(a, i));
		/* not while its lock (collectives/comm.c) is held: another
		 * running job of this job id has that path (this one's worker
		 * was refused it) */
		snprintf(lock, sizeof lock, "%s.lock", path);
		int fd = open(lock, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) {
			close(fd);
			continue;
		}
		n += unlink_if_workers(a, AT_FDCWD, path);
		unlink_if_workers(a, AT_FDCWD, lock);
		if (fd >= 0)
			close(fd);
	}
	return n;
}

/* Whether a socket of this network namespace is bound at path:
 * /proc/net/unix lists each bound one, listening or not, with its path
 * last on its line. Unreadable: taken as bound. */
static int unix_path_bound(const char *path)
{
	char line[4352];
	size_t n = strlen(path);
	int bound = 0;
	FILE *f = fopen("/proc/net/unix", "re");

	if (f == NULL)
		return 1;
	while (!bound && fgets(line, sizeof line, f) != NULL) {
		size_t k = strcspn(line, "\n");
		line[k] = '\0';
		bound = k > n && line[k - n - 1] == ' ' && strcmp(line + k - n, path) == 0;
	}
	fclose(f);
	return bound;
}

/* Whether connecting to the unix socket at path is refused: nothing
 * listens there (a bound socket of another network namespace listening
 * accepts; a full backlog answers EAGAIN, not this). */
static int connect_refused(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd, refused;

	if (strlen(path) >= sizeof sa.sun_path)
		return 0;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return 0;
	refused = connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno == ECONNREFUSED;
	close(fd);
	return refused;
}

/* Whether name is "hpucoll-<something>-r<rank>", a worker's ipc file. */
static int is_ipc_name(const char *name)
{
	const char *r = strrchr(name, '-');
	size_t digits;

	if (strncmp(name, "hpucoll-", 8) != 0 || r == NULL || r < name + 9 || r[1] != 'r')
		return 0;
	digits = strspn(r + 2, "0123456789");
	return digits > 0 && digits < 10 && r[2 + digits] == '\0';
}

/* Whether name is "<ipc file>.lock", the lock a rank holds beside its
 * ipc file (collectives/comm.c). */
static int is_ipc_lock_name(const char *name)
{
	char base[256];
	size_t n = strlen(name);
	if (n <= 5 || n - 5 >= sizeof base || strcmp(name + n - 5, ".lock") != 0)
		return 0;
	memcpy(base, name, n - 5);
	base[n - 5] = '\0';
	return is_ipc_name(base);
}

/* Removes a dead rank's lock file: a regular file of the workers' user
 * that no process holds, removed while this holds it (a rank that opened
 * it meanwhile finds its path gone and takes a new one: comm.c's
 * ipc_lock). 1 if removed. */
static int unlink_free_lock(const hpu_agent *a, int dfd, const char *name)
{
	struct stat st;
	int fd = openat(dfd, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return 0;
	int gone = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == workers_uid(a) &&
		   flock(fd, LOCK_EX | LOCK_NB) == 0 && unlinkat(dfd, name, 0) == 0;
	close(fd);
	return gone;
}

int hpu__agent_sweep_ipc(const hpu_agent *a, char *names, size_t len)
{
	char path[512];
	size_t used = 0;
	int n = 0;
	time_t now = time(NULL);
	DIR *dir = opendir("/tmp");
	struct dirent *e;
	struct stat st;

	if (len > 0)
		names[0] = '\0';
	while (dir && (e = readdir(dir)) != NULL) {
		/* a lock whose ipc file is gone (its own removed below, with
		 * its file): a dead rank's, once no process holds it */
		if (is_ipc_lock_name(e->d_name)) {
			char sock[256];
			size_t k = strlen(e->d_name) - 5;
			snprintf(sock, sizeof sock, "%.*s", (int)k, e->d_name);
			if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			    now - st.st_mtime >= HPU_AGENT_IPC_STALE_S &&
			    fstatat(dirfd(dir), sock, &st, AT_SYMLINK_NOFOLLOW) < 0 &&
			    errno == ENOENT && unlink_free_lock(a, dirfd(dir), e->d_name)) {
				n++;
				hpu__log_list_add(names, len, &used, e->d_name);
			}
			continue;
		}
		if (!is_ipc_name(e->d_name) ||
		    fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISSOCK(st.st_mode) || st.st_uid != workers_uid(a) ||
		    now - st.st_mtime < HPU_AGENT_IPC_STALE_S)
			continue;
		snprintf(path, sizeof path, "/tmp/%s", e->d_name);
		if (unix_path_bound(path) || !connect_refused(path) ||
		    unlinkat(dirfd(dir), e->d_name, 0) != 0)
			continue;
		n++;
		hpu__log_list_add(names, len, &used, e->d_name);
		char lock[300];
		snprintf(lock, sizeof lock, "%s.lock", e->d_name);
		if (unlink_free_lock(a, dirfd(dir), lock)) { /* the dead rank's, beside it */
			n++; /* counted as listed (it said 2 files, naming 4) */
			hpu__log_list_add(names, len, &used, lock);
		}
	}
	if (dir)
		closedir(dir);
	return n;
}

void hpu__agent_destroy(hpu_agent **pa)
{
	hpu_agent *a = *pa;
	if (!a)
		return;
	signal_all(a, SIGKILL);
	ev_timer_stop(a->loop, &a->kill_timer);
	hpu__agent_silence_stop(a);
	for (int i = 0; i < a->cfg.devices; i++) {
		worker *w = &a->w[i];
		if (w->pid > 0 && !w->reaped) {
			ev_child_stop(a->loop, &w->child);
			waitpid(w->pid, NULL, 0);
			w->reaped = 1;
		}
		stream *ss[2] = {&w->out, &w->err};
		for (int k = 0; k < 2; k++)
			if (ss[k]->fd >= 0 && w->pid > 0) {
				ev_io_stop(a->loop, &ss[k]->io);
				close(ss[k]->fd);
			}
		if (w->st.fd >= 0 && w->pid > 0) {
			ev_io_stop(a->loop, &w->st.io);
			close(w->st.fd);
		}
		if (w->log_fd >= 0 && w->pid > 0)
			hpu__output_file_close(w->log_fd, w->log_path);
	}
	ev_timer_stop(a->loop, &a->drain_timer);
	ev_timer_stop(a->loop, &a->sweep_timer);
	if (a->started && !a->swept)
		hpu__agent_end_leftovers_now(a);
	if (a->w[0].pid > 0)
		hpu__agent_cleanup(a);
	for (hpu_agent **p = &hpu__agents; *p; p = &(*p)->next)
		if (*p == a) {
			*p = a->next;
			break;
		}
	free(a->ended.v);
	free(a->unsure.v);
	free(a->w);
	free(a);
	*pa = NULL;
}
