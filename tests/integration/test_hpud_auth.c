/* Integration tests of hpud on loopback: signed frames (hpudlib.h: a
 * real daemon, real signed frames, the real hpulaunch).
 *
 * - bad input: unsigned, wrong key, replayed, expired, truncated, garbage
 *   (thousands of random frames), oversized, multi-frame -> all refused
 *   and logged with the peer, no job started, the daemon still answers a
 *   good request and its memory does not grow;
 * - a signed launch is bound to one hpud instance: replayed to another
 *   hpud or after a restart, it starts nothing;
 * - the submitter's side, against a fake hpud: replies for another
 *   session or instance, replayed or garbage, are dropped; a flood of
 *   output lines is taken whole.
 * Needs root (the workers switch to the user 'nobody'). */
#include "tests/integration/hpudlib.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

static uint64_t rng = 0x1234567;
static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)rng;
}

/* Waits until hpud has handled everything c sent: a status request on
 * the same connection is answered after them. Reads hpud's log on the way,
 * so that it never blocks on a full pipe. */
static void sync_daemon(client *c)
{
	size_t len;
	uint8_t *f = status_frame(c, 0, &len);
	zmq_send(c->sock, f, len, 0);
	free(f);
	Hpu__Envelope *r = NULL;
	for (int i = 0; i < 300 && !r; i++) {
		h_wait(&daemon_proc, 10);
		r = await_reply(c, 50);
	}
	assert_non_null(r);
	hpu__codec_free(r);
}

static void send_garbage(client *c, int count)
{
	uint8_t buf[4096];
	for (int i = 0; i < count; i++) {
		size_t len = rnd() % sizeof buf;
		for (size_t k = 0; k < len; k++)
			buf[k] = (uint8_t)rnd();
		if (i % 3 == 0 && len >= 4)
			memcpy(buf, "HPU1", 4); /* get past the magic */
		zmq_send(c->sock, buf, len, 0);
		if (i % 500 == 499)
			sync_daemon(c);
	}
	sync_daemon(c);
}

/* ---- bad input ---- */

static void test_bad_requests(void **state)
{
	(void)state;
	start_daemon();
	client c, wrong;
	uint8_t other[HPU_AUTH_KEY_BYTES];
	memcpy(other, key, sizeof other);
	other[0] ^= 1;
	client_open(&c, key);
	client_open(&wrong, other);
	size_t len;
	/* a good one is answered */
	uint8_t *good = status_frame(&c, 0, &len);
	zmq_send(c.sock, good, len, 0);
	Hpu__Envelope *r = await_reply(&c, 5000);
	assert_non_null(r);
	hpu__codec_free(r);
	/* replayed: the same frame again */
	zmq_send(c.sock, good, len, 0);
	assert_null(await_reply(&c, 1000));
	/* truncated: within the header, then a few in the body (few enough
	 * that hpud logs every kind in its 20 refusals a second) */
	for (size_t k = 0; k < len; k += k < HPU_AUTH_HEADER ? 7 : 40)
		zmq_send(c.sock, good, k, 0);
	free(good);
	/* unsigned: a bare envelope */
	Hpu__StatusRequest q = HPU__STATUS_REQUEST__INIT;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_STATUS_REQUEST;
	env.status_request = &q;
	uint8_t *body;
	size_t blen = hpu__codec_pack(&env, &body);
	zmq_send(c.sock, body, blen, 0);
	free(body);
	/* wrong key; expired; from the future */
	uint8_t *f = status_frame(&wrong, 0, &len);
	zmq_send(wrong.sock, f, len, 0);
	free(f);
	f = status_frame(&c, -120000, &len);
	zmq_send(c.sock, f, len, 0);
	free(f);
	f = status_frame(&c, 120000, &len);
	zmq_send(c.sock, f, len, 0);
	free(f);
	/* two frames */
	zmq_send(c.sock, "HPU1", 4, ZMQ_SNDMORE);
	zmq_send(c.sock, "HPU1", 4, 0);
	assert_null(await_reply(&c, 500));
	assert_null(await_reply(&wrong, 100));
	/* garbage: warm up (ZeroMQ's and malloc's pools grow to a plateau
	 * over the first ~10000 frames), then measure over 30000 more; a
	 * leak of anything frame-sized (2 KiB on average) would add ~60 MiB,
	 * of 64 bytes ~2 MiB; the bound is 1 MiB */
	send_garbage(&c, 10000);
	assert_int_equal(jobs_running(), 0);
	long before = rss_kib(daemon_proc.pid);
	send_garbage(&c, 15000);
	/* oversized: ZeroMQ drops the connection; a new one still works */
	size_t big = HPU_AUTH_MAX_FRAME + 1024;
	uint8_t *huge = calloc(1, big);
	memcpy(huge, "HPU1", 4);
	zmq_send(wrong.sock, huge, big, 0);
	free(huge);
	send_garbage(&c, 15000);
	assert_int_equal(jobs_running(), 0);
	long after = rss_kib(daemon_proc.pid);
	printf("  hpud RSS %ld KiB after 10000 garbage frames, %ld KiB after 30000 more\n", before,
	       after);
	assert_true(before > 0 && after > 0);
	assert_true(after - before < 1024);
	pid_t kids[4];
	assert_int_equal(h_children(daemon_proc.pid, kids, 4), 0); /* nothing ran */
	/* every kind was refused, with the peer's address */
	h_wait(&daemon_proc, 300);
	const char *kinds[] = {"refused a request from 127.0.0.1", "replayed", "truncated",
			       "bad signature", "stale", "future", "more than one frame"};
	for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
		if (!strstr(daemon_proc.out, kinds[k]))
			fail_msg("hpud's log does not mention \"%s\":\n%s", kinds[k],
				 daemon_proc.out);
	client_close(&c);
	client_close(&wrong);
	stop_daemon();
}

/* A burst of refused requests: 20 are logged, and the count of the rest
 * is said once the second is over (it waited for the next refusal, which
 * may never come: the last burst's count was never said). */
static void test_refusal_burst_counted(void **state)
{
	(void)state;
	start_daemon();
	client c;
	client_open(&c, key);
	for (int i = 0; i < 30; i++) {
		size_t len;
		uint8_t *f = status_frame(&c, -120000, &len); /* stale: refused */
		zmq_send(c.sock, f, len, 0);
		free(f);
	}
	int said = h_wait_for(&daemon_proc, "more requests refused in the last second (not logged)",
			      5000);
	if (said)
		fail_msg("no count of the unlogged refusals:\n%s", daemon_proc.out);
	/* ... and whom they came from */
	if (h_wait_for(&daemon_proc, "(not logged), from 127.0.0.1\n", 5000))
		fail_msg("the count does not name the peer:\n%s", daemon_proc.out);
	client_close(&c);
	stop_daemon();
}

/* What hpud prints and exits (--help, --help-doc, --gen-key) into a full
 * standard output is an error (it said nothing and exited 0). */
static void test_output_into_full_stdout(void **state)
{
	(void)state;
	char key[160];
	snprintf(key, sizeof key, "%s/full.key", dir);
	const char *cmds[] = {"exec \"$0\" --help >/dev/full", "exec \"$0\" --help-doc scdoc >/dev/full",
			      "exec \"$0\" --gen-key \"$1\" >/dev/full"};
	for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
		char *argv[] = {"/bin/sh", "-c", (char *)cmds[i], (char *)HPUD, key, NULL};
		proc p;
		int code = h_run(&p, argv, NULL, 10000);
		printf("  %s: %d %s", cmds[i], code, p.out);
		assert_int_equal(code, 1);
		assert_non_null(strstr(p.out, "cannot write the standard output: No space left on device"));
		h_free(&p);
	}
	unlink(key);
}

/* Connections held open by a client that sends nothing, past hpud's
 * limit on open files (ulimit -n 40 here, LimitNOFILE in its unit): hpud
 * logs that it cannot accept (nothing was logged); a submitter connected
 * before keeps its connection and is answered on it (a first version
 * paused the listener, which closed every accepted connection with it);
 * once they close, a new submitter is answered. */
static void test_connections_past_the_fd_limit(void **state)
{
	(void)state;
	stop_daemon();
	char *argv[] = {"/bin/sh", "-c", "ulimit -n 40 && exec \"$0\" -c \"$1\"", (char *)HPUD,
			conf_path, NULL};
	char *env[] = {"HPUCOLL_TIMEOUT_MS=10000", NULL};
	assert_int_equal(h_start(&daemon_proc, argv, env), 0);
	assert_int_equal(h_wait_for(&daemon_proc, "listening on", 10000), 0);
	client before;
	client_open(&before, key); /* its Hello answered: connected */
	int fds[60], n = 0;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (; n < 60; n++) {
		fds[n] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		assert_true(fds[n] >= 0);
		if (connect(fds[n], (struct sockaddr *)&a, sizeof a) < 0) {
			close(fds[n]);
			break;
		}
	}
	int logged = h_wait_for(&daemon_proc, "cannot accept connections on tcp://", 10000);
	/* the connection from before: a status request answered on it */
	size_t flen;
	uint8_t *f = status_frame(&before, 0, &flen);
	zmq_send(before.sock, f, flen, 0);
	free(f);
	Hpu__Envelope *r = NULL;
	for (int i = 0; i < 100 && !r; i++) {
		h_wait(&daemon_proc, 10);
		r = await_reply(&before, 50);
	}
	int answered = r && r->msg_case == HPU__ENVELOPE__MSG_STATUS_REPLY;
	hpu__codec_free(r);
	client_close(&before);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	printf("  %d connections; hpud's log:\n%s", n, daemon_proc.out);
	assert_int_equal(logged, 0);
	assert_non_null(strstr(daemon_proc.out, "Too many open files"));
	assert_true(answered);
	char target[64];
	snprintf(target, sizeof target, "127.0.0.1:%d", port);
	char *st[] = {(char *)LAUNCH, "--status", target, "--key", key_path, NULL};
	proc p;
	int code = -1;
	for (int i = 0; i < 5 && code != 0; i++) { /* the closed ones go within a second or two */
		if (i)
			h_free(&p);
		code = h_run(&p, st, NULL, 30000);
	}
	printf("  --status: exit %d: %s", code, p.out);
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "2 devices"));
	h_free(&p);
	stop_daemon();
}

/* hpulaunch with another cluster key: hpud drops its frames unanswered
 * (a stranger learns nothing), so the submitter cannot tell a wrong key
 * from a hpud that is not there and names both; hpud's log says which. */
static void test_submitter_wrong_key(void **state)
{
	(void)state;
	start_daemon();
	char other[160], target[64], want[200];
	snprintf(other, sizeof other, "%s/other.key", dir);
	char *gen[] = {(char *)HPUD, "--gen-key", other, NULL};
	proc p;
	assert_int_equal(h_run(&p, gen, NULL, 10000), 0);
	h_free(&p);
	snprintf(target, sizeof target, "127.0.0.1:%d", port);
	char *argv[] = {(char *)LAUNCH, "--status", target, "--key", other, NULL};
	int code = h_run(&p, argv, NULL, 30000);
	printf("  %s", p.out);
	assert_int_equal(code, 1);
	snprintf(want, sizeof want,
		 "no answer from hpud at 127.0.0.1:%d within 10 s: is it running, does it have the same key, and is its clock within its clock_window of this one's?",
		 port);
	assert_non_null(strstr(p.out, want));
	h_free(&p);
	assert_int_equal(h_wait_for(&daemon_proc, "bad signature (wrong key or altered)", 5000), 0);
	assert_non_null(strstr(daemon_proc.out, "refused a request from 127.0.0.1"));
	unlink(other);
	stop_daemon();
}

/* A submitter whose clock is 60 s behind, against an hpud whose
 * clock_window is 120 s: hpud answers, and hpulaunch takes the answer
 * (it dropped it, "timestamp 60.0 s in the future (the window is 30.0
 * s)", then said "no answer ... does it have the same key?"). */
static void test_submitter_clock_window(void **state)
{
	(void)state;
	write_conf(2, "clock_window = 120\n");
	start_daemon();
	char target[64], skew[64];
	snprintf(target, sizeof target, "127.0.0.1:%d", port);
	snprintf(skew, sizeof skew, "LD_PRELOAD=%s", h_build("lib/clock_skew.so"));
	char *env[] = {skew, "HPU_TEST_SKEW_MS=-60000", NULL};
	char *argv[] = {(char *)LAUNCH, "--status", target, "--key", key_path, NULL};
	proc p;
	int code = h_run(&p, argv, env, 30000);
	printf("  %s", p.out);
	assert_null(strstr(p.out, "dropped a message"));
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "2 devices"));
	h_free(&p);
	stop_daemon();
	write_conf(2, NULL);
}

/* ---- a signed request is bound to one hpud instance ---- */

/* A signed launch request as hpulaunch --hostfile sends it (for the
 * instance of hpud c said hello to): one node, one device, a long run of
 * the model. */
static uint8_t *launch_frame(client *c, const char *job_id, size_t *len)
{
	char *argv[] = {"--max-steps", "100000", "--log-every", "0", "--no-eval",
			(char *)MODEL, "--", "--hidden", "16"};
	Hpu__LaunchRequest q = HPU__LAUNCH_REQUEST__INIT;
	q.job_id = (char *)job_id;
	q.job_token = "replayed-token";
	q.node_rank = 0;
	q.nodes = 1;
	q.devices = 1;
	q.master_addr = "127.0.0.1";
	q.n_argv = sizeof argv / sizeof *argv;
	q.argv = argv;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_LAUNCH_REQUEST;
	env.launch_request = &q;
	return sign_env(c, &env, 0, len);
}

/* A launch of node `rank` of `nodes` with `devices` workers here and
 * node_devices[0..n) for every node: refused with `want` in the error
 * (NULL: accepted, then cancelled). */
static void launch_layout(int rank, int nodes, int devices, const uint32_t *nd, size_t n,
			  const char *want)
{
	char *argv[] = {"--max-steps", "100000", "--log-every", "0", "--no-eval", (char *)MODEL,
			"--", "--hidden", "16"};
	Hpu__LaunchRequest q = HPU__LAUNCH_REQUEST__INIT;
	q.job_id = "layout-job";
	q.job_token = "layout-token";
	q.node_rank = (uint32_t)rank;
	q.nodes = (uint32_t)nodes;
	q.devices = (uint32_t)devices;
	q.node_devices = (uint32_t *)nd;
	q.n_node_devices = n;
	q.master_addr = "127.0.0.1";
	q.master_port = rank ? 29999 : 0;
	q.n_argv = sizeof argv / sizeof *argv;
	q.argv = argv;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_LAUNCH_REQUEST;
	env.launch_request = &q;
	client c;
	client_open(&c, key);
	size_t len;
	uint8_t *f = sign_env(&c, &env, 0, &len);
	zmq_send(c.sock, f, len, 0);
	free(f);
	Hpu__Envelope *r = await_reply(&c, 10000);
	assert_non_null(r);
	assert_int_equal(r->msg_case, HPU__ENVELOPE__MSG_LAUNCH_REPLY);
	printf("  node_devices of %zu entries, node %d of %d with %d: %s%s\n", n, rank, nodes, devices,
	       r->launch_reply->ok ? "accepted" : "refused: ", r->launch_reply->error);
	if (want) {
		assert_false(r->launch_reply->ok);
		assert_non_null(strstr(r->launch_reply->error, want));
	} else {
		assert_true(r->launch_reply->ok);
		Hpu__Cancel cn = HPU__CANCEL__INIT;
		cn.job_id = "layout-job";
		Hpu__Envelope ce = HPU__ENVELOPE__INIT;
		ce.msg_case = HPU__ENVELOPE__MSG_CANCEL;
		ce.cancel = &cn;
		f = sign_env(&c, &ce, 0, &len);
		zmq_send(c.sock, f, len, 0);
		free(f);
		for (int i = 0; i < 100 && jobs_running(); i++)
			usleep(100000);
		assert_int_equal(jobs_running(), 0);
	}
	hpu__codec_free(r);
	client_close(&c);
}

/* A submitter whose connection is replaced (ZeroMQ reconnects after a
 * reset, under another routing id) pings from the new one: the job's
 * end goes there (it went to the old one, dropped, while the pings kept
 * the job alive). Played by a second socket with the first's session. */
static void test_submitter_reconnected(void **state)
{
	(void)state;
	write_conf(2, NULL);
	start_daemon();
	client a, b;
	client_open(&a, key);
	size_t len;
	uint8_t *f = launch_frame(&a, "moved-job", &len);
	zmq_send(a.sock, f, len, 0);
	free(f);
	Hpu__Envelope *r = await_reply(&a, 10000);
	assert_non_null(r);
	assert_int_equal(r->msg_case, HPU__ENVELOPE__MSG_LAUNCH_REPLY);
	assert_true(r->launch_reply->ok);
	hpu__codec_free(r);
	/* the same session on another connection: a ping, then a cancel */
	client_open(&b, key);
	snprintf(b.session, sizeof b.session, "%s", a.session);
	Hpu__Ping ping = HPU__PING__INIT;
	ping.job_id = "moved-job";
	Hpu__Envelope pe = HPU__ENVELOPE__INIT;
	pe.msg_case = HPU__ENVELOPE__MSG_PING;
	pe.ping = &ping;
	f = sign_env(&b, &pe, 0, &len);
	zmq_send(b.sock, f, len, 0);
	free(f);
	Hpu__Cancel cn = HPU__CANCEL__INIT;
	cn.job_id = "moved-job";
	Hpu__Envelope ce = HPU__ENVELOPE__INIT;
	ce.msg_case = HPU__ENVELOPE__MSG_CANCEL;
	ce.cancel = &cn;
	f = sign_env(&b, &ce, 0, &len);
	zmq_send(b.sock, f, len, 0);
	free(f);
	int ended = 0;
	for (int i = 0; i < 300 && !ended; i++) { /* pongs and output first */
		h_wait(&daemon_proc, 0);
		Hpu__Envelope *m = await_reply(&b, 100);
		ended = m && m->msg_case == HPU__ENVELOPE__MSG_JOB_END;
		hpu__codec_free(m);
	}
	for (int i = 0; i < 100 && jobs_running(); i++)
		usleep(100000);
	h_wait_for(&daemon_proc, "its submitter is back", 5000);
	printf("  the job's end %s the new connection; hpud's log:\n%s",
	       ended ? "reached" : "did not reach", daemon_proc.out);
	client_close(&b);
	client_close(&a);
	assert_true(ended);
	assert_non_null(strstr(daemon_proc.out, "job moved-job: its submitter is back on another connection"));
	assert_int_equal(jobs_running(), 0);
	stop_daemon();
}

/* node_devices (hosts with different slots) is checked field by field
 * before anything runs: one entry a node, each 1..1024, this node's equal
 * to devices. A good one is taken: node 1 of 2 with 1 of 2+1 workers. */
static void test_launch_layout_checked(void **state)
{
	(void)state;
	start_daemon();
	const uint32_t two_one[] = {2, 1}, zero[] = {2, 0}, big[] = {1, 5000}, three[] = {2, 1, 1};
	launch_layout(0, 2, 2, three, 3, "node_devices must have one entry a node (nodes), or none");
	launch_layout(0, 2, 2, zero, 2, "node_devices must be 1..1024 workers a node");
	launch_layout(0, 2, 1, big, 2, "node_devices must be 1..1024 workers a node");
	launch_layout(1, 2, 2, two_one, 2, "node_devices must give this node (node_rank) its devices");
	assert_int_equal(jobs_running(), 0);
	launch_layout(1, 2, 1, two_one, 2, NULL);
	h_wait(&daemon_proc, 200);
	assert_non_null(strstr(daemon_proc.out, "job layout-job from 127.0.0.1: node 1 of 2, 1 worker (rank 2 of 3)"));
	stop_daemon();
}

/* Sends a captured frame on a fresh connection to the hpud on port p;
 * returns whether a launch reply that says ok came back. */
static int replay_to(int p, const uint8_t *frame, size_t len)
{
	client c;
	client_open_port(&c, key, p);
	zmq_send(c.sock, frame, len, 0);
	Hpu__Envelope *r = await_reply(&c, 3000);
	int ok = r && r->msg_case == HPU__ENVELOPE__MSG_LAUNCH_REPLY && r->launch_reply->ok;
	hpu__codec_free(r);
	client_close(&c);
	return ok;
}

/* A signed launch captured on the wire starts nothing on a second hpud
 * with the same key (another port), nor on its own hpud after a restart:
 * both refuse it and log why. */
static void test_launch_bound_to_instance(void **state)
{
	(void)state;
	char conf2[160], text[512];
	int port2 = h_free_port();
	snprintf(conf2, sizeof conf2, "%s/second.conf", dir);
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = 2\nkey = %s\nuser = nobody\n"
		 "log_level = info\nsubmitter_timeout = 3\n",
		 port2, key_path);
	assert_int_equal(h_write_file(conf2, text, 0644), 0);
	start_daemon();
	proc b;
	char *argv[] = {(char *)HPUD, "-c", conf2, NULL};
	char *env[] = {"HPUCOLL_TIMEOUT_MS=10000", NULL};
	assert_int_equal(h_start(&b, argv, env), 0);
	assert_int_equal(h_wait_for(&b, "listening on", 10000), 0);

	/* the submitter's frame for hpud A, captured */
	client a;
	client_open(&a, key);
	size_t len;
	uint8_t *f = launch_frame(&a, "captured-job", &len);
	/* it starts the job on A */
	zmq_send(a.sock, f, len, 0);
	Hpu__Envelope *r = await_reply(&a, 10000);
	assert_non_null(r);
	assert_int_equal(r->msg_case, HPU__ENVELOPE__MSG_LAUNCH_REPLY);
	if (!r->launch_reply->ok)
		fail_msg("hpud refused the genuine launch: %s", r->launch_reply->error);
	hpu__codec_free(r);
	client_close(&a);
	pid_t kids[4];
	assert_int_equal(h_children(daemon_proc.pid, kids, 4), 1);

	/* replayed to B, which has the same key */
	int on_b = replay_to(port2, f, len);
	h_wait(&b, 300);
	int b_kids = h_children(b.pid, kids, 4);
	/* replayed to A after a restart (its job ended with it) */
	stop_daemon();
	start_daemon();
	int on_a = replay_to(port, f, len);
	h_wait(&daemon_proc, 300);
	int a_kids = h_children(daemon_proc.pid, kids, 4);
	free(f);
	printf("  the captured launch replayed: to a second hpud %s (%d workers), "
	       "to the restarted hpud %s (%d workers)\n",
	       on_b ? "STARTED THE JOB" : "refused", b_kids, on_a ? "STARTED THE JOB" : "refused",
	       a_kids);
	const char *why = "signed for another hpud or before a restart";
	int b_logged = strstr(b.out, why) != NULL, a_logged = strstr(daemon_proc.out, why) != NULL;
	printf("  hpud B %s, the restarted hpud A %s \"%s\"\n", b_logged ? "logged" : "did not log",
	       a_logged ? "logged" : "did not log", why);
	const char *line = strstr(b.out, "refused a request");
	if (line)
		printf("  hpud B: %.*s\n", (int)strcspn(line, "\n"), line);
	kill(b.pid, SIGTERM);
	if (h_wait(&b, 15000) < 0)
		h_kill(&b);
	h_free(&b);
	assert_false(on_b);
	assert_int_equal(b_kids, 0);
	assert_false(on_a);
	assert_int_equal(a_kids, 0);
	assert_true(b_logged);
	assert_true(a_logged);
	assert_int_equal(jobs_running(), 0);
	stop_daemon();
}

/* A key rotated with SIGHUP while a job runs: the job's submitter goes on
 * with the key it has (its pings past submitter_timeout, 3 s, taken;
 * hpud's messages to it signed with that key), and the job ends normally;
 * a new launch with the old key is refused, saying the key was rotated.
 * The workers wait 6 s before they train (a script in front of
 * hpu-worker). It had cancelled the job: the pings, signed with the old
 * key, were refused. */
static void test_key_rotation_keeps_jobs(void **state)
{
	(void)state;
	char script[192], text[512], old_key[192];
	snprintf(script, sizeof script, "%s/slow-worker.sh", dir);
	snprintf(text, sizeof text, "#!/bin/sh\nsleep 6\nexec %s \"$@\"\n", h_build("bin/hpu-worker"));
	assert_int_equal(h_write_file(script, text, 0755), 0);
	snprintf(text, sizeof text, "worker = %s\n", script);
	write_conf(2, text);
	start_daemon();
	snprintf(old_key, sizeof old_key, "%s/old.key", dir);
	char *argv[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path,
			"--devices", "2", "--max-steps", "2", "--log-every", "0",
			"--no-eval", (char *)MODEL, "--", "--hidden", "16", NULL};
	proc p, q;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	if (h_wait_for(&p, "through hpud", 60000) < 0)
		fail_msg("the job did not start:\n%s\nhpud:\n%s", p.out, daemon_proc.out);
	/* the new key in key_path, the old one kept aside */
	assert_int_equal(rename(key_path, old_key), 0);
	char *gen[] = {(char *)HPUD, "--gen-key", key_path, NULL};
	assert_int_equal(h_run(&q, gen, NULL, 10000), 0);
	h_free(&q);
	kill(daemon_proc.pid, SIGHUP);
	assert_int_equal(h_wait_for(&daemon_proc, "configuration reloaded", 5000), 0);
	int ended = h_wait(&p, 120000) == 0;
	const char *end = strstr(p.out, "[rank 0] trained 2 steps");
	printf("  the job started before the rotation: exit %d: %.*s\n", ended ? h_code(&p) : -1,
	       end ? (int)strcspn(end, "\n") : 0, end ? end : "");
	if (!ended || h_code(&p) != 0 || !end)
		fail_msg("the job did not end normally:\n%s\nhpud:\n%s", p.out, daemon_proc.out);
	assert_int_equal(h_wait_for(&daemon_proc, "ended successfully", 5000), 0);
	assert_non_null(strstr(daemon_proc.out, "signs with the previous key"));
	assert_null(strstr(daemon_proc.out, "went away"));
	h_free(&p);
	/* a new launch with the old key */
	argv[4] = old_key;
	int rc = h_run(&q, argv, NULL, 60000);
	const char *err = strstr(q.out, "hpulaunch: error");
	printf("  a new launch with the old key: exit %d: %.*s\n", rc,
	       err ? (int)strcspn(err, "\n") : 0, err ? err : "");
	assert_int_equal(rc, 1);
	assert_non_null(strstr(q.out, "key was rotated"));
	h_free(&q);
	/* --status with the old key is answered the same way (it waited 10 s
	 * and said "no answer ... does it have the same key") */
	char target[64];
	snprintf(target, sizeof target, "127.0.0.1:%d", port);
	char *st[] = {(char *)LAUNCH, "--status", target, "--key", old_key, NULL};
	rc = h_run(&q, st, NULL, 60000);
	printf("  --status with the old key: exit %d: %s", rc, q.out);
	assert_int_equal(rc, 1);
	assert_non_null(strstr(q.out, "refused the status request: this hpud's key was rotated"));
	assert_null(strstr(q.out, "no answer"));
	h_free(&q);
	stop_daemon();
	assert_int_equal(rename(old_key, key_path), 0);
	write_conf(2, NULL);
	unlink(script);
}

/* SIGHUP applies `worker` and `clock_window`: a request stamped 10 s
 * ago, taken in a window of 30 s, is refused as stale in one of 2 s; the
 * next job runs the new worker program (a script that says its name). Both
 * were said to be reloaded and kept as at start. */
static void test_reload_worker_and_window(void **state)
{
	(void)state;
	char wa[192], wb[192], text[512];
	snprintf(wa, sizeof wa, "%s/worker-a.sh", dir);
	snprintf(wb, sizeof wb, "%s/worker-b.sh", dir);
	snprintf(text, sizeof text, "#!/bin/sh\necho worker-a-ran\nexec %s \"$@\"\n", h_build("bin/hpu-worker"));
	assert_int_equal(h_write_file(wa, text, 0755), 0);
	snprintf(text, sizeof text, "#!/bin/sh\necho worker-b-ran\nexec %s \"$@\"\n", h_build("bin/hpu-worker"));
	assert_int_equal(h_write_file(wb, text, 0755), 0);
	snprintf(text, sizeof text, "worker = %s\nclock_window = 30\n", wa);
	write_conf(2, text);
	start_daemon();
	client c;
	client_open(&c, key);
	size_t len;
	uint8_t *f = status_frame(&c, -10000, &len);
	zmq_send(c.sock, f, len, 0);
	free(f);
	Hpu__Envelope *r = await_reply(&c, 10000);
	assert_non_null(r); /* 10 s off, in a window of 30 s */
	hpu__codec_free(r);
	snprintf(text, sizeof text, "worker = %s\nclock_window = 2\n", wb);
	write_conf(2, text);
	kill(daemon_proc.pid, SIGHUP);
	assert_int_equal(h_wait_for(&daemon_proc, "configuration reloaded", 5000), 0);
	f = status_frame(&c, -10000, &len);
	zmq_send(c.sock, f, len, 0);
	free(f);
	r = await_reply(&c, 2000);
	int stale = h_wait_for(&daemon_proc, "stale: timestamp 10.0 s in the past (the window is 2.0 s)", 5000) == 0;
	printf("  a request 10 s old after clock_window = 2: %s, %s\n", r ? "ANSWERED" : "refused",
	       stale ? "logged as stale" : "not logged as stale");
	hpu__codec_free(r);
	assert_null(r);
	assert_true(stale);
	f = status_frame(&c, 0, &len);
	zmq_send(c.sock, f, len, 0);
	free(f);
	r = await_reply(&c, 10000);
	assert_non_null(r);
	hpu__codec_free(r);
	client_close(&c);
	char *argv[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path,
			"--devices", "2", "--max-steps", "1", "--log-every", "0",
			"--no-eval", (char *)MODEL, "--", "--hidden", "16", NULL};
	proc p;
	int rc = h_run(&p, argv, NULL, 120000);
	printf("  the job after the reload ran %s\n", strstr(p.out, "worker-b-ran") ? "the new worker"
						  : strstr(p.out, "worker-a-ran") ? "THE OLD WORKER"
										 : "no worker script");
	if (rc != 0)
		fail_msg("the job failed (%d):\n%s", rc, p.out);
	assert_non_null(strstr(p.out, "worker-b-ran"));
	assert_null(strstr(p.out, "worker-a-ran"));
	h_free(&p);
	stop_daemon();
	write_conf(2, NULL);
	unlink(wa);
	unlink(wb);
}

/* hpud's `worker =` naming a program that is not hpu-worker (/bin/true):
 * its workers exit 0 without ever saying hello, and the job fails saying
 * so. hpulaunch reported such a job as a success (exit 0, nothing
 * trained). */
static void test_worker_not_hpu_worker(void **state)
{
	(void)state;
	write_conf(2, "worker = /bin/true\n");
	start_daemon();
	char *argv[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path,
			"--devices", "1", "--max-steps", "2", "--log-every", "0",
			"--no-eval", (char *)MODEL, "--", "--hidden", "16", NULL};
	proc p;
	int rc = h_run(&p, argv, NULL, 120000);
	printf("  worker = /bin/true: exit %d\n%s", rc, p.out);
	assert_int_equal(rc, 1);
	assert_non_null(strstr(p.out, "exited with code 0 before the job ended"));
	assert_non_null(strstr(p.out, "is the worker program hpu-worker?"));
	h_free(&p);
	stop_daemon();
	write_conf(2, NULL);
}

/* Receives and drops what hpud sent c without verifying it: pongs in
 * their thousands would fill c's own replay cache (65536 nonces over
 * its 30 s window), after which it would refuse hpud's genuine replies. */
static void drain_unread(client *c)
{
	zmq_msg_t m;
	zmq_msg_init(&m);
	while (zmq_msg_recv(&m, c->sock, ZMQ_DONTWAIT) >= 0)
		;
	zmq_msg_close(&m);
}

/* With clock_window = 3600, 70,000 requests stamped within the window (a
 * flood of pings for no job, from another client) fit in the replay cache,
 * sized from the window: a job running meanwhile, whose workers wait for a
 * go file, keeps its pings taken past submitter_timeout (3 s) and ends
 * normally. The cache held 65536 nonces whatever the window: once full it
 * refused every request, the job's pings too, and the job was cancelled. */
static void test_replay_cache_sized_from_window(void **state)
{
	(void)state;
	char flags[128], go[160], script[192], text[1024];
	flags_dir("flags-cache", flags, sizeof flags);
	snprintf(go, sizeof go, "%s/go", flags);
	snprintf(script, sizeof script, "%s/wait-worker.sh", dir);
	snprintf(text, sizeof text, "#!/bin/sh\nwhile [ ! -e %s ]; do sleep 0.05; done\nexec %s \"$@\"\n", go,
		 h_build("bin/hpu-worker"));
	assert_int_equal(h_write_file(script, text, 0755), 0);
	snprintf(text, sizeof text, "worker = %s\nclock_window = 3600\n", script);
	write_conf(2, text);
	start_daemon();
	proc p;
	start_small_job(&p);
	client c;
	client_open(&c, key);
	Hpu__Ping ping = HPU__PING__INIT;
	ping.job_id = "no-such-job";
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_PING;
	env.ping = &ping;
	int sent = 0;
	for (int i = 0; i < 70000; i++) {
		size_t len;
		uint8_t *f = sign_env(&c, &env, -(int64_t)(i % 1000) * 1000, &len);
		sent += zmq_send(c.sock, f, len, 0) >= 0;
		free(f);
		drain_unread(&c);
		if (i % 5000 == 0)
			h_wait(&daemon_proc, 0); /* read its log: it must not block */
	}
	assert_int_equal(sent, 70000);
	/* hpud has taken them all when it answers a status request after them
	 * (asked again every second, for up to 2 minutes, however many pongs
	 * come first: a reply finding hpud's queue to us full of pongs is
	 * dropped) */
	int synced = 0;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int64_t asked = -1000, ms = 0; ms < 120000 && !synced;) {
		if (ms - asked >= 1000) {
			size_t len;
			uint8_t *f = status_frame(&c, 0, &len);
			zmq_send(c.sock, f, len, 0);
			free(f);
			asked = ms;
		}
		h_wait(&daemon_proc, 0);
		Hpu__Envelope *r = await_reply(&c, 20);
		synced = r && r->msg_case == HPU__ENVELOPE__MSG_STATUS_REPLY;
		hpu__codec_free(r);
		clock_gettime(CLOCK_MONOTONIC, &t);
		ms = (int64_t)(t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
	}
	client_close(&c);
	h_wait(&daemon_proc, 5000); /* past submitter_timeout */
	assert_int_equal(h_write_file(go, "", 0644), 0);
	int ended = h_wait(&p, 120000) == 0;
	int full = strstr(daemon_proc.out, "replay cache full") != NULL;
	printf("  70000 pings stamped within the window: hpud %s; the job: exit %d\n",
	       full ? "REFUSED SOME: replay cache full" : "took them", ended ? h_code(&p) : -1);
	if (!ended || h_code(&p) != 0)
		fail_msg("the job did not end normally:\n%s\nhpud:\n%.2000s", p.out, daemon_proc.out);
	if (!synced)
		fail_msg("hpud did not answer a status request within 2 minutes of the pings:\n%.2000s",
			 daemon_proc.out);
	assert_false(full);
	h_free(&p);
	stop_daemon();
	write_conf(2, NULL);
	unlink(script);
}

/* ---- the submitter's side of the binding, against a fake hpud ---- */

/* hpulaunch --status against a fake hpud that answers with frames hpud
 * never sends to it: a reply for another session, a replayed reply (an
 * old sequence number), one from another instance, then 3000 garbage
 * frames. The submitter drops each, warning of at most 5 a second and
 * summing up the rest in one line, and takes the genuine reply after
 * them; its requests name the instance and session of the hello. */
static void test_submitter_refuses_replays(void **state)
{
	(void)state;
	fake f;
	int fport = h_free_port();
	char target[64];
	snprintf(target, sizeof target, "127.0.0.1:%d", fport);
	fake_open(&f, fport);
	proc p;
	char *argv[] = {(char *)LAUNCH, "--status", target, "--key", key_path, NULL};
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(h_start(&p, argv, NULL), 0);

	Hpu__Envelope *q = fake_recv(&f);
	assert_non_null(q);
	assert_int_equal(q->msg_case, HPU__ENVELOPE__MSG_HELLO);
	char session[64], other[HPU_AUTH_ID_HEX + 1];
	snprintf(session, sizeof session, "%s", q->session);
	assert_int_equal(strlen(session), HPU_AUTH_ID_HEX);
	hpu__codec_free(q);
	assert_int_equal(hpu__auth_random_id(other), 0);
	const char *instance = "0123456789abcdef0123456789abcdef";
	Hpu__HelloReply hr = HPU__HELLO_REPLY__INIT;
	hr.instance = (char *)instance;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_HELLO_REPLY;
	env.hello_reply = &hr;
	size_t len;
	uint8_t *fr = fake_sign(&f, &env, instance, other, 9, &len); /* another session */
	assert_int_equal(fake_put(&f, fr, len), 0);
	free(fr);
	uint8_t *hello = fake_sign(&f, &env, instance, session, 10, &len);
	assert_int_equal(fake_put(&f, hello, len), 0);

	q = fake_recv(&f);
	assert_non_null(q);
	assert_int_equal(q->msg_case, HPU__ENVELOPE__MSG_STATUS_REQUEST);
	assert_string_equal(q->instance, instance);
	assert_string_equal(q->session, session);
	hpu__codec_free(q);
	assert_int_equal(fake_put(&f, hello, len), 0); /* replayed: seq 10 again */
	free(hello);
	Hpu__StatusReply sr = HPU__STATUS_REPLY__INIT;
	sr.devices_total = 7;
	sr.devices_free = 7;
	/* a job of two ranks: rank 0 setting up (its record has no figures
	 * yet), rank 1 training */
	Hpu__RankStatus r0 = HPU__RANK_STATUS__INIT, r1 = HPU__RANK_STATUS__INIT;
	r0.rank = 0, r0.reported = 1, r0.total = 20, r0.epoch = 1, r0.loss = NAN, r0.phase = 3,
	r0.age_s = 0.5;
	r1.rank = 1, r1.reported = 1, r1.step = 5, r1.total = 20, r1.epoch = 1, r1.epochs = 2,
	r1.loss = 0.25, r1.samples_per_sec = 1000, r1.mem_in_use = 1 << 20, r1.mem_max = 2 << 20,
	r1.mem_limit = 64 << 20, r1.age_s = 0.5;
	Hpu__RankStatus *ranks[2] = {&r0, &r1};
	uint32_t devs[2] = {0, 1};
	Hpu__JobStatus js = HPU__JOB_STATUS__INIT, *jobs[1] = {&js};
	js.job_id = "job-x", js.n_device_ids = 2, js.device_ids = devs, js.live_workers = 2;
	js.submitter = "127.0.0.1", js.n_ranks = 2, js.ranks = ranks;
	sr.n_jobs = 1, sr.jobs = jobs;
	env.msg_case = HPU__ENVELOPE__MSG_STATUS_REPLY;
	env.status_reply = &sr;
	fr = fake_sign(&f, &env, other, session, 20, &len); /* another instance */
	assert_int_equal(fake_put(&f, fr, len), 0);
	free(fr);
	uint8_t junk[200];
	for (int i = 0; i < 3000; i++) {
		for (size_t k = 0; k < sizeof junk; k++)
			junk[k] = (uint8_t)rnd();
		memcpy(junk, "HPU1", 4);
		assert_int_equal(fake_put(&f, junk, sizeof junk), 0);
	}
	fr = fake_sign(&f, &env, instance, session, 11, &len); /* the genuine one */
	assert_int_equal(fake_put(&f, fr, len), 0);
	free(fr);

	assert_int_equal(h_wait(&p, 20000), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("%s", p.out);
	int warned = 0;
	for (const char *s = p.out; (s = strstr(s, "hpulaunch: warning: dropped")); s++)
		warned++;
	printf("  %d warnings shown for 3003 frames dropped\n", warned);
	assert_int_equal(h_code(&p), 0);
	assert_non_null(strstr(p.out, "7 devices, 7 free"));
	/* the rank setting up shows '-' where it has no figure yet (it
	 * showed epoch 1/0, loss nan and 0.0 MiB, as if measured) */
	const char *want[2][11] = {{"0", "0/20", "-", "-", "-", "-", "-", "-", "0.5", "s", "setting"},
				   {"1", "5/20", "1/2", "0.2500", "1000.0", "1.0", "2.0", "64.0", "0.5", "s", NULL}};
	for (int k = 0; k < 2; k++) {
		char key[16];
		snprintf(key, sizeof key, "\n  %5d ", k);
		const char *row = strstr(p.out, key);
		assert_non_null(row);
		char line[400];
		snprintf(line, sizeof line, "%.*s", (int)strcspn(row + 1, "\n"), row + 1);
		char *save = NULL, *tok = strtok_r(line, " ", &save);
		for (int t = 0; t < 11 && want[k][t]; t++, tok = strtok_r(NULL, " ", &save))
			if (!tok || strcmp(tok, want[k][t]))
				fail_msg("rank %d's row, column %d: '%s', want '%s'", k, t, tok ? tok : "(none)",
					 want[k][t]);
	}
	assert_non_null(strstr(p.out, "not for this session"));
	assert_non_null(strstr(p.out, "replayed or out of order (seq 10, the last was 10)"));
	assert_non_null(strstr(p.out, "from another hpud instance"));
	assert_non_null(strstr(p.out, "more messages dropped (not shown)"));
	/* at most 5 a second: as many seconds as it took, begun ones counted */
	int seconds = (int)(t1.tv_sec - t0.tv_sec) + 1;
	if (warned < 5 || warned > 5 * (seconds + 1))
		fail_msg("%d warnings in %d s begun; want 5 to %d", warned, seconds, 5 * (seconds + 1));
	h_free(&p);
	fake_close(&f);
}

#define FLOOD_LINES 100000

/* The fake hpud's side of a job: it answers hello and the launch, then
 * streams FLOOD_LINES output lines as fast as it signs them and the job's
 * end. Runs in a thread, while the test reads hpulaunch's output; returns
 * NULL, or what went wrong. */
static void *fake_flood(void *arg)
{
	fake *f = arg;
	Hpu__Envelope *q = fake_recv(f);
	if (!q || q->msg_case != HPU__ENVELOPE__MSG_HELLO)
		return "no hello";
	char session[64], job_id[64];
	snprintf(session, sizeof session, "%s", q->session);
	hpu__codec_free(q);
	const char *instance = "00112233445566778899aabbccddeeff";
	uint64_t seq = 0;
	size_t len;
	uint8_t *fr;
	Hpu__HelloReply hr = HPU__HELLO_REPLY__INIT;
	hr.instance = (char *)instance;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_HELLO_REPLY;
	env.hello_reply = &hr;
	fr = fake_sign(f, &env, instance, session, ++seq, &len);
	int bad = fake_put(f, fr, len);
	free(fr);
	if (bad < 0)
		return "hpulaunch went away";
	if (!(q = fake_recv(f)) || q->msg_case != HPU__ENVELOPE__MSG_LAUNCH_REQUEST ||
	    strcmp(q->instance, instance) || strcmp(q->session, session)) {
		hpu__codec_free(q);
		return "no launch request naming the instance and session";
	}
	snprintf(job_id, sizeof job_id, "%s", q->launch_request->job_id);
	hpu__codec_free(q);
	Hpu__LaunchReply lr = HPU__LAUNCH_REPLY__INIT;
	lr.job_id = job_id;
	lr.ok = 1;
	lr.master_port = 29999;
	env.msg_case = HPU__ENVELOPE__MSG_LAUNCH_REPLY;
	env.launch_reply = &lr;
	fr = fake_sign(f, &env, instance, session, ++seq, &len);
	bad = fake_put(f, fr, len);
	free(fr);
	if (bad < 0)
		return "hpulaunch went away";
	char text[64];
	Hpu__LogLine ll = HPU__LOG_LINE__INIT;
	ll.job_id = job_id;
	ll.text = text;
	env.msg_case = HPU__ENVELOPE__MSG_LOG_LINE;
	env.log_line = &ll;
	for (int i = 0; i < FLOOD_LINES; i++) {
		ll.rank = (uint32_t)(i % 2);
		snprintf(text, sizeof text, "flood line %d", i);
		fr = fake_sign(f, &env, instance, session, ++seq, &len);
		bad = fake_put(f, fr, len);
		free(fr);
		if (bad < 0)
			return "hpulaunch went away";
	}
	Hpu__JobEnd je = HPU__JOB_END__INIT;
	je.job_id = job_id;
	je.ok = 1;
	je.reason = "";
	env.msg_case = HPU__ENVELOPE__MSG_JOB_END;
	env.job_end = &je;
	fr = fake_sign(f, &env, instance, session, ++seq, &len);
	bad = fake_put(f, fr, len);
	free(fr);
	return bad < 0 ? "hpulaunch went away" : NULL;
}

/* hpulaunch --hostfile against a fake hpud that streams 100000 output
 * lines as fast as it can sign them, well past the 65536 nonces in 30 s
 * that the submitter's replay cache used to hold: the submitter takes
 * every line, in order, warns of nothing and exits 0. */
static void test_submitter_takes_a_flood(void **state)
{
	(void)state;
	fake f;
	int fport = h_free_port();
	char hf[160], text[64];
	snprintf(hf, sizeof hf, "%s/hostfile-fake", dir);
	snprintf(text, sizeof text, "127.0.0.1:%d slots=1\n", fport);
	assert_int_equal(h_write_file(hf, text, 0644), 0);
	fake_open(&f, fport);
	proc p;
	char *argv[] = {(char *)LAUNCH, "--hostfile", hf, "--key", key_path, "--devices", "1",
			(char *)MODEL, NULL};
	assert_int_equal(h_start(&p, argv, NULL), 0);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, fake_flood, &f), 0);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int exited = h_wait(&p, 60000) == 0;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	void *res;
	if (!exited)
		h_kill(&p); /* the thread's sends then fail, and it ends */
	pthread_join(t, &res);
	long lines = 0, in_order = 1;
	const char *s = p.out;
	char want[64];
	for (int i = 0; i < FLOOD_LINES && in_order; i++) {
		snprintf(want, sizeof want, "[rank %d] flood line %d\n", i % 2, i);
		const char *at = strstr(s, want);
		if (at) {
			lines++;
			s = at + strlen(want);
		} else {
			in_order = 0;
		}
	}
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
	printf("  exit %d after %.1f s: %ld of %d lines, in order; the fake hpud: %s\n",
	       exited ? h_code(&p) : -1, secs, lines, FLOOD_LINES,
	       res ? (const char *)res : "all sent");
	const char *warn = strstr(p.out, "hpulaunch: warning");
	const char *err = strstr(p.out, "hpulaunch: error");
	if (warn || err)
		printf("  %.300s\n", warn ? warn : err);
	assert_null(res);
	assert_true(exited);
	assert_int_equal(h_code(&p), 0);
	assert_int_equal(lines, FLOOD_LINES);
	assert_null(warn);
	h_free(&p);
	fake_close(&f);
	unlink(hf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_requests),
		cmocka_unit_test(test_refusal_burst_counted),
		cmocka_unit_test(test_submitter_wrong_key),
		cmocka_unit_test(test_output_into_full_stdout),
		cmocka_unit_test(test_connections_past_the_fd_limit),
		cmocka_unit_test(test_submitter_clock_window),
		cmocka_unit_test(test_launch_bound_to_instance),
		cmocka_unit_test(test_launch_layout_checked),
		cmocka_unit_test(test_submitter_reconnected),
		cmocka_unit_test(test_key_rotation_keeps_jobs),
		cmocka_unit_test(test_reload_worker_and_window),
		cmocka_unit_test(test_worker_not_hpu_worker),
		cmocka_unit_test(test_replay_cache_sized_from_window),
		cmocka_unit_test(test_submitter_refuses_replays),
		cmocka_unit_test(test_submitter_takes_a_flood),
	};
	int skip = hpud_test_init("test_hpud_auth");
	if (skip)
		return skip;
	return cmocka_run_group_tests(tests, hpud_setup, hpud_teardown);
}
