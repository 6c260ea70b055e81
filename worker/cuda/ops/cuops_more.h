/* cuops_more: the CUDA kernels of the shape, sequence and loss layers'
 * entries of the kernel table (cuops_more.cu), each behind a C launcher
 * that queues it on `st` and returns the launch's error (cudaSuccess
 * when queued), and the table functions over them (cuops_more.c), which
 * cuops.c puts in the table. Shapes and semantics are those of the
 * hpu__backend entries (worker/ops/backend.h) of the same names; every
 * pointer is device memory unless its entry says host. */
#ifndef HPU_CUOPS_MORE_H
#define HPU_CUOPS_MORE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* hpu_reduce_op's values */
enum { HPU_CUKM_REDUCE_SUM = 0, HPU_CUKM_REDUCE_MEAN = 1, HPU_CUKM_REDUCE_MAX = 2 };

cudaError_t hpu__cukm_reduce_fwd(int op, const float *x, float *y, int32_t *idx, size_t outer,
				 size_t n, size_t inner, cudaStream_t st);
cudaError_t hpu__cukm_reduce_bwd(int op, const float *dy, const int32_t *idx, float *dx,
				 size_t outer, size_t n, size_t inner, cudaStream_t st);

/* y's shape and, per y dimension, x's stride along it (elements). */
#define HPU_CUKM_PERM_MAX 8
typedef struct hpu__cukm_perm {
	int ndim;
	size_t yshape[HPU_CUKM_PERM_MAX], ystep[HPU_CUKM_PERM_MAX];
} hpu__cukm_perm;
cudaError_t hpu__cukm_permute(const float *x, float *y, const hpu__cukm_perm *p,
			      cudaStream_t st);

/* bwd 0: out = sigmoid(a); bwd 1: out = dy * a * (1 - a), a the output. */
cudaError_t hpu__cukm_sigmoid(int bwd, const float *a, const float *dy, float *out, size_t n,
			      cudaStream_t st);

/* Forward: in x, out y, idx_out (max); backward: in dy, idx_in (max),
 * out dx (overwritten). */
cudaError_t hpu__cukm_pool1d(int bwd, int max, const float *in, float *out,
			     const int32_t *idx_in, int32_t *idx_out, size_t outer, int n,
			     size_t inner, int k, int stride, cudaStream_t st);

/* One sample of the rectangular convolution: x[c, h, w], kernel kh x kw,
 * stride sh, sw, padding ph, pw, output oh x ow. */
typedef struct hpu__cukm_rect {
	int c, h, w, kh, kw, sh, sw, ph, pw, oh, ow;
} hpu__cukm_rect;
/* col[c*kh*kw, oh*ow] = unfold(x); dx[c, h, w] = fold(col) (overwritten). */
cudaError_t hpu__cukm_im2col(const hpu__cukm_rect *s, const float *x, float *col,
			     cudaStream_t st);
cudaError_t hpu__cukm_col2im(const hpu__cukm_rect *s, const float *col, float *dx,
			     cudaStream_t st);
/* y[count, rows, npix] = b[row] (0 when b is NULL). */
cudaError_t hpu__cukm_rows_fill(float *y, const float *b, size_t count, size_t rows,
				size_t npix, cudaStream_t st);
/* db[row] += the sum of dy[n, row, :], sample after sample. */
cudaError_t hpu__cukm_rows_sum(const float *dy, float *db, int count, int rows, size_t npix,
			       cudaStream_t st);

/* kind: 0 mse, 1 bce with logits, 2 bce of probabilities. The forward
 * lowers *bad (device memory, set to ~0 by the caller) to the index of
 * the first probability outside [0, 1] (kind 2). */
cudaError_t hpu__cukm_loss_fwd(int kind, const float *x, const float *t, float *loss, int rows,
			       size_t n, unsigned long long *bad, cudaStream_t st);
cudaError_t hpu__cukm_loss_bwd(int kind, const float *x, const float *t, const float *dloss,
			       float *dx, float *dt, int rows, size_t n, cudaStream_t st);
/* *bad (device memory, ~0 first) = the first index of ids outside [0, limit). */
cudaError_t hpu__cukm_ids_first_bad(const int32_t *ids, size_t n, int32_t limit,
				    unsigned long long *bad, cudaStream_t st);

/* A check's finding on the device (an hpu__check_slot's fields,
 * worker/ops/checks.h): where *bad (the first bad index, ~0, i.e. -1 as
 * a long, when none) is >= 0, *out = vals[*bad]; else *out is left as
 * it is. One thread; no wait. */
cudaError_t hpu__cukm_finding_i32(const int32_t *vals, const long long *bad, int32_t *out,
				  cudaStream_t st);
cudaError_t hpu__cukm_finding_f32(const float *vals, const long long *bad, float *out,
				  cudaStream_t st);
/* *v = (*v == 0): a count of bad values into a verdict, on the device. */
cudaError_t hpu__cukm_none_of(int *v, cudaStream_t st);

/* Causal attention; the backward's ds is batch * heads * t * t floats of
 * scratch. cudaErrorInvalidConfiguration where t or batch * heads is
 * beyond the kernels' grid and shared memory. */
cudaError_t hpu__cukm_attention_fwd(const float *qkv, float *out, float *att, int batch, int t,
				    int heads, int hd, cudaStream_t st);
cudaError_t hpu__cukm_attention_bwd(const float *qkv, const float *att, const float *dout,
				    float *dqkv, float *ds, int batch, int t, int heads, int hd,
				    cudaStream_t st);

/* Fused attention (cuops_flash.cu, worker/ops/flash_rows.h): rows =
 * batch * heads * t (0 when any is not positive), the length of lse and
 * of the backward's delta scratch. */
size_t hpu__cukm_flash_rows(int batch, int t, int heads, int hd);
cudaError_t hpu__cukm_flash_fwd(const float *qkv, const int32_t *mask, float *ctx, float *lse,
				int batch, int t, int heads, int hd, int causal, cudaStream_t st);
cudaError_t hpu__cukm_flash_bwd(const float *qkv, const int32_t *mask, const float *ctx,
				const float *lse, const float *dctx, float *dqkv, float *delta,
				int batch, int t, int heads, int hd, int causal, cudaStream_t st);

/* The same on tensor cores (cuops_flash16.cu, worker/ops/flash_tiles.h):
 * qkv and dctx holding bf16 values, P and dS rounded to bf16 for their
 * products. cudaErrorNotSupported where hd is not one the tiles take
 * (hpu__cukm_flash16_ok) or this GPU's blocks cannot have the tiles'
 * shared memory. */
int hpu__cukm_flash16_ok(int hd);
cudaError_t hpu__cukm_flash16_fwd(const float *qkv, const int32_t *mask, float *ctx, float *lse,
				  int batch, int t, int heads, int hd, int causal, cudaStream_t st);
cudaError_t hpu__cukm_flash16_bwd(const float *qkv, const int32_t *mask, const float *ctx,
				  const float *lse, const float *dctx, float *dqkv, float *delta,
				  int batch, int t, int heads, int hd, int causal, cudaStream_t st);

#ifdef __cplusplus
}
#endif

/* ---- the table functions (cuops_more.c), for cuops.c's table ---- */
#ifndef __CUDACC__
#include "worker/ops/backend.h"

int hpu__cuops_reduce_fwd(int op, const float *x, float *y, int32_t *idx, size_t outer,
			  size_t n, size_t inner);
int hpu__cuops_reduce_bwd(int op, const float *dy, const int32_t *idx, float *dx, size_t outer,
			  size_t n, size_t inner);
int hpu__cuops_copy_rows(const float *x, float *y, size_t outer, size_t nx, size_t x0,
			 size_t ny, size_t y0, size_t len, size_t inner);
int hpu__cuops_zero(void *dst, size_t bytes);
int hpu__cuops_permute(const float *x, float *y, int ndim, const int64_t *shape,
		       const int *perm);
int hpu__cuops_sigmoid_fwd(const float *x, float *y, size_t n);
int hpu__cuops_sigmoid_bwd(const float *y, const float *dy, float *dx, size_t n);
int hpu__cuops_pool1d_fwd(int max, const float *x, float *y, int32_t *idx, size_t outer, int n,
			  size_t inner, int k, int stride);
int hpu__cuops_pool1d_bwd(int max, const float *dy, const int32_t *idx, float *dx,
			  size_t outer, int n, size_t inner, int k, int stride);
int hpu__cuops_conv_rect_fwd(const hpu_conv2d_rect_shape *s, const float *x, const float *w,
			     const float *b, float *y, float *scratch);
int hpu__cuops_conv_rect_bwd(const hpu_conv2d_rect_shape *s, const float *x, const float *w,
			     const float *dy, float *dx, float *dw, float *db, float *scratch);
int hpu__cuops_mse_fwd(const float *p, const float *t, float *loss, int rows, size_t n);
int hpu__cuops_mse_bwd(const float *p, const float *t, const float *dloss, float *dp, float *dt,
		       int rows, size_t n);
int hpu__cuops_bce_fwd(int logits, const float *x, const float *t, float *loss, int rows,
		       size_t n, long *bad, float *bad_value);
int hpu__cuops_bce_bwd(int logits, const float *x, const float *t, const float *dloss,
		       float *dx, float *dt, int rows, size_t n);
int hpu__cuops_ids_first_bad(const int32_t *ids, size_t n, int32_t limit, long *bad,
			     int32_t *bad_value);
int hpu__cuops_attention_fwd(const float *qkv, float *out, float *att, int batch, int t,
			     int heads, int hd);
int hpu__cuops_attention_bwd(const float *qkv, const float *att, const float *dout,
			     float *dqkv, int batch, int t, int heads, int hd);
int hpu__cuops_flash_fwd(const float *qkv, const int32_t *mask, float *ctx, float *lse,
			 int batch, int t, int heads, int hd, int causal);
int hpu__cuops_flash_bwd(const float *qkv, const int32_t *mask, const float *ctx,
			 const float *lse, const float *dctx, float *dqkv, int batch, int t,
			 int heads, int hd, int causal);
int hpu__cuops_flash16_fwd(const float *qkv, const int32_t *mask, float *ctx, float *lse,
			   int batch, int t, int heads, int hd, int causal);
int hpu__cuops_flash16_bwd(const float *qkv, const int32_t *mask, const float *ctx,
			   const float *lse, const float *dctx, float *dqkv, int batch, int t,
			   int heads, int hd, int causal);
#endif

#endif
