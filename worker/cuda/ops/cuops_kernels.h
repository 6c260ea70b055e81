/* cuops_kernels: the CUDA kernels of our own (cuops_kernels.cu), each
 * behind a C launcher that queues it on `st` and returns the launch's
 * error (cudaSuccess when queued). Shapes and semantics are those of the
 * hpu__backend entries (worker/ops/backend.h) of the same names; every
 * pointer is device memory. */
#ifndef HPU_CUOPS_KERNELS_H
#define HPU_CUOPS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y[n] = the fp32 values of bf16 x[n] (exact). */
cudaError_t hpu__cuk_bf16_to_f32(const uint16_t *x, float *y, size_t n, cudaStream_t st);

/* c[count][m, n] (products stride_c apart) = bias[n] on every row, or 0
 * (bias NULL); with accumulate c += bias[n] (or c left alone): a product
 * with k = 0, and the bias of one whose epilogue could not take it. */
cudaError_t hpu__cuk_gemm_k0(float *c, const float *bias, int count, int m, int n,
			     size_t stride_c, int accumulate, cudaStream_t st);

/* Pooling, NCHW, square window k, stride, no padding. Max: the first
 * maximum of the window read in row-major order, idx its position ih*w+iw
 * in its plane. The backwards gather: each input sums its outputs in the
 * reference's order, so the results are the CPU's bit for bit. */
cudaError_t hpu__cuk_maxpool_fwd(const float *x, float *y, int32_t *idx, int planes, int h,
				 int w, int k, int stride, cudaStream_t st);
cudaError_t hpu__cuk_maxpool_bwd(const float *dy, const int32_t *idx, float *dx, int planes,
				 int h, int w, int k, int stride, cudaStream_t st);
cudaError_t hpu__cuk_avgpool_fwd(const float *x, float *y, int planes, int h, int w, int k,
				 int stride, cudaStream_t st);
cudaError_t hpu__cuk_avgpool_bwd(const float *dy, float *dx, int planes, int h, int w, int k,
				 int stride, cudaStream_t st);

/* op: hpu__eltwise (0 relu, 1 GELU tanh, 2 tanh). */
cudaError_t hpu__cuk_eltwise_fwd(int op, const float *x, float *y, size_t n, cudaStream_t st);
cudaError_t hpu__cuk_eltwise_bwd(int op, const float *at, const float *dy, float *dx,
				 size_t n, cudaStream_t st);

cudaError_t hpu__cuk_softmax_fwd(const float *x, float *y, int rows, int cols,
				 cudaStream_t st);
cudaError_t hpu__cuk_softmax_bwd(const float *y, const float *dy, float *dx, int rows,
				 int cols, cudaStream_t st);

cudaError_t hpu__cuk_layernorm_fwd(const float *x, const float *gamma, const float *beta,
				   float *y, float *mean, float *rstd, int rows, int cols,
				   float eps, cudaStream_t st);
/* partial: hpu__cuk_layernorm_partials(rows, cols) floats of scratch. */
size_t hpu__cuk_layernorm_partials(int rows, int cols);
cudaError_t hpu__cuk_layernorm_bwd(const float *x, const float *gamma, const float *mean,
				   const float *rstd, const float *dy, float *dx, float *dgamma,
				   float *dbeta, int rows, int cols, float *partial,
				   cudaStream_t st);

/* key, thresh and scale as ops_nn.c's dropout computes them on the host. */
cudaError_t hpu__cuk_dropout_fwd(const float *x, float *y, uint8_t *mask, size_t n,
				 uint64_t key, uint32_t thresh, float scale, int drop_all,
				 cudaStream_t st);
cudaError_t hpu__cuk_dropout_bwd(const float *dy, const uint8_t *mask, float *dx, size_t n,
				 float scale, cudaStream_t st);

/* An id outside [0, vocab) is left alone: a row of zeros forward,
 * nothing added backward (backend.h). */
cudaError_t hpu__cuk_embedding_fwd(const float *table, const int32_t *ids, float *y, int n,
				   int vocab, int dim, cudaStream_t st);
cudaError_t hpu__cuk_embedding_bwd(const int32_t *ids, const float *dy, float *dtable, int n,
				   int vocab, int dim, cudaStream_t st);

/* Writes the mean loss (fp32) to *loss_dev; row_loss: batch doubles of
 * scratch. */
cudaError_t hpu__cuk_softmax_xent(const float *logits, const int32_t *labels, float *dlogits,
				  int batch, int classes, double *row_loss, float *loss_dev,
				  cudaStream_t st);

/* The ops' own passes (backend.h's bias_grad, round, to_bf16, from16,
 * add). bias_grad: db[cols] += column sums of dy (bf16 when bf16), the
 * rows summed in chunks and the chunks in order (deterministic);
 * partial: hpu__cuk_bias_grad_partials(rows, cols) floats of scratch.
 * The conversions give common/lowp.h's bits. */
size_t hpu__cuk_bias_grad_partials(int rows, int cols);
cudaError_t hpu__cuk_bias_grad(int bf16, const void *dy, float *db, int rows, int cols,
			       float *partial, cudaStream_t st);
cudaError_t hpu__cuk_round(int fp16, const float *x, float *y, size_t n, cudaStream_t st);
cudaError_t hpu__cuk_to_bf16(const float *x, uint16_t *y, size_t n, cudaStream_t st);
cudaError_t hpu__cuk_from16(int fp16, const uint16_t *x, float *y, size_t n,
			    cudaStream_t st);
cudaError_t hpu__cuk_add(const float *x, float *y, size_t n, cudaStream_t st);

/* fp8 (worker/ops/fp8.h). amax: *out (device, one uint32: the bits of
 * a float >= 0) = max(*out, max |x|), NaN ignored; zero it first.
 * fake_quant: y = fp8(x * scale) * inv, the format given by its largest
 * value, smallest normal (tiny), the magic number rounding to its
 * subnormal grid, the mantissa bits dropped (keep = 2^shift - 1) and
 * whether it has infinities, as fp8.c's fake_quant. */
cudaError_t hpu__cuk_amax(const float *x, size_t n, uint32_t *out, cudaStream_t st);
cudaError_t hpu__cuk_fp8_fake_quant(const float *x, float *y, size_t n, float scale,
				    float inv, float max, float tiny, float magic, uint32_t keep,
				    int shift, int has_inf, cudaStream_t st);
/* fp8 training's state on the device (worker/ops/fp8.h, backend.h's
 * fp8_amax_scale, fp8_quant_at, fp8_roll), `max` the format's largest
 * value: amax_scale takes x's amax into sc[1] (scratch), then step[0] =
 * it where larger, step[1] = 1, and sc[0] = its scale where sc[0] is 0.
 * quant_at: fake_quant at s = *scale (1 where 0), inv = 1 / s. roll: the
 * chunk's instances [0, count), their step pairs at step[(i * 3 + t) *
 * 2], scale pairs at scale[(i * 3 + t) * 2], histories at hist[i *
 * stride] (slots filled, next slot, then history floats per tensor);
 * use_max: the history's largest amax, else the latest. */
cudaError_t hpu__cuk_fp8_amax_scale(const float *x, size_t n, float *step, float *sc,
				    float max, int margin, cudaStream_t st);
cudaError_t hpu__cuk_fp8_quant_at(const float *x, float *y, size_t n, const float *scale,
				  float max, float tiny, float magic, uint32_t keep, int shift,
				  int has_inf, cudaStream_t st);
/* fp8_quant8 (backend.h): q = the fp8 bytes of x[rows, cols] * s (s =
 * sc[0], 1 where 0), [cols, rows] when trans, the format as fake_quant's
 * constants say and its bits (mbits, emin, bias); sc[1] = 1 / s. */
cudaError_t hpu__cuk_fp8_quant8(const float *x, uint8_t *q, int rows, int cols, int trans,
				float *sc, float max, float tiny, float magic, uint32_t keep,
				int shift, int has_inf, int mbits, int emin, int bias,
				cudaStream_t st);
cudaError_t hpu__cuk_fp8_roll(float *step, float *scale, float *hist, size_t stride,
			      int count, int history, int use_max, int margin, float max_e4m3,
			      float max_e5m2, cudaStream_t st);

/* *bad (device int, zeroed first) = 1 when some ids[n] is outside
 * [0, limit). */
cudaError_t hpu__cuk_ids_check(const int32_t *ids, int n, int limit, int *bad,
			       cudaStream_t st);
/* *correct (device int, zeroed first) += the rows whose first arg-max is
 * their label (a label outside [0, classes) never matches). */
cudaError_t hpu__cuk_count_correct(const float *logits, const int32_t *labels, int batch,
				   int classes, int *correct, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
