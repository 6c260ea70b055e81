/* save_resume: saving a run and resuming it, every rank together. The
 * format is ckpt.h's; what each rank owns is the strategy's
 * (hpu_strat_ckpt_*). Besides the floats, a checkpoint carries the run's
 * position (step, epoch, batch within the epoch), the seed the sampler
 * and the initializers derive from (the runtime keeps no other random
 * state), the learning-rate schedule, the optimizer's step count, the
 * loss scaler, fp8's amax histories, the last validation's figures and
 * --early-stop's count. */
#ifndef HPU_SAVE_RESUME_H
#define HPU_SAVE_RESUME_H

#include <hpu/coll.h>
#include <stdio.h>

#include "ckpt/ckpt.h"
#include "options/config.h"
#include "worker/runtime/lrsched.h"
#include "worker/hpu/model.h"
#include "worker/strategy/strategy.h"

/* Where a run stands after `step` optimizer steps. */
typedef struct hpu_run_pos {
	long step;      /* optimizer steps done */
	int epoch;      /* the epoch of the next step (0-based) */
	long batch;     /* the next step's global batch within that epoch */
	uint64_t seed;  /* the sampler's seed */
	hpu_sched sched;
	/* The last validation (vstep 0: none yet): its loss and the model's
	 * metrics, saved in the manifest's "validation" (--keep-best ranks
	 * checkpoints by them). */
	long vstep;
	double vloss, vmetric[HPU_MAX_IO];
	/* --early-stop's state, saved in "early_stop" and restored when the
	 * resumed run watches the same metric the same way (es_best NAN: no
	 * validation yet). */
	double es_best;
	long es_best_step, es_wait;
	int es_restored; /* hpu__checkpoint_apply restored the three */
	/* The training split's samples less the held-out validation ones
	 * (--val-fraction), saved in "train_samples": a resume whose split
	 * differs is refused (its epochs' batches would not be the saved
	 * run's). 0: not known (--eval-only). */
	long train_samples;
	/* A digest of a few of the training split's samples' bytes
	 * (hpu__same_train_digest), saved in "train_digest": a resume on
	 * other data of the same size is refused. "": not known. */
	char train_digest[24];
} hpu_run_pos;

/* Saves a checkpoint of the run at `pos` under o->checkpoint_dir: each
 * rank its shard in parallel, rank 0 the manifest, then the rename and
 * `latest`, then --keep's pruning (--keep-last, --keep-best: the kept
 * ones named in the manifest's "keep"). Every rank must call it; all return
 * the same result. A failure (a full disk, ...) leaves the previous
 * checkpoints as they were and says which rank failed and why. Rank 0
 * prints a line (and a metrics record when `metrics`). */
int hpu__checkpoint_save(hpucoll_comm *comm, const hpu_train_opts *o, hpu_builder *b,
			 hpu_strat *st, const hpu_run_pos *pos, FILE *metrics, char *err,
			 size_t errlen);

/* What --resume asks for (also auto after an elastic restart,
 * HPU_RESTART_COUNT > 0, with a --checkpoint-dir): the checkpoint, found,
 * checked against the model and verified (every file's digest, the
 * files shared out among the ranks), or *out = NULL to start afresh
 * (auto, and no checkpoint yet). auto falls back to older intact
 * checkpoints, saying so; a named one must be intact. After a restart,
 * auto also replaces a named --resume once --checkpoint-dir holds a
 * checkpoint (the job's own progress wins over its starting point). */
int hpu__checkpoint_find(hpucoll_comm *comm, const hpu_train_opts *o, hpu_builder *b,
			 hpu_ckpt **out, char *err, size_t errlen);

/* The seed of the run checkpoint c continues (its manifest's rng.seed),
 * or dflt where it names none. A resumed run is that run: the seed orders
 * its data, holds out its validation samples and draws its dropout masks,
 * whatever --seed says. */
uint64_t hpu__checkpoint_seed(const hpu_ckpt *c, uint64_t dflt);

/* After hpu__strat_new() read the floats: the run's position, its
 * schedule (`pos->sched` holds this run's; the checkpoint's replaces it)
 * and fp8's state. Rank 0 says what was resumed and how long every rank
 * took (`secs`: this rank's finding, verifying and reading). */
int hpu__checkpoint_apply(hpucoll_comm *comm, hpu_ckpt *c, const hpu_train_opts *o,
			  hpu_run_pos *pos, double secs, FILE *metrics, char *err, size_t errlen);

#endif
