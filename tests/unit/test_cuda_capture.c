/* Which of the CUDA kernel table's ops (worker/cuda/ops/) a CUDA graph can
 * record: the ground issue 36's --graphs stands on. For each op a
 * training step runs (products in fp32 and bf16, the eltwise ops, norms,
 * softmax, pooling, convolutions, casts, embedding, dropout, attention's
 * head copies and mask, the losses' position kernels) the program
 *
 *   1. runs it eagerly on a stream of its own (its first call also makes
 *      whatever the op keeps: cuBLASLt plans, cuDNN descriptors, scratch),
 *      and keeps the outputs;
 *   2. records a second call with cudaStreamBeginCapture (thread-local
 *      mode: any call that would synchronize or allocate outside the
 *      stream ends the recording with an error);
 *   3. where it recorded, resets the outputs, replays the graph twice and
 *      checks that each replay gives the eager run's bytes.
 *
 * An op that cannot be recorded is printed with CUDA's reason (a result
 * read back to the host inside the op, a cudaMalloc, a synchronization;
 * the table's recording mode, hpu__cuda_ops_recording, makes such a call
 * the op's refusal instead of the end of the process), not failed: that
 * list is the finding, and it says what --graphs must
 * keep out of a recorded step or change. A replay that differs from the
 * eager run fails the test, and so does a plain elementwise kernel that
 * cannot be recorded (the recording itself is then broken).
 *
 * An op with an input in host memory (the dropout layer's keys) is run
 * again after its recording with new values: a replay that gives the old
 * values' result is listed as replaying stale host values.
 *
 * The CUDA device's runtime ops that decide a step on the device
 * (worker/cuda/cuda_device.c: flag_nonfinite(16), sumsq_add, sumsq16_add,
 * loss_seed, step_begin, step_end, the optimizers reading
 * hpu__dev_stepvars) are the ops a recorded step runs after the
 * backward: each must record and replay (the module's device sources are
 * built into this program; the device set up without its kernel table,
 * its ops on its own compute stream, which is the one recorded), and so
 * must the sequence of them a step runs.
 *
 * test_cuda_ops_more runs this group after its own
 * (hpu_cuda_capture_tests), on a stream of the group's own, and gets its
 * stream back after. */
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

#include "common/lowp.h"
#include "worker/cuda/cuda_device.h"
#include "worker/cuda/cuda_ops.h"
#include "worker/device/device.h"
#include "worker/ops/backend.h"

int hpu_cuda_capture_tests(const hpu__backend *gpu_, cudaStream_t caller);
/* cuda_device.c's entry for the device without its kernel table */
const hpu__device *hpu_cuda_device_core_v1(int *ngpus, char *err, size_t errlen);

enum {
	NF = 1 << 18,   /* floats in each input and output area */
	ROWS = 64,      /* a batch */
	COLS = 128,     /* features */
	CLASSES = 10,
	NOUT = 3,       /* output areas */
};

static const hpu__backend *gpu;
static cudaStream_t stream;

/* Inputs (made once): random floats in [-1, 1), their bf16, labels in
 * [0, CLASSES), ids a permutation of [0, COLS) (no two rows of a table
 * gradient meet), max-pool indices from an eager forward, a key mask. */
static float *in_f;
static uint16_t *in_h;
static int32_t *labels, *ids, *pool_idx, *key_mask;
static uint8_t *drop_mask;
/* Outputs: NOUT areas of NF floats, reset to `pattern` before each run. */
static float *out;
static float *pattern_h;

#define OUT(k) (out + (size_t)(k) * NF)

/* ---- the ops ---- */

typedef struct probe {
	const char *name;
	int (*run)(void);
	int must_record;    /* a plain kernel launch: recording it must work */
	void (*vary)(void); /* changes the op's host input (NULL: it has none) */
} probe;

static int gemm(hpu__dtype dt, int m, int n, int k, int ta, int tb, int bias, int acc)
{
	const void *a = dt == HPU_DT_BF16 ? (const void *)in_h : (const void *)in_f;
	const void *b = dt == HPU_DT_BF16 ? (const void *)(in_h + NF / 2)
					  : (const void *)(in_f + NF / 2);
	hpu__gemm g = {.dt = dt, .count = 1, .m = m, .n = n, .k = k, .trans_a = ta,
		       .trans_b = tb, .a = a, .b = b, .bias = bias ? in_f + NF / 4 : NULL,
		       .c = OUT(0), .stride_a = (size_t)m * k, .stride_b = (size_t)k * n,
		       .stride_c = (size_t)m * n, .accumulate = acc};
	return gpu->gemm(&g);
}

/* a linear layer's three products: y = x W^T + b, dW += dy^T x, dx = dy W */
static int p_gemm_fwd(void) { return gemm(HPU_DT_F32, ROWS, COLS, COLS, 0, 1, 1, 0); }
static int p_gemm_dw(void) { return gemm(HPU_DT_F32, COLS, COLS, ROWS, 1, 0, 0, 1); }
static int p_gemm_dx(void) { return gemm(HPU_DT_F32, ROWS, COLS, COLS, 0, 0, 0, 0); }
static int p_gemm16_fwd(void) { return gemm(HPU_DT_BF16, ROWS, COLS, COLS, 0, 1, 1, 0); }
static int p_gemm16_dw(void) { return gemm(HPU_DT_BF16, COLS, COLS, ROWS, 1, 0, 0, 1); }

static int p_bmm(void) /* attention's per-head products, 8 of them */
{
	hpu__gemm g = {.dt = HPU_DT_F32, .count = 8, .m = 32, .n = 32, .k = 16, .trans_b = 1,
		       .a = in_f, .b = in_f + NF / 2, .c = OUT(0), .stride_a = 32 * 16,
		       .stride_b = 32 * 16, .stride_c = 32 * 32};
	return gpu->gemm(&g);
}

static int p_relu_fwd(void) { return gpu->eltwise_fwd(HPU_ELT_RELU, in_f, OUT(0), NF); }
static int p_relu_bwd(void)
{
	return gpu->eltwise_bwd(HPU_ELT_RELU, in_f, in_f + NF / 2, OUT(0), NF / 2);
}
static int p_gelu_fwd(void) { return gpu->eltwise_fwd(HPU_ELT_GELU_TANH, in_f, OUT(0), NF); }
static int p_gelu_bwd(void)
{
	return gpu->eltwise_bwd(HPU_ELT_GELU_TANH, in_f, in_f + NF / 2, OUT(0), NF / 2);
}

static int p_bias_grad(void) { return gpu->bias_grad(HPU_DT_F32, in_f, OUT(0), ROWS, COLS); }

static int p_softmax_fwd(void) { return gpu->softmax_fwd(in_f, OUT(0), ROWS, COLS); }
static int p_softmax_bwd(void)
{
	return gpu->softmax_bwd(in_f, in_f + NF / 2, OUT(0), ROWS, COLS);
}

static int p_layernorm_fwd(void)
{
	return gpu->layernorm_fwd(in_f, in_f + NF / 2, in_f + NF / 4, OUT(0), OUT(1),
				  OUT(1) + ROWS, ROWS, COLS, 1e-5f);
}

static int p_layernorm_bwd(void)
{
	/* mean and rstd from the inputs: any values do for recording */
	return gpu->layernorm_bwd(in_f, in_f + NF / 2, in_f + NF / 4, in_f + NF / 8,
				  in_f + 3 * (NF / 4), OUT(0), OUT(1), OUT(2), ROWS, COLS);
}

static int p_maxpool_fwd(void)
{
	return gpu->maxpool_fwd(in_f, OUT(0), (int32_t *)OUT(1), 4, 8, 28, 28, 2, 2);
}
static int p_maxpool_bwd(void)
{
	return gpu->maxpool_bwd(in_f, pool_idx, OUT(0), 4, 8, 28, 28, 2, 2);
}

static const hpu_conv2d_shape conv = {.batch = 4, .in_ch = 8, .height = 14, .width = 14,
				      .out_ch = 16, .kernel = 5, .stride = 1, .pad = 2};

static int p_conv_fwd(void)
{
	return gpu->conv_fwd(&conv, HPU_DT_F32, in_f, in_f + NF / 2, in_f + NF / 4, OUT(0));
}
static int p_conv_bwd_data(void)
{
	return gpu->conv_bwd_data(&conv, HPU_DT_F32, in_f + NF / 2, in_f, OUT(0));
}
static int p_conv_bwd_weights(void)
{
	return gpu->conv_bwd_weights(&conv, HPU_DT_F32, in_f, in_f + NF / 2, OUT(0), OUT(1));
}

static int p_to_bf16(void) { return gpu->to_bf16(in_f, (uint16_t *)OUT(0), NF); }
static int p_from16(void) { return gpu->from16(0, in_h, OUT(0), NF); }
static int p_round(void) { return gpu->round(0, in_f, OUT(0), NF); }
static int p_add(void) { return gpu->add(in_f, OUT(0), NF); }

static int p_embedding_fwd(void)
{
	return gpu->embedding_fwd(in_f, ids, OUT(0), COLS, COLS, COLS);
}
static int p_embedding_bwd(void)
{
	return gpu->embedding_bwd(ids, in_f, OUT(0), COLS, COLS, COLS);
}

static int p_dropout_fwd(void)
{
	return gpu->dropout_fwd(in_f, OUT(0), (uint8_t *)OUT(1), NF, 0.1f, 42, 7);
}
static int p_dropout_bwd(void) { return gpu->dropout_bwd(in_f, drop_mask, OUT(0), NF, 0.1f); }

static int p_heads(void) { return gpu->heads(0, in_f, OUT(0), 3 * 64, 2, 4, 32, 16, 0.25f); }
static int p_mask_scores(void)
{
	/* the scores themselves are the output: copied in first */
	if (cudaMemcpyAsync(OUT(0), in_f, 2 * 4 * 32 * 32 * 4, cudaMemcpyDeviceToDevice,
			    stream) != cudaSuccess)
		return HPU_BE_UNSUPPORTED;
	return gpu->mask_scores(OUT(0), key_mask, 2, 4, 32, 1, 0);
}

/* The dropout layer's rows: keys in host memory, one a row, which a
 * step changes; a graph that copied them at recording would replay the
 * old ones. */
static uint64_t keys_h[ROWS];

static int p_dropout_rows(void)
{
	return gpu->dropout_rows(in_f, OUT(0), keys_h, 0, ROWS, COLS, 0x20000000u, 1.0f / 0.875f);
}

/* The keys made on the device (a recordable step's dropout): from the
 * step and the rows' sample indices in device memory (ids), into OUT(1),
 * then the rows from there. A new step in device memory is a replay's
 * new mask: must record, and not go stale. */
static int64_t *step_d;
static int64_t step_h = 41;

static int p_dropout_keys(void)
{
	uint64_t *keys = (uint64_t *)OUT(1);
	int rc = gpu->dropout_keys(keys, (const uint32_t *)ids, step_d, 1234, 3, ROWS);
	return rc != HPU_BE_OK ? rc
			       : gpu->dropout_rows(in_f, OUT(0), keys, 1, ROWS, COLS, 0x20000000u,
						   1.0f / 0.875f);
}

static void vary_step(void)
{
	step_h += 1000003;
	assert_int_equal(cudaMemcpy(step_d, &step_h, sizeof step_h, cudaMemcpyHostToDevice),
			 cudaSuccess);
}

static void vary_keys(void)
{
	for (int i = 0; i < ROWS; i++)
		keys_h[i] = keys_h[i] * 6364136223846793005ull + 1442695040888963407ull;
}

static int p_xent_pos_bwd(void)
{
	return gpu->xent_pos_bwd(in_f, labels, in_f + NF / 2, in_f + NF / 4, OUT(0), 2, 32,
				 CLASSES);
}

/* Results read back to the host inside the op: expected not to record. */
static int p_softmax_xent(void)
{
	float loss = 0;
	return gpu->softmax_xent(in_f, labels, OUT(0), ROWS, CLASSES, &loss);
}
static int p_count_correct(void)
{
	int correct = 0;
	return gpu->count_correct(in_f, labels, ROWS, CLASSES, &correct);
}
static int p_ids_in_range(void)
{
	int ok = 0;
	return gpu->ids_in_range(labels, ROWS, CLASSES, &ok);
}
static int p_xent_pos_fwd(void)
{
	long bad = -1;
	int32_t bad_label = 0;
	return gpu->xent_pos_fwd(in_f, labels, OUT(0), OUT(1), 2, 32, CLASSES, &bad,
				 &bad_label);
}

static const probe probes[] = {
	{"gemm f32 forward (bias)", p_gemm_fwd, 0, NULL},
	{"gemm f32 dW (accumulate)", p_gemm_dw, 0, NULL},
	{"gemm f32 dx", p_gemm_dx, 0, NULL},
	{"gemm bf16 forward (bias)", p_gemm16_fwd, 0, NULL},
	{"gemm bf16 dW (accumulate)", p_gemm16_dw, 0, NULL},
	{"gemm f32 batched (8 heads)", p_bmm, 0, NULL},
	{"relu forward", p_relu_fwd, 1, NULL},
	{"relu backward", p_relu_bwd, 1, NULL},
	{"gelu forward", p_gelu_fwd, 1, NULL},
	{"gelu backward", p_gelu_bwd, 1, NULL},
	{"bias gradient", p_bias_grad, 0, NULL},
	{"softmax forward", p_softmax_fwd, 0, NULL},
	{"softmax backward", p_softmax_bwd, 0, NULL},
	{"layer norm forward", p_layernorm_fwd, 0, NULL},
	{"layer norm backward", p_layernorm_bwd, 0, NULL},
	{"max pool forward", p_maxpool_fwd, 0, NULL},
	{"max pool backward", p_maxpool_bwd, 0, NULL},
	{"conv forward", p_conv_fwd, 0, NULL},
	{"conv backward data", p_conv_bwd_data, 0, NULL},
	{"conv backward weights", p_conv_bwd_weights, 0, NULL},
	{"to bf16", p_to_bf16, 1, NULL},
	{"from bf16", p_from16, 1, NULL},
	{"round to bf16", p_round, 1, NULL},
	{"add", p_add, 1, NULL},
	{"embedding forward", p_embedding_fwd, 0, NULL},
	{"embedding backward", p_embedding_bwd, 0, NULL},
	{"dropout forward", p_dropout_fwd, 0, NULL},
	{"dropout backward", p_dropout_bwd, 0, NULL},
	{"dropout rows (keys in host memory)", p_dropout_rows, 0, vary_keys},
	{"dropout rows (keys made on the device)", p_dropout_keys, 1, vary_step},
	{"attention head split", p_heads, 0, NULL},
	{"attention score mask", p_mask_scores, 0, NULL},
	{"position cross-entropy backward", p_xent_pos_bwd, 0, NULL},
	{"softmax cross-entropy (loss to the host)", p_softmax_xent, 0, NULL},
	{"count correct (count to the host)", p_count_correct, 0, NULL},
	{"ids in range (verdict to the host)", p_ids_in_range, 0, NULL},
	{"position cross-entropy forward (bad label to the host)", p_xent_pos_fwd, 0, NULL},
};

/* ---- recording ---- */

/* (cudaMemcpy from pageable memory may return before the copy is done,
 * and the ops' stream does not wait for the default one: hence the
 * device-wide wait) */
static void reset_outputs(void)
{
	for (int k = 0; k < NOUT; k++)
		assert_int_equal(cudaMemcpy(OUT(k), pattern_h, (size_t)NF * 4,
					    cudaMemcpyHostToDevice),
				 cudaSuccess);
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
}

static void fetch_outputs(float *h)
{
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess); /* (either stream) */
	assert_int_equal(cudaMemcpy(h, out, (size_t)NOUT * NF * 4, cudaMemcpyDeviceToHost),
			 cudaSuccess);
}

/* A new stream for the ops after a recording failed (a failed capture can
 * leave its stream unusable). */
static void fresh_stream(void)
{
	(void)cudaGetLastError();
	(void)cudaStreamDestroy(stream);
	assert_int_equal(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
	hpu__cuda_ops_set_stream(stream);
	cu_test_set_stream(stream);
}

/* What recording p came to. */
enum { REFUSED = 0, RECORDED, STALE };

/* eager, again, old, replay: NOUT * NF floats each. */
typedef struct runs {
	float *eager, *again, *old, *replay;
} runs;

static void run_eagerly(const probe *p, float *into)
{
	reset_outputs();
	assert_int_equal(p->run(), HPU_BE_OK);
	fetch_outputs(into);
}

/* RECORDED when p recorded and each replay gave the eager run's bytes
 * (within 1e-5 where two eager runs differ: a non-deterministic
 * algorithm); STALE when p has a host input (vary) and the replays gave
 * what the recording's values give, not the new ones; REFUSED when it
 * could not be recorded (why in `why`). Fails the test on any other
 * replay. */
static int record_one(const probe *p, int on_device, runs *r, char *why, size_t whylen)
{
	const size_t bytes = (size_t)NOUT * NF * 4;
	run_eagerly(p, r->eager);
	run_eagerly(p, r->again);
	int exact = !memcmp(r->eager, r->again, bytes);

	reset_outputs();
	cudaGraph_t graph = NULL;
	/* the stream p runs on: the device's compute stream for its runtime ops */
	cudaStream_t rec = on_device ? hpu__cuda_stream() : stream;
	cudaError_t e = cudaStreamBeginCapture(rec, cudaStreamCaptureModeThreadLocal);
	assert_int_equal(e, cudaSuccess);
	hpu__cuda_ops_recording(1); /* a refused call is the op's refusal, not the end */
	int rc = p->run();
	hpu__cuda_ops_recording(0);
	cudaError_t end = cudaStreamEndCapture(rec, &graph);
	const char *op_why = hpu__cuda_ops_recording_error();
	if (rc != HPU_BE_OK || *op_why || end != cudaSuccess || !graph) {
		cudaError_t last = cudaGetLastError();
		snprintf(why, whylen, "%s%s%s", *op_why ? op_why : "",
			 *op_why && end != cudaSuccess ? "; end of recording: " : "",
			 end != cudaSuccess ? cudaGetErrorString(end)
			 : !*op_why && last != cudaSuccess ? cudaGetErrorString(last)
							   : "");
		if (graph)
			cudaGraphDestroy(graph);
		fresh_stream();
		return REFUSED;
	}
	cudaGraphExec_t exec = NULL;
	e = cudaGraphInstantiate(&exec, graph, 0);
	if (e != cudaSuccess) {
		snprintf(why, whylen, "recorded, but not instantiated: %s", cudaGetErrorString(e));
		cudaGraphDestroy(graph);
		fresh_stream();
		return REFUSED;
	}
	if (p->vary) { /* the host input changes, as between two steps */
		memcpy(r->old, r->eager, bytes);
		p->vary();
		run_eagerly(p, r->eager);
	}
	int stale = 0;
	char what[160];
	for (int k = 0; k < 2; k++) {
		reset_outputs();
		assert_int_equal(cudaGraphLaunch(exec, rec), cudaSuccess);
		fetch_outputs(r->replay);
		snprintf(what, sizeof what, "%s: replay %d", p->name, k + 1);
		if (p->vary && memcmp(r->replay, r->eager, bytes) &&
		    !memcmp(r->replay, r->old, bytes))
			stale = 1;
		else if (exact)
			check_bits(what, r->replay, r->eager, bytes);
		else
			check(what, r->replay, r->eager, (size_t)NOUT * NF, 1e-5);
	}
	cudaGraphExecDestroy(exec);
	cudaGraphDestroy(graph);
	return stale ? STALE : RECORDED;
}

/* Records each of ps[n] (on_device: the device's runtime ops), prints
 * what it came to, and fails where one that must record did not. */
static void record_all(const probe *ps, size_t n, int on_device)
{
	size_t each = (size_t)NOUT * NF;
	runs r = {xcalloc(each, 4), xcalloc(each, 4), xcalloc(each, 4), xcalloc(each, 4)};
	int recorded = 0;
	char refused[2048] = "";
	size_t at = 0;
	for (size_t i = 0; i < n; i++) {
		char why[256] = "";
		printf("  %-56s ", ps[i].name);
		fflush(stdout);
		int got = record_one(&ps[i], on_device, &r, why, sizeof why);
		printf("%s%s\n",
		       got == RECORDED ? "recorded, replays as it runs"
		       : got == STALE	? "recorded, but replays the host values it was recorded "
					  "with"
					: "not recorded: ",
		       got == REFUSED ? why : "");
		if (got == REFUSED && ps[i].must_record)
			fail_msg("%s: a plain kernel could not be recorded (%s)", ps[i].name, why);
		if (got == STALE && on_device)
			fail_msg("%s: replays the values it was recorded with", ps[i].name);
		recorded += got == RECORDED;
		if (got != RECORDED && at < sizeof refused)
			at += (size_t)snprintf(refused + at, sizeof refused - at, "%s%s",
					       at ? ", " : "", ps[i].name);
	}
	printf("recorded %d of %zu ops; not recorded or stale: %s\n", recorded, n,
	       *refused ? refused : "none");
	free(r.eager), free(r.again), free(r.old), free(r.replay);
}

static void test_record_replay(void **state)
{
	(void)state;
	record_all(probes, sizeof probes / sizeof *probes, 0);
}

/* ---- the device's runtime ops that decide a step ---- */

static const hpu__device *D;
static float *bad_f;              /* in_f with a NaN last */
static uint16_t *bad_h;           /* in_h with a bf16 Inf in the middle */
static double *sums;              /* a micro-step's loss sums, finite */
static hpu__dev_stepvars *sv_ok;  /* a step's block: no overflow */
static hpu__dev_stepvars *sv_bad; /* an overflow: bad 1, skip 1 */
/* 16-mixed, the dynamic scaler, clipping: every branch's inputs there */
static const hpu__dev_stepcfg cfg = {.clip_norm = 1.0, .mixed = 1, .fp16 = 1, .dynamic = 1,
				     .hysteresis = 2, .window = 3, .min_scale = 1};
static const hpu__dev_optim adamw_sv = {.kind = HPU__DEV_ADAMW, .weight_decay = 0.1,
					.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};

/* OUT(k) as a step's block, copied from `from` on the device's stream
 * (recorded with the op: each replay starts from it). */
static hpu__dev_stepvars *sv_in(int k, const hpu__dev_stepvars *from)
{
	hpu__dev_stepvars *sv = (hpu__dev_stepvars *)OUT(k);
	assert_int_equal(cudaMemcpyAsync(sv, from, sizeof *sv, cudaMemcpyDeviceToDevice,
					 hpu__cuda_stream()),
			 cudaSuccess);
	return sv;
}

static int r_flag(void)
{
	D->rt->flag_nonfinite(OUT(0), bad_f, NF);
	return HPU_BE_OK;
}
static int r_flag16(void)
{
	D->rt->flag_nonfinite16(OUT(0), 0, bad_h, NF);
	return HPU_BE_OK;
}
static int r_sumsq_add(void)
{
	D->rt->sumsq_add((double *)OUT(0), in_f, NF);
	return HPU_BE_OK;
}
static int r_sumsq16_add(void)
{
	D->rt->sumsq16_add((double *)OUT(0), 0, in_h, NF, OUT(1), 100000);
	return HPU_BE_OK;
}
static int r_loss_seed(void)
{
	D->rt->loss_seed(OUT(0), NF, sums, 3, 0.3f, 0.37f, 33, sv_ok);
	return HPU_BE_OK;
}
static int r_step_begin(void)
{
	D->rt->step_begin(sv_in(1, sv_ok), &cfg);
	return HPU_BE_OK;
}
static int r_step_end(void)
{
	D->rt->step_end(sv_in(1, sv_bad), &cfg);
	return HPU_BE_OK;
}
static int r_optim_sv(void)
{
	hpu__dev_optim o = adamw_sv;
	o.sv = sv_ok;
	D->rt->optim(&o, OUT(0), in_f, OUT(1), OUT(2), NF);
	return HPU_BE_OK;
}
static int r_optim16_sv(void)
{
	hpu__dev_optim o = adamw_sv;
	o.sv = sv_ok;
	D->rt->optim16(&o, 0, OUT(0), in_h, (uint16_t *)(OUT(0) + NF / 2), OUT(1), OUT(2),
		       NF / 2, OUT(1) + NF / 2, 1000);
	return HPU_BE_OK;
}

/* What a recorded step runs after its backward: the check and the norm
 * into the block, the decision, the update reading it, the scaler. */
static int r_step(void)
{
	hpu__dev_stepvars *sv = sv_in(2, sv_ok);
	hpu__dev_optim o = adamw_sv;
	o.sv = sv;
	D->rt->flag_nonfinite(&sv->bad, in_f, NF / 2);
	D->rt->sumsq_add(&sv->sumsq, in_f, NF / 2);
	D->rt->step_begin(sv, &cfg);
	D->rt->optim(&o, OUT(0), in_f, OUT(1), OUT(1) + NF / 2, NF / 2);
	D->rt->step_end(sv, &cfg);
	return HPU_BE_OK;
}

static const probe rt_probes[] = {
	{"flag_nonfinite (a NaN last)", r_flag, 1, NULL},
	{"flag_nonfinite16 (a bf16 Inf)", r_flag16, 1, NULL},
	{"sumsq_add", r_sumsq_add, 1, NULL},
	{"sumsq16_add (chunks of 100000)", r_sumsq16_add, 1, NULL},
	{"loss_seed", r_loss_seed, 1, NULL},
	{"step_begin (16-mixed, clipping)", r_step_begin, 1, NULL},
	{"step_end (an overflow)", r_step_end, 1, NULL},
	{"optim with sv (AdamW)", r_optim_sv, 1, NULL},
	{"optim16 with sv (AdamW, bf16 gradients)", r_optim16_sv, 1, NULL},
	{"a step's decisions and update, in sequence", r_step, 1, NULL},
};

static void *dput_sv(const hpu__dev_stepvars *h)
{
	return dput(h, sizeof *h);
}

static void test_record_replay_rt(void **state)
{
	(void)state;
	char err[512] = "";
	int ngpus = 0;
	D = hpu_cuda_device_core_v1(&ngpus, err, sizeof err);
	if (ngpus <= 0 || D->setup(0, err, sizeof err) < 0)
		fail_msg("the CUDA device (cuda_device.c) did not set up: %s", err);
	/* inputs: the group's, with a NaN and an Inf planted */
	float nan_f = NAN;
	uint16_t inf_h = 0x7f80;
	const double s3[3] = {1.5, -2.25, 3.0};
	bad_f = dnan((size_t)NF * 4);
	bad_h = dnan((size_t)NF * 2);
	assert_int_equal(cudaMemcpy(bad_f, in_f, (size_t)NF * 4, cudaMemcpyDeviceToDevice),
			 cudaSuccess);
	assert_int_equal(cudaMemcpy(bad_f + NF - 1, &nan_f, 4, cudaMemcpyHostToDevice),
			 cudaSuccess);
	assert_int_equal(cudaMemcpy(bad_h, in_h, (size_t)NF * 2, cudaMemcpyDeviceToDevice),
			 cudaSuccess);
	assert_int_equal(cudaMemcpy(bad_h + NF / 2, &inf_h, 2, cudaMemcpyHostToDevice),
			 cudaSuccess);
	sums = dput(s3, sizeof s3);
	hpu__dev_stepvars ok = {.lr = 1e-3, .sumsq = 3.5e9, .gscale = 0.5f, .t = 5,
				.loss_scale = 65536, .step_no = 7, .last_overflow = 4,
				.hyst_left = 2};
	hpu__dev_stepvars bad = ok;
	bad.bad = 1;
	bad.skip = 1;
	bad.hyst_left = 1;
	sv_ok = dput_sv(&ok);
	sv_bad = dput_sv(&bad);
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
	record_all(rt_probes, sizeof rt_probes / sizeof *rt_probes, 1);
	dfree(bad_f), dfree(bad_h), dfree(sums), dfree(sv_ok), dfree(sv_bad);
	D->teardown();
}

/* ---- set-up ---- */

static void *dput_i32(const int32_t *h, size_t n) { return dput(h, n * 4); }

static int setup(void **state)
{
	(void)state;
	float *f = xcalloc(NF, 4);
	uint16_t *h = xcalloc(NF, 2);
	rng_seed(36);
	fill(f, NF, -1, 1);
	for (size_t i = 0; i < NF; i++) {
		h[i] = hpu_to_bf16(f[i]);
		if (i % 4 == 0) /* positive values for norms' rstd */
			f[i] = f[i] < 0 ? -f[i] : f[i];
	}
	in_f = dput(f, (size_t)NF * 4);
	in_h = dput(h, (size_t)NF * 2);
	int32_t lab[ROWS], perm[COLS], km[2 * 32];
	for (int i = 0; i < ROWS; i++)
		lab[i] = (i * 7) % CLASSES;
	for (int i = 0; i < COLS; i++)
		perm[i] = (i * 37) % COLS; /* 37 is prime to 128: a permutation */
	for (int i = 0; i < 2 * 32; i++)
		km[i] = i % 5 != 4;
	for (int i = 0; i < ROWS; i++)
		keys_h[i] = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
	labels = dput_i32(lab, ROWS);
	ids = dput_i32(perm, COLS);
	key_mask = dput_i32(km, 2 * 32);
	step_d = dput(&step_h, sizeof step_h);
	pattern_h = xcalloc(NF, 4);
	for (size_t i = 0; i < NF; i++)
		pattern_h[i] = (float)(i % 97) * 0.125f;
	out = dnan((size_t)NOUT * NF * 4);
	assert_int_equal(cudaDeviceSynchronize(), cudaSuccess); /* the default stream's */
	/* max-pool indices and a dropout mask from eager forwards */
	assert_int_equal(gpu->maxpool_fwd(in_f, OUT(0), (int32_t *)OUT(1), 4, 8, 28, 28, 2, 2),
			 HPU_BE_OK);
	pool_idx = dnan((size_t)4 * 8 * 14 * 14 * 4);
	assert_int_equal(cudaMemcpyAsync(pool_idx, OUT(1), (size_t)4 * 8 * 14 * 14 * 4,
					 cudaMemcpyDeviceToDevice, stream),
			 cudaSuccess);
	assert_int_equal(gpu->dropout_fwd(in_f, OUT(0), (uint8_t *)OUT(1), NF, 0.1f, 42, 7),
			 HPU_BE_OK);
	drop_mask = dnan(NF);
	assert_int_equal(cudaMemcpyAsync(drop_mask, OUT(1), NF, cudaMemcpyDeviceToDevice, stream),
			 cudaSuccess);
	assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
	free(f), free(h);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	dfree(in_f), dfree(in_h), dfree(labels), dfree(ids), dfree(key_mask);
	dfree(out), dfree(pool_idx), dfree(drop_mask), dfree(step_d);
	free(pattern_h);
	return 0;
}

int hpu_cuda_capture_tests(const hpu__backend *gpu_, cudaStream_t caller)
{
	gpu = gpu_;
	if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
		printf("test_cuda_capture: cannot create a CUDA stream\n");
		return 1;
	}
	hpu__cuda_ops_set_stream(stream);
	cu_test_set_stream(stream);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_record_replay, setup, teardown),
		cmocka_unit_test_setup_teardown(test_record_replay_rt, setup, teardown),
	};
	int rc = cmocka_run_group_tests_name("cuda capture", tests, NULL, NULL);
	(void)cudaStreamSynchronize(stream);
	hpu__cuda_ops_set_stream(caller); /* the caller's again */
	cu_test_set_stream(caller);
	cudaStreamDestroy(stream);
	return rc;
}
