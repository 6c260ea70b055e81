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
 * message names the layer and what was wrong); once a declaration has
 * failed each does nothing and returns NULL (sticky errors, <hpu/hpu.h>),
 * so a setup needs no check after each, only hpu_builder_status() at its
 * end.
 *
 * The kernels are those of <hpu/ops.h>, so autocast and fp8 apply per op.
 */
#ifndef HPU_LAYERS_H
#define HPU_LAYERS_H

#include <hpu/export.h>
#include <hpu/hpu.h>
#include <hpu/ops.h> /* hpu_reduce_op */

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the options of the layers ----
 *
 * A layer with settings takes them as one struct, written with designated
 * initializers; a field left out is 0, false or NULL, which takes the
 * default the comment names (torch's):
 *
 *     hpu_linear(b, "fc1", "x", "h", (hpu_linear_opts){.out = 1024, .bias = true});
 *
 * Sizes are int64_t; dimensions (`dim`, 0 the first per-sample one,
 * negative from the last) and their counts are int.
 *
 * ABI 2's positional forms (hpu_linear(b, "fc1", "x", "h", 1024, 1)) are
 * kept one version: a call whose options are not the layer's struct goes
 * to the old function, which the compiler warns about ("ABI 2's form,
 * deprecated: use ..."). In C++ the macros are not defined: call
 * hpu_<layer>_v3 with the struct. */

typedef struct hpu_linear_opts {
	int64_t out; /* out_features */
	bool bias;
} hpu_linear_opts;

typedef struct hpu_linear_tied_opts {
	const char *weight; /* an earlier layer's parameter, "wte.weight" */
	bool bias;
} hpu_linear_tied_opts;

typedef struct hpu_conv1d_opts {
	int64_t out;    /* output channels */
	int64_t kernel;
	int64_t stride; /* 0: 1 */
	int64_t pad;    /* zeros on each side */
	bool bias;
} hpu_conv1d_opts;

typedef struct hpu_conv2d_opts {
	int64_t out;    /* output channels */
	int64_t kernel; /* square: kernel x kernel */
	int64_t stride; /* 0: 1 */
	int64_t pad;    /* zeros on each side */
	bool bias;
} hpu_conv2d_opts;

typedef struct hpu_conv2d_rect_opts {
	int64_t out;
	int64_t kernel[2]; /* {kh, kw} */
	int64_t stride[2]; /* {sh, sw}; 0: 1 */
	int64_t pad[2];    /* {ph, pw} */
	bool bias;
} hpu_conv2d_rect_opts;

typedef struct hpu_pool2d_opts {
	int64_t kernel; /* square window */
	int64_t stride; /* 0: kernel */
} hpu_pool2d_opts;

typedef struct hpu_pool1d_opts {
	int dim;        /* the dimension pooled along */
	int64_t kernel;
	int64_t stride; /* 0: kernel */
} hpu_pool1d_opts;

typedef struct hpu_dropout_opts {
	float p; /* the probability of zeroing an element */
} hpu_dropout_opts;

typedef struct hpu_layernorm_opts {
	float eps; /* 0: 1e-5 */
} hpu_layernorm_opts;

typedef struct hpu_batchnorm_opts {
	float eps;            /* 0: 1e-5 */
	float momentum;       /* 0: 0.1 */
	hpu_buffer_sync sync; /* 0: HPU_BUFFER_BROADCAST */
} hpu_batchnorm_opts;

typedef struct hpu_embedding_opts {
	int64_t vocab, dim;
} hpu_embedding_opts;

typedef struct hpu_attention_opts {
	int64_t heads;
	bool causal;
} hpu_attention_opts;

typedef struct hpu_reduce_opts {
	int dim;
	hpu_reduce_op op; /* 0: HPU_REDUCE_SUM */
} hpu_reduce_opts;

typedef struct hpu_reshape_opts {
	int ndim;
	int64_t shape[HPU_MAX_DIMS];
} hpu_reshape_opts;

typedef struct hpu_slice_opts {
	int dim;
	int64_t start, len;
} hpu_slice_opts;

typedef struct hpu_concat_opts {
	int dim;
} hpu_concat_opts;

typedef struct hpu_permute_opts {
	int ndim;
	int perm[HPU_MAX_DIMS];
} hpu_permute_opts;

typedef struct hpu_transpose_opts {
	int dim0, dim1;
} hpu_transpose_opts;

/* ---- dense ---- */

/* y[..., out] = x[..., in] W^T + b: W [out, in] and b [out] (when
 * .bias), both U(+-1/sqrt(in)) (torch.nn.Linear). */
HPU_API hpu_layer *hpu_linear_v3(hpu_builder *b, const char *name, const char *in,
				 const char *out, hpu_linear_opts o);

/* The same with the weight of an earlier layer (.weight, shape [out,
 * in]: an embedding table gives a tied LM head) and an own bias when
 * .bias. */
HPU_API hpu_layer *hpu_linear_tied_v3(hpu_builder *b, const char *name, const char *in,
				      const char *out, hpu_linear_tied_opts o);

/* ---- convolution and pooling (per sample [C, H, W]) ---- */

/* Square kernel, stride, zero padding: y [.out, OH, OW]; weight [.out, C,
 * k, k] and bias [.out] U(+-1/sqrt(C*k*k)) (torch.nn.Conv2d). */
HPU_API hpu_layer *hpu_conv2d_v3(hpu_builder *b, const char *name, const char *in,
				 const char *out, hpu_conv2d_opts o);

/* Square window, no padding: [C, (H-k)/s+1, (W-k)/s+1]. */
HPU_API hpu_layer *hpu_maxpool2d_v3(hpu_builder *b, const char *name, const char *in,
				    const char *out, hpu_pool2d_opts o);
HPU_API hpu_layer *hpu_avgpool2d_v3(hpu_builder *b, const char *name, const char *in,
				    const char *out, hpu_pool2d_opts o);

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

/* Training: each element zeroed with probability .p, the others scaled by
 * 1/(1-p), the mask from hpu_rand (the same under recompute and after a
 * restart, at any world size); evaluation: the identity. */
HPU_API hpu_layer *hpu_dropout_v3(hpu_builder *b, const char *name, const char *in,
				  const char *out, hpu_dropout_opts o);

/* Residual: out = a + b, in = "a,b" (same shapes). */
HPU_API hpu_layer *hpu_add(hpu_builder *b, const char *name, const char *in,
			   const char *out);

/* Softmax over the last dimension. */
HPU_API hpu_layer *hpu_softmax(hpu_builder *b, const char *name, const char *in,
			       const char *out);

/* Elementwise 1 / (1 + exp(-x)) (torch.sigmoid). */
HPU_API hpu_layer *hpu_sigmoid(hpu_builder *b, const char *name, const char *in,
			       const char *out);

/* ---- normalization ---- */

/* Over the last dimension n: weight ones [n], bias zeros [n]
 * (torch.nn.LayerNorm). */
HPU_API hpu_layer *hpu_layernorm_v3(hpu_builder *b, const char *name, const char *in,
				    const char *out, hpu_layernorm_opts o);

/* Per channel of [C, ...] (BatchNorm1d on [C], BatchNorm2d on [C, H,
 * W]): training normalizes with the micro-batch's statistics (biased
 * variance) and updates the buffers running_mean (zeros) and running_var
 * (ones) with .momentum (unbiased variance, as torch); evaluation uses
 * the buffers. weight ones [C], bias zeros [C]. The buffers are kept per
 * .sync across ranks (HPU_BUFFER_MEAN averages them after every step). */
HPU_API hpu_layer *hpu_batchnorm_v3(hpu_builder *b, const char *name, const char *in,
				    const char *out, hpu_batchnorm_opts o);

/* ---- sequences ---- */

/* ids i32 [...] -> [..., dim]; weight [vocab, dim] N(0, 1)
 * (torch.nn.Embedding; hpu_param_init(b, "<name>.weight", ...) sets
 * another initializer, e.g. GPT-2's N(0, 0.02)). An id outside [0,
 * vocab) fails the call naming the id. */
HPU_API hpu_layer *hpu_embedding_v3(hpu_builder *b, const char *name, const char *in,
				    const char *out, hpu_embedding_opts o);

/* Multi-head self-attention over x [T, D] (torch.nn.MultiheadAttention
 * with batch_first, q = k = v = x): qkv = x Wqkv^T + bqkv, Wqkv [3D, D]
 * laid out as q, then k, then v rows (each D rows, head h at rows
 * h*D/heads ..); per head softmax(q k^T / sqrt(D/heads) + mask) v; out =
 * that (heads side by side) Wo^T + bo, Wo [D, D]. Weights as torch:
 * Wqkv xavier-uniform, bqkv zeros, Wo U(+-1/sqrt(D)), bo zeros.
 * `in` is "x" or "x,mask" with mask i32 [T]: 1 for a real token, 0 for
 * padding (keys at padding are not attended to; a query row whose keys
 * are all masked attends to nothing: its output is bo, and it passes no
 * gradient back). .causal: position t attends to 0..t. Parameters
 * follow torch's names: in_proj_weight, in_proj_bias, out_proj.weight,
 * out_proj.bias. */
HPU_API hpu_layer *hpu_attention_v3(hpu_builder *b, const char *name, const char *in,
				    const char *out, hpu_attention_opts o);

/* Over x [C, T]: y [.out, (T + 2 pad - kernel) / stride + 1]; weight
 * [.out, C, kernel] and bias [.out] U(+-1/sqrt(C*kernel))
 * (torch.nn.Conv1d). */
HPU_API hpu_layer *hpu_conv1d_v3(hpu_builder *b, const char *name, const char *in,
				 const char *out, hpu_conv1d_opts o);

/* hpu_conv2d with kernel {kh, kw}, stride {sh, sw} and zero padding {ph,
 * pw} per axis: weight [.out, C, kh, kw], bias [.out] U(+-1/sqrt(C*kh*kw))
 * (torch.nn.Conv2d with tuples). */
HPU_API hpu_layer *hpu_conv2d_rect_v3(hpu_builder *b, const char *name, const char *in,
				      const char *out, hpu_conv2d_rect_opts o);

/* Max / average pooling along dimension .dim only, window .kernel,
 * .stride, no padding: that dimension becomes (n - kernel) / stride + 1
 * (torch.nn.MaxPool1d / AvgPool1d when dim is the last of [C, T]). */
HPU_API hpu_layer *hpu_maxpool1d_v3(hpu_builder *b, const char *name, const char *in,
				    const char *out, hpu_pool1d_opts o);
HPU_API hpu_layer *hpu_avgpool1d_v3(hpu_builder *b, const char *name, const char *in,
				    const char *out, hpu_pool1d_opts o);

/* ---- losses and metrics (per-sample f32 outputs, ndim 0) ----
 *
 * Each loss layer hpu_X has its kernel in <hpu/ops.h> under the same
 * name: hpu_cross_entropy_forward, hpu_accuracy_forward. */

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

/* ---- shapes and reductions (f32) ----
 *
 * The runtime gives every tensor its own memory, so reshape, slice,
 * concat and permute copy forward and back. */

/* [..., n, ...] -> [..., ...]: the sum, mean or max over dimension .dim
 * (torch.sum / mean / amax(dim) without keepdim; max's gradient goes to
 * the first maximum, as torch.max(dim)'s). A 1-D input gives ndim 0. */
HPU_API hpu_layer *hpu_reduce_v3(hpu_builder *b, const char *name, const char *in,
				 const char *out, hpu_reduce_opts o);

/* The same values in .shape [.ndim] (at most one -1: the size that keeps
 * the count; torch.reshape). */
HPU_API hpu_layer *hpu_reshape_v3(hpu_builder *b, const char *name, const char *in,
				  const char *out, hpu_reshape_opts o);

/* Positions [.start, .start + .len) of dimension .dim (torch.narrow). */
HPU_API hpu_layer *hpu_slice_v3(hpu_builder *b, const char *name, const char *in,
				const char *out, hpu_slice_opts o);

/* in = "a,b,..." (2 to 8 inputs, equal shapes but along .dim): joined
 * along .dim in that order (torch.cat). */
HPU_API hpu_layer *hpu_concat_v3(hpu_builder *b, const char *name, const char *in,
				 const char *out, hpu_concat_opts o);

/* Output dimension i is the input's dimension .perm[i]; .ndim must be the
 * input's (torch.permute of the per-sample dimensions). */
HPU_API hpu_layer *hpu_permute_v3(hpu_builder *b, const char *name, const char *in,
				  const char *out, hpu_permute_opts o);

/* Dimensions .dim0 and .dim1 swapped (torch.transpose). */
HPU_API hpu_layer *hpu_transpose_v3(hpu_builder *b, const char *name, const char *in,
				    const char *out, hpu_transpose_opts o);

/* ---- ABI 2's positional forms: deprecated, gone in the next version ---- */

#if defined(__GNUC__) || defined(__clang__)
/* A call that remains (not a mere mention: the macros below name both
 * forms) warns, -Wattribute-warning. */
#define HPU__ABI2(use) __attribute__((warning("ABI 2's form, deprecated: use " use)))
#else
#define HPU__ABI2(use)
#endif

HPU_API hpu_layer *hpu_linear(hpu_builder *b, const char *name, const char *in,
			      const char *out, int64_t out_features, int bias)
	HPU__ABI2("hpu_linear(b, name, in, out, (hpu_linear_opts){.out = N, .bias = true})");
HPU_API hpu_layer *hpu_linear_tied(hpu_builder *b, const char *name, const char *in,
				   const char *out, const char *weight, int bias)
	HPU__ABI2("hpu_linear_tied(b, name, in, out, (hpu_linear_tied_opts){.weight = W})");
HPU_API hpu_layer *hpu_conv2d(hpu_builder *b, const char *name, const char *in,
			      const char *out, int out_ch, int kernel, int stride,
			      int pad, int bias)
	HPU__ABI2("hpu_conv2d(b, name, in, out, (hpu_conv2d_opts){.out = C, .kernel = K, ...})");
HPU_API hpu_layer *hpu_maxpool2d(hpu_builder *b, const char *name, const char *in,
				 const char *out, int kernel, int stride)
	HPU__ABI2("hpu_maxpool2d(b, name, in, out, (hpu_pool2d_opts){.kernel = K})");
HPU_API hpu_layer *hpu_avgpool2d(hpu_builder *b, const char *name, const char *in,
				 const char *out, int kernel, int stride)
	HPU__ABI2("hpu_avgpool2d(b, name, in, out, (hpu_pool2d_opts){.kernel = K})");
HPU_API hpu_layer *hpu_dropout(hpu_builder *b, const char *name, const char *in,
			       const char *out, float p)
	HPU__ABI2("hpu_dropout(b, name, in, out, (hpu_dropout_opts){.p = P})");
HPU_API hpu_layer *hpu_layernorm(hpu_builder *b, const char *name, const char *in,
				 const char *out, float eps)
	HPU__ABI2("hpu_layernorm(b, name, in, out, (hpu_layernorm_opts){.eps = E})");
HPU_API hpu_layer *hpu_batchnorm(hpu_builder *b, const char *name, const char *in,
				 const char *out, float eps, float momentum,
				 hpu_buffer_sync sync)
	HPU__ABI2("hpu_batchnorm(b, name, in, out, (hpu_batchnorm_opts){.momentum = M})");
HPU_API hpu_layer *hpu_embedding(hpu_builder *b, const char *name, const char *in,
				 const char *out, int64_t vocab, int64_t dim)
	HPU__ABI2("hpu_embedding(b, name, in, out, (hpu_embedding_opts){.vocab = V, .dim = D})");
HPU_API hpu_layer *hpu_attention(hpu_builder *b, const char *name, const char *in,
				 const char *out, int heads, int causal)
	HPU__ABI2("hpu_attention(b, name, in, out, (hpu_attention_opts){.heads = H, .causal = true})");
HPU_API hpu_layer *hpu_reduce(hpu_builder *b, const char *name, const char *in,
			      const char *out, int dim, hpu_reduce_op op)
	HPU__ABI2("hpu_reduce(b, name, in, out, (hpu_reduce_opts){.dim = D, .op = OP})");
HPU_API hpu_layer *hpu_reshape(hpu_builder *b, const char *name, const char *in,
			       const char *out, int ndim, const int64_t *shape)
	HPU__ABI2("hpu_reshape(b, name, in, out, (hpu_reshape_opts){.ndim = N, .shape = {...}})");
HPU_API hpu_layer *hpu_slice(hpu_builder *b, const char *name, const char *in,
			     const char *out, int dim, int64_t start, int64_t len)
	HPU__ABI2("hpu_slice(b, name, in, out, (hpu_slice_opts){.dim = D, .start = S, .len = L})");
HPU_API hpu_layer *hpu_concat(hpu_builder *b, const char *name, const char *in,
			      const char *out, int dim)
	HPU__ABI2("hpu_concat(b, name, in, out, (hpu_concat_opts){.dim = D})");
HPU_API hpu_layer *hpu_permute(hpu_builder *b, const char *name, const char *in,
			       const char *out, int ndim, const int *perm)
	HPU__ABI2("hpu_permute(b, name, in, out, (hpu_permute_opts){.ndim = N, .perm = {...}})");
HPU_API hpu_layer *hpu_transpose(hpu_builder *b, const char *name, const char *in,
				 const char *out, int dim0, int dim1)
	HPU__ABI2("hpu_transpose(b, name, in, out, (hpu_transpose_opts){.dim0 = A, .dim1 = B})");
HPU_API hpu_layer *hpu_conv1d(hpu_builder *b, const char *name, const char *in,
			      const char *out, int out_ch, int kernel, int stride, int pad,
			      int bias)
	HPU__ABI2("hpu_conv1d(b, name, in, out, (hpu_conv1d_opts){.out = C, .kernel = K, ...})");
HPU_API hpu_layer *hpu_conv2d_rect(hpu_builder *b, const char *name, const char *in,
				   const char *out, int out_ch, const int kernel[2],
				   const int stride[2], const int pad[2], int bias)
	HPU__ABI2("hpu_conv2d_rect(b, name, in, out, (hpu_conv2d_rect_opts){.kernel = {KH, KW}, ...})");
HPU_API hpu_layer *hpu_maxpool1d(hpu_builder *b, const char *name, const char *in,
				 const char *out, int dim, int kernel, int stride)
	HPU__ABI2("hpu_maxpool1d(b, name, in, out, (hpu_pool1d_opts){.dim = D, .kernel = K})");
HPU_API hpu_layer *hpu_avgpool1d(hpu_builder *b, const char *name, const char *in,
				 const char *out, int dim, int kernel, int stride)
	HPU__ABI2("hpu_avgpool1d(b, name, in, out, (hpu_pool1d_opts){.dim = D, .kernel = K})");

#ifndef __cplusplus
/* hpu_X(b, name, in, out, OPTS): hpu_X_v3 when OPTS is the layer's options
 * struct T, else ABI 2's hpu_X (its positional arguments). The type is
 * read without evaluating OPTS, and without -Wunused-value's complaint
 * about ABI 2's comma-separated arguments read as one expression. */
#define HPU__OPTS_TYPE(...)                                                   \
	__typeof__(__extension__({                                            \
		_Pragma("GCC diagnostic push")                                \
		_Pragma("GCC diagnostic ignored \"-Wunused-value\"")          \
		__VA_ARGS__;                                                  \
		_Pragma("GCC diagnostic pop")                                 \
	}))
#define HPU__LAYER(T, fn, b, name, in, out, ...)                              \
	_Generic((HPU__OPTS_TYPE(__VA_ARGS__) *)0, T *: fn##_v3,              \
		 const T *: fn##_v3, default: fn)(b, name, in, out, __VA_ARGS__)

#define hpu_linear(b, name, in, out, ...) \
	HPU__LAYER(hpu_linear_opts, hpu_linear, b, name, in, out, __VA_ARGS__)
#define hpu_linear_tied(b, name, in, out, ...) \
	HPU__LAYER(hpu_linear_tied_opts, hpu_linear_tied, b, name, in, out, __VA_ARGS__)
#define hpu_conv2d(b, name, in, out, ...) \
	HPU__LAYER(hpu_conv2d_opts, hpu_conv2d, b, name, in, out, __VA_ARGS__)
#define hpu_maxpool2d(b, name, in, out, ...) \
	HPU__LAYER(hpu_pool2d_opts, hpu_maxpool2d, b, name, in, out, __VA_ARGS__)
#define hpu_avgpool2d(b, name, in, out, ...) \
	HPU__LAYER(hpu_pool2d_opts, hpu_avgpool2d, b, name, in, out, __VA_ARGS__)
#define hpu_dropout(b, name, in, out, ...) \
	HPU__LAYER(hpu_dropout_opts, hpu_dropout, b, name, in, out, __VA_ARGS__)
#define hpu_layernorm(b, name, in, out, ...) \
	HPU__LAYER(hpu_layernorm_opts, hpu_layernorm, b, name, in, out, __VA_ARGS__)
#define hpu_batchnorm(b, name, in, out, ...) \
	HPU__LAYER(hpu_batchnorm_opts, hpu_batchnorm, b, name, in, out, __VA_ARGS__)
#define hpu_embedding(b, name, in, out, ...) \
	HPU__LAYER(hpu_embedding_opts, hpu_embedding, b, name, in, out, __VA_ARGS__)
#define hpu_attention(b, name, in, out, ...) \
	HPU__LAYER(hpu_attention_opts, hpu_attention, b, name, in, out, __VA_ARGS__)
#define hpu_reduce(b, name, in, out, ...) \
	HPU__LAYER(hpu_reduce_opts, hpu_reduce, b, name, in, out, __VA_ARGS__)
#define hpu_reshape(b, name, in, out, ...) \
	HPU__LAYER(hpu_reshape_opts, hpu_reshape, b, name, in, out, __VA_ARGS__)
#define hpu_slice(b, name, in, out, ...) \
	HPU__LAYER(hpu_slice_opts, hpu_slice, b, name, in, out, __VA_ARGS__)
#define hpu_concat(b, name, in, out, ...) \
	HPU__LAYER(hpu_concat_opts, hpu_concat, b, name, in, out, __VA_ARGS__)
#define hpu_permute(b, name, in, out, ...) \
	HPU__LAYER(hpu_permute_opts, hpu_permute, b, name, in, out, __VA_ARGS__)
#define hpu_transpose(b, name, in, out, ...) \
	HPU__LAYER(hpu_transpose_opts, hpu_transpose, b, name, in, out, __VA_ARGS__)
#define hpu_conv1d(b, name, in, out, ...) \
	HPU__LAYER(hpu_conv1d_opts, hpu_conv1d, b, name, in, out, __VA_ARGS__)
#define hpu_conv2d_rect(b, name, in, out, ...) \
	HPU__LAYER(hpu_conv2d_rect_opts, hpu_conv2d_rect, b, name, in, out, __VA_ARGS__)
#define hpu_maxpool1d(b, name, in, out, ...) \
	HPU__LAYER(hpu_pool1d_opts, hpu_maxpool1d, b, name, in, out, __VA_ARGS__)
#define hpu_avgpool1d(b, name, in, out, ...) \
	HPU__LAYER(hpu_pool1d_opts, hpu_avgpool1d, b, name, in, out, __VA_ARGS__)
#endif

#ifdef __cplusplus
}
#endif
#endif
