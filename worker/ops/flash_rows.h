/* flash_rows: fused (flash-style) attention's arithmetic, one row at a
 * time, written once for the CUDA kernels (worker/cuda/ops/cuops_flash.cu,
 * nvcc: __host__ __device__) and for plain C (the host table's loops in
 * ops_flash.c, and tests/unit/test_flash_rows.c, which runs the same rows
 * against the attention layer's unfused math in double on every machine).
 * A kernel only decides which thread runs which row.
 *
 * Layout (hpu_attention_fused_forward, ops.h): qkv[B, T, 3D] with q, k,
 * v of head h at columns h*hd, D + h*hd, 2D + h*hd (row stride 3D);
 * ctx and dctx [B, T, D]; lse [B, heads, T]; an optional key mask[B, T]
 * (1 a real token). Query i may attend to key j when (!causal || j <= i)
 * and mask[j] (hpu_mask_scores' rule); a query with no such key gets
 * zeros (and lse 0, never read). Scores s = scale * q.k, scale =
 * 1/sqrt(hd); sums in fp32, in key order.
 *
 * Forward (one query row): the online softmax over the allowed keys,
 * rescaling the running sum and output when the maximum grows.
 * Backward (FlashAttention-2's): D_i = dO_i . O_i; P_ij = exp(s_ij -
 * lse_i); dS_ij = P_ij (dO_i . v_j - D_i); dq_i = scale sum_j dS_ij k_j
 * (one query row), dk_j = scale sum_i dS_ij q_i and dv_j = sum_i P_ij
 * dO_i (one key row). Internal to worker/ops and worker/cuda. */
#ifndef HPU_FLASH_ROWS_H
#define HPU_FLASH_ROWS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define HPU_FLASH __host__ __device__ static inline
/* a loop over a row's hd values: unrolled where hd is known when the
 * kernel is compiled (cuops_flash.cu's kernels for hd 32 and 64), so that
 * the row's arrays are registers, not local memory */
#ifdef __CUDA_ARCH__ /* the device pass (the host compiler knows no such pragma) */
#define HPU_FLASH_UNROLL _Pragma("unroll")
#else
#define HPU_FLASH_UNROLL
#endif
#else
#include <math.h>
#define HPU_FLASH static inline
#define HPU_FLASH_UNROLL
#endif

typedef struct hpu__flash_dims {
	int batch, t, heads, hd;
	int causal;
	float scale; /* 1 / sqrt(hd) */
} hpu__flash_dims;

/* Where part (0 q, 1 k, 2 v) of position i of head h of sample b starts
 * in qkv[B, T, 3D]. */
HPU_FLASH size_t hpu__flash_qkv_at(const hpu__flash_dims *a, int b, int h, int i, int part)
{
	size_t d = (size_t)a->heads * a->hd;
	return ((size_t)b * a->t + i) * 3 * d + (size_t)part * d + (size_t)h * a->hd;
}

/* ... of head h of position i in ctx[B, T, D]. */
HPU_FLASH size_t hpu__flash_ctx_at(const hpu__flash_dims *a, int b, int h, int i)
{
	return ((size_t)b * a->t + i) * a->heads * a->hd + (size_t)h * a->hd;
}

/* The row index (b, h, i) of lse[B, heads, T]. */
HPU_FLASH size_t hpu__flash_row_at(const hpu__flash_dims *a, int b, int h, int i)
{
	return ((size_t)b * a->heads + h) * a->t + i;
}

HPU_FLASH float hpu__flash_dot(const float *x, const float *y, int n)
{
	float s = 0.0f;
	HPU_FLASH_UNROLL
	for (int e = 0; e < n; e++)
		s += x[e] * y[e];
	return s;
}

/* src[n], or where buf is not NULL its copy there (a thread's own row,
 * read once per key: on a GPU a local copy is read coalesced). */
HPU_FLASH const float *hpu__flash_keep(const float *src, float *buf, int n)
{
	if (!buf)
		return src;
	HPU_FLASH_UNROLL
	for (int e = 0; e < n; e++)
		buf[e] = src[e];
	return buf;
}

/* Key j of sample b is a real token (no mask: all are). */
HPU_FLASH int hpu__flash_key(const hpu__flash_dims *a, const int32_t *mask, int b, int j)
{
	return !mask || mask[(size_t)b * a->t + j] != 0;
}

/* Query i of head h of sample b: its ctx row (hd floats) and lse.
 * acc: hd floats of the caller's for the running output (may be the ctx
 * row itself); qbuf: NULL, or hd floats to keep the query row in. */
HPU_FLASH void hpu__flash_fwd_row(const hpu__flash_dims *a, const float *qkv,
				  const int32_t *mask, float *ctx, float *lse, float *acc,
				  float *qbuf, int b, int h, int i)
{
	const int hd = a->hd, end = a->causal ? i + 1 : a->t;
	const float *q = hpu__flash_keep(qkv + hpu__flash_qkv_at(a, b, h, i, 0), qbuf, hd);
	float mx = 0.0f, l = 0.0f;
	int any = 0;
	for (int j = 0; j < end; j++) {
		if (!hpu__flash_key(a, mask, b, j))
			continue;
		const float *k = qkv + hpu__flash_qkv_at(a, b, h, j, 1);
		const float *v = qkv + hpu__flash_qkv_at(a, b, h, j, 2);
		float s = hpu__flash_dot(q, k, hd) * a->scale;
		if (!any) {
			mx = s;
			HPU_FLASH_UNROLL
			for (int e = 0; e < hd; e++)
				acc[e] = 0.0f;
			any = 1;
		} else if (s > mx) {
			float c = expf(mx - s);
			l *= c;
			HPU_FLASH_UNROLL
			for (int e = 0; e < hd; e++)
				acc[e] *= c;
			mx = s;
		}
		float p = expf(s - mx);
		l += p;
		HPU_FLASH_UNROLL
		for (int e = 0; e < hd; e++)
			acc[e] += p * v[e];
	}
	float *o = ctx + hpu__flash_ctx_at(a, b, h, i);
	HPU_FLASH_UNROLL
	for (int e = 0; e < hd; e++)
		o[e] = any ? acc[e] / l : 0.0f;
	lse[hpu__flash_row_at(a, b, h, i)] = any ? mx + logf(l) : 0.0f;
}

/* D_i = dO_i . O_i of query i of head h of sample b. */
HPU_FLASH float hpu__flash_delta_row(const hpu__flash_dims *a, const float *ctx,
				     const float *dctx, int b, int h, int i)
{
	size_t at = hpu__flash_ctx_at(a, b, h, i);
	return hpu__flash_dot(dctx + at, ctx + at, a->hd);
}

/* dq of query i (dqkv's q part of its row; every element written), given
 * its D_i. acc: hd floats of the caller's (may be the dq row itself);
 * qbuf, dobuf: NULL, or hd floats each to keep the q and dO rows in. */
HPU_FLASH void hpu__flash_dq_row(const hpu__flash_dims *a, const float *qkv,
				 const int32_t *mask, const float *lse, const float *dctx,
				 float delta, float *dqkv, float *acc, float *qbuf, float *dobuf,
				 int b, int h, int i)
{
	const int hd = a->hd, end = a->causal ? i + 1 : a->t;
	const float *q = hpu__flash_keep(qkv + hpu__flash_qkv_at(a, b, h, i, 0), qbuf, hd);
	const float *dO = hpu__flash_keep(dctx + hpu__flash_ctx_at(a, b, h, i), dobuf, hd);
	const float lse_i = lse[hpu__flash_row_at(a, b, h, i)];
	HPU_FLASH_UNROLL
	for (int e = 0; e < hd; e++)
		acc[e] = 0.0f;
	for (int j = 0; j < end; j++) {
		if (!hpu__flash_key(a, mask, b, j))
			continue;
		const float *k = qkv + hpu__flash_qkv_at(a, b, h, j, 1);
		const float *v = qkv + hpu__flash_qkv_at(a, b, h, j, 2);
		float p = expf(hpu__flash_dot(q, k, hd) * a->scale - lse_i);
		float ds = p * (hpu__flash_dot(dO, v, hd) - delta);
		HPU_FLASH_UNROLL
		for (int e = 0; e < hd; e++)
			acc[e] += ds * k[e];
	}
	float *dq = dqkv + hpu__flash_qkv_at(a, b, h, i, 0);
	HPU_FLASH_UNROLL
	for (int e = 0; e < hd; e++)
		dq[e] = acc[e] * a->scale;
}

/* dk and/or dv of key j (want: 1 dk, 2 dv, 3 both; dqkv's k and v parts
 * of its row; every element of what is wanted written, zeros at a padding
 * key), given delta[B, heads, T] (the D_i). acck, accv: hd floats each of
 * the caller's (may be the rows themselves; the one not wanted may be
 * NULL); kbuf, vbuf: NULL, or hd floats each to keep the k and v rows in
 * (vbuf unused without dk). The queries are walked from the last one
 * down, so that the threads of consecutive keys read the same query row
 * together. dk and dv apart compute the same P and dS with the same
 * operations, and each accumulator's additions come in the same order:
 * the same bits as both at once (a GPU thread then holds fewer rows:
 * cuops_flash.cu's kernels for hd 64). */
HPU_FLASH void hpu__flash_kv_rows(const hpu__flash_dims *a, const float *qkv,
				  const int32_t *mask, const float *lse, const float *dctx,
				  const float *delta, float *dqkv, float *acck, float *accv,
				  float *kbuf, float *vbuf, int b, int h, int j, int want)
{
	const int hd = a->hd, wk = (want & 1) != 0, wv = (want & 2) != 0;
	const float *k = hpu__flash_keep(qkv + hpu__flash_qkv_at(a, b, h, j, 1), kbuf, hd);
	const float *v = wk ? hpu__flash_keep(qkv + hpu__flash_qkv_at(a, b, h, j, 2), vbuf, hd)
			    : NULL;
	HPU_FLASH_UNROLL
	for (int e = 0; e < hd; e++) {
		if (wk)
			acck[e] = 0.0f;
		if (wv)
			accv[e] = 0.0f;
	}
	/* every query at or after j (all, not causal) may attend to a real
	 * key j, so its lse is set */
	const int start = hpu__flash_key(a, mask, b, j) ? (a->causal ? j : 0) : a->t;
	for (int i = a->t - 1; i >= start; i--) {
		size_t r = hpu__flash_row_at(a, b, h, i);
		const float *q = qkv + hpu__flash_qkv_at(a, b, h, i, 0);
		const float *dO = dctx + hpu__flash_ctx_at(a, b, h, i);
		float p = expf(hpu__flash_dot(q, k, hd) * a->scale - lse[r]);
		if (wv) {
			HPU_FLASH_UNROLL
			for (int e = 0; e < hd; e++)
				accv[e] += p * dO[e];
		}
		if (wk) {
			float ds = p * (hpu__flash_dot(dO, v, hd) - delta[r]);
			HPU_FLASH_UNROLL
			for (int e = 0; e < hd; e++)
				acck[e] += ds * q[e];
		}
	}
	float *dk = dqkv + hpu__flash_qkv_at(a, b, h, j, 1);
	float *dv = dqkv + hpu__flash_qkv_at(a, b, h, j, 2);
	HPU_FLASH_UNROLL
	for (int e = 0; e < hd; e++) {
		if (wk)
			dk[e] = acck[e] * a->scale;
		if (wv)
			dv[e] = accv[e];
	}
}

/* dk and dv of key j at once (hpu__flash_kv_rows, want 3). */
HPU_FLASH void hpu__flash_dkv_row(const hpu__flash_dims *a, const float *qkv,
				  const int32_t *mask, const float *lse, const float *dctx,
				  const float *delta, float *dqkv, float *acck, float *accv,
				  float *kbuf, float *vbuf, int b, int h, int j)
{
	hpu__flash_kv_rows(a, qkv, mask, lse, dctx, delta, dqkv, acck, accv, kbuf, vbuf, b, h, j, 3);
}

#endif
