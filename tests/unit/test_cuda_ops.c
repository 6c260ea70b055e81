/* Unit tests for the CUDA device's kernel table (worker/cuda/ops/,
 * hpu__cuda_backend) against the CPU's reference kernels (ops_ref.h and
 * the plain C loops of the ops), at awkward shapes: odd sizes, batch 1,
 * every transpose, padded batch strides, bias, accumulation, strided, 1x1
 * and padded convolutions, overlapping pooling windows.
 *
 * Inputs are made on the host, copied to the GPU, run through the table
 * on a stream of our own (hpu__cuda_ops_set_stream), and copied back.
 * fp32 agrees within 1e-5 relative (measured against a tenth of the
 * array's largest value, as test_backend_gemm does); bf16 inputs are
 * rounded first and the reference runs on the rounded values, so bf16
 * products (exact in fp32) agree within the same 1e-5 up to summation
 * order. Pooling, dropout (masks and values) and embedding agree bit for
 * bit. Without a visible GPU the program says why and exits 77 (ctest:
 * skipped).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "tests/unit/cuda_testlib.h"
#include "tests/unit/num_testlib.h"

#include "worker/cuda/cuda_ops.h"
#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"
#include "worker/ops/fp8.h"
#include "worker/ops/ops_ref.h"
#include "common/lowp.h"

#include "hpu/ops.h"

int hpu_cuda_layer_tests(const hpu__backend *gpu_, cudaStream_t stream_); /* test_cuda_layers.c */

static const hpu__backend *gpu;
static cudaStream_t stream;

/* a[n] rounded to bf16: the values (fp32) and their bf16 form. */
static void round_bf16(float *a, uint16_t *a16, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		a16[i] = hpu_to_bf16(a[i]);
		a[i] = hpu_from_bf16(a16[i]);
	}
}

/* ---- products ---- */

typedef struct gemm_case {
	int count, m, n, k, ta, tb, bias, acc;
	int pad; /* extra elements between a batch's matrices */
} gemm_case;

static void gemm_one(const gemm_case *t, hpu__dtype dt)
{
	size_t na = (size_t)t->m * t->k, nb = (size_t)t->k * t->n, nc = (size_t)t->m * t->n;
	size_t sa = na + t->pad, sb = nb + t->pad, sc = nc + t->pad;
	size_t ta = (size_t)t->count * sa, tb = (size_t)t->count * sb, tc = (size_t)t->count * sc;
	float *a = xcalloc(ta, 4), *b = xcalloc(tb, 4), *c0 = xcalloc(tc, 4);
	float *want = xcalloc(tc, 4), *got = xcalloc(tc, 4), *bias = xcalloc(t->n + 1, 4);
	uint16_t *a16 = xcalloc(ta, 2), *b16 = xcalloc(tb, 2);
	fill(a, ta, -1, 1);
	fill(b, tb, -1, 1);
	fill(c0, tc, -1, 1);
	fill(bias, (size_t)t->n, -1, 1);
	if (dt == HPU_DT_BF16) {
		round_bf16(a, a16, ta);
		round_bf16(b, b16, tb);
	}
	memcpy(want, c0, tc * 4);
	for (int p = 0; p < t->count; p++) {
		float *wp = want + p * sc;
		hpu__ref_matmul(a + p * sa, b + p * sb, wp, t->m, t->n, t->k, t->ta, t->tb, t->acc);
		for (int r = 0; t->bias && r < t->m; r++)
			for (int j = 0; j < t->n; j++)
				wp[(size_t)r * t->n + j] += bias[j];
	}
	size_t es = dt == HPU_DT_BF16 ? 2 : 4;
	void *da = dput(dt == HPU_DT_BF16 ? (void *)a16 : a, ta * es);
	void *db = dput(dt == HPU_DT_BF16 ? (void *)b16 : b, tb * es);
	float *dc = dput(c0, tc * 4), *dbias = dput(bias, (size_t)t->n * 4);
	hpu__gemm g = {.dt = dt, .count = t->count, .m = t->m, .n = t->n, .k = t->k,
		       .trans_a = t->ta, .trans_b = t->tb, .a = da, .b = db,
		       .bias = t->bias ? dbias : NULL, .c = dc, .stride_a = sa, .stride_b = sb,
		       .stride_c = sc, .accumulate = t->acc};
	assert_int_equal(gpu->gemm(&g), HPU_BE_OK);
	dget(got, dc, tc * 4);
	/* the padding between products is left alone */
	for (int p = 0; p < t->count; p++)
		for (int i = 0; i < t->pad; i++)
			assert_true(got[p * sc + nc + i] == c0[p * sc + nc + i]);
	char what[96];
	snprintf(what, sizeof what, "gemm %s %dx[%d,%d,%d] t%d%d%s%s", dt ? "bf16" : "f32",
		 t->count, t->m, t->n, t->k, t->ta, t->tb, t->bias ? " bias" : "",
		 t->acc ? " acc" : "");
	check(what, got, want, tc, 1e-5);
	dfree(da), dfree(db), dfree(dc), dfree(dbias);
	free(a), free(b), free(c0), free(want), free(got), free(bias), free(a16), free(b16);
}

static void test_gemm(void **state)
{
	(void)state;
	static const int shapes[][3] = {{1, 1, 1},   {7, 5, 3},   {33, 17, 65}, {1, 300, 7},
					{64, 1, 129}, {128, 96, 256}, {5, 8, 0}};
	rng_seed(1);
	for (int dt = 0; dt < 2; dt++)
		for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
			for (int tr = 0; tr < 4; tr++)
				for (int mode = 0; mode < 3; mode++) {
					/* mode 0 plain, 1 bias, 2 accumulate */
					gemm_case t = {1, shapes[s][0], shapes[s][1], shapes[s][2],
						       tr & 1, tr >> 1, mode == 1, mode == 2, 0};
					gemm_one(&t, (hpu__dtype)dt);
					t.count = 3; /* a padded batch */
					t.pad = 3;
					gemm_one(&t, (hpu__dtype)dt);
				}
}

/* Label and id checks, and the accuracy count, through the public ops
 * with the CUDA table in force: a bad id is refused (nothing written), as
 * on the CPU; ties go to the first maximum. */
static void test_checks(void **state)
{
	(void)state;
	const int batch = 67, classes = 13, dim = 5;
	rng_seed(14);
	float *z = xcalloc((size_t)batch * classes, 4), *d = xcalloc((size_t)batch * classes, 4);
	int32_t *lab = xcalloc(batch, 4);
	for (size_t i = 0; i < (size_t)batch * classes; i++) /* ties */
		z[i] = (float)(int)rng_uniform(0, 4);
	for (int i = 0; i < batch; i++)
		lab[i] = (int32_t)rng_uniform(0, classes) % classes;
	hpu__be_set(hpu__be_reference());
	int want = hpu_accuracy_forward(z, lab, batch, classes);
	float want_loss = hpu_cross_entropy_forward(z, lab, d, batch, classes);
	hpu__be_set(NULL);
	float *dz = dput(z, (size_t)batch * classes * 4), *dd = dnan((size_t)batch * classes * 4);
	int32_t *dlab = dput(lab, (size_t)batch * 4);
	int got = -1, ok = -1;
	assert_int_equal(gpu->count_correct(dz, dlab, batch, classes, &got), HPU_BE_OK);
	printf("  count_correct (ties): %d, the CPU's %d\n", got, want);
	assert_int_equal(got, want);
	hpu__be_set(gpu);
	assert_int_equal(hpu_accuracy_forward(dz, dlab, batch, classes), want);
	float loss = hpu_cross_entropy_forward(dz, dlab, dd, batch, classes);
	check("hpu_softmax_xent on the GPU: loss", &loss, &want_loss, 1, 1e-5);
	/* a label out of range: refused, as the CPU refuses it */
	int32_t bad = classes;
	assert_int_equal(cudaMemcpy(dlab + batch - 1, &bad, 4, cudaMemcpyHostToDevice), cudaSuccess);
	assert_true(hpu_cross_entropy_forward(dz, dlab, dd, batch, classes) < 0.0f);
	hpu__be_set(NULL);
	assert_int_equal(gpu->ids_in_range(dlab, batch, classes, &ok), HPU_BE_OK);
	assert_int_equal(ok, 0);
	assert_int_equal(gpu->ids_in_range(dlab, batch - 1, classes, &ok), HPU_BE_OK);
	assert_int_equal(ok, 1);
	bad = -1;
	assert_int_equal(cudaMemcpy(dlab, &bad, 4, cudaMemcpyHostToDevice), cudaSuccess);
	assert_int_equal(gpu->ids_in_range(dlab + 1, batch - 2, classes, &ok), HPU_BE_OK);
	assert_int_equal(ok, 1);
	assert_int_equal(gpu->ids_in_range(dlab, batch - 1, classes, &ok), HPU_BE_OK);
	assert_int_equal(ok, 0);
	assert_int_equal(gpu->ids_in_range(dlab, 0, classes, &ok), HPU_BE_OK);
	assert_int_equal(ok, 1);
	/* the embedding refuses the bad id and writes nothing */
	float *table = xcalloc((size_t)classes * dim, 4), *y = xcalloc((size_t)batch * dim, 4);
	fill(table, (size_t)classes * dim, -1, 1);
	float *dtab = dput(table, (size_t)classes * dim * 4), *dy = dnan((size_t)batch * dim * 4);
	hpu__be_set(gpu);
	assert_int_equal(hpu_embedding_forward(dtab, dlab, dy, batch, classes, dim), HPU_ERANGE);
	hpu__be_set(NULL);
	dget(y, dy, (size_t)batch * dim * 4);
	for (size_t i = 0; i < (size_t)batch * dim; i++)
		assert_true(isnan(y[i]));
	printf("  ids_in_range, and the ops' refusals on the GPU: as on the CPU\n");
	dfree(dz), dfree(dd), dfree(dlab), dfree(dtab), dfree(dy);
	free(z), free(d), free(lab), free(table), free(y);
}

/* After a release the contexts (handles, plans) are made again. */
static void test_release(void **state)
{
	(void)state;
	gemm_case t = {2, 9, 11, 13, 0, 1, 1, 0, 1};
	rng_seed(12);
	gemm_one(&t, HPU_DT_F32);
	hpu__cuda_ops_release();
	gemm_one(&t, HPU_DT_F32);
	gemm_one(&t, HPU_DT_BF16);
}

/* ---- convolutions ---- */

static const hpu_conv2d_shape conv_shapes[] = {
	{1, 3, 7, 7, 4, 3, 1, 1},  /* batch 1, padded */
	{2, 5, 9, 6, 3, 3, 2, 0},  /* strided, not square */
	{3, 8, 5, 5, 6, 1, 1, 0},  /* 1x1 */
	{2, 4, 7, 7, 5, 1, 2, 0},  /* strided 1x1 */
	{2, 4, 8, 8, 5, 5, 3, 2},  /* large kernel, stride 3, padding 2 */
	{1, 1, 4, 4, 1, 4, 1, 0},  /* one output pixel */
	{4, 16, 12, 12, 32, 3, 1, 1},
};

static void conv_one(const hpu_conv2d_shape *s, hpu__dtype dt)
{
	int oh = hpu_conv2d_out_h(s), ow = hpu_conv2d_out_w(s);
	size_t nx = (size_t)s->batch * s->in_ch * s->height * s->width;
	size_t nw = (size_t)s->out_ch * s->in_ch * s->kernel * s->kernel;
	size_t ny = (size_t)s->batch * s->out_ch * oh * ow, no = (size_t)s->out_ch;
	float *x = xcalloc(nx, 4), *w = xcalloc(nw, 4), *b = xcalloc(no, 4);
	float *dy = xcalloc(ny, 4), *dw0 = xcalloc(nw, 4), *db0 = xcalloc(no, 4);
	float *y = xcalloc(ny, 4), *dx = xcalloc(nx, 4), *dw = xcalloc(nw, 4);
	float *db = xcalloc(no, 4), *got = xcalloc(nx + nw + ny + no, 4);
	float *scratch = xcalloc(hpu_conv2d_scratch(s), 4);
	uint16_t *x16 = xcalloc(nx, 2), *w16 = xcalloc(nw, 2), *dy16 = xcalloc(ny, 2);
	fill(x, nx, -1, 1), fill(w, nw, -1, 1), fill(b, no, -1, 1), fill(dy, ny, -1, 1);
	fill(dw0, nw, -1, 1), fill(db0, no, -1, 1);
	if (dt == HPU_DT_BF16)
		round_bf16(x, x16, nx), round_bf16(w, w16, nw), round_bf16(dy, dy16, ny);
	memcpy(dw, dw0, nw * 4);
	memcpy(db, db0, no * 4);
	hpu__ref_conv2d_forward(s, x, w, b, y, scratch);
	hpu__ref_conv2d_backward(s, x, w, dy, dx, dw, db, scratch);

	size_t es = dt == HPU_DT_BF16 ? 2 : 4;
	int bf = dt == HPU_DT_BF16;
	void *dx_in = dput(bf ? (void *)x16 : x, nx * es), *dw_in = dput(bf ? (void *)w16 : w, nw * es);
	void *ddy = dput(bf ? (void *)dy16 : dy, ny * es);
	float *db_in = dput(b, no * 4), *dy_out = dnan(ny * 4), *ddx = dnan(nx * 4);
	float *ddw = dput(dw0, nw * 4), *ddb = dput(db0, no * 4);
	char what[128];
	snprintf(what, sizeof what, "conv %s B%d C%d %dx%d O%d K%d S%d P%d", bf ? "bf16" : "f32",
		 s->batch, s->in_ch, s->height, s->width, s->out_ch, s->kernel, s->stride, s->pad);
	char line[160];

	assert_int_equal(gpu->conv_fwd(s, dt, dx_in, dw_in, db_in, dy_out), HPU_BE_OK);
	dget(got, dy_out, ny * 4);
	snprintf(line, sizeof line, "%s fwd", what);
	check(line, got, y, ny, 1e-5);
	/* without a bias */
	hpu__ref_conv2d_forward(s, x, w, NULL, y, scratch);
	assert_int_equal(gpu->conv_fwd(s, dt, dx_in, dw_in, NULL, dy_out), HPU_BE_OK);
	dget(got, dy_out, ny * 4);
	snprintf(line, sizeof line, "%s fwd, no bias", what);
	check(line, got, y, ny, 1e-5);

	assert_int_equal(gpu->conv_bwd_data(s, dt, dw_in, ddy, ddx), HPU_BE_OK);
	dget(got, ddx, nx * 4);
	snprintf(line, sizeof line, "%s bwd data", what);
	check(line, got, dx, nx, 1e-5);

	assert_int_equal(gpu->conv_bwd_weights(s, dt, dx_in, ddy, ddw, ddb), HPU_BE_OK);
	dget(got, ddw, nw * 4);
	snprintf(line, sizeof line, "%s bwd weights (dw +=)", what);
	check(line, got, dw, nw, 1e-5);
	dget(got, ddb, no * 4);
	snprintf(line, sizeof line, "%s bwd bias (db +=)", what);
	check(line, got, db, no, 1e-5);

	dfree(dx_in), dfree(dw_in), dfree(ddy), dfree(db_in), dfree(dy_out), dfree(ddx);
	dfree(ddw), dfree(ddb);
	free(x), free(w), free(b), free(dy), free(dw0), free(db0), free(y), free(dx), free(dw);
	free(db), free(got), free(scratch), free(x16), free(w16), free(dy16);
}

static void test_conv(void **state)
{
	(void)state;
	rng_seed(2);
	for (int dt = 0; dt < 2; dt++)
		for (size_t i = 0; i < sizeof conv_shapes / sizeof conv_shapes[0]; i++)
			conv_one(&conv_shapes[i], (hpu__dtype)dt);
}

/* ---- pooling: bit for bit, ties included ---- */

static void pool_one(int batch, int ch, int h, int w, int k, int stride)
{
	int oh = (h - k) / stride + 1, ow = (w - k) / stride + 1;
	size_t nx = (size_t)batch * ch * h * w, ny = (size_t)batch * ch * oh * ow;
	float *x = xcalloc(nx, 4), *dy = xcalloc(ny, 4), *y = xcalloc(ny, 4);
	float *dx = xcalloc(nx, 4), *got = xcalloc(nx + ny, 4);
	int32_t *idx = xcalloc(ny, 4), *gidx = xcalloc(ny, 4);
	for (size_t i = 0; i < nx; i++) /* few distinct values: many ties */
		x[i] = (float)(int)rng_uniform(-3, 3);
	fill(dy, ny, -1, 1);
	float *dxx = dput(x, nx * 4), *ddy = dput(dy, ny * 4), *dyo = dnan(ny * 4);
	float *ddx = dnan(nx * 4);
	int32_t *didx = dnan(ny * 4);
	char what[96];
	snprintf(what, sizeof what, "pool B%d C%d %dx%d k%d s%d", batch, ch, h, w, k, stride);
	char line[128];

	hpu__ref_maxpool2d_forward(x, y, idx, batch, ch, h, w, k, stride);
	assert_int_equal(gpu->maxpool_fwd(dxx, dyo, didx, batch, ch, h, w, k, stride), HPU_BE_OK);
	dget(got, dyo, ny * 4);
	dget(gidx, didx, ny * 4);
	snprintf(line, sizeof line, "max %s fwd", what);
	check_bits(line, got, y, ny * 4);
	snprintf(line, sizeof line, "max %s idx", what);
	check_bits(line, gidx, idx, ny * 4);
	hpu__ref_maxpool2d_backward(dy, idx, dx, batch, ch, h, w, k, stride);
	assert_int_equal(gpu->maxpool_bwd(ddy, didx, ddx, batch, ch, h, w, k, stride), HPU_BE_OK);
	dget(got, ddx, nx * 4);
	snprintf(line, sizeof line, "max %s bwd", what);
	check_bits(line, got, dx, nx * 4);

	fill(x, nx, -1, 1);
	assert_int_equal(cudaMemcpy(dxx, x, nx * 4, cudaMemcpyHostToDevice), cudaSuccess);
	hpu__ref_avgpool2d_forward(x, y, batch, ch, h, w, k, stride);
	assert_int_equal(gpu->avgpool_fwd(dxx, dyo, batch, ch, h, w, k, stride), HPU_BE_OK);
	dget(got, dyo, ny * 4);
	snprintf(line, sizeof line, "avg %s fwd", what);
	check_bits(line, got, y, ny * 4);
	hpu__ref_avgpool2d_backward(dy, dx, batch, ch, h, w, k, stride);
	assert_int_equal(gpu->avgpool_bwd(ddy, ddx, batch, ch, h, w, k, stride), HPU_BE_OK);
	dget(got, ddx, nx * 4);
	snprintf(line, sizeof line, "avg %s bwd", what);
	check_bits(line, got, dx, nx * 4);

	dfree(dxx), dfree(ddy), dfree(dyo), dfree(ddx), dfree(didx);
	free(x), free(dy), free(y), free(dx), free(got), free(idx), free(gidx);
}

static void test_pool(void **state)
{
	(void)state;
	rng_seed(3);
	pool_one(2, 3, 7, 9, 2, 2); /* odd sizes: the last row and column unused */
	pool_one(1, 1, 5, 5, 3, 1); /* overlapping windows */
	pool_one(2, 2, 6, 7, 3, 2); /* overlapping, strided */
	pool_one(1, 4, 4, 4, 4, 4); /* one window */
	pool_one(3, 5, 28, 28, 2, 2);
}

/* ---- eltwise ---- */

static void test_eltwise(void **state)
{
	(void)state;
	static const size_t sizes[] = {1, 7, 1000, 100003};
	static const char *names[] = {"relu", "gelu_tanh", "tanh"};
	rng_seed(4);
	for (size_t s = 0; s < 4; s++) {
		size_t n = sizes[s];
		float *x = xcalloc(n, 4), *dy = xcalloc(n, 4), *y = xcalloc(n, 4);
		float *dx = xcalloc(n, 4), *got = xcalloc(n, 4);
		fill(x, n, -6, 6);
		fill(dy, n, -1, 1);
		float *dxx = dput(x, n * 4), *ddy = dput(dy, n * 4), *dyo = dnan(n * 4);
		float *ddx = dnan(n * 4), *dat = dnan(n * 4);
		for (int op = 0; op < 3; op++) {
			char line[96];
			if (op == 0)
				hpu__ref_relu_forward(x, y, n);
			else if (op == 1)
				hpu__ref_gelu_forward(x, y, n);
			else
				hpu__ref_tanh_forward(x, y, n);
			assert_int_equal(gpu->eltwise_fwd((hpu__eltwise)op, dxx, dyo, n), HPU_BE_OK);
			dget(got, dyo, n * 4);
			snprintf(line, sizeof line, "%s fwd n=%zu", names[op], n);
			check(line, got, y, n, 1e-5);
			/* backward at x for GELU, at y for relu and tanh */
			const float *at = op == 1 ? x : y;
			assert_int_equal(cudaMemcpy(dat, at, n * 4, cudaMemcpyHostToDevice),
					 cudaSuccess);
			if (op == 0)
				hpu__ref_relu_backward(at, dy, dx, n);
			else if (op == 1)
				hpu__ref_gelu_backward(at, dy, dx, n);
			else
				hpu__ref_tanh_backward(at, dy, dx, n);
			assert_int_equal(gpu->eltwise_bwd((hpu__eltwise)op, dat, ddy, ddx, n),
					 HPU_BE_OK);
			dget(got, ddx, n * 4);
			snprintf(line, sizeof line, "%s bwd n=%zu", names[op], n);
			check(line, got, dx, n, 1e-5);
		}
		dfree(dxx), dfree(ddy), dfree(dyo), dfree(ddx), dfree(dat);
		free(x), free(dy), free(y), free(dx), free(got);
	}
}

/* ---- softmax and layer norm ---- */

static void test_softmax(void **state)
{
	(void)state;
	static const int shapes[][2] = {{1, 1}, {7, 5}, {33, 1000}, {3, 3001}, {1, 50304}};
	rng_seed(5);
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int rows = shapes[s][0], cols = shapes[s][1];
		size_t n = (size_t)rows * cols;
		float *x = xcalloc(n, 4), *y = xcalloc(n, 4), *dy = xcalloc(n, 4);
		float *dx = xcalloc(n, 4), *got = xcalloc(n, 4);
		fill(x, n, -8, 8);
		fill(dy, n, -1, 1);
		hpu__ref_softmax_forward(x, y, rows, cols);
		hpu__ref_softmax_backward(y, dy, dx, rows, cols);
		/* the forward's truth in double: the reference sums its floats
		 * in a row's order, 4.9e-5 off at 50304 columns */
		float *yd = xcalloc(n, 4);
		for (int r = 0; r < rows; r++) {
			const float *xr = x + (size_t)r * cols;
			double m = xr[0], sum = 0;
			for (int c = 1; c < cols; c++)
				m = fmax(m, xr[c]);
			for (int c = 0; c < cols; c++)
				sum += exp((double)xr[c] - m);
			for (int c = 0; c < cols; c++)
				yd[(size_t)r * cols + c] = (float)(exp((double)xr[c] - m) / sum);
		}
		float *dxx = dput(x, n * 4), *dyo = dnan(n * 4), *ddy = dput(dy, n * 4);
		float *ddx = dnan(n * 4);
		char line[96];
		assert_int_equal(gpu->softmax_fwd(dxx, dyo, rows, cols), HPU_BE_OK);
		dget(got, dyo, n * 4);
		snprintf(line, sizeof line, "softmax fwd [%d,%d] (against double)", rows, cols);
		check(line, got, yd, n, 1e-5);
		snprintf(line, sizeof line, "softmax fwd [%d,%d] (the reference kernel)", rows, cols);
		check(line, got, y, n, cols > 10000 ? 1e-4 : 1e-5);
		free(yd);
		/* backward from the reference's y, into dx and in place (dx = dy) */
		assert_int_equal(cudaMemcpy(dyo, y, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
		assert_int_equal(gpu->softmax_bwd(dyo, ddy, ddx, rows, cols), HPU_BE_OK);
		dget(got, ddx, n * 4);
		snprintf(line, sizeof line, "softmax bwd [%d,%d]", rows, cols);
		check(line, got, dx, n, 1e-5);
		assert_int_equal(gpu->softmax_bwd(dyo, ddy, ddy, rows, cols), HPU_BE_OK);
		dget(got, ddy, n * 4);
		snprintf(line, sizeof line, "softmax bwd in place [%d,%d]", rows, cols);
		check(line, got, dx, n, 1e-5);
		dfree(dxx), dfree(dyo), dfree(ddy), dfree(ddx);
		free(x), free(y), free(dy), free(dx), free(got);
	}
}

static void test_layernorm(void **state)
{
	(void)state;
	static const int shapes[][2] = {{1, 1}, {5, 7}, {70, 768}, {3, 1025}, {257, 64}};
	rng_seed(6);
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int rows = shapes[s][0], cols = shapes[s][1];
		size_t n = (size_t)rows * cols, r = (size_t)rows, c = (size_t)cols;
		float *x = xcalloc(n, 4), *g = xcalloc(c, 4), *be = xcalloc(c, 4);
		float *y = xcalloc(n, 4), *mean = xcalloc(r, 4), *rstd = xcalloc(r, 4);
		float *dy = xcalloc(n, 4), *dx = xcalloc(n, 4), *dg = xcalloc(c, 4);
		float *dbe = xcalloc(c, 4), *dg0 = xcalloc(c, 4), *dbe0 = xcalloc(c, 4);
		float *got = xcalloc(n, 4);
		fill(x, n, -3, 5), fill(g, c, 0.5f, 1.5f), fill(be, c, -1, 1);
		fill(dy, n, -1, 1), fill(dg0, c, -1, 1), fill(dbe0, c, -1, 1);
		memcpy(dg, dg0, c * 4);
		memcpy(dbe, dbe0, c * 4);
		hpu__ref_layernorm_forward(x, g, be, y, mean, rstd, rows, cols, 1e-5f);
		hpu__ref_layernorm_backward(x, g, mean, rstd, dy, dx, dg, dbe, rows, cols);
		float *dxx = dput(x, n * 4), *dgm = dput(g, c * 4), *dbt = dput(be, c * 4);
		float *dyo = dnan(n * 4), *dmean = dnan(r * 4), *drstd = dnan(r * 4);
		float *ddy = dput(dy, n * 4), *ddx = dnan(n * 4), *ddg = dput(dg0, c * 4);
		float *ddbe = dput(dbe0, c * 4);
		char line[96];
		assert_int_equal(gpu->layernorm_fwd(dxx, dgm, dbt, dyo, dmean, drstd, rows, cols,
						    1e-5f),
				 HPU_BE_OK);
		dget(got, dyo, n * 4);
		snprintf(line, sizeof line, "layernorm fwd [%d,%d] y", rows, cols);
		check(line, got, y, n, 1e-5);
		dget(got, dmean, r * 4);
		snprintf(line, sizeof line, "layernorm fwd [%d,%d] mean", rows, cols);
		check(line, got, mean, r, 1e-5);
		dget(got, drstd, r * 4);
		snprintf(line, sizeof line, "layernorm fwd [%d,%d] rstd", rows, cols);
		check(line, got, rstd, r, 1e-5);
		/* backward from the reference's mean and rstd */
		assert_int_equal(cudaMemcpy(dmean, mean, r * 4, cudaMemcpyHostToDevice), cudaSuccess);
		assert_int_equal(cudaMemcpy(drstd, rstd, r * 4, cudaMemcpyHostToDevice), cudaSuccess);
		assert_int_equal(gpu->layernorm_bwd(dxx, dgm, dmean, drstd, ddy, ddx, ddg, ddbe,
						    rows, cols),
				 HPU_BE_OK);
		dget(got, ddx, n * 4);
		snprintf(line, sizeof line, "layernorm bwd [%d,%d] dx", rows, cols);
		check(line, got, dx, n, 1e-5);
		dget(got, ddg, c * 4);
		snprintf(line, sizeof line, "layernorm bwd [%d,%d] dgamma +=", rows, cols);
		check(line, got, dg, c, 1e-5);
		dget(got, ddbe, c * 4);
		snprintf(line, sizeof line, "layernorm bwd [%d,%d] dbeta +=", rows, cols);
		check(line, got, dbe, c, 1e-5);
		dfree(dxx), dfree(dgm), dfree(dbt), dfree(dyo), dfree(dmean), dfree(drstd);
		dfree(ddy), dfree(ddx), dfree(ddg), dfree(ddbe);
		free(x), free(g), free(be), free(y), free(mean), free(rstd), free(dy), free(dx);
		free(dg), free(dbe), free(dg0), free(dbe0), free(got);
	}
}

/* Small integers in [-k, k], uniform: sums of them stay exact in fp32 in
 * any order while below 2^24. */
static void fill_ints(float *a, size_t n, int k)
{
	for (size_t i = 0; i < n; i++) {
		float v = floorf(rng_uniform((float)-k, (float)k + 1.0f));
		a[i] = v > (float)k ? (float)k : v;
	}
}

/* More rows than 65535 block rows of 32 hold (a grid's y limit): the
 * partial sums walk their chunks. mean 0 and rstd 1 make xhat = x, and x,
 * dy, gamma small integers over 4 columns: every sum is exact, so the
 * GPU's dgamma and dbeta equal the CPU's bit for bit. */
static void test_layernorm_many_rows(void **state)
{
	(void)state;
	const int rows = 65535 * 32 + 1000, cols = 4;
	size_t n = (size_t)rows * cols, r = (size_t)rows, c = (size_t)cols;
	rng_seed(16);
	float *x = xcalloc(n, 4), *dy = xcalloc(n, 4), *dx = xcalloc(n, 4), *got = xcalloc(n, 4);
	float *mean = xcalloc(r, 4), *rstd = xcalloc(r, 4);
	float g[4] = {1, 2, -1, 2}, dg[4] = {1, -1, 0, 2}, dbe[4] = {-2, 0, 1, 1};
	float dg0[4], dbe0[4];
	memcpy(dg0, dg, sizeof dg);
	memcpy(dbe0, dbe, sizeof dbe);
	fill_ints(x, n, 2), fill_ints(dy, n, 2);
	for (size_t i = 0; i < r; i++)
		rstd[i] = 1.0f;
	hpu__ref_layernorm_backward(x, g, mean, rstd, dy, dx, dg, dbe, rows, cols);
	float *dxx = dput(x, n * 4), *dgm = dput(g, c * 4), *dmean = dput(mean, r * 4);
	float *drstd = dput(rstd, r * 4), *ddy = dput(dy, n * 4), *ddx = dnan(n * 4);
	float *ddg = dput(dg0, c * 4), *ddbe = dput(dbe0, c * 4);
	char line[96];
	assert_int_equal(gpu->layernorm_bwd(dxx, dgm, dmean, drstd, ddy, ddx, ddg, ddbe, rows,
					    cols),
			 HPU_BE_OK);
	dget(got, ddx, n * 4);
	snprintf(line, sizeof line, "layernorm bwd [%d,%d] dx", rows, cols);
	check(line, got, dx, n, 1e-5);
	dget(got, ddg, c * 4);
	snprintf(line, sizeof line, "layernorm bwd [%d,%d] dgamma +=", rows, cols);
	check_floats_bits(line, got, dg, c);
	dget(got, ddbe, c * 4);
	snprintf(line, sizeof line, "layernorm bwd [%d,%d] dbeta +=", rows, cols);
	check_floats_bits(line, got, dbe, c);
	dfree(dxx), dfree(dgm), dfree(dmean), dfree(drstd), dfree(ddy), dfree(ddx);
	dfree(ddg), dfree(ddbe);
	free(x), free(dy), free(dx), free(got), free(mean), free(rstd);
}

/* ---- dropout: the CPU's masks, bit for bit ---- */

static void test_dropout(void **state)
{
	(void)state;
	static const size_t sizes[] = {1, 1000, 100003};
	static const float ps[] = {0.0f, 0.1f, 0.5f, 0.999f, 1.0f};
	rng_seed(7);
	hpu__be_set(hpu__be_reference()); /* the CPU's plain C dropout */
	for (size_t s = 0; s < 3; s++)
		for (size_t pi = 0; pi < 5; pi++) {
			size_t n = sizes[s];
			float p = ps[pi];
			uint64_t seed = 0x1234567890abcdefull + s, strm = 42 + pi;
			float *x = xcalloc(n, 4), *y = xcalloc(n, 4), *dy = xcalloc(n, 4);
			float *dx = xcalloc(n, 4), *got = xcalloc(n, 4);
			uint8_t *mask = xcalloc(n, 1), *gmask = xcalloc(n, 1);
			fill(x, n, -1, 1), fill(dy, n, -1, 1);
			hpu_dropout_forward(x, y, mask, n, p, seed, strm);
			hpu_dropout_backward(dy, mask, dx, n, p);
			float *dxx = dput(x, n * 4), *dyo = dnan(n * 4), *ddy = dput(dy, n * 4);
			float *ddx = dnan(n * 4);
			uint8_t *dmask = dnan(n);
			char line[96];
			assert_int_equal(gpu->dropout_fwd(dxx, dyo, dmask, n, p, seed, strm),
					 HPU_BE_OK);
			dget(gmask, dmask, n);
			snprintf(line, sizeof line, "dropout n=%zu p=%g mask", n, p);
			check_bits(line, gmask, mask, n);
			dget(got, dyo, n * 4);
			snprintf(line, sizeof line, "dropout n=%zu p=%g y", n, p);
			check_bits(line, got, y, n * 4);
			assert_int_equal(gpu->dropout_bwd(ddy, dmask, ddx, n, p), HPU_BE_OK);
			dget(got, ddx, n * 4);
			snprintf(line, sizeof line, "dropout n=%zu p=%g dx", n, p);
			check_bits(line, got, dx, n * 4);
			dfree(dxx), dfree(dyo), dfree(ddy), dfree(ddx), dfree(dmask);
			free(x), free(y), free(dy), free(dx), free(got), free(mask), free(gmask);
		}
	hpu__be_set(NULL);
}

/* ---- embedding: the CPU's sums, bit for bit ---- */

/* ids outside the vocabulary (vocab + 5, and -1 where n > 1; the kernels
 * read ids whose check is deferred): the host's kernels' zero rows and
 * skipped additions, bit for bit, and nothing outside the table. The
 * device's buffers hold the host's (dt: the table's gradient so far). */
static void emb_outside(float *dtab, int32_t *dids, float *ddy, float *ddt, const float *table,
			int32_t *ids, const float *dy, float *dt, int vocab, int dim, int n)
{
	size_t nt = (size_t)vocab * dim, ny = (size_t)n * dim;
	float *y = xcalloc(ny, 4), *got = xcalloc(nt + ny, 4);
	float *dyo = dnan(ny * 4);
	ids[n / 2] = vocab + 5;
	if (n > 1)
		ids[n - 1] = -1;
	assert_int_equal(cudaMemcpy(dids, ids, (size_t)n * 4, cudaMemcpyHostToDevice), cudaSuccess);
	assert_int_equal(hpu__be_host()->embedding_fwd(table, ids, y, n, vocab, dim), HPU_BE_OK);
	assert_int_equal(hpu__be_host()->embedding_bwd(ids, dy, dt, n, vocab, dim), HPU_BE_OK);
	char line[128];
	assert_int_equal(gpu->embedding_fwd(dtab, dids, dyo, n, vocab, dim), HPU_BE_OK);
	dget(got, dyo, ny * 4);
	snprintf(line, sizeof line, "embedding fwd vocab %d dim %d n %d, ids %d and -1 outside",
		 vocab, dim, n, vocab + 5);
	for (int c = 0; c < dim; c++)
		assert_true(y[(size_t)(n / 2) * dim + c] == 0.0f);
	check_bits(line, got, y, ny * 4);
	assert_int_equal(gpu->embedding_bwd(dids, ddy, ddt, n, vocab, dim), HPU_BE_OK);
	dget(got, ddt, nt * 4);
	snprintf(line, sizeof line, "embedding bwd vocab %d dim %d n %d, ids %d and -1 outside",
		 vocab, dim, n, vocab + 5);
	check_bits(line, got, dt, nt * 4);
	printf("  %s: the host's zero rows and sums\n", line);
	dfree(dyo);
	free(y), free(got);
}

static void test_embedding(void **state)
{
	(void)state;
	static const int shapes[][3] = {{13, 1, 1}, {13, 130, 50}, {200, 300, 3000}};
	rng_seed(8);
	hpu__be_set(hpu__be_reference());
	for (size_t s = 0; s < 3; s++) {
		int vocab = shapes[s][0], dim = shapes[s][1], n = shapes[s][2];
		size_t nt = (size_t)vocab * dim, ny = (size_t)n * dim;
		float *table = xcalloc(nt, 4), *y = xcalloc(ny, 4), *dy = xcalloc(ny, 4);
		float *dt = xcalloc(nt, 4), *got = xcalloc(nt + ny, 4);
		int32_t *ids = xcalloc((size_t)n, 4);
		fill(table, nt, -1, 1), fill(dy, ny, -1, 1), fill(dt, nt, -1, 1);
		for (int i = 0; i < n; i++) /* repeats: the same row summed many times */
			ids[i] = (int32_t)rng_uniform(0, (float)vocab) % vocab;
		float *dtab = dput(table, nt * 4), *dyo = dnan(ny * 4), *ddy = dput(dy, ny * 4);
		float *ddt = dput(dt, nt * 4);
		int32_t *dids = dput(ids, (size_t)n * 4);
		assert_int_equal(hpu_embedding_forward(table, ids, y, n, vocab, dim), HPU_OK);
		hpu_embedding_backward(ids, dy, dt, n, dim);
		char line[96];
		assert_int_equal(gpu->embedding_fwd(dtab, dids, dyo, n, vocab, dim), HPU_BE_OK);
		dget(got, dyo, ny * 4);
		snprintf(line, sizeof line, "embedding fwd vocab %d dim %d n %d", vocab, dim, n);
		check_bits(line, got, y, ny * 4);
		assert_int_equal(gpu->embedding_bwd(dids, ddy, ddt, n, vocab, dim), HPU_BE_OK);
		dget(got, ddt, nt * 4);
		snprintf(line, sizeof line, "embedding bwd vocab %d dim %d n %d", vocab, dim, n);
		check_bits(line, got, dt, nt * 4);
		emb_outside(dtab, dids, ddy, ddt, table, ids, dy, dt, vocab, dim, n);
		dfree(dtab), dfree(dyo), dfree(ddy), dfree(ddt), dfree(dids);
		free(table), free(y), free(dy), free(dt), free(got), free(ids);
	}
	hpu__be_set(NULL);
}

/* ---- softmax cross-entropy ---- */

static void test_xent(void **state)
{
	(void)state;
	static const int shapes[][2] = {{1, 1}, {7, 10}, {64, 1001}, {3, 50304}};
	rng_seed(9);
	hpu__be_set(hpu__be_reference());
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int batch = shapes[s][0], classes = shapes[s][1];
		size_t n = (size_t)batch * classes;
		float *z = xcalloc(n, 4), *d = xcalloc(n, 4), *got = xcalloc(n, 4);
		int32_t *lab = xcalloc((size_t)batch, 4);
		fill(z, n, -10, 10);
		for (int i = 0; i < batch; i++)
			lab[i] = (int32_t)rng_uniform(0, (float)classes) % classes;
		float want = hpu_cross_entropy_forward(z, lab, d, batch, classes);
		float *dz = dput(z, n * 4), *dd = dnan(n * 4);
		int32_t *dlab = dput(lab, (size_t)batch * 4);
		float loss = NAN, loss2 = NAN;
		char line[96];
		assert_int_equal(gpu->softmax_xent(dz, dlab, dd, batch, classes, &loss), HPU_BE_OK);
		snprintf(line, sizeof line, "softmax_xent [%d,%d] loss", batch, classes);
		check(line, &loss, &want, 1, 1e-5);
		dget(got, dd, n * 4);
		snprintf(line, sizeof line, "softmax_xent [%d,%d] dlogits", batch, classes);
		check(line, got, d, n, 1e-5);
		assert_int_equal(gpu->softmax_xent(dz, dlab, NULL, batch, classes, &loss2),
				 HPU_BE_OK);
		snprintf(line, sizeof line, "softmax_xent [%d,%d] loss, no dlogits", batch, classes);
		check(line, &loss2, &want, 1, 1e-5);
		dfree(dz), dfree(dd), dfree(dlab);
		free(z), free(d), free(got), free(lab);
	}
	hpu__be_set(NULL);
}

/* ---- the ops' own passes ---- */

static void test_bias_grad(void **state)
{
	(void)state;
	static const int shapes[][2] = {{1, 1}, {7, 13}, {65, 1000}, {300, 37}, {1000, 3}};
	rng_seed(10);
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
		for (int bf = 0; bf < 2; bf++) {
			int rows = shapes[s][0], cols = shapes[s][1];
			size_t n = (size_t)rows * cols, c = (size_t)cols;
			float *dy = xcalloc(n, 4), *db = xcalloc(c, 4), *db0 = xcalloc(c, 4);
			float *got = xcalloc(c, 4);
			uint16_t *dy16 = xcalloc(n, 2);
			fill(dy, n, -1, 1), fill(db0, c, -1, 1);
			if (bf)
				round_bf16(dy, dy16, n);
			memcpy(db, db0, c * 4);
			for (int r = 0; r < rows; r++) /* the C loop of ops.c */
				for (int j = 0; j < cols; j++)
					db[j] += dy[(size_t)r * cols + j];
			void *ddy = dput(bf ? (void *)dy16 : dy, n * (bf ? 2 : 4));
			float *ddb = dput(db0, c * 4);
			assert_int_equal(gpu->bias_grad(bf ? HPU_DT_BF16 : HPU_DT_F32, ddy, ddb, rows,
							cols),
					 HPU_BE_OK);
			dget(got, ddb, c * 4);
			char line[96];
			snprintf(line, sizeof line, "bias_grad %s [%d,%d] (db +=)", bf ? "bf16" : "f32",
				 rows, cols);
			check(line, got, db, c, 1e-5);
			dfree(ddy), dfree(ddb);
			free(dy), free(db), free(db0), free(got), free(dy16);
		}
}

/* More rows than 65535 block rows of 64 hold: the partial sums walk
 * their chunks; small integers make every sum exact (bits compared). */
static void test_bias_grad_many_rows(void **state)
{
	(void)state;
	const int rows = 65535 * 64 + 1000, cols = 3;
	size_t n = (size_t)rows * cols, c = (size_t)cols;
	rng_seed(17);
	float *dy = xcalloc(n, 4), db[3] = {1, -2, 0}, db0[3], got[3];
	uint16_t *dy16 = xcalloc(n, 2);
	memcpy(db0, db, sizeof db);
	fill_ints(dy, n, 2);
	round_bf16(dy, dy16, n); /* (exact: the values are small integers) */
	for (int r = 0; r < rows; r++)
		for (int j = 0; j < cols; j++)
			db[j] += dy[(size_t)r * cols + j];
	for (int bf = 0; bf < 2; bf++) {
		void *ddy = dput(bf ? (void *)dy16 : dy, n * (bf ? 2 : 4));
		float *ddb = dput(db0, c * 4);
		assert_int_equal(gpu->bias_grad(bf ? HPU_DT_BF16 : HPU_DT_F32, ddy, ddb, rows, cols),
				 HPU_BE_OK);
		dget(got, ddb, c * 4);
		char line[96];
		snprintf(line, sizeof line, "bias_grad %s [%d,%d] (db +=)", bf ? "bf16" : "f32", rows,
			 cols);
		check_floats_bits(line, got, db, c);
		dfree(ddy), dfree(ddb);
	}
	free(dy), free(dy16);
}

/* Rounding and conversions against common/lowp.h, bit for bit: every
 * 16-bit pattern widened, and rounding at the edges (ties, subnormals,
 * overflow, infinities, NaNs) and at random. */
static void test_convert(void **state)
{
	(void)state;
	const size_t n16 = 65536;
	uint16_t *h = xcalloc(n16, 2);
	float *want = xcalloc(n16, 4), *got = xcalloc(n16, 4);
	for (size_t i = 0; i < n16; i++)
		h[i] = (uint16_t)i;
	uint16_t *dh = dput(h, n16 * 2);
	float *df = dnan(n16 * 4);
	for (int fp16 = 0; fp16 < 2; fp16++) {
		for (size_t i = 0; i < n16; i++)
			want[i] = fp16 ? hpu_from_fp16(h[i]) : hpu_from_bf16(h[i]);
		assert_int_equal(gpu->from16(fp16, dh, df, n16), HPU_BE_OK);
		dget(got, df, n16 * 4);
		check_bits(fp16 ? "from16 fp16, every pattern" : "from16 bf16, every pattern", got,
			   want, n16 * 4);
	}
	dfree(dh), dfree(df);

	/* rounding inputs: edge values, then random bits, then random values */
	const size_t n = 200000;
	float *x = xcalloc(n, 4), *y = xcalloc(n, 4), *gy = xcalloc(n, 4);
	uint16_t *y16 = xcalloc(n, 2), *g16 = xcalloc(n, 2);
	static const uint32_t edges[] = {
		0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x00800000u, 0x33000000u,
		0x33000001u, 0x337fffffu, 0x38800000u, 0x387fffffu, 0x477fe000u, 0x477fefffu,
		0x477ff000u, 0x47800000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
		0x7f800001u, 0xffc00001u, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f800fffu,
		0x3f801000u, 0x3f803000u};
	size_t ne = sizeof edges / sizeof edges[0];
	for (size_t i = 0; i < ne; i++)
		memcpy(&x[i], &edges[i], 4);
	for (size_t i = ne; i < n / 2; i++) {
		uint32_t b = (uint32_t)(rng_uniform(0, 65536)) << 16 | (uint32_t)rng_uniform(0, 65536);
		memcpy(&x[i], &b, 4);
	}
	fill(x + n / 2, n - n / 2, -70000, 70000);
	float *dx = dput(x, n * 4), *dy = dnan(n * 4);
	uint16_t *dy16 = dnan(n * 2);
	for (int fp16 = 0; fp16 < 2; fp16++) {
		for (size_t i = 0; i < n; i++)
			y[i] = fp16 ? hpu_from_fp16(hpu_to_fp16(x[i])) : hpu_from_bf16(hpu_to_bf16(x[i]));
		assert_int_equal(gpu->round(fp16, dx, dy, n), HPU_BE_OK);
		dget(gy, dy, n * 4);
		check_bits(fp16 ? "round fp16" : "round bf16", gy, y, n * 4);
		/* in place */
		assert_int_equal(cudaMemcpy(dy, x, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
		assert_int_equal(gpu->round(fp16, dy, dy, n), HPU_BE_OK);
		dget(gy, dy, n * 4);
		check_bits(fp16 ? "round fp16 in place" : "round bf16 in place", gy, y, n * 4);
	}
	for (size_t i = 0; i < n; i++)
		y16[i] = hpu_to_bf16(x[i]);
	assert_int_equal(gpu->to_bf16(dx, dy16, n), HPU_BE_OK);
	dget(g16, dy16, n * 2);
	check_bits("to_bf16", g16, y16, n * 2);
	/* add */
	for (size_t i = 0; i < n; i++)
		y[i] = x[i] + x[n - 1 - i];
	float *xr = xcalloc(n, 4);
	for (size_t i = 0; i < n; i++)
		xr[i] = x[n - 1 - i];
	assert_int_equal(cudaMemcpy(dy, xr, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
	assert_int_equal(gpu->add(dx, dy, n), HPU_BE_OK);
	dget(gy, dy, n * 4);
	check_floats_bits("add (y += x)", gy, y, n);
	dfree(dx), dfree(dy), dfree(dy16);
	free(h), free(want), free(got), free(x), free(y), free(gy), free(y16), free(g16), free(xr);
}

/* fp8's amax and quantization against fp8.c's C loops, bit for bit. */
static void test_fp8(void **state)
{
	(void)state;
	const size_t n = 100003;
	static const float scales[] = {1.0f, 0.125f, 32.0f, 1024.0f};
	rng_seed(13);
	float *x = xcalloc(n, 4), *y = xcalloc(n, 4), *got = xcalloc(n, 4);
	fill(x, n / 2, -600, 600);
	for (size_t i = n / 2; i < n; i++) /* many magnitudes, subnormal ranges */
		x[i] = ldexpf(rng_uniform(-1, 1), (int)rng_uniform(-30, 20));
	static const uint32_t edges[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x80000000u,
					 0x00000001u, 0x43e00000u, 0x43e80000u, 0x47600000u,
					 0x47700000u, 0x3b000000u, 0x3b100000u};
	for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
		memcpy(&x[1 + 7 * i], &edges[i], 4);
	float *dx = dput(x, n * 4), *dy = dnan(n * 4);
	hpu__be_set(hpu__be_reference());
	float want = hpu__fp8_amax(x, n), m = -1;
	hpu__be_set(NULL);
	assert_int_equal(gpu->amax(dx, n, &m), HPU_BE_OK);
	check_bits("fp8 amax (NaN and infinities among the values)", &m, &want, 4);
	assert_int_equal(gpu->amax(dx, 0, &m), HPU_BE_OK);
	assert_true(m == 0.0f);
	for (int fmt = 0; fmt < 2; fmt++)
		for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
			hpu__be_set(hpu__be_reference());
			hpu__fp8_fake_quant(x, y, n, scales[s], fmt);
			hpu__be_set(NULL);
			assert_int_equal(gpu->fp8_fake_quant(dx, dy, n, scales[s], fmt), HPU_BE_OK);
			dget(got, dy, n * 4);
			char line[96];
			snprintf(line, sizeof line, "fp8 fake quant %s scale %g",
				 fmt ? "E5M2" : "E4M3", scales[s]);
			check_floats_bits(line, got, y, n);
		}
	dfree(dx), dfree(dy);
	free(x), free(y), free(got);
}

/* fp8 training's state on the device (fp8.h's chunk): the amax and first
 * scale, quantization at the scale the kernel reads, and the roll, against
 * the C kernels on a host copy of the same chunk, bit for bit, over
 * several steps; the state's copies both ways. Instances seen and not,
 * scales set and not, an amax of 0 and of inf (which keep the scale),
 * histories half full and wrapping; MAX and the latest amax. */
static void test_fp8_state(void **state)
{
	(void)state;
	enum { H = 4, CAP = HPU_FP8_CHUNK, COUNT = HPU_FP8_CHUNK - 3, NX = 777 };
	size_t floats = hpu__fp8_chunk_floats(CAP, H), bytes = floats * 4;
	float *host = xcalloc(floats, 4), *got = xcalloc(floats, 4);
	float *x = xcalloc(NX, 4), *yh = xcalloc(NX, 4), *yg = xcalloc(NX, 4);
	rng_seed(17);
	for (int i = 0; i < COUNT; i++) { /* some instances set up as if from earlier steps */
		float *z = host + hpu__fp8_off_hist(CAP, H, i);
		z[0] = (float)(i % (H + 1));
		z[1] = (float)(i % H);
		for (int k = 0; k < 3 * H; k++)
			z[2 + k] = i % 5 ? ldexpf(rng_uniform(0, 1), (int)rng_uniform(-8, 9)) : 0.0f;
		for (int t = 0; t < 3; t++)
			host[hpu__fp8_off_scale(CAP, i, t)] = i % 3 ? ldexpf(1.0f, i % 7) : 0.0f;
	}
	float *dev = dnan(bytes), *dx = dnan(NX * 4), *dy = dnan(NX * 4);
	assert_int_equal(gpu->fp8_state_copy(dev, host, bytes), HPU_BE_OK);
	for (int step = 0; step < 6; step++) {
		for (int i = step % 3; i < COUNT; i += 3)
			for (int t = 0; t < 3; t++) {
				if ((i + t + step) % 4 == 0)
					continue; /* not seen this step */
				int fmt = t == 2 ? HPU_FP8_E5M2 : HPU_FP8_E4M3;
				fill(x, NX, -1, 1);
				float big = (i + step) % 11 == 0   ? 0.0f
					    : (i + step) % 13 == 0 ? INFINITY
								   : ldexpf(1.5f, i % 20 - 10);
				for (int k = 0; k < NX; k++)
					x[k] = (i + step) % 11 == 0 ? 0.0f : x[k] * big;
				cudaMemcpy(dx, x, NX * 4, cudaMemcpyHostToDevice);
				size_t st = hpu__fp8_off_step(i, t), sc = hpu__fp8_off_scale(CAP, i, t);
				hpu__host_fp8_amax_scale(x, NX, host + st, host + sc, fmt, step % 2);
				assert_int_equal(gpu->fp8_amax_scale(dx, NX, dev + st, dev + sc, fmt,
								     step % 2),
						 HPU_BE_OK);
				hpu__host_fp8_quant_at(x, yh, NX, host + sc, fmt);
				assert_int_equal(gpu->fp8_quant_at(dx, dy, NX, dev + sc, fmt), HPU_BE_OK);
				dget(yg, dy, NX * 4);
				check_floats_bits("fp8 quantization at the device's scale", yg, yh, NX);
			}
		int algo = step < 3 ? HPU_FP8_AMAX_MAX : HPU_FP8_AMAX_MOST_RECENT;
		assert_int_equal(hpu__host_fp8_roll(host, COUNT, CAP, H, algo, step % 2), HPU_BE_OK);
		assert_int_equal(gpu->fp8_roll(dev, COUNT, CAP, H, algo, step % 2), HPU_BE_OK);
		assert_int_equal(gpu->fp8_state_copy(got, dev, bytes), HPU_BE_OK);
		for (size_t k = 0; k < floats; k++) /* the step pairs' scratch aside */
			if (k >= hpu__fp8_off_scale(CAP, 0, 0) && k < hpu__fp8_off_hist(CAP, H, 0) &&
			    (k - hpu__fp8_off_scale(CAP, 0, 0)) % 2)
				got[k] = host[k];
		check_floats_bits("fp8 state after the roll", got, host, floats);
	}
	dfree(dev), dfree(dx), dfree(dy);
	free(host), free(got), free(x), free(yh), free(yg);
}

/* fp8 training's products on fp8 arithmetic: the bytes (plain and
 * transposed) against the host's quant8, bit for bit, with the inverse
 * scale written; cuBLASLt's fp8 product (E4M3 x E4M3, E5M2 x E4M3, with
 * a bias, accumulating onto its own first result) against the bytes
 * decoded and summed in double, each within 2^-12 of the sum of its
 * products' magnitudes (Hopper's fp8 tensor cores keep about 14 bits
 * within a chunk of K; a wrong operand, transpose, format or scale is off
 * by far more) and fp32's rounding of the result; a shape it does not take (a size not a
 * multiple of 16) declined with nothing written. A GPU before sm 8.9
 * declines every product. */
static void test_fp8_products(void **state)
{
	(void)state;
	static const int shapes[][3] = {{48, 32, 64}, {16, 16, 16}, {128, 80, 272}};
	int dev = 0, major = 0, minor = 0;
	cudaGetDevice(&dev);
	cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
	cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
	int has_fp8 = major * 10 + minor >= 89;
	rng_seed(29);
	for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
		int m = shapes[t][0], n = shapes[t][1], k = shapes[t][2];
		int fa = t == 1 ? HPU_FP8_E5M2 : HPU_FP8_E4M3;
		size_t na = (size_t)m * k, nb = (size_t)n * k, nc = (size_t)m * n;
		float *a = xcalloc(na, 4), *b = xcalloc(nb, 4), *bias = xcalloc(n, 4);
		float *c = xcalloc(nc, 4), *got = xcalloc(nc, 4), *mag = xcalloc(nc, 4);
		uint8_t *ha = xcalloc(na, 1), *hb = xcalloc(nb, 1), *g8 = xcalloc(na, 1);
		fill(a, na, -3, 3), fill(b, nb, -0.5f, 0.5f), fill(bias, n, -1, 1);
		float sa[2] = {16.0f, 0}, sb[2] = {256.0f, 0}, hs[2];
		float *da = dput(a, na * 4), *db_ = dput(b, nb * 4), *dbias = dput(bias, n * 4);
		float *dsa = dput(sa, 8), *dsb = dput(sb, 8), *dc = dnan(nc * 4);
		uint8_t *da8 = dnan(na), *db8 = dnan(nb);
		for (int trans = 0; trans < 2; trans++) { /* the bytes */
			memcpy(hs, sa, sizeof hs);
			hpu__host_fp8_quant8(a, ha, m, k, trans, hs, fa);
			assert_int_equal(gpu->fp8_quant8(da, da8, m, k, trans, dsa, fa), HPU_BE_OK);
			dget(g8, da8, na);
			check_bits(trans ? "fp8 bytes, transposed" : "fp8 bytes", g8, ha, na);
			float inv[2];
			dget(inv, dsa, 8);
			assert_true(inv[1] == 1.0f / 16.0f);
		}
		hpu__host_fp8_quant8(a, ha, m, k, 0, sa, fa);
		hpu__host_fp8_quant8(b, hb, n, k, 0, sb, HPU_FP8_E4M3);
		assert_int_equal(gpu->fp8_quant8(da, da8, m, k, 0, dsa, fa), HPU_BE_OK);
		assert_int_equal(gpu->fp8_quant8(db_, db8, n, k, 0, dsb, HPU_FP8_E4M3), HPU_BE_OK);
		for (int acc = 0; acc < 2; acc++) {
			double big = 0, err = 0, worst = 0;
			for (int i = 0; i < m; i++)
				for (int j = 0; j < n; j++) {
					double s = 0, sa = 0;
					for (int l = 0; l < k; l++) {
						double pr = (double)hpu__fp8_decode(ha[(size_t)i * k + l], fa) *
							    hpu__fp8_decode(hb[(size_t)j * k + l],
									    HPU_FP8_E4M3);
						s += pr;
						sa += fabs(pr);
					}
					size_t o = (size_t)i * n + j;
					float v = (float)(s / 16.0 / 256.0) + bias[j];
					/* accumulating: onto what the GPU gave the first time */
					c[o] = acc ? got[o] + v : v;
					mag[o] = (float)(sa / 16.0 / 256.0);
				}
			int rc = gpu->gemm_fp8(m, n, k, da8, fa, db8, HPU_FP8_E4M3, dsa + 1, dsb + 1,
					       dbias, dc, acc);
			if (!has_fp8) {
				assert_int_equal(rc, HPU_BE_UNSUPPORTED);
				printf("  sm %d.%d: no fp8 products, declined\n", major, minor);
				break;
			}
			assert_int_equal(rc, HPU_BE_OK);
			dget(got, dc, nc * 4);
			for (size_t i = 0; i < nc; i++) {
				double d = fabs((double)got[i] - c[i]);
				double bound = 0x1p-12 * mag[i] + 0x1p-22 * fabs(c[i]) + 1e-30;
				big = fmax(big, fabs(c[i]));
				err = d <= err ? err : d;
				worst = d / bound <= worst ? worst : d / bound; /* a NaN stays */
			}
			printf("  fp8 product %dx%dx%d %s%s: max |diff| %.3g of %.3g, %.2f of "
			       "the bound at worst\n",
			       m, n, k, fa == HPU_FP8_E5M2 ? "E5M2 x E4M3" : "E4M3 x E4M3",
			       acc ? ", accumulating" : "", err, big, worst);
			assert_true(worst <= 1.0);
		}
		/* a size not a multiple of 16: declined, nothing written */
		float *dnot = dnan(nc * 4);
		assert_int_equal(gpu->gemm_fp8(m - 1, n, k, da8, fa, db8, HPU_FP8_E4M3, dsa + 1,
					       dsb + 1, NULL, dnot, 0),
				 HPU_BE_UNSUPPORTED);
		dget(got, dnot, (size_t)(m - 1) * n * 4);
		for (size_t i = 0; i < (size_t)(m - 1) * n; i++)
			assert_true(isnan(got[i]));
		dfree(dnot);
		dfree(da), dfree(db_), dfree(dbias), dfree(dsa), dfree(dsb), dfree(dc), dfree(da8),
			dfree(db8);
		free(a), free(b), free(bias), free(c), free(got), free(mag), free(ha), free(hb),
			free(g8);
	}
}

/* The public ops on device memory with the CUDA table in force (fp32):
 * linear forward and backward (products, bias epilogue, bias_grad) and
 * layer norm, against the same ops on the CPU. */
static void test_ops_on_gpu(void **state)
{
	(void)state;
	const int batch = 33, in = 70, out = 17;
	size_t nx = (size_t)batch * in, nw = (size_t)out * in, ny = (size_t)batch * out;
	rng_seed(11);
	float *x = xcalloc(nx, 4), *w = xcalloc(nw, 4), *b = xcalloc(out, 4);
	float *dy = xcalloc(ny, 4), *y = xcalloc(ny, 4), *dx = xcalloc(nx, 4);
	float *dw = xcalloc(nw, 4), *db = xcalloc(out, 4), *got = xcalloc(nx + nw, 4);
	fill(x, nx, -1, 1), fill(w, nw, -1, 1), fill(b, out, -1, 1), fill(dy, ny, -1, 1);
	float *dx_ = dput(x, nx * 4), *dw_ = dput(w, nw * 4), *db_ = dput(b, out * 4);
	float *ddy = dput(dy, ny * 4), *dyo = dnan(ny * 4), *ddx = dnan(nx * 4);
	float *ddw = dput(dw, nw * 4), *ddb = dput(db, out * 4);
	hpu__be_set(hpu__be_reference());
	hpu_linear_forward(x, w, b, y, batch, in, out);
	hpu_linear_backward(x, w, dy, dx, dw, db, batch, in, out);
	hpu__be_set(gpu);
	hpu_linear_forward(dx_, dw_, db_, dyo, batch, in, out);
	hpu_linear_backward(dx_, dw_, ddy, ddx, ddw, ddb, batch, in, out);
	hpu__be_set(NULL);
	dget(got, dyo, ny * 4);
	check("hpu_linear_forward on the GPU", got, y, ny, 1e-5);
	dget(got, ddx, nx * 4);
	check("hpu_linear_backward on the GPU: dx", got, dx, nx, 1e-5);
	dget(got, ddw, nw * 4);
	check("hpu_linear_backward on the GPU: dw", got, dw, nw, 1e-5);
	dget(got, ddb, out * 4);
	check("hpu_linear_backward on the GPU: db", got, db, out, 1e-5);
	dfree(dx_), dfree(dw_), dfree(db_), dfree(ddy), dfree(dyo), dfree(ddx), dfree(ddw);
	dfree(ddb);
	free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(got);
}

/* Every table entry is filled (the ops would run C loops on device
 * memory where one is NULL), and it describes itself; but for conv_bwd,
 * which a table may leave out (backend.h: the ops then call the two
 * backward convolutions), and the flags gemm_c16 and findings_dev. */
static void test_table(void **state)
{
	(void)state;
	const void *const *f = (const void *const *)&gpu->describe;
	size_t at = offsetof(hpu__backend, describe);
	size_t nf = (sizeof *gpu - at) / sizeof(void *);
	for (size_t i = 0; i < nf; i++) {
		size_t off = at + i * sizeof(void *);
		if (off == offsetof(hpu__backend, conv_bwd) ||
		    (off + sizeof(void *) > offsetof(hpu__backend, gemm_c16) &&
		     off < offsetof(hpu__backend, findings_dev) + sizeof(int)))
			continue;
		if (!f[i])
			fail_msg("the CUDA table's entry at byte %zu is NULL", off);
	}
	printf("  %s: %s\n", gpu->name, gpu->describe());
	assert_int_equal(gpu->bf16_native(), 1);
}

int main(void)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		printf("test_cuda_ops: skipped: no CUDA GPU visible (%s)\n",
		       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
		return 77;
	}
	if (cudaStreamCreate(&stream) != cudaSuccess) {
		printf("test_cuda_ops: cannot create a CUDA stream\n");
		return 1;
	}
	hpu__cuda_ops_set_stream(stream);
	cu_test_set_stream(stream);
	gpu = hpu__cuda_backend();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table),	  cmocka_unit_test(test_gemm),
		cmocka_unit_test(test_conv),	  cmocka_unit_test(test_pool),
		cmocka_unit_test(test_eltwise),	  cmocka_unit_test(test_softmax),
		cmocka_unit_test(test_layernorm), cmocka_unit_test(test_layernorm_many_rows),
		cmocka_unit_test(test_dropout),
		cmocka_unit_test(test_embedding), cmocka_unit_test(test_xent),
		cmocka_unit_test(test_bias_grad), cmocka_unit_test(test_bias_grad_many_rows),
		cmocka_unit_test(test_convert),
		cmocka_unit_test(test_fp8),	  cmocka_unit_test(test_fp8_state),
		cmocka_unit_test(test_fp8_products),	  cmocka_unit_test(test_ops_on_gpu),
		cmocka_unit_test(test_checks),	  cmocka_unit_test(test_release),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	rc += hpu_cuda_layer_tests(gpu, stream);
	hpu__cuda_ops_release();
	cudaStreamDestroy(stream);
	return rc;
}
