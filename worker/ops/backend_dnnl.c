/* backend_dnnl: the oneDNN backend (backend.h) -- the engine, the
 * per-thread primitive cache, the matrix products, and the table.
 *
 * oneDNN (Debian's libdnnl, OpenMP runtime) JIT-compiles kernels for the
 * CPU it runs on: with avx512_bf16 a bf16 x bf16 product accumulates in
 * fp32 at about twice the fp32 rate. A worker is one device: its kernels
 * run on one OpenMP thread unless set_threads() says otherwise (per
 * calling thread: the OpenMP thread count is a per-thread setting).
 */
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_dnnl.h"

/* ---- engine, stream, threads ---- */

static dnnl_engine_t engine;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static _Atomic int threads = 1;

static void engine_init(void)
{
	if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success)
		engine = NULL;
}

static dnnl_engine_t get_engine(void)
{
	pthread_once(&engine_once, engine_init);
	return engine;
}

/* ---- the per-thread cache ---- */

#define CACHE_SLOTS 256

typedef struct entry {
	unsigned char key[HPU__DNNL_MAX_KEY];
	size_t keylen; /* 0: empty */
	hpu__dnnl_prim p;
} entry;

typedef struct tcache {
	entry e[CACHE_SLOTS];
	unsigned next; /* the slot to evict next when full */
	dnnl_stream_t stream;
	int threads; /* the OpenMP thread count set for this thread */
} tcache;

static __thread tcache *tc;

static void prim_clear(hpu__dnnl_prim *p)
{
	for (int i = 0; i < p->nargs; i++)
		dnnl_memory_destroy(p->mem[i]);
	if (p->prim)
		dnnl_primitive_destroy(p->prim);
	free(p->scratch);
	memset(p, 0, sizeof *p);
}

static pthread_key_t tc_key;
static pthread_once_t tc_key_once = PTHREAD_ONCE_INIT;

static void tc_free(void *v)
{
	tcache *c = v;
	for (int i = 0; i < CACHE_SLOTS; i++)
		if (c->e[i].keylen)
			prim_clear(&c->e[i].p);
	if (c->stream)
		dnnl_stream_destroy(c->stream);
	free(c);
}

static void tc_key_init(void)
{
	pthread_key_create(&tc_key, tc_free);
}

static tcache *get_tc(void)
{
	if (tc) {
		int want = atomic_load(&threads);
		if (tc->threads != want) {
			omp_set_num_threads(want);
			tc->threads = want;
		}
		return tc;
	}
	dnnl_engine_t eng = get_engine();
	if (!eng)
		return NULL;
	tcache *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	if (dnnl_stream_create(&c->stream, eng, dnnl_stream_default_flags) != dnnl_success) {
		free(c);
		return NULL;
	}
	c->threads = atomic_load(&threads);
	omp_set_num_threads(c->threads);
	pthread_once(&tc_key_once, tc_key_init);
	pthread_setspecific(tc_key, c); /* freed when the thread ends */
	tc = c;
	return c;
}

static uint64_t hash_key(const unsigned char *k, size_t n)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (size_t i = 0; i < n; i++)
		h = (h ^ k[i]) * 1099511628211ull;
	return h;
}

hpu__dnnl_prim *hpu__dnnl_get(const void *key, size_t keylen, hpu__dnnl_make make)
{
	tcache *c = get_tc();
	if (!c || keylen == 0 || keylen > HPU__DNNL_MAX_KEY)
		return NULL;
	unsigned h = (unsigned)(hash_key(key, keylen) % CACHE_SLOTS);
	/* open addressing, probes bounded by the table */
	for (unsigned i = 0; i < CACHE_SLOTS; i++) {
		entry *e = &c->e[(h + i) % CACHE_SLOTS];
		if (e->keylen == 0)
			break;
		if (e->keylen == keylen && memcmp(e->key, key, keylen) == 0)
			return e->p.prim ? &e->p : NULL;
	}
	/* a miss: the first free slot on the probe path, or evict one */
	entry *e = NULL;
	for (unsigned i = 0; i < CACHE_SLOTS && !e; i++)
		if (c->e[(h + i) % CACHE_SLOTS].keylen == 0)
			e = &c->e[(h + i) % CACHE_SLOTS];
	if (!e) {
		/* full: start over (a model has far fewer shapes than slots, so
		 * this is rare and keeps probing simple) */
		for (int i = 0; i < CACHE_SLOTS; i++)
			if (c->e[i].keylen) {
				prim_clear(&c->e[i].p);
				c->e[i].keylen = 0;
			}
		e = &c->e[h];
	}
	memcpy(e->key, key, keylen);
	e->keylen = keylen;
	memset(&e->p, 0, sizeof e->p);
	if (make(&e->p, key, get_engine()) < 0 || !e->p.prim) {
		prim_clear(&e->p); /* remembered as unsupported */
		return NULL;
	}
	if (e->p.scratch_bytes && !(e->p.scratch = malloc(e->p.scratch_bytes))) {
		prim_clear(&e->p);
		e->keylen = 0;
		return NULL;
	}
	return &e->p;
}

int hpu__dnnl_arg(hpu__dnnl_prim *p, dnnl_engine_t eng, int arg,
		  const dnnl_memory_desc_t *md)
{
	if (p->nargs >= HPU__DNNL_MAX_ARGS)
		return -1;
	if (dnnl_memory_create(&p->mem[p->nargs], md, eng, DNNL_MEMORY_NONE) != dnnl_success)
		return -1;
	p->arg[p->nargs++] = arg;
	return 0;
}

int hpu__dnnl_run(hpu__dnnl_prim *p, void *const *data)
{
	dnnl_exec_arg_t args[HPU__DNNL_MAX_ARGS];
	for (int i = 0; i < p->nargs; i++) {
		if (dnnl_memory_set_data_handle(p->mem[i], data[i]) != dnnl_success)
			return HPU_BE_UNSUPPORTED;
		args[i].arg = p->arg[i];
		args[i].memory = p->mem[i];
	}
	if (dnnl_primitive_execute(p->prim, tc->stream, p->nargs, args) != dnnl_success ||
	    dnnl_stream_wait(tc->stream) != dnnl_success)
		return HPU_BE_UNSUPPORTED;
	return HPU_BE_OK;
}

void hpu__dnnl_md(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims,
		  dnnl_data_type_t dt)
{
	static const dnnl_format_tag_t tags[] = {dnnl_format_tag_undef, dnnl_a, dnnl_ab,
						 dnnl_abc, dnnl_abcd, dnnl_abcde};
	dnnl_memory_desc_init_by_tag(md, ndims, dims, dt, tags[ndims]);
}

int hpu__dnnl_create(dnnl_primitive_t *prim, dnnl_primitive_desc_t *pd,
		     const_dnnl_op_desc_t desc, const_dnnl_primitive_attr_t attr,
		     dnnl_engine_t eng, const_dnnl_primitive_desc_t hint)
{
	*prim = NULL;
	*pd = NULL;
	if (dnnl_primitive_desc_create(pd, desc, attr, eng, hint) != dnnl_success) {
		*pd = NULL;
		return -1;
	}
	if (dnnl_primitive_create(prim, *pd) != dnnl_success) {
		dnnl_primitive_desc_destroy(*pd);
		*pd = NULL;
		*prim = NULL;
		return -1;
	}
	return 0;
}

/* ---- the ISA ---- */

static const char *isa_name(dnnl_cpu_isa_t isa)
{
	switch (isa) {
	case dnnl_cpu_isa_sse41: return "sse41";
	case dnnl_cpu_isa_avx: return "avx";
	case dnnl_cpu_isa_avx2: return "avx2";
	case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
	case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
	case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
	case dnnl_cpu_isa_avx512_core: return "avx512_core";
	case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
	case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
	case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
	default: return "unknown";
	}
}

static int dnnl_bf16_native(void)
{
	dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
	return isa == dnnl_cpu_isa_avx512_core_bf16 || isa == dnnl_cpu_isa_avx512_core_amx;
}

static const char *dnnl_describe(void)
{
	static char line[200];
	const dnnl_version_t *v = dnnl_version();
	int native = dnnl_bf16_native();
	snprintf(line, sizeof line, "oneDNN %d.%d.%d, ISA %s, bf16 products %s, %d thread%s",
		 v->major, v->minor, v->patch, isa_name(dnnl_get_effective_cpu_isa()),
		 native ? "native" : "emulated (this CPU has no bf16 instructions)",
		 atomic_load(&threads), atomic_load(&threads) == 1 ? "" : "s");
	return line;
}

static void dnnl_set_threads(int n)
{
	atomic_store(&threads, n < 1 ? 1 : n);
}

/* ---- matrix products ---- */

typedef struct gemm_key {
	int op; /* 1 */
	int dt, count, m, n, k, trans_a, trans_b, bias, accumulate;
	int64_t stride_a, stride_b, stride_c; /* 0 when count == 1 */
} gemm_key;

/* The dims and strides of a [rows, cols] matrix stored transposed or not,
 * with a batch dimension in front when count > 1. */
static int mat_md(dnnl_memory_desc_t *md, int count, int rows, int cols, int trans,
		  int64_t batch_stride, dnnl_data_type_t dt)
{
	dnnl_dims_t dims, strides;
	int nd = 0;
	if (count > 1) {
		dims[nd] = count;
		strides[nd++] = batch_stride;
	}
	dims[nd] = rows;
	strides[nd++] = trans ? 1 : cols;
	dims[nd] = cols;
	strides[nd++] = trans ? rows : 1;
	return dnnl_memory_desc_init_by_strides(md, nd, dims, dt, strides) == dnnl_success ? 0
											    : -1;
}

static int make_gemm(hpu__dnnl_prim *p, const void *vkey, dnnl_engine_t eng)
{
	const gemm_key *k = vkey;
	dnnl_data_type_t dt = hpu__dnnl_dt((hpu__dtype)k->dt);
	dnnl_memory_desc_t a, b, bias, c;
	if (mat_md(&a, k->count, k->m, k->k, k->trans_a, k->stride_a, dt) < 0 ||
	    mat_md(&b, k->count, k->k, k->n, k->trans_b, k->stride_b, dt) < 0 ||
	    mat_md(&c, k->count, k->m, k->n, 0, k->stride_c, dnnl_f32) < 0)
		return -1;
	if (k->bias) {
		dnnl_dims_t d = {1, 1, 1};
		d[k->count > 1 ? 2 : 1] = k->n;
		hpu__dnnl_md(&bias, k->count > 1 ? 3 : 2, d, dnnl_f32);
	}
	dnnl_matmul_desc_t desc;
	if (dnnl_matmul_desc_init(&desc, &a, &b, k->bias ? &bias : NULL, &c) != dnnl_success)
		return -1;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	if (k->accumulate) {
		if (dnnl_primitive_attr_create(&attr) != dnnl_success)
			return -1;
		if (dnnl_post_ops_create(&po) != dnnl_success ||
		    dnnl_post_ops_append_sum(po, 1.0f) != dnnl_success ||
		    dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success) {
			if (po)
				dnnl_post_ops_destroy(po);
			dnnl_primitive_attr_destroy(attr);
			return -1;
		}
	}
	dnnl_primitive_desc_t pd;
	int rc = hpu__dnnl_create(&p->prim, &pd, &desc, attr, eng, NULL);
	if (po)
		dnnl_post_ops_destroy(po);
	if (attr)
		dnnl_primitive_attr_destroy(attr);
	if (rc < 0)
		return -1;
	dnnl_primitive_desc_destroy(pd);
	if (hpu__dnnl_arg(p, eng, DNNL_ARG_SRC, &a) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_WEIGHTS, &b) < 0 ||
	    hpu__dnnl_arg(p, eng, DNNL_ARG_DST, &c) < 0 ||
	    (k->bias && hpu__dnnl_arg(p, eng, DNNL_ARG_BIAS, &bias) < 0))
		return -1;
	return 0;
}

static int be_gemm(const hpu__gemm *g)
{
	if (g->count <= 0 || g->m <= 0 || g->n <= 0)
		return HPU_BE_OK; /* nothing to write */
	if (g->k <= 0) { /* an empty sum: c = bias or 0, or c unchanged */
		if (g->accumulate)
			return HPU_BE_OK;
		for (int i = 0; i < g->count; i++)
			for (int r = 0; r < g->m; r++) {
				float *row = g->c + (size_t)i * g->stride_c + (size_t)r * g->n;
				for (int j = 0; j < g->n; j++)
					row[j] = g->bias ? g->bias[j] : 0.0f;
			}
		return HPU_BE_OK;
	}
	if (g->dt == HPU_DT_BF16 && !dnnl_bf16_native())
		return HPU_BE_UNSUPPORTED;
	gemm_key k;
	memset(&k, 0, sizeof k);
	k.op = 1;
	k.dt = g->dt;
	k.count = g->count;
	k.m = g->m;
	k.n = g->n;
	k.k = g->k;
	k.trans_a = !!g->trans_a;
	k.trans_b = !!g->trans_b;
	k.bias = g->bias != NULL;
	k.accumulate = !!g->accumulate;
	if (g->count > 1) {
		k.stride_a = (int64_t)g->stride_a;
		k.stride_b = (int64_t)g->stride_b;
		k.stride_c = (int64_t)g->stride_c;
	}
	hpu__dnnl_prim *p = hpu__dnnl_get(&k, sizeof k, make_gemm);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	void *data[4] = {(void *)g->a, (void *)g->b, g->c, (void *)g->bias};
	return hpu__dnnl_run(p, data);
}

/* ---- the table ---- */

/* Eltwise: oneDNN's where it is faster than the reference loops, measured
 * single-threaded here (avx512_core_bf16; backward at ~25 GB/s against
 * the loops' ~80): forward of tanh (0.02x the time of the loop's scalar
 * tanhf) and ReLU (0.94x). Backward of ReLU and tanh takes 2.4-3.6x the
 * loops' time, GELU 1.3-2x in both directions (and its 0.5 x (1 + tanh)
 * form loses relative accuracy for x < -3): those answer unsupported, so
 * the ops run the reference. hpu__dnnl_eltwise_fwd/bwd do every op. */
static int pick_eltwise_fwd(hpu__eltwise op, const float *x, float *y, size_t n)
{
	if (op == HPU_ELT_GELU_TANH)
		return HPU_BE_UNSUPPORTED;
	return hpu__dnnl_eltwise_fwd(op, x, y, n);
}

/* Pooling: the reference loops measured 2-3x faster than oneDNN's NCHW
 * pooling on the CNN's 2x2 windows (backend_dnnl_conv.c has the figures);
 * max pooling's idx (the arg-max position) is not oneDNN's workspace. */
static int no_maxpool_fwd(const float *x, float *y, int32_t *idx, int batch, int ch, int h,
			  int w, int k, int stride)
{
	(void)x, (void)y, (void)idx, (void)batch, (void)ch, (void)h, (void)w, (void)k,
		(void)stride;
	return HPU_BE_UNSUPPORTED;
}

static int no_maxpool_bwd(const float *dy, const int32_t *idx, float *dx, int batch, int ch,
			  int h, int w, int k, int stride)
{
	(void)dy, (void)idx, (void)dx, (void)batch, (void)ch, (void)h, (void)w, (void)k,
		(void)stride;
	return HPU_BE_UNSUPPORTED;
}

static int no_avgpool(const float *in, float *out, int batch, int ch, int h, int w, int k,
		      int stride)
{
	(void)in, (void)out, (void)batch, (void)ch, (void)h, (void)w, (void)k, (void)stride;
	return HPU_BE_UNSUPPORTED;
}

static int pick_eltwise_bwd(hpu__eltwise op, const float *at, const float *dy, float *dx,
			    size_t n)
{
	(void)op, (void)at, (void)dy, (void)dx, (void)n;
	return HPU_BE_UNSUPPORTED;
}

static const hpu__backend dnnl_backend = {
	.name = "oneDNN",
	.describe = dnnl_describe,
	.bf16_native = dnnl_bf16_native,
	.set_threads = dnnl_set_threads,
	.gemm = be_gemm,
	.conv_fwd = hpu__dnnl_conv_fwd,
	.conv_bwd_data = hpu__dnnl_conv_bwd_data,
	.conv_bwd_weights = hpu__dnnl_conv_bwd_weights,
	.maxpool_fwd = no_maxpool_fwd,
	.maxpool_bwd = no_maxpool_bwd,
	.avgpool_fwd = no_avgpool,
	.avgpool_bwd = no_avgpool,
	.eltwise_fwd = pick_eltwise_fwd,
	.eltwise_bwd = pick_eltwise_bwd,
	.softmax_fwd = hpu__dnnl_softmax_fwd,
	.softmax_bwd = hpu__dnnl_softmax_bwd,
	.layernorm_fwd = hpu__dnnl_layernorm_fwd,
	.layernorm_bwd = hpu__dnnl_layernorm_bwd,
};

const hpu__backend *hpu__dnnl_backend(void)
{
	return &dnnl_backend;
}
