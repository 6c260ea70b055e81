#include "launcher/submit.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "agent/agent.h"
#include "proto/auth.h"
#include "common/num.h"
#include "proto/codec.h"
#include "common/env.h"
#include "common/log.h"
#include "agent/nodejob.h"
#include "agent/output.h"
#include "agent/progress.h"
#include "agent/restart.h"
#include "common/fileio.h"

#define REPLY_TIMEOUT_MS 10000
#define PING_EVERY_S 1.0
/* A turn of follow()'s loop this much later than the last: the process
 * did not run in between. */
#define STALLED_S 3.0
#define PUMP_SLICE_S 0.1        /* pump: at most this long on one node */
#define DROP_WARNINGS_PER_S 5   /* more are counted, then summed up */
#define LINE_JOIN_MAX (1 << 20) /* a rank's line joined from pieces, at most */

/* One hpud. A conversation with it is a session: a Hello with a fresh
 * session id, answered with hpud's instance id, which every request then
 * names; hpud's frames name both and number themselves (seq), and one is
 * taken only when its seq is above the last taken (proto/hpu.proto). */
typedef struct node {
	const char *host;
	int port;
	void *sock;
	int launched, ended, ok;
	int requested;          /* its launch request went out, unanswered:
				 * hpud may have accepted it (a cancel goes
				 * to it all the same) */
	int reconnect;          /* lost: a new connection before the next hello */
	int cancelled;          /* we cancelled its part while it ran: its end,
				 * "cancelled by the submitter", is not a cause */
	char reason[700];
	double last_heard;
	char session[HPU_AUTH_ID_HEX + 1];      /* ours, new at every hello */
	char old_session[HPU_AUTH_ID_HEX + 1];  /* the one before: its late
						 * frames go without a word */
	char instance[64];      /* hpud's, from its HelloReply ("": none yet) */
	int restarted;          /* a HelloReply of another instance came:
				 * the hpud our job ran under is gone */
	uint64_t last_seq;      /* of the last frame taken from it */
} node;

typedef struct submit {
	const hpu_launch_args *a;
	hpu_auth *auth;
	void *ctx;
	node *n;
	int nn;
	int master_port;
	int lost;               /* the submitter lost a daemon (already said) */
	char lost_cause[700];   /* ... and this is what it said */
	volatile sig_atomic_t signo;
	char err[1024];
	hpu_progress bar;       /* rank 0's progress bar (--progress) ... */
	int following;          /* ... drawn while an attempt is followed */
	double drop_window;     /* messages dropped: warned of this second, */
	int drops_warned;       /* at most DROP_WARNINGS_PER_S, the rest */
	long drops_unsaid;      /* counted and summed up */
	struct piece {          /* per rank: the pieces of a long line so far */
		char *buf;
		size_t len;
	} *pieces;
	int npieces;
	struct rank_log {       /* per rank: its --log-dir file, here */
		int fd;         /* -1: closed after a failed write (said) */
		char path[4200];
	} *logs;
	int nlogs;
} submit;

static submit S;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void on_signal(int sig)
{
	S.signo = sig;
	hpu__write_interrupted = 1; /* output that waits gives up (common/fileio.h) */
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(S.err, sizeof S.err, fmt, ap);
	va_end(ap);
	return -1;
}

/* Signs env for nd's hpud, naming its instance and our session, and
 * sends it. Returns 0, or -1 with S.err saying why ("cannot send to hpud
 * at HOST:PORT`which`: ..."). */
static int send_env(node *nd, Hpu__Envelope *env, const char *which)
{
	uint8_t *body = NULL, *frame = NULL;
	env->instance = nd->instance;
	env->session = nd->session;
	size_t blen = hpu__codec_pack(env, &body), flen = 0;
	if (body && blen > HPU_CODEC_MAX_MSG) {
		free(body);
		return fail("cannot send to hpud at %s:%d%s: the request is %zu bytes, over hpud's limit of %d",
			    nd->host, nd->port, which, blen, HPU_CODEC_MAX_MSG);
	}
	if (body)
		flen = hpu__auth_sign(S.auth, body, blen, hpu__auth_now_ms(), &frame);
	free(body);
	if (!frame)
		return fail("cannot send to hpud at %s:%d%s: out of memory signing the request",
			    nd->host, nd->port, which);
	int rc = zmq_send(nd->sock, frame, flen, ZMQ_DONTWAIT) < 0 ? -1 : 0;
	if (rc < 0)
		fail("cannot send to hpud at %s:%d%s: %s", nd->host, nd->port, which,
		     zmq_strerror(errno));
	free(frame);
	return rc;
}

/* Says how many warnings about dropped messages went unsaid, once their
 * second is over (or at the end, `last`). */
static void drops_summary(int last)
{
	double t = now_s();
	if (t - S.drop_window < 1.0 && !last)
		return;
	if (S.drops_unsaid) {
		hpu__progress_hide(&S.bar);
		hpu__log(HPU_LOG_WARNING, "warning: %ld more messages dropped (not shown)",
			 S.drops_unsaid);
	}
	S.drop_window = t;
	S.drops_warned = 0;
	S.drops_unsaid = 0;
}

/* Warns that a message from nd was dropped, at most DROP_WARNINGS_PER_S
 * times a second: a flood of them cannot flood the terminal. */
static void warn_drop(const node *nd, const char *what, const char *why)
{
	drops_summary(0);
	if (S.drops_warned++ >= DROP_WARNINGS_PER_S) {
		S.drops_unsaid++;
		return;
	}
	hpu__progress_hide(&S.bar);
	hpu__log(HPU_LOG_WARNING, "warning: dropped %s from %s:%d%s%s", what, nd->host,
		 nd->port, why ? ": " : "", why ? why : "");
}

/* Whether env, genuine, belongs to nd's current session: for it, from the
 * instance it said hello to (a HelloReply tells which that is), and newer
 * than the last frame taken. NULL if so, else why not ("" for a late frame
 * of the previous session, not worth a warning). */
static const char *check_binding(node *nd, const Hpu__Envelope *env, char *why, size_t len)
{
	if (!nd->session[0] || !env->session || strcmp(env->session, nd->session) != 0)
		return env->session && nd->old_session[0] &&
				       !strcmp(env->session, nd->old_session)
			       ? ""
			       : "not for this session (a replay?)";
	if (!nd->instance[0]) { /* waiting for the answer to our hello */
		if (env->msg_case != HPU__ENVELOPE__MSG_HELLO_REPLY)
			return "before hpud's answer to hello";
		const char *in = env->hello_reply->instance;
		if (!in || !*in || strlen(in) >= sizeof nd->instance || !env->instance ||
		    strcmp(env->instance, in) != 0)
			return "a hello reply without a valid instance id";
		snprintf(nd->instance, sizeof nd->instance, "%s", in);
		nd->last_seq = env->seq;
		return NULL;
	}
	/* hpud restarted: the new one answers our requests with its hello
	 * (daemon/requests.c); genuine, for our session, so not a replay */
	if (env->msg_case == HPU__ENVELOPE__MSG_HELLO_REPLY && env->instance &&
	    env->hello_reply->instance && !strcmp(env->instance, env->hello_reply->instance) &&
	    strcmp(env->instance, nd->instance) != 0) {
		nd->restarted = 1;
		return "";
	}
	if (!env->instance || strcmp(env->instance, nd->instance) != 0)
		return "from another hpud instance (a replay?)";
	if (env->seq <= nd->last_seq) {
		snprintf(why, len, "replayed or out of order (seq %llu, the last was %llu)",
			 (unsigned long long)env->seq, (unsigned long long)nd->last_seq);
		return why;
	}
	nd->last_seq = env->seq;
	return NULL;
}

/* The next message from nd, verified; NULL when none is waiting or it is
 * not genuine or not for this session (then it is dropped, with a
 * warning). Replays are refused by sequence number, not by a cache of
 * nonces, so that output at any rate is taken. */
static Hpu__Envelope *recv_env(node *nd)
{
	zmq_msg_t m;
	zmq_msg_init(&m);
	if (zmq_msg_recv(&m, nd->sock, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&m);
		return NULL;
	}
	const void *body;
	size_t blen;
	char why[256];
	const char *bad;
	Hpu__Envelope *env = NULL;
	if (hpu__auth_check(S.auth, zmq_msg_data(&m), zmq_msg_size(&m), hpu__auth_now_ms(),
			    &body, &blen, why, sizeof why) < 0)
		warn_drop(nd, "a message", why);
	else if (!(env = hpu__codec_unpack(body, blen)))
		warn_drop(nd, "a malformed message", NULL);
	else if ((bad = check_binding(nd, env, why, sizeof why))) {
		if (*bad)
			warn_drop(nd, "a signed message", bad);
		hpu__codec_free(env);
		env = NULL;
	}
	zmq_msg_close(&m);
	if (env)
		nd->last_heard = now_s();
	return env;
}

static int connect_node(node *nd)
{
	char ep[320];
	snprintf(ep, sizeof ep, "tcp://%s:%d", nd->host, nd->port);
	int linger = 1000;
	int64_t maxmsg = HPU_AUTH_MAX_FRAME;
	nd->sock = zmq_socket(S.ctx, ZMQ_DEALER);
	if (!nd->sock || zmq_setsockopt(nd->sock, ZMQ_LINGER, &linger, sizeof linger) ||
	    zmq_setsockopt(nd->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
	    zmq_connect(nd->sock, ep))
		return fail("cannot connect to hpud at %s: %s", ep, zmq_strerror(errno));
	return 0;
}

/* Looks host up as ZeroMQ will (IPv4) before anything is sent: a name
 * that does not resolve would otherwise only time out waiting for an
 * answer. which names the host in the hostfile ("" for --status). */
static int resolve_host(const char *host, const char *which)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	int rc = getaddrinfo(host, NULL, &hints, &ai);
	if (rc == 0) {
		freeaddrinfo(ai);
		return 0;
	}
	return fail("host %s%s does not resolve: %s", host, which,
		    rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
}

/* Every host of the hostfile, before any is contacted. */
static int resolve_hosts(const hpu_launch_args *a)
{
	char which[400];
	for (int i = 0; i < a->nhosts; i++) {
		snprintf(which, sizeof which, " (node %d in %s)", i, a->hostfile);
		if (resolve_host(a->hosts[i].name, which) < 0)
			return -1;
	}
	return 0;
}

static int setup(const char *key_path, int nodes)
{
	uint8_t key[HPU_AUTH_KEY_BYTES];
	char err[600];
	if (hpu__auth_load_key(key_path, key, err, sizeof err) < 0)
		return fail("%s", err);
	/* hpud's frames are checked by sequence number (recv_env): the
	 * verifier needs no room for nonces. Their clock is taken within the
	 * widest window an hpud may have (a node whose clock_window is wider
	 * than 30 s answered requests whose replies were then dropped: the
	 * session and the sequence numbers refuse a replay, not the clock) */
	S.auth = hpu__auth_new(key, (int64_t)HPU_AUTH_WINDOW_MAX_S * 1000, 1);
	memset(key, 0, sizeof key);
	S.ctx = zmq_ctx_new();
	S.n = calloc((size_t)nodes, sizeof *S.n);
	S.nn = nodes;
	if (!S.auth || !S.ctx || !S.n)
		return fail("out of memory");
	return 0;
}

static void teardown(void)
{
	drops_summary(1);
	for (int i = 0; i < S.nn; i++)
		if (S.n[i].sock)
			zmq_close(S.n[i].sock);
	if (S.ctx)
		hpu__zmq_ctx_term(S.ctx);
	free(S.n);
	for (int i = 0; i < S.npieces; i++)
		free(S.pieces[i].buf);
	free(S.pieces);
	for (int i = 0; i < S.nlogs; i++)
		if (S.logs[i].fd >= 0)
			hpu__output_file_close(S.logs[i].fd, S.logs[i].path);
	free(S.logs);
	hpu__auth_destroy(&S.auth);
}

/* ---- the job ---- */

/* --log-dir with --hostfile: each rank's lines, as printed, also go to
 * DIR/rank_N.log here, on the submitter's machine (the workers run under
 * hpud on other machines). Every rank's file is made (emptied) before the
 * job is submitted, as a local job's are at its start, and keeps every
 * attempt's output. Returns 0, or -1 with S.err naming the file. */
static int open_logs(void)
{
	if (!S.a->log_dir || S.a->world <= 0)
		return 0;
	if (!(S.logs = calloc((size_t)S.a->world, sizeof *S.logs)))
		return fail("out of memory");
	S.nlogs = S.a->world;
	for (int i = 0; i < S.nlogs; i++)
		S.logs[i].fd = -1;
	for (int i = 0; i < S.nlogs; i++) {
		struct rank_log *l = &S.logs[i];
		snprintf(l->path, sizeof l->path, "%s/rank_%d.log", S.a->log_dir, i);
		const char *why = NULL;
		l->fd = hpu__open_unshared(l->path, 0, 0644, &why);
		if (l->fd >= 0 && why) /* a lock that is not a job's, ignored */
			hpu__log(HPU_LOG_WARNING, "warning: %s: %s", l->path, why);
		if (l->fd < 0)
			return fail("cannot write the log file %s: %s%s", l->path, why,
				    why == hpu__in_use_why ? " --log-dir" : "");
	}
	return 0;
}

static void log_text(uint32_t rank, const char *text)
{
	if (rank >= (uint32_t)S.nlogs || S.logs[rank].fd < 0)
		return;
	struct rank_log *l = &S.logs[rank];
	char prefix[32];
	int k = snprintf(prefix, sizeof prefix, "[rank %u] ", rank);
	if (hpu__output_file(l->fd, l->path, prefix, (size_t)k) < 0 ||
	    hpu__output_file(l->fd, l->path, text, strlen(text)) < 0 ||
	    hpu__output_file(l->fd, l->path, "\n", 1) < 0) {
		close(l->fd);
		l->fd = -1;
	}
}

/* To the stream the worker wrote it to, as a local run's (a worker's
 * stderr came out on stdout) */
static void print_text(uint32_t rank, const char *text, int is_err)
{
	FILE *f = is_err ? stderr : stdout;
	log_text(rank, text);
	if (!hpu__output_std_ok(is_err ? 2 : 1))
		return; /* said once: the rest is lost */
	hpu__progress_hide(&S.bar);
	fprintf(f, "[rank %u] %s\n", rank, text);
	hpu__output_stream(f);
	hpu__progress_show(&S.bar);
}

/* Adds text to rank's line in pieces; 0, or -1 (not a rank of the job,
 * no memory, past LINE_JOIN_MAX: then the caller prints it as it is). */
static int join_piece(uint32_t rank, const char *text)
{
	if (!S.pieces && S.a->world > 0 &&
	    (S.pieces = calloc((size_t)S.a->world, sizeof *S.pieces)))
		S.npieces = S.a->world;
	if (rank >= (uint32_t)S.npieces)
		return -1;
	struct piece *p = &S.pieces[rank];
	size_t n = strlen(text);
	char *b = p->len + n < LINE_JOIN_MAX ? realloc(p->buf, p->len + n + 1) : NULL;
	if (!b)
		return -1;
	memcpy(b + p->len, text, n + 1);
	p->buf = b;
	p->len += n;
	return 0;
}

/* A worker's line, or a piece of one (more: hpud split a long line to
 * fit its frames), joined here and printed whole. */
static void print_line(const Hpu__LogLine *l)
{
	const char *text = l->text ? l->text : "";
	struct piece *p = l->rank < (uint32_t)S.npieces ? &S.pieces[l->rank] : NULL;
	if (l->more || (p && p->len)) {
		if (join_piece(l->rank, text) == 0) {
			if (l->more)
				return;
			p = &S.pieces[l->rank];
			text = p->buf;
		} else if (p && p->len) { /* what was joined goes first, whole */
			print_text(l->rank, p->buf, l->err);
		}
	}
	print_text(l->rank, text, l->err);
	if (p && p->len) {
		free(p->buf);
		p->buf = NULL;
		p->len = 0;
	}
}

/* Rank 0's record, from node 0's hpud, for the bar. */
static void take_progress(const Hpu__Progress *p)
{
	if (!S.following || !p->status || p->status->rank != 0 || !p->job_id ||
	    strcmp(p->job_id, S.a->job_id) != 0)
		return;
	hpu_status_rec st;
	hpu__status_from_proto(p->status, p->eta_s, &st);
	hpu__progress_update(&S.bar, &st);
}

/* Handles a message from nd during the run; returns its launch reply (to
 * be freed) when it is one. */
static Hpu__Envelope *dispatch(node *nd, Hpu__Envelope *m)
{
	switch (m->msg_case) {
	case HPU__ENVELOPE__MSG_LOG_LINE:
		print_line(m->log_line);
		break;
	case HPU__ENVELOPE__MSG_PROGRESS:
		take_progress(m->progress);
		break;
	case HPU__ENVELOPE__MSG_JOB_END:
		if (!nd->ended) {
			nd->ended = 1;
			nd->ok = m->job_end->ok;
			snprintf(nd->reason, sizeof nd->reason, "%s",
				 m->job_end->reason ? m->job_end->reason : "");
		}
		break;
	case HPU__ENVELOPE__MSG_WORKER_EXIT: {
		const Hpu__WorkerExit *w = m->worker_exit;
		if ((w->exit_code != 0 || w->left_early) && !S.a->quiet) {
			hpu__progress_hide(&S.bar);
			char pos[128], at[130] = "";
			hpu__describe_position((long)w->step, (long)w->total, (int)w->phase, pos,
					       sizeof pos);
			/* where it was, as hpud knew (zeros and setup for a
			 * worker that never reported: an --exec program) */
			if (w->step || w->total || w->phase != HPU_PHASE_SETUP)
				snprintf(at, sizeof at, " %s", pos);
			if (w->signal)
				hpu__log(HPU_LOG_ERROR, "rank %u (node %u, pid %u) was killed by signal %d%s",
					 w->rank, w->node_rank, w->pid, w->signal, at);
			else if (w->left_early)
				hpu__log(HPU_LOG_ERROR, "rank %u (node %u, pid %u) exited with code 0 before the job ended (%s)",
					 w->rank, w->node_rank, w->pid, pos);
			else
				hpu__log(HPU_LOG_ERROR, "rank %u (node %u, pid %u) exited with code %d%s",
					 w->rank, w->node_rank, w->pid, w->exit_code, at);
		}
		break;
	}
	case HPU__ENVELOPE__MSG_LAUNCH_REPLY:
		return m;
	default:
		break;
	}
	hpu__codec_free(m);
	return NULL;
}

/* The answer to nd's launch request: it runs its part of the job (ok)
 * or not; either way the request is answered. */
static void take_launch_reply(node *nd, const Hpu__LaunchReply *r)
{
	if (!nd->requested || !r->job_id || strcmp(r->job_id, S.a->job_id) != 0)
		return;
	nd->requested = 0;
	nd->launched = r->ok;
}

/* Drains every node's socket, waiting up to timeout_ms for something;
 * for PUMP_SLICE_S at most per node, as a job's output may flow without a
 * pause (hpud refills as fast as we read): the caller's pings must go on.
 * A launch reply is taken (take_launch_reply) and, from node
 * want_reply_from, handed to the caller in *reply. */
static void pump(int timeout_ms, int want_reply_from, Hpu__Envelope **reply)
{
	zmq_pollitem_t items[S.nn];
	drops_summary(0);
	for (int i = 0; i < S.nn; i++)
		items[i] = (zmq_pollitem_t){.socket = S.n[i].sock, .events = ZMQ_POLLIN};
	if (zmq_poll(items, S.nn, timeout_ms) <= 0)
		return;
	for (int i = 0; i < S.nn; i++) {
		Hpu__Envelope *m;
		double until = now_s() + PUMP_SLICE_S;
		while (now_s() < until && (m = recv_env(&S.n[i]))) {
			Hpu__Envelope *r = dispatch(&S.n[i], m);
			if (r)
				take_launch_reply(&S.n[i], r->launch_reply);
			if (r && i == want_reply_from && reply && !*reply)
				*reply = r;
			else
				hpu__codec_free(r);
		}
	}
}

/* The signal that interrupted the submission, as its lines name it. */
static const char *signo_name(void)
{
	return S.signo == SIGINT ? "SIGINT" : S.signo == SIGHUP ? "SIGHUP" : "SIGTERM";
}

static void ping_all(void);

/* While a submission waits for one node (its hello or launch reply): the
 * nodes whose part runs already are pinged every PING_EVERY_S, so that a
 * slow node does not get them cancelled for silence (submitter_timeout). */
static void ping_started(double *last)
{
	if (now_s() - *last >= PING_EVERY_S) {
		ping_all();
		*last = now_s();
	}
}

/* Opens a new session with nd's hpud: a Hello under a fresh session id,
 * then waits (taking the other nodes' messages meanwhile) for the answer
 * that names hpud's instance. Returns 0, or -1 with S.err set. which
 * names the node in messages (" (node 2)", or ""). */
static int hello(node *nd, const char *which)
{
	/* A daemon that went silent may be gone without closing its end (a
	 * killed container, a host rebooted): ZeroMQ would keep writing into
	 * that dead connection, and the hello would be lost with it. */
	if (nd->reconnect) {
		zmq_close(nd->sock);
		nd->sock = NULL;
		if (connect_node(nd) < 0)
			return -1;
		nd->reconnect = 0;
	}
	memcpy(nd->old_session, nd->session, sizeof nd->session);
	if (hpu__auth_random_id(nd->session) < 0)
		return fail("cannot draw a session id: the random generator failed");
	nd->instance[0] = 0;
	nd->restarted = 0;
	nd->last_seq = 0;
	Hpu__Hello h = HPU__HELLO__INIT;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_HELLO;
	env.hello = &h;
	if (send_env(nd, &env, which) < 0)
		return -1;
	double deadline = now_s() + REPLY_TIMEOUT_MS / 1000.0, pinged = now_s();
	while (!nd->instance[0] && now_s() < deadline && !S.signo) {
		pump(100, -1, NULL);
		ping_started(&pinged);
	}
	if (!nd->instance[0])
		return fail(S.signo ? "interrupted" :
			    "no answer from hpud at %s:%d%s within %d s: is it running, does it have the same key, and is its clock within its clock_window of this one's?",
			    nd->host, nd->port, which, REPLY_TIMEOUT_MS / 1000);
	return 0;
}

/* Node i's launch request for attempt `restart`, and what it points to. */
typedef struct request {
	Hpu__LaunchRequest q;
	Hpu__Envelope env;
	uint32_t *slots;                      /* every node's workers */
	char envbuf[16][1100], *envp[16];     /* hpu__job_env has fewer */
	size_t env_bytes;                     /* of envbuf's strings */
} request;

/* Fills *r (r->slots to be freed). Returns 0, or -1 with S.err set. */
static int request_make(request *r, int i, int restart)
{
	const hpu_launch_args *a = S.a;
	Hpu__LaunchRequest q = HPU__LAUNCH_REQUEST__INIT;
	q.job_id = (char *)a->job_id;
	q.job_token = (char *)a->token;
	q.node_rank = (uint32_t)i;
	q.nodes = (uint32_t)S.nn;
	q.devices = (uint32_t)a->hosts[i].slots;
	/* every node's workers: they may differ (the hostfile's slots) */
	uint32_t *slots = calloc((size_t)S.nn, sizeof *slots);
	r->slots = slots;
	if (!slots)
		return fail("out of memory");
	for (int k = 0; k < S.nn; k++)
		slots[k] = (uint32_t)a->hosts[k].slots;
	q.n_node_devices = (size_t)S.nn;
	q.node_devices = slots;
	q.master_addr = (char *)S.n[0].host;
	q.master_port = (uint32_t)S.master_port;
	q.n_argv = (size_t)(a->worker_argc - 1); /* hpud picks the program */
	q.argv = a->worker_argv + 1;
	q.transport = (char *)(a->transport ? a->transport : "");
	q.restart_count = (uint32_t)restart;
	q.max_restarts = (uint32_t)a->max_restarts;
	q.join_timeout_s = a->join_timeout_s;
	r->env_bytes = 0;
	for (int k = 0; hpu__job_env[k] != HPU_ENV_COUNT && q.n_env < 16; k++) {
		const char *v = hpu__env_str(hpu__job_env[k]);
		if (v && *v) {
			snprintf(r->envbuf[q.n_env], sizeof r->envbuf[0], "%s=%s",
				 hpu__env_name(hpu__job_env[k]), v);
			r->envp[q.n_env] = r->envbuf[q.n_env];
			r->env_bytes += strlen(r->envbuf[q.n_env]);
			q.n_env++;
		}
	}
	q.env = r->envp;
	r->q = q;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_LAUNCH_REQUEST;
	r->env = env;
	r->env.launch_request = &r->q;
	return 0;
}

/* Whether every node's launch request, at its longest (any attempt, any
 * coordinator port, an hpud instance id of the most characters), fits
 * what hpud takes (HPU_CODEC_MAX_MSG): 0, or -1 with S.err saying how
 * long it is and what to shorten. Before any node is contacted. */
static int check_request_size(void)
{
	char session[sizeof S.n[0].session], instance[sizeof S.n[0].instance];
	memset(session, 'f', sizeof session - 1);
	session[sizeof session - 1] = 0;
	memset(instance, 'f', sizeof instance - 1);
	instance[sizeof instance - 1] = 0;
	for (int i = 0; i < S.nn; i++) {
		request *r = malloc(sizeof *r);
		if (!r || request_make(r, i, S.a->max_restarts) < 0) {
			if (r)
				free(r->slots);
			free(r);
			return fail("out of memory");
		}
		r->q.master_port = 65535;
		r->env.session = session;
		r->env.instance = instance;
		size_t len = hpu__envelope__get_packed_size(&r->env), args = 0;
		for (size_t k = 0; k < r->q.n_argv; k++)
			args += strlen(r->q.argv[k]);
		size_t envb = r->env_bytes;
		free(r->slots);
		free(r);
		if (len > HPU_CODEC_MAX_MSG)
			return fail("the launch request is %zu bytes, over hpud's limit of %d: the model's arguments (%zu bytes) or the environment passed to the workers (%zu bytes) are too long",
				    len, HPU_CODEC_MAX_MSG, args, envb);
	}
	return 0;
}

static int launch_node(int i, int restart)
{
	node *nd = &S.n[i];
	char which[32];
	snprintf(which, sizeof which, " (node %d)", i);
	if (hello(nd, which) < 0)
		return -1;
	if (S.signo) /* nothing sent yet: nothing to cancel here */
		return fail("interrupted");
	request *rq = malloc(sizeof *rq);
	if (!rq || request_make(rq, i, restart) < 0) {
		if (rq)
			free(rq->slots);
		free(rq);
		return fail("out of memory");
	}
	int sent = send_env(nd, &rq->env, which);
	free(rq->slots);
	free(rq);
	if (sent < 0)
		return -1;
	/* From here on hpud may run the job: an interruption cancels it there
	 * too, answered or not (hpud takes the cancel after the request) */
	nd->requested = 1;
	Hpu__Envelope *r = NULL;
	double deadline = now_s() + REPLY_TIMEOUT_MS / 1000.0, pinged = now_s();
	while (!r && now_s() < deadline && !S.signo) {
		pump(100, i, &r);
		ping_started(&pinged);
	}
	if (!r)
		return fail(S.signo ? "interrupted" :
			    "no answer from hpud at %s:%d (node %d) within %d s: is it running, does it have the same key, and is its clock within its clock_window of this one's?",
			    nd->host, nd->port, i, REPLY_TIMEOUT_MS / 1000);
	int ok = r->launch_reply->ok;
	if (!ok)
		fail("hpud at %s:%d (node %d) refused the job: %s", nd->host, nd->port, i,
		     r->launch_reply->error ? r->launch_reply->error : "");
	else if (i == 0)
		S.master_port = (int)r->launch_reply->master_port;
	hpu__codec_free(r);
	return ok ? 0 : -1;
}

/* Whether nd runs its part of the job, or may (a request unanswered),
 * and has not said that it ended. */
static int may_run(const node *nd)
{
	return (nd->launched || nd->requested) && !nd->ended;
}

static void send_all(Hpu__Envelope *env)
{
	for (int i = 0; i < S.nn; i++)
		if (may_run(&S.n[i]))
			send_env(&S.n[i], env, "");
}

/* Cancels the job on nd, or on every node that runs it (nd NULL). */
static void cancel_on(node *nd)
{
	Hpu__Cancel c = HPU__CANCEL__INIT;
	c.job_id = (char *)S.a->job_id;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_CANCEL;
	env.cancel = &c;
	for (int i = 0; i < S.nn; i++)
		if ((!nd || nd == &S.n[i]) && may_run(&S.n[i])) {
			send_env(&S.n[i], &env, "");
			S.n[i].cancelled = 1;
		}
}

static void cancel_all(void)
{
	cancel_on(NULL);
}

static void ping_all(void)
{
	Hpu__Ping p = HPU__PING__INIT;
	p.job_id = (char *)S.a->job_id;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_PING;
	env.ping = &p;
	send_all(&env);
}

static int all_ended(void)
{
	for (int i = 0; i < S.nn; i++)
		if (may_run(&S.n[i]))
			return 0;
	return 1;
}

/* The job's outcome: 0, or 1 with the root cause in cause and printed. A
 * daemon the submitter lost is the cause (and was said when it happened).
 * Otherwise a node that reported its part failed before we cancelled it
 * is preferred over one we cancelled (its reason is our cancel), one gone
 * silent or one that never ended; among reporters node 0's reason is the
 * coordinator's, so it is preferred. */
static int outcome(char *cause, size_t len, int say)
{
	if (S.lost) {
		snprintf(cause, len, "%s", S.lost_cause);
		return 1;
	}
	int bad = -1, best = -1;
	for (int i = 0; i < S.nn; i++) {
		const node *nd = &S.n[i];
		if (!nd->launched || (nd->ended && nd->ok))
			continue;
		int reported = nd->ended && !nd->reconnect && !nd->cancelled && nd->reason[0];
		int score = reported ? 2 + (i == 0) : nd->reason[0] ? 1 : 0;
		if (score > best) {
			best = score;
			bad = i;
		}
	}
	if (bad < 0)
		return 0;
	node *nd = &S.n[bad];
	snprintf(cause, len, "%s", nd->reason[0] ? nd->reason : "a node's part did not end");
	if (say)
		hpu__log(HPU_LOG_ERROR, "error: %s", cause);
	return 1;
}

/* Whether a node's part ended with a failure. */
static int failure_reported(void)
{
	for (int i = 0; i < S.nn; i++)
		if (S.n[i].launched && S.n[i].ended && !S.n[i].ok && !S.n[i].reconnect)
			return 1;
	return 0;
}

/* Follows the job until every node's part has ended; returns its exit
 * status, with the root cause in cause when it is 1 (printed as an error
 * when `say`: where a restart follows, its line says the cause). */
static int follow(char *cause, size_t len, int say)
{
	const double silent_limit = S.a->agent_timeout_s;
	double last_ping = 0, cancel_at = 0, last_turn = now_s();
	int cancelled = 0;
	S.following = 1;
	while (!all_ended()) {
		double t = now_s();
		/* a time this process did not run (stopped: Ctrl-Z then fg,
		 * a suspended laptop, a stalled host) is not the daemons'
		 * silence: what they sent meanwhile waits in the socket, and
		 * is read before anyone is judged silent (a healthy job was
		 * reported lost) */
		if (t - last_turn > STALLED_S) {
			for (int i = 0; i < S.nn; i++)
				S.n[i].last_heard += t - last_turn;
			last_ping = 0; /* at once: they may have given this one up */
		}
		last_turn = t;
		hpu__progress_tick(&S.bar);
		if (S.signo && !cancelled) {
			/* no bar drawn again under the line below: no record
			 * taken (following), none left to draw by the ticks
			 * or a rank's line (reset: hide alone marks it to be
			 * drawn again) */
			S.following = 0;
			hpu__progress_reset(&S.bar);
			hpu__log(HPU_LOG_NOTICE, "interrupted by %s: cancelling job %s on %d node%s",
				 signo_name(), S.a->job_id, S.nn,
				 hpu__plural(S.nn));
			cancel_all();
			cancelled = 1;
			cancel_at = t;
		}
		if (cancelled && t - cancel_at > 15)
			break; /* the daemons did not answer: give up */
		if (t - last_ping >= PING_EVERY_S) {
			ping_all();
			last_ping = t;
		}
		/* Once a node reported the job failed (its cause names a rank
		 * that died, say), a daemon that stays silent through two pings
		 * is the dead node that cause names: the job ends on that
		 * report, not after the silence limit. */
		int reported = failure_reported();
		double limit = reported && silent_limit > 2 * PING_EVERY_S ? 2 * PING_EVERY_S
									  : silent_limit;
		for (int i = 0; i < S.nn; i++) {
			node *nd = &S.n[i];
			if (nd->launched && !nd->ended &&
			    (nd->restarted || t - nd->last_heard > limit)) {
				/* a node lost but perhaps alive (a network that
				 * drops, a stalled hpud) is told too: its part
				 * would run on */
				if (!nd->restarted)
					cancel_on(nd);
				nd->ended = 1;
				nd->reconnect = 1;
				if (nd->restarted)
					snprintf(nd->reason, sizeof nd->reason,
						 "lost contact with hpud at %s:%d (node %d): it restarted "
						 "(it answers as another instance), and the job's "
						 "workers there ended with the hpud that ran them",
						 nd->host, nd->port, i);
				else
					snprintf(nd->reason, sizeof nd->reason,
						 "lost contact with hpud at %s:%d (node %d): silent for "
						 "%.0f s",
						 nd->host, nd->port, i, limit);
				if (reported) {
					cancel_all();
					continue; /* the report is the cause */
				}
				if (!S.lost) {
					hpu__progress_hide(&S.bar);
					hpu__log(HPU_LOG_ERROR, "error: %s", nd->reason);
					snprintf(S.lost_cause, sizeof S.lost_cause, "%s", nd->reason);
				}
				S.lost = 1;
				cancel_all();
			}
		}
		pump(200, -1, NULL);
	}
	S.following = 0;
	hpu__progress_reset(&S.bar);
	if (S.signo)
		return 128 + S.signo;
	return outcome(cause, len, say);
}

/* Cancels the nodes' parts that run (or may: their requests unanswered)
 * and waits up to max_s for their ends (or for a refusal). */
static void cancel_and_wait(double max_s)
{
	cancel_all();
	for (double end = now_s() + max_s; !all_ended() && now_s() < end;)
		pump(100, -1, NULL);
}

/* A signal came while the job was being submitted: it is cancelled on
 * every node that accepted it or may have, as `follow` does. */
static void interrupted_submitting(void)
{
	int n = 0;
	for (int i = 0; i < S.nn; i++)
		n += may_run(&S.n[i]);
	hpu__progress_hide(&S.bar);
	if (n)
		hpu__log(HPU_LOG_NOTICE, "interrupted by %s while submitting: cancelling job %s on %d node%s",
			 signo_name(), S.a->job_id, n, n == 1 ? "" : "s");
	else
		hpu__log(HPU_LOG_NOTICE, "interrupted by %s: job %s was not submitted",
			 signo_name(), S.a->job_id);
	S.err[0] = 0;
	cancel_and_wait(15);
}

/* "2 nodes x 4 devices", or where the hosts' slots differ "3 ranks on 2
 * nodes (2+1)" (up to 8 nodes listed). */
static void describe_layout(char *out, size_t len)
{
	const hpu_launch_args *a = S.a;
	int same = 1;
	for (int i = 1; i < S.nn; i++)
		same &= a->hosts[i].slots == a->hosts[0].slots;
	if (same) {
		snprintf(out, len, "%d node%s x %d device%s", S.nn, hpu__plural(S.nn),
			 a->hosts[0].slots, hpu__plural(a->hosts[0].slots));
		return;
	}
	size_t n = (size_t)snprintf(out, len, "%d rank%s on %d node%s (", a->world,
				    hpu__plural(a->world), S.nn, hpu__plural(S.nn));
	for (int i = 0; i < S.nn && i < 8 && n < len; i++)
		n += (size_t)snprintf(out + n, len - n, "%s%d", i ? "+" : "", a->hosts[i].slots);
	if (n < len)
		snprintf(out + n, len - n, "%s)", S.nn > 8 ? "+..." : "");
}

/* Submits attempt `restart` of the job to every node, node 0 first.
 * Returns 0, or -1 with S.err set, having cancelled what started. */
static int launch_all(int restart)
{
	S.master_port = S.a->master_port;
	S.lost = 0;
	for (int i = 0; i < S.nn; i++) {
		node *nd = &S.n[i];
		nd->launched = nd->requested = nd->ended = nd->ok = nd->cancelled = 0;
		nd->reason[0] = 0;
		nd->last_heard = now_s();
	}
	for (int i = 0; i < S.nn; i++) {
		if (launch_node(i, restart) < 0) {
			/* What started must stop; before a restart, it must
			 * have stopped (its devices, its coordinator's port). */
			if (S.signo)
				interrupted_submitting();
			else
				cancel_and_wait(restart < S.a->max_restarts ? 15 : 2);
			return -1;
		}
		S.n[i].last_heard = now_s();
	}
	if (!S.a->quiet) {
		char layout[64];
		describe_layout(layout, sizeof layout);
		hpu__log(HPU_LOG_INFO, "job %s: %s through hpud, coordinator %s:%d",
			 S.a->job_id, layout, S.n[0].host, S.master_port);
	}
	return 0;
}

/* The job, attempt after attempt while it fails and restarts remain
 * (--max-restarts): each attempt is submitted once the previous one has
 * ended on every node. A submission refused at the first attempt ends
 * the job; at a restart it is that attempt's failure. */
static int run_attempts(void)
{
	hpu_restarts r;
	char cause[1024];
	int rc = 1;
	hpu__restarts_init(&r, S.a->max_restarts);
	for (;;) {
		if (S.signo && r.attempt > 0) { /* interrupted between attempts */
			rc = 128 + S.signo;
			break;
		}
		if (launch_all(r.attempt) < 0) {
			if (r.attempt == 0 || S.signo) {
				rc = S.signo ? 128 + S.signo : 1;
				break; /* the caller prints S.err */
			}
			hpu__log(HPU_LOG_ERROR, "error: %s", S.err);
			snprintf(cause, sizeof cause, "%s", S.err);
			S.err[0] = 0;
		} else {
			rc = follow(cause, sizeof cause, r.attempt >= r.max);
			S.err[0] = 0;
			if (rc != 1)
				break;
		}
		if (!hpu__restarts_next(&r, cause)) {
			rc = 1;
			break;
		}
	}
	hpu__restarts_free(&r);
	return rc;
}

int hpu__submit_run(const hpu_launch_args *a)
{
	S.a = a;
	int rc = 1;
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	hpu__progress_init(&S.bar, a->progress, stdout);
	if (open_logs() < 0) {
		rc = 2; /* before anything is submitted, as a --log-dir not made */
		goto out;
	}
	if (resolve_hosts(a) < 0 || setup(a->key_path, a->nhosts) < 0)
		goto out;
	for (int i = 0; i < a->nhosts; i++) {
		S.n[i].host = a->hosts[i].name;
		S.n[i].port = a->hosts[i].port ? a->hosts[i].port : a->hpud_port;
		S.n[i].last_heard = now_s();
	}
	if (check_request_size() < 0)
		goto out;
	for (int i = 0; i < a->nhosts; i++)
		if (connect_node(&S.n[i]) < 0)
			goto out;
	rc = run_attempts();
out:
	if (rc && S.err[0])
		hpu__log(HPU_LOG_ERROR, "error: %s", S.err);
	teardown();
	return rc;
}

static double mib(uint64_t bytes)
{
	return (double)bytes / (1024.0 * 1024.0);
}

/* The job's ranks on that node, under its line: "-" for a rank that has
 * not reported yet. */
static void print_ranks(const Hpu__JobStatus *j)
{
	if (!j->n_ranks)
		return;
	printf("  %5s %15s %7s %10s %10s  %20s  %24s  %26s  %10s\n", "rank", "step/total", "epoch",
	       "loss", "samples/s", "memory_allocated MiB", "max_memory_allocated MiB",
	       "total_memory_available MiB", "report age");
	for (size_t k = 0; k < j->n_ranks; k++) {
		const Hpu__RankStatus *r = j->ranks[k];
		if (!r->reported) {
			printf("  %5u %15s %7s %10s %10s  %20s  %24s  %26s  %10s\n", r->rank, "-", "-", "-",
			       "-", "-", "-", "-", "-");
			continue;
		}
		char steps[48], epoch[32], age[32], loss[32], sps[32], mem[3][40];
		/* a rank setting up has no reading yet where it reports 0 (or
		 * no loss): '-', not figures that look measured */
		int none = r->phase == HPU_PHASE_SETUP && r->step == 0;
		snprintf(steps, sizeof steps, "%llu/%llu", (unsigned long long)r->step,
			 (unsigned long long)r->total);
		snprintf(epoch, sizeof epoch, r->epochs ? "%u/%u" : "-", r->epoch, r->epochs);
		snprintf(age, sizeof age, "%.1f s", r->age_s);
		snprintf(loss, sizeof loss, none ? "-" : "%.4f", r->loss);
		snprintf(sps, sizeof sps, none ? "-" : "%.1f", r->samples_per_sec);
		double m[3] = {mib(r->mem_in_use), mib(r->mem_max), mib(r->mem_limit)};
		for (int i = 0; i < 3; i++)
			snprintf(mem[i], sizeof mem[i], none && m[i] == 0 ? "-" : "%.1f", m[i]);
		printf("  %5u %15s %7s %10s %10s  %20s  %24s  %26s  %10s%s\n", r->rank, steps, epoch,
		       loss, sps, mem[0], mem[1], mem[2], age,
		       r->phase == HPU_PHASE_DONE	    ? "  done"
		       : r->phase == HPU_PHASE_EVAL ? "  evaluating"
		       : r->phase == HPU_PHASE_SAVE ? "  saving a checkpoint"
		       : r->phase == HPU_PHASE_SETUP ? "  setting up"
						     : "");
	}
}

int hpu__status_run(const hpu_launch_args *a)
{
	S.a = a;
	int rc = 1;
	const char *host = a->status_host;
	int port = a->status_port ? a->status_port : a->hpud_port;
	if (resolve_host(host, "") < 0 || setup(a->key_path, 1) < 0)
		goto out;
	S.n[0].host = host;
	S.n[0].port = port;
	if (connect_node(&S.n[0]) < 0 || hello(&S.n[0], "") < 0)
		goto out;
	Hpu__StatusRequest q = HPU__STATUS_REQUEST__INIT;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_STATUS_REQUEST;
	env.status_request = &q;
	if (send_env(&S.n[0], &env, "") < 0)
		goto out;
	zmq_pollitem_t it = {.socket = S.n[0].sock, .events = ZMQ_POLLIN};
	Hpu__Envelope *m = NULL;
	double deadline = now_s() + REPLY_TIMEOUT_MS / 1000.0;
	while (!m && now_s() < deadline) {
		if (zmq_poll(&it, 1, 200) > 0)
			m = recv_env(&S.n[0]);
		if (m && m->msg_case != HPU__ENVELOPE__MSG_STATUS_REPLY) {
			hpu__codec_free(m);
			m = NULL;
		}
	}
	if (!m) {
		fail("no answer from hpud at %s:%d within %d s: is it running, does it have the same key, and is its clock within its clock_window of this one's?",
		     host, port, REPLY_TIMEOUT_MS / 1000);
		goto out;
	}
	const Hpu__StatusReply *r = m->status_reply;
	if (r->error && *r->error) {
		fail("hpud at %s:%d refused the status request: %s", host, port, r->error);
		hpu__codec_free(m);
		goto out;
	}
	printf("hpud %s:%d: %u device%s, %u free, %zu job%s\n", host, port, r->devices_total,
	       hpu__plural(r->devices_total), r->devices_free, r->n_jobs, hpu__plural(r->n_jobs));
	if (r->n_jobs)
		printf("%-24s %5s %8s %8s %10s  %s\n", "job", "node", "devices", "workers",
		       "running s", "submitter");
	for (size_t i = 0; i < r->n_jobs; i++) {
		const Hpu__JobStatus *j = r->jobs[i];
		printf("%-24s %5u %8zu %8u %10.0f  %s\n", j->job_id, j->node_rank,
		       j->n_device_ids, j->live_workers, j->seconds,
		       j->submitter ? j->submitter : "");
		print_ranks(j);
	}
	hpu__codec_free(m);
	rc = 0;
out:
	if (rc && S.err[0])
		hpu__log(HPU_LOG_ERROR, "error: %s", S.err);
	teardown();
	return rc;
}
