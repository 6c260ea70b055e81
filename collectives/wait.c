/* Waiting for a peer: deadlines, the timeout's error, and stall warnings.
 *
 * Every wait of a collective for a peer (transport_zmq.c, transport_shm.c)
 * starts a struct hpucoll__wait, sleeps at most hpucoll__wait_ms() at a
 * time and calls hpucoll__stall_check() between sleeps.
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
 * replies are taken out of the stream by the ZeroMQ reader
 * (hpucoll__probe_take) and never reach a header check.
 *
 * The timeout: when the stall threshold would come after it (or never),
 * the probe goes out anyway, timeout_window() before the deadline, without
 * a warning: so that the timeout's error (and hpucoll_comm_culprit) names
 * the ranks that did not arrive, not the rank this one happened to wait
 * for, which may be waiting too.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "collectives/comm_internal.h"

int64_t hpucoll__now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- Deadlines ---- */

void hpucoll__wait_begin(hpucoll_comm *c, struct hpucoll__wait *w)
{
	w->timeout_ms = atomic_load(&c->timeout_ms);
	w->start = hpucoll__now_ms();
	w->deadline = w->timeout_ms < 0 ? -1 : w->start + w->timeout_ms;
}

/* ---- Stall probes ---- */

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

/* How long before the deadline of wait w its probe goes out when the
 * stall threshold does not come first: a quarter of the timeout, at most
 * 1 s, at least two slices (see probe_window). */
static int64_t timeout_window(const struct hpucoll__wait *w)
{
	int64_t win = w->timeout_ms / 4 < 1000 ? w->timeout_ms / 4 : 1000;

	return win < 2 * HPUCOLL__SLICE_MS ? 2 * HPUCOLL__SLICE_MS : win;
}

/* When wait w sends the probe of its collective: at the stall threshold
 * or timeout_window() before the deadline, whichever comes first; -1
 * never (no threshold, no timeout). */
static int64_t probe_due(const hpucoll_comm *c, const struct hpucoll__wait *w)
{
	int64_t at = c->stall_ms > 0 ? w->start + c->stall_ms : -1, late;

	if (w->deadline >= 0) {
		late = w->deadline - timeout_window(w);
		if (late < w->start)
			late = w->start;
		if (at < 0 || late < at)
			at = late;
	}
	return at;
}

/* Whether the collective's stall warning is still to be printed: there is
 * a threshold, the wait that sent the probe has passed it, and it was not
 * printed yet. */
static int warning_due(const hpucoll_comm *c, int64_t now)
{
	return c->stall_ms > 0 && !c->stall_warned && c->probe_seq == c->seq &&
	       now - c->stall_start >= c->stall_ms;
}

/* When the stall check of wait w has something to do next: send the
 * probe (probe_due), or print the warning once the threshold has passed
 * and the probe's window ended; -1 when nothing. */
static int64_t stall_due(const hpucoll_comm *c, const struct hpucoll__wait *w)
{
	int64_t thr, rep;

	if (c->probe_seq != c->seq)
		return probe_due(c, w);
	if (c->stall_ms <= 0 || c->stall_warned)
		return -1;
	thr = c->stall_start + c->stall_ms;
	rep = report_due(c);
	return thr > rep ? thr : rep;
}

/* Milliseconds until the next thing a wait must look at (the deadline or
 * the stall check), at most `cap`; -1 when there is none and no cap. */
long hpucoll__wait_ms(const hpucoll_comm *c, const struct hpucoll__wait *w,
		      int64_t now, long cap)
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
	hpucoll__log(HPUCOLL_LOG_WARNING,
		     "hpucoll: rank %d: %s (collective #%" PRIu32 ") has waited "
		     "%" PRId64 " ms for rank %d; %s; %s",
		     c->rank, c->what, c->seq, now - c->stall_start, c->stall_peer,
		     l.buf, tail);
}

/* Sends a header-only control message (a probe or a reply) to rank dst
 * over ZeroMQ, without waiting; best effort, errors are ignored. */
static void send_ctl(hpucoll_comm *c, int dst,
		     const struct hpucoll__hdr *h)
{
	unsigned char buf[HPUCOLL__HDR_SIZE];

	if (c->peers[dst].push == NULL)
		return;
	hpucoll__hdr_encode(buf, h);
	zmq_send(c->peers[dst].push, buf, sizeof(buf), ZMQ_DONTWAIT);
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
 * replies come in while the wait goes on (hpucoll__probe_take); once all
 * peers are accounted for, or after probe_window(), it prints the one
 * warning of the collective. */
int hpucoll__stall_check(hpucoll_comm *c, const struct hpucoll__wait *w,
			 int peer, int64_t now)
{
	char tail[64];
	int64_t at;

	if (c->probe_seq != c->seq) {
		at = probe_due(c, w);
		if (at < 0 || now < at)
			return HPUCOLL_OK;
		c->probe_seq = c->seq;
		c->probe_ms = now;
		c->stall_start = w->start;
		c->stall_peer = peer;
		send_probes(c);
	}
	if (hpucoll__disagreement(c) != HPUCOLL_OK)
		return HPUCOLL_EPROTO;
	if (!warning_due(c, now))
		return HPUCOLL_OK;
	if (now < report_due(c) && !probe_done(c))
		return HPUCOLL_OK;
	snprintf(tail, sizeof(tail), "still waiting (timeout %d ms)",
		 w->timeout_ms);
	stall_warn(c, now, tail);
	return HPUCOLL_OK;
}

int hpucoll__disagreement(hpucoll_comm *c)
{
	char mine[96], theirs[96];

	if (c->probe_seq != c->seq)
		return HPUCOLL_OK;
	for (int i = 0; i < c->size; i++) {
		const struct hpucoll__peer *p = &c->peers[i];

		if (i == c->rank || p->reply_to != c->seq ||
		    p->reply_seq != c->seq)
			continue;
		if ((p->reply_kind & 15) == (c->kind & 15) &&
		    p->reply_arg == c->arg && p->reply_root == c->root)
			continue;
		hpucoll__describe(mine, sizeof(mine), c->kind, c->arg, c->root);
		hpucoll__describe(theirs, sizeof(theirs), p->reply_kind, p->reply_arg,
			 p->reply_root);
		hpucoll__disagree(c, c->seq, i, theirs, mine);
		hpucoll__blame(c, i, HPUCOLL_EPROTO);
		return HPUCOLL_EPROTO;
	}
	return HPUCOLL_OK;
}

/* A collective ends while its probe's window is open: prints the warning
 * with what is known (the threshold did pass). */
void hpucoll__stall_flush(hpucoll_comm *c, const char *tail)
{
	int64_t now = hpucoll__now_ms();

	if (c->seq != 0 && warning_due(c, now))
		stall_warn(c, now, tail);
}

/* A wait for src timed out. When the stall probe of this collective found
 * ranks that do not answer while src does (it waits too), those ranks
 * hold the job up, and the error names them rather than src. */
int hpucoll__timed_out(hpucoll_comm *c, const struct hpucoll__wait *w, int src)
{
	struct line l = {.n = 0};
	int n = 0;

	if (hpucoll__disagreement(c) != HPUCOLL_OK)
		return HPUCOLL_EPROTO;

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
		for (int i = 0; i < c->size; i++)
			if (peer_state(c, i) < 0)
				hpucoll__blame(c, i, HPUCOLL_ETIMEDOUT);
		return HPUCOLL_ETIMEDOUT;
	}
	if (c->probe_seq == c->seq && peer_state(c, src) == 1 &&
	    c->peers[src].reply_to == c->seq) {
		/* It answered: alive, waiting in this collective or past it
		 * (it took it for done: the ranks disagree on it) */
		const struct hpucoll__peer *p = &c->peers[src];
		char at[80] = "in this collective too";

		if (p->reply_seq != c->seq)
			snprintf(at, sizeof(at), "at collective #%" PRIu32 " %s, past this one",
				 p->reply_seq, hpucoll__kind_name(p->reply_kind));
		hpucoll__set_error(c, "%s: no data from rank %d after %d ms, "
				      "though it answered (%s); do all ranks "
				      "call the same collectives with the same "
				      "arguments?",
				   c->what, src, w->timeout_ms, at);
		return HPUCOLL_ETIMEDOUT;
	}
	hpucoll__set_error(c, "%s: no data from rank %d after %d ms "
			      "(is it alive?).",
			   c->what, src, w->timeout_ms);
	hpucoll__blame(c, src, HPUCOLL_ETIMEDOUT);
	return HPUCOLL_ETIMEDOUT;
}

void hpucoll__blame(hpucoll_comm *c, int r, int code)
{
	if (c->culprit >= 0 || r < 0 || r >= c->size || r == c->rank)
		return;
	c->culprit = r;
	c->culprit_code = code;
}

/* ---- Probes and replies off the wire ---- */

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
		.tag = (uint16_t)(c->root + 1),
		.off = probe->seq | (uint64_t)c->arg << 32,
	};

	send_ctl(c, (int)probe->src, &h);
}

/* A probe reply: kept when it answers the probe of this collective whose
 * warning is still to come, dropped otherwise. */
static void take_reply(hpucoll_comm *c, const struct hpucoll__hdr *h)
{
	struct hpucoll__peer *p = &c->peers[h->src];

	if (c->stall_warned || c->probe_seq != c->seq ||
	    (uint32_t)h->off != c->seq)
		return;
	p->reply_to = c->seq;
	p->reply_seq = h->seq;
	p->reply_kind = h->arg;
	p->reply_arg = (uint8_t)(h->off >> 32);
	p->reply_root = (int)h->tag - 1;
}

/* Notes that rank src sent data of collective seq. */
void hpucoll__saw_data(hpucoll_comm *c, int src, uint32_t seq)
{
	struct hpucoll__peer *p = &c->peers[src];

	if (!seq_ge(p->seen_seq, seq))
		p->seen_seq = seq;
}

int hpucoll__probe_take(hpucoll_comm *c, const struct hpucoll__hdr *h)
{
	switch (h->kind & 15) {
	case HPUCOLL__PROBE:
		answer_probe(c, h);
		return 1;
	case HPUCOLL__PROBE_REPLY:
		take_reply(c, h);
		return 1;
	default:
		hpucoll__saw_data(c, (int)h->src, h->seq);
		return 0;
	}
}
