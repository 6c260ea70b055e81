/* ops_loss: the kernels of the layers hpu_cross_entropy and hpu_accuracy
 * over positions (worker/layers/loss.c): per-sample means, -100 ignored,
 * sums in double. The op runs the table's kernel (backend.h), else on the
 * CPU's tables the C loops below (hpu__be_host's). */
#include <math.h>
#include <string.h>

#include "worker/ops/autocast.h"
#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"
#include "worker/ops/checks.h"

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
			/* a bad label counts as ignored (its check deferred,
			 * checks.h, the step runs on) */
			if (y != IGNORE_INDEX && (y < 0 || y >= classes) && *bad < 0) {
				*bad = (long)at;
				*bad_label = y;
			}
			if (y < 0 || y >= classes) {
				lse[at] = 0;
				continue;
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
			n += yr[p] >= 0 && yr[p] < classes;
		float g = n ? dloss[r] / (float)n : 0.0f;
		for (size_t p = 0; p < positions; p++) {
			size_t at = (size_t)r * positions + p;
			const float *x = logits + at * C;
			float *d = dx + at * C;
			if (yr[p] < 0 || yr[p] >= classes) { /* ignored, or bad (deferred) */
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
 * neither may run (backend_host.h). */
#define RUN HPU__BE_RUN

/* The op's answer after its check: where deferred (k, checks.h), as if
 * the input were good; else HPU_ERANGE where *bad names a bad value. */
static int deferred(const hpu__check_slot *k, long *bad)
{
	if (k) {
		*bad = -1;
		return HPU_OK;
	}
	return *bad >= 0 ? HPU_ERANGE : HPU_OK;
}

int hpu_cross_entropy_positions_forward(const float *logits, const int32_t *labels, float *lse,
					float *loss, int rows, size_t positions, int classes,
					long *bad, int32_t *bad_label)
{
	hpu__check_slot *k = hpu__checks_take(HPU__CHECK_XENT_POS, labels, classes, rows, positions);
	*bad = -1; /* (as where a recording refused the kernel) */
	/* lowered (softmax_xent in a lower list), as hpu_cross_entropy_forward
	 * is: the logits rounded, the loss an fp32 reduction; its backward
	 * rounds them again and its dlogits (the layer took no list) */
	int lp = hpu__ac_enter(HPU_OP_SOFTMAX_XENT);
	if (lp)
		logits = hpu__ac_round(0, logits, (size_t)rows * positions * (size_t)classes, lp);
	if (RUN(xent_pos_fwd, hpu__host_xent_pos_fwd, logits, labels, lse, loss, rows, positions,
		classes, k ? &k->bad : bad, k ? &k->bad_id : bad_label) != HPU_BE_OK)
		return HPU_ERROR;
	return deferred(k, bad);
}

int hpu_cross_entropy_positions_backward(const float *logits, const int32_t *labels,
					 const float *lse, const float *dloss, float *dx, int rows,
					 size_t positions, int classes)
{
	size_t n = (size_t)rows * positions * (size_t)classes;
	int lp = hpu__ac_enter(HPU_OP_SOFTMAX_XENT);
	if (lp) /* a copy: dx may be the logits' own memory */
		logits = hpu__ac_round(0, logits, n, lp);
	if (RUN(xent_pos_bwd, hpu__host_xent_pos_bwd, logits, labels, lse, dloss, dx, rows,
		positions, classes) != HPU_BE_OK)
		return HPU_ERROR;
	if (lp)
		hpu__ac_round_inplace(dx, n, lp);
	return HPU_OK;
}

int hpu_accuracy_positions_forward(const float *logits, const int32_t *labels, float *acc,
				   int rows, size_t positions, int classes, long *bad,
				   int32_t *bad_label)
{
	/* its labels' check defers as the cross-entropy's (a recordable
	 * evaluation); *bad stays -1 where a recording refused the kernel */
	hpu__check_slot *k = hpu__checks_take(HPU__CHECK_XENT_POS, labels, classes, rows, positions);
	*bad = -1;
	if (RUN(accuracy_pos, hpu__host_accuracy_pos, logits, labels, acc, rows, positions,
		classes, k ? &k->bad : bad, k ? &k->bad_id : bad_label) != HPU_BE_OK)
		return HPU_ERROR;
	return deferred(k, bad);
}

/* ---- mean squared error and binary cross-entropy (worker/layers) ---- */

#define LOG_FLOOR (-100.0) /* torch's clamp of BCELoss's logs */
#define BCE_EPS 1e-12      /* torch's floor under p (1 - p) in its backward */

int hpu__host_mse_fwd(const float *p, const float *t, float *loss, int rows, size_t n)
{
	for (int r = 0; r < rows; r++) {
		const float *pr = p + (size_t)r * n, *tr = t + (size_t)r * n;
		double s = 0;
		for (size_t i = 0; i < n; i++) {
			double d = (double)pr[i] - (double)tr[i];
			s += d * d;
		}
		loss[r] = (float)(s / (double)n);
	}
	return HPU_BE_OK;
}

int hpu__host_mse_bwd(const float *p, const float *t, const float *dloss, float *dp, float *dt,
		      int rows, size_t n)
{
	for (int r = 0; r < rows; r++) {
		size_t off = (size_t)r * n;
		float g = 2.0f * dloss[r] / (float)n;
		for (size_t i = 0; i < n; i++) {
			float d = g * (p[off + i] - t[off + i]);
			if (dp)
				dp[off + i] = d;
			if (dt)
				dt[off + i] = -d;
		}
	}
	return HPU_BE_OK;
}

static double clamped_log(double v)
{
	double lg = log(v);
	return lg < LOG_FLOOR ? LOG_FLOOR : lg;
}

/* A row's mean loss; *bad_at = i where probability i is outside [0, 1]. */
static double bce_row(int logits, const float *x, const float *t, size_t n, size_t *bad_at)
{
	double s = 0;
	for (size_t i = 0; i < n; i++) {
		if (logits) {
			double xi = x[i];
			s += (xi > 0 ? xi : 0) - xi * (double)t[i] + log1p(exp(-fabs(xi)));
			continue;
		}
		if (!(x[i] >= 0.0f && x[i] <= 1.0f)) {
			*bad_at = i;
			return 0;
		}
		s -= (double)t[i] * clamped_log(x[i]) +
		     (1.0 - (double)t[i]) * clamped_log(1.0 - (double)x[i]);
	}
	return s / (double)n;
}

int hpu__host_bce_fwd(int logits, const float *x, const float *t, float *loss, int rows,
		      size_t n, long *bad, float *bad_value)
{
	*bad = -1;
	for (int r = 0; r < rows; r++) {
		size_t off = (size_t)r * n, at = n;
		double v = bce_row(logits, x + off, t + off, n, &at);
		if (at < n && *bad < 0) { /* the row's loss 0; the rest run on (checks.h) */
			*bad = (long)(off + at);
			*bad_value = x[off + at];
		}
		loss[r] = (float)v;
	}
	return HPU_BE_OK;
}

/* dlogits = dloss (sigmoid(x) - t) / n; dtarget = -dloss x / n. */
static void bcel_bwd_row(const float *x, const float *t, float dloss, float *dx, float *dt,
			 size_t n)
{
	float g = dloss / (float)n, sg;
	for (size_t i = 0; i < n; i++) {
		hpu__host_sigmoid_fwd(&x[i], &sg, 1);
		if (dx)
			dx[i] = g * (sg - t[i]);
		if (dt)
			dt[i] = -g * x[i];
	}
}

/* dprob = dloss (p - t) / max(p (1 - p), 1e-12) / n (torch's);
 * dtarget = -dloss (log p - log(1 - p)) / n, the logs clamped. */
static void bce_bwd_row(const float *x, const float *t, float dloss, float *dx, float *dt,
			size_t n)
{
	double g = (double)dloss / (double)n;
	for (size_t i = 0; i < n; i++) {
		double pi = x[i], q = pi * (1.0 - pi);
		if (dx)
			dx[i] = (float)(g * (pi - (double)t[i]) / (q > BCE_EPS ? q : BCE_EPS));
		if (dt)
			dt[i] = (float)(-g * (clamped_log(pi) - clamped_log(1.0 - pi)));
	}
}

int hpu__host_bce_bwd(int logits, const float *x, const float *t, const float *dloss, float *dx,
		      float *dt, int rows, size_t n)
{
	for (int r = 0; r < rows; r++) {
		size_t off = (size_t)r * n;
		(logits ? bcel_bwd_row : bce_bwd_row)(x + off, t + off, dloss[r],
						      dx ? dx + off : NULL, dt ? dt + off : NULL, n);
	}
	return HPU_BE_OK;
}

int hpu__host_ids_first_bad(const int32_t *ids, size_t n, int32_t limit, long *bad,
			    int32_t *bad_value)
{
	*bad = -1;
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= limit) {
			*bad = (long)i;
			*bad_value = ids[i];
			break;
		}
	return HPU_BE_OK;
}

int hpu_mse_forward(const float *p, const float *t, float *loss, int rows, size_t n)
{
	return RUN(mse_fwd, hpu__host_mse_fwd, p, t, loss, rows, n) == HPU_BE_OK ? HPU_OK
										: HPU_ERROR;
}

int hpu_mse_backward(const float *p, const float *t, const float *dloss, float *dp, float *dt,
		     int rows, size_t n)
{
	return RUN(mse_bwd, hpu__host_mse_bwd, p, t, dloss, dp, dt, rows, n) == HPU_BE_OK
		       ? HPU_OK
		       : HPU_ERROR;
}

int hpu_bce_forward(int logits, const float *p, const float *t, float *loss, int rows,
		    size_t n, long *bad, float *bad_value)
{
	/* with logits every value is good, but the kernel still writes what
	 * it found: into a deferred check's slot too, not host memory that a
	 * recorded step cannot write (it refused the recording) */
	hpu__check_slot *k = hpu__checks_take(HPU__CHECK_BCE, p, 1, rows, n);
	*bad = -1;
	if (RUN(bce_fwd, hpu__host_bce_fwd, logits, p, t, loss, rows, n, k ? &k->bad : bad,
		k ? &k->bad_value : bad_value) != HPU_BE_OK)
		return HPU_ERROR;
	return deferred(k, bad);
}

int hpu_bce_backward(int logits, const float *p, const float *t, const float *dloss, float *dp,
		     float *dt, int rows, size_t n)
{
	return RUN(bce_bwd, hpu__host_bce_bwd, logits, p, t, dloss, dp, dt, rows, n) ==
			       HPU_BE_OK
		       ? HPU_OK
		       : HPU_ERROR;
}

int hpu_ids_first_bad(const int32_t *ids, size_t n, int32_t limit, long *bad,
		      int32_t *bad_value)
{
	hpu__check_slot *k = hpu__checks_take(HPU__CHECK_IDS, ids, limit, 0, n);
	*bad = -1;
	if (RUN(ids_first_bad, hpu__host_ids_first_bad, ids, n, limit, k ? &k->bad : bad,
		k ? &k->bad_id : bad_value) != HPU_BE_OK)
		return HPU_ERROR;
	return deferred(k, bad);
}
