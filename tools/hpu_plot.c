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
 * record (checkpoint reports, the "final" record) is skipped. A resumed run appends to the file: at its
 * "checkpoint": "loaded" record the records past the resumed step are
 * dropped (the abandoned run's), the last record of each step is kept,
 * and the steps are drawn in ascending order. The data and the script go to a temporary directory
 * (removed afterwards); gnuplot writes the PNG to its standard output,
 * which is OUT.tmp.PID, renamed to OUT once gnuplot has succeeded -- so the
 * output path never appears in the script, and a failed run leaves no
 * half-written file (an OUT that is a device or a pipe gets a copy of a
 * PNG drawn in the temporary directory). Exit status: 0 drawn, 1 failed,
 * 2 usage.
 *
 * This file is the command line (main, the options) and the run's
 * order; hpu_plot_impl.h says which file does what. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "common/opt.h"
#include "common/optdoc.h"
#include "tools/hpu_plot_impl.h"
#include "tools/tool.h"

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
	"Step records are drawn, other records skipped; where a run resumed\n"
	"(appending to the file), what the abandoned run logged past the\n"
	"resumed step is dropped. Needs gnuplot (Debian: gnuplot-nox).\n"
	"\n"
	"options:\n";

static const char *const help_tail =
	"\n"
	"Exit status: 0 drawn, 1 failed (unreadable file, a line that is not\n"
	"JSON or whose \"step\" is not a number, nothing to plot, gnuplot\n"
	"missing or failing), 2 usage.\n";

/* ---- arguments ---- */

enum { OPT_HELP = 1, OPT_PRINT_DATA, OPT_OUTPUT, OPT_TITLE, OPT_WIDTH, OPT_HEIGHT, OPT_HELP_DOC, OPT_LOG_LEVEL };

/* The parser's table and the help's (--help, man/hpu-plot.1,
 * docs/reference/hpu-plot.md). */
static const hpu_optspec specs[] = {
	{"output", 'o', HPU_OPT_VALUE, OPT_OUTPUT, "OUT",
	 .help = "the PNG (default: METRICS with its extension replaced by .png); written as OUT.tmp.PID, "
		 "then renamed (a device or a pipe: written in place)"},
	{"width", 0, HPU_OPT_VALUE, OPT_WIDTH, "PX", .help = "image width in pixels (default 1200, 200..16384)"},
	{"height", 0, HPU_OPT_VALUE, OPT_HEIGHT, "PX", .help = "image height in pixels (default 900, 200..16384)"},
	{"title", 0, HPU_OPT_VALUE, OPT_TITLE, "T", .help = "the title above the panels (default: METRICS's name)"},
	{"print-data", 0, HPU_OPT_FLAG, OPT_PRINT_DATA, NULL,
	 .help = "print the table that would be drawn (MiB for memory, NaN where a value is missing: a gap in the plot), "
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

/* ---- main ---- */

static int plot(args *A)
{
	table t = {0};
	layout L;
	char *def_out = NULL, *gp = NULL;
	int rc = hpu__plt_read_metrics(A->metrics, &t);
	if (rc != OK)
		goto done;
	if (t.records == 0) {
		/* a run that has just started: its first line, still being
		 * written, is not "empty" */
		rc = t.torn ? fail("%s holds no complete metrics record yet: nothing to plot",
				   A->metrics)
			    : fail("%s is empty: no metrics records to plot (hpulaunch --metrics "
				   "FILE writes them)",
				   A->metrics);
		goto done;
	}
	hpu__plt_keep_last_per_step(&t);
	if (hpu__plt_plan(&t, &L) < 0) {
		rc = fail("out of memory");
		goto done;
	}
	if (!t.n || !L.have[0]) { /* (validations' losses count in have[0]) */
		rc = fail("%s has no step records with a loss: nothing to plot", A->metrics);
		goto done;
	}
	if (A->print_data) {
		rc = hpu__plt_write_table(stdout, &t, &L) < 0 || (t.vn && fputc('\n', stdout) == EOF) ||
				     hpu__plt_write_vtable(stdout, &t) < 0 || fflush(stdout) != 0
			     ? fail("cannot write the table to standard output: %s", strerror(errno))
			     : OK;
		goto done;
	}
	if (!A->out && !(A->out = def_out = hpu__plt_default_out(A->metrics))) {
		rc = fail("out of memory");
		goto done;
	}
	if (!strcmp(A->out, A->metrics) || hpu__plt_same_file(A->out, A->metrics)) {
		rc = fail("the output %s is the metrics file itself", A->out);
		goto done;
	}
	if (!A->title) {
		const char *slash = strrchr(A->metrics, '/');
		A->title = slash && slash[1] ? slash + 1 : A->metrics;
	}
	if (!(gp = hpu__plt_find_gnuplot())) {
		rc = fail("gnuplot not found: install gnuplot-nox (deploy/install-deps.sh does)");
		goto done;
	}
	rc = hpu__plt_draw_in_tmpdir(A, &t, &L, gp);
done:
	free(gp);
	free(def_out);
	hpu__plt_table_free(&t);
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
