/* devmem: the worker's device memory. Every runtime allocation goes
 * through it: a limit (--device-memory), the DeviceStats of <hpu/hpu.h>,
 * and bytes in use per kind, so that the memory a strategy promises can be
 * shown from the accounting. Freed blocks are kept for reuse by size (as a
 * device allocator's pool does) and given back to the system when an
 * allocation would otherwise pass the limit.
 *
 * One per process; thread-safe. Part of libhpu, so that a model can read
 * the statistics (hpu_device_stats_get). */
#ifndef HPU_DEVMEM_H
#define HPU_DEVMEM_H

#include <hpu/hpu.h>
#include <stddef.h>
#include <stdint.h>

typedef enum hpu_mem_kind {
	HPU_MEM_PARAMS = 0, /* parameters: whole, shards, gathered layers */
	HPU_MEM_GRADS,      /* gradients: whole, buckets, shards */
	HPU_MEM_OPTIM,      /* optimizer state (and fp32 master copies) */
	HPU_MEM_ACTS,       /* activations and their gradients */
	HPU_MEM_COMM,       /* communication staging buffers */
	HPU_MEM_OTHER,      /* batches, scratch */
	HPU_MEM_NKINDS,
} hpu_mem_kind;

/* Where the device's blocks come from, when not from the system
 * (worker/device's strict CPU device: an arena host code cannot touch;
 * the CUDA device: GPU memory). map returns `bytes` (a whole number of
 * pages) of memory, or NULL with errno set; unmap gives them back. open
 * and close bracket devmem's own accesses to a block (its header,
 * zeroing); label tells the backing what a block holds once it is handed
 * out (kind and what; the user pointer and its bytes) and, with what ==
 * NULL, that it was freed. open, close and label may be NULL.
 *
 * remote == 0: the host may touch the blocks inside open/close; map
 * returns zeroed memory, devmem keeps each block's header in front of it
 * and zeroes with memset. remote == 1 (GPU memory, which host code can
 * never touch): map's memory need not be zero, devmem keeps the headers
 * in a table of its own, keyed by the user pointer, never reads or
 * writes a block, and zeroes through zero(p, n) (which must be done, or
 * ordered before any later use of p, when it returns). */
typedef struct hpu__devmem_backing {
	void *(*map)(size_t bytes);
	void (*unmap)(void *p, size_t bytes);
	void (*open)(void);
	void (*close)(void);
	void (*label)(void *user, size_t bytes, hpu_mem_kind kind, const char *what);
	int remote;
	void (*zero)(void *p, size_t bytes);
} hpu__devmem_backing;

/* Takes the device's blocks from `b` (NULL: the system) from now on; call
 * before hpu__devmem_init, with no block in use. */
void hpu__devmem_set_backing(const hpu__devmem_backing *b);

/* Sets up the device of `rank` with `limit` bytes. Returns 0, or -1. */
int hpu__devmem_init(uint64_t limit, int rank);

/* 64-byte aligned, zeroed memory of `bytes` bytes for `what` ("optimizer
 * state", ...). NULL when the limit would be passed or the system has no
 * memory; then hpu__devmem_error() says so in one sentence naming the rank,
 * what, the size, InUse and Limit. */
void *hpu__dalloc(hpu_mem_kind kind, size_t bytes, const char *what);

/* The same without zeroing: for buffers the caller overwrites whole. */
void *hpu__dalloc_uninit(hpu_mem_kind kind, size_t bytes, const char *what);

/* Frees memory from hpu__dalloc (NULL is fine). */
void hpu__dfree(void *p);

/* The sentence of the calling thread's last failed allocation ("" if
 * none); per thread, like errno. */
const char *hpu__devmem_error(void);

void hpu__devmem_stats(hpu_device_stats *out);

/* Bytes of `kind` in use now and at their peak. */
uint64_t hpu__devmem_kind_in_use(hpu_mem_kind kind);
uint64_t hpu__devmem_kind_max(hpu_mem_kind kind);

/* The peak of parameters + gradients + optimizer state together (the
 * "model states" of the ZeRO paper). */
uint64_t hpu__devmem_states_max(void);

const char *hpu__mem_kind_name(hpu_mem_kind kind);

/* Recorded steps (worker/device's hpu__dev_capture_begin, every device):
 * a graph's kernels keep the addresses they recorded, so the blocks the
 * calling thread allocates or frees between hpu__devmem_capture_begin and
 * _end are held for that graph, named by the handle begin returns (never
 * 0). A held block is not handed out again, even once its owner frees it
 * (before or after _end), until every graph holding it is released
 * (hpu__devmem_graph_release; a block may be held by several, as by a
 * cache of graphs per batch shape); until then it counts as in use in
 * DeviceStats and its kind, and its free is counted when it is really
 * given back. Allocations of other threads are not held. */
uint32_t hpu__devmem_capture_begin(void);
/* While this thread records: a zeroed allocation (hpu__dalloc) also
 * calls fn(p, bytes), which records the zeroing (a replay must zero the
 * block again, as the recorded step did); NULL: none (a remote backing's
 * `zero` is the device's own, recorded where the device records). */
void hpu__devmem_record_zero(void (*fn)(void *p, size_t bytes));
void hpu__devmem_capture_end(void);
/* The graph is gone: its blocks whose owners freed them and that no other
 * graph holds go back to the pool. 0 is fine (nothing). */
void hpu__devmem_graph_release(uint32_t graph);
/* Blocks, and their requested bytes, that owners freed and graphs still
 * hold. */
void hpu__devmem_held(uint64_t *blocks, uint64_t *bytes);

/* The host tier: memory the offloading strategies keep outside the device
 * (ZeRO-Offload's CPU tier), bounded by `limit` bytes (0: none,
 * --host-memory) and counted apart, with the device's statistics.
 * hpu__halloc returns zeroed, 64-byte aligned memory, freed by hpu__dfree;
 * NULL over the limit or when the system refuses, with
 * hpu__devmem_error() naming what, the size, InUse and Limit.
 * hpu__hostmem_init resets the statistics (also done by
 * hpu__devmem_shutdown). */
int hpu__hostmem_init(uint64_t limit);
void *hpu__halloc(hpu_mem_kind kind, size_t bytes, const char *what);
void hpu__hostmem_stats(hpu_device_stats *out);
uint64_t hpu__hostmem_kind_max(hpu_mem_kind kind);
uint64_t hpu__hostmem_states_max(void);

/* Gives the cached blocks back to the system and forgets the device;
 * blocks still in use stay their owners' (freeing one later returns it to
 * the system). hpu__devmem_init() may follow. */
void hpu__devmem_shutdown(void);

#endif
