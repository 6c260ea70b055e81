/* cuda_grid: what the module's CUDA files share to lay out their
 * kernels: grid sizes, the grid-stride loop, block reductions and a
 * row's arg-max. Internal to worker/cuda (CUDA C++ only). */
#ifndef HPU_CUDA_GRID_CUH
#define HPU_CUDA_GRID_CUH

#include <stddef.h>

#include <cuda_runtime.h>

#include "worker/cuda/cuda_elem.h"

/* Blocks of `threads` for n elements, at least 1, at most `cap` (a
 * grid-stride loop covers the rest). */
static inline unsigned hpu__cu_blocks(size_t n, unsigned threads, unsigned cap)
{
	size_t b = (n + threads - 1) / threads;
	return b == 0 ? 1u : b > cap ? cap : (unsigned)b;
}

/* A grid's y (and z) dimension is at most 65535 (x: 2^31 - 1): a kernel
 * with one block row per item of a count that data sets takes
 * hpu__cu_grid_y(count) rows and walks the rest (y, y + gridDim.y, ...). */
#define HPU_CU_GRID_Y 65535u

/* Block rows for n items, at least 1, at most HPU_CU_GRID_Y. */
static inline unsigned hpu__cu_grid_y(size_t n)
{
	return n == 0 ? 1u : n > HPU_CU_GRID_Y ? HPU_CU_GRID_Y : (unsigned)n;
}

/* Threads for a block that walks a row of `cols`. */
static inline unsigned hpu__cu_row_threads(size_t cols)
{
	return cols >= 1024 ? 512 : cols >= 256 ? 256 : cols > 64 ? 128 : 32;
}

/* Grid-stride loop over [0, n). */
#define FOR_EACH(i, n)                                                                 \
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);          \
	     i += (size_t)gridDim.x * blockDim.x)

/* ---- block reductions (blockDim.x a multiple of 32, at most 1024) ---- */

template <typename T> struct sum_op {
	__device__ static T identity()
	{
		return (T)0;
	}
	__device__ static T apply(T a, T b)
	{
		return a + b;
	}
};
template <typename T> struct max_op {
	__device__ static T identity()
	{
		return (T)-INFINITY;
	}
	__device__ static T apply(T a, T b)
	{
		return b > a ? b : a;
	}
};

/* Every thread gets the reduction of v over the block (every thread of
 * the block must call it). */
template <typename T, typename Op> __device__ T block_reduce(T v)
{
	__shared__ T part[32];
	__shared__ T result;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	for (int o = 16; o > 0; o >>= 1)
		v = Op::apply(v, __shfl_down_sync(0xffffffffu, v, o));
	if (lane == 0)
		part[warp] = v;
	__syncthreads();
	if (warp == 0) {
		int nw = blockDim.x >> 5;
		v = lane < nw ? part[lane] : Op::identity();
		for (int o = 16; o > 0; o >>= 1)
			v = Op::apply(v, __shfl_down_sync(0xffffffffu, v, o));
		if (lane == 0)
			result = v;
	}
	__syncthreads();
	T r = result;
	__syncthreads(); /* result and part are reused by the next call */
	return r;
}

/* The arg-max of row[0, n) by the host's rule (cuda_elem.h's
 * hpu__elem_argmax_nan0 and _takes): a NaN in column 0, else the first
 * column holding the largest value, NaNs aside; n for an empty row.
 * Every thread of the block calls it (with the same row) and gets it.
 * Columns below 2^24 are exact in float: the smallest is the max of
 * their negatives. */
__device__ static int block_argmax(const float *row, int n)
{
	if (n <= 0)
		return n;
	if (hpu__elem_argmax_nan0(row[0])) /* the same for every thread */
		return 0;
	float best = -INFINITY;
	int at = n;
	for (int c = threadIdx.x; c < n; c += blockDim.x)
		if (hpu__elem_argmax_takes(row[c], best, at < n)) {
			best = row[c];
			at = c;
		}
	float m = block_reduce<float, max_op<float> >(best); /* NaN-free */
	int mine = at < n && best == m ? at : n;
	return (int)-block_reduce<float, max_op<float> >(-(float)mine);
}

#endif
