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
 * - damage: a flipped byte, a truncated shard, a deleted manifest, a disk
 *   that fills during a save: a clear error, or a fallback that says so,
 *   and the previous checkpoint still loads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "runlib.h"

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

static int same_file(const char *a, const char *b)
{
	char cmd[700];
	snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
	return system(cmd) == 0;
}

/* 40 steps straight, and 20 + resume + 20: the same parameters. */
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
	free(finish(&r, 0, SMALL));

	start(&r, 2);
	knobs(&r, strategy, extra);
	args(&r, "--checkpoint-dir", dir, "--stop-at-step", "20", NULL);
	char *out = finish(&r, 0, SMALL);
	assert_non_null(strstr(out, "checkpoint: step 20 saved"));
	assert_non_null(strstr(out, "stopped after step 20 of 40"));
	free(out);

	start(&r, 2);
	knobs(&r, strategy, extra);
	args(&r, "--checkpoint-dir", dir, "--resume", "auto", "--save-params", resumed, NULL);
	out = finish(&r, 0, SMALL);
	assert_non_null(strstr(out, "at step 20 (epoch 1, batch 20)"));
	free(out);
	int same = same_file(straight, resumed);
	printf("  %-8s %-60s %s\n", strategy, extra ? extra : "", same ? "bit-identical" : "DIFFERENT");
	assert_true(same);
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
	/* the overflow at step 15 leaves the scaler mid-hysteresis */
	resume_case("ddp", "--precision 16-mixed --inject-overflow-step 15 --hysteresis 2");
	resume_case("zero3", "--precision fp8 --activation-checkpointing");
	resume_case("zero1", "--optimizer sgd --momentum 0.9 --grad-accum 2 --scheduler warmup_decay "
			     "--warmup-steps 10");
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
		int same = same_file(saved, loaded);
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
	int same = same_file(straight, after);
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

/* A disk that fills during a save: a tmpfs with room for one checkpoint
 * of the small MLP (0.7 MB), not two. */
static void test_disk_full(void **state)
{
	(void)state;
	char mnt[300], dir[340], ck[400];
	snprintf(mnt, sizeof mnt, "%s/small-fs", tmp);
	snprintf(dir, sizeof dir, "%s/ck", mnt);
	mkdir(mnt, 0755);
	if (mount("tmpfs", mnt, "tmpfs", 0, "size=1m") != 0) {
		if (geteuid() != 0) {
			printf("  not root: no tmpfs can be mounted; the full-disk case is skipped\n");
			skip();
		}
		fail_msg("mount tmpfs on %s failed", mnt);
	}
	run r;
	start(&r, 2);
	args(&r, "--batch-size", "64", "--max-steps", "20", "--checkpoint-dir", dir,
	     "--checkpoint-every", "10", "--keep", "1", NULL);
	char *out = finish(&r, 1, SMALL);
	int ok = strstr(out, "checkpoint: step 10 saved") &&
		 strstr(out, "checkpoint of step 20 not saved") &&
		 strstr(out, "No space left on device");
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_resume_every_strategy),
		cmocka_unit_test(test_resume_precisions),
		cmocka_unit_test(test_reshard),
		cmocka_unit_test(test_crash_restart),
		cmocka_unit_test(test_damage),
		cmocka_unit_test(test_disk_full),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
