/* test_strict_kernels: training touches device memory only through the
 * kernel table and the runtime's ops, as on a GPU.
 *
 * Under --device cpu-strict with HPU_STRICT_KERNELS=1 device memory opens
 * only inside the table's functions (worker/device/device_kernels.c), not
 * for a whole layer: a C loop of an op or a layer over device memory
 * faults at once. The MLP, the CNN, the ResNet (batch norm), a small
 * gpt_lm (attention, layer norm, embedding, dropout), the sequence model
 * (conv1d, 1-D pooling, slice, concat, permute, reduce, reshape,
 * rectangular convolution, sigmoid, both BCEs) and a masked attention
 * with MSE train a few steps so under ddp and zero3 on 2 workers, fp32
 * and bf16-mixed, and save the parameters byte for byte as on cpu. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/runlib.h"

/* One run of `model` (NULL: the MLP) with `margs` on `device`, 2 workers,
 * 3 steps of 16, saving the parameters to `path`. */
static void one_run(const char *device, int kernels, const char *path, const char *model,
		    const char *margs, const char *strategy, const char *precision)
{
	run r;
	if (kernels)
		setenv("HPU_STRICT_KERNELS", "1", 1);
	else
		unsetenv("HPU_STRICT_KERNELS");
	start(&r, 2);
	args(&r, "--device", device, "--strategy", strategy, "--precision", precision,
	     "--max-steps", "3", "--batch-size", "16", "--optimizer", "adamw", "--save-params",
	     path, NULL);
	char *out = model ? finish_with(&r, 0, model, margs) : finish(&r, 0, margs);
	free(out);
	unsetenv("HPU_STRICT_KERNELS");
}

/* The run on cpu and on cpu-strict's kernels-only mode: their
 * --save-params files are equal byte for byte. */
static void same(const char *name, const char *model, const char *margs, const char *strategy,
		 const char *precision)
{
	char a[64], b[64];
	snprintf(a, sizeof a, "/tmp/hpu-sk-%d-cpu.bin", (int)getpid());
	snprintf(b, sizeof b, "/tmp/hpu-sk-%d-strict.bin", (int)getpid());
	one_run("cpu", 0, a, model, margs, strategy, precision);
	one_run("cpu-strict", 1, b, model, margs, strategy, precision);
	size_t na, nb;
	char *pa = h_slurp_n(a, &na), *pb = h_slurp_n(b, &nb);
	assert_non_null(pa);
	assert_non_null(pb);
	int eq = na == nb && memcmp(pa, pb, na) == 0;
	printf("  %-8s %-6s %-10s kernels-only %s cpu (%zu bytes of parameters)\n", name,
	       strategy, precision, eq ? "equals" : "DIFFERS FROM", na);
	assert_true(eq);
	free(pa);
	free(pb);
	unlink(a);
	unlink(b);
}

static void test_mlp(void **state)
{
	(void)state;
	same("mlp", NULL, "--hidden 32 --depth 2", "ddp", "fp32");
	same("mlp", NULL, "--hidden 32 --depth 2", "zero3", "bf16-mixed");
}

static void test_cnn(void **state)
{
	(void)state;
	const char *cnn = h_build("lib/fmnist_cnn.so");
	same("cnn", cnn, NULL, "ddp", "fp32");
	same("cnn", cnn, NULL, "zero3", "bf16-mixed");
}

/* batch norm, the residual adds */
static void test_resnet(void **state)
{
	(void)state;
	same("resnet", h_build("lib/resnet.so"), NULL, "zero3", "bf16-mixed");
}

/* attention, layer norm, embedding, dropout (training mode), GELU */
static void test_gpt_lm(void **state)
{
	(void)state;
	const char *gpt = h_build("lib/gpt_lm.so");
	const char *margs = "--dim 32 --heads 2 --layers 1 --ctx 16 --gen 0";
	same("gpt_lm", gpt, margs, "ddp", "bf16-mixed");
	same("gpt_lm", gpt, margs, "zero3", "fp32");
}

/* the shape, sequence and binary-loss layers (tests/fixtures/seq_model.c) */
static void test_seq_model(void **state)
{
	(void)state;
	const char *seq = h_build("lib/seq_model.so");
	same("seq", seq, NULL, "ddp", "fp32");
	same("seq", seq, NULL, "zero3", "bf16-mixed");
}

/* the attention layer's key mask check, MSE */
static void test_masked_attention(void **state)
{
	(void)state;
	const char *m = h_build("lib/masked_attn_model.so");
	same("masked", m, NULL, "ddp", "fp32");
	same("masked", m, NULL, "zero3", "bf16-mixed");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mlp),
		cmocka_unit_test(test_cnn),
		cmocka_unit_test(test_resnet),
		cmocka_unit_test(test_gpt_lm),
		cmocka_unit_test(test_seq_model),
		cmocka_unit_test(test_masked_attention),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
