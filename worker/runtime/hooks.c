#include "worker/runtime/hooks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/device/device.h"
#include "worker/hpu/devmem.h"
#include "worker/runtime/loader.h"

typedef struct impl {
	hpu_strat *st;
	hpu_batch bt;
	uint32_t *idx;
	long step;
	const char *why; /* where the strategy says why a pass failed */
} impl;

/* hpu_run_forward: the fields copied into the runtime's batch, an
 * evaluation-mode forward of what `tensor` needs. */
static int forward(hpu_run *run, const void *const *fields, int batch, const char *tensor,
		   hpu_tensor *out)
{
	impl *im = run->impl;
	hpu_builder *b = run->b;
	const hpu_dataset *d = &b->data[HPU_SPLIT_TRAIN];
	for (int f = 0; f < d->nfields; f++) {
		if (!fields[f])
			return hpu_run_error(run, "hpu_run_forward: field %s is NULL",
					     d->fields[f].name);
		memcpy(im->bt.data[f], fields[f], (size_t)batch * hpu__field_numel(&d->fields[f]) * 4);
	}
	im->bt.n = batch;
	im->bt.idx = im->idx;
	int t = hpu__model_tensor(b, tensor);
	hpu__strat_set_pos(im->st, 0, im->step, 0);
	if (hpu__strat_forward(im->st, &im->bt, 0, 1, t) < 0)
		return hpu_run_error(run, "hpu_run_forward: %s", im->why);
	const hpu_tinfo *ti = &b->tensors[t];
	memset(out, 0, sizeof *out);
	out->data = (void *)hpu__strat_tensor(im->st, t);
	out->dtype = ti->dtype;
	out->batch = batch;
	out->ndim = ti->ndim;
	memcpy(out->shape, ti->shape, sizeof out->shape);
	out->sample_numel = ti->sample_numel;
	out->name = ti->name;
	return out->data ? HPU_OK : hpu_run_error(run, "hpu_run_forward: out of device memory");
}

int hpu__hooks_run(hpu_strat *st, hpu_builder *b, const hpu_hook_ent *v, int n, const char *when,
		   long step, int max_batch, const double *figures, char *err, size_t errlen)
{
	if (n == 0)
		return 0;
	impl im = {.st = st, .step = step, .why = err}; /* the strategy's error buffer */
	hpu_run run = {.b = b, .rank = b->rank, .world = b->world, .step = step,
		       .forward = forward, .impl = &im};
	run.ctx = *hpu__strat_ctx(st); /* seed, rank, world, epoch */
	run.ctx.train = run.ctx.recompute = run.ctx.micro = run.ctx.batch = 0;
	run.ctx.step = step;
	run.ctx.layer = -1;
	run.ctx.samples = NULL;
	float *params = hpu__dev_hbuf_alloc(HPU_MEM_OTHER, b->psi * 4,
					    "parameters for the model's hooks");
	int rc = -1;
	if (!params || hpu__batch_alloc(&b->data[HPU_SPLIT_TRAIN], max_batch, &im.bt,
					"the hooks' batch") < 0 ||
	    !(im.idx = calloc((size_t)max_batch, sizeof *im.idx))) {
		snprintf(err, errlen, "%s", hpu__devmem_error());
		goto out;
	}
	for (int i = 0; i < max_batch; i++)
		im.idx[i] = (uint32_t)i;
	if (hpu__strat_gather_all(st, params) < 0)
		goto out; /* err has the sentence */
	run.params = params;
	run.buffers = hpu__strat_buffers(st);
	if (figures) {
		run.evaluated = 1;
		run.test_loss = figures[0];
		for (int k = 0; k < b->nmetrics; k++)
			run.metric[k] = figures[1 + k];
	}
	for (int i = 0; i < n; i++) {
		run.err[0] = b->err[0] = 0;
		hpu__run_live = &run;
		long late = b->late_calls;
		int hrc = v[i].fn(&run, v[i].user);
		if (hrc == 0 && b->late_calls != late)
			hrc = HPU_EINVAL; /* a declaration it made: b->err says */
		hpu__run_live = NULL;
		if (hrc != 0) {
			/* a builder call made in the hook says why in b->err */
			char why[160];
			snprintf(err, errlen, "the model's hook %s failed: %s", when,
				 hpu__model_why(b, run.err, hrc, why, sizeof why));
			goto out;
		}
	}
	rc = 0;
out:
	hpu__dev_hbuf_free(params);
	hpu__batch_free(&im.bt);
	free(im.idx);
	return rc;
}
