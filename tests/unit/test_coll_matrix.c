/* The correctness matrix of libhpucoll: every collective x dtype x op x
 * world size 1-8 x count, in place and out of place, with each transport
 * forced in turn (shared memory, ZeroMQ TCP, ZeroMQ IPC); then overlap of
 * asynchronous collectives with computation, and their issue order.
 *
 * The parent forks one child per rank; each child binds, publishes its
 * resolved endpoint in a MAP_SHARED page, declares with set_topology every
 * rank to be on node 0, a job name unique to the world and the transport
 * under test, connects, and runs the collectives. Every element of every
 * result is compared with a reference the child computes itself from the
 * inputs of all ranks (each input is a function of rank and index). The
 * values are small integers chosen so that every result is exact in every
 * dtype: sums stay within 2048 in f16, 256 in bf16 and 255 in u8, and for
 * avg in the float types the inputs of the ranks sum to a multiple of the
 * world size, so that sum / size is exact (integer types truncate toward
 * zero, as the header says, and are checked on arbitrary sums). Out of
 * place, the sendbuf must come back unchanged; no buffer may be written
 * past its end. Rank 0 checks in /proc/self/maps that the job's segment is
 * mapped under SHM and not under TCP or IPC, so the forced transport is the
 * one used.
 *
 * Children record per configuration (collective, dtype, op) how many
 * elements they checked, how many runs failed and the largest difference
 * (maxdiff) in the shared page, and print the first mismatch of each run
 * with collective, dtype, op, world size, count, placement, transport,
 * index, expected and got. The parent prints one line per configuration.
 * Every wait is bounded: ranks use a 30 s collective timeout and the
 * parent kills children still running at a deadline.
 *
 * What runs (about 2.5 minutes on 2 cores):
 * - counts 0, 1, 7 and 4099 for every (collective, dtype, op), in place and
 *   out of place, world sizes 1-8, on every transport; and again with the
 *   library's size thresholds overridden so that ring all-reduce, chain
 *   broadcast and ring reduce run at these counts too (at the default
 *   thresholds, 64 KiB, they take the tree / recursive-doubling paths);
 * - count 4M+3 (limited): f32 and bf16 with sum, for every collective, in
 *   place and out of place, world sizes 2, 3 and 8, on every transport;
 * - shared memory within two nodes and ZeroMQ between them (hierarchical
 *   paths): counts 0-4099 at world sizes 2-8, default and hierarchical
 *   all-reduce forced, and 4M+3 at world sizes 3 and 8;
 * - overlap (2 ranks, each transport) and issue order (3 ranks, each
 *   transport), described above overlap() and order_round().
 * An optional argument runs only the tests whose name contains it
 * ("matrix_tcp", "big", "overlap", "2nodes", ...). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hpu/coll.h"
#include "coll_testlib.h"

#define MAX_WS CT_MAX_WS
#define MAX_CFG 192
#define NAME_MAX_ 112
#define GUARD 64 /* bytes checked past the end of every buffer */
#define BIG_N (4u * 1024 * 1024 + 3)
#define OVERLAP_N (16u * 1024 * 1024)
#define HOLD_CHUNKS 16 /* chunks rank 0 computes before rank 1 joins */
#define COMM_TIMEOUT_MS 30000
#define SMALL_DEADLINE_MS 300000
#define BIG_DEADLINE_MS 420000
#define SENTINEL 0xA5 /* recvbuf bytes before a collective */
#define GARBAGE 0x3C  /* non-root broadcast sendbuf bytes: never read */

enum coll {
	C_ALL_REDUCE,
	C_REDUCE_SCATTER,
	C_REDUCE,
	C_ALL_GATHER,
	C_BCAST,
	C_BARRIER
};
enum kind { K_SMALL, K_BIG, K_OVERLAP, K_ORDER };

static const char *const coll_names[] = {"all_reduce", "reduce_scatter",
                                         "reduce",     "all_gather",
                                         "broadcast",  "barrier"};
static const size_t small_counts[] = {0, 1, 7, 4099};
#define NSMALL (sizeof(small_counts) / sizeof(small_counts[0]))

/* What one rank found for one configuration. */
struct cstat {
	long long checked; /* elements compared */
	int runs;          /* collectives run */
	int bad;           /* runs with a mismatch */
	double maxdiff;    /* largest |got - expected| */
};

/* Memory shared by the parent and the ranks of one world. */
struct shared {
	struct ct_eps eps;   /* the ranks' resolved endpoints */
	atomic_int counter;  /* barrier check: arrivals so far */
	atomic_int chunks;   /* overlap: chunks of work rank 0 has done */
	atomic_int ncfg;     /* configurations named so far (by rank 0) */
	atomic_int shm_seen; /* rank 0 mapped the node's shm segment */
	char name[MAX_CFG][NAME_MAX_];
	struct cstat st[MAX_WS][MAX_CFG];
	char note[MAX_WS][256]; /* a line each rank reports to the parent */
};

/* One cmocka test: one world. */
struct world {
	hpucoll_transport tr;
	int ws;
	enum kind kind;
	int ring; /* force ring (hier over 2 nodes) / chain at every size */
	int two_nodes;  /* ranks on nodes 0 and 1: hierarchical paths */
	char label[24]; /* "shm", "tcp ring", "shm 2 nodes", ... */
};

/* One collective to run and check. */
struct spec {
	enum coll coll;
	hpucoll_dtype dt;
	hpucoll_op op;
	size_t count;
	int inplace;
	int root;
};

/* A spec's buffers. */
struct run {
	struct spec s;
	unsigned char *a, *b; /* allocations (each with GUARD bytes after) */
	unsigned char *copy;  /* out of place: a as it was before the call */
	size_t a_n, b_n;      /* their sizes in elements */
	const void *send;
	void *recv;
};

/* A rank's view of its world. */
struct rk {
	hpucoll_comm *c;
	struct shared *sh;
	const struct world *w;
	int me, ws;
	int cfg;   /* current configuration index */
	int fatal; /* a collective returned an error */
};

static int world_seq;
static char job[64];

static const char *tr_name(hpucoll_transport t)
{
	static const char *const n[] = {"auto", "tcp", "ipc", "shm"};

	return (unsigned)t < 4 ? n[t] : "?";
}

/* ---- values: small integers, exact in every dtype ---- */

static uint32_t mix(size_t i, uint32_t salt)
{
	uint32_t h =
	    (uint32_t)i * 2654435761u ^ (salt * 0x85ebca6bu + 0x27d4eb2fu);

	h ^= h >> 15;
	h *= 0x2c1b3c6du;
	h ^= h >> 12;
	return h;
}

/* h scaled to [0, n). */
static uint32_t below(uint32_t h, uint32_t n)
{
	return (uint32_t)(((uint64_t)h * n) >> 32);
}

/* Uniform in [-amp, amp]. */
static int64_t span(uint32_t h, int64_t amp)
{
	return (int64_t)below(h, (uint32_t)(2 * amp + 1)) - amp;
}

/* Half the range of one rank's value, per dtype: with 8 ranks every
 * partial sum stays exact (f16 <= 2048, bf16 <= 256, u8 <= 255). */
static int64_t amp_of(hpucoll_dtype dt)
{
	switch (dt) {
	case HPUCOLL_F16:
		return 200;
	case HPUCOLL_BF16:
		return 30;
	case HPUCOLL_I32:
		return 1 << 20;
	case HPUCOLL_U8:
		return 31;
	default:
		return 1000;
	}
}

/* Rank r's input at index i for a collective of (dt, op) among ws ranks.
 * For avg in a float dtype the inputs are b(i) + p(r, i) with p summing
 * to zero over the ranks, so the sum is ws * b(i) and the average b(i). */
static int64_t val(hpucoll_dtype dt, hpucoll_op op, int ws, int r, size_t i)
{
	int64_t amp = amp_of(dt);
	uint32_t h = mix(i, (uint32_t)r + 1);

	if (op == HPUCOLL_AVG && ct_is_float(dt)) {
		int64_t b = span(mix(i, 0x7777), amp / 2);
		int64_t k = below(mix(i, 0x1000u + (uint32_t)r / 2),
		                  (uint32_t)(amp / 2 + 1));

		if (r % 2)
			return b - k;
		return r + 1 < ws ? b + k : b;
	}
	switch (dt) {
	case HPUCOLL_U8:
		return (int64_t)(h >> 27);
	case HPUCOLL_I64: /* uses the high 32 bits too */
		return span(h, 1000) * ((int64_t)1 << 34) +
		       span(mix(i, (uint32_t)r + 99), 1000);
	default:
		return span(h, amp);
	}
}

/* The reduction over all ranks of the inputs at index i. */
static int64_t ref(hpucoll_dtype dt, hpucoll_op op, int ws, size_t i)
{
	int64_t acc = val(dt, op, ws, 0, i);

	for (int r = 1; r < ws; r++) {
		int64_t v = val(dt, op, ws, r, i);

		if (op == HPUCOLL_MAX)
			acc = v > acc ? v : acc;
		else if (op == HPUCOLL_MIN)
			acc = v < acc ? v : acc;
		else
			acc += v;
	}
	return op == HPUCOLL_AVG ? acc / ws : acc; /* C truncates toward 0 */
}

/* ---- comparing elements ---- */

/* Compares element i of p with v; *diff gets |got - v|, txt the value. */
static int same(hpucoll_dtype dt, const void *p, size_t i, int64_t v,
                double *diff, char *txt, size_t len)
{
	double g;
	int64_t gi;

	if (!ct_is_float(dt)) {
		gi = ct_get_int(dt, p, i);
		*diff = gi == v ? 0 : fabs((double)gi - (double)v);
		if (txt)
			snprintf(txt, len, "%lld", (long long)gi);
		return gi == v;
	}
	g = ct_get(dt, p, i);
	*diff = g == (double)v ? 0 : isnan(g) ? INFINITY : fabs(g - (double)v);
	if (txt)
		snprintf(txt, len, "%.9g", g);
	return g == (double)v;
}

/* ---- one collective: buffers, call, check ---- */

static void desc(const struct rk *k, const struct spec *s, char *buf,
                 size_t len)
{
	int n = snprintf(buf, len, "%s ws=%d rank %d: %s %s", k->w->label,
	                 k->ws, k->me, coll_names[s->coll],
	                 ct_dtype_names[s->dt]);

	if (s->coll <= C_REDUCE)
		n += snprintf(buf + n, len - (size_t)n, " %s",
		              ct_op_names[s->op]);
	if (s->coll == C_BCAST || s->coll == C_REDUCE)
		n += snprintf(buf + n, len - (size_t)n, " root %d", s->root);
	snprintf(buf + n, len - (size_t)n, " count %zu %s", s->count,
	         s->inplace ? "in-place" : "out-of-place");
}

static unsigned char *alloc_fill(size_t bytes, int byte)
{
	unsigned char *p = malloc(bytes + GUARD);

	if (p) {
		memset(p, byte, bytes);
		memset(p + bytes, 0x5A, GUARD);
	}
	return p;
}

/* Stores rank k->me's first n inputs of s at p. */
static void fill_mine(const struct rk *k, const struct spec *s, void *p,
                      size_t n)
{
	for (size_t i = 0; i < n; i++)
		ct_put(s->dt, p, i, val(s->dt, s->op, k->ws, k->me, i));
}

/* Out of place: a recvbuf of n elements apart from the sendbuf r->a. */
static int recv_apart(struct run *r, size_t n, size_t esz)
{
	r->b_n = n;
	r->b = alloc_fill(n * esz, SENTINEL);
	r->send = n ? r->a : NULL;
	r->recv = n ? r->b : NULL;
	return r->b ? 0 : -1;
}

/* Allocates and fills the buffers of r->s for rank k->me. */
static int prep_bufs(const struct rk *k, struct run *r)
{
	const struct spec *s = &r->s;
	size_t esz = hpucoll_dtype_size(s->dt), n = s->count;
	int me = k->me, ws = k->ws;

	r->a = r->b = r->copy = NULL;
	r->a_n = r->b_n = 0;
	r->send = r->recv = NULL;
	switch (s->coll) {
	case C_ALL_REDUCE:
	case C_REDUCE:
		r->a_n = n;
		r->a = alloc_fill(n * esz, SENTINEL);
		if (!r->a)
			return -1;
		fill_mine(k, s, r->a, n);
		if (s->inplace) {
			r->send = r->recv = r->a;
			return 0;
		}
		if (s->coll == C_REDUCE && me != s->root) {
			r->send = n ? r->a : NULL;
			return 0; /* recvbuf is ignored off the root: NULL */
		}
		return recv_apart(r, n, esz);
	case C_REDUCE_SCATTER:
		r->a_n = n * (size_t)ws;
		r->a = alloc_fill(r->a_n * esz, SENTINEL);
		if (!r->a)
			return -1;
		fill_mine(k, s, r->a, r->a_n);
		if (s->inplace) {
			r->send = r->a;
			r->recv = r->a + (size_t)me * n * esz;
			return 0;
		}
		return recv_apart(r, n, esz);
	case C_ALL_GATHER:
		r->b_n = n * (size_t)ws;
		r->b = alloc_fill(r->b_n * esz, SENTINEL);
		if (!r->b)
			return -1;
		if (s->inplace) {
			unsigned char *mine = r->b + (size_t)me * n * esz;

			fill_mine(k, s, mine, n);
			r->send = mine;
			r->recv = r->b;
			return 0;
		}
		r->a_n = n;
		r->a = alloc_fill(n * esz, SENTINEL);
		if (!r->a)
			return -1;
		fill_mine(k, s, r->a, n);
		r->send = n ? r->a : NULL;
		r->recv = n ? r->b : NULL;
		return 0;
	case C_BCAST:
		r->a_n = n;
		r->a = alloc_fill(
		    n * esz, me == s->root || s->inplace ? SENTINEL : GARBAGE);
		if (!r->a)
			return -1;
		if (me == s->root)
			fill_mine(k, s, r->a, n);
		if (s->inplace) {
			r->send = r->recv = r->a;
			return 0;
		}
		return recv_apart(r, n, esz);
	default:
		return 0;
	}
}

static void unprep(struct run *r)
{
	free(r->a);
	free(r->b);
	free(r->copy);
	r->a = r->b = r->copy = NULL;
}

/* Out of place, keeps a copy of the sendbuf to check it is left alone. */
static int keep_copy(const struct rk *k, struct run *r)
{
	size_t bytes = r->a_n * hpucoll_dtype_size(r->s.dt);

	if (r->s.inplace || !r->a ||
	    (r->s.coll == C_BCAST && k->me != r->s.root))
		return 0;
	r->copy = malloc(bytes + 1);
	if (!r->copy)
		return -1;
	memcpy(r->copy, r->a, bytes);
	return 0;
}

static int prep(const struct rk *k, struct run *r)
{
	return prep_bufs(k, r) == 0 ? keep_copy(k, r) : -1;
}

/* Starts r (asynchronously when req is not NULL). */
static int issue(struct rk *k, struct run *r, hpucoll_req **req)
{
	const struct spec *s = &r->s;
	hpucoll_comm *c = k->c;

	switch (s->coll) {
	case C_ALL_REDUCE:
		return req ? hpucoll_iall_reduce(c, r->send, r->recv, s->count,
		                                 s->dt, s->op, req)
		           : hpucoll_all_reduce(c, r->send, r->recv, s->count,
		                                s->dt, s->op);
	case C_REDUCE_SCATTER:
		return req ? hpucoll_ireduce_scatter(c, r->send, r->recv,
		                                     s->count, s->dt, s->op,
		                                     req)
		           : hpucoll_reduce_scatter(c, r->send, r->recv,
		                                    s->count, s->dt, s->op);
	case C_REDUCE:
		return req ? hpucoll_ireduce(c, r->send, r->recv, s->count,
		                             s->dt, s->op, s->root, req)
		           : hpucoll_reduce(c, r->send, r->recv, s->count,
		                            s->dt, s->op, s->root);
	case C_ALL_GATHER:
		return req ? hpucoll_iall_gather(c, r->send, r->recv, s->count,
		                                 s->dt, req)
		           : hpucoll_all_gather(c, r->send, r->recv, s->count,
		                                s->dt);
	case C_BCAST:
		return req ? hpucoll_ibroadcast(c, r->send, r->recv, s->count,
		                                s->dt, s->root, req)
		           : hpucoll_broadcast(c, r->send, r->recv, s->count,
		                               s->dt, s->root);
	default:
		return req ? hpucoll_ibarrier(c, req) : hpucoll_barrier(c);
	}
}

/* A comparison in progress: counts, maxdiff, the first mismatch. */
struct cmp {
	const struct rk *k;
	const struct spec *s;
	long long checked;
	double maxdiff;
	int bad;
};

/* Checks n elements of p against want(j0 + i); prints the first mismatch
 * under the label what. */
static void cmp_range(struct cmp *m, const char *what, const void *p, size_t n,
                      size_t j0,
                      int (*wantf)(const struct cmp *, size_t, int64_t *))
{
	char got[64], d[200];
	double diff;
	int64_t want;

	for (size_t i = 0; i < n; i++) {
		if (!wantf(m, j0 + i, &want))
			continue;
		m->checked++;
		if (same(m->s->dt, p, i, want, &diff, NULL, 0)) {
			continue;
		}
		if (diff > m->maxdiff || isnan(diff))
			m->maxdiff = isnan(diff) ? INFINITY : diff;
		if (m->bad++)
			continue;
		same(m->s->dt, p, i, want, &diff, got, sizeof(got));
		desc(m->k, m->s, d, sizeof(d));
		fprintf(stderr,
		        "%s: %s index %zu: expected %lld got %s "
		        "(diff %g)\n",
		        d, what, i, (long long)want, got, diff);
	}
}

static void cmp_guard(struct cmp *m, const char *what, const unsigned char *p,
                      size_t bytes)
{
	char d[200];

	if (!p)
		return;
	for (size_t i = 0; i < GUARD; i++) {
		if (p[bytes + i] == 0x5A)
			continue;
		if (!m->bad++) {
			desc(m->k, m->s, d, sizeof(d));
			fprintf(stderr,
			        "%s: wrote past the end of %s: byte %zu "
			        "after it is 0x%02x\n",
			        d, what, i, p[bytes + i]);
		}
		m->maxdiff = INFINITY;
		return;
	}
}

static int want_reduced(const struct cmp *m, size_t j, int64_t *v)
{
	*v = ref(m->s->dt, m->s->op, m->k->ws, j);
	return 1;
}

static int want_mine(const struct cmp *m, size_t j, int64_t *v)
{
	*v = val(m->s->dt, m->s->op, m->k->ws, m->k->me, j);
	return 1;
}

static int want_root(const struct cmp *m, size_t j, int64_t *v)
{
	*v = val(m->s->dt, m->s->op, m->k->ws, m->s->root, j);
	return 1;
}

/* all_gather's recvbuf: block j / count comes from that rank. */
static int want_gathered(const struct cmp *m, size_t j, int64_t *v)
{
	size_t n = m->s->count;

	*v = val(m->s->dt, m->s->op, m->k->ws, (int)(j / n), j % n);
	return 1;
}

/* Checks r's results on rank k->me; fills m. */
static void check(const struct rk *k, struct run *r, struct cmp *m)
{
	const struct spec *s = &r->s;
	size_t esz = hpucoll_dtype_size(s->dt), n = s->count;
	int me = k->me;

	memset(m, 0, sizeof(*m));
	m->k = k;
	m->s = s;
	switch (s->coll) {
	case C_ALL_REDUCE:
		cmp_range(m, "recvbuf", s->inplace ? r->a : r->b, n, 0,
		          want_reduced);
		break;
	case C_REDUCE:
		if (me == s->root)
			cmp_range(m, "recvbuf", s->inplace ? r->a : r->b, n, 0,
			          want_reduced);
		break;
	case C_REDUCE_SCATTER:
		cmp_range(m, "recvbuf",
		          s->inplace ? r->a + (size_t)me * n * esz : r->b, n,
		          (size_t)me * n, want_reduced);
		break;
	case C_ALL_GATHER:
		cmp_range(m, "recvbuf", r->b, n * (size_t)k->ws, 0,
		          want_gathered);
		break;
	case C_BCAST:
		cmp_range(m, "recvbuf", s->inplace ? r->a : r->b, n, 0,
		          want_root);
		break;
	default:
		break;
	}
	/* Out of place, the sendbuf is const: it must be as it was. */
	if (r->copy && memcmp(r->copy, r->a, r->a_n * esz) != 0)
		cmp_range(m, "sendbuf (changed)", r->a, r->a_n, 0,
		          s->coll == C_BCAST ? want_root : want_mine);
	cmp_guard(m, s->inplace ? "the buffer" : "sendbuf", r->a, r->a_n * esz);
	cmp_guard(m, "recvbuf", r->b, r->b_n * esz);
}

static void record(struct rk *k, const struct cmp *m)
{
	struct cstat *st = &k->sh->st[k->me][k->cfg];

	st->checked += m->checked;
	st->runs++;
	st->bad += m->bad != 0;
	if (m->maxdiff > st->maxdiff)
		st->maxdiff = m->maxdiff;
}

static int fail_rc(struct rk *k, const struct spec *s, const char *call, int rc)
{
	char d[200];

	desc(k, s, d, sizeof(d));
	fprintf(stderr, "%s: %s returned %s: %s\n", d, call,
	        hpucoll_strerror(rc), hpucoll_comm_errmsg(k->c));
	k->fatal = 1;
	return -1;
}

/* Runs one collective blocking and checks it; -1 if it returned an
 * error (the world cannot go on). */
static int run_one(struct rk *k, const struct spec *s)
{
	struct run r = {.s = *s};
	struct cmp m;
	int rc;

	if (prep(k, &r) != 0) {
		fprintf(stderr, "rank %d: out of memory\n", k->me);
		unprep(&r);
		k->fatal = 1;
		return -1;
	}
	rc = issue(k, &r, NULL);
	if (rc != HPUCOLL_OK) {
		unprep(&r);
		return fail_rc(k, s, coll_names[s->coll], rc);
	}
	check(k, &r, &m);
	record(k, &m);
	unprep(&r);
	return 0;
}

/* Configuration index, kept by every rank in step (no shared counter
 * read races: each rank counts for itself). */
static int next_cfg(struct rk *k, int *idx)
{
	if (*idx >= MAX_CFG)
		return -1;
	k->cfg = (*idx)++;
	if (k->me == 0)
		atomic_store(&k->sh->ncfg, *idx);
	return 0;
}

static int is_reduction(enum coll c)
{
	return c <= C_REDUCE;
}

static int root_of(enum coll c, int variant, int ws)
{
	if (c == C_BCAST)
		return variant ? ws - 1 : 0;
	if (c == C_REDUCE)
		return ws / 2; /* non-zero from 2 ranks up */
	return 0;
}

/* Barrier: nobody leaves before everyone entered, blocking and async. */
static int check_barrier(struct rk *k)
{
	struct spec s = {.coll = C_BARRIER};
	struct cmp m = {.k = k, .s = &s};
	hpucoll_req *req = NULL;
	int rc;

	for (int round = 0; round < 6; round++) {
		usleep((useconds_t)(((k->me * 7 + round * 3) % 5) * 1000));
		atomic_fetch_add(&k->sh->counter, 1);
		if (round == 5) {
			rc = hpucoll_ibarrier(k->c, &req);
			if (rc == HPUCOLL_OK)
				rc = hpucoll_wait(&req);
		} else {
			rc = hpucoll_barrier(k->c);
		}
		if (rc != HPUCOLL_OK)
			return fail_rc(k, &s,
			               round == 5 ? "ibarrier" : "barrier", rc);
		m.checked++;
		if (atomic_load(&k->sh->counter) < k->ws * (round + 1)) {
			if (!m.bad++)
				fprintf(stderr,
				        "%s ws=%d rank %d: left barrier "
				        "%d before everyone entered it\n",
				        k->w->label, k->ws, k->me, round);
		}
	}
	record(k, &m);
	return 0;
}

/* Rank 0 names configuration k->cfg: collective c with root variant v,
 * dtype, op ("-" for none) and the counts it runs at, in and out of
 * place. */
static void name_cfg(struct rk *k, int c, int v, hpucoll_dtype dt,
                     const char *op, const char *counts)
{
	const char *root = c == C_BCAST    ? (v ? "(root ws-1)" : "(root 0)")
	                   : c == C_REDUCE ? "(root ws/2)"
	                                   : "";

	if (k->me == 0)
		snprintf(k->sh->name[k->cfg], NAME_MAX_, "%s%s %s %s %s in+out",
		         coll_names[c], root, ct_dtype_names[dt], op, counts);
}

/* Every (collective, dtype, op) at counts 0, 1, 7, 4099, in and out of
 * place; then the barrier. */
static int small_matrix(struct rk *k)
{
	int idx = 0;

	for (int c = C_ALL_REDUCE; c <= C_BCAST; c++) {
		int variants = c == C_BCAST ? 2 : 1;
		int nops = is_reduction(c) ? HPUCOLL_NUM_OPS : 1;

		for (int v = 0; v < variants; v++)
			for (int dt = 0; dt < HPUCOLL_NUM_DTYPES; dt++)
				for (int op = 0; op < nops; op++) {
					struct spec s = {
					    .coll = c,
					    .dt = dt,
					    .op = op,
					    .root = root_of(c, v, k->ws)};

					if (next_cfg(k, &idx) != 0)
						return -1;
					name_cfg(k, c, v, dt,
					         is_reduction(c)
					             ? ct_op_names[op]
					             : "-",
					         "counts 0,1,7,4099");
					for (size_t n = 0; n < NSMALL; n++)
						for (int in = 0; in < 2; in++) {
							s.count =
							    small_counts[n];
							s.inplace = in;
							if (run_one(k, &s) != 0)
								return -1;
						}
				}
	}
	if (next_cfg(k, &idx) != 0)
		return -1;
	if (k->me == 0)
		snprintf(k->sh->name[k->cfg], NAME_MAX_,
		         "barrier x5 + ibarrier");
	return check_barrier(k);
}

/* Count 4M+3, f32 and bf16, sum, every collective, in and out of place. */
static int big_matrix(struct rk *k)
{
	static const hpucoll_dtype dts[] = {HPUCOLL_F32, HPUCOLL_BF16};
	char counts[32];
	int idx = 0;

	snprintf(counts, sizeof(counts), "count %u", BIG_N);
	for (int c = C_ALL_REDUCE; c <= C_BCAST; c++) {
		int variants = c == C_BCAST ? 2 : 1;

		for (int v = 0; v < variants; v++)
			for (int d = 0; d < 2; d++) {
				struct spec s = {.coll = c,
				                 .dt = dts[d],
				                 .op = HPUCOLL_SUM,
				                 .count = BIG_N,
				                 .root = root_of(c, v, k->ws)};

				if (next_cfg(k, &idx) != 0)
					return -1;
				name_cfg(k, c, v, s.dt,
				         is_reduction(c) ? "sum" : "-", counts);
				for (int in = 0; in < 2; in++) {
					s.inplace = in;
					if (run_one(k, &s) != 0)
						return -1;
				}
			}
	}
	return 0;
}

/* ---- overlap: an async all-reduce completes while the caller computes ---- */

/* Non-integer floats: the sum is not exact in general, so the blocking and
 * the asynchronous forms must agree bit for bit. */
static float ofval(int r, size_t i)
{
	return (float)(mix(i, (uint32_t)r + 5) >> 8) * 0x1p-24f - 0.5f;
}

/* One chunk of the caller's own work; returns its result. */
static double work_chunk(const float *w, size_t n)
{
	double s = 0;

	for (size_t j = 0; j < n; j++)
		s += sqrt((double)w[j] * w[j] + 1.0);
	return s;
}

/* Two ranks. The blocking all_reduce of 16M floats gives the reference
 * (each sum one rounding, so it must equal the float of the exact sum).
 * Then the asynchronous form: rank 0 issues it and computes chunks of its
 * own work, calling hpucoll_test between chunks; rank 1 issues only after
 * rank 0 has done HOLD_CHUNKS chunks, so rank 0's request cannot complete
 * before that, and rank 0's iall_reduce must have returned at once (else
 * the two would wait on each other until rank 1 gives up). Both ranks go
 * on computing until hpucoll_test says done, then wait. Asserted: test saw
 * the request done, the result is identical (memcmp) to the blocking
 * form's, in place too, and the caller's computation stayed right. The
 * chunk counts are printed, never compared with a time. */
static int overlap(struct rk *k)
{
	const size_t n = OVERLAP_N, wn = 1 << 15;
	struct spec s = {.coll = C_ALL_REDUCE,
	                 .dt = HPUCOLL_F32,
	                 .op = HPUCOLL_SUM,
	                 .count = n};
	float *x = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
	float *ip = malloc(n * 4), *w = malloc(wn * 4);
	struct cmp m = {.k = k, .s = &s};
	hpucoll_req *req = NULL;
	double work_ref, got;
	int rc, done = 0, chunks = 0, ok_chunks = 1, idx = 0;
	int64_t deadline;

	if (!x || !a || !b || !ip || !w) {
		fprintf(stderr, "rank %d: out of memory\n", k->me);
		return -1;
	}
	next_cfg(k, &idx);
	if (k->me == 0)
		snprintf(k->sh->name[k->cfg], NAME_MAX_,
		         "overlap: iall_reduce f32 sum count %zu vs blocking",
		         n);
	for (size_t i = 0; i < n; i++)
		x[i] = ofval(k->me, i);
	for (size_t j = 0; j < wn; j++)
		w[j] = (float)j * 0.001f;
	work_ref = work_chunk(w, wn);

	/* The blocking form; with 2 ranks each sum is one rounding, so it
	 * equals the float of the exact double sum. */
	rc = hpucoll_all_reduce(k->c, x, a, n, HPUCOLL_F32, HPUCOLL_SUM);
	if (rc != HPUCOLL_OK)
		return fail_rc(k, &s, "all_reduce", rc);
	for (size_t i = 0; i < n; i++) {
		float want = (float)((double)ofval(0, i) + (double)ofval(1, i));
		double d = fabs((double)a[i] - (double)want);

		m.checked++;
		if (d > m.maxdiff || isnan(d))
			m.maxdiff = isnan(d) ? INFINITY : d;
		if (a[i] != want && !m.bad++)
			fprintf(stderr,
			        "%s ws=2 rank %d: all_reduce f32 sum "
			        "count %zu out-of-place: index %zu "
			        "expected %a got %a\n",
			        k->w->label, k->me, n, i, (double)want,
			        (double)a[i]);
	}

	/* The asynchronous form. Rank 1 issues it only after rank 0 has
	 * computed HOLD_CHUNKS chunks, so rank 0's request cannot complete
	 * before that: iall_reduce must return without waiting for peers. */
	if (k->me == 1) {
		deadline = ct_now_ms() + 30000;
		while (atomic_load(&k->sh->chunks) < HOLD_CHUNKS &&
		       ct_now_ms() < deadline)
			usleep(1000);
		if (atomic_load(&k->sh->chunks) < HOLD_CHUNKS) {
			fprintf(stderr,
			        "%s ws=2: rank 0 never came back from "
			        "hpucoll_iall_reduce while rank 1 had "
			        "not issued its own: it is not "
			        "asynchronous\n",
			        k->w->label);
			m.bad++;
		}
	}
	rc = hpucoll_iall_reduce(k->c, x, b, n, HPUCOLL_F32, HPUCOLL_SUM, &req);
	if (rc != HPUCOLL_OK)
		return fail_rc(k, &s, "iall_reduce", rc);
	deadline = ct_now_ms() + 120000;
	while (!done && ct_now_ms() < deadline) {
		got = work_chunk(w, wn);
		ok_chunks &= got == work_ref;
		chunks++;
		if (k->me == 0)
			atomic_store(&k->sh->chunks, chunks);
		rc = hpucoll_test(req, &done);
		if (rc != HPUCOLL_OK)
			return fail_rc(k, &s, "test", rc);
	}
	if (!done) {
		fprintf(stderr,
		        "%s ws=2 rank %d: hpucoll_test never saw the "
		        "iall_reduce done in 120 s\n",
		        k->w->label, k->me);
		m.bad++;
	}
	rc = hpucoll_wait(&req);
	if (rc != HPUCOLL_OK)
		return fail_rc(k, &s, "wait", rc);
	if (req != NULL) {
		fprintf(stderr, "rank %d: hpucoll_wait left *req set\n", k->me);
		m.bad++;
	}
	if (k->me == 0 && chunks < HOLD_CHUNKS) {
		fprintf(stderr,
		        "%s ws=2 rank 0: the request was done after %d "
		        "chunks, before rank 1 had issued its part\n",
		        k->w->label, chunks);
		m.bad++;
	}
	if (!ok_chunks) {
		fprintf(stderr,
		        "rank %d: the caller's computation gave a "
		        "wrong result during the collective\n",
		        k->me);
		m.bad++;
	}
	if (memcmp(a, b, n * 4) != 0) {
		for (size_t i = 0; i < n; i++)
			if (memcmp(&a[i], &b[i], 4) != 0) {
				fprintf(stderr,
				        "%s ws=2 rank %d: iall_reduce "
				        "differs from all_reduce at "
				        "index %zu: %a vs %a\n",
				        k->w->label, k->me, i, (double)b[i],
				        (double)a[i]);
				break;
			}
		m.bad++;
	}
	m.checked += (long long)n;

	/* In place, asynchronous, tested from the start. */
	memcpy(ip, x, n * 4);
	rc = hpucoll_iall_reduce(k->c, ip, ip, n, HPUCOLL_F32, HPUCOLL_SUM,
	                         &req);
	if (rc != HPUCOLL_OK)
		return fail_rc(k, &s, "iall_reduce in place", rc);
	done = 0;
	int chunks2 = 0;
	deadline = ct_now_ms() + 120000;
	while (!done && ct_now_ms() < deadline) {
		ok_chunks &= work_chunk(w, wn) == work_ref;
		chunks2++;
		if (hpucoll_test(req, &done) != HPUCOLL_OK)
			break;
	}
	rc = hpucoll_wait(&req);
	if (rc != HPUCOLL_OK)
		return fail_rc(k, &s, "wait (in place)", rc);
	if (!done || memcmp(a, ip, n * 4) != 0) {
		fprintf(stderr, "%s ws=2 rank %d: in-place iall_reduce: %s\n",
		        k->w->label, k->me,
		        done ? "differs from all_reduce" : "never seen done");
		m.bad++;
	}
	m.checked += (long long)n;
	snprintf(k->sh->note[k->me], sizeof(k->sh->note[k->me]),
	         "rank %d: %d chunks of work before hpucoll_test saw the "
	         "iall_reduce done (%d in place); result identical to the "
	         "blocking form: %s",
	         k->me, chunks, chunks2,
	         memcmp(a, b, n * 4) || memcmp(a, ip, n * 4) ? "no" : "yes");
	record(k, &m);
	free(x);
	free(a);
	free(b);
	free(ip);
	free(w);
	return 0;
}

/* ---- issue order: mixed async collectives complete in order ---- */

static const struct spec order_batch[] = {
    {C_ALL_REDUCE, HPUCOLL_F32, HPUCOLL_SUM, BIG_N, 0, 0},
    {C_REDUCE_SCATTER, HPUCOLL_I32, HPUCOLL_MAX, 7, 0, 0},
    {C_ALL_GATHER, HPUCOLL_U8, HPUCOLL_SUM, 4099, 1, 0},
    {C_BCAST, HPUCOLL_F64, HPUCOLL_SUM, 1, 0, 2},
    {C_REDUCE, HPUCOLL_BF16, HPUCOLL_MIN, 4099, 1, 1},
    {C_BARRIER, HPUCOLL_F32, HPUCOLL_SUM, 0, 0, 0},
    {C_ALL_REDUCE, HPUCOLL_I64, HPUCOLL_AVG, 7, 1, 0},
    {C_REDUCE_SCATTER, HPUCOLL_F16, HPUCOLL_AVG, 4099, 1, 0},
    {C_ALL_REDUCE, HPUCOLL_U8, HPUCOLL_MIN, 1, 0, 0},
};
#define NBATCH (sizeof(order_batch) / sizeof(order_batch[0]))

/* Issues the batch; with `blocking_after`, a blocking all_reduce follows
 * it and every request must be done when that returns. Otherwise polls
 * from the last request to the first until all are done: a request seen
 * done while an earlier one, polled after it, is not, completed out of
 * order. Then waits and checks every result. */
static int order_round(struct rk *k, int blocking_after, struct cmp *tot)
{
	struct run r[NBATCH];
	hpucoll_req *req[NBATCH] = {0};
	int done[NBATCH] = {0}, all = 0, rc;
	int64_t deadline = ct_now_ms() + 120000;
	struct cmp m;

	for (size_t i = 0; i < NBATCH; i++) {
		r[i].s = order_batch[i];
		if (prep(k, &r[i]) != 0) {
			fprintf(stderr, "rank %d: out of memory\n", k->me);
			return -1;
		}
	}
	for (size_t i = 0; i < NBATCH; i++) {
		rc = issue(k, &r[i], &req[i]);
		if (rc != HPUCOLL_OK)
			return fail_rc(k, &r[i].s, "issue", rc);
	}
	if (blocking_after) {
		struct spec s = {
		    C_ALL_REDUCE, HPUCOLL_F32, HPUCOLL_MAX, 7, 0, 0};

		if (run_one(k, &s) != 0)
			return -1;
		for (size_t i = 0; i < NBATCH; i++) {
			if (hpucoll_test(req[i], &done[i]) != HPUCOLL_OK ||
			    !done[i]) {
				fprintf(stderr,
				        "%s ws=%d rank %d: request %zu "
				        "(%s) not done after a blocking "
				        "collective issued after it\n",
				        k->w->label, k->ws, k->me, i,
				        coll_names[r[i].s.coll]);
				tot->bad++;
			}
		}
	}
	while (!all && ct_now_ms() < deadline) {
		all = 1;
		for (size_t i = NBATCH; i-- > 0;) {
			if (!done[i] &&
			    hpucoll_test(req[i], &done[i]) != HPUCOLL_OK) {
				fprintf(stderr,
				        "rank %d: hpucoll_test failed\n",
				        k->me);
				tot->bad++;
				done[i] = 1;
			}
			all &= done[i];
			for (size_t j = i + 1; j < NBATCH && !done[i]; j++) {
				if (done[j] && !tot->bad++)
					fprintf(stderr,
					        "%s ws=%d rank %d: "
					        "request %zu (%s) done "
					        "before request %zu (%s)\n",
					        k->w->label, k->ws, k->me, j,
					        coll_names[r[j].s.coll], i,
					        coll_names[r[i].s.coll]);
				if (done[j])
					break;
			}
		}
		if (!all)
			usleep(200);
	}
	if (!all) {
		fprintf(stderr,
		        "%s ws=%d rank %d: requests not done after "
		        "120 s\n",
		        k->w->label, k->ws, k->me);
		tot->bad++;
	}
	for (size_t i = 0; i < NBATCH; i++) {
		rc = hpucoll_wait(&req[i]);
		if (rc != HPUCOLL_OK)
			return fail_rc(k, &r[i].s, "wait", rc);
		check(k, &r[i], &m);
		tot->checked += m.checked + 1;
		tot->bad += m.bad;
		if (m.maxdiff > tot->maxdiff)
			tot->maxdiff = m.maxdiff;
		unprep(&r[i]);
	}
	return 0;
}

static int order(struct rk *k)
{
	struct spec s = {.coll = C_BARRIER};
	struct cmp m = {.k = k, .s = &s};
	int idx = 0;

	next_cfg(k, &idx);
	if (k->me == 0)
		snprintf(k->sh->name[k->cfg], NAME_MAX_,
		         "order: %zu mixed async collectives, then again "
		         "followed by a blocking one",
		         NBATCH);
	if (order_round(k, 0, &m) != 0 || order_round(k, 1, &m) != 0)
		return -1;
	record(k, &m);
	return 0;
}

/* ---- worlds ---- */

static void shm_path(char *buf, size_t len)
{
	snprintf(buf, len, "/dev/shm/hpucoll-%s-n0", job);
}

/* Whether this process maps the job's shared-memory segment (its name may
 * already be unlinked: the mapping still shows it, "(deleted)"). */
static int shm_mapped(void)
{
	char line[512], key[96];
	FILE *f = fopen("/proc/self/maps", "r");
	int found = 0;

	if (!f)
		return -1;
	snprintf(key, sizeof(key), "/dev/shm/hpucoll-%s-n0", job);
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, key) != NULL;
	fclose(f);
	return found;
}

/* The node of rank r: all on node 0, or split over two nodes, as
 * interleaved (r % 2) for even sizes and in two uneven runs (0 0 1, 0 0 0
 * 1 1, ...) for odd ones. */
static int node_of(const struct world *w, int r)
{
	if (!w->two_nodes)
		return 0;
	return w->ws % 2 == 0 ? r % 2 : r * 2 / w->ws;
}

/* What rank binds: TCP under TCP and between two nodes, else IPC. */
static void bind_ep(char *buf, size_t len, int tcp, int rank)
{
	char prefix[80];

	snprintf(prefix, sizeof(prefix), "%s-r", job);
	ct_bind_ep(buf, len, tcp, prefix, rank);
}

/* The world a rank runs in. */
struct child_arg {
	const struct world *w;
	struct shared *sh;
};

static int child(int rank, void *arg)
{
	const struct child_arg *a = arg;
	const struct world *w = a->w;
	struct shared *sh = a->sh;
	const char *eps[MAX_WS];
	int nodes[MAX_WS] = {0};
	struct rk k = {.sh = sh, .w = w, .me = rank, .ws = w->ws};
	char ep[CT_EP_MAX];
	int rc, bad = 0;

	if (w->ring) {
		/* The library's documented overrides (collectives/algo.c):
		 * ring (or, over two nodes, hierarchical) all-reduce, chain
		 * broadcast and ring reduce at every size, so that counts
		 * 1-4099 run those paths too. */
		setenv("HPUCOLL_ALGO", w->two_nodes ? "hier" : "ring", 1);
		setenv("HPUCOLL_SMALL_BYTES", "0", 1);
		setenv("HPUCOLL_BCAST_SMALL_BYTES", "0", 1);
		setenv("HPUCOLL_REDUCE_SMALL_BYTES", "0", 1);
	}
	for (int i = 0; i < w->ws; i++)
		nodes[i] = node_of(w, i);
	bind_ep(ep, sizeof(ep), w->tr == HPUCOLL_TRANSPORT_TCP || w->two_nodes,
	        rank);
	rc = hpucoll_comm_new(&k.c, rank, w->ws, ep);
	if (rc != HPUCOLL_OK) {
		fprintf(stderr, "rank %d: comm_new(%s): %s\n", rank, ep,
		        hpucoll_strerror(rc));
		return 1;
	}
	if (ct_eps_exchange(&sh->eps, rank, w->ws, hpucoll_comm_endpoint(k.c),
	                    eps, 60000) != 0) {
		hpucoll_comm_destroy(&k.c);
		return 1;
	}
	rc = hpucoll_comm_set_topology(k.c, nodes, job, w->tr);
	if (rc != HPUCOLL_OK) {
		fprintf(stderr, "rank %d: set_topology(%s): %s %s\n", rank,
		        w->label, hpucoll_strerror(rc),
		        hpucoll_comm_errmsg(k.c));
		hpucoll_comm_destroy(&k.c);
		return 1;
	}
	rc = hpucoll_comm_connect(k.c, eps);
	if (rc != HPUCOLL_OK) {
		fprintf(stderr, "rank %d: connect: %s %s\n", rank,
		        hpucoll_strerror(rc), hpucoll_comm_errmsg(k.c));
		hpucoll_comm_destroy(&k.c);
		return 1;
	}
	hpucoll_comm_set_timeout(k.c, COMM_TIMEOUT_MS);
	if (rank == 0)
		atomic_store(&sh->shm_seen, shm_mapped());
	switch (w->kind) {
	case K_SMALL:
		bad = small_matrix(&k) != 0;
		break;
	case K_BIG:
		bad = big_matrix(&k) != 0;
		break;
	case K_OVERLAP:
		bad = overlap(&k) != 0;
		break;
	case K_ORDER:
		bad = order(&k) != 0;
		break;
	}
	hpucoll_comm_destroy(&k.c);
	if (k.c != NULL) {
		fprintf(stderr, "rank %d: comm_destroy left the pointer set\n",
		        rank);
		bad = 1;
	}
	return bad;
}

/* Prints one line per configuration; returns how many failed. */
static int report(const struct world *w, const struct shared *sh)
{
	int ncfg = atomic_load(&sh->ncfg), failed = 0;

	for (int c = 0; c < ncfg; c++) {
		long long checked = 0;
		double maxdiff = 0;
		int bad = 0, missing = 0;
		char ranks[64] = "";
		size_t rl = 0;

		for (int r = 0; r < w->ws; r++) {
			const struct cstat *st = &sh->st[r][c];

			checked += st->checked;
			if (st->maxdiff > maxdiff)
				maxdiff = st->maxdiff;
			if (st->runs == 0)
				missing++;
			if (st->bad && rl < sizeof(ranks) - 4)
				rl += (size_t)snprintf(
				    ranks + rl, sizeof(ranks) - rl, " %d", r);
			bad += st->bad;
		}
		printf("%s ws=%d %-58s %s: %lld elements, maxdiff %g%s%s\n",
		       w->label, w->ws, sh->name[c],
		       bad || missing ? "FAILED" : "ok", checked, maxdiff,
		       bad ? ", mismatches on ranks" : "",
		       bad       ? ranks
		       : missing ? " (not run on every rank)"
		                 : "");
		failed += bad || missing;
	}
	for (int r = 0; r < w->ws; r++)
		if (sh->note[r][0])
			printf("%s ws=%d %s\n", w->label, w->ws, sh->note[r]);
	return failed;
}

static void run_world(void **state)
{
	const struct world *w = *state;
	struct shared *sh = ct_shared_new(sizeof(*sh));
	struct child_arg a = {w, sh};
	char ep[CT_EP_MAX], path[128];
	int crashed, failed, deadline, leftover, mapped, wrong_tr;

	snprintf(job, sizeof(job), "mx%dw%d", (int)getpid(), ++world_seq);
	deadline = w->kind == K_SMALL ? SMALL_DEADLINE_MS : BIG_DEADLINE_MS;
	crashed = ct_run_ranks(w->ws, child, &a, deadline, 0);
	failed = report(w, sh);
	shm_path(path, sizeof(path));
	leftover = access(path, F_OK) == 0;
	/* The transport forced is the one used: shared memory is mapped
	 * under SHM (from 2 ranks up) and not under TCP or IPC. */
	mapped = atomic_load(&sh->shm_seen);
	wrong_tr = crashed == 0 && w->ws > 1 && !w->two_nodes &&
	           mapped != (w->tr == HPUCOLL_TRANSPORT_SHM);
	if (w->ws > 1)
		printf("%s ws=%d: rank 0 %s the segment hpucoll-%s-n0\n",
		       w->label, w->ws, mapped ? "mapped" : "did not map", job);
	if (wrong_tr)
		fprintf(stderr,
		        "%s ws=%d: transport %s forced, but rank 0 "
		        "%s shared memory\n",
		        w->label, w->ws, tr_name(w->tr),
		        mapped ? "mapped" : "did not map");
	if (leftover)
		fprintf(stderr,
		        "%s ws=%d: %s left behind after every rank "
		        "destroyed its communicator\n",
		        w->label, w->ws, path);
	if (w->two_nodes) {
		snprintf(path, sizeof(path), "/dev/shm/hpucoll-%s-n1", job);
		if (access(path, F_OK) == 0) {
			fprintf(stderr, "%s ws=%d: %s left behind\n", w->label,
			        w->ws, path);
			leftover = 1;
		}
		unlink(path);
		shm_path(path, sizeof(path));
	}
	/* Clean up what a failed world left, so that the next runs clean. */
	unlink(path);
	for (int r = 0; r < w->ws; r++) {
		bind_ep(ep, sizeof(ep), 0, r);
		unlink(ep + strlen("ipc://"));
	}
	ct_shared_free(sh, sizeof(*sh));
	if (crashed)
		fprintf(stderr, "%s ws=%d: %d rank(s) failed or crashed\n",
		        w->label, w->ws, crashed);
	assert_int_equal(crashed, 0);
	assert_int_equal(failed, 0);
	assert_false(crashed == 0 && leftover);
	assert_false(wrong_tr);
}

/* ---- tests ---- */

#define NTR 3
static const hpucoll_transport transports[NTR] = {
    HPUCOLL_TRANSPORT_SHM, HPUCOLL_TRANSPORT_TCP, HPUCOLL_TRANSPORT_IPC};
static const int big_ws[] = {2, 3, 8};
#define NBIG (sizeof(big_ws) / sizeof(big_ws[0]))

#define NTESTS (NTR * (2 * MAX_WS + NBIG + 2) + 2 * MAX_WS + 2)
static struct world worlds[NTESTS];
static char names[NTESTS][48];
static size_t nworlds;

static void add(hpucoll_transport tr, int ws, enum kind kind, int ring,
                int two_nodes)
{
	static const char *const kinds[] = {"matrix", "big", "overlap",
	                                    "order"};
	struct world *w = &worlds[nworlds];

	*w = (struct world){tr, ws, kind, ring, two_nodes, ""};
	snprintf(w->label, sizeof(w->label), "%s%s%s", tr_name(tr),
	         two_nodes ? " 2 nodes" : "",
	         !ring       ? ""
	         : two_nodes ? " hier"
	                     : " ring");
	snprintf(names[nworlds], sizeof(names[nworlds]), "%s_%s%s%s_ws%d",
	         kinds[kind], tr_name(tr), two_nodes ? "_2nodes" : "",
	         !ring       ? ""
	         : two_nodes ? "_hier"
	                     : "_ring",
	         ws);
	nworlds++;
}

int main(int argc, char **argv)
{
	struct CMUnitTest tests[NTESTS];
	const char *filter = argc > 1 ? argv[1] : NULL;

	/* Each transport in turn: the matrix at small counts with the
	 * library's own algorithm choice, then with ring / chain forced;
	 * count 4M+3; overlap; issue order. Then shared memory within two
	 * nodes and TCP between them (the hierarchical paths). */
	for (int t = 0; t < NTR; t++) {
		for (int ws = 1; ws <= MAX_WS; ws++)
			add(transports[t], ws, K_SMALL, 0, 0);
		for (int ws = 1; ws <= MAX_WS; ws++)
			add(transports[t], ws, K_SMALL, 1, 0);
		for (size_t b = 0; b < NBIG; b++)
			add(transports[t], big_ws[b], K_BIG, 0, 0);
		add(transports[t], 2, K_OVERLAP, 0, 0);
		add(transports[t], 3, K_ORDER, 0, 0);
	}
	for (int ws = 2; ws <= MAX_WS; ws++)
		add(HPUCOLL_TRANSPORT_SHM, ws, K_SMALL, 0, 1);
	for (int ws = 2; ws <= MAX_WS; ws++)
		add(HPUCOLL_TRANSPORT_SHM, ws, K_SMALL, 1, 1);
	add(HPUCOLL_TRANSPORT_SHM, 3, K_BIG, 0, 1);
	add(HPUCOLL_TRANSPORT_SHM, 8, K_BIG, 0, 1);
	size_t m = 0;
	for (size_t i = 0; i < nworlds; i++) {
		/* An optional argument runs only the tests whose name
		 * contains it (e.g. "matrix_shm", "big", "overlap"). */
		if (filter && !strstr(names[i], filter))
			continue;
		tests[m++] = (struct CMUnitTest){
		    .name = names[i],
		    .test_func = run_world,
		    .initial_state = &worlds[i],
		};
	}
	return _cmocka_run_group_tests("coll_matrix", tests, m, NULL, NULL);
}
