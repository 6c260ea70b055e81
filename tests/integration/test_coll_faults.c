/* Faults in collectives: kill -9 one rank in the middle of a large
 * all-reduce. Every other rank's collective must return an error naming
 * the killed rank, the job must end, and nothing may be left behind: no
 * worker process and no /dev/shm/hpucoll-* segment of the job.
 *
 * Under hpulaunch (transport auto, i.e. shared memory within the node, and
 * tcp): hpulaunch sends the survivors SIGTERM as soon as one worker dies
 * and SIGKILL 2 s later. The worker (coll_fault_worker.c) blocks SIGTERM,
 * so a survivor prints its collective's error unless it is still waiting
 * 2 s after the kill; the test therefore asks of the library that a dead
 * peer on the node be reported within that grace, as coll.h promises ("a
 * peer on this node that has died is reported at once").
 *
 * Without hpulaunch (ranks forked here and connected with set_topology,
 * shm and tcp): nothing kills the survivors, so this checks the plain
 * contract, an error naming the dead rank within the 10 s timeout (and
 * hpucoll_comm_culprit giving its number, as dead), and
 * prints how long each rank took to report it (no assertion on time; the
 * test's own waits are bounded at 60 s). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <dirent.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"
#include "hpu/coll.h"

#define LAUNCH h_build("bin/hpulaunch")
#define WORKER h_build("bin/coll_fault_worker")
#define WS 4
#define BIG (32u << 20) /* floats per all-reduce: 128 MB */
#define MAX_SHM 256

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}

/* Names of /dev/shm entries that start with "hpucoll-"; returns how many. */
static int list_shm(char names[][256], int max)
{
	DIR *d = opendir("/dev/shm");
	struct dirent *e;
	int n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d)) && n < max)
		if (!strncmp(e->d_name, "hpucoll-", 8))
			snprintf(names[n++], 256, "%s", e->d_name);
	closedir(d);
	return n;
}

/* Prints the hpucoll-* entries that were not there before; returns how
 * many of them contain `job`. */
static int new_shm(char before[][256], int nb, const char *job)
{
	static char after[MAX_SHM][256];
	char key[96];
	int na = list_shm(after, MAX_SHM), mine = 0;

	snprintf(key, sizeof key, "hpucoll-%s-", job);
	for (int i = 0; i < na; i++) {
		int old = 0;

		for (int j = 0; j < nb && !old; j++)
			old = !strcmp(after[i], before[j]);
		if (old)
			continue;
		printf("left in /dev/shm: %s%s\n", after[i],
		       strncmp(after[i], key, strlen(key)) ? " (another job's)"
		                                           : " (this job's)");
		mine += !strncmp(after[i], key, strlen(key));
	}
	return mine;
}

/* Whether `text` names rank k: "rank k" not followed by another digit. */
static int names_rank(const char *text, size_t len, int k)
{
	char key[32];
	size_t kl = (size_t)snprintf(key, sizeof key, "rank %d", k);

	for (size_t i = 0; i + kl <= len; i++)
		if (!strncmp(text + i, key, kl) &&
		    (i + kl == len || !isdigit((unsigned char)text[i + kl])))
			return 1;
	return 0;
}

/* The rest of the line after `prefix` in out, or NULL; *len its length. */
static const char *line_after(const char *out, const char *prefix, size_t *len)
{
	const char *p = strstr(out, prefix), *e;

	if (!p)
		return NULL;
	p += strlen(prefix);
	e = strchr(p, '\n');
	*len = e ? (size_t)(e - p) : strlen(p);
	return p;
}

/* ---- under hpulaunch ---- */

static void launch_and_kill(const char *transport, int victim)
{
	static char before[MAX_SHM][256];
	char tenv[64], want[128], job[64] = "";
	char *env[] = {"HPUCOLL_TIMEOUT_MS=10000", tenv, NULL};
	char *argv[] = {(char *)LAUNCH, "--devices",    "4",
	                "--exec",       (char *)WORKER, NULL};
	pid_t pids[WS] = {0};
	int nb = list_shm(before, MAX_SHM), ok = 1;
	proc p;

	if (transport)
		snprintf(tenv, sizeof tenv, "HPUCOLL_TRANSPORT=%s", transport);
	else
		env[1] = NULL; /* auto: shared memory within the node */
	assert_int_equal(h_start(&p, argv, env), 0);

	/* Every rank has finished two all-reduces: they are all inside the
	 * loop, which is all-reduce from end to end. */
	for (int r = 0; r < WS && ok; r++) {
		snprintf(want, sizeof want, "[rank %d] rank %d iteration 2 ok",
		         r, r);
		ok = h_wait_for(&p, want, 120000) == 0;
	}
	const char *j = strstr(p.out, "hpulaunch: job ");
	if (j)
		sscanf(j + 15, "%63[^:]", job);
	for (int r = 0; r < WS; r++) {
		size_t len;
		char pre[48];

		snprintf(pre, sizeof pre, "[rank %d] rank %d pid ", r, r);
		const char *s = line_after(p.out, pre, &len);
		pids[r] = s ? (pid_t)atoi(s) : 0;
		ok &= pids[r] > 0;
	}
	if (!ok || !job[0]) {
		fprintf(stderr, "the job did not get going:\n%s\n", p.out);
		h_kill(&p);
		for (int r = 0; r < WS; r++)
			if (pids[r] > 0 && h_alive(pids[r]))
				kill(pids[r], SIGKILL);
		h_free(&p);
		fail();
	}

	kill(pids[victim], SIGKILL);
	long t0 = now_ms();
	int exited = h_wait(&p, 60000);
	long dt = now_ms() - t0;
	if (exited != 0)
		h_kill(&p);
	usleep(100000);
	int alive = 0;
	for (int r = 0; r < WS; r++)
		if (h_alive(pids[r])) {
			fprintf(stderr, "rank %d (pid %d) is still alive\n", r,
			        (int)pids[r]);
			alive++;
			kill(pids[r], SIGKILL);
		}
	printf("--- hpulaunch (transport %s), rank %d killed; it exited "
	       "after %ld ms with %d ---\n%s",
	       transport ? transport : "auto", victim, dt,
	       exited == 0 ? h_code(&p) : -1, p.out);

	int named = 0;
	for (int r = 0; r < WS; r++) {
		char pre[64];
		size_t len;

		if (r == victim)
			continue;
		snprintf(pre, sizeof pre,
		         "[rank %d] rank %d: all_reduce failed: ", r, r);
		const char *msg = line_after(p.out, pre, &len);
		if (!msg)
			fprintf(stderr, "rank %d printed no all_reduce error\n",
			        r);
		else if (!names_rank(msg, len, victim))
			fprintf(stderr,
			        "rank %d's error does not name rank %d: "
			        "%.*s\n",
			        r, victim, (int)len, msg);
		else
			named++;
	}
	int left = new_shm(before, nb, job);
	/* how the ranks learnt of the death: the closed connection, or
	 * the dead pid of a rank sharing the node's memory */
	char died[128];
	if (transport)
		snprintf(died, sizeof died, "rank %d died or cannot be reached (its connection closed and did not come back)",
		         victim);
	else
		snprintf(died, sizeof died, "rank %d died (local rank %d (pid %d) died)", victim, victim,
		         (int)pids[victim]);
	snprintf(want, sizeof want, "pid %d) was killed by signal 9",
	         (int)pids[victim]);

	assert_int_equal(exited, 0);
	assert_int_not_equal(h_code(&p), 0);
	assert_non_null(strstr(p.out, want));
	assert_non_null(strstr(p.out, died));
	assert_int_equal(alive, 0);
	assert_int_equal(named, WS - 1);
	assert_int_equal(left, 0);
	h_free(&p);
}

static void test_launch_kill_auto(void **state)
{
	(void)state;
	launch_and_kill(NULL, 2);
}

static void test_launch_kill_tcp(void **state)
{
	(void)state;
	launch_and_kill("tcp", 1);
}

/* ---- ranks forked here, no launcher ---- */

struct dshared {
	atomic_int ready;
	atomic_int iters[WS]; /* all-reduces completed */
	atomic_long kill_ms;  /* when the victim was killed (CLOCK_MONOTONIC) */
	char ep[WS][256];
	int rc[WS];
	long after_ms[WS]; /* from the kill to the error */
	char msg[WS][512];
	int culprit[WS], culprit_code[WS]; /* hpucoll_comm_culprit */
};

static char djob[64];

static int dchild(struct dshared *sh, int r, hpucoll_transport tr,
                  const char *bind)
{
	const char *eps[WS];
	int nodes[WS] = {0}, rc;
	hpucoll_comm *c = NULL;
	float *x = malloc(BIG * sizeof *x), *y = malloc(BIG * sizeof *y);
	long deadline = now_ms() + 60000;

	if (!x || !y || hpucoll_comm_new(&c, r, WS, bind) != HPUCOLL_OK)
		return 2;
	snprintf(sh->ep[r], sizeof sh->ep[r], "%s", hpucoll_comm_endpoint(c));
	atomic_fetch_add(&sh->ready, 1);
	while (atomic_load(&sh->ready) < WS && now_ms() < deadline)
		usleep(1000);
	for (int i = 0; i < WS; i++)
		eps[i] = sh->ep[i];
	if (hpucoll_comm_set_topology(c, nodes, djob, tr) != HPUCOLL_OK ||
	    hpucoll_comm_connect(c, eps) != HPUCOLL_OK) {
		fprintf(stderr, "rank %d: cannot connect: %s\n", r,
		        hpucoll_comm_errmsg(c));
		return 2;
	}
	hpucoll_comm_set_timeout(c, 10000);
	for (size_t i = 0; i < BIG; i++)
		x[i] = (float)(r + 1);
	for (;;) {
		rc = hpucoll_all_reduce(c, x, y, BIG, HPUCOLL_F32, HPUCOLL_SUM);
		if (rc != HPUCOLL_OK)
			break;
		atomic_fetch_add(&sh->iters[r], 1);
	}
	long k = atomic_load(&sh->kill_ms);
	sh->after_ms[r] = k ? now_ms() - k : -1;
	sh->rc[r] = rc;
	snprintf(sh->msg[r], sizeof sh->msg[r], "%s", hpucoll_comm_errmsg(c));
	sh->culprit[r] = hpucoll_comm_culprit(c, &sh->culprit_code[r]);
	hpucoll_comm_destroy(&c);
	free(x);
	free(y);
	return 1;
}

static void direct_kill(hpucoll_transport tr, int victim)
{
	static int seq;
	struct dshared *sh;
	pid_t pids[WS];
	char bind[160], path[128];
	int status, ok = 1;

	sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
	          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(sh != MAP_FAILED);
	memset(sh, 0, sizeof *sh);
	snprintf(djob, sizeof djob, "flt%dx%d", (int)getpid(), ++seq);
	fflush(stdout);
	for (int r = 0; r < WS; r++) {
		if (tr == HPUCOLL_TRANSPORT_TCP)
			snprintf(bind, sizeof bind, "tcp://127.0.0.1:*");
		else
			snprintf(bind, sizeof bind, "ipc:///tmp/hpucoll-%s-r%d",
			         djob, r);
		pids[r] = fork();
		assert_true(pids[r] >= 0);
		if (pids[r] == 0) {
			signal(SIGSEGV, SIG_DFL);
			signal(SIGABRT, SIG_DFL);
			signal(SIGBUS, SIG_DFL);
			_exit(dchild(sh, r, tr, bind));
		}
	}
	long deadline = now_ms() + 120000;
	for (int r = 0; r < WS; r++)
		while (atomic_load(&sh->iters[r]) < 2 && now_ms() < deadline)
			usleep(2000);
	for (int r = 0; r < WS; r++)
		ok &= atomic_load(&sh->iters[r]) >= 2;
	atomic_store(&sh->kill_ms, now_ms());
	kill(pids[victim], SIGKILL);
	waitpid(pids[victim], &status, 0);

	/* Survivors exit 1 once their all-reduce has failed. */
	int reported = 0, named = 0, blamed = 0;
	deadline = now_ms() + 60000;
	for (int r = 0; r < WS; r++) {
		if (r == victim)
			continue;
		while (waitpid(pids[r], &status, WNOHANG) != pids[r]) {
			if (now_ms() > deadline) {
				fprintf(stderr,
				        "rank %d still in its all-reduce "
				        "60 s after rank %d died\n",
				        r, victim);
				kill(pids[r], SIGKILL);
				waitpid(pids[r], &status, 0);
				break;
			}
			usleep(5000);
		}
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 1 ||
		    sh->rc[r] == HPUCOLL_OK) {
			fprintf(stderr, "rank %d did not report an error\n", r);
			continue;
		}
		reported++;
		named += names_rank(sh->msg[r], strlen(sh->msg[r]), victim);
		/* the number too, as dead (directly, or relayed by a peer) */
		blamed += sh->culprit[r] == victim && sh->culprit_code[r] == HPUCOLL_EPEER;
		if (sh->culprit[r] != victim || sh->culprit_code[r] != HPUCOLL_EPEER)
			fprintf(stderr, "rank %d's culprit: rank %d (%s), not rank %d (dead)\n", r,
			        sh->culprit[r], hpucoll_strerror(sh->culprit_code[r]), victim);
		printf("%s: rank %d, %ld ms after rank %d was killed: %s: %s\n",
		       tr == HPUCOLL_TRANSPORT_TCP ? "tcp" : "shm", r,
		       sh->after_ms[r], victim, hpucoll_strerror(sh->rc[r]),
		       sh->msg[r]);
	}
	snprintf(path, sizeof path, "/dev/shm/hpucoll-%s-n0", djob);
	if (access(path, F_OK) == 0)
		printf("(without a launcher to clean up, %s remains; "
		       "removing it)\n",
		       path);
	unlink(path);
	for (int r = 0; r < WS; r++) {
		snprintf(path, sizeof path, "/tmp/hpucoll-%s-r%d", djob, r);
		unlink(path);
		strcat(path, ".lock"); /* and its lock, free now */
		unlink(path);
	}
	munmap(sh, sizeof *sh);
	assert_true(ok);
	assert_int_equal(reported, WS - 1);
	assert_int_equal(named, WS - 1);
	assert_int_equal(blamed, WS - 1);
}

static void test_direct_kill_shm(void **state)
{
	(void)state;
	direct_kill(HPUCOLL_TRANSPORT_SHM, 1);
}

static void test_direct_kill_tcp(void **state)
{
	(void)state;
	direct_kill(HPUCOLL_TRANSPORT_TCP, 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_launch_kill_auto),
	    cmocka_unit_test(test_launch_kill_tcp),
	    cmocka_unit_test(test_direct_kill_shm),
	    cmocka_unit_test(test_direct_kill_tcp),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
