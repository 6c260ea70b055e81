/* cuops_layers: the CUDA table's entries for the layers' own passes
 * (backend.h's xent_pos_fwd .. batchnorm_bwd), over the kernels of
 * cuops_layers.cu. The two that report a bad label to the host wait for
 * the stream; the rest only queue work. */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "worker/cuda/ops/cuops.h"
#include "worker/cuda/ops/cuops_layers.h"

/* Scratch for a pass over positions: the bad-label slot (all ones: none),
 * then `each` bytes a position. NULL when the sizes overflow. */
static unsigned long long *pos_scratch(hpu__cuops_ctx *c, int rows, size_t positions,
				       size_t each)
{
	size_t at = (size_t)rows * positions;
	if (rows < 0 || (positions && at / positions != (size_t)rows) ||
	    at > (SIZE_MAX - 64) / each)
		return NULL;
	return hpu__cuops_scratch(c, sizeof(unsigned long long) + at * each);
}

/* After the kernels: the bad position back on the host (waits), and its
 * label. */
static int read_bad(const unsigned long long *dbad, const int32_t *labels, long *bad,
		    int32_t *bad_label, cudaStream_t st, const char *what)
{
	unsigned long long b = ULLONG_MAX;
	if (hpu__cuops_cuda(cudaMemcpyAsync(&b, dbad, sizeof b, cudaMemcpyDeviceToHost, st),
			    what) ||
	    hpu__cuops_cuda(cudaStreamSynchronize(st), what))
		return HPU_BE_UNSUPPORTED;
	*bad = -1;
	if (b == ULLONG_MAX)
		return HPU_BE_OK;
	*bad = (long)b;
	if (hpu__cuops_cuda(cudaMemcpy(bad_label, labels + b, sizeof *bad_label,
				       cudaMemcpyDeviceToHost),
			    what))
		return HPU_BE_UNSUPPORTED;
	return HPU_BE_OK;
}

int hpu__cuops_xent_pos_fwd(const float *logits, const int32_t *labels, float *lse, float *loss,
			    int rows, size_t positions, int classes, long *bad,
			    int32_t *bad_label)
{
	*bad = -1;
	if (rows <= 0 || positions == 0)
		return HPU_BE_OK;
	if (classes <= 0)
		return HPU_BE_UNSUPPORTED;
	hpu__cuops_ctx *c = hpu__cuops_enter();
	if (!c)
		return HPU_BE_UNSUPPORTED;
	cudaStream_t st = hpu__cuops_stream();
	int rc = HPU_BE_UNSUPPORTED;
	unsigned long long *s = pos_scratch(c, rows, positions, sizeof(double));
	if (s && !hpu__cuops_cuda(cudaMemsetAsync(s, 0xff, sizeof *s, st), "cross-entropy") &&
	    !hpu__cuops_cuda(hpu__cuk_xent_pos_fwd(logits, labels, lse, loss, rows, positions,
						   classes, (double *)(s + 1), s, st),
			     "cross-entropy"))
		rc = read_bad(s, labels, bad, bad_label, st, "cross-entropy's label check");
	hpu__cuops_leave(c);
	return rc;
}

int hpu__cuops_xent_pos_bwd(const float *logits, const int32_t *labels, const float *lse,
			    const float *dloss, float *dx, int rows, size_t positions,
			    int classes)
{
	if (rows <= 0 || positions == 0)
		return HPU_BE_OK;
	if (classes <= 0)
		return HPU_BE_UNSUPPORTED;
	CU_KERNEL("cross-entropy backward",
		  hpu__cuk_xent_pos_bwd(logits, labels, lse, dloss, dx, rows, positions, classes,
					st));
}

int hpu__cuops_accuracy_pos(const float *logits, const int32_t *labels, float *acc, int rows,
			    size_t positions, int classes, long *bad, int32_t *bad_label)
{
	*bad = -1;
	if (rows <= 0 || positions == 0)
		return HPU_BE_OK;
	if (classes <= 0)
		return HPU_BE_UNSUPPORTED;
	hpu__cuops_ctx *c = hpu__cuops_enter();
	if (!c)
		return HPU_BE_UNSUPPORTED;
	cudaStream_t st = hpu__cuops_stream();
	int rc = HPU_BE_UNSUPPORTED;
	unsigned long long *s = pos_scratch(c, rows, positions, sizeof(int));
	if (s && !hpu__cuops_cuda(cudaMemsetAsync(s, 0xff, sizeof *s, st), "accuracy") &&
	    !hpu__cuops_cuda(hpu__cuk_accuracy_pos(logits, labels, acc, rows, positions, classes,
						   (int *)(s + 1), s, st),
			     "accuracy"))
		rc = read_bad(s, labels, bad, bad_label, st, "accuracy's label check");
	hpu__cuops_leave(c);
	return rc;
}

int hpu__cuops_heads(int merge, const float *src, float *dst, size_t ld, int batch, int heads,
		     int t, int hd, float mul)
{
	CU_KERNEL(merge ? "merging heads" : "splitting heads",
		  hpu__cuk_heads(merge, src, dst, ld, batch, heads, t, hd, mul, st));
}

int hpu__cuops_mask_scores(float *att, const int32_t *mask, int batch, int heads, int t,
			   int causal, int after)
{
	CU_KERNEL("masking attention scores",
		  hpu__cuk_mask_scores(att, mask, batch, heads, t, causal, after, st));
}

/* The keys are host memory: copied into scratch first (a pageable copy
 * returns once the source is read). */
int hpu__cuops_dropout_rows(const float *x, float *y, const uint64_t *keys, int rows, size_t n,
			    uint32_t cut, float scale)
{
	if (rows <= 0 || n == 0)
		return HPU_BE_OK;
	hpu__cuops_ctx *c = hpu__cuops_enter();
	if (!c)
		return HPU_BE_UNSUPPORTED;
	cudaStream_t st = hpu__cuops_stream();
	int rc = HPU_BE_UNSUPPORTED;
	size_t kb = (size_t)rows * sizeof *keys;
	uint64_t *dk = hpu__cuops_scratch(c, kb);
	if (dk &&
	    !hpu__cuops_cuda(cudaMemcpyAsync(dk, keys, kb, cudaMemcpyHostToDevice, st),
			     "dropout's keys") &&
	    !hpu__cuops_cuda(hpu__cuk_dropout_rows(x, y, dk, rows, n, cut, scale, st), "dropout"))
		rc = HPU_BE_OK;
	hpu__cuops_leave(c);
	return rc;
}

int hpu__cuops_batchnorm_fwd(const float *x, float *y, const float *w, const float *bias,
			     float *run_mean, float *run_var, float *saved, int batch, int ch,
			     size_t spatial, float eps, float momentum, int train, int update)
{
	CU_KERNEL("batch norm",
		  hpu__cuk_batchnorm_fwd(x, y, w, bias, run_mean, run_var, saved, batch, ch,
					 spatial, eps, momentum, train, update, st));
}

int hpu__cuops_batchnorm_bwd(const float *x, const float *dy, const float *w, const float *saved,
			     float *dw, float *dbias, float *dx, int batch, int ch, size_t spatial)
{
	CU_KERNEL("batch norm backward",
		  hpu__cuk_batchnorm_bwd(x, dy, w, saved, dw, dbias, dx, batch, ch, spatial, st));
}
