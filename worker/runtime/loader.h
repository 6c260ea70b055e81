/* loader: fetches the next training batch on a thread of its own while the
 * current one trains (double buffering). The model's fetch() runs on that
 * thread; the training thread only waits when the next batch is not ready. */
#ifndef HPU_LOADER_H
#define HPU_LOADER_H

#include <hpu/hpu.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/strategy/strategy.h" /* hpu_batch */

typedef struct hpu_loader hpu_loader;

/* Values of one sample of a field. */
size_t hpu__field_numel(const hpu_field *f);

/* Fetches samples idx[0..n) of `ds` into bt's buffers (each big enough),
 * setting bt->n and bt->idx. Returns 0, or -1 with the index of the
 * sample whose fetch failed in *bad. */
int hpu__batch_fetch(const hpu_dataset *ds, const uint32_t *idx, int n, hpu_batch *bt,
		     size_t *bad);

/* Allocates bt's buffers for `max` samples of ds's fields (device memory,
 * named for `what`); 0, or -1. hpu__batch_free frees them. */
int hpu__batch_alloc(const hpu_dataset *ds, int max, hpu_batch *bt, const char *what);
void hpu__batch_free(hpu_batch *bt);

/* Starts a loader for batches of up to `batch` samples of `ds` (two slots).
 * Returns NULL if memory or the thread cannot be had. */
hpu_loader *hpu__loader_new(const hpu_dataset *ds, int batch);

/* Asks for samples idx[0..n) to be fetched into `slot` (0 or 1). The slot
 * must not be in use and idx must stay valid until hpu__loader_wait(). */
void hpu__loader_request(hpu_loader *ld, int slot, const uint32_t *idx, int n);

/* Waits for `slot`'s request; points *bt at its batch. Returns 0, or -1
 * with the index of the sample whose fetch failed in *bad. */
int hpu__loader_wait(hpu_loader *ld, int slot, const hpu_batch **bt, size_t *bad);

/* Stops the thread (after any request in progress) and frees; *ld = NULL;
 * safe on NULL. */
void hpu__loader_destroy(hpu_loader **ld);

#endif
