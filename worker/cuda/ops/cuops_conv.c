/* cuops_conv: the table's convolutions on cuDNN 9's convolution API
 * (cudnnConvolution*, still in cuDNN 9's cnn library), NCHW.
 *
 * One plan per shape and math (a small cache per GPU): the tensor,
 * filter and convolution descriptors and the three algorithms, picked by
 * cuDNN's heuristics (no benchmarking) among the GEMM-like ones that fit
 * the workspace, deterministic ones first (HPU_CUDNN_FIND=1: timed by
 * cuDNN's Find rather than guessed; HPU_CUDNN_LOG=1 prints each plan's
 * candidates and choices). fp32: CUDNN_FMA_MATH (no TF32) unless
 * hpu__cuda_ops_allow_tf32 said so. bf16 inputs: cuDNN's legacy API
 * writes bf16 outputs only, while the table's outputs (and dw's
 * accumulation) are fp32, so the bf16 operands are widened to fp32 in
 * scratch and convolved with tensor-core math: TF32 holds bf16 values
 * exactly and accumulates in fp32, which is the bf16 product the CPU
 * computes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "worker/cuda/cuda_ops.h"
#include "worker/cuda/ops/cuops.h"
#include "worker/cuda/ops/cuops_kernels.h"

static int out_hw(const hpu_conv2d_shape *s, int size)
{
	return (size + 2 * s->pad - s->kernel) / s->stride + 1;
}

static int shape_ok(const hpu_conv2d_shape *s)
{
	return s->batch >= 0 && s->in_ch > 0 && s->out_ch > 0 && s->height > 0 &&
	       s->width > 0 && s->kernel > 0 && s->stride > 0 && s->pad >= 0 &&
	       s->height + 2 * s->pad >= s->kernel && s->width + 2 * s->pad >= s->kernel;
}

static void plan_free(hpu__cuops_conv_plan *p)
{
	if (p->x)
		cudnnDestroyTensorDescriptor(p->x);
	if (p->y)
		cudnnDestroyTensorDescriptor(p->y);
	if (p->bias)
		cudnnDestroyTensorDescriptor(p->bias);
	if (p->w)
		cudnnDestroyFilterDescriptor(p->w);
	for (int i = 0; i < 3; i++)
		if (p->conv[i])
			cudnnDestroyConvolutionDescriptor(p->conv[i]);
	memset(p, 0, sizeof *p);
}

void hpu__cuops_conv_free(hpu__cuops_ctx *c)
{
	for (int i = 0; i < HPU_CUOPS_CONV_CACHE; i++)
		if (c->conv[i].used)
			plan_free(&c->conv[i]);
}

static int descriptors(hpu__cuops_conv_plan *p, const hpu_conv2d_shape *s)
{
	const cudnnDataType_t f = CUDNN_DATA_FLOAT;
	const cudnnTensorFormat_t nchw = CUDNN_TENSOR_NCHW;
	if (hpu__cuops_dnn(cudnnCreateTensorDescriptor(&p->x), "tensor descriptor") ||
	    hpu__cuops_dnn(cudnnCreateTensorDescriptor(&p->y), "tensor descriptor") ||
	    hpu__cuops_dnn(cudnnCreateTensorDescriptor(&p->bias), "tensor descriptor") ||
	    hpu__cuops_dnn(cudnnCreateFilterDescriptor(&p->w), "filter descriptor"))
		return -1;
	for (int i = 0; i < 3; i++)
		if (hpu__cuops_dnn(cudnnCreateConvolutionDescriptor(&p->conv[i]),
				   "convolution descriptor") ||
		    hpu__cuops_dnn(cudnnSetConvolution2dDescriptor(p->conv[i], s->pad, s->pad,
								   s->stride, s->stride, 1, 1,
								   CUDNN_CROSS_CORRELATION, f),
				   "convolution descriptor") ||
		    hpu__cuops_dnn(cudnnSetConvolutionMathType(
					   p->conv[i], p->tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH),
				   "convolution math"))
			return -1;
	return hpu__cuops_dnn(cudnnSetTensor4dDescriptor(p->x, nchw, f, s->batch, s->in_ch,
							 s->height, s->width),
			      "input descriptor") ||
	       hpu__cuops_dnn(cudnnSetTensor4dDescriptor(p->y, nchw, f, s->batch, s->out_ch,
							 out_hw(s, s->height),
							 out_hw(s, s->width)),
			      "output descriptor") ||
	       hpu__cuops_dnn(cudnnSetTensor4dDescriptor(p->bias, nchw, f, 1, s->out_ch, 1, 1),
			      "bias descriptor") ||
	       hpu__cuops_dnn(cudnnSetFilter4dDescriptor(p->w, f, nchw, s->out_ch, s->in_ch,
							 s->kernel, s->kernel),
			      "filter descriptor");
}

/* Whether a heuristic's answer may be used: it ran, fits the workspace,
 * keeps fp32 off tensor cores unless TF32 is allowed, and never lets cuDNN
 * convert the operands down to fp16 (CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
 * fp16's range would overflow above 65504 and flush small gradients, where
 * bf16 widened to fp32 and TF32 hold the values exactly). */
static int usable(cudnnStatus_t st, size_t mem, cudnnMathType_t math, int tf32)
{
	return st == CUDNN_STATUS_SUCCESS && mem <= HPU_CUOPS_WORKSPACE &&
	       math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&
	       (tf32 || math == CUDNN_FMA_MATH || math == CUDNN_DEFAULT_MATH);
}

#define NALGO 16

/* The GEMM-like algorithms only: the transform-based ones (FFT,
 * Winograd) round the operands' transforms, which would break bf16's
 * exact products and fp32's 1e-5 agreement with the CPU. */
static int exact_fwd(cudnnConvolutionFwdAlgo_t a)
{
	return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
	       a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
	       a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}

static int exact_data(cudnnConvolutionBwdDataAlgo_t a)
{
	return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}

static int exact_filter(cudnnConvolutionBwdFilterAlgo_t a)
{
	return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 ||
	       a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
	       a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

/* The first usable exact algorithm, deterministic ones first; goto fail
 * if none. */
#define PICK(res, got, tf32, exact, out, mem, math)                                          \
	do {                                                                           \
		int pick_ = -1;                                                        \
		for (int pass_ = 0; pass_ < 2 && pick_ < 0; pass_++)                   \
			for (int i_ = 0; i_ < (got) && pick_ < 0; i_++)                \
				if (usable((res)[i_].status, (res)[i_].memory,         \
					   (res)[i_].mathType, (tf32)) &&              \
				    exact((res)[i_].algo) &&                           \
				    (pass_ || (res)[i_].determinism == CUDNN_DETERMINISTIC)) \
					pick_ = i_;                                    \
		if (pick_ < 0)                                                         \
			goto fail;                                                     \
		(out) = (res)[pick_].algo;                                             \
		(mem) = (res)[pick_].memory;                                           \
		(math) = (res)[pick_].mathType;                                        \
	} while (0)

/* HPU_CUDNN_FIND=1: each shape's algorithms timed by cuDNN once (its
 * Find calls, on buffers of their own), the fastest usable one taken,
 * deterministic ones first as always; else cuDNN's heuristics. */
static int find_algorithms(void)
{
	const char *e = getenv("HPU_CUDNN_FIND");
	return e && !strcmp(e, "1");
}

/* HPU_CUDNN_LOG=1: each new plan's candidates and choices on stderr, one
 * line a direction (for bench/gpu.sh: which algorithms the exact,
 * deterministic-first rule left out, and at what time where Find timed
 * them). */
static int log_algorithms(void)
{
	const char *e = getenv("HPU_CUDNN_LOG");
	return e && !strcmp(e, "1");
}

/* One direction's line: each candidate as algo:ms (-1: not timed, the
 * heuristics'), d (deterministic) or n, MiB of workspace, x where our
 * rule takes no such algorithm (transform-based) or it failed, * on the
 * one chosen. */
#define LOG_DIR(dir, res, got, exact, chosen)                                                \
	do {                                                                           \
		char line_[1024];                                                      \
		size_t at_ = 0;                                                        \
		for (int i_ = 0; i_ < (got) && at_ < sizeof line_ - 64; i_++)          \
			at_ += (size_t)snprintf(                                       \
				line_ + at_, sizeof line_ - at_, " %d:%.3f%s%s%.0f%s",  \
				(int)(res)[i_].algo, (double)(res)[i_].time,          \
				(res)[i_].determinism == CUDNN_DETERMINISTIC ? "d" : "n", \
				(res)[i_].mathType == CUDNN_FMA_MATH ? "f" : "t",     \
				(double)(res)[i_].memory / 1048576.0,                   \
				(res)[i_].status != CUDNN_STATUS_SUCCESS ||            \
						!exact((res)[i_].algo)                 \
					? "x"                                          \
				: (res)[i_].algo == (chosen) ? "*" : "");              \
		fprintf(stderr, "hpu-worker: cudnn: %dx%dx%dx%d, %d filters %dx%d, stride %d, pad " \
				"%d, %s, %s:%s\n",                                      \
			p->s.batch, p->s.in_ch, p->s.height, p->s.width, p->s.out_ch,  \
			p->s.kernel, p->s.kernel, p->s.stride, p->s.pad,               \
			p->tf32 ? "tensor ops" : "fp32 FMA", dir, line_);              \
	} while (0)

static int algorithms(hpu__cuops_ctx *c, hpu__cuops_conv_plan *p)
{
	cudnnConvolutionFwdAlgoPerf_t fr[NALGO];
	cudnnConvolutionBwdDataAlgoPerf_t dr[NALGO];
	cudnnConvolutionBwdFilterAlgoPerf_t wr[NALGO];
	int nf = 0, nd = 0, nw = 0;
	if (find_algorithms() &&
	    hpu__cuda_ops_refuse("timing convolution algorithms (HPU_CUDNN_FIND=1)",
				 "cuDNN runs its candidates and waits for them, which a "
				 "recording cannot hold (run a step eagerly first)"))
		return -1;
	if (find_algorithms()) { /* timed by cuDNN, fastest first */
		if (hpu__cuops_dnn(cudnnFindConvolutionForwardAlgorithm(c->dnn, p->x, p->w, p->conv[0],
									 p->y, NALGO, &nf, fr),
				   "timing forward algorithms") ||
		    hpu__cuops_dnn(cudnnFindConvolutionBackwardDataAlgorithm(
					   c->dnn, p->w, p->y, p->conv[1], p->x, NALGO, &nd, dr),
				   "timing backward data algorithms") ||
		    hpu__cuops_dnn(cudnnFindConvolutionBackwardFilterAlgorithm(
					   c->dnn, p->x, p->y, p->conv[2], p->w, NALGO, &nw, wr),
				   "timing backward filter algorithms"))
			return -1;
	} else if (hpu__cuops_dnn(cudnnGetConvolutionForwardAlgorithm_v7(c->dnn, p->x, p->w,
									  p->conv[0], p->y, NALGO,
									  &nf, fr),
				  "forward algorithm") ||
		   hpu__cuops_dnn(cudnnGetConvolutionBackwardDataAlgorithm_v7(
					  c->dnn, p->w, p->y, p->conv[1], p->x, NALGO, &nd, dr),
				  "backward data algorithm") ||
		   hpu__cuops_dnn(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
					  c->dnn, p->x, p->y, p->conv[2], p->w, NALGO, &nw, wr),
				  "backward filter algorithm"))
		return -1;
	cudnnMathType_t math[3];
	PICK(fr, nf, p->tf32, exact_fwd, p->fwd, p->ws_fwd, math[0]);
	PICK(dr, nd, p->tf32, exact_data, p->bwd_data, p->ws_data, math[1]);
	PICK(wr, nw, p->tf32, exact_filter, p->bwd_filter, p->ws_filter, math[2]);
	if (log_algorithms()) {
		LOG_DIR(find_algorithms() ? "forward (timed)" : "forward", fr, nf, exact_fwd, p->fwd);
		LOG_DIR("backward data", dr, nd, exact_data, p->bwd_data);
		LOG_DIR("backward filter", wr, nw, exact_filter, p->bwd_filter);
	}
	/* each direction runs with its algorithm's math (fp32 without TF32
	 * keeps FMA math whatever the heuristic said) */
	for (int i = 0; p->tf32 && i < 3; i++)
		if (hpu__cuops_dnn(cudnnSetConvolutionMathType(p->conv[i], math[i]),
				   "convolution math"))
			return -1;
	return 0;
fail:
	hpu__cuops_fatal("cuDNN has no convolution algorithm for %dx%dx%dx%d, %d filters %dx%d, "
			 "stride %d, padding %d",
		 p->s.batch, p->s.in_ch, p->s.height, p->s.width, p->s.out_ch, p->s.kernel,
		 p->s.kernel, p->s.stride, p->s.pad);
	return -1;
}

static hpu__cuops_conv_plan *plan_get(hpu__cuops_ctx *c, const hpu_conv2d_shape *s, int tf32)
{
	hpu__cuops_conv_plan *victim = &c->conv[0];
	for (int i = 0; i < HPU_CUOPS_CONV_CACHE; i++) {
		hpu__cuops_conv_plan *p = &c->conv[i];
		if (p->used && p->tf32 == tf32 && memcmp(&p->s, s, sizeof *s) == 0) {
			p->stamp = ++c->clock;
			return p;
		}
		if (!p->used || (victim->used && p->stamp < victim->stamp))
			victim = p;
	}
	if (victim->used)
		plan_free(victim);
	victim->s = *s;
	victim->tf32 = tf32;
	if (descriptors(victim, s) || algorithms(c, victim)) {
		plan_free(victim);
		return NULL;
	}
	victim->used = 1;
	victim->stamp = ++c->clock;
	return victim;
}

static size_t x_n(const hpu_conv2d_shape *s)
{
	return (size_t)s->batch * s->in_ch * s->height * s->width;
}

static size_t w_n(const hpu_conv2d_shape *s)
{
	return (size_t)s->out_ch * s->in_ch * s->kernel * s->kernel;
}

static size_t y_n(const hpu_conv2d_shape *s)
{
	return (size_t)s->batch * s->out_ch * out_hw(s, s->height) * out_hw(s, s->width);
}

/* The operands as fp32: themselves, or (bf16) widened into scratch, n[i]
 * values each. */
static int widen(hpu__cuops_ctx *c, hpu__dtype dt, const void *in[2], const size_t n[2],
		 const float *out[2])
{
	if (dt == HPU_DT_F32) {
		out[0] = in[0];
		out[1] = in[1];
		return 0;
	}
	float *w = hpu__cuops_scratch(c, (n[0] + n[1]) * sizeof(float));
	if (!w)
		return -1;
	cudaStream_t st = hpu__cuops_stream();
	if (hpu__cuops_cuda(hpu__cuk_bf16_to_f32(in[0], w, n[0], st), "bf16 widening") ||
	    hpu__cuops_cuda(hpu__cuk_bf16_to_f32(in[1], w + n[0], n[1], st), "bf16 widening"))
		return -1;
	out[0] = w;
	out[1] = w + n[0];
	return 0;
}

/* Enters the GPU's context and finds the plan: bf16 and TF32-allowed fp32
 * take the tensor-core plan. NULL plan: *c is left (not entered). */
static hpu__cuops_conv_plan *begin(const hpu_conv2d_shape *s, hpu__dtype dt,
				   hpu__cuops_ctx **c)
{
	*c = hpu__cuops_enter();
	if (!*c)
		return NULL;
	hpu__cuops_conv_plan *p = plan_get(*c, s, dt == HPU_DT_BF16 || hpu__cuops_tf32());
	if (!p)
		hpu__cuops_leave(*c);
	return p;
}

static const float one = 1.0f, zero = 0.0f;

int hpu__cuops_conv_fwd(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
			const void *w, const float *b, float *y)
{
	if (!shape_ok(s))
		return HPU_BE_UNSUPPORTED;
	if (s->batch == 0)
		return HPU_BE_OK;
	hpu__cuops_ctx *c;
	hpu__cuops_conv_plan *p = begin(s, dt, &c);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	const void *in[2] = {x, w};
	size_t n[2] = {x_n(s), w_n(s)};
	const float *f[2];
	int rc = widen(c, dt, in, n, f) ||
		 hpu__cuops_dnn(cudnnConvolutionForward(c->dnn, &one, p->x, f[0], p->w, f[1],
							p->conv[0], p->fwd, c->ws, p->ws_fwd,
							&zero, p->y, y),
				"cudnnConvolutionForward") ||
		 (b && hpu__cuops_dnn(cudnnAddTensor(c->dnn, &one, p->bias, b, &one, p->y, y),
				      "convolution bias"));
	hpu__cuops_leave(c);
	return rc ? HPU_BE_UNSUPPORTED : HPU_BE_OK;
}

int hpu__cuops_conv_bwd_data(const hpu_conv2d_shape *s, hpu__dtype dt, const void *w,
			     const void *dy, float *dx)
{
	if (!shape_ok(s))
		return HPU_BE_UNSUPPORTED;
	if (s->batch == 0)
		return HPU_BE_OK;
	hpu__cuops_ctx *c;
	hpu__cuops_conv_plan *p = begin(s, dt, &c);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	const void *in[2] = {w, dy};
	size_t n[2] = {w_n(s), y_n(s)};
	const float *f[2];
	int rc = widen(c, dt, in, n, f) ||
		 hpu__cuops_dnn(cudnnConvolutionBackwardData(c->dnn, &one, p->w, f[0], p->y, f[1],
							     p->conv[1], p->bwd_data, c->ws,
							     p->ws_data, &zero, p->x, dx),
				"cudnnConvolutionBackwardData");
	hpu__cuops_leave(c);
	return rc ? HPU_BE_UNSUPPORTED : HPU_BE_OK;
}

/* dw += the filter gradient, db += the sum of dy over all but channels. */
int hpu__cuops_conv_bwd_weights(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
				const void *dy, float *dw, float *db)
{
	if (!shape_ok(s))
		return HPU_BE_UNSUPPORTED;
	if (s->batch == 0)
		return HPU_BE_OK;
	hpu__cuops_ctx *c;
	hpu__cuops_conv_plan *p = begin(s, dt, &c);
	if (!p)
		return HPU_BE_UNSUPPORTED;
	const void *in[2] = {x, dy};
	size_t n[2] = {x_n(s), y_n(s)};
	const float *f[2];
	int rc = widen(c, dt, in, n, f) ||
		 hpu__cuops_dnn(cudnnConvolutionBackwardFilter(c->dnn, &one, p->x, f[0], p->y,
							       f[1], p->conv[2], p->bwd_filter,
							       c->ws, p->ws_filter, &one, p->w,
							       dw),
				"cudnnConvolutionBackwardFilter") ||
		 (db && hpu__cuops_dnn(cudnnConvolutionBackwardBias(c->dnn, &one, p->y, f[1], &one,
								   p->bias, db),
				       "convolution bias gradient"));
	hpu__cuops_leave(c);
	return rc ? HPU_BE_UNSUPPORTED : HPU_BE_OK;
}
