/* backend_dnnl_nn: eltwise (ReLU, GELU tanh, tanh), row softmax and layer
 * norm on oneDNN primitives, fp32.
 *
 * Keys (op numbers 10..19):
 *   10 eltwise forward, 11 eltwise backward   (1-D, n elements)
 *   12 softmax forward, 13 softmax backward   ([rows, cols], last axis)
 *   14 layer norm forward, 15 layer norm backward
 *
 * Layer norm: oneDNN saves the variance where our API saves rstd =
 * 1 / sqrt(var + eps). The forward writes the variance into rstd and
 * converts it in place; the backward has no eps, so it hands oneDNN
 * var' = 1 / rstd^2 with epsilon 0 (then oneDNN's 1 / sqrt(var' + 0) is
 * rstd again, to an ulp or two), in the entry's scratch. dgamma and dbeta
 * are computed into scratch and added to ours (ops.h: they accumulate).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "worker/ops/backend_dnnl.h"

/* ---- eltwise ---- */

typedef struct elt_key {
	int op; /* 10 forward, 11 backward */
	int alg; /* hpu__eltwise */
	int64_t n;
} elt_key;

/* The oneDNN algorithm of op: backward of ReLU and tanh from the
 * forward's output (the `at` we get), of GELU from its input. */
static dnnl_alg_kind_t elt_alg(int op)
{
	switch (op) {
	case HPU_ELT_RELU: return dnnl_eltwise_relu_use_dst_for_bwd;
	case HPU_ELT_GELU_TANH: return dnnl_eltwise_gelu_tanh;
	case HPU_ELT_TANH: return dnnl_eltwise_tanh_use_dst_for_bwd;
	default: return dnnl_alg_kind_undef;
	}
}

static int make_elt(hpu__dnnl_prim *p, const void *vkey, dnnl_engine_t eng)
{
	const elt_key *k = vkey;
	dnnl_alg_kind_t alg = elt_alg(k->alg);
	dnnl_dims_t d = {k->n};
	dnnl_memory_desc_t md;
	hpu__dnnl_md(&md, 1, d, dnnl_f32);
	dnnl_eltwise_desc_t fdesc;
	if (alg == dnnl_alg_kind_undef ||
	    dnnl_eltwise_forward_desc_init(&fdesc, dnnl_forward_training, alg, &md, 0.0f,
					   0.0f) != dnnl_success)
		return -1;
	if (k->op == 10) {
		dnnl_primitive_desc_t pd;
		if (hpu__dnnl_create(&p->prim, &pd, &fdesc, NULL, eng, NULL) < 0)
			return -1;
		dnnl_primitive_desc_destroy(pd);
		if (hpu__dnnl_arg(p, eng, DNNL_ARG_SRC, &md) < 0 ||
		    hpu__dnnl_arg(p, eng, DNNL_ARG_DST, &md) < 0)
			return -1;
		return 0;
	}
	/* backward: the forward's descriptor is the hint */
	dnnl_primitive_desc_t hint, pd;
	if (dnnl_primitive_desc_create(&hint, &fdesc, NULL, eng, NULL) != dnnl_success)
		return -1;
	dnnl_eltwise_desc_t bdesc;
	int rc = -1;
	if (dnnl_eltwise_backward_desc_init(&bdesc, alg, &md, &md, 0.0f, 0.0f) == dnnl_success)
		rc = hpu__dnnl_create(&p->prim, &pd, &bdesc, NULL, eng, hint);
	dnnl_primitive_desc_destroy(hint);
	if (rc < 0)
		return -1;
	dnnl_primitive_desc_destroy(pd);
	int at = k->alg == HPU_ELT_GELU_TANH ? DNNL_ARG_SRC : DNNL_ARG_DST;
	if (hpu__dnnl_arg(p, eng, at, &md) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_DIFF_DST, &md) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_DIFF_SRC, &md) < 0)
		return -1;
	return 0;
}

static hpu__dnnl_prim *elt_get(int op, hpu__eltwise alg, size_t n)
{
	if (n > (size_t)INT64_MAX)
		return NULL;
	elt_key k;
	memset(&k, 0, sizeof k);
	k.op = op;
	k.alg = (int)alg;
	k.n = (int64_t)n;
	return hpu__dnnl_get(&k, sizeof k, make_elt);
}

int hpu__dnnl_eltwise_fwd(hpu__eltwise op, const float *x, float *y, size_t n)
{
	if (n == 0)
		return HPU_BE_OK;
	hpu__dnnl_prim *p = elt_get(10, op, n);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	void *data[2] = {(void *)x, y};
	return hpu__dnnl_run(p, data);
}

int hpu__dnnl_eltwise_bwd(hpu__eltwise op, const float *at, const float *dy, float *dx,
			  size_t n)
{
	if (n == 0)
		return HPU_BE_OK;
	hpu__dnnl_prim *p = elt_get(11, op, n);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	void *data[3] = {(void *)at, (void *)dy, dx};
	return hpu__dnnl_run(p, data);
}

/* ---- softmax over the last axis ---- */

typedef struct rows_key {
	int op; /* 12, 13 */
	int rows, cols;
} rows_key;

static int make_softmax(hpu__dnnl_prim *p, const void *vkey, dnnl_engine_t eng)
{
	const rows_key *k = vkey;
	dnnl_dims_t d = {k->rows, k->cols};
	dnnl_memory_desc_t md;
	hpu__dnnl_md(&md, 2, d, dnnl_f32);
	dnnl_softmax_v2_desc_t fdesc;
	if (dnnl_softmax_v2_forward_desc_init(&fdesc, dnnl_forward_training,
					      dnnl_softmax_accurate, &md, &md,
					      1) != dnnl_success)
		return -1;
	dnnl_primitive_desc_t pd;
	if (k->op == 12) {
		if (hpu__dnnl_create(&p->prim, &pd, &fdesc, NULL, eng, NULL) < 0)
			return -1;
		dnnl_primitive_desc_destroy(pd);
		if (hpu__dnnl_arg(p, eng, DNNL_ARG_SRC, &md) < 0 ||
		    hpu__dnnl_arg(p, eng, DNNL_ARG_DST, &md) < 0)
			return -1;
		return 0;
	}
	dnnl_primitive_desc_t hint;
	if (dnnl_primitive_desc_create(&hint, &fdesc, NULL, eng, NULL) != dnnl_success)
		return -1;
	dnnl_softmax_v2_desc_t bdesc;
	int rc = -1;
	if (dnnl_softmax_v2_backward_desc_init(&bdesc, dnnl_softmax_accurate, &md, &md, &md,
					       1) == dnnl_success)
		rc = hpu__dnnl_create(&p->prim, &pd, &bdesc, NULL, eng, hint);
	dnnl_primitive_desc_destroy(hint);
	if (rc < 0)
		return -1;
	dnnl_primitive_desc_destroy(pd);
	if (hpu__dnnl_arg(p, eng, DNNL_ARG_DST, &md) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_DIFF_DST, &md) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_DIFF_SRC, &md) < 0)
		return -1;
	return 0;
}

static hpu__dnnl_prim *rows_get(int op, int rows, int cols, hpu__dnnl_make make)
{
	rows_key k;
	memset(&k, 0, sizeof k);
	k.op = op;
	k.rows = rows;
	k.cols = cols;
	return hpu__dnnl_get(&k, sizeof k, make);
}

int hpu__dnnl_softmax_fwd(const float *x, float *y, int rows, int cols)
{
	if (rows <= 0 || cols <= 0)
		return HPU_BE_OK;
	hpu__dnnl_prim *p = rows_get(12, rows, cols, make_softmax);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	void *data[2] = {(void *)x, y};
	return hpu__dnnl_run(p, data);
}

int hpu__dnnl_softmax_bwd(const float *y, const float *dy, float *dx, int rows, int cols)
{
	if (rows <= 0 || cols <= 0)
		return HPU_BE_OK;
	hpu__dnnl_prim *p = rows_get(13, rows, cols, make_softmax);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	void *data[3] = {(void *)y, (void *)dy, dx};
	return hpu__dnnl_run(p, data);
}

/* ---- layer norm ---- */

typedef struct ln_key {
	int op; /* 14, 15 */
	int rows, cols;
	float eps; /* forward; 0 in the backward's key (see the top) */
} ln_key;

/* Both directions take gamma and beta as they are (use_scale, use_shift;
 * 2.6's backward wants DNNL_ARG_SHIFT too, although it does not read it). */
static const unsigned ln_flags = dnnl_use_scale | dnnl_use_shift;

static int make_ln(hpu__dnnl_prim *p, const void *vkey, dnnl_engine_t eng)
{
	const ln_key *k = vkey;
	dnnl_dims_t d = {k->rows, k->cols}, ds = {k->rows}, dc = {k->cols};
	dnnl_memory_desc_t md, stat, wmd;
	hpu__dnnl_md(&md, 2, d, dnnl_f32);
	hpu__dnnl_md(&stat, 1, ds, dnnl_f32);
	hpu__dnnl_md(&wmd, 1, dc, dnnl_f32);
	dnnl_layer_normalization_desc_t fdesc;
	if (dnnl_layer_normalization_forward_desc_init(&fdesc, dnnl_forward_training, &md,
						       &stat, k->eps, ln_flags) != dnnl_success)
		return -1;
	dnnl_primitive_desc_t pd;
	if (k->op == 14) {
		if (hpu__dnnl_create(&p->prim, &pd, &fdesc, NULL, eng, NULL) < 0)
			return -1;
		dnnl_primitive_desc_destroy(pd);
		if (hpu__dnnl_arg(p, eng, DNNL_ARG_SRC, &md) < 0 ||
		    hpu__dnnl_arg(p, eng, DNNL_ARG_SCALE, &wmd) < 0 ||
		    hpu__dnnl_arg(p, eng, DNNL_ARG_SHIFT, &wmd) < 0 ||
		    hpu__dnnl_arg(p, eng, DNNL_ARG_DST, &md) < 0 ||
		    hpu__dnnl_arg(p, eng, DNNL_ARG_MEAN, &stat) < 0 ||
		    hpu__dnnl_arg(p, eng, DNNL_ARG_VARIANCE, &stat) < 0)
			return -1;
		return 0;
	}
	dnnl_primitive_desc_t hint;
	if (dnnl_primitive_desc_create(&hint, &fdesc, NULL, eng, NULL) != dnnl_success)
		return -1;
	dnnl_layer_normalization_desc_t bdesc;
	int rc = -1;
	if (dnnl_layer_normalization_backward_desc_init(&bdesc, dnnl_backward, &md, &md,
							&stat, k->eps, ln_flags) == dnnl_success)
		rc = hpu__dnnl_create(&p->prim, &pd, &bdesc, NULL, eng, hint);
	dnnl_primitive_desc_destroy(hint);
	if (rc < 0)
		return -1;
	dnnl_primitive_desc_destroy(pd);
	if (hpu__dnnl_arg(p, eng, DNNL_ARG_SRC, &md) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_MEAN, &stat) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_VARIANCE, &stat) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_DIFF_DST, &md) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_SCALE, &wmd) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_SHIFT, &wmd) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_DIFF_SRC, &md) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_DIFF_SCALE, &wmd) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_DIFF_SHIFT, &wmd) < 0)
		return -1;
	/* the variance, then dgamma and dbeta before they are added */
	p->scratch_bytes = ((size_t)k->rows + 2 * (size_t)k->cols) * sizeof(float);
	return 0;
}

int hpu__dnnl_layernorm_fwd(const float *x, const float *gamma, const float *beta,
			    float *y, float *mean, float *rstd, int rows, int cols,
			    float eps)
{
	if (rows <= 0)
		return HPU_BE_OK;
	if (cols <= 0 || !(eps >= 0.0f))
		return HPU_BE_UNSUPPORTED;
	ln_key k;
	memset(&k, 0, sizeof k);
	k.op = 14;
	k.rows = rows;
	k.cols = cols;
	k.eps = eps;
	hpu__dnnl_prim *p = hpu__dnnl_get(&k, sizeof k, make_ln);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	/* the variance lands in rstd, converted below */
	void *data[6] = {(void *)x, (void *)gamma, (void *)beta, y, mean, rstd};
	int rc = hpu__dnnl_run(p, data);
	if (rc != HPU_BE_OK)
		return rc;
	for (int r = 0; r < rows; r++)
		rstd[r] = 1.0f / sqrtf(rstd[r] + eps);
	return HPU_BE_OK;
}

int hpu__dnnl_layernorm_bwd(const float *x, const float *gamma, const float *mean,
			    const float *rstd, const float *dy, float *dx, float *dgamma,
			    float *dbeta, int rows, int cols)
{
	if (rows <= 0)
		return HPU_BE_OK;
	if (cols <= 0)
		return HPU_BE_UNSUPPORTED;
	ln_key k;
	memset(&k, 0, sizeof k);
	k.op = 15;
	k.rows = rows;
	k.cols = cols;
	k.eps = 0.0f;
	hpu__dnnl_prim *p = hpu__dnnl_get(&k, sizeof k, make_ln);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	float *var = p->scratch, *dg = var + rows, *db = dg + cols;
	for (int r = 0; r < rows; r++) /* in double: no overflow for a large rstd */
		var[r] = (float)(1.0 / ((double)rstd[r] * rstd[r]));
	/* the shift is not read: gamma stands in for it */
	void *data[9] = {(void *)x,	    (void *)mean, var, (void *)dy, (void *)gamma,
			 (void *)gamma, dx,	      dg,  db};
	int rc = hpu__dnnl_run(p, data);
	if (rc != HPU_BE_OK)
		return rc;
	for (int c = 0; c < cols; c++) {
		dgamma[c] += dg[c];
		dbeta[c] += db[c];
	}
	return HPU_BE_OK;
}
