/* Tests of libhpucoll with real processes over real sockets: the parent
 * forks one child per rank; each child binds, publishes its endpoint in
 * shared memory, connects and runs the collectives, checking every
 * element; it exits 0 on success or prints the first mismatch and exits 1.
 * Error paths (timeouts, malformed messages) run in the parent against a
 * forged peer made of plain ZeroMQ sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "hpu/coll.h"
#include "comm_internal.h" /* the wire format, to forge messages */

#define MAX_WS 4
#define CHILD_DEADLINE_MS 120000
#define BIG_COUNT (16u * 1024 * 1024)
#define BCAST_BIG (5u * 1024 * 1024 + 3)

/* Memory shared by the parent and the ranks it forks. */
struct shared {
	atomic_int ready;   /* ranks that published their endpoint */
	atomic_int counter; /* barrier test: arrivals so far */
	char ep[MAX_WS][HPUCOLL__ENDPOINT_MAX];
};

typedef int (*rank_fn)(hpucoll_comm *c, struct shared *sh);

static int world_id; /* makes each world's ipc paths unique */

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void ipc_path(char *buf, size_t len, const char *what, int rank)
{
	snprintf(buf, len, "ipc:///tmp/hpucoll-test-%d-%d-%s%d", (int)getpid(),
		 world_id, what, rank);
}

/* ---- child side ---- */

static int fail_rc(hpucoll_comm *c, const char *call, int rc)
{
	fprintf(stderr, "rank %d: %s: %s %s\n", hpucoll_comm_rank(c), call,
		hpucoll_strerror(rc), hpucoll_comm_errmsg(c));
	return 1;
}

static int wait_ready(struct shared *sh, int ws)
{
	int64_t deadline = now_ms() + 30000;

	while (atomic_load(&sh->ready) < ws) {
		if (now_ms() > deadline)
			return -1;
		usleep(1000);
	}
	return 0;
}

static int child(int rank, int ws, const char *bind_ep, struct shared *sh,
		 rank_fn body)
{
	const char *eps[MAX_WS];
	hpucoll_comm *c = NULL;
	int rc;

	rc = hpucoll_comm_new(&c, rank, ws, bind_ep);
	if (rc != HPUCOLL_OK) {
		fprintf(stderr, "rank %d: comm_new: %s\n", rank,
			hpucoll_strerror(rc));
		return 1;
	}
	snprintf(sh->ep[rank], sizeof(sh->ep[rank]), "%s",
		 hpucoll_comm_endpoint(c));
	atomic_fetch_add(&sh->ready, 1);
	if (wait_ready(sh, ws) != 0) {
		fprintf(stderr, "rank %d: the others never showed up\n", rank);
		hpucoll_comm_destroy(&c);
		return 1;
	}
	for (int i = 0; i < ws; i++)
		eps[i] = sh->ep[i];
	rc = hpucoll_comm_connect(c, eps);
	if (rc != HPUCOLL_OK)
		rc = fail_rc(c, "connect", rc);
	else
		rc = body(c, sh);
	hpucoll_comm_destroy(&c);
	return rc;
}

/* Waits for the children until the deadline, then kills those left.
 * Returns how many did not exit 0. */
static int reap(pid_t *pids, int n)
{
	int64_t deadline = now_ms() + CHILD_DEADLINE_MS;
	int left = n, bad = 0, status;

	while (left > 0 && now_ms() < deadline) {
		for (int i = 0; i < n; i++) {
			if (pids[i] <= 0 ||
			    waitpid(pids[i], &status, WNOHANG) != pids[i])
				continue;
			if (WIFSIGNALED(status))
				fprintf(stderr, "rank %d died of signal %d\n",
					i, WTERMSIG(status));
			if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
				bad++;
			pids[i] = 0;
			left--;
		}
		usleep(5000);
	}
	for (int i = 0; i < n; i++) {
		if (pids[i] > 0) {
			fprintf(stderr, "rank %d hung; killing it\n", i);
			kill(pids[i], SIGKILL);
			waitpid(pids[i], &status, 0);
			bad++;
		}
	}
	return bad;
}

/* cmocka turns crashes into longjmps back into its test runner; a crashed
 * rank must die instead. */
static void child_signals(void)
{
	static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		signal(sigs[i], SIG_DFL);
}

/* Runs `body` on `ws` forked ranks bound over ipc, or tcp when `tcp`. */
static void run_world(int ws, int tcp, rank_fn body)
{
	struct shared *sh;
	pid_t pids[MAX_WS];
	char ep[128];

	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(sh != MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	world_id++;
	fflush(stdout);
	fflush(stderr);
	for (int r = 0; r < ws; r++) {
		if (tcp)
			snprintf(ep, sizeof(ep), "tcp://127.0.0.1:*");
		else
			ipc_path(ep, sizeof(ep), "r", r);
		pids[r] = fork();
		assert_true(pids[r] >= 0);
		if (pids[r] == 0) {
			child_signals();
			_exit(child(r, ws, ep, sh, body));
		}
	}
	assert_int_equal(reap(pids, ws), 0);
	munmap(sh, sizeof(*sh));
}

/* ---- collective checks, run on every rank ---- */

/* Small integers, so that float sums in any order are exact. */
static int ival(int rank, size_t i)
{
	uint32_t h = (uint32_t)i * 2654435761u + (uint32_t)rank * 40503u;

	return (int)(h >> 22) - 512;
}

static int check_reduce(hpucoll_comm *c, float *buf, size_t count,
			hpucoll_op op)
{
	int ws = hpucoll_comm_size(c), me = hpucoll_comm_rank(c);
	int rc;

	for (size_t i = 0; i < count; i++)
		buf[i] = (float)ival(me, i);
	rc = hpucoll_all_reduce(c, count ? buf : NULL, count, HPUCOLL_F32, op);
	if (rc != HPUCOLL_OK)
		return fail_rc(c, "all_reduce", rc);
	for (size_t i = 0; i < count; i++) {
		int sum = 0;
		float want;

		for (int r = 0; r < ws; r++)
			sum += ival(r, i);
		want = (float)sum;
		if (op == HPUCOLL_AVG)
			want /= (float)ws;
		if (buf[i] != want) {
			fprintf(stderr,
				"rank %d: all_reduce %s count %zu: index %zu "
				"expected %g got %g\n",
				me, op == HPUCOLL_SUM ? "SUM" : "AVG", count, i,
				(double)want, (double)buf[i]);
			return 1;
		}
	}
	return 0;
}

/* Random floats: the result is not exact, but must be the same bytes on
 * every rank; rank 0's copy is broadcast and compared. */
static int check_identical(hpucoll_comm *c, float *buf, float *copy,
			   size_t count, hpucoll_op op)
{
	unsigned seed = 1234u + (unsigned)hpucoll_comm_rank(c);
	int rc;

	for (size_t i = 0; i < count; i++)
		buf[i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
	rc = hpucoll_all_reduce(c, buf, count, HPUCOLL_F32, op);
	if (rc != HPUCOLL_OK)
		return fail_rc(c, "all_reduce", rc);
	memcpy(copy, buf, count * sizeof(float));
	rc = hpucoll_broadcast(c, copy, count * sizeof(float), 0);
	if (rc != HPUCOLL_OK)
		return fail_rc(c, "broadcast", rc);
	for (size_t i = 0; i < count; i++) {
		if (memcmp(&copy[i], &buf[i], sizeof(float)) != 0) {
			fprintf(stderr, "rank %d: not bit-identical to rank 0 "
					"at %zu: %a vs %a\n",
				hpucoll_comm_rank(c), i, (double)buf[i],
				(double)copy[i]);
			return 1;
		}
	}
	return 0;
}

static unsigned char bval(int root, size_t i)
{
	return (unsigned char)(i * 131 + (size_t)root * 17 + 1);
}

static int check_bcast(hpucoll_comm *c, unsigned char *buf, size_t bytes,
		       int root)
{
	int me = hpucoll_comm_rank(c);
	int rc;

	for (size_t i = 0; i < bytes; i++)
		buf[i] = me == root ? bval(root, i) : 0xee;
	rc = hpucoll_broadcast(c, bytes ? buf : NULL, bytes, root);
	if (rc != HPUCOLL_OK)
		return fail_rc(c, "broadcast", rc);
	for (size_t i = 0; i < bytes; i++) {
		if (buf[i] != bval(root, i)) {
			fprintf(stderr, "rank %d: broadcast from %d of %zu "
					"bytes: index %zu expected %u got %u\n",
				me, root, bytes, i, bval(root, i), buf[i]);
			return 1;
		}
	}
	return 0;
}

static int check_barrier(hpucoll_comm *c, struct shared *sh)
{
	int ws = hpucoll_comm_size(c), me = hpucoll_comm_rank(c);
	int rc;

	for (int round = 0; round < 5; round++) {
		usleep((useconds_t)(((me * 7 + round * 3) % 5) * 1000));
		atomic_fetch_add(&sh->counter, 1);
		rc = hpucoll_barrier(c);
		if (rc != HPUCOLL_OK)
			return fail_rc(c, "barrier", rc);
		if (atomic_load(&sh->counter) < ws * (round + 1)) {
			fprintf(stderr, "rank %d: left barrier %d before "
					"everyone entered it\n",
				me, round);
			return 1;
		}
	}
	return 0;
}

static const size_t counts[] = {0, 1, 2, 3, 7, 4099, 1000003};
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))

static int all_checks(hpucoll_comm *c, struct shared *sh)
{
	size_t big = counts[NCOUNTS - 1];
	size_t fbytes = big * sizeof(float);
	float *f = malloc(fbytes > BCAST_BIG ? fbytes : BCAST_BIG);
	float *g = malloc(big * sizeof(float));
	int bad = f == NULL || g == NULL;

	for (size_t k = 0; k < NCOUNTS && !bad; k++) {
		bad = check_reduce(c, f, counts[k], HPUCOLL_SUM) ||
		      check_reduce(c, f, counts[k], HPUCOLL_AVG);
	}
	if (!bad)
		bad = check_identical(c, f, g, big, HPUCOLL_SUM) ||
		      check_identical(c, f, g, big, HPUCOLL_AVG);
	for (int root = 0; root < hpucoll_comm_size(c) && !bad; root++) {
		bad = check_bcast(c, (unsigned char *)f, 0, root) ||
		      check_bcast(c, (unsigned char *)f, 1, root) ||
		      check_bcast(c, (unsigned char *)f, BCAST_BIG, root);
	}
	if (!bad)
		bad = check_barrier(c, sh);
	free(f);
	free(g);
	return bad;
}

static int big_reduce(hpucoll_comm *c, struct shared *sh)
{
	float *f = malloc(BIG_COUNT * sizeof(float));
	int bad;

	(void)sh;
	bad = f == NULL || check_reduce(c, f, BIG_COUNT, HPUCOLL_SUM) ||
	      check_reduce(c, f, BIG_COUNT, HPUCOLL_AVG);
	free(f);
	return bad;
}

static void test_world_1(void **state)
{
	(void)state;
	run_world(1, 0, all_checks);
}

static void test_world_2(void **state)
{
	(void)state;
	run_world(2, 0, all_checks);
}

static void test_world_3(void **state)
{
	(void)state;
	run_world(3, 0, all_checks);
}

static void test_world_4(void **state)
{
	(void)state;
	run_world(4, 0, all_checks);
}

static void test_world_3_tcp(void **state)
{
	(void)state;
	run_world(3, 1, all_checks);
}

static void test_world_2_big(void **state)
{
	(void)state;
	run_world(2, 0, big_reduce);
}

/* ---- API and error paths, in this process ---- */

static void test_strerror(void **state)
{
	(void)state;
	for (int e = HPUCOLL_OK; e <= HPUCOLL_EENV; e++) {
		const char *s = hpucoll_strerror(e);

		assert_non_null(s);
		assert_true(strlen(s) > 3);
		assert_string_not_equal(s, hpucoll_strerror(-1));
	}
	assert_string_equal(hpucoll_strerror(999), hpucoll_strerror(-1));
}

static void test_bad_args(void **state)
{
	hpucoll_comm *c = NULL;
	const char *eps[2];
	char ep[128];
	float x = 1.0f;

	(void)state;
	assert_int_equal(hpucoll_comm_new(&c, 2, 2, "tcp://127.0.0.1:*"),
			 HPUCOLL_EINVAL);
	assert_null(c);
	assert_int_equal(hpucoll_comm_new(&c, 0, 0, "tcp://127.0.0.1:*"),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_comm_new(&c, 0, 1, NULL), HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_comm_new(&c, 0, 1, "nonsense://x"),
			 HPUCOLL_ETRANSPORT);
	assert_null(c);

	assert_int_equal(hpucoll_comm_new(&c, 1, 2, "tcp://127.0.0.1:*"),
			 HPUCOLL_OK);
	assert_int_equal(hpucoll_comm_rank(c), 1);
	assert_int_equal(hpucoll_comm_size(c), 2);
	assert_string_equal(hpucoll_comm_errmsg(c), "");
	assert_null(strstr(hpucoll_comm_endpoint(c), "*"));
	assert_non_null(strstr(hpucoll_comm_endpoint(c), "tcp://127.0.0.1:"));
	assert_int_equal(hpucoll_barrier(c), HPUCOLL_EINVAL);
	assert_non_null(strstr(hpucoll_comm_errmsg(c), "not connected"));

	ipc_path(ep, sizeof(ep), "nobody", 0);
	eps[0] = ep;
	eps[1] = NULL;
	assert_int_equal(hpucoll_comm_connect(c, eps), HPUCOLL_EINVAL);
	eps[1] = hpucoll_comm_endpoint(c);
	assert_int_equal(hpucoll_comm_connect(c, eps), HPUCOLL_OK);
	assert_int_equal(hpucoll_comm_connect(c, eps), HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_all_reduce(c, &x, 1, (hpucoll_dtype)7,
					    HPUCOLL_SUM),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_all_reduce(c, &x, 1, HPUCOLL_F32,
					    (hpucoll_op)9),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_all_reduce(c, NULL, 1, HPUCOLL_F32,
					    HPUCOLL_SUM),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_broadcast(c, &x, 4, 2), HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_broadcast(c, &x, 4, -1), HPUCOLL_EINVAL);
	/* Nothing was sent, so zero-sized collectives still work. */
	assert_int_equal(hpucoll_all_reduce(c, NULL, 0, HPUCOLL_F32,
					    HPUCOLL_AVG),
			 HPUCOLL_OK);
	assert_int_equal(hpucoll_broadcast(c, NULL, 0, 0), HPUCOLL_OK);
	hpucoll_comm_destroy(&c);
	assert_null(c);
	hpucoll_comm_destroy(&c);
	hpucoll_comm_destroy(NULL);
}

/* Rank 0 of 4 whose peers never show up. */
static void test_timeout(void **state)
{
	hpucoll_comm *c = NULL;
	char ep[MAX_WS][128];
	const char *eps[MAX_WS];
	float buf[8] = {0};
	int64_t t0, dt;

	(void)state;
	world_id++;
	for (int r = 0; r < MAX_WS; r++) {
		ipc_path(ep[r], sizeof(ep[r]), "t", r);
		eps[r] = ep[r];
	}
	assert_int_equal(hpucoll_comm_new(&c, 0, MAX_WS, eps[0]), HPUCOLL_OK);
	assert_int_equal(hpucoll_comm_connect(c, eps), HPUCOLL_OK);
	hpucoll_comm_set_timeout(c, 1000);
	t0 = now_ms();
	assert_int_equal(hpucoll_all_reduce(c, buf, 8, HPUCOLL_F32,
					    HPUCOLL_SUM),
			 HPUCOLL_ETIMEDOUT);
	dt = now_ms() - t0;
	assert_true(dt >= 990 && dt < 10000);
	assert_non_null(strstr(hpucoll_comm_errmsg(c), "rank 3"));
	assert_non_null(strstr(hpucoll_comm_errmsg(c), "1000 ms"));
	/* The communicator stays failed, at once. */
	t0 = now_ms();
	assert_int_equal(hpucoll_barrier(c), HPUCOLL_ETIMEDOUT);
	assert_true(now_ms() - t0 < 500);
	hpucoll_comm_destroy(&c);
}

static void test_timeout_env(void **state)
{
	hpucoll_comm *c = NULL;
	char ep[2][128];
	const char *eps[2] = {ep[0], ep[1]};

	(void)state;
	world_id++;
	ipc_path(ep[0], sizeof(ep[0]), "e", 0);
	ipc_path(ep[1], sizeof(ep[1]), "e", 1);
	setenv("HPUCOLL_TIMEOUT_MS", "soon", 1);
	assert_int_equal(hpucoll_comm_new(&c, 0, 2, eps[0]), HPUCOLL_EENV);
	setenv("HPUCOLL_TIMEOUT_MS", "200", 1);
	assert_int_equal(hpucoll_comm_new(&c, 0, 2, eps[0]), HPUCOLL_OK);
	unsetenv("HPUCOLL_TIMEOUT_MS");
	assert_int_equal(hpucoll_comm_connect(c, eps), HPUCOLL_OK);
	assert_int_equal(hpucoll_barrier(c), HPUCOLL_ETIMEDOUT);
	assert_non_null(strstr(hpucoll_comm_errmsg(c), "rank 1 after 200 ms"));
	hpucoll_comm_destroy(&c);
}

/* A forged rank 1: `sink` takes what rank 0 sends, `push` sends to it. */
struct forger {
	void *ctx, *sink, *push;
	hpucoll_comm *c;
	char sink_ep[128];
};

static void forger_open(struct forger *f)
{
	char ep[2][128];
	const char *eps[2] = {ep[0], ep[1]};
	int zero = 0;

	world_id++;
	ipc_path(ep[0], sizeof(ep[0]), "g", 0);
	ipc_path(ep[1], sizeof(ep[1]), "g", 1);
	assert_int_equal(hpucoll_comm_new(&f->c, 0, 2, eps[0]), HPUCOLL_OK);
	assert_int_equal(hpucoll_comm_connect(f->c, eps), HPUCOLL_OK);
	hpucoll_comm_set_timeout(f->c, 5000);
	f->ctx = zmq_ctx_new();
	f->sink = zmq_socket(f->ctx, ZMQ_PULL);
	f->push = zmq_socket(f->ctx, ZMQ_PUSH);
	assert_non_null(f->sink);
	assert_non_null(f->push);
	zmq_setsockopt(f->sink, ZMQ_LINGER, &zero, sizeof(zero));
	zmq_setsockopt(f->push, ZMQ_LINGER, &zero, sizeof(zero));
	assert_int_equal(zmq_bind(f->sink, eps[1]), 0);
	snprintf(f->sink_ep, sizeof(f->sink_ep), "%s", eps[1]);
	assert_int_equal(zmq_connect(f->push, eps[0]), 0);
}

static void forger_close(struct forger *f)
{
	hpucoll_comm_destroy(&f->c);
	zmq_close(f->sink);
	zmq_close(f->push);
	zmq_ctx_term(f->ctx);
	unlink(f->sink_ep + strlen("ipc://"));
}

/* A header as rank 0's first barrier expects it from rank 1. */
static struct hpucoll__hdr barrier_hdr(void)
{
	struct hpucoll__hdr h = {
		.magic = HPUCOLL__MAGIC,
		.src = 1,
		.seq = 1,
		.kind = HPUCOLL__BARRIER,
	};
	return h;
}

static void send_hdr(void *sock, const struct hpucoll__hdr *h, int more)
{
	unsigned char b[HPUCOLL__HDR_SIZE];

	hpucoll__hdr_encode(b, h);
	assert_int_equal(zmq_send(sock, b, sizeof(b), more ? ZMQ_SNDMORE : 0),
			 (int)sizeof(b));
}

/* Sends what `forge` makes, runs a barrier on rank 0 and checks the
 * result code and that errmsg contains `needle`. */
static void expect(void (*forge)(void *sock), int code, const char *needle)
{
	struct forger f = {0};
	int rc;

	forger_open(&f);
	forge(f.push);
	rc = hpucoll_barrier(f.c);
	if (rc != code || strstr(hpucoll_comm_errmsg(f.c), needle) == NULL)
		fprintf(stderr, "got %d \"%s\", wanted %d \"...%s...\"\n", rc,
			hpucoll_comm_errmsg(f.c), code, needle);
	assert_int_equal(rc, code);
	assert_non_null(strstr(hpucoll_comm_errmsg(f.c), needle));
	forger_close(&f);
}

static void forge_good(void *sock)
{
	struct hpucoll__hdr h = barrier_hdr();

	send_hdr(sock, &h, 0);
}

static void forge_garbage(void *sock)
{
	assert_int_equal(zmq_send(sock, "garbage!", 8, 0), 8);
}

static void forge_magic(void *sock)
{
	struct hpucoll__hdr h = barrier_hdr();

	h.magic = 0xdeadbeef;
	send_hdr(sock, &h, 0);
}

static void forge_rank(void *sock)
{
	struct hpucoll__hdr h = barrier_hdr();

	h.src = 7;
	send_hdr(sock, &h, 0);
}

static void forge_self(void *sock)
{
	struct hpucoll__hdr h = barrier_hdr();

	h.src = 0;
	send_hdr(sock, &h, 0);
}

static void forge_seq(void *sock)
{
	struct hpucoll__hdr h = barrier_hdr();

	h.seq = 99;
	send_hdr(sock, &h, 0);
}

static void forge_kind(void *sock)
{
	struct hpucoll__hdr h = barrier_hdr();

	h.kind = HPUCOLL__BROADCAST;
	send_hdr(sock, &h, 0);
}

static void forge_no_payload(void *sock)
{
	struct hpucoll__hdr h = barrier_hdr();

	h.len = UINT64_MAX;
	send_hdr(sock, &h, 0);
}

static void forge_short_payload(void *sock)
{
	struct hpucoll__hdr h = barrier_hdr();

	h.len = 16;
	send_hdr(sock, &h, 1);
	assert_int_equal(zmq_send(sock, "12345678", 8, 0), 8);
}

static void forge_extra_frame(void *sock)
{
	struct hpucoll__hdr h = barrier_hdr();

	h.len = 4;
	send_hdr(sock, &h, 1);
	assert_int_equal(zmq_send(sock, "1234", 4, ZMQ_SNDMORE), 4);
	assert_int_equal(zmq_send(sock, "5678", 4, 0), 4);
}

static void test_forged(void **state)
{
	(void)state;
	expect(forge_good, HPUCOLL_OK, "");
	expect(forge_garbage, HPUCOLL_EPROTO, "waiting for rank 1");
	expect(forge_magic, HPUCOLL_EPROTO, "bad magic");
	expect(forge_rank, HPUCOLL_EPROTO, "rank 7");
	expect(forge_self, HPUCOLL_EPROTO, "rank 0");
	expect(forge_seq, HPUCOLL_EPROTO, "rank 1 sent collective #99");
	expect(forge_kind, HPUCOLL_EPROTO, "(broadcast");
	expect(forge_no_payload, HPUCOLL_EPROTO, "rank 1");
	expect(forge_short_payload, HPUCOLL_EPROTO, "rank 1");
	expect(forge_extra_frame, HPUCOLL_EPROTO, "rank 1");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_strerror),
		cmocka_unit_test(test_bad_args),
		cmocka_unit_test(test_timeout),
		cmocka_unit_test(test_timeout_env),
		cmocka_unit_test(test_forged),
		cmocka_unit_test(test_world_1),
		cmocka_unit_test(test_world_2),
		cmocka_unit_test(test_world_3),
		cmocka_unit_test(test_world_4),
		cmocka_unit_test(test_world_3_tcp),
		cmocka_unit_test(test_world_2_big),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
