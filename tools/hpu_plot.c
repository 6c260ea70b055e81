/* hpu-plot: draws a metrics file (hpulaunch --metrics) as one PNG with
 * four panels -- loss, learning rate, throughput and device memory over
 * the steps -- by running gnuplot on a generated script; validation
 * records (--eval-every) add val_loss to the loss panel and a fifth
 * panel of the validation metrics.
 *
 *   hpu-plot [-o OUT.png] [--width PX] [--height PX] [--title T] METRICS
 *
 * The metrics file is JSON lines: step records ("step" and "loss") and
 * validation records ("step" and "val_loss") are plotted, every other
 * record (checkpoint reports, the "final" record) is skipped. A resumed run appends to the file, so a step may appear more
 * than once: the last record of each step is kept, and the steps are drawn
 * in ascending order. The data and the script go to a temporary directory
 * (removed afterwards); gnuplot writes the PNG to its standard output,
 * which is OUT.tmp, renamed to OUT once gnuplot has succeeded -- so the
 * output path never appears in the script, and a failed run leaves no
 * half-written file (an OUT that is a device or a pipe gets a copy of a
 * PNG drawn in the temporary directory). Exit status: 0 drawn, 1 failed,
 * 2 usage. */
#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/env.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/num.h"
#include "common/opt.h"
#include "common/optdoc.h"
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

static const char *const help =
	"usage: hpu-plot [-o OUT.png] [--width PX] [--height PX] [--title T]\n"
	"                [--print-data] METRICS.jsonl\n"
	"\n"
	"Draws the metrics file that hpulaunch --metrics writes as one PNG with\n"
	"four panels over the step: loss; learning rate; throughput (samples/s);\n"
	"device memory in MiB (InUse solid and MaxInUse dashed per rank, and\n"
	"Limit; a log scale when Limit dwarfs MaxInUse; above 8 ranks the\n"
	"smallest and largest over the ranks instead of one line per rank).\n"
	"Validation records (--eval-every) add val_loss to the loss panel and\n"
	"a panel of the validation metrics (val_accuracy, ...).\n"
	"Step records are drawn, other records skipped; where a resumed run\n"
	"repeated steps, the last record of each step counts. Needs gnuplot\n"
	"(Debian: gnuplot-nox).\n"
	"\n"
	"options:\n";

static const char *const help_tail =
	"\n"
	"Exit status: 0 drawn, 1 failed (unreadable file, a line that is not\n"
	"JSON, nothing to plot, gnuplot missing or failing), 2 usage.\n";

/* ---- arguments ---- */

typedef struct args {
	const char *metrics, *out, *title;
	int width, height, print_data;
} args;

enum { OPT_HELP = 1, OPT_PRINT_DATA, OPT_OUTPUT, OPT_TITLE, OPT_WIDTH, OPT_HEIGHT, OPT_HELP_DOC, OPT_LOG_LEVEL };

/* The parser's table and the help's (--help, man/hpu-plot.1,
 * docs/reference/hpu-plot.md). */
static const hpu_optspec specs[] = {
	{"output", 'o', HPU_OPT_VALUE, OPT_OUTPUT, "OUT",
	 .help = "the PNG (default: METRICS with its extension replaced by .png); written as OUT.tmp, "
		 "then renamed (a device or a pipe: written in place)"},
	{"width", 0, HPU_OPT_VALUE, OPT_WIDTH, "PX", .help = "image width in pixels (default 1200, 200..16384)"},
	{"height", 0, HPU_OPT_VALUE, OPT_HEIGHT, "PX", .help = "image height in pixels (default 900, 200..16384)"},
	{"title", 0, HPU_OPT_VALUE, OPT_TITLE, "T", .help = "the title above the panels (default: METRICS's name)"},
	{"print-data", 0, HPU_OPT_FLAG, OPT_PRINT_DATA, NULL,
	 .help = "print the table that would be drawn (MiB for memory, '?' where a value is missing), "
		 "then, after a blank line, the validations' (step, val_loss, the metrics), "
		 "instead of drawing; gnuplot is not needed for it"},
	{"log-level", 0, HPU_OPT_VALUE, OPT_LOG_LEVEL, "LEVEL", .help = HPU_TOOL_LOG_LEVEL_HELP,
	 .env = "HPU_LOG_LEVEL"},
	{"help", 'h', HPU_OPT_FLAG, OPT_HELP, NULL, .help = "this text"},
	/* the options' documentation (man/, docs/reference/): not listed */
	{"help-doc", 0, HPU_OPT_VALUE, OPT_HELP_DOC, .help = NULL},
	{0},
};

/* Fills *A from argv. Returns -1 when parsed, OK after --help, USAGE
 * after saying what is wrong. */
static int parse_args(int argc, char **argv, args *A)
{
	*A = (args){.width = DEF_W, .height = DEF_H};
	hpu_optparse p;
	hpu__optparse_init(&p, argc, argv, specs);
	for (int r; (r = hpu__optparse_next(&p)) != HPU_OPT_END;) {
		const char *v = p.val;
		switch (r) {
		case HPU_OPT_POSITIONAL:
			if (A->metrics)
				return hpu__tool_usage(NULL, "one metrics file only ('%s' and '%s')",
						   A->metrics, v);
			A->metrics = v;
			break;
		case OPT_HELP:
			fputs(help, stdout);
			hpu__optdoc(stdout, specs, HPU_DOC_HELP, 21);
			fputs(help_tail, stdout);
			return OK;
		case OPT_HELP_DOC:
			return hpu__tool_doc(specs, v, 21);
		case OPT_PRINT_DATA:
			A->print_data = 1;
			break;
		case OPT_LOG_LEVEL:
			if (hpu__tool_log_level(v))
				return USAGE;
			break;
		case OPT_OUTPUT:
			if (!*v)
				return hpu__tool_usage(NULL, "--output needs a file name");
			A->out = v;
			break;
		case OPT_TITLE:
			A->title = v;
			break;
		case OPT_WIDTH:
		case OPT_HEIGHT:
			if (hpu__parse_int(v, MIN_PX, MAX_PX, r == OPT_WIDTH ? &A->width : &A->height))
				return hpu__tool_usage(NULL, "--%s wants a whole number of pixels from %d to "
						   "%d, not '%s'",
						   p.spec->name, MIN_PX, MAX_PX, v);
			break;
		case HPU_OPT_MISSING:
			return hpu__tool_usage(NULL, "--%s needs a value", p.spec->name);
		default: /* unknown, or a flag with a value */
			return hpu__tool_usage(NULL, "unknown option '%s'", p.arg);
		}
	}
	if (!A->metrics)
		return hpu__tool_usage(NULL, "which metrics file? (the file hpulaunch --metrics wrote)");
	return -1;
}

/* ---- the metrics ---- */

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
	vpoint *vp;   /* validation records */
	size_t vn, vcap;
	int nv;       /* series: vname[0] is val_loss, then the metrics */
	char vname[MAX_VAL][64];
} table;

static void table_free(table *t)
{
	free(t->vp);
	for (size_t i = 0; i < t->n; i++) {
		free(t->p[i].in_use);
		free(t->p[i].max_in_use);
	}
	free(t->p);
	*t = (table){0};
}

/* o's member `key` if it is a number, else NAN (missing or null). */
static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* The rank of device entry e, the k-th of its array: its "rank", or k
 * where it has none; -1 for a rank that is not a small whole number. */
static int rank_of(const cJSON *e, int k)
{
	double r = num(e, "rank");
	if (isnan(r))
		return k;
	return r >= 0 && r < MAX_RANKS && r == floor(r) ? (int)r : -1;
}

/* The per-rank memory of a record's "device" array into *p; 0, or -1
 * when out of memory. Entries without a usable rank are skipped. */
static int read_device(const cJSON *dev, point *p)
{
	int n = 0, k = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, dev)
	{
		int r = rank_of(e, k++);
		n = r + 1 > n ? r + 1 : n;
	}
	if (n == 0)
		return 0;
	p->in_use = malloc((size_t)n * sizeof *p->in_use);
	p->max_in_use = malloc((size_t)n * sizeof *p->max_in_use);
	if (!p->in_use || !p->max_in_use)
		return -1;
	p->nranks = n;
	for (int r = 0; r < n; r++)
		p->in_use[r] = p->max_in_use[r] = NAN;
	k = 0;
	cJSON_ArrayForEach(e, dev)
	{
		int r = rank_of(e, k++);
		if (r < 0)
			continue;
		double lim = num(e, "Limit");
		p->in_use[r] = num(e, "InUse");
		p->max_in_use[r] = num(e, "MaxInUse");
		if (!isnan(lim) && (isnan(p->limit) || lim > p->limit))
			p->limit = lim;
	}
	return 0;
}

/* The series of validation key `key`, added when new; -1 when there are
 * MAX_VAL already. */
static int vseries(table *t, const char *key)
{
	for (int k = 0; k < t->nv; k++)
		if (!strcmp(t->vname[k], key))
			return k;
	if (t->nv == MAX_VAL)
		return -1;
	snprintf(t->vname[t->nv], sizeof t->vname[0], "%s", key);
	return t->nv++;
}

/* Adds validation record j: "step", "val_loss" and every other numeric
 * "val_*" but val_samples (a count, not a figure). 0, or -1 when out of
 * memory. */
static int add_validation(table *t, const cJSON *j, long line)
{
	if (t->vn == t->vcap) {
		size_t cap = t->vcap ? 2 * t->vcap : 64;
		vpoint *p = realloc(t->vp, cap * sizeof *p);
		if (!p)
			return -1;
		t->vp = p;
		t->vcap = cap;
	}
	vpoint *p = &t->vp[t->vn++];
	p->step = num(j, "step");
	p->line = line;
	for (int k = 0; k < MAX_VAL; k++)
		p->v[k] = NAN;
	vseries(t, "val_loss");
	const cJSON *e;
	cJSON_ArrayForEach(e, j)
	{
		if (strncmp(e->string, "val_", 4) || !strcmp(e->string, "val_samples") ||
		    strlen(e->string) >= sizeof t->vname[0])
			continue;
		int k = vseries(t, e->string);
		if (k >= 0)
			p->v[k] = num(j, e->string);
	}
	return 0;
}

/* Adds record j (from line `line`) to t if it is a step record: an
 * object with a numeric "step" and a "loss" (a number, or null where the
 * loss was not finite). 0, or -1 when out of memory. */
static int add_record(table *t, const cJSON *j, long line)
{
	if (cJSON_IsObject(j) && !isnan(num(j, "step")) &&
	    cJSON_GetObjectItemCaseSensitive(j, "val_loss"))
		return add_validation(t, j, line);
	if (!cJSON_IsObject(j) || isnan(num(j, "step")) ||
	    !cJSON_GetObjectItemCaseSensitive(j, "loss") ||
	    cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "final")))
		return 0;
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 256;
		point *p = realloc(t->p, cap * sizeof *p);
		if (!p)
			return -1;
		t->p = p;
		t->cap = cap;
	}
	point *p = &t->p[t->n++];
	*p = (point){.step = num(j, "step"), .line = line, .loss = num(j, "loss"),
		     .lr = num(j, "lr"), .sps = num(j, "samples_per_sec"), .limit = NAN};
	const cJSON *dev = cJSON_GetObjectItemCaseSensitive(j, "device");
	if (cJSON_IsArray(dev) && read_device(dev, p) < 0)
		return -1;
	if (p->nranks > t->nranks)
		t->nranks = p->nranks;
	return 0;
}

/* Whether s is nothing but white space. */
static int blank(const char *s)
{
	while (*s && isspace((unsigned char)*s))
		s++;
	return !*s;
}

/* Reads every step record of `file` (a regular file) into t. A line that is not JSON is
 * an error naming its number -- except an unterminated last line, which
 * a run still writing (or killed while writing) leaves: that one is
 * skipped with a warning. Returns OK or BAD (said). */
static int read_metrics(const char *file, table *t)
{
	struct stat st;
	const char *why = NULL;
	int fd = hpu__open_input_fd(file, 0, &st, &why); /* a FIFO or a device: refused */
	FILE *f = fd < 0 ? NULL : fdopen(fd, "r");
	if (fd >= 0 && !f)
		close(fd);
	if (!f)
		return fail("cannot %s %s: %s", st.st_mode ? "read" : "open", file,
			    fd >= 0 ? strerror(ENOMEM) : why);
	char *buf = NULL;
	size_t cap = 0;
	ssize_t len;
	long line = 0;
	int rc = OK;
	errno = 0;
	while (rc == OK && (len = getline(&buf, &cap, f)) >= 0) {
		line++;
		int ended = len > 0 && buf[len - 1] == '\n';
		if (blank(buf))
			continue;
		cJSON *j = cJSON_ParseWithOpts(buf, NULL, 1);
		if (!j && !ended && !blank(buf))
			hpu__tool_warn("%s:%ld: the last line is incomplete (a run still writing it?): "
				       "skipped",
				       file, line);
		else if (!j)
			rc = fail("%s:%ld: not JSON", file, line);
		else if (add_record(t, j, line) < 0)
			rc = fail("out of memory reading %s", file);
		t->records += j != NULL;
		cJSON_Delete(j);
	}
	if (rc == OK && ferror(f))
		rc = fail("cannot read %s: %s", file, strerror(errno ? errno : EIO));
	free(buf);
	fclose(f);
	return rc;
}

static int by_step_then_line(const void *a, const void *b)
{
	const point *x = a, *y = b;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	return (x->line > y->line) - (x->line < y->line);
}

static int vby_step_then_line(const void *a, const void *b)
{
	const vpoint *x = a, *y = b;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	return (x->line > y->line) - (x->line < y->line);
}

/* Sorts t by step, keeping only the last record (in the file) of each;
 * the validation records too. */
static void keep_last_per_step(table *t)
{
	if (t->vn > 1)
		qsort(t->vp, t->vn, sizeof *t->vp, vby_step_then_line);
	size_t v = 0;
	for (size_t i = 0; i < t->vn; i++)
		if (i + 1 == t->vn || t->vp[i + 1].step != t->vp[i].step)
			t->vp[v++] = t->vp[i];
	t->vn = v;
	if (t->n > 1) /* t->p is NULL when there is none */
		qsort(t->p, t->n, sizeof *t->p, by_step_then_line);
	size_t k = 0;
	for (size_t i = 0; i < t->n; i++) {
		if (i + 1 < t->n && t->p[i + 1].step == t->p[i].step) {
			free(t->p[i].in_use);
			free(t->p[i].max_in_use);
			continue;
		}
		t->p[k++] = t->p[i];
	}
	t->n = k;
}

/* ---- the table gnuplot reads ---- */

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

static void put(FILE *f, double v, int positive_only)
{
	if (isnan(v) || (positive_only && v <= 0))
		fputs(" ?", f);
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
static int plan(const table *t, layout *L)
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
static int write_vtable(FILE *f, const table *t)
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
static int write_table(FILE *f, const table *t, const layout *L)
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
static int write_script(FILE *f, const args *A, const table *t, const layout *L)
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
		   "set datafile missing '?'\n"
		   "set grid\nunset key\nset xlabel 'step'\n",
		A->width, A->height, A->width, A->height);
	if (t->n == 1 || t->p[0].step == t->p[t->n - 1].step)
		fprintf(f, "set xrange [%.10g:%.10g]\n", t->p[0].step - 1, t->p[0].step + 1);
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

/* ---- running gnuplot ---- */

/* The gnuplot program on PATH, as an absolute path (caller frees); NULL
 * if there is none. */
static char *find_gnuplot(void)
{
	const char *path = hpu__env_str(HPU_ENV_PATH);
	if (!path || !*path)
		path = "/usr/local/bin:/usr/bin:/bin";
	char cwd[4096];
	while (*path) {
		size_t n = strcspn(path, ":");
		char dir[4096];
		if (n == 0)
			snprintf(dir, sizeof dir, ".");
		else
			snprintf(dir, sizeof dir, "%.*s", (int)n, path);
		path += n + (path[n] == ':');
		char *cand = NULL;
		if (dir[0] != '/' && getcwd(cwd, sizeof cwd))
			(void)!asprintf(&cand, "%s/%s/gnuplot", cwd, dir);
		else if (dir[0] == '/')
			(void)!asprintf(&cand, "%s/gnuplot", dir);
		struct stat st;
		if (cand && stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0)
			return cand;
		free(cand);
	}
	return NULL;
}

/* `dir`/`name` into buf. */
static const char *in_dir(char *buf, size_t len, const char *dir, const char *name)
{
	snprintf(buf, len, "%s/%s", dir, name);
	return buf;
}

/* Copies what gnuplot said (file `err`) to our stderr, each line marked. */
static void pass_on(const char *err)
{
	FILE *f = fopen(err, "r");
	if (!f)
		return;
	char line[1024];
	int any = 0;
	while (fgets(line, sizeof line, f)) {
		if (blank(line))
			continue;
		line[strcspn(line, "\n")] = 0;
		hpu__log(HPU_LOG_ERROR, "gnuplot: %s", line);
		any = 1;
	}
	if (!any)
		hpu__log(HPU_LOG_ERROR, "gnuplot said nothing on stderr");
	fclose(f);
}

/* Waits at most GNUPLOT_TIMEOUT_S for pid; kills it after that. Returns
 * its wait status, or -1 if it had to be killed. */
static int wait_bounded(pid_t pid)
{
	struct timespec nap = {0, 20 * 1000 * 1000};
	for (long waited_ms = 0; waited_ms < GNUPLOT_TIMEOUT_S * 1000L; waited_ms += 20) {
		int status;
		pid_t r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			return status;
		if (r < 0 && errno != EINTR)
			return -1;
		nanosleep(&nap, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

/* Runs `gnuplot plot.gp` in `dir`, its stdout to out_fd, its stderr to
 * dir/gnuplot.err; OK or BAD (said, with gnuplot's stderr). */
static int run_gnuplot(const char *gp, const char *dir, int out_fd)
{
	char err[4200];
	in_dir(err, sizeof err, dir, "gnuplot.err");
	int err_fd = open(err, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (err_fd < 0 || null_fd < 0) {
		if (err_fd >= 0)
			close(err_fd);
		if (null_fd >= 0)
			close(null_fd);
		return fail("cannot create %s: %s", err, strerror(errno));
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		if (chdir(dir) < 0 || dup2(null_fd, 0) < 0 || dup2(out_fd, 1) < 0 ||
		    dup2(err_fd, 2) < 0)
			_exit(127);
		execl(gp, "gnuplot", "plot.gp", (char *)NULL);
		dprintf(2, "cannot run %s: %s\n", gp, strerror(errno));
		_exit(127);
	}
	int fork_errno = errno;
	close(err_fd);
	close(null_fd);
	if (pid < 0)
		return fail("cannot start gnuplot: %s", strerror(fork_errno));
	int status = wait_bounded(pid), rc;
	if (status == -1)
		rc = fail("gnuplot (%s) did not finish within %d s and was killed", gp,
			  GNUPLOT_TIMEOUT_S);
	else if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return OK;
	else if (WIFEXITED(status))
		rc = fail("gnuplot (%s) failed with exit status %d", gp, WEXITSTATUS(status));
	else
		rc = fail("gnuplot (%s) was killed by signal %d", gp, WTERMSIG(status));
	pass_on(err);
	return rc;
}

/* ---- the output ---- */

/* The default output: `metrics` with its extension (if any, in its last
 * component) replaced by .png. Caller frees. */
static char *default_out(const char *metrics)
{
	const char *base = strrchr(metrics, '/');
	base = base ? base + 1 : metrics;
	const char *dot = strrchr(base, '.');
	size_t keep = dot && dot != base ? (size_t)(dot - metrics) : strlen(metrics);
	char *out = NULL;
	if (asprintf(&out, "%.*s.png", (int)keep, metrics) < 0)
		return NULL;
	return out;
}

/* Whether paths a and b name the same existing file. */
static int same_file(const char *a, const char *b)
{
	struct stat x, y;
	return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev &&
	       x.st_ino == y.st_ino;
}

/* Whether fd (a file just written) holds a whole PNG: the signature
 * first and the IEND chunk last (gnuplot may exit 0 after a short write,
 * on a full disk). */
static int looks_like_png(int fd)
{
	static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
	static const unsigned char iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
	unsigned char b[12];
	off_t end = lseek(fd, 0, SEEK_END);
	return end >= (off_t)(sizeof sig + sizeof iend) && pread(fd, b, 8, 0) == 8 &&
	       !memcmp(b, sig, sizeof sig) && pread(fd, b, 12, end - 12) == 12 &&
	       !memcmp(b, iend, sizeof iend);
}

/* Copies the PNG in fd to `to`, the descriptor of `out`, a device or a
 * pipe (written in place: renaming over it would replace it), every
 * write checked. */
static int copy_out(int fd, int to, const char *out)
{
	char buf[65536];
	off_t at = 0;
	ssize_t n;
	while ((n = pread(fd, buf, sizeof buf, at)) > 0) {
		if (hpu__write_all(to, buf, (size_t)n) < 0)
			return fail("cannot write %s: %s", out, strerror(errno));
		at += n;
	}
	if (n < 0)
		return fail("cannot read the PNG back: %s", strerror(errno));
	return OK;
}

/* Runs gnuplot into fd, a regular file at `into`, and checks the PNG. */
static int render(const char *gp, const char *dir, int fd, const char *into)
{
	int rc = run_gnuplot(gp, dir, fd);
	if (rc == OK && !looks_like_png(fd))
		rc = fail("gnuplot wrote no complete PNG to %s (a full disk?)", into);
	return rc;
}

/* Writes table and script into dir, runs gnuplot into OUT's temporary
 * file and renames that to OUT (an hpu_outfile); for an OUT written in
 * place (a device or a pipe), into dir/plot.png, then copied. */
static int draw(const args *A, const table *t, const layout *L, const char *gp,
		const char *dir)
{
	char data[4200], script[4200], png[4200];
	FILE *f = fopen(in_dir(data, sizeof data, dir, "data.txt"), "w");
	int bad = !f || write_table(f, t, L) < 0;
	if (f && fclose(f) != 0)
		bad = 1;
	if (bad)
		return fail("cannot write %s: %s", data, strerror(errno));
	if (t->vn) {
		f = fopen(in_dir(data, sizeof data, dir, "val.txt"), "w");
		bad = !f || write_vtable(f, t) < 0;
		if (f && fclose(f) != 0)
			bad = 1;
		if (bad)
			return fail("cannot write %s: %s", data, strerror(errno));
	}
	f = fopen(in_dir(script, sizeof script, dir, "plot.gp"), "w");
	bad = !f || write_script(f, A, t, L) < 0;
	if (f && fclose(f) != 0)
		bad = 1;
	if (bad)
		return fail("cannot write %s: %s", script, strerror(errno));
	hpu_outfile o;
	const char *step;
	int rc = OK;
	if (hpu__outfile_open(&o, A->out, 0666) < 0) {
		rc = fail("cannot write %s: %s", o.direct ? A->out : o.tmp, strerror(errno));
	} else if (!o.direct) {
		rc = render(gp, dir, o.fd, o.tmp);
	} else { /* the PNG is read back: a regular file first */
		int fd = open(in_dir(png, sizeof png, dir, "plot.png"),
			      O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
		rc = fd < 0 ? fail("cannot write %s: %s", png, strerror(errno))
			    : render(gp, dir, fd, png);
		if (rc == OK)
			rc = copy_out(fd, o.fd, A->out);
		if (fd >= 0)
			close(fd);
	}
	if (rc == OK && hpu__outfile_commit(&o, &step) != 0) {
		if (!strcmp(step, "rename"))
			rc = fail("cannot rename %s to %s: %s", o.tmp, o.path, strerror(errno));
		else
			rc = fail("cannot write %s: %s", o.direct ? A->out : o.tmp,
				  strerror(errno));
	}
	hpu__outfile_abort(&o); /* what is left after a failure */
	return rc;
}

/* Makes the temporary directory, draws, removes the directory. */
static int draw_in_tmpdir(const args *A, const table *t, const layout *L, const char *gp)
{
	const char *base = hpu__env_str(HPU_ENV_TMPDIR);
	char dir[4096], p[4200];
	snprintf(dir, sizeof dir, "%s/hpu-plot.XXXXXX", base && *base ? base : "/tmp");
	if (!mkdtemp(dir))
		return fail("cannot make a temporary directory in %s: %s",
			    base && *base ? base : "/tmp", strerror(errno));
	int rc = draw(A, t, L, gp, dir);
	static const char *const files[] = {"data.txt", "val.txt", "plot.gp", "gnuplot.err",
					    "plot.png"};
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
		unlink(in_dir(p, sizeof p, dir, files[i]));
	rmdir(dir);
	return rc;
}

/* ---- main ---- */

static int plot(args *A)
{
	table t = {0};
	layout L;
	char *def_out = NULL, *gp = NULL;
	int rc = read_metrics(A->metrics, &t);
	if (rc != OK)
		goto done;
	if (t.records == 0) {
		rc = fail("%s is empty: no metrics records to plot (hpulaunch --metrics FILE "
			  "writes them)",
			  A->metrics);
		goto done;
	}
	keep_last_per_step(&t);
	if (plan(&t, &L) < 0) {
		rc = fail("out of memory");
		goto done;
	}
	if (!L.have[0]) {
		rc = fail("%s has no step records with a loss: nothing to plot", A->metrics);
		goto done;
	}
	if (A->print_data) {
		rc = write_table(stdout, &t, &L) < 0 || (t.vn && fputc('\n', stdout) == EOF) ||
				     write_vtable(stdout, &t) < 0 || fflush(stdout) != 0
			     ? fail("cannot write the table to standard output: %s", strerror(errno))
			     : OK;
		goto done;
	}
	if (!A->out && !(A->out = def_out = default_out(A->metrics))) {
		rc = fail("out of memory");
		goto done;
	}
	if (!strcmp(A->out, A->metrics) || same_file(A->out, A->metrics)) {
		rc = fail("the output %s is the metrics file itself", A->out);
		goto done;
	}
	if (!A->title) {
		const char *slash = strrchr(A->metrics, '/');
		A->title = slash && slash[1] ? slash + 1 : A->metrics;
	}
	if (!(gp = find_gnuplot())) {
		rc = fail("gnuplot not found: install gnuplot-nox (deploy/install-deps.sh does)");
		goto done;
	}
	rc = draw_in_tmpdir(A, &t, &L, gp);
done:
	free(gp);
	free(def_out);
	table_free(&t);
	return rc;
}

int main(int argc, char **argv)
{
	if (hpu__tool_start("hpu-plot") < 0)
		return HPU_TOOL_USAGE;
	args A;
	int rc = parse_args(argc, argv, &A);
	if (rc < 0)
		rc = plot(&A);
	/* what went to standard output must have got there (a full disk...) */
	if (fflush(stdout) != 0 || ferror(stdout)) {
		if (rc == OK)
			fail("cannot write the standard output: %s", strerror(errno));
		rc = rc == OK ? BAD : rc;
	}
	return rc;
}
