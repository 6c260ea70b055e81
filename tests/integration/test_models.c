/* The example models through the real launcher, briefly: the CNN under
 * several strategies and precisions, the ResNet under two, the GPT LM
 * printing its validation loss and a generated sample (and trained on an
 * llm.c token file), and the MLP under
 * autocast lists. (Their full-length results are in bench/RESULTS.md.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/runlib.h"

static char *run_ok(char **argv)
{
	proc p;
	int code = h_run(&p, argv, NULL, 300000);
	if (code != 0)
		fail_msg("exit %d:\n%s", code, p.out);
	char *out = strdup(p.out);
	h_free(&p);
	return out;
}

/* 30 steps of the CNN on 2 workers trains (the loss falls) under ddp,
 * zero3 with activation checkpointing, and bf16-mixed. */
static void test_cnn(void **state)
{
	(void)state;
	const char *variants[][6] = {
		{"--strategy", "ddp", "--precision", "fp32", NULL},
		{"--strategy", "zero3", "--activation-checkpointing", NULL},
		{"--strategy", "zero2", "--precision", "bf16-mixed", NULL},
	};
	for (int v = 0; v < 3; v++) {
		char *argv[32];
		int n = 0;
		argv[n++] = (char *)LAUNCH;
		argv[n++] = "-q";
		argv[n++] = "--devices";
		argv[n++] = "2";
		argv[n++] = "--max-steps";
		argv[n++] = "30";
		argv[n++] = "--log-every";
		argv[n++] = "10";
		argv[n++] = "--no-eval";
		for (int k = 0; variants[v][k]; k++)
			argv[n++] = (char *)variants[v][k];
		argv[n++] = (char *)h_build("lib/fmnist_cnn.so");
		argv[n] = NULL;
		char *out = run_ok(argv);
		const char *a = strstr(out, "step 10/"), *b = strstr(out, "step 30/");
		assert_non_null(a);
		assert_non_null(b);
		double l10 = strtod(strstr(a, "loss ") + 5, NULL), l30 = strtod(strstr(b, "loss ") + 5, NULL);
		printf("  cnn %s %s: loss %.4f at step 10, %.4f at step 30\n", variants[v][0],
		       variants[v][1], l10, l30);
		assert_true(l30 < l10);
		free(out);
	}
}

/* The GPT LM trains a little: its after-evaluation hook prints the
 * validation loss, below the unigram baseline it printed at setup, and its
 * after-training hook a generated sample (every rank runs the forwards:
 * under zero3 they gather the parameters). */
static void test_gpt_lm(void **state)
{
	(void)state;
	const char *strategies[] = {"fast_ddp", "zero3"};
	for (int k = 0; k < 2; k++) {
		char *argv[] = {(char *)LAUNCH, "-q", "--devices", "2", "--strategy",
				(char *)strategies[k], "--batch-size", "32", "--max-steps", "60",
				"--lr", "3e-3", "--log-every", "20",
				(char *)h_build("lib/gpt_lm.so"), "--", "--gen", "120", NULL};
		char *out = run_ok(argv);
		const char *u = strstr(out, "unigram baseline ");
		const char *val = strstr(out, "test split's loss ");
		const char *sample = strstr(out, "sample (120 characters");
		assert_non_null(u);
		assert_non_null(val);
		assert_non_null(sample);
		double base = strtod(u + 17, NULL), loss = strtod(val + 18, NULL);
		printf("  gpt_lm %s: validation loss %.4f nats/char after 60 steps (unigram %.4f)\n"
		       "%.200s\n", strategies[k], loss, base, sample);
		assert_true(base > 3 && base < 4);
		assert_true(loss > 0 && loss < base);
		free(out);
	}
}

/* Writes an llm.c token file (GPT-2's: magic 20240520, version 1, the
 * count, then uint16 tokens) of n tokens repeating a 12-token pattern;
 * `cut` bytes short of whole. */
static void token_file(const char *path, int n, int cut)
{
	static const uint16_t pattern[12] = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 32};
	int32_t head[256] = {20240520, 1, n};
	uint16_t *tok = malloc((size_t)n * sizeof *tok);
	assert_non_null(tok);
	for (int i = 0; i < n; i++)
		tok[i] = pattern[i % 12];
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(head, sizeof head, 1, f), 1);
	assert_int_equal(fwrite(tok, 1, (size_t)n * sizeof *tok - (size_t)cut, f),
			 (size_t)n * sizeof *tok - (size_t)cut);
	assert_int_equal(fclose(f), 0);
	free(tok);
}

/* gpt_lm --tokens FILE --vocab N: 40 steps on an llm.c token file of a
 * repeating pattern bring the validation loss far below the uniform
 * guess's log(40); a token not below --vocab, and a truncated file, are
 * refused naming the file. */
static void test_gpt_lm_tokens(void **state)
{
	(void)state;
	char path[96];
	snprintf(path, sizeof path, "/tmp/hpu-models-%d-tok.bin", (int)getpid());
	token_file(path, 3000, 0);
	const char *vocab[3] = {"40", "30", "40"};
	for (int k = 0; k < 3; k++) {
		if (k == 2)
			token_file(path, 3000, 7);
		char *argv[] = {(char *)LAUNCH, "-q", "--devices", "1", "--batch-size", "32",
				"--max-steps", "40", "--lr", "3e-3", "--log-every", "20",
				(char *)h_build("lib/gpt_lm.so"), "--", "--tokens", path, "--vocab",
				(char *)vocab[k], "--ctx", "16", "--dim", "32", "--heads", "2",
				"--layers", "1", "--dropout", "0", NULL};
		proc p;
		int code = h_run(&p, argv, NULL, 300000);
		char want[200];
		if (k == 0) {
			snprintf(want, sizeof want, "gpt_lm: 3000 tokens from %s (u16), vocabulary 40",
				 path);
			if (code != 0 || !strstr(p.out, want) || !strstr(p.out, "test split's loss "))
				fail_msg("exit %d, no \"%s\" or no validation loss:\n%s", code, want,
					 p.out);
			double loss = strtod(strstr(p.out, "test split's loss ") + 18, NULL);
			printf("  gpt_lm --tokens: validation loss %.4f nats/token after 40 steps "
			       "(uniform %.4f)\n", loss, log(40.0));
			assert_true(loss > 0 && loss < log(40.0) - 1);
		} else {
			snprintf(want, sizeof want, k == 1 ? "--tokens %s: token 35 at position 6 is "
							     "not below --vocab 30"
							   : "%s: truncated", path);
			if (code != 1 || !strstr(p.out, want))
				fail_msg("exit %d (want 1), no \"%s\" in:\n%s", code, want, p.out);
		}
		h_free(&p);
	}
	/* refused at setup: a fraction where a whole number goes (--ctx
	 * 16.5 trained at 16), --data beside --tokens (it was left unread
	 * without a word), a directory (it was "truncated: 0 bytes") and a
	 * FIFO (opening it waited for ever) as --tokens */
	char fifo[96];
	snprintf(fifo, sizeof fifo, "/tmp/hpu-models-%d-fifo", (int)getpid());
	assert_int_equal(mkfifo(fifo, 0600), 0);
	/* and: --ctx 0x10 (strtod took it for 16), --tokens followed by
	 * another argument (it took "--ctx" as the file, then "16" was
	 * unknown), a file too short for --ctx named with the tokens it needs */
	char few[96], want_few[200];
	snprintf(few, sizeof few, "/tmp/hpu-models-%d-few.bin", (int)getpid());
	token_file(few, 50, 0);
	snprintf(want_few, sizeof want_few, "the token file %s (50 tokens) is too small for --ctx "
		 "16: it needs at least 170 tokens", few);
	const char *bad[][4] = {
		{path, "--ctx", "16.5", "--ctx wants a whole number in 1..4096, got 16.5"},
		{path, "--data", "/tmp", "--data /tmp and --tokens "},
		{"/tmp", "--ctx", "16", "--tokens: cannot open /tmp: Is a directory"},
		{fifo, "--ctx", "16", "is not a regular file but a FIFO (pipe)"},
		{path, "--ctx", "0x10", "--ctx wants a whole number in 1..4096, got 0x10"},
		{"--ctx", "16", "--layers",
		 "--tokens needs a value (the next argument, --ctx, is one of the model's arguments)"},
		{few, "--ctx", "16", want_few}};
	for (int k = 0; k < 7; k++) {
		char *argv[] = {(char *)LAUNCH, "-q", "--devices", "1", "--max-steps", "1",
				(char *)h_build("lib/gpt_lm.so"), "--", "--tokens",
				(char *)bad[k][0], (char *)bad[k][1], (char *)bad[k][2], NULL};
		proc p;
		int code = h_run(&p, argv, NULL, 120000);
		if (code != 1 || !strstr(p.out, bad[k][3]))
			fail_msg("exit %d (want 1), no \"%s\" in:\n%s", code, bad[k][3], p.out);
		h_free(&p);
	}
	unlink(fifo);
	unlink(few);
	unlink(path);
}

/* A few steps of the ResNet (batch norm's running statistics, projection
 * shortcuts) under ddp and under zero3 with activation checkpointing
 * (batch norm recomputed): the loss falls. */
static void test_resnet(void **state)
{
	(void)state;
	const char *variants[][3] = {
		{"--strategy", "ddp", NULL},
		{"--strategy", "zero3", "--activation-checkpointing"},
	};
	for (int v = 0; v < 2; v++) {
		char *argv[32];
		int n = 0;
		const char *fixed[] = {LAUNCH, "-q", "--devices", "2", "--batch-size", "64",
				       "--max-steps", "24", "--lr", "3e-3", "--log-every", "4",
				       "--no-eval", NULL};
		for (int k = 0; fixed[k]; k++)
			argv[n++] = (char *)fixed[k];
		for (int k = 0; k < 3 && variants[v][k]; k++)
			argv[n++] = (char *)variants[v][k];
		argv[n++] = (char *)h_build("lib/resnet.so");
		const char *model[] = {"--", "--width", "8", "--blocks", "1", NULL};
		for (int k = 0; model[k]; k++)
			argv[n++] = (char *)model[k];
		argv[n] = NULL;
		char *out = run_ok(argv);
		const char *a = strstr(out, "step 4/"), *b = strstr(out, "step 24/");
		assert_non_null(a);
		assert_non_null(b);
		double l4 = strtod(strstr(a, "loss ") + 5, NULL);
		double l24 = strtod(strstr(b, "loss ") + 5, NULL);
		printf("  resnet %s%s: loss %.4f at step 4, %.4f at step 24\n", variants[v][1],
		       variants[v][2] ? " (activation checkpointing)" : "", l4, l24);
		assert_true(l24 < l4);
		free(out);
	}
}

/* The count `kind` ("low" or "fp32") of op in the final metrics record's
 * autocast object, -1 when absent. */
static long autocast_count(const char *metrics, const char *op, const char *kind)
{
	const char *fin = strstr(metrics, "\"final\":true");
	const char *ac = fin ? strstr(fin, "\"autocast\":{") : NULL;
	char key[64];
	snprintf(key, sizeof key, "\"%s\":{", op);
	const char *o = ac ? strstr(ac, key) : NULL;
	if (o == NULL)
		return -1;
	const char *end = strchr(o, '}');
	snprintf(key, sizeof key, "\"%s\":", kind);
	const char *k = strstr(o, key);
	return k && k < end ? strtol(k + strlen(key), NULL, 10) : -1;
}

/* Writes text to path. */
static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* The MLP for 5 steps in bf16-mixed with env; returns the exit code and
 * the output (*out) and metrics text (*metrics, NULL if none). */
static int mlp_autocast(char *env0, char **out, char **metrics)
{
	char mpath[64];
	snprintf(mpath, sizeof mpath, "/tmp/hpu-ac-%d.jsonl", (int)getpid());
	unlink(mpath);
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "2", "--max-steps", "5",
			"--log-every", "0", "--no-eval", "--precision", "bf16-mixed",
			"--verbose", "--metrics", mpath,
			(char *)h_build("lib/fmnist_mlp.so"), NULL};
	char *env[] = {env0, NULL};
	proc p;
	int code = h_run(&p, argv, env, 300000);
	*out = strdup(p.out);
	h_free(&p);
	*metrics = h_slurp(mpath);
	unlink(mpath);
	return code;
}

/* Autocast through the launcher: LOWER_LIST moves relu into bf16 (the
 * final record counts low relu and linear calls), FP32_LIST keeps linear
 * in fp32, and PyTorch's names work through Optimum Habana's variable. */
static void test_autocast_lists(void **state)
{
	(void)state;
	char lower[64], fp32[64], bad[64], e1[96], e2[96], e3[128], *out, *m;
	snprintf(lower, sizeof lower, "/tmp/hpu-ac-lower-%d.txt", (int)getpid());
	snprintf(fp32, sizeof fp32, "/tmp/hpu-ac-fp32-%d.txt", (int)getpid());
	snprintf(bad, sizeof bad, "/tmp/hpu-ac-bad-%d.txt", (int)getpid());
	put(lower, "# relu in bf16 too\nrelu\n# and the cross-entropy (its layer took no list)\nsoftmax_xent\n");
	put(fp32, "linear\n");
	put(bad, "aten::relu_\nlineer\n");

	snprintf(e1, sizeof e1, "LOWER_LIST=%s", lower);
	int code = mlp_autocast(e1, &out, &m);
	if (code != 0)
		fail_msg("exit %d:\n%s", code, out);
	assert_non_null(m);
	assert_non_null(strstr(out, "autocast: lower list: linear matmul bmm conv2d relu softmax_xent attention"));
	long relu_low = autocast_count(m, "relu", "low"), lin_low = autocast_count(m, "linear", "low");
	long xent_low = autocast_count(m, "softmax_xent", "low");
	printf("  LOWER_LIST relu softmax_xent: relu low %ld, linear low %ld, softmax_xent low %ld\n",
	       relu_low, lin_low, xent_low);
	assert_true(relu_low > 0 && lin_low > 0 && xent_low > 0);
	assert_int_equal(autocast_count(m, "relu", "fp32"), 0);
	assert_int_equal(autocast_count(m, "softmax_xent", "fp32"), 0);
	free(out), free(m);

	snprintf(e2, sizeof e2, "FP32_LIST=%s", fp32);
	code = mlp_autocast(e2, &out, &m);
	if (code != 0)
		fail_msg("exit %d:\n%s", code, out);
	assert_non_null(m);
	lin_low = autocast_count(m, "linear", "low");
	long lin_fp32 = autocast_count(m, "linear", "fp32");
	printf("  FP32_LIST linear: linear low %ld, fp32 %ld\n", lin_low, lin_fp32);
	assert_int_equal(lin_low, 0);
	assert_true(lin_fp32 > 0);
	free(out), free(m);

	/* PyTorch's names through the variable Optimum Habana sets: relu_
	 * (in place) is relu; a name that means nothing here is a warning
	 * from rank 0, and the job trains */
	snprintf(e3, sizeof e3, "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST=%s", bad);
	code = mlp_autocast(e3, &out, &m);
	printf("  PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST aten::relu_, lineer: exit %d\n", code);
	if (code != 0)
		fail_msg("exit %d:\n%s", code, out);
	assert_true(autocast_count(m, "relu", "low") > 0);
	char want[256];
	snprintf(want, sizeof want,
		 "[rank 0] warning: PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST file %s: 1 name means "
		 "no op here and is ignored: 'lineer' (did you mean 'linear'?)",
		 bad);
	const char *w = strstr(out, want);
	assert_non_null(w);
	assert_null(strstr(w + strlen(want), "is ignored")); /* once, not once per rank */
	free(out), free(m);
	unlink(lower), unlink(fp32), unlink(bad);
}

/* The last metrics record's number after `key` for rank 0 (-1 if none). */
static double metric(const char *m, const char *key)
{
	const char *last = m, *nl;
	while ((nl = strchr(last, '\n')) && nl[1])
		last = nl + 1;
	const char *k = strstr(last, key);
	return k ? strtod(k + strlen(key), NULL) : -1;
}

/* The MLP, 1 worker, 2 steps at batch B in precision prec with extra
 * environment env0 (may be NULL); returns the output; the last metrics
 * record in *metrics. */
static char *mlp_run(const char *prec, const char *batch, const char *model_args,
		     char *env0, char **metrics)
{
	char mpath[64];
	snprintf(mpath, sizeof mpath, "/tmp/hpu-mem-%d.jsonl", (int)getpid());
	unlink(mpath);
	char *argv[24];
	int n = 0;
	const char *fixed[] = {LAUNCH, "--devices", "1", "--max-steps", "2", "--log-every", "1",
			       "--no-eval", "--verbose", "--precision", prec, "--batch-size",
			       batch, "--metrics", mpath, h_build("lib/fmnist_mlp.so"), "--",
			       NULL};
	for (int i = 0; fixed[i]; i++)
		argv[n++] = (char *)fixed[i];
	char *margs = strdup(model_args);
	for (char *t = strtok(margs, " "); t; t = strtok(NULL, " "))
		argv[n++] = t;
	argv[n] = NULL;
	char *env[] = {env0, NULL};
	proc p;
	int code = h_run(&p, argv, env0 ? env : NULL, 300000);
	if (code != 0)
		fail_msg("exit %d:\n%s", code, p.out);
	char *out = strdup(p.out);
	h_free(&p);
	free(margs);
	*metrics = h_slurp(mpath);
	assert_non_null(*metrics);
	unlink(mpath);
	return out;
}

/* Only what a backward reads is kept for it (hpu_layer_backward_reads),
 * and bf16-mixed keeps it in bf16: on a deep MLP at a large batch
 * (activations dominate), the linear layers' outputs (read only by the
 * ReLUs, whose backward reads their own output) are not kept at all, and
 * bf16-mixed's kept activations take half the bytes of fp32's, plus one
 * layer's fp32 output in use at a time.
 *
 * What the runtime allocates as activations (DeviceStats' "acts" kind;
 * worker/strategy/strategy_act.c), per sample of the micro-batch B, for
 * fmnist_mlp's graph "image" [784] -> DEPTH x (fc [H], relu [H]) -> fc
 * "logits" [10]; the library's cross-entropy of "logits" against the
 * dataset's "label" -> "loss" [] (the accuracy layer's "correct" is
 * evaluation's only):
 *  - the outputs a backward reads: the ReLUs' (relu's and the next
 *    linear's backward read them), the logits (the cross-entropy's) and
 *    the loss (read after forward), kept from forward to the next step
 *    (no checkpointing), but for the logits: the cross-entropy's backward
 *    writes their gradient over them (hpu_layer_backward_in_place), which
 *    goes after the head's backward, before the peak below. So DEPTH H + 1
 *    values at the peak; each linear's hidden
 *    output is freed once its ReLU ran (only one at a time, while the
 *    ReLUs' outputs are not all there yet, or in backward's place); the
 *    dataset fields "image" and "label" are the batch's, not activations;
 *  - the layers' saved memory (hpu_layer_memory): the cross-entropy keeps
 *    each position's log-sum-exp, 1 float (the library's linear and relu
 *    keep none);
 *  - no scratch (none of the layers asks for any);
 *  - gradients of tensors, in backward: a layer's output gradient and its
 *    input's, freed once the producer's backward ran, so at most two
 *    [H] gradients at a time, 2 H floats ("image" needs no gradient).
 * Under bf16-mixed a kept output is stored in bf16 once its last reader
 * ran (the ReLUs' outputs, on the bf16 grid; the logits stay fp32, read
 * by the first backward only, and are gone as above); the loss
 * tensor and the saved log-sum-exp stay 4 bytes; backward expands a ReLU's
 * output back to fp32 for the linear above it and the ReLU's backward (up
 * to H floats live; the linear outputs are not expanded: no backward
 * reads them). */
static void test_bf16_activation_memory(void **state)
{
	(void)state;
	enum { B = 4096, H = 256, DEPTH = 24 };
	char margs[64], batch[16];
	snprintf(margs, sizeof margs, "--hidden %d --depth %d", H, DEPTH);
	snprintf(batch, sizeof batch, "%d", B);
	char *m32, *m16;
	free(mlp_run("fp32", batch, margs, NULL, &m32));
	char *out = mlp_run("bf16-mixed", batch, margs, NULL, &m16);
	double dgrad = 2.0 * B * H * 4;
	double a32 = metric(m32, "\"max_acts\":") - dgrad;
	double a16 = metric(m16, "\"max_acts\":") - dgrad;
	double want32 = (double)DEPTH * B * H * 4 + (double)B * 2 * 4;
	double half = (double)DEPTH * B * H * 2 + (double)B * 2 * 4;
	double live = (double)B * H * 4;
	double in32 = metric(m32, "\"MaxInUse\":"), in16 = metric(m16, "\"MaxInUse\":");
	printf("  kept activations: fp32 %.1f MiB, bf16-mixed %.1f MiB (ratio %.3f); "
	       "MaxInUse %.1f -> %.1f MiB (ratio %.3f)\n",
	       a32 / 1048576, a16 / 1048576, a16 / a32, in32 / 1048576, in16 / 1048576,
	       in16 / in32);
	printf("  fp32 %.0f bytes (want %.0f); bf16-mixed %.0f in [%.0f, %.0f]\n", a32, want32, a16,
	       half, half + live);
	assert_true(a32 == want32);
	assert_true(a16 >= half && a16 <= half + live);
	/* the whole device memory gains what the activations gain, less
	 * bf16-mixed's other states (its 16-bit weights and gradients) */
	assert_true(in16 < in32 - 0.75 * (a32 - a16));
	free(m32), free(m16), free(out);
}

/* A language model's logits are its largest activation: [B, T, V] fp32.
 * The cross-entropy writes their gradient over them
 * (hpu_layer_backward_in_place; nothing reads them after its backward),
 * and under bf16-mixed they stay fp32 between forward and the loss's
 * backward (no layer with a backward runs in between: a bf16 copy would
 * be expanded again at once). So the activations' peak holds the logits'
 * bytes once, not twice (fp32: logits and their gradient) or two and a
 * half times (bf16-mixed: and their bf16 copy), on gpt_lm with a vocabulary
 * so wide that everything else is small beside the logits. HPU_MEMORY_PEAK
 * names what was live at the peak: the logits, not their gradient; its
 * InUse is DeviceStats' MaxInUse. */
static void test_logits_memory(void **state)
{
	(void)state;
	enum { B = 16, T = 32, V = 8192 };
	char tok[96], dir[96], mpath[96], file[160];
	snprintf(tok, sizeof tok, "/tmp/hpu-models-%d-ltok.bin", (int)getpid());
	snprintf(dir, sizeof dir, "/tmp/hpu-models-%d-peak", (int)getpid());
	snprintf(mpath, sizeof mpath, "/tmp/hpu-models-%d-lmem.jsonl", (int)getpid());
	snprintf(file, sizeof file, "%s/memory-peak-rank0.txt", dir);
	token_file(tok, 3000, 0);
	const double logits = (double)B * T * V * 4;
	const char *precs[2] = {"fp32", "bf16-mixed"};
	for (int k = 0; k < 2; k++) {
		unlink(mpath), unlink(file), rmdir(dir);
		char env0[128];
		snprintf(env0, sizeof env0, "HPU_MEMORY_PEAK=%s", dir);
		char *env[] = {env0, NULL};
		char *argv[] = {(char *)LAUNCH, "-q", "--devices", "1", "--batch-size", "16",
				"--max-steps", "2", "--no-eval", "--precision", (char *)precs[k],
				"--metrics", mpath, (char *)h_build("lib/gpt_lm.so"), "--",
				"--tokens", tok, "--vocab", "8192", "--ctx", "32", "--dim", "16",
				"--heads", "1", "--layers", "1", "--dropout", "0", NULL};
		proc p;
		int code = h_run(&p, argv, env, 300000);
		if (code != 0)
			fail_msg("exit %d:\n%s", code, p.out);
		h_free(&p);
		char *m = h_slurp(mpath), *rep = h_slurp(file);
		assert_non_null(m);
		if (!rep)
			fail_msg("no %s", file);
		double acts = metric(m, "\"max_acts\":"), in_use = metric(m, "\"MaxInUse\":");
		printf("  %s: activations' peak %.2f MiB, the logits %.2f MiB (%.3fx)\n", precs[k],
		       acts / 1048576, logits / 1048576, acts / logits);
		assert_true(acts >= logits && acts < 1.25 * logits);
		const char *at = strstr(rep, "device memory at its peak, InUse ");
		assert_non_null(at);
		at = strchr(at, '(');
		assert_non_null(at);
		assert_true(strtod(at + 1, NULL) == in_use);
		if (!strstr(rep, " acts   activations logits\n") || strstr(rep, "gradient of logits") ||
		    strstr(rep, "bf16 activations logits"))
			fail_msg("the peak's blocks, want the logits alone:\n%s", rep);
		free(m), free(rep);
	}
	unlink(mpath), unlink(file), rmdir(dir), unlink(tok);
}

/* inplace_model (tests/fixtures/inplace_model.c) for 3 steps at batch 16
 * (2 micro-steps each) in `prec` with `margs` (at most 2), its
 * parameters saved to `path`; the output. */
static char *inplace_run(const char *prec, const char *a1, const char *a2, const char *path)
{
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "1", "--batch-size", "16",
			"--grad-accum", "2", "--max-steps", "3", "--no-eval",
			"--precision", (char *)prec, "--save-params", (char *)path,
			(char *)h_build("lib/inplace_model.so"), "--", (char *)a1, (char *)a2, NULL};
	return run_ok(argv);
}

/* hpu_layer_backward_in_place: the runtime hands a custom loss the same
 * memory for its input and that input's gradient where nothing reads the
 * input after its backward (fp32 and bf16-mixed, every micro-step), and
 * the parameters come out as those of the same loss not declaring it, bit
 * for bit. Not where the input's producer reads its output in backward,
 * nor where a second loss reads the input too (its backward runs first;
 * the first reads the input after it), nor where a checkpointed layer
 * reads it in forward (run again after; its backward reads nothing). */
static void test_backward_in_place(void **state)
{
	(void)state;
	char pa[96], pb[96];
	snprintf(pa, sizeof pa, "/tmp/hpu-models-%d-inplace-a.bin", (int)getpid());
	snprintf(pb, sizeof pb, "/tmp/hpu-models-%d-inplace-b.bin", (int)getpid());
	static const struct {
		const char *prec, *arg, *want;
	} cases[] = {
		{"fp32", NULL, "sq: in place 6 of 6 backwards\n"},
		{"bf16-mixed", NULL, "sq: in place 6 of 6 backwards\n"},
		{"fp32", "--producer-reads", "sq: in place 0 of 6 backwards\n"},
		{"fp32", "--second", "sq: in place 0 of 6 backwards\n[rank 0] sq2: in place 0 of 6 backwards\n"},
		{"fp32", "--recomputed", "sq: in place 0 of 6 backwards\n"},
	};
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
		char *with = inplace_run(cases[k].prec, cases[k].arg, NULL, pa);
		char *apart = inplace_run(cases[k].prec, cases[k].arg ? cases[k].arg : "--apart",
					  cases[k].arg ? "--apart" : NULL, pb);
		printf("  %s %s: %s", cases[k].prec, cases[k].arg ? cases[k].arg : "", with);
		if (!strstr(with, cases[k].want))
			fail_msg("want \"%s\" in:\n%s", cases[k].want, with);
		assert_non_null(strstr(apart, "sq: in place 0 of 6 backwards\n"));
		size_t na, nb;
		char *a = h_slurp_n(pa, &na), *b = h_slurp_n(pb, &nb);
		assert_non_null(a);
		assert_non_null(b);
		assert_true(na == nb && na > 0 && memcmp(a, b, na) == 0);
		free(a), free(b), free(with), free(apart);
	}
	unlink(pa), unlink(pb);
}

/* hpu_layer_backward_reads_linear: under bf16-mixed a tensor whose only
 * backward reader reads it as the linear op's x (inplace_model --linear: a
 * GELU's output, off the bf16 grid, read by a custom linear layer) is kept
 * as its bf16 rounding ("bf16 activations g" at the memory's peak), and
 * the parameters come out as where the layer does not say it (the
 * tensor kept in fp32, "activations g"), bit for bit: the products round
 * it to bf16 either way. In fp32 it stays fp32. */
static void test_backward_reads_linear(void **state)
{
	(void)state;
	char pa[96], pb[96], dir[96], file[160], env0[128];
	snprintf(pa, sizeof pa, "/tmp/hpu-models-%d-lin-a.bin", (int)getpid());
	snprintf(pb, sizeof pb, "/tmp/hpu-models-%d-lin-b.bin", (int)getpid());
	snprintf(dir, sizeof dir, "/tmp/hpu-models-%d-linpeak", (int)getpid());
	snprintf(file, sizeof file, "%s/memory-peak-rank0.txt", dir);
	snprintf(env0, sizeof env0, "HPU_MEMORY_PEAK=%s", dir);
	char *env[] = {env0, NULL};
	static const struct {
		const char *prec, *apart, *want;
	} runs[] = {
		{"bf16-mixed", NULL, "  acts   bf16 activations g\n"},
		{"bf16-mixed", "--apart", "  acts   activations g\n"},
		{"fp32", NULL, "  acts   activations g\n"},
	};
	for (int k = 0; k < 3; k++) {
		char *argv[] = {(char *)LAUNCH, k ? "-q" : "--verbose", "--devices", "1",
				"--batch-size", "16", "--max-steps", "3", "--no-eval", "--precision",
				(char *)runs[k].prec, "--save-params", k == 1 ? pb : pa,
				(char *)h_build("lib/inplace_model.so"), "--", "--linear",
				(char *)runs[k].apart, NULL};
		proc p;
		int code = h_run(&p, argv, env, 300000);
		if (code != 0)
			fail_msg("exit %d:\n%s", code, p.out);
		/* --verbose says how the activations are kept: g and the
		 * flattened image (fc1's x) rounded */
		if (k == 0 && (!strstr(p.out, "; 2 as their bf16 rounding (read as linear products' "
					      "x); ") ||
			       !strstr(p.out, "  sq's backward writes the gradient of y over it\n")))
			fail_msg("--verbose does not say how the activations are kept:\n%s", p.out);
		h_free(&p);
		char *rep = h_slurp(file);
		if (!rep || !strstr(rep, runs[k].want) ||
		    (k != 0 && strstr(rep, "bf16 activations g\n")))
			fail_msg("%s %s: want \"%s\" at the peak:\n%s", runs[k].prec,
				 runs[k].apart ? runs[k].apart : "", runs[k].want, rep ? rep : "(none)");
		printf("  %s %s: the GELU's output kept as \"%s\"\n", runs[k].prec,
		       runs[k].apart ? runs[k].apart : "(declared)",
		       strstr(runs[k].want, "bf16") ? "bf16 activations g" : "activations g");
		free(rep);
		unlink(file);
		if (k != 1)
			continue;
		size_t na, nb;
		char *a = h_slurp_n(pa, &na), *b = h_slurp_n(pb, &nb);
		assert_non_null(a);
		assert_non_null(b);
		assert_true(na == nb && na > 0 && memcmp(a, b, na) == 0);
		free(a), free(b);
	}
	rmdir(dir), unlink(pa), unlink(pb);
}

/* A CPU without bf16 instructions (oneDNN held to avx512_core) still runs
 * bf16-mixed, says so, and trains to the same losses up to the fp32
 * summation order. */
static void test_no_bf16_isa(void **state)
{
	(void)state;
	char *m1, *m2;
	char *native = mlp_run("bf16-mixed", "256", "", NULL, &m1);
	char *emul = mlp_run("bf16-mixed", "256", "", "ONEDNN_MAX_CPU_ISA=AVX512_CORE", &m2);
	assert_non_null(strstr(native, "kernels: oneDNN"));
	if (!strstr(native, "bf16 products native")) /* a CPU without avx512_bf16 */
		printf("  this CPU has no bf16 instructions: both runs emulate\n");
	assert_non_null(strstr(emul, "ISA avx512_core,"));
	assert_non_null(strstr(emul, "bf16 products emulated (this CPU has no bf16 instructions)"));
	double l1 = strtod(strstr(strstr(native, "step 2/"), "loss ") + 5, NULL);
	double l2 = strtod(strstr(strstr(emul, "step 2/"), "loss ") + 5, NULL);
	printf("  step-2 loss: native bf16 %.5f, emulated %.5f\n", l1, l2);
	assert_true(l1 > 0 && fabs(l1 - l2) <= 2e-3 * l1);
	free(native), free(emul), free(m1), free(m2);
}

/* 20 AdamW steps of the MLP in bf16-mixed with `backend` (HPU_BACKEND),
 * saving the parameters to `path`; the output. */
static char *bf16_run(const char *backend, const char *path)
{
	run r;
	setenv("HPU_BACKEND", backend, 1);
	start(&r, 1);
	args(&r, "--precision", "bf16-mixed", "--max-steps", "20", "--optimizer", "adamw",
	     "--save-params", path, NULL);
	char *out = finish(&r, 0, NULL);
	unsetenv("HPU_BACKEND");
	return out;
}

/* The reference kernels' bf16 products are fp32 products of the
 * bf16-rounded values: their note says the results come close to bf16
 * kernels' without being the same (another summation order; a sum near a
 * bf16 rounding boundary rounds the other way and trains on), and so
 * they do: against oneDNN's after 20 steps the parameters differ, by
 * under 0.05 relative L2 (measured: 7e-3 on avx512_bf16). */
static void test_reference_bf16_note(void **state)
{
	(void)state;
	char a[64], b[64];
	snprintf(a, sizeof a, "/tmp/hpu-refnote-%d-dnnl.bin", (int)getpid());
	snprintf(b, sizeof b, "/tmp/hpu-refnote-%d-ref.bin", (int)getpid());
	char *dnnl = bf16_run("onednn", a), *ref = bf16_run("reference", b);
	size_t na, nb;
	float *pa = load_params(a, &na), *pb = load_params(b, &nb);
	unlink(a);
	unlink(b);
	assert_int_equal(na, nb);
	double dd = 0, aa = 0;
	for (size_t i = 0; i < na; i++) {
		dd += ((double)pa[i] - pb[i]) * ((double)pa[i] - pb[i]);
		aa += (double)pa[i] * pa[i];
	}
	double l2 = sqrt(dd / aa);
	printf("  %s  parameters after 20 steps, reference against oneDNN: relative L2 %.3g\n",
	       ref, l2);
	assert_non_null(strstr(ref, "kernels: reference kernels (plain C and OpenBLAS sgemm, fp32): "
				    "bf16 products run as fp32 products of bf16-rounded values, "
				    "without the speed-up: close to bf16 kernels' results, not the "
				    "same (the sums run in another order)"));
	assert_true(l2 > 0 && l2 < 0.05);
	free(pa), free(pb), free(dnnl), free(ref);
}

/* --kernel-threads N gives each worker N kernel threads (its --verbose
 * line says so) and trains; 0 is refused with the option named. */
static void test_kernel_threads(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "--devices", "1", "--max-steps", "2", "--log-every", "1",
			"--no-eval", "--verbose", "--precision", "bf16-mixed",
			"--kernel-threads", "2", (char *)h_build("lib/fmnist_mlp.so"), NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	if (code != 0)
		fail_msg("exit %d:\n%s", code, p.out);
	assert_non_null(strstr(p.out, ", 2 threads"));
	assert_non_null(strstr(p.out, "step 2/2 loss"));
	h_free(&p);
	argv[12] = "0";
	code = h_run(&p, argv, NULL, 120000);
	printf("  --kernel-threads 0: exit %d: %s", code, p.out);
	assert_int_equal(code, 2);
	assert_non_null(strstr(p.out, "--kernel-threads"));
	h_free(&p);
}

/* The MLP example takes a model author's arguments only: the fault knobs
 * of the tests (tests/fixtures/fault_mlp.c's) are refused at setup, the
 * message naming the arguments it does take and no testing ones. */
static void test_mlp_arguments(void **state)
{
	(void)state;
	static const char *const knobs[][2] = {
		{"--sleep-rank", "0"}, {"--exit-at", "3"}, {"--print-lines", "1"}};
	for (int k = 0; k < 3; k++) {
		char *argv[] = {(char *)LAUNCH, "--devices", "1", "--max-steps", "1",
				"--no-eval", (char *)h_build("lib/fmnist_mlp.so"), "--",
				(char *)knobs[k][0], (char *)knobs[k][1], NULL};
		proc p;
		int code = h_run(&p, argv, NULL, 120000);
		char want[200];
		snprintf(want, sizeof want,
			 "setup failed: unknown model argument %s (model arguments: --data DIR, "
			 "--hidden N, --depth N, --checkpoint)\n",
			 knobs[k][0]);
		if (code != 1 || !strstr(p.out, want))
			fail_msg("%s: exit %d, wanted '%s' in:\n%s", knobs[k][0], code, want, p.out);
		h_free(&p);
	}
	/* an argument it takes, given last without its value, is said so (it
	 * was "unknown"); the CNN's too; and given before another of its
	 * arguments (that was taken as its value: "--data --hidden 16" read
	 * the directory "--hidden", then "16" was unknown) */
	static const char *const last[][4] = {
		{"lib/fmnist_mlp.so", "--hidden", NULL, "--hidden needs a value (--hidden N)"},
		{"lib/fmnist_cnn.so", "--channels", NULL, "--channels needs a value (--channels C1,C2)"},
		{"lib/resnet.so", "--blocks", NULL, "--blocks needs a value (--blocks N)"},
		{"lib/fmnist_mlp.so", "--data", "--hidden",
		 "--data needs a value (the next argument, --hidden, is one of the model's arguments)"}};
	for (int k = 0; k < 4; k++) {
		char *argv[] = {(char *)LAUNCH, "--devices", "1", "--max-steps", "1", "--no-eval",
				(char *)h_build(last[k][0]), "--", (char *)last[k][1],
				(char *)last[k][2], last[k][2] ? "16" : NULL, NULL};
		proc p;
		int code = h_run(&p, argv, NULL, 120000);
		if (code != 1 || !strstr(p.out, last[k][3]))
			fail_msg("%s: exit %d, wanted '%s' in:\n%s", last[k][1], code, last[k][3], p.out);
		h_free(&p);
	}
}

/* gpt_lm --prompt "" (or a prompt of no character of the text): the
 * sample starts from the vocabulary's first character, and says so (it
 * was printed as the prompt, "\t"; then called the text's first
 * character, which it is not). A prompt with a newline is escaped in the
 * sample's header (it split the line), and the sample options with
 * nothing to sample are refused (taken in silence). */
static void test_gpt_lm_prompt(void **state)
{
	(void)state;
	static const char *const prompt[2][2] = {{"", "as the prompt is empty"},
						 {"\x01\x02", "as the prompt has no character of the text"}};
	for (int k = 0; k < 2; k++) {
		char *argv[] = {(char *)LAUNCH, "-q", "--devices", "1", "--max-steps", "1", "--no-eval",
				(char *)h_build("lib/gpt_lm.so"), "--", "--gen", "5", "--prompt",
				(char *)prompt[k][0], NULL};
		char *out = run_ok(argv);
		const char *line = strstr(out, "sample (5 characters after \"");
		if (!line || !strstr(line, prompt[k][1]) ||
		    !strstr(line, "the vocabulary's first character"))
			fail_msg("no \"sample (5 characters after ... %s\" in:\n%s", prompt[k][1], out);
		free(out);
	}
	char *nl[] = {(char *)LAUNCH, "-q", "--devices", "1", "--max-steps", "1", "--no-eval",
		      (char *)h_build("lib/gpt_lm.so"), "--", "--gen", "5", "--prompt", "Th\ne", NULL};
	char *out = run_ok(nl);
	if (!strstr(out, "sample (5 characters after the prompt \"Th\\ne\", temperature 0.8):\n"))
		fail_msg("the prompt's newline is not escaped in:\n%s", out);
	free(out);
	char *unused[] = {(char *)LAUNCH, "-q", "--devices", "1", "--max-steps", "1", "--no-eval",
			  (char *)h_build("lib/gpt_lm.so"), "--", "--gen", "0", "--temperature", "0",
			  NULL};
	proc p;
	int code = h_run(&p, unused, NULL, 120000);
	printf("--gen 0 --temperature 0: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "--temperature: --gen 0 generates no sample; leave it out"));
	h_free(&p);
	/* a sample's bytes outside whole UTF-8 characters are escaped: a
	 * corpus of 0x90 (a C1 control, DCS, that went out raw) and 'a' */
	char dir[256], corpus[300], text[2001];
	h_scratch_dir(dir, sizeof dir);
	snprintf(corpus, sizeof corpus, "%s/corpus", dir);
	for (int i = 0; i < 2000; i++)
		text[i] = i % 3 ? (char)0x90 : 'a';
	text[2000] = 0;
	assert_int_equal(h_write_file(corpus, text, 0644), 0);
	char *c1[] = {(char *)LAUNCH, "-q", "--devices", "1", "--max-steps", "2", "--no-eval",
		      "--batch-size", "8", (char *)h_build("lib/gpt_lm.so"), "--", "--data", dir,
		      "--ctx", "8", "--gen", "40", "--temperature", "1", NULL};
	out = run_ok(c1);
	const char *sample = strstr(out, "temperature 1):\n");
	assert_non_null(sample);
	printf("%s", sample);
	assert_non_null(strstr(sample, "\\x90"));
	assert_null(strchr(sample, (char)0x90));
	free(out);
	h_rmtree(dir);
	/* ... the default's own value too (given, it was taken for not given) */
	unused[12] = "0.8";
	code = h_run(&p, unused, NULL, 120000);
	printf("--gen 0 --temperature 0.8: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "--temperature: --gen 0 generates no sample; leave it out"));
	h_free(&p);
	/* a seed for a greedy sample: nothing it changes (taken in silence) */
	char *greedy[] = {(char *)LAUNCH, "-q", "--devices", "1", "--max-steps", "1", "--no-eval",
			  (char *)h_build("lib/gpt_lm.so"), "--", "--gen", "5", "--temperature", "0",
			  "--gen-seed", "5", NULL};
	code = h_run(&p, greedy, NULL, 120000);
	printf("--temperature 0 --gen-seed 5: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "--gen-seed: --temperature 0 samples greedily (the likeliest "
				      "character each time), which no seed changes; leave it out"));
	h_free(&p);
}

/* A Fashion-MNIST label outside 0..9 is refused naming its file (it
 * named the field, split and row only). */
static void test_mlp_bad_label(void **state)
{
	(void)state;
	char dir[96], path[160];
	snprintf(dir, sizeof dir, "/tmp/hpu-models-%d-fm", (int)getpid());
	assert_int_equal(mkdir(dir, 0700), 0);
	static const char *const linked[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
					     "t10k-images-idx3-ubyte.gz"};
	for (int k = 0; k < 3; k++) {
		char from[160];
		snprintf(from, sizeof from, "/usr/share/datasets/fashion-mnist/%s", linked[k]);
		snprintf(path, sizeof path, "%s/%s", dir, linked[k]);
		assert_int_equal(symlink(from, path), 0);
	}
	/* IDX u8 [10000], not gzipped (the loader reads both), row 123 a 10 */
	uint8_t head[8] = {0, 0, 0x08, 1, 0, 0, 0x27, 0x10}, labels[10000] = {0};
	labels[123] = 10;
	snprintf(path, sizeof path, "%s/t10k-labels-idx1-ubyte.gz", dir);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(head, 1, 8, f), 8);
	assert_int_equal(fwrite(labels, 1, sizeof labels, f), sizeof labels);
	assert_int_equal(fclose(f), 0);
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "1", "--max-steps", "1", "--no-eval",
			(char *)h_build("lib/fmnist_mlp.so"), "--", "--data", dir, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	char want[300];
	snprintf(want, sizeof want, "%s: row 123 holds 10, not a class: Fashion-MNIST's are 0 to 9",
		 path);
	if (code != 1 || !strstr(p.out, want))
		fail_msg("exit %d (want 1), no \"%s\" in:\n%s", code, want, p.out);
	assert_null(strstr(p.out, "apt-get")); /* the files are there: no hint where to get them */
	h_free(&p);
	/* labels of shape [10000, 1], not one class a sample: refused naming
	 * the file and the shape (it was accepted, and a later error named
	 * neither) */
	uint8_t head2[12] = {0, 0, 0x08, 2, 0, 0, 0x27, 0x10, 0, 0, 0, 1};
	labels[123] = 0;
	f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(head2, 1, 12, f), 12);
	assert_int_equal(fwrite(labels, 1, sizeof labels, f), sizeof labels);
	assert_int_equal(fclose(f), 0);
	code = h_run(&p, argv, NULL, 120000);
	snprintf(want, sizeof want, "%s: labels of shape [10000, 1]: Fashion-MNIST's are one class a sample, [n]",
		 path);
	if (code != 1 || !strstr(p.out, want))
		fail_msg("exit %d (want 1), no \"%s\" in:\n%s", code, want, p.out);
	h_free(&p);
	/* a test split of no sample: refused naming the images' file (it was
	 * "data field 'image' (test split): the array gives no samples") */
	f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(head, 1, 4, f), 4);
	assert_int_equal(fwrite((uint8_t[4]){0}, 1, 4, f), 4);
	assert_int_equal(fclose(f), 0);
	char images[160];
	snprintf(images, sizeof images, "%s/t10k-images-idx3-ubyte.gz", dir);
	assert_int_equal(unlink(images), 0);
	uint8_t none[16] = {0, 0, 0x08, 3, 0, 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 28};
	f = fopen(images, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(none, 1, sizeof none, f), sizeof none);
	assert_int_equal(fclose(f), 0);
	code = h_run(&p, argv, NULL, 120000);
	snprintf(want, sizeof want, "%s: holds no image (its shape's first dimension is 0)", images);
	if (code != 1 || !strstr(p.out, want))
		fail_msg("exit %d (want 1), no \"%s\" in:\n%s", code, want, p.out);
	h_free(&p);
	unlink(path);
	for (int k = 0; k < 3; k++) {
		snprintf(path, sizeof path, "%s/%s", dir, linked[k]);
		unlink(path);
	}
	rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cnn),
		cmocka_unit_test(test_gpt_lm),
		cmocka_unit_test(test_gpt_lm_tokens),
		cmocka_unit_test(test_resnet),
		cmocka_unit_test(test_autocast_lists),
		cmocka_unit_test(test_bf16_activation_memory),
		cmocka_unit_test(test_logits_memory),
		cmocka_unit_test(test_backward_in_place),
		cmocka_unit_test(test_backward_reads_linear),
		cmocka_unit_test(test_no_bf16_isa),
		cmocka_unit_test(test_reference_bf16_note),
		cmocka_unit_test(test_kernel_threads),
		cmocka_unit_test(test_mlp_arguments),
		cmocka_unit_test(test_gpt_lm_prompt),
		cmocka_unit_test(test_mlp_bad_label),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
