/* flash_tiles: fused attention on tensor cores, in tiles of 64 query rows
 * by 64 keys, written once for the CUDA kernels (worker/cuda/ops/
 * cuops_flash16.cu: the table's flash16_fwd and flash16_bwd, nvcc's
 * device pass, the products on WMMA's bf16 fragments) and for plain C
 * (tests/unit/test_flash_tiles.c runs every block on the CPU, the
 * products in fp32 loops, against the layer's unfused math in double).
 * A kernel only decides which block runs which tile; the arithmetic
 * between two products, the tiles' bounds, masks and the order of the
 * steps are this file's.
 *
 * What it computes is flash_rows.h's (the layout, the key rule, lse,
 * zeros for a query with no key and for a padding key's dk and dv), with
 * the products of FlashAttention-2 on bf16 operands: S = Q K^T and dP =
 * dO V^T from bf16 q, k, v and dO (under bf16 autocast they hold bf16
 * values already), O += P V, dq += dS K, dv += P^T dO and dk += dS^T Q
 * from P and dS rounded to bf16 (to nearest even), every product summed
 * in fp32; the running max, sums, exponentials and D in fp32.
 *
 * A block is HPU_FT_THREADS threads (HPU_FT_WARPS warps of 32; warp w
 * owns rows 16w to 16w + 15 of every product's result). Its shared
 * memory (hpu__ft_layout) holds the tiles: bf16 ones with rows hd + 8
 * apart, fp32 ones with rows n + 4 apart (row strides WMMA takes, every
 * 16-row fragment 32-byte aligned). Each step below runs on every
 * thread and ends at a barrier (HPU_FT_ALL), or runs the products of each
 * warp (HPU_FT_WARPS); in C a step runs its threads (or warps) one after
 * another, which is what the barrier between steps allows.
 *
 * Four blocks: the forward of a query tile (hpu__ft_fwd_block), dq and
 * D of a query tile (hpu__ft_dq_block, first), then dk and, apart, dv of
 * a key tile (hpu__ft_dk_block, reading the D the first wrote;
 * hpu__ft_dv_block): apart, each block's shared memory is small enough
 * for two (dk) and three (dv) blocks on an SM of 228 KB at hd 64, where
 * one block doing both took 122.6 KiB, one an SM. Causal: a query tile
 * visits the key tiles up to its last row, a key tile the query tiles
 * from its first. Internal to worker/ops and worker/cuda. */
#ifndef HPU_FLASH_TILES_H
#define HPU_FLASH_TILES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "worker/ops/flash_rows.h"

#define HPU_FT_ROWS 64   /* a tile's query rows, and its keys */
#define HPU_FT_WARPS 4   /* HPU_FT_ROWS / 16 */
#define HPU_FT_THREADS 128
#define HPU_FT_MAX_HD 128
#define HPU_FT_LDS (HPU_FT_ROWS + 4) /* an fp32 score tile's row stride */
#define HPU_FT_LDP (HPU_FT_ROWS + 8) /* a bf16 probability tile's */

#ifdef __CUDA_ARCH__
#define HPU_FT_BLOCK __device__ static inline
#define HPU_FT_ALL(...)                                                                       \
	do {                                                                                  \
		{                                                                             \
			const int ft_tid = (int)threadIdx.x, ft_nth = (int)blockDim.x;        \
			__VA_ARGS__;                                                          \
		}                                                                             \
		__syncthreads();                                                              \
	} while (0)
#define HPU_FT_WARPS_DO(...)                                                                  \
	do {                                                                                  \
		{                                                                             \
			const int ft_w = (int)(threadIdx.x >> 5);                             \
			__VA_ARGS__;                                                          \
		}                                                                             \
		__syncthreads();                                                              \
	} while (0)
#else
#ifdef __CUDACC__
#define HPU_FT_BLOCK __device__ static inline
#else
#define HPU_FT_BLOCK static inline
#endif
/* The order a step's threads (and warps) run in C: 0 ascending, 1
 * descending, 2 shuffled ((37 i + 11) mod 128). A step's threads must
 * not read what another writes in the same step (on a GPU they run at
 * once): where one did, the orders would give other results
 * (test_flash_tiles runs all three). */
static int hpu__ft_c_order;

static inline int hpu__ft_c_index(int i, int n)
{
	return hpu__ft_c_order == 0 ? i : hpu__ft_c_order == 1 ? n - 1 - i : (37 * i + 11) % n;
}

#define HPU_FT_ALL(...)                                                                       \
	do {                                                                                  \
		for (int ft_i = 0; ft_i < HPU_FT_THREADS; ft_i++) {                           \
			const int ft_tid = hpu__ft_c_index(ft_i, HPU_FT_THREADS);             \
			const int ft_nth = HPU_FT_THREADS;                                    \
			__VA_ARGS__;                                                          \
		}                                                                             \
	} while (0)
#define HPU_FT_WARPS_DO(...)                                                                  \
	do {                                                                                  \
		for (int ft_i = 0; ft_i < HPU_FT_WARPS; ft_i++) {                             \
			const int ft_w = hpu__ft_c_order ? HPU_FT_WARPS - 1 - ft_i : ft_i;    \
			__VA_ARGS__;                                                          \
		}                                                                             \
	} while (0)
#endif

/* The products (the CUDA file defines both as WMMA's before including
 * this file): for the 16 rows of warp w,
 *   HPU_FT_MMA_ABT: c[r][j] = sum_k a[r][k] b[j][k]   (A B^T, n columns)
 *   HPU_FT_MMA_AB:  c[r][j] += sum_k a[r][k] b[k][j]  (A B, n columns)
 * a and b bf16 (lda, ldb elements a row), c fp32 (ldc). */
#ifndef HPU_FT_MMA_ABT
#define HPU_FT_MMA_ABT hpu__ft_mma_abt_c
#define HPU_FT_MMA_AB hpu__ft_mma_ab_c
#endif

/* A head size the tiles take: a multiple of 16 (a fragment's k) up to
 * HPU_FT_MAX_HD. */
HPU_FLASH int hpu__ft_hd_ok(int hd)
{
	return hd > 0 && hd % 16 == 0 && hd <= HPU_FT_MAX_HD;
}

/* f rounded to bf16's nearest (ties to even); NaN stays NaN. */
HPU_FLASH uint16_t hpu__ft_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

HPU_FLASH float hpu__ft_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

HPU_FLASH int hpu__ft_min(int x, int y)
{
	return x < y ? x : y;
}

HPU_FLASH void hpu__ft_mma_abt_c(float *c, int ldc, const uint16_t *a, int lda, const uint16_t *b,
				 int ldb, int n, int k, int w)
{
	for (int r = 16 * w; r < 16 * w + 16; r++)
		for (int j = 0; j < n; j++) {
			float s = 0.0f;
			for (int e = 0; e < k; e++)
				s += hpu__ft_f32(a[r * lda + e]) * hpu__ft_f32(b[j * ldb + e]);
			c[r * ldc + j] = s;
		}
}

HPU_FLASH void hpu__ft_mma_ab_c(float *c, int ldc, const uint16_t *a, int lda, const uint16_t *b,
				int ldb, int n, int k, int w)
{
	for (int r = 16 * w; r < 16 * w + 16; r++)
		for (int j = 0; j < n; j++) {
			float s = c[r * ldc + j];
			for (int e = 0; e < k; e++)
				s += hpu__ft_f32(a[r * lda + e]) * hpu__ft_f32(b[e * ldb + j]);
			c[r * ldc + j] = s;
		}
}

/* A block's shared memory. By block (fwd, dq, dk, dv):
 *   t16[0..3]  [64][hd + 8] bf16: Q K V -, Q dO K V, K V Q dO, K Q dO -
 *   s, u       [64][LDS] fp32:    S -, S dP, S^T dP^T, S^T -
 *   p16        [64][LDP] bf16:    P, dS, dS^T, P^T
 *   acc0       [64][hd + 4] fp32: O, dq, dk, dv
 *   r0, r1     [64] fp32:         max sum, lse D, lse D, lse -
 *   r2, r3     [128] fp32:        the half rows' maxima and sums (fwd) */
typedef struct hpu__ft_smem {
	uint16_t *t16[4];
	float *s, *u;
	uint16_t *p16;
	float *acc0;
	float *r0, *r1, *r2, *r3;
} hpu__ft_smem;

enum { HPU_FT_FWD, HPU_FT_DQ, HPU_FT_DK, HPU_FT_DV };

/* The bytes of `block`'s shared memory for head size hd; where base is
 * not NULL, m's pointers into it (each array 128-byte aligned; those a
 * block does not use NULL). */
HPU_FLASH size_t hpu__ft_layout(int block, int hd, void *base, hpu__ft_smem *m)
{
	const size_t n16 = (size_t)HPU_FT_ROWS * (hd + 8) * 2, ns = (size_t)HPU_FT_ROWS * HPU_FT_LDS * 4;
	const size_t np = (size_t)HPU_FT_ROWS * HPU_FT_LDP * 2, na = (size_t)HPU_FT_ROWS * (hd + 4) * 4;
	const size_t nr = (size_t)HPU_FT_ROWS * 4;
	const int n_t16 = block == HPU_FT_FWD || block == HPU_FT_DV ? 3 : 4;
	const int two = block == HPU_FT_DQ || block == HPU_FT_DK;
	size_t sizes[13], at = 0;
	int k = 0;
	for (int i = 0; i < 4; i++)
		sizes[k++] = i < n_t16 ? n16 : 0;
	sizes[k++] = ns;
	sizes[k++] = two ? ns : 0;
	sizes[k++] = np;
	sizes[k++] = na;
	sizes[k++] = nr;
	sizes[k++] = block == HPU_FT_DV ? 0 : nr;
	sizes[k++] = block == HPU_FT_FWD ? 2 * nr : 0;
	sizes[k++] = block == HPU_FT_FWD ? 2 * nr : 0;
	void *ptr[13];
	for (int i = 0; i < k; i++) {
		ptr[i] = base && sizes[i] ? (char *)base + at : NULL;
		at += (sizes[i] + 127) / 128 * 128;
	}
	if (m) {
		for (int i = 0; i < 4; i++)
			m->t16[i] = (uint16_t *)ptr[i];
		m->s = (float *)ptr[4], m->u = (float *)ptr[5];
		m->p16 = (uint16_t *)ptr[6];
		m->acc0 = (float *)ptr[7];
		m->r0 = (float *)ptr[8], m->r1 = (float *)ptr[9], m->r2 = (float *)ptr[10];
		m->r3 = (float *)ptr[11];
	}
	return at;
}

/* Query i may attend to key j (both inside the sequence): flash_rows.h's
 * rule. */
HPU_FLASH int hpu__ft_allowed(const hpu__flash_dims *a, const int32_t *mask, int b, int i, int j)
{
	return i < a->t && j < a->t && (!a->causal || j <= i) && hpu__flash_key(a, mask, b, j);
}

/* Rows r0 to r0 + 63 of part (0 q, 1 k, 2 v) of head h of sample b, or
 * of dctx (part -1), as bf16 into dst; rows past the sequence zero. */
HPU_FLASH void hpu__ft_load(const hpu__flash_dims *a, const float *src, int part, int b, int h,
			    int r0, uint16_t *dst, int tid, int nth)
{
	const int hd = a->hd, n = hpu__ft_min(HPU_FT_ROWS, a->t - r0);
	for (int x = tid; x < HPU_FT_ROWS * hd; x += nth) {
		int r = x / hd, e = x % hd;
		float v = 0.0f;
		if (r < n)
			v = src[(part < 0 ? hpu__flash_ctx_at(a, b, h, r0 + r)
					  : hpu__flash_qkv_at(a, b, h, r0 + r, part)) +
				e];
		dst[r * (hd + 8) + e] = hpu__ft_bf16(v);
	}
}

/* n * hd floats of acc (rows hd + 4 apart) to zero. */
HPU_FLASH void hpu__ft_zero(float *acc, int hd, int tid, int nth)
{
	for (int x = tid; x < HPU_FT_ROWS * hd; x += nth)
		acc[(x / hd) * (hd + 4) + x % hd] = 0.0f;
}

/* ---- the forward of query rows q0 to q0 + 63 ---- */

HPU_FLASH void hpu__ft_fwd_init(const hpu__flash_dims *a, const hpu__ft_smem *m, int tid, int nth)
{
	hpu__ft_zero(m->acc0, a->hd, tid, nth);
	for (int r = tid; r < HPU_FT_ROWS; r += nth) {
		m->r0[r] = -INFINITY;
		m->r1[r] = 0.0f;
	}
}

/* The online softmax of a key tile, two threads a row (x = 2 r + half:
 * row r's columns half * 32 to half * 32 + 31). The half row's scaled
 * scores (-INF where not allowed) in place, their maximum into r2[x]. */
HPU_FLASH void hpu__ft_fwd_max(const hpu__flash_dims *a, const int32_t *mask, int b, int q0,
			       int k0, const hpu__ft_smem *m, int tid, int nth)
{
	for (int x = tid; x < 2 * HPU_FT_ROWS; x += nth) {
		const int r = x >> 1, c0 = (x & 1) * (HPU_FT_ROWS / 2);
		float *s = m->s + r * HPU_FT_LDS, mx = -INFINITY;
		for (int c = c0; c < c0 + HPU_FT_ROWS / 2; c++) {
			float v = hpu__ft_allowed(a, mask, b, q0 + r, k0 + c) ? s[c] * a->scale
									      : -INFINITY;
			s[c] = v;
			mx = v > mx ? v : mx;
		}
		m->r2[x] = mx;
	}
}

/* Row r's new maximum (the running one r0 and its halves') and the factor
 * its sum and output are rescaled by. */
HPU_FLASH float hpu__ft_fwd_new_max(const hpu__ft_smem *m, int r, float *factor)
{
	float old = m->r0[r], mn = old;
	mn = m->r2[2 * r] > mn ? m->r2[2 * r] : mn;
	mn = m->r2[2 * r + 1] > mn ? m->r2[2 * r + 1] : mn;
	*factor = mn == -INFINITY ? 1.0f : expf(old - mn);
	return mn;
}

/* Half row x: P = exp(s - the new max) (fp32 in s, bf16 in p16), its sum
 * into r3[x]; its half of the row's output rescaled. */
HPU_FLASH void hpu__ft_fwd_exp(const hpu__flash_dims *a, const hpu__ft_smem *m, int tid, int nth)
{
	const int hd = a->hd;
	for (int x = tid; x < 2 * HPU_FT_ROWS; x += nth) {
		const int r = x >> 1, c0 = (x & 1) * (HPU_FT_ROWS / 2), e0 = (x & 1) * (hd / 2);
		float f, mn = hpu__ft_fwd_new_max(m, r, &f), sum = 0.0f;
		float *s = m->s + r * HPU_FT_LDS;
		for (int c = c0; c < c0 + HPU_FT_ROWS / 2; c++) {
			float p = s[c] == -INFINITY ? 0.0f : expf(s[c] - mn);
			s[c] = p;
			m->p16[r * HPU_FT_LDP + c] = hpu__ft_bf16(p);
			sum += p;
		}
		m->r3[x] = sum;
		for (int e = e0; e < e0 + hd / 2; e++)
			m->acc0[r * (hd + 4) + e] *= f;
	}
}

/* Row r's running maximum and sum, from its halves'. */
HPU_FLASH void hpu__ft_fwd_sum(const hpu__ft_smem *m, int tid, int nth)
{
	for (int r = tid; r < HPU_FT_ROWS; r += nth) {
		float f, mn = hpu__ft_fwd_new_max(m, r, &f);
		m->r1[r] = m->r1[r] * f + (m->r3[2 * r] + m->r3[2 * r + 1]);
		m->r0[r] = mn;
	}
}

HPU_FLASH void hpu__ft_fwd_out(const hpu__flash_dims *a, float *ctx, float *lse, int b, int h,
			       int q0, const hpu__ft_smem *m, int tid, int nth)
{
	const int hd = a->hd, n = hpu__ft_min(HPU_FT_ROWS, a->t - q0);
	for (int x = tid; x < n * hd; x += nth) {
		int r = x / hd, e = x % hd;
		float l = m->r1[r];
		ctx[hpu__flash_ctx_at(a, b, h, q0 + r) + e] = l > 0.0f ? m->acc0[r * (hd + 4) + e] / l
								       : 0.0f;
	}
	for (int r = tid; r < n; r += nth) {
		float l = m->r1[r];
		lse[hpu__flash_row_at(a, b, h, q0 + r)] = l > 0.0f ? m->r0[r] + logf(l) : 0.0f;
	}
}

/* The keys a query tile from q0 visits: those before this. */
HPU_FLASH int hpu__ft_keys_end(const hpu__flash_dims *a, int q0)
{
	return a->causal ? hpu__ft_min(a->t, q0 + HPU_FT_ROWS) : a->t;
}

HPU_FT_BLOCK void hpu__ft_fwd_block(const hpu__flash_dims *a, const float *qkv,
				    const int32_t *mask, float *ctx, float *lse,
				    const hpu__ft_smem *m, int b, int h, int qt)
{
	const int q0 = qt * HPU_FT_ROWS, hd = a->hd, end = hpu__ft_keys_end(a, q0);
	HPU_FT_ALL(hpu__ft_load(a, qkv, 0, b, h, q0, m->t16[0], ft_tid, ft_nth);
		   hpu__ft_fwd_init(a, m, ft_tid, ft_nth));
	for (int k0 = 0; k0 < end; k0 += HPU_FT_ROWS) {
		HPU_FT_ALL(hpu__ft_load(a, qkv, 1, b, h, k0, m->t16[1], ft_tid, ft_nth);
			   hpu__ft_load(a, qkv, 2, b, h, k0, m->t16[2], ft_tid, ft_nth));
		HPU_FT_WARPS_DO(HPU_FT_MMA_ABT(m->s, HPU_FT_LDS, m->t16[0], hd + 8, m->t16[1],
					       hd + 8, HPU_FT_ROWS, hd, ft_w));
		HPU_FT_ALL(hpu__ft_fwd_max(a, mask, b, q0, k0, m, ft_tid, ft_nth));
		HPU_FT_ALL(hpu__ft_fwd_exp(a, m, ft_tid, ft_nth));
		HPU_FT_ALL(hpu__ft_fwd_sum(m, ft_tid, ft_nth));
		HPU_FT_WARPS_DO(HPU_FT_MMA_AB(m->acc0, hd + 4, m->p16, HPU_FT_LDP, m->t16[2], hd + 8,
					      hd, HPU_FT_ROWS, ft_w));
	}
	HPU_FT_ALL(hpu__ft_fwd_out(a, ctx, lse, b, h, q0, m, ft_tid, ft_nth));
}

/* ---- the backward: dq (and D) of query rows q0 to q0 + 63 ---- */

/* lse into r0 and, where r1 is there, D into it: made as dO . O (and
 * written to delta[]) where ctx is not NULL, else read from delta[]. */
HPU_FLASH void hpu__ft_rows_in(const hpu__flash_dims *a, const float *lse, const float *ctx,
			       const float *dctx, float *delta, int b, int h, int q0,
			       const hpu__ft_smem *m, int tid, int nth)
{
	const int n = hpu__ft_min(HPU_FT_ROWS, a->t - q0);
	for (int r = tid; r < HPU_FT_ROWS; r += nth) {
		size_t row = hpu__flash_row_at(a, b, h, q0 + r);
		m->r0[r] = r < n ? lse[row] : 0.0f;
		if (!m->r1)
			continue;
		if (ctx) {
			m->r1[r] = r < n ? hpu__flash_delta_row(a, ctx, dctx, b, h, q0 + r) : 0.0f;
			if (r < n)
				delta[row] = m->r1[r];
		} else
			m->r1[r] = r < n ? delta[row] : 0.0f;
	}
}

enum { HPU_FT_DS, HPU_FT_DS_T, HPU_FT_P_T };

/* Into p16, for query rows q0.. and keys k0.. (allowed pairs; 0
 * elsewhere), with P = exp(scale s - lse) and dS = P (dP - D):
 *   HPU_FT_DS    dS, queries by keys (s, u queries by keys: dq's);
 *   HPU_FT_DS_T  dS^T, keys by queries (s, u keys by queries: dk's);
 *   HPU_FT_P_T   P^T, keys by queries (s keys by queries: dv's). */
HPU_FLASH void hpu__ft_ds(const hpu__flash_dims *a, const int32_t *mask, int b, int q0, int k0,
			  int what, const hpu__ft_smem *m, int tid, int nth)
{
	const int tr = what != HPU_FT_DS;
	for (int x = tid; x < HPU_FT_ROWS * HPU_FT_ROWS; x += nth) {
		int y = x / HPU_FT_ROWS, z = x % HPU_FT_ROWS;
		int r = tr ? z : y, c = tr ? y : z; /* query r, key c */
		float v = 0.0f;
		if (hpu__ft_allowed(a, mask, b, q0 + r, k0 + c)) {
			float p = expf(m->s[y * HPU_FT_LDS + z] * a->scale - m->r0[r]);
			v = what == HPU_FT_P_T ? p : p * (m->u[y * HPU_FT_LDS + z] - m->r1[r]);
		}
		m->p16[y * HPU_FT_LDP + z] = hpu__ft_bf16(v);
	}
}

/* n rows of acc (times mul) into part (0 q, 1 k, 2 v) of dqkv's rows
 * from r0. */
HPU_FLASH void hpu__ft_out(const hpu__flash_dims *a, const float *acc, float mul, float *dqkv,
			   int part, int b, int h, int r0, int tid, int nth)
{
	const int hd = a->hd, n = hpu__ft_min(HPU_FT_ROWS, a->t - r0);
	for (int x = tid; x < n * hd; x += nth) {
		int r = x / hd, e = x % hd;
		dqkv[hpu__flash_qkv_at(a, b, h, r0 + r, part) + e] = acc[r * (hd + 4) + e] * mul;
	}
}

HPU_FT_BLOCK void hpu__ft_dq_block(const hpu__flash_dims *a, const float *qkv,
				   const int32_t *mask, const float *ctx, const float *lse,
				   const float *dctx, float *delta, float *dqkv,
				   const hpu__ft_smem *m, int b, int h, int qt)
{
	const int q0 = qt * HPU_FT_ROWS, hd = a->hd, end = hpu__ft_keys_end(a, q0);
	HPU_FT_ALL(hpu__ft_load(a, qkv, 0, b, h, q0, m->t16[0], ft_tid, ft_nth);
		   hpu__ft_load(a, dctx, -1, b, h, q0, m->t16[1], ft_tid, ft_nth);
		   hpu__ft_zero(m->acc0, hd, ft_tid, ft_nth);
		   hpu__ft_rows_in(a, lse, ctx, dctx, delta, b, h, q0, m, ft_tid, ft_nth));
	for (int k0 = 0; k0 < end; k0 += HPU_FT_ROWS) {
		HPU_FT_ALL(hpu__ft_load(a, qkv, 1, b, h, k0, m->t16[2], ft_tid, ft_nth);
			   hpu__ft_load(a, qkv, 2, b, h, k0, m->t16[3], ft_tid, ft_nth));
		HPU_FT_WARPS_DO(HPU_FT_MMA_ABT(m->s, HPU_FT_LDS, m->t16[0], hd + 8, m->t16[2],
					       hd + 8, HPU_FT_ROWS, hd, ft_w);
				HPU_FT_MMA_ABT(m->u, HPU_FT_LDS, m->t16[1], hd + 8, m->t16[3],
					       hd + 8, HPU_FT_ROWS, hd, ft_w));
		HPU_FT_ALL(hpu__ft_ds(a, mask, b, q0, k0, HPU_FT_DS, m, ft_tid, ft_nth));
		HPU_FT_WARPS_DO(HPU_FT_MMA_AB(m->acc0, hd + 4, m->p16, HPU_FT_LDP, m->t16[2], hd + 8,
					      hd, HPU_FT_ROWS, ft_w));
	}
	HPU_FT_ALL(hpu__ft_out(a, m->acc0, a->scale, dqkv, 0, b, h, q0, ft_tid, ft_nth));
}

/* ---- dk of keys k0 to k0 + 63 (after every dq block: D), and dv ---- */

HPU_FT_BLOCK void hpu__ft_dk_block(const hpu__flash_dims *a, const float *qkv,
				   const int32_t *mask, const float *lse, const float *dctx,
				   float *delta, float *dqkv, const hpu__ft_smem *m, int b, int h,
				   int kt)
{
	const int k0 = kt * HPU_FT_ROWS, hd = a->hd;
	HPU_FT_ALL(hpu__ft_load(a, qkv, 1, b, h, k0, m->t16[0], ft_tid, ft_nth);
		   hpu__ft_load(a, qkv, 2, b, h, k0, m->t16[1], ft_tid, ft_nth);
		   hpu__ft_zero(m->acc0, hd, ft_tid, ft_nth));
	for (int q0 = a->causal ? k0 : 0; q0 < a->t; q0 += HPU_FT_ROWS) {
		HPU_FT_ALL(hpu__ft_load(a, qkv, 0, b, h, q0, m->t16[2], ft_tid, ft_nth);
			   hpu__ft_load(a, dctx, -1, b, h, q0, m->t16[3], ft_tid, ft_nth);
			   hpu__ft_rows_in(a, lse, NULL, NULL, delta, b, h, q0, m, ft_tid,
					   ft_nth));
		HPU_FT_WARPS_DO(HPU_FT_MMA_ABT(m->s, HPU_FT_LDS, m->t16[0], hd + 8, m->t16[2],
					       hd + 8, HPU_FT_ROWS, hd, ft_w);
				HPU_FT_MMA_ABT(m->u, HPU_FT_LDS, m->t16[1], hd + 8, m->t16[3],
					       hd + 8, HPU_FT_ROWS, hd, ft_w));
		HPU_FT_ALL(hpu__ft_ds(a, mask, b, q0, k0, HPU_FT_DS_T, m, ft_tid, ft_nth));
		HPU_FT_WARPS_DO(HPU_FT_MMA_AB(m->acc0, hd + 4, m->p16, HPU_FT_LDP, m->t16[2], hd + 8,
					      hd, HPU_FT_ROWS, ft_w));
	}
	HPU_FT_ALL(hpu__ft_out(a, m->acc0, a->scale, dqkv, 1, b, h, k0, ft_tid, ft_nth));
}

HPU_FT_BLOCK void hpu__ft_dv_block(const hpu__flash_dims *a, const float *qkv,
				   const int32_t *mask, const float *lse, const float *dctx,
				   float *dqkv, const hpu__ft_smem *m, int b, int h, int kt)
{
	const int k0 = kt * HPU_FT_ROWS, hd = a->hd;
	HPU_FT_ALL(hpu__ft_load(a, qkv, 1, b, h, k0, m->t16[0], ft_tid, ft_nth);
		   hpu__ft_zero(m->acc0, hd, ft_tid, ft_nth));
	for (int q0 = a->causal ? k0 : 0; q0 < a->t; q0 += HPU_FT_ROWS) {
		HPU_FT_ALL(hpu__ft_load(a, qkv, 0, b, h, q0, m->t16[1], ft_tid, ft_nth);
			   hpu__ft_load(a, dctx, -1, b, h, q0, m->t16[2], ft_tid, ft_nth);
			   hpu__ft_rows_in(a, lse, NULL, NULL, NULL, b, h, q0, m, ft_tid, ft_nth));
		HPU_FT_WARPS_DO(HPU_FT_MMA_ABT(m->s, HPU_FT_LDS, m->t16[0], hd + 8, m->t16[1],
					       hd + 8, HPU_FT_ROWS, hd, ft_w));
		HPU_FT_ALL(hpu__ft_ds(a, mask, b, q0, k0, HPU_FT_P_T, m, ft_tid, ft_nth));
		HPU_FT_WARPS_DO(HPU_FT_MMA_AB(m->acc0, hd + 4, m->p16, HPU_FT_LDP, m->t16[2], hd + 8,
					      hd, HPU_FT_ROWS, ft_w));
	}
	HPU_FT_ALL(hpu__ft_out(a, m->acc0, 1.0f, dqkv, 2, b, h, k0, ft_tid, ft_nth));
}

/* The tiles of a sequence of t. */
HPU_FLASH int hpu__ft_tiles(int t)
{
	return (t + HPU_FT_ROWS - 1) / HPU_FT_ROWS;
}

#ifndef __CUDACC__
#include <stdlib.h>

/* The kernels' grids in C (the tests'): every forward block, then every
 * dq block (D into delta[batch * heads * t]), then every dk block and
 * every dv block; with dqkv NULL the forward alone. -1 without memory for
 * the tiles. */
static inline int hpu__ft_run_c(const hpu__flash_dims *a, const float *qkv, const int32_t *mask,
				float *ctx, float *lse, const float *dctx, float *delta,
				float *dqkv)
{
	const int nt = hpu__ft_tiles(a->t), blocks = dqkv ? 4 : 1;
	void *mem[4] = {NULL, NULL, NULL, NULL};
	hpu__ft_smem m[4];
	int rc = 0;
	for (int k = 0; k < blocks; k++) {
		size_t bytes = hpu__ft_layout(k, a->hd, NULL, NULL);
		mem[k] = aligned_alloc(128, bytes);
		if (!mem[k]) {
			rc = -1;
			break;
		}
		memset(mem[k], 0xff, bytes); /* NaN where a step reads what none wrote */
		hpu__ft_layout(k, a->hd, mem[k], &m[k]);
	}
	for (int b = 0; !rc && b < a->batch; b++)
		for (int h = 0; h < a->heads; h++)
			for (int x = nt - 1; x >= 0; x--)
				hpu__ft_fwd_block(a, qkv, mask, ctx, lse, &m[HPU_FT_FWD], b, h, x);
	for (int b = 0; !rc && dqkv && b < a->batch; b++)
		for (int h = 0; h < a->heads; h++)
			for (int x = nt - 1; x >= 0; x--)
				hpu__ft_dq_block(a, qkv, mask, ctx, lse, dctx, delta, dqkv,
						 &m[HPU_FT_DQ], b, h, x);
	for (int b = 0; !rc && dqkv && b < a->batch; b++)
		for (int h = 0; h < a->heads; h++)
			for (int x = 0; x < nt; x++) {
				hpu__ft_dk_block(a, qkv, mask, lse, dctx, delta, dqkv, &m[HPU_FT_DK],
						 b, h, x);
				hpu__ft_dv_block(a, qkv, mask, lse, dctx, dqkv, &m[HPU_FT_DV], b, h,
						 x);
			}
	for (int k = 0; k < 4; k++)
		free(mem[k]);
	return rc;
}
#endif

#endif
