/* backend_dnnl_conv: convolution and pooling on oneDNN primitives.
 *
 * Convolution: forward (with bias), backward data and backward weights, in
 * f32 or bf16 (src, weights and diff_dst bf16; dst, diff_src, diff_weights
 * and diff_bias f32: the avx512_core_bf16 kernels take these mixes). Our
 * tensors are plain NCHW / OIHW. A primitive is made for layouts of
 * oneDNN's choosing (format_tag any: the blocked nChw16c / OIhw16i16o
 * family its direct JIT kernels want), and every argument whose chosen
 * layout is not the plain one goes through a reorder primitive (its own
 * cache key) into or out of a buffer of the convolution's entry. On the
 * CNN's layers (fmnist_cnn, batch 256, one thread, avx512_core_bf16) this
 * beat plain layouts (which oneDNN serves with im2col + gemm) reorders
 * included: conv2 (32 -> 64, 14x14, 5x5) forward f32 ~57 vs ~75 ms, bf16
 * ~22 vs ~54 ms; conv1 (1 -> 32) backward weights f32 ~6 vs ~15 ms, bf16
 * ~5 vs ~26 ms. The exception is backward data with few input channels,
 * which blocked layouts pad to 16 (conv1: ~61 vs ~7 ms): it uses plain
 * layouts below 16 input channels. HPU_DNNL_CONV_LAYOUT=plain|any forces
 * one for measurement. dnnl_convolution_auto picked the same kernels as
 * direct for these shapes; direct is used (auto may pick Winograd for
 * 3x3, with other rounding). HPU_DNNL_CONV_ALG=auto for measurement.
 *
 * Backward in one call (hpu__dnnl_conv_bwd, the table's conv_bwd): where
 * backward weights and backward data take diff_dst in the same layout, dy
 * is reordered once, into backward weights' buffer, and backward data
 * reads it there. Measured (ONEDNN_VERBOSE=1, fmnist_cnn batch 256, one
 * thread, steps 3-12, per step): the reorders were 14.4-14.6 ms of
 * oneDNN's 152-158 ms in f32 and 11.1-11.3 of 88-89 ms in bf16, about 8-9%
 * of the step's CPU time; the second 256x64x14x14 dy reorder (2.0 ms f32,
 * 1.1 ms bf16) is what this removes. What is left: the forward outputs
 * (blocked f32 -> plain: 2.4 + 1.8 ms), conv1's dy (3.1 / 2.5 ms), conv2's
 * input in forward and again in backward weights (0.9 / 0.6 ms each),
 * backward data's dx (0.9 ms), the weights (0.02-0.05 ms: not worth
 * sharing). A plain dst is served by gemm (conv1) or the reference kernel
 * (conv2 from nChw16c), so the output reorders stay while the ops between
 * the convolutions work on NCHW. Converting f32 -> bf16 in the reorder
 * itself (instead of hpu__ac_bf16's pass, then a bf16 reorder) is not
 * used: oneDNN 2.6.3's f32 -> bf16 reorder (jit:uni, avx512_core_bf16)
 * flushes denormal inputs to +-0, where hpu_to_bf16 rounds them (NaN,
 * ties and every other finite value agree). Keeping forward's reordered
 * input for backward weights would need proof that x did not change in
 * between (it is not done).
 *
 * oneDNN overwrites diff_weights and diff_bias; ours accumulate (dw +=,
 * db +=): diff_weights is computed into the entry's buffer and reordered
 * into dw with a sum post-op (or added, when the layout is plain), and
 * diff_bias is computed into the buffer and added.
 *
 * Output sizes that leave input rows/columns unread (a stride that does
 * not divide) would need a negative right padding; instead the input is
 * described as its top-left part (same strides), and backward data zeroes
 * the rest of dx.
 *
 * Pooling: oneDNN's pooling on NCHW was not faster than the reference
 * loops on the CNN's 2x2 windows (batch 256, 32x28x28: max fwd ~3.9 vs
 * ~1.9 ms, bwd ~4.0 vs ~2.1 ms; avg fwd ~3.4 vs ~1.2 ms), so the table
 * (backend_dnnl.c) declines pooling. Average pooling through oneDNN is here
 * (tested); max pooling is not: the ops' idx holds the arg-max position
 * (ops.h; tests and the reference backward rely on it), which oneDNN's
 * workspace (u8 window offsets, a quarter of idx's bytes) is not.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ops/backend_dnnl.h"
#include "common/env.h"

/* ---- keys ---- */

enum {
	OP_CONV_FWD = 2,
	OP_CONV_BWD_DATA = 3,
	OP_CONV_BWD_WEIGHTS = 4,
	OP_CONV_REORDER = 5,
	OP_AVGPOOL_FWD = 6,
	OP_AVGPOOL_BWD = 7,
};

enum { LAYOUT_PLAIN = 0, LAYOUT_ANY = 1 };
#define LAYOUT_DEFAULT LAYOUT_ANY

typedef struct conv_key {
	int op; /* OP_CONV_* */
	int dt, b, c, h, w, o, k, s, p;
	int bias;   /* fwd: b given; bwd_weights: db given */
	int layout; /* LAYOUT_* */
	int conv_op; /* OP_CONV_REORDER: the convolution's op; else 0 */
	int arg;     /* OP_CONV_REORDER: its DNNL_ARG_* */
} conv_key;

static int env_choice(hpu_env_id id, const char *alt, int dflt, int altval)
{
	const char *v = hpu__env_str(id);
	if (!v || !*v)
		return dflt;
	return strcmp(v, alt) == 0 ? altval : !altval;
}

static int layout_forced; /* HPU_DNNL_CONV_LAYOUT set */

static int conv_layout(void)
{
	static int layout = -1;
	if (layout < 0) {
		const char *v = hpu__env_str(HPU_ENV_HPU_DNNL_CONV_LAYOUT);
		layout_forced = v && *v;
		layout = env_choice(HPU_ENV_HPU_DNNL_CONV_LAYOUT, "plain", LAYOUT_DEFAULT,
				    LAYOUT_PLAIN);
	}
	return layout;
}

/* ---- geometry ---- */

static int out_size(int in, int k, int s, int p)
{
	return (in + 2 * p - k) / s + 1;
}

/* The input extent oneDNN sees along one dimension (rows past the last
 * window are dropped) and the right padding that goes with it (>= 0). */
static void extent(int in, int k, int s, int p, int *used, int *pad_r)
{
	int o = out_size(in, k, s, p);
	int r = (o - 1) * s + k - in - p;
	if (r < 0) {
		*used = in + r;
		*pad_r = 0;
	} else {
		*used = in;
		*pad_r = r;
	}
}

/* x[B, C, hu, wu] inside x[B, C, H, W] (plain, dense strides of H, W). */
static int src_plain_md(dnnl_memory_desc_t *md, int b, int c, int h, int w, int hu, int wu,
			dnnl_data_type_t dt)
{
	dnnl_dims_t dims = {b, c, hu, wu};
	dnnl_dims_t strides = {(int64_t)c * h * w, (int64_t)h * w, w, 1};
	return dnnl_memory_desc_init_by_strides(md, 4, dims, dt, strides) == dnnl_success
		       ? 0
		       : -1;
}

/* The plain layout of each convolution argument. */
static int conv_plain_md(const conv_key *k, int arg, dnnl_memory_desc_t *md)
{
	int hu, wu, pr;
	extent(k->h, k->k, k->s, k->p, &hu, &pr);
	extent(k->w, k->k, k->s, k->p, &wu, &pr);
	dnnl_data_type_t dt = hpu__dnnl_dt((hpu__dtype)k->dt);
	int oh = out_size(k->h, k->k, k->s, k->p), ow = out_size(k->w, k->k, k->s, k->p);
	switch (arg) {
	case DNNL_ARG_SRC:
		return src_plain_md(md, k->b, k->c, k->h, k->w, hu, wu, dt);
	case DNNL_ARG_DIFF_SRC:
		return src_plain_md(md, k->b, k->c, k->h, k->w, hu, wu, dnnl_f32);
	case DNNL_ARG_WEIGHTS:
	case DNNL_ARG_DIFF_WEIGHTS: {
		dnnl_dims_t d = {k->o, k->c, k->k, k->k};
		hpu__dnnl_md(md, 4, d, arg == DNNL_ARG_WEIGHTS ? dt : dnnl_f32);
		return 0;
	}
	case DNNL_ARG_DST:
	case DNNL_ARG_DIFF_DST: {
		dnnl_dims_t d = {k->b, k->o, oh, ow};
		hpu__dnnl_md(md, 4, d, arg == DNNL_ARG_DST ? dnnl_f32 : dt);
		return 0;
	}
	case DNNL_ARG_BIAS:
	case DNNL_ARG_DIFF_BIAS: {
		dnnl_dims_t d = {k->o};
		hpu__dnnl_md(md, 1, d, dnnl_f32);
		return 0;
	}
	}
	return -1;
}

static int any_md(dnnl_memory_desc_t *md, const dnnl_memory_desc_t *plain)
{
	return dnnl_memory_desc_init_by_tag(md, plain->ndims, plain->dims, plain->data_type,
					    dnnl_format_tag_any) == dnnl_success
		       ? 0
		       : -1;
}

/* The mds a descriptor is made of: plain, or 'any' for the big ones. */
static int conv_desc_md(const conv_key *k, int arg, dnnl_memory_desc_t *md)
{
	if (conv_plain_md(k, arg, md) < 0)
		return -1;
	if (k->layout == LAYOUT_ANY && arg != DNNL_ARG_BIAS && arg != DNNL_ARG_DIFF_BIAS) {
		dnnl_memory_desc_t plain = *md;
		return any_md(md, &plain);
	}
	return 0;
}

/* The primitive descriptor of convolution op `op` for k's shape. */
static int conv_pd(const conv_key *k, int op, dnnl_engine_t eng, dnnl_primitive_desc_t *pd)
{
	int hu, wu, pr_h, pr_w;
	extent(k->h, k->k, k->s, k->p, &hu, &pr_h);
	extent(k->w, k->k, k->s, k->p, &wu, &pr_w);
	dnnl_dims_t strides = {k->s, k->s}, pl = {k->p, k->p}, pr = {pr_h, pr_w};
	/* direct: convolution_auto picked the same kernels on these shapes */
	dnnl_alg_kind_t alg = dnnl_convolution_direct;
	dnnl_memory_desc_t src, wei, dst, bias, dsrc, dwei, ddst, dbias;
	if (conv_desc_md(k, DNNL_ARG_SRC, &src) < 0 ||
	    conv_desc_md(k, DNNL_ARG_WEIGHTS, &wei) < 0 ||
	    conv_desc_md(k, DNNL_ARG_DST, &dst) < 0 || conv_desc_md(k, DNNL_ARG_BIAS, &bias) < 0)
		return -1;
	int fwd_bias = op == OP_CONV_FWD ? k->bias : 0;
	dnnl_convolution_desc_t fd;
	if (dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, alg, &src, &wei,
					       fwd_bias ? &bias : NULL, &dst, strides, pl,
					       pr) != dnnl_success)
		return -1;
	dnnl_primitive_desc_t fpd;
	if (dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL) != dnnl_success)
		return -1;
	if (op == OP_CONV_FWD) {
		*pd = fpd;
		return 0;
	}
	dnnl_convolution_desc_t bd;
	dnnl_status_t st;
	if (op == OP_CONV_BWD_DATA) {
		if (conv_desc_md(k, DNNL_ARG_DIFF_SRC, &dsrc) < 0 ||
		    conv_desc_md(k, DNNL_ARG_DIFF_DST, &ddst) < 0)
			st = dnnl_invalid_arguments;
		else
			st = dnnl_convolution_backward_data_desc_init(&bd, alg, &dsrc, &wei, &ddst,
								      strides, pl, pr);
	} else {
		if (conv_desc_md(k, DNNL_ARG_DIFF_WEIGHTS, &dwei) < 0 ||
		    conv_desc_md(k, DNNL_ARG_DIFF_DST, &ddst) < 0 ||
		    conv_desc_md(k, DNNL_ARG_DIFF_BIAS, &dbias) < 0)
			st = dnnl_invalid_arguments;
		else
			st = dnnl_convolution_backward_weights_desc_init(
				&bd, alg, &src, &dwei, k->bias ? &dbias : NULL, &ddst, strides, pl,
				pr);
	}
	if (st == dnnl_success)
		st = dnnl_primitive_desc_create(pd, &bd, NULL, eng, fpd);
	dnnl_primitive_desc_destroy(fpd);
	return st == dnnl_success ? 0 : -1;
}

/* The arguments of each convolution, in the order of the data pointers. */
static int conv_args(int op, int *args)
{
	switch (op) {
	case OP_CONV_FWD:
		args[0] = DNNL_ARG_SRC, args[1] = DNNL_ARG_WEIGHTS, args[2] = DNNL_ARG_DST;
		args[3] = DNNL_ARG_BIAS;
		break;
	case OP_CONV_BWD_DATA:
		args[0] = DNNL_ARG_DIFF_DST, args[1] = DNNL_ARG_WEIGHTS;
		args[2] = DNNL_ARG_DIFF_SRC, args[3] = 0;
		break;
	default:
		args[0] = DNNL_ARG_SRC, args[1] = DNNL_ARG_DIFF_DST;
		args[2] = DNNL_ARG_DIFF_WEIGHTS, args[3] = DNNL_ARG_DIFF_BIAS;
		break;
	}
	return 4;
}

static int is_input(int arg)
{
	return arg == DNNL_ARG_SRC || arg == DNNL_ARG_WEIGHTS || arg == DNNL_ARG_DIFF_DST ||
	       arg == DNNL_ARG_BIAS;
}

/* Whether argument arg of a primitive needs a buffer of the entry: its
 * layout is not the plain one, or it is a gradient we accumulate. */
static int needs_buffer(int arg, const dnnl_memory_desc_t *md, const dnnl_memory_desc_t *plain)
{
	if (arg == DNNL_ARG_DIFF_WEIGHTS || arg == DNNL_ARG_DIFF_BIAS)
		return 1;
	return !dnnl_memory_desc_equal(md, plain);
}

#define ALIGN 64
static size_t round_up(size_t n)
{
	return (n + ALIGN - 1) / ALIGN * ALIGN;
}

static int make_conv(hpu__dnnl_prim *p, const void *vkey, dnnl_engine_t eng)
{
	const conv_key *k = vkey;
	dnnl_primitive_desc_t pd;
	if (conv_pd(k, k->op, eng, &pd) < 0)
		return -1;
	int rc = dnnl_primitive_create(&p->prim, pd) == dnnl_success ? 0 : -1;
	int args[4];
	conv_args(k->op, args);
	size_t bytes = ALIGN; /* for aligning the malloc'ed base */
	for (int i = 0; i < 4 && rc == 0; i++) {
		if (!args[i] || (!k->bias && (args[i] == DNNL_ARG_BIAS ||
					      args[i] == DNNL_ARG_DIFF_BIAS))) {
			/* keep the positions: a 1-element placeholder is not
			 * needed, the argument is just absent */
			continue;
		}
		const dnnl_memory_desc_t *md =
			dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, args[i]);
		dnnl_memory_desc_t plain;
		if (!md || conv_plain_md(k, args[i], &plain) < 0 ||
		    hpu__dnnl_arg(p, eng, args[i], md) < 0) {
			rc = -1;
			break;
		}
		if (needs_buffer(args[i], md, &plain))
			bytes += round_up(dnnl_memory_desc_get_size(md));
	}
	dnnl_primitive_desc_destroy(pd);
	p->scratch_bytes = bytes;
	return rc;
}

/* A reorder between argument k->arg's plain layout and the layout of
 * convolution k->conv_op; into the plain one with a sum (accumulating)
 * for diff_weights. */
static int make_reorder(hpu__dnnl_prim *p, const void *vkey, dnnl_engine_t eng)
{
	const conv_key *k = vkey;
	dnnl_primitive_desc_t cpd;
	if (conv_pd(k, k->conv_op, eng, &cpd) < 0)
		return -1;
	const dnnl_memory_desc_t *q = dnnl_primitive_desc_query_md(cpd, dnnl_query_exec_arg_md,
								   k->arg);
	dnnl_memory_desc_t md, plain;
	int rc = -1;
	if (q && conv_plain_md(k, k->arg, &plain) == 0) {
		md = *q;
		rc = 0;
	}
	dnnl_primitive_desc_destroy(cpd);
	if (rc < 0)
		return -1;
	const dnnl_memory_desc_t *from = is_input(k->arg) ? &plain : &md;
	const dnnl_memory_desc_t *to = is_input(k->arg) ? &md : &plain;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	if (k->arg == DNNL_ARG_DIFF_WEIGHTS) {
		if (dnnl_primitive_attr_create(&attr) != dnnl_success)
			return -1;
		if (dnnl_post_ops_create(&po) != dnnl_success ||
		    dnnl_post_ops_append_sum(po, 1.0f) != dnnl_success ||
		    dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success)
			rc = -1;
	}
	dnnl_primitive_desc_t pd = NULL;
	if (rc == 0 && dnnl_reorder_primitive_desc_create(&pd, from, eng, to, eng, attr) !=
			       dnnl_success) {
		pd = NULL;
		rc = -1;
	}
	if (po)
		dnnl_post_ops_destroy(po);
	if (attr)
		dnnl_primitive_attr_destroy(attr);
	if (rc < 0)
		return -1;
	if (dnnl_primitive_create(&p->prim, pd) != dnnl_success)
		rc = -1;
	dnnl_primitive_desc_destroy(pd);
	if (rc == 0 && (hpu__dnnl_arg(p, eng, DNNL_ARG_FROM, from) < 0 ||
			hpu__dnnl_arg(p, eng, DNNL_ARG_TO, to) < 0))
		rc = -1;
	return rc;
}

/* A convolution's cache entries: its primitive m and, per argument, the
 * reorder to or from its plain layout (NULL: the layouts agree). */
typedef struct conv_prep {
	conv_key k;
	hpu__dnnl_prim *m;
	hpu__dnnl_prim *ro[HPU__DNNL_MAX_ARGS];
	conv_key rk[HPU__DNNL_MAX_ARGS];
} conv_prep;

/* Gets p's entries; *same: all were the ones p held already. */
static int conv_get(conv_prep *p, int *same)
{
	const conv_key *k = &p->k;
	hpu__dnnl_prim *m = hpu__dnnl_get(k, sizeof *k, make_conv);
	if (!m)
		return HPU_BE_UNSUPPORTED;
	*same = m == p->m;
	p->m = m;
	for (int i = 0; i < m->nargs; i++) {
		hpu__dnnl_prim *r = NULL;
		int a = m->arg[i];
		if (a != DNNL_ARG_DIFF_BIAS) {
			dnnl_memory_desc_t plain;
			const dnnl_memory_desc_t *md;
			if (dnnl_memory_get_memory_desc(m->mem[i], &md) != dnnl_success ||
			    conv_plain_md(k, a, &plain) < 0)
				return HPU_BE_UNSUPPORTED;
			if (!dnnl_memory_desc_equal(md, &plain)) {
				p->rk[i] = *k;
				p->rk[i].op = OP_CONV_REORDER;
				p->rk[i].conv_op = k->op;
				p->rk[i].arg = a;
				r = hpu__dnnl_get(&p->rk[i], sizeof p->rk[i], make_reorder);
				if (!r)
					return HPU_BE_UNSUPPORTED;
			}
		}
		*same = *same && r == p->ro[i];
		p->ro[i] = r;
	}
	return HPU_BE_OK;
}

/* Gets the entries of the n convolutions p[] (fresh: key filled, the rest
 * zeroed). The cache starts over when it fills up, which would free
 * entries got earlier: get them all until a pass sees the same ones (a
 * second pass only hits unless a clear happened). */
static int conv_prepare(conv_prep *p, int n)
{
	for (int pass = 0; pass < 4; pass++) {
		int all = 1;
		for (int j = 0; j < n; j++) {
			int same;
			if (conv_get(&p[j], &same) != HPU_BE_OK)
				return HPU_BE_UNSUPPORTED;
			all = all && same;
		}
		if (all && pass > 0)
			return HPU_BE_OK;
	}
	return HPU_BE_UNSUPPORTED;
}

/* The index of argument arg in p's primitive, or -1. */
static int conv_arg_at(const conv_prep *p, int arg)
{
	for (int i = 0; i < p->m->nargs; i++)
		if (p->m->arg[i] == arg)
			return i;
	return -1;
}

/* Runs prepared convolution p with user pointers data[] in conv_args()
 * order (NULL for an absent bias). dd: diff_dst already in the
 * primitive's layout (its reorder skipped), or NULL; *dd_at (if given):
 * where diff_dst went through its reorder (the entry's buffer, valid until
 * the next hpu__dnnl_get), else NULL. */
static int conv_exec(const conv_prep *p, void *const *data, const void *dd, void **dd_at)
{
	const conv_key *k = &p->k;
	hpu__dnnl_prim *m = p->m;
	int args[4];
	conv_args(k->op, args);
	if (dd_at)
		*dd_at = NULL;
	/* buffers, in argument order */
	unsigned char *base = (unsigned char *)(((uintptr_t)m->scratch + ALIGN - 1) /
						ALIGN * ALIGN);
	void *conv_data[HPU__DNNL_MAX_ARGS], *buf[HPU__DNNL_MAX_ARGS] = {0};
	void *user[HPU__DNNL_MAX_ARGS];
	for (int i = 0, j = 0; i < m->nargs; i++) {
		while (j < 4 && args[j] != m->arg[i])
			j++;
		user[i] = j < 4 ? data[j] : NULL;
		int a = m->arg[i];
		if (p->ro[i] || a == DNNL_ARG_DIFF_WEIGHTS || a == DNNL_ARG_DIFF_BIAS) {
			const dnnl_memory_desc_t *md;
			dnnl_memory_get_memory_desc(m->mem[i], &md);
			buf[i] = base;
			base += round_up(dnnl_memory_desc_get_size(md));
		}
		conv_data[i] = buf[i] ? buf[i] : user[i];
	}
	/* inputs into the primitive's layouts */
	for (int i = 0; i < m->nargs; i++) {
		if (!p->ro[i] || !is_input(m->arg[i]))
			continue;
		if (dd && m->arg[i] == DNNL_ARG_DIFF_DST) {
			conv_data[i] = (void *)dd;
			continue;
		}
		void *d[2] = {user[i], buf[i]};
		if (hpu__dnnl_run(p->ro[i], d) != HPU_BE_OK)
			return HPU_BE_UNSUPPORTED;
		if (dd_at && m->arg[i] == DNNL_ARG_DIFF_DST)
			*dd_at = buf[i];
	}
	if (hpu__dnnl_run(m, conv_data) != HPU_BE_OK)
		return HPU_BE_UNSUPPORTED;
	/* outputs back (diff_weights and diff_bias added) */
	for (int i = 0; i < m->nargs; i++) {
		int a = m->arg[i];
		if (is_input(a))
			continue;
		if (p->ro[i]) {
			void *d[2] = {buf[i], user[i]};
			if (hpu__dnnl_run(p->ro[i], d) != HPU_BE_OK)
				return HPU_BE_UNSUPPORTED;
		} else if (a == DNNL_ARG_DIFF_WEIGHTS || a == DNNL_ARG_DIFF_BIAS) {
			size_t n = a == DNNL_ARG_DIFF_BIAS ? (size_t)k->o
							   : (size_t)k->o * k->c * k->k * k->k;
			float *dst = user[i];
			const float *src = buf[i];
			for (size_t e = 0; e < n; e++)
				dst[e] += src[e];
		}
	}
	return HPU_BE_OK;
}

/* Runs convolution key k (op, shape, dt filled) with user pointers data[]
 * in conv_args() order (NULL for an absent bias). */
static int conv_run(const conv_key *k, void *const *data)
{
	conv_prep p;
	memset(&p, 0, sizeof p);
	p.k = *k;
	if (conv_prepare(&p, 1) != HPU_BE_OK)
		return HPU_BE_UNSUPPORTED;
	return conv_exec(&p, data, NULL, NULL);
}

static void conv_key_init(conv_key *k, int op, const hpu_conv2d_shape *s, hpu__dtype dt,
			  int bias)
{
	memset(k, 0, sizeof *k);
	k->op = op;
	k->dt = dt;
	k->b = s->batch, k->c = s->in_ch, k->h = s->height, k->w = s->width;
	k->o = s->out_ch, k->k = s->kernel, k->s = s->stride, k->p = s->pad;
	k->bias = !!bias;
	/* A few input channels in blocked layouts are padded to 16: the
	 * CNN's first layer (1 channel) computes dx 7-10x slower that way
	 * than on plain layouts (oneDNN's gemm kernel). */
	k->layout = conv_layout();
	if (op == OP_CONV_BWD_DATA && s->in_ch < 16 && !layout_forced)
		k->layout = LAYOUT_PLAIN;
}

static int conv_ok(const hpu_conv2d_shape *s, hpu__dtype dt)
{
	if (dt == HPU_DT_BF16 && !hpu__dnnl_bf16_native())
		return 0;
	return s->batch > 0 && s->in_ch > 0 && s->out_ch > 0 && s->kernel > 0 &&
	       s->stride > 0 && s->pad >= 0 && s->height + 2 * s->pad >= s->kernel &&
	       s->width + 2 * s->pad >= s->kernel;
}

int hpu__dnnl_conv_fwd(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
		       const void *w, const float *b, float *y)
{
	if (!conv_ok(s, dt))
		return HPU_BE_UNSUPPORTED;
	conv_key k;
	conv_key_init(&k, OP_CONV_FWD, s, dt, b != NULL);
	void *data[4] = {(void *)x, (void *)w, y, (void *)b};
	return conv_run(&k, data);
}

/* The rows and columns of dx no window reads get no gradient. */
static void zero_unread(const hpu_conv2d_shape *s, float *dx)
{
	int hu, wu, pr;
	extent(s->height, s->kernel, s->stride, s->pad, &hu, &pr);
	extent(s->width, s->kernel, s->stride, s->pad, &wu, &pr);
	if (hu < s->height || wu < s->width) {
		size_t planes = (size_t)s->batch * s->in_ch;
		for (size_t pl = 0; pl < planes; pl++) {
			float *d = dx + pl * s->height * s->width;
			for (int r = 0; r < hu; r++)
				for (int c = wu; c < s->width; c++)
					d[(size_t)r * s->width + c] = 0.0f;
			memset(d + (size_t)hu * s->width, 0,
			       (size_t)(s->height - hu) * s->width * sizeof *d);
		}
	}
}

int hpu__dnnl_conv_bwd_data(const hpu_conv2d_shape *s, hpu__dtype dt, const void *w,
			    const void *dy, float *dx)
{
	if (!conv_ok(s, dt))
		return HPU_BE_UNSUPPORTED;
	conv_key k;
	conv_key_init(&k, OP_CONV_BWD_DATA, s, dt, 0);
	void *data[4] = {(void *)dy, (void *)w, dx, NULL};
	int rc = conv_run(&k, data);
	if (rc != HPU_BE_OK)
		return rc;
	zero_unread(s, dx);
	return HPU_BE_OK;
}

int hpu__dnnl_conv_bwd_weights(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
			       const void *dy, float *dw, float *db)
{
	if (!conv_ok(s, dt))
		return HPU_BE_UNSUPPORTED;
	conv_key k;
	conv_key_init(&k, OP_CONV_BWD_WEIGHTS, s, dt, db != NULL);
	void *data[4] = {(void *)x, (void *)dy, dw, db};
	return conv_run(&k, data);
}

unsigned long hpu__dnnl_conv_dy_shared; /* tests: bwd_data read bwd_weights' dy */

/* Both backward convolutions, backward weights first. Where both take
 * diff_dst in the same non-plain layout (the CNN's 32 -> 64 layer: nChw16c
 * in f32 and bf16), dy is reordered once, into backward weights' buffer,
 * and backward data reads it there: the same reorder of the same dy, so
 * the same bits as two calls. Nothing is written before both primitives
 * are in hand; *weights_done says whether dw and db were accumulated when
 * the answer is not HPU_BE_OK. */
int hpu__dnnl_conv_bwd(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
		       const void *w, const void *dy, float *dx, float *dw, float *db,
		       int *weights_done)
{
	*weights_done = 0;
	if (!conv_ok(s, dt))
		return HPU_BE_UNSUPPORTED;
	conv_prep p[2];
	memset(p, 0, sizeof p);
	conv_key_init(&p[0].k, OP_CONV_BWD_WEIGHTS, s, dt, db != NULL);
	conv_key_init(&p[1].k, OP_CONV_BWD_DATA, s, dt, 0);
	if (conv_prepare(p, 2) != HPU_BE_OK)
		return HPU_BE_UNSUPPORTED;
	int iw = conv_arg_at(&p[0], DNNL_ARG_DIFF_DST), id = conv_arg_at(&p[1], DNNL_ARG_DIFF_DST);
	const dnnl_memory_desc_t *mw = NULL, *md = NULL;
	int share = iw >= 0 && id >= 0 && p[0].ro[iw] && p[1].ro[id] &&
		    dnnl_memory_get_memory_desc(p[0].m->mem[iw], &mw) == dnnl_success &&
		    dnnl_memory_get_memory_desc(p[1].m->mem[id], &md) == dnnl_success &&
		    dnnl_memory_desc_equal(mw, md);
	void *wdata[4] = {(void *)x, (void *)dy, dw, db};
	void *dd = NULL;
	if (conv_exec(&p[0], wdata, NULL, share ? &dd : NULL) != HPU_BE_OK)
		return HPU_BE_UNSUPPORTED;
	*weights_done = 1;
	void *ddata[4] = {(void *)dy, (void *)w, dx, NULL};
	if (conv_exec(&p[1], ddata, dd, NULL) != HPU_BE_OK)
		return HPU_BE_UNSUPPORTED;
	if (dd)
		hpu__dnnl_conv_dy_shared++;
	zero_unread(s, dx);
	return HPU_BE_OK;
}

/* ---- pooling ---- */

typedef struct pool_key {
	int op; /* OP_AVGPOOL_* */
	int b, c, h, w, k, s;
} pool_key;

static int make_pool(hpu__dnnl_prim *p, const void *vkey, dnnl_engine_t eng)
{
	const pool_key *k = vkey;
	int hu, wu, pr_h, pr_w;
	extent(k->h, k->k, k->s, 0, &hu, &pr_h);
	extent(k->w, k->k, k->s, 0, &wu, &pr_w);
	int oh = out_size(k->h, k->k, k->s, 0), ow = out_size(k->w, k->k, k->s, 0);
	dnnl_memory_desc_t src, dst;
	dnnl_dims_t dd = {k->b, k->c, oh, ow};
	if (src_plain_md(&src, k->b, k->c, k->h, k->w, hu, wu, dnnl_f32) < 0)
		return -1;
	hpu__dnnl_md(&dst, 4, dd, dnnl_f32);
	dnnl_dims_t strides = {k->s, k->s}, kernel = {k->k, k->k}, pl = {0, 0},
		    pr = {pr_h, pr_w};
	dnnl_pooling_desc_t fd;
	if (dnnl_pooling_forward_desc_init(&fd, dnnl_forward_training,
					   dnnl_pooling_avg_exclude_padding, &src, &dst, strides,
					   kernel, pl, pr) != dnnl_success)
		return -1;
	dnnl_primitive_desc_t pd;
	if (k->op == OP_AVGPOOL_FWD) {
		if (hpu__dnnl_create(&p->prim, &pd, &fd, NULL, eng, NULL) < 0)
			return -1;
		dnnl_primitive_desc_destroy(pd);
		return hpu__dnnl_arg(p, eng, DNNL_ARG_SRC, &src) < 0 ||
				       hpu__dnnl_arg(p, eng, DNNL_ARG_DST, &dst) < 0
			       ? -1
			       : 0;
	}
	dnnl_primitive_desc_t fpd;
	if (dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL) != dnnl_success)
		return -1;
	dnnl_pooling_desc_t bd;
	int rc = -1;
	if (dnnl_pooling_backward_desc_init(&bd, dnnl_pooling_avg_exclude_padding, &src, &dst,
					    strides, kernel, pl, pr) == dnnl_success)
		rc = hpu__dnnl_create(&p->prim, &pd, &bd, NULL, eng, fpd);
	dnnl_primitive_desc_destroy(fpd);
	if (rc < 0)
		return -1;
	dnnl_primitive_desc_destroy(pd);
	return hpu__dnnl_arg(p, eng, DNNL_ARG_DIFF_DST, &dst) < 0 ||
			       hpu__dnnl_arg(p, eng, DNNL_ARG_DIFF_SRC, &src) < 0
		       ? -1
		       : 0;
}

static int pool_ok(int batch, int ch, int h, int w, int k, int stride)
{
	return batch > 0 && ch > 0 && k > 0 && stride > 0 && h >= k && w >= k;
}

int hpu__dnnl_avgpool_fwd(const float *x, float *y, int batch, int ch, int h, int w,
			  int k, int stride)
{
	if (!pool_ok(batch, ch, h, w, k, stride))
		return HPU_BE_UNSUPPORTED;
	pool_key key;
	memset(&key, 0, sizeof key);
	key = (pool_key){OP_AVGPOOL_FWD, batch, ch, h, w, k, stride};
	hpu__dnnl_prim *p = hpu__dnnl_get(&key, sizeof key, make_pool);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	void *data[2] = {(void *)x, y};
	return hpu__dnnl_run(p, data);
}

int hpu__dnnl_avgpool_bwd(const float *dy, float *dx, int batch, int ch, int h, int w,
			  int k, int stride)
{
	if (!pool_ok(batch, ch, h, w, k, stride))
		return HPU_BE_UNSUPPORTED;
	pool_key key;
	memset(&key, 0, sizeof key);
	key = (pool_key){OP_AVGPOOL_BWD, batch, ch, h, w, k, stride};
	hpu__dnnl_prim *p = hpu__dnnl_get(&key, sizeof key, make_pool);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	void *data[2] = {(void *)dy, dx};
	int rc = hpu__dnnl_run(p, data);
	if (rc != HPU_BE_OK)
		return rc;
	int hu, wu, pr;
	extent(h, k, stride, 0, &hu, &pr);
	extent(w, k, stride, 0, &wu, &pr);
	if (hu < h || wu < w)
		for (size_t pl = 0; pl < (size_t)batch * ch; pl++) {
			float *d = dx + pl * h * w;
			for (int r = 0; r < hu; r++)
				for (int c = wu; c < w; c++)
					d[(size_t)r * w + c] = 0.0f;
			memset(d + (size_t)hu * w, 0, (size_t)(h - hu) * w * sizeof *d);
		}
	return HPU_BE_OK;
}
