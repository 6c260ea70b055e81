/* cuda_kernels: the runtime ops' kernels (cuda_rt.cu), launched on a
 * stream, behind a C interface of plain types so that the device's C
 * code (cuda_device.c) needs no CUDA C++. Their arithmetic is
 * cuda_elem.h's, which rounds as worker/device/device_ops.c does.
 * Pointers are device memory. Internal to worker/cuda. */
#ifndef HPU_CUDA_KERNELS_H
#define HPU_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "worker/cuda/cuda_elem.h"

#ifdef __cplusplus
extern "C" {
#endif


cudaError_t hpu__cuda_k_to16(cudaStream_t s, int fp16, uint16_t *dst, const float *src, size_t n);
cudaError_t hpu__cuda_k_from16(cudaStream_t s, int fp16, float *dst, const uint16_t *src,
			       size_t n);
cudaError_t hpu__cuda_k_acc16(cudaStream_t s, int fp16, uint16_t *dst, const float *src,
			      size_t n);
/* flag[0] |= 1 where some x[k] is not a bf16 value */
cudaError_t hpu__cuda_k_bf16_exact(cudaStream_t s, uint16_t *dst, const float *x, size_t n,
				   unsigned *flag);
cudaError_t hpu__cuda_k_bf16_expand(cudaStream_t s, float *dst, const uint16_t *src, size_t n);
cudaError_t hpu__cuda_k_add(cudaStream_t s, float *dst, const float *src, size_t n);
cudaError_t hpu__cuda_k_add_scalar(cudaStream_t s, float *dst, float v, size_t n);
/* out[0] = the sum of v[n] in double, in order (one thread) */
cudaError_t hpu__cuda_k_sum(cudaStream_t s, double *out, const float *v, size_t n);
/* An evaluation's sums (hpu__dev_rtops' rows_add, loss_add; one thread) */
cudaError_t hpu__cuda_k_rows_add(cudaStream_t s, double *acc, const float *v, size_t n,
				 const int *rows);
cudaError_t hpu__cuda_k_loss_add(cudaStream_t s, double *acc, const double *sums,
				 const double *w, int nloss, const int *rows);
/* part[b] = block b's sum of squares (n / 256 blocks, fp32 in 16 lanes
 * summed pairwise, redone in double where not finite), part[n / 256] the
 * rest's in double: the host adds them in order. */
cudaError_t hpu__cuda_k_sumsq_parts(cudaStream_t s, const float *g, size_t n, double *part);
/* flag[0] |= 1 for an Inf or NaN */
cudaError_t hpu__cuda_k_nonfinite(cudaStream_t s, const float *g, size_t n, unsigned *flag);
cudaError_t hpu__cuda_k_nonfinite16(cudaStream_t s, int fp16, const uint16_t *g, size_t n,
				    unsigned *flag);
/* cnt[0] += the Inf and NaN */
cudaError_t hpu__cuda_k_count_nonfinite(cudaStream_t s, const float *v, size_t n,
					unsigned long long *cnt);
cudaError_t hpu__cuda_k_count_nonfinite16(cudaStream_t s, const uint16_t *v, size_t n,
					  unsigned long long *cnt);
/* One optimizer pass. g16 != NULL: the gradients are 16-bit (fp16 picks
 * the type) and g is not read; p16 != NULL: p's rounding is stored there
 * too. m, v: NULL where the optimizer keeps none. */
cudaError_t hpu__cuda_k_optim(cudaStream_t s, const hpu__cuda_optk *k, float *p, const float *g,
			      const uint16_t *g16, int fp16, uint16_t *p16, float *m, float *v,
			      size_t n);
/* The same pass with lr, t and gscale read from o->sv (device memory) on
 * the device, the other scalars o's; none where sv->skip is set. */
cudaError_t hpu__cuda_k_optim_sv(cudaStream_t s, const hpu__dev_optim *o, float *p,
				 const float *g, const uint16_t *g16, int fp16, uint16_t *p16,
				 float *m, float *v, size_t n);

/* The step's decisions (device.h's hpu__dev_rtops, flag_nonfinite to
 * step_end): kernels only, nothing read back. */
/* flag[0] = 1.0f where g[n] holds an Inf or NaN (else left as it is) */
cudaError_t hpu__cuda_k_flag_nonfinite(cudaStream_t s, float *flag, const float *g, size_t n);
cudaError_t hpu__cuda_k_flag_nonfinite16(cudaStream_t s, float *flag, int fp16,
					 const uint16_t *g, size_t n);
/* part[0, count) = parts b0 .. b0 + count - 1 of g[n]'s sum of squares
 * (hpu__elem_sumsq_part; n / 256 + 1 parts in all) */
cudaError_t hpu__cuda_k_sumsq_parts_at(cudaStream_t s, const float *g, size_t n, size_t b0,
				       size_t count, double *part);
/* *acc += the sums of squares of chunks j0 .. j0 + nj - 1 of the 16-bit
 * h[n] in chunks of `chunk`, each chunk's added in order as
 * device_ops.c's sumsq16 adds them; scratch: nj * (chunk / 256 + 2)
 * doubles (hpu__elem_sumsq16_batch). Three launches. */
cudaError_t hpu__cuda_k_sumsq16_batch(cudaStream_t s, int fp16, const uint16_t *h, size_t n,
				     size_t chunk, size_t j0, size_t nj, double *acc,
				     double *scratch);
/* One thread adds part[count] in order onto 0 (first) or *total; then
 * *acc += that where acc != NULL, else it is kept in *total. */
cudaError_t hpu__cuda_k_sumsq_fold(cudaStream_t s, const double *part, size_t count,
				   double *total, int first, double *acc);
/* g[n] += hpu__elem_loss_seed(sums, ..., sv->loss_scale); sv->bad = 1
 * where that is NaN (a sum not finite) */
cudaError_t hpu__cuda_k_loss_seed(cudaStream_t s, float *g, size_t n, const double *sums,
				  int nsums, float weight, float base, int batch,
				  hpu__dev_stepvars *sv);
/* One thread each: hpu__elem_step_begin, hpu__elem_step_end on sv (*c
 * passed by value). */
cudaError_t hpu__cuda_k_step_begin(cudaStream_t s, hpu__dev_stepvars *sv,
				   const hpu__dev_stepcfg *c);
cudaError_t hpu__cuda_k_step_end(cudaStream_t s, hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c);

#ifdef __cplusplus
}
#endif

#endif
