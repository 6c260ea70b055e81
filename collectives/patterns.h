/* patterns: the communication patterns the collectives are made of, run
 * on a group of ranks (struct hpucoll__group) over the transport dispatch:
 *
 *   ring             reduce-scatter and/or all-gather, 2 * (n - 1) steps;
 *   recursive        all-reduce in log2(n) exchanges, the ranks beyond the
 *   doubling         largest power of two folded into a partner first;
 *   binomial tree    broadcast and reduce in log2(n) hops;
 *   chain            pipelined broadcast root, root + 1, ...;
 *   ring + gather    reduce for large messages;
 *   dissemination    barrier in ceil(log2(n)) rounds.
 *
 * Transfers go in slices of at most g->seg bytes, handled one by one so
 * that the steps pipeline and a bounded shared-memory ring can never
 * deadlock: every rank alternates one send and one receive. Messages carry
 * the running collective's seq, kind and arg (set by algo.c); each pattern
 * numbers its steps in the tag. All return an hpucoll_err code, with the
 * sentence in comm->errmsg.
 */
#ifndef HPUCOLL_PATTERNS_H
#define HPUCOLL_PATTERNS_H

#include "collectives/comm_internal.h"

/* What one reduction works on. */
struct hpucoll__red {
	hpucoll_dtype dt;
	hpucoll_op op;
	size_t es;   /* bytes per element */
	int divisor; /* AVG: final values are divided by it; else 0 */
};

/* A ring over g: the vector of `count` elements is cut into g->n nearly
 * equal chunks (hpucoll__split). At step t member `me` receives chunk
 * (me - 1 - t + shift) mod n from its predecessor: steps 0 .. n-2 reduce
 * (the chunk received at n-2 is final here: member me ends with chunk
 * me + 1 + shift), steps n-1 .. 2n-3 pass the final chunks round. */
struct hpucoll__ring {
	hpucoll_comm *c;
	const struct hpucoll__group *g;
	struct hpucoll__red r;
	size_t count;
	const unsigned char *in; /* this rank's contribution (reduce) */
	unsigned char *out;      /* element e lives at out + e*es - base */
	size_t base;
	int shift;
	int reduce, gather; /* the phases to run */
	size_t nslices;     /* set by hpucoll__ring_run */
};

/* Part i of `count` split into n nearly equal parts. */
void hpucoll__split(size_t count, size_t n, size_t i, size_t *first,
		    size_t *len);

int hpucoll__ring_run(struct hpucoll__ring *rg);

/* All-reduce in place on `out`, which already holds this rank's data. */
int hpucoll__rd_all_reduce(hpucoll_comm *c, const struct hpucoll__group *g,
			   const struct hpucoll__red *r, unsigned char *out,
			   size_t count);

/* `out` gets member root's `in` (on the root, in may equal out): a
 * binomial tree, or a pipelined chain when `chain`. */
int hpucoll__bcast(hpucoll_comm *c, const struct hpucoll__group *g, int root,
		   const unsigned char *in, unsigned char *out, size_t bytes,
		   int chain);

/* Binomial-tree reduce into `acc` (count elements; the result on the
 * root, partial sums elsewhere); acc may be in. */
int hpucoll__tree_reduce(hpucoll_comm *c, const struct hpucoll__group *g,
			 const struct hpucoll__red *r, int root,
			 const unsigned char *in, unsigned char *acc,
			 size_t count);

/* Ring reduce-scatter, then every member sends its chunk to the root,
 * whose `out` gets the result (out is not used elsewhere). */
int hpucoll__ring_reduce(hpucoll_comm *c, const struct hpucoll__group *g,
			 const struct hpucoll__red *r, int root,
			 const unsigned char *in, unsigned char *out,
			 size_t count);

int hpucoll__dissemination(hpucoll_comm *c, const struct hpucoll__group *g);

#endif
