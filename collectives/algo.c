/* The collective algorithms, written against the transport of
 * comm_internal.h:
 *   all_reduce  ring: reduce-scatter then all-gather, 2 * (size - 1) steps;
 *   broadcast   pipelined chain from the root;
 *   barrier     dissemination, ceil(log2(size)) rounds.
 * Transfers are split into messages of at most HPUCOLL__SEG_BYTES, and each
 * message is passed on as soon as it is handled, so the steps pipeline. */
#include <stdint.h>
#include <string.h>

#include "comm_internal.h"

/* Starts a collective: checks that the communicator can run one, records
 * what runs for error messages and gives it the next sequence number. */
static int begin(hpucoll_comm *c, const char *what, uint8_t kind,
		 uint8_t arg)
{
	c->what = what;
	if (c->peers == NULL) {
		hpucoll__set_error(c, "%s: rank %d is not connected yet.", what,
				   c->rank);
		return HPUCOLL_EINVAL;
	}
	if (c->failed != HPUCOLL_OK)
		return c->failed;
	c->kind = kind;
	c->arg = arg;
	c->seq++;
	return HPUCOLL_OK;
}

/* Ends a collective. After a failure the ranks no longer agree on what
 * comes next on the wire, so the communicator stays failed: later
 * collectives return the same error and errmsg keeps its cause. */
static int end(hpucoll_comm *c, int rc)
{
	if (rc != HPUCOLL_OK)
		c->failed = rc;
	return rc;
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

static size_t min_size(size_t a, size_t b)
{
	return a < b ? a : b;
}

/* ---- element types ---- */

static size_t dtype_size(hpucoll_dtype dtype)
{
	switch (dtype) {
	case HPUCOLL_F32:
		return sizeof(float);
	default:
		return 0;
	}
}

/* dst[i] += src[i]; src comes off the wire and may be unaligned. */
static void sum_f32(float *dst, const unsigned char *src, size_t n)
{
	if ((uintptr_t)src % _Alignof(float) == 0) {
		const float *s = (const float *)(const void *)src;

		for (size_t i = 0; i < n; i++)
			dst[i] += s[i];
		return;
	}
	for (size_t i = 0; i < n; i++) {
		float v;

		memcpy(&v, src + i * sizeof(v), sizeof(v));
		dst[i] += v;
	}
}

static void div_f32(float *x, size_t n, int by)
{
	float d = (float)by;

	for (size_t i = 0; i < n; i++)
		x[i] /= d;
}

static void reduce(hpucoll_dtype dtype, void *dst, const void *src,
		   size_t bytes)
{
	switch (dtype) {
	case HPUCOLL_F32:
		sum_f32(dst, src, bytes / sizeof(float));
		break;
	}
}

static void divide(hpucoll_dtype dtype, void *x, size_t bytes, int by)
{
	switch (dtype) {
	case HPUCOLL_F32:
		div_f32(x, bytes / sizeof(float), by);
		break;
	}
}

/* ---- all-reduce: ring ---- */

struct ring {
	hpucoll_comm *c;
	unsigned char *buf;
	size_t count; /* elements */
	size_t esize; /* bytes per element */
	hpucoll_dtype dtype;
	hpucoll_op op;
	int next, prev;
};

/* Chunk i of `size` nearly equal chunks of the buffer, in bytes. */
static void chunk(const struct ring *rg, int i, size_t *off, size_t *len)
{
	size_t n = (size_t)rg->c->size, q = rg->count / n, r = rg->count % n;
	size_t u = (size_t)i;

	*off = (u * q + min_size(u, r)) * rg->esize;
	*len = (q + (u < r)) * rg->esize;
}

/* Step t < size - 1 (reduce-scatter): adds a segment from the previous rank
 * into the buffer and sends the sum on as step t + 1. At the last of these
 * steps the segment is final: AVG divides it here, once, so that every
 * rank later copies the very same bytes. */
static int reduce_seg(struct ring *rg, int t, size_t off, size_t len)
{
	hpucoll_comm *c = rg->c;
	struct hpucoll__hdr h = hdr(c, rg->prev, (unsigned)t, off, len);
	zmq_msg_t body;
	int rc;

	rc = hpucoll__recv(c, &h, &body);
	if (rc != HPUCOLL_OK)
		return rc;
	reduce(rg->dtype, rg->buf + off, zmq_msg_data(&body), len);
	zmq_msg_close(&body);
	if (t == c->size - 2 && rg->op == HPUCOLL_AVG)
		divide(rg->dtype, rg->buf + off, len, c->size);
	h = hdr(c, c->rank, (unsigned)t + 1, off, len);
	return hpucoll__send(c, rg->next, &h, rg->buf + off);
}

/* Step t >= size - 1 (all-gather): copies a final segment from the previous
 * rank and forwards the same message, uncopied, unless t is the last. */
static int gather_seg(struct ring *rg, int t, size_t off, size_t len)
{
	hpucoll_comm *c = rg->c;
	struct hpucoll__hdr h = hdr(c, rg->prev, (unsigned)t, off, len);
	zmq_msg_t body;
	int rc;

	rc = hpucoll__recv(c, &h, &body);
	if (rc != HPUCOLL_OK)
		return rc;
	memcpy(rg->buf + off, zmq_msg_data(&body), len);
	if (t == 2 * c->size - 3) {
		zmq_msg_close(&body);
		return HPUCOLL_OK;
	}
	h = hdr(c, c->rank, (unsigned)t + 1, off, len);
	return hpucoll__send_msg(c, rg->next, &h, &body);
}

/* At step t rank r receives chunk (r - 1 - t) mod size. */
static int ring_step(struct ring *rg, int t)
{
	int n = rg->c->size;
	int ci = ((rg->c->rank - 1 - t) % n + n) % n;
	size_t off, len, seg;
	int rc = HPUCOLL_OK;

	chunk(rg, ci, &off, &len);
	for (size_t done = 0; done < len && rc == HPUCOLL_OK; done += seg) {
		seg = min_size(HPUCOLL__SEG_BYTES, len - done);
		if (t < n - 1)
			rc = reduce_seg(rg, t, off + done, seg);
		else
			rc = gather_seg(rg, t, off + done, seg);
	}
	return rc;
}

/* Step 0: rank r sends its own chunk r. */
static int ring_start(struct ring *rg)
{
	hpucoll_comm *c = rg->c;
	struct hpucoll__hdr h;
	size_t off, len, seg;
	int rc = HPUCOLL_OK;

	chunk(rg, c->rank, &off, &len);
	for (size_t done = 0; done < len && rc == HPUCOLL_OK; done += seg) {
		seg = min_size(HPUCOLL__SEG_BYTES, len - done);
		h = hdr(c, c->rank, 0, off + done, seg);
		rc = hpucoll__send(c, rg->next, &h, rg->buf + off + done);
	}
	return rc;
}

static int ring_all_reduce(struct ring *rg)
{
	int n = rg->c->size;
	int rc;

	rc = ring_start(rg);
	for (int t = 0; t < 2 * n - 2 && rc == HPUCOLL_OK; t++)
		rc = ring_step(rg, t);
	return rc;
}

int hpucoll_all_reduce(hpucoll_comm *comm, void *buf, size_t count,
		       hpucoll_dtype dtype, hpucoll_op op)
{
	struct ring rg = {
		.c = comm,
		.buf = buf,
		.count = count,
		.esize = dtype_size(dtype),
		.dtype = dtype,
		.op = op,
	};
	int rc;

	comm->what = "all_reduce";
	if (rg.esize == 0 || (op != HPUCOLL_SUM && op != HPUCOLL_AVG) ||
	    (buf == NULL && count > 0) || count > SIZE_MAX / rg.esize) {
		hpucoll__set_error(comm, "all_reduce: invalid dtype, op, "
					 "buffer or count.");
		return HPUCOLL_EINVAL;
	}
	rc = begin(comm, "all_reduce", HPUCOLL__ALL_REDUCE,
		   (uint8_t)((unsigned)dtype << 4 | (unsigned)op));
	if (rc != HPUCOLL_OK || comm->size == 1 || count == 0)
		return rc;
	rg.next = (comm->rank + 1) % comm->size;
	rg.prev = (comm->rank - 1 + comm->size) % comm->size;
	return end(comm, ring_all_reduce(&rg));
}

/* ---- broadcast: pipelined chain root, root + 1, ... ---- */

/* Receives the segment at `off` from the previous rank of the chain, keeps
 * a copy and forwards the message itself to `next` (if not -1). */
static int relay_seg(hpucoll_comm *c, unsigned char *buf, size_t off,
		     size_t len, int root, int prev, int next)
{
	struct hpucoll__hdr h = hdr(c, prev, (unsigned)root, off, len);
	zmq_msg_t body;
	int rc;

	rc = hpucoll__recv(c, &h, &body);
	if (rc != HPUCOLL_OK)
		return rc;
	memcpy(buf + off, zmq_msg_data(&body), len);
	if (next < 0) {
		zmq_msg_close(&body);
		return HPUCOLL_OK;
	}
	h = hdr(c, c->rank, (unsigned)root, off, len);
	return hpucoll__send_msg(c, next, &h, &body);
}

static int chain_broadcast(hpucoll_comm *c, unsigned char *buf, size_t bytes,
			   int root)
{
	int n = c->size, v = (c->rank - root + n) % n;
	int prev = (c->rank - 1 + n) % n;
	int next = v == n - 1 ? -1 : (c->rank + 1) % n;
	struct hpucoll__hdr h;
	size_t seg;
	int rc = HPUCOLL_OK;

	for (size_t off = 0; off < bytes && rc == HPUCOLL_OK; off += seg) {
		seg = min_size(HPUCOLL__SEG_BYTES, bytes - off);
		if (v == 0) {
			h = hdr(c, c->rank, (unsigned)root, off, seg);
			rc = hpucoll__send(c, next, &h, buf + off);
		} else {
			rc = relay_seg(c, buf, off, seg, root, prev, next);
		}
	}
	return rc;
}

int hpucoll_broadcast(hpucoll_comm *comm, void *buf, size_t bytes, int root)
{
	int rc;

	comm->what = "broadcast";
	if (root < 0 || root >= comm->size || (buf == NULL && bytes > 0)) {
		hpucoll__set_error(comm, "broadcast: invalid root %d or "
					 "buffer.", root);
		return HPUCOLL_EINVAL;
	}
	rc = begin(comm, "broadcast", HPUCOLL__BROADCAST, 0);
	if (rc != HPUCOLL_OK || comm->size == 1 || bytes == 0)
		return rc;
	return end(comm, chain_broadcast(comm, buf, bytes, root));
}

/* ---- barrier: dissemination ---- */

/* In round k rank r signals r + 2^k and waits for r - 2^k; after the last
 * round every rank has heard, directly or not, from every other. */
static int dissemination(hpucoll_comm *c)
{
	int n = c->size;
	struct hpucoll__hdr h;
	zmq_msg_t body;
	int rc = HPUCOLL_OK;

	for (int k = 0, d = 1; d < n && rc == HPUCOLL_OK; k++, d <<= 1) {
		h = hdr(c, c->rank, (unsigned)k, 0, 0);
		rc = hpucoll__send(c, (c->rank + d) % n, &h, NULL);
		if (rc != HPUCOLL_OK)
			break;
		h = hdr(c, (c->rank - d + n) % n, (unsigned)k, 0, 0);
		rc = hpucoll__recv(c, &h, &body);
		if (rc == HPUCOLL_OK)
			zmq_msg_close(&body);
	}
	return rc;
}

int hpucoll_barrier(hpucoll_comm *comm)
{
	int rc;

	rc = begin(comm, "barrier", HPUCOLL__BARRIER, 0);
	if (rc != HPUCOLL_OK || comm->size == 1)
		return rc;
	return end(comm, dissemination(comm));
}
