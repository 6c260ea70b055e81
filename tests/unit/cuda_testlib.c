/* cuda_testlib: see cuda_testlib.h. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tests/unit/cuda_testlib.h"
#include "tests/unit/num_testlib.h"

static cudaStream_t test_stream;

void cu_test_set_stream(cudaStream_t s)
{
	test_stream = s;
}

void *dput(const void *h, size_t bytes)
{
	void *d = NULL;
	assert_int_equal(cudaMalloc(&d, bytes ? bytes : 1), cudaSuccess);
	if (bytes)
		assert_int_equal(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
	return d;
}

void *dnan(size_t bytes)
{
	void *d = NULL;
	assert_int_equal(cudaMalloc(&d, bytes ? bytes : 1), cudaSuccess);
	assert_int_equal(cudaMemset(d, 0xff, bytes ? bytes : 1), cudaSuccess);
	return d;
}

void dget(void *h, const void *d, size_t bytes)
{
	assert_int_equal(cudaStreamSynchronize(test_stream), cudaSuccess);
	if (bytes)
		assert_int_equal(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
}

void dfree(void *d)
{
	assert_int_equal(cudaFree(d), cudaSuccess);
}

void check(const char *what, const float *got, const float *want, size_t n, double tol)
{
	double m = rel_diff(got, want, n, 1e-6);
	printf("  %-60s maxdiff %.3g (tol %.1g)%s\n", what, m, tol, m <= tol ? "" : "  FAIL");
	assert_true(m <= tol);
}

void check_bits(const char *what, const void *got, const void *want, size_t bytes)
{
	int same = memcmp(got, want, bytes) == 0;
	if (same) {
		printf("  %-60s bit-identical\n", what);
	} else {
		size_t at = 0;
		while (at < bytes && ((const char *)got)[at] == ((const char *)want)[at])
			at++;
		printf("  %-60s DIFFERENT at byte %zu of %zu  FAIL\n", what, at, bytes);
	}
	assert_true(same);
}

void check_floats_bits(const char *what, const float *got, const float *want, size_t n)
{
	size_t bad = 0, first = n, nans = 0;
	for (size_t i = 0; i < n; i++) {
		if (isnan(got[i]) && isnan(want[i])) {
			nans++;
			continue;
		}
		if (memcmp(&got[i], &want[i], 4)) {
			bad++;
			if (first == n)
				first = i;
		}
	}
	if (bad)
		printf("  %-60s %zu DIFFERENT, the first at %zu: %a, want %a  FAIL\n", what, bad,
		       first, got[first], want[first]);
	else
		printf("  %-60s bit-identical (%zu NaNs, payloads aside)\n", what, nans);
	assert_true(bad == 0);
}
