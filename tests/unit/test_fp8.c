/* Unit tests for fp8 (worker/fp8.c): the E4M3/E5M2 conversions against
 * the OCP format's defining values, rounding and saturation; power-of-two
 * scales; fp8 linear forward/backward against fp32; delayed scaling's
 * amax history; measurement and quantization of an op instance.
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

#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"
#include "worker/ops/fp8.h"
#include "common/lowp.h"
#include "hpu/ops.h"

static const char *fmt_name(int fmt)
{
	return fmt == HPU_FP8_E4M3 ? "E4M3" : "E5M2";
}

/* Values the OCP 8-bit float specification gives for each format. */
static void test_decode_known_values(void **state)
{
	(void)state;
	static const struct {
		int fmt;
		uint8_t b;
		float v;
	} known[] = {
		{HPU_FP8_E4M3, 0x00, 0.0f},         {HPU_FP8_E4M3, 0x01, 0x1p-9f},
		{HPU_FP8_E4M3, 0x07, 7 * 0x1p-9f},  {HPU_FP8_E4M3, 0x08, 0x1p-6f},
		{HPU_FP8_E4M3, 0x38, 1.0f},         {HPU_FP8_E4M3, 0x39, 1.125f},
		{HPU_FP8_E4M3, 0x7e, 448.0f},       {HPU_FP8_E4M3, 0xfe, -448.0f},
		{HPU_FP8_E4M3, 0x77, 240.0f},       {HPU_FP8_E5M2, 0x00, 0.0f},
		{HPU_FP8_E5M2, 0x01, 0x1p-16f},     {HPU_FP8_E5M2, 0x03, 3 * 0x1p-16f},
		{HPU_FP8_E5M2, 0x04, 0x1p-14f},     {HPU_FP8_E5M2, 0x3c, 1.0f},
		{HPU_FP8_E5M2, 0x3d, 1.25f},        {HPU_FP8_E5M2, 0x7b, 57344.0f},
		{HPU_FP8_E5M2, 0xbc, -1.0f},
	};
	for (size_t i = 0; i < sizeof known / sizeof *known; i++) {
		float got = hpu__fp8_decode(known[i].b, known[i].fmt);
		if (got != known[i].v)
			fail_msg("%s 0x%02x: decoded %g, want %g", fmt_name(known[i].fmt),
				 known[i].b, got, known[i].v);
	}
	assert_true(isnan(hpu__fp8_decode(0x7f, HPU_FP8_E4M3)));
	assert_true(isnan(hpu__fp8_decode(0xff, HPU_FP8_E4M3)));
	assert_true(isinf(hpu__fp8_decode(0x7c, HPU_FP8_E5M2)));
	assert_true(isnan(hpu__fp8_decode(0x7d, HPU_FP8_E5M2)));
	assert_true(hpu__fp8_max(HPU_FP8_E4M3) == 448.0f);
	assert_true(hpu__fp8_max(HPU_FP8_E5M2) == 57344.0f);
}

/* Every code decodes and encodes back to itself; the positive codes are
 * increasing; fake quantization of a representable value is that value. */
static void test_round_trip(void **state)
{
	(void)state;
	for (int fmt = 0; fmt < 2; fmt++) {
		float prev = -1.0f;
		for (int b = 0; b < 256; b++) {
			float v = hpu__fp8_decode((uint8_t)b, fmt);
			if (isnan(v))
				continue;
			uint8_t back = hpu__fp8_encode(v, fmt);
			if (back != b)
				fail_msg("%s 0x%02x -> %g -> 0x%02x", fmt_name(fmt), b, v, back);
			float q;
			hpu__fp8_fake_quant(&v, &q, 1, 1.0f, fmt);
			assert_true(q == v || (isinf(q) && isinf(v)));
			if (b < 0x7b && b != 0) {
				assert_true(v > prev);
				prev = v;
			}
		}
	}
}

/* Between two neighbours: the midpoint goes to the even code, anything
 * nearer to a neighbour to that neighbour. Checked for every pair of
 * neighbours, both signs. */
static void test_round_to_nearest_even(void **state)
{
	(void)state;
	for (int fmt = 0; fmt < 2; fmt++) {
		int top = fmt == HPU_FP8_E4M3 ? 0x7e : 0x7b;
		for (int b = 0; b < top; b++) {
			float lo = hpu__fp8_decode((uint8_t)b, fmt);
			float hi = hpu__fp8_decode((uint8_t)(b + 1), fmt);
			float mid = (lo + hi) / 2; /* exact in fp32 */
			float even = (b & 1) ? hi : lo;
			float cases[3][2] = {{mid, even},
					     {nextafterf(mid, 0.0f), lo},
					     {nextafterf(mid, INFINITY), hi}};
			for (int c = 0; c < 3; c++)
				for (int sgn = -1; sgn <= 1; sgn += 2) {
					float v = sgn * cases[c][0], want = sgn * cases[c][1], q;
					hpu__fp8_fake_quant(&v, &q, 1, 1.0f, fmt);
					if (q != want)
						fail_msg("%s: %a rounded to %a, want %a", fmt_name(fmt),
							 v, q, want);
					assert_true(hpu__fp8_decode(hpu__fp8_encode(v, fmt), fmt) ==
						    want);
				}
		}
	}
}

static void test_saturation_and_specials(void **state)
{
	(void)state;
	float in[] = {464.0f, 1e6f, -1e30f, INFINITY, -INFINITY, NAN, 449.0f, 0x1p-11f};
	float q[8];
	hpu__fp8_fake_quant(in, q, 8, 1.0f, HPU_FP8_E4M3);
	assert_true(q[0] == 448.0f && q[1] == 448.0f && q[2] == -448.0f);
	assert_true(isnan(q[3]) && isnan(q[4]) && isnan(q[5])); /* E4M3 has no inf */
	assert_true(q[6] == 448.0f);
	assert_true(q[7] == 0.0f); /* a quarter of the smallest subnormal */
	assert_int_equal(hpu__fp8_encode(1e6f, HPU_FP8_E4M3), 0x7e);
	hpu__fp8_fake_quant(in, q, 8, 1.0f, HPU_FP8_E5M2);
	assert_true(q[0] == 448.0f && q[1] == 57344.0f && q[2] == -57344.0f);
	assert_true(q[3] == INFINITY && q[4] == -INFINITY && isnan(q[5]));
	assert_int_equal(hpu__fp8_encode(INFINITY, HPU_FP8_E5M2), 0x7c);
	assert_int_equal(hpu__fp8_encode(-1e6f, HPU_FP8_E5M2), 0xfb);
}

static void test_scales(void **state)
{
	(void)state;
	/* 448 / 3 = 149.3: the power of two below is 128 */
	assert_true(hpu__fp8_scale_for(3.0f, HPU_FP8_E4M3, 0) == 128.0f);
	assert_true(hpu__fp8_scale_for(3.0f, HPU_FP8_E4M3, 2) == 32.0f);
	assert_true(hpu__fp8_scale_for(448.0f, HPU_FP8_E4M3, 0) == 1.0f);
	assert_true(hpu__fp8_scale_for(0.001f, HPU_FP8_E5M2, 0) == 0x1p25f);
	assert_true(hpu__fp8_scale_for(0.0f, HPU_FP8_E4M3, 0) == 0.0f);
	assert_true(hpu__fp8_scale_for(INFINITY, HPU_FP8_E4M3, 0) == 0.0f);
	assert_true(hpu__fp8_scale_for(NAN, HPU_FP8_E4M3, 0) == 0.0f);
	/* an amax so small that max / amax overflows: the clamp's 2^100, not
	 * frexpf's exponent of infinity (it gave 2^-1) */
	assert_true(hpu__fp8_scale_for(1e-37f, HPU_FP8_E4M3, 0) == 0x1p100f);
	assert_true(hpu__fp8_scale_for(0x1p-149f, HPU_FP8_E5M2, 3) == 0x1p100f);
	assert_true(hpu__fp8_scale_for(0x1p-120f, HPU_FP8_E4M3, 0) == 0x1p100f);
	assert_true(hpu__fp8_scale_for(0x1p-90f, HPU_FP8_E4M3, 0) == 0x1p98f); /* 448 = 1.75 2^8 */
	/* scaled: x * s fits under max, the read-back is within 2^-4 relative */
	float x[64], q[64];
	rng_seed(5);
	fill(x, 64, -3.0f, 3.0f);
	float amax = hpu__fp8_amax(x, 64), s = hpu__fp8_scale_for(amax, HPU_FP8_E4M3, 0);
	hpu__fp8_fake_quant(x, q, 64, s, HPU_FP8_E4M3);
	for (int i = 0; i < 64; i++) {
		assert_true(fabsf(q[i] - x[i]) <= fabsf(x[i]) * 0x1p-4f + 0x1p-9f / s);
		float back = q[i] * s; /* exactly an fp8 value */
		assert_true(hpu__fp8_decode(hpu__fp8_encode(back, HPU_FP8_E4M3), HPU_FP8_E4M3) ==
			    back);
	}
}

static float bf16r(float v)
{
	return hpu_from_bf16(hpu_to_bf16(v));
}

static double rel_err(const float *a, const float *b, size_t n)
{
	double d = 0, r = 0;
	for (size_t i = 0; i < n; i++) {
		d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		r += (double)b[i] * b[i];
	}
	return sqrt(d / r);
}

enum { B = 16, IN = 48, OUT = 24 };

/* One layer "fc" holding w[OUT, IN] and b[OUT]. */
static float params[OUT * IN + OUT];
#define W params
#define BIAS (params + OUT * IN)

static void fp8_policy(hpu_fp8_mode mode, const hpu_fp8_recipe *r, int lowp)
{
	char err[256];
	unsetenv("LOWER_LIST");
	unsetenv("FP32_LIST");
	if (hpu__autocast_init(lowp, err, sizeof err) < 0)
		fail_msg("%s", err);
	hpu__fp8_set_mode(mode, r);
}

/* fp8 linear against fp32: forward within 6% (E4M3 inputs), backward
 * within 15% (E5M2 gradients, 2 mantissa bits); the calls counted as
 * fp8; outputs are bf16 values. */
static void test_linear_fp8_vs_fp32(void **state)
{
	(void)state;
	float x[B * IN], dy[B * OUT];
	float y32[B * OUT], y8[B * OUT], dx32[B * IN], dx8[B * IN];
	float dw32[OUT * IN] = {0}, dw8[OUT * IN] = {0}, db32[OUT] = {0}, db8[OUT] = {0};
	rng_seed(11);
	fill(x, B * IN, -2.0f, 2.0f);
	fill(params, OUT * IN + OUT, -0.2f, 0.2f);
	fill(dy, B * OUT, -1e-3f, 1e-3f);

	fp8_policy(HPU_FP8_OFF, NULL, HPU_AUTOCAST_NONE);
	hpu_linear_forward(x, W, BIAS, y32, B, IN, OUT);
	hpu_linear_backward(x, W, dy, dx32, dw32, db32, B, IN, OUT);

	fp8_policy(HPU_FP8_TRAIN, NULL, HPU_AUTOCAST_FP8);
	uint64_t n8 = hpu__autocast_count("linear", HPU_AUTOCAST_COUNT_FP8);
	hpu__op_layer(0, "fc", params, OUT * IN + OUT, 0);
	hpu_linear_forward(x, W, BIAS, y8, B, IN, OUT);
	hpu__op_layer(0, "fc", params, OUT * IN + OUT, 1);
	hpu_linear_backward(x, W, dy, dx8, dw8, db8, B, IN, OUT);
	hpu__op_layer(-1, NULL, NULL, 0, 0);
	assert_int_equal(hpu__autocast_count("linear", HPU_AUTOCAST_COUNT_FP8), n8 + 2);

	double ey = rel_err(y8, y32, B * OUT), edx = rel_err(dx8, dx32, B * IN);
	double edw = rel_err(dw8, dw32, OUT * IN);
	print_message("fp8 linear vs fp32: y %.4f, dx %.4f, dw %.4f\n", ey, edx, edw);
	assert_true(ey > 0 && ey < 0.06);
	assert_true(edx > 0 && edx < 0.15);
	assert_true(edw > 0 && edw < 0.15);
	for (int o = 0; o < OUT; o++) /* db: the unquantized sum */
		assert_true(fabsf(db8[o] - db32[o]) <= 1e-6f * (1 + fabsf(db32[o])));
	for (int i = 0; i < B * OUT; i++) { /* bf16 outputs */
		uint32_t u;
		memcpy(&u, &y8[i], 4);
		assert_int_equal(u & 0xffff, 0);
	}
	hpu_fp8_info in;
	assert_int_equal(hpu__fp8_count(), 1);
	assert_int_equal(hpu__fp8_info_get(0, &in), 0);
	assert_string_equal(in.name, "fc/linear#0");
	assert_int_equal(in.used, 2);

	/* Outside a layer, or with a weight that is not the layer's, the call
	 * cannot be found again in backward: bf16, counted so. */
	uint64_t lo = hpu__autocast_count("linear", 1);
	hpu_linear_forward(x, W, BIAS, y8, B, IN, OUT);
	assert_int_equal(hpu__autocast_count("linear", 1), lo + 1);
	static float other_w[OUT * IN];
	memcpy(other_w, W, sizeof other_w);
	hpu__op_layer(0, "fc", params, OUT * IN + OUT, 0);
	hpu_linear_forward(x, other_w, BIAS, y8, B, IN, OUT);
	hpu__op_layer(-1, NULL, NULL, 0, 0);
	assert_int_equal(hpu__autocast_count("linear", 1), lo + 2);
	assert_int_equal(hpu__fp8_count(), 1);
	assert_int_equal(hpu__autocast_count("linear", HPU_AUTOCAST_COUNT_FP8), n8 + 2);
	hpu__fp8_set_mode(HPU_FP8_OFF, NULL);
}

/* One training step's forward on x scaled to amax `a` (one element set
 * to a, the rest small), then the amax reduction's stand-in and roll. */
static float step_with_amax(float a)
{
	float x[B * IN], y[B * OUT];
	for (int i = 0; i < B * IN; i++)
		x[i] = 0.01f * (float)((i % 7) - 3);
	x[5] = a;
	hpu__op_layer(0, "fc", params, OUT * IN + OUT, 0);
	hpu_linear_forward(x, W, BIAS, y, B, IN, OUT);
	hpu__op_layer(-1, NULL, NULL, 0, 0);
	hpu_fp8_info in;
	hpu__fp8_info_get(0, &in);
	size_t n;
	float *amax = hpu__fp8_step_amax(&n);
	assert_int_equal(n, 3);
	assert_true(amax[0] == a);
	assert_true(amax[2] == -1.0f); /* no backward: dy not seen */
	hpu__fp8_roll();
	return in.scale[0]; /* the scale this forward used */
}

static float scale_now(void)
{
	hpu_fp8_info in;
	hpu__fp8_info_get(0, &in);
	return in.scale[0];
}

static void test_delayed_scaling_history(void **state)
{
	(void)state;
	fill(params, OUT * IN + OUT, -0.2f, 0.2f);
	hpu_fp8_recipe r = {.history = 3, .margin = 0, .algo = HPU_FP8_AMAX_MAX};
	fp8_policy(HPU_FP8_TRAIN, &r, HPU_AUTOCAST_FP8);
	/* the first step's scale comes from its own amax */
	assert_true(step_with_amax(3.0f) == 128.0f);
	/* a spike uses the old scale (and saturates), then raises the amax */
	assert_true(step_with_amax(100.0f) == 128.0f);
	assert_true(scale_now() == 4.0f); /* 448 / 100 = 4.48 */
	assert_true(step_with_amax(3.0f) == 4.0f);
	assert_true(step_with_amax(3.0f) == 4.0f);
	assert_true(scale_now() == 4.0f); /* 100 is still one of the last 3 */
	assert_true(step_with_amax(3.0f) == 4.0f);
	/* three steps on, the spike has left the history */
	assert_true(scale_now() == 128.0f);

	r.algo = HPU_FP8_AMAX_MOST_RECENT;
	r.margin = 1;
	fp8_policy(HPU_FP8_TRAIN, &r, HPU_AUTOCAST_FP8);
	assert_true(step_with_amax(3.0f) == 64.0f);
	step_with_amax(100.0f);
	assert_true(scale_now() == 2.0f);
	step_with_amax(3.0f);
	assert_true(scale_now() == 64.0f);
	/* a NaN/inf amax keeps the scale */
	step_with_amax(INFINITY);
	assert_true(scale_now() == 64.0f);
	hpu__fp8_set_mode(HPU_FP8_OFF, NULL);
}

/* More than one rank: the step's amax comes back to the host, is reduced
 * over the ranks there, and the roll puts the reduced values back on the
 * device before it rolls them in: another rank's larger amax of x, and a
 * dy this rank never saw (-1) that another did, set the next scales. */
static void test_reduced_amax_put_back(void **state)
{
	(void)state;
	float x[B * IN], y[B * OUT];
	fill(params, OUT * IN + OUT, -0.2f, 0.2f);
	for (int i = 0; i < B * IN; i++)
		x[i] = 0.01f * (float)((i % 7) - 3);
	x[5] = 3.0f;
	hpu_fp8_recipe r = {.history = 4, .margin = 0, .algo = HPU_FP8_AMAX_MAX};
	fp8_policy(HPU_FP8_TRAIN, &r, HPU_AUTOCAST_FP8);
	hpu__op_layer(0, "fc", params, OUT * IN + OUT, 0);
	hpu_linear_forward(x, W, BIAS, y, B, IN, OUT);
	hpu__op_layer(-1, NULL, NULL, 0, 0);
	size_t n;
	float *amax = hpu__fp8_step_amax(&n);
	assert_int_equal(n, 3);
	assert_true(amax[0] == 3.0f && amax[2] == -1.0f);
	amax[0] = 100.0f; /* the MAX over the ranks */
	amax[2] = 0.5f;
	hpu__fp8_roll();
	hpu_fp8_info in;
	hpu__fp8_info_get(0, &in);
	assert_true(in.scale[0] == 4.0f);      /* 448 / 100 = 4.48, not 448 / 3's 128 */
	assert_true(in.scale[2] == 65536.0f); /* 57344 / 0.5: dy's first scale */
	hpu_fp8_saved sv;
	assert_int_equal(hpu__fp8_saved_get(0, &sv), 0);
	assert_true(sv.hist[0] == 100.0f && sv.hist[2 * 4] == 0.5f);
	assert_int_equal(sv.nhist, 1);
	assert_int_equal(sv.pos, 1);
	/* and the step's pairs were cleared: a step with nothing seen rolls 0s */
	amax = hpu__fp8_step_amax(&n);
	assert_true(amax[0] == -1.0f && amax[1] == -1.0f && amax[2] == -1.0f);
	hpu__fp8_roll();
	hpu__fp8_set_mode(HPU_FP8_OFF, NULL);
}

/* ---- fp8 products on fp8 arithmetic (a GPU's gemm_fp8), on the CPU ----
 *
 * A table with gemm_fp8 and fp8_quant8 makes linear's forward and backward
 * quantize to fp8 bytes (transposed where the product needs K innermost)
 * and multiply those. Here the reference table gets the host's quant8 and
 * a gemm_fp8 in plain C (the bytes decoded, products exact, sums in
 * double, times the two inverse scales): each product must give what the
 * bf16 kernels give on the quantized values (the emulation), within the
 * sums' rounding, over two steps and a roll; wrong operands, transposes,
 * formats or scales would be off by far more. The table declining dw's
 * product, or every product, leaves it to the emulation, and a declined
 * case is not asked again at that call site and batch size. */
static int n_quant8, n_gemm8, n_tried, decline_k = -1, decline_all;

static int t_quant8(const float *x, uint8_t *q, int rows, int cols, int trans, float *sc,
		    int fmt)
{
	n_quant8++;
	return hpu__host_fp8_quant8(x, q, rows, cols, trans, sc, fmt);
}

static int t_gemm8(int m, int n, int k, const uint8_t *a, int fa, const uint8_t *b, int fb,
		   const float *ia, const float *ib, const float *bias, float *c, int accumulate)
{
	n_tried++;
	if (decline_all || k == decline_k)
		return HPU_BE_UNSUPPORTED;
	assert_false(fa == HPU_FP8_E5M2 && fb == HPU_FP8_E5M2);
	n_gemm8++;
	for (int i = 0; i < m; i++)
		for (int j = 0; j < n; j++) {
			double s = 0;
			for (int l = 0; l < k; l++)
				s += (double)hpu__fp8_decode(a[(size_t)i * k + l], fa) *
				     hpu__fp8_decode(b[(size_t)j * k + l], fb);
			float v = (float)(s * *ia * *ib) + (bias ? bias[j] : 0.0f);
			c[(size_t)i * n + j] = accumulate ? c[(size_t)i * n + j] + v : v;
		}
	return HPU_BE_OK;
}

static int bf16_yes(void)
{
	return 1;
}

/* Two steps of fc's forward and backward (dw accumulated over two
 * micro-steps in the second) on table t: y, dx, dw, db of the last into
 * out, in order. */
enum { NOUT = B * OUT + B * IN + OUT * IN + OUT };
static void fc_steps(const hpu__backend *t, float *out)
{
	float x[B * IN], y[B * OUT], dy[B * OUT], dx[B * IN];
	static float dw[OUT * IN], db[OUT];
	rng_seed(23);
	fill(params, OUT * IN + OUT, -0.3f, 0.3f);
	hpu__be_set(t);
	hpu_fp8_recipe r = {.history = 2, .margin = 0, .algo = HPU_FP8_AMAX_MAX};
	fp8_policy(HPU_FP8_TRAIN, &r, HPU_AUTOCAST_FP8);
	for (int step = 0; step < 2; step++) {
		memset(dw, 0, sizeof dw), memset(db, 0, sizeof db);
		for (int micro = 0; micro <= step; micro++) {
			fill(x, B * IN, -2.0f, 2.0f);
			fill(dy, B * OUT, -0.01f, 0.01f);
			hpu__op_layer(0, "fc", params, OUT * IN + OUT, 0);
			hpu_linear_forward(x, W, BIAS, y, B, IN, OUT);
			hpu__op_layer(0, "fc", params, OUT * IN + OUT, 1);
			hpu_linear_backward(x, W, dy, dx, dw, db, B, IN, OUT);
			hpu__op_layer(-1, NULL, NULL, 0, 0);
		}
		hpu__fp8_roll();
	}
	memcpy(out, y, sizeof y), out += B * OUT;
	memcpy(out, dx, sizeof dx), out += B * IN;
	memcpy(out, dw, sizeof dw), out += OUT * IN;
	memcpy(out, db, sizeof db);
	hpu__fp8_set_mode(HPU_FP8_OFF, NULL);
	hpu__be_set(NULL);
}

/* got within the sums' rounding of want: relative to the largest |want|
 * of each part */
static void close_parts(const float *got, const float *want)
{
	static const int len[4] = {B * OUT, B * IN, OUT * IN, OUT};
	static const char *const name[4] = {"y", "dx", "dw", "db"};
	for (int p = 0, o = 0; p < 4; o += len[p++]) {
		double big = 0, err = 0;
		for (int i = 0; i < len[p]; i++) {
			double d = fabs((double)got[o + i] - want[o + i]);
			big = fmax(big, fabs(want[o + i]));
			err = d <= err ? err : d; /* a NaN stays */
		}
		print_message("  %-2s max |diff| %.3g of max |value| %.3g\n", name[p], err, big);
		assert_true(big > 0);
		/* y and dx: rounded to bf16 (2^-8 relative), a sum's last bit
		 * can flip one rounding */
		assert_true(err <= (p < 2 ? 0x1p-7 : 1e-5) * big);
	}
}

static void test_native_products(void **state)
{
	(void)state;
	hpu__backend ref = *hpu__be_reference();
	ref.bf16_native = bf16_yes;
	hpu__backend fp8 = ref;
	fp8.name = "fp8 products";
	fp8.fp8_quant8 = t_quant8;
	fp8.gemm_fp8 = t_gemm8;
	static float want[NOUT], got[NOUT];
	fc_steps(&ref, want);
	n_quant8 = n_gemm8 = 0;
	fc_steps(&fp8, got);
	/* per micro-step: forward x, w; backward dy, w^T, dy^T, x^T */
	print_message("  fp8 products: %d quantizations, %d products\n", n_quant8, n_gemm8);
	assert_int_equal(n_quant8, 3 * 6);
	assert_int_equal(n_gemm8, 3 * 3);
	close_parts(got, want);
	/* dw's product declined (k = B): dx on fp8, dw emulated */
	decline_k = B;
	n_gemm8 = n_tried = 0;
	fc_steps(&fp8, got);
	assert_int_equal(n_gemm8, 3 * 2);
	assert_int_equal(n_tried, 3 * 2 + 1);
	close_parts(got, want);
	decline_k = -1;
	/* every product declined: the emulation's bits */
	decline_all = 1;
	n_tried = 0;
	fc_steps(&fp8, got);
	decline_all = 0;
	assert_int_equal(n_tried, 2); /* the forward's, dx's: once each */
	assert_memory_equal(got, want, sizeof got);
}

/* MEASURE records max |x| of both inputs and the output while on;
 * QUANTIZE with those figures gives the fake-quantized product; a call
 * site without figures is an error naming it. */
static void test_measure_then_quantize(void **state)
{
	(void)state;
	float x[B * IN], y[B * OUT], yq[B * OUT];
	rng_seed(3);
	fill(x, B * IN, -1.5f, 1.0f);
	fill(params, OUT * IN + OUT, -0.3f, 0.3f);
	fp8_policy(HPU_FP8_MEASURE, NULL, HPU_AUTOCAST_NONE);
	hpu__op_layer(0, "fc", params, OUT * IN + OUT, 0);
	hpu_linear_forward(x, W, BIAS, y, B, IN, OUT); /* measuring is off */
	assert_int_equal(hpu__fp8_count(), 0);
	hpu__fp8_measuring(1);
	hpu__op_layer(0, "fc", params, OUT * IN + OUT, 0);
	hpu_linear_forward(x, W, BIAS, y, B, IN, OUT);
	hpu__op_layer(1, "fc2", NULL, 0, 0);
	float y2[B * IN];
	hpu_matmul(y, W, y2, B, IN, OUT, 0, 0, 0); /* [B,OUT] x [OUT,IN] */
	hpu__op_layer(-1, NULL, NULL, 0, 0);
	assert_int_equal(hpu__fp8_count(), 2);
	hpu_fp8_info in;
	hpu__fp8_info_get(0, &in);
	assert_string_equal(in.name, "fc/linear#0");
	assert_true(in.maxabs[0] == hpu__fp8_amax(x, B * IN));
	assert_true(in.maxabs[1] == hpu__fp8_amax(W, OUT * IN));
	assert_true(in.maxabs[2] == hpu__fp8_amax(y, B * OUT));
	float m[3];
	memcpy(m, in.maxabs, sizeof m);
	hpu__fp8_info_get(1, &in);
	assert_string_equal(in.name, "fc2/matmul#0");

	fp8_policy(HPU_FP8_QUANTIZE, NULL, HPU_AUTOCAST_NONE);
	assert_int_equal(hpu__fp8_preload("fc/linear#0", m, 1), 0);
	hpu__op_layer(0, "fc", params, OUT * IN + OUT, 0);
	hpu_linear_forward(x, W, BIAS, yq, B, IN, OUT);
	assert_null(hpu__fp8_error());
	/* by hand: E4M3 x and w at the maxabs scales, fp32 GEMM, bf16 out */
	float qx[B * IN], qw[OUT * IN];
	hpu__fp8_fake_quant(x, qx, B * IN, hpu__fp8_scale_for(m[0], HPU_FP8_E4M3, 0),
			   HPU_FP8_E4M3);
	hpu__fp8_fake_quant(W, qw, OUT * IN, hpu__fp8_scale_for(m[1], HPU_FP8_E4M3, 0),
			   HPU_FP8_E4M3);
	char err[256];
	hpu__autocast_init(HPU_AUTOCAST_NONE, err, sizeof err);
	hpu__fp8_set_mode(HPU_FP8_OFF, NULL);
	float want[B * OUT], b16[OUT];
	for (int o = 0; o < OUT; o++) /* the bias in bf16 */
		b16[o] = bf16r(BIAS[o]);
	hpu_linear_forward(qx, qw, b16, want, B, IN, OUT);
	for (int i = 0; i < B * OUT; i++)
		assert_true(yq[i] == bf16r(want[i]));
	assert_true(rel_err(yq, y, B * OUT) < 0.06);

	/* a layer the figures do not know */
	hpu__fp8_set_mode(HPU_FP8_QUANTIZE, NULL);
	assert_int_equal(hpu__fp8_preload("fc/linear#0", m, 1), 0);
	hpu__op_layer(7, "other", NULL, 0, 0);
	uint64_t fp32 = hpu__autocast_count("linear", 0);
	hpu_linear_forward(x, W, BIAS, yq, B, IN, OUT);
	assert_non_null(hpu__fp8_error());
	assert_non_null(strstr(hpu__fp8_error(), "other/linear#0"));
	assert_int_equal(hpu__autocast_count("linear", 0), fp32 + 1); /* ran in fp32 */
	/* blocklisted: runs unquantized */
	hpu__fp8_set_mode(HPU_FP8_QUANTIZE, NULL);
	assert_int_equal(hpu__fp8_preload("fc/linear#0", m, 0), 0);
	hpu__op_layer(0, "fc", params, OUT * IN + OUT, 0);
	hpu_linear_forward(x, W, BIAS, yq, B, IN, OUT);
	assert_null(hpu__fp8_error());
	assert_memory_equal(yq, y, sizeof y);
	hpu__op_layer(-1, NULL, NULL, 0, 0);
	hpu__fp8_set_mode(HPU_FP8_OFF, NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decode_known_values),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_round_to_nearest_even),
		cmocka_unit_test(test_saturation_and_specials),
		cmocka_unit_test(test_scales),
		cmocka_unit_test(test_linear_fp8_vs_fp32),
		cmocka_unit_test(test_delayed_scaling_history),
		cmocka_unit_test(test_reduced_amax_put_back),
		cmocka_unit_test(test_native_products),
		cmocka_unit_test(test_measure_then_quantize),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
