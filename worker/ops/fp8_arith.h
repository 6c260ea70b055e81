/* fp8_arith: fp8's arithmetic written once for the host's kernels
 * (fp8.c) and a GPU's (worker/cuda/ops/cuops_kernels.cu, where nvcc
 * compiles it for the device too): a tensor's scale from its amax, one
 * call site's roll of this step's amax into its histories (fp8.h lays out
 * the state), and the byte of a value on a format's grid. Plain IEEE
 * single-precision arithmetic (a division, frexpf, ldexpf), so both give
 * the same bits. */
#ifndef HPU_FP8_ARITH_H
#define HPU_FP8_ARITH_H

#include <math.h>
#include <stddef.h>

#ifdef __CUDACC__
#define HPU_FP8_FN static __host__ __device__ inline
#else
#define HPU_FP8_FN static inline
#endif

/* 2^(floor(log2(max / amax)) - margin), the exponent kept within
 * [-100, 100]; 0 when amax is 0, negative or not finite (no scale can be
 * had). An amax so small that max / amax overflows takes 2^100. */
HPU_FP8_FN float hpu__fp8_scale_of(float amax, float max, int margin)
{
	if (!(amax > 0.0f) || !isfinite(amax))
		return 0.0f;
	float r = max / amax;
	int e = 100;
	if (isfinite(r)) {
		frexpf(r, &e); /* r = f * 2^e, f in [0.5, 1) */
		e = e - 1 - margin;
	}
	e = e < -100 ? -100 : e > 100 ? 100 : e;
	return ldexpf(1.0f, e);
}

/* One call site's roll: st its step pairs [3][2] (amax so far, seen),
 * sc its scale pairs [3][2], z its history block (slots filled, the next
 * slot, then `history` amax values for each of x, w, dy). A tensor seen
 * this step puts its amax in the slot (its pair cleared) and takes the
 * scale of the history's largest amax (use_max) or of this one, with
 * max4 (x, w: E4M3) or max5 (dy: E5M2); an amax of 0, inf or NaN keeps
 * the scale. One not seen puts 0 there. Then the next slot. */
HPU_FP8_FN void hpu__fp8_roll_one(float *st, float *sc, float *z, int history, int use_max,
				  int margin, float max4, float max5)
{
	int H = history, nhist = (int)z[0], pos = (int)z[1];
	for (int t = 0; t < 3; t++) {
		float *h = z + 2 + (size_t)t * H;
		if (st[2 * t + 1] == 0.0f) { /* not seen this step on any rank */
			h[pos] = 0.0f;
			continue;
		}
		h[pos] = st[2 * t];
		st[2 * t] = st[2 * t + 1] = 0.0f;
		int filled = nhist + 1 < H ? nhist + 1 : H;
		float a = h[pos];
		if (use_max)
			for (int j = 0; j < filled; j++)
				a = h[j] > a ? h[j] : a;
		float s = hpu__fp8_scale_of(a, t == 2 ? max5 : max4, margin);
		if (s != 0.0f)
			sc[2 * t] = s;
	}
	/* one history slot per step for all three tensors */
	z[0] = (float)(nhist < H ? nhist + 1 : H);
	z[1] = (float)((pos + 1) % H);
}

/* The fp8 byte of r, a value of the format with mbits mantissa bits, its
 * smallest normal 2^emin and exponent bias `bias` (on its grid and within
 * its range, as fake_quant at scale 1 leaves it; NaN; E5M2's
 * infinities): sign, exponent field, mantissa. */
HPU_FP8_FN unsigned char hpu__fp8_byte(float r, int mbits, int emin, int bias)
{
	unsigned sign = signbit(r) ? 0x80u : 0u;
	if (isnan(r))
		return (unsigned char)(sign | 0x7fu);
	if (isinf(r)) /* E5M2 only */
		return (unsigned char)(sign | 0x7cu);
	float a = fabsf(r);
	if (a < ldexpf(1.0f, emin)) /* subnormal: a multiple of 2^(emin - mbits) */
		return (unsigned char)(sign | (unsigned)ldexpf(a, mbits - emin));
	int e;
	float f = frexpf(a, &e); /* a = f 2^e, f in [0.5, 1): 1.m 2^(e - 1) */
	unsigned man = (unsigned)((2.0f * f - 1.0f) * (float)(1 << mbits));
	return (unsigned char)(sign | (unsigned)(e - 1 + bias) << mbits | man);
}

#endif
