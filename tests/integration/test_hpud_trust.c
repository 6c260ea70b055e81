/* Integration tests of hpud on loopback: which files it trusts, and what
 * one job may do to another (hpudlib.h: a real daemon, the real hpulaunch).
 *
 * - start-up refusals: a key readable by others, root without a user;
 *   --gen-key; a configuration, key or worker program (or a directory
 *   above them) that someone else owns or may write, also on SIGHUP;
 * - job_uids: two jobs run as uids of their own and cannot read each
 *   other's environment or signal each other's workers; a job's end ends
 *   every process of its uid, and a uid is never given out while a
 *   process runs under it.
 * Needs root (the workers switch to the user 'nobody'). */
#include "tests/integration/hpudlib.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- start-up ---- */

static void test_key_permissions(void **state)
{
	(void)state;
	chmod(key_path, 0644);
	char *argv[] = {(char *)HPUD, "-c", conf_path, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 10000);
	printf("  %s", p.out);
	chmod(key_path, 0600);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, key_path));
	assert_non_null(strstr(p.out, "group or others"));
	h_free(&p);
	/* root with no user for the workers */
	char conf2[160];
	snprintf(conf2, sizeof conf2, "%s/nouser.conf", dir);
	char text[512];
	snprintf(text, sizeof text, "listen = 127.0.0.1\nport = %d\nkey = %s\n", port, key_path);
	assert_int_equal(h_write_file(conf2, text, 0644), 0);
	char *argv2[] = {(char *)HPUD, "-c", conf2, NULL};
	code = h_run(&p, argv2, NULL, 10000);
	printf("  %s", p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "hpud runs as root: set 'user = NAME' in "));
	h_free(&p);
	/* --gen-key does not overwrite */
	char *argv3[] = {(char *)HPUD, "--gen-key", key_path, NULL};
	code = h_run(&p, argv3, NULL, 10000);
	printf("  %s", p.out);
	assert_int_equal(code, 1);
	h_free(&p);
	struct stat st;
	assert_int_equal(stat(key_path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
}

/* hpud -c conf --check; its exit code, its output printed and in *p. */
static int check_conf(proc *p, const char *conf)
{
	char *argv[] = {(char *)HPUD, "-c", (char *)conf, "--check", NULL};
	int code = h_run(p, argv, NULL, 10000);
	printf("  %s", p->out);
	return code;
}

/* hpud -c conf --check refuses to start, naming `file` and saying `what`. */
static void assert_refused(const char *conf, const char *file, const char *what)
{
	proc p;
	int code = check_conf(&p, conf);
	if (code != 1 || !strstr(p.out, file) || !strstr(p.out, what))
		fail_msg("hpud -c %s --check exited %d; expected 1 and a message naming %s "
			 "with \"%s\"; it said:\n%s",
			 conf, code, file, what, p.out);
	h_free(&p);
}

/* devices = auto counts as hpulaunch --devices auto does: with device =
 * cuda and no GPU, hpud does not start and says hpulaunch's reason; with
 * auto there, one device per core. (On a GPU machine: test_conf.) */
static void test_devices_auto(void **state)
{
	(void)state;
	if (access("/dev/nvidiactl", F_OK) == 0) {
		printf("  NVIDIA's driver is here: not checked\n");
		return;
	}
	char text[1024];
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = auto\ndevice = cuda\nkey = %s\n"
		 "user = nobody\n", port, key_path);
	assert_int_equal(h_write_file(conf_path, text, 0644), 0);
	proc p, l;
	assert_int_equal(check_conf(&p, conf_path), 1);
	char *argv[] = {(char *)LAUNCH, "--devices", "auto", "--device", "cuda", (char *)MODEL, NULL};
	assert_int_equal(h_run(&l, argv, NULL, 30000), 2);
	printf("  %s", l.out);
	const char *mine = strstr(p.out, ": devices = auto, device = cuda: ");
	const char *theirs = strstr(l.out, "--devices auto --device cuda: ");
	assert_non_null(mine);
	assert_non_null(theirs);
	assert_non_null(strstr(p.out, conf_path));
	mine += strlen(": devices = auto, device = cuda: ");
	theirs += strlen("--devices auto --device cuda: ");
	size_t n = strcspn(theirs, "\n");
	assert_true(n > 0 && strcspn(mine, "\n") == n && !strncmp(mine, theirs, n));
	h_free(&p);
	h_free(&l);
	/* auto: the cores where there is no GPU */
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = auto\ndevice = auto\nkey = %s\n"
		 "user = nobody\n", port, key_path);
	assert_int_equal(h_write_file(conf_path, text, 0644), 0);
	assert_int_equal(check_conf(&p, conf_path), 0);
	char want[128];
	snprintf(want, sizeof want, "devices = auto, device = auto: %ld, one per online CPU core; no GPU: ",
		 sysconf(_SC_NPROCESSORS_ONLN));
	assert_non_null(strstr(p.out, want));
	h_free(&p);
	write_conf(2, NULL);
}

/* The key's and the worker's errors name the configuration's key that
 * set them, as every other key's FILE:LINE does; a worker that is not
 * executable says so (it said "Permission denied"); -c DIR says it is
 * the configuration. */
static void test_paths_named(void **state)
{
	(void)state;
	char text[1024], want[400], plain[192];
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\nkey = %s/no-such.key\nuser = nobody\n", port, dir);
	assert_int_equal(h_write_file(conf_path, text, 0644), 0);
	snprintf(want, sizeof want, " (key 'key' of %s)", conf_path);
	assert_refused(conf_path, "no-such.key: No such file or directory", want);
	snprintf(plain, sizeof plain, "%s/plain-worker", dir);
	assert_int_equal(h_write_file(plain, "#!/bin/sh\n", 0644), 0);
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\nkey = %s\nuser = nobody\nworker = %s\n", port,
		 key_path, plain);
	assert_int_equal(h_write_file(conf_path, text, 0644), 0);
	snprintf(want, sizeof want, "plain-worker: not executable (mode 0644) (key 'worker' of %s)",
		 conf_path);
	assert_refused(conf_path, plain, want);
	unlink(plain);
	assert_refused(dir, "the configuration ", ": Is a directory");
	write_conf(2, NULL);
}

/* hpud trusts no file that someone else could have written (as sshd's
 * StrictModes): the configuration, the key, the worker program and every
 * directory above them belong to root (or hpud's own user) and are not
 * writable by group or others; a root-owned sticky directory (/tmp, where
 * these files are) is fine. The attack of the review: a configuration of
 * mode 0666 saying `user = root`, with a key and a worker program owned by
 * nobody. A reload (SIGHUP) is refused the same way. */
static void test_untrusted_files(void **state)
{
	(void)state;
	const uid_t nobody = 65534;
	const gid_t same = (gid_t)-1;
	char sub[128], conf[192], key2[192], worker[192], text[1024];
	snprintf(sub, sizeof sub, "%s/trust", dir);
	assert_int_equal(mkdir(sub, 0755), 0);
	snprintf(conf, sizeof conf, "%s/hpud.conf", sub);
	snprintf(key2, sizeof key2, "%s/secret.key", sub);
	snprintf(worker, sizeof worker, "%s/worker.sh", sub);
	char *k = h_slurp(key_path);
	assert_non_null(k);
	assert_int_equal(h_write_file(key2, k, 0600), 0);
	free(k);
	snprintf(text, sizeof text, "#!/bin/sh\nexec %s \"$@\"\n", h_build("bin/hpu-worker"));
	assert_int_equal(h_write_file(worker, text, 0755), 0);
	snprintf(text, sizeof text, "listen = 127.0.0.1\nport = %d\nkey = %s\nuser = root\nworker = %s\n",
		 port, key2, worker);
	assert_int_equal(h_write_file(conf, text, 0644), 0);
	proc p;
	assert_int_equal(check_conf(&p, conf), 0); /* all root's: fine */
	h_free(&p);

	/* the attack: everything writable by nobody */
	assert_int_equal(chmod(conf, 0666), 0);
	assert_int_equal(chown(key2, nobody, same), 0);
	assert_int_equal(chown(worker, nobody, same), 0);
	assert_refused(conf, conf, "writable by group or others (mode 0666)");
	assert_int_equal(chmod(conf, 0644), 0);
	assert_int_equal(chown(conf, nobody, same), 0);
	assert_refused(conf, conf, "owned by uid 65534");
	assert_int_equal(chown(conf, 0, same), 0);
	assert_refused(conf, key2, "owned by uid 65534");
	assert_int_equal(chown(key2, 0, same), 0);
	assert_refused(conf, worker, "owned by uid 65534");
	assert_int_equal(chown(worker, 0, same), 0);
	assert_int_equal(chmod(worker, 0775), 0);
	assert_refused(conf, worker, "writable by group or others (mode 0775)");
	assert_int_equal(chmod(worker, 0755), 0);
	/* a directory passes the execute check: --check said "fine", and
	 * every rank of every job then failed with 127 */
	char wdir[300];
	snprintf(wdir, sizeof wdir, "%s/workerdir", sub);
	assert_int_equal(mkdir(wdir, 0755), 0);
	snprintf(text, sizeof text, "listen = 127.0.0.1\nport = %d\nkey = %s\nuser = root\nworker = %s\n",
		 port, key2, wdir);
	assert_int_equal(h_write_file(conf, text, 0644), 0);
	assert_refused(conf, wdir, "not a regular file (a directory)");
	snprintf(text, sizeof text, "listen = 127.0.0.1\nport = %d\nkey = %s\nuser = root\nworker = %s\n",
		 port, key2, worker);
	assert_int_equal(h_write_file(conf, text, 0644), 0);
	assert_int_equal(rmdir(wdir), 0);

	/* the directory above them */
	assert_int_equal(chown(sub, nobody, same), 0);
	assert_refused(conf, sub, "owned by uid 65534");
	assert_int_equal(chmod(sub, 01777), 0); /* sticky, but nobody's */
	assert_refused(conf, sub, "owned by uid 65534");
	assert_int_equal(chown(sub, 0, same), 0);
	assert_int_equal(chmod(sub, 0777), 0);
	assert_refused(conf, sub, "writable by group or others (mode 0777)");
	assert_int_equal(chmod(sub, 01777), 0); /* root's and sticky, like /tmp */
	assert_int_equal(check_conf(&p, conf), 0);
	h_free(&p);
	assert_int_equal(chmod(sub, 0755), 0);

	/* a reload of a configuration others may write is refused */
	start_daemon();
	assert_int_equal(chmod(conf_path, 0666), 0);
	kill(daemon_proc.pid, SIGHUP);
	int refused = h_wait_for(&daemon_proc, "reload refused", 5000);
	assert_int_equal(chmod(conf_path, 0644), 0);
	printf("  %s", refused == 0 ? strstr(daemon_proc.out, "reload refused") : daemon_proc.out);
	assert_int_equal(refused, 0);
	assert_non_null(strstr(strstr(daemon_proc.out, "reload refused"), conf_path));
	kill(daemon_proc.pid, SIGHUP);
	assert_int_equal(h_wait_for(&daemon_proc, "configuration reloaded", 5000), 0);
	/* a reload refused for its key file says nothing of the port it
	 * would have changed (it warned that the change would take effect
	 * after a restart, then refused it) */
	int was = port;
	port = was + 1;
	write_conf(2, NULL);
	port = was;
	assert_int_equal(chmod(key_path, 0644), 0);
	size_t before = strlen(daemon_proc.out);
	kill(daemon_proc.pid, SIGHUP);
	refused = h_wait_for(&daemon_proc, "reload refused, keeping the old configuration: key file", 5000);
	assert_int_equal(chmod(key_path, 0600), 0);
	write_conf(2, NULL);
	printf("  %s", daemon_proc.out + before);
	assert_int_equal(refused, 0);
	assert_null(strstr(daemon_proc.out + before, "listen/port changes"));
	stop_daemon();
}

/* ---- jobs of their own ---- */

/* Jobs cannot see or signal each other (issue 16, item 5): with
 * `job_uids`, every job's workers run as a uid of their own from the
 * range. Job isoa's worker looks up job isob's worker (both alive) and
 * tries to read its environment, where the job token is, and to signal
 * it: both are refused. The uids differ, lie in the range and are
 * nobody's; a range holding a user's uid is refused at start. */
static void test_jobs_isolated(void **state)
{
	(void)state;
	char flags[128], script[192], text[2048], path[256], line[256];
	snprintf(flags, sizeof flags, "%s/iso", dir);
	assert_int_equal(mkdir(flags, 0755), 0);
	assert_int_equal(chmod(flags, 01777), 0); /* the jobs' uids write here */
	snprintf(script, sizeof script, "%s/iso-worker.sh", dir);
	snprintf(text, sizeof text,
		 "#!/bin/sh\n"
		 "F=%s\n"
		 "echo \"$(id -u) $$\" > $F/.who.$HPU_JOB_ID && mv $F/.who.$HPU_JOB_ID $F/who.$HPU_JOB_ID\n"
		 "if [ \"$HPU_JOB_ID\" = isoa ]; then\n"
		 "  while [ ! -e $F/who.isob ]; do sleep 0.05; done\n"
		 "  read u p < $F/who.isob\n"
		 "  if cat /proc/$p/environ > /dev/null 2>&1; then e=read; else e=denied; fi\n"
		 "  if kill -0 $p 2> /dev/null; then k=signalled; else k=denied; fi\n"
		 "  echo \"environ $e kill $k\" > $F/.result && mv $F/.result $F/result\n"
		 "else\n"
		 "  while [ ! -e $F/result ]; do sleep 0.05; done\n"
		 "fi\n"
		 "exec %s \"$@\"\n",
		 flags, h_build("bin/hpu-worker"));
	assert_int_equal(h_write_file(script, text, 0755), 0);
	/* A range that holds nobody's uid (65534) is refused. */
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = 2\nkey = %s\nuser = nobody\n"
		 "worker = %s\njob_uids = 65530-65535\n",
		 port, key_path, script);
	assert_int_equal(h_write_file(conf_path, text, 0644), 0);
	assert_refused(conf_path, "job_uids 65530-65535", "belongs to user 'nobody'");
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = 2\nkey = %s\nuser = nobody\n"
		 "log_level = info\nsubmitter_timeout = 600\nworker = %s\n"
		 "job_uids = 61000-61009\n",
		 port, key_path, script);
	assert_int_equal(h_write_file(conf_path, text, 0644), 0);
	start_daemon();
	proc p[2];
	const char *ids[2] = {"isob", "isoa"};
	for (int i = 0; i < 2; i++) {
		char *a[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path,
			     "--job-id", (char *)ids[i], "--devices", "1", "--max-steps", "2",
			     "--log-every", "0", "--no-eval", (char *)MODEL, "--", "--hidden",
			     "16", NULL};
		assert_int_equal(h_start(&p[i], a, NULL), 0);
	}
	for (int i = 0; i < 2; i++) {
		assert_int_equal(h_wait(&p[i], 120000), 0);
		printf("%s", p[i].out);
		assert_int_equal(h_code(&p[i]), 0);
		h_free(&p[i]);
	}
	unsigned uid[2];
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof path, "%s/who.%s", flags, ids[i]);
		FILE *f = fopen(path, "r");
		assert_non_null(f);
		assert_int_equal(fscanf(f, "%u", &uid[i]), 1);
		fclose(f);
		printf("  job %s ran as uid %u\n", ids[i], uid[i]);
		assert_true(uid[i] >= 61000 && uid[i] <= 61009);
	}
	assert_int_not_equal(uid[0], uid[1]);
	snprintf(path, sizeof path, "%s/result", flags);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	assert_non_null(fgets(line, sizeof line, f));
	fclose(f);
	printf("  job isoa on job isob's worker: %s", line);
	assert_string_equal(line, "environ denied kill denied\n");
	stop_daemon();
	write_conf(2, NULL);
}

/* ---- what a job leaves under its uid ---- */

#define SETSID_MODEL h_build("lib/setsid_child.so")

/* The processes, zombies aside, whose real, effective, saved or
 * filesystem uid is uid. */
static int uid_procs(unsigned uid)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	int n = 0;
	while (d && (e = readdir(d)) != NULL) {
		char path[300], line[256];
		if (e->d_name[0] < '1' || e->d_name[0] > '9')
			continue;
		snprintf(path, sizeof path, "/proc/%s/status", e->d_name);
		FILE *f = fopen(path, "r");
		unsigned u[4];
		int zombie = 0, mine = 0;
		while (f && fgets(line, sizeof line, f)) {
			if (!strncmp(line, "State:", 6))
				zombie = strchr(line, 'Z') != NULL;
			if (sscanf(line, "Uid: %u %u %u %u", &u[0], &u[1], &u[2], &u[3]) == 4)
				mine = u[0] == uid || u[1] == uid || u[2] == uid || u[3] == uid;
		}
		if (f)
			fclose(f);
		n += mine && !zombie;
	}
	if (d)
		closedir(d);
	return n;
}

/* hpulaunch --hostfile, job `id` on one device: setsid_child with
 * `child` (setsid, detached, none) for `steps` steps. */
static void start_uid_job(proc *p, const char *id, const char *steps, const char *child,
			  const char *pid_dir)
{
	char *a[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path, "--job-id",
		     (char *)id, "--devices", "1", "--max-steps", (char *)steps, "--log-every", "0",
		     "--no-eval", (char *)SETSID_MODEL, "--", "--step-ms", "50", "--child",
		     (char *)child, "--pid-dir", (char *)pid_dir, NULL};
	assert_int_equal(h_start(p, a, NULL), 0);
}

/* The uid hpud says job `id` runs as ("job ID from ...: ... as uid N"). */
static unsigned job_uid(const char *id)
{
	char text[96];
	snprintf(text, sizeof text, "job %s from ", id);
	assert_int_equal(h_wait_for(&daemon_proc, text, 60000), 0);
	const char *as = strstr(strstr(daemon_proc.out, text), " as uid ");
	unsigned uid = 0;
	assert_non_null(as);
	assert_int_equal(sscanf(as, " as uid %u", &uid), 1);
	printf("  job %s runs as uid %u\n", id, uid);
	return uid;
}

/* Runs a 3-step job `id` to its end; returns its uid. */
static unsigned run_short_job(const char *id, const char *child, const char *pid_dir)
{
	proc p;
	start_uid_job(&p, id, "3", child, pid_dir);
	unsigned uid = job_uid(id);
	assert_int_equal(h_wait(&p, 120000), 0);
	if (h_code(&p))
		printf("%s", p.out);
	assert_int_equal(h_code(&p), 0);
	h_free(&p);
	return uid;
}

/* Issue 32, item 1: with job_uids, a job's leftover (a double fork,
 * setsid, an empty environment: nothing says whose it is) used to
 * survive its job while another job ran, and could read the token of
 * the next job to get the uid. Now a job's end ends every process of
 * its uid, and hpud gives out no uid a process runs under (one left from
 * before, a stray): it keeps that uid out of the pool, says so, ends the
 * processes and takes the uid back once none is left. Only the job that
 * left a process is named for it. */
static void test_leftovers_end_with_the_uid(void **state)
{
	(void)state;
	char pids[128], text[1024];
	snprintf(pids, sizeof pids, "%s/uidkids", dir);
	assert_int_equal(mkdir(pids, 0755), 0);
	assert_int_equal(chmod(pids, 01777), 0); /* the jobs' uids write here */
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = 2\nkey = %s\nuser = nobody\n"
		 "log_level = info\nsubmitter_timeout = 600\njob_uids = 61000-61009\n",
		 port, key_path);
	assert_int_equal(h_write_file(conf_path, text, 0644), 0);
	start_daemon();
	proc b; /* runs on while the others come and go */
	start_uid_job(&b, "uidb", "100000", "none", pids);
	unsigned ub = job_uid("uidb");

	/* job uida leaves a detached child and ends while uidb runs */
	unsigned ua = run_short_job("uida", "detached", pids);
	snprintf(text, sizeof text, "%s/child.0", pids);
	char *s = h_slurp(text);
	pid_t kid = s ? (pid_t)atoi(s) : -1;
	free(s);
	assert_true(kid > 0);
	int alive = h_alive(kid), left = uid_procs(ua);
	printf("  after job uida (uid %u) ended: its detached child %d %s, %d processes of uid %u\n",
	       ua, (int)kid, alive ? "alive" : "gone", left, ua);
	if (alive)
		kill(kid, SIGKILL);
	assert_false(alive);
	assert_int_equal(left, 0);

	/* a stray process under the uid the next job would get */
	pid_t stray = fork();
	assert_true(stray >= 0);
	if (stray == 0) {
		if (setresuid(ua, ua, ua) == 0)
			pause();
		_exit(1);
	}
	for (int t = 0; t < 500 && uid_procs(ua) == 0; t++) /* until it has switched */
		usleep(10000);
	assert_int_equal(uid_procs(ua), 1);
	unsigned uc = run_short_job("uidc", "none", pids);
	int stray_alive = h_alive(stray);
	if (stray_alive)
		kill(stray, SIGKILL);
	waitpid(stray, NULL, 0);
	assert_int_not_equal(uc, ua);
	assert_false(stray_alive);
	snprintf(text, sizeof text, "uid %u of job_uids is kept out of the pool", ua);
	const char *q = strstr(daemon_proc.out, text);
	assert_non_null(q);
	printf("  %.*s\n", (int)strcspn(q, "\n"), q);
	/* back in the pool once nothing runs under it */
	snprintf(text, sizeof text, "uid %u of job_uids is back in the pool", ua);
	assert_int_equal(h_wait_for(&daemon_proc, text, 30000), 0);
	assert_int_equal(run_short_job("uidd", "none", pids), ua);

	kill(b.pid, SIGINT);
	assert_int_equal(h_wait(&b, 30000), 0);
	assert_int_equal(h_code(&b), 128 + SIGINT);
	h_free(&b);
	assert_int_equal(h_wait_for(&daemon_proc, "job uidb node 0 ended", 10000), 0);
	assert_int_equal(uid_procs(ub), 0);
	/* the leftover is uida's, and no other job is blamed for it */
	const char *blame = strstr(daemon_proc.out, "left behind by the job's workers (job uida,");
	assert_non_null(blame);
	while (blame > daemon_proc.out && blame[-1] != '\n')
		blame--;
	printf("  %.*s\n", (int)strcspn(blame, "\n"), blame);
	assert_null(strstr(daemon_proc.out, "left behind by the job's workers (job uidb,"));
	assert_null(strstr(daemon_proc.out, "left behind by the job's workers (job uidc,"));
	assert_null(strstr(daemon_proc.out, "left behind by the job's workers (job uidd,"));
	stop_daemon();
	write_conf(2, NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_permissions),
		cmocka_unit_test(test_untrusted_files),
		cmocka_unit_test(test_paths_named),
		cmocka_unit_test(test_devices_auto),
		cmocka_unit_test(test_jobs_isolated),
		cmocka_unit_test(test_leftovers_end_with_the_uid),
	};
	int skip = hpud_test_init("test_hpud_trust");
	if (skip)
		return skip;
	return cmocka_run_group_tests(tests, hpud_setup, hpud_teardown);
}
