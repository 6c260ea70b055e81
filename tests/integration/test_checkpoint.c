/* Integration tests of checkpoints: the real hpulaunch, hpu-worker and MLP
 * model on loopback, checkpoints on the real filesystem.
 *
 * - resume: 40 steps straight against 20, stop, resume, 20 more: the
 *   parameters are bit-identical, for every strategy, and for bf16-mixed,
 *   16-mixed (with an overflow skipped before the checkpoint), fp8 and
 *   SGD with momentum, gradient accumulation and warm-up;
 * - reshard: saved by 4 workers under zero3, loaded by 2 under ddp and 3
 *   under zero1: the consolidated weights are bit-identical to the saved
 *   ones, and training goes on;
 * - crash: a worker killed with SIGKILL at a random step, --max-restarts 1,
 *   --checkpoint-every 5: the job finishes by itself with the parameters
 *   of a run never interrupted, the restart resuming from the job's own
 *   newest checkpoint rather than the --resume it started from;
 * - a resume under another --seed: the checkpoint's seed holds out the
 *   validation samples and draws dropout as the run it continues did;
 * - damage: a flipped byte, a truncated shard, a deleted manifest, a disk
 *   that fills during a save: a clear error, or a fallback that says so,
 *   and the previous checkpoint still loads; a manifest edited in range
 *   (its own digest), a shard that is a FIFO and (as root) another uid's
 *   `latest` or step directory are refused naming the file; stale
 *   .step-N.partial directories of this uid that no live job holds are
 *   removed at start-up, saying so; SIGTERM to hpulaunch during a save
 *   leaves no partial directory, nor does SIGTERM as rank 0's mkdir of
 *   it returns, nor as --save-params' temporary file is opened; SIGTERM
 *   as `latest` is written finishes the save; a worker's helper threads
 *   hold the stop signals off (its main thread's handler cleans up);
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/runlib.h"

static const char *strategies[] = {"ddp", "fast_ddp", "zero1", "zero2", "zero3"};

/* A small MLP with several units per strategy and a persistent last layer
 * under zero3 (as test_strategies' equivalence runs). */
#define SMALL "--hidden 64 --depth 3"

static char tmp[256];

static int setup(void **state)
{
	(void)state;
	snprintf(tmp, sizeof tmp, "/tmp/hpu-ckpt-test-%d", (int)getpid());
	mkdir(tmp, 0755);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[300];
	snprintf(cmd, sizeof cmd, "%s/small-fs", tmp);
	umount2(cmd, MNT_DETACH); /* after a failed test_disk_full */
	snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
	return system(cmd) == 0 ? 0 : -1;
}

static void knobs(run *r, const char *strategy, const char *extra)
{
	args(r, "--reduce-bucket-size", "8000", "--allgather-bucket-size", "30000",
	     "--param-persistence-threshold", "1000", "--batch-size", "64", "--max-steps", "40",
	     "--scheduler", "cosine", "--clip-grad-norm", "1.0", "--strategy", strategy, NULL);
	static char buf[8][256];
	static int k;
	if (extra) {
		char *b = buf[k++ & 7];
		snprintf(b, 256, "%s", extra);
		for (char *t = strtok(b, " "); t; t = strtok(NULL, " "))
			arg(r, t);
	}
}

/* The "<N> bytes sent per step" of a run's closing line. */
static double bytes_per_step(const char *out)
{
	const char *at = strstr(out, " bytes sent per step");
	assert_non_null(at);
	while (at > out && at[-1] != ' ')
		at--;
	return atof(at);
}

/* 40 steps straight, and 20 + resume + 20: the same parameters, and the
 * same traffic per step (the resumed run's own 20 steps' traffic over
 * its 20 steps, not over 40). */
static void resume_case(const char *strategy, const char *extra)
{
	char straight[300], resumed[300], dir[300];
	snprintf(straight, sizeof straight, "%s/%s-straight.bin", tmp, strategy);
	snprintf(resumed, sizeof resumed, "%s/%s-resumed.bin", tmp, strategy);
	snprintf(dir, sizeof dir, "%s/%s-ck", tmp, strategy);
	run r;
	start(&r, 2);
	knobs(&r, strategy, extra);
	args(&r, "--save-params", straight, NULL);
	char *out = finish(&r, 0, SMALL);
	double sent = bytes_per_step(out);
	free(out);

	start(&r, 2);
	knobs(&r, strategy, extra);
	args(&r, "--checkpoint-dir", dir, "--stop-at-step", "20", NULL);
	out = finish(&r, 0, SMALL);
	assert_non_null(strstr(out, "checkpoint: step 20 saved"));
	assert_non_null(strstr(out, "stopped after step 20 of 40"));
	free(out);

	start(&r, 2);
	knobs(&r, strategy, extra);
	/* a --stop-at-step the resumed run is past is said, and trains on */
	args(&r, "--checkpoint-dir", dir, "--resume", "auto", "--save-params", resumed,
	     "--stop-at-step", "10", NULL);
	out = finish(&r, 0, SMALL);
	assert_non_null(strstr(out, "at step 20 (epoch 1, batch 20)"));
	assert_non_null(strstr(out, "note: --stop-at-step 10: the run resumed at step 20, past it: "
				    "it trains on to step 40"));
	double resumed_sent = bytes_per_step(out);
	free(out);
	printf("  %-8s bytes sent per step: straight %.0f, resumed %.0f\n", strategy, sent,
	       resumed_sent);
	assert_true(resumed_sent == sent);
	int same = files_same(straight, resumed);
	printf("  %-8s %-60s %s\n", strategy, extra ? extra : "", same ? "bit-identical" : "DIFFERENT");
	assert_true(same);
}

/* --max-steps 0 saves the initial model (its help says so; it saved
 * nothing, and a later --resume of the root found no checkpoint): step
 * 0's checkpoint, from which 40 steps end where 40 straight ones do. */
static void test_initial_checkpoint(void **state)
{
	(void)state;
	char straight[300], resumed[300], dir[300];
	snprintf(straight, sizeof straight, "%s/init-straight.bin", tmp);
	snprintf(resumed, sizeof resumed, "%s/init-resumed.bin", tmp);
	snprintf(dir, sizeof dir, "%s/init-ck", tmp);
	run r;
	start(&r, 2);
	knobs(&r, "zero3", NULL);
	args(&r, "--save-params", straight, NULL);
	free(finish(&r, 0, SMALL));
	start(&r, 2);
	knobs(&r, "zero3", "--max-steps 0");
	args(&r, "--checkpoint-dir", dir, NULL);
	char *out = finish(&r, 0, SMALL);
	assert_non_null(strstr(out, "checkpoint: step 0 saved"));
	free(out);
	start(&r, 2);
	knobs(&r, "zero3", NULL);
	args(&r, "--resume", dir, "--save-params", resumed, NULL);
	out = finish(&r, 0, SMALL);
	assert_non_null(strstr(out, "step-00000000 at step 0 (epoch 1, batch 0)"));
	free(out);
	assert_true(files_same(straight, resumed));
}

static void test_resume_every_strategy(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof strategies / sizeof *strategies; i++)
		resume_case(strategies[i], NULL);
}

static void test_resume_precisions(void **state)
{
	(void)state;
	resume_case("zero2", "--precision bf16-mixed");
	/* bf16-mixed and fp8 count their steps on from the checkpoint: an
	 * overflow before the stop is not injected again after it (the
	 * counter restarted at 0 and skipped step 23 too), one after it
	 * comes at its step (it came 20 steps late, past the run's end);
	 * under ddp a skipped step sends what another does */
	resume_case("ddp", "--precision bf16-mixed --inject-overflow-step 3");
	resume_case("ddp", "--precision fp8 --inject-overflow-step 25");
	/* the overflow at step 15 leaves the scaler mid-hysteresis */
	resume_case("ddp", "--precision 16-mixed --inject-overflow-step 15 --hysteresis 2");
	resume_case("zero3", "--precision fp8 --activation-checkpointing");
	resume_case("zero1", "--optimizer sgd --momentum 0.9 --grad-accum 2 --scheduler warmup_decay "
			     "--warmup-steps 10");
}

/* Issue 39: a checkpoint saved at bf16-mixed and resumed at fp32 trains
 * on, and rank 0 says the precision changed; the same precision says
 * nothing. */
static void test_resume_other_precision_noted(void **state)
{
	(void)state;
	char dir[300];
	snprintf(dir, sizeof dir, "%s/prec-ck", tmp);
	run r;
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "4", "--stop-at-step", "2", "--precision",
	     "bf16-mixed", "--checkpoint-dir", dir, NULL);
	free(finish(&r, 0, SMALL));
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "4", "--checkpoint-dir", dir, "--resume",
	     "auto", NULL);
	char *out = finish(&r, 0, SMALL);
	assert_non_null(strstr(out, "was saved at --precision bf16-mixed; this run goes on at "
				    "--precision fp32"));
	free(out);
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "6", "--checkpoint-dir", dir, "--resume",
	     "auto", NULL);
	out = finish(&r, 0, SMALL);
	assert_non_null(strstr(out, "at step 4"));
	assert_null(strstr(out, "this run goes on at"));
	free(out);
}

/* The optimizer, its settings and a fixed --loss-scale are the resumed
 * run's, and a line says where the checkpoint's differ (a fixed
 * --loss-scale was replaced by the checkpoint's scale in silence; adamw
 * to adam, --beta1, --weight-decay went on without a word). A checkpoint
 * of sgd --momentum 0 under --momentum 0.9 is refused naming the momentum
 * (it said "saved with optimizer sgd, this run uses sgd"); the initial
 * model (--max-steps 0) resumes under any optimizer. */
static void test_resume_optimizer_changed(void **state)
{
	(void)state;
	char dir[300], metrics[340], want[900];
	snprintf(dir, sizeof dir, "%s/optim-ck", tmp);
	snprintf(metrics, sizeof metrics, "%s/optim.jsonl", tmp);
	run r;
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "4", "--stop-at-step", "2", "--checkpoint-dir",
	     dir, NULL);
	char *saved = finish(&r, 0, SMALL);
	assert_non_null(strstr(saved, "/step-00000002: 1 shard, ")); /* it said "1 shards" */
	free(saved);
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "4", "--resume", dir, "--beta1", "0.5",
	     "--weight-decay", "0.5", NULL);
	char *out = finish(&r, 0, SMALL);
	snprintf(want, sizeof want,
		 "resume: this run's optimizer settings are used where checkpoint %s/step-00000002's "
		 "differ: --beta1 0.5 (saved: 0.9), --weight-decay 0.5 (saved: 0.01)",
		 dir);
	if (!strstr(out, want))
		fail_msg("want \"%s\" in:\n%s", want, out);
	free(out);
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "4", "--resume", dir, "--optimizer", "adam",
	     NULL);
	out = finish(&r, 0, SMALL);
	snprintf(want, sizeof want,
		 "note: checkpoint %s/step-00000002 was saved with --optimizer adamw; this run goes "
		 "on with --optimizer adam, its state taken as that one's",
		 dir);
	if (!strstr(out, want))
		fail_msg("want \"%s\" in:\n%s", want, out);
	/* and adam's default weight decay, 0, against adamw's 0.01 (unsaid) */
	snprintf(want, sizeof want,
		 "resume: this run's optimizer settings are used where checkpoint %s/step-00000002's "
		 "differ: --weight-decay 0 (saved: 0.01)\n",
		 dir);
	if (!strstr(out, want))
		fail_msg("want \"%s\" in:\n%s", want, out);
	free(out);
	/* nothing changed: no line */
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "4", "--resume", dir, NULL);
	out = finish(&r, 0, SMALL);
	assert_null(strstr(out, "optimizer settings"));
	assert_null(strstr(out, "--optimizer"));
	free(out);
	/* a longer run under a constant lr: its total steps matter not, no
	 * line (it said the schedule's options differed) */
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "6", "--resume", dir, NULL);
	out = finish(&r, 0, SMALL);
	assert_null(strstr(out, "learning-rate schedule"));
	free(out);
	/* cosine: the setting that differs, both values, and what follows
	 * past the kept schedule's end (the lr rose again, unsaid) */
	char cdir[340];
	snprintf(cdir, sizeof cdir, "%s/cosine-ck", tmp);
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "4", "--stop-at-step", "2", "--scheduler",
	     "cosine", "--lr", "0.01", "--checkpoint-dir", cdir, NULL);
	free(finish(&r, 0, SMALL));
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "8", "--scheduler", "cosine", "--lr", "0.01",
	     "--resume", cdir, NULL);
	out = finish(&r, 0, SMALL);
	const char *cos = "resume: the checkpoint's learning-rate schedule is kept (cosine, lr 0.01, "
			  "4 total steps): 4 total steps (this run's: 8); past its last step the lr "
			  "rises again along the cosine (as torch's CosineAnnealingLR does)\n";
	if (!strstr(out, cos))
		fail_msg("want \"%s\" in:\n%s", cos, out);
	free(out);
	h_rmtree(cdir);

	/* 16-mixed with a dynamic scale, resumed with a fixed one */
	h_rmtree(dir);
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "4", "--stop-at-step", "2", "--precision",
	     "16-mixed", "--checkpoint-dir", dir, NULL);
	free(finish(&r, 0, SMALL));
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "4", "--precision", "16-mixed", "--loss-scale",
	     "1024", "--resume", dir, "--metrics", metrics, "--log-every", "1", NULL);
	out = finish(&r, 0, SMALL);
	snprintf(want, sizeof want,
		 "resume: --loss-scale 1024 is used; checkpoint %s/step-00000002's loss scale was 65536",
		 dir);
	if (!strstr(out, want))
		fail_msg("want \"%s\" in:\n%s", want, out);
	free(out);
	char *m = h_slurp(metrics);
	assert_non_null(m);
	int fixed = strstr(m, "\"loss_scale\":1024") && !strstr(m, "\"loss_scale\":65536");
	if (!fixed)
		fail_msg("want loss_scale 1024 (not 65536) in:\n%s", m);
	free(m);

	/* sgd without momentum: no momentum buffer */
	h_rmtree(dir);
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "4", "--stop-at-step", "2", "--optimizer",
	     "sgd", "--momentum", "0", "--checkpoint-dir", dir, NULL);
	free(finish(&r, 0, SMALL));
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "4", "--optimizer", "sgd", "--resume", dir,
	     NULL);
	out = finish(&r, 1, SMALL);
	snprintf(want, sizeof want,
		 "checkpoint %s/step-00000002 was saved with --optimizer sgd --momentum 0, which "
		 "keeps no momentum buffer; this run's --momentum 0.9 needs one",
		 dir);
	if (!strstr(out, want))
		fail_msg("want \"%s\" in:\n%s", want, out);
	free(out);

	/* the initial model, saved under adamw, resumed under sgd */
	h_rmtree(dir);
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "0", "--checkpoint-dir", dir, NULL);
	free(finish(&r, 0, SMALL));
	start(&r, 1);
	args(&r, "--batch-size", "32", "--max-steps", "2", "--optimizer", "sgd", "--resume", dir,
	     NULL);
	out = finish(&r, 0, SMALL);
	assert_non_null(strstr(out, "this run goes on with --optimizer sgd"));
	free(out);
}

/* Saved by 4 workers under zero3; loaded by 2 under ddp and by 3 under
 * zero1 (a global batch of 96 divides among 2, 3 and 4). */
static void test_reshard(void **state)
{
	(void)state;
	char saved[300], dir[300], loaded[300], metrics[300];
	snprintf(saved, sizeof saved, "%s/rs-saved.bin", tmp);
	snprintf(dir, sizeof dir, "%s/rs-ck", tmp);
	run r;
	start(&r, 4);
	args(&r, "--strategy", "zero3", "--batch-size", "96", "--max-steps", "30",
	     "--param-persistence-threshold", "1000", "--checkpoint-dir", dir, "--stop-at-step",
	     "20", "--save-params", saved, NULL);
	free(finish(&r, 0, SMALL));
	const struct {
		int workers;
		const char *strategy;
	} to[] = {{2, "ddp"}, {3, "zero1"}};
	for (int k = 0; k < 2; k++) {
		char w[8];
		snprintf(w, sizeof w, "%d", to[k].workers);
		snprintf(loaded, sizeof loaded, "%s/rs-loaded-%d.bin", tmp, to[k].workers);
		snprintf(metrics, sizeof metrics, "%s/rs-%d.jsonl", tmp, to[k].workers);
		/* loads and saves without a step: --max-steps is the checkpoint's */
		start(&r, to[k].workers);
		args(&r, "--strategy", to[k].strategy, "--batch-size", "96", "--max-steps", "20",
		     "--resume", dir, "--save-params", loaded, NULL);
		char *out = finish(&r, 0, SMALL);
		assert_non_null(strstr(out, "saved by 4 workers under zero3"));
		assert_non_null(strstr(out, "resharded for"));
		free(out);
		int same = files_same(saved, loaded);
		printf("  4 x zero3 -> %d x %-5s: consolidated weights %s\n", to[k].workers,
		       to[k].strategy, same ? "bit-identical" : "DIFFERENT");
		assert_true(same);
		/* and training goes on from there */
		start(&r, to[k].workers);
		args(&r, "--strategy", to[k].strategy, "--batch-size", "96", "--max-steps", "30",
		     "--resume", dir, "--metrics", metrics, NULL);
		out = finish(&r, 0, SMALL);
		assert_non_null(strstr(out, "trained 30 steps"));
		free(out);
		char *m = h_slurp(metrics);
		assert_non_null(m);
		assert_non_null(strstr(m, "\"final\":true"));
		free(m);
	}
}

/* ---- crash and restart ---- */

/* Starts argv, waits for rank 0's log line of step `at`, kills one of the
 * workers with SIGKILL, and waits for the job's end; returns its output. */
static char *kill_at(char *const argv[], int at, int *code)
{
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	char line[64];
	snprintf(line, sizeof line, " step %d/", at);
	if (h_wait_for(&p, line, 120000) < 0) {
		fprintf(stderr, "never saw '%s':\n%s\n", line, p.out);
		h_kill(&p);
		fail();
	}
	pid_t kids[16];
	int n = h_children(p.pid, kids, 16);
	assert_true(n >= 2);
	pid_t victim = kids[rand() % n];
	printf("  SIGKILL to worker pid %d at step %d\n", (int)victim, at);
	assert_int_equal(kill(victim, SIGKILL), 0);
	if (h_wait(&p, 240000) < 0) {
		h_kill(&p);
		fail_msg("the job did not end after the kill");
	}
	*code = h_code(&p);
	char *out = strdup(p.out ? p.out : "");
	h_free(&p);
	return out;
}

static void test_crash_restart(void **state)
{
	(void)state;
	char straight[300], after[300], dir[300];
	snprintf(straight, sizeof straight, "%s/crash-straight.bin", tmp);
	snprintf(after, sizeof after, "%s/crash-restarted.bin", tmp);
	snprintf(dir, sizeof dir, "%s/crash-ck", tmp);
	run r;
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "60", "--save-params", straight, NULL);
	free(finish(&r, 0, NULL));

	/* the job starts from a checkpoint of step 5 made elsewhere */
	char first[300], want[400];
	snprintf(first, sizeof first, "%s/crash-start", tmp);
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "60", "--checkpoint-dir", first,
	     "--stop-at-step", "5", NULL);
	free(finish(&r, 0, NULL));

	srand((unsigned)time(NULL) ^ (unsigned)getpid());
	int at = 11 + rand() % 35;
	r.n = 0;
	args(&r, LAUNCH, "--devices", "2", "--no-eval", "--log-every", "1", "--batch-size", "64",
	     "--max-steps", "60", "--resume", first, "--checkpoint-dir", dir,
	     "--checkpoint-every", "5", "--max-restarts", "1", "--save-params", after, MODEL,
	     NULL);
	int code;
	char *out = kill_at((char *const *)r.argv, at, &code);
	if (code != 0)
		fprintf(stderr, "exit %d:\n%s\n", code, out);
	assert_int_equal(code, 0);
	snprintf(want, sizeof want, "resumed from %s/step-00000005 at step 5", first);
	assert_non_null(strstr(out, want));
	const char *again = strstr(out, "restart 1 (HPU_RESTART_COUNT)");
	assert_non_null(again);
	/* the restart goes on from this job's own newest checkpoint */
	snprintf(want, sizeof want, "resumed from %s/step-", dir);
	assert_non_null(strstr(again, want));
	free(out);
	int same = files_same(straight, after);
	printf("  killed at step %d, restarted: final parameters %s\n", at,
	       same ? "bit-identical to the uninterrupted run" : "DIFFERENT");
	assert_true(same);
}

/* ---- damage ---- */

/* Trains `steps` steps with a checkpoint every 10 into dir. */
static void train_into(const char *dir, const char *steps, int want, const char *expect)
{
	run r;
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", steps, "--checkpoint-dir", dir,
	     "--checkpoint-every", "10", NULL);
	char *out = finish(&r, want, SMALL);
	if (expect && !strstr(out, expect))
		fail_msg("no '%s' in:\n%s", expect, out);
	free(out);
}

/* Resumes from `from` (auto with --checkpoint-dir when dir is set) and
 * expects exit `want` and every one of the texts in the output. */
static void resume_expect(const char *dir, const char *from, int want, ...)
{
	run r;
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "30", "--resume", from, NULL);
	if (dir)
		args(&r, "--checkpoint-dir", dir, NULL);
	char *out = finish(&r, want, SMALL);
	va_list ap;
	va_start(ap, want);
	for (const char *t; (t = va_arg(ap, const char *));)
		if (!strstr(out, t))
			fail_msg("no '%s' in:\n%s", t, out);
	va_end(ap);
	free(out);
}

static void test_damage(void **state)
{
	(void)state;
	char dir[300], f[400], cmd[600], ck20[340];
	snprintf(dir, sizeof dir, "%s/dmg", tmp);
	snprintf(ck20, sizeof ck20, "%s/step-00000020", dir);
	train_into(dir, "20", 0, "checkpoint: step 20 saved");
	/* a flipped byte: auto falls back to step 10, saying so; naming the
	 * checkpoint itself is an error naming the shard */
	snprintf(f, sizeof f, "%s/rank-00001-of-00002.bin", ck20);
	snprintf(cmd, sizeof cmd, "printf '\\377' | dd of=%s bs=1 seek=4096 conv=notrunc 2>/dev/null", f);
	assert_int_equal(system(cmd), 0);
	resume_expect(dir, "auto", 0, "rank-00001-of-00002.bin is damaged: SHA-256",
		      "falling back to", "resumed from", "step-00000010 at step 10", NULL);
	resume_expect(NULL, ck20, 1, "rank-00001-of-00002.bin is damaged", NULL);
	/* that run saved step 30 at its end; truncate one of its shards */
	snprintf(f, sizeof f, "%s/step-00000030/rank-00000-of-00002.bin", dir);
	assert_int_equal(truncate(f, 1000), 0);
	resume_expect(NULL, dir, 1, "rank-00000-of-00002.bin is truncated: 1000 bytes", NULL);
	/* no manifest: not a checkpoint any more; auto passes it and the
	 * damaged step 20 by, to step 10 */
	snprintf(f, sizeof f, "%s/step-00000030/manifest.json", dir);
	assert_int_equal(unlink(f), 0);
	resume_expect(dir, "auto", 0, "step-00000030/manifest.json: No such file",
		      "step-00000020/rank-00001-of-00002.bin is damaged", "step-00000010 at step 10",
		      NULL);
}

/* ---- altered, foreign and odd files; stale partial checkpoints ---- */

static void sh(const char *fmt, ...)
{
	char cmd[2000];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof cmd, fmt, ap);
	va_end(ap);
	if (system(cmd) != 0)
		fail_msg("failed: %s", cmd);
}

/* An edited manifest, a shard that is a FIFO, and (as root) another
 * uid's `latest` and step directory are refused on resume, naming the
 * file; auto falls back past an altered manifest, not past a foreign
 * file; a `latest` naming no checkpoint is said. */
static void test_resume_forged(void **state)
{
	(void)state;
	char dir[300], ck10[340], ck20[340], odd[340];
	snprintf(dir, sizeof dir, "%s/forged", tmp);
	snprintf(ck10, sizeof ck10, "%s/step-00000010", dir);
	snprintf(ck20, sizeof ck20, "%s/step-00000020", dir);
	snprintf(odd, sizeof odd, "%s/odd", tmp);
	train_into(dir, "20", 0, "checkpoint: step 20 saved");
	sh("cp -r %s %s", ck20, odd);
	/* the learning rate edited in step 20's manifest */
	sh("cp %s/manifest.json %s/manifest.keep", ck20, tmp);
	sh("sed -i 's/\"lr\":[^,]*/\"lr\": 0.5/' %s/manifest.json", ck20);
	resume_expect(NULL, ck20, 1, "step-00000020/manifest.json was altered after it was written",
		      NULL);
	resume_expect(dir, "auto", 0, "manifest.json was altered after it was written",
		      "falling back to", "step-00000010 at step 10", NULL);
	sh("cp %s/manifest.keep %s/manifest.json", tmp, ck20);
	/* a shard that is a FIFO: refused at once */
	sh("rm %s/rank-00001-of-00002.bin && mkfifo %s/rank-00001-of-00002.bin", odd, odd);
	resume_expect(NULL, odd, 1, "odd/rank-00001-of-00002.bin: not a regular file (a FIFO)", NULL);
	/* a `latest` naming no checkpoint there: the newest by step, said
	 * (it was taken without a word) */
	sh("printf '../../etc\\n' > %s/latest", dir);
	resume_expect(NULL, dir, 0,
		      "forged/latest names \"../../etc\", which is not a checkpoint there; taking the "
		      "newest by step, ",
		      "step-00000030 at step 30", NULL);
	sh("printf 'step-00000030\\n' > %s/latest", dir);
	/* a step directory that is a link to another step's (or a renamed
	 * one) holds another step than its name says: refused, and auto
	 * passes it by (it resumed step 10 as the newest, step 40) */
	char link[360];
	snprintf(link, sizeof link, "%s/step-00000040", dir);
	assert_int_equal(symlink("step-00000010", link), 0);
	resume_expect(NULL, link, 1, "step-00000040 is named for step 40 but holds step 10's checkpoint",
		      NULL);
	sh("mv %s/latest %s/latest.keep", dir, tmp);
	resume_expect(dir, "auto", 0, "named for step 40 but holds step 10's", "falling back to",
		      "step-00000030 at step 30", NULL);
	sh("mv %s/latest.keep %s/latest && rm %s", tmp, dir, link);
	if (geteuid() != 0) {
		printf("  not root: no file can be given to another uid; the rest is skipped\n");
		skip();
	}
	/* another uid's step directory, named by its `latest` */
	sh("cp -r %s %s/step-00000090 && chown -R 65534 %s/step-00000090", ck20, dir, dir);
	sh("printf 'step-00000090\\n' > %s/latest.new && chown 65534 %s/latest.new && "
	   "mv %s/latest.new %s/latest", dir, dir, dir, dir);
	resume_expect(dir, "auto", 1, "forged/latest is owned by uid 65534, not by uid 0", NULL);
	sh("rm %s/latest && printf 'step-00000020\\n' > %s/latest", dir, dir);
	resume_expect(NULL, dir, 0, "step-00000020 at step 20", NULL);
	/* the foreign directory when the newer ones are gone */
	sh("rm -r %s/step-00000030 %s/latest", dir, dir);
	resume_expect(dir, "auto", 1, "forged/step-00000090 is owned by uid 65534, not by uid 0",
		      NULL);
}

/* The name of a .step-N.partial directory in dir, into out; 0 if none. */
static int partial_in(const char *dir, char *out, size_t n)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int found = 0;
	while (d && !found && (e = readdir(d)))
		if (!strncmp(e->d_name, ".step-", 6) && strstr(e->d_name, ".partial")) {
			snprintf(out, n, "%s", e->d_name);
			found = 1;
		}
	if (d)
		closedir(d);
	return found;
}

/* The manifest records the placement plan (issue 34): zero2 in
 * bf16-mixed keeps bf16 parameters whole and bf16 gradients sharded. A
 * manifest from before the field (it, and the seal that covers it,
 * taken out) still resumes. */
static void test_placement_recorded(void **state)
{
	(void)state;
	char dir[300], mpath[400];
	snprintf(dir, sizeof dir, "%s/pl-ck", tmp);
	snprintf(mpath, sizeof mpath, "%s/step-00000010/manifest.json", dir);
	run r;
	start(&r, 2);
	knobs(&r, "zero2", "--precision bf16-mixed");
	args(&r, "--checkpoint-dir", dir, "--stop-at-step", "10", NULL);
	free(finish(&r, 0, SMALL));
	char *m = h_slurp(mpath);
	assert_non_null(m);
	const char *pl = strstr(m, "\"placement\":");
	assert_non_null(pl);
	const char *pp = strstr(pl, "\"parameters\":"), *gg = strstr(pl, "\"gradients\":");
	assert_non_null(pp);
	assert_non_null(gg);
	assert_non_null(strstr(pp, "\"dtype\":\t\"bf16\",\n\t\t\t\"sharded\":\tfalse"));
	assert_non_null(strstr(gg, "\"dtype\":\t\"bf16\",\n\t\t\t\"sharded\":\ttrue"));
	assert_non_null(strstr(gg, "reduce-scatter per bucket in backward"));
	free(m);
	sh("sed -i -e '/\"placement\":/,/^\t},$/d' %s && sed -i -z 's/,\\n\t\"manifest_sha256\":[^\\n]*//' %s",
	   mpath, mpath);
	m = h_slurp(mpath);
	assert_null(strstr(m, "placement"));
	free(m);
	start(&r, 2);
	knobs(&r, "zero2", "--precision bf16-mixed");
	args(&r, "--checkpoint-dir", dir, "--resume", "auto", NULL);
	char *out = finish(&r, 0, SMALL);
	assert_non_null(strstr(out, "at step 10 (epoch"));
	free(out);
}

/* Ctrl-C (SIGTERM to hpulaunch) while a save is being written: the
 * workers remove their partial directory before they die. */
static void test_interrupted_save(void **state)
{
	(void)state;
	char dir[300], name[300];
	snprintf(dir, sizeof dir, "%s/interrupted", tmp);
	run r;
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "400", "--checkpoint-dir", dir,
	     "--checkpoint-every", "1", "--keep", "1", MODEL, "--", "--hidden", "2048", "--depth",
	     "3", NULL);
	proc p;
	assert_int_equal(h_start(&p, (char *const *)r.argv, NULL), 0);
	struct timespec ms = {0, 1000 * 1000};
	int seen = 0;
	for (int i = 0; i < 120000 && !seen && h_alive(p.pid); i++) {
		seen = partial_in(dir, name, sizeof name);
		if (!seen)
			nanosleep(&ms, NULL);
	}
	if (!seen) {
		h_kill(&p);
		fail_msg("no save seen in %s:\n%s", dir, p.out ? p.out : "");
	}
	assert_int_equal(kill(p.pid, SIGTERM), 0);
	printf("  SIGTERM to hpulaunch while %s/%s was being written\n", dir, name);
	if (h_wait(&p, 60000) < 0) {
		h_kill(&p);
		fail_msg("the job did not end after SIGTERM");
	}
	int left = partial_in(dir, name, sizeof name);
	if (left) {
		char cmd[700];
		fprintf(stderr, "%s/%s is left after the interruption; output:\n%s\n", dir, name,
			p.out ? p.out : "");
		snprintf(cmd, sizeof cmd, "ls -la %s/%s >&2", dir, name);
		(void)system(cmd);
	}
	h_free(&p);
	assert_false(left);
}

/* A run with SIGTERM to the worker that makes `made` as the mkdir or open
 * of it returns (tests/fixtures/signal_after.c): the job ends naming rank
 * 0 and its signal. Returns its output (caller frees). */
static char *signalled_as_made(const char *made, int nth, const char *dir, const char *extra)
{
	char env1[400], env2[400], env3[64];
	snprintf(env1, sizeof env1, "LD_PRELOAD=%s", h_build("lib/signal_after.so"));
	snprintf(env2, sizeof env2, "HPU_TEST_SIGNAL_AFTER=%s", made);
	snprintf(env3, sizeof env3, "HPU_TEST_SIGNAL_NTH=%d", nth);
	char *env[] = {env1, env2, env3, NULL};
	run r;
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "5", "--checkpoint-dir", dir,
	     "--checkpoint-every", "1", NULL);
	if (extra)
		args(&r, "--save-params", extra, NULL);
	args(&r, MODEL, "--", "--hidden", "64", "--depth", "3", NULL);
	proc p;
	int code = h_run(&p, (char *const *)r.argv, env, 120000);
	if (code != 1)
		fail_msg("exit %d, not 1:\n%s", code, p.out ? p.out : "");
	if (!strstr(p.out, "rank 0 (node 0") || !strstr(p.out, "killed by signal 15"))
		fail_msg("the job's end does not name rank 0 and its signal:\n%s", p.out);
	printf("  SIGTERM to rank 0 as it made %s\n", made);
	char *out = p.out;
	p.out = NULL;
	h_free(&p);
	return out;
}

/* The signal at the worst moment: SIGTERM to rank 0 as its mkdir of the
 * partial returns, before it has noted the directory as its own (a loaded
 * CI machine once delivered hpulaunch's SIGTERM there and the empty
 * partial stayed); as --save-params' temporary file is opened, before
 * the guard that removes it was set. Nothing is left. As the second
 * save's `latest` is written, after its step-2 is in place: `latest`
 * names step 2 and no latest.tmp.PID is left (`latest` named step 1,
 * and a resume took step 2 for an abandoned run's step past it). */
static void test_signal_as_made(void **state)
{
	(void)state;
	char dir[300], name[300], params[400];
	snprintf(dir, sizeof dir, "%s/at-mkdir", tmp);
	char *out = signalled_as_made(".step-00000001.partial", 1, dir, NULL);
	int left = partial_in(dir, name, sizeof name);
	if (left)
		fprintf(stderr, "%s/%s is left; output:\n%s\n", dir, name, out);
	free(out);
	assert_false(left);

	snprintf(dir, sizeof dir, "%s/at-open", tmp);
	snprintf(params, sizeof params, "%s/params.bin", dir);
	mkdir(dir, 0755);
	/* the save of step 5 (the last) is before --save-params' file */
	out = signalled_as_made("params.bin.tmp.", 1, dir, params);
	char cmd[500];
	snprintf(cmd, sizeof cmd, "ls -a %s | grep -q 'params.bin'", dir);
	left = system(cmd) == 0;
	if (left) {
		fprintf(stderr, "a file of %s is left; output:\n%s\n", params, out);
		snprintf(cmd, sizeof cmd, "ls -la %s >&2", dir);
		(void)system(cmd);
	}
	free(out);
	assert_false(left);

	snprintf(dir, sizeof dir, "%s/at-latest", tmp);
	free(signalled_as_made("latest.tmp.", 2, dir, NULL));
	char latest[400];
	snprintf(latest, sizeof latest, "%s/latest", dir);
	char *l = h_slurp(latest);
	assert_non_null(l);
	assert_string_equal(l, "step-00000002\n");
	free(l);
	snprintf(cmd, sizeof cmd, "ls -a %s | grep -q 'latest.tmp'", dir);
	assert_int_not_equal(system(cmd), 0);
	run r;
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "5", "--checkpoint-dir", dir, "--resume",
	     "auto", NULL);
	out = finish(&r, 0, "--hidden 64 --depth 3");
	assert_non_null(strstr(out, "at step 2 (epoch"));
	free(out);
}

/* SigBlk of /proc/pid/task/tid/status, or -1. */
static long long blocked_of(pid_t pid, const char *tid)
{
	char path[400], line[256];
	snprintf(path, sizeof path, "/proc/%d/task/%.256s/status", (int)pid, tid);
	FILE *f = fopen(path, "r"); /* a /proc file's size is 0: read by line */
	long long v = -1;
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, "SigBlk:", 7))
			v = strtoll(line + 7, NULL, 16);
	if (f)
		fclose(f);
	return v;
}

/* A save's signal handler cleans up after the code it interrupts, in the
 * thread that runs it: in a running worker every thread but the main one
 * holds SIGTERM, SIGINT and SIGHUP off (the --hang-warning thread did
 * not, and a signal the kernel gave it ran the handler beside the save),
 * and the main thread takes them. */
static void test_threads_hold_stop_signals(void **state)
{
	(void)state;
	run r;
	start(&r, 1);
	args(&r, "--batch-size", "64", "--max-steps", "100000", "--log-every", "1", MODEL, NULL);
	proc p;
	assert_int_equal(h_start(&p, (char *const *)r.argv, NULL), 0);
	if (h_wait_for(&p, " step 3/", 120000) < 0) {
		fprintf(stderr, "no step 3:\n%s\n", p.out);
		h_kill(&p);
		fail();
	}
	pid_t kids[4];
	assert_int_equal(h_children(p.pid, kids, 4), 1);
	const long long stop = 1LL << (SIGTERM - 1) | 1LL << (SIGINT - 1) | 1LL << (SIGHUP - 1);
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/task", (int)kids[0]);
	DIR *d = opendir(path);
	assert_non_null(d);
	struct dirent *e;
	int threads = 0, bad = 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		long long m = blocked_of(kids[0], e->d_name);
		if (m < 0)
			continue; /* ended meanwhile */
		int main_thread = atoi(e->d_name) == (int)kids[0];
		threads++;
		if (main_thread ? (m & stop) != 0 : (m & stop) != stop) {
			fprintf(stderr, "thread %s of worker %d: SigBlk %llx\n", e->d_name,
				(int)kids[0], m);
			bad++;
		}
	}
	closedir(d);
	h_kill(&p);
	printf("  %d threads of the worker: the stop signals reach the main one only\n", threads);
	assert_true(threads >= 3); /* main, the collectives', the data loader's at least */
	assert_int_equal(bad, 0);
}

/* A save interrupted (killed) leaves .step-N.partial; the next run with
 * that --checkpoint-dir removes those it owns that no live job holds,
 * saying so, and leaves other names, a held one and (as root) another
 * uid's alone. */
static void test_stale_partials(void **state)
{
	(void)state;
	char dir[300], p[400];
	snprintf(dir, sizeof dir, "%s/partials", tmp);
	train_into(dir, "10", 0, "checkpoint: step 10 saved");
	sh("mkdir %s/.step-00000015.partial %s/.step-00000017.partial %s/.step-x.partial "
	   "%s/.step-00000019.partial && touch %s/.step-00000015.partial/rank-00000-of-00002.bin",
	   dir, dir, dir, dir, dir);
	int foreign = geteuid() == 0;
	if (foreign)
		sh("mkdir %s/.step-00000018.partial && chown 65534 %s/.step-00000018.partial", dir,
		   dir);
	/* .step-00000019.partial is held (flock) by a live job: this test */
	snprintf(p, sizeof p, "%s/.step-00000019.partial", dir);
	int fd = open(p, O_RDONLY | O_DIRECTORY);
	assert_true(fd >= 0);
	assert_int_equal(flock(fd, LOCK_EX), 0);
	resume_expect(dir, "auto", 0, "removed the stale partial checkpoint",
		      ".step-00000015.partial", ".step-00000017.partial", "step-00000010 at step 10",
		      NULL);
	close(fd);
	struct stat st;
	snprintf(p, sizeof p, "%s/.step-00000015.partial", dir);
	assert_int_not_equal(lstat(p, &st), 0);
	snprintf(p, sizeof p, "%s/.step-00000017.partial", dir);
	assert_int_not_equal(lstat(p, &st), 0);
	snprintf(p, sizeof p, "%s/.step-00000019.partial", dir);
	assert_int_equal(lstat(p, &st), 0);
	snprintf(p, sizeof p, "%s/.step-x.partial", dir);
	assert_int_equal(lstat(p, &st), 0);
	snprintf(p, sizeof p, "%s/.step-00000018.partial", dir);
	assert_int_equal(lstat(p, &st) == 0, foreign);
}

/* A disk that fills during a save: a tmpfs with room for one checkpoint
 * of the small MLP (0.7 MB), not two. */
static void test_disk_full(void **state)
{
	(void)state;
	char mnt[300], dir[340], ck[400];
	snprintf(mnt, sizeof mnt, "%s/small-fs", tmp);
	snprintf(dir, sizeof dir, "%s/ck", mnt);
	mount_small_fs(mnt, "1m");
	run r;
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "20", "--checkpoint-dir", dir,
	     "--checkpoint-every", "10", "--keep", "1", NULL);
	char *out = finish(&r, 1, SMALL);
	/* hpulaunch's closing error gives the reason too (it said only
	 * "rank N ... exited with code 1", the reason lines above) */
	const char *closing = strstr(out, "hpulaunch: error: rank ");
	int ok = strstr(out, "checkpoint: step 10 saved") &&
		 strstr(out, "checkpoint of step 20 not saved") &&
		 strstr(out, "No space left on device") && closing &&
		 strstr(closing, ") exited with code 1 while saving the checkpoint of step 20 of 20: "
				 "checkpoint of step 20 not saved");
	if (!ok)
		fprintf(stderr, "%s\n", out);
	free(out);
	snprintf(ck, sizeof ck, "%s/.step-00000020.partial", dir);
	struct stat st;
	int partial_left = stat(ck, &st) == 0;
	/* the previous checkpoint loads */
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "10", "--resume", dir, NULL);
	char *out2 = finish(&r, 0, SMALL);
	int loads = strstr(out2, "step-00000010 at step 10") != NULL;
	free(out2);
	umount(mnt);
	assert_true(ok);
	assert_false(partial_left);
	assert_true(loads);
}

/* A checkpoint whose `latest` cannot be written (a directory in its
 * place here, a full disk in the reviews' cases) is not saved: a resume
 * would pass it over as an abandoned run's step past `latest` (and the
 * run resumed would replace it), so it is taken back and removed, and the
 * message says "not saved" naming what failed (it said "saved ..., but",
 * while `--resume auto` took the step before in silence). A step past
 * the one `latest` names is passed over with a line naming it. */
static void test_latest_unwritable(void **state)
{
	(void)state;
	char dir[300], lat[340], path[400];
	snprintf(dir, sizeof dir, "%s/latest-dir", tmp);
	snprintf(lat, sizeof lat, "%s/latest", dir);
	mkdir(dir, 0755);
	assert_int_equal(mkdir(lat, 0755), 0);
	run r;
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "10", "--checkpoint-dir", dir,
	     "--checkpoint-every", "5", NULL);
	char *out = finish(&r, 1, SMALL);
	if (!strstr(out, "checkpoint of step 5 not saved") || !strstr(out, "Is a directory") ||
	    strstr(out, "saved to"))
		fail_msg("want \"checkpoint of step 5 not saved\" and \"Is a directory\" in:\n%s", out);
	/* hpulaunch's summary names rank 0, whose write failed, whichever
	 * rank exits first (it named rank 1 where rank 1 did) */
	const char *sum = strstr(out, "hpulaunch: error: ");
	if (!sum || strncmp(sum + 18, "rank 0 ", 7))
		fail_msg("the summary does not name rank 0 first:\n%s", out);
	free(out);
	struct stat st;
	snprintf(path, sizeof path, "%s/step-00000005", dir);
	assert_int_equal(stat(path, &st), -1);
	snprintf(path, sizeof path, "%s/.step-00000005.partial", dir);
	assert_int_equal(stat(path, &st), -1);

	/* steps 5 and 10 saved, `latest` naming step 5 (as a run resumed from
	 * it leaves them): auto takes step 5 and says that step 10 is passed
	 * over */
	assert_int_equal(rmdir(lat), 0);
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "10", "--checkpoint-dir", dir,
	     "--checkpoint-every", "5", NULL);
	free(finish(&r, 0, SMALL));
	FILE *f = fopen(lat, "w");
	assert_non_null(f);
	fputs("step-00000005\n", f);
	assert_int_equal(fclose(f), 0);
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "10", "--checkpoint-dir", dir, "--resume",
	     "auto", NULL);
	out = finish(&r, 0, SMALL);
	char want[1200];
	snprintf(want, sizeof want,
		 "resume: %s/step-00000010 is past the checkpoint %s/latest names, and is passed "
		 "over: a run that resumed from an earlier one left it, or its save was stopped "
		 "before it updated latest (--resume %s/step-00000010 "
		 "takes it)",
		 dir, dir, dir);
	if (!strstr(out, want) || !strstr(out, "step-00000005 at step 5"))
		fail_msg("want \"%s\" and a resume from step 5 in:\n%s", want, out);
	free(out);

	/* a save replacing a checkpoint of its step (a run resumed from step
	 * 5 reaches step 10 again) whose `latest` cannot be written: the one
	 * it replaced is put back, whole (it was removed first, the message
	 * saying the previous checkpoints were untouched) */
	char man10[400], before[4096], *after;
	snprintf(man10, sizeof man10, "%s/step-00000010/manifest.json", dir);
	char *m = h_slurp(man10);
	assert_non_null(m);
	snprintf(before, sizeof before, "%s", m);
	free(m);
	assert_int_equal(unlink(lat), 0);
	assert_int_equal(mkdir(lat, 0755), 0);
	snprintf(path, sizeof path, "%s/step-00000005", dir);
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "10", "--checkpoint-dir", dir,
	     "--checkpoint-every", "5", "--resume", path, NULL);
	out = finish(&r, 1, SMALL);
	if (!strstr(out, "checkpoint of step 10 not saved (the previous checkpoints are untouched)"))
		fail_msg("want \"checkpoint of step 10 not saved\" in:\n%s", out);
	free(out);
	after = h_slurp(man10);
	if (!after || strcmp(after, before) != 0)
		fail_msg("step-00000010's manifest is %s after the failed save", after ? "another" : "gone");
	free(after);
	snprintf(path, sizeof path, "%s/.step-00000010.partial", dir);
	assert_int_equal(stat(path, &st), -1);
}

/* Two jobs saving in one --checkpoint-dir overwrote and pruned each
 * other's checkpoints, each saying its own were saved (a resume then took
 * the other job's state), or one died when both saved a step at once:
 * rank 0 holds DIR/.lock for its run, and a second job is refused at
 * start naming the directory and the holder. The running job is played
 * by this test, holding the lock; once it lets go, a job runs there. */
static void test_root_in_use(void **state)
{
	(void)state;
	char dir[300], lock[340];
	snprintf(dir, sizeof dir, "%s/in-use", tmp);
	snprintf(lock, sizeof lock, "%s/.lock", dir);
	assert_int_equal(mkdir(dir, 0755), 0);
	int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
	assert_int_equal(write(fd, "pid 4242 on othernode\n", 22), 22);
	char want[1000];
	snprintf(want, sizeof want,
		 "--checkpoint-dir %s is in use: another running job saves its checkpoints there "
		 "(its rank 0, pid 4242 on othernode holds %s)",
		 dir, lock);
	train_into(dir, "10", 1, want);
	struct stat st;
	char step[340];
	snprintf(step, sizeof step, "%s/step-00000010", dir);
	assert_int_equal(stat(step, &st), -1); /* nothing saved over the other job's */
	close(fd);
	train_into(dir, "10", 0, "checkpoint: step 10 saved");
}


/* A run resumed at its last step trains nothing: it says so, and its
 * final metrics record has a null loss (it wrote 0, which a reader of
 * the file took for the run's final loss, after the first run's real
 * one). */
static void test_resume_at_end(void **state)
{
	(void)state;
	char dir[300], metrics[340];
	snprintf(dir, sizeof dir, "%s/at-end", tmp);
	snprintf(metrics, sizeof metrics, "%s/at-end.jsonl", tmp);
	train_into(dir, "10", 0, "checkpoint: step 10 saved");
	run r;
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "10", "--checkpoint-dir", dir, "--resume",
	     "auto", "--metrics", metrics, NULL);
	char *out = finish(&r, 0, SMALL);
	out_has(out, "resumed at step 10 on 2 workers (fast_ddp): no steps left to train");
	free(out);
	char *text = h_slurp(metrics);
	assert_non_null(text);
	out_has(text, "{\"final\":true,\"steps\":10,\"loss\":null,\"samples_per_sec\":null,");
	free(text);
}

/* A token file of n tokens below 50 (llm.c's format) drawn from seed. */
static void token_file(const char *path, int n, uint32_t seed)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	int32_t head[256] = {20240520, 1, n};
	assert_int_equal(fwrite(head, sizeof head, 1, f), 1);
	for (int i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		uint16_t t = (uint16_t)((seed >> 16) % 50);
		assert_int_equal(fwrite(&t, sizeof t, 1, f), 1);
	}
	fclose(f);
}

/* A checkpoint resumed with another global batch, or by another model,
 * is refused, saying so, before any step. */
static void test_resume_refused(void **state)
{
	(void)state;
	char dir[300], ck10[340], want[600];
	snprintf(dir, sizeof dir, "%s/refused", tmp);
	snprintf(ck10, sizeof ck10, "%s/step-00000010", dir);
	train_into(dir, "10", 0, "checkpoint: step 10 saved");
	run r;
	start(&r, 2);
	args(&r, "--batch-size", "32", "--max-steps", "30", "--resume", ck10, NULL);
	char *out = finish(&r, 1, SMALL);
	snprintf(want, sizeof want,
		 "checkpoint %s was saved with a global batch of 64; resuming needs the same "
		 "(--batch-size 64), not 32", ck10);
	out_has(out, want);
	free(out);
	/* another training split (--val-fraction holds samples out): the
	 * epochs' batches are not the saved run's (it resumed at batch 10
	 * of an epoch of other batches, skipping the rest of it, and held
	 * out samples it had trained on) */
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "30", "--val-fraction", "0.5",
	     "--eval-every", "10", "--resume", ck10, NULL);
	out = finish(&r, 1, SMALL);
	snprintf(want, sizeof want, "checkpoint %s was saved by a run that trained on ", ck10);
	out_has(out, want);
	out_has(out, " samples; this run's training split has ");
	out_has(out, " (another --val-fraction, which holds samples out only with --eval-every or "
		       "--eval-every-epochs, or another dataset): its epochs' batches would not be "
		       "the saved run's, so batches would be skipped or trained twice");
	free(out);
	/* the same model with another --hidden: the parameter's two shapes
	 * (it gave their counts of floats, which a reshape keeps) */
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "30", "--resume", ck10, NULL);
	out = finish(&r, 1, "--hidden 32 --depth 3");
	snprintf(want, sizeof want, "checkpoint %s: parameter 0 is fc1.weight [64, 784] there, "
				    "fc1.weight [32, 784] in ", ck10);
	out_has(out, want);
	out_has(out, " (other model arguments, or another model?)");
	free(out);
	/* auto takes it for no damage: it does not fall back to an older
	 * checkpoint of the root (the same mistake, or worse, one that fits
	 * taken in silence), nor does a root's refusal send the user to auto */
	char two[300];
	snprintf(two, sizeof two, "%s/refused-two", tmp);
	train_into(two, "20", 0, "checkpoint: step 20 saved");
	const char *from[] = {"auto", two};
	for (int k = 0; k < 2; k++) {
		start(&r, 2);
		args(&r, "--batch-size", "64", "--max-steps", "30", "--checkpoint-dir", two,
		     "--resume", from[k], NULL);
		out = finish(&r, 1, "--hidden 32 --depth 3");
		snprintf(want, sizeof want, "--resume %s: ", from[k]);
		out_has(out, want);
		snprintf(want, sizeof want, "checkpoint %s/step-00000020: parameter 0 is fc1.weight "
					    "[64, 784] there", two);
		out_has(out, want);
		assert_null(strstr(out, "falling back"));
		assert_null(strstr(out, "falls back"));
		free(out);
	}
	/* the MLP's 8 parameters (4 layers of weights and biases) are not
	 * buffer_model's one; the model is named by its absolute path */
	start(&r, 2);
	args(&r, "--batch-size", "48", "--epochs", "2", "--max-steps", "12", "--batch-size", "64",
	     "--resume", ck10, NULL);
	out = finish_with(&r, 1, h_build("lib/buffer_model.so"), NULL);
	char *model = realpath(h_build("lib/buffer_model.so"), NULL);
	assert_non_null(model);
	snprintf(want, sizeof want, "checkpoint %s holds 8 parameters, the model %s has 1 (another model?)",
		 ck10, model);
	out_has(out, want);
	free(model);
	free(out);
	/* other data of the same size: the manifest's digest of a few of its
	 * samples differs (only the count was compared, and the run resumed
	 * on the other data) */
	char ta[300], tb[300], lm[300], ck3[340], margs[700];
	snprintf(ta, sizeof ta, "%s/ta.bin", tmp);
	snprintf(tb, sizeof tb, "%s/tb.bin", tmp);
	snprintf(lm, sizeof lm, "%s/lm", tmp);
	snprintf(ck3, sizeof ck3, "%s/step-00000003", lm);
	token_file(ta, 3000, 1);
	token_file(tb, 3000, 2);
	char *gpt = strdup(h_build("lib/gpt_lm.so"));
	for (int k = 0; k < 3; k++) {
		start(&r, 1);
		args(&r, "--batch-size", "16", "--max-steps", "6", "--checkpoint-dir", lm, NULL);
		if (k == 0)
			args(&r, "--stop-at-step", "3", NULL);
		else
			args(&r, "--resume", "auto", NULL);
		snprintf(margs, sizeof margs, "--tokens %s --ctx 16 --dim 32 --heads 2 --layers 1",
			 k == 1 ? tb : ta);
		out = finish_with(&r, k == 1, gpt, margs);
		if (k == 1) {
			snprintf(want, sizeof want, "checkpoint %s was saved by a run that trained on "
						    "other data: its training split has as many samples, "
						    "but their bytes differ", ck3);
			out_has(out, want);
		}
		if (k == 2) /* its own data: resumed */
			out_has(out, "resumed at step 3: 3 of those steps trained in this run");
		free(out);
	}
	free(gpt);
	unlink(ta);
	unlink(tb);
}

/* A resume given another --seed is the run it continues: the checkpoint's
 * seed holds out the same --val-fraction samples and draws the same
 * dropout masks as it orders the data (only the order followed it: the
 * resumed run trained on what the first part had validated on, and drew
 * other masks). gpt_lm's default dropout and a held-out run of windows,
 * 6 steps straight against 3, then 3 resumed under --seed 2. */
static void test_resume_other_seed(void **state)
{
	(void)state;
	char tok[300], ck[300], straight[300], resumed[300], margs[400];
	snprintf(tok, sizeof tok, "%s/seed-tokens.bin", tmp);
	snprintf(ck, sizeof ck, "%s/seed-ck", tmp);
	snprintf(straight, sizeof straight, "%s/seed-straight.bin", tmp);
	snprintf(resumed, sizeof resumed, "%s/seed-resumed.bin", tmp);
	token_file(tok, 3000, 3);
	snprintf(margs, sizeof margs, "--tokens %s --ctx 16 --dim 32 --heads 2 --layers 1", tok);
	char *gpt = strdup(h_build("lib/gpt_lm.so"));
	for (int k = 0; k < 3; k++) {
		run r;
		start(&r, 1);
		args(&r, "--batch-size", "16", "--max-steps", "6", "--val-fraction", "0.1",
		     "--eval-every", "3", "--seed", k < 2 ? "1" : "2", NULL);
		if (k == 0)
			args(&r, "--save-params", straight, NULL);
		if (k == 1)
			args(&r, "--checkpoint-dir", ck, "--stop-at-step", "3", NULL);
		if (k == 2)
			args(&r, "--checkpoint-dir", ck, "--resume", "auto", "--save-params", resumed,
			     NULL);
		char *out = finish_with(&r, 0, gpt, margs);
		if (k == 2)
			out_has(out, "resume: the checkpoint's seed 1 is this run's (its data order, "
				     "held-out samples and dropout masks), not --seed 2");
		free(out);
	}
	int same = files_same(straight, resumed);
	printf("  straight against resumed under --seed 2: %s\n", same ? "bit-identical" : "DIFFERENT");
	assert_true(same);
	free(gpt);
	unlink(tok);
}

/* A 16-mixed checkpoint of a fixed --loss-scale 3, resumed with the
 * dynamic scale: that starts afresh at 2^16, said (it went on from 3, not
 * a power of two, in silence). */
static void test_resume_static_scale(void **state)
{
	(void)state;
	char ck[300], metrics[300];
	snprintf(ck, sizeof ck, "%s/static-ck", tmp);
	snprintf(metrics, sizeof metrics, "%s/static.jsonl", tmp);
	run r;
	start(&r, 1);
	args(&r, "--precision", "16-mixed", "--loss-scale", "3", "--batch-size", "64",
	     "--max-steps", "4", "--checkpoint-dir", ck, NULL);
	free(finish(&r, 0, SMALL));
	start(&r, 1);
	args(&r, "--precision", "16-mixed", "--batch-size", "64", "--max-steps", "6",
	     "--checkpoint-dir", ck, "--resume", "auto", "--metrics", metrics, NULL);
	char *out = finish(&r, 0, SMALL);
	char want[600];
	snprintf(want, sizeof want, "resume: checkpoint %s/step-00000004's loss scale, 3, was a "
				    "fixed --loss-scale; this run's dynamic scale starts afresh "
				    "at 2^16", ck);
	out_has(out, want);
	free(out);
	char *m = h_slurp(metrics);
	assert_non_null(m);
	const char *fin = strstr(m, "\"final\":true");
	assert_non_null(fin);
	printf("  final record: %.200s\n", fin);
	assert_non_null(strstr(fin, "\"loss_scale\":65536"));
	free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_resume_every_strategy),
		cmocka_unit_test(test_initial_checkpoint),
		cmocka_unit_test(test_resume_at_end),
		cmocka_unit_test(test_resume_other_precision_noted),
		cmocka_unit_test(test_resume_precisions),
		cmocka_unit_test(test_resume_optimizer_changed),
		cmocka_unit_test(test_placement_recorded),
		cmocka_unit_test(test_reshard),
		cmocka_unit_test(test_crash_restart),
		cmocka_unit_test(test_damage),
		cmocka_unit_test(test_resume_forged),
		cmocka_unit_test(test_stale_partials),
		cmocka_unit_test(test_interrupted_save),
		cmocka_unit_test(test_signal_as_made),
		cmocka_unit_test(test_threads_hold_stop_signals),
		cmocka_unit_test(test_resume_refused),
		cmocka_unit_test(test_resume_other_seed),
		cmocka_unit_test(test_resume_static_scale),
		cmocka_unit_test(test_disk_full),
		cmocka_unit_test(test_latest_unwritable),
		cmocka_unit_test(test_root_in_use),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
