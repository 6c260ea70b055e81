/* test_flash_rows: fused (flash-style) attention's rows
 * (worker/ops/flash_rows.h, what the CUDA kernels of cuops_flash.cu run
 * one thread a row) against the attention layer's unfused math in double
 * (attn_ref.c), on every machine: the host table's entries
 * (hpu__be_host()->flash_fwd/bwd, ops_flash.c) run the same row
 * functions over every row. Forward ctx and lse, backward dqkv; causal
 * and not, key masks with padding in the middle, a query row with no key
 * (exact zeros), a sample all padding, odd T, hd 64 and 24 and 1, batch
 * 1; and the public ops (hpu_attention_fused_*) on the CPU's own table.
 * Each check prints its largest difference relative to the array's
 * largest value. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/unit/attn_ref.h"
#include "worker/ops/backend.h"
#include "worker/ops/flash_rows.h"

#include "hpu/ops.h"

#define TOL 2e-5

static uint64_t rng = 0x9e3779b97f4a7c15ull;

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

/* Largest |got - want| over the largest |want| (at least 1e-6); fails
 * above TOL, naming what and where. */
static void check(const char *what, const float *got, const double *want, size_t n)
{
	double top = 1e-6, worst = 0;
	size_t at = 0;
	for (size_t i = 0; i < n; i++)
		top = fabs(want[i]) > top ? fabs(want[i]) : top;
	for (size_t i = 0; i < n; i++) {
		double e = fabs((double)got[i] - want[i]);
		if (isnan(got[i]))
			e = INFINITY;
		if (e > worst)
			worst = e, at = i;
	}
	printf("  %-44s max diff %.3g of %.3g (at %zu: %.9g, want %.9g)\n", what, worst, top, at,
	       n ? (double)got[at] : 0.0, n ? want[at] : 0.0);
	assert_true(worst <= TOL * top);
}

typedef struct shape {
	int batch, t, heads, hd, causal;
	const int32_t *mask; /* [batch * t] or NULL */
} shape;

/* Runs one shape through fwd and bwd (the host table's, or the public
 * ops when ops) and checks ctx, lse, dqkv and the empty rows' zeros. */
static void one(const shape *s, int ops)
{
	const size_t d = (size_t)s->heads * s->hd, bt = (size_t)s->batch * s->t;
	const size_t nq = bt * 3 * d, no = bt * d, nl = (size_t)s->batch * s->heads * s->t;
	float *qkv = xcalloc(nq, 4), *ctx = xcalloc(no, 4), *lse = xcalloc(nl, 4);
	float *dctx = xcalloc(no, 4), *dqkv = xcalloc(nq, 4);
	double *rctx = xcalloc(no, 8), *rlse = xcalloc(nl, 8), *rdqkv = xcalloc(nq, 8);
	for (size_t i = 0; i < nq; i++)
		qkv[i] = 2.0f * frand();
	for (size_t i = 0; i < no; i++)
		dctx[i] = frand();
	for (size_t i = 0; i < nq; i++) /* not written: NaN */
		dqkv[i] = NAN;
	for (size_t i = 0; i < no; i++)
		ctx[i] = NAN;
	attn_ref(qkv, s->mask, dctx, s->batch, s->t, s->heads, s->hd, s->causal, rctx, rlse,
		 rdqkv);
	const hpu__backend *host = hpu__be_host();
	if (ops) {
		assert_int_equal(hpu_attention_fused_forward(qkv, s->mask, ctx, lse, s->batch,
							     s->t, s->heads, s->hd, s->causal),
				 HPU_OK);
		assert_int_equal(hpu_attention_fused_backward(qkv, s->mask, ctx, lse, dctx, dqkv,
							      s->batch, s->t, s->heads, s->hd,
							      s->causal),
				 HPU_OK);
	} else {
		assert_int_equal(host->flash_fwd(qkv, s->mask, ctx, lse, s->batch, s->t, s->heads,
						 s->hd, s->causal),
				 HPU_BE_OK);
		assert_int_equal(host->flash_bwd(qkv, s->mask, ctx, lse, dctx, dqkv, s->batch,
						 s->t, s->heads, s->hd, s->causal),
				 HPU_BE_OK);
	}
	char what[96];
	const char *how = ops ? "ops" : "rows";
	snprintf(what, sizeof what, "%s ctx B%d T%d h%d hd%d c%d m%d", how, s->batch, s->t,
		 s->heads, s->hd, s->causal, s->mask != NULL);
	check(what, ctx, rctx, no);
	snprintf(what, sizeof what, "%s lse B%d T%d h%d hd%d c%d m%d", how, s->batch, s->t,
		 s->heads, s->hd, s->causal, s->mask != NULL);
	check(what, lse, rlse, nl);
	snprintf(what, sizeof what, "%s dqkv B%d T%d h%d hd%d c%d m%d", how, s->batch, s->t,
		 s->heads, s->hd, s->causal, s->mask != NULL);
	check(what, dqkv, rdqkv, nq);
	/* a query with no key: exact zeros in ctx and dq, as the layer's; a
	 * padding key: in dk and dv */
	int empties, pads;
	assert_int_equal(attn_zeros_wrong(ctx, dqkv, s->mask, s->batch, s->t, d, s->causal,
					  &empties, &pads),
			 0);
	if (empties || pads)
		printf("  %d query rows with no key, %d padding keys: exact zeros\n", empties,
		       pads);
	free(qkv), free(ctx), free(lse), free(dctx), free(dqkv);
	free(rctx), free(rlse), free(rdqkv);
}

static const shape shapes[] = {
	{1, 9, 2, 24, 1, NULL},   /* causal, odd T, odd hd, batch 1 */
	{1, 9, 2, 24, 0, NULL},   /* not causal */
	{2, 7, 3, 64, 1, attn_mask7},  /* causal with a key mask: query 0 of sample 0 empty */
	{2, 7, 3, 64, 0, attn_mask7},  /* key mask alone */
	{3, 13, 2, 24, 0, attn_mask13}, /* a sample all padding */
	{3, 13, 1, 64, 1, attn_mask13},
	{2, 1, 1, 1, 1, NULL},    /* T 1, hd 1 */
	{1, 33, 1, 8, 1, NULL},   /* more keys than a warp */
};

static void test_rows(void **state)
{
	(void)state;
	for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
		one(&shapes[k], 0);
}

/* dk and dv of each key computed apart (hpu__flash_kv_rows want 1, then
 * 2: what the CUDA kernels for hd 64 run, two kernels) are the bits of
 * both at once (want 3: the host's and the other kernels'). */
static void test_kv_apart(void **state)
{
	(void)state;
	for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
		const shape *s = &shapes[k];
		const size_t d = (size_t)s->heads * s->hd, bt = (size_t)s->batch * s->t;
		const size_t nq = bt * 3 * d, no = bt * d, nl = (size_t)s->batch * s->heads * s->t;
		float *qkv = xcalloc(nq, 4), *ctx = xcalloc(no, 4), *lse = xcalloc(nl, 4);
		float *dctx = xcalloc(no, 4), *delta = xcalloc(nl, 4);
		float *both = xcalloc(nq, 4), *apart = xcalloc(nq, 4);
		float *acck = xcalloc((size_t)s->hd, 4), *accv = xcalloc((size_t)s->hd, 4);
		for (size_t i = 0; i < nq; i++)
			qkv[i] = 2.0f * frand();
		for (size_t i = 0; i < no; i++)
			dctx[i] = frand();
		assert_int_equal(hpu__be_host()->flash_fwd(qkv, s->mask, ctx, lse, s->batch, s->t,
							   s->heads, s->hd, s->causal),
				 HPU_BE_OK);
		hpu__flash_dims a = {s->batch, s->t, s->heads, s->hd, s->causal,
				     1.0f / sqrtf((float)s->hd)};
		for (int b = 0; b < s->batch; b++)
			for (int h = 0; h < s->heads; h++)
				for (int i = 0; i < s->t; i++)
					delta[hpu__flash_row_at(&a, b, h, i)] =
						hpu__flash_delta_row(&a, ctx, dctx, b, h, i);
		for (int b = 0; b < s->batch; b++)
			for (int h = 0; h < s->heads; h++)
				for (int j = 0; j < s->t; j++) {
					hpu__flash_kv_rows(&a, qkv, s->mask, lse, dctx, delta, both,
							   acck, accv, NULL, NULL, b, h, j, 3);
					hpu__flash_kv_rows(&a, qkv, s->mask, lse, dctx, delta, apart,
							   acck, NULL, NULL, NULL, b, h, j, 1);
					hpu__flash_kv_rows(&a, qkv, s->mask, lse, dctx, delta, apart,
							   NULL, accv, NULL, NULL, b, h, j, 2);
				}
		for (size_t r = 0; r < bt; r++) /* the k and v parts of each row */
			assert_memory_equal(both + r * 3 * d + d, apart + r * 3 * d + d, 2 * d * 4);
		printf("  dk, dv apart B%d T%d h%d hd%d c%d m%d: the same bits\n", s->batch, s->t,
		       s->heads, s->hd, s->causal, s->mask != NULL);
		free(qkv), free(ctx), free(lse), free(dctx), free(delta), free(both), free(apart);
		free(acck), free(accv);
	}
}

/* The public ops on the CPU's table (no flash entries: the host's). */
static void test_ops(void **state)
{
	(void)state;
	assert_null(hpu__be()->flash_fwd);
	one(&shapes[2], 1);
	one(&shapes[4], 1);
}

/* Sizes of 0 write nothing and succeed. */
static void test_empty(void **state)
{
	(void)state;
	float x = 1.0f;
	assert_int_equal(hpu__be_host()->flash_fwd(&x, NULL, &x, &x, 0, 4, 1, 4, 1), HPU_BE_OK);
	assert_int_equal(hpu__be_host()->flash_bwd(&x, NULL, &x, &x, &x, &x, 1, 0, 1, 4, 1),
			 HPU_BE_OK);
	assert_true(x == 1.0f);
}

/* The host's backward with no memory for its batch * heads * T floats:
 * HPU_ENOMEM (the layer says so), not "no fused kernel". In a child
 * whose address space is capped just above what it holds; not under
 * ASan, whose allocator reserves its memory up front. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

static long vm_bytes(void)
{
	long pages = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (!f)
		return -1;
	if (fscanf(f, "%ld", &pages) != 1)
		pages = -1;
	fclose(f);
	return pages < 0 ? -1 : pages * sysconf(_SC_PAGESIZE);
}

static void test_ops_no_memory(void **state)
{
	(void)state;
#ifdef UNDER_ASAN
	skip();
#endif
	/* delta: 1 * 512 * 512 floats, 1 MiB; qkv 3 MiB, allocated first */
	const int batch = 1, t = 512, heads = 512, hd = 1;
	size_t n = (size_t)batch * t * heads * hd, nl = (size_t)batch * heads * t;
	float *qkv = calloc(3 * n, 4), *ctx = calloc(n, 4), *lse = calloc(nl, 4);
	float *dctx = calloc(n, 4), *dqkv = calloc(3 * n, 4);
	assert_true(qkv && ctx && lse && dctx && dqkv);
	assert_int_equal(hpu_attention_fused_forward(qkv, NULL, ctx, lse, batch, t, heads, hd, 1),
			 HPU_OK);
	fflush(stdout);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		long vm = vm_bytes();
		struct rlimit r = {.rlim_cur = (rlim_t)vm + (256 << 10),
				   .rlim_max = (rlim_t)vm + (256 << 10)};
		if (vm < 0 || setrlimit(RLIMIT_AS, &r))
			_exit(3);
		int rc = hpu_attention_fused_backward(qkv, NULL, ctx, lse, dctx, dqkv, batch, t,
						      heads, hd, 1);
		/* the host's table itself (as cpu-strict's kernels-only one wraps it) */
		int be = hpu__be_host()->flash_bwd(qkv, NULL, ctx, lse, dctx, dqkv, batch, t, heads,
						   hd, 1);
		printf("  backward with the address space capped: op %d (HPU_ENOMEM %d), table %d "
		       "(HPU_BE_NOMEM %d)\n",
		       rc, HPU_ENOMEM, be, HPU_BE_NOMEM);
		fflush(stdout);
		_exit(rc == HPU_ENOMEM && be == HPU_BE_NOMEM ? 0 : 1);
	}
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	/* with memory, the same call works */
	assert_int_equal(hpu_attention_fused_backward(qkv, NULL, ctx, lse, dctx, dqkv, batch, t,
						      heads, hd, 1),
			 HPU_OK);
	free(qkv), free(ctx), free(lse), free(dctx), free(dqkv);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rows),
		cmocka_unit_test(test_kv_apart),
		cmocka_unit_test(test_ops),
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_ops_no_memory),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
