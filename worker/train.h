/* train: the training loop of one worker (fast_ddp for now). */
#ifndef HPU_TRAIN_H
#define HPU_TRAIN_H

#include <hpu/coll.h>
#include <stddef.h>

#include "config.h"
#include "model.h"

/* Floats the loop keeps after the gradients in the flat gradient buffer
 * (the step's loss rides along with the gradient all-reduce). */
#define HPU_TRAIN_GRAD_EXTRA 1

/* Broadcasts rank 0's initial parameters, trains, evaluates; rank 0 logs to
 * stdout and to the metrics file. Returns 0, or -1 with a sentence in err. */
int hpu_train_run(hpu_builder *b, hpucoll_comm *comm,
		  const hpu_train_opts *o, char *err, size_t errlen);

#endif
