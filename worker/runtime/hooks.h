/* hooks: runs the model's hooks (hpu_hook_after_eval / _after_train) with
 * an hpu_run over the trained model: every parameter gathered on every
 * rank, the buffers, the last evaluation's figures, and forward passes. */
#ifndef HPU_HOOKS_H
#define HPU_HOOKS_H

#include "worker/hpu/model.h"
#include "worker/strategy/strategy.h"

/* Runs hooks v[0 .. n) on this rank (collective when n > 0: parameters
 * are gathered). `figures` is NULL, or the test loss then each metric.
 * Returns 0, or -1 with a sentence naming the hook's failure in err,
 * which must be the buffer the strategy writes its errors to (a failed
 * forward pass of the hook's says why from there). */
int hpu__hooks_run(hpu_strat *st, hpu_builder *b, const hpu_hook_ent *v, int n, const char *when,
		   long step, int max_batch, const double *figures, char *err, size_t errlen);

#endif
