/* optim: optimizers over flat fp32 buffers, each one fused pass. */
#ifndef HPU_OPTIM_H
#define HPU_OPTIM_H

#include <stddef.h>

#include "config.h"

typedef struct hpu_optim {
	hpu_optim_kind kind;
	double lr, momentum, weight_decay, beta1, beta2, eps;
	int nesterov;
	size_t n;
	long t;     /* steps taken */
	float *m;   /* SGD momentum buffer / Adam first moment */
	float *v;   /* Adam second moment */
} hpu_optim;

/* Sets up an optimizer for n parameters from the training options.
 * Returns 0, or -1 if the state cannot be allocated. */
int hpu_optim_init(hpu_optim *o, const hpu_train_opts *opts, size_t n);

/* One step: updates p[n] from the gradients g[n] (as torch.optim.SGD /
 * torch.optim.AdamW do). */
void hpu_optim_step(hpu_optim *o, float *p, const float *g);

void hpu_optim_free(hpu_optim *o);

#endif
