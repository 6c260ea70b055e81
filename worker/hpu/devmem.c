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
 */
#include "worker/hpu/devmem.h"
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

/* Who holds what: one pair per graph and block (under dev.mu). */
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

static struct {
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
} dev = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The graph this thread records for (hpu__devmem_capture_begin), or 0. */
static _Thread_local uint32_t recording;
/* While recording: how a zeroed allocation's zeroing is recorded too
 * (hpu__devmem_record_zero), so that every replay zeroes the block
 * again, as the step it replays did. */
static _Thread_local void (*rec_zero)(void *p, size_t bytes);

/* The strict device's arena, or NULL: the system's memory. */
static const hpu__devmem_backing *backing;

void hpu__devmem_set_backing(const hpu__devmem_backing *b)
{
	backing = b;
}

static void bk_open(void)
{
	if (backing && backing->open)
		backing->open();
}

static void bk_close(void)
{
	if (backing && backing->close)
		backing->close();
}

static void bk_label(void *user, size_t bytes, hpu_mem_kind kind, const char *what)
{
	if (backing && backing->label)
		backing->label(user, bytes, kind, what);
}

static bool bk_remote(void)
{
	return backing && backing->remote;
}

/* Like errno: the last failed allocation of the calling thread. */
static _Thread_local char err_buf[512];

static const char *const kind_names[HPU_MEM_NKINDS] = {
    "params", "grads", "optim", "acts", "comm", "other",
};

/* ---- sanitizer hooks: the cached part of a block is poisoned ---- */

static void poison(void *p, size_t n)
{
#ifdef DEVMEM_ASAN
	ASAN_POISON_MEMORY_REGION(p, n);
#else
	(void)p;
	(void)n;
#endif
}

static void unpoison(void *p, size_t n)
{
#ifdef DEVMEM_ASAN
	ASAN_UNPOISON_MEMORY_REGION(p, n);
#else
	(void)p;
	(void)n;
#endif
}

/* ---- helpers ---- */

static void *user_of(blk *b)
{
	return b->user ? b->user : (char *)b + HDR;
}

static size_t round_up(size_t n, size_t to)
{
	return (n + to - 1) / to * to;
}

static uint64_t class_of(size_t bytes)
{
	if (bytes <= SMALL_MAX)
		return bytes ? round_up(bytes, HDR) : HDR;
	return round_up(bytes + HDR, PAGE) - HDR;
}

static bool is_mapped(uint64_t rounded)
{
	return backing || rounded > SMALL_MAX;
}

static uint64_t cache_cap(void)
{
	return dev.limit ? dev.limit : UNLIMITED_CACHE;
}

static void fmt_bytes(char *buf, size_t len, uint64_t n)
{
	static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
	if (n < 1024) {
		snprintf(buf, len, "%llu byte%s", (unsigned long long)n,
			 n == 1 ? "" : "s");
		return;
	}
	double v = (double)n / 1024;
	int u = 0;
	while (v >= 1024 && u < 3) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, "%.1f %s", v, units[u]);
}

/* "rank 3: " once the device is set up, "devmem: " before. */
static void fmt_who(char *buf, size_t len)
{
	if (dev.initialized)
		snprintf(buf, len, "rank %d: ", dev.rank);
	else
		snprintf(buf, len, "devmem: ");
}

static void fmt_limit(char *buf, size_t len)
{
	if (dev.limit)
		fmt_bytes(buf, len, dev.limit);
	else
		snprintf(buf, len, "none");
}

static _Noreturn void bad_pointer(const void *p, const char *why)
{
	hpu__log(HPU_LOG_ERROR, "hpu__dfree(%p): %s", p, why);
	abort();
}

/* ---- the remote blocks' headers, by user pointer (under dev.mu) ---- */

static size_t tab_slot(const void *user, size_t cap)
{
	return (size_t)(((uintptr_t)user >> 6) * 0x9e3779b97f4a7c15ull) & (cap - 1);
}

static blk *tab_find(const void *user)
{
	if (!dev.tabn)
		return NULL;
	for (size_t i = tab_slot(user, dev.tabcap);; i = (i + 1) & (dev.tabcap - 1))
		if (!dev.tab[i] || dev.tab[i]->user == user)
			return dev.tab[i];
}

static void tab_put(blk **tab, size_t cap, blk *b)
{
	size_t i = tab_slot(b->user, cap);
	while (tab[i])
		i = (i + 1) & (cap - 1);
	tab[i] = b;
}

/* Adds b (at most half full); -1 with errno ENOMEM. */
static int tab_add(blk *b)
{
	if (2 * (dev.tabn + 1) > dev.tabcap) {
		size_t cap = dev.tabcap ? dev.tabcap * 2 : 256;
		blk **t = calloc(cap, sizeof *t);
		if (!t) {
			errno = ENOMEM;
			return -1;
		}
		for (size_t i = 0; i < dev.tabcap; i++)
			if (dev.tab[i])
				tab_put(t, cap, dev.tab[i]);
		free(dev.tab);
		dev.tab = t;
		dev.tabcap = cap;
	}
	tab_put(dev.tab, dev.tabcap, b);
	dev.tabn++;
	return 0;
}

/* Removes b, moving back the entries after it that probed past it. */
static void tab_del(blk *b)
{
	size_t m = dev.tabcap - 1, i = tab_slot(b->user, dev.tabcap);
	while (dev.tab[i] != b)
		i = (i + 1) & m;
	dev.tab[i] = NULL;
	for (size_t j = (i + 1) & m; dev.tab[j]; j = (j + 1) & m) {
		size_t home = tab_slot(dev.tab[j]->user, dev.tabcap);
		/* j's entry may move to the hole at i unless its home lies
		 * cyclically in (i, j] */
		if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
			dev.tab[i] = dev.tab[j];
			dev.tab[j] = NULL;
			i = j;
		}
	}
	dev.tabn--;
}

/* ---- the system ---- */

/* A remote block: the backing's memory, its header in host memory. */
static blk *remote_take(uint64_t rounded)
{
	blk *b = calloc(1, sizeof *b);
	if (!b) {
		errno = ENOMEM;
		return NULL;
	}
	b->user = backing->map(round_up(rounded, PAGE));
	if (!b->user) {
		int e = errno;
		free(b);
		errno = e ? e : ENOMEM;
		return NULL;
	}
	b->bk = backing;
	if (tab_add(b) < 0) {
		backing->unmap(b->user, round_up(rounded, PAGE));
		free(b);
		errno = ENOMEM;
		return NULL;
	}
	return b;
}

/* A new block of class `rounded` from the system, or NULL (errno set). */
static blk *sys_take(uint64_t rounded)
{
	blk *b;
	if (bk_remote()) {
		b = remote_take(rounded);
		if (!b)
			return NULL;
	} else if (backing) {
		b = backing->map(round_up(HDR + rounded, PAGE));
		if (!b)
			return NULL;
	} else if (is_mapped(rounded)) {
		void *m = mmap(NULL, HDR + rounded, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			return NULL;
		b = m;
	} else {
		b = aligned_alloc(HDR, HDR + rounded);
		if (!b) {
			errno = ENOMEM;
			return NULL;
		}
	}
	if (!bk_remote()) /* a remote header is calloc's */
		memset(b, 0, HDR);
	b->rounded = rounded;
	b->gen = dev.gen;
	dev.sys_allocs++;
	return b;
}

/* Gives `b` back to the system; `counted`: it belongs to this generation. */
static void sys_give(blk *b, bool counted)
{
	uint64_t rounded = b->rounded;
	if (b->user) {
		tab_del(b);
		b->bk->unmap(b->user, round_up(rounded, PAGE));
		free(b);
		if (counted)
			dev.sys_frees++;
		return;
	}
	unpoison(user_of(b), rounded);
	b->magic = MAGIC_DEAD;
	if (backing)
		backing->unmap(b, round_up(HDR + rounded, PAGE));
	else if (is_mapped(rounded))
		munmap(b, HDR + rounded);
	else
		free(b);
	if (counted)
		dev.sys_frees++;
}

/* ---- the cache: buckets of class heads, each heading a list ---- */

static blk **bucket_of(uint64_t rounded)
{
	uint64_t h = (rounded / HDR) * 0x9e3779b97f4a7c15ull;
	return &dev.buckets[h >> BUCKET_SHIFT];
}

/* The link that points at the head of class `rounded`, or at NULL. */
static blk **class_link(uint64_t rounded)
{
	blk **link = bucket_of(rounded);
	while (*link && (*link)->rounded != rounded)
		link = &(*link)->next_class;
	return link;
}

static void cache_put(blk *b)
{
	blk **link = class_link(b->rounded);
	blk *head = *link;
	b->magic = MAGIC_FREE;
	b->next = head;
	b->next_class = head ? head->next_class : NULL;
	*link = b;
	dev.cached += b->rounded;
	if (!b->user)
		poison(user_of(b), b->rounded);
}

static blk *cache_take(uint64_t rounded)
{
	blk **link = class_link(rounded);
	blk *b = *link;
	if (!b)
		return NULL;
	if (b->next) {
		b->next->next_class = b->next_class;
		*link = b->next;
	} else {
		*link = b->next_class;
	}
	dev.cached -= rounded;
	if (!b->user)
		unpoison(user_of(b), rounded);
	return b;
}

static void cache_drop(void)
{
	for (unsigned i = 0; i < NBUCKETS; i++) {
		blk *c = dev.buckets[i];
		while (c) {
			blk *next_class = c->next_class;
			while (c) {
				blk *next = c->next;
				sys_give(c, true);
				c = next;
			}
			c = next_class;
		}
		dev.buckets[i] = NULL;
	}
	dev.cached = 0;
}

/* ---- allocation ---- */

/* A block of class `rounded` for a request of `bytes`: from the cache, else
 * from the system, dropping the cache first when it would pass the limit
 * and once more when the system refuses. NULL with the error set. */
static blk *get_block(uint64_t rounded, size_t bytes, bool *fresh)
{
	blk *b = cache_take(rounded);
	*fresh = false;
	if (b)
		return b;
	*fresh = true;
	if (dev.limit && dev.t.in_use + dev.cached + bytes > dev.limit)
		cache_drop();
	b = sys_take(rounded);
	if (!b && dev.cached) {
		cache_drop();
		b = sys_take(rounded);
	}
	return b;
}

/* The sentence of a refused allocation: over the limit (e == 0), or the
 * system refused with errno e. */
static void set_alloc_error(size_t bytes, const char *what, int e)
{
	char who[32], req[32], used[32], lim[32];
	fmt_who(who, sizeof who);
	fmt_bytes(req, sizeof req, bytes);
	fmt_bytes(used, sizeof used, dev.t.in_use);
	fmt_limit(lim, sizeof lim);
	if (e == 0)
		snprintf(err_buf, sizeof err_buf,
			 "%sout of device memory allocating %s: %s requested, InUse %s, Limit %s (--device-memory)",
			 who, what, req, used, lim);
	else if (bk_remote()) /* the GPU's memory, not the host's */
		snprintf(err_buf, sizeof err_buf,
			 "%sout of device memory allocating %s: the device refused %s (%s) even with the cache given back; InUse %s, Limit %s",
			 who, what, req, strerror(e), used, lim);
	else
		snprintf(err_buf, sizeof err_buf,
			 "%sout of host memory allocating %s: the system refused %s (%s) even with the cache given back; InUse %s, Limit %s",
			 who, what, req, strerror(e), used, lim);
}

static void tally_alloc(tally *t, hpu_mem_kind kind, size_t bytes)
{
	t->in_use += bytes;
	if (t->in_use > t->max_in_use)
		t->max_in_use = t->in_use;
	if (bytes > t->max_alloc_size)
		t->max_alloc_size = bytes;
	t->num_allocs++;
	t->kind_in_use[kind] += bytes;
	if (t->kind_in_use[kind] > t->kind_max[kind])
		t->kind_max[kind] = t->kind_in_use[kind];
	uint64_t states = t->kind_in_use[HPU_MEM_PARAMS] + t->kind_in_use[HPU_MEM_GRADS] +
			  t->kind_in_use[HPU_MEM_OPTIM];
	if (states > t->states_max)
		t->states_max = states;
}

static void tally_free(tally *t, hpu_mem_kind kind, size_t bytes)
{
	t->in_use -= bytes;
	t->kind_in_use[kind] -= bytes;
	t->num_frees++;
}

/* ---- blocks held for recorded steps (under dev.mu) ---- */

/* Room for one pair more; -1 where the host has no memory. */
static int hold_room(void)
{
	if (dev.nholds < dev.capholds)
		return 0;
	size_t cap = dev.capholds ? dev.capholds * 2 : 256;
	hold *v = realloc(dev.holds, cap * sizeof *v);
	if (!v)
		return -1;
	dev.holds = v;
	dev.capholds = cap;
	return 0;
}

static bool held_by(const blk *b, uint32_t graph)
{
	for (size_t i = 0; i < dev.nholds; i++)
		if (dev.holds[i].b == b && dev.holds[i].graph == graph)
			return true;
	return false;
}

/* The recording graph holds b from now on (b HELD). Without room for the
 * pair, b is held for good: kept, never reused under a graph's nodes. */
static void hold_add(blk *b, uint32_t graph)
{
	b->flags |= HELD;
	if (held_by(b, graph))
		return;
	if (hold_room() < 0) {
		b->flags |= OWNER_FREED; /* never released: the pages stay */
		return;
	}
	dev.holds[dev.nholds++] = (hold){b, graph};
}

static void *dalloc(hpu_mem_kind kind, size_t bytes, const char *what, int zero)
{
	if ((unsigned)kind >= HPU_MEM_NKINDS) {
		hpu__log(HPU_LOG_ERROR, "hpu__dalloc: bad memory kind %d", (int)kind);
		abort();
	}
	if (!what)
		what = "memory";
	pthread_mutex_lock(&dev.mu);
	if (dev.limit && bytes > dev.limit - dev.t.in_use) {
		set_alloc_error(bytes, what, 0);
		pthread_mutex_unlock(&dev.mu);
		return NULL;
	}
	if (recording && hold_room() < 0) {
		set_alloc_error(bytes, what, ENOMEM);
		pthread_mutex_unlock(&dev.mu);
		return NULL;
	}
	bk_open();
	blk *b = NULL;
	bool fresh = false;
	if (bytes <= MAX_REQUEST)
		b = get_block(class_of(bytes), bytes, &fresh);
	else
		errno = ENOMEM;
	if (!b) {
		set_alloc_error(bytes, what, errno);
		bk_close();
		pthread_mutex_unlock(&dev.mu);
		return NULL;
	}
	b->magic = MAGIC_LIVE;
	b->bytes = bytes;
	b->kind = (uint16_t)kind;
	b->flags = 0;
	b->next = b->next_class = NULL;
	if (recording) /* the graph's nodes keep its address */
		hold_add(b, recording);
	if (!b->user)
		poison((char *)user_of(b) + bytes, b->rounded - bytes);
	tally_alloc(&dev.t, kind, bytes);
	bk_label(user_of(b), bytes, kind, what);
	void *user = user_of(b);
	const hpu__devmem_backing *rb = b->user ? b->bk : NULL;
	pthread_mutex_unlock(&dev.mu);
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

static void host_free(blk *b);

/* Gives b back: to the cache, or to the system (its owner and every
 * graph done with it). */
static void release_block(blk *b, void *p)
{
	bk_label(p, 0, HPU_MEM_OTHER, NULL);
	b->flags = 0;
	if (b->gen != dev.gen) {
		/* From before the last shutdown: not this device's. */
		sys_give(b, false);
		return;
	}
	tally_free(&dev.t, b->kind, b->bytes);
	if (dev.cached + b->rounded <= cache_cap())
		cache_put(b);
	else
		sys_give(b, true);
}

/* Frees b, the header of p, under dev.mu and the backing open: a block
 * that a recorded step holds, or freed while this thread records, stays
 * in use (counted in InUse) for the graphs until the last of them is
 * freed (hpu__devmem_graph_release). */
static void free_locked(blk *b, void *p)
{
	if (b->magic == MAGIC_FREE)
		bad_pointer(p, "double free");
	if (b->magic != MAGIC_LIVE || (b->flags & OWNER_FREED))
		bad_pointer(p, "not a pointer from hpu__dalloc (or freed twice)");
	if (recording)
		hold_add(b, recording);
	if (b->flags & HELD) {
		b->flags |= OWNER_FREED;
		return;
	}
	release_block(b, p);
}

void hpu__dfree(void *p)
{
	if (!p)
		return;
	if ((uintptr_t)p % HDR)
		bad_pointer(p, "not a pointer from hpu__dalloc (misaligned)");
	pthread_mutex_lock(&dev.mu);
	blk *b = tab_find(p); /* a remote block: its header is not at p */
	if (b) {
		bk_open();
		free_locked(b, p);
		bk_close();
		pthread_mutex_unlock(&dev.mu);
		return;
	}
	pthread_mutex_unlock(&dev.mu);
	b = (blk *)((char *)p - HDR);
	bk_open();
	if (b->magic == MAGIC_HOST) { /* the caller's block: no race on it */
		bk_close();
		host_free(b);
		return;
	}
	pthread_mutex_lock(&dev.mu);
	free_locked(b, p);
	bk_close();
	pthread_mutex_unlock(&dev.mu);
}

/* ---- set-up and statistics ---- */

int hpu__devmem_init(uint64_t limit, int rank)
{
	int rc = 0;
	pthread_mutex_lock(&dev.mu);
	if (dev.initialized) {
		snprintf(err_buf, sizeof err_buf,
			 "rank %d: device memory is set up already (rank %d)",
			 rank, dev.rank);
		rc = -1;
	} else if (limit && dev.t.in_use > limit) {
		char used[32], lim[32];
		fmt_bytes(used, sizeof used, dev.t.in_use);
		fmt_bytes(lim, sizeof lim, limit);
		snprintf(err_buf, sizeof err_buf,
			 "rank %d: %s of device memory is in use already, more than the Limit %s (--device-memory)",
			 rank, used, lim);
		rc = -1;
	} else {
		dev.initialized = true;
		dev.rank = rank;
		dev.limit = limit;
		if (dev.cached > cache_cap())
			cache_drop();
	}
	pthread_mutex_unlock(&dev.mu);
	return rc;
}

void hpu__devmem_shutdown(void)
{
	pthread_mutex_lock(&dev.mu);
	bk_open();
	cache_drop();
	bk_close();
	uint32_t gen = dev.gen + 1;
	dev.initialized = false;
	dev.rank = 0;
	dev.limit = 0;
	dev.gen = gen;
	memset(&dev.t, 0, sizeof dev.t);
	dev.sys_allocs = dev.sys_frees = 0;
	err_buf[0] = '\0';
	pthread_mutex_unlock(&dev.mu);
	hpu__hostmem_init(0);
}

const char *hpu__devmem_error(void)
{
	return err_buf;
}

static void tally_stats(const tally *t, uint64_t limit, uint64_t sys_allocs,
			uint64_t sys_frees, hpu_device_stats *out)
{
	*out = (hpu_device_stats){
		.limit = limit,
		.in_use = t->in_use,
		.max_in_use = t->max_in_use,
		.num_allocs = t->num_allocs,
		.num_frees = t->num_frees,
		.active_allocs = t->num_allocs - t->num_frees,
		.max_alloc_size = t->max_alloc_size,
		.total_system_allocs = sys_allocs,
		.total_system_frees = sys_frees,
		.total_active_allocs = sys_allocs - sys_frees,
	};
}

static void fill_stats(hpu_device_stats *out)
{
	tally_stats(&dev.t, dev.limit, dev.sys_allocs, dev.sys_frees, out);
}

void hpu__devmem_stats(hpu_device_stats *out)
{
	pthread_mutex_lock(&dev.mu);
	fill_stats(out);
	pthread_mutex_unlock(&dev.mu);
}

int hpu_device_stats_get(hpu_device_stats *out)
{
	pthread_mutex_lock(&dev.mu);
	bool up = dev.initialized;
	if (up)
		fill_stats(out);
	pthread_mutex_unlock(&dev.mu);
	return up ? HPU_OK : HPU_ENODEV;
}

static uint64_t locked_read(const uint64_t *v)
{
	pthread_mutex_lock(&dev.mu);
	uint64_t x = *v;
	pthread_mutex_unlock(&dev.mu);
	return x;
}

uint64_t hpu__devmem_kind_in_use(hpu_mem_kind kind)
{
	if ((unsigned)kind >= HPU_MEM_NKINDS)
		return 0;
	return locked_read(&dev.t.kind_in_use[kind]);
}

uint64_t hpu__devmem_kind_max(hpu_mem_kind kind)
{
	if ((unsigned)kind >= HPU_MEM_NKINDS)
		return 0;
	return locked_read(&dev.t.kind_max[kind]);
}

uint64_t hpu__devmem_states_max(void)
{
	return locked_read(&dev.t.states_max);
}

/* ---- recorded steps (hpu__devmem_capture_begin) ---- */

void hpu__devmem_record_zero(void (*fn)(void *p, size_t bytes))
{
	rec_zero = fn;
}

uint32_t hpu__devmem_capture_begin(void)
{
	pthread_mutex_lock(&dev.mu);
	if (++dev.last_graph == 0) /* 0 names none */
		dev.last_graph = 1;
	uint32_t g = dev.last_graph;
	pthread_mutex_unlock(&dev.mu);
	recording = g;
	return g;
}

void hpu__devmem_capture_end(void)
{
	recording = 0;
}

void hpu__devmem_graph_release(uint32_t graph)
{
	if (!graph)
		return;
	pthread_mutex_lock(&dev.mu);
	bk_open();
	size_t keep = 0;
	for (size_t i = 0; i < dev.nholds; i++) {
		hold h = dev.holds[i];
		if (h.graph != graph) {
			dev.holds[keep++] = h;
			continue;
		}
		/* the last pair of its block: other graphs' are before keep
		 * or after i */
		bool other = false;
		for (size_t j = 0; j < dev.nholds && !other; j++)
			other = j != i && dev.holds[j].b == h.b && dev.holds[j].graph != graph;
		if (other)
			continue;
		h.b->flags &= (uint16_t)~HELD;
		if (h.b->flags & OWNER_FREED)
			release_block(h.b, user_of(h.b));
	}
	dev.nholds = keep;
	bk_close();
	pthread_mutex_unlock(&dev.mu);
}

void hpu__devmem_held(uint64_t *blocks, uint64_t *bytes)
{
	*blocks = *bytes = 0;
	pthread_mutex_lock(&dev.mu);
	bk_open(); /* the headers */
	for (size_t i = 0; i < dev.nholds; i++) {
		const blk *b = dev.holds[i].b;
		bool first = true;
		for (size_t j = 0; j < i && first; j++)
			first = dev.holds[j].b != b;
		if (first && (b->flags & OWNER_FREED)) {
			(*blocks)++;
			*bytes += b->bytes;
		}
	}
	bk_close();
	pthread_mutex_unlock(&dev.mu);
}

const char *hpu__mem_kind_name(hpu_mem_kind kind)
{
	if ((unsigned)kind >= HPU_MEM_NKINDS)
		return "?";
	return kind_names[kind];
}

/* ---- the host tier ----
 *
 * Memory the offloading strategies keep outside the device (ZeRO-Offload's
 * CPU tier): counted against --host-memory, not --device-memory, with the
 * same statistics. Blocks have the device's header (MAGIC_HOST), so
 * hpu__dfree frees either kind; they are not cached: the tier holds a few
 * large, long-lived buffers, each one block of the system. */

static struct {
	pthread_mutex_t mu;
	uint64_t limit; /* 0: none */
	tally t;
} host = {.mu = PTHREAD_MUTEX_INITIALIZER};

int hpu__hostmem_init(uint64_t limit)
{
	pthread_mutex_lock(&host.mu);
	/* blocks still held stay counted in InUse; the peaks start anew */
	host.limit = limit;
	host.t.max_in_use = host.t.in_use;
	host.t.max_alloc_size = 0;
	memcpy(host.t.kind_max, host.t.kind_in_use, sizeof host.t.kind_max);
	host.t.states_max = 0;
	pthread_mutex_unlock(&host.mu);
	return 0;
}

/* The sentence of a refused host allocation: over the limit (e == 0), or
 * the system refused with errno e. Under host.mu. */
static void set_host_error(size_t bytes, const char *what, int e)
{
	char who[32], req[32], used[32], lim[32];
	pthread_mutex_lock(&dev.mu);
	fmt_who(who, sizeof who);
	pthread_mutex_unlock(&dev.mu);
	fmt_bytes(req, sizeof req, bytes);
	fmt_bytes(used, sizeof used, host.t.in_use);
	if (host.limit)
		fmt_bytes(lim, sizeof lim, host.limit);
	else
		snprintf(lim, sizeof lim, "none");
	snprintf(err_buf, sizeof err_buf,
		 "%sout of host memory allocating %s (offloaded): %s requested, InUse %s, Limit %s (--host-memory)%s%s",
		 who, what, req, used, lim, e ? ": " : "", e ? strerror(e) : "");
}

void *hpu__halloc(hpu_mem_kind kind, size_t bytes, const char *what)
{
	if ((unsigned)kind >= HPU_MEM_NKINDS) {
		hpu__log(HPU_LOG_ERROR, "hpu__halloc: bad memory kind %d", (int)kind);
		abort();
	}
	if (!what)
		what = "memory";
	/* held across the system call, as the device's lock is, so that the
	 * limit holds across threads */
	pthread_mutex_lock(&host.mu);
	if (host.limit && bytes > host.limit - host.t.in_use) {
		set_host_error(bytes, what, 0);
		pthread_mutex_unlock(&host.mu);
		return NULL;
	}
	blk *b = NULL;
	uint64_t rounded = bytes > MAX_REQUEST ? 0 : class_of(bytes);
	if (rounded && is_mapped(rounded)) { /* a fresh mapping is zero */
		void *m = mmap(NULL, HDR + rounded, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		b = m == MAP_FAILED ? NULL : m;
	} else if (rounded && (b = aligned_alloc(HDR, HDR + rounded))) {
		memset(b, 0, HDR + rounded);
	}
	if (!b) {
		set_host_error(bytes, what, ENOMEM);
		pthread_mutex_unlock(&host.mu);
		return NULL;
	}
	b->magic = MAGIC_HOST;
	b->bytes = bytes;
	b->rounded = rounded;
	b->kind = (uint16_t)kind;
	tally_alloc(&host.t, kind, bytes);
	pthread_mutex_unlock(&host.mu);
	return user_of(b);
}

static void host_free(blk *b)
{
	pthread_mutex_lock(&host.mu);
	tally_free(&host.t, b->kind, b->bytes);
	pthread_mutex_unlock(&host.mu);
	b->magic = MAGIC_DEAD;
	if (is_mapped(b->rounded))
		munmap(b, HDR + b->rounded);
	else
		free(b);
}

void hpu__hostmem_stats(hpu_device_stats *out)
{
	pthread_mutex_lock(&host.mu);
	/* every block is one of the system's */
	tally_stats(&host.t, host.limit, host.t.num_allocs, host.t.num_frees, out);
	pthread_mutex_unlock(&host.mu);
}

uint64_t hpu__hostmem_kind_max(hpu_mem_kind kind)
{
	if ((unsigned)kind >= HPU_MEM_NKINDS)
		return 0;
	pthread_mutex_lock(&host.mu);
	uint64_t v = host.t.kind_max[kind];
	pthread_mutex_unlock(&host.mu);
	return v;
}

uint64_t hpu__hostmem_states_max(void)
{
	pthread_mutex_lock(&host.mu);
	uint64_t v = host.t.states_max;
	pthread_mutex_unlock(&host.mu);
	return v;
}
