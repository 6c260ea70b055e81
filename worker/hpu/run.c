/* run.c: what a model's hooks reach (hpu_run_* of <hpu/hpu.h>): the
 * trained parameters and buffers by name, the last evaluation's figures,
 * and forward passes through the runtime that filled the hpu_run. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "worker/hpu/model.h"

static void describe(hpu_tensor *info, const char *name, int ndim, const int64_t *shape,
		     size_t numel, const float *data)
{
	if (!info)
		return;
	memset(info, 0, sizeof *info);
	info->data = (void *)data;
	info->dtype = HPU_F32;
	info->batch = 1;
	info->ndim = ndim;
	memcpy(info->shape, shape, (size_t)ndim * sizeof *shape);
	info->sample_numel = numel;
	info->name = name;
}

hpu_run *hpu__run_live;

/* 1 (said on stderr) when run is not the live hook's. */
static int stale(const hpu_run *run, const char *fn)
{
	if (run && run == hpu__run_live)
		return 0;
	fprintf(stderr, "hpu-worker: %s() called with %s: an hpu_run is valid only while the hook "
			"it was given to runs\n",
		fn, run ? "an hpu_run whose hook has returned" : "NULL");
	return 1;
}

const float *hpu_run_param(hpu_run *run, const char *name, hpu_tensor *info)
{
	if (stale(run, __func__))
		return NULL;
	hpu_builder *b = run->b;
	int p = name ? hpu__model_param(b, name) : -1;
	if (p < 0) {
		hpu_run_error(run, "no parameter named %s", name ? name : "(null)");
		return NULL;
	}
	size_t at = 0;
	for (int i = 0; i < p; i++)
		at += b->params[i].numel;
	const hpu_param_info *pi = &b->params[p];
	describe(info, pi->name, pi->ndim, pi->shape, pi->numel, run->params + at);
	return run->params + at;
}

const float *hpu_run_buffer(hpu_run *run, const char *name, hpu_tensor *info)
{
	if (stale(run, __func__))
		return NULL;
	hpu_builder *b = run->b;
	int i = name ? hpu__model_buffer(b, name) : -1;
	if (i < 0 || !run->buffers) {
		hpu_run_error(run, "no buffer named %s", name ? name : "(null)");
		return NULL;
	}
	const hpu_buffer_info *bi = &b->buffers[i];
	describe(info, bi->name, bi->ndim, bi->shape, bi->numel, run->buffers + bi->offset);
	return run->buffers + bi->offset;
}

int hpu_run_forward(hpu_run *run, const void *const *fields, int batch, const char *tensor,
		    hpu_tensor *out)
{
	if (stale(run, __func__))
		return HPU_EINVAL;
	if (!fields || !tensor || !out || batch < 1 || batch > run->b->max_batch) {
		hpu_run_error(run, "hpu_run_forward: needs fields, a tensor name, out and 1..%d "
				   "samples (the micro-batch), got %d",
			      run->b->max_batch, batch);
		return HPU_EINVAL;
	}
	if (hpu__model_tensor(run->b, tensor) < 0) {
		hpu_run_error(run, "hpu_run_forward: no tensor named %s", tensor);
		return HPU_ENOENT;
	}
	return run->forward(run, fields, batch, tensor, out);
}

const hpu_ctx *hpu_run_ctx(const hpu_run *run)
{
	if (stale(run, __func__))
		return NULL;
	return &run->ctx;
}

int hpu_run_rank(const hpu_run *run)
{
	if (stale(run, __func__))
		return -1;
	return run->rank;
}

int hpu_run_world_size(const hpu_run *run)
{
	if (stale(run, __func__))
		return -1;
	return run->world;
}

long hpu_run_step(const hpu_run *run)
{
	if (stale(run, __func__))
		return -1;
	return run->step;
}

double hpu_run_metric(const hpu_run *run, const char *name)
{
	if (stale(run, __func__))
		return NAN;
	if (!run->evaluated || !name)
		return NAN;
	if (!strcmp(name, "test_loss") || !strcmp(name, "loss"))
		return run->test_loss;
	for (int i = 0; i < run->b->nmetrics; i++)
		if (!strcmp(run->b->metrics[i].name, name))
			return run->metric[i];
	return NAN;
}

int hpu_run_error(hpu_run *run, const char *fmt, ...)
{
	if (stale(run, __func__))
		return HPU_ERROR;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(run->err, sizeof run->err, fmt, ap);
	va_end(ap);
	return HPU_ERROR;
}
