/* test_abi: ABI 2 models still load (issue 37, ABI 3). The ABI 2
 * fixture (tests/fixtures/abi2_model.c: positional layer arguments,
 * hpu_softmax_xent, an hpu_layer_ops without `device`, abi_version 2)
 * and its ABI 3 twin (abi3_model.c) train on 2 workers with the real
 * launcher to the same parameters, bit for bit (their --save-params
 * files are equal), and those moved from the initial ones. --verbose
 * names the twin's host-only layers, and says the ABI 2 model is one.
 * A hook after training reads the run's facts: ABI 2's hpu_run_rank,
 * _world_size and _step, ABI 3's hpu_run_ctx (the layers' context type). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/runlib.h"

/* Trains `model` `steps` steps (2 workers, batch 16, Adam); returns the
 * bytes of its --save-params file (*len), *out the launcher's output. */
static char *train(const char *model, const char *steps, const char *verbose, size_t *len,
		   char **out)
{
	char path[128];
	snprintf(path, sizeof path, "/tmp/hpu-abi-%d-%s.safetensors", (int)getpid(), steps);
	run r;
	start(&r, 2);
	args(&r, "--max-steps", steps, "--batch-size", "16", "--optimizer", "adam", "--lr",
	     "0.01", "--seed", "7", "--save-params", path, NULL);
	if (verbose)
		arg(&r, verbose);
	*out = finish_with(&r, 0, model, NULL);
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	char *buf = malloc(1 << 16);
	assert_non_null(buf);
	*len = fread(buf, 1, 1 << 16, f);
	fclose(f);
	unlink(path);
	return buf;
}

static void test_abi2_trains_as_abi3(void **state)
{
	(void)state;
	size_t n0, n2, n3;
	char *o0, *o2, *o3;
	char *init = train(h_build("lib/abi3_model.so"), "0", NULL, &n0, &o0);
	char *p2 = train(h_build("lib/abi2_model.so"), "12", "--verbose", &n2, &o2);
	char *p3 = train(h_build("lib/abi3_model.so"), "12", "--verbose", &n3, &o3);
	int same = n2 == n3 && memcmp(p2, p3, n2) == 0;
	printf("  ABI 2 model, 12 steps on 2 workers: %zu bytes of parameters, %s the ABI 3 "
	       "twin's\n", n2, same ? "equal to" : "DIFFERENT FROM");
	assert_true(n2 > 1000);
	assert_true(same);
	assert_true(n0 == n3 && memcmp(init, p3, n0) != 0); /* it trained */
	/* --verbose: the ABI, and the layers that run on the host only */
	assert_non_null(strstr(o2, "uses ABI 2's deprecated forms"));
	assert_null(strstr(o2, "runs on the host only"));
	assert_non_null(strstr(o3, "layer scale runs on the host only"));
	assert_non_null(strstr(o3, "layer xent runs on the host only"));
	assert_null(strstr(o3, "layer fc1 runs on the host only"));
	/* a hook's facts: ABI 2's accessors, ABI 3's context */
	assert_non_null(strstr(o2, "hook: rank 0 of 2, step 12\n"));
	assert_non_null(strstr(o3, "hook: rank 0 of 2, step 12\n"));
	assert_non_null(strstr(o3, "hook: seed 7, layer -1\n"));
	/* a metric with no test split to report it on is said (it was
	 * dropped in silence); not under --no-eval, which asked for none */
	assert_null(strstr(o3, "no evaluation reports it"));
	run r;
	r.n = 0;
	args(&r, LAUNCH, "-q", "--devices", "1", "--max-steps", "1", "--batch-size", "16", NULL);
	char *o = finish_with(&r, 0, h_build("lib/abi3_model.so"), NULL);
	assert_non_null(strstr(o, "note: the model declares 1 metric (accuracy) but no test split: "
				  "no evaluation reports it"));
	free(o);
	free(init), free(p2), free(p3), free(o0), free(o2), free(o3);
}

/* One error recorder (ABI 3): hpu_error(x, ...) on a layer fails its
 * forward, on a run fails the hook, each message reported as given; a
 * layer or hook that returns an error without one is reported with the
 * code it returned (it said "(no reason given)"). */
static void test_one_error_recorder(void **state)
{
	(void)state;
	struct {
		const char *arg, *text;
	} c[] = {
		{"--fail-forward", "layer scale: forward failed: scale failed on purpose at step 3"},
		{"--fail-hook", "the model's hook after training failed: the hook failed on purpose "
				"after step 4"},
		{"--fail-forward --fail-quietly",
		 "layer scale: forward failed: it returned -2 (Invalid argument.) without a message "
		 "(hpu_error records one)"},
		{"--fail-hook --fail-quietly",
		 "the model's hook after training failed: it returned 7 without a message"},
	};
	for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
		run r;
		start(&r, 2);
		args(&r, "--max-steps", "4", "--batch-size", "16", NULL);
		char *out = finish_with(&r, 1, h_build("lib/abi3_model.so"), c[i].arg);
		printf("%s", out);
		assert_non_null(strstr(out, c[i].text));
		free(out);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_abi2_trains_as_abi3),
		cmocka_unit_test(test_one_error_recorder),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
