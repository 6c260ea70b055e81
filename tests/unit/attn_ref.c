/* attn_ref: see attn_ref.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/attn_ref.h"

static int allowed(const int32_t *m, int causal, int i, int j)
{
	return (!causal || j <= i) && (!m || m[j]);
}

/* One head: p[T, T] the probabilities (0 where not allowed). */
static void head(const float *qkv, const int32_t *m, const float *dctx, int b, int h, int t,
		 int heads, int hd, int causal, double *ctx, double *lse, double *dqkv, double *p)
{
	const size_t d = (size_t)heads * hd, ld = 3 * d;
	const double scale = 1.0 / sqrt((double)hd);
#define Q(i, e) (double)qkv[((size_t)b * t + (i)) * ld + (size_t)h * hd + (e)]
#define K(i, e) (double)qkv[((size_t)b * t + (i)) * ld + d + (size_t)h * hd + (e)]
#define V(i, e) (double)qkv[((size_t)b * t + (i)) * ld + 2 * d + (size_t)h * hd + (e)]
#define DO(i, e) (double)dctx[((size_t)b * t + (i)) * d + (size_t)h * hd + (e)]
	for (int i = 0; i < t; i++) {
		double *row = p + (size_t)i * t, mx = -INFINITY, sum = 0;
		for (int j = 0; j < t; j++) {
			double s = 0;
			for (int e = 0; e < hd; e++)
				s += Q(i, e) * K(j, e);
			row[j] = allowed(m, causal, i, j) ? s * scale : -INFINITY;
			mx = row[j] > mx ? row[j] : mx;
		}
		for (int j = 0; j < t; j++) {
			row[j] = mx == -INFINITY ? 0 : exp(row[j] - mx);
			sum += row[j];
		}
		for (int j = 0; j < t; j++)
			row[j] = sum > 0 ? row[j] / sum : 0;
		lse[((size_t)b * heads + h) * t + i] = sum > 0 ? mx + log(sum) : 0;
		for (int e = 0; e < hd; e++) {
			double o = 0;
			for (int j = 0; j < t; j++)
				o += row[j] * V(j, e);
			ctx[((size_t)b * t + i) * d + (size_t)h * hd + e] = o;
		}
	}
	if (!dctx)
		return;
	double *dq = dqkv, *dk = dqkv + d, *dv = dqkv + 2 * d;
	for (int i = 0; i < t; i++) {
		const double *row = p + (size_t)i * t;
		double *ds = malloc((size_t)t * sizeof *ds), rs = 0;
		for (int j = 0; j < t; j++) {
			double dp = 0;
			for (int e = 0; e < hd; e++)
				dp += DO(i, e) * V(j, e);
			ds[j] = dp;
			rs += dp * row[j];
		}
		for (int j = 0; j < t; j++)
			ds[j] = row[j] * (ds[j] - rs);
		size_t ri = ((size_t)b * t + i) * ld + (size_t)h * hd;
		for (int j = 0; j < t; j++) {
			size_t rj = ((size_t)b * t + j) * ld + (size_t)h * hd;
			for (int e = 0; e < hd; e++) {
				dq[ri + e] += scale * ds[j] * K(j, e);
				dk[rj + e] += scale * ds[j] * Q(i, e);
				dv[rj + e] += row[j] * DO(i, e);
			}
		}
		free(ds);
	}
#undef Q
#undef K
#undef V
#undef DO
}

void attn_ref(const float *qkv, const int32_t *mask, const float *dctx, int batch, int t,
	      int heads, int hd, int causal, double *ctx, double *lse, double *dqkv)
{
	double *p = malloc((size_t)t * t * sizeof *p);
	if (dctx)
		memset(dqkv, 0, (size_t)batch * t * 3 * heads * hd * sizeof *dqkv);
	for (int b = 0; b < batch; b++)
		for (int h = 0; h < heads; h++)
			head(qkv, mask ? mask + (size_t)b * t : NULL, dctx, b, h, t, heads, hd,
			     causal, ctx, lse, dqkv, p);
	free(p);
}

const int32_t attn_mask13[3 * 13] = {1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0,
				     1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
				     0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
const int32_t attn_mask7[2 * 7] = {0, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 1};

size_t attn_zeros_wrong(const float *ctx, const float *dqkv, const int32_t *mask, int batch,
			int t, size_t d, int causal, int *empties, int *pads)
{
	size_t wrong = 0;
	*empties = 0;
	if (pads)
		*pads = 0;
	for (int b = 0; b < batch; b++) {
		const int32_t *m = mask ? mask + (size_t)b * t : NULL;
		for (int i = 0; i < t; i++) {
			const float *row = dqkv + ((size_t)b * t + i) * 3 * d;
			int any = 0;
			for (int j = 0; j < t; j++)
				any |= allowed(m, causal, i, j);
			for (size_t e = 0; !any && e < d; e++)
				wrong += ctx[((size_t)b * t + i) * d + e] != 0.0f || row[e] != 0.0f;
			*empties += !any;
			if (pads && m && !m[i]) {
				for (size_t e = d; e < 3 * d; e++)
					wrong += row[e] != 0.0f;
				++*pads;
			}
		}
	}
	return wrong;
}
