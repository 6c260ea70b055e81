/* hpu-plot: the gnuplot script: the panels, their series and titles.
 * Calls nothing of the other hpu_plot_*.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "tools/hpu_plot_impl.h"

/* ---- the gnuplot script ---- */

/* s as a gnuplot single-quoted string: a quote is doubled (the only
 * escape such strings have); control characters, which could end the
 * command, become spaces. */
static void put_quoted(FILE *f, const char *s)
{
	fputc('\'', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '\'')
			fputs("''", f);
		else
			fputc(c < 0x20 || c == 0x7f ? ' ' : c, f);
	}
	fputc('\'', f);
}

/* One panel: the title, the y label, the y range where the values are
 * all one (gnuplot would only warn and widen it by 1%), then `plot` of
 * `series`, or a "no data" note where there are no values. */
static void panel(FILE *f, const layout *L, int k, const char *title, const char *ylabel,
		  const char *series)
{
	fprintf(f, "set title '%s'\nset ylabel '%s'\n", title, ylabel);
	if (!L->have[k]) {
		fputs("set label 1 'no data' at graph 0.5, graph 0.5 center\n"
		      "set yrange [0:1]\nunset key\nplot NaN notitle\nunset label 1\n",
		      f);
		return;
	}
	double v = L->lo[k], d = fabs(v) > 0 ? fabs(v) / 2 : 1;
	if (L->lo[k] != L->hi[k] || (k == 3 && L->logscale))
		fputs("set autoscale y\n", f);
	else
		fprintf(f, "set yrange [%.10g:%.10g]\n", v - d, v + d);
	fprintf(f, "plot %s\n", series);
}

/* The memory panel's plot list (caller frees): InUse solid and MaxInUse
 * dashed, one colour per rank (or for smallest and largest), Limit
 * dotted black. NULL when out of memory. */
static char *memory_series(const table *t, const layout *L, const char *with)
{
	static const char *const mm[] = {"InUse min", "InUse max", "MaxInUse min",
					  "MaxInUse max"};
	char *s = NULL;
	size_t len;
	FILE *f = open_memstream(&s, &len);
	if (!f)
		return NULL;
	fprintf(f, "'data.txt' using 1:5 %s dt 3 lc rgb 'black' title 'Limit'", with);
	for (int k = 0; k < L->nseries; k++) {
		int colour = L->per_rank ? k / 2 + 1 : k % 2 + 1;
		int dashed = L->per_rank ? k % 2 : k >= 2;
		fprintf(f, ", '' using 1:%d %s dt %d lc %d title ", 6 + k, with,
			dashed ? 2 : 1, colour);
		if (L->per_rank)
			fprintf(f, "'%s r%d'", k % 2 ? "MaxInUse" : "InUse", k / 2);
		else
			fprintf(f, "'%s (%d rank%s)'", mm[k], t->nranks, hpu__plural(t->nranks));
	}
	if (fclose(f) != 0) {
		free(s);
		return NULL;
	}
	return s;
}

/* The fifth panel: each validation metric (val.txt's columns from 3 on)
 * over the step. */
static int val_panel(FILE *f, const table *t, const layout *L)
{
	char *s = NULL;
	size_t len;
	FILE *m = open_memstream(&s, &len);
	if (!m)
		return -1;
	for (int k = 1; k < t->nv; k++)
		fprintf(m, "%s'val.txt' using 1:%d with linespoints pt 7 ps 0.8 lc %d title '%s'",
			k > 1 ? ", " : "", k + 2, k + 4, t->vname[k]);
	if (fclose(m) != 0) {
		free(s);
		return -1;
	}
	fputs("unset logscale y\nset key inside top right\n", f);
	panel(f, L, 4, "validation metrics", "value", s);
	free(s);
	return 0;
}

/* Writes the script: pngcairo (png where gnuplot lacks it) to standard
 * output, a 2x2 multiplot of data.txt (in the working directory). */
int hpu__plt_write_script(FILE *f, const args *A, const table *t, const layout *L)
{
	const char *with = t->n <= POINTS_UP_TO ? "with linespoints pt 7 ps 0.5"
						: "with lines";
	fprintf(f, "reset\n"
		   "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
		   "  set terminal pngcairo noenhanced size %d,%d font 'sans,10'\n"
		   "} else {\n"
		   "  set terminal png noenhanced size %d,%d\n"
		   "}\n"
		   "set output\n"
		   "set grid\nunset key\nset xlabel 'step'\n",
		A->width, A->height, A->width, A->height);
	/* one x range for every panel: the validation panel's own (3.96 to
	 * 4.04 for one validation) did not line up with the others */
	double lo = t->p[0].step, hi = t->p[0].step;
	for (size_t i = 0; i < t->n; i++) {
		lo = t->p[i].step < lo ? t->p[i].step : lo;
		hi = t->p[i].step > hi ? t->p[i].step : hi;
	}
	for (size_t i = 0; i < t->vn; i++) {
		lo = t->vp[i].step < lo ? t->vp[i].step : lo;
		hi = t->vp[i].step > hi ? t->vp[i].step : hi;
	}
	if (lo == hi)
		fprintf(f, "set xrange [%.10g:%.10g]\n", lo - 1, hi + 1);
	else
		fprintf(f, "set xrange [%.10g:%.10g]\n", lo, hi);
	fprintf(f, "set multiplot layout %d,2 title ", t->vn ? 3 : 2);
	put_quoted(f, A->title);
	fputc('\n', f);
	char s[300];
	int n = snprintf(s, sizeof s, "'data.txt' using 1:2 %s lc 1 title 'loss'", with);
	if (t->vn) { /* the validations' loss beside the training's */
		snprintf(s + n, sizeof s - (size_t)n,
			 ", 'val.txt' using 1:2 with linespoints pt 7 ps 0.8 lc 4 title 'val_loss'");
		fputs("set key top right\n", f);
	}
	panel(f, L, 0, "loss", "loss", s);
	fputs("unset key\n", f);
	fputs("set format y '%.2e'\n", f);
	snprintf(s, sizeof s, "'data.txt' using 1:3 %s lc 2 title 'lr'", with);
	panel(f, L, 1, "learning rate", "lr", s);
	fputs("set format y\n", f);
	snprintf(s, sizeof s, "'data.txt' using 1:4 %s lc 3 title 'samples/s'", with);
	panel(f, L, 2, "throughput", "samples/s", s);
	char *mem = memory_series(t, L, with);
	if (!mem)
		return -1;
	fputs("set key outside right top vertical Left reverse\n", f);
	if (L->logscale)
		fputs("set logscale y\n", f);
	panel(f, L, 3, L->logscale ? "device memory (log scale)" : "device memory", "MiB", mem);
	free(mem);
	if (t->vn && val_panel(f, t, L) < 0)
		return -1;
	fputs("unset multiplot\n", f);
	return ferror(f) ? -1 : 0;
}
