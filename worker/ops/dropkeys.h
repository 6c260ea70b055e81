/* dropkeys: where the dropout layer's keys are made (ops.h
 * hpu_dropout_ctx).
 *
 * A row's key is a hash of (seed, layer, step, the row's dataset sample
 * index) (common/rowkey.h). Eager, the host makes them (hpu_rand_key) and
 * the kernel reads them from host memory: values a recorded step
 * (--graphs) would repeat at every replay. A recordable run (the
 * strategy) tells the ops where the step and the rows' indices live on
 * the device instead; the op then makes the keys there (the table's
 * dropout_keys, into device memory) and the kernel reads them from there:
 * the same keys, from values a replay reads when it runs.
 *
 * The state is per thread, as the step running is. */
#ifndef HPU_OPS_DROPKEYS_H
#define HPU_OPS_DROPKEYS_H

#include <stdint.h>

typedef struct hpu__dropkeys {
	const uint32_t *host; /* the rows' indices as the context has them
			       * (hpu_ctx.samples): a context with others
			       * (a hook's) gets the host's keys */
	long step;            /* the context's step it holds */
	int rows;             /* at most this many rows */
	/* Puts the step and the rows' indices on the device where they are
	 * not yet (once per micro-batch: a copy from pinned host memory, which
	 * a recording holds) and answers the device memory of the step, the
	 * indices and `rows` keys; 0, or -1 (the host's keys then serve). */
	int (*ready)(void *arg, const int64_t **step, const uint32_t **samples, uint64_t **keys);
	void *arg;
} hpu__dropkeys;

/* From now on the calling thread's dropout keys as *k says (copied);
 * NULL: the host's (as eager runs make them). */
void hpu__dropkeys_set(const hpu__dropkeys *k);

#endif
