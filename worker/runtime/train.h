/* train: the training loop of one worker: epochs, micro-steps, the
 * learning-rate schedule, logging and metrics, evaluation; the strategy
 * (strategy.h) does the passes, the communication and the optimizer. */
#ifndef HPU_TRAIN_H
#define HPU_TRAIN_H

#include <hpu/coll.h>
#include <stddef.h>

#include "config.h"
#include "model.h"

/* Trains with the resolved options (hpu_opts_resolve), evaluates, writes
 * --save-params; rank 0 logs to stdout and to the metrics file. Returns 0,
 * or -1 with a sentence in err. */
int hpu_train_run(hpu_builder *b, hpucoll_comm *comm,
		  const hpu_train_opts *o, char *err, size_t errlen);

#endif
