/* backend_dnnl: what the oneDNN backend's files share. backend_dnnl_core.c
 * is their base: the engine, the primitive cache, the thread count, the
 * ISA. The kernels stand on it: backend_dnnl_gemm.c (matrix products),
 * backend_dnnl_conv.c (convolution, pooling), backend_dnnl_nn.c (eltwise,
 * softmax, layer norm). The table (backend_dnnl.c) stands above them all;
 * none of them calls it.
 *
 * A primitive is made once per key (the op and its shape, types and
 * flags) and kept in a small per-thread cache together with one memory
 * object per argument; each call only points those at its data and runs
 * it on the thread's stream.
 */
#ifndef HPU_BACKEND_DNNL_H
#define HPU_BACKEND_DNNL_H

#include <stddef.h>

#include <oneapi/dnnl/dnnl.h>

#include "worker/ops/backend.h"

#define HPU__DNNL_MAX_ARGS 10
#define HPU__DNNL_MAX_KEY 128 /* bytes */

typedef struct hpu__dnnl_prim {
	dnnl_primitive_t prim; /* NULL: the case is unsupported (cached too) */
	int nargs;
	int arg[HPU__DNNL_MAX_ARGS];            /* DNNL_ARG_* */
	dnnl_memory_t mem[HPU__DNNL_MAX_ARGS]; /* data handles set per call */
	size_t scratch_bytes; /* a buffer the op's code may use (e.g. dw before
			       * accumulation), allocated with the entry */
	void *scratch;
} hpu__dnnl_prim;

/* Fills p (its primitive and arguments, with hpu__dnnl_arg) for the case
 * `key` describes; returns 0, or -1 when oneDNN cannot do it. */
typedef int (*hpu__dnnl_make)(hpu__dnnl_prim *p, const void *key, dnnl_engine_t eng);

/* The cached primitive for key (keylen <= HPU__DNNL_MAX_KEY bytes, fully
 * initialized: memset padding to 0; its first int should name the op so
 * that the ops' keys never collide), made by make() on first use. NULL
 * when make() failed for this key (remembered: not tried again). */
hpu__dnnl_prim *hpu__dnnl_get(const void *key, size_t keylen, hpu__dnnl_make make);

/* Adds argument `arg` with layout md (a memory object without data). */
int hpu__dnnl_arg(hpu__dnnl_prim *p, dnnl_engine_t eng, int arg,
		  const dnnl_memory_desc_t *md);

/* Runs p with data[i] the pointer of its i-th argument (in the order they
 * were added); returns HPU_BE_OK, or HPU_BE_UNSUPPORTED when oneDNN
 * fails. */
int hpu__dnnl_run(hpu__dnnl_prim *p, void *const *data);

/* A dense row-major memory descriptor of ndims dims (strides from the
 * layout) in dtype dt. */
void hpu__dnnl_md(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims,
		  dnnl_data_type_t dt);

/* Makes a primitive from an op descriptor (with attr, may be NULL) into
 * *prim and its descriptor into *pd; 0, or -1 when unimplemented. The
 * caller destroys pd. */
int hpu__dnnl_create(dnnl_primitive_t *prim, dnnl_primitive_desc_t *pd,
		     const_dnnl_op_desc_t desc, const_dnnl_primitive_attr_t attr,
		     dnnl_engine_t eng, const_dnnl_primitive_desc_t hint);

static inline dnnl_data_type_t hpu__dnnl_dt(hpu__dtype dt)
{
	return dt == HPU_DT_BF16 ? dnnl_bf16 : dnnl_f32;
}

/* Whether this CPU multiplies bf16 natively (else bf16 products are left
 * to the reference); the backend's line for the log; the OpenMP thread
 * count of every calling thread from its next call on
 * (backend_dnnl_core.c). */
int hpu__dnnl_bf16_native(void);
const char *hpu__dnnl_describe(void);
void hpu__dnnl_set_threads(int n);

/* The table (backend_dnnl.c). */
const hpu__backend *hpu__dnnl_backend(void);

/* The kernels the table names (backend_dnnl_gemm.c, backend_dnnl_conv.c,
 * backend_dnnl_nn.c). */
int hpu__dnnl_gemm(const hpu__gemm *g);
int hpu__dnnl_conv_fwd(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
		       const void *w, const float *b, float *y);
int hpu__dnnl_conv_bwd_data(const hpu_conv2d_shape *s, hpu__dtype dt, const void *w,
			    const void *dy, float *dx);
int hpu__dnnl_conv_bwd_weights(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
			       const void *dy, float *dw, float *db);
int hpu__dnnl_conv_bwd(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
		       const void *w, const void *dy, float *dx, float *dw, float *db,
		       int *weights_done);
/* Calls of hpu__dnnl_conv_bwd whose backward data read the dy backward
 * weights had reordered (tests). */
extern unsigned long hpu__dnnl_conv_dy_shared;
int hpu__dnnl_avgpool_fwd(const float *x, float *y, int batch, int ch, int h, int w,
			  int k, int stride);
int hpu__dnnl_avgpool_bwd(const float *dy, float *dx, int batch, int ch, int h, int w,
			  int k, int stride);
int hpu__dnnl_eltwise_fwd(hpu__eltwise op, const float *x, float *y, size_t n);
int hpu__dnnl_eltwise_bwd(hpu__eltwise op, const float *at, const float *dy, float *dx,
			  size_t n);
int hpu__dnnl_softmax_fwd(const float *x, float *y, int rows, int cols);
int hpu__dnnl_softmax_bwd(const float *y, const float *dy, float *dx, int rows, int cols);
int hpu__dnnl_layernorm_fwd(const float *x, const float *gamma, const float *beta,
			    float *y, float *mean, float *rstd, int rows, int cols,
			    float eps);
int hpu__dnnl_layernorm_bwd(const float *x, const float *gamma, const float *mean,
			    const float *rstd, const float *dy, float *dx, float *dgamma,
			    float *dbeta, int rows, int cols);

#endif
