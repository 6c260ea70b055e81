/* model_graph: declaring the graph during setup: tensors, datasets,
 * layers and their outputs, losses, metrics and hooks. */
#include "worker/hpu/model.h"
#include "worker/hpu/model_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/shapetext.h"

static int add_tensor(hpu_builder *b, const char *name, hpu_dtype dt, int ndim,
		      const int64_t *shape, int producer, int field, const char *who)
{
	if (hpu__model_bad_name(name))
		return hpu__model_refuse(b, HPU_EINVAL, "%s: tensor name \"%s\" is empty, longer than %d bytes "
					 "or has characters other than letters, digits and _-/.",
					 who, name ? name : "(null)", HPU_NAME_MAX - 1);
	if (hpu__model_tensor(b, name) >= 0)
		return hpu__model_refuse(b, HPU_EINVAL, "%s: tensor %s is declared twice", who, name);
	if (dt != HPU_F32 && dt != HPU_I32)
		return hpu__model_refuse(b, HPU_EINVAL, "%s: tensor %s has an unknown dtype %d", who, name,
					 (int)dt);
	char why[128];
	size_t n = hpu__model_shape_numel(ndim, shape, 1, why, sizeof why);
	if (!n)
		return hpu__model_refuse(b, HPU_EINVAL, "%s: tensor %s %s", who, name, why);
	hpu_tinfo *grown = realloc(b->tensors, (size_t)(b->ntensors + 1) * sizeof *grown);
	if (!grown)
		return hpu__model_refuse(b, HPU_ENOMEM, "out of memory adding tensor %s", name);
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

/* "f32", "i32", or "dtype N" for a value that is neither. */
static const char *dtype_text(hpu_dtype d, char *buf, size_t len)
{
	if (d == HPU_F32 || d == HPU_I32)
		return d == HPU_F32 ? "f32" : "i32";
	snprintf(buf, len, "dtype %d", (int)d);
	return buf;
}

int hpu_dataset_overlap(hpu_builder *b, hpu_split split, size_t span)
{
	HPU__SETUP_ONLY(b, NULL, "hpu_dataset_overlap", HPU_EINVAL);
	/* --val-fraction holds out of the training split only */
	if (split != HPU_SPLIT_TRAIN)
		return hpu__model_refuse(b, HPU_EINVAL, "hpu_dataset_overlap: split %d: only the "
					 "training split's overlap is read (HPU_SPLIT_TRAIN)", (int)split);
	if (!b->has_data[split])
		return hpu__model_refuse(b, HPU_EINVAL, "hpu_dataset_overlap: set the training dataset "
					 "first");
	if (span < 1 || span > b->data[split].size)
		return hpu__model_refuse(b, HPU_EINVAL, "hpu_dataset_overlap: span %zu; it must be 1 "
					 "to the split's %zu samples", span, b->data[split].size);
	b->overlap[split] = span;
	return HPU_OK;
}

int hpu_dataset_set(hpu_builder *b, hpu_split split, const hpu_dataset *ds)
{
	HPU__SETUP_ONLY(b, NULL, "hpu_dataset_set", HPU_EINVAL);
	if (split != HPU_SPLIT_TRAIN && split != HPU_SPLIT_TEST)
		return hpu__model_refuse(b, HPU_EINVAL, "dataset: unknown split %d", (int)split);
	const char *which = split == HPU_SPLIT_TRAIN ? "training dataset" : "test dataset";
	if (!ds || !ds->fetch || !ds->size)
		return hpu__model_refuse(b, HPU_EINVAL, "%s: needs fetch and a non-zero size", which);
	/* The sampler's permutation and the evaluation's indices number
	 * samples with 32 bits (worker/runtime/sampler.h). */
	if (ds->size > UINT32_MAX)
		return hpu__model_refuse(b, HPU_EINVAL, "%s: %zu samples; at most %" PRIu32
					 " are supported (samples are numbered with 32 bits)",
					 which, ds->size, UINT32_MAX);
	if (ds->nfields < 1 || ds->nfields > HPU_MAX_IO)
		return hpu__model_refuse(b, HPU_EINVAL, "%s: needs 1..%d fields, has %d", which, HPU_MAX_IO,
					 ds->nfields);
	if (b->has_data[split])
		return hpu__model_refuse(b, HPU_EINVAL, "%s: set twice", which);
	if (split == HPU_SPLIT_TEST && !b->has_data[HPU_SPLIT_TRAIN])
		return hpu__model_refuse(b, HPU_EINVAL, "test dataset: set the training dataset first");
	if (b->nlayers)
		return hpu__model_refuse(b, HPU_EINVAL, "%s: set it before the layers that read it", which);
	for (int f = 0; f < ds->nfields; f++) {
		const hpu_field *fi = &ds->fields[f];
		if (split == HPU_SPLIT_TEST) {
			const hpu_tinfo *t = &b->tensors[f];
			if (f >= b->data[0].nfields || !fi->name || strcmp(fi->name, t->name) ||
			    fi->dtype != t->dtype || fi->ndim != t->ndim ||
			    (fi->ndim && memcmp(fi->shape, t->shape, (size_t)fi->ndim * 8))) {
				/* each side's dtype and shape (it named the fields only) */
				char mine[96] = "", theirs[96] = "none", ms[64], ts[64], d0[16], d1[16];
				int nd = fi->ndim < 0 ? 0 : fi->ndim > HPU_MAX_DIMS ? HPU_MAX_DIMS : fi->ndim;
				snprintf(mine, sizeof mine, "%s %s %s", fi->name ? fi->name : "(null)",
					 dtype_text(fi->dtype, d0, sizeof d0),
					 fi->ndim == nd ? hpu__shape_text(ms, sizeof ms, nd, fi->shape)
							: "(a bad ndim)");
				if (f < b->data[0].nfields)
					snprintf(theirs, sizeof theirs, "%s %s %s", t->name,
						 dtype_text(t->dtype, d1, sizeof d1),
						 hpu__shape_text(ts, sizeof ts, t->ndim, t->shape));
				return hpu__model_refuse(b, HPU_EINVAL,
							 "test dataset: field %d (%s) differs from the training dataset's (%s): "
							 "the splits need the same fields, dtypes and shapes",
							 f, mine, theirs);
			}
			continue;
		}
		int rc = add_tensor(b, fi->name, fi->dtype, fi->ndim, fi->shape, -1, f, which);
		if (rc < 0)
			return rc;
	}
	if (split == HPU_SPLIT_TEST && ds->nfields != b->data[0].nfields)
		return hpu__model_refuse(b, HPU_EINVAL, "test dataset: %d fields, the training dataset %d",
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
	hpu__model_record(b, HPU_EINVAL, fmt, ap);
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
			return hpu__model_refuse(b, HPU_EINVAL, "layer %s: input list \"%s\" has an empty or "
						 "over-long name", l->name, inputs);
		memcpy(name, p, n);
		name[n] = 0;
		int t = hpu__model_tensor(b, name);
		if (t < 0 && name[strcspn(name, " \t")])
			return hpu__model_refuse(b, HPU_ENOENT, "layer %s: input \"%s\" is not a tensor "
						 "declared before it: it has a space (names in a list are "
						 "separated by ',' alone)",
						 l->name, name);
		if (t < 0)
			return hpu__model_refuse(b, HPU_ENOENT, "layer %s: input %s is not a tensor declared "
						 "before it (a dataset field or an earlier layer's output)",
						 l->name, name);
		if (l->nin == HPU_MAX_IO)
			return hpu__model_refuse(b, HPU_EINVAL, "layer %s: more than %d inputs", l->name,
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
	if (!name)
		return layer_fail(b, NULL, "layer %d: its name is NULL (every layer needs one)",
				  b->nlayers);
	if (hpu__model_bad_name(name))
		return layer_fail(b, NULL, "layer %d: name \"%s\" is empty, longer than %d bytes or "
				  "has characters other than letters, digits and _-/.",
				  b->nlayers, name, HPU_NAME_MAX - 1);
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
int hpu__model_check_last(hpu_layer *l, const char *what)
{
	hpu_builder *b = l->b;
	if (l != b->layers[b->nlayers - 1])
		return hpu__model_refuse(b, HPU_EINVAL, "layer %s: %s must be declared right after the layer, "
					 "before the next one", l->name, what);
	return HPU_OK;
}

int hpu_layer_output(hpu_layer *l, const char *tensor, hpu_dtype dtype, int ndim,
		     const int64_t *shape)
{
	HPU__LAYER_DECL(l, "hpu_layer_output");
	hpu_builder *b = l->b;
	int rc = hpu__model_check_last(l, "outputs");
	if (rc < 0)
		return rc;
	if (l->nout == HPU_MAX_IO)
		return hpu__model_refuse(b, HPU_EINVAL, "layer %s: more than %d outputs", l->name, HPU_MAX_IO);
	char who[HPU_NAME_MAX + 8];
	snprintf(who, sizeof who, "layer %s", l->name);
	int t = add_tensor(b, tensor, dtype, ndim, shape, l->index, -1, who);
	if (t < 0)
		return t;
	l->out[l->nout] = t;
	return l->nout++;
}

/* ---- losses, metrics, hooks ---- */

/* The per-sample f32 scalar tensor `tensor` for `what`, or an error. */
static int scalar_tensor(hpu_builder *b, const char *tensor, const char *what)
{
	int t = tensor ? hpu__model_tensor(b, tensor) : -1;
	if (t < 0)
		return hpu__model_refuse(b, HPU_ENOENT, "%s: no tensor named %s", what,
					 tensor ? tensor : "(null)");
	const hpu_tinfo *ti = &b->tensors[t];
	if (ti->dtype != HPU_F32 || ti->sample_numel != 1 || ti->producer < 0)
		return hpu__model_refuse(b, HPU_EINVAL, "%s: tensor %s must be a layer's f32 output with one "
					 "value per sample (ndim 0, or a shape of one element), as loss "
					 "layers write", what, tensor);
	return t;
}

int hpu_loss_add(hpu_builder *b, const char *tensor, float weight)
{
	HPU__SETUP_ONLY(b, NULL, "hpu_loss_add", HPU_EINVAL);
	int t = scalar_tensor(b, tensor, "loss");
	if (t < 0)
		return t;
	if (!isfinite(weight))
		return hpu__model_refuse(b, HPU_EINVAL, "loss %s: weight must be finite", tensor);
	if (b->nloss == HPU_MAX_IO)
		return hpu__model_refuse(b, HPU_EINVAL, "loss: more than %d loss tensors", HPU_MAX_IO);
	for (int i = 0; i < b->nloss; i++)
		if (b->loss[i].tensor == t)
			return hpu__model_refuse(b, HPU_EINVAL, "loss: tensor %s added twice", tensor);
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
	if (hpu__model_bad_name(name))
		return hpu__model_refuse(b, HPU_EINVAL, "metric: name \"%s\" is empty, too long or has "
					 "characters other than letters, digits and _-/.",
					 name ? name : "(null)");
	/* the figures the evaluation reports beside the metrics: val_loss,
	 * val_samples, test loss, test_loss (a metric of one of these names
	 * wrote a second key of the name into the metrics file, which JSON
	 * readers take for the loss) */
	static const char *const reserved[] = {"loss", "samples", "test_loss"};
	for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
		if (!strcmp(name, reserved[i]))
			return hpu__model_refuse(b, HPU_EINVAL, "metric: name \"%s\" is reserved: the evaluation "
						 "reports its own loss and sample count, and a metric "
						 "NAME is reported as test_NAME and val_NAME (test_loss, "
						 "val_samples, ...)", name);
	if (b->nmetrics == HPU_MAX_IO)
		return hpu__model_refuse(b, HPU_EINVAL, "metric: more than %d metrics", HPU_MAX_IO);
	for (int i = 0; i < b->nmetrics; i++)
		if (!strcmp(b->metrics[i].name, name))
			return hpu__model_refuse(b, HPU_EINVAL, "metric %s: added twice", name);
	hpu_metric_ent *m = &b->metrics[b->nmetrics++];
	snprintf(m->name, sizeof m->name, "%s", name);
	m->tensor = t;
	b->tensors[t].metric = 1;
	return HPU_OK;
}

static int add_hook(hpu_builder *b, hpu_hook_ent *v, int *n, hpu_hook fn, void *user)
{
	if (!fn)
		return hpu__model_refuse(b, HPU_EINVAL, "hook: needs a function");
	if (*n == 4)
		return hpu__model_refuse(b, HPU_EINVAL, "hook: at most 4 of a kind");
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
