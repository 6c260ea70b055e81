/* rowkey: the counter-based random numbers of the run context
 * (worker/hpu/rand.c, hpu_rand_*), written once for every place that
 * draws them: the host (rand.c, the ops' dropout keys on the CPU's
 * tables) and a GPU's kernels (worker/cuda/cuda_elem.h), so that a key is
 * the same bits wherever it is made.
 *
 * A row's key is a hash of (seed, layer, step, the row's dataset sample
 * index); value k of the row is the top 32 bits of a hash of (key, k).
 * mix64 is splitmix64's finalizer. Only 64-bit integer arithmetic. */
#ifndef HPU_ROWKEY_H
#define HPU_ROWKEY_H

#include <stdint.h>

#ifdef __CUDACC__
#define HPU__ROWKEY_FN __host__ __device__ static inline
#else
#define HPU__ROWKEY_FN static inline
#endif

HPU__ROWKEY_FN uint64_t hpu__rk_mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The row's key: everything but k (hpu_rand_key). */
HPU__ROWKEY_FN uint64_t hpu__rk_key(uint64_t seed, int layer, long step, uint64_t sample)
{
	uint64_t h = hpu__rk_mix64(seed + 0x9e3779b97f4a7c15ull * ((uint64_t)layer + 1));
	h = hpu__rk_mix64(h ^ (0xd1342543de82ef95ull * ((uint64_t)step + 1)));
	return hpu__rk_mix64(h ^ (0xc2b2ae3d27d4eb4full * (sample + 1)));
}

/* Value k of the row whose key is `key` (hpu_rand_u32). */
HPU__ROWKEY_FN uint32_t hpu__rk_draw(uint64_t key, uint64_t k)
{
	return (uint32_t)(hpu__rk_mix64(key + 0x9e3779b97f4a7c15ull * (k + 1)) >> 32);
}

#endif
