/* Tests of libhpucoll in this process: the reduction kernels checked
 * directly against a rounding reference for f16 and bf16 (f32 on unaligned
 * buffers); the API's error paths (bad arguments, strerror, the timeout
 * and its environment variable); and a forged peer made of plain ZeroMQ
 * sockets sending malformed or unexpected messages. (test_coll.c runs the
 * collectives in forked worlds.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "hpu/coll.h"
#include "collectives/comm_internal.h" /* the wire format and kernels, to test them */
#include "tests/unit/coll_testlib.h"
#include "tests/unit/coll_world.h"

/* ---- the kernels ---- */

static uint16_t rand16(unsigned *seed)
{
	return (uint16_t)((unsigned)rand_r(seed) ^ (unsigned)rand_r(seed) << 8);
}

/* f16 and bf16 sums, max and min round to nearest-even once, from the
 * exact value: compared with an independent reference on random bits,
 * subnormals and overflow included; f32 on unaligned buffers. */
static void test_kernels(void **state)
{
	enum { N = 20000 };
	static const int fmt[2][3] = {{HPUCOLL_F16, 10, 5},
				      {HPUCOLL_BF16, 7, 8}};
	uint16_t a[N], b[N], d[N];
	unsigned seed = 7;
	unsigned char *fa = malloc(4 * N + 1), *fb = malloc(4 * N + 1);

	(void)state;
	for (int f = 0; f < 2; f++) {
		int mb = fmt[f][1], eb = fmt[f][2];
		uint32_t expmask = ((1u << eb) - 1) << mb;

		for (int op = 0; op < HPUCOLL_NUM_OPS; op++) {
			for (int i = 0; i < N; i++) {
				do {
					a[i] = rand16(&seed);
					b[i] = rand16(&seed);
				} while ((a[i] & expmask) == expmask ||
					 (b[i] & expmask) == expmask);
			}
			hpucoll__reduce(fmt[f][0], op, d, a, b, N);
			for (int i = 0; i < N; i++) {
				double x = ct_small_float(a[i], mb, eb);
				double y = ct_small_float(b[i], mb, eb);
				double r = op == HPUCOLL_MAX ? (x > y ? x : y)
					   : op == HPUCOLL_MIN ? (x < y ? x : y)
							       : x + y;
				uint32_t want = ct_round_small_float(r, mb, eb);

				/* Only the sign of a zero may differ. */
				if (r == 0 &&
				    ct_small_float(d[i], mb, eb) == 0)
					continue;
				if (d[i] != want)
					fprintf(stderr, "%s %s %#x %#x: want "
							"%#x got %#x\n",
						ct_dtype_names[fmt[f][0]],
						ct_op_names[op], a[i], b[i],
						want, d[i]);
				assert_int_equal(d[i], want);
			}
		}
		/* AVG's division rounds once, too. */
		for (int i = 0; i < N; i++)
			a[i] = b[i] = (uint16_t)ct_round_small_float(
				(int)(rand16(&seed) % 1000) - 500, mb, eb);
		hpucoll__divide(fmt[f][0], a, N, 3);
		for (int i = 0; i < N; i++)
			assert_int_equal(
				a[i], ct_round_small_float(
					      (float)ct_small_float(b[i], mb,
								     eb) /
						      3.0f,
					      mb, eb));
	}
	/* f32 from unaligned addresses, in place and not. */
	for (int i = 0; i < N; i++) {
		float x = (float)i, y = (float)(2 * i);

		memcpy(fa + 1 + 4 * i, &x, 4);
		memcpy(fb + 4 * i, &y, 4);
	}
	hpucoll__reduce(HPUCOLL_F32, HPUCOLL_SUM, fa + 1, fa + 1, fb, N);
	for (int i = 0; i < N; i++) {
		float v;

		memcpy(&v, fa + 1 + 4 * i, 4);
		assert_true(v == (float)(3 * i));
	}
	free(fa);
	free(fb);
}

/* hpucoll__reduce2 (the ring's final sums into the output and a
 * shared-memory slot at once) writes into both exactly the bytes
 * hpucoll__reduce writes: every dtype and op, on random bits (NaNs
 * included), out of place and in place (dst == a), from addresses one
 * byte off alignment. */
static void test_kernels_two_outputs(void **state)
{
	enum { N = 4099 };
	unsigned seed = 11;
	unsigned char *a = malloc(8 * N + 1), *b = malloc(8 * N + 1);
	unsigned char *want = malloc(8 * N + 1), *d = malloc(8 * N + 1);
	unsigned char *d2 = malloc(8 * N + 1);

	(void)state;
	assert_true(a && b && want && d && d2);
	for (int t = 0; t < HPUCOLL_NUM_DTYPES; t++) {
		size_t bytes = N * hpucoll_dtype_size((hpucoll_dtype)t);

		for (int op = 0; op < HPUCOLL_NUM_OPS; op++) {
			for (int inplace = 0; inplace < 2; inplace++) {
				for (size_t i = 0; i < bytes; i++) {
					a[1 + i] = (unsigned char)rand_r(&seed);
					b[i] = (unsigned char)rand_r(&seed);
				}
				hpucoll__reduce(t, op, want + 1, a + 1, b, N);
				memset(d2, 0xa5, bytes + 1);
				if (inplace) {
					hpucoll__reduce2(t, op, a + 1, d2 + 1,
							 a + 1, b, N);
					memcpy(d + 1, a + 1, bytes);
				} else {
					hpucoll__reduce2(t, op, d + 1, d2 + 1,
							 a + 1, b, N);
				}
				if (memcmp(d + 1, want + 1, bytes) != 0 ||
				    memcmp(d2 + 1, want + 1, bytes) != 0)
					fprintf(stderr, "%s %s%s: two outputs "
							"differ from reduce\n",
						ct_dtype_names[t],
						ct_op_names[op],
						inplace ? " in place" : "");
				assert_memory_equal(d + 1, want + 1, bytes);
				assert_memory_equal(d2 + 1, want + 1, bytes);
				assert_int_equal(d2[0], 0xa5);
			}
		}
	}
	free(a);
	free(b);
	free(want);
	free(d);
	free(d2);
}

/* ---- API and error paths, in this process ---- */

static void test_strerror(void **state)
{
	hpucoll_transport t;

	(void)state;
	for (int e = HPUCOLL_OK; e <= HPUCOLL_EPEER; e++) {
		const char *s = hpucoll_strerror(e);

		assert_non_null(s);
		assert_true(strlen(s) > 3);
		assert_string_not_equal(s, hpucoll_strerror(-1));
	}
	assert_string_equal(hpucoll_strerror(999), hpucoll_strerror(-1));
	assert_int_equal(hpucoll_transport_parse("shm", &t), 0);
	assert_int_equal(t, HPUCOLL_TRANSPORT_SHM);
	assert_int_equal(hpucoll_transport_parse("ipc", &t), 0);
	assert_int_equal(t, HPUCOLL_TRANSPORT_IPC);
	assert_int_equal(hpucoll_transport_parse("udp", &t), -1);
	assert_string_equal(hpucoll_transport_name(HPUCOLL_TRANSPORT_TCP),
			    "tcp");
	assert_int_equal(hpucoll_dtype_size(HPUCOLL_BF16), 2);
	assert_int_equal(hpucoll_dtype_size(HPUCOLL_I64), 8);
	assert_int_equal(hpucoll_dtype_size(HPUCOLL_NUM_DTYPES), 0);
}

static void test_bad_args(void **state)
{
	hpucoll_comm *c = NULL;
	hpucoll_req *req = (hpucoll_req *)&req;
	hpucoll_stats st;
	const char *eps[2];
	int nodes[2] = {0, 0};
	char ep[128];
	float x[4] = {1.0f};

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
	setenv("HPUCOLL_ALGO", "fastest", 1);
	assert_int_equal(hpucoll_comm_new(&c, 0, 1, "tcp://127.0.0.1:*"),
			 HPUCOLL_EENV);
	unsetenv("HPUCOLL_ALGO");
	/* a bad variable is named, with what it may be; a timeout of 0 or
	 * less (a wait without end: -1 hung on a stopped peer) is refused */
	static const struct {
		const char *name, *value, *says;
	} bad[] = {
		{"HPUCOLL_ALGO", "fastest", "HPUCOLL_ALGO='fastest' is not one of auto, ring, rd, hier"},
		{"HPUCOLL_TIMEOUT_MS", "-1",
		 "HPUCOLL_TIMEOUT_MS='-1' is not a whole number of milliseconds from 1 to "},
		{"HPUCOLL_TIMEOUT_MS", "0", "HPUCOLL_TIMEOUT_MS='0' is not a whole number"},
		{"HPUCOLL_TIMEOUT_MS", "abc", "HPUCOLL_TIMEOUT_MS='abc' is not a whole number"},
		{"HPUCOLL_STALL_WARN_MS", "-5", "HPUCOLL_STALL_WARN_MS='-5' is not a whole number of "
						 "milliseconds from 0 to "},
		{"HPUCOLL_IO_THREADS", "0", "HPUCOLL_IO_THREADS='0' is not a whole number of threads "
					    "from 1 to 64"},
		{"HPUCOLL_SMALL_BYTES", "big", "HPUCOLL_SMALL_BYTES='big' is not a number of bytes"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char why[256] = "";
		setenv(bad[i].name, bad[i].value, 1);
		assert_int_equal(hpucoll__comm_new(&c, 0, 1, "tcp://127.0.0.1:*",
						   HPUCOLL_SECURITY_NONE, NULL, 0, why, sizeof why),
				 HPUCOLL_EENV);
		unsetenv(bad[i].name);
		assert_null(c);
		printf("  %s\n", why);
		if (!strstr(why, bad[i].says))
			fail_msg("\"%s\" does not say \"%s\"", why, bad[i].says);
	}

	assert_int_equal(hpucoll_comm_new(&c, 1, 2, "tcp://127.0.0.1:*"),
			 HPUCOLL_OK);
	assert_int_equal(hpucoll_comm_rank(c), 1);
	assert_int_equal(hpucoll_comm_size(c), 2);
	assert_string_equal(hpucoll_comm_errmsg(c), "");
	/* no sentence yet (or no communicator): the code's own words */
	assert_string_equal(hpucoll_comm_why(c, HPUCOLL_EPEER), hpucoll_strerror(HPUCOLL_EPEER));
	assert_string_equal(hpucoll_comm_why(NULL, HPUCOLL_EINVAL),
			    hpucoll_strerror(HPUCOLL_EINVAL));
	assert_null(strstr(hpucoll_comm_endpoint(c), "*"));
	assert_non_null(strstr(hpucoll_comm_endpoint(c), "tcp://127.0.0.1:"));
	assert_int_equal(hpucoll_barrier(c), HPUCOLL_EINVAL);
	assert_non_null(strstr(hpucoll_comm_errmsg(c), "not connected"));
	char sentence[HPUCOLL__ERRMSG_MAX];
	snprintf(sentence, sizeof sentence, "%s", hpucoll_comm_errmsg(c));
	assert_string_equal(hpucoll_comm_why(c, HPUCOLL_EINVAL), sentence);
	assert_int_equal(hpucoll_ibarrier(c, &req), HPUCOLL_EINVAL);
	assert_null(req);
	assert_int_equal(hpucoll_comm_set_topology(c, nodes, "bad/name",
						   HPUCOLL_TRANSPORT_AUTO),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_comm_set_topology(c, nodes, "j",
						   (hpucoll_transport)9),
			 HPUCOLL_EINVAL);

	cw_ipc_path(ep, sizeof(ep), "nobody", 0);
	eps[0] = ep;
	eps[1] = NULL;
	assert_int_equal(hpucoll_comm_connect(c, eps), HPUCOLL_EINVAL);
	eps[1] = hpucoll_comm_endpoint(c);
	assert_int_equal(hpucoll_comm_connect(c, eps), HPUCOLL_OK);
	assert_int_equal(hpucoll_comm_connect(c, eps), HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_comm_set_topology(c, nodes, "j",
						   HPUCOLL_TRANSPORT_TCP),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_all_reduce(c, x, x, 1, HPUCOLL_NUM_DTYPES,
					    HPUCOLL_SUM),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_all_reduce(c, x, x, 1, HPUCOLL_F32,
					    (hpucoll_op)9),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_all_reduce(c, NULL, x, 1, HPUCOLL_F32,
					    HPUCOLL_SUM),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_all_reduce(c, x, NULL, 1, HPUCOLL_F32,
					    HPUCOLL_SUM),
			 HPUCOLL_EINVAL);
	assert_non_null(strstr(hpucoll_comm_errmsg(c), "receive buffer"));
	assert_int_equal(hpucoll_all_reduce(c, x, x + 1, 2, HPUCOLL_F32,
					    HPUCOLL_SUM),
			 HPUCOLL_EINVAL);
	assert_non_null(strstr(hpucoll_comm_errmsg(c), "overlap"));
	/* Rank 1's block of a reduce-scatter in place is sendbuf + 1. */
	assert_int_equal(hpucoll_reduce_scatter(c, x, x, 1, HPUCOLL_F32,
						HPUCOLL_SUM),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_all_gather(c, x + 1, x, 2, HPUCOLL_F32),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_broadcast(c, x, x, 1, HPUCOLL_F32, 2),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_broadcast(c, x, x, 1, HPUCOLL_F32, -1),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_reduce(c, x, NULL, 1, HPUCOLL_F32,
					HPUCOLL_SUM, 1),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_all_reduce(c, x, x, SIZE_MAX / 2,
					    HPUCOLL_F32, HPUCOLL_SUM),
			 HPUCOLL_EINVAL);
	req = (hpucoll_req *)&req;
	assert_int_equal(hpucoll_iall_reduce(c, x, x, 1, HPUCOLL_F16,
					     HPUCOLL_NUM_OPS, &req),
			 HPUCOLL_EINVAL);
	assert_null(req);
	assert_int_equal(hpucoll_wait(&req), HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_wait(NULL), HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_test(NULL, (int *)x), HPUCOLL_EINVAL);
	/* Nothing was sent, so zero-sized collectives still work. */
	assert_int_equal(hpucoll_all_reduce(c, NULL, NULL, 0, HPUCOLL_F32,
					    HPUCOLL_AVG),
			 HPUCOLL_OK);
	assert_int_equal(hpucoll_broadcast(c, NULL, NULL, 0, HPUCOLL_U8, 0),
			 HPUCOLL_OK);
	assert_int_equal(hpucoll_ireduce(c, NULL, NULL, 0, HPUCOLL_I64,
					 HPUCOLL_MAX, 0, &req),
			 HPUCOLL_OK);
	assert_int_equal(hpucoll_wait(&req), HPUCOLL_OK);
	assert_null(req);
	/* The three that ran count; the refused ones do not; no bytes. */
	hpucoll_comm_stats(c, &st);
	assert_int_equal(st.collectives, 3);
	assert_int_equal(st.bytes_sent + st.bytes_received + st.shm_bytes_sent,
			 0);
	hpucoll_comm_stats(NULL, &st);
	assert_int_equal(st.collectives, 0);
	hpucoll_comm_stats(c, NULL);
	hpucoll_comm_destroy(&c);
	assert_null(c);
	hpucoll_comm_destroy(&c);
	hpucoll_comm_destroy(NULL);
	/* the getters of a destroyed (NULL) comm answer, as stats and why do
	 * (errmsg and culprit crashed) */
	assert_int_equal(hpucoll_comm_rank(NULL), -1);
	assert_int_equal(hpucoll_comm_size(NULL), 0);
	assert_string_equal(hpucoll_comm_errmsg(NULL), "");
	int code = -5;
	assert_int_equal(hpucoll_comm_culprit(NULL, &code), -1);
	assert_int_equal(code, HPUCOLL_OK);
}

/* Rank 0 of 4 whose peers never show up. */
static void test_timeout(void **state)
{
	hpucoll_comm *c = NULL;
	char ep[4][128];
	const char *eps[4];
	float buf[8] = {0};
	int64_t t0, dt;

	(void)state;
	cw_world_id++;
	for (int r = 0; r < 4; r++) {
		cw_ipc_path(ep[r], sizeof(ep[r]), "t", r);
		eps[r] = ep[r];
	}
	assert_int_equal(hpucoll_comm_new(&c, 0, 4, eps[0]), HPUCOLL_OK);
	assert_int_equal(hpucoll_comm_connect(c, eps), HPUCOLL_OK);
	hpucoll_comm_set_timeout(c, 1000);
	/* 0 and less change nothing (0 failed every wait at once, -1 never
	 * ended one); a NULL comm neither (it crashed) */
	hpucoll_comm_set_timeout(c, 0);
	hpucoll_comm_set_timeout(c, -1);
	hpucoll_comm_set_timeout(NULL, 5);
	assert_string_equal(hpucoll_comm_endpoint(NULL), "");
	t0 = ct_now_ms();
	assert_int_equal(hpucoll_all_reduce(c, buf, buf, 8, HPUCOLL_F32,
					    HPUCOLL_SUM),
			 HPUCOLL_ETIMEDOUT);
	dt = ct_now_ms() - t0;
	assert_true(dt >= 990); /* not before its timeout */
	assert_non_null(strstr(hpucoll_comm_errmsg(c), "rank "));
	assert_non_null(strstr(hpucoll_comm_errmsg(c), "1000 ms"));
	/* ... and blames the silent rank it waited for (no rank answered
	 * the probe before the timeout), by number too. */
	int code = HPUCOLL_OK, culprit = hpucoll_comm_culprit(c, &code);
	assert_true(culprit >= 1 && culprit <= 3);
	assert_int_equal(code, HPUCOLL_ETIMEDOUT);
	assert_non_null(strstr(hpucoll_comm_errmsg(c), "no data from rank "));
	/* The communicator stays failed, at once: with a timeout of 60 s
	 * now, the barrier returns the first failure without waiting (one
	 * that waited would say 60000 ms, a minute later) */
	hpucoll_comm_set_timeout(c, 60000);
	assert_int_equal(hpucoll_barrier(c), HPUCOLL_ETIMEDOUT);
	assert_non_null(strstr(hpucoll_comm_errmsg(c), "1000 ms"));
	/* a success is said as one (it gave the earlier failure's sentence) */
	assert_string_equal(hpucoll_comm_why(c, HPUCOLL_OK), hpucoll_strerror(HPUCOLL_OK));
	hpucoll_comm_destroy(&c);
}

/* hpucoll_comm_destroy() in a child of fork(): it returns, touching
 * nothing of the parent's (it spun for ever in zmq_ctx_term), and the
 * parent's communicator still works. */
static void test_destroy_in_forked_child(void **state)
{
	hpucoll_comm *c = NULL;
	const char *eps[1];
	char ep[128];
	float x[3] = {1, 2, 3};

	(void)state;
	cw_world_id++;
	cw_ipc_path(ep, sizeof(ep), "f", 0);
	eps[0] = ep;
	assert_int_equal(hpucoll_comm_new(&c, 0, 1, eps[0]), HPUCOLL_OK);
	assert_int_equal(hpucoll_comm_connect(c, eps), HPUCOLL_OK);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		hpucoll_comm_destroy(&c);
		_exit(c == NULL ? 0 : 2);
	}
	int status = -1, waited = 0;
	for (int i = 0; i < 200 && !waited; i++) {
		waited = waitpid(pid, &status, WNOHANG) == pid;
		if (!waited)
			usleep(50000);
	}
	if (!waited) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
	}
	assert_true(waited);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_int_equal(hpucoll_all_reduce(c, x, x, 3, HPUCOLL_F32, HPUCOLL_SUM), HPUCOLL_OK);
	assert_true(x[2] == 3);
	hpucoll_comm_destroy(&c);
}

static void test_timeout_env(void **state)
{
	hpucoll_comm *c = NULL;
	char ep[2][128];
	const char *eps[2] = {ep[0], ep[1]};

	(void)state;
	cw_world_id++;
	cw_ipc_path(ep[0], sizeof(ep[0]), "e", 0);
	cw_ipc_path(ep[1], sizeof(ep[1]), "e", 1);
	setenv("HPUCOLL_TIMEOUT_MS", "soon", 1);
	assert_int_equal(hpucoll_comm_new(&c, 0, 2, eps[0]), HPUCOLL_EENV);
	setenv("HPUCOLL_TIMEOUT_MS", "200", 1);
	assert_int_equal(hpucoll_comm_new(&c, 0, 2, eps[0]), HPUCOLL_OK);
	unsetenv("HPUCOLL_TIMEOUT_MS");
	assert_int_equal(hpucoll_comm_connect(c, eps), HPUCOLL_OK);
	assert_int_equal(hpucoll_barrier(c), HPUCOLL_ETIMEDOUT);
	assert_non_null(strstr(hpucoll_comm_errmsg(c), "no data from rank 1 after 200 ms (is it alive?)"));
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

	cw_world_id++;
	cw_ipc_path(ep[0], sizeof(ep[0]), "g", 0);
	cw_ipc_path(ep[1], sizeof(ep[1]), "g", 1);
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

/* Another rank's ABORT ends the wait at once with its sentence. */
static void forge_abort(void *sock)
{
	static const char why[] = "all_reduce: rank 3 died\x01.";
	struct hpucoll__hdr h = barrier_hdr();

	h.kind = HPUCOLL__ABORT;
	h.arg = HPUCOLL_EPEER;
	h.seq = 5;
	h.len = sizeof(why) - 1;
	send_hdr(sock, &h, 1);
	assert_int_equal(zmq_send(sock, why, h.len, 0), (int)h.len);
}

/* An ABORT whose sender blames this rank (off: 0 + 1): no culprit here. */
static void forge_abort_us(void *sock)
{
	static const char why[] = "all_reduce: rank 0 stopped answering.";
	struct hpucoll__hdr h = barrier_hdr();

	h.kind = HPUCOLL__ABORT;
	h.arg = HPUCOLL_ETIMEDOUT;
	h.off = 1;
	h.len = sizeof(why) - 1;
	send_hdr(sock, &h, 1);
	assert_int_equal(zmq_send(sock, why, h.len, 0), (int)h.len);
}

/* expect() and the culprit hpucoll_comm_culprit then gives. */
static void expect_culprit(void (*forge)(void *sock), int code, int culprit, int ccode)
{
	struct forger f = {0};
	int got;

	forger_open(&f);
	forge(f.push);
	assert_int_equal(hpucoll_barrier(f.c), code);
	assert_int_equal(hpucoll_comm_culprit(f.c, &got), culprit);
	assert_int_equal(got, ccode);
	forger_close(&f);
}

static void forge_big_abort(void *sock)
{
	static char why[HPUCOLL__ERRMSG_MAX + 10];
	struct hpucoll__hdr h = barrier_hdr();

	memset(why, 'x', sizeof(why));
	h.kind = HPUCOLL__ABORT;
	h.len = sizeof(why);
	send_hdr(sock, &h, 1);
	assert_int_equal(zmq_send(sock, why, h.len, 0), (int)h.len);
}

static void test_forged(void **state)
{
	(void)state;
	expect(forge_good, HPUCOLL_OK, "");
	expect(forge_garbage, HPUCOLL_EPROTO, "waiting for rank 1");
	expect(forge_magic, HPUCOLL_EPROTO, "bad magic");
	expect(forge_rank, HPUCOLL_EPROTO, "rank 7");
	expect(forge_self, HPUCOLL_EPROTO, "rank 0");
	expect(forge_seq, HPUCOLL_EPROTO, "rank 1 sent data of collective #99 (barrier) where #1 (barrier) was expected");
	expect(forge_kind, HPUCOLL_EPROTO, "rank 1 called broadcast of f32 where this rank (0) called barrier");
	expect(forge_no_payload, HPUCOLL_EPROTO, "rank 1");
	expect(forge_short_payload, HPUCOLL_EPROTO, "rank 1");
	expect(forge_extra_frame, HPUCOLL_EPROTO, "rank 1");
	expect(forge_abort, HPUCOLL_EPEER,
	       "barrier: rank 1 gave up: all_reduce: rank 3 died?.");
	expect(forge_big_abort, HPUCOLL_EPROTO, "rank 1");
	/* the sender blamed no one (off 0): it failed first */
	expect_culprit(forge_abort, HPUCOLL_EPEER, 1, HPUCOLL_EABORTED);
	expect_culprit(forge_abort_us, HPUCOLL_ETIMEDOUT, -1, HPUCOLL_OK);
	expect_culprit(forge_good, HPUCOLL_OK, -1, HPUCOLL_OK);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_strerror),
		cmocka_unit_test(test_kernels),
		cmocka_unit_test(test_kernels_two_outputs),
		cmocka_unit_test(test_bad_args),
		cmocka_unit_test(test_timeout),
		cmocka_unit_test(test_destroy_in_forked_child),
		cmocka_unit_test(test_timeout_env),
		cmocka_unit_test(test_forged),
	};

	/* HPUCOLL_TEST=test_forged (a glob) runs only the tests it names. */
	if (getenv("HPUCOLL_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPUCOLL_TEST"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
