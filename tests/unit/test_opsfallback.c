/* Unit tests for an entry's refusal on a kernel table that is not the
 * host's (worker/ops/backend.h, hpu__be_refused): the ops must never run
 * their C loops over its memory, which the host cannot touch (CUDA's).
 * The table here answers HPU_BE_UNSUPPORTED from every entry, over
 * memory mapped PROT_NONE (a host loop faults at once). While the thread
 * records a step (cpu-strict's recording, the device's hooks installed
 * as the worker installs them: hpu__dev_ops_hooks), each op returns
 * without touching the memory and the recording ends refused, naming the
 * op; outside a recording the worker ends (exit status 1) with one line
 * naming the op and the device (a forked child). The host's tables keep
 * their fallback: the reference table's refusals run the C loops. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "hpu/hpu.h"
#include "hpu/ops.h"
#include "worker/device/device.h"
#include "worker/ops/autocast.h"
#include "worker/ops/fp8.h"

#define MiB (1024ull * 1024)

/* ---- the table: every entry refuses ---- */

#define NO(name, ...)                                                                        \
	static int name(__VA_ARGS__)                                                         \
	{                                                                                    \
		return HPU_BE_UNSUPPORTED;                                                   \
	}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
NO(no_bias_grad, hpu__dtype dt, const void *dy, float *db, int rows, int cols)
NO(no_ids_in_range, const int32_t *ids, int n, int limit, int *ok)
NO(no_softmax_xent, const float *logits, const int32_t *labels, float *dlogits, int batch,
   int classes, float *loss)
NO(no_count_correct, const float *logits, const int32_t *labels, int batch, int classes,
   int *correct)
NO(no_embedding_fwd, const float *table, const int32_t *ids, float *y, int n, int vocab, int dim)
NO(no_embedding_bwd, const int32_t *ids, const float *dy, float *dtable, int n, int vocab,
   int dim)
NO(no_dropout_fwd, const float *x, float *y, uint8_t *mask, size_t n, float p, uint64_t seed,
   uint64_t stream)
NO(no_dropout_bwd, const float *dy, const uint8_t *mask, float *dx, size_t n, float p)
NO(no_add, const float *x, float *y, size_t n)
NO(no_mse_fwd, const float *p, const float *t, float *loss, int rows, size_t n)
NO(no_copy, void *dst, const void *src, size_t bytes)
#pragma GCC diagnostic pop

static hpu__backend dev;

/* The reference table's kernels (every one refuses) and refusing
 * entries for the ops' own loops, under a name of its own: not the
 * host's (hpu__be_on_host 0). */
static const hpu__backend *dev_table(void)
{
	dev = *hpu__be_reference();
	dev.name = "test device";
	dev.bias_grad = no_bias_grad;
	dev.ids_in_range = no_ids_in_range;
	dev.softmax_xent = no_softmax_xent;
	dev.count_correct = no_count_correct;
	dev.embedding_fwd = no_embedding_fwd;
	dev.embedding_bwd = no_embedding_bwd;
	dev.dropout_fwd = no_dropout_fwd;
	dev.dropout_bwd = no_dropout_bwd;
	dev.add = no_add;
	dev.mse_fwd = no_mse_fwd;
	dev.copy = no_copy;
	return &dev;
}

/* ---- the ops, each over memory the host cannot touch ---- */

static float *M; /* PROT_NONE: 1 MiB */
#define F(i) (M + (i) * 4096)
#define I(i) ((int32_t *)(M + (i) * 4096))

static int op_relu(void)
{
	hpu_relu_forward(F(0), F(1), 64);
	return 0;
}
static int op_relu_bwd(void)
{
	hpu_relu_backward(F(0), F(1), F(2), 64);
	return 0;
}
static int op_gelu(void)
{
	hpu_gelu_forward(F(0), F(1), 64);
	return 0;
}
static int op_tanh_bwd(void)
{
	hpu_tanh_backward(F(0), F(1), F(2), 64);
	return 0;
}
static int op_softmax(void)
{
	hpu_softmax_forward(F(0), F(1), 4, 16);
	return 0;
}
static int op_softmax_bwd(void)
{
	hpu_softmax_backward(F(0), F(1), F(2), 4, 16);
	return 0;
}
static int op_layernorm(void)
{
	hpu_layernorm_forward(F(0), F(1), F(2), F(3), F(4), F(5), 4, 16, 1e-5f);
	return 0;
}
static int op_layernorm_bwd(void)
{
	hpu_layernorm_backward(F(0), F(1), F(2), F(3), F(4), F(5), F(6), F(7), 4, 16);
	return 0;
}
static int op_xent(void)
{
	(void)hpu_cross_entropy_forward(F(0), I(1), F(2), 4, 16);
	return 0;
}
static int op_accuracy(void)
{
	(void)hpu_accuracy_forward(F(0), I(1), 4, 16);
	return 0;
}
static int op_linear(void)
{
	hpu_linear_forward(F(0), F(1), F(2), F(3), 4, 16, 8);
	return 0;
}
static int op_linear_bwd(void)
{
	hpu_linear_backward(F(0), F(1), F(2), F(3), F(4), F(5), 4, 16, 8);
	return 0;
}
static int op_matmul(void)
{
	hpu_matmul(F(0), F(1), F(2), 4, 8, 16, 0, 0, 0);
	return 0;
}
static int op_embedding(void)
{
	(void)hpu_embedding_forward(F(0), I(1), F(2), 4, 8, 16);
	return 0;
}
static int op_embedding_bwd(void)
{
	hpu_embedding_backward(I(0), F(1), F(2), 4, 16);
	return 0;
}
static int op_dropout(void)
{
	hpu_dropout_forward(F(0), F(1), (uint8_t *)F(2), 64, 0.5f, 1, 2);
	return 0;
}
static int op_dropout_bwd(void)
{
	hpu_dropout_backward(F(0), (const uint8_t *)F(1), F(2), 64, 0.5f);
	return 0;
}
static const hpu_conv2d_shape conv = {.batch = 2, .in_ch = 3, .height = 6, .width = 6,
				      .out_ch = 4, .kernel = 3, .stride = 1, .pad = 1};
static int op_conv(void)
{
	hpu_conv2d_forward(&conv, F(0), F(1), F(2), F(3), F(4));
	return 0;
}
static int op_conv_bwd(void)
{
	hpu_conv2d_backward(&conv, F(0), F(1), F(2), F(3), F(4), F(5), F(6));
	return 0;
}
static int op_maxpool(void)
{
	hpu_maxpool2d_forward(F(0), F(1), I(2), 2, 3, 8, 8, 2, 2);
	return 0;
}
static int op_avgpool_bwd(void)
{
	hpu_avgpool2d_backward(F(0), F(1), 2, 3, 8, 8, 2, 2);
	return 0;
}
/* a kernel-or-host op: no C loop after its entry's refusal */
static int op_mse(void)
{
	return hpu_mse_forward(F(0), F(1), F(2), 4, 16);
}
static int op_copy(void)
{
	return hpu_copy(F(0), F(1), 256);
}

/* mixed precision's and fp8's passes (the table has no round, to_bf16,
 * from16, amax or fp8_fake_quant) */
static int op_round(void)
{
	hpu__ac_round_inplace(F(0), 64, HPU_AUTOCAST_BF16);
	return 0;
}
static int op_to_bf16(void)
{
	(void)hpu__ac_bf16(0, F(0), 64);
	return 0;
}
static int op_from16(void)
{
	hpu__ac_from16(0, F(0), (const uint16_t *)F(1), 64);
	return 0;
}
static int op_fake_quant(void)
{
	hpu__fp8_fake_quant(F(0), F(1), 64, 1.0f, HPU_FP8_E4M3);
	return 0;
}
static int op_amax(void)
{
	(void)hpu__fp8_amax(F(0), 64);
	return 0;
}

typedef struct op_case {
	const char *name; /* what the refusal names */
	int (*run)(void); /* the op's answer (0 for a void op) */
} op_case;

static const op_case cases[] = {
    {"hpu_relu_forward", op_relu},
    {"hpu_relu_backward", op_relu_bwd},
    {"hpu_gelu_forward", op_gelu},
    {"hpu_tanh_backward", op_tanh_bwd},
    {"hpu_softmax_forward", op_softmax},
    {"hpu_softmax_backward", op_softmax_bwd},
    {"hpu_layernorm_forward", op_layernorm},
    {"hpu_layernorm_backward", op_layernorm_bwd},
    {"hpu_cross_entropy_forward", op_xent},
    {"hpu_accuracy_forward", op_accuracy},
    {"hpu_linear_forward", op_linear},
    {"hpu_linear_backward", op_linear_bwd},
    {"hpu_matmul/hpu_bmm", op_matmul},
    {"hpu_embedding_forward", op_embedding},
    {"hpu_embedding_backward", op_embedding_bwd},
    {"hpu_dropout_forward", op_dropout},
    {"hpu_dropout_backward", op_dropout_bwd},
    {"hpu_conv2d_forward", op_conv},
    {"hpu_conv2d_backward", op_conv_bwd},
    {"hpu_maxpool2d_forward", op_maxpool},
    {"hpu_avgpool2d_backward", op_avgpool_bwd},
    {"autocast's rounding (hpu__ac_round_inplace)", op_round},
    {"autocast's bf16 operand (hpu__ac_bf16)", op_to_bf16},
    {"autocast's widening (hpu__ac_from16)", op_from16},
    {"fp8's quantization (hpu__fp8_fake_quant)", op_fake_quant},
    {"fp8's scaling (hpu__fp8_amax)", op_amax},
    {"mse_fwd", op_mse},
    {"copy", op_copy},
};
#define NCASES (sizeof cases / sizeof cases[0])

/* ---- set-up: cpu-strict recording, the device's hooks ---- */

static int setup(void **state)
{
	(void)state;
	char err[256] = "", note[256];
	uint64_t cap;
	if (hpu__dev_open("cpu-strict", 0, err, sizeof err) < 0)
		fail_msg("%s", err);
	hpu__dev_config c = {.graphs = 1};
	assert_int_equal(hpu__dev_configure(&c, &cap, note, sizeof note, err, sizeof err), 0);
	assert_int_equal(hpu__devmem_init(64 * MiB, 0), 0);
	hpu__dev_ops_hooks();
	M = mmap(NULL, MiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(M != MAP_FAILED);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	munmap(M, MiB);
	hpu__devmem_shutdown();
	hpu__dev_close();
	return 0;
}

/* (a) Recording: each op returns at once, nothing read or written, and
 * the recording ends refused with a reason naming it. */
static void test_refusal_while_recording(void **state)
{
	(void)state;
	for (size_t i = 0; i < NCASES; i++) {
		char err[512] = "", why[512] = "";
		assert_int_equal(hpu__dev_capture_begin(err, sizeof err), 0);
		const hpu__backend *kept = hpu__be();
		hpu__be_set(dev_table());
		int op_rc = cases[i].run();
		hpu__be_set(kept);
		hpu__dev_graph *g = NULL;
		int rc = hpu__dev_capture_end(&g, why, sizeof why);
		printf("  %s: capture_end %d: %s\n", cases[i].name, rc, why);
		assert_int_equal(op_rc, HPU_OK);
		assert_int_equal(rc, 1);
		assert_null(g);
		char want[128];
		snprintf(want, sizeof want, "%s: the kernel table of device cpu-strict refused it "
					    "while recording (", cases[i].name);
		assert_non_null(strstr(why, want));
	}
}

/* Runs case i in a child on the test table, outside a recording: its
 * exit status (or -signal) and what it wrote on stderr. */
static int child_run(size_t i, char *out, size_t len)
{
	int fd[2];
	assert_int_equal(pipe(fd), 0);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fd[1], 2);
		close(fd[0]);
		signal(SIGSEGV, SIG_DFL); /* not cmocka's: a fault ends the child */
		signal(SIGBUS, SIG_DFL);
		hpu__be_set(dev_table());
		int rc = cases[i].run();
		_exit(rc == HPU_OK ? 0 : 2); /* (no cmocka assertion in the child) */
	}
	close(fd[1]);
	size_t n = 0;
	ssize_t r;
	while (n + 1 < len && (r = read(fd[0], out + n, len - 1 - n)) > 0)
		n += (size_t)r;
	out[n] = 0;
	close(fd[0]);
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : -1000;
}

/* (b) Outside a recording: the worker ends (status 1) naming the op and
 * the device; a kernel-or-host op answers HPU_OK only while recording
 * (here HPU_ERROR, its layer's sentence), and never runs a C loop. */
static void test_refusal_outside_recording(void **state)
{
	(void)state;
	for (size_t i = 0; i < NCASES; i++) {
		char out[1024];
		int st = child_run(i, out, sizeof out);
		printf("  %s: status %d: %s", cases[i].name, st, out[0] ? out : "(nothing)\n");
		if (!strcmp(cases[i].name, "mse_fwd") || !strcmp(cases[i].name, "copy")) {
			assert_int_equal(st, 2); /* HPU_ERROR, no fault */
			continue;
		}
		assert_int_equal(st, 1);
		char want[128];
		snprintf(want, sizeof want, "the device cpu-strict has no kernel for %s (",
			 cases[i].name);
		assert_non_null(strstr(out, want));
	}
	/* the whole line, once (docs/troubleshooting.md) */
	char out[1024];
	assert_int_equal(child_run(0, out, sizeof out), 1);
	assert_non_null(strstr(out, "the device cpu-strict has no kernel for hpu_relu_forward "
				    "(eltwise_fwd ReLU, 64 values)"));
}

/* The host's tables keep their fallback: the reference table refuses
 * every kernel and the ops run their C loops. */
static void test_host_table_falls_back(void **state)
{
	(void)state;
	const hpu__backend *kept = hpu__be();
	hpu__be_set(hpu__be_reference());
	float x[4] = {-1.0f, 2.0f, -3.0f, 4.0f}, y[4];
	hpu_relu_forward(x, y, 4);
	float s[4];
	hpu_softmax_forward(x, s, 1, 4);
	hpu__be_set(kept);
	assert_true(y[0] == 0.0f && y[1] == 2.0f && y[2] == 0.0f && y[3] == 4.0f);
	assert_true(s[3] > s[1] && s[1] > s[0] && s[0] > s[2]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_refusal_while_recording),
	    cmocka_unit_test(test_refusal_outside_recording),
	    cmocka_unit_test(test_host_table_falls_back),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
