/* hpu ops: linear, relu, softmax cross-entropy, accuracy.
 *
 * Row-major fp32 throughout; shapes as [rows, cols]. The products run on
 * the backend (backend.h: oneDNN), in bf16 with fp32 accumulation when
 * autocast lowers them and the CPU has bf16 instructions; the reference
 * kernels here (OpenBLAS sgemm) serve the tests and any case the backend
 * refuses.
 */
#include <assert.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cblas.h>

#include "worker/ops/autocast.h"
#include "worker/ops/backend.h"
#include "common/lowp.h"
#include "worker/ops/ops_ref.h"
#include "worker/ops/backend_host.h"
#include "worker/ops/checks.h"
#include "worker/ops/fp8.h"
#include "common/simd.h"

#include "hpu/ops.h"

void hpu__ref_linear_forward(const float *x, const float *w, const float *b,
			     float *y, int batch, int in, int out)
{
	assert(x != NULL && w != NULL && y != NULL);
	assert(batch >= 0 && in >= 0 && out >= 0);
	if (batch == 0 || out == 0)
		return;
	/* y[B,out] = b[out] broadcast over rows, then sgemm adds x * w^T. */
	float beta = 0.0f;
	if (b != NULL) {
		for (int i = 0; i < batch; i++) {
			float *yr = y + (size_t)i * out;
			for (int o = 0; o < out; o++)
				yr[o] = b[o];
		}
		beta = 1.0f;
	}
	if (in == 0) {
		if (b == NULL)
			for (size_t k = 0; k < (size_t)batch * out; k++)
				y[k] = 0.0f;
		return;
	}
	/* y[B,out] = x[B,in] * w[out,in]^T + beta * y */
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out, in,
		    1.0f, x, in, w, in, beta, y, out);
}

/* db[out] += sum over rows of dy[B,out] (the backend's kernel where it
 * has one: a GPU's) */
static void bias_grad(const float *dy, float *db, int batch, int out)
{
	const hpu__backend *be = hpu__be();
	if ((be->bias_grad && be->bias_grad(HPU_DT_F32, dy, db, batch, out) == HPU_BE_OK) ||
	    hpu__be_refused("hpu_linear_backward", "bias_grad fp32, %d x %d", batch, out))
		return;
	hpu__host_bias_grad(HPU_DT_F32, dy, db, batch, out);
}

/* The CPU's bias_grad (hpu__be_host). */
int hpu__host_bias_grad(hpu__dtype dt, const void *dyv, float *db, int batch, int out)
{
	if (dt == HPU_DT_BF16) {
		const uint16_t *dy = dyv;
		for (int i = 0; i < batch; i++) {
			const uint16_t *dyr = dy + (size_t)i * out;
			for (int o = 0; o < out; o++)
				db[o] += hpu_from_bf16(dyr[o]);
		}
		return HPU_BE_OK;
	}
	const float *dy = dyv;
	for (int i = 0; i < batch; i++) {
		const float *dyr = dy + (size_t)i * out;
		for (int o = 0; o < out; o++)
			db[o] += dyr[o];
	}
	return HPU_BE_OK;
}

void hpu__ref_linear_backward(const float *x, const float *w, const float *dy,
			      float *dx, float *dw, float *db, int batch, int in,
			      int out)
{
	assert(x != NULL && w != NULL && dy != NULL && dw != NULL);
	assert(batch >= 0 && in >= 0 && out >= 0);
	if (batch > 0 && out > 0 && in > 0) {
		/* dw[out,in] += dy[B,out]^T * x[B,in] */
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in,
			    batch, 1.0f, dy, out, x, in, 1.0f, dw, in);
	}
	if (db != NULL)
		bias_grad(dy, db, batch, out);
	if (dx == NULL || batch == 0 || in == 0)
		return;
	if (out == 0) {
		for (size_t k = 0; k < (size_t)batch * in; k++)
			dx[k] = 0.0f;
		return;
	}
	/* dx[B,in] = dy[B,out] * w[out,in] */
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, in, out,
		    1.0f, dy, out, w, in, 0.0f, dx, in);
}

HPU_CLONES void hpu__ref_relu_forward(const float *restrict x, float *restrict y, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

HPU_CLONES void hpu__ref_relu_backward(const float *restrict y, const float *restrict dy,
					float *restrict dx, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static float softmax_xent(const float *logits, const int32_t *labels,
			  float *dlogits, int batch, int classes)
{
	assert(logits != NULL && labels != NULL);
	if (batch <= 0 || classes <= 0)
		return -1.0f;
	/* Labels come from a data file: check them all before writing (or,
	 * deferred, with the kernel: checks.h). */
	const hpu__backend *be = hpu__be();
	hpu__check_slot *k = hpu__checks_take(HPU__CHECK_XENT, labels, classes, batch, 1);
	int ok = 1;
	if (k && HPU__BE_RUN(ids_first_bad, hpu__host_ids_first_bad, labels, (size_t)batch,
			     classes, &k->bad, &k->bad_id) != HPU_BE_OK)
		return -1.0f;
	if (!k && (!be->ids_in_range ||
		   be->ids_in_range(labels, batch, classes, &ok) != HPU_BE_OK)) {
		if (hpu__be_refused("hpu_cross_entropy_forward", "ids_in_range"))
			return 0.0f; /* (recording: refused, nothing ran) */
		hpu__host_ids_in_range(labels, batch, classes, &ok);
	}
	if (!ok)
		return -1.0f;
	float out = 0.0f;
	if ((!be->softmax_xent ||
	     be->softmax_xent(logits, labels, dlogits, batch, classes, &out) != HPU_BE_OK) &&
	    !hpu__be_refused("hpu_cross_entropy_forward", "softmax_xent, %d x %d", batch, classes))
		hpu__host_softmax_xent(logits, labels, dlogits, batch, classes, &out);
	return out;
}

/* The CPU's ids_in_range (hpu__be_host). */
int hpu__host_ids_in_range(const int32_t *ids, int n, int limit, int *ok)
{
	*ok = 1;
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= limit) {
			*ok = 0;
			break;
		}
	return HPU_BE_OK;
}

/* The CPU's softmax_xent (hpu__be_host). */
int hpu__host_softmax_xent(const float *logits, const int32_t *labels, float *dlogits,
			   int batch, int classes, float *out)
{
	double loss = 0.0;
	float inv_batch = 1.0f / (float)batch;
	for (int i = 0; i < batch; i++) {
		const float *z = logits + (size_t)i * classes;
		if (labels[i] < 0 || labels[i] >= classes) {
			/* its check deferred (checks.h): no loss, no gradient */
			if (dlogits)
				memset(dlogits + (size_t)i * classes, 0, (size_t)classes * sizeof *z);
			continue;
		}
		/* log-sum-exp with the row max subtracted, so exp() <= 1 */
		float zlab = z[labels[i]];
		float maxz = z[0];
		for (int c = 1; c < classes; c++)
			if (z[c] > maxz)
				maxz = z[c];
		/* keep exp(z - max) in dlogits when it is wanted */
		float *d = dlogits ? dlogits + (size_t)i * classes : NULL;
		double sum = 0.0;
		for (int c = 0; c < classes; c++) {
			float e = expf(z[c] - maxz);
			if (d != NULL)
				d[c] = e;
			sum += e;
		}
		/* -log softmax[label] = log(sum) - (z[label] - max) */
		loss += log(sum) - (double)(zlab - maxz);
		if (d == NULL)
			continue;
		/* dlogits = (softmax - onehot) / B */
		float scale = (float)(1.0 / (sum * batch));
		for (int c = 0; c < classes; c++)
			d[c] *= scale;
		d[labels[i]] -= inv_batch;
	}
	*out = (float)(loss / batch);
	return HPU_BE_OK;
}

int hpu_accuracy_forward(const float *logits, const int32_t *labels, int batch,
			 int classes)
{
	const hpu__backend *be = hpu__be();
	int correct = 0;
	if (batch > 0 && classes > 0 && be->count_correct &&
	    be->count_correct(logits, labels, batch, classes, &correct) == HPU_BE_OK)
		return correct;
	if (hpu__be_refused("hpu_accuracy_forward", "count_correct, %d x %d", batch, classes))
		return 0;
	hpu__host_count_correct(logits, labels, batch, classes, &correct);
	return correct;
}

/* The CPU's count_correct (hpu__be_host). */
int hpu__host_count_correct(const float *logits, const int32_t *labels, int batch,
			    int classes, int *out)
{
	int correct = 0;
	for (int i = 0; i < batch; i++) {
		const float *z = logits + (size_t)i * classes;
		int best = 0;
		for (int c = 1; c < classes; c++)
			if (z[c] > z[best]) /* strict: the first max wins */
				best = c;
		if (classes > 0 && best == labels[i])
			correct++;
	}
	*out = correct;
	return HPU_BE_OK;
}

/* ---- the public ops: the autocast policy around the kernels ---- */

/* ---- linear on the backend ----
 *
 * Each product runs in bf16 when a bf16 form of both operands is given
 * (and the backend multiplies bf16 natively), else in fp32 on the given
 * fp32 operands (already rounded when lowered); the reference kernel
 * serves when the backend refuses. */

/* y[B,out] = x w^T + b */
static void fwd_product(const float *x, const float *w, const uint16_t *x16,
			const uint16_t *w16, const float *b, float *y, int batch, int in,
			int out)
{
	hpu__gemm g = {.count = 1, .m = batch, .n = out, .k = in, .trans_b = 1,
		       .bias = b, .c = y};
	if (x16 && w16) {
		g.dt = HPU_DT_BF16;
		g.a = x16;
		g.b = w16;
		if (hpu__be()->gemm(&g) == HPU_BE_OK)
			return;
	}
	g.dt = HPU_DT_F32;
	g.a = x;
	g.b = hpu__ac_param_f32(w, (size_t)out * in);
	if (hpu__be()->gemm(&g) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_linear_forward", "gemm fp32, %dx%dx%d", batch, out, in))
		hpu__ref_linear_forward(x, w, b, y, batch, in, out);
}

/* dw[out,in] += dy^T x (dw_fresh: dw = dy^T x), the product gw on the
 * backend, else in fp32 (of the bf16 operands' values where gw was a bf16
 * product: so that a runtime keeping x only as its bf16 rounding,
 * hpu_layer_backward_reads_linear, gets the same sums), else the
 * reference */
static void dw_product(hpu__gemm *gw, const float *x, const float *w, const float *dy,
		       float *dw, int dw_fresh, int batch, int in, int out)
{
	const hpu__backend *be = hpu__be();
	gw->c = dw;
	gw->accumulate = !dw_fresh;
	if (be->gemm(gw) == HPU_BE_OK)
		return;
	if (gw->dt == HPU_DT_BF16) {
		x = hpu__ac_round(0, x, (size_t)batch * in, HPU_AUTOCAST_BF16);
		dy = hpu__ac_round(2, dy, (size_t)batch * out, HPU_AUTOCAST_BF16);
	}
	gw->dt = HPU_DT_F32; /* dw alone: w is not read */
	gw->a = dy;
	gw->b = x;
	if (be->gemm(gw) == HPU_BE_OK ||
	    hpu__be_refused("hpu_linear_backward", "gemm fp32 (dw), %dx%dx%d", out, in, batch))
		return;
	if (dw_fresh)
		memset(dw, 0, (size_t)out * in * sizeof *dw);
	hpu__ref_linear_backward(x, w, dy, NULL, dw, NULL, batch, in, out);
}

/* dw[out,in] += dy^T x (dw_fresh: dw is owed zeros, hpu__ac_fresh_claim:
 * dw = dy^T x; dw16 not NULL: the bf16 of dy^T x goes there instead,
 * hpu__ac_fresh_claim16); dx[B,in] = dy w (dx may be NULL) */
static void bwd_products(const float *x, const float *w, const float *dy,
			 const uint16_t *x16, const uint16_t *w16, const uint16_t *dy16,
			 float *dx, float *dw, uint16_t *dw16, int dw_fresh, int batch, int in,
			 int out)
{
	const hpu__backend *be = hpu__be();
	int bf = x16 && w16 && dy16;
	hpu__gemm gw = {.dt = bf ? HPU_DT_BF16 : HPU_DT_F32, .count = 1, .m = out, .n = in,
			.k = batch, .trans_a = 1, .a = bf ? (const void *)dy16 : dy,
			.b = bf ? (const void *)x16 : x, .c16 = bf ? dw16 : NULL};
	if (dw16 && !(gw.c16 && be->gemm(&gw) == HPU_BE_OK)) {
		/* the same sums in fp32, rounded after */
		size_t nw = (size_t)out * in;
		float *tmp = hpu__ac_scratch(3, nw);
		gw.c16 = NULL;
		dw_product(&gw, x, w, dy, tmp, 1, batch, in, out);
		if ((!be->to_bf16 || be->to_bf16(tmp, dw16, nw) != HPU_BE_OK) &&
		    !hpu__be_refused("hpu_linear_backward", "to_bf16 (dw), %zu values", nw))
			hpu__host_to_bf16(tmp, dw16, nw);
	} else if (!dw16) {
		dw_product(&gw, x, w, dy, dw, dw_fresh, batch, in, out);
	}
	if (dx == NULL)
		return;
	if (!bf)
		hpu__ac_param_f32(w, (size_t)out * in);
	hpu__gemm gx = {.dt = bf ? HPU_DT_BF16 : HPU_DT_F32, .count = 1, .m = batch, .n = in,
			.k = out, .a = bf ? (const void *)dy16 : dy,
			.b = bf ? (const void *)w16 : w, .c = dx};
	if (be->gemm(&gx) == HPU_BE_OK)
		return;
	gx.dt = HPU_DT_F32;
	gx.a = dy;
	gx.b = hpu__ac_param_f32(w, (size_t)out * in);
	if (be->gemm(&gx) == HPU_BE_OK ||
	    hpu__be_refused("hpu_linear_backward", "gemm fp32 (dx), %dx%dx%d", batch, in, out))
		return;
	/* the reference computes dw and dx together: dx alone from a zero dw */
	float *tmp = hpu__ac_scratch(3, (size_t)out * in);
	memset(tmp, 0, (size_t)out * in * sizeof *tmp);
	hpu__ref_linear_backward(x, w, dy, dx, tmp, NULL, batch, in, out);
}

/* db[out] += sum over rows of dy16[B,out] */
static void bias_grad16(const uint16_t *dy, float *db, int batch, int out)
{
	const hpu__backend *be = hpu__be();
	if ((be->bias_grad && be->bias_grad(HPU_DT_BF16, dy, db, batch, out) == HPU_BE_OK) ||
	    hpu__be_refused("hpu_linear_backward", "bias_grad bf16, %d x %d", batch, out))
		return;
	hpu__host_bias_grad(HPU_DT_BF16, dy, db, batch, out);
}

/* bf16 products run natively here */
static int bf16_ok(int lp)
{
	return (lp == HPU_AUTOCAST_BF16 || lp == HPU_AUTOCAST_FP8) && hpu__be()->bf16_native();
}

/* ---- the public ops: the autocast policy around the kernels ---- */

/* A weight w[nw] and bias b[nb] that lie in the runtime's 16-bit working
 * parameters get their fp32 values made (hpu__ac_param_f32) unless the
 * op reads the 16-bit copy itself: the weight of a bf16 product. */
static void params_f32(int lp, const float *w, size_t nw, const float *b, size_t nb)
{
	if (lp != HPU_AUTOCAST_BF16)
		hpu__ac_param_f32(w, nw);
	hpu__ac_param_f32(b, nb);
}

/* Lowered to bf16: x and w (the runtime's bf16 working copy when it has
 * one) multiplied in bf16 with fp32 accumulation, the bias rounded, y
 * rounded. fp16: the same values rounded to fp16, multiplied in fp32. fp8:
 * x and w in E4M3 (exact in bf16: the product runs on the bf16 kernel),
 * the bias and y in bf16. */
void hpu_linear_forward(const float *x, const float *w, const float *b,
			float *y, int batch, int in, int out)
{
	int lp = hpu__ac_enter(HPU_OP_LINEAR);
	size_t nx = (size_t)batch * in, ny = (size_t)batch * out, nw = (size_t)out * in;
	params_f32(lp, w, nw, b, out);
	hpu__fp8_call c;
	lp = hpu__fp8_begin(&c, HPU_OP_LINEAR, lp, x, nx, w, nw);
	if (batch <= 0 || out <= 0) {
		hpu__fp8_end(&c, y, 0);
		return;
	}
	if (c.on) { /* x and w in E4M3; the bias and y in bf16 */
		const float *bias = hpu__ac_round(2, b, (size_t)out, lp);
		if (!hpu__fp8_forward_native(&c, bias, y, batch, in, out)) {
			int bf = bf16_ok(lp);
			hpu__fp8_operands(&c);
			fwd_product(c.a, c.b, bf ? hpu__ac_bf16(0, c.a, nx) : NULL,
				    bf ? hpu__ac_bf16(1, c.b, nw) : NULL, bias, y, batch, in, out);
		}
		hpu__ac_round_inplace(y, ny, lp);
		return;
	}
	if (!lp) {
		fwd_product(x, w, NULL, NULL, b, y, batch, in, out);
	} else if (bf16_ok(lp)) {
		fwd_product(x, w, hpu__ac_bf16(0, x, nx), hpu__ac_weight_bf16(1, w, nw),
			    hpu__ac_round(2, b, (size_t)out, lp), y, batch, in, out);
		hpu__ac_round_inplace(y, ny, lp);
	} else {
		fwd_product(hpu__ac_round(0, x, nx, lp), hpu__ac_weight_round(1, w, nw, lp), NULL,
			    NULL, hpu__ac_round(2, b, (size_t)out, lp), y, batch, in, out);
		hpu__ac_round_inplace(y, ny, lp);
	}
	hpu__fp8_end(&c, y, ny);
}

/* Lowered: x, w and dy rounded (bf16: multiplied in bf16); dw and db get
 * the products accumulated in fp32 (the runtime rounds gradients when the
 * layer's backward ends); dx rounded. fp8: x and w in E4M3 at the
 * forward's scales, dy in E5M2, on the bf16 kernel; db is the sum of the
 * unquantized dy (as Transformer Engine's bias gradient). */
void hpu_linear_backward(const float *x, const float *w, const float *dy,
			 float *dx, float *dw, float *db, int batch, int in,
			 int out)
{
	int lp = hpu__ac_enter(HPU_OP_LINEAR);
	assert(x != NULL && w != NULL && dy != NULL && dw != NULL);
	/* gradients owed zeros: dw is overwritten by its product (bf16: the
	 * product may write the runtime's 16-bit gradient itself), db zeroed */
	uint16_t *dw16 = NULL;
	if (lp == HPU_AUTOCAST_BF16 && batch > 0 && in > 0 && out > 0 && hpu__be()->gemm_c16 &&
	    bf16_ok(lp))
		dw16 = hpu__ac_fresh_claim16(dw, (size_t)out * in);
	int dw_fresh = dw16 || (in >= 0 && out >= 0 && hpu__ac_fresh_claim(dw, (size_t)out * in));
	if (out >= 0 && hpu__ac_fresh_claim(db, (size_t)out))
		hpu__ac_zero(db, (size_t)out * sizeof *db);
	if (batch <= 0 || in < 0 || out < 0) {
		if (dw_fresh)
			memset(dw, 0, (size_t)out * in * sizeof *dw);
		hpu__ref_linear_backward(x, w, dy, dx, dw, db, batch, in, out);
		return;
	}
	size_t nx = (size_t)batch * in, ny = (size_t)batch * out, nw = (size_t)out * in;
	params_f32(lp, w, nw, NULL, 0);
	if (!lp) {
		bwd_products(x, w, dy, NULL, NULL, NULL, dx, dw, NULL, dw_fresh, batch, in, out);
		if (db)
			bias_grad(dy, db, batch, out);
		return;
	}
	if (lp == HPU_AUTOCAST_FP8) {
		hpu__fp8_bwd h;
		if (hpu__fp8_bwd_begin(&h, w, dy, ny)) {
			/* on fp8 arithmetic where the table has it, else (what it
			 * declined) on the bf16 kernels */
			int done = hpu__fp8_bwd_native(&h, x, w, dy, dx, dw, dw_fresh, batch, in, out);
			if (done < 2) {
				const float *xq, *wq, *dyq;
				int bf = bf16_ok(lp);
				hpu__fp8_bwd_operands(&h, x, nx, w, nw, dy, ny, &xq, &wq, &dyq);
				bwd_products(xq, wq, dyq, bf ? hpu__ac_bf16(0, xq, nx) : NULL,
					     bf ? hpu__ac_bf16(1, wq, nw) : NULL,
					     bf ? hpu__ac_bf16(2, dyq, ny) : NULL, done ? NULL : dx, dw,
					     NULL, dw_fresh, batch, in, out);
			}
			if (db)
				bias_grad(dy, db, batch, out);
			if (dx != NULL)
				hpu__ac_round_inplace(dx, nx, lp);
			return;
		}
		lp = hpu__ac_fallback(HPU_OP_LINEAR);
		if (!lp) {
			bwd_products(x, w, dy, NULL, NULL, NULL, dx, dw, NULL, dw_fresh, batch, in, out);
			if (db)
				bias_grad(dy, db, batch, out);
			return;
		}
	}
	if (bf16_ok(lp)) {
		const uint16_t *dy16 = hpu__ac_bf16(2, dy, ny);
		bwd_products(x, w, dy, hpu__ac_bf16(0, x, nx), hpu__ac_weight_bf16(1, w, nw),
			     dy16, dx, dw, dw16, dw_fresh, batch, in, out);
		if (db)
			bias_grad16(dy16, db, batch, out);
	} else {
		const float *dyr = hpu__ac_round(2, dy, ny, lp);
		bwd_products(hpu__ac_round(0, x, nx, lp), hpu__ac_weight_round(1, w, nw, lp), dyr,
			     NULL, NULL, NULL, dx, dw, NULL, dw_fresh, batch, in, out);
		if (db)
			bias_grad(dyr, db, batch, out);
	}
	if (dx != NULL)
		hpu__ac_round_inplace(dx, nx, lp);
}

/* relu on the backend, or the reference when it answers
 * HPU_BE_UNSUPPORTED */
static void relu_fwd(const float *x, float *y, size_t n)
{
	if (hpu__be()->eltwise_fwd(HPU_ELT_RELU, x, y, n) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_relu_forward", "eltwise_fwd ReLU, %zu values", n))
		hpu__ref_relu_forward(x, y, n);
}

static void relu_bwd(const float *y, const float *dy, float *dx, size_t n)
{
	if (hpu__be()->eltwise_bwd(HPU_ELT_RELU, y, dy, dx, n) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_relu_backward", "eltwise_bwd ReLU, %zu values", n))
		hpu__ref_relu_backward(y, dy, dx, n);
}

void hpu_relu_forward(const float *x, float *y, size_t n)
{
	int lp = hpu__ac_enter(HPU_OP_RELU);
	/* relu of a rounded value is that value or 0: no output rounding */
	relu_fwd(lp ? hpu__ac_round(0, x, n, lp) : x, y, n);
}

void hpu_relu_backward(const float *y, const float *dy, float *dx, size_t n)
{
	int lp = hpu__ac_enter(HPU_OP_RELU);
	if (!lp) {
		relu_bwd(y, dy, dx, n);
		return;
	}
	relu_bwd(hpu__ac_round(0, y, n, lp), hpu__ac_round(1, dy, n, lp), dx, n);
}

/* Lowered: the logits rounded; the loss is an fp32 reduction; dlogits
 * rounded. */
float hpu_cross_entropy_forward(const float *logits, const int32_t *labels,
				float *dlogits, int batch, int classes)
{
	int lp = hpu__ac_enter(HPU_OP_SOFTMAX_XENT);
	if (!lp || batch <= 0 || classes <= 0)
		return softmax_xent(logits, labels, dlogits, batch, classes);
	size_t n = (size_t)batch * classes;
	float loss = softmax_xent(hpu__ac_round(0, logits, n, lp), labels, dlogits,
				  batch, classes);
	if (dlogits != NULL && loss >= 0.0f)
		hpu__ac_round_inplace(dlogits, n, lp);
	return loss;
}

/* ABI 2's names (ops.h: deprecated). */
float hpu_softmax_xent(const float *logits, const int32_t *labels, float *dlogits, int batch,
		       int classes)
{
	return hpu_cross_entropy_forward(logits, labels, dlogits, batch, classes);
}

int hpu_count_correct(const float *logits, const int32_t *labels, int batch, int classes)
{
	return hpu_accuracy_forward(logits, labels, batch, classes);
}
