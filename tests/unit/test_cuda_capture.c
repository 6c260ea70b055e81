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
 * test_cuda_ops_more runs this group after its own
 * (hpu_cuda_capture_tests), on a stream of the group's own. */
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
#include "worker/cuda/cuda_ops.h"
#include "worker/ops/backend.h"

int hpu_cuda_capture_tests(const hpu__backend *gpu_);

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
	int must_record; /* a plain kernel launch: recording it must work */
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
	return gpu->embedding_fwd(in_f, ids, OUT(0), COLS, COLS);
}
static int p_embedding_bwd(void)
{
	return gpu->embedding_bwd(ids, in_f, OUT(0), COLS, COLS);
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
	{"gemm f32 forward (bias)", p_gemm_fwd, 0},
	{"gemm f32 dW (accumulate)", p_gemm_dw, 0},
	{"gemm f32 dx", p_gemm_dx, 0},
	{"gemm bf16 forward (bias)", p_gemm16_fwd, 0},
	{"gemm bf16 dW (accumulate)", p_gemm16_dw, 0},
	{"gemm f32 batched (8 heads)", p_bmm, 0},
	{"relu forward", p_relu_fwd, 1},
	{"relu backward", p_relu_bwd, 1},
	{"gelu forward", p_gelu_fwd, 1},
	{"gelu backward", p_gelu_bwd, 1},
	{"bias gradient", p_bias_grad, 0},
	{"softmax forward", p_softmax_fwd, 0},
	{"softmax backward", p_softmax_bwd, 0},
	{"layer norm forward", p_layernorm_fwd, 0},
	{"layer norm backward", p_layernorm_bwd, 0},
	{"max pool forward", p_maxpool_fwd, 0},
	{"max pool backward", p_maxpool_bwd, 0},
	{"conv forward", p_conv_fwd, 0},
	{"conv backward data", p_conv_bwd_data, 0},
	{"conv backward weights", p_conv_bwd_weights, 0},
	{"to bf16", p_to_bf16, 1},
	{"from bf16", p_from16, 1},
	{"round to bf16", p_round, 1},
	{"add", p_add, 1},
	{"embedding forward", p_embedding_fwd, 0},
	{"embedding backward", p_embedding_bwd, 0},
	{"dropout forward", p_dropout_fwd, 0},
	{"dropout backward", p_dropout_bwd, 0},
	{"attention head split", p_heads, 0},
	{"attention score mask", p_mask_scores, 0},
	{"position cross-entropy backward", p_xent_pos_bwd, 0},
	{"softmax cross-entropy (loss to the host)", p_softmax_xent, 0},
	{"count correct (count to the host)", p_count_correct, 0},
	{"ids in range (verdict to the host)", p_ids_in_range, 0},
	{"position cross-entropy forward (bad label to the host)", p_xent_pos_fwd, 0},
};

/* ---- recording ---- */

static void reset_outputs(void)
{
	for (int k = 0; k < NOUT; k++)
		assert_int_equal(cudaMemcpy(OUT(k), pattern_h, (size_t)NF * 4,
					    cudaMemcpyHostToDevice),
				 cudaSuccess);
}

static void fetch_outputs(float *h)
{
	assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
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

/* 1 when p recorded and replayed to the eager bytes, 0 when it could not
 * be recorded (why in `why`); fails the test on a differing replay. */
static int record_one(const probe *p, float *eager, float *replay, char *why, size_t whylen)
{
	reset_outputs();
	assert_int_equal(p->run(), HPU_BE_OK);
	fetch_outputs(eager);

	reset_outputs();
	cudaGraph_t graph = NULL;
	cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
	assert_int_equal(e, cudaSuccess);
	hpu__cuda_ops_recording(1); /* a refused call is the op's refusal, not the end */
	int rc = p->run();
	hpu__cuda_ops_recording(0);
	cudaError_t end = cudaStreamEndCapture(stream, &graph);
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
		return 0;
	}
	cudaGraphExec_t exec = NULL;
	e = cudaGraphInstantiate(&exec, graph, 0);
	if (e != cudaSuccess) {
		snprintf(why, whylen, "recorded, but not instantiated: %s", cudaGetErrorString(e));
		cudaGraphDestroy(graph);
		fresh_stream();
		return 0;
	}
	char what[160];
	for (int k = 0; k < 2; k++) {
		reset_outputs();
		assert_int_equal(cudaGraphLaunch(exec, stream), cudaSuccess);
		fetch_outputs(replay);
		snprintf(what, sizeof what, "%s: replay %d", p->name, k + 1);
		check_bits(what, replay, eager, (size_t)NOUT * NF * 4);
	}
	cudaGraphExecDestroy(exec);
	cudaGraphDestroy(graph);
	return 1;
}

static void test_record_replay(void **state)
{
	(void)state;
	size_t n = sizeof probes / sizeof *probes;
	float *eager = xcalloc((size_t)NOUT * NF, 4), *replay = xcalloc((size_t)NOUT * NF, 4);
	int recorded = 0;
	char refused[2048] = "";
	size_t at = 0;
	for (size_t i = 0; i < n; i++) {
		char why[256] = "";
		int ok = record_one(&probes[i], eager, replay, why, sizeof why);
		printf("  %-56s %s%s\n", probes[i].name, ok ? "recorded, replays bit for bit"
							     : "not recorded: ",
		       ok ? "" : why);
		if (!ok && probes[i].must_record)
			fail_msg("%s: a plain kernel could not be recorded (%s)", probes[i].name,
				 why);
		recorded += ok;
		if (!ok && at < sizeof refused)
			at += (size_t)snprintf(refused + at, sizeof refused - at, "%s%s",
					       at ? ", " : "", probes[i].name);
	}
	printf("recorded %d of %zu ops; not recorded: %s\n", recorded, n,
	       *refused ? refused : "none");
	free(eager), free(replay);
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
	labels = dput_i32(lab, ROWS);
	ids = dput_i32(perm, COLS);
	key_mask = dput_i32(km, 2 * 32);
	pattern_h = xcalloc(NF, 4);
	for (size_t i = 0; i < NF; i++)
		pattern_h[i] = (float)(i % 97) * 0.125f;
	out = dnan((size_t)NOUT * NF * 4);
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
	dfree(out), dfree(pool_idx), dfree(drop_mask);
	free(pattern_h);
	return 0;
}

int hpu_cuda_capture_tests(const hpu__backend *gpu_)
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
	};
	int rc = cmocka_run_group_tests_name("cuda capture", tests, NULL, NULL);
	(void)cudaStreamSynchronize(stream);
	cudaStreamDestroy(stream);
	return rc;
}
