/* hpucoll-bench's data: elements of every dtype read and written as
 * doubles, the inputs of each check iteration and the result every rank
 * must then hold. Inputs are small integers, so sums, max and min are exact
 * in every dtype (uint8 sums wrap as the type does); avg of a floating type
 * may be off by the rounding of one division (bench_tolerance). */
#ifndef HPU_BENCH_DATA_H
#define HPU_BENCH_DATA_H

#include <hpu/coll.h>
#include <stddef.h>

enum bench_coll {
	BENCH_ALL_REDUCE,
	BENCH_REDUCE_SCATTER,
	BENCH_ALL_GATHER,
	BENCH_BROADCAST,
	BENCH_NUM_COLLS
};

/* What a result depends on. count is per rank, as the API takes it. */
struct bench_case {
	enum bench_coll coll;
	hpucoll_dtype dtype;
	hpucoll_op op;
	int rank, size, root;
	size_t count;
};

/* What an output element holds before a run: no input or result is it. */
#define BENCH_SENTINEL 100.0

/* Element i of the array p of dtype t, as a double. */
double bench_get(const void *p, hpucoll_dtype t, size_t i);

/* Stores v (rounded to nearest even for half and bfloat16) as element i. */
void bench_set(void *p, hpucoll_dtype t, size_t i, double v);

/* Inputs, and so results, repeat with this period in the element index
 * (within each rank's block for all_gather): a check needs BENCH_PERIOD
 * values of bench_input or bench_expected, not one per element. */
#define BENCH_PERIOD 11

/* Stores vals[k % BENCH_PERIOD] as element k of p[0..n). */
void bench_fill(void *p, hpucoll_dtype t, size_t n, const double *vals);

/* Counts the elements k of p[0..n) farther than tol[k % BENCH_PERIOD]
 * from want[k % BENCH_PERIOD]; *first is the first of them (n if none). */
size_t bench_count_wrong(const void *p, hpucoll_dtype t, size_t n,
                         const double *want, const double *tol, size_t *first);

/* Element i of rank r's input in check iteration it: an integer in -5..5
 * (0..10 for uint8). Reduce-scatter's i runs over all size * count. */
double bench_input(hpucoll_dtype t, size_t i, int r, int it);

/* Element k of rank c->rank's output in check iteration it. */
double bench_expected(const struct bench_case *c, size_t k, int it);

/* How far a correct result near `want` may be off: 0 but for avg of a
 * floating type, where it is the rounding of the division. */
double bench_tolerance(hpucoll_dtype t, hpucoll_op op, double want);

#endif
