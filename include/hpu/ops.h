/* hpu ops: the kernels a model author builds layers from.
 *
 * All tensors are dense, row-major fp32. Shapes are given in the comment
 * above each function as [rows, cols]. Backward functions ACCUMULATE into
 * parameter gradients (dw, db: +=) and OVERWRITE input gradients (dx), so a
 * runtime can zero parameter gradients once per step.
 */
#ifndef HPU_OPS_H
#define HPU_OPS_H

#include <hpu/export.h>
#include <hpu/hpu.h> /* hpu_err */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y[B,out] = x[B,in] * w[out,in]^T + b[out]   (b may be NULL) */
HPU_API void hpu_linear_forward(const float *x, const float *w, const float *b,
			float *y, int batch, int in, int out);

/* dw[out,in] += dy[B,out]^T * x[B,in]; db[out] += sum_B dy (db may be NULL);
 * dx[B,in] = dy[B,out] * w[out,in] (dx may be NULL: not needed for the
 * first layer). */
HPU_API void hpu_linear_backward(const float *x, const float *w, const float *dy,
			 float *dx, float *dw, float *db, int batch, int in,
			 int out);

/* y[n] = max(x, 0), as x > 0 ? x : 0: a NaN gives 0 (torch.relu keeps
 * it), on every device; y may alias x. */
HPU_API void hpu_relu_forward(const float *x, float *y, size_t n);

/* dx[n] = dy * (y > 0), where y is the forward output; dx may alias dy. */
HPU_API void hpu_relu_backward(const float *y, const float *dy, float *dx, size_t n);

/* The kernel of the layer hpu_cross_entropy: mean softmax cross-entropy
 * of logits[B,C] against labels[B] (0..C-1). If dlogits is not NULL,
 * writes d(mean loss)/d(logits) into it [B,C]. Returns the mean loss, or
 * a negative value if a label is out of range. */
HPU_API float hpu_cross_entropy_forward(const float *logits, const int32_t *labels,
					float *dlogits, int batch, int classes);

/* The kernel of the layer hpu_accuracy: the number of rows of logits[B,C]
 * whose arg-max equals the label. */
HPU_API int hpu_accuracy_forward(const float *logits, const int32_t *labels, int batch,
				 int classes);

/* The kernels of the layers hpu_cross_entropy and hpu_accuracy over
 * `positions` labels a sample (labels[rows * positions], -100 ignored as
 * torch's ignore_index; logits [rows * positions, classes]): loss[r] and
 * acc[r] are row r's means over its counted positions (0 where none),
 * lse[rows * positions] each position's log-sum-exp, which the backward
 * reads; the backward writes dx = dloss[r] / n * (softmax - onehot), 0
 * at ignored positions. HPU_OK; HPU_ERANGE with *bad the index of the
 * first label outside [0, classes) and not -100, *bad_label its value;
 * HPU_ERROR where the device's kernel table has no such kernel. */
HPU_API int hpu_cross_entropy_positions_forward(const float *logits, const int32_t *labels,
						float *lse, float *loss, int rows,
						size_t positions, int classes, long *bad,
						int32_t *bad_label);
HPU_API int hpu_cross_entropy_positions_backward(const float *logits, const int32_t *labels,
						 const float *lse, const float *dloss, float *dx,
						 int rows, size_t positions, int classes);
HPU_API int hpu_accuracy_positions_forward(const float *logits, const int32_t *labels,
					   float *acc, int rows, size_t positions, int classes,
					   long *bad, int32_t *bad_label);

/* The layers' copies and sums of whole tensors, on the device's kernels:
 * dst = src (bytes; no overlap); y[n] = a + b (y neither a nor b).
 * HPU_OK, or HPU_ERROR where the device's kernel table has no such
 * kernel. */
HPU_API int hpu_copy(void *dst, const void *src, size_t bytes);
HPU_API int hpu_add_forward(const float *a, const float *b, float *y, size_t n);
/* The layer hpu_dropout's kernel: over rows of n values, y[r, i] = 0
 * where u < cut, else x[r, i] * scale, u the top 32 bits of
 * mix64(keys[r] + (i + 1) * 0x9e3779b97f4a7c15) (hpu_rand_key's row
 * keys, in host memory: u is hpu_rand_u32(c, r, i)). HPU_OK, or
 * HPU_ERROR where the device's kernel table has no such kernel. */
HPU_API int hpu_dropout_rows(const float *x, float *y, const uint64_t *keys, int rows, size_t n,
			     uint32_t cut, float scale);
/* hpu_dropout_rows with the keys of the run context c: row r's key is
 * hpu_rand_key(c, r), so u is hpu_rand_u32(c, r, i). Where the run's
 * steps may be recorded (--graphs) the keys are made on the device, from
 * the step and the rows' dataset indices there, so that a replayed step
 * draws its own mask; elsewhere on the host. The same keys either way.
 * HPU_OK, or HPU_ERROR where the device's kernel table has no such kernel
 * (or the host no memory for the keys). */
HPU_API int hpu_dropout_ctx(const hpu_ctx *c, const float *x, float *y, int rows, size_t n,
			    uint32_t cut, float scale);

/* The attention layer's passes (the layer hpu_attention): split:
 * dst[b, h, i, :] = src[b, i, h*hd ..] * mul, src's rows ld apart, dst
 * head-major [batch, heads, t, hd]; merge: the inverse. mask_scores over
 * att[batch, heads, t, t] with an optional key mask[batch, t] (1 a real
 * token): before the softmax (after 0) -inf where a query may not attend
 * (causal: keys after it; masked keys), rows with none 0; after: exact
 * zeros there. HPU_OK, or HPU_ERROR where the device's kernel table has
 * no such kernel. */
HPU_API int hpu_split_heads(const float *src, size_t ld, float *dst, int batch, int heads,
			    int t, int hd, float mul);
HPU_API int hpu_merge_heads(const float *src, float *dst, size_t ld, int batch, int heads,
			    int t, int hd, float mul);
HPU_API int hpu_mask_scores(float *att, const int32_t *mask, int batch, int heads, int t,
			    int causal, int after);

/* The kernels of the layer hpu_batchnorm over x[batch, ch, spatial]:
 * train: the batch's mean and biased variance per channel (double,
 * two-pass), saved[ch] the means and saved[ch + c] the rstd (saved may
 * be NULL), running statistics updated as torch's where `update`; else
 * the running statistics. backward: dw, dbias += their gradients, dx
 * (may be NULL) written. HPU_OK, or HPU_ERROR where the device's kernel
 * table has no such kernel. */
HPU_API int hpu_batchnorm_forward(const float *x, float *y, const float *w, const float *bias,
				  float *run_mean, float *run_var, float *saved, int batch, int ch,
				  size_t spatial, float eps, float momentum, int train,
				  int update);
HPU_API int hpu_batchnorm_backward(const float *x, const float *dy, const float *w,
				   const float *saved, float *dw, float *dbias, float *dx,
				   int batch, int ch, size_t spatial);

/* ABI 2's names of the two above, deprecated (gone in the next version). */
HPU_API float hpu_softmax_xent(const float *logits, const int32_t *labels,
		       float *dlogits, int batch, int classes)
	__attribute__((deprecated("use hpu_cross_entropy_forward (the kernel of the layer hpu_cross_entropy)")));
HPU_API int hpu_count_correct(const float *logits, const int32_t *labels, int batch,
		      int classes)
	__attribute__((deprecated("use hpu_accuracy_forward (the kernel of the layer hpu_accuracy)")));


/* ---- matrix products (oneDNN on CPUs; OpenBLAS sgemm where oneDNN
 * refuses a case) ---- */

/* c[M,N] = a[M,K] * b[K,N] (+ c when accumulate). trans_a / trans_b:
 * a is stored [K,M] / b is stored [N,K]. */
HPU_API void hpu_matmul(const float *a, const float *b, float *c, int m, int n, int k,
		int trans_a, int trans_b, int accumulate);

/* The same for `count` independent products, each matrix `stride_*`
 * floats after the previous one. */
HPU_API void hpu_bmm(const float *a, const float *b, float *c, int count, int m, int n,
	     int k, int trans_a, int trans_b, int accumulate, size_t stride_a,
	     size_t stride_b, size_t stride_c);

/* ---- convolution and pooling (NCHW) ---- */

typedef struct hpu_conv2d_shape {
	int batch, in_ch, height, width; /* input x[B, C, H, W] */
	int out_ch, kernel, stride, pad; /* square kernel */
} hpu_conv2d_shape;

/* Output height/width: (H + 2*pad - kernel) / stride + 1. */
HPU_API int hpu_conv2d_out_h(const hpu_conv2d_shape *s);
HPU_API int hpu_conv2d_out_w(const hpu_conv2d_shape *s);

/* Floats of scratch the conv2d functions need (im2col of one sample). */
HPU_API size_t hpu_conv2d_scratch(const hpu_conv2d_shape *s);

/* y[B, O, OH, OW] = conv(x, w[O, C, K, K]) + b[O] (b may be NULL). */
HPU_API void hpu_conv2d_forward(const hpu_conv2d_shape *s, const float *x, const float *w,
			const float *b, float *y, float *scratch);

/* dw += ..., db += ... (db may be NULL); dx = ... (dx may be NULL). */
HPU_API void hpu_conv2d_backward(const hpu_conv2d_shape *s, const float *x, const float *w,
			 const float *dy, float *dx, float *dw, float *db,
			 float *scratch);

/* Max / average pooling of x[B, C, H, W] with a square window `k` and
 * stride `stride` (no padding): y[B, C, OH, OW], OH = (H - k) / stride + 1.
 * Max pooling records the arg-max of each output in idx (for backward). */
HPU_API void hpu_maxpool2d_forward(const float *x, float *y, int32_t *idx, int batch,
			   int ch, int h, int w, int k, int stride);
HPU_API void hpu_maxpool2d_backward(const float *dy, const int32_t *idx, float *dx,
			    int batch, int ch, int h, int w, int k, int stride);
HPU_API void hpu_avgpool2d_forward(const float *x, float *y, int batch, int ch, int h,
			   int w, int k, int stride);
HPU_API void hpu_avgpool2d_backward(const float *dy, float *dx, int batch, int ch, int h,
			    int w, int k, int stride);

/* ---- elementwise and normalization ---- */

/* GELU, tanh approximation (as torch's approximate="tanh"). */
HPU_API void hpu_gelu_forward(const float *x, float *y, size_t n);
/* dx = dy * gelu'(x); needs the forward input. dx may alias dy. */
HPU_API void hpu_gelu_backward(const float *x, const float *dy, float *dx, size_t n);

HPU_API void hpu_tanh_forward(const float *x, float *y, size_t n);
/* dx = dy * (1 - y^2), y the forward output; dx may alias dy. */
HPU_API void hpu_tanh_backward(const float *y, const float *dy, float *dx, size_t n);

/* Row-wise softmax of x[rows, cols]; y may alias x. */
HPU_API void hpu_softmax_forward(const float *x, float *y, int rows, int cols);
/* dx = y * (dy - sum(dy * y)) per row; dx may alias dy. */
HPU_API void hpu_softmax_backward(const float *y, const float *dy, float *dx, int rows,
			  int cols);

/* Layer norm over the last dimension of x[rows, cols] with gamma, beta
 * [cols], eps: y = (x - mean) / sqrt(var + eps) * gamma + beta. Saves
 * mean[rows] and rstd[rows] for backward. */
HPU_API void hpu_layernorm_forward(const float *x, const float *gamma, const float *beta,
			   float *y, float *mean, float *rstd, int rows, int cols,
			   float eps);
/* dgamma += ..., dbeta += ...; dx = ... */
HPU_API void hpu_layernorm_backward(const float *x, const float *gamma, const float *mean,
			    const float *rstd, const float *dy, float *dx,
			    float *dgamma, float *dbeta, int rows, int cols);

/* Embedding: y[n, dim] = table[ids[i]] (ids checked: returns HPU_ERANGE
 * when one is out of range, HPU_OK otherwise). Backward: dtable[ids[i]]
 * += dy[i]. */
HPU_API int hpu_embedding_forward(const float *table, const int32_t *ids, float *y,
			  int n, int vocab, int dim);
HPU_API void hpu_embedding_backward(const int32_t *ids, const float *dy, float *dtable,
			    int n, int dim);

/* Dropout with probability p, reproducible: the mask of element i is a
 * pure function of (seed, stream, i) -- the same on every rank and after a
 * restart, whatever the thread or the order. y = x * mask / (1 - p); mask
 * is written (0 or 1 per element) for backward. */
HPU_API void hpu_dropout_forward(const float *x, float *y, uint8_t *mask, size_t n,
			 float p, uint64_t seed, uint64_t stream);
HPU_API void hpu_dropout_backward(const float *dy, const uint8_t *mask, float *dx,
			  size_t n, float p);

/* ---- attention ----
 *
 * These ops, and those of the shape and sequence layers below (reduce,
 * row copies, permute, sigmoid, 1-D pooling, rectangular convolution),
 * return HPU_OK, or HPU_ERROR where the device's kernel table has no
 * such kernel. */

/* Causal multi-head self-attention over qkv[B, T, 3*D] (q, k, v of each
 * position side by side, D = heads * head_dim): out[B, T, D]. att[B, heads,
 * T, T] keeps the softmax probabilities for backward (row t attends to
 * 0..t). */
HPU_API int hpu_attention_forward(const float *qkv, float *out, float *att, int batch,
			  int t, int heads, int head_dim);
/* dqkv[B, T, 3*D] = the gradient w.r.t. qkv (overwritten). */
HPU_API int hpu_attention_backward(const float *qkv, const float *att, const float *dout,
			   float *dqkv, int batch, int t, int heads, int head_dim);

/* Fused (flash-style) multi-head self-attention over qkv[B, T, 3*D], as
 * the layer hpu_attention computes it unfused: causal or not, an optional
 * key mask[B, T] (NULL, or 1 a real token, 0 padding: hpu_mask_scores'
 * rule, and a query with no key to attend to gets zeros), scale
 * 1/sqrt(head_dim), fp32 sums. The forward writes ctx[B, T, D] (the heads
 * side by side, before the output projection) and lse[B, heads, T] (each
 * query's log-sum-exp of its scaled scores, 0 where it has no key), and
 * keeps no probabilities; the backward recomputes them from qkv and lse
 * and overwrites dqkv[B, T, 3*D] from dctx. On the CPU's kernel tables
 * they run the host's loops (one row at a time), which return HPU_ENOMEM
 * where the host has no memory for their buffers (the backward's
 * batch * heads * T floats); on a device whose table lacks them they
 * return HPU_ERROR. */
HPU_API int hpu_attention_fused_forward(const float *qkv, const int32_t *mask, float *ctx,
					float *lse, int batch, int t, int heads, int head_dim,
					int causal);
HPU_API int hpu_attention_fused_backward(const float *qkv, const int32_t *mask, const float *ctx,
					 const float *lse, const float *dctx, float *dqkv,
					 int batch, int t, int heads, int head_dim, int causal);
/* 1 when the layer hpu_attention should run the fused ops (the
 * environment's HPU_FUSED_ATTENTION=1, and the device's kernel table has
 * them or is the CPU's), else 0. Asked when a layer is declared: it then
 * keeps lse[B, heads, T] instead of the probabilities [B, heads, T, T]. */
HPU_API int hpu_attention_fused(void);

/* ---- autocast ----
 *
 * Every op above has a name: linear, matmul, bmm, conv2d, maxpool2d,
 * avgpool2d, relu, gelu, tanh, softmax, softmax_xent, layernorm,
 * embedding, dropout, attention. While a low-precision type is in force
 * (the runtime sets bf16 for --precision bf16-mixed, fp16 for 16-mixed),
 * the ops in the lower list emulate it: their inputs (activations,
 * weights, incoming gradients) are rounded to the type (round to nearest
 * even), the fp32 kernel runs (fp32 accumulation, as 16-bit GEMMs
 * accumulate on real hardware), and the outputs it overwrites (y, dx, a
 * product) are rounded again. Outputs it accumulates into (dw, db,
 * dgamma, dbeta, dtable, c under `accumulate`) get the rounded
 * contribution added in fp32. Saved statistics (layernorm's mean and
 * rstd, attention's probabilities) stay fp32. Ops in the fp32 list, and
 * every op while no low type is in force, run unchanged. */

/* 1 when calls of the named op run in low precision now, else 0. (The
 * policy is set by the runtime from --precision and the list files; its
 * controls are internal: worker/ops/autocast.h.) */
HPU_API int hpu_autocast_lowered(const char *op);

/* ---- shapes, reductions, sequences (ops_shape.c, ops_conv_rect.c) ----
 *
 * Plain C kernels, fp32 (autocast does not lower them). A dimension is
 * addressed as the middle axis of x[outer, n, inner]: outer is the
 * product of the dimensions before it (the batch included), inner of
 * those after it. */

typedef enum hpu_reduce_op {
	HPU_REDUCE_SUM = 0,
	HPU_REDUCE_MEAN = 1,
	HPU_REDUCE_MAX = 2,
} hpu_reduce_op;

/* y[outer, inner] = sum / mean / max of x[outer, n, inner] over n
 * (n >= 1). For max, idx[outer, inner] gets the position (0..n-1) of
 * the first maximum (idx may be NULL for sum and mean). */
HPU_API int hpu_reduce_forward(hpu_reduce_op op, const float *x, float *y, int32_t *idx,
			       size_t outer, size_t n, size_t inner);
/* dx[outer, n, inner] = dy broadcast over n (sum), divided by n (mean),
 * or at idx only and 0 elsewhere (max); overwritten. */
HPU_API int hpu_reduce_backward(hpu_reduce_op op, const float *dy, const int32_t *idx,
				float *dx, size_t outer, size_t n, size_t inner);

/* Copies len rows along the middle axis: y[o, y0 + i, :] = x[o, x0 + i, :]
 * for i < len, x[outer, nx, inner] and y[outer, ny, inner]; the other
 * rows of y are left as they are. Slicing (y0 = 0, ny = len) and
 * concatenation (one call per input, y0 its offset) in both directions. */
HPU_API int hpu_copy_rows(const float *x, float *y, size_t outer, size_t nx, size_t x0,
			  size_t ny, size_t y0, size_t len, size_t inner);

/* y = x with its dimensions permuted: x has `ndim` (<= 8) dimensions of
 * `shape`, and y's dimension i is x's dimension perm[i] (torch.permute).
 * Its backward is itself with the inverse permutation. */
HPU_API int hpu_permute_forward(const float *x, float *y, int ndim, const int64_t *shape,
				const int *perm);

/* y[n] = 1 / (1 + exp(-x)); y may alias x. */
HPU_API int hpu_sigmoid_forward(const float *x, float *y, size_t n);
/* dx = dy * y * (1 - y), y the forward output; dx may alias dy. */
HPU_API int hpu_sigmoid_backward(const float *y, const float *dy, float *dx, size_t n);

/* Pooling along the middle axis of x[outer, n, inner] with a window of
 * k and a stride (no padding): y[outer, (n - k) / stride + 1, inner].
 * Max pooling records each output's arg-max (0..n-1, the first maximum)
 * in idx for backward; dx is overwritten. */
HPU_API int hpu_maxpool1d_forward(const float *x, float *y, int32_t *idx, size_t outer,
				  int n, size_t inner, int k, int stride);
HPU_API int hpu_maxpool1d_backward(const float *dy, const int32_t *idx, float *dx,
				   size_t outer, int n, size_t inner, int k, int stride);
HPU_API int hpu_avgpool1d_forward(const float *x, float *y, size_t outer, int n,
				  size_t inner, int k, int stride);
HPU_API int hpu_avgpool1d_backward(const float *dy, float *dx, size_t outer, int n,
				   size_t inner, int k, int stride);

/* dst[bytes] = 0 (the layers' zeroing of a whole tensor). */
HPU_API int hpu_zero(void *dst, size_t bytes);

/* The losses' kernels over `rows` samples of n values, pred (or logits,
 * or probabilities) p and target t [rows, n]: loss[r] each row's mean
 * over its values, sums in double.
 * mse: (p - t)^2; backward dp = dloss[r] * 2 (p - t) / n, dt = -dp.
 * bce, logits 1: torch's BCEWithLogitsLoss per element; backward dp =
 * dloss[r] / n (sigmoid(p) - t), dt = -dloss[r] / n p.
 * bce, logits 0: torch's BCELoss of probabilities (logs clamped at
 * -100); HPU_ERANGE with *bad = r * n + i of the first probability
 * outside [0, 1] (loss then unspecified) and *bad_value it; backward dp =
 * dloss[r] / n (p - t) / max(p (1 - p), 1e-12), dt = -dloss[r] / n (log
 * p - log(1 - p)), the logs clamped.
 * dp and dt may be NULL (not wanted). */
HPU_API int hpu_mse_forward(const float *p, const float *t, float *loss, int rows, size_t n);
HPU_API int hpu_mse_backward(const float *p, const float *t, const float *dloss, float *dp,
			     float *dt, int rows, size_t n);
HPU_API int hpu_bce_forward(int logits, const float *p, const float *t, float *loss, int rows,
			    size_t n, long *bad, float *bad_value);
HPU_API int hpu_bce_backward(int logits, const float *p, const float *t, const float *dloss,
			     float *dp, float *dt, int rows, size_t n);

/* HPU_OK when every ids[i] lies in [0, limit); else HPU_ERANGE with
 * *bad the index of the first that does not and *bad_value its value
 * (the attention layer's key mask: limit 2). */
HPU_API int hpu_ids_first_bad(const int32_t *ids, size_t n, int32_t limit, long *bad,
			      int32_t *bad_value);

/* Convolution with a rectangular kernel, its own stride and zero padding
 * per axis (hpu_conv2d_shape's square case is kernel_h == kernel_w, ...);
 * a 1-D convolution over x[B, C, T] is height 1, kernel_h 1, stride_h 1,
 * pad_h 0 (torch.nn.Conv1d). */
typedef struct hpu_conv2d_rect_shape {
	int batch, in_ch, height, width; /* input x[B, C, H, W] */
	int out_ch;
	int kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
} hpu_conv2d_rect_shape;

/* (H + 2*pad_h - kernel_h) / stride_h + 1, and the same along W. */
HPU_API int hpu_conv2d_rect_out_h(const hpu_conv2d_rect_shape *s);
HPU_API int hpu_conv2d_rect_out_w(const hpu_conv2d_rect_shape *s);
/* Floats of scratch (im2col of one sample). */
HPU_API size_t hpu_conv2d_rect_scratch(const hpu_conv2d_rect_shape *s);
/* y[B, O, OH, OW] = conv(x, w[O, C, KH, KW]) + b[O] (b may be NULL). */
HPU_API int hpu_conv2d_rect_forward(const hpu_conv2d_rect_shape *s, const float *x,
				    const float *w, const float *b, float *y, float *scratch);
/* dw += ..., db += ... (db may be NULL); dx = ... (dx may be NULL). */
HPU_API int hpu_conv2d_rect_backward(const hpu_conv2d_rect_shape *s, const float *x,
				     const float *w, const float *dy, float *dx, float *dw,
				     float *db, float *scratch);

#ifdef __cplusplus
}
#endif
#endif
