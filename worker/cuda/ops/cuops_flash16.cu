/* cuops_flash16: fused attention on tensor cores under bf16 autocast
 * (backend.h flash16_fwd, flash16_bwd; cuops_more.c's entries): one block
 * of HPU_FT_THREADS threads a 64-row tile, running worker/ops/
 * flash_tiles.h's blocks, whose products are WMMA's 16x16x16 bf16
 * fragments with fp32 sums here (test_flash_tiles runs the same blocks on
 * the CPU with the products in fp32 loops). The forward's blocks take
 * the query tiles from the last (the longest under a causal mask) down;
 * the backward runs the dq blocks (which write D), then the dk blocks,
 * then the dv blocks.
 *
 * The tiles live in dynamic shared memory (hpu__ft_layout: at hd 64 the
 * forward's 71.6 KiB, dv's 70.4, dq's and dk's 96.6, FT_SLACK included),
 * above the 48 KiB a block
 * gets without asking: each kernel is allowed its bytes once a GPU, at
 * its first launch there (an eager step: --graphs records after warm-up
 * steps).
 * A GPU whose blocks cannot have that much, or a head size the tiles do
 * not take (hpu__ft_hd_ok), answers cudaErrorNotSupported: the ops then
 * run the fp32 kernels of cuops_flash.cu. Not yet run on a GPU:
 * test_cuda_ops_more's test_flash16 compares it with the tiles on the
 * CPU. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "worker/cuda/ops/cuops_more.h"

using namespace nvcuda;

/* flash_tiles.h's HPU_FT_MMA_ABT: c = A B^T for the 16 rows of warp w. */
__device__ static inline void ft_wmma_abt(float *c, int ldc, const uint16_t *a, int lda,
					  const uint16_t *b, int ldb, int n, int k, int w)
{
	const __nv_bfloat16 *pa = reinterpret_cast<const __nv_bfloat16 *>(a) + 16 * w * lda;
	const __nv_bfloat16 *pb = reinterpret_cast<const __nv_bfloat16 *>(b);
	for (int j = 0; j < n; j += 16) {
		wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
		wmma::fill_fragment(acc, 0.0f);
		for (int e = 0; e < k; e += 16) {
			wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
			wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
			wmma::load_matrix_sync(fa, pa + e, lda);
			wmma::load_matrix_sync(fb, pb + j * ldb + e, ldb);
			wmma::mma_sync(acc, fa, fb, acc);
		}
		wmma::store_matrix_sync(c + 16 * w * ldc + j, acc, ldc, wmma::mem_row_major);
	}
}

/* HPU_FT_MMA_AB: c += A B for the 16 rows of warp w. */
__device__ static inline void ft_wmma_ab(float *c, int ldc, const uint16_t *a, int lda,
					 const uint16_t *b, int ldb, int n, int k, int w)
{
	const __nv_bfloat16 *pa = reinterpret_cast<const __nv_bfloat16 *>(a) + 16 * w * lda;
	const __nv_bfloat16 *pb = reinterpret_cast<const __nv_bfloat16 *>(b);
	for (int j = 0; j < n; j += 16) {
		wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
		float *pc = c + 16 * w * ldc + j;
		wmma::load_matrix_sync(acc, pc, ldc, wmma::mem_row_major);
		for (int e = 0; e < k; e += 16) {
			wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
			wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
			wmma::load_matrix_sync(fa, pa + e, lda);
			wmma::load_matrix_sync(fb, pb + e * ldb + j, ldb);
			wmma::mma_sync(acc, fa, fb, acc);
		}
		wmma::store_matrix_sync(pc, acc, ldc, wmma::mem_row_major);
	}
}

#define HPU_FT_MMA_ABT ft_wmma_abt
#define HPU_FT_MMA_AB ft_wmma_ab
#include "worker/ops/flash_tiles.h"

/* The block's dynamic shared memory from its first 128-byte boundary
 * (CUDA promises 16 bytes; WMMA's pointers want 32): each launch asks for
 * FT_SLACK bytes more than the layout. */
#define FT_SLACK 128
__device__ static inline void *ft_base(void)
{
	extern __shared__ unsigned char ft_sm[];
	return ft_sm + ((FT_SLACK - ((uintptr_t)ft_sm & (FT_SLACK - 1))) & (FT_SLACK - 1));
}

/* Block x of a grid over batch * heads * tiles: (b, h, tile), tiles
 * from the last down where `down`. */
__device__ static void ft_split(const hpu__flash_dims *a, size_t x, int nt, int down, int *b,
				int *h, int *tile)
{
	int i = (int)(x % (size_t)nt);
	size_t bh = x / (size_t)nt;
	*tile = down ? nt - 1 - i : i;
	*h = (int)(bh % (size_t)a->heads);
	*b = (int)(bh / (size_t)a->heads);
}

static __global__ void __launch_bounds__(HPU_FT_THREADS)
	k_ft_fwd(const float *qkv, const int32_t *mask, float *ctx, float *lse, hpu__flash_dims a,
		 size_t blocks)
{
	hpu__ft_smem m;
	hpu__ft_layout(HPU_FT_FWD, a.hd, ft_base(), &m);
	const int nt = hpu__ft_tiles(a.t);
	for (size_t x = blockIdx.x; x < blocks; x += gridDim.x) {
		int b, h, qt;
		ft_split(&a, x, nt, 1, &b, &h, &qt);
		hpu__ft_fwd_block(&a, qkv, mask, ctx, lse, &m, b, h, qt);
	}
}

static __global__ void __launch_bounds__(HPU_FT_THREADS)
	k_ft_dq(const float *qkv, const int32_t *mask, const float *ctx, const float *lse,
		const float *dctx, float *delta, float *dqkv, hpu__flash_dims a, size_t blocks)
{
	hpu__ft_smem m;
	hpu__ft_layout(HPU_FT_DQ, a.hd, ft_base(), &m);
	const int nt = hpu__ft_tiles(a.t);
	for (size_t x = blockIdx.x; x < blocks; x += gridDim.x) {
		int b, h, qt;
		ft_split(&a, x, nt, 1, &b, &h, &qt);
		hpu__ft_dq_block(&a, qkv, mask, ctx, lse, dctx, delta, dqkv, &m, b, h, qt);
	}
}

static __global__ void __launch_bounds__(HPU_FT_THREADS)
	k_ft_dk(const float *qkv, const int32_t *mask, const float *lse, const float *dctx,
		float *delta, float *dqkv, hpu__flash_dims a, size_t blocks)
{
	hpu__ft_smem m;
	hpu__ft_layout(HPU_FT_DK, a.hd, ft_base(), &m);
	const int nt = hpu__ft_tiles(a.t);
	for (size_t x = blockIdx.x; x < blocks; x += gridDim.x) {
		int b, h, kt;
		ft_split(&a, x, nt, 0, &b, &h, &kt);
		hpu__ft_dk_block(&a, qkv, mask, lse, dctx, delta, dqkv, &m, b, h, kt);
	}
}

static __global__ void __launch_bounds__(HPU_FT_THREADS)
	k_ft_dv(const float *qkv, const int32_t *mask, const float *lse, const float *dctx,
		float *dqkv, hpu__flash_dims a, size_t blocks)
{
	hpu__ft_smem m;
	hpu__ft_layout(HPU_FT_DV, a.hd, ft_base(), &m);
	const int nt = hpu__ft_tiles(a.t);
	for (size_t x = blockIdx.x; x < blocks; x += gridDim.x) {
		int b, h, kt;
		ft_split(&a, x, nt, 0, &b, &h, &kt);
		hpu__ft_dv_block(&a, qkv, mask, lse, dctx, dqkv, &m, b, h, kt);
	}
}

/* The GPUs whose attribute is kept: as many as cuops.h's contexts
 * (HPU_CUOPS_MAX_GPUS). */
#define FT_DEVICES 64

/* The bytes kernel k may have on the current GPU (its attribute, which is
 * the GPU's, raised once to the most asked so far: allowed[FT_DEVICES]);
 * cudaErrorNotSupported past what this GPU's blocks can have. */
static cudaError_t allow(const void *k, size_t bytes, size_t *allowed)
{
	int dev = 0, most = 0;
	cudaError_t e = cudaGetDevice(&dev);
	if (e != cudaSuccess)
		return e;
	if (dev < 0 || dev >= FT_DEVICES)
		return cudaErrorNotSupported;
	if (bytes <= allowed[dev])
		return cudaSuccess;
	e = cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
	if (e != cudaSuccess)
		return e;
	if (bytes > (size_t)most)
		return cudaErrorNotSupported;
	e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
	if (e == cudaSuccess)
		allowed[dev] = bytes;
	return e;
}

static hpu__flash_dims ft_dims(int batch, int t, int heads, int hd, int causal)
{
	hpu__flash_dims a = {batch, t, heads, hd, causal != 0, 1.0f / sqrtf((float)hd)};
	return a;
}

/* The grid: a block a tile (at most 2^31 - 1: each walks the rest). */
static unsigned ft_grid(size_t blocks)
{
	return blocks > 0x7fffffffu ? 0x7fffffffu : (unsigned)blocks;
}

static size_t ft_blocks(int batch, int t, int heads)
{
	return (size_t)batch * (size_t)heads * (size_t)hpu__ft_tiles(t);
}

extern "C" int hpu__cukm_flash16_ok(int hd)
{
	return hpu__ft_hd_ok(hd);
}

extern "C" cudaError_t hpu__cukm_flash16_fwd(const float *qkv, const int32_t *mask, float *ctx,
					     float *lse, int batch, int t, int heads, int hd,
					     int causal, cudaStream_t st)
{
	static size_t allowed[FT_DEVICES];
	if (!hpu__ft_hd_ok(hd))
		return cudaErrorNotSupported;
	if (batch <= 0 || t <= 0 || heads <= 0)
		return cudaSuccess;
	size_t bytes = hpu__ft_layout(HPU_FT_FWD, hd, NULL, NULL) + FT_SLACK;
	size_t blocks = ft_blocks(batch, t, heads);
	cudaError_t e = allow((const void *)k_ft_fwd, bytes, allowed);
	if (e != cudaSuccess)
		return e;
	k_ft_fwd<<<ft_grid(blocks), HPU_FT_THREADS, bytes, st>>>(
		qkv, mask, ctx, lse, ft_dims(batch, t, heads, hd, causal), blocks);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cukm_flash16_bwd(const float *qkv, const int32_t *mask,
					     const float *ctx, const float *lse, const float *dctx,
					     float *dqkv, float *delta, int batch, int t, int heads,
					     int hd, int causal, cudaStream_t st)
{
	static size_t allowed_dq[FT_DEVICES], allowed_dk[FT_DEVICES], allowed_dv[FT_DEVICES];
	if (!hpu__ft_hd_ok(hd))
		return cudaErrorNotSupported;
	if (batch <= 0 || t <= 0 || heads <= 0)
		return cudaSuccess;
	hpu__flash_dims a = ft_dims(batch, t, heads, hd, causal);
	size_t bq = hpu__ft_layout(HPU_FT_DQ, hd, NULL, NULL) + FT_SLACK;
	size_t bk = hpu__ft_layout(HPU_FT_DK, hd, NULL, NULL) + FT_SLACK;
	size_t bv = hpu__ft_layout(HPU_FT_DV, hd, NULL, NULL) + FT_SLACK;
	size_t blocks = ft_blocks(batch, t, heads);
	cudaError_t e = allow((const void *)k_ft_dq, bq, allowed_dq);
	if (e == cudaSuccess)
		e = allow((const void *)k_ft_dk, bk, allowed_dk);
	if (e == cudaSuccess)
		e = allow((const void *)k_ft_dv, bv, allowed_dv);
	if (e != cudaSuccess)
		return e;
	k_ft_dq<<<ft_grid(blocks), HPU_FT_THREADS, bq, st>>>(qkv, mask, ctx, lse, dctx, delta, dqkv,
							    a, blocks);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	k_ft_dk<<<ft_grid(blocks), HPU_FT_THREADS, bk, st>>>(qkv, mask, lse, dctx, delta, dqkv, a,
							    blocks);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	k_ft_dv<<<ft_grid(blocks), HPU_FT_THREADS, bv, st>>>(qkv, mask, lse, dctx, dqkv, a, blocks);
	return cudaGetLastError();
}
