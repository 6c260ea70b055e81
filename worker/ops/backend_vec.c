/* backend_vec: AVX-512 loops of the CPU table (backend_vec.h).
 *
 * Max pooling 2x2 / stride 2: the reference's loop over one output row is
 * as wide as the row (14 and 7 outputs in the CNN), too short for GCC's
 * 16-wide loop, and each window's two columns are interleaved. Here one
 * vector takes up to 16 windows of a row: two masked loads of 32 inputs
 * and two permutes split each input row into its even and odd columns,
 * and the window's four values are compared in the reference's order
 * with the same strict `>` (vcmpps GT_OQ: false for NaN, as C's `>`).
 * The backward writes every input once (the window's arg-max gets
 * dy + 0, the other three +0) instead of zeroing dx and adding into it.
 *
 * ReLU backward is memory-bound: for arrays beyond the caches, streaming
 * stores save reading dx's lines before writing them (a quarter of the
 * traffic).
 *
 * Measured on the 2-core Zen 4 VM at the CNN's shapes (batch 256,
 * 32x28x28, one thread, the four passes in a loop as a step runs them):
 * max pooling forward 2.5 -> 2.1 ms, backward 3.2 -> 1.9 ms, ReLU
 * backward 3.3 -> 2.3 ms; each is then within about 25% of the memory's
 * speed. Tried and left out: streaming the forward's idx or the
 * backward's dx (through a plane buffer) gained nothing or lost.
 */
#include <stdint.h>
#include <string.h>

#include "worker/ops/backend_vec.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(HPU_NO_CLONES)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f")))

/* ReLU backward streams its output from this many elements on (4 MB an
 * array: past the L2, a good part of what the L3 would keep). */
#define STREAM_MIN ((size_t)1 << 20)

int hpu__vec_ok(void)
{
	static int ok = -1;
	if (ok < 0)
		ok = __builtin_cpu_supports("avx512f") != 0;
	return ok;
}

/* The first n lanes. */
static inline __mmask16 lanes(int n)
{
	return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* The even and odd elements of p[0..n) (n <= 32, even), lane i holding
 * p[2i] and p[2i+1]; lanes past n / 2 are 0. */
AVX512 static inline void split_pairs(const float *p, int n, __m512 *ev, __m512 *od)
{
	const __m512i ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6,
					    4, 2, 0);
	const __m512i io = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7,
					    5, 3, 1);
	__m512 lo = _mm512_maskz_loadu_ps(lanes(n), p);
	__m512 hi = _mm512_maskz_loadu_ps(lanes(n - 16), p + 16);
	*ev = _mm512_permutex2var_ps(lo, ie, hi);
	*od = _mm512_permutex2var_ps(lo, io, hi);
}

/* split_pairs' inverse: p[2i] = ev[i], p[2i+1] = od[i] for 2i < n. */
AVX512 static inline void join_pairs(float *p, int n, __m512 ev, __m512 od)
{
	const __m512i ilo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
					     16, 0);
	const __m512i ihi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10,
					     25, 9, 24, 8);
	_mm512_mask_storeu_ps(p, lanes(n), _mm512_permutex2var_ps(ev, ilo, od));
	_mm512_mask_storeu_ps(p + 16, lanes(n - 16), _mm512_permutex2var_ps(ev, ihi, od));
}

/* Lane i: at + 2i. */
AVX512 static inline __m512i even_from(int32_t at)
{
	const __m512i two_i = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8,
					       6, 4, 2, 0);
	return _mm512_add_epi32(_mm512_set1_epi32(at), two_i);
}

/* n outputs of one row: the windows whose top-left input is top[2o]
 * (position at + 2o in the plane), top row then the row below (w on). */
AVX512 static void pool_row_fwd(const float *top, int w, int32_t at, int n, float *y,
				int32_t *idx)
{
	const __m512i one = _mm512_set1_epi32(1), wv = _mm512_set1_epi32(w);
	for (int o = 0; o < n; o += 16) {
		int cnt = n - o < 16 ? n - o : 16;
		__m512 a, b, c, d;
		split_pairs(top + 2 * o, 2 * cnt, &a, &b);
		split_pairs(top + w + 2 * o, 2 * cnt, &c, &d);
		__m512i pos = even_from(at + 2 * o), best_at = pos;
		__m512 best = a;
		__mmask16 g = _mm512_cmp_ps_mask(b, best, _CMP_GT_OQ);
		best = _mm512_mask_mov_ps(best, g, b);
		best_at = _mm512_mask_add_epi32(best_at, g, pos, one);
		pos = _mm512_add_epi32(pos, wv);
		g = _mm512_cmp_ps_mask(c, best, _CMP_GT_OQ);
		best = _mm512_mask_mov_ps(best, g, c);
		best_at = _mm512_mask_mov_epi32(best_at, g, pos);
		g = _mm512_cmp_ps_mask(d, best, _CMP_GT_OQ);
		best = _mm512_mask_mov_ps(best, g, d);
		best_at = _mm512_mask_add_epi32(best_at, g, pos, one);
		_mm512_mask_storeu_ps(y + o, lanes(cnt), best);
		_mm512_mask_storeu_epi32(idx + o, lanes(cnt), best_at);
	}
}

/* The backward of pool_row_fwd: writes the 2 x 2n inputs of the row's
 * windows. */
AVX512 static void pool_row_bwd(const float *dy, const int32_t *idx, int w, int32_t at, int n,
				float *top)
{
	const __m512i zi = _mm512_setzero_si512(), one = _mm512_set1_epi32(1);
	const __m512i wv = _mm512_set1_epi32(w), w1 = _mm512_set1_epi32(w + 1);
	for (int o = 0; o < n; o += 16) {
		int cnt = n - o < 16 ? n - o : 16;
		/* 0 + dy, as the reference's zeroed dx plus dy: -0 becomes +0 */
		__m512 g = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes(cnt), dy + o),
					 _mm512_setzero_ps());
		__m512i rel = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(lanes(cnt), idx + o),
					       even_from(at + 2 * o));
		__m512 a = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(rel, zi), g);
		__m512 b = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(rel, one), g);
		__m512 c = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(rel, wv), g);
		__m512 d = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(rel, w1), g);
		join_pairs(top + 2 * o, 2 * cnt, a, b);
		join_pairs(top + w + 2 * o, 2 * cnt, c, d);
	}
}

AVX512 static void maxpool2_fwd(const float *x, float *y, int32_t *idx, size_t planes, int h,
				int w)
{
	const int oh_n = h / 2, ow_n = w / 2;
	const size_t hw = (size_t)h * w, out = (size_t)oh_n * ow_n;
	for (size_t p = 0; p < planes; p++)
		for (int oh = 0; oh < oh_n; oh++) {
			size_t o = p * out + (size_t)oh * ow_n;
			pool_row_fwd(x + p * hw + (size_t)(2 * oh) * w, w, 2 * oh * w, ow_n,
				     y + o, idx + o);
		}
}

AVX512 static void maxpool2_bwd(const float *dy, const int32_t *idx, float *dx, size_t planes,
				int h, int w)
{
	const int oh_n = h / 2, ow_n = w / 2;
	const size_t hw = (size_t)h * w, out = (size_t)oh_n * ow_n;
	for (size_t p = 0; p < planes; p++) {
		float *dp = dx + p * hw;
		for (int oh = 0; oh < oh_n; oh++) {
			size_t o = p * out + (size_t)oh * ow_n;
			float *top = dp + (size_t)(2 * oh) * w;
			pool_row_bwd(dy + o, idx + o, w, 2 * oh * w, ow_n, top);
			if (w & 1) /* the column no window reads */
				top[w - 1] = top[2 * w - 1] = 0.0f;
		}
		if (h & 1) /* the row no window reads */
			memset(dp + (size_t)(h - 1) * w, 0, (size_t)w * sizeof *dp);
	}
}

AVX512 static void relu_bwd(const float *y, const float *dy, float *dx, size_t n)
{
	const __m512 zero = _mm512_setzero_ps();
	size_t i = 0;
	int stream = n >= STREAM_MIN;
	if (stream) /* to dx's first 64-byte line */
		for (; i < n && ((uintptr_t)(dx + i) & 63) != 0; i++)
			dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
	for (; i + 16 <= n; i += 16) {
		__mmask16 g = _mm512_cmp_ps_mask(_mm512_loadu_ps(y + i), zero, _CMP_GT_OQ);
		__m512 v = _mm512_maskz_loadu_ps(g, dy + i);
		if (stream)
			_mm512_stream_ps(dx + i, v);
		else
			_mm512_storeu_ps(dx + i, v);
	}
	if (stream)
		_mm_sfence();
	__mmask16 m = lanes((int)(n - i));
	__mmask16 g = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, y + i), zero,
					      _CMP_GT_OQ);
	_mm512_mask_storeu_ps(dx + i, m, _mm512_maskz_loadu_ps(g, dy + i));
}

/* ---- GELU (tanh form), ops_nn.c's formulas one operation at a time ----
 *
 * GCC's vector clone of the reference loop keeps three masked copies of
 * exp_poly's tail (one per branch of its clamp, each with its own
 * division); here the clamp is a max and a min, whose operand order keeps
 * a NaN x as the ternary does ((-87 > x) ? -87 : x, then (88 < x) ? 88 :
 * x), and every product and sum is the reference's, in its order, with
 * no FMA: the same bits for every input (checked over all 2^32 inputs
 * once, test_backend_nn over a sample). */
#define GELU_C 0.7978845608028654f /* sqrt(2 / pi), as ops_nn.c */
#define GELU_A 0.044715f

AVX512 static inline __m512 exp_poly16(__m512 x)
{
	const __m512 big = _mm512_set1_ps(12582912.0f);
	x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-87.0f), x));
	__m512 k = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), big),
				 big);
	__m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(k, _mm512_set1_ps(0.693145752f))),
				 _mm512_mul_ps(k, _mm512_set1_ps(1.42860677e-6f)));
	static const float c[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
	__m512 p = _mm512_set1_ps(1.0f / 5040);
	for (int j = 0; j < 7; j++)
		p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(c[j]));
	__m512i e = _mm512_slli_epi32(
		_mm512_add_epi32(_mm512_cvttps_epi32(k), _mm512_set1_epi32(127)), 23);
	return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* q = exp_poly(-2 u), u = c (v + a v^3), as the reference. */
AVX512 static inline __m512 gelu_q16(__m512 v)
{
	__m512 a3 = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(GELU_A), v), v), v);
	__m512 u = _mm512_mul_ps(_mm512_set1_ps(GELU_C), _mm512_add_ps(v, a3));
	return exp_poly16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u));
}

/* y = v / (1 + q) */
AVX512 static inline __m512 gelu_fwd16(__m512 v)
{
	return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), gelu_q16(v)));
}

/* dx = dy (s (1 + 2 v (q s) du)), s = 1 / (1 + q), du = c (1 + 3a v^2) */
AVX512 static inline __m512 gelu_bwd16(__m512 v, __m512 dy)
{
	const __m512 one = _mm512_set1_ps(1.0f);
	__m512 q = gelu_q16(v);
	__m512 s = _mm512_div_ps(one, _mm512_add_ps(one, q));
	__m512 du = _mm512_mul_ps(
		_mm512_set1_ps(GELU_C),
		_mm512_add_ps(one, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(3.0f * GELU_A), v), v)));
	__m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(2.0f), v),
					       _mm512_mul_ps(q, s)),
				 du);
	return _mm512_mul_ps(dy, _mm512_mul_ps(s, _mm512_add_ps(one, t)));
}

AVX512 static void gelu_fwd(const float *x, float *y, size_t n)
{
	size_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(y + i, gelu_fwd16(_mm512_loadu_ps(x + i)));
	__mmask16 m = lanes((int)(n - i));
	_mm512_mask_storeu_ps(y + i, m, gelu_fwd16(_mm512_maskz_loadu_ps(m, x + i)));
}

/* dx may be dy: each vector is read before it is written. */
AVX512 static void gelu_bwd(const float *x, const float *dy, float *dx, size_t n)
{
	size_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(dx + i,
				 gelu_bwd16(_mm512_loadu_ps(x + i), _mm512_loadu_ps(dy + i)));
	__mmask16 m = lanes((int)(n - i));
	_mm512_mask_storeu_ps(dx + i, m, gelu_bwd16(_mm512_maskz_loadu_ps(m, x + i),
						    _mm512_maskz_loadu_ps(m, dy + i)));
}

#else /* no intrinsics: the ops run the reference */


int hpu__vec_ok(void)
{
	return 0;
}

static void maxpool2_fwd(const float *x, float *y, int32_t *idx, size_t planes, int h, int w)
{
	(void)x, (void)y, (void)idx, (void)planes, (void)h, (void)w;
}

static void maxpool2_bwd(const float *dy, const int32_t *idx, float *dx, size_t planes, int h,
			 int w)
{
	(void)dy, (void)idx, (void)dx, (void)planes, (void)h, (void)w;
}

static void relu_bwd(const float *y, const float *dy, float *dx, size_t n)
{
	(void)y, (void)dy, (void)dx, (void)n;
}

static void gelu_fwd(const float *x, float *y, size_t n)
{
	(void)x, (void)y, (void)n;
}

static void gelu_bwd(const float *x, const float *dy, float *dx, size_t n)
{
	(void)x, (void)dy, (void)dx, (void)n;
}

#endif

/* The pooling these loops do: 2x2, stride 2, a window in every plane,
 * positions within int32 (as the reference's idx). */
static int pool2_ok(int batch, int ch, int h, int w, int k, int stride)
{
	return hpu__vec_ok() && k == 2 && stride == 2 && batch >= 0 && ch >= 0 && h >= 2 &&
	       w >= 2 && (int64_t)h * w <= INT32_MAX;
}

int hpu__vec_maxpool_fwd(const float *x, float *y, int32_t *idx, int batch, int ch, int h,
			 int w, int k, int stride)
{
	if (!pool2_ok(batch, ch, h, w, k, stride))
		return HPU_BE_UNSUPPORTED;
	maxpool2_fwd(x, y, idx, (size_t)batch * ch, h, w);
	return HPU_BE_OK;
}

int hpu__vec_maxpool_bwd(const float *dy, const int32_t *idx, float *dx, int batch, int ch,
			 int h, int w, int k, int stride)
{
	if (!pool2_ok(batch, ch, h, w, k, stride))
		return HPU_BE_UNSUPPORTED;
	maxpool2_bwd(dy, idx, dx, (size_t)batch * ch, h, w);
	return HPU_BE_OK;
}

int hpu__vec_relu_bwd(const float *y, const float *dy, float *dx, size_t n)
{
	if (!hpu__vec_ok())
		return HPU_BE_UNSUPPORTED;
	relu_bwd(y, dy, dx, n);
	return HPU_BE_OK;
}

int hpu__vec_gelu_fwd(const float *x, float *y, size_t n)
{
	if (!hpu__vec_ok())
		return HPU_BE_UNSUPPORTED;
	gelu_fwd(x, y, n);
	return HPU_BE_OK;
}

int hpu__vec_gelu_bwd(const float *x, const float *dy, float *dx, size_t n)
{
	if (!hpu__vec_ok())
		return HPU_BE_UNSUPPORTED;
	gelu_bwd(x, dy, dx, n);
	return HPU_BE_OK;
}
