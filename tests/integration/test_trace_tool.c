/* Integration test of hpu-trace, the real binary on real files:
 *
 * - two hand-written rank traces with clocks seconds apart: the merged
 *   file parses, has both process rows ("rank R (host)", sort index), every
 *   event, rank 1's first barrier ending when rank 0's does and the
 *   earliest event at 0; the summary's count, total, mean, max and %step
 *   of a known action; --no-merge, -o, --sort, --top;
 * - a rank without a barrier: merged unshifted, with a warning naming it;
 * - torn files (cut in the middle of a line; a write torn over the old
 *   tail): a warning, the complete events merged; lines after the
 *   closing "]}" (a short write on a full disk): a warning naming the
 *   file, the events before "]}" merged;
 * - an output that is one of the inputs (named so, spelled otherwise, a
 *   link to it) refused, the inputs intact; a merged trace as an input
 *   (named, or under a rank file's name in a directory) refused;
 * - errors: not JSON, no traceEvents, the same rank twice, a missing file,
 *   an empty directory (exit 1, the file named); usage errors (exit 2);
 * - inputs that are no files: /dev/zero and a link to it are refused at
 *   once naming a character device; a FIFO nobody writes is empty;
 * - a full disk: -o a link to /dev/full, and the summary into a full
 *   standard output, exit 1 naming the file and the error (the link is
 *   written through, not renamed over); -o a link to a regular file
 *   writes the file and leaves the link;
 * - -o standard output (/dev/stdout or /proc/self/fd/1 into a pipe or a
 *   file, or the file stdout is redirected to): the trace alone there,
 *   the report on stderr;
 * - the traces of a real 2-worker run of the MLP with --profile: both ranks
 *   merged with every event, aligned at their first barrier; the summary
 *   has step, forward, backward, optimizer_step and all_reduce with the
 *   counts the run implies.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/harness.h"

#define TOOL h_build("bin/hpu-trace")
#define LAUNCH h_build("bin/hpulaunch")
#define MODEL h_build("lib/fmnist_mlp.so")

static char T[256]; /* the test's temporary directory */

/* A fresh directory under T for one test. */
static const char *dir(const char *name)
{
	static char bufs[4][600];
	static int k;
	char *p = bufs[k++ & 3];
	snprintf(p, sizeof bufs[0], "%s/%s", T, name);
	assert_int_equal(mkdir(p, 0755), 0);
	return p;
}

static const char *in(const char *d, const char *file)
{
	static char bufs[8][800];
	static int k;
	char *p = bufs[k++ & 7];
	snprintf(p, sizeof bufs[0], "%s/%s", d, file);
	return p;
}


static int exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

/* Runs hpu-trace with argv (NULL-terminated), asserts its exit code,
 * returns stdout and stderr together (caller frees). */
static char *run_v(int want, const char **argv)
{
	const char *full[32] = {TOOL};
	int n = 1;
	for (; argv[n - 1] && n < 31; n++)
		full[n] = argv[n - 1];
	full[n] = NULL;
	proc p;
	int rc = h_run(&p, (char *const *)full, NULL, 60000);
	char *out = strdup(p.out ? p.out : "");
	h_free(&p);
	if (rc != want) {
		fprintf(stderr, "---- hpu-trace %s ... exited %d, expected %d; output:\n%s----\n",
			argv[0] ? argv[0] : "", rc, want, out);
		fail_msg("hpu-trace: exit %d, expected %d", rc, want);
	}
	return out;
}

#define TRACE(want, ...) run_v(want, (const char *[]){__VA_ARGS__, NULL})

static void has(const char *out, const char *needle)
{
	if (!strstr(out, needle))
		fail_msg("output does not say \"%s\":\n%s", needle, out);
}

static void lacks(const char *out, const char *needle)
{
	if (strstr(out, needle))
		fail_msg("output says \"%s\" but should not:\n%s", needle, out);
}

/* ---- the hand-written traces ---- */

/* Rank 0: clock near 1 s; its first barrier ends at 1000100.0. Two
 * steps of 10 ms, forward nested in each, my_custom_action 1.5 and 2.5 ms,
 * a second barrier later (not the first one). */
static const char *rank0 =
	"{\"otherData\":{\"tool\":\"hputrain\",\"version\":1,\"rank\":0,\"world_size\":2,"
	"\"node_rank\":0,\"hostname\":\"alpha\",\"job_id\":\"job-t\",\"clock\":\"CLOCK_MONOTONIC\"},"
	"\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
	"{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"rank 0\"}}\n"
	",{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,\"args\":{\"name\":\"main\"}}\n"
	",{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":2,\"args\":{\"name\":\"collectives\"}}\n"
	",{\"name\":\"barrier\",\"cat\":\"collective\",\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":1000000.000,\"dur\":100.000,\"args\":{\"bytes\":0,\"seq\":0}}\n"
	",{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1000200.000,\"dur\":10000.000,\"args\":{\"step\":1}}\n"
	",{\"name\":\"forward\",\"cat\":\"forward\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1000300.000,\"dur\":3000.000,\"args\":{\"step\":1}}\n"
	",{\"name\":\"my_custom_action\",\"cat\":\"user\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1004000.000,\"dur\":1500.000}\n"
	",{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1010300.000,\"dur\":10000.000,\"args\":{\"step\":2}}\n"
	",{\"name\":\"forward\",\"cat\":\"forward\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1010400.000,\"dur\":3000.000,\"args\":{\"step\":2}}\n"
	",{\"name\":\"my_custom_action\",\"cat\":\"user\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1014000.000,\"dur\":2500.000}\n"
	",{\"name\":\"barrier\",\"cat\":\"collective\",\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":1020400.000,\"dur\":50.000,\"args\":{\"bytes\":0,\"seq\":9}}\n"
	"\n]}\n";
#define RANK0_EVENTS 11

/* Rank 1: another host, clock near 7000 s; its first barrier (listed
 * after a later one, ts decides) ends at 7000000800.500; my_custom_action
 * 4 ms; an instant event. */
static const char *rank1 =
	"{\"otherData\":{\"tool\":\"hputrain\",\"version\":1,\"rank\":1,\"world_size\":2,"
	"\"node_rank\":1,\"hostname\":\"beta\",\"job_id\":\"job-t\",\"clock\":\"CLOCK_MONOTONIC\"},"
	"\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
	"{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"rank 1\"}}\n"
	",{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"main\"}}\n"
	",{\"name\":\"barrier\",\"cat\":\"collective\",\"ph\":\"X\",\"pid\":1,\"tid\":2,\"ts\":7000020000.000,\"dur\":10.000,\"args\":{\"bytes\":0,\"seq\":9}}\n"
	",{\"name\":\"barrier\",\"cat\":\"collective\",\"ph\":\"X\",\"pid\":1,\"tid\":2,\"ts\":7000000000.250,\"dur\":800.250,\"args\":{\"bytes\":0,\"seq\":0}}\n"
	",{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":7000000900.000,\"dur\":10000.000,\"args\":{\"step\":1}}\n"
	",{\"name\":\"my_custom_action\",\"cat\":\"user\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":7000001000.000,\"dur\":4000.000}\n"
	",{\"name\":\"stall\",\"cat\":\"stall\",\"ph\":\"i\",\"s\":\"t\",\"pid\":1,\"tid\":1,\"ts\":7000006000.000}\n"
	",{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":7000011000.000,\"dur\":10000.000,\"args\":{\"step\":2}}\n"
	"\n]}\n";
#define RANK1_EVENTS 8
#define RANK1_BARRIER_END 7000000800.5

static cJSON *load(const char *file)
{
	size_t n;
	char *text = h_slurp_n(file, &n);
	if (!text)
		fail_msg("cannot read %s", file);
	cJSON *doc = cJSON_ParseWithLength(text, n);
	if (!doc)
		fail_msg("%s does not parse as JSON near byte %td", file,
			 cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - text : -1);
	free(text);
	return doc;
}

static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(v) ? v->valuestring : "";
}

/* What the merged trace holds, per rank (pid rank + 1). */
typedef struct seen {
	int events[2], complete[2], instants[2];
	char process_name[2][64];
	int sort_index[2];
	double first_barrier_end[2], first_barrier_ts[2], min_ts;
	double step1_ts[2];
	int other_pid;
} seen;

static void look(const cJSON *doc, seen *s)
{
	memset(s, 0, sizeof *s);
	s->sort_index[0] = s->sort_index[1] = -1;
	s->first_barrier_ts[0] = s->first_barrier_ts[1] = INFINITY;
	s->min_ts = INFINITY;
	const cJSON *ev = cJSON_GetObjectItemCaseSensitive(doc, "traceEvents"), *e;
	assert_true(cJSON_IsArray(ev));
	cJSON_ArrayForEach(e, ev)
	{
		double pid = num(e, "pid"), ts = num(e, "ts"), dur = num(e, "dur");
		if (pid != 1 && pid != 2) {
			s->other_pid++;
			continue;
		}
		int p = (int)pid - 1;
		s->events[p]++;
		const char *ph = str(e, "ph"), *name = str(e, "name");
		const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
		if (!isnan(ts) && ts < s->min_ts)
			s->min_ts = ts;
		if (!strcmp(ph, "M") && !strcmp(name, "process_name"))
			snprintf(s->process_name[p], sizeof s->process_name[p], "%s", str(args, "name"));
		if (!strcmp(ph, "M") && !strcmp(name, "process_sort_index"))
			s->sort_index[p] = (int)num(args, "sort_index");
		if (!strcmp(ph, "i"))
			s->instants[p]++;
		if (strcmp(ph, "X") != 0)
			continue;
		s->complete[p]++;
		if (!strcmp(name, "barrier") && ts < s->first_barrier_ts[p]) {
			s->first_barrier_ts[p] = ts;
			s->first_barrier_end[p] = ts + dur;
		}
		if (!strcmp(name, "step") && num(args, "step") == 1)
			s->step1_ts[p] = ts;
	}
}

/* The summary row of action `name`: count, total, mean, max, %step. */
typedef struct row {
	long count;
	double total, mean, max, pct;
} row;

static row summary_row(const char *out, const char *name)
{
	row r = {0};
	char head[80];
	snprintf(head, sizeof head, "\n%s ", name);
	const char *l = strstr(out, head);
	if (!l)
		fail_msg("no summary row \"%s\":\n%s", name, out);
	if (sscanf(l + strlen(head), "%ld %lf %lf %lf %lf", &r.count, &r.total, &r.mean, &r.max,
		   &r.pct) != 5)
		fail_msg("summary row \"%s\" does not read as 5 numbers:\n%s", name, out);
	return r;
}

static void two_ranks(const char *d)
{
	assert_int_equal(h_write_file(in(d, "perf-logs-rank0.json"), rank0, 0644), 0);
	assert_int_equal(h_write_file(in(d, "perf-logs-rank1.json"), rank1, 0644), 0);
}

/* ---- merging ---- */

static void test_merge(void **state)
{
	(void)state;
	const char *d = dir("merge");
	two_ranks(d);
	assert_int_equal(h_write_file(in(d, "notes.txt"), "not a trace, not named like one\n", 0644), 0);
	char *out = TRACE(0, d);
	const char *merged = in(d, "perf-logs-merged.json");
	has(out, "merged 2 ranks");
	has(out, merged);
	has(out, "clocks aligned at the first barrier");
	lacks(out, "warning");

	cJSON *doc = load(merged);
	/* the inputs, as older versions wrote them, have displayTimeUnit and
	 * pids from 0; the merged trace has neither */
	assert_null(cJSON_GetObjectItemCaseSensitive(doc, "displayTimeUnit"));
	seen s;
	look(doc, &s);
	assert_int_equal(s.other_pid, 0);
	/* every event, the process_name replaced, a sort index added */
	assert_int_equal(s.events[0], RANK0_EVENTS + 1);
	assert_int_equal(s.events[1], RANK1_EVENTS + 1);
	assert_int_equal(s.complete[0], 8);
	assert_int_equal(s.complete[1], 5);
	assert_int_equal(s.instants[1], 1);
	assert_string_equal(s.process_name[0], "rank 0 (alpha)");
	assert_string_equal(s.process_name[1], "rank 1 (beta)");
	assert_int_equal(s.sort_index[0], 0);
	assert_int_equal(s.sort_index[1], 1);
	/* aligned at the first barrier's end, earliest event at 0 */
	double diff = fabs(s.first_barrier_end[1] - s.first_barrier_end[0]);
	if (diff > 0.001)
		fail_msg("first barriers end at %.6f (rank 0) and %.6f (rank 1): maxdiff %.6f us",
			 s.first_barrier_end[0], s.first_barrier_end[1], diff);
	assert_true(fabs(s.min_ts) < 1e-9);
	/* rank 1's events keep their distances: step 1 starts 99.5 us after
	 * its first barrier ends */
	assert_true(fabs(s.step1_ts[1] - s.first_barrier_end[1] - 99.5) < 0.001);
	/* rank 1's barrier took 800.25 us, so it started earliest: at 0 */
	assert_true(fabs(s.first_barrier_ts[1]) < 0.001);
	assert_true(fabs(s.first_barrier_ts[0] - 700.25) < 0.001);

	const cJSON *other = cJSON_GetObjectItemCaseSensitive(doc, "otherData");
	assert_string_equal(str(other, "aligned_at"), "first barrier");
	assert_string_equal(str(other, "job_id"), "job-t");
	const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(other, "ranks");
	assert_int_equal(cJSON_GetArraySize(ranks), 2);
	const cJSON *offs = cJSON_GetObjectItemCaseSensitive(other, "offsets_us");
	/* merged ts = own ts + offset */
	assert_true(fabs(num(offs, "1") - (0 - 7000000000.25)) < 0.001);
	assert_true(fabs(num(offs, "0") - (700.25 - 1000000.0)) < 0.001);
	cJSON_Delete(doc);

	/* the file is in the writer's own format: one event a line */
	char *text = h_slurp(merged);
	assert_non_null(text);
	size_t len = strlen(text);
	assert_true(len > 4 && !strcmp(text + len - 4, "\n]}\n"));
	assert_non_null(strstr(text, "\"traceEvents\":[\n{\"name\":\"process_name\""));
	assert_non_null(strstr(text, "}\n,{\"name\":\"process_sort_index\""));
	free(text);

	/* the summary: my_custom_action 1.5 + 2.5 + 4 ms of 4 x 10 ms steps */
	row r = summary_row(out, "my_custom_action");
	assert_int_equal(r.count, 3);
	assert_true(fabs(r.total - 8.0) < 1e-9);
	assert_true(fabs(r.mean - 2.667) < 1e-9);
	assert_true(fabs(r.max - 4.0) < 1e-9);
	assert_true(fabs(r.pct - 20.0) < 1e-9);
	r = summary_row(out, "step");
	assert_int_equal(r.count, 4);
	assert_true(fabs(r.total - 40.0) < 1e-9 && fabs(r.pct - 100.0) < 1e-9);
	r = summary_row(out, "barrier");
	assert_int_equal(r.count, 4);
	assert_true(fabs(r.max - 0.80025) < 0.0006);
	has(out, "action            count  total_ms  mean_ms  max_ms  %step\n");
	has(out, "2 ranks, 4 steps (2 per rank), step time 40.000 ms");
	has(out, "does not add up to 100%");
	lacks(out, "stall "); /* instant events are not actions */
	/* sorted by total: step, my_custom_action (8 ms), forward (6 ms) */
	const char *a = strstr(out, "\nstep "), *b = strstr(out, "\nmy_custom_action "),
		   *c = strstr(out, "\nforward ");
	assert_true(a && b && c && a < b && b < c);
	free(out);

	/* --no-merge writes nothing; --sort, --top; -o; files named one by one */
	assert_int_equal(remove(merged), 0);
	out = TRACE(0, "--no-merge", "--sort", "count", "--top", "2", d);
	assert_false(exists(merged));
	lacks(out, "merged");
	a = strstr(out, "\nbarrier "), b = strstr(out, "\nstep ");
	assert_true(a && b && a < b); /* 4 each: the name decides */
	lacks(out, "\nmy_custom_action ");
	has(out, "(2 more actions; --top 2 shows the first 2)");
	free(out);
	const char *o = in(d, "mine.json");
	out = TRACE(0, in(d, "perf-logs-rank1.json"), "-o", o, in(d, "perf-logs-rank0.json"));
	assert_false(exists(merged));
	doc = load(o);
	look(doc, &s);
	assert_int_equal(s.events[0] + s.events[1], RANK0_EVENTS + RANK1_EVENTS + 2);
	cJSON_Delete(doc);
	free(out);
}

/* A rank without a barrier: warned about, merged without alignment. */
static void test_no_barrier(void **state)
{
	(void)state;
	const char *d = dir("nobarrier");
	assert_int_equal(h_write_file(in(d, "run-rank0.json"), rank0, 0644), 0);
	/* rank 1 without its barrier lines */
	char *r1 = strdup(rank1), *p;
	while ((p = strstr(r1, ",{\"name\":\"barrier\""))) {
		char *nl = strchr(p, '\n');
		memmove(p, nl + 1, strlen(nl + 1) + 1);
	}
	assert_int_equal(h_write_file(in(d, "run-rank1.json"), r1, 0644), 0);
	free(r1);
	char *out = TRACE(0, d);
	has(out, "warning: rank 1 (");
	has(out, "run-rank1.json) has no barrier event");
	cJSON *doc = load(in(d, "run-merged.json"));
	seen s;
	look(doc, &s);
	/* rank 1 unshifted but for the common shift to 0: rank 0's barrier
	 * (1000000.0) is the earliest event */
	assert_true(fabs(s.first_barrier_ts[0]) < 1e-9);
	assert_true(fabs(s.step1_ts[1] - (7000000900.0 - 1000000.0)) < 0.001);
	const cJSON *other = cJSON_GetObjectItemCaseSensitive(doc, "otherData");
	const cJSON *un = cJSON_GetObjectItemCaseSensitive(other, "unaligned_ranks");
	assert_int_equal(cJSON_GetArraySize(un), 1);
	assert_int_equal(cJSON_GetArrayItem(un, 0)->valueint, 1);
	cJSON_Delete(doc);
	free(out);
}

/* ---- torn files ---- */

static void test_torn(void **state)
{
	(void)state;
	/* cut in the middle of the last event line, no tail */
	const char *d = dir("torn");
	assert_int_equal(h_write_file(in(d, "perf-logs-rank0.json"), rank0, 0644), 0);
	char *r1 = strdup(rank1);
	char *last = strstr(r1, ",{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":7000011000");
	assert_non_null(last);
	last[40] = 0;
	assert_int_equal(h_write_file(in(d, "perf-logs-rank1.json"), r1, 0644), 0);
	char *out = TRACE(0, d);
	has(out, "warning: ");
	has(out, "perf-logs-rank1.json: torn at the end");
	has(out, "dropped 1 incomplete line");
	has(out, "7 complete events kept");
	cJSON *doc = load(in(d, "perf-logs-merged.json"));
	seen s;
	look(doc, &s);
	assert_int_equal(s.events[1], RANK1_EVENTS - 1 + 1);
	assert_int_equal(s.complete[1], 4);
	assert_true(fabs(s.first_barrier_end[1] - s.first_barrier_end[0]) < 0.001);
	cJSON_Delete(doc);
	row r = summary_row(out, "step");
	assert_int_equal(r.count, 3);
	free(out);

	/* a write torn 2 bytes in: ",{" over the old tail "\n]}\n" leaves
	 * ",{}\n", which is no event */
	d = dir("torn2");
	assert_int_equal(h_write_file(in(d, "perf-logs-rank0.json"), rank0, 0644), 0);
	strcpy(r1, rank1);
	char *tail = strstr(r1, "\n]}\n");
	assert_non_null(tail);
	memcpy(tail, ",{", 2);
	assert_int_equal(h_write_file(in(d, "perf-logs-rank1.json"), r1, 0644), 0);
	free(r1);
	out = TRACE(0, d);
	has(out, "perf-logs-rank1.json: torn at the end");
	has(out, "dropped 1 incomplete line");
	doc = load(in(d, "perf-logs-merged.json"));
	look(doc, &s);
	assert_int_equal(s.events[1], RANK1_EVENTS + 1);
	cJSON_Delete(doc);
	free(out);
}

/* Lines after the closing "]}": a short write on a full disk leaves the
 * writer's "]}" put back over the start of its last events, the rest of
 * them after it. Read up to "]}", with a warning naming the file. */
static void test_past_end(void **state)
{
	(void)state;
	const char *d = dir("pastend");
	assert_int_equal(h_write_file(in(d, "perf-logs-rank0.json"), rank0, 0644), 0);
	size_t n = strlen(rank1);
	const char *rest =
		"ame\":\"forward\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":7000021000.0,\"dur\":5.0}\n"
		",{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":700002";
	char *r1 = malloc(n + strlen(rest) + 1);
	assert_non_null(r1);
	memcpy(r1, rank1, n);
	strcpy(r1 + n, rest);
	assert_int_equal(h_write_file(in(d, "perf-logs-rank1.json"), r1, 0644), 0);
	free(r1);
	char *out = TRACE(0, d);
	has(out, "warning: ");
	has(out, "perf-logs-rank1.json: damaged: 2 lines past the end of the trace");
	has(out, "8 events kept");
	lacks(out, "perf-logs-rank0.json: damaged");
	row r = summary_row(out, "step");
	assert_int_equal(r.count, 4);
	cJSON *doc = load(in(d, "perf-logs-merged.json"));
	seen s;
	look(doc, &s);
	assert_int_equal(s.events[1], RANK1_EVENTS + 1);
	cJSON_Delete(doc);
	free(out);
	/* white space after the end is no damage */
	assert_int_equal(remove(in(d, "perf-logs-merged.json")), 0);
	char *r1ws = malloc(n + 8);
	assert_non_null(r1ws);
	memcpy(r1ws, rank1, n);
	strcpy(r1ws + n, "\n \t\r\n\n");
	assert_int_equal(h_write_file(in(d, "perf-logs-rank1.json"), r1ws, 0644), 0);
	free(r1ws);
	out = TRACE(0, d);
	lacks(out, "warning");
	free(out);
}

/* ---- what it must not read or write ---- */

/* An output that is one of the inputs (by name, by another spelling of
 * the path, through a link) is refused before anything is written: the
 * input would be lost. */
static void test_output_is_input(void **state)
{
	(void)state;
	const char *d = dir("outin");
	two_ranks(d);
	const char *r0 = in(d, "perf-logs-rank0.json"), *r1 = in(d, "perf-logs-rank1.json");
	char *out = TRACE(1, "-o", r0, d);
	has(out, "the output ");
	has(out, "perf-logs-rank0.json is one of the inputs: merging into it would destroy that trace");
	lacks(out, "merged 2 ranks");
	free(out);
	char other[900];
	snprintf(other, sizeof other, "%s/./perf-logs-rank1.json", d);
	out = TRACE(1, r0, "-o", other, r1);
	has(out, "/./perf-logs-rank1.json is the input ");
	free(out);
	assert_int_equal(symlink("perf-logs-rank0.json", in(d, "link.json")), 0);
	out = TRACE(1, "-o", in(d, "link.json"), d);
	has(out, "link.json is the input ");
	has(out, "perf-logs-rank0.json: merging into it would destroy that trace");
	free(out);
	/* the inputs as they were, no merge written */
	char *t0 = h_slurp(r0), *t1 = h_slurp(r1);
	assert_non_null(t0);
	assert_non_null(t1);
	assert_string_equal(t0, rank0);
	assert_string_equal(t1, rank1);
	free(t0);
	free(t1);
	assert_false(exists(in(d, "perf-logs-merged.json")));
	/* and its summary is still 2 ranks' */
	out = TRACE(0, "--no-merge", d);
	has(out, "2 ranks, 4 steps (2 per rank)");
	free(out);
}

/* A merged trace is no rank's: refused as an input, named or found in a
 * directory (its events would count twice, its rank taken from its name). */
static void test_merged_input(void **state)
{
	(void)state;
	const char *d = dir("merged-in");
	two_ranks(d);
	free(TRACE(0, d));
	const char *merged = in(d, "perf-logs-merged.json");
	char *out = TRACE(1, "--no-merge", merged);
	has(out, "perf-logs-merged.json: already a merged trace (otherData.merged_by), not one "
		 "rank's: give the per-rank traces it was merged from");
	free(out);
	/* under a rank file's name in the directory */
	char *text = h_slurp(merged);
	assert_non_null(text);
	assert_int_equal(h_write_file(in(d, "perf-logs-rank2.json"), text, 0644), 0);
	free(text);
	out = TRACE(1, "--no-merge", d);
	has(out, "perf-logs-rank2.json: already a merged trace");
	lacks(out, "steps (");
	free(out);
}

/* Overwrites the first `was` in text with `now`, of the same length. */
static void overwrite(char *text, const char *was, const char *now)
{
	char *p = strstr(text, was);

	assert_non_null(p);
	assert_int_equal(strlen(was), strlen(now));
	memcpy(p, now, strlen(now));
}

/* Events edited or damaged into a dur of 1e308 or below 0, a ts of
 * -1e308: left out of the summary with a warning naming the file, not
 * summed into inf (the table read "inf"), and the merge's shift still
 * taken from the sane events. */
static void test_out_of_range(void **state)
{
	(void)state;
	const char *d = dir("range");
	char *r1 = strdup(rank1);
	assert_int_equal(h_write_file(in(d, "perf-logs-rank0.json"), rank0, 0644), 0);
	overwrite(r1, "\"dur\":4000.000", "\"dur\":1e308   ");
	overwrite(r1, "\"ts\":7000011000.000,\"dur\":10000.000",
		  "\"ts\":-1e308        ,\"dur\":-1.000000");
	assert_int_equal(h_write_file(in(d, "perf-logs-rank1.json"), r1, 0644), 0);
	free(r1);
	char *out = TRACE(0, d);
	has(out, "warning: ");
	has(out, "perf-logs-rank1.json: 2 complete events with a dur below 0 or over 1e+13 µs, or a "
		 "ts beyond 1e+17 µs, left out of the summary");
	lacks(out, "inf");
	row r = summary_row(out, "my_custom_action");
	assert_int_equal(r.count, 2);
	assert_true(fabs(r.total - 4.0) < 1e-9);
	r = summary_row(out, "step");
	assert_int_equal(r.count, 3);
	cJSON *doc = load(in(d, "perf-logs-merged.json"));
	seen s;
	look(doc, &s);
	assert_true(fabs(s.first_barrier_end[1] - s.first_barrier_end[0]) < 0.001);
	cJSON_Delete(doc);
	free(out);
}

/* What was taken in silence is said: a version this reader does not
 * know, a rank outside the job or unlike the file's name, and complete
 * events without a name or a number for ts or dur (dropped from the
 * summary; a negative dur was the only one said). */
static void test_said_not_silent(void **state)
{
	(void)state;
	const char *d = dir("said");
	char *r1 = strdup(rank1);
	overwrite(r1, "\"version\":1", "\"version\":2");
	overwrite(r1, "\"rank\":1,", "\"rank\":5,");
	overwrite(r1, "\"dur\":4000.000", "\"dur\":\"x\"     ");
	assert_int_equal(h_write_file(in(d, "perf-logs-rank0.json"), rank0, 0644), 0);
	assert_int_equal(h_write_file(in(d, "perf-logs-rank1.json"), r1, 0644), 0);
	free(r1);
	char *out = TRACE(0, d);
	has(out, "perf-logs-rank1.json: otherData.version is 2, not 1 (the version this "
		 "hpu-trace reads): read as version 1");
	has(out, "perf-logs-rank1.json: rank 5 of a job of 2 ranks (otherData.world_size)");
	has(out, "perf-logs-rank1.json: its name says rank 1, its otherData.rank 5: read as rank 5");
	has(out, "perf-logs-rank1.json: 1 complete event without a name, or a number for ts or dur, "
		 "left out of the summary");
	lacks(out, "perf-logs-rank0.json: ");
	free(out);
}

/* ---- errors ---- */

static void test_errors(void **state)
{
	(void)state;
	const char *d = dir("errors");
	assert_int_equal(h_write_file(in(d, "perf-logs-rank0.json"), rank0, 0644), 0);
	assert_int_equal(h_write_file(in(d, "garbage-rank1.json"), "this is not JSON at all\n", 0644), 0);
	char *out = TRACE(1, in(d, "perf-logs-rank0.json"), in(d, "garbage-rank1.json"));
	has(out, "garbage-rank1.json: not a trace: not JSON");
	assert_false(exists(in(d, "perf-logs-merged.json")));
	assert_false(exists(in(d, "hpu-trace-merged.json")));
	free(out);

	assert_int_equal(h_write_file(in(d, "perf-logs-rank1.json"), "{\"otherData\":{\"rank\":1},\"events\":[]}\n", 0644), 0);
	out = TRACE(1, "--no-merge", in(d, "perf-logs-rank1.json"));
	has(out, "perf-logs-rank1.json: not a trace: no traceEvents array");
	free(out);

	/* an otherData.rank that is no rank is named (1.5 was read as none,
	 * -3 and "zero" fell back to the name's rank) */
	static const char *const bad_ranks[] = {"1.5", "-3", "\"zero\"", "99999999999"};
	for (int k = 0; k < 4; k++) {
		char text[200], want[120];
		snprintf(text, sizeof text, "{\"otherData\":{\"rank\":%s},\"traceEvents\":[]}\n",
			 bad_ranks[k]);
		assert_int_equal(h_write_file(in(d, "badrank-rank0.json"), text, 0644), 0);
		out = TRACE(1, "--no-merge", in(d, "badrank-rank0.json"));
		snprintf(want, sizeof want, "badrank-rank0.json: not a trace of a rank: its "
			 "otherData.rank, %s, is not a rank (a whole number from 0)", bad_ranks[k]);
		has(out, want);
		free(out);
	}

	/* two attempts of a restarted job: merged with a warning (in silence) */
	const char *att = dir("attempts");
	char a0[4096], a1[4096];
	const char *key = "\"job_id\":\"job-t\"";
	const char *at0 = strstr(rank0, key), *at1 = strstr(rank1, key);
	snprintf(a0, sizeof a0, "%.*s%s,\"attempt\":1%s", (int)(at0 - rank0), rank0, key,
		 at0 + strlen(key));
	snprintf(a1, sizeof a1, "%.*s%s,\"attempt\":0%s", (int)(at1 - rank1), rank1, key,
		 at1 + strlen(key));
	assert_int_equal(h_write_file(in(att, "perf-logs-restart1-rank0.json"), a0, 0644), 0);
	assert_int_equal(h_write_file(in(att, "perf-logs-rank1.json"), a1, 0644), 0);
	out = TRACE(0, "--no-merge", in(att, "perf-logs-restart1-rank0.json"),
		    in(att, "perf-logs-rank1.json"));
	has(out, "perf-logs-restart1-rank0.json is of the job's attempt 1, ");
	has(out, "perf-logs-rank1.json of attempt 0 (restarts): merging traces of different "
		 "runs, each aligned at its own first barrier");
	free(out);

	/* the same rank twice (rank0's text under another name) */
	assert_int_equal(h_write_file(in(d, "other-rank5.json"), rank0, 0644), 0);
	out = TRACE(1, in(d, "perf-logs-rank0.json"), in(d, "other-rank5.json"));
	has(out, "perf-logs-rank0.json and ");
	has(out, "other-rank5.json both hold rank 0");
	free(out);

	out = TRACE(1, in(d, "perf-logs-rank0.json"), in(d, "missing-rank1.json"));
	has(out, "missing-rank1.json: cannot open: No such file or directory");
	free(out);

	assert_int_equal(h_write_file(in(d, "empty-rank0.json"), "", 0644), 0);
	out = TRACE(1, in(d, "empty-rank0.json"));
	has(out, "empty-rank0.json: not a trace: the file is empty");
	free(out);

	out = TRACE(1, dir("nothing"));
	has(out, "nothing: no trace files (*-rank<R>.json) in it");
	free(out);

	/* a directory with the traces of two runs: which one is meant? */
	const char *two = dir("two-runs");
	assert_int_equal(h_write_file(in(two, "perf-logs-rank0.json"), rank0, 0644), 0);
	assert_int_equal(h_write_file(in(two, "perf-logs-restart1-rank0.json"), rank0, 0644), 0);
	out = TRACE(1, two);
	has(out, "holds the traces of more than one run (perf-logs-rank*.json and "
		 "perf-logs-restart1-rank*.json): name the files of one");
	free(out);

	/* usage */
	out = TRACE(0, "--help");
	has(out, "usage: hpu-trace");
	free(out);
	free(TRACE(2, "--top", "0", d));
	free(TRACE(2, "--sort", "fastest", d));
	free(TRACE(2, "--bogus", d));
	free(TRACE(2, "--no-merge", "-o", "x.json", d));
	out = run_v(2, (const char *[]){NULL});
	has(out, "no trace given");
	free(out);
}

/* Inputs that are not files: a device (directly or through a link) is
 * refused at once, naming what it is; a FIFO nobody writes is empty. */
static void test_not_a_file(void **state)
{
	(void)state;
	const char *d = dir("odd");
	char *out = TRACE(1, "--no-merge", "/dev/zero");
	has(out, "/dev/zero: cannot read: not a regular file or a pipe (a character device)");
	free(out);
	assert_int_equal(symlink("/dev/zero", in(d, "zero-rank0.json")), 0);
	out = TRACE(1, in(d, "zero-rank0.json"));
	has(out, "zero-rank0.json: cannot read: not a regular file or a pipe (a character device)");
	free(out);
	assert_int_equal(mkfifo(in(d, "fifo-rank1.json"), 0644), 0);
	out = TRACE(1, "--no-merge", in(d, "fifo-rank1.json"));
	has(out, "fifo-rank1.json: not a trace: the file is empty");
	free(out);
}

static void test_full_disk(void **state)
{
	(void)state;
	const char *d = dir("full");
	two_ranks(d);
	const char *full = in(d, "full.json");
	assert_int_equal(symlink("/dev/full", full), 0);
	char *out = TRACE(1, "-o", full, d);
	has(out, full);
	has(out, "No space left on device");
	lacks(out, "merged 2 ranks");
	free(out);
	struct stat st;
	assert_int_equal(lstat(full, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	/* a link to a regular file: the file gets the trace, the link stays */
	const char *link = in(d, "link.json");
	assert_int_equal(h_write_file(in(d, "target.json"), "old", 0644), 0);
	assert_int_equal(symlink("target.json", link), 0);
	free(TRACE(0, "-o", link, d));
	assert_int_equal(lstat(link, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	cJSON *doc = load(in(d, "target.json"));
	assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "traceEvents")),
			 RANK0_EVENTS + RANK1_EVENTS + 2);
	cJSON_Delete(doc);
	/* the summary into a full standard output */
	const char *argv[] = {"/bin/sh", "-c", "exec \"$0\" --no-merge \"$1\" >/dev/full", TOOL, d,
			      NULL};
	proc p;
	int rc = h_run(&p, (char *const *)argv, NULL, 60000);
	if (rc != 1)
		fail_msg("hpu-trace --no-merge >/dev/full: exit %d, expected 1:\n%s", rc, p.out);
	has(p.out, "standard output");
	has(p.out, "No space left on device");
	h_free(&p);
}

/* -o naming standard output (/dev/stdout, /proc/self/fd/1, the file
 * stdout is redirected to): the merged trace alone on stdout, into a
 * pipe or a file, and the report ("merged 2 ranks", the summary) on
 * stderr; before, it followed the trace on stdout (into a pipe) or was
 * lost (a file renamed over). */
static void test_output_stdout(void **state)
{
	(void)state;
	const char *d = dir("stdout");
	two_ranks(d);
	static const char *const scripts[] = {
		"exec \"$0\" -o /dev/stdout \"$1\" 2>\"$2.err\" | cat >\"$2\"",
		"exec \"$0\" -o /proc/self/fd/1 \"$1\" 2>\"$2.err\" | cat >\"$2\"",
		"exec \"$0\" -o /dev/stdout \"$1\" 2>\"$2.err\" >\"$2\"",
		"exec \"$0\" -o \"$2\" \"$1\" 2>\"$2.err\" >\"$2\"",
		/* - is standard output (it wrote a file named -) */
		"exec \"$0\" -o - \"$1\" 2>\"$2.err\" | cat >\"$2\"",
	};
	for (size_t k = 0; k < sizeof scripts / sizeof scripts[0]; k++) {
		char got[700], err[720];
		snprintf(got, sizeof got, "%s/got%zu.json", d, k);
		snprintf(err, sizeof err, "%s.err", got);
		const char *argv[] = {"/bin/sh", "-c", scripts[k], TOOL, d, got, NULL};
		proc p;
		int rc = h_run(&p, (char *const *)argv, NULL, 60000);
		if (rc != 0)
			fail_msg("%s: exit %d:\n%s", scripts[k], rc, p.out);
		h_free(&p);
		char *text = h_slurp(got);
		assert_non_null(text);
		lacks(text, "merged 2 ranks"); /* the trace alone */
		free(text);
		cJSON *doc = load(got);
		assert_int_equal(
			cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "traceEvents")),
			RANK0_EVENTS + RANK1_EVENTS + 2);
		cJSON_Delete(doc);
		char *said = h_slurp(err);
		assert_non_null(said);
		has(said, "merged 2 ranks");
		has(said, "my_custom_action");
		free(said);
	}
}

/* ---- real traces ---- */

/* Events in a trace file of the run, and its host name. */
static int events_in(const char *file, char *host, size_t n)
{
	cJSON *doc = load(file);
	const cJSON *other = cJSON_GetObjectItemCaseSensitive(doc, "otherData");
	snprintf(host, n, "%s", str(other, "hostname"));
	int k = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "traceEvents"));
	cJSON_Delete(doc);
	return k;
}

static void test_real(void **state)
{
	(void)state;
	char d[600];
	snprintf(d, sizeof d, "%s/real", T);
	const char *argv[] = {LAUNCH, "--devices", "2", "--profile", d, "--max-steps", "6",
			      "--log-every", "2", "--batch-size", "64", MODEL, NULL};
	proc p;
	int rc = h_run(&p, (char *const *)argv, NULL, 240000);
	if (rc != 0)
		fail_msg("hpulaunch --profile exited %d:\n%s", rc, p.out ? p.out : "");
	h_free(&p);
	char host0[256], host1[256];
	int n0 = events_in(in(d, "perf-logs-rank0.json"), host0, sizeof host0);
	int n1 = events_in(in(d, "perf-logs-rank1.json"), host1, sizeof host1);
	assert_true(n0 > 50 && n1 > 50);

	char *out = TRACE(0, d);
	lacks(out, "warning");
	cJSON *doc = load(in(d, "perf-logs-merged.json"));
	seen s;
	look(doc, &s);
	cJSON_Delete(doc);
	assert_int_equal(s.other_pid, 0);
	assert_int_equal(s.events[0], n0 + 1);
	assert_int_equal(s.events[1], n1 + 1);
	char want[300];
	snprintf(want, sizeof want, "rank 0 (%s)", host0);
	assert_string_equal(s.process_name[0], want);
	snprintf(want, sizeof want, "rank 1 (%s)", host1);
	assert_string_equal(s.process_name[1], want);
	assert_true(isfinite(s.first_barrier_ts[0]) && isfinite(s.first_barrier_ts[1]));
	double diff = fabs(s.first_barrier_end[1] - s.first_barrier_end[0]);
	if (diff > 0.001)
		fail_msg("first barriers end at %.6f and %.6f: maxdiff %.6f us",
			 s.first_barrier_end[0], s.first_barrier_end[1], diff);
	assert_true(fabs(s.min_ts) < 1e-9);

	/* 6 steps on each of 2 ranks; one all-reduce at least per step */
	row r = summary_row(out, "step");
	assert_int_equal(r.count, 12);
	assert_true(r.total > 0 && fabs(r.pct - 100.0) < 1e-9);
	static const char *const each_step[] = {"forward", "backward", "optimizer_step"};
	for (int i = 0; i < 3; i++) {
		r = summary_row(out, each_step[i]);
		if (r.count != 12)
			fail_msg("%s: %ld events, expected 12:\n%s", each_step[i], r.count, out);
		assert_true(r.total > 0 && r.max >= r.mean && r.pct > 0 && r.pct < 100);
	}
	r = summary_row(out, "all_reduce");
	assert_true(r.count >= 12 && r.total > 0);
	has(out, "2 ranks, 12 steps (6 per rank)");
	free(out);
}

static int setup(void **state)
{
	(void)state;
	const char *t = getenv("TMPDIR");
	snprintf(T, sizeof T, "%s/test_trace_tool.XXXXXX", t && *t ? t : "/tmp");
	return mkdtemp(T) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	h_rmtree(T);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_merge),
	    cmocka_unit_test(test_no_barrier),
	    cmocka_unit_test(test_torn),
	    cmocka_unit_test(test_past_end),
	    cmocka_unit_test(test_output_is_input),
	    cmocka_unit_test(test_merged_input),
	    cmocka_unit_test(test_out_of_range),
	    cmocka_unit_test(test_said_not_silent),
	    cmocka_unit_test(test_errors),
	    cmocka_unit_test(test_not_a_file),
	    cmocka_unit_test(test_full_disk),
	    cmocka_unit_test(test_output_stdout),
	    cmocka_unit_test(test_real),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
