/* Unit tests for the runtime's ops on the device (hpu__dev_rtops,
 * worker/device/device.h): each op run through the cpu device and
 * through the strict CPU device, its buffers device memory, against plain
 * C written here from the ops' contracts, bit for bit: the 16-bit casts,
 * accumulation, the bf16 activations, adds, sums of squares, the
 * non-finite checks and counts, an evaluation's sums (rows_add,
 * loss_add), and the optimizers' update through
 * optim.h's public functions; dropout's masks against the formula every
 * device must draw, and the ops' kernels a device table provides. On
 * cpu-strict no test opens the device
 * itself: an op that still ran on the host would fault and the program
 * exit naming the block. And the devices' capabilities. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "hpu/ops.h"
#include "tests/unit/step_testlib.h"
#include "worker/device/device.h"
#include "worker/strategy/optim.h"
#include "common/lowp.h"

#define MiB (1024ull * 1024)
#define N 3001   /* blocks of 256 and a tail */
#define CHUNK 1000 /* the scratch of the 16-bit ops: chunks and a tail */

static const char *const devices[] = {"cpu", "cpu-strict"};

static void open_dev(const char *name)
{
	char err[256] = "";
	if (hpu__dev_open(name, 0, err, sizeof err) < 0)
		fail_msg("%s", err);
	assert_int_equal(hpu__devmem_init(256 * MiB, 0), 0);
}

static void close_dev(void)
{
	hpu__devmem_shutdown();
	hpu__dev_close();
}

/* n bytes of device memory holding src (zero when src is NULL). */
static void *dev_in(const void *src, size_t n)
{
	void *d = hpu__dev_alloc(HPU_MEM_OTHER, n, "test input");
	assert_non_null(d);
	if (src)
		hpu__dev_h2d(NULL, d, src, n);
	return d;
}

static void dev_out(void *dst, void *d, size_t n)
{
	hpu__dev_d2h(NULL, dst, d, n);
	hpu__dev_free(d);
}

/* Values of many magnitudes and both signs, from a fixed seed. */
static void values(float *x, size_t n, uint32_t seed, float scale)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		float u = (float)(seed >> 8) / (float)(1u << 24); /* [0, 1) */
		float e = ldexpf(1.0f, (int)(seed % 13) - 6);
		x[i] = (u - 0.5f) * e * scale;
	}
}

static uint16_t ref_to16(int fp16, float f)
{
	return fp16 ? hpu_to_fp16(f) : hpu_to_bf16(f);
}

static float ref_from16(int fp16, uint16_t h)
{
	return fp16 ? hpu_from_fp16(h) : hpu_from_bf16(h);
}

/* ---- casts ---- */

static void test_casts(void **state)
{
	(void)state;
	static float x[N], back[N], ref_back[N], acc_src[N];
	static uint16_t h[N], ref_h[N], acc[N], ref_acc[N];
	values(x, N, 7, 1000.0f);
	x[5] = NAN;
	x[6] = INFINITY;
	x[7] = 70000.0f; /* fp16: infinity */
	x[8] = 1e-7f;    /* fp16: subnormal */
	values(acc_src, N, 11, 10.0f);
	for (int d = 0; d < 2; d++)
		for (int fp16 = 0; fp16 < 2; fp16++) {
			open_dev(devices[d]);
			for (size_t i = 0; i < N; i++)
				ref_h[i] = ref_to16(fp16, x[i]);
			for (size_t i = 0; i < N; i++)
				ref_back[i] = ref_from16(fp16, ref_h[i]);
			for (size_t i = 0; i < N; i++)
				ref_acc[i] = ref_to16(fp16, ref_from16(fp16, ref_h[i]) + acc_src[i]);

			float *dx = dev_in(x, sizeof x);
			uint16_t *dh = dev_in(NULL, sizeof h);
			hpu__dev_to16(fp16, dh, dx, N);
			float *dback = dev_in(NULL, sizeof back);
			hpu__dev_from16(fp16, dback, dh, N);
			float *dsrc = dev_in(acc_src, sizeof acc_src);
			hpu__dev_acc16(fp16, dh, dsrc, N); /* dh += acc_src */
			dev_out(acc, dh, sizeof acc);
			dev_out(back, dback, sizeof back);
			hpu__dev_to16(fp16, dh = dev_in(NULL, sizeof h), dx, N);
			dev_out(h, dh, sizeof h);
			hpu__dev_free(dx);
			hpu__dev_free(dsrc);
			assert_memory_equal(h, ref_h, sizeof h);
			assert_memory_equal(back, ref_back, sizeof back);
			assert_memory_equal(acc, ref_acc, sizeof acc);
			close_dev();
		}
}

static void test_bf16_acts(void **state)
{
	(void)state;
	static float x[N], back[N];
	static uint16_t h[N], ref_h[N];
	for (size_t i = 0; i < N; i++)
		x[i] = hpu_from_bf16((uint16_t)(i * 37u));
	for (size_t i = 0; i < N; i++)
		ref_h[i] = (uint16_t)(i * 37u);
	for (int d = 0; d < 2; d++) {
		open_dev(devices[d]);
		float *dx = dev_in(x, sizeof x);
		uint16_t *dh = dev_in(NULL, sizeof h);
		assert_int_equal(hpu__dev_bf16_exact(dh, dx, N), 1);
		float *dback = dev_in(NULL, sizeof back);
		hpu__dev_bf16_expand(dback, dh, N);
		dev_out(back, dback, sizeof back);
		hpu__dev_h2d(NULL, dx + 100, &(float){1.1f}, 4); /* not a bf16 value */
		assert_int_equal(hpu__dev_bf16_exact(dh, dx, N), 0);
		ref_h[100] = (uint16_t)(hpu__f32_bits(1.1f) >> 16); /* its top half */
		dev_out(h, dh, sizeof h);
		hpu__dev_free(dx);
		assert_memory_equal(h, ref_h, sizeof h);
		assert_memory_equal(back, x, sizeof back);
		ref_h[100] = (uint16_t)(100 * 37u);
		close_dev();
	}
}

/* ---- adds ---- */

static void test_adds(void **state)
{
	(void)state;
	static float a[N], b[N], out[N], ref[N];
	values(a, N, 3, 100.0f);
	values(b, N, 4, 1.0f);
	for (size_t i = 0; i < N; i++)
		ref[i] = (a[i] + b[i]) + 0.3f;
	for (int d = 0; d < 2; d++) {
		open_dev(devices[d]);
		float *da = dev_in(a, sizeof a), *db = dev_in(b, sizeof b);
		hpu__dev_add(da, db, N);
		hpu__dev_add_scalar(da, 0.3f, N);
		dev_out(out, da, sizeof out);
		hpu__dev_free(db);
		assert_memory_equal(out, ref, sizeof out);
		close_dev();
	}
}

/* ---- sums of squares: fp32 in blocks of 256 over 16 lanes, added
 * pairwise, the blocks and the tail in double ---- */

static double ref_sumsq(const float *g, size_t n)
{
	double total = 0;
	size_t i = 0;
	for (; i + 256 <= n; i += 256) {
		float acc[16] = {0};
		for (size_t j = 0; j < 256; j++)
			acc[j % 16] += g[i + j] * g[i + j];
		for (size_t w = 8; w > 0; w /= 2)
			for (size_t l = 0; l < w; l++)
				acc[l] += acc[l + w];
		total += (double)acc[0];
	}
	double tail = 0;
	for (; i < n; i++)
		tail += (double)g[i] * (double)g[i];
	return total + tail;
}

static void test_sumsq(void **state)
{
	(void)state;
	static float g[N], w[N];
	static uint16_t g16[N];
	values(g, N, 9, 3.0f);
	for (int d = 0; d < 2; d++)
		for (int fp16 = 0; fp16 < 2; fp16++) {
			open_dev(devices[d]);
			for (size_t i = 0; i < N; i++)
				g16[i] = ref_to16(fp16, g[i]);
			double ref16 = 0.5; /* the sum so far */
			for (size_t i = 0; i < N; i += CHUNK) {
				size_t c = N - i < CHUNK ? N - i : CHUNK;
				for (size_t k = 0; k < c; k++)
					w[k] = ref_from16(fp16, g16[i + k]);
				ref16 += ref_sumsq(w, c);
			}
			float *dg = dev_in(g, sizeof g), *scratch = dev_in(NULL, CHUNK * 4);
			uint16_t *dg16 = dev_in(g16, sizeof g16);
			double s = hpu__dev_sumsq(dg, N), s_opt = hpu__sumsq(dg, N);
			double s16 = hpu__dev_sumsq16(0.5, fp16, dg16, N, scratch, CHUNK);
			hpu__dev_free(dg);
			hpu__dev_free(dg16);
			hpu__dev_free(scratch);
			double ref = ref_sumsq(g, N);
			assert_memory_equal(&s, &ref, sizeof s);
			assert_memory_equal(&s_opt, &ref, sizeof s);
			assert_memory_equal(&s16, &ref16, sizeof s);
			close_dev();
		}
}

/* ---- non-finite checks and counts ---- */

static void test_nonfinite(void **state)
{
	(void)state;
	static float g[N];
	static uint16_t h[N], b16[N];
	values(g, N, 5, 1.0f);
	for (int d = 0; d < 2; d++) {
		open_dev(devices[d]);
		float *dg = dev_in(g, sizeof g);
		for (size_t i = 0; i < N; i++)
			h[i] = hpu_to_fp16(g[i]), b16[i] = hpu_to_bf16(g[i]);
		uint16_t *dh = dev_in(h, sizeof h), *db = dev_in(b16, sizeof b16);
		assert_int_equal(hpu__dev_nonfinite(dg, N), 0);
		assert_int_equal(hpu__dev_nonfinite16(1, dh, N), 0);
		assert_int_equal(hpu__dev_nonfinite16(0, db, N), 0);
		assert_int_equal(hpu__dev_count_nonfinite(dg, N), 0);
		assert_int_equal(hpu__dev_count_nonfinite16(db, N), 0);
		hpu__dev_h2d(NULL, dg + N - 1, &(float){NAN}, 4);
		hpu__dev_h2d(NULL, dg + 7, &(float){-INFINITY}, 4);
		hpu__dev_h2d(NULL, dh + 3, &(uint16_t){0x7c00}, 2); /* fp16 inf */
		hpu__dev_h2d(NULL, db + 9, &(uint16_t){0xffc1}, 2); /* bf16 NaN */
		hpu__dev_h2d(NULL, db + 10, &(uint16_t){0x7f80}, 2); /* bf16 inf */
		assert_int_equal(hpu__dev_nonfinite(dg, N), 1);
		assert_int_equal(hpu__dev_nonfinite(dg, 7), 0); /* before the first */
		assert_int_equal(hpu__dev_nonfinite16(1, dh, N), 1);
		assert_int_equal(hpu__dev_nonfinite16(0, db, N), 1);
		assert_int_equal(hpu__dev_count_nonfinite(dg, N), 2);
		assert_int_equal(hpu__dev_count_nonfinite16(db, N), 2);
		hpu__dev_free(dg);
		hpu__dev_free(dh);
		hpu__dev_free(db);
		close_dev();
	}
}

/* ---- the step's decisions on the device (hpu__dev_stepvars) ---- */

static const size_t step_ns[] = {0, 1, 255, 257, 100003};

/* flag_nonfinite(16) against nonfinite(16): with the flag at 0, it is 1
 * exactly where the check answers 1; at 1 it stays 1 (never cleared).
 * An Inf or NaN at the first, a middle and the last element in turn. */
static void flag_case(size_t n, const float *g, int planted, const char *what)
{
	float *dg = dev_in(g, (n ? n : 1) * 4), *dflag = dev_in(NULL, 4), flag;
	const float zero = 0.0f, one = 1.0f;
	uint16_t *h = malloc((n ? n : 1) * 2);
	int want = hpu__dev_nonfinite(dg, n);
	assert_int_equal(want, planted);
	hpu__dev_flag_nonfinite(dflag, dg, n);
	hpu__dev_d2h(NULL, &flag, dflag, 4);
	if (flag != (float)want)
		fail_msg("flag_nonfinite n=%zu (%s): %g, nonfinite says %d", n, what, flag, want);
	hpu__dev_h2d(NULL, dflag, &one, 4);
	hpu__dev_flag_nonfinite(dflag, dg, n);
	hpu__dev_d2h(NULL, &flag, dflag, 4);
	if (flag != 1.0f)
		fail_msg("flag_nonfinite n=%zu (%s) cleared a set flag: %g", n, what, flag);
	for (int fp16 = 0; fp16 < 2; fp16++) {
		for (size_t i = 0; i < n; i++)
			h[i] = ref_to16(fp16, g[i]);
		uint16_t *dh = dev_in(h, (n ? n : 1) * 2);
		hpu__dev_h2d(NULL, dflag, &zero, 4);
		want = hpu__dev_nonfinite16(fp16, dh, n);
		hpu__dev_flag_nonfinite16(dflag, fp16, dh, n);
		hpu__dev_d2h(NULL, &flag, dflag, 4);
		if (flag != (float)want)
			fail_msg("flag_nonfinite16 fp16=%d n=%zu (%s): %g, nonfinite16 says %d", fp16,
				 n, what, flag, want);
		hpu__dev_h2d(NULL, dflag, &one, 4);
		hpu__dev_flag_nonfinite16(dflag, fp16, dh, n);
		hpu__dev_d2h(NULL, &flag, dflag, 4);
		if (flag != 1.0f)
			fail_msg("flag_nonfinite16 fp16=%d n=%zu (%s) cleared a set flag", fp16, n,
				 what);
		hpu__dev_free(dh);
	}
	hpu__dev_free(dg);
	hpu__dev_free(dflag);
	free(h);
}

static void test_step_flags(void **state)
{
	(void)state;
	const float bad[] = {NAN, INFINITY, -INFINITY};
	for (int d = 0; d < 2; d++) {
		open_dev(devices[d]);
		for (size_t k = 0; k < sizeof step_ns / sizeof *step_ns; k++) {
			size_t n = step_ns[k];
			float *g = malloc((n ? n : 1) * 4);
			values(g, n, 17, 1.0f);
			flag_case(n, g, 0, "finite");
			const size_t at[] = {0, n / 2, n ? n - 1 : 0};
			for (int j = 0; j < 3 && n; j++) {
				float keep = g[at[j]];
				g[at[j]] = bad[j];
				char what[64];
				snprintf(what, sizeof what, "%g at %zu", bad[j], at[j]);
				flag_case(n, g, 1, what);
				g[at[j]] = keep;
			}
			free(g);
		}
		close_dev();
	}
}

/* sumsq_add: acc + sumsq(g), the same double; sumsq16_add: sumsq16(acc). */
static void test_sumsq_add(void **state)
{
	(void)state;
	for (int d = 0; d < 2; d++) {
		open_dev(devices[d]);
		for (size_t k = 0; k < sizeof step_ns / sizeof *step_ns; k++) {
			size_t n = step_ns[k];
			float *g = malloc((n ? n : 1) * 4);
			uint16_t *h = malloc((n ? n : 1) * 2);
			values(g, n, 23, 5.0f);
			float *dg = dev_in(g, (n ? n : 1) * 4), *scratch = dev_in(NULL, CHUNK * 4);
			double acc = 0.3, want = acc + hpu__dev_sumsq(dg, n), got;
			double *dacc = dev_in(&acc, 8);
			hpu__dev_sumsq_add(dacc, dg, n);
			dev_out(&got, dacc, 8);
			if (memcmp(&got, &want, 8))
				fail_msg("sumsq_add n=%zu: %.17g, acc + sumsq %.17g", n, got, want);
			for (int fp16 = 0; fp16 < 2; fp16++) {
				for (size_t i = 0; i < n; i++)
					h[i] = ref_to16(fp16, g[i]);
				uint16_t *dh = dev_in(h, (n ? n : 1) * 2);
				want = hpu__dev_sumsq16(acc, fp16, dh, n, scratch, CHUNK);
				dacc = dev_in(&acc, 8);
				hpu__dev_sumsq16_add(dacc, fp16, dh, n, scratch, CHUNK);
				dev_out(&got, dacc, 8);
				if (memcmp(&got, &want, 8))
					fail_msg("sumsq16_add fp16=%d n=%zu: %.17g, sumsq16 %.17g", fp16,
						 n, got, want);
				hpu__dev_free(dh);
			}
			hpu__dev_free(dg);
			hpu__dev_free(scratch);
			free(g);
			free(h);
		}
		close_dev();
	}
}

/* rows_add and loss_add (an evaluation's sums): the host's loops, in
 * their order, bit for bit; the rows past *rows left out. */
static void test_eval_sums(void **state)
{
	(void)state;
	for (int d = 0; d < 2; d++) {
		open_dev(devices[d]);
		int *drows = dev_in(NULL, sizeof(int));
		for (size_t k = 0; k < sizeof step_ns / sizeof *step_ns; k++) {
			size_t n = step_ns[k];
			float *v = malloc((n ? n : 1) * 4);
			values(v, n, 31, 3.0f);
			float *dv = dev_in(v, (n ? n : 1) * 4);
			int rows_of[] = {(int)n, (int)(n / 2), (int)n + 5};
			for (int j = 0; j < 3; j++) {
				int rows = rows_of[j];
				hpu__dev_h2d(NULL, drows, &rows, sizeof rows);
				double acc = 0.3, want = acc, got;
				for (size_t r = 0; r < n && r < (size_t)rows; r++)
					want += v[r];
				double *dacc = dev_in(&acc, 8);
				hpu__dev_rows_add(dacc, dv, n, drows);
				dev_out(&got, dacc, 8);
				if (memcmp(&got, &want, 8))
					fail_msg("%s rows_add n=%zu rows=%d: %.17g, not %.17g",
						 devices[d], n, rows, got, want);
			}
			hpu__dev_free(dv);
			free(v);
		}
		/* loss_add: (sum of w[k] * (sums[k] / rows)) * rows onto acc */
		const float wf[3] = {1.0f, 0.3f, 2.5f};
		double sums[3] = {12.345678901, -0.25, 7e-3}, w[3] = {wf[0], wf[1], wf[2]};
		double *dsums = dev_in(sums, sizeof sums), *dw = dev_in(w, sizeof w);
		for (int rows = 1; rows < 40; rows += 7) {
			hpu__dev_h2d(NULL, drows, &rows, sizeof rows);
			double acc = 1.75, sum = 0, got;
			for (int k = 0; k < 3; k++)
				sum += wf[k] * (sums[k] / rows);
			double want = acc + sum * rows;
			double *dacc = dev_in(&acc, 8);
			hpu__dev_loss_add(dacc, dsums, dw, 3, drows);
			dev_out(&got, dacc, 8);
			if (memcmp(&got, &want, 8))
				fail_msg("%s loss_add rows=%d: %.17g, not %.17g", devices[d], rows, got,
					 want);
		}
		hpu__dev_free(dsums);
		hpu__dev_free(dw);
		hpu__dev_free(drows);
		close_dev();
	}
}

/* loss_seed: g[i] + weight * (float)(base * loss_scale) / (float)batch
 * in fp32; NaN everywhere where a sum is Inf or NaN (first, middle, last),
 * and sv->bad 1 then (0 left as it is where every sum is finite). */
static void test_loss_seed(void **state)
{
	(void)state;
	const double sums_ok[5] = {1.5, -2.25, 1e300, 0.0, 3.0};
	for (int d = 0; d < 2; d++) {
		open_dev(devices[d]);
		for (size_t k = 0; k < sizeof step_ns / sizeof *step_ns; k++) {
			size_t n = step_ns[k];
			float *g = malloc((n ? n : 1) * 4), *got = malloc((n ? n : 1) * 4);
			values(g, n, 31, 2.0f);
			hpu__dev_stepvars sv = {.loss_scale = 24576.0};
			hpu__dev_stepvars *dsv = dev_in(&sv, sizeof sv);
			for (int bad = -1; bad < 3; bad++) {
				double sums[5];
				memcpy(sums, sums_ok, sizeof sums);
				if (bad >= 0)
					sums[bad == 0 ? 0 : bad == 1 ? 2 : 4] = bad == 1 ? NAN : -INFINITY;
				double *dsums = dev_in(sums, sizeof sums);
				float *dg = dev_in(g, (n ? n : 1) * 4);
				/* values where w * (s / batch) would round otherwise */
				const float w = 0.3f, base = 0.37f;
				const int batch = 33;
				hpu__dev_h2d(NULL, dsv, &sv, sizeof sv); /* bad 0 */
				hpu__dev_loss_seed(dg, n, dsums, 5, w, base, batch, dsv);
				dev_out(got, dg, (n ? n : 1) * 4); /* (frees dg) */
				hpu__dev_stepvars after;
				hpu__dev_d2h(NULL, &after, dsv, sizeof after);
				if (after.bad != (bad >= 0 ? 1.0f : 0.0f))
					fail_msg("loss_seed n=%zu (bad sum %d): sv->bad %g", n, bad,
						 (double)after.bad);
				float s = (float)((double)base * sv.loss_scale);
				float v = bad >= 0 ? NAN : w * s / (float)batch;
				for (size_t i = 0; i < n; i++) {
					float want = g[i] + v;
					if (bad >= 0 ? !isnan(got[i]) : memcmp(&got[i], &want, 4))
						fail_msg("loss_seed n=%zu (bad sum %d) at %zu: %.9g, not %.9g",
							 n, bad, i, got[i], want);
				}
				hpu__dev_free(dsums);
			}
			hpu__dev_free(dsv);
			free(g);
			free(got);
		}
		close_dev();
	}
}

/* step_begin and step_end over the script against the host's arithmetic
 * (step_testlib.c), the block in device memory, after each op. */
static void test_step_script(void **state)
{
	(void)state;
	char what[160];
	for (int d = 0; d < 2; d++) {
		open_dev(devices[d]);
		for (int c = 0; c < STEP_NCFG; c++) {
			const hpu__dev_stepcfg *cfg = &step_cfgs[c];
			hpu__dev_stepvars ref, got;
			step_init(&ref, cfg);
			hpu__dev_stepvars *dsv = dev_in(&ref, sizeof ref);
			for (int i = 0; i < STEP_NSTEPS; i++) {
				step_inputs(&ref, cfg, i); /* as the flags and sumsq_add leave them */
				hpu__dev_h2d(NULL, &dsv->bad, &ref.bad, sizeof ref.bad);
				hpu__dev_h2d(NULL, &dsv->sumsq, &ref.sumsq, sizeof ref.sumsq);
				step_ref_begin(&ref, cfg);
				hpu__dev_step_begin(dsv, cfg);
				hpu__dev_d2h(NULL, &got, dsv, sizeof got);
				if (step_diff(&got, &ref, what, sizeof what))
					fail_msg("%s, step %d, step_begin: %s (the host's last)",
						 step_cfg_names[c], i, what);
				step_ref_end(&ref, cfg);
				hpu__dev_step_end(dsv, cfg);
				hpu__dev_d2h(NULL, &got, dsv, sizeof got);
				if (step_diff(&got, &ref, what, sizeof what))
					fail_msg("%s, step %d, step_end: %s (the host's last)",
						 step_cfg_names[c], i, what);
			}
			/* the script did what it is for */
			if (cfg->fp16 && cfg->dynamic)
				assert_true(ref.skipped == 6 && ref.t == STEP_NSTEPS - 6);
			hpu__dev_free(dsv);
		}
		close_dev();
	}
}

/* ---- the optimizers: torch's formulas, in fp32, scalars in double ---- */

static void ref_step(const hpu_train_opts *o, long t, float *p, const float *g, float *m,
		     float *v, size_t n, float gscale, double lr)
{
	const float wd = (float)hpu__opts_weight_decay(o);
	if (o->optimizer == HPU_OPTIM_SGD) {
		const float mu = (float)o->momentum, lrf = (float)lr;
		for (size_t i = 0; i < n; i++) {
			float d = gscale * g[i] + wd * p[i];
			if (mu != 0.0f) {
				m[i] = t == 1 ? d : mu * m[i] + d;
				d = o->nesterov ? d + mu * m[i] : m[i];
			}
			p[i] -= lrf * d;
		}
		return;
	}
	const int l2 = o->optimizer == HPU_OPTIM_ADAM;
	const float b1 = (float)o->beta1, b2 = (float)o->beta2;
	const float c1 = (float)(1.0 - o->beta1), c2 = (float)(1.0 - o->beta2);
	const float step = (float)(lr / (1.0 - pow(o->beta1, (double)t)));
	const float isb = (float)(1.0 / sqrt(1.0 - pow(o->beta2, (double)t)));
	const float decay = (float)(1.0 - lr * hpu__opts_weight_decay(o));
	for (size_t i = 0; i < n; i++) {
		float gi = gscale * g[i];
		if (l2)
			gi = gi + wd * p[i];
		m[i] = b1 * m[i] + c1 * gi;
		v[i] = b2 * v[i] + c2 * gi * gi;
		float pi = l2 ? p[i] : p[i] * decay;
		p[i] = pi - step * m[i] / (sqrtf(v[i]) * isb + (float)o->eps);
	}
}

static hpu_train_opts opts_for(int which)
{
	hpu_train_opts o;
	memset(&o, 0, sizeof o);
	o.beta1 = 0.9;
	o.beta2 = 0.999;
	o.eps = 1e-8;
	o.weight_decay = 0.01;
	switch (which) {
	case 0:
		o.optimizer = HPU_OPTIM_SGD;
		break;
	case 1:
		o.optimizer = HPU_OPTIM_SGD;
		o.momentum = 0.9;
		o.nesterov = 1;
		break;
	case 2:
		o.optimizer = HPU_OPTIM_ADAM;
		break;
	default:
		o.optimizer = HPU_OPTIM_ADAMW;
		break;
	}
	return o;
}

/* Two steps of each optimizer through hpu__optim_step and, with 16-bit
 * gradients, hpu__optim_range16 over two ranges. */
static void test_optim(void **state)
{
	(void)state;
	static float p0[N], g[N], w[N];
	static float p[N], ref_p[N], st[2 * N], ref_st[2 * N], p16p[N], ref_p16p[N];
	static uint16_t g16[N], p16[N], ref_p16[N];
	values(p0, N, 21, 1.0f);
	values(g, N, 22, 0.1f);
	for (size_t i = 0; i < N; i++)
		g16[i] = hpu_to_bf16(g[i]);
	for (int d = 0; d < 2; d++)
		for (int which = 0; which < 4; which++) {
			hpu_train_opts o = opts_for(which);
			int floats = hpu__optim_state_floats(&o);
			open_dev(devices[d]);
			/* fp32 */
			memcpy(ref_p, p0, sizeof p0);
			memset(ref_st, 0, sizeof ref_st);
			float *dp = dev_in(p0, sizeof p0), *dg = dev_in(g, sizeof g);
			float *dst = dev_in(NULL, sizeof st);
			hpu_optim opt;
			hpu__optim_init(&opt, &o, N, floats ? dst : NULL);
			for (long t = 1; t <= 2; t++) {
				hpu__optim_step(&opt, dp, dg, 0.5f, 0.01);
				ref_step(&o, t, ref_p, g, ref_st, ref_st + N, N, 0.5f, 0.01);
			}
			dev_out(p, dp, sizeof p);
			dev_out(st, dst, sizeof st);
			assert_memory_equal(p, ref_p, sizeof p);
			assert_memory_equal(st, ref_st, sizeof st);
			/* 16-bit gradients, the result rounded into p16 */
			memcpy(ref_p16p, p0, sizeof p0);
			memset(ref_st, 0, sizeof ref_st);
			for (size_t i = 0; i < N; i++)
				w[i] = hpu_from_bf16(g16[i]);
			dp = dev_in(p0, sizeof p0);
			dst = dev_in(NULL, sizeof st);
			uint16_t *dg16 = dev_in(g16, sizeof g16), *dp16 = dev_in(NULL, sizeof p16);
			float *scratch = dev_in(NULL, CHUNK * 4);
			hpu__optim_init(&opt, &o, N, floats ? dst : NULL);
			for (long t = 1; t <= 2; t++) {
				hpu__optim_begin(&opt);
				hpu__optim_range16(&opt, 0, 2000, dp, dg16, dp16, 0, scratch, CHUNK,
						   0.5f, 0.01);
				hpu__optim_range16(&opt, 2000, N - 2000, dp + 2000, dg16 + 2000,
						   dp16 + 2000, 0, scratch, CHUNK, 0.5f, 0.01);
				ref_step(&o, t, ref_p16p, w, ref_st, ref_st + N, N, 0.5f, 0.01);
			}
			for (size_t i = 0; i < N; i++)
				ref_p16[i] = hpu_to_bf16(ref_p16p[i]);
			dev_out(p16p, dp, sizeof p16p);
			dev_out(st, dst, sizeof st);
			dev_out(p16, dp16, sizeof p16);
			hpu__dev_free(dg);
			hpu__dev_free(dg16);
			hpu__dev_free(scratch);
			assert_memory_equal(p16p, ref_p16p, sizeof p16p);
			assert_memory_equal(st, ref_st, sizeof st);
			assert_memory_equal(p16, ref_p16, sizeof p16);
			close_dev();
		}
}

/* The optimizer with sv (hpu__dev_stepvars in device memory): lr, t and
 * gscale read from it give what the same values given by value give, bit
 * for bit (the values by value beside sv are wrong on purpose: they must
 * not be read); a step sv skips leaves p, m, v and p16 as they were. */
static void optim_sv_case(hpu__dev_optkind kind, double momentum, int g16, int fp16)
{
	enum { M = 257 };
	float p0[M], g[M], p[2][M], st[2][2 * M];
	uint16_t gh[M], p16[2][M];
	values(p0, M, 41, 1.0f);
	values(g, M, 42, 0.2f);
	for (size_t i = 0; i < M; i++)
		gh[i] = ref_to16(fp16, g[i]);
	float *dp[2], *dst[2], *dg = dev_in(g, sizeof g), *scratch = dev_in(NULL, 100 * 4);
	uint16_t *dp16[2], *dgh = dev_in(gh, sizeof gh);
	for (int k = 0; k < 2; k++) {
		dp[k] = dev_in(p0, sizeof p0);
		dst[k] = dev_in(NULL, sizeof st[0]);
		dp16[k] = dev_in(NULL, sizeof p16[0]);
	}
	hpu__dev_stepvars sv = {0};
	hpu__dev_stepvars *dsv = dev_in(&sv, sizeof sv);
	const hpu__dev_optim base = {.kind = kind, .momentum = momentum, .weight_decay = 0.01,
				     .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
	for (int step = 1; step <= 4; step++) {
		hpu__dev_optim val = base, vars = base;
		sv.skip = step == 3;
		sv.t = step < 3 ? step : step - 1;
		sv.lr = 0.01 / step;
		sv.gscale = 0.5f + 0.125f * (float)step;
		hpu__dev_h2d(NULL, dsv, &sv, sizeof sv);
		val.t = sv.t, val.lr = sv.lr, val.gscale = sv.gscale;
		vars.t = 99, vars.lr = 5.0, vars.gscale = 3.0f, vars.sv = dsv;
		float before[2 * M + M];
		hpu__dev_d2h(NULL, before, dp[1], sizeof p0);
		hpu__dev_d2h(NULL, before + M, dst[1], sizeof st[0]);
		for (int k = 0; k < 2; k++) {
			const hpu__dev_optim *o = k ? &vars : &val;
			if (k == 0 && sv.skip)
				continue;
			if (g16)
				hpu__dev_optim_update16(o, fp16, dp[k], dgh, dp16[k], dst[k],
							dst[k] + M, M, scratch, 100);
			else
				hpu__dev_optim_update(o, dp[k], dg, dst[k], dst[k] + M, M);
		}
		for (int k = 0; k < 2; k++) {
			hpu__dev_d2h(NULL, p[k], dp[k], sizeof p[k]);
			hpu__dev_d2h(NULL, st[k], dst[k], sizeof st[k]);
			hpu__dev_d2h(NULL, p16[k], dp16[k], sizeof p16[k]);
		}
		if (sv.skip && (memcmp(p[1], before, sizeof p[1]) ||
				memcmp(st[1], before + M, sizeof st[1])))
			fail_msg("optim kind %d g16 %d: a skipped step changed p, m or v", kind, g16);
		if (memcmp(p[0], p[1], sizeof p[0]) || memcmp(st[0], st[1], sizeof st[0]) ||
		    (g16 && memcmp(p16[0], p16[1], sizeof p16[0])))
			fail_msg("optim kind %d g16 %d fp16 %d, step %d: with sv, not by value's "
				 "(p[0] %.9g and %.9g)",
				 kind, g16, fp16, step, p[1][0], p[0][0]);
	}
	for (int k = 0; k < 2; k++) {
		hpu__dev_free(dp[k]);
		hpu__dev_free(dst[k]);
		hpu__dev_free(dp16[k]);
	}
	hpu__dev_free(dg);
	hpu__dev_free(dgh);
	hpu__dev_free(scratch);
	hpu__dev_free(dsv);
}

static void test_optim_sv(void **state)
{
	(void)state;
	for (int d = 0; d < 2; d++) {
		open_dev(devices[d]);
		for (int g16 = 0; g16 < 2; g16++)
			for (int fp16 = 0; fp16 <= g16; fp16++) {
				optim_sv_case(HPU__DEV_SGD, 0.0, g16, fp16);
				optim_sv_case(HPU__DEV_SGD, 0.9, g16, fp16);
				optim_sv_case(HPU__DEV_ADAM, 0.0, g16, fp16);
				optim_sv_case(HPU__DEV_ADAMW, 0.0, g16, fp16);
			}
		close_dev();
	}
}

/* The optimizer's public step on strict device memory, no device call
 * around it: the step enters the device itself (before the runtime's
 * ops it looped on the host and faulted here). */
static void test_optim_strict_unbracketed(void **state)
{
	(void)state;
	hpu_train_opts o = opts_for(3);
	float p[64], g[64], ref_p[64], ref_st[128] = {0};
	values(p, 64, 1, 1.0f);
	values(g, 64, 2, 1.0f);
	memcpy(ref_p, p, sizeof p);
	open_dev("cpu-strict");
	float *dp = hpu__dev_alloc(HPU_MEM_PARAMS, sizeof p, "parameters");
	float *dg = hpu__dev_alloc(HPU_MEM_GRADS, sizeof g, "gradients");
	float *dst = hpu__dev_alloc(HPU_MEM_OPTIM, 2 * sizeof p, "optimizer state");
	hpu__dev_h2d(NULL, dp, p, sizeof p);
	hpu__dev_h2d(NULL, dg, g, sizeof g);
	hpu_optim opt;
	hpu__optim_init(&opt, &o, 64, dst);
	hpu__optim_step(&opt, dp, dg, 1.0f, 0.001);
	double ss = hpu__sumsq(dg, 64);
	hpu__dev_d2h(NULL, p, dp, sizeof p);
	ref_step(&o, 1, ref_p, g, ref_st, ref_st + 64, 64, 1.0f, 0.001);
	assert_memory_equal(p, ref_p, sizeof p);
	assert_true(ss == ref_sumsq(g, 64));
	hpu__dev_free(dp);
	hpu__dev_free(dg);
	hpu__dev_free(dst);
	close_dev();
}

/* ---- the ops' kernels the CPU runs as plain C: dropout, embedding, the
 * loss ---- */

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* backend.h's dropout contract, written out: what every device draws. */
static uint8_t contract_keep(uint64_t seed, uint64_t stream, size_t i, float p)
{
	uint64_t key = mix64(seed ^ mix64(stream ^ 0x6a09e667f3bcc909ull));
	uint32_t thresh = (uint32_t)((double)p * 4294967296.0);
	return (uint32_t)(mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull) >> 32) >= thresh;
}

static int calls;

static int my_dropout_fwd(const float *x, float *y, uint8_t *mask, size_t n, float p,
			  uint64_t seed, uint64_t stream)
{
	calls++;
	for (size_t i = 0; i < n; i++) {
		mask[i] = contract_keep(seed, stream, i, p);
		y[i] = mask[i] ? x[i] * (1.0f / (1.0f - p)) : 0.0f;
	}
	return HPU_BE_OK;
}

static int my_embedding_fwd(const float *table, const int32_t *ids, float *y, int n, int vocab,
			    int dim)
{
	(void)vocab;
	calls++;
	for (int i = 0; i < n; i++)
		memcpy(y + (size_t)i * dim, table + (size_t)ids[i] * dim, (size_t)dim * 4);
	return HPU_BE_OK;
}

static int my_xent(const float *logits, const int32_t *labels, float *dlogits, int batch,
		   int classes, float *loss)
{
	(void)logits, (void)labels, (void)dlogits, (void)batch, (void)classes;
	calls++;
	*loss = 42.0f;
	return HPU_BE_OK;
}

/* The masks are backend.h's formula on both CPU tables; a table that
 * provides the kernels (as a GPU's does) gets the ops' calls. */
static void test_dropout_embedding_xent(void **state)
{
	(void)state;
	static float x[N], y[N], y2[N];
	static uint8_t mask[N], mask2[N];
	values(x, N, 31, 1.0f);
	hpu_dropout_forward(x, y, mask, N, 0.3f, 1234, 77);
	size_t kept = 0;
	for (size_t i = 0; i < N; i++) {
		assert_int_equal(mask[i], contract_keep(1234, 77, i, 0.3f));
		kept += mask[i];
	}
	assert_true(kept > N / 2 && kept < N); /* about 70% */
	hpu__backend mine = *hpu__be_reference();
	hpu__be_set(&mine); /* the reference table: the plain C kernels */
	hpu_dropout_forward(x, y2, mask2, N, 0.3f, 1234, 77);
	assert_memory_equal(mask2, mask, sizeof mask);
	assert_memory_equal(y2, y, sizeof y);
	mine.dropout_fwd = my_dropout_fwd;
	mine.embedding_fwd = my_embedding_fwd;
	mine.softmax_xent = my_xent;
	calls = 0;
	hpu_dropout_forward(x, y2, mask2, N, 0.3f, 1234, 77);
	assert_int_equal(calls, 1);
	assert_memory_equal(mask2, mask, sizeof mask);
	assert_memory_equal(y2, y, sizeof y);
	float table[4 * 3] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, e[2 * 3];
	int32_t ids[2] = {3, 1}, bad[2] = {3, 4};
	assert_int_equal(hpu_embedding_forward(table, ids, e, 2, 4, 3), HPU_OK);
	assert_int_equal(calls, 2);
	assert_true(e[0] == 9 && e[3] == 3);
	assert_int_equal(hpu_embedding_forward(table, bad, e, 2, 4, 3), HPU_ERANGE);
	assert_int_equal(calls, 2); /* the op checks the ids first */
	int32_t labels[2] = {0, 2};
	assert_true(hpu_cross_entropy_forward(table, labels, NULL, 2, 3) == 42.0f);
	assert_int_equal(calls, 3);
	hpu__be_set(NULL);
}

/* ---- capabilities ---- */

static void test_caps(void **state)
{
	(void)state;
	const hpu__backend *be = hpu__be();
	int bf16 = be->bf16_native ? be->bf16_native() : 0;
	for (int d = 0; d < 2; d++) {
		open_dev(devices[d]);
		const hpu__dev_caps *c = hpu__dev_caps_get();
		assert_int_equal(c->bf16_native, bf16); /* the backend's, not a guess */
		assert_int_equal(c->fp16_native, 0);    /* fp16 and fp8 run in fp32 */
		assert_int_equal(c->fp8_native, 0);
		assert_int_equal(c->can_capture, 0);
		assert_int_equal(c->host_can_read, d == 0);
		assert_non_null(hpu__dev()->rt);
		close_dev();
	}
	/* the reference kernels have no bf16 instructions */
	hpu__be_set(hpu__be_reference());
	open_dev("cpu");
	assert_int_equal(hpu__dev_caps_get()->bf16_native, 0);
	close_dev();
	hpu__be_set(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_optim_strict_unbracketed),
		cmocka_unit_test(test_casts),
		cmocka_unit_test(test_bf16_acts),
		cmocka_unit_test(test_adds),
		cmocka_unit_test(test_sumsq),
		cmocka_unit_test(test_nonfinite),
		cmocka_unit_test(test_optim),
		cmocka_unit_test(test_step_flags),
		cmocka_unit_test(test_sumsq_add),
		cmocka_unit_test(test_loss_seed),
		cmocka_unit_test(test_eval_sums),
		cmocka_unit_test(test_step_script),
		cmocka_unit_test(test_optim_sv),
		cmocka_unit_test(test_dropout_embedding_xent),
		cmocka_unit_test(test_caps),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
