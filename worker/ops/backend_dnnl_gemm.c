/* backend_dnnl_gemm: the oneDNN backend's matrix products (matmul
 * primitives through the cache of backend_dnnl_core.c). */
#include <stdint.h>
#include <string.h>

#include "worker/ops/backend_dnnl.h"

/* ---- matrix products ---- */

typedef struct gemm_key {
	int op; /* 1 */
	int dt, count, m, n, k, trans_a, trans_b, bias, accumulate;
	int c16; /* c in bf16 */
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
	    mat_md(&c, k->count, k->m, k->n, 0, k->stride_c, k->c16 ? dnnl_bf16 : dnnl_f32) < 0)
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

/* c16 = the bf16 of an empty sum: zeros */
static int gemm_empty16(const hpu__gemm *g)
{
	for (int i = 0; i < g->count; i++)
		memset(g->c16 + (size_t)i * g->stride_c, 0, (size_t)g->m * g->n * 2);
	return HPU_BE_OK;
}

int hpu__dnnl_gemm(const hpu__gemm *g)
{
	if (g->c16 && (g->dt != HPU_DT_BF16 || g->bias || g->accumulate))
		return HPU_BE_UNSUPPORTED; /* not promised (backend.h) */
	if (g->count <= 0 || g->m <= 0 || g->n <= 0)
		return HPU_BE_OK; /* nothing to write */
	if (g->k <= 0 && g->c16)
		return gemm_empty16(g);
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
	if (g->dt == HPU_DT_BF16 && !hpu__dnnl_bf16_native())
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
	k.c16 = g->c16 != NULL;
	if (g->count > 1) {
		k.stride_a = (int64_t)g->stride_a;
		k.stride_b = (int64_t)g->stride_b;
		k.stride_c = (int64_t)g->stride_c;
	}
	hpu__dnnl_prim *p = hpu__dnnl_get(&k, sizeof k, make_gemm);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	void *c = g->c16 ? (void *)g->c16 : (void *)g->c;
	void *data[4] = {(void *)g->a, (void *)g->b, c, (void *)g->bias};
	return hpu__dnnl_run(p, data);
}
