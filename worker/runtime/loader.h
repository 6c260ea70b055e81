/* loader: fetches the next training batch on a thread of its own while the
 * current one trains (double buffering). The model's fetch() runs on that
 * thread; the training thread only waits when the next batch is not ready. */
#ifndef HPU_LOADER_H
#define HPU_LOADER_H

#include <hpu/hpu.h>
#include <stddef.h>
#include <stdint.h>

typedef struct hpu_loader hpu_loader;

/* Starts a loader for batches of up to `batch` samples of `ds` (two slots).
 * Returns NULL if memory or the thread cannot be had. */
hpu_loader *hpu_loader_new(const hpu_dataset *ds, int batch);

/* Asks for samples idx[0..n) to be fetched into `slot` (0 or 1). The slot
 * must not be in use and idx must stay valid until hpu_loader_wait(). */
void hpu_loader_request(hpu_loader *ld, int slot, const uint32_t *idx, int n);

/* Waits for `slot`'s request; sets *x and *labels to its buffers. Returns
 * 0, or -1 with the index of the sample whose fetch failed in *bad. */
int hpu_loader_wait(hpu_loader *ld, int slot, float **x, int32_t **labels,
		    size_t *bad);

/* Stops the thread (after any request in progress) and frees; *ld = NULL;
 * safe on NULL. */
void hpu_loader_destroy(hpu_loader **ld);

#endif
