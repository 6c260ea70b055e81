/* num_testlib: what the numerical unit tests share: a seeded generator,
 * buffer fills, checked allocation, the relative difference. */
#ifndef HPU_NUM_TESTLIB_H
#define HPU_NUM_TESTLIB_H

#include <stddef.h>
#include <stdint.h>

/* Reseeds the generator (xorshift64*, one per test program). */
void rng_seed(uint64_t seed);

/* Uniform in [lo, hi). */
float rng_uniform(float lo, float hi);

/* a[n] uniform in [lo, hi) / all NaN (to catch "not written"). */
void fill(float *a, size_t n, float lo, float hi);
void fill_nan(float *a, size_t n);

/* calloc that fails the test when it fails (n 0: one element). */
void *xcalloc(size_t n, size_t size);

/* A double copy of a[n] (xcalloc'ed). */
double *to_double(const float *a, size_t n);

/* Largest |got - want| / max(|want|, floor), with floor at least 1/10 of
 * the largest |want|: sums that cancel to near 0 are measured against the
 * array's scale, not their own. NaN counts as infinite. */
double rel_diff(const float *got, const float *want, size_t n, double floor);

#endif
