/* hpu layers: ready-made layers for <hpu/hpu.h>'s graph.
 *
 * Each function declares one layer named `name` that reads the tensor(s)
 * named in `in` (comma-separated where it takes several) and writes a new
 * tensor named `out`, whose shape follows from the input's. Shapes below
 * are per sample (the batch dimension is implicit); "[..., n]" means any
 * leading dimensions. Parameters are named "<name>.weight", "<name>.bias"
 * and so on, initialized as the matching torch.nn module initializes them
 * (fan-in from the weight's own shape). Each returns the layer (for
 * hpu_layer_checkpoint()), or NULL with the error recorded (hpu_error's
 * message names the layer and what was wrong). (hpu_cross_entropy is the
 * softmax cross-entropy layer; ops.h's hpu_softmax_xent is its kernel.)
 *
 * The kernels are those of <hpu/ops.h>, so autocast and fp8 apply per op.
 */
#ifndef HPU_LAYERS_H
#define HPU_LAYERS_H

#include <hpu/export.h>
#include <hpu/hpu.h>
#include <hpu/ops.h> /* hpu_reduce_op */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dense ---- */

/* y[..., out_features] = x[..., in] W^T + b: W [out_features, in] and
 * b [out_features] (when `bias`), both U(+-1/sqrt(in)) (torch.nn.Linear).
 */
HPU_API hpu_layer *hpu_linear(hpu_builder *b, const char *name, const char *in,
			      const char *out, int64_t out_features, int bias);

/* The same with the weight of an earlier layer ("wte.weight", shape
 * [out_features, in]: an embedding table gives a tied LM head) and an
 * own bias when `bias`. */
HPU_API hpu_layer *hpu_linear_tied(hpu_builder *b, const char *name, const char *in,
				   const char *out, const char *weight, int bias);

/* ---- convolution and pooling (per sample [C, H, W]) ---- */

/* Square kernel, stride, zero padding: y [out_ch, OH, OW]; weight
 * [out_ch, C, k, k] and bias [out_ch] U(+-1/sqrt(C*k*k)) (torch.nn.Conv2d).
 */
HPU_API hpu_layer *hpu_conv2d(hpu_builder *b, const char *name, const char *in,
			      const char *out, int out_ch, int kernel, int stride,
			      int pad, int bias);

/* Square window, no padding: [C, (H-k)/s+1, (W-k)/s+1]. */
HPU_API hpu_layer *hpu_maxpool2d(hpu_builder *b, const char *name, const char *in,
				 const char *out, int kernel, int stride);
HPU_API hpu_layer *hpu_avgpool2d(hpu_builder *b, const char *name, const char *in,
				 const char *out, int kernel, int stride);

/* [d0, d1, ...] -> [d0 * d1 * ...] (a copy forward, and back in backward). */
HPU_API hpu_layer *hpu_flatten(hpu_builder *b, const char *name, const char *in,
			       const char *out);

/* ---- elementwise ---- */

HPU_API hpu_layer *hpu_relu(hpu_builder *b, const char *name, const char *in,
			    const char *out);
/* GELU, tanh approximation (torch's approximate="tanh"). */
HPU_API hpu_layer *hpu_gelu(hpu_builder *b, const char *name, const char *in,
			    const char *out);
HPU_API hpu_layer *hpu_tanh(hpu_builder *b, const char *name, const char *in,
			    const char *out);

/* Training: each element zeroed with probability p, the others scaled by
 * 1/(1-p), the mask from hpu_rand (the same under recompute and after a
 * restart, at any world size); evaluation: the identity. */
HPU_API hpu_layer *hpu_dropout(hpu_builder *b, const char *name, const char *in,
			       const char *out, float p);

/* Residual: out = a + b, in = "a,b" (same shapes). */
HPU_API hpu_layer *hpu_add(hpu_builder *b, const char *name, const char *in,
			   const char *out);

/* Softmax over the last dimension. */
HPU_API hpu_layer *hpu_softmax(hpu_builder *b, const char *name, const char *in,
			       const char *out);

/* ---- normalization ---- */

/* Over the last dimension n: weight ones [n], bias zeros [n]
 * (torch.nn.LayerNorm). */
HPU_API hpu_layer *hpu_layernorm(hpu_builder *b, const char *name, const char *in,
				 const char *out, float eps);

/* Per channel of [C, ...] (BatchNorm1d on [C], BatchNorm2d on [C, H,
 * W]): training normalizes with the micro-batch's statistics (biased
 * variance) and updates the buffers running_mean (zeros) and running_var
 * (ones) with `momentum` (unbiased variance, as torch); evaluation uses
 * the buffers. weight ones [C], bias zeros [C]. The buffers are kept per
 * `sync` across ranks (HPU_BUFFER_MEAN averages them after every step).
 */
HPU_API hpu_layer *hpu_batchnorm(hpu_builder *b, const char *name, const char *in,
				 const char *out, float eps, float momentum,
				 hpu_buffer_sync sync);

/* ---- sequences ---- */

/* ids i32 [...] -> [..., dim]; weight [vocab, dim] N(0, 1)
 * (torch.nn.Embedding; hpu_param_init(b, "<name>.weight", ...) sets
 * another initializer, e.g. GPT-2's N(0, 0.02)). An id outside [0, vocab) fails the call naming
 * the id. */
HPU_API hpu_layer *hpu_embedding(hpu_builder *b, const char *name, const char *in,
				 const char *out, int64_t vocab, int64_t dim);

/* Multi-head self-attention over x [T, D] (torch.nn.MultiheadAttention
 * with batch_first, q = k = v = x): qkv = x Wqkv^T + bqkv, Wqkv [3D, D]
 * laid out as q, then k, then v rows (each D rows, head h at rows
 * h*D/heads ..); per head softmax(q k^T / sqrt(D/heads) + mask) v; out =
 * that (heads side by side) Wo^T + bo, Wo [D, D]. Weights as torch:
 * Wqkv xavier-uniform, bqkv zeros, Wo U(+-1/sqrt(D)), bo zeros.
 * `in` is "x" or "x,mask" with mask i32 [T]: 1 for a real token, 0 for
 * padding (keys at padding are not attended to; a query row whose keys
 * are all masked attends to nothing: its output is bo, and it passes no
 * gradient back). `causal`: position t attends to 0..t. Parameters
 * follow torch's names: in_proj_weight, in_proj_bias, out_proj.weight,
 * out_proj.bias. */
HPU_API hpu_layer *hpu_attention(hpu_builder *b, const char *name, const char *in,
				 const char *out, int heads, int causal);

/* ---- losses and metrics (per-sample f32 outputs, ndim 0) ---- */

/* in = "logits,labels": logits [..., C] f32, labels i32 [...]; per sample
 * the mean over its positions of -log softmax(logits)[label] (positions
 * labelled -100 are left out, as torch's ignore_index). A label outside
 * [0, C) and not -100 fails the call naming it. */
HPU_API hpu_layer *hpu_cross_entropy(hpu_builder *b, const char *name, const char *in,
				     const char *out);

/* in = "pred,target", same shape, f32: per sample the mean of (pred -
 * target)^2 (torch.nn.MSELoss's mean over a batch is the mean of these). */
HPU_API hpu_layer *hpu_mse(hpu_builder *b, const char *name, const char *in,
			   const char *out);

/* in = "logits,labels" as hpu_cross_entropy: per sample the fraction of its
 * positions whose arg-max is the label (a metric; no backward). */
HPU_API hpu_layer *hpu_accuracy(hpu_builder *b, const char *name, const char *in,
				const char *out);

/* ---- shapes and reductions (f32) ----
 *
 * `dim` counts the per-sample dimensions: 0 is the first after the
 * batch (torch's dim 1), and a negative dim counts from the last (-1).
 * The runtime gives every tensor its own memory, so reshape, slice,
 * concat and permute copy forward and back. hpu_reduce_op is ops.h's
 * (HPU_REDUCE_SUM, HPU_REDUCE_MEAN, HPU_REDUCE_MAX). */

/* [..., n, ...] -> [..., ...]: the sum, mean or max over dimension `dim`
 * (torch.sum / mean / amax(dim) without keepdim; max's gradient goes to
 * the first maximum, as torch.max(dim)'s). A 1-D input gives ndim 0. */
HPU_API hpu_layer *hpu_reduce(hpu_builder *b, const char *name, const char *in,
			      const char *out, int dim, hpu_reduce_op op);

/* The same values in `shape` [ndim] (at most one -1: the size that keeps
 * the count; torch.reshape). */
HPU_API hpu_layer *hpu_reshape(hpu_builder *b, const char *name, const char *in,
			       const char *out, int ndim, const int64_t *shape);

/* Positions [start, start + len) of dimension `dim` (torch.narrow). */
HPU_API hpu_layer *hpu_slice(hpu_builder *b, const char *name, const char *in,
			     const char *out, int dim, int64_t start, int64_t len);

/* in = "a,b,..." (2 to 8 inputs, equal shapes but along `dim`): joined
 * along `dim` in that order (torch.cat). */
HPU_API hpu_layer *hpu_concat(hpu_builder *b, const char *name, const char *in,
			      const char *out, int dim);

/* Output dimension i is the input's dimension perm[i]; ndim must be the
 * input's (torch.permute of the per-sample dimensions). */
HPU_API hpu_layer *hpu_permute(hpu_builder *b, const char *name, const char *in,
			       const char *out, int ndim, const int *perm);

/* Dimensions dim0 and dim1 swapped (torch.transpose). */
HPU_API hpu_layer *hpu_transpose(hpu_builder *b, const char *name, const char *in,
				 const char *out, int dim0, int dim1);

/* ---- sequences and rectangular kernels (f32) ---- */

/* Over x [C, T]: y [out_ch, (T + 2 pad - kernel) / stride + 1]; weight
 * [out_ch, C, kernel] and bias [out_ch] U(+-1/sqrt(C*kernel))
 * (torch.nn.Conv1d). */
HPU_API hpu_layer *hpu_conv1d(hpu_builder *b, const char *name, const char *in,
			      const char *out, int out_ch, int kernel, int stride, int pad,
			      int bias);

/* hpu_conv2d with kernel {kh, kw}, stride {sh, sw} and zero padding {ph,
 * pw} per axis: weight [out_ch, C, kh, kw], bias [out_ch]
 * U(+-1/sqrt(C*kh*kw)) (torch.nn.Conv2d with tuples). */
HPU_API hpu_layer *hpu_conv2d_rect(hpu_builder *b, const char *name, const char *in,
				   const char *out, int out_ch, const int kernel[2],
				   const int stride[2], const int pad[2], int bias);

/* Max / average pooling along dimension `dim` only, window `kernel`,
 * `stride`, no padding: that dimension becomes (n - kernel) / stride + 1
 * (torch.nn.MaxPool1d / AvgPool1d when dim is the last of [C, T]). */
HPU_API hpu_layer *hpu_maxpool1d(hpu_builder *b, const char *name, const char *in,
				 const char *out, int dim, int kernel, int stride);
HPU_API hpu_layer *hpu_avgpool1d(hpu_builder *b, const char *name, const char *in,
				 const char *out, int dim, int kernel, int stride);

/* Elementwise 1 / (1 + exp(-x)) (torch.sigmoid). */
HPU_API hpu_layer *hpu_sigmoid(hpu_builder *b, const char *name, const char *in,
			       const char *out);

/* in = "logits,target", same shape, f32, targets in [0, 1]: per sample
 * the mean of max(x, 0) - x t + log(1 + exp(-|x|)), the binary
 * cross-entropy of sigmoid(x) computed stably
 * (torch.nn.BCEWithLogitsLoss). */
HPU_API hpu_layer *hpu_bce_with_logits(hpu_builder *b, const char *name, const char *in,
				       const char *out);

/* in = "prob,target", same shape, f32, probabilities in [0, 1]: per
 * sample the mean of -(t log p + (1 - t) log(1 - p)), each log clamped
 * at -100 as torch.nn.BCELoss does. A probability outside [0, 1] fails
 * the call naming it. */
HPU_API hpu_layer *hpu_binary_cross_entropy(hpu_builder *b, const char *name,
					    const char *in, const char *out);

#ifdef __cplusplus
}
#endif
#endif
