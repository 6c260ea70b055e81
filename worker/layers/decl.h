/* decl.h: what the layer library's declaration functions share: input
 * checks whose errors name the layer, splitting "a,b" input lists, and
 * adding a layer together with its malloc'ed state (freed by the layer's
 * ops.destroy once added, here when adding fails); and what the pairwise
 * losses (mse, the BCEs) share: a row of their two inputs and gradients.
 * Internal to worker/layers. */
#ifndef HPU_LAYERS_DECL_H
#define HPU_LAYERS_DECL_H

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <hpu/hpu.h>

static inline const char *ld_str(const char *s)
{
	return s ? s : "(null)";
}

static inline const char *ld_dtype(hpu_dtype dt)
{
	return dt == HPU_F32 ? "f32" : dt == HPU_I32 ? "i32" : "of an unknown dtype";
}

/* The tensor named `in` into *t, which must exist and be of dtype `dt`;
 * otherwise records an error naming layer `name` and returns HPU_ERROR. */
static inline int ld_input(hpu_builder *b, const char *name, const char *in, hpu_dtype dt,
			   hpu_tensor *t)
{
	if (in && in[strcspn(in, " \t")] && hpu_tensor_info(b, in, t) != HPU_OK)
		return hpu_error(b, "layer %s: input \"%s\" is not a tensor declared before it: it "
				 "has a space (names in a list are separated by ',' alone)",
				 ld_str(name), in);
	if (hpu_tensor_info(b, in, t) != HPU_OK)
		return hpu_error(b, "layer %s: input %s is not a tensor declared before it (a "
				 "dataset field or an earlier layer's output)", ld_str(name),
				 ld_str(in));
	if (t->dtype != dt)
		return hpu_error(b, "layer %s: input %s must be %s, is %s", ld_str(name), in,
				 ld_dtype(dt), ld_dtype(t->dtype));
	return HPU_OK;
}

/* Splits the input list `in` into exactly two names; else records an
 * error naming the layer and what it wants (`what`, "logits,labels"). */
static inline int ld_split2(hpu_builder *b, const char *name, const char *in, const char *what,
			    char first[HPU_NAME_MAX], char second[HPU_NAME_MAX])
{
	const char *comma = in ? strchr(in, ',') : NULL;
	size_t n1 = comma ? (size_t)(comma - in) : 0;
	size_t n2 = comma ? strlen(comma + 1) : 0;
	if (!comma || !n1 || !n2 || n1 >= HPU_NAME_MAX || n2 >= HPU_NAME_MAX ||
	    strchr(comma + 1, ','))
		return hpu_error(b, "layer %s: inputs \"%s\" must be two tensor names, \"%s\"",
				 ld_str(name), ld_str(in), what);
	memcpy(first, in, n1);
	first[n1] = 0;
	memcpy(second, comma + 1, n2 + 1);
	return HPU_OK;
}

/* Layer l (NULL passes through) with the forward inputs and outputs its
 * backward reads declared (hpu_layer_backward_reads: bit k for in[k],
 * out[k]); NULL if refused. Only tensors a backward reads are kept for
 * it: a wrong declaration hands backward NULL. */
static inline hpu_layer *ld_reads(hpu_layer *l, unsigned in, unsigned out)
{
	if (l && hpu_layer_backward_reads(l, in, out) != HPU_OK)
		return NULL;
	return l;
}

/* Adds layer `name` reading `in`, with its state `user` (NULL: malloc
 * failed, an error) and its one output `out` of dtype dt and shape
 * [ndim]shape. From here on ops->destroy frees `user`; when adding fails
 * this frees it. NULL with the builder's error recorded on failure. */
static inline hpu_layer *ld_declare(hpu_builder *b, const char *name, const char *in,
				    const hpu_layer_ops *ops, void *user, const char *out,
				    hpu_dtype dt, int ndim, const int64_t *shape)
{
	if (!user) {
		hpu_error(b, "layer %s: out of memory", ld_str(name));
		return NULL;
	}
	hpu_layer *l = hpu_layer_add(b, name, in, ops, user);
	if (!l) {
		free(user);
		return NULL;
	}
	if (hpu_layer_output(l, out, dt, ndim, shape) < 0)
		return NULL;
	return l;
}

/* Option `what` (".kernel") of layer `name`, an int64_t, as an int into
 * *out; an error naming the layer and the option when it does not fit
 * (the ABI 3 option structs take sizes as int64_t, the layers ints). */
static inline int ld_int(hpu_builder *b, const char *name, const char *what, int64_t v,
			 int *out)
{
	*out = v < INT_MIN || v > INT_MAX ? 0 : (int)v;
	if (v < INT_MIN || v > INT_MAX)
		return hpu_error(b, "layer %s: %s %lld is out of range", ld_str(name), what,
				 (long long)v);
	return HPU_OK;
}

/* Whether batch * per_sample fits the ops' int sizes. */
static inline int ld_fits_int(int batch, size_t per_sample)
{
	return batch >= 0 && (per_sample == 0 || (size_t)batch <= (size_t)INT_MAX / per_sample);
}

/* Per-sample dimension `dim` of x (negative: from the last) into *d; an
 * error naming the layer when x has no such dimension. */
static inline int ld_dim(hpu_builder *b, const char *name, const char *in,
			 const hpu_tensor *x, int dim, int *d)
{
	int at = dim < 0 ? dim + x->ndim : dim;
	if (at < 0 || at >= x->ndim)
		return hpu_error(b, "layer %s: dim %d is not a dimension of input %s, which "
				 "has %d (0 .. %d, or -1 .. -%d from the last)", ld_str(name), dim,
				 ld_str(in), x->ndim, x->ndim - 1, x->ndim);
	*d = at;
	return HPU_OK;
}

/* The product of x's per-sample dimensions [from, to). */
/* 0 when an op of the layer's returned HPU_OK; else (HPU_ERROR: the
 * device's kernel table has no such kernel) the error naming the layer
 * and `what` the op does. */
static inline int ld_op(hpu_layer *l, int rc, const char *what)
{
	if (rc == HPU_OK)
		return 0;
	return hpu_layer_error(l, "layer %s: this device's kernel table has no kernel for its %s",
			       hpu_layer_name(l), what);
}

static inline size_t ld_prod(const hpu_tensor *x, int from, int to)
{
	size_t n = 1;
	for (int i = from; i < to; i++)
		n *= (size_t)x->shape[i];
	return n;
}

/* Row r of a pairwise loss (prediction in[0], target in[1], f32 of one
 * shape): its values, and where its gradients go (NULL where din is NULL
 * or that gradient is not wanted). */
typedef struct ld_pair_row {
	const float *p, *t;
	float *dp, *dt;
} ld_pair_row;

static inline ld_pair_row ld_pair_at(const hpu_tensor *in, const hpu_tensor *din, int r)
{
	size_t off = (size_t)r * in[0].sample_numel;
	ld_pair_row x = {hpu_f32(&in[0]) + off, hpu_f32(&in[1]) + off, NULL, NULL};
	if (din && din[0].data)
		x.dp = hpu_f32(&din[0]) + off;
	if (din && din[1].data)
		x.dt = hpu_f32(&din[1]) + off;
	return x;
}

#endif
