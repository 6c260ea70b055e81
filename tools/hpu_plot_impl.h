/* hpu_plot_impl: what the files of hpu-plot share. Not installed.
 *
 * The calls run one way: hpu_plot.c (main, the options, the run's order)
 * calls hpu_plot_metrics.c (reading the metrics), hpu_plot_table.c (the
 * table gnuplot reads) and hpu_plot_draw.c (running gnuplot, the PNG);
 * hpu_plot_draw.c calls the table, hpu_plot_script.c (the gnuplot script)
 * and the metrics' blank(); the metrics, the table and the script call
 * no other file of hpu-plot. */
#ifndef HPU_TOOLS_HPU_PLOT_IMPL_H
#define HPU_TOOLS_HPU_PLOT_IMPL_H

#include <stddef.h>
#include <stdio.h>

#include "tools/tool.h"

enum { OK = HPU_TOOL_OK, BAD = HPU_TOOL_BAD, USAGE = HPU_TOOL_USAGE };
#define fail hpu__tool_fail
enum { DEF_W = 1200, DEF_H = 900, MIN_PX = 200, MAX_PX = 16384 };
enum { MAX_RANKS = 1 << 16 };  /* ranks beyond this are ignored */
enum { RANK_LINES = 8 };       /* above this many ranks: min and max */
enum { POINTS_UP_TO = 60 };    /* draw points as well as lines */
enum { GNUPLOT_TIMEOUT_S = 120 };
#define LOG_RATIO 20.0 /* Limit this many times MaxInUse: log scale */
#define MIB (1024.0 * 1024.0)

/* The options (hpu_plot.c). */
typedef struct args {
	const char *metrics, *out, *title;
	int width, height, print_data;
} args;

/* ---- the metrics (hpu_plot_metrics.c) ---- */

/* One step record. Values are NAN where the record lacks them. */
typedef struct point {
	double step;
	long line;           /* where in the file: the last one wins */
	double loss, lr, sps;
	double limit;        /* the largest Limit over the ranks, bytes */
	int nranks;          /* in_use and max_in_use hold this many */
	double *in_use, *max_in_use; /* bytes per rank */
} point;

enum { MAX_VAL = 16 }; /* validation series: val_loss and metrics */

/* One validation record: its figures in the order of vnames. */
typedef struct vpoint {
	double step;
	long line;
	double v[MAX_VAL];
} vpoint;

typedef struct table {
	point *p;
	size_t n, cap;
	int nranks;   /* the most ranks any record has */
	long records; /* JSON lines read, step records or not */
	int torn;     /* an incomplete last line was skipped */
	vpoint *vp;   /* validation records */
	size_t vn, vcap;
	int nv;       /* series: vname[0] is val_loss, then the metrics */
	char vname[MAX_VAL][64];
} table;

void hpu__plt_table_free(table *t);
/* Whether s is nothing but white space. */
int hpu__plt_blank(const char *s);
/* Every record of `file` into t; OK or BAD (said). */
int hpu__plt_read_metrics(const char *file, table *t);
/* The steps in order, the last record of each kept. */
void hpu__plt_keep_last_per_step(table *t);

/* ---- the table gnuplot reads (hpu_plot_table.c) ---- */

/* Columns: 1 step, 2 loss, 3 lr, 4 samples/s, 5 Limit, then the memory
 * series from column 6 on: per rank InUse and MaxInUse (up to RANK_LINES
 * ranks), else the smallest and largest InUse and MaxInUse over the
 * ranks. Memory in MiB. */
typedef struct layout {
	int per_rank;   /* one series per rank */
	int nseries;    /* memory series after Limit */
	int logscale;   /* memory on a log scale */
	long have[5];   /* values present: loss (val_loss too), lr, samples/s,
			 * memory, validation metrics */
	double lo[5], hi[5]; /* their smallest and largest (memory: MiB) */
} layout;

/* L planned from t; -1 when out of memory. */
int hpu__plt_plan(const table *t, layout *L);
/* The validations' and the steps' tables into f; -1 when a write failed. */
int hpu__plt_write_vtable(FILE *f, const table *t);
int hpu__plt_write_table(FILE *f, const table *t, const layout *L);

/* ---- the gnuplot script (hpu_plot_script.c) ---- */

/* The script into f; -1 when a write failed. */
int hpu__plt_write_script(FILE *f, const args *A, const table *t, const layout *L);

/* ---- drawing (hpu_plot_draw.c) ---- */

/* gnuplot on PATH, absolute (caller frees), or NULL. */
char *hpu__plt_find_gnuplot(void);
/* METRICS with its extension replaced by .png (caller frees). */
char *hpu__plt_default_out(const char *metrics);
/* Whether a and b name the same existing file. */
int hpu__plt_same_file(const char *a, const char *b);
/* Draws A->out with gnuplot gp in a temporary directory; OK or BAD (said). */
int hpu__plt_draw_in_tmpdir(const args *A, const table *t, const layout *L, const char *gp);

#endif
