/* hpud's launch request: checked field by field, a slot in the job
 * table, a uid (job_uids) and devices booked, the node job started with
 * joblife.c's callbacks, the reply. Calls joblife.c, reply.c, jobs.c and
 * logging.c (daemon/hpud.h). */
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "common/env.h"
#include "common/clock.h"
#include "common/num.h"
#include "agent/restart.h"
#include "daemon/hpud.h"

/* ---- requests: launch ---- */

int hpud__valid_id(const char *s)
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
	if (!q->job_id || !hpud__valid_id(q->job_id))
		return "job_id must be 1-63 letters, digits, '-', '_' or '.'";
	if (!q->job_token || !*q->job_token || strlen(q->job_token) > 128)
		return "job_token must be 1-128 bytes";
	if (q->nodes < 1 || q->nodes > 4096 || q->node_rank >= q->nodes)
		return "node_rank must be below nodes, and nodes in 1..4096";
	if (q->devices < 1 || q->devices > (uint32_t)hpud__D.conf.devices) {
		snprintf(why, len, "devices %u: this node has %d", q->devices, hpud__D.conf.devices);
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
	if (!(q->join_timeout_s >= 0)) /* NaN too; infinity: wait for ever */
		return "join_timeout_s must be a number of seconds above 0 (0: 300)";
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
			       "OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and HPU_LOG_LEVEL";
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
			hpud__free_argv(env);
			return NULL;
		}
	return env;
}

static char **worker_argv(const Hpu__LaunchRequest *q)
{
	char **argv = calloc(q->n_argv + 2, sizeof *argv);
	if (!argv)
		return NULL;
	argv[0] = strdup(hpud__D.worker);
	for (size_t i = 0; i < q->n_argv; i++)
		argv[i + 1] = strdup(q->argv[i]);
	for (size_t i = 0; i < q->n_argv + 1; i++)
		if (!argv[i]) {
			hpud__free_argv(argv);
			return NULL;
		}
	return argv;
}

/* Picks free devices for j; returns 0, or -1 with the reason in why. */
static int book_devices(job *j, char *why, size_t len)
{
	int n = hpud__free_devices();
	if (n < j->devices) {
		int k = snprintf(why, len, "busy: this node has %d device%s, %d free, the job asks for %d",
				 hpud__D.conf.devices, hpu__plural(hpud__D.conf.devices), n, j->devices);
		for (int i = 0; i < MAX_JOBS && k > 0 && (size_t)k < len; i++)
			if (hpud__D.jobs[i].used && hpud__D.jobs[i].nj)
				k += snprintf(why + k, len - (size_t)k, "; job %s holds %d",
					      hpud__D.jobs[i].id, hpud__D.jobs[i].devices);
		return -1;
	}
	for (int i = 0, k = 0; i < hpud__D.conf.devices && k < j->devices; i++)
		if (!hpud__D.busy[i]) {
			hpud__D.busy[i] = 1;
			j->dev[k++] = i;
		}
	return 0;
}

/* The uid of j's workers: with job_uids, the lowest one that no other
 * job holds and no process runs under (one that does is quarantined);
 * 0, or -1 when there is none. */
static int pick_uid(job *j)
{
	if (!hpud__D.conf.job_uid_first) {
		j->uid = hpud__D.uid;
		return 0;
	}
	for (unsigned u = hpud__D.conf.job_uid_first; u <= hpud__D.conf.job_uid_last; u++) {
		int taken = hpud__quarantine_has(&hpud__D.quarantine, u);
		for (int i = 0; i < MAX_JOBS && !taken; i++)
			taken = hpud__D.jobs + i != j && hpud__D.jobs[i].used && hpud__D.jobs[i].uid == u;
		int n = taken || !hpud__own_uids()
				? 0
				: hpud__quarantine_if_used(&hpud__D.quarantine, u, "which no running job holds");
		if (!taken && !n) {
			j->uid = u;
			return 0;
		}
	}
	return -1;
}

void hpud__do_launch(const hpu_codec_peer *peer, const char *addr, const char *session,
		     const Hpu__LaunchRequest *q)
{
	char why[600], err[1024];
	const char *bad = check_launch(q, why, sizeof why);
	const char *id = q->job_id && hpud__valid_id(q->job_id) ? q->job_id : "";
	if (!bad && hpud__D.stopping)
		bad = "hpud is shutting down";
	if (!bad && hpud__find_job(q->job_id))
		bad = "a job with this id already runs on this node";
	job *j = NULL;
	for (int i = 0; !bad && i < MAX_JOBS && !j; i++)
		if (!hpud__D.jobs[i].used)
			j = &hpud__D.jobs[i];
	if (!bad && !j)
		bad = "too many jobs on this node";
	char wwhy[900];
	if (!bad && access(hpud__D.worker, X_OK) != 0) { /* removed since the start or reload */
		snprintf(wwhy, sizeof wwhy, "the worker program %.600s cannot be run: %s", hpud__D.worker,
			 strerror(errno));
		bad = wwhy;
	}
	if (bad) {
		hpud__logmsg(HPUD_LOG_WARN, "launch of job '%s' from %s refused: %s", id, addr, bad);
		hpud__reply_launch(peer, session, id, NULL, bad);
		return;
	}
	memset(j, 0, sizeof *j);
	j->used = 1;
	j->key_gen = hpud__D.key_gen;
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
	j->started = j->last_ping = hpu__mono_s();
	ev_timer_init(&j->progress_timer, hpud__on_progress_timer, PROGRESS_EVERY_S, 0);
	j->progress_timer.data = j;
	if (pick_uid(j) < 0) {
		int kept = hpud__D.quarantine.n;
		unsigned all = hpud__D.conf.job_uid_last - hpud__D.conf.job_uid_first + 1;
		if (kept)
			snprintf(why, sizeof why, "all %u uids of job_uids are taken: %u by running jobs, %d kept out of the pool (processes still run under %s)",
				 all, all - (unsigned)kept, kept, kept == 1 ? "it" : "them");
		else
			snprintf(why, sizeof why, "all %u uids of job_uids are taken by running jobs", all);
		j->devices = 0;
		hpud__release_job(j);
		hpud__logmsg(HPUD_LOG_WARN, "launch of job '%s' from %s refused: %s", id, addr, why);
		hpud__reply_launch(peer, session, id, NULL, why);
		return;
	}
	if (book_devices(j, why, sizeof why) < 0) {
		j->devices = 0;
		hpud__release_job(j);
		hpud__logmsg(HPUD_LOG_WARN, "launch of job '%s' from %s refused: %s", id, addr, why);
		hpud__reply_launch(peer, session, id, NULL, why);
		return;
	}
	if (q->n_node_devices && !(j->node_devices = calloc(q->n_node_devices, sizeof(int)))) {
		hpud__release_job(j);
		hpud__reply_launch(peer, session, id, NULL, "out of memory");
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
		hpud__release_job(j);
		hpud__reply_launch(peer, session, id, NULL, "out of memory");
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
		.hpu_workers = 1,
		.transport = j->transport[0] ? j->transport : NULL,
		.env = j->env,
		.device_ids = j->dev,
		.set_user = hpud__D.set_user,
		.uid = j->uid,
		.gid = hpud__D.gid,
		.job_uid_first = hpud__own_uids() ? hpud__D.conf.job_uid_first : 0,
		.job_uid_last = hpud__own_uids() ? hpud__D.conf.job_uid_last : 0,
		.join_timeout_s = q->join_timeout_s > 0 ? q->join_timeout_s : 300, /* 0: an older hpulaunch */
		.agent_timeout_s = 10,
		.grace_s = 2,
		.quiet = 1,
		.on_line = hpud__on_line,
		.on_status = hpud__on_status,
		.on_exit = hpud__on_exit_worker,
		.on_end = hpud__on_end,
		.arg = j,
	};
	if (!(j->nj = hpu__nodejob_start(hpud__D.loop, &jc, err, sizeof err))) {
		hpud__logmsg(HPUD_LOG_WARN, "job %s from %s could not start: %s", id, addr, err);
		hpud__reply_launch(peer, session, id, NULL, err);
		hpud__release_job(j);
		return;
	}
	char attempt[64] = "";
	if (j->max_restarts)
		snprintf(attempt, sizeof attempt, " (restart %d of %d)", j->restart_count,
			 j->max_restarts);
	char ranks[64]; /* "rank 2", "ranks 2-3" (it said "ranks 2-2") */
	if (j->devices == 1)
		snprintf(ranks, sizeof ranks, "rank %d", j->rank_base);
	else
		snprintf(ranks, sizeof ranks, "ranks %d-%d", j->rank_base,
			 j->rank_base + j->devices - 1);
	hpud__logmsg(HPUD_LOG_INFO, "job %s%s from %s: node %d of %d, %d worker%s (%s of %d) as uid %d, coordinator %s:%d",
		     j->id, attempt, addr, j->node_rank, j->nodes, j->devices, hpu__plural(j->devices),
		     ranks, hpu__nodejob_world(j->nj),
		     hpud__D.set_user ? (int)j->uid : (int)getuid(), j->master_addr,
		     hpu__nodejob_master_port(j->nj));
	hpud__reply_launch(peer, session, id, j, NULL);
	hpud__notify("");
}
