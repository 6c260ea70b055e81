#include "worker/hpu/model.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/ops/autocast.h"
#include "common/fileio.h"
#include "common/rng.h"

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
	if (m->abi_version < HPU_ABI_VERSION_MIN || m->abi_version > HPU_ABI_VERSION) {
		snprintf(err, errlen,
			 "model %s was built for hputrain ABI version %u, but this runtime has ABI version %u "
			 "(and loads %u): %s",
			 path, m->abi_version, HPU_ABI_VERSION, HPU_ABI_VERSION_MIN,
			 m->abi_version == 1 ? "ABI 1 (a chain of layers with float inputs) is gone; "
					       "declare the model as a graph (see <hpu/hpu.h>, <hpu/layers.h> "
					       "and README's model author guide) and rebuild it"
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
	b->model_size = entry_size(m);
	snprintf(b->path, sizeof b->path, "%s", path);
	*out = b;
	return 0;
fail:
	dlclose(dl);
	return -1;
}

/* Records a builder error with its code. During setup errors are sticky:
 * the first one stays (its message and code), later ones are dropped. */
static void record(hpu_builder *b, hpu_err code, const char *fmt, va_list ap)
{
	if (b->phase == HPU__PHASE_SETUP) {
		if (b->status != HPU_OK)
			return;
		b->status = code;
	}
	vsnprintf(b->err, sizeof b->err, fmt, ap);
}

int (hpu_error)(hpu_builder *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	record(b, HPU_ERROR, fmt, ap);
	va_end(ap);
	return HPU_ERROR;
}

int hpu_builder_status(const hpu_builder *b)
{
	return b->status;
}

int hpu_layer_error(hpu_layer *l, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l->err, sizeof l->err, fmt, ap);
	va_end(ap);
	return HPU_ERROR;
}

/* Records the error as hpu_error() does (sticky during setup); returns
 * `code`. */
__attribute__((format(printf, 3, 4)))
static int refuse(hpu_builder *b, hpu_err code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	record(b, code, fmt, ap);
	va_end(ap);
	return code;
}

/* A public call made in the wrong phase: records "CALL() called PHASE:
 * WHY" as the builder's error and, when there is one, the layer's (the
 * message a failed forward/backward is reported with). Returns
 * HPU_EINVAL. */
static int wrong_phase(hpu_builder *b, hpu_layer *l, const char *call)
{
	const char *why = b->phase == HPU__PHASE_SETUP
		? "called during setup, but a layer's parameters, gradients, buffers and "
		  "memory exist only once setup has returned (use them in its forward and backward)"
		: "called after setup (while the model runs), but declarations belong in setup";
	if (l)
		snprintf(l->err, sizeof l->err, "%s() %s", call, why);
	return refuse(b, HPU_EINVAL, "%s%s%s%s() %s", l ? "layer " : "", l ? l->name : "",
		      l ? ": " : "", call, why);
}

/* Declarations: refused after setup, and no-ops once a declaration
 * failed (sticky errors: `fail` returned, nothing recorded). */
#define HPU__SETUP_ONLY(b, l, call, fail)                       \
	do {                                                     \
		if ((b)->phase != HPU__PHASE_SETUP) {            \
			wrong_phase((b), (l), (call));           \
			return (fail);                           \
		}                                                \
		if ((b)->status != HPU_OK)                       \
			return (fail);                           \
	} while (0)

/* A declaration on a layer. A NULL layer is a failed declaration's (the
 * builder holds its error): HPU_EINVAL, nothing recorded. */
#define HPU__LAYER_DECL(l, call)                                \
	do {                                                     \
		if (!(l))                                        \
			return HPU_EINVAL;                       \
		HPU__SETUP_ONLY((l)->b, (l), (call), (l)->b->status ? (l)->b->status : HPU_EINVAL); \
	} while (0)

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

int hpu_max_batch(const hpu_builder *b)
{
	return b->max_batch;
}

/* ---- names and tensors ---- */

/* A name for a layer, tensor, field, parameter or buffer: 1 to 63 bytes
 * of letters, digits, '_', '-', '/' and '.' (not "," which separates
 * inputs). */
static int bad_name(const char *name)
{
	if (!name || !*name || strlen(name) >= HPU_NAME_MAX)
		return 1;
	for (const char *c = name; *c; c++)
		if (!isalnum((unsigned char)*c) && !strchr("_-/.", *c))
			return 1;
	return 0;
}

int hpu__model_tensor(const hpu_builder *b, const char *name)
{
	for (int i = 0; i < b->ntensors; i++)
		if (!strcmp(b->tensors[i].name, name))
			return i;
	return -1;
}

int hpu__model_param(const hpu_builder *b, const char *name)
{
	for (int i = 0; i < b->nparams; i++)
		if (!strcmp(b->params[i].name, name))
			return i;
	return -1;
}

int hpu__model_buffer(const hpu_builder *b, const char *name)
{
	for (int i = 0; i < b->nbuffers; i++)
		if (!strcmp(b->buffers[i].name, name))
			return i;
	return -1;
}

/* Checks a shape (ndim dims, each > 0) and gives its element count; 0
 * when bad. ndim 0 is one element (a scalar per sample) when `scalar`. */
static size_t shape_numel(int ndim, const int64_t *shape, int scalar)
{
	if (ndim < (scalar ? 0 : 1) || ndim > HPU_MAX_DIMS || (ndim && !shape))
		return 0;
	size_t n = 1;
	for (int d = 0; d < ndim; d++) {
		if (shape[d] <= 0 || shape[d] > (int64_t)1 << 40)
			return 0;
		n *= (size_t)shape[d];
	}
	return n;
}

static int add_tensor(hpu_builder *b, const char *name, hpu_dtype dt, int ndim,
		      const int64_t *shape, int producer, int field, const char *who)
{
	if (bad_name(name))
		return refuse(b, HPU_EINVAL, "%s: tensor name \"%s\" is empty, longer than %d bytes "
			      "or has characters other than letters, digits and _-/.",
			      who, name ? name : "(null)", HPU_NAME_MAX - 1);
	if (hpu__model_tensor(b, name) >= 0)
		return refuse(b, HPU_EINVAL, "%s: tensor %s is declared twice", who, name);
	if (dt != HPU_F32 && dt != HPU_I32)
		return refuse(b, HPU_EINVAL, "%s: tensor %s has an unknown dtype %d", who, name,
			      (int)dt);
	size_t n = shape_numel(ndim, shape, 1);
	if (!n)
		return refuse(b, HPU_EINVAL, "%s: tensor %s needs 0..%d dimensions, each > 0", who,
			      name, HPU_MAX_DIMS);
	hpu_tinfo *grown = realloc(b->tensors, (size_t)(b->ntensors + 1) * sizeof *grown);
	if (!grown)
		return refuse(b, HPU_ENOMEM, "out of memory adding tensor %s", name);
	b->tensors = grown;
	hpu_tinfo *t = &b->tensors[b->ntensors];
	memset(t, 0, sizeof *t);
	snprintf(t->name, sizeof t->name, "%s", name);
	t->dtype = dt;
	t->ndim = ndim;
	if (ndim)
		memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
	t->sample_numel = n;
	t->producer = producer;
	t->field = field;
	t->last_reader = -1;
	return b->ntensors++;
}

int hpu_tensor_info(const hpu_builder *b, const char *name, hpu_tensor *out)
{
	int i = name ? hpu__model_tensor(b, name) : -1;
	if (i < 0)
		return HPU_ENOENT;
	const hpu_tinfo *t = &b->tensors[i];
	memset(out, 0, sizeof *out);
	out->dtype = t->dtype;
	out->ndim = t->ndim;
	memcpy(out->shape, t->shape, sizeof out->shape);
	out->sample_numel = t->sample_numel;
	out->name = t->name;
	return HPU_OK;
}

/* ---- datasets ---- */

int hpu_dataset_set(hpu_builder *b, hpu_split split, const hpu_dataset *ds)
{
	HPU__SETUP_ONLY(b, NULL, "hpu_dataset_set", HPU_EINVAL);
	if (split != HPU_SPLIT_TRAIN && split != HPU_SPLIT_TEST)
		return refuse(b, HPU_EINVAL, "dataset: unknown split %d", (int)split);
	const char *which = split == HPU_SPLIT_TRAIN ? "training dataset" : "test dataset";
	if (!ds || !ds->fetch || !ds->size)
		return refuse(b, HPU_EINVAL, "%s: needs fetch and a non-zero size", which);
	if (ds->nfields < 1 || ds->nfields > HPU_MAX_IO)
		return refuse(b, HPU_EINVAL, "%s: needs 1..%d fields, has %d", which, HPU_MAX_IO,
			      ds->nfields);
	if (b->has_data[split])
		return refuse(b, HPU_EINVAL, "%s: set twice", which);
	if (split == HPU_SPLIT_TEST && !b->has_data[HPU_SPLIT_TRAIN])
		return refuse(b, HPU_EINVAL, "test dataset: set the training dataset first");
	if (b->nlayers)
		return refuse(b, HPU_EINVAL, "%s: set it before the layers that read it", which);
	for (int f = 0; f < ds->nfields; f++) {
		const hpu_field *fi = &ds->fields[f];
		if (split == HPU_SPLIT_TEST) {
			const hpu_tinfo *t = &b->tensors[f];
			if (f >= b->data[0].nfields || !fi->name || strcmp(fi->name, t->name) ||
			    fi->dtype != t->dtype || fi->ndim != t->ndim ||
			    (fi->ndim && memcmp(fi->shape, t->shape, (size_t)fi->ndim * 8)))
				return refuse(b, HPU_EINVAL,
					      "test dataset: field %d (%s) differs from the training dataset's (%s): "
					      "the splits need the same fields, dtypes and shapes",
					      f, fi->name ? fi->name : "(null)",
					      f < b->data[0].nfields ? t->name : "none");
			continue;
		}
		int rc = add_tensor(b, fi->name, fi->dtype, fi->ndim, fi->shape, -1, f, which);
		if (rc < 0)
			return rc;
	}
	if (split == HPU_SPLIT_TEST && ds->nfields != b->data[0].nfields)
		return refuse(b, HPU_EINVAL, "test dataset: %d fields, the training dataset %d",
			      ds->nfields, b->data[0].nfields);
	b->data[split] = *ds;
	for (int f = 0; f < ds->nfields; f++) { /* the names are ours now */
		snprintf(b->field_names[f], HPU_NAME_MAX, "%s", ds->fields[f].name);
		b->data[split].fields[f].name = b->field_names[f];
	}
	b->has_data[split] = 1;
	return HPU_OK;
}

/* ---- layers ---- */

static hpu_layer *layer_fail(hpu_builder *b, hpu_layer *l, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static hpu_layer *layer_fail(hpu_builder *b, hpu_layer *l, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	record(b, HPU_EINVAL, fmt, ap);
	va_end(ap);
	free(l);
	return NULL;
}

/* Parses the comma-separated input list into l->in. */
static int parse_inputs(hpu_builder *b, hpu_layer *l, const char *inputs)
{
	const char *p = inputs ? inputs : "";
	while (*p) {
		const char *e = strchr(p, ',');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		char name[HPU_NAME_MAX];
		if (!n || n >= sizeof name)
			return refuse(b, HPU_EINVAL, "layer %s: input list \"%s\" has an empty or "
				      "over-long name", l->name, inputs);
		memcpy(name, p, n);
		name[n] = 0;
		int t = hpu__model_tensor(b, name);
		if (t < 0)
			return refuse(b, HPU_ENOENT, "layer %s: input %s is not a tensor declared "
				      "before it (a dataset field or an earlier layer's output)",
				      l->name, name);
		if (l->nin == HPU_MAX_IO)
			return refuse(b, HPU_EINVAL, "layer %s: more than %d inputs", l->name,
				      HPU_MAX_IO);
		l->in[l->nin++] = t;
		p += n + (e != NULL);
	}
	return HPU_OK;
}

hpu_layer *hpu_layer_add(hpu_builder *b, const char *name, const char *inputs,
			 const hpu_layer_ops *ops, void *user)
{
	HPU__SETUP_ONLY(b, NULL, "hpu_layer_add", NULL);
	if (bad_name(name))
		return layer_fail(b, NULL, "layer %d: name \"%s\" is empty, longer than %d bytes or "
				  "has characters other than letters, digits and _-/.",
				  b->nlayers, name ? name : "(null)", HPU_NAME_MAX - 1);
	for (int i = 0; i < b->nlayers; i++)
		if (!strcmp(b->layers[i]->name, name))
			return layer_fail(b, NULL, "layer %s: declared twice", name);
	if (!ops || !ops->forward)
		return layer_fail(b, NULL, "layer %s: needs a forward function", name);
	hpu_layer *l = calloc(1, sizeof *l);
	if (!l)
		return layer_fail(b, NULL, "out of memory adding layer %s", name);
	l->b = b;
	l->index = b->nlayers;
	snprintf(l->name, sizeof l->name, "%s", name);
	/* an ABI 2 model's hpu_layer_ops ends before `device` */
	if (b->abi >= 3)
		l->ops = *ops;
	else
		memcpy(&l->ops, ops, offsetof(hpu_layer_ops, device));
	l->device = l->ops.device;
	if (l->device != HPU_LAYER_ANY_DEVICE && l->device != HPU_LAYER_HOST_ONLY) {
		free(l);
		return layer_fail(b, NULL, "layer %s: unknown device %d in its hpu_layer_ops "
				  "(HPU_LAYER_ANY_DEVICE or HPU_LAYER_HOST_ONLY)", name,
				  (int)ops->device);
	}
	l->user = user;
	l->reads_in = l->reads_out = ~0u; /* backward reads everything */
	if (parse_inputs(b, l, inputs) < 0) {
		free(l);
		return NULL;
	}
	hpu_layer **grown = realloc(b->layers, (size_t)(b->nlayers + 1) * sizeof *grown);
	if (!grown)
		return layer_fail(b, l, "out of memory adding layer %s", name);
	b->layers = grown;
	l->first_param = b->nparams;
	l->first_buffer = b->nbuffers;
	l->decl_off = b->numel;
	l->unit = -1;
	b->layers[b->nlayers++] = l;
	return l;
}

/* Declarations of a layer's outputs, parameters and buffers follow it
 * before the next layer (they extend flat layouts in order). */
static int check_last(hpu_layer *l, const char *what)
{
	hpu_builder *b = l->b;
	if (l != b->layers[b->nlayers - 1])
		return refuse(b, HPU_EINVAL, "layer %s: %s must be declared right after the layer, "
			      "before the next one", l->name, what);
	return HPU_OK;
}

int hpu_layer_output(hpu_layer *l, const char *tensor, hpu_dtype dtype, int ndim,
		     const int64_t *shape)
{
	HPU__LAYER_DECL(l, "hpu_layer_output");
	hpu_builder *b = l->b;
	int rc = check_last(l, "outputs");
	if (rc < 0)
		return rc;
	if (l->nout == HPU_MAX_IO)
		return refuse(b, HPU_EINVAL, "layer %s: more than %d outputs", l->name, HPU_MAX_IO);
	char who[HPU_NAME_MAX + 8];
	snprintf(who, sizeof who, "layer %s", l->name);
	int t = add_tensor(b, tensor, dtype, ndim, shape, l->index, -1, who);
	if (t < 0)
		return t;
	l->out[l->nout] = t;
	return l->nout++;
}

static int grow_pidx(hpu_layer *l, int g)
{
	int *grown = realloc(l->pidx, (size_t)(l->npidx + 1) * sizeof *grown);
	if (!grown)
		return refuse(l->b, HPU_ENOMEM, "out of memory");
	l->pidx = grown;
	l->pidx[l->npidx] = g;
	return l->npidx++;
}

static int check_init(hpu_builder *b, const char *name, const hpu_init *init)
{
	if (init->kind < HPU_INIT_ZEROS || init->kind > HPU_INIT_CUSTOM)
		return refuse(b, HPU_EINVAL, "%s: unknown initializer %d", name, (int)init->kind);
	if (init->kind == HPU_INIT_CUSTOM && !init->fn)
		return refuse(b, HPU_EINVAL, "%s: HPU_INIT_CUSTOM needs fn", name);
	if ((init->kind == HPU_INIT_NORMAL || init->kind == HPU_INIT_TRUNC_NORMAL) &&
	    !(init->b >= 0))
		return refuse(b, HPU_EINVAL, "%s: a normal initializer needs std b >= 0", name);
	if (init->kind == HPU_INIT_UNIFORM && !(init->a <= init->b))
		return refuse(b, HPU_EINVAL, "%s: HPU_INIT_UNIFORM needs a <= b", name);
	return HPU_OK;
}

/* The checks a parameter and a buffer declaration share (`what` says
 * which): right after its layer, a good name not taken, a shape, an
 * initializer. Sets full ("layer.name") and *numel; HPU_OK or the code. */
static int check_decl(hpu_layer *l, const char *what, const char *name, int ndim,
		      const int64_t *shape, const hpu_init *init, char *full, size_t fulllen,
		      size_t *numel)
{
	hpu_builder *b = l->b;
	char plural[32];
	snprintf(plural, sizeof plural, "%ss", what);
	int rc = check_last(l, plural);
	if (rc < 0)
		return rc;
	if (bad_name(name))
		return refuse(b, HPU_EINVAL, "layer %s: %s name missing, too long or with "
			      "characters other than letters, digits and _-/.", l->name, what);
	if (!(*numel = shape_numel(ndim, shape, 0)))
		return refuse(b, HPU_EINVAL, "layer %s: %s %s needs 1..%d dimensions, each > 0",
			      l->name, what, name, HPU_MAX_DIMS);
	snprintf(full, fulllen, "%s.%s", l->name, name);
	if (hpu__model_param(b, full) >= 0 || hpu__model_buffer(b, full) >= 0)
		return refuse(b, HPU_EINVAL, "layer %s: %s is declared twice", l->name, full);
	return check_init(b, full, init);
}

int hpu_param_add(hpu_layer *l, const char *name, int ndim, const int64_t *shape,
		  hpu_init init)
{
	HPU__LAYER_DECL(l, "hpu_param_add");
	hpu_builder *b = l->b;
	char full[sizeof b->params[0].name];
	size_t numel;
	int rc = check_decl(l, "parameter", name, ndim, shape, &init, full, sizeof full, &numel);
	if (rc < 0)
		return rc;
	hpu_param_info *grown = realloc(b->params, (size_t)(b->nparams + 1) * sizeof *grown);
	if (!grown)
		return refuse(b, HPU_ENOMEM, "out of memory adding parameter %s", full);
	b->params = grown;
	hpu_param_info *p = &b->params[b->nparams];
	memset(p, 0, sizeof *p);
	snprintf(p->name, sizeof p->name, "%s", full);
	p->ndim = ndim;
	memcpy(p->shape, shape, (size_t)ndim * sizeof *shape);
	p->numel = numel;
	p->offset = b->numel;
	p->rel = b->numel - l->decl_off;
	p->init = init;
	p->layer = l->index;
	p->users = 1;
	if ((rc = grow_pidx(l, b->nparams)) < 0)
		return rc;
	/* Keep every parameter 16-float (64-byte) aligned in the flat buffer. */
	b->numel += (numel + 15) & ~(size_t)15;
	b->psi += numel;
	l->plen = b->numel - l->decl_off;
	b->nparams++;
	l->nparams++;
	return rc;
}

int hpu_param_init(hpu_builder *b, const char *param, hpu_init init)
{
	HPU__SETUP_ONLY(b, NULL, "hpu_param_init", HPU_EINVAL);
	int g = param ? hpu__model_param(b, param) : -1;
	if (g < 0)
		return refuse(b, HPU_ENOENT, "hpu_param_init: no parameter named %s declared so far",
			      param ? param : "(null)");
	int rc = check_init(b, param, &init);
	if (rc < 0)
		return rc;
	b->params[g].init = init;
	return HPU_OK;
}

int hpu_param_shape(const hpu_builder *b, const char *param, int *ndim,
		    int64_t shape[HPU_MAX_DIMS])
{
	int g = param ? hpu__model_param(b, param) : -1;
	if (g < 0)
		return HPU_ENOENT;
	*ndim = b->params[g].ndim;
	memcpy(shape, b->params[g].shape, sizeof b->params[g].shape);
	return HPU_OK;
}

int hpu_param_share(hpu_layer *l, const char *param)
{
	HPU__LAYER_DECL(l, "hpu_param_share");
	hpu_builder *b = l->b;
	int g = param ? hpu__model_param(b, param) : -1;
	if (g < 0)
		return refuse(b, HPU_ENOENT, "layer %s: shares parameter %s, which no earlier layer "
			      "declared", l->name, param ? param : "(null)");
	int owner = b->params[g].layer;
	for (int k = 0; k < l->npidx; k++)
		if (l->pidx[k] == g)
			return refuse(b, HPU_EINVAL, "layer %s: uses parameter %s twice", l->name,
				      param);
	int rc = grow_pidx(l, g);
	if (rc < 0)
		return rc;
	b->params[g].users++;
	if (owner == l->index)
		return rc;
	for (int k = 0; k < l->nuses; k++)
		if (l->uses[k] == owner)
			return rc;
	int *grown = realloc(l->uses, (size_t)(l->nuses + 1) * sizeof *grown);
	if (!grown)
		return refuse(b, HPU_ENOMEM, "out of memory");
	l->uses = grown;
	l->uses[l->nuses++] = owner;
	return rc;
}

int hpu_buffer_add(hpu_layer *l, const char *name, int ndim, const int64_t *shape,
		   hpu_init init, hpu_buffer_sync sync)
{
	HPU__LAYER_DECL(l, "hpu_buffer_add");
	hpu_builder *b = l->b;
	char full[sizeof b->buffers[0].name];
	size_t numel;
	int rc = check_decl(l, "buffer", name, ndim, shape, &init, full, sizeof full, &numel);
	if (rc < 0)
		return rc;
	if (sync < HPU_BUFFER_BROADCAST || sync > HPU_BUFFER_LOCAL)
		return refuse(b, HPU_EINVAL, "layer %s: buffer %s has an unknown sync %d", l->name,
			      name, (int)sync);
	hpu_buffer_info *grown = realloc(b->buffers, (size_t)(b->nbuffers + 1) * sizeof *grown);
	if (!grown)
		return refuse(b, HPU_ENOMEM, "out of memory adding buffer %s", full);
	b->buffers = grown;
	hpu_buffer_info *bi = &b->buffers[b->nbuffers];
	memset(bi, 0, sizeof *bi);
	snprintf(bi->name, sizeof bi->name, "%s", full);
	bi->ndim = ndim;
	memcpy(bi->shape, shape, (size_t)ndim * sizeof *shape);
	bi->numel = numel;
	bi->offset = b->buffer_numel;
	bi->init = init;
	bi->sync = sync;
	bi->layer = l->index;
	b->buffer_numel += (numel + 15) & ~(size_t)15;
	b->nbuffers++;
	return l->nbuffers++;
}

int hpu_layer_memory(hpu_layer *l, size_t saved_ps, size_t saved_fixed, size_t scratch_ps,
		     size_t scratch_fixed)
{
	HPU__LAYER_DECL(l, "hpu_layer_memory");
	l->saved_ps = saved_ps;
	l->saved_fixed = saved_fixed;
	l->scratch_ps = scratch_ps;
	l->scratch_fixed = scratch_fixed;
	return HPU_OK;
}

int hpu_layer_checkpoint(hpu_layer *l, int on)
{
	HPU__LAYER_DECL(l, "hpu_layer_checkpoint");
	l->ckpt = on != 0;
	return HPU_OK;
}

int hpu_layer_params_in_ops(hpu_layer *l)
{
	HPU__LAYER_DECL(l, "hpu_layer_params_in_ops");
	l->params_in_ops = 1;
	return HPU_OK;
}

int hpu_layer_grads_in_ops(hpu_layer *l)
{
	HPU__LAYER_DECL(l, "hpu_layer_grads_in_ops");
	l->grads_in_ops = 1;
	return HPU_OK;
}

/* The highest bit set in v (v != 0). */
static int high_bit(unsigned v)
{
	int k = 0;
	while (v >>= 1)
		k++;
	return k;
}

int hpu_layer_backward_reads(hpu_layer *l, unsigned inputs, unsigned outputs)
{
	HPU__LAYER_DECL(l, "hpu_layer_backward_reads");
	if (inputs >> l->nin)
		return refuse(l->b, HPU_EINVAL, "layer %s: hpu_layer_backward_reads names input %d; "
			      "the layer has %d", l->name, high_bit(inputs), l->nin);
	if (outputs >> HPU_MAX_IO)
		return refuse(l->b, HPU_EINVAL, "layer %s: hpu_layer_backward_reads names output %d; "
			      "a layer has at most %d", l->name, high_bit(outputs), HPU_MAX_IO);
	l->reads_in = inputs;
	l->reads_out = outputs;
	return HPU_OK;
}

/* ---- losses, metrics, hooks ---- */

/* The per-sample f32 scalar tensor `tensor` for `what`, or an error. */
static int scalar_tensor(hpu_builder *b, const char *tensor, const char *what)
{
	int t = tensor ? hpu__model_tensor(b, tensor) : -1;
	if (t < 0)
		return refuse(b, HPU_ENOENT, "%s: no tensor named %s", what,
			      tensor ? tensor : "(null)");
	const hpu_tinfo *ti = &b->tensors[t];
	if (ti->dtype != HPU_F32 || ti->sample_numel != 1 || ti->producer < 0)
		return refuse(b, HPU_EINVAL, "%s: tensor %s must be a layer's f32 output with one "
			      "value per sample (ndim 0), as loss layers write", what, tensor);
	return t;
}

int hpu_loss_add(hpu_builder *b, const char *tensor, float weight)
{
	HPU__SETUP_ONLY(b, NULL, "hpu_loss_add", HPU_EINVAL);
	int t = scalar_tensor(b, tensor, "loss");
	if (t < 0)
		return t;
	if (!isfinite(weight))
		return refuse(b, HPU_EINVAL, "loss %s: weight must be finite", tensor);
	if (b->nloss == HPU_MAX_IO)
		return refuse(b, HPU_EINVAL, "loss: more than %d loss tensors", HPU_MAX_IO);
	for (int i = 0; i < b->nloss; i++)
		if (b->loss[i].tensor == t)
			return refuse(b, HPU_EINVAL, "loss: tensor %s added twice", tensor);
	b->loss[b->nloss++] = (hpu_loss_ent){t, weight};
	b->tensors[t].loss = 1;
	return HPU_OK;
}

int hpu_metric_add(hpu_builder *b, const char *name, const char *tensor)
{
	HPU__SETUP_ONLY(b, NULL, "hpu_metric_add", HPU_EINVAL);
	int t = scalar_tensor(b, tensor, "metric");
	if (t < 0)
		return t;
	if (bad_name(name) || !strcmp(name, "test_loss"))
		return refuse(b, HPU_EINVAL, "metric: name \"%s\" is empty, too long, reserved "
			      "(test_loss) or has characters other than letters, digits and _-/.",
			      name ? name : "(null)");
	if (b->nmetrics == HPU_MAX_IO)
		return refuse(b, HPU_EINVAL, "metric: more than %d metrics", HPU_MAX_IO);
	for (int i = 0; i < b->nmetrics; i++)
		if (!strcmp(b->metrics[i].name, name))
			return refuse(b, HPU_EINVAL, "metric %s: added twice", name);
	hpu_metric_ent *m = &b->metrics[b->nmetrics++];
	snprintf(m->name, sizeof m->name, "%s", name);
	m->tensor = t;
	b->tensors[t].metric = 1;
	return HPU_OK;
}

static int add_hook(hpu_builder *b, hpu_hook_ent *v, int *n, hpu_hook fn, void *user)
{
	if (!fn)
		return refuse(b, HPU_EINVAL, "hook: needs a function");
	if (*n == 4)
		return refuse(b, HPU_EINVAL, "hook: at most 4 of a kind");
	v[(*n)++] = (hpu_hook_ent){fn, user};
	return HPU_OK;
}

int hpu_hook_after_eval(hpu_builder *b, hpu_hook fn, void *user)
{
	HPU__SETUP_ONLY(b, NULL, "hpu_hook_after_eval", HPU_EINVAL);
	return add_hook(b, b->after_eval, &b->nafter_eval, fn, user);
}

int hpu_hook_after_train(hpu_builder *b, hpu_hook fn, void *user)
{
	HPU__SETUP_ONLY(b, NULL, "hpu_hook_after_train", HPU_EINVAL);
	return add_hook(b, b->after_train, &b->nafter_train, fn, user);
}

/* ---- inside forward/backward ---- */

/* Parameters, gradients, buffers, memory: refused during setup. */
#define HPU__RUN_ONLY(l, call)                                  \
	do {                                                     \
		if ((l)->b->phase != HPU__PHASE_RUN) {           \
			wrong_phase((l)->b, (l), (call));        \
			return NULL;                             \
		}                                                \
	} while (0)

/* Index k of the layer's npidx parameters (or nbuffers buffers), else
 * the layer's error naming the call and the index. */
static int check_index(hpu_layer *l, const char *call, int k, int n, const char *what)
{
	if (k >= 0 && k < n)
		return 1;
	snprintf(l->err, sizeof l->err, "%s(): layer %s has %d %s, asked for index %d", call,
		 l->name, n, what, k);
	return 0;
}

float *hpu_param(hpu_layer *l, int k)
{
	HPU__RUN_ONLY(l, "hpu_param");
	if (!check_index(l, "hpu_param", k, l->npidx, "parameters"))
		return NULL;
	const hpu_param_info *p = &l->b->params[l->pidx[k]];
	float *v = l->b->layers[p->layer]->pbase + p->rel;
	/* under mixed precision: the fp32 values, made now unless the layer
	 * leaves that to the ops */
	if (!l->params_in_ops)
		hpu__ac_param_f32(v, p->numel);
	return v;
}

float *hpu_grad(hpu_layer *l, int k)
{
	HPU__RUN_ONLY(l, "hpu_grad");
	if (!check_index(l, "hpu_grad", k, l->npidx, "parameters"))
		return NULL;
	const hpu_param_info *p = &l->b->params[l->pidx[k]];
	return l->b->layers[p->layer]->gbase + p->rel;
}

float *hpu_buffer(hpu_layer *l, int k)
{
	HPU__RUN_ONLY(l, "hpu_buffer");
	if (!check_index(l, "hpu_buffer", k, l->nbuffers, "buffers"))
		return NULL;
	const hpu_buffer_info *bi = &l->b->buffers[l->first_buffer + k];
	return l->bbase + (bi->offset - l->b->buffers[l->first_buffer].offset);
}

void *hpu_saved(hpu_layer *l)
{
	HPU__RUN_ONLY(l, "hpu_saved");
	return l->saved;
}

void *hpu_scratch(hpu_layer *l)
{
	HPU__RUN_ONLY(l, "hpu_scratch");
	return l->scratch;
}

void *hpu_layer_user(hpu_layer *l)
{
	return l->user;
}

const char *hpu_layer_name(const hpu_layer *l)
{
	return l->name;
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
					  high_bit(l->reads_out), l->nout);
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

int hpu__model_setup_fn(hpu_builder *b, int (*setup)(hpu_builder *, int, char **), int argc,
			char **argv, char *err, size_t errlen)
{
	if (setup(b, argc, argv) != 0)
		return setup_fail(b, err, errlen, "setup failed: %s",
				  b->err[0] ? b->err : "(no reason given)");
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

int hpu__model_init_layer(hpu_builder *b, int li, uint64_t seed, float *dst, char *err,
			  size_t errlen)
{
	hpu_layer *l = b->layers[li];
	memset(dst, 0, l->plen * sizeof *dst);
	const hpu_param_info *weight = NULL; /* the last of 2+ dims so far */
	for (int i = l->first_param; i < l->first_param + l->nparams; i++) {
		hpu_param_info *p = &b->params[i];
		/* a bias (1 dim) after a weight takes the weight's fans, as
		 * torch.nn.Linear's and Conv's biases do */
		const hpu_param_info *fans_of = p->ndim == 1 ? weight : NULL;
		if (hpu__model_init_values(&p->init, p->name, p->ndim, p->shape, p->numel, seed,
					   (uint64_t)i + 1, fans_of, dst + p->rel, err, errlen) < 0)
			return -1;
		if (p->ndim >= 2)
			weight = p;
	}
	return 0;
}

int hpu__model_init_buffers(hpu_builder *b, uint64_t seed, float *dst, char *err,
			    size_t errlen)
{
	memset(dst, 0, b->buffer_numel * sizeof *dst);
	for (int i = 0; i < b->nbuffers; i++) {
		hpu_buffer_info *bi = &b->buffers[i];
		/* streams after the parameters' */
		if (hpu__model_init_values(&bi->init, bi->name, bi->ndim, bi->shape, bi->numel, seed,
					   (uint64_t)(b->nparams + i) + 1, NULL, dst + bi->offset,
					   err, errlen) < 0)
			return -1;
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
