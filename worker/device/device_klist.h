/* device_klist: the kernel table's entries (worker/ops/backend.h), each
 * WRAP(name, (its parameters), (its arguments)). No include guard: the
 * includer defines WRAP, includes this, and undefines it again
 * (device_kernels.c: the kernels-only table and its recording; the tests
 * walk it). A parameter is one declaration without a comma (no function
 * pointers): the recording makes a struct of them. Every entry of
 * hpu__backend that is a kernel is here (device_kernels.c checks the
 * count against the struct). */
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
WRAP(embedding_fwd,
     (const float *table, const int32_t *ids, float *y, int n, int vocab, int dim),
     (table, ids, y, n, vocab, dim))
WRAP(embedding_bwd,
     (const int32_t *ids, const float *dy, float *dtable, int n, int vocab, int dim),
     (ids, dy, dtable, n, vocab, dim))
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
WRAP(fp8_amax_scale,
     (const float *x, size_t n, float *step, float *sc, int fmt, int margin),
     (x, n, step, sc, fmt, margin))
WRAP(fp8_quant_at, (const float *x, float *y, size_t n, const float *scale, int fmt),
     (x, y, n, scale, fmt))
WRAP(fp8_roll, (float *chunk, int count, int cap, int history, int algo, int margin),
     (chunk, count, cap, history, algo, margin))
WRAP(fp8_state_copy, (void *dst, const void *src, size_t bytes), (dst, src, bytes))
WRAP(fp8_quant8,
     (const float *x, uint8_t *q, int rows, int cols, int trans, float *sc, int fmt),
     (x, q, rows, cols, trans, sc, fmt))
WRAP(gemm_fp8,
     (int m, int n, int k, const uint8_t *a, int fa, const uint8_t *b, int fb, const float *ia,
      const float *ib, const float *bias, float *c, int accumulate),
     (m, n, k, a, fa, b, fb, ia, ib, bias, c, accumulate))
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
     (const float *x, float *y, const uint64_t *keys, int keys_dev, int rows, size_t n,
      uint32_t cut, float scale),
     (x, y, keys, keys_dev, rows, n, cut, scale))
WRAP(dropout_keys,
     (uint64_t *keys, const uint32_t *samples, const int64_t *step, uint64_t seed, int layer,
      int rows),
     (keys, samples, step, seed, layer, rows))

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
