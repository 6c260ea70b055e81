/* hpu-trace: merges the per-rank Chrome traces that hpu-worker --profile
 * writes (DIR/NAME-rank<R>.json) into one timeline and prints a summary
 * table of the actions.
 *
 *   hpu-trace [-o OUT.json] [--no-merge] [--top N] [--sort KEY] PATH...
 *
 * Each file is read whole with cJSON. A file that does not parse is taken
 * as one torn by a killed worker: its trailing lines are dropped back to
 * the last complete event and it is closed with "]}" (a warning says so).
 * The merged file has one process row per rank (pid = rank), the clocks
 * aligned at the job's first barrier (its end is the same instant on every
 * rank) and then shifted so that the earliest event is at ts 0. Events
 * are written one at a time (cJSON_PrintUnformatted each), so only one
 * input's tree is in memory at a time besides the files' text.
 *
 * A file holding more after the end of its JSON (a writer stopped by a
 * full disk) is read up to that end, with a warning. An output that is
 * one of the inputs, and an input that is already a merge
 * (otherData.merged_by), are refused.
 *
 * Exit status: 0 done, 1 a file unreadable, not a trace, already a merge,
 * the output, or two files of the same rank (the message names the
 * file), 2 usage.
 *
 * This file is the command line (main, the options) and the run's
 * order; hpu_trace_impl.h says which file does what. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/num.h"
#include "common/opt.h"
#include "common/optdoc.h"
#include "tools/hpu_trace_impl.h"
#include "tools/tool.h"

static const char *const help =
	"usage: hpu-trace [-o OUT.json] [--no-merge] [--top N]\n"
	"                 [--sort total|count|mean|max|name] PATH...\n"
	"\n"
	"Merges the per-rank Chrome traces of hpu-worker --profile into one\n"
	"timeline (for chrome://tracing or https://ui.perfetto.dev) and prints\n"
	"a summary of the actions: count, total, mean and max time, and the\n"
	"share of the step time.\n"
	"\n"
	"PATH is a trace file or a directory; a directory stands for every\n"
	"*-rank<R>.json in it. Every file must be of a different rank, none may\n"
	"be a merged trace, and the output may not be one of them.\n"
	"\n"
	"options:\n";

static const char *const help_tail =
	"\n"
	"The merged file has one process row per rank (\"rank R (host)\", in\n"
	"rank order). Clocks are aligned at the job's first barrier: every\n"
	"rank's events are shifted so that its first barrier ends when rank 0's\n"
	"does; then all so that the earliest event is at 0. otherData says by\n"
	"how much (offsets_us). A file torn by a killed worker is repaired: its\n"
	"incomplete last lines are dropped, with a warning; lines after the end\n"
	"of a file's JSON (a worker stopped by a full disk) are ignored, with a\n"
	"warning.\n"
	"\n"
	"Exit status: 0 done, 1 a file could not be read, is not a trace or is\n"
	"already a merged one, or is the output (or two files hold the same\n"
	"rank), 2 usage.\n";

/* ---- main ---- */

typedef struct opts {
	const char *out;
	int no_merge, top;
	const char **paths;
	int npaths;
} opts;

enum { OPT_HELP = 1, OPT_NO_MERGE, OPT_OUTPUT, OPT_TOP, OPT_SORT, OPT_HELP_DOC, OPT_LOG_LEVEL };

/* The parser's table and the help's (--help, man/hpu-trace.1,
 * docs/reference/hpu-trace.md). */
static const hpu_optspec specs[] = {
	{"output", 'o', HPU_OPT_VALUE, OPT_OUTPUT, "FILE",
	 .help = "the merged trace; - is standard output (default: DIR/NAME-merged.json, DIR the "
		 "first PATH's directory, NAME the files' name before -rank<R>.json)"},
	{"no-merge", 0, HPU_OPT_FLAG, OPT_NO_MERGE, NULL, .help = "only print the summary, write no file"},
	{"top", 0, HPU_OPT_VALUE, OPT_TOP, "N", .help = "print only the first N actions"},
	{"sort", 0, HPU_OPT_VALUE, OPT_SORT, "KEY",
	 .help = "order of the actions: total (default), count, mean, max (all largest first) or name"},
	{"log-level", 0, HPU_OPT_VALUE, OPT_LOG_LEVEL, "LEVEL", .help = HPU_TOOL_LOG_LEVEL_HELP,
	 .env = "HPU_LOG_LEVEL"},
	{"help", 'h', HPU_OPT_FLAG, OPT_HELP, NULL, .help = "this text"},
	/* the options' documentation (man/, docs/reference/): not listed */
	{"help-doc", 0, HPU_OPT_VALUE, OPT_HELP_DOC, .help = NULL},
	{0},
};

/* Returns -1 when parsed, OK after --help, USAGE after saying why not. */
static int parse_args(opts *o, int argc, char **argv)
{
	o->paths = hpu__trc_xrealloc(NULL, (size_t)argc * sizeof *o->paths);
	hpu_optparse p;
	hpu__optparse_init(&p, argc, argv, specs);
	for (int r; (r = hpu__optparse_next(&p)) != HPU_OPT_END;) {
		const char *val = p.val;
		if (r == HPU_OPT_POSITIONAL) {
			o->paths[o->npaths++] = val;
		} else if (r == OPT_HELP) {
			fputs(help, stdout);
			hpu__optdoc(stdout, specs, HPU_DOC_HELP, 21);
			fputs(help_tail, stdout);
			return OK;
		} else if (r == OPT_HELP_DOC) {
			return hpu__tool_doc(specs, val, 21);
		} else if (r == OPT_NO_MERGE) {
			o->no_merge = 1;
		} else if (r == HPU_OPT_MISSING) {
			/* named as written: -o or --output */
			return hpu__tool_usage(NULL, "%s needs a value", p.arg);
		} else if (r < 0) { /* unknown, or a flag with a value */
			return hpu__tool_usage(NULL, "unknown option '%s'", p.arg);
		} else if (r == OPT_OUTPUT) {
			/* "-": standard output, as the summary goes to
			 * stderr then (it wrote a file named "-") */
			o->out = strcmp(val, "-") == 0 ? "/dev/stdout" : val;
		} else if (r == OPT_LOG_LEVEL) {
			if (hpu__tool_log_level(val))
				return USAGE;
		} else if (r == OPT_TOP) {
			if (hpu__parse_int(val, 1, 1000000, &o->top))
				return hpu__tool_usage(NULL, "--top wants a whole number of at least 1, not '%s'",
						   val);
		} else {
			static const char *keys[] = {"total", "count", "mean", "max", "name"};
			int k = 0;
			while (k < 5 && strcmp(val, keys[k]) != 0)
				k++;
			if (k == 5)
				return hpu__tool_usage(NULL, "--sort wants total, count, mean, max or name, not "
						   "'%s'",
						   val);
			hpu__trc_sort_key = (enum sort_key)k;
		}
	}
	if (o->npaths == 0)
		return hpu__tool_usage(NULL, "no trace given: name trace files or a directory of them");
	if (o->no_merge && o->out)
		return hpu__tool_usage(NULL, "-o and --no-merge together: --no-merge writes no file");
	return -1;
}

static int run(const opts *o)
{
	inputs in = {0};
	actions s = {0};
	char *out = NULL;
	int rc = OK, first_is_dir = 0;
	for (int i = 0; i < o->npaths && rc == OK; i++) {
		struct stat st;
		if (stat(o->paths[i], &st) != 0)
			rc = fail("%s: cannot open: %s", o->paths[i], strerror(errno));
		else if (S_ISDIR(st.st_mode))
			rc = hpu__trc_add_dir(&in, o->paths[i]), first_is_dir |= i == 0;
		else
			hpu__trc_add_input(&in, o->paths[i]);
	}
	if (rc == OK && !o->no_merge) {
		out = o->out ? hpu__trc_xstrdup(o->out) : hpu__trc_default_output(o->paths[0], first_is_dir, &in);
		/* written over, it would be lost: hpu_outfile renames onto it */
		const trace *same = hpu__trc_output_is_input(&in, out);
		if (same && !strcmp(same->path, out))
			rc = fail("the output %s is one of the inputs: merging into it would destroy that "
				  "trace; name another file with -o",
				  out);
		else if (same)
			rc = fail("the output %s is the input %s: merging into it would destroy that trace; "
				  "name another file with -o",
				  out, same->path);
	}
	for (int i = 0; i < in.n && rc == OK; i++) {
		trace *t = &in.t[i];
		if ((rc = hpu__trc_read_file(t)) != OK)
			break;
		cJSON *doc = hpu__trc_parse(t, 0);
		rc = doc ? hpu__trc_scan(t, doc, &s) : BAD;
		cJSON_Delete(doc);
	}
	if (rc != OK)
		goto done;
	qsort(in.t, (size_t)in.n, sizeof *in.t, hpu__trc_by_rank);
	for (int i = 1; i < in.n; i++)
		if (in.t[i].rank == in.t[i - 1].rank) {
			rc = fail("%s and %s both hold rank %d: give each rank's trace once",
				  in.t[i - 1].path, in.t[i].path, in.t[i].rank);
			goto done;
		}
	for (int i = 1; i < in.n; i++)
		if (in.t[i].job_id && in.t[0].job_id && strcmp(in.t[i].job_id, in.t[0].job_id)) {
			warn("%s is of job %s, %s of job %s: merging traces of different jobs",
			     in.t[0].path, in.t[0].job_id, in.t[i].path, in.t[i].job_id);
			break;
		}
	/* a restarted job's attempts: each aligned at its own first barrier,
	 * as if they had run at once (merged unsaid) */
	for (int i = 1; i < in.n; i++)
		if (in.t[i].attempt >= 0 && in.t[0].attempt >= 0 &&
		    in.t[i].attempt != in.t[0].attempt) {
			warn("%s is of the job's attempt %d, %s of attempt %d (restarts): merging "
			     "traces of different runs, each aligned at its own first barrier",
			     in.t[0].path, in.t[0].attempt, in.t[i].path, in.t[i].attempt);
			break;
		}
	if (in.t[0].world_size > in.n)
		warn("%d of the job's %d ranks given: the others are missing from the merge and "
		     "the summary",
		     in.n, in.t[0].world_size);
	/* the merged trace on standard output: the report after it would
	 * corrupt it (or, stdout a file renamed over, be lost) */
	FILE *report = stdout;
	if (!o->no_merge && hpu__tool_out_is_stdout(out))
		report = stderr;
	if (!o->no_merge) {
		int aligned = hpu__trc_align(&in);
		long written = 0;
		if ((rc = hpu__trc_write_merged(&in, out, aligned, &written)) != OK)
			goto done;
		fprintf(report, "merged %d rank%s (%ld events) into %s", in.n, in.n == 1 ? "" : "s",
			written, out);
		if (aligned > 1)
			fprintf(report, "; clocks aligned at the first barrier");
		fprintf(report, "\n");
	}
	hpu__trc_summary(report, &s, &in, o->top);
done:
	for (int i = 0; i < in.n; i++)
		hpu__trc_trace_free(&in.t[i]);
	free(in.t);
	for (size_t i = 0; i < s.cap; i++)
		free(s.a[i].name);
	free(s.a);
	free(out);
	return rc;
}

int main(int argc, char **argv)
{
	if (hpu__tool_start("hpu-trace") < 0)
		return HPU_TOOL_USAGE;
	opts o = {0};
	int rc = parse_args(&o, argc, argv);
	if (rc < 0)
		rc = run(&o);
	free(o.paths);
	/* the summary must have reached standard output (a full disk...) */
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fail("cannot write the standard output: %s", strerror(errno));
		rc = rc == OK ? BAD : rc;
	}
	return rc;
}
