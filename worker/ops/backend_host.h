/* backend_host: the ops' own C loops, each with the signature of its
 * entry of hpu__backend (backend.h), so that they are the CPU's kernel of
 * that entry (hpu__be_host). Each lives in the file of its op. */
#ifndef HPU_BACKEND_HOST_H
#define HPU_BACKEND_HOST_H

#include "worker/ops/backend.h"

/* The table's kernel for `entry` (its refusal while the thread records
 * on a table not the host's: HPU_BE_OK, the recording refused,
 * hpu__be_answer), else on the CPU's tables `host` (its C loops);
 * HPU_BE_UNSUPPORTED where neither may run. */
#define HPU__BE_RUN(entry, host, ...)                                                        \
	(hpu__be()->entry ? hpu__be_answer(#entry, hpu__be()->entry(__VA_ARGS__))             \
	 : hpu__be_on_host() ? host(__VA_ARGS__)                                               \
			     : HPU_BE_UNSUPPORTED)

/* ops.c */
int hpu__host_bias_grad(hpu__dtype dt, const void *dy, float *db, int rows, int cols);
int hpu__host_ids_in_range(const int32_t *ids, int n, int limit, int *ok);
int hpu__host_softmax_xent(const float *logits, const int32_t *labels, float *dlogits,
			   int batch, int classes, float *loss);
int hpu__host_count_correct(const float *logits, const int32_t *labels, int batch,
			    int classes, int *correct);

/* ops_nn.c */
int hpu__host_embedding_fwd(const float *table, const int32_t *ids, float *y, int n, int vocab,
			    int dim);
int hpu__host_embedding_bwd(const int32_t *ids, const float *dy, float *dtable, int n,
			    int vocab, int dim);
int hpu__host_dropout_fwd(const float *x, float *y, uint8_t *mask, size_t n, float p,
			  uint64_t seed, uint64_t stream);
int hpu__host_add(const float *x, float *y, size_t n);
int hpu__host_dropout_bwd(const float *dy, const uint8_t *mask, float *dx, size_t n, float p);

/* autocast.c */
int hpu__host_round(int fp16, const float *x, float *y, size_t n);
int hpu__host_to_bf16(const float *x, uint16_t *y, size_t n);
int hpu__host_from16(int fp16, const uint16_t *x, float *y, size_t n);

/* fp8.c */
int hpu__host_amax(const float *x, size_t n, float *amax);
int hpu__host_fp8_fake_quant(const float *x, float *y, size_t n, float scale, int fmt);
int hpu__host_fp8_amax_scale(const float *x, size_t n, float *step, float *sc, int fmt,
			     int margin);
int hpu__host_fp8_quant_at(const float *x, float *y, size_t n, const float *scale, int fmt);
int hpu__host_fp8_roll(float *chunk, int count, int cap, int history, int algo, int margin);
int hpu__host_fp8_state_copy(void *dst, const void *src, size_t bytes);
int hpu__host_fp8_quant8(const float *x, uint8_t *q, int rows, int cols, int trans, float *sc,
			 int fmt);

/* ops_move.c */
int hpu__host_copy(void *dst, const void *src, size_t bytes);
int hpu__host_dropout_rows(const float *x, float *y, const uint64_t *keys, int keys_dev,
			   int rows, size_t n, uint32_t cut, float scale);
int hpu__host_dropout_keys(uint64_t *keys, const uint32_t *samples, const int64_t *step,
			   uint64_t seed, int layer, int rows);

/* ops_heads.c */
int hpu__host_heads(int merge, const float *src, float *dst, size_t ld, int batch, int heads,
		    int t, int hd, float mul);
int hpu__host_mask_scores(float *att, const int32_t *mask, int batch, int heads, int t,
			  int causal, int after);

/* ops_bnorm.c */
int hpu__host_batchnorm_fwd(const float *x, float *y, const float *w, const float *bias,
			    float *run_mean, float *run_var, float *saved, int batch, int ch,
			    size_t spatial, float eps, float momentum, int train, int update);
int hpu__host_batchnorm_bwd(const float *x, const float *dy, const float *w, const float *saved,
			    float *dw, float *dbias, float *dx, int batch, int ch, size_t spatial);

/* ops_loss.c */
int hpu__host_xent_pos_fwd(const float *logits, const int32_t *labels, float *lse, float *loss,
			   int rows, size_t positions, int classes, long *bad, int32_t *bad_label);
int hpu__host_xent_pos_bwd(const float *logits, const int32_t *labels, const float *lse,
			   const float *dloss, float *dx, int rows, size_t positions, int classes);
int hpu__host_accuracy_pos(const float *logits, const int32_t *labels, float *acc, int rows,
			   size_t positions, int classes, long *bad, int32_t *bad_label);

/* ops_shape.c */
int hpu__host_reduce_fwd(int op, const float *x, float *y, int32_t *idx, size_t outer, size_t n,
			 size_t inner);
int hpu__host_reduce_bwd(int op, const float *dy, const int32_t *idx, float *dx, size_t outer,
			 size_t n, size_t inner);
int hpu__host_copy_rows(const float *x, float *y, size_t outer, size_t nx, size_t x0,
			size_t ny, size_t y0, size_t len, size_t inner);
int hpu__host_zero(void *dst, size_t bytes);
int hpu__host_permute(const float *x, float *y, int ndim, const int64_t *shape, const int *perm);
int hpu__host_sigmoid_fwd(const float *x, float *y, size_t n);
int hpu__host_sigmoid_bwd(const float *y, const float *dy, float *dx, size_t n);
int hpu__host_pool1d_fwd(int max, const float *x, float *y, int32_t *idx, size_t outer, int n,
			 size_t inner, int k, int stride);
int hpu__host_pool1d_bwd(int max, const float *dy, const int32_t *idx, float *dx, size_t outer,
			 int n, size_t inner, int k, int stride);

/* ops_conv_rect.c */
int hpu__host_conv_rect_fwd(const hpu_conv2d_rect_shape *s, const float *x, const float *w,
			    const float *b, float *y, float *scratch);
int hpu__host_conv_rect_bwd(const hpu_conv2d_rect_shape *s, const float *x, const float *w,
			    const float *dy, float *dx, float *dw, float *db, float *scratch);

/* ops_loss.c (the losses) */
int hpu__host_mse_fwd(const float *p, const float *t, float *loss, int rows, size_t n);
int hpu__host_mse_bwd(const float *p, const float *t, const float *dloss, float *dp, float *dt,
		      int rows, size_t n);
int hpu__host_bce_fwd(int logits, const float *x, const float *t, float *loss, int rows,
		      size_t n, long *bad, float *bad_value);
int hpu__host_bce_bwd(int logits, const float *x, const float *t, const float *dloss, float *dx,
		      float *dt, int rows, size_t n);
int hpu__host_ids_first_bad(const int32_t *ids, size_t n, int32_t limit, long *bad,
			    int32_t *bad_value);

/* ops_nn.c (attention) */
int hpu__host_attention_fwd(const float *qkv, float *out, float *att, int batch, int t,
			    int heads, int hd);
int hpu__host_attention_bwd(const float *qkv, const float *att, const float *dout, float *dqkv,
			    int batch, int t, int heads, int hd);

/* ops_flash.c (fused attention: flash_rows.h's rows, one after another) */
int hpu__host_flash_fwd(const float *qkv, const int32_t *mask, float *ctx, float *lse, int batch,
			int t, int heads, int hd, int causal);
int hpu__host_flash_bwd(const float *qkv, const int32_t *mask, const float *ctx, const float *lse,
			const float *dctx, float *dqkv, int batch, int t, int heads, int hd,
			int causal);

#endif
