/* cuda_coll_k: the reduction of the ranks' staging buffers (cuda_coll.h).
 * A grid-stride loop over 16-byte vectors (4 fp32, 8 bf16), then the
 * rest element by element; each element's sum is cuda_elem.h's
 * arithmetic in rank order (compiled with --fmad=false besides). */
#include "worker/cuda/cuda_coll.h"
#include "worker/cuda/cuda_elem.h"

#include "worker/cuda/cuda_grid.cuh"

#define THREADS 256
#define MAX_BLOCKS 65535u

static unsigned blocks_for(size_t n)
{
	return hpu__cu_blocks(n, THREADS, MAX_BLOCKS);
}

/* 8 bf16 values, loaded and stored as one 16-byte vector */
struct alignas(16) bf8 {
	uint16_t v[8];
};

__device__ static inline float sum1_f32(const hpu__cuda_slice &in, int world, size_t i)
{
	float acc = ((const float *)in.in[0])[i];
	for (int r = 1; r < world; r++)
		acc = E_ADD(acc, ((const float *)in.in[r])[i]);
	return acc;
}

/* reduce.c's BSUM: both widened, added in fp32, rounded to bf16 */
__device__ static inline uint16_t bsum(uint16_t a, uint16_t b)
{
	return hpu__elem_to_bf16(E_ADD(hpu__elem_from_bf16(a), hpu__elem_from_bf16(b)));
}

__device__ static inline uint16_t sum1_bf16(const hpu__cuda_slice &in, int world, size_t i)
{
	uint16_t acc = ((const uint16_t *)in.in[0])[i];
	for (int r = 1; r < world; r++)
		acc = bsum(acc, ((const uint16_t *)in.in[r])[i]);
	return acc;
}

__global__ static void k_sum_f32(hpu__cuda_slice in, int world, float *out, size_t n)
{
	size_t nv = n / 4;
	FOR_EACH(j, nv)
	{
		float4 acc = ((const float4 *)in.in[0])[j];
		for (int r = 1; r < world; r++) {
			float4 x = ((const float4 *)in.in[r])[j];
			acc.x = E_ADD(acc.x, x.x);
			acc.y = E_ADD(acc.y, x.y);
			acc.z = E_ADD(acc.z, x.z);
			acc.w = E_ADD(acc.w, x.w);
		}
		((float4 *)out)[j] = acc;
	}
	FOR_EACH(k, n - nv * 4)
	out[nv * 4 + k] = sum1_f32(in, world, nv * 4 + k);
}

__global__ static void k_sum_bf16(hpu__cuda_slice in, int world, uint16_t *out, size_t n)
{
	size_t nv = n / 8;
	FOR_EACH(j, nv)
	{
		bf8 acc = ((const bf8 *)in.in[0])[j];
		for (int r = 1; r < world; r++) {
			bf8 x = ((const bf8 *)in.in[r])[j];
#pragma unroll
			for (int e = 0; e < 8; e++)
				acc.v[e] = bsum(acc.v[e], x.v[e]);
		}
		((bf8 *)out)[j] = acc;
	}
	FOR_EACH(k, n - nv * 8)
	out[nv * 8 + k] = sum1_bf16(in, world, nv * 8 + k);
}

extern "C" cudaError_t hpu__cuda_k_group_sum(cudaStream_t s, hpu__dev_dtype dt,
					     const hpu__cuda_slice *in, int world, void *out,
					     size_t n)
{
	if (n == 0)
		return cudaSuccess;
	if (world < 1 || world > HPU_CUDA_GROUP_MAX)
		return cudaErrorInvalidValue;
	if (dt == HPU__DEV_BF16)
		k_sum_bf16<<<blocks_for(n / 8 ? n / 8 : 1), THREADS, 0, s>>>(*in, world,
									      (uint16_t *)out, n);
	else
		k_sum_f32<<<blocks_for(n / 4 ? n / 4 : 1), THREADS, 0, s>>>(*in, world, (float *)out,
									     n);
	return cudaGetLastError();
}
