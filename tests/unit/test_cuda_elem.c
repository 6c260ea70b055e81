/* test_cuda_elem: the CUDA device's arithmetic (worker/cuda/cuda_elem.h,
 * what its kernels compute on each element) against the CPU's
 * (common/lowp.h, worker/device/device_ops.c), bit for bit, on any
 * machine: the header compiled as C, with the same IEEE operations the
 * kernels' intrinsics perform. The conversions on every 16-bit value and
 * on the floats around each rounding boundary, acc16, the sums of
 * squares part by part (blocks, the rest, a block redone in double), and
 * SGD (plain, momentum, Nesterov), Adam and AdamW over three steps, from
 * fp32 and 16-bit gradients; the step's decisions (the clip factor,
 * step_begin and step_end over a script of steps, a loss's seed, the
 * optimizer's scalars made from hpu__dev_stepvars); accuracy's arg-max over rows with NaNs, as
 * the kernels split a row among threads, against the host's scan. What
 * it cannot check is a GPU running them:
 * test_cuda_device does that where one is visible. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/lowp.h"
#include "tests/unit/step_testlib.h"
#include "worker/cuda/cuda_elem.h"
#include "worker/device/device.h"
#include "worker/ops/backend_host.h"

#include "hpu/hpu.h"

static const hpu__dev_rtops *cpu = &hpu__dev_cpu_rtops;
static uint64_t rng = 0x243f6a8885a308d3ull;

static float frand(float scale)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return ((float)((rng * 0x2545f4914f6cdd1dull) >> 40) / (float)(1u << 24) * 2.0f - 1.0f) *
	       scale;
}

static void test_widen_every_value(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 65536; h++) {
		uint32_t a = hpu__f32_bits(hpu__elem_from_fp16((uint16_t)h));
		uint32_t b = hpu__f32_bits(hpu_from_fp16((uint16_t)h));
		if (a != b)
			fail_msg("fp16 0x%04x widens to 0x%08x, lowp.h's 0x%08x", h, a, b);
		a = hpu__f32_bits(hpu__elem_from_bf16((uint16_t)h));
		b = hpu__f32_bits(hpu_from_bf16((uint16_t)h));
		assert_int_equal(a, b);
	}
}

static void narrow_one(uint32_t x)
{
	float f = hpu__bits_f32(x);
	uint16_t a = hpu__elem_to_fp16(f), b = hpu_to_fp16(f);
	if (a != b)
		fail_msg("0x%08x narrows to fp16 0x%04x, lowp.h's 0x%04x", x, a, b);
	a = hpu__elem_to_bf16(f), b = hpu_to_bf16(f);
	if (a != b)
		fail_msg("0x%08x narrows to bf16 0x%04x, lowp.h's 0x%04x", x, a, b);
}

static void test_narrow_boundaries(void **state)
{
	(void)state;
	/* around every 16-bit value of both types: the value, its halfway
	 * points to the neighbours (ties), and one bit either side */
	static const int32_t off[] = {0, 1, -1, 0x1000, 0xfff, 0x1001, -0x1000, -0x1001,
				      0x8000, 0x7fff, 0x8001, -0x8000, -0x8001};
	for (uint32_t h = 0; h < 65536; h++)
		for (int t = 0; t < 2; t++) {
			uint32_t base = hpu__f32_bits(t ? hpu_from_fp16((uint16_t)h)
							: hpu_from_bf16((uint16_t)h));
			for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
				narrow_one(base + (uint32_t)off[i]);
		}
	for (uint64_t x = 0; x < (1ull << 32); x += 4093) /* a sweep of the rest */
		narrow_one((uint32_t)x);
}

static void test_acc16(void **state)
{
	(void)state;
	enum { N = 5000 };
	for (int fp16 = 0; fp16 < 2; fp16++) {
		float src[N], x[N];
		uint16_t want[N], got[N];
		for (int i = 0; i < N; i++) {
			x[i] = frand(4.0f);
			src[i] = frand(1.0f);
		}
		cpu->to16(fp16, want, x, N);
		memcpy(got, want, sizeof got);
		cpu->acc16(fp16, want, src, N);
		for (int i = 0; i < N; i++)
			got[i] = hpu__elem_acc16(fp16, got[i], src[i]);
		assert_memory_equal(got, want, sizeof got);
	}
}

/* The kernel's parts added as cuda_device.c adds them. */
static double sumsq_parts(const float *g, size_t n)
{
	size_t nb = n / HPU_SUMSQ_BLOCK;
	double total = 0.0;
	for (size_t b = 0; b < nb; b++)
		total += hpu__elem_sumsq_part(g, n, b);
	return total + hpu__elem_sumsq_part(g, n, nb);
}

/* cuda_device.c's rt_sumsq16_add as its kernels compute it
 * (k_sumsq16_parts, k_sumsq16_chunks, k_sumsq_onto: the same loops),
 * batches of chunks in `cap` doubles. */
static void sumsq16_batches(double *acc, int fp16, const uint16_t *h, size_t n, size_t chunk,
			    size_t cap)
{
	size_t pc, per = hpu__elem_sumsq16_batch(chunk, cap, &pc);
	assert_true(per > 0);
	size_t chunks = (n + chunk - 1) / chunk;
	double *scr = malloc(cap * sizeof *scr);
	for (size_t j0 = 0; j0 < chunks; j0 += per) {
		size_t nj = chunks - j0 < per ? chunks - j0 : per;
		double *part = scr, *tot = scr + nj * pc;
		assert_true(nj * pc + nj <= cap);
		for (size_t t = 0; t < nj * pc; t++) {
			size_t j = t / pc, b = t % pc, c = hpu__elem_chunk_len(n, chunk, j0 + j);
			if (b <= c / HPU_SUMSQ_BLOCK)
				part[t] = hpu__elem_sumsq16_part(fp16, h + (j0 + j) * chunk, c, b);
		}
		for (size_t j = 0; j < nj; j++)
			tot[j] = hpu__elem_parts_sum(part + j * pc,
						     hpu__elem_chunk_len(n, chunk, j0 + j) /
								 HPU_SUMSQ_BLOCK +
							 1);
		for (size_t j = 0; j < nj; j++)
			*acc = E_DADD(*acc, tot[j]);
	}
	free(scr);
}

/* The 16-bit gradients' sum of squares in batches of chunks (three
 * launches a batch on a GPU, not three a chunk): device_ops.c's sumsq16
 * bit for bit, chunks of 300 (not a multiple of 256) and of the
 * strategies' 16384, batches of a few chunks and of many, a block whose
 * fp32 sum overflows and an Inf planted. */
static void test_sumsq16_batches(void **state)
{
	(void)state;
	static const size_t ns[] = {0, 1, 255, 299, 300, 301, 16385, 1000003};
	static const size_t chunks[] = {300, 16384};
	static const size_t caps[] = {7, 70, 200, 65536}; /* 200: 3 chunks of 16384 a batch */
	for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
		size_t n = ns[k];
		float *g = malloc((n ? n : 1) * sizeof *g), *scratch = malloc(16384 * sizeof *scratch);
		uint16_t *h = malloc((n ? n : 1) * sizeof *h);
		for (int plant = 0; plant < 3; plant++)
			for (int fp16 = 0; fp16 < 2; fp16++) {
				for (size_t i = 0; i < n; i++)
					g[i] = frand(3.0f);
				if (plant == 1 && n) /* bf16: a block's fp32 sum overflows */
					g[n / 3] = fp16 ? 60000.0f : 3e19f;
				if (plant == 2 && n)
					g[n - 1] = 1.0f / 0.0f;
				cpu->to16(fp16, h, g, n);
				for (size_t c = 0; c < 2; c++)
					for (size_t q = 0; q < sizeof caps / sizeof *caps; q++) {
						size_t pc;
						if (!hpu__elem_sumsq16_batch(chunks[c], caps[q], &pc))
							continue; /* (rt_sumsq16_add: chunk by chunk) */
						double want = 0.3, got = 0.3;
						cpu->sumsq16_add(&want, fp16, h, n, scratch, chunks[c]);
						sumsq16_batches(&got, fp16, h, n, chunks[c], caps[q]);
						if (memcmp(&want, &got, sizeof got))
							fail_msg("sumsq16 %s n=%zu chunk %zu cap %zu (case %d): "
								 "%.17g, the CPU's %.17g",
								 fp16 ? "fp16" : "bf16", n, chunks[c], caps[q],
								 plant, got, want);
					}
			}
		free(g), free(scratch), free(h);
	}
}

static void test_sumsq(void **state)
{
	(void)state;
	static const size_t ns[] = {0, 1, 255, 256, 257, 1000003};
	for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
		size_t n = ns[k];
		float *g = malloc((n ? n : 1) * sizeof *g);
		for (int plant = 0; plant < 3; plant++) {
			for (size_t i = 0; i < n; i++)
				g[i] = frand(3.0f);
			if (plant == 1 && n) /* a block's fp32 sum overflows: redone in double */
				g[n / 3] = 3e19f;
			if (plant == 2 && n)
				g[n - 1] = 1.0f / 0.0f;
			double want = cpu->sumsq(g, n), got = sumsq_parts(g, n);
			if (memcmp(&want, &got, sizeof got))
				fail_msg("sumsq n=%zu (case %d): %.17g, the CPU's %.17g", n, plant, got,
					 want);
		}
		free(g);
	}
}

/* Three steps of `o` on both, from fp32 gradients or 16-bit ones. */
static void optim_case(hpu__dev_optim o, int g16, int fp16)
{
	enum { N = 3001 };
	static float p[N], g[N], m[N], v[N], P[N], M[N], V[N], scr[700];
	static uint16_t gh[N], p16[N], P16[N];
	for (int i = 0; i < N; i++) {
		p[i] = P[i] = frand(1.0f);
		g[i] = frand(0.1f);
		m[i] = v[i] = M[i] = V[i] = 0.0f;
	}
	cpu->to16(fp16, gh, g, N);
	for (o.t = 1; o.t <= 3; o.t++) {
		if (g16)
			cpu->optim16(&o, fp16, p, gh, p16, m, v, N, scr, 700);
		else
			cpu->optim(&o, p, g, m, v, N);
		hpu__cuda_optk k = hpu__cuda_optk_of(&o);
		for (int i = 0; i < N; i++) {
			float gr = g16 ? hpu__elem_from16(fp16, gh[i]) : g[i];
			P[i] = hpu__elem_optim(&k, P[i], gr, &M[i], &V[i]);
			if (g16)
				P16[i] = hpu__elem_to16(fp16, P[i]);
		}
	}
	assert_memory_equal(P, p, sizeof p);
	assert_memory_equal(M, m, sizeof m);
	assert_memory_equal(V, v, sizeof v);
	if (g16)
		assert_memory_equal(P16, p16, sizeof p16);
}

static void test_optimizers(void **state)
{
	(void)state;
	const hpu__dev_optim sgd = {.kind = HPU__DEV_SGD, .lr = 0.1, .weight_decay = 1e-4,
				    .gscale = 0.75f};
	hpu__dev_optim mom = sgd, nest = sgd;
	mom.momentum = 0.9;
	nest.momentum = 0.9;
	nest.nesterov = 1;
	const hpu__dev_optim adam = {.kind = HPU__DEV_ADAM, .lr = 1e-3, .weight_decay = 1e-2,
				     .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .gscale = 0.5f};
	hpu__dev_optim adamw = adam;
	adamw.kind = HPU__DEV_ADAMW;
	const hpu__dev_optim *all[] = {&sgd, &mom, &nest, &adam, &adamw};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
		optim_case(*all[i], 0, 0);
		optim_case(*all[i], 1, 0);
		optim_case(*all[i], 1, 1);
	}
}

/* ---- the step's decisions (hpu__dev_stepvars) ---- */

/* The clip factor over norms of every magnitude, NaN and Inf among them. */
static void test_clip_factor(void **state)
{
	(void)state;
	const double maxes[] = {0.5, 1.0, 3.7, 1e-3};
	for (size_t j = 0; j < sizeof maxes / sizeof *maxes; j++)
		for (int i = -2000; i <= 2000; i++) {
			double norm = i == 0 ? 0.0 : ldexp(1.0 + 0.000731 * (i + 2000), i / 40);
			if (i == 2000)
				norm = NAN;
			if (i == -2000)
				norm = INFINITY;
			float a = hpu__elem_clip_factor(norm, maxes[j]);
			float b = hpu__dev_clip_factor(norm, maxes[j]);
			if (memcmp(&a, &b, 4))
				fail_msg("clip factor of %.17g by %g: %.9g, device.h's %.9g", norm,
					 maxes[j], a, b);
		}
}

/* step_begin and step_end over the script (step_testlib.c): the kernels'
 * arithmetic against device_ops.c's, field by field after each. */
static void test_step_decisions(void **state)
{
	(void)state;
	char what[160];
	for (int c = 0; c < STEP_NCFG; c++) {
		const hpu__dev_stepcfg *cfg = &step_cfgs[c];
		hpu__dev_stepvars a, b;
		step_init(&a, cfg);
		step_init(&b, cfg);
		for (int i = 0; i < STEP_NSTEPS; i++) {
			step_inputs(&a, cfg, i);
			step_inputs(&b, cfg, i);
			hpu__elem_step_begin(&a, cfg);
			cpu->step_begin(&b, cfg);
			if (step_diff(&a, &b, what, sizeof what))
				fail_msg("%s, step %d, step_begin: %s (device_ops.c's last)",
					 step_cfg_names[c], i, what);
			hpu__elem_step_end(&a, cfg);
			cpu->step_end(&b, cfg);
			if (step_diff(&a, &b, what, sizeof what))
				fail_msg("%s, step %d, step_end: %s (device_ops.c's last)",
					 step_cfg_names[c], i, what);
		}
	}
}

/* A loss term's seed against device_ops.c's loss_seed on one element. */
static void test_loss_seed(void **state)
{
	(void)state;
	const double scales[] = {1.0, 65536.0, 24576.0, 3.0};
	const int batches[] = {1, 7, 33, 96, 100};
	for (size_t s = 0; s < sizeof scales / sizeof *scales; s++)
		for (size_t b = 0; b < sizeof batches / sizeof *batches; b++)
			for (int k = 0; k < 200; k++) {
				hpu__dev_stepvars sv = {.loss_scale = scales[s]};
				double sums[3] = {1.0, 2.0, 3.0};
				if (k % 50 == 49)
					sums[k % 3] = k % 2 ? NAN : -INFINITY;
				float w = frand(2.0f), base = frand(1.0f);
				float g = frand(1.0f), want = g;
				float v = hpu__elem_loss_seed(sums, 3, w, base, batches[b], sv.loss_scale);
				float got = g + v;
				cpu->loss_seed(&want, 1, sums, 3, w, base, batches[b], &sv);
				if (memcmp(&got, &want, 4) && !(got != got && want != want))
					fail_msg("loss seed w %.9g base %.9g scale %g batch %d: %.9g, "
						 "device_ops.c's %.9g",
						 w, base, scales[s], batches[b], got, want);
			}
}

/* The scalars the kernels make from hpu__dev_stepvars (hpu__elem_optk)
 * against the host's (hpu__cuda_optk_of), the same operations in C, over
 * t = 1 .. 20000 and learning rates of a schedule. */
static void test_optk(void **state)
{
	(void)state;
	const hpu__dev_optim kinds[] = {
	    {.kind = HPU__DEV_SGD, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = 1},
	    {.kind = HPU__DEV_ADAM, .weight_decay = 1e-2, .beta1 = 0.9, .beta2 = 0.999,
	     .eps = 1e-8},
	    {.kind = HPU__DEV_ADAMW, .weight_decay = 0.1, .beta1 = 0.8, .beta2 = 0.95,
	     .eps = 1e-6},
	};
	for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
		for (long t = 1; t <= 20000; t++) {
			hpu__dev_optim o = kinds[i];
			o.t = t;
			o.lr = 3e-4 * (1.0 + cos((double)t * 0.001));
			o.gscale = 1.0f / (float)(t % 7 + 1);
			hpu__cuda_optk a = hpu__elem_optk(&o, o.lr, o.t, o.gscale, NULL);
			hpu__cuda_optk b = hpu__cuda_optk_of(&o);
			if (memcmp(&a, &b, sizeof a))
				fail_msg("optimizer %d at t %ld: the kernels' scalars differ from the "
					 "host's (step %.9g and %.9g, inv_sqrt_bc2 %.9g and %.9g)",
					 (int)o.kind, t, a.step, b.step, a.inv_sqrt_bc2, b.inv_sqrt_bc2);
		}
}

/* ---- accuracy's arg-max ---- */

/* A row's arg-max as the kernels find it with `threads` threads
 * (cuops_kernels.cu's k_count_correct, cuops_layers.cu's
 * k_accuracy_pos): column 0 where hpu__elem_argmax_nan0, else each
 * thread's kept value (its columns t, t + threads, ...), the largest of
 * them (max_op: b > a ? b : a, over the threads in order), and the first
 * column holding it; `classes` for none. */
static int kernel_argmax(const float *z, int classes, int threads)
{
	if (hpu__elem_argmax_nan0(z[0]))
		return 0;
	float best[1024], m = -INFINITY;
	int at[1024], first = classes;
	for (int t = 0; t < threads; t++) {
		at[t] = classes;
		best[t] = -INFINITY;
		for (int c = t; c < classes; c += threads)
			if (hpu__elem_argmax_takes(z[c], best[t], at[t] < classes)) {
				best[t] = z[c];
				at[t] = c;
			}
		m = best[t] > m ? best[t] : m;
	}
	for (int t = 0; t < threads; t++)
		if (at[t] < classes && best[t] == m && at[t] < first)
			first = at[t];
	return first;
}

/* The host's arg-max (hpu__host_count_correct's scan), as the column
 * that counts a label of that column correct. */
static int host_argmax(const float *z, int classes)
{
	for (int y = 0; y < classes; y++) {
		int correct = 0;
		hpu__host_count_correct(z, &y, 1, classes, &correct);
		if (correct)
			return y;
	}
	return -1;
}

/* Rows of NaNs (first, last, everywhere, alone), infinities, signed
 * zeros and ties, at every thread count the kernels use and a few odd
 * ones: the kernels' arg-max is the host's, and so are the counts of
 * count_correct and accuracy_pos over them. */
static void test_argmax_nan(void **state)
{
	(void)state;
	const float N = NAN, I = INFINITY;
	static const struct {
		int n;
		float z[6];
	} rows[] = {
	    {3, {N, 1, 2}},  {3, {1, N, 2}},	  {3, {2, N, 1}},     {3, {1, 2, N}},
	    {3, {N, N, N}},  {3, {1, N, N}},	  {4, {N, I, -I, 0}}, {4, {-I, N, -I, N}},
	    {2, {-0.0f, 0}}, {2, {0, -0.0f}},	  {5, {3, 3, N, 3, 1}}, {1, {N}},
	    {6, {-1, -2, N, -1, N, -3}}, {4, {-I, -I, -I, -I}},
	};
	static const int threads[] = {1, 2, 3, 4, 32, 128, 512};
	int ok = 1;
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		int want = host_argmax(rows[i].z, rows[i].n);
		for (size_t k = 0; k < sizeof threads / sizeof threads[0]; k++) {
			int got = kernel_argmax(rows[i].z, rows[i].n, threads[k]);
			if (got != want) {
				printf("  row %zu (%d columns, %g %g %g ...), %d threads: arg-max %d, "
				       "the host's %d\n",
				       i, rows[i].n, rows[i].z[0], rows[i].z[1], rows[i].z[2],
				       threads[k], got, want);
				ok = 0;
			}
		}
	}
	/* random rows of 1000 columns, a NaN planted at a random column */
	float z[1000];
	for (int r = 0; r < 200; r++) {
		int n = 1 + r * 5;
		for (int c = 0; c < n; c++)
			z[c] = frand(4.0f);
		if (r % 3 == 0)
			z[(r * 7919) % n] = NAN;
		if (r % 5 == 0)
			z[0] = NAN;
		int want = host_argmax(z, n), got = kernel_argmax(z, n, 128);
		if (got != want) {
			printf("  random row %d (%d columns): arg-max %d, the host's %d\n", r, n, got,
			       want);
			ok = 0;
		}
		float acc = -1;
		long bad = 0;
		int32_t y = got < n ? got : 0, bl = 0;
		hpu__host_accuracy_pos(z, &y, &acc, 1, 1, n, &bad, &bl);
		if (got < n && acc != 1.0f) {
			printf("  random row %d: accuracy_pos counts the kernels' arg-max %d wrong\n",
			       r, got);
			ok = 0;
		}
	}
	assert_true(ok);
}

/* Dropout's row keys made on the device (backend.h's dropout_keys:
 * cuda_elem.h's for the GPU's kernel, the host table's for the CPU's
 * tables) are rand.c's (hpu_rand_key), for large seeds, layers, steps
 * and sample indices too, and the keys the runtime drew before they
 * moved to the device (hpu_rand_key of main at a41cc4e, pinned here). */
static void test_row_keys(void **state)
{
	(void)state;
	static const struct {
		uint64_t seed;
		int layer;
		int64_t step;
		uint32_t sample;
		uint64_t want;
	} c[] = {
	    {1, 0, 0, 0, 0x19cb84fec94a7311ull},
	    {42, 3, 7, 12345, 0x16241944c5e834abull},
	    {UINT64_MAX, 2147483647, INT64_MAX, UINT32_MAX, 0xf815ac7d60276071ull},
	    {0x0123456789abcdefull, -1, 1000000000000000ll, 4000000000u, 0x449891e4c2532e1eull},
	};
	for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
		hpu_ctx x = {.train = 1, .seed = c[i].seed, .layer = c[i].layer,
			     .step = (long)c[i].step, .batch = 1, .samples = &c[i].sample};
		uint64_t host = hpu_rand_key(&x, 0), table = 0;
		uint64_t dev = hpu__elem_row_key(c[i].seed, c[i].layer, &c[i].step, &c[i].sample, 0);
		assert_int_equal(hpu__host_dropout_keys(&table, &c[i].sample, &c[i].step, c[i].seed,
							c[i].layer, 1),
				 HPU_BE_OK);
		printf("  seed %#llx layer %d step %lld sample %u: rand.c %#llx, device %#llx, "
		       "host table %#llx\n",
		       (unsigned long long)c[i].seed, c[i].layer, (long long)c[i].step,
		       c[i].sample, (unsigned long long)host, (unsigned long long)dev,
		       (unsigned long long)table);
		assert_true(host == c[i].want);
		assert_true(dev == c[i].want);
		assert_true(table == c[i].want);
	}
	/* no sample indices: the row's index, as hpu_rand_key without them */
	int64_t step = 5;
	hpu_ctx x = {.train = 1, .seed = 9, .layer = 2, .step = 5, .batch = 4};
	assert_true(hpu__elem_row_key(9, 2, &step, NULL, 3) == hpu_rand_key(&x, 3));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_widen_every_value),
	    cmocka_unit_test(test_narrow_boundaries),
	    cmocka_unit_test(test_acc16),
	    cmocka_unit_test(test_sumsq),
	    cmocka_unit_test(test_sumsq16_batches),
	    cmocka_unit_test(test_optimizers),
	    cmocka_unit_test(test_clip_factor),
	    cmocka_unit_test(test_step_decisions),
	    cmocka_unit_test(test_loss_seed),
	    cmocka_unit_test(test_optk),
	    cmocka_unit_test(test_argmax_nan),
	    cmocka_unit_test(test_row_keys),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
