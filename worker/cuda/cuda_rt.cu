/* cuda_rt: the runtime ops' kernels (cuda_kernels.h). Each is a grid-
 * stride loop over size_t indices; the conversions are common/lowp.h's,
 * bit for bit, and every fp32 and fp64 operation is the rounded intrinsic
 * of the operation device_ops.c performs, in its order (no FMA: the CPU
 * build has -ffp-contract=off). */
#include "worker/cuda/cuda_kernels.h"

#define THREADS 256
#define MAX_BLOCKS 65535u
#define SUMSQ_LANES 16
#define SUMSQ_BLOCK 256

static unsigned blocks_for(size_t n)
{
	size_t b = (n + THREADS - 1) / THREADS;
	return b == 0 ? 1u : b > MAX_BLOCKS ? MAX_BLOCKS : (unsigned)b;
}

#define FOR_EACH(i, n)                                                                             \
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                    \
	     i += (size_t)blockDim.x * gridDim.x)

/* ---- common/lowp.h on the device ---- */

__device__ static inline uint16_t to_bf16(float f)
{
	uint32_t x = __float_as_uint(f);
	uint32_t r = (x + 0x7fffu + ((x >> 16) & 1)) >> 16;
	uint32_t q = (x >> 16) | 0x40;
	return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r);
}

__device__ static inline uint16_t to_fp16(float f)
{
	uint32_t x = __float_as_uint(f), ax = x & 0x7fffffffu;
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t norm = (ax - (112u << 23) + 0xfffu + ((ax >> 13) & 1)) >> 13;
	uint32_t sub = __float_as_uint(__fadd_rn(__uint_as_float(ax), 0.5f)) - 0x3f000000u;
	uint32_t nan = 0x7e00u | ((ax >> 13) & 0x3ffu);
	uint32_t big = ax > 0x7f800000u ? nan : 0x7c00u;
	uint32_t r = ax < 0x38800000u ? sub : ax < 0x47800000u ? norm : big;
	return (uint16_t)(sign | r);
}

__device__ static inline float from_bf16(uint16_t h)
{
	return __uint_as_float((uint32_t)h << 16);
}

__device__ static inline float from_fp16(uint16_t h)
{
	uint32_t u = (uint32_t)(h & 0x7fffu) << 13;
	uint32_t e = u & 0x0f800000u;
	uint32_t norm = u + (112u << 23);
	uint32_t big = (norm + (112u << 23)) | (u > 0x0f800000u ? 0x400000u : 0);
	uint32_t sub = __float_as_uint(__fsub_rn(__uint_as_float(u + (113u << 23)), 0x1p-14f));
	uint32_t r = e == 0 ? sub : e == 0x0f800000u ? big : norm;
	return __uint_as_float(r | (uint32_t)(h & 0x8000u) << 16);
}

__device__ static inline uint16_t to16(int fp16, float f)
{
	return fp16 ? to_fp16(f) : to_bf16(f);
}

__device__ static inline float from16(int fp16, uint16_t h)
{
	return fp16 ? from_fp16(h) : from_bf16(h);
}

__device__ static inline int f32_nonfinite(float f)
{
	return (__float_as_uint(f) & 0x7f800000u) == 0x7f800000u;
}

/* ---- casts and sums ---- */

__global__ static void k_to16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	FOR_EACH(i, n)
	dst[i] = to16(fp16, src[i]);
}

__global__ static void k_from16(int fp16, float *dst, const uint16_t *src, size_t n)
{
	FOR_EACH(i, n)
	dst[i] = from16(fp16, src[i]);
}

__global__ static void k_acc16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	FOR_EACH(i, n)
	dst[i] = to16(fp16, __fadd_rn(from16(fp16, dst[i]), src[i]));
}

__global__ static void k_bf16_exact(uint16_t *dst, const float *x, size_t n, unsigned *flag)
{
	unsigned off = 0;
	FOR_EACH(i, n)
	{
		uint32_t v = __float_as_uint(x[i]);
		off |= v & 0xffffu;
		dst[i] = (uint16_t)(v >> 16);
	}
	if (off)
		atomicOr(flag, 1u);
}

__global__ static void k_bf16_expand(float *dst, const uint16_t *src, size_t n)
{
	FOR_EACH(i, n)
	dst[i] = from_bf16(src[i]);
}

__global__ static void k_add(float *dst, const float *src, size_t n)
{
	FOR_EACH(i, n)
	dst[i] = __fadd_rn(dst[i], src[i]);
}

__global__ static void k_add_scalar(float *dst, float v, size_t n)
{
	FOR_EACH(i, n)
	dst[i] = __fadd_rn(dst[i], v);
}

/* ---- sums of squares: device_ops.c's blocks, one thread each ---- */

__device__ static double sumsq_double(const float *g, size_t n)
{
	double s = 0.0;
	for (size_t i = 0; i < n; i++)
		s = __dadd_rn(s, __dmul_rn((double)g[i], (double)g[i]));
	return s;
}

__device__ static float sumsq_block(const float *g)
{
	float acc[SUMSQ_LANES];
	for (int l = 0; l < SUMSQ_LANES; l++)
		acc[l] = 0.0f;
	for (int j = 0; j < SUMSQ_BLOCK; j += SUMSQ_LANES)
		for (int l = 0; l < SUMSQ_LANES; l++)
			acc[l] = __fadd_rn(acc[l], __fmul_rn(g[j + l], g[j + l]));
	for (int w = SUMSQ_LANES / 2; w > 0; w /= 2)
		for (int l = 0; l < w; l++)
			acc[l] = __fadd_rn(acc[l], acc[l + w]);
	return acc[0];
}

__global__ static void k_sumsq_parts(const float *g, size_t n, double *part)
{
	size_t nb = n / SUMSQ_BLOCK;
	FOR_EACH(b, nb + 1)
	{
		const float *x = g + b * SUMSQ_BLOCK;
		if (b == nb) {
			part[b] = sumsq_double(x, n - nb * SUMSQ_BLOCK);
			continue;
		}
		float s = sumsq_block(x);
		part[b] = isfinite(s) ? (double)s : sumsq_double(x, SUMSQ_BLOCK);
	}
}

/* ---- checks ---- */

__global__ static void k_nonfinite(const float *g, size_t n, unsigned *flag)
{
	unsigned bad = 0;
	FOR_EACH(i, n)
	bad |= f32_nonfinite(g[i]);
	if (bad)
		atomicOr(flag, 1u);
}

__global__ static void k_nonfinite16(int fp16, const uint16_t *h, size_t n, unsigned *flag)
{
	const uint16_t mask = fp16 ? 0x7c00 : 0x7f80;
	unsigned bad = 0;
	FOR_EACH(i, n)
	bad |= (h[i] & mask) == mask;
	if (bad)
		atomicOr(flag, 1u);
}

__global__ static void k_count_nonfinite(const float *v, size_t n, unsigned long long *cnt)
{
	unsigned long long k = 0;
	FOR_EACH(i, n)
	k += f32_nonfinite(v[i]);
	if (k)
		atomicAdd(cnt, k);
}

__global__ static void k_count_nonfinite16(const uint16_t *v, size_t n, unsigned long long *cnt)
{
	unsigned long long k = 0;
	FOR_EACH(i, n)
	k += (v[i] & 0x7f80u) == 0x7f80u;
	if (k)
		atomicAdd(cnt, k);
}

/* ---- the optimizers: device_ops.c's sgd_step and adam_pass ---- */

__device__ static float sgd(const hpu__cuda_optk &k, float p, float gi, float *buf)
{
	if (k.mu == 0.0f)
		return __fsub_rn(p, __fmul_rn(k.lr, __fadd_rn(gi, __fmul_rn(k.wd, p))));
	float d = __fadd_rn(gi, __fmul_rn(k.wd, p));
	float b = k.first ? d : __fadd_rn(__fmul_rn(k.mu, *buf), d);
	*buf = b;
	d = k.nesterov ? __fadd_rn(d, __fmul_rn(k.mu, b)) : b;
	return __fsub_rn(p, __fmul_rn(k.lr, d));
}

__device__ static float adam(const hpu__cuda_optk &k, float p, float gi, float *m, float *v)
{
	if (k.l2)
		gi = __fadd_rn(gi, __fmul_rn(k.wd, p));
	float mi = __fadd_rn(__fmul_rn(k.b1, *m), __fmul_rn(k.c1, gi));
	float vi = __fadd_rn(__fmul_rn(k.b2, *v), __fmul_rn(__fmul_rn(k.c2, gi), gi));
	*m = mi;
	*v = vi;
	float pi = k.l2 ? p : __fmul_rn(p, k.decay);
	float den = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), k.inv_sqrt_bc2), k.eps);
	return __fsub_rn(pi, __fdiv_rn(__fmul_rn(k.step, mi), den));
}

__global__ static void k_optim(hpu__cuda_optk k, float *p, const float *g, const uint16_t *g16,
			       int fp16, uint16_t *p16, float *m, float *v, size_t n)
{
	FOR_EACH(i, n)
	{
		float gr = g16 ? from16(fp16, g16[i]) : g[i];
		float gi = __fmul_rn(k.gscale, gr);
		float *mi = m ? m + i : nullptr, *vi = v ? v + i : nullptr;
		float r = k.adam ? adam(k, p[i], gi, mi, vi) : sgd(k, p[i], gi, mi);
		p[i] = r;
		if (p16)
			p16[i] = to16(fp16, r);
	}
}

/* ---- launches ---- */

#define LAUNCH(kernel, n, s, ...)                                                                  \
	do {                                                                                       \
		kernel<<<blocks_for(n), THREADS, 0, s>>>(__VA_ARGS__);                             \
		return cudaGetLastError();                                                         \
	} while (0)

extern "C" {

cudaError_t hpu__cuda_k_to16(cudaStream_t s, int fp16, uint16_t *dst, const float *src, size_t n)
{
	LAUNCH(k_to16, n, s, fp16, dst, src, n);
}

cudaError_t hpu__cuda_k_from16(cudaStream_t s, int fp16, float *dst, const uint16_t *src,
			       size_t n)
{
	LAUNCH(k_from16, n, s, fp16, dst, src, n);
}

cudaError_t hpu__cuda_k_acc16(cudaStream_t s, int fp16, uint16_t *dst, const float *src, size_t n)
{
	LAUNCH(k_acc16, n, s, fp16, dst, src, n);
}

cudaError_t hpu__cuda_k_bf16_exact(cudaStream_t s, uint16_t *dst, const float *x, size_t n,
				   unsigned *flag)
{
	LAUNCH(k_bf16_exact, n, s, dst, x, n, flag);
}

cudaError_t hpu__cuda_k_bf16_expand(cudaStream_t s, float *dst, const uint16_t *src, size_t n)
{
	LAUNCH(k_bf16_expand, n, s, dst, src, n);
}

cudaError_t hpu__cuda_k_add(cudaStream_t s, float *dst, const float *src, size_t n)
{
	LAUNCH(k_add, n, s, dst, src, n);
}

cudaError_t hpu__cuda_k_add_scalar(cudaStream_t s, float *dst, float v, size_t n)
{
	LAUNCH(k_add_scalar, n, s, dst, v, n);
}

cudaError_t hpu__cuda_k_sumsq_parts(cudaStream_t s, const float *g, size_t n, double *part)
{
	LAUNCH(k_sumsq_parts, n / SUMSQ_BLOCK + 1, s, g, n, part);
}

cudaError_t hpu__cuda_k_nonfinite(cudaStream_t s, const float *g, size_t n, unsigned *flag)
{
	LAUNCH(k_nonfinite, n, s, g, n, flag);
}

cudaError_t hpu__cuda_k_nonfinite16(cudaStream_t s, int fp16, const uint16_t *g, size_t n,
				    unsigned *flag)
{
	LAUNCH(k_nonfinite16, n, s, fp16, g, n, flag);
}

cudaError_t hpu__cuda_k_count_nonfinite(cudaStream_t s, const float *v, size_t n,
					unsigned long long *cnt)
{
	LAUNCH(k_count_nonfinite, n, s, v, n, cnt);
}

cudaError_t hpu__cuda_k_count_nonfinite16(cudaStream_t s, const uint16_t *v, size_t n,
					  unsigned long long *cnt)
{
	LAUNCH(k_count_nonfinite16, n, s, v, n, cnt);
}

cudaError_t hpu__cuda_k_optim(cudaStream_t s, const hpu__cuda_optk *k, float *p, const float *g,
			      const uint16_t *g16, int fp16, uint16_t *p16, float *m, float *v,
			      size_t n)
{
	LAUNCH(k_optim, n, s, *k, p, g, g16, fp16, p16, m, v, n);
}
}
