/* The correctness matrix of libhpucoll: every collective x dtype x op x
 * world size 1-8 x count, in place and out of place, with each transport
 * forced in turn (shared memory, ZeroMQ TCP, ZeroMQ IPC), and over two
 * nodes (the hierarchical paths). The asynchronous collectives' overlap
 * with computation and their issue order are test_coll_async's; what
 * both share (worlds, inputs, buffers, checks) is coll_matrix_lib.c's.
 *
 * The parent forks one child per rank; each child binds, publishes its
 * resolved endpoint in a MAP_SHARED page, declares with set_topology every
 * rank to be on node 0, a job name unique to the world and the transport
 * under test, connects, and runs the collectives. Every element of every
 * result is compared with a reference the child computes itself from the
 * inputs of all ranks (each input is a function of rank and index). The
 * values are small integers chosen so that every result is exact in every
 * dtype: sums stay within 2048 in f16, 256 in bf16 and 255 in u8, and for
 * avg in the float types the inputs of the ranks sum to a multiple of the
 * world size, so that sum / size is exact (integer types truncate toward
 * zero, as the header says, and are checked on arbitrary sums). Out of
 * place, the sendbuf must come back unchanged; no buffer may be written
 * past its end. Rank 0 checks in /proc/self/maps that the job's segment is
 * mapped under SHM and not under TCP or IPC, so the forced transport is the
 * one used.
 *
 * Children record per configuration (collective, dtype, op) how many
 * elements they checked, how many runs failed and the largest difference
 * (maxdiff) in the shared page, and print the first mismatch of each run
 * with collective, dtype, op, world size, count, placement, transport,
 * index, expected and got. The parent prints one line per configuration.
 * Every wait is bounded: ranks use a 30 s collective timeout and the
 * parent kills children still running at a deadline.
 *
 * What runs (about 2.5 minutes on 2 cores):
 * - counts 0, 1, 7 and 4099 for every (collective, dtype, op), in place and
 *   out of place, world sizes 1-8, on every transport; and again with the
 *   library's size thresholds overridden so that ring all-reduce, chain
 *   broadcast and ring reduce run at these counts too (at the default
 *   thresholds, 64 KiB, they take the tree / recursive-doubling paths);
 * - count 4M+3 (limited): f32 and bf16 with sum, for every collective, in
 *   place and out of place, world sizes 2, 3 and 8, on every transport;
 * - shared memory within two nodes and ZeroMQ between them (hierarchical
 *   paths): counts 0-4099 at world sizes 2-8, default and hierarchical
 *   all-reduce forced, and 4M+3 at world sizes 3 and 8.
 * An optional argument runs only the tests whose name contains it
 * ("matrix_tcp", "big", "2nodes", ...). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "tests/unit/coll_matrix_lib.h"

static const size_t small_counts[] = {0, 1, 7, 4099};
#define NSMALL (sizeof(small_counts) / sizeof(small_counts[0]))

static int is_reduction(enum coll c)
{
	return c <= C_REDUCE;
}

static int root_of(enum coll c, int variant, int ws)
{
	if (c == C_BCAST)
		return variant ? ws - 1 : 0;
	if (c == C_REDUCE)
		return ws / 2; /* non-zero from 2 ranks up */
	return 0;
}

/* Barrier: nobody leaves before everyone entered, blocking and async. */
static int check_barrier(struct rk *k)
{
	struct spec s = {.coll = C_BARRIER};
	struct cmp m = {.k = k, .s = &s};
	hpucoll_req *req = NULL;
	int rc;

	for (int round = 0; round < 6; round++) {
		usleep((useconds_t)(((k->me * 7 + round * 3) % 5) * 1000));
		atomic_fetch_add(&k->sh->counter, 1);
		if (round == 5) {
			rc = hpucoll_ibarrier(k->c, &req);
			if (rc == HPUCOLL_OK)
				rc = hpucoll_wait(&req);
		} else {
			rc = hpucoll_barrier(k->c);
		}
		if (rc != HPUCOLL_OK)
			return mx_fail_rc(
			    k, &s, round == 5 ? "ibarrier" : "barrier", rc);
		m.checked++;
		if (atomic_load(&k->sh->counter) < k->ws * (round + 1)) {
			if (!m.bad++)
				fprintf(stderr,
				        "%s ws=%d rank %d: left barrier "
				        "%d before everyone entered it\n",
				        k->w->label, k->ws, k->me, round);
		}
	}
	mx_record(k, &m);
	return 0;
}

/* Rank 0 names configuration k->cfg: collective c with root variant v,
 * dtype, op ("-" for none) and the counts it runs at, in and out of
 * place. */
static void name_cfg(struct rk *k, int c, int v, hpucoll_dtype dt,
                     const char *op, const char *counts)
{
	const char *root = c == C_BCAST    ? (v ? "(root ws-1)" : "(root 0)")
	                   : c == C_REDUCE ? "(root ws/2)"
	                                   : "";

	if (k->me == 0)
		snprintf(k->sh->name[k->cfg], NAME_MAX_, "%s%s %s %s %s in+out",
		         mx_coll_names[c], root, ct_dtype_names[dt], op,
		         counts);
}

/* s at counts 0, 1, 7, 4099, in and out of place. */
static int run_small_counts(struct rk *k, struct spec *s)
{
	for (size_t n = 0; n < NSMALL; n++)
		for (int in = 0; in < 2; in++) {
			s->count = small_counts[n];
			s->inplace = in;
			if (mx_run_one(k, s) != 0)
				return -1;
		}
	return 0;
}

/* Every (collective, dtype, op) at counts 0, 1, 7, 4099, in and out of
 * place; then the barrier. */
static int small_matrix(struct rk *k)
{
	int idx = 0;

	for (int c = C_ALL_REDUCE; c <= C_BCAST; c++) {
		int variants = c == C_BCAST ? 2 : 1;
		int nops = is_reduction(c) ? HPUCOLL_NUM_OPS : 1;

		for (int v = 0; v < variants; v++)
			for (int dt = 0; dt < HPUCOLL_NUM_DTYPES; dt++)
				for (int op = 0; op < nops; op++) {
					struct spec s = {
					    .coll = c,
					    .dt = dt,
					    .op = op,
					    .root = root_of(c, v, k->ws)};

					if (mx_next_cfg(k, &idx) != 0)
						return -1;
					name_cfg(k, c, v, dt,
					         is_reduction(c)
					             ? ct_op_names[op]
					             : "-",
					         "counts 0,1,7,4099");
					if (run_small_counts(k, &s) != 0)
						return -1;
				}
	}
	if (mx_next_cfg(k, &idx) != 0)
		return -1;
	if (k->me == 0)
		snprintf(k->sh->name[k->cfg], NAME_MAX_,
		         "barrier x5 + ibarrier");
	return check_barrier(k);
}

/* Count 4M+3, f32 and bf16, sum, every collective, in and out of place. */
static int big_matrix(struct rk *k)
{
	static const hpucoll_dtype dts[] = {HPUCOLL_F32, HPUCOLL_BF16};
	char counts[32];
	int idx = 0;

	snprintf(counts, sizeof(counts), "count %u", BIG_N);
	for (int c = C_ALL_REDUCE; c <= C_BCAST; c++) {
		int variants = c == C_BCAST ? 2 : 1;

		for (int v = 0; v < variants; v++)
			for (int d = 0; d < 2; d++) {
				struct spec s = {.coll = c,
				                 .dt = dts[d],
				                 .op = HPUCOLL_SUM,
				                 .count = BIG_N,
				                 .root = root_of(c, v, k->ws)};

				if (mx_next_cfg(k, &idx) != 0)
					return -1;
				name_cfg(k, c, v, s.dt,
				         is_reduction(c) ? "sum" : "-", counts);
				for (int in = 0; in < 2; in++) {
					s.inplace = in;
					if (mx_run_one(k, &s) != 0)
						return -1;
				}
			}
	}
	return 0;
}

/* ---- tests ---- */

static const int big_ws[] = {2, 3, 8};
#define NBIG (sizeof(big_ws) / sizeof(big_ws[0]))

int main(int argc, char **argv)
{
	/* Each transport in turn: the matrix at small counts with the
	 * library's own algorithm choice, then with ring / chain forced;
	 * count 4M+3. Then shared memory within two nodes and TCP between
	 * them (the hierarchical paths). */
	for (int t = 0; t < MX_NTR; t++) {
		hpucoll_transport tr = mx_transports[t];

		for (int ws = 1; ws <= MAX_WS; ws++)
			mx_add(tr, ws, "matrix", small_matrix,
			       SMALL_DEADLINE_MS, 0, 0);
		for (int ws = 1; ws <= MAX_WS; ws++)
			mx_add(tr, ws, "matrix", small_matrix,
			       SMALL_DEADLINE_MS, 1, 0);
		for (size_t b = 0; b < NBIG; b++)
			mx_add(tr, big_ws[b], "big", big_matrix,
			       BIG_DEADLINE_MS, 0, 0);
	}
	for (int ws = 2; ws <= MAX_WS; ws++)
		mx_add(HPUCOLL_TRANSPORT_SHM, ws, "matrix", small_matrix,
		       SMALL_DEADLINE_MS, 0, 1);
	for (int ws = 2; ws <= MAX_WS; ws++)
		mx_add(HPUCOLL_TRANSPORT_SHM, ws, "matrix", small_matrix,
		       SMALL_DEADLINE_MS, 1, 1);
	mx_add(HPUCOLL_TRANSPORT_SHM, 3, "big", big_matrix, BIG_DEADLINE_MS, 0,
	       1);
	mx_add(HPUCOLL_TRANSPORT_SHM, 8, "big", big_matrix, BIG_DEADLINE_MS, 0,
	       1);
	return mx_run("coll_matrix", argc, argv);
}
