/* device_ops: the runtime's own ops on the CPU devices (hpu__dev_rtops,
 * device.h), the loops the runtime ran on the host before it held its
 * tensors through the device, moved here unchanged so that every result
 * keeps its bits: the 16-bit casts of mixed precision, the bf16
 * activations kept, gradient sums, the gradient norm's sums of squares,
 * the non-finite checks and the optimizers' fused update.
 *
 * Compiled -O3 -fno-math-errno (sqrtf without errno); the build is ISO C
 * with -ffp-contract=off, so HPU_CLONES' AVX2 and AVX-512 clones round
 * exactly as the baseline does. Keep the loops free of calls and of
 * branches that depend on i. */
#include <math.h>
#include <string.h>

#include "worker/device/device.h"
#include "worker/ops/autocast.h"
#include "common/lowp.h"
#include "common/simd.h"

/* ---- 16-bit <-> fp32 ---- */

HPU_CLONES static void to16_plain(int fp16, uint16_t *restrict dst, const float *restrict src,
				  size_t n)
{
	if (fp16)
		for (size_t i = 0; i < n; i++)
			dst[i] = hpu_to_fp16(src[i]);
	else
		for (size_t i = 0; i < n; i++)
			dst[i] = hpu_to_bf16(src[i]);
}

static void to16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	if (fp16 && hpu_have_f16c())
		hpu__f16c_to_fp16(dst, src, n);
	else
		to16_plain(fp16, dst, src, n);
}

static void from16(int fp16, float *dst, const uint16_t *src, size_t n)
{
	hpu__ac_from16(fp16, dst, src, n);
}

HPU_CLONES static void add(float *restrict dst, const float *restrict src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] += src[i];
}

static void add_scalar(float *dst, float v, size_t n)
{
	for (size_t r = 0; r < n; r++)
		dst[r] += v;
}

static void acc16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	float tmp[1024];
	for (size_t i = 0; i < n; i += 1024) {
		size_t c = n - i < 1024 ? n - i : 1024;
		from16(fp16, tmp, dst + i, c);
		add(tmp, src + i, c);
		to16(fp16, dst + i, tmp, c);
	}
}

/* dst[k] = the bf16 of x[k]; returns 1 when every x[k] was a bf16 value
 * (so that dst holds x exactly). */
HPU_CLONES static int bf16_exact(uint16_t *restrict dst, const float *restrict x, size_t n)
{
	uint32_t off = 0;
	for (size_t k = 0; k < n; k++) {
		uint32_t v;
		memcpy(&v, &x[k], 4);
		off |= v & 0xffffu;
		dst[k] = (uint16_t)(v >> 16);
	}
	return off == 0;
}

HPU_CLONES static void bf16_expand(float *restrict dst, const uint16_t *restrict src, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		uint32_t v = (uint32_t)src[k] << 16;
		memcpy(&dst[k], &v, 4);
	}
}

/* ---- checks ---- */

/* An Inf or NaN in g[n]: the largest magnitude's bits reach the all-ones
 * exponent. (An integer max vectorizes; a float sum, in order, does not:
 * it cost a tenth of an fp32 MLP step.) */
HPU_CLONES static int nonfinite(const float *restrict g, size_t n)
{
	uint32_t top = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t b;
		memcpy(&b, &g[i], sizeof b);
		b &= 0x7fffffffu;
		top = b > top ? b : top;
	}
	return top >= 0x7f800000u;
}

HPU_CLONES static int nonfinite16(int fp16, const uint16_t *restrict h, size_t n)
{
	const uint16_t mask = fp16 ? 0x7c00 : 0x7f80;
	int bad = 0;
	for (size_t i = 0; i < n; i++)
		bad |= (h[i] & mask) == mask;
	return bad;
}

/* Inf or NaN among n floats / bf16 values: how many. */
static long count_nonfinite(const float *v, size_t n)
{
	long k = 0;
	for (size_t i = 0; i < n; i++)
		k += !isfinite(v[i]);
	return k;
}

static long count_nonfinite16(const uint16_t *v, size_t n)
{
	long k = 0;
	for (size_t i = 0; i < n; i++)
		k += (v[i] & 0x7f80u) == 0x7f80u;
	return k;
}

/* ---- sums of squares ----
 * Squares summed in fp32 within blocks of SUMSQ_BLOCK elements, over
 * SUMSQ_LANES independent accumulators (so that the loop vectorizes and
 * each accumulator adds only SUMSQ_BLOCK / SUMSQ_LANES terms: relative
 * error below 2e-6, ~1e-9 typically), each block's sum then added in
 * double: 1.5x a double loop's speed in cache, the same from memory. A
 * block whose fp32 sum overflows (an |g| above ~1e19) is summed again in
 * double, so the result overflows only where a double would. Squares below
 * FLT_MIN (|g| < 1e-19) lose precision in fp32: the absolute error is at
 * most n * 1.2e-38, far below anything clipping (norm + 1e-6) can see. */
#define SUMSQ_LANES 16
#define SUMSQ_BLOCK 256

static double sumsq_double(const float *g, size_t n)
{
	double s = 0.0;
	for (size_t i = 0; i < n; i++)
		s += (double)g[i] * (double)g[i];
	return s;
}

static inline float sumsq_block(const float *g)
{
	float acc[SUMSQ_LANES] = {0};
	for (size_t j = 0; j < SUMSQ_BLOCK; j += SUMSQ_LANES)
		for (size_t l = 0; l < SUMSQ_LANES; l++)
			acc[l] += g[j + l] * g[j + l];
	for (size_t w = SUMSQ_LANES / 2; w > 0; w /= 2) /* pairwise */
		for (size_t l = 0; l < w; l++)
			acc[l] += acc[l + w];
	return acc[0];
}

HPU_CLONES static double sumsq(const float *g, size_t n)
{
	double total = 0.0;
	size_t i = 0;
	for (; i + SUMSQ_BLOCK <= n; i += SUMSQ_BLOCK) {
		float b = sumsq_block(g + i);
		/* inf or NaN: redo in double (NaN stays NaN) */
		total += isfinite(b) ? (double)b : sumsq_double(g + i, SUMSQ_BLOCK);
	}
	return total + sumsq_double(g + i, n - i);
}

static void sum(double *out, const float *v, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++)
		m += v[i];
	*out = m;
}

static double sumsq16(double acc, int fp16, const uint16_t *g, size_t n, float *scratch,
		      size_t chunk)
{
	for (size_t i = 0; i < n; i += chunk) {
		size_t c = n - i < chunk ? n - i : chunk;
		from16(fp16, scratch, g + i, c);
		acc += sumsq(scratch, c);
	}
	return acc;
}

/* ---- the optimizers ----
 * Every step is one pass over the n parameters, in fp32 the way torch does
 * it after clip_grad_norm_: the gradient is first scaled by gscale (rounded
 * to fp32, as g.mul_(clip_coef) leaves it), then weight decay, moments and
 * the update. Scalars that torch computes in Python (double) are computed in
 * double here and rounded once. */

/* torch.optim.SGD (dampening 0): d = g + wd*p; buf = d at the first step,
 * else mu*buf + d; d = nesterov ? d + mu*buf : buf; p -= lr*d. */
HPU_CLONES static void sgd_step(const hpu__dev_optim *k, float *p, const float *g, float *buf,
				size_t n)
{
	const float lr = (float)k->lr, mu = (float)k->momentum, wd = (float)k->weight_decay;
	const float gscale = k->gscale;
	if (mu == 0.0f) {
		for (size_t i = 0; i < n; i++) {
			float gi = gscale * g[i];
			p[i] -= lr * (gi + wd * p[i]);
		}
		return;
	}
	const int first = k->t == 1, nesterov = k->nesterov;
	for (size_t i = 0; i < n; i++) {
		float gi = gscale * g[i];
		float d = gi + wd * p[i];
		buf[i] = first ? d : mu * buf[i] + d;
		d = nesterov ? d + mu * buf[i] : buf[i];
		p[i] -= lr * d;
	}
}

/* The scalars of one Adam / AdamW step. */
typedef struct adam_k {
	float b1, b2, c1, c2; /* beta and 1 - beta (in double, then rounded:
			       * 1 - (float)0.999 is off by 1e-5) */
	float decay;          /* AdamW: 1 - lr*wd; Adam: 1 */
	float l2;             /* Adam: wd added to g as wd*p; AdamW: 0 */
	float step;           /* lr / (1 - beta1^t) */
	float inv_sqrt_bc2;   /* 1 / sqrt(1 - beta2^t) */
	float eps;
} adam_k;

/* m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
 * p = p*decay - step * m / (sqrt(v)/sqrt(bc2) + eps), with g = gscale*g
 * (+ wd*p for Adam). `l2` is a constant at each call site, so the compiler
 * makes one loop of each without the test inside. */
static inline void adam_pass(const adam_k *k, int l2, float *p, const float *g, float *m,
			     float *v, size_t n, float gscale)
{
	const float b1 = k->b1, b2 = k->b2, c1 = k->c1, c2 = k->c2;
	const float decay = k->decay, wd = k->l2, step = k->step,
		    inv_sqrt_bc2 = k->inv_sqrt_bc2, eps = k->eps;
	for (size_t i = 0; i < n; i++) {
		float gi = gscale * g[i];
		if (l2)
			gi = gi + wd * p[i];
		m[i] = b1 * m[i] + c1 * gi;
		v[i] = b2 * v[i] + c2 * gi * gi;
		float pi = l2 ? p[i] : p[i] * decay;
		p[i] = pi - step * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
	}
}

HPU_CLONES static void adam_l2(const adam_k *k, float *p, const float *g, float *m, float *v,
			       size_t n, float gscale)
{
	adam_pass(k, 1, p, g, m, v, n, gscale);
}

HPU_CLONES static void adam_decoupled(const adam_k *k, float *p, const float *g, float *m,
				      float *v, size_t n, float gscale)
{
	adam_pass(k, 0, p, g, m, v, n, gscale);
}

/* torch.optim.Adam (L2: g += wd*p) and torch.optim.AdamW (decoupled:
 * p *= 1 - lr*wd), amsgrad off. */
static adam_k adam_scalars(const hpu__dev_optim *o)
{
	const int l2 = o->kind == HPU__DEV_ADAM;
	const double t = (double)o->t, lr = o->lr;
	return (adam_k){
		.b1 = (float)o->beta1,
		.b2 = (float)o->beta2,
		.c1 = (float)(1.0 - o->beta1),
		.c2 = (float)(1.0 - o->beta2),
		.decay = l2 ? 1.0f : (float)(1.0 - lr * o->weight_decay),
		.l2 = l2 ? (float)o->weight_decay : 0.0f,
		.step = (float)(lr / (1.0 - pow(o->beta1, t))),
		.inv_sqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(o->beta2, t))),
		.eps = (float)o->eps,
	};
}

static void adam_step(const hpu__dev_optim *o, float *p, const float *g, float *m, float *v,
		      size_t n)
{
	const int l2 = o->kind == HPU__DEV_ADAM;
	const adam_k k = adam_scalars(o);
	if (l2)
		adam_l2(&k, p, g, m, v, n, o->gscale);
	else
		adam_decoupled(&k, p, g, m, v, n, o->gscale);
}

/* k with sv's lr, t and gscale (device memory, read inside the device
 * call); 0 where sv says the step is skipped. */
static int with_vars(const hpu__dev_optim *k, hpu__dev_optim *out)
{
	*out = *k;
	if (!k->sv)
		return 1;
	if (k->sv->skip)
		return 0;
	out->lr = k->sv->lr;
	out->t = k->sv->t;
	out->gscale = k->sv->gscale;
	out->sv = NULL;
	return 1;
}

static void optim(const hpu__dev_optim *o, float *p, const float *g, float *m, float *v,
		  size_t n)
{
	hpu__dev_optim kv;
	if (!with_vars(o, &kv))
		return;
	const hpu__dev_optim *k = &kv;
	if (k->kind == HPU__DEV_SGD)
		sgd_step(k, p, g, m, n);
	else
		adam_step(k, p, g, m, v, n);
}

/* bf16 Adam / AdamW in one pass: the gradient read from bf16 (exact in
 * fp32), the update as adam_pass makes it, the new master weight rounded
 * into the working copy; the same values as converting, updating and
 * rounding chunk by chunk, without the two extra passes. */
static inline void adam_pass_bf16(const adam_k *k, int l2, float *p, const uint16_t *g16,
				  uint16_t *p16, float *m, float *v, size_t n, float gscale)
{
	const float b1 = k->b1, b2 = k->b2, c1 = k->c1, c2 = k->c2;
	const float decay = k->decay, wd = k->l2, step = k->step,
		    inv_sqrt_bc2 = k->inv_sqrt_bc2, eps = k->eps;
	for (size_t i = 0; i < n; i++) {
		float gi = gscale * hpu_from_bf16(g16[i]);
		if (l2)
			gi = gi + wd * p[i];
		m[i] = b1 * m[i] + c1 * gi;
		v[i] = b2 * v[i] + c2 * gi * gi;
		float pi = l2 ? p[i] : p[i] * decay;
		pi = pi - step * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
		p[i] = pi;
		p16[i] = hpu_to_bf16(pi);
	}
}

HPU_CLONES static void adam_l2_bf16(const adam_k *k, float *restrict p,
				    const uint16_t *restrict g16, uint16_t *restrict p16,
				    float *restrict m, float *restrict v, size_t n, float gscale)
{
	adam_pass_bf16(k, 1, p, g16, p16, m, v, n, gscale);
}

HPU_CLONES static void adam_decoupled_bf16(const adam_k *k, float *restrict p,
					   const uint16_t *restrict g16, uint16_t *restrict p16,
					   float *restrict m, float *restrict v, size_t n,
					   float gscale)
{
	adam_pass_bf16(k, 0, p, g16, p16, m, v, n, gscale);
}

static void optim16(const hpu__dev_optim *o, int fp16, float *p, const uint16_t *g16,
		    uint16_t *p16, float *m, float *v, size_t n, float *scratch, size_t chunk)
{
	hpu__dev_optim kv;
	if (!with_vars(o, &kv))
		return;
	const hpu__dev_optim *k = &kv;
	if (!fp16 && k->kind != HPU__DEV_SGD) {
		const adam_k a = adam_scalars(k);
		if (k->kind == HPU__DEV_ADAM)
			adam_l2_bf16(&a, p, g16, p16, m, v, n, k->gscale);
		else
			adam_decoupled_bf16(&a, p, g16, p16, m, v, n, k->gscale);
		return;
	}
	for (size_t i = 0; i < n; i += chunk) {
		size_t c = n - i < chunk ? n - i : chunk;
		from16(fp16, scratch, g16 + i, c);
		optim(k, p + i, scratch, m ? m + i : NULL, v ? v + i : NULL, c);
		to16(fp16, p16 + i, p + i, c);
	}
}

/* ---- the step's decisions (hpu__dev_stepvars) ---- */

static void flag_nonfinite(float *flag, const float *g, size_t n)
{
	if (nonfinite(g, n))
		*flag = 1;
}

static void flag_nonfinite16(float *flag, int fp16, const uint16_t *g, size_t n)
{
	if (nonfinite16(fp16, g, n))
		*flag = 1;
}

static void sumsq_add(double *acc, const float *g, size_t n)
{
	*acc += sumsq(g, n);
}

static void sumsq16_add(double *acc, int fp16, const uint16_t *g, size_t n, float *scratch,
			size_t chunk)
{
	*acc = sumsq16(*acc, fp16, g, n, scratch, chunk);
}

static void loss_seed(float *g, size_t n, const double *sums, int nsums, float weight,
		      float base, int batch, hpu__dev_stepvars *sv)
{
	int finite = 1;
	for (int k = 0; k < nsums; k++)
		finite &= isfinite(sums[k]) != 0;
	if (!finite)
		sv->bad = 1;
	float scale = (float)(base * sv->loss_scale);
	add_scalar(g, finite ? weight * scale / (float)batch : NAN, n);
}

static void step_begin(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	sv->skip = sv->bad > 0;
	sv->norm = 0;
	if (sv->skip)
		return;
	sv->t++;
	float gscale = c->fp16 ? (float)(1.0 / sv->loss_scale) : 1.0f;
	if (c->clip_norm > 0) {
		double norm = sqrt(sv->sumsq);
		if (c->fp16)
			norm /= sv->loss_scale;
		sv->norm = norm;
		gscale *= hpu__dev_clip_factor(norm, c->clip_norm);
	}
	sv->gscale = gscale;
}

/* DeepSpeed's DynamicLossScaler (strategy_mp.c said it first). */
static void step_end(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	if (c->mixed) {
		if (c->fp16 && c->dynamic) {
			if (sv->skip) {
				if (c->hysteresis == 1 || sv->hyst_left == 1)
					sv->loss_scale = fmax(sv->loss_scale / 2, c->min_scale);
				else
					sv->hyst_left--;
				sv->last_overflow = sv->step_no;
			} else if ((sv->step_no - sv->last_overflow) % c->window == 0) {
				sv->hyst_left = c->hysteresis;
				sv->loss_scale *= 2;
			}
		}
		sv->step_no++;
		sv->skipped += sv->skip;
	}
	sv->bad = 0;
	sv->sumsq = 0;
}

static void rows_add(double *acc, const float *v, size_t n, const int *rows)
{
	size_t m = *rows < 0 ? 0 : (size_t)*rows;
	double a = *acc;
	for (size_t r = 0; r < n && r < m; r++)
		a += v[r];
	*acc = a;
}

static void loss_add(double *acc, const double *sums, const double *w, int nloss,
		     const int *rows)
{
	double sum = 0;
	for (int k = 0; k < nloss; k++)
		sum += w[k] * (sums[k] / *rows);
	*acc += sum * *rows;
}

const hpu__dev_rtops hpu__dev_cpu_rtops = {
    .to16 = to16,
    .from16 = from16,
    .acc16 = acc16,
    .bf16_exact = bf16_exact,
    .bf16_expand = bf16_expand,
    .add = add,
    .add_scalar = add_scalar,
    .sumsq = sumsq,
    .sumsq16 = sumsq16,
    .sum = sum,
    .nonfinite = nonfinite,
    .nonfinite16 = nonfinite16,
    .count_nonfinite = count_nonfinite,
    .count_nonfinite16 = count_nonfinite16,
    .optim = optim,
    .optim16 = optim16,
    .flag_nonfinite = flag_nonfinite,
    .flag_nonfinite16 = flag_nonfinite16,
    .sumsq_add = sumsq_add,
    .sumsq16_add = sumsq16_add,
    .loss_seed = loss_seed,
    .step_begin = step_begin,
    .step_end = step_end,
    .rows_add = rows_add,
    .loss_add = loss_add,
};
