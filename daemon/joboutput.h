/* joboutput: the way of a job's messages to its submitter. Each message
 * is packed into the job's queue (outq.h) and handed to ZeroMQ while the
 * submitter's connection has room; ZeroMQ tells no one when it has room
 * again, so a drain timer tries again for the jobs whose messages wait.
 * A queue past output_buffer holds the job's workers' output
 * (back-pressure); a submitter that takes none of it for a while stalls
 * the queue (hpud__jobout_stall): the lines are dropped, counted, and
 * notices go out in their place.
 *
 * hpud fills in the fields above `drain` and calls hpud__jobout_init. */
#ifndef HPUD_JOBOUTPUT_H
#define HPUD_JOBOUTPUT_H

#include <ev.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/codec.h"
#include "daemon/conf.h"
#include "daemon/job.h"

/* hpud__jobout_send's `rank` for a message that is not an output line: */
#define HPUD_JOB_CONTROL (-2)  /* never dropped */
#define HPUD_JOB_PROGRESS (-1) /* dropped past output_buffer, uncounted */

typedef struct hpud_jobout {
	struct ev_loop *loop;
	const hpud_conf *conf;     /* its output_buffer, read at each use */
	hpud_job *jobs;            /* the job table, which the drain goes through */
	int njobs;
	ev_prepare *reap;          /* started once an ended job's last message left */
	/* Packs env for the submitter's `session` (no sequence number yet)
	 * into *body (malloc'd; NULL without memory); returns its length. */
	size_t (*pack)(const char *session, Hpu__Envelope *env, uint8_t **body);
	/* Signs a packed body and hands it to ZeroMQ for peer: 0 when sent,
	 * 1 when the queue to the peer is full (nothing sent), -1 when the
	 * frame was dropped. */
	int (*send)(const hpu_codec_peer *peer, const uint8_t *body, size_t len);
	void (*log)(hpud_log_level lvl, const char *fmt, ...)
		__attribute__((format(printf, 2, 3)));
	ev_timer drain;            /* while a job's messages wait for room ... */
	double drain_after;        /* ... tried again after this */
	long drained;              /* messages that left the jobs' queues */
} hpud_jobout;

/* Readies the drain timer (not started). */
void hpud__jobout_init(hpud_jobout *o);

/* A message for j's submitter: an output line of `rank` (>= 0, text_len
 * bytes of text), HPUD_JOB_PROGRESS or HPUD_JOB_CONTROL; queued, then
 * sent if it can. */
void hpud__jobout_send(hpud_jobout *o, hpud_job *j, Hpu__Envelope *env, int rank,
		       size_t text_len);

/* A worker's line (is_err: from its stderr) to the submitter: all of it queued, unless the queue
 * is stalled (then kept as the rank's last, outq.h); flushed. */
void hpud__jobout_line(hpud_jobout *o, hpud_job *j, int rank, int is_err, const char *line,
		       size_t len);

/* The submitter has taken none of j's output for `silent` seconds while
 * its workers' output was held (or it is gone): the output is read again
 * and dropped, counted, until the submitter has taken half the queue. */
void hpud__jobout_stall(hpud_jobout *o, hpud_job *j, double silent);

/* j ends: the notices of its drops not yet sent are queued (before the
 * end), and its drops in all are logged. */
void hpud__jobout_ending(hpud_jobout *o, hpud_job *j);

#endif
