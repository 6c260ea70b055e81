/* The transports behind one dispatch: each pair of ranks talks over shared
 * memory (shm.c) when both are on one node and the transport allows it,
 * else over ZeroMQ. The algorithms see only hpucoll__send / send_buf /
 * recv / release / fence.
 *
 * ZeroMQ: one PULL socket per rank receives from everyone; one PUSH socket
 * per peer, connected at connect time, sends. ZeroMQ keeps the order of
 * messages on each connection, so a message that arrives from a rank other
 * than the one awaited is queued for that rank and handed out later in
 * order. Payloads of HPUCOLL__ZC_MIN bytes or more are sent in place
 * (zmq_msg_init_data): each such message counts up the peer's `zc`, the
 * free callback (on ZeroMQ's I/O thread) counts it down, and
 * hpucoll__fence() waits for zero before a collective returns, so that
 * ZeroMQ holds no pointer into the caller's buffers afterwards. Every PUSH
 * socket has a monitor: when its connection closes (the peer died, or
 * ZeroMQ heartbeats found it silent) a wait for that peer ends with an
 * error naming it shortly after, instead of at the timeout.
 *
 * Nothing read off the wire is trusted: every frame is checked and
 * anything unexpected is HPUCOLL_EPROTO.
 *
 * Stall warnings: once one wait of a collective has lasted the stall
 * threshold, the rank sends HPUCOLL__PROBE to every peer over ZeroMQ and
 * goes on waiting. Every rank answers probes whenever it reads its
 * receive socket, i.e. while it waits inside a collective; a rank busy
 * outside the library does not, and that is what "not arrived" means.
 * After the replies are in, or probe_window() at most, the rank prints
 * one line to stderr naming the ranks that have arrived at its collective
 * (replied from it or a later one, or sent data of it) and those that
 * have not (no answer, or the earlier collective they are in). Probes and
 * replies are taken out in read_msg() and never reach a header check.
 *
 * Traffic counters (comm->stats): every payload between two ranks passes
 * through hpucoll__send, hpucoll__send_commit and hpucoll__recv, which
 * count it once the transport has taken it (queued to ZeroMQ, in place or
 * copied, or written into a shared-memory slot) or handed it out. Headers
 * and ABORT sentences are not payload and are not counted; ZeroMQ's
 * heartbeats never pass through here.
 */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "comm_internal.h"
#include "shm.h"

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

/* ---- Waiting: deadlines, stall warnings ---- */

struct wait {
	int64_t start;
	int64_t deadline; /* -1: never */
	int timeout_ms;
};

static void wait_begin(hpucoll_comm *c, struct wait *w)
{
	w->timeout_ms = atomic_load(&c->timeout_ms);
	w->start = now_ms();
	w->deadline = w->timeout_ms < 0 ? -1 : w->start + w->timeout_ms;
}

/* Whether collective a comes at or after collective b. */
static int seq_ge(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) >= 0;
}

/* How long the replies to a stall probe are gathered: half the threshold,
 * at most 1 s, and at least two of the slices in which ranks waiting on
 * shared memory look at their socket (else they could not answer). */
static int64_t probe_window(const hpucoll_comm *c)
{
	int64_t w = c->stall_ms / 2 < 1000 ? c->stall_ms / 2 : 1000;
	return w < 2 * HPUCOLL__SLICE_MS ? 2 * HPUCOLL__SLICE_MS : w;
}

static int peer_state(const hpucoll_comm *c, int i);

/* A rank that sent data of this collective may be slow to answer on a
 * loaded machine rather than stopped: it gets this long before the
 * warning calls it silent. */
#define HPUCOLL__SILENT_MS 2000

/* When the warning of the probe that went out is due: at the end of the
 * probe's window, or later while a rank that sent data has not answered. */
static int64_t report_due(const hpucoll_comm *c)
{
	int64_t w = probe_window(c);

	for (int i = 0; i < c->size && w < HPUCOLL__SILENT_MS; i++)
		if (peer_state(c, i) == -2)
			w = HPUCOLL__SILENT_MS;
	return c->probe_ms + w;
}

/* When the stall check of wait w has something to do next: the threshold
 * (send the probe) or the end of the probe's window (print the warning);
 * -1 when nothing. */
static int64_t stall_due(const hpucoll_comm *c, const struct wait *w)
{
	if (c->stall_ms <= 0 || c->stall_warned)
		return -1;
	if (c->probe_seq != c->seq)
		return w->start + c->stall_ms;
	return report_due(c);
}

/* Milliseconds until the next thing a wait must look at (the deadline or
 * the stall check), at most `cap`; -1 when there is none and no cap. */
static long wait_ms(const hpucoll_comm *c, const struct wait *w, int64_t now,
		    long cap)
{
	int64_t ms = cap, left, due = stall_due(c, w);
	int bounded = cap >= 0;

	if (w->deadline >= 0) {
		left = w->deadline - now;
		if (!bounded || left < ms)
			ms = left;
		bounded = 1;
	}
	if (due >= 0) {
		left = due - now;
		if (!bounded || left < ms)
			ms = left;
		bounded = 1;
	}
	if (!bounded)
		return -1;
	return ms < 0 ? 0 : (long)ms;
}

/* Sends a header-only control message (a probe or a reply) to rank dst
 * over ZeroMQ, without waiting; best effort, errors are ignored. */
static void send_ctl(hpucoll_comm *c, int dst, const struct hpucoll__hdr *h)
{
	unsigned char buf[HPUCOLL__HDR_SIZE];

	if (c->peers[dst].push == NULL)
		return;
	hpucoll__hdr_encode(buf, h);
	zmq_send(c->peers[dst].push, buf, sizeof(buf), ZMQ_DONTWAIT);
}

/* Where peer i stands relative to our collective, once a probe went out:
 * 1 arrived (its reply says it is in this collective or past it, or it is
 * us), 0 not arrived (it answered from an earlier one), -1 no answer, -2
 * no answer although it sent us data of this collective: it stopped in
 * the middle of it (frozen, or stuck in a callback). A rank that sent
 * data but was never asked counts as arrived. */
static int peer_state(const hpucoll_comm *c, int i)
{
	const struct hpucoll__peer *p = &c->peers[i];

	if (i == c->rank)
		return 1;
	if (p->reply_to == c->seq)
		return seq_ge(p->reply_seq, c->seq);
	if (c->probe_seq != c->seq)
		return seq_ge(p->seen_seq, c->seq) ? 1 : -1;
	return seq_ge(p->seen_seq, c->seq) ? -2 : -1;
}

/* Whether every peer's state is known, so that the window can end early. */
static int probe_done(const hpucoll_comm *c)
{
	for (int i = 0; i < c->size; i++)
		if (peer_state(c, i) < 0)
			return 0;
	return 1;
}

/* A line being built, cut with "..." when it would not fit. */
struct line {
	char buf[1536];
	size_t n;
	int cut;
};

static void add(struct line *l, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void add(struct line *l, const char *fmt, ...)
{
	size_t room = sizeof(l->buf) - 4 - l->n; /* keeps room for "..." */
	va_list ap;
	int k;

	if (l->cut)
		return;
	va_start(ap, fmt);
	k = vsnprintf(l->buf + l->n, room, fmt, ap);
	va_end(ap);
	if (k < 0 || (size_t)k >= room) {
		l->buf[l->n] = '\0';
		strcat(l->buf + l->n, "...");
		l->n += 3;
		l->cut = 1;
		return;
	}
	l->n += (size_t)k;
}

/* Whether peers i and j are to be reported alike (same state and, when
 * they answered from an earlier collective, the same one). */
static int alike(const hpucoll_comm *c, int i, int j)
{
	int s = peer_state(c, i);

	if (s != peer_state(c, j))
		return 0;
	return s != 0 || (c->peers[i].reply_seq == c->peers[j].reply_seq &&
			  (c->peers[i].reply_kind & 15) ==
				  (c->peers[j].reply_kind & 15));
}

/* Lists the ranks that have arrived (want 1: "ranks 0, 1, 3", "ranks
 * 4-9") or not (want 0, with the reason after each run of alike ranks). */
static void list_ranks(const hpucoll_comm *c, struct line *l, int want)
{
	int count = 0, runs = 0;

	for (int i = 0; i < c->size; i++)
		count += want == 1 ? peer_state(c, i) == 1
				   : peer_state(c, i) < 1;
	if (count == 0) {
		add(l, "none");
		return;
	}
	if (want == 1)
		add(l, count == 1 ? "rank " : "ranks ");
	for (int i = 0, j; i < c->size; i = j) {
		int s = peer_state(c, i);

		j = i + 1;
		if ((want == 1) != (s == 1))
			continue;
		while (j < c->size && alike(c, i, j))
			j++;
		add(l, "%s", runs++ ? ", " : "");
		if (want != 1)
			add(l, j - i > 1 ? "ranks " : "rank ");
		if (j - i > 2 || (want != 1 && j - i > 1))
			add(l, "%d-%d", i, j - 1);
		else if (j - i == 2)
			add(l, "%d, %d", i, i + 1);
		else
			add(l, "%d", i);
		if (s == -2)
			add(l, " (sent data of it, then no answer)");
		else if (s < 0)
			add(l, " (no answer)");
		else if (s == 0)
			add(l, " (at collective #%" PRIu32 " %s)",
			    c->peers[i].reply_seq,
			    hpucoll__kind_name(c->peers[i].reply_kind));
	}
}

/* Prints the one stall warning of the collective, as one line: which
 * ranks have arrived at it and which have not, then `tail`. */
static void stall_warn(hpucoll_comm *c, int64_t now, const char *tail)
{
	struct line l = {.n = 0};

	c->stall_warned = 1;
	add(&l, "arrived: ");
	list_ranks(c, &l, 1);
	add(&l, "; not arrived: ");
	list_ranks(c, &l, 0);
	fprintf(stderr,
		"hpucoll: rank %d: %s (collective #%" PRIu32 ") has waited "
		"%" PRId64 " ms for rank %d; %s; %s\n",
		c->rank, c->what, c->seq, now - c->stall_start, c->stall_peer,
		l.buf, tail);
}

/* Asks every peer where it is (see HPUCOLL__PROBE). */
static void send_probes(hpucoll_comm *c)
{
	struct hpucoll__hdr h = {
		.magic = HPUCOLL__MAGIC,
		.src = (uint32_t)c->rank,
		.seq = c->seq,
		.kind = HPUCOLL__PROBE,
	};

	for (int i = 0; i < c->size; i++)
		if (i != c->rank)
			send_ctl(c, i, &h);
}

/* The stall check of a wait for `peer`, called by every wait loop. Once
 * the wait has lasted c->stall_ms it sends a probe to every peer; the
 * replies come in while the wait goes on (read_msg takes them); once all
 * peers are accounted for, or after probe_window(), it prints the one
 * warning of the collective. */
static void stall_check(hpucoll_comm *c, const struct wait *w, int peer,
			int64_t now)
{
	char tail[64];

	if (c->stall_ms <= 0 || c->stall_warned)
		return;
	if (c->probe_seq != c->seq) {
		if (now - w->start < c->stall_ms)
			return;
		c->probe_seq = c->seq;
		c->probe_ms = now;
		c->stall_start = w->start;
		c->stall_peer = peer;
		send_probes(c);
	}
	if (now < report_due(c) && !probe_done(c))
		return;
	snprintf(tail, sizeof(tail), "still waiting (timeout %d ms)",
		 w->timeout_ms);
	stall_warn(c, now, tail);
}

/* A collective ends while its probe's window is open: prints the warning
 * with what is known (the threshold did pass). */
static void stall_flush(hpucoll_comm *c, const char *tail)
{
	if (c->stall_ms > 0 && !c->stall_warned && c->probe_seq == c->seq &&
	    c->seq != 0)
		stall_warn(c, now_ms(), tail);
}

/* A wait for src timed out. When the stall probe of this collective found
 * ranks that do not answer while src does (it waits too), those ranks
 * hold the job up, and the error names them rather than src. */
static int timed_out(hpucoll_comm *c, const struct wait *w, int src)
{
	struct line l = {.n = 0};
	int n = 0;

	for (int i = 0; c->probe_seq == c->seq && i < c->size; i++) {
		if (peer_state(c, i) < 0) {
			add(&l, "%s%d", n ? ", " : "", i);
			n++;
		}
	}
	if (n > 0 && peer_state(c, src) >= 0) {
		hpucoll__set_error(c, "%s: rank%s %s stopped answering "
				      "(frozen, or stuck outside the "
				      "library?); this rank waited %d ms for "
				      "rank %d, which waits too.",
				   c->what, n > 1 ? "s" : "", l.buf,
				   w->timeout_ms, src);
		return HPUCOLL_ETIMEDOUT;
	}
	hpucoll__set_error(c, "%s: no data from rank %d after %d ms "
			      "(is it alive?).",
			   c->what, src, w->timeout_ms);
	return HPUCOLL_ETIMEDOUT;
}

/* ---- Sockets ---- */

/* Counts a zero-copy send down once ZeroMQ is done with its bytes. */
static void zc_free(void *data, void *hint)
{
	(void)data;
	atomic_fetch_sub_explicit((atomic_int *)hint, 1, memory_order_release);
}

/* Watches the connection of `push` through a PAIR socket. */
static int monitor(hpucoll_comm *c, int dst, void *push, void **out)
{
	char ep[96];
	void *m;

	snprintf(ep, sizeof(ep), "inproc://hpucoll-mon-%p-%d", (void *)c, dst);
	if (zmq_socket_monitor(push, ep,
			       ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED |
				       HPUCOLL__HANDSHAKE_FAILED) != 0)
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
	int rc;

	if (s == NULL)
		return hpucoll__zmq_error(c, "zmq_socket");
	p->push = s;
	if (set_int(s, ZMQ_SNDHWM, 0) != 0 ||
	    set_int(s, ZMQ_LINGER, HPUCOLL__LINGER_MS) != 0 ||
	    set_int(s, ZMQ_IMMEDIATE, 0) != 0 ||
	    set_int(s, ZMQ_HEARTBEAT_IVL, HPUCOLL__HEARTBEAT_IVL_MS) != 0 ||
	    set_int(s, ZMQ_HEARTBEAT_TIMEOUT,
		    HPUCOLL__HEARTBEAT_TIMEOUT_MS) != 0 ||
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

/* Shared memory carries the pairs of one node when the topology says
 * where ranks are and the transport is AUTO or SHM. */
static int shm_on(const hpucoll_comm *c)
{
	return c->node_ids != NULL &&
	       (c->transport == HPUCOLL_TRANSPORT_AUTO ||
		c->transport == HPUCOLL_TRANSPORT_SHM);
}

size_t hpucoll__link_max(const hpucoll_comm *c, int a, int b)
{
	if (a != b && shm_on(c) && c->node_ids[a] == c->node_ids[b])
		return HPUCOLL__SHM_MAX_PAYLOAD < HPUCOLL__SEG_BYTES
			       ? HPUCOLL__SHM_MAX_PAYLOAD
			       : HPUCOLL__SEG_BYTES;
	return HPUCOLL__SEG_BYTES;
}

/* Attaches this node's segment and numbers the node's ranks. */
static int open_shm(hpucoll_comm *c)
{
	int node = c->node_ids[c->rank], nlocal = 0, local = 0, rc;
	char err[256] = "";

	for (int i = 0; i < c->size; i++) {
		if (c->node_ids[i] != node)
			continue;
		if (i == c->rank)
			local = nlocal;
		else
			c->peers[i].shm = nlocal;
		nlocal++;
	}
	if (nlocal < 2)
		return HPUCOLL_OK;
	c->shm_buf = malloc(HPUCOLL__SHM_MAX_PAYLOAD);
	if (c->shm_buf == NULL)
		return HPUCOLL_ENOMEM;
	rc = hpucoll__shm_open(&c->shm, c->job, node, local, nlocal,
			       atomic_load(&c->timeout_ms), err, sizeof(err));
	if (rc != HPUCOLL_OK)
		hpucoll__set_error(c, "connect: rank %d cannot attach the "
				      "shared memory of node %d: %s.",
				   c->rank, node, err);
	return rc;
}

int hpucoll__transport_open(hpucoll_comm *c)
{
	int rc;

	for (int i = 0; i < c->size; i++) {
		if (i == c->rank)
			continue;
		rc = open_push(c, i);
		if (rc != HPUCOLL_OK)
			return rc;
	}
	return shm_on(c) ? open_shm(c) : HPUCOLL_OK;
}

static void msg_free(struct hpucoll__msg *m)
{
	zmq_msg_close(&m->body);
	free(m);
}

void hpucoll__transport_close(hpucoll_comm *c)
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
		if (p->push != NULL && p->mon != NULL)
			zmq_socket_monitor(p->push, NULL, 0);
		if (p->mon != NULL)
			zmq_close(p->mon);
		if (p->push != NULL) {
			if (c->failed)
				set_int(p->push, ZMQ_LINGER, 0);
			zmq_close(p->push);
		}
		free(p->endpoint);
	}
	free(c->peers);
	c->peers = NULL;
	hpucoll__shm_close(&c->shm);
	free(c->shm_buf);
	c->shm_buf = NULL;
}

/* Reads the monitor events of peer `src` that are waiting. */
int hpucoll__monitor_event(void *mon, uint16_t *ev)
{
	zmq_msg_t f;
	int more;

	zmq_msg_init(&f);
	if (zmq_msg_recv(&f, mon, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&f);
		return 0;
	}
	*ev = 0;
	if (zmq_msg_size(&f) >= 2)
		memcpy(ev, zmq_msg_data(&f), sizeof(*ev));
	more = zmq_msg_more(&f);
	zmq_msg_close(&f);
	while (more) { /* the endpoint frame */
		zmq_msg_init(&f);
		more = zmq_msg_recv(&f, mon, 0) >= 0 && zmq_msg_more(&f);
		zmq_msg_close(&f);
	}
	return 1;
}

static void read_monitor(hpucoll_comm *c, int src)
{
	struct hpucoll__peer *p = &c->peers[src];
	uint16_t ev;

	while (hpucoll__monitor_event(p->mon, &ev)) {
		if (ev == ZMQ_EVENT_CONNECTED) {
			p->lost = 0;
		} else if (ev == ZMQ_EVENT_DISCONNECTED && !p->lost) {
			p->lost = 1;
			p->lost_ms = now_ms();
		} else if (ev & HPUCOLL__HANDSHAKE_FAILED) {
			p->refused = 1;
		}
	}
}

/* Our connection to src failed its handshake: src refused our proof, or
 * the two use different security modes. ZeroMQ would retry forever. */
static int refused_by(hpucoll_comm *c, int src)
{
	hpucoll__set_error(c, "%s: rank %d refused this rank's data-plane "
			      "connection (its security handshake failed): do "
			      "all ranks have the same job token and the same "
			      "--data-plane mode?",
			   c->what, src);
	return HPUCOLL_ETRANSPORT;
}

static int lost_peer(hpucoll_comm *c, int src)
{
	hpucoll__set_error(c, "%s: rank %d died (its connection closed and "
			      "did not come back).",
			   c->what, src);
	return HPUCOLL_EPEER;
}

/* ---- Sending ---- */

static int zmq_fail(hpucoll_comm *c, int dst)
{
	hpucoll__set_error(c, "%s: sending to rank %d failed: %s.", c->what,
			   dst, zmq_strerror(zmq_errno()));
	return zmq_errno() == ENOMEM ? HPUCOLL_ENOMEM : HPUCOLL_ETRANSPORT;
}

/* Sends the header frame, with ZMQ_SNDMORE when a payload follows. */
static int send_hdr(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		    int flags)
{
	unsigned char buf[HPUCOLL__HDR_SIZE];

	hpucoll__hdr_encode(buf, hdr);
	while (zmq_send(c->peers[dst].push, buf, sizeof(buf),
			flags | (hdr->len > 0 ? ZMQ_SNDMORE : 0)) < 0) {
		if (zmq_errno() != EINTR)
			return zmq_fail(c, dst);
	}
	return HPUCOLL_OK;
}

static int send_body(hpucoll_comm *c, int dst, zmq_msg_t *body)
{
	while (zmq_msg_send(body, c->peers[dst].push, 0) < 0) {
		if (zmq_errno() != EINTR) {
			int rc = zmq_fail(c, dst);

			zmq_msg_close(body);
			return rc;
		}
	}
	return HPUCOLL_OK;
}

static int poll_aborts(hpucoll_comm *c, int want);
static int peer_gone(hpucoll_comm *c, int src);

/* Sends over shared memory, waiting in slices while the ring is full so
 * that aborts, the stall warning and the timeout are looked at. */
static int shm_send(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		    const void *data)
{
	struct wait w;
	int rc;

	rc = hpucoll__shm_send(c->shm, c->peers[dst].shm, hdr, data, 0);
	if (rc != HPUCOLL_ETIMEDOUT)
		goto out;
	wait_begin(c, &w);
	for (;;) {
		int64_t now = now_ms();
		long ms = wait_ms(c, &w, now, HPUCOLL__SLICE_MS);

		rc = hpucoll__shm_send(c->shm, c->peers[dst].shm, hdr, data,
				       (int)ms);
		if (rc != HPUCOLL_ETIMEDOUT)
			break;
		now = now_ms();
		if (w.deadline >= 0 && now >= w.deadline) {
			hpucoll__set_error(c, "%s: rank %d took no data for %d "
					      "ms (is it alive?).",
					   c->what, dst, w.timeout_ms);
			return HPUCOLL_ETIMEDOUT;
		}
		stall_check(c, &w, dst, now);
		rc = poll_aborts(c, dst);
		if (rc != HPUCOLL_OK)
			return rc;
	}
out:
	if (rc == HPUCOLL_EPEER)
		return peer_gone(c, dst);
	if (rc != HPUCOLL_OK)
		hpucoll__set_error(c, "%s: sending to rank %d over shared "
				      "memory failed: %s.",
				   c->what, dst, hpucoll__shm_errmsg(c->shm));
	return rc;
}

/* Counts a payload that the transport took for rank dst. */
static void count_sent(hpucoll_comm *c, int dst, uint64_t len)
{
	hpucoll__count(&c->stats.sent, len);
	if (c->peers[dst].shm >= 0)
		hpucoll__count(&c->stats.shm_sent, len);
}

/* Sends over ZeroMQ: copied, or in place when zc and the payload is large
 * enough. */
static int zmq_send_to(hpucoll_comm *c, int dst,
		       const struct hpucoll__hdr *hdr, const void *data, int zc)
{
	struct hpucoll__peer *p = &c->peers[dst];
	zmq_msg_t body;
	int rc;

	rc = send_hdr(c, dst, hdr, 0);
	if (rc != HPUCOLL_OK || hdr->len == 0)
		return rc;
	if (!zc || hdr->len < HPUCOLL__ZC_MIN) {
		while (zmq_send(p->push, data, (size_t)hdr->len, 0) < 0) {
			if (zmq_errno() != EINTR)
				return zmq_fail(c, dst);
		}
		return HPUCOLL_OK;
	}
	atomic_fetch_add_explicit(&p->zc, 1, memory_order_relaxed);
	if (zmq_msg_init_data(&body, (void *)data, (size_t)hdr->len, zc_free,
			      &p->zc) != 0) {
		atomic_fetch_sub(&p->zc, 1);
		return zmq_fail(c, dst);
	}
	c->zc_pending = 1;
	return send_body(c, dst, &body);
}

int hpucoll__send(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		  const void *data, int zc)
{
	int rc;

	if (c->peers[dst].shm >= 0)
		rc = shm_send(c, dst, hdr, data);
	else
		rc = zmq_send_to(c, dst, hdr, data, zc);
	if (rc == HPUCOLL_OK)
		count_sent(c, dst, hdr->len);
	return rc;
}

void *hpucoll__send_buf(hpucoll_comm *c, int dst, size_t len)
{
	if (c->peers[dst].shm >= 0)
		return c->shm_buf;
	if (zmq_msg_init_size(&c->out, len) != 0)
		return NULL;
	return zmq_msg_data(&c->out);
}

int hpucoll__send_commit(hpucoll_comm *c, int dst,
			 const struct hpucoll__hdr *hdr)
{
	int rc;

	if (c->peers[dst].shm >= 0) {
		rc = shm_send(c, dst, hdr, c->shm_buf);
	} else {
		rc = send_hdr(c, dst, hdr, 0);
		if (rc != HPUCOLL_OK || hdr->len == 0)
			zmq_msg_close(&c->out);
		else
			rc = send_body(c, dst, &c->out);
	}
	if (rc == HPUCOLL_OK)
		count_sent(c, dst, hdr->len);
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

/* A probe: says where this rank is, from inside a wait of collective
 * c->seq (see HPUCOLL__PROBE_REPLY). */
static void answer_probe(hpucoll_comm *c, const struct hpucoll__hdr *probe)
{
	struct hpucoll__hdr h = {
		.magic = HPUCOLL__MAGIC,
		.src = (uint32_t)c->rank,
		.seq = c->seq,
		.kind = HPUCOLL__PROBE_REPLY,
		.arg = c->kind,
		.off = probe->seq,
	};

	send_ctl(c, (int)probe->src, &h);
}

/* A probe reply: kept when it answers the probe of this collective whose
 * warning is still to come, dropped otherwise. */
static void take_reply(hpucoll_comm *c, const struct hpucoll__hdr *h)
{
	struct hpucoll__peer *p = &c->peers[h->src];

	if (c->stall_warned || c->probe_seq != c->seq || h->off != c->seq)
		return;
	p->reply_to = c->seq;
	p->reply_seq = h->seq;
	p->reply_kind = h->arg;
}

/* Notes that rank src sent data of collective seq. */
static void saw(hpucoll_comm *c, int src, uint32_t seq)
{
	struct hpucoll__peer *p = &c->peers[src];

	if (!seq_ge(p->seen_seq, seq))
		p->seen_seq = seq;
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
		switch (m->hdr.kind & 15) {
		case HPUCOLL__PROBE:
			answer_probe(c, &m->hdr);
			break;
		case HPUCOLL__PROBE_REPLY:
			take_reply(c, &m->hdr);
			break;
		default:
			saw(c, (int)m->hdr.src, m->hdr.seq);
			return HPUCOLL_OK;
		}
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
static int poll_aborts(hpucoll_comm *c, int want)
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

/* Waits until the receive socket has a message. Fails when the deadline
 * passes or the connection to `src` closed a grace period ago. */
static int wait_readable(hpucoll_comm *c, int src, const struct wait *w)
{
	struct hpucoll__peer *p = &c->peers[src];
	zmq_pollitem_t items[2] = {
		{.socket = c->pull, .events = ZMQ_POLLIN},
		{.socket = p->mon, .events = ZMQ_POLLIN},
	};
	int64_t now;
	long ms;
	int n;

	for (;;) {
		now = now_ms();
		if (w->deadline >= 0 && now >= w->deadline)
			return timed_out(c, w, src);
		if (p->lost && now - p->lost_ms >= HPUCOLL__LOST_GRACE_MS)
			return lost_peer(c, src);
		if (p->refused)
			return refused_by(c, src);
		stall_check(c, w, src, now);
		ms = wait_ms(c, w, now,
			     p->lost ? (long)(p->lost_ms +
					      HPUCOLL__LOST_GRACE_MS - now)
				     : -1);
		n = zmq_poll(items, 2, ms);
		if (n < 0 && zmq_errno() != EINTR)
			return hpucoll__zmq_error(c, "zmq_poll");
		if (n > 0 && (items[1].revents & ZMQ_POLLIN))
			read_monitor(c, src);
		if (n > 0 && (items[0].revents & ZMQ_POLLIN))
			return HPUCOLL_OK;
	}
}

/* Checks that a message is the one expected. */
static int check(hpucoll_comm *c, const struct hpucoll__hdr *want,
		 const struct hpucoll__hdr *got)
{
	if (got->magic == want->magic && got->src == want->src &&
	    got->seq == want->seq && got->kind == want->kind &&
	    got->arg == want->arg && got->tag == want->tag &&
	    got->off == want->off && got->len == want->len)
		return HPUCOLL_OK;
	hpucoll__set_error(
		c,
		"%s: rank %" PRIu32 " sent collective #%" PRIu32 " (%s, "
		"algorithm %u, arg %u, tag %u, offset %" PRIu64 ", %" PRIu64
		" bytes) where #%" PRIu32 " (%s, algorithm %u, arg %u, tag %u, "
		"offset %" PRIu64 ", %" PRIu64 " bytes) was expected; do all "
		"ranks call the same collectives with the same arguments?",
		c->what, want->src, got->seq, hpucoll__kind_name(got->kind),
		(unsigned)got->kind >> 4, (unsigned)got->arg,
		(unsigned)got->tag, got->off, got->len, want->seq,
		hpucoll__kind_name(want->kind), (unsigned)want->kind >> 4,
		(unsigned)want->arg, (unsigned)want->tag, want->off, want->len);
	return HPUCOLL_EPROTO;
}

/* Takes the next message from rank `src`, from its queue or the socket. */
static int next_from(hpucoll_comm *c, int src, struct hpucoll__msg **out)
{
	struct hpucoll__msg *m;
	struct wait w;
	int rc;

	*out = dequeue(&c->peers[src]);
	if (*out != NULL)
		return HPUCOLL_OK;
	wait_begin(c, &w);
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
		if (w.deadline >= 0 && now_ms() >= w.deadline)
			return timed_out(c, &w, src);
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
	rc = check(c, want, &m->hdr);
	if (rc == HPUCOLL_OK) {
		zmq_msg_init(&p->held);
		zmq_msg_move(&p->held, &m->body);
		p->holding = 1;
		*data = zmq_msg_data(&p->held);
	}
	msg_free(m);
	return rc;
}

/* ---- Receiving from shared memory ---- */

/* A local peer is gone. If it left because its own collective failed,
 * its ABORT is on the way over ZeroMQ and says why: wait a moment for it,
 * so that the error names the rank that caused it. */
static int peer_gone(hpucoll_comm *c, int src)
{
	zmq_pollitem_t item = {.socket = c->pull, .events = ZMQ_POLLIN};
	int64_t end = now_ms() + HPUCOLL__LOST_GRACE_MS, left;
	int rc;

	for (;;) {
		rc = poll_aborts(c, src);
		if (rc != HPUCOLL_OK)
			return rc;
		left = end - now_ms();
		if (left <= 0)
			break;
		zmq_poll(&item, 1, (long)left);
	}
	hpucoll__set_error(c, "%s: rank %d died (%s).", c->what, src,
			   hpucoll__shm_errmsg(c->shm));
	return HPUCOLL_EPEER;
}

static int shm_error(hpucoll_comm *c, int src, int rc, const struct wait *w)
{
	if (rc == HPUCOLL_EPEER)
		return peer_gone(c, src);
	else if (rc == HPUCOLL_ETIMEDOUT)
		return timed_out(c, w, src);
	else
		hpucoll__set_error(c, "%s: receiving from rank %d over shared "
				      "memory failed: %s.",
				   c->what, src, hpucoll__shm_errmsg(c->shm));
	return rc;
}

/* Waits in slices, looking between them at ABORTs arriving over ZeroMQ,
 * the stall warning and the timeout. */
static int shm_recv_from(hpucoll_comm *c, const struct hpucoll__hdr *want,
			 const void **data)
{
	int src = (int)want->src, local = c->peers[src].shm;
	struct hpucoll__hdr h;
	struct wait w;
	int rc;

	rc = hpucoll__shm_recv(c->shm, local, &h, data, 0);
	if (rc == HPUCOLL_ETIMEDOUT) {
		wait_begin(c, &w);
		for (;;) {
			int64_t now = now_ms();
			long ms = wait_ms(c, &w, now, HPUCOLL__SLICE_MS);

			rc = hpucoll__shm_recv(c->shm, local, &h, data,
					       (int)ms);
			if (rc != HPUCOLL_ETIMEDOUT)
				break;
			now = now_ms();
			if (w.deadline >= 0 && now >= w.deadline)
				break;
			stall_check(c, &w, src, now);
			rc = poll_aborts(c, src);
			if (rc != HPUCOLL_OK)
				return rc;
		}
	}
	if (rc != HPUCOLL_OK)
		return shm_error(c, src, rc, &w);
	saw(c, src, h.seq);
	rc = check(c, want, &h);
	if (rc != HPUCOLL_OK)
		hpucoll__shm_release(c->shm, local);
	return rc;
}

int hpucoll__recv(hpucoll_comm *c, const struct hpucoll__hdr *want,
		  const void **data)
{
	int rc;

	if (c->peers[want->src].shm >= 0)
		rc = shm_recv_from(c, want, data);
	else
		rc = zmq_recv_from(c, want, data);
	if (rc == HPUCOLL_OK)
		hpucoll__count(&c->stats.received, want->len);
	return rc;
}

void hpucoll__release(hpucoll_comm *c, int src)
{
	struct hpucoll__peer *p = &c->peers[src];

	if (p->shm >= 0) {
		hpucoll__shm_release(c->shm, p->shm);
	} else if (p->holding) {
		zmq_msg_close(&p->held);
		p->holding = 0;
	}
}

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

int hpucoll__fence(hpucoll_comm *c)
{
	struct wait w;
	int64_t polled;
	int round = 0, rc;

	stall_flush(c, "its wait is over");
	if (!c->zc_pending)
		return HPUCOLL_OK;
	wait_begin(c, &w);
	polled = w.start;
	for (int i = 0; i < c->size; i++) {
		struct hpucoll__peer *p = &c->peers[i];

		while (i != c->rank && zc_held(p)) {
			int64_t now = now_ms();

			if (w.deadline >= 0 && now >= w.deadline) {
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
			stall_check(c, &w, i, now);
			/* Now and then: aborts, and probes to answer. */
			if (now - polled >= HPUCOLL__SLICE_MS) {
				polled = now;
				rc = poll_aborts(c, i);
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
	};
	char msg[HPUCOLL__ERRMSG_MAX];

	pthread_mutex_lock(&c->errlock);
	snprintf(msg, sizeof(msg), "%s", c->errmsg);
	pthread_mutex_unlock(&c->errlock);
	h.len = strlen(msg);
	for (int i = 0; i < c->size; i++) {
		if (i == c->rank || c->peers[i].push == NULL ||
		    send_hdr(c, i, &h, ZMQ_DONTWAIT) != HPUCOLL_OK)
			continue;
		if (h.len > 0)
			zmq_send(c->peers[i].push, msg, h.len, ZMQ_DONTWAIT);
	}
}

void hpucoll__fail_transport(hpucoll_comm *c, int rc)
{
	int64_t t0 = now_ms();
	int round = 0, left;

	stall_flush(c, "it failed");
	if (!c->got_abort)
		send_aborts(c, rc);
	if (!c->zc_pending)
		return;
	/* Give ZeroMQ a moment to finish what it is sending; then drop what
	 * is left for peers that do not take it, which releases it. */
	for (int i = 0; i < c->size; i++) {
		struct hpucoll__peer *p = &c->peers[i];

		while (i != c->rank && zc_held(p) &&
		       now_ms() - t0 < HPUCOLL__LOST_GRACE_MS)
			backoff(&round);
		if (i != c->rank && zc_held(p)) {
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
	} while (left > 0 && now_ms() - t0 < 10000);
	if (left > 0)
		fprintf(stderr, "hpucoll: rank %d: ZeroMQ still holds "
				"zero-copy sends to %d peers after a "
				"failure\n",
			c->rank, left);
	c->zc_pending = 0;
}
