/* The ZeroMQ transport. One PULL socket per rank receives from everyone;
 * one PUSH socket per peer, connected at connect time, sends. ZeroMQ keeps
 * the order of messages on each connection, so a message that arrives
 * from a rank other than the one awaited is queued for that rank and
 * handed out later in order. Payloads of HPUCOLL__ZC_MIN bytes or more are
 * sent in place (zmq_msg_init_data): each such message counts up the
 * peer's `zc`, the free callback (on ZeroMQ's I/O thread) counts it down,
 * and hpucoll__zmq_fence() waits for zero before a collective returns, so
 * that ZeroMQ holds no pointer into the caller's buffers afterwards. Every
 * PUSH socket has a monitor: when its connection closes (the peer died, or
 * ZeroMQ heartbeats found it silent) a wait for that peer ends with an
 * error naming it shortly after, instead of at the timeout.
 *
 * Under HPUCOLL_SECURITY_AUTH a connection's proof is good once (secure.c),
 * and ZeroMQ would present the same one again when it reconnects, which
 * the peer refuses as a replay. So there ZeroMQ does not reconnect
 * (ZMQ_RECONNECT_IVL -1) and takes no message for a connection before its
 * handshake (ZMQ_IMMEDIATE): when a connection closes or a connection
 * attempt fails, the monitor says so and this rank "redials": it replaces
 * the PUSH socket with a new one with a fresh proof (redial()), at most
 * every HPUCOLL__REDIAL_MS. What the old socket had not sent yet is lost
 * with it, as it is with the connection under any mode.
 *
 * ZeroMQ connects every pair of ranks, also those that shared memory
 * carries the data of: the messages that may arrive unasked (ABORT, PROBE,
 * PROBE_REPLY; see comm_internal.h) always come this way.
 *
 * Nothing read off the wire is trusted: every frame is checked and
 * anything unexpected is HPUCOLL_EPROTO.
 */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "collectives/comm_internal.h"

static int set_int(void *sock, int opt, int v)
{
	return zmq_setsockopt(sock, opt, &v, sizeof(v));
}

/* ---- Sockets ---- */

/* Counts a zero-copy send down once ZeroMQ is done with its bytes. */
static void zc_free(void *data, void *hint)
{
	(void)data;
	atomic_fetch_sub_explicit((atomic_int *)hint, 1, memory_order_release);
}

/* Whether this communicator redials its connections itself (see the top
 * of this file). */
static int redials(const hpucoll_comm *c)
{
	return c->sec.mode == HPUCOLL_SECURITY_AUTH;
}

/* Watches the connection of `push` through a PAIR socket (one per socket:
 * the endpoint names the dial). */
static int monitor(hpucoll_comm *c, int dst, void *push, void **out)
{
	struct hpucoll__peer *p = &c->peers[dst];
	int events = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED |
		     HPUCOLL__HANDSHAKE_FAILED;
	char ep[112];
	void *m;

	if (redials(c))
		events |= ZMQ_EVENT_CLOSED; /* a connection attempt failed */
	snprintf(ep, sizeof(ep), "inproc://hpucoll-mon-%p-%d-%u", (void *)c,
		 dst, p->dials);
	if (zmq_socket_monitor(push, ep, events) != 0)
		return hpucoll__zmq_error(c, "zmq_socket_monitor");
	m = zmq_socket(c->ctx, ZMQ_PAIR);
	if (m == NULL)
		return hpucoll__zmq_error(c, "zmq_socket");
	if (set_int(m, ZMQ_LINGER, 0) != 0 || zmq_connect(m, ep) != 0) {
		zmq_close(m);
		return hpucoll__zmq_error(c, "zmq_connect");
	}
	*out = m;
	return HPUCOLL_OK;
}

/* No high-water mark: what is in flight is bounded by the algorithms (at
 * most one collective's data per link), zero-copy messages cost no memory
 * of their own, and a send must never block: two ranks that send to each
 * other before receiving would deadlock. */
static int open_push(hpucoll_comm *c, int dst)
{
	struct hpucoll__peer *p = &c->peers[dst];
	void *s = zmq_socket(c->ctx, ZMQ_PUSH);
	int rc, own = redials(c);

	if (s == NULL)
		return hpucoll__zmq_error(c, "zmq_socket");
	p->push = s;
	p->dials++;
	p->dial_ms = hpucoll__now_ms();
	if (set_int(s, ZMQ_SNDHWM, 0) != 0 ||
	    set_int(s, ZMQ_LINGER, HPUCOLL__LINGER_MS) != 0 ||
	    set_int(s, ZMQ_IMMEDIATE, own) != 0 ||
	    (own && set_int(s, ZMQ_RECONNECT_IVL, -1) != 0) ||
	    set_int(s, ZMQ_HEARTBEAT_IVL, HPUCOLL__HEARTBEAT_IVL_MS) != 0 ||
	    set_int(s, ZMQ_HEARTBEAT_TIMEOUT, c->heartbeat_ms) != 0 ||
	    hpucoll__sec_client(c, s, dst) != 0)
		return hpucoll__zmq_error(c, "zmq_setsockopt");
	rc = monitor(c, dst, s, &p->mon);
	if (rc != HPUCOLL_OK)
		return rc;
	if (zmq_connect(s, p->endpoint) != 0) {
		hpucoll__set_error(c, "connect: cannot connect to rank %d at "
				      "%s: %s.",
				   dst, p->endpoint, zmq_strerror(zmq_errno()));
		return HPUCOLL_ETRANSPORT;
	}
	return HPUCOLL_OK;
}

int hpucoll__zmq_open(hpucoll_comm *c)
{
	int rc;

	for (int i = 0; i < c->size; i++) {
		if (i == c->rank)
			continue;
		rc = open_push(c, i);
		if (rc != HPUCOLL_OK)
			return rc;
	}
	return HPUCOLL_OK;
}

/* Closes dst's PUSH socket and its monitor at once (linger 0). */
static void close_push(struct hpucoll__peer *p)
{
	if (p->push != NULL && p->mon != NULL)
		zmq_socket_monitor(p->push, NULL, 0);
	if (p->mon != NULL)
		zmq_close(p->mon);
	if (p->push != NULL) {
		set_int(p->push, ZMQ_LINGER, 0);
		zmq_close(p->push);
	}
	p->push = p->mon = NULL;
}

/* Replaces dst's PUSH socket by a new one with a fresh proof, once
 * HPUCOLL__REDIAL_MS have passed since the last dial (until then
 * p->redial stays set, and the waits wake up for it). */
static void redial(hpucoll_comm *c, int dst)
{
	struct hpucoll__peer *p = &c->peers[dst];
	char err[HPUCOLL__ERRMSG_MAX];

	if (hpucoll__now_ms() < p->dial_ms + HPUCOLL__REDIAL_MS)
		return;
	close_push(p);
	/* A failure here (no memory, no sockets) is tried again at the next
	 * redial; it must not replace the error of the collective. */
	pthread_mutex_lock(&c->errlock);
	memcpy(err, c->errmsg, sizeof(err));
	pthread_mutex_unlock(&c->errlock);
	if (open_push(c, dst) != HPUCOLL_OK) {
		close_push(p);
		p->dial_ms = hpucoll__now_ms();
		pthread_mutex_lock(&c->errlock);
		memcpy(c->errmsg, err, sizeof(err));
		pthread_mutex_unlock(&c->errlock);
		return;
	}
	p->redial = 0;
}

/* Milliseconds until dst's pending redial may happen, or -1. */
static long redial_wait(const hpucoll_comm *c, int dst, int64_t now)
{
	const struct hpucoll__peer *p = &c->peers[dst];
	int64_t at = p->dial_ms + HPUCOLL__REDIAL_MS;

	if (!p->redial)
		return -1;
	return at > now ? (long)(at - now) : 0;
}

static void msg_free(struct hpucoll__msg *m)
{
	zmq_msg_close(&m->body);
	free(m);
}

void hpucoll__zmq_close(hpucoll_comm *c)
{
	struct hpucoll__msg *m;

	for (int i = 0; c->peers != NULL && i < c->size; i++) {
		struct hpucoll__peer *p = &c->peers[i];

		while ((m = p->head) != NULL) {
			p->head = m->next;
			msg_free(m);
		}
		if (p->holding)
			zmq_msg_close(&p->held);
		p->holding = 0;
		if (c->failed && (c->got_abort || i == c->culprit)) {
			close_push(p);
			continue;
		}
		/* this rank failed first: its ABORT, queued to the others, goes
		 * out within the grace (at linger 0 a destroy right after the
		 * failure dropped it, and the peer said this rank "died" where
		 * the ABORT named the disagreement) */
		if (c->failed && p->push != NULL)
			set_int(p->push, ZMQ_LINGER, HPUCOLL__LOST_GRACE_MS);
		if (p->push != NULL && p->mon != NULL)
			zmq_socket_monitor(p->push, NULL, 0);
		if (p->mon != NULL)
			zmq_close(p->mon);
		if (p->push != NULL)
			zmq_close(p->push);
		p->push = p->mon = NULL; /* a second call closes nothing */
	}
}

/* Takes in what src's monitor says; redials when this communicator does
 * and the connection closed, a connection attempt failed, or a handshake
 * broke off without a verdict. */
static void read_monitor(hpucoll_comm *c, int src)
{
	struct hpucoll__peer *p = &c->peers[src];
	int own = redials(c);
	uint32_t value;
	uint16_t ev;

	while (hpucoll__monitor_event(p->mon, &ev, &value)) {
		if (ev == ZMQ_EVENT_CONNECTED) {
			p->lost = 0;
		} else if (ev == ZMQ_EVENT_DISCONNECTED) {
			if (!p->lost) {
				p->lost = 1;
				p->lost_ms = hpucoll__now_ms();
			}
			p->redial |= own;
		} else if (ev == ZMQ_EVENT_CLOSED ||
			   (own && ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)) {
			p->redial |= own;
		} else if (ev & HPUCOLL__HANDSHAKE_FAILED) {
			p->refused = 1;
			p->refused_status = ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
						    ? value
						    : 0;
		}
	}
	if (p->redial && !p->refused)
		redial(c, src);
}

/* Our connection to src failed its handshake: src refused our proof, or
 * the two use different security modes. ZeroMQ would retry forever. */
static int refused_by(hpucoll_comm *c, int src)
{
	if (c->peers[src].refused_status == HPUCOLL__ZAP_REPLAY) {
		hpucoll__set_error(c, "%s: rank %d refused this rank's "
				      "data-plane connection as a replay: it "
				      "had accepted the same one-time proof "
				      "before (this rank sends a fresh one on "
				      "every connection, so another process "
				      "presented it first).",
				   c->what, src);
		return HPUCOLL_ETRANSPORT;
	}
	if (c->peers[src].refused_status == HPUCOLL__ZAP_NOT_A_PEER) {
		hpucoll__set_error(c, "%s: rank %d refused this rank's "
				      "data-plane connection: it comes from an "
				      "address that is not in rank %d's rank "
				      "table (does this node connect from "
				      "another address than the one it bound?).",
				   c->what, src, src);
		return HPUCOLL_ETRANSPORT;
	}
	hpucoll__set_error(c, "%s: rank %d refused this rank's data-plane "
			      "connection (its security handshake failed): do "
			      "all ranks have the same job token and the same "
			      "--data-plane mode?",
			   c->what, src);
	return HPUCOLL_ETRANSPORT;
}

/* The sooner of two waits in ms (-1: none). */
static long soonest(long a, long b)
{
	if (a < 0)
		return b < 0 ? -1 : b;
	return b >= 0 && b < a ? b : a;
}

static int lost_peer(hpucoll_comm *c, int src)
{
	/* a partition between nodes reads the same as a death */
	hpucoll__set_error(c, "%s: rank %d died or cannot be reached (its "
			      "connection closed and did not come back).",
			   c->what, src);
	hpucoll__blame(c, src, HPUCOLL_EPEER);
	return HPUCOLL_EPEER;
}

/* ---- Sending ---- */

static int send_failed(hpucoll_comm *c, int dst)
{
	hpucoll__set_error(c, "%s: sending to rank %d failed: %s.", c->what,
			   dst, zmq_strerror(zmq_errno()));
	return zmq_errno() == ENOMEM ? HPUCOLL_ENOMEM : HPUCOLL_ETRANSPORT;
}

/* Waits until the connection to dst takes a message. With no high-water
 * mark, ZeroMQ turns a send away only while that connection has no pipe:
 * its handshake failed (dst refused us) and ZeroMQ will not retry, so a
 * blocking send would wait forever. */
static int wait_writable(hpucoll_comm *c, int dst, struct hpucoll__wait *w)
{
	struct hpucoll__peer *p = &c->peers[dst];
	zmq_pollitem_t items[2];
	int64_t now;
	long ms;
	int n;

	if (w->start < 0)
		hpucoll__wait_begin(c, w);
	for (;;) {
		read_monitor(c, dst);
		if (p->refused)
			return refused_by(c, dst);
		now = hpucoll__now_ms();
		if (w->deadline >= 0 && now >= w->deadline) {
			hpucoll__set_error(c, "%s: rank %d took no data for "
					      "%d ms (its connection is not "
					      "up).",
					   c->what, dst, w->timeout_ms);
			hpucoll__blame(c, dst, HPUCOLL_ETIMEDOUT); /* as the shm send does */
			return HPUCOLL_ETIMEDOUT;
		}
		if (p->lost && now - p->lost_ms >= HPUCOLL__LOST_GRACE_MS)
			return lost_peer(c, dst);
		ms = w->deadline < 0 ? -1 : (long)(w->deadline - now);
		ms = soonest(ms, redial_wait(c, dst, now));
		if (p->lost)
			ms = soonest(ms, (long)(p->lost_ms +
						HPUCOLL__LOST_GRACE_MS - now));
		/* A redial replaces the sockets: take them afresh. */
		n = 0;
		if (p->push != NULL)
			items[n++] = (zmq_pollitem_t){.socket = p->push,
						      .events = ZMQ_POLLOUT};
		if (p->mon != NULL)
			items[n++] = (zmq_pollitem_t){.socket = p->mon,
						      .events = ZMQ_POLLIN};
		n = zmq_poll(items, n, ms);
		if (n < 0 && zmq_errno() != EINTR)
			return hpucoll__zmq_error(c, "zmq_poll");
		if (n > 0 && items[0].socket == p->push &&
		    (items[0].revents & ZMQ_POLLOUT))
			return HPUCOLL_OK;
	}
}

/* Sends one frame to dst (ZMQ_SNDMORE in `more`), without blocking past
 * the communicator's timeout; the message is consumed either way. */
static int send_frame(hpucoll_comm *c, int dst, zmq_msg_t *m, int more)
{
	struct hpucoll__wait w = {.start = -1};
	int rc;

	while (zmq_msg_send(m, c->peers[dst].push, ZMQ_DONTWAIT | more) < 0) {
		if (zmq_errno() == EINTR)
			continue;
		rc = zmq_errno() == EAGAIN ? wait_writable(c, dst, &w)
					   : send_failed(c, dst);
		if (rc != HPUCOLL_OK) {
			zmq_msg_close(m);
			return rc;
		}
	}
	return HPUCOLL_OK;
}

/* Sends len bytes from data as one frame (a copy). */
static int send_copy(hpucoll_comm *c, int dst, const void *data, size_t len,
		     int more)
{
	zmq_msg_t m;

	if (zmq_msg_init_size(&m, len) != 0)
		return send_failed(c, dst);
	memcpy(zmq_msg_data(&m), data, len);
	return send_frame(c, dst, &m, more);
}

/* Sends the header frame, with ZMQ_SNDMORE when a payload follows. */
static int send_hdr(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr)
{
	unsigned char buf[HPUCOLL__HDR_SIZE];

	/* A connection known to have closed is redialed first, rather than
	 * given a message it would drop. */
	if (redials(c))
		read_monitor(c, dst);
	hpucoll__hdr_encode(buf, hdr);
	return send_copy(c, dst, buf, sizeof(buf),
			 hdr->len > 0 ? ZMQ_SNDMORE : 0);
}

/* Sends over ZeroMQ: copied, or in place when zc and the payload is large
 * enough. */
static int zmq_send_to(hpucoll_comm *c, int dst,
		       const struct hpucoll__hdr *hdr, const void *data, int zc)
{
	struct hpucoll__peer *p = &c->peers[dst];
	zmq_msg_t body;
	int rc;

	rc = send_hdr(c, dst, hdr);
	if (rc != HPUCOLL_OK || hdr->len == 0)
		return rc;
	if (!zc || hdr->len < HPUCOLL__ZC_MIN)
		return send_copy(c, dst, data, (size_t)hdr->len, 0);
	atomic_fetch_add_explicit(&p->zc, 1, memory_order_relaxed);
	if (zmq_msg_init_data(&body, (void *)data, (size_t)hdr->len, zc_free,
			      &p->zc) != 0) {
		atomic_fetch_sub(&p->zc, 1);
		return send_failed(c, dst);
	}
	c->zc_pending = 1;
	return send_frame(c, dst, &body, 0);
}

static void *zmq_send_buf(hpucoll_comm *c, int dst, size_t len)
{
	(void)dst;
	if (zmq_msg_init_size(&c->out, len) != 0)
		return NULL;
	return zmq_msg_data(&c->out);
}

static int zmq_send_commit(hpucoll_comm *c, int dst,
			   const struct hpucoll__hdr *hdr)
{
	int rc = send_hdr(c, dst, hdr);

	if (rc != HPUCOLL_OK || hdr->len == 0)
		zmq_msg_close(&c->out);
	else
		rc = send_frame(c, dst, &c->out, 0);
	return rc;
}

/* ---- Receiving from ZeroMQ ---- */

/* Receives one frame without blocking; returns 1 when one was there, 0
 * when not, or -1 with zmq_errno() set. */
static int recv_frame(hpucoll_comm *c, zmq_msg_t *f)
{
	for (;;) {
		if (zmq_msg_recv(f, c->pull, ZMQ_DONTWAIT) >= 0)
			return 1;
		if (zmq_errno() == EAGAIN)
			return 0;
		if (zmq_errno() != EINTR)
			return -1;
	}
}

/* Throws away the remaining frames of a multipart message. */
static void drain(hpucoll_comm *c, int more)
{
	zmq_msg_t f;

	while (more) {
		zmq_msg_init(&f);
		more = recv_frame(c, &f) == 1 && zmq_msg_more(&f);
		zmq_msg_close(&f);
	}
}

/* Reads the header frame of the next message into m->hdr and checks that
 * it can be attributed to a rank. `want` is the rank awaited, for errors.
 * Returns 1 on success, 0 when nothing was there, or -(hpucoll_err). */
static int read_hdr(hpucoll_comm *c, int want, struct hpucoll__msg *m)
{
	zmq_msg_t f;
	size_t size;
	int more, got;

	zmq_msg_init(&f);
	got = recv_frame(c, &f);
	if (got <= 0) {
		int rc = got == 0 ? 0 : -hpucoll__zmq_error(c, "zmq_msg_recv");

		zmq_msg_close(&f);
		return rc;
	}
	size = zmq_msg_size(&f);
	more = zmq_msg_more(&f);
	if (size == HPUCOLL__HDR_SIZE)
		hpucoll__hdr_decode(&m->hdr, zmq_msg_data(&f));
	zmq_msg_close(&f);
	if (size != HPUCOLL__HDR_SIZE || m->hdr.magic != HPUCOLL__MAGIC) {
		drain(c, more);
		hpucoll__set_error(c, "%s: received a malformed message (%s) "
				      "while waiting for rank %d.",
				   c->what,
				   size != HPUCOLL__HDR_SIZE ? "bad header size"
							     : "bad magic",
				   want);
		return -HPUCOLL_EPROTO;
	}
	if (m->hdr.src >= (uint32_t)c->size ||
	    m->hdr.src == (uint32_t)c->rank) {
		drain(c, more);
		hpucoll__set_error(c, "%s: received a message from rank "
				      "%" PRIu32 ", which is not a peer of "
				      "rank %d in a job of %d.",
				   c->what, m->hdr.src, c->rank, c->size);
		return -HPUCOLL_EPROTO;
	}
	if (more != (m->hdr.len > 0)) {
		drain(c, more);
		hpucoll__set_error(c, "%s: rank %" PRIu32 " sent a message "
				      "whose frames do not match its header.",
				   c->what, m->hdr.src);
		return -HPUCOLL_EPROTO;
	}
	return 1;
}

/* Reads the payload frame that read_hdr() said follows. */
static int read_body(hpucoll_comm *c, struct hpucoll__msg *m)
{
	int got = recv_frame(c, &m->body);

	if (got < 0)
		return hpucoll__zmq_error(c, "zmq_msg_recv");
	if (got == 0 || zmq_msg_size(&m->body) != m->hdr.len ||
	    zmq_msg_more(&m->body)) {
		drain(c, got == 1 && zmq_msg_more(&m->body));
		hpucoll__set_error(c, "%s: rank %" PRIu32 " sent a payload "
				      "that does not match its header.",
				   c->what, m->hdr.src);
		return HPUCOLL_EPROTO;
	}
	return HPUCOLL_OK;
}

/* An ABORT from another rank: its collective failed, so ours cannot
 * finish. Its sentence (printable characters only) becomes ours. */
static int took_abort(hpucoll_comm *c, const struct hpucoll__msg *m)
{
	const unsigned char *s = zmq_msg_data((zmq_msg_t *)&m->body);
	char why[HPUCOLL__ERRMSG_MAX];
	size_t n = 0;
	int code = m->hdr.arg;

	for (size_t i = 0; i < m->hdr.len && n + 1 < sizeof(why); i++)
		why[n++] = s[i] >= 0x20 && s[i] < 0x7f ? (char)s[i] : '?';
	why[n] = '\0';
	if (code <= HPUCOLL_EINVAL || code > HPUCOLL_EPEER)
		code = HPUCOLL_EABORTED;
	hpucoll__set_error(c, "%s: rank %" PRIu32 " gave up: %s", c->what,
			   m->hdr.src, why);
	/* off: the culprit its error blames, + 1; 0: none, so the sender
	 * itself failed first */
	if (m->hdr.off > 0 && m->hdr.off <= (uint64_t)c->size)
		hpucoll__blame(c, (int)m->hdr.off - 1, code);
	else
		hpucoll__blame(c, (int)m->hdr.src, HPUCOLL_EABORTED);
	c->got_abort = 1;
	return code;
}

/* Reads one whole message into a new *out (NULL if nothing was there). */
static int read_one(hpucoll_comm *c, int want, struct hpucoll__msg **out)
{
	struct hpucoll__msg *m;
	unsigned kind;
	int rc;

	*out = NULL;
	m = calloc(1, sizeof(*m));
	if (m == NULL)
		return HPUCOLL_ENOMEM;
	zmq_msg_init(&m->body);
	rc = read_hdr(c, want, m);
	if (rc <= 0) {
		msg_free(m);
		return -rc;
	}
	rc = HPUCOLL_OK;
	kind = m->hdr.kind & 15;
	if ((kind == HPUCOLL__ABORT && m->hdr.len >= HPUCOLL__ERRMSG_MAX) ||
	    ((kind == HPUCOLL__PROBE || kind == HPUCOLL__PROBE_REPLY) &&
	     m->hdr.len > 0)) {
		drain(c, 1);
		hpucoll__set_error(c, "%s: rank %" PRIu32 " sent an oversized "
				      "%s message.",
				   c->what, m->hdr.src,
				   kind == HPUCOLL__ABORT ? "abort" : "probe");
		msg_free(m);
		return HPUCOLL_EPROTO;
	}
	if (m->hdr.len > 0)
		rc = read_body(c, m);
	if (rc == HPUCOLL_OK && kind == HPUCOLL__ABORT)
		rc = took_abort(c, m);
	if (rc != HPUCOLL_OK) {
		msg_free(m);
		return rc;
	}
	*out = m;
	return HPUCOLL_OK;
}

/* Reads the next data message into a new *out (NULL if none was there),
 * answering probes and taking probe replies on the way. Stops after a
 * bounded number of those so that a flood cannot hold the caller. */
static int read_msg(hpucoll_comm *c, int want, struct hpucoll__msg **out)
{
	struct hpucoll__msg *m;
	int rc;

	for (int i = 0; i < 64; i++) {
		rc = read_one(c, want, out);
		m = *out;
		if (rc != HPUCOLL_OK || m == NULL)
			return rc;
		if (!hpucoll__probe_take(c, &m->hdr))
			return HPUCOLL_OK;
		msg_free(m);
		*out = NULL;
	}
	return HPUCOLL_OK;
}

static void enqueue(struct hpucoll__peer *p, struct hpucoll__msg *m)
{
	m->next = NULL;
	if (p->tail != NULL)
		p->tail->next = m;
	else
		p->head = m;
	p->tail = m;
}

static struct hpucoll__msg *dequeue(struct hpucoll__peer *p)
{
	struct hpucoll__msg *m = p->head;

	if (m != NULL) {
		p->head = m->next;
		if (p->head == NULL)
			p->tail = NULL;
	}
	return m;
}

/* Reads what ZeroMQ has without waiting, queueing it by sender; fails on
 * an ABORT or a malformed message. `want` names the awaited rank. */
int hpucoll__zmq_poll_aborts(hpucoll_comm *c, int want)
{
	struct hpucoll__msg *m;
	int rc;

	for (;;) {
		rc = read_msg(c, want, &m);
		if (rc != HPUCOLL_OK || m == NULL)
			return rc;
		enqueue(&c->peers[m->hdr.src], m);
	}
}

int hpucoll__zmq_await_abort(hpucoll_comm *c, int want, int64_t ms)
{
	zmq_pollitem_t item = {.socket = c->pull, .events = ZMQ_POLLIN};
	int64_t end = hpucoll__now_ms() + ms, left;
	int rc;

	for (;;) {
		rc = hpucoll__zmq_poll_aborts(c, want);
		if (rc != HPUCOLL_OK)
			return rc;
		left = end - hpucoll__now_ms();
		if (left <= 0)
			return HPUCOLL_OK;
		zmq_poll(&item, 1, (long)left);
	}
}

/* Waits until the receive socket has a message. Fails when the deadline
 * passes or the connection to `src` closed a grace period ago. */
static int wait_readable(hpucoll_comm *c, int src,
			 const struct hpucoll__wait *w)
{
	struct hpucoll__peer *p = &c->peers[src];
	zmq_pollitem_t items[2] = {
		{.socket = c->pull, .events = ZMQ_POLLIN},
		{.events = ZMQ_POLLIN},
	};
	int64_t now;
	long ms;
	int n;

	for (;;) {
		if (p->redial)
			read_monitor(c, src); /* redials when it is time */
		/* A redial replaces the monitor: take it afresh. */
		items[1].socket = p->mon;
		items[1].revents = 0;
		now = hpucoll__now_ms();
		if (w->deadline >= 0 && now >= w->deadline)
			return hpucoll__timed_out(c, w, src);
		if (p->lost && now - p->lost_ms >= HPUCOLL__LOST_GRACE_MS)
			return lost_peer(c, src);
		if (p->refused)
			return refused_by(c, src);
		if (hpucoll__stall_check(c, w, src, now) != HPUCOLL_OK)
			return HPUCOLL_EPROTO;
		ms = hpucoll__wait_ms(c, w, now,
				      soonest(p->lost ? (long)(p->lost_ms +
							       HPUCOLL__LOST_GRACE_MS -
							       now)
						      : -1,
					      redial_wait(c, src, now)));
		n = zmq_poll(items, p->mon != NULL ? 2 : 1, ms);
		if (n < 0 && zmq_errno() != EINTR)
			return hpucoll__zmq_error(c, "zmq_poll");
		if (n > 0 && (items[1].revents & ZMQ_POLLIN))
			read_monitor(c, src);
		if (n > 0 && (items[0].revents & ZMQ_POLLIN))
			return HPUCOLL_OK;
	}
}

/* Takes the next message from rank `src`, from its queue or the socket. */
static int next_from(hpucoll_comm *c, int src, struct hpucoll__msg **out)
{
	struct hpucoll__msg *m;
	struct hpucoll__wait w;
	int rc;

	*out = dequeue(&c->peers[src]);
	if (*out != NULL)
		return HPUCOLL_OK;
	hpucoll__wait_begin(c, &w);
	for (;;) {
		rc = read_msg(c, src, &m);
		if (rc != HPUCOLL_OK)
			return rc;
		if (m == NULL) {
			rc = wait_readable(c, src, &w);
			if (rc != HPUCOLL_OK)
				return rc;
			continue;
		}
		if (m->hdr.src == (uint32_t)src) {
			*out = m;
			return HPUCOLL_OK;
		}
		enqueue(&c->peers[m->hdr.src], m);
		/* Other ranks' traffic must not keep this wait alive. */
		if (w.deadline >= 0 && hpucoll__now_ms() >= w.deadline)
			return hpucoll__timed_out(c, &w, src);
	}
}

static int zmq_recv_from(hpucoll_comm *c, const struct hpucoll__hdr *want,
			 const void **data)
{
	struct hpucoll__peer *p = &c->peers[want->src];
	struct hpucoll__msg *m;
	int rc;

	rc = next_from(c, (int)want->src, &m);
	if (rc != HPUCOLL_OK)
		return rc;
	rc = hpucoll__check_hdr(c, want, &m->hdr);
	if (rc == HPUCOLL_OK) {
		zmq_msg_init(&p->held);
		zmq_msg_move(&p->held, &m->body);
		p->holding = 1;
		*data = zmq_msg_data(&p->held);
	}
	msg_free(m);
	return rc;
}

static void zmq_release(hpucoll_comm *c, int src)
{
	struct hpucoll__peer *p = &c->peers[src];

	if (p->holding) {
		zmq_msg_close(&p->held);
		p->holding = 0;
	}
}

const struct hpucoll__transport hpucoll__zmq_transport = {
	.send = zmq_send_to,
	.send_buf = zmq_send_buf,
	.send_commit = zmq_send_commit,
	.recv = zmq_recv_from,
	.release = zmq_release,
};

/* ---- Zero-copy fence and failure ---- */

/* Sleeps a little longer each time, from a yield to 1 ms. */
static void backoff(int *round)
{
	struct timespec ts = {0, 0};

	if (*round < 16) {
		sched_yield();
	} else {
		ts.tv_nsec = *round < 64 ? 20000 : 1000000;
		nanosleep(&ts, NULL);
	}
	(*round)++;
}

static int zc_held(struct hpucoll__peer *p)
{
	return atomic_load_explicit(&p->zc, memory_order_acquire) > 0;
}

int hpucoll__zmq_fence(hpucoll_comm *c)
{
	struct hpucoll__wait w;
	int64_t polled;
	int round = 0, rc;

	if (!c->zc_pending)
		return HPUCOLL_OK;
	hpucoll__wait_begin(c, &w);
	polled = w.start;
	for (int i = 0; i < c->size; i++) {
		struct hpucoll__peer *p = &c->peers[i];

		while (i != c->rank && zc_held(p)) {
			int64_t now = hpucoll__now_ms();

			if (w.deadline >= 0 && now >= w.deadline) {
				if (hpucoll__disagreement(c) != HPUCOLL_OK)
					return HPUCOLL_EPROTO;
				hpucoll__set_error(c, "%s: rank %d took no "
						      "data for %d ms (is it "
						      "alive?).",
						   c->what, i, w.timeout_ms);
				return HPUCOLL_ETIMEDOUT;
			}
			read_monitor(c, i);
			if (p->lost &&
			    now - p->lost_ms >= HPUCOLL__LOST_GRACE_MS)
				return lost_peer(c, i);
			rc = hpucoll__stall_check(c, &w, i, now);
			if (rc != HPUCOLL_OK)
				return rc;
			/* Now and then: aborts, and probes to answer. */
			if (now - polled >= HPUCOLL__SLICE_MS) {
				polled = now;
				rc = hpucoll__zmq_poll_aborts(c, i);
				if (rc != HPUCOLL_OK)
					return rc;
			}
			backoff(&round);
		}
	}
	c->zc_pending = 0;
	return HPUCOLL_OK;
}

/* Sends our error sentence to every peer, without waiting. */
static void send_aborts(hpucoll_comm *c, int rc)
{
	struct hpucoll__hdr h = {
		.magic = HPUCOLL__MAGIC,
		.src = (uint32_t)c->rank,
		.seq = c->seq,
		.kind = HPUCOLL__ABORT,
		.arg = (uint8_t)rc,
		.off = (uint64_t)(c->culprit + 1),
	};
	char msg[HPUCOLL__ERRMSG_MAX];
	unsigned char buf[HPUCOLL__HDR_SIZE];

	pthread_mutex_lock(&c->errlock);
	snprintf(msg, sizeof(msg), "%s", c->errmsg);
	pthread_mutex_unlock(&c->errlock);
	h.len = strlen(msg);
	hpucoll__hdr_encode(buf, &h);
	/* Best effort, and silent: a peer that cannot take it (its
	 * connection refused or gone) must not replace our error sentence
	 * with "sending failed". */
	for (int i = 0; i < c->size; i++) {
		if (i == c->rank || c->peers[i].push == NULL ||
		    zmq_send(c->peers[i].push, buf, sizeof(buf),
			     ZMQ_DONTWAIT | (h.len > 0 ? ZMQ_SNDMORE : 0)) < 0)
			continue;
		if (h.len > 0)
			zmq_send(c->peers[i].push, msg, h.len, ZMQ_DONTWAIT);
	}
}

void hpucoll__zmq_fail(hpucoll_comm *c, int rc)
{
	int64_t t0 = hpucoll__now_ms();
	int round = 0, left;

	if (!c->got_abort)
		send_aborts(c, rc);
	if (!c->zc_pending)
		return;
	/* Give ZeroMQ a moment to finish what it is sending; then drop what
	 * is left for peers that do not take it, which releases it. */
	for (int i = 0; i < c->size; i++) {
		struct hpucoll__peer *p = &c->peers[i];

		while (i != c->rank && zc_held(p) &&
		       hpucoll__now_ms() - t0 < HPUCOLL__LOST_GRACE_MS)
			backoff(&round);
		if (i != c->rank && zc_held(p) && p->push != NULL) {
			zmq_socket_monitor(p->push, NULL, 0);
			set_int(p->push, ZMQ_LINGER, 0);
			zmq_close(p->push);
			p->push = NULL;
		}
	}
	do {
		left = 0;
		for (int i = 0; i < c->size; i++)
			left += i != c->rank && zc_held(&c->peers[i]);
		if (left > 0)
			backoff(&round);
	} while (left > 0 && hpucoll__now_ms() - t0 < 10000);
	if (left > 0)
		hpucoll__log(HPUCOLL_LOG_WARNING,
			     "hpucoll: rank %d: ZeroMQ still holds "
			     "zero-copy sends to %d peers after a "
			     "failure",
			     c->rank, left);
	c->zc_pending = 0;
}
