/* The base of libhpucoll that every other file calls: error codes and
 * messages, the names of transports, types and collective kinds, the
 * scratch buffer, the counters, the check of a received header and the
 * reading of a ZeroMQ socket monitor. It calls nothing of the other files;
 * the lifecycle (comm.c) and everything else stand on it. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/comm_internal.h"

static const char *const errstr[] = {
	[HPUCOLL_OK] = "Success.",
	[HPUCOLL_EINVAL] = "Invalid argument.",
	[HPUCOLL_ENOMEM] = "Out of memory.",
	[HPUCOLL_ETIMEDOUT] = "A peer did not send in time.",
	[HPUCOLL_EPROTO] = "A peer sent a malformed or unexpected message.",
	[HPUCOLL_ETRANSPORT] = "The ZeroMQ transport failed.",
	[HPUCOLL_EREFUSED] = "The coordinator refused this rank.",
	[HPUCOLL_EABORTED] = "The job was aborted.",
	[HPUCOLL_EENV] = "The launch environment is missing or invalid.",
	[HPUCOLL_EPEER] = "A peer process died.",
};

int hpucoll_version(void)
{
	return HPUCOLL_VERSION_CODE;
}

const char *hpucoll_strerror(int err)
{
	if (err < 0 || (size_t)err >= sizeof(errstr) / sizeof(errstr[0]) ||
	    errstr[err] == NULL)
		return "Unknown error code.";
	return errstr[err];
}

static const char *const transport_names[] = {
	[HPUCOLL_TRANSPORT_AUTO] = "auto",
	[HPUCOLL_TRANSPORT_TCP] = "tcp",
	[HPUCOLL_TRANSPORT_IPC] = "ipc",
	[HPUCOLL_TRANSPORT_SHM] = "shm",
};

int hpucoll_transport_parse(const char *s, hpucoll_transport *out)
{
	for (int t = 0; s != NULL && t <= HPUCOLL_TRANSPORT_SHM; t++) {
		if (strcmp(s, transport_names[t]) == 0) {
			*out = (hpucoll_transport)t;
			return 0;
		}
	}
	return -1;
}

const char *hpucoll_transport_name(hpucoll_transport t)
{
	if ((unsigned)t > HPUCOLL_TRANSPORT_SHM)
		return "unknown";
	return transport_names[t];
}

size_t hpucoll_dtype_size(hpucoll_dtype dtype)
{
	static const size_t sizes[HPUCOLL_NUM_DTYPES] = {
		[HPUCOLL_F32] = 4, [HPUCOLL_F64] = 8, [HPUCOLL_F16] = 2,
		[HPUCOLL_BF16] = 2, [HPUCOLL_I32] = 4, [HPUCOLL_I64] = 8,
		[HPUCOLL_U8] = 1,
	};

	if ((unsigned)dtype >= HPUCOLL_NUM_DTYPES)
		return 0;
	return sizes[dtype];
}

const char *hpucoll__kind_name(unsigned kind)
{
	static const char *const names[] = {
		[HPUCOLL__ALL_REDUCE] = "all_reduce",
		[HPUCOLL__BROADCAST] = "broadcast",
		[HPUCOLL__BARRIER] = "barrier",
		[HPUCOLL__REDUCE_SCATTER] = "reduce_scatter",
		[HPUCOLL__ALL_GATHER] = "all_gather",
		[HPUCOLL__REDUCE] = "reduce",
		[HPUCOLL__ABORT] = "abort",
		[HPUCOLL__PROBE] = "probe",
		[HPUCOLL__PROBE_REPLY] = "probe_reply",
	};

	kind &= 15;
	if (kind >= sizeof(names) / sizeof(names[0]) || names[kind] == NULL)
		return "unknown";
	return names[kind];
}

void hpucoll__set_error(hpucoll_comm *c, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&c->errlock);
	va_start(ap, fmt);
	vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&c->errlock);
}

int hpucoll__zmq_error(hpucoll_comm *c, const char *call)
{
	int err = zmq_errno();

	hpucoll__set_error(c, "%s: %s failed: %s.", c->what, call,
			   zmq_strerror(err));
	return err == ENOMEM ? HPUCOLL_ENOMEM : HPUCOLL_ETRANSPORT;
}

void *hpucoll__scratch(hpucoll_comm *c, size_t len)
{
	void *p;

	if (len <= c->tmp_len)
		return c->tmp;
	p = realloc(c->tmp, len);
	if (p == NULL)
		return NULL;
	c->tmp = p;
	c->tmp_len = len;
	return p;
}

void hpucoll__describe(char *buf, size_t len, unsigned kind, unsigned arg,
		       int root)
{
	static const char *const dtypes[] = {"f32", "f64", "f16", "bf16",
					     "i32", "i64", "u8"};
	static const char *const ops[] = {"sum", "avg", "max", "min"};
	unsigned dt = arg >> 4, op = arg & 15;
	const char *name = hpucoll__kind_name(kind);
	int n;

	kind &= 15;
	if (kind == HPUCOLL__BARRIER) {
		snprintf(buf, len, "%s", name);
		return;
	}
	if (dt < sizeof(dtypes) / sizeof(dtypes[0]))
		n = snprintf(buf, len, "%s of %s", name, dtypes[dt]);
	else
		n = snprintf(buf, len, "%s of dtype %u", name, dt);
	if (n < 0 || (size_t)n >= len)
		return;
	if (kind == HPUCOLL__ALL_REDUCE || kind == HPUCOLL__REDUCE ||
	    kind == HPUCOLL__REDUCE_SCATTER)
		n += snprintf(buf + n, len - (size_t)n, " with %s",
			      op < sizeof(ops) / sizeof(ops[0]) ? ops[op]
								 : "op ?");
	if (root >= 0 && n >= 0 && (size_t)n < len)
		snprintf(buf + n, len - (size_t)n, "%s root %d",
			 kind == HPUCOLL__BROADCAST ? " from" : " to", root);
}

int hpucoll__disagree(hpucoll_comm *c, uint32_t seq, int rank, const char *theirs,
		      const char *mine)
{
	hpucoll__set_error(c, "%s: ranks disagree on collective #%" PRIu32 ": rank %d called %s "
			      "where this rank (%d) called %s; every rank must call the same "
			      "collectives with the same dtype, op and root.",
			   c->what, seq, rank, theirs, c->rank, mine);
	return HPUCOLL_EPROTO;
}

/* Checks that a message is the one expected; the error says what differs
 * in the user's terms where it can (another collective, dtype, op or
 * count), and every field otherwise. */
int hpucoll__check_hdr(hpucoll_comm *c, const struct hpucoll__hdr *want,
		       const struct hpucoll__hdr *got)
{
	char mine[96], theirs[96];

	if (got->magic == want->magic && got->src == want->src &&
	    got->seq == want->seq && got->kind == want->kind &&
	    got->arg == want->arg && got->tag == want->tag &&
	    got->off == want->off && got->len == want->len)
		return HPUCOLL_OK;
	hpucoll__describe(mine, sizeof(mine), want->kind, want->arg, c->root);
	hpucoll__describe(theirs, sizeof(theirs), got->kind, got->arg, -1);
	if (got->magic == want->magic && got->src == want->src &&
	    got->seq != want->seq) {
		hpucoll__set_error(c, "%s: rank %" PRIu32 " sent data of "
				      "collective #%" PRIu32 " (%s) where #%" PRIu32
				      " (%s) was expected; do all ranks call "
				      "the same collectives in the same order?",
				   c->what, want->src, got->seq, theirs,
				   want->seq, mine);
		return HPUCOLL_EPROTO;
	}
	if (got->magic == want->magic && got->src == want->src &&
	    ((got->kind & 15) != (want->kind & 15) || got->arg != want->arg)) {
		return hpucoll__disagree(c, want->seq, (int)want->src, theirs, mine);
	}
	if (got->magic == want->magic && got->src == want->src &&
	    got->kind == want->kind && got->tag == want->tag &&
	    (got->len != want->len || got->off != want->off)) {
		hpucoll__set_error(c, "%s: rank %" PRIu32 " sent %" PRIu64
				      " bytes at offset %" PRIu64 " of "
				      "collective #%" PRIu32 " (%s) where %" PRIu64
				      " at offset %" PRIu64 " were expected; do "
				      "all ranks pass the same count?",
				   c->what, want->src, got->len, got->off,
				   want->seq, mine, want->len, want->off);
		return HPUCOLL_EPROTO;
	}
	hpucoll__set_error(
		c,
		"%s: rank %" PRIu32 " sent collective #%" PRIu32 " (%s, "
		"algorithm %u, arg %u, tag %u, offset %" PRIu64 ", %" PRIu64
		" bytes) where #%" PRIu32 " (%s, algorithm %u, arg %u, tag %u, "
		"offset %" PRIu64 ", %" PRIu64 " bytes) was expected; do all "
		"ranks call the same collectives with the same count and "
		"root?",
		c->what, want->src, got->seq, hpucoll__kind_name(got->kind),
		(unsigned)got->kind >> 4, (unsigned)got->arg,
		(unsigned)got->tag, got->off, got->len, want->seq,
		hpucoll__kind_name(want->kind), (unsigned)want->kind >> 4,
		(unsigned)want->arg, (unsigned)want->tag, want->off, want->len);
	return HPUCOLL_EPROTO;
}

int hpucoll__monitor_event(void *mon, uint16_t *ev, uint32_t *value)
{
	zmq_msg_t f;
	int more;

	if (mon == NULL)
		return 0;
	zmq_msg_init(&f);
	if (zmq_msg_recv(&f, mon, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&f);
		return 0;
	}
	*ev = 0;
	if (zmq_msg_size(&f) >= 2)
		memcpy(ev, zmq_msg_data(&f), sizeof(*ev));
	if (value != NULL) {
		*value = 0;
		if (zmq_msg_size(&f) >= 6)
			memcpy(value, (char *)zmq_msg_data(&f) + 2,
			       sizeof(*value));
	}
	more = zmq_msg_more(&f);
	zmq_msg_close(&f);
	while (more) { /* the endpoint frame */
		zmq_msg_init(&f);
		more = zmq_msg_recv(&f, mon, 0) >= 0 && zmq_msg_more(&f);
		zmq_msg_close(&f);
	}
	return 1;
}

int hpucoll_comm_rank(const hpucoll_comm *comm)
{
	return comm ? comm->rank : -1;
}

int hpucoll_comm_size(const hpucoll_comm *comm)
{
	return comm ? comm->size : 0;
}

void hpucoll_comm_stats(const hpucoll_comm *comm, hpucoll_stats *out)
{
	if (out == NULL)
		return;
	memset(out, 0, sizeof(*out));
	if (comm == NULL)
		return;
	out->bytes_sent = atomic_load_explicit(&comm->stats.sent,
					       memory_order_relaxed);
	out->bytes_received = atomic_load_explicit(&comm->stats.received,
						   memory_order_relaxed);
	out->shm_bytes_sent = atomic_load_explicit(&comm->stats.shm_sent,
						   memory_order_relaxed);
	out->collectives = atomic_load_explicit(&comm->stats.collectives,
						memory_order_relaxed);
	out->refused_connections = atomic_load(&comm->sec.refused);
}

/* A copy taken under errlock: the progress thread may be writing the
 * sentence (an asynchronous collective failing) while the caller reads. */
const char *hpucoll_comm_errmsg(const hpucoll_comm *comm)
{
	static _Thread_local char copy[HPUCOLL__ERRMSG_MAX];
	hpucoll_comm *c = (hpucoll_comm *)comm; /* the lock, not the sentence */

	if (!c) /* a destroyed one (destroy sets the caller's pointer NULL) */
		return "";
	pthread_mutex_lock(&c->errlock);
	memcpy(copy, c->errmsg, sizeof(copy));
	pthread_mutex_unlock(&c->errlock);
	return copy;
}

const char *hpucoll_comm_why(const hpucoll_comm *comm, int rc)
{
	/* a success is one, whatever an earlier call left */
	const char *msg = comm && rc != HPUCOLL_OK ? hpucoll_comm_errmsg(comm) : NULL;
	return msg && *msg ? msg : hpucoll_strerror(rc);
}

int hpucoll_comm_culprit(const hpucoll_comm *comm, int *code)
{
	if (!comm) {
		if (code)
			*code = HPUCOLL_OK;
		return -1;
	}
	if (code)
		*code = comm->culprit >= 0 ? comm->culprit_code : HPUCOLL_OK;
	return comm->culprit;
}
