/* hpud: the node daemon. It takes signed requests on a ZeroMQ ROUTER
 * socket (proto/auth.h) and runs each job's part on this node with the
 * same node-job code as hpulaunch (agent/nodejob.h), streaming the
 * workers' output back to the submitter and telling it when the part
 * ends. See --help and deploy/README.md.
 *
 * Reads top to bottom: logging, the job table and devices, replies, the
 * requests (hello, launch, status, cancel, ping; each bound to this
 * instance of hpud, see proto/hpu.proto), the socket, the timers and
 * signals, start-up.
 *
 * Under systemd (deploy/hpud.service, Type=notify) hpud says READY=1
 * through sd_notify once its socket listens, RELOADING=1 and READY=1
 * around a SIGHUP, STOPPING=1 when it starts to stop, and its state in
 * STATUS=; outside systemd (no NOTIFY_SOCKET) those calls do nothing. Its
 * log lines carry journald's priority prefixes ("<3>" ...) when stderr is
 * the journal (JOURNAL_STREAM names it), and not on a terminal or a
 * file. */
#include <arpa/inet.h>
#include <errno.h>
#include <ev.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/auth.h"
#include "proto/codec.h"
#include "daemon/conf.h"
#include "common/num.h"
#include "common/env.h"
#include "daemon/job.h"
#include "daemon/joboutput.h"
#include "common/log.h"
#include "agent/nodejob.h"
#include "common/opt.h"
#include "common/optdoc.h"
#include "daemon/outq.h"
#include "daemon/quarantine.h"
#include "agent/restart.h"
#include "daemon/trust.h"
#include "agent/uidproc.h"
#include "agent/zwatch.h"

#define MAX_JOBS 64
#define MAX_DEVICES HPUD_MAX_DEVICES
#define MAX_ARGS 256
#define MAX_ARG_BYTES 4096
#define MAX_STATUS_RANKS 64      /* per job in a status reply (as device ids) */
#define MAX_REPLY_RANKS 768      /* in all: ~70 bytes each, the reply < 64 KiB */
#define PROGRESS_EVERY_S 0.2     /* rank 0's records to the submitter: 5/s */
#define PEER_QUEUE_MSGS 64       /* ZeroMQ's queue to one peer (SNDHWM); the
				  * rest of a job's messages wait in its outq */
#define OUTPUT_STALL_S 5.0       /* a job's output waits past output_buffer
				  * (its workers' output held) and the
				  * submitter takes none of it for this long:
				  * stalled, its output is dropped and counted */

typedef hpud_job job; /* job.h */

static struct {
	struct ev_loop *loop;
	const char *conf_path;
	hpud_conf conf;
	hpu_auth *auth;
	void *ctx, *sock;
	hpu_zwatch zw;
	ev_timer tick;
	ev_signal sigterm, sigint, sighup;
	ev_prepare reap;
	hpud_jobout out;           /* the jobs' messages to their submitters */
	job jobs[MAX_JOBS];
	char busy[MAX_DEVICES];    /* device -> in use */
	char worker[PATH_MAX];
	int set_user;
	uid_t uid;
	gid_t gid;
	int stopping;
	/* refusals are logged at most 20 per second */
	ev_tstamp refuse_window;
	int refused_logged, refused_dropped;
	/* drawn at start: every request must name it (proto/hpu.proto) */
	char instance[HPU_AUTH_ID_HEX + 1];
	uint64_t seq;              /* of the last frame signed */
	int log_level_fixed;       /* --log-level set it: not log_level */
	/* job_uids that no job holds but processes still run under: given to
	 * no job until none is left */
	hpud_quarantine quarantine;
} D;

/* ---- logging (stderr: journald takes it from there) ---- */

/* hpud's levels as the log's (common/log.h). */
static hpu_log_level log_level_of(hpud_log_level lvl)
{
	static const hpu_log_level of[] = {[HPUD_LOG_ERROR] = HPU_LOG_ERROR,
					   [HPUD_LOG_WARN] = HPU_LOG_WARNING,
					   [HPUD_LOG_INFO] = HPU_LOG_INFO,
					   [HPUD_LOG_DEBUG] = HPU_LOG_DEBUG};
	return of[lvl];
}

/* The configuration's log_level, unless HPU_LOG_LEVEL or --log-level
 * set the level. */
static void apply_log_level(void)
{
	if (!D.log_level_fixed && !hpu__log_level_from_env())
		hpu__log_set_level(log_level_of(D.conf.log_level));
}

static void logmsg(hpud_log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* "hpud: LEVEL: text" through the log (common/log.h), which puts the
 * syslog priority in front for journald when stderr is the journal
 * stream; journald takes it off and keeps it as the line's priority
 * (journalctl -p). The agent's and the coordinator's lines in hpud go
 * the same way, as "hpud: text". */
static void logmsg(hpud_log_level lvl, const char *fmt, ...)
{
	if (!hpu__log_enabled(log_level_of(lvl)))
		return;
	char line[1200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	hpu__log(log_level_of(lvl), "%s: %s", hpud__log_level_name(lvl), line);
}

/* Tells systemd `state` ("READY=1", ...) with a STATUS= line of what
 * hpud does now; nothing without NOTIFY_SOCKET. */
static void notify(const char *state)
{
	int jobs = 0, busy = 0;
	for (int i = 0; i < MAX_JOBS; i++)
		jobs += D.jobs[i].used && D.jobs[i].nj && !D.jobs[i].ended;
	for (int i = 0; i < D.conf.devices && i < MAX_DEVICES; i++)
		busy += D.busy[i];
	int r = D.stopping ? sd_notifyf(0, "%s%sSTATUS=stopping: %d job%s to end", state,
					*state ? "\n" : "", jobs, jobs == 1 ? "" : "s")
			   : sd_notifyf(0, "%s%sSTATUS=listening on tcp://%s:%d: %d job%s, %d of %d device%s free",
					state, *state ? "\n" : "", D.conf.listen, D.conf.port, jobs,
					jobs == 1 ? "" : "s", D.conf.devices - busy, D.conf.devices,
					hpu__plural(D.conf.devices));
	static int warned;
	if (r < 0 && !warned++)
		logmsg(HPUD_LOG_WARN, "cannot notify systemd through NOTIFY_SOCKET: %s", strerror(-r));
}

static void log_refusal(const char *peer, const char *why)
{
	ev_tstamp now = ev_now(D.loop);
	if (now - D.refuse_window >= 1.0) {
		if (D.refused_dropped)
			logmsg(HPUD_LOG_WARN, "%d more requests refused in the last second (not logged)",
			       D.refused_dropped);
		D.refuse_window = now;
		D.refused_logged = D.refused_dropped = 0;
	}
	if (D.refused_logged++ < 20)
		logmsg(HPUD_LOG_WARN, "refused a request from %s: %s", peer, why);
	else
		D.refused_dropped++;
}

/* ---- devices and the job table ---- */

static int free_devices(void)
{
	int n = 0;
	for (int i = 0; i < D.conf.devices; i++)
		n += !D.busy[i];
	return n;
}

static job *find_job(const char *id)
{
	for (int i = 0; i < MAX_JOBS; i++)
		if (D.jobs[i].used && strcmp(D.jobs[i].id, id) == 0)
			return &D.jobs[i];
	return NULL;
}

static void free_argv(char **argv)
{
	for (int i = 0; argv && argv[i]; i++)
		free(argv[i]);
	free(argv);
}

/* ---- job_uids: no uid is given out while a process runs under it ---- */

/* Whether jobs run as uids of their own (job_uids). */
static int own_uids(void)
{
	return D.set_user && D.conf.job_uid_first;
}

/* After j's workers and what they left were ended (hpu__nodejob_destroy):
 * a process that still runs under its uid keeps the uid out of the
 * pool. */
static void check_job_uid(const job *j)
{
	if (own_uids()) {
		char whose[128];
		snprintf(whose, sizeof whose, "left by job %s, which has ended", j->id);
		hpud__quarantine_if_used(&D.quarantine, j->uid, whose);
	}
}

/* Ends what j holds of the node: its workers' remains and its devices.
 * Its messages may still wait for the submitter (retired: ended, no nj). */
static void retire_job(job *j)
{
	ev_timer_stop(D.loop, &j->progress_timer);
	if (j->nj) {
		hpu__nodejob_destroy(&j->nj);
		check_job_uid(j);
	}
	for (int i = 0; i < j->devices; i++)
		if (j->dev[i] >= 0 && j->dev[i] < MAX_DEVICES)
			D.busy[j->dev[i]] = 0;
	j->devices = 0;
}

static void release_job(job *j)
{
	retire_job(j);
	hpud__outq_free(&j->out);
	free_argv(j->argv);
	free_argv(j->env);
	free(j->node_devices);
	memset(j, 0, sizeof *j);
}

/* ---- replies ---- */

/* env for the submitter's `session`, packed with this instance but no
 * sequence number yet (send_body adds it) into *body (malloc'd; NULL
 * without memory); returns its length. */
static size_t pack_env(const char *session, Hpu__Envelope *env, uint8_t **body)
{
	env->instance = D.instance;
	env->session = (char *)session;
	env->seq = 0;
	return hpu__codec_pack(env, body);
}

/* Signs a packed envelope (pack_env) with the next sequence number (the
 * submitter refuses a replay by it) and hands it to ZeroMQ for peer.
 * Frames to one submitter must leave in the order they were signed: it
 * drops one whose seq is not above the last it took. So the number is
 * drawn here, as the frame leaves, never while it waits in a job's queue;
 * gaps (frames dropped here) are fine. seq, the envelope's last field, is
 * packed on its own and appended: protobuf reads the concatenation as one
 * message with all the fields.
 * Returns 0 when sent; 1 when ZeroMQ's queue to the peer is full (nothing
 * was sent: try again later); -1 when the frame was dropped (the peer is
 * gone, memory is short). */
static int send_body(const hpu_codec_peer *peer, const uint8_t *body, size_t blen)
{
	/* A submitter that is gone or slow must not block the daemon: with
	 * ZMQ_ROUTER_MANDATORY a full queue refuses the routing id. */
	if (zmq_send(D.sock, peer->id, peer->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
		if (errno == EAGAIN)
			return 1;
		logmsg(HPUD_LOG_DEBUG, "a reply was dropped: %s", zmq_strerror(errno));
		return -1;
	}
	Hpu__Envelope s = HPU__ENVELOPE__INIT;
	s.seq = ++D.seq;
	uint8_t *tail = NULL, *whole = NULL, *frame = NULL;
	size_t tlen = hpu__codec_pack(&s, &tail), flen = 0;
	if (tail && (whole = malloc(blen + tlen))) {
		memcpy(whole, body, blen);
		memcpy(whole + blen, tail, tlen);
		flen = hpu__auth_sign(D.auth, whole, blen + tlen, hpu__auth_now_ms(), &frame);
	}
	free(tail);
	free(whole);
	if (!frame) {
		logmsg(HPUD_LOG_ERROR, "cannot sign a reply (out of memory?)");
		zmq_send(D.sock, "", 0, ZMQ_DONTWAIT); /* ends what the routing id began */
		return -1;
	}
	int rc = zmq_send(D.sock, frame, flen, ZMQ_DONTWAIT) < 0 ? -1 : 0;
	if (rc < 0)
		logmsg(HPUD_LOG_DEBUG, "a reply was dropped: %s", zmq_strerror(errno));
	free(frame);
	return rc;
}

/* Packs env for the submitter's `session` and sends it at once: a reply,
 * dropped if ZeroMQ's queue to the peer is full. */
static void send_env(const hpu_codec_peer *peer, const char *session, Hpu__Envelope *env)
{
	uint8_t *body = NULL;
	size_t blen = pack_env(session, env, &body);
	if (!body) {
		logmsg(HPUD_LOG_ERROR, "cannot pack a reply (out of memory?)");
		return;
	}
	if (send_body(peer, body, blen) == 1)
		logmsg(HPUD_LOG_DEBUG, "a reply was dropped: the queue to its peer is full");
	free(body);
}

static void reply_launch(const hpu_codec_peer *peer, const char *session, const char *job_id,
			 const job *j, const char *error)
{
	Hpu__LaunchReply r = HPU__LAUNCH_REPLY__INIT;
	uint32_t ids[MAX_DEVICES];
	r.job_id = (char *)job_id;
	r.ok = error == NULL;
	r.error = (char *)(error ? error : "");
	if (j) {
		for (int i = 0; i < j->devices; i++)
			ids[i] = (uint32_t)j->dev[i];
		r.n_device_ids = (size_t)j->devices;
		r.device_ids = ids;
		r.master_port = (uint32_t)hpu__nodejob_master_port(j->nj);
	}
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_LAUNCH_REPLY;
	env.launch_reply = &r;
	send_env(peer, session, &env);
}

/* ---- a job's life ---- */

static void on_line(hpu_nodejob *nj, int rank, int is_err, const char *line,
		    size_t len, void *arg)
{
	(void)nj;
	(void)is_err;
	hpud__jobout_line(&D.out, arg, rank, line, len);
}

/* Sends rank 0's latest record to the submitter. */
static void send_progress(job *j)
{
	hpu_status_rec st;
	double age;
	j->progress_pending = 0;
	if (!j->nj || hpu__nodejob_status(j->nj, 0, &st, &age) < 0)
		return;
	Hpu__RankStatus rs;
	hpu__status_to_proto(&rs, 0, &st, age);
	Hpu__Progress p = HPU__PROGRESS__INIT;
	p.job_id = j->id;
	p.status = &rs;
	p.eta_s = st.eta_s;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_PROGRESS;
	env.progress = &p;
	hpud__jobout_send(&D.out, j, &env, HPUD_JOB_PROGRESS, 0);
	j->progress_at = ev_now(D.loop);
	j->progress_phase = st.phase;
}

static void on_progress_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	job *j = t->data;
	if (j->progress_pending)
		send_progress(j);
}

/* Rank 0's records go on to the submitter at most 5 a second: a record
 * that starts a phase (eval, the end) at once, one that comes too soon
 * when its turn comes (the latest then). */
static void on_status(hpu_nodejob *nj, int rank, const hpu_status_rec *st, void *arg)
{
	(void)nj;
	job *j = arg;
	if (rank != 0)
		return;
	j->progress_pending = 1;
	double since = ev_now(D.loop) - j->progress_at;
	if (since >= PROGRESS_EVERY_S || st->phase != j->progress_phase) {
		ev_timer_stop(D.loop, &j->progress_timer);
		send_progress(j);
	} else if (!ev_is_active(&j->progress_timer)) {
		ev_timer_set(&j->progress_timer, PROGRESS_EVERY_S - since, 0);
		ev_timer_start(D.loop, &j->progress_timer);
	}
}

static void on_exit_worker(hpu_nodejob *nj, int rank, int pid, int status, void *arg)
{
	job *j = arg;
	Hpu__WorkerExit we;
	hpu__codec_worker_exit(&we, rank, j->node_rank, pid, status);
	hpu_status_rec st;
	double age;
	we.phase = HPU_PHASE_SETUP; /* no record yet */
	if (hpu__nodejob_status(nj, rank, &st, &age) == 0) {
		we.step = st.step;
		we.total = st.total;
		we.phase = (uint32_t)st.phase;
	}
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_WORKER_EXIT;
	env.worker_exit = &we;
	hpud__jobout_send(&D.out, j, &env, HPUD_JOB_CONTROL, 0);
}

static void on_end(hpu_nodejob *nj, int failed, const char *cause, void *arg)
{
	job *j = arg;
	logmsg(failed ? HPUD_LOG_WARN : HPUD_LOG_INFO, "job %s node %d ended%s%s", j->id,
	       j->node_rank, failed ? ": " : " successfully", failed ? cause : "");
	long bad = hpu__nodejob_status_bad(nj);
	if (bad)
		logmsg(HPUD_LOG_WARN, "job %s: %ld malformed status lines from the workers were ignored",
		       j->id, bad);
	Hpu__JobEnd e = HPU__JOB_END__INIT;
	e.job_id = j->id;
	e.node_rank = (uint32_t)j->node_rank;
	e.ok = !failed;
	e.reason = (char *)cause;
	ev_timer_stop(D.loop, &j->progress_timer); /* nothing after the end */
	j->progress_pending = 0;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_JOB_END;
	env.job_end = &e;
	hpud__jobout_ending(&D.out, j); /* its drop notices, before the end */
	hpud__jobout_send(&D.out, j, &env, HPUD_JOB_CONTROL, 0);
	j->ended = 1; /* freed by on_reap, outside the job's own callbacks */
	ev_prepare_start(D.loop, &D.reap);
	if (!D.stopping)
		notify("");
}

/* Ended jobs are released once their last message has left (or their
 * submitter is gone, or hpud stops); until then they are retired, holding
 * no devices. */
static void on_reap(struct ev_loop *loop, ev_prepare *w, int revents)
{
	(void)revents;
	ev_prepare_stop(loop, w);
	for (int i = 0; i < MAX_JOBS; i++) {
		job *j = &D.jobs[i];
		if (!j->used || !j->ended)
			continue;
		if (!hpud__outq_peek(&j->out) || j->peer_gone || D.stopping)
			release_job(j);
		else
			retire_job(j);
	}
	if (D.stopping) {
		int left = 0;
		for (int i = 0; i < MAX_JOBS; i++)
			left += D.jobs[i].used;
		if (!left)
			ev_break(loop, EVBREAK_ALL);
	}
}

/* ---- requests ---- */

static int valid_id(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 63)
		return 0;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		      (*s >= '0' && *s <= '9') || *s == '-' || *s == '_' || *s == '.'))
			return 0;
	return 1;
}

/* Checks a launch request field by field; NULL if fine, else why not. */
static const char *check_launch(const Hpu__LaunchRequest *q, char *why, size_t len)
{
	if (!q->job_id || !valid_id(q->job_id))
		return "job_id must be 1-63 letters, digits, '-', '_' or '.'";
	if (!q->job_token || !*q->job_token || strlen(q->job_token) > 128)
		return "job_token must be 1-128 bytes";
	if (q->nodes < 1 || q->nodes > 4096 || q->node_rank >= q->nodes)
		return "node_rank must be below nodes, and nodes in 1..4096";
	if (q->devices < 1 || q->devices > (uint32_t)D.conf.devices) {
		snprintf(why, len, "devices %u: this node has %d", q->devices, D.conf.devices);
		return why;
	}
	if (q->n_node_devices && q->n_node_devices != q->nodes)
		return "node_devices must have one entry a node (nodes), or none";
	uint64_t world = 0;
	for (size_t i = 0; i < q->n_node_devices; i++) {
		if (q->node_devices[i] < 1 || q->node_devices[i] > MAX_DEVICES)
			return "node_devices must be 1..1024 workers a node";
		world += q->node_devices[i];
	}
	if (q->n_node_devices && q->node_devices[q->node_rank] != q->devices)
		return "node_devices must give this node (node_rank) its devices";
	if (world > (uint64_t)1 << 22)
		return "node_devices add up to too many ranks";
	if (!q->master_addr || !*q->master_addr || strlen(q->master_addr) > 255)
		return "master_addr must be 1-255 bytes";
	if (q->master_port > 65535 || (q->master_port == 0 && q->node_rank != 0))
		return "master_port must be 1..65535 (0 only on node 0: pick one)";
	if (q->max_restarts > HPU_MAX_RESTARTS_LIMIT || q->restart_count > q->max_restarts)
		return "restart_count must not exceed max_restarts, nor max_restarts 1000";
	if (q->transport && *q->transport && strcmp(q->transport, "auto") &&
	    strcmp(q->transport, "tcp") && strcmp(q->transport, "ipc") &&
	    strcmp(q->transport, "shm"))
		return "transport must be auto, tcp, ipc or shm";
	for (size_t i = 0; i < q->n_env; i++) {
		const char *e = q->env[i];
		size_t n = e ? strcspn(e, "=") : 0;
		int id = e && e[n] == '=' ? hpu__env_find(e) : -1;
		int known = id >= 0 && hpu__env_in(id, hpu__job_env);
		if (!known || strlen(e) > MAX_ARG_BYTES)
			return "env may only set the autocast lists (LOWER_LIST, FP32_LIST, "
			       "PT_HPU_AUTOCAST_*_OPS_LIST), QUANT_CONFIG, HPUCOLL_SECURITY, "
			       "OMP_NUM_THREADS and OPENBLAS_NUM_THREADS";
	}
	if (q->n_argv < 1 || q->n_argv > MAX_ARGS)
		return "argv must hold 1-256 arguments (the model at least)";
	for (size_t i = 0; i < q->n_argv; i++)
		if (!q->argv[i] || strlen(q->argv[i]) > MAX_ARG_BYTES)
			return "an argument is longer than 4096 bytes";
	return NULL;
}

/* The request's env entries, NULL-terminated (maybe empty). */
static char **job_env(const Hpu__LaunchRequest *q)
{
	char **env = calloc(q->n_env + 1, sizeof *env);
	for (size_t i = 0; env && i < q->n_env; i++)
		if (!(env[i] = strdup(q->env[i]))) {
			free_argv(env);
			return NULL;
		}
	return env;
}

static char **worker_argv(const Hpu__LaunchRequest *q)
{
	char **argv = calloc(q->n_argv + 2, sizeof *argv);
	if (!argv)
		return NULL;
	argv[0] = strdup(D.worker);
	for (size_t i = 0; i < q->n_argv; i++)
		argv[i + 1] = strdup(q->argv[i]);
	for (size_t i = 0; i < q->n_argv + 1; i++)
		if (!argv[i]) {
			free_argv(argv);
			return NULL;
		}
	return argv;
}

/* Picks free devices for j; returns 0, or -1 with the reason in why. */
static int book_devices(job *j, char *why, size_t len)
{
	int n = free_devices();
	if (n < j->devices) {
		int k = snprintf(why, len, "busy: this node has %d device%s, %d free, the job asks for %d",
				 D.conf.devices, hpu__plural(D.conf.devices), n, j->devices);
		for (int i = 0; i < MAX_JOBS && k > 0 && (size_t)k < len; i++)
			if (D.jobs[i].used && D.jobs[i].nj)
				k += snprintf(why + k, len - (size_t)k, "; job %s holds %d",
					      D.jobs[i].id, D.jobs[i].devices);
		return -1;
	}
	for (int i = 0, k = 0; i < D.conf.devices && k < j->devices; i++)
		if (!D.busy[i]) {
			D.busy[i] = 1;
			j->dev[k++] = i;
		}
	return 0;
}

/* The uid of j's workers: with job_uids, the lowest one that no other
 * job holds and no process runs under (one that does is quarantined);
 * 0, or -1 when there is none. */
static int pick_uid(job *j)
{
	if (!D.conf.job_uid_first) {
		j->uid = D.uid;
		return 0;
	}
	for (unsigned u = D.conf.job_uid_first; u <= D.conf.job_uid_last; u++) {
		int taken = hpud__quarantine_has(&D.quarantine, u);
		for (int i = 0; i < MAX_JOBS && !taken; i++)
			taken = D.jobs + i != j && D.jobs[i].used && D.jobs[i].uid == u;
		int n = taken || !own_uids()
				? 0
				: hpud__quarantine_if_used(&D.quarantine, u, "which no running job holds");
		if (!taken && !n) {
			j->uid = u;
			return 0;
		}
	}
	return -1;
}

static void do_launch(const hpu_codec_peer *peer, const char *addr, const char *session,
		      const Hpu__LaunchRequest *q)
{
	char why[600], err[1024];
	const char *bad = check_launch(q, why, sizeof why);
	const char *id = q->job_id && valid_id(q->job_id) ? q->job_id : "";
	if (!bad && D.stopping)
		bad = "hpud is shutting down";
	if (!bad && find_job(q->job_id))
		bad = "a job with this id already runs on this node";
	job *j = NULL;
	for (int i = 0; !bad && i < MAX_JOBS && !j; i++)
		if (!D.jobs[i].used)
			j = &D.jobs[i];
	if (!bad && !j)
		bad = "too many jobs on this node";
	if (bad) {
		logmsg(HPUD_LOG_WARN, "launch of job '%s' from %s refused: %s", id, addr, bad);
		reply_launch(peer, session, id, NULL, bad);
		return;
	}
	memset(j, 0, sizeof *j);
	j->used = 1;
	snprintf(j->id, sizeof j->id, "%s", q->job_id);
	snprintf(j->token, sizeof j->token, "%s", q->job_token);
	snprintf(j->master_addr, sizeof j->master_addr, "%s", q->master_addr);
	snprintf(j->transport, sizeof j->transport, "%s", q->transport ? q->transport : "");
	snprintf(j->peer_addr, sizeof j->peer_addr, "%s", addr);
	j->node_rank = (int)q->node_rank;
	j->nodes = (int)q->nodes;
	j->devices = (int)q->devices;
	j->rank_base = j->node_rank * j->devices;
	j->restart_count = (int)q->restart_count;
	j->max_restarts = (int)q->max_restarts;
	j->peer = *peer;
	snprintf(j->session, sizeof j->session, "%s", session);
	j->started = j->last_ping = ev_now(D.loop);
	ev_timer_init(&j->progress_timer, on_progress_timer, PROGRESS_EVERY_S, 0);
	j->progress_timer.data = j;
	if (pick_uid(j) < 0) {
		snprintf(why, sizeof why, "all %u uids of job_uids are taken by running jobs or kept out of the pool (%d: processes still run under them)",
			 D.conf.job_uid_last - D.conf.job_uid_first + 1, D.quarantine.n);
		j->devices = 0;
		release_job(j);
		logmsg(HPUD_LOG_WARN, "launch of job '%s' from %s refused: %s", id, addr, why);
		reply_launch(peer, session, id, NULL, why);
		return;
	}
	if (book_devices(j, why, sizeof why) < 0) {
		j->devices = 0;
		release_job(j);
		logmsg(HPUD_LOG_WARN, "launch of job '%s' from %s refused: %s", id, addr, why);
		reply_launch(peer, session, id, NULL, why);
		return;
	}
	if (q->n_node_devices && !(j->node_devices = calloc(q->n_node_devices, sizeof(int)))) {
		release_job(j);
		reply_launch(peer, session, id, NULL, "out of memory");
		return;
	}
	if (j->node_devices) {
		j->rank_base = 0;
		for (size_t i = 0; i < q->n_node_devices; i++) {
			j->node_devices[i] = (int)q->node_devices[i];
			if ((int)i < j->node_rank)
				j->rank_base += j->node_devices[i];
		}
	}
	if (!(j->argv = worker_argv(q)) || !(j->env = job_env(q)) ||
	    hpud__outq_init(&j->out, j->rank_base, j->devices) < 0) {
		release_job(j);
		reply_launch(peer, session, id, NULL, "out of memory");
		return;
	}
	hpu_nodejob_cfg jc = {
		.node_rank = j->node_rank,
		.nodes = j->nodes,
		.devices = j->devices,
		.node_devices = j->node_devices,
		.master_addr = j->master_addr,
		.master_port = (int)q->master_port,
		.job_id = j->id,
		.token = j->token,
		.restart_count = j->restart_count,
		.max_restarts = j->max_restarts,
		.argv = j->argv,
		.transport = j->transport[0] ? j->transport : NULL,
		.env = j->env,
		.device_ids = j->dev,
		.set_user = D.set_user,
		.uid = j->uid,
		.gid = D.gid,
		.job_uid_first = own_uids() ? D.conf.job_uid_first : 0,
		.job_uid_last = own_uids() ? D.conf.job_uid_last : 0,
		.join_timeout_s = 300,
		.agent_timeout_s = 10,
		.grace_s = 2,
		.quiet = 1,
		.on_line = on_line,
		.on_status = on_status,
		.on_exit = on_exit_worker,
		.on_end = on_end,
		.arg = j,
	};
	if (!(j->nj = hpu__nodejob_start(D.loop, &jc, err, sizeof err))) {
		logmsg(HPUD_LOG_WARN, "job %s from %s could not start: %s", id, addr, err);
		reply_launch(peer, session, id, NULL, err);
		release_job(j);
		return;
	}
	char attempt[64] = "";
	if (j->max_restarts)
		snprintf(attempt, sizeof attempt, " (restart %d of %d)", j->restart_count,
			 j->max_restarts);
	logmsg(HPUD_LOG_INFO, "job %s%s from %s: node %d of %d, %d worker%s (ranks %d-%d of %d) as uid %d, coordinator %s:%d",
	       j->id, attempt, addr, j->node_rank, j->nodes, j->devices, hpu__plural(j->devices),
	       j->rank_base,
	       j->rank_base + j->devices - 1, hpu__nodejob_world(j->nj),
	       D.set_user ? (int)j->uid : (int)getuid(), j->master_addr,
	       hpu__nodejob_master_port(j->nj));
	reply_launch(peer, session, id, j, NULL);
	notify("");
}

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
		if (D.jobs[i].used && D.jobs[i].nj)
			want += (size_t)(D.jobs[i].devices < MAX_STATUS_RANKS ? D.jobs[i].devices
									      : MAX_STATUS_RANKS);
	if (want > MAX_REPLY_RANKS)
		want = MAX_REPLY_RANKS;
	Hpu__RankStatus *rs = calloc(want ? want : 1, sizeof *rs);
	Hpu__RankStatus **rsp = calloc(want ? want : 1, sizeof *rsp);
	for (int i = 0; i < MAX_JOBS; i++) {
		job *j = &D.jobs[i];
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
		st[n].seconds = ev_now(D.loop) - j->started;
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
	r.devices_total = (uint32_t)D.conf.devices;
	r.devices_free = (uint32_t)free_devices();
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_STATUS_REPLY;
	env.status_reply = &r;
	send_env(peer, session, &env);
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
	job *j = c->job_id ? find_job(c->job_id) : NULL;
	if (!j || !j->nj || j->ended)
		return;
	char reason[200];
	snprintf(reason, sizeof reason, "cancelled by the submitter (%s)", addr);
	logmsg(HPUD_LOG_INFO, "job %s: %s", j->id, reason);
	hpu__nodejob_cancel(j->nj, reason, 2);
}

static void do_ping(const hpu_codec_peer *peer, const char *session, const Hpu__Ping *p)
{
	job *j = p->job_id ? find_job(p->job_id) : NULL;
	if (j)
		j->last_ping = ev_now(D.loop);
	Hpu__Ping pong = HPU__PING__INIT;
	pong.job_id = p->job_id ? p->job_id : "";
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_PING;
	env.ping = &pong;
	send_env(peer, session, &env);
}

/* Hello: this instance's id, for the session the submitter just opened. */
static void do_hello(const hpu_codec_peer *peer, const char *session)
{
	Hpu__HelloReply r = HPU__HELLO_REPLY__INIT;
	r.instance = D.instance;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_HELLO_REPLY;
	env.hello_reply = &r;
	send_env(peer, session, &env);
}

/* Whether m may be acted on: it names a session, and this instance unless
 * it is a Hello; otherwise NULL and the reason in why. */
static const char *check_binding(const Hpu__Envelope *m, char *why, size_t len)
{
	if (!m->session || !valid_id(m->session))
		return "no session id (1-63 letters, digits, '-', '_' or '.'): "
		       "is the submitter an older hpulaunch?";
	if (m->msg_case == HPU__ENVELOPE__MSG_HELLO)
		return NULL;
	if (!m->instance || !*m->instance)
		return "no hpud instance id: the submitter must say hello first "
		       "(is it an older hpulaunch?)";
	if (strcmp(m->instance, D.instance) != 0) {
		snprintf(why, len,
			 "signed for another hpud or before a restart (for instance %.40s, "
			 "this hpud is %s): a replay?",
			 valid_id(m->instance) ? m->instance : "(not an id)", D.instance);
		return why;
	}
	return NULL;
}

static void handle(const hpu_codec_peer *peer, const char *addr, const void *frame,
		   size_t len)
{
	char why[256];
	const void *body;
	size_t blen;
	if (hpu__auth_verify(D.auth, frame, len, hpu__auth_now_ms(), &body, &blen, why,
			     sizeof why) < 0) {
		log_refusal(addr, why);
		return;
	}
	Hpu__Envelope *m = hpu__codec_unpack(body, blen);
	if (!m) {
		log_refusal(addr, "signed, but not a valid message");
		return;
	}
	char bwhy[200];
	const char *bad = check_binding(m, bwhy, sizeof bwhy);
	if (bad) {
		log_refusal(addr, bad);
		hpu__codec_free(m);
		return;
	}
	switch (m->msg_case) {
	case HPU__ENVELOPE__MSG_HELLO:
		do_hello(peer, m->session);
		break;
	case HPU__ENVELOPE__MSG_LAUNCH_REQUEST:
		do_launch(peer, addr, m->session, m->launch_request);
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
		log_refusal(addr, "not a request hpud takes");
		break;
	}
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
		log_refusal(addr, "more than one frame");
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

static int open_socket(char *err, size_t errlen)
{
	char ep[128];
	snprintf(ep, sizeof ep, "tcp://%s:%d", D.conf.listen, D.conf.port);
	int64_t maxmsg = HPU_AUTH_MAX_FRAME;
	/* A peer's queue holds a few messages, and says when it is full
	 * (mandatory: EAGAIN rather than a silent drop): a job's output waits
	 * in its own queue, counted in bytes (joboutput.h). */
	int linger = 1000, hwm = PEER_QUEUE_MSGS, mandatory = 1;
	D.ctx = zmq_ctx_new();
	D.sock = D.ctx ? zmq_socket(D.ctx, ZMQ_ROUTER) : NULL;
	if (!D.sock || zmq_setsockopt(D.sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
	    zmq_setsockopt(D.sock, ZMQ_LINGER, &linger, sizeof linger) ||
	    zmq_setsockopt(D.sock, ZMQ_SNDHWM, &hwm, sizeof hwm) ||
	    zmq_setsockopt(D.sock, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory) ||
	    zmq_bind(D.sock, ep) ||
	    hpu__zwatch_start(&D.zw, D.loop, D.sock, on_sock, NULL)) {
		snprintf(err, errlen, "cannot listen on %s: %s", ep, zmq_strerror(errno));
		return -1;
	}
	return 0;
}

/* ---- timers and signals ---- */

static void on_tick(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)t;
	(void)revents;
	hpud__quarantine_check(&D.quarantine);
	for (int i = 0; i < MAX_JOBS; i++) {
		job *j = &D.jobs[i];
		double silent = ev_now(loop) - j->last_ping;
		if (j->used && j->ended && !j->nj && silent > D.conf.submitter_timeout_s) {
			/* retired, its last messages waiting for a silent submitter */
			logmsg(HPUD_LOG_WARN, "job %s: the submitter (%s) went away: %ld messages to it dropped",
			       j->id, j->peer_addr, j->out.messages);
			release_job(j);
			continue;
		}
		if (!j->used || !j->nj || j->ended)
			continue;
		if (j->held && (j->peer_gone || ev_now(loop) - j->out_moved >= OUTPUT_STALL_S))
			hpud__jobout_stall(&D.out, j, ev_now(loop) - j->out_moved);
		if (silent > D.conf.submitter_timeout_s) {
			char reason[200];
			snprintf(reason, sizeof reason,
				 "the submitter (%s) went away: no ping for %.0f s", j->peer_addr,
				 silent);
			logmsg(HPUD_LOG_WARN, "job %s: %s", j->id, reason);
			hpu__nodejob_cancel(j->nj, reason, 2);
			j->last_ping = ev_now(loop) + 3600; /* say it once */
			j->peer_gone = 1;
			if (j->held)
				hpud__jobout_stall(&D.out, j, ev_now(loop) - j->out_moved);
		}
	}
}

static int load_key(char *err, size_t errlen)
{
	uint8_t key[HPU_AUTH_KEY_BYTES];
	if (hpu__auth_load_key(D.conf.key_path, key, err, errlen) < 0)
		return -1;
	if (D.auth)
		hpu__auth_set_key(D.auth, key);
	else
		D.auth = hpu__auth_new(key, (int64_t)(D.conf.clock_window_s * 1000), 1 << 16);
	memset(key, 0, sizeof key);
	if (!D.auth) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

/* job_uids must be uids of nobody: a job would act as their owner. */
static int check_job_uids(const hpud_conf *c, char *err, size_t errlen)
{
	if (!c->job_uid_first)
		return 0;
	struct passwd *pw;
	int bad = 0;
	setpwent();
	while (!bad && (pw = getpwent()) != NULL)
		if (pw->pw_uid >= c->job_uid_first && pw->pw_uid <= c->job_uid_last) {
			snprintf(err, errlen, "%s: job_uids %u-%u holds uid %u, which belongs to user '%s': choose uids no user has",
				 D.conf_path, c->job_uid_first, c->job_uid_last,
				 (unsigned)pw->pw_uid, pw->pw_name);
			bad = 1;
		}
	endpwent();
	return bad ? -1 : 0;
}

/* The user workers run as. Root runs workers as root only when told so. */
static int resolve_user(const hpud_conf *c, char *err, size_t errlen)
{
	D.set_user = 0;
	if (c->job_uid_first && geteuid() != 0) {
		snprintf(err, errlen, "%s: job_uids needs hpud to run as root (it switches each job's workers to a uid of its own)",
			 D.conf_path);
		return -1;
	}
	if (c->job_uid_first && !c->user[0]) {
		snprintf(err, errlen, "%s: job_uids needs 'user = NAME': the jobs' group is that user's",
			 D.conf_path);
		return -1;
	}
	if (!c->user[0]) {
		if (geteuid() == 0) {
			snprintf(err, errlen, "hpud runs as root: set 'user = NAME' in %s for the workers (or 'user = root' to run them as root)",
				 D.conf_path);
			return -1;
		}
		return 0;
	}
	struct passwd *pw = getpwnam(c->user);
	if (!pw) {
		snprintf(err, errlen, "%s: user '%s' does not exist", D.conf_path, c->user);
		return -1;
	}
	if (geteuid() != 0) {
		if (pw->pw_uid != geteuid()) {
			snprintf(err, errlen, "%s: user '%s': hpud is not root and cannot switch workers to another user",
				 D.conf_path, c->user);
			return -1;
		}
		return 0;
	}
	D.set_user = 1;
	D.uid = pw->pw_uid;
	D.gid = pw->pw_gid;
	return check_job_uids(c, err, errlen);
}

/* devices = auto: the devices counted with the worker program, as
 * hpulaunch counts them (daemon/conf.h); the count is logged. */
static int count_devices(hpud_conf *c, char *err, size_t errlen)
{
	char note[1024], why[1024];
	if (hpud__conf_count_devices(c, D.worker, note, sizeof note, why, sizeof why) < 0) {
		snprintf(err, errlen, "%.200s: %.800s", D.conf_path, why);
		return -1;
	}
	if (note[0])
		logmsg(HPUD_LOG_INFO, "%s", note);
	return 0;
}

static void reload(void)
{
	char err[1024];
	hpud_conf c = D.conf;
	if (hpud__trust_path(D.conf_path, "the configuration", err, sizeof err) < 0 ||
	    hpud__conf_load(&c, D.conf_path, err, sizeof err) < 0 ||
	    hpud__trust_path(D.worker, "the worker program", err, sizeof err) < 0 ||
	    count_devices(&c, err, sizeof err) < 0) {
		logmsg(HPUD_LOG_ERROR, "reload refused, keeping the old configuration: %s", err);
		return;
	}
	if (strcmp(c.listen, D.conf.listen) || c.port != D.conf.port)
		logmsg(HPUD_LOG_WARN, "reload: listen/port changes take effect after a restart");
	if (c.devices < D.conf.devices)
		for (int i = c.devices; i < D.conf.devices; i++)
			if (D.busy[i])
				logmsg(HPUD_LOG_WARN, "reload: device %d is still in use by a job", i);
	hpud_conf old = D.conf;
	D.conf = c;
	snprintf(D.conf.listen, sizeof D.conf.listen, "%s", old.listen);
	D.conf.port = old.port;
	if (resolve_user(&D.conf, err, sizeof err) < 0 ||
	    hpud__trust_path(D.conf.key_path, "the key file", err, sizeof err) < 0 ||
	    load_key(err, sizeof err) < 0 ||
	    hpud__trust_path(D.worker, "the worker program", err, sizeof err) < 0) {
		logmsg(HPUD_LOG_ERROR, "reload refused, keeping the old configuration: %s", err);
		D.conf = old;
		resolve_user(&D.conf, err, sizeof err);
		return;
	}
	apply_log_level();
	logmsg(HPUD_LOG_INFO, "configuration reloaded from %s", D.conf_path);
}

/* SIGHUP: rereads the configuration and the key (systemd hears that hpud
 * reloads, and then that it is ready again, whether the reload took). */
static void on_hup(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	notify("RELOADING=1");
	reload();
	notify("READY=1");
}

static void on_term(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)revents;
	if (D.stopping) {
		ev_break(loop, EVBREAK_ALL);
		return;
	}
	D.stopping = 1;
	logmsg(HPUD_LOG_INFO, "%s: cancelling the jobs and stopping",
	       w->signum == SIGTERM ? "SIGTERM" : "SIGINT");
	notify("STOPPING=1");
	int left = 0;
	for (int i = 0; i < MAX_JOBS; i++)
		if (D.jobs[i].used && D.jobs[i].nj && !D.jobs[i].ended) {
			hpu__nodejob_cancel(D.jobs[i].nj, "hpud is shutting down", 2);
			left++;
		}
	if (!left)
		ev_break(loop, EVBREAK_ALL);
}

/* ---- start-up ---- */

enum { OPT_HELP = 1, OPT_GEN_KEY, OPT_CONFIG, OPT_CHECK, OPT_HELP_DOC, OPT_LOG_LEVEL };

/* The parser's table and the help's (--help, man/hpud.8, docs/reference). */
static const hpu_optspec specs[] = {
	{"config", 'c', HPU_OPT_VALUE, OPT_CONFIG, "FILE",
	 .help = "the configuration file, hpud.conf(5) (/etc/hpud/hpud.conf)"},
	{"check", 0, HPU_OPT_FLAG, OPT_CHECK, NULL,
	 .help = "check the configuration, the key and the worker program, then exit"},
	{"gen-key", 0, HPU_OPT_VALUE, OPT_GEN_KEY, "FILE",
	 .help = "make a new cluster secret in FILE (mode 0600) and exit"},
	{"log-level", 0, HPU_OPT_VALUE, OPT_LOG_LEVEL, "LEVEL",
	 .help = "error | warning | notice | info | debug: lines above it are not logged (the "
		 "configuration's log_level)",
	 .env = "HPU_LOG_LEVEL"},
	{"help", 'h', HPU_OPT_FLAG, OPT_HELP, NULL, .help = "this help"},
	/* the options' and the keys' documentation (man/, docs/reference/) */
	{"help-doc", 0, HPU_OPT_VALUE, OPT_HELP_DOC, .help = NULL},
	{0},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: hpud [-c FILE]      run the node daemon (default /etc/hpud/hpud.conf)\n"
		   "       hpud --gen-key FILE  make a new cluster secret (mode 0600)\n"
		   "       hpud -c FILE --check check the configuration and the key, then exit\n"
		   "\n"
		   "options:\n");
	hpu__optdoc(f, specs, HPU_DOC_HELP, 22);
	fprintf(f, "\n"
		   "Logs go to stderr. SIGHUP reloads the configuration and the key;\n"
		   "SIGTERM cancels the running jobs and exits.\n");
}

/* --help-doc FORMAT: the options in FORMAT (help, scdoc, markdown), or
 * with conf-FORMAT the configuration file's keys. */
static int help_doc(const char *format)
{
	int conf = !strncmp(format, "conf-", 5);
	int how = hpu__optdoc_format(conf ? format + 5 : format);
	if (how < 0) {
		logmsg(HPUD_LOG_ERROR, "--help-doc takes [conf-]help, scdoc or markdown, not '%s'", format);
		return 2;
	}
	if (conf)
		hpud__conf_doc(stdout, how);
	else
		hpu__optdoc(stdout, specs, how, 22);
	return 0;
}

/* hpu-worker next to this program, unless the configuration names one. */
static int find_worker(char *err, size_t errlen)
{
	if (D.conf.worker[0]) {
		snprintf(D.worker, sizeof D.worker, "%s", D.conf.worker);
	} else {
		char self[PATH_MAX];
		ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
		char *slash = n > 0 ? (self[n] = 0, strrchr(self, '/')) : NULL;
		if (!slash) {
			snprintf(err, errlen, "cannot find hpu-worker: set 'worker = PATH'");
			return -1;
		}
		*slash = 0;
		if (strlen(self) + sizeof "/hpu-worker" > sizeof D.worker) {
			snprintf(err, errlen, "the path of hpud is too long: set 'worker = PATH'");
			return -1;
		}
		memcpy(D.worker, self, strlen(self));
		memcpy(D.worker + strlen(self), "/hpu-worker", sizeof "/hpu-worker");
	}
	if (access(D.worker, X_OK) != 0) {
		snprintf(err, errlen, "the worker program %.600s: %s", D.worker, strerror(errno));
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	char err[1024];
	int check = 0;
	D.conf_path = "/etc/hpud/hpud.conf";
	setvbuf(stderr, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	if (hpu__log_init(err, sizeof err, "hpud") < 0) {
		logmsg(HPUD_LOG_ERROR, "%s", err);
		return 2;
	}
	hpu_optparse p;
	hpu__optparse_init(&p, argc, argv, specs);
	for (int r; (r = hpu__optparse_next(&p)) != HPU_OPT_END;) {
		if (r == OPT_HELP) {
			usage(stdout);
			return 0;
		} else if (r == OPT_HELP_DOC) {
			return help_doc(p.val);
		} else if (r == OPT_GEN_KEY) {
			if (hpu__auth_gen_key(p.val, err, sizeof err) < 0) {
				logmsg(HPUD_LOG_ERROR, "%s", err);
				return 1;
			}
			printf("hpud: wrote a new cluster secret to %s (mode 0600); copy it to every node and to the submitters\n",
			       p.val);
			return 0;
		} else if (r == OPT_CONFIG) {
			D.conf_path = p.val;
		} else if (r == OPT_CHECK) {
			check = 1;
		} else if (r == OPT_LOG_LEVEL) {
			hpu_log_level lvl;
			if (hpu__log_parse_level(p.val, "--log-level", &lvl, err, sizeof err) < 0) {
				logmsg(HPUD_LOG_ERROR, "%s", err);
				return 2;
			}
			hpu__log_set_level(lvl);
			D.log_level_fixed = 1;
		} else if (r == HPU_OPT_MISSING) {
			logmsg(HPUD_LOG_ERROR, "%s needs a value", p.arg);
			usage(stderr);
			return 2;
		} else { /* an argument, an unknown option, a flag with a value */
			logmsg(HPUD_LOG_ERROR, "unknown argument %s", p.arg);
			usage(stderr);
			return 2;
		}
	}
	hpud__conf_defaults(&D.conf);
	D.quarantine.log = logmsg;
	/* Nothing that someone else could have written is read or run
	 * (daemon/trust.h): the configuration, the key, the worker program. */
	if (hpud__trust_path(D.conf_path, "the configuration", err, sizeof err) < 0 ||
	    hpud__conf_load(&D.conf, D.conf_path, err, sizeof err) < 0 ||
	    resolve_user(&D.conf, err, sizeof err) < 0 ||
	    hpud__trust_path(D.conf.key_path, "the key file", err, sizeof err) < 0 ||
	    load_key(err, sizeof err) < 0 || find_worker(err, sizeof err) < 0 ||
	    hpud__trust_path(D.worker, "the worker program", err, sizeof err) < 0 ||
	    count_devices(&D.conf, err, sizeof err) < 0) {
		logmsg(HPUD_LOG_ERROR, "%s", err);
		return 1;
	}
	apply_log_level();
	if (check) {
		printf("hpud: %s is fine\n", D.conf_path);
		return 0;
	}
	D.loop = EV_DEFAULT;
	if (hpu__auth_random_id(D.instance) < 0) {
		logmsg(HPUD_LOG_ERROR, "cannot draw an instance id: the random generator failed");
		return 1;
	}
	if (open_socket(err, sizeof err) < 0) {
		logmsg(HPUD_LOG_ERROR, "%s", err);
		return 1;
	}
	ev_timer_init(&D.tick, on_tick, 1.0, 1.0);
	ev_timer_start(D.loop, &D.tick);
	ev_prepare_init(&D.reap, on_reap);
	D.out = (hpud_jobout){.loop = D.loop, .conf = &D.conf, .jobs = D.jobs, .njobs = MAX_JOBS,
			      .reap = &D.reap, .pack = pack_env, .send = send_body, .log = logmsg};
	hpud__jobout_init(&D.out);
	ev_signal_init(&D.sigterm, on_term, SIGTERM);
	ev_signal_init(&D.sigint, on_term, SIGINT);
	ev_signal_init(&D.sighup, on_hup, SIGHUP);
	ev_signal_start(D.loop, &D.sigterm);
	ev_signal_start(D.loop, &D.sigint);
	ev_signal_start(D.loop, &D.sighup);
	logmsg(HPUD_LOG_INFO, "listening on tcp://%s:%d, %d device%s, workers run as %s, worker %s, instance %s",
	       D.conf.listen, D.conf.port, D.conf.devices, hpu__plural(D.conf.devices),
	       D.set_user ? D.conf.user : "hpud's own user", D.worker, D.instance);
	notify("READY=1"); /* the socket listens: connections are taken from now on */
	ev_run(D.loop, 0);
	for (int i = 0; i < MAX_JOBS; i++)
		if (D.jobs[i].used)
			release_job(&D.jobs[i]);
	hpu__zwatch_stop(&D.zw);
	zmq_close(D.sock);
	hpu__zmq_ctx_term(D.ctx);
	hpu__auth_destroy(&D.auth);
	logmsg(HPUD_LOG_INFO, "stopped");
	return 0;
}
