#include "model.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "rng.h"

int hpu__model_load(hpu_builder **out, const char *path, int rank, int world,
		    char *err, size_t errlen)
{
	*out = NULL;
	/* RTLD_NOW: an unresolved symbol is an error here, not a crash later. */
	void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!dl) {
		snprintf(err, errlen, "cannot load model %s: %s", path, dlerror());
		return -1;
	}
	const hpu_model *m = dlsym(dl, HPU_MODEL_ENTRY_SYMBOL);
	if (!m) {
		snprintf(err, errlen,
			 "model %s has no entry symbol '%s' (define it with HPU_MODEL() from <hpu/hpu.h>)",
			 path, HPU_MODEL_ENTRY_SYMBOL);
		goto fail;
	}
	if (m->abi_version != HPU_ABI_VERSION) {
		snprintf(err, errlen,
			 "model %s was built for hputrain ABI version %u, but this runtime has ABI version %u: rebuild it against this <hpu/hpu.h>",
			 path, m->abi_version, HPU_ABI_VERSION);
		goto fail;
	}
	if (!m->setup) {
		snprintf(err, errlen, "model %s has no setup function", path);
		goto fail;
	}
	hpu_builder *b = calloc(1, sizeof *b);
	if (!b) {
		snprintf(err, errlen, "out of memory loading %s", path);
		goto fail;
	}
	b->rank = rank;
	b->world = world;
	b->dl = dl;
	b->model = m;
	snprintf(b->path, sizeof b->path, "%s", path);
	*out = b;
	return 0;
fail:
	dlclose(dl);
	return -1;
}

int hpu_error(hpu_builder *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b->err, sizeof b->err, fmt, ap);
	va_end(ap);
	return HPU_ERROR;
}

int hpu_layer_error(hpu_layer *l, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l->err, sizeof l->err, fmt, ap);
	va_end(ap);
	return HPU_ERROR;
}

/* Records the error as hpu_error() does; returns `code`. */
__attribute__((format(printf, 3, 4)))
static int refuse(hpu_builder *b, hpu_err code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b->err, sizeof b->err, fmt, ap);
	va_end(ap);
	return code;
}

int hpu_rank(const hpu_builder *b)
{
	return b->rank;
}

int hpu_world_size(const hpu_builder *b)
{
	return b->world;
}

void hpu_set_user(hpu_builder *b, void *user)
{
	b->user = user;
}

hpu_layer *hpu_layer_add(hpu_builder *b, const char *name, size_t in_size,
			 size_t out_size, const hpu_layer_ops *ops, void *user)
{
	if (!name || !*name || strlen(name) >= sizeof((hpu_layer *)0)->name) {
		hpu_error(b, "layer %d: name missing or longer than 63 bytes",
			  b->nlayers);
		return NULL;
	}
	if (!ops || !ops->forward || !ops->backward || !in_size || !out_size) {
		hpu_error(b, "layer %s: needs forward, backward and non-zero sizes",
			  name);
		return NULL;
	}
	hpu_layer **grown = realloc(b->layers, (b->nlayers + 1) * sizeof *grown);
	hpu_layer *l = calloc(1, sizeof *l);
	if (grown)
		b->layers = grown;
	if (!grown || !l) {
		free(l);
		hpu_error(b, "out of memory adding layer %s", name);
		return NULL;
	}
	l->b = b;
	snprintf(l->name, sizeof l->name, "%s", name);
	l->in_size = in_size;
	l->out_size = out_size;
	l->ops = *ops;
	l->user = user;
	l->first_param = b->nparams;
	l->decl_off = b->numel;
	l->unit = -1;
	b->layers[b->nlayers++] = l;
	return l;
}

int hpu_param_add(hpu_layer *l, const char *name, int ndim,
		  const int64_t *shape, hpu_init init)
{
	hpu_builder *b = l->b;
	if (l != b->layers[b->nlayers - 1])
		return refuse(b, HPU_EINVAL, "layer %s: parameters must be added right after the layer",
			      l->name);
	if (!name || ndim < 1 || ndim > HPU_MAX_DIMS)
		return refuse(b, HPU_EINVAL, "layer %s: parameter needs a name and 1..%d dims",
			      l->name, HPU_MAX_DIMS);
	size_t numel = 1, fan_in = ndim > 1 ? 1 : l->in_size;
	for (int d = 0; d < ndim; d++) {
		if (shape[d] <= 0)
			return refuse(b, HPU_EINVAL, "layer %s: parameter %s has dimension %d of size %lld",
				      l->name, name, d, (long long)shape[d]);
		numel *= (size_t)shape[d];
		if (d > 0)
			fan_in *= (size_t)shape[d];
	}
	hpu_param_info *grown = realloc(b->params, (b->nparams + 1) * sizeof *grown);
	if (!grown)
		return refuse(b, HPU_ENOMEM, "out of memory adding parameter %s", name);
	b->params = grown;
	hpu_param_info *p = &b->params[b->nparams];
	memset(p, 0, sizeof *p);
	snprintf(p->name, sizeof p->name, "%s.%s", l->name, name);
	p->ndim = ndim;
	memcpy(p->shape, shape, ndim * sizeof *shape);
	p->numel = numel;
	p->offset = b->numel;
	p->rel = b->numel - l->decl_off;
	p->init = init;
	p->fan_in = fan_in;
	/* Keep every parameter 16-float (64-byte) aligned in the flat buffer. */
	b->numel += (numel + 15) & ~(size_t)15;
	b->psi += numel;
	l->plen = b->numel - l->decl_off;
	b->nparams++;
	return l->nparams++;
}

int hpu_dataset_set(hpu_builder *b, hpu_split split, const hpu_dataset *ds)
{
	if ((split != HPU_SPLIT_TRAIN && split != HPU_SPLIT_TEST) || !ds ||
	    !ds->fetch || !ds->size || !ds->sample_size || !ds->label_size)
		return refuse(b, HPU_EINVAL, "dataset: needs fetch and non-zero size, sample_size, label_size");
	b->data[split] = *ds;
	b->has_data[split] = 1;
	return HPU_OK;
}

int hpu_loss_set(hpu_builder *b, const hpu_loss *loss)
{
	if (!loss || !loss->loss)
		return refuse(b, HPU_EINVAL, "loss: needs a loss function");
	b->loss = *loss;
	b->has_loss = 1;
	return HPU_OK;
}

float *hpu_param(hpu_layer *l, int i)
{
	return l->pbase + l->b->params[l->first_param + i].rel;
}

float *hpu_grad(hpu_layer *l, int i)
{
	return l->gbase + l->b->params[l->first_param + i].rel;
}

int hpu_layer_checkpoint(hpu_layer *l, int on)
{
	l->ckpt = on != 0;
	return HPU_OK;
}

void *hpu_layer_user(hpu_layer *l)
{
	return l->user;
}

const char *hpu_layer_name(const hpu_layer *l)
{
	return l->name;
}

static int check_declared(hpu_builder *b, char *err, size_t errlen)
{
	if (!b->nlayers) {
		snprintf(err, errlen, "model %s declared no layers", b->path);
		return -1;
	}
	if (!b->has_data[HPU_SPLIT_TRAIN] || !b->has_loss) {
		snprintf(err, errlen, "model %s declared no %s", b->path,
			 b->has_loss ? "training dataset" : "loss");
		return -1;
	}
	size_t in = b->data[HPU_SPLIT_TRAIN].sample_size;
	for (int i = 0; i < b->nlayers; i++) {
		if (b->layers[i]->in_size != in) {
			snprintf(err, errlen,
				 "model %s: layer %s takes %zu floats per sample but gets %zu from %s",
				 b->path, b->layers[i]->name, b->layers[i]->in_size, in,
				 i ? b->layers[i - 1]->name : "the dataset");
			return -1;
		}
		in = b->layers[i]->out_size;
	}
	const hpu_dataset *tr = &b->data[0], *te = &b->data[1];
	if (b->has_data[1] && (te->sample_size != tr->sample_size ||
			       te->label_size != tr->label_size)) {
		snprintf(err, errlen, "model %s: test and training samples differ in size",
			 b->path);
		return -1;
	}
	return 0;
}

int hpu__model_setup(hpu_builder *b, int argc, char **argv, char *err,
		     size_t errlen)
{
	if (b->model->setup(b, argc, argv) != 0) {
		snprintf(err, errlen, "model %s: setup failed: %s", b->path,
			 b->err[0] ? b->err : "(no reason given)");
		return -1;
	}
	if (b->err[0]) {
		snprintf(err, errlen, "model %s: %s", b->path, b->err);
		return -1;
	}
	return check_declared(b, err, errlen);
}

void hpu__model_init_layer(hpu_builder *b, int li, uint64_t seed, float *dst)
{
	hpu_layer *l = b->layers[li];
	memset(dst, 0, l->plen * sizeof *dst);
	for (int i = l->first_param; i < l->first_param + l->nparams; i++) {
		hpu_param_info *p = &b->params[i];
		float *w = dst + p->rel;
		hpu_rng r;
		hpu_rng_seed(&r, seed, (uint64_t)i + 1);
		float bound = 1.0f / sqrtf((float)p->fan_in);
		for (size_t k = 0; k < p->numel; k++) {
			switch (p->init) {
			case HPU_INIT_ZEROS:
				w[k] = 0;
				break;
			case HPU_INIT_ONES:
				w[k] = 1;
				break;
			case HPU_INIT_FAN_IN_UNIFORM:
				w[k] = (2 * hpu_rng_float(&r) - 1) * bound;
				break;
			}
		}
	}
}

int hpu__model_params_open(hpu_builder *b, const char *path, char *err, size_t errlen)
{
	struct stat st;
	const char *why;
	int fd = hpu_open_input_fd(path, 0, &st, &why); /* a FIFO would hang */
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

void hpu__model_destroy(hpu_builder **pb)
{
	hpu_builder *b = *pb;
	if (!b)
		return;
	if (b->model && b->model->teardown)
		b->model->teardown(b->user);
	for (int i = 0; i < b->nlayers; i++)
		free(b->layers[i]);
	free(b->layers);
	free(b->params);
	if (b->dl)
		dlclose(b->dl);
	free(b);
	*pb = NULL;
}
