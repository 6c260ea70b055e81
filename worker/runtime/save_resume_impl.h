/* save_resume_impl: what the files of save_resume.h share:
 *   save_checkpoint.c  hpu__checkpoint_save: the shards, the buffers file,
 *                      the partial directory and the signals during a save
 *   save_manifest.c    the manifest and --keep's plan, published and pruned
 *   resume_find.c      hpu__checkpoint_find: found, checked and verified
 *   resume_apply.c     hpu__checkpoint_apply: the run's state restored
 *   save_resume_base.c every rank's outcome agreed on, the metrics records
 * They call one way (tests/check_circles.sh): save_checkpoint.c on
 * save_manifest.c; save_checkpoint.c, resume_find.c and resume_apply.c on
 * save_resume_base.c, which calls no other file of the folder;
 * save_manifest.c and resume_apply.c on lrsched.c (the schedules' names).
 * Not for other users: the rest of the runtime includes save_resume.h. */
#ifndef HPU_SAVE_RESUME_IMPL_H
#define HPU_SAVE_RESUME_IMPL_H

#include <cJSON.h>
#include <hpu/coll.h>
#include <stddef.h>
#include <stdio.h>

#include "worker/runtime/save_resume.h"

/* One rank's outcome of a phase, all-gathered as bytes. */
typedef struct rec {
	char ok;
	char sha256[65];
	char foreign; /* failed on a file of another uid */
	char mismatch; /* resume: an intact checkpoint of another model or its arguments */
	char published; /* rank 0's finish: it failed after the checkpoint was published */
	double bytes, secs;
	char msg[424];
} rec;

/* Shares every rank's rec; returns how many failed and, in err, the first
 * failure as "rank R: ...". all[world] is the caller's (or NULL). */
int hpu__checkpoint_agree(hpucoll_comm *comm, const rec *mine, rec *all, char *err,
			  size_t errlen);

/* Writes record j (freed) to the metrics file (rank 0's; NULL: none),
 * flushed; -1 with a sentence naming the file when it cannot. */
int hpu__checkpoint_metrics_put(FILE *metrics, const char *path, cJSON *j, char *err,
				size_t errlen);

/* hpu__ckpt_clean_partials' callback: says which stale partial checkpoint
 * it removed. */
void hpu__checkpoint_said_removed(const char *path, void *arg);

/* Rank 0, after every shard is in place (all[world], bf: the buffers
 * file): the manifest, then publishing the partial directory as `name`
 * and pruning (--keep, or --keep-last and --keep-best). */
int hpu__checkpoint_finish(hpucoll_comm *comm, const hpu_train_opts *o, const hpu_builder *b,
			   hpu_strat *st, const hpu_run_pos *pos, const rec *all,
			   const hpu_ckpt_file *bf, const char *partial, const char *name,
			   char *msg, size_t msglen);

#endif
