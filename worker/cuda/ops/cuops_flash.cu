/* cuops_flash: the CUDA kernels of fused (flash-style) attention
 * (backend.h flash_fwd, flash_bwd; cuops_more.c's entries): each thread
 * runs one row of worker/ops/flash_rows.h, the code the host's loops
 * (ops_flash.c) and test_flash_rows run in C: a query row for the forward
 * and for D and dq, a key row for dk and dv. Consecutive threads take
 * consecutive positions of one head, so a warp reads the same key (or
 * query) rows at once. Built with --fmad=false as cuops_kernels.cu: the
 * results differ from the host's only by expf and logf (the math
 * library's). Not yet run on a GPU: test_cuda_ops_more's
 * test_flash_attention compares them with the host's.
 *
 * Each thread's running sums of hd floats, and its own query (or key and
 * value) rows, live in local arrays when hd is at most FLASH_LOCAL_HD
 * (local memory is laid out so that a warp's threads read it coalesced),
 * else the sums in its output row and the rows in place. No
 * shared memory, one dimension of grid (a grid-stride loop over the
 * batch * heads * t rows), FLASH_THREADS threads a block: no limit on t
 * but the rows' count. */
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "worker/cuda/cuda_grid.cuh"
#include "worker/cuda/ops/cuops_more.h"
#include "worker/ops/flash_rows.h"

#define FLASH_THREADS 128
#define FLASH_LOCAL_HD 128

/* Row r of lse[B, heads, T] as (b, h, i). */
__device__ static void flash_split(const hpu__flash_dims *a, size_t r, int *b, int *h, int *i)
{
	*i = (int)(r % (size_t)a->t);
	size_t bh = r / (size_t)a->t;
	*h = (int)(bh % (size_t)a->heads);
	*b = (int)(bh / (size_t)a->heads);
}

static __global__ void k_flash_fwd(const float *qkv, const int32_t *mask, float *ctx, float *lse,
				   hpu__flash_dims a, size_t rows)
{
	float acc[FLASH_LOCAL_HD], qb[FLASH_LOCAL_HD];
	const int local = a.hd <= FLASH_LOCAL_HD;
	FOR_EACH(r, rows)
	{
		int b, h, i;
		flash_split(&a, r, &b, &h, &i);
		float *o = local ? acc : ctx + hpu__flash_ctx_at(&a, b, h, i);
		hpu__flash_fwd_row(&a, qkv, mask, ctx, lse, o, local ? qb : NULL, b, h, i);
	}
}

/* D of query row r into delta[r], then its dq. */
static __global__ void k_flash_dq(const float *qkv, const int32_t *mask, const float *ctx,
				  const float *lse, const float *dctx, float *delta, float *dqkv,
				  hpu__flash_dims a, size_t rows)
{
	float acc[FLASH_LOCAL_HD], qb[FLASH_LOCAL_HD], dob[FLASH_LOCAL_HD];
	const int local = a.hd <= FLASH_LOCAL_HD;
	FOR_EACH(r, rows)
	{
		int b, h, i;
		flash_split(&a, r, &b, &h, &i);
		float dl = hpu__flash_delta_row(&a, ctx, dctx, b, h, i);
		delta[r] = dl;
		float *o = local ? acc : dqkv + hpu__flash_qkv_at(&a, b, h, i, 0);
		hpu__flash_dq_row(&a, qkv, mask, lse, dctx, dl, dqkv, o, local ? qb : NULL,
				  local ? dob : NULL, b, h, i);
	}
}

/* dk, dv of key row r (after k_flash_dq has written every D). */
static __global__ void k_flash_dkv(const float *qkv, const int32_t *mask, const float *lse,
				   const float *dctx, const float *delta, float *dqkv,
				   hpu__flash_dims a, size_t rows)
{
	float acck[FLASH_LOCAL_HD], accv[FLASH_LOCAL_HD];
	float kb[FLASH_LOCAL_HD], vb[FLASH_LOCAL_HD];
	const int local = a.hd <= FLASH_LOCAL_HD;
	FOR_EACH(r, rows)
	{
		int b, h, j;
		flash_split(&a, r, &b, &h, &j);
		float *ok = local ? acck : dqkv + hpu__flash_qkv_at(&a, b, h, j, 1);
		float *ov = local ? accv : dqkv + hpu__flash_qkv_at(&a, b, h, j, 2);
		hpu__flash_dkv_row(&a, qkv, mask, lse, dctx, delta, dqkv, ok, ov, local ? kb : NULL,
				   local ? vb : NULL, b, h, j);
	}
}

/* The same kernels for a head size known when they are compiled (32 and
 * 64: GPT-2's): flash_rows.h's loops over hd unroll, and the row arrays
 * above are registers instead of local memory, which every key's step
 * read and wrote (the kernels for any hd had 1-2 KB stack frames and ran
 * 5x slower than the unfused attention on an H200). The same calls in the
 * same order: the same results. */
template <int HD>
static __global__ void __launch_bounds__(FLASH_THREADS)
	k_flash_fwd_hd(const float *qkv, const int32_t *mask, float *ctx, float *lse,
		       hpu__flash_dims a, size_t rows)
{
	float acc[HD], qb[HD];
	a.hd = HD;
	FOR_EACH(r, rows)
	{
		int b, h, i;
		flash_split(&a, r, &b, &h, &i);
		hpu__flash_fwd_row(&a, qkv, mask, ctx, lse, acc, qb, b, h, i);
	}
}

template <int HD>
static __global__ void __launch_bounds__(FLASH_THREADS)
	k_flash_dq_hd(const float *qkv, const int32_t *mask, const float *ctx, const float *lse,
		      const float *dctx, float *delta, float *dqkv, hpu__flash_dims a, size_t rows)
{
	float acc[HD], qb[HD], dob[HD];
	a.hd = HD;
	FOR_EACH(r, rows)
	{
		int b, h, i;
		flash_split(&a, r, &b, &h, &i);
		float dl = hpu__flash_delta_row(&a, ctx, dctx, b, h, i);
		delta[r] = dl;
		hpu__flash_dq_row(&a, qkv, mask, lse, dctx, dl, dqkv, acc, qb, dob, b, h, i);
	}
}

/* dk and dv (WANT 3), or one of them (1 dk, 2 dv: at hd 64 both at once
 * would hold four rows a thread, more than its 255 registers) */
template <int HD, int WANT>
static __global__ void __launch_bounds__(FLASH_THREADS)
	k_flash_kv_hd(const float *qkv, const int32_t *mask, const float *lse, const float *dctx,
		      const float *delta, float *dqkv, hpu__flash_dims a, size_t rows)
{
	float acck[(WANT & 1) ? HD : 1], accv[(WANT & 2) ? HD : 1], kb[HD],
		vb[(WANT & 1) ? HD : 1];
	a.hd = HD;
	FOR_EACH(r, rows)
	{
		int b, h, j;
		flash_split(&a, r, &b, &h, &j);
		hpu__flash_kv_rows(&a, qkv, mask, lse, dctx, delta, dqkv, acck, accv, kb, vb, b, h, j,
				   WANT);
	}
}

static hpu__flash_dims flash_dims(int batch, int t, int heads, int hd, int causal)
{
	hpu__flash_dims a = {batch, t, heads, hd, causal != 0, 1.0f / sqrtf((float)hd)};
	return a;
}

static unsigned flash_blocks(size_t rows)
{
	return hpu__cu_blocks(rows, FLASH_THREADS, 0x7fffffffu);
}

extern "C" size_t hpu__cukm_flash_rows(int batch, int t, int heads, int hd)
{
	if (batch <= 0 || t <= 0 || heads <= 0 || hd <= 0)
		return 0;
	return (size_t)batch * (size_t)heads * (size_t)t;
}

extern "C" cudaError_t hpu__cukm_flash_fwd(const float *qkv, const int32_t *mask, float *ctx,
					   float *lse, int batch, int t, int heads, int hd,
					   int causal, cudaStream_t st)
{
	size_t rows = hpu__cukm_flash_rows(batch, t, heads, hd);
	if (!rows)
		return cudaSuccess;
	hpu__flash_dims a = flash_dims(batch, t, heads, hd, causal);
	if (hd == 64)
		k_flash_fwd_hd<64><<<flash_blocks(rows), FLASH_THREADS, 0, st>>>(qkv, mask, ctx, lse, a,
										 rows);
	else if (hd == 32)
		k_flash_fwd_hd<32><<<flash_blocks(rows), FLASH_THREADS, 0, st>>>(qkv, mask, ctx, lse, a,
										 rows);
	else
		k_flash_fwd<<<flash_blocks(rows), FLASH_THREADS, 0, st>>>(qkv, mask, ctx, lse, a, rows);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cukm_flash_bwd(const float *qkv, const int32_t *mask,
					   const float *ctx, const float *lse, const float *dctx,
					   float *dqkv, float *delta, int batch, int t, int heads,
					   int hd, int causal, cudaStream_t st)
{
	size_t rows = hpu__cukm_flash_rows(batch, t, heads, hd);
	if (!rows)
		return cudaSuccess;
	hpu__flash_dims a = flash_dims(batch, t, heads, hd, causal);
	unsigned nb = flash_blocks(rows);
	if (hd == 64)
		k_flash_dq_hd<64><<<nb, FLASH_THREADS, 0, st>>>(qkv, mask, ctx, lse, dctx, delta, dqkv,
								a, rows);
	else if (hd == 32)
		k_flash_dq_hd<32><<<nb, FLASH_THREADS, 0, st>>>(qkv, mask, ctx, lse, dctx, delta, dqkv,
								a, rows);
	else
		k_flash_dq<<<nb, FLASH_THREADS, 0, st>>>(qkv, mask, ctx, lse, dctx, delta, dqkv, a,
							 rows);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	if (hd == 64) {
		k_flash_kv_hd<64, 1><<<nb, FLASH_THREADS, 0, st>>>(qkv, mask, lse, dctx, delta, dqkv,
								   a, rows);
		if ((e = cudaGetLastError()) != cudaSuccess)
			return e;
		k_flash_kv_hd<64, 2><<<nb, FLASH_THREADS, 0, st>>>(qkv, mask, lse, dctx, delta, dqkv,
								   a, rows);
	} else if (hd == 32) {
		k_flash_kv_hd<32, 3><<<nb, FLASH_THREADS, 0, st>>>(qkv, mask, lse, dctx, delta, dqkv,
								   a, rows);
	} else
		k_flash_dkv<<<nb, FLASH_THREADS, 0, st>>>(qkv, mask, lse, dctx, delta, dqkv, a, rows);
	return cudaGetLastError();
}
