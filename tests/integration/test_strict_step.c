/* test_strict_step: nothing comes back to the host inside a training step.
 *
 * A recorded step (--graphs, a CUDA graph) cannot copy into host memory,
 * return a value to the host or wait on the host in its middle. Under
 * --device cpu-strict with HPU_STRICT_STEP=1 the runtime's step guard
 * (worker/device/device.h: hpu__dev_step_guard, on from the first
 * micro-step's forward to the end of the strategy's step) ends a worker
 * that does, naming the device call and the block it read. The MLP
 * trains 3 steps at 1 worker (no collectives' staging) under every
 * strategy, fp32, bf16-mixed and 16-mixed, with and without
 * --clip-grad-norm: every run must finish. And a model with host-only
 * layers, whose tensors the runtime stages through host memory inside
 * the step, is stopped with the guard's line: the guard is armed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/runlib.h"

#define GUARD_WORDS \
	"inside a training step (HPU_STRICT_STEP=1): a CUDA recording (--graphs on --device cuda) cannot do that"

/* The line of `out` that holds `needle`, into line (empty: none). */
static void line_of(const char *out, const char *needle, char *line, size_t len)
{
	const char *p = out ? strstr(out, needle) : NULL;
	line[0] = '\0';
	if (!p)
		return;
	while (p > out && p[-1] != '\n')
		p--;
	size_t n = strcspn(p, "\n");
	snprintf(line, len, "%.*s", (int)(n < len ? n : len - 1), p);
}

/* One run of `model` (NULL: the MLP) at 1 worker on cpu-strict with
 * HPU_STRICT_STEP=1: its exit code, its output in *out (caller frees). */
static int strict_run(const char *model, const char *strategy, const char *precision,
		      const char *clip, char **out)
{
	run r;
	setenv("HPU_STRICT_STEP", "1", 1);
	start(&r, 1);
	args(&r, "--device", "cpu-strict", "--strategy", strategy, "--precision", precision,
	     "--max-steps", "3", "--batch-size", "16", "--optimizer", "adamw", NULL);
	if (clip)
		args(&r, "--clip-grad-norm", clip, NULL);
	arg(&r, model ? model : MODEL);
	if (!model)
		args(&r, "--", "--hidden", "32", "--depth", "2", NULL);
	proc p;
	int code = h_run(&p, (char *const *)r.argv, NULL, 120000);
	unsetenv("HPU_STRICT_STEP");
	*out = strdup(p.out ? p.out : "");
	h_free(&p);
	return code;
}

/* Every strategy at `precision`, with --clip-grad-norm `clip` (NULL:
 * none): each run should exit 0 having trained its 3 steps. All run
 * before the verdict, each saying what stopped it; the runs that did
 * not finish. */
static int every_strategy(const char *precision, const char *clip)
{
	static const char *const strategies[] = {"fast_ddp", "ddp", "zero1", "zero2", "zero3"};
	int failed = 0;
	for (size_t k = 0; k < sizeof strategies / sizeof strategies[0]; k++) {
		char *out, want[96], line[512];
		int code = strict_run(NULL, strategies[k], precision, clip, &out);
		snprintf(want, sizeof want, "trained 3 steps on 1 worker (%s)", strategies[k]);
		int ok = code == 0 && strstr(out, want) && !strstr(out, GUARD_WORDS);
		line_of(out, GUARD_WORDS, line, sizeof line);
		if (!line[0])
			line_of(out, "error", line, sizeof line);
		printf("  %-8s %-10s clip %-4s exit %d%s%s\n", strategies[k], precision,
		       clip ? clip : "off", code, ok ? ": trained" : ": ", ok ? "" : line);
		if (!ok && !line[0])
			fprintf(stderr, "output:\n%s\n", out);
		failed += !ok;
		free(out);
	}
	return failed;
}

/* Both, with and without clipping: every run finished. */
static void every_run(const char *precision)
{
	int failed = every_strategy(precision, NULL) + every_strategy(precision, "1.0");
	fflush(stdout);
	assert_int_equal(failed, 0);
}

static void test_fp32(void **state)
{
	(void)state;
	every_run("fp32");
}

static void test_bf16_mixed(void **state)
{
	(void)state;
	every_run("bf16-mixed");
}

/* loss scaling: unscaling, the norm, a skipped step decided on the
 * device */
static void test_16_mixed(void **state)
{
	(void)state;
	every_run("16-mixed");
}

/* The guard is armed: a host-only layer's tensors are copied to host
 * memory inside the step (hpu__dev_copy), which a recorded step could
 * not do; the worker stops with one line naming the copy. */
static void test_guard_armed(void **state)
{
	(void)state;
	char *out, line[512];
	int code = strict_run(h_build("lib/host_layer_model.so"), "ddp", "fp32", NULL, &out);
	line_of(out, GUARD_WORDS, line, sizeof line);
	printf("  host-only layers: exit %d: %s\n", code, line);
	assert_int_not_equal(code, 0);
	unsigned long long bytes = 0;
	int end = -1;
	sscanf(line,
	       "[rank 0] hpu-worker: rank 0: cpu-strict: hpu__dev_copy brought %llu bytes of %*[^\n]"
	       "%n",
	       &bytes, &end);
	assert_true(end > 0 && bytes > 0);
	assert_non_null(strstr(line, " back to the host inside a training step (HPU_STRICT_STEP=1): "
				     "a CUDA recording (--graphs on --device cuda) cannot do that"));
	assert_null(strstr(out, "trained 3 steps"));
	free(out);
}

/* The MLP's --save-params after 5 steps on cpu-strict with the guard
 * (HPU_STRICT_STEP=1: the strategy recordable, its eager readbacks and
 * bf16 activation compression left out) and without: the same bytes.
 * With clipping, a schedule, 2 micro-steps and, in 16-mixed, an injected
 * overflow (a skipped step and the scale moved on the device). */
static char *params_of(const char *dir, const char *precision, const char *guard)
{
	char path[512];
	snprintf(path, sizeof path, "%s/%s-%s.bin", dir, precision, guard);
	run r;
	setenv("HPU_STRICT_STEP", guard, 1);
	start(&r, 1);
	args(&r, "--device", "cpu-strict", "--precision", precision, "--max-steps", "5",
	     "--batch-size", "32", "--grad-accum", "2", "--clip-grad-norm", "0.5", "--scheduler",
	     "cosine", "--save-params", path, NULL);
	if (strcmp(precision, "16-mixed") == 0)
		args(&r, "--inject-overflow-step", "2", NULL);
	args(&r, MODEL, "--", "--hidden", "32", "--depth", "2", NULL);
	proc pr;
	int code = h_run(&pr, (char *const *)r.argv, NULL, 120000);
	unsetenv("HPU_STRICT_STEP");
	if (code != 0)
		fprintf(stderr, "%s guard %s: exit %d\n%s\n", precision, guard, code,
			pr.out ? pr.out : "");
	h_free(&pr);
	assert_int_equal(code, 0);
	size_t n = 0;
	char *bytes = h_slurp_n(path, &n);
	assert_non_null(bytes);
	assert_true(n > 1000);
	return bytes;
}

static void test_recordable_same_params(void **state)
{
	(void)state;
	static const char *const precisions[] = {"fp32", "bf16-mixed", "16-mixed"};
	char dir[] = "/tmp/hpu-strict-step-XXXXXX";
	assert_non_null(mkdtemp(dir));
	for (size_t k = 0; k < 3; k++) {
		size_t n0 = 0, n1 = 0;
		char *off = params_of(dir, precisions[k], "0"), *on = params_of(dir, precisions[k], "1");
		char path[512];
		snprintf(path, sizeof path, "%s/%s-0.bin", dir, precisions[k]);
		free(h_slurp_n(path, &n0));
		snprintf(path, sizeof path, "%s/%s-1.bin", dir, precisions[k]);
		free(h_slurp_n(path, &n1));
		int same = n0 == n1 && memcmp(off, on, n0) == 0;
		printf("  %-10s recordable on and off: %zu and %zu bytes, %s\n", precisions[k], n0, n1,
		       same ? "the same" : "DIFFERENT");
		assert_true(same);
		free(off);
		free(on);
		remove(path);
		snprintf(path, sizeof path, "%s/%s-0.bin", dir, precisions[k]);
		remove(path);
	}
	rmdir(dir);
}

/* Recordable on plain cpu (no guard there) with the parameters in host
 * memory and the update on the device (zero3, --offload-param cpu,
 * 16-mixed): the update's staging copies the 16-bit parameters back after
 * it, so the host must know a skipped step (an injected overflow) inside
 * the step. The same parameters as eager. */
static void test_recordable_offloaded_params(void **state)
{
	(void)state;
	char dir[] = "/tmp/hpu-strict-off-XXXXXX", path[2][512];
	assert_non_null(mkdtemp(dir));
	for (int k = 0; k < 2; k++) {
		snprintf(path[k], sizeof path[k], "%s/%d.bin", dir, k);
		run r;
		setenv("HPU_STRICT_STEP", k ? "1" : "0", 1);
		start(&r, 1);
		args(&r, "--strategy", "zero3", "--precision", "16-mixed", "--offload-param", "cpu",
		     "--inject-overflow-step", "2", "--max-steps", "5", "--batch-size", "32",
		     "--save-params", path[k], MODEL, "--", "--hidden", "32", "--depth", "2", NULL);
		proc pr;
		int code = h_run(&pr, (char *const *)r.argv, NULL, 120000);
		unsetenv("HPU_STRICT_STEP");
		if (code)
			fprintf(stderr, "%s\n", pr.out ? pr.out : "");
		h_free(&pr);
		assert_int_equal(code, 0);
	}
	size_t n0 = 0, n1 = 0;
	char *a = h_slurp_n(path[0], &n0), *b = h_slurp_n(path[1], &n1);
	int same = a && b && n0 == n1 && n0 > 1000 && !memcmp(a, b, n0);
	printf("  zero3 --offload-param cpu 16-mixed, overflow at step 2, recordable on and off: %s\n",
	       same ? "the same" : "DIFFERENT");
	assert_true(same);
	free(a);
	free(b);
	remove(path[0]);
	remove(path[1]);
	rmdir(dir);
}

/* With 2 micro-steps a step, the first step's loss (the first micro-step's
 * sums kept when the second is summed) is the eager build's, not NaN. */
static void test_accum_first_loss(void **state)
{
	(void)state;
	run r;
	start(&r, 1);
	args(&r, "--max-steps", "2", "--batch-size", "32", "--grad-accum", "2", "--log-every", "1",
	     MODEL, "--", "--hidden", "32", "--depth", "2", NULL);
	proc pr;
	int code = h_run(&pr, (char *const *)r.argv, NULL, 120000);
	char line[512];
	line_of(pr.out, "step 1/2 loss ", line, sizeof line);
	printf("  --grad-accum 2: %s\n", line);
	float loss = 0;
	const char *p = strstr(line, "step 1/2 loss ");
	int got = p && sscanf(p, "step 1/2 loss %f", &loss) == 1;
	h_free(&pr);
	assert_int_equal(code, 0);
	assert_true(got);
	assert_true(loss > 1.5f && loss < 3.5f); /* ln 10 = 2.30 at the start */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_guard_armed),
	    cmocka_unit_test(test_fp32),
	    cmocka_unit_test(test_bf16_mixed),
	    cmocka_unit_test(test_16_mixed),
	    cmocka_unit_test(test_recordable_same_params),
	    cmocka_unit_test(test_recordable_offloaded_params),
	    cmocka_unit_test(test_accum_first_loss),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
