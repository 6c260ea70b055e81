/* gemm-ceiling: single-thread GFLOP/s of the matrix products our example
 * models train with, in OpenBLAS sgemm, oneDNN matmul f32 and oneDNN matmul
 * bf16 (bf16 src and weights, f32 dst), and for the CNN's convolutions also
 * oneDNN's convolution primitives (f32, and bf16 in / f32 out) -- the
 * ceiling of what a step's products can cost on one core.
 *
 *   gemm-ceiling [-m mlp|cnn|gpt_lm|all] [-b BATCH] [-B LM_BATCH]
 *                [-v LM_VOCAB] [-t SECONDS] [-c CORE]
 *
 * Products, row-major, C[M,N] = op(A)[M,K] op(B)[K,N] (t: stored
 * transposed), for a linear layer y[R,out] = x[R,in] W[out,in]^T:
 *   fwd  y  = x W^T     M=R   N=out K=in   B transposed
 *   dW   dW = dy^T x    M=out N=in  K=R    A transposed
 *   dx   dx = dy W      M=R   N=in  K=out  (not for the first layer: its
 *                                           input has no gradient, and
 *                                           neither hputrain nor torch
 *                                           computes it)
 * A 5x5 convolution (C -> O channels, HxW, batch B) as the GEMMs of its
 * im2col lowering with rows = B*H*W ("implicit GEMM": the same FLOPs as
 * any direct method): fwd M=rows N=O K=25C; dW M=O N=25C K=rows; dx
 * (dcol) M=rows N=25C K=O; the col2im and im2col themselves are not timed.
 * The same three are also timed as oneDNN convolution primitives on the
 * whole batch, in the memory formats oneDNN picks (reorders not timed).
 * Attention (gpt_lm): per (sample, head) S = Q K^T [T,T,hd], O = P V
 * [T,hd,T]; backward dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q; the
 * full T x T is counted (no saving for the causal mask).
 * Elementwise ops, norms, softmax, pooling, embedding and the optimizer
 * are not products and are not counted.
 *
 * FLOPs per sample of a model = sum over its products of 2*M*N*K*batch
 * (x the number of layers that have it) / the model's batch -- for a
 * linear layer 6*in*out, or 4*in*out for the first. Each product is timed
 * until -t seconds have passed (0.3; at least 3 calls, after 2 untimed) and
 * its fastest call counts. Per model the last lines are
 *
 *   ceiling model=M batch=B flops_per_sample=F sgemm_gflops=G \
 *     f32_gflops=G bf16_gflops=G f32_samples_per_sec=S bf16_samples_per_sec=S
 *
 * sgemm: every product in OpenBLAS; f32 (bf16): each product in the
 * fastest of the f32 (bf16) ways timed; GFLOP/s = F * B / the sum of the
 * products' times, samples/s = B / that sum: the throughput if a step were
 * nothing but its products at those speeds.
 *
 * One thread: OPENBLAS_NUM_THREADS=1 and OMP_NUM_THREADS=1 are set before
 * either library starts its threads, openblas_set_num_threads(1),
 * omp_set_num_threads(1), and the process is pinned to core -c (0). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/lowp.h"

enum kind { GEMM, CONV_FWD, CONV_BWD_D, CONV_BWD_W };

typedef struct prod {
	char name[32];   /* what it computes, e.g. "conv2.fwd"; shared by its ways */
	enum kind kind;
	long batch, m, n, k; /* GEMM (for a conv: its im2col GEMM) */
	int ta, tb;
	int count;           /* layers that have it */
	/* conv: N, C, H(=W), O, kernel, pad */
	long cn, cc, ch, co, ck, cp;
	/* results: seconds per call, 0 when not timed */
	double t_sgemm, t_f32, t_bf16;
	char impl_f32[40], impl_bf16[40];
} prod;

#define MAX_PRODS 128
static prod prods[MAX_PRODS];
static int nprods;
static double min_time = 0.3;
static dnnl_engine_t eng;
static dnnl_stream_t strm;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, dnnl_status_t s)
{
	fprintf(stderr, "gemm-ceiling: %s failed (dnnl status %d)\n", what, (int)s);
	exit(1);
}
#define DN(call)                                  \
	do {                                      \
		dnnl_status_t s_ = (call);        \
		if (s_ != dnnl_success)           \
			die(#call, s_);           \
	} while (0)

static void *xmalloc(size_t n)
{
	void *p = aligned_alloc(64, (n + 63) / 64 * 64);
	if (!p) {
		fprintf(stderr, "gemm-ceiling: out of memory (%zu bytes)\n", n);
		exit(1);
	}
	return p;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) /* uniform in [-1, 1) */
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return (float)((rng >> 40) * 0x1p-23) - 1.0f;
}

static float *frandom(size_t n)
{
	float *p = xmalloc(n * sizeof *p);
	for (size_t i = 0; i < n; i++)
		p[i] = frand();
	return p;
}

/* Fills a buffer of `bytes` holding f32 (bf16 = 0) or bf16 values. */
static void *random_bytes(size_t bytes, int bf16)
{
	if (!bf16)
		return frandom(bytes / 4 + 1);
	uint16_t *p = xmalloc(bytes + 2);
	for (size_t i = 0; i < bytes / 2; i++)
		p[i] = hpu_to_bf16(frand());
	return p;
}

/* Fastest call of fn(arg) in seconds: 2 untimed, then until min_time has
 * passed and at least 3 calls. */
static double best_time(void (*fn)(void *), void *arg)
{
	fn(arg);
	fn(arg);
	double best = DBL_MAX, start = now();
	for (int i = 0; i < 3 || now() - start < min_time; i++) {
		double t0 = now();
		fn(arg);
		double t = now() - t0;
		if (t < best)
			best = t;
	}
	return best;
}

/* ---- OpenBLAS ---- */

typedef struct sg {
	const prod *p;
	float *a, *b, *c;
} sg;

static void run_sgemm(void *arg)
{
	sg *s = arg;
	const prod *p = s->p;
	long m = p->m, n = p->n, k = p->k;
	for (long i = 0; i < p->batch; i++)
		cblas_sgemm(CblasRowMajor, p->ta ? CblasTrans : CblasNoTrans,
			    p->tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f,
			    s->a + i * m * k, p->ta ? (int)m : (int)k, s->b + i * k * n,
			    p->tb ? (int)k : (int)n, 0.0f, s->c + i * m * n, (int)n);
}

static double time_sgemm(const prod *p)
{
	sg s = {p, frandom((size_t)(p->batch * p->m * p->k)),
		frandom((size_t)(p->batch * p->k * p->n)),
		frandom((size_t)(p->batch * p->m * p->n))};
	double t = best_time(run_sgemm, &s);
	free(s.a), free(s.b), free(s.c);
	return t;
}

/* ---- oneDNN ---- */

typedef struct dn {
	dnnl_primitive_t prim;
	int nargs;
	dnnl_exec_arg_t args[4];
} dn;

static void run_dnnl(void *arg)
{
	dn *d = arg;
	DN(dnnl_primitive_execute(d->prim, strm, d->nargs, d->args));
	DN(dnnl_stream_wait(strm));
}

static void impl_name(const_dnnl_primitive_desc_t pd, char *out, size_t n)
{
	const char *s = "?";
	dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s);
	snprintf(out, n, "%s", s);
}

/* Times the primitive of pd with memories of the given queried formats;
 * inputs random (bf16 where the md says so), outputs f32. */
static double time_pd(dnnl_primitive_desc_t pd, int nargs, const int *arg_ids,
		      const dnnl_query_t *queries, char *impl, size_t implen)
{
	dn d = {.nargs = nargs};
	void *bufs[4];
	dnnl_memory_t mems[4];
	DN(dnnl_primitive_create(&d.prim, pd));
	for (int i = 0; i < nargs; i++) {
		const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, queries[i], 0);
		size_t bytes = dnnl_memory_desc_get_size(md);
		bufs[i] = random_bytes(bytes, md->data_type == dnnl_bf16);
		DN(dnnl_memory_create(&mems[i], md, eng, bufs[i]));
		d.args[i] = (dnnl_exec_arg_t){arg_ids[i], mems[i]};
	}
	impl_name(pd, impl, implen);
	double t = best_time(run_dnnl, &d);
	for (int i = 0; i < nargs; i++) {
		dnnl_memory_destroy(mems[i]);
		free(bufs[i]);
	}
	dnnl_primitive_destroy(d.prim);
	dnnl_primitive_desc_destroy(pd);
	return t;
}

static double time_matmul(const prod *p, int bf16, char *impl, size_t implen)
{
	dnnl_data_type_t in = bf16 ? dnnl_bf16 : dnnl_f32;
	long b = p->batch, m = p->m, n = p->n, k = p->k;
	int nd = b > 1 ? 3 : 2, o = nd - 2;
	dnnl_dims_t sd = {0}, ss = {0}, wd = {0}, ws = {0}, dd = {0}, ds = {0};
	sd[0] = wd[0] = dd[0] = b;
	ss[0] = m * k, ws[0] = k * n, ds[0] = m * n;
	sd[o] = m, sd[o + 1] = k;
	ss[o] = p->ta ? 1 : k, ss[o + 1] = p->ta ? m : 1;
	wd[o] = k, wd[o + 1] = n;
	ws[o] = p->tb ? 1 : n, ws[o + 1] = p->tb ? k : 1;
	dd[o] = m, dd[o + 1] = n;
	ds[o] = n, ds[o + 1] = 1;
	dnnl_memory_desc_t smd, wmd, dmd;
	DN(dnnl_memory_desc_init_by_strides(&smd, nd, sd, in, ss));
	DN(dnnl_memory_desc_init_by_strides(&wmd, nd, wd, in, ws));
	DN(dnnl_memory_desc_init_by_strides(&dmd, nd, dd, dnnl_f32, ds));
	dnnl_matmul_desc_t md;
	DN(dnnl_matmul_desc_init(&md, &smd, &wmd, NULL, &dmd));
	dnnl_primitive_desc_t pd;
	DN(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL));
	static const int ids[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
	static const dnnl_query_t q[] = {dnnl_query_src_md, dnnl_query_weights_md,
					 dnnl_query_dst_md};
	return time_pd(pd, 3, ids, q, impl, implen);
}

/* oneDNN convolution of p's kind; formats `any`, bf16 inputs when asked,
 * f32 outputs (and f32 for the forward's dst when bf16). */
static double time_conv(const prod *p, int bf16, char *impl, size_t implen)
{
	dnnl_data_type_t in = bf16 ? dnnl_bf16 : dnnl_f32;
	dnnl_dims_t src = {p->cn, p->cc, p->ch, p->ch}, wei = {p->co, p->cc, p->ck, p->ck},
		    dst = {p->cn, p->co, p->ch, p->ch}, st = {1, 1}, pad = {p->cp, p->cp};
	dnnl_memory_desc_t s_in, w_in, d_in, s_f, w_f, d_f;
	DN(dnnl_memory_desc_init_by_tag(&s_in, 4, src, in, dnnl_format_tag_any));
	DN(dnnl_memory_desc_init_by_tag(&w_in, 4, wei, in, dnnl_format_tag_any));
	DN(dnnl_memory_desc_init_by_tag(&d_in, 4, dst, in, dnnl_format_tag_any));
	DN(dnnl_memory_desc_init_by_tag(&s_f, 4, src, dnnl_f32, dnnl_format_tag_any));
	DN(dnnl_memory_desc_init_by_tag(&w_f, 4, wei, dnnl_f32, dnnl_format_tag_any));
	DN(dnnl_memory_desc_init_by_tag(&d_f, 4, dst, dnnl_f32, dnnl_format_tag_any));
	/* the forward (bf16 in, f32 out), also the backward's hint */
	dnnl_convolution_desc_t fd, cd;
	dnnl_primitive_desc_t fpd, pd;
	DN(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training,
					      dnnl_convolution_direct, &s_in, &w_in, NULL,
					      &d_f, st, pad, pad));
	DN(dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL));
	if (p->kind == CONV_FWD) {
		static const int ids[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
		static const dnnl_query_t q[] = {dnnl_query_src_md, dnnl_query_weights_md,
						 dnnl_query_dst_md};
		return time_pd(fpd, 3, ids, q, impl, implen);
	}
	if (p->kind == CONV_BWD_D) {
		static const int ids[] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
		static const dnnl_query_t q[] = {dnnl_query_diff_dst_md, dnnl_query_weights_md,
						 dnnl_query_diff_src_md};
		DN(dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &s_f,
							    &w_in, &d_in, st, pad, pad));
		DN(dnnl_primitive_desc_create(&pd, &cd, NULL, eng, fpd));
		dnnl_primitive_desc_destroy(fpd);
		return time_pd(pd, 3, ids, q, impl, implen);
	}
	static const int ids[] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS};
	static const dnnl_query_t q[] = {dnnl_query_src_md, dnnl_query_diff_dst_md,
					 dnnl_query_diff_weights_md};
	DN(dnnl_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &s_in,
						       &w_f, NULL, &d_in, st, pad, pad));
	DN(dnnl_primitive_desc_create(&pd, &cd, NULL, eng, fpd));
	dnnl_primitive_desc_destroy(fpd);
	return time_pd(pd, 3, ids, q, impl, implen);
}

/* ---- the models' products ---- */

static prod *add(const char *name, enum kind kind, long batch, long m, long n, long k,
		 int ta, int tb, int count)
{
	if (nprods == MAX_PRODS) {
		fprintf(stderr, "gemm-ceiling: too many products\n");
		exit(1);
	}
	prod *p = &prods[nprods++];
	memset(p, 0, sizeof *p);
	snprintf(p->name, sizeof p->name, "%s", name);
	p->kind = kind, p->batch = batch, p->m = m, p->n = n, p->k = k;
	p->ta = ta, p->tb = tb, p->count = count;
	return p;
}

/* y[rows, out] = x[rows, in] W^T; dx unless `first`. */
static void linear(const char *layer, long rows, long in, long out, int first, int count)
{
	char nm[32];
	snprintf(nm, sizeof nm, "%s.fwd", layer);
	add(nm, GEMM, 1, rows, out, in, 0, 1, count);
	snprintf(nm, sizeof nm, "%s.dW", layer);
	add(nm, GEMM, 1, out, in, rows, 1, 0, count);
	if (!first) {
		snprintf(nm, sizeof nm, "%s.dx", layer);
		add(nm, GEMM, 1, rows, in, out, 0, 0, count);
	}
}

/* Same-size k x k convolution, C -> O channels on side x side, batch n:
 * the im2col GEMMs, then the same as oneDNN convolutions. */
static void conv(const char *layer, long n, long c, long o, long side, long k, int first)
{
	long rows = n * side * side, ck = c * k * k;
	static const char *const step[] = {"fwd", "dW", "dx"};
	static const enum kind kinds[] = {CONV_FWD, CONV_BWD_W, CONV_BWD_D};
	for (int i = 0; i < 3 - first; i++) {
		char nm[32];
		snprintf(nm, sizeof nm, "%s.%s", layer, step[i]);
		long m = i == 0 ? rows : i == 1 ? o : rows;
		long nn = i == 0 ? o : ck;
		long kk = i == 0 ? ck : i == 1 ? rows : o;
		add(nm, GEMM, 1, m, nn, kk, i == 1, i == 0, 1);
		prod *p = add(nm, kinds[i], 1, m, nn, kk, 0, 0, 1);
		p->cn = n, p->cc = c, p->ch = side, p->co = o, p->ck = k, p->cp = k / 2;
	}
}

typedef struct model {
	const char *name;
	long batch;
	int first, last; /* its products: prods[first..last) */
} model;

static void mlp(model *md, long b)
{
	md->batch = b;
	linear("fc1", b, 784, 1024, 1, 1);
	linear("fc2", b, 1024, 1024, 0, 1);
	linear("fc3", b, 1024, 10, 0, 1);
}

static void cnn(model *md, long b)
{
	md->batch = b;
	conv("conv1", b, 1, 32, 28, 5, 1);
	conv("conv2", b, 32, 64, 14, 5, 0);
	linear("fc1", b, 64 * 7 * 7, 256, 0, 1);
	linear("fc2", b, 256, 10, 0, 1);
}

static void gpt_lm(model *md, long b, long vocab)
{
	const long t = 64, d = 128, heads = 4, layers = 2, hd = d / heads, r = b * t;
	md->batch = b;
	linear("qkv", r, d, 3 * d, 0, layers);
	linear("attn.proj", r, d, d, 0, layers);
	linear("mlp.fc", r, d, 4 * d, 0, layers);
	linear("mlp.proj", r, 4 * d, d, 0, layers);
	add("att.QK^T", GEMM, b * heads, t, t, hd, 0, 1, layers);
	add("att.PV", GEMM, b * heads, t, hd, t, 0, 0, layers);
	add("att.dP=dO V^T", GEMM, b * heads, t, t, hd, 0, 1, layers);
	add("att.dV=P^T dO", GEMM, b * heads, t, hd, t, 1, 0, layers);
	add("att.dQ=dS K", GEMM, b * heads, t, hd, t, 0, 0, layers);
	add("att.dK=dS^T Q", GEMM, b * heads, t, hd, t, 1, 0, layers);
	/* the head is tied to the token embedding: the same three products,
	 * its dW added into the embedding's gradient */
	linear("head", r, d, vocab, 0, 1);
}

static double flops(const prod *p)
{
	return 2.0 * p->batch * p->m * p->n * p->k * p->count;
}

static const char *kind_name(enum kind k)
{
	return k == GEMM ? "gemm" : "conv";
}

static void run_model(const model *md)
{
	printf("\n# %s, batch %ld: GFLOP/s of one call (fastest); MFLOP per sample "
	       "counts every layer that has the product\n",
	       md->name, md->batch);
	printf("%-16s %-4s %6s %7s %7s %7s %2s %2s %9s %8s %8s %8s  %s\n", "product", "way",
	       "batch", "M", "N", "K", "t", "x", "MFLOP/smp", "sgemm", "dnnl-f32", "dnnl-bf16",
	       "oneDNN implementations (f32 / bf16)");
	for (int i = md->first; i < md->last; i++) {
		prod *p = &prods[i];
		if (p->kind == GEMM) {
			p->t_sgemm = time_sgemm(p);
			p->t_f32 = time_matmul(p, 0, p->impl_f32, sizeof p->impl_f32);
			p->t_bf16 = time_matmul(p, 1, p->impl_bf16, sizeof p->impl_bf16);
		} else {
			p->t_f32 = time_conv(p, 0, p->impl_f32, sizeof p->impl_f32);
			p->t_bf16 = time_conv(p, 1, p->impl_bf16, sizeof p->impl_bf16);
		}
		double f = flops(p) / p->count;
		char sg[16] = "-";
		if (p->t_sgemm > 0)
			snprintf(sg, sizeof sg, "%.1f", f / p->t_sgemm * 1e-9);
		printf("%-16s %-4s %6ld %7ld %7ld %7ld %c%c %2d %9.3f %8s %8.1f %9.1f  %s / %s\n",
		       p->name, kind_name(p->kind), p->batch, p->m, p->n, p->k,
		       p->ta ? 'A' : '-', p->tb ? 'B' : '-', p->count,
		       flops(p) / md->batch * 1e-6, sg, f / p->t_f32 * 1e-9,
		       f / p->t_bf16 * 1e-9, p->impl_f32, p->impl_bf16);
		fflush(stdout);
	}
	/* per computation (name), the fastest way for each precision */
	double fl = 0, ts = 0, tf = 0, tb = 0;
	for (int i = md->first; i < md->last; i++) {
		const prod *p = &prods[i];
		int seen = 0;
		for (int j = md->first; j < i; j++)
			seen |= !strcmp(prods[j].name, p->name);
		if (seen)
			continue;
		double bs = DBL_MAX, bf = DBL_MAX, bb = DBL_MAX;
		for (int j = i; j < md->last; j++) {
			const prod *q = &prods[j];
			if (strcmp(q->name, p->name))
				continue;
			if (q->t_sgemm > 0) {
				bs = q->t_sgemm;
				bf = fmin(bf, q->t_sgemm);
			}
			bf = fmin(bf, q->t_f32);
			bb = fmin(bb, q->t_bf16);
		}
		fl += flops(p);
		ts += bs * p->count, tf += bf * p->count, tb += bb * p->count;
	}
	printf("ceiling model=%s batch=%ld flops_per_sample=%.0f sgemm_gflops=%.1f "
	       "f32_gflops=%.1f bf16_gflops=%.1f f32_samples_per_sec=%.1f "
	       "bf16_samples_per_sec=%.1f\n",
	       md->name, md->batch, fl / md->batch, fl / ts * 1e-9, fl / tf * 1e-9,
	       fl / tb * 1e-9, md->batch / tf, md->batch / tb);
	fflush(stdout);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: gemm-ceiling [-m mlp|cnn|gpt_lm|all] [-b BATCH (256)] "
		   "[-B LM_BATCH (32)] [-v LM_VOCAB (86)] [-t SECONDS (0.3)] [-c CORE (0)]\n");
}

int main(int argc, char **argv)
{
	const char *which = "all";
	long batch = 256, lm_batch = 32, vocab = 86;
	int core = 0, c;
	while ((c = getopt(argc, argv, "m:b:B:v:t:c:h")) != -1) {
		switch (c) {
		case 'm': which = optarg; break;
		case 'b': batch = atol(optarg); break;
		case 'B': lm_batch = atol(optarg); break;
		case 'v': vocab = atol(optarg); break;
		case 't': min_time = atof(optarg); break;
		case 'c': core = atoi(optarg); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	int all = !strcmp(which, "all");
	if (optind != argc || batch < 1 || lm_batch < 1 || vocab < 1 || !(min_time >= 0) ||
	    (!all && strcmp(which, "mlp") && strcmp(which, "cnn") && strcmp(which, "gpt_lm"))) {
		usage(stderr);
		return 2;
	}
	/* one thread, before OpenBLAS or OpenMP starts any */
	setenv("OPENBLAS_NUM_THREADS", "1", 1);
	setenv("OMP_NUM_THREADS", "1", 1);
	if (core >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(core, &set);
		if (sched_setaffinity(0, sizeof set, &set) != 0)
			perror("gemm-ceiling: sched_setaffinity");
	}
	openblas_set_num_threads(1);
	omp_set_num_threads(1);
	DN(dnnl_engine_create(&eng, dnnl_cpu, 0));
	DN(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
	/* clock up before the first product is timed: 0.2 s of sgemm */
	{
		prod w = {.batch = 1, .m = 256, .n = 256, .k = 256};
		sg s = {&w, frandom(65536), frandom(65536), frandom(65536)};
		for (double t0 = now(); now() - t0 < 0.2;)
			run_sgemm(&s);
		free(s.a), free(s.b), free(s.c);
	}
	const dnnl_version_t *v = dnnl_version();
	printf("# gemm-ceiling: core %d, OpenBLAS %s (%d thread), oneDNN %d.%d.%d "
	       "(%d OpenMP thread), %.2f s per product and way\n",
	       core, openblas_get_config(), openblas_get_num_threads(), v->major, v->minor,
	       v->patch, omp_get_max_threads(), min_time);
	printf("# t: A (B) stored transposed; x: the layers that have it; way: gemm "
	       "(for a conv: its im2col GEMM) or conv (oneDNN convolution)\n");

	model models[3] = {{"mlp", 0, 0, 0}, {"cnn", 0, 0, 0}, {"gpt_lm", 0, 0, 0}};
	for (int i = 0; i < 3; i++) {
		model *md = &models[i];
		if (!all && strcmp(which, md->name))
			continue;
		md->first = nprods;
		if (i == 0)
			mlp(md, batch);
		else if (i == 1)
			cnn(md, batch);
		else
			gpt_lm(md, lm_batch, vocab);
		md->last = nprods;
		run_model(md);
	}
	dnnl_stream_destroy(strm);
	dnnl_engine_destroy(eng);
	return 0;
}
