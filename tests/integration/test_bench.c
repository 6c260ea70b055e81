/* Integration test of hpucoll-bench's nccl-tests command line: the real
 * benchmark under the real launcher, 2 workers, small sizes.
 *
 * - nccl-tests' long options (--minbytes ... --root, -t 1 -g 1 and the
 *   CUDA options at their "off" values): the sizes of -f and of -i, the
 *   header line, every element checked (-c) and 0 wrong, the closing
 *   lines, the average bus bandwidth the mean of the rows';
 * - -d all -o all: every dtype and reduction hpucoll has, once each, in
 *   nccl-tests' order, all checked; all_gather prints "none", broadcast
 *   with -r all every root;
 * - -J: the JSON file parsed: config, one result per row with size,
 *   count, type, redop, root, times, bandwidths (algbw = size / time,
 *   busbw = algbw x (n-1)/n for reduce_scatter), #wrong 0, the closing
 *   items; the same as the text; an existing file kept (FILE.json.0);
 * - -a 0..3: each group's time is rank 0's, the mean, the minimum, the
 *   maximum of the times over ranks, min <= mean <= max, rank 0's between;
 * - -z 0..3, --async, -m 2, -C 1 (the "cputime" column and key);
 * - -T 1: a stopped peer fails the run after 1000 ms, not 60000;
 * - a link named all_gather_perf runs all_gather;
 * - refusals: -t 2 (under the launcher), -g 2, the old -t COLL, a dtype
 *   or op hpucoll lacks and an unknown one (naming the accepted ones),
 *   -a 4, -J not *.json, -f with -i, "-b8"; exit 2 and the reason. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness.h"

#define MAXARGS 48

static char T[256];      /* the test's temporary directory */
static char BENCH[1024]; /* bin/hpucoll-bench */

static const char *path(const char *name)
{
	static char bufs[4][600];
	static int k;
	char *p = bufs[k++ & 3];
	snprintf(p, sizeof bufs[0], "%s/%s", T, name);
	return p;
}

/* Runs argv (NULL-terminated), asserting exit code `want`; returns the
 * output (caller frees). */
static char *run_argv(const char **argv, int want)
{
	proc p;
	int rc = h_run(&p, (char *const *)argv, NULL, 60000);
	char *out = strdup(p.out ? p.out : "");
	h_free(&p);
	if (rc != want) {
		fprintf(stderr, "---- exit %d, expected %d; output:\n%s----\n",
		        rc, want, out);
		fail_msg("exit %d, expected %d", rc, want);
	}
	return out;
}

/* hpulaunch -q --devices 2 --exec bin, then the NULL-terminated args. */
static char *launch(int want, const char *bin, ...)
{
	const char *argv[MAXARGS] = {h_build("bin/hpulaunch"), "-q",
	                             "--devices", "2", "--exec", bin};
	int n = 6;
	va_list ap;
	va_start(ap, bin);
	for (const char *a; (a = va_arg(ap, const char *)) && n < MAXARGS - 1;)
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	return run_argv(argv, want);
}

/* hpucoll-bench alone (it refuses bad usage before joining a job). */
static char *direct(int want, ...)
{
	const char *argv[MAXARGS] = {BENCH};
	int n = 1;
	va_list ap;
	va_start(ap, want);
	for (const char *a; (a = va_arg(ap, const char *)) && n < MAXARGS - 1;)
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	return run_argv(argv, want);
}

static void assert_has(const char *out, const char *text)
{
	if (!strstr(out, text)) {
		fprintf(stderr, "---- output:\n%s----\n", out);
		fail_msg("no \"%s\" in the output", text);
	}
}

/* ---- The result lines of rank 0's output ---- */

struct row {
	size_t size, count;
	char type[16], redop[16];
	int root;
	double time[2], algbw[2], busbw[2];
	char wrong[2][16];
};

/* The result lines ("[rank 0]" then a number) into r[0..max); how many. */
static int rows(const char *out, struct row *r, int max)
{
	int n = 0;
	for (const char *l = out; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : l) {
		if (strncmp(l, "[rank 0] ", 9))
			continue;
		const char *s = l + 9;
		while (*s == ' ')
			s++;
		if (*s < '0' || *s > '9')
			continue;
		assert_true(n < max);
		struct row *x = &r[n++];
		int k = sscanf(s, "%zu %zu %15s %15s %d %lf %lf %lf %15s %lf %lf %lf %15s",
		               &x->size, &x->count, x->type, x->redop, &x->root,
		               &x->time[0], &x->algbw[0], &x->busbw[0], x->wrong[0],
		               &x->time[1], &x->algbw[1], &x->busbw[1], x->wrong[1]);
		assert_int_equal(k, 13);
	}
	return n;
}

/* The closing lines of a run with no wrong element; returns the average
 * bus bandwidth printed. */
static double closing(const char *out, const char *prog)
{
	char want[256];
	assert_has(out, "[rank 0] # Out of bounds values : 0 OK\n");
	const char *bw = strstr(out, "[rank 0] # Avg bus bandwidth    : ");
	assert_non_null(bw);
	double avg = -1;
	assert_int_equal(sscanf(bw + 34, "%lf", &avg), 1);
	snprintf(want, sizeof want, "[rank 0] #\n[rank 0] # Collective test concluded: %s\n",
	         prog);
	assert_has(out, want);
	return avg;
}

/* ---- Tests ---- */

static void test_long_options(void **state)
{
	(void)state;
	char *out = launch(0, BENCH, "--coll", "all_reduce", "--minbytes", "8",
	                   "--maxbytes", "1K", "--stepfactor", "4", "--iters", "3",
	                   "--warmup_iters", "1", "--check", "2", "--op", "max",
	                   "--datatype", "float32", "--root", "0", "--nthreads", "1",
	                   "--ngpus", "1", "-y", "0", "-G", "0", "--average", "1",
	                   "--blocking", "2", NULL);
	assert_has(out, "[rank 0] # nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: "
	                "4(factor) warmup iters: 1 iters: 3 agg iters: 1 validation: 2 "
	                "graph: 0\n");
	assert_has(out, "[rank 0] # Collective test starting: hpucoll-bench\n");
	struct row r[16];
	int n = rows(out, r, 16);
	assert_int_equal(n, 4); /* 8 32 128 512 */
	double sum = 0;
	for (int i = 0; i < n; i++) {
		assert_int_equal(r[i].size, (size_t)8 << (2 * i));
		assert_int_equal(r[i].count, r[i].size / 4);
		assert_string_equal(r[i].type, "float");
		assert_string_equal(r[i].redop, "max");
		assert_int_equal(r[i].root, -1);
		for (int g = 0; g < 2; g++) {
			assert_string_equal(r[i].wrong[g], "0");
			assert_true(r[i].time[g] > 0);
			sum += r[i].busbw[g];
		}
	}
	/* The mean busbw of the groups; the rows print 3 decimals. */
	assert_true(fabs(closing(out, "hpucoll-bench") - sum / (2 * n)) < 1e-3);
	free(out);

	/* Sizes stepped by bytes (-i without -f); -c 0 prints N/A. */
	out = launch(0, BENCH, "-b", "1K", "-e", "3K", "-i", "1K", "-n", "2", "-w", "0",
	             "-c", "0", NULL);
	assert_has(out, "step: 1024(bytes)");
	assert_int_equal(rows(out, r, 16), 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(r[i].size, 1024 * (size_t)(i + 1));
		assert_string_equal(r[i].wrong[0], "N/A");
		assert_string_equal(r[i].wrong[1], "N/A");
	}
	closing(out, "hpucoll-bench");
	free(out);

	/* A step above -e: the first size only. */
	out = launch(0, BENCH, "-b", "0", "-e", "512", "-i", "1K", "-n", "1", NULL);
	assert_int_equal(rows(out, r, 16), 1);
	assert_int_equal(r[0].size, 0);
	free(out);
}

static const char *const all_dtypes[] = {"uint8", "int32", "int64",   "half",
                                         "float", "double", "bfloat16"};
static const size_t dtype_bytes[] = {1, 4, 8, 2, 4, 8, 2};
static const char *const all_ops[] = {"sum", "max", "min", "avg"};

static void test_all_pairs(void **state)
{
	(void)state;
	struct row r[64];
	char *out = launch(0, BENCH, "-d", "all", "-o", "all", "-b", "96", "-e", "96",
	                   "-n", "1", "-w", "0", "-c", "2", NULL);
	int n = rows(out, r, 64);
	assert_int_equal(n, 7 * 4);
	for (int t = 0; t < 7; t++)
		for (int o = 0; o < 4; o++) {
			struct row *x = &r[t * 4 + o];
			assert_string_equal(x->type, all_dtypes[t]);
			assert_string_equal(x->redop, all_ops[o]);
			assert_int_equal(x->size, 96);
			assert_int_equal(x->count, 96 / dtype_bytes[t]);
			assert_string_equal(x->wrong[0], "0");
			assert_string_equal(x->wrong[1], "0");
		}
	closing(out, "hpucoll-bench");
	free(out);

	/* all_gather reduces nothing: one row per dtype, "none". */
	out = launch(0, BENCH, "--coll", "all_gather", "-d", "all", "-o", "all", "-b", "64",
	             "-e", "64", "-n", "1", "-w", "0", NULL);
	n = rows(out, r, 64);
	assert_int_equal(n, 7);
	for (int t = 0; t < 7; t++) {
		assert_string_equal(r[t].type, all_dtypes[t]);
		assert_string_equal(r[t].redop, "none");
		assert_int_equal(r[t].count, 64 / 2 / dtype_bytes[t]);
		assert_string_equal(r[t].wrong[0], "0");
	}
	closing(out, "hpucoll-bench");
	free(out);

	/* broadcast -r all: every root in turn. */
	out = launch(0, BENCH, "--coll", "broadcast", "-r", "all", "-d", "half", "-b", "64",
	             "-e", "128", "-n", "1", "-w", "0", NULL);
	n = rows(out, r, 64);
	assert_int_equal(n, 4);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(r[i].root, i / 2);
		assert_int_equal(r[i].size, i % 2 ? 128 : 64);
		assert_string_equal(r[i].redop, "none");
		assert_string_equal(r[i].wrong[1], "0");
	}
	free(out);
}

static cJSON *load_json(const char *file)
{
	char *text = h_slurp(file);
	assert_non_null(text);
	cJSON *doc = cJSON_Parse(text);
	free(text);
	assert_non_null(doc);
	return doc;
}

static double num(const cJSON *o, const char *key)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!cJSON_IsNumber(it))
		fail_msg("\"%s\" is not a number", key);
	return it->valuedouble;
}

static const char *str(const cJSON *o, const char *key)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!cJSON_IsString(it))
		fail_msg("\"%s\" is not a string", key);
	return it->valuestring;
}

static const char *const over_keys[4] = {"rank0", "mean", "min", "max"};

/* One group: bandwidths from the time, nwrong 0, the time over ranks
 * ordered and the time -a picks. Returns its bus_bw. */
static double check_group(const cJSON *g, double size, double busfactor, int average,
                          const char *timekey)
{
	assert_non_null(g);
	double t = num(g, timekey), alg = num(g, "alg_bw"), bus = num(g, "bus_bw");
	assert_true(t > 0);
	assert_true(fabs(alg - size / t / 1e3) <= 1e-9 * alg);
	assert_true(fabs(bus - alg * busfactor) <= 1e-9 * alg);
	assert_true(bus > 0);
	assert_int_equal((int)num(g, "nwrong"), 0);
	const cJSON *o = cJSON_GetObjectItemCaseSensitive(g, "time_over_ranks");
	assert_non_null(o);
	double v[4];
	for (int k = 0; k < 4; k++)
		v[k] = num(o, over_keys[k]);
	assert_true(v[2] <= v[1] && v[1] <= v[3]);
	assert_true(v[2] <= v[0] && v[0] <= v[3]);
	assert_true(t == v[average]);
	return bus;
}

static void test_json(void **state)
{
	(void)state;
	const char *file = path("r.json");
	char *out = launch(0, BENCH, "--coll", "reduce_scatter", "-b", "16", "-e", "1K",
	                   "-f", "4", "-n", "2", "-w", "1", "-c", "1", "-d", "int32",
	                   "-o", "min", "-J", file, NULL);
	char want[800];
	snprintf(want, sizeof want, "[rank 0] # Writing JSON output to %s\n", file);
	assert_has(out, want);
	struct row r[16];
	int n = rows(out, r, 16);
	assert_int_equal(n, 4); /* 16 64 256 1024 */
	double avg = closing(out, "hpucoll-bench");

	cJSON *doc = load_json(file);
	assert_int_equal((int)num(doc, "version"), 3);
	assert_non_null(str(doc, "start_time"));
	assert_non_null(str(doc, "end_time"));
	const cJSON *args = cJSON_GetObjectItemCaseSensitive(doc, "args");
	assert_int_equal(cJSON_GetArraySize(args), 21);
	assert_string_equal(cJSON_GetArrayItem(args, 0)->valuestring, BENCH);
	assert_string_equal(cJSON_GetArrayItem(args, 20)->valuestring, file);
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(doc, "config");
	assert_int_equal((int)num(c, "nthreads"), 1);
	assert_int_equal((int)num(c, "ngpus"), 1);
	assert_int_equal((int)num(c, "minimum_bytes"), 16);
	assert_int_equal((int)num(c, "maximum_bytes"), 1024);
	assert_int_equal((int)num(c, "step_factor"), 4);
	assert_int_equal((int)num(c, "warmup_iters"), 1);
	assert_int_equal((int)num(c, "iterations"), 2);
	assert_int_equal((int)num(c, "aggregated_iterations"), 1);
	assert_int_equal((int)num(c, "validation"), 1);
	assert_int_equal((int)num(c, "ranks"), 2);
	assert_int_equal((int)num(c, "average"), 1);
	assert_int_equal((int)num(c, "blocking"), 2);
	assert_string_equal(str(c, "collective"), "reduce_scatter");
	assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "blocking_collectives")));

	const cJSON *res = cJSON_GetObjectItemCaseSensitive(doc, "results");
	assert_int_equal(cJSON_GetArraySize(res), n);
	double sum = 0;
	for (int i = 0; i < n; i++) {
		const cJSON *x = cJSON_GetArrayItem(res, i);
		size_t size = (size_t)16 << (2 * i);
		assert_int_equal((size_t)num(x, "size"), size);
		assert_int_equal((size_t)num(x, "count"), size / 4 / 2); /* per rank */
		assert_string_equal(str(x, "type"), "int32");
		assert_string_equal(str(x, "redop"), "min");
		assert_int_equal((int)num(x, "root"), -1);
		assert_int_equal((int)num(x, "actual_iterations"), 2);
		const char *keys[2] = {"out_of_place", "in_place"};
		for (int g = 0; g < 2; g++) {
			const cJSON *grp = cJSON_GetObjectItemCaseSensitive(x, keys[g]);
			sum += check_group(grp, (double)size, 0.5, 1, "time");
			/* The text prints the same, rounded. */
			assert_true(fabs(r[i].time[g] - num(grp, "time")) <= 0.0051);
			assert_true(fabs(r[i].busbw[g] - num(grp, "bus_bw")) <= 0.00051);
		}
	}
	const cJSON *oob = cJSON_GetObjectItemCaseSensitive(doc, "out_of_bounds");
	assert_int_equal((int)num(oob, "count"), 0);
	assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(oob, "okay")));
	double bw = num(cJSON_GetObjectItemCaseSensitive(doc, "average_bus_bandwidth"),
	                "bandwidth");
	assert_true(fabs(bw - sum / (2 * n)) <= 1e-9 * bw);
	assert_true(fabs(avg - bw) <= 1e-5 * bw); /* printed with %g */
	assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "errors")), 0);
	cJSON_Delete(doc);
	free(out);

	/* An existing file is kept: the next run writes FILE.json.0. */
	char *before = h_slurp(file);
	out = launch(0, BENCH, "-b", "8", "-e", "8", "-n", "1", "-J", file, NULL);
	snprintf(want, sizeof want, "[rank 0] # Writing JSON output to %s.0\n", file);
	assert_has(out, want);
	char *after = h_slurp(file);
	assert_string_equal(before, after);
	snprintf(want, sizeof want, "%s.0", file);
	doc = load_json(want);
	assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "results")), 1);
	cJSON_Delete(doc);
	free(before);
	free(after);
	free(out);
}

static void test_average(void **state)
{
	(void)state;
	static const char *const said[4] = {"-a 0: time is the rank 0's",
	                                    "-a 1: time is the mean over ranks",
	                                    "-a 2: time is the minimum over ranks",
	                                    "-a 3: time is the maximum over ranks"};
	for (int a = 0; a < 4; a++) {
		char name[32], av[4];
		snprintf(name, sizeof name, "a%d.json", a);
		snprintf(av, sizeof av, "%d", a);
		const char *file = path(name);
		char *out = launch(0, BENCH, "-a", av, "-b", "64", "-e", "4K", "-f", "8", "-n",
		                   "3", "-w", "1", "-J", file, NULL);
		assert_has(out, said[a]);
		struct row r[8];
		int n = rows(out, r, 8);
		assert_int_equal(n, 3);
		cJSON *doc = load_json(file);
		assert_int_equal((int)num(cJSON_GetObjectItemCaseSensitive(doc, "config"),
		                          "average"), a);
		const cJSON *res = cJSON_GetObjectItemCaseSensitive(doc, "results");
		for (int i = 0; i < n; i++) {
			const cJSON *x = cJSON_GetArrayItem(res, i);
			const cJSON *g[2] = {cJSON_GetObjectItemCaseSensitive(x, "out_of_place"),
			                     cJSON_GetObjectItemCaseSensitive(x, "in_place")};
			for (int k = 0; k < 2; k++) {
				check_group(g[k], num(x, "size"), 1.0, a, "time");
				assert_true(fabs(r[i].time[k] - num(g[k], "time")) <= 0.0051);
			}
		}
		cJSON_Delete(doc);
		free(out);
	}
}

static void test_blocking_modes(void **state)
{
	(void)state;
	static const char *const z[][2] = {{"-z", "0"}, {"--async", NULL}, {"-z", "1"},
	                                   {"-z", "2"}, {"-z", "3"}};
	static const char *const said[] = {"-z 0: all issued, then waited for",
	                                   "-z 0: all issued, then waited for",
	                                   "-z 1: each waited for, then a barrier;",
	                                   "-z 2: each waited for;",
	                                   "-z 3: each waited for, then a barrier left out"};
	for (int i = 0; i < 5; i++) {
		char *out = launch(0, BENCH, "--coll", "all_gather", "-b", "256", "-e", "1K",
		                   "-n", "3", "-m", "2", "-w", "1", "-c", "3", "-C",
		                   i == 4 ? "1" : "0", "-J", path(i == 4 ? "z.json" : "x.json"),
		                   z[i][0], z[i][1], NULL);
		assert_has(out, said[i]);
		assert_has(out, "agg iters: 2 validation: 3");
		assert_has(out, i == 4 ? " cputime " : "       time ");
		struct row r[8];
		assert_int_equal(rows(out, r, 8), 3);
		for (int k = 0; k < 3; k++) {
			assert_string_equal(r[k].wrong[0], "0");
			assert_string_equal(r[k].wrong[1], "0");
		}
		closing(out, "hpucoll-bench");
		free(out);
		unlink(path("x.json"));
	}
	/* -C 1: the JSON's key is cpu_time, as nccl-tests writes it. */
	cJSON *doc = load_json(path("z.json"));
	const cJSON *x = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "results"), 0);
	const cJSON *g = cJSON_GetObjectItemCaseSensitive(x, "in_place");
	check_group(g, num(x, "size"), 0.5, 1, "cpu_time");
	assert_null(cJSON_GetObjectItemCaseSensitive(g, "time"));
	cJSON_Delete(doc);
}

/* -T 1: rank 1 stops (SIGSTOP) while rank 0 runs all-reduces; rank 0
 * gives up after 1000 ms (HPUCOLL_TIMEOUT_MS would be 60000). Rank 1 is
 * stopped once rank 0 has printed its title, after joining: stopped
 * earlier (a fixed second after its start, on a loaded machine), it held
 * rank 0 in the join, which -T does not bound. */
static void test_timeout(void **state)
{
	(void)state;
	char script[1400];
	const char *pidfile = path("rank1.pid");
	snprintf(script, sizeof script,
	         "if [ \"$RANK\" = 1 ]; then echo $$ >'%s.tmp' && mv '%s.tmp' '%s'; fi; "
	         "exec '%s' -T 1 -b 8 -e 8 -n 100000000 -w 0 -c 0",
	         pidfile, pidfile, pidfile, BENCH);
	const char *argv[] = {h_build("bin/hpulaunch"), "-q", "--devices", "2", "--exec",
			      "/bin/sh", "-c", script, "sh", NULL};
	proc p;
	assert_int_equal(h_start(&p, (char *const *)argv, NULL), 0);
	if (h_wait_for(&p, "# Collective test starting", 60000) != 0)
		fail_msg("rank 0 did not print its title:\n%s", p.out);
	char *pid = h_slurp(pidfile);
	assert_non_null(pid);
	assert_int_equal(kill((pid_t)atol(pid), SIGSTOP), 0);
	free(pid);
	if (h_wait(&p, 60000) != 0)
		fail_msg("the job did not end within 60 s of rank 1's stop:\n%s", p.out);
	assert_int_equal(h_code(&p), 1);
	assert_has(p.out, "[rank 0] hpucoll-bench: rank 0: ");
	assert_has(p.out, "1000 ms");
	h_free(&p);
}

static void test_program_name(void **state)
{
	(void)state;
	const char *link = path("all_gather_perf");
	assert_int_equal(symlink(BENCH, link), 0);
	char *out = launch(0, link, "-b", "64", "-e", "64", "-n", "1", NULL);
	assert_has(out, "# hpucoll-bench: all_gather, 2 ranks");
	assert_has(out, "[rank 0] # Collective test starting: all_gather_perf\n");
	struct row r[4];
	assert_int_equal(rows(out, r, 4), 1);
	assert_string_equal(r[0].redop, "none");
	assert_int_equal(r[0].count, 64 / 4 / 2);
	closing(out, "all_gather_perf");
	free(out);
}

static void test_refusals(void **state)
{
	(void)state;
	char *out = launch(1, BENCH, "-t", "2", NULL);
	assert_has(out, "-t 2 (--nthreads): only 1 is accepted: hputrain runs one rank per "
	                "process");
	assert_has(out, "hpulaunch --devices N");
	free(out);

	static const struct {
		const char *args[4];
		const char *says;
	} bad[] = {
	    {{"-g", "2"}, "-g 2 (--ngpus): only 1 is accepted"},
	    {{"-t", "all_reduce"}, "choose the collective with --coll all_reduce"},
	    {{"-d", "int8"},
	     "-d int8: hpucoll has no int8; its datatypes are uint8 int32 int64 half float "
	     "double bfloat16 (or all)"},
	    {{"-d", "uint64"}, "hpucoll has no uint64; its datatypes are uint8 int32"},
	    {{"-d", "f32"},
	     "-d f32: not a datatype; give one of uint8 int32 int64 half float double "
	     "bfloat16"},
	    {{"-o", "prod"}, "-o prod: hpucoll has no prod reduction; its reductions are sum "
	                     "max min avg"},
	    {{"-o", "mulsum"}, "hpucoll has no mulsum reduction"},
	    {{"-a", "4"}, "-a 4 (--average): give 0 (rank 0's time), 1 (the mean over ranks)"},
	    {{"-J", "out.txt"}, "-J out.txt: the results are written as JSON only"},
	    {{"-f", "2", "-i", "1K"}, "give one way to step the sizes"},
	    {{"-b8"}, "-b8: write -b 8"},
	    {{"-y", "1"}, "-y 1 (--stream_null): only 0 is accepted"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		out = direct(2, bad[i].args[0], bad[i].args[1], bad[i].args[2], bad[i].args[3],
		             NULL);
		assert_has(out, bad[i].says);
		free(out);
	}
	out = direct(0, "--help", NULL);
	assert_has(out, "-a, --average 0|1|2|3");
	assert_has(out, "-J, --output_file F.json");
	assert_has(out, "--coll NAME");
	free(out);
}

static int setup(void **state)
{
	(void)state;
	const char *t = getenv("TMPDIR");
	snprintf(T, sizeof T, "%s/test_bench.XXXXXX", t && *t ? t : "/tmp");
	snprintf(BENCH, sizeof BENCH, "%s", h_build("bin/hpucoll-bench"));
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
	    cmocka_unit_test(test_long_options), cmocka_unit_test(test_all_pairs),
	    cmocka_unit_test(test_json),         cmocka_unit_test(test_average),
	    cmocka_unit_test(test_blocking_modes), cmocka_unit_test(test_timeout),
	    cmocka_unit_test(test_program_name),
	    cmocka_unit_test(test_refusals),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
