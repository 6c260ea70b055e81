/* ops_move: the copies and sums the layers make of whole tensors
 * (worker/layers: flatten, add), as ops on the kernel table (backend.h):
 * its kernel, else on the CPU's tables the C loops here (hpu__be_host's). */
#include <string.h>

#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"

#include "hpu/hpu.h"
#include "hpu/ops.h"

int hpu__host_copy(void *dst, const void *src, size_t bytes)
{
	if (bytes)
		memcpy(dst, src, bytes);
	return HPU_BE_OK;
}

int hpu_copy(void *dst, const void *src, size_t bytes)
{
	int rc = HPU__BE_RUN(copy, hpu__host_copy, dst, src, bytes);
	return rc == HPU_BE_OK ? HPU_OK : HPU_ERROR;
}

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

int hpu__host_dropout_rows(const float *x, float *y, const uint64_t *keys, int rows, size_t n,
			   uint32_t cut, float scale)
{
	for (int r = 0; r < rows; r++) {
		const float *xr = x + (size_t)r * n;
		float *yr = y + (size_t)r * n;
		for (size_t i = 0; i < n; i++) {
			uint32_t u = (uint32_t)(mix64(keys[r] + 0x9e3779b97f4a7c15ull * (i + 1)) >> 32);
			yr[i] = u < cut ? 0.0f : xr[i] * scale;
		}
	}
	return HPU_BE_OK;
}

int hpu_dropout_rows(const float *x, float *y, const uint64_t *keys, int rows, size_t n,
		     uint32_t cut, float scale)
{
	int rc = HPU__BE_RUN(dropout_rows, hpu__host_dropout_rows, x, y, keys, rows, n, cut, scale);
	return rc == HPU_BE_OK ? HPU_OK : HPU_ERROR;
}

/* y = a, then y += b: a + b rounded once, as the loop was. */
int hpu_add_forward(const float *a, const float *b, float *y, size_t n)
{
	if (hpu_copy(y, a, n * sizeof *y) != HPU_OK)
		return HPU_ERROR;
	int rc = HPU__BE_RUN(add, hpu__host_add, b, y, n);
	return rc == HPU_BE_OK ? HPU_OK : HPU_ERROR;
}
