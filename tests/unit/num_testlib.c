#include "tests/unit/num_testlib.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>

#include <cmocka.h>

static uint64_t rng_state;

void rng_seed(uint64_t seed)
{
	rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
}

float rng_uniform(float lo, float hi)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	uint64_t r = rng_state * 0x2545F4914F6CDD1Dull;
	return lo + (hi - lo) * (float)((double)(r >> 40) / (double)(1 << 24));
}

void fill(float *a, size_t n, float lo, float hi)
{
	for (size_t i = 0; i < n; i++)
		a[i] = rng_uniform(lo, hi);
}

void fill_nan(float *a, size_t n)
{
	for (size_t i = 0; i < n; i++)
		a[i] = NAN;
}

void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);
	assert_non_null(p);
	return p;
}

double *to_double(const float *a, size_t n)
{
	double *d = xcalloc(n, sizeof(*d));
	for (size_t i = 0; i < n; i++)
		d[i] = a[i];
	return d;
}

double rel_diff(const float *got, const float *want, size_t n, double floor)
{
	double m = 0;
	for (size_t i = 0; i < n; i++)
		floor = fmax(floor, 0.1 * fabs(want[i]));
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]) / fmax(fabs(want[i]), floor);
		if (!(d <= m))
			m = isnan(d) ? INFINITY : d;
	}
	return m;
}
