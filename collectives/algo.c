/* The choice of algorithm for each collective, and how they run: the
 * patterns themselves are in patterns.c.
 *
 *   all_reduce      recursive doubling up to HPUCOLL_SMALL_BYTES, a ring
 *                   (reduce-scatter then all-gather) above; hierarchical
 *                   when the ranks of each node share memory, there are
 *                   several nodes and every node has as many ranks: ring
 *                   reduce-scatter inside the node (local rank i gets
 *                   chunk i), all-reduce of chunk i among the ranks of
 *                   local index i across nodes over ZeroMQ, ring
 *                   all-gather inside the node;
 *   reduce_scatter  ring;
 *   all_gather      ring;
 *   broadcast       binomial tree up to HPUCOLL_BCAST_SMALL_BYTES, else a
 *                   pipelined chain root, root + 1, ...;
 *   reduce          binomial tree up to HPUCOLL_REDUCE_SMALL_BYTES, else
 *                   ring reduce-scatter and a gather to the root;
 *   barrier         dissemination.
 *
 * Every rank ends with the same bytes: a ring or tree result is computed
 * once and copied; recursive-doubling partners combine in the same operand
 * order (lower rank first), and AVG divides where the sum is final.
 *
 * Environment (read at hpucoll_comm_new; must be the same on every rank):
 *   HPUCOLL_ALGO=auto|ring|rd|hier   all_reduce algorithm (auto)
 *   HPUCOLL_SMALL_BYTES=N            all_reduce: recursive doubling up to
 *                                    N bytes (default SMALL_BYTES_SHM
 *                                    when all the ranks involved share
 *                                    memory, else SMALL_BYTES_NET)
 *   HPUCOLL_BCAST_SMALL_BYTES=N      broadcast: tree up to N bytes
 *                                    (BCAST_SMALL_BYTES)
 *   HPUCOLL_REDUCE_SMALL_BYTES=N     reduce: tree up to N bytes
 *                                    (REDUCE_SMALL_BYTES_SHM / _NET)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/env.h"
#include "common/num.h"
#include "collectives/patterns.h"

/* The switch points, measured on this machine (AMD EPYC, 2 cores, 23 GB;
 * ranks forked on one node; float sum, out of place): each algorithm was
 * forced through the environment variables above and timed over sizes 8 B
 * to 4 MiB by powers of two, 3 runs taken only while no other process was
 * runnable, the minimum kept. Reduce and broadcast were timed followed by
 * a barrier, because back-to-back calls pipeline. Times in microseconds.
 *
 * all_reduce, shared memory, 2 ranks (rd / ring):
 *   1 KiB 0.26 / 0.38, 2 KiB 0.42 / 0.40, 4 KiB 0.71 / 0.55,
 *   64 KiB 9.4 / 6.1, 1 MiB 77 / 60, 4 MiB 389 / 285.
 * Three or four ranks on two cores are oversubscribed: every step waits
 * for a descheduled rank, so fewer steps win (rd up to 1 MiB); that says
 * nothing about a node with a core per rank and is not used.
 * all_reduce, TCP (rd / ring): 2 ranks 256 KiB 202 / 232, 512 KiB
 * 421 / 257; 3 ranks 1 MiB 717 / 1206, 2 MiB 3922 / 2915; 4 ranks
 * 256 KiB 789 / 817, 512 KiB 1528 / 1145.
 * reduce, shared memory, 2 ranks (tree / ring + gather): 1 KiB 0.31 / 0.39,
 * 2 KiB 0.57 / 0.44, 128 KiB 19 / 16, 2 MiB 129 / 105. TCP, 2 to 4
 * ranks: the tree wins up to 1 MiB (4 ranks 1 MiB 827 / 1555), the ring
 * from 2 MiB (3 ranks 3163 / 1634) or 4 MiB (2 ranks 1372 / 934).
 * broadcast (tree / chain): TCP, 3 ranks 8 KiB 140 / 198, 1 MiB 554 / 534,
 * 2 MiB 1307 / 1249; 4 ranks 1 MiB 820 / 845, 2 MiB 1773 / 1414; on shared
 * memory (3 and 4 ranks, oversubscribed) the two stay within the noise.
 * hierarchical all_reduce, 4 ranks as 2 nodes of 2 (hier / ring / rd):
 * 4 KiB 149 / 233 / 106, 128 KiB 248 / 376 / 251, 1 MiB 859 / 2496 / 1765,
 * 16 MiB 11796 / 23967 / 33890: above SMALL_BYTES_NET it is used.
 */
#define SMALL_BYTES_NET (256u * 1024u)
#define SMALL_BYTES_SHM (2u * 1024u)
#define BCAST_SMALL_BYTES (1024u * 1024u)
#define REDUCE_SMALL_BYTES_NET (1024u * 1024u)
#define REDUCE_SMALL_BYTES_SHM (1024u)

/* ---- Tuning ---- */

static int size_from_env(hpucoll_comm *c, hpu_env_id id, size_t *out)
{
	const char *s = hpu__env_str(id);
	uint64_t v;

	if (s == NULL || *s == '\0')
		return HPUCOLL_OK;
	if (hpu__parse_u64(s, 0, SIZE_MAX, &v) != HPU_NUM_OK) {
		hpucoll__set_error(c, "%s='%s' is not a number of bytes", hpu__env_name(id), s);
		return HPUCOLL_EENV;
	}
	*out = (size_t)v;
	return HPUCOLL_OK;
}

int hpucoll__tune_from_env(hpucoll_comm *c)
{
	static const char *const names[] = {"ring", "rd", NULL, "hier"};
	const char *s = hpu__env_str(HPU_ENV_HPUCOLL_ALGO);
	struct hpucoll__tune *t = &c->tune;

	t->algo = -1;
	t->small_bytes[0] = SMALL_BYTES_NET;
	t->small_bytes[1] = SMALL_BYTES_SHM;
	t->bcast_small = BCAST_SMALL_BYTES;
	t->reduce_small[0] = REDUCE_SMALL_BYTES_NET;
	t->reduce_small[1] = REDUCE_SMALL_BYTES_SHM;
	if (s != NULL && *s != '\0' && strcmp(s, "auto") != 0) {
		for (int i = 0; i < 4 && t->algo < 0; i++) {
			if (names[i] != NULL && strcmp(s, names[i]) == 0)
				t->algo = i;
		}
		if (t->algo < 0) {
			hpucoll__set_error(c, "HPUCOLL_ALGO='%s' is not one of auto, ring, rd, hier",
					   s);
			return HPUCOLL_EENV;
		}
	}
	if (size_from_env(c, HPU_ENV_HPUCOLL_SMALL_BYTES, &t->small_bytes[0]) ||
	    size_from_env(c, HPU_ENV_HPUCOLL_SMALL_BYTES, &t->small_bytes[1]) ||
	    size_from_env(c, HPU_ENV_HPUCOLL_BCAST_SMALL_BYTES, &t->bcast_small) ||
	    size_from_env(c, HPU_ENV_HPUCOLL_REDUCE_SMALL_BYTES, &t->reduce_small[0]) ||
	    size_from_env(c, HPU_ENV_HPUCOLL_REDUCE_SMALL_BYTES, &t->reduce_small[1]))
		return HPUCOLL_EENV;
	return HPUCOLL_OK;
}

/* ---- Groups ---- */

static size_t min_size(size_t a, size_t b)
{
	return a < b ? a : b;
}

static int grank(const struct hpucoll__group *g, int i)
{
	return g->ranks != NULL ? g->ranks[i] : i;
}

static int cmp_node(const void *a, const void *b, void *ids);

/* Sets g->seg, the largest message between any two members (the smallest
 * link_max over pairs that share a node; the other pairs use ZeroMQ), and
 * g->shm_only. */
static int group_links(const hpucoll_comm *c, struct hpucoll__group *g)
{
	int *order;

	g->seg = HPUCOLL__SEG_BYTES;
	g->shm_only = 0;
	if (c->node_ids == NULL || g->n < 2)
		return HPUCOLL_OK;
	order = malloc((size_t)g->n * sizeof(*order));
	if (order == NULL)
		return HPUCOLL_ENOMEM;
	for (int i = 0; i < g->n; i++)
		order[i] = grank(g, i);
	qsort_r(order, (size_t)g->n, sizeof(*order), cmp_node, c->node_ids);
	for (int i = 0; i + 1 < g->n; i++) {
		if (c->node_ids[order[i]] == c->node_ids[order[i + 1]])
			g->seg = min_size(g->seg, hpucoll__link_max(
							  c, order[i],
							  order[i + 1]));
	}
	g->shm_only = g->seg < HPUCOLL__SEG_BYTES &&
		      c->node_ids[order[0]] == c->node_ids[order[g->n - 1]];
	free(order);
	return HPUCOLL_OK;
}

static int cmp_node(const void *a, const void *b, void *ids)
{
	const int *node = ids;
	int x = node[*(const int *)a], y = node[*(const int *)b];

	return (x > y) - (x < y);
}

/* Numbers the nodes by their lowest rank and checks that every node has
 * the same number of ranks; fills the local and cross groups. */
static int hier_groups(hpucoll_comm *c)
{
	int n = c->size, *nodes, *count, nn = 0, me_node = -1, li = -1;
	int rc = HPUCOLL_ENOMEM;

	nodes = malloc((size_t)n * sizeof(*nodes)); /* node index of rank */
	count = calloc((size_t)n, sizeof(*count));  /* ranks per node */
	if (nodes == NULL || count == NULL)
		goto out;
	for (int i = 0; i < n; i++) {
		int j = 0;

		while (j < i && c->node_ids[j] != c->node_ids[i])
			j++;
		nodes[i] = j < i ? nodes[j] : nn++;
		if (i == c->rank) {
			me_node = nodes[i];
			li = count[nodes[i]];
		}
		count[nodes[i]]++;
	}
	rc = HPUCOLL_OK;
	for (int k = 1; k < nn; k++) {
		if (count[k] != count[0])
			goto out; /* uneven nodes: the flat algorithms */
	}
	/* Worth it only when the ranks of a node share memory. */
	if (nn < 2 || count[0] < 2 ||
	    (c->transport != HPUCOLL_TRANSPORT_AUTO &&
	     c->transport != HPUCOLL_TRANSPORT_SHM))
		goto out;
	c->local.n = count[0];
	c->cross.n = nn;
	c->local.ranks = malloc((size_t)count[0] * sizeof(int));
	c->cross.ranks = malloc((size_t)nn * sizeof(int));
	if (c->local.ranks == NULL || c->cross.ranks == NULL) {
		rc = HPUCOLL_ENOMEM;
		goto out;
	}
	memset(count, 0, (size_t)n * sizeof(*count));
	for (int i = 0; i < n; i++) {
		int k = nodes[i], l = count[k]++;

		if (k == me_node)
			c->local.ranks[l] = i;
		if (l == li)
			c->cross.ranks[k] = i;
	}
	c->local.me = li;
	c->cross.me = me_node;
	c->hier_ok = 1;
out:
	free(nodes);
	free(count);
	return rc;
}

int hpucoll__groups_init(hpucoll_comm *c)
{
	int rc = HPUCOLL_OK;

	c->all.n = c->size;
	c->all.me = c->rank;
	c->all.ranks = NULL;
	if (c->node_ids != NULL)
		rc = hier_groups(c);
	if (rc != HPUCOLL_OK)
		return rc;
	rc = group_links(c, &c->all);
	if (rc == HPUCOLL_OK)
		rc = group_links(c, &c->local);
	if (rc == HPUCOLL_OK)
		rc = group_links(c, &c->cross);
	return rc;
}

void hpucoll__groups_free(hpucoll_comm *c)
{
	free(c->local.ranks);
	free(c->cross.ranks);
	c->local.ranks = NULL;
	c->cross.ranks = NULL;
	c->hier_ok = 0;
}

/* ---- The collectives ---- */

static int no_memory(hpucoll_comm *c, size_t bytes)
{
	hpucoll__set_error(c, "%s: out of memory (%zu bytes).", c->what,
			   bytes);
	return HPUCOLL_ENOMEM;
}

static void set_kind(hpucoll_comm *c, int kind, int algo)
{
	c->kind = (uint8_t)(kind | algo << 4);
}

/* all_reduce of `count` elements over g, `in` to `out` (may be equal). */
static int all_reduce_on(hpucoll_comm *c, const struct hpucoll__group *g,
			 const struct hpucoll__red *r, const unsigned char *in,
			 unsigned char *out, size_t count, int algo)
{
	struct hpucoll__ring rg = {
		.c = c, .g = g, .r = *r, .count = count, .in = in, .out = out,
		.reduce = 1, .gather = 1,
	};

	if (g->n == 1 || count == 0) {
		if (in != out)
			memcpy(out, in, count * r->es);
		if (r->divisor > 0)
			hpucoll__divide(r->dt, out, count, r->divisor);
		return HPUCOLL_OK;
	}
	set_kind(c, HPUCOLL__ALL_REDUCE, algo);
	if (algo == HPUCOLL__ALGO_RD) {
		if (in != out)
			memcpy(out, in, count * r->es);
		return hpucoll__rd_all_reduce(c, g, r, out, count);
	}
	return hpucoll__ring_run(&rg);
}

static int pick_flat(const hpucoll_comm *c, const struct hpucoll__group *g,
		     size_t bytes)
{
	if (c->tune.algo == HPUCOLL__ALGO_RING ||
	    c->tune.algo == HPUCOLL__ALGO_RD)
		return c->tune.algo;
	return bytes <= c->tune.small_bytes[g->shm_only] ? HPUCOLL__ALGO_RD
							 : HPUCOLL__ALGO_RING;
}

/* Ring reduce-scatter inside the node (local member i gets chunk i), an
 * all-reduce of that chunk across nodes, ring all-gather inside the
 * node. */
static int hier_all_reduce(hpucoll_comm *c, const struct hpucoll__red *r,
			   const unsigned char *in, unsigned char *out,
			   size_t count)
{
	struct hpucoll__red sum = *r;
	struct hpucoll__ring rg = {
		.c = c, .g = &c->local, .r = *r, .count = count, .in = in,
		.out = out, .shift = -1, .reduce = 1,
	};
	size_t e, l;
	int rc;

	rg.r.divisor = 0;
	set_kind(c, HPUCOLL__ALL_REDUCE, HPUCOLL__ALGO_HIER);
	rc = hpucoll__ring_run(&rg);
	if (rc != HPUCOLL_OK)
		return rc;
	hpucoll__split(count, (size_t)c->local.n, (size_t)c->local.me, &e, &l);
	sum.divisor = r->divisor;
	rc = all_reduce_on(c, &c->cross, &sum, out + e * r->es,
			   out + e * r->es, l,
			   pick_flat(c, &c->cross, l * r->es));
	if (rc != HPUCOLL_OK)
		return rc;
	set_kind(c, HPUCOLL__ALL_REDUCE, HPUCOLL__ALGO_HIER);
	rg.in = NULL;
	rg.reduce = 0;
	rg.gather = 1;
	return hpucoll__ring_run(&rg);
}

static int run_all_reduce(hpucoll_comm *c, const struct hpucoll__args *a,
			  const struct hpucoll__red *r)
{
	size_t bytes = a->count * r->es;
	int algo = c->tune.algo;

	if (algo == HPUCOLL__ALGO_HIER && !c->hier_ok)
		algo = -1;
	if (algo < 0 && c->hier_ok && bytes > c->tune.small_bytes[0])
		algo = HPUCOLL__ALGO_HIER;
	if (algo == HPUCOLL__ALGO_HIER && c->size > 1 && a->count > 0)
		return hier_all_reduce(c, r, a->sendbuf, a->recvbuf, a->count);
	return all_reduce_on(c, &c->all, r, a->sendbuf, a->recvbuf, a->count,
			     pick_flat(c, &c->all, bytes));
}

static int run_reduce_scatter(hpucoll_comm *c, const struct hpucoll__args *a,
			      const struct hpucoll__red *r)
{
	size_t bytes = a->count * r->es;
	struct hpucoll__ring rg = {
		.c = c, .g = &c->all, .r = *r, .count = a->count * c->size,
		.in = a->sendbuf, .out = a->recvbuf,
		.base = (size_t)c->rank * bytes, .shift = -1, .reduce = 1,
	};

	if (c->size == 1) {
		if (a->sendbuf != a->recvbuf)
			memcpy(a->recvbuf, a->sendbuf, bytes);
		return HPUCOLL_OK;
	}
	return hpucoll__ring_run(&rg);
}

static int run_all_gather(hpucoll_comm *c, const struct hpucoll__args *a,
			  size_t es)
{
	size_t bytes = a->count * es;
	unsigned char *mine = (unsigned char *)a->recvbuf + c->rank * bytes;
	struct hpucoll__ring rg = {
		.c = c, .g = &c->all, .r = {.es = es},
		.count = a->count * c->size, .out = a->recvbuf, .shift = -1,
		.gather = 1,
	};

	if (mine != a->sendbuf)
		memcpy(mine, a->sendbuf, bytes);
	if (c->size == 1)
		return HPUCOLL_OK;
	return hpucoll__ring_run(&rg);
}

static int run_broadcast(hpucoll_comm *c, const struct hpucoll__args *a,
			 size_t es)
{
	size_t bytes = a->count * es;
	int chain = bytes > c->tune.bcast_small;

	set_kind(c, HPUCOLL__BROADCAST,
		 chain ? HPUCOLL__ALGO_RING : HPUCOLL__ALGO_TREE);
	return hpucoll__bcast(c, &c->all, a->root, a->sendbuf, a->recvbuf,
			      bytes, chain);
}

static int run_reduce(hpucoll_comm *c, const struct hpucoll__args *a,
		      const struct hpucoll__red *r)
{
	size_t bytes = a->count * r->es;
	unsigned char *acc = a->recvbuf;

	if (c->size > 1 && bytes > c->tune.reduce_small[c->all.shm_only]) {
		set_kind(c, HPUCOLL__REDUCE, HPUCOLL__ALGO_RING);
		return hpucoll__ring_reduce(c, &c->all, r, a->root,
					    a->sendbuf, a->recvbuf, a->count);
	}
	set_kind(c, HPUCOLL__REDUCE, HPUCOLL__ALGO_TREE);
	if (c->rank != a->root) {
		acc = hpucoll__scratch(c, bytes);
		if (acc == NULL)
			return no_memory(c, bytes);
	}
	return hpucoll__tree_reduce(c, &c->all, r, a->root, a->sendbuf, acc,
				    a->count);
}

static int has_op(int kind)
{
	return kind == HPUCOLL__ALL_REDUCE || kind == HPUCOLL__REDUCE ||
	       kind == HPUCOLL__REDUCE_SCATTER;
}

/* [a, a + alen) and [b, b + blen) share a byte. */
static int overlap(const void *a, size_t alen, const void *b, size_t blen)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

	return alen > 0 && blen > 0 && x < y + blen && y < x + alen;
}

static const void *at(const void *p, size_t off)
{
	return p == NULL ? NULL : (const char *)p + off;
}

static int bad(hpucoll_comm *c, const struct hpucoll__args *a,
	       const char *what)
{
	hpucoll__set_error(c, "%s: %s.", hpucoll__kind_name(a->kind), what);
	return HPUCOLL_EINVAL;
}

/* Checks buffers; `sbytes` and `rbytes` are the sizes of send and receive
 * buffers; `inplace` says that they are placed as in place. */
static int check_bufs(hpucoll_comm *c, const struct hpucoll__args *a,
		      size_t sbytes, size_t rbytes, int inplace, int need_send,
		      int need_recv)
{
	if (need_send && a->sendbuf == NULL && sbytes > 0)
		return bad(c, a, "the send buffer is NULL");
	if (need_recv && a->recvbuf == NULL && rbytes > 0)
		return bad(c, a, "the receive buffer is NULL");
	if (need_send && need_recv && !inplace &&
	    overlap(a->sendbuf, sbytes, a->recvbuf, rbytes))
		return bad(c, a, "the buffers overlap but are not in place");
	return HPUCOLL_OK;
}

int hpucoll__check_args(hpucoll_comm *c, const struct hpucoll__args *a)
{
	size_t es = hpucoll_dtype_size(a->dtype), n = (size_t)c->size, bytes;
	int root = a->kind == HPUCOLL__BROADCAST || a->kind == HPUCOLL__REDUCE;
	int me = c->rank, same;

	if (c->peers == NULL) {
		hpucoll__set_error(c, "%s: rank %d is not connected yet.",
				   hpucoll__kind_name(a->kind), c->rank);
		return HPUCOLL_EINVAL;
	}
	if (a->kind == HPUCOLL__BARRIER)
		return HPUCOLL_OK;
	if (es == 0)
		return bad(c, a, "invalid dtype");
	if (has_op(a->kind) && (unsigned)a->op >= HPUCOLL_NUM_OPS)
		return bad(c, a, "invalid op");
	if (root && (a->root < 0 || a->root >= c->size)) {
		hpucoll__set_error(c, "%s: invalid root %d (size %d).",
				   hpucoll__kind_name(a->kind), a->root,
				   c->size);
		return HPUCOLL_EINVAL;
	}
	if (a->count > SIZE_MAX / es / n || a->count * es * n > INT64_MAX)
		return bad(c, a, "count too large");
	bytes = a->count * es;
	same = a->sendbuf == a->recvbuf;
	switch (a->kind) {
	case HPUCOLL__ALL_REDUCE:
		return check_bufs(c, a, bytes, bytes, same, 1, 1);
	case HPUCOLL__REDUCE_SCATTER:
		return check_bufs(c, a, bytes * n, bytes,
				  a->recvbuf == at(a->sendbuf, me * bytes), 1,
				  1);
	case HPUCOLL__ALL_GATHER:
		return check_bufs(c, a, bytes, bytes * n,
				  a->sendbuf == at(a->recvbuf, me * bytes), 1,
				  1);
	case HPUCOLL__BROADCAST:
		return check_bufs(c, a, bytes, bytes, same, me == a->root, 1);
	default:
		return check_bufs(c, a, bytes, bytes, same, 1, me == a->root);
	}
}

/* Starts a collective: checks that the communicator can run one, records
 * what runs for error messages and gives it the next sequence number. */
static int begin(hpucoll_comm *c, const struct hpucoll__args *a)
{
	c->what = hpucoll__kind_name(a->kind);
	if (c->failed != HPUCOLL_OK)
		return c->failed;
	c->kind = a->kind;
	c->arg = 0;
	if (a->kind != HPUCOLL__BARRIER)
		c->arg = (uint8_t)((unsigned)a->dtype << 4);
	if (has_op(a->kind))
		c->arg |= (uint8_t)a->op;
	c->root = a->kind == HPUCOLL__BROADCAST || a->kind == HPUCOLL__REDUCE
			  ? a->root
			  : -1;
	c->seq++;
	c->stall_warned = 0;
	return HPUCOLL_OK;
}

/* Ends a collective. After a failure the ranks no longer agree on what
 * comes next on the wire, so the communicator stays failed: later
 * collectives return the same error and errmsg keeps its cause. */
static int end(hpucoll_comm *c, int rc)
{
	if (rc == HPUCOLL_OK)
		rc = hpucoll__fence(c);
	if (rc != HPUCOLL_OK) {
		c->failed = rc;
		hpucoll__fail_transport(c, rc);
	}
	return rc;
}

/* Runs the algorithm chosen for the collective's kind and size. */
static int run_kind(hpucoll_comm *c, const struct hpucoll__args *a,
		    struct hpucoll__red *r)
{
	switch (a->kind) {
	case HPUCOLL__ALL_REDUCE:
		return run_all_reduce(c, a, r);
	case HPUCOLL__REDUCE_SCATTER:
		return run_reduce_scatter(c, a, r);
	case HPUCOLL__ALL_GATHER:
		return run_all_gather(c, a, r->es);
	case HPUCOLL__BROADCAST:
		return run_broadcast(c, a, r->es);
	case HPUCOLL__REDUCE:
		if (c->size > 1)
			return run_reduce(c, a, r);
		r->divisor = 0;
		return all_reduce_on(c, &c->all, r, a->sendbuf, a->recvbuf,
				     a->count, 0);
	default:
		return hpucoll__dissemination(c, &c->all);
	}
}

static int run_one(hpucoll_comm *c, const struct hpucoll__args *a);

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The algorithm of the collective that just ran, from c->kind (what the
 * top level chose: the hierarchical all-reduce ends with its own). */
static const char *algo_name(const hpucoll_comm *c, int kind)
{
	int algo = c->kind >> 4;

	if (c->size == 1)
		return "local";
	switch (kind) {
	case HPUCOLL__BARRIER:
		return "dissemination";
	case HPUCOLL__BROADCAST:
		return algo == HPUCOLL__ALGO_TREE ? "binomial_tree" : "chain";
	case HPUCOLL__REDUCE:
		return algo == HPUCOLL__ALGO_TREE     ? "binomial_tree"
		       : algo == HPUCOLL__ALGO_GATHER ? "ring_gather"
		       : algo == HPUCOLL__ALGO_RD     ? "recursive_doubling"
						      : "ring";
	default:
		return algo == HPUCOLL__ALGO_RD     ? "recursive_doubling"
		       : algo == HPUCOLL__ALGO_HIER ? "hierarchical"
						    : "ring";
	}
}

/* Tells the trace hook about the collective that ran from t0. */
static void trace(hpucoll_comm *c, const struct hpucoll__args *a, int64_t t0,
		  uint64_t sent0, int rc)
{
	size_t es = hpucoll_dtype_size(a->dtype);
	uint64_t bytes = (uint64_t)a->count * es;

	if (a->kind == HPUCOLL__REDUCE_SCATTER || a->kind == HPUCOLL__ALL_GATHER)
		bytes *= (uint64_t)c->size;
	if (a->kind == HPUCOLL__BARRIER)
		bytes = 0;
	hpucoll_event ev = {
		.name = hpucoll__kind_name(a->kind),
		.algorithm = algo_name(c, a->kind),
		.seq = c->seq,
		.bytes = bytes,
		.sent = atomic_load_explicit(&c->stats.sent, memory_order_relaxed) - sent0,
		.dtype = a->dtype,
		.async = a->async,
		.start_ns = t0,
		.end_ns = mono_ns(),
		.rc = rc,
	};
	c->trace(c->trace_arg, &ev);
}

int hpucoll__run(hpucoll_comm *c, const struct hpucoll__args *a)
{
	int64_t t0 = c->trace ? mono_ns() : 0;
	uint64_t sent0 = atomic_load_explicit(&c->stats.sent, memory_order_relaxed);
	int rc = run_one(c, a);

	if (c->trace)
		trace(c, a, t0, sent0, rc);
	return rc;
}

static int run_one(hpucoll_comm *c, const struct hpucoll__args *a)
{
	struct hpucoll__red r = {
		.dt = a->dtype,
		.op = a->op,
		.es = hpucoll_dtype_size(a->dtype),
		.divisor = a->op == HPUCOLL_AVG ? c->size : 0,
	};
	int rc;

	rc = begin(c, a);
	if (rc != HPUCOLL_OK)
		return rc;
	if (a->kind == HPUCOLL__BARRIER || a->count > 0)
		rc = end(c, run_kind(c, a, &r));
	if (rc == HPUCOLL_OK)
		hpucoll__count(&c->stats.collectives, 1);
	return rc;
}
