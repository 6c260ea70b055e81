#include "worker/runtime/sampler.h"

#include "common/rng.h"

void hpu__sampler_permute(uint32_t *perm, size_t n, uint64_t seed,
			  uint64_t epoch)
{
	hpu_rng r;
	hpu_rng_seed(&r, seed, 0x5a4d504cull + epoch); /* "SMPL" + epoch */
	for (size_t i = 0; i < n; i++)
		perm[i] = (uint32_t)i;
	/* Fisher-Yates. */
	for (size_t i = n; i > 1; i--) {
		size_t j = (size_t)hpu_rng_below(&r, i);
		uint32_t t = perm[i - 1];
		perm[i - 1] = perm[j];
		perm[j] = t;
	}
}

size_t hpu__sampler_holdout_run(uint32_t *map, size_t n, size_t nval, size_t span,
				uint64_t seed)
{
	hpu_rng r;
	hpu_rng_seed(&r, seed, 0x484f4c44ull); /* "HOLD" */
	size_t start = (size_t)hpu_rng_below(&r, (uint64_t)(n - nval + 1)), gap = span ? span - 1 : 0;
	size_t lo = start > gap ? start - gap : 0, hi = start + nval + gap < n ? start + nval + gap : n;
	size_t k = 0;
	for (size_t i = 0; i < lo; i++)
		map[k++] = (uint32_t)i;
	for (size_t i = hi; i < n; i++)
		map[k++] = (uint32_t)i;
	for (size_t i = 0; i < nval; i++)
		map[k + i] = (uint32_t)(start + i);
	return k;
}

size_t hpu__sampler_steps(size_t n, size_t global_batch)
{
	return global_batch ? n / global_batch : 0;
}

const uint32_t *hpu__sampler_shard(const uint32_t *perm, size_t step,
				   size_t global_batch, int rank, int world)
{
	size_t local = global_batch / (size_t)world;
	return perm + step * global_batch + (size_t)rank * local;
}

size_t hpu__sampler_eval_count(size_t n, int rank, int world)
{
	if ((size_t)rank >= n)
		return 0;
	return (n - (size_t)rank + (size_t)world - 1) / (size_t)world;
}
