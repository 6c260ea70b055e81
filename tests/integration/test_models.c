/* The example models through the real launcher, briefly: the CNN under
 * several strategies and precisions, and the transformer LM printing its
 * validation loss and a generated sample. (Their full-length results are
 * in bench/RESULTS.md.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define LAUNCH h_build("bin/hpulaunch")

static char *run_ok(char **argv)
{
	proc p;
	int code = h_run(&p, argv, NULL, 300000);
	if (code != 0)
		fail_msg("exit %d:\n%s", code, p.out);
	char *out = strdup(p.out);
	h_free(&p);
	return out;
}

/* 30 steps of the CNN on 2 workers trains (the loss falls) under ddp,
 * zero3 with activation checkpointing, and bf16-mixed. */
static void test_cnn(void **state)
{
	(void)state;
	const char *variants[][6] = {
		{"--strategy", "ddp", "--precision", "fp32", NULL},
		{"--strategy", "zero3", "--activation-checkpointing", NULL},
		{"--strategy", "zero2", "--precision", "bf16-mixed", NULL},
	};
	for (int v = 0; v < 3; v++) {
		char *argv[32];
		int n = 0;
		argv[n++] = (char *)LAUNCH;
		argv[n++] = "-q";
		argv[n++] = "--devices";
		argv[n++] = "2";
		argv[n++] = "--max-steps";
		argv[n++] = "30";
		argv[n++] = "--log-every";
		argv[n++] = "10";
		argv[n++] = "--no-eval";
		for (int k = 0; variants[v][k]; k++)
			argv[n++] = (char *)variants[v][k];
		argv[n++] = (char *)h_build("lib/fmnist_cnn.so");
		argv[n] = NULL;
		char *out = run_ok(argv);
		const char *a = strstr(out, "step 10/"), *b = strstr(out, "step 30/");
		assert_non_null(a);
		assert_non_null(b);
		double l10 = strtod(strstr(a, "loss ") + 5, NULL), l30 = strtod(strstr(b, "loss ") + 5, NULL);
		printf("  cnn %s %s: loss %.4f at step 10, %.4f at step 30\n", variants[v][0],
		       variants[v][1], l10, l30);
		assert_true(l30 < l10);
		free(out);
	}
}

/* The LM trains a little, reports its validation loss and generates. */
static void test_tiny_lm(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "2", "--batch-size", "32",
			"--max-steps", "40", "--lr", "2e-3", "--log-every", "20",
			(char *)h_build("lib/tiny_lm.so"), NULL};
	char *out = run_ok(argv);
	const char *v = strstr(out, "test val_loss ");
	const char *sample = strstr(out, "sample (");
	assert_non_null(v);
	assert_non_null(sample);
	double loss = strtod(v + 14, NULL);
	printf("  tiny_lm: validation loss %.4f nats/char after 40 steps\n%.300s\n", loss, sample);
	assert_true(loss > 0 && loss < 3.48); /* below the unigram baseline */
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cnn),
		cmocka_unit_test(test_tiny_lm),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
