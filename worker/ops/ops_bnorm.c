/* ops_bnorm: the batch norm layer's passes (worker/layers/norm.c) as ops
 * on the kernel table (backend.h): its kernel, else on the CPU's tables
 * the C loops here (hpu__be_host's). Statistics in double, two-pass. */
#include <math.h>
#include <stddef.h>

#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"

#include "hpu/hpu.h"
#include "hpu/ops.h"

/* Channel c's values x[b][c][0 .. spatial) of sample b. */
static const float *chan(const float *x, int nch, size_t spatial, int b, int c)
{
	return x + ((size_t)b * nch + c) * spatial;
}

/* The batch's mean and biased variance of channel c, two-pass. */
static void channel_stats(const float *x, int batch, int nch, size_t spatial, int c,
			  double *mean, double *var)
{
	double sum = 0, sq = 0, m = (double)batch * spatial;
	for (int b = 0; b < batch; b++) {
		const float *xc = chan(x, nch, spatial, b, c);
		for (size_t i = 0; i < spatial; i++)
			sum += xc[i];
	}
	double mu = sum / m;
	for (int b = 0; b < batch; b++) {
		const float *xc = chan(x, nch, spatial, b, c);
		for (size_t i = 0; i < spatial; i++)
			sq += (xc[i] - mu) * (xc[i] - mu);
	}
	*mean = mu;
	*var = sq / m;
}

/* y = (x - mean) * rstd * weight + bias over channel c. */
static void channel_apply(const float *x, float *y, int batch, int nch, size_t spatial, int c,
			  float mean, float rstd, float w, float bias)
{
	for (int b = 0; b < batch; b++) {
		const float *xc = chan(x, nch, spatial, b, c);
		float *yc = (float *)chan(y, nch, spatial, b, c);
		for (size_t i = 0; i < spatial; i++)
			yc[i] = (xc[i] - mean) * rstd * w + bias;
	}
}

int hpu__host_batchnorm_fwd(const float *x, float *y, const float *w, const float *bias,
			    float *run_mean, float *run_var, float *saved, int batch, int nch,
			    size_t spatial, float eps, float momentum, int train, int update)
{
	if (!train) {
		for (int c = 0; c < nch; c++)
			channel_apply(x, y, batch, nch, spatial, c, run_mean[c],
				      1.0f / sqrtf(run_var[c] + eps), w[c], bias[c]);
		return HPU_BE_OK;
	}
	double m = (double)batch * spatial;
	for (int c = 0; c < nch; c++) {
		double mean, var;
		channel_stats(x, batch, nch, spatial, c, &mean, &var);
		float rstd = (float)(1.0 / sqrt(var + eps));
		channel_apply(x, y, batch, nch, spatial, c, (float)mean, rstd, w[c], bias[c]);
		if (saved) { /* for backward; a forward-only call may have none */
			saved[c] = (float)mean;
			saved[nch + c] = rstd;
		}
		if (!update)
			continue;
		run_mean[c] = (1 - momentum) * run_mean[c] + momentum * (float)mean;
		run_var[c] = (1 - momentum) * run_var[c] + momentum * (float)(var * m / (m - 1));
	}
	return HPU_BE_OK;
}

int hpu__host_batchnorm_bwd(const float *x, const float *dy, const float *w, const float *saved,
			    float *dw, float *dbias, float *dx, int batch, int nch, size_t spatial)
{
	double m = (double)batch * spatial;
	for (int c = 0; c < nch; c++) {
		float mean = saved[c], rstd = saved[nch + c];
		double sdy = 0, sdyx = 0;
		for (int b = 0; b < batch; b++) {
			const float *xc = chan(x, nch, spatial, b, c);
			const float *dyc = chan(dy, nch, spatial, b, c);
			for (size_t i = 0; i < spatial; i++) {
				sdy += dyc[i];
				sdyx += (double)dyc[i] * ((xc[i] - mean) * rstd);
			}
		}
		dw[c] += (float)sdyx;
		dbias[c] += (float)sdy;
		if (!dx)
			continue;
		float gm = (float)(sdy / m), gxm = (float)(sdyx / m), k = w[c] * rstd;
		for (int b = 0; b < batch; b++) {
			const float *xc = chan(x, nch, spatial, b, c);
			const float *dyc = chan(dy, nch, spatial, b, c);
			float *dxc = (float *)chan(dx, nch, spatial, b, c);
			for (size_t i = 0; i < spatial; i++)
				dxc[i] = k * (dyc[i] - gm - (xc[i] - mean) * rstd * gxm);
		}
	}
	return HPU_BE_OK;
}

int hpu_batchnorm_forward(const float *x, float *y, const float *w, const float *bias,
			  float *run_mean, float *run_var, float *saved, int batch, int ch,
			  size_t spatial, float eps, float momentum, int train, int update)
{
	int rc = HPU__BE_RUN(batchnorm_fwd, hpu__host_batchnorm_fwd, x, y, w, bias, run_mean,
			     run_var, saved, batch, ch, spatial, eps, momentum, train, update);
	return rc == HPU_BE_OK ? HPU_OK : HPU_ERROR;
}

int hpu_batchnorm_backward(const float *x, const float *dy, const float *w, const float *saved,
			   float *dw, float *dbias, float *dx, int batch, int ch, size_t spatial)
{
	int rc = HPU__BE_RUN(batchnorm_bwd, hpu__host_batchnorm_bwd, x, dy, w, saved, dw, dbias,
			     dx, batch, ch, spatial);
	return rc == HPU_BE_OK ? HPU_OK : HPU_ERROR;
}
