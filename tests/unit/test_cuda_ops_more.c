/* Unit tests for the CUDA kernel table's entries of the shape, sequence
 * and loss layers (worker/cuda/ops/cuops_more.c): each against the CPU's
 * kernel of the same entry (hpu__be_host, the host loops the ops run on
 * the CPU), at awkward shapes: sizes of 1, odd sizes, batch 1, windows
 * with gaps and overlaps, padding on one axis, a 1-D convolution.
 *
 * Inputs are made on the host, copied to the GPU, run through the table
 * on a stream of our own and copied back; every check prints its
 * largest difference (or "bit-identical"). Entries whose GPU kernel
 * computes each output in the host loop's order (reduce, row copies,
 * zeroing, permute, pooling, the MSE's and sigmoid's backwards) agree
 * bit for bit; the rest within 1e-5 relative to a tenth of the array's
 * largest value (as test_cuda_ops). Fused attention (cuops_flash.cu)
 * is held within 1e-4 against the layer's unfused math in double and
 * the host's rows; its tensor-core tiles (cuops_flash16.cu) against the
 * same tiles run on the CPU. `test_cuda_ops_more --bench` times both
 * fused kernels at a GPT-2 124M layer's shape instead (a figure). Without a visible GPU the program says why and exits
 * 77 (ctest: skipped).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "tests/unit/attn_ref.h"
#include "tests/unit/cuda_testlib.h"
#include "tests/unit/num_testlib.h"

#include "worker/cuda/cuda_device.h"
#include "worker/cuda/cuda_ops.h"
#include "worker/ops/autocast.h"
#include "worker/ops/backend.h"
#include "worker/ops/flash_tiles.h"

#include "hpu/ops.h"

#define TOL 1e-5
#define FLASH_TOL 1e-4

int hpu_cuda_capture_tests(const hpu__backend *gpu_, cudaStream_t caller); /* test_cuda_capture.c */

static const hpu__backend *gpu, *cpu;
static cudaStream_t stream;

/* The GPU's result of `bytes` at d against the host's at want. */
static void check_dev_bits(const char *what, const void *d, const void *want, size_t bytes)
{
	void *got = xcalloc(bytes ? bytes : 1, 1);
	dget(got, d, bytes);
	check_bits(what, got, want, bytes);
	free(got);
}

static void check_dev(const char *what, const float *d, const float *want, size_t n, double tol)
{
	float *got = xcalloc(n, sizeof *got);
	dget(got, d, n * sizeof *got);
	check(what, got, want, n, tol);
	free(got);
}

#define OK(call) assert_int_equal((call), HPU_BE_OK)

/* ---- reduce ---- */

static void reduce_one(int op, size_t outer, size_t n, size_t inner)
{
	static const char *names[] = {"sum", "mean", "max"};
	size_t nx = outer * n * inner, ny = outer * inner;
	float *x = xcalloc(nx, 4), *y = xcalloc(ny, 4), *dy = xcalloc(ny, 4), *dx = xcalloc(nx, 4);
	int32_t *idx = xcalloc(ny, 4);
	char what[96];
	fill(x, nx, -2, 2);
	fill(dy, ny, -1, 1);
	if (op == 2 && nx > 3)
		x[2] = x[0]; /* a tie: the first maximum wins */
	OK(cpu->reduce_fwd(op, x, y, op == 2 ? idx : NULL, outer, n, inner));
	OK(cpu->reduce_bwd(op, dy, idx, dx, outer, n, inner));
	float *gx = dput(x, nx * 4), *gy = dnan(ny * 4), *gdy = dput(dy, ny * 4);
	float *gdx = dnan(nx * 4);
	int32_t *gidx = dnan(ny * 4);
	OK(gpu->reduce_fwd(op, gx, gy, op == 2 ? gidx : NULL, outer, n, inner));
	snprintf(what, sizeof what, "reduce %s [%zu, %zu, %zu]", names[op], outer, n, inner);
	check_dev_bits(what, gy, y, ny * 4);
	if (op == 2) {
		snprintf(what, sizeof what, "reduce max [%zu, %zu, %zu] arg-max", outer, n, inner);
		check_dev_bits(what, gidx, idx, ny * 4);
		assert_int_equal(cudaMemcpy(gidx, idx, ny * 4, cudaMemcpyHostToDevice), cudaSuccess);
	}
	OK(gpu->reduce_bwd(op, gdy, gidx, gdx, outer, n, inner));
	snprintf(what, sizeof what, "reduce %s backward [%zu, %zu, %zu]", names[op], outer, n,
		 inner);
	check_dev_bits(what, gdx, dx, nx * 4);
	dfree(gx), dfree(gy), dfree(gdy), dfree(gdx), dfree(gidx);
	free(x), free(y), free(dy), free(dx), free(idx);
}

static void test_reduce(void **state)
{
	(void)state;
	static const size_t shapes[][3] = {{1, 1, 1}, {3, 7, 5}, {1, 13, 1}, {5, 4, 33}, {2, 1, 9}};
	for (int op = 0; op < 3; op++)
		for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
			reduce_one(op, shapes[i][0], shapes[i][1], shapes[i][2]);
}

/* ---- row copies, zeroing, permute ---- */

static void rows_one(size_t outer, size_t nx, size_t x0, size_t ny, size_t y0, size_t len,
		     size_t inner)
{
	size_t sx = outer * nx * inner, sy = outer * ny * inner;
	float *x = xcalloc(sx, 4), *y = xcalloc(sy, 4);
	char what[96];
	fill(x, sx, -1, 1);
	fill(y, sy, -1, 1); /* the rows not copied stay */
	float *gx = dput(x, sx * 4), *gy = dput(y, sy * 4);
	OK(cpu->copy_rows(x, y, outer, nx, x0, ny, y0, len, inner));
	OK(gpu->copy_rows(gx, gy, outer, nx, x0, ny, y0, len, inner));
	snprintf(what, sizeof what, "copy_rows outer %zu, %zu [%zu..+%zu) -> %zu at %zu, inner %zu",
		 outer, nx, x0, len, ny, y0, inner);
	check_dev_bits(what, gy, y, sy * 4);
	dfree(gx), dfree(gy);
	free(x), free(y);
}

static void test_rows(void **state)
{
	(void)state;
	rows_one(3, 7, 2, 9, 4, 3, 5);
	rows_one(1, 5, 0, 5, 0, 5, 1);
	rows_one(4, 8, 7, 1, 0, 1, 3);
	rows_one(2, 3, 1, 6, 2, 2, 1);
	size_t n = 1001;
	float *z = xcalloc(n, 4);
	float *gz = dnan(n * 4);
	OK(gpu->zero(gz, n * 4 - 4)); /* the last float stays NaN */
	float *got = xcalloc(n, 4);
	dget(got, gz, n * 4);
	check_bits("zero 1000 floats of 1001", got, z, (n - 1) * 4);
	assert_true(isnan(got[n - 1]));
	free(got), free(z);
	dfree(gz);
}

static void permute_one(int ndim, const int64_t *shape, const int *perm)
{
	size_t n = 1;
	char what[96];
	int at = snprintf(what, sizeof what, "permute [");
	for (int d = 0; d < ndim; d++) {
		n *= (size_t)shape[d];
		at += snprintf(what + at, sizeof what - (size_t)at, "%s%lld", d ? ", " : "",
			       (long long)shape[d]);
	}
	at += snprintf(what + at, sizeof what - (size_t)at, "] by (");
	for (int d = 0; d < ndim; d++)
		at += snprintf(what + at, sizeof what - (size_t)at, "%s%d", d ? " " : "", perm[d]);
	snprintf(what + at, sizeof what - (size_t)at, ")");
	float *x = xcalloc(n, 4), *y = xcalloc(n, 4);
	fill(x, n, -1, 1);
	OK(cpu->permute(x, y, ndim, shape, perm));
	float *gx = dput(x, n * 4), *gy = dnan(n * 4);
	OK(gpu->permute(gx, gy, ndim, shape, perm));
	check_dev_bits(what, gy, y, n * 4);
	dfree(gx), dfree(gy);
	free(x), free(y);
}

static void test_permute(void **state)
{
	(void)state;
	const int64_t s1[] = {7}, s2[] = {2, 3, 5}, s3[] = {1, 3, 1, 7}, s4[] = {3, 5};
	const int p1[] = {0}, p2[] = {2, 0, 1}, p3[] = {3, 1, 0, 2}, p4[] = {1, 0};
	const int64_t s5[] = {2, 1, 3, 2, 1, 5, 1, 3};
	const int p5[] = {7, 5, 3, 1, 0, 2, 4, 6};
	permute_one(1, s1, p1);
	permute_one(3, s2, p2);
	permute_one(4, s3, p3);
	permute_one(2, s4, p4);
	permute_one(8, s5, p5);
}

/* ---- sigmoid ---- */

static void test_sigmoid(void **state)
{
	(void)state;
	size_t n = 1037;
	float *x = xcalloc(n, 4), *y = xcalloc(n, 4), *dy = xcalloc(n, 4), *dx = xcalloc(n, 4);
	fill(x, n, -20, 20);
	x[0] = 0.0f, x[1] = -0.0f, x[2] = 90.0f, x[3] = -90.0f;
	fill(dy, n, -1, 1);
	OK(cpu->sigmoid_fwd(x, y, n));
	OK(cpu->sigmoid_bwd(y, dy, dx, n));
	float *gx = dput(x, n * 4), *gy = dnan(n * 4), *gdy = dput(dy, n * 4);
	float *gdx = dnan(n * 4);
	OK(gpu->sigmoid_fwd(gx, gy, n));
	check_dev("sigmoid forward, 1037 in [-20, 20] and 0, -0, +-90", gy, y, n, TOL);
	assert_int_equal(cudaMemcpy(gy, y, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
	OK(gpu->sigmoid_bwd(gy, gdy, gdx, n));
	check_dev_bits("sigmoid backward (from the host's y)", gdx, dx, n * 4);
	dfree(gx), dfree(gy), dfree(gdy), dfree(gdx);
	free(x), free(y), free(dy), free(dx);
}

/* ---- pooling along one axis ---- */

static void pool1d_one(int max, size_t outer, int n, size_t inner, int k, int stride)
{
	int on = (n - k) / stride + 1;
	size_t nx = outer * (size_t)n * inner, ny = outer * (size_t)on * inner;
	float *x = xcalloc(nx, 4), *y = xcalloc(ny, 4), *dy = xcalloc(ny, 4), *dx = xcalloc(nx, 4);
	int32_t *idx = xcalloc(ny, 4);
	char what[96];
	fill(x, nx, -2, 2);
	fill(dy, ny, -1, 1);
	OK(cpu->pool1d_fwd(max, x, y, max ? idx : NULL, outer, n, inner, k, stride));
	OK(cpu->pool1d_bwd(max, dy, max ? idx : NULL, dx, outer, n, inner, k, stride));
	float *gx = dput(x, nx * 4), *gy = dnan(ny * 4), *gdy = dput(dy, ny * 4);
	float *gdx = dnan(nx * 4);
	int32_t *gidx = dnan(ny * 4);
	const char *name = max ? "maxpool1d" : "avgpool1d";
	OK(gpu->pool1d_fwd(max, gx, gy, max ? gidx : NULL, outer, n, inner, k, stride));
	snprintf(what, sizeof what, "%s [%zu, %d, %zu] k %d stride %d", name, outer, n, inner, k,
		 stride);
	check_dev_bits(what, gy, y, ny * 4);
	if (max) {
		snprintf(what, sizeof what, "%s [%zu, %d, %zu] k %d stride %d arg-max", name, outer,
			 n, inner, k, stride);
		check_dev_bits(what, gidx, idx, ny * 4);
		assert_int_equal(cudaMemcpy(gidx, idx, ny * 4, cudaMemcpyHostToDevice), cudaSuccess);
	}
	OK(gpu->pool1d_bwd(max, gdy, max ? gidx : NULL, gdx, outer, n, inner, k, stride));
	snprintf(what, sizeof what, "%s backward [%zu, %d, %zu] k %d stride %d", name, outer, n,
		 inner, k, stride);
	check_dev_bits(what, gdx, dx, nx * 4);
	dfree(gx), dfree(gy), dfree(gdy), dfree(gdx), dfree(gidx);
	free(x), free(y), free(dy), free(dx), free(idx);
}

static void test_pool1d(void **state)
{
	(void)state;
	for (int max = 0; max < 2; max++) {
		pool1d_one(max, 3, 9, 5, 3, 2); /* overlapping windows */
		pool1d_one(max, 1, 7, 1, 7, 1); /* one window */
		pool1d_one(max, 2, 10, 3, 2, 3); /* gaps */
		pool1d_one(max, 1, 1, 4, 1, 1);
		pool1d_one(max, 4, 16, 1, 4, 4);
	}
}

/* ---- the rectangular convolution ---- */

static void conv_rect_one(const hpu_conv2d_rect_shape *s, int bias)
{
	int oh = hpu_conv2d_rect_out_h(s), ow = hpu_conv2d_rect_out_w(s);
	size_t nx = (size_t)s->batch * s->in_ch * s->height * s->width;
	size_t nw = (size_t)s->out_ch * s->in_ch * s->kernel_h * s->kernel_w;
	size_t ny = (size_t)s->batch * s->out_ch * oh * ow, ns = hpu_conv2d_rect_scratch(s);
	size_t no = (size_t)s->out_ch;
	float *x = xcalloc(nx, 4), *w = xcalloc(nw, 4), *b = xcalloc(no, 4), *y = xcalloc(ny, 4);
	float *dy = xcalloc(ny, 4), *dx = xcalloc(nx, 4), *dw = xcalloc(nw, 4), *db = xcalloc(no, 4);
	float *scr = xcalloc(ns, 4);
	char what[160], shape[120];
	snprintf(shape, sizeof shape, "B%d C%d %dx%d O%d k%dx%d s%dx%d p%dx%d%s", s->batch,
		 s->in_ch, s->height, s->width, s->out_ch, s->kernel_h, s->kernel_w, s->stride_h,
		 s->stride_w, s->pad_h, s->pad_w, bias ? " bias" : "");
	fill(x, nx, -1, 1);
	fill(w, nw, -1, 1);
	fill(b, no, -1, 1);
	fill(dy, ny, -1, 1);
	fill(dw, nw, -1, 1); /* accumulated into */
	fill(db, no, -1, 1);
	float *gx = dput(x, nx * 4), *gw = dput(w, nw * 4), *gb = dput(b, no * 4);
	float *gdy = dput(dy, ny * 4), *gdw = dput(dw, nw * 4), *gdb = dput(db, no * 4);
	float *gy = dnan(ny * 4), *gdx = dnan(nx * 4), *gscr = dnan(ns * 4);
	OK(cpu->conv_rect_fwd(s, x, w, bias ? b : NULL, y, scr));
	OK(cpu->conv_rect_bwd(s, x, w, dy, dx, dw, bias ? db : NULL, scr));
	OK(gpu->conv_rect_fwd(s, gx, gw, bias ? gb : NULL, gy, gscr));
	snprintf(what, sizeof what, "conv_rect %s", shape);
	check_dev(what, gy, y, ny, TOL);
	OK(gpu->conv_rect_bwd(s, gx, gw, gdy, gdx, gdw, bias ? gdb : NULL, gscr));
	snprintf(what, sizeof what, "conv_rect dx %s", shape);
	check_dev(what, gdx, dx, nx, TOL);
	snprintf(what, sizeof what, "conv_rect dw (+=) %s", shape);
	check_dev(what, gdw, dw, nw, TOL);
	snprintf(what, sizeof what, "conv_rect db (+=) %s", shape);
	check_dev(what, gdb, db, no, TOL);
	dfree(gx), dfree(gw), dfree(gb), dfree(gdy), dfree(gdw), dfree(gdb), dfree(gy);
	dfree(gdx), dfree(gscr);
	free(x), free(w), free(b), free(y), free(dy), free(dx), free(dw), free(db), free(scr);
}

static void test_conv_rect(void **state)
{
	(void)state;
	const hpu_conv2d_rect_shape shapes[] = {
		{1, 3, 5, 7, 4, 2, 3, 1, 2, 1, 0},  /* batch 1, padding on one axis */
		{2, 1, 1, 11, 3, 1, 3, 1, 1, 0, 1}, /* conv1d */
		{3, 2, 6, 5, 1, 3, 1, 2, 1, 1, 0},  /* stride 2 down, one output channel */
		{2, 4, 3, 3, 5, 1, 1, 1, 1, 0, 0},  /* 1x1 */
		{1, 2, 4, 4, 3, 4, 4, 1, 1, 2, 2},  /* padding 2 on both axes, k 4x4 */
	};
	for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
		conv_rect_one(&shapes[i], 1);
		conv_rect_one(&shapes[i], 0);
	}
}

/* ---- losses ---- */

/* kind 0 mse, 1 bce with logits, 2 bce of probabilities */
static void loss_one(int kind, int rows, size_t n, int want_dp, int want_dt)
{
	static const char *names[] = {"mse", "bce with logits", "bce"};
	size_t nn = (size_t)rows * n;
	float *p = xcalloc(nn, 4), *t = xcalloc(nn, 4), *loss = xcalloc(rows, 4);
	float *dl = xcalloc(rows, 4), *dp = xcalloc(nn, 4), *dt = xcalloc(nn, 4);
	char what[128];
	long bad = 7;
	float bv = 0;
	fill(p, nn, kind == 2 ? 0 : -4, kind == 2 ? 1 : 4);
	fill(t, nn, 0, 1);
	fill(dl, (size_t)rows, -1, 1);
	if (kind == 2 && nn > 2)
		p[0] = 0.0f, p[1] = 1.0f; /* the logs' clamp */
	float *gp = dput(p, nn * 4), *gt = dput(t, nn * 4), *gdl = dput(dl, (size_t)rows * 4);
	float *gl = dnan((size_t)rows * 4), *gdp = dnan(nn * 4), *gdt = dnan(nn * 4);
	if (kind == 0) {
		OK(cpu->mse_fwd(p, t, loss, rows, n));
		OK(cpu->mse_bwd(p, t, dl, want_dp ? dp : NULL, want_dt ? dt : NULL, rows, n));
		OK(gpu->mse_fwd(gp, gt, gl, rows, n));
		OK(gpu->mse_bwd(gp, gt, gdl, want_dp ? gdp : NULL, want_dt ? gdt : NULL, rows, n));
	} else {
		OK(cpu->bce_fwd(kind == 1, p, t, loss, rows, n, &bad, &bv));
		assert_int_equal(bad, -1);
		OK(cpu->bce_bwd(kind == 1, p, t, dl, want_dp ? dp : NULL, want_dt ? dt : NULL, rows,
				n));
		bad = 7;
		OK(gpu->bce_fwd(kind == 1, gp, gt, gl, rows, n, &bad, &bv));
		printf("  %-60s first bad %ld (want -1)\n", names[kind], bad);
		assert_int_equal(bad, -1);
		OK(gpu->bce_bwd(kind == 1, gp, gt, gdl, want_dp ? gdp : NULL, want_dt ? gdt : NULL,
				rows, n));
	}
	snprintf(what, sizeof what, "%s forward rows %d n %zu", names[kind], rows, n);
	check_dev(what, gl, loss, (size_t)rows, TOL);
	float *got = xcalloc(nn, 4);
	if (want_dp) {
		snprintf(what, sizeof what, "%s backward dpred rows %d n %zu", names[kind], rows, n);
		if (kind == 0)
			check_dev_bits(what, gdp, dp, nn * 4);
		else
			check_dev(what, gdp, dp, nn, TOL);
	}
	if (want_dt) {
		snprintf(what, sizeof what, "%s backward dtarget rows %d n %zu", names[kind], rows,
			 n);
		if (kind == 0)
			check_dev_bits(what, gdt, dt, nn * 4);
		else
			check_dev(what, gdt, dt, nn, TOL);
	}
	/* not wanted: not written (still NaN) */
	dget(got, want_dp ? gdt : gdp, nn * 4);
	if (!want_dp || !want_dt)
		for (size_t i = 0; i < nn; i++)
			assert_true(isnan(got[i]));
	free(got);
	dfree(gp), dfree(gt), dfree(gdl), dfree(gl), dfree(gdp), dfree(gdt);
	free(p), free(t), free(loss), free(dl), free(dp), free(dt);
}

static void test_losses(void **state)
{
	(void)state;
	for (int kind = 0; kind < 3; kind++) {
		loss_one(kind, 1, 1, 1, 1);
		loss_one(kind, 3, 17, 1, 1);
		loss_one(kind, 2, 1000, 1, 0);
		loss_one(kind, 5, 3, 0, 1);
	}
}

/* A probability outside [0, 1] and bad ids: the first one's index and value. */
static void test_first_bad(void **state)
{
	(void)state;
	int rows = 3;
	size_t n = 40, nn = (size_t)rows * n;
	float *p = xcalloc(nn, 4), *t = xcalloc(nn, 4);
	fill(p, nn, 0, 1);
	fill(t, nn, 0, 1);
	p[n + 3] = 1.5f;  /* row 1, element 3: the first */
	p[2 * n] = -0.25f;
	p[n + 30] = NAN;
	float *gp = dput(p, nn * 4), *gt = dput(t, nn * 4), *gl = dnan((size_t)rows * 4);
	long bad = -1, want = (long)n + 3;
	float bv = 0;
	OK(gpu->bce_fwd(0, gp, gt, gl, rows, n, &bad, &bv));
	printf("  bce: first probability outside [0, 1] at %ld value %g (want %ld, 1.5)\n", bad,
	       (double)bv, want);
	assert_int_equal(bad, want);
	assert_true(bv == 1.5f);
	dfree(gp), dfree(gt), dfree(gl);
	free(p), free(t);

	size_t m = 1000;
	int32_t *ids = xcalloc(m, 4);
	for (size_t i = 0; i < m; i++)
		ids[i] = (int32_t)(i % 2);
	int32_t *gids = dput(ids, m * 4);
	int32_t v = 0;
	OK(gpu->ids_first_bad(gids, m, 2, &bad, &v));
	printf("  ids_first_bad, 1000 valid: %ld (want -1)\n", bad);
	assert_int_equal(bad, -1);
	ids[937] = -3, ids[938] = 2, ids[999] = 7;
	assert_int_equal(cudaMemcpy(gids, ids, m * 4, cudaMemcpyHostToDevice), cudaSuccess);
	OK(gpu->ids_first_bad(gids, m, 2, &bad, &v));
	printf("  ids_first_bad: %ld value %d (want 937, -3)\n", bad, (int)v);
	assert_int_equal(bad, 937);
	assert_int_equal(v, -3);
	OK(gpu->ids_first_bad(gids, 0, 2, &bad, &v));
	assert_int_equal(bad, -1);
	dfree(gids);
	free(ids);
}

/* ---- causal attention ---- */

static void attention_one(int batch, int t, int heads, int hd)
{
	size_t d = (size_t)heads * hd, nq = (size_t)batch * t * 3 * d, no = (size_t)batch * t * d;
	size_t na = (size_t)batch * heads * t * t;
	float *qkv = xcalloc(nq, 4), *out = xcalloc(no, 4), *att = xcalloc(na, 4);
	float *dout = xcalloc(no, 4), *dqkv = xcalloc(nq, 4);
	char what[128];
	fill(qkv, nq, -1, 1);
	fill(dout, no, -1, 1);
	OK(cpu->attention_fwd(qkv, out, att, batch, t, heads, hd));
	OK(cpu->attention_bwd(qkv, att, dout, dqkv, batch, t, heads, hd));
	float *gq = dput(qkv, nq * 4), *go = dnan(no * 4), *ga = dnan(na * 4);
	float *gdo = dput(dout, no * 4), *gdq = dnan(nq * 4);
	OK(gpu->attention_fwd(gq, go, ga, batch, t, heads, hd));
	snprintf(what, sizeof what, "attention out B%d T%d heads %d hd %d", batch, t, heads, hd);
	check_dev(what, go, out, no, TOL);
	snprintf(what, sizeof what, "attention probabilities B%d T%d heads %d hd %d", batch, t,
		 heads, hd);
	check_dev(what, ga, att, na, TOL);
	/* the backward from the host's probabilities */
	assert_int_equal(cudaMemcpy(ga, att, na * 4, cudaMemcpyHostToDevice), cudaSuccess);
	OK(gpu->attention_bwd(gq, ga, gdo, gdq, batch, t, heads, hd));
	snprintf(what, sizeof what, "attention dqkv B%d T%d heads %d hd %d", batch, t, heads, hd);
	check_dev(what, gdq, dqkv, nq, TOL);
	dfree(gq), dfree(go), dfree(ga), dfree(gdo), dfree(gdq);
	free(qkv), free(out), free(att), free(dout), free(dqkv);
}

static void test_attention(void **state)
{
	(void)state;
	attention_one(1, 1, 1, 1);
	attention_one(2, 5, 3, 4);
	attention_one(1, 17, 2, 8);
	attention_one(3, 130, 1, 5); /* more rows than a block's threads */
}

/* ---- fused attention (cuops_flash.cu) ----
 *
 * Against the layer's unfused math in double (attn_ref.c) and against
 * the host's rows (hpu__be_host()->flash_*, the same flash_rows.h code
 * test_flash_rows checks on every machine): ctx, lse, dqkv within 1e-4
 * of the array's largest value, and exact zeros for a query with no key. */

static void flash_ref_check(const char *what, const float *d, const double *want, size_t n,
			    const float *host)
{
	float *w = xcalloc(n, 4);
	for (size_t i = 0; i < n; i++)
		w[i] = (float)want[i];
	char line[160];
	snprintf(line, sizeof line, "%s vs double", what);
	check_dev(line, d, w, n, FLASH_TOL);
	snprintf(line, sizeof line, "%s vs host rows", what);
	check_dev(line, d, host, n, FLASH_TOL);
	free(w);
}

static void flash_one(int batch, int t, int heads, int hd, int causal, const int32_t *mask)
{
	size_t d = (size_t)heads * hd, bt = (size_t)batch * t;
	size_t nq = bt * 3 * d, no = bt * d, nl = (size_t)batch * heads * t;
	float *qkv = xcalloc(nq, 4), *ctx = xcalloc(no, 4), *lse = xcalloc(nl, 4);
	float *dctx = xcalloc(no, 4), *dqkv = xcalloc(nq, 4);
	double *rctx = xcalloc(no, 8), *rlse = xcalloc(nl, 8), *rdqkv = xcalloc(nq, 8);
	char what[128];
	fill(qkv, nq, -2, 2);
	fill(dctx, no, -1, 1);
	attn_ref(qkv, mask, dctx, batch, t, heads, hd, causal, rctx, rlse, rdqkv);
	OK(cpu->flash_fwd(qkv, mask, ctx, lse, batch, t, heads, hd, causal));
	OK(cpu->flash_bwd(qkv, mask, ctx, lse, dctx, dqkv, batch, t, heads, hd, causal));
	float *gq = dput(qkv, nq * 4), *gc = dnan(no * 4), *gl = dnan(nl * 4);
	float *gdc = dput(dctx, no * 4), *gdq = dnan(nq * 4);
	int32_t *gm = mask ? dput(mask, bt * 4) : NULL;
	OK(gpu->flash_fwd(gq, gm, gc, gl, batch, t, heads, hd, causal));
	snprintf(what, sizeof what, "fused attention ctx B%d T%d heads %d hd %d causal %d mask %d",
		 batch, t, heads, hd, causal, mask != NULL);
	flash_ref_check(what, gc, rctx, no, ctx);
	snprintf(what, sizeof what, "fused attention lse B%d T%d heads %d hd %d causal %d mask %d",
		 batch, t, heads, hd, causal, mask != NULL);
	flash_ref_check(what, gl, rlse, nl, lse);
	/* the backward from the host's ctx and lse */
	assert_int_equal(cudaMemcpy(gc, ctx, no * 4, cudaMemcpyHostToDevice), cudaSuccess);
	assert_int_equal(cudaMemcpy(gl, lse, nl * 4, cudaMemcpyHostToDevice), cudaSuccess);
	OK(gpu->flash_bwd(gq, gm, gc, gl, gdc, gdq, batch, t, heads, hd, causal));
	snprintf(what, sizeof what, "fused attention dqkv B%d T%d heads %d hd %d causal %d mask %d",
		 batch, t, heads, hd, causal, mask != NULL);
	flash_ref_check(what, gdq, rdqkv, nq, dqkv);
	/* a query with no key: zeros in ctx and dq; a padding key: in dk and dv */
	float *got = xcalloc(nq, 4), *gotc = xcalloc(no, 4);
	dget(got, gdq, nq * 4);
	OK(gpu->flash_fwd(gq, gm, gc, gl, batch, t, heads, hd, causal));
	dget(gotc, gc, no * 4);
	int empties, pads;
	assert_int_equal(attn_zeros_wrong(gotc, got, mask, batch, t, d, causal, &empties, &pads), 0);
	if (empties || pads)
		printf("  %d query rows with no key, %d padding keys: zeros\n", empties, pads);
	dfree(gq), dfree(gc), dfree(gl), dfree(gdc), dfree(gdq);
	if (gm)
		dfree(gm);
	free(got), free(gotc);
	free(qkv), free(ctx), free(lse), free(dctx), free(dqkv);
	free(rctx), free(rlse), free(rdqkv);
}

static void test_flash_attention(void **state)
{
	(void)state;
	int32_t *m300 = xcalloc(2 * 300, 4);
	for (int i = 0; i < 2 * 300; i++)
		m300[i] = i % 300 < 280 && i % 17 != 5;
	flash_one(1, 9, 2, 24, 1, NULL);
	flash_one(1, 9, 2, 24, 0, NULL);
	flash_one(2, 7, 3, 64, 1, attn_mask7);
	flash_one(2, 7, 3, 64, 0, attn_mask7);
	flash_one(3, 13, 2, 24, 0, attn_mask13);
	flash_one(3, 13, 1, 64, 1, attn_mask13);
	flash_one(2, 1, 1, 1, 1, NULL);
	flash_one(2, 300, 2, 64, 1, m300); /* rows across blocks */
	flash_one(1, 130, 3, 24, 0, NULL);
	flash_one(1, 37, 2, 160, 1, NULL); /* hd above the local accumulators' 128 */
	/* hd 32 and 64 have kernels of their own (registers, dk and dv apart at 64) */
	flash_one(2, 300, 2, 32, 1, m300);
	flash_one(3, 13, 2, 32, 0, attn_mask13);
	flash_one(1, 200, 4, 64, 0, NULL);
	free(m300);
}

/* ---- fused attention on tensor cores (cuops_flash16.cu) ----
 *
 * The table's flash16 entries against flash_tiles.h's blocks run on the
 * CPU (hpu__ft_run_c: the same steps, the products in fp32 loops; what
 * test_flash_tiles holds against the layer's math on every machine)
 * within 5e-3 of the array's largest value, and against that math in
 * double within 1e-2 (P and dS rounded to bf16); exact zeros for a query
 * with no key and a padding key's dk and dv; a head size the tiles do not
 * take is refused having written nothing. */

/* bits of n floats rounded to bf16 values on the host */
static void host_round16(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = hpu__ft_f32(hpu__ft_bf16(x[i]));
}

static void flash16_check(const char *what, const float *d, const float *tiles,
			  const double *want, size_t n)
{
	float *got = xcalloc(n, 4);
	dget(got, d, n * 4);
	double top = 1e-6, worst_t = 0, worst_d = 0;
	for (size_t i = 0; i < n; i++)
		top = fmax(top, fabs(want[i]));
	for (size_t i = 0; i < n; i++) {
		double et = isnan(got[i]) ? INFINITY : fabs((double)got[i] - tiles[i]);
		double ed = isnan(got[i]) ? INFINITY : fabs((double)got[i] - want[i]);
		worst_t = et > worst_t ? et : worst_t;
		worst_d = ed > worst_d ? ed : worst_d;
	}
	printf("  %-52s vs CPU tiles %.3g, vs double %.3g (of %.3g)\n", what, worst_t / top,
	       worst_d / top, top);
	assert_true(worst_t <= 5e-3 * top);
	assert_true(worst_d <= 1e-2 * top);
	free(got);
}

static void flash16_one(int batch, int t, int heads, int hd, int causal, const int32_t *mask)
{
	size_t d = (size_t)heads * hd, bt = (size_t)batch * t;
	size_t nq = bt * 3 * d, no = bt * d, nl = (size_t)batch * heads * t;
	float *qkv = xcalloc(nq, 4), *ctx = xcalloc(no, 4), *lse = xcalloc(nl, 4);
	float *dctx = xcalloc(no, 4), *dqkv = xcalloc(nq, 4), *delta = xcalloc(nl, 4);
	double *rctx = xcalloc(no, 8), *rlse = xcalloc(nl, 8), *rdqkv = xcalloc(nq, 8);
	char what[128];
	fill(qkv, nq, -2, 2);
	fill(dctx, no, -1, 1);
	host_round16(qkv, nq); /* bf16 values, as autocast hands them over */
	host_round16(dctx, no);
	attn_ref(qkv, mask, dctx, batch, t, heads, hd, causal, rctx, rlse, rdqkv);
	hpu__flash_dims a = {batch, t, heads, hd, causal, 1.0f / sqrtf((float)hd)};
	assert_int_equal(hpu__ft_run_c(&a, qkv, mask, ctx, lse, dctx, delta, dqkv), 0);
	float *gq = dput(qkv, nq * 4), *gc = dnan(no * 4), *gl = dnan(nl * 4);
	float *gdc = dput(dctx, no * 4), *gdq = dnan(nq * 4);
	int32_t *gm = mask ? dput(mask, bt * 4) : NULL;
	OK(gpu->flash16_fwd(gq, gm, gc, gl, batch, t, heads, hd, causal));
	snprintf(what, sizeof what, "bf16 tiles ctx B%d T%d heads %d hd %d causal %d mask %d",
		 batch, t, heads, hd, causal, mask != NULL);
	flash16_check(what, gc, ctx, rctx, no);
	snprintf(what, sizeof what, "bf16 tiles lse B%d T%d heads %d hd %d causal %d mask %d",
		 batch, t, heads, hd, causal, mask != NULL);
	flash16_check(what, gl, lse, rlse, nl);
	/* the backward from the CPU tiles' ctx and lse */
	assert_int_equal(cudaMemcpy(gc, ctx, no * 4, cudaMemcpyHostToDevice), cudaSuccess);
	assert_int_equal(cudaMemcpy(gl, lse, nl * 4, cudaMemcpyHostToDevice), cudaSuccess);
	OK(gpu->flash16_bwd(gq, gm, gc, gl, gdc, gdq, batch, t, heads, hd, causal));
	snprintf(what, sizeof what, "bf16 tiles dqkv B%d T%d heads %d hd %d causal %d mask %d",
		 batch, t, heads, hd, causal, mask != NULL);
	flash16_check(what, gdq, dqkv, rdqkv, nq);
	float *got = xcalloc(nq, 4), *gotc = xcalloc(no, 4);
	dget(got, gdq, nq * 4);
	OK(gpu->flash16_fwd(gq, gm, gc, gl, batch, t, heads, hd, causal));
	dget(gotc, gc, no * 4);
	int empties, pads;
	assert_int_equal(attn_zeros_wrong(gotc, got, mask, batch, t, d, causal, &empties, &pads), 0);
	dfree(gq), dfree(gc), dfree(gl), dfree(gdc), dfree(gdq);
	if (gm)
		dfree(gm);
	free(got), free(gotc), free(delta);
	free(qkv), free(ctx), free(lse), free(dctx), free(dqkv);
	free(rctx), free(rlse), free(rdqkv);
}

static void test_flash16(void **state)
{
	(void)state;
	int32_t *m300 = xcalloc(2 * 300, 4);
	for (int i = 0; i < 2 * 300; i++)
		m300[i] = i % 300 < 280 && i % 17 != 5;
	flash16_one(1, 9, 2, 16, 1, NULL);
	flash16_one(2, 7, 3, 64, 1, attn_mask7);
	flash16_one(2, 7, 3, 64, 0, attn_mask7);
	flash16_one(3, 13, 2, 48, 0, attn_mask13);
	flash16_one(1, 65, 1, 64, 1, NULL);
	flash16_one(2, 300, 2, 64, 1, m300);
	flash16_one(1, 200, 4, 32, 0, NULL);
	flash16_one(1, 150, 1, 128, 1, NULL);
	flash16_one(2, 1024, 2, 64, 1, NULL); /* GPT-2's T and hd */
	free(m300);
	/* hd 24: not the tiles' (a multiple of 16); nothing written */
	float *gq = dnan(3 * 24 * 4 * 9), *gc = dnan(24 * 4 * 9), *gl = dnan(4 * 9);
	float *c = xcalloc(24 * 9, 4);
	assert_int_equal(gpu->flash16_fwd(gq, NULL, gc, gl, 1, 9, 1, 24, 1), HPU_BE_UNSUPPORTED);
	dget(c, gc, 24 * 9 * 4);
	for (int i = 0; i < 24 * 9; i++)
		assert_true(isnan(c[i]));
	printf("  hd 24: refused, nothing written\n");
	dfree(gq), dfree(gc), dfree(gl);
	free(c);
}

static void *dev_alloc(size_t bytes)
{
	void *p = NULL;
	return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}

static void dev_release(void *p)
{
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
	cudaFree(p);
}

/* The public ops under bf16 autocast on the GPU's table run the tiles:
 * their ctx, lse and dqkv are the bits of flash16_fwd/bwd on the inputs
 * rounded (ctx and dqkv then rounded, as the ops round their outputs),
 * and not those of the fp32 kernel (flash_fwd). */
static void test_flash16_ops(void **state)
{
	(void)state;
	const int batch = 2, t = 65, heads = 2, hd = 64, causal = 1;
	size_t d = (size_t)heads * hd, bt = (size_t)batch * t;
	size_t nq = bt * 3 * d, no = bt * d, nl = (size_t)batch * heads * t;
	float *qkv = xcalloc(nq, 4), *dctx = xcalloc(no, 4), *ctx = xcalloc(no, 4);
	float *lse = xcalloc(nl, 4), *dqkv = xcalloc(nq, 4), *c32 = xcalloc(no, 4);
	fill(qkv, nq, -2, 2);
	fill(dctx, no, -1, 1);
	char err[256];
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_BF16, err, sizeof err), HPU_OK);
	hpu__ac_set_scratch_allocator(dev_alloc, dev_release);
	float *gq = dput(qkv, nq * 4), *gc = dnan(no * 4), *gl = dnan(nl * 4);
	float *gdc = dput(dctx, no * 4), *gdq = dnan(nq * 4);
	hpu__be_set(gpu);
	assert_int_equal(hpu_attention_fused_forward(gq, NULL, gc, gl, batch, t, heads, hd, causal),
			 HPU_OK);
	assert_int_equal(hpu_attention_fused_backward(gq, NULL, gc, gl, gdc, gdq, batch, t, heads,
						      hd, causal),
			 HPU_OK);
	hpu__be_set(NULL);
	dget(ctx, gc, no * 4);
	dget(lse, gl, nl * 4);
	dget(dqkv, gdq, nq * 4);
	/* the entries themselves on the rounded inputs */
	host_round16(qkv, nq);
	host_round16(dctx, no);
	float *rq = dput(qkv, nq * 4), *rc = dnan(no * 4), *rl = dnan(nl * 4);
	float *rdc = dput(dctx, no * 4), *rdq = dnan(nq * 4);
	float *want = xcalloc(nq, 4);
	OK(gpu->flash16_fwd(rq, NULL, rc, rl, batch, t, heads, hd, causal));
	dget(want, rc, no * 4);
	host_round16(want, no);
	check_bits("hpu_attention_fused_forward bf16: ctx of the tiles", ctx, want, no * 4);
	check_dev_bits("hpu_attention_fused_forward bf16: lse of the tiles", rl, lse, nl * 4);
	assert_int_equal(cudaMemcpy(rc, ctx, no * 4, cudaMemcpyHostToDevice), cudaSuccess);
	OK(gpu->flash16_bwd(rq, NULL, rc, rl, rdc, rdq, batch, t, heads, hd, causal));
	dget(want, rdq, nq * 4);
	host_round16(want, nq);
	check_bits("hpu_attention_fused_backward bf16: dqkv of the tiles", dqkv, want, nq * 4);
	/* the fp32 kernel's P is not rounded: other bits */
	OK(gpu->flash_fwd(rq, NULL, rc, rl, batch, t, heads, hd, causal));
	dget(c32, rc, no * 4);
	host_round16(c32, no);
	size_t differ = 0;
	for (size_t i = 0; i < no; i++)
		differ += c32[i] != ctx[i];
	printf("  the fp32 kernel differs from the tiles at %zu of %zu ctx values\n", differ, no);
	assert_true(differ > 0);
	hpu__ac_set_scratch_allocator(NULL, NULL);
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_NONE, err, sizeof err), HPU_OK);
	dfree(gq), dfree(gc), dfree(gl), dfree(gdc), dfree(gdq);
	dfree(rq), dfree(rc), dfree(rl), dfree(rdc), dfree(rdq);
	free(qkv), free(dctx), free(ctx), free(lse), free(dqkv), free(c32), free(want);
}

/* Every entry of this file's is in the table. */
/* ---- HPU_PROFILE_KERNELS: each kernel's GPU time by name ---- */

/* The count column of `name`'s row in a kernels-rank<R>.txt table, or -1. */
static long table_count(const char *table, const char *name)
{
	for (const char *l = table; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		size_t len = strcspn(l, "\n"), nl = strlen(name);
		double ms, pct;
		unsigned long long count;
		if (l[0] != '#' && len > nl && !strncmp(l + len - nl, name, nl) &&
		    l[len - nl - 1] == ' ' && sscanf(l, "%lf %lf %llu", &ms, &pct, &count) == 3)
			return (long)count;
	}
	return -1;
}

/* Five sigmoid launches and a copy in, timed by CUPTI: the table names
 * k_sigmoid_fwd with 5 launches (its grid and block), and the copy. */
static void test_kernel_times(void **state)
{
	(void)state;
#if !__has_include(<cupti.h>)
	printf("  skipped: this build's CUDA toolkit had no CUPTI headers\n");
	return;
#endif
	char dir[] = "/tmp/hpu-kprof-XXXXXX", path[64];
	assert_non_null(mkdtemp(dir));
	setenv("HPU_PROFILE_KERNELS", dir, 1);
	hpu__cuda_kprof_begin(7);
	size_t n = 100000;
	float *x = xcalloc(n, 4);
	fill(x, n, -1, 1);
	float *gx = dput(x, n * 4), *gy = dnan(n * 4);
	for (int i = 0; i < 5; i++)
		OK(gpu->sigmoid_fwd(gx, gy, n));
	assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
	hpu__cuda_kprof_end();
	unsetenv("HPU_PROFILE_KERNELS");
	snprintf(path, sizeof path, "%s/kernels-rank7.txt", dir);
	FILE *f = fopen(path, "r");
	if (!f)
		fail_msg("HPU_PROFILE_KERNELS wrote no %s (CUPTI not opened? the line above says "
			 "why; HPU_CUPTI_LIB names the library)", path);
	char table[16384];
	size_t got = fread(table, 1, sizeof table - 1, f);
	table[got] = '\0';
	fclose(f);
	printf("%s", table);
	assert_int_equal(table_count(table, "k_sigmoid_fwd"), 5);
	assert_true(table_count(table, "memcpy host to device") >= 1);
	unlink(path);
	rmdir(dir);
	dfree(gx), dfree(gy);
	free(x);
}

static void test_entries(void **state)
{
	(void)state;
	const void *f[] = {
		(const void *)gpu->reduce_fwd,	  (const void *)gpu->reduce_bwd,
		(const void *)gpu->copy_rows,	  (const void *)gpu->zero,
		(const void *)gpu->permute,	  (const void *)gpu->sigmoid_fwd,
		(const void *)gpu->sigmoid_bwd,	  (const void *)gpu->pool1d_fwd,
		(const void *)gpu->pool1d_bwd,	  (const void *)gpu->conv_rect_fwd,
		(const void *)gpu->conv_rect_bwd, (const void *)gpu->mse_fwd,
		(const void *)gpu->mse_bwd,	  (const void *)gpu->bce_fwd,
		(const void *)gpu->bce_bwd,	  (const void *)gpu->ids_first_bad,
		(const void *)gpu->attention_fwd, (const void *)gpu->attention_bwd,
		(const void *)gpu->flash_fwd,	  (const void *)gpu->flash_bwd,
		(const void *)gpu->flash16_fwd,	  (const void *)gpu->flash16_bwd,
	};
	for (size_t i = 0; i < sizeof f / sizeof *f; i++)
		assert_non_null(f[i]);
	printf("  %zu entries present\n", sizeof f / sizeof *f);
}

/* --bench: fused attention's kernels at one GPT-2 124M layer's shape
 * (B 16, T 1024, 12 heads of 64, causal), each forward and backward timed
 * with events over REPS calls after one warm-up: the bf16 tiles
 * (flash16_*) against the fp32 rows (flash_*), in ms a call and TFLOP/s
 * (the causal half of 4 B heads T^2 hd a forward, 10 a backward: FA2's
 * count). A figure, not a test: bench/flash_check.sh and bench/gpu.sh. */
static int bench_attention(void)
{
	const int batch = 16, t = 1024, heads = 12, hd = 64, causal = 1, reps = 5;
	size_t d = (size_t)heads * hd, bt = (size_t)batch * t;
	size_t nq = bt * 3 * d, no = bt * d, nl = (size_t)batch * heads * t;
	float *qkv = xcalloc(nq, 4), *dctx = xcalloc(no, 4);
	fill(qkv, nq, -2, 2);
	fill(dctx, no, -1, 1);
	host_round16(qkv, nq);
	host_round16(dctx, no);
	float *gq = dput(qkv, nq * 4), *gc = dnan(no * 4), *gl = dnan(nl * 4);
	float *gdc = dput(dctx, no * 4), *gdq = dnan(nq * 4);
	const double fwd_flop = 4.0 * batch * heads * (double)t * t * hd / 2;
	cudaEvent_t ev[3];
	for (int i = 0; i < 3; i++)
		if (cudaEventCreate(&ev[i]) != cudaSuccess)
			return 1;
	for (int tiles = 1; tiles >= 0; tiles--) {
		const char *name = tiles ? "bf16 tiles (flash16)" : "fp32 rows (flash)";
		int (*fw)(const float *, const int32_t *, float *, float *, int, int, int, int, int) =
			tiles ? gpu->flash16_fwd : gpu->flash_fwd;
		int (*bw)(const float *, const int32_t *, const float *, const float *, const float *,
			  float *, int, int, int, int, int) = tiles ? gpu->flash16_bwd : gpu->flash_bwd;
		int rc = fw(gq, NULL, gc, gl, batch, t, heads, hd, causal) |
			 bw(gq, NULL, gc, gl, gdc, gdq, batch, t, heads, hd, causal);
		cudaEventRecord(ev[0], stream);
		for (int r = 0; r < reps; r++)
			rc |= fw(gq, NULL, gc, gl, batch, t, heads, hd, causal);
		cudaEventRecord(ev[1], stream);
		for (int r = 0; r < reps; r++)
			rc |= bw(gq, NULL, gc, gl, gdc, gdq, batch, t, heads, hd, causal);
		cudaEventRecord(ev[2], stream);
		if (rc != HPU_BE_OK || cudaEventSynchronize(ev[2]) != cudaSuccess) {
			printf("bench: attention %s failed (%d)\n", name, rc);
			return 1;
		}
		float f = 0, b = 0;
		cudaEventElapsedTime(&f, ev[0], ev[1]);
		cudaEventElapsedTime(&b, ev[1], ev[2]);
		f /= reps, b /= reps;
		printf("bench: attention B%d T%d heads %d hd %d causal, %s: forward %.3f ms "
		       "(%.1f TFLOP/s), backward %.3f ms (%.1f TFLOP/s)\n",
		       batch, t, heads, hd, name, f, fwd_flop / f / 1e9, b,
		       2.5 * fwd_flop / b / 1e9);
	}
	for (int i = 0; i < 3; i++)
		cudaEventDestroy(ev[i]);
	dfree(gq), dfree(gc), dfree(gl), dfree(gdc), dfree(gdq);
	free(qkv), free(dctx);
	return 0;
}

int main(int argc, char **argv)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		printf("test_cuda_ops_more: skipped: no CUDA GPU visible (%s)\n",
		       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
		return 77;
	}
	if (cudaStreamCreate(&stream) != cudaSuccess) {
		printf("test_cuda_ops_more: cannot create a CUDA stream\n");
		return 1;
	}
	hpu__cuda_ops_set_stream(stream);
	cu_test_set_stream(stream);
	gpu = hpu__cuda_backend();
	cpu = hpu__be_host();
	rng_seed(35);
	if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
		int rc = bench_attention();
		hpu__cuda_ops_release();
		cudaStreamDestroy(stream);
		return rc;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_entries),	  cmocka_unit_test(test_reduce),
		cmocka_unit_test(test_rows),	  cmocka_unit_test(test_permute),
		cmocka_unit_test(test_sigmoid),	  cmocka_unit_test(test_pool1d),
		cmocka_unit_test(test_conv_rect), cmocka_unit_test(test_losses),
		cmocka_unit_test(test_first_bad), cmocka_unit_test(test_attention),
		cmocka_unit_test(test_flash_attention), cmocka_unit_test(test_flash16),
		cmocka_unit_test(test_flash16_ops),
		cmocka_unit_test(test_kernel_times),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	rc += hpu_cuda_capture_tests(gpu, stream); /* on a stream of its own */
	hpu__cuda_ops_release();
	cudaStreamDestroy(stream);
	return rc;
}
