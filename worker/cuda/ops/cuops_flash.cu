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
	k_flash_fwd<<<flash_blocks(rows), FLASH_THREADS, 0, st>>>(
		qkv, mask, ctx, lse, flash_dims(batch, t, heads, hd, causal), rows);
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
	k_flash_dq<<<flash_blocks(rows), FLASH_THREADS, 0, st>>>(qkv, mask, ctx, lse, dctx, delta,
								   dqkv, a, rows);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	k_flash_dkv<<<flash_blocks(rows), FLASH_THREADS, 0, st>>>(qkv, mask, lse, dctx, delta,
								    dqkv, a, rows);
	return cudaGetLastError();
}
