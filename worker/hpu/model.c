/* model: loading a model (dlopen, the ABI check), its setup with the
 * checks and the plan of the declared graph, and destroying the builder.
 * The builder's other files are named in model_impl.h. */
#include "worker/hpu/model.h"
#include "worker/hpu/model_impl.h"

#include <dlfcn.h>
#include <link.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static hpu_builder *builder_new(int rank, int world, int max_batch)
{
	hpu_builder *b = calloc(1, sizeof *b);
	if (!b)
		return NULL;
	b->rank = rank;
	b->world = world;
	b->max_batch = max_batch;
	b->abi = HPU_ABI_VERSION;
	return b;
}

hpu_builder *hpu__model_new(int rank, int world, int max_batch)
{
	hpu_builder *b = builder_new(rank, world, max_batch);
	if (b)
		snprintf(b->path, sizeof b->path, "(in-process model)");
	return b;
}

/* The size of the entry symbol as the model's ELF symbol table says (0
 * when it cannot say): a model built before hpu_model grew a field has a
 * smaller one, and the field is not read. */
static size_t entry_size(const hpu_model *m)
{
	Dl_info info;
	const ElfW(Sym) *sym = NULL;
	if (!dladdr1(m, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym)
		return 0;
	return (size_t)sym->st_size;
}

const hpu_train_defaults *hpu__model_defaults(const hpu_builder *b)
{
	if (!b->model || b->abi < 3 ||
	    b->model_size < offsetof(hpu_model, defaults) + sizeof(hpu_train_defaults))
		return NULL;
	return &b->model->defaults;
}

int hpu__model_load(hpu_builder **out, const char *path, int rank, int world,
		    int max_batch, char *err, size_t errlen)
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
	/* every ABI's hpu_model holds abi_version, name, setup and teardown:
	 * a smaller symbol (an int named hpu_model_entry) was read past its
	 * end and its "setup" called */
	size_t have = entry_size(m);
	if (have && have < offsetof(hpu_model, teardown) + sizeof m->teardown) {
		snprintf(err, errlen,
			 "model %s: its '%s' is %zu bytes, not an hpu_model (at least %zu): define it "
			 "with HPU_MODEL() from <hpu/hpu.h>",
			 path, HPU_MODEL_ENTRY_SYMBOL, have,
			 offsetof(hpu_model, teardown) + sizeof m->teardown);
		goto fail;
	}
	if (m->abi_version < HPU_ABI_VERSION_MIN || m->abi_version > HPU_ABI_VERSION) {
		snprintf(err, errlen,
			 "model %s was built for hputrain ABI version %u, but this runtime has ABI version %u "
			 "(and loads %u): %s",
			 path, m->abi_version, HPU_ABI_VERSION, HPU_ABI_VERSION_MIN,
			 m->abi_version == 1 ? "ABI 1 (a chain of layers with float inputs) is gone; "
					       "declare the model as a graph (see <hpu/hpu.h>, <hpu/layers.h> "
					       "and docs/writing-a-model.md) and rebuild it"
					     : "rebuild it against this <hpu/hpu.h>");
		goto fail;
	}
	if (!m->setup) {
		snprintf(err, errlen, "model %s has no setup function", path);
		goto fail;
	}
	hpu_builder *b = builder_new(rank, world, max_batch);
	if (!b) {
		snprintf(err, errlen, "out of memory loading %s", path);
		goto fail;
	}
	b->dl = dl;
	b->model = m;
	b->abi = m->abi_version;
	b->model_size = have;
	snprintf(b->path, sizeof b->path, "%s", path);
	*out = b;
	return 0;
fail:
	dlclose(dl);
	return -1;
}


/* ---- checking and planning the graph ---- */

static int setup_fail(hpu_builder *b, char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int setup_fail(hpu_builder *b, char *err, size_t errlen, const char *fmt, ...)
{
	char msg[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	snprintf(err, errlen, "model %s: %s", b->path, msg);
	return -1;
}

/* Marks the layers that `want` tensors depend on (for_loss or for_eval). */
static void mark_needed(hpu_builder *b, char *need, int eval)
{
	for (int i = b->nlayers - 1; i >= 0; i--) {
		hpu_layer *l = b->layers[i];
		int used = 0;
		for (int k = 0; k < l->nout && !used; k++)
			used = need[l->out[k]];
		if (!used)
			continue;
		if (eval)
			l->for_eval = 1;
		else
			l->for_loss = 1;
		for (int k = 0; k < l->nin; k++)
			need[l->in[k]] = 1;
	}
}

static int plan(hpu_builder *b, char *err, size_t errlen)
{
	char *need = calloc((size_t)b->ntensors, 1);
	if (!need)
		return setup_fail(b, err, errlen, "out of memory");
	for (int i = 0; i < b->nloss; i++)
		need[b->loss[i].tensor] = 1;
	mark_needed(b, need, 0);
	for (int i = 0; i < b->nmetrics; i++)
		need[b->metrics[i].tensor] = 1;
	mark_needed(b, need, 1);
	free(need);
	/* Gradients flow from the parameters down the graph. */
	for (int i = 0; i < b->nlayers; i++) {
		hpu_layer *l = b->layers[i];
		int g = l->npidx > 0;
		for (int k = 0; k < l->nin; k++) {
			hpu_tinfo *t = &b->tensors[l->in[k]];
			g |= t->grad;
			if (t->last_reader < i)
				t->last_reader = i;
		}
		l->backward = g && l->for_loss;
		for (int k = 0; k < l->nout; k++)
			b->tensors[l->out[k]].grad = g && b->tensors[l->out[k]].dtype == HPU_F32;
		if (l->backward && !l->ops.backward)
			return setup_fail(b, err, errlen, "layer %s has %s but no backward function",
					  l->name, l->npidx ? "parameters" : "inputs that need gradients");
		if (!l->nout)
			return setup_fail(b, err, errlen, "layer %s declared no output", l->name);
		if (l->reads_out != ~0u && l->reads_out >> l->nout)
			return setup_fail(b, err, errlen, "layer %s: hpu_layer_backward_reads names "
					  "output %d; the layer declared %d", l->name,
					  hpu__model_high_bit(l->reads_out), l->nout);
	}
	for (int i = 0; i < b->nlayers; i++) {
		hpu_layer *l = b->layers[i];
		if (l->npidx && !l->for_loss)
			return setup_fail(b, err, errlen, "layer %s has parameters but no loss depends "
					  "on it: it would never train", l->name);
	}
	return 0;
}

static int check_declared(hpu_builder *b, char *err, size_t errlen)
{
	if (!b->has_data[HPU_SPLIT_TRAIN])
		return setup_fail(b, err, errlen, "declared no training dataset (hpu_dataset_set)");
	if (!b->nlayers)
		return setup_fail(b, err, errlen, "declared no layers");
	if (!b->nloss)
		return setup_fail(b, err, errlen, "declared no loss (hpu_loss_add)");
	if (!b->nparams)
		return setup_fail(b, err, errlen, "declared no parameters: nothing to train");
	return plan(b, err, errlen);
}

const char *hpu__model_why(const hpu_builder *b, const char *lerr, int rc, char *buf, size_t n)
{
	if (lerr && lerr[0])
		return lerr;
	if (b->err[0])
		return b->err;
	const char *code = hpu_strerror(rc);
	/* HPU_ERROR's text promises the message that is missing here */
	if (!strcmp(code, "Unknown error code.") || rc == HPU_ERROR)
		snprintf(buf, n, "it returned %d without a message (hpu_error records one)", rc);
	else
		snprintf(buf, n, "it returned %d (%s) without a message (hpu_error records one)", rc, code);
	return buf;
}

int hpu__model_setup_fn(hpu_builder *b, int (*setup)(hpu_builder *, int, char **), int argc,
			char **argv, char *err, size_t errlen)
{
	int rc = setup(b, argc, argv);
	char why[160];
	if (rc != 0)
		return setup_fail(b, err, errlen, "setup failed: %s", hpu__model_why(b, NULL, rc, why, sizeof why));
	if (b->err[0]) /* a declaration failed but setup went on */
		return setup_fail(b, err, errlen, "%s", b->err);
	if (check_declared(b, err, errlen) < 0)
		return -1;
	b->phase = HPU__PHASE_RUN;
	return 0;
}

int hpu__model_setup(hpu_builder *b, int argc, char **argv, char *err, size_t errlen)
{
	return hpu__model_setup_fn(b, b->model->setup, argc, argv, err, errlen);
}

void hpu__model_destroy(hpu_builder **pb)
{
	hpu_builder *b = *pb;
	if (!b)
		return;
	if (b->model && b->model->teardown)
		b->model->teardown(b->user);
	free(b->load_at);
	for (int i = 0; i < b->nlayers; i++) {
		if (b->layers[i]->ops.destroy)
			b->layers[i]->ops.destroy(b->layers[i]->user);
		free(b->layers[i]->pidx);
		free(b->layers[i]->uses);
		free(b->layers[i]);
	}
	free(b->layers);
	free(b->tensors);
	free(b->params);
	free(b->buffers);
	if (b->dl)
		dlclose(b->dl);
	free(b);
	*pb = NULL;
}
