/* The communication patterns (see patterns.h): ring, recursive doubling,
 * binomial trees, chain, dissemination.
 *
 * Zero-copy. ZeroMQ may send a buffer in place (hpucoll__send with zc):
 * the bytes must then not change until the receiver has them, and
 * hpucoll__fence() at the end of the collective waits until ZeroMQ let go
 * of them. The patterns send in place only bytes that are final (never
 * written again in the collective), the caller's send buffer, or, in the
 * ring's first step, a chunk that is written again only once its final
 * value has come round, which cannot happen before the receiver has taken
 * this message. Recursive doubling overwrites what it sent at once, so it
 * copies.
 */
#include <stdint.h>
#include <string.h>

#include "collectives/patterns.h"

static size_t min_size(size_t a, size_t b)
{
	return a < b ? a : b;
}

static int grank(const struct hpucoll__group *g, int i)
{
	return g->ranks != NULL ? g->ranks[i] : i;
}

/* ---- Messages ---- */

void hpucoll__split(size_t count, size_t n, size_t i, size_t *first,
		    size_t *len)
{
	size_t q = count / n, r = count % n;

	*first = i * q + min_size(i, r);
	*len = q + (i < r);
}

/* Slices of at most `seg` elements that `count` elements are cut into. */
static size_t nslices(size_t count, size_t seg)
{
	return count == 0 ? 0 : (count + seg - 1) / seg;
}

static int mod(int a, int n)
{
	return ((a % n) + n) % n;
}

/* The header of a message of the running collective sent by `src`. */
static struct hpucoll__hdr hdr(const hpucoll_comm *c, int src, unsigned tag,
			       size_t off, size_t len)
{
	struct hpucoll__hdr h = {
		.magic = HPUCOLL__MAGIC,
		.src = (uint32_t)src,
		.seq = c->seq,
		.kind = c->kind,
		.arg = c->arg,
		.tag = (uint16_t)tag,
		.off = off,
		.len = len,
	};
	return h;
}

/* Sends `len` bytes to member i of g. */
static int send_to(hpucoll_comm *c, const struct hpucoll__group *g, int i,
		   unsigned tag, size_t off, const void *data, size_t len,
		   int zc)
{
	struct hpucoll__hdr h = hdr(c, c->rank, tag, off, len);

	return hpucoll__send(c, grank(g, i), &h, data, zc);
}

/* Receives the expected message from member i of g; release it after. */
static int recv_from(hpucoll_comm *c, const struct hpucoll__group *g, int i,
		     unsigned tag, size_t off, size_t len, const void **data)
{
	struct hpucoll__hdr h = hdr(c, grank(g, i), tag, off, len);

	return hpucoll__recv(c, &h, data);
}

static int no_memory(hpucoll_comm *c, size_t bytes)
{
	hpucoll__set_error(c, "%s: out of memory (%zu bytes).", c->what,
			   bytes);
	return HPUCOLL_ENOMEM;
}

/* ---- Ring: reduce-scatter and/or all-gather ---- */

/* Slice s of chunk ci, in elements. */
static void ring_slice(const struct hpucoll__ring *rg, int ci, size_t s,
		       size_t *e, size_t *l)
{
	size_t cf, cl, sf;

	hpucoll__split(rg->count, (size_t)rg->g->n, (size_t)ci, &cf, &cl);
	hpucoll__split(cl, rg->nslices, s, &sf, l);
	*e = cf + sf;
}

/* Where element e of a chunk this rank keeps lives. */
static unsigned char *ring_out(const struct hpucoll__ring *rg, size_t e)
{
	return rg->out + (e * rg->r.es - rg->base);
}

/* Step n - 2 of a ring that goes on, over a transport that copies what it
 * sends (shared memory): the final sums go into this rank's output and
 * into the message for next in one pass, instead of a second pass copying
 * them from the output into the slot. */
static int ring_final_both(struct hpucoll__ring *rg, int t, size_t e,
			   size_t l, const void *d)
{
	hpucoll_comm *c = rg->c;
	int n = rg->g->n, me = rg->g->me;
	int prev = grank(rg->g, mod(me - 1, n));
	int next = grank(rg->g, mod(me + 1, n));
	size_t es = rg->r.es, bytes = l * es;
	void *buf = hpucoll__send_buf(c, next, bytes);

	if (buf == NULL) {
		hpucoll__release(c, prev);
		return no_memory(c, bytes);
	}
	hpucoll__reduce2(rg->r.dt, rg->r.op, ring_out(rg, e), buf,
			 rg->in + e * es, d, l);
	hpucoll__release(c, prev);
	struct hpucoll__hdr h = hdr(c, c->rank, (unsigned)t + 1, e * es, bytes);
	return hpucoll__send_commit(c, next, &h);
}

/* Receives slice s of step t and does what the step says with it. */
static int ring_step(struct hpucoll__ring *rg, int t, size_t s)
{
	hpucoll_comm *c = rg->c;
	int n = rg->g->n, me = rg->g->me;
	int prev = mod(me - 1, n), next = mod(me + 1, n);
	int last = rg->gather ? 2 * n - 3 : n - 2;
	size_t es = rg->r.es, e, l, bytes;
	const void *d;
	unsigned char *dst;
	int rc;

	ring_slice(rg, mod(me - 1 - t + rg->shift, n), s, &e, &l);
	if (l == 0)
		return HPUCOLL_OK;
	bytes = l * es;
	rc = recv_from(c, rg->g, prev, (unsigned)t, e * es, bytes, &d);
	if (rc != HPUCOLL_OK)
		return rc;
	if (t < n - 2) {
		/* A partial sum: combine into a fresh message for next. */
		void *buf = hpucoll__send_buf(c, grank(rg->g, next), bytes);

		if (buf == NULL) {
			hpucoll__release(c, grank(rg->g, prev));
			return no_memory(c, bytes);
		}
		hpucoll__reduce(rg->r.dt, rg->r.op, buf, rg->in + e * es, d,
				l);
		hpucoll__release(c, grank(rg->g, prev));
		struct hpucoll__hdr h = hdr(c, c->rank, (unsigned)t + 1,
					    e * es, bytes);
		return hpucoll__send_commit(c, grank(rg->g, next), &h);
	}
	if (t == n - 2 && t != last && rg->r.divisor == 0 &&
	    hpucoll__send_copies(c, grank(rg->g, next)))
		return ring_final_both(rg, t, e, l, d);
	dst = ring_out(rg, e);
	if (t == n - 2) {
		/* The chunk is final here, and only here: AVG divides. */
		hpucoll__reduce(rg->r.dt, rg->r.op, dst, rg->in + e * es, d,
				l);
		hpucoll__release(c, grank(rg->g, prev));
		if (rg->r.divisor > 0)
			hpucoll__divide(rg->r.dt, dst, l, rg->r.divisor);
	} else {
		memcpy(dst, d, bytes);
		hpucoll__release(c, grank(rg->g, prev));
	}
	if (t == last)
		return HPUCOLL_OK;
	/* Final bytes, never written again: ZeroMQ may send them in place. */
	return send_to(c, rg->g, next, (unsigned)t + 1, e * es, dst, bytes, 1);
}

/* The first send of slice s: this rank's own part of the chunk it starts
 * (reduce) or its final chunk (gather only). The reduce phase may send
 * `in` in place even when it is the output buffer: the chunk is written
 * again only when its final value comes round, which needs this message
 * to have been received. */
static int ring_first(struct hpucoll__ring *rg, size_t s)
{
	int n = rg->g->n, me = rg->g->me, next = mod(me + 1, n);
	size_t es = rg->r.es, e, l;
	int t = rg->reduce ? 0 : n - 1;
	const unsigned char *src;

	/* The chunk received at step t - 1. */
	ring_slice(rg, mod(me - t + rg->shift, n), s, &e, &l);
	if (l == 0)
		return HPUCOLL_OK;
	src = rg->reduce ? rg->in + e * es : ring_out(rg, e);
	return send_to(rg->c, rg->g, next, (unsigned)t, e * es, src, l * es,
		       1);
}

int hpucoll__ring_run(struct hpucoll__ring *rg)
{
	int n = rg->g->n;
	int t0 = rg->reduce ? 0 : n - 1, t1 = rg->gather ? 2 * n - 3 : n - 2;
	size_t maxchunk = (rg->count + (size_t)n - 1) / (size_t)n;
	size_t seg = rg->g->seg / rg->r.es;
	int rc = HPUCOLL_OK;

	rg->nslices = maxchunk == 0 ? 1 : (maxchunk + seg - 1) / seg;
	for (size_t s = 0; s < rg->nslices && rc == HPUCOLL_OK; s++) {
		rc = ring_first(rg, s);
		for (int t = t0; t <= t1 && rc == HPUCOLL_OK; t++)
			rc = ring_step(rg, t, s);
	}
	return rc;
}

/* ---- Recursive doubling all-reduce ---- */

/* Exchanges `bytes` at `out` with member `peer` slice by slice and combines,
 * the lower of the two new ranks' data first. */
static int rd_exchange(hpucoll_comm *c, const struct hpucoll__group *g,
		       const struct hpucoll__red *r, unsigned char *out,
		       size_t count, int peer, int lower, unsigned tag)
{
	size_t ns = nslices(count, g->seg / r->es);
	const void *d;
	int rc = HPUCOLL_OK;

	for (size_t s = 0; s < ns && rc == HPUCOLL_OK; s++) {
		size_t e, l;

		hpucoll__split(count, ns, s, &e, &l);
		/* Copied: `out` changes as soon as the partner's data is in. */
		rc = send_to(c, g, peer, tag, e * r->es, out + e * r->es,
			     l * r->es, 0);
		if (rc == HPUCOLL_OK)
			rc = recv_from(c, g, peer, tag, e * r->es, l * r->es,
				       &d);
		if (rc != HPUCOLL_OK)
			break;
		if (lower)
			hpucoll__reduce(r->dt, r->op, out + e * r->es,
					out + e * r->es, d, l);
		else
			hpucoll__reduce(r->dt, r->op, out + e * r->es, d,
					out + e * r->es, l);
		hpucoll__release(c, grank(g, peer));
	}
	return rc;
}

/* Sends `count` elements at `buf` to member `peer`, slice by slice (one
 * direction; ZeroMQ may send them in place). */
static int send_elems(hpucoll_comm *c, const struct hpucoll__group *g,
		      int peer, unsigned tag, const unsigned char *buf,
		      size_t count, size_t es)
{
	size_t ns = nslices(count, g->seg / es);
	int rc = HPUCOLL_OK;

	for (size_t s = 0; s < ns && rc == HPUCOLL_OK; s++) {
		size_t e, l;

		hpucoll__split(count, ns, s, &e, &l);
		rc = send_to(c, g, peer, tag, e * es, buf + e * es, l * es, 1);
	}
	return rc;
}

/* Receives what send_elems() sends: copied to `out`, or combined into it
 * when r is not NULL (the peer's data first when peer_first). */
static int recv_elems(hpucoll_comm *c, const struct hpucoll__group *g,
		      int peer, unsigned tag, unsigned char *out,
		      size_t count, size_t es, const struct hpucoll__red *r,
		      int peer_first)
{
	size_t ns = nslices(count, g->seg / es);
	const void *d;
	int rc = HPUCOLL_OK;

	for (size_t s = 0; s < ns && rc == HPUCOLL_OK; s++) {
		size_t e, l;
		unsigned char *o;

		hpucoll__split(count, ns, s, &e, &l);
		o = out + e * es;
		rc = recv_from(c, g, peer, tag, e * es, l * es, &d);
		if (rc != HPUCOLL_OK)
			break;
		if (r == NULL)
			memcpy(o, d, l * es);
		else if (peer_first)
			hpucoll__reduce(r->dt, r->op, o, d, o, l);
		else
			hpucoll__reduce(r->dt, r->op, o, o, d, l);
		hpucoll__release(c, grank(g, peer));
	}
	return rc;
}

/* In place on `out` (which already holds this rank's data). With
 * rem = n - 2^k extra ranks, members 0, 2, .., 2*rem-2 fold into their odd
 * neighbour first and get the result back at the end. */
int hpucoll__rd_all_reduce(hpucoll_comm *c, const struct hpucoll__group *g,
			   const struct hpucoll__red *r, unsigned char *out,
			   size_t count)
{
	int n = g->n, me = g->me, pof2 = 1, rem, nr, rounds = 0, rc;

	while (pof2 * 2 <= n)
		pof2 *= 2;
	rem = n - pof2;
	for (int m = 1; m < pof2; m <<= 1)
		rounds++;
	if (me < 2 * rem) {
		if (me % 2 == 0) {
			rc = send_elems(c, g, me + 1, 0, out, count, r->es);
			if (rc == HPUCOLL_OK)
				rc = recv_elems(c, g, me + 1,
						(unsigned)rounds + 1, out,
						count, r->es, NULL, 0);
			return rc;
		}
		rc = recv_elems(c, g, me - 1, 0, out, count, r->es, r, 1);
		if (rc != HPUCOLL_OK)
			return rc;
		nr = me / 2;
	} else {
		nr = me - rem;
	}
	for (int m = 1, k = 1; m < pof2; m <<= 1, k++) {
		int np = nr ^ m;
		int peer = np < rem ? np * 2 + 1 : np + rem;

		rc = rd_exchange(c, g, r, out, count, peer, nr < np,
				 (unsigned)k);
		if (rc != HPUCOLL_OK)
			return rc;
	}
	if (r->divisor > 0)
		hpucoll__divide(r->dt, out, count, r->divisor);
	if (me < 2 * rem)
		return send_elems(c, g, me - 1, (unsigned)rounds + 1, out,
				  count, r->es);
	return HPUCOLL_OK;
}

/* ---- Broadcast: binomial tree or pipelined chain ---- */

/* `out` gets root's `in` (root: in may equal out). The tag carries the
 * root, so that ranks that disagree on it fail instead of mixing data. */
int hpucoll__bcast(hpucoll_comm *c, const struct hpucoll__group *g, int root,
		   const unsigned char *in, unsigned char *out, size_t bytes,
		   int chain)
{
	int n = g->n, v = mod(g->me - root, n), parent = -1;
	int kids[32], nkids = 0, lowbit = 1;
	size_t ns = (bytes + g->seg - 1) / g->seg;
	const unsigned char *src = v == 0 ? in : out;
	int rc = HPUCOLL_OK;

	if (chain) {
		if (v > 0)
			parent = v - 1;
		if (v + 1 < n)
			kids[nkids++] = v + 1;
	} else {
		while (lowbit < n && !(v & lowbit))
			lowbit <<= 1;
		if (v > 0)
			parent = v - lowbit;
		for (int m = lowbit >> 1; m > 0; m >>= 1) {
			if (v + m < n)
				kids[nkids++] = v + m;
		}
	}
	if (v == 0 && in != out)
		memcpy(out, in, bytes);
	for (size_t s = 0; s < ns && rc == HPUCOLL_OK; s++) {
		size_t o, l;
		const void *d;

		hpucoll__split(bytes, ns, s, &o, &l);
		if (parent >= 0) {
			int p = mod(parent + root, n);

			rc = recv_from(c, g, p, (unsigned)root, o, l, &d);
			if (rc != HPUCOLL_OK)
				break;
			memcpy(out + o, d, l);
			hpucoll__release(c, grank(g, p));
		}
		for (int k = 0; k < nkids && rc == HPUCOLL_OK; k++)
			rc = send_to(c, g, mod(kids[k] + root, n),
				     (unsigned)root, o, src + o, l, 1);
	}
	return rc;
}

/* ---- Reduce ---- */

/* Binomial tree: each member combines its children's sums (lowest first,
 * its own data first) and sends the result to its parent. */
int hpucoll__tree_reduce(hpucoll_comm *c, const struct hpucoll__group *g,
			 const struct hpucoll__red *r, int root,
			 const unsigned char *in, unsigned char *acc,
			 size_t count)
{
	int n = g->n, v = mod(g->me - root, n);
	int rc = HPUCOLL_OK;

	if (acc != in)
		memcpy(acc, in, count * r->es);
	for (int m = 1; m < n && rc == HPUCOLL_OK; m <<= 1) {
		if (v & m)
			return send_elems(c, g, mod(v - m + root, n),
					  (unsigned)root, acc, count, r->es);
		if (v + m < n)
			rc = recv_elems(c, g, mod(v + m + root, n),
					(unsigned)root, acc, count, r->es, r,
					0);
	}
	if (rc == HPUCOLL_OK && r->divisor > 0)
		hpucoll__divide(r->dt, acc, count, r->divisor);
	return rc;
}

/* Ring reduce-scatter (member i ends with chunk i), then every member
 * sends its chunk to the root. */
int hpucoll__ring_reduce(hpucoll_comm *c, const struct hpucoll__group *g,
			 const struct hpucoll__red *r, int root,
			 const unsigned char *in, unsigned char *out,
			 size_t count)
{
	int n = g->n, me = g->me;
	size_t e, l;
	struct hpucoll__ring rg = {
		.c = c, .g = g, .r = *r, .count = count, .in = in,
		.shift = -1, .reduce = 1,
	};
	int rc;

	hpucoll__split(count, (size_t)n, (size_t)me, &e, &l);
	if (me == root) {
		rg.out = out;
	} else {
		rg.out = hpucoll__scratch(c, l * r->es + 1);
		rg.base = e * r->es;
		if (rg.out == NULL)
			return no_memory(c, l * r->es);
	}
	rc = hpucoll__ring_run(&rg);
	if (rc != HPUCOLL_OK)
		return rc;
	c->kind = (uint8_t)(HPUCOLL__REDUCE | HPUCOLL__ALGO_GATHER << 4);
	if (me != root)
		return send_elems(c, g, root, (unsigned)root, rg.out, l,
				  r->es);
	for (int i = 0; i < n && rc == HPUCOLL_OK; i++) {
		if (i == root)
			continue;
		hpucoll__split(count, (size_t)n, (size_t)i, &e, &l);
		rc = recv_elems(c, g, i, (unsigned)root, out + e * r->es, l,
				r->es, NULL, 0);
	}
	return rc;
}

/* ---- Barrier: dissemination ---- */

/* In round k rank r signals r + 2^k and waits for r - 2^k; after the last
 * round every rank has heard, directly or not, from every other. */
int hpucoll__dissemination(hpucoll_comm *c, const struct hpucoll__group *g)
{
	int n = g->n, me = g->me;
	const void *d;
	int rc = HPUCOLL_OK;

	for (int k = 0, dist = 1; dist < n && rc == HPUCOLL_OK;
	     k++, dist <<= 1) {
		rc = send_to(c, g, mod(me + dist, n), (unsigned)k, 0, NULL, 0,
			     0);
		if (rc != HPUCOLL_OK)
			break;
		rc = recv_from(c, g, mod(me - dist, n), (unsigned)k, 0, 0, &d);
		if (rc == HPUCOLL_OK)
			hpucoll__release(c, grank(g, mod(me - dist, n)));
	}
	return rc;
}
