/* cuops: the CUDA device's kernel table (worker/cuda/cuda_ops.h).
 *
 * The products run on cuBLASLt (cuops_gemm.c), the convolutions on cuDNN
 * (cuops_conv.c), the rest on kernels of our own (cuops_kernels.cu); each
 * GPU's context, the stream and the error helpers are the base
 * (cuops_core.c); this file holds the table and the release. A failing
 * CUDA call ends the worker with a line naming it (hpu__cuops_fatal);
 * backend.h's refusal, HPU_BE_UNSUPPORTED, ends it too, naming the op
 * (hpu__be_refused: the ops never run their C loops over device memory),
 * except while a thread records, where it is the op's refusal instead
 * (cuda_ops.h).
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "worker/cuda/cuda_ops.h"
#include "worker/cuda/ops/cuops.h"
#include "worker/cuda/ops/cuops_kernels.h"
#include "worker/cuda/ops/cuops_more.h"
#include "worker/ops/fp8.h"

/* ---- releasing: each context's plans, then the context ---- */

void hpu__cuda_ops_release(void)
{
	hpu__cuops_ctx *all[HPU_CUOPS_MAX_GPUS];
	int n = hpu__cuops_ctx_take(all, HPU_CUOPS_MAX_GPUS);
	for (int i = 0; i < n; i++) {
		int dev = -1;
		cudaGetDevice(&dev);
		cudaSetDevice(all[i]->dev);
		cudaStreamSynchronize(hpu__cuops_stream());
		hpu__cuops_gemm_free(all[i]);
		hpu__cuops_conv_free(all[i]);
		hpu__cuops_ctx_destroy(all[i]);
		if (dev >= 0)
			cudaSetDevice(dev);
	}
	hpu__cuops_retired_free(); /* any graph left holds none of it usable now */
}

/* ---- the table's own entries ---- */

static char describe_line[512];

static const char *cu_describe(void)
{
	int dev = 0, rt = 0;
	struct cudaDeviceProp p;
	memset(&p, 0, sizeof p);
	cudaGetDevice(&dev);
	cudaRuntimeGetVersion(&rt);
	if (cudaGetDeviceProperties(&p, dev) != cudaSuccess)
		snprintf(p.name, sizeof p.name, "(no GPU)");
	size_t dnn = cudnnGetVersion();
	snprintf(describe_line, sizeof describe_line,
		 "CUDA %d.%d on GPU %d %.256s (sm_%d%d), %s, cuDNN %zu.%zu.%zu; bf16 products "
		 "native%s",
		 rt / 1000, rt % 1000 / 10, dev, p.name, p.major, p.minor,
		 hpu__cuops_blas_version(), dnn / 10000, dnn / 100 % 100, dnn % 100,
		 hpu__cuops_tf32() ? ", TF32 allowed" : "");
	return describe_line;
}

static int cu_bf16_native(void)
{
	return 1;
}

static void cu_threads(int n)
{
	(void)n;
}

static int cu_maxpool_fwd(const float *x, float *y, int32_t *idx, int batch, int ch, int h,
			  int w, int k, int stride)
{
	CU_KERNEL("max pooling", hpu__cuk_maxpool_fwd(x, y, idx, batch * ch, h, w, k, stride, st));
}

static int cu_maxpool_bwd(const float *dy, const int32_t *idx, float *dx, int batch, int ch,
			  int h, int w, int k, int stride)
{
	CU_KERNEL("max pooling backward",
		  hpu__cuk_maxpool_bwd(dy, idx, dx, batch * ch, h, w, k, stride, st));
}

static int cu_avgpool_fwd(const float *x, float *y, int batch, int ch, int h, int w, int k,
			  int stride)
{
	CU_KERNEL("average pooling", hpu__cuk_avgpool_fwd(x, y, batch * ch, h, w, k, stride, st));
}

static int cu_avgpool_bwd(const float *dy, float *dx, int batch, int ch, int h, int w, int k,
			  int stride)
{
	CU_KERNEL("average pooling backward",
		  hpu__cuk_avgpool_bwd(dy, dx, batch * ch, h, w, k, stride, st));
}

static int elt_known(hpu__eltwise op)
{
	return op == HPU_ELT_RELU || op == HPU_ELT_GELU_TANH || op == HPU_ELT_TANH;
}

static int cu_eltwise_fwd(hpu__eltwise op, const float *x, float *y, size_t n)
{
	if (!elt_known(op))
		return HPU_BE_UNSUPPORTED;
	CU_KERNEL("eltwise", hpu__cuk_eltwise_fwd((int)op, x, y, n, st));
}

static int cu_eltwise_bwd(hpu__eltwise op, const float *at, const float *dy, float *dx,
			  size_t n)
{
	if (!elt_known(op))
		return HPU_BE_UNSUPPORTED;
	CU_KERNEL("eltwise backward", hpu__cuk_eltwise_bwd((int)op, at, dy, dx, n, st));
}

static int cu_softmax_fwd(const float *x, float *y, int rows, int cols)
{
	CU_KERNEL("softmax", hpu__cuk_softmax_fwd(x, y, rows, cols, st));
}

static int cu_softmax_bwd(const float *y, const float *dy, float *dx, int rows, int cols)
{
	CU_KERNEL("softmax backward", hpu__cuk_softmax_bwd(y, dy, dx, rows, cols, st));
}

static int cu_layernorm_fwd(const float *x, const float *gamma, const float *beta, float *y,
			    float *mean, float *rstd, int rows, int cols, float eps)
{
	CU_KERNEL("layer norm",
		  hpu__cuk_layernorm_fwd(x, gamma, beta, y, mean, rstd, rows, cols, eps, st));
}

static int cu_layernorm_bwd(const float *x, const float *gamma, const float *mean,
			    const float *rstd, const float *dy, float *dx, float *dgamma,
			    float *dbeta, int rows, int cols)
{
	hpu__cuops_ctx *c = hpu__cuops_enter();
	if (!c)
		return HPU_BE_UNSUPPORTED;
	int rc = HPU_BE_UNSUPPORTED;
	size_t np = hpu__cuk_layernorm_partials(rows, cols);
	float *partial = np ? hpu__cuops_scratch(c, np * sizeof(float)) : NULL;
	if ((np == 0 || partial) &&
	    !hpu__cuops_cuda(hpu__cuk_layernorm_bwd(x, gamma, mean, rstd, dy, dx, dgamma, dbeta,
						    rows, cols, partial, hpu__cuops_stream()),
			     "layer norm backward"))
		rc = HPU_BE_OK;
	hpu__cuops_leave(c);
	return rc;
}

/* ops_nn.c's dropout_key: mix64(seed ^ mix64(stream ^ 0x6a09e667f3bcc909)). */
static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static int cu_dropout_fwd(const float *x, float *y, uint8_t *mask, size_t n, float p,
			  uint64_t seed, uint64_t stream)
{
	if (!(p >= 0.0f && p <= 1.0f) || hpu__cuda_ops_refuse("dropout", HPU_CUOPS_DROPOUT_WHY))
		return HPU_BE_UNSUPPORTED;
	int drop_all = p >= 1.0f;
	uint64_t key = mix64(seed ^ mix64(stream ^ 0x6a09e667f3bcc909ull));
	uint32_t thresh = drop_all ? 0 : (uint32_t)((double)p * 4294967296.0);
	float scale = drop_all ? 0.0f : 1.0f / (1.0f - p);
	CU_KERNEL("dropout",
		  hpu__cuk_dropout_fwd(x, y, mask, n, key, thresh, scale, drop_all, st));
}

static int cu_dropout_bwd(const float *dy, const uint8_t *mask, float *dx, size_t n, float p)
{
	float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
	CU_KERNEL("dropout backward", hpu__cuk_dropout_bwd(dy, mask, dx, n, scale, st));
}

static int cu_embedding_fwd(const float *table, const int32_t *ids, float *y, int n, int vocab,
			    int dim)
{
	CU_KERNEL("embedding", hpu__cuk_embedding_fwd(table, ids, y, n, vocab, dim, st));
}

static int cu_embedding_bwd(const int32_t *ids, const float *dy, float *dtable, int n,
			    int vocab, int dim)
{
	CU_KERNEL("embedding backward",
		  hpu__cuk_embedding_bwd(ids, dy, dtable, n, vocab, dim, st));
}

/* The mean loss comes back to the host: this waits for the stream. */
static int cu_softmax_xent(const float *logits, const int32_t *labels, float *dlogits,
			   int batch, int classes, float *loss)
{
	hpu__cuops_slot s;
	if (batch <= 0 || classes <= 0)
		return HPU_BE_UNSUPPORTED;
	/* the mean (fp32) in the slot, batch doubles of row losses after it */
	if (hpu__cuops_slot_begin(&s, sizeof *loss, -1, (size_t)batch * sizeof(double),
				  "softmax cross-entropy"))
		return HPU_BE_UNSUPPORTED;
	return hpu__cuops_slot_end(&s,
				   hpu__cuk_softmax_xent(logits, labels, dlogits, batch, classes,
							 s.more, s.d, s.st),
				   loss, "softmax cross-entropy");
}

static int cu_bias_grad(hpu__dtype dt, const void *dy, float *db, int rows, int cols)
{
	if (rows < 0 || cols < 0)
		return HPU_BE_UNSUPPORTED;
	hpu__cuops_ctx *c = hpu__cuops_enter();
	if (!c)
		return HPU_BE_UNSUPPORTED;
	int rc = HPU_BE_UNSUPPORTED;
	size_t np = hpu__cuk_bias_grad_partials(rows, cols);
	float *partial = np ? hpu__cuops_scratch(c, np * sizeof(float)) : NULL;
	if ((np == 0 || partial) &&
	    !hpu__cuops_cuda(hpu__cuk_bias_grad(dt == HPU_DT_BF16, dy, db, rows, cols, partial,
						hpu__cuops_stream()),
			     "bias gradient"))
		rc = HPU_BE_OK;
	hpu__cuops_leave(c);
	return rc;
}

static int cu_round(int fp16, const float *x, float *y, size_t n)
{
	CU_KERNEL("rounding", hpu__cuk_round(fp16, x, y, n, st));
}

static int cu_to_bf16(const float *x, uint16_t *y, size_t n)
{
	CU_KERNEL("bf16 conversion", hpu__cuk_to_bf16(x, y, n, st));
}

static int cu_from16(int fp16, const uint16_t *x, float *y, size_t n)
{
	CU_KERNEL("16-bit widening", hpu__cuk_from16(fp16, x, y, n, st));
}

static int cu_add(const float *x, float *y, size_t n)
{
	CU_KERNEL("add", hpu__cuk_add(x, y, n, st));
}

static int cu_copy(void *dst, const void *src, size_t bytes)
{
	if (!bytes)
		return HPU_BE_OK;
	CU_KERNEL("copy", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
}

/* The result comes back to the host: this waits for the stream. */
static int cu_amax(const float *x, size_t n, float *amax)
{
	hpu__cuops_slot s;
	uint32_t bits = 0;
	if (hpu__cuops_slot_begin(&s, sizeof bits, 0, 0, "amax") ||
	    hpu__cuops_slot_end(&s, hpu__cuk_amax(x, n, s.d, s.st), &bits, "amax"))
		return HPU_BE_UNSUPPORTED;
	memcpy(amax, &bits, sizeof *amax);
	return HPU_BE_OK;
}

/* The number of bad ids (waits for the stream). */
static int ids_check(const int32_t *ids, int n, int limit, int *bad)
{
	hpu__cuops_slot s;
	if (hpu__cuops_slot_begin(&s, sizeof *bad, 0, 0, "id check"))
		return HPU_BE_UNSUPPORTED;
	return hpu__cuops_slot_end(&s, hpu__cuk_ids_check(ids, n, limit, s.d, s.st), bad,
				   "id check");
}

static int cu_ids_in_range(const int32_t *ids, int n, int limit, int *ok)
{
	int bad = 0;
	if (hpu__cuda_on_device(ok)) /* the count of bad ids into *ok, then the verdict */
		CU_KERNEL("id check",
			  cudaMemsetAsync(ok, 0, sizeof *ok, st) == cudaSuccess &&
					  (n <= 0 || hpu__cuk_ids_check(ids, n, limit, ok, st) ==
							     cudaSuccess)
				  ? hpu__cukm_none_of(ok, st)
				  : cudaGetLastError());
	if (n <= 0) {
		*ok = 1;
		return HPU_BE_OK;
	}
	int rc = ids_check(ids, n, limit, &bad);
	if (rc == HPU_BE_OK)
		*ok = !bad;
	return rc;
}

static int cu_count_correct(const float *logits, const int32_t *labels, int batch,
			    int classes, int *correct)
{
	hpu__cuops_slot s;
	if (hpu__cuops_slot_begin(&s, sizeof *correct, 0, 0, "accuracy"))
		return HPU_BE_UNSUPPORTED;
	return hpu__cuops_slot_end(
		&s, hpu__cuk_count_correct(logits, labels, batch, classes, s.d, s.st), correct,
		"accuracy");
}

/* The formats of worker/ops/fp8.h: largest value, smallest normal's
 * exponent, mantissa bits, exponent bias. */
static const struct {
	float max;
	int emin, mbits, bias;
} fp8_fmts[2] = {{448.0f, -6, 3, 7}, {57344.0f, -14, 2, 15}};

/* fake_quant's constants of format fmt (fp8.c's) */
typedef struct fq_consts {
	float max, tiny, magic;
	uint32_t keep;
	int shift;
} fq_consts;

static fq_consts fq_of(int fmt)
{
	int m = fp8_fmts[fmt].mbits, shift = 23 - m;
	return (fq_consts){fp8_fmts[fmt].max, ldexpf(1.0f, fp8_fmts[fmt].emin),
			   1.5f * ldexpf(1.0f, 23 + fp8_fmts[fmt].emin - m), (1u << shift) - 1,
			   shift};
}

static int cu_fp8_fake_quant(const float *x, float *y, size_t n, float scale, int fmt)
{
	if (fmt != HPU_FP8_E4M3 && fmt != HPU_FP8_E5M2)
		return HPU_BE_UNSUPPORTED;
	fq_consts k = fq_of(fmt);
	CU_KERNEL("fp8 quantization",
		  hpu__cuk_fp8_fake_quant(x, y, n, scale, 1.0f / scale, k.max, k.tiny, k.magic,
					  k.keep, k.shift, fmt == HPU_FP8_E5M2, st));
}

static int cu_fp8_amax_scale(const float *x, size_t n, float *step, float *sc, int fmt,
			     int margin)
{
	if (fmt != HPU_FP8_E4M3 && fmt != HPU_FP8_E5M2)
		return HPU_BE_UNSUPPORTED;
	CU_KERNEL("fp8 scaling",
		  hpu__cuk_fp8_amax_scale(x, n, step, sc, fp8_fmts[fmt].max, margin, st));
}

static int cu_fp8_quant_at(const float *x, float *y, size_t n, const float *scale, int fmt)
{
	if (fmt != HPU_FP8_E4M3 && fmt != HPU_FP8_E5M2)
		return HPU_BE_UNSUPPORTED;
	fq_consts k = fq_of(fmt);
	CU_KERNEL("fp8 quantization", hpu__cuk_fp8_quant_at(x, y, n, scale, k.max, k.tiny,
							     k.magic, k.keep, k.shift,
							     fmt == HPU_FP8_E5M2, st));
}

static int cu_fp8_roll(float *chunk, int count, int cap, int history, int algo, int margin)
{
	CU_KERNEL("fp8 delayed scaling",
		  hpu__cuk_fp8_roll(chunk, chunk + hpu__fp8_off_scale(cap, 0, 0),
				    chunk + hpu__fp8_off_hist(cap, history, 0),
				    2 + 3 * (size_t)history, count, history,
				    algo == HPU_FP8_AMAX_MAX, margin, fp8_fmts[HPU_FP8_E4M3].max,
				    fp8_fmts[HPU_FP8_E5M2].max, st));
}

static int cu_fp8_quant8(const float *x, uint8_t *q, int rows, int cols, int trans, float *sc,
			 int fmt)
{
	if ((fmt != HPU_FP8_E4M3 && fmt != HPU_FP8_E5M2) || rows < 0 || cols < 0 ||
	    (trans && (rows + 31) / 32 > 65535))
		return HPU_BE_UNSUPPORTED;
	fq_consts k = fq_of(fmt);
	CU_KERNEL("fp8 quantization to bytes",
		  hpu__cuk_fp8_quant8(x, q, rows, cols, trans, sc, k.max, k.tiny, k.magic, k.keep,
				      k.shift, fmt == HPU_FP8_E5M2, fp8_fmts[fmt].mbits,
				      fp8_fmts[fmt].emin, fp8_fmts[fmt].bias, st));
}

/* a copy between host and device memory, waited for */
static cudaError_t copy_wait(void *dst, const void *src, size_t bytes, cudaStream_t st)
{
	cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st);
	return e == cudaSuccess ? cudaStreamSynchronize(st) : e;
}

static int cu_fp8_state_copy(void *dst, const void *src, size_t bytes)
{
	if (!bytes)
		return HPU_BE_OK;
	CU_KERNEL("fp8 state copy", copy_wait(dst, src, bytes, st));
}

static const hpu__backend cuda_backend = {
	.name = "CUDA",
	.describe = cu_describe,
	.bf16_native = cu_bf16_native,
	.set_threads = cu_threads,
	.gemm = hpu__cuops_gemm,
	/* xent_pos_fwd, bce_fwd, ids_first_bad (and ids_in_range) write a
	 * finding into device memory on the device (backend.h's comment on
	 * findings_dev); the embedding kernels skip an id outside the
	 * vocabulary, so an embedding's check defers too */
	.findings_dev = 1,
	.conv_fwd = hpu__cuops_conv_fwd,
	.conv_bwd_data = hpu__cuops_conv_bwd_data,
	.conv_bwd_weights = hpu__cuops_conv_bwd_weights,
	.maxpool_fwd = cu_maxpool_fwd,
	.maxpool_bwd = cu_maxpool_bwd,
	.avgpool_fwd = cu_avgpool_fwd,
	.avgpool_bwd = cu_avgpool_bwd,
	.eltwise_fwd = cu_eltwise_fwd,
	.eltwise_bwd = cu_eltwise_bwd,
	.softmax_fwd = cu_softmax_fwd,
	.softmax_bwd = cu_softmax_bwd,
	.layernorm_fwd = cu_layernorm_fwd,
	.layernorm_bwd = cu_layernorm_bwd,
	.dropout_fwd = cu_dropout_fwd,
	.dropout_bwd = cu_dropout_bwd,
	.embedding_fwd = cu_embedding_fwd,
	.embedding_bwd = cu_embedding_bwd,
	.softmax_xent = cu_softmax_xent,
	.bias_grad = cu_bias_grad,
	.round = cu_round,
	.to_bf16 = cu_to_bf16,
	.from16 = cu_from16,
	.add = cu_add,
	.amax = cu_amax,
	.fp8_fake_quant = cu_fp8_fake_quant,
	.fp8_amax_scale = cu_fp8_amax_scale,
	.fp8_quant_at = cu_fp8_quant_at,
	.fp8_roll = cu_fp8_roll,
	.fp8_state_copy = cu_fp8_state_copy,
	.fp8_quant8 = cu_fp8_quant8,
	.gemm_fp8 = hpu__cuops_gemm_fp8,
	.ids_in_range = cu_ids_in_range,
	.count_correct = cu_count_correct,
	.copy = cu_copy,
	.xent_pos_fwd = hpu__cuops_xent_pos_fwd,
	.xent_pos_bwd = hpu__cuops_xent_pos_bwd,
	.accuracy_pos = hpu__cuops_accuracy_pos,
	.heads = hpu__cuops_heads,
	.mask_scores = hpu__cuops_mask_scores,
	.dropout_rows = hpu__cuops_dropout_rows,
	.dropout_keys = hpu__cuops_dropout_keys,
	.batchnorm_fwd = hpu__cuops_batchnorm_fwd,
	.batchnorm_bwd = hpu__cuops_batchnorm_bwd,
	.reduce_fwd = hpu__cuops_reduce_fwd,
	.reduce_bwd = hpu__cuops_reduce_bwd,
	.copy_rows = hpu__cuops_copy_rows,
	.zero = hpu__cuops_zero,
	.permute = hpu__cuops_permute,
	.sigmoid_fwd = hpu__cuops_sigmoid_fwd,
	.sigmoid_bwd = hpu__cuops_sigmoid_bwd,
	.pool1d_fwd = hpu__cuops_pool1d_fwd,
	.pool1d_bwd = hpu__cuops_pool1d_bwd,
	.conv_rect_fwd = hpu__cuops_conv_rect_fwd,
	.conv_rect_bwd = hpu__cuops_conv_rect_bwd,
	.mse_fwd = hpu__cuops_mse_fwd,
	.mse_bwd = hpu__cuops_mse_bwd,
	.bce_fwd = hpu__cuops_bce_fwd,
	.bce_bwd = hpu__cuops_bce_bwd,
	.ids_first_bad = hpu__cuops_ids_first_bad,
	.attention_fwd = hpu__cuops_attention_fwd,
	.attention_bwd = hpu__cuops_attention_bwd,
	.flash_fwd = hpu__cuops_flash_fwd,
	.flash_bwd = hpu__cuops_flash_bwd,
	.flash16_fwd = hpu__cuops_flash16_fwd,
	.flash16_bwd = hpu__cuops_flash16_bwd,
};

const hpu__backend *hpu__cuda_backend(void)
{
	return &cuda_backend;
}
