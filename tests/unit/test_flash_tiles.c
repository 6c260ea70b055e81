/* test_flash_tiles: fused attention's tensor-core tiles (worker/ops/
 * flash_tiles.h, what cuops_flash16.cu's kernels run a block a tile, the
 * products on WMMA) run on the CPU: every block of every tile one after
 * another, each step's threads in turn, the products in fp32 loops.
 * Against the attention layer's unfused math in double (attn_ref.c) on
 * the same bf16 inputs, within bf16's tolerance (P and dS are rounded to
 * bf16 for their products); exact zeros for a query with no key and for
 * a padding key's dk and dv; shapes across tiles (T 1 to 200: partial
 * tiles, causal tiles skipped), every head size the tiles take (16 to
 * 128), key masks with padding, a sample all padding; the rounding
 * against common/lowp.h's bit for bit; the head sizes refused. On every
 * machine: the tiles' arithmetic, bounds and masks are checked here,
 * the GPU's fragments by test_cuda_ops_more's test_flash16. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/attn_ref.h"
#include "worker/ops/flash_tiles.h"
#include "common/lowp.h"

#define TOL16 1e-2

static uint64_t rng = 0x243f6a8885a308d3ull;

static float frand(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return (float)((rng * 0x2545f4914f6cdd1dull) >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);
	assert_non_null(p);
	return p;
}

static float round16(float f)
{
	return hpu_from_bf16(hpu_to_bf16(f));
}

/* Largest |got - want| over the largest |want|; fails above TOL16. */
static void check(const char *what, const float *got, const double *want, size_t n)
{
	double top = 1e-6, worst = 0;
	size_t at = 0;
	for (size_t i = 0; i < n; i++)
		top = fabs(want[i]) > top ? fabs(want[i]) : top;
	for (size_t i = 0; i < n; i++) {
		double e = isnan(got[i]) ? INFINITY : fabs((double)got[i] - want[i]);
		if (e > worst)
			worst = e, at = i;
	}
	printf("  %-40s max diff %.3g of %.3g (at %zu: %.7g, want %.7g)\n", what, worst, top, at,
	       (double)got[at], want[at]);
	assert_true(worst <= TOL16 * top);
}

typedef struct shape {
	int batch, t, heads, hd, causal;
	const int32_t *mask;
} shape;

static void one(const shape *s)
{
	const size_t d = (size_t)s->heads * s->hd, bt = (size_t)s->batch * s->t;
	const size_t nq = bt * 3 * d, no = bt * d, nl = (size_t)s->batch * s->heads * s->t;
	float *qkv = xcalloc(nq, 4), *ctx = xcalloc(no, 4), *lse = xcalloc(nl, 4);
	float *dctx = xcalloc(no, 4), *dqkv = xcalloc(nq, 4);
	double *rctx = xcalloc(no, 8), *rlse = xcalloc(nl, 8), *rdqkv = xcalloc(nq, 8);
	/* bf16 values, as autocast hands them over */
	for (size_t i = 0; i < nq; i++)
		qkv[i] = round16(2.0f * frand());
	for (size_t i = 0; i < no; i++)
		dctx[i] = round16(frand());
	for (size_t i = 0; i < nq; i++)
		dqkv[i] = NAN;
	for (size_t i = 0; i < no; i++)
		ctx[i] = NAN;
	for (size_t i = 0; i < nl; i++)
		lse[i] = NAN;
	attn_ref(qkv, s->mask, dctx, s->batch, s->t, s->heads, s->hd, s->causal, rctx, rlse,
		 rdqkv);
	hpu__flash_dims a = {s->batch, s->t, s->heads, s->hd, s->causal,
			     1.0f / sqrtf((float)s->hd)};
	float *delta = xcalloc(nl, 4);
	assert_int_equal(hpu__ft_run_c(&a, qkv, s->mask, ctx, lse, dctx, delta, dqkv), 0);
	free(delta);
	char what[96];
	snprintf(what, sizeof what, "ctx B%d T%d h%d hd%d c%d m%d", s->batch, s->t, s->heads,
		 s->hd, s->causal, s->mask != NULL);
	check(what, ctx, rctx, no);
	snprintf(what, sizeof what, "lse B%d T%d h%d hd%d c%d m%d", s->batch, s->t, s->heads,
		 s->hd, s->causal, s->mask != NULL);
	check(what, lse, rlse, nl);
	snprintf(what, sizeof what, "dqkv B%d T%d h%d hd%d c%d m%d", s->batch, s->t, s->heads,
		 s->hd, s->causal, s->mask != NULL);
	check(what, dqkv, rdqkv, nq);
	/* a query with no key: zeros in ctx and dq; a padding key: in dk and dv */
	int empties, pads;
	assert_int_equal(attn_zeros_wrong(ctx, dqkv, s->mask, s->batch, s->t, d, s->causal,
					  &empties, &pads),
			 0);
	if (empties || pads)
		printf("  %d query rows with no key, %d padding keys: exact zeros\n", empties, pads);
	free(qkv), free(ctx), free(lse), free(dctx), free(dqkv);
	free(rctx), free(rlse), free(rdqkv);
}

static void test_tiles(void **state)
{
	(void)state;
	int32_t *m200 = xcalloc(2 * 200, 4);
	for (int i = 0; i < 2 * 200; i++)
		m200[i] = i % 200 < 180 && i % 17 != 5;
	/* a key tile's first or second half all padding (a row's half maximum
	 * -inf while the other half's is not), sample 1 only keys 32..63 */
	int32_t *half = xcalloc(2 * 128, 4);
	for (int i = 0; i < 128; i++) {
		half[i] = (i / 32) % 2;
		half[128 + i] = i >= 32 && i < 64;
	}
	const shape shapes[] = {
		{1, 9, 2, 16, 1, NULL},   /* one partial tile */
		{1, 9, 2, 32, 0, NULL},
		{2, 7, 3, 64, 1, attn_mask7},  /* query 0 of sample 0 has no key */
		{2, 7, 3, 64, 0, attn_mask7},
		{3, 13, 2, 48, 0, attn_mask13}, /* a sample all padding */
		{3, 13, 1, 64, 1, attn_mask13},
		{2, 1, 1, 16, 1, NULL},   /* T 1 */
		{1, 64, 2, 64, 1, NULL},  /* one whole tile */
		{1, 65, 1, 64, 1, NULL},  /* one row into the second */
		{1, 130, 2, 32, 0, NULL}, /* three tiles, not causal */
		{1, 150, 1, 128, 1, NULL},
		{2, 200, 2, 64, 1, m200}, /* masks across tiles */
		{2, 200, 1, 80, 0, m200},
		{2, 128, 1, 64, 0, half}, /* half tiles padding */
		{2, 128, 2, 32, 1, half},
	};
	for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
		one(&shapes[k]);
	/* again with each step's threads, and warps, run in the other orders
	 * (new inputs, the same bound): a step reading what another thread of
	 * it writes, which a GPU runs at once, would go wrong in one */
	for (hpu__ft_c_order = 1; hpu__ft_c_order <= 2; hpu__ft_c_order++) {
		printf("  threads %s:\n", hpu__ft_c_order == 1 ? "descending" : "shuffled");
		for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
			one(&shapes[k]);
	}
	hpu__ft_c_order = 0;
	free(m200);
	free(half);
}

/* The tiles round as common/lowp.h (ties to even, NaN kept quiet): the
 * bits of every float whose upper half is one of a spread of values, each
 * with a tie, above and below it. */
static void test_rounding(void **state)
{
	(void)state;
	static const uint32_t lows[] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff};
	size_t n = 0;
	for (uint32_t hi = 0; hi < 0x10000; hi += 7)
		for (size_t k = 0; k < sizeof lows / sizeof *lows; k++) {
			uint32_t u = hi << 16 | lows[k];
			float f;
			memcpy(&f, &u, 4);
			assert_int_equal(hpu__ft_bf16(f), hpu_to_bf16(f));
			assert_true(hpu__ft_f32(hpu__ft_bf16(f)) == hpu_from_bf16(hpu_to_bf16(f)) ||
				    isnan(f));
			n++;
		}
	printf("  %zu floats round as hpu_to_bf16\n", n);
}

/* Head sizes: multiples of 16 up to 128; the shared memory a block asks. */
static void test_head_sizes(void **state)
{
	(void)state;
	static const int yes[] = {16, 32, 48, 64, 80, 96, 112, 128};
	static const int no[] = {0, -16, 1, 8, 24, 65, 144, 160};
	for (size_t k = 0; k < sizeof yes / sizeof *yes; k++)
		assert_true(hpu__ft_hd_ok(yes[k]));
	for (size_t k = 0; k < sizeof no / sizeof *no; k++)
		assert_false(hpu__ft_hd_ok(no[k]));
	printf("  shared memory at hd 64: forward %zu, dq %zu, dk %zu, dv %zu bytes\n",
	       hpu__ft_layout(HPU_FT_FWD, 64, NULL, NULL), hpu__ft_layout(HPU_FT_DQ, 64, NULL, NULL),
	       hpu__ft_layout(HPU_FT_DK, 64, NULL, NULL), hpu__ft_layout(HPU_FT_DV, 64, NULL, NULL));
	/* at hd 64 (GPT-2's) two dq or dk blocks and three forward or dv
	 * blocks fit an H100's SM (228 KB, 1 KB of it each block's); every
	 * block within its 227 KB at every head size the tiles take */
	assert_true(2 * (hpu__ft_layout(HPU_FT_DK, 64, NULL, NULL) + 128 + 1024) <= 228 * 1024);
	assert_true(2 * (hpu__ft_layout(HPU_FT_DQ, 64, NULL, NULL) + 128 + 1024) <= 228 * 1024);
	assert_true(3 * (hpu__ft_layout(HPU_FT_DV, 64, NULL, NULL) + 128 + 1024) <= 228 * 1024);
	assert_true(3 * (hpu__ft_layout(HPU_FT_FWD, 64, NULL, NULL) + 128 + 1024) <= 228 * 1024);
	for (int blk = HPU_FT_FWD; blk <= HPU_FT_DV; blk++)
		assert_true(hpu__ft_layout(blk, HPU_FT_MAX_HD, NULL, NULL) + 128 <= 227 * 1024);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tiles),
		cmocka_unit_test(test_rounding),
		cmocka_unit_test(test_head_sizes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
