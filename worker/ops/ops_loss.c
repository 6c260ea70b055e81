/* ops_loss: the kernels of the layers hpu_cross_entropy and hpu_accuracy
 * over positions (worker/layers/loss.c): per-sample means, -100 ignored,
 * sums in double. The op runs the table's kernel (backend.h), else on the
 * CPU's tables the C loops below (hpu__be_host's). */
#include <math.h>
#include <string.h>

#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"

#include "hpu/hpu.h"
#include "hpu/ops.h"

#define IGNORE_INDEX (-100)

/* log(sum(exp(x[0 .. n)))), stable. */
static double logsumexp(const float *x, int n)
{
	float m = x[0];
	for (int j = 1; j < n; j++)
		if (x[j] > m)
			m = x[j];
	double s = 0;
	for (int j = 0; j < n; j++)
		s += exp((double)x[j] - (double)m);
	return (double)m + log(s);
}

int hpu__host_xent_pos_fwd(const float *logits, const int32_t *labels, float *lse, float *loss,
			   int rows, size_t positions, int classes, long *bad, int32_t *bad_label)
{
	*bad = -1;
	for (int r = 0; r < rows; r++) {
		double sum = 0;
		size_t n = 0;
		for (size_t p = 0; p < positions; p++) {
			size_t at = (size_t)r * positions + p;
			const float *x = logits + at * (size_t)classes;
			int32_t y = labels[at];
			if (y == IGNORE_INDEX) {
				lse[at] = 0;
				continue;
			}
			if (y < 0 || y >= classes) {
				*bad = (long)at;
				*bad_label = y;
				return HPU_BE_OK;
			}
			double z = logsumexp(x, classes);
			lse[at] = (float)z;
			sum += z - (double)x[y];
			n++;
		}
		loss[r] = n ? (float)(sum / (double)n) : 0.0f;
	}
	return HPU_BE_OK;
}

int hpu__host_xent_pos_bwd(const float *logits, const int32_t *labels, const float *lse,
			   const float *dloss, float *dx, int rows, size_t positions, int classes)
{
	size_t C = (size_t)classes;
	for (int r = 0; r < rows; r++) {
		const int32_t *yr = labels + (size_t)r * positions;
		size_t n = 0;
		for (size_t p = 0; p < positions; p++)
			n += yr[p] != IGNORE_INDEX;
		float g = n ? dloss[r] / (float)n : 0.0f;
		for (size_t p = 0; p < positions; p++) {
			size_t at = (size_t)r * positions + p;
			const float *x = logits + at * C;
			float *d = dx + at * C;
			if (yr[p] == IGNORE_INDEX) {
				memset(d, 0, C * sizeof *d);
				continue;
			}
			for (size_t j = 0; j < C; j++)
				d[j] = g * expf(x[j] - lse[at]);
			d[yr[p]] -= g;
		}
	}
	return HPU_BE_OK;
}

int hpu__host_accuracy_pos(const float *logits, const int32_t *labels, float *acc, int rows,
			   size_t positions, int classes, long *bad, int32_t *bad_label)
{
	*bad = -1;
	for (int r = 0; r < rows; r++) {
		size_t n = 0, right = 0;
		for (size_t p = 0; p < positions; p++) {
			size_t at = (size_t)r * positions + p;
			const float *x = logits + at * (size_t)classes;
			int32_t y = labels[at];
			if (y == IGNORE_INDEX)
				continue;
			if (y < 0 || y >= classes) {
				*bad = (long)at;
				*bad_label = y;
				return HPU_BE_OK;
			}
			int best = 0;
			for (int j = 1; j < classes; j++)
				if (x[j] > x[best])
					best = j;
			right += best == y;
			n++;
		}
		acc[r] = n ? (float)((double)right / (double)n) : 0.0f;
	}
	return HPU_BE_OK;
}

/* The table's kernel, else the host's on the CPU's tables; -1 where
 * neither may run. */
#define RUN(entry, host, ...)                                                                \
	(hpu__be()->entry ? hpu__be()->entry(__VA_ARGS__)                                     \
	 : hpu__be_on_host() ? host(__VA_ARGS__)                                               \
			     : HPU_BE_UNSUPPORTED)

int hpu_cross_entropy_positions_forward(const float *logits, const int32_t *labels, float *lse,
					float *loss, int rows, size_t positions, int classes,
					long *bad, int32_t *bad_label)
{
	if (RUN(xent_pos_fwd, hpu__host_xent_pos_fwd, logits, labels, lse, loss, rows, positions,
		classes, bad, bad_label) != HPU_BE_OK)
		return HPU_ERROR;
	return *bad >= 0 ? HPU_ERANGE : HPU_OK;
}

int hpu_cross_entropy_positions_backward(const float *logits, const int32_t *labels,
					 const float *lse, const float *dloss, float *dx, int rows,
					 size_t positions, int classes)
{
	if (RUN(xent_pos_bwd, hpu__host_xent_pos_bwd, logits, labels, lse, dloss, dx, rows,
		positions, classes) != HPU_BE_OK)
		return HPU_ERROR;
	return HPU_OK;
}

int hpu_accuracy_positions_forward(const float *logits, const int32_t *labels, float *acc,
				   int rows, size_t positions, int classes, long *bad,
				   int32_t *bad_label)
{
	if (RUN(accuracy_pos, hpu__host_accuracy_pos, logits, labels, acc, rows, positions,
		classes, bad, bad_label) != HPU_BE_OK)
		return HPU_ERROR;
	return *bad >= 0 ? HPU_ERANGE : HPU_OK;
}
