/* hpud's own header: the daemon's state and what its files share. Not
 * for hpudlib (conf, outq, joboutput, quarantine, trust: they take what
 * they need as arguments) nor for anything outside daemon/. hpud's files
 * call one way (tests/check_circles.sh):
 *   hpud.c      start-up: options, the first configuration, the loop
 *   requests.c  the socket and the requests: hello, status, cancel, ping
 *   launch.c    the launch request: checks, devices, uid, the node job
 *   control.c   the tick, SIGHUP's reload, SIGTERM's stop; key and user
 *   joblife.c   a job's callbacks and its messages; ended jobs reaped
 *   reply.c     replies packed, signed and sent
 *   jobs.c      the job table and devices
 *   logging.c   log lines, systemd notifications, refusals
 * Each calls only files below it in this list (and hpudlib's). */
#ifndef HPUD_HPUD_H
#define HPUD_HPUD_H

#include <ev.h>
#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/auth.h"
#include "proto/codec.h"
#include "agent/nodejob.h"
#include "agent/zwatch.h"
#include "daemon/conf.h"
#include "daemon/job.h"
#include "daemon/joboutput.h"
#include "daemon/outq.h"
#include "daemon/quarantine.h"

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

typedef struct hpud_state {
	struct ev_loop *loop;
	const char *conf_path;
	hpud_conf conf;
	hpu_auth *auth;
	void *ctx, *sock;
	hpu_zwatch zw;
	/* the socket's monitor: connections it could not accept (no
	 * descriptor left), logged at most once in ACCEPT_LOG_S */
	void *mon;
	hpu_zwatch mzw;
	ev_tstamp accept_logged;
	long accept_failed;
	ev_timer tick;
	ev_tstamp last_tick; /* hpu__mono_s() at the tick before (or at its start) */
	ev_signal sigterm, sigint, sighup;
	ev_prepare reap;
	hpud_jobout out;           /* the jobs' messages to their submitters */
	job jobs[MAX_JOBS];
	char busy[MAX_DEVICES];    /* device -> in use */
	char worker[PATH_MAX];     /* the conf's worker, or hpu-worker here */
	double window_s;           /* the clock_window auth has */
	int set_user;
	uid_t uid;
	gid_t gid;
	int stopping;
	/* refusals are logged at most 20 per second */
	ev_tstamp refuse_window;
	int refused_logged, refused_dropped;
	ev_timer refuse_timer; /* says the dropped count at the window's end */
	/* drawn at start: every request must name it (proto/hpu.proto) */
	char instance[HPU_AUTH_ID_HEX + 1];
	uint64_t seq;              /* of the last frame signed */
	/* counts the keys SIGHUP rotated in: a job launched under the key
	 * before the current one (key_gen one less) may go on with it
	 * (pings, cancels, its messages signed with it) */
	unsigned key_gen;
	int reply_prev;            /* the request being answered was signed
				    * with the previous key: so is the reply */
	int log_level_fixed;       /* --log-level set it: not log_level */
	/* job_uids that no job holds but processes still run under: given to
	 * no job until none is left */
	hpud_quarantine quarantine;
} hpud_state;

/* The daemon (hpud.c). */
extern hpud_state hpud__D;

/* ---- logging.c ---- */
void hpud__apply_log_level(void);
void hpud__logmsg(hpud_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hpud__notify(const char *state);
void hpud__log_refusal(const char *peer, const char *why);

/* ---- jobs.c ---- */
int hpud__free_devices(void);
job *hpud__find_job(const char *id);
void hpud__free_argv(char **argv);
int hpud__own_uids(void);
void hpud__retire_job(job *j);
void hpud__release_job(job *j);

/* ---- reply.c ---- */
size_t hpud__pack_env(const char *session, Hpu__Envelope *env, uint8_t **body);
int hpud__send_body(const hpu_codec_peer *peer, const uint8_t *body, size_t blen);
void hpud__send_env(const hpu_codec_peer *peer, const char *session, Hpu__Envelope *env);
int hpud__peer_prev_key(const hpu_codec_peer *peer);
void hpud__reply_launch(const hpu_codec_peer *peer, const char *session, const char *job_id,
			const job *j, const char *error);

/* ---- joblife.c: the node job's callbacks (hpu_nodejob_cfg) ---- */
void hpud__on_line(hpu_nodejob *nj, int rank, int is_err, const char *line, size_t len,
		   void *arg);
void hpud__on_progress_timer(struct ev_loop *loop, ev_timer *t, int revents);
void hpud__on_status(hpu_nodejob *nj, int rank, const hpu_status_rec *st, void *arg);
void hpud__on_exit_worker(hpu_nodejob *nj, int rank, int pid, int status, void *arg);
void hpud__on_end(hpu_nodejob *nj, int failed, const char *cause, void *arg);
void hpud__on_reap(struct ev_loop *loop, ev_prepare *w, int revents);

/* ---- launch.c ---- */
int hpud__valid_id(const char *s);
void hpud__do_launch(const hpu_codec_peer *peer, const char *addr, const char *session,
		     const Hpu__LaunchRequest *q);

/* ---- requests.c ---- */
int hpud__open_socket(char *err, size_t errlen);
/* Stops the socket's watchers and closes it and its monitor. */
void hpud__close_socket(void);

/* ---- control.c ---- */
void hpud__on_tick(struct ev_loop *loop, ev_timer *t, int revents);
int hpud__load_key(char *err, size_t errlen);
int hpud__resolve_user(const hpud_conf *c, char *err, size_t errlen);
int hpud__find_worker(const hpud_conf *c, char *out, char *err, size_t errlen);
int hpud__count_devices(hpud_conf *c, const char *worker, char *err, size_t errlen);
void hpud__on_hup(struct ev_loop *loop, ev_signal *w, int revents);
void hpud__on_term(struct ev_loop *loop, ev_signal *w, int revents);

#endif
