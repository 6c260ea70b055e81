/* device_kernels: cpu-strict's kernels-only mode (HPU_STRICT_KERNELS=1).
 *
 * On a GPU only the kernel table (worker/ops/backend.h) and the runtime's
 * ops (hpu__dev_rtops) touch device memory. This mode proves the same of
 * the CPU: the strategy's bracket around a layer's forward or backward
 * (hpu__dev_layer_enter) leaves device memory closed, and the ops use a
 * table each of whose functions opens it around the CPU's kernel (the
 * backend's, else the host table's: the ops' C loops moved into
 * hpu__be_host). A C loop left in an op or a layer then faults at once
 * with cpu-strict's message. */
#include <stdlib.h>
#include <string.h>

#include "worker/device/device.h"
#include "worker/device/device_impl.h"
#include "worker/ops/autocast.h"
#include "common/env.h"

static hpu__backend impl; /* the CPU's kernel for each entry */
static hpu__backend tab;  /* each entry: enter, impl's, leave */

static hpu__backend fallback; /* where impl's answers HPU_BE_UNSUPPORTED */

/* (The mode is cpu-strict's: its enter and leave directly.) impl's
 * kernel, else (HPU_BE_UNSUPPORTED) the host table's reference
 * kernel, which the op would have run: both inside the device call. */
#define WRAP(name, params, args)                                                             \
	static int k_##name params                                                           \
	{                                                                                    \
		hpu__dev_cpu_strict.enter();                                                 \
		int r = impl.name args;                                                      \
		if (r == HPU_BE_UNSUPPORTED && fallback.name)                                \
			r = fallback.name args;                                              \
		hpu__dev_cpu_strict.leave();                                                 \
		return r;                                                                    \
	}

WRAP(gemm, (const hpu__gemm *g), (g))
WRAP(conv_fwd,
     (const hpu_conv2d_shape *s, hpu__dtype dt, const void *x, const void *w, const float *b,
      float *y),
     (s, dt, x, w, b, y))
WRAP(conv_bwd_data,
     (const hpu_conv2d_shape *s, hpu__dtype dt, const void *w, const void *dy, float *dx),
     (s, dt, w, dy, dx))
WRAP(conv_bwd_weights,
     (const hpu_conv2d_shape *s, hpu__dtype dt, const void *x, const void *dy, float *dw,
      float *db),
     (s, dt, x, dy, dw, db))
WRAP(maxpool_fwd,
     (const float *x, float *y, int32_t *idx, int batch, int ch, int h, int w, int k,
      int stride),
     (x, y, idx, batch, ch, h, w, k, stride))
WRAP(maxpool_bwd,
     (const float *dy, const int32_t *idx, float *dx, int batch, int ch, int h, int w, int k,
      int stride),
     (dy, idx, dx, batch, ch, h, w, k, stride))
WRAP(avgpool_fwd, (const float *x, float *y, int batch, int ch, int h, int w, int k, int stride),
     (x, y, batch, ch, h, w, k, stride))
WRAP(avgpool_bwd,
     (const float *dy, float *dx, int batch, int ch, int h, int w, int k, int stride),
     (dy, dx, batch, ch, h, w, k, stride))
WRAP(eltwise_fwd, (hpu__eltwise op, const float *x, float *y, size_t n), (op, x, y, n))
WRAP(eltwise_bwd, (hpu__eltwise op, const float *at, const float *dy, float *dx, size_t n),
     (op, at, dy, dx, n))
WRAP(softmax_fwd, (const float *x, float *y, int rows, int cols), (x, y, rows, cols))
WRAP(softmax_bwd, (const float *y, const float *dy, float *dx, int rows, int cols),
     (y, dy, dx, rows, cols))
WRAP(layernorm_fwd,
     (const float *x, const float *gamma, const float *beta, float *y, float *mean,
      float *rstd, int rows, int cols, float eps),
     (x, gamma, beta, y, mean, rstd, rows, cols, eps))
WRAP(layernorm_bwd,
     (const float *x, const float *gamma, const float *mean, const float *rstd,
      const float *dy, float *dx, float *dgamma, float *dbeta, int rows, int cols),
     (x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, cols))
WRAP(dropout_fwd,
     (const float *x, float *y, uint8_t *mask, size_t n, float p, uint64_t seed,
      uint64_t stream),
     (x, y, mask, n, p, seed, stream))
WRAP(dropout_bwd, (const float *dy, const uint8_t *mask, float *dx, size_t n, float p),
     (dy, mask, dx, n, p))
WRAP(embedding_fwd, (const float *table, const int32_t *ids, float *y, int n, int dim),
     (table, ids, y, n, dim))
WRAP(embedding_bwd, (const int32_t *ids, const float *dy, float *dtable, int n, int dim),
     (ids, dy, dtable, n, dim))
WRAP(softmax_xent,
     (const float *logits, const int32_t *labels, float *dlogits, int batch, int classes,
      float *loss),
     (logits, labels, dlogits, batch, classes, loss))
WRAP(bias_grad, (hpu__dtype dt, const void *dy, float *db, int rows, int cols),
     (dt, dy, db, rows, cols))
WRAP(round, (int fp16, const float *x, float *y, size_t n), (fp16, x, y, n))
WRAP(to_bf16, (const float *x, uint16_t *y, size_t n), (x, y, n))
WRAP(from16, (int fp16, const uint16_t *x, float *y, size_t n), (fp16, x, y, n))
WRAP(add, (const float *x, float *y, size_t n), (x, y, n))
WRAP(amax, (const float *x, size_t n, float *amax), (x, n, amax))
WRAP(fp8_fake_quant, (const float *x, float *y, size_t n, float scale, int fmt),
     (x, y, n, scale, fmt))
WRAP(ids_in_range, (const int32_t *ids, int n, int limit, int *ok), (ids, n, limit, ok))
WRAP(count_correct,
     (const float *logits, const int32_t *labels, int batch, int classes, int *correct),
     (logits, labels, batch, classes, correct))

WRAP(xent_pos_fwd,
     (const float *logits, const int32_t *labels, float *lse, float *loss, int rows,
      size_t positions, int classes, long *bad, int32_t *bad_label),
     (logits, labels, lse, loss, rows, positions, classes, bad, bad_label))
WRAP(xent_pos_bwd,
     (const float *logits, const int32_t *labels, const float *lse, const float *dloss,
      float *dx, int rows, size_t positions, int classes),
     (logits, labels, lse, dloss, dx, rows, positions, classes))
WRAP(accuracy_pos,
     (const float *logits, const int32_t *labels, float *acc, int rows, size_t positions,
      int classes, long *bad, int32_t *bad_label),
     (logits, labels, acc, rows, positions, classes, bad, bad_label))

WRAP(copy, (void *dst, const void *src, size_t bytes), (dst, src, bytes))

WRAP(heads,
     (int merge, const float *src, float *dst, size_t ld, int batch, int heads, int t, int hd,
      float mul),
     (merge, src, dst, ld, batch, heads, t, hd, mul))
WRAP(mask_scores,
     (float *att, const int32_t *mask, int batch, int heads, int t, int causal, int after),
     (att, mask, batch, heads, t, causal, after))

WRAP(dropout_rows,
     (const float *x, float *y, const uint64_t *keys, int rows, size_t n, uint32_t cut,
      float scale),
     (x, y, keys, rows, n, cut, scale))

WRAP(batchnorm_fwd,
     (const float *x, float *y, const float *w, const float *bias, float *run_mean,
      float *run_var, float *saved, int batch, int ch, size_t spatial, float eps,
      float momentum, int train, int update),
     (x, y, w, bias, run_mean, run_var, saved, batch, ch, spatial, eps, momentum, train,
      update))
WRAP(batchnorm_bwd,
     (const float *x, const float *dy, const float *w, const float *saved, float *dw,
      float *dbias, float *dx, int batch, int ch, size_t spatial),
     (x, dy, w, saved, dw, dbias, dx, batch, ch, spatial))

WRAP(reduce_fwd,
     (int op, const float *x, float *y, int32_t *idx, size_t outer, size_t n, size_t inner),
     (op, x, y, idx, outer, n, inner))
WRAP(reduce_bwd,
     (int op, const float *dy, const int32_t *idx, float *dx, size_t outer, size_t n,
      size_t inner),
     (op, dy, idx, dx, outer, n, inner))
WRAP(copy_rows,
     (const float *x, float *y, size_t outer, size_t nx, size_t x0, size_t ny, size_t y0,
      size_t len, size_t inner),
     (x, y, outer, nx, x0, ny, y0, len, inner))
WRAP(zero, (void *dst, size_t bytes), (dst, bytes))
WRAP(permute, (const float *x, float *y, int ndim, const int64_t *shape, const int *perm),
     (x, y, ndim, shape, perm))
WRAP(sigmoid_fwd, (const float *x, float *y, size_t n), (x, y, n))
WRAP(sigmoid_bwd, (const float *y, const float *dy, float *dx, size_t n), (y, dy, dx, n))
WRAP(pool1d_fwd,
     (int max, const float *x, float *y, int32_t *idx, size_t outer, int n, size_t inner, int k,
      int stride),
     (max, x, y, idx, outer, n, inner, k, stride))
WRAP(pool1d_bwd,
     (int max, const float *dy, const int32_t *idx, float *dx, size_t outer, int n,
      size_t inner, int k, int stride),
     (max, dy, idx, dx, outer, n, inner, k, stride))
WRAP(conv_rect_fwd,
     (const hpu_conv2d_rect_shape *s, const float *x, const float *w, const float *b, float *y,
      float *scratch),
     (s, x, w, b, y, scratch))
WRAP(conv_rect_bwd,
     (const hpu_conv2d_rect_shape *s, const float *x, const float *w, const float *dy,
      float *dx, float *dw, float *db, float *scratch),
     (s, x, w, dy, dx, dw, db, scratch))
WRAP(mse_fwd, (const float *p, const float *t, float *loss, int rows, size_t n),
     (p, t, loss, rows, n))
WRAP(mse_bwd,
     (const float *p, const float *t, const float *dloss, float *dp, float *dt, int rows,
      size_t n),
     (p, t, dloss, dp, dt, rows, n))
WRAP(bce_fwd,
     (int logits, const float *x, const float *t, float *loss, int rows, size_t n, long *bad,
      float *bad_value),
     (logits, x, t, loss, rows, n, bad, bad_value))
WRAP(bce_bwd,
     (int logits, const float *x, const float *t, const float *dloss, float *dx, float *dt,
      int rows, size_t n),
     (logits, x, t, dloss, dx, dt, rows, n))
WRAP(ids_first_bad, (const int32_t *ids, size_t n, int32_t limit, long *bad, int32_t *bad_value),
     (ids, n, limit, bad, bad_value))
WRAP(attention_fwd,
     (const float *qkv, float *out, float *att, int batch, int t, int heads, int hd),
     (qkv, out, att, batch, t, heads, hd))
WRAP(attention_bwd,
     (const float *qkv, const float *att, const float *dout, float *dqkv, int batch, int t,
      int heads, int hd),
     (qkv, att, dout, dqkv, batch, t, heads, hd))
WRAP(flash_fwd,
     (const float *qkv, const int32_t *mask, float *ctx, float *lse, int batch, int t, int heads,
      int hd, int causal),
     (qkv, mask, ctx, lse, batch, t, heads, hd, causal))
WRAP(flash_bwd,
     (const float *qkv, const int32_t *mask, const float *ctx, const float *lse,
      const float *dctx, float *dqkv, int batch, int t, int heads, int hd, int causal),
     (qkv, mask, ctx, lse, dctx, dqkv, batch, t, heads, hd, causal))

/* Each entry: the backend's where it has one, else the host table's;
 * wrapped where either has it, NULL where neither. */
#define PICK(name)                                                                           \
	do {                                                                                 \
		impl.name = be->name ? be->name : host->name;                                \
		fallback.name = impl.name != host->name ? host->name : NULL;                 \
		tab.name = impl.name ? k_##name : NULL;                                      \
	} while (0)

static const hpu__backend *build(void)
{
	const hpu__backend *be = hpu__be(), *host = hpu__be_host();
	tab.name = "cpu-strict kernels";
	tab.describe = be->describe;
	tab.bf16_native = be->bf16_native;
	tab.set_threads = be->set_threads;
	PICK(gemm);
	PICK(conv_fwd);
	PICK(conv_bwd_data);
	PICK(conv_bwd_weights);
	PICK(maxpool_fwd);
	PICK(maxpool_bwd);
	PICK(avgpool_fwd);
	PICK(avgpool_bwd);
	PICK(eltwise_fwd);
	PICK(eltwise_bwd);
	PICK(softmax_fwd);
	PICK(softmax_bwd);
	PICK(layernorm_fwd);
	PICK(layernorm_bwd);
	PICK(dropout_fwd);
	PICK(dropout_bwd);
	PICK(embedding_fwd);
	PICK(embedding_bwd);
	PICK(softmax_xent);
	PICK(bias_grad);
	PICK(round);
	PICK(to_bf16);
	PICK(from16);
	PICK(add);
	PICK(amax);
	PICK(fp8_fake_quant);
	PICK(ids_in_range);
	PICK(count_correct);
	PICK(xent_pos_fwd);
	PICK(xent_pos_bwd);
	PICK(accuracy_pos);
	PICK(copy);
	PICK(heads);
	PICK(mask_scores);
	PICK(dropout_rows);
	PICK(batchnorm_fwd);
	PICK(batchnorm_bwd);
	PICK(reduce_fwd);
	PICK(reduce_bwd);
	PICK(copy_rows);
	PICK(zero);
	PICK(permute);
	PICK(sigmoid_fwd);
	PICK(sigmoid_bwd);
	PICK(pool1d_fwd);
	PICK(pool1d_bwd);
	PICK(conv_rect_fwd);
	PICK(conv_rect_bwd);
	PICK(mse_fwd);
	PICK(mse_bwd);
	PICK(bce_fwd);
	PICK(bce_bwd);
	PICK(ids_first_bad);
	PICK(attention_fwd);
	PICK(attention_bwd);
	PICK(flash_fwd);
	PICK(flash_bwd);
	return &tab;
}

static int kernels_only = -1;

int hpu__dev_strict_kernels(void)
{
	if (kernels_only < 0) {
		const char *e = hpu__env_str(HPU_ENV_HPU_STRICT_KERNELS);
		kernels_only = e && !strcmp(e, "1");
	}
	return kernels_only;
}

const hpu__backend *hpu__dev_kernels_table(void)
{
	static const hpu__backend *t;
	if (!t)
		t = build();
	return t;
}

static void *scratch_alloc(size_t bytes)
{
	return hpu__dalloc_uninit(HPU_MEM_OTHER, bytes, "the ops' scratch (autocast, fp8)");
}

void hpu__dev_kernels_scratch(void)
{
	hpu__ac_set_scratch_allocator(scratch_alloc, hpu__dfree);
}
