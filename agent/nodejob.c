#include "agent/nodejob.h"
#include "common/clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <zmq.h>

#include "proto/codec.h"
#include "agent/coord.h"
#include "common/log.h"
#include "agent/restart.h"
#include "agent/zwatch.h"

struct hpu_nodejob {
	struct ev_loop *loop;
	hpu_nodejob_cfg cfg;
	hpu_agent *agent;
	hpu_coord *coord;       /* node 0 */
	void *ctx, *dealer;     /* other nodes: the link to the coordinator */
	hpu_zwatch zw;
	ev_timer beat;
	ev_idle end;            /* calls on_end outside the agent's callbacks */
	char master_ip[64];     /* master_addr, resolved */
	int master_port;
	ev_tstamp started, coord_seen;
	ev_tstamp last_beat; /* the heartbeat timer's last run (0: none yet) */
	int failed;             /* a worker failed, or the job was aborted */
	int unsaid;             /* its root cause was not printed: a restart
				 * remained to say it */
	int agent_idle, job_done, ended;
	int gated;              /* the workers wait for the coordinator's answer */
	int refused;            /* node 0's coordinator refused this node */
	int interrupted;        /* a user interrupted another node's hpulaunch */
	int coord_silent;       /* the coordinator never answered, or went silent */
	int rank_base, world;   /* this node's first rank; ranks in the job */
	char token[129];        /* the one this attempt's workers present */
	char root_cause[1200];
};

static void on_end_idle(struct ev_loop *loop, ev_idle *w, int revents)
{
	(void)revents;
	hpu_nodejob *j = w->data;
	ev_idle_stop(loop, w);
	if (j->cfg.on_end)
		j->cfg.on_end(j, j->failed, j->failed ? j->root_cause : "", j->cfg.arg);
}

static void finish_if_ready(hpu_nodejob *j)
{
	if (!j->agent_idle || j->ended || !(j->failed || j->job_done))
		return;
	j->ended = 1;
	ev_timer_stop(j->loop, &j->beat);
	ev_idle_start(j->loop, &j->end);
}

/* Stops the local workers; the first cause is the one reported (and
 * printed, when `print` and no restart remains: where one does, the
 * caller's "attempt A of N failed: CAUSE; restarting" says it, and a job
 * that then succeeds shows no error line). */
static void fail_as(hpu_nodejob *j, const char *cause, double grace_s, int print)
{
	if (!j->failed) {
		snprintf(j->root_cause, sizeof j->root_cause, "%s", cause);
		if (print && !j->cfg.quiet && j->cfg.restart_count >= j->cfg.max_restarts) {
			hpu__log(HPU_LOG_ERROR, "error: %s", cause);
			/* troubleshooting.md's first answer, where one looks */
			if (strstr(cause, "was killed by signal 9 ("))
				hpu__log(HPU_LOG_NOTICE, "note: signal 9 is most often the kernel's "
					 "out-of-memory killer (dmesg says so): fewer --devices, a "
					 "smaller --device-memory or offloading less; else a person or "
					 "a batch system ended it");
		} else if (print && !j->cfg.quiet)
			j->unsaid = 1;
	}
	j->failed = 1;
	if (j->agent)
		hpu__agent_stop(j->agent, grace_s);
	finish_if_ready(j);
}

static void fail(hpu_nodejob *j, const char *cause, double grace_s)
{
	fail_as(j, cause, grace_s, 1);
}

static void send_to_coord(hpu_nodejob *j, Hpu__Envelope *env)
{
	if (j->dealer && hpu__codec_send(j->dealer, NULL, env) != 0 && !j->cfg.quiet)
		hpu__log(HPU_LOG_ERROR, "cannot reach the coordinator: %s", zmq_strerror(errno));
}

/* Ends the job on every node for `reason`. */
static void abort_job(hpu_nodejob *j, const char *reason)
{
	if (j->coord) {
		hpu__coord_abort(j->coord, reason);
	} else {
		Hpu__Abort ab = HPU__ABORT__INIT;
		ab.reason = (char *)reason;
		Hpu__Envelope env = HPU__ENVELOPE__INIT;
		env.msg_case = HPU__ENVELOPE__MSG_ABORT;
		env.abort = &ab;
		send_to_coord(j, &env);
	}
}

void hpu__nodejob_cancel(hpu_nodejob *j, const char *reason, double grace_s)
{
	/* the other nodes' reasons reach the job as "node N: ..." (coord.c);
	 * node 0's own, where the coordinator is, said no node */
	char said[600];
	if (j->coord && j->cfg.nodes > 1) {
		snprintf(said, sizeof said, "node %d: %s", j->cfg.node_rank, reason);
		reason = said;
	}
	fail_as(j, reason, grace_s, 0); /* the caller says why */
	abort_job(j, reason);
	if (j->agent && grace_s <= 0)
		hpu__agent_stop(j->agent, 0);
}

/* Where rank r is, when it is one of this node's and has reported. */
static void rank_where(hpu_nodejob *j, int r, char *out, size_t outlen)
{
	hpu_status_rec st;
	double age;
	out[0] = 0;
	if (j->agent && hpu__agent_status(j->agent, r, &st, &age) == 0)
		hpu__describe_position(st.step, st.total, st.phase, out, outlen);
}

static void coord_where(int rank, char *out, size_t outlen, void *arg)
{
	rank_where(arg, rank, out, outlen);
}

/* The node that runs rank r (node_devices, else `devices` each), or -1. */
static int rank_node(const hpu_nodejob *j, int r)
{
	if (r < 0 || r >= j->world)
		return -1;
	if (!j->cfg.node_devices)
		return j->cfg.devices > 0 ? r / j->cfg.devices : -1;
	for (int n = 0; n < j->cfg.nodes; n++) {
		if (r < j->cfg.node_devices[n])
			return n;
		r -= j->cfg.node_devices[n];
	}
	return -1;
}

/* The cause when rank `reporter` failed because of rank `culprit`: node
 * 0 names it from the rank table, the others by its rank, its node (from
 * the layout) and position. A node other than 0 may be the one whose
 * report the submitter takes (node 0 cancelled before it heard). */
static void blame(hpu_nodejob *j, int culprit, hpu_blame how, int reporter, char *out,
		  size_t outlen)
{
	char where[128] = "", who[32] = "";
	if (j->coord) {
		hpu__coord_blame(j->coord, culprit, how, reporter, out, outlen);
		return;
	}
	if (how == HPU_BLAME_SILENT)
		rank_where(j, culprit, where, sizeof where);
	int node = rank_node(j, culprit);
	if (node >= 0)
		snprintf(who, sizeof who, " (node %d)", node);
	/* the reporter is one of this node's ranks */
	hpu__describe_blame(culprit, how, who, where, reporter,
			    node >= 0 && node != j->cfg.node_rank, out, outlen);
}

/* Rank `rank`'s latest status record into *st (st may be NULL; zeros
 * during setup where it sent none) and where it puts the rank into pos
 * ("in step 3 of 20"). */
static void rank_position(hpu_agent *a, int rank, hpu_status_rec *st, char *pos, size_t len)
{
	hpu_status_rec r = {0};
	double age;
	if (hpu__agent_status(a, rank, &r, &age) != 0)
		r = (hpu_status_rec){.phase = HPU_PHASE_SETUP};
	if (st)
		*st = r;
	hpu__describe_position(r.step, r.total, r.phase, pos, len);
}

static void on_worker_exit(hpu_agent *a, int rank, pid_t pid, int status, void *arg)
{
	hpu_nodejob *j = arg;
	if (j->cfg.on_exit)
		j->cfg.on_exit(j, rank, (int)pid, status, j->cfg.arg);
	if (status == 0 || j->failed)
		return;
	char how[400], cause[1200];
	hpu__describe_status(status, how, sizeof how);
	hpu_status_rec st;
	char pos[128];
	rank_position(a, rank, &st, pos, sizeof pos);
	size_t n = strlen(how);
	if (status == HPU_AGENT_LEFT_EARLY)
		snprintf(how + n, sizeof how - n, " (%s%s)", pos,
			 hpu__agent_said_hello(a, rank) ? ""
							: "; it never spoke to its agent: is the "
							  "worker program hpu-worker?");
	else if (hpu__agent_said_hello(a, rank)) /* where: a model's exit(3) or
						       * abort() said nothing of it
						       * (an --exec program has no steps) */
		snprintf(how + n, sizeof how - n, " %s", pos);
	/* a worker that failed because of another rank: that rank is the
	 * cause, not the one that exited first */
	hpu_blame bhow = HPU_BLAME_SILENT;
	int culprit = status != HPU_AGENT_LEFT_EARLY && WIFEXITED(status)
			      ? hpu__agent_culprit(a, rank, &bhow) : -1;
	/* its reason, said on this node just before, goes to the others with
	 * the exit (a worker that failed on its own, with a sentence) */
	const char *why = culprit < 0 && WIFEXITED(status) && status != HPU_AGENT_LEFT_EARLY
				  ? hpu__agent_why(a, rank)
				  : "";
	if (culprit >= 0)
		blame(j, culprit, bhow, rank, cause, sizeof cause);
	else /* the closing error ends with the reason, as the other nodes' does */
		snprintf(cause, sizeof cause, "rank %d (node %d, pid %d) %s%s%.400s", rank,
			 j->cfg.node_rank, (int)pid, how, *why ? ": " : "", why);
	fail(j, cause, j->cfg.grace_s);
	if (j->coord) {
		hpu__coord_abort(j->coord, cause);
		return;
	}
	Hpu__WorkerExit we;
	hpu__codec_worker_exit(&we, rank, j->cfg.node_rank, (int)pid, status);
	we.step = st.step; /* zeros and setup where it sent no record */
	we.total = st.total;
	we.phase = (uint32_t)st.phase;
	we.culprit = (uint32_t)(culprit + 1);
	we.culprit_how = (uint32_t)bhow;
	we.why = (char *)why;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_WORKER_EXIT;
	env.worker_exit = &we;
	send_to_coord(j, &env);
}

/* A worker stopped or frozen as a whole (its keepalive silent): the job
 * fails naming it, where it was, and, where a worker of this node had
 * finished, that it did (no collective of theirs could find it: the job
 * waited for it without end). */
static void on_worker_silent(hpu_agent *a, int rank, pid_t pid, double silent_s, int after_peer,
			     void *arg)
{
	hpu_nodejob *j = arg;
	if (j->failed)
		return;
	char pos[128], cause[600];
	rank_position(a, rank, NULL, pos + 1, sizeof pos - 1);
	pos[0] = ' ';
	if (!hpu__agent_said_hello(a, rank)) /* an --exec program: no steps */
		pos[0] = 0;
	snprintf(cause, sizeof cause,
		 "rank %d (node %d, pid %d) stopped answering%s: its process was silent for %.0f s, "
		 "past %s (stopped, or frozen as a whole)%s",
		 rank, j->cfg.node_rank, (int)pid, pos, silent_s,
		 after_peer ? "HPUCOLL_TIMEOUT_MS" : "twice HPUCOLL_TIMEOUT_MS",
		 after_peer ? ", after a rank of its node had finished" : "");
	fail(j, cause, j->cfg.grace_s);
	abort_job(j, cause);
}

static void on_agent_idle(hpu_agent *a, void *arg)
{
	(void)a;
	hpu_nodejob *j = arg;
	j->agent_idle = 1;
	if (!j->failed) {
		if (j->coord) {
			hpu__coord_node_done(j->coord, 0);
		} else {
			Hpu__AgentDone d = HPU__AGENT_DONE__INIT;
			d.node_rank = (uint32_t)j->cfg.node_rank;
			Hpu__Envelope env = HPU__ENVELOPE__INIT;
			env.msg_case = HPU__ENVELOPE__MSG_AGENT_DONE;
			env.agent_done = &d;
			send_to_coord(j, &env);
		}
	}
	finish_if_ready(j);
}

static void on_line(hpu_agent *a, int rank, int is_err, const char *line,
		    size_t len, void *arg)
{
	(void)a;
	hpu_nodejob *j = arg;
	j->cfg.on_line(j, rank, is_err, line, len, j->cfg.arg);
}

static void on_status(hpu_agent *a, int rank, const hpu_status_rec *st, void *arg)
{
	(void)a;
	hpu_nodejob *j = arg;
	j->cfg.on_status(j, rank, st, j->cfg.arg);
}

static void on_coord_abort(hpu_coord *c, const char *reason, void *arg)
{
	(void)c;
	fail(arg, reason, ((hpu_nodejob *)arg)->cfg.grace_s);
}

static void on_coord_done(hpu_coord *c, void *arg)
{
	(void)c;
	hpu_nodejob *j = arg;
	j->job_done = 1;
	finish_if_ready(j);
}

/* --- other nodes: the link to the coordinator --- */

static void send_hello(hpu_nodejob *j)
{
	Hpu__AgentHello h = HPU__AGENT_HELLO__INIT;
	h.job_id = (char *)j->cfg.job_id;
	h.token = (char *)j->cfg.token;
	h.node_rank = (uint32_t)j->cfg.node_rank;
	h.nodes = (uint32_t)j->cfg.nodes;
	h.devices = (uint32_t)j->cfg.devices;
	h.restart_count = (uint32_t)j->cfg.restart_count;
	h.world_size = (uint32_t)j->world;
	h.max_restarts_1 = (uint32_t)j->cfg.max_restarts + 1;
	h.transport = (char *)(j->cfg.transport && *j->cfg.transport ? j->cfg.transport : "auto");
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_AGENT_HELLO;
	env.agent_hello = &h;
	send_to_coord(j, &env);
}

/* A restart's coordinator has answered: the workers may start now. */
static void start_gated_workers(hpu_nodejob *j)
{
	char err[600], cause[700];
	j->gated = 0;
	j->agent_idle = 0;
	if (hpu__agent_start(j->agent, err, sizeof err) == 0)
		return;
	hpu__agent_destroy(&j->agent); /* reaps what started */
	j->agent_idle = 1;
	snprintf(cause, sizeof cause, "node %d could not start its workers: %s",
		 j->cfg.node_rank, err);
	fail(j, cause, 0);
	abort_job(j, cause);
}

static void on_coord_msg(hpu_zwatch *w, void *arg)
{
	hpu_nodejob *j = arg;
	Hpu__Envelope *m = hpu__codec_recv(w->sock, NULL, ZMQ_DONTWAIT);
	if (!m)
		return;
	j->coord_seen = hpu__mono_s();
	if (m->msg_case == HPU__ENVELOPE__MSG_ABORT) {
		char cause[700];
		const char *r = m->abort->reason ? m->abort->reason : "";
		if (!strncmp(r, HPU_COORD_REFUSED, strlen(HPU_COORD_REFUSED))) {
			/* not to be restarted: it would be refused again, or
			 * find node 0's job ended (it restarted and waited
			 * --join-timeout for a coordinator that had gone) */
			j->refused = 1;
			snprintf(cause, sizeof cause, "node 0's coordinator %s", r);
		} else {
			/* a user's Ctrl-C on another node: the job stops
			 * (that node restarts nothing, nor does this one) */
			j->interrupted = hpu__coord_reason_interrupted(r);
			snprintf(cause, sizeof cause, "job aborted by the coordinator: %s", r);
		}
		fail(j, cause, j->cfg.grace_s);
	} else if (m->msg_case == HPU__ENVELOPE__MSG_JOB_DONE) {
		j->job_done = 1;
		finish_if_ready(j);
	} else if (j->gated && !j->failed) {
		start_gated_workers(j);
	}
	hpu__codec_free(m);
}

static void on_beat(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)revents;
	hpu_nodejob *j = t->data;
	/* Until the coordinator first answers, it may still be starting. */
	int heard = j->coord_seen > j->started;
	double limit = heard ? j->cfg.agent_timeout_s : j->cfg.join_timeout_s;
	ev_tstamp since = heard ? j->coord_seen : j->started;
	/* the timer runs every second: a longer gap is this process not
	 * running (stopped, or starved), not the coordinator's silence */
	double now = hpu__mono_s();
	double gap = j->last_beat > 0 ? now - j->last_beat : 0;
	j->last_beat = now;
	if (now - since > limit) {
		char cause[500], self[160] = "";
		if (gap > 3)
			snprintf(self, sizeof self, "; this hpulaunch itself did not run for %.0f s "
				 "(stopped, or starved of CPU?)", gap);
		if (heard)
			snprintf(cause, sizeof cause, "lost contact with the coordinator at %s:%d (node 0, "
				 "silent for %g s)%s", j->cfg.master_addr, j->master_port, limit, self);
		else
			snprintf(cause, sizeof cause, "the coordinator at %s:%d (node 0) did not answer "
				 "within %g s (--join-timeout): is node 0's hpulaunch running, at that "
				 "address and port?%s", j->cfg.master_addr, j->master_port, limit, self);
		ev_timer_stop(loop, &j->beat);
		j->coord_silent = 1;
		fail(j, cause, j->cfg.grace_s);
		return;
	}
	if (j->gated && !heard)
		send_hello(j); /* it may have gone to an earlier attempt's */
	Hpu__Heartbeat hb = HPU__HEARTBEAT__INIT;
	hb.node_rank = (uint32_t)j->cfg.node_rank;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_HEARTBEAT;
	env.heartbeat = &hb;
	send_to_coord(j, &env);
}

static int resolve(const char *host, char *out, size_t outlen)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	if (getaddrinfo(host, NULL, &hints, &ai) != 0)
		return -1;
	const char *r = inet_ntop(AF_INET, &((struct sockaddr_in *)ai->ai_addr)->sin_addr,
				  out, (socklen_t)outlen);
	freeaddrinfo(ai);
	return r ? 0 : -1;
}

static int connect_coord(hpu_nodejob *j, char *err, size_t errlen)
{
	char ep[128];
	snprintf(ep, sizeof ep, "tcp://%s:%d", j->master_ip, j->master_port);
	int linger = 2000;
	int64_t maxmsg = HPU_CODEC_MAX_MSG;
	j->ctx = zmq_ctx_new();
	j->dealer = j->ctx ? zmq_socket(j->ctx, ZMQ_DEALER) : NULL;
	if (!j->dealer || zmq_setsockopt(j->dealer, ZMQ_LINGER, &linger, sizeof linger) ||
	    zmq_setsockopt(j->dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
	    zmq_connect(j->dealer, ep) ||
	    hpu__zwatch_start(&j->zw, j->loop, j->dealer, on_coord_msg, j)) {
		snprintf(err, errlen, "cannot connect to the coordinator at %s: %s", ep,
			 zmq_strerror(errno));
		return -1;
	}
	send_hello(j);
	j->started = hpu__mono_s();
	ev_timer_init(&j->beat, on_beat, 1.0, 1.0);
	j->beat.data = j;
	ev_timer_start(j->loop, &j->beat);
	return 0;
}

static int start_coord(hpu_nodejob *j, char *err, size_t errlen)
{
	hpu_coord_cfg cc = {
		.bind_addr = j->master_ip,
		.port = j->master_port,
		.job_id = j->cfg.job_id,
		.token = j->cfg.token,
		.restart_count = j->cfg.restart_count,
		.max_restarts = j->cfg.max_restarts,
		.transport = j->cfg.transport,
		.nodes = j->cfg.nodes,
		.devices = j->cfg.devices,
		.node_devices = j->cfg.node_devices,
		.join_timeout_s = j->cfg.join_timeout_s,
		.agent_timeout_s = j->cfg.agent_timeout_s,
		.on_abort = on_coord_abort,
		.on_done = on_coord_done,
		.where = coord_where,
		.arg = j,
	};
	j->coord = hpu__coord_new(j->loop, &cc, err, errlen);
	if (!j->coord)
		return -1;
	j->master_port = hpu__coord_port(j->coord);
	return 0;
}

hpu_nodejob *hpu__nodejob_start(struct ev_loop *loop, const hpu_nodejob_cfg *cfg,
				char *err, size_t errlen)
{
	hpu_nodejob *j = calloc(1, sizeof *j);
	if (!j) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	j->loop = loop;
	j->cfg = *cfg;
	j->master_port = cfg->master_port;
	j->rank_base = cfg->node_rank * cfg->devices;
	j->world = cfg->nodes * cfg->devices;
	if (cfg->node_devices) {
		j->rank_base = j->world = 0;
		for (int n = 0; n < cfg->nodes; n++) {
			if (n < cfg->node_rank)
				j->rank_base += cfg->node_devices[n];
			j->world += cfg->node_devices[n];
		}
	}
	hpu__attempt_token(cfg->token, cfg->restart_count, j->token, sizeof j->token);
	/* A node other than 0 starts its workers once the coordinator has
	 * taken this agent: a restart's might otherwise reach the previous
	 * attempt's coordinator, still shutting down; and of two hpulaunch
	 * started for one node before node 0 was up, the refused one's worker
	 * took the rank's place first and the job failed, blaming a worker's
	 * exit or a dead node 0. */
	j->gated = cfg->node_rank != 0;
	j->agent_idle = j->gated;
	ev_idle_init(&j->end, on_end_idle);
	j->end.data = j;
	ev_init(&j->beat, on_beat);
	if (resolve(cfg->master_addr, j->master_ip, sizeof j->master_ip) < 0) {
		snprintf(err, errlen, "cannot resolve the master address %s", cfg->master_addr);
		goto fail;
	}
	if (cfg->node_rank == 0 ? start_coord(j, err, errlen) : connect_coord(j, err, errlen))
		goto fail;
	hpu_agent_cfg ac = {
		.node_rank = cfg->node_rank,
		.nodes = cfg->nodes,
		.devices = cfg->devices,
		.rank_base = j->rank_base,
		.world = j->world,
		.master_addr = cfg->master_addr,
		.master_port = j->master_port,
		.job_id = cfg->job_id,
		.token = j->token,
		.argv = cfg->argv,
		.search_path = cfg->search_path,
		.hpu_workers = cfg->hpu_workers,
		.log_dir = cfg->log_dir,
		.transport = cfg->transport,
		.restart_count = cfg->restart_count,
		.max_restarts = cfg->max_restarts,
		.env = cfg->env,
		.device_ids = cfg->device_ids,
		.set_user = cfg->set_user,
		.uid = cfg->uid,
		.gid = cfg->gid,
		.job_uid_first = cfg->job_uid_first,
		.job_uid_last = cfg->job_uid_last,
		.on_exit = on_worker_exit,
		.on_silent = on_worker_silent,
		.on_idle = on_agent_idle,
		.on_line = cfg->on_line ? on_line : NULL,
		.on_status = cfg->on_status ? on_status : NULL,
		.arg = j,
	};
	if (!(j->agent = hpu__agent_new(loop, &ac))) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if (!j->gated && hpu__agent_start(j->agent, err, errlen) < 0)
		goto fail;
	return j;
fail:
	hpu__nodejob_destroy(&j);
	return NULL;
}

int hpu__nodejob_master_port(const hpu_nodejob *j)
{
	return j->master_port;
}

void hpu__nodejob_hold_output(hpu_nodejob *j, int hold)
{
	if (j->agent)
		hpu__agent_hold_output(j->agent, hold);
}

int hpu__nodejob_live(const hpu_nodejob *j)
{
	return j->agent ? hpu__agent_live(j->agent) : 0;
}

const char *hpu__nodejob_why(const hpu_nodejob *j, int rank)
{
	return j->agent ? hpu__agent_why(j->agent, rank) : "";
}

int hpu__nodejob_status(const hpu_nodejob *j, int rank, hpu_status_rec *st, double *age_s)
{
	return j->agent ? hpu__agent_status(j->agent, rank, st, age_s) : -1;
}

long hpu__nodejob_status_bad(const hpu_nodejob *j)
{
	return j->agent ? hpu__agent_status_bad(j->agent) : 0;
}

int hpu__nodejob_rank(const hpu_nodejob *j, int local)
{
	return j->rank_base + local;
}

int hpu__nodejob_world(const hpu_nodejob *j)
{
	return j->world;
}

int hpu__nodejob_cause_unsaid(const hpu_nodejob *j)
{
	return j->failed && j->unsaid;
}

int hpu__nodejob_set_up_apart(const hpu_nodejob *j)
{
	return j->refused || (j->coord && hpu__coord_set_up_apart(j->coord));
}

int hpu__nodejob_interrupted_elsewhere(const hpu_nodejob *j)
{
	return j->interrupted || (j->coord && hpu__coord_interrupted(j->coord));
}

void hpu__nodejob_destroy(hpu_nodejob **pj)
{
	hpu_nodejob *j = *pj;
	if (!j)
		return;
	ev_idle_stop(j->loop, &j->end);
	ev_timer_stop(j->loop, &j->beat);
	hpu__agent_destroy(&j->agent);
	hpu__zwatch_stop(&j->zw);
	hpu__coord_destroy(&j->coord);
	/* what is queued for a coordinator that does not answer would hold
	 * the context's end for the linger's 2 s (it ended 2 s after saying
	 * --join-timeout's error) */
	int none = 0;
	if (j->dealer && j->coord_silent)
		zmq_setsockopt(j->dealer, ZMQ_LINGER, &none, sizeof none);
	if (j->dealer)
		zmq_close(j->dealer);
	if (j->ctx)
		hpu__zmq_ctx_term(j->ctx);
	free(j);
	*pj = NULL;
}
