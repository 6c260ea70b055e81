/* coord: the job's coordinator, inside node 0's hpulaunch, bound at
 * MASTER_ADDR:MASTER_PORT (ZeroMQ ROUTER, protobuf-c messages).
 *
 * Workers Join with the job id and token (this attempt's, restart.h); once
 * every rank has joined, each gets the rank table. Remote agents (hpulaunch
 * on the other nodes) say hello with the job's token and their attempt,
 * exchange heartbeats, report worker failures and completion. Any failure
 * becomes an Abort sent to every agent, and a rank that never joins
 * becomes an abort naming it after join_timeout_s. */
#ifndef HPU_COORD_H
#define HPU_COORD_H

#include <ev.h>
#include <stddef.h>
#include <string.h>

#include "proto/status.h"

typedef struct hpu_coord hpu_coord;

/* How the ABORT a refused agent gets begins: the agent says it was
 * refused, not that the job was aborted (node 0's may go on). */
#define HPU_COORD_REFUSED "refused this node: "

/* How a node's reason for ending the job begins when a user interrupted
 * its hpulaunch (Ctrl-C, SIGTERM, SIGHUP): no node restarts the job. */
#define HPU_INTERRUPTED "interrupted by "

/* 1 when `reason` (a node's, "node N: ..." or bare) says a user
 * interrupted a node's hpulaunch. */
static inline int hpu__coord_reason_interrupted(const char *reason)
{
	if (!reason)
		return 0;
	if (!strncmp(reason, "node ", 5)) {
		const char *p = reason + 5;
		while (*p >= '0' && *p <= '9')
			p++;
		if (p > reason + 5 && p[0] == ':' && p[1] == ' ')
			reason = p + 2;
	}
	return !strncmp(reason, HPU_INTERRUPTED, sizeof HPU_INTERRUPTED - 1);
}

typedef struct hpu_coord_cfg {
	const char *bind_addr; /* numeric IPv4 address to bind */
	int port;              /* 0: pick a free one */
	const char *job_id, *token;
	/* Which attempt of the job this is (restart.h): workers must present
	 * hpu__attempt_token(token, restart_count), agents the token and this
	 * restart_count; those of other attempts are refused or ignored. */
	int restart_count;
	/* hpulaunch --max-restarts: an agent saying another is refused */
	int max_restarts;
	/* hpulaunch --transport (NULL: auto): an agent saying another is refused */
	const char *transport;
	int nodes, devices;
	/* The workers of every node (nodes entries), when they differ; NULL:
	 * `devices` on each. An agent must run its node's number. */
	const int *node_devices;
	double join_timeout_s;  /* every rank must have joined by then */
	double agent_timeout_s; /* a silent remote agent is dead after this */
	/* The job must end: `reason` says why (already printed once). */
	void (*on_abort)(hpu_coord *c, const char *reason, void *arg);
	/* Every node reported success. */
	void (*on_done)(hpu_coord *c, void *arg);
	/* Optional: where rank `rank` is, if it is one of this node's and
	 * has reported (hpu__describe_position into out); else out
	 * gets "". */
	void (*where)(int rank, char *out, size_t outlen, void *arg);
	void *arg;
} hpu_coord_cfg;

/* Binds and starts serving on `loop`. Returns NULL with a sentence in err. */
hpu_coord *hpu__coord_new(struct ev_loop *loop, const hpu_coord_cfg *cfg,
			  char *err, size_t errlen);

/* The port it is bound to. */
int hpu__coord_port(const hpu_coord *c);

/* 1 when it aborted the job because a node's hpulaunch was set up
 * otherwise than node 0's (--nodes, --devices, --max-restarts): a restart
 * would meet the same refusal. */
int hpu__coord_set_up_apart(const hpu_coord *c);

/* 1 when another node's hpulaunch ended the job because a user
 * interrupted it (HPU_INTERRUPTED): not to be restarted here either. */
int hpu__coord_interrupted(const hpu_coord *c);

/* Aborts the job for `reason`: tells every agent and waiting worker, then
 * calls on_abort. Only the first abort counts. */
void hpu__coord_abort(hpu_coord *c, const char *reason);

/* The cause of a failure that rank `reporter` put on rank `culprit` (it
 * died, stopped answering, failed first: hpu__status_blame), named with the culprit's
 * node, pid and host from the rank table, into out
 * (hpu__describe_blame). */
void hpu__coord_blame(const hpu_coord *c, int culprit, hpu_blame how, int reporter, char *out,
		      size_t outlen);

/* Node `node_rank`'s workers all finished successfully. */
void hpu__coord_node_done(hpu_coord *c, int node_rank);

/* Closes the socket and frees; *c = NULL; safe twice. */
void hpu__coord_destroy(hpu_coord **c);

#endif
