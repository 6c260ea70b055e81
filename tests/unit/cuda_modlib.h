/* cuda_modlib: what the tests of the CUDA device's module (hpudev_cuda.so)
 * share (test_cuda_device, test_cuda_ipc): finding and loading the module
 * and its device, skipping (exit 77, with the reason) where it is not
 * built or no GPU is visible, and their values. Plain C, no CUDA headers:
 * the programs are built where the toolkit is not. The target defines
 * HPU_CUDA_BUILT where the build has the module. */
#ifndef HPU_CUDA_MODLIB_H
#define HPU_CUDA_MODLIB_H

#include <stddef.h>
#include <stdint.h>

#include "worker/device/device.h"

/* ctest's skip (SKIP_RETURN_CODE). */
#define CU_MOD_SKIP 77

/* The module's path: HPU_CUDA_MODULE, else $HPU_BUILD_DIR/lib/hpudev_cuda.so
 * (./lib without HPU_BUILD_DIR). Where this build has no module and
 * HPU_CUDA_MODULE is not set, prints "skipped: the CUDA device is not
 * built in this build (HPU_CUDA)" and exits CU_MOD_SKIP. */
void cu_mod_path(char *path, size_t size);

/* Loads the module at `path` and returns its device without the kernel
 * table (hpu_cuda_device_core_v1; the full entry, HPU__CUDA_ENTRY, must be
 * there too). Where no GPU is visible, prints "skipped: no GPU is visible
 * (WHY)" and exits CU_MOD_SKIP; where the module cannot be loaded or
 * lacks an entry, prints a FAIL line and exits 1. Each line starts with
 * `who` ("" or "rank 1: ") and is flushed. */
const hpu__device *cu_mod_load(const char *path, const char *who);

/* Uniform in [-2, 2) from the xorshift64* state *rng. */
float cu_mod_frand(uint64_t *rng);

#endif
