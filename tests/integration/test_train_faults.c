/* A training run that cannot write what it was asked to, or whose loss
 * stays non-finite, fails the job (hpulaunch exits 1) with a sentence that
 * says why -- never exit 0 with a short file or a diverged model:
 *
 * - --metrics /dev/full (every write: ENOSPC): the step records, the
 *   final record alone, a checkpoint's report (the run stops there: no
 *   later checkpoint), a resumed run's report (no step trained);
 * - --save-params into a link to /dev/full, with a whole and a sharded
 *   strategy (the link stays a link: written through, never renamed over);
 *   into a link to a regular file: the file written, the link kept;
 * - a model whose loss turns NaN, +Inf or -Inf from its third step on
 *   (the fixture bad_loss.so): each such step is skipped on every rank and
 *   said, and --max-skipped-steps of them in a row stop the job, naming
 *   the steps; a NaN at one step only (on one rank) is skipped and
 *   training goes on; a negative or any finite loss trains (a loss value
 *   is no error channel); the step's line names the rank, micro-step,
 *   layer and tensor of the first non-finite value, and (the fixture
 *   bad_linear.so: a linear layer's weight turns +Inf, a ReLU after it)
 *   the last tensor before it that was freed after forward, not checked;
 * - blame (bad_loss.so's --hang-* and --exit-*, a 2 s collective timeout):
 *   a rank that freezes in its third forward, or in its setup, is the
 *   rank hpulaunch's error names, with where it was, not the rank that
 *   gave up waiting for it; the others' errors name it too; a rank that
 *   calls exit(0) in setup or in its third forward is named with the step
 *   it was in.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/integration/runlib.h"

#define BAD_LOSS h_build("lib/bad_loss.so")
#define BAD_LINEAR h_build("lib/bad_linear.so")
#define NOSPACE "No space left on device"

static char T[256]; /* the test's temporary directory */

static const char *path(const char *rel)
{
	static char bufs[8][600];
	static int k;
	char *p = bufs[k++ & 7];
	snprintf(p, sizeof bufs[0], "%s/%s", T, rel);
	return p;
}

static int exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

static void has(const char *out, const char *needle)
{
	if (!strstr(out, needle))
		fail_msg("output does not say \"%s\":\n%s", needle, out);
}

static int setup(void **state)
{
	(void)state;
	const char *t = getenv("TMPDIR");
	snprintf(T, sizeof T, "%s/test_train_faults.XXXXXX", t && *t ? t : "/tmp");
	return mkdtemp(T) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	h_rmtree(T);
	return 0;
}

/* ---- --metrics ---- */

/* A disk that fills while the metrics file grows (a 64 KiB tmpfs, a
 * record every step): the run fails naming the file, and the file ends
 * with its last whole record (it ended in the middle of one). */
static void test_metrics_disk_fills(void **state)
{
	(void)state;
	char mnt[300], file[340];
	snprintf(mnt, sizeof mnt, "%s/small-fs", T);
	snprintf(file, sizeof file, "%s/m.jsonl", mnt);
	mkdir(mnt, 0755);
	if (mount("tmpfs", mnt, "tmpfs", 0, "size=64k") != 0) {
		if (geteuid() != 0) {
			printf("  not root: no tmpfs can be mounted; skipped\n");
			skip();
		}
		fail_msg("mount tmpfs on %s failed", mnt);
	}
	run r;
	start(&r, 2);
	args(&r, "--max-steps", "2000", "--log-every", "1", "--metrics", file, NULL);
	char *out = finish(&r, 1, NULL);
	size_t n = 0;
	char *text = h_slurp_n(file, &n);
	umount(mnt);
	char says[400];
	snprintf(says, sizeof says, "cannot write the metrics file %s: " NOSPACE, file);
	has(out, says);
	free(out);
	assert_non_null(text);
	printf("  the metrics file: %zu bytes, ends with \"%.20s\"\n", n,
	       n > 20 ? text + n - 20 : text);
	assert_true(n > 1000);
	assert_true(text[n - 1] == '\n' && text[n - 2] == '}');
	free(text);
}

static void test_metrics_full_disk(void **state)
{
	(void)state;
	const char *says = "cannot write the metrics file /dev/full: " NOSPACE;
	run r;
	/* a record every step */
	start(&r, 2);
	args(&r, "--max-steps", "2", "--log-every", "1", "--metrics", "/dev/full", NULL);
	char *out = finish(&r, 1, NULL);
	has(out, says);
	free(out);
	/* only the final record */
	start(&r, 2);
	args(&r, "--max-steps", "2", "--metrics", "/dev/full", NULL);
	out = finish(&r, 1, NULL);
	has(out, says);
	free(out);
}

static void test_metrics_full_disk_checkpoints(void **state)
{
	(void)state;
	const char *says = "cannot write the metrics file /dev/full: " NOSPACE;
	const char *ck = path("ck");
	char step2[700];
	snprintf(step2, sizeof step2, "%s/step-00000002", ck);
	/* the report of step 1's checkpoint cannot be written: the job
	 * stops there, before step 2's checkpoint */
	run r;
	start(&r, 2);
	args(&r, "--max-steps", "2", "--checkpoint-dir", ck, "--checkpoint-every", "1",
	     "--metrics", "/dev/full", NULL);
	char *out = finish(&r, 1, NULL);
	has(out, says);
	assert_false(exists(step2));
	free(out);
	/* a run resumed from step 1: its load report fails it before a step */
	start(&r, 2);
	args(&r, "--max-steps", "2", "--checkpoint-dir", ck, "--checkpoint-every", "1",
	     "--resume", "auto", "--metrics", "/dev/full", NULL);
	out = finish(&r, 1, NULL);
	has(out, "resume: 2 ranks verified");
	has(out, says);
	assert_false(exists(step2));
	free(out);
	/* the same with a metrics file it can write trains on */
	start(&r, 2);
	args(&r, "--max-steps", "2", "--checkpoint-dir", ck, "--checkpoint-every", "1",
	     "--resume", "auto", "--metrics", path("m.jsonl"), NULL);
	free(finish(&r, 0, NULL));
	assert_true(exists(step2));
	char *m = h_slurp(path("m.jsonl"));
	assert_non_null(m);
	has(m, "\"checkpoint\":\"loaded\"");
	has(m, "\"final\":true");
	free(m);
}

/* ---- --save-params ---- */

static void test_save_params_full_disk(void **state)
{
	(void)state;
	const char *full = path("full");
	assert_int_equal(symlink("/dev/full", full), 0);
	const char *strategies[] = {"fast_ddp", "zero3"};
	for (int i = 0; i < 2; i++) {
		run r;
		start(&r, 2);
		args(&r, "--max-steps", "1", "--strategy", strategies[i], "--save-params", full,
		     NULL);
		char *out = finish(&r, 1, NULL);
		has(out, full);
		has(out, NOSPACE);
		free(out);
		struct stat st;
		assert_int_equal(lstat(full, &st), 0);
		assert_true(S_ISLNK(st.st_mode));
	}
	/* a link to a regular file: the file gets the parameters, the link
	 * stays */
	const char *link = path("link.bin");
	assert_int_equal(h_write_file(path("target.bin"), "old", 0644), 0);
	assert_int_equal(symlink("target.bin", link), 0);
	run r;
	start(&r, 2);
	args(&r, "--max-steps", "1", "--save-params", link, NULL);
	free(finish(&r, 0, NULL));
	struct stat st;
	assert_int_equal(lstat(link, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	size_t n;
	free(load_params(path("target.bin"), &n));
	assert_int_equal(n, 1863690); /* the MLP's parameters */
}

/* ---- the loss ---- */

/* Trains bad_loss.so 16 samples a step: hpulaunch -q --no-eval
 * --log-every 1 --devices `devices` --max-steps `steps`, then `opts`
 * (launcher options, space-separated, or NULL) and the model's `margs`;
 * asserts the exit code and returns the output. */
static char *train_bad_loss(int want, int devices, const char *steps, const char *opts,
			    const char *margs)
{
	run r;
	char buf[256];
	start(&r, devices);
	args(&r, "--log-every", "1", "--batch-size", "16", "--max-steps", steps, NULL);
	snprintf(buf, sizeof buf, "%s", opts ? opts : "");
	for (char *t = strtok(buf, " "); t; t = strtok(NULL, " "))
		arg(&r, t);
	return finish_with(&r, want, BAD_LOSS, margs);
}

static void lacks(const char *out, const char *needle)
{
	if (strstr(out, needle))
		fail_msg("output says \"%s\":\n%s", needle, out);
}

/* The number after "final loss " in out (NaN when there is none). */
static double final_loss(const char *out)
{
	const char *l = strstr(out, "final loss ");
	return l ? strtod(l + 11, NULL) : NAN;
}

/* ---- the dataset ---- */

/* A sample whose fetch fails (on the loader's thread, a batch ahead of
 * the step): the job ends with an error naming the sample, eagerly and
 * under --graphs (whose replays read the loader's buffer), at 1 and 2
 * workers; nothing trains past it. */
static void test_fetch_fails(void **state)
{
	(void)state;
	static const char *const opts[] = {NULL, "--graphs --graphs-warmup 1"};
	for (int devices = 1; devices <= 2; devices++)
		for (size_t k = 0; k < sizeof opts / sizeof *opts; k++) {
			char *out = train_bad_loss(1, devices, "40", opts[k], "--loss 0.5 --fail-fetch 100");
			has(out, "the model's dataset failed to fetch sample 100 of its training split "
				 "(its fetch returned non-zero)");
			lacks(out, "trained 40 steps");
			free(out);
		}
}

/* A layer's hpu_layer_memory sizes whose bytes wrap a size_t at the
 * batch (or that come near it) are refused at setup, naming the layer
 * and what it asked: they wrapped to a 0-byte block and the job trained,
 * the layer's saved or scratch memory then nothing it could write. */
static void test_layer_memory_too_large(void **state)
{
	(void)state;
	char *out = train_bad_loss(1, 1, "2", NULL, "--to 0 --saved-per 0x1000000000000000");
	assert_non_null(strstr(out, "layer loss: its saved memory (hpu_layer_memory: "
				    "1152921504606846976 floats a sample at a batch of up to 16, "
				    "and 0 more) is more than a size can hold"));
	free(out);
	out = train_bad_loss(1, 1, "2", NULL, "--to 0 --scratch-fixed 0x4000000000000000");
	assert_non_null(strstr(out, "layer loss: its scratch memory (hpu_layer_memory: 0 floats "
				    "a sample at a batch of up to 16, and 4611686018427387904 "
				    "more) is more than a size can hold"));
	free(out);
	out = train_bad_loss(0, 1, "2", NULL, "--to 0 --saved-per 100");
	assert_non_null(strstr(out, "trained 2 steps"));
	free(out);
}

/* A non-finite loss (NaN, +Inf, -Inf) from step 3 on: steps 3 and 4 are
 * skipped, each said, and --max-skipped-steps 2 stops the job there,
 * naming the steps and the option; step 5 never comes. */
static void test_nonfinite_loss_stops(void **state)
{
	(void)state;
	static const char *bad[] = {"nan", "inf", "-inf"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char margs[64];
		snprintf(margs, sizeof margs, "--loss %s --from 3", bad[i]);
		/* one worker: with two, the other rank's exit can end rank 0
		 * before its lines are out */
		char *out = train_bad_loss(1, 1, "5", "--max-skipped-steps 2", margs);
		has(out, "step 2/5 loss "); /* the first two steps were fine */
		has(out, "step 3: non-finite loss or gradients: step skipped on every rank "
			 "(1 in a row)");
		has(out, "step 4: non-finite loss or gradients: step skipped on every rank "
			 "(2 in a row)");
		has(out, "2 steps in a row (steps 3 to 4) had a non-finite loss or gradients "
			 "(NaN or Inf) and were skipped: the run diverged (--max-skipped-steps 2)");
		lacks(out, "step 5/5");
		lacks(out, "trained 5 steps");
		free(out);
	}
	/* the default: 5 in a row */
	char *out = train_bad_loss(1, 1, "10", NULL, "--loss nan --from 3");
	has(out, "step 6/10 loss ");
	has(out, "5 steps in a row (steps 3 to 7) had a non-finite loss or gradients (NaN or "
		 "Inf) and were skipped: the run diverged (--max-skipped-steps 5)");
	lacks(out, "step 8/10");
	free(out);
}

/* 16-mixed's dynamic scale, every step's loss NaN, hysteresis 1, the
 * minimum a quarter of the first scale: steps 1 and 2 are the scaler's
 * (they ran at 65536 and 32768), steps 3 to 5 ran at the minimum and
 * count. Step 2, which brought the scale down to the minimum, counted
 * too ("steps 2 to 4"), which DeepSpeed's raise_error_at_min_scale does
 * not. */
static void test_min_scale_counts_from_it(void **state)
{
	(void)state;
	char *out = train_bad_loss(1, 1, "12",
				   "--precision 16-mixed --hysteresis 1 --min-loss-scale 16384 "
				   "--max-skipped-steps 3",
				   "--loss nan --from 1 --to 99");
	has(out, "loss scale 32768 -> 16384");
	has(out, "3 steps in a row (steps 3 to 5) had a non-finite loss or gradients");
	free(out);
	/* the metrics file ends with the stop and its counts, also where no
	 * step was logged (it was empty: no final record for a failed run) */
	const char *metrics = path("diverged.jsonl");
	char opts[700];
	snprintf(opts, sizeof opts, "--precision 16-mixed --hysteresis 1 --min-loss-scale 16384 "
				    "--max-skipped-steps 3 --log-every 0 --metrics %s", metrics);
	out = train_bad_loss(1, 1, "12", opts, "--loss nan --from 1 --to 99");
	free(out);
	char *m = h_slurp(metrics);
	assert_non_null(m);
	printf("  %s", m);
	assert_non_null(strstr(m, "{\"step\":5,\"stopped\":\"diverged\",\"nonfinite_steps_in_a_row\":3,"
				  "\"nonfinite_steps_skipped\":3,\"skipped_steps\":5}\n"));
	free(m);
	unlink(metrics);
}

/* A static loss scale too large for fp16 overflows every step: the
 * error names --loss-scale (it advised a lower learning rate only). */
static void test_static_scale_overflows(void **state)
{
	(void)state;
	char *out = train_bad_loss(1, 1, "12", "--precision 16-mixed --loss-scale 1e30 --max-skipped-steps 3",
				   NULL);
	has(out, "3 steps in a row (steps 1 to 3) had a non-finite loss or gradients (NaN or Inf) "
		 "and were skipped: the run diverged (--max-skipped-steps 3); the static --loss-scale "
		 "1e+30 may overflow fp16's gradients");
	free(out);
}

/* A NaN loss at step 3 only, and on rank 1 only: rank 0 says the step
 * was skipped on every rank, training goes on to the end with finite
 * losses (nobody applied the NaN gradients), and the final line and
 * record count the skipped step. */
static void test_nonfinite_loss_one_step(void **state)
{
	(void)state;
	const char *metrics = path("skip.jsonl");
	char opts[700];
	snprintf(opts, sizeof opts, "--metrics %s", metrics);
	char *out = train_bad_loss(0, 2, "5", opts, "--loss nan --from 3 --to 3 --rank 1");
	has(out, "[rank 0] step 3: non-finite loss or gradients: step skipped on every rank "
		 "(1 in a row)");
	lacks(out, "(2 in a row)");
	has(out, "step 3/5 loss nan");
	has(out, "step 5/5 loss ");
	has(out, "trained 5 steps on 2 workers");
	double l = final_loss(out);
	if (!isfinite(l))
		fail_msg("the final loss is not finite:\n%s", out);
	const char *said = strstr(out, "skipped for a non-finite loss or gradients");
	const char *bol = said;
	while (bol && bol > out && bol[-1] != '\n')
		bol--;
	if (!said || !strstr(bol, "] 1 step") || strstr(bol, "] 1 step") > said)
		fail_msg("the final lines do not say 1 step was skipped:\n%s", out);
	char *m = h_slurp(metrics);
	assert_non_null(m);
	const char *fin = strstr(m, "\"final\":true");
	assert_non_null(fin);
	const char *key = "\"nonfinite_steps_skipped\":", *k = strstr(fin, key);
	if (!k || strtol(k + strlen(key), NULL, 10) != 1)
		fail_msg("the final record does not count 1 skipped step:\n%s", fin);
	free(m);
	free(out);
}

/* A NaN loss whose layer's backward does not read dout (bad_loss
 * --no-dout): no gradient carries the loss's NaN seed, yet the step is
 * skipped on every rank, at 1 worker and where rank 1's loss alone is
 * NaN at 2. (It trained on with loss nan, nothing skipped, exit 0.) */
static void test_nonfinite_loss_no_dout(void **state)
{
	(void)state;
	for (int devices = 1; devices <= 2; devices++) {
		char *out = train_bad_loss(0, devices, "5", NULL,
					   devices == 1 ? "--loss nan --from 3 --to 3 --no-dout"
							: "--loss nan --from 3 --to 3 --rank 1 "
							  "--no-dout");
		has(out, "step 3: non-finite loss or gradients: step skipped on every rank "
			 "(1 in a row)");
		has(out, "step 5/5 loss ");
		if (!isfinite(final_loss(out)))
			fail_msg("the final loss is not finite:\n%s", out);
		free(out);
	}
}

/* A loss is not an error channel: a negative one (-1) and any finite one
 * train on to the end, nothing skipped. */
static void test_finite_losses_train(void **state)
{
	(void)state;
	static const struct {
		const char *loss, *final;
	} ok[] = {
		{"-1", "final loss -1.0000"},
		{"0.25", "final loss 0.2500"},
	};
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		char margs[64];
		snprintf(margs, sizeof margs, "--loss %s --from 3", ok[i].loss);
		char *out = train_bad_loss(0, 2, "5", NULL, margs);
		has(out, "trained 5 steps on 2 workers");
		has(out, ok[i].final);
		lacks(out, "skipped");
		lacks(out, "non-finite");
		free(out);
	}
}

/* The first non-finite value, where it is: the loss layer's own output
 * when only the loss goes bad, fc's output "y" when it is fc's output that
 * went bad first (the loss computed from it) -- on rank 1, which alone
 * had it. */
static void test_nonfinite_first_named(void **state)
{
	(void)state;
	char *out = train_bad_loss(0, 2, "4", NULL, "--loss nan --from 3 --to 3 --rank 1");
	has(out, "step 3: non-finite loss or gradients: step skipped on every rank (1 in a row); "
		 "first non-finite value: rank 1, micro-step 1 of 1, output \"loss\" of layer "
		 "\"loss\" (8 of 8 values)");
	free(out);
	out = train_bad_loss(0, 2, "4", "--grad-accum 2",
			     "--loss inf --from 4 --to 4 --rank 1 --in-y");
	has(out, "step 2: non-finite loss or gradients: step skipped on every rank (1 in a row); "
		 "first non-finite value: rank 1, micro-step 2 of 2, output \"y\" of layer \"fc\" "
		 "(1 of 8 values)");
	free(out);
}

/* A linear layer's weight turns +Inf (the fixture bad_linear): its output
 * "h", which only the ReLU after it reads and no backward does, was freed
 * after forward, so the first value found is the ReLU's output "r"; the
 * sentence says that "h", before it, was not checked, naming it, and how
 * many more were not. */
static void test_nonfinite_unchecked_named(void **state)
{
	(void)state;
	run r;
	start(&r, 1);
	args(&r, "--log-every", "1", "--batch-size", "16", "--max-steps", "3", NULL);
	char *out = finish_with(&r, 0, BAD_LINEAR, "--value inf --at 3");
	has(out, "step 3: non-finite loss or gradients: step skipped on every rank (1 in a row); "
		 "first non-finite value: rank 0, micro-step 1 of 1, output \"r\" of layer "
		 "\"relu\" (16 of 128 values); not checked: output \"h\" of layer \"fc\", "
		 "which was not kept after forward\n");
	free(out);
	/* two linear layers and sigmoids before fc: their outputs "p1", "p2" were
	 * not kept either, and are counted */
	start(&r, 1);
	args(&r, "--log-every", "1", "--batch-size", "16", "--max-steps", "3", NULL);
	out = finish_with(&r, 0, BAD_LINEAR, "--at 3 --pre 2");
	has(out, "(16 of 128 values); not checked: output \"h\" of layer \"fc\" and 2 earlier "
		 "tensors, which were not kept after forward\n");
	free(out);
}

/* 3 ranks with an 8 s collective timeout, one of which misbehaves as
 * bad_loss's margs say; returns the output (exit `want`). (2 s timed out
 * a healthy rank delayed on a loaded machine, before the misdeed.) */
static char *misbehave(int want, const char *margs)
{
	setenv("HPUCOLL_TIMEOUT_MS", "8000", 1);
	run r;
	start(&r, 3);
	args(&r, "--batch-size", "24", "--max-steps", "20", NULL);
	char *out = finish_with(&r, want, BAD_LOSS, margs);
	unsetenv("HPUCOLL_TIMEOUT_MS");
	return out;
}

/* The line of `out` that starts with `prefix` (a copy), or fails. */
static char *line_of(const char *out, const char *prefix)
{
	for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
		if (!strncmp(p, prefix, strlen(prefix)))
			return strndup(p, strcspn(p, "\n"));
	fail_msg("no line starts \"%s\":\n%s", prefix, out);
	return NULL;
}

/* A forward that never returns hangs the job with no collective left
 * waiting for a missing peer long enough to say so: --hang-warning X
 * says, once a piece of work, that the step has run X s and where each
 * rank is (rank 0 in its loss layer's forward, rank 1 waiting for it);
 * nothing was said before. The job is then ended by the test. */
static void test_hang_warning(void **state)
{
	(void)state;
	proc p;
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--batch-size", "16", "--max-steps",
			"5", "--no-eval", "--hang-warning", "1", (char *)BAD_LOSS, "--", "--to",
			"0", "--hang-rank", "0", "--hang-at", "2", NULL};
	assert_int_equal(h_start(&p, argv, NULL), 0);
	int seen0 = h_wait_for(&p, "[rank 0] hpu-worker: rank 0: warning: step 2 has run for ",
			       120000);
	int seen1 = h_wait_for(&p, "[rank 1] hpu-worker: rank 1: warning: step 2 has run for ",
			       60000);
	printf("%s", p.out ? p.out : "");
	const char *w0 = p.out ? strstr(p.out, "[rank 0] hpu-worker: rank 0: warning: ") : NULL;
	char *line = w0 ? strndup(w0, strcspn(w0, "\n")) : NULL;
	h_kill(&p);
	assert_int_equal(seen0, 0);
	assert_int_equal(seen1, 0);
	assert_non_null(line);
	const char *ran = strstr(line, "has run for ");
	assert_non_null(ran);
	char want[200];
	snprintf(want, sizeof want,
		 "has run for %ld s (--hang-warning 1), in layer loss's forward: a piece of work "
		 "that long, or a hang; `gdb -p ",
		 strtol(ran + 12, NULL, 10));
	assert_non_null(strstr(line, want));
	free(line);
}

/* Rank 1 freezes in its third forward, then in its setup: hpulaunch's
 * error names rank 1 and where it stopped, not rank 0, which gave up
 * waiting; the other ranks' own errors name rank 1 (rank 0 did not wait
 * for it directly in the ring: found by the probe before the timeout). */
static void test_frozen_rank_blamed(void **state)
{
	(void)state;
	static const struct {
		const char *margs, *where;
	} cases[] = {
		{"--to 0 --hang-rank 1 --hang-at 3", "stopped answering in step 3 of 20; rank "},
		{"--to 0 --hang-rank 1 --hang-at 0",
		 "stopped answering during setup, before step 1 of 20; rank "},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *out = misbehave(1, cases[i].margs);
		char *err = line_of(out, "hpulaunch: error: ");
		printf("  %s: %s\n", cases[i].margs, err);
		if (strncmp(err, "hpulaunch: error: rank 1 (node 0, pid ", 38) ||
		    !strstr(err, cases[i].where) ||
		    (!strstr(err, "; rank 0 gave up waiting for it") &&
		     !strstr(err, "; rank 2 gave up waiting for it")))
			fail_msg("the error does not blame rank 1 %s:\n%s", cases[i].where, out);
		/* every rank that says why it ended names rank 1 (rank 0 may
		 * be ended by the launcher before its own timeout on a busy
		 * machine, once rank 2 gave up: then it says nothing) */
		int said = 0;
		for (int k = 0; k <= 2; k += 2) {
			char pre[64];
			snprintf(pre, sizeof pre, "[rank %d] hpu-worker: rank %d: ", k, k);
			const char *p = strstr(out, pre);
			if (!p)
				continue;
			char *rk = strndup(p, strcspn(p, "\n"));
			if (!strstr(rk, "rank 1 stopped answering") && !strstr(rk, "no data from rank 1 "))
				fail_msg("rank %d's error does not name rank 1:\n%s", k, out);
			free(rk);
			said++;
		}
		if (!said)
			fail_msg("neither rank 0 nor rank 2 says why it ended:\n%s", out);
		free(err);
		free(out);
	}
}

/* Rank 1 calls exit(0) in its setup, then in its third forward: the error
 * says where, of the 20 steps asked for. */
static void test_exit_step_named(void **state)
{
	(void)state;
	static const struct {
		const char *margs, *where;
	} cases[] = {
		{"--to 0 --exit-rank 1 --exit-at 0", "(during setup, before step 1 of 20)"},
		{"--to 0 --exit-rank 1 --exit-at 3", "(in step 3 of 20)"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *out = misbehave(1, cases[i].margs);
		char *err = line_of(out, "hpulaunch: error: ");
		printf("  %s: %s\n", cases[i].margs, err);
		if (strncmp(err, "hpulaunch: error: rank 1 (node 0, pid ", 38) ||
		    !strstr(err, " exited with code 0 before the job ended ") ||
		    !strstr(err, cases[i].where))
			fail_msg("the error does not say %s:\n%s", cases[i].where, out);
		free(err);
		free(out);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_metrics_full_disk),
	    cmocka_unit_test(test_metrics_disk_fills),
	    cmocka_unit_test(test_metrics_full_disk_checkpoints),
	    cmocka_unit_test(test_save_params_full_disk),
	    cmocka_unit_test(test_layer_memory_too_large),
	    cmocka_unit_test(test_fetch_fails),
	    cmocka_unit_test(test_nonfinite_loss_stops),
	    cmocka_unit_test(test_static_scale_overflows),
	    cmocka_unit_test(test_min_scale_counts_from_it),
	    cmocka_unit_test(test_nonfinite_loss_one_step),
	    cmocka_unit_test(test_nonfinite_loss_no_dout),
	    cmocka_unit_test(test_finite_losses_train),
	    cmocka_unit_test(test_nonfinite_first_named),
	    cmocka_unit_test(test_nonfinite_unchecked_named),
	    cmocka_unit_test(test_frozen_rank_blamed),
	    cmocka_unit_test(test_hang_warning),
	    cmocka_unit_test(test_exit_step_named),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
