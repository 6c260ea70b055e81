/* cuops_gemm: the table's matrix products on cuBLASLt.
 *
 * backend.h's products are row-major: c[M,N] = a[M,K] b[K,N]. cuBLASLt's
 * are column-major, and a row-major matrix X[r, c] (leading dimension c)
 * is the column-major X^T[c, r] with the same leading dimension, so the
 * product is computed as c^T[N,M] = b^T[N,K] a^T[K,M]: cuBLASLt's A is our
 * b and its B our a, with m and n swapped. b stored [K,N] is column-major
 * [N,K] (ld N, op N); stored [N,K] (trans_b) it is column-major [K,N]
 * (ld K, op T). a stored [M,K] is column-major [K,M] (ld K, op N); stored
 * [K,M] (trans_a) column-major [M,K] (ld M, op T). c is column-major
 * [N,M], ld N. The bias epilogue adds a vector along cuBLASLt's rows
 * (our n): bias[N] on every row of c.
 *
 * fp32: CUBLAS_COMPUTE_32F (TF32 only when hpu__cuda_ops_allow_tf32 said
 * so). bf16: A and B bf16, C and D fp32, fp32 compute. Where cuBLASLt has
 * no bf16 algorithm for a shape (odd leading dimensions), the bf16
 * operands are widened to fp32 in scratch and multiplied on TF32 tensor
 * cores, which is exact for bf16 values (8 significant bits fit TF32's
 * 11; the products are accumulated in fp32).
 *
 * fp8 (gemm_fp8, fp8 training's linear): A and B fp8 bytes (E4M3, or
 * E5M2 for one of them), both with K innermost, which is the one layout
 * cuBLASLt takes for fp8 ("TN": its A, our b, transposed); C and D fp32,
 * fp32 compute (the tensor cores' partial sums, promoted to fp32 between
 * chunks of K: cuBLASLt's default, not its fast accumulation), the
 * operands' inverse scales as A_SCALE_POINTER and B_SCALE_POINTER (device
 * memory, read when the product runs: a recorded step replays with the
 * step's scales; set before the algorithm is chosen, as NVIDIA's
 * LtFp8Matmul sample does); the bias added apart (with fp32 output
 * cuBLASLt's fp8 epilogue takes a bf16 bias only). Sm 8.9 and later;
 * sizes multiples of 16. A failure of the product is said once and fp8
 * then runs on the bf16 kernels.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "worker/cuda/ops/cuops.h"
#include "worker/cuda/ops/cuops_kernels.h"
#include "worker/ops/fp8.h"

const char *hpu__cuops_blas_version(void)
{
	static char line[48];
	size_t v = cublasLtGetVersion();
	snprintf(line, sizeof line, "cuBLASLt %zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
	return line;
}

/* The largest power of two (at most 256) dividing the address and, for a
 * batch, the stride in bytes: what every product's pointer is aligned to. */
static uint32_t alignment(const void *p, size_t stride_bytes, int count)
{
	uintptr_t v = (uintptr_t)p | 256u;
	if (count > 1)
		v |= (uintptr_t)stride_bytes;
	return (uint32_t)(v & (~v + 1));
}

enum { K_DT, K_COUNT, K_M, K_N, K_K, K_TA, K_TB, K_SA, K_SB, K_SC, K_BIAS, K_TF32,
       K_ALA, K_ALB, K_ALC, K_NKEY };

/* K_DT of an fp8 product: FP8_DT + (our a E5M2) * 2 + (our b E5M2) */
enum { FP8_DT = 8 };


/* The plan's key: everything its descriptors and algorithm depend on. */
static void gemm_key(const hpu__gemm *g, int tf32, int64_t *key)
{
	size_t es = g->dt == HPU_DT_BF16 ? 2 : 4;
	memset(key, 0, 16 * sizeof *key);
	key[K_DT] = g->dt;
	key[K_COUNT] = g->count;
	key[K_M] = g->m;
	key[K_N] = g->n;
	key[K_K] = g->k;
	key[K_TA] = g->trans_a;
	key[K_TB] = g->trans_b;
	key[K_SA] = g->count > 1 ? (int64_t)g->stride_a : 0;
	key[K_SB] = g->count > 1 ? (int64_t)g->stride_b : 0;
	key[K_SC] = g->count > 1 ? (int64_t)g->stride_c : 0;
	key[K_BIAS] = g->bias != NULL;
	key[K_TF32] = tf32;
	key[K_ALA] = alignment(g->a, g->stride_a * es, g->count);
	key[K_ALB] = alignment(g->b, g->stride_b * es, g->count);
	key[K_ALC] = alignment(g->c, g->stride_c * 4, g->count);
}

static void plan_free(hpu__cuops_gemm_plan *p)
{
	if (p->desc)
		cublasLtMatmulDescDestroy(p->desc);
	if (p->la)
		cublasLtMatrixLayoutDestroy(p->la);
	if (p->lb)
		cublasLtMatrixLayoutDestroy(p->lb);
	if (p->lc)
		cublasLtMatrixLayoutDestroy(p->lc);
	memset(p, 0, sizeof *p);
}

void hpu__cuops_gemm_free(hpu__cuops_ctx *c)
{
	for (int i = 0; i < HPU_CUOPS_GEMM_CACHE; i++)
		if (c->gemm[i].used)
			plan_free(&c->gemm[i]);
}

/* A column-major layout rows x cols (ld rows), batched as the key says. */
static int layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t rows, uint64_t cols,
		  int count, int64_t stride)
{
	if (hpu__cuops_blas(cublasLtMatrixLayoutCreate(l, t, rows, cols, (int64_t)rows),
			    "matrix layout"))
		return -1;
	if (count <= 1)
		return 0;
	int32_t n = count;
	if (hpu__cuops_blas(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
							     &n, sizeof n),
			    "batch count") ||
	    hpu__cuops_blas(cublasLtMatrixLayoutSetAttribute(
				    *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
				    sizeof stride),
			    "batch stride"))
		return -1;
	return 0;
}

static int desc_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v,
		     size_t n)
{
	return hpu__cuops_blas(cublasLtMatmulDescSetAttribute(d, a, v, n), "matmul attribute");
}

/* Makes p's descriptors and picks its algorithm; 0, or -1 when cuBLASLt
 * has none for the case (the caller may add the bias apart or widen bf16).
 * scales: an fp8 product's inverse scales (cuBLASLt's A's and B's: our
 * b's and a's), set on the descriptor before the algorithm is chosen (a
 * call sets its own again); NULL for the others. */
static int plan_make(hpu__cuops_ctx *c, hpu__cuops_gemm_plan *p, const int64_t *key,
		     const float *const *scales)
{
	int bf = key[K_DT] == HPU_DT_BF16, count = (int)key[K_COUNT];
	uint64_t m = (uint64_t)key[K_M], n = (uint64_t)key[K_N], k = (uint64_t)key[K_K];
	cudaDataType_t it = bf ? CUDA_R_16BF : CUDA_R_32F;
	cudaDataType_t ta = it, tb = it; /* cuBLASLt's A (our b) and B (our a) */
	if (key[K_DT] >= FP8_DT) {
		int e = (int)(key[K_DT] - FP8_DT);
		ta = e & 1 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
		tb = e & 2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
	}
	cublasComputeType_t ct = !bf && key[K_TF32] ? CUBLAS_COMPUTE_32F_FAST_TF32
						    : CUBLAS_COMPUTE_32F;
	int32_t op_a = key[K_TB] ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's A: our b */
	int32_t op_b = key[K_TA] ? CUBLAS_OP_T : CUBLAS_OP_N; /* its B: our a */
	cublasLtMatmulPreference_t pref = NULL;
	memcpy(p->key, key, sizeof p->key);
	c->gemm_heuristic = -1;
	if (hpu__cuops_blas(cublasLtMatmulDescCreate(&p->desc, ct, CUDA_R_32F), "matmul desc") ||
	    desc_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a) ||
	    desc_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b))
		goto fail;
	if (scales &&
	    (desc_attr(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scales[0],
		       sizeof scales[0]) ||
	     desc_attr(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scales[1],
		       sizeof scales[1])))
		goto fail;
	if (key[K_BIAS]) {
		int32_t epi = CUBLASLT_EPILOGUE_BIAS, bt = CUDA_R_32F;
		int64_t bstride = 0; /* one bias for every product of a batch */
		if (desc_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) ||
		    desc_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt) ||
		    desc_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bstride,
			      sizeof bstride))
			goto fail;
	}
	/* our b: [K,N] row-major = [N,K] column-major; transposed [K,N] */
	if (layout(&p->la, ta, key[K_TB] ? k : n, key[K_TB] ? n : k, count, key[K_SB]) ||
	    layout(&p->lb, tb, key[K_TA] ? m : k, key[K_TA] ? k : m, count, key[K_SA]) ||
	    layout(&p->lc, CUDA_R_32F, n, m, count, key[K_SC]))
		goto fail;
	uint64_t ws = HPU_CUOPS_WORKSPACE;
	uint32_t al_a = (uint32_t)key[K_ALB], al_b = (uint32_t)key[K_ALA];
	uint32_t al_c = (uint32_t)key[K_ALC];
	if (hpu__cuops_blas(cublasLtMatmulPreferenceCreate(&pref), "matmul preference") ||
	    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
						 &ws, sizeof ws) ||
	    cublasLtMatmulPreferenceSetAttribute(
		    pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a) ||
	    cublasLtMatmulPreferenceSetAttribute(
		    pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b) ||
	    cublasLtMatmulPreferenceSetAttribute(
		    pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c) ||
	    cublasLtMatmulPreferenceSetAttribute(
		    pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c))
		goto fail;
	cublasLtMatmulHeuristicResult_t res;
	int got = 0;
	memset(&res, 0, sizeof res);
	cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->la, p->lb, p->lc,
							   p->lc, pref, 1, &res, &got);
	c->gemm_heuristic = (int)(hs != CUBLAS_STATUS_SUCCESS ? hs
				  : got < 1		      ? CUBLAS_STATUS_NOT_SUPPORTED
							      : res.state);
	if (c->gemm_heuristic != (int)CUBLAS_STATUS_SUCCESS)
		goto fail;
	p->algo = res.algo;
	cublasLtMatmulPreferenceDestroy(pref);
	p->used = 1;
	return 0;
fail:
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	plan_free(p);
	return -1;
}

/* The cached plan for key, or a new one in the least recently used
 * slot; NULL when cuBLASLt has no algorithm for it. */
static hpu__cuops_gemm_plan *plan_get(hpu__cuops_ctx *c, const int64_t *key,
				       const float *const *scales)
{
	hpu__cuops_gemm_plan *victim = &c->gemm[0];
	for (int i = 0; i < HPU_CUOPS_GEMM_CACHE; i++) {
		hpu__cuops_gemm_plan *p = &c->gemm[i];
		if (p->used && memcmp(p->key, key, sizeof p->key) == 0) {
			p->stamp = ++c->clock;
			return p;
		}
		if (!p->used || (victim->used && p->stamp < victim->stamp))
			victim = p;
	}
	if (victim->used)
		plan_free(victim);
	if (plan_make(c, victim, key, scales))
		return NULL;
	victim->stamp = ++c->clock;
	return victim;
}

/* The floats a strided batch of count matrices of n spans. */
static size_t span(int count, size_t stride, size_t n)
{
	return count > 1 ? (size_t)(count - 1) * stride + n : n;
}

static int run(hpu__cuops_ctx *c, hpu__cuops_gemm_plan *p, const hpu__gemm *g)
{
	float alpha = 1.0f, beta = g->accumulate ? 1.0f : 0.0f;
	if (g->bias &&
	    desc_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias))
		return -1;
	return hpu__cuops_blas(cublasLtMatmul(c->lt, p->desc, &alpha, g->b, p->la, g->a, p->lb,
					      &beta, g->c, p->lc, g->c, p->lc, &p->algo, c->ws,
					      HPU_CUOPS_WORKSPACE, hpu__cuops_stream()),
			       "cublasLtMatmul");
}

/* Runs g with the plan for tf32: the bias in the epilogue, or added
 * apart when cuBLASLt has no algorithm with it. *none (and -1, not
 * logged) when it has no algorithm at all. */
static int run_any(hpu__cuops_ctx *c, const hpu__gemm *g, int tf32, int *none)
{
	int64_t key[16];
	*none = 0;
	gemm_key(g, tf32, key);
	hpu__cuops_gemm_plan *p = plan_get(c, key, NULL);
	if (p)
		return run(c, p, g);
	hpu__gemm f = *g;
	f.bias = NULL;
	gemm_key(&f, tf32, key);
	p = g->bias ? plan_get(c, key, NULL) : NULL;
	if (!p) {
		*none = 1;
		return -1;
	}
	if (run(c, p, &f))
		return -1;
	return hpu__cuops_cuda(hpu__cuk_gemm_k0(g->c, g->bias, g->count, g->m, g->n,
						g->stride_c, 1, hpu__cuops_stream()),
			       "bias");
}

static int no_algorithm(const hpu__gemm *g)
{
	if (hpu__cuops_refused()) /* a refused call made the plan, not the shape */
		return -1;
	hpu__cuops_fatal("cuBLASLt has no algorithm for a %dx%dx%d %s product", g->m, g->n, g->k,
			 g->dt == HPU_DT_BF16 ? "bf16" : "fp32");
}

/* bf16 without a cuBLASLt algorithm: both operands widened to fp32 in
 * scratch, multiplied on TF32 (exact for bf16 values). */
static int run_widened(hpu__cuops_ctx *c, const hpu__gemm *g)
{
	size_t na = span(g->count, g->stride_a, (size_t)g->m * g->k);
	size_t nb = span(g->count, g->stride_b, (size_t)g->k * g->n);
	float *w = hpu__cuops_scratch(c, (na + nb) * sizeof(float));
	if (!w)
		return -1;
	cudaStream_t st = hpu__cuops_stream();
	if (hpu__cuops_cuda(hpu__cuk_bf16_to_f32(g->a, w, na, st), "bf16 widening") ||
	    hpu__cuops_cuda(hpu__cuk_bf16_to_f32(g->b, w + na, nb, st), "bf16 widening"))
		return -1;
	hpu__gemm f = *g;
	f.dt = HPU_DT_F32;
	f.a = w;
	f.b = w + na;
	int none, rc = run_any(c, &f, 1, &none);
	return none ? no_algorithm(g) : rc;
}

int hpu__cuops_gemm(const hpu__gemm *g)
{
	if (g->count < 0 || g->m < 0 || g->n < 0 || g->k < 0)
		return HPU_BE_UNSUPPORTED;
	if (g->count == 0 || g->m == 0 || g->n == 0)
		return HPU_BE_OK;
	hpu__cuops_ctx *c = hpu__cuops_enter();
	if (!c)
		return HPU_BE_UNSUPPORTED;
	int rc, none = 0;
	if (g->k == 0) { /* an empty sum: c = bias or 0, or c unchanged */
		rc = hpu__cuops_cuda(hpu__cuk_gemm_k0(g->c, g->bias, g->count, g->m, g->n,
						      g->stride_c, g->accumulate,
						      hpu__cuops_stream()),
				     "empty product");
	} else {
		rc = run_any(c, g, g->dt == HPU_DT_F32 && hpu__cuops_tf32(), &none);
		if (none)
			rc = g->dt == HPU_DT_BF16 ? run_widened(c, g) : no_algorithm(g);
	}
	hpu__cuops_leave(c);
	return rc ? HPU_BE_UNSUPPORTED : HPU_BE_OK;
}

/* fp8's product failed once (said): the bf16 kernels from then on */
static int fp8_broken;

int hpu__cuops_gemm_fp8(int m, int n, int k, const uint8_t *a, int fa, const uint8_t *b, int fb,
			const float *ia, const float *ib, const float *bias, float *c,
			int accumulate)
{
	if (fp8_broken || m <= 0 || n <= 0 || k <= 0 || m % 16 || n % 16 || k % 16 ||
	    (fa != HPU_FP8_E4M3 && fa != HPU_FP8_E5M2) || (fb != HPU_FP8_E4M3 && fb != HPU_FP8_E5M2) ||
	    (fa == HPU_FP8_E5M2 && fb == HPU_FP8_E5M2))
		return HPU_BE_UNSUPPORTED;
	hpu__cuops_ctx *cx = hpu__cuops_enter();
	if (!cx)
		return HPU_BE_UNSUPPORTED;
	int rc = -1;
	if (cx->cc_major * 10 + cx->cc_minor >= 89) {
		/* our b stored [N,K] (trans_b), a [M,K]: the TN product */
		hpu__gemm g = {.count = 1, .m = m, .n = n, .k = k, .trans_b = 1, .a = a, .b = b,
			       .c = c};
		int64_t key[16];
		const float *scales[2] = {ib, ia};
		gemm_key(&g, 0, key);
		key[K_DT] = FP8_DT + (fa == HPU_FP8_E5M2) * 2 + (fb == HPU_FP8_E5M2);
		hpu__cuops_gemm_plan *p = plan_get(cx, key, scales);
		float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
		cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
		if (p && !desc_attr(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ib, sizeof ib) &&
		    !desc_attr(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ia, sizeof ia))
			st = cublasLtMatmul(cx->lt, p->desc, &alpha, b, p->la, a, p->lb, &beta, c, p->lc,
					    c, p->lc, &p->algo, cx->ws, HPU_CUOPS_WORKSPACE,
					    hpu__cuops_stream());
		if (!p) { /* said once: the heuristic is not asked again */
			fp8_broken = 1;
			fprintf(stderr,
				"hpu-worker: warning: cuBLASLt has no fp8 algorithm for %dx%dx%d (%s x "
				"%s, fp32 out; its heuristic: %s): fp8 training's linear runs on the "
				"bf16 kernels from now on\n",
				m, n, k, fa == HPU_FP8_E5M2 ? "E5M2" : "E4M3",
				fb == HPU_FP8_E5M2 ? "E5M2" : "E4M3",
				cx->gemm_heuristic < 0
					? "not asked, the descriptors failed (said above)"
					: cublasLtGetStatusString((cublasStatus_t)cx->gemm_heuristic));
		} else if (st != CUBLAS_STATUS_SUCCESS) {
			fp8_broken = 1;
			fprintf(stderr,
				"hpu-worker: warning: cuBLASLt's fp8 product (%dx%dx%d) failed (%s): fp8 "
				"training's linear runs on the bf16 kernels from now on\n",
				m, n, k, cublasLtGetStatusString(st));
		} else {
			rc = bias ? hpu__cuops_cuda(hpu__cuk_gemm_k0(c, bias, 1, m, n, 0, 1,
								     hpu__cuops_stream()),
						    "bias")
				  : 0;
		}
	}
	hpu__cuops_leave(cx);
	return rc ? HPU_BE_UNSUPPORTED : HPU_BE_OK;
}
