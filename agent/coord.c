#include "agent/coord.h"

#include <ctype.h>
#include "common/clock.h"

#include <errno.h>
#include <stdarg.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "agent/agent.h"
#include "proto/codec.h"
#include "common/hex.h"
#include "common/log.h"
#include "common/num.h"
#include "agent/restart.h"
#include "agent/zwatch.h"

#define MAX_ENDPOINT 256

typedef struct rank_slot {
	int joined;
	hpu_codec_peer peer;
	unsigned node, local, pid;
	char endpoint[MAX_ENDPOINT];
	char host[128];
} rank_slot;

typedef struct agent_slot {
	int hello, done;
	hpu_codec_peer peer;
	ev_tstamp last_seen;
	char refused[200]; /* why an agent saying it is this node was refused */
	char other_attempt[200]; /* an earlier attempt's agent said it is this node */
} agent_slot;

struct hpu_coord {
	struct ev_loop *loop;
	hpu_coord_cfg cfg;
	void *ctx, *sock;
	int port;
	hpu_zwatch zw;
	ev_timer join_timer, beat_timer;
	ev_tstamp beat_at; /* hpu__mono_s() at the beat before (or at its start) */
	ev_tstamp stall, stall_end; /* the last time it did not run (> 3 s), and when it ended */
	rank_slot *ranks;
	agent_slot *agents;
	int world, joined, released, aborted, finished;
	int set_up_apart; /* aborted: a node's hpulaunch set up otherwise */
	int interrupted;  /* aborted: a user interrupted a node's hpulaunch */
	long refusals;    /* joins and hellos refused so far (log_refusal) */
	char abort_reason[2048]; /* on_join_timeout's longest fits */
	char join_token[129]; /* this attempt's (restart.h) */
	char session[33];     /* JoinReply.session: random hex */
	char why[160];        /* a refusal that needs words of its own */
};

static int same_secret(const char *a, const char *b)
{
	size_t n = strlen(b);
	return a && strlen(a) == n && CRYPTO_memcmp(a, b, n) == 0;
}

static int same_peer(const hpu_codec_peer *a, const hpu_codec_peer *b)
{
	return a->len == b->len && !memcmp(a->id, b->id, a->len);
}

static void send_env(hpu_coord *c, const hpu_codec_peer *peer,
		     const Hpu__Envelope *env)
{
	if (hpu__codec_send(c->sock, peer, env) != 0 && errno != EHOSTUNREACH)
		hpu__log(HPU_LOG_ERROR, "coordinator: send failed: %s",
			 zmq_strerror(errno));
}

static void send_join_reply(hpu_coord *c, const hpu_codec_peer *peer, int ok,
			    const char *error, Hpu__RankInfo **table, size_t n)
{
	Hpu__JoinReply r = HPU__JOIN_REPLY__INIT;
	r.ok = ok;
	r.error = (char *)(error ? error : "");
	r.ranks = table;
	r.n_ranks = n;
	r.session = ok ? c->session : (char *)"";
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_JOIN_REPLY;
	env.join_reply = &r;
	send_env(c, peer, &env);
}

static void send_simple(hpu_coord *c, const hpu_codec_peer *peer,
			Hpu__Envelope__MsgCase kind, const char *reason)
{
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	Hpu__Abort ab = HPU__ABORT__INIT;
	Hpu__JobDone jd = HPU__JOB_DONE__INIT;
	Hpu__Heartbeat hb = HPU__HEARTBEAT__INIT;
	env.msg_case = kind;
	if (kind == HPU__ENVELOPE__MSG_ABORT) {
		ab.reason = (char *)reason;
		env.abort = &ab;
	} else if (kind == HPU__ENVELOPE__MSG_JOB_DONE) {
		env.job_done = &jd;
	} else {
		env.heartbeat = &hb;
	}
	send_env(c, peer, &env);
}

void hpu__coord_abort(hpu_coord *c, const char *reason)
{
	if (c->aborted || c->finished)
		return;
	c->aborted = 1;
	snprintf(c->abort_reason, sizeof c->abort_reason, "%s", reason);
	ev_timer_stop(c->loop, &c->join_timer);
	for (int n = 1; n < c->cfg.nodes; n++)
		if (c->agents[n].hello)
			send_simple(c, &c->agents[n].peer, HPU__ENVELOPE__MSG_ABORT, reason);
	if (!c->released)
		for (int r = 0; r < c->world; r++)
			if (c->ranks[r].joined)
				send_join_reply(c, &c->ranks[r].peer, 0, reason, NULL, 0);
	if (c->cfg.on_abort)
		c->cfg.on_abort(c, reason, c->cfg.arg);
}

/* Every rank is in: send each the table. */
static void release(hpu_coord *c)
{
	Hpu__RankInfo *infos = calloc((size_t)c->world, sizeof *infos);
	Hpu__RankInfo **table = calloc((size_t)c->world, sizeof *table);
	if (!infos || !table) {
		free(infos);
		free(table);
		hpu__coord_abort(c, "the coordinator ran out of memory");
		return;
	}
	for (int r = 0; r < c->world; r++) {
		hpu__rank_info__init(&infos[r]);
		infos[r].rank = (uint32_t)r;
		infos[r].node_rank = c->ranks[r].node;
		infos[r].local_rank = c->ranks[r].local;
		infos[r].pid = c->ranks[r].pid;
		infos[r].endpoint = c->ranks[r].endpoint;
		infos[r].host = c->ranks[r].host;
		table[r] = &infos[r];
	}
	for (int r = 0; r < c->world; r++)
		send_join_reply(c, &c->ranks[r].peer, 1, NULL, table, (size_t)c->world);
	free(infos);
	free(table);
	c->released = 1;
	ev_timer_stop(c->loop, &c->join_timer);
}

/* Why a join's token is not this attempt's: a worker of another attempt
 * of the job (one restart either way), or a bad token. */
static const char *token_refusal(hpu_coord *c, const char *token)
{
	char t[129];
	for (int n = c->cfg.restart_count - 1; n <= c->cfg.restart_count + 1; n += 2) {
		if (n < 0 || n > HPU_MAX_RESTARTS_LIMIT)
			continue;
		hpu__attempt_token(c->cfg.token, n, t, sizeof t);
		if (same_secret(token, t)) {
			snprintf(c->why, sizeof c->why, "it is a worker of restart %d of this job, this is restart %d",
				 n, c->cfg.restart_count);
			return c->why;
		}
	}
	return "bad job token";
}

static const char *check_join(hpu_coord *c, const Hpu__Join *j)
{
	if (!j->job_id || strcmp(j->job_id, c->cfg.job_id) != 0)
		return "wrong job id";
	if (!same_secret(j->token, c->join_token))
		return token_refusal(c, j->token);
	if (!j->self || !j->self->endpoint || !*j->self->endpoint ||
	    strlen(j->self->endpoint) >= MAX_ENDPOINT)
		return "no usable data endpoint";
	if ((int)j->world_size != c->world)
		return "world size differs from the job's";
	if (j->self->rank >= (uint32_t)c->world)
		return "rank out of range";
	if (c->ranks[j->self->rank].joined)
		return "that rank has already joined";
	if (c->released)
		return "the job has already started";
	if (c->aborted)
		return c->abort_reason;
	return NULL;
}

/* A refusal of a join or a hello, which anyone who reaches the port may
 * send: logged the first 3 times, then the 10th, 100th, 1000th and every
 * 10000th (a flood of them wrote a line each, 5000 in 0.65 s). */
static void log_refusal(hpu_coord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void log_refusal(hpu_coord *c, const char *fmt, ...)
{
	long n = ++c->refusals;
	if (n > 3 && n != 10 && n != 100 && n != 1000 && n % 10000)
		return;
	char line[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (n > 3)
		hpu__log(HPU_LOG_WARNING, "coordinator: %s (refusal %ld; the others are not logged)",
			 line, n);
	else
		hpu__log(HPU_LOG_WARNING, "coordinator: %s", line);
}

/* text from the wire, for a log line: printable ASCII only (a host name
 * with a newline forged a line of its own, and escapes reached the
 * terminal), at most 64 characters */
static const char *wire_text(const char *s, char *buf, size_t len)
{
	size_t n = 0;
	for (; s && *s && n + 1 < len && n < 64; s++)
		buf[n++] = (unsigned char)*s >= 0x20 && (unsigned char)*s < 0x7f ? *s : '?';
	buf[n] = 0;
	return n ? buf : "?";
}

static void on_join(hpu_coord *c, const hpu_codec_peer *peer, const Hpu__Join *j)
{
	const char *why = check_join(c, j);
	if (why) {
		char host[80];
		log_refusal(c, "refused a join from rank %d (pid %u, host %s): %s",
			    j->self ? (int)j->self->rank : -1, j->self ? j->self->pid : 0,
			    wire_text(j->self ? j->self->host : NULL, host, sizeof host), why);
		send_join_reply(c, peer, 0, why, NULL, 0);
		return;
	}
	rank_slot *s = &c->ranks[j->self->rank];
	s->joined = 1;
	s->peer = *peer;
	s->node = j->self->node_rank;
	s->local = j->self->local_rank;
	s->pid = j->self->pid;
	snprintf(s->endpoint, sizeof s->endpoint, "%s", j->self->endpoint);
	snprintf(s->host, sizeof s->host, "%s", j->self->host ? j->self->host : "");
	if (++c->joined == c->world)
		release(c);
}

/* The remote agent a message claims to come from, or NULL. */
static agent_slot *known_agent(hpu_coord *c, const hpu_codec_peer *peer)
{
	for (int n = 1; n < c->cfg.nodes; n++) {
		agent_slot *a = &c->agents[n];
		if (a->hello && same_peer(&a->peer, peer))
			return a;
	}
	return NULL;
}

/* The workers node n runs. */
static int node_devices(const hpu_coord *c, int n)
{
	return c->cfg.node_devices ? c->cfg.node_devices[n] : c->cfg.devices;
}

/* Whether s is a job id's characters (letters, digits, '-', '_', '.'):
 * one from the network is printed only then. */
static int printable_id(const char *s)
{
	for (; *s; s++)
		if (!(isalnum((unsigned char)*s) || *s == '-' || *s == '_' || *s == '.'))
			return 0;
	return 1;
}

/* A transport as the collectives take it: auto and shm are one (shared
 * memory within a node, TCP between), "" or NULL auto. */
static const char *same_transport(const char *t)
{
	return !t || !*t || !strcmp(t, "shm") ? "auto" : t;
}

static void on_hello(hpu_coord *c, const hpu_codec_peer *peer,
		     const Hpu__AgentHello *h)
{
	int ours = h->job_id && !strcmp(h->job_id, c->cfg.job_id) &&
		   same_secret(h->token, c->cfg.token);
	if (ours && h->restart_count != (uint32_t)c->cfg.restart_count) {
		/* Another attempt's agent: an earlier one on its way out, or a
		 * later one that says hello again until its own coordinator
		 * answers. Neither belongs here, and neither is to be aborted:
		 * the expected race of a restart, said at debug level only (it
		 * read as an error beside the restart's own lines). */
		hpu__log(HPU_LOG_DEBUG, "coordinator: ignored the agent of node %u: it runs restart %u of the job, this is restart %d",
			 h->node_rank, h->restart_count, c->cfg.restart_count);
		/* an earlier attempt's, said if the node never joins: its
		 * hpulaunch started again by hand (it said "no hpulaunch
		 * connected") */
		if (h->restart_count < (uint32_t)c->cfg.restart_count && h->node_rank > 0 &&
		    h->node_rank < (uint32_t)c->cfg.nodes)
			snprintf(c->agents[h->node_rank].other_attempt,
				 sizeof c->agents[h->node_rank].other_attempt,
				 "it runs restart %u of the job, node 0 restart %d%s", h->restart_count,
				 c->cfg.restart_count,
				 h->restart_count == 0
					 ? " (an hpulaunch started again alone begins at restart 0: "
					   "start every node's hpulaunch again)"
					 : "");
		return;
	}
	if (ours && h->node_rank < (uint32_t)c->cfg.nodes && c->agents[h->node_rank].hello &&
	    same_peer(&c->agents[h->node_rank].peer, peer)) {
		/* The same agent again (it repeats its hello until answered). */
		send_simple(c, peer, HPU__ENVELOPE__MSG_HEARTBEAT, NULL);
		return;
	}
	const char *why = NULL;
	char differ[200], reason[300];
	int fatal = 0; /* a node of this job set up otherwise: it never joins */
	if (!ours && h->job_id && strcmp(h->job_id, c->cfg.job_id) &&
	    strlen(h->job_id) < 64 && printable_id(h->job_id)) {
		/* the id is no secret: named, with node 0's (the token is) */
		snprintf(differ, sizeof differ, "bad job id or token: its job id is %s, node 0's %s",
			 h->job_id, c->cfg.job_id);
		why = differ;
	} else if (!ours)
		why = "bad job id or token";
	else if (h->node_rank == 0 || h->node_rank >= (uint32_t)c->cfg.nodes)
		why = "node rank out of range";
	else if ((int)h->nodes != c->cfg.nodes || (int)h->devices != node_devices(c, (int)h->node_rank) ||
		 (h->world_size && (int)h->world_size != c->world)) {
		snprintf(differ, sizeof differ,
			 "its --nodes/--devices differ from node 0's: node %u runs --nodes %u "
			 "--devices %u, node 0 --nodes %d with %d device%s on node %u",
			 h->node_rank, h->nodes, h->devices, c->cfg.nodes,
			 node_devices(c, (int)h->node_rank),
			 node_devices(c, (int)h->node_rank) == 1 ? "" : "s", h->node_rank);
		why = differ;
		fatal = !c->agents[h->node_rank].hello; /* never a joined node's job */
	}
	else if (h->max_restarts_1 && (int)h->max_restarts_1 - 1 != c->cfg.max_restarts) {
		snprintf(differ, sizeof differ,
			 "its --max-restarts %u differs from node 0's %d (every node restarts the job "
			 "together: give each the same)",
			 h->max_restarts_1 - 1, c->cfg.max_restarts);
		why = differ;
		fatal = !c->agents[h->node_rank].hello;
	} else if (h->transport && *h->transport && strlen(h->transport) < 16 &&
		   printable_id(h->transport) &&
		   strcmp(same_transport(h->transport), same_transport(c->cfg.transport))) {
		snprintf(differ, sizeof differ,
			 "its --transport %s differs from node 0's %s (the ranks pick their collectives' "
			 "algorithms by it: give each node the same)",
			 h->transport, c->cfg.transport && *c->cfg.transport ? c->cfg.transport : "auto");
		why = differ;
		fatal = !c->agents[h->node_rank].hello;
	} else if (c->agents[h->node_rank].hello)
		why = "that node has already joined";
	if (why) {
		log_refusal(c, "refused agent of node %u: %s", h->node_rank, why);
		if (h->node_rank > 0 && h->node_rank < (uint32_t)c->cfg.nodes &&
		    !c->agents[h->node_rank].hello) /* said if the node never joins */
			snprintf(c->agents[h->node_rank].refused,
				 sizeof c->agents[h->node_rank].refused, "%s", why);
		/* the refused node's own error: that it was refused, and what
		 * becomes of the job (it said "job aborted by the
		 * coordinator" while node 0's job ran on) */
		char told[400];
		snprintf(told, sizeof told, "%s%s; %s", HPU_COORD_REFUSED, why,
			 fatal ? "node 0 ends the job" : "the job on node 0 goes on without this hpulaunch");
		send_simple(c, peer, HPU__ENVELOPE__MSG_ABORT, told);
		if (fatal) { /* not after --join-timeout: the node will not come otherwise */
			snprintf(reason, sizeof reason, "node %u's hpulaunch connected and was refused: %s",
				 h->node_rank, why);
			c->set_up_apart = !c->aborted;
			hpu__coord_abort(c, reason);
		}
		return;
	}
	agent_slot *a = &c->agents[h->node_rank];
	a->hello = 1;
	a->peer = *peer;
	a->last_seen = hpu__mono_s();
	if (c->aborted)
		send_simple(c, peer, HPU__ENVELOPE__MSG_ABORT, c->abort_reason);
	else /* answer at once: the agent may be waiting for it to start */
		send_simple(c, peer, HPU__ENVELOPE__MSG_HEARTBEAT, NULL);
}

static void check_finished(hpu_coord *c)
{
	for (int n = 0; n < c->cfg.nodes; n++)
		if (!c->agents[n].done)
			return;
	if (c->aborted || c->finished)
		return;
	c->finished = 1;
	for (int n = 1; n < c->cfg.nodes; n++)
		send_simple(c, &c->agents[n].peer, HPU__ENVELOPE__MSG_JOB_DONE, NULL);
	ev_timer_stop(c->loop, &c->beat_timer);
	if (c->cfg.on_done)
		c->cfg.on_done(c, c->cfg.arg);
}

void hpu__coord_node_done(hpu_coord *c, int node_rank)
{
	c->agents[node_rank].done = 1;
	check_finished(c);
}

void hpu__coord_blame(const hpu_coord *c, int culprit, hpu_blame how, int reporter, char *out,
		      size_t outlen)
{
	char who[200] = "", where[128] = "";
	if (culprit >= 0 && culprit < c->world && c->ranks[culprit].joined) {
		const rank_slot *s = &c->ranks[culprit];
		snprintf(who, sizeof who, " (node %u, pid %u%s%s)", s->node, s->pid,
			 s->host[0] ? ", host " : "", s->host);
	}
	if (how == HPU_BLAME_SILENT && c->cfg.where)
		c->cfg.where(culprit, where, sizeof where, c->cfg.arg);
	int apart = culprit >= 0 && culprit < c->world && reporter >= 0 && reporter < c->world &&
		    c->ranks[culprit].joined && c->ranks[reporter].joined &&
		    c->ranks[culprit].node != c->ranks[reporter].node;
	hpu__describe_blame(culprit, how, who, where, reporter, apart, out, outlen);
	/* node 0's own hpulaunch stopped (or starved) just before: the other
	 * nodes gave up on it, and their ranks' end is what rank 0 found (it
	 * blamed them alone) */
	ev_tstamp now = hpu__mono_s(), gap = now - c->beat_at;
	double stalled = gap > 3 ? gap : now - c->stall_end < 60 ? c->stall : 0;
	size_t n = strlen(out);
	if (apart && stalled > 0 && n < outlen)
		snprintf(out + n, outlen - n, "; node 0's hpulaunch itself did not run for %.0f s "
			 "(stopped, or starved of CPU?): the other nodes may have given up on it",
			 stalled);
}

static void on_agent_msg(hpu_coord *c, agent_slot *a, const Hpu__Envelope *m)
{
	char reason[600];
	a->last_seen = hpu__mono_s();
	switch (m->msg_case) {
	case HPU__ENVELOPE__MSG_WORKER_EXIT: {
		const Hpu__WorkerExit *w = m->worker_exit;
		char pos[128], at[130] = "";
		hpu__describe_position(w->step, w->total, (int)w->phase, pos, sizeof pos);
		/* where it was, where its node knew (it sends zeros, setup,
		 * for a worker that never reported: an --exec program) */
		if (w->step || w->total || w->phase != HPU_PHASE_SETUP)
			snprintf(at, sizeof at, " %s", pos);
		if (w->culprit > 0 && !w->signal && !w->left_early)
			hpu__coord_blame(c, (int)w->culprit - 1,
					 w->culprit_how <= HPU_BLAME_FAILED ? (hpu_blame)w->culprit_how
									   : HPU_BLAME_FAILED,
					 (int)w->rank, reason, sizeof reason);
		else if (w->signal)
			snprintf(reason, sizeof reason,
				 "rank %u (node %u, pid %u) was killed by signal %d (%s)%s", w->rank,
				 w->node_rank, w->pid, w->signal, strsignal(w->signal), at);
		else if (w->left_early)
			snprintf(reason, sizeof reason,
				 "rank %u (node %u, pid %u) exited with code 0 before the job ended (%s)",
				 w->rank, w->node_rank, w->pid, pos);
		else /* with its reason where its node relayed one */
			snprintf(reason, sizeof reason, "rank %u (node %u, pid %u) exited with code %d%s%s%s",
				 w->rank, w->node_rank, w->pid, w->exit_code, at,
				 w->why && *w->why ? ": " : "", w->why ? w->why : "");
		hpu__coord_abort(c, reason);
		break;
	}
	case HPU__ENVELOPE__MSG_ABORT:
		snprintf(reason, sizeof reason, "node %d: %s", (int)(a - c->agents),
			 m->abort->reason ? m->abort->reason : "aborted");
		/* also after another abort: the interrupted node will not
		 * come back for a restart */
		c->interrupted |= hpu__coord_reason_interrupted(m->abort->reason);
		hpu__coord_abort(c, reason);
		break;
	case HPU__ENVELOPE__MSG_AGENT_DONE:
		a->done = 1;
		check_finished(c);
		break;
	default:
		break; /* heartbeats and anything else: liveness only */
	}
}

static void on_message(hpu_zwatch *w, void *arg)
{
	hpu_coord *c = arg;
	hpu_codec_peer peer;
	Hpu__Envelope *m = hpu__codec_recv(w->sock, &peer, ZMQ_DONTWAIT);
	if (!m)
		return; /* EAGAIN, or garbage: dropped */
	agent_slot *a;
	if (m->msg_case == HPU__ENVELOPE__MSG_JOIN && m->join)
		on_join(c, &peer, m->join);
	else if (m->msg_case == HPU__ENVELOPE__MSG_AGENT_HELLO && m->agent_hello)
		on_hello(c, &peer, m->agent_hello);
	else if ((a = known_agent(c, &peer)))
		on_agent_msg(c, a, m);
	hpu__codec_free(m);
}

static void append_list(char *out, size_t outlen, int *count, int v)
{
	size_t n = strlen(out);
	if (*count < 16)
		snprintf(out + n, outlen - n, "%s%d", *count ? ", " : "", v);
	else if (*count == 16)
		snprintf(out + n, outlen - n, ", ...");
	(*count)++;
}

static void on_join_timeout(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	hpu_coord *c = t->data;
	/* the lists (256 each), the sentence, four nodes' texts (200 each) */
	char ranks[256] = "", nodes[256] = "", reason[2048];
	int nr = 0, nn = 0, refused = 0;
	for (int r = 0; r < c->world; r++)
		if (!c->ranks[r].joined)
			append_list(ranks, sizeof ranks, &nr, r);
	for (int n = 1; n < c->cfg.nodes; n++)
		if (!c->agents[n].hello && !c->agents[n].refused[0] && !c->agents[n].other_attempt[0])
			append_list(nodes, sizeof nodes, &nn, n);
	snprintf(reason, sizeof reason, "rank%s %s did not join within %g s%s%s%s",
		 nr > 1 ? "s" : "", ranks, c->cfg.join_timeout_s,
		 nn ? " (no hpulaunch connected for node" : "", nn ? (nn > 1 ? "s " : " ") : "",
		 nn ? nodes : "");
	if (nn)
		strncat(reason, ")", sizeof reason - strlen(reason) - 1);
	/* a node whose hpulaunch came and was refused (it did connect), or
	 * was of another attempt (ignored, not told: the restart's race, or
	 * an hpulaunch started again by hand) */
	for (int n = 1; n < c->cfg.nodes && refused < 4; n++) {
		const agent_slot *a = &c->agents[n];
		if (a->hello || (!a->refused[0] && !a->other_attempt[0]))
			continue;
		size_t at = strlen(reason);
		snprintf(reason + at, sizeof reason - at, "; node %d's hpulaunch connected%s: %s", n,
			 a->refused[0] ? " and was refused" : ", but of another attempt",
			 a->refused[0] ? a->refused : a->other_attempt);
		refused++;
	}
	hpu__coord_abort(c, reason);
}

static void on_beat(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	hpu_coord *c = t->data;
	/* a time this process did not run (stopped; under hpud, hpud
	 * stalled) is not the agents' silence: their heartbeats of it wait
	 * in the socket, read after this beat */
	ev_tstamp now = hpu__mono_s(), gap = now - c->beat_at;
	c->beat_at = now;
	if (gap > 3)
		c->stall = gap, c->stall_end = now;
	for (int n = 1; n < c->cfg.nodes && gap > 2 * t->repeat; n++)
		c->agents[n].last_seen += gap - t->repeat;
	for (int n = 1; n < c->cfg.nodes; n++) {
		agent_slot *a = &c->agents[n];
		if (!a->hello || a->done)
			continue;
		if (now - a->last_seen > c->cfg.agent_timeout_s) {
			char reason[200];
			snprintf(reason, sizeof reason, "lost contact with node %d's hpulaunch (silent for %g s)",
				 n, c->cfg.agent_timeout_s);
			hpu__coord_abort(c, reason);
			return;
		}
		send_simple(c, &a->peer, HPU__ENVELOPE__MSG_HEARTBEAT, NULL);
	}
}

static int bind_socket(hpu_coord *c, char *err, size_t errlen)
{
	char ep[128], last[128];
	size_t sz = sizeof last;
	int linger = 2000, mandatory = 1;
	int64_t maxmsg = HPU_CODEC_MAX_MSG;
	zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
	zmq_setsockopt(c->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
	zmq_setsockopt(c->sock, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
	/* a connection that answers no heartbeat is closed: one that made
	 * its handshake and then said nothing was held for ever, its
	 * descriptor with it (anyone may connect); agents and workers answer
	 * ZeroMQ's pings in their I/O threads */
	int hb_ivl = 5000, hb_timeout = 30000;
	zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
	zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout);
	if (c->cfg.port > 0)
		snprintf(ep, sizeof ep, "tcp://%s:%d", c->cfg.bind_addr, c->cfg.port);
	else
		snprintf(ep, sizeof ep, "tcp://%s:*", c->cfg.bind_addr);
	if (zmq_bind(c->sock, ep) != 0) {
		snprintf(err, errlen, "cannot bind the coordinator at %s: %s", ep,
			 zmq_strerror(errno));
		return -1;
	}
	zmq_getsockopt(c->sock, ZMQ_LAST_ENDPOINT, last, &sz);
	const char *colon = strrchr(last, ':');
	if (!colon || hpu__parse_int(colon + 1, 1, 65535, &c->port))
		c->port = c->cfg.port;
	return 0;
}

hpu_coord *hpu__coord_new(struct ev_loop *loop, const hpu_coord_cfg *cfg,
			  char *err, size_t errlen)
{
	hpu_coord *c = calloc(1, sizeof *c);
	if (!c) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	c->loop = loop;
	c->cfg = *cfg;
	hpu__attempt_token(cfg->token, cfg->restart_count, c->join_token, sizeof c->join_token);
	unsigned char rnd[16];
	if (RAND_bytes(rnd, sizeof rnd) != 1) {
		snprintf(err, errlen, "cannot draw the job's shared-memory session: no random bytes");
		free(c);
		return NULL;
	}
	hpu__hex(c->session, rnd, sizeof rnd);
	c->world = 0;
	for (int n = 0; n < cfg->nodes; n++)
		c->world += node_devices(c, n);
	c->ranks = calloc((size_t)c->world, sizeof *c->ranks);
	c->agents = calloc((size_t)cfg->nodes, sizeof *c->agents);
	c->ctx = zmq_ctx_new();
	c->sock = c->ctx ? zmq_socket(c->ctx, ZMQ_ROUTER) : NULL;
	if (!c->ranks || !c->agents || !c->sock) {
		snprintf(err, errlen, "cannot set up the coordinator: %s", zmq_strerror(errno));
		goto fail;
	}
	if (bind_socket(c, err, errlen) < 0)
		goto fail;
	if (hpu__zwatch_start(&c->zw, loop, c->sock, on_message, c) < 0) {
		snprintf(err, errlen, "cannot watch the coordinator socket");
		goto fail;
	}
	c->agents[0].hello = 1; /* node 0's agent is this process */
	ev_timer_init(&c->join_timer, on_join_timeout, cfg->join_timeout_s, 0);
	c->join_timer.data = c;
	ev_timer_start(loop, &c->join_timer);
	ev_timer_init(&c->beat_timer, on_beat, 1.0, 1.0);
	c->beat_timer.data = c;
	c->beat_at = hpu__mono_s();
	if (cfg->nodes > 1)
		ev_timer_start(loop, &c->beat_timer);
	return c;
fail:
	hpu__coord_destroy(&c);
	return NULL;
}

int hpu__coord_set_up_apart(const hpu_coord *c)
{
	return c->set_up_apart;
}

int hpu__coord_interrupted(const hpu_coord *c)
{
	return c->interrupted;
}

int hpu__coord_port(const hpu_coord *c)
{
	return c->port;
}

void hpu__coord_destroy(hpu_coord **pc)
{
	hpu_coord *c = *pc;
	if (!c)
		return;
	hpu__zwatch_stop(&c->zw);
	if (c->loop) {
		ev_timer_stop(c->loop, &c->join_timer);
		ev_timer_stop(c->loop, &c->beat_timer);
	}
	if (c->sock)
		zmq_close(c->sock);
	if (c->ctx)
		hpu__zmq_ctx_term(c->ctx);
	free(c->ranks);
	free(c->agents);
	free(c);
	*pc = NULL;
}
