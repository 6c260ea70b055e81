/* cuda_rt: the runtime ops' kernels (cuda_kernels.h). Each is a grid-
 * stride loop over size_t indices around cuda_elem.h's arithmetic on one
 * element (compiled with --fmad=false besides). */
#include "worker/cuda/cuda_kernels.h"

#include "worker/cuda/cuda_grid.cuh"

#define THREADS 256
#define MAX_BLOCKS 65535u

static unsigned blocks_for(size_t n)
{
	return hpu__cu_blocks(n, THREADS, MAX_BLOCKS);
}

/* ---- casts and sums ---- */

__global__ static void k_to16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	FOR_EACH(i, n)
	dst[i] = hpu__elem_to16(fp16, src[i]);
}

__global__ static void k_from16(int fp16, float *dst, const uint16_t *src, size_t n)
{
	FOR_EACH(i, n)
	dst[i] = hpu__elem_from16(fp16, src[i]);
}

__global__ static void k_acc16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	FOR_EACH(i, n)
	dst[i] = hpu__elem_acc16(fp16, dst[i], src[i]);
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
	dst[i] = hpu__elem_from_bf16(src[i]);
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

/* out[0] = v[0] + v[1] + ... in double, in order: one thread, as
 * device_ops.c's sum (a loss's per-sample values: a few hundred). */
__global__ static void k_sum(double *out, const float *v, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++)
		m += v[i];
	*out = m;
}

/* An evaluation's sums (device_ops.c's rows_add and loss_add): one
 * thread, in order, the rounding of each step spelled out (no fused
 * multiply-add). */
__global__ static void k_rows_add(double *acc, const float *v, size_t n, const int *rows)
{
	size_t m = *rows < 0 ? 0 : (size_t)*rows;
	double a = *acc;
	for (size_t r = 0; r < n && r < m; r++)
		a = __dadd_rn(a, (double)v[r]);
	*acc = a;
}

__global__ static void k_loss_add(double *acc, const double *sums, const double *w, int nloss,
				  const int *rows)
{
	double sum = 0, b = (double)*rows;
	for (int k = 0; k < nloss; k++)
		sum = __dadd_rn(sum, __dmul_rn(w[k], __ddiv_rn(sums[k], b)));
	*acc = __dadd_rn(*acc, __dmul_rn(sum, b));
}

/* ---- sums of squares: device_ops.c's blocks, one thread each ---- */

__global__ static void k_sumsq_parts(const float *g, size_t n, double *part)
{
	FOR_EACH(b, n / HPU_SUMSQ_BLOCK + 1)
	part[b] = hpu__elem_sumsq_part(g, n, b);
}

/* rt_sumsq16_add's batch: chunks j0 .. j0 + nj - 1 of h[n]. Their parts
 * (chunk j0 + j's part b at part[j * pc + b]), then each chunk's total
 * (tot[j]), then the totals onto *acc in order (one thread). */
__global__ static void k_sumsq16_parts(int fp16, const uint16_t *h, size_t n, size_t chunk,
				       size_t j0, size_t nj, size_t pc, double *part)
{
	FOR_EACH(t, nj * pc)
	{
		size_t j = t / pc, b = t % pc;
		size_t c = hpu__elem_chunk_len(n, chunk, j0 + j);
		if (b <= c / HPU_SUMSQ_BLOCK)
			part[t] = hpu__elem_sumsq16_part(fp16, h + (j0 + j) * chunk, c, b);
	}
}

__global__ static void k_sumsq16_chunks(const double *part, size_t n, size_t chunk, size_t j0,
					size_t nj, size_t pc, double *tot)
{
	FOR_EACH(j, nj)
	tot[j] = hpu__elem_parts_sum(part + j * pc,
				     hpu__elem_chunk_len(n, chunk, j0 + j) / HPU_SUMSQ_BLOCK + 1);
}

__global__ static void k_sumsq_onto(double *acc, const double *tot, size_t nj)
{
	double a = *acc;
	for (size_t j = 0; j < nj; j++)
		a = E_DADD(a, tot[j]);
	*acc = a;
}

/* ---- checks ---- */

__global__ static void k_nonfinite(const float *g, size_t n, unsigned *flag)
{
	unsigned bad = 0;
	FOR_EACH(i, n)
	bad |= hpu__elem_nonfinite(g[i]);
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
	k += hpu__elem_nonfinite(v[i]);
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

/* ---- the optimizers ---- */

__device__ static void optim_pass(const hpu__cuda_optk *k, float *p, const float *g,
				  const uint16_t *g16, int fp16, uint16_t *p16, float *m, float *v,
				  size_t n)
{
	FOR_EACH(i, n)
	{
		float gr = g16 ? hpu__elem_from16(fp16, g16[i]) : g[i];
		float r = hpu__elem_optim(k, p[i], gr, m ? m + i : nullptr, v ? v + i : nullptr);
		p[i] = r;
		if (p16)
			p16[i] = hpu__elem_to16(fp16, r);
	}
}

__global__ static void k_optim(hpu__cuda_optk k, float *p, const float *g, const uint16_t *g16,
			       int fp16, uint16_t *p16, float *m, float *v, size_t n)
{
	optim_pass(&k, p, g, g16, fp16, p16, m, v, n);
}

/* The same pass with lr, t and gscale read from o.sv (device memory):
 * each block's first thread makes the scalars once, in shared memory;
 * nothing at all where sv says the step is skipped. */
__global__ static void k_optim_sv(hpu__dev_optim o, float *p, const float *g,
				  const uint16_t *g16, int fp16, uint16_t *p16, float *m, float *v,
				  size_t n)
{
	__shared__ hpu__cuda_optk k;
	__shared__ int skip;
	if (threadIdx.x == 0) {
		skip = o.sv->skip;
		if (!skip)
			k = hpu__elem_optk(&o, o.sv->lr, o.sv->t, o.sv->gscale, &o.sv->bp1);
	}
	__syncthreads();
	if (!skip)
		optim_pass(&k, p, g, g16, fp16, p16, m, v, n);
}

/* ---- the step's decisions (hpu__dev_stepvars) ---- */

/* *flag = 1 where g[n] holds an Inf or NaN: only ever 1 is written. */
__global__ static void k_flag_nonfinite(float *flag, const float *g, size_t n)
{
	unsigned bad = 0;
	FOR_EACH(i, n)
	bad |= hpu__elem_nonfinite(g[i]);
	if (bad)
		*flag = 1.0f;
}

__global__ static void k_flag_nonfinite16(float *flag, int fp16, const uint16_t *h, size_t n)
{
	const uint16_t mask = fp16 ? 0x7c00 : 0x7f80;
	unsigned bad = 0;
	FOR_EACH(i, n)
	bad |= (h[i] & mask) == mask;
	if (bad)
		*flag = 1.0f;
}

/* part[b - b0] = part b of g[n]'s sum of squares, b in [b0, b0 + count). */
__global__ static void k_sumsq_parts_at(const float *g, size_t n, size_t b0, size_t count,
					double *part)
{
	FOR_EACH(b, count)
	part[b] = hpu__elem_sumsq_part(g, n, b0 + b);
}

/* One thread: t = (first ? 0 : *total) + part[0] + part[1] + ... in
 * order (rt_sumsq's host loop); then *acc += t where acc is given (the
 * last batch), else *total = t. */
__global__ static void k_sumsq_fold(const double *part, size_t count, double *total, int first,
				    double *acc)
{
	double t = first ? 0.0 : *total;
	for (size_t b = 0; b < count; b++)
		t = E_DADD(t, part[b]);
	if (acc)
		*acc = E_DADD(*acc, t);
	else
		*total = t;
}

__global__ static void k_loss_seed(float *g, size_t n, const double *sums, int nsums,
				   float weight, float base, int batch,
				   hpu__dev_stepvars *sv)
{
	const float v = hpu__elem_loss_seed(sums, nsums, weight, base, batch, sv->loss_scale);
	if (blockIdx.x == 0 && threadIdx.x == 0 && v != v)
		sv->bad = 1.0f; /* device_ops.c's loss_seed */
	FOR_EACH(i, n)
	g[i] = E_ADD(g[i], v);
}

__global__ static void k_step_begin(hpu__dev_stepvars *sv, hpu__dev_stepcfg c)
{
	hpu__elem_step_begin(sv, &c);
}

__global__ static void k_step_end(hpu__dev_stepvars *sv, hpu__dev_stepcfg c)
{
	hpu__elem_step_end(sv, &c);
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

cudaError_t hpu__cuda_k_sum(cudaStream_t s, double *out, const float *v, size_t n)
{
	k_sum<<<1, 1, 0, s>>>(out, v, n);
	return cudaGetLastError();
}

cudaError_t hpu__cuda_k_rows_add(cudaStream_t s, double *acc, const float *v, size_t n,
				 const int *rows)
{
	k_rows_add<<<1, 1, 0, s>>>(acc, v, n, rows);
	return cudaGetLastError();
}

cudaError_t hpu__cuda_k_loss_add(cudaStream_t s, double *acc, const double *sums,
				 const double *w, int nloss, const int *rows)
{
	k_loss_add<<<1, 1, 0, s>>>(acc, sums, w, nloss, rows);
	return cudaGetLastError();
}

cudaError_t hpu__cuda_k_sumsq_parts(cudaStream_t s, const float *g, size_t n, double *part)
{
	LAUNCH(k_sumsq_parts, n / HPU_SUMSQ_BLOCK + 1, s, g, n, part);
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

cudaError_t hpu__cuda_k_optim_sv(cudaStream_t s, const hpu__dev_optim *o, float *p,
				 const float *g, const uint16_t *g16, int fp16, uint16_t *p16,
				 float *m, float *v, size_t n)
{
	LAUNCH(k_optim_sv, n, s, *o, p, g, g16, fp16, p16, m, v, n);
}

cudaError_t hpu__cuda_k_flag_nonfinite(cudaStream_t s, float *flag, const float *g, size_t n)
{
	LAUNCH(k_flag_nonfinite, n, s, flag, g, n);
}

cudaError_t hpu__cuda_k_flag_nonfinite16(cudaStream_t s, float *flag, int fp16,
					 const uint16_t *g, size_t n)
{
	LAUNCH(k_flag_nonfinite16, n, s, flag, fp16, g, n);
}

cudaError_t hpu__cuda_k_sumsq_parts_at(cudaStream_t s, const float *g, size_t n, size_t b0,
				       size_t count, double *part)
{
	LAUNCH(k_sumsq_parts_at, count, s, g, n, b0, count, part);
}

cudaError_t hpu__cuda_k_sumsq16_batch(cudaStream_t s, int fp16, const uint16_t *h, size_t n,
				     size_t chunk, size_t j0, size_t nj, double *acc, double *scratch)
{
	size_t pc;
	hpu__elem_sumsq16_batch(chunk, 0, &pc);
	double *tot = scratch + nj * pc;
	k_sumsq16_parts<<<blocks_for(nj * pc), THREADS, 0, s>>>(fp16, h, n, chunk, j0, nj, pc,
								 scratch);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess)
		return e;
	k_sumsq16_chunks<<<blocks_for(nj), THREADS, 0, s>>>(scratch, n, chunk, j0, nj, pc, tot);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	k_sumsq_onto<<<1, 1, 0, s>>>(acc, tot, nj);
	return cudaGetLastError();
}

cudaError_t hpu__cuda_k_sumsq_fold(cudaStream_t s, const double *part, size_t count,
				   double *total, int first, double *acc)
{
	k_sumsq_fold<<<1, 1, 0, s>>>(part, count, total, first, acc);
	return cudaGetLastError();
}

cudaError_t hpu__cuda_k_loss_seed(cudaStream_t s, float *g, size_t n, const double *sums,
				  int nsums, float weight, float base, int batch,
				  hpu__dev_stepvars *sv)
{
	LAUNCH(k_loss_seed, n, s, g, n, sums, nsums, weight, base, batch, sv);
}

cudaError_t hpu__cuda_k_step_begin(cudaStream_t s, hpu__dev_stepvars *sv,
				   const hpu__dev_stepcfg *c)
{
	k_step_begin<<<1, 1, 0, s>>>(sv, *c);
	return cudaGetLastError();
}

cudaError_t hpu__cuda_k_step_end(cudaStream_t s, hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	k_step_end<<<1, 1, 0, s>>>(sv, *c);
	return cudaGetLastError();
}
}
