/* Unit tests for the backend's matrix products (worker/ops/backend_dnnl.c)
 * and the ops built on them (linear, matmul, bmm in worker/ops/ops.c and
 * ops_nn.c).
 *
 * Every case runs twice: on the oneDNN backend and on the reference
 * kernels (OpenBLAS sgemm, hpu__be_reference()), at awkward shapes (odd
 * sizes, batch 1, every transpose, padded batch strides, bias,
 * accumulation). fp32 agrees within 1e-5 relative. bf16 products of
 * bf16 values are exact in fp32, so the bf16 kernel agrees with the
 * reference run on the same (rounded) values up to summation order;
 * outputs rounded to bf16 may then differ by one bf16 step where the
 * fp32 sums straddle a rounding boundary. fp8 on the bf16 kernel agrees
 * with the emulation (fp32 products of the fake-quantized values) the
 * same way. Each comparison prints its largest difference.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/num_testlib.h"

#include "worker/ops/autocast.h"
#include "worker/ops/backend.h"
#include "worker/ops/fp8.h"
#include "common/lowp.h"
#include "worker/ops/ops_ref.h"

#include "hpu/ops.h"

static void check(const char *what, const float *got, const float *want, size_t n,
		  double tol)
{
	double m = rel_diff(got, want, n, 1e-3);
	printf("  %-48s maxdiff %.3g (tol %.1g)%s\n", what, m, tol, m <= tol ? "" : "  FAIL");
	assert_true(m <= tol);
}

/* The largest difference in bf16 steps (units in the last place) between
 * two arrays of bf16 values. */
static int bf16_steps(const float *a, const float *b, size_t n)
{
	int worst = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t ua, ub;
		memcpy(&ua, &a[i], 4);
		memcpy(&ub, &b[i], 4);
		if ((ua & 0xffff) || (ub & 0xffff))
			return 1 << 30; /* not a bf16 value */
		/* ordered integers of the two */
		int32_t ia = (ua & 0x80000000u) ? -(int32_t)((ua & 0x7fffffffu) >> 16)
						 : (int32_t)(ua >> 16);
		int32_t ib = (ub & 0x80000000u) ? -(int32_t)((ub & 0x7fffffffu) >> 16)
						 : (int32_t)(ub >> 16);
		int d = abs(ia - ib);
		if (d > worst)
			worst = d;
	}
	return worst;
}

static void check_bf16(const char *what, const float *got, const float *want, size_t n)
{
	int s = bf16_steps(got, want, n);
	printf("  %-48s %d bf16 step(s) apart (tol 1)%s\n", what, s, s <= 1 ? "" : "  FAIL");
	assert_true(s <= 1);
}

static void round_bf16(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = hpu_from_bf16(hpu_to_bf16(x[i]));
}

static void policy(int lowp)
{
	char err[256];
	unsetenv("LOWER_LIST");
	unsetenv("FP32_LIST");
	if (hpu__autocast_init(lowp, err, sizeof err) < 0)
		fail_msg("%s", err);
}

/* ---- the backend's gemm against the reference ---- */

typedef struct gcase {
	int count, m, n, k, ta, tb, acc, bias, pad;
} gcase;

static const gcase cases[] = {
	{1, 1, 1, 1, 0, 0, 0, 0, 0},     {1, 1, 7, 3, 0, 1, 0, 1, 0},
	{1, 5, 7, 3, 1, 0, 1, 0, 0},     {1, 33, 17, 29, 1, 1, 0, 0, 0},
	{1, 257, 129, 65, 0, 1, 0, 1, 0}, {1, 64, 1000, 3, 0, 0, 1, 0, 0},
	{1, 3, 5, 1001, 1, 0, 0, 0, 0},  {3, 4, 5, 6, 0, 0, 0, 0, 0},
	{3, 4, 5, 6, 1, 1, 1, 0, 7},     {5, 17, 9, 33, 0, 1, 0, 0, 3},
	{2, 64, 64, 32, 0, 1, 1, 0, 0},
	/* an MLP's products at batch 512: forward, dW, dX */
	{1, 512, 64, 784, 0, 1, 0, 1, 0}, {1, 64, 784, 512, 1, 0, 1, 0, 0},
	{1, 10, 64, 512, 1, 0, 1, 0, 0},  {1, 512, 64, 10, 0, 0, 0, 0, 0},
	{1, 64, 64, 512, 1, 0, 1, 0, 0},
};

/* One product of case c in type dt on the backend and on the reference
 * (on the same values: rounded to bf16 first for dt bf16). */
static void run_case(const gcase *c, hpu__dtype dt)
{
	size_t sa = (size_t)c->m * c->k + c->pad, sb = (size_t)c->k * c->n + c->pad;
	size_t sc = (size_t)c->m * c->n + c->pad;
	size_t na = sa * c->count, nb = sb * c->count, nc = sc * c->count;
	float *a = xcalloc(na, 4), *b = xcalloc(nb, 4), *bias = xcalloc(c->n, 4);
	float *got = xcalloc(nc, 4), *want = xcalloc(nc, 4);
	uint16_t *a16 = xcalloc(na, 2), *b16 = xcalloc(nb, 2);
	fill(a, na, -1, 1);
	fill(b, nb, -1, 1);
	fill(bias, c->n, -1, 1);
	fill(got, nc, -1, 1);
	memcpy(want, got, nc * 4);
	if (dt == HPU_DT_BF16) {
		round_bf16(a, na);
		round_bf16(b, nb);
		for (size_t i = 0; i < na; i++)
			a16[i] = hpu_to_bf16(a[i]);
		for (size_t i = 0; i < nb; i++)
			b16[i] = hpu_to_bf16(b[i]);
	}
	hpu__gemm g = {.dt = dt, .count = c->count, .m = c->m, .n = c->n, .k = c->k,
		       .trans_a = c->ta, .trans_b = c->tb,
		       .a = dt == HPU_DT_BF16 ? (const void *)a16 : a,
		       .b = dt == HPU_DT_BF16 ? (const void *)b16 : b,
		       .bias = c->bias ? bias : NULL, .c = got, .stride_a = sa,
		       .stride_b = sb, .stride_c = sc, .accumulate = c->acc};
	int rc = hpu__be()->gemm(&g);
	if (dt == HPU_DT_BF16 && !hpu__be()->bf16_native()) {
		assert_int_equal(rc, HPU_BE_UNSUPPORTED);
		goto out;
	}
	assert_int_equal(rc, HPU_BE_OK);
	for (int i = 0; i < c->count; i++) {
		float *w = want + i * sc;
		hpu__ref_matmul(a + i * sa, b + i * sb, w, c->m, c->n, c->k, c->ta, c->tb,
				c->acc);
		for (int r = 0; c->bias && r < c->m; r++)
			for (int j = 0; j < c->n; j++)
				w[(size_t)r * c->n + j] += bias[j];
	}
	char what[96];
	snprintf(what, sizeof what, "%s gemm %dx %dx%dx%d t%d%d acc%d bias%d pad%d",
		 dt == HPU_DT_BF16 ? "bf16" : "f32", c->count, c->m, c->n, c->k, c->ta, c->tb,
		 c->acc, c->bias, c->pad);
	/* the padding between batch entries must be left alone */
	check(what, got, want, nc, 1e-5);
out:
	free(a), free(b), free(bias), free(got), free(want), free(a16), free(b16);
}

static void test_gemm_f32(void **state)
{
	(void)state;
	rng_seed(1);
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
		run_case(&cases[i], HPU_DT_F32);
}

static void test_gemm_bf16(void **state)
{
	(void)state;
	rng_seed(2);
	printf("  backend: %s\n", hpu__be()->describe());
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
		run_case(&cases[i], HPU_DT_BF16);
}

/* k == 0: an empty sum (c = bias or 0; unchanged under accumulate); m or
 * n == 0: nothing written. */
static void test_gemm_empty(void **state)
{
	(void)state;
	float c[6] = {1, 2, 3, 4, 5, 6}, bias[3] = {7, 8, 9}, a[1] = {0}, b[1] = {0};
	hpu__gemm g = {.count = 1, .m = 2, .n = 3, .k = 0, .a = a, .b = b, .c = c,
		       .accumulate = 1};
	assert_int_equal(hpu__be()->gemm(&g), HPU_BE_OK);
	assert_true(c[0] == 1 && c[5] == 6);
	g.accumulate = 0;
	g.bias = bias;
	assert_int_equal(hpu__be()->gemm(&g), HPU_BE_OK);
	assert_true(c[0] == 7 && c[2] == 9 && c[3] == 7 && c[5] == 9);
	g.m = 0;
	g.k = 2;
	c[0] = 42;
	assert_int_equal(hpu__be()->gemm(&g), HPU_BE_OK);
	assert_true(c[0] == 42);
}

/* A bf16 output (c16, where the table says gemm_c16): each element the
 * bf16 rounding of the fp32 output's, bit for bit (the same sums), the
 * padding between batch entries left alone; bias or accumulate refused.
 * The shapes of the MLP's weight gradients at batch 256 among them. */
static void test_gemm_c16(void **state)
{
	(void)state;
	static const gcase c16cases[] = {
		{1, 1, 1, 1, 1, 0, 0, 0, 0},       {1, 33, 17, 29, 1, 0, 0, 0, 0},
		{1, 5, 7, 1001, 0, 1, 0, 0, 0},    {3, 4, 5, 6, 1, 1, 0, 0, 7},
		{1, 1024, 784, 256, 1, 0, 0, 0, 0}, {1, 1024, 1024, 256, 1, 0, 0, 0, 0},
		{1, 10, 1024, 256, 1, 0, 0, 0, 0},  {1, 64, 784, 37, 1, 0, 0, 0, 0},
	};
	const hpu__backend *be = hpu__be();
	printf("  backend %s: gemm_c16 %d, bf16 native %d\n", be->name, be->gemm_c16,
	       be->bf16_native());
	assert_int_equal(hpu__be_reference()->gemm_c16, 0);
	if (!be->gemm_c16)
		skip();
	rng_seed(7);
	for (size_t t = 0; t < sizeof c16cases / sizeof *c16cases; t++) {
		const gcase *c = &c16cases[t];
		size_t sa = (size_t)c->m * c->k + c->pad, sb = (size_t)c->k * c->n + c->pad;
		size_t sc = (size_t)c->m * c->n + c->pad;
		size_t na = sa * c->count, nb = sb * c->count, nc = sc * c->count;
		float *a = xcalloc(na, 4), *b = xcalloc(nb, 4), *c32 = xcalloc(nc, 4);
		uint16_t *a16 = xcalloc(na, 2), *b16 = xcalloc(nb, 2), *c16 = xcalloc(nc, 2);
		fill(a, na, -1, 1);
		fill(b, nb, -1e-3f, 1e-3f);
		for (size_t i = 0; i < na; i++)
			a16[i] = hpu_to_bf16(a[i]);
		for (size_t i = 0; i < nb; i++)
			b16[i] = hpu_to_bf16(b[i]);
		for (size_t i = 0; i < nc; i++)
			c16[i] = 0xabcd;
		hpu__gemm g = {.dt = HPU_DT_BF16, .count = c->count, .m = c->m, .n = c->n,
			       .k = c->k, .trans_a = c->ta, .trans_b = c->tb, .a = a16, .b = b16,
			       .c = c32, .stride_a = sa, .stride_b = sb, .stride_c = sc};
		int rc = be->gemm(&g);
		g.c = NULL;
		g.c16 = c16;
		int rc16 = be->gemm(&g);
		if (!be->bf16_native()) {
			assert_int_equal(rc16, HPU_BE_UNSUPPORTED);
		} else {
			assert_int_equal(rc, HPU_BE_OK);
			assert_int_equal(rc16, HPU_BE_OK);
			size_t bad = 0;
			for (size_t i = 0; i < nc; i++) {
				int pad = i % sc >= (size_t)c->m * c->n;
				uint16_t want = pad ? 0xabcd : hpu_to_bf16(c32[i]);
				if (c16[i] != want && bad++ < 3)
					printf("    [%zu] %#x, want %#x (%.9g)\n", i, c16[i], want,
					       (double)c32[i]);
			}
			printf("  bf16 out %dx %dx%dx%d t%d%d: %zu of %zu differ\n", c->count, c->m,
			       c->n, c->k, c->ta, c->tb, bad, nc);
			assert_int_equal(bad, 0);
		}
		g.accumulate = 1;
		assert_int_equal(be->gemm(&g), HPU_BE_UNSUPPORTED);
		free(a), free(b), free(c32), free(a16), free(b16), free(c16);
	}
	/* k == 0: zeros */
	uint16_t z[6] = {1, 2, 3, 4, 5, 6};
	float one[1] = {0};
	hpu__gemm e = {.dt = HPU_DT_BF16, .count = 1, .m = 2, .n = 3, .k = 0, .a = one,
		       .b = one, .c16 = z};
	assert_int_equal(be->gemm(&e), HPU_BE_OK);
	for (int i = 0; i < 6; i++)
		assert_int_equal(z[i], 0);
}

/* ---- the ops: oneDNN against the reference kernels ---- */

enum { B = 37, IN = 53, OUT = 29 };

typedef struct lin_out {
	float y[B * OUT], dx[B * IN], dw[OUT * IN], db[OUT];
} lin_out;

static float X[B * IN], P[OUT * IN + OUT], DY[B * OUT];
#define W P
#define BIAS (P + OUT * IN)

/* linear forward and backward with the current policy and backend, in
 * layer "fc" (fp8 finds its call site there); dw and db start at 0.5 to
 * check that they accumulate. */
static void linear_run(lin_out *o, const hpu__backend *be)
{
	hpu__be_set(be);
	for (int i = 0; i < OUT * IN; i++)
		o->dw[i] = 0.5f;
	for (int i = 0; i < OUT; i++)
		o->db[i] = 0.5f;
	hpu__op_layer(0, "fc", P, OUT * IN + OUT, 0);
	hpu_linear_forward(X, W, BIAS, o->y, B, IN, OUT);
	hpu__op_layer(0, "fc", P, OUT * IN + OUT, 1);
	hpu_linear_backward(X, W, DY, o->dx, o->dw, o->db, B, IN, OUT);
	hpu__op_layer(-1, NULL, NULL, 0, 0);
	hpu__be_set(NULL);
}

static void linear_fill(void)
{
	fill(X, B * IN, -2, 2);
	fill(P, OUT * IN + OUT, -0.3f, 0.3f);
	fill(DY, B * OUT, -1e-2f, 1e-2f);
}

static void test_linear_fp32(void **state)
{
	(void)state;
	static lin_out got, want;
	rng_seed(3);
	linear_fill();
	policy(HPU_AUTOCAST_NONE);
	linear_run(&got, NULL);
	linear_run(&want, hpu__be_reference());
	check("linear f32 y", got.y, want.y, B * OUT, 1e-5);
	check("linear f32 dx", got.dx, want.dx, B * IN, 1e-5);
	check("linear f32 dw (accumulated onto 0.5)", got.dw, want.dw, OUT * IN, 1e-5);
	check("linear f32 db (accumulated onto 0.5)", got.db, want.db, OUT, 1e-5);
}

/* bf16-mixed: y and dx are bf16 values one step apart at most; dw and db
 * (fp32 accumulation of exact products) within 1e-5. */
static void test_linear_bf16(void **state)
{
	(void)state;
	static lin_out got, want;
	rng_seed(4);
	linear_fill();
	policy(HPU_AUTOCAST_BF16);
	linear_run(&got, NULL);
	linear_run(&want, hpu__be_reference());
	check_bf16("linear bf16 y", got.y, want.y, B * OUT);
	check_bf16("linear bf16 dx", got.dx, want.dx, B * IN);
	check("linear bf16 dw", got.dw, want.dw, OUT * IN, 1e-5);
	check("linear bf16 db", got.db, want.db, OUT, 1e-5);
	policy(HPU_AUTOCAST_NONE);
}

/* The runtime's bf16 working copy of the parameters (hpu__ac_param16_add)
 * is read instead of converting the fp32 copy: the same bits. */
static void test_linear_param16(void **state)
{
	(void)state;
	static lin_out plain, shadow;
	static uint16_t p16[OUT * IN + OUT];
	rng_seed(5);
	linear_fill();
	round_bf16(P, OUT * IN + OUT); /* the fp32 copy is made from p16 */
	for (int i = 0; i < OUT * IN + OUT; i++)
		p16[i] = hpu_to_bf16(P[i]);
	policy(HPU_AUTOCAST_BF16);
	linear_run(&plain, NULL);
	assert_int_equal(hpu__ac_param16_add(P, p16, OUT * IN + OUT, 0, 1), 0);
	linear_run(&shadow, NULL);
	hpu__ac_param16_remove(P);
	assert_memory_equal(&plain, &shadow, sizeof plain);
	/* a shadow that differs shows that it was read */
	for (int i = 0; i < OUT * IN; i++)
		p16[i] = 0;
	assert_int_equal(hpu__ac_param16_add(P, p16, OUT * IN + OUT, 0, 1), 0);
	linear_run(&shadow, NULL);
	hpu__ac_param16_remove(P);
	if (hpu__be()->bf16_native())
		for (int i = 0; i < B * OUT; i++)
			assert_true(shadow.y[i] == hpu_from_bf16(hpu_to_bf16(BIAS[i % OUT])));
	policy(HPU_AUTOCAST_NONE);
}

/* A working copy registered without its fp32 values: they are made when
 * an op reads them in fp32 (the bias; the weight under fp32 or without
 * bf16 products) and never for the weight of a bf16 product; the results
 * equal those of the fp32 copy made up front. */
static void test_linear_param16_lazy(void **state)
{
	(void)state;
	static lin_out want, got;
	static uint16_t p16[OUT * IN + OUT];
	static float saved[OUT * IN + OUT];
	rng_seed(6);
	linear_fill();
	round_bf16(P, OUT * IN + OUT);
	for (int i = 0; i < OUT * IN + OUT; i++)
		p16[i] = hpu_to_bf16(P[i]);
	memcpy(saved, P, sizeof saved);
	for (int lp = HPU_AUTOCAST_NONE; lp <= HPU_AUTOCAST_BF16; lp++) {
		policy(lp);
		memcpy(P, saved, sizeof saved);
		linear_run(&want, NULL);
		for (int i = 0; i < OUT * IN + OUT; i++)
			P[i] = NAN; /* not made yet */
		assert_int_equal(hpu__ac_param16_add(P, p16, OUT * IN + OUT, 0, 0), 0);
		linear_run(&got, NULL);
		hpu__ac_param16_remove(P);
		assert_memory_equal(&want, &got, sizeof want);
		for (int o = 0; o < OUT; o++)
			assert_true(BIAS[o] == saved[OUT * IN + o]);
		int bf16_products = lp == HPU_AUTOCAST_BF16 && hpu__be()->bf16_native();
		/* the weight's first chunk: made only when read in fp32 (the
		 * chunk holding the bias may hold the weight's tail) */
		assert_int_equal(isnan(W[0]), bf16_products);
		if (!bf16_products)
			assert_memory_equal(P, saved, sizeof saved);
	}
	policy(HPU_AUTOCAST_NONE);
}

/* fp8 training's linear on the bf16 kernel against the emulation (fp32
 * products of the fake-quantized values), each from a fresh fp8 state. */
static void test_linear_fp8(void **state)
{
	(void)state;
	static lin_out got, want;
	rng_seed(6);
	linear_fill();
	policy(HPU_AUTOCAST_FP8);
	uint64_t n8 = hpu__autocast_count("linear", HPU_AUTOCAST_COUNT_FP8);
	hpu__fp8_set_mode(HPU_FP8_TRAIN, NULL);
	linear_run(&got, NULL);
	hpu__fp8_set_mode(HPU_FP8_TRAIN, NULL);
	linear_run(&want, hpu__be_reference());
	hpu__fp8_set_mode(HPU_FP8_OFF, NULL);
	assert_int_equal(hpu__autocast_count("linear", HPU_AUTOCAST_COUNT_FP8), n8 + 4);
	check_bf16("fp8 linear y (bf16 kernel vs emulation)", got.y, want.y, B * OUT);
	check_bf16("fp8 linear dx", got.dx, want.dx, B * IN);
	check("fp8 linear dw", got.dw, want.dw, OUT * IN, 1e-5);
	check("fp8 linear db", got.db, want.db, OUT, 1e-6);
	policy(HPU_AUTOCAST_NONE);
}

/* matmul and bmm (every transpose, accumulate) in fp32 and bf16. */
static void test_matmul_bmm(void **state)
{
	(void)state;
	enum { C = 3, M = 13, N = 11, K = 19, PAD = 5 };
	size_t sa = M * K + PAD, sb = K * N + PAD, sc = M * N + PAD;
	static float a[C * (M * K + PAD)], b[C * (K * N + PAD)];
	static float got[C * (M * N + PAD)], want[C * (M * N + PAD)];
	rng_seed(7);
	fill(a, C * sa, -1, 1);
	fill(b, C * sb, -1, 1);
	for (int lp = 0; lp <= 1; lp++)
		for (int t = 0; t < 8; t++) {
			int ta = t & 1, tb = (t >> 1) & 1, acc = (t >> 2) & 1;
			policy(lp ? HPU_AUTOCAST_BF16 : HPU_AUTOCAST_NONE);
			const hpu__backend *bes[2] = {NULL, hpu__be_reference()};
			float *outs[2] = {got, want};
			for (int k = 0; k < 2; k++) {
				for (size_t i = 0; i < C * sc; i++)
					outs[k][i] = 0.25f;
				hpu__be_set(bes[k]);
				hpu_matmul(a, b, outs[k], M, N, K, ta, tb, acc);
				hpu_bmm(a, b, outs[k] + sc, C - 1, M, N, K, ta, tb, acc, sa, sb, sc);
				hpu__be_set(NULL);
			}
			char what[80];
			snprintf(what, sizeof what, "%s matmul+bmm t%d%d acc%d", lp ? "bf16" : "f32",
				 ta, tb, acc);
			if (lp && !acc) {
				check_bf16(what, got, want, C * sc);
			} else {
				/* fp32, or the rounded product added onto 0.25 */
				check(what, got, want, C * sc, lp ? 1.0 / 128 : 1e-5);
			}
		}
	policy(HPU_AUTOCAST_NONE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gemm_f32),     cmocka_unit_test(test_gemm_bf16),
		cmocka_unit_test(test_gemm_empty),   cmocka_unit_test(test_gemm_c16),
		cmocka_unit_test(test_linear_fp32),
		cmocka_unit_test(test_linear_bf16),  cmocka_unit_test(test_linear_param16),
		cmocka_unit_test(test_linear_param16_lazy),
		cmocka_unit_test(test_linear_fp8),   cmocka_unit_test(test_matmul_bmm),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
