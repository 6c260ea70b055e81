#include "worker/runtime/lrsched.h"

#include <math.h>

/* Every schedule is a closed form of k, the number of scheduler steps taken
 * before optimizer step k, so a run that resumes at step k needs no history.
 *
 * torch (1.13) steps its schedulers recursively (StepLR multiplies by gamma
 * every step_size steps, CosineAnnealingLR scales the previous lr), which
 * equals the closed form up to rounding; CosineAnnealingLR's closed form
 * also holds past T_max, where the lr rises again along the same cosine
 * (period 2 * T_max), as torch's recursion does.
 *
 * DeepSpeed's WarmupLR / WarmupDecayLR (deepspeed/runtime/lr_schedules.py)
 * keep last_batch_iteration, -1 before the first step(), and set the lr
 * from it on every step(); their constructor sets the optimizer's lr to
 * warmup_min_lr. So optimizer step 0 runs at warmup_min_lr and step k >= 1
 * at the formula for last_batch_iteration = k - 1. */

void hpu__sched_init(hpu_sched *s, const hpu_train_opts *o, long run_steps)
{
	long total = o->total_steps > 0 ? o->total_steps : run_steps;
	*s = (hpu_sched){
		.kind = o->sched,
		.lr = o->lr,
		.warmup_min_lr = o->warmup_min_lr,
		/* DeepSpeed: warmup_num_steps = max(2, warmup_num_steps) */
		.warmup_steps = o->warmup_steps > 2 ? o->warmup_steps : 2,
		.warmup_type = o->warmup_type,
		/* a run of no steps still gets a schedule (cos(pi * k / 0)) */
		.total_steps = total > 0 ? total : 1,
		.step_size = o->step_size > 0 ? o->step_size : 1,
		.gamma = o->gamma,
		.min_lr = o->min_lr,
	};
}

/* DeepSpeed's _get_gamma() for last_batch_iteration `it` >= 0. */
static double warmup_gamma(const hpu_sched *s, long it)
{
	const long w = s->warmup_steps;
	if (it < w) {
		if (s->warmup_type == HPU_WARMUP_LINEAR)
			return (double)it / (double)w;
		return 1.0 / log((double)w) * log((double)(it + 1));
	}
	if (s->kind == HPU_SCHED_WARMUP)
		return 1.0;
	double left = (double)(s->total_steps - it);
	double span = fmax(1.0, (double)(s->total_steps - w));
	return fmax(0.0, left / span);
}

double hpu__sched_lr(const hpu_sched *s, long k)
{
	if (k < 0)
		k = 0;
	switch (s->kind) {
	case HPU_SCHED_CONSTANT:
		break;
	case HPU_SCHED_STEP:
		return s->lr * pow(s->gamma, (double)(k / s->step_size));
	case HPU_SCHED_COSINE: {
		double c = cos(M_PI * (double)k / (double)s->total_steps);
		return s->min_lr + (s->lr - s->min_lr) * (1.0 + c) / 2.0;
	}
	case HPU_SCHED_WARMUP:
	case HPU_SCHED_WARMUP_DECAY:
		if (k == 0)
			return s->warmup_min_lr;
		return s->warmup_min_lr +
		       (s->lr - s->warmup_min_lr) * warmup_gamma(s, k - 1);
	}
	return s->lr;
}
