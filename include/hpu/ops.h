/* hpu ops: the kernels a model author builds layers from.
 *
 * All tensors are dense, row-major fp32. Shapes are given in the comment
 * above each function as [rows, cols]. Backward functions ACCUMULATE into
 * parameter gradients (dw, db: +=) and OVERWRITE input gradients (dx), so a
 * runtime can zero parameter gradients once per step.
 */
#ifndef HPU_OPS_H
#define HPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y[B,out] = x[B,in] * w[out,in]^T + b[out]   (b may be NULL) */
void hpu_linear_forward(const float *x, const float *w, const float *b,
			float *y, int batch, int in, int out);

/* dw[out,in] += dy[B,out]^T * x[B,in]; db[out] += sum_B dy (db may be NULL);
 * dx[B,in] = dy[B,out] * w[out,in] (dx may be NULL: not needed for the
 * first layer). */
void hpu_linear_backward(const float *x, const float *w, const float *dy,
			 float *dx, float *dw, float *db, int batch, int in,
			 int out);

/* y[n] = max(x, 0); y may alias x. */
void hpu_relu_forward(const float *x, float *y, size_t n);

/* dx[n] = dy * (y > 0), where y is the forward output; dx may alias dy. */
void hpu_relu_backward(const float *y, const float *dy, float *dx, size_t n);

/* Mean softmax cross-entropy of logits[B,C] against labels[B] (0..C-1).
 * If dlogits is not NULL, writes d(mean loss)/d(logits) into it [B,C].
 * Returns the mean loss, or a negative value if a label is out of range. */
float hpu_softmax_xent(const float *logits, const int32_t *labels,
		       float *dlogits, int batch, int classes);

/* Number of rows of logits[B,C] whose arg-max equals the label. */
int hpu_count_correct(const float *logits, const int32_t *labels, int batch,
		      int classes);

#ifdef __cplusplus
}
#endif
#endif
