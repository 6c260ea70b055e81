/* The workers' output and their end (agent.h): stdout and stderr read
 * and written out line by line, held and resumed; a worker reaped; once
 * the last is, its pipes drained, closed, and what the workers left
 * behind ended (sweep.c) before on_idle. Closing the last pipe and ending
 * the leftovers call each other, so both live here. Calls sweep.c and
 * statuspipe.c (agent/agent_impl.h). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/output.h"
#include "common/clock.h"
#include "agent/agent_impl.h"

static void maybe_idle(hpu_agent *a)
{
	if (a->live || a->open || !a->swept || a->idle_sent)
		return;
	a->idle_sent = 1;
	ev_timer_stop(a->loop, &a->kill_timer);
	if (a->cfg.on_idle)
		a->cfg.on_idle(a, a->cfg.arg);
}

/* The mark at the end of a piece of a line longer than the buffer: the
 * line goes on in the next one (nothing of it is dropped). */
#define CONTINUES " [hpu: line continues]"

/* A worker's line (or, `more`, a piece of an over-long one) to its
 * destination (on_line, else our stdout or stderr) and to its log file. A
 * log file that cannot be written is said once (output.h) and closed. */
static void emit(stream *s, const char *line, size_t n, int more)
{
	worker *w = s->w;
	const hpu_agent_cfg *c = &w->a->cfg;
	char out[LINE_MAX_BYTES + 128];
	size_t len = w->prefix_len;
	memcpy(out, w->prefix, len);
	memcpy(out + len, line, n);
	len += n;
	if (more) {
		memcpy(out + len, CONTINUES, sizeof CONTINUES - 1);
		len += sizeof CONTINUES - 1;
	}
	out[len] = '\n';
	if (c->on_line)
		c->on_line(w->a, w->rank, s->out_fd == 2, out + w->prefix_len,
			   len - w->prefix_len, c->arg);
	else
		hpu__output_std(s->out_fd, out, len + 1);
	if (w->log_fd >= 0 && hpu__output_file(w->log_fd, w->log_path, out, len + 1) < 0) {
		close(w->log_fd);
		w->log_fd = -1;
	}
}

/* Writes out every complete line in the buffer (all of it at EOF); a
 * full buffer without a newline goes out as a piece marked CONTINUES. */
static void flush_lines(stream *s, int eof)
{
	size_t start = 0;
	for (size_t i = 0; i < s->len; i++) {
		if (s->buf[i] == '\n') {
			emit(s, s->buf + start, i - start, 0);
			start = i + 1;
		}
	}
	if (start == 0 && s->len == sizeof s->buf) {
		emit(s, s->buf, s->len, !eof); /* an over-long line: a piece */
		start = s->len;
	} else if (eof && start < s->len) {
		emit(s, s->buf + start, s->len - start, 0);
		start = s->len;
	}
	memmove(s->buf, s->buf + start, s->len - start);
	s->len -= start;
}


static void close_stream(hpu_agent *a, stream *s)
{
	flush_lines(s, 1);
	ev_io_stop(a->loop, &s->io);
	close(s->fd);
	s->fd = -1;
	a->open--;
	if (a->draining && !a->open)
		hpu__agent_end_leftovers(a); /* the workers' pipes are closed: no more to wait for */
}

/* Reads what the stream holds (at most `max` reads; none more once the
 * output is held, but at the end); closes it at EOF or an error. */
static void read_stream(hpu_agent *a, stream *s, long max)
{
	for (long n = 0; s->fd >= 0 && n < max && !(a->held && !a->ending); n++) {
		ssize_t k = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
		if (k > 0) {
			s->len += (size_t)k;
			flush_lines(s, 0);
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN)
			return;
		close_stream(a, s); /* EOF or error */
	}
}

void hpu__agent_on_output(struct ev_loop *loop, ev_io *io, int revents)
{
	(void)loop;
	(void)revents;
	stream *s = io->data;
	read_stream(s->w->a, s, LONG_MAX);
}

void hpu__agent_hold_output(hpu_agent *a, int hold)
{
	hold = !!hold;
	if (a->held == hold)
		return;
	a->held = hold;
	for (int i = 0; a->started && i < a->cfg.devices; i++) {
		stream *ss[2] = {&a->w[i].out, &a->w[i].err};
		for (int k = 0; k < 2; k++) {
			if (ss[k]->fd < 0)
				continue;
			if (hold)
				ev_io_stop(a->loop, &ss[k]->io);
			else
				ev_io_start(a->loop, &ss[k]->io);
		}
	}
}

static void finish_leftovers(hpu_agent *a, int left)
{
	ev_timer_stop(a->loop, &a->sweep_timer);
	a->ending = 0;
	a->swept = 1;
	hpu__agent_report_leftovers(a, left);
	maybe_idle(a);
}

static void sweep_once(hpu_agent *a)
{
	ev_tstamp now = hpu__mono_s();
	int left = hpu__agent_sweep(a, now >= a->kill_at ? SIGKILL : SIGTERM);
	if (left == 0 || now >= a->give_up_at)
		finish_leftovers(a, left);
}

static void on_sweep_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	sweep_once(t->data);
}

/* Closes the workers' pipes (after reading what they hold) and starts
 * ending what the workers left behind; on_idle comes when that is done. */
void hpu__agent_end_leftovers(hpu_agent *a)
{
	if (a->ending || a->swept)
		return;
	a->ending = 1;
	ev_timer_stop(a->loop, &a->drain_timer);
	for (int i = 0; i < a->cfg.devices; i++) {
		stream *ss[2] = {&a->w[i].out, &a->w[i].err};
		for (int k = 0; k < 2; k++) {
			read_stream(a, ss[k], 64);
			if (ss[k]->fd >= 0)
				close_stream(a, ss[k]);
		}
	}
	a->kill_at = hpu__mono_s() + (a->impatient ? 0 : LEFTOVER_GRACE_S);
	a->give_up_at = a->kill_at + GIVE_UP_S;
	ev_timer_init(&a->sweep_timer, on_sweep_timer, SWEEP_S, SWEEP_S);
	a->sweep_timer.data = a;
	ev_timer_start(a->loop, &a->sweep_timer);
	sweep_once(a);
}

static void on_drain_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	hpu__agent_end_leftovers(t->data);
}

/* The last worker is reaped: its pipes get DRAIN_S to close unless the job
 * is being stopped; then what the workers left behind is ended. */
static void workers_done(hpu_agent *a)
{
	hpu__agent_silence_stop(a);
	a->draining = 1;
	if (a->stopping || !a->open) {
		hpu__agent_end_leftovers(a);
		return;
	}
	ev_timer_init(&a->drain_timer, on_drain_timer, DRAIN_S, 0);
	a->drain_timer.data = a;
	ev_timer_start(a->loop, &a->drain_timer);
}

/* The same at once, without the loop (hpu__agent_destroy): SIGKILL and reap
 * until nothing is left, for GIVE_UP_S at most. */
void hpu__agent_end_leftovers_now(hpu_agent *a)
{
	int left = 0;
	for (int i = 0; i < (int)(GIVE_UP_S * 100); i++) {
		if ((left = hpu__agent_sweep(a, SIGKILL)) == 0)
			break;
		usleep(10000);
	}
	a->swept = 1;
	hpu__agent_report_leftovers(a, left);
}

void hpu__agent_on_child(struct ev_loop *loop, ev_child *c, int revents)
{
	(void)revents;
	worker *w = c->data;
	hpu_agent *a = w->a;
	ev_child_stop(loop, c);
	hpu__agent_status_read(&w->st); /* its last records before its end */
	w->reaped = 1;
	a->live--;
	int status = c->rstatus;
	/* exit(0) from a worker that never said it was done: it left early
	 * (a model that called exit(), or a program that is not hpu-worker),
	 * which fails the job like any exit */
	if (status == 0 && (w->hello || a->cfg.hpu_workers) &&
	    !(w->last_at > 0 && w->last.phase == HPU_PHASE_DONE))
		status = HPU_AGENT_LEFT_EARLY;
	if (status == 0)
		a->finished++; /* the silence watch's limit shortens */
	/* what it wrote before its end, first: its last lines come out
	 * before on_exit's error about it */
	read_stream(a, &w->out, 64);
	read_stream(a, &w->err, 64);
	if (a->cfg.on_exit)
		a->cfg.on_exit(a, w->rank, w->pid, status, a->cfg.arg);
	if (a->live == 0)
		workers_done(a);
}
