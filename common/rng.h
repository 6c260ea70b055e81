/* rng: small deterministic generators (splitmix64 seeding xoshiro256**),
 * identical on every rank and every run for the same seed. */
#ifndef HPU_RNG_H
#define HPU_RNG_H

#include <stdint.h>

typedef struct hpu_rng {
	uint64_t s[4];
} hpu_rng;

static inline uint64_t hpu_splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline void hpu_rng_seed(hpu_rng *r, uint64_t seed, uint64_t stream)
{
	uint64_t x = seed ^ (stream * 0xd1342543de82ef95ull);
	for (int i = 0; i < 4; i++)
		r->s[i] = hpu_splitmix64(&x);
}

static inline uint64_t hpu_rng_next(hpu_rng *r)
{
	uint64_t *s = r->s;
	uint64_t x = s[1] * 5, res = ((x << 7) | (x >> 57)) * 9, t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = (s[3] << 45) | (s[3] >> 19);
	return res;
}

/* Uniform in [0, n), without modulo bias. */
static inline uint64_t hpu_rng_below(hpu_rng *r, uint64_t n)
{
	uint64_t limit = UINT64_MAX - UINT64_MAX % n, x;
	do
		x = hpu_rng_next(r);
	while (x >= limit);
	return x % n;
}

/* Uniform float in [0, 1). */
static inline float hpu_rng_float(hpu_rng *r)
{
	return (float)(hpu_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

#endif
