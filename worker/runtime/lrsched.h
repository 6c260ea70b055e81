/* lrsched: learning-rate schedules. The lr used by optimizer step k
 * (0-based) is the scheduler's value after k scheduler steps: torch's
 * StepLR and CosineAnnealingLR, DeepSpeed's WarmupLR and WarmupDecayLR
 * (whose value before the first scheduler step is warmup_min_lr). */
#ifndef HPU_LRSCHED_H
#define HPU_LRSCHED_H

#include "options/config.h"

typedef struct hpu_sched {
	hpu_sched_kind kind;
	double lr;           /* base / peak lr */
	double warmup_min_lr;
	long warmup_steps;
	hpu_warmup_type warmup_type;
	long total_steps;    /* resolved: never 0 */
	long step_size;
	double gamma, min_lr;
} hpu_sched;

/* From the options; `run_steps` (the number of optimizer steps this run
 * takes) stands in for total_steps when that is 0. */
void hpu__sched_init(hpu_sched *s, const hpu_train_opts *o, long run_steps);

/* The learning rate for optimizer step k (0-based). */
double hpu__sched_lr(const hpu_sched *s, long k);

#endif
