/* Integration tests of jobs over two nodes (two hpulaunch processes on
 * loopback): training together, a node or a remote worker killed, a
 * wrong job token, counts and options that differ, the launch
 * environment across a restart; and torchrun's spellings (--standalone,
 * --nnodes, --rdzv-endpoint). Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include "proto/codec.h"
#include "tests/harness.h"

#define LAUNCH h_build("bin/hpulaunch")
#define MODEL h_build("lib/fmnist_mlp.so")
#define FAULT_MODEL h_build("lib/fault_mlp.so") /* tests/fixtures/fault_mlp.c */

/* Starts a two-node job's node 0 into n0 and node 1 into n1 (two
 * hpulaunch with a shared job token on a free loopback port): each
 * `hpulaunch --nodes 2 --devices 1 --node-rank R --master-port PORT
 * OPTS... fmnist_mlp.so -- --hidden HIDDEN`, OPTS NULL-ended (at most 8),
 * the same on both nodes. */
static void start_pair(proc *n0, proc *n1, const char *const *opts, const char *model,
		       const char *const *model_args, char *const *env1)
{
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[8] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	proc *n[2] = {n0, n1};
	for (int r = 0; r < 2; r++) {
		char *a[40];
		int k = 0, e = 1;
		char *head[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank",
				r ? "1" : "0", "--master-port", port};
		for (size_t i = 0; i < sizeof head / sizeof *head; i++)
			a[k++] = head[i];
		for (int i = 0; opts[i]; i++) {
			assert_true(i < 14);
			a[k++] = (char *)opts[i];
		}
		a[k++] = (char *)model;
		a[k++] = "--";
		for (int i = 0; model_args[i]; i++) {
			assert_true(i < 12);
			a[k++] = (char *)model_args[i];
		}
		a[k] = NULL;
		for (int i = 0; r == 1 && env1 && env1[i]; i++) {
			assert_true(e < 7);
			env[e++] = env1[i];
		}
		env[e] = NULL;
		assert_int_equal(h_start(n[r], a, env), 0);
	}
}

/* Waits for both nodes of a pair to end (node 0 within 120 s, node 1 30 s
 * after), prints their output, and asserts that both ended. */
static void wait_pair(proc *n0, proc *n1)
{
	int e0 = h_wait(n0, 120000), e1 = h_wait(n1, 30000);
	printf("node 0:\n%s\nnode 1:\n%s\n", n0->out, n1->out);
	if (e0)
		h_kill(n0);
	if (e1)
		h_kill(n1);
	assert_int_equal(e0, 0);
	assert_int_equal(e1, 0);
}

static void start_mlp_pair(proc *n0, proc *n1, const char *const *opts, const char *hidden)
{
	const char *margs[] = {"--hidden", hidden, NULL};
	start_pair(n0, n1, opts, MODEL, margs, NULL);
}

/* A worker with the wrong job token is refused by the coordinator; a rank
 * that never joins ends the job with an error naming it. (The join
 * timeout leaves the impostor's start-up room on a loaded machine: it
 * must reach the coordinator before it gives up.) */
static void test_wrong_token_and_missing_rank(void **state)
{
	(void)state;
	char port[16], master_port[32];
	snprintf(port, sizeof port, "%d", h_free_port());
	snprintf(master_port, sizeof master_port, "MASTER_PORT=%s", port);
	char *env0[] = {"HPU_JOB_TOKEN=the-right-secret", NULL};
	char *argv0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
			 "--master-port", port, "--join-timeout", "12", (char *)MODEL,
			 "--", "--hidden", "64", NULL};
	proc coord;
	assert_int_equal(h_start(&coord, argv0, env0), 0);
	usleep(300000);
	char *envw[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", "NODE_RANK=1",
			"MASTER_ADDR=127.0.0.1", master_port, "HPU_JOB_ID=hpujob",
			"HPU_JOB_TOKEN=a-wrong-guess", NULL};
	char *argvw[] = {(char *)h_build("bin/hpu-worker"), (char *)MODEL, "--", "--hidden", "64", NULL};
	proc w;
	int wcode = h_run(&w, argvw, envw, 30000);
	printf("impostor: %s", w.out);
	assert_int_equal(wcode, 1);
	assert_non_null(strstr(w.out, "refused rank 1: bad job token"));
	h_free(&w);

	int exited = h_wait(&coord, 30000);
	if (exited)
		h_kill(&coord);
	printf("launcher: %s", coord.out);
	assert_int_equal(exited, 0);
	assert_int_equal(h_code(&coord), 1);
	assert_non_null(strstr(coord.out, "refused a join from rank 1"));
	assert_non_null(strstr(coord.out, "rank 1 did not join within 12 s"));
	assert_non_null(strstr(coord.out, "no hpulaunch connected for node 1"));
	h_free(&coord);
}

/* Anyone who reaches the coordinator's port may send joins: 60 of them
 * with a wrong token and a host name holding a newline and an escape
 * (they forged a line of their own in the log, a line each) are logged
 * the first 3 times and the 10th, the host's control characters as '?'. */
static void test_forged_joins_logged_bounded(void **state)
{
	(void)state;
	char port[16], ep[64];
	int p = h_free_port();
	snprintf(port, sizeof port, "%d", p);
	snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", p);
	char *env0[] = {"HPU_JOB_TOKEN=the-right-secret", NULL};
	char *argv0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
			 "--master-port", port, "--join-timeout", "6", (char *)MODEL,
			 "--", "--hidden", "16", NULL};
	proc coord;
	assert_int_equal(h_start(&coord, argv0, env0), 0);
	usleep(500000);
	void *ctx = zmq_ctx_new(), *sock = zmq_socket(ctx, ZMQ_DEALER);
	int linger = 0;
	zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
	assert_int_equal(zmq_connect(sock, ep), 0);
	Hpu__RankInfo self = HPU__RANK_INFO__INIT;
	self.rank = 1;
	self.node_rank = 1;
	self.host = "evil\nhpulaunch: error: FORGED LINE\x1b[31m";
	Hpu__Join j = HPU__JOIN__INIT;
	j.job_id = "hpujob";
	j.token = "a-wrong-guess";
	j.self = &self;
	j.world_size = 2;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_JOIN;
	env.join = &j;
	for (int k = 0; k < 60; k++)
		assert_int_equal(hpu__codec_send(sock, NULL, &env), 0);
	usleep(500000);
	zmq_close(sock);
	zmq_ctx_term(ctx);
	int exited = h_wait(&coord, 30000);
	if (exited)
		h_kill(&coord);
	printf("launcher: %s", coord.out);
	int lines = 0;
	for (const char *q = coord.out; (q = strstr(q, "refused a join")); q++)
		lines++;
	assert_int_equal(lines, 4);
	assert_non_null(strstr(coord.out, "host evil?hpulaunch: error: FORGED LINE?[31m)"));
	assert_non_null(strstr(coord.out, "(refusal 10; the others are not logged)"));
	assert_null(strstr(coord.out, "\nhpulaunch: error: FORGED"));
	assert_null(strchr(coord.out, '\x1b'));
	h_free(&coord);
}

/* Node 1 whose coordinator never answers (no node 0): it gives up after
 * --join-timeout saying node 0 did not answer (it said it "lost contact",
 * a contact it never had). */
static void test_node0_never_answers(void **state)
{
	(void)state;
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	char *argv[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
			"--master-addr", "127.0.0.1", "--master-port", port, "--join-timeout", "3",
			(char *)MODEL, "--", "--hidden", "16", NULL};
	proc p;
	int code = h_run(&p, argv, env, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 1);
	char want[160];
	snprintf(want, sizeof want, "the coordinator at 127.0.0.1:%s (node 0) did not answer within 3 s "
		 "(--join-timeout)", port);
	assert_non_null(strstr(p.out, want));
	assert_null(strstr(p.out, "lost contact"));
	h_free(&p);
}

/* Node 0's port held by another process (another job's coordinator, or
 * a second "node 0": two nodes both given --node-rank 0): one line naming
 * the endpoint and the system's reason, exit 1, no wait. */
static void test_node0_port_taken(void **state)
{
	(void)state;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(listen(fd, 1), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	char port[16];
	snprintf(port, sizeof port, "%d", ntohs(a.sin_port));
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	char *argv[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
			"--master-addr", "127.0.0.1", "--master-port", port, "--join-timeout", "60",
			(char *)MODEL, "--", "--hidden", "16", NULL};
	proc p;
	int code = h_run(&p, argv, env, 30000);
	printf("%s", p.out);
	close(fd);
	assert_int_equal(code, 1);
	char want[160];
	snprintf(want, sizeof want, "cannot bind the coordinator at tcp://127.0.0.1:%s: Address "
		 "already in use", port);
	assert_non_null(strstr(p.out, want));
	h_free(&p);
}

/* SIGTERM to node 1's hpulaunch, with restarts left on both nodes: the
 * job stops on every node, none restarts (node 0 restarted, then waited
 * --join-timeout for node 1 at each restart); the same at SIGINT to node
 * 0's, the other way round. */
static void test_interrupt_stops_every_node(void **state)
{
	(void)state;
	for (int k = 0; k < 2; k++) {
		proc n0, n1;
		const char *opts[] = {"--max-steps", "100000", "--log-every", "1", "--no-eval",
				      "--max-restarts", "2", "--join-timeout", "30", NULL};
		start_mlp_pair(&n0, &n1, opts, "16");
		assert_int_equal(h_wait_for(&n0, "step 3/", 120000), 0);
		proc *hit = k ? &n0 : &n1, *other = k ? &n1 : &n0;
		kill(hit->pid, k ? SIGINT : SIGTERM);
		int e = h_wait(other, 25000);
		h_wait(hit, 10000);
		printf("%s to node %d; the other node: exit %d\n%s", k ? "SIGINT" : "SIGTERM", k ? 0 : 1,
		       e ? -1 : h_code(other), other->out);
		if (e)
			h_kill(other);
		assert_int_equal(e, 0);
		assert_int_equal(h_code(other), 1);
		assert_null(strstr(other->out, "restarting (restart 1 of 2)"));
		assert_non_null(strstr(other->out, "not restarted (--max-restarts): a user interrupted "
						   "another node's hpulaunch, which stops the job"));
		assert_int_equal(h_code(hit), k ? 130 : 143);
		h_free(&n0);
		h_free(&n1);
	}
}

/* Node 1's hpulaunch killed and started again by hand while node 0
 * restarts (--max-restarts 1): the new one runs restart 0, node 0
 * restart 1, and node 0's error says so (it said "no hpulaunch connected
 * for node 1", one having connected). */
static void test_node_started_again_named(void **state)
{
	(void)state;
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--join-timeout", "10", "--max-restarts", "1",
		      "--max-steps", "100000", "--log-every", "1", "--no-eval", (char *)MODEL, "--",
		      "--hidden", "16", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--join-timeout", "10", "--max-restarts", "1",
		      "--max-steps", "100000", "--log-every", "1", "--no-eval", (char *)MODEL, "--",
		      "--hidden", "16", NULL};
	proc n0, n1, again;
	assert_int_equal(h_start(&n0, a0, env), 0);
	assert_int_equal(h_start(&n1, a1, env), 0);
	assert_int_equal(h_wait_for(&n0, "step 3/", 120000), 0);
	kill(n1.pid, SIGKILL);
	h_wait(&n1, 10000);
	assert_int_equal(h_wait_for(&n0, "restarting (restart 1 of 1)", 60000), 0);
	assert_int_equal(h_start(&again, a1, env), 0);
	int e0 = h_wait(&n0, 60000);
	printf("node 0: exit %d\n%s", e0 ? -1 : h_code(&n0), n0.out);
	if (e0)
		h_kill(&n0);
	h_kill(&again);
	assert_int_equal(e0, 0);
	assert_int_equal(h_code(&n0), 1);
	assert_non_null(strstr(n0.out, "node 1's hpulaunch connected, but of another attempt: it runs "
				       "restart 0 of the job, node 0 restart 1 (an hpulaunch started "
				       "again alone begins at restart 0: start every node's hpulaunch "
				       "again)"));
	assert_null(strstr(n0.out, "no hpulaunch connected for node 1"));
	h_free(&n0);
	h_free(&n1);
	h_free(&again);
}

/* Node 0's hpulaunch stopped (SIGSTOP) until node 1 gives up on it, then
 * continued: node 0's error says it did not run itself (it blamed rank 1
 * alone, "died or its node became unreachable"). */
static void test_stopped_node0_says_so(void **state)
{
	(void)state;
	proc n0, n1;
	const char *opts[] = {"--max-steps", "100000", "--log-every", "1", "--no-eval", NULL};
	start_mlp_pair(&n0, &n1, opts, "16");
	assert_int_equal(h_wait_for(&n0, "step 3/", 120000), 0);
	kill(n0.pid, SIGSTOP);
	int e1 = h_wait(&n1, 40000);
	kill(n0.pid, SIGCONT);
	int e0 = h_wait(&n0, 60000);
	printf("node 1: exit %d; node 0: exit %d\n%s", e1 ? -1 : h_code(&n1), e0 ? -1 : h_code(&n0),
	       n0.out);
	if (e0)
		h_kill(&n0);
	if (e1)
		h_kill(&n1);
	assert_int_equal(e1, 0);
	assert_int_equal(e0, 0);
	assert_int_equal(h_code(&n0), 1);
	assert_non_null(strstr(n1.out, "lost contact with the coordinator"));
	assert_non_null(strstr(n0.out, "; node 0's hpulaunch itself did not run for "));
	assert_non_null(strstr(n0.out, " s (stopped, or starved of CPU?): the other nodes may have "
				       "given up on it"));
	h_free(&n0);
	h_free(&n1);
}

/* Two nodes (two hpulaunch processes) on loopback; node 1's hpulaunch is
 * killed (SIGKILL: its workers die with it) mid-run. Rank 0 finds rank 1's
 * connection gone, and node 0's error names rank 1 on node 1 as the
 * cause, from that report (not the node's silence, nor rank 0's exit). */
static void test_node_killed_blamed(void **state)
{
	(void)state;
	proc n0, n1;
	const char *opts[] = {"--max-steps", "100000", "--log-every", "1", "--no-eval", NULL};
	start_mlp_pair(&n0, &n1, opts, "16");
	assert_int_equal(h_wait_for(&n0, "step 3/", 120000), 0);
	kill(n1.pid, SIGKILL);
	int e0 = h_wait(&n0, 60000);
	h_wait(&n1, 10000);
	const char *err = n0.out ? strstr(n0.out, "hpulaunch: error: ") : NULL;
	printf("node 0: exit %d: %.300s\n", e0 ? -1 : h_code(&n0), err ? err : "(no error)");
	if (e0)
		h_kill(&n0);
	assert_int_equal(e0, 0);
	assert_int_equal(h_code(&n0), 1);
	assert_non_null(err);
	if (strncmp(err, "hpulaunch: error: rank 1 (node 1, pid ", 38) ||
	    !strstr(err, ") died or its node became unreachable; rank 0 found it gone"))
		fail_msg("node 0's error does not blame rank 1 on node 1:\n%s", n0.out);
	h_free(&n0);
	h_free(&n1);
}

/* The mirror: node 0's hpulaunch is killed. Node 1's worker finds rank 0
 * gone, and node 1's error names rank 0's node from the layout (node 1
 * has no rank table), as its report may be the one a submitter prints. */
static void test_node0_killed_blamed(void **state)
{
	(void)state;
	proc n0, n1;
	const char *opts[] = {"--max-steps", "100000", "--log-every", "1", "--no-eval", NULL};
	start_mlp_pair(&n0, &n1, opts, "16");
	assert_int_equal(h_wait_for(&n0, "step 3/", 120000), 0);
	kill(n0.pid, SIGKILL);
	int e1 = h_wait(&n1, 60000);
	h_wait(&n0, 10000);
	const char *err = n1.out ? strstr(n1.out, "hpulaunch: error: ") : NULL;
	printf("node 1: exit %d: %.300s\n", e1 ? -1 : h_code(&n1), err ? err : "(no error)");
	if (e1)
		h_kill(&n1);
	assert_int_equal(e1, 0);
	assert_int_equal(h_code(&n1), 1);
	assert_non_null(err);
	const char *want = "hpulaunch: error: rank 0 (node 0) died or its node became "
			   "unreachable; rank 1 found it gone";
	if (strncmp(err, want, strlen(want)))
		fail_msg("node 1's error does not blame rank 0 on node 0:\n%s", n1.out);
	h_free(&n0);
	h_free(&n1);
}

/* Two nodes (two hpulaunch processes) on loopback train together. */
static void test_two_nodes(void **state)
{
	(void)state;
	proc n0, n1;
	const char *opts[] = {"--max-steps", "5", "--log-every", "1", NULL};
	start_mlp_pair(&n0, &n1, opts, "64");
	wait_pair(&n0, &n1);
	assert_int_equal(h_code(&n0), 0);
	assert_int_equal(h_code(&n1), 0);
	assert_non_null(strstr(n0.out, "[rank 0] trained 5 steps on 2 workers"));
	assert_non_null(strstr(n0.out, "[rank 0] test accuracy"));
	h_free(&n0);
	h_free(&n1);
}

/* Node 1's wall clock steps an hour ahead every 1.3 s while the job runs
 * (NTP, `date -s`, a VM resumed: LD_PRELOAD clock_skew, node 1's
 * hpulaunch alone): the job trains on. Its heartbeat check measured the
 * coordinator's silence on libev's ev_now(), the wall clock, so a step
 * read as an hour of silence ("lost contact with the coordinator ...
 * silent for 10 s; this hpulaunch itself did not run for 3601 s")
 * whenever its check ran before the next heartbeat came (a review: 4 runs
 * in 4 at some start offsets); now every duration is on the monotonic
 * clock. Rank 0 sleeps 8 s in its 10th step, so that node 1 sees about
 * six steps. */
static void test_clock_steps(void **state)
{
	(void)state;
	proc n0, n1;
	char preload[600];
	snprintf(preload, sizeof preload, "LD_PRELOAD=%s", h_build("lib/clock_skew.so"));
	char *env1[] = {preload, "HPU_TEST_SKEW_MS=3600000", "HPU_TEST_SKEW_STEP_EVERY_MS=1300",
			NULL};
	const char *opts[] = {"--max-steps", "20", "--batch-size", "16", "--no-eval", NULL};
	const char *margs[] = {"--hidden", "16", "--sleep-rank", "0", "--sleep-ms", "8000", NULL};
	start_pair(&n0, &n1, opts, h_build("lib/fault_mlp.so"), margs, env1);
	wait_pair(&n0, &n1);
	assert_null(strstr(n1.out, "lost contact"));
	assert_int_equal(h_code(&n1), 0);
	assert_int_equal(h_code(&n0), 0);
	assert_non_null(strstr(n0.out, "[rank 0] trained 20 steps on 2 workers"));
	h_free(&n0);
	h_free(&n1);
}

/* Two hpulaunch for node 1, both started before node 0: the coordinator
 * takes one agent and refuses the other ("that node has already
 * joined"), and the job runs. Node 1's workers started before their
 * agent was taken, so the refused one's worker could take rank 1's place
 * first: the job failed on every node, blaming a worker's exit or a dead
 * node 0 (3 tries in 3 in a review's network namespaces; it did not
 * happen here, on loopback or in namespaces, before the change). */
static void test_node_started_twice_early(void **state)
{
	(void)state;
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	proc n[3]; /* node 1, node 1 again, node 0 */
	for (int k = 0; k < 3; k++) {
		char *a[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank",
			     k < 2 ? "1" : "0", "--master-port", port, "--max-steps", "5",
			     "--no-eval", (char *)MODEL, "--", "--hidden", "16", NULL};
		assert_int_equal(h_start(&n[k], a, env), 0);
		usleep(k == 0 ? 200000 : 0);
		if (k == 1)
			sleep(1);
	}
	int ended[3], codes[3];
	for (int k = 2; k >= 0; k--) {
		ended[k] = h_wait(&n[k], 120000) == 0;
		if (!ended[k])
			h_kill(&n[k]);
		codes[k] = h_code(&n[k]);
		printf("node %d%s: exit %d\n%s\n", k < 2 ? 1 : 0, k == 1 ? " (again)" : "", codes[k],
		       n[k].out);
	}
	assert_true(ended[0] && ended[1] && ended[2]);
	assert_int_equal(codes[2], 0); /* node 0: the job ran */
	assert_non_null(strstr(n[2].out, "trained 5 steps on 2 workers"));
	int ok = codes[0] == 0 ? 0 : 1, refused = 1 - ok; /* one node 1 ran, one was refused */
	assert_int_equal(codes[ok], 0);
	assert_int_not_equal(codes[refused], 0);
	/* said as a refusal, the job going on (it said "job aborted by the
	 * coordinator" while node 0's job ran on) */
	assert_non_null(strstr(n[refused].out, "node 0's coordinator refused this node: that node "
					       "has already joined; the job on node 0 goes on"));
	assert_null(strstr(n[refused].out, "job aborted"));
	for (int k = 0; k < 3; k++)
		h_free(&n[k]);
}

/* A worker killed on node 1 fails the job on node 0 too, naming it. */
static void test_two_nodes_remote_failure(void **state)
{
	(void)state;
	proc n0, n1;
	const char *opts[] = {"--epochs", "20", "--log-every", "2", NULL};
	start_mlp_pair(&n0, &n1, opts, "64");
	int seen = h_wait_for(&n0, "step 4/", 60000);
	pid_t k1[4], k0[4];
	int c1 = h_children(n1.pid, k1, 4), c0 = h_children(n0.pid, k0, 4);
	if (seen || c1 != 1) {
		h_kill_groups(k0, c0);
		h_kill_groups(k1, c1);
		h_kill(&n0);
		h_kill(&n1);
		fail_msg("training did not start: %s", n0.out);
	}
	kill(k1[0], SIGKILL);
	int e0 = h_wait(&n0, 15000), e1 = h_wait(&n1, 15000);
	int alive = h_alive(k0[0]) || h_alive(k1[0]);
	h_kill_groups(k0, c0);
	h_kill_groups(k1, c1);
	if (e0)
		h_kill(&n0);
	if (e1)
		h_kill(&n1);
	printf("node 0:\n%s\nnode 1:\n%s\n", n0.out, n1.out);
	char want[96];
	snprintf(want, sizeof want, "rank 1 (node 1, pid %d) was killed by signal 9", (int)k1[0]);
	assert_int_equal(e0, 0);
	assert_int_equal(e1, 0);
	assert_int_equal(h_code(&n0), 1);
	assert_int_equal(h_code(&n1), 1);
	assert_non_null(strstr(n0.out, want));
	assert_non_null(strstr(n1.out, want));
	assert_false(alive);
	h_free(&n0);
	h_free(&n1);
}

/* torchrun style, every node runs the same --devices: node 1's hpulaunch
 * with another count is refused by node 0's coordinator, which names why
 * and the values, and both fail, node 0 at once (it waited out
 * --join-timeout for a node that would not come). */
static void test_two_nodes_devices_differ(void **state)
{
	(void)state;
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--join-timeout", "5", "--exec", "sleep", "60", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "2", "--node-rank", "1",
		      "--master-port", port, "--join-timeout", "5", "--exec", "sleep", "60", NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, env, 60000, &n1, a1, env, 60000);
	assert_int_equal(h_code(&n0), 1);
	assert_int_equal(h_code(&n1), 1);
	assert_non_null(strstr(n0.out, "refused agent of node 1: its --nodes/--devices differ from node 0's: "
				       "node 1 runs --nodes 2 --devices 2, node 0 --nodes 2 with 1 device on node 1"));
	assert_non_null(strstr(n1.out, "its --nodes/--devices differ from node 0's: node 1 runs --nodes 2 "
				       "--devices 2, node 0 --nodes 2 with 1 device on node 1"));
	assert_non_null(strstr(n0.out, "node 1's hpulaunch connected and was refused: its --nodes/--devices "
				       "differ from node 0's"));
	assert_null(strstr(n0.out, "did not join within"));
	h_free(&n0);
	h_free(&n1);
}

/* --max-restarts differs between the nodes: node 1's hpulaunch is refused
 * at once, naming both values (node 0 used to take it, then wait out
 * --join-timeout at its first restart for a node that had given up). */
static void test_two_nodes_restarts_differ(void **state)
{
	(void)state;
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--join-timeout", "30", "--max-restarts", "1",
		      "--exec", "sleep", "60", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--join-timeout", "30", "--exec", "sleep", "60", NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, env, 60000, &n1, a1, env, 60000);
	assert_int_equal(h_code(&n0), 1);
	assert_int_equal(h_code(&n1), 1);
	assert_non_null(strstr(n0.out, "node 1's hpulaunch connected and was refused: its "
				       "--max-restarts 0 differs from node 0's 1"));
	assert_non_null(strstr(n1.out, "its --max-restarts 0 differs from node 0's 1"));
	assert_non_null(strstr(n0.out, "not restarted (--max-restarts): a node's hpulaunch is set "
				       "up otherwise than this one"));
	assert_null(strstr(n0.out, "did not join within"));
	h_free(&n0);
	h_free(&n1);
	/* the other way round: the refused node (whose count allows a
	 * restart) is not restarted either (it restarted, then waited out
	 * --join-timeout for node 0's coordinator, gone with its job) */
	snprintf(port, sizeof port, "%d", h_free_port());
	char *b0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--join-timeout", "30", "--exec", "sleep", "60", NULL};
	char *b1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--join-timeout", "30", "--max-restarts", "1",
		      "--exec", "sleep", "60", NULL};
	h_two_nodes(&n0, b0, env, 60000, &n1, b1, env, 60000);
	printf("node 1 with --max-restarts 1, refused:\n%s", n1.out);
	assert_int_equal(h_code(&n0), 1);
	assert_int_equal(h_code(&n1), 1);
	assert_non_null(strstr(n1.out, "its --max-restarts 1 differs from node 0's 0"));
	assert_null(strstr(n1.out, "restarting (restart 1 of 1)"));
	assert_null(strstr(n1.out, "did not answer within"));
	h_free(&n0);
	h_free(&n1);
}

/* --transport differs between the nodes: node 1's hpulaunch is refused at
 * once, naming both (the ranks chose their collectives' algorithms by it
 * and waited on each other for the collective timeout, a minute, then
 * blamed the model's collectives). */
static void test_two_nodes_transport_differs(void **state)
{
	(void)state;
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--join-timeout", "30", "--exec", "sleep", "60", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--join-timeout", "30", "--transport", "tcp",
		      "--exec", "sleep", "60", NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, env, 60000, &n1, a1, env, 60000);
	printf("node 0:\n%snode 1:\n%s", n0.out, n1.out);
	assert_int_equal(h_code(&n0), 1);
	assert_int_equal(h_code(&n1), 1);
	assert_non_null(strstr(n0.out, "node 1's hpulaunch connected and was refused: its "
				       "--transport tcp differs from node 0's auto (the ranks pick "
				       "their collectives' algorithms by it: give each node the same)"));
	assert_non_null(strstr(n1.out, "its --transport tcp differs from node 0's auto"));
	h_free(&n0);
	h_free(&n1);
	/* shm and auto are one transport to the collectives: taken */
	snprintf(port, sizeof port, "%d", h_free_port());
	char *b0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--join-timeout", "30", "--exec", "true", NULL};
	char *b1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--join-timeout", "30", "--transport", "shm",
		      "--exec", "true", NULL};
	h_two_nodes(&n0, b0, env, 60000, &n1, b1, env, 60000);
	printf("auto and shm:\nnode 0:\n%snode 1:\n%s", n0.out, n1.out);
	assert_int_equal(h_code(&n0), 0);
	assert_int_equal(h_code(&n1), 0);
	h_free(&n0);
	h_free(&n1);
}

/* Node 1's hpulaunch with another HPU_JOB_TOKEN: node 0's error says it
 * connected and was refused, and why (it said "no hpulaunch connected for
 * node 1", sending the user to look for a node that was there). */
static void test_two_nodes_tokens_differ(void **state)
{
	(void)state;
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *e0[] = {"HPU_JOB_TOKEN=node-zero-secret", NULL};
	char *e1[] = {"HPU_JOB_TOKEN=node-one-secret", NULL};
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--join-timeout", "4", "--exec", "sleep", "60", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--join-timeout", "4", "--exec", "sleep", "60", NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, e0, 60000, &n1, a1, e1, 60000);
	printf("node 0: %s", n0.out);
	assert_int_equal(h_code(&n0), 1);
	assert_int_equal(h_code(&n1), 1);
	assert_non_null(strstr(n0.out, "did not join within 4 s; node 1's hpulaunch connected and "
					"was refused: bad job id or token"));
	assert_null(strstr(n0.out, "no hpulaunch connected for node 1"));
	assert_non_null(strstr(n1.out, "bad job id or token"));
	h_free(&n0);
	h_free(&n1);
}

/* Two nodes whose copies of the --config file differ (lr 0.001 and 0.5,
 * and the batch size) would train together to a useless model: the ranks
 * compare their options at start-up, and every rank fails naming the
 * ranks and the options that differ, with both values. */
static void test_two_nodes_options_differ(void **state)
{
	(void)state;
	char dir[] = "/tmp/hpu-test-optsdiff-XXXXXX", c0[64], c1[64], port[16];
	assert_non_null(mkdtemp(dir));
	snprintf(c0, sizeof c0, "%s/c0.json", dir);
	snprintf(c1, sizeof c1, "%s/c1.json", dir);
	assert_int_equal(h_write_file(c0, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}}", 0644), 0);
	assert_int_equal(h_write_file(c1, "{\"train_batch_size\": 128, \"optimizer\": "
					  "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.5}}}", 0644), 0);
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	/* the metrics file is rank 0's alone: it may differ */
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--max-steps", "3", "--config", c0,
		      "--metrics", "/dev/null", (char *)MODEL, "--", "--hidden", "64", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--max-steps", "3", "--config", c1,
		      (char *)MODEL, "--", "--hidden", "64", NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, env, 120000, &n1, a1, env, 30000);
	unlink(c0);
	unlink(c1);
	rmdir(dir);
	assert_int_equal(h_code(&n0), 1);
	assert_int_equal(h_code(&n1), 1);
	const char *want = "the ranks' training options differ: rank 1 differs from rank 0 in "
			   "--batch-size (128 vs 256), --micro-batch-size (64 vs 128), --lr (0.5 vs 0.001)";
	assert_non_null(strstr(n0.out, want));
	assert_non_null(strstr(n1.out, want));
	assert_null(strstr(n0.out, "trained"));
	h_free(&n0);
	h_free(&n1);
}

/* Each node's own disk at --checkpoint-dir (a node may keep it at a path
 * of its own, but it must be one filesystem): rank 1 cannot write into
 * the partial directory rank 0 made, and says why (it said only "No such
 * file or directory" of a path it was never meant to make). */
static void test_two_nodes_checkpoint_not_shared(void **state)
{
	(void)state;
	char dir[] = "/tmp/hpu-test-ckshare-XXXXXX", d0[64], d1[64], port[16];
	assert_non_null(mkdtemp(dir));
	snprintf(d0, sizeof d0, "%s/node0", dir);
	snprintf(d1, sizeof d1, "%s/node1", dir);
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--max-steps", "2", "--checkpoint-dir", d0,
		      (char *)MODEL, "--", "--hidden", "16", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--max-steps", "2", "--checkpoint-dir", d1,
		      (char *)MODEL, "--", "--hidden", "16", NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, env, 120000, &n1, a1, env, 30000);
	printf("%s", n0.out);
	h_rmtree(dir);
	assert_int_equal(h_code(&n0), 1);
	char want[300];
	snprintf(want, sizeof want, "rank 1: cannot create %s/.step-00000002.partial/", d1);
	assert_non_null(strstr(n0.out, want));
	assert_non_null(strstr(n0.out, ": No such file or directory (rank 0 makes the partial "
				       "directory; it is not there on this node: --checkpoint-dir "
				       "must be one directory every node shares)"));
	h_free(&n0);
	h_free(&n1);
}

/* Writes n tokens (i * mul % 50) in llm.c's format to path. */
static void write_tokens(const char *path, int n, int mul)
{
	int32_t head[256] = {20240520, 1, n};
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(head, sizeof head, 1, f), 1);
	for (int i = 0; i < n; i++) {
		uint16_t t = (uint16_t)(i * mul % 50);
		assert_int_equal(fwrite(&t, 2, 1, f), 1);
	}
	assert_int_equal(fclose(f), 0);
}

/* Two nodes whose models (other arguments) or data (other files of the
 * same size) differ are refused at start-up, naming what differs: they
 * trained together on overlapping shards of different datasets, or
 * failed later at an unrelated collective (found by review). */
static void test_two_nodes_models_differ(void **state)
{
	(void)state;
	char dir[] = "/tmp/hpu-test-datadiff-XXXXXX", t0[64], t1[64], port[16];
	assert_non_null(mkdtemp(dir));
	snprintf(t0, sizeof t0, "%s/t0.bin", dir);
	snprintf(t1, sizeof t1, "%s/t1.bin", dir);
	write_tokens(t0, 2000, 1);
	write_tokens(t1, 2000, 7);
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	const char *model[2][2] = {{"--hidden", "64"}, {"--hidden", "32"}};
	const char *want[2] = {"the ranks' models or data differ: rank 1 differs from rank 0 in parameters "
			       "(6, 26506 floats vs 6, 55050 floats), parameter names and shapes (",
			       "the ranks' models or data differ: rank 1 differs from rank 0 in training "
			       "samples' bytes ("};
	for (int k = 0; k < 2; k++) {
		snprintf(port, sizeof port, "%d", h_free_port());
		char *lm = (char *)h_build("lib/gpt_lm.so");
		char *a[2][32];
		for (int r = 0; r < 2; r++) {
			char *head[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank",
					r ? "1" : "0", "--master-port", port, "--max-steps", "3"};
			int n = 0;
			for (size_t i = 0; i < sizeof head / sizeof *head; i++)
				a[r][n++] = head[i];
			if (k == 0) {
				a[r][n++] = (char *)MODEL;
				a[r][n++] = "--";
				a[r][n++] = (char *)model[r][0];
				a[r][n++] = (char *)model[r][1];
			} else {
				char *tail[] = {lm, "--", "--tokens", r ? t1 : t0, "--vocab", "64", "--ctx", "16",
						"--dim", "16", "--heads", "2", "--layers", "1"};
				for (size_t i = 0; i < sizeof tail / sizeof *tail; i++)
					a[r][n++] = tail[i];
			}
			a[r][n] = NULL;
		}
		proc n0, n1;
		h_two_nodes(&n0, a[0], env, 120000, &n1, a[1], env, 30000);
		printf("%s%s", n0.out, n1.out);
		assert_int_equal(h_code(&n0), 1);
		assert_int_equal(h_code(&n1), 1);
		/* both ranks find it at once, and the first to exit has the
		 * job stopped: the other may be stopped before it says so
		 * itself (a loaded machine), and its node then names the
		 * first one's exit */
		assert_true(strstr(n0.out, want[k]) || strstr(n1.out, want[k]));
		assert_true(strstr(n0.out, want[k]) ||
			    strstr(n0.out, "hpulaunch: error: rank 1 (node 1, pid "));
		assert_true(strstr(n1.out, want[k]) ||
			    strstr(n1.out, "hpulaunch: error: rank 0 (node 0"));
		assert_null(strstr(n0.out, "trained"));
		h_free(&n0);
		h_free(&n1);
	}
	unlink(t0);
	unlink(t1);
	rmdir(dir);
}

/* The two nodes' command lines (a[R], NULL-terminated): hpulaunch
 * --nodes 2 --devices 1 --node-rank R --master-port PORT, then tail[R]
 * (NULL-terminated). */
static void pair_args(char *a[2][40], const char *port, char *const *tail0, char *const *tail1)
{
	for (int r = 0; r < 2; r++) {
		char *head[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank",
				r ? "1" : "0", "--master-port", (char *)port};
		int n = 0;
		for (size_t i = 0; i < sizeof head / sizeof *head; i++)
			a[r][n++] = head[i];
		for (char *const *t = r ? tail1 : tail0; *t && n < 39; t++)
			a[r][n++] = *t;
		a[r][n] = NULL;
	}
}

/* A rank that fails with a sentence ("hpu-worker: rank R: WHY") on one
 * node: the other node's closing error says WHY too, both ways round (the
 * failing rank on node 1, then on node 0, the coordinator's). Before, the
 * other node said only "rank 1 (node 1, pid P) exited with code 1". A
 * rank whose error exit has no sentence gets none. */
static void test_two_nodes_error_relayed(void **state)
{
	(void)state;
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL}, port[16], *a[2][40];
	char *good[] = {"--max-steps", "3", (char *)MODEL, "--", "--hidden", "16", NULL};
	char *bogus[] = {"--max-steps", "3", (char *)MODEL, "--", "--bogus", NULL};
	for (int bad = 1; bad >= 0; bad--) {
		snprintf(port, sizeof port, "%d", h_free_port());
		pair_args(a, port, bad ? good : bogus, bad ? bogus : good);
		proc n0, n1;
		h_two_nodes(&n0, a[0], env, 120000, &n1, a[1], env, 30000);
		printf("%s%s", n0.out, n1.out);
		assert_int_equal(h_code(&n0), 1);
		assert_int_equal(h_code(&n1), 1);
		const char *other = bad ? n0.out : n1.out;
		char want[96];
		snprintf(want, sizeof want, "rank %d (node %d, pid ", bad, bad);
		const char *line = strstr(other, want);
		assert_non_null(line);
		line = strstr(line, "exited with code 1 during setup, before step 1 of 3: model ");
		assert_non_null(line);
		assert_non_null(strstr(line, "setup failed: unknown model argument --bogus"));
		h_free(&n0);
		h_free(&n1);
	}
	/* an error exit without a sentence of the runtime's (the model's
	 * exit(3)) after a warning: no reason, not the warning (a review
	 * reproduced the warning relayed as the reason when stderr's last
	 * "hpu-worker: rank R: " line was taken for it) */
	char *exits[] = {"--max-steps", "20", "--hang-warning", "1", (char *)FAULT_MODEL, "--",
			 "--hidden", "16", "--sleep-rank", "1", "--sleep-ms", "2500", "--exit-rank",
			 "1", "--exit-at", "12", "--exit-code", "3", NULL};
	snprintf(port, sizeof port, "%d", h_free_port());
	pair_args(a, port, exits, exits);
	proc n0, n1;
	h_two_nodes(&n0, a[0], env, 120000, &n1, a[1], env, 60000);
	printf("%s%s", n0.out, n1.out);
	assert_non_null(strstr(n1.out, "warning: step 10 has run for"));
	const char *line = strstr(n0.out, "rank 1 (node 1, pid ");
	assert_non_null(line);
	/* where it was too (a model's exit said nothing of it) */
	line = strstr(line, "exited with code 3 in step 12 of 20");
	assert_non_null(line);
	assert_true(line[strlen("exited with code 3 in step 12 of 20")] == '\n');
	h_free(&n0);
	h_free(&n1);
}

/* The launch environment in torchrun's and DeepSpeed's names, on two
 * nodes of two workers each (two hpulaunch, loopback), before and after a
 * restart: each rank writes what it sees to DIR/rRANK.COUNT; on the first
 * attempt rank 3 exits 3 once every rank has written, and the job runs
 * again. Node 0 runs without OMP_NUM_THREADS (its workers get 1), node 1
 * with OMP_NUM_THREADS=4 (kept). */
static void test_torchrun_env_two_nodes(void **state)
{
	(void)state;
	char dir[64], port[16], script[2048];
	h_scratch_dir(dir, sizeof dir);
	snprintf(port, sizeof port, "%d", h_free_port());
	snprintf(script, sizeof script,
		 "echo \"rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE "
		 "node=$NODE_RANK group=$GROUP_RANK role_rank=$ROLE_RANK role_ws=$ROLE_WORLD_SIZE "
		 "count=$TORCHELASTIC_RESTART_COUNT max=$TORCHELASTIC_MAX_RESTARTS "
		 "run=$TORCHELASTIC_RUN_ID cross_rank=$CROSS_RANK cross_size=$CROSS_SIZE "
		 "local_size=$LOCAL_SIZE omp=${OMP_NUM_THREADS-unset}\" > %s/.r$RANK && "
		 "mv %s/.r$RANK %s/r$RANK.$HPU_RESTART_COUNT; "
		 "if [ \"$HPU_RESTART_COUNT\" = 0 ]; then "
		 "  if [ \"$RANK\" = 3 ]; then "
		 "    while [ ! -e %s/r0.0 ] || [ ! -e %s/r1.0 ] || [ ! -e %s/r2.0 ]; do sleep 0.05; done; "
		 "    exit 3; "
		 "  fi; exec sleep 300; "
		 "fi",
		 dir, dir, dir, dir, dir, dir);
	unsetenv("OMP_NUM_THREADS"); /* node 0's workers must see it unset */
	char *env0[] = {"HPU_JOB_TOKEN=env-secret", NULL};
	char *env1[] = {"HPU_JOB_TOKEN=env-secret", "OMP_NUM_THREADS=4", NULL};
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "2", "--node-rank", "0",
		      "--master-port", port, "--job-id", "envjob", "--max-restarts", "1",
		      "--exec", "/bin/sh", "-c", script, NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "2", "--node-rank", "1",
		      "--master-port", port, "--job-id", "envjob", "--max-restarts", "1",
		      "--exec", "/bin/sh", "-c", script, NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, env0, 120000, &n1, a1, env1, 30000);
	assert_int_equal(h_code(&n0), 0);
	assert_int_equal(h_code(&n1), 0);
	assert_non_null(strstr(n1.out, "restarting (restart 1 of 1)"));
	for (int count = 0; count < 2; count++)
		for (int r = 0; r < 4; r++) {
			char name[16], want[400];
			int node = r / 2;
			snprintf(name, sizeof name, "r%d.%d", r, count);
			snprintf(want, sizeof want,
				 "rank=%d local=%d world=4 lws=2 node=%d group=%d role_rank=%d role_ws=4 "
				 "count=%d max=1 run=envjob cross_rank=%d cross_size=2 local_size=2 omp=%s\n",
				 r, r % 2, node, node, r, count, node, node ? "4" : "1");
			if (!h_file_has(dir, name, want))
				fail_msg("%s/%s does not hold: %s", dir, name, want);
		}
	assert_false(h_file_exists(dir, "r0.2"));
	h_free(&n0);
	h_free(&n1);
	assert_int_equal(h_rmtree(dir), 0);
}

/* ---- torchrun's spellings ---- */

/* --standalone --nproc-per-node 2 trains the model; the coordinator is on
 * loopback at a port of its own, whatever MASTER_ADDR, MASTER_PORT and
 * NODE_RANK say. */
static void test_torchrun_standalone_trains(void **state)
{
	(void)state;
	char *env[] = {"MASTER_ADDR=10.255.255.1", "MASTER_PORT=1", "NODE_RANK=3", NULL};
	char *argv[] = {(char *)LAUNCH, "--standalone", "--nproc-per-node", "2", "--max-steps",
			"3", "--log-every", "1", "--no-eval", (char *)MODEL, "--", "--hidden", "32",
			NULL};
	proc p;
	int code = h_run(&p, argv, env, 120000);
	printf("%s", p.out);
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "node 0 of 1, ranks 0-1 of 2, coordinator 127.0.0.1:"));
	assert_null(strstr(p.out, "coordinator 127.0.0.1:1\n"));
	assert_non_null(strstr(p.out, "[rank 0] trained 3 steps on 2 workers"));
	h_free(&p);
}

/* What the workers of --standalone --nproc_per_node see, and
 * --nproc-per-node auto and cpu: one worker per core. */
static void test_torchrun_standalone_env(void **state)
{
	(void)state;
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	char *env[] = {"MASTER_ADDR=10.255.255.1", "MASTER_PORT=1", NULL};
	const char *echo = "echo \"rank=$RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE "
			   "nodes=$NNODES master=$MASTER_ADDR port=$MASTER_PORT\"";
	static const char *counts[] = {"2", "auto", "cpu"};
	for (int i = 0; i < 3; i++) {
		char *argv[] = {(char *)LAUNCH, "-q", "--standalone", "--nproc_per_node",
				(char *)counts[i], "--exec", "/bin/sh", "-c", (char *)echo, NULL};
		proc p;
		int code = h_run(&p, argv, env, 60000);
		printf("--nproc_per_node %s: exit %d\n%s", counts[i], code, p.out);
		assert_int_equal(code, 0);
		long n = i == 0 ? 2 : cores;
		for (long r = 0; r < n; r++) {
			char want[256];
			snprintf(want, sizeof want, "[rank %ld] rank=%ld world=%ld lws=%ld nodes=1 master=127.0.0.1 port=",
				 r, r, n, n);
			const char *at = strstr(p.out, want);
			assert_non_null(at);
			int port = atoi(at + strlen(want));
			assert_true(port > 1 && port <= 65535);
		}
		char extra[32];
		snprintf(extra, sizeof extra, "[rank %ld]", n);
		assert_null(strstr(p.out, extra));
		h_free(&p);
	}
}

/* Two nodes torchrun style in torchrun's words: node 0 with
 * --rdzv-endpoint, --nnodes N:N, --node_rank and --rdzv-id; node 1 with
 * --master_addr, --master_port, --rdzv_id, --max_restarts. They meet and
 * run the collectives; the workers see the job id as TORCHELASTIC_RUN_ID
 * and HPU_JOB_ID. */
static void test_torchrun_two_nodes_aliases(void **state)
{
	(void)state;
	char port[16], endpoint[32], script[512];
	snprintf(port, sizeof port, "%d", h_free_port());
	snprintf(endpoint, sizeof endpoint, "127.0.0.1:%s", port);
	snprintf(script, sizeof script,
		 "echo \"run=$TORCHELASTIC_RUN_ID job=$HPU_JOB_ID node=$NODE_RANK port=$MASTER_PORT "
		 "max=$TORCHELASTIC_MAX_RESTARTS\"; exec %s",
		 h_build("bin/coll_env_check"));
	char *env[] = {"HPU_JOB_TOKEN=alias-secret", NULL};
	char *a0[] = {(char *)LAUNCH, "--nnodes", "2:2", "--nproc-per-node", "1", "--node_rank",
		      "0", "--rdzv-endpoint", endpoint, "--rdzv-id", "torchjob", "--max_restarts",
		      "1", "--exec", "/bin/sh", "-c", script, NULL};
	char *a1[] = {(char *)LAUNCH, "--nnodes", "2", "--nproc_per_node", "1", "--node-rank",
		      "1", "--master_addr", "127.0.0.1", "--master_port", port, "--rdzv_id",
		      "torchjob", "--max_restarts", "1", "--exec", "/bin/sh", "-c", script, NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, env, 120000, &n1, a1, env, 30000);
	assert_int_equal(h_code(&n0), 0);
	assert_int_equal(h_code(&n1), 0);
	char want[128];
	snprintf(want, sizeof want, "[rank 0] run=torchjob job=torchjob node=0 port=%s max=1", port);
	assert_non_null(strstr(n0.out, want));
	snprintf(want, sizeof want, "[rank 1] run=torchjob job=torchjob node=1 port=%s max=1", port);
	assert_non_null(strstr(n1.out, want));
	assert_non_null(strstr(n0.out, "[rank 0] coll ok: rank 0 of 2"));
	assert_non_null(strstr(n1.out, "[rank 1] coll ok: rank 1 of 2"));
	h_free(&n0);
	h_free(&n1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_wrong_token_and_missing_rank),
		cmocka_unit_test(test_forged_joins_logged_bounded),
		cmocka_unit_test(test_node0_never_answers),
		cmocka_unit_test(test_node0_port_taken),
		cmocka_unit_test(test_two_nodes),
		cmocka_unit_test(test_clock_steps),
		cmocka_unit_test(test_node_started_twice_early),
		cmocka_unit_test(test_node_killed_blamed),
		cmocka_unit_test(test_stopped_node0_says_so),
		cmocka_unit_test(test_interrupt_stops_every_node),
		cmocka_unit_test(test_node_started_again_named),
		cmocka_unit_test(test_node0_killed_blamed),
		cmocka_unit_test(test_two_nodes_remote_failure),
		cmocka_unit_test(test_two_nodes_tokens_differ),
		cmocka_unit_test(test_two_nodes_devices_differ),
		cmocka_unit_test(test_two_nodes_restarts_differ),
		cmocka_unit_test(test_two_nodes_transport_differs),
		cmocka_unit_test(test_two_nodes_options_differ),
		cmocka_unit_test(test_two_nodes_checkpoint_not_shared),
		cmocka_unit_test(test_two_nodes_models_differ),
		cmocka_unit_test(test_two_nodes_error_relayed),
		cmocka_unit_test(test_torchrun_env_two_nodes),
		cmocka_unit_test(test_torchrun_standalone_trains),
		cmocka_unit_test(test_torchrun_standalone_env),
		cmocka_unit_test(test_torchrun_two_nodes_aliases),
	};
	/* HPU_TEST=test_name (a glob) runs only the tests it names. */
	if (getenv("HPU_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPU_TEST"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
