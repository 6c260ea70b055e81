/* ops_flash: fused (flash-style) attention as ops on the kernel table
 * (backend.h flash_fwd, flash_bwd; ops.h hpu_attention_fused_*): the
 * table's kernel, else on the CPU's tables the host's loops here, which
 * run flash_rows.h's rows one after another (the rows a GPU's threads
 * run side by side), and the query the attention layer asks when it is
 * declared (HPU_FUSED_ATTENTION). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "worker/ops/autocast.h"
#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"
#include "worker/ops/flash_rows.h"
#include "common/env.h"

#include "hpu/hpu.h"
#include "hpu/ops.h"

static hpu__flash_dims dims_of(int batch, int t, int heads, int hd, int causal)
{
	return (hpu__flash_dims){.batch = batch, .t = t, .heads = heads, .hd = hd,
				 .causal = causal != 0, .scale = 1.0f / sqrtf((float)hd)};
}

static int empty(int batch, int t, int heads, int hd)
{
	return batch <= 0 || t <= 0 || heads <= 0 || hd <= 0;
}

/* Each query row; the running output in the ctx row itself, the query
 * row kept in a buffer as the CUDA kernels keep it (HPU_BE_NOMEM without
 * memory for it). */
int hpu__host_flash_fwd(const float *qkv, const int32_t *mask, float *ctx, float *lse, int batch,
			int t, int heads, int hd, int causal)
{
	if (empty(batch, t, heads, hd))
		return HPU_BE_OK;
	hpu__flash_dims a = dims_of(batch, t, heads, hd, causal);
	float *qbuf = malloc((size_t)hd * sizeof *qbuf);
	if (!qbuf)
		return HPU_BE_NOMEM;
	for (int b = 0; b < batch; b++)
		for (int h = 0; h < heads; h++)
			for (int i = 0; i < t; i++)
				hpu__flash_fwd_row(&a, qkv, mask, ctx, lse,
						   ctx + hpu__flash_ctx_at(&a, b, h, i), qbuf, b, h,
						   i);
	free(qbuf);
	return HPU_BE_OK;
}

/* D of every query row (batch * heads * t floats of the heap: the table
 * has no scratch; HPU_BE_NOMEM without them), then each query's dq
 * and each key's dk, dv (with their own rows kept in buffers). */
int hpu__host_flash_bwd(const float *qkv, const int32_t *mask, const float *ctx, const float *lse,
			const float *dctx, float *dqkv, int batch, int t, int heads, int hd,
			int causal)
{
	if (empty(batch, t, heads, hd))
		return HPU_BE_OK;
	hpu__flash_dims a = dims_of(batch, t, heads, hd, causal);
	float *delta = malloc((size_t)batch * heads * t * sizeof *delta);
	float *buf = malloc(2 * (size_t)hd * sizeof *buf);
	if (!delta || !buf) {
		free(delta);
		free(buf);
		return HPU_BE_NOMEM;
	}
	for (int b = 0; b < batch; b++)
		for (int h = 0; h < heads; h++)
			for (int i = 0; i < t; i++)
				delta[hpu__flash_row_at(&a, b, h, i)] =
					hpu__flash_delta_row(&a, ctx, dctx, b, h, i);
	for (int b = 0; b < batch; b++)
		for (int h = 0; h < heads; h++)
			for (int i = 0; i < t; i++) {
				float *dq = dqkv + hpu__flash_qkv_at(&a, b, h, i, 0);
				hpu__flash_dq_row(&a, qkv, mask, lse, dctx,
						  delta[hpu__flash_row_at(&a, b, h, i)], dqkv, dq,
						  buf, buf + hd, b, h, i);
				hpu__flash_dkv_row(&a, qkv, mask, lse, dctx, delta, dqkv,
						   dqkv + hpu__flash_qkv_at(&a, b, h, i, 1),
						   dqkv + hpu__flash_qkv_at(&a, b, h, i, 2), buf,
						   buf + hd, b, h, i);
			}
	free(delta);
	free(buf);
	return HPU_BE_OK;
}

/* A kernel's answer as the ops': the host's loops (the CPU tables', or
 * wrapped by cpu-strict's kernels-only table) without memory for their
 * buffers are HPU_ENOMEM; a device's table without the kernel, or its
 * kernel's refusal, HPU_ERROR. */
static int answer(int rc)
{
	return rc == HPU_BE_OK ? HPU_OK : rc == HPU_BE_NOMEM ? HPU_ENOMEM : HPU_ERROR;
}

static int fwd(const float *qkv, const int32_t *mask, float *ctx, float *lse, int batch, int t,
	       int heads, int hd, int causal)
{
	return answer(HPU__BE_RUN(flash_fwd, hpu__host_flash_fwd, qkv, mask, ctx, lse, batch, t,
				  heads, hd, causal));
}

static int bwd(const float *qkv, const int32_t *mask, const float *ctx, const float *lse,
	       const float *dctx, float *dqkv, int batch, int t, int heads, int hd, int causal)
{
	return answer(HPU__BE_RUN(flash_bwd, hpu__host_flash_bwd, qkv, mask, ctx, lse, dctx, dqkv,
				  batch, t, heads, hd, causal));
}

/* Under bf16 autocast, the table's tensor-core kernel where it has one
 * that takes this call (flash16_*: the GPU's tiles), else the fp32
 * kernel. */
static int tiles16(int lp)
{
	return lp == HPU_AUTOCAST_BF16 && hpu__be()->flash16_fwd && hpu__be()->flash16_bwd;
}

/* Lowered as hpu_attention_forward: qkv (and dctx) rounded; the scores,
 * probabilities, lse and sums inside stay fp32 (on a GPU's bf16 tiles P
 * and dS are rounded for their products, as FlashAttention's); ctx and
 * dqkv rounded. */
int hpu_attention_fused_forward(const float *qkv, const int32_t *mask, float *ctx, float *lse,
				int batch, int t, int heads, int head_dim, int causal)
{
	int lp = hpu__ac_enter(HPU_OP_ATTENTION);
	if (!lp || empty(batch, t, heads, head_dim))
		return fwd(qkv, mask, ctx, lse, batch, t, heads, head_dim, causal);
	size_t bt = (size_t)batch * t, d = (size_t)heads * head_dim;
	const float *q16 = hpu__ac_round(0, qkv, bt * 3 * d, lp);
	int rc = tiles16(lp) && hpu__be()->flash16_fwd(q16, mask, ctx, lse, batch, t, heads,
							head_dim, causal) == HPU_BE_OK
			 ? HPU_OK
			 : fwd(q16, mask, ctx, lse, batch, t, heads, head_dim, causal);
	if (rc == HPU_OK)
		hpu__ac_round_inplace(ctx, bt * d, lp);
	return rc;
}

int hpu_attention_fused_backward(const float *qkv, const int32_t *mask, const float *ctx,
				 const float *lse, const float *dctx, float *dqkv, int batch,
				 int t, int heads, int head_dim, int causal)
{
	int lp = hpu__ac_enter(HPU_OP_ATTENTION);
	if (!lp || empty(batch, t, heads, head_dim))
		return bwd(qkv, mask, ctx, lse, dctx, dqkv, batch, t, heads, head_dim, causal);
	size_t bt = (size_t)batch * t, d = (size_t)heads * head_dim;
	const float *q16 = hpu__ac_round(0, qkv, bt * 3 * d, lp);
	const float *dc16 = hpu__ac_round(1, dctx, bt * d, lp);
	int rc = tiles16(lp) && hpu__be()->flash16_bwd(q16, mask, ctx, lse, dc16, dqkv, batch, t,
							heads, head_dim, causal) == HPU_BE_OK
			 ? HPU_OK
			 : bwd(q16, mask, ctx, lse, dc16, dqkv, batch, t, heads, head_dim, causal);
	if (rc == HPU_OK)
		hpu__ac_round_inplace(dqkv, bt * 3 * d, lp);
	return rc;
}

int hpu_attention_fused(void)
{
	long on = 0; /* hpu-worker refuses a value other than 0 or 1 */
	if (hpu__env_long(HPU_ENV_HPU_FUSED_ATTENTION, 0, 1, &on) != 1 || !on)
		return 0;
	const hpu__backend *be = hpu__be();
	return (be->flash_fwd && be->flash_bwd) || hpu__be_on_host();
}
