/* Tests of libhpucoll with real processes over real transports: the parent
 * forks one child per rank; each child binds, publishes its endpoint in
 * shared memory, connects (over shared memory when the world says so) and
 * runs the collectives, checking every element against a reference
 * computed here; it exits 0 on success or prints the first mismatch and
 * exits 1. Dead and stalled peers run in forked worlds too.
 * (test_coll_api.c checks the kernels, the API's error paths and a forged
 * peer in this process; test_coll_traffic.c the traffic counters.)
 *
 * This is the module test; test_coll_matrix.c runs the bigger matrix (more
 * ranks, larger counts). */
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
#include <unistd.h>
#include <zmq.h>

#include "hpu/coll.h"
#include "collectives/comm_internal.h" /* the wire format and kernels, to test them */
#include "tests/unit/coll_testlib.h"
#include "tests/unit/coll_world.h"

#define BIG_COUNT (1000000u + 3)

/* ---- element values ---- */

/* Small integers in [-20, 20] (u8: [0, 40]): every sum over 5 ranks is
 * exact in every dtype, bf16 included. */
static int ival(int rank, size_t i)
{
	uint32_t h = (uint32_t)i * 2654435761u + (uint32_t)rank * 40503u +
		     12345u;

	return (int)((h >> 20) % 41) - 20;
}

/* The reference of one count, as integers: inputs and reductions over the
 * ranks of ival(r, i) for the n = ws * count elements a reduce-scatter
 * takes. */
struct ref {
	int ws, me;
	size_t count, n;
	int *mine;   /* ival(me, i) */
	int *gather; /* ival(i / count, i % count): what all_gather returns */
	int *root;   /* ival(root, i), i < count, for the current root */
	int *sum, *max, *min;
};

static void ref_free(struct ref *rf)
{
	free(rf->mine);
	free(rf->gather);
	free(rf->root);
	free(rf->sum);
	free(rf->max);
	free(rf->min);
}

static int ref_make(struct ref *rf, int ws, int me, size_t count)
{
	size_t n = count * (size_t)ws + 1;

	rf->ws = ws;
	rf->me = me;
	rf->count = count;
	rf->n = count * (size_t)ws;
	rf->mine = malloc(n * sizeof(int));
	rf->gather = malloc(n * sizeof(int));
	rf->root = malloc((count + 1) * sizeof(int));
	rf->sum = malloc(n * sizeof(int));
	rf->max = malloc(n * sizeof(int));
	rf->min = malloc(n * sizeof(int));
	if (!rf->mine || !rf->gather || !rf->root || !rf->sum || !rf->max ||
	    !rf->min) {
		ref_free(rf);
		return -1;
	}
	for (size_t i = 0; i < rf->n; i++) {
		int sum = 0, hi = -100, lo = 100;

		for (int r = 0; r < ws; r++) {
			int v = ival(r, i);

			sum += v;
			hi = v > hi ? v : hi;
			lo = v < lo ? v : lo;
		}
		rf->sum[i] = sum;
		rf->max[i] = hi;
		rf->min[i] = lo;
		rf->mine[i] = ival(me, i);
		rf->gather[i] = ival((int)(i / count), i % count);
	}
	return 0;
}

static void ref_root(struct ref *rf, int root)
{
	for (size_t i = 0; i < rf->count; i++)
		rf->root[i] = ival(root, i);
}

/* One dtype's elements for the small integers v in [-128, 127]: inputs,
 * max and min (`val`), sums (`sum`) and AVG, which the library computes
 * by one division of the exact sum, in f32 for f16 and bf16. */
struct tabs {
	hpucoll_dtype t;
	size_t es;
	unsigned char val[256 * 8], sum[256 * 8], avg[256 * 8];
};

static void tabs_make(struct tabs *tb, hpucoll_dtype t, int ws)
{
	int sh = t == HPUCOLL_U8 ? 20 : 0;

	tb->t = t;
	tb->es = hpucoll_dtype_size(t);
	for (int v = -128; v < 128; v++) {
		int s = v + sh * ws;
		unsigned char *a = tb->avg + (size_t)(v + 128) * tb->es;
		float f = (float)s / (float)ws;
		double d = (double)s / ws;
		uint16_t h;

		ct_put(t, tb->val, (size_t)(v + 128), v + sh);
		ct_put(t, tb->sum, (size_t)(v + 128), s);
		switch (t) {
		case HPUCOLL_F32:
			memcpy(a, &f, 4);
			break;
		case HPUCOLL_F64:
			memcpy(a, &d, 8);
			break;
		case HPUCOLL_F16:
			h = (uint16_t)ct_round_small_float(f, 10, 5);
			memcpy(a, &h, 2);
			break;
		case HPUCOLL_BF16:
			h = (uint16_t)ct_round_small_float(f, 7, 8);
			memcpy(a, &h, 2);
			break;
		default:
			ct_put(t, tb->avg, (size_t)(v + 128), s / ws);
			break;
		}
	}
}

/* out[i] = the element tab holds for vals[i]. */
static void expand(const struct tabs *tb, const unsigned char *tab,
		   const int *vals, size_t n, void *out)
{
	unsigned char *o = out;

	switch (tb->es) {
	case 1:
		for (size_t i = 0; i < n; i++)
			o[i] = tab[vals[i] + 128];
		break;
	case 2:
		for (size_t i = 0; i < n; i++)
			memcpy(o + 2 * i, tab + 2 * (vals[i] + 128), 2);
		break;
	case 4:
		for (size_t i = 0; i < n; i++)
			memcpy(o + 4 * i, tab + 4 * (vals[i] + 128), 4);
		break;
	default:
		for (size_t i = 0; i < n; i++)
			memcpy(o + 8 * i, tab + 8 * (vals[i] + 128), 8);
		break;
	}
}

/* Compares n elements of `got` with `want` byte for byte; reports the
 * first difference and how many differ. */
static int verify(int me, int ws, const char *what, hpucoll_dtype t,
		  hpucoll_op op, size_t count, int inplace, const void *got,
		  const void *want, size_t n)
{
	size_t es = hpucoll_dtype_size(t), bad = 0, first = 0;
	const unsigned char *g = got, *w = want;

	if (memcmp(got, want, n * es) == 0)
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (memcmp(g + i * es, w + i * es, es) != 0 && bad++ == 0)
			first = i;
	}
	fprintf(stderr,
		"rank %d of %d: %s %s %s count %zu %s: %zu of %zu wrong, first "
		"at %zu: expected %g got %g\n",
		me, ws, what, ct_dtype_names[t], ct_op_names[op], count,
		inplace ? "in place" : "out of place", bad, n, first,
		ct_get(t, want, first), ct_get(t, got, first));
	return 1;
}

/* The expected result of op over the ranks, for elements [from, from+n). */
static void expect_op(const struct tabs *tb, const struct ref *rf,
		      hpucoll_op op, size_t from, size_t n, void *out)
{
	switch (op) {
	case HPUCOLL_SUM:
		expand(tb, tb->sum, rf->sum + from, n, out);
		break;
	case HPUCOLL_AVG:
		expand(tb, tb->avg, rf->sum + from, n, out);
		break;
	case HPUCOLL_MAX:
		expand(tb, tb->val, rf->max + from, n, out);
		break;
	default:
		expand(tb, tb->val, rf->min + from, n, out);
		break;
	}
}

/* Checks n results of op against the reference from element `from`. */
static int check_op(const struct tabs *tb, const struct ref *rf,
		    const char *what, hpucoll_op op, size_t from, size_t n,
		    const void *got, void *want)
{
	expect_op(tb, rf, op, from, n, want);
	return verify(rf->me, rf->ws, what, tb->t, op, n, 0, got, want, n);
}

/* ---- one collective, checked ---- */

enum coll { C_ALL_REDUCE, C_REDUCE_SCATTER, C_ALL_GATHER, C_BROADCAST,
	    C_REDUCE, C_NUM };

static const char *const coll_names[] = {"all_reduce", "reduce_scatter",
					 "all_gather", "broadcast", "reduce"};

struct bufs {
	unsigned char *send, *recv, *want;
};

/* Calls collective k with buffers placed in place or not. */
static int call(hpucoll_comm *c, enum coll k, unsigned char *send,
		unsigned char *recv, size_t count, hpucoll_dtype t,
		hpucoll_op op, int root, int inplace)
{
	int me = hpucoll_comm_rank(c);
	size_t bytes = count * hpucoll_dtype_size(t);

	switch (k) {
	case C_ALL_REDUCE:
		return hpucoll_all_reduce(c, send, inplace ? send : recv,
					  count, t, op);
	case C_REDUCE_SCATTER:
		return hpucoll_reduce_scatter(
			c, send, inplace ? send + me * bytes : recv, count, t,
			op);
	case C_ALL_GATHER:
		return hpucoll_all_gather(c, inplace ? recv + me * bytes : send,
					  recv, count, t);
	case C_BROADCAST:
		if (inplace)
			return hpucoll_broadcast(c, me == root ? send : NULL,
						 send, count, t, root);
		return hpucoll_broadcast(c, me == root ? send : NULL, recv,
					 count, t, root);
	default:
		if (inplace)
			return hpucoll_reduce(c, send, send, count, t, op,
					      root);
		return hpucoll_reduce(c, send, me == root ? recv : NULL, count,
				      t, op, root);
	}
}

static int run_one(hpucoll_comm *c, struct bufs *b, struct ref *rf,
		   const struct tabs *tb, enum coll k, hpucoll_op op,
		   int inplace, int root)
{
	int ws = rf->ws, me = rf->me, rc;
	size_t count = rf->count, es = tb->es, bytes = count * es;
	size_t sn = k == C_REDUCE_SCATTER ? rf->n : count;
	size_t rn = k == C_ALL_GATHER ? rf->n : count;
	hpucoll_dtype t = tb->t;
	const unsigned char *res = inplace ? b->send : b->recv;

	expand(tb, tb->val, rf->mine, sn, b->send);
	memset(b->recv, 0xee, rn * es);
	if (k == C_ALL_GATHER && inplace)
		memcpy(b->recv + me * bytes, b->send, bytes);
	if (k == C_BROADCAST && inplace && me != root)
		memset(b->send, 0xee, bytes);
	rc = call(c, k, b->send, b->recv, count, t, op, root, inplace);
	if (rc != HPUCOLL_OK)
		return cw_fail_rc(c, coll_names[k], rc);
	/* Out of place, the send buffer is read only. */
	if (!inplace && (k != C_BROADCAST || me == root)) {
		expand(tb, tb->val, rf->mine, sn, b->want);
		if (memcmp(b->want, b->send, sn * es) != 0) {
			fprintf(stderr, "rank %d: %s %s changed its send "
					"buffer\n",
				me, coll_names[k], ct_dtype_names[t]);
			return 1;
		}
	}
	switch (k) {
	case C_ALL_REDUCE:
		expect_op(tb, rf, op, 0, count, b->want);
		break;
	case C_REDUCE_SCATTER:
		if (inplace)
			res = b->send + me * bytes;
		expect_op(tb, rf, op, me * count, count, b->want);
		break;
	case C_ALL_GATHER:
		res = b->recv;
		expand(tb, tb->val, rf->gather, rn, b->want);
		break;
	case C_BROADCAST:
		ref_root(rf, root);
		expand(tb, tb->val, rf->root, count, b->want);
		break;
	default:
		if (me != root)
			return 0;
		expect_op(tb, rf, op, 0, count, b->want);
		break;
	}
	return verify(me, ws, coll_names[k], t, op, count, inplace, res,
		      b->want, rn);
}

static int has_op(enum coll k)
{
	return k == C_ALL_REDUCE || k == C_REDUCE_SCATTER || k == C_REDUCE;
}

/* Every collective x dtype x op x in/out of place for one count. */
static int matrix_count(hpucoll_comm *c, const struct world *w, size_t count,
			size_t ci)
{
	int ws = hpucoll_comm_size(c), bad = 0;
	size_t n = count * (size_t)ws + 1;
	struct bufs b = {malloc(n * 8), malloc(n * 8), malloc(n * 8)};
	struct tabs *tb = malloc(sizeof(*tb));
	struct ref rf;

	if (!b.send || !b.recv || !b.want || !tb ||
	    ref_make(&rf, ws, hpucoll_comm_rank(c), count) != 0) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	for (int t = 0; t < HPUCOLL_NUM_DTYPES && !bad; t++) {
		tabs_make(tb, (hpucoll_dtype)t, ws);
		for (int k = 0; k < C_NUM && !bad; k++) {
			int nops = has_op((enum coll)k) ? HPUCOLL_NUM_OPS : 1;

			if (w->only_ar && k != C_ALL_REDUCE)
				continue;
			for (int op = 0; op < nops && !bad; op++) {
				int root = (int)((ci + (size_t)t + (size_t)op) %
						 (size_t)ws);

				for (int ip = 0; ip < 2 && !bad; ip++)
					bad = run_one(c, &b, &rf, tb,
						      (enum coll)k,
						      (hpucoll_op)op, ip, root);
			}
		}
	}
	ref_free(&rf);
	free(tb);
	free(b.send);
	free(b.recv);
	free(b.want);
	return bad;
}

static const size_t counts[] = {0, 1, 7, 4099, BIG_COUNT};
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))

static int matrix(hpucoll_comm *c, struct shared *sh, const struct world *w)
{
	(void)sh;
	for (size_t k = 0; k < NCOUNTS; k++) {
		if (counts[k] == BIG_COUNT && !w->big)
			continue;
		if (matrix_count(c, w, counts[k], k))
			return 1;
	}
	return 0;
}

/* Random floats: the result is not exact, but must be the same bytes on
 * every rank; rank 0's copy is broadcast and compared. */
static int check_identical(hpucoll_comm *c, size_t count, hpucoll_op op)
{
	unsigned seed = 1234u + (unsigned)hpucoll_comm_rank(c);
	float *buf = malloc(count * sizeof(float) + 1);
	float *copy = malloc(count * sizeof(float) + 1);
	int rc, bad = 0;

	if (buf == NULL || copy == NULL)
		return 1;
	for (size_t i = 0; i < count; i++)
		buf[i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
	rc = hpucoll_all_reduce(c, buf, buf, count, HPUCOLL_F32, op);
	if (rc != HPUCOLL_OK)
		bad = cw_fail_rc(c, "all_reduce", rc);
	memcpy(copy, buf, count * sizeof(float));
	rc = bad ? rc : hpucoll_broadcast(c, copy, copy, count, HPUCOLL_F32, 0);
	if (!bad && rc != HPUCOLL_OK)
		bad = cw_fail_rc(c, "broadcast", rc);
	for (size_t i = 0; i < count && !bad; i++) {
		if (memcmp(&copy[i], &buf[i], sizeof(float)) != 0) {
			fprintf(stderr, "rank %d: not bit-identical to rank 0 "
					"at %zu of %zu: %a vs %a\n",
				hpucoll_comm_rank(c), i, count, (double)buf[i],
				(double)copy[i]);
			bad = 1;
		}
	}
	free(buf);
	free(copy);
	return bad;
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
			return cw_fail_rc(c, "barrier", rc);
		if (atomic_load(&sh->counter) < ws * (round + 1)) {
			fprintf(stderr, "rank %d: left barrier %d before "
					"everyone entered it\n",
				me, round);
			return 1;
		}
	}
	return 0;
}

static int all_checks(hpucoll_comm *c, struct shared *sh,
		      const struct world *w)
{
	if (matrix(c, sh, w) || check_identical(c, 4099, HPUCOLL_SUM) ||
	    check_identical(c, 4099, HPUCOLL_AVG))
		return 1;
	if (w->big && (check_identical(c, BIG_COUNT, HPUCOLL_SUM) ||
		       check_identical(c, BIG_COUNT, HPUCOLL_AVG)))
		return 1;
	return check_barrier(c, sh);
}

static const int uneven_nodes[] = {0, 0, 0, 1, 1};

/* Every check at world sizes 1 to MAX_WS, over shared memory or TCP. */
static void every_size(int tcp)
{
	for (int ws = 1; ws <= MAX_WS; ws++) {
		struct world w = {.ws = ws,
				  .tcp = tcp,
				  .shm = !tcp,
				  .big = ws == 2 || ws == 3};

		cw_run_world(&w, all_checks);
	}
}

static void test_shm_worlds(void **state)
{
	(void)state;
	every_size(0);
}

static void test_tcp_worlds(void **state)
{
	(void)state;
	every_size(1);
}

/* Small counts through the ring, large ones through recursive doubling
 * (with a folded-in extra rank), and the hierarchical all-reduce. */
static void test_forced_algorithms(void **state)
{
	struct world ring = {.ws = 3, .shm = 1, .algo = "ring"};
	struct world rd = {.ws = 3, .tcp = 1, .algo = "rd", .big = 1,
			   .only_ar = 1};
	struct world hier = {.ws = 4, .shm = 1, .nodes = cw_two_nodes, .big = 1,
			     .only_ar = 1};
	struct world uneven = {.ws = 5, .shm = 1, .nodes = uneven_nodes};

	(void)state;
	cw_run_world(&ring, all_checks);
	cw_run_world(&rd, all_checks);
	cw_run_world(&hier, all_checks);
	cw_run_world(&uneven, all_checks);
}

/* ---- asynchronous requests ---- */

#define OVERLAP_COUNT (4u * 1024 * 1024)

/* An iall_reduce completes while this rank computes (test says so before
 * any wait) and gives the very bytes of the blocking form. */
static int check_overlap(hpucoll_comm *c, struct shared *sh,
			 const struct world *w)
{
	unsigned seed = 99u + (unsigned)hpucoll_comm_rank(c);
	float *a = malloc(OVERLAP_COUNT * sizeof(float));
	float *b = malloc(OVERLAP_COUNT * sizeof(float));
	float *o = malloc(OVERLAP_COUNT * sizeof(float));
	hpucoll_req *req = NULL;
	volatile double work = 0;
	int done = 0, rc, bad = 0;
	int64_t deadline;

	(void)sh;
	(void)w;
	if (!a || !b || !o)
		return 1;
	for (size_t i = 0; i < OVERLAP_COUNT; i++)
		a[i] = (float)rand_r(&seed) / (float)RAND_MAX;
	rc = hpucoll_all_reduce(c, a, b, OVERLAP_COUNT, HPUCOLL_F32,
				HPUCOLL_SUM);
	if (rc != HPUCOLL_OK)
		return cw_fail_rc(c, "all_reduce", rc);
	rc = hpucoll_iall_reduce(c, a, o, OVERLAP_COUNT, HPUCOLL_F32,
				 HPUCOLL_SUM, &req);
	if (rc != HPUCOLL_OK)
		return cw_fail_rc(c, "iall_reduce", rc);
	deadline = ct_now_ms() + 60000;
	while (!done && ct_now_ms() < deadline) {
		for (int i = 0; i < 100000; i++)
			work += i * 0.5;
		hpucoll_test(req, &done);
	}
	if (!done) {
		fprintf(stderr, "rank %d: iall_reduce did not complete while "
				"the caller computed\n",
			hpucoll_comm_rank(c));
		bad = 1;
	}
	rc = hpucoll_wait(&req);
	if (rc != HPUCOLL_OK)
		bad = cw_fail_rc(c, "wait", rc);
	if (!bad && memcmp(o, b, OVERLAP_COUNT * sizeof(float)) != 0) {
		fprintf(stderr, "rank %d: iall_reduce differs from "
				"all_reduce\n",
			hpucoll_comm_rank(c));
		bad = 1;
	}
	free(a);
	free(b);
	free(o);
	return bad;
}

#define NREQ 7

/* Requests of every kind, issued together, then a blocking collective:
 * each completes in issue order, with the right result. */
static int check_order(hpucoll_comm *c, struct shared *sh,
		       const struct world *w)
{
	int ws = hpucoll_comm_size(c), me = hpucoll_comm_rank(c);
	size_t n = 50000;
	int32_t *in = malloc(n * ws * sizeof(int32_t));
	int32_t *want = malloc(n * ws * sizeof(int32_t));
	int32_t *out[NREQ];
	hpucoll_req *req[NREQ] = {0};
	int rc = HPUCOLL_OK, bad = 0, done, prev_done = 1;
	struct tabs *tb = malloc(sizeof(*tb));
	struct ref rf;

	(void)sh;
	(void)w;
	if (!in || !want || !tb || ref_make(&rf, ws, me, n) != 0)
		return 1;
	for (int k = 0; k < NREQ; k++) {
		out[k] = malloc(n * ws * sizeof(int32_t));
		if (out[k] == NULL)
			return 1;
	}
	tabs_make(tb, HPUCOLL_I32, ws);
	expand(tb, tb->val, rf.mine, n * ws, in);
	rc = hpucoll_iall_reduce(c, in, out[0], n, HPUCOLL_I32, HPUCOLL_SUM,
				 &req[0]);
	if (!rc)
		rc = hpucoll_ireduce_scatter(c, in, out[1], n, HPUCOLL_I32,
					     HPUCOLL_MAX, &req[1]);
	if (!rc)
		rc = hpucoll_iall_gather(c, in, out[2], n, HPUCOLL_I32,
					 &req[2]);
	if (!rc)
		rc = hpucoll_ibarrier(c, &req[3]);
	if (!rc)
		rc = hpucoll_ibroadcast(c, me == ws - 1 ? in : NULL, out[4], n,
					HPUCOLL_I32, ws - 1, &req[4]);
	if (!rc)
		rc = hpucoll_ireduce(c, in, out[5], n, HPUCOLL_I32,
				     HPUCOLL_MIN, 0, &req[5]);
	if (!rc)
		rc = hpucoll_iall_reduce(c, in, out[6], 3, HPUCOLL_I32,
					 HPUCOLL_AVG, &req[6]);
	if (rc != HPUCOLL_OK)
		return cw_fail_rc(c, "issue", rc);
	/* A blocking collective runs after all of them. */
	rc = hpucoll_all_reduce(c, in, out[0] + n, n, HPUCOLL_I32,
				HPUCOLL_MIN);
	if (rc != HPUCOLL_OK)
		return cw_fail_rc(c, "all_reduce", rc);
	for (int k = 0; k < NREQ; k++) {
		hpucoll_test(req[k], &done);
		if (!done || !prev_done) {
			fprintf(stderr, "rank %d: request %d not done after "
					"a later blocking call\n",
				me, k);
			bad = 1;
		}
		prev_done = done;
	}
	for (int k = NREQ - 1; k >= 0; k--) {
		rc = hpucoll_wait(&req[k]);
		if (rc != HPUCOLL_OK)
			bad = cw_fail_rc(c, "wait", rc);
	}
	bad = bad ||
	      check_op(tb, &rf, "iall_reduce", HPUCOLL_SUM, 0, n, out[0],
		       want) ||
	      check_op(tb, &rf, "all_reduce", HPUCOLL_MIN, 0, n, out[0] + n,
		       want) ||
	      check_op(tb, &rf, "ireduce_scatter", HPUCOLL_MAX, me * n, n,
		       out[1], want) ||
	      (me == 0 && check_op(tb, &rf, "ireduce", HPUCOLL_MIN, 0, n,
				   out[5], want)) ||
	      check_op(tb, &rf, "iall_reduce", HPUCOLL_AVG, 0, 3, out[6],
		       want);
	if (!bad) {
		expand(tb, tb->val, rf.gather, n * ws, want);
		bad = verify(me, ws, "iall_gather", HPUCOLL_I32, HPUCOLL_SUM,
			     n, 0, out[2], want, n * ws);
	}
	if (!bad) {
		ref_root(&rf, ws - 1);
		expand(tb, tb->val, rf.root, n, want);
		bad = verify(me, ws, "ibroadcast", HPUCOLL_I32, HPUCOLL_SUM, n,
			     0, out[4], want, n);
	}
	/* Outstanding requests at destroy: it waits for them. */
	if (!bad) {
		rc = hpucoll_iall_reduce(c, in, out[0], n, HPUCOLL_I32,
					 HPUCOLL_SUM, &req[0]);
		if (rc == HPUCOLL_OK)
			rc = hpucoll_ibarrier(c, &req[1]);
		if (rc != HPUCOLL_OK)
			return cw_fail_rc(c, "issue", rc);
		hpucoll_comm_destroy(cw_child_comm);
		if (hpucoll_wait(&req[0]) != HPUCOLL_OK ||
		    hpucoll_wait(&req[1]) != HPUCOLL_OK ||
		    check_op(tb, &rf, "iall_reduce before destroy",
			     HPUCOLL_SUM, 0, n, out[0], want))
			bad = 1;
	}
	ref_free(&rf);
	for (int k = 0; k < NREQ; k++)
		free(out[k]);
	free(in);
	free(want);
	free(tb);
	return bad;
}

static void test_async(void **state)
{
	struct world shm2 = {.ws = 2, .shm = 1};
	struct world tcp3 = {.ws = 3, .tcp = 1};

	(void)state;
	cw_run_world(&shm2, check_overlap);
	cw_run_world(&tcp3, check_overlap);
	cw_run_world(&shm2, check_order);
	cw_run_world(&tcp3, check_order);
}

/* A progress thread that cannot start (no room for its stack under
 * ulimit -v): the error says why and what limits it (it said "cannot
 * start the progress thread." without the cause). */
static int no_thread(hpucoll_comm *c, struct shared *sh, const struct world *w)
{
	(void)sh;
	(void)w;
	struct rlimit old, low;
	unsigned long pages = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (!f || fscanf(f, "%lu", &pages) != 1) {
		if (f)
			fclose(f);
		return 1;
	}
	fclose(f);
	float x[4] = {1, 2, 3, 4};
	hpucoll_req *req = NULL;
	getrlimit(RLIMIT_AS, &old);
	low = old;
	low.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (1 << 20);
	setrlimit(RLIMIT_AS, &low);
	int rc = hpucoll_iall_reduce(c, x, x, 4, HPUCOLL_F32, HPUCOLL_SUM, &req);
	setrlimit(RLIMIT_AS, &old);
	const char *want = "cannot start the progress thread: Resource temporarily unavailable";
	if (rc != HPUCOLL_ENOMEM || !strstr(hpucoll_comm_errmsg(c), want)) {
		fprintf(stderr, "rank %d: %s: %s\n", hpucoll_comm_rank(c), hpucoll_strerror(rc),
			hpucoll_comm_errmsg(c));
		if (rc == HPUCOLL_OK)
			hpucoll_wait(&req);
		return 1;
	}
	return 0;
}

/* First of the group: glibc keeps the stacks of threads that ended for
 * the next thread, and a cached stack needs no new memory, so after the
 * tests that run threads in this process the thread would start. */
static void test_progress_thread_refused(void **state)
{
	struct world shm2 = {.ws = 2, .shm = 1};

	(void)state;
	cw_run_world(&shm2, no_thread);
}

/* ---- dead and stalled peers ---- */

/* The last rank dies after a barrier; the others' next all_reduce fails
 * naming it as dead (HPUCOLL_EPEER: found by the liveness check, not by
 * the 30 s timeout's HPUCOLL_ETIMEDOUT). */
static int dead_peer(hpucoll_comm *c, struct shared *sh,
		     const struct world *w)
{
	int me = hpucoll_comm_rank(c), dead = w->ws - 1, rc = HPUCOLL_ENOMEM;
	size_t n = 1u << 20;
	float *buf = calloc(n, sizeof(float));
	char name[32];
	int64_t t0;

	(void)sh;
	hpucoll_comm_set_timeout(c, 30000);
	if (buf == NULL || (rc = hpucoll_barrier(c)) != HPUCOLL_OK)
		return cw_fail_rc(c, "barrier", rc);
	if (me == dead) {
		/* Its last barrier message may still be queued in ZeroMQ. */
		usleep(200 * 1000);
		kill(getpid(), SIGKILL);
	}
	t0 = ct_now_ms();
	rc = hpucoll_all_reduce(c, buf, buf, n, HPUCOLL_F32, HPUCOLL_SUM);
	free(buf);
	snprintf(name, sizeof(name), "rank %d", dead);
	if (rc == HPUCOLL_OK || rc == HPUCOLL_ETIMEDOUT ||
	    strstr(hpucoll_comm_errmsg(c), name) == NULL) {
		fprintf(stderr, "rank %d: after %d ms: %s %s\n", me,
			(int)(ct_now_ms() - t0), hpucoll_strerror(rc),
			hpucoll_comm_errmsg(c));
		return 1;
	}
	/* Failed for good. */
	return hpucoll_barrier(c) == HPUCOLL_OK;
}

static void test_dead_peer(void **state)
{
	struct world shm = {.ws = 3, .shm = 1};
	struct world tcp = {.ws = 3, .tcp = 1};

	(void)state;
	cw_run_world(&shm, dead_peer);
	cw_run_world(&tcp, dead_peer);
}

/* Rank 1 is late; rank 0 prints one stall warning naming it and then
 * completes. */
static int stalled_peer(hpucoll_comm *c, struct shared *sh,
			const struct world *w)
{
	char path[64], text[4096] = "";
	int me = hpucoll_comm_rank(c), fd, saved, rc, lines = 0;
	float x = 1;
	ssize_t got;

	(void)sh;
	(void)w;
	if (me == 1) {
		usleep(900 * 1000);
		return hpucoll_all_reduce(c, &x, &x, 1, HPUCOLL_F32,
					  HPUCOLL_SUM) != HPUCOLL_OK;
	}
	snprintf(path, sizeof(path), "/tmp/hpucoll-test-stall-%d",
		 (int)getpid());
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	saved = dup(2);
	dup2(fd, 2);
	rc = hpucoll_all_reduce(c, &x, &x, 1, HPUCOLL_F32, HPUCOLL_SUM);
	fflush(stderr);
	dup2(saved, 2);
	got = pread(fd, text, sizeof(text) - 1, 0);
	close(fd);
	unlink(path);
	text[got > 0 ? got : 0] = '\0';
	for (char *p = text; (p = strstr(p, "hpucoll:")) != NULL; p++)
		lines++;
	if (rc != HPUCOLL_OK || x != 2 || lines != 1 ||
	    strstr(text, "for rank 1") == NULL) {
		fprintf(stderr, "rank 0: rc %d, x %g, %d warnings: %s\n", rc,
			(double)x, lines, text);
		return 1;
	}
	return 0;
}

static void test_stall_warning(void **state)
{
	struct world shm = {.ws = 2, .shm = 1};
	struct world tcp = {.ws = 2, .tcp = 1};

	(void)state;
	setenv("HPUCOLL_STALL_WARN_MS", "200", 1);
	cw_run_world(&shm, stalled_peer);
	cw_run_world(&tcp, stalled_peer);
	unsetenv("HPUCOLL_STALL_WARN_MS");
}

/* Ranks that disagree on broadcast's root: rank 0 passes root 1 and
 * rank 1 root 0, so each waits for the other. The probe that goes out
 * before the deadline finds the other rank in the same collective with
 * another root, and fails with that, naming the other rank; the other
 * rank gets its abort, with the same sentence (they
 * waited for the timeout and blamed a live rank: "no data from rank 1
 * after 4000 ms (is it alive?)"). Then reduce's root among 3 ranks. */
static int disagreeing_root(hpucoll_comm *c, struct shared *sh,
			    const struct world *w)
{
	int me = hpucoll_comm_rank(c), other = 1 - me, code = 0, rc;
	float x[4] = {1, 2, 3, 4};
	char want[160];
	const char *msg;

	(void)sh;
	(void)w;
	hpucoll_comm_set_timeout(c, 4000);
	rc = hpucoll_broadcast(c, x, x, 4, HPUCOLL_F32, other);
	msg = hpucoll_comm_errmsg(c);
	/* the sentence of whichever rank found it first */
	int first = strstr(msg, "gave up") != NULL ? other : me;
	snprintf(want, sizeof(want),
		 "ranks disagree on collective #1: rank %d called broadcast "
		 "of f32 from root %d where this rank (%d) called broadcast "
		 "of f32 from root %d",
		 1 - first, first, first, 1 - first);
	int culprit = hpucoll_comm_culprit(c, &code);
	/* the finder blames the other rank; the other rank, which the
	 * abort blames, has no culprit (its error is its own) */
	if (rc != HPUCOLL_EPROTO || strstr(msg, want) == NULL ||
	    culprit != (first == me ? other : -1) ||
	    code != (first == me ? HPUCOLL_EPROTO : HPUCOLL_OK)) {
		fprintf(stderr, "rank %d: %s: %s\n  (wanted: %s), culprit %d "
			"(%s)\n", me, hpucoll_strerror(rc), msg, want,
			culprit, hpucoll_strerror(code));
		return 1;
	}
	return 0;
}

/* Reduce: rank 0 passes root 0, ranks 1 and 2 root 1. Rank 2 sends its
 * part to rank 1 and is done; ranks 0 and 1 each wait for the other. One
 * finds the disagreement at its probe; the other and rank 2 (in the
 * barrier after) get its abort. */
static int disagreeing_reduce(hpucoll_comm *c, struct shared *sh,
			      const struct world *w)
{
	int me = hpucoll_comm_rank(c), rc;
	float x[4] = {1, 2, 3, 4}, y[4];
	const char *msg;

	(void)sh;
	(void)w;
	hpucoll_comm_set_timeout(c, 4000);
	rc = hpucoll_reduce(c, x, y, 4, HPUCOLL_F32, HPUCOLL_SUM,
			    me == 0 ? 0 : 1);
	if (me == 2 && rc == HPUCOLL_OK)
		rc = hpucoll_barrier(c);
	msg = hpucoll_comm_errmsg(c);
	if (rc != HPUCOLL_EPROTO ||
	    strstr(msg, "ranks disagree on collective #1: rank ") == NULL ||
	    (strstr(msg, "reduce of f32 with sum to root 0 where") == NULL &&
	     strstr(msg, "reduce of f32 with sum to root 1 where") == NULL)) {
		fprintf(stderr, "rank %d: %s: %s\n", me, hpucoll_strerror(rc),
			msg);
		return 1;
	}
	return 0;
}

static void test_disagreeing_root(void **state)
{
	struct world shm = {.ws = 2, .shm = 1};
	struct world tcp = {.ws = 2, .tcp = 1};
	struct world three = {.ws = 3, .shm = 1};

	(void)state;
	cw_run_world(&shm, disagreeing_root);
	cw_run_world(&tcp, disagreeing_root);
	cw_run_world(&three, disagreeing_reduce);
}

/* A peer whose connection never comes up (a firewall that lets the
 * coordinator through but not the data ports; here a TCP port that
 * listens and never speaks ZeroMQ, under --data-plane auth): the send
 * times out naming it ("its connection is not up"), and the
 * communicator blames it, as the shared-memory send does (it blamed
 * nobody, and hpulaunch's summary named whichever rank exited first). */
static void test_connection_never_up(void **state)
{
	(void)state;
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	assert_true(lfd >= 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 4), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
	char silent[64];
	snprintf(silent, sizeof(silent), "tcp://127.0.0.1:%d", ntohs(sa.sin_port));
	setenv("HPUCOLL_TIMEOUT_MS", "1500", 1);
	hpucoll_comm *c = NULL;
	/* under auth (the launcher's default) a connection takes no message
	 * before its handshake */
	static const char secret[] = "0123456789abcdef0123456789abcdef";
	assert_int_equal(hpucoll_comm_new_secure(&c, 0, 2, "tcp://127.0.0.1:*",
						 HPUCOLL_SECURITY_AUTH, secret, sizeof(secret) - 1),
			 HPUCOLL_OK);
	unsetenv("HPUCOLL_TIMEOUT_MS");
	const char *eps[2] = {hpucoll_comm_endpoint(c), silent};
	int rc = hpucoll_comm_connect(c, eps);
	float x[2] = {1, 2}, y[4];
	if (rc == HPUCOLL_OK)
		rc = hpucoll_all_gather(c, x, y, 2, HPUCOLL_F32);
	int code = 0, culprit = hpucoll_comm_culprit(c, &code);
	printf("  rc %s, culprit %d (%s): %s\n", hpucoll_strerror(rc), culprit,
	       hpucoll_strerror(code), hpucoll_comm_why(c, rc));
	assert_int_equal(rc, HPUCOLL_ETIMEDOUT);
	assert_int_equal(culprit, 1);
	assert_int_equal(code, HPUCOLL_ETIMEDOUT);
	hpucoll_comm_destroy(&c);
	close(lfd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_progress_thread_refused), /* first: no thread's stack
								 * cached yet */
		cmocka_unit_test(test_shm_worlds),
		cmocka_unit_test(test_tcp_worlds),
		cmocka_unit_test(test_forced_algorithms),
		cmocka_unit_test(test_async),
		cmocka_unit_test(test_dead_peer),
		cmocka_unit_test(test_disagreeing_root),
		cmocka_unit_test(test_stall_warning),
		cmocka_unit_test(test_connection_never_up),
	};

	/* HPUCOLL_TEST=test_async (a glob) runs only the tests it names. */
	if (getenv("HPUCOLL_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPUCOLL_TEST"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
