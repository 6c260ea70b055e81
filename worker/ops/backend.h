/* backend: the kernels behind the public ops (include/hpu/ops.h).
 *
 * The ops (ops.c, ops_nn.c, ops_conv.c) decide the policy: which type an
 * op runs in (autocast, fp8), rounding, accumulation into gradients. The
 * arithmetic itself goes through one small table of functions, so that
 * another device (a GPU) can provide the same ops by filling its own
 * table, without touching models, strategies or the policy. On CPUs the
 * table is oneDNN's (backend_dnnl.c); ops_ref.c keeps plain C reference
 * kernels that the tests compare against and that serve when a backend
 * function answers HPU_BE_UNSUPPORTED for a case (an ISA without bf16
 * products, a shape a primitive refuses).
 *
 * Conventions: row-major, NCHW; every function returns HPU_BE_OK or
 * HPU_BE_UNSUPPORTED (then nothing was written), or, for the host's
 * loops that need buffers of their own (the fused attention's),
 * HPU_BE_NOMEM when the host had no memory for them. Outputs are fp32 (but
 * a product's bf16 output, gemm_c16); inputs are fp32 or bf16 (uint16_t,
 * the top half of an fp32) as the dtype says. A backend keeps its
 * primitives per shape (a small cache) and may be called from any thread.
 */
#ifndef HPU_BACKEND_H
#define HPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "hpu/ops.h"

enum { HPU_BE_OK = 0, HPU_BE_UNSUPPORTED = -1, HPU_BE_NOMEM = -2 };

typedef enum hpu__dtype {
	HPU_DT_F32 = 0,
	HPU_DT_BF16 = 1, /* uint16_t storage, products accumulated in fp32 */
} hpu__dtype;

/* c[M,N] = a[M,K] * b[K,N] (+ bias[N] on every row) (+ c when
 * accumulate), for `count` independent products (batch). trans_a: a is
 * stored [K,M]; trans_b: b is stored [N,K]. stride_*: elements from one
 * product's matrix to the next (unused when count == 1). */
typedef struct hpu__gemm {
	hpu__dtype dt; /* of a and b; c and bias are fp32 */
	int count, m, n, k;
	int trans_a, trans_b;
	const void *a, *b;
	const float *bias; /* NULL or [N]; not with accumulate */
	float *c;
	size_t stride_a, stride_b, stride_c;
	int accumulate;
	/* NULL, or where the product goes instead of c, as bf16: each fp32
	 * sum rounded to nearest even (hpu_to_bf16); c is then unused. Only
	 * with dt bf16, no bias, no accumulate, and only to a table whose
	 * gemm_c16 is 1 (others never see it set). */
	uint16_t *c16;
} hpu__gemm;

/* Eltwise ops (hpu__backend.eltwise_*). */
typedef enum hpu__eltwise {
	HPU_ELT_RELU = 0,
	HPU_ELT_GELU_TANH,
	HPU_ELT_TANH,
} hpu__eltwise;

typedef struct hpu__backend {
	const char *name; /* "oneDNN" */
	/* One line naming the library version and the instruction set the
	 * kernels dispatch to, and whether bf16 products run natively. */
	const char *(*describe)(void);
	/* 1 when bf16 products run on bf16 instructions, 0 when they are
	 * emulated (HPU_BE_UNSUPPORTED or slow); the ops then round to bf16
	 * and multiply in fp32. */
	int (*bf16_native)(void);
	/* Kernel threads per worker (1 by default: a worker is one device). */
	void (*set_threads)(int n);

	int (*gemm)(const hpu__gemm *g);
	/* 1 when gemm takes c16 (a bf16 output, hpu__gemm): the ops then let
	 * a weight gradient's product write the 16-bit gradient itself
	 * (autocast.h, hpu__ac_fresh_claim16). 0 where a table leaves it out
	 * (the reference table, CUDA's): c16 is never set for it. */
	int gemm_c16;
	/* 1 when the table's check entries (xent_pos_fwd, bce_fwd,
	 * ids_first_bad) write their findings (bad, bad_label, bad_value)
	 * into device memory with no wait: the ops' data checks may then be
	 * deferred to a recorded step's end on this table as on the CPU's
	 * (checks.h). cpu-strict's kernels-only table and CUDA's set it. */
	int findings_dev;

	/* Convolution, square kernel, padding and stride of s. x, w and dy
	 * are of type dt; y, dx, dw and db are fp32.
	 * fwd:         y[B,O,OH,OW] = conv(x, w[O,C,K,K]) + b[O] (b may be NULL)
	 * bwd_data:    dx[B,C,H,W] = the gradient w.r.t. x (overwritten)
	 * bwd_weights: dw += the gradient w.r.t. w, db += sum of dy (db may
	 *              be NULL) */
	int (*conv_fwd)(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
			const void *w, const float *b, float *y);
	int (*conv_bwd_data)(const hpu_conv2d_shape *s, hpu__dtype dt, const void *w,
			     const void *dy, float *dx);
	int (*conv_bwd_weights)(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
				const void *dy, float *dw, float *db);
	/* Both backward convolutions in one call (bwd_weights, then bwd_data
	 * into dx, which is not NULL), where the backend can share work
	 * between them (oneDNN: dy's reorder). NULL where a table leaves it
	 * out (the reference, the host and CUDA's tables; the CPU devices'
	 * kernels-only table has it where their backend has it): the
	 * ops then call the two. Answers HPU_BE_OK when both ran; otherwise
	 * *weights_done (always set) says whether dw/db were accumulated. */
	int (*conv_bwd)(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x, const void *w,
			const void *dy, float *dx, float *dw, float *db, int *weights_done);

	/* Pooling, fp32, square window k, stride, no padding (as ops.h). */
	int (*maxpool_fwd)(const float *x, float *y, int32_t *idx, int batch, int ch,
			   int h, int w, int k, int stride);
	int (*maxpool_bwd)(const float *dy, const int32_t *idx, float *dx, int batch,
			   int ch, int h, int w, int k, int stride);
	int (*avgpool_fwd)(const float *x, float *y, int batch, int ch, int h, int w,
			   int k, int stride);
	int (*avgpool_bwd)(const float *dy, float *dx, int batch, int ch, int h, int w,
			   int k, int stride);

	/* Elementwise, fp32: y = f(x); dx = dy * f'(at), where `at` is the
	 * forward's input x for GELU and its output y for ReLU and tanh. */
	int (*eltwise_fwd)(hpu__eltwise op, const float *x, float *y, size_t n);
	int (*eltwise_bwd)(hpu__eltwise op, const float *at, const float *dy, float *dx,
			   size_t n);

	/* Row-wise softmax of x[rows, cols], and its backward (ops.h). */
	int (*softmax_fwd)(const float *x, float *y, int rows, int cols);
	int (*softmax_bwd)(const float *y, const float *dy, float *dx, int rows, int cols);

	/* Layer norm over the last dimension (ops.h): mean and rstd saved. */
	int (*layernorm_fwd)(const float *x, const float *gamma, const float *beta,
			     float *y, float *mean, float *rstd, int rows, int cols,
			     float eps);
	int (*layernorm_bwd)(const float *x, const float *gamma, const float *mean,
			     const float *rstd, const float *dy, float *dx, float *dgamma,
			     float *dbeta, int rows, int cols);

	/* The ops the CPU runs as plain C loops (ops_nn.c, ops.c) and a
	 * device provides as kernels; NULL where a table has none (oneDNN
	 * and the reference table), and the ops run their plain C form. */

	/* Dropout, fp32, as hpu_dropout_forward/backward (ops.h), with the
	 * counter-based mask every device must draw alike: with
	 * mix64(z) = splitmix64's finalizer, key = mix64(seed ^
	 * mix64(stream ^ 0x6a09e667f3bcc909)), element i is kept (mask 1,
	 * y = x * (1 / (1 - p))) when the top 32 bits of mix64(key + (i + 1)
	 * * 0x9e3779b97f4a7c15) reach (uint32)(p * 2^32); p >= 1 drops all. */
	int (*dropout_fwd)(const float *x, float *y, uint8_t *mask, size_t n, float p,
			   uint64_t seed, uint64_t stream);
	int (*dropout_bwd)(const float *dy, const uint8_t *mask, float *dx, size_t n,
			   float p);
	/* Embedding: y[n, dim] = the rows ids[n] of table[vocab, dim], and
	 * its backward dtable[ids[i]] += dy[i] in order of i. An id outside
	 * [0, vocab) is left alone, never read or written outside the
	 * table: its row of y is zeros, and backward adds nothing for it
	 * (an embedding's check deferred to the step's end, checks.h, lets
	 * such ids reach the kernels). Backward's vocab is INT_MAX where
	 * the op does not know it (its forward checked the ids eagerly). */
	int (*embedding_fwd)(const float *table, const int32_t *ids, float *y, int n,
			     int vocab, int dim);
	int (*embedding_bwd)(const int32_t *ids, const float *dy, float *dtable, int n,
			     int vocab, int dim);
	/* Mean softmax cross-entropy of logits[B, C] against labels[B]
	 * (checked by the op before) into *loss, and, when dlogits is not
	 * NULL, its gradient, as hpu_cross_entropy_forward (ops.h). */
	int (*softmax_xent)(const float *logits, const int32_t *labels, float *dlogits,
			    int batch, int classes, float *loss);

	/* The ops' own passes over tensors (ops.c, ops_nn.c, autocast.c);
	 * NULL on the CPU's tables, where the C loops serve. A device whose
	 * memory the CPU cannot read fills them. */
	/* db[cols] += the sum over rows of dy[rows, cols] (dy fp32, or bf16
	 * as dt says; sums in fp32). */
	int (*bias_grad)(hpu__dtype dt, const void *dy, float *db, int rows, int cols);
	/* y[n] = x[n] rounded to nearest even to bf16, or fp16 when fp16,
	 * as common/lowp.h (y may be x). */
	int (*round)(int fp16, const float *x, float *y, size_t n);
	/* y[n] = the bf16 of x[n] (hpu_to_bf16). */
	int (*to_bf16)(const float *x, uint16_t *y, size_t n);
	/* y[n] = the fp32 values of 16-bit x[n]: fp16 when fp16, else bf16. */
	int (*from16)(int fp16, const uint16_t *x, float *y, size_t n);
	/* y[n] += x[n]. */
	int (*add)(const float *x, float *y, size_t n);
	/* fp8 (fp8.h): *amax = max |x[n]| (NaN ignored; 0 for n == 0), as
	 * hpu__fp8_amax; amax is host memory (the call waits for it). */
	int (*amax)(const float *x, size_t n, float *amax);
	/* y[n] = fp8(x[n] * scale) / scale in format fmt (HPU_FP8_E4M3 or
	 * _E5M2), as hpu__fp8_fake_quant, bit for bit (y may be x). */
	int (*fp8_fake_quant)(const float *x, float *y, size_t n, float scale, int fmt);
	/* fp8 training's scaling state on the device (fp8.h: a chunk's
	 * step and scale pairs, its histories), which these read and write
	 * when they run, so that a recorded step replays them. amax_scale:
	 * a = max |x[n]| (NaN ignored; 0 for n == 0); step[0] = a where
	 * larger, step[1] = 1; where sc[0] is 0, sc[0] =
	 * hpu__fp8_scale_for(a, fmt, margin) (sc[1] is the kernel's
	 * scratch). */
	int (*fp8_amax_scale)(const float *x, size_t n, float *step, float *sc, int fmt,
			      int margin);
	/* y[n] = fp8(x[n] * s) / s as fp8_fake_quant, s = *scale (device
	 * memory), or 1 where *scale is 0. */
	int (*fp8_quant_at)(const float *x, float *y, size_t n, const float *scale, int fmt);
	/* The delayed-scaling roll (fp8.c's hpu__fp8_roll) of instances
	 * [0, count) of a chunk of `cap` (fp8.h): each tensor's step amax
	 * into its history and the step pair cleared, the scale from the
	 * history (algo HPU_FP8_AMAX_MAX or _MOST_RECENT; an amax of 0, inf or NaN keeps
	 * it), the history's next slot. */
	int (*fp8_roll)(float *chunk, int count, int cap, int history, int algo, int margin);
	/* dst[bytes] = src[bytes], one of them host memory and the other the
	 * device's: fp8's state for a checkpoint, the figures and the amax
	 * reduction over ranks (the call waits for the copy). */
	int (*fp8_state_copy)(void *dst, const void *src, size_t bytes);
	/* fp8 training's products on fp8 arithmetic (a GPU with fp8 tensor
	 * cores; gemm_fp8 is NULL on the CPU's tables, where the quantized
	 * values are multiplied by the bf16 kernels, exactly; the host's
	 * quant8 is the GPU tests' reference). quant8: q = the fp8
	 * bytes (format fmt) of x[rows, cols] * s, s = sc[0] (1 where 0):
	 * fake_quant's value times s, encoded (hpu__fp8_encode); trans: q is
	 * [cols, rows], x transposed; sc[1] = 1 / s, what gemm_fp8 multiplies
	 * the product by. gemm_fp8: c[M,N] = a[M,K] b[N,K]^T * *ia * *ib
	 * (+ bias[N] on every row; + c when accumulate), a and b fp8 bytes of
	 * formats fa and fb (not both E5M2), both stored with K innermost, ia
	 * and ib device memory read when it runs; products summed in fp32 (a
	 * GPU's tensor cores: with fewer bits within a chunk of K).
	 * HPU_BE_UNSUPPORTED, nothing written, where the GPU has no fp8
	 * product for the case (its architecture, the shape's alignment). */
	int (*fp8_quant8)(const float *x, uint8_t *q, int rows, int cols, int trans, float *sc,
			  int fmt);
	int (*gemm_fp8)(int m, int n, int k, const uint8_t *a, int fa, const uint8_t *b, int fb,
			const float *ia, const float *ib, const float *bias, float *c,
			int accumulate);
	/* *ok = 1 when every ids[n] lies in [0, limit), else 0 (labels and
	 * token ids come from data files: the ops check them before a
	 * kernel reads them; ok is host memory, the call waits for it). */
	int (*ids_in_range)(const int32_t *ids, int n, int limit, int *ok);
	/* *correct = the rows of logits[B, C] whose first arg-max is their
	 * label, as hpu_count_correct (correct is host memory). */
	int (*count_correct)(const float *logits, const int32_t *labels, int batch,
			     int classes, int *correct);

	/* The layers' own loops (worker/layers), as the ops of ops_loss.c
	 * (ops.h); NULL on the CPU's tables, where hpu__be_host's serve. A
	 * table without one (a GPU's) makes the op fail with a sentence. */
	/* Per-sample softmax cross-entropy over rows x positions labels
	 * (-100 ignored): lse[rows * positions] saved, loss[rows] each row's
	 * mean over its counted positions; *bad (host memory) the index of
	 * the first label outside [0, classes) and not -100, its value in
	 * *bad_label, or -1. bwd: dx = dloss[r] / n * (softmax - onehot) at
	 * counted positions, 0 at ignored ones. accuracy_pos: acc[r] the
	 * fraction of a row's counted positions whose first arg-max is the
	 * label. */
	int (*xent_pos_fwd)(const float *logits, const int32_t *labels, float *lse, float *loss,
			    int rows, size_t positions, int classes, long *bad,
			    int32_t *bad_label);
	int (*xent_pos_bwd)(const float *logits, const int32_t *labels, const float *lse,
			    const float *dloss, float *dx, int rows, size_t positions,
			    int classes);
	int (*accuracy_pos)(const float *logits, const int32_t *labels, float *acc, int rows,
			    size_t positions, int classes, long *bad, int32_t *bad_label);
	/* dst[bytes] = src[bytes], device memory both (the layers' copies:
	 * flatten, add's backward); they do not overlap. */
	int (*copy)(void *dst, const void *src, size_t bytes);
	/* The attention layer's head-major copies (ops.h hpu_split_heads,
	 * hpu_merge_heads; merge selects the second) and its masking of the
	 * scores (hpu_mask_scores). */
	int (*heads)(int merge, const float *src, float *dst, size_t ld, int batch, int heads,
		     int t, int hd, float mul);
	int (*mask_scores)(float *att, const int32_t *mask, int batch, int heads, int t,
			   int causal, int after);
	/* The dropout layer's (ops.h hpu_dropout_rows, hpu_dropout_ctx):
	 * keys[rows] in host memory (keys_dev 0: the public op's), or in
	 * device memory (keys_dev 1: made by dropout_keys, the keys of a
	 * recordable run). */
	int (*dropout_rows)(const float *x, float *y, const uint64_t *keys, int keys_dev,
			    int rows, size_t n, uint32_t cut, float scale);
	/* keys[rows] = the rows' keys of the run context (hpu_rand_key,
	 * common/rowkey.h's hpu__rk_key) for `seed`, `layer`, the step at
	 * *step and the rows' dataset sample indices samples[rows] (NULL:
	 * the row's index): keys, samples and step are device memory, read
	 * when the kernel runs, so that a recorded step's replay draws its
	 * own step's keys (ops.h hpu_dropout_ctx, worker/ops/dropkeys.h). */
	int (*dropout_keys)(uint64_t *keys, const uint32_t *samples, const int64_t *step,
			    uint64_t seed, int layer, int rows);
	/* The batch norm layer's (ops.h hpu_batchnorm_forward/backward). */
	int (*batchnorm_fwd)(const float *x, float *y, const float *w, const float *bias,
			     float *run_mean, float *run_var, float *saved, int batch, int ch,
			     size_t spatial, float eps, float momentum, int train, int update);
	int (*batchnorm_bwd)(const float *x, const float *dy, const float *w, const float *saved,
			     float *dw, float *dbias, float *dx, int batch, int ch, size_t spatial);

	/* The shape, sequence and loss layers' kernels (ops_shape.c,
	 * ops_conv_rect.c, ops_loss.c; ops.h): NULL on the CPU's tables,
	 * where hpu__be_host's serve. A table without one (a GPU's) makes
	 * the op fail (HPU_ERROR). Sums in double where ops.h says so. */
	/* hpu_reduce_forward/backward over x[outer, n, inner] (op an
	 * hpu_reduce_op; idx may be NULL but for max). */
	int (*reduce_fwd)(int op, const float *x, float *y, int32_t *idx, size_t outer, size_t n,
			  size_t inner);
	int (*reduce_bwd)(int op, const float *dy, const int32_t *idx, float *dx, size_t outer,
			  size_t n, size_t inner);
	/* hpu_copy_rows: y[o, y0 + i, :] = x[o, x0 + i, :] for i < len. */
	int (*copy_rows)(const float *x, float *y, size_t outer, size_t nx, size_t x0, size_t ny,
			 size_t y0, size_t len, size_t inner);
	/* dst[bytes] = 0, device memory (slice's backward). */
	int (*zero)(void *dst, size_t bytes);
	/* hpu_permute_forward: shape[ndim] and perm[ndim] (ndim <= 8) are
	 * host memory. */
	int (*permute)(const float *x, float *y, int ndim, const int64_t *shape, const int *perm);
	/* hpu_sigmoid_forward (exp of -|x| only) and its backward dx = dy *
	 * y * (1 - y). */
	int (*sigmoid_fwd)(const float *x, float *y, size_t n);
	int (*sigmoid_bwd)(const float *y, const float *dy, float *dx, size_t n);
	/* hpu_maxpool1d_* (max: idx written, read back) and hpu_avgpool1d_*
	 * (idx unused, NULL) over the middle axis of x[outer, n, inner]. */
	int (*pool1d_fwd)(int max, const float *x, float *y, int32_t *idx, size_t outer, int n,
			  size_t inner, int k, int stride);
	int (*pool1d_bwd)(int max, const float *dy, const int32_t *idx, float *dx, size_t outer,
			  int n, size_t inner, int k, int stride);
	/* hpu_conv2d_rect_forward/backward: im2col of one sample into
	 * scratch (hpu_conv2d_rect_scratch floats, device memory) and a
	 * product per sample; b, dx, dw, db may be NULL as ops.h says. */
	int (*conv_rect_fwd)(const hpu_conv2d_rect_shape *s, const float *x, const float *w,
			     const float *b, float *y, float *scratch);
	int (*conv_rect_bwd)(const hpu_conv2d_rect_shape *s, const float *x, const float *w,
			     const float *dy, float *dx, float *dw, float *db, float *scratch);
	/* The losses over `rows` samples of n values, pred or x and target
	 * t [rows, n]: loss[rows] each row's mean (sums in double).
	 * mse: (p - t)^2; bwd dp = dloss[r] * 2 (p - t) / n (fp32), dt = -dp.
	 * bce (logits 1): with logits, torch's BCEWithLogitsLoss per
	 * element; bwd dx = dloss / n (sigmoid(x) - t), dt = -dloss / n x.
	 * bce (logits 0): of probabilities, logs clamped at -100; *bad
	 * (host memory) the index r * n + i of the first probability
	 * outside [0, 1] (loss then unspecified), *bad_value it, or -1;
	 * bwd as the layer hpu_binary_cross_entropy. dp, dt may be NULL. */
	int (*mse_fwd)(const float *p, const float *t, float *loss, int rows, size_t n);
	int (*mse_bwd)(const float *p, const float *t, const float *dloss, float *dp, float *dt,
		       int rows, size_t n);
	int (*bce_fwd)(int logits, const float *x, const float *t, float *loss, int rows, size_t n,
		       long *bad, float *bad_value);
	int (*bce_bwd)(int logits, const float *x, const float *t, const float *dloss, float *dx,
		       float *dt, int rows, size_t n);
	/* *bad (host memory) = the index of the first ids[i] outside [0,
	 * limit), *bad_value its value, or -1 (the attention layer's key
	 * mask: limit 2). */
	int (*ids_first_bad)(const int32_t *ids, size_t n, int32_t limit, long *bad,
			     int32_t *bad_value);
	/* hpu_attention_forward/backward (fp32, causal, qkv[B, T, 3D]);
	 * att[B, heads, T, T] the probabilities, written then read. */
	int (*attention_fwd)(const float *qkv, float *out, float *att, int batch, int t,
			     int heads, int hd);
	int (*attention_bwd)(const float *qkv, const float *att, const float *dout, float *dqkv,
			     int batch, int t, int heads, int hd);
	/* hpu_attention_fused_forward/backward (ops.h; the rows of
	 * flash_rows.h): fp32, qkv[B, T, 3D], mask[B, T] or NULL, ctx[B, T,
	 * D], lse[B, heads, T]; dqkv overwritten. NULL on the CPU's tables,
	 * where hpu__be_host's (the rows in C) serve; a table without them
	 * (a GPU's) makes the ops fail and the layer keep its unfused path. */
	int (*flash_fwd)(const float *qkv, const int32_t *mask, float *ctx, float *lse, int batch,
			 int t, int heads, int hd, int causal);
	int (*flash_bwd)(const float *qkv, const int32_t *mask, const float *ctx, const float *lse,
			 const float *dctx, float *dqkv, int batch, int t, int heads, int hd,
			 int causal);
	/* The same under bf16 autocast on tensor cores (flash_tiles.h), where
	 * a table has them (CUDA's; NULL elsewhere): qkv and dctx hold bf16
	 * values; P and dS are rounded to bf16 for their products, summed in
	 * fp32. HPU_BE_UNSUPPORTED, having done nothing, where the tiles do
	 * not take hd or the GPU cannot run them: the ops then call
	 * flash_fwd/flash_bwd. */
	int (*flash16_fwd)(const float *qkv, const int32_t *mask, float *ctx, float *lse,
			   int batch, int t, int heads, int hd, int causal);
	int (*flash16_bwd)(const float *qkv, const int32_t *mask, const float *ctx,
			   const float *lse, const float *dctx, float *dqkv, int batch, int t,
			   int heads, int hd, int causal);
} hpu__backend;

/* The backend the ops use (oneDNN's unless hpu__be_set said otherwise). */
const hpu__backend *hpu__be(void);

/* Makes the ops use `be` (NULL: the default); tests use this to run the
 * reference kernels alone. Not thread-safe: call before ops run. */
void hpu__be_set(const hpu__backend *be);

/* A table whose every function answers HPU_BE_UNSUPPORTED: the ops then
 * run the reference kernels of ops_ref.c. */
const hpu__backend *hpu__be_reference(void);

/* The ops' own C loops as a table (backend_host.c): the CPU's kernel for
 * each entry the CPU backends leave NULL. The ops run these where the
 * backend has no entry; cpu-strict's kernels-only mode puts them in its
 * table, so that the ops touch device memory only through the table. */
const hpu__backend *hpu__be_host(void);

/* 1 when the ops' table is one of the CPU's (oneDNN's, the reference
 * one), whose memory the host loops of hpu__be_host may read: where an
 * entry is NULL elsewhere, the op fails rather than run a host loop. */
int hpu__be_on_host(void);

/* ---- an entry's refusal on a table that is not the host's ----
 *
 * On the host's tables an entry's HPU_BE_UNSUPPORTED (or no entry) sends
 * an op to its C loops (the reference kernels, hpu__be_host's). On a
 * device's own table over memory the host cannot touch (CUDA's,
 * cpu-strict's kernels-only one) those loops would fault: every op asks
 * hpu__be_refused before it runs one, and the kernel-or-host ops
 * (HPU__BE_RUN) pass an entry's answer through hpu__be_answer. The
 * device the ops run on tells them its name, whether the host may touch
 * its memory and whether the calling thread records a step, through
 * hooks it installs (worker/device: hpu__dev_ops_hooks, which the worker
 * calls at start). Without hooks (a program that opened no device: the
 * unit tests' own tables) the host's memory is the device's, nothing
 * records, and the C loops serve any table, as before. */
typedef struct hpu__be_dev_hooks {
	/* the device's name, for the worker's last line ("cuda") */
	const char *(*name)(void);
	/* 1 when host code may read and write the device's memory now, on
	 * the calling thread (the cpu device; --device cpu --graphs' outside
	 * a recording, its memory being the host's): the C loops then serve
	 * a refusal on any table */
	int (*host_can_read)(void);
	/* 1 while the calling thread records a step: the recording then
	 * fails with `why` (one sentence naming the op), unless it was
	 * refused already (the device's own reason, naming the call it
	 * refused, is kept); 0 when the thread does not record */
	int (*refuse)(const char *why);
} hpu__be_dev_hooks;

/* Installs the device's hooks (NULL: none). Not thread-safe: call
 * before ops run. */
void hpu__be_set_dev_hooks(const hpu__be_dev_hooks *h);

/* The ops' table refused `op` (its entry answered HPU_BE_UNSUPPORTED, or
 * it has none); the rest of the line, printf's, says which entry and
 * case. 0 where the table is the host's (hpu__be_on_host) or the host may
 * touch the device's memory (no hooks, or their host_can_read): the op
 * runs its C loops, as always. Else 1, and the op does nothing more: while the
 * calling thread records, the recording is refused ("OP: the kernel
 * table of device D refused it while recording (DETAIL)", unless
 * refused already); otherwise the worker ends at once (exit status 1)
 * with one line, "the device D has no kernel for OP (DETAIL)". */
int hpu__be_refused(const char *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 1 while a step is being recorded (the device's hooks; the ops run on
 * the recording thread): the recording is then refused with `why`, one
 * sentence (unless it was refused already); else 0. For state an op makes once and keeps (fp8's
 * scaling), which must be made eagerly: made in a recording, a replay
 * would make it again. */
int hpu__be_recording_refuse(const char *why);

/* An entry's answer rc for op `entry` (a kernel-or-host op, which runs
 * no C loop after its table's refusal): HPU_BE_OK in place of
 * HPU_BE_UNSUPPORTED where the calling thread records on a table not the
 * host's (the recording refused naming the entry, hpu__be_refused: the
 * step runs again eagerly, nothing of this one ran); else rc. */
int hpu__be_answer(const char *entry, int rc);

#endif
