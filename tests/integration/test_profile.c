/* --profile and the device statistics, on real 2-worker runs of the MLP:
 * one Chrome trace per rank that parses, with the runtime's actions, the
 * collectives with their bytes and the model's own ranges; a trace of a
 * worker killed mid-run still parses; the ten DeviceStats of every rank
 * in the metrics file obey their invariants; a --graphs run on cpu-strict
 * shows each replay's calls inside its graph_replay range. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/integration/runlib.h"

static char dir[256];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof dir, "/tmp/hpu-profile-XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	return h_rmtree(dir);
}

/* Parses a whole file strictly (cJSON_ParseWithOpts requiring the end). */
static cJSON *parse_file(const char *path)
{
	char *text = h_slurp(path);
	if (!text) {
		fprintf(stderr, "cannot read %s\n", path);
		return NULL;
	}
	const char *end = NULL;
	cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
	if (!j)
		fprintf(stderr, "%s is not JSON near: %.80s\n", path, end ? end : "?");
	free(text);
	return j;
}

static const cJSON *events_of(const cJSON *trace)
{
	const cJSON *ev = cJSON_GetObjectItemCaseSensitive(trace, "traceEvents");
	assert_true(cJSON_IsArray(ev));
	return ev;
}

static const char *str(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return cJSON_IsString(v) ? v->valuestring : "";
}

static double num(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static int count_named(const cJSON *ev, const char *name, const char *cat)
{
	int n = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, ev)
	{
		if (!strcmp(str(e, "name"), name) && (!cat || !strcmp(str(e, "cat"), cat)))
			n++;
	}
	return n;
}

/* The main thread's training events (data_loading, forward, backward,
 * their per-layer events, optimizer_step): asserts that each lies inside
 * one of the step events, and returns how many there were. */
static int inside_steps(const cJSON *ev)
{
	double t0[64], t1[64];
	int nsteps = 0, n = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, ev)
	{
		if (!strcmp(str(e, "name"), "step") && nsteps < 64) {
			t0[nsteps] = num(e, "ts");
			t1[nsteps++] = num(e, "ts") + num(e, "dur");
		}
	}
	static const char *const cats[] = {"data", "forward", "backward", "optimizer"};
	cJSON_ArrayForEach(e, ev)
	{
		int training = 0;
		for (int k = 0; k < 4; k++)
			training |= !strcmp(str(e, "cat"), cats[k]);
		if (!training || num(e, "tid") != 1)
			continue;
		double a = num(e, "ts"), b = a + num(e, "dur");
		int in = 0;
		for (int k = 0; k < nsteps && !in; k++) /* %.3f rounding: 1 ns */
			in = a >= t0[k] - 0.001 && b <= t1[k] + 0.002;
		if (!in)
			fprintf(stderr, "%s at %.3f..%.3f is in no step\n", str(e, "name"), a, b);
		assert_true(in);
		n++;
	}
	return n;
}

/* A 2-worker fast_ddp run with --profile: each rank's trace names the
 * rank, holds 8 steps with their data loading, forward and backward (and
 * per layer), optimizer steps, the first barrier, all-reduces with their
 * bytes and algorithm, and the model's "loss" range (fault_mlp's probe
 * layer; the example has no ranges of its own); every event of the
 * main thread that belongs to training (data, forward, backward,
 * optimizer) lies inside a step. */
static void test_traces(void **state)
{
	(void)state;
	char prof[300], metrics[300];
	snprintf(prof, sizeof prof, "%s/traces", dir);
	snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
	run r;
	start(&r, 2);
	args(&r, "--profile", prof, "--max-steps", "8", "--batch-size", "64", "--metrics", metrics,
	     NULL);
	free(finish_with(&r, 0, FAULT_MODEL, NULL));
	for (int rank = 0; rank < 2; rank++) {
		char path[400];
		snprintf(path, sizeof path, "%s/perf-logs-rank%d.json", prof, rank);
		cJSON *t = parse_file(path);
		assert_non_null(t);
		const cJSON *other = cJSON_GetObjectItemCaseSensitive(t, "otherData");
		assert_int_equal((int)num(other, "rank"), rank);
		assert_int_equal((int)num(other, "world_size"), 2);
		assert_string_equal(str(other, "strategy"), "fast_ddp");
		/* older trace processors take displayTimeUnit for ts's unit */
		assert_null(cJSON_GetObjectItemCaseSensitive(t, "displayTimeUnit"));
		const cJSON *ev = events_of(t);
		assert_int_equal(count_named(ev, "step", "step"), 8);
		assert_int_equal(count_named(ev, "data_loading", "data"), 8);
		assert_int_equal(count_named(ev, "forward", "forward"), 8);
		assert_int_equal(count_named(ev, "backward", "backward"), 8);
		assert_int_equal(count_named(ev, "optimizer_step", "optimizer"), 8);
		assert_int_equal(count_named(ev, "forward:fc1", "forward"), 8);
		assert_int_equal(count_named(ev, "backward:fc3", "backward"), 8);
		assert_int_equal(count_named(ev, "loss", "user"), 8);
		assert_int_equal(count_named(ev, "fetch_batch", "data"), 8);
		assert_true(count_named(ev, "process_name", NULL) == 1);
		/* the first collective is the barrier the clocks align at */
		const cJSON *e, *first_coll = NULL;
		double grad_bytes = 0;
		int allreduces = 0, steps_seen = 0, profiler_events = 0;
		double step_end = -1;
		cJSON_ArrayForEach(e, ev)
		{
			if (!strcmp(str(e, "ph"), "M"))
				continue;
			if (!strcmp(str(e, "ph"), "i")) { /* what profiling cost, at the end */
				const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "args");
				assert_string_equal(str(e, "name"), "profiler");
				assert_true(num(c, "events") > 50 && num(c, "record_ms") > 0 &&
					    num(c, "flushes") >= 8);
				profiler_events++;
				continue;
			}
			assert_string_equal(str(e, "ph"), "X");
			/* Perfetto treats pid 0 specially: rank R is pid R + 1 */
			assert_int_equal((int)num(e, "pid"), rank + 1);
			assert_true(num(e, "dur") >= 0 && num(e, "ts") > 0);
			const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
			if (!strcmp(str(e, "cat"), "collective")) {
				if (!first_coll)
					first_coll = e;
				if (!strcmp(str(e, "name"), "all_reduce")) {
					allreduces++;
					assert_true(num(a, "bytes") > 0);
					assert_true(strlen(str(a, "algorithm")) > 0);
					/* gradients: step 1's all-reduces, before the first step ends */
					if (steps_seen == 0)
						grad_bytes += num(a, "bytes");
				}
			}
			if (!strcmp(str(e, "name"), "step")) {
				steps_seen++;
				assert_int_equal((int)num(a, "step"), steps_seen);
				assert_true(num(e, "ts") >= step_end);
				step_end = num(e, "ts") + num(e, "dur");
			}
		}
		assert_non_null(first_coll);
		assert_string_equal(str(first_coll, "name"), "barrier");
		assert_int_equal(profiler_events, 1);
		/* a step: data_loading, forward, backward, optimizer_step, and
		 * per layer: fc1, relu1, fc2, relu2, fc3, probe and xent forward,
		 * all but probe (nothing to do) backward */
		assert_int_equal(inside_steps(ev), 8 * (3 + 7 + 6 + 1));
		assert_true(allreduces >= 8);
		/* The gradients of every parameter went through the all-reduces
		 * of step 1: the final record counts the parameters. */
		char *m = h_slurp(metrics);
		assert_non_null(m);
		const char *fin = strstr(m, "\"final\":true");
		assert_non_null(fin);
		const char *p = strstr(fin, "\"parameters\":");
		assert_non_null(p);
		double params = strtod(p + 13, NULL);
		assert_true(params > 100000);
		if (grad_bytes < params * 4)
			fprintf(stderr, "rank %d: step 1 all-reduced %.0f bytes, parameters %.0f\n", rank,
				grad_bytes, params);
		assert_true(grad_bytes >= params * 4);
		free(m);
		cJSON_Delete(t);
	}
}

/* ZeRO-3 with every layer sharded: gathers and releases of parameters,
 * the all-gathers that carry them, and the reduce-scatters. */
static void test_zero3_events(void **state)
{
	(void)state;
	char prof[300], path[400];
	snprintf(prof, sizeof prof, "%s/z3", dir);
	run r;
	start(&r, 2);
	args(&r, "--profile", prof, "--profile-filename", "z3", "--max-steps", "3", "--batch-size",
	     "64", "--strategy", "zero3", "--param-persistence-threshold", "0", NULL);
	free(finish(&r, 0, NULL));
	snprintf(path, sizeof path, "%s/z3-rank1.json", prof);
	cJSON *t = parse_file(path);
	assert_non_null(t);
	const cJSON *ev = events_of(t);
	assert_true(count_named(ev, "gather_params", "zero3") >= 3 * 3 * 2); /* 3 units, fwd+bwd */
	/* the last layer stays gathered from its forward into its backward */
	assert_true(count_named(ev, "release_params", "zero3") >= 3 * (3 * 2 - 1));
	assert_true(count_named(ev, "all_gather", "collective") >= 3 * 3);
	assert_true(count_named(ev, "reduce_scatter", "collective") >= 3);
	const cJSON *e;
	cJSON_ArrayForEach(e, ev)
	{
		if (strcmp(str(e, "name"), "gather_params"))
			continue;
		const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
		assert_true(num(a, "bytes") > 0 && num(a, "unit") >= 0);
	}
	cJSON_Delete(t);
}

/* A hook's forward (gpt_lm's generation after training: a forward per
 * character) is named as such, not as an evaluation's eval_forward
 * outside every evaluate range. */
static void test_hook_forward_events(void **state)
{
	(void)state;
	char prof[300], path[400];
	snprintf(prof, sizeof prof, "%s/hook", dir);
	run r;
	start(&r, 1);
	args(&r, "--profile", prof, "--profile-filename", "hook", "--max-steps", "2", "--batch-size",
	     "8", "--no-eval", NULL);
	free(finish_with(&r, 0, h_build("lib/gpt_lm.so"),
			 "--ctx 8 --dim 16 --heads 2 --layers 1 --gen 3"));
	snprintf(path, sizeof path, "%s/hook-rank0.json", prof);
	cJSON *t = parse_file(path);
	assert_non_null(t);
	const cJSON *ev = events_of(t), *e;
	int hook = 0, eval = 0;
	cJSON_ArrayForEach(e, ev)
	{
		hook += !strncmp(str(e, "name"), "hook_forward:", 13) && !strcmp(str(e, "cat"), "hook");
		eval += !strncmp(str(e, "name"), "eval_forward:", 13);
	}
	printf("  gpt_lm --gen 3 --no-eval: %d hook_forward events, %d eval_forward\n", hook, eval);
	assert_true(hook >= 3);
	assert_int_equal(eval, 0);
	cJSON_Delete(t);
}

/* Checkpoint I/O shows in the trace: saves while training, the load of a
 * resumed run. */
static void test_checkpoint_events(void **state)
{
	(void)state;
	char prof[300], ck[300], path[400];
	snprintf(prof, sizeof prof, "%s/ck-trace", dir);
	snprintf(ck, sizeof ck, "%s/ck", dir);
	run r;
	start(&r, 2);
	args(&r, "--profile", prof, "--max-steps", "4", "--batch-size", "64", "--checkpoint-dir", ck,
	     "--checkpoint-every", "2", "--stop-at-step", "2", NULL);
	free(finish(&r, 0, NULL));
	start(&r, 2);
	args(&r, "--profile", prof, "--profile-filename", "resumed", "--max-steps", "4",
	     "--batch-size", "64", "--checkpoint-dir", ck, "--resume", "auto", NULL);
	free(finish(&r, 0, NULL));
	snprintf(path, sizeof path, "%s/perf-logs-rank0.json", prof);
	cJSON *t = parse_file(path);
	assert_non_null(t);
	assert_int_equal(count_named(events_of(t), "checkpoint_save", "checkpoint"), 1);
	cJSON_Delete(t);
	snprintf(path, sizeof path, "%s/resumed-rank1.json", prof);
	t = parse_file(path);
	assert_non_null(t);
	assert_int_equal(count_named(events_of(t), "checkpoint_load", "checkpoint"), 1);
	assert_int_equal(count_named(events_of(t), "checkpoint_save", "checkpoint"), 1);
	assert_int_equal(count_named(events_of(t), "step", "step"), 2);
	cJSON_Delete(t);
}

/* The steps of a run's trace, in order, into out (at most n); returns
 * how many. */
static int traced_steps(const cJSON *ev, int *out, int n)
{
	int k = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, ev)
	{
		if (!strcmp(str(e, "name"), "step") && k < n)
			out[k++] = (int)num(cJSON_GetObjectItemCaseSensitive(e, "args"), "step");
	}
	return k;
}

/* --profile-warmup-steps 2 --profile-steps 3: each rank's trace holds
 * steps 3 to 5 alone, with their data, layers and the model's ranges,
 * the validation and the save after step 4 (not those after 2, 6 and 8),
 * and the cost event; a resumed run counts from its own first step (its
 * checkpoint's load is before the window). The model's ranges are
 * matched as before (no "without hpu_profile_start" warning). */
static void test_step_window(void **state)
{
	(void)state;
	char prof[300], ck[300], path[400];
	snprintf(prof, sizeof prof, "%s/window", dir);
	snprintf(ck, sizeof ck, "%s/window-ck", dir);
	run r;
	start(&r, 2);
	args(&r, "--profile", prof, "--profile-warmup-steps", "2", "--profile-steps", "3",
	     "--max-steps", "8", "--batch-size", "64", "--eval-every", "2", "--checkpoint-dir", ck,
	     "--checkpoint-every", "2", NULL);
	char *out = finish_with(&r, 0, FAULT_MODEL, NULL);
	assert_null(strstr(out, "without hpu_profile_start"));
	free(out);
	for (int rank = 0; rank < 2; rank++) {
		snprintf(path, sizeof path, "%s/perf-logs-rank%d.json", prof, rank);
		cJSON *t = parse_file(path);
		assert_non_null(t);
		const cJSON *ev = events_of(t);
		int st[16];
		assert_int_equal(traced_steps(ev, st, 16), 3);
		assert_int_equal(st[0], 3);
		assert_int_equal(st[2], 5);
		assert_int_equal(count_named(ev, "forward", "forward"), 3);
		assert_int_equal(count_named(ev, "loss", "user"), 3);
		assert_int_equal(inside_steps(ev), 3 * (3 + 7 + 6 + 1));
		assert_int_equal(count_named(ev, "checkpoint_save", "checkpoint"), 1);
		/* the validation after step 4: between steps 3 and 5, and some */
		double lo = -1, hi = -1;
		int evals = 0;
		const cJSON *e;
		cJSON_ArrayForEach(e, ev)
		{
			if (!strcmp(str(e, "name"), "step") && lo < 0)
				lo = num(e, "ts");
			if (!strcmp(str(e, "name"), "step"))
				hi = num(e, "ts");
		}
		cJSON_ArrayForEach(e, ev)
		{
			if (strcmp(str(e, "cat"), "eval") != 0)
				continue;
			evals++;
			assert_true(num(e, "ts") > lo && num(e, "ts") < hi);
		}
		assert_true(evals > 0);
		assert_int_equal(count_named(ev, "profiler", "profiler"), 1);
		/* the first barrier, where hpu-trace aligns the ranks */
		assert_int_equal(count_named(ev, "barrier", "collective"), 1);
		cJSON_Delete(t);
	}
	start(&r, 2);
	args(&r, "--profile", prof, "--profile-filename", "resumed", "--profile-warmup-steps", "1",
	     "--max-steps", "12", "--batch-size", "64", "--checkpoint-dir", ck, "--resume", "auto",
	     NULL);
	out = finish_with(&r, 0, FAULT_MODEL, NULL);
	/* the line says the steps as the trace numbers them (it said only
	 * "this run's steps 2 to the end") */
	assert_non_null(strstr(out, "of this run's steps 2 to the end (step 10 of training on: it "
				    "resumed at step 8)"));
	free(out);
	snprintf(path, sizeof path, "%s/resumed-rank0.json", prof);
	cJSON *t = parse_file(path);
	assert_non_null(t);
	int st[16];
	assert_int_equal(traced_steps(events_of(t), st, 16), 3);
	assert_int_equal(st[0], 10);
	assert_int_equal(st[2], 12);
	assert_int_equal(count_named(events_of(t), "checkpoint_load", "checkpoint"), 0);
	assert_int_equal(count_named(events_of(t), "checkpoint_save", "checkpoint"), 1);
	cJSON_Delete(t);
}

/* kill -9 a worker mid-run: every trace in the directory still parses as
 * JSON and holds the steps done before the kill. */
static void test_killed_worker(void **state)
{
	(void)state;
	char prof[300];
	snprintf(prof, sizeof prof, "%s/killed", dir);
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--epochs", "20", "--log-every", "2",
			"--batch-size", "64", "--profile", prof, (char *)MODEL, NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	int seen = h_wait_for(&p, "step 10/", 120000);
	pid_t kids[8];
	int n = h_children(p.pid, kids, 8);
	if (seen != 0 || n != 2) {
		fprintf(stderr, "training did not start (%d workers):\n%s\n", n, p.out);
		for (int i = 0; i < n; i++)
			kill(kids[i], SIGKILL);
		h_kill(&p);
		fail();
	}
	kill(kids[0], SIGKILL);
	int exited = h_wait(&p, 30000);
	if (exited != 0)
		h_kill(&p);
	assert_int_equal(exited, 0);
	assert_int_not_equal(h_code(&p), 0);
	h_free(&p);
	for (int rank = 0; rank < 2; rank++) {
		char path[400];
		snprintf(path, sizeof path, "%s/perf-logs-rank%d.json", prof, rank);
		cJSON *t = parse_file(path);
		assert_non_null(t);
		/* rank 0 printed step 10 after its all-reduces of step 10: both
		 * ranks had flushed step 9 by then */
		int steps = count_named(events_of(t), "step", "step");
		assert_true(steps >= 9);
		assert_int_equal(count_named(events_of(t), "evaluate", NULL), 0);
		cJSON_Delete(t);
	}
}

/* A trace directory that cannot be made: the error names it, and no
 * training happens. */
static void test_bad_profile_dir(void **state)
{
	(void)state;
	char file[300], prof[400];
	snprintf(file, sizeof file, "%s/a-file", dir);
	FILE *f = fopen(file, "w");
	assert_non_null(f);
	fclose(f);
	snprintf(prof, sizeof prof, "%s/sub", file);
	run r;
	start(&r, 2);
	args(&r, "--profile", prof, "--max-steps", "2", "--batch-size", "64", NULL);
	char *out = finish(&r, 1, NULL);
	char want[500];
	snprintf(want, sizeof want, "--profile: cannot create the directory %s: Not a directory", prof);
	if (!strstr(out, want))
		fprintf(stderr, "wanted '%s' in:\n%s\n", want, out);
	assert_non_null(strstr(out, want));
	assert_null(strstr(out, "trained "));
	free(out);
	/* HPU_PROFILE_SYNC takes 0 or 1 */
	snprintf(prof, sizeof prof, "%s/sync", dir);
	setenv("HPU_PROFILE_SYNC", "yes", 1);
	start(&r, 1);
	args(&r, "--profile", prof, "--max-steps", "2", "--batch-size", "64", NULL);
	out = finish(&r, 1, NULL);
	unsetenv("HPU_PROFILE_SYNC");
	if (!strstr(out, "HPU_PROFILE_SYNC=yes: must be 0 or 1"))
		fprintf(stderr, "no HPU_PROFILE_SYNC error in:\n%s\n", out);
	assert_non_null(strstr(out, "HPU_PROFILE_SYNC=yes: must be 0 or 1"));
	assert_null(strstr(out, "trained "));
	free(out);
}

/* A disk that fills while the traces are written (a 40 KiB tmpfs): the
 * run goes on, each trace stops where it was and still parses, and the
 * line says why (it said "short write", and the trace held the events
 * that fit after its end: no longer JSON). */
static void test_disk_full(void **state)
{
	(void)state;
	char mnt[300], prof[340], path[400];
	snprintf(mnt, sizeof mnt, "%s/small-fs", dir);
	snprintf(prof, sizeof prof, "%s/prof", mnt);
	mount_small_fs(mnt, "40k");
	run r;
	start(&r, 2);
	args(&r, "--profile", prof, "--max-steps", "30", "--batch-size", "64", "--no-eval", NULL);
	char *out = finish(&r, 0, NULL);
	int said = strstr(out, "profiling stopped: writing ") &&
		   strstr(out, "No space left on device") && !strstr(out, "short write");
	if (!said)
		fprintf(stderr, "no \"profiling stopped ... No space left on device\" in:\n%s\n", out);
	free(out);
	int parsed = 0;
	for (int rank = 0; rank < 2; rank++) {
		snprintf(path, sizeof path, "%s/perf-logs-rank%d.json", prof, rank);
		cJSON *t = parse_file(path);
		parsed += t != NULL;
		cJSON_Delete(t);
	}
	umount(mnt);
	assert_true(said);
	assert_int_equal(parsed, 2);
}

/* Reads the metrics file's records with a "device" array. */
static void check_device_stats(const cJSON *rec, int world, double *prev_allocs,
			       double *prev_max)
{
	const cJSON *dev = cJSON_GetObjectItemCaseSensitive(rec, "device");
	assert_true(cJSON_IsArray(dev));
	assert_int_equal(cJSON_GetArraySize(dev), world);
	for (int r = 0; r < world; r++) {
		const cJSON *d = cJSON_GetArrayItem(dev, r);
		assert_int_equal((int)num(d, "rank"), r);
		double limit = num(d, "Limit"), in_use = num(d, "InUse"), max = num(d, "MaxInUse");
		double allocs = num(d, "NumAllocs"), frees = num(d, "NumFrees");
		double active = num(d, "ActiveAllocs"), max_alloc = num(d, "MaxAllocSize");
		double sys_a = num(d, "TotalSystemAllocs"), sys_f = num(d, "TotalSystemFrees");
		double sys_active = num(d, "TotalActiveAllocs");
		assert_true(in_use > 0);
		assert_true(in_use <= max);
		assert_true(max <= limit);
		assert_true(allocs - frees == active);
		assert_true(sys_a - sys_f == sys_active);
		assert_true(max_alloc > 0 && max_alloc <= max);
		assert_true(sys_a <= allocs);
		/* counters only grow */
		assert_true(allocs >= prev_allocs[r]);
		assert_true(max >= prev_max[r]);
		prev_allocs[r] = allocs;
		prev_max[r] = max;
	}
}

/* Every logging step writes the ten DeviceStats of every rank into the
 * metrics file, and rank 0's console line prints its memory_allocated,
 * max_memory_allocated and total_memory_available. */
static void test_device_stats(void **state)
{
	(void)state;
	char metrics[300];
	snprintf(metrics, sizeof metrics, "%s/dev.jsonl", dir);
	run r;
	start(&r, 2);
	r.n -= 2; /* drop "--log-every 0" */
	args(&r, "--log-every", "3", "--max-steps", "12", "--batch-size", "64", "--metrics", metrics,
	     "--strategy", "zero2", NULL);
	char *out = finish(&r, 0, NULL);
	char *text = h_slurp(metrics);
	assert_non_null(text);
	double prev_allocs[2] = {0, 0}, prev_max[2] = {0, 0};
	int steps = 0, finals = 0;
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		cJSON *rec = cJSON_Parse(line);
		assert_non_null(rec);
		if (cJSON_GetObjectItemCaseSensitive(rec, "device")) {
			check_device_stats(rec, 2, prev_allocs, prev_max);
			if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(rec, "final")))
				finals++;
			else
				steps++;
		}
		if (steps == 1 && !finals && cJSON_GetObjectItemCaseSensitive(rec, "step")) {
			/* the console line of step 3 prints rank 0's figures in MiB */
			const cJSON *d0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(rec, "device"), 0);
			char want[200];
			snprintf(want, sizeof want,
				 "step 3/12 loss %.4f lr 0.001 ", num(rec, "loss"));
			assert_non_null(strstr(out, want));
			snprintf(want, sizeof want,
				 "memory_allocated %.1f MiB max_memory_allocated %.1f MiB "
				 "total_memory_available %.1f MiB",
				 num(d0, "InUse") / 1048576.0, num(d0, "MaxInUse") / 1048576.0,
				 num(d0, "Limit") / 1048576.0);
			if (!strstr(out, want))
				fprintf(stderr, "wanted '%s' in:\n%s\n", want, out);
			assert_non_null(strstr(out, want));
		}
		cJSON_Delete(rec);
	}
	assert_int_equal(steps, 4);
	assert_int_equal(finals, 1);
	free(text);
	free(out);
}

/* --graphs under --profile, on the CPU's twin (cpu-strict): every
 * graph_replay range holds one "graph_node" span per recorded call (the
 * recording's count, as --verbose says it), named by the call (the
 * products' gemm, the optimizer's optim), inside the range on its row,
 * and the range's args count the same calls by name; the eager steps
 * before the recording hold none. */
static void test_graph_nodes(void **state)
{
	(void)state;
	char prof[300], path[400];
	snprintf(prof, sizeof prof, "%s/graphs", dir);
	run r;
	start(&r, 1);
	args(&r, "--device", "cpu-strict", "--graphs", "--graphs-warmup", "2", "--verbose",
	     "--profile", prof, "--profile-filename", "g", "--max-steps", "5", "--batch-size",
	     "32", NULL);
	char *out = finish(&r, 0, "--hidden 32 --depth 2");
	const char *rec = strstr(out, "recorded the step of ");
	const char *calls = rec ? strstr(rec, ": ") : NULL;
	long n = calls ? strtol(calls + 2, NULL, 10) : -1;
	printf("  the recording: %ld device calls\n", n);
	if (n <= 0)
		fprintf(stderr, "no recording in:\n%s\n", out);
	assert_true(n > 0);
	snprintf(path, sizeof path, "%s/g-rank0.json", prof);
	cJSON *t = parse_file(path);
	assert_non_null(t);
	const cJSON *ev = events_of(t), *e, *x;
	int replays = 0;
	long nodes_total = 0;
	cJSON_ArrayForEach(x, ev)
	{
		if (!strcmp(str(x, "cat"), "graph_node"))
			nodes_total++;
	}
	cJSON_ArrayForEach(e, ev)
	{
		if (strcmp(str(e, "name"), "graph_replay"))
			continue;
		replays++;
		double a = num(e, "ts"), b = a + num(e, "dur");
		long inside = 0, gemm = 0, optim = 0;
		cJSON_ArrayForEach(x, ev)
		{
			if (strcmp(str(x, "cat"), "graph_node") || num(x, "tid") != num(e, "tid"))
				continue;
			double xa = num(x, "ts"), xb = xa + num(x, "dur");
			if (xa < a - 0.001 || xb > b + 0.002) /* %.3f rounding */
				continue;
			inside++;
			gemm += !strcmp(str(x, "name"), "gemm");
			optim += !strcmp(str(x, "name"), "optim");
		}
		const cJSON *nodes =
			cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "args"),
							 "nodes");
		long listed = 0;
		cJSON_ArrayForEach(x, nodes)
		{
			listed += (long)x->valuedouble;
		}
		printf("  graph_replay of step %.0f: %ld node spans inside (%ld gemm, %ld optim), "
		       "%ld calls in its args\n",
		       num(cJSON_GetObjectItemCaseSensitive(e, "args"), "step"), inside, gemm, optim,
		       listed);
		assert_int_equal(inside, n);
		assert_true(gemm > 0);
		assert_true(optim > 0);
		assert_true(cJSON_IsObject(nodes));
		assert_int_equal(listed, n);
		assert_true(num(nodes, "gemm") == (double)gemm);
		assert_true(num(nodes, "optim") == (double)optim);
	}
	/* steps 3 (recorded, then launched), 4 and 5; steps 1 and 2 eager */
	assert_int_equal(replays, 3);
	assert_int_equal(nodes_total, 3 * n);
	/* an optimizer_step span is the update alone, as without --graphs:
	 * it held the eager steps' forward and backward and each replay's
	 * graph_replay (92 % of a step in hpu-trace's table) */
	int updates = 0;
	cJSON_ArrayForEach(e, ev)
	{
		if (strcmp(str(e, "name"), "optimizer_step"))
			continue;
		updates++;
		double a = num(e, "ts"), b = a + num(e, "dur");
		cJSON_ArrayForEach(x, ev)
		{
			const char *nm = str(x, "name");
			if (num(x, "tid") != num(e, "tid") ||
			    (strcmp(nm, "forward") && strcmp(nm, "backward") && strcmp(nm, "graph_replay")))
				continue;
			double xa = num(x, "ts"), xb = xa + num(x, "dur");
			if (xa >= a - 0.001 && xb <= b + 0.002)
				fail_msg("optimizer_step at %.3f (%.3f us) holds %s at %.3f", a, b - a, nm, xa);
		}
	}
	assert_true(updates >= 2); /* the eager steps' and the recording's */
	cJSON_Delete(t);
	free(out);
}

/* The calls of the first graph_replay range of a --device cpu --graphs
 * run of `model` at `precision`, by name (its args' "nodes"): the count
 * of `name` (-1: no replay), and of `name2` into *n2. */
static long replay_calls(const char *tag, const char *model, const char *precision,
			 const char *name, const char *name2, long *n2)
{
	char prof[300], path[400];
	snprintf(prof, sizeof prof, "%s/%s", dir, tag);
	run r;
	start(&r, 1);
	args(&r, "--device", "cpu", "--graphs", "--graphs-warmup", "1", "--precision", precision,
	     "--profile", prof, "--profile-filename", "g", "--max-steps", "3", "--batch-size",
	     "32", NULL);
	free(finish_with(&r, 0, model, NULL));
	snprintf(path, sizeof path, "%s/g-rank0.json", prof);
	cJSON *t = parse_file(path);
	assert_non_null(t);
	const cJSON *e;
	long n = -1;
	cJSON_ArrayForEach(e, events_of(t))
	{
		if (strcmp(str(e, "name"), "graph_replay"))
			continue;
		const cJSON *nodes =
			cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "args"),
							 "nodes");
		const cJSON *c = cJSON_GetObjectItemCaseSensitive(nodes, name);
		const cJSON *c2 = cJSON_GetObjectItemCaseSensitive(nodes, name2);
		n = cJSON_IsNumber(c) ? (long)c->valuedouble : 0;
		*n2 = cJSON_IsNumber(c2) ? (long)c2->valuedouble : 0;
		printf("  %s %s: %ld %s and %ld %s calls in a replay\n", tag, precision, n, name,
		       *n2, name2);
		break;
	}
	cJSON_Delete(t);
	return n;
}

/* --device cpu --graphs records what eager cpu runs (issue 36's cost of
 * a replay): the CNN's two backward convolutions in one call (conv_bwd,
 * dy's layout change made once, as eager's), and the gradients owed
 * zeros the ops claim (their zeros the kernel table's zero calls), in
 * fp32 and bf16-mixed (where a weight gradient's product writes the
 * 16-bit gradient itself). Their bytes against eager: test_graphs. */
static void test_graph_calls_cpu(void **state)
{
	(void)state;
	long z = 0, w = 0;
	assert_true(replay_calls("cnn", h_build("lib/fmnist_cnn.so"), "fp32", "conv_bwd", "zero",
				 &z) >= 1);
	assert_true(z >= 1);
	assert_true(replay_calls("mlp", MODEL, "fp32", "zero", "gemm", &w) >= 1);
	assert_true(replay_calls("mlp16", MODEL, "bf16-mixed", "zero", "gemm", &w) >= 1);
}

/* --stall-warning: rank 1 of 3 sleeps 1.5 s before a collective (the
 * fault_mlp fixture's knob); after 0.3 s the others warn, naming ranks 0
 * and 2 as arrived and rank 1 as not; the job then goes on to the end. */
static void test_stall_warning(void **state)
{
	(void)state;
	run r;
	start(&r, 3);
	args(&r, "--batch-size", "96", "--max-steps", "15", "--stall-warning", "0.3", NULL);
	char *out = finish_with(&r, 0, FAULT_MODEL, "--sleep-rank 1 --sleep-ms 1500");
	const char *w = strstr(out, "[rank 0] hpucoll: rank 0: all_reduce");
	if (!w)
		fprintf(stderr, "no stall warning of rank 0 in:\n%s\n", out);
	assert_non_null(w);
	const char *eol = strchr(w, '\n');
	char line[600];
	snprintf(line, sizeof line, "%.*s", (int)(eol ? eol - w : (long)strlen(w)), w);
	assert_non_null(strstr(line, "arrived: ranks 0, 2;"));
	assert_non_null(strstr(line, "not arrived: rank 1"));
	assert_non_null(strstr(out, "trained 15 steps on 3 workers"));
	free(out);
}

/* The samples/s of log line `step` in out (-1 if there is none). */
static double logged_sps(const char *out, int step)
{
	char key[64];
	snprintf(key, sizeof key, "step %d/6 loss ", step);
	const char *l = strstr(out, key);
	const char *v = l ? strstr(l, "samples/s ") : NULL;
	return v ? strtod(v + 10, NULL) : -1;
}

/* --throughput-warmup-steps N: the log lines of the first N steps have
 * no throughput yet ("-", null in the metrics), the later ones do; with 0
 * the first has one. */
static void test_throughput_warmup(void **state)
{
	(void)state;
	char metrics[300];
	snprintf(metrics, sizeof metrics, "%s/warm.jsonl", dir);
	run r;
	start(&r, 2);
	r.n -= 2; /* drop "--log-every 0" */
	args(&r, "--log-every", "1", "--max-steps", "6", "--batch-size", "64",
	     "--throughput-warmup-steps", "3", "--metrics", metrics, NULL);
	char *out = finish(&r, 0, NULL);
	char *text = h_slurp(metrics);
	assert_non_null(text);
	int nulls = 0, numbers = 0;
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		cJSON *rec = cJSON_Parse(line);
		assert_non_null(rec);
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, "samples_per_sec");
		const cJSON *step = cJSON_GetObjectItemCaseSensitive(rec, "step");
		if (cJSON_IsNumber(step) && !cJSON_GetObjectItemCaseSensitive(rec, "final")) {
			if (step->valuedouble <= 3) {
				assert_true(cJSON_IsNull(v));
				nulls++;
			} else {
				assert_true(cJSON_IsNumber(v) && v->valuedouble > 0);
				numbers++;
			}
		}
		cJSON_Delete(rec);
	}
	free(text);
	assert_int_equal(nulls, 3);
	assert_int_equal(numbers, 3);
	for (int step = 1; step <= 3; step++) {
		char want[64];
		snprintf(want, sizeof want, "step %d/6 loss ", step);
		const char *l = strstr(out, want);
		assert_non_null(l);
		assert_non_null(strstr(l, "samples/s - memory_allocated"));
		assert_true(strstr(l, "samples/s - ") < strchr(l, '\n'));
	}
	for (int step = 4; step <= 6; step++)
		assert_true(logged_sps(out, step) > 0);
	free(out);
	start(&r, 2);
	r.n -= 2;
	args(&r, "--log-every", "1", "--max-steps", "6", "--batch-size", "64",
	     "--throughput-warmup-steps", "0", NULL);
	out = finish(&r, 0, NULL);
	assert_true(logged_sps(out, 1) > 0);
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_traces),
		cmocka_unit_test(test_zero3_events),
		cmocka_unit_test(test_hook_forward_events),
		cmocka_unit_test(test_checkpoint_events),
		cmocka_unit_test(test_step_window),
		cmocka_unit_test(test_killed_worker),
		cmocka_unit_test(test_bad_profile_dir),
		cmocka_unit_test(test_disk_full),
		cmocka_unit_test(test_device_stats),
		cmocka_unit_test(test_stall_warning),
		cmocka_unit_test(test_throughput_warmup),
		cmocka_unit_test(test_graph_nodes),
		cmocka_unit_test(test_graph_calls_cpu),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
