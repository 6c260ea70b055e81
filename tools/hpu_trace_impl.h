/* hpu_trace_impl: what the files of hpu-trace share. Not installed.
 *
 * The calls run one way: hpu_trace.c (main, the options, the run's order)
 * calls hpu_trace_inputs.c (finding the inputs), hpu_trace_merge.c (the
 * merged trace) and hpu_trace_summary.c (the table printed); all of them
 * call hpu_trace_read.c (reading one input, the actions, memory), which
 * calls none of them. */
#ifndef HPU_TOOLS_HPU_TRACE_IMPL_H
#define HPU_TOOLS_HPU_TRACE_IMPL_H

#include <stddef.h>
#include <stdio.h>

#include <cJSON.h>

#include "tools/tool.h"

enum { OK = HPU_TOOL_OK, BAD = HPU_TOOL_BAD, USAGE = HPU_TOOL_USAGE };
#define fail hpu__tool_fail
#define warn hpu__tool_warn

/* ---- one input (hpu_trace_read.c) ---- */

/* A complete event's bounds, µs: dur at most 10^13 (115 days), ts at most
 * 10^17 from 0 (a clock since 1970 is 1.8e15 now). Outside them an edited
 * or damaged event is left out of the summary (with a warning) rather
 * than summed into inf. */
#define HPU__TRC_MAX_DUR 1e13
#define HPU__TRC_MAX_TS 1e17

typedef struct trace {
	char *path;        /* as given or found in a directory */
	char *text;        /* the file's text, repaired if it was torn */
	size_t len;
	int rank;
	int order;         /* its place among the inputs */
	int world_size;    /* otherData.world_size, or -1 */
	int attempt;       /* otherData.attempt (the job's restart), or -1 */
	char *hostname;    /* otherData.hostname, or NULL */
	char *job_id;      /* otherData.job_id, or NULL */
	cJSON *other;      /* a copy of otherData, or NULL */
	int has_barrier;   /* found its first barrier */
	double barrier_end; /* ts + dur of that barrier, µs */
	double min_ts;     /* the earliest ts, µs (INFINITY if none) */
	long events;       /* traceEvents entries */
	long steps;        /* "step" complete events */
	double shift;      /* µs added to every ts when merging */
} trace;

typedef struct action {
	char *name;
	long count;
	double total, max; /* µs */
} action;

/* Actions by name: an open-addressing hash table. */
typedef struct actions {
	action *a;
	size_t n, cap; /* cap a power of two */
	double step_total; /* µs, over every rank */
	long steps;
} actions;

/* realloc and strdup that exit (1, said) when out of memory. */
void *hpu__trc_xrealloc(void *p, size_t n);
char *hpu__trc_xstrdup(const char *s);
void hpu__trc_trace_free(trace *t);
/* R of ".../NAME-rank<R>.json" (and NAME into name), or -1. */
int hpu__trc_name_rank(const char *path, char *name, size_t n);
/* t->text read whole; BAD (said) if it cannot be. */
int hpu__trc_read_file(trace *t);
/* t->text parsed (repaired if torn); NULL after saying why (quiet: not). */
cJSON *hpu__trc_parse(trace *t, int quiet);
/* o's string `key`, or NULL. */
const char *hpu__trc_str(const cJSON *o, const char *key);
/* t's fields from doc, its complete events added to s; BAD (said). */
int hpu__trc_scan(trace *t, cJSON *doc, actions *s);

/* ---- the inputs (hpu_trace_inputs.c) ---- */

typedef struct inputs {
	trace *t;
	int n, cap;
} inputs;

void hpu__trc_add_input(inputs *in, const char *path);
/* Every *-rank<R>.json of dir added; BAD (said) if none, or two runs'. */
int hpu__trc_add_dir(inputs *in, const char *dir);
/* qsort's order: by rank, then as given. */
int hpu__trc_by_rank(const void *a, const void *b);
/* DIR/NAME-merged.json (caller frees). */
char *hpu__trc_default_output(const char *first, int first_is_dir, const inputs *in);
/* The input that file out is (hpu__same_file), or NULL. */
const trace *hpu__trc_output_is_input(const inputs *in, const char *out);

/* ---- the merged trace (hpu_trace_merge.c) ---- */

/* Every trace's shift set; how many ranks were aligned. */
int hpu__trc_align(inputs *in);
/* The merged trace written to out (atomically); OK or BAD (said). */
int hpu__trc_write_merged(inputs *in, const char *out, int aligned, long *written);

/* ---- the summary (hpu_trace_summary.c) ---- */

enum sort_key { BY_TOTAL, BY_COUNT, BY_MEAN, BY_MAX, BY_NAME };
/* --sort (hpu_trace.c sets it). */
extern enum sort_key hpu__trc_sort_key;
/* The table of actions printed into f, the first `top` (0: all). */
void hpu__trc_summary(FILE *f, actions *s, const inputs *in, int top);

#endif
