/* Multi-node tests in real containers: the image deploy/Dockerfile builds,
 * run by podman (deploy/podman-cluster.sh) as 3 node containers with hpud,
 * jobs submitted from a fourth container with hpulaunch --hostfile.
 *
 * - a 3 x 2 job trains to the parameters of the same world size on one
 *   node (6 workers in one container);
 * - podman kill of a node container, and podman network disconnect of
 *   one, mid-job: the job ends within 15 s naming the lost node, and no
 *   worker is left in any container;
 * - --max-restarts 1 with checkpoints on a volume every container
 *   shares: a killed node container, started again by the test, and the
 *   job ends with parameters bit-identical to an uninterrupted run;
 * - every container, network, secret and volume is gone afterwards.
 *
 * main() builds the base image (debootstrap, once per machine) and the
 * project image (podman's layer cache keeps the packages between runs).
 * Exit 77 (skipped) with the reason when podman cannot run here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/clusterlib.h"
#include "tests/harness.h"

#define NAME "hputest"
#define SUBNET "10.91.77"
#define IMAGE "localhost/hputrain:test"
#define MODEL "/opt/hputrain/lib/hputrain/fmnist_mlp.so"
#define MODEL_ARGS "--", "--hidden", "64", "--depth", "3"
/* the job's end after a node is lost, a bound against a hang: the
 * collectives' 10 s timeout, the agents' 10 s heartbeat, the 2 s grace
 * and the way back to the submitter, with room for a loaded machine */
#define BOUND_S 40.0

static char script[512], volume[512];

/* The script with this test's cluster, image and node environment: a
 * 10 s collective timeout, as test_cluster's hpuds have. */
static void cluster(char *out, size_t len)
{
	snprintf(out, len, "bash %s -n %s -s %s -e HPUCOLL_TIMEOUT_MS=10000", script, NAME, SUBNET);
}

static void up(void)
{
	char c[1024];
	cluster(c, sizeof c);
	double t0 = now_s();
	if (sh("%s up 3", c) != 0)
		fail_msg("podman-cluster.sh up 3 failed (its error is above)");
	printf("  3 node containers up in %.1f s\n", now_s() - t0);
	FILE *f = popen("podman volume inspect -f '{{.Mountpoint}}' " NAME "-shared", "r");
	assert_non_null(f);
	assert_non_null(fgets(volume, sizeof volume, f));
	pclose(f);
	volume[strcspn(volume, "\n")] = 0;
}

static int down(void **state)
{
	(void)state;
	char c[1024];
	cluster(c, sizeof c);
	return sh("%s down >/dev/null 2>&1", c) == 0 ? 0 : -1;
}

/* argv of `podman-cluster.sh CMD ...` (the script's options included)
 * for h_start/h_run: at most 54 arguments after CMD. */
typedef struct {
	char *v[64];
	int n;
} cmdline;

static void cmd(cmdline *c, const char *what, ...)
{
	c->n = 0;
	const char *fixed[] = {"/bin/bash", script, "-n", NAME, "-s", SUBNET,
			       "-e", "HPUCOLL_TIMEOUT_MS=10000", what};
	for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
		c->v[c->n++] = (char *)fixed[i];
	va_list ap;
	va_start(ap, what);
	for (char *a; (a = va_arg(ap, char *)) && c->n < 63;)
		c->v[c->n++] = a;
	va_end(ap);
	c->v[c->n] = NULL;
}

static void run_ok(cmdline *c, const char *what)
{
	proc p;
	int code = h_run(&p, c->v, NULL, 300000);
	if (code != 0 || h_code(&p) != 0)
		fail_msg("%s: exit %d\n%s", what, h_code(&p), p.out);
	h_free(&p);
}

static void shared(char *out, size_t len, const char *name)
{
	snprintf(out, len, "%s/%s", volume, name);
}

/* The training options every equivalence run shares (test_cluster's). */
#define TRAIN_OPTS(out)                                                                  \
	"-q", "--max-steps", "20", "--batch-size", "384", "--log-every", "0", "--no-eval", \
		"--save-params", out

static void test_same_as_one_node(void **state)
{
	(void)state;
	up();
	cmdline c;
	cmd(&c, "submit", "--devices", "2", TRAIN_OPTS("/shared/nodes.bin"), MODEL, MODEL_ARGS,
	    NULL);
	run_ok(&c, "3 nodes x 2 devices from the submit container");
	cmd(&c, "run", "hpulaunch", "--devices", "6", TRAIN_OPTS("/shared/one.bin"), MODEL,
	    MODEL_ARGS, NULL);
	run_ok(&c, "one container, 6 workers");
	char a[600], b[600];
	shared(a, sizeof a, "nodes.bin");
	shared(b, sizeof b, "one.bin");
	int same;
	double r = params_rel_diff(a, b, &same);
	printf("  3 node containers x 2 vs one container of 6: relative difference %.3g%s\n", r,
	       same ? " (bit-identical)" : "");
	assert_true(r <= 1e-5);
}

/* ---- faults ---- */

static char job[64];

/* A long 3 x 2 job; returns once it trains. */
static void start_long_job(proc *p, cmdline *c)
{
	snprintf(job, sizeof job, "ct-%d-%ld", (int)getpid(), (long)now_s());
	cmd(c, "submit", "--devices", "2", "--epochs", "500", "--batch-size", "384",
	    "--log-every", "5", "--no-eval", "--job-id", job, MODEL, MODEL_ARGS, NULL);
	assert_int_equal(h_start(p, c->v, NULL), 0);
	if (h_wait_for(p, "step 10/", 120000) != 0)
		fail_msg("the job did not start training:\n%s", p->out);
	assert_int_equal(job_procs(job), 6);
}

static void test_kill_node(void **state)
{
	(void)state;
	up();
	proc p;
	cmdline c, k;
	start_long_job(&p, &c);
	cmd(&k, "kill", "1", NULL);
	double t0 = now_s();
	run_ok(&k, "podman kill of node 1");
	const char *names[] = {"node 1", SUBNET ".12", NULL};
	expect_job_end(&p, job, t0, BOUND_S, names);
	h_free(&p);
}

static void test_disconnect_node(void **state)
{
	(void)state;
	up();
	proc p;
	cmdline c, k;
	start_long_job(&p, &c);
	cmd(&k, "disconnect", "2", NULL);
	double t0 = now_s();
	run_ok(&k, "podman network disconnect of node 2");
	const char *names[] = {"node 2", SUBNET ".13", NULL};
	expect_job_end(&p, job, t0, BOUND_S, names);
	h_free(&p);
}

/* ---- a restart from checkpoints on the shared volume ---- */

#define RESTART_OPTS(out)                                                                \
	"--devices", "2", "--max-steps", "300", "--batch-size", "384", "--no-eval",        \
		"--log-every", "1", "--save-params", out, MODEL, "--", "--hidden", "512", \
		"--depth", "3"

static void test_restart_from_shared_checkpoints(void **state)
{
	(void)state;
	up();
	cmdline c, k;
	cmd(&c, "submit", "-q", RESTART_OPTS("/shared/straight.bin"), NULL);
	run_ok(&c, "the uninterrupted run");

	snprintf(job, sizeof job, "ckpt-%d", (int)getpid());
	cmd(&c, "submit", "-q", "--job-id", job, "--checkpoint-dir", "/shared/ck",
	    "--checkpoint-every", "10", "--max-restarts", "1", RESTART_OPTS("/shared/after.bin"),
	    NULL);
	proc p;
	assert_int_equal(h_start(&p, c.v, NULL), 0);
	if (h_wait_for(&p, "checkpoint: step 20 saved", 120000) != 0)
		fail_msg("no checkpoint of step 20:\n%s", p.out);
	cmd(&k, "kill", "1", NULL);
	run_ok(&k, "podman kill of node 1");
	if (strstr(p.out, "step 300/300"))
		fail_msg("the job was over before node 1 was killed: train longer");
	cmd(&k, "start", "1", NULL);
	run_ok(&k, "podman start of node 1");
	assert_int_equal(h_wait(&p, 300000), 0);
	if (h_code(&p) != 0)
		fail_msg("the restarted job failed: exit %d\n%s", h_code(&p), p.out);
	assert_non_null(strstr(p.out, "restarting (restart 1 of 1)"));
	const char *again = strstr(p.out, "restart 1 (HPU_RESTART_COUNT)");
	assert_non_null(again);
	assert_non_null(strstr(again, "resumed from /shared/ck/step-"));
	h_free(&p);
	char a[600], b[600];
	shared(a, sizeof a, "after.bin");
	shared(b, sizeof b, "straight.bin");
	int same;
	double r = params_rel_diff(a, b, &same);
	printf("  node 1 killed after the checkpoint of step 20, restarted: final parameters %s "
	       "(relative difference %.3g)\n",
	       same ? "bit-identical to the uninterrupted run" : "DIFFERENT", r);
	assert_true(same);
}

/* ---- nothing left ---- */

static void test_nothing_left(void **state)
{
	(void)state;
	up();
	assert_int_equal(down(NULL), 0);
	assert_int_equal(sh("test -z \"$(podman ps -aq --filter label=io.hputrain.cluster=" NAME
			    ")\""),
			 0);
	assert_int_not_equal(sh("podman network exists " NAME "-net"), 0);
	assert_int_not_equal(sh("podman volume exists " NAME "-shared"), 0);
	assert_int_not_equal(sh("podman secret inspect " NAME "-key >/dev/null 2>&1"), 0);
}

/* Why podman cannot run here, or NULL. The optional group's programs and
 * files are deploy/install-deps.sh's to know (--check containers): where it
 * could not install them the test is skipped with its answer; where they
 * are all there and podman still fails, the test fails. */
static const char *cannot_run(void)
{
	static char why[2048];
	if (geteuid() != 0)
		return "needs root (rootful podman)";
	const char *src = getenv("HPU_SOURCE_DIR");
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "bash %s/deploy/install-deps.sh --check containers 2>&1",
		 src ? src : ".");
	FILE *p = popen(cmd, "r");
	if (!p)
		return "cannot run deploy/install-deps.sh --check containers";
	size_t n = fread(why, 1, sizeof why - 1, p);
	why[n] = '\0';
	int rc = pclose(p);
	if (rc != 0) {
		while (n > 0 && why[n - 1] == '\n')
			why[--n] = '\0';
		if (n == 0)
			snprintf(why, sizeof why, "deploy/install-deps.sh --check containers failed");
		return why; /* "install-deps: containers: missing ..." per line */
	}
	return NULL;
}

int main(void)
{
	const char *why = cannot_run();
	if (why) {
		printf("test_containers: %s: skipped\n", why);
		return 77;
	}
	const char *src = getenv("HPU_SOURCE_DIR");
	snprintf(script, sizeof script, "%s/deploy/podman-cluster.sh", src ? src : ".");
	setenv("HPU_IMAGE", IMAGE, 1); /* the script's image */
	double t0 = now_s();
	if (sh("bash %s base", script) != 0) {
		printf("test_containers: no base image, and debootstrap could not make one "
		       "(no Debian mirror reachable?): skipped\n");
		return 77;
	}
	double t1 = now_s();
	if (sh("bash %s build >/dev/null", script) != 0) {
		fprintf(stderr, "test_containers: the image does not build: HPU_IMAGE=%s bash %s build\n",
			IMAGE, script);
		return 1;
	}
	printf("test_containers: base image %.1f s, project image %.1f s\n", t1 - t0, now_s() - t1);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_same_as_one_node, down),
		cmocka_unit_test_teardown(test_kill_node, down),
		cmocka_unit_test_teardown(test_disconnect_node, down),
		cmocka_unit_test_teardown(test_restart_from_shared_checkpoints, down),
		cmocka_unit_test_teardown(test_nothing_left, down),
	};
	return cmocka_run_group_tests(tests, NULL, down);
}
