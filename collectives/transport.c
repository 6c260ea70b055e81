/* The ZeroMQ transport: one PULL socket per rank receives from everyone,
 * one PUSH socket per peer (made on first use) sends. ZeroMQ keeps the
 * order of messages on each connection, so a message that arrives from a
 * rank other than the one awaited is queued for that rank and handed out
 * later in order. Nothing read off the wire is trusted: every frame is
 * checked and anything unexpected is HPUCOLL_EPROTO. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <time.h>

#include "comm_internal.h"

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int set_int(void *sock, int opt, int v)
{
	return zmq_setsockopt(sock, opt, &v, sizeof(v));
}

/* ZeroMQ's send timeout: -1 waits forever. */
static int send_timeout(const hpucoll_comm *c)
{
	return c->timeout_ms < 0 ? -1 : c->timeout_ms;
}

static int peer_socket(hpucoll_comm *c, int dst, void **out)
{
	struct hpucoll__peer *p = &c->peers[dst];
	void *s;

	if (p->push != NULL) {
		*out = p->push;
		return HPUCOLL_OK;
	}
	s = zmq_socket(c->ctx, ZMQ_PUSH);
	if (s == NULL)
		return hpucoll__zmq_error(c, "zmq_socket");
	if (set_int(s, ZMQ_SNDHWM, 0) != 0 ||
	    set_int(s, ZMQ_LINGER, HPUCOLL__LINGER_MS) != 0 ||
	    set_int(s, ZMQ_IMMEDIATE, 0) != 0 ||
	    set_int(s, ZMQ_SNDTIMEO, send_timeout(c)) != 0) {
		zmq_close(s);
		return hpucoll__zmq_error(c, "zmq_setsockopt");
	}
	if (zmq_connect(s, p->endpoint) != 0) {
		hpucoll__set_error(c, "%s: cannot connect to rank %d at %s: "
				      "%s.",
				   c->what, dst, p->endpoint,
				   zmq_strerror(zmq_errno()));
		zmq_close(s);
		return HPUCOLL_ETRANSPORT;
	}
	p->push = s;
	*out = s;
	return HPUCOLL_OK;
}

void hpucoll__peers_set_timeout(hpucoll_comm *c)
{
	for (int i = 0; c->peers != NULL && i < c->size; i++) {
		if (c->peers[i].push != NULL)
			set_int(c->peers[i].push, ZMQ_SNDTIMEO,
				send_timeout(c));
	}
}

static void msg_free(struct hpucoll__msg *m)
{
	zmq_msg_close(&m->body);
	free(m);
}

void hpucoll__peers_free(hpucoll_comm *c)
{
	struct hpucoll__msg *m;

	for (int i = 0; c->peers != NULL && i < c->size; i++) {
		struct hpucoll__peer *p = &c->peers[i];

		while ((m = p->head) != NULL) {
			p->head = m->next;
			msg_free(m);
		}
		if (p->push != NULL)
			zmq_close(p->push);
		free(p->endpoint);
	}
	free(c->peers);
	c->peers = NULL;
}

static int send_error(hpucoll_comm *c, int dst)
{
	if (zmq_errno() != EAGAIN)
		return hpucoll__zmq_error(c, "zmq_send");
	hpucoll__set_error(c, "%s: could not send to rank %d for %d ms "
			      "(is it alive?).",
			   c->what, dst, c->timeout_ms);
	return HPUCOLL_ETIMEDOUT;
}

/* Sends the header frame, with ZMQ_SNDMORE when a payload follows. */
static int send_hdr(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		    void **sock)
{
	unsigned char buf[HPUCOLL__HDR_SIZE];
	int rc;

	rc = peer_socket(c, dst, sock);
	if (rc != HPUCOLL_OK)
		return rc;
	hpucoll__hdr_encode(buf, hdr);
	while (zmq_send(*sock, buf, sizeof(buf),
			hdr->len > 0 ? ZMQ_SNDMORE : 0) < 0) {
		if (zmq_errno() != EINTR)
			return send_error(c, dst);
	}
	return HPUCOLL_OK;
}

int hpucoll__send(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		  const void *data)
{
	void *sock;
	int rc;

	rc = send_hdr(c, dst, hdr, &sock);
	if (rc != HPUCOLL_OK || hdr->len == 0)
		return rc;
	while (zmq_send(sock, data, (size_t)hdr->len, 0) < 0) {
		if (zmq_errno() != EINTR)
			return send_error(c, dst);
	}
	return HPUCOLL_OK;
}

int hpucoll__send_msg(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		      zmq_msg_t *body)
{
	void *sock;
	int rc;

	rc = send_hdr(c, dst, hdr, &sock);
	if (rc != HPUCOLL_OK || hdr->len == 0)
		goto out;
	while (zmq_msg_send(body, sock, 0) < 0) {
		if (zmq_errno() != EINTR) {
			rc = send_error(c, dst);
			goto out;
		}
	}
	return HPUCOLL_OK;
out:
	zmq_msg_close(body);
	return rc;
}

static int timed_out(hpucoll_comm *c, int src)
{
	hpucoll__set_error(c, "%s: no data from rank %d after %d ms "
			      "(is it alive?).",
			   c->what, src, c->timeout_ms);
	return HPUCOLL_ETIMEDOUT;
}

/* Waits until the receive socket has a message or the deadline passes
 * (deadline < 0: never). Returns HPUCOLL_ETIMEDOUT naming rank `src`. */
static int wait_readable(hpucoll_comm *c, int src, int64_t deadline)
{
	zmq_pollitem_t item = {.socket = c->pull, .events = ZMQ_POLLIN};
	long wait;
	int n;

	for (;;) {
		wait = -1;
		if (deadline >= 0) {
			int64_t left = deadline - now_ms();

			wait = left > 0 ? (long)left : 0;
		}
		n = zmq_poll(&item, 1, wait);
		if (n > 0)
			return HPUCOLL_OK;
		if (n < 0 && zmq_errno() != EINTR)
			return hpucoll__zmq_error(c, "zmq_poll");
		if (n == 0 && wait == 0)
			return timed_out(c, src);
	}
}

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

/* Reads one whole message into a new *out (NULL if nothing was there). */
static int read_msg(hpucoll_comm *c, int want, struct hpucoll__msg **out)
{
	struct hpucoll__msg *m;
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
	if (m->hdr.len > 0) {
		rc = read_body(c, m);
		if (rc != HPUCOLL_OK) {
			msg_free(m);
			return rc;
		}
	}
	*out = m;
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

static const char *kind_name(unsigned kind)
{
	switch (kind) {
	case HPUCOLL__ALL_REDUCE:
		return "all_reduce";
	case HPUCOLL__BROADCAST:
		return "broadcast";
	case HPUCOLL__BARRIER:
		return "barrier";
	default:
		return "unknown";
	}
}

/* Checks that a message is the one expected; the sender is already
 * known to match. */
static int check(hpucoll_comm *c, const struct hpucoll__hdr *want,
		 const struct hpucoll__hdr *got)
{
	if (got->seq == want->seq && got->kind == want->kind &&
	    got->arg == want->arg && got->tag == want->tag &&
	    got->off == want->off && got->len == want->len)
		return HPUCOLL_OK;
	hpucoll__set_error(
		c,
		"%s: rank %" PRIu32 " sent collective #%" PRIu32 " (%s, arg "
		"%u, tag %u, offset %" PRIu64 ", %" PRIu64 " bytes) where "
		"#%" PRIu32 " (%s, arg %u, tag %u, offset %" PRIu64 ", %" PRIu64
		" bytes) "
		"was expected; do all ranks call the same collectives with the "
		"same arguments?",
		c->what, got->src, got->seq, kind_name(got->kind),
		(unsigned)got->arg, (unsigned)got->tag, got->off, got->len,
		want->seq, kind_name(want->kind), (unsigned)want->arg,
		(unsigned)want->tag, want->off, want->len);
	return HPUCOLL_EPROTO;
}

/* Takes the next message from rank `src`, from its queue or the socket. */
static int next_from(hpucoll_comm *c, int src, struct hpucoll__msg **out)
{
	int64_t deadline = c->timeout_ms < 0 ? -1 : now_ms() + c->timeout_ms;
	struct hpucoll__msg *m;
	int rc;

	*out = dequeue(&c->peers[src]);
	while (*out == NULL) {
		rc = wait_readable(c, src, deadline);
		if (rc == HPUCOLL_OK)
			rc = read_msg(c, src, &m);
		if (rc != HPUCOLL_OK)
			return rc;
		if (m == NULL)
			continue;
		if (m->hdr.src == (uint32_t)src) {
			*out = m;
			break;
		}
		enqueue(&c->peers[m->hdr.src], m);
		/* Other ranks' traffic must not keep this wait alive. */
		if (deadline >= 0 && now_ms() >= deadline)
			return timed_out(c, src);
	}
	return HPUCOLL_OK;
}

int hpucoll__recv(hpucoll_comm *c, const struct hpucoll__hdr *want,
		  zmq_msg_t *body)
{
	struct hpucoll__msg *m;
	int rc;

	rc = next_from(c, (int)want->src, &m);
	if (rc != HPUCOLL_OK)
		return rc;
	rc = check(c, want, &m->hdr);
	if (rc == HPUCOLL_OK) {
		zmq_msg_init(body);
		zmq_msg_move(body, &m->body);
	}
	msg_free(m);
	return rc;
}
