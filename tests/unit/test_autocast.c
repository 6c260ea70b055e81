/* Unit tests for the autocast policy (worker/ops/autocast.c and the op
 * wrappers): the default lists, LOWER_LIST / FP32_LIST files moving ops,
 * the errors a bad file gives, the per-op counters, and every op's
 * low-precision variant against its fp32 run.
 *
 * Tolerances. Rounding to nearest even is off by at most the unit
 * roundoff: 2^-8 (~3.9e-3) relative for bf16 (8 significant bits), 2^-11
 * (~4.9e-4) for fp16 (11 bits). A lowered op rounds its inputs and its
 * output and accumulates in fp32, so each output is off by a few of
 * those: we allow 2e-2 of the output's largest magnitude for bf16 and
 * 2e-3 for fp16 (about 5 and 4 unit roundoffs), measured per output (y,
 * dx, dw, ...), and print every measured difference. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/num_testlib.h"
#include "worker/ops/autocast.h"
#include "worker/ops/backend.h"
#include "common/lowp.h"

#include "hpu/ops.h"

#define TOL_BF16 2e-2
#define TOL_FP16 2e-3

static const char *const all_ops[] = {
	"linear", "matmul", "bmm", "conv2d", "maxpool2d", "avgpool2d",
	"relu", "gelu", "tanh", "softmax", "softmax_xent", "layernorm",
	"embedding", "dropout", "attention",
};
#define NOPS (sizeof all_ops / sizeof *all_ops)

static char dir[64];

/* Writes text to dir/name, returns the path (static per name slot). */
static const char *write_file(const char *name, const char *text)
{
	static char paths[4][128];
	static int next;
	char *p = paths[next++ % 4];
	snprintf(p, 128, "%s/%s", dir, name);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	return p;
}

/* Sets LOWER_LIST / FP32_LIST to files holding the texts (NULL: unset)
 * and initializes the policy; returns hpu__autocast_init's result. */
static int policy(int lowp, const char *lower, const char *fp32, char *err, size_t len)
{
	if (lower)
		setenv("LOWER_LIST", write_file("lower.txt", lower), 1);
	else
		unsetenv("LOWER_LIST");
	if (fp32)
		setenv("FP32_LIST", write_file("fp32.txt", fp32), 1);
	else
		unsetenv("FP32_LIST");
	return hpu__autocast_init(lowp, err, len);
}

static void policy_ok(int lowp, const char *lower, const char *fp32)
{
	char err[512] = "";
	if (policy(lowp, lower, fp32, err, sizeof err) < 0)
		fail_msg("hpu__autocast_init: %s", err);
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof dir, "/tmp/test_autocast.XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	const char *names[] = {"lower.txt", "fp32.txt", "nul.txt", "fifo",
			       "ops_bf16.txt", "ops_fp32.txt"};
	char p[128];
	for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
		snprintf(p, sizeof p, "%s/%s", dir, names[i]);
		unlink(p);
	}
	rmdir(dir);
	return 0;
}

/* ---- the lists ---- */

static void test_defaults(void **state)
{
	(void)state;
	policy_ok(HPU_AUTOCAST_BF16, NULL, NULL);
	for (size_t i = 0; i < NOPS; i++) {
		int want = !strcmp(all_ops[i], "linear") || !strcmp(all_ops[i], "matmul") ||
			   !strcmp(all_ops[i], "bmm") || !strcmp(all_ops[i], "conv2d") ||
			   !strcmp(all_ops[i], "attention");
		assert_int_equal(hpu_autocast_lowered(all_ops[i]), want);
	}
	/* no low type: nothing is lowered, whatever the lists say */
	policy_ok(HPU_AUTOCAST_NONE, "gelu\n", NULL);
	for (size_t i = 0; i < NOPS; i++)
		assert_int_equal(hpu_autocast_lowered(all_ops[i]), 0);
	assert_int_equal(hpu__autocast_ops(), (int)NOPS);
	for (size_t i = 0; i < NOPS; i++)
		assert_string_equal(hpu__autocast_op_name((int)i), all_ops[i]);
	assert_null(hpu__autocast_op_name((int)NOPS));
	assert_int_equal(hpu_autocast_lowered("lineer"), 0);
}

static void test_lists_move_ops(void **state)
{
	(void)state;
	policy_ok(HPU_AUTOCAST_FP16, "# into low precision\n  gelu  \n\nsoftmax # trailing\n\tlayernorm\n",
		  "linear\r\n# comment only\n");
	assert_int_equal(hpu_autocast_lowered("gelu"), 1);
	assert_int_equal(hpu_autocast_lowered("softmax"), 1);
	assert_int_equal(hpu_autocast_lowered("layernorm"), 1);
	assert_int_equal(hpu_autocast_lowered("linear"), 0);
	assert_int_equal(hpu_autocast_lowered("matmul"), 1);
	assert_int_equal(hpu_autocast_lowered("relu"), 0);
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	hpu__autocast_print(f);
	fclose(f);
	printf("%s", buf);
	assert_non_null(strstr(buf, "low precision fp16"));
	assert_non_null(strstr(buf, "lower list: matmul bmm conv2d gelu softmax layernorm attention\n"));
	assert_non_null(strstr(buf, "fp32 list: linear maxpool2d"));
	free(buf);
	/* a fresh init starts from the defaults again */
	policy_ok(HPU_AUTOCAST_BF16, NULL, NULL);
	assert_int_equal(hpu_autocast_lowered("gelu"), 0);
	assert_int_equal(hpu_autocast_lowered("linear"), 1);
}

/* A name that means no op here is ignored and named in one warning per
 * file (with the nearest of ours when it looks like a typo); the known
 * names of the file still apply. */
static void test_unknown_op(void **state)
{
	(void)state;
	char want[512];
	policy_ok(HPU_AUTOCAST_BF16, "relu\n\n  lineer\nsilu\n", "Linear\n");
	assert_int_equal(hpu_autocast_lowered("relu"), 1);
	assert_int_equal(hpu_autocast_lowered("linear"), 1);
	const char *w = hpu__autocast_warnings();
	printf("%s", w);
	snprintf(want, sizeof want,
		 "LOWER_LIST file %s/lower.txt: 2 names mean no op here and are ignored: "
		 "'lineer' (did you mean 'linear'?), 'silu' (ops: linear, matmul, bmm,",
		 dir);
	assert_non_null(strstr(w, want));
	snprintf(want, sizeof want,
		 "\nFP32_LIST file %s/fp32.txt: 1 name means no op here and is ignored: "
		 "'Linear' (did you mean 'linear'?) (ops: ",
		 dir);
	assert_non_null(strstr(w, want));
	/* the next init starts again */
	policy_ok(HPU_AUTOCAST_BF16, "relu\n", NULL);
	assert_string_equal(hpu__autocast_warnings(), "");
}

/* PyTorch's names for our ops, as Habana's list files write them, in the
 * shape of Optimum Habana's ops_bf16.txt / ops_fp32.txt, through the
 * variables Optimum Habana sets (PT_HPU_AUTOCAST_*) next to the older
 * ones. */
static void test_torch_names(void **state)
{
	(void)state;
	unsetenv("LOWER_LIST");
	unsetenv("FP32_LIST");
	setenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST",
	       write_file("ops_bf16.txt", "slice\nunsqueeze\nmul\ncast\nadd\nlinear\ntranspose\n"
					  "matmul\nsilu\nexp\npow\nmean\nrsqrt\nsoftplus\nneg\ncat\n"
					  "sum\nconvolution_overrideable\nsub\nembedding\nindex_select\n"
					  "argmax\nindex_copy_\neq\ngt\naddmm\nbaddbmm\nlayer_norm.default\n"
					  "aten::gelu\nrelu_\n"),
	       1);
	setenv("PT_HPU_AUTOCAST_FP32_OPS_LIST",
	       write_file("ops_fp32.txt", "acos\nexp\nlog_softmax\n_softmax\nnll_loss\nmse_loss\n"
					  "max_pool2d_with_indices\n"),
	       1);
	char err[512] = "";
	if (hpu__autocast_init(HPU_AUTOCAST_BF16, err, sizeof err) < 0)
		fail_msg("ops_bf16.txt did not load: %s", err);
	printf("%s", hpu__autocast_warnings());
	static const char *const low[] = {"linear", "matmul", "bmm", "conv2d", "embedding",
					  "layernorm", "gelu", "relu", "attention"};
	static const char *const fp32[] = {"softmax_xent", "softmax", "maxpool2d", "tanh",
					   "dropout", "avgpool2d"};
	for (size_t i = 0; i < sizeof low / sizeof *low; i++)
		if (!hpu_autocast_lowered(low[i]))
			fail_msg("%s is not lowered", low[i]);
	for (size_t i = 0; i < sizeof fp32 / sizeof *fp32; i++)
		if (hpu_autocast_lowered(fp32[i]))
			fail_msg("%s is lowered", fp32[i]);
	char want[256];
	snprintf(want, sizeof want,
		 "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST file %s/ops_bf16.txt: 21 names mean no op "
		 "here and are ignored: 'slice', 'unsqueeze', 'mul', 'cast', 'add', 'transpose', ",
		 dir);
	assert_non_null(strstr(hpu__autocast_warnings(), want));
	snprintf(want, sizeof want,
		 "PT_HPU_AUTOCAST_FP32_OPS_LIST file %s/ops_fp32.txt: 3 names mean no op here and "
		 "are ignored: 'acos', 'exp', 'mse_loss' (ops: ",
		 dir);
	assert_non_null(strstr(hpu__autocast_warnings(), want));
	/* one op in both lists, across the old and the new names */
	setenv("FP32_LIST", write_file("fp32.txt", "mm\n"), 1);
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_BF16, err, sizeof err), -1);
	printf("error: %s\n", err);
	assert_non_null(strstr(err, "op 'linear' is in both the PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST file"));
	assert_non_null(strstr(err, "and the FP32_LIST file"));
	assert_non_null(strstr(err, "(line 1, as 'mm')"));
	unsetenv("FP32_LIST");
	unsetenv("PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST");
	unsetenv("PT_HPU_AUTOCAST_FP32_OPS_LIST");
	policy_ok(HPU_AUTOCAST_BF16, NULL, NULL);
}

static void test_unreadable_file(void **state)
{
	(void)state;
	char err[512] = "";
	unsetenv("FP32_LIST");
	setenv("LOWER_LIST", "/nonexistent/autocast.txt", 1);
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_BF16, err, sizeof err), -1);
	printf("error: %s\n", err);
	assert_non_null(strstr(err, "LOWER_LIST file /nonexistent/autocast.txt: cannot read it: "));
	unsetenv("LOWER_LIST");
	setenv("FP32_LIST", dir, 1); /* a directory: opens, cannot be read */
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_BF16, err, sizeof err), -1);
	printf("error: %s\n", err);
	assert_non_null(strstr(err, "FP32_LIST file "));
	assert_non_null(strstr(err, dir));
	unsetenv("FP32_LIST");
}

/* A list of NUL bytes is not an empty list; a FIFO is refused at once,
 * not waited on for a writer. */
static void test_list_not_text(void **state)
{
	(void)state;
	char err[512] = "", path[128], want[256];
	static const char zeros[64];
	snprintf(path, sizeof path, "%s/nul.txt", dir);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fwrite(zeros, 1, sizeof zeros, f), sizeof zeros);
	fclose(f);
	unsetenv("FP32_LIST");
	setenv("LOWER_LIST", path, 1);
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_BF16, err, sizeof err), -1);
	printf("error: %s\n", err);
	snprintf(want, sizeof want, "LOWER_LIST file %s line 1: a NUL byte: not a text file", path);
	assert_non_null(strstr(err, want));
	static const char later[] = "gelu\n# ok\nrelu\0\n";
	f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fwrite(later, 1, sizeof later - 1, f), sizeof later - 1);
	fclose(f);
	unsetenv("LOWER_LIST");
	setenv("FP32_LIST", path, 1);
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_BF16, err, sizeof err), -1);
	printf("error: %s\n", err);
	snprintf(want, sizeof want, "FP32_LIST file %s line 3: a NUL byte: not a text file", path);
	assert_non_null(strstr(err, want));
	unlink(path);

	snprintf(path, sizeof path, "%s/fifo", dir);
	assert_int_equal(mkfifo(path, 0600), 0);
	unsetenv("FP32_LIST");
	setenv("LOWER_LIST", path, 1);
	alarm(10); /* a hang fails the test instead of blocking ctest */
	int rc = hpu__autocast_init(HPU_AUTOCAST_BF16, err, sizeof err);
	alarm(0);
	unlink(path);
	printf("error: %s\n", err);
	assert_int_equal(rc, -1);
	snprintf(want, sizeof want, "LOWER_LIST file %s: cannot read it: not a regular file (a FIFO)", path);
	assert_non_null(strstr(err, want));
	setenv("LOWER_LIST", "/dev/zero", 1);
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_BF16, err, sizeof err), -1);
	printf("error: %s\n", err);
	assert_non_null(strstr(err, "LOWER_LIST file /dev/zero: cannot read it: not a regular file (a character device)"));
	unsetenv("LOWER_LIST");
}

static void test_both_lists(void **state)
{
	(void)state;
	char err[512] = "", want[512];
	assert_int_equal(policy(HPU_AUTOCAST_BF16, "gelu\nrelu\n", "relu\n", err, sizeof err), -1);
	printf("error: %s\n", err);
	snprintf(want, sizeof want,
		 "op 'relu' is in both the LOWER_LIST file %s/lower.txt (line 2) and the FP32_LIST "
		 "file %s/fp32.txt (line 1): an op runs in one precision; take it out of one list",
		 dir, dir);
	assert_string_equal(err, want);
	/* two PyTorch names of one op here: each file's own spelling */
	assert_int_equal(policy(HPU_AUTOCAST_BF16, "# ours\n\nmm\n", "gelu\nlinear\n", err,
				sizeof err), -1);
	printf("error: %s\n", err);
	snprintf(want, sizeof want,
		 "op 'linear' is in both the LOWER_LIST file %s/lower.txt (line 3, as 'mm') and the "
		 "FP32_LIST file %s/fp32.txt (line 2): 'mm' is op 'linear' here, and an op runs in "
		 "one precision; take it out of one list",
		 dir, dir);
	assert_string_equal(err, want);
}

/* ---- the counters follow the policy ---- */

static void linear_once(float *y)
{
	float x[2 * 3] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
	float w[4 * 3] = {1.001f, 2, 3, 4, 5, 6.003f, 7, 8, 9, 10, 11, 12.7f};
	hpu_linear_forward(x, w, NULL, y, 2, 3, 4);
}

static void test_counters(void **state)
{
	(void)state;
	float y_low[8], y_fp32[8], y_none[8];
	policy_ok(HPU_AUTOCAST_BF16, NULL, NULL);
	uint64_t lo = hpu__autocast_count("linear", 1), hi = hpu__autocast_count("linear", 0);
	linear_once(y_low);
	assert_int_equal(hpu__autocast_count("linear", 1), lo + 1);
	assert_int_equal(hpu__autocast_count("linear", 0), hi);

	policy_ok(HPU_AUTOCAST_BF16, NULL, "linear\n");
	linear_once(y_fp32);
	assert_int_equal(hpu__autocast_count("linear", 1), lo + 1);
	assert_int_equal(hpu__autocast_count("linear", 0), hi + 1);

	policy_ok(HPU_AUTOCAST_NONE, NULL, NULL);
	linear_once(y_none);
	assert_int_equal(hpu__autocast_count("linear", 0), hi + 2);
	/* fp32: the kernel runs untouched; lowered: a different result */
	assert_memory_equal(y_fp32, y_none, sizeof y_none);
	assert_memory_not_equal(y_low, y_none, sizeof y_none);

	/* an op moved in by LOWER_LIST counts as low */
	policy_ok(HPU_AUTOCAST_BF16, "gelu\n", NULL);
	uint64_t g = hpu__autocast_count("gelu", 1);
	hpu_gelu_forward(y_none, y_low, 8);
	assert_int_equal(hpu__autocast_count("gelu", 1), g + 1);
	assert_int_equal(hpu__autocast_count("nosuchop", 1), 0);
}

/* ---- each low-precision variant against the fp32 op ---- */

#define MAXOUT 6
typedef struct outs {
	int k;
	const char *name[MAXOUT];
	float *v[MAXOUT];
	size_t n[MAXOUT];
} outs;

static float *out_new(outs *o, const char *name, size_t n)
{
	assert_true(o->k < MAXOUT);
	o->name[o->k] = name;
	o->n[o->k] = n;
	o->v[o->k] = xcalloc(n, sizeof(float));
	return o->v[o->k++];
}

static float *in_new(size_t n, float lo, float hi)
{
	float *p = xcalloc(n, sizeof(float));
	fill(p, n, lo, hi);
	return p;
}

static void case_linear(outs *o)
{
	int B = 8, I = 32, O = 16;
	float *x = in_new((size_t)B * I, -1, 1), *w = in_new((size_t)O * I, -1, 1);
	float *b = in_new(O, -1, 1), *dy = in_new((size_t)B * O, -1, 1);
	float *y = out_new(o, "y", (size_t)B * O), *dx = out_new(o, "dx", (size_t)B * I);
	float *dw = out_new(o, "dw", (size_t)O * I), *db = out_new(o, "db", O);
	hpu_linear_forward(x, w, b, y, B, I, O);
	hpu_linear_backward(x, w, dy, dx, dw, db, B, I, O);
	free(x), free(w), free(b), free(dy);
}

static void case_matmul(outs *o)
{
	int m = 8, n = 12, k = 20;
	float *a = in_new((size_t)k * m, -1, 1), *b = in_new((size_t)k * n, -1, 1);
	float *c = out_new(o, "c", (size_t)m * n), *c2 = out_new(o, "c+=", (size_t)m * n);
	hpu_matmul(a, b, c, m, n, k, 1, 0, 0);
	fill(c2, (size_t)m * n, -1, 1);
	hpu_matmul(a, b, c2, m, n, k, 1, 0, 1);
	free(a), free(b);
}

static void case_bmm(outs *o)
{
	int cnt = 3, m = 6, n = 5, k = 16;
	float *a = in_new((size_t)cnt * m * k, -1, 1), *b = in_new((size_t)cnt * n * k, -1, 1);
	float *c = out_new(o, "c", (size_t)cnt * m * n);
	hpu_bmm(a, b, c, cnt, m, n, k, 0, 1, 0, (size_t)m * k, (size_t)n * k, (size_t)m * n);
	free(a), free(b);
}

static void case_conv2d(outs *o)
{
	hpu_conv2d_shape s = {2, 3, 8, 8, 4, 3, 1, 1};
	size_t xn = 2 * 3 * 64, wn = 4 * 3 * 9, yn = 2 * 4 * 64;
	float *x = in_new(xn, -1, 1), *w = in_new(wn, -1, 1), *b = in_new(4, -1, 1);
	float *dy = in_new(yn, -1, 1), *scr = xcalloc(hpu_conv2d_scratch(&s), sizeof(float));
	float *y = out_new(o, "y", yn), *dx = out_new(o, "dx", xn);
	float *dw = out_new(o, "dw", wn), *db = out_new(o, "db", 4);
	hpu_conv2d_forward(&s, x, w, b, y, scr);
	hpu_conv2d_backward(&s, x, w, dy, dx, dw, db, scr);
	free(x), free(w), free(b), free(dy), free(scr);
}

static void case_maxpool2d(outs *o)
{
	size_t xn = 2 * 3 * 64, yn = 2 * 3 * 16;
	float *x = in_new(xn, -1, 1), *dy = in_new(yn, -1, 1);
	int32_t *idx = xcalloc(yn, sizeof *idx);
	float *y = out_new(o, "y", yn), *dx = out_new(o, "dx", xn);
	hpu_maxpool2d_forward(x, y, idx, 2, 3, 8, 8, 2, 2);
	hpu_maxpool2d_backward(dy, idx, dx, 2, 3, 8, 8, 2, 2);
	free(x), free(dy), free(idx);
}

static void case_avgpool2d(outs *o)
{
	size_t xn = 2 * 3 * 64, yn = 2 * 3 * 9;
	float *x = in_new(xn, -1, 1), *dy = in_new(yn, -1, 1);
	float *y = out_new(o, "y", yn), *dx = out_new(o, "dx", xn);
	hpu_avgpool2d_forward(x, y, 2, 3, 8, 8, 3, 2);
	hpu_avgpool2d_backward(dy, dx, 2, 3, 8, 8, 3, 2);
	free(x), free(dy);
}

/* relu, gelu, tanh, dropout: y = f(x), dx from dy */
static void case_pointwise(outs *o, int which)
{
	size_t n = 256;
	float *x = in_new(n, -3, 3), *dy = in_new(n, -1, 1);
	uint8_t *mask = xcalloc(n, 1);
	float *y = out_new(o, "y", n), *dx = out_new(o, "dx", n);
	switch (which) {
	case 0:
		hpu_relu_forward(x, y, n);
		hpu_relu_backward(y, dy, dx, n);
		break;
	case 1:
		hpu_gelu_forward(x, y, n);
		hpu_gelu_backward(x, dy, dx, n);
		break;
	case 2:
		hpu_tanh_forward(x, y, n);
		hpu_tanh_backward(y, dy, dx, n);
		break;
	default:
		hpu_dropout_forward(x, y, mask, n, 0.25f, 7, 3);
		hpu_dropout_backward(dy, mask, dx, n, 0.25f);
	}
	free(x), free(dy), free(mask);
}
static void case_relu(outs *o) { case_pointwise(o, 0); }
static void case_gelu(outs *o) { case_pointwise(o, 1); }
static void case_tanh(outs *o) { case_pointwise(o, 2); }
static void case_dropout(outs *o) { case_pointwise(o, 3); }

static void case_softmax(outs *o)
{
	int r = 6, c = 10;
	float *x = in_new((size_t)r * c, -3, 3), *dy = in_new((size_t)r * c, -1, 1);
	float *y = out_new(o, "y", (size_t)r * c), *dx = out_new(o, "dx", (size_t)r * c);
	hpu_softmax_forward(x, y, r, c);
	hpu_softmax_backward(y, dy, dx, r, c);
	free(x), free(dy);
}

static void case_softmax_xent(outs *o)
{
	int B = 8, C = 10;
	int32_t labels[8] = {0, 3, 9, 2, 2, 5, 7, 1};
	float *z = in_new((size_t)B * C, -3, 3);
	float *loss = out_new(o, "loss", 1), *dz = out_new(o, "dlogits", (size_t)B * C);
	loss[0] = hpu_cross_entropy_forward(z, labels, dz, B, C);
	free(z);
}

static void case_layernorm(outs *o)
{
	int r = 6, c = 32;
	size_t n = (size_t)r * c;
	float *x = in_new(n, -2, 2), *g = in_new(c, 0.5f, 1.5f), *be = in_new(c, -1, 1);
	float *dy = in_new(n, -1, 1), mean[6], rstd[6];
	float *y = out_new(o, "y", n), *dx = out_new(o, "dx", n);
	float *dg = out_new(o, "dgamma", c), *db = out_new(o, "dbeta", c);
	hpu_layernorm_forward(x, g, be, y, mean, rstd, r, c, 1e-5f);
	hpu_layernorm_backward(x, g, mean, rstd, dy, dx, dg, db, r, c);
	free(x), free(g), free(be), free(dy);
}

static void case_embedding(outs *o)
{
	int n = 12, vocab = 20, dim = 8;
	int32_t ids[12] = {0, 5, 19, 5, 3, 3, 3, 7, 11, 0, 1, 2};
	float *table = in_new((size_t)vocab * dim, -1, 1), *dy = in_new((size_t)n * dim, -1, 1);
	float *y = out_new(o, "y", (size_t)n * dim), *dt = out_new(o, "dtable", (size_t)vocab * dim);
	assert_int_equal(hpu_embedding_forward(table, ids, y, n, vocab, dim), 0);
	hpu_embedding_backward(ids, dy, dt, n, dim);
	free(table), free(dy);
}

static void case_attention(outs *o)
{
	int B = 2, T = 6, H = 2, hd = 4, D = H * hd;
	size_t qn = (size_t)B * T * 3 * D, on = (size_t)B * T * D;
	float *qkv = in_new(qn, -1, 1), *dout = in_new(on, -1, 1);
	float *att = xcalloc((size_t)B * H * T * T, sizeof(float));
	float *out = out_new(o, "out", on), *dqkv = out_new(o, "dqkv", qn);
	hpu_attention_forward(qkv, out, att, B, T, H, hd);
	hpu_attention_backward(qkv, att, dout, dqkv, B, T, H, hd);
	free(qkv), free(dout), free(att);
}

typedef void (*case_fn)(outs *o);
static const case_fn cases[NOPS] = {
	case_linear, case_matmul, case_bmm, case_conv2d, case_maxpool2d,
	case_avgpool2d, case_relu, case_gelu, case_tanh, case_softmax,
	case_softmax_xent, case_layernorm, case_embedding, case_dropout, case_attention,
};

static void run_case(int op, int lowp, outs *o)
{
	memset(o, 0, sizeof *o);
	rng_seed(1000 + (uint64_t)op); /* the same inputs every run */
	uint64_t low = hpu__autocast_count(all_ops[op], 1);
	cases[op](o);
	/* every call of the op ran in the expected precision */
	if (lowp != HPU_AUTOCAST_NONE)
		assert_true(hpu__autocast_count(all_ops[op], 1) > low);
	else
		assert_int_equal(hpu__autocast_count(all_ops[op], 1), low);
}

static void free_outs(outs *o)
{
	for (int i = 0; i < o->k; i++)
		free(o->v[i]);
}

static void check_variants(int lowp, double tol, const char *type)
{
	char every[512] = "";
	for (size_t i = 0; i < NOPS; i++)
		strcat(strcat(every, all_ops[i]), "\n");
	for (size_t op = 0; op < NOPS; op++) {
		outs ref, low;
		policy_ok(HPU_AUTOCAST_NONE, NULL, NULL);
		run_case((int)op, HPU_AUTOCAST_NONE, &ref);
		policy_ok(lowp, every, NULL);
		run_case((int)op, lowp, &low);
		double op_max = 0.0;
		for (int k = 0; k < ref.k; k++) {
			double md = 0.0, scale = 0.0;
			for (size_t i = 0; i < ref.n[k]; i++) {
				double d = fabs((double)low.v[k][i] - ref.v[k][i]);
				md = isnan(d) || d > md ? (isnan(d) ? INFINITY : d) : md;
				scale = fmax(scale, fabs((double)ref.v[k][i]));
			}
			double rel = md / (scale > 0 ? scale : 1);
			printf("%s %-12s %-7s maxdiff %.3e  relative %.3e (tol %.0e)\n", type,
			       all_ops[op], ref.name[k], md, rel, tol);
			if (!(rel <= tol))
				fail_msg("%s %s %s: relative difference %.3e > %.0e", type,
					 all_ops[op], ref.name[k], rel, tol);
			op_max = fmax(op_max, md);
		}
		/* the low path really ran: some output moved */
		if (!(op_max > 0.0))
			fail_msg("%s %s: no difference from fp32", type, all_ops[op]);
		free_outs(&ref);
		free_outs(&low);
	}
	policy_ok(HPU_AUTOCAST_NONE, NULL, NULL);
}

static void test_bf16_variants(void **state)
{
	(void)state;
	check_variants(HPU_AUTOCAST_BF16, TOL_BF16, "bf16");
}

static void test_fp16_variants(void **state)
{
	(void)state;
	check_variants(HPU_AUTOCAST_FP16, TOL_FP16, "fp16");
}

/* A device's scratch allocator (hpu__ac_set_scratch_allocator): the
 * lowered ops' rounded copies and bf16 forms are made in what it gives,
 * every buffer it gave is released when the allocator changes, and the
 * results are the heap's. */
#define SA_MAX 64
static void *sa_live[SA_MAX];
static int sa_allocs, sa_releases;

static size_t sa_bytes[SA_MAX * 4];
static int sa_nbytes;

static void *sa_alloc(size_t bytes)
{
	void *p = malloc(bytes);
	if (sa_nbytes < SA_MAX * 4)
		sa_bytes[sa_nbytes++] = bytes;
	for (int i = 0; p && i < SA_MAX; i++)
		if (!sa_live[i]) {
			sa_live[i] = p;
			sa_allocs++;
			return p;
		}
	fail_msg("more than %d scratch buffers", SA_MAX);
	return NULL;
}

static void sa_release(void *p)
{
	for (int i = 0; i < SA_MAX; i++)
		if (sa_live[i] == p) {
			sa_live[i] = NULL;
			sa_releases++;
			free(p);
			return;
		}
	fail_msg("released a buffer the allocator did not give: %p", p);
}

/* A lowered linear forward and backward into out. */
static void lowered_linear(float *out, size_t *k)
{
	enum { B = 7, I = 2000, O = 3 };
	static float x[B * I], w[O * I], b[O], y[B * O], dy[B * O], dx[B * I], dw[O * I];
	rng_seed(31);
	fill(x, B * I, -1, 1), fill(w, O * I, -1, 1), fill(b, O, -1, 1), fill(dy, B * O, -1, 1);
	memset(dw, 0, sizeof dw);
	hpu_linear_forward(x, w, b, y, B, I, O);
	hpu_linear_backward(x, w, dy, dx, dw, NULL, B, I, O);
	memcpy(out + *k, y, sizeof y), *k += B * O;
	memcpy(out + *k, dx, sizeof dx), *k += B * I;
	memcpy(out + *k, dw, sizeof dw), *k += O * I;
}

static void test_scratch_allocator(void **state)
{
	(void)state;
	char err[256];
	unsetenv("LOWER_LIST");
	unsetenv("FP32_LIST");
	size_t n = 7 * 3 + 7 * 2000 + 3 * 2000, k;
	float *want = calloc(n, sizeof *want), *got = calloc(n, sizeof *got);
	assert_non_null(want), assert_non_null(got);
	for (int lowp = HPU_AUTOCAST_BF16; lowp <= HPU_AUTOCAST_FP16; lowp++) {
		assert_int_equal(hpu__autocast_init(lowp, err, sizeof err), 0);
		k = 0;
		lowered_linear(want, &k);
		hpu__ac_set_scratch_allocator(sa_alloc, sa_release);
		sa_allocs = sa_releases = sa_nbytes = 0;
		k = 0;
		lowered_linear(got, &k);
		int allocs = sa_allocs;
		/* each exactly an operand's size (x, w, dy; 1024 values at
		 * least), in fp32 or 16 bits: not half as much again */
		for (int i = 0; i < sa_nbytes; i++) {
			size_t b = sa_bytes[i], ok = 0;
			const size_t sizes[] = {1024, 7 * 2000, 3 * 2000};
			for (int j = 0; j < 3; j++)
				ok |= b == sizes[j] * 4 || b == sizes[j] * 2;
			if (!ok)
				fail_msg("a scratch buffer of %zu bytes: not an operand's size", b);
		}
		hpu__ac_set_scratch_allocator(NULL, NULL);
		printf("  %s: %d scratch buffers from the allocator, %d released\n",
		       lowp == HPU_AUTOCAST_BF16 ? "bf16" : "fp16", allocs, sa_releases);
		assert_true(allocs >= 3);
		assert_int_equal(sa_releases, allocs);
		for (int i = 0; i < SA_MAX; i++)
			assert_null(sa_live[i]);
		assert_memory_equal(got, want, n * sizeof *got);
	}
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_NONE, err, sizeof err), 0);
	free(want), free(got);
}

/* Activations held in fp32 and bf16 at once (hpu__ac_twin_add): the ops'
 * bf16 form of data within the fp32 one is the bf16 one itself, values
 * unchanged; outside it, or once removed, a converted copy. */
static void test_twins(void **state)
{
	(void)state;
	enum { B = 8, IN = 64, OUT = 16 };
	static float x[B * IN], w[OUT * IN], y_twin[B * OUT], y_plain[B * OUT];
	static uint16_t h[B * IN];
	for (int i = 0; i < B * IN; i++) {
		h[i] = hpu_to_bf16(sinf((float)i) * 3.0f);
		x[i] = hpu_from_bf16(h[i]);
	}
	for (int i = 0; i < OUT * IN; i++)
		w[i] = cosf((float)i) / 8.0f;
	policy_ok(HPU_AUTOCAST_BF16, NULL, NULL);
	assert_int_equal(hpu__ac_twin_add(x, h, B * IN - IN), 0); /* all rows but the last */
	assert_ptr_equal(hpu__ac_bf16(0, x, B * IN - IN), h);
	assert_ptr_equal(hpu__ac_bf16(0, x + IN, 2 * IN), h + IN);
	const uint16_t *c = hpu__ac_bf16(0, x + IN, B * IN - IN); /* past the twin */
	assert_ptr_not_equal(c, h + IN);
	assert_memory_equal(c, h + IN, (B * IN - IN) * sizeof *h);
	hpu_linear_forward(x, w, NULL, y_twin, B - 1, IN, OUT);
	hpu__ac_twin_remove(x);
	c = hpu__ac_bf16(0, x, B * IN - IN);
	assert_ptr_not_equal(c, h);
	assert_memory_equal(c, h, (B * IN - IN) * sizeof *h);
	hpu_linear_forward(x, w, NULL, y_plain, B - 1, IN, OUT);
	assert_memory_equal(y_twin, y_plain, sizeof y_twin);
	policy_ok(HPU_AUTOCAST_NONE, NULL, NULL);
}

/* Gradients owed zeros (hpu__ac_fresh_add): a linear's and a conv2d's
 * backward claim their dw and db and give what they give on zeroed ones,
 * bit for bit, though the memory held garbage; the padding after each is
 * zeroed; a region nobody claims is zeroed by the flush, one forgotten is
 * left alone; a claimed one is not claimed again. */
static void test_fresh_grads(void **state)
{
	(void)state;
	enum { B = 8, IN = 40, OUT = 12, WPAD = OUT * IN + 16, BPAD = OUT + 4 };
	static float x[B * IN], w[OUT * IN], dy[B * OUT], dx[B * IN];
	static float ref[WPAD + BPAD], g[WPAD + BPAD], spare[32];
	for (int i = 0; i < B * IN; i++)
		x[i] = sinf((float)i);
	for (int i = 0; i < OUT * IN; i++)
		w[i] = cosf((float)i) / 8.0f;
	for (int i = 0; i < B * OUT; i++)
		dy[i] = sinf(0.3f * (float)i);
	for (int lp = 0; lp < 2; lp++) {
		policy_ok(lp ? HPU_AUTOCAST_BF16 : HPU_AUTOCAST_NONE, NULL, NULL);
		memset(ref, 0, sizeof ref);
		hpu_linear_backward(x, w, dy, dx, ref, ref + WPAD, B, IN, OUT);
		for (size_t i = 0; i < WPAD + BPAD; i++)
			g[i] = NAN; /* garbage */
		assert_int_equal(hpu__ac_fresh_add(g, WPAD), 0);
		assert_int_equal(hpu__ac_fresh_add(g + WPAD, BPAD), 0);
		hpu_linear_backward(x, w, dy, dx, g, g + WPAD, B, IN, OUT);
		assert_memory_equal(g, ref, sizeof g);
		assert_int_equal(hpu__ac_fresh_claim(g, OUT * IN), 0); /* claimed */
		hpu__ac_fresh_flush(g, WPAD + BPAD);                  /* nothing left */
		assert_memory_equal(g, ref, sizeof g);
	}
	/* conv2d: 2 channels in, 3 out, 3x3 kernels on 6x6, 2 samples */
	hpu_conv2d_shape cs = {.batch = 2, .in_ch = 2, .height = 6, .width = 6, .out_ch = 3,
				.kernel = 3, .stride = 1, .pad = 1};
	enum { CX = 2 * 2 * 36, CW = 3 * 2 * 9, CY = 2 * 3 * 36 };
	static float cx[CX], cw[CW], cdy[CY], cdx[CX], cref[CW + 3], cg[CW + 3];
	float *scratch = calloc(hpu_conv2d_scratch(&cs), sizeof *scratch);
	assert_non_null(scratch);
	for (int i = 0; i < CX; i++)
		cx[i] = sinf((float)i);
	for (int i = 0; i < CW; i++)
		cw[i] = cosf((float)i) / 4.0f;
	for (int i = 0; i < CY; i++)
		cdy[i] = sinf(0.7f * (float)i);
	policy_ok(HPU_AUTOCAST_NONE, NULL, NULL);
	memset(cref, 0, sizeof cref);
	hpu_conv2d_backward(&cs, cx, cw, cdy, cdx, cref, cref + CW, scratch);
	for (size_t i = 0; i < CW + 3; i++)
		cg[i] = NAN;
	assert_int_equal(hpu__ac_fresh_add(cg, CW), 0);
	assert_int_equal(hpu__ac_fresh_add(cg + CW, 3), 0);
	hpu_conv2d_backward(&cs, cx, cw, cdy, cdx, cg, cg + CW, scratch);
	assert_memory_equal(cg, cref, sizeof cg);
	free(scratch);
	for (size_t i = 0; i < 32; i++)
		spare[i] = NAN;
	assert_int_equal(hpu__ac_fresh_add(spare + 8, 16), 0);
	assert_int_equal(hpu__ac_fresh_claim(spare + 8, 17), 0); /* larger than owed */
	hpu__ac_fresh_flush(spare, 32);
	for (size_t i = 0; i < 32; i++)
		assert_true(i >= 8 && i < 24 ? spare[i] == 0.0f : isnan(spare[i]));
	assert_int_equal(hpu__ac_fresh_claim(spare + 8, 16), 0); /* flushed */
	for (size_t i = 0; i < 32; i++)
		spare[i] = NAN;
	assert_int_equal(hpu__ac_fresh_add(spare, 16), 0);
	hpu__ac_fresh_forget(spare, 32);
	assert_int_equal(hpu__ac_fresh_claim(spare, 16), 0); /* forgotten */
	for (size_t i = 0; i < 32; i++)
		assert_true(isnan(spare[i]));
	policy_ok(HPU_AUTOCAST_NONE, NULL, NULL);
}

/* The backend's gemm, answering HPU_BE_UNSUPPORTED to a bf16 output: the
 * op then rounds the fp32 product itself. */
static int (*real_gemm)(const hpu__gemm *g);
static int gemm_no_c16(const hpu__gemm *g)
{
	return g->c16 ? HPU_BE_UNSUPPORTED : real_gemm(g);
}

/* Gradients owed zeros with a bf16 place (hpu__ac_fresh_add16): a bf16
 * linear's weight gradient goes there as the bf16 rounding of the zeroed
 * run's, bit for bit, its fp32 gradient unwritten; the bias is claimed as
 * ever; a second writer adds onto the first's values; without the
 * backend's bf16 output the op rounds the same sums itself. */
static void test_fresh_grads16(void **state)
{
	(void)state;
	enum { B = 8, IN = 40, OUT = 12, NW = OUT * IN, WPAD = NW + 16, BPAD = OUT + 4 };
	static float x[B * IN], w[OUT * IN], dy[B * OUT], dx[B * IN];
	static float ref[WPAD + BPAD], twice[WPAD + BPAD], g[WPAD + BPAD];
	static uint16_t g16[WPAD + BPAD];
	for (int i = 0; i < B * IN; i++)
		x[i] = sinf((float)i);
	for (int i = 0; i < NW; i++)
		w[i] = cosf((float)i) / 8.0f;
	for (int i = 0; i < B * OUT; i++)
		dy[i] = sinf(0.3f * (float)i);
	policy_ok(HPU_AUTOCAST_BF16, NULL, NULL);
	const hpu__backend *be = hpu__be();
	int direct = be->gemm_c16 && be->bf16_native();
	printf("  backend %s: bf16 output %s\n", be->name, direct ? "yes" : "no (not claimed)");
	memset(ref, 0, sizeof ref);
	hpu_linear_backward(x, w, dy, dx, ref, ref + WPAD, B, IN, OUT);
	/* a second call adds onto the first's bf16 values */
	for (size_t i = 0; i < WPAD + BPAD; i++)
		twice[i] = i < NW ? hpu_from_bf16(hpu_to_bf16(ref[i])) : ref[i];
	hpu_linear_backward(x, w, dy, dx, twice, NULL, B, IN, OUT);
	static hpu__backend no_c16;
	no_c16 = *be;
	no_c16.gemm = gemm_no_c16;
	real_gemm = be->gemm;
	/* the backend's bf16 output, the op's rounding, two writers */
	for (int pass = 0; pass < (direct ? 3 : 2); pass++) {
		for (size_t i = 0; i < WPAD + BPAD; i++) {
			g[i] = NAN;
			g16[i] = 0xabcd;
		}
		assert_int_equal(hpu__ac_fresh_add16(g, WPAD, g16), 0);
		assert_int_equal(hpu__ac_fresh_add16(g + WPAD, BPAD, g16 + WPAD), 0);
		hpu__be_set(pass == 1 ? &no_c16 : be);
		hpu_linear_backward(x, w, dy, dx, g, g + WPAD, B, IN, OUT);
		if (pass == 2)
			hpu_linear_backward(x, w, dy, dx, g, NULL, B, IN, OUT);
		hpu__be_set(NULL);
		int taken = hpu__ac_fresh_taken16(g);
		printf("  pass %d: weight gradient %s\n", pass, taken ? "in bf16" : "in fp32");
		assert_int_equal(taken, direct && pass < 2);
		assert_int_equal(hpu__ac_fresh_taken16(g + WPAD), 0); /* the bias: fp32 */
		hpu__ac_fresh_flush(g, WPAD + BPAD);
		const float *want = pass == 2 ? twice : ref;
		for (size_t i = 0; i < WPAD; i++) {
			if (!taken) {
				assert_memory_equal(&g[i], &want[i], 4);
				continue;
			}
			if (g16[i] != hpu_to_bf16(want[i]) || !isnan(g[i]))
				fail_msg("dw[%zu]: bf16 %#x, want %#x (%g); fp32 %g, want unwritten", i,
					 g16[i], hpu_to_bf16(want[i]), (double)want[i], (double)g[i]);
		}
		assert_memory_equal(g + WPAD, want + WPAD, BPAD * sizeof *g);
	}
	/* fp32 owed zeros have no bf16 place; a taken claim is forgotten */
	for (size_t i = 0; i < WPAD; i++)
		g[i] = NAN;
	assert_int_equal(hpu__ac_fresh_add(g, WPAD), 0);
	assert_null(hpu__ac_fresh_claim16(g, NW));
	assert_int_equal(hpu__ac_fresh_claim(g, NW), 1);
	assert_int_equal(hpu__ac_fresh_add16(g, WPAD, g16), 0);
	assert_null(hpu__ac_fresh_claim16(g, WPAD + 1)); /* larger than owed */
	assert_ptr_equal(hpu__ac_fresh_claim16(g, NW), g16);
	assert_true(g16[NW] == 0 && g16[WPAD - 1] == 0); /* the padding */
	hpu__ac_fresh_forget(g, WPAD);
	assert_int_equal(hpu__ac_fresh_taken16(g), 0);
	policy_ok(HPU_AUTOCAST_NONE, NULL, NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_lists_move_ops),
		cmocka_unit_test(test_unknown_op),
		cmocka_unit_test(test_torch_names),
		cmocka_unit_test(test_unreadable_file),
		cmocka_unit_test(test_list_not_text),
		cmocka_unit_test(test_both_lists),
		cmocka_unit_test(test_counters),
		cmocka_unit_test(test_bf16_variants),
		cmocka_unit_test(test_fp16_variants),
		cmocka_unit_test(test_twins),
		cmocka_unit_test(test_fresh_grads),
		cmocka_unit_test(test_fresh_grads16),
		cmocka_unit_test(test_scratch_allocator),
	};
	/* HPU_TEST=test_name (a glob) runs only the tests it names. */
	if (getenv("HPU_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPU_TEST"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
