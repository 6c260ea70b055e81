/* cuda_modlib: see cuda_modlib.h. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/unit/cuda_modlib.h"

void cu_mod_path(char *path, size_t size)
{
	const char *env = getenv("HPU_CUDA_MODULE"), *build = getenv("HPU_BUILD_DIR");
	if (env && *env) {
		snprintf(path, size, "%s", env);
		return;
	}
#ifndef HPU_CUDA_BUILT
	printf("skipped: the CUDA device is not built in this build (HPU_CUDA)\n");
	fflush(stdout);
	exit(CU_MOD_SKIP);
#endif
	snprintf(path, size, "%s/lib/hpudev_cuda.so", build ? build : ".");
}

const hpu__device *cu_mod_load(const char *path, const char *who)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		printf("%sFAIL: cannot load %s: %s\n", who, path, dlerror());
		fflush(stdout);
		exit(1);
	}
	hpu__cuda_entry_fn *entry, *full;
	*(void **)&entry = dlsym(h, "hpu_cuda_device_core_v1");
	*(void **)&full = dlsym(h, HPU__CUDA_ENTRY);
	if (!entry || !full) {
		printf("%sFAIL: %s lacks its entries (hpu_cuda_device_core_v1, %s)\n", who, path,
		       HPU__CUDA_ENTRY);
		fflush(stdout);
		exit(1);
	}
	char why[256] = "";
	int ngpus = 0;
	const hpu__device *d = entry(&ngpus, why, sizeof why);
	if (ngpus <= 0) {
		printf("%sskipped: no GPU is visible (%s)\n", who, why);
		fflush(stdout);
		exit(CU_MOD_SKIP);
	}
	return d;
}

float cu_mod_frand(uint64_t *rng)
{
	uint64_t r = *rng;
	r ^= r >> 12;
	r ^= r << 25;
	r ^= r >> 27;
	*rng = r;
	return (float)((r * 0x2545f4914f6cdd1dull) >> 40) / (float)(1u << 24) * 4.0f - 2.0f;
}
