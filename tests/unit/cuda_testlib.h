/* cuda_testlib: what the CUDA kernel tables' unit tests share
 * (test_cuda_ops, test_cuda_layers, test_cuda_ops_more): device buffers
 * that fail the test where CUDA refuses, and the comparisons, each
 * printing one line with its margin. Needs <cmocka.h> before it. */
#ifndef HPU_CUDA_TESTLIB_H
#define HPU_CUDA_TESTLIB_H

#include <stddef.h>

#include <cuda_runtime_api.h>

/* The stream the tables' work is queued on (dget waits for it). */
void cu_test_set_stream(cudaStream_t s);

/* A device copy of h[bytes]; a device buffer of 0xff bytes (NaN for
 * floats: "not written"); back to the host after the stream; freed. */
void *dput(const void *h, size_t bytes);
void *dnan(size_t bytes);
void dget(void *h, const void *d, size_t bytes);
void dfree(void *d);

/* num_testlib's rel_diff within tol (floor 1e-6): the program links
 * num_testlib.c too. */
void check(const char *what, const float *got, const float *want, size_t n, double tol);
/* The same bytes. */
void check_bits(const char *what, const void *got, const void *want, size_t bytes);
/* Floats bit for bit, except that any NaN matches any NaN: a GPU gives
 * the canonical NaN where the CPU keeps an operand's payload. */
void check_floats_bits(const char *what, const float *got, const float *want, size_t n);

#endif
