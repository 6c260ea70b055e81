/* same_opts: at start-up, the ranks of a job check that they train with
 * the same options (hpu__opts_shared_text): two nodes whose copies of a
 * --config file differ would otherwise train together, to a useless
 * model. */
#ifndef HPU_SAME_OPTS_H
#define HPU_SAME_OPTS_H

#include <hpu/coll.h>
#include <stddef.h>

#include "options/config.h"
#include "worker/hpu/model.h"

/* Compares a digest of the options every rank must share with every
 * other rank's (one all-gather of 32 bytes each); where any differs, a
 * second all-gather brings the texts, and err names the ranks that
 * differ from rank 0 and the options, with both values ("the ranks'
 * training options differ: rank 1 differs from rank 0 in --lr (0.5 vs
 * 0.001)"). Every rank reaches the same verdict. Collective: every rank
 * calls it, first after connecting. Returns 0, or -1 with a sentence in
 * err. */
int hpu__same_opts_check(hpucoll_comm *comm, const hpu_train_opts *o, char *err,
			 size_t errlen);

/* The same for the model and its data, after the model's setup: the
 * parameters (how many, their floats, their names and shapes), each
 * split's samples and fields, and a few samples' bytes (the first, the
 * middle, the last). Two nodes with other data files trained together on
 * overlapping shards of different datasets, or failed later at an
 * unrelated collective ("the ranks' models or data differ: rank 1
 * differs from rank 0 in training split (128 samples vs 64 samples)"). */
int hpu__same_model_check(hpucoll_comm *comm, const hpu_builder *b, char *err, size_t errlen);

/* The training split's digest hpu__same_model_check took (16 hex digits of
 * a few samples' bytes: the first, the middle, the last), which a
 * checkpoint keeps to refuse a resume on other data of the same size; ""
 * before the check or where a fetch failed. */
const char *hpu__same_train_digest(void);

#endif
