/* nodejob: one node's part of a job, as hpulaunch runs it in the
 * foreground and hpud runs several of them side by side: the node's
 * workers (agent.h), and on node 0 the job's coordinator (coord.h), on the
 * other nodes a link to it with heartbeats. A worker's failure, an abort
 * from the coordinator, a silent coordinator or a cancel stops the node's
 * workers; once they are all reaped, on_end says how the job went. */
#ifndef HPU_NODEJOB_H
#define HPU_NODEJOB_H

#include <ev.h>
#include <stddef.h>

#include "agent/agent.h"
#include "proto/hpu.pb-c.h"

typedef struct hpu_nodejob hpu_nodejob;

typedef struct hpu_nodejob_cfg {
	int node_rank, nodes, devices;
	/* The workers of every node (nodes entries; entry node_rank is
	 * devices), when nodes run different numbers of them: node r's ranks
	 * follow those of nodes 0..r-1. NULL: every node runs `devices`. */
	const int *node_devices;
	const char *master_addr;  /* node 0's address (a name is resolved) */
	int master_port;          /* node 0: 0 picks a free port */
	const char *job_id, *token;
	/* hpulaunch --max-restarts (restart.h): this attempt, 0 first, and
	 * the restarts allowed. The workers get them as HPU_RESTART_COUNT and
	 * HPU_MAX_RESTARTS, and this attempt's token. On nodes other than 0
	 * a restart starts its workers only once the coordinator of the same
	 * attempt has answered, so they never join an earlier attempt's. */
	int restart_count, max_restarts;
	char *const *argv;        /* the worker program and its arguments */
	int search_path;          /* look argv[0] up in PATH */
	/* The workers are hpu-workers (not hpulaunch --exec's program): one
	 * that exits 0 without ever saying hello on its status pipe left
	 * early (hpud's `worker =` naming another program, say). */
	int hpu_workers;
	const char *log_dir;      /* or NULL */
	const char *transport;    /* or NULL */
	char *const *env;         /* "NAME=VALUE" for the workers, or NULL */
	const int *device_ids;    /* or NULL (agent.h) */
	int set_user;             /* run the workers as uid/gid */
	unsigned uid, gid;
	/* uid is the job's alone, one of these (agent.h); 0 0: shared */
	unsigned job_uid_first, job_uid_last;
	double join_timeout_s, agent_timeout_s, grace_s;
	int quiet;                /* no error lines in the log */
	/* A worker's output line (agent.h); NULL: this process's stdout. */
	void (*on_line)(hpu_nodejob *j, int rank, int is_err, const char *line,
			size_t len, void *arg);
	/* Optional: a worker's status record (agent.h). */
	void (*on_status)(hpu_nodejob *j, int rank, const hpu_status_rec *st, void *arg);
	/* Optional: a worker ended (status as from waitpid). */
	void (*on_exit)(hpu_nodejob *j, int rank, int pid, int status, void *arg);
	/* The node's part is over: every worker reaped. failed: a worker
	 * failed, the job was aborted or cancelled; root_cause says why. */
	void (*on_end)(hpu_nodejob *j, int failed, const char *root_cause,
		       void *arg);
	void *arg;
} hpu_nodejob_cfg;

/* Starts the coordinator (node 0) or the link to it, then the workers.
 * The cfg strings must outlive the job. Returns NULL with a sentence in
 * err; on_end is then never called. */
hpu_nodejob *hpu__nodejob_start(struct ev_loop *loop, const hpu_nodejob_cfg *cfg,
				char *err, size_t errlen);

/* The coordinator's port (node 0: the one it bound). */
int hpu__nodejob_master_port(const hpu_nodejob *j);

/* Ends the job for `reason`: tells the coordinator (or, on node 0, every
 * node), stops the local workers (SIGTERM, then SIGKILL after grace_s;
 * at once with grace_s 0, also when called again). The first reason is
 * the root cause; it is not printed (the caller says why). */
void hpu__nodejob_cancel(hpu_nodejob *j, const char *reason, double grace_s);

/* hpu__agent_hold_output for the node's workers: on_line's reader cannot
 * keep up (hold 1), or can again (0). */
void hpu__nodejob_hold_output(hpu_nodejob *j, int hold);

/* Workers not yet reaped. */
int hpu__nodejob_live(const hpu_nodejob *j);

/* The global rank of local worker `local`. */
int hpu__nodejob_rank(const hpu_nodejob *j, int local);

/* The ranks in the job, all nodes together. */
int hpu__nodejob_world(const hpu_nodejob *j);

/* 1 when node 0's coordinator ended the job because another node's
 * hpulaunch was set up otherwise (hpu__coord_set_up_apart), or, on
 * another node, refused this one: not to be restarted. */
int hpu__nodejob_set_up_apart(const hpu_nodejob *j);

/* 1 when the job ended because a user interrupted another node's
 * hpulaunch (Ctrl-C, SIGTERM): not to be restarted, as at this node's own
 * interrupt. */
int hpu__nodejob_interrupted_elsewhere(const hpu_nodejob *j);

/* 1 where the job failed and its root cause was left unprinted, as a
 * restart remained to say it: the caller prints it where none follows
 * (an interrupt, a node set up apart). */
int hpu__nodejob_cause_unsaid(const hpu_nodejob *j);

/* The latest status record of global rank `rank` and its age
 * (hpu__agent_status); -1 when the rank is not on this node, has sent none
 * or its workers have not started. */
int hpu__nodejob_status(const hpu_nodejob *j, int rank, hpu_status_rec *st, double *age_s);

/* The sentence rank `rank` (one of this node's) said its error exit was
 * for (hpu__agent_why); "" for none. */
const char *hpu__nodejob_why(const hpu_nodejob *j, int rank);

/* Malformed status lines the workers wrote, ignored (agent.h). */
long hpu__nodejob_status_bad(const hpu_nodejob *j);

/* Kills what is left, frees; *j = NULL; safe twice. Not from on_end. */
void hpu__nodejob_destroy(hpu_nodejob **j);

#endif
