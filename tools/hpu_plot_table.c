/* hpu-plot: the table gnuplot reads (and --print-data prints), and the
 * layout of its columns. Calls nothing of the other hpu_plot_*.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tools/hpu_plot_impl.h"

/* ---- the table gnuplot reads ---- */

/* v, or NaN where it is missing (or not drawable on a log axis): gnuplot
 * breaks a line at a NaN, where a point it skips as "missing" ('?') would
 * be joined across. */
static void put(FILE *f, double v, int positive_only)
{
	if (isnan(v) || (positive_only && v <= 0))
		fputs(" NaN", f);
	else
		fprintf(f, " %.10g", v);
}

/* The smallest (want_max 0) or largest value of v[0..n) that is not NAN. */
static double extreme(const double *v, int n, int want_max)
{
	double m = NAN;
	for (int r = 0; r < n; r++)
		if (!isnan(v[r]) && (isnan(m) || (want_max ? v[r] > m : v[r] < m)))
			m = v[r];
	return m;
}

/* The memory series of p in column order (bytes; NAN where missing). */
static void memory_row(const table *t, const layout *L, const point *p, double *row)
{
	if (L->per_rank) {
		for (int r = 0; r < t->nranks; r++) {
			row[2 * r] = r < p->nranks ? p->in_use[r] : NAN;
			row[2 * r + 1] = r < p->nranks ? p->max_in_use[r] : NAN;
		}
		return;
	}
	row[0] = extreme(p->in_use, p->nranks, 0);
	row[1] = extreme(p->in_use, p->nranks, 1);
	row[2] = extreme(p->max_in_use, p->nranks, 0);
	row[3] = extreme(p->max_in_use, p->nranks, 1);
}

/* Counts v into panel k's values and range. */
static void see(layout *L, int k, double v)
{
	if (isnan(v) || (k == 3 && L->logscale && v <= 0))
		return;
	if (!L->have[k]++ || v < L->lo[k])
		L->lo[k] = v;
	if (L->have[k] == 1 || v > L->hi[k])
		L->hi[k] = v;
}

/* Decides the layout: per-rank or min/max series, linear or log memory
 * axis, which panels have data and their ranges. */
int hpu__plt_plan(const table *t, layout *L)
{
	*L = (layout){.per_rank = t->nranks <= RANK_LINES};
	L->nseries = L->per_rank ? 2 * t->nranks : 4;
	double *row = malloc(((size_t)L->nseries + 1) * sizeof *row);
	if (!row)
		return -1;
	double top_limit = NAN, top_used = NAN;
	for (size_t i = 0; i < t->n; i++) {
		memory_row(t, L, &t->p[i], row);
		double used = extreme(row, L->nseries, 1);
		if (!isnan(used) && (isnan(top_used) || used > top_used))
			top_used = used;
		if (!isnan(t->p[i].limit) && (isnan(top_limit) || t->p[i].limit > top_limit))
			top_limit = t->p[i].limit;
	}
	L->logscale = top_used > 0 && top_limit > LOG_RATIO * top_used;
	for (size_t i = 0; i < t->n; i++) {
		const point *p = &t->p[i];
		see(L, 0, p->loss);
		see(L, 1, p->lr);
		see(L, 2, p->sps);
		see(L, 3, p->limit / MIB);
		memory_row(t, L, p, row);
		for (int s = 0; s < L->nseries; s++)
			see(L, 3, row[s] / MIB);
	}
	for (size_t i = 0; i < t->vn; i++)
		for (int k = 0; k < t->nv; k++)
			see(L, k ? 4 : 0, t->vp[i].v[k]);
	free(row);
	return 0;
}

/* The validation table: a header comment, then one row per validation
 * (step, val_loss, the metrics); nothing when there is none. */
int hpu__plt_write_vtable(FILE *f, const table *t)
{
	if (!t->vn)
		return 0;
	fputs("# validation: step", f);
	for (int k = 0; k < t->nv; k++)
		fprintf(f, " %s", t->vname[k]);
	fputc('\n', f);
	for (size_t i = 0; i < t->vn; i++) {
		fprintf(f, "%.10g", t->vp[i].step);
		for (int k = 0; k < t->nv; k++)
			put(f, t->vp[i].v[k], 0);
		fputc('\n', f);
	}
	return ferror(f) ? -1 : 0;
}

/* Writes the table (a header comment, then one row per step) to f. */
int hpu__plt_write_table(FILE *f, const table *t, const layout *L)
{
	double *row = malloc(((size_t)L->nseries + 1) * sizeof *row);
	if (!row)
		return -1;
	fputs("# step loss lr samples_per_sec Limit_MiB", f);
	for (int s = 0; s < L->nseries; s++) {
		static const char *const mm[] = {"InUse_min", "InUse_max", "MaxInUse_min",
						 "MaxInUse_max"};
		if (L->per_rank)
			fprintf(f, " %s_r%d_MiB", s % 2 ? "MaxInUse" : "InUse", s / 2);
		else
			fprintf(f, " %s_MiB", mm[s]);
	}
	fputc('\n', f);
	for (size_t i = 0; i < t->n; i++) {
		const point *p = &t->p[i];
		fprintf(f, "%.10g", p->step);
		put(f, p->loss, 0);
		put(f, p->lr, 0);
		put(f, p->sps, 0);
		put(f, p->limit / MIB, L->logscale);
		memory_row(t, L, p, row);
		for (int s = 0; s < L->nseries; s++)
			put(f, row[s] / MIB, L->logscale);
		fputc('\n', f);
	}
	free(row);
	return ferror(f) ? -1 : 0;
}
