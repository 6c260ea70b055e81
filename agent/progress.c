#include "agent/progress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "common/env.h"

#define REDRAW_EVERY_S 0.2
#define DEFAULT_COLUMNS 80
#define MIN_BAR 10

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int hpu__progress_mode_parse(const char *s, int *mode)
{
	static const char *names[] = {"auto", "always", "never"};
	for (int i = 0; i < 3; i++)
		if (!strcmp(s, names[i])) {
			*mode = i;
			return 0;
		}
	return -1;
}

void hpu__progress_init(hpu_progress *p, int mode, FILE *out)
{
	memset(p, 0, sizeof *p);
	p->out = out;
	const char *term = hpu__env_str(HPU_ENV_TERM);
	if (mode == HPU_PROGRESS_ALWAYS)
		p->on = 1;
	else if (mode == HPU_PROGRESS_AUTO)
		p->on = isatty(fileno(out)) && term && *term && strcmp(term, "dumb") != 0;
}

static int columns(const hpu_progress *p)
{
	struct winsize ws;
	if (ioctl(fileno(p->out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
		return ws.ws_col;
	return DEFAULT_COLUMNS;
}

/* "1:02:03", or "?" when unknown. */
static void fmt_eta(double s, char *out, size_t len)
{
	if (!(s >= 0) || s > 1e9) {
		snprintf(out, len, "?");
		return;
	}
	long t = (long)(s + 0.5);
	snprintf(out, len, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

/* The part of the run done, 0..1 (total > 0). */
static double fraction(const hpu_status_rec *st)
{
	double f = (double)st->step / (double)st->total;
	return f < 0 ? 0 : f > 1 ? 1 : f;
}

/* The text right of the bar; `drop` leaves out the throughput (>= 1) and
 * the loss (>= 2). */
static void tail_text(const hpu_status_rec *st, int drop, char *out, size_t len)
{
	char eta[48], loss[48] = "", rate[64] = "", pct[16] = "", steps[64];
	if (st->total > 0) {
		snprintf(pct, sizeof pct, " %d%%", (int)(100 * fraction(st)));
		snprintf(steps, sizeof steps, "step %ld/%ld", st->step, st->total);
	} else {
		snprintf(steps, sizeof steps, "step %ld", st->step);
	}
	/* NaN before a step is measured: no loss yet (a diverged step's NaN
	 * comes with a rate) */
	if (drop < 2 && !(isnan(st->loss) && st->samples_per_sec <= 0))
		snprintf(loss, sizeof loss, " loss %.4f", st->loss);
	if (drop < 1 && st->samples_per_sec > 0)
		snprintf(rate, sizeof rate, " %.1f samples/s", st->samples_per_sec);
	if (st->phase == HPU_PHASE_DONE) {
		snprintf(eta, sizeof eta, " done");
	} else if (st->phase == HPU_PHASE_EVAL) {
		snprintf(eta, sizeof eta, " evaluating");
	} else if (st->phase == HPU_PHASE_SETUP) {
		snprintf(eta, sizeof eta, " setting up");
	} else if (st->phase == HPU_PHASE_SAVE) {
		snprintf(eta, sizeof eta, " saving a checkpoint");
	} else {
		char t[32];
		fmt_eta(st->eta_s, t, sizeof t);
		snprintf(eta, sizeof eta, " ETA %s", t);
	}
	snprintf(out, len, "%s %s%s%s%s", pct, steps, loss, rate, eta);
}

size_t hpu__progress_format(const hpu_status_rec *st, int width, char *out, size_t outlen)
{
	char head[64] = "", tail[256];
	if (width < 1 || outlen < 2) {
		if (outlen)
			out[0] = 0;
		return 0;
	}
	if (st->epochs > 0)
		snprintf(head, sizeof head, "epoch %d/%d ", st->epoch, st->epochs);
	int bar = 0;
	for (int drop = 0; drop <= 3; drop++) {
		if (drop == 3)
			head[0] = 0;
		tail_text(st, drop, tail, sizeof tail);
		bar = width - (int)strlen(head) - (int)strlen(tail) - 2;
		if (bar >= MIN_BAR)
			break;
	}
	size_t n = 0;
	char line[1024];
	if (bar >= MIN_BAR && st->total > 0) {
		if (bar > (int)sizeof line - 400)
			bar = (int)sizeof line - 400;
		int fill = (int)(fraction(st) * bar);
		n += (size_t)snprintf(line, sizeof line, "%s[", head);
		for (int i = 0; i < bar; i++)
			line[n++] = i < fill ? '#' : '.';
		n += (size_t)snprintf(line + n, sizeof line - n, "]%s", tail);
	} else {
		/* too narrow for a bar (or no total): the words, cut to fit */
		n = (size_t)snprintf(line, sizeof line, "%s%s", head, tail + (tail[0] == ' '));
	}
	if (n > (size_t)width)
		n = (size_t)width;
	if (n > outlen - 1)
		n = outlen - 1;
	memcpy(out, line, n);
	out[n] = 0;
	return n;
}

static void draw(hpu_progress *p)
{
	char text[1024];
	/* one column short of the edge: a full line would wrap on some
	 * terminals and push the bar down a line at each redraw */
	int width = columns(p) - 1;
	if (width > (int)sizeof text - 1)
		width = (int)sizeof text - 1;
	hpu__progress_format(&p->st, width, text, sizeof text);
	fprintf(p->out, "\r%s\x1b[K", text);
	fflush(p->out);
	p->shown = 1;
	p->dirty = 0;
	p->drawn_at = now_s();
}

void hpu__progress_update(hpu_progress *p, const hpu_status_rec *st)
{
	if (!p->on)
		return;
	p->st = *st;
	p->have = 1;
	p->dirty = 1;
	hpu__progress_tick(p);
}

void hpu__progress_tick(hpu_progress *p)
{
	if (p->on && p->have && p->dirty && now_s() - p->drawn_at >= REDRAW_EVERY_S)
		draw(p);
}

void hpu__progress_hide(hpu_progress *p)
{
	if (!p->on || !p->shown)
		return;
	fputs("\r\x1b[K", p->out);
	fflush(p->out);
	p->shown = 0;
	p->dirty = 1;
}

void hpu__progress_show(hpu_progress *p)
{
	if (p->on && p->have && !p->shown)
		draw(p);
}

void hpu__progress_reset(hpu_progress *p)
{
	hpu__progress_hide(p);
	p->have = 0;
	p->dirty = 0;
}
