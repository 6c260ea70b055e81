/* Integration tests: the real hpulaunch, hpu-worker and model, with real
 * processes and sockets on loopback, on one node: several workers train
 * as one, the demo's epoch, workers killed, leaving, crashing or leaving
 * processes behind, --exec's environment and transports, another user's
 * files at a job's names, forged data-plane frames. The refusals are in
 * test_launch_refusals, two nodes and torchrun's spellings in
 * test_launch_nodes. Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

#include "collectives/comm_internal.h"
#include "tests/harness.h"

#define LAUNCH h_build("bin/hpulaunch")
#define MODEL h_build("lib/fmnist_mlp.so")
/* the MLP with the fault knobs (tests/fixtures/fault_mlp.c) */
#define FAULT_MODEL h_build("lib/fault_mlp.so")

/* The loss of the metrics record for `step`, or NAN. */
static double loss_at(const char *metrics, int step)
{
	char key[48];
	snprintf(key, sizeof key, "{\"step\":%d,", step);
	const char *p = strstr(metrics, key), *l = p ? strstr(p, "\"loss\":") : NULL;
	return l ? strtod(l + 7, NULL) : NAN;
}

static void train_20_steps(int devices, const char *optimizer, const char *lr,
			   const char *metrics)
{
	char dev[8];
	snprintf(dev, sizeof dev, "%d", devices);
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", dev, "--max-steps", "20",
			"--log-every", "1", "--no-eval", "--optimizer", (char *)optimizer,
			"--lr", (char *)lr, "--metrics", (char *)metrics, (char *)MODEL, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	if (code != 0)
		fprintf(stderr, "%s", p.out);
	assert_int_equal(code, 0);
	h_free(&p);
}

/* Trains 20 steps on 1 and on 2 workers (same global batch and seed) and
 * returns the relative loss difference at `step`, after checking that
 * every step up to `strict_until` agrees within 1e-5 and every later one
 * within 1e-4. */
static double compare_runs(const char *optimizer, const char *lr, int workers,
			   int step, int strict_until)
{
	const char *m1 = "/tmp/hpu-test-eq-1.jsonl", *m2 = "/tmp/hpu-test-eq-2.jsonl";
	train_20_steps(1, optimizer, lr, m1);
	train_20_steps(workers, optimizer, lr, m2);
	char *a = h_slurp(m1), *b = h_slurp(m2);
	assert_non_null(a);
	assert_non_null(b);
	for (int s = 1; s <= 20; s++) {
		double x = loss_at(a, s), y = loss_at(b, s);
		assert_true(isfinite(x) && isfinite(y));
		assert_true(fabs(x - y) <= (s <= strict_until ? 1e-5 : 1e-4) * fabs(x));
	}
	double first = loss_at(a, 1), l1 = loss_at(a, step), l2 = loss_at(b, step);
	double rel = fabs(l1 - l2) / fabs(l1);
	printf("%s lr %s: step %d loss: 1 worker %.9g, %d workers %.9g, relative difference %.3g\n",
	       optimizer, lr, step, l1, workers, l2, rel);
	assert_true(isfinite(l1) && isfinite(l2));
	assert_true(l1 < first); /* it trains */
	free(a);
	free(b);
	unlink(m1);
	unlink(m2);
	return rel;
}

/* A 2-worker run and a 1-worker run with the same global batch and seed
 * give the same loss at every one of 20 steps within 1e-5 relative, with
 * AdamW; with SGD-momentum at lr 0.05 for 10 steps, and within 1e-4 after:
 * the products sum in another order at batch 128 than at 256, and that run
 * amplifies it (measured on oneDNN's kernels: at most 1.2e-7 through step
 * 11, then 2.4e-6 at step 12 and 1.7e-5 at step 19; OpenBLAS's happened to
 * stay at 1.2e-7). */
static void test_two_workers_match_one_sgd(void **state)
{
	(void)state;
	assert_true(compare_runs("sgd", "0.05", 2, 20, 10) <= 1e-4);
}

/* More workers than cores: 4 workers on this 2-core machine. */
static void test_four_workers_match_one_sgd(void **state)
{
	(void)state;
	assert_true(compare_runs("sgd", "0.05", 4, 20, 10) <= 1e-4);
}

static void test_two_workers_match_one_adamw(void **state)
{
	(void)state;
	assert_true(compare_runs("adamw", "0.001", 2, 20, 20) <= 1e-5);
}

/* The demo itself: one epoch on 2 workers. The metrics file has a line per
 * 50 steps and a final record; the test accuracy is that of a trained
 * model. One epoch's accuracy varies with the seed between about 0.83 and
 * 0.86 (PyTorch's as much as ours, bench/RESULTS.md), so the bar here is
 * 0.82: far above what a broken gradient or sampler gives. */
static void test_demo_epoch(void **state)
{
	(void)state;
	const char *m = "/tmp/hpu-test-demo.jsonl";
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--metrics", (char *)m,
			(char *)MODEL, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 300000);
	printf("%s", p.out);
	assert_int_equal(code, 0);
	h_free(&p);
	char *s = h_slurp(m);
	assert_non_null(s);
	for (int step = 50; step <= 200; step += 50)
		assert_true(isfinite(loss_at(s, step)));
	/* a step record's loss_scale at fp32 too, as observing.md says (it
	 * was left out there) */
	assert_non_null(strstr(s, "{\"step\":50,\"epoch\":1,\"loss\":"));
	assert_non_null(strstr(strstr(s, "{\"step\":50,"), "\"loss_scale\":1,"));
	const char *f = strstr(s, "\"final\":true");
	assert_non_null(f);
	const char *acc = strstr(f, "\"test_accuracy\":"), *steps = strstr(f, "\"steps\":");
	assert_non_null(acc);
	assert_non_null(steps);
	assert_int_equal(atoi(steps + 8), 234); /* 60000 / 256, drop_last */
	double a = strtod(acc + 16, NULL);
	printf("test accuracy %.4f\n", a);
	assert_true(a >= 0.82 && a <= 1.0);
	free(s);
	unlink(m);
}

/* kill -9 one worker mid-training: hpulaunch exits non-zero with the
 * root-cause line (no hang: it has a minute, for the workers' grace on a
 * loaded machine), and no worker process remains. */
static void test_kill_worker(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--epochs", "20", "--log-every", "2",
			(char *)MODEL, NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	int seen = h_wait_for(&p, "step 4/", 60000);
	pid_t kids[8];
	int n = h_children(p.pid, kids, 8);
	if (seen != 0 || n != 2) {
		fprintf(stderr, "training did not start (%d workers):\n%s\n", n, p.out);
		h_kill_groups(kids, n);
		h_kill(&p);
		fail();
	}
	kill(kids[1], SIGKILL);
	int exited = h_wait(&p, 60000);
	int alive = h_alive(kids[0]) || h_alive(kids[1]);
	h_kill_groups(kids, n);
	if (exited != 0)
		h_kill(&p);
	char want[96];
	snprintf(want, sizeof want, "pid %d) was killed by signal 9", (int)kids[1]);
	if (!strstr(p.out, want))
		fprintf(stderr, "no root-cause line '%s' in:\n%s\n", want, p.out);
	assert_int_equal(exited, 0);
	assert_int_not_equal(h_code(&p), 0);
	assert_non_null(strstr(p.out, want));
	assert_non_null(strstr(p.out, "hpulaunch: error: rank "));
	/* troubleshooting.md's first answer, on the terminal */
	assert_non_null(strstr(p.out, "hpulaunch: note: signal 9 is most often the kernel's "
				      "out-of-memory killer (dmesg says so)"));
	assert_false(alive);
	h_free(&p);
}

/* A run of 4 workers on `transport` (zero3, 300 steps) saving its
 * parameters to `params`; where pause_ms > 0, worker 2 is stopped
 * (SIGSTOP) that long once step 20 is logged. */
static void paused_run(const char *transport, const char *params, int pause_ms)
{
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "4", "--transport", (char *)transport,
			"--strategy", "zero3", "--max-steps", "300", "--batch-size", "48",
			"--log-every", "20", "--no-eval", "--save-params", (char *)params,
			(char *)MODEL, "--", "--hidden", "64", "--depth", "3", NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	if (pause_ms > 0) {
		pid_t kids[8];
		int seen = h_wait_for(&p, " step 20/", 120000), n = h_children(p.pid, kids, 8);
		if (seen != 0 || n != 4) {
			fprintf(stderr, "training did not start (%d workers):\n%s\n", n, p.out);
			h_kill_groups(kids, n);
			h_kill(&p);
			fail();
		}
		kill(kids[2], SIGSTOP);
		/* the stop landed while the job trained (a fast machine may
		 * have ended it since step 20 was said: nothing then tested) */
		h_wait(&p, 0);
		int stopped_in_time = !strstr(p.out, "trained 300 steps");
		usleep((useconds_t)pause_ms * 1000);
		kill(kids[2], SIGCONT);
		if (!stopped_in_time) {
			h_kill(&p);
			fail_msg("the run ended before the stop: lengthen it");
		}
	}
	int exited = h_wait(&p, 240000);
	if (exited != 0)
		h_kill(&p);
	if (exited != 0 || h_code(&p) != 0)
		fprintf(stderr, "%s run (pause %d ms):\n%s\n", transport, pause_ms, p.out);
	assert_int_equal(exited, 0);
	assert_int_equal(h_code(&p), 0);
	h_free(&p);
}

/* A worker stopped for 7 s (SIGSTOP, as a debugger, a frozen cgroup or a
 * paused VM may) on tcp and ipc: the job goes on once it goes on, with
 * the parameters of a run never stopped. ZeroMQ's heartbeats closed its
 * connections after 5 s and what was in flight on them was lost: the job
 * ended as a collective mismatch or a hang (HPUCOLL_HEARTBEAT_MS, 30 s
 * now). */
static void test_worker_paused(void **state)
{
	(void)state;
	static const char *const transports[] = {"tcp", "ipc"};
	for (int t = 0; t < 2; t++) {
		char a[96], b[96], cmd[256];
		snprintf(a, sizeof a, "/tmp/hpu-test-paused-%d-%s.bin", (int)getpid(), transports[t]);
		snprintf(b, sizeof b, "/tmp/hpu-test-straight-%d-%s.bin", (int)getpid(), transports[t]);
		paused_run(transports[t], b, 0);
		paused_run(transports[t], a, 7000);
		snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
		int same = system(cmd) == 0;
		printf("  %s: a worker stopped 7 s: parameters %s\n", transports[t],
		       same ? "bit-identical" : "DIFFER");
		unlink(a);
		unlink(b);
		assert_true(same);
	}
}

/* SIGTERM to hpulaunch tears the job down: exit 143, no worker left;
 * SIGHUP (a closed terminal) alike, exit 129 (its default action killed
 * hpulaunch alone, without a word, the workers by SIGKILL). */
static void signal_teardown(int sig, const char *said)
{
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--epochs", "20", "--log-every", "2",
			(char *)MODEL, "--", "--hidden", "64", NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	int seen = h_wait_for(&p, "step 2/", 60000);
	pid_t kids[8];
	int n = h_children(p.pid, kids, 8);
	assert_int_equal(seen, 0);
	assert_int_equal(n, 2);
	kill(p.pid, sig);
	int exited = h_wait(&p, 10000);
	int alive = h_alive(kids[0]) || h_alive(kids[1]);
	h_kill_groups(kids, n);
	if (exited)
		h_kill(&p);
	assert_int_equal(exited, 0);
	assert_int_equal(h_code(&p), 128 + sig);
	assert_non_null(strstr(p.out, said));
	assert_non_null(strstr(p.out, "stopping 2 workers"));
	assert_false(alive);
	h_free(&p);
}

static void test_sigterm_teardown(void **state)
{
	(void)state;
	signal_teardown(SIGTERM, "interrupted by SIGTERM on node 0");
}

static void test_sighup_teardown(void **state)
{
	(void)state;
	signal_teardown(SIGHUP, "interrupted by SIGHUP on node 0");
}

/* --exec: the environment every worker gets, and prefixed output. */
static void test_exec_environment(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "2", "--exec", "/bin/sh", "-c",
			"echo rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE "
			"node=$NODE_RANK master=$MASTER_ADDR blas=$OPENBLAS_NUM_THREADS "
			"job=${HPU_JOB_ID:+set} token=${HPU_JOB_TOKEN:+set}", NULL};
	proc p;
	assert_int_equal(h_run(&p, argv, NULL, 30000), 0);
	printf("%s", p.out);
	assert_non_null(strstr(p.out, "[rank 0] rank=0 local=0 world=2 lws=2 node=0 master=127.0.0.1 blas=1 job=set token=set"));
	assert_non_null(strstr(p.out, "[rank 1] rank=1 local=1 world=2 lws=2 node=0 master=127.0.0.1 blas=1 job=set token=set"));
	h_free(&p);
}

/* Collectives initialized from the environment, world sizes 1-4. */
static void test_exec_collectives(void **state)
{
	(void)state;
	for (int ws = 1; ws <= 4; ws++) {
		char dev[8], want[64];
		snprintf(dev, sizeof dev, "%d", ws);
		char *argv[] = {(char *)LAUNCH, "-q", "--devices", dev, "--exec",
				(char *)h_build("bin/coll_env_check"), NULL};
		proc p;
		int code = h_run(&p, argv, NULL, 120000);
		if (code)
			fprintf(stderr, "%s", p.out);
		assert_int_equal(code, 0);
		for (int r = 0; r < ws; r++) {
			snprintf(want, sizeof want, "[rank %d] coll ok: rank %d of %d", r, r, ws);
			assert_non_null(strstr(p.out, want));
		}
		h_free(&p);
	}
	/* a bad variable of libhpucoll's, at init from the environment: said
	 * as such (it read "cannot make the data socket at ...: ...") */
	char *env[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "NODE_RANK=0",
		       "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1", "HPU_JOB_ID=x", "HPU_JOB_TOKEN=abc",
		       "HPUCOLL_TIMEOUT_MS=abc", NULL};
	char *direct[] = {(char *)h_build("bin/coll_env_check"), NULL};
	proc p;
	int code = h_run(&p, direct, env, 30000);
	printf("HPUCOLL_TIMEOUT_MS=abc: exit %d: %s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "init: HPUCOLL_TIMEOUT_MS='abc' is not a whole number"));
	assert_null(strstr(p.out, "data socket"));
	h_free(&p);
}

/* Entries of /dev/shm whose names start with prefix. */
static int shm_entries(const char *prefix)
{
	DIR *d = opendir("/dev/shm");
	struct dirent *e;
	int n = 0;
	while (d && (e = readdir(d)) != NULL)
		n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	if (d)
		closedir(d);
	return n;
}

/* Every transport, forced with --transport, through the environment path;
 * nothing is left in /dev/shm or /tmp afterwards. */
static void test_exec_transports(void **state)
{
	(void)state;
	static const char *transports[] = {"auto", "tcp", "ipc", "shm"};
	for (int t = 0; t < 4; t++) {
		char *argv[] = {(char *)LAUNCH, "--devices", "3", "--job-id", "hpu-test-transports",
				"--transport", (char *)transports[t], "--exec",
				(char *)h_build("bin/coll_env_check"), NULL};
		proc p;
		int code = h_run(&p, argv, NULL, 120000);
		printf("--transport %s: exit %d\n", transports[t], code);
		if (code)
			fprintf(stderr, "%s", p.out);
		assert_int_equal(code, 0);
		assert_non_null(strstr(p.out, "[rank 2] coll ok: rank 2 of 3"));
		h_free(&p);
		assert_int_equal(shm_entries("hpucoll-hpu-test-transports-"), 0);
		assert_int_not_equal(access("/tmp/hpucoll-hpu-test-transports-r0", F_OK), 0);
	}
}

/* An empty file at path owned by nobody (another local user), with mode;
 * 0 (and a line saying the test is skipped) when not root. */
static int nobodys_file(const char *path, mode_t mode)
{
	if (geteuid() != 0) {
		printf("skipped: needs root to make a file as nobody\n");
		return 0;
	}
	unlink(path);
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL, mode);
	assert_true(fd >= 0);
	assert_int_equal(fchown(fd, 65534, 65534), 0);
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
	return 1;
}

/* Another local user creates the shared-memory segment a job with a known
 * job id would have used, first (an empty file, mode 0666): the job's
 * segment name carries a random part from the coordinator, so the job
 * neither adopts nor waits on the squatter's file, and leaves it alone. */
static void test_shm_squatted_name(void **state)
{
	(void)state;
	const char *path = "/dev/shm/hpucoll-hpu-test-squat-n0";
	if (!nobodys_file(path, 0666))
		return;
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--job-id", "hpu-test-squat",
			"--transport", "shm", "--exec", (char *)h_build("bin/coll_env_check"),
			NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	printf("job beside a squatted segment name: exit %d\n", code);
	if (code)
		fprintf(stderr, "%s", p.out);
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "[rank 1] coll ok: rank 1 of 2"));
	h_free(&p);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_uid, 65534);
	assert_int_equal(st.st_size, 0);
	unlink(path);
}

/* Another user's file at a worker's ipc path (/tmp/hpucoll-<job>-r0): the
 * worker fails at once naming the path and its owner (under the default
 * --data-plane auth it used to hang until the join timeout), and the
 * cleanup after the job leaves the file alone (it used to remove it, as
 * root). */
static void test_ipc_squatted_path(void **state)
{
	(void)state;
	const char *path = "/tmp/hpucoll-hpu-test-ipcsquat-r0";
	if (!nobodys_file(path, 0644))
		return;
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--job-id", "hpu-test-ipcsquat",
			"--transport", "ipc", "--exec", (char *)h_build("bin/coll_env_check"),
			NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	printf("job with another user's file at its ipc path: exit %d\n", code);
	if (code <= 0)
		fprintf(stderr, "%s", p.out);
	assert_true(code > 0);
	assert_non_null(strstr(p.out, "cannot bind ipc:///tmp/hpucoll-hpu-test-ipcsquat-r0: "
				      "the path exists and is owned by uid 65534"));
	h_free(&p);
	struct stat st;
	assert_int_equal(lstat(path, &st), 0);
	assert_int_equal(st.st_uid, 65534);
	unlink(path);
}

/* Two jobs of one job id under --transport ipc on one machine: a rank's
 * ipc path is its while it holds PATH.lock, so the second job's rank is
 * refused naming the path and what to do (ZeroMQ removed the running
 * job's path and bound over it: two jobs started at once joined each
 * other's collectives and both failed after a minute, blaming a rank's
 * exit). The running job's lock is held here by the test; the refused
 * job's cleanup leaves it; a lock nobody holds (a killed job's) is taken
 * and removed after. */
static void test_ipc_same_job_id(void **state)
{
	(void)state;
	const char *lock = "/tmp/hpucoll-hpu-test-ipcsame-r1.lock";
	unlink(lock);
	int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--job-id", "hpu-test-ipcsame",
			"--transport", "ipc", "--exec", (char *)h_build("bin/coll_env_check"),
			NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	printf("job of a running job's id: exit %d\n", code);
	if (code <= 0 || !strstr(p.out, "cannot bind ipc:///tmp/hpucoll-hpu-test-ipcsame-r1: a "
					 "running job's rank holds it (another job with the same "
					 "job id on this machine); give each job its own --job-id"))
		fail_msg("exit %d:\n%s", code, p.out);
	h_free(&p);
	struct stat st;
	assert_int_equal(lstat(lock, &st), 0); /* the running job's */
	close(fd);
	code = h_run(&p, argv, NULL, 120000);
	if (code != 0)
		fail_msg("a lock nobody holds: exit %d:\n%s", code, p.out);
	h_free(&p);
	assert_int_equal(lstat(lock, &st), -1);
	assert_int_equal(lstat("/tmp/hpucoll-hpu-test-ipcsame-r0.lock", &st), -1);
}

/* A limit on open files too low for the ranks' sockets (ulimit -n 26,
 * hard and soft, for 2 ranks on ipc): each rank is refused at start
 * naming the limit and what it needs (ZeroMQ's ipc listener aborted the
 * process, SIGABRT, once in five here, or a rank blamed its peer's
 * security handshake). */
static void test_open_file_limit(void **state)
{
	(void)state;
	char *argv[] = {"/bin/sh", "-c", "ulimit -n 26 && exec \"$@\"", "sh", (char *)LAUNCH,
			"--devices", "2", "--transport", "ipc", "--data-plane", "encrypt", "--exec",
			(char *)h_build("bin/coll_env_check"), NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	printf("ulimit -n 26: exit %d\n", code);
	if (code != 1 ||
	    !strstr(p.out, "the limit on open files (ulimit -n) is 26, and a rank of 2 needs about "
			   "36 (its ZeroMQ sockets and connections to the other ranks): raise it") ||
	    strstr(p.out, "signal"))
		fail_msg("exit %d:\n%s", code, p.out);
	h_free(&p);
	/* hpulaunch's own: ZeroMQ aborted it ("Too many open files
	 * (src/epoll.cpp:65)", exit 134) or a pipe failed unexplained */
	char *argv2[] = {"/bin/sh", "-c", "ulimit -n 12 && exec \"$@\"", "sh", (char *)LAUNCH,
			 "--devices", "2", "--exec", (char *)h_build("bin/coll_env_check"), NULL};
	code = h_run(&p, argv2, NULL, 60000);
	printf("ulimit -n 12: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "the limit on open files (ulimit -n) is 12, and hpulaunch needs "
				      "about 24 for 2 workers on this node"));
	h_free(&p);
}

/* A model that calls exit(0) in the middle of training: the job fails,
 * naming the rank that left, with one rank and with two (where the
 * survivor must not be blamed), and without --max-restarts hiding it. */
static void test_worker_leaves_early(void **state)
{
	(void)state;
	for (int world = 1; world <= 2; world++) {
		char devices[8], rank[8];
		snprintf(devices, sizeof devices, "%d", world);
		snprintf(rank, sizeof rank, "%d", world - 1);
		char *argv[] = {(char *)LAUNCH, "--devices", devices, "--max-steps", "20",
				"--log-every", "0", "--no-eval", (char *)FAULT_MODEL, "--",
				"--hidden", "16", "--exit-rank", rank, "--exit-at", "3", NULL};
		proc p;
		int code = h_run(&p, argv, NULL, 120000);
		printf("%d rank(s), rank %s calls exit(0) at step 3: exit %d\n%s", world, rank,
		       code, p.out);
		assert_int_equal(code, 1);
		char want[96];
		snprintf(want, sizeof want, "hpulaunch: error: rank %s (node 0, pid ", rank);
		const char *e = strstr(p.out, want);
		assert_non_null(e);
		const char *nl = strchr(e, '\n');
		const char *why = strstr(e, "exited with code 0 before the job ended (in step 3 of 20)");
		assert_true(why && (!nl || why < nl));
		h_free(&p);
	}
}

/* A rank that freezes after the run's last collective (fault_mlp
 * --stop-rank 1: SIGSTOP in its teardown), once rank 0 has finished: no
 * collective can find it any more, and hpulaunch waited for it without
 * end, saying nothing. Its keepalive stops, and HPUCOLL_TIMEOUT_MS (3 s
 * here) after rank 0 finished the job fails naming it. */
static void test_frozen_after_peer_finished(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--max-steps", "5", "--log-every", "0",
			"--no-eval", (char *)FAULT_MODEL, "--", "--hidden", "16", "--stop-rank", "1",
			NULL};
	char *env[] = {"HPUCOLL_TIMEOUT_MS=3000", NULL};
	proc p;
	int code = h_run(&p, argv, env, 120000);
	printf("rank 1 stops itself after rank 0 finished: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "hpulaunch: error: rank 1 (node 0, pid "));
	assert_non_null(strstr(p.out, "stopped answering after step 5 of 5: its process was silent "
				      "for "));
	assert_non_null(strstr(p.out, "past HPUCOLL_TIMEOUT_MS (stopped, or frozen as a whole), "
				      "after a rank of its node had finished"));
	h_free(&p);
}

/* A worker program that is not hpu-worker (HPU_WORKER, or hpud's
 * `worker =`, naming /bin/true): it exits 0 without ever saying hello on
 * its status pipe. The job failed as it should but hpulaunch said it
 * succeeded (exit 0, nothing trained). hpulaunch --exec's programs, which
 * never say hello, are still judged by their exit status. */
static void test_worker_not_hpu_worker(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--max-steps", "20", "--log-every", "0",
			"--no-eval", (char *)MODEL, "--", "--hidden", "16", NULL};
	char *env[] = {"HPU_WORKER=/bin/true", NULL};
	proc p;
	int code = h_run(&p, argv, env, 120000);
	printf("HPU_WORKER=/bin/true: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "exited with code 0 before the job ended (during setup, "
				      "before step 1; it never spoke to its agent: is the "
				      "worker program hpu-worker?)"));
	h_free(&p);
	char *ex[] = {(char *)LAUNCH, "--devices", "2", "--exec", "true", NULL};
	code = h_run(&p, ex, NULL, 60000);
	printf("--exec true: exit %d\n%s", code, p.out);
	assert_int_equal(code, 0);
	h_free(&p);
}

/* A worker that crashes (a model writing through a bad pointer) says so
 * before it dies: the signal, the address and a backtrace whose frames
 * name the model's library, so that a crash on a machine without a
 * debugger (a GPU machine) can be placed; the job fails naming the rank. */
/* A restart from the start (no checkpoint) adds to the --metrics file
 * after a record saying so (it began the file afresh: the failed
 * attempt's records were lost), and hpu-plot reads the steps from it on
 * (the abandoned attempt's dropped). */
static void test_restart_metrics_kept(void **state)
{
	(void)state;
	char dir[256], m[300], png[300];
	h_scratch_dir(dir, sizeof dir);
	snprintf(m, sizeof m, "%s/m.jsonl", dir);
	snprintf(png, sizeof png, "%s/m.png", dir);
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--max-restarts", "1", "--max-steps", "8",
			"--log-every", "2", "--no-eval", "--metrics", m, (char *)FAULT_MODEL, "--",
			"--hidden", "16", "--crash-rank", "1", "--crash-at", "5", "--crash-attempt",
			"0", NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	printf("a crash at step 5, restarted: exit %d\n", code);
	if (code != 0)
		printf("%s", p.out);
	assert_int_equal(code, 0);
	h_free(&p);
	char *s = h_slurp(m);
	assert_non_null(s);
	const char *restart = strstr(s, "{\"restart\":1,\"step\":0,\"from\":\"the start\"}\n");
	assert_non_null(restart);
	/* the failed attempt's steps 2 and 4 before it, the restart's after */
	const char *first = strstr(s, "{\"step\":2,");
	assert_true(first && first < restart);
	assert_non_null(strstr(restart, "{\"step\":8,"));
	free(s);
	char *plot[] = {(char *)h_build("bin/hpu-plot"), "--print-data", m, "-o", png, NULL};
	code = h_run(&p, plot, NULL, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 0);
	/* four steps, each once: the restart's */
	int rows = 0;
	for (const char *q = p.out; q && *q; q = strchr(q, '\n'), q = q ? q + 1 : NULL)
		rows += *q >= '0' && *q <= '9';
	h_free(&p);
	h_rmtree(dir);
	assert_int_equal(rows, 4);
}

static void test_worker_crash_reported(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--max-steps", "20", "--log-every", "0",
			"--no-eval", (char *)FAULT_MODEL, "--", "--hidden", "16", "--crash-rank", "1",
			"--crash-at", "3", NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	printf("rank 1 crashes at step 3: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "rank 1: crashed: signal 11 (Segmentation fault) at 0x10"));
	/* in which layer's call (it gave only the address and frames) */
	assert_non_null(strstr(p.out, "rank 1: in layer probe's forward"));
	const char *bt1 = strstr(p.out, "rank 1: backtrace:");
	assert_non_null(bt1);
	assert_non_null(strstr(bt1, "fault_mlp.so("));
	h_free(&p);
	/* the same on cpu-strict, whose handler passes faults outside its
	 * arena on: the address (it said the worker's pid, a raise()'s
	 * sender, where the address was) */
	char *argv_s[] = {(char *)LAUNCH, "--devices", "1", "--max-steps", "20", "--log-every",
			  "0", "--no-eval", "--device", "cpu-strict", (char *)FAULT_MODEL, "--",
			  "--hidden", "16", "--crash-rank", "0", "--crash-at", "3", NULL};
	code = h_run(&p, argv_s, NULL, 120000);
	printf("cpu-strict, rank 0 crashes at step 3: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "rank 0: crashed: signal 11 (Segmentation fault) at 0x10\n"));
	h_free(&p);
	/* ... and on cpu under --graphs (its recording's handler did the same) */
	char *argv_g[] = {(char *)LAUNCH, "--devices", "1", "--max-steps", "20", "--log-every",
			  "0", "--no-eval", "--graphs", "--graphs-warmup", "1", (char *)FAULT_MODEL,
			  "--", "--hidden", "16", "--crash-rank", "0", "--crash-at", "3", NULL};
	code = h_run(&p, argv_g, NULL, 120000);
	printf("cpu --graphs, rank 0 crashes at step 3: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "rank 0: crashed: signal 11 (Segmentation fault) at 0x10\n"));
	h_free(&p);
	/* in the model's setup(): said (it gave only the address and frames) */
	char *argv0[] = {(char *)LAUNCH, "--devices", "1", "--max-steps", "2", "--no-eval",
			 (char *)FAULT_MODEL, "--", "--crash-in-setup", NULL};
	code = h_run(&p, argv0, NULL, 120000);
	printf("a crash in setup(): exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "rank 0: crashed: signal 11 (Segmentation fault) at 0x10"));
	assert_non_null(strstr(p.out, "rank 0: in the model's setup()"));
	h_free(&p);
	/* ... after a declaration failed: its error is said (the crash hid
	 * it, the model having used the NULL it got) */
	char *argv0b[] = {(char *)LAUNCH, "--devices", "1", "--max-steps", "2", "--no-eval",
			  (char *)FAULT_MODEL, "--", "--after-failed-declaration", "crash", NULL};
	code = h_run(&p, argv0b, NULL, 120000);
	printf("a crash in setup() after a failed declaration: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "rank 0: in the model's setup()"));
	assert_non_null(strstr(p.out, "rank 0: the setup's first recorded error: layer orphan: "));
	assert_non_null(strstr(p.out, "no_such_tensor"));
	assert_non_null(strstr(p.out, "was killed by signal 11 (Segmentation fault) during setup"));
	h_free(&p);
	/* the layer calls given that NULL (several dereferenced it): they
	 * give nothing, and setup fails with the declaration's error */
	char *argv0c[] = {(char *)LAUNCH, "--devices", "1", "--max-steps", "2", "--no-eval",
			  (char *)FAULT_MODEL, "--", "--after-failed-declaration", "use", NULL};
	code = h_run(&p, argv0c, NULL, 120000);
	printf("the NULL of a failed declaration, used: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_null(strstr(p.out, "crashed"));
	assert_non_null(strstr(p.out, "layer orphan: "));
	assert_null(strstr(p.out, "gave something back"));
	h_free(&p);
	/* abort() (a failed assert, an uncaught C++ exception): the report
	 * as for a fault, and the closing error says where (it gave only
	 * the signal) */
	char *argv0d[] = {(char *)LAUNCH, "--devices", "2", "--max-steps", "20", "--log-every", "0",
			  "--no-eval", (char *)FAULT_MODEL, "--", "--hidden", "16", "--crash-rank", "1",
			  "--abort-at", "3", NULL};
	code = h_run(&p, argv0d, NULL, 120000);
	printf("rank 1 aborts at step 3: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "rank 1: crashed: signal 6 (Aborted)\n"));
	assert_non_null(strstr(p.out, "rank 1: abort() was called"));
	assert_non_null(strstr(p.out, "rank 1: in layer probe's forward"));
	assert_non_null(strstr(p.out, "rank 1: backtrace:"));
	assert_non_null(strstr(p.out, "was killed by signal 6 (Aborted) in step 3 of 20"));
	h_free(&p);
	/* a NULL the runtime gave back, used: the error it recorded is said
	 * (the documented "returns NULL with the layer's error" was lost) */
	char *argv2[] = {(char *)LAUNCH, "--devices", "2", "--max-steps", "20", "--log-every", "0",
			 "--no-eval", (char *)FAULT_MODEL, "--", "--hidden", "16", "--crash-rank", "1",
			 "--null-param-at", "3", NULL};
	code = h_run(&p, argv2, NULL, 120000);
	printf("rank 1 uses hpu_param's NULL at step 3: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "rank 1: crashed: signal 11 (Segmentation fault) at 0x0"));
	assert_non_null(strstr(p.out, "rank 1: in layer probe's forward"));
	assert_non_null(strstr(p.out, "rank 1: layer probe's last recorded error: hpu_param(): layer "
				      "probe has 0 parameters, asked for index 99"));
	const char *bt = strstr(p.out, "rank 1: backtrace:");
	assert_non_null(bt);
	assert_non_null(strstr(bt, "fault_mlp.so("));
	assert_non_null(strstr(p.out, "was killed by signal 11 (Segmentation fault) in step 3 of 20"));
	h_free(&p);
}

/* ---- processes a job's workers leave behind ---- */

#define SETSID_MODEL h_build("lib/setsid_child.so")

/* The pid the fixture setsid_child wrote for `rank` into dir, or -1. */
static pid_t leftover_pid(const char *dir, int rank)
{
	char path[256];
	snprintf(path, sizeof path, "%s/child.%d", dir, rank);
	char *s = h_slurp(path);
	pid_t pid = s ? (pid_t)atoi(s) : -1;
	free(s);
	return pid > 0 ? pid : -1;
}

/* Waits up to timeout_ms for both ranks' pid files; 0 when both are there. */
static int wait_leftover_pids(const char *dir, pid_t pids[2], int timeout_ms)
{
	for (int waited = 0;; waited += 50) {
		pids[0] = leftover_pid(dir, 0);
		pids[1] = leftover_pid(dir, 1);
		if (pids[0] > 0 && pids[1] > 0)
			return 0;
		if (waited >= timeout_ms)
			return -1;
		usleep(50000);
	}
}

/* Whether pid is gone altogether: not even a zombie (kill says ESRCH). */
static int gone(pid_t pid)
{
	return kill(pid, 0) == -1 && errno == ESRCH;
}

/* What a failed test must not leave sleeping for 300 s. */
static void kill_setsid_children(const char *dir)
{
	for (int r = 0; r < 2; r++) {
		pid_t pid = leftover_pid(dir, r);
		if (pid > 0)
			kill(pid, SIGKILL);
	}
}

/* Each rank of the model forks a child that calls setsid() and sleeps
 * with the worker's stdout, stderr and status pipe open. Training ends:
 * hpulaunch exits 0 soon after (not when the children's pipes close, 300
 * s later), says it ended the 2 processes left behind, and they are gone,
 * reaped. */
static void test_setsid_child_after_training(void **state)
{
	(void)state;
	char dir[64];
	h_scratch_dir(dir, sizeof dir);
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "2", "--max-steps", "3", "--no-eval",
			"--batch-size", "16", "--log-every", "1", (char *)SETSID_MODEL, "--",
			"--pid-dir", dir, NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	int exited = h_wait(&p, 60000);
	if (exited)
		h_kill(&p);
	pid_t pids[2] = {leftover_pid(dir, 0), leftover_pid(dir, 1)};
	int left[2] = {pids[0] > 0 && !gone(pids[0]), pids[1] > 0 && !gone(pids[1])};
	kill_setsid_children(dir);
	printf("%s", p.out);
	if (exited)
		fail_msg("hpulaunch still ran 60 s after starting a 3-step job");
	assert_int_equal(h_code(&p), 0);
	assert_non_null(strstr(p.out, "step 3/3"));
	assert_true(pids[0] > 0 && pids[1] > 0);
	assert_false(left[0]);
	assert_false(left[1]);
	assert_non_null(strstr(p.out, "hpulaunch: ended 2 processes left behind by the job's workers"));
	h_free(&p);
	assert_int_equal(h_rmtree(dir), 0);
}

/* SIGTERM to hpulaunch while the workers train and their setsid()
 * children sleep: it exits 143 and the children are gone too. */
static void test_setsid_child_sigterm(void **state)
{
	(void)state;
	char dir[64];
	h_scratch_dir(dir, sizeof dir);
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--epochs", "1000", "--no-eval",
			"--batch-size", "16", "--log-every", "1", (char *)SETSID_MODEL, "--",
			"--pid-dir", dir, "--step-ms", "50", NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	pid_t pids[2];
	int up = wait_leftover_pids(dir, pids, 60000) == 0 && h_wait_for(&p, "step 2/", 60000) == 0;
	if (!up || !h_alive(pids[0]) || !h_alive(pids[1])) {
		h_kill(&p);
		kill_setsid_children(dir);
		fail_msg("training or the setsid children did not start: %s", p.out);
	}
	kill(p.pid, SIGTERM);
	int exited = h_wait(&p, 60000);
	if (exited)
		h_kill(&p);
	int left[2] = {!gone(pids[0]), !gone(pids[1])};
	kill_setsid_children(dir);
	printf("%s", p.out);
	if (exited)
		fail_msg("hpulaunch still ran 60 s after SIGTERM");
	assert_int_equal(h_code(&p), 128 + SIGTERM);
	assert_non_null(strstr(p.out, "interrupted by SIGTERM"));
	assert_false(left[0]);
	assert_false(left[1]);
	assert_non_null(strstr(p.out, "hpulaunch: ended 2 processes left behind by the job's workers"));
	h_free(&p);
	assert_int_equal(h_rmtree(dir), 0);
}

/* The TCP ports process pid listens on; returns how many (at most max). */
static int listening_ports(pid_t pid, int *ports, int max)
{
	char path[64], link[64], line[512];
	unsigned long inodes[64];
	int ni = 0, n = 0;
	struct dirent *d;
	DIR *dir;
	FILE *f;

	snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
	if ((dir = opendir(path)) == NULL)
		return 0;
	while ((d = readdir(dir)) != NULL && ni < 64) {
		char fd[330];
		ssize_t len;

		snprintf(fd, sizeof fd, "%s/%s", path, d->d_name);
		len = readlink(fd, link, sizeof link - 1);
		if (len > 0) {
			link[len] = '\0';
			if (sscanf(link, "socket:[%lu]", &inodes[ni]) == 1)
				ni++;
		}
	}
	closedir(dir);
	if ((f = fopen("/proc/net/tcp", "r")) == NULL)
		return 0;
	while (fgets(line, sizeof line, f) && n < max) {
		unsigned port, st;
		unsigned long inode;

		if (sscanf(line, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu",
			   &port, &st, &inode) != 3 || st != 0x0A)
			continue;
		for (int i = 0; i < ni; i++)
			if (inodes[i] == inode)
				ports[n++] = (int)port;
	}
	fclose(f);
	return n;
}

/* The RANK in the environment of process pid (-1 if unknown). */
static int worker_rank(pid_t pid)
{
	char path[64], buf[8192];
	snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
	int fd = open(path, O_RDONLY), rank = -1;
	ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
	if (fd >= 0)
		close(fd);
	if (n > 0)
		buf[n] = '\0';
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1) {
		if (!strncmp(buf + i, "RANK=", 5))
			rank = atoi(buf + i + 5);
	}
	return rank;
}

/* What issue 16 found: any local process could end a job by sending one
 * forged ABORT to a worker's data port. Sends one to every port every
 * worker of p listens on; returns how many it sent. */
static int forge_aborts(void *ctx, const proc *p)
{
	static const char why[] = "rank 1 ran out of memory (forged)";
	struct hpucoll__hdr h = {.magic = HPUCOLL__MAGIC, .src = 1, .seq = 1,
				 .kind = HPUCOLL__ABORT, .arg = HPUCOLL_ENOMEM,
				 .len = sizeof why - 1};
	unsigned char b[HPUCOLL__HDR_SIZE];
	pid_t kids[8];
	int sent = 0, linger = 200;

	for (int k = 0, n = h_children(p->pid, kids, 8); k < n; k++) {
		int ports[8], np = listening_ports(kids[k], ports, 8);

		/* From the other rank of the two: a frame that claims to come
		 * from its receiver is refused as malformed, not believed. */
		h.src = worker_rank(kids[k]) == 0 ? 1 : 0;
		hpucoll__hdr_encode(b, &h);

		for (int i = 0; i < np; i++) {
			char ep[64];
			void *s = zmq_socket(ctx, ZMQ_PUSH);

			snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ports[i]);
			zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
			if (zmq_connect(s, ep) == 0 &&
			    zmq_send(s, b, sizeof b, ZMQ_SNDMORE) == (int)sizeof b &&
			    zmq_send(s, why, sizeof why - 1, 0) == (int)sizeof why - 1)
				sent++;
			zmq_close(s);
		}
	}
	return sent;
}

/* A 2-worker TCP job under --data-plane `mode`, attacked until it ends;
 * its output in out (caller frees) and its exit code returned. */
static int attacked_job(const char *mode, char **out)
{
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--transport", "tcp",
			"--data-plane", (char *)mode, "--max-steps", "30", (char *)FAULT_MODEL,
			"--sleep-rank", "1", "--sleep-ms", "3000", NULL};
	void *ctx = zmq_ctx_new();
	int sent = 0, code;
	proc p;

	assert_int_equal(h_start(&p, argv, NULL), 0);
	while (h_wait(&p, 200) != 0)
		sent += forge_aborts(ctx, &p);
	zmq_ctx_term(ctx);
	printf("--- --data-plane %s, %d forged frames sent ---\n%s", mode, sent, p.out);
	assert_true(sent > 0);
	code = h_code(&p);
	*out = strdup(p.out);
	h_free(&p);
	return code;
}

static void test_data_plane_refuses_forged_frames(void **state)
{
	(void)state;
	char *out;
	assert_int_equal(attacked_job("auth", &out), 0);
	assert_non_null(strstr(out, "refused a data-plane connection"));
	assert_null(strstr(out, "(forged)"));
	assert_non_null(strstr(out, "trained 30 steps"));
	free(out);
}

/* Without authentication the forgery is the job's root cause. */
static void test_data_plane_none_is_open(void **state)
{
	(void)state;
	char *out;
	assert_int_equal(attacked_job("none", &out), 1);
	assert_non_null(strstr(out, "(forged)"));
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exec_environment),
		cmocka_unit_test(test_exec_collectives),
		cmocka_unit_test(test_exec_transports),
		cmocka_unit_test(test_shm_squatted_name),
		cmocka_unit_test(test_ipc_squatted_path),
		cmocka_unit_test(test_ipc_same_job_id),
		cmocka_unit_test(test_open_file_limit),
		cmocka_unit_test(test_worker_leaves_early),
		cmocka_unit_test(test_worker_not_hpu_worker),
		cmocka_unit_test(test_frozen_after_peer_finished),
		cmocka_unit_test(test_worker_paused),
		cmocka_unit_test(test_worker_crash_reported),
		cmocka_unit_test(test_restart_metrics_kept),
		cmocka_unit_test(test_two_workers_match_one_sgd),
		cmocka_unit_test(test_two_workers_match_one_adamw),
		cmocka_unit_test(test_four_workers_match_one_sgd),
		cmocka_unit_test(test_demo_epoch),
		cmocka_unit_test(test_kill_worker),
		cmocka_unit_test(test_sigterm_teardown),
		cmocka_unit_test(test_sighup_teardown),
		cmocka_unit_test(test_setsid_child_after_training),
		cmocka_unit_test(test_setsid_child_sigterm),
		cmocka_unit_test(test_data_plane_refuses_forged_frames),
		cmocka_unit_test(test_data_plane_none_is_open),
	};
	/* HPU_TEST=test_name (a glob) runs only the tests it names. */
	if (getenv("HPU_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPU_TEST"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
