/* ops_move: the copies and sums the layers make of whole tensors
 * (worker/layers: flatten, add) and the dropout layer's rows and keys
 * (dropkeys.h), as ops on the kernel table (backend.h): its kernel, else
 * on the CPU's tables the C loops here (hpu__be_host's). */
#include <stdlib.h>
#include <string.h>

#include "common/rowkey.h"

#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"
#include "worker/ops/dropkeys.h"

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

int hpu__host_dropout_rows(const float *x, float *y, const uint64_t *keys, int keys_dev,
			   int rows, size_t n, uint32_t cut, float scale)
{
	(void)keys_dev; /* the host reads either */
	for (int r = 0; r < rows; r++) {
		const float *xr = x + (size_t)r * n;
		float *yr = y + (size_t)r * n;
		for (size_t i = 0; i < n; i++) {
			uint32_t u = hpu__rk_draw(keys[r], i);
			yr[i] = u < cut ? 0.0f : xr[i] * scale;
		}
	}
	return HPU_BE_OK;
}

int hpu_dropout_rows(const float *x, float *y, const uint64_t *keys, int rows, size_t n,
		     uint32_t cut, float scale)
{
	int rc = HPU__BE_RUN(dropout_rows, hpu__host_dropout_rows, x, y, keys, 0, rows, n, cut,
			     scale);
	return rc == HPU_BE_OK ? HPU_OK : HPU_ERROR;
}

int hpu__host_dropout_keys(uint64_t *keys, const uint32_t *samples, const int64_t *step,
			   uint64_t seed, int layer, int rows)
{
	for (int r = 0; r < rows; r++)
		keys[r] = hpu__rk_key(seed, layer, (long)*step,
				      samples ? (uint64_t)samples[r] : (uint64_t)r);
	return HPU_BE_OK;
}

/* ---- the dropout layer's keys (dropkeys.h) ---- */

static _Thread_local struct {
	hpu__dropkeys k;
	int on;
} dk;

void hpu__dropkeys_set(const hpu__dropkeys *k)
{
	dk.on = k != NULL;
	if (k)
		dk.k = *k;
}

/* The keys made on the device (a recordable run's), into *out; 0, or 1
 * where the host's serve (not such a run, another context), or -1. */
static int keys_dev(const hpu_ctx *c, int rows, uint64_t **out)
{
	const int64_t *step;
	const uint32_t *samples;
	if (!dk.on || c->samples != dk.k.host || c->step != dk.k.step || rows > dk.k.rows ||
	    dk.k.ready(dk.k.arg, &step, &samples, out) < 0)
		return 1;
	int rc = HPU__BE_RUN(dropout_keys, hpu__host_dropout_keys, *out, samples, step, c->seed,
			     c->layer, rows);
	return rc == HPU_BE_OK ? 0 : -1;
}

int hpu_dropout_ctx(const hpu_ctx *c, const float *x, float *y, int rows, size_t n,
		    uint32_t cut, float scale)
{
	if (rows <= 0)
		return HPU_OK;
	uint64_t *keys;
	int dev = keys_dev(c, rows, &keys);
	if (dev < 0)
		return HPU_ERROR;
	if (dev == 0) {
		int rc = HPU__BE_RUN(dropout_rows, hpu__host_dropout_rows, x, y, keys, 1, rows, n,
				     cut, scale);
		return rc == HPU_BE_OK ? HPU_OK : HPU_ERROR;
	}
	if (!(keys = malloc((size_t)rows * sizeof *keys)))
		return HPU_ERROR;
	for (int r = 0; r < rows; r++)
		keys[r] = hpu__rk_key(c->seed, c->layer, c->step,
				      c->samples ? (uint64_t)c->samples[r] : (uint64_t)r);
	int rc = hpu_dropout_rows(x, y, keys, rows, n, cut, scale);
	free(keys);
	return rc;
}

/* y = a, then y += b: a + b rounded once, as the loop was. */
int hpu_add_forward(const float *a, const float *b, float *y, size_t n)
{
	if (hpu_copy(y, a, n * sizeof *y) != HPU_OK)
		return HPU_ERROR;
	int rc = HPU__BE_RUN(add, hpu__host_add, b, y, n);
	return rc == HPU_BE_OK ? HPU_OK : HPU_ERROR;
}
