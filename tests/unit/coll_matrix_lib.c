/* coll_matrix_lib: see coll_matrix_lib.h. */
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

#include "tests/unit/coll_matrix_lib.h"

#define SENTINEL 0xA5 /* recvbuf bytes before a collective */
#define GARBAGE 0x3C  /* non-root broadcast sendbuf bytes: never read */

const char *const mx_coll_names[] = {"all_reduce", "reduce_scatter", "reduce",
                                     "all_gather", "broadcast",      "barrier"};
const hpucoll_transport mx_transports[MX_NTR] = {
    HPUCOLL_TRANSPORT_SHM, HPUCOLL_TRANSPORT_TCP, HPUCOLL_TRANSPORT_IPC};

static int world_seq;
static char job[64];

static const char *tr_name(hpucoll_transport t)
{
	static const char *const n[] = {"auto", "tcp", "ipc", "shm"};

	return (unsigned)t < 4 ? n[t] : "?";
}

/* ---- values: small integers, exact in every dtype ---- */

uint32_t mx_mix(size_t i, uint32_t salt)
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
	uint32_t h = mx_mix(i, (uint32_t)r + 1);

	if (op == HPUCOLL_AVG && ct_is_float(dt)) {
		int64_t b = span(mx_mix(i, 0x7777), amp / 2);
		int64_t k = below(mx_mix(i, 0x1000u + (uint32_t)r / 2),
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
		       span(mx_mix(i, (uint32_t)r + 99), 1000);
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
	int n =
	    snprintf(buf, len, "%s ws=%d rank %d: %s %s", k->w->label, k->ws,
	             k->me, mx_coll_names[s->coll], ct_dtype_names[s->dt]);

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

void mx_unprep(struct run *r)
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

int mx_prep(const struct rk *k, struct run *r)
{
	return prep_bufs(k, r) == 0 ? keep_copy(k, r) : -1;
}

/* Starts r (asynchronously when req is not NULL). */
int mx_issue(struct rk *k, struct run *r, hpucoll_req **req)
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
void mx_check(const struct rk *k, struct run *r, struct cmp *m)
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

void mx_record(struct rk *k, const struct cmp *m)
{
	struct cstat *st = &k->sh->st[k->me][k->cfg];

	st->checked += m->checked;
	st->runs++;
	st->bad += m->bad != 0;
	if (m->maxdiff > st->maxdiff)
		st->maxdiff = m->maxdiff;
}

int mx_fail_rc(struct rk *k, const struct spec *s, const char *call, int rc)
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
int mx_run_one(struct rk *k, const struct spec *s)
{
	struct run r = {.s = *s};
	struct cmp m;
	int rc;

	if (mx_prep(k, &r) != 0) {
		fprintf(stderr, "rank %d: out of memory\n", k->me);
		mx_unprep(&r);
		k->fatal = 1;
		return -1;
	}
	rc = mx_issue(k, &r, NULL);
	if (rc != HPUCOLL_OK) {
		mx_unprep(&r);
		return mx_fail_rc(k, s, mx_coll_names[s->coll], rc);
	}
	mx_check(k, &r, &m);
	mx_record(k, &m);
	mx_unprep(&r);
	return 0;
}

/* Configuration index, kept by every rank in step (no shared counter
 * read races: each rank counts for itself). */
int mx_next_cfg(struct rk *k, int *idx)
{
	if (*idx >= MAX_CFG)
		return -1;
	k->cfg = (*idx)++;
	if (k->me == 0)
		atomic_store(&k->sh->ncfg, *idx);
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
	bad = w->body(&k) != 0;
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
	int crashed, failed, leftover, mapped, wrong_tr;

	snprintf(job, sizeof(job), "mx%dw%d", (int)getpid(), ++world_seq);
	crashed = ct_run_ranks(w->ws, child, &a, w->deadline_ms, 0);
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

/* ---- registering and running the worlds ---- */

#define NTESTS 96
static struct world worlds[NTESTS];
static char names[NTESTS][48];
static size_t nworlds;

void mx_add(hpucoll_transport tr, int ws, const char *kind, mx_body body,
            int deadline_ms, int ring, int two_nodes)
{
	struct world *w = &worlds[nworlds];

	assert_true(nworlds < NTESTS);
	*w = (struct world){tr, ws, body, deadline_ms, ring, two_nodes, ""};
	snprintf(w->label, sizeof(w->label), "%s%s%s", tr_name(tr),
	         two_nodes ? " 2 nodes" : "",
	         !ring       ? ""
	         : two_nodes ? " hier"
	                     : " ring");
	snprintf(names[nworlds], sizeof(names[nworlds]), "%s_%s%s%s_ws%d", kind,
	         tr_name(tr), two_nodes ? "_2nodes" : "",
	         !ring       ? ""
	         : two_nodes ? "_hier"
	                     : "_ring",
	         ws);
	nworlds++;
}

int mx_run(const char *group, int argc, char **argv)
{
	static struct CMUnitTest tests[NTESTS];
	const char *filter = argc > 1 ? argv[1] : NULL;
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
	return _cmocka_run_group_tests(group, tests, m, NULL, NULL);
}
