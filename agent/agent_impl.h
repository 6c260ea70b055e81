/* agent_impl: the agent's state and what its files share (agent.h is
 * the library's header; this one is for agent/ alone: other folders
 * include the rest, tests/check_includes.sh). Its files call one way
 * (tests/check_circles.sh):
 *   agent.c      making, starting, stopping, cleaning up, freeing
 *   spawn.c      a worker's environment, fork and exec, its pipes
 *   streams.c    the workers' output; a worker reaped; the end of the
 *                job's processes (drain, then sweep.c) and on_idle
 *   sweep.c      what the workers left behind: found, ended, reported
 *   statuspipe.c a worker's status records
 * Each calls only files below it in this list (and sweep.c uidproc.c):
 * agent.c spawn.c and streams.c, spawn.c streams.c and statuspipe.c,
 * streams.c sweep.c and statuspipe.c. */
#ifndef HPU_AGENT_IMPL_H
#define HPU_AGENT_IMPL_H

#include <ev.h>
#include <sys/types.h>

#include "agent/agent.h"
#include "proto/status.h"

#define LINE_MAX_BYTES 65536

/* After the last worker exits, its pipes get DRAIN_S to close (a helper
 * that outlives it may still be writing); then they are closed, and what
 * the workers left behind gets SIGTERM, SIGKILL LEFTOVER_GRACE_S later,
 * looked for every SWEEP_S, given up on GIVE_UP_S after the SIGKILL. */
#define DRAIN_S 1.0
#define LEFTOVER_GRACE_S 2.0
#define SWEEP_S 0.05
#define GIVE_UP_S 5.0

/* Distinct pids, for the log. */
typedef struct pidset {
	pid_t *v;
	int n, cap;
} pidset;

/* One of a worker's output streams. */
typedef struct stream {
	ev_io io;
	int fd;
	int out_fd;  /* where prefixed lines go: 1 or 2 */
	char buf[LINE_MAX_BYTES];
	size_t len;
	struct worker *w;
} stream;

/* A worker's status pipe: records, one a line (hpu__status_parse). */
typedef struct status_pipe {
	ev_io io;
	int fd;
	char buf[512];
	size_t len;
	int skipping;            /* inside an over-long line: drop to its end */
	struct worker *w;
} status_pipe;

typedef struct worker {
	hpu_agent *a;
	int local, rank;
	pid_t pid;
	int reaped;
	ev_child child;
	stream out, err;
	status_pipe st;
	int hello;               /* it said "H1": it speaks the protocol */
	ev_tstamp heard_at;      /* its last line of any kind (0: none yet) */
	int silent_said;         /* on_silent called for it */
	int keepalive;           /* it said "K1": its silence means it stopped */
	int stuck_said;          /* "has not exited ... after SIGKILL" said */
	hpu_status_rec last;    /* the latest record ... */
	ev_tstamp last_at;       /* ... and when it came (0: none yet) */
	int culprit;             /* its blame line (hpu__status_blame): -1 none */
	hpu_blame culprit_how;
	int log_fd;
	char log_path[1024];     /* log_fd's (--log-dir) */
	char prefix[32];
	size_t prefix_len;
	char why[HPU_STATUS_WHY_MAX + 1]; /* its error sentence ("E1 WHY") */
} worker;

struct hpu_agent {
	struct ev_loop *loop;
	hpu_agent_cfg cfg;
	worker *w;
	int live;     /* not yet reaped */
	int open;     /* output streams not yet at EOF */
	int started;  /* hpu__agent_start ran */
	int stopping;
	int impatient; /* stopped with no grace: SIGKILL what is left at once */
	int idle_sent;
	int held;     /* the workers' output is not read (hpu__agent_hold_output) */
	long status_bad;  /* malformed status lines */
	ev_timer kill_timer;
	ev_tstamp sigkill_at;   /* the kill timer's SIGKILL (0: not yet) */
	/* the silence watch (statuspipe.c): a worker whose keepalive stopped */
	ev_timer silence_timer;
	ev_tstamp silence_last; /* the watch's last run */
	double silence_limit_s; /* HPUCOLL_TIMEOUT_MS in seconds */
	int finished;           /* workers that exited 0, done */
	/* What the workers left behind (see hpu_agent.h): */
	int draining;     /* every worker is reaped; their pipes may still be open */
	int ending;       /* ending the processes they left */
	int swept;        /* done with that */
	ev_tstamp kill_at, give_up_at;
	ev_timer drain_timer, sweep_timer;
	pidset ended;     /* the processes signalled (distinct), for the log: */
	pidset unsure;    /* ... and those that may be an earlier job's */
	struct hpu_agent *next; /* every agent of this process */
};

/* Every agent of this process (agent.c). */
extern hpu_agent *hpu__agents;

/* ---- statuspipe.c: the silence watch ---- */
void hpu__agent_silence_start(hpu_agent *a);
void hpu__agent_silence_stop(hpu_agent *a);

/* ---- spawn.c ---- */
int hpu__agent_spawn(hpu_agent *a, worker *w, char *err, size_t errlen);

/* ---- streams.c ---- */
void hpu__agent_on_output(struct ev_loop *loop, ev_io *io, int revents);
void hpu__agent_end_leftovers(hpu_agent *a);
void hpu__agent_end_leftovers_now(hpu_agent *a);
void hpu__agent_on_child(struct ev_loop *loop, ev_child *c, int revents);

/* ---- sweep.c ---- */
int hpu__agent_sweep(hpu_agent *a, int sig);
void hpu__agent_report_leftovers(const hpu_agent *a, int left);

/* ---- statuspipe.c ---- */
void hpu__agent_status_read(status_pipe *sp);
void hpu__agent_on_status_pipe(struct ev_loop *loop, ev_io *io, int revents);

#endif
