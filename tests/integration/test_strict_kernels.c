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
 * and bf16-mixed, and save the parameters byte for byte as on cpu (the
 * attention layer fused too, HPU_FUSED_ATTENTION=1). So
 * does a model whose host-only custom layers (HPU_LAYER_HOST_ONLY) read
 * their tensors themselves: the runtime stages them through host memory,
 * warning once per layer. */
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
 * 3 steps of 16, saving the parameters to `path`; its output. */
static char *one_run(const char *device, int kernels, const char *path, const char *model,
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
	unsetenv("HPU_STRICT_KERNELS");
	return out;
}

/* The run on cpu and on cpu-strict's kernels-only mode: their
 * --save-params files are equal byte for byte. The strict run's output,
 * or NULL. */
static char *same_out(const char *name, const char *model, const char *margs,
		      const char *strategy, const char *precision)
{
	char a[64], b[64];
	snprintf(a, sizeof a, "/tmp/hpu-sk-%d-cpu.bin", (int)getpid());
	snprintf(b, sizeof b, "/tmp/hpu-sk-%d-strict.bin", (int)getpid());
	char *cpu = one_run("cpu", 0, a, model, margs, strategy, precision);
	char *strict = one_run("cpu-strict", 1, b, model, margs, strategy, precision);
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
	/* the CPU needs no staging: no warning there */
	assert_null(strstr(cpu, "staged through host memory"));
	free(cpu);
	return strict;
}

static void same(const char *name, const char *model, const char *margs, const char *strategy,
		 const char *precision)
{
	free(same_out(name, model, margs, strategy, precision));
}

/* times `needle` occurs in `hay` */
static int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
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

/* The attention layer fused (HPU_FUSED_ATTENTION=1): its ops reach
 * device memory only through the table's flash_fwd and flash_bwd. */
static void test_fused_attention(void **state)
{
	(void)state;
	setenv("HPU_FUSED_ATTENTION", "1", 1);
	same("masked fused", h_build("lib/masked_attn_model.so"), NULL, "zero3", "bf16-mixed");
	same("gpt_lm fused", h_build("lib/gpt_lm.so"), "--dim 32 --heads 2 --layers 1 --ctx 16 --gen 0",
	     "ddp", "fp32");
	unsetenv("HPU_FUSED_ATTENTION");
}

/* Host-only custom layers (HPU_LAYER_HOST_ONLY: a parameter, one shared
 * with the next layer, a buffer, saved and scratch memory) read and write
 * their tensors themselves: on cpu-strict they run on host copies, staged
 * by the runtime, and train as on cpu; one warning per layer names it;
 * the staging's bytes are the placement plan's. */
static void test_host_only_layers(void **state)
{
	(void)state;
	const char *m = h_build("lib/host_layer_model.so");
	static const char *const cfg[][2] = {{"ddp", "fp32"}, {"zero3", "bf16-mixed"}};
	for (int k = 0; k < 2; k++) {
		char *out = same_out("host", m, NULL, cfg[k][0], cfg[k][1]);
		static const char *const layers[] = {"hscale", "hscale2"};
		for (int j = 0; j < 2; j++) {
			char want[192];
			snprintf(want, sizeof want,
				 "warning: layer %s is host-only (HPU_LAYER_HOST_ONLY) on device "
				 "cpu-strict: its tensors are staged through host memory (correct, slow)",
				 layers[j]);
			if (count(out, want) != 1)
				fprintf(stderr, "wanted once: %s\noutput:\n%s\n", want, out);
			assert_int_equal(count(out, want), 1);
		}
		assert_int_equal(count(out, "staged through host memory"), 2);
		free(out);
	}
	/* the staging's bytes are counted and planned: each step's copies
	 * are the plan's, the host-only layers' part named */
	run r;
	setenv("HPU_STRICT_KERNELS", "1", 1);
	start(&r, 2);
	args(&r, "--device", "cpu-strict", "--max-steps", "2", "--batch-size", "16", "--verbose",
	     NULL);
	char *out = finish_with(&r, 0, m, NULL);
	unsetenv("HPU_STRICT_KERNELS");
	assert_non_null(strstr(out, "host-only layers "));
	assert_non_null(strstr(out, "model: layer hscale runs on the host only (HPU_LAYER_HOST_ONLY: "
				    "the runtime stages its tensors in host memory)"));
	int steps = 0;
	for (const char *p = out; (p = strstr(p, "device cpu-strict copied ")); p++) {
		unsigned long long h, d, ph, pd;
		assert_int_equal(sscanf(p, "device cpu-strict copied %llu bytes host-to-device, "
					   "%llu bytes device-to-host; the plan: %llu and %llu",
					&h, &d, &ph, &pd), 4);
		printf("  host     step copies %llu and %llu, the plan %llu and %llu\n", h, d, ph, pd);
		assert_true(h == ph && d == pd);
		steps++;
	}
	assert_int_equal(steps, 4); /* 2 steps, 2 ranks */
	free(out);
	/* on cpu nothing is staged, and --verbose says so (it said "stages") */
	start(&r, 1);
	args(&r, "--device", "cpu", "--max-steps", "1", "--batch-size", "16", "--verbose", NULL);
	out = finish_with(&r, 0, m, NULL);
	assert_non_null(strstr(out, "model: layer hscale runs on the host only (HPU_LAYER_HOST_ONLY: "
				    "device cpu's memory is the host's, so nothing is staged)"));
	assert_null(strstr(out, "stages its tensors"));
	free(out);
	/* a host-only layer that hands its tensors to ops (hrelu: relu's
	 * forward and backward on its staged host copies): the kernel stops
	 * the worker naming the layer. It trained as on cpu, the mistake
	 * cpu-strict is for unseen until a GPU */
	char *model = strdup(h_build("lib/host_layer_model.so")); /* h_build's buffers rotate */
	setenv("HPU_STRICT_KERNELS", "1", 1);
	start(&r, 1);
	args(&r, "--device", "cpu-strict", "--max-steps", "2", "--batch-size", "16", NULL);
	out = finish_with(&r, 1, model, "--ops");
	unsetenv("HPU_STRICT_KERNELS");
	assert_non_null(strstr(out, "layer hrelu is host-only (HPU_LAYER_HOST_ONLY) and gave its "
				    "staged host copies to an op in its forward (the kernel eltwise_fwd, "
				    "its argument x: host memory at "));
	assert_non_null(strstr(out, "a host-only layer computes with its own loops"));
	/* and hpulaunch's closing error ends with it (it said only "exited
	 * with code 1": the check wrote stderr and left) */
	const char *closing = strstr(out, "hpulaunch: error: rank 0 ");
	assert_non_null(closing);
	assert_non_null(strstr(closing, "exited with code 1 in step 1 of "));
	assert_non_null(strstr(closing, ": layer hrelu is host-only"));
	free(out);
	/* on cpu the same model trains: nothing is staged there */
	start(&r, 1);
	args(&r, "--device", "cpu", "--max-steps", "2", "--batch-size", "16", NULL);
	free(finish_with(&r, 0, model, "--ops"));
	free(model);
}

/* A layer that leaves values it must write unwritten (hpu.h: a forward
 * writes its outputs, a backward each din it is given): on cpu they hold
 * another tensor's leftovers and the model trains on them in silence,
 * differently on each device; cpu-strict marks them before the call and
 * stops the worker naming the layer and the tensor. Staged (host-only)
 * and on device memory (any-device), forward and backward. */
static void test_unwritten_values(void **state)
{
	(void)state;
	char *model = strdup(h_build("lib/host_layer_model.so"));
	static const struct {
		const char *margs, *want;
	} cases[] = {
	    {"--no-din", "layer hscale2: its backward left 256 of the 256 values of din for s "
			 "unwritten: it writes every one"},
	    {"--no-din --any-device", "layer hscale2: its backward left 256 of the 256 values "
				      "of din for s unwritten"},
	    /* added to (+=): the marker comes back quieted, still found */
	    {"--add-din --any-device", "layer hscale2: its backward left 256 of the 256 values "
				       "of din for s unwritten"},
	    {"--half-out", "layer hscale2: its forward left 128 of the 256 values of its output "
			   "s2 unwritten"},
	    {"--half-out --any-device", "layer hscale2: its forward left 128 of the 256 values "
					"of its output s2 unwritten"},
	};
	run r;
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		start(&r, 1);
		args(&r, "--device", "cpu-strict", "--max-steps", "2", "--batch-size", "16",
		     "--no-eval", NULL);
		char *out = finish_with(&r, 1, model, cases[k].margs);
		printf("  %s: %s\n", cases[k].margs, strstr(out, "layer hscale2: its") ?: out);
		assert_non_null(strstr(out, cases[k].want));
		/* the closing error ends with it */
		const char *closing = strstr(out, "hpulaunch: error: rank 0 ");
		assert_non_null(closing);
		assert_non_null(strstr(closing, cases[k].want));
		free(out);
	}
	/* a write past every block (4 GiB past its output): named as such,
	 * in the layer's call (it said "outside a device call", with the
	 * kernels-only mode's hint), and the closing error ends with it */
	start(&r, 1);
	args(&r, "--device", "cpu-strict", "--max-steps", "2", "--batch-size", "16", "--no-eval",
	     NULL);
	char *out = finish_with(&r, 1, model, "--overrun --any-device");
	const char *want = "(past the end of every block in use: an overrun of a tensor?) in "
			   "layer hscale2's forward under --device cpu-strict";
	const char *at = strstr(out, "host code touched device memory at ");
	assert_non_null(at);
	void *addr = NULL;
	int end = -1;
	sscanf(at, "host code touched device memory at %p (past the end of every block in use: "
		   "an overrun of a tensor?) in layer hscale2's forward under --device "
		   "cpu-strict%n", &addr, &end);
	printf("  --overrun: %.*s\n", (int)strcspn(at, "\n"), at);
	assert_true(end > 0 && addr != NULL);
	assert_null(strstr(out, "outside a device call"));
	assert_null(strstr(out, "HPU_LAYER_HOST_ONLY?"));
	const char *closing = strstr(out, "hpulaunch: error: rank 0 ");
	assert_non_null(closing);
	assert_non_null(strstr(closing, want));
	free(out);
	/* on cpu nothing checks: the model trains (on leftovers) */
	start(&r, 1);
	args(&r, "--device", "cpu", "--max-steps", "2", "--batch-size", "16", "--no-eval", NULL);
	free(finish_with(&r, 0, model, "--no-din --any-device"));
	free(model);
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
		cmocka_unit_test(test_fused_attention),
		cmocka_unit_test(test_host_only_layers),
		cmocka_unit_test(test_unwritten_values),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
