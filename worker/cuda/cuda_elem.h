/* cuda_elem: the runtime ops' arithmetic on one element, written once
 * for the kernels (cuda_rt.cu, nvcc: every operation an explicitly
 * rounded intrinsic, no FMA) and for plain C (gcc with -ffp-contract=off:
 * the same IEEE operations), so that a test on any machine
 * (tests/unit/test_cuda_elem.c) holds the kernels' arithmetic against
 * device_ops.c's bit for bit; only the execution on a GPU is left to
 * test_cuda_device. The conversions are common/lowp.h's, the sums of
 * squares device_ops.c's blocks, the optimizers its sgd_step and
 * adam_pass, operation for operation. Internal to worker/cuda. */
#ifndef HPU_CUDA_ELEM_H
#define HPU_CUDA_ELEM_H

#include <stddef.h>
#include <stdint.h>

#include "common/rowkey.h"
#include "worker/device/device.h"

#ifdef __CUDACC__
#define HPU_ELEM __device__ static inline
#define HPU_ELEM_HD __host__ __device__ static inline /* the launches' too */
#define E_ADD(a, b) __fadd_rn(a, b)
#define E_SUB(a, b) __fsub_rn(a, b)
#define E_MUL(a, b) __fmul_rn(a, b)
#define E_DIV(a, b) __fdiv_rn(a, b)
#define E_SQRT(a) __fsqrt_rn(a)
#define E_DADD(a, b) __dadd_rn(a, b)
#define E_DSUB(a, b) __dsub_rn(a, b)
#define E_DMUL(a, b) __dmul_rn(a, b)
#define E_DDIV(a, b) __ddiv_rn(a, b)
#define E_DSQRT(a) __dsqrt_rn(a)
#define E_POW(a, b) pow(a, b) /* CUDA's: within 2 ulp, not glibc's */
#define E_DFINITE(a) isfinite(a)
#define E_BITS(f) __float_as_uint(f)
#define E_FLOAT(u) __uint_as_float(u)
#else
#include <math.h>
#include <string.h>
#define HPU_ELEM static inline
#define HPU_ELEM_HD static inline
#define E_ADD(a, b) ((a) + (b))
#define E_SUB(a, b) ((a) - (b))
#define E_MUL(a, b) ((a) * (b))
#define E_DIV(a, b) ((a) / (b))
#define E_SQRT(a) sqrtf(a)
#define E_DADD(a, b) ((a) + (b))
#define E_DSUB(a, b) ((a) - (b))
#define E_DMUL(a, b) ((a) * (b))
#define E_DDIV(a, b) ((a) / (b))
#define E_DSQRT(a) sqrt(a)
#define E_POW(a, b) pow(a, b)
#define E_DFINITE(a) isfinite(a)
#define E_BITS(f) hpu__elem_bits(f)
#define E_FLOAT(u) hpu__elem_float(u)
static inline uint32_t hpu__elem_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}
static inline float hpu__elem_float(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}
#endif

#define HPU_SUMSQ_LANES 16
#define HPU_SUMSQ_BLOCK 256

/* The scalars of one SGD or Adam/AdamW pass, as device_ops.c computes
 * them on the host (double, rounded once): hpu__cuda_optk_of. */
typedef struct hpu__cuda_optk {
	int adam;         /* 0: SGD */
	int l2;           /* Adam: g += wd*p; AdamW: p *= decay */
	float lr, mu, wd; /* SGD (wd: Adam's too) */
	int first, nesterov;
	float b1, b2, c1, c2, decay, step, inv_sqrt_bc2, eps; /* Adam */
	float gscale;
} hpu__cuda_optk;

/* ---- common/lowp.h ---- */

HPU_ELEM uint16_t hpu__elem_to_bf16(float f)
{
	uint32_t x = E_BITS(f);
	uint32_t r = (x + 0x7fffu + ((x >> 16) & 1)) >> 16;
	uint32_t q = (x >> 16) | 0x40;
	return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r);
}

HPU_ELEM uint16_t hpu__elem_to_fp16(float f)
{
	uint32_t x = E_BITS(f), ax = x & 0x7fffffffu;
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t norm = (ax - (112u << 23) + 0xfffu + ((ax >> 13) & 1)) >> 13;
	uint32_t sub = E_BITS(E_ADD(E_FLOAT(ax), 0.5f)) - 0x3f000000u;
	uint32_t nan = 0x7e00u | ((ax >> 13) & 0x3ffu);
	uint32_t big = ax > 0x7f800000u ? nan : 0x7c00u;
	uint32_t r = ax < 0x38800000u ? sub : ax < 0x47800000u ? norm : big;
	return (uint16_t)(sign | r);
}

HPU_ELEM float hpu__elem_from_bf16(uint16_t h)
{
	return E_FLOAT((uint32_t)h << 16);
}

HPU_ELEM float hpu__elem_from_fp16(uint16_t h)
{
	uint32_t u = (uint32_t)(h & 0x7fffu) << 13;
	uint32_t e = u & 0x0f800000u;
	uint32_t norm = u + (112u << 23);
	uint32_t big = (norm + (112u << 23)) | (u > 0x0f800000u ? 0x400000u : 0);
	uint32_t sub = E_BITS(E_SUB(E_FLOAT(u + (113u << 23)), 0x1p-14f));
	uint32_t r = e == 0 ? sub : e == 0x0f800000u ? big : norm;
	return E_FLOAT(r | (uint32_t)(h & 0x8000u) << 16);
}

HPU_ELEM uint16_t hpu__elem_to16(int fp16, float f)
{
	return fp16 ? hpu__elem_to_fp16(f) : hpu__elem_to_bf16(f);
}

HPU_ELEM float hpu__elem_from16(int fp16, uint16_t h)
{
	return fp16 ? hpu__elem_from_fp16(h) : hpu__elem_from_bf16(h);
}

/* device_ops.c's acc16: the 16-bit rounding of d + s (an fp32 sum). */
HPU_ELEM uint16_t hpu__elem_acc16(int fp16, uint16_t d, float s)
{
	return hpu__elem_to16(fp16, E_ADD(hpu__elem_from16(fp16, d), s));
}

HPU_ELEM int hpu__elem_nonfinite(float f)
{
	return (E_BITS(f) & 0x7f800000u) == 0x7f800000u;
}

/* ---- sums of squares: device_ops.c's sumsq, block by block ----
 * Over fp32 values g, or (g NULL) 16-bit values h widened as they are
 * read (exactly: the same sums as over their fp32 copies, without a
 * thread's copy of its block in local memory). */

/* Value i: g's, else h's widened. */
HPU_ELEM float hpu__elem_sq_at(const float *g, int fp16, const uint16_t *h, size_t i)
{
	return g ? g[i] : hpu__elem_from16(fp16, h[i]);
}

HPU_ELEM double hpu__elem_sumsq_double(const float *g, int fp16, const uint16_t *h, size_t n)
{
	double s = 0.0;
	for (size_t i = 0; i < n; i++) {
		double v = (double)hpu__elem_sq_at(g, fp16, h, i);
		s = E_DADD(s, E_DMUL(v, v));
	}
	return s;
}

HPU_ELEM float hpu__elem_sumsq_block(const float *g, int fp16, const uint16_t *h)
{
	float acc[HPU_SUMSQ_LANES];
	for (int l = 0; l < HPU_SUMSQ_LANES; l++)
		acc[l] = 0.0f;
	for (int j = 0; j < HPU_SUMSQ_BLOCK; j += HPU_SUMSQ_LANES)
		for (int l = 0; l < HPU_SUMSQ_LANES; l++) {
			float v = hpu__elem_sq_at(g, fp16, h, (size_t)(j + l));
			acc[l] = E_ADD(acc[l], E_MUL(v, v));
		}
	for (int w = HPU_SUMSQ_LANES / 2; w > 0; w /= 2)
		for (int l = 0; l < w; l++)
			acc[l] = E_ADD(acc[l], acc[l + w]);
	return acc[0];
}

/* A part's sum of squares over len values: the rest's (len < 256 values,
 * in double), else a block's of 256 (redone in double where its fp32 sum
 * is not finite). */
HPU_ELEM double hpu__elem_sumsq_of(const float *g, int fp16, const uint16_t *h, size_t len,
				   int rest)
{
	if (rest)
		return hpu__elem_sumsq_double(g, fp16, h, len);
	float s = hpu__elem_sumsq_block(g, fp16, h);
	return !hpu__elem_nonfinite(s) ? (double)s
				       : hpu__elem_sumsq_double(g, fp16, h, HPU_SUMSQ_BLOCK);
}

/* Part b of g[n]'s sum of squares: block b's (b < n / 256), or the
 * rest's (b = n / 256). The sum is the parts added in order, the rest's
 * last. */
HPU_ELEM double hpu__elem_sumsq_part(const float *g, size_t n, size_t b)
{
	size_t nb = n / HPU_SUMSQ_BLOCK;
	return hpu__elem_sumsq_of(g + b * HPU_SUMSQ_BLOCK, 0, NULL,
				  b == nb ? n - nb * HPU_SUMSQ_BLOCK : HPU_SUMSQ_BLOCK, b == nb);
}

/* ---- the sum of squares of 16-bit values, chunk by chunk ----
 * device_ops.c's sumsq16: the values widened a chunk (c of them) at a
 * time, each chunk's sum of squares (its c / 256 + 1 parts added in order
 * onto 0) added onto the sum. On a GPU: every part of a batch of chunks
 * at once, then each chunk's parts added in order, then the chunks'
 * totals added in order onto the sum -- the same additions, three
 * launches a batch instead of three a chunk. */

/* Part b of the chunk h[c] of 16-bit values, widened (exactly). */
HPU_ELEM double hpu__elem_sumsq16_part(int fp16, const uint16_t *h, size_t c, size_t b)
{
	size_t nb = c / HPU_SUMSQ_BLOCK, len = b == nb ? c - nb * HPU_SUMSQ_BLOCK : HPU_SUMSQ_BLOCK;
	return hpu__elem_sumsq_of(NULL, fp16, h + b * HPU_SUMSQ_BLOCK, len, b == nb);
}

/* part[0] + ... + part[count - 1], added in order onto 0. */
HPU_ELEM double hpu__elem_parts_sum(const double *part, size_t count)
{
	double t = 0.0;
	for (size_t i = 0; i < count; i++)
		t = E_DADD(t, part[i]);
	return t;
}

/* The values chunk j of n in chunks of `chunk` holds. */
HPU_ELEM_HD size_t hpu__elem_chunk_len(size_t n, size_t chunk, size_t j)
{
	size_t i = j * chunk;
	return n - i < chunk ? n - i : chunk;
}

/* A batch's layout in `cap` doubles: *pc parts a chunk (a full one's;
 * chunk j's parts from j * pc), the totals after nj * pc of them; the
 * chunks a batch takes (0: a chunk's parts do not fit). */
HPU_ELEM_HD size_t hpu__elem_sumsq16_batch(size_t chunk, size_t cap, size_t *pc)
{
	*pc = chunk / HPU_SUMSQ_BLOCK + 1;
	return cap / (*pc + 1);
}

/* ---- the optimizers: one element ---- */

/* device_ops.c's sgd_step; buf: the momentum (NULL without). */
HPU_ELEM float hpu__elem_sgd(const hpu__cuda_optk *k, float p, float gi, float *buf)
{
	if (k->mu == 0.0f)
		return E_SUB(p, E_MUL(k->lr, E_ADD(gi, E_MUL(k->wd, p))));
	float d = E_ADD(gi, E_MUL(k->wd, p));
	float b = k->first ? d : E_ADD(E_MUL(k->mu, *buf), d);
	*buf = b;
	d = k->nesterov ? E_ADD(d, E_MUL(k->mu, b)) : b;
	return E_SUB(p, E_MUL(k->lr, d));
}

/* device_ops.c's adam_pass. */
HPU_ELEM float hpu__elem_adam(const hpu__cuda_optk *k, float p, float gi, float *m, float *v)
{
	if (k->l2)
		gi = E_ADD(gi, E_MUL(k->wd, p));
	float mi = E_ADD(E_MUL(k->b1, *m), E_MUL(k->c1, gi));
	float vi = E_ADD(E_MUL(k->b2, *v), E_MUL(E_MUL(k->c2, gi), gi));
	*m = mi;
	*v = vi;
	float pi = k->l2 ? p : E_MUL(p, k->decay);
	float den = E_ADD(E_MUL(E_SQRT(vi), k->inv_sqrt_bc2), k->eps);
	return E_SUB(pi, E_DIV(E_MUL(k->step, mi), den));
}

/* One parameter's step from its raw gradient gr (scaled here). */
HPU_ELEM float hpu__elem_optim(const hpu__cuda_optk *k, float p, float gr, float *m, float *v)
{
	float gi = E_MUL(k->gscale, gr);
	return k->adam ? hpu__elem_adam(k, p, gi, m, v) : hpu__elem_sgd(k, p, gi, m);
}

/* ---- accuracy's arg-max ----
 * The host's (worker/ops: hpu__host_count_correct, hpu__host_accuracy_pos)
 * scans a row from column 0 and moves to each column strictly larger
 * than its best so far. NaN compares false: a NaN in column 0 is the
 * arg-max, and no other NaN ever is; otherwise it is the first column
 * holding the largest value (-0 and +0 equal). The kernels split a row
 * among a block's threads: where hpu__elem_argmax_nan0(row[0]) the
 * answer is column 0; else each thread keeps, of its columns in order,
 * those hpu__elem_argmax_takes, and the block's answer is the first
 * column whose kept value equals the largest kept one: NaN-free, so the
 * order a reduction meets them in does not matter. */
HPU_ELEM int hpu__elem_argmax_nan0(float z0)
{
	return z0 != z0;
}

/* Whether a thread holding `best` (have: 0 for nothing yet) takes v. */
HPU_ELEM int hpu__elem_argmax_takes(float v, float best, int have)
{
	return v == v && (!have || v > best);
}
/* ---- the run context's row keys (common/rowkey.h, rand.c's) ----
 * Row r's key for a recordable step's dropout (backend.h's dropout_keys),
 * from the step and the rows' sample indices in device memory (samples
 * NULL: the row's index), as hpu_rand_key makes it on the host. */
HPU_ELEM uint64_t hpu__elem_row_key(uint64_t seed, int layer, const int64_t *step,
				    const uint32_t *samples, int r)
{
	return hpu__rk_key(seed, layer, (long)*step,
			   samples ? (uint64_t)samples[r] : (uint64_t)r);
}

/* ---- the step's decisions (device.h's hpu__dev_stepvars) ----
 * device_ops.c's step_begin, step_end and loss_seed, operation for
 * operation, on the block in place (one thread on the GPU). Only IEEE
 * operations (sqrt, division, fmax): the GPU's match the CPU's bit for
 * bit. */

/* device.h's hpu__dev_clip_factor. */
HPU_ELEM float hpu__elem_clip_factor(double norm, double max_norm)
{
	float denom = E_ADD((float)norm, (float)1e-6);
	float coef = E_MUL(E_DIV(1.0f, denom), (float)max_norm);
	return coef > 1.0f ? 1.0f : coef;
}

HPU_ELEM void hpu__elem_step_begin(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	sv->skip = sv->bad > 0;
	sv->norm = 0;
	if (sv->skip)
		return;
	sv->t++;
	float gscale = c->fp16 ? (float)E_DDIV(1.0, sv->loss_scale) : 1.0f;
	if (c->clip_norm > 0) {
		double norm = E_DSQRT(sv->sumsq);
		if (c->fp16)
			norm = E_DDIV(norm, sv->loss_scale);
		sv->norm = norm;
		gscale = E_MUL(gscale, hpu__elem_clip_factor(norm, c->clip_norm));
	}
	sv->gscale = gscale;
}

/* DeepSpeed's DynamicLossScaler (strategy_mp.c's update_scale). */
HPU_ELEM void hpu__elem_step_end(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	if (c->mixed) {
		if (c->fp16 && c->dynamic) {
			if (sv->skip) {
				if (c->hysteresis == 1 || sv->hyst_left == 1)
					sv->loss_scale = fmax(E_DDIV(sv->loss_scale, 2.0), c->min_scale);
				else
					sv->hyst_left--;
				sv->last_overflow = sv->step_no;
			} else if ((sv->step_no - sv->last_overflow) % c->window == 0) {
				sv->hyst_left = c->hysteresis;
				sv->loss_scale = E_DMUL(sv->loss_scale, 2.0);
			}
		}
		sv->step_no++;
		sv->skipped += sv->skip;
	}
	sv->bad = 0;
	sv->sumsq = 0;
}

/* A loss term's seed (device_ops.c's loss_seed): weight * s / batch in
 * fp32, s = (float)(base * loss_scale); NaN where a sum is not finite. */
HPU_ELEM float hpu__elem_loss_seed(const double *sums, int nsums, float weight, float base,
				   int batch, double loss_scale)
{
	int finite = 1;
	for (int k = 0; k < nsums; k++)
		finite &= E_DFINITE(sums[k]) != 0;
	float s = (float)E_DMUL((double)base, loss_scale);
	return finite ? E_DIV(E_MUL(weight, s), (float)batch) : E_FLOAT(0x7fc00000u);
}

/* The scalars of one pass (hpu__cuda_optk_of's arithmetic) from o's
 * constants and the step's lr, t and gscale: on the GPU where they are
 * device memory (o->sv). pow is the one operation not IEEE-exact: CUDA's
 * is within 2 ulp in double, so Adam's step and inv_sqrt_bc2 may, in
 * rare cases, round to a neighbouring float there. */
HPU_ELEM hpu__cuda_optk hpu__elem_optk(const hpu__dev_optim *o, double lr, long t_, float gscale,
				      const double *bp)
{
	hpu__cuda_optk k;
	k.adam = k.l2 = k.first = k.nesterov = 0;
	k.lr = k.mu = k.wd = 0.0f;
	k.b1 = k.b2 = k.c1 = k.c2 = k.decay = k.step = k.inv_sqrt_bc2 = k.eps = 0.0f;
	k.gscale = gscale;
	if (o->kind == HPU__DEV_SGD) {
		k.lr = (float)lr;
		k.mu = (float)o->momentum;
		k.wd = (float)o->weight_decay;
		k.first = t_ == 1;
		k.nesterov = o->nesterov;
		return k;
	}
	const int l2 = o->kind == HPU__DEV_ADAM;
	const double t = (double)t_;
	k.adam = 1;
	k.l2 = l2;
	k.b1 = (float)o->beta1;
	k.b2 = (float)o->beta2;
	k.c1 = (float)E_DSUB(1.0, o->beta1);
	k.c2 = (float)E_DSUB(1.0, o->beta2);
	k.decay = l2 ? 1.0f : (float)E_DSUB(1.0, E_DMUL(lr, o->weight_decay));
	k.wd = l2 ? (float)o->weight_decay : 0.0f;
	/* bp: beta1^t and beta2^t from the host (hpu__dev_stepvars), whose pow
	 * the CPU's update uses; NULL: this device's pow (within 2 ulp) */
	double p1 = bp ? bp[0] : E_POW(o->beta1, t), p2 = bp ? bp[1] : E_POW(o->beta2, t);
	k.step = (float)E_DDIV(lr, E_DSUB(1.0, p1));
	k.inv_sqrt_bc2 = (float)E_DDIV(1.0, E_DSQRT(E_DSUB(1.0, p2)));
	k.eps = (float)o->eps;
	return k;
}

#ifndef __CUDACC__
/* device_ops.c's scalars of one step, computed the same way (host). */
static inline hpu__cuda_optk hpu__cuda_optk_of(const hpu__dev_optim *o)
{
	hpu__cuda_optk k = {.gscale = o->gscale};
	if (o->kind == HPU__DEV_SGD) {
		k.lr = (float)o->lr;
		k.mu = (float)o->momentum;
		k.wd = (float)o->weight_decay;
		k.first = o->t == 1;
		k.nesterov = o->nesterov;
		return k;
	}
	const int l2 = o->kind == HPU__DEV_ADAM;
	const double t = (double)o->t, lr = o->lr;
	k.adam = 1;
	k.l2 = l2;
	k.b1 = (float)o->beta1;
	k.b2 = (float)o->beta2;
	k.c1 = (float)(1.0 - o->beta1);
	k.c2 = (float)(1.0 - o->beta2);
	k.decay = l2 ? 1.0f : (float)(1.0 - lr * o->weight_decay);
	k.wd = l2 ? (float)o->weight_decay : 0.0f;
	k.step = (float)(lr / (1.0 - pow(o->beta1, t)));
	k.inv_sqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(o->beta2, t)));
	k.eps = (float)o->eps;
	return k;
}
#endif

#endif
