/* Unit tests for the layer library's dense, convolution, pooling,
 * elementwise and loss layers (worker/layers/dense.c, conv.c, eltwise.c,
 * loss.c), driven in-process by layer_harness.
 *
 * Per layer: forward values on a hand-checkable case, central
 * finite-difference checks of the input and parameter gradients (which
 * also check that backward overwrites din and accumulates into the
 * parameter gradients), declaration errors (NULL and a message naming the
 * layer), and the PyTorch references of tests/fixtures/refs/a_*.ref
 * (tests/fixtures/torch_layers_a.py) to 1e-5 relative. The harness's
 * checker is itself shown to fail wrong gradients.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>

#include "tests/unit/layer_harness.h"
#include "worker/hpu/model.h" /* hpu_run, hpu__run_live */
#include "tests/unit/layer_testlib.h"

/* ---- helpers ---- */

static void close_to(const float *got, const float *want, size_t n, double tol)
{
	double d = lh_maxrel(got, want, n, 1e-6);
	if (!(d <= tol))
		for (size_t i = 0; i < n; i++)
			printf("  [%zu] got %.7g want %.7g\n", i, got[i], want[i]);
	assert_true(d <= tol);
}

/* ---- the harness's checker fails wrong gradients ---- */

/* y = w * x with one parameter w [1]; `user` points at a mode: 0 right,
 * 1 din off by 5%, 2 din accumulated instead of overwritten, 3 the
 * parameter gradient overwritten instead of accumulated, 4 the parameter
 * gradient off by 5%. */
static int scale_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	(void)c;
	float w = hpu_param(l, 0)[0];
	for (size_t i = 0; i < hpu_numel(&in[0]); i++)
		hpu_f32(&out[0])[i] = w * hpu_f32(&in[0])[i];
	return 0;
}

static int scale_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			  const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	int mode = *(int *)hpu_layer_user(l);
	float w = hpu_param(l, 0)[0], *dx = hpu_f32(&din[0]);
	double dw = 0;
	(void)c, (void)out;
	for (size_t i = 0; i < hpu_numel(&in[0]); i++) {
		float d = hpu_f32(&dout[0])[i];
		dw += (double)d * hpu_f32(&in[0])[i];
		float g = d * w * (mode == 1 ? 1.05f : 1.0f);
		dx[i] = mode == 2 ? dx[i] + g : g;
	}
	if (mode == 4)
		dw *= 1.05;
	if (mode == 3)
		hpu_grad(l, 0)[0] = (float)dw;
	else
		hpu_grad(l, 0)[0] += (float)dw;
	return 0;
}

static void test_gradcheck_catches_wrong_gradients(void **state)
{
	(void)state;
	static const hpu_layer_ops ops = {.forward = scale_forward, .backward = scale_backward};
	int64_t shape = 6;
	for (int mode = 0; mode <= 4; mode++) {
		lh_harness *h = lt_harness_x(3, 1, &shape);
		hpu_layer *l = hpu_layer_add(lh_builder(h), "scale", "x", &ops, &mode);
		assert_non_null(l);
		assert_true(hpu_layer_output(l, "y", HPU_F32, 1, &shape) >= 0);
		int64_t one = 1;
		assert_true(hpu_param_add(l, "w", 1, &one, HPU_INIT(CONSTANT, 1.5f)) >= 0);
		assert_int_equal(lh_alloc(h, 1), 0);
		char msg[512];
		int rc = lh_gradcheck(h, l, 3, NULL, NULL, msg, sizeof msg);
		printf("  mode %d: %s\n", mode, rc ? msg : "agrees");
		if (mode == 0)
			assert_int_equal(rc, 0);
		else
			assert_int_not_equal(rc, 0);
		lh_free(&h);
	}
}

/* The dataset's fetch (the runtime's loader would call it) gives the
 * field values handed to lh_dataset. */
static void test_harness_dataset(void **state)
{
	(void)state;
	lh_harness *h = lh_new(2);
	hpu_field f[2] = {{.name = "x", .dtype = HPU_F32, .ndim = 1, .shape = {2}},
			  {.name = "y", .dtype = HPU_I32, .ndim = 0}};
	float x[6] = {1, 2, 3, 4, 5, 6};
	int32_t y[3] = {7, 8, 9};
	const void *data[2] = {x, y};
	assert_int_equal(lh_dataset(h, 2, f, data, 3), HPU_OK);
	float gx[2];
	int32_t gy;
	void *out[2] = {gx, &gy};
	assert_int_equal(lh_fetch(h, 2, out), 0);
	assert_true(gx[0] == 5 && gx[1] == 6 && gy == 9);
	assert_int_not_equal(lh_fetch(h, 3, out), 0);
	lh_free(&h);
	assert_null(h);
}

/* ---- linear ---- */

static void test_linear_forward(void **state)
{
	(void)state;
	int64_t shape[2] = {2, 2}; /* two rows of 2 a sample */
	lh_harness *h = lt_harness_x(2, 2, shape);
	hpu_layer *l = hpu_linear(lh_builder(h), "fc", "x", "y", (hpu_linear_opts){.out = 3, .bias = true});
	assert_non_null(l);
	hpu_tensor y = lh_tensor(h, "y", 0, NULL);
	assert_int_equal(y.ndim, 2);
	assert_true(y.shape[0] == 2 && y.shape[1] == 3);
	assert_int_equal(lh_alloc(h, 7), 0);
	const float w[6] = {1, 2, 3, 4, 5, 6}, bias[3] = {0.5f, -1, 0};
	memcpy(hpu_param(l, 0), w, sizeof w);
	memcpy(hpu_param(l, 1), bias, sizeof bias);
	float x[8] = {1, 1, 0, 1, 2, 0, -1, 1}, out[12];
	const float want[12] = {3.5f, 6, 11, 2.5f, 3, 6, 2.5f, 5, 10, 1.5f, 0, 1};
	hpu_ctx c = lh_ctx(h, l, 1, 0, 2);
	void *in[1] = {x}, *o[1] = {out};
	assert_int_equal(lh_forward(h, l, &c, in, o), 0);
	close_to(out, want, 12, 1e-6);
	lh_free(&h);
}

static int noop_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	(void)l, (void)c, (void)in, (void)out;
	return 0;
}

static const hpu_layer_ops noop_ops = {.forward = noop_forward};

/* A call in the wrong phase is refused naming the call and the phase
 * (issue 37): hpu_param and the like during setup, declarations after
 * it; an index out of range names the call and the index. */
static void test_wrong_phase(void **state)
{
	(void)state;
	int64_t shape = 4, wshape[2] = {2, 4};
	lh_harness *h = lt_harness_x(1, 1, &shape);
	hpu_builder *b = lh_builder(h);
	hpu_layer *l = hpu_layer_add(b, "custom", "x", &noop_ops, NULL);
	assert_non_null(l);
	assert_int_equal(hpu_layer_output(l, "y", HPU_F32, 1, wshape), 0);
	assert_int_equal(hpu_param_add(l, "weight", 2, wshape, HPU_INIT(ZEROS)), 0);
	/* during setup */
	const char *calls[] = {"hpu_param", "hpu_grad", "hpu_buffer", "hpu_saved", "hpu_scratch"};
	for (int i = 0; i < 5; i++) {
		lh_clear_error(h);
		void *p = i == 0 ? (void *)hpu_param(l, 0) : i == 1 ? (void *)hpu_grad(l, 0)
			: i == 2 ? (void *)hpu_buffer(l, 0) : i == 3 ? hpu_saved(l) : hpu_scratch(l);
		char want[128];
		snprintf(want, sizeof want, "layer custom: %s() called during setup, but", calls[i]);
		printf("  %s\n", lh_error(h));
		assert_null(p);
		assert_non_null(strstr(lh_error(h), want));
	}
	lh_clear_error(h);
	assert_int_equal(lh_alloc(h, 1), 0);
	/* after setup: declarations are refused, the layer's error says why */
	assert_non_null(hpu_param(l, 0));
	assert_int_equal(hpu_param_add(l, "late", 2, wshape, HPU_INIT(ZEROS)), HPU_EINVAL);
	printf("  %s\n", l->err);
	assert_non_null(strstr(l->err, "hpu_param_add() called after setup (while the model runs), "
				       "but declarations belong in setup"));
	assert_int_equal(b->nparams, 1);
	lh_clear_error(h);
	assert_null(hpu_layer_add(b, "late", "x", &noop_ops, NULL));
	assert_non_null(strstr(lh_error(h), "hpu_layer_add() called after setup"));
	lh_clear_error(h);
	assert_int_equal(hpu_loss_add(b, "y", 1.0f), HPU_EINVAL);
	assert_non_null(strstr(lh_error(h), "hpu_loss_add() called after setup"));
	/* an index out of range */
	l->err[0] = 0;
	assert_null(hpu_param(l, 1));
	printf("  %s\n", l->err);
	assert_string_equal(l->err, "hpu_param(): layer custom has 1 parameters, asked for index 1");
	lh_free(&h);
}

/* What a custom initializer is told: name, fans. */
static int record_fans(void *user, const hpu_init_info *info, float *w, hpu_init_rng *rng)
{
	(void)rng;
	size_t *fans = user;
	fans[0] = info->fan_in;
	fans[1] = info->fan_out;
	for (size_t i = 0; i < info->numel; i++)
		w[i] = 0;
	return 0;
}

/* A bias's fan-in is its layer's weight's, as PyTorch's Linear gives it
 * (issue 37): a fan-in initializer on a 1-D parameter uses the fans of
 * the last parameter of 2 or more dimensions its layer declared before
 * it. */
/* A shape whose element count passes 2^40, or wraps a size_t (to 0 at
 * [2^16]x4), is refused naming the tensor or parameter, the dimension
 * and why: it was accepted as a tensor of a few elements (or of none)
 * and the worker crashed in the first forward or at initialisation. */
static void test_shape_too_large(void **state)
{
	(void)state;
	int64_t shape = 4, wrap[4] = {1 << 16, 1 << 16, 1 << 16, 1 << 16},
		big[2] = {(int64_t)1 << 31, (int64_t)1 << 31}, zero[2] = {3, 0};
	lh_harness *h = lt_harness_x(1, 1, &shape);
	hpu_builder *b = lh_builder(h);
	hpu_layer *l = hpu_layer_add(b, "custom", "x", &noop_ops, NULL);
	assert_non_null(l);
	assert_int_equal(hpu_layer_output(l, "y", HPU_F32, 4, wrap), HPU_EINVAL);
	printf("  %s\n", lh_error(h));
	assert_non_null(strstr(lh_error(h), "tensor y has more than 2^40 elements (dimension 2 is 65536): too large"));
	lh_clear_error(h);
	assert_int_equal(hpu_param_add(l, "w", 2, big, HPU_INIT(ZEROS)), HPU_EINVAL);
	printf("  %s\n", lh_error(h));
	assert_non_null(strstr(lh_error(h), "layer custom: parameter w has more than 2^40 elements (dimension 1 is 2147483648)"));
	lh_clear_error(h);
	assert_int_equal(hpu_param_add(l, "z", 2, zero, HPU_INIT(ZEROS)), HPU_EINVAL);
	assert_non_null(strstr(lh_error(h), "parameter z has dimension 1 of size 0: each must be > 0"));
	lh_clear_error(h);
	assert_int_equal(hpu_param_add(l, "n", 5, wrap, HPU_INIT(ZEROS)), HPU_EINVAL);
	assert_non_null(strstr(lh_error(h), "parameter n needs 1..4 dimensions, not 5"));
	lh_clear_error(h);
	/* a NULL shape is said as one (it said "needs 1..4 dimensions, not 1") */
	assert_int_equal(hpu_param_add(l, "s", 1, NULL, HPU_INIT(ZEROS)), HPU_EINVAL);
	assert_non_null(strstr(lh_error(h), "parameter s has 1 dimension and a NULL shape"));
	lh_free(&h);
}

/* A callback that failed without hpu_error: its code, and no claim of a
 * message (HPU_ERROR's text, "the recorded message says why", was
 * printed beside "without a message"). */
static void test_failure_without_message(void **state)
{
	(void)state;
	int64_t shape = 4;
	lh_harness *h = lt_harness_x(1, 1, &shape);
	char buf[200];
	const char *why = hpu__model_why(lh_builder(h), NULL, HPU_ERROR, buf, sizeof buf);
	assert_string_equal(why, "it returned -1 without a message (hpu_error records one)");
	why = hpu__model_why(lh_builder(h), NULL, HPU_ENOMEM, buf, sizeof buf);
	assert_non_null(strstr(why, "it returned -3 ("));
	assert_non_null(strstr(why, ") without a message (hpu_error records one)"));
	lh_free(&h);
}

/* A metric may not take a name the evaluation's own figures have: a
 * metric "loss" wrote a second "test_loss" key into --metrics' final
 * record (JSON readers kept the metric's) and printed two val_loss. */
static void test_metric_reserved(void **state)
{
	(void)state;
	int64_t shape = 4;
	const char *names[] = {"loss", "samples", "test_loss"};
	for (int i = 0; i < 3; i++) {
		lh_harness *h = lt_harness_x(1, 1, &shape);
		hpu_builder *b = lh_builder(h);
		hpu_layer *l = hpu_layer_add(b, "custom", "x", &noop_ops, NULL);
		assert_non_null(l);
		assert_int_equal(hpu_layer_output(l, "s", HPU_F32, 0, NULL), 0);
		assert_int_equal(hpu_metric_add(b, names[i], "s"), HPU_EINVAL);
		printf("  %s\n", lh_error(h));
		char want[64];
		snprintf(want, sizeof want, "metric: name \"%s\" is reserved", names[i]);
		assert_non_null(strstr(lh_error(h), want));
		lh_clear_error(h);
		assert_int_equal(hpu_metric_add(b, "val", "s"), HPU_OK);
		lh_free(&h);
	}
}

/* hpu_run_* take only the hpu_run of the hook that runs: NULL, or one a
 * model kept after its hook returned, is refused with a line on stderr
 * (each crashed the worker: SIGSEGV). */
static void test_run_handles(void **state)
{
	(void)state;
	lh_harness *h = lh_new(2);
	hpu_run run = {.b = lh_builder(h), .rank = 3, .world = 4, .step = 7};
	hpu__run_live = &run;
	assert_ptr_equal(hpu_run_ctx(&run), &run.ctx);
	hpu__run_live = NULL; /* its hook returned */
	assert_null(hpu_run_ctx(&run));
	assert_null(hpu_run_param(&run, "w", NULL));
	assert_true(isnan(hpu_run_metric(&run, "loss")));
	assert_int_equal(hpu_run_error(&run, "x"), HPU_ERROR);
	assert_null(hpu_run_ctx(NULL));
	assert_null(hpu_run_param(NULL, "w", NULL));
	assert_int_equal(hpu_run_forward(NULL, NULL, 1, "y", NULL), HPU_EINVAL);
	lh_free(&h);
}

static void test_bias_fan_in(void **state)
{
	(void)state;
	int64_t shape = 4, wshape[2] = {64, 4}, bshape = 64, w2[2] = {3, 5}, b2 = 3;
	lh_harness *h = lt_harness_x(1, 1, &shape);
	hpu_builder *b = lh_builder(h);
	hpu_layer *l = hpu_layer_add(b, "lin", "x", &noop_ops, NULL);
	assert_non_null(l);
	assert_int_equal(hpu_layer_output(l, "y", HPU_F32, 1, &bshape), 0);
	assert_int_equal(hpu_param_add(l, "weight", 2, wshape, HPU_INIT(FAN_IN_UNIFORM)), 0);
	assert_int_equal(hpu_param_add(l, "bias", 1, &bshape, HPU_INIT(FAN_IN_UNIFORM)), 1);
	size_t fans[2] = {0, 0};
	hpu_layer *l2 = hpu_layer_add(b, "lin2", "y", &noop_ops, NULL);
	assert_non_null(l2);
	assert_int_equal(hpu_layer_output(l2, "z", HPU_F32, 1, &b2), 0);
	assert_int_equal(hpu_param_add(l2, "weight", 2, w2, HPU_INIT(ZEROS)), 0);
	hpu_init custom = {.kind = HPU_INIT_CUSTOM, .fn = record_fans, .user = fans};
	assert_int_equal(hpu_param_add(l2, "bias", 1, &b2, custom), 1);
	assert_int_equal(lh_alloc(h, 7), 0);
	/* U(+-1/sqrt(4)) = U(+-0.5), not U(+-1/sqrt(64)) = U(+-0.125) */
	float big = 0;
	for (int i = 0; i < 64; i++)
		big = fabsf(hpu_param(l, 1)[i]) > big ? fabsf(hpu_param(l, 1)[i]) : big;
	printf("  lin.bias: largest |value| %.4f; lin2.bias fans %zu, %zu\n", big, fans[0], fans[1]);
	assert_true(big > 0.2f && big <= 0.5f);
	assert_int_equal(fans[0], 5);
	assert_int_equal(fans[1], 3);
	lh_free(&h);
}

/* A custom initializer that refuses, saying why with hpu_error on the
 * builder it carries: the failure names the parameter and gives the
 * message (only "the initializer of lin.weight failed" was said; the
 * header promised hpu_error() but the message was dropped). */
static int refuse_init(void *user, const hpu_init_info *info, float *w, hpu_init_rng *rng)
{
	(void)w;
	(void)rng;
	return hpu_error((hpu_builder *)user, "no values for %s of %zu", info->name, info->numel);
}

static void test_custom_init_error(void **state)
{
	(void)state;
	int64_t shape = 4, wshape[2] = {3, 4}, out = 3;
	lh_harness *h = lt_harness_x(1, 1, &shape);
	hpu_builder *b = lh_builder(h);
	hpu_layer *l = hpu_layer_add(b, "lin", "x", &noop_ops, NULL);
	assert_non_null(l);
	assert_int_equal(hpu_layer_output(l, "y", HPU_F32, 1, &out), 0);
	hpu_init custom = {.kind = HPU_INIT_CUSTOM, .fn = refuse_init, .user = b};
	assert_int_equal(hpu_param_add(l, "weight", 2, wshape, custom), 0);
	float w[16]; /* the layer's floats: its one parameter padded to 16 */
	char err[512];
	assert_int_equal(b->layers[0]->plen, 16);
	assert_int_equal(hpu__model_init_layer(b, 0, 1, w, err, sizeof err), -1);
	printf("  %s\n", err);
	assert_string_equal(err, "the initializer of lin.weight failed: no values for lin.weight of 12");
	lh_free(&h);
}

static void test_linear_init(void **state)
{
	(void)state;
	int64_t shape = 25;
	lh_harness *h = lt_harness_x(1, 1, &shape);
	hpu_builder *b = lh_builder(h);
	hpu_layer *l = hpu_linear(b, "fc", "x", "y", (hpu_linear_opts){.out = 40, .bias = true});
	assert_non_null(l);
	assert_int_equal(lh_alloc(h, 3), 0);
	int w = hpu__model_param(b, "fc.weight"), bi = hpu__model_param(b, "fc.bias");
	assert_true(w >= 0 && bi >= 0);
	assert_int_equal(b->params[w].init.kind, HPU_INIT_FAN_IN_UNIFORM);
	assert_int_equal(b->params[bi].init.kind, HPU_INIT_UNIFORM);
	assert_float_equal(b->params[bi].init.b, 0.2f, 1e-7);
	assert_float_equal(b->params[bi].init.a, -0.2f, 1e-7);
	/* values inside U(+-1/sqrt(25)) and spread over it */
	float lo = 1, hi = -1;
	for (int i = 0; i < 40 * 25; i++) {
		float v = hpu_param(l, 0)[i];
		lo = v < lo ? v : lo;
		hi = v > hi ? v : hi;
	}
	assert_true(lo >= -0.2f && hi <= 0.2f && lo < -0.18f && hi > 0.18f);
	for (int i = 0; i < 40; i++)
		assert_true(fabsf(hpu_param(l, 1)[i]) <= 0.2f);
	lh_free(&h);
}

static void test_linear_gradients(void **state)
{
	(void)state;
	int64_t shape[3] = {2, 3, 5}; /* leading dimensions are rows */
	for (int bias = 0; bias <= 1; bias++) {
		lh_harness *h = lt_harness_x(3, 3, shape);
		hpu_layer *l = hpu_linear(lh_builder(h), "fc", "x", "y", (hpu_linear_opts){.out = 4, .bias = bias});
		assert_non_null(l);
		assert_int_equal(l->npidx, 1 + bias);
		assert_int_equal(lh_alloc(h, 11), 0);
		lt_gradcheck_ok(h, l, 3, NULL, NULL);
		lh_free(&h);
	}
}

static void test_linear_refused(void **state)
{
	(void)state;
	hpu_field f[2] = {{.name = "x", .dtype = HPU_F32, .ndim = 1, .shape = {4}},
			  {.name = "ids", .dtype = HPU_I32, .ndim = 1, .shape = {4}}};
	lh_harness *h = lt_harness(2, 2, f);
	hpu_builder *b = lh_builder(h);
	lt_refused(h, hpu_linear(b, "fc1", "nope", "y", (hpu_linear_opts){.out = 3, .bias = true}), "fc1", "nope");
	lt_refused(h, hpu_linear(b, "fc2", "ids", "y", (hpu_linear_opts){.out = 3, .bias = true}), "fc2", "f32");
	lt_refused(h, hpu_linear(b, "fc3", "x", "y", (hpu_linear_opts){.out = 0, .bias = true}), "fc3", NULL);
	/* the builder refusing the name: the layer's state is freed here */
	lt_refused(h, hpu_linear(b, "fc 4", "x", "y", (hpu_linear_opts){.out = 3, .bias = true}), "fc 4", NULL);
	assert_int_equal(b->nlayers, 0);
	/* ... or its output: the layer is in, its destroy frees the state */
	lt_refused(h, hpu_linear(b, "fc5", "x", "x", (hpu_linear_opts){.out = 3, .bias = true}), "fc5", "twice");
	assert_int_equal(b->nlayers, 1);
	lh_free(&h);
}

/* Sticky builder errors (ABI 3): after the first failure every
 * declaration does nothing, the calls taking a layer accept the NULL a
 * failed one returned, and the first error (its message and code) stays,
 * hpu_error()'s included; queries still answer. */
static void test_sticky_errors(void **state)
{
	(void)state;
	hpu_field f = {.name = "x", .dtype = HPU_F32, .ndim = 1, .shape = {4}};
	lh_harness *h = lt_harness(2, 1, &f);
	hpu_builder *b = lh_builder(h);
	assert_int_equal(hpu_builder_status(b), HPU_OK);
	assert_non_null(hpu_linear(b, "fc1", "x", "h", (hpu_linear_opts){.out = 3}));
	hpu_layer *bad = hpu_layer_add(b, "custom", "nope", &(hpu_layer_ops){.forward = NULL}, NULL);
	assert_null(bad);
	const char *first = "layer custom: needs a forward function";
	printf("  first error: %s\n", lh_error(h));
	assert_string_equal(lh_error(h), first);
	assert_int_equal(hpu_builder_status(b), HPU_EINVAL);
	/* a NULL layer: nothing happens, nothing is recorded */
	assert_int_equal(hpu_layer_output(bad, "y", HPU_F32, 1, (int64_t[]){2}), HPU_EINVAL);
	assert_int_equal(hpu_param_add(bad, "w", 1, (int64_t[]){2}, HPU_INIT(ZEROS)), HPU_EINVAL);
	assert_int_equal(hpu_layer_checkpoint(bad, 1), HPU_EINVAL);
	/* valid declarations after it do nothing; wrong ones record nothing */
	assert_null(hpu_relu(b, "act", "h", "a"));
	assert_null(hpu_linear(b, "fc2", "missing", "z", (hpu_linear_opts){.out = 2}));
	assert_int_not_equal(hpu_loss_add(b, "h", 1.0f), HPU_OK);
	assert_int_equal(hpu_error(b, "a later error %d", 2), HPU_ERROR);
	assert_int_equal(b->nlayers, 1);
	assert_string_equal(lh_error(h), first);
	assert_int_equal(hpu_builder_status(b), HPU_EINVAL);
	hpu_tensor t;
	assert_int_equal(hpu_tensor_info(b, "h", &t), HPU_OK);
	/* cleared (as the tests' lh_clear_error does), declarations run again */
	lh_clear_error(h);
	assert_non_null(hpu_relu(b, "act", "h", "a"));
	assert_int_equal(hpu_builder_status(b), HPU_OK);
	lh_free(&h);
}

/* hpu_error() with no builder (a library constructor's call) says its
 * message on stderr and returns HPU_ERROR: it dereferenced the NULL. */
static void test_error_without_builder(void **state)
{
	(void)state;
	FILE *tmp = tmpfile();
	assert_non_null(tmp);
	fflush(stderr);
	int saved = dup(2);
	assert_true(saved >= 0 && dup2(fileno(tmp), 2) == 2);
	int rc = hpu_error(NULL, "no data at %s", "/nowhere");
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	assert_int_equal(rc, HPU_ERROR);
	char got[200] = {0};
	rewind(tmp);
	assert_non_null(fgets(got, sizeof got, tmp));
	fclose(tmp);
	assert_string_equal(got, "error: hpu_error() without a builder: no data at /nowhere\n");
	assert_int_equal(hpu_builder_status(NULL), HPU_EINVAL);
}

static void test_linear_tied(void **state)
{
	(void)state;
	hpu_field f[2] = {{.name = "x", .dtype = HPU_F32, .ndim = 2, .shape = {2, 3}},
			  {.name = "z", .dtype = HPU_F32, .ndim = 1, .shape = {4}}};
	lh_harness *h = lt_harness(2, 2, f);
	hpu_builder *b = lh_builder(h);
	hpu_layer *enc = hpu_linear(b, "enc", "x", "e", (hpu_linear_opts){.out = 5});
	assert_non_null(enc);
	lt_refused(h, hpu_linear_tied(b, "bad", "z", "d", (hpu_linear_tied_opts){.weight = "enc.weight", .bias = true}), "bad", "enc.weight");
	lt_refused(h, hpu_linear_tied(b, "bad2", "x", "d", (hpu_linear_tied_opts){.weight = "enc.nope", .bias = true}), "bad2", "enc.nope");
	lt_refused(h, hpu_linear_tied(b, "bad3", "x", "d", (hpu_linear_tied_opts){.weight = NULL, .bias = true}), "bad3",
		   "needs the tied weight's name (opts.weight");
	hpu_layer *dec = hpu_linear_tied(b, "dec", "x", "d", (hpu_linear_tied_opts){.weight = "enc.weight", .bias = true});
	assert_non_null(dec);
	hpu_tensor d = lh_tensor(h, "d", 0, NULL);
	assert_true(d.ndim == 2 && d.shape[0] == 2 && d.shape[1] == 5);
	assert_int_equal(lh_alloc(h, 5), 0);
	/* one tensor, one gradient: the owner's */
	assert_ptr_equal(hpu_param(dec, 0), hpu_param(enc, 0));
	assert_ptr_equal(hpu_grad(dec, 0), hpu_grad(enc, 0));
	assert_int_equal(b->params[hpu__model_param(b, "enc.weight")].users, 2);
	assert_true(hpu__model_param(b, "dec.bias") >= 0);
	assert_int_equal(hpu__model_param(b, "dec.weight"), -1);
	lt_gradcheck_ok(h, dec, 2, NULL, NULL);
	/* the forward reads the owner's values */
	memset(hpu_param(enc, 0), 0, 15 * sizeof(float));
	memset(hpu_param(dec, 1), 0, 5 * sizeof(float));
	hpu_param(enc, 0)[3 * 4 + 2] = 2; /* W[4][2] */
	float x[6] = {1, 2, 3, 4, 5, 6}, y[10];
	hpu_ctx c = lh_ctx(h, dec, 1, 0, 1);
	void *in[1] = {x}, *out[1] = {y};
	assert_int_equal(lh_forward(h, dec, &c, in, out), 0);
	const float want[10] = {0, 0, 0, 0, 6, 0, 0, 0, 0, 12};
	close_to(y, want, 10, 0);
	lh_free(&h);
}

/* ---- convolution and pooling ---- */

static void test_conv2d_forward(void **state)
{
	(void)state;
	int64_t shape[3] = {1, 3, 3};
	lh_harness *h = lt_harness_x(1, 3, shape);
	hpu_layer *l = hpu_conv2d(lh_builder(h), "conv", "x", "y", (hpu_conv2d_opts){.out = 2, .kernel = 2, .stride = 1, .pad = 0, .bias = true});
	assert_non_null(l);
	hpu_tensor y = lh_tensor(h, "y", 0, NULL);
	assert_true(y.ndim == 3 && y.shape[0] == 2 && y.shape[1] == 2 && y.shape[2] == 2);
	assert_int_equal(lh_alloc(h, 1), 0);
	const float w[8] = {1, 1, 1, 1, 1, 0, 0, -1}, bias[2] = {0.5f, 0};
	memcpy(hpu_param(l, 0), w, sizeof w);
	memcpy(hpu_param(l, 1), bias, sizeof bias);
	float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, out[8];
	/* channel 0: window sums + 0.5; channel 1: top-left - bottom-right */
	const float want[8] = {12.5f, 16.5f, 24.5f, 28.5f, -4, -4, -4, -4};
	hpu_ctx c = lh_ctx(h, l, 0, 0, 1);
	void *in[1] = {x}, *o[1] = {out};
	assert_int_equal(lh_forward(h, l, &c, in, o), 0);
	close_to(out, want, 8, 1e-6);
	lh_free(&h);
}

static void test_conv2d_gradients(void **state)
{
	(void)state;
	int64_t shape[3] = {3, 6, 5};
	for (int bias = 0; bias <= 1; bias++) {
		lh_harness *h = lt_harness_x(2, 3, shape);
		hpu_layer *l = hpu_conv2d(lh_builder(h), "conv", "x", "y", (hpu_conv2d_opts){.out = 4, .kernel = 3, .stride = 2, .pad = 1, .bias = bias});
		assert_non_null(l);
		hpu_tensor y = lh_tensor(h, "y", 0, NULL);
		assert_true(y.shape[0] == 4 && y.shape[1] == 3 && y.shape[2] == 3);
		assert_int_equal(lh_alloc(h, 2), 0);
		lt_gradcheck_ok(h, l, 2, NULL, NULL);
		lh_free(&h);
	}
}

static void test_conv_pool_refused(void **state)
{
	(void)state;
	hpu_field f[2] = {{.name = "x", .dtype = HPU_F32, .ndim = 3, .shape = {2, 4, 4}},
			  {.name = "v", .dtype = HPU_F32, .ndim = 2, .shape = {4, 4}}};
	lh_harness *h = lt_harness(1, 2, f);
	hpu_builder *b = lh_builder(h);
	lt_refused(h, hpu_conv2d(b, "c1", "v", "y", (hpu_conv2d_opts){.out = 2, .kernel = 3, .stride = 1, .pad = 0, .bias = true}), "c1", "[C, H, W]");
	lt_refused(h, hpu_conv2d(b, "c2", "x", "y", (hpu_conv2d_opts){.out = 2, .kernel = 5, .stride = 1, .pad = 0, .bias = true}), "c2", NULL);
	lt_refused(h, hpu_conv2d(b, "c3", "x", "y", (hpu_conv2d_opts){.out = 2, .kernel = 3, .stride = -1, .pad = 0, .bias = true}), "c3", NULL);
	lt_refused(h, hpu_conv2d(b, "c4", "x", "y", (hpu_conv2d_opts){.out = 0, .kernel = 3, .stride = 1, .pad = 0, .bias = true}), "c4", NULL);
	lt_refused(h, hpu_conv2d(b, "c5", "nope", "y", (hpu_conv2d_opts){.out = 2, .kernel = 3, .stride = 1, .pad = 0, .bias = true}), "c5", "nope");
	lt_refused(h, hpu_maxpool2d(b, "p1", "v", "y", (hpu_pool2d_opts){.kernel = 2, .stride = 2}), "p1", NULL);
	lt_refused(h, hpu_maxpool2d(b, "p2", "x", "y", (hpu_pool2d_opts){.kernel = 5, .stride = 1}), "p2", NULL);
	lt_refused(h, hpu_avgpool2d(b, "p3", "x", "y", (hpu_pool2d_opts){.kernel = 2, .stride = -1}), "p3", NULL);
	lt_refused(h, hpu_avgpool2d(b, "p4", "nope", "y", (hpu_pool2d_opts){.kernel = 2, .stride = 2}), "p4", "nope");
	lt_refused(h, hpu_flatten(b, "f1", "nope", "y"), "f1", "nope");
	assert_int_equal(b->nlayers, 0);
	lh_free(&h);
}

/* Distinct values 0.1 apart in a shuffled order: no two in a window
 * within the checker's step of each other. */
static void spaced(float *x, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		x[i] = 0.1f * (float)i - 0.05f * (float)n;
	lt_shuffle(x, n, seed);
}

static void test_maxpool(void **state)
{
	(void)state;
	int64_t shape[3] = {1, 4, 4};
	lh_harness *h = lt_harness_x(2, 3, shape);
	hpu_layer *l = hpu_maxpool2d(lh_builder(h), "pool", "x", "y", (hpu_pool2d_opts){.kernel = 2, .stride = 2});
	assert_non_null(l);
	assert_int_equal(l->saved_ps, 4); /* one index per output */
	assert_int_equal(lh_alloc(h, 1), 0);
	float x[16] = {1, 5, 2, 0, 3, 4, 8, 1, 0, 0, -1, -2, 9, 0, -3, -4}, out[4], dx[16];
	const float want[4] = {5, 8, 9, -1};
	hpu_ctx c = lh_ctx(h, l, 1, 0, 1);
	void *in[1] = {x}, *o[1] = {out};
	assert_int_equal(lh_forward(h, l, &c, in, o), 0);
	close_to(out, want, 4, 0);
	float dy[4] = {1, 2, 3, 4};
	void *dout[1] = {dy}, *din[1] = {dx};
	assert_int_equal(lh_backward(h, l, &c, in, o, dout, din), 0);
	const float wantdx[16] = {0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 4, 0, 3, 0, 0, 0};
	close_to(dx, wantdx, 16, 0);
	lh_free(&h);

	int64_t big[3] = {2, 7, 5};
	h = lt_harness_x(2, 3, big);
	l = hpu_maxpool2d(lh_builder(h), "pool", "x", "y", (hpu_pool2d_opts){.kernel = 3, .stride = 2});
	assert_non_null(l);
	assert_int_equal(lh_alloc(h, 1), 0);
	float xs[2 * 70];
	spaced(xs, 140, 3);
	void *given[1] = {xs};
	lt_gradcheck_ok(h, l, 2, given, &(lh_check_opts){.eps = 1e-3});
	lh_free(&h);
}

static void test_avgpool(void **state)
{
	(void)state;
	int64_t shape[3] = {1, 3, 3};
	lh_harness *h = lt_harness_x(1, 3, shape);
	hpu_layer *l = hpu_avgpool2d(lh_builder(h), "pool", "x", "y", (hpu_pool2d_opts){.kernel = 2, .stride = 1});
	assert_non_null(l);
	hpu_tensor y = lh_tensor(h, "y", 0, NULL);
	assert_true(y.shape[0] == 1 && y.shape[1] == 2 && y.shape[2] == 2);
	assert_int_equal(lh_alloc(h, 1), 0);
	float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, out[4];
	const float want[4] = {3, 4, 6, 7};
	hpu_ctx c = lh_ctx(h, l, 1, 0, 1);
	void *in[1] = {x}, *o[1] = {out};
	assert_int_equal(lh_forward(h, l, &c, in, o), 0);
	close_to(out, want, 4, 1e-6);
	lh_free(&h);

	int64_t big[3] = {3, 7, 6};
	h = lt_harness_x(2, 3, big);
	l = hpu_avgpool2d(lh_builder(h), "pool", "x", "y", (hpu_pool2d_opts){.kernel = 3, .stride = 2});
	assert_non_null(l);
	assert_int_equal(lh_alloc(h, 1), 0);
	lt_gradcheck_ok(h, l, 2, NULL, NULL);
	lh_free(&h);
}

static void test_flatten(void **state)
{
	(void)state;
	int64_t shape[3] = {2, 2, 3};
	lh_harness *h = lt_harness_x(2, 3, shape);
	hpu_layer *l = hpu_flatten(lh_builder(h), "flat", "x", "y");
	assert_non_null(l);
	hpu_tensor y = lh_tensor(h, "y", 0, NULL);
	assert_true(y.ndim == 1 && y.shape[0] == 12);
	assert_int_equal(lh_alloc(h, 1), 0);
	float x[24], out[24];
	for (int i = 0; i < 24; i++)
		x[i] = (float)i;
	hpu_ctx c = lh_ctx(h, l, 1, 0, 2);
	void *in[1] = {x}, *o[1] = {out};
	assert_int_equal(lh_forward(h, l, &c, in, o), 0);
	close_to(out, x, 24, 0);
	lt_gradcheck_ok(h, l, 2, NULL, NULL);
	lh_free(&h);
}

/* ---- elementwise ---- */

static void test_relu(void **state)
{
	(void)state;
	int64_t shape = 6;
	lh_harness *h = lt_harness_x(3, 1, &shape);
	hpu_layer *l = hpu_relu(lh_builder(h), "act", "x", "y");
	assert_non_null(l);
	assert_int_equal(lh_alloc(h, 1), 0);
	float x[6] = {-2, -0.5f, 0.25f, 1, 3, -1}, out[6];
	const float want[6] = {0, 0, 0.25f, 1, 3, 0};
	hpu_ctx c = lh_ctx(h, l, 1, 0, 1);
	void *in[1] = {x}, *o[1] = {out};
	assert_int_equal(lh_forward(h, l, &c, in, o), 0);
	close_to(out, want, 6, 0);
	/* inputs away from the kink at 0 */
	float xs[18];
	uint64_t s = 5;
	lh_fill(xs, 18, 0.1f, 1, &s);
	for (int i = 0; i < 18; i += 2)
		xs[i] = -xs[i];
	void *given[1] = {xs};
	lt_gradcheck_ok(h, l, 3, given, NULL);
	lh_free(&h);
}

static void test_gelu_tanh_gradients(void **state)
{
	(void)state;
	int64_t shape[2] = {3, 4};
	lh_harness *h = lt_harness_x(2, 2, shape);
	hpu_layer *g = hpu_gelu(lh_builder(h), "gelu", "x", "g");
	hpu_layer *t = hpu_tanh(lh_builder(h), "tanh", "x", "t");
	assert_non_null(g);
	assert_non_null(t);
	assert_int_equal(lh_alloc(h, 1), 0);
	lh_check_opts o = {.lo = -3, .hi = 3};
	lt_gradcheck_ok(h, g, 2, NULL, &o);
	lt_gradcheck_ok(h, t, 2, NULL, &o);
	/* gelu(0) = 0, gelu(x) -> x for large x; tanh(1) */
	float x[12] = {0, 10, -10, 1}, out[12];
	hpu_ctx c = lh_ctx(h, g, 0, 0, 1);
	void *in[1] = {x}, *o1[1] = {out};
	assert_int_equal(lh_forward(h, g, &c, in, o1), 0);
	assert_float_equal(out[0], 0, 1e-7);
	assert_float_equal(out[1], 10, 1e-5);
	assert_float_equal(out[2], 0, 1e-5);
	assert_float_equal(out[3], 0.8411920f, 1e-6); /* torch, approximate="tanh" */
	c = lh_ctx(h, t, 0, 0, 1);
	assert_int_equal(lh_forward(h, t, &c, in, o1), 0);
	assert_float_equal(out[3], tanhf(1), 1e-6);
	lh_free(&h);
}

static void test_eltwise_refused(void **state)
{
	(void)state;
	hpu_field f[2] = {{.name = "x", .dtype = HPU_F32, .ndim = 1, .shape = {4}},
			  {.name = "ids", .dtype = HPU_I32, .ndim = 1, .shape = {4}}};
	lh_harness *h = lt_harness(1, 2, f);
	hpu_builder *b = lh_builder(h);
	lt_refused(h, hpu_relu(b, "r1", "ids", "y"), "r1", "f32");
	lt_refused(h, hpu_gelu(b, "g1", "nope", "y"), "g1", "nope");
	lt_refused(h, hpu_tanh(b, "t1", "ids", "y"), "t1", "f32");
	lt_refused(h, hpu_softmax(b, "s1", "ids", "y"), "s1", "f32");
	lt_refused(h, hpu_dropout(b, "d1", "x", "y", (hpu_dropout_opts){.p = 1.0f}), "d1", NULL);
	lt_refused(h, hpu_dropout(b, "d2", "x", "y", (hpu_dropout_opts){.p = -0.1f}), "d2", NULL);
	lt_refused(h, hpu_dropout(b, "d3", "x", "y", (hpu_dropout_opts){.p = NAN}), "d3", NULL);
	lt_refused(h, hpu_dropout(b, "d4", "ids", "y", (hpu_dropout_opts){.p = 0.5f}), "d4", "f32");
	assert_int_equal(b->nlayers, 0);
	lh_free(&h);
}

/* ---- what a backward reads ---- */

static int reads_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	(void)l, (void)c, (void)in, (void)out;
	return 0;
}

/* hpu_layer_backward_reads: a custom layer reads everything until it
 * says otherwise (and writes over no input: hpu_layer_backward_in_place); a bit past its inputs, or past HPU_MAX_IO outputs, is
 * refused naming it. The library's relu reads its output, linear its
 * input (lh_backward hands backward NULL for the rest, as the runtime
 * does: every gradient check in these tests checks the declarations). */
static void test_backward_reads(void **state)
{
	(void)state;
	hpu_field f = {.name = "x", .dtype = HPU_F32, .ndim = 1, .shape = {4}};
	lh_harness *h = lt_harness(2, 1, &f);
	hpu_builder *b = lh_builder(h);
	hpu_layer *fc = hpu_linear(b, "fc", "x", "y", (hpu_linear_opts){.out = 3});
	hpu_layer *act = hpu_relu(b, "act", "y", "a");
	assert_non_null(fc);
	assert_non_null(act);
	assert_true(fc->reads_in == 1u && fc->reads_out == 0u);
	assert_true(act->reads_in == 0u && act->reads_out == 1u);
	static const hpu_layer_ops ops = {.forward = reads_forward};
	hpu_layer *l = hpu_layer_add(b, "custom", "a", &ops, NULL);
	assert_non_null(l);
	assert_true(l->reads_in == ~0u && l->reads_out == ~0u);
	assert_int_equal(hpu_layer_backward_reads(l, 1u << 1, 0), HPU_EINVAL);
	printf("  %s\n", lh_error(h));
	assert_string_equal(lh_error(h),
			    "layer custom: hpu_layer_backward_reads names input 1; the layer has 1");
	lh_clear_error(h);
	assert_int_equal(hpu_layer_backward_reads(l, 0, 1u << HPU_MAX_IO), HPU_EINVAL);
	assert_non_null(strstr(lh_error(h), "names output 8; a layer has at most 8"));
	lh_clear_error(h);
	assert_int_equal(hpu_layer_backward_reads(l, 1u, 0), HPU_OK);
	assert_true(l->reads_in == 1u && l->reads_out == 0u);
	assert_int_equal(hpu_layer_backward_reads(NULL, 0, 0), HPU_EINVAL);
	/* hpu_layer_backward_in_place: none until said; a bit past the
	 * inputs refused naming it */
	assert_true(l->in_place == 0u && fc->in_place == 0u && act->in_place == 0u);
	assert_int_equal(hpu_layer_backward_in_place(l, 1u << 2), HPU_EINVAL);
	assert_string_equal(lh_error(h), "layer custom: hpu_layer_backward_in_place names input 2; "
					 "the layer has 1");
	lh_clear_error(h);
	assert_int_equal(hpu_layer_backward_in_place(l, 1u), HPU_OK);
	assert_true(l->in_place == 1u);
	assert_int_equal(hpu_layer_backward_in_place(NULL, 1u), HPU_EINVAL);
	/* hpu_layer_backward_reads_linear: the library's linear says it of
	 * its input, relu and a custom layer nothing until told */
	assert_true(fc->linear_in == 1u && act->linear_in == 0u && l->linear_in == 0u);
	assert_int_equal(hpu_layer_backward_reads_linear(l, 1u << 3), HPU_EINVAL);
	assert_string_equal(lh_error(h), "layer custom: hpu_layer_backward_reads_linear names "
					 "input 3; the layer has 1");
	lh_clear_error(h);
	assert_int_equal(hpu_layer_backward_reads_linear(l, 1u), HPU_OK);
	assert_true(l->linear_in == 1u);
	lh_free(&h);
}

/* ---- dropout ---- */

enum { DN = 1000, DB = 4 };

static void run_dropout(lh_harness *h, hpu_layer *l, const hpu_ctx *c, const float *x, float *y)
{
	void *in[1] = {(void *)x}, *out[1] = {y};
	assert_int_equal(lh_forward(h, l, c, in, out), 0);
}

static void test_dropout(void **state)
{
	(void)state;
	int64_t shape = DN;
	const float p = 0.3f;
	lh_harness *h = lt_harness_x(DB, 1, &shape);
	hpu_layer *l = hpu_dropout(lh_builder(h), "drop", "x", "y", (hpu_dropout_opts){.p = p});
	assert_non_null(l);
	assert_int_equal(lh_alloc(h, 99), 0);
	float *x = lt_alloc_f(DB * DN), *y1 = lt_alloc_f(DB * DN), *y2 = lt_alloc_f(DB * DN);
	float *dx = lt_alloc_f(DB * DN);
	uint64_t s = 1;
	lh_fill(x, DB * DN, 0.5f, 1.5f, &s); /* never 0: a zero in y is a drop */

	hpu_ctx c = lh_ctx(h, l, 1, 5, DB);
	run_dropout(h, l, &c, x, y1);
	size_t zeros = 0;
	for (int i = 0; i < DB * DN; i++) {
		if (y1[i] == 0) {
			zeros++;
			continue;
		}
		assert_float_equal(y1[i], x[i] / (1 - p), 1e-6 * fabsf(y1[i]));
	}
	double frac = (double)zeros / (DB * DN);
	printf("  dropped %.4f (p %.2f)\n", frac, p);
	assert_true(fabs(frac - p) < 0.035); /* 5 standard deviations */

	/* the same ctx, and a recompute, give the same mask */
	run_dropout(h, l, &c, x, y2);
	assert_memory_equal(y1, y2, DB * DN * sizeof(float));
	hpu_ctx rc = c;
	rc.recompute = 1;
	run_dropout(h, l, &rc, x, y2);
	assert_memory_equal(y1, y2, DB * DN * sizeof(float));

	/* backward uses the forward's mask: dy = x gives dx = y */
	void *in[1] = {x}, *out[1] = {y1}, *dout[1] = {x}, *din[1] = {dx};
	assert_int_equal(lh_backward(h, l, &c, in, out, dout, din), 0);
	assert_memory_equal(dx, y1, DB * DN * sizeof(float));

	/* another step: another mask; rows of different samples differ */
	hpu_ctx c6 = lh_ctx(h, l, 1, 6, DB);
	run_dropout(h, l, &c6, x, y2);
	assert_memory_not_equal(y1, y2, DB * DN * sizeof(float));
	size_t same = 0;
	for (int i = 0; i < DN; i++)
		same += (y1[i] == 0) == (y1[DN + i] == 0);
	assert_true(same < DN - 100);

	/* the mask follows the sample, not the row */
	uint32_t samples[DB] = {7, 3, 3, 7};
	lh_set_samples(h, samples, DB);
	for (int r = 0; r < DB; r++)
		memcpy(x + r * DN, x, DN * sizeof *x);
	run_dropout(h, l, &c, x, y1);
	assert_memory_equal(y1, y1 + 3 * DN, DN * sizeof(float));
	assert_memory_equal(y1 + DN, y1 + 2 * DN, DN * sizeof(float));
	assert_memory_not_equal(y1, y1 + DN, DN * sizeof(float));

	/* evaluation: the identity */
	hpu_ctx e = lh_ctx(h, l, 0, 5, DB);
	run_dropout(h, l, &e, x, y2);
	assert_memory_equal(x, y2, DB * DN * sizeof(float));

	free(x), free(y1), free(y2), free(dx);
	lh_free(&h);
}

static void test_dropout_gradients(void **state)
{
	(void)state;
	int64_t shape = 20;
	lh_harness *h = lt_harness_x(3, 1, &shape);
	hpu_layer *l = hpu_dropout(lh_builder(h), "drop", "x", "y", (hpu_dropout_opts){.p = 0.5f});
	hpu_layer *l0 = hpu_dropout(lh_builder(h), "drop0", "x", "y0", (hpu_dropout_opts){.p = 0.0f});
	assert_non_null(l);
	assert_non_null(l0);
	assert_int_equal(lh_alloc(h, 4), 0);
	lt_gradcheck_ok(h, l, 3, NULL, &(lh_check_opts){.train = 1, .step = 3});
	lt_gradcheck_ok(h, l, 3, NULL, &(lh_check_opts){.train = 0});
	/* p = 0 trains as the identity */
	float x[20], y[20];
	uint64_t s = 3;
	lh_fill(x, 20, -1, 1, &s);
	hpu_ctx c = lh_ctx(h, l0, 1, 0, 1);
	run_dropout(h, l0, &c, x, y);
	assert_memory_equal(x, y, sizeof x);
	lh_free(&h);
}

/* ---- add, softmax ---- */

static void test_add(void **state)
{
	(void)state;
	hpu_field f[4] = {{.name = "a", .dtype = HPU_F32, .ndim = 2, .shape = {2, 3}},
			  {.name = "b", .dtype = HPU_F32, .ndim = 2, .shape = {2, 3}},
			  {.name = "c", .dtype = HPU_F32, .ndim = 2, .shape = {3, 2}},
			  {.name = "ids", .dtype = HPU_I32, .ndim = 2, .shape = {2, 3}}};
	lh_harness *h = lt_harness(2, 4, f);
	hpu_builder *b = lh_builder(h);
	lt_refused(h, hpu_add(b, "add1", "a,c", "y"), "add1", "shape");
	lt_refused(h, hpu_add(b, "add2", "a", "y"), "add2", NULL);
	lt_refused(h, hpu_add(b, "add3", "a,b,b", "y"), "add3", NULL);
	lt_refused(h, hpu_add(b, "add4", "a,ids", "y"), "add4", "f32");
	lt_refused(h, hpu_add(b, "add5", "a,nope", "y"), "add5", "nope");
	lt_refused(h, hpu_add(b, "add6", NULL, "y"), "add6", NULL);
	hpu_layer *l = hpu_add(b, "add", "a,b", "y");
	assert_non_null(l);
	assert_int_equal(lh_alloc(h, 1), 0);
	float a[6] = {1, 2, 3, 4, 5, 6}, bb[6] = {10, 20, 30, 40, 50, 60}, y[6], da[6];
	const float want[6] = {11, 22, 33, 44, 55, 66};
	hpu_ctx c = lh_ctx(h, l, 1, 0, 1);
	void *in[2] = {a, bb}, *out[1] = {y};
	assert_int_equal(lh_forward(h, l, &c, in, out), 0);
	close_to(y, want, 6, 0);
	/* no gradient wanted for b */
	void *dout[1] = {bb}, *din[2] = {da, NULL};
	assert_int_equal(lh_backward(h, l, &c, in, out, dout, din), 0);
	close_to(da, bb, 6, 0);
	lt_gradcheck_ok(h, l, 2, NULL, NULL);
	lh_free(&h);
}

static void test_softmax(void **state)
{
	(void)state;
	int64_t shape[2] = {2, 4};
	lh_harness *h = lt_harness_x(2, 2, shape);
	hpu_layer *l = hpu_softmax(lh_builder(h), "sm", "x", "y");
	assert_non_null(l);
	assert_int_equal(lh_alloc(h, 1), 0);
	float x[8] = {0, 0, 0, 0, 1, 2, 3, 4}, y[8];
	hpu_ctx c = lh_ctx(h, l, 1, 0, 1);
	void *in[1] = {x}, *out[1] = {y};
	assert_int_equal(lh_forward(h, l, &c, in, out), 0);
	double z = exp(1) + exp(2) + exp(3) + exp(4);
	const float want[8] = {0.25f, 0.25f, 0.25f, 0.25f, (float)(exp(1) / z),
			       (float)(exp(2) / z), (float)(exp(3) / z), (float)(exp(4) / z)};
	close_to(y, want, 8, 1e-6);
	lt_gradcheck_ok(h, l, 2, NULL, &(lh_check_opts){.lo = -2, .hi = 2});
	lh_free(&h);
}

/* ---- losses and metrics ---- */

/* logits [3 positions, 4 classes], labels [3] */
static lh_harness *xent_harness(int max_batch)
{
	hpu_field f[2] = {{.name = "logits", .dtype = HPU_F32, .ndim = 2, .shape = {3, 4}},
			  {.name = "labels", .dtype = HPU_I32, .ndim = 1, .shape = {3}}};
	return lt_harness(max_batch, 2, f);
}

static void test_xent_forward(void **state)
{
	(void)state;
	lh_harness *h = xent_harness(3);
	hpu_layer *l = hpu_cross_entropy(lh_builder(h), "loss", "logits,labels", "loss");
	assert_non_null(l);
	hpu_tensor t = lh_tensor(h, "loss", 0, NULL);
	assert_true(t.ndim == 0 && t.sample_numel == 1 && t.dtype == HPU_F32);
	assert_int_equal(lh_alloc(h, 1), 0);
	/* row 0: uniform logits, loss log 4 at each position; row 1: one
	 * position counted (-100 elsewhere); row 2: all ignored */
	float x[36] = {0};
	x[12 + 4 + 2] = 2; /* row 1, position 1, class 2 */
	int32_t y[9] = {0, 3, 1, -100, 2, -100, -100, -100, -100};
	float loss[3], dx[36];
	hpu_ctx c = lh_ctx(h, l, 1, 0, 3);
	void *in[2] = {x, y}, *out[1] = {loss};
	assert_int_equal(lh_forward(h, l, &c, in, out), 0);
	double want1 = log(3 + exp(2)) - 2;
	assert_float_equal(loss[0], logf(4), 1e-6);
	assert_float_equal(loss[1], (float)want1, 1e-6);
	assert_float_equal(loss[2], 0, 0);
	float dloss[3] = {1, 1, 1};
	for (int i = 0; i < 36; i++)
		dx[i] = 99;
	void *dout[1] = {dloss}, *din[2] = {dx, NULL};
	assert_int_equal(lh_backward(h, l, &c, in, out, dout, din), 0);
	/* row 0: (1/4 - onehot) / 3 */
	assert_float_equal(dx[0], (0.25f - 1) / 3, 1e-6);
	assert_float_equal(dx[1], 0.25f / 3, 1e-6);
	/* row 1: ignored positions get zeros, the counted one softmax - onehot */
	for (int j = 0; j < 4; j++) {
		assert_float_equal(dx[12 + j], 0, 0);
		assert_float_equal(dx[12 + 8 + j], 0, 0);
	}
	assert_float_equal(dx[12 + 4 + 2], (float)(exp(2) / (3 + exp(2)) - 1), 1e-6);
	/* row 2: no gradient at all */
	for (int j = 24; j < 36; j++)
		assert_float_equal(dx[j], 0, 0);
	/* its backward may write over the logits (hpu_layer_backward_in_place,
	 * where the runtime finds nothing reads them after it): the same
	 * bits as apart */
	assert_true(l->in_place == 1u);
	float xd[36];
	memcpy(xd, x, sizeof x);
	void *in2[2] = {xd, y}, *din2[2] = {xd, NULL};
	assert_int_equal(lh_backward(h, l, &c, in2, out, dout, din2), 0);
	assert_memory_equal(xd, dx, sizeof dx);
	lh_free(&h);
}

static void test_xent_bad_label(void **state)
{
	(void)state;
	lh_harness *h = xent_harness(2);
	hpu_layer *l = hpu_cross_entropy(lh_builder(h), "loss", "logits,labels", "loss");
	hpu_layer *a = hpu_accuracy(lh_builder(h), "acc", "logits,labels", "acc");
	assert_non_null(l);
	assert_non_null(a);
	assert_int_equal(lh_alloc(h, 1), 0);
	float x[24] = {0}, out[2];
	int32_t bad[3][6] = {{0, 1, 2, 3, 7, 0}, {0, 1, 2, 3, -1, 0}, {0, 1, 2, 3, 4, 0}};
	const char *label[3] = {"label 7", "label -1", "label 4"};
	for (int k = 0; k < 3; k++) {
		void *in[2] = {x, bad[k]}, *o[1] = {out};
		hpu_ctx c = lh_ctx(h, l, 1, 0, 2);
		assert_int_not_equal(lh_forward(h, l, &c, in, o), 0);
		printf("  %s\n", lh_layer_error(l));
		assert_non_null(strstr(lh_layer_error(l), label[k]));
		assert_non_null(strstr(lh_layer_error(l), "row 1"));
		assert_non_null(strstr(lh_layer_error(l), "position 1"));
		assert_non_null(strstr(lh_layer_error(l), "loss"));
		c = lh_ctx(h, a, 0, 0, 2);
		assert_int_not_equal(lh_forward(h, a, &c, in, o), 0);
		assert_non_null(strstr(lh_layer_error(a), label[k]));
	}
	lh_free(&h);
}

static void test_xent_gradients(void **state)
{
	(void)state;
	lh_harness *h = xent_harness(3);
	hpu_layer *l = hpu_cross_entropy(lh_builder(h), "loss", "logits,labels", "loss");
	assert_non_null(l);
	assert_int_equal(lh_alloc(h, 1), 0);
	int32_t y[9] = {0, 3, 1, -100, 2, 1, -100, -100, -100};
	void *in[2] = {NULL, y};
	lt_gradcheck_ok(h, l, 3, in, &(lh_check_opts){.lo = -2, .hi = 2});
	lh_free(&h);
}

static void test_loss_refused(void **state)
{
	(void)state;
	hpu_field f[5] = {{.name = "logits", .dtype = HPU_F32, .ndim = 2, .shape = {3, 4}},
			  {.name = "labels", .dtype = HPU_I32, .ndim = 1, .shape = {3}},
			  {.name = "short", .dtype = HPU_I32, .ndim = 1, .shape = {2}},
			  {.name = "flabels", .dtype = HPU_F32, .ndim = 1, .shape = {3}},
			  {.name = "other", .dtype = HPU_F32, .ndim = 2, .shape = {4, 3}}};
	lh_harness *h = lt_harness(1, 5, f);
	hpu_builder *b = lh_builder(h);
	lt_refused(h, hpu_cross_entropy(b, "x1", "logits", "l"), "x1", "logits,labels");
	lt_refused(h, hpu_cross_entropy(b, "x2", "logits,short", "l"), "x2", "short");
	lt_refused(h, hpu_cross_entropy(b, "x3", "logits,flabels", "l"), "x3", "i32");
	lt_refused(h, hpu_cross_entropy(b, "x4", "labels,labels", "l"), "x4", "f32");
	lt_refused(h, hpu_cross_entropy(b, "x5", "nope,labels", "l"), "x5", "nope");
	lt_refused(h, hpu_accuracy(b, "a1", "logits,short", "l"), "a1", "short");
	lt_refused(h, hpu_accuracy(b, "a2", "logits", "l"), "a2", NULL);
	lt_refused(h, hpu_mse(b, "m1", "logits,other", "l"), "m1", "shape");
	lt_refused(h, hpu_mse(b, "m2", "logits,labels", "l"), "m2", "f32");
	lt_refused(h, hpu_mse(b, "m3", "logits", "l"), "m3", "pred,target");
	assert_int_equal(b->nlayers, 0);
	lh_free(&h);
}

static void test_mse(void **state)
{
	(void)state;
	hpu_field f[2] = {{.name = "p", .dtype = HPU_F32, .ndim = 2, .shape = {2, 2}},
			  {.name = "t", .dtype = HPU_F32, .ndim = 2, .shape = {2, 2}}};
	lh_harness *h = lt_harness(2, 2, f);
	hpu_layer *l = hpu_mse(lh_builder(h), "mse", "p,t", "loss");
	assert_non_null(l);
	assert_int_equal(lh_tensor(h, "loss", 0, NULL).ndim, 0);
	assert_int_equal(lh_alloc(h, 1), 0);
	float p[8] = {1, 2, 3, 4, 0, 0, 0, 0}, t[8] = {1, 0, 3, 0, 1, 1, 1, 1}, loss[2];
	hpu_ctx c = lh_ctx(h, l, 1, 0, 2);
	void *in[2] = {p, t}, *out[1] = {loss};
	assert_int_equal(lh_forward(h, l, &c, in, out), 0);
	assert_float_equal(loss[0], 5, 1e-6); /* (4 + 16) / 4 */
	assert_float_equal(loss[1], 1, 1e-6);
	lt_gradcheck_ok(h, l, 2, NULL, NULL);
	lh_free(&h);
}

static void test_accuracy(void **state)
{
	(void)state;
	lh_harness *h = xent_harness(3);
	hpu_layer *l = hpu_accuracy(lh_builder(h), "acc", "logits,labels", "acc");
	assert_non_null(l);
	/* a metric: no backward (the builder refuses a loss on it) */
	assert_null(l->ops.backward);
	assert_int_equal(lh_alloc(h, 1), 0);
	float x[36] = {0};
	/* row 0: arg-max 1, 2, 3 ; row 1: 0 (a tie: the first), 1, 1 */
	x[1] = 1, x[4 + 2] = 1, x[8 + 3] = 1;
	x[12 + 4 + 1] = 5, x[12 + 8 + 1] = 5;
	int32_t y[9] = {1, 2, 0, 0, -100, 2, -100, -100, -100};
	float acc[3];
	hpu_ctx c = lh_ctx(h, l, 0, 0, 3);
	void *in[2] = {x, y}, *out[1] = {acc};
	assert_int_equal(lh_forward(h, l, &c, in, out), 0);
	assert_float_equal(acc[0], 2.0f / 3, 1e-6);
	assert_float_equal(acc[1], 0.5f, 1e-6);
	assert_float_equal(acc[2], 0, 0);
	lh_free(&h);
}

/* A loss that depends on accuracy is refused at setup, since accuracy has
 * no backward; as a metric beside a real loss it plans. */
static int setup_acc_loss(hpu_builder *b, int argc, char **argv)
{
	(void)argc;
	int as_loss = argv && argv[0] && !strcmp(argv[0], "loss");
	if (!hpu_linear(b, "fc", "x", "logits", (hpu_linear_opts){.out = 4, .bias = true}) ||
	    !hpu_accuracy(b, "acc", "logits,label", "acc") ||
	    !hpu_cross_entropy(b, "xent", "logits,label", "xent"))
		return -1;
	if (as_loss)
		return hpu_loss_add(b, "acc", 1.0f);
	if (hpu_loss_add(b, "xent", 1.0f) || hpu_metric_add(b, "accuracy", "acc"))
		return -1;
	return 0;
}

static int no_fetch(void *user, size_t index, void *const *out)
{
	(void)user, (void)index, (void)out;
	return -1;
}

static void test_accuracy_plan(void **state)
{
	(void)state;
	for (int as_loss = 0; as_loss <= 1; as_loss++) {
		hpu_builder *b = hpu__model_new(0, 1, 4);
		hpu_dataset ds = {.size = 1, .nfields = 2, .fetch = no_fetch};
		ds.fields[0] = (hpu_field){.name = "x", .dtype = HPU_F32, .ndim = 1, .shape = {3}};
		ds.fields[1] = (hpu_field){.name = "label", .dtype = HPU_I32, .ndim = 0};
		assert_int_equal(hpu_dataset_set(b, HPU_SPLIT_TRAIN, &ds), HPU_OK);
		char err[512] = "", *argv[1] = {as_loss ? "loss" : "metric"};
		int rc = hpu__model_setup_fn(b, setup_acc_loss, 1, argv, err, sizeof err);
		printf("  as %s: rc %d %s\n", argv[0], rc, err);
		if (as_loss) {
			assert_int_not_equal(rc, 0);
			assert_non_null(strstr(err, "acc"));
		} else {
			assert_int_equal(rc, 0);
		}
		hpu__model_destroy(&b);
	}
}

/* ---- PyTorch references ---- */

static hpu_layer *ref_linear(hpu_builder *b, const lh_ref *r)
{
	return hpu_linear(b, "fc", "x", "y", (hpu_linear_opts){.out = lh_ref_int(r, "out_features", 0), .bias = true});
}

static hpu_layer *ref_conv2d(hpu_builder *b, const lh_ref *r)
{
	return hpu_conv2d(b, "conv", "x", "y", (hpu_conv2d_opts){.out = lh_ref_int(r, "out_ch", 0), .kernel = lh_ref_int(r, "kernel", 0), .stride = lh_ref_int(r, "stride", 0), .pad = lh_ref_int(r, "pad", -1), .bias = true});
}

static hpu_layer *ref_maxpool(hpu_builder *b, const lh_ref *r)
{
	return hpu_maxpool2d(b, "pool", "x", "y", (hpu_pool2d_opts){.kernel = lh_ref_int(r, "kernel", 0), .stride = lh_ref_int(r, "stride", 0)});
}

static hpu_layer *ref_avgpool(hpu_builder *b, const lh_ref *r)
{
	return hpu_avgpool2d(b, "pool", "x", "y", (hpu_pool2d_opts){.kernel = lh_ref_int(r, "kernel", 0), .stride = lh_ref_int(r, "stride", 0)});
}

static hpu_layer *ref_gelu(hpu_builder *b, const lh_ref *r)
{
	(void)r;
	return hpu_gelu(b, "act", "x", "y");
}

static hpu_layer *ref_tanh(hpu_builder *b, const lh_ref *r)
{
	(void)r;
	return hpu_tanh(b, "act", "x", "y");
}

static hpu_layer *ref_softmax(hpu_builder *b, const lh_ref *r)
{
	(void)r;
	return hpu_softmax(b, "sm", "x", "y");
}

static hpu_layer *ref_xent(hpu_builder *b, const lh_ref *r)
{
	(void)r;
	return hpu_cross_entropy(b, "loss", "logits,labels", "y");
}

static hpu_layer *ref_mse(hpu_builder *b, const lh_ref *r)
{
	(void)r;
	return hpu_mse(b, "loss", "pred,target", "y");
}

static void test_torch_references(void **state)
{
	(void)state;
	static const lt_ref_case cases[] = {
		{"a_linear.ref", 1, {"x"}, {"dx"}, ref_linear},
		{"a_conv2d.ref", 1, {"x"}, {"dx"}, ref_conv2d},
		{"a_maxpool2d.ref", 1, {"x"}, {"dx"}, ref_maxpool},
		{"a_avgpool2d.ref", 1, {"x"}, {"dx"}, ref_avgpool},
		{"a_gelu.ref", 1, {"x"}, {"dx"}, ref_gelu},
		{"a_tanh.ref", 1, {"x"}, {"dx"}, ref_tanh},
		{"a_softmax.ref", 1, {"x"}, {"dx"}, ref_softmax},
		{"a_xent.ref", 2, {"logits", "labels"}, {"dlogits", NULL}, ref_xent},
		{"a_xent_flat.ref", 2, {"logits", "labels"}, {"dlogits", NULL}, ref_xent},
		{"a_mse.ref", 2, {"pred", "target"}, {"dpred", "dtarget"}, ref_mse},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		lt_run_ref(&cases[i]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gradcheck_catches_wrong_gradients),
		cmocka_unit_test(test_harness_dataset),
		cmocka_unit_test(test_linear_forward),
		cmocka_unit_test(test_linear_init),
		cmocka_unit_test(test_custom_init_error),
		cmocka_unit_test(test_wrong_phase),
		cmocka_unit_test(test_shape_too_large),
		cmocka_unit_test(test_failure_without_message),
		cmocka_unit_test(test_metric_reserved),
		cmocka_unit_test(test_run_handles),
		cmocka_unit_test(test_bias_fan_in),
		cmocka_unit_test(test_linear_gradients),
		cmocka_unit_test(test_linear_refused),
		cmocka_unit_test(test_linear_tied),
		cmocka_unit_test(test_conv2d_forward),
		cmocka_unit_test(test_conv2d_gradients),
		cmocka_unit_test(test_sticky_errors),
		cmocka_unit_test(test_error_without_builder),
		cmocka_unit_test(test_conv_pool_refused),
		cmocka_unit_test(test_maxpool),
		cmocka_unit_test(test_avgpool),
		cmocka_unit_test(test_flatten),
		cmocka_unit_test(test_relu),
		cmocka_unit_test(test_gelu_tanh_gradients),
		cmocka_unit_test(test_eltwise_refused),
		cmocka_unit_test(test_backward_reads),
		cmocka_unit_test(test_dropout),
		cmocka_unit_test(test_dropout_gradients),
		cmocka_unit_test(test_add),
		cmocka_unit_test(test_softmax),
		cmocka_unit_test(test_xent_forward),
		cmocka_unit_test(test_xent_bad_label),
		cmocka_unit_test(test_xent_gradients),
		cmocka_unit_test(test_loss_refused),
		cmocka_unit_test(test_mse),
		cmocka_unit_test(test_accuracy),
		cmocka_unit_test(test_accuracy_plan),
		cmocka_unit_test(test_torch_references),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
