/* cuops_layers: the CUDA table's entries for the layers' own passes
 * (backend.h's xent_pos_fwd .. batchnorm_bwd), over the kernels of
 * cuops_layers.cu. The two that report a bad label to the host wait for
 * the stream (cuops.h's slot), or, given device memory for it (an
 * hpu__check_slot's, findings_dev), write it on the device; the rest
 * only queue work. */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "worker/cuda/cuda_ops.h"
#include "worker/cuda/ops/cuops.h"
#include "worker/cuda/ops/cuops_layers.h"
#include "worker/cuda/ops/cuops_more.h"

/* The scratch a pass over positions needs after its slot (the bad
 * position): `each` bytes a position. Nonzero when the sizes overflow. */
static int pos_extra(int rows, size_t positions, size_t each, size_t *extra)
{
	size_t at = (size_t)rows * positions;
	if (rows < 0 || (positions && at / positions != (size_t)rows) ||
	    at > (SIZE_MAX - 64) / each)
		return -1;
	*extra = at * each;
	return 0;
}

/* The bad position read back from the slot (all ones: none), and its
 * label. */
static int bad_label_of(unsigned long long b, const int32_t *labels, long *bad,
			int32_t *bad_label, const char *what)
{
	*bad = b == ULLONG_MAX ? -1 : (long)b;
	if (*bad < 0)
		return HPU_BE_OK;
	return hpu__cuops_fetch(bad_label, labels + b, sizeof *bad_label, what);
}

/* A pass over positions that reports the first label outside
 * [0, classes) and not -100: its arguments (the outputs of cross-entropy,
 * lse and loss, or of accuracy, acc) and its kernels' launcher, given
 * `each` bytes of scratch a position and the bad-position slot. */
typedef struct pos_pass {
	const float *logits;
	const int32_t *labels;
	float *lse, *loss, *acc;
	int rows, classes;
	size_t positions, each;
	cudaError_t (*launch)(const struct pos_pass *p, void *scratch, unsigned long long *bad,
			      cudaStream_t st);
	const char *what;
} pos_pass;

/* pos_run where bad and bad_label are device memory (findings_dev,
 * worker/ops/backend.h: an hpu__check_slot's fields): *bad set to all
 * ones (-1) on the stream and lowered by the kernels as an unsigned long
 * long, then labels[*bad] into *bad_label on the device. No copy back,
 * no wait: a recorded step holds it. */
_Static_assert(sizeof(long) == sizeof(unsigned long long), "a slot's bad is 64 bits");
static int pos_run_dev(const pos_pass *p, long *bad, int32_t *bad_label)
{
	size_t extra = 0;
	int empty = p->rows <= 0 || p->positions == 0;
	if (!empty && (p->classes <= 0 || pos_extra(p->rows, p->positions, p->each, &extra)))
		return HPU_BE_UNSUPPORTED;
	hpu__cuops_ctx *c = hpu__cuops_enter();
	if (!c)
		return HPU_BE_UNSUPPORTED;
	cudaStream_t st = hpu__cuops_stream();
	unsigned long long *b = (unsigned long long *)(void *)bad;
	void *scratch = empty ? NULL : hpu__cuops_scratch(c, extra);
	int rc = HPU_BE_UNSUPPORTED;
	if ((empty || scratch) && !hpu__cuops_cuda(cudaMemsetAsync(b, 0xff, sizeof *b, st), p->what) &&
	    (empty || (!hpu__cuops_cuda(p->launch(p, scratch, b, st), p->what) &&
		       !hpu__cuops_cuda(hpu__cukm_finding_i32(p->labels, (const long long *)(void *)b,
							      bad_label, st),
					p->what))))
		rc = HPU_BE_OK;
	hpu__cuops_leave(c);
	return rc;
}

/* The frame of both: the checks, the slot and scratch, the launch, the
 * bad position and its label back on the host (waits), or, given device
 * memory, on the device (pos_run_dev). */
static int pos_run(const pos_pass *p, long *bad, int32_t *bad_label)
{
	hpu__cuops_slot s;
	unsigned long long b = ULLONG_MAX;
	size_t extra;
	if (hpu__cuda_on_device(bad))
		return pos_run_dev(p, bad, bad_label);
	*bad = -1;
	if (p->rows <= 0 || p->positions == 0)
		return HPU_BE_OK;
	if (p->classes <= 0 || pos_extra(p->rows, p->positions, p->each, &extra) ||
	    hpu__cuops_slot_begin(&s, sizeof b, 0xff, extra, p->what) ||
	    hpu__cuops_slot_end(&s, p->launch(p, s.more, s.d, s.st), &b, p->what))
		return HPU_BE_UNSUPPORTED;
	return bad_label_of(b, p->labels, bad, bad_label, p->what);
}

static cudaError_t xent_launch(const pos_pass *p, void *term, unsigned long long *bad,
			       cudaStream_t st)
{
	return hpu__cuk_xent_pos_fwd(p->logits, p->labels, p->lse, p->loss, p->rows, p->positions,
				     p->classes, term, bad, st);
}

int hpu__cuops_xent_pos_fwd(const float *logits, const int32_t *labels, float *lse, float *loss,
			    int rows, size_t positions, int classes, long *bad,
			    int32_t *bad_label)
{
	pos_pass p = {.logits = logits,
		      .labels = labels,
		      .lse = lse,
		      .loss = loss,
		      .rows = rows,
		      .classes = classes,
		      .positions = positions,
		      .each = sizeof(double),
		      .launch = xent_launch,
		      .what = "cross-entropy"};
	return pos_run(&p, bad, bad_label);
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

static cudaError_t accuracy_launch(const pos_pass *p, void *hit, unsigned long long *bad,
				   cudaStream_t st)
{
	return hpu__cuk_accuracy_pos(p->logits, p->labels, p->acc, p->rows, p->positions,
				     p->classes, hit, bad, st);
}

int hpu__cuops_accuracy_pos(const float *logits, const int32_t *labels, float *acc, int rows,
			    size_t positions, int classes, long *bad, int32_t *bad_label)
{
	pos_pass p = {.logits = logits,
		      .labels = labels,
		      .acc = acc,
		      .rows = rows,
		      .classes = classes,
		      .positions = positions,
		      .each = sizeof(int),
		      .launch = accuracy_launch,
		      .what = "accuracy"};
	return pos_run(&p, bad, bad_label);
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

/* Keys in host memory (keys_dev 0) are copied into scratch first (a
 * pageable copy returns once the source is read), and refused while
 * recording; keys in device memory (dropout_keys made them) are read
 * where they are, recorded as any kernel. */
int hpu__cuops_dropout_rows(const float *x, float *y, const uint64_t *keys, int keys_dev,
			    int rows, size_t n, uint32_t cut, float scale)
{
	if (rows <= 0 || n == 0)
		return HPU_BE_OK;
	if (keys_dev)
		CU_KERNEL("dropout", hpu__cuk_dropout_rows(x, y, keys, rows, n, cut, scale, st));
	if (hpu__cuda_ops_refuse("dropout", HPU_CUOPS_DROPOUT_WHY))
		return HPU_BE_UNSUPPORTED;
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

int hpu__cuops_dropout_keys(uint64_t *keys, const uint32_t *samples, const int64_t *step,
			    uint64_t seed, int layer, int rows)
{
	if (rows <= 0)
		return HPU_BE_OK;
	CU_KERNEL("dropout's keys",
		  hpu__cuk_dropout_keys(keys, samples, step, seed, layer, rows, st));
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
