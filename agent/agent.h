/* agent: starts and supervises one node's worker processes on a libev
 * loop. Shared by hpulaunch (and, later, hpud).
 *
 * Each worker is its own process group (so a signal reaches whatever it
 * starts), dies with the agent (PR_SET_PDEATHSIG), gets the job's
 * environment, and has its stdout and stderr read through pipes and
 * written out line by line with a "[rank N] " prefix (a failed write is
 * said once and counted, output.h). A line longer than 64 KiB goes out in
 * pieces of 64 KiB, each but the last ending in " [hpu: line continues]". A third pipe, on fd
 * HPU_AGENT_STATUS_FD, carries its progress records (the latest kept per
 * rank, malformed lines counted and ignored).
 *
 * What the workers leave behind: the process that starts the workers is a
 * child subreaper (PR_SET_CHILD_SUBREAPER), so a process a worker started
 * that outlives it (in the worker's process group or not: setsid) becomes
 * its child. Once every worker is reaped, their pipes get 1 s to close (at
 * once when the job is being stopped); then they are closed whoever still
 * holds them, and the job's remaining processes get SIGTERM, SIGKILL 2 s
 * later, and are reaped; a line on stderr says how many were ended. Only
 * then does on_idle come. With several agents under way in one process
 * (hpud), a leftover is an agent's when its environment holds the job's
 * HPU_JOB_ID and this attempt's HPU_JOB_TOKEN; one that replaced its
 * environment is ended by the last agent under way to finish, which does
 * not call it its own when an agent ended before it while others were
 * under way (it may be that one's: "left behind by this job or an earlier
 * one"). Where the
 * workers' uid is the job's alone (job_uid_first..job_uid_last, hpud's
 * job_uids), every process under that uid is the job's, wherever it is
 * and whatever its environment (uidproc.h), and one under another uid of
 * the range is never this job's. */
#ifndef HPU_AGENT_H
#define HPU_AGENT_H

#include <ev.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/env.h"
#include "proto/status.h"

typedef struct hpu_agent hpu_agent;

/* The fd on which each worker finds its status pipe; its environment says
 * so as HPU_STATUS_FD (proto/status.h writes the records). */
#define HPU_AGENT_STATUS_FD 3

/* The status on_exit gets for a worker that said "H1" (it speaks the
 * status protocol) and exited with code 0 without its HPU_PHASE_DONE
 * record: it left before the job ended. Never a waitpid status (those are
 * below 0x10000); not 0, so it fails the job like any other exit. */
#define HPU_AGENT_LEFT_EARLY 0x10000

/* A worker's progress is its latest status record (proto/status.h). */

/* The environment variables a job carries to its workers when it is
 * submitted to hpud (the workers read them; hpud's own environment would
 * otherwise stand): LOWER_LIST, FP32_LIST, QUANT_CONFIG, HPUCOLL_SECURITY,
 * OMP_NUM_THREADS, OPENBLAS_NUM_THREADS. HPU_ENV_COUNT ends the list. */
extern const hpu_env_id hpu__job_env[];

typedef struct hpu_agent_cfg {
	int node_rank;    /* this node */
	int nodes;        /* nodes in the job */
	int devices;      /* workers on this node */
	/* The global rank of this node's first worker and the ranks in the
	 * job (nodes may run different numbers of workers); world 0: every
	 * node runs `devices` (rank_base node_rank x devices). */
	int rank_base, world;
	const char *master_addr;
	int master_port;
	const char *job_id;
	const char *token;
	char *const *argv; /* the program to run and its arguments */
	int search_path;   /* look argv[0] up in PATH */
	/* The workers speak the status protocol (hpu-worker): exit(0) from
	 * one that never said hello is HPU_AGENT_LEFT_EARLY too. 0: a worker
	 * that never said hello is judged by its exit status alone. */
	int hpu_workers;
	const char *log_dir; /* also write rank_N.log here (appended to on a
			      * restart), or NULL */
	const char *transport; /* HPUCOLL_TRANSPORT for the workers, or NULL */
	/* The workers' HPU_RESTART_COUNT (this attempt: 0 first) and
	 * HPU_MAX_RESTARTS (restart.h). */
	int restart_count, max_restarts;
	/* "NAME=VALUE" entries (NULL-terminated) set for the workers over
	 * ours, or NULL. */
	char *const *env;
	/* Which devices the workers get (devices entries; NULL: 0, 1, ...):
	 * worker i is pinned by device_ids[i] and sees it as HPU_DEVICE_ID. */
	const int *device_ids;
	/* Run the workers as this user (setgid, setgroups, setuid before
	 * exec) when set_user is 1. */
	int set_user;
	unsigned uid, gid;
	/* With set_user: the range of uids kept for jobs, one each (hpud's
	 * job_uids), which uid is in; 0 and 0 when uid may be shared. Then
	 * the job's end ends every process under uid, its children or not. */
	unsigned job_uid_first, job_uid_last;
	/* Optional: a worker's output line (without newline or prefix) goes
	 * here instead of to this process's stdout/stderr (the rank's log
	 * file still gets it). is_err: it came from the worker's stderr. */
	void (*on_line)(hpu_agent *a, int rank, int is_err, const char *line,
			size_t len, void *arg);
	/* Optional: a worker sent a status record (already stored, see
	 * hpu__agent_status). A worker's last records come before its
	 * on_exit. */
	void (*on_status)(hpu_agent *a, int rank, const hpu_status_rec *st, void *arg);
	/* Called when a worker has been reaped. status as from waitpid, or
	 * HPU_AGENT_LEFT_EARLY. */
	void (*on_exit)(hpu_agent *a, int rank, pid_t pid, int status, void *arg);
	/* Optional: a live hpu-worker (it said a keepalive, "K1") whose status
	 * pipe has been silent for `silent_s` seconds, past the limit: its keepalive
	 * (proto/status.h) stopped, so the process is stopped or frozen as a
	 * whole. The limit is HPUCOLL_TIMEOUT_MS (the workers', default 60
	 * s) once a worker of this node has finished (exited 0 done: no
	 * collective of the others can find it any more), twice that
	 * before. `after_peer`: one had finished. Called once a worker. */
	void (*on_silent)(hpu_agent *a, int rank, pid_t pid, double silent_s, int after_peer,
			  void *arg);
	/* Called once every worker is reaped, its output drained and what it
	 * left behind ended. */
	void (*on_idle)(hpu_agent *a, void *arg);
	void *arg;
} hpu_agent_cfg;

/* Makes an agent; nothing starts yet. cfg's strings must outlive it. */
hpu_agent *hpu__agent_new(struct ev_loop *loop, const hpu_agent_cfg *cfg);

/* Starts every worker. Returns 0, or -1 with a sentence in err (workers
 * already started are stopped). */
int hpu__agent_start(hpu_agent *a, char *err, size_t errlen);

/* Sends SIGTERM to every live worker's process group, and SIGKILL to those
 * still alive after `grace_s` seconds (at once when grace_s <= 0, also on
 * a later call). Once the workers are gone, ends what they left behind at
 * once (SIGKILL when grace_s <= 0). Safe to call more than once. */
void hpu__agent_stop(hpu_agent *a, double grace_s);

/* Stops (hold 1) or resumes (0) reading the workers' stdout and stderr,
 * for an on_line whose reader cannot keep up: a worker that fills its
 * pipe then blocks in write (back-pressure) and nothing is lost. Once the
 * workers are gone their pipes are read to the end, held or not. */
void hpu__agent_hold_output(hpu_agent *a, int hold);

/* Workers not yet reaped. */
int hpu__agent_live(const hpu_agent *a);

/* The global rank of local worker `local`. */
int hpu__agent_rank(const hpu_agent *a, int local);

/* The latest status record of global rank `rank` (one of this node's) in
 * *st and the seconds since it came in *age_s. Returns 0, or -1 when the
 * rank is not on this node or has sent none yet. */
int hpu__agent_status(const hpu_agent *a, int rank, hpu_status_rec *st, double *age_s);

/* The sentence rank `rank` (one of this node's) said its error exit was
 * for (hpu__status_error, on its status pipe), which the other nodes'
 * closing error repeats; "" for none or a rank not on this node. */
const char *hpu__agent_why(const hpu_agent *a, int rank);

/* 1 when rank `rank` (one of this node's) said hello on its status pipe
 * (it is an hpu-worker), else 0. */
int hpu__agent_said_hello(const hpu_agent *a, int rank);

/* The rank that rank `rank` (one of this node's) blamed for its failure
 * (hpu__status_blame) and *how; -1 when it blamed none. */
int hpu__agent_culprit(const hpu_agent *a, int rank, hpu_blame *how);

/* Status lines ignored because they were malformed (or over-long). */
long hpu__agent_status_bad(const hpu_agent *a);

/* Removes what this node's workers may have left behind when they died:
 * the job's shared-memory segment /dev/shm/hpucoll-<job>-<session>-n<node>
 * and the ZeroMQ ipc files /tmp/hpucoll-<job>-r<rank>, each only when it
 * is the workers' user's (lstat: a link is judged by its own owner and
 * never followed). Returns how many. */
int hpu__agent_cleanup(const hpu_agent *a);

/* Removes the ZeroMQ ipc files /tmp/hpucoll-<job>-r<rank> that jobs which
 * ended without cleaning up left (their hpulaunch or hpud killed with
 * SIGKILL, the workers then too): sockets of the workers' user, older than
 * HPU_AGENT_IPC_STALE_S seconds, that no socket of this network namespace
 * is bound to (/proc/net/unix) and where connecting is refused (nothing
 * listens: not a job of another namespace), with the lock file beside
 * each (PATH.lock), and lock files whose ipc file is gone, older than
 * that, that no process holds. hpu__agent_start calls it.
 * Lists the names removed in names (cut with "..."); returns how many. */
#define HPU_AGENT_IPC_STALE_S 60
int hpu__agent_sweep_ipc(const hpu_agent *a, char *names, size_t len);

/* Kills what is left (SIGKILL), workers and what they left behind, reaps
 * it, cleans up after it (hpu__agent_cleanup), frees; *a = NULL; safe
 * twice. */
void hpu__agent_destroy(hpu_agent **a);

/* "exited with code 3" / "was killed by signal 9 (Killed)" / "exited with
 * code 0 before the job ended" (HPU_AGENT_LEFT_EARLY). */
void hpu__describe_status(int status, char *out, size_t outlen);

/* Where a worker was by its latest status record (step: optimizer steps
 * done, of total when total > 0; phase HPU_PHASE_*): "during setup, before
 * step 1 of 20", "in step 3 of 20", "in evaluation, after step 20 of 20",
 * "after step 20 of 20". */
void hpu__describe_position(long step, long total, int phase, char *out, size_t outlen);

/* The failure of rank `reporter` because of rank `culprit`, as
 * hpu__status_blame said: "rank 3 (node 1, pid 7) died; rank 0 found it
 * gone" ("died or its node became unreachable" when `apart`: the two
 * ranks run on different nodes, where a network partition reads the same), "rank 1 (node 0, pid 7) stopped answering during setup, before
 * step 1 of 20; rank 0 gave up waiting for it", "rank 2 (...) failed first
 * (its own error says why); rank 0 stopped because of it". who: " (node 1, pid 7)"
 * or ""; where: a position (hpu__describe_position) or "". */
void hpu__describe_blame(int culprit, hpu_blame how, const char *who, const char *where,
			 int reporter, int apart, char *out, size_t outlen);

#endif
