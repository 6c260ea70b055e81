/* train: the training loop of one worker: epochs, micro-steps, the
 * learning-rate schedule, logging and metrics, evaluation; the strategy
 * (strategy.h) does the passes, the communication and the optimizer. */
#ifndef HPU_TRAIN_H
#define HPU_TRAIN_H

#include <hpu/coll.h>
#include <stddef.h>

#include "options/config.h"
#include "worker/hpu/model.h"

/* Tells the agent, first thing, that this worker is in its setup, before
 * step 1 of o->max_steps (when given), and from then on keeps it told
 * where the worker is: an exit() in the middle of the run reports the
 * step under way (the agent names it when the worker left early). */
void hpu__train_announce(const hpu_train_opts *o);

/* Trains with the resolved options (hpu__opts_resolve), evaluates, writes
 * --save-params; rank 0 logs to stdout and to the metrics file. Returns 0,
 * or -1 with a sentence in err. */
int hpu__train_run(hpu_builder *b, hpucoll_comm *comm,
		   const hpu_train_opts *o, char *err, size_t errlen);

#endif
