/* hpud's socket and its requests: a frame read off the ROUTER socket,
 * verified (proto/auth.h), bound to this instance, then hello, launch
 * (launch.c), status, cancel or ping. Calls launch.c, reply.c, jobs.c and
 * logging.c (daemon/hpud.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "daemon/hpud.h"
#include "common/clock.h"

/* ---- requests: status, cancel, ping, hello ---- */

/* The first `max` of j's ranks on this node into rs/rsp; returns how
 * many. */
static size_t rank_status(const job *j, size_t max, Hpu__RankStatus *rs,
			  Hpu__RankStatus **rsp)
{
	size_t n = (size_t)j->devices < max ? (size_t)j->devices : max;
	for (size_t k = 0; k < n; k++) {
		int rank = hpu__nodejob_rank(j->nj, (int)k);
		hpu_status_rec st;
		double age;
		int have = hpu__nodejob_status(j->nj, rank, &st, &age) == 0;
		hpu__status_to_proto(&rs[k], rank, have ? &st : NULL, age);
		rsp[k] = &rs[k];
	}
	return n;
}

static void do_status(const hpu_codec_peer *peer, const char *session)
{
	Hpu__JobStatus st[MAX_JOBS], *stp[MAX_JOBS];
	uint32_t ids[MAX_JOBS][64];
	/* the jobs' ranks: at most MAX_STATUS_RANKS a job, MAX_REPLY_RANKS in
	 * all (without memory, the reply goes without them) */
	size_t want = 0, used = 0, n = 0;
	for (int i = 0; i < MAX_JOBS; i++)
		if (hpud__D.jobs[i].used && hpud__D.jobs[i].nj)
			want += (size_t)(hpud__D.jobs[i].devices < MAX_STATUS_RANKS ? hpud__D.jobs[i].devices
									      : MAX_STATUS_RANKS);
	if (want > MAX_REPLY_RANKS)
		want = MAX_REPLY_RANKS;
	Hpu__RankStatus *rs = calloc(want ? want : 1, sizeof *rs);
	Hpu__RankStatus **rsp = calloc(want ? want : 1, sizeof *rsp);
	for (int i = 0; i < MAX_JOBS; i++) {
		job *j = &hpud__D.jobs[i];
		if (!j->used || !j->nj)
			continue;
		hpu__job_status__init(&st[n]);
		st[n].job_id = j->id;
		st[n].node_rank = (uint32_t)j->node_rank;
		st[n].n_device_ids = (size_t)(j->devices < 64 ? j->devices : 64);
		for (size_t k = 0; k < st[n].n_device_ids; k++)
			ids[n][k] = (uint32_t)j->dev[k];
		st[n].device_ids = ids[n];
		st[n].live_workers = (uint32_t)hpu__nodejob_live(j->nj);
		st[n].seconds = hpu__mono_s() - j->started;
		st[n].submitter = j->peer_addr;
		if (rs && rsp) {
			size_t left = want - used;
			st[n].ranks = rsp + used;
			st[n].n_ranks = rank_status(j, left < MAX_STATUS_RANKS ? left : MAX_STATUS_RANKS,
						    rs + used, st[n].ranks);
			used += st[n].n_ranks;
		}
		stp[n] = &st[n];
		n++;
	}
	Hpu__StatusReply r = HPU__STATUS_REPLY__INIT;
	r.n_jobs = n;
	r.jobs = stp;
	r.devices_total = (uint32_t)hpud__D.conf.devices;
	r.devices_free = (uint32_t)hpud__free_devices();
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_STATUS_REPLY;
	env.status_reply = &r;
	hpud__send_env(peer, session, &env);
	free(rs);
	free(rsp);
}

/* A cancel ends the job, also one whose launch this hpud has just taken
 * and not yet answered: a submitter interrupted while it submits sends
 * the cancel right after its launch request, on the same connection, so
 * it comes after the request (do_launch starts the job before anything
 * else is read). */
static void do_cancel(const char *addr, const Hpu__Cancel *c)
{
	job *j = c->job_id ? hpud__find_job(c->job_id) : NULL;
	if (!j || !j->nj || j->ended)
		return;
	char reason[200];
	snprintf(reason, sizeof reason, "cancelled by the submitter (%s)", addr);
	hpud__logmsg(HPUD_LOG_INFO, "job %s: %s", j->id, reason);
	hpu__nodejob_cancel(j->nj, reason, 2);
}

static void do_ping(const hpu_codec_peer *peer, const char *session, const Hpu__Ping *p)
{
	job *j = p->job_id ? hpud__find_job(p->job_id) : NULL;
	if (j)
		j->last_ping = hpu__mono_s();
	/* its submitter's session from another connection (ZeroMQ's
	 * reconnection after a reset gives it another routing id): the job's
	 * output and its end go there now, not to the connection gone */
	if (j && !strcmp(j->session, session) &&
	    (j->peer.len != peer->len || memcmp(j->peer.id, peer->id, peer->len))) {
		j->peer = *peer;
		hpud__logmsg(HPUD_LOG_INFO, "job %s: its submitter is back on another connection",
			     j->id);
	}
	Hpu__Ping pong = HPU__PING__INIT;
	pong.job_id = p->job_id ? p->job_id : "";
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_PING;
	env.ping = &pong;
	hpud__send_env(peer, session, &env);
}

/* Hello: this instance's id, for the session the submitter just opened. */
static void do_hello(const hpu_codec_peer *peer, const char *session)
{
	Hpu__HelloReply r = HPU__HELLO_REPLY__INIT;
	r.instance = hpud__D.instance;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_HELLO_REPLY;
	env.hello_reply = &r;
	hpud__send_env(peer, session, &env);
}

/* Whether m may be acted on: it names a session, and this instance unless
 * it is a Hello; otherwise NULL and the reason in why. */
static const char *check_binding(const Hpu__Envelope *m, char *why, size_t len)
{
	if (!m->session || !hpud__valid_id(m->session))
		return "no session id (1-63 letters, digits, '-', '_' or '.'): "
		       "is the submitter an older hpulaunch?";
	if (m->msg_case == HPU__ENVELOPE__MSG_HELLO)
		return NULL;
	if (!m->instance || !*m->instance)
		return "no hpud instance id: the submitter must say hello first "
		       "(is it an older hpulaunch?)";
	if (strcmp(m->instance, hpud__D.instance) != 0) {
		snprintf(why, len,
			 "signed for another hpud or before a restart (for instance %.40s, "
			 "this hpud is %s): a replay?",
			 hpud__valid_id(m->instance) ? m->instance : "(not an id)", hpud__D.instance);
		return why;
	}
	return NULL;
}

/* A request signed with the key, for a session, naming another instance:
 * a replay (to another hpud, or across a restart: what the instance
 * check is for), or a submitter whose job ran under this hpud before a
 * restart (the job ended with it). The request is not taken, but answered
 * with a HelloReply naming this instance, from which such a submitter
 * learns of the restart (it said hpud was "silent" while this one
 * refused its pings, a warning a second); a replay learns nothing it
 * could not ask with a hello. Said once per session. Returns 1 when
 * answered. */
static int restarted_under(const hpu_codec_peer *peer, const char *addr, const Hpu__Envelope *m)
{
	static char said[80];
	if (m->msg_case == HPU__ENVELOPE__MSG_HELLO || !m->session ||
	    !hpud__valid_id(m->session) || !m->instance || !hpud__valid_id(m->instance) ||
	    !strcmp(m->instance, hpud__D.instance))
		return 0;
	if (strcmp(said, m->session) != 0) {
		char why[300];
		snprintf(said, sizeof said, "%s", m->session);
		snprintf(why, sizeof why,
			 "signed for another hpud or before a restart (for instance %.40s, this hpud "
			 "is %s): not taken; answered with this hpud's instance, so that a submitter "
			 "whose job ran before a restart learns of it",
			 m->instance, hpud__D.instance);
		hpud__log_refusal(addr, why);
	}
	do_hello(peer, m->session);
	return 1;
}

/* What a request signed with the previous key (a key rotated since:
 * hpud.h's key_gen) may do: say hello, ping or cancel a job launched
 * under that key. A launch is answered that the key changed; anything
 * else is refused. Returns 1 to go on, 0 when it was answered or refused. */
static int prev_key_may(const hpu_codec_peer *peer, const char *addr, const Hpu__Envelope *m)
{
	const char *id = m->msg_case == HPU__ENVELOPE__MSG_PING ? m->ping->job_id
			 : m->msg_case == HPU__ENVELOPE__MSG_CANCEL ? m->cancel->job_id
								    : NULL;
	job *j = id ? hpud__find_job(id) : NULL;
	if (m->msg_case == HPU__ENVELOPE__MSG_HELLO)
		return 1;
	if (m->msg_case == HPU__ENVELOPE__MSG_LAUNCH_REQUEST) {
		hpud__log_refusal(addr, "a launch signed with the previous key (the key was rotated): refused");
		hpud__reply_launch(peer, m->session, m->launch_request->job_id ? m->launch_request->job_id : "",
				   NULL, "this hpud's key was rotated: the request is signed with the previous key, which only "
					 "jobs started before the rotation may use; give hpulaunch the new key (--key)");
		return 0;
	}
	if (m->msg_case == HPU__ENVELOPE__MSG_STATUS_REQUEST) {
		/* answered, as a launch is (it waited 10 s for nothing) */
		hpud__log_refusal(addr, "a status request signed with the previous key (the key was rotated): refused");
		Hpu__StatusReply r = HPU__STATUS_REPLY__INIT;
		r.error = "this hpud's key was rotated: the request is signed with the previous key; "
			  "give hpulaunch the new key (--key)";
		Hpu__Envelope env = HPU__ENVELOPE__INIT;
		env.msg_case = HPU__ENVELOPE__MSG_STATUS_REPLY;
		env.status_reply = &r;
		hpud__send_env(peer, m->session, &env);
		return 0;
	}
	if (!j || j->key_gen + 1 != hpud__D.key_gen) {
		hpud__log_refusal(addr, "signed with the previous key, which only the pings and cancels of jobs started "
					"before the key was rotated may use");
		return 0;
	}
	if (!j->prev_key_said) {
		hpud__logmsg(HPUD_LOG_INFO, "job %s: its submitter signs with the previous key (the job started before the key was rotated): taken for its pings and cancels",
			     j->id);
		j->prev_key_said = 1;
	}
	hpud__logmsg(HPUD_LOG_DEBUG, "job %s: a %s verified with the previous key", j->id,
		     m->msg_case == HPU__ENVELOPE__MSG_PING ? "ping" : "cancel");
	return 1;
}

/* The replay cache is full: every request is refused, the running jobs'
 * pings too (they are cancelled after submitter_timeout). Said as an
 * error, at most every 10 s, whatever the refusals' own limit. */
static void cache_full(void)
{
	static ev_tstamp said;
	ev_tstamp now = hpu__mono_s();
	if (said && now - said < 10)
		return;
	said = now;
	hpud__logmsg(HPUD_LOG_ERROR, "the replay cache is full (too many requests within clock_window, %g s): every request is refused, the running jobs' pings too, which cancels them after submitter_timeout; lower clock_window or find who floods hpud",
		     hpud__D.window_s);
}

static void handle(const hpu_codec_peer *peer, const char *addr, const void *frame,
		   size_t len)
{
	char why[256];
	const void *body;
	size_t blen;
	int prev = 0;
	if (hpu__auth_verify_either(hpud__D.auth, frame, len, hpu__auth_now_ms(), &body, &blen, &prev,
				    why, sizeof why) < 0) {
		hpud__log_refusal(addr, why);
		if (strstr(why, "replay cache full"))
			cache_full();
		return;
	}
	Hpu__Envelope *m = hpu__codec_unpack(body, blen);
	if (!m) {
		hpud__log_refusal(addr, "signed, but not a valid message");
		return;
	}
	char bwhy[200];
	const char *bad = check_binding(m, bwhy, sizeof bwhy);
	if (bad && restarted_under(peer, addr, m)) {
		hpu__codec_free(m);
		return;
	}
	if (bad) {
		hpud__log_refusal(addr, bad);
		hpu__codec_free(m);
		return;
	}
	hpud__D.reply_prev = prev;
	if (prev && !prev_key_may(peer, addr, m)) {
		hpud__D.reply_prev = 0;
		hpu__codec_free(m);
		return;
	}
	switch (m->msg_case) {
	case HPU__ENVELOPE__MSG_HELLO:
		do_hello(peer, m->session);
		break;
	case HPU__ENVELOPE__MSG_LAUNCH_REQUEST:
		hpud__do_launch(peer, addr, m->session, m->launch_request);
		break;
	case HPU__ENVELOPE__MSG_STATUS_REQUEST:
		do_status(peer, m->session);
		break;
	case HPU__ENVELOPE__MSG_CANCEL:
		do_cancel(addr, m->cancel);
		break;
	case HPU__ENVELOPE__MSG_PING:
		do_ping(peer, m->session, m->ping);
		break;
	default:
		hpud__log_refusal(addr, "not a request hpud takes");
		break;
	}
	hpud__D.reply_prev = 0;
	hpu__codec_free(m);
}

/* ---- the socket ---- */

static void on_sock(hpu_zwatch *w, void *arg)
{
	(void)arg;
	zmq_msg_t id, m;
	zmq_msg_init(&id);
	if (zmq_msg_recv(&id, w->sock, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&id);
		return;
	}
	hpu_codec_peer peer;
	peer.len = zmq_msg_size(&id) < sizeof peer.id ? zmq_msg_size(&id) : sizeof peer.id;
	memcpy(peer.id, zmq_msg_data(&id), peer.len);
	int more = zmq_msg_more(&id);
	zmq_msg_close(&id);
	if (!more)
		return;
	zmq_msg_init(&m);
	if (zmq_msg_recv(&m, w->sock, 0) < 0) {
		zmq_msg_close(&m);
		return;
	}
	char addr[64];
	const char *pa = zmq_msg_gets(&m, "Peer-Address");
	snprintf(addr, sizeof addr, "%s", pa ? pa : "an unknown peer");
	if (zmq_msg_more(&m)) { /* one frame after the id, no more */
		hpud__log_refusal(addr, "more than one frame");
		int rest = 1;
		while (rest) {
			zmq_msg_t x;
			zmq_msg_init(&x);
			if (zmq_msg_recv(&x, w->sock, 0) < 0)
				rest = 0;
			else
				rest = zmq_msg_more(&x);
			zmq_msg_close(&x);
		}
	} else {
		handle(&peer, addr, zmq_msg_data(&m), zmq_msg_size(&m));
	}
	zmq_msg_close(&m);
}

#define ACCEPT_LOG_S 10.0
/* The monitor's events: a connection the socket could not accept (no
 * descriptor left: clients holding connections open, or too many jobs)
 * is logged, at most once in ACCEPT_LOG_S with the count since; ZeroMQ
 * said nothing of it, and a submitter only saw no answer. */
static void on_monitor(hpu_zwatch *w, void *arg)
{
	(void)arg;
	zmq_msg_t ev, addr;
	zmq_msg_init(&ev);
	if (zmq_msg_recv(&ev, w->sock, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&ev);
		return;
	}
	uint16_t id = 0;
	int32_t value = 0;
	if (zmq_msg_size(&ev) >= 6) {
		memcpy(&id, zmq_msg_data(&ev), 2);
		memcpy(&value, (char *)zmq_msg_data(&ev) + 2, 4);
	}
	int more = zmq_msg_more(&ev);
	zmq_msg_close(&ev);
	while (more) { /* the endpoint */
		zmq_msg_init(&addr);
		if (zmq_msg_recv(&addr, w->sock, 0) < 0) {
			zmq_msg_close(&addr);
			break;
		}
		more = zmq_msg_more(&addr);
		zmq_msg_close(&addr);
	}
	if (id != ZMQ_EVENT_ACCEPT_FAILED)
		return;
	/* (not paused by unbinding: ZeroMQ closes the accepted connections
	 * with their listener, every submitter's) */
	hpud__D.accept_failed++;
	ev_tstamp now = hpu__mono_s();
	if (hpud__D.accept_logged > 0 && now - hpud__D.accept_logged < ACCEPT_LOG_S)
		return;
	hpud__D.accept_logged = now;
	hpud__logmsg(HPUD_LOG_WARN,
		     "cannot accept connections on tcp://%s:%d: %s (%ld refused since the last "
		     "such line): clients holding connections open, or the limit on open files "
		     "(LimitNOFILE) too low for the jobs",
		     hpud__D.conf.listen, hpud__D.conf.port, zmq_strerror(value),
		     hpud__D.accept_failed);
	hpud__D.accept_failed = 0;
}

void hpud__close_socket(void)
{
	hpu__zwatch_stop(&hpud__D.mzw);
	hpu__zwatch_stop(&hpud__D.zw);
	if (hpud__D.sock)
		zmq_socket_monitor(hpud__D.sock, NULL, 0);
	if (hpud__D.mon)
		zmq_close(hpud__D.mon);
	if (hpud__D.sock)
		zmq_close(hpud__D.sock);
	hpud__D.mon = hpud__D.sock = NULL;
}

int hpud__open_socket(char *err, size_t errlen)
{
	char ep[128];
	snprintf(ep, sizeof ep, "tcp://%s:%d", hpud__D.conf.listen, hpud__D.conf.port);
	int64_t maxmsg = HPU_AUTH_MAX_FRAME;
	/* A peer's queue holds a few messages, and says when it is full
	 * (mandatory: EAGAIN rather than a silent drop): a job's output waits
	 * in its own queue, counted in bytes (joboutput.h). */
	int linger = 1000, hwm = PEER_QUEUE_MSGS, mandatory = 1;
	/* a peer that stops answering ZeroMQ's heartbeats (gone without a
	 * FIN: a node's power, a cut network) is closed, not held */
	int hb_ivl = 10000, hb_timeout = 30000;
	const char *mon_ep = "inproc://hpud-monitor";
	hpud__D.ctx = zmq_ctx_new();
	hpud__D.sock = hpud__D.ctx ? zmq_socket(hpud__D.ctx, ZMQ_ROUTER) : NULL;
	if (!hpud__D.sock || zmq_setsockopt(hpud__D.sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
	    zmq_setsockopt(hpud__D.sock, ZMQ_LINGER, &linger, sizeof linger) ||
	    zmq_setsockopt(hpud__D.sock, ZMQ_SNDHWM, &hwm, sizeof hwm) ||
	    zmq_setsockopt(hpud__D.sock, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory) ||
	    zmq_setsockopt(hpud__D.sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl) ||
	    zmq_setsockopt(hpud__D.sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout) ||
	    zmq_socket_monitor(hpud__D.sock, mon_ep, ZMQ_EVENT_ACCEPT_FAILED) ||
	    !(hpud__D.mon = zmq_socket(hpud__D.ctx, ZMQ_PAIR)) || zmq_connect(hpud__D.mon, mon_ep) ||
	    hpu__zwatch_start(&hpud__D.mzw, hpud__D.loop, hpud__D.mon, on_monitor, NULL) ||
	    zmq_bind(hpud__D.sock, ep) ||
	    hpu__zwatch_start(&hpud__D.zw, hpud__D.loop, hpud__D.sock, on_sock, NULL)) {
		snprintf(err, errlen, "cannot listen on %s: %s", ep, zmq_strerror(errno));
		return -1;
	}
	return 0;
}
