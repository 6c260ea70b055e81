/* rand.c: the counter-based random numbers of the run context
 * (hpu_rand_*): a stateless hash of (seed, layer, step, dataset index of
 * the row, k), so a value is the same whoever asks for it and whenever:
 * every rank, any world size, recompute, a restarted run. */
#include <hpu/hpu.h>

#include "common/rowkey.h"

/* The row's key: everything but k. */
static uint64_t row_key(const hpu_ctx *c, int row)
{
	uint64_t sample = c->samples ? c->samples[row] : (uint64_t)row;
	return hpu__rk_key(c->seed, c->layer, c->step, sample);
}

static inline uint32_t draw(uint64_t key, uint64_t k)
{
	return hpu__rk_draw(key, k);
}

uint64_t hpu_rand_key(const hpu_ctx *c, int row)
{
	return row_key(c, row);
}

uint32_t hpu_rand_u32(const hpu_ctx *c, int row, uint64_t k)
{
	return draw(row_key(c, row), k);
}

float hpu_rand_uniform(const hpu_ctx *c, int row, uint64_t k)
{
	return (float)(hpu_rand_u32(c, row, k) >> 8) * (1.0f / 16777216.0f);
}

void hpu_rand_fill(const hpu_ctx *c, int row, uint64_t k0, uint32_t *out, size_t n)
{
	uint64_t key = row_key(c, row);
	for (size_t i = 0; i < n; i++)
		out[i] = draw(key, k0 + i);
}
