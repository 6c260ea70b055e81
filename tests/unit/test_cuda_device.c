/* test_cuda_device: the CUDA device (worker/cuda, hpudev_cuda.so) on a GPU.
 *
 * Loads the module (cuda_modlib.c: HPU_CUDA_MODULE, else $HPU_BUILD_DIR/lib) and sets up
 * its device without the kernel table (hpu_cuda_device_core_v1), then
 * checks devmem's memory over its remote backing (zeroed, reused, owned),
 * copies every way on the default queue and on a queue of its own, fills,
 * events, pinned host memory, and every runtime op (hpu__dev_rtops)
 * against the CPU's (device_ops.c) bit for bit at n = 1, 255, 257 and
 * 1e6+3; the step's decisions (flag_nonfinite(16), sumsq_add,
 * sumsq16_add, loss_seed at n = 0, 1, 255, 257, 100003 with NaN and Inf
 * planted first, in the middle and last; step_begin and step_end over
 * step_testlib.c's script; the optimizers reading hpu__dev_stepvars, a
 * skipped step among them; an evaluation's rows_add and loss_add)
 * against the CPU's too. Where the module is not built, or no GPU is visible, it says so
 * and exits 77 (ctest: skipped). Plain C, not cmocka: the skip needs its
 * own exit status. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/cuda_modlib.h"
#include "tests/unit/step_testlib.h"
#include "worker/device/device.h"

static int failures;
static const hpu__device *D;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                \
			printf(__VA_ARGS__);                                                       \
			printf("\n");                                                              \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
	return cu_mod_frand(&rng);
}

/* ---- device buffers through devmem (the module's backing) ---- */

static void *dev(size_t bytes)
{
	void *p = hpu__dalloc(HPU_MEM_OTHER, bytes, "test");
	if (!p) {
		printf("FAIL: %s\n", hpu__devmem_error());
		exit(1);
	}
	return p;
}

static void *up(const void *h, size_t bytes)
{
	void *d = dev(bytes);
	D->copy(NULL, d, h, bytes);
	return d;
}

static void *down(const void *d, size_t bytes)
{
	void *h = malloc(bytes ? bytes : 1);
	D->copy(NULL, h, d, bytes);
	return h;
}

/* The first difference of a and b (elements of `size` bytes), or -1. */
static long first_diff(const void *a, const void *b, size_t n, size_t size)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp((const char *)a + i * size, (const char *)b + i * size, size))
			return (long)i;
	return -1;
}

/* Device buffer d against host buffer want, n elements of `size`. */
static void same(const char *what, size_t n, const void *d, const void *want, size_t size)
{
	void *got = down(d, n * size);
	long i = first_diff(got, want, n, size);
	if (i >= 0 && size == 4)
		CHECK(0, "%s n=%zu: element %ld is %.9g, the CPU's %.9g", what, n, i,
		      ((float *)got)[i], ((const float *)want)[i]);
	else if (i >= 0 && size == 2)
		CHECK(0, "%s n=%zu: element %ld is 0x%04x, the CPU's 0x%04x", what, n, i,
		      ((uint16_t *)got)[i], ((const uint16_t *)want)[i]);
	else if (i >= 0)
		CHECK(0, "%s n=%zu: byte %ld is 0x%02x, not 0x%02x", what, n, i,
		      ((unsigned char *)got)[i], ((const unsigned char *)want)[i]);
	free(got);
}

/* ---- memory, copies, events, pinned memory ---- */

static void check_memory(void)
{
	static const size_t sizes[] = {1, 255, 257, 4096, 1000003};
	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
		size_t n = sizes[k];
		unsigned char *p = dev(n), *pat = malloc(n), *back;
		CHECK(D->owns(p), "devmem's block is not device memory");
		CHECK(!D->owns(pat), "malloc's memory is taken for device memory");
		back = down(p, n);
		for (size_t i = 0; i < n; i++)
			if (back[i]) {
				CHECK(0, "a fresh block of %zu bytes is not zero at %zu", n, i);
				break;
			}
		free(back);
		for (size_t i = 0; i < n; i++)
			pat[i] = (unsigned char)(i * 7 + 1);
		D->copy(NULL, p, pat, n);
		hpu__dfree(p);
		unsigned char *q = dev(n); /* the same block again, zeroed again */
		CHECK(q == p, "a freed block of %zu bytes is not reused", n);
		back = down(q, n);
		for (size_t i = 0; i < n; i++)
			if (back[i]) {
				CHECK(0, "a reused block of %zu bytes is not zero at %zu", n, i);
				break;
			}
		free(back);
		/* h2d, d2d on a queue of its own, fill, d2h */
		hpu__dev_queue *qu = D->queue_new();
		CHECK(qu != NULL, "queue_new failed");
		unsigned char *r = dev(n);
		D->copy(NULL, q, pat, n);
		hpu__dev_event ev;
		D->record(NULL, &ev);
		D->wait(&ev);
		D->copy(qu, r, q, n);
		D->record(qu, &ev);
		D->wait(&ev);
		same("h2d, d2d on a queue, d2h", n, r, pat, 1);
		D->fill(NULL, r, 0xab, n / 2);
		D->record(NULL, &ev);
		D->wait(&ev);
		memset(pat, 0xab, n / 2);
		same("fill", n, r, pat, 1);
		/* pinned host memory: zeroed, a copy's either side */
		unsigned char *h = D->host_alloc(n);
		CHECK(h != NULL && ((uintptr_t)h % 64) == 0, "host_alloc: NULL or misaligned");
		CHECK(!D->owns(h), "pinned memory is taken for device memory");
		for (size_t i = 0; h && i < n; i++)
			if (h[i]) {
				CHECK(0, "pinned memory of %zu bytes is not zero at %zu", n, i);
				break;
			}
		if (h) {
			D->copy(qu, h, r, n);
			CHECK(memcmp(h, pat, n) == 0, "d2h into pinned memory differs");
			D->host_free(h);
		}
		D->queue_free(qu);
		hpu__dfree(q);
		hpu__dfree(r);
		free(pat);
	}
	printf("memory, copies, fills, events, pinned memory: checked\n");
}

/* ---- the runtime ops against device_ops.c ---- */

static const hpu__dev_rtops *cpu = &hpu__dev_cpu_rtops;

static float *randf(size_t n, int planted)
{
	float *x = malloc((n ? n : 1) * sizeof *x);
	for (size_t i = 0; i < n; i++)
		x[i] = frand();
	if (planted && n) {
		x[n / 2] = 1.0f / 0.0f;
		x[n - 1] = -0.0f;
	}
	return x;
}

static uint16_t *rand16(int fp16, size_t n)
{
	float *f = randf(n, 0);
	uint16_t *h = malloc((n ? n : 1) * 2);
	cpu->to16(fp16, h, f, n);
	free(f);
	return h;
}

static void check_casts(size_t n)
{
	for (int fp16 = 0; fp16 < 2; fp16++) {
		float *x = randf(n, 1), *f = malloc(n * 4);
		uint16_t *want = malloc(n * 2), *h = rand16(fp16, n), *acc = malloc(n * 2);
		float *dx = up(x, n * 4), *df = dev(n * 4);
		uint16_t *dh = dev(n * 2), *dacc = up(h, n * 2);
		cpu->to16(fp16, want, x, n);
		D->rt->to16(fp16, dh, dx, n);
		same(fp16 ? "to16 fp16" : "to16 bf16", n, dh, want, 2);
		cpu->from16(fp16, f, h, n);
		uint16_t *dh2 = up(h, n * 2);
		D->rt->from16(fp16, df, dh2, n);
		same(fp16 ? "from16 fp16" : "from16 bf16", n, df, f, 4);
		memcpy(acc, h, n * 2);
		cpu->acc16(fp16, acc, x, n);
		D->rt->acc16(fp16, dacc, dx, n);
		same("acc16", n, dacc, acc, 2);
		long cpu_count = fp16 ? 0 : cpu->count_nonfinite16(want, n);
		if (!fp16)
			CHECK(D->rt->count_nonfinite16(dh, n) == cpu_count,
			      "count_nonfinite16 n=%zu: not the CPU's %ld", n, cpu_count);
		CHECK(D->rt->nonfinite16(fp16, dh, n) == cpu->nonfinite16(fp16, want, n),
		      "nonfinite16 n=%zu differs", n);
		CHECK(D->rt->nonfinite16(fp16, dh2, n) == cpu->nonfinite16(fp16, h, n),
		      "nonfinite16 (finite) n=%zu differs", n);
		hpu__dfree(dx);
		hpu__dfree(df);
		hpu__dfree(dh);
		hpu__dfree(dh2);
		hpu__dfree(dacc);
		free(x);
		free(f);
		free(want);
		free(h);
		free(acc);
	}
}

static void check_bf16_and_sums(size_t n)
{
	float *x = randf(n, 0), *y = randf(n, 1), *e = malloc(n * 4);
	uint16_t *want = malloc(n * 2);
	float *dx = up(x, n * 4), *dy = up(y, n * 4), *de = dev(n * 4);
	uint16_t *dw = dev(n * 2);
	/* bf16_exact: on random values (not exact), then on their bf16s */
	int cx = cpu->bf16_exact(want, x, n), gx = D->rt->bf16_exact(dw, dx, n);
	CHECK(cx == gx, "bf16_exact n=%zu: %d, the CPU's %d", n, gx, cx);
	same("bf16_exact", n, dw, want, 2);
	cpu->bf16_expand(e, want, n);
	D->rt->bf16_expand(de, dw, n);
	same("bf16_expand", n, de, e, 4);
	CHECK(D->rt->bf16_exact(dw, de, n) == 1, "bf16_exact n=%zu: bf16 values not exact", n);
	/* sums of squares: equal doubles */
	double cs = cpu->sumsq(x, n), gs = D->rt->sumsq(dx, n);
	CHECK(cs == gs, "sumsq n=%zu: %.17g, the CPU's %.17g", n, gs, cs);
	cs = cpu->sumsq(y, n), gs = D->rt->sumsq(dy, n); /* an Inf: redone in double */
	CHECK(cs == gs || (cs != cs && gs != gs), "sumsq (Inf) n=%zu: %.17g, the CPU's %.17g", n,
	      gs, cs);
	for (int fp16 = 0; fp16 < 2; fp16++) {
		uint16_t *h = rand16(fp16, n);
		uint16_t *dh = up(h, n * 2);
		size_t chunk = 300;
		float *scr = malloc(chunk * 4), *dscr = dev(chunk * 4);
		cs = cpu->sumsq16(0.5, fp16, h, n, scr, chunk);
		gs = D->rt->sumsq16(0.5, fp16, dh, n, dscr, chunk);
		CHECK(cs == gs, "sumsq16 n=%zu: %.17g, the CPU's %.17g", n, gs, cs);
		hpu__dfree(dh);
		hpu__dfree(dscr);
		free(h);
		free(scr);
	}
	/* a loss's sum: equal doubles, into device memory */
	double csum = -1, gsum = -1, *dsum = dev(sizeof(double));
	cpu->sum(&csum, x, n);
	D->rt->sum(dsum, dx, n);
	double *hsum = down(dsum, sizeof gsum);
	gsum = *hsum;
	free(hsum);
	CHECK(csum == gsum, "sum n=%zu: %.17g, the CPU's %.17g", n, gsum, csum);
	hpu__dfree(dsum);
	/* checks */
	CHECK(D->rt->nonfinite(dx, n) == cpu->nonfinite(x, n), "nonfinite n=%zu differs", n);
	CHECK(D->rt->nonfinite(dy, n) == cpu->nonfinite(y, n), "nonfinite (Inf) n=%zu differs", n);
	CHECK(D->rt->count_nonfinite(dy, n) == cpu->count_nonfinite(y, n),
	      "count_nonfinite n=%zu differs", n);
	/* add, add_scalar */
	cpu->add(x, y, n);
	D->rt->add(dx, dy, n);
	same("add", n, dx, x, 4);
	cpu->add_scalar(x, 0.3f, n);
	D->rt->add_scalar(dx, 0.3f, n);
	same("add_scalar", n, dx, x, 4);
	hpu__dfree(dx);
	hpu__dfree(dy);
	hpu__dfree(de);
	hpu__dfree(dw);
	free(x);
	free(y);
	free(e);
	free(want);
}

/* Three steps of optimizer k on both, 16-bit gradients or not. */
static void check_optim(size_t n, hpu__dev_optim k, const char *name, int g16, int fp16)
{
	float *p = randf(n, 0), *g = randf(n, 0), *m = calloc(n, 4), *v = calloc(n, 4);
	uint16_t *gh = malloc(n * 2), *p16 = calloc(n, 2);
	cpu->to16(fp16, gh, g, n);
	float *dp = up(p, n * 4), *dg = up(g, n * 4), *dm = dev(n * 4), *dv = dev(n * 4);
	uint16_t *dgh = up(gh, n * 2), *dp16 = dev(n * 2);
	size_t chunk = 1000;
	float *scr = malloc(chunk * 4), *dscr = dev(chunk * 4);
	for (k.t = 1; k.t <= 3; k.t++) {
		if (g16) {
			cpu->optim16(&k, fp16, p, gh, p16, m, v, n, scr, chunk);
			D->rt->optim16(&k, fp16, dp, dgh, dp16, dm, dv, n, dscr, chunk);
		} else {
			cpu->optim(&k, p, g, m, v, n);
			D->rt->optim(&k, dp, dg, dm, dv, n);
		}
	}
	char what[96];
	snprintf(what, sizeof what, "%s%s p", name, g16 ? (fp16 ? " fp16" : " bf16") : "");
	same(what, n, dp, p, 4);
	snprintf(what, sizeof what, "%s m", name);
	same(what, n, dm, m, 4);
	if (k.kind != HPU__DEV_SGD)
		same("adam v", n, dv, v, 4);
	if (g16)
		same("optim16 p16", n, dp16, p16, 2);
	void *bufs[] = {dp, dg, dm, dv, dgh, dp16, dscr};
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
		hpu__dfree(bufs[i]);
	free(p);
	free(g);
	free(m);
	free(v);
	free(gh);
	free(p16);
	free(scr);
}

static void check_optimizers(size_t n)
{
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
	check_optim(n, sgd, "sgd", 0, 0);
	check_optim(n, mom, "sgd momentum", 0, 0);
	check_optim(n, nest, "sgd nesterov", 0, 0);
	check_optim(n, adam, "adam", 0, 0);
	check_optim(n, adamw, "adamw", 0, 0);
	check_optim(n, adamw, "adamw", 1, 0);
	check_optim(n, adam, "adam", 1, 1);
	check_optim(n, mom, "sgd momentum", 1, 0);
}

/* ---- the step's decisions (hpu__dev_stepvars) against device_ops.c ----
 * Each buffer at least one element (n = 0 among the sizes). */

#define AT_LEAST1(n) ((n) ? (n) : 1)

static float flag_of(const float *dflag)
{
	float f;
	D->copy(NULL, &f, dflag, 4);
	return f;
}

/* flag_nonfinite(16) from 0 and from 1, against the CPU's, on g[n]
 * (fp32, then its fp16 and bf16 roundings). */
static void flag_case(size_t n, const float *g, const char *where)
{
	const float zero = 0.0f, one = 1.0f;
	float cflag, *dflag = dev(4), *dg = up(g, AT_LEAST1(n) * 4);
	uint16_t *h = malloc(AT_LEAST1(n) * 2);
	for (int start = 0; start < 2; start++) {
		cflag = start ? one : zero;
		D->copy(NULL, dflag, start ? &one : &zero, 4);
		cpu->flag_nonfinite(&cflag, g, n);
		D->rt->flag_nonfinite(dflag, dg, n);
		float got = flag_of(dflag);
		CHECK(got == cflag, "flag_nonfinite n=%zu (%s, flag %d before): %g, the CPU's %g", n,
		      where, start, got, cflag);
	}
	for (int fp16 = 0; fp16 < 2; fp16++) {
		cpu->to16(fp16, h, g, n);
		uint16_t *dh = up(h, AT_LEAST1(n) * 2);
		for (int start = 0; start < 2; start++) {
			cflag = start ? one : zero;
			D->copy(NULL, dflag, start ? &one : &zero, 4);
			cpu->flag_nonfinite16(&cflag, fp16, h, n);
			D->rt->flag_nonfinite16(dflag, fp16, dh, n);
			float got = flag_of(dflag);
			CHECK(got == cflag,
			      "flag_nonfinite16 %s n=%zu (%s, flag %d before): %g, the CPU's %g",
			      fp16 ? "fp16" : "bf16", n, where, start, got, cflag);
		}
		hpu__dfree(dh);
	}
	hpu__dfree(dflag);
	hpu__dfree(dg);
	free(h);
}

/* *acc (device) against want: the same double, or both NaN. */
static void same_double(const char *what, size_t n, const double *dacc, double want)
{
	double got;
	D->copy(NULL, &got, dacc, 8);
	CHECK(!memcmp(&got, &want, 8) || (got != got && want != want),
	      "%s n=%zu: %.17g, the CPU's %.17g", what, n, got, want);
}

static void sumsq_case(size_t n, const float *g, int with16, const char *where)
{
	char what[96];
	const double acc0 = 0.3;
	double cacc = acc0, *dacc = up(&acc0, 8);
	float *dg = up(g, AT_LEAST1(n) * 4);
	cpu->sumsq_add(&cacc, g, n);
	D->rt->sumsq_add(dacc, dg, n);
	snprintf(what, sizeof what, "sumsq_add (%s)", where);
	same_double(what, n, dacc, cacc);
	/* twice onto the same sum: the second adds onto the first */
	cpu->sumsq_add(&cacc, g, n);
	D->rt->sumsq_add(dacc, dg, n);
	snprintf(what, sizeof what, "sumsq_add twice (%s)", where);
	same_double(what, n, dacc, cacc);
	const size_t chunk = 300;
	float *scr = malloc(chunk * 4), *dscr = dev(chunk * 4);
	uint16_t *h = malloc(AT_LEAST1(n) * 2);
	for (int fp16 = 0; fp16 < 2 && with16; fp16++) {
		cpu->to16(fp16, h, g, n);
		uint16_t *dh = up(h, AT_LEAST1(n) * 2);
		cacc = acc0;
		D->copy(NULL, dacc, &acc0, 8);
		cpu->sumsq16_add(&cacc, fp16, h, n, scr, chunk);
		D->rt->sumsq16_add(dacc, fp16, dh, n, dscr, chunk);
		snprintf(what, sizeof what, "sumsq16_add %s (%s)", fp16 ? "fp16" : "bf16", where);
		same_double(what, n, dacc, cacc);
		hpu__dfree(dh);
	}
	hpu__dfree(dacc);
	hpu__dfree(dg);
	hpu__dfree(dscr);
	free(scr);
	free(h);
}

/* loss_seed on g[n]: the CPU's bits, NaN where the CPU's is (a GPU's NaN
 * may carry other bits), and the CPU's sv->bad. bad: which sum is not
 * finite (-1 none). */
static void seed_case(size_t n, const float *g, int bad)
{
	double sums[5] = {1.5, -2.25, 1e300, 0.0, 3.0};
	if (bad >= 0)
		sums[bad] = bad == 2 ? (double)NAN : bad ? (double)INFINITY : -(double)INFINITY;
	hpu__dev_stepvars sv = {.loss_scale = 24576.0};
	float *want = malloc(AT_LEAST1(n) * 4);
	memcpy(want, g, n * 4);
	/* w * (s / batch) would round otherwise with these */
	const float w = 0.3f, base = 0.37f;
	const int batch = 33;
	hpu__dev_stepvars *dsv = up(&sv, sizeof sv); /* bad 0, before the CPU's sets it */
	cpu->loss_seed(want, n, sums, 5, w, base, batch, &sv);
	float *dg = up(g, AT_LEAST1(n) * 4);
	double *dsums = up(sums, sizeof sums);
	D->rt->loss_seed(dg, n, dsums, 5, w, base, batch, dsv);
	float *got = down(dg, AT_LEAST1(n) * 4);
	hpu__dev_stepvars *gsv = down(dsv, sizeof sv);
	CHECK(gsv->bad == sv.bad, "loss_seed n=%zu (%s %d): sv->bad %g, the CPU's %g", n,
	      bad < 0 ? "every sum finite" : "not finite: sum", bad, (double)gsv->bad,
	      (double)sv.bad);
	free(gsv);
	for (size_t i = 0; i < n; i++)
		if (memcmp(&got[i], &want[i], 4) && !(got[i] != got[i] && want[i] != want[i])) {
			CHECK(0, "loss_seed n=%zu (%s %d) at %zu: %.9g, the CPU's %.9g", n,
			      bad < 0 ? "every sum finite" : "not finite: sum", bad, i, got[i],
			      want[i]);
			break;
		}
	hpu__dfree(dg);
	hpu__dfree(dsums);
	hpu__dfree(dsv);
	free(want);
	free(got);
}

/* Every op of the step at n, NaN and Inf at the first, a middle and the
 * last element in turn. */
static void check_step_ops(size_t n)
{
	float *g = randf(n, 0);
	flag_case(n, g, "finite");
	sumsq_case(n, g, 1, "finite");
	const int bad_sum[] = {-1, 0, 2, 4}; /* none, the first, the middle, the last */
	for (int j = 0; j < 4; j++)
		seed_case(n, g, bad_sum[j]);
	const size_t at[3] = {0, n / 2, n ? n - 1 : 0};
	const float v[3] = {NAN, INFINITY, -INFINITY};
	for (int j = 0; j < 3 && n; j++) {
		char where[64];
		float keep = g[at[j]];
		g[at[j]] = v[j];
		snprintf(where, sizeof where, "%g at %zu", v[j], at[j]);
		flag_case(n, g, where);
		sumsq_case(n, g, 1, where);
		g[at[j]] = keep;
	}
	free(g);
}

/* An evaluation's sums: rows_add over the first rows of g[n] (all, half,
 * more than n), twice onto the same double; loss_add for a few rows. */
static void check_eval_sums(size_t n)
{
	float *g = randf(n, 1);
	float *dg = up(g, AT_LEAST1(n) * 4);
	int *drows = dev(sizeof(int));
	const int rows_of[3] = {(int)n, (int)(n / 2), (int)n + 3};
	for (int j = 0; j < 3; j++) {
		int rows = rows_of[j];
		const double acc0 = 0.3;
		double cacc = acc0, *dacc = up(&acc0, 8);
		D->copy(NULL, drows, &rows, sizeof rows);
		for (int twice = 0; twice < 2; twice++) {
			cpu->rows_add(&cacc, g, n, &rows);
			D->rt->rows_add(dacc, dg, n, drows);
		}
		char what[64];
		snprintf(what, sizeof what, "rows_add x2 (rows %d)", rows);
		same_double(what, n, dacc, cacc);
		hpu__dfree(dacc);
	}
	const double sums[3] = {12.345678901, -0.25, 7e-3}, w[3] = {1.0, 0.30000001192092896, 2.5};
	double *dsums = up(sums, sizeof sums), *dw = up(w, sizeof w);
	for (int rows = 1; rows < 40; rows += 7) {
		const double acc0 = 1.75;
		double cacc = acc0, *dacc = up(&acc0, 8);
		D->copy(NULL, drows, &rows, sizeof rows);
		cpu->loss_add(&cacc, sums, w, 3, &rows);
		D->rt->loss_add(dacc, dsums, dw, 3, drows);
		char what[64];
		snprintf(what, sizeof what, "loss_add (rows %d)", rows);
		same_double(what, n, dacc, cacc);
		hpu__dfree(dacc);
	}
	hpu__dfree(dsums);
	hpu__dfree(dw);
	hpu__dfree(drows);
	hpu__dfree(dg);
	free(g);
}

/* sumsq_add over more parts than the module sums at once (65536 blocks
 * of 256): the batches' totals carried in order. */
static void check_sumsq_batches(void)
{
	const size_t n = (size_t)65536 * 256 * 2 + 12345;
	float *g = randf(n, 0);
	sumsq_case(n, g, 0, "three batches of parts");
	free(g);
	printf("sumsq_add over %zu values (three batches of parts): checked\n", n);
}

/* step_begin and step_end over the script, the GPU's block against the
 * CPU's after each op, field by field. */
static void check_step_script(void)
{
	char what[160];
	for (int c = 0; c < STEP_NCFG; c++) {
		const hpu__dev_stepcfg *cfg = &step_cfgs[c];
		hpu__dev_stepvars ref, got;
		step_init(&ref, cfg);
		hpu__dev_stepvars *dsv = up(&ref, sizeof ref);
		for (int i = 0; i < STEP_NSTEPS; i++) {
			step_inputs(&ref, cfg, i);
			D->copy(NULL, &dsv->bad, &ref.bad, sizeof ref.bad);
			D->copy(NULL, &dsv->sumsq, &ref.sumsq, sizeof ref.sumsq);
			cpu->step_begin(&ref, cfg);
			D->rt->step_begin(dsv, cfg);
			D->copy(NULL, &got, dsv, sizeof got);
			if (step_diff(&got, &ref, what, sizeof what)) {
				CHECK(0, "%s, step %d, step_begin: %s (the GPU's, the CPU's)",
				      step_cfg_names[c], i, what);
				break;
			}
			cpu->step_end(&ref, cfg);
			D->rt->step_end(dsv, cfg);
			D->copy(NULL, &got, dsv, sizeof got);
			if (step_diff(&got, &ref, what, sizeof what)) {
				CHECK(0, "%s, step %d, step_end: %s (the GPU's, the CPU's)",
				      step_cfg_names[c], i, what);
				break;
			}
		}
		hpu__dfree(dsv);
	}
	printf("step_begin, step_end: %d configurations of %d steps checked\n", STEP_NCFG,
	       STEP_NSTEPS);
}

/* d[n] floats against want: the same bits; where not, within rel
 * (relative to max(|want|, 1e-6)) and a NOTE saying so, else a failure. */
static void near(const char *what, size_t n, const float *d, const float *want, double rel)
{
	float *got = down(d, AT_LEAST1(n) * 4);
	size_t diff = 0, worst_i = 0;
	double worst = 0;
	for (size_t i = 0; i < n; i++) {
		if (!memcmp(&got[i], &want[i], 4))
			continue;
		diff++;
		double den = fabs(want[i]) > 1e-6 ? fabs(want[i]) : 1e-6;
		double r = got[i] != got[i] ? INFINITY : fabs((double)got[i] - want[i]) / den;
		if (r >= worst)
			worst = r, worst_i = i;
	}
	if (diff)
		printf("NOTE %s n=%zu: %zu elements not bit for bit, the largest relative "
		       "difference %.3g at %zu (%.9g, %.9g)\n",
		       what, n, diff, worst, worst_i, got[worst_i], want[worst_i]);
	CHECK(worst <= rel, "%s n=%zu: element %zu is %.9g, %.9g wanted (%.3g relative)", what,
	      n, worst_i, got[worst_i], want[worst_i], worst);
	free(got);
}

/* One optimizer over four steps, the third skipped (sv->skip): on the GPU
 * with sv (lr, t, gscale from device memory; the by-value ones beside it
 * wrong on purpose), on the GPU by value, and on the CPU with sv. With
 * sv, Adam's beta powers are the host's (sv->bp1, bp2: glibc's pow, as
 * the CPU's update computes them), so the GPU and the CPU agree bit for
 * bit whatever the betas; by value the GPU uses CUDA's pow, which may
 * round to the neighbouring float with torch's (0.9, 0.999): p within
 * 1e-6 there. The skipped step leaves the GPU's p, m, v and p16 as they
 * were, bit for bit. */
static void optim_sv_case(size_t n, hpu__dev_optim k, const char *name, int g16, int fp16)
{
	const size_t n1 = AT_LEAST1(n), chunk = 1000;
	float *p = randf(n, 0), *g = randf(n, 0), *m = calloc(n1, 4), *v = calloc(n1, 4);
	uint16_t *gh = malloc(n1 * 2), *p16 = calloc(n1, 2);
	float *scr = malloc(chunk * 4), *dscr = dev(chunk * 4);
	cpu->to16(fp16, gh, g, n);
	float *dg = up(g, n1 * 4), *dp[2], *dm[2], *dv[2];
	uint16_t *dgh = up(gh, n1 * 2), *dp16[2];
	for (int j = 0; j < 2; j++) { /* 0: with sv, 1: by value */
		dp[j] = up(p, n1 * 4);
		dm[j] = dev(n1 * 4);
		dv[j] = dev(n1 * 4);
		dp16[j] = dev(n1 * 2);
	}
	hpu__dev_stepvars sv = {0};
	hpu__dev_stepvars *dsv = up(&sv, sizeof sv);
	char what[128];
	for (int step = 1; step <= 4; step++) {
		sv.skip = step == 3;
		sv.t = step < 3 ? step : step - 1;
		sv.lr = 0.01 / step;
		sv.gscale = 0.5f + 0.125f * (float)step;
		sv.bp1 = pow(k.beta1, (double)sv.t);
		sv.bp2 = pow(k.beta2, (double)sv.t);
		D->copy(NULL, dsv, &sv, sizeof sv);
		hpu__dev_optim kc = k, kg = k, kv = k;
		kc.sv = &sv; /* the CPU's reads host memory */
		kg.sv = dsv;
		kg.t = 99, kg.lr = 5.0, kg.gscale = 3.0f;
		kv.t = sv.t, kv.lr = sv.lr, kv.gscale = sv.gscale;
		float *before = down(dp[0], n1 * 4), *mb = down(dm[0], n1 * 4);
		float *vb = down(dv[0], n1 * 4);
		uint16_t *p16b = down(dp16[0], n1 * 2);
		if (g16) {
			cpu->optim16(&kc, fp16, p, gh, p16, m, v, n, scr, chunk);
			D->rt->optim16(&kg, fp16, dp[0], dgh, dp16[0], dm[0], dv[0], n, dscr, chunk);
			if (!sv.skip)
				D->rt->optim16(&kv, fp16, dp[1], dgh, dp16[1], dm[1], dv[1], n, dscr,
					       chunk);
		} else {
			cpu->optim(&kc, p, g, m, v, n);
			D->rt->optim(&kg, dp[0], dg, dm[0], dv[0], n);
			if (!sv.skip)
				D->rt->optim(&kv, dp[1], dg, dm[1], dv[1], n);
		}
		if (sv.skip) {
			snprintf(what, sizeof what, "%s with sv, a skipped step: p", name);
			same(what, n, dp[0], before, 4);
			same("a skipped step: m", n, dm[0], mb, 4);
			same("a skipped step: v", n, dv[0], vb, 4);
			same("a skipped step: p16", n, dp16[0], p16b, 2);
		}
		free(before);
		free(mb);
		free(vb);
		free(p16b);
	}
	const int exact = k.kind == HPU__DEV_SGD || (k.beta1 == 0.5 && k.beta2 == 0.25);
	const char *kind = g16 ? (fp16 ? " fp16" : " bf16") : "";
	float *bv = down(dp[1], n1 * 4);
	snprintf(what, sizeof what, "%s%s with sv against the CPU's: p", name, kind);
	near(what, n, dp[0], p, 0);
	snprintf(what, sizeof what, "%s%s with sv against by value: p", name, kind);
	near(what, n, dp[0], bv, exact ? 0 : 1e-6);
	snprintf(what, sizeof what, "%s%s with sv: m", name, kind);
	same(what, n, dm[0], m, 4);
	snprintf(what, sizeof what, "%s%s with sv: v", name, kind);
	if (k.kind != HPU__DEV_SGD)
		same(what, n, dv[0], v, 4);
	snprintf(what, sizeof what, "%s%s with sv: p16", name, kind);
	if (g16)
		same(what, n, dp16[0], p16, 2);
	for (int j = 0; j < 2; j++) {
		hpu__dfree(dp[j]);
		hpu__dfree(dm[j]);
		hpu__dfree(dv[j]);
		hpu__dfree(dp16[j]);
	}
	void *bufs[] = {dg, dgh, dsv, dscr};
	for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
		hpu__dfree(bufs[i]);
	free(bv);
	free(p);
	free(g);
	free(m);
	free(v);
	free(gh);
	free(p16);
	free(scr);
}

static void check_optim_sv(size_t n)
{
	const hpu__dev_optim mom = {.kind = HPU__DEV_SGD, .momentum = 0.9, .weight_decay = 1e-4};
	const hpu__dev_optim adam = {.kind = HPU__DEV_ADAM, .weight_decay = 1e-2, .beta1 = 0.5,
				     .beta2 = 0.25, .eps = 1e-8};
	hpu__dev_optim adamw = adam, torch = adam;
	adamw.kind = HPU__DEV_ADAMW;
	torch.kind = HPU__DEV_ADAMW;
	torch.beta1 = 0.9;
	torch.beta2 = 0.999;
	optim_sv_case(n, mom, "sgd momentum", 0, 0);
	optim_sv_case(n, adam, "adam (exact betas)", 0, 0);
	optim_sv_case(n, adamw, "adamw (exact betas)", 1, 0);
	optim_sv_case(n, adam, "adam (exact betas)", 1, 1);
	optim_sv_case(n, torch, "adamw (torch's betas)", 0, 0);
	optim_sv_case(n, torch, "adamw (torch's betas)", 1, 0);
}

/* ---- the options ---- */

/* --device-memory above the GPU's memory is refused, naming both; at
 * most that is taken, and --allow-tf32 is said in the note. */
static void check_configure(void)
{
	char err[512] = "", note[512] = "", want[512];
	uint64_t cap = 0;
	hpu__dev_config c = {0};
	CHECK(D->configure(&c, &cap, note, sizeof note, err, sizeof err) == 0, "configure: %s", err);
	CHECK(cap > 0, "configure gave no capacity");
	printf("GPU: %s\n", note);
	c.memory_limit = cap + 1;
	CHECK(D->configure(&c, &cap, note, sizeof note, err, sizeof err) == -1,
	      "--device-memory of %llu bytes, 1 more than the GPU's, is taken",
	      (unsigned long long)c.memory_limit);
	printf("GPU: refused: %s\n", err);
	/* the whole sentence, with the GPU's index and name as it gives them */
	int dev = -1;
	char name[256] = "";
	const char *at = strstr(err, "is more than GPU "), *end = strstr(err, ") has: ");
	if (at && end && sscanf(at, "is more than GPU %d (", &dev) == 1 && strchr(at, '(') < end)
		snprintf(name, sizeof name, "%.*s", (int)(end - strchr(at, '(') - 1),
			 strchr(at, '(') + 1);
	double gib = 1024.0 * 1024.0 * 1024.0;
	snprintf(want, sizeof want,
		 "--device-memory %llu bytes (%.1f GiB) is more than GPU %d (%s) has: %llu bytes (%.1f GiB) in all",
		 (unsigned long long)(cap + 1), (double)(cap + 1) / gib, dev, name,
		 (unsigned long long)cap, (double)cap / gib);
	CHECK(dev >= 0 && !strcmp(err, want), "the refusal is '%s', not '%s'", err, want);
	c.memory_limit = cap;
	c.allow_tf32 = 1;
	CHECK(D->configure(&c, &cap, note, sizeof note, err, sizeof err) == 0,
	      "--device-memory of the GPU's whole memory is refused: %s", err);
	CHECK(strstr(note, "TF32 for fp32 GEMMs and convolutions allowed") != NULL,
	      "--allow-tf32 is not in the note '%s'", note);
}

/* ---- loading ---- */

static const hpu__device *load(void)
{
	char path[4096];
	cu_mod_path(path, sizeof path);
	return cu_mod_load(path, "");
}

/* Every runtime op and every table member the runtime calls is filled
 * (a NULL one is a jump to address 0 in the middle of a step). */
static void check_filled(void)
{
	const void *const *f = (const void *const *)D->rt;
	size_t nf = sizeof(hpu__dev_rtops) / sizeof(void *);
	for (size_t i = 0; i < nf; i++)
		CHECK(f[i] != NULL, "runtime op %zu of %zu (hpu__dev_rtops, device.h's order) is NULL",
		      i, nf);
	CHECK(D->setup && D->teardown && D->caps && D->copy && D->fill && D->record && D->wait &&
		      D->host_alloc && D->host_free && D->ops && D->owns && D->backing &&
		      D->queue_new && D->queue_free && D->configure && D->coll,
	      "a member of the device table is NULL");
}

int main(void)
{
	D = load();
	check_filled();
	char err[512];
	if (D->setup(0, err, sizeof err) < 0) {
		printf("FAIL: setup: %s\n", err);
		return 1;
	}
	hpu__dev_caps caps;
	D->caps(&caps);
	CHECK(!caps.host_can_read && caps.can_capture && caps.bf16_native,
	      "caps: host_can_read %d, can_capture %d, bf16_native %d", caps.host_can_read,
	      caps.can_capture, caps.bf16_native);
	printf("GPU: fp8_native %d, GPU %d of %d\n", caps.fp8_native, caps.gpu, caps.gpus);
	CHECK(caps.gpus > 0 && caps.gpu >= 0 && caps.gpu < caps.gpus,
	      "caps: GPU %d of %d (the default memory limit divides by the workers on it)",
	      caps.gpu, caps.gpus);
	check_configure();
	hpu__devmem_set_backing(D->backing);
	if (hpu__devmem_init(0, 0) < 0) {
		printf("FAIL: devmem: %s\n", hpu__devmem_error());
		return 1;
	}
	check_memory();
	static const size_t ns[] = {1, 255, 257, 1000003};
	for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
		check_casts(ns[i]);
		check_bf16_and_sums(ns[i]);
		check_optimizers(ns[i]);
		printf("runtime ops at n = %zu: checked against the CPU's\n", ns[i]);
	}
	static const size_t step_ns[] = {0, 1, 255, 257, 100003};
	for (size_t i = 0; i < sizeof step_ns / sizeof step_ns[0]; i++) {
		check_step_ops(step_ns[i]);
		check_optim_sv(step_ns[i]);
		check_eval_sums(step_ns[i]);
		printf("the step's ops at n = %zu: checked against the CPU's\n", step_ns[i]);
	}
	check_sumsq_batches();
	check_step_script();
	hpu_device_stats s;
	hpu__devmem_stats(&s);
	CHECK(s.in_use == 0, "%llu bytes of device memory still in use",
	      (unsigned long long)s.in_use);
	hpu__devmem_shutdown();
	hpu__devmem_set_backing(NULL);
	D->teardown();
	printf("%s\n", failures ? "FAILED" : "passed");
	return failures ? 1 : 0;
}
