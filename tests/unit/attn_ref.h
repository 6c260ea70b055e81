/* attn_ref: the attention layer's unfused math (worker/layers/seq.c:
 * scores, masking as hpu_mask_scores, softmax, products; backward through
 * the softmax) in double, over qkv[B, T, 3D] with an optional key
 * mask[B, T], for the fused attention's tests (test_flash_rows,
 * test_cuda_ops_more). A query with no key gets zeros and lse 0. */
#ifndef HPU_TEST_ATTN_REF_H
#define HPU_TEST_ATTN_REF_H

#include <stdint.h>

/* ctx[B, T, D] and lse[B, heads, T]; with dctx (not NULL) also dqkv[B,
 * T, 3D]. */
void attn_ref(const float *qkv, const int32_t *mask, const float *dctx, int batch, int t,
	      int heads, int hd, int causal, double *ctx, double *lse, double *dqkv);

#endif
