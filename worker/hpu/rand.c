/* rand.c: the counter-based random numbers of the run context
 * (hpu_rand_*): a stateless hash of (seed, layer, step, dataset index of
 * the row, k), so a value is the same whoever asks for it and whenever:
 * every rank, any world size, recompute, a restarted run. */
#include <hpu/hpu.h>

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The row's key: everything but k. */
static uint64_t row_key(const hpu_ctx *c, int row)
{
	uint64_t sample = c->samples ? c->samples[row] : (uint64_t)row;
	uint64_t h = mix64(c->seed + 0x9e3779b97f4a7c15ull * ((uint64_t)c->layer + 1));
	h = mix64(h ^ (0xd1342543de82ef95ull * ((uint64_t)c->step + 1)));
	return mix64(h ^ (0xc2b2ae3d27d4eb4full * (sample + 1)));
}

static inline uint32_t draw(uint64_t key, uint64_t k)
{
	return (uint32_t)(mix64(key + 0x9e3779b97f4a7c15ull * (k + 1)) >> 32);
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
