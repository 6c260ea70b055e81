/* devmem: the worker's device memory (see devmem.h).
 *
 * Layout. Every block taken from the system is a 64-byte header followed
 * by the user's memory, so the user pointer is 64-byte aligned:
 *
 *   [ blk (64 bytes) | user bytes ... up to blk->rounded ]
 *
 * Size classes. A request of `bytes` is served from a block whose user part
 * holds `rounded` bytes:
 *   - bytes <= 1 MiB: rounded = bytes rounded up to 64 (at least 64; a
 *     request of 0 bytes gets a 64-byte block of its own, so it still
 *     returns a unique pointer and counts as an allocation of 0 bytes);
 *     the block comes from aligned_alloc;
 *   - bytes > 1 MiB: header + rounded is a whole number of 4 KiB pages;
 *     the block comes from mmap, so giving it back returns it to the OS
 *     (and a fresh one is already zero).
 * Freed blocks are cached in free lists keyed by `rounded` and reused, most
 * recently freed first, by the next request of the same class.
 *
 * Accounting. InUse, MaxInUse, MaxAllocSize and the per-kind counters are in
 * requested bytes; the cache is counted in rounded bytes. The limit is
 * checked against InUse + request; the cache does not count against it, but
 * when InUse + cached + request would pass the limit, or the system refuses
 * memory, the whole cache is given back and the system is asked once more.
 * The cache holds at most `limit` bytes (1 GiB without a limit); a freed
 * block that does not fit goes straight back to the system.
 *
 * Locking. One mutex guards the device; it is held across the system calls
 * (so that the limit and the counts stay exact) but not while a block is
 * zeroed.
 *
 * Remote backings. Where the backing says host code may not touch its
 * blocks (GPU memory: devmem.h's `remote`), a block's header is not in
 * front of it but in host memory of its own (calloc), found from the user
 * pointer through a hash table (open addressing, linear probing); the
 * whole mapping is the user's, blocks are zeroed by the backing's `zero`
 * and never poisoned. A header's `user` is NULL for the others.
 *
 * Generations. hpu__devmem_shutdown gives the cache back and starts a new
 * generation; blocks still in use are left to their owners on purpose (they
 * may be freed later: a block of an older generation goes straight back to
 * the system without touching the new device's counts).
 *
 * Files. devmem.c: the device's state, allocation and freeing, set-up,
 * the recording's hooks; devmem_pool.c: blocks of the system and the
 * cache; devmem_hold.c: blocks held for recorded steps; devmem_stats.c:
 * the counts and DeviceStats; devmem_host.c: the host tier. Shared
 * declarations: devmem_impl.h.
 */
#include "worker/hpu/devmem.h"
#include "worker/hpu/devmem_impl.h"
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct devmem_state hpu__devmem = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The graph this thread records for (hpu__devmem_capture_begin), or 0. */
static _Thread_local uint32_t recording;
/* While recording: how a zeroed allocation's zeroing is recorded too
 * (hpu__devmem_record_zero), so that every replay zeroes the block
 * again, as the step it replays did. */
static _Thread_local void (*rec_zero)(void *p, size_t bytes);

/* ---- the backing ---- */

const hpu__devmem_backing *hpu__devmem_bk;

void hpu__devmem_set_backing(const hpu__devmem_backing *b)
{
	hpu__devmem_bk = b;
}

_Thread_local char hpu__devmem_err[512];

/* ---- the sentences ---- */

static void fmt_limit(char *buf, size_t len)
{
	if (hpu__devmem.limit)
		hpu__devmem_fmt_bytes(buf, len, hpu__devmem.limit);
	else
		snprintf(buf, len, "none");
}

static _Noreturn void bad_pointer(const void *p, const char *why)
{
	hpu__log(HPU_LOG_ERROR, "hpu__dfree(%p): %s", p, why);
	abort();
}

/* ---- allocation ---- */

/* The sentence of a refused allocation: over the limit (e == 0), or the
 * system refused with errno e. */
static void set_alloc_error(size_t bytes, const char *what, int e)
{
	char who[32], req[32], used[32], lim[32];
	hpu__devmem_fmt_who(who, sizeof who);
	hpu__devmem_fmt_bytes(req, sizeof req, bytes);
	hpu__devmem_fmt_bytes(used, sizeof used, hpu__devmem.t.in_use);
	fmt_limit(lim, sizeof lim);
	if (e == 0)
		snprintf(hpu__devmem_err, sizeof hpu__devmem_err,
			 "%sout of device memory allocating %s: %s requested, InUse %s, Limit %s (--device-memory)",
			 who, what, req, used, lim);
	else if (bk_remote()) /* the GPU's memory, not the host's */
		snprintf(hpu__devmem_err, sizeof hpu__devmem_err,
			 "%sout of device memory allocating %s: the device refused %s (%s) even with the cache given back; InUse %s, Limit %s",
			 who, what, req, strerror(e), used, lim);
	else /* the CPU device's memory is this machine's: its limit
	      * promised more than the process could get */
		snprintf(hpu__devmem_err, sizeof hpu__devmem_err,
			 "%sout of memory allocating %s: the system refused %s (%s) even with the cache given back; InUse %s, Limit %s (--device-memory: more than this process can get here, with ulimit -v, other jobs and --host-memory's tier; lower it, or free memory)",
			 who, what, req, strerror(e), used, lim);
	hpu__devmem_peak_refused(hpu__devmem_err);
}

static void *dalloc(hpu_mem_kind kind, size_t bytes, const char *what, int zero)
{
	if ((unsigned)kind >= HPU_MEM_NKINDS) {
		hpu__log(HPU_LOG_ERROR, "hpu__dalloc: bad memory kind %d", (int)kind);
		abort();
	}
	if (!what)
		what = "memory";
	pthread_mutex_lock(&hpu__devmem.mu);
	if (hpu__devmem.limit && bytes > hpu__devmem.limit - hpu__devmem.t.in_use) {
		set_alloc_error(bytes, what, 0);
		pthread_mutex_unlock(&hpu__devmem.mu);
		return NULL;
	}
	if (recording && hpu__devmem_hold_room() < 0) {
		set_alloc_error(bytes, what, ENOMEM);
		pthread_mutex_unlock(&hpu__devmem.mu);
		return NULL;
	}
	bk_open();
	blk *b = NULL;
	bool fresh = false;
	if (bytes <= MAX_REQUEST)
		b = hpu__devmem_get_block(class_of(bytes), bytes, &fresh);
	else
		errno = ENOMEM;
	if (!b) {
		set_alloc_error(bytes, what, errno);
		bk_close();
		pthread_mutex_unlock(&hpu__devmem.mu);
		return NULL;
	}
	b->magic = MAGIC_LIVE;
	b->bytes = bytes;
	b->kind = (uint16_t)kind;
	b->flags = 0;
	b->next = b->next_class = NULL;
	if (recording) /* the graph's nodes keep its address */
		hpu__devmem_hold_add(b, recording);
	if (!b->user)
		poison((char *)user_of(b) + bytes, b->rounded - bytes);
	hpu__devmem_tally_alloc(&hpu__devmem.t, kind, bytes);
	hpu__devmem_peak_alloc(user_of(b), bytes, kind, what);
	bk_label(user_of(b), bytes, kind, what);
	void *user = user_of(b);
	const hpu__devmem_backing *rb = b->user ? b->bk : NULL;
	pthread_mutex_unlock(&hpu__devmem.mu);
	/* The block is the caller's now: zero it outside the lock. A fresh
	 * mapping is zero already, but for a remote backing's. */
	if (zero && rb && bytes)
		rb->zero(user, bytes);
	else if (zero && !rb && !(fresh && is_mapped(b->rounded)))
		memset(user, 0, bytes);
	bk_close();
	if (zero && !rb && bytes && recording && rec_zero)
		rec_zero(user, bytes);
	return user;
}

void *hpu__dalloc(hpu_mem_kind kind, size_t bytes, const char *what)
{
	return dalloc(kind, bytes, what, 1);
}

void *hpu__dalloc_uninit(hpu_mem_kind kind, size_t bytes, const char *what)
{
	return dalloc(kind, bytes, what, 0);
}

/* Frees b, the header of p, under hpu__devmem.mu and the backing open: a
 * block that a recorded step holds, or freed while this thread records,
 * stays in use (counted in InUse) for the graphs until the last of them
 * is freed (hpu__devmem_graph_release). */
static void free_locked(blk *b, void *p)
{
	if (b->magic == MAGIC_FREE)
		bad_pointer(p, "double free");
	if (b->magic != MAGIC_LIVE || (b->flags & OWNER_FREED))
		bad_pointer(p, "not a pointer from hpu__dalloc (or freed twice)");
	if (recording)
		hpu__devmem_hold_add(b, recording);
	if (b->flags & HELD) {
		b->flags |= OWNER_FREED;
		return;
	}
	hpu__devmem_release_block(b, p);
}

void hpu__dfree(void *p)
{
	if (!p)
		return;
	if ((uintptr_t)p % HDR)
		bad_pointer(p, "not a pointer from hpu__dalloc (misaligned)");
	pthread_mutex_lock(&hpu__devmem.mu);
	blk *b = hpu__devmem_tab_find(p); /* a remote block: its header is not at p */
	if (b) {
		bk_open();
		free_locked(b, p);
		bk_close();
		pthread_mutex_unlock(&hpu__devmem.mu);
		return;
	}
	pthread_mutex_unlock(&hpu__devmem.mu);
	b = (blk *)((char *)p - HDR);
	bk_open();
	if (b->magic == MAGIC_HOST) { /* the caller's block: no race on it */
		bk_close();
		hpu__devmem_host_free(b);
		return;
	}
	pthread_mutex_lock(&hpu__devmem.mu);
	free_locked(b, p);
	bk_close();
	pthread_mutex_unlock(&hpu__devmem.mu);
}

/* ---- set-up ---- */

int hpu__devmem_init(uint64_t limit, int rank)
{
	int rc = 0;
	pthread_mutex_lock(&hpu__devmem.mu);
	if (hpu__devmem.initialized) {
		snprintf(hpu__devmem_err, sizeof hpu__devmem_err,
			 "rank %d: device memory is set up already (rank %d)",
			 rank, hpu__devmem.rank);
		rc = -1;
	} else if (limit && hpu__devmem.t.in_use > limit) {
		char used[32], lim[32];
		hpu__devmem_fmt_bytes(used, sizeof used, hpu__devmem.t.in_use);
		hpu__devmem_fmt_bytes(lim, sizeof lim, limit);
		snprintf(hpu__devmem_err, sizeof hpu__devmem_err,
			 "rank %d: %s of device memory is in use already, more than the Limit %s (--device-memory)",
			 rank, used, lim);
		rc = -1;
	} else {
		hpu__devmem.initialized = true;
		hpu__devmem.rank = rank;
		hpu__devmem.limit = limit;
		hpu__devmem_peak_begin();
		if (hpu__devmem.cached > cache_cap())
			hpu__devmem_cache_drop();
	}
	pthread_mutex_unlock(&hpu__devmem.mu);
	return rc;
}

void hpu__devmem_shutdown(void)
{
	pthread_mutex_lock(&hpu__devmem.mu);
	hpu__devmem_peak_end();
	bk_open();
	hpu__devmem_cache_drop();
	bk_close();
	uint32_t gen = hpu__devmem.gen + 1;
	hpu__devmem.initialized = false;
	hpu__devmem.rank = 0;
	hpu__devmem.limit = 0;
	hpu__devmem.gen = gen;
	memset(&hpu__devmem.t, 0, sizeof hpu__devmem.t);
	hpu__devmem.sys_allocs = hpu__devmem.sys_frees = 0;
	hpu__devmem_err[0] = '\0';
	pthread_mutex_unlock(&hpu__devmem.mu);
	hpu__hostmem_init(0);
}

const char *hpu__devmem_error(void)
{
	return hpu__devmem_err;
}
/* ---- recorded steps (hpu__devmem_capture_begin) ---- */

void hpu__devmem_record_zero(void (*fn)(void *p, size_t bytes))
{
	rec_zero = fn;
}

uint32_t hpu__devmem_capture_begin(void)
{
	pthread_mutex_lock(&hpu__devmem.mu);
	if (++hpu__devmem.last_graph == 0) /* 0 names none */
		hpu__devmem.last_graph = 1;
	uint32_t g = hpu__devmem.last_graph;
	pthread_mutex_unlock(&hpu__devmem.mu);
	recording = g;
	return g;
}

void hpu__devmem_capture_end(void)
{
	recording = 0;
}
