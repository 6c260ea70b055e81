/* ops_ref: the reference kernels, plain C loops and OpenBLAS sgemm, fp32.
 *
 * They are what the ops computed before the backend (backend.h) took the
 * arithmetic over: the tests compare every backend kernel against them,
 * and the ops fall back to them when the backend answers
 * HPU_BE_UNSUPPORTED. Shapes and accumulation rules are those of
 * include/hpu/ops.h. Each lives in the file of its op (ops.c, ops_nn.c,
 * ops_conv.c).
 */
#ifndef HPU_OPS_REF_H
#define HPU_OPS_REF_H

#include <stddef.h>
#include <stdint.h>

#include "hpu/ops.h"

/* ops.c */
void hpu__ref_linear_forward(const float *x, const float *w, const float *b, float *y,
			     int batch, int in, int out);
void hpu__ref_linear_backward(const float *x, const float *w, const float *dy, float *dx,
			      float *dw, float *db, int batch, int in, int out);
void hpu__ref_relu_forward(const float *x, float *y, size_t n);
void hpu__ref_relu_backward(const float *y, const float *dy, float *dx, size_t n);

/* ops_nn.c */
void hpu__ref_matmul(const float *a, const float *b, float *c, int m, int n, int k,
		     int trans_a, int trans_b, int accumulate);
void hpu__ref_gelu_forward(const float *x, float *y, size_t n);
void hpu__ref_gelu_backward(const float *x, const float *dy, float *dx, size_t n);
void hpu__ref_tanh_forward(const float *x, float *y, size_t n);
void hpu__ref_tanh_backward(const float *y, const float *dy, float *dx, size_t n);
void hpu__ref_softmax_forward(const float *x, float *y, int rows, int cols);
void hpu__ref_softmax_backward(const float *y, const float *dy, float *dx, int rows,
			       int cols);
void hpu__ref_layernorm_forward(const float *x, const float *gamma, const float *beta,
				float *y, float *mean, float *rstd, int rows, int cols,
				float eps);
void hpu__ref_layernorm_backward(const float *x, const float *gamma, const float *mean,
				 const float *rstd, const float *dy, float *dx,
				 float *dgamma, float *dbeta, int rows, int cols);

/* ops_conv.c (scratch: hpu_conv2d_scratch floats, for im2col) */
void hpu__ref_conv2d_forward(const hpu_conv2d_shape *s, const float *x, const float *w,
			     const float *b, float *y, float *scratch);
void hpu__ref_conv2d_backward(const hpu_conv2d_shape *s, const float *x, const float *w,
			      const float *dy, float *dx, float *dw, float *db,
			      float *scratch);
void hpu__ref_maxpool2d_forward(const float *x, float *y, int32_t *idx, int batch,
				int ch, int h, int w, int k, int stride);
void hpu__ref_maxpool2d_backward(const float *dy, const int32_t *idx, float *dx,
				 int batch, int ch, int h, int w, int k, int stride);
void hpu__ref_avgpool2d_forward(const float *x, float *y, int batch, int ch, int h,
				int w, int k, int stride);
void hpu__ref_avgpool2d_backward(const float *dy, float *dx, int batch, int ch, int h,
				 int w, int k, int stride);

#endif
