/* test_seq_model: a 1-D sequence classifier built from the shape,
 * sequence and binary-loss layers (tests/fixtures/seq_model.c: conv1d,
 * pooling along one dimension, slice, concat, transpose, reduce,
 * reshape, conv2d_rect, sigmoid with BCE and BCE with logits) trains on
 * 2 workers with the real launcher and workers:
 *
 * - on --device cpu-strict to the same parameters, bit for bit, as on
 *   cpu (the layers touch device memory only inside device calls);
 * - the training moves every parameter tensor (each layer's backward
 *   reaches them) and lowers the loss. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/runlib.h"

#define SEQ h_build("lib/seq_model.so")

/* conv.weight [4, 2, 3], conv.bias [4], rect.weight [2, 1, 2, 1],
 * rect.bias [2], head.weight [1, 2], head.bias [1], in that order */
static const size_t tensors[] = {24, 4, 4, 2, 2, 1};
#define NTENSORS (sizeof tensors / sizeof tensors[0])
#define NPARAMS 37
#define STEPS 32
#define STEPS_S "32"

/* Trains `steps` steps on `device` (2 workers, batch 32, Adam) and
 * returns the saved parameters; *out gets the launcher's output. */
static float *train(const char *device, const char *steps, char **out)
{
	char path[128];
	snprintf(path, sizeof path, "/tmp/hpu-seq-%d-%s-%s.bin", (int)getpid(), device, steps);
	run r;
	start(&r, 2);
	args(&r, "--device", device, "--max-steps", steps, "--batch-size", "32", "--optimizer",
	     "adam", "--lr", "0.05", "--log-every", "1", "--save-params", path, NULL);
	*out = finish_with(&r, 0, SEQ, NULL);
	size_t n;
	float *p = load_params(path, &n);
	assert_int_equal(n, NPARAMS);
	unlink(path);
	return p;
}

/* The loss rank 0 printed for `step` ("step N/M loss X"). */
static double loss_at(const char *out, int step)
{
	char key[32];
	snprintf(key, sizeof key, "step %d/", step);
	const char *at = strstr(out, key);
	assert_non_null(at);
	at = strstr(at, "loss ");
	assert_non_null(at);
	return strtod(at + 5, NULL);
}

static void test_strict_equals_cpu(void **state)
{
	(void)state;
	char *o0, *o1, *o2;
	float *init = train("cpu", "0", &o0), *cpu = train("cpu", STEPS_S, &o1),
	      *strict = train("cpu-strict", STEPS_S, &o2);
	int same = memcmp(cpu, strict, NPARAMS * sizeof *cpu) == 0;
	printf("  seq_model, %d steps on 2 workers: cpu-strict %s cpu\n",
	       STEPS, same ? "equals" : "DIFFERS FROM");
	assert_true(same);
	size_t at = 0;
	for (size_t t = 0; t < NTENSORS; at += tensors[t++]) {
		double moved = 0;
		for (size_t i = at; i < at + tensors[t]; i++)
			moved += fabs((double)cpu[i] - (double)init[i]);
		printf("  parameter tensor %zu moved by %.4g in all\n", t, moved);
		assert_true(moved > 0);
	}
	/* the mean loss of the first and the last 4 steps: one batch is noisy */
	double first = 0, last = 0;
	for (int i = 1; i <= 4; i++) {
		first += loss_at(o1, i) / 4;
		last += loss_at(o1, STEPS - 4 + i) / 4;
	}
	printf("  mean loss: steps 1-4 %.5f, steps %d-%d %.5f\n", first, STEPS - 3, STEPS, last);
	assert_true(last < 0.95 * first);
	free(init), free(cpu), free(strict);
	free(o0), free(o1), free(o2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_strict_equals_cpu),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
