/* A worker's status pipe (agent.h): its records read line by line, the
 * latest kept, its blame line and its hello noted, malformed lines
 * counted; and the silence watch over the pipes (a worker whose keepalive
 * stopped: on_silent). Calls no other file of the agent
 * (agent/agent_impl.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_impl.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/num.h"

static void status_line(status_pipe *sp, const char *line, size_t n)
{
	worker *w = sp->w;
	hpu_agent *a = w->a;
	hpu_status_rec r;
	w->heard_at = hpu__mono_s();
	if (n == 2 && memcmp(line, "H1", 2) == 0) {
		w->hello = 1;
		return;
	}
	if (n == 2 && memcmp(line, "K1", 2) == 0) { /* the keepalive: heard */
		w->keepalive = 1;
		return;
	}
	int culprit, world = a->cfg.world > 0 ? a->cfg.world : a->cfg.nodes * a->cfg.devices;
	hpu_blame how;
	if (hpu__status_parse_blame(line, n, &culprit, &how) == 0) {
		if (w->culprit < 0 && culprit < world) {
			w->culprit = culprit;
			w->culprit_how = how;
		}
		return;
	}
	if (hpu__status_parse_error(line, n, w->why, sizeof w->why) == 0)
		return;
	if (hpu__status_parse(line, n, &r) < 0) {
		a->status_bad++;
		return;
	}
	w->last = r;
	w->last_at = hpu__mono_s();
	if (a->cfg.on_status)
		a->cfg.on_status(a, w->rank, &w->last, a->cfg.arg);
}

/* Reads what the pipe holds; closes it at EOF or an error. */
void hpu__agent_status_read(status_pipe *sp)
{
	hpu_agent *a = sp->w->a;
	while (sp->fd >= 0) {
		ssize_t k = read(sp->fd, sp->buf + sp->len, sizeof sp->buf - sp->len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN)
			return;
		if (k <= 0) {
			if (sp->len && !sp->skipping)
				a->status_bad++; /* a record cut short */
			ev_io_stop(a->loop, &sp->io);
			close(sp->fd);
			sp->fd = -1;
			return;
		}
		sp->len += (size_t)k;
		size_t start = 0;
		for (size_t i = 0; i < sp->len; i++) {
			if (sp->buf[i] != '\n')
				continue;
			if (!sp->skipping)
				status_line(sp, sp->buf + start, i - start);
			sp->skipping = 0;
			start = i + 1;
		}
		if (start == 0 && sp->len == sizeof sp->buf) {
			if (!sp->skipping)
				a->status_bad++; /* no record is this long */
			sp->skipping = 1;
			start = sp->len;
		}
		memmove(sp->buf, sp->buf + start, sp->len - start);
		sp->len -= start;
	}
}

/* HPUCOLL_TIMEOUT_MS as the workers get it (the job's environment,
 * hpud's; else this process's), in seconds; 60 unless a whole number of
 * milliseconds from 1. */
static double coll_timeout_s(const hpu_agent *a)
{
	const char *v = NULL;
	for (char *const *e = a->cfg.env; e && *e; e++)
		if (hpu__env_find(*e) == HPU_ENV_HPUCOLL_TIMEOUT_MS && strchr(*e, '='))
			v = strchr(*e, '=') + 1;
	if (!v)
		v = hpu__env_str(HPU_ENV_HPUCOLL_TIMEOUT_MS);
	int ms;
	return v && *v && !hpu__parse_int(v, 1, INT_MAX, &ms) ? ms / 1000.0 : 60.0;
}

/* Whether process pid is stopped (SIGSTOP, a frozen job control stop,
 * a tracer's stop): its /proc/PID/stat state T or t. */
static int proc_stopped(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *rp = strrchr(buf, ')'); /* after the command's name */
	return rp && rp[1] == ' ' && (rp[2] == 'T' || rp[2] == 't');
}

static void on_silence_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	hpu_agent *a = t->data;
	ev_tstamp now = hpu__mono_s(), gap = now - a->silence_last;
	a->silence_last = now;
	int stalled = gap > 3; /* this process did not run: nothing could be heard */
	/* at least a few keepalives long: a tiny HPUCOLL_TIMEOUT_MS would
	 * fail a healthy worker between two of them */
	double limit = a->silence_limit_s * (a->finished ? 1 : 2);
	if (limit < 5 * HPU_STATUS_KEEPALIVE_S)
		limit = 5 * HPU_STATUS_KEEPALIVE_S;
	for (int i = 0; i < a->cfg.devices; i++) {
		worker *w = &a->w[i];
		if (w->reaped || w->pid <= 0)
			continue;
		if (stalled || !w->heard_at) {
			w->heard_at = now;
			continue;
		}
		/* one that never said a keepalive (an older hpu-worker, an
		 * --exec program) is silent between its records by nature:
		 * watched only while its process is stopped (one stopped
		 * before its first keepalive waited for --join-timeout, and
		 * an --exec program's for ever) */
		if (!w->keepalive && !proc_stopped(w->pid)) {
			w->heard_at = now;
			continue;
		}
		if (a->stopping || w->silent_said || now - w->heard_at <= limit)
			continue;
		w->silent_said = 1;
		if (a->cfg.on_silent)
			a->cfg.on_silent(a, w->rank, w->pid, now - w->heard_at, a->finished > 0,
					 a->cfg.arg);
	}
}

void hpu__agent_silence_start(hpu_agent *a)
{
	a->silence_limit_s = coll_timeout_s(a);
	a->silence_last = hpu__mono_s();
	ev_timer_init(&a->silence_timer, on_silence_timer, 1.0, 1.0);
	a->silence_timer.data = a;
	ev_timer_start(a->loop, &a->silence_timer);
}

void hpu__agent_silence_stop(hpu_agent *a)
{
	ev_timer_stop(a->loop, &a->silence_timer);
}

void hpu__agent_on_status_pipe(struct ev_loop *loop, ev_io *io, int revents)
{
	(void)loop;
	(void)revents;
	hpu__agent_status_read(io->data);
}

int hpu__agent_status(const hpu_agent *a, int rank, hpu_status_rec *st, double *age_s)
{
	int local = rank - a->cfg.rank_base;
	if (local < 0 || local >= a->cfg.devices || a->w[local].last_at == 0)
		return -1;
	*st = a->w[local].last;
	*age_s = hpu__mono_s() - a->w[local].last_at;
	if (*age_s < 0)
		*age_s = 0;
	return 0;
}

const char *hpu__agent_why(const hpu_agent *a, int rank)
{
	int local = rank - a->cfg.rank_base;
	return local < 0 || local >= a->cfg.devices ? "" : a->w[local].why;
}

int hpu__agent_said_hello(const hpu_agent *a, int rank)
{
	int local = rank - a->cfg.rank_base;
	return local >= 0 && local < a->cfg.devices && a->w[local].hello;
}

int hpu__agent_culprit(const hpu_agent *a, int rank, hpu_blame *how)
{
	int local = rank - a->cfg.rank_base;
	if (local < 0 || local >= a->cfg.devices || a->w[local].culprit < 0)
		return -1;
	*how = a->w[local].culprit_how;
	return a->w[local].culprit;
}

long hpu__agent_status_bad(const hpu_agent *a)
{
	return a->status_bad;
}
