/* ops_heads: the attention layer's own passes (worker/layers/seq.c) as
 * ops on the kernel table (backend.h): the head-major copies of q, k, v
 * and their gradients, and the masking of the scores; the table's kernel,
 * else on the CPU's tables the C loops here (hpu__be_host's). */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "common/simd.h"
#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"

#include "hpu/hpu.h"
#include "hpu/ops.h"

/* Where row i of head h of sample b starts in a head-major array. */
static size_t hrow(int heads, int t, int hd, int b, int h, int i)
{
	return (((size_t)b * heads + h) * t + i) * hd;
}

/* The copies, one sample row (b, i) at a time: its `heads` rows of hd
 * values, side by side at the strided end (row stride ld), go to or come
 * from row i of each head. Each value is multiplied by mul alone, so the
 * vector clones (simd.h) give the baseline's bits; the order of the loops
 * only makes the strided side contiguous. (The loops over h then i it
 * replaces read 2 of every 12 cache lines of qkv in turn; issue 38.) */
HPU_CLONES static void heads_rows(int merge, const float *restrict src, float *restrict dst,
				  size_t ld, int batch, int heads, int t, int hd, float mul)
{
	for (int b = 0; b < batch; b++)
		for (int i = 0; i < t; i++) {
			size_t strided = ((size_t)b * t + i) * ld;
			for (int h = 0; h < heads; h++) {
				size_t major = hrow(heads, t, hd, b, h, i);
				const float *r = merge ? src + major : src + strided + (size_t)h * hd;
				float *o = merge ? dst + strided + (size_t)h * hd : dst + major;
				for (int e = 0; e < hd; e++)
					o[e] = r[e] * mul;
			}
		}
}

/* split: dst[b, h, i, :] = src[b, i, h*hd ..] * mul (row stride ld);
 * merge: the inverse, dst[b, i, h*hd ..] = src[b, h, i, :] * mul. */
int hpu__host_heads(int merge, const float *src, float *dst, size_t ld, int batch, int heads,
		    int t, int hd, float mul)
{
	heads_rows(merge, src, dst, ld, batch, heads, t, hd, mul);
	return HPU_BE_OK;
}

/* One row of the scores: `no` at keys [end, t) and at the keys before
 * end that m (NULL: none) masks. Pure stores (a masked key's value is
 * replaced, the others are written back as they were), so the vector
 * clones give the baseline's bits. */
HPU_CLONES static void mask_row(float *restrict row, const int32_t *restrict m, int end, int t,
				float no)
{
	if (m)
		for (int j = 0; j < end; j++)
			row[j] = m[j] ? row[j] : no;
	for (int j = end; j < t; j++)
		row[j] = no;
}

/* Before the softmax (after == 0): -inf at the scores a query may not
 * attend to (causal: keys after it; masked keys), and a row with none it
 * may gets zeros. After: exact zeros at those places and rows. Query i
 * may attend to key j when (!causal || j <= i) && (!mask || mask[j]). */
int hpu__host_mask_scores(float *att, const int32_t *mask, int batch, int heads, int t,
			  int causal, int after)
{
	const float no = after ? 0.0f : -INFINITY;
	for (int b = 0; b < batch; b++) {
		const int32_t *m = mask ? mask + (size_t)b * t : NULL;
		int first = 0; /* the first key any query may attend to; t: none */
		while (m && first < t && !m[first])
			first++;
		for (int h = 0; h < heads; h++)
			for (int i = 0; i < t; i++) {
				float *row = att + (((size_t)b * heads + h) * t + i) * t;
				int end = causal ? i + 1 : t; /* keys from end on: never */
				if (first >= end)             /* none: a row of zeros */
					memset(row, 0, (size_t)t * sizeof *row);
				else
					mask_row(row, m, end, t, no);
			}
	}
	return HPU_BE_OK;
}

static int heads_op(int merge, const float *src, float *dst, size_t ld, int batch, int heads,
		    int t, int hd, float mul)
{
	int rc = HPU__BE_RUN(heads, hpu__host_heads, merge, src, dst, ld, batch, heads, t, hd,
			     mul);
	return rc == HPU_BE_OK ? HPU_OK : HPU_ERROR;
}

int hpu_split_heads(const float *src, size_t ld, float *dst, int batch, int heads, int t,
		    int hd, float mul)
{
	return heads_op(0, src, dst, ld, batch, heads, t, hd, mul);
}

int hpu_merge_heads(const float *src, float *dst, size_t ld, int batch, int heads, int t,
		    int hd, float mul)
{
	return heads_op(1, src, dst, ld, batch, heads, t, hd, mul);
}

int hpu_mask_scores(float *att, const int32_t *mask, int batch, int heads, int t, int causal,
		    int after)
{
	int rc = HPU__BE_RUN(mask_scores, hpu__host_mask_scores, att, mask, batch, heads, t,
			     causal, after);
	return rc == HPU_BE_OK ? HPU_OK : HPU_ERROR;
}
