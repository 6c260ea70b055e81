/* cuops_layers: the CUDA kernels of the layers' own passes
 * (cuops_layers.cu), each behind a C launcher that queues it on `st` and
 * returns the launch's error. Shapes and semantics are those of the
 * hpu__backend entries of the same names (worker/ops/backend.h); every
 * pointer is device memory. */
#ifndef HPU_CUOPS_LAYERS_H
#define HPU_CUOPS_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* term: rows * positions doubles of scratch; *bad (set to all ones
 * first) becomes the smallest position whose label is outside
 * [0, classes) and not -100. */
cudaError_t hpu__cuk_xent_pos_fwd(const float *logits, const int32_t *labels, float *lse,
				  float *loss, int rows, size_t positions, int classes,
				  double *term, unsigned long long *bad, cudaStream_t st);
cudaError_t hpu__cuk_xent_pos_bwd(const float *logits, const int32_t *labels, const float *lse,
				  const float *dloss, float *dx, int rows, size_t positions,
				  int classes, cudaStream_t st);
/* hit: rows * positions ints of scratch; bad as above. */
cudaError_t hpu__cuk_accuracy_pos(const float *logits, const int32_t *labels, float *acc,
				  int rows, size_t positions, int classes, int *hit,
				  unsigned long long *bad, cudaStream_t st);

cudaError_t hpu__cuk_heads(int merge, const float *src, float *dst, size_t ld, int batch,
			   int heads, int t, int hd, float mul, cudaStream_t st);
cudaError_t hpu__cuk_mask_scores(float *att, const int32_t *mask, int batch, int heads, int t,
				 int causal, int after, cudaStream_t st);

/* keys: rows uint64 in device memory. */
cudaError_t hpu__cuk_dropout_rows(const float *x, float *y, const uint64_t *keys, int rows,
				  size_t n, uint32_t cut, float scale, cudaStream_t st);
/* keys[rows] from seed, layer, *step and samples[rows] (NULL: the row's
 * index), device memory all (backend.h's dropout_keys). */
cudaError_t hpu__cuk_dropout_keys(uint64_t *keys, const uint32_t *samples, const int64_t *step,
				  uint64_t seed, int layer, int rows, cudaStream_t st);

cudaError_t hpu__cuk_batchnorm_fwd(const float *x, float *y, const float *w, const float *bias,
				   float *run_mean, float *run_var, float *saved, int batch,
				   int ch, size_t spatial, float eps, float momentum, int train,
				   int update, cudaStream_t st);
cudaError_t hpu__cuk_batchnorm_bwd(const float *x, const float *dy, const float *w,
				   const float *saved, float *dw, float *dbias, float *dx,
				   int batch, int ch, size_t spatial, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
