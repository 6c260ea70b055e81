/* The one bf16/fp16 conversion (common/lowp.h) against a reference
 * computed in double, and the two places that round with it against each
 * other: the collectives' reduction kernels (hpucoll__reduce and
 * hpucoll__divide in libhpucoll) and the worker's autocast rounding
 * (hpu__ac_round_inplace, on the CPU's F16C instructions where it has
 * them).
 *
 * The rule: round to nearest, ties to even; below the smallest subnormal
 * by half or less: zero; from the largest finite value plus half an ulp
 * on (65520 for fp16): infinity; a NaN stays a NaN, quiet, with its sign
 * and the top bits of its payload. Widening is exact. Every fp16 and bf16
 * value is checked, and the f32 values around each of them (the value,
 * the midpoint to the next one -- a tie --, and the f32 neighbours of
 * both), and f32 bit patterns across the whole range. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/ops/autocast.h"
#include "collectives/comm_internal.h"
#include "hpu/ops.h"
#include "common/lowp.h"
#include "common/simd.h"

static uint32_t bits(float f)
{
	return hpu__f32_bits(f);
}

/* ---- the reference, in double ---- */

static double ref_from_fp16(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 0x3ff;
	double v = e == 31 ? (m ? NAN : INFINITY)
		   : e     ? ldexp(m | 0x400, e - 25)
			   : ldexp(m, -24);
	return h & 0x8000 ? -v : v;
}

/* Rounds |a| (exact in double) to nearest even with mb mantissa bits,
 * exponent bias bias, normal from 2^emin: the bits without the sign.
 * rint() rounds ties to even in the default rounding mode. */
static uint32_t ref_round(double a, int mb, int bias, int emin, uint32_t inf)
{
	if (a < ldexp(1, emin))
		return (uint32_t)rint(ldexp(a, mb - emin)); /* 1 << mb: the smallest normal */
	int ex;
	frexp(a, &ex);
	uint32_t r = ((uint32_t)(ex - 1 + bias) << mb) + (uint32_t)rint(ldexp(a, mb - ex + 1)) -
		     (1u << mb);
	return r > inf ? inf : r;
}

static uint16_t ref_to_fp16(float f)
{
	uint32_t x = bits(f), sign = (x >> 16) & 0x8000;
	if (isnan(f))
		return (uint16_t)(sign | 0x7e00 | ((x >> 13) & 0x3ff));
	if (fabs((double)f) >= 65520.0)
		return (uint16_t)(sign | 0x7c00);
	return (uint16_t)(sign | ref_round(fabs((double)f), 10, 15, -14, 0x7c00));
}

static uint16_t ref_to_bf16(float f)
{
	uint32_t x = bits(f), sign = (x >> 16) & 0x8000;
	if (isnan(f))
		return (uint16_t)((x >> 16) | 0x40);
	if (isinf(f))
		return (uint16_t)(sign | 0x7f80);
	return (uint16_t)(sign | ref_round(fabs((double)f), 7, 127, -126, 0x7f80));
}

/* ---- the f32 values checked ---- */

struct set {
	float *v;
	size_t n, cap;
};

static void add(struct set *s, float f)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? 2 * s->cap : 1 << 16;
		s->v = realloc(s->v, s->cap * sizeof *s->v);
		assert_non_null(s->v);
	}
	s->v[s->n++] = f;
}

/* Both signs of: every finite value of the format (from(h)), the
 * midpoint to the next one up (for the largest: to the first value that
 * would overflow, `top`), and the f32 neighbours of both. */
static void around(struct set *s, float (*from)(uint16_t), uint16_t inf, double top)
{
	for (uint16_t h = 0; h < inf; h++) {
		float v = from(h);
		double next = h + 1 < inf ? from((uint16_t)(h + 1)) : top;
		float mid = (float)((v + next) / 2); /* exact: one more bit */
		float p[6] = {v, nextafterf(v, 0), nextafterf(v, INFINITY),
			      mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
		for (int k = 0; k < 6; k++) {
			add(s, p[k]);
			add(s, -p[k]);
		}
	}
}

/* f32 bit patterns across the whole range (NaNs, infinities, f32
 * subnormals included), a step that is no power of two apart. */
static void spread(struct set *s)
{
	for (uint64_t x = 0; x <= 0xffffffffu; x += 4099)
		add(s, hpu__bits_f32((uint32_t)x));
	float edge[] = {65504, 65519.99609375f, 65520, 65536, 1e30f, INFINITY, 0x1p-25f,
			0x1.000002p-25f, 0x1p-24f, 0x1.8p-24f, 0x1p-14f, 0x1.ff8p-15f, 0x1p-149f,
			0x1.fffffep127f, 0x1.ff8p127f};
	for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
		add(s, edge[i]);
		add(s, -edge[i]);
	}
	add(s, hpu__bits_f32(0x7f800001)); /* signalling NaNs */
	add(s, hpu__bits_f32(0xffa01234));
}

/* ---- fp16 ---- */

/* Every fp16 value widens exactly, NaNs quieted; narrowing gives it back. */
static void test_fp16_widen(void **state)
{
	(void)state;
	long bad = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = hpu_from_fp16((uint16_t)h);
		double want = ref_from_fp16((uint16_t)h);
		int ok = isnan(want) ? isnan(f) && (bits(f) & 0x400000) &&
					       ((bits(f) >> 13) & 0x1ff) == (h & 0x1ff) &&
					       (bits(f) >> 31) == (h >> 15)
				     : (double)f == want && !signbit(f) == !signbit(want);
		uint16_t back = hpu_to_fp16(f);
		ok &= back == (isnan(want) ? (h | 0x200) : h);
		if (!ok && bad++ < 5)
			printf("  fp16 %#06x: widened %a (%#010x), back %#06x\n", h, f, bits(f), back);
	}
	printf("  65536 fp16 values widened and narrowed back: %ld wrong\n", bad);
	assert_int_equal(bad, 0);
}

static long narrow_fp16(const struct set *s)
{
	long bad = 0;
	for (size_t i = 0; i < s->n; i++) {
		uint16_t got = hpu_to_fp16(s->v[i]), want = ref_to_fp16(s->v[i]);
		if (got != want && bad++ < 5)
			printf("  %a (%#010x): fp16 %#06x, want %#06x\n", s->v[i], bits(s->v[i]), got,
			       want);
	}
	return bad;
}

/* The f32 values around every fp16 value and across the range. */
static void test_fp16_narrow(void **state)
{
	(void)state;
	struct set s = {0};
	around(&s, hpu_from_fp16, 0x7c00, 65536.0);
	spread(&s);
	long bad = narrow_fp16(&s);
	printf("  %zu f32 values to fp16: %ld wrong\n", s.n, bad);
	assert_int_equal(bad, 0);
	/* the rule, spelled out on a few */
	assert_int_equal(hpu_to_fp16(1.0f + 0x1p-11f), 0x3c00);         /* tie: even, down */
	assert_int_equal(hpu_to_fp16(1.0f + 0x3p-11f), 0x3c02);         /* tie: even, up */
	assert_int_equal(hpu_to_fp16(0x1p-25f), 0x0000);                /* tie with 0 */
	assert_int_equal(hpu_to_fp16(0x1.8p-24f), 0x0002);              /* subnormal tie */
	assert_int_equal(hpu_to_fp16(-0x1.000002p-25f), 0x8001);        /* over half: up */
	assert_int_equal(hpu_to_fp16(65519.99609375f), 0x7bff);         /* largest finite */
	assert_int_equal(hpu_to_fp16(65520.0f), 0x7c00);                /* overflow */
	assert_int_equal(hpu_to_fp16(-INFINITY), 0xfc00);
	assert_int_equal(hpu_to_fp16(hpu__bits_f32(0xff802000)), 0xfe01); /* quieted, payload */
	free(s.v);
}

/* The F16C array conversions give the scalar's bits, every input. */
static void test_fp16_f16c(void **state)
{
	(void)state;
	if (!hpu_have_f16c()) {
		printf("  no F16C on this CPU: the scalar conversion serves alone\n");
		return;
	}
	static uint16_t h[65536];
	static float f[65536];
	for (uint32_t i = 0; i < 65536; i++)
		h[i] = (uint16_t)i;
	hpu__f16c_from_fp16(f, h, 65536);
	long bad = 0;
	for (uint32_t i = 0; i < 65536; i++)
		bad += bits(f[i]) != bits(hpu_from_fp16(h[i]));
	struct set s = {0};
	around(&s, hpu_from_fp16, 0x7c00, 65536.0);
	spread(&s);
	uint16_t *o = malloc(s.n * sizeof *o);
	float *rr = malloc(s.n * sizeof *rr);
	assert_true(o && rr);
	hpu__f16c_to_fp16(o, s.v, s.n);
	hpu__f16c_round_fp16(rr, s.v, s.n);
	for (size_t i = 0; i < s.n; i++) {
		uint16_t want = hpu_to_fp16(s.v[i]);
		int ok = o[i] == want && bits(rr[i]) == bits(hpu_from_fp16(want));
		if (!ok && bad++ < 5)
			printf("  %#010x: F16C %#06x, scalar %#06x\n", bits(s.v[i]), o[i], want);
	}
	printf("  F16C and scalar: 65536 widened, %zu narrowed: %ld differ\n", s.n, bad);
	assert_int_equal(bad, 0);
	free(o);
	free(rr);
	free(s.v);
}

/* ---- bf16 ---- */

static void test_bf16(void **state)
{
	(void)state;
	long bad = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = hpu_from_bf16((uint16_t)h);
		int nan = (h & 0x7fff) > 0x7f80;
		uint16_t back = hpu_to_bf16(f);
		if ((bits(f) != h << 16 || back != (nan ? (h | 0x40) : h)) && bad++ < 5)
			printf("  bf16 %#06x: widened %#010x, back %#06x\n", h, bits(f), back);
	}
	struct set s = {0};
	around(&s, hpu_from_bf16, 0x7f80, 0x1p128);
	spread(&s);
	for (size_t i = 0; i < s.n; i++) {
		uint16_t got = hpu_to_bf16(s.v[i]), want = ref_to_bf16(s.v[i]);
		if (got != want && bad++ < 5)
			printf("  %a (%#010x): bf16 %#06x, want %#06x\n", s.v[i], bits(s.v[i]), got,
			       want);
	}
	printf("  65536 bf16 values and %zu f32 values: %ld wrong\n", s.n, bad);
	assert_int_equal(bad, 0);
	assert_int_equal(hpu_to_bf16(1.0f + 0x1p-8f), 0x3f80);  /* tie: even, down */
	assert_int_equal(hpu_to_bf16(1.0f + 0x3p-8f), 0x3f82);  /* tie: even, up */
	assert_int_equal(hpu_to_bf16(0x1.ff8p127f), 0x7f80);    /* overflow */
	assert_int_equal(hpu_to_bf16(0x1p-134f), 0x0000);       /* tie with 0 */
	assert_int_equal(hpu_to_bf16(0x1.8p-133f), 0x0002);     /* subnormal tie */
	assert_int_equal(hpu_to_bf16(hpu__bits_f32(0x7f800001)), 0x7fc0);
	free(s.v);
}

/* ---- the collectives and the worker round alike ---- */

static uint32_t rnd(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(*s >> 33);
}

/* A random finite value of the format (its exponent field below inf). */
static uint16_t any_finite(uint64_t *s, uint16_t expmask)
{
	uint16_t h;
	do
		h = (uint16_t)rnd(s);
	while ((h & expmask) == expmask);
	return h;
}

enum { PAIRS = 1 << 16 };

/* Pairs a, b whose f32 sums are: ties (b is half an ulp of a, when that
 * is a value of the format), sums that cancel into subnormals, sums that
 * overflow, and random ones, a few of them NaNs. */
static void pairs(uint16_t *a, uint16_t *b, int fp16, uint64_t *s)
{
	uint16_t expmask = fp16 ? 0x7c00 : 0x7f80;
	int mb = fp16 ? 10 : 7;
	float (*from)(uint16_t) = fp16 ? hpu_from_fp16 : hpu_from_bf16;
	uint16_t (*to)(float) = fp16 ? hpu_to_fp16 : hpu_to_bf16;
	for (int i = 0; i < PAIRS; i++) {
		a[i] = any_finite(s, expmask);
		switch (i % 4) {
		case 0: { /* half an ulp of a: a tie, either way */
			int ex;
			frexpf(from(a[i]), &ex);
			float half = ldexpf(1, ex - 2 - mb);
			b[i] = to(rnd(s) & 1 ? half : -half);
			break;
		}
		case 1: /* the next value down or up: cancels to one ulp */
			b[i] = (uint16_t)((a[i] ^ 0x8000) + (rnd(s) & 1 ? 1 : -1));
			b[i] = (b[i] & expmask) == expmask ? a[i] : b[i];
			break;
		case 2: /* near the top: may overflow */
			a[i] = (uint16_t)((a[i] & 0x8000) | (expmask - 1 - (rnd(s) & 0xff)));
			b[i] = (uint16_t)((a[i] & 0x8000) | (expmask - 1 - (rnd(s) & 0x3ff)));
			break;
		default: /* now and then a NaN, signalling or quiet, any payload */
			b[i] = any_finite(s, expmask);
			if (i % 64 == 3)
				a[i] = (uint16_t)(a[i] | expmask | (1 + rnd(s) % (0x7fffu & ~expmask)));
		}
	}
}

/* dst (the collectives' result) against x (the f32 values the worker
 * rounds, rounded by hpu__ac_round_inplace): the same bits. Counts the
 * ties and subnormal results among them. */
static long compare(const char *what, const uint16_t *dst, float *x, int fp16, long *ties,
		    long *subs)
{
	float (*from)(uint16_t) = fp16 ? hpu_from_fp16 : hpu_from_bf16;
	uint16_t expmask = fp16 ? 0x7c00 : 0x7f80;
	float *exact = malloc(PAIRS * sizeof *exact);
	assert_non_null(exact);
	memcpy(exact, x, PAIRS * sizeof *x);
	hpu__ac_round_inplace(x, PAIRS, fp16 ? HPU_AUTOCAST_FP16 : HPU_AUTOCAST_BF16);
	long bad = 0;
	for (int i = 0; i < PAIRS; i++) {
		float lo = from(dst[i]);
		if (bits(lo) != bits(x[i]) && bad++ < 5)
			printf("  %s: %a: collectives %#06x (%#010x), worker %#010x\n", what,
			       exact[i], dst[i], bits(lo), bits(x[i]));
		/* a tie: exactly between the two neighbours of the result */
		uint16_t h = dst[i];
		if ((h & expmask) != expmask && exact[i] != lo && isfinite(exact[i])) {
			uint16_t other = exact[i] > lo ? (uint16_t)(h + (h & 0x8000 ? -1 : 1))
						       : (uint16_t)(h + (h & 0x8000 ? 1 : -1));
			if ((double)exact[i] * 2 == (double)lo + from(other))
				(*ties)++;
		}
		*subs += (h & expmask) == 0 && (h & 0x7fff) != 0;
	}
	free(exact);
	return bad;
}

static void same_rounding(int fp16)
{
	hpucoll_dtype dt = fp16 ? HPUCOLL_F16 : HPUCOLL_BF16;
	float (*from)(uint16_t) = fp16 ? hpu_from_fp16 : hpu_from_bf16;
	const char *name = fp16 ? "f16" : "bf16";
	uint16_t *a = malloc(PAIRS * 2), *b = malloc(PAIRS * 2), *d = malloc(PAIRS * 2);
	float *x = malloc(PAIRS * sizeof *x);
	assert_true(a && b && d && x);
	uint64_t seed = 17;
	long ties = 0, subs = 0, bad;
	char what[64];

	pairs(a, b, fp16, &seed);
	hpucoll__reduce(dt, HPUCOLL_SUM, d, a, b, PAIRS);
	for (int i = 0; i < PAIRS; i++)
		x[i] = from(a[i]) + from(b[i]);
	snprintf(what, sizeof what, "%s sum", name);
	bad = compare(what, d, x, fp16, &ties, &subs);
	/* AVG's division: halves of odd subnormals are ties too */
	uint16_t sub = fp16 ? 0x83ff : 0x807f; /* the sign and the mantissa */
	for (int by = 2; by <= 3; by++) {
		for (int i = 0; i < PAIRS; i++)
			d[i] = i % 2 ? a[i] : (uint16_t)(a[i] & sub); /* half of them subnormal */
		for (int i = 0; i < PAIRS; i++)
			x[i] = from(d[i]) / (float)by;
		hpucoll__divide(dt, d, PAIRS, by);
		snprintf(what, sizeof what, "%s avg over %d", name, by);
		bad += compare(what, d, x, fp16, &ties, &subs);
	}
	printf("  %s: %d sums and %d quotients, %ld ties, %ld subnormal results: %ld differ\n",
	       name, PAIRS, 2 * PAIRS, ties, subs, bad);
	assert_int_equal(bad, 0);
	/* the cases were there to be rounded */
	assert_true(ties > PAIRS / 8);
	assert_true(subs > PAIRS / 8);
	free(a);
	free(b);
	free(d);
	free(x);
}

static void test_same_rounding_fp16(void **state)
{
	(void)state;
	same_rounding(1);
}

static void test_same_rounding_bf16(void **state)
{
	(void)state;
	same_rounding(0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fp16_widen),
		cmocka_unit_test(test_fp16_narrow),
		cmocka_unit_test(test_fp16_f16c),
		cmocka_unit_test(test_bf16),
		cmocka_unit_test(test_same_rounding_fp16),
		cmocka_unit_test(test_same_rounding_bf16),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
