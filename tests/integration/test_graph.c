/* Integration tests of models as graphs (ABI 2), with the real launcher,
 * workers and the layer library:
 *
 * - a residual, tied-weight, two-loss graph (tests/fixtures/graph_model.c)
 *   under every strategy at 2 and 3 workers trains to the parameters of
 *   the 1-process run (SGD: 1e-6 relative);
 * - dropout: the same masks under activation checkpointing's recompute,
 *   after a restart from a checkpoint, and at any world size (they follow
 *   the sample); off in evaluation;
 * - linear regression (float targets, MSE) under full-batch gradient
 *   descent reaches numpy's least-squares solution (solved here);
 * - the run's length: --max-steps wins over --epochs (one step per epoch
 *   here), and --max-steps 0 trains nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/fixtures/regression.h"
#include "tests/integration/runlib.h"

#define GRAPH h_build("lib/graph_model.so")
#define REGRESSION h_build("lib/regression.so")

static const char *strategies[] = {"ddp", "fast_ddp", "zero1", "zero2", "zero3"};

static char tmpdir[256];

static const char *tmp(const char *name)
{
	static char buf[8][512];
	static int k;
	k = (k + 1) & 7;
	snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
	return buf[k];
}

/* SGD on the graph model: 12 steps of a global batch of 48 (every world
 * size here divides it). */
static void graph_run(const char *strategy, int workers, const char *margs, const char *out,
		      const char *extra)
{
	run r;
	start(&r, workers);
	args(&r, "--strategy", strategy, "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.2",
	     "--batch-size", "48", "--max-steps", "12", "--save-params", out,
	     "--reduce-bucket-size", "100", "--allgather-bucket-size", "200",
	     "--param-persistence-threshold", "50", NULL);
	if (extra) { /* one more option and its value, space-separated */
		static char buf[128];
		snprintf(buf, sizeof buf, "%s", extra);
		char *sp = strchr(buf, ' ');
		if (sp)
			*sp = 0;
		arg(&r, buf);
		if (sp)
			arg(&r, sp + 1);
	}
	free(finish_with(&r, 0, GRAPH, margs));
}

/* ||a - b|| / ||b|| over the whole parameter file. */
static double rel(const char *pa, const char *pb)
{
	size_t na, nb;
	float *a = load_params(pa, &na), *b = load_params(pb, &nb);
	assert_int_equal(na, nb);
	double dd = 0, bb = 0;
	for (size_t i = 0; i < na; i++) {
		double d = (double)a[i] - b[i];
		dd += d * d;
		bb += (double)b[i] * b[i];
	}
	free(a);
	free(b);
	return sqrt(dd / bb);
}

static void equivalence(const char *margs, const char *tag)
{
	char ref[64];
	snprintf(ref, sizeof ref, "%s-ref.bin", tag);
	graph_run("ddp", 1, margs, tmp(ref), NULL);
	for (size_t s = 0; s < sizeof strategies / sizeof *strategies; s++)
		for (int w = 2; w <= 3; w++) {
			char out[64];
			snprintf(out, sizeof out, "%s-%s-%d.bin", tag, strategies[s], w);
			graph_run(strategies[s], w, margs, tmp(out), NULL);
			double d = rel(tmp(out), tmp(ref));
			printf("  %s %s x%d: relative difference %.2g\n", tag, strategies[s], w, d);
			assert_true(d <= 1e-6);
		}
}

/* Residual, tied weights, and an auxiliary loss. */
static void test_graph_strategies(void **state)
{
	(void)state;
	equivalence("--aux 0.5", "graph");
}

/* Dropout's masks follow the sample: every strategy and world size agrees
 * with one process, with and without activation checkpointing. */
static void test_dropout_everywhere(void **state)
{
	(void)state;
	graph_run("ddp", 1, "--dropout 0.3", tmp("drop-ref.bin"), NULL);
	graph_run("zero3", 3, "--dropout 0.3 --checkpoint", tmp("drop-z3.bin"), NULL);
	graph_run("ddp", 2, "--dropout 0.3 --checkpoint", tmp("drop-ddp.bin"), NULL);
	graph_run("ddp", 1, "--dropout 0.3 --checkpoint", tmp("drop-ck.bin"), NULL);
	graph_run("ddp", 1, "--dropout 0", tmp("nodrop.bin"), NULL);
	double z3 = rel(tmp("drop-z3.bin"), tmp("drop-ref.bin"));
	double ddp = rel(tmp("drop-ddp.bin"), tmp("drop-ref.bin"));
	double ck = rel(tmp("drop-ck.bin"), tmp("drop-ref.bin"));
	double off = rel(tmp("nodrop.bin"), tmp("drop-ref.bin"));
	printf("  dropout: zero3 x3 %.2g, ddp x2 %.2g, recompute %.2g; without dropout %.2g\n",
	       z3, ddp, ck, off);
	assert_true(z3 <= 1e-6 && ddp <= 1e-6);
	assert_true(ck == 0); /* the same masks, the same arithmetic */
	assert_true(off > 1e-3); /* and dropout did something */
}

/* A run stopped at step 5 and resumed trains as one that never stopped. */
static void test_dropout_restart(void **state)
{
	(void)state;
	char dir[512];
	snprintf(dir, sizeof dir, "%s/ck", tmpdir);
	graph_run("zero2", 2, "--dropout 0.3", tmp("whole.bin"), NULL);
	run r;
	start(&r, 2);
	args(&r, "--strategy", "zero2", "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.2",
	     "--batch-size", "48", "--max-steps", "12", "--checkpoint-dir", dir, "--stop-at-step",
	     "5", "--reduce-bucket-size", "100", "--allgather-bucket-size", "200",
	     "--param-persistence-threshold", "50", NULL);
	free(finish_with(&r, 0, GRAPH, "--dropout 0.3"));
	start(&r, 2);
	args(&r, "--strategy", "zero2", "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.2",
	     "--batch-size", "48", "--max-steps", "12", "--checkpoint-dir", dir, "--resume", dir,
	     "--save-params", tmp("resumed.bin"), "--reduce-bucket-size", "100",
	     "--allgather-bucket-size", "200", "--param-persistence-threshold", "50", NULL);
	free(finish_with(&r, 0, GRAPH, "--dropout 0.3"));
	double d = rel(tmp("resumed.bin"), tmp("whole.bin"));
	printf("  dropout after a restart: relative difference %.2g\n", d);
	assert_true(d == 0);
}

/* In evaluation dropout is the identity: d equals s. */
static void test_dropout_eval(void **state)
{
	(void)state;
	char margs[600];
	snprintf(margs, sizeof margs, "--dropout 0.5 --save-mask %s", tmp("eval.bin"));
	graph_run("zero3", 2, margs, tmp("p.bin"), NULL);
	size_t n;
	float *v = load_params(tmp("eval.bin"), &n); /* d then s */
	assert_int_equal(n, 2 * 4 * 4 * 8);
	assert_memory_equal(v, v + n / 2, n / 2 * 4);
	free(v);
}


/* Solves the 4x4 normal equations (x with a 1 appended) in double. */
static void lstsq(double sol[4])
{
	double A[4][5] = {{0}};
	for (size_t i = 0; i < 256; i++) {
		float x[3], y;
		regression_sample(i, x, &y);
		double r[4] = {x[0], x[1], x[2], 1};
		for (int a = 0; a < 4; a++) {
			for (int c = 0; c < 4; c++)
				A[a][c] += r[a] * r[c];
			A[a][4] += r[a] * y;
		}
	}
	for (int c = 0; c < 4; c++) { /* Gauss-Jordan, partial pivoting */
		int p = c;
		for (int a = c + 1; a < 4; a++)
			if (fabs(A[a][c]) > fabs(A[p][c]))
				p = a;
		for (int k = 0; k < 5; k++) {
			double t = A[c][k];
			A[c][k] = A[p][k];
			A[p][k] = t;
		}
		for (int a = 0; a < 4; a++) {
			if (a == c)
				continue;
			double f = A[a][c] / A[c][c];
			for (int k = 0; k < 5; k++)
				A[a][k] -= f * A[c][k];
		}
	}
	for (int a = 0; a < 4; a++)
		sol[a] = A[a][4] / A[a][a];
}

static void test_regression(void **state)
{
	(void)state;
	run r;
	start(&r, 2);
	args(&r, "--strategy", "ddp", "--optimizer", "sgd", "--momentum", "0", "--lr", "0.5",
	     "--batch-size", "256", "--epochs", "600", "--save-params", tmp("reg.bin"), NULL);
	free(finish_with(&r, 0, REGRESSION, NULL));
	size_t n;
	float *w = load_params(tmp("reg.bin"), &n); /* fc.weight [1, 3], fc.bias [1] */
	assert_int_equal(n, 4);
	double sol[4];
	lstsq(sol);
	for (int k = 0; k < 4; k++) {
		printf("  regression: w%d %.6f, least squares %.6f\n", k, w[k], sol[k]);
		assert_true(fabs(w[k] - sol[k]) <= 1e-4);
	}
	free(w);
}

/* --max-steps 10 with --epochs 1 (the default) on a one-step epoch runs
 * 10 steps over 10 epochs, as the HF Trainer does, not 1 in silence; the
 * same as --epochs 10. --max-steps 0 trains nothing: the parameters saved
 * are the initial ones (those of one step at learning rate 0). */
static void test_max_steps_wins(void **state)
{
	(void)state;
	run r;
	start(&r, 2);
	args(&r, "--strategy", "ddp", "--batch-size", "256", "--epochs", "1", "--max-steps", "10",
	     "--log-every", "1", "--save-params", tmp("ms.bin"), NULL);
	char *out = finish_with(&r, 0, REGRESSION, NULL);
	assert_non_null(strstr(out, "epoch 10/10 step 10/10 "));
	assert_non_null(strstr(out, "trained 10 steps"));
	free(out);
	start(&r, 2);
	args(&r, "--strategy", "ddp", "--batch-size", "256", "--epochs", "10", "--save-params",
	     tmp("ep.bin"), NULL);
	free(finish_with(&r, 0, REGRESSION, NULL));
	size_t n1, n2;
	float *a = load_params(tmp("ms.bin"), &n1), *b = load_params(tmp("ep.bin"), &n2);
	assert_int_equal(n1, n2);
	assert_memory_equal(a, b, n1 * sizeof *a);
	free(a);
	free(b);

	start(&r, 2);
	args(&r, "--strategy", "ddp", "--batch-size", "256", "--max-steps", "0", "--save-params",
	     tmp("zero.bin"), NULL);
	out = finish_with(&r, 0, REGRESSION, NULL);
	assert_non_null(strstr(out, "trained 0 steps on 2 workers (ddp): --max-steps 0, the initial model;"));
	assert_null(strstr(out, "final loss")); /* it said 0.0000, as if measured */
	free(out);
	/* --max-steps 0 needs no training batch: a global batch larger than
	 * the training split (256) is fine (it was refused as "smaller than
	 * one global batch") */
	start(&r, 2);
	args(&r, "--strategy", "ddp", "--batch-size", "512", "--max-steps", "0", NULL);
	out = finish_with(&r, 0, REGRESSION, NULL);
	assert_non_null(strstr(out, "trained 0 steps on 2 workers"));
	free(out);
	start(&r, 2);
	args(&r, "--strategy", "ddp", "--batch-size", "256", "--max-steps", "1", "--optimizer", "sgd",
	     "--momentum", "0", "--lr", "0", "--save-params", tmp("lr0.bin"), NULL);
	free(finish_with(&r, 0, REGRESSION, NULL));
	a = load_params(tmp("zero.bin"), &n1);
	b = load_params(tmp("lr0.bin"), &n2);
	assert_int_equal(n1, n2);
	assert_memory_equal(a, b, n1 * sizeof *a);
	free(a);
	free(b);
}

static int setup(void **state)
{
	(void)state;
	snprintf(tmpdir, sizeof tmpdir, "/tmp/hpu-test-graph-%d", (int)getpid());
	return mkdir(tmpdir, 0700);
}

static int teardown(void **state)
{
	(void)state;
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
	return system(cmd) != 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_graph_strategies),
		cmocka_unit_test(test_dropout_everywhere),
		cmocka_unit_test(test_dropout_restart),
		cmocka_unit_test(test_dropout_eval),
		cmocka_unit_test(test_regression),
		cmocka_unit_test(test_max_steps_wins),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
