/* Unit tests for the device memory (worker/hpu/devmem.c).
 *
 * Checked: the statistics against a model of them after random sequences of
 * allocations and frees (and their invariants), alignment and zeroing (of
 * fresh and of recycled, dirtied blocks), reuse of cached blocks, the limit
 * (its error sentence, and that a refused allocation changes nothing), the
 * cache given back to fit an allocation, the system refusing memory, the
 * cache cap, the per-kind and model-states peaks, set-up and shutdown, four
 * threads at once, and the abort on a bad pointer. A remote backing (GPU
 * memory, devmem.h): its blocks are mapped without access, so that devmem
 * touching one (a header in front of it, a memset) faults; zeroed through
 * the backing, reused, freed after a shutdown.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fileio.h"
#include "worker/hpu/devmem.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)

static uint64_t rng_next(uint64_t *s)
{
	/* xorshift64* */
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1dull;
}

static hpu_device_stats stats(void)
{
	hpu_device_stats s;
	hpu__devmem_stats(&s);
	return s;
}

static uint64_t kinds_in_use(void)
{
	uint64_t sum = 0;
	for (int k = 0; k < HPU_MEM_NKINDS; k++)
		sum += hpu__devmem_kind_in_use((hpu_mem_kind)k);
	return sum;
}

/* The invariants that hold whatever happened before. */
static void assert_invariants(void)
{
	hpu_device_stats s = stats();
	assert_true(s.in_use <= s.max_in_use);
	if (s.limit)
		assert_true(s.max_in_use <= s.limit);
	assert_true(s.max_alloc_size <= s.max_in_use);
	assert_int_equal(s.num_allocs - s.num_frees, s.active_allocs);
	assert_int_equal(s.total_system_allocs - s.total_system_frees,
			 s.total_active_allocs);
	assert_true(s.total_active_allocs >= s.active_allocs);
	assert_int_equal(kinds_in_use(), s.in_use);
}

static int is_zero(const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

static void assert_fresh(void *p, size_t n)
{
	assert_non_null(p);
	assert_int_equal((uintptr_t)p % 64, 0);
	assert_true(is_zero(p, n));
}

static int setup_unlimited(void **state)
{
	(void)state;
	return hpu__devmem_init(0, 0);
}

static int teardown(void **state)
{
	(void)state;
	assert_invariants();
	hpu__devmem_shutdown();
	return 0;
}

/* Runs first: the device is not set up yet. */
static void test_before_init(void **state)
{
	(void)state;
	hpu_device_stats s;
	assert_int_equal(hpu_device_stats_get(&s), HPU_ENODEV);
	void *p = hpu__dalloc(HPU_MEM_OTHER, 3 * MiB, "scratch");
	assert_fresh(p, 3 * MiB);
	s = stats();
	assert_int_equal(s.limit, 0);
	assert_int_equal(s.in_use, 3 * MiB);
	assert_int_equal(s.num_allocs, 1);
	hpu__dfree(p);
	assert_invariants();
	/* What was allocated before set-up stays counted after it. */
	void *q = hpu__dalloc(HPU_MEM_PARAMS, 100, "weights");
	assert_int_equal(hpu__devmem_init(1 * MiB, 4), 0);
	assert_int_equal(hpu_device_stats_get(&s), 0);
	assert_int_equal(s.limit, 1 * MiB);
	assert_int_equal(s.in_use, 100);
	assert_int_equal(hpu__devmem_init(1 * MiB, 4), -1);
	hpu__dfree(q);
	assert_int_equal(stats().in_use, 0);
	hpu__devmem_shutdown();
	assert_int_equal(hpu_device_stats_get(&s), HPU_ENODEV);
	/* Set-up fails when more is in use than the limit allows. */
	q = hpu__dalloc(HPU_MEM_PARAMS, 2 * KiB, "weights");
	assert_int_equal(hpu__devmem_init(1 * KiB, 0), -1);
	printf("init error: %s\n", hpu__devmem_error());
	assert_non_null(strstr(hpu__devmem_error(), "Limit 1.0 KiB"));
	hpu__dfree(q);
	hpu__devmem_shutdown();
}

static void test_kind_names(void **state)
{
	(void)state;
	const char *want[] = {"params", "grads", "optim",
			      "acts",   "comm",  "other"};
	for (int k = 0; k < HPU_MEM_NKINDS; k++)
		assert_string_equal(hpu__mem_kind_name((hpu_mem_kind)k),
				    want[k]);
	assert_string_equal(hpu__mem_kind_name(HPU_MEM_NKINDS), "?");
}

static void test_alignment_and_zero(void **state)
{
	(void)state;
	const size_t sizes[] = {0,       1,           7,
				63,      64,          65,
				1000,    4096,        65536 + 3,
				1 * MiB, 1 * MiB + 1, 3 * MiB + 17};
	enum { N = sizeof(sizes) / sizeof(sizes[0]) };
	void *p[N];
	uint64_t total = 0;
	for (int i = 0; i < N; i++) {
		p[i] = hpu__dalloc((hpu_mem_kind)(i % HPU_MEM_NKINDS), sizes[i],
				  "test block");
		assert_fresh(p[i], sizes[i]);
		memset(p[i], 0xcd, sizes[i]); /* ASan: every byte is ours */
		total += sizes[i];
	}
	for (int i = 0; i < N; i++)
		for (int j = 0; j < i; j++)
			assert_ptr_not_equal(p[i], p[j]);
	hpu_device_stats s = stats();
	assert_int_equal(s.in_use, total);
	assert_int_equal(s.num_allocs, N);
	assert_int_equal(s.max_alloc_size, 3 * MiB + 17);
	assert_int_equal(s.total_system_allocs, N);
	for (int i = 0; i < N; i++)
		hpu__dfree(p[i]);
	hpu__dfree(NULL);
	s = stats();
	assert_int_equal(s.in_use, 0);
	assert_int_equal(s.num_frees, N);
	assert_int_equal(s.total_active_allocs, N); /* all cached */
}

/* A block of 0 bytes: a unique pointer to a block of its own, counted as
 * an allocation of 0 bytes. */
static void test_zero_bytes(void **state)
{
	(void)state;
	void *a = hpu__dalloc(HPU_MEM_OTHER, 0, "nothing");
	void *b = hpu__dalloc(HPU_MEM_OTHER, 0, "nothing");
	assert_fresh(a, 0);
	assert_fresh(b, 0);
	assert_ptr_not_equal(a, b);
	hpu_device_stats s = stats();
	assert_int_equal(s.num_allocs, 2);
	assert_int_equal(s.in_use, 0);
	assert_int_equal(s.max_alloc_size, 0);
	hpu__dfree(a);
	hpu__dfree(b);
	assert_int_equal(stats().active_allocs, 0);
}

/* alloc / dirty / free / alloc of the same class: the same block comes back,
 * from the cache, zeroed. */
static void check_reuse(size_t bytes, size_t again)
{
	void *p = hpu__dalloc(HPU_MEM_ACTS, bytes, "activations");
	assert_fresh(p, bytes);
	memset(p, 0xab, bytes);
	hpu__dfree(p);
	hpu_device_stats before = stats();
	void *q = hpu__dalloc(HPU_MEM_ACTS, again, "activations");
	assert_ptr_equal(q, p);
	assert_fresh(q, again);
	hpu_device_stats after = stats();
	assert_int_equal(after.total_system_allocs, before.total_system_allocs);
	assert_int_equal(after.total_active_allocs, before.total_active_allocs);
	assert_int_equal(after.num_allocs, before.num_allocs + 1);
	assert_int_equal(after.in_use, again);
	hpu__dfree(q);
}

static void test_reuse_zeroes(void **state)
{
	(void)state;
	check_reuse(1000, 1000);
	check_reuse(1000, 1020);            /* both round to 1024 */
	check_reuse(64, 1);
	check_reuse(1 * MiB, 1 * MiB);      /* largest small class */
	check_reuse(3 * MiB, 3 * MiB);      /* mmap */
	check_reuse(3 * MiB + 100, 3 * MiB + 5); /* one 4 KiB class */
	/* A different class does not take the cached block. */
	uint64_t sys = stats().total_system_allocs;
	void *p = hpu__dalloc(HPU_MEM_ACTS, 2000, "activations");
	assert_int_equal(stats().total_system_allocs, sys + 1);
	hpu__dfree(p);
}

/* The peaks per kind and of parameters + gradients + optimizer state. */
static void test_states_max(void **state)
{
	(void)state;
	void *params = hpu__dalloc(HPU_MEM_PARAMS, 100, "parameters");
	void *grads = hpu__dalloc(HPU_MEM_GRADS, 50, "gradients"); /* 150 */
	hpu__dfree(grads);                                          /* 100 */
	void *optim = hpu__dalloc(HPU_MEM_OPTIM, 80, "moments");   /* 180 */
	void *acts = hpu__dalloc(HPU_MEM_ACTS, 1000, "activations");
	hpu__dfree(params);                                         /* 80 */
	grads = hpu__dalloc(HPU_MEM_GRADS, 120, "gradients");       /* 200 */
	void *comm = hpu__dalloc(HPU_MEM_COMM, 10, "staging");
	hpu__dfree(optim);                                          /* 120 */
	void *more = hpu__dalloc(HPU_MEM_PARAMS, 40, "gathered");   /* 160 */
	assert_int_equal(hpu__devmem_states_max(), 200);
	assert_int_equal(hpu__devmem_kind_max(HPU_MEM_PARAMS), 100);
	assert_int_equal(hpu__devmem_kind_max(HPU_MEM_GRADS), 120);
	assert_int_equal(hpu__devmem_kind_max(HPU_MEM_OPTIM), 80);
	assert_int_equal(hpu__devmem_kind_max(HPU_MEM_ACTS), 1000);
	assert_int_equal(hpu__devmem_kind_max(HPU_MEM_COMM), 10);
	assert_int_equal(hpu__devmem_kind_max(HPU_MEM_OTHER), 0);
	assert_int_equal(hpu__devmem_kind_in_use(HPU_MEM_PARAMS), 40);
	assert_int_equal(hpu__devmem_kind_in_use(HPU_MEM_GRADS), 120);
	assert_int_equal(hpu__devmem_kind_in_use(HPU_MEM_OPTIM), 0);
	hpu_device_stats s = stats();
	assert_int_equal(s.in_use, 40 + 120 + 1000 + 10);
	assert_int_equal(s.max_in_use, 1000 + 80 + 120 + 10);
	hpu__dfree(acts);
	hpu__dfree(grads);
	hpu__dfree(comm);
	hpu__dfree(more);
	assert_int_equal(hpu__devmem_states_max(), 200);
}

/* A model of the counters that the device must match after every step. */
typedef struct model {
	uint64_t limit, in_use, max_in_use, max_alloc;
	uint64_t allocs, frees;
	uint64_t kind[HPU_MEM_NKINDS], kind_max[HPU_MEM_NKINDS], states_max;
} model;

static void assert_matches(const model *m)
{
	hpu_device_stats s = stats();
	assert_int_equal(s.limit, m->limit);
	assert_int_equal(s.in_use, m->in_use);
	assert_int_equal(s.max_in_use, m->max_in_use);
	assert_int_equal(s.max_alloc_size, m->max_alloc);
	assert_int_equal(s.num_allocs, m->allocs);
	assert_int_equal(s.num_frees, m->frees);
	for (int k = 0; k < HPU_MEM_NKINDS; k++) {
		assert_int_equal(hpu__devmem_kind_in_use((hpu_mem_kind)k),
				 m->kind[k]);
		assert_int_equal(hpu__devmem_kind_max((hpu_mem_kind)k),
				 m->kind_max[k]);
	}
	assert_int_equal(hpu__devmem_states_max(), m->states_max);
	assert_invariants();
}

static size_t random_size(uint64_t *rng)
{
	uint64_t r = rng_next(rng);
	switch (r % 8) {
	case 0:
		return (size_t)(r >> 8) % (3 * MiB); /* large, maybe mmap */
	case 1:
		return (size_t)(r >> 8) % 128; /* tiny, maybe 0 */
	case 2:
		return 1000; /* a few fixed sizes: reuse */
	case 3:
		return 64 * KiB;
	default:
		return (size_t)(r >> 8) % (64 * KiB);
	}
}

static void run_random(uint64_t limit, uint64_t seed)
{
	enum { SLOTS = 48, STEPS = 4000 };
	assert_int_equal(hpu__devmem_init(limit, 2), 0);
	model m = {.limit = limit};
	void *ptr[SLOTS] = {0};
	size_t len[SLOTS] = {0};
	int kind[SLOTS] = {0};
	uint64_t rng = seed;
	int refused = 0;
	for (int step = 0; step < STEPS; step++) {
		int i = (int)(rng_next(&rng) % SLOTS);
		if (ptr[i]) {
			/* the block still holds its tag: nothing overlapped */
			unsigned char *b = ptr[i];
			if (len[i])
				assert_true(b[0] == (unsigned char)i &&
					    b[len[i] - 1] == (unsigned char)i);
			hpu__dfree(ptr[i]);
			ptr[i] = NULL;
			m.in_use -= len[i];
			m.kind[kind[i]] -= len[i];
			m.frees++;
			assert_matches(&m);
			continue;
		}
		size_t n = random_size(&rng);
		int k = (int)(rng_next(&rng) % HPU_MEM_NKINDS);
		hpu_device_stats before = stats();
		void *p = hpu__dalloc((hpu_mem_kind)k, n, "random block");
		if (limit && m.in_use + n > limit) {
			assert_null(p);
			hpu_device_stats after = stats();
			assert_memory_equal(&before, &after, sizeof before);
			refused++;
			continue;
		}
		assert_fresh(p, n);
		memset(p, i, n);
		ptr[i] = p;
		len[i] = n;
		kind[i] = k;
		m.in_use += n;
		m.max_in_use = m.in_use > m.max_in_use ? m.in_use : m.max_in_use;
		m.max_alloc = n > m.max_alloc ? n : m.max_alloc;
		m.allocs++;
		m.kind[k] += n;
		if (m.kind[k] > m.kind_max[k])
			m.kind_max[k] = m.kind[k];
		uint64_t st = m.kind[HPU_MEM_PARAMS] + m.kind[HPU_MEM_GRADS] +
			      m.kind[HPU_MEM_OPTIM];
		if (st > m.states_max)
			m.states_max = st;
		assert_matches(&m);
	}
	for (int i = 0; i < SLOTS; i++)
		hpu__dfree(ptr[i]);
	hpu_device_stats s = stats();
	assert_int_equal(s.in_use, 0);
	assert_int_equal(s.active_allocs, 0);
	assert_invariants();
	printf("limit %llu: %llu allocations, %d refused, %llu system allocations, %llu system frees\n",
	       (unsigned long long)limit, (unsigned long long)s.num_allocs,
	       refused, (unsigned long long)s.total_system_allocs,
	       (unsigned long long)s.total_system_frees);
	if (limit)
		assert_true(refused > 0);
	hpu__devmem_shutdown();
}

static void test_random_sequences(void **state)
{
	(void)state;
	run_random(0, 0x1234567);
	run_random(6 * MiB, 0x9abcdef);
	run_random(2 * MiB + 100, 42);
}

/* The example of the brief: 12 MiB of optimizer state on rank 1 with 48 of
 * 56 MiB in use. */
static void test_limit_error(void **state)
{
	(void)state;
	assert_int_equal(hpu__devmem_init(56 * MiB, 1), 0);
	assert_string_equal(hpu__devmem_error(), "");
	void *params = hpu__dalloc(HPU_MEM_PARAMS, 48 * MiB, "parameters");
	assert_non_null(params);
	hpu_device_stats before = stats();
	uint64_t kin[HPU_MEM_NKINDS], kmax[HPU_MEM_NKINDS];
	for (int k = 0; k < HPU_MEM_NKINDS; k++) {
		kin[k] = hpu__devmem_kind_in_use((hpu_mem_kind)k);
		kmax[k] = hpu__devmem_kind_max((hpu_mem_kind)k);
	}
	uint64_t smax = hpu__devmem_states_max();

	void *p = hpu__dalloc(HPU_MEM_OPTIM, 12 * MiB,
			     "optimizer state (adamw moments)");
	assert_null(p);
	printf("limit error: %s\n", hpu__devmem_error());
	assert_string_equal(
	    hpu__devmem_error(),
	    "rank 1: out of device memory allocating optimizer state (adamw moments): 12.0 MiB requested, InUse 48.0 MiB, Limit 56.0 MiB (--device-memory)");

	/* Nothing changed. */
	hpu_device_stats after = stats();
	assert_memory_equal(&before, &after, sizeof before);
	for (int k = 0; k < HPU_MEM_NKINDS; k++) {
		assert_int_equal(hpu__devmem_kind_in_use((hpu_mem_kind)k),
				 kin[k]);
		assert_int_equal(hpu__devmem_kind_max((hpu_mem_kind)k), kmax[k]);
	}
	assert_int_equal(hpu__devmem_states_max(), smax);

	/* Exactly up to the limit is fine; one byte more is not. */
	p = hpu__dalloc(HPU_MEM_OPTIM, 8 * MiB, "optimizer state");
	assert_non_null(p);
	assert_int_equal(stats().in_use, 56 * MiB);
	assert_null(hpu__dalloc(HPU_MEM_OTHER, 1, "one byte"));
	assert_string_equal(
	    hpu__devmem_error(),
	    "rank 1: out of device memory allocating one byte: 1 byte requested, InUse 56.0 MiB, Limit 56.0 MiB (--device-memory)");
	assert_null(hpu__dalloc(HPU_MEM_OTHER, SIZE_MAX, "everything"));
	assert_int_equal(stats().max_in_use, 56 * MiB);
	hpu__dfree(p);
	hpu__dfree(params);
	assert_invariants();
	hpu__devmem_shutdown();
	assert_string_equal(hpu__devmem_error(), "");
}

/* An allocation that fits only once the cache is given back. */
static void check_cache_dropped(uint64_t limit, size_t first, size_t second)
{
	assert_int_equal(hpu__devmem_init(limit, 0), 0);
	void *a = hpu__dalloc(HPU_MEM_ACTS, first, "first");
	assert_non_null(a);
	memset(a, 1, first);
	hpu__dfree(a);
	hpu_device_stats s = stats();
	assert_int_equal(s.total_active_allocs, 1); /* cached */
	assert_int_equal(s.total_system_frees, 0);
	void *b = hpu__dalloc(HPU_MEM_ACTS, second, "second");
	assert_fresh(b, second);
	s = stats();
	assert_int_equal(s.in_use, second);
	assert_int_equal(s.total_system_allocs, 2);
	assert_int_equal(s.total_system_frees, 1); /* the cache went back */
	assert_int_equal(s.total_active_allocs, 1);
	hpu__dfree(b);
	assert_invariants();
	hpu__devmem_shutdown();
}

static void test_cache_dropped(void **state)
{
	(void)state;
	check_cache_dropped(1 * MiB, 600 * KiB, 700 * KiB);
	check_cache_dropped(8 * MiB, 5 * MiB, 6 * MiB);
	/* When both fit, the cache stays. */
	assert_int_equal(hpu__devmem_init(1 * MiB, 0), 0);
	void *a = hpu__dalloc(HPU_MEM_ACTS, 100 * KiB, "first");
	hpu__dfree(a);
	void *b = hpu__dalloc(HPU_MEM_ACTS, 200 * KiB, "second");
	assert_non_null(b);
	hpu_device_stats s = stats();
	assert_int_equal(s.total_system_frees, 0);
	assert_int_equal(s.total_active_allocs, 2);
	hpu__dfree(b);
	hpu__devmem_shutdown();
}

/* The system refusing memory: the cache is given back, the allocation
 * fails with a sentence, nothing else changes. */
static void test_system_refuses(void **state)
{
	(void)state;
	void *a = hpu__dalloc(HPU_MEM_OTHER, 1000, "small");
	hpu__dfree(a);
	void *keep = hpu__dalloc(HPU_MEM_PARAMS, 5000, "weights");
	hpu_device_stats before = stats();
	assert_int_equal(before.total_active_allocs, 2);
	void *p = hpu__dalloc(HPU_MEM_ACTS, (size_t)1 << 60, "a huge batch");
	assert_null(p);
	printf("system error: %s\n", hpu__devmem_error());
	const char *e = hpu__devmem_error();
	assert_non_null(strstr(e, "rank 0: "));
	assert_non_null(strstr(e, "out of memory allocating a huge batch: the system refused 1048576.0 TiB (Cannot allocate memory) even with the cache given back"));
	/* what to change (it read "out of host memory", --host-memory's words) */
	assert_non_null(strstr(e, "(--device-memory: more than this process can get here"));
	assert_non_null(strstr(e, "InUse 4.9 KiB"));
	assert_non_null(strstr(e, "Limit none"));
	hpu_device_stats after = stats();
	assert_int_equal(after.total_system_frees, 1); /* the cached block */
	assert_int_equal(after.total_active_allocs, 1);
	assert_int_equal(after.num_allocs, before.num_allocs);
	assert_int_equal(after.in_use, before.in_use);
	assert_int_equal(after.max_alloc_size, before.max_alloc_size);
	assert_null(hpu__dalloc(HPU_MEM_ACTS, SIZE_MAX, "everything"));
	assert_non_null(strstr(hpu__devmem_error(), "the system refused"));
	hpu__dfree(keep);
}

/* Without a limit the cache holds at most 1 GiB; a block that does not fit
 * goes back to the system. (Fresh mappings are never touched here.) */
static void test_cache_cap(void **state)
{
	(void)state;
	void *a = hpu__dalloc(HPU_MEM_ACTS, 600 * MiB, "big");
	void *b = hpu__dalloc(HPU_MEM_ACTS, 600 * MiB, "big");
	assert_non_null(a);
	assert_non_null(b);
	hpu__dfree(a);
	hpu__dfree(b);
	hpu_device_stats s = stats();
	assert_int_equal(s.total_system_allocs, 2);
	assert_int_equal(s.total_system_frees, 1);
	assert_int_equal(s.total_active_allocs, 1);
}

/* Shutdown gives the cache back and forgets the counts; a block that was
 * still in use then is freed later without touching the new device. */
static void test_shutdown_and_again(void **state)
{
	(void)state;
	assert_int_equal(hpu__devmem_init(0, 7), 0);
	void *old = hpu__dalloc(HPU_MEM_PARAMS, 3 * MiB, "old");
	void *cached = hpu__dalloc(HPU_MEM_PARAMS, 100, "old");
	hpu__dfree(cached);
	hpu__devmem_shutdown();
	hpu_device_stats s;
	assert_int_equal(hpu_device_stats_get(&s), HPU_ENODEV);
	assert_int_equal(hpu__devmem_init(1 * MiB, 8), 0);
	void *p = hpu__dalloc(HPU_MEM_GRADS, 200, "new");
	hpu__dfree(old);
	assert_int_equal(hpu_device_stats_get(&s), 0);
	assert_int_equal(s.limit, 1 * MiB);
	assert_int_equal(s.in_use, 200);
	assert_int_equal(s.num_allocs, 1);
	assert_int_equal(s.num_frees, 0);
	assert_int_equal(s.total_system_allocs, 1);
	assert_int_equal(s.total_system_frees, 0);
	assert_int_equal(hpu__devmem_kind_in_use(HPU_MEM_PARAMS), 0);
	hpu__dfree(p);
	assert_invariants();
	hpu__devmem_shutdown();
}

/* Four threads: the counts stay exact, no two blocks overlap. */
enum { THREADS = 4, THREAD_STEPS = 20000, THREAD_SLOTS = 32 };

typedef struct worker {
	int id;
	uint64_t allocs, frees, refused;
} worker;

static void *thread_main(void *arg)
{
	worker *w = arg;
	void *ptr[THREAD_SLOTS] = {0};
	size_t len[THREAD_SLOTS] = {0};
	uint64_t rng = 0x5eed + (uint64_t)w->id * 7919;
	unsigned char tag = (unsigned char)(0x10 + w->id);
	int failures = 0;
	for (int step = 0; step < THREAD_STEPS; step++) {
		int i = (int)(rng_next(&rng) % THREAD_SLOTS);
		if (ptr[i]) {
			unsigned char *b = ptr[i];
			for (size_t j = 0; j < len[i]; j += 61)
				failures += b[j] != tag;
			hpu__dfree(ptr[i]);
			ptr[i] = NULL;
			w->frees++;
			continue;
		}
		uint64_t r = rng_next(&rng);
		size_t n = r % 64 == 0 ? 1 * MiB + (r >> 40) % MiB
				       : (size_t)(r >> 20) % (16 * KiB);
		void *p = hpu__dalloc((hpu_mem_kind)((r >> 8) % HPU_MEM_NKINDS),
				     n, "thread block");
		if (!p) {
			w->refused++;
			continue;
		}
		failures += (uintptr_t)p % 64 != 0;
		failures += !is_zero(p, n);
		memset(p, tag, n);
		ptr[i] = p;
		len[i] = n;
		w->allocs++;
	}
	for (int i = 0; i < THREAD_SLOTS; i++)
		if (ptr[i]) {
			hpu__dfree(ptr[i]);
			w->frees++;
		}
	return (void *)(intptr_t)failures;
}

static void test_threads(void **state)
{
	(void)state;
	assert_int_equal(hpu__devmem_init(6 * MiB, 3), 0);
	pthread_t t[THREADS];
	worker w[THREADS] = {0};
	for (int i = 0; i < THREADS; i++) {
		w[i].id = i;
		assert_int_equal(pthread_create(&t[i], NULL, thread_main, &w[i]),
				 0);
	}
	/* Meanwhile the invariants hold in every snapshot. */
	for (int i = 0; i < 2000; i++) {
		hpu_device_stats s = stats();
		assert_true(s.in_use <= s.max_in_use);
		assert_true(s.max_in_use <= s.limit);
		assert_int_equal(s.num_allocs - s.num_frees, s.active_allocs);
		assert_int_equal(s.total_system_allocs - s.total_system_frees,
				 s.total_active_allocs);
	}
	uint64_t allocs = 0, frees = 0, refused = 0;
	for (int i = 0; i < THREADS; i++) {
		void *failures;
		pthread_join(t[i], &failures);
		assert_int_equal((intptr_t)failures, 0);
		allocs += w[i].allocs;
		frees += w[i].frees;
		refused += w[i].refused;
	}
	hpu_device_stats s = stats();
	printf("threads: %llu allocations, %llu refused, %llu system allocations\n",
	       (unsigned long long)allocs, (unsigned long long)refused,
	       (unsigned long long)s.total_system_allocs);
	assert_int_equal(s.num_allocs, allocs);
	assert_int_equal(s.num_frees, frees);
	assert_int_equal(allocs, frees);
	assert_int_equal(s.in_use, 0);
	assert_int_equal(s.active_allocs, 0);
	assert_true(s.max_in_use <= 6 * MiB);
	assert_true(s.total_system_allocs < allocs); /* blocks were reused */
	assert_invariants();
	hpu__devmem_shutdown();
}

/* Runs `bad` in a child, which must abort saying `why` on stderr. */
static void expect_abort(void (*bad)(void), const char *why)
{
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	fflush(stdout);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fds[1], 2);
		close(fds[0]);
		bad();
		_exit(0);
	}
	close(fds[1]);
	char buf[512] = {0};
	size_t got = 0;
	ssize_t n;
	while (got < sizeof buf - 1 &&
	       (n = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0)
		got += (size_t)n;
	close(fds[0]);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status));
	assert_int_equal(WTERMSIG(status), SIGABRT);
	if (!strstr(buf, why))
		fail_msg("stderr was \"%s\", wanted \"%s\"", buf, why);
}

static void double_free(void)
{
	void *p = hpu__dalloc(HPU_MEM_OTHER, 100, "twice");
	hpu__dfree(p);
	hpu__dfree(p);
}

static void foreign_pointer(void)
{
	char *p = hpu__dalloc(HPU_MEM_OTHER, 256, "host");
	hpu__dfree(p + 64);
}

static void misaligned_pointer(void)
{
	char *p = hpu__dalloc(HPU_MEM_OTHER, 256, "host");
	hpu__dfree(p + 8);
}

static void test_bad_pointers_abort(void **state)
{
	(void)state;
	expect_abort(double_free, "double free");
	expect_abort(foreign_pointer, "not a pointer from hpu__dalloc");
	expect_abort(misaligned_pointer, "not a pointer from hpu__dalloc");
}

/* ---- a remote backing: memory host code cannot touch ---- */

static struct {
	size_t maps, unmaps, zeros, zeroed_bytes;
	size_t refuse_over; /* maps above this many bytes fail (0: none) */
} rb;

static void *rb_map(size_t bytes)
{
	if (rb.refuse_over && bytes > rb.refuse_over) { /* the GPU is full */
		errno = ENOMEM;
		return NULL;
	}
	void *m = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	rb.maps++;
	return m;
}

static void rb_unmap(void *p, size_t bytes)
{
	assert_int_equal((uintptr_t)p % 4096, 0);
	assert_int_equal(munmap(p, bytes), 0);
	rb.unmaps++;
}

static void rb_zero(void *p, size_t bytes)
{
	assert_int_equal(mprotect(p, bytes, PROT_READ | PROT_WRITE), 0);
	memset(p, 0, bytes);
	assert_int_equal(mprotect(p, bytes, PROT_NONE), 0);
	rb.zeros++;
	rb.zeroed_bytes += bytes;
}

/* Reads or writes p[0..n) as the device would. */
static void rb_poke(void *p, size_t n, int byte)
{
	assert_int_equal(mprotect(p, n, PROT_READ | PROT_WRITE), 0);
	memset(p, byte, n);
	assert_int_equal(mprotect(p, n, PROT_NONE), 0);
}

static int rb_is_zero(void *p, size_t n)
{
	assert_int_equal(mprotect(p, n, PROT_READ), 0);
	int z = is_zero(p, n);
	assert_int_equal(mprotect(p, n, PROT_NONE), 0);
	return z;
}

static const hpu__devmem_backing remote_backing = {
    .map = rb_map, .unmap = rb_unmap, .remote = 1, .zero = rb_zero,
};

static void test_remote_backing(void **state)
{
	(void)state;
	static const size_t sizes[] = {1, 64, 100, 4096, 70000, 2 * MiB + 3};
	enum { N = sizeof sizes / sizeof sizes[0], M = 600 };
	void *p[N];
	memset(&rb, 0, sizeof rb);
	hpu__devmem_set_backing(&remote_backing);
	assert_int_equal(hpu__devmem_init(64 * MiB, 0), 0);
	for (int i = 0; i < N; i++) { /* a header written in front would fault */
		p[i] = hpu__dalloc(HPU_MEM_PARAMS, sizes[i], "params");
		assert_non_null(p[i]);
		assert_int_equal((uintptr_t)p[i] % 4096, 0);
		assert_true(rb_is_zero(p[i], sizes[i]));
		rb_poke(p[i], sizes[i], 0x5a);
	}
	assert_int_equal(rb.maps, N);
	assert_int_equal(rb.zeros, N); /* a remote mapping is not taken as zero */
	hpu_device_stats s = stats();
	uint64_t sum = 0;
	for (int i = 0; i < N; i++)
		sum += sizes[i];
	assert_int_equal(s.in_use, sum);
	assert_int_equal(s.total_system_allocs, N);
	/* freed blocks are cached, reused, zeroed again through the backing */
	for (int i = 0; i < N; i++)
		hpu__dfree(p[i]);
	for (int i = N - 1; i >= 0; i--) {
		void *q = hpu__dalloc(HPU_MEM_GRADS, sizes[i], "grads");
		assert_ptr_equal(q, p[i]);
		assert_true(rb_is_zero(q, sizes[i]));
	}
	assert_int_equal(rb.maps, N);
	/* uninitialized: not zeroed */
	size_t z = rb.zeros;
	void *u = hpu__dalloc_uninit(HPU_MEM_ACTS, 300, "acts");
	assert_non_null(u);
	assert_int_equal(rb.zeros, z);
	/* many blocks: the table of headers grows and shrinks */
	void *many[M];
	for (int i = 0; i < M; i++)
		assert_non_null(many[i] = hpu__dalloc(HPU_MEM_OTHER, 64, "many"));
	for (int i = 0; i < M; i += 2)
		hpu__dfree(many[i]);
	for (int i = 1; i < M; i += 2)
		hpu__dfree(many[i]);
	hpu__dfree(u);
	assert_int_equal(stats().in_use, sum);
	assert_invariants();
	/* more than the device has: its own sentence, nothing changed */
	rb.refuse_over = 8 * MiB;
	assert_null(hpu__dalloc(HPU_MEM_OPTIM, 16 * MiB, "optimizer state"));
	assert_non_null(strstr(hpu__devmem_error(),
			       "rank 0: out of device memory allocating optimizer state: the device "
			       "refused 16.0 MiB (Cannot allocate memory) even with the cache given back"));
	assert_int_equal(stats().in_use, sum);
	rb.refuse_over = 0;
	/* a block in use across the shutdown goes straight back later */
	hpu__devmem_shutdown();
	for (int i = 1; i < N; i++)
		hpu__dfree(p[i]);
	hpu__devmem_set_backing(NULL);
	hpu__dfree(p[0]);
	assert_int_equal(rb.maps, rb.unmaps);
	/* the host's own blocks are unchanged */
	assert_int_equal(hpu__devmem_init(0, 0), 0);
	void *h = hpu__dalloc(HPU_MEM_OTHER, 100, "host");
	assert_fresh(h, 100);
	hpu__dfree(h);
	hpu__devmem_shutdown();
}

/* HPU_MEMORY_PEAK=DIR: at shutdown DIR/memory-peak-rank<R>.txt lists
 * the blocks live when InUse was at its maximum (not those freed before
 * it or made after it), summed by name with the layers' indices folded
 * (h1 and h12 as h#; fp32, fc2 as they are), by kind, and
 * the first refused allocation's sentence. */
static void test_peak_report(void **state)
{
	(void)state;
	char dir[64], path[128];
	snprintf(dir, sizeof dir, "/tmp/hpu-devmem-peak-%d", (int)getpid());
	snprintf(path, sizeof path, "%s/memory-peak-rank3.txt", dir);
	setenv("HPU_MEMORY_PEAK", dir, 1);
	assert_int_equal(hpu__devmem_init(4 * MiB, 3), 0);
	unsetenv("HPU_MEMORY_PEAK");
	void *early = hpu__dalloc(HPU_MEM_OTHER, 1 * MiB, "early scratch");
	hpu__dfree(early); /* freed before the peak */
	void *w = hpu__dalloc(HPU_MEM_PARAMS, 512 * KiB, "weights");
	void *a1 = hpu__dalloc(HPU_MEM_ACTS, 256 * KiB, "activations h1.fc2");
	void *a2 = hpu__dalloc(HPU_MEM_ACTS, 256 * KiB, "activations h12.fc2");
	void *w1 = hpu__dalloc(HPU_MEM_PARAMS, 128 * KiB, "h0.mlp.w1");
	void *w2 = hpu__dalloc(HPU_MEM_PARAMS, 128 * KiB, "h0.mlp.w2");
	void *g = hpu__dalloc(HPU_MEM_ACTS, 1 * MiB, "gradient of logits");
	hpu__dfree(g); /* the peak was 2.25 MiB, with it */
	void *late = hpu__dalloc(HPU_MEM_OTHER, 512 * KiB, "late scratch");
	assert_null(hpu__dalloc(HPU_MEM_ACTS, 8 * MiB, "too much"));
	hpu__dfree(w), hpu__dfree(a1), hpu__dfree(a2), hpu__dfree(late), hpu__dfree(w1),
		hpu__dfree(w2);
	hpu__devmem_shutdown();
	char *rep = NULL;
	size_t n = 0;
	assert_null(hpu__read_file(path, &rep, &n));
	assert_true(n > 0);
	printf("%s", rep);
	assert_non_null(strstr(rep, "# rank 3: device memory at its peak, InUse 2.2 MiB (2359296 "
				    "bytes) in 6 allocations\n"));
	assert_non_null(strstr(rep, "# then refused: rank 3: out of device memory allocating too "
				    "much: 8.0 MiB requested"));
	assert_non_null(strstr(rep, "        524288        0.5      2  acts   activations h#.fc2\n"));
	assert_non_null(strstr(rep, "       1048576        1.0      1  acts   gradient of logits\n"));
	assert_non_null(strstr(rep, "       1572864        1.5  acts\n"));
	assert_non_null(strstr(rep, "        262144        0.2  acts   activations h12.fc2\n"));
	assert_null(strstr(rep, "scratch"));
	/* an index folds (h0 -> h#), a weight's number stays (w1, w2) */
	assert_non_null(strstr(rep, "        131072        0.1      1  params h#.mlp.w1\n"));
	assert_non_null(strstr(rep, "        131072        0.1      1  params h#.mlp.w2\n"));
	free(rep);
	unlink(path);
	rmdir(dir);
	/* a directory that cannot be made: said at set-up, no report */
	setenv("HPU_MEMORY_PEAK", "/proc/hpu-no-such/peak", 1);
	assert_int_equal(hpu__devmem_init(0, 3), 0);
	unsetenv("HPU_MEMORY_PEAK");
	hpu__dfree(hpu__dalloc(HPU_MEM_ACTS, 4 * KiB, "x"));
	hpu__devmem_shutdown();
	/* off: no file */
	assert_int_equal(hpu__devmem_init(0, 3), 0);
	hpu__dfree(hpu__dalloc(HPU_MEM_ACTS, 4 * KiB, "x"));
	hpu__devmem_shutdown();
	assert_int_equal(access(path, F_OK), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_before_init),
	    cmocka_unit_test(test_kind_names),
	    cmocka_unit_test_setup_teardown(test_alignment_and_zero,
					    setup_unlimited, teardown),
	    cmocka_unit_test_setup_teardown(test_zero_bytes, setup_unlimited,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_reuse_zeroes, setup_unlimited,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_states_max, setup_unlimited,
					    teardown),
	    cmocka_unit_test(test_random_sequences),
	    cmocka_unit_test(test_limit_error),
	    cmocka_unit_test(test_cache_dropped),
	    cmocka_unit_test_setup_teardown(test_system_refuses,
					    setup_unlimited, teardown),
	    cmocka_unit_test_setup_teardown(test_cache_cap, setup_unlimited,
					    teardown),
	    cmocka_unit_test(test_shutdown_and_again),
	    cmocka_unit_test(test_threads),
	    cmocka_unit_test(test_remote_backing),
	    cmocka_unit_test(test_peak_report),
	    cmocka_unit_test_setup_teardown(test_bad_pointers_abort,
					    setup_unlimited, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
