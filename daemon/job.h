/* job: one job's part on this node, an entry of hpud's job table
 * (daemon/hpud.h), whose messages to the submitter joboutput.h queues and
 * sends. */
#ifndef HPUD_JOB_H
#define HPUD_JOB_H

#include <ev.h>
#include <sys/types.h>

#include "proto/codec.h"
#include "agent/nodejob.h"
#include "daemon/outq.h"

#define HPUD_MAX_DEVICES 1024

typedef struct hpud_job {
	int used, ended;
	char id[64];
	char token[129];
	char master_addr[256];
	char transport[8];
	int node_rank, nodes, devices;
	int *node_devices;         /* every node's workers, or NULL: devices */
	int rank_base;             /* the rank of its first worker here */
	int restart_count, max_restarts; /* hpulaunch --max-restarts */
	int dev[HPUD_MAX_DEVICES];
	char **argv;               /* worker program + the request's argv */
	char **env;                /* the request's env (NULL-terminated) */
	hpu_codec_peer peer;       /* the submitter's routing id ... */
	char session[64];          /* ... and session (its frames name it) */
	char peer_addr[64];
	ev_tstamp started, last_ping;
	ev_tstamp progress_at;     /* rank 0's last record sent then ... */
	int progress_phase;        /* ... in this phase */
	int progress_pending;      /* a newer record waits for its turn ... */
	ev_timer progress_timer;   /* ... which comes then */
	hpu_nodejob *nj;
	hpud_outq out;             /* messages the submitter has yet to take */
	int held;                  /* out is full: the workers' output is not read */
	ev_tstamp out_moved;       /* a message left out, or it filled, then */
	double stalled_s;          /* the submitter took nothing for this long */
	uid_t uid;                 /* its workers' uid (job_uids, else D.uid) */
	int peer_gone;             /* its submitter went away (no pings) */
	unsigned key_gen;          /* hpud's key when it was launched (hpud.h) */
	int prev_key_said;         /* the log said its submitter signs with the
				    * previous key */
} hpud_job;

#endif
