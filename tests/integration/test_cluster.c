/* Multi-node tests: nodes are Linux network namespaces on this machine
 * (deploy/netns-cluster.sh), each with its own address and its own hpud.
 *
 * - 2 and 3 nodes x 2 devices: hpulaunch --hostfile trains the MLP to the
 *   parameters of a single-node run with the same world size; one
 *   hpulaunch per namespace (torchrun style) gives the same;
 * - kill -9 one node's hpud mid-run, and cut one node's link mid-run: the
 *   job ends with an error naming the lost node or its ranks within a
 *   bounded time, and no worker is left anywhere; the killed hpud's job
 *   ends on the other workers' report that its ranks died (the error
 *   names one, "found it gone"), not on the daemon's silence;
 * - one node reports its part failed while another falls silent and node
 *   0 still runs: the submitter cancels node 0, and the error is the
 *   report, not "cancelled by the submitter" (iptables in node 0's
 *   namespace keeps node 1's report from its coordinator).
 * Needs root and `ip netns` (exit 77 otherwise). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "tests/integration/clusterlib.h"
#include "tests/harness.h"

#define HPUD h_build("bin/hpud")
#define LAUNCH h_build("bin/hpulaunch")
#define MODEL h_build("lib/fmnist_mlp.so")
#define PREFIX 7 /* the cluster index: 10.77.7.0/24 */

static char script[512], dir[64], key_path[128];
static int nodes_up;

/* N nodes, an hpud in each (2 devices, workers as nobody, a 10 s
 * collective timeout so a lost peer ends the job quickly). */
static void cluster_up(int n)
{
	assert_int_equal(sh("bash %s up %d %d >/dev/null", script, n, PREFIX), 0);
	nodes_up = n;
	setenv("HPUCOLL_TIMEOUT_MS", "10000", 1);
	for (int i = 0; i < n; i++) {
		char conf[128];
		snprintf(conf, sizeof conf, "%s/hpud-%d.conf", dir, i);
		FILE *f = fopen(conf, "w");
		assert_non_null(f);
		fprintf(f, "listen = 10.77.%d.%d\nport = 29400\ndevices = 2\nkey = %s\n"
			   "user = nobody\nsubmitter_timeout = 5\n",
			PREFIX, i + 1, key_path);
		fclose(f);
		assert_int_equal(sh("bash %s -p %d start-hpud %d %s %s >/dev/null", script, PREFIX, i,
				    HPUD, conf),
				 0);
	}
	unsetenv("HPUCOLL_TIMEOUT_MS");
	usleep(300000);
}

static void cluster_down(void)
{
	if (nodes_up)
		sh("bash %s down %d >/dev/null 2>&1", script, PREFIX);
	nodes_up = 0;
}

static void write_hostfile(const char *path, int n)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	for (int i = 0; i < n; i++)
		fprintf(f, "10.77.%d.%d slots=2\n", PREFIX, i + 1);
	fclose(f);
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof dir, "/tmp/hpu-cluster-XXXXXX");
	assert_non_null(mkdtemp(dir));
	/* the workers (nobody) write parameters here; sticky, so that hpud
	 * trusts the configuration and key in it (daemon/trust.h) */
	chmod(dir, 01777);
	snprintf(key_path, sizeof key_path, "%s/secret.key", dir);
	char *argv[] = {(char *)HPUD, "--gen-key", key_path, NULL};
	proc p;
	assert_int_equal(h_run(&p, argv, NULL, 10000), 0);
	h_free(&p);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	cluster_down();
	return sh("rm -rf %s", dir) == 0 ? 0 : -1;
}

/* The training options every equivalence run shares: 20 AdamW steps of a
 * small MLP, global batch 64 x world, parameters saved. */
#define TRAIN_OPTS(batch, out)                                                         \
	"--max-steps", "20", "--batch-size", batch, "--log-every", "0", "--no-eval",   \
		"--save-params", out, "--transport", "auto"
#define MODEL_ARGS "--", "--hidden", "64", "--depth", "3"

static void run_ok(char **argv, const char *what)
{
	proc p;
	int code = h_run(&p, argv, NULL, 300000);
	if (code != 0)
		fail_msg("%s: exit %d\n%s", what, code, p.out);
	h_free(&p);
}

static void equivalence(int n)
{
	char batch[16], hostfile[128], single[128], viahpud[128], pernode[128], dev[8];
	int world = 2 * n;
	snprintf(batch, sizeof batch, "%d", 64 * world);
	snprintf(hostfile, sizeof hostfile, "%s/hostfile", dir);
	snprintf(single, sizeof single, "%s/single-%d.bin", dir, n);
	snprintf(viahpud, sizeof viahpud, "%s/hpud-%d.bin", dir, n);
	snprintf(pernode, sizeof pernode, "%s/pernode-%d.bin", dir, n);
	snprintf(dev, sizeof dev, "%d", world);
	/* one node, the same world size */
	char *a1[] = {(char *)LAUNCH, "-q", "--devices", dev, TRAIN_OPTS(batch, single),
		      (char *)MODEL, MODEL_ARGS, NULL};
	run_ok(a1, "single node");
	cluster_up(n);
	write_hostfile(hostfile, n);
	char *a2[] = {(char *)LAUNCH, "-q", "--hostfile", hostfile, "--key", key_path, "--devices",
		      "2", TRAIN_OPTS(batch, viahpud), (char *)MODEL, MODEL_ARGS, NULL};
	run_ok(a2, "hpulaunch --hostfile");
	/* torchrun style: one hpulaunch per namespace */
	proc p[3];
	char nn[16], rank[3][16], master[32];
	snprintf(nn, sizeof nn, "%d", n);
	snprintf(master, sizeof master, "10.77.%d.1", PREFIX);
	char *env[] = {"HPU_JOB_TOKEN=cluster-test-token", "HPU_JOB_ID=pernode", NULL};
	for (int i = 0; i < n; i++) {
		char ns[32];
		snprintf(ns, sizeof ns, "hpu%d-n%d", PREFIX, i);
		snprintf(rank[i], sizeof rank[i], "%d", i);
		char *a3[] = {"/sbin/ip", "netns", "exec", ns, (char *)LAUNCH, "-q", "--nodes", nn,
			      "--node-rank", rank[i], "--devices", "2", "--master-addr", master,
			      "--master-port", "29500", TRAIN_OPTS(batch, pernode), (char *)MODEL,
			      MODEL_ARGS, NULL};
		assert_int_equal(h_start(&p[i], a3, env), 0);
	}
	for (int i = 0; i < n; i++) {
		int rc = h_wait(&p[i], 300000);
		if (rc != 0 || h_code(&p[i]) != 0)
			fail_msg("per-node hpulaunch on node %d: exit %d\n%s", i, h_code(&p[i]),
				 p[i].out);
		h_free(&p[i]);
	}
	int same1, same2;
	double r1 = params_rel_diff(viahpud, single, &same1), r2 = params_rel_diff(pernode, viahpud, &same2);
	printf("  %d nodes x 2 devices: through hpud vs one node of %d workers: relative difference %.3g%s\n",
	       n, world, r1, same1 ? " (bit-identical)" : "");
	printf("  %d nodes x 2 devices: one hpulaunch per node vs through hpud: relative difference %.3g%s\n",
	       n, r2, same2 ? " (bit-identical)" : "");
	assert_true(r1 <= 1e-5);
	assert_true(r2 <= 1e-5);
	cluster_down();
}

static void test_two_nodes(void **state)
{
	(void)state;
	equivalence(2);
}

static void test_three_nodes(void **state)
{
	(void)state;
	equivalence(3);
}

/* ---- hosts with different slots ---- */

/* The launch variables of job `job`'s hpu-worker processes (every
 * namespace shares the process table), one line per rank in rank order:
 * "rank=R local=L world=W lws=N node=K group=K cross=K/NODES lsize=N
 * role=R/W run=ID restarts=C", and their pids. Returns how many workers
 * it found. */
static int worker_envs(const char *job, char lines[][256], pid_t *pids, int max)
{
	static const char *const names[] = {"RANK",	  "LOCAL_RANK",	 "WORLD_SIZE", "LOCAL_WORLD_SIZE",
					    "NODE_RANK",  "GROUP_RANK",	 "CROSS_RANK", "CROSS_SIZE",
					    "LOCAL_SIZE", "ROLE_RANK",	 "ROLE_WORLD_SIZE",
					    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"};
	enum { NV = sizeof names / sizeof names[0] };
	char want[96];
	snprintf(want, sizeof want, "HPU_JOB_ID=%s", job);
	DIR *d = opendir("/proc");
	int n = 0;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		char path[300], buf[16384], comm[64] = "";
		snprintf(path, sizeof path, "/proc/%s/comm", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		if (!fgets(comm, sizeof comm, f))
			comm[0] = 0;
		fclose(f);
		if (strcmp(comm, "hpu-worker\n"))
			continue;
		snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
		if (!(f = fopen(path, "r")))
			continue;
		size_t len = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		const char *val[NV] = {0};
		int mine = 0;
		for (size_t i = 0; i < len; i += strnlen(buf + i, len - i) + 1) {
			mine |= !strcmp(buf + i, want);
			for (int k = 0; k < NV; k++)
				if (!strncmp(buf + i, names[k], strlen(names[k])) &&
				    buf[i + strlen(names[k])] == '=')
					val[k] = buf + i + strlen(names[k]) + 1;
		}
		int rank = val[0] ? atoi(val[0]) : -1;
		if (!mine || rank < 0 || rank >= max)
			continue;
		for (int k = 0; k < NV; k++)
			if (!val[k])
				val[k] = "unset";
		pids[rank] = (pid_t)atoi(e->d_name);
		snprintf(lines[rank], 256,
			 "rank=%s local=%s world=%s lws=%s node=%s group=%s cross=%s/%s lsize=%s "
			 "role=%s/%s run=%s restarts=%s",
			 val[0], val[1], val[2], val[3], val[4], val[5], val[6], val[7], val[8], val[9],
			 val[10], val[11], val[12]);
		n++;
	}
	if (d)
		closedir(d);
	return n;
}

/* Waits until job's 3 workers of attempt `restarts` run; checks each
 * rank's variables: ranks go host by host (2 on node 0, then 1 on node
 * 1), LOCAL_WORLD_SIZE is the node's slots, WORLD_SIZE their sum. */
static void check_uneven_envs(const char *job, int restarts)
{
	char lines[4][256], want[256];
	int n = 0;
	for (int i = 0; i < 300; i++) {
		pid_t pids[4];
		memset(lines, 0, sizeof lines);
		n = worker_envs(job, lines, pids, 4);
		char r[32];
		snprintf(r, sizeof r, "restarts=%d", restarts);
		if (n == 3 && strstr(lines[0], r) && strstr(lines[1], r) && strstr(lines[2], r))
			break;
		usleep(100000);
	}
	for (int r = 0; r < 3; r++)
		printf("  rank %d: %s\n", r, lines[r]);
	assert_int_equal(n, 3);
	static const int local[] = {0, 1, 0}, lws[] = {2, 2, 1}, node[] = {0, 0, 1};
	for (int r = 0; r < 3; r++) {
		snprintf(want, sizeof want,
			 "rank=%d local=%d world=3 lws=%d node=%d group=%d cross=%d/2 lsize=%d role=%d/3 "
			 "run=%s restarts=%d",
			 r, local[r], lws[r], node[r], node[r], node[r], lws[r], r, job, restarts);
		assert_string_equal(lines[r], want);
	}
}

/* A hostfile whose hosts have different slots (2 and 1, DeepSpeed's
 * format): the job trains to the parameters of one node with 3 workers;
 * every rank sees its place (ranks 0-1 on node 0, rank 2 on node 1), also
 * after a restart (rank 2 killed, --max-restarts 1). */
static void test_uneven_slots(void **state)
{
	(void)state;
	char hostfile[128], single[128], viahpud[128];
	snprintf(hostfile, sizeof hostfile, "%s/hostfile-uneven", dir);
	snprintf(single, sizeof single, "%s/single-uneven.bin", dir);
	snprintf(viahpud, sizeof viahpud, "%s/hpud-uneven.bin", dir);
	char *a1[] = {(char *)LAUNCH, "-q", "--devices", "3", TRAIN_OPTS("192", single),
		      (char *)MODEL, MODEL_ARGS, NULL};
	run_ok(a1, "single node, 3 workers");
	cluster_up(2);
	FILE *f = fopen(hostfile, "w");
	assert_non_null(f);
	fprintf(f, "10.77.%d.1 slots=2\n10.77.%d.2 slots=1\n", PREFIX, PREFIX);
	fclose(f);
	char *a2[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path,
		      TRAIN_OPTS("192", viahpud), (char *)MODEL, MODEL_ARGS, NULL};
	proc p;
	int code = h_run(&p, a2, NULL, 300000);
	printf("%s", p.out);
	if (code != 0)
		fail_msg("hpulaunch --hostfile (slots 2 and 1): exit %d", code);
	assert_non_null(strstr(p.out, "3 ranks on 2 nodes (2+1) through hpud"));
	assert_non_null(strstr(p.out, "[rank 0] trained 20 steps on 3 workers"));
	h_free(&p);
	int same;
	double r = params_rel_diff(viahpud, single, &same);
	printf("  hosts of 2 and 1 slots through hpud vs one node of 3 workers: relative difference %.3g%s\n",
	       r, same ? " (bit-identical)" : "");
	assert_true(r <= 1e-5);

	/* the variables, before and after a restart */
	char job[64];
	snprintf(job, sizeof job, "uneven-%d", (int)getpid());
	char *a3[] = {(char *)LAUNCH, "-q", "--hostfile", hostfile, "--key", key_path,
		      "--max-restarts", "1", "--job-id", job, "--epochs", "20", "--batch-size", "192",
		      "--log-every", "5", (char *)MODEL, MODEL_ARGS, NULL};
	assert_int_equal(h_start(&p, a3, NULL), 0);
	assert_int_equal(h_wait_for(&p, "step 5/", 180000), 0);
	check_uneven_envs(job, 0);
	pid_t pids[4] = {0};
	char lines[4][256];
	assert_int_equal(worker_envs(job, lines, pids, 4), 3);
	pid_t victim = pids[2];
	assert_true(victim > 0);
	kill(victim, SIGKILL);
	assert_int_equal(h_wait_for(&p, "restarting (restart 1 of 1)", 60000), 0);
	char cause[128];
	snprintf(cause, sizeof cause, "attempt 1 of 2 failed: rank 2 (node 1, pid %d) was killed by signal 9",
		 (int)victim);
	assert_non_null(strstr(p.out, cause));
	check_uneven_envs(job, 1);
	kill(p.pid, SIGINT);
	assert_int_equal(h_wait(&p, 60000), 0);
	printf("%s", strstr(p.out, "restarting") ? strstr(p.out, "restarting") : p.out);
	assert_int_equal(h_code(&p), 128 + SIGINT);
	h_free(&p);
	cluster_down();
}

/* ---- faults ---- */

static char job_id[64];

/* A long job on 3 nodes through hpud; returns once it trains. */
static void start_long_job(proc *p)
{
	static char hostfile[128];
	snprintf(hostfile, sizeof hostfile, "%s/hostfile", dir);
	write_hostfile(hostfile, 3);
	snprintf(job_id, sizeof job_id, "faults-%d", (int)getpid());
	char *a[] = {(char *)LAUNCH, "-q", "--hostfile", hostfile, "--key", key_path, "--devices",
		     "2", "--epochs", "20", "--batch-size", "384", "--log-every", "5",
		     "--job-id", job_id, (char *)MODEL, MODEL_ARGS, NULL};
	assert_int_equal(h_start(p, a, NULL), 0);
	assert_int_equal(h_wait_for(p, "step 10/", 180000), 0);
	assert_int_equal(job_procs(job_id), 6);
}

static void test_kill_hpud(void **state)
{
	(void)state;
	cluster_up(3);
	proc p;
	start_long_job(&p);
	double t0 = now_s();
	assert_int_equal(sh("bash %s -p %d stop-hpud 1 KILL >/dev/null", script, PREFIX), 0);
	const char *names[] = {"node 1", "rank 2", "rank 3", "10.77.7.2", NULL};
	expect_job_end(&p, job_id, t0, 40, names);
	/* ended on the other nodes' workers' report that node 1's ranks are
	 * gone, naming one of them, not on hpud's silence */
	const char *err = strstr(p.out, "hpulaunch: error: ");
	if (!err || (strncmp(err, "hpulaunch: error: rank 2 (node 1, pid ", 38) &&
		     strncmp(err, "hpulaunch: error: rank 3 (node 1, pid ", 38)) ||
	    !strstr(err, " found it gone") || strstr(err, "silent for"))
		fail_msg("the job did not end on the report of node 1's dead ranks:\n%s", p.out);
	h_free(&p);
	cluster_down();
}

static void test_link_down(void **state)
{
	(void)state;
	cluster_up(3);
	proc p;
	start_long_job(&p);
	double t0 = now_s();
	assert_int_equal(sh("bash %s -p %d link 2 down", script, PREFIX), 0);
	const char *names[] = {"node 2", "rank 4", "rank 5", "10.77.7.3", NULL};
	expect_job_end(&p, job_id, t0, 60, names);
	h_free(&p);
	sh("bash %s -p %d link 2 up", script, PREFIX);
	cluster_down();
}

/* Node 1 reports its part failed (rank 2 killed), node 2's hpud falls
 * silent, and node 0, which cannot hear node 1 (its packets dropped) and
 * whose workers are stopped, still runs: the submitter cancels it. Its
 * end, "cancelled by the submitter", is our own cancel, not the cause;
 * the error names rank 2. (A CI run of test_containers' disconnect said
 * only "cancelled by the submitter".) */
static void test_cancel_not_the_cause(void **state)
{
	(void)state;
	cluster_up(3);
	proc p;
	start_long_job(&p);
	pid_t pids[6] = {0};
	char lines[6][256];
	assert_int_equal(worker_envs(job_id, lines, pids, 6), 6);
	char c[700];
	snprintf(c, sizeof c, "bash %s -p %d hpud-pid 2", script, PREFIX);
	FILE *f = popen(c, "r");
	assert_non_null(f);
	char buf[32] = "";
	assert_non_null(fgets(buf, sizeof buf, f));
	pclose(f);
	pid_t hpud2 = (pid_t)atoi(buf);
	assert_true(hpud2 > 0);
	assert_int_equal(sh("bash %s -p %d exec 0 iptables -A INPUT -s 10.77.%d.2 -j DROP", script,
			    PREFIX, PREFIX),
			 0);
	kill(pids[0], SIGSTOP);
	kill(pids[1], SIGSTOP);
	kill(hpud2, SIGSTOP);
	kill(pids[2], SIGKILL);
	assert_int_equal(h_wait(&p, 40000), 0);
	kill(hpud2, SIGCONT);
	for (int r = 0; r < 6; r++)
		kill(pids[r], SIGCONT);
	sh("bash %s -p %d exec 0 iptables -F INPUT", script, PREFIX);
	const char *err = strstr(p.out, "hpulaunch: error: ");
	printf("  ended with exit %d: %.300s", h_code(&p), err ? err : p.out);
	assert_int_equal(h_code(&p), 1);
	char want[96];
	snprintf(want, sizeof want, "hpulaunch: error: rank 2 (node 1, pid %d) was killed by signal 9",
		 (int)pids[2]);
	if (!err || strncmp(err, want, strlen(want)) != 0)
		fail_msg("the error is not node 1's report of rank 2:\n%s", p.out);
	int left = -1;
	for (int i = 0; i < 400 && left; i++) {
		left = job_procs(job_id);
		if (left)
			usleep(100000);
	}
	printf("  workers left: %d\n", left);
	assert_int_equal(left, 0);
	h_free(&p);
	cluster_down();
}

int main(void)
{
	if (geteuid() != 0 || system("ip netns list >/dev/null 2>&1") != 0) {
		printf("test_cluster needs root and ip netns: skipped\n");
		return 77;
	}
	const char *src = getenv("HPU_SOURCE_DIR");
	snprintf(script, sizeof script, "%s/deploy/netns-cluster.sh", src ? src : ".");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_nodes),
		cmocka_unit_test(test_three_nodes),
		cmocka_unit_test(test_uneven_slots),
		cmocka_unit_test(test_kill_hpud),
		cmocka_unit_test(test_link_down),
		cmocka_unit_test(test_cancel_not_the_cause),
	};
	/* HPU_TEST=test_name (a glob) runs only the tests it names. */
	if (getenv("HPU_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPU_TEST"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
