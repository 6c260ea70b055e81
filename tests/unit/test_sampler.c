/* Unit tests for the distributed sampler (worker/runtime/sampler.c).
 *
 * Every rank calls hpu__sampler_permute on its own, so the tests do the same:
 * each simulated rank computes its own copy of the permutation. Checked: the
 * permutation is one, it is reproducible and depends on seed and epoch, the
 * ranks' shards partition the first steps*batch entries (drop_last), any
 * world size sees the same global batches as one worker, and evaluation
 * striding covers every sample once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/runtime/sampler.h"

#define MAX_WORLD 5

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);
	assert_non_null(p);
	return p;
}

static uint32_t *permutation(size_t n, uint64_t seed, uint64_t epoch)
{
	uint32_t *perm = xcalloc(n, sizeof(*perm));
	hpu__sampler_permute(perm, n, seed, epoch);
	return perm;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

/* Asserts that perm[0..n) holds every index of [0, n) exactly once. */
static void assert_is_permutation(const uint32_t *perm, size_t n)
{
	unsigned char *seen = xcalloc(n, 1);
	for (size_t i = 0; i < n; i++) {
		assert_true(perm[i] < n);
		assert_int_equal(seen[perm[i]], 0);
		seen[perm[i]] = 1;
	}
	free(seen);
}

/* ---- the permutation ---- */

static void test_permute_is_permutation(void **state)
{
	(void)state;
	const size_t sizes[] = {0, 1, 2, 7, 60000};
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
		for (uint64_t epoch = 0; epoch < 3; epoch++) {
			uint32_t *perm = permutation(sizes[k], 42, epoch);
			assert_is_permutation(perm, sizes[k]);
			free(perm);
		}
}

static void test_permute_deterministic(void **state)
{
	(void)state;
	const size_t sizes[] = {1, 7, 60000};
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t n = sizes[k];
		uint32_t *a = permutation(n, 42, 3);
		/* Another rank, later, with the buffer already dirty. */
		uint32_t *b = xcalloc(n, sizeof(*b));
		memset(b, 0xab, n * sizeof(*b));
		hpu__sampler_permute(b, n, 42, 3);
		assert_memory_equal(a, b, n * sizeof(*a));
		hpu__sampler_permute(b, n, 42, 3);
		assert_memory_equal(a, b, n * sizeof(*a));
		free(a);
		free(b);
	}
}

static void test_permute_depends_on_seed_and_epoch(void **state)
{
	(void)state;
	const size_t n = 60000, bytes = n * sizeof(uint32_t);
	uint32_t *base = permutation(n, 42, 0);
	uint32_t *ident = xcalloc(n, sizeof(*ident));
	for (size_t i = 0; i < n; i++)
		ident[i] = (uint32_t)i;
	assert_memory_not_equal(base, ident, bytes); /* it shuffles at all */

	for (uint64_t epoch = 1; epoch < 4; epoch++) {
		uint32_t *p = permutation(n, 42, epoch);
		assert_memory_not_equal(base, p, bytes);
		free(p);
	}
	const uint64_t seeds[] = {0, 1, 43, 42ull << 32};
	for (size_t k = 0; k < sizeof(seeds) / sizeof(seeds[0]); k++) {
		uint32_t *p = permutation(n, seeds[k], 0);
		assert_memory_not_equal(base, p, bytes);
		free(p);
	}
	/* Seed s epoch e+1 must not simply be seed s+1 epoch e (or similar). */
	uint32_t *a = permutation(n, 7, 1), *b = permutation(n, 8, 0);
	assert_memory_not_equal(a, b, bytes);
	free(a);
	free(b);
	free(base);
	free(ident);
}

/* ---- steps and shards ---- */

static void test_steps(void **state)
{
	(void)state;
	assert_int_equal(hpu__sampler_steps(0, 256), 0);
	assert_int_equal(hpu__sampler_steps(255, 256), 0);
	assert_int_equal(hpu__sampler_steps(256, 256), 1);
	assert_int_equal(hpu__sampler_steps(511, 256), 1);
	assert_int_equal(hpu__sampler_steps(60000, 256), 234);
	assert_int_equal(hpu__sampler_steps(60000, 60), 1000);
	assert_int_equal(hpu__sampler_steps(60000, 1), 60000);
	assert_int_equal(hpu__sampler_steps(100, 0), 0);
}

/* For one (n, batch, world): the shards of all ranks over all steps are
 * disjoint, batch/world long, inside the permutation and together exactly
 * perm[0 .. steps*batch) -- the remainder n - steps*batch is dropped. */
static void check_shards(size_t n, size_t batch, int world, uint64_t epoch)
{
	size_t steps = hpu__sampler_steps(n, batch);
	size_t local = batch / (size_t)world, used = steps * batch;
	assert_int_equal(steps, n / batch);
	assert_true(n - used < batch);

	uint32_t *perm[MAX_WORLD];
	for (int r = 0; r < world; r++) /* each rank computes its own */
		perm[r] = permutation(n, 42, epoch);
	/* count[i]: how often sample i is trained on in the epoch */
	unsigned *count = xcalloc(n, sizeof(*count));
	for (size_t s = 0; s < steps; s++)
		for (int r = 0; r < world; r++) {
			const uint32_t *sh =
				hpu__sampler_shard(perm[r], s, batch, r, world);
			/* inside the used part of this rank's own array */
			assert_true(sh >= perm[r]);
			assert_true(sh + local <= perm[r] + used);
			for (size_t k = 0; k < local; k++) {
				assert_true(sh[k] < n);
				count[sh[k]]++;
			}
		}
	size_t trained = 0;
	for (size_t i = 0; i < used; i++) {
		assert_int_equal(count[perm[0][i]], 1);
		trained++;
	}
	for (size_t i = used; i < n; i++) /* dropped */
		assert_int_equal(count[perm[0][i]], 0);
	assert_int_equal(trained, steps * (size_t)world * local);
	free(count);
	for (int r = 0; r < world; r++)
		free(perm[r]);
}

static void test_shards_partition(void **state)
{
	(void)state;
	const size_t ns[] = {0, 59, 60, 1003, 60000};
	for (int w = 1; w <= MAX_WORLD; w++) {
		const size_t batches[] = {(size_t)w, 7 * (size_t)w, 60,
					  53 * (size_t)w, 240};
		for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
			for (size_t j = 0; j < sizeof(batches) / sizeof(batches[0]);
			     j++)
				check_shards(ns[i], batches[j], w, 1);
	}
}

/* The union of the W ranks' shards at step s is, as a set, the global batch
 * a single worker trains on at step s. */
static void check_same_global_batch(size_t n, size_t batch, int world)
{
	size_t steps = hpu__sampler_steps(n, batch);
	size_t local = batch / (size_t)world;
	uint32_t *one = permutation(n, 1234, 5);
	uint32_t *perm[MAX_WORLD];
	for (int r = 0; r < world; r++)
		perm[r] = permutation(n, 1234, 5);
	uint32_t *a = xcalloc(batch, sizeof(*a)), *b = xcalloc(batch, sizeof(*b));
	for (size_t s = 0; s < steps; s++) {
		memcpy(a, hpu__sampler_shard(one, s, batch, 0, 1),
		       batch * sizeof(*a));
		for (int r = 0; r < world; r++)
			memcpy(b + (size_t)r * local,
			       hpu__sampler_shard(perm[r], s, batch, r, world),
			       local * sizeof(*b));
		qsort(a, batch, sizeof(*a), cmp_u32);
		qsort(b, batch, sizeof(*b), cmp_u32);
		assert_memory_equal(a, b, batch * sizeof(*a));
	}
	free(a);
	free(b);
	free(one);
	for (int r = 0; r < world; r++)
		free(perm[r]);
}

static void test_world_size_invariant(void **state)
{
	(void)state;
	for (int w = 1; w <= MAX_WORLD; w++) {
		check_same_global_batch(1003, 60, w);
		check_same_global_batch(1003, 4 * (size_t)w, w);
		check_same_global_batch(60000, 240, w);
	}
}

/* ---- evaluation striding ---- */

static void check_eval(size_t n, int world)
{
	unsigned *count = xcalloc(n, sizeof(*count));
	size_t total = 0;
	for (int r = 0; r < world; r++) {
		size_t c = hpu__sampler_eval_count(n, r, world);
		total += c;
		for (size_t k = 0; k < c; k++) {
			size_t idx = (size_t)r + k * (size_t)world;
			assert_true(idx < n);
			count[idx]++;
		}
		/* the next stride would leave the data set */
		assert_true((size_t)r + c * (size_t)world >= n);
	}
	assert_int_equal(total, n);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(count[i], 1);
	free(count);
}

/* --val-fraction over overlapping samples (sliding windows, span 9): one
 * run of held-out samples, every training sample at least span away from
 * each of them (a sample 8 away shares data), no sample in both, the same
 * run for the same seed and another for another seed. Drawn at random,
 * each held-out window sat between trained ones that held its text. */
static void test_holdout_run(void **state)
{
	(void)state;
	enum { N = 1000, NVAL = 100, SPAN = 9 };
	static uint32_t map[N], again[N];
	size_t starts[2];
	for (uint64_t seed = 1; seed <= 2; seed++) {
		size_t ntrain = hpu__sampler_holdout_run(map, N, NVAL, SPAN, seed);
		assert_true(ntrain >= N - NVAL - 2 * (SPAN - 1) && ntrain <= N - NVAL);
		uint32_t first = map[ntrain];
		for (size_t i = 0; i < NVAL; i++)
			assert_int_equal(map[ntrain + i], first + i); /* one run */
		for (size_t k = 0; k < ntrain; k++) {
			uint32_t t = map[k];
			int near = t + SPAN > first && t < first + NVAL + SPAN - 1;
			if (near)
				fail_msg("seed %llu: training sample %u is within %d of the held-out run "
					 "%u..%u", (unsigned long long)seed, t, SPAN - 1, first,
					 first + NVAL - 1);
			assert_true(k == 0 || map[k] > map[k - 1]);
		}
		/* exactly the samples apart from the run's guard are trained */
		size_t lo = first > SPAN - 1 ? first - (SPAN - 1) : 0;
		size_t hi = first + NVAL + SPAN - 1 < N ? first + NVAL + SPAN - 1 : N;
		assert_int_equal(ntrain, N - (hi - lo));
		assert_int_equal(hpu__sampler_holdout_run(again, N, NVAL, SPAN, seed), ntrain);
		assert_memory_equal(map, again, (ntrain + NVAL) * sizeof *map);
		starts[seed - 1] = first;
	}
	assert_true(starts[0] != starts[1]);
	/* span 1: no guard; all but the run train */
	assert_int_equal(hpu__sampler_holdout_run(map, N, NVAL, 1, 3), N - NVAL);
	/* the run with its guard covers everything: nothing to train on */
	assert_int_equal(hpu__sampler_holdout_run(map, 20, 10, 11, 3), 0);
}

static void test_eval_striding(void **state)
{
	(void)state;
	const size_t ns[] = {0, 1, 2, 3, 4, 5, 7, 10, 11, 9999, 10000};
	for (int w = 1; w <= 8; w++)
		for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
			check_eval(ns[i], w);
	/* n < W: the first n ranks get one sample each, the rest none */
	assert_int_equal(hpu__sampler_eval_count(3, 0, 5), 1);
	assert_int_equal(hpu__sampler_eval_count(3, 2, 5), 1);
	assert_int_equal(hpu__sampler_eval_count(3, 3, 5), 0);
	assert_int_equal(hpu__sampler_eval_count(3, 4, 5), 0);
	assert_int_equal(hpu__sampler_eval_count(0, 0, 1), 0);
	assert_int_equal(hpu__sampler_eval_count(10000, 0, 3), 3334);
	assert_int_equal(hpu__sampler_eval_count(10000, 2, 3), 3333);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_permute_is_permutation),
	    cmocka_unit_test(test_permute_deterministic),
	    cmocka_unit_test(test_permute_depends_on_seed_and_epoch),
	    cmocka_unit_test(test_steps),
	    cmocka_unit_test(test_shards_partition),
	    cmocka_unit_test(test_world_size_invariant),
	    cmocka_unit_test(test_eval_striding),
	    cmocka_unit_test(test_holdout_run),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
