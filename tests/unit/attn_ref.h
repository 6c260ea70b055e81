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

/* The tests' key masks: attn_mask13 [3 x 13], padding in the middle and at
 * the end and sample 2 all padding; attn_mask7 [2 x 7], key 0 padding (a
 * causal query 0 has no key). */
extern const int32_t attn_mask13[3 * 13], attn_mask7[2 * 7];

/* The values that must be exact zeros and are not: ctx and dq (dqkv's q
 * part) of a query with no key to attend to and, where pads is not NULL,
 * dk and dv of a padding key (D = heads * hd). *empties and *pads count
 * those rows. */
size_t attn_zeros_wrong(const float *ctx, const float *dqkv, const int32_t *mask, int batch,
			int t, size_t d, int causal, int *empties, int *pads);

#endif
