/* hpu-trace: the summary table of the actions, printed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/hpu_trace_impl.h"

/* ---- printing the summary ---- */

enum sort_key hpu__trc_sort_key;

static int cmp_action(const void *pa, const void *pb)
{
	const action *a = pa, *b = pb;
	double x = 0, y = 0;
	switch (hpu__trc_sort_key) {
	case BY_TOTAL:
		x = a->total, y = b->total;
		break;
	case BY_COUNT:
		x = (double)a->count, y = (double)b->count;
		break;
	case BY_MEAN:
		x = a->total / (double)a->count, y = b->total / (double)b->count;
		break;
	case BY_MAX:
		x = a->max, y = b->max;
		break;
	case BY_NAME:
		break;
	}
	if (x != y)
		return x < y ? 1 : -1;
	return strcmp(a->name, b->name);
}

static int digits(double v, int decimals)
{
	char b[64];
	return snprintf(b, sizeof b, "%.*f", decimals, v);
}

void hpu__trc_summary(FILE *f, actions *s, const inputs *in, int top)
{
	action *a = hpu__trc_xrealloc(NULL, (s->n ? s->n : 1) * sizeof *a);
	size_t n = 0;
	for (size_t i = 0; i < s->cap; i++)
		if (s->a[i].name)
			a[n++] = s->a[i];
	qsort(a, n, sizeof *a, cmp_action);
	size_t rows = top > 0 && (size_t)top < n ? (size_t)top : n;
	int wn = 6, wc = 5, wt = 8, wm = 7, wx = 6, wp = 5;
	for (size_t i = 0; i < rows; i++) {
		int l = (int)strlen(a[i].name);
		wn = l > wn ? l : wn;
		l = digits((double)a[i].count, 0);
		wc = l > wc ? l : wc;
		l = digits(a[i].total / 1e3, 3);
		wt = l > wt ? l : wt;
		l = digits(a[i].total / 1e3 / (double)a[i].count, 3);
		wm = l > wm ? l : wm;
		l = digits(a[i].max / 1e3, 3);
		wx = l > wx ? l : wx;
		if (s->step_total > 0) {
			l = digits(100.0 * a[i].total / s->step_total, 1);
			wp = l > wp ? l : wp;
		}
	}
	fprintf(f, "%-*s  %*s  %*s  %*s  %*s  %*s\n", wn, "action", wc, "count", wt, "total_ms", wm,
	       "mean_ms", wx, "max_ms", wp, "%step");
	for (size_t i = 0; i < rows; i++) {
		fprintf(f, "%-*s  %*ld  %*.3f  %*.3f  %*.3f  ", wn, a[i].name, wc, a[i].count, wt,
		       a[i].total / 1e3, wm, a[i].total / 1e3 / (double)a[i].count, wx,
		       a[i].max / 1e3);
		if (s->step_total > 0)
			fprintf(f, "%*.1f\n", wp, 100.0 * a[i].total / s->step_total);
		else
			fprintf(f, "%*s\n", wp, "-");
	}
	if (rows < n)
		fprintf(f, "(%zu more action%s; --top %d shows the first %d)\n", n - rows,
		       n - rows == 1 ? "" : "s", top, top);
	long lo = -1, hi = -1;
	for (int i = 0; i < in->n; i++) {
		if (lo < 0 || in->t[i].steps < lo)
			lo = in->t[i].steps;
		if (hi < 0 || in->t[i].steps > hi)
			hi = in->t[i].steps;
	}
	char per[64];
	if (lo == hi)
		snprintf(per, sizeof per, "%ld per rank", lo);
	else
		snprintf(per, sizeof per, "%ld to %ld per rank", lo, hi);
	if (s->steps == 0) {
		fprintf(f, "%d rank%s, no step events: no %%step.\n", in->n, in->n == 1 ? "" : "s");
		free(a);
		return;
	}
	fprintf(f, "%d rank%s, %ld step%s (%s), step time %.3f ms (all ranks). Nested actions "
	       "(forward:<layer> inside forward) and the collectives thread overlap, and actions "
	       "outside the steps (evaluate) count too, so %%step does not add up to 100%%.\n",
	       in->n, in->n == 1 ? "" : "s", s->steps, s->steps == 1 ? "" : "s", per,
	       s->step_total / 1e3);
	free(a);
}
