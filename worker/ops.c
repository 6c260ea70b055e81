/* hpu ops: linear (OpenBLAS sgemm), relu, softmax cross-entropy, accuracy.
 *
 * Row-major fp32 throughout; shapes as [rows, cols]. These run in the
 * training loop, so they are BLAS calls or single passes over memory.
 */
#include <assert.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <cblas.h>

#include "autocast.h"
#include "fp8.h"
#include "simd.h"

#include "hpu/ops.h"

static void linear_forward(const float *x, const float *w, const float *b,
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

/* db[out] += sum over rows of dy[B,out] */
static void bias_grad(const float *dy, float *db, int batch, int out)
{
	for (int i = 0; i < batch; i++) {
		const float *dyr = dy + (size_t)i * out;
		for (int o = 0; o < out; o++)
			db[o] += dyr[o];
	}
}

static void linear_backward(const float *x, const float *w, const float *dy,
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

HPU_CLONES static void relu_forward(const float *restrict x, float *restrict y, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

HPU_CLONES static void relu_backward(const float *restrict y, const float *restrict dy,
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
	/* Labels come from a data file: check them all before writing. */
	for (int i = 0; i < batch; i++)
		if (labels[i] < 0 || labels[i] >= classes)
			return -1.0f;

	double loss = 0.0;
	float inv_batch = 1.0f / (float)batch;
	for (int i = 0; i < batch; i++) {
		const float *z = logits + (size_t)i * classes;
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
	return (float)(loss / batch);
}

int hpu_count_correct(const float *logits, const int32_t *labels, int batch,
		      int classes)
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
	return correct;
}

/* ---- the public ops: the autocast policy around the kernels ---- */

void hpu_linear_forward(const float *x, const float *w, const float *b,
			float *y, int batch, int in, int out)
{
	int lp = hpu__ac_enter(HPU_OP_LINEAR);
	size_t nx = (size_t)batch * in, ny = (size_t)batch * out;
	hpu__fp8_call c;
	lp = hpu__fp8_begin(&c, HPU_OP_LINEAR, lp, x, nx, w, (size_t)out * in);
	if (c.on) { /* x and w in E4M3; the bias and y in bf16 */
		linear_forward(c.a, c.b, hpu__ac_round(2, b, (size_t)out, lp), y, batch,
			       in, out);
		hpu__ac_round_inplace(y, ny, lp);
		return;
	}
	if (!lp || batch <= 0 || out <= 0) {
		linear_forward(x, w, b, y, batch, in, out);
	} else {
		linear_forward(hpu__ac_round(0, x, nx, lp),
			       hpu__ac_round(1, w, (size_t)out * in, lp),
			       hpu__ac_round(2, b, (size_t)out, lp), y, batch, in, out);
		hpu__ac_round_inplace(y, ny, lp);
	}
	hpu__fp8_end(&c, y, ny);
}

/* Lowered: x, w and dy rounded; dw and db get the products accumulated in
 * fp32 (the runtime rounds gradients when the layer's backward ends); dx
 * rounded. fp8: x and w in E4M3 at the forward's scales, dy in E5M2; db is
 * the sum of the unquantized dy (as Transformer Engine's bias gradient). */
void hpu_linear_backward(const float *x, const float *w, const float *dy,
			 float *dx, float *dw, float *db, int batch, int in,
			 int out)
{
	int lp = hpu__ac_enter(HPU_OP_LINEAR);
	if (!lp || batch <= 0) {
		linear_backward(x, w, dy, dx, dw, db, batch, in, out);
		return;
	}
	size_t nx = (size_t)batch * in, ny = (size_t)batch * out;
	const float *xq, *wq, *dyq;
	if (lp == HPU_AUTOCAST_FP8) {
		if (hpu__fp8_linear_backward(x, nx, w, (size_t)out * in, dy, ny, &xq, &wq,
					     &dyq)) {
			linear_backward(xq, wq, dyq, dx, dw, NULL, batch, in, out);
			if (db)
				bias_grad(dy, db, batch, out);
			if (dx != NULL)
				hpu__ac_round_inplace(dx, nx, lp);
			return;
		}
		lp = hpu__ac_fallback(HPU_OP_LINEAR);
		if (!lp) {
			linear_backward(x, w, dy, dx, dw, db, batch, in, out);
			return;
		}
	}
	linear_backward(hpu__ac_round(0, x, nx, lp),
			hpu__ac_round(1, w, (size_t)out * in, lp),
			hpu__ac_round(2, dy, ny, lp), dx, dw, db, batch,
			in, out);
	if (dx != NULL)
		hpu__ac_round_inplace(dx, nx, lp);
}

void hpu_relu_forward(const float *x, float *y, size_t n)
{
	int lp = hpu__ac_enter(HPU_OP_RELU);
	/* relu of a rounded value is that value or 0: no output rounding */
	relu_forward(lp ? hpu__ac_round(0, x, n, lp) : x, y, n);
}

void hpu_relu_backward(const float *y, const float *dy, float *dx, size_t n)
{
	int lp = hpu__ac_enter(HPU_OP_RELU);
	if (!lp) {
		relu_backward(y, dy, dx, n);
		return;
	}
	relu_backward(hpu__ac_round(0, y, n, lp), hpu__ac_round(1, dy, n, lp), dx, n);
}

/* Lowered: the logits rounded; the loss is an fp32 reduction; dlogits
 * rounded. */
float hpu_softmax_xent(const float *logits, const int32_t *labels,
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
