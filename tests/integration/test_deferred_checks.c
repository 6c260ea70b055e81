/* test_deferred_checks: a recordable training step (HPU_STRICT_STEP=1,
 * issue 36) brings nothing back to the host inside it, so the ops' checks
 * of their data (a cross-entropy's labels, an embedding's ids) write their
 * findings into device memory and the step reads them after it
 * (worker/ops/checks.h, worker/strategy/strategy_vars.c):
 *
 * - the MLP with a label of 17 in its third micro-batch (the fixture
 *   fault_mlp's --bad-label-at) fails the job (exit 1) after that step
 *   with a sentence naming the layer, the label, its row and dataset
 *   sample (the same sample the eager step names), on cpu and cpu-strict;
 * - a bad label in an evaluation batch of a recordable run (HPU_STRICT_STEP=1,
 *   --graphs) is read after that batch and named the same way, prefixed
 *   "evaluation: ";
 * - recordable or not, the MLP's --save-params after a few steps are the
 *   same bytes, fp32 and bf16-mixed, 2 workers; --verbose says the steps
 *   are recordable. */
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

#define DEFERRED                                                                               \
	"step 3: layer xent: label 17 at row 0 (dataset sample %lu), position 0 is outside [0, 10) " \
	"and not -100 (ignored): found after the step (the cross-entropy's check, deferred)"
#define RECORDABLE                                                                             \
	"recordable training steps (HPU_STRICT_STEP=1): nothing comes back to the host inside a " \
	"step; the ops' checks of labels, ids and probabilities are read after it"

static void has(const char *out, const char *needle)
{
	if (!strstr(out, needle))
		fail_msg("output does not say \"%s\":\n%s", needle, out);
}

/* fault_mlp on `device`, 1 worker, batch 16, a label of 17 in the third
 * micro-batch's row 0; recordable when `strict`. Exits 1; its output. */
static char *bad_label_run(const char *device, int strict)
{
	run r;
	if (strict)
		setenv("HPU_STRICT_STEP", "1", 1);
	start(&r, 1);
	args(&r, "--device", device, "--max-steps", "4", "--batch-size", "16", NULL);
	char *out = finish_with(&r, 1, FAULT_MODEL,
				"--hidden 32 --depth 1 --bad-label-at 3 --bad-label 17");
	unsetenv("HPU_STRICT_STEP");
	return out;
}

static void test_bad_label_named_after_the_step(void **state)
{
	(void)state;
	/* eager: the layer's own error names the sample */
	char *eager = bad_label_run("cpu", 0);
	const char *at = strstr(eager, "layer xent: forward failed: label 17 at row 0 (dataset sample ");
	if (!at)
		fail_msg("the eager run does not name the label:\n%s", eager);
	unsigned long sample = strtoul(at + strlen("layer xent: forward failed: label 17 at row 0 "
						   "(dataset sample "),
				       NULL, 10);
	char want[512];
	snprintf(want, sizeof want, DEFERRED, sample);
	const char *devices[] = {"cpu", "cpu-strict"};
	for (int d = 0; d < 2; d++) {
		char *out = bad_label_run(devices[d], 1);
		printf("  %s, recordable: %s\n", devices[d], strstr(out, want) ? want : "(not said)");
		has(out, want);
		assert_null(strstr(out, "forward failed"));
		free(out);
	}
	free(eager);
}

#define EVAL_DEFERRED                                                                          \
	"evaluation: layer xent: label 17 at row 0 (dataset sample %lu), position 0 is outside "  \
	"[0, 10) and not -100 (ignored): found after the step (the cross-entropy's check, "        \
	"deferred)"

/* fault_mlp validating after 2 steps on 60 held-out samples, a label of
 * 17 in its third evaluation batch's row 0: eager, or recordable
 * (HPU_STRICT_STEP=1, or --graphs: the evaluation's sums stay on the
 * device and its checks are deferred to the batch's end). Exits 1. */
static char *bad_eval_run(const char *device, int strict, int graphs)
{
	run r;
	if (strict)
		setenv("HPU_STRICT_STEP", "1", 1);
	start(&r, 1);
	args(&r, "--device", device, "--max-steps", "2", "--batch-size", "16", "--eval-every",
	     "2", "--val-fraction", "0.001", graphs ? "--graphs" : NULL, NULL);
	char *out = finish_with(&r, 1, FAULT_MODEL,
				"--hidden 32 --depth 1 --bad-eval-label-at 3 --bad-label 17");
	unsetenv("HPU_STRICT_STEP");
	return out;
}

/* A bad label in an evaluation batch: eager, the layer's error; in a
 * recordable run, read after the batch, naming the same sample. */
static void test_bad_label_in_evaluation(void **state)
{
	(void)state;
	char *eager = bad_eval_run("cpu", 0, 0);
	const char *key = "layer xent: forward failed: label 17 at row 0 (dataset sample ";
	const char *at = strstr(eager, key);
	if (!at)
		fail_msg("the eager run does not name the label:\n%s", eager);
	char want[512];
	snprintf(want, sizeof want, EVAL_DEFERRED, strtoul(at + strlen(key), NULL, 10));
	static const struct {
		const char *device;
		int strict, graphs;
	} runs[] = {{"cpu", 1, 0}, {"cpu-strict", 1, 0}, {"cpu", 0, 1}};
	for (int k = 0; k < 3; k++) {
		char *out = bad_eval_run(runs[k].device, runs[k].strict, runs[k].graphs);
		printf("  %s%s: %s\n", runs[k].device, runs[k].strict ? ", recordable" : ", --graphs",
		       strstr(out, want) ? want : "(not said)");
		has(out, want);
		assert_null(strstr(out, "forward failed"));
		free(out);
	}
	free(eager);
}

/* The MLP's parameters after 3 steps: recordable or not, the same bytes. */
static void same_params(const char *precision)
{
	char a[64], b[64];
	snprintf(a, sizeof a, "/tmp/hpu-dc-%d-eager.bin", (int)getpid());
	snprintf(b, sizeof b, "/tmp/hpu-dc-%d-rec.bin", (int)getpid());
	char *out[2];
	for (int k = 0; k < 2; k++) {
		run r;
		if (k)
			setenv("HPU_STRICT_STEP", "1", 1);
		start(&r, 2);
		args(&r, "--precision", precision, "--max-steps", "3", "--batch-size", "16",
		     "--optimizer", "adamw", "--verbose", "--save-params", k ? b : a, NULL);
		out[k] = finish(&r, 0, "--hidden 32 --depth 2");
		unsetenv("HPU_STRICT_STEP");
	}
	assert_null(strstr(out[0], RECORDABLE));
	has(out[1], RECORDABLE);
	size_t na, nb;
	char *pa = h_slurp_n(a, &na), *pb = h_slurp_n(b, &nb);
	assert_non_null(pa);
	assert_non_null(pb);
	int eq = na == nb && memcmp(pa, pb, na) == 0;
	printf("  %-10s recordable %s eager (%zu bytes of parameters)\n", precision,
	       eq ? "equals" : "DIFFERS FROM", na);
	assert_true(eq);
	free(pa);
	free(pb);
	free(out[0]);
	free(out[1]);
	unlink(a);
	unlink(b);
}

static void test_recordable_same_params(void **state)
{
	(void)state;
	same_params("fp32");
	same_params("bf16-mixed");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_bad_label_named_after_the_step),
	    cmocka_unit_test(test_bad_label_in_evaluation),
	    cmocka_unit_test(test_recordable_same_params),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
