/* joboutput: the way of a job's messages to its submitter (joboutput.h). */
#include "daemon/joboutput.h"
#include "common/clock.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/num.h"
#include "daemon/outq.h"

#define DRAIN_MIN_S 0.001        /* a full queue to a peer is tried again after
				  * this, twice as long after each try that
				  * sent nothing ... */
#define DRAIN_MAX_S 0.05         /* ... up to this (a stalled submitter) */
#define LINE_PIECE (32 * 1024)   /* of a line's text per LogLine: a frame
				  * stays under HPU_AUTH_MAX_FRAME */

/* Stops (hold 1) or resumes reading j's workers' output: back-pressure
 * while its queue to the submitter is past output_buffer. */
static void hold_output(hpud_jobout *o, hpud_job *j, int hold)
{
	(void)o;
	if (j->held == hold)
		return;
	j->held = hold;
	if (hold)
		j->out_moved = hpu__mono_s(); /* the wait for the submitter starts */
	if (j->nj)
		hpu__nodejob_hold_output(j->nj, hold);
}

/* Packs env into j's queue (daemon/outq.h): an output line of `rank`
 * (>= 0, text_len bytes of text) unless the queue is stalled, a progress
 * record (HPUD_JOB_PROGRESS) while the queue keeps within output_buffer,
 * anything else (HPUD_JOB_CONTROL) always. A queue past output_buffer holds
 * the workers' output until it has drained to half. Returns 1 if
 * queued. */
static int queue_env(hpud_jobout *o, hpud_job *j, Hpu__Envelope *env, int rank,
		     size_t text_len)
{
	if (rank >= 0 && hpud__outq_dropping(&j->out)) {
		hpud__outq_count_drop(&j->out, rank, text_len); /* not even packed */
		return 0;
	}
	uint8_t *body = NULL;
	size_t blen = o->pack(j->session, env, &body);
	if (!body) {
		o->log(HPUD_LOG_ERROR, "job %s: a message to the submitter was lost: out of memory",
		       j->id);
		return 0;
	}
	int queued = rank == HPUD_JOB_CONTROL ? hpud__outq_push(&j->out, body, blen) == 0
		     : rank == HPUD_JOB_PROGRESS
			 ? hpud__outq_push_record(&j->out, o->conf->output_buffer, body, blen)
			 : hpud__outq_push_line(&j->out, rank, text_len, body, blen);
	if (queued && rank >= 0 && hpud__outq_full(&j->out, o->conf->output_buffer))
		hold_output(o, j, 1);
	return queued;
}

/* Queues rank's line, in pieces of LINE_PIECE bytes when it is longer
 * (LogLine.more: the submitter joins them), as queue_env's `how`: rank
 * (an output line) or HPUD_JOB_CONTROL (never dropped). A NUL byte, which
 * would end the text (a protobuf string), goes as "^@" (cat -v). */
static void queue_line(hpud_jobout *o, hpud_job *j, int rank, int is_err, const char *line,
		       size_t len, int how)
{
	static char text[2 * LINE_PIECE + 1];
	size_t off = 0;
	do {
		size_t n = len - off < LINE_PIECE ? len - off : LINE_PIECE, t = 0;
		for (size_t i = 0; i < n; i++) {
			char c = line[off + i];
			text[t++] = c ? c : '^';
			if (!c)
				text[t++] = '@';
		}
		text[t] = 0;
		off += n;
		Hpu__LogLine l = HPU__LOG_LINE__INIT;
		l.job_id = j->id;
		l.rank = (uint32_t)rank;
		l.text = text;
		l.more = off < len;
		l.err = is_err != 0; /* the submitter prints it to its stderr */
		Hpu__Envelope env = HPU__ENVELOPE__INIT;
		env.msg_case = HPU__ENVELOPE__MSG_LOG_LINE;
		env.log_line = &l;
		queue_env(o, j, &env, how, t);
	} while (off < len);
}

/* One notice per rank whose output lines were dropped since its last,
 * queued where the lines would have been, followed by the rank's last
 * line (kept: the end of a training is not lost with the rest). */
static void queue_drop_notices(hpud_jobout *o, hpud_job *j)
{
	int rank;
	hpud_outq_drops d;
	char text[300], sz[32];
	while (hpud__outq_take_drops(&j->out, &rank, &d)) {
		if (d.lines) {
			snprintf(text, sizeof text,
				 "[hpud: %lld lines (%s) of this rank's output dropped: the submitter took none of it for %.0f s]",
				 d.lines, hpu__human_size(sz, sizeof sz, (double)d.bytes), j->stalled_s);
			Hpu__LogLine l = HPU__LOG_LINE__INIT;
			l.job_id = j->id;
			l.rank = (uint32_t)rank;
			l.text = text;
			Hpu__Envelope env = HPU__ENVELOPE__INIT;
			env.msg_case = HPU__ENVELOPE__MSG_LOG_LINE;
			env.log_line = &l;
			queue_env(o, j, &env, HPUD_JOB_CONTROL, 0);
		}
		if (d.last)
			queue_line(o, j, rank, d.last_err, d.last, d.last_len, HPUD_JOB_CONTROL);
		free(d.last);
	}
}

void hpud__jobout_stall(hpud_jobout *o, hpud_job *j, double silent)
{
	char sz[32];
	j->stalled_s = silent;
	hpud__outq_stall(&j->out);
	hold_output(o, j, 0);
	o->log(HPUD_LOG_WARN, "job %s: the submitter (%s) took none of its output for %.0f s with output_buffer (%s) full: its output is dropped and counted until it reads again",
	       j->id, j->peer_addr, silent,
	       hpu__human_size(sz, sizeof sz, (double)o->conf->output_buffer));
}

/* Hands j's queued messages to ZeroMQ, oldest first, while its queue to
 * the submitter has room. After drops, once the queue has drained to half
 * of output_buffer, the notices take the lines' place. An ended job whose
 * last message has left is released (on_reap). Returns 1 when messages
 * are left for lack of room (the drain timer is for them), else 0. */
static int flush_job(hpud_jobout *o, hpud_job *j)
{
	const hpud_outq_msg *m;
	while ((m = hpud__outq_peek(&j->out))) {
		if (o->send(&j->peer, m->body, m->len) == 1)
			return 1;
		hpud__outq_pop(&j->out);
		o->drained++;
		j->out_moved = hpu__mono_s();
		if (hpud__outq_caught_up(&j->out, o->conf->output_buffer))
			queue_drop_notices(o, j);
		if (j->held && hpud__outq_room(&j->out, o->conf->output_buffer))
			hold_output(o, j, 0);
	}
	if (j->ended)
		ev_prepare_start(o->loop, o->reap);
	return 0;
}

/* ZeroMQ tells no one when a peer's queue has room again: the jobs whose
 * messages wait are tried again DRAIN_MIN_S later, and less often while
 * nothing leaves (up to DRAIN_MAX_S apart). */
static void drain_later(hpud_jobout *o, double after)
{
	o->drain_after = after;
	ev_timer_stop(o->loop, &o->drain);
	ev_timer_set(&o->drain, after, 0);
	ev_timer_start(o->loop, &o->drain);
}

static void on_drain(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	hpud_jobout *o = t->data;
	long before = o->drained;
	int waiting = 0;
	for (int i = 0; i < o->njobs; i++)
		if (o->jobs[i].used && hpud__outq_peek(&o->jobs[i].out))
			waiting |= flush_job(o, &o->jobs[i]);
	if (waiting)
		drain_later(o, o->drained > before ? DRAIN_MIN_S
				  : o->drain_after * 2 < DRAIN_MAX_S ? o->drain_after * 2
								     : DRAIN_MAX_S);
}

void hpud__jobout_send(hpud_jobout *o, hpud_job *j, Hpu__Envelope *env, int rank,
		       size_t text_len)
{
	if (queue_env(o, j, env, rank, text_len) && flush_job(o, j) &&
	    !ev_is_active(&o->drain))
		drain_later(o, DRAIN_MIN_S);
}

void hpud__jobout_init(hpud_jobout *o)
{
	ev_timer_init(&o->drain, on_drain, DRAIN_MIN_S, 0);
	o->drain.data = o;
}

void hpud__jobout_line(hpud_jobout *o, hpud_job *j, int rank, int is_err, const char *line,
		       size_t len)
{
	if (hpud__outq_dropping(&j->out)) {
		hpud__outq_keep_line(&j->out, rank, is_err, line, len);
		return;
	}
	queue_line(o, j, rank, is_err, line, len, rank);
	if (flush_job(o, j) && !ev_is_active(&o->drain))
		drain_later(o, DRAIN_MIN_S);
}

void hpud__jobout_ending(hpud_jobout *o, hpud_job *j)
{
	if (hpud__outq_has_drops(&j->out))
		queue_drop_notices(o, j);
	if (j->out.total.lines) {
		char sz[32];
		o->log(HPUD_LOG_WARN, "job %s: %lld lines (%s) of its output were dropped in all: the submitter (%s) took none of it for %.0f s",
		       j->id, j->out.total.lines,
		       hpu__human_size(sz, sizeof sz, (double)j->out.total.bytes), j->peer_addr,
		       j->stalled_s);
	}
}
