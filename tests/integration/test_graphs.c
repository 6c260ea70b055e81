/* test_graphs: --graphs (issue 36), a training step recorded once per
 * batch shape and replayed, on the CPU's twin of a CUDA graph
 * (--device cpu-strict, whose kernels-only table makes every access to
 * device memory a kernel call the recording holds).
 *
 * The real launcher and workers train the example MLP with and without
 * --graphs; the parameters they save must be the same bytes:
 *   - every strategy at 1 worker, fp32 and bf16-mixed, through a cosine
 *     schedule with clipping and 2 micro-steps a step;
 *   - 16-mixed with an overflow injected after the recording (a skipped
 *     step, the loss scale halved on the device, the replays after it);
 *   - a checkpoint written under --graphs and resumed under --graphs;
 *   - --graphs-warmup 0: the first step recorded;
 *   - at 2 workers, their collectives through libhpucoll recorded as
 *     host calls: the strategy matrix, 16-mixed's overflow, resnet's
 *     buffers; a worker killed while the other replays.
 * Dropout records: gpt_lm with its dropout, its keys made on the device
 * from the device's step and the batch's sample indices (fp32 and
 * bf16-mixed, 2 micro-steps, 1 and 2 workers, on cpu-strict and cpu).
 * And what cannot be recorded runs eagerly with its reason under
 * --verbose, and still trains to the same parameters: a host-only custom
 * layer (at 1 and 2 workers).
 *
 * --device cpu records too (the same kernels-only table, without
 * cpu-strict's memory protection): the same matrix there at 1 worker and
 * two configurations at 2, --graphs and eager the same bytes, and the
 * same bytes as cpu-strict's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "tests/integration/runlib.h"

#define MLP_ARGS "--hidden 32 --depth 2"

static char dir[] = "/tmp/hpu-graphs-XXXXXX";

/* One run: `workers` on `device`, --graphs where graphs, the parameters
 * saved to dir/name.bin; extra options NULL-terminated. Its output
 * (caller frees); exit `want`. */
static char *train(const char *name, int workers, const char *device, int graphs,
		   const char *model, const char *margs, ...)
{
	run r;
	char path[512];
	snprintf(path, sizeof path, "%s/%s.bin", dir, name);
	start(&r, workers);
	args(&r, "--device", device, "--batch-size", "32", "--save-params", path, "--verbose",
	     NULL);
	if (graphs)
		args(&r, "--graphs", "--graphs-warmup", "2", NULL);
	va_list ap;
	va_start(ap, margs);
	for (const char *a; (a = va_arg(ap, const char *));)
		arg(&r, a);
	va_end(ap);
	return finish_with(&r, 0, model ? model : MODEL, margs ? margs : MLP_ARGS);
}

static int same_file(const char *a, const char *b)
{
	char pa[512], pb[512];
	snprintf(pa, sizeof pa, "%s/%s.bin", dir, a);
	snprintf(pb, sizeof pb, "%s/%s.bin", dir, b);
	size_t na = 0, nb = 0;
	char *x = h_slurp_n(pa, &na), *y = h_slurp_n(pb, &nb);
	int same = x && y && na == nb && na > 1000 && memcmp(x, y, na) == 0;
	free(x);
	free(y);
	return same;
}

/* (The runtime's sampler drops an epoch's last partial batch: every
 * training step of a run has one shape. Evaluation batches are recorded
 * too, in the same cache, per size: test_evaluation.) */

/* The number after `key` in out (the first one), or -1. */
static long number_after(const char *out, const char *key)
{
	const char *p = strstr(out, key);
	return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

/* "graphs: R step(s) launched from N recording(s)[, D from a recording
 * its check refused], E run eagerly": replayed is R + D, the steps
 * launched from a recording */
static void replays(const char *out, long *replayed, long *recorded, long *eager)
{
	const char *p = strstr(out, "graphs: ");
	*replayed = *recorded = *eager = -1;
	for (; p; p = strstr(p + 1, "graphs: ")) {
		long a, b, c, d = 0;
		const char *from = strstr(p, " launched from "), *nl = strchr(p, '\n');
		const char *run = strstr(p, " run eagerly");
		if (sscanf(p, "graphs: %ld step", &a) != 1 || !from || !run || (nl && run > nl) ||
		    from > run || sscanf(from, " launched from %ld recording", &b) != 1)
			continue;
		const char *r = strstr(from, " from a recording its check refused");
		if (r && r < run) {
			const char *k = r;
			while (k > from && k[-1] != ',')
				k--;
			d = strtol(k, NULL, 10);
		}
		const char *k = run;
		while (k > from && k[-1] != ',')
			k--;
		c = strtol(k, NULL, 10);
		*replayed = a + d;
		*recorded = b;
		*eager = c;
	}
}

/* Eager and --graphs on `dev` at `workers` with `accum` micro-steps give
 * the same parameters; the recording was kept and replayed (steps -
 * warmup - extra_eager of them); its verbose line (caller frees), or
 * NULL. */
static char *same_with_graphs_accum(const char *dev, int workers, int accum, const char *name,
				    int steps, int extra_eager, const char *strategy,
				    const char *precision, const char *inject)
{
	char a[96], b[96], st[16], ac[16], want[128];
	snprintf(a, sizeof a, "%s-%s-%s-%d-eager", dev, name, strategy, accum);
	snprintf(b, sizeof b, "%s-%s-%s-%d-graphs", dev, name, strategy, accum);
	snprintf(st, sizeof st, "%d", steps);
	snprintf(ac, sizeof ac, "%d", accum);
	const char *inj = inject ? "--inject-overflow-step" : NULL;
	char *oa = train(a, workers, dev, 0, NULL, NULL, "--strategy", strategy, "--precision",
			 precision, "--max-steps", st, "--grad-accum", ac, "--clip-grad-norm",
			 "0.5", "--scheduler", "cosine", inj, inject, NULL);
	char *ob = train(b, workers, dev, 1, NULL, NULL, "--strategy", strategy, "--precision",
			 precision, "--max-steps", st, "--grad-accum", ac, "--clip-grad-norm",
			 "0.5", "--scheduler", "cosine", inj, inject, NULL);
	long replayed, recorded, eager;
	replays(ob, &replayed, &recorded, &eager);
	int same = same_file(a, b);
	printf("  %-10s %d x %-8s %-10s %s: %ld replayed from %ld recording(s), %ld eager: "
	       "parameters %s\n",
	       dev, workers, strategy, precision, inject ? "overflow injected" : "", replayed,
	       recorded, eager, same ? "the same" : "DIFFERENT");
	if (recorded != 1 || !same)
		fprintf(stderr, "--graphs output:\n%s\n", ob);
	assert_int_equal(recorded, 1);
	assert_int_equal(replayed, steps - 2 - extra_eager);
	assert_int_equal(eager, 2 + extra_eager);
	if (accum > 1)
		snprintf(want, sizeof want, "graphs: step 3: recorded the step of %d samples x %d "
			 "micro-steps: ", 32 / workers / accum, accum);
	else
		snprintf(want, sizeof want, "graphs: step 3: recorded the step of %d samples: ",
			 32 / workers);
	const char *line = strstr(ob, want);
	assert_non_null(line);
	assert_true(same);
	/* one micro-step: every replay but the recordings' own launches read
	 * the batch where the loader put it (hpu__dev_graph_rebind) */
	const char *bound = strstr(ob, " read the batch where the loader put it (nothing copied");
	if (accum == 1) {
		char wb[96];
		snprintf(wb, sizeof wb, "graphs: %ld replays read the batch where the loader put it",
			 replayed - 2);
		if (!strstr(ob, wb))
			fail_msg("wanted \"%s\" in the --graphs run's output", wb);
	} else {
		assert_null(bound);
	}
	char *out = strndup(line, strcspn(line, "\n"));
	free(oa);
	free(ob);
	return out;
}

static char *same_with_graphs_at(const char *dev, int workers, const char *name, int steps,
				 int extra_eager, const char *strategy, const char *precision,
				 const char *inject)
{
	return same_with_graphs_accum(dev, workers, 2, name, steps, extra_eager, strategy,
				      precision, inject);
}

static void same_with_graphs(const char *dev, const char *name, int steps, int extra_eager,
			     const char *strategy, const char *precision, const char *inject)
{
	free(same_with_graphs_at(dev, 1, name, steps, extra_eager, strategy, precision, inject));
}

/* The strategy matrix on `dev`: every strategy fp32, three bf16-mixed. */
static void strategies_fp32(const char *dev)
{
	static const char *const st[] = {"fast_ddp", "ddp", "zero1", "zero2", "zero3"};
	for (size_t k = 0; k < 5; k++)
		same_with_graphs(dev, "fp32", 6, 0, st[k], "fp32", NULL);
}

static void strategies_bf16(const char *dev)
{
	static const char *const st[] = {"fast_ddp", "zero1", "zero3"};
	for (size_t k = 0; k < 3; k++)
		same_with_graphs(dev, "bf16", 6, 0, st[k], "bf16-mixed", NULL);
}

static void test_strategies_fp32(void **state)
{
	(void)state;
	strategies_fp32("cpu-strict");
}

static void test_strategies_bf16(void **state)
{
	(void)state;
	strategies_bf16("cpu-strict");
}

/* 16-mixed: step 5 overflows (run eagerly, on its own), is skipped on
 * the device, and the replays after it read the halved scale there */
static void test_overflow_skipped(void **state)
{
	(void)state;
	same_with_graphs("cpu-strict", "fp16", 7, 1, "fast_ddp", "16-mixed", "5");
}

/* One micro-step a step: a replay's copies of the batch read the
 * loader's two buffers in turn where it put them (hpu__dev_graph_rebind),
 * not the input buffers; 1 and 2 workers, fp32 and bf16-mixed: 9 steps,
 * the recordings' two launches reading the input buffers, then 5 replays
 * rebound (slot 0 three times, slot 1 twice), said under --verbose. */
static void test_one_micro_step(void **state)
{
	(void)state;
	free(same_with_graphs_accum("cpu-strict", 1, 1, "one", 9, 0, "fast_ddp", "fp32", NULL));
	free(same_with_graphs_accum("cpu-strict", 2, 1, "one", 9, 0, "zero3", "bf16-mixed", NULL));
	free(same_with_graphs_accum("cpu", 1, 1, "one", 9, 0, "ddp", "bf16-mixed", NULL));
}

/* More micro-steps a step than the 64 input buffers it kept (it ended
 * the job at setup: "at most 64 are recorded", then overflowed a stack
 * array of 64): 90, recorded and replayed to eager's parameters. */
static void test_many_micro_steps(void **state)
{
	(void)state;
	char *oa = train("acc65-eager", 1, "cpu", 0, NULL, NULL, "--batch-size", "180",
			 "--grad-accum", "90", "--max-steps", "5", NULL);
	char *ob = train("acc65-graphs", 1, "cpu", 1, NULL, NULL, "--batch-size", "180",
			 "--grad-accum", "90", "--max-steps", "5", NULL);
	long replayed, recorded, eager;
	replays(ob, &replayed, &recorded, &eager);
	printf("  --grad-accum 90: %ld replayed from %ld recording(s), %ld eager\n", replayed,
	       recorded, eager);
	assert_non_null(strstr(ob, "graphs: step 3: recorded the step of 2 samples x 90 "
				   "micro-steps: "));
	assert_int_equal(recorded, 1);
	assert_int_equal(replayed, 3);
	assert_true(same_file("acc65-eager", "acc65-graphs"));
	free(oa);
	free(ob);
}

/* --graphs-warmup 0: the first step is recorded. Its gradients start at
 * zero as the later steps' do, owed zeros the ops claim (hpu__ac_fresh_*):
 * a first step that added its products to zeros recorded adds that its
 * replays made onto the previous step's gradients (other parameters). */
static void test_warmup_zero(void **state)
{
	(void)state;
	char *oa = train("w0-eager", 1, "cpu-strict", 0, NULL, NULL, "--max-steps", "4", NULL);
	char *ob = train("w0-graphs", 1, "cpu-strict", 1, NULL, NULL, "--max-steps", "4",
			 "--graphs-warmup", "0", NULL);
	long replayed, recorded, eager;
	replays(ob, &replayed, &recorded, &eager);
	printf("  --graphs-warmup 0: %ld replayed from %ld recording(s), %ld eager: parameters %s\n",
	       replayed, recorded, eager, same_file("w0-eager", "w0-graphs") ? "the same" : "DIFFERENT");
	assert_non_null(strstr(ob, "graphs: step 1: recorded the step of 32 samples: "));
	assert_int_equal(replayed, 4);
	assert_true(same_file("w0-eager", "w0-graphs"));
	free(oa);
	free(ob);
}

/* The sequence model's loss2, a binary cross-entropy with logits, has
 * no value to check: its kernel wrote "none found" into host memory
 * (refused: "the kernel bce_fwd writes host memory (its argument bad)"),
 * so no step of the model was recorded; it writes a deferred check's
 * slot, as the probabilities' does. */
static void test_bce_logits_recorded(void **state)
{
	(void)state;
	const char *m = h_build("lib/seq_model.so");
	char *oa = train("seq-eager", 1, "cpu-strict", 0, m, "", "--max-steps", "5", NULL);
	char *ob = train("seq-graphs", 1, "cpu-strict", 1, m, "", "--max-steps", "5", NULL);
	const char *line = strstr(ob, "graphs: step 3: "), *end = line ? strchr(line, '\n') : NULL;
	printf("  seq_model: %.*s\n", end ? (int)(end - line) : 4, line ? line : "none");
	assert_non_null(strstr(ob, "graphs: step 3: recorded the step of 32 samples: "));
	char pa[512], pb[512]; /* 37 parameters: below same_file's floor */
	snprintf(pa, sizeof pa, "%s/seq-eager.bin", dir);
	snprintf(pb, sizeof pb, "%s/seq-graphs.bin", dir);
	size_t na = 0, nb = 0;
	char *x = h_slurp_n(pa, &na), *y = h_slurp_n(pb, &nb);
	assert_true(x && y && na == 148 && nb == na && !memcmp(x, y, na));
	free(x);
	free(y);
	free(oa);
	free(ob);
}

/* A checkpoint at step 4 of a --graphs run in `prec`, resumed under
 * --graphs to step 8: the same parameters as 8 steps straight, eagerly. */
static void resume_on(const char *dev, const char *prec)
{
	char ck[600], straight[64], first[64], resumed[64];
	snprintf(ck, sizeof ck, "%s/ck-%s-%s", dir, dev, prec);
	snprintf(straight, sizeof straight, "%s-%s-straight", dev, prec);
	snprintf(first, sizeof first, "%s-%s-first", dev, prec);
	snprintf(resumed, sizeof resumed, "%s-%s-resumed", dev, prec);
	free(train(straight, 1, dev, 0, NULL, NULL, "--max-steps", "8", "--precision", prec,
		   NULL));
	free(train(first, 1, dev, 1, NULL, NULL, "--max-steps", "4", "--precision", prec,
		   "--checkpoint-dir", ck, "--checkpoint-every", "4", NULL));
	char *o = train(resumed, 1, dev, 1, NULL, NULL, "--max-steps", "8", "--precision", prec,
			"--checkpoint-dir", ck, "--resume", "auto", NULL);
	long replayed, recorded, eager;
	replays(o, &replayed, &recorded, &eager);
	printf("  %s, %s: resumed at step 4 under --graphs: %ld replayed, %ld eager; "
	       "parameters %s\n",
	       dev, prec, replayed, eager, same_file(straight, resumed) ? "the same" : "DIFFERENT");
	assert_non_null(strstr(o, "resumed from"));
	assert_int_equal(recorded, 1);
	assert_int_equal(replayed, 2);
	assert_true(same_file(straight, resumed));
	free(o);
}

static void test_resume(void **state)
{
	(void)state;
	resume_on("cpu-strict", "bf16-mixed");
}

#define GPT_ARGS "--dim 32 --heads 2 --layers 1 --ctx 16 --gen 0"

/* gpt_lm with its default dropout (0.1) on `dev` at `workers`, 6 steps
 * of 2 micro-steps, eager and --graphs: the step is recorded at step 3
 * (the keys made on the device) and replayed, to eager's parameters,
 * which draw each step's own mask; the recording's verbose line (caller
 * frees). */
static char *gpt_dropout(const char *dev, int workers, const char *precision)
{
	const char *gpt = h_build("lib/gpt_lm.so");
	char a[96], b[96], want[128];
	snprintf(a, sizeof a, "gpt-%s-%d-%s-eager", dev, workers, precision);
	snprintf(b, sizeof b, "gpt-%s-%d-%s-graphs", dev, workers, precision);
	char *oa = train(a, workers, dev, 0, gpt, GPT_ARGS, "--max-steps", "6", "--grad-accum",
			 "2", "--precision", precision, NULL);
	char *ob = train(b, workers, dev, 1, gpt, GPT_ARGS, "--max-steps", "6", "--grad-accum",
			 "2", "--precision", precision, NULL);
	snprintf(want, sizeof want, "graphs: step 3: recorded the step of %d samples x 2 "
		 "micro-steps: ", 16 / workers);
	const char *line = strstr(ob, want), *why = strstr(ob, "is not recorded: ");
	long replayed, recorded, eager;
	replays(ob, &replayed, &recorded, &eager);
	printf("  gpt_lm, dropout 0.1, %s, %d x %s: %.*s; parameters %s\n", dev, workers,
	       precision, line ? (int)strcspn(line, "\n") : why ? (int)strcspn(why, "\n") : 4,
	       line ? line : why ? why : "none", same_file(a, b) ? "the same" : "DIFFERENT");
	assert_non_null(line);
	assert_int_equal(recorded, 1);
	assert_int_equal(replayed, 4);
	assert_true(same_file(a, b));
	char *out = strndup(line, strcspn(line, "\n"));
	free(oa);
	free(ob);
	return out;
}

/* Dropout records (its keys made on the device), on cpu-strict and on
 * cpu: at 1 worker fp32 and bf16-mixed, at 2 with their collectives as
 * host calls of the recording; cpu's parameters are cpu-strict's. */
static void test_dropout_recorded(void **state)
{
	(void)state;
	static const char *const devs[] = {"cpu-strict", "cpu"};
	for (int d = 0; d < 2; d++) {
		free(gpt_dropout(devs[d], 1, "fp32"));
		free(gpt_dropout(devs[d], 1, "bf16-mixed"));
		char *line = gpt_dropout(devs[d], 2, "fp32");
		assert_non_null(strstr(line, " of them host calls (the collectives between the "
					     "workers, through libhpucoll), replayed from now on"));
		free(line);
	}
	assert_true(same_file("gpt-cpu-1-fp32-graphs", "gpt-cpu-strict-1-fp32-eager"));
	assert_true(same_file("gpt-cpu-2-fp32-graphs", "gpt-cpu-strict-2-fp32-eager"));
}

/* What cannot be recorded runs eagerly, said once with its reason, and
 * trains as without --graphs: a host-only custom layer (its tensors
 * staged through host memory by host code). */
static void test_refusals(void **state)
{
	(void)state;
	const char *m = h_build("lib/host_layer_model.so");
	char *oa = train("host-step-eager", 1, "cpu-strict", 0, m, "--count", "--max-steps", "4",
			 NULL);
	char *ob = train("host-step-graphs", 1, "cpu-strict", 1, m, "--count", "--max-steps", "4",
			 NULL);
	/* refused before the step began: the layer's host code never ran on
	 * a recording (on the staging buffers' old contents), once a step */
	assert_non_null(strstr(oa, "hscale: 4 training forwards\n"));
	assert_non_null(strstr(ob, "hscale: 4 training forwards\n"));
	const char *why = strstr(ob, "is not recorded: ");
	printf("  host-only layer: %.*s\n", why ? (int)strcspn(why, "\n") : 4, why ? why : "none");
	assert_non_null(strstr(ob, "graphs: step 3: the step of 32 samples is not recorded: "
				   "layer hscale is host-only (HPU_LAYER_HOST_ONLY): its tensors are "
				   "staged through host memory by host code, which would run now, on "
				   "the staging buffers' old contents, and not at each launch; it runs "
				   "eagerly\n"));
	assert_true(same_file("host-step-eager", "host-step-graphs"));
	free(oa);
	free(ob);
}

/* A custom layer that gives an op a value its host code computes from
 * the step (anneal_model's temperature, through hpu_split_heads' scale):
 * a replay would repeat the recorded step's value (the parameters
 * differed from eager's from step 5 on, without a word). The recording is
 * made again at the next step; its values differ, so the step runs
 * eagerly, naming the layer, its pass and the kernel; the evaluation
 * batches likewise at the next evaluation. The same layer with a fixed
 * temperature records twice, the same, and is replayed. */
static void test_step_values_refused(void **state)
{
	(void)state;
	const char *m = h_build("lib/anneal_model.so");
	char *oa = train("anneal-eager", 1, "cpu", 0, m, "--say-eval-step", "--max-steps", "12",
			 "--batch-size", "16", "--eval-every", "4", NULL);
	/* an evaluation's ctx->step is the steps done (hpu.h); it was the
	 * step the run started from, 0 */
	const char *at = strstr(oa, "eval step 4\n");
	assert_non_null(at);
	assert_non_null(at = strstr(at, "eval step 8\n"));
	assert_non_null(strstr(at, "eval step 12\n"));
	assert_null(strstr(oa, "eval step 0\n"));
	char *ob = train("anneal-graphs", 1, "cpu", 1, m, "", "--max-steps", "12", "--batch-size",
			 "16", "--eval-every", "4", NULL);
	const char *why = strstr(ob, "graphs: step 4: the step of 16 samples is not recorded: ");
	printf("  annealed: %.*s\n", why ? (int)strcspn(why, "\n") : 4, why ? why : "none");
	assert_non_null(strstr(ob, "graphs: step 3: recorded the step of 16 samples: "));
	assert_non_null(why);
	assert_non_null(strstr(why, "is not recorded: layer temp's forward gave the kernel heads "
				    "(call 3) other values than in the recording before: a value the "
				    "host computes each step (from the step or the epoch, or drawn "
				    "from the host's random numbers) would be replayed as recorded; "
				    "it runs eagerly\n"));
	/* the evaluation after step 8 records again: its ctx->step is 8 */
	assert_non_null(strstr(ob, "graphs: evaluation: the batch of 16 samples is not recorded: "
				   "layer temp's forward gave the kernel heads (call 3) other values "
				   "than in the recording before"));
	long replayed, recorded, eager;
	replays(ob, &replayed, &recorded, &eager);
	assert_int_equal(recorded, 0);
	assert_int_equal(replayed, 1); /* step 3's recording, launched at once */
	/* said as such (it was "1 steps replayed from 0 recordings") */
	assert_non_null(strstr(ob, "graphs: 0 steps launched from 0 recordings, 1 from a "
				   "recording its check refused, 11 run eagerly"));
	assert_true(same_file("anneal-eager", "anneal-graphs"));
	free(oa);
	free(ob);

	oa = train("fixed-eager", 1, "cpu-strict", 0, m, "--fixed", "--max-steps", "12",
		   "--batch-size", "16", "--eval-every", "4", NULL);
	ob = train("fixed-graphs", 1, "cpu-strict", 1, m, "--fixed", "--max-steps", "12",
		   "--batch-size", "16", "--eval-every", "4", NULL);
	assert_non_null(strstr(ob, "graphs: step 4: recorded the step of 16 samples again: the "
				   "same kernel calls with the same values as step 3's\n"));
	assert_null(strstr(ob, "is not recorded"));
	replays(ob, &replayed, &recorded, &eager);
	assert_int_equal(recorded, 1);
	assert_int_equal(replayed, 10);
	assert_true(same_file("fixed-eager", "fixed-graphs"));
	free(oa);
	free(ob);

	/* a value from the batch's sample indices, in the one evaluation of
	 * --eval-only: the recording is checked against the next batch of
	 * its size in the same evaluation (it was replayed unchecked there:
	 * another test loss) */
	oa = train("samples-eager", 1, "cpu", 0, m, "--from-samples", "--eval-only",
		   "--batch-size", "16", NULL);
	ob = train("samples-graphs", 1, "cpu", 1, m, "--from-samples", "--eval-only",
		   "--batch-size", "16", NULL);
	assert_non_null(strstr(ob, "graphs: evaluation: the batch of 16 samples is not recorded: "
				   "layer temp's forward gave the kernel heads (call 3) other values "
				   "than in the recording before"));
	const char *ta = strstr(oa, "test loss "), *tb = strstr(ob, "test loss ");
	assert_non_null(ta);
	assert_non_null(tb);
	assert_int_equal(strcspn(ta, "\n"), strcspn(tb, "\n"));
	assert_memory_equal(ta, tb, strcspn(ta, "\n"));
	free(oa);
	free(ob);
}

/* The offloaded optimizer's update runs on the host: its step is not
 * recorded (said with the reason), and the attempt changes nothing, so
 * the run trains to eager's parameters (a recording that ran the host's
 * Adam on gradients it never copied over stepped the optimizer twice). */
static void test_offload_refused(void **state)
{
	(void)state;
	char *oa = train("offload-eager", 1, "cpu", 0, NULL, NULL, "--strategy", "zero2",
			 "--offload-optimizer", "cpu", "--max-steps", "4", NULL);
	char *ob = train("offload-graphs", 1, "cpu", 1, NULL, NULL, "--strategy", "zero2",
			 "--offload-optimizer", "cpu", "--max-steps", "4", NULL);
	const char *why = strstr(ob, "graphs: step 3: the step of 32 samples is not recorded: ");
	printf("  offload: %.*s\n", why ? (int)strcspn(why, "\n") : 4, why ? why : "none");
	assert_true(same_file("offload-eager", "offload-graphs"));
	assert_non_null(why);
	assert_non_null(strstr(why, "--offload-optimizer"));
	free(oa);
	free(ob);
	/* one worker's parameters in host memory, not kept whole: an
	 * evaluation batch's reason is said before it is recorded (it was
	 * found while recording, in the device's words about a copy) */
	ob = train("offload-eval", 1, "cpu", 1, NULL, NULL, "--strategy", "zero3",
		   "--param-persistence-threshold", "0", "--offload-param", "cpu", "--max-steps",
		   "4", "--eval-every", "2", "--val-fraction", "0.002", NULL);
	why = strstr(ob, "graphs: evaluation: the batch of 32 samples is not recorded: ");
	printf("  offload-param: %.*s\n", why ? (int)strcspn(why, "\n") : 4, why ? why : "none");
	assert_non_null(why);
	assert_non_null(strstr(why, "not recorded: the parameters are kept in host memory "
				    "(--offload-param cpu) and copied from there for the forward; "
				    "it runs eagerly\n"));
	assert_null(strstr(ob, "hpu__dev_h2d"));
	free(ob);
}

/* A custom layer whose forward writes its output with plain C (fault_mlp's
 * probe copies the labels into "target"), as --device cpu allows: on
 * --device cpu --graphs that work runs while recording, not at each
 * launch, so the step is not recorded (said with the reason) and trains
 * to eager's parameters (the replays read the recording's targets). */
static void test_cpu_host_code_refused(void **state)
{
	(void)state;
	const char *m = FAULT_MODEL, *ma = "--hidden 32 --depth 1";
	char *oa = train("probe-eager", 1, "cpu", 0, m, ma, "--max-steps", "5", NULL);
	char *ob = train("probe-graphs", 1, "cpu", 1, m, ma, "--max-steps", "5", NULL);
	const char *why = strstr(ob, "graphs: step 3: the step of 32 samples is not recorded: ");
	printf("  probe: %.*s\n", why ? (int)strcspn(why, "\n") : 4, why ? why : "none");
	assert_true(same_file("probe-eager", "probe-graphs"));
	assert_non_null(why);
	assert_non_null(strstr(why, "host code touched device memory"));
	assert_non_null(strstr(why, "', in layer probe's forward) while a step was recorded"));
	free(oa);
	free(ob);
}

/* --device cpu --graphs where the ops' table refuses a kernel
 * (HPU_BACKEND=reference: every gemm answers HPU_BE_UNSUPPORTED and no
 * host kernel stands in for it): the eager steps run the ops' C loops,
 * as plain --device cpu does (its memory is the host's), the recording is
 * refused naming the op (its step runs eagerly), and the run trains to
 * plain cpu's parameters. cpu-strict, whose memory the host may not
 * touch, still ends the worker naming the op. */
static void test_cpu_kernel_refused(void **state)
{
	(void)state;
	setenv("HPU_BACKEND", "reference", 1);
	char *oa = train("ref-cpu-eager", 1, "cpu", 0, NULL, NULL, "--max-steps", "4", NULL);
	char *ob = train("ref-cpu-graphs", 1, "cpu", 1, NULL, NULL, "--max-steps", "4", NULL);
	const char *why = strstr(ob, "graphs: step 3: the step of 32 samples is not recorded: ");
	printf("  cpu, reference kernels: %.*s\n", why ? (int)strcspn(why, "\n") : 4,
	       why ? why : "none");
	assert_non_null(why);
	assert_non_null(strstr(why, "is not recorded: hpu_linear_forward: the kernel table of "
				    "device cpu refused it while recording (gemm fp32, "));
	long replayed, recorded, eager;
	replays(ob, &replayed, &recorded, &eager);
	assert_int_equal(recorded, 0);
	assert_int_equal(eager, 4);
	assert_true(same_file("ref-cpu-eager", "ref-cpu-graphs"));
	/* --graphs-warmup 0: the first step is not recorded before its
	 * kernels ran eagerly once (a refusal is known only then: a gemm
	 * node recorded first failed at its launch) */
	char *ow = train("ref-cpu-w0", 1, "cpu", 1, NULL, NULL, "--max-steps", "4",
			 "--graphs-warmup", "0", NULL);
	assert_non_null(strstr(ow, "graphs: --graphs-warmup 0 counts as 1 on device cpu: a "
				   "kernel's refusal is known only from an eager call"));
	assert_non_null(strstr(ow, "graphs: step 2: the step of 32 samples is not recorded: "
				   "hpu_linear_forward: the kernel table of device cpu refused it"));
	assert_true(same_file("ref-cpu-eager", "ref-cpu-w0"));
	free(ow);
	run r;
	start(&r, 1);
	args(&r, "--device", "cpu-strict", "--batch-size", "32", "--graphs", "--max-steps", "2",
	     NULL);
	char *oc = finish_with(&r, 1, MODEL, MLP_ARGS);
	assert_non_null(strstr(oc, "the device cpu-strict has no kernel for hpu_linear_forward "
				   "(gemm fp32, "));
	/* and says why the same run trains without --graphs */
	assert_non_null(strstr(oc, "): HPU_BACKEND=reference has C loops, not kernels, for it, and "
				   "only kernels may touch this device's memory here (--graphs or "
				   "HPU_STRICT_KERNELS=1)"));
	free(oa);
	free(ob);
	free(oc);
}

static int unset_backend(void **state)
{
	(void)state;
	unsetenv("HPU_BACKEND");
	return 0;
}

/* The validation lines of a metrics file (dir/name.jsonl): step, epoch,
 * val_loss and val_accuracy in full precision, val_samples (caller
 * frees). */
static char *val_lines(const char *name)
{
	char path[512];
	snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
	size_t n = 0;
	char *all = h_slurp_n(path, &n), *out = calloc(1, n + 1);
	assert_non_null(all);
	assert_non_null(out);
	for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n"))
		if (strstr(line, "\"val_loss\"")) {
			strcat(out, line);
			strcat(out, "\n");
		}
	free(all);
	return out;
}

/* The final metrics record's "autocast" object of dir/name.jsonl: the
 * op calls by precision (caller frees). */
static char *autocast_of(const char *name)
{
	char path[512];
	snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
	char *all = h_slurp(path), *p = all ? strstr(all, "\"autocast\":{") : NULL;
	assert_non_null(p);
	char *out = strndup(p, strcspn(p, "\n"));
	free(all);
	return out;
}

/* Runs a and b count the same op calls by precision: a replay counts its
 * recording's calls, as the eager step it stands for does. */
static void same_calls(const char *a, const char *b)
{
	char *ca = autocast_of(a), *cb = autocast_of(b);
	printf("  op calls: %s, %s\n", a, strcmp(ca, cb) ? "DIFFERENT" : "the same");
	if (strcmp(ca, cb))
		fprintf(stderr, "%s: %s\n%s: %s\n", a, ca, b, cb);
	assert_string_equal(ca, cb);
	free(ca);
	free(cb);
}

/* Runs a and b validated alike (their metrics files' validation lines
 * the same, bit for bit, over `samples` held-out samples where > 0) and
 * trained to the same parameters. */
static void same_validation(const char *a, const char *b, long samples)
{
	char *va = val_lines(a), *vb = val_lines(b);
	if (samples > 0)
		assert_int_equal(number_after(va, "\"val_samples\":"), samples);
	assert_string_equal(va, vb);
	assert_true(same_file(a, b));
	free(va);
	free(vb);
}

/* One run validating at steps 2, 4 and 6 on 60 held-out samples, at 32
 * a batch: a full batch and a partial one of 28 each time; `graphs`:
 * --graphs with one eager batch per size before its recording. */
static char *validating(const char *dev, const char *name, int graphs, const char *extra)
{
	char m[512];
	snprintf(m, sizeof m, "%s/%s.jsonl", dir, name);
	return train(name, 1, dev, 0, NULL, NULL, "--max-steps", "6", "--eval-every", "2",
		     "--val-fraction", "0.001", "--metrics", m,
		     graphs ? "--graphs" : extra, "--graphs-warmup", "1", extra, NULL);
}

/* Evaluation under --graphs: each batch size recorded once and replayed,
 * in the cache beside the training step's; eager and replayed give the
 * same figures, bit for bit, and train to the same parameters.
 * --pad-last-batch pads the partial batch to 32, which then replays the
 * full batch's recording: one evaluation recording, the same figures. */
static void evaluation_on(const char *dev)
{
	char ea[64], eb[64], ec[64];
	snprintf(ea, sizeof ea, "%s-val-eager", dev);
	snprintf(eb, sizeof eb, "%s-val-graphs", dev);
	snprintf(ec, sizeof ec, "%s-val-padded", dev);
	char *oa = validating(dev, ea, 0, NULL);
	char *ob = validating(dev, eb, 1, NULL);
	char *va = val_lines(ea), *vb = val_lines(eb);
	long replayed, recorded, eager;
	replays(ob, &replayed, &recorded, &eager);
	const char *line = strstr(ob, "graphs: 5 steps launched");
	printf("  %s --graphs: %.*s\n", dev, line ? (int)strcspn(line, "\n") : 4, line ? line : "none");
	if (strcmp(va, vb))
		fprintf(stderr, "eager:\n%s--graphs:\n%s--graphs output:\n%s\n", va, vb, ob);
	assert_non_null(strstr(ob, "graphs: evaluation: recorded the batch of 32 samples: "));
	assert_non_null(strstr(ob, "graphs: evaluation: recorded the batch of 28 samples: "));
	assert_non_null(strstr(ob, "graphs: 5 steps launched from 1 recording, 1 run eagerly; "
				   "evaluation: 4 batches launched from 2 recordings, 2 run "
				   "eagerly; 3 recordings kept\n"));
	assert_int_equal(recorded, 1);
	assert_int_equal(number_after(va, "\"val_samples\":"), 60);
	assert_string_equal(va, vb);
	assert_true(same_file(ea, eb));
	same_calls(ea, eb);
	char *oc = validating(dev, ec, 1, "--pad-last-batch");
	char *vc = val_lines(ec);
	line = strstr(oc, "graphs: 5 steps launched");
	printf("  %s --pad-last-batch: %.*s\n", dev, line ? (int)strcspn(line, "\n") : 4,
	       line ? line : "none");
	assert_non_null(strstr(oc, "graphs: evaluation: recorded the batch of 32 samples: "));
	assert_null(strstr(oc, "graphs: evaluation: recorded the batch of 28"));
	assert_non_null(strstr(oc, "graphs: 5 steps launched from 1 recording, 1 run eagerly; "
				   "evaluation: 5 batches launched from 1 recording, 1 run eagerly; "
				   "2 recordings kept\n"));
	assert_string_equal(va, vc);
	assert_true(same_file(ea, ec));
	free(oa);
	free(ob);
	free(oc);
	free(va);
	free(vb);
	free(vc);
}

static void test_evaluation(void **state)
{
	(void)state;
	evaluation_on("cpu-strict");
}

/* The test figures of a run with --metrics `m`: from "test_loss" up to
 * the device's counters (caller frees). */
static char *test_figures(const char *m)
{
	char *all = h_slurp(m);
	assert_non_null(all);
	const char *t = strstr(all, "\"test_loss\":");
	assert_non_null(t);
	const char *end = strstr(t, ",\"device\":");
	assert_non_null(end);
	char *out = strndup(t, (size_t)(end - t));
	free(all);
	return out;
}

/* --eval-only --graphs: the evaluation's batches are recorded (its only
 * work) and give eager's figures, bit for bit. */
static void test_eval_only(void **state)
{
	(void)state;
	char ma[512], mb[512];
	snprintf(ma, sizeof ma, "%s/eo-eager.jsonl", dir);
	snprintf(mb, sizeof mb, "%s/eo-graphs.jsonl", dir);
	char *oa = train("eo-eager", 1, "cpu", 0, NULL, NULL, "--eval-only", "--metrics", ma, NULL);
	char *ob = train("eo-graphs", 1, "cpu", 1, NULL, NULL, "--eval-only", "--metrics", mb, NULL);
	char *fa = test_figures(ma), *fb = test_figures(mb);
	const char *line = strstr(ob, "graphs: 0 steps");
	printf("  --eval-only --graphs: %.*s\n", line ? (int)strcspn(line, "\n") : 4,
	       line ? line : "none");
	assert_non_null(strstr(ob, "graphs: evaluation: recorded the batch of 32 samples: "));
	assert_non_null(strstr(ob, "; evaluation: 310 batches launched from 1 recording, 3 run "
				   "eagerly; 1 recording kept\n"));
	assert_string_equal(fa, fb);
	free(fa);
	free(fb);
	free(oa);
	free(ob);
}

/* An evaluation batch that cannot be recorded (a host-only custom
 * layer, staged through host memory) runs eagerly, said once with its
 * reason, and validates as without --graphs. */
static void test_evaluation_refused(void **state)
{
	(void)state;
	const char *m = h_build("lib/host_layer_model.so");
	char ma[512], mb[512];
	snprintf(ma, sizeof ma, "%s/host-eager.jsonl", dir);
	snprintf(mb, sizeof mb, "%s/host-graphs.jsonl", dir);
	char *oa = train("host-eager", 1, "cpu-strict", 0, m, "", "--max-steps", "4", "--eval-every", "2", "--val-fraction", "0.05", "--metrics", ma, NULL);
	char *ob = train("host-graphs", 1, "cpu-strict", 0, m, "", "--max-steps", "4",
			 "--eval-every", "2", "--val-fraction", "0.05",
			 "--metrics", mb, "--graphs", "--graphs-warmup", "1", NULL);
	const char *why = strstr(ob, "graphs: evaluation: the batch of 5 samples is not recorded: ");
	printf("  host-only layer: %.*s\n", why ? (int)strcspn(why, "\n") : 4, why ? why : "none");
	assert_non_null(why);
	assert_non_null(strstr(why, "graphs: evaluation: the batch of 5 samples is not recorded: "
				    "layer hscale is host-only (HPU_LAYER_HOST_ONLY): its tensors are "
				    "staged through host memory by host code, which would run now, on "
				    "the staging buffers' old contents, and not at each launch; it runs "
				    "eagerly\n"));
	assert_non_null(strstr(ob, "evaluation: 0 batches launched from 0 recordings, 2 run eagerly; "
				   "0 recordings kept\n"));
	same_validation("host-eager", "host-graphs", 0);
	free(oa);
	free(ob);
}

/* What still cannot be recorded at 2 workers is refused on both ranks
 * alike: the collectives met while recording are skipped on both (none
 * waits for the other), the step runs eagerly on both, and trains as
 * without --graphs (a host-only custom layer). (On a device that records
 * itself, CUDA, the libhpucoll collectives are refused too: a GPU's
 * test.) */
static void test_two_workers_refused(void **state)
{
	(void)state;
	const char *m = h_build("lib/host_layer_model.so");
	char *oa = train("two-host-eager", 2, "cpu-strict", 0, m, "", "--max-steps", "4", NULL);
	char *ob = train("two-host-graphs", 2, "cpu-strict", 1, m, "", "--max-steps", "4", NULL);
	const char *why = strstr(ob, "graphs: step 3: the step of 16 samples is not recorded: ");
	printf("  2 workers, host-only layer: %.*s\n", why ? (int)strcspn(why, "\n") : 4,
	       why ? why : "none");
	assert_non_null(why);
	assert_non_null(strstr(why, "graphs: step 3: the step of 16 samples is not recorded: "
				    "layer hscale is host-only (HPU_LAYER_HOST_ONLY): its tensors are "
				    "staged through host memory by host code, which would run now, on "
				    "the staging buffers' old contents, and not at each launch; it runs "
				    "eagerly\n"));
	long replayed, recorded, eager;
	replays(ob, &replayed, &recorded, &eager);
	assert_int_equal(recorded, 0);
	assert_int_equal(eager, 4);
	assert_true(same_file("two-host-eager", "two-host-graphs"));
	free(oa);
	free(ob);
}

/* One rank's recordings refused, the other's not (fault_mlp
 * --refuse-rank 1: rank 1's probe copies with plain C, rank 0's through
 * hpu_copy) on --device cpu --graphs: --verbose says which rank refused
 * and why, once per recording: the training step's on rank 0 (rank 1's
 * reason, carried over), each evaluation batch's on rank 1 itself (each
 * rank records its own); and the run trains and validates as eagerly. */
static void test_two_workers_one_refuses(void **state)
{
	(void)state;
	const char *m = FAULT_MODEL, *ma = "--hidden 32 --depth 1 --refuse-rank 1";
	char mt[2][512];
	const char *name[2] = {"one-refuses-eager", "one-refuses-graphs"};
	char *o[2];
	for (int g = 0; g < 2; g++) {
		snprintf(mt[g], sizeof mt[g], "%s/%s.jsonl", dir, name[g]);
		o[g] = train(name[g], 2, "cpu", 0, m, ma, "--max-steps", "4", "--eval-every", "2",
			     "--val-fraction", "0.001", "--metrics", mt[g], "--graphs-warmup", "1",
			     g ? "--graphs" : NULL, NULL);
	}
	const char *why = strstr(o[1], "graphs: step 2: the step of 16 samples is not recorded: ");
	const char *ev = strstr(o[1], "graphs: evaluation: the batch of 16 samples is not recorded");
	printf("  rank 1 refuses: %.*s\n  %.*s\n", why ? (int)strcspn(why, "\n") : 4,
	       why ? why : "none", ev ? (int)strcspn(ev, "\n") : 4, ev ? ev : "none");
	assert_non_null(why);
	assert_null(strstr(o[1], "another rank's recording was refused"));
	assert_non_null(strstr(why, "graphs: step 2: the step of 16 samples is not recorded: rank "
				    "1's recording was refused: host code touched device memory "));
	assert_non_null(ev);
	assert_non_null(strstr(ev, "graphs: evaluation: the batch of 16 samples is not recorded "
				   "on rank 1: host code touched device memory "));
	/* once per recording: rank 0 recorded its batches, rank 1 said its refusal once */
	assert_null(strstr(ev + 1, "graphs: evaluation: the batch of 16 samples is not recorded"));
	assert_non_null(strstr(o[1], "graphs: evaluation: recorded the batch of 16 samples: "));
	same_validation(name[0], name[1], 60);
	free(o[0]);
	free(o[1]);
}

/* At 2 workers, rank 1's recording does not begin (out of host memory
 * would do it; HPU_GRAPHS_FAIL_BEGIN=1 here) while rank 0 records: rank
 * 1 takes part in rank 0's agreement as the refused one, both run the
 * step eagerly, and every later step too. Before, rank 1 ran the step
 * eagerly while rank 0 recorded: their collectives no longer matched. */
static void test_two_workers_one_unbegun(void **state)
{
	(void)state;
	const char *name[2] = {"unbegun-eager", "unbegun-graphs"};
	char *o[2];
	for (int g = 0; g < 2; g++) {
		if (g)
			setenv("HPU_GRAPHS_FAIL_BEGIN", "1", 1);
		o[g] = train(name[g], 2, "cpu", g, NULL, NULL, "--max-steps", "6", "--no-eval", NULL);
		unsetenv("HPU_GRAPHS_FAIL_BEGIN");
	}
	const char *why = strstr(o[1], "graphs: step 3: the step of 16 samples is not recorded: ");
	printf("  %.*s\n", why ? (int)strcspn(why, "\n") : 4, why ? why : "none");
	assert_non_null(why);
	assert_non_null(strstr(why, "rank 1's recording was refused: the recording could not begin "
				    "(HPU_GRAPHS_FAIL_BEGIN names rank 1, "));
	assert_non_null(strstr(o[1], "[rank 1] hpu-worker: rank 1: --graphs: the recording could "
				     "not begin (HPU_GRAPHS_FAIL_BEGIN names rank 1, as running out of "
				     "host memory would); the training steps and evaluation batches "
				     "run eagerly on this rank, and steps on every rank"));
	assert_null(strstr(o[1], "[rank 0] hpu-worker: rank 0: --graphs: the recording could"));
	long replayed, recorded, eager;
	replays(o[1], &replayed, &recorded, &eager);
	assert_int_equal(replayed, 0);
	assert_int_equal(recorded, 0);
	assert_int_equal(eager, 6);
	assert_true(same_file(name[0], name[1]));
	free(o[0]);
	free(o[1]);
}

/* ---- 2 workers: their collectives recorded as host calls ---- */

/* The matrix at 2 workers: each step's collectives (the gradients'
 * all-reduce or reduce-scatter, ZeRO's all-gathers, the non-finite
 * flag's and the norm's sums) are in the recording, as host calls
 * replayed in place, and the parameters are eager's, bit for bit. */
static void two_workers_on(const char *dev, const char *name, const char *strategy,
			   const char *precision, int steps, int extra_eager, const char *inject)
{
	char *line = same_with_graphs_at(dev, 2, name, steps, extra_eager, strategy, precision,
					 inject);
	printf("    %s\n", line);
	const char *h = strstr(line, " device calls, ");
	assert_non_null(h);
	assert_true(strtol(h + 15, NULL, 10) > 0);
	assert_non_null(strstr(h, " of them host calls (the collectives between the workers, "
				  "through libhpucoll), replayed from now on"));
	free(line);
}

static void two_workers(const char *name, const char *strategy, const char *precision,
			int steps, int extra_eager, const char *inject)
{
	two_workers_on("cpu-strict", name, strategy, precision, steps, extra_eager, inject);
}

static void test_two_workers_fp32(void **state)
{
	(void)state;
	static const char *const st[] = {"fast_ddp", "ddp", "zero1", "zero2", "zero3"};
	for (size_t k = 0; k < 5; k++)
		two_workers("two-fp32", st[k], "fp32", 6, 0, NULL);
}

static void test_two_workers_bf16(void **state)
{
	(void)state;
	static const char *const st[] = {"fast_ddp", "zero1", "zero3"};
	for (size_t k = 0; k < 3; k++)
		two_workers("two-bf16", st[k], "bf16-mixed", 6, 0, NULL);
}

/* 16-mixed at 2 workers: step 5 overflows on both (its own step, eager),
 * is skipped, and the replays after it read the halved scale */
static void test_two_workers_overflow(void **state)
{
	(void)state;
	two_workers("two-fp16", "fast_ddp", "16-mixed", 7, 1, "5");
}

/* Node `r` of a 2-node job on loopback (test_launch_nodes' pair: one
 * worker each), training under --graphs on cpu-strict until stopped;
 * `eval`: --eval-only instead, zero3 (the evaluation's forwards gather
 * the parameters between the workers: host calls of its recording), a
 * sample per rank a batch, so that it replays for a while. */
static void start_node(proc *p, int r, const char *port, int eval)
{
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	char *a[40] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank",
		       r ? "1" : "0", "--master-port", (char *)port, "--log-every", "0",
		       "--device", "cpu-strict", "--verbose", "--graphs"};
	int n = 15;
	static char *const train[] = {"--no-eval", "--batch-size", "32", "--graphs-warmup", "2",
				      "--max-steps", "1000000", NULL};
	static char *const ev[] = {"--eval-only", "--batch-size", "2", "--graphs-warmup", "1",
				   "--strategy", "zero3", "--param-persistence-threshold", "0",
				   NULL};
	for (char *const *o = eval ? ev : train; *o; o++)
		a[n++] = *o;
	char *const model[] = {(char *)MODEL, "--", "--hidden", "32", "--depth", "2", NULL};
	for (char *const *o = model; *o; o++)
		a[n++] = *o;
	a[n] = NULL;
	assert_int_equal(h_start(p, a, env), 0);
}

/* kill -9 of one worker (rank 1, and its node's hpulaunch, so that only
 * rank 0 can find it gone) while rank 0 replays the recorded step
 * (`eval`: an evaluation batch's recording): rank 0 ends with an error
 * naming where it found rank 1 gone -- the replayed recording's
 * collective (naming it and which recording), or the ranks' agreement
 * on the next step, whichever rank 0 was waiting in -- and the job ends
 * (no hang) blaming rank 1, never with a bare "node N answered -1". 1
 * where rank 0 found it in the replay. */
static int killed_while_replaying(int eval)
{
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	proc n0, n1;
	start_node(&n0, 0, port, eval);
	start_node(&n1, 1, port, eval);
	pid_t kids[4];
	int ok = eval ? h_wait_for(&n0, "graphs: evaluation: recorded the batch of 1 sample: ",
				   120000) == 0
		      : h_wait_for(&n0, "graphs: step 3: recorded the step of 16 samples: ",
				   120000) == 0 &&
				h_wait_for(&n0, "rank 0: step 5: ", 60000) == 0; /* replaying */
	ok = ok && h_children(n1.pid, kids, 4) == 1;
	if (!ok) {
		fprintf(stderr, "the recording was never replayed:\n%s\n", n0.out ? n0.out : "");
		h_kill(&n0);
		h_kill(&n1);
		h_free(&n0);
		h_free(&n1);
		fail();
	}
	kill(n1.pid, SIGKILL);
	assert_int_equal(kill(kids[0], SIGKILL), 0);
	int e0 = h_wait(&n0, 120000);
	h_wait(&n1, 10000);
	if (e0)
		h_kill(&n0);
	/* rank 0's error: where it found rank 1 gone, the replayed step's
	 * collectives, or the ranks' agreement on the step that comes first */
	const char *rep = n0.out ? strstr(n0.out, "hpu-worker: rank 0: ") : NULL;
	const char *err = n0.out ? strstr(n0.out, "hpulaunch: error: ") : NULL;
	printf("  rank 1 killed while rank 0 replays%s: exit %d\n  %.*s\n  %.*s\n",
	       eval ? " an evaluation batch" : "", e0 ? -1 : h_code(&n0),
	       rep ? (int)strcspn(rep, "\n") : 4, rep ? rep : "none",
	       err ? (int)strcspn(err, "\n") : 4, err ? err : "none");
	if (!rep || !err)
		fprintf(stderr, "node 0:\n%s\n", n0.out ? n0.out : "");
	assert_int_equal(e0, 0);
	assert_int_equal(h_code(&n0), 1);
	assert_non_null(rep);
	const char *replayed =
	    eval ? "hpu-worker: rank 0: --graphs: replaying an evaluation batch's recording failed: "
		 : "hpu-worker: rank 0: --graphs: replaying the recorded step failed: ";
	const char *agreed = "hpu-worker: rank 0: --graphs' agreement failed: ";
	size_t len = strcspn(rep, "\n");
	const char *died = strstr(rep, "rank 1 died or cannot be reached (its connection closed");
	assert_true(died && died < rep + len);
	int in_replay = !strncmp(rep, replayed, strlen(replayed));
	if (in_replay)
		assert_true(strstr(rep, " between the 2 workers (a recording's, replayed) failed: ") <
			    died);
	else if (!eval)
		assert_int_equal(strncmp(rep, agreed, strlen(agreed)), 0);
	if (eval)
		assert_null(strstr(n0.out, "replaying the recorded step failed"));
	assert_null(strstr(n0.out, "answered -1"));
	assert_non_null(err);
	assert_int_equal(strncmp(err, "hpulaunch: error: rank 1 (node 1, pid ", 38), 0);
	assert_non_null(strstr(err, ") died or its node became unreachable; rank 0 found it gone"));
	h_free(&n0);
	h_free(&n1);
	return in_replay;
}

/* Where rank 0 finds the death depends on when the kill lands: a few
 * tries, until one lands in a replayed collective (each checked as it
 * comes; test_capture checks a failing host call's sentence itself). */
static void test_two_workers_killed(void **state)
{
	(void)state;
	int tries = 0;
	while (tries++ < 5 && !killed_while_replaying(0))
		;
	printf("  %d run(s)%s\n", tries > 5 ? 5 : tries,
	       tries > 5 ? ": rank 0 found rank 1 gone at the agreement every time" : "");
}

/* The same while rank 0 replays an evaluation batch's recording (zero3's
 * gathers in it): the error says an evaluation batch's recording, not a
 * training step's. An evaluation has no agreement between the ranks:
 * rank 0 finds rank 1 gone in a collective of its batches (a few tries,
 * until one lands in a replay, not in the evaluation's final sums). */
static void test_two_workers_killed_eval(void **state)
{
	(void)state;
	int tries = 0;
	while (tries++ < 3 && !killed_while_replaying(1))
		;
	assert_true(tries <= 3);
}

/* A model with buffers (resnet's batch norms: their running statistics,
 * averaged over the ranks after each step, HPU_BUFFER_MEAN): the
 * buffers' synchronization is recorded too; evaluation reads those
 * statistics, so the validation figures are eager's bit for bit only
 * where every replay synchronized them. */
static void test_two_workers_buffers(void **state)
{
	(void)state;
	const char *rn = h_build("lib/resnet.so"), *rargs = "--width 4 --blocks 1";
	char ma[512], mb[512];
	snprintf(ma, sizeof ma, "%s/two-rn-eager.jsonl", dir);
	snprintf(mb, sizeof mb, "%s/two-rn-graphs.jsonl", dir);
	char *oa = train("two-rn-eager", 2, "cpu-strict", 0, rn, rargs, "--max-steps", "6",
			 "--eval-every", "3", "--val-fraction", "0.001", "--metrics", ma, NULL);
	char *ob = train("two-rn-graphs", 2, "cpu-strict", 1, rn, rargs, "--max-steps", "6",
			 "--eval-every", "3", "--val-fraction", "0.001", "--metrics", mb, NULL);
	const char *line = strstr(ob, "graphs: step 3: recorded the step of 16 samples: ");
	printf("  2 workers, resnet: %.*s\n", line ? (int)strcspn(line, "\n") : 4,
	       line ? line : "none");
	assert_non_null(line);
	same_validation("two-rn-eager", "two-rn-graphs", 60);
	free(oa);
	free(ob);
}

/* On --device cpu a custom layer's C loops over its buffers (the
 * buffer_model's shift layer updates running_mean and count in each
 * training forward) run while the step is recorded: the recording is
 * refused and the step runs eagerly. What host code changed in device
 * memory during the refused recording is put back first, so the step's
 * buffer update happens once: buffers and parameters are eager's, at 1
 * and 2 workers. (They were updated twice: count 6 after 5 steps.) */
static void test_refused_runs_once(void **state)
{
	(void)state;
	const char *bm = h_build("lib/buffer_model.so");
	for (int w = 1; w <= 2; w++) {
		char name[2][32], bufs[2][128], margs[2][300];
		for (int g = 0; g < 2; g++) {
			snprintf(name[g], sizeof name[g], "once-%d-%s", w, g ? "graphs" : "eager");
			snprintf(bufs[g], sizeof bufs[g], "%s/%s.buffers", dir, name[g]);
			snprintf(margs[g], sizeof margs[g], "--save-buffers %s", bufs[g]);
		}
		char *o[2];
		for (int g = 0; g < 2; g++)
			o[g] = train(name[g], w, "cpu", g, bm, margs[g], "--max-steps", "5", "--no-eval",
				     NULL);
		const char *why = strstr(o[1], "graphs: step 3: the step of ");
		printf("  %d worker%s: %.*s\n", w, w > 1 ? "s" : "", why ? 110 : 4,
		       why ? why : "none");
		assert_non_null(why);
		assert_non_null(strstr(why, "is not recorded: host code touched device memory"));
		size_t na = 0, nb = 0;
		char *a = h_slurp_n(bufs[0], &na), *b = h_slurp_n(bufs[1], &nb);
		assert_non_null(a);
		assert_non_null(b);
		assert_true(na == nb && na > 0 && memcmp(a, b, na) == 0);
		free(a);
		free(b);
		char pa[512], pb[512]; /* same_file's, for a file of 4 parameters */
		snprintf(pa, sizeof pa, "%s/%s.bin", dir, name[0]);
		snprintf(pb, sizeof pb, "%s/%s.bin", dir, name[1]);
		a = h_slurp_n(pa, &na);
		b = h_slurp_n(pb, &nb);
		assert_true(a && b && na == nb && na > 0 && memcmp(a, b, na) == 0);
		free(a);
		free(b);
		free(o[0]);
		free(o[1]);
	}
}

static int setup(void **state)
{
	(void)state;
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	h_rmtree(dir);
	return 0;
}

/* zero3 at 2 workers validating on 33 samples, 16 a micro-batch: rank 0
 * holds 17 (two batches), rank 1 16 (one). zero3's forward gathers the
 * parameters between the ranks, so rank 1 runs a forward more whose rows
 * are not counted: eager and --graphs validate on the 33 samples alike
 * (the ranks met different collectives and the run failed). */
static void test_two_workers_zero3_eval(void **state)
{
	(void)state;
	char m[2][512];
	const char *name[2] = {"two-z3-val-eager", "two-z3-val-graphs"};
	char *o[2], *v[2];
	for (int g = 0; g < 2; g++) {
		snprintf(m[g], sizeof m[g], "%s/%s.jsonl", dir, name[g]);
		o[g] = train(name[g], 2, "cpu-strict", g, NULL, NULL, "--strategy", "zero3",
			     "--param-persistence-threshold", "0", "--max-steps", "4",
			     "--eval-every", "2", "--val-fraction", "0.00055", "--metrics", m[g],
			     "--graphs-warmup", "1", NULL);
		v[g] = val_lines(name[g]);
	}
	printf("  zero3 2 workers, 33 held out: %.*s\n", (int)strcspn(v[1], "\n"), v[1]);
	assert_int_equal(number_after(v[0], "\"val_samples\":"), 33);
	assert_string_equal(v[0], v[1]);
	assert_non_null(strstr(o[1], "graphs: evaluation: recorded the batch of 16 samples: "));
	assert_true(same_file(name[0], name[1]));
	for (int g = 0; g < 2; g++) {
		free(o[g]);
		free(v[g]);
	}
}

/* zero3 at 2 workers with --offload-param nvme, validating: a unit's
 * piece is read from its file for each gather, host work a recording
 * does not repeat, so an evaluation batch is not recorded (said with the
 * reason) and validates as eagerly (the replays gathered the pieces read
 * when recording: the parameters of before the training steps since). */
static void test_nvme_eval_refused(void **state)
{
	(void)state;
	/* the tier refuses tmpfs (memory): then under the build tree */
	struct statfs fs;
	int tmpfs = statfs(dir, &fs) == 0 && fs.f_type == 0x01021994;
	char m[2][512], nv[2][512];
	const char *name[2] = {"two-nvme-val-eager", "two-nvme-val-graphs"};
	char *o[2], *v[2];
	for (int g = 0; g < 2; g++) {
		snprintf(m[g], sizeof m[g], "%s/%s.jsonl", dir, name[g]);
		snprintf(nv[g], sizeof nv[g], "%s/nvme-%d.XXXXXX", tmpfs ? h_build("") : dir, g);
		assert_non_null(mkdtemp(nv[g]));
		o[g] = train(name[g], 2, "cpu", g, NULL, NULL, "--strategy", "zero3",
			     "--param-persistence-threshold", "0", "--offload-param", "nvme",
			     "--nvme-path", nv[g], "--max-steps", "4", "--eval-every", "2",
			     "--val-fraction", "0.00102", "--metrics", m[g], "--graphs-warmup", "1",
			     NULL);
		v[g] = val_lines(name[g]);
		h_rmtree(nv[g]);
	}
	const char *why = strstr(o[1], "graphs: evaluation: the batch of 16 samples is not recorded: ");
	printf("  nvme: %.*s\n", why ? (int)strcspn(why, "\n") : 4, why ? why : "none");
	assert_string_equal(v[0], v[1]);
	assert_non_null(why);
	assert_non_null(strstr(why, "--offload-param nvme"));
	for (int g = 0; g < 2; g++) {
		free(o[g]);
		free(v[g]);
	}
}

/* --device cpu --graphs records on the kernels-only table (--verbose says
 * so; no warning) and replays to eager's parameters across the matrix:
 * the strategies, 16-mixed's skipped step, a resume, an evaluation, and at
 * 2 workers (their collectives host calls of the list). Its eager
 * parameters are cpu-strict's too (the same bytes). */
static void test_cpu_records(void **state)
{
	(void)state;
	char *o = train("cpu-note", 1, "cpu", 1, NULL, NULL, "--max-steps", "4", NULL);
	const char *w = strstr(o, "--graphs: ");
	printf("  cpu: %.*s\n", w ? (int)strcspn(w, "\n") : 4, w ? w : "none");
	assert_non_null(strstr(o, "rank 0: --graphs: the ops run on the kernels-only table "
				  "(cpu-strict's without its memory protection), and a step is "
				  "recorded once and replayed\n"));
	assert_null(strstr(o, "evaluation batches run eagerly"));
	assert_non_null(strstr(o, "graphs: step 3: recorded the step of 32 samples: "));
	long replayed, recorded, eager;
	replays(o, &replayed, &recorded, &eager);
	assert_int_equal(recorded, 1);
	assert_int_equal(replayed, 2);
	assert_int_equal(eager, 2);
	free(o);
	strategies_fp32("cpu");
	strategies_bf16("cpu");
	same_with_graphs("cpu", "fp16", 7, 1, "fast_ddp", "16-mixed", "5");
	resume_on("cpu", "bf16-mixed");
	evaluation_on("cpu");
	/* 2 workers: their collectives recorded as host calls there too */
	two_workers_on("cpu", "two-fp32", "fast_ddp", "fp32", 6, 0, NULL);
	two_workers_on("cpu", "two-bf16", "zero3", "bf16-mixed", 6, 0, NULL);
	/* where the cpu-strict matrix ran in this program: the same bytes */
	char strict[96];
	snprintf(strict, sizeof strict, "%s/cpu-strict-fp32-zero3-eager.bin", dir);
	if (access(strict, R_OK) == 0)
		assert_true(same_file("cpu-fp32-zero3-graphs", "cpu-strict-fp32-zero3-eager"));
}

/* The device calls of a recorded step (its verbose line's "N device
 * calls") of `model` at batch size `batch` in `precision`. */
static long step_calls(const char *name, const char *model, const char *margs,
		       const char *precision, const char *batch)
{
	char *o = train(name, 1, "cpu", 1, model, margs, "--max-steps", "4", "--precision",
			precision, "--batch-size", batch, NULL);
	char want[96];
	snprintf(want, sizeof want, "recorded the step of %s samples: ", batch);
	const char *line = strstr(o, want);
	long calls = line ? strtol(line + strlen(want), NULL, 10) : -1;
	printf("  %s: %ld device calls\n", name, calls);
	assert_non_null(line);
	free(o);
	return calls;
}

/* A step's device calls (a GPU's kernel launches) do not grow with the
 * batch or the model's width: each op is one call over its tensors, not
 * one per sample, head or chunk. (Fewer may: a gradient's zeroing of
 * what its op does not write is no call where the op writes it all.) GPT-2's step on an H200 spent 0.2 s in
 * 37,728 launches widening its token table 1024 values at a time, and
 * 192 per attention product rounding one head at a time (found by
 * counting these calls on the CPU). */
static void test_calls_independent_of_size(void **state)
{
	(void)state;
	char *gpt = strdup(h_build("lib/gpt_lm.so")), *cnn = strdup(h_build("lib/fmnist_cnn.so")),
	     *mlp = strdup(MODEL);
	static const char *const precs[] = {"fp32", "bf16-mixed"};
	for (int p = 0; p < 2; p++) {
		char a[64], b[64];
		snprintf(a, sizeof a, "calls-gpt-small-%s", precs[p]);
		snprintf(b, sizeof b, "calls-gpt-large-%s", precs[p]);
		long small = step_calls(a, gpt, "--dim 32 --heads 2 --layers 1 --ctx 16 --gen 0",
					precs[p], "4");
		long large = step_calls(b, gpt, "--dim 256 --heads 8 --layers 1 --ctx 16 --gen 0",
					precs[p], "16");
		assert_true(large <= small);
		snprintf(a, sizeof a, "calls-mlp-small-%s", precs[p]);
		snprintf(b, sizeof b, "calls-mlp-large-%s", precs[p]);
		small = step_calls(a, mlp, "--hidden 32 --depth 2", precs[p], "4");
		large = step_calls(b, mlp, "--hidden 512 --depth 2", precs[p], "16");
		assert_true(large <= small);
		snprintf(a, sizeof a, "calls-cnn-small-%s", precs[p]);
		snprintf(b, sizeof b, "calls-cnn-large-%s", precs[p]);
		small = step_calls(a, cnn, "--channels 4,8 --hidden 16", precs[p], "4");
		large = step_calls(b, cnn, "--channels 16,32 --hidden 128", precs[p], "16");
		assert_true(large <= small);
	}
	free(gpt), free(cnn), free(mlp);
}

/* fp8 training records: its scaling state lives on the device (a
 * tensor's amax and a new call site's first scale taken by a kernel, the
 * quantization reading the scale when it runs, the roll after the step),
 * so nothing comes back to the host inside a step. Before, no fp8 step
 * was recorded ("the kernel amax writes host memory (its argument
 * amax)"). At 1 worker (2 micro-steps, clipping, a schedule) and at 2
 * (the step's amax reduced over the ranks between the replays), gpt_lm
 * with its dropout (fp8 linears, bf16 attention), and a checkpoint
 * resumed under --graphs: eager's parameters, bit for bit. */
static void test_fp8_recorded(void **state)
{
	(void)state;
	same_with_graphs("cpu-strict", "fp8", 6, 0, "fast_ddp", "fp8", NULL);
	two_workers("two-fp8", "zero1", "fp8", 6, 0, NULL);
	free(gpt_dropout("cpu-strict", 1, "fp8"));
	resume_on("cpu-strict", "fp8");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_strategies_fp32), cmocka_unit_test(test_strategies_bf16),
	    cmocka_unit_test(test_overflow_skipped), cmocka_unit_test(test_warmup_zero),
	    cmocka_unit_test(test_one_micro_step),
	    cmocka_unit_test(test_many_micro_steps),
	    cmocka_unit_test(test_bce_logits_recorded),
	    cmocka_unit_test(test_resume),
	    cmocka_unit_test(test_dropout_recorded), cmocka_unit_test(test_refusals),
	    cmocka_unit_test(test_step_values_refused),
	    cmocka_unit_test(test_offload_refused), cmocka_unit_test(test_cpu_host_code_refused),
	    cmocka_unit_test_teardown(test_cpu_kernel_refused, unset_backend),
	    cmocka_unit_test(test_evaluation), cmocka_unit_test(test_eval_only),
	    cmocka_unit_test(test_evaluation_refused), cmocka_unit_test(test_cpu_records),
	    cmocka_unit_test(test_calls_independent_of_size),
	    cmocka_unit_test(test_two_workers_fp32), cmocka_unit_test(test_two_workers_bf16),
	    cmocka_unit_test(test_two_workers_overflow), cmocka_unit_test(test_two_workers_killed),
	    cmocka_unit_test(test_two_workers_killed_eval),
	    cmocka_unit_test(test_two_workers_refused),
	    cmocka_unit_test(test_two_workers_one_refuses),
	    cmocka_unit_test(test_two_workers_one_unbegun),
	    cmocka_unit_test(test_two_workers_buffers),
	    cmocka_unit_test(test_refused_runs_once),
	    cmocka_unit_test(test_two_workers_zero3_eval),
	    cmocka_unit_test(test_nvme_eval_refused),
	    cmocka_unit_test(test_fp8_recorded),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
