/* backend_vec: the CPU table's own AVX-512 loops, for the passes where
 * neither oneDNN's primitives nor the compiler's vectorization of the
 * reference loops come near the memory's speed (issue 38: the CNN's
 * pooling and ReLU backward, gpt_lm's GELU). Each gives the reference kernel's bits
 * (ops_ref.h), ties, NaN and signed zeros included, and answers
 * HPU_BE_UNSUPPORTED (nothing written) where it does not apply: a CPU
 * without AVX-512F, a build without GCC's intrinsics, a window other than
 * 2x2 with stride 2. The oneDNN table (backend_dnnl.c) names them.
 */
#ifndef HPU_BACKEND_VEC_H
#define HPU_BACKEND_VEC_H

#include <stddef.h>
#include <stdint.h>

#include "worker/ops/backend.h"

/* 1 when this build and CPU run the loops below (else every one answers
 * HPU_BE_UNSUPPORTED). */
int hpu__vec_ok(void);

/* Max pooling, 2x2 window, stride 2, as hpu__ref_maxpool2d_forward: each
 * window read in row-major order, a strictly larger value replacing the
 * best (ties and a NaN after the first element keep the earlier one), idx
 * the arg-max's position ih*W + iw in its plane. */
int hpu__vec_maxpool_fwd(const float *x, float *y, int32_t *idx, int batch, int ch, int h,
			 int w, int k, int stride);

/* Its backward, as hpu__ref_maxpool2d_backward (dx zeroed, then
 * dx[idx] += dy): the windows do not overlap, so each input gets 0 + dy
 * or 0 (+0 where dy is -0, as the reference's sum gives). idx must be
 * what hpu__vec_maxpool_fwd or the reference wrote (a position inside
 * its own window). */
int hpu__vec_maxpool_bwd(const float *dy, const int32_t *idx, float *dx, int batch, int ch,
			 int h, int w, int k, int stride);

/* ReLU backward, as hpu__ref_relu_backward: dx = y > 0 ? dy : +0 (NaN in
 * y gives 0). dx may be dy. Large arrays are written with streaming
 * stores (no read of dx's lines before they are written). */
int hpu__vec_relu_bwd(const float *y, const float *dy, float *dx, size_t n);

/* GELU (tanh form) forward and backward, as hpu__ref_gelu_forward and
 * hpu__ref_gelu_backward (ops_nn.c), bit for bit for every input: the
 * same operations in the same order, the clamp of its exp as a max and a
 * min that keep a NaN. dx may be dy. */
int hpu__vec_gelu_fwd(const float *x, float *y, size_t n);
int hpu__vec_gelu_bwd(const float *x, const float *dy, float *dx, size_t n);

#endif
