/* model_init: the parameters' and buffers' initial values (the
 * initializers of <hpu/hpu.h>) and reading them from --load-params. */
#include "worker/hpu/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/rng.h"

/* ---- initial values ---- */

void hpu__model_fans(int ndim, const int64_t *shape, size_t *fan_in, size_t *fan_out)
{
	size_t field = 1;
	for (int d = 2; d < ndim; d++)
		field *= (size_t)shape[d];
	*fan_in = ndim >= 2 ? (size_t)shape[1] * field : (size_t)shape[0];
	*fan_out = (size_t)shape[0] * field;
}

float hpu_init_uniform(hpu_init_rng *r)
{
	return hpu_rng_float((hpu_rng *)r);
}

float hpu_init_normal(hpu_init_rng *r)
{
	/* Box-Muller; u1 in (0, 1] */
	float u1 = 1.0f - hpu_rng_float((hpu_rng *)r), u2 = hpu_rng_float((hpu_rng *)r);
	return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

int hpu__model_init_values(const hpu_init *init, const char *name, int ndim,
			   const int64_t *shape, size_t numel, uint64_t seed, uint64_t stream,
			   const hpu_param_info *fans_of, float *w, char *err, size_t errlen)
{
	hpu_init_rng r;
	hpu_rng_seed((hpu_rng *)&r, seed, stream);
	size_t fi, fo;
	if (fans_of)
		hpu__model_fans(fans_of->ndim, fans_of->shape, &fi, &fo);
	else
		hpu__model_fans(ndim, shape, &fi, &fo);
	float a = init->a, bb = init->b, gain = a != 0 ? a : 1.0f, lo = 0, hi = 0, std = 0;
	switch (init->kind) {
	case HPU_INIT_UNIFORM:
		lo = a, hi = bb;
		break;
	case HPU_INIT_XAVIER_UNIFORM:
		hi = gain * sqrtf(6.0f / (float)(fi + fo)), lo = -hi;
		break;
	case HPU_INIT_KAIMING_UNIFORM:
		hi = sqrtf(6.0f / ((1 + a * a) * (float)fi)), lo = -hi;
		break;
	case HPU_INIT_FAN_IN_UNIFORM:
		hi = 1.0f / sqrtf((float)fi), lo = -hi;
		break;
	case HPU_INIT_XAVIER_NORMAL:
		std = gain * sqrtf(2.0f / (float)(fi + fo));
		break;
	case HPU_INIT_KAIMING_NORMAL:
		std = sqrtf(2.0f / ((1 + a * a) * (float)fi));
		break;
	default:
		break;
	}
	for (size_t k = 0; k < numel; k++) {
		switch (init->kind) {
		case HPU_INIT_ZEROS:
			w[k] = 0;
			break;
		case HPU_INIT_ONES:
			w[k] = 1;
			break;
		case HPU_INIT_CONSTANT:
			w[k] = a;
			break;
		case HPU_INIT_UNIFORM:
		case HPU_INIT_XAVIER_UNIFORM:
		case HPU_INIT_KAIMING_UNIFORM:
		case HPU_INIT_FAN_IN_UNIFORM:
			w[k] = lo + (hi - lo) * hpu_init_uniform(&r);
			break;
		case HPU_INIT_NORMAL:
			w[k] = a + bb * hpu_init_normal(&r);
			break;
		case HPU_INIT_TRUNC_NORMAL: {
			float z;
			do
				z = hpu_init_normal(&r);
			while (z < -2 || z > 2);
			w[k] = a + bb * z;
			break;
		}
		case HPU_INIT_XAVIER_NORMAL:
		case HPU_INIT_KAIMING_NORMAL:
			w[k] = std * hpu_init_normal(&r);
			break;
		case HPU_INIT_CUSTOM:
			k = numel;
			break;
		}
	}
	if (init->kind == HPU_INIT_CUSTOM) {
		hpu_init_info info = {name, ndim, shape, numel, fi, fo};
		if (init->fn(init->user, &info, w, &r) != 0) {
			snprintf(err, errlen, "the initializer of %s failed", name);
			return -1;
		}
	}
	return 0;
}

/* A custom initializer that failed after hpu_error() on the builder (its
 * user pointer can carry it): its message after err's "the initializer of
 * X failed". Setup has succeeded by now: the builder's message, cleared
 * before the initializers run (unless setup failed), is theirs. */
static int init_begin(hpu_builder *b)
{
	if (b->status != HPU_OK)
		return 0;
	b->err[0] = '\0';
	return 1;
}

static int init_failed(hpu_builder *b, int ours, char *err, size_t errlen)
{
	size_t n = strlen(err);
	if (ours && b->err[0] && n + 3 < errlen)
		snprintf(err + n, errlen - n, ": %s", b->err);
	return -1;
}

int hpu__model_init_layer(hpu_builder *b, int li, uint64_t seed, float *dst, char *err,
			  size_t errlen)
{
	hpu_layer *l = b->layers[li];
	memset(dst, 0, l->plen * sizeof *dst);
	int ours = init_begin(b);
	const hpu_param_info *weight = NULL; /* the last of 2+ dims so far */
	for (int i = l->first_param; i < l->first_param + l->nparams; i++) {
		hpu_param_info *p = &b->params[i];
		/* a bias (1 dim) after a weight takes the weight's fans, as
		 * torch.nn.Linear's and Conv's biases do */
		const hpu_param_info *fans_of = p->ndim == 1 ? weight : NULL;
		if (hpu__model_init_values(&p->init, p->name, p->ndim, p->shape, p->numel, seed,
					   (uint64_t)i + 1, fans_of, dst + p->rel, err, errlen) < 0)
			return init_failed(b, ours, err, errlen);
		if (p->ndim >= 2)
			weight = p;
	}
	return 0;
}

int hpu__model_init_buffers(hpu_builder *b, uint64_t seed, float *dst, char *err,
			    size_t errlen)
{
	memset(dst, 0, b->buffer_numel * sizeof *dst);
	int ours = init_begin(b);
	for (int i = 0; i < b->nbuffers; i++) {
		hpu_buffer_info *bi = &b->buffers[i];
		/* streams after the parameters' */
		if (hpu__model_init_values(&bi->init, bi->name, bi->ndim, bi->shape, bi->numel, seed,
					   (uint64_t)(b->nparams + i) + 1, NULL, dst + bi->offset,
					   err, errlen) < 0)
			return init_failed(b, ours, err, errlen);
	}
	return 0;
}

int hpu__model_params_open(hpu_builder *b, const char *path, char *err, size_t errlen)
{
	struct stat st;
	const char *why;
	int fd = hpu__open_input_fd(path, 0, &st, &why); /* a FIFO would hang */
	if (fd < 0 && st.st_mode == 0) {
		snprintf(err, errlen, "--load-params %s: cannot read it: %s", path, why);
		return -1;
	}
	if (fd < 0) {
		snprintf(err, errlen, "--load-params %s: not a regular file", path);
		return -1;
	}
	if ((uint64_t)st.st_size != (uint64_t)b->psi * 4) {
		snprintf(err, errlen,
			 "--load-params %s: %lld bytes, but %s has %zu parameters (%zu bytes): "
			 "saved from another model?",
			 path, (long long)st.st_size, b->path, b->psi, b->psi * 4);
		close(fd);
		return -1;
	}
	return fd;
}

int hpu__model_read_layer(hpu_builder *b, int li, int fd, float *dst)
{
	hpu_layer *l = b->layers[li];
	memset(dst, 0, l->plen * sizeof *dst);
	off_t at = 0; /* the file holds every parameter unpadded, in order */
	for (int i = 0; i < l->first_param; i++)
		at += (off_t)b->params[i].numel * 4;
	for (int i = l->first_param; i < l->first_param + l->nparams; i++) {
		const hpu_param_info *p = &b->params[i];
		size_t want = p->numel * 4, got = 0;
		if (b->load_at)
			at = (off_t)b->load_at[i];
		while (got < want) {
			ssize_t n = pread(fd, (char *)(dst + p->rel) + got, want - got,
					  at + (off_t)got);
			if (n <= 0)
				return -1;
			got += (size_t)n;
		}
		at += (off_t)want;
	}
	return 0;
}
