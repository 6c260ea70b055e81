/* devmem_pool: where blocks come from and go back to: the system (or the
 * backing), the remote blocks' headers by user pointer, and the cache of
 * freed blocks by size class. All under hpu__devmem.mu. */
#include "worker/hpu/devmem.h"
#include "worker/hpu/devmem_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- the remote blocks' headers, by user pointer ---- */

static size_t tab_slot(const void *user, size_t cap)
{
	return (size_t)(((uintptr_t)user >> 6) * 0x9e3779b97f4a7c15ull) & (cap - 1);
}

blk *hpu__devmem_tab_find(const void *user)
{
	if (!hpu__devmem.tabn)
		return NULL;
	for (size_t i = tab_slot(user, hpu__devmem.tabcap);; i = (i + 1) & (hpu__devmem.tabcap - 1))
		if (!hpu__devmem.tab[i] || hpu__devmem.tab[i]->user == user)
			return hpu__devmem.tab[i];
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
	if (2 * (hpu__devmem.tabn + 1) > hpu__devmem.tabcap) {
		size_t cap = hpu__devmem.tabcap ? hpu__devmem.tabcap * 2 : 256;
		blk **t = calloc(cap, sizeof *t);
		if (!t) {
			errno = ENOMEM;
			return -1;
		}
		for (size_t i = 0; i < hpu__devmem.tabcap; i++)
			if (hpu__devmem.tab[i])
				tab_put(t, cap, hpu__devmem.tab[i]);
		free(hpu__devmem.tab);
		hpu__devmem.tab = t;
		hpu__devmem.tabcap = cap;
	}
	tab_put(hpu__devmem.tab, hpu__devmem.tabcap, b);
	hpu__devmem.tabn++;
	return 0;
}

/* Removes b, moving back the entries after it that probed past it. */
static void tab_del(blk *b)
{
	size_t m = hpu__devmem.tabcap - 1, i = tab_slot(b->user, hpu__devmem.tabcap);
	while (hpu__devmem.tab[i] != b)
		i = (i + 1) & m;
	hpu__devmem.tab[i] = NULL;
	for (size_t j = (i + 1) & m; hpu__devmem.tab[j]; j = (j + 1) & m) {
		size_t home = tab_slot(hpu__devmem.tab[j]->user, hpu__devmem.tabcap);
		/* j's entry may move to the hole at i unless its home lies
		 * cyclically in (i, j] */
		if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
			hpu__devmem.tab[i] = hpu__devmem.tab[j];
			hpu__devmem.tab[j] = NULL;
			i = j;
		}
	}
	hpu__devmem.tabn--;
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
	b->user = hpu__devmem_bk->map(round_up(rounded, PAGE));
	if (!b->user) {
		int e = errno;
		free(b);
		errno = e ? e : ENOMEM;
		return NULL;
	}
	b->bk = hpu__devmem_bk;
	if (tab_add(b) < 0) {
		hpu__devmem_bk->unmap(b->user, round_up(rounded, PAGE));
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
	} else if (hpu__devmem_bk) {
		b = hpu__devmem_bk->map(round_up(HDR + rounded, PAGE));
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
	b->gen = hpu__devmem.gen;
	hpu__devmem.sys_allocs++;
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
			hpu__devmem.sys_frees++;
		return;
	}
	unpoison(user_of(b), rounded);
	b->magic = MAGIC_DEAD;
	if (hpu__devmem_bk)
		hpu__devmem_bk->unmap(b, round_up(HDR + rounded, PAGE));
	else if (is_mapped(rounded))
		munmap(b, HDR + rounded);
	else
		free(b);
	if (counted)
		hpu__devmem.sys_frees++;
}

/* ---- the cache: buckets of class heads, each heading a list ---- */

static blk **bucket_of(uint64_t rounded)
{
	uint64_t h = (rounded / HDR) * 0x9e3779b97f4a7c15ull;
	return &hpu__devmem.buckets[h >> BUCKET_SHIFT];
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
	hpu__devmem.cached += b->rounded;
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
	hpu__devmem.cached -= rounded;
	if (!b->user)
		unpoison(user_of(b), rounded);
	return b;
}

void hpu__devmem_cache_drop(void)
{
	for (unsigned i = 0; i < NBUCKETS; i++) {
		blk *c = hpu__devmem.buckets[i];
		while (c) {
			blk *next_class = c->next_class;
			while (c) {
				blk *next = c->next;
				sys_give(c, true);
				c = next;
			}
			c = next_class;
		}
		hpu__devmem.buckets[i] = NULL;
	}
	hpu__devmem.cached = 0;
}

/* ---- a block for a request, a block given back ---- */

/* A block of class `rounded` for a request of `bytes`: from the cache, else
 * from the system, dropping the cache first when it would pass the limit
 * and once more when the system refuses. NULL with the error set. */
blk *hpu__devmem_get_block(uint64_t rounded, size_t bytes, bool *fresh)
{
	blk *b = cache_take(rounded);
	*fresh = false;
	if (b)
		return b;
	*fresh = true;
	if (hpu__devmem.limit &&
	    hpu__devmem.t.in_use + hpu__devmem.cached + bytes > hpu__devmem.limit)
		hpu__devmem_cache_drop();
	b = sys_take(rounded);
	if (!b && hpu__devmem.cached) {
		hpu__devmem_cache_drop();
		b = sys_take(rounded);
	}
	return b;
}

/* Gives b back: to the cache, or to the system (its owner and every
 * graph done with it). */
void hpu__devmem_release_block(blk *b, void *p)
{
	bk_label(p, 0, HPU_MEM_OTHER, NULL);
	b->flags = 0;
	if (b->gen != hpu__devmem.gen) {
		/* From before the last shutdown: not this device's. */
		sys_give(b, false);
		return;
	}
	hpu__devmem_peak_free(p);
	hpu__devmem_tally_free(&hpu__devmem.t, b->kind, b->bytes);
	if (hpu__devmem.cached + b->rounded <= cache_cap())
		cache_put(b);
	else
		sys_give(b, true);
}
