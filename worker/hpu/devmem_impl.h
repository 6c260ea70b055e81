/* devmem's internals, shared by its files (worker/hpu/devmem*.c; see
 * devmem.c for the layout, the size classes, the accounting and the
 * locking). Internal to worker/hpu: no other folder includes it. */
#ifndef HPU_DEVMEM_IMPL_H
#define HPU_DEVMEM_IMPL_H

#include "worker/hpu/devmem.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__SANITIZE_ADDRESS__)
#define DEVMEM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DEVMEM_ASAN 1
#endif
#endif
#ifdef DEVMEM_ASAN
#include <sanitizer/asan_interface.h>
#endif

#define HDR 64u
#define SMALL_MAX (1u << 20)          /* largest request of a small class */
#define PAGE 4096u                    /* granule of the large classes */
#define UNLIMITED_CACHE (1ull << 30)  /* cache cap without a limit */
#define MAX_REQUEST ((size_t)1 << 62) /* larger is refused outright */
#define NBUCKETS 1024u                /* free-list hash buckets */
#define BUCKET_SHIFT 54               /* 64 - log2(NBUCKETS) */

#define MAGIC_LIVE 0x4c56696d65647068ull /* "hpdemiVL": in use */
#define MAGIC_FREE 0x4652696d65647068ull /* "hpdemiRF": in the cache */
#define MAGIC_DEAD 0x4144696d65647068ull /* given back to the system */
#define MAGIC_HOST 0x5448696d65647068ull /* "hpdemiHT": host tier, in use */

/* The header in front of every block. */
typedef struct blk {
	uint64_t magic;
	uint64_t bytes;         /* requested (while in use) */
	uint64_t rounded;       /* capacity of the user part: the class key */
	struct blk *next;       /* next cached block of the same class */
	struct blk *next_class; /* class heads only: next class in the bucket */
	uint16_t kind;
	uint16_t flags; /* HELD, OWNER_FREED: kept for recorded steps */
	uint32_t gen;   /* generation it was taken in */
	void *user;   /* remote blocks: the user pointer (else NULL) */
	const hpu__devmem_backing *bk; /* remote blocks: their backing */
} blk;
_Static_assert(sizeof(blk) == HDR, "the header must be 64 bytes");

/* A block some recorded step holds (its nodes keep the address): freed
 * for real only once its owner has freed it and no graph holds it. */
#define HELD 1u
#define OWNER_FREED 2u

/* Who holds what: one pair per graph and block (under hpu__devmem.mu). */
typedef struct hold {
	blk *b;
	uint32_t graph;
} hold;

/* What DeviceStats count of a pool, and the peaks per kind. */
typedef struct tally {
	uint64_t in_use, max_in_use, max_alloc_size;
	uint64_t num_allocs, num_frees;
	uint64_t kind_in_use[HPU_MEM_NKINDS], kind_max[HPU_MEM_NKINDS];
	uint64_t states_max; /* parameters + gradients + optimizer state */
} tally;

/* The device: one per process (devmem.c); its mutex guards every
 * field, the blocks' headers and the cache. */
struct devmem_state {
	pthread_mutex_t mu;
	bool initialized;
	int rank;
	uint64_t limit; /* 0: none */
	uint32_t gen;
	tally t;
	uint64_t sys_allocs, sys_frees;
	uint64_t cached;        /* rounded bytes in the cache */
	blk *buckets[NBUCKETS]; /* chains of class heads */
	blk **tab;              /* remote blocks' headers by user pointer */
	size_t tabcap, tabn;    /* slots (a power of two or 0), entries */
	hold *holds;            /* the graphs' blocks */
	size_t nholds, capholds;
	uint32_t last_graph;    /* the last graph's handle */
};
extern struct devmem_state hpu__devmem;

/* The strict device's arena, or NULL: the system's memory (devmem.c's
 * hpu__devmem_set_backing). */
extern const hpu__devmem_backing *hpu__devmem_bk;

/* Like errno: the last failed allocation of the calling thread
 * (hpu__devmem_error). */
extern _Thread_local char hpu__devmem_err[512];

/* ---- the backing's hooks, where it has them ---- */

static inline void bk_open(void)
{
	if (hpu__devmem_bk && hpu__devmem_bk->open)
		hpu__devmem_bk->open();
}

static inline void bk_close(void)
{
	if (hpu__devmem_bk && hpu__devmem_bk->close)
		hpu__devmem_bk->close();
}

static inline void bk_label(void *user, size_t bytes, hpu_mem_kind kind, const char *what)
{
	if (hpu__devmem_bk && hpu__devmem_bk->label)
		hpu__devmem_bk->label(user, bytes, kind, what);
}

static inline bool bk_remote(void)
{
	return hpu__devmem_bk && hpu__devmem_bk->remote;
}

/* ---- sanitizer hooks: the cached part of a block is poisoned ---- */

static inline void poison(void *p, size_t n)
{
#ifdef DEVMEM_ASAN
	ASAN_POISON_MEMORY_REGION(p, n);
#else
	(void)p;
	(void)n;
#endif
}

static inline void unpoison(void *p, size_t n)
{
#ifdef DEVMEM_ASAN
	ASAN_UNPOISON_MEMORY_REGION(p, n);
#else
	(void)p;
	(void)n;
#endif
}

/* ---- helpers ---- */

static inline void *user_of(blk *b)
{
	return b->user ? b->user : (char *)b + HDR;
}

static inline size_t round_up(size_t n, size_t to)
{
	return (n + to - 1) / to * to;
}

static inline uint64_t class_of(size_t bytes)
{
	if (bytes <= SMALL_MAX)
		return bytes ? round_up(bytes, HDR) : HDR;
	return round_up(bytes + HDR, PAGE) - HDR;
}

static inline bool is_mapped(uint64_t rounded)
{
	return hpu__devmem_bk || rounded > SMALL_MAX;
}

static inline uint64_t cache_cap(void)
{
	return hpu__devmem.limit ? hpu__devmem.limit : UNLIMITED_CACHE;
}

/* ---- devmem_stats.c: the counts, and the sentences' pieces ---- */

void hpu__devmem_tally_alloc(tally *t, hpu_mem_kind kind, size_t bytes);
void hpu__devmem_tally_free(tally *t, hpu_mem_kind kind, size_t bytes);
/* DeviceStats of a pool's counts. */
void hpu__devmem_tally_stats(const tally *t, uint64_t limit, uint64_t sys_allocs,
			     uint64_t sys_frees, hpu_device_stats *out);
/* n bytes as "12 bytes", "1.5 MiB" */
void hpu__devmem_fmt_bytes(char *buf, size_t len, uint64_t n);
/* "rank 3: " once the device is set up, "devmem: " before (under
 * hpu__devmem.mu). */
void hpu__devmem_fmt_who(char *buf, size_t len);

/* ---- devmem_peak.c: HPU_MEMORY_PEAK, the live blocks at the peak
 * (under hpu__devmem.mu; each does nothing while the report is off) ---- */

/* At hpu__devmem_init: on where HPU_MEMORY_PEAK names a directory. */
void hpu__devmem_peak_begin(void);
/* After a block's tally: p is live; a new InUse maximum copies the list. */
void hpu__devmem_peak_alloc(void *p, uint64_t bytes, int kind, const char *what);
/* Before a block's tally goes down: p is no longer live. */
void hpu__devmem_peak_free(void *p);
/* A refused allocation's sentence (the first is reported). */
void hpu__devmem_peak_refused(const char *sentence);
/* At shutdown: writes DIR/memory-peak-rank<R>.txt, and stops. */
void hpu__devmem_peak_end(void);

/* ---- devmem_pool.c: the system's blocks and the cache (under
 * hpu__devmem.mu) ---- */

/* A remote block's header by its user pointer, or NULL. */
blk *hpu__devmem_tab_find(const void *user);
/* Gives every cached block back to the system. */
void hpu__devmem_cache_drop(void);
/* A block of class `rounded` for a request of `bytes`: from the cache,
 * else from the system (*fresh). NULL with errno set. */
blk *hpu__devmem_get_block(uint64_t rounded, size_t bytes, bool *fresh);
/* Gives b (the header of p) back: to the cache, or to the system. */
void hpu__devmem_release_block(blk *b, void *p);

/* ---- devmem_hold.c: blocks held for recorded steps (under
 * hpu__devmem.mu) ---- */

/* Room for one pair more; -1 where the host has no memory. */
int hpu__devmem_hold_room(void);
/* The recording graph holds b from now on. */
void hpu__devmem_hold_add(blk *b, uint32_t graph);

/* ---- devmem_host.c: the host tier ---- */

/* Frees a host tier block (MAGIC_HOST), which hpu__dfree found. */
void hpu__devmem_host_free(blk *b);

#endif
