/* Shape layers: reduce (sum, mean, max over a dimension), reshape, slice,
 * concat, permute and transpose. Per-sample dimensions; a dimension is
 * the middle axis of [outer, n, inner], outer counting the batch. The
 * runtime gives each tensor its own memory: the views are copies. */
#include <stdlib.h>
#include <string.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <hpu/ops.h>

#include "worker/layers/decl.h"

/* ---- reduce ---- */

typedef struct reduce {
	hpu_reduce_op op;
	size_t outer, n, inner; /* per sample */
} reduce;

static int reduce_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			  hpu_tensor *out)
{
	const reduce *r = hpu_layer_user(l);
	(void)c;
	return ld_op(l,
		     hpu_reduce_forward(r->op, hpu_f32(&in[0]), hpu_f32(&out[0]),
					r->op == HPU_REDUCE_MAX ? hpu_saved(l) : NULL,
					(size_t)in[0].batch * r->outer, r->n, r->inner),
		     "reduction");
}

static int reduce_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const reduce *r = hpu_layer_user(l);
	(void)c, (void)out;
	if (!din[0].data)
		return 0;
	return ld_op(l,
		     hpu_reduce_backward(r->op, hpu_f32(&dout[0]), hpu_saved(l), hpu_f32(&din[0]),
					 (size_t)in[0].batch * r->outer, r->n, r->inner),
		     "reduction's backward");
}

static const hpu_layer_ops reduce_ops = {
	.forward = reduce_forward,
	.backward = reduce_backward,
	.destroy = free,
};

static hpu_layer *reduce_impl(hpu_builder *b, const char *name, const char *in, const char *out,
		      int dim, hpu_reduce_op op)
{
	hpu_tensor x;
	int d = 0;
	if (ld_input(b, name, in, HPU_F32, &x) < 0 || ld_dim(b, name, in, &x, dim, &d) < 0)
		return NULL;
	if (op != HPU_REDUCE_SUM && op != HPU_REDUCE_MEAN && op != HPU_REDUCE_MAX) {
		hpu_error(b, "layer %s: reduce op %d is none of HPU_REDUCE_SUM, HPU_REDUCE_MEAN, "
			  "HPU_REDUCE_MAX", ld_str(name), (int)op);
		return NULL;
	}
	if (x.shape[d] < 1) {
		hpu_error(b, "layer %s: dimension %d of input %s is empty: nothing to reduce",
			  ld_str(name), d, in);
		return NULL;
	}
	reduce *r = malloc(sizeof *r);
	if (r)
		*r = (reduce){op, ld_prod(&x, 0, d), (size_t)x.shape[d], ld_prod(&x, d + 1, x.ndim)};
	int64_t shape[HPU_MAX_DIMS];
	int nd = 0;
	for (int i = 0; i < x.ndim; i++)
		if (i != d)
			shape[nd++] = x.shape[i];
	/* backward: dout and max's saved positions only */
	hpu_layer *l = ld_reads(ld_declare(b, name, in, &reduce_ops, r, out, HPU_F32, nd, shape), 0, 0);
	if (l && op == HPU_REDUCE_MAX) /* the arg-max of each output, i32 */
		hpu_layer_memory(l, x.sample_numel / (size_t)x.shape[d], 0, 0, 0);
	return l;
}

/* ---- reshape ---- */

static int copy_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	(void)c;
	return ld_op(l, hpu_copy(out[0].data, in[0].data, hpu_numel(&in[0]) * sizeof(float)),
		     "copy");
}

static int copy_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			 const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)c, (void)in, (void)out;
	if (!din[0].data)
		return 0;
	return ld_op(l, hpu_copy(din[0].data, dout[0].data, hpu_numel(&dout[0]) * sizeof(float)),
		     "copy");
}

static const hpu_layer_ops reshape_ops = {.forward = copy_forward, .backward = copy_backward};

/* shape[ndim] with its -1 resolved against numel into s; an error naming
 * the layer when it does not hold numel values. */
static int reshape_shape(hpu_builder *b, const char *name, const char *in, size_t numel,
			 int ndim, const int64_t *shape, int64_t *s)
{
	int free_at = -1;
	size_t known = 1;
	if (ndim < 0 || ndim > HPU_MAX_DIMS || (ndim && !shape))
		return hpu_error(b, "layer %s: reshape to %d dimensions (0 .. %d allowed)",
				 ld_str(name), ndim, HPU_MAX_DIMS);
	for (int i = 0; i < ndim; i++) {
		s[i] = shape[i];
		if (shape[i] == -1 && free_at < 0) {
			free_at = i;
			continue;
		}
		if (shape[i] < 0)
			return hpu_error(b, "layer %s: reshape size %lld at %d (sizes >= 0, one "
					 "-1 at most)", ld_str(name), (long long)shape[i], i);
		known *= (size_t)shape[i];
	}
	if (free_at >= 0 && known && numel % known == 0)
		s[free_at] = (int64_t)(numel / known);
	else if (free_at >= 0)
		known = 0; /* no size fits */
	if ((free_at >= 0 && !known) || (free_at < 0 && known != numel))
		return hpu_error(b, "layer %s: input %s has %zu values a sample; the reshape's "
				 "shape does not hold them", ld_str(name), in, numel);
	return HPU_OK;
}

static hpu_layer *reshape_impl(hpu_builder *b, const char *name, const char *in, const char *out,
		       int ndim, const int64_t *shape)
{
	hpu_tensor x;
	int64_t s[HPU_MAX_DIMS];
	if (ld_input(b, name, in, HPU_F32, &x) < 0 ||
	    reshape_shape(b, name, in, x.sample_numel, ndim, shape, s) < 0)
		return NULL;
	hpu_layer *l = hpu_layer_add(b, name, in, &reshape_ops, NULL);
	if (!l || hpu_layer_output(l, out, HPU_F32, ndim, s) < 0)
		return NULL;
	return ld_reads(l, 0, 0); /* backward copies dout */
}

/* ---- slice ---- */

typedef struct slice {
	size_t outer, n, start, len, inner;
} slice;

static int slice_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			 hpu_tensor *out)
{
	const slice *s = hpu_layer_user(l);
	(void)c;
	return ld_op(l,
		     hpu_copy_rows(hpu_f32(&in[0]), hpu_f32(&out[0]), (size_t)in[0].batch * s->outer,
				   s->n, s->start, s->len, 0, s->len, s->inner),
		     "row copies");
}

/* dx is dy at the slice's positions, 0 elsewhere. */
static int slice_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			  const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const slice *s = hpu_layer_user(l);
	(void)c, (void)out;
	if (!din[0].data)
		return 0;
	if (ld_op(l, hpu_zero(din[0].data, hpu_numel(&in[0]) * sizeof(float)), "zeroing") < 0)
		return HPU_ERROR;
	return ld_op(l,
		     hpu_copy_rows(hpu_f32(&dout[0]), hpu_f32(&din[0]),
				   (size_t)in[0].batch * s->outer, s->len, 0, s->n, s->start,
				   s->len, s->inner),
		     "row copies");
}

static const hpu_layer_ops slice_ops = {
	.forward = slice_forward,
	.backward = slice_backward,
	.destroy = free,
};

static hpu_layer *slice_impl(hpu_builder *b, const char *name, const char *in, const char *out,
		     int dim, int64_t start, int64_t len)
{
	hpu_tensor x;
	int d = 0;
	if (ld_input(b, name, in, HPU_F32, &x) < 0 || ld_dim(b, name, in, &x, dim, &d) < 0)
		return NULL;
	if (start < 0 || len < 1 || start > x.shape[d] - len) {
		hpu_error(b, "layer %s: slice [%lld, %lld + %lld) of dimension %d of input %s "
			  "(size %lld) is not inside it (start >= 0, len >= 1)", ld_str(name),
			  (long long)start, (long long)start, (long long)len, d, in,
			  (long long)x.shape[d]);
		return NULL;
	}
	slice *s = malloc(sizeof *s);
	if (s)
		*s = (slice){ld_prod(&x, 0, d), (size_t)x.shape[d], (size_t)start, (size_t)len,
			     ld_prod(&x, d + 1, x.ndim)};
	int64_t shape[HPU_MAX_DIMS];
	memcpy(shape, x.shape, sizeof shape);
	shape[d] = len;
	return ld_reads(ld_declare(b, name, in, &slice_ops, s, out, HPU_F32, x.ndim, shape), 0, 0);
}

/* ---- concat ---- */

typedef struct concat {
	int nin;
	size_t outer, inner, total;
	size_t n[HPU_MAX_IO]; /* each input's size along the dimension */
} concat;

static int concat_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			  hpu_tensor *out)
{
	const concat *s = hpu_layer_user(l);
	size_t at = 0, outer = (size_t)in[0].batch * s->outer;
	(void)c;
	for (int k = 0; k < s->nin; k++) {
		if (ld_op(l,
			  hpu_copy_rows(hpu_f32(&in[k]), hpu_f32(&out[0]), outer, s->n[k], 0,
					s->total, at, s->n[k], s->inner),
			  "row copies") < 0)
			return HPU_ERROR;
		at += s->n[k];
	}
	return 0;
}

static int concat_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const concat *s = hpu_layer_user(l);
	size_t at = 0, outer = (size_t)in[0].batch * s->outer;
	(void)c, (void)out;
	for (int k = 0; k < s->nin; k++) {
		if (din[k].data &&
		    ld_op(l,
			  hpu_copy_rows(hpu_f32(&dout[0]), hpu_f32(&din[k]), outer, s->total, at,
					s->n[k], 0, s->n[k], s->inner),
			  "row copies") < 0)
			return HPU_ERROR;
		at += s->n[k];
	}
	return 0;
}

static const hpu_layer_ops concat_ops = {
	.forward = concat_forward,
	.backward = concat_backward,
	.destroy = free,
};

/* Splits "a,b,..." into names[] (2 .. HPU_MAX_IO of them); the count, or
 * an error naming the layer. */
static int split_names(hpu_builder *b, const char *name, const char *in,
		       char names[HPU_MAX_IO][HPU_NAME_MAX])
{
	int n = 0;
	const char *p = in ? in : "";
	for (;;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		if (!len || len >= HPU_NAME_MAX || n == HPU_MAX_IO)
			break;
		memcpy(names[n], p, len);
		names[n++][len] = 0;
		if (!comma)
			return n >= 2 ? n : hpu_error(b, "layer %s: concat needs 2 to %d inputs, "
						  "\"%s\" names one", ld_str(name), HPU_MAX_IO, p);
		p = comma + 1;
	}
	return hpu_error(b, "layer %s: inputs \"%s\" must be 2 to %d tensor names, \"a,b,...\"",
			 ld_str(name), ld_str(in), HPU_MAX_IO);
}

/* Whether x and y have the same shape but along dimension d. */
static int same_but(const hpu_tensor *x, const hpu_tensor *y, int d)
{
	if (x->ndim != y->ndim)
		return 0;
	for (int i = 0; i < x->ndim; i++)
		if (i != d && x->shape[i] != y->shape[i])
			return 0;
	return 1;
}

static hpu_layer *concat_impl(hpu_builder *b, const char *name, const char *in, const char *out,
		      int dim)
{
	char names[HPU_MAX_IO][HPU_NAME_MAX];
	hpu_tensor x[HPU_MAX_IO];
	int d = 0, n = split_names(b, name, in, names);
	if (n < 0 || ld_input(b, name, names[0], HPU_F32, &x[0]) < 0 ||
	    ld_dim(b, name, names[0], &x[0], dim, &d) < 0)
		return NULL;
	concat *s = malloc(sizeof *s);
	if (!s)
		return ld_declare(b, name, in, &concat_ops, NULL, out, HPU_F32, 0, NULL);
	*s = (concat){n, ld_prod(&x[0], 0, d), ld_prod(&x[0], d + 1, x[0].ndim), 0, {0}};
	for (int k = 0; k < n; k++) {
		if (k && ld_input(b, name, names[k], HPU_F32, &x[k]) < 0)
			goto fail;
		if (!same_but(&x[0], &x[k], d)) {
			hpu_error(b, "layer %s: input %s's shape differs from %s's other than in "
				  "dimension %d (concat needs the same shape elsewhere)",
				  ld_str(name), names[k], names[0], d);
			goto fail;
		}
		s->n[k] = (size_t)x[k].shape[d];
		s->total += s->n[k];
	}
	int64_t shape[HPU_MAX_DIMS];
	memcpy(shape, x[0].shape, sizeof shape);
	shape[d] = (int64_t)s->total;
	return ld_reads(ld_declare(b, name, in, &concat_ops, s, out, HPU_F32, x[0].ndim, shape), 0,
			0);
fail:
	free(s);
	return NULL;
}

/* ---- permute, transpose ---- */

typedef struct permute {
	int ndim;                           /* with the batch */
	int perm[HPU_MAX_DIMS + 1], inv[HPU_MAX_DIMS + 1];
	int64_t xshape[HPU_MAX_DIMS + 1], yshape[HPU_MAX_DIMS + 1];
} permute;

static int permute_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   hpu_tensor *out)
{
	const permute *p = hpu_layer_user(l);
	int64_t shape[HPU_MAX_DIMS + 1];
	(void)c;
	memcpy(shape, p->xshape, sizeof shape);
	shape[0] = in[0].batch;
	return ld_op(l, hpu_permute_forward(hpu_f32(&in[0]), hpu_f32(&out[0]), p->ndim, shape,
					    p->perm),
		     "permutation");
}

/* The gradient goes back through the inverse permutation. */
static int permute_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			    const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const permute *p = hpu_layer_user(l);
	int64_t shape[HPU_MAX_DIMS + 1];
	(void)c, (void)out;
	if (!din[0].data)
		return 0;
	memcpy(shape, p->yshape, sizeof shape);
	shape[0] = in[0].batch;
	return ld_op(l, hpu_permute_forward(hpu_f32(&dout[0]), hpu_f32(&din[0]), p->ndim, shape,
					    p->inv),
		     "permutation");
}

static const hpu_layer_ops permute_ops = {
	.forward = permute_forward,
	.backward = permute_backward,
	.destroy = free,
};

static hpu_layer *permute_impl(hpu_builder *b, const char *name, const char *in, const char *out,
		       int ndim, const int *perm)
{
	hpu_tensor x;
	if (ld_input(b, name, in, HPU_F32, &x) < 0)
		return NULL;
	int seen[HPU_MAX_DIMS] = {0}, ok = ndim == x.ndim && ndim >= 1 && perm;
	for (int i = 0; ok && i < ndim; i++) {
		ok = perm[i] >= 0 && perm[i] < ndim && !seen[perm[i]];
		if (ok)
			seen[perm[i]] = 1;
	}
	if (!ok) {
		hpu_error(b, "layer %s: the permutation must list each of input %s's %d "
			  "dimensions (0 .. %d) once; it has %d entries", ld_str(name), in,
			  x.ndim, x.ndim - 1, ndim);
		return NULL;
	}
	permute *p = malloc(sizeof *p);
	int64_t shape[HPU_MAX_DIMS];
	for (int i = 0; i < ndim; i++)
		shape[i] = x.shape[perm[i]];
	if (p) {
		memset(p, 0, sizeof *p);
		p->ndim = ndim + 1;
		for (int i = 0; i < ndim; i++) {
			p->perm[i + 1] = perm[i] + 1;
			p->inv[perm[i] + 1] = i + 1;
			p->xshape[i + 1] = x.shape[i];
			p->yshape[i + 1] = shape[i];
		}
	}
	return ld_reads(ld_declare(b, name, in, &permute_ops, p, out, HPU_F32, ndim, shape), 0, 0);
}

static hpu_layer *transpose_impl(hpu_builder *b, const char *name, const char *in, const char *out,
			 int dim0, int dim1)
{
	hpu_tensor x;
	int d0 = 0, d1 = 0, perm[HPU_MAX_DIMS];
	if (ld_input(b, name, in, HPU_F32, &x) < 0 || ld_dim(b, name, in, &x, dim0, &d0) < 0 ||
	    ld_dim(b, name, in, &x, dim1, &d1) < 0)
		return NULL;
	for (int i = 0; i < x.ndim; i++)
		perm[i] = i == d0 ? d1 : i == d1 ? d0 : i;
	return permute_impl(b, name, in, out, x.ndim, perm);
}

/* ---- ABI 3's options structs, and ABI 2's positional forms (deprecated) ---- */

hpu_layer *hpu_reduce_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_reduce_opts o)
{
	return reduce_impl(b, name, in, out, o.dim, o.op);
}

hpu_layer *(hpu_reduce)(hpu_builder *b, const char *name, const char *in, const char *out, int dim, hpu_reduce_op op)
{
	return reduce_impl(b, name, in, out, dim, op);
}

hpu_layer *hpu_reshape_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_reshape_opts o)
{
	return reshape_impl(b, name, in, out, o.ndim, o.shape);
}

hpu_layer *(hpu_reshape)(hpu_builder *b, const char *name, const char *in, const char *out, int ndim, const int64_t *shape)
{
	return reshape_impl(b, name, in, out, ndim, shape);
}

hpu_layer *hpu_slice_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_slice_opts o)
{
	return slice_impl(b, name, in, out, o.dim, o.start, o.len);
}

hpu_layer *(hpu_slice)(hpu_builder *b, const char *name, const char *in, const char *out, int dim, int64_t start, int64_t len)
{
	return slice_impl(b, name, in, out, dim, start, len);
}

hpu_layer *hpu_concat_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_concat_opts o)
{
	return concat_impl(b, name, in, out, o.dim);
}

hpu_layer *(hpu_concat)(hpu_builder *b, const char *name, const char *in, const char *out, int dim)
{
	return concat_impl(b, name, in, out, dim);
}

hpu_layer *hpu_permute_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_permute_opts o)
{
	return permute_impl(b, name, in, out, o.ndim, o.perm);
}

hpu_layer *(hpu_permute)(hpu_builder *b, const char *name, const char *in, const char *out, int ndim, const int *perm)
{
	return permute_impl(b, name, in, out, ndim, perm);
}

hpu_layer *hpu_transpose_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_transpose_opts o)
{
	return transpose_impl(b, name, in, out, o.dim0, o.dim1);
}

hpu_layer *(hpu_transpose)(hpu_builder *b, const char *name, const char *in, const char *out, int dim0, int dim1)
{
	return transpose_impl(b, name, in, out, dim0, dim1);
}
