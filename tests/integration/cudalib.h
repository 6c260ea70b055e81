/* cudalib: what the GPU training tests (test_cuda_train, test_cuda_accuracy)
 * share: the device they train on and their skip, extra options for its
 * runs, and the comparison of two --save-params files.
 *
 * The device under test is "cuda", or HPU_TEST_GPU_DEVICE's (cpu-strict:
 * the same tests on a machine without a GPU, to check the tests
 * themselves). For cuda, where `hpu-worker --count-gpus` finds no GPU (the
 * module not built, no driver, none visible) the program prints
 * "skipped: " and the worker's reason, and exits 77 (ctest: skipped).
 * HPU_TEST_GPU_ARGS: hpulaunch options (space-separated) added to every
 * run on the device under test (e.g. "--seed 7" plants a difference the
 * comparisons must catch). */
#ifndef HPU_TEST_CUDALIB_H
#define HPU_TEST_CUDALIB_H

#include <stddef.h>

#include "tests/integration/runlib.h"

/* The device under test; exits 77 where it is cuda and no GPU is seen. */
const char *gpu_device(void);

/* 1 when the device under test is cuda. */
int gpu_is_cuda(void);

/* Appends --device DEV to r, and HPU_TEST_GPU_ARGS where DEV is the
 * device under test: call it after the other options, so that those win. */
void gpu_args(run *r, const char *dev);

/* Two runs' parameters a (the reference) and b: the largest |a - b|, the
 * largest |a|, the relative L2 distance |a - b|_2 / |a|_2, values of b
 * that are not finite, and how many there are. */
typedef struct gpu_cmp {
	double max_diff, max_abs, rel_l2;
	size_t nonfinite, n;
} gpu_cmp;

/* Compares the --save-params files ref and got (fails the test where
 * their sizes differ). */
gpu_cmp gpu_compare(const char *ref, const char *got);

/* 1 when c is within the bounds: max_diff <= max_tol, rel_l2 <= l2_tol,
 * every value finite. */
int gpu_within(const gpu_cmp *c, double max_tol, double l2_tol);

#endif
