/* The CUDA table's entries for the layers' own passes (worker/cuda/ops/
 * cuops_layers.c) against the host loops they replace (backend_host.h):
 * cross-entropy and accuracy over positions (ignored and bad labels
 * included; NaN logits' arg-max, with count_correct), the attention
 * layer's head copies and score masks, dropout by rows, batch norm in
 * training, evaluation and backward. Copies, masks,
 * dropout and accuracies agree bit for bit; the losses and batch norm
 * within 1e-5 relative (summation order). Part of test_cuda_ops, which
 * runs this group after its own (hpu_cuda_layer_tests). */
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

#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"

#include "hpu/hpu.h"

int hpu_cuda_layer_tests(const hpu__backend *gpu_, cudaStream_t stream_);

static const hpu__backend *gpu;
static cudaStream_t stream;

/* ---- cross-entropy and accuracy over positions ---- */

static void xent_one(int rows, size_t pos, int classes, int ignore_every, int bad_at)
{
	size_t at = (size_t)rows * pos, n = at * classes;
	float *x = xcalloc(n, 4), *lse = xcalloc(at, 4), *loss = xcalloc((size_t)rows, 4);
	float *dloss = xcalloc((size_t)rows, 4), *dx = xcalloc(n, 4), *acc = xcalloc((size_t)rows, 4);
	float *g = xcalloc(n, 4);
	int32_t *lab = xcalloc(at, 4);
	fill(x, n, -8, 8);
	fill(dloss, (size_t)rows, 0.5f, 2);
	for (size_t i = 0; i < at; i++)
		lab[i] = ignore_every && i % ignore_every == 1 ? -100
						       : (int32_t)rng_uniform(0, (float)classes) % classes;
	if (bad_at >= 0)
		lab[bad_at] = classes + 3;
	long hb = -2, gb = -2;
	int32_t hl = 0, gl = 0;
	assert_int_equal(hpu__host_xent_pos_fwd(x, lab, lse, loss, rows, pos, classes, &hb, &hl),
			 HPU_BE_OK);
	float *dx_ = dput(x, n * 4), *dlse = dput(lse, at * 4), *dlo = dput(loss, rows * 4UL);
	int32_t *dl = dput(lab, at * 4);
	float *got = xcalloc(n, 4);
	char line[128];
	assert_int_equal(gpu->xent_pos_fwd(dx_, dl, dlse, dlo, rows, pos, classes, &gb, &gl),
			 HPU_BE_OK);
	snprintf(line, sizeof line, "xent_pos_fwd [%d,%zu,%d] bad position", rows, pos, classes);
	printf("  %-60s host %ld gpu %ld\n", line, hb, gb);
	assert_int_equal(gb, hb);
	if (hb >= 0) {
		assert_int_equal(gl, hl);
		long ab = -2;
		int32_t al = 0;
		float *dacc = dput(acc, rows * 4UL);
		assert_int_equal(gpu->accuracy_pos(dx_, dl, dacc, rows, pos, classes, &ab, &al),
				 HPU_BE_OK);
		assert_int_equal(ab, hb);
		assert_int_equal(al, hl);
		dfree(dacc);
		goto done;
	}
	dget(got, dlse, at * 4);
	snprintf(line, sizeof line, "xent_pos_fwd [%d,%zu,%d] lse", rows, pos, classes);
	check(line, got, lse, at, 1e-5);
	dget(got, dlo, rows * 4UL);
	snprintf(line, sizeof line, "xent_pos_fwd [%d,%zu,%d] loss", rows, pos, classes);
	check(line, got, loss, (size_t)rows, 1e-5);
	/* backward from the host's lse, so that only the pass differs */
	assert_int_equal(cudaMemcpy(dlse, lse, at * 4, cudaMemcpyHostToDevice), cudaSuccess);
	assert_int_equal(hpu__host_xent_pos_bwd(x, lab, lse, dloss, dx, rows, pos, classes),
			 HPU_BE_OK);
	float *ddl = dput(dloss, rows * 4UL), *dg = dput(g, n * 4);
	assert_int_equal(cudaMemset(dg, 0xff, n * 4), cudaSuccess);
	assert_int_equal(gpu->xent_pos_bwd(dx_, dl, dlse, ddl, dg, rows, pos, classes), HPU_BE_OK);
	dget(got, dg, n * 4);
	snprintf(line, sizeof line, "xent_pos_bwd [%d,%zu,%d] dx", rows, pos, classes);
	check(line, got, dx, n, 1e-5);
	long ab = -2, hab = -2;
	int32_t al = 0, hal = 0;
	assert_int_equal(hpu__host_accuracy_pos(x, lab, acc, rows, pos, classes, &hab, &hal),
			 HPU_BE_OK);
	float *dacc = dput(acc, rows * 4UL);
	assert_int_equal(cudaMemset(dacc, 0xff, rows * 4UL), cudaSuccess);
	assert_int_equal(gpu->accuracy_pos(dx_, dl, dacc, rows, pos, classes, &ab, &al),
			 HPU_BE_OK);
	assert_int_equal(ab, -1);
	dget(got, dacc, rows * 4UL);
	snprintf(line, sizeof line, "accuracy_pos [%d,%zu,%d]", rows, pos, classes);
	check_bits(line, got, acc, rows * 4UL);
	/* over the logits (the cross-entropy's backward in place, last: the
	 * logits are gone after it): the same bits as into dg above */
	dget(g, dg, n * 4);
	assert_int_equal(gpu->xent_pos_bwd(dx_, dl, dlse, ddl, dx_, rows, pos, classes), HPU_BE_OK);
	dget(got, dx_, n * 4);
	snprintf(line, sizeof line, "xent_pos_bwd [%d,%zu,%d] dx over x", rows, pos, classes);
	check_bits(line, got, g, n * 4);
	dfree(ddl), dfree(dg), dfree(dacc);
done:
	dfree(dx_), dfree(dlse), dfree(dlo), dfree(dl);
	free(x), free(lse), free(loss), free(dloss), free(dx), free(acc), free(g), free(lab);
	free(got);
}

static void test_xent_pos(void **state)
{
	(void)state;
	rng_seed(31);
	xent_one(1, 1, 1, 0, -1);
	xent_one(3, 5, 10, 3, -1);
	xent_one(2, 7, 1001, 4, -1);
	xent_one(1, 3, 50304, 0, -1);
	xent_one(2, 1, 7, 2, -1); /* a row with every position ignored */
	xent_one(3, 4, 9, 0, 6);  /* a bad label: its position and value */
}

/* Accuracy over rows with NaN logits (in column 0, elsewhere, all),
 * infinities and ties, at class counts below and above a block's
 * threads: count_correct and accuracy_pos on the GPU take the host's
 * arg-max (a NaN in column 0 is it, other NaNs never are), labels at it
 * and beside it. */
static void argmax_nan_one(int rows, int classes)
{
	size_t n = (size_t)rows * classes;
	float *x = xcalloc(n, 4), acc = -1, want_acc = -2;
	int32_t *lab = xcalloc((size_t)rows, 4);
	fill(x, n, -4, 4);
	for (int r = 0; r < rows; r++) {
		float *z = x + (size_t)r * classes;
		switch (r % 6) {
		case 0: /* column 0: the arg-max */
			z[0] = NAN;
			break;
		case 1: /* elsewhere: never */
			z[(r * 7) % classes] = NAN;
			z[classes - 1] = 100;
			break;
		case 2:
			for (int c = 0; c < classes; c++)
				z[c] = NAN;
			break;
		case 3:
			z[classes / 2] = NAN;
			z[0] = INFINITY;
			break;
		case 4: /* ties between NaNs */
			for (int c = 1; c < classes; c++)
				z[c] = c % 2 ? NAN : 3;
			break;
		default:
			break;
		}
		int best = -1;
		for (int y = 0; y < classes && best < 0; y++) {
			int hit = 0;
			hpu__host_count_correct(z, &y, 1, classes, &hit);
			best = hit ? y : -1;
		}
		lab[r] = r % 4 == 3 ? (best + 1) % classes : best;
	}
	int want = -1, got = -2;
	long hb = -2, gb = -2;
	int32_t hl = 0, gl = 0;
	hpu__host_count_correct(x, lab, rows, classes, &want);
	assert_int_equal(hpu__host_accuracy_pos(x, lab, &want_acc, 1, (size_t)rows, classes, &hb,
						&hl),
			 HPU_BE_OK);
	float *dx_ = dput(x, n * 4), *dacc = dnan(4);
	int32_t *dl = dput(lab, (size_t)rows * 4);
	assert_int_equal(gpu->count_correct(dx_, dl, rows, classes, &got), HPU_BE_OK);
	assert_int_equal(gpu->accuracy_pos(dx_, dl, dacc, 1, (size_t)rows, classes, &gb, &gl),
			 HPU_BE_OK);
	dget(&acc, dacc, 4);
	printf("  %d rows of %d classes with NaNs: count_correct %d (the host's %d), "
	       "accuracy_pos %.6f (the host's %.6f)%s\n",
	       rows, classes, got, want, acc, want_acc,
	       got == want && acc == want_acc ? "" : "  FAIL");
	assert_int_equal(got, want);
	assert_int_equal(gb, -1);
	check_bits("accuracy_pos with NaNs", &acc, &want_acc, 4);
	dfree(dx_), dfree(dacc), dfree(dl);
	free(x), free(lab);
}

static void test_argmax_nan(void **state)
{
	(void)state;
	rng_seed(35);
	argmax_nan_one(12, 1);
	argmax_nan_one(24, 3);
	argmax_nan_one(36, 13);
	argmax_nan_one(30, 1001);
}

/* ---- the attention layer's passes ---- */

static void test_heads_and_masks(void **state)
{
	(void)state;
	rng_seed(32);
	static const int shapes[][4] = {{1, 1, 1, 1}, {2, 3, 5, 4}, {3, 2, 17, 8}};
	char line[128];
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int b = shapes[s][0], h = shapes[s][1], t = shapes[s][2], hd = shapes[s][3];
		size_t ld = (size_t)3 * h * hd + 1, ns = (size_t)b * t * ld, nm = (size_t)b * h * t * hd;
		float *src = xcalloc(ns, 4), *want = xcalloc(ns, 4), *got = xcalloc(ns, 4);
		fill(src, ns, -2, 2);
		float *ds = dput(src, ns * 4), *dm = dput(want, nm * 4), *db = dput(want, ns * 4);
		assert_int_equal(hpu__host_heads(0, src, want, ld, b, h, t, hd, 0.125f), HPU_BE_OK);
		assert_int_equal(gpu->heads(0, ds, dm, ld, b, h, t, hd, 0.125f), HPU_BE_OK);
		dget(got, dm, nm * 4);
		snprintf(line, sizeof line, "heads split [%d,%d,%d,%d] ld %zu", b, h, t, hd, ld);
		check_bits(line, got, want, nm * 4);
		/* merge back into a strided buffer, its gaps kept */
		float *back = xcalloc(ns, 4);
		memcpy(back, src, ns * 4);
		assert_int_equal(cudaMemcpy(db, back, ns * 4, cudaMemcpyHostToDevice), cudaSuccess);
		assert_int_equal(hpu__host_heads(1, want, back, ld, b, h, t, hd, 2.0f), HPU_BE_OK);
		assert_int_equal(gpu->heads(1, dm, db, ld, b, h, t, hd, 2.0f), HPU_BE_OK);
		dget(got, db, ns * 4);
		snprintf(line, sizeof line, "heads merge [%d,%d,%d,%d] ld %zu", b, h, t, hd, ld);
		check_bits(line, got, back, ns * 4);
		/* scores [b, h, t, t]: causal or not, a key mask with one sample
		 * masked whole, before and after the softmax */
		size_t na = (size_t)b * h * t * t;
		int32_t *mask = xcalloc((size_t)b * t, 4);
		for (size_t i = 0; i < (size_t)b * t; i++)
			mask[i] = (i / t == 1) ? 0 : (int32_t)(i % 3 != 2);
		int32_t *dmask = dput(mask, (size_t)b * t * 4);
		float *att = xcalloc(na, 4), *aw = xcalloc(na, 4), *ag = xcalloc(na, 4);
		fill(att, na, -3, 3);
		float *da = dput(att, na * 4);
		for (int causal = 0; causal < 2; causal++)
			for (int withmask = 0; withmask < 2; withmask++)
				for (int after = 0; after < 2; after++) {
					memcpy(aw, att, na * 4);
					assert_int_equal(cudaMemcpy(da, att, na * 4,
								    cudaMemcpyHostToDevice),
							 cudaSuccess);
					const int32_t *hm = withmask ? mask : NULL;
					const int32_t *gm = withmask ? dmask : NULL;
					assert_int_equal(hpu__host_mask_scores(aw, hm, b, h, t, causal,
									       after),
							 HPU_BE_OK);
					assert_int_equal(gpu->mask_scores(da, gm, b, h, t, causal,
									  after),
							 HPU_BE_OK);
					dget(ag, da, na * 4);
					snprintf(line, sizeof line,
						 "mask_scores [%d,%d,%d] causal %d mask %d after %d", b,
						 h, t, causal, withmask, after);
					check_bits(line, ag, aw, na * 4);
				}
		dfree(ds), dfree(dm), dfree(db), dfree(dmask), dfree(da);
		free(src), free(want), free(got), free(back), free(mask), free(att), free(aw);
		free(ag);
	}
}

/* ---- dropout by rows ---- */

static void test_dropout_rows(void **state)
{
	(void)state;
	rng_seed(33);
	static const int shapes[][2] = {{1, 1}, {5, 37}, {64, 1000}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int rows = shapes[s][0];
		size_t n = (size_t)shapes[s][1], all = rows * n;
		float *x = xcalloc(all, 4), *want = xcalloc(all, 4), *got = xcalloc(all, 4);
		uint64_t *keys = xcalloc((size_t)rows, 8);
		fill(x, all, -1, 1);
		for (int r = 0; r < rows; r++)
			keys[r] = 0x1234567ull * (uint64_t)(r + 1) ^ (uint64_t)s << 40;
		uint32_t cut = (uint32_t)(0.3 * 4294967296.0);
		assert_int_equal(hpu__host_dropout_rows(x, want, keys, 0, rows, n, cut, 1 / 0.7f),
				 HPU_BE_OK);
		float *dx = dput(x, all * 4), *dy = dput(got, all * 4);
		assert_int_equal(gpu->dropout_rows(dx, dy, keys, 0, rows, n, cut, 1 / 0.7f),
				 HPU_BE_OK);
		dget(got, dy, all * 4);
		char line[96];
		snprintf(line, sizeof line, "dropout_rows [%d,%zu]", rows, n);
		check_bits(line, got, want, all * 4);
		/* the keys made on the device, then read from there: rand.c's */
		uint32_t *samples = xcalloc((size_t)rows, 4);
		int64_t step = 123456789012345ll * (int64_t)(s + 1);
		for (int r = 0; r < rows; r++)
			samples[r] = 4000000000u - (uint32_t)r * 7919u;
		uint64_t *dk = dput(keys, (size_t)rows * 8), *hk = xcalloc((size_t)rows, 8);
		uint32_t *ds = dput(samples, (size_t)rows * 4);
		int64_t *dst = dput(&step, sizeof step);
		assert_int_equal(gpu->dropout_keys(dk, ds, dst, 0xfedcba9876543210ull, 7, rows),
				 HPU_BE_OK);
		dget(hk, dk, (size_t)rows * 8);
		hpu_ctx c = {.train = 1, .step = step, .layer = 7, .seed = 0xfedcba9876543210ull,
			     .batch = rows, .samples = samples};
		for (int r = 0; r < rows; r++)
			keys[r] = hpu_rand_key(&c, r);
		snprintf(line, sizeof line, "dropout_keys [%d]", rows);
		check_bits(line, hk, keys, (size_t)rows * 8);
		assert_int_equal(gpu->dropout_rows(dx, dy, dk, 1, rows, n, cut, 1 / 0.7f), HPU_BE_OK);
		assert_int_equal(hpu__host_dropout_rows(x, want, keys, 0, rows, n, cut, 1 / 0.7f),
				 HPU_BE_OK);
		dget(got, dy, all * 4);
		snprintf(line, sizeof line, "dropout_rows [%d,%zu], device keys", rows, n);
		check_bits(line, got, want, all * 4);
		dfree(dx), dfree(dy), dfree(dk), dfree(ds), dfree(dst);
		free(samples), free(hk);
		free(x), free(want), free(got), free(keys);
	}
}

/* ---- batch norm ---- */

static void bn_one(int batch, int ch, size_t spatial)
{
	size_t n = (size_t)batch * ch * spatial;
	float *x = xcalloc(n, 4), *dy = xcalloc(n, 4), *y = xcalloc(n, 4), *dx = xcalloc(n, 4);
	float *got = xcalloc(n, 4), *w = xcalloc((size_t)ch, 4), *bias = xcalloc((size_t)ch, 4);
	float *rm = xcalloc((size_t)ch, 4), *rv = xcalloc((size_t)ch, 4);
	float *saved = xcalloc(2 * (size_t)ch, 4), *dw = xcalloc((size_t)ch, 4);
	float *dbias = xcalloc((size_t)ch, 4);
	fill(x, n, -3, 5), fill(dy, n, -1, 1), fill(w, ch, 0.5f, 1.5f), fill(bias, ch, -1, 1);
	fill(rm, ch, -0.1f, 0.1f), fill(rv, ch, 0.9f, 1.1f), fill(dw, ch, -1, 1);
	fill(dbias, ch, -1, 1);
	float *gx = dput(x, n * 4), *gdy = dput(dy, n * 4), *gy = dput(y, n * 4);
	float *gdx = dput(dx, n * 4), *gw = dput(w, ch * 4UL), *gb = dput(bias, ch * 4UL);
	float *grm = dput(rm, ch * 4UL), *grv = dput(rv, ch * 4UL);
	float *gs = dput(saved, 2 * ch * 4UL), *gdw = dput(dw, ch * 4UL), *gdb = dput(dbias, ch * 4UL);
	char line[128];
	/* evaluation, from the running statistics */
	assert_int_equal(hpu__host_batchnorm_fwd(x, y, w, bias, rm, rv, NULL, batch, ch, spatial,
						 1e-5f, 0.1f, 0, 0),
			 HPU_BE_OK);
	assert_int_equal(gpu->batchnorm_fwd(gx, gy, gw, gb, grm, grv, NULL, batch, ch, spatial,
					    1e-5f, 0.1f, 0, 0),
			 HPU_BE_OK);
	dget(got, gy, n * 4);
	snprintf(line, sizeof line, "batchnorm_fwd eval [%d,%d,%zu] y", batch, ch, spatial);
	check(line, got, y, n, 1e-5);
	/* training, the running statistics updated */
	assert_int_equal(hpu__host_batchnorm_fwd(x, y, w, bias, rm, rv, saved, batch, ch, spatial,
						 1e-5f, 0.1f, 1, 1),
			 HPU_BE_OK);
	assert_int_equal(gpu->batchnorm_fwd(gx, gy, gw, gb, grm, grv, gs, batch, ch, spatial,
					    1e-5f, 0.1f, 1, 1),
			 HPU_BE_OK);
	dget(got, gy, n * 4);
	snprintf(line, sizeof line, "batchnorm_fwd train [%d,%d,%zu] y", batch, ch, spatial);
	check(line, got, y, n, 1e-5);
	dget(got, gs, 2 * ch * 4UL);
	snprintf(line, sizeof line, "batchnorm_fwd train [%d,%d,%zu] mean, rstd", batch, ch,
		 spatial);
	check(line, got, saved, 2 * (size_t)ch, 1e-5);
	dget(got, grv, ch * 4UL);
	snprintf(line, sizeof line, "batchnorm_fwd train [%d,%d,%zu] running var", batch, ch,
		 spatial);
	check(line, got, rv, (size_t)ch, 1e-5);
	/* backward from the host's saved statistics, into accumulating dw */
	assert_int_equal(cudaMemcpy(gs, saved, 2 * ch * 4UL, cudaMemcpyHostToDevice), cudaSuccess);
	for (int withdx = 0; withdx < 2; withdx++) {
		assert_int_equal(hpu__host_batchnorm_bwd(x, dy, w, saved, dw, dbias,
							 withdx ? dx : NULL, batch, ch, spatial),
				 HPU_BE_OK);
		assert_int_equal(gpu->batchnorm_bwd(gx, gdy, gw, gs, gdw, gdb, withdx ? gdx : NULL,
						    batch, ch, spatial),
				 HPU_BE_OK);
		dget(got, gdw, ch * 4UL);
		snprintf(line, sizeof line, "batchnorm_bwd [%d,%d,%zu] dw (accumulated)", batch, ch,
			 spatial);
		check(line, got, dw, (size_t)ch, 1e-5);
		dget(got, gdb, ch * 4UL);
		snprintf(line, sizeof line, "batchnorm_bwd [%d,%d,%zu] dbias", batch, ch, spatial);
		check(line, got, dbias, (size_t)ch, 1e-5);
	}
	dget(got, gdx, n * 4);
	snprintf(line, sizeof line, "batchnorm_bwd [%d,%d,%zu] dx", batch, ch, spatial);
	check(line, got, dx, n, 1e-5);
	dfree(gx), dfree(gdy), dfree(gy), dfree(gdx), dfree(gw), dfree(gb), dfree(grm);
	dfree(grv), dfree(gs), dfree(gdw), dfree(gdb);
	free(x), free(dy), free(y), free(dx), free(got), free(w), free(bias), free(rm), free(rv);
	free(saved), free(dw), free(dbias);
}

static void test_batchnorm(void **state)
{
	(void)state;
	rng_seed(34);
	bn_one(2, 1, 1);
	bn_one(3, 5, 7);
	bn_one(16, 64, 64);
	bn_one(1, 3, 1000);
}

int hpu_cuda_layer_tests(const hpu__backend *gpu_, cudaStream_t stream_)
{
	gpu = gpu_;
	stream = stream_;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_xent_pos),
		cmocka_unit_test(test_argmax_nan),
		cmocka_unit_test(test_heads_and_masks),
		cmocka_unit_test(test_dropout_rows),
		cmocka_unit_test(test_batchnorm),
	};
	return cmocka_run_group_tests_name("cuda layers", tests, NULL, NULL);
}
