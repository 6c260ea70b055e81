/* sampler: the runtime's distributed sampler. Every rank computes the same
 * seeded permutation of the training set for an epoch; global batch s is
 * perm[s*B .. (s+1)*B) and rank r takes the r-th of its W equal slices, so
 * shards are disjoint and a run on any world size sees the same global
 * batches. The last partial batch is dropped (drop_last). */
#ifndef HPU_SAMPLER_H
#define HPU_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

/* Fills perm[0..n) with epoch `epoch`'s permutation under `seed`. */
void hpu__sampler_permute(uint32_t *perm, size_t n, uint64_t seed,
			  uint64_t epoch);

/* --val-fraction over samples that overlap (hpu_dataset_overlap: sample
 * i shares data with those less than `span` away, span >= 1): one run of
 * nval samples held out, starting where `seed` says, and no sample within
 * span - 1 of it trained on. map[0..ntrain) gets the training samples in
 * order, map[ntrain..ntrain + nval) the held-out ones; returns ntrain
 * (0 when nothing is left to train on). nval in 1..n-1. */
size_t hpu__sampler_holdout_run(uint32_t *map, size_t n, size_t nval, size_t span,
				uint64_t seed);

/* Number of full global batches of `global_batch` in n samples. */
size_t hpu__sampler_steps(size_t n, size_t global_batch);

/* The global_batch/world indices rank `rank` trains on at `step`. */
const uint32_t *hpu__sampler_shard(const uint32_t *perm, size_t step,
				   size_t global_batch, int rank, int world);

/* Evaluation: rank r takes samples r, r+W, r+2W, ... (every sample once
 * over all ranks). Returns how many samples rank r gets out of n. */
size_t hpu__sampler_eval_count(size_t n, int rank, int world);

#endif
