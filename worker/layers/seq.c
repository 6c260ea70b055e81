/* Sequence layers: embedding and multi-head self-attention.
 *
 * Attention is composed from the ops (linear, bmm, softmax), so autocast
 * lowers its projections and products as it lowers any linear and bmm:
 *   qkv = x Wqkv^T + bqkv                               [T, 3D]
 *   q, k, v per head, head-major (q scaled by 1/sqrt(hd)) [heads, T, hd]
 *   att = softmax(q k^T, masked)                        [heads, T, T]
 *   ctx = att v, the heads side by side                 [T, D]
 *   out = ctx Wo^T + bo                                 [T, D]
 * The masked scores get -inf before the softmax and exact zeros after
 * it, so a padding key gets no weight and no gradient, and a query row
 * with no key to attend to gets zeros (its output is then bo).
 *
 * Fused (hpu_attention_fused(), HPU_FUSED_ATTENTION=1, asked when the
 * layer is declared): the same math from qkv to ctx in one op
 * (hpu_attention_fused_forward/backward, flash-style), which keeps each
 * query's log-sum-exp lse [heads, T] instead of att [heads, T, T] and
 * recomputes the probabilities in backward.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <hpu/ops.h>

#include "worker/layers/decl.h"

/* hpu_max_batch(), 0 when the runtime has not said. */
static size_t max_batch(const hpu_builder *b)
{
	return hpu_max_batch(b) > 0 ? (size_t)hpu_max_batch(b) : 0;
}

/* ---- embedding ---- */

typedef struct embedding {
	int vocab, dim;
	size_t ids; /* ids per sample */
} embedding;

static int embedding_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			     hpu_tensor *out)
{
	const embedding *s = hpu_layer_user(l);
	const int32_t *ids = hpu_i32(&in[0]);
	size_t n = (size_t)c->batch * s->ids;
	if (n > INT_MAX)
		return hpu_layer_error(l, "a micro-batch of %d samples of %zu ids is too large for "
				       "the embedding op", c->batch, s->ids);
	if (hpu_embedding_forward(hpu_param(l, 0), ids, hpu_f32(&out[0]), (int)n, s->vocab,
				  s->dim) == HPU_OK)
		return HPU_OK;
	size_t i = 0;
	while (i < n && ids[i] >= 0 && ids[i] < s->vocab)
		i++;
	int row = (int)(i / s->ids);
	char sample[40] = "";
	if (c->samples)
		snprintf(sample, sizeof sample, " (dataset sample %u)", (unsigned)c->samples[row]);
	hpu_layer_error(l, "id %d at position %zu of row %d%s of input %s is outside the "
			"vocabulary [0, %d)", i < n ? ids[i] : -1, i % s->ids, row, sample,
			ld_str(in[0].name), s->vocab);
	return HPU_ERANGE;
}

/* The ids are i32: no input gradient, only the table's. */
static int embedding_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			      const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)out;
	(void)din;
	const embedding *s = hpu_layer_user(l);
	hpu_embedding_backward(hpu_i32(&in[0]), hpu_f32(&dout[0]), hpu_grad(l, 0),
			       (int)((size_t)c->batch * s->ids), s->dim);
	return HPU_OK;
}

static const hpu_layer_ops embedding_ops = {
	.forward = embedding_forward,
	.backward = embedding_backward,
	.destroy = free,
};

static hpu_layer *embedding_impl(hpu_builder *b, const char *name, const char *in, const char *out,
			 int64_t vocab, int64_t dim)
{
	hpu_tensor t;
	if (ld_input(b, name, in, HPU_I32, &t) < 0)
		return NULL;
	if (t.ndim >= HPU_MAX_DIMS) {
		hpu_error(b, "layer %s: input %s has %d dimensions per sample; the output adds "
			  "one and may have at most %d", ld_str(name), in, t.ndim, HPU_MAX_DIMS);
		return NULL;
	}
	if (vocab < 1 || vocab > INT_MAX || dim < 1 || dim > INT_MAX) {
		hpu_error(b, "layer %s: vocab %lld and dim %lld must be in [1, %d]", ld_str(name),
			  (long long)vocab, (long long)dim, INT_MAX);
		return NULL;
	}
	if (max_batch(b) * t.sample_numel > INT_MAX) {
		hpu_error(b, "layer %s: %zu ids per sample times the largest micro-batch (%d) "
			  "exceed the embedding op's int sizes", ld_str(name), t.sample_numel,
			  hpu_max_batch(b));
		return NULL;
	}
	int64_t shape[HPU_MAX_DIMS], wshape[2] = {vocab, dim};
	memcpy(shape, t.shape, (size_t)t.ndim * sizeof *shape);
	shape[t.ndim] = dim;
	embedding *s = malloc(sizeof *s);
	if (s)
		*s = (embedding){.vocab = (int)vocab, .dim = (int)dim, .ids = t.sample_numel};
	/* backward: the ids */
	hpu_layer *l = ld_reads(
		ld_declare(b, name, in, &embedding_ops, s, out, HPU_F32, t.ndim + 1, shape), 1, 0);
	if (!l || hpu_param_add(l, "weight", 2, wshape, HPU_INIT(NORMAL, 0, 1)) < 0)
		return NULL;
	return l;
}

/* ---- multi-head self-attention ---- */

typedef struct attention {
	int t, d, heads, hd;
	int causal, masked; /* masked: a key mask is the second input */
	int fused;          /* hpu_attention_fused() when declared */
	float scale;        /* 1 / sqrt(hd) */
} attention;

/* The ops' head-major copies and score masking (ops.h); 0, or -1 where
 * the device's kernel table has none (the layer then fails naming it). */
static int split_heads(const attention *s, const float *src, size_t ld, float *dst, int batch,
		       float mul)
{
	return hpu_split_heads(src, ld, dst, batch, s->heads, s->t, s->hd, mul) ? -1 : 0;
}

static int merge_heads(const attention *s, const float *src, float *dst, size_t ld, int batch,
		       float mul)
{
	return hpu_merge_heads(src, dst, ld, batch, s->heads, s->t, s->hd, mul) ? -1 : 0;
}

static int mask_scores(const attention *s, float *att, const int32_t *mask, int batch,
		       int after)
{
	return hpu_mask_scores(att, mask, batch, s->heads, s->t, s->causal, after) ? -1 : 0;
}

#define NO_KERNEL(l)                                                                         \
	hpu_layer_error(l, "layer %s: this device's kernel table has no kernel for its "     \
			   "head copies or score masking", hpu_layer_name(l))

/* What a fused op's failure rc (ops.h) says. */
static int fused_failed(hpu_layer *l, int rc)
{
	if (rc == HPU_ENOMEM)
		return hpu_layer_error(l, "layer %s: the host has no memory for fused attention's "
					  "buffers",
				       hpu_layer_name(l));
	return hpu_layer_error(l,
			       "layer %s: this device's kernel table has no fused attention "
			       "kernel (HPU_FUSED_ATTENTION=1 when it was declared)",
			       hpu_layer_name(l));
}

/* Fused: saved qkv [3N], ctx [N], lse [L = batch * heads * T] (4N + L);
 * scratch: forward none (with no saved memory, the saved arrays), the
 * backward dctx [N], dqkv [3N] (4N + L in all). */
static int fused_forward(hpu_layer *l, const attention *s, int batch, const int32_t *mask,
			 const hpu_tensor *in, hpu_tensor *out)
{
	size_t n = (size_t)batch * s->t * s->d;
	float *sv = hpu_saved(l) ? hpu_saved(l) : hpu_scratch(l);
	float *qkv = sv, *ctx = sv + 3 * n, *lse = sv + 4 * n;
	hpu_linear_forward(hpu_f32(&in[0]), hpu_param(l, 0), hpu_param(l, 1), qkv, batch * s->t,
			   s->d, 3 * s->d);
	int rc = hpu_attention_fused_forward(qkv, mask, ctx, lse, batch, s->t, s->heads, s->hd,
					     s->causal);
	if (rc)
		return fused_failed(l, rc);
	hpu_linear_forward(ctx, hpu_param(l, 2), hpu_param(l, 3), hpu_f32(&out[0]),
			   batch * s->t, s->d, s->d);
	return HPU_OK;
}

static int fused_backward(hpu_layer *l, const attention *s, int batch, const hpu_tensor *in,
			  const hpu_tensor *dout, hpu_tensor *din)
{
	size_t n = (size_t)batch * s->t * s->d;
	const float *sv = hpu_saved(l);
	const float *qkv = sv, *ctx = sv + 3 * n, *lse = sv + 4 * n;
	float *dctx = hpu_scratch(l), *dqkv = dctx + n;
	const int32_t *mask = s->masked ? hpu_i32(&in[1]) : NULL;
	hpu_linear_backward(ctx, hpu_param(l, 2), hpu_f32(&dout[0]), dctx, hpu_grad(l, 2),
			    hpu_grad(l, 3), batch * s->t, s->d, s->d);
	int rc = hpu_attention_fused_backward(qkv, mask, ctx, lse, dctx, dqkv, batch, s->t,
					      s->heads, s->hd, s->causal);
	if (rc)
		return fused_failed(l, rc);
	hpu_linear_backward(hpu_f32(&in[0]), hpu_param(l, 0), dqkv, hpu_f32(&din[0]),
			    hpu_grad(l, 0), hpu_grad(l, 1), batch * s->t, s->d, 3 * s->d);
	return HPU_OK;
}

/* Unfused: memory, for a micro-batch with N = batch * T * D and P = batch * heads
 * * T * T floats:
 *   saved:   qkv [3N], ctx [N], att [P]                (4N + P)
 *   scratch: forward q, k, v, o head-major [4N] (then, with no saved
 *            memory, as in an evaluation that has none, the saved
 *            arrays); backward q, k, v [3N] (then dqkv), dctx [N], do
 *            [N], dq, dk, dv [3N], dP [P]               (8N + P) */
static int attention_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			     hpu_tensor *out)
{
	const attention *s = hpu_layer_user(l);
	int batch = c->batch, t = s->t, d = s->d, hd = s->hd, bh = batch * s->heads;
	if (batch < 0 || (size_t)batch * s->heads * t > INT_MAX)
		return hpu_layer_error(l, "a micro-batch of %d is too large for the ops' int sizes",
				       batch);
	const int32_t *mask = s->masked ? hpu_i32(&in[1]) : NULL;
	long bad = -1;
	int32_t v = 0;
	int rc = mask ? hpu_ids_first_bad(mask, (size_t)batch * t, 2, &bad, &v) : HPU_OK;
	if (rc == HPU_ERANGE)
		return hpu_layer_error(l, "key mask %s has %d at position %zu of row %zu: "
				       "1 marks a real token, 0 padding",
				       ld_str(in[1].name), v, (size_t)bad % t, (size_t)bad / t);
	if (rc != HPU_OK)
		return ld_op(l, rc, "key mask check");
	if (s->fused)
		return fused_forward(l, s, batch, mask, in, out);
	size_t n = (size_t)batch * t * d, tt = (size_t)t * t, th = (size_t)t * hd;
	float *scr = hpu_scratch(l), *sv = hpu_saved(l);
	if (!sv)
		sv = scr + 4 * n;
	float *qkv = sv, *ctx = sv + 3 * n, *att = sv + 4 * n;
	float *hq = scr, *hk = scr + n, *hv = scr + 2 * n, *ho = scr + 3 * n;
	hpu_linear_forward(hpu_f32(&in[0]), hpu_param(l, 0), hpu_param(l, 1), qkv, batch * t, d,
			   3 * d);
	if (split_heads(s, qkv, 3 * (size_t)d, hq, batch, s->scale) < 0 ||
	    split_heads(s, qkv + d, 3 * (size_t)d, hk, batch, 1.0f) < 0 ||
	    split_heads(s, qkv + 2 * d, 3 * (size_t)d, hv, batch, 1.0f) < 0)
		return NO_KERNEL(l);
	hpu_bmm(hq, hk, att, bh, t, t, hd, 0, 1, 0, th, th, tt);
	if ((s->causal || mask) && mask_scores(s, att, mask, batch, 0) < 0)
		return NO_KERNEL(l);
	hpu_softmax_forward(att, att, bh * t, t);
	/* zeros where a query may not attend: the softmax's exp(-inf) gave
	 * them already, but for a row with no key at all, which only a key
	 * mask makes (under a causal mask alone each query has itself): a
	 * pass over [B, heads, T, T] saved for GPT's causal attention */
	if (mask && mask_scores(s, att, mask, batch, 1) < 0)
		return NO_KERNEL(l);
	hpu_bmm(att, hv, ho, bh, t, hd, t, 0, 0, 0, tt, th, th);
	if (merge_heads(s, ho, ctx, (size_t)d, batch, 1.0f) < 0)
		return NO_KERNEL(l);
	hpu_linear_forward(ctx, hpu_param(l, 2), hpu_param(l, 3), hpu_f32(&out[0]), batch * t, d,
			   d);
	return HPU_OK;
}

/* With P = att, do = dL/dctx per head and q scaled:
 *   dv = P^T do, dP = do v^T, dS = P * (dP - rowsum(dP * P)) (softmax
 *   backward; zero where P is), dq = scale * dS k, dk = dS^T q. */
static int attention_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			      const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)out;
	const attention *s = hpu_layer_user(l);
	if (s->fused)
		return fused_backward(l, s, c->batch, in, dout, din);
	int batch = c->batch, t = s->t, d = s->d, hd = s->hd, bh = batch * s->heads;
	size_t n = (size_t)batch * t * d, tt = (size_t)t * t, th = (size_t)t * hd;
	const float *sv = hpu_saved(l);
	const float *qkv = sv, *ctx = sv + 3 * n, *att = sv + 4 * n;
	float *scr = hpu_scratch(l);
	float *hq = scr, *hk = scr + n, *hv = scr + 2 * n, *dctx = scr + 3 * n;
	float *hdo = scr + 4 * n, *hdq = scr + 5 * n, *hdk = scr + 6 * n, *hdv = scr + 7 * n;
	float *dp = scr + 8 * n, *dqkv = scr;
	hpu_linear_backward(ctx, hpu_param(l, 2), hpu_f32(&dout[0]), dctx, hpu_grad(l, 2),
			    hpu_grad(l, 3), batch * t, d, d);
	if (split_heads(s, dctx, (size_t)d, hdo, batch, 1.0f) < 0 ||
	    split_heads(s, qkv, 3 * (size_t)d, hq, batch, s->scale) < 0 ||
	    split_heads(s, qkv + d, 3 * (size_t)d, hk, batch, 1.0f) < 0 ||
	    split_heads(s, qkv + 2 * d, 3 * (size_t)d, hv, batch, 1.0f) < 0)
		return NO_KERNEL(l);
	hpu_bmm(att, hdo, hdv, bh, t, hd, t, 1, 0, 0, tt, th, th);
	hpu_bmm(hdo, hv, dp, bh, t, t, hd, 0, 1, 0, th, th, tt);
	hpu_softmax_backward(att, dp, dp, bh * t, t);
	hpu_bmm(dp, hk, hdq, bh, t, hd, t, 0, 0, 0, tt, th, th);
	hpu_bmm(dp, hq, hdk, bh, t, hd, t, 1, 0, 0, tt, th, th);
	if (merge_heads(s, hdq, dqkv, 3 * (size_t)d, batch, s->scale) < 0 ||
	    merge_heads(s, hdk, dqkv + d, 3 * (size_t)d, batch, 1.0f) < 0 ||
	    merge_heads(s, hdv, dqkv + 2 * d, 3 * (size_t)d, batch, 1.0f) < 0)
		return NO_KERNEL(l);
	hpu_linear_backward(hpu_f32(&in[0]), hpu_param(l, 0), dqkv, hpu_f32(&din[0]),
			    hpu_grad(l, 0), hpu_grad(l, 1), batch * t, d, 3 * d);
	return HPU_OK;
}

static const hpu_layer_ops attention_ops = {
	.forward = attention_forward,
	.backward = attention_backward,
	.destroy = free,
};

/* Splits "x" or "x,mask" into x[] and mask[] ("" when absent). */
static int split_inputs(hpu_builder *b, const char *name, const char *in, char *x, char *mask)
{
	const char *comma = in ? strchr(in, ',') : NULL;
	size_t nx = comma ? (size_t)(comma - in) : (in ? strlen(in) : 0);
	const char *m = comma ? comma + 1 : "";
	if (!in || !nx || nx >= HPU_NAME_MAX || strchr(m, ',') || strlen(m) >= HPU_NAME_MAX ||
	    (comma && !*m))
		return hpu_error(b, "layer %s: inputs \"%s\" must be \"x\" or \"x,mask\"",
				 ld_str(name), ld_str(in));
	memcpy(x, in, nx);
	x[nx] = 0;
	strcpy(mask, m);
	return HPU_OK;
}

/* Checks the inputs and sizes; fills *s. */
static int attention_check(hpu_builder *b, const char *name, const char *in, int heads,
			   int causal, attention *s)
{
	char xn[HPU_NAME_MAX], mn[HPU_NAME_MAX];
	hpu_tensor x, m;
	if (split_inputs(b, name, in, xn, mn) < 0)
		return HPU_ERROR;
	if (ld_input(b, name, xn, HPU_F32, &x) < 0)
		return HPU_ERROR;
	if (x.ndim != 2)
		return hpu_error(b, "layer %s: input %s must be [T, D] per sample, has %d "
				 "dimensions", ld_str(name), xn, x.ndim);
	if (x.shape[0] > INT_MAX || x.shape[1] > INT_MAX / 3)
		return hpu_error(b, "layer %s: input %s is too large for the ops' int sizes",
				 ld_str(name), xn);
	int t = (int)x.shape[0], d = (int)x.shape[1];
	if (heads < 1 || d % heads)
		return hpu_error(b, "layer %s: heads must be at least 1 and divide the model "
				 "dimension %d, is %d", ld_str(name), d, heads);
	if (*mn && hpu_tensor_info(b, mn, &m) != HPU_OK)
		return hpu_error(b, "layer %s: key mask %s is not a tensor declared before it",
				 ld_str(name), mn);
	if (*mn && (m.dtype != HPU_I32 || m.ndim != 1 || m.shape[0] != t))
		return hpu_error(b, "layer %s: key mask %s must be i32 [%d] per sample (T of %s)",
				 ld_str(name), mn, t, xn);
	if (max_batch(b) * (size_t)heads * (size_t)t > INT_MAX)
		return hpu_error(b, "layer %s: the largest micro-batch (%d) times %d heads times "
				 "T = %d exceeds the ops' int sizes", ld_str(name),
				 hpu_max_batch(b), heads, t);
	*s = (attention){.t = t, .d = d, .heads = heads, .hd = d / heads, .causal = causal != 0,
			 .masked = *mn != 0, .fused = hpu_attention_fused(),
			 .scale = 1.0f / sqrtf((float)(d / heads))};
	return HPU_OK;
}

static hpu_layer *attention_impl(hpu_builder *b, const char *name, const char *in, const char *out,
			 int heads, int causal)
{
	attention chk;
	if (attention_check(b, name, in, heads, causal, &chk) < 0)
		return NULL;
	attention *s = malloc(sizeof *s);
	if (s)
		*s = chk;
	int64_t d = chk.d, xshape[2] = {chk.t, d}, wqkv[2] = {3 * d, d}, bqkv = 3 * d;
	int64_t wo[2] = {d, d};
	/* backward: x (the input projection's dw) and its saved q, k, v,
	 * context and probabilities (unfused) or log-sum-exps (fused); the
	 * key mask only where fused (its backward masks the scores it
	 * recomputes); not the output */
	unsigned reads = chk.fused && chk.masked ? 3u : 1u;
	hpu_layer *l = ld_reads(ld_declare(b, name, in, &attention_ops, s, out, HPU_F32, 2, xshape),
				reads, 0);
	if (!l)
		return NULL;
	hpu_layer_params_in_ops(l); /* its projections are linear ops */
	hpu_layer_grads_in_ops(l);  /* and their gradients the ops' dw, db */
	hpu_layer_backward_reads_linear(l, 1u); /* x: the input projection's */
	/* torch.nn.MultiheadAttention's names and initialization; its
	 * out_proj keeps Linear's default, kaiming_uniform(a = sqrt(5)),
	 * which is U(+-1/sqrt(fan_in)) */
	if (hpu_param_add(l, "in_proj_weight", 2, wqkv, HPU_INIT(XAVIER_UNIFORM)) < 0 ||
	    hpu_param_add(l, "in_proj_bias", 1, &bqkv, HPU_INIT(ZEROS)) < 0 ||
	    hpu_param_add(l, "out_proj.weight", 2, wo, HPU_INIT(FAN_IN_UNIFORM)) < 0 ||
	    hpu_param_add(l, "out_proj.bias", 1, &d, HPU_INIT(ZEROS)) < 0)
		return NULL;
	size_t td = (size_t)chk.t * chk.d, htt = (size_t)chk.heads * chk.t * chk.t;
	size_t ht = (size_t)chk.heads * chk.t;
	if (chk.fused)
		hpu_layer_memory(l, 4 * td + ht, 0, 4 * td + ht, 0);
	else
		hpu_layer_memory(l, 4 * td + htt, 0, 8 * td + htt, 0);
	return l;
}

/* ---- ABI 3's options structs, and ABI 2's positional forms (deprecated) ---- */

hpu_layer *hpu_embedding_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_embedding_opts o)
{
	return embedding_impl(b, name, in, out, o.vocab, o.dim);
}

hpu_layer *(hpu_embedding)(hpu_builder *b, const char *name, const char *in, const char *out, int64_t vocab, int64_t dim)
{
	return embedding_impl(b, name, in, out, vocab, dim);
}

hpu_layer *hpu_attention_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_attention_opts o)
{
	int h;
	if (ld_int(b, name, ".heads", o.heads, &h) < 0)
		return NULL;
	return attention_impl(b, name, in, out, h, o.causal);
}

hpu_layer *(hpu_attention)(hpu_builder *b, const char *name, const char *in, const char *out, int heads, int causal)
{
	return attention_impl(b, name, in, out, heads, causal);
}
