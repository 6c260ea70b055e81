/* Checkpoints and validation through the real launcher and workers on
 * the MLP: --keep-best keeps exactly the k best by the monitored metric
 * and --keep-last the newest, across a resume, named in the manifest;
 * --early-stop's count goes on across a resume; their refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/runlib.h"

#define SMALL "--hidden 64 --depth 1"

static char ck[96], mfile[96], cfg[96];

static void cleanup(void)
{
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf %s %s %s", ck, mfile, cfg);
	assert_int_equal(system(cmd), 0);
}

/* The validations of the metrics file: steps and values of `key`. */
static int validations(const char *key, long *step, double *val, int most)
{
	char *text = h_slurp(mfile), pat[64];
	assert_non_null(text);
	snprintf(pat, sizeof pat, "\"%s\":", key);
	int n = 0;
	for (char *line = strtok(text, "\n"); line && n < most; line = strtok(NULL, "\n")) {
		const char *p = strstr(line, pat), *s = strstr(line, "\"step\":");
		if (!p || !s)
			continue;
		step[n] = strtol(s + 7, NULL, 10);
		val[n++] = strtod(p + strlen(pat), NULL);
	}
	free(text);
	return n;
}

/* want[]: 1 for the checkpoint steps (multiples of 2) the rule keeps:
 * the k best by value (ties: the older), and the newest `last`. */
static void expected(const long *step, const double *val, int n, int max, int k, int last,
		     int *want, int *best)
{
	int used[64] = {0};
	for (int b = 0; b < k; b++) {
		int at = -1;
		for (int i = 0; i < n; i++)
			if (!used[i] && (at < 0 || (max ? val[i] > val[at] : val[i] < val[at])))
				at = i;
		used[at] = 1;
		want[step[at]] = best[step[at]] = 1;
	}
	for (int i = n - last; i < n; i++)
		want[step[i]] = 1;
}

/* The step-* directories in ck, as have[step] = 1; returns how many. */
static int present(int *have, int most)
{
	DIR *d = opendir(ck);
	assert_non_null(d);
	struct dirent *e;
	int n = 0;
	while ((e = readdir(d)))
		if (!strncmp(e->d_name, "step-", 5)) {
			long s = strtol(e->d_name + 5, NULL, 10);
			assert_true(s > 0 && s < most);
			have[s] = 1;
			n++;
		}
	closedir(d);
	return n;
}

/* Drops the blanks out of JSON text (the manifest's is indented). */
static void squeeze(char *s)
{
	char *o = s;
	for (; *s; s++)
		if (*s != ' ' && *s != '\t' && *s != '\n')
			*o++ = *s;
	*o = 0;
}

/* hpu-ckpt info DIR's output (asserting exit 0; caller frees). */
static char *ckpt_info(const char *dir)
{
	char *argv[] = {(char *)h_build("bin/hpu-ckpt"), "info", (char *)dir, NULL};
	proc p;
	int rc = h_run(&p, argv, NULL, 60000);
	char *out = strdup(p.out ? p.out : "");
	h_free(&p);
	if (rc != 0)
		fail_msg("hpu-ckpt info %s: exit %d:\n%s", dir, rc, out);
	return out;
}

/* The line of out starting with `start` (asserted there), without its
 * newline, in buf. */
static const char *line_of(const char *out, const char *start, char *buf, size_t n)
{
	const char *p = strstr(out, start);
	if (!p)
		fail_msg("no line \"%s...\" in:\n%s", start, out);
	size_t len = strcspn(p, "\n");
	snprintf(buf, n, "%.*s", (int)len, p);
	return buf;
}

/* hpu-ckpt info of the root: step 12's validation and what was kept,
 * best[s] / want[s] the steps the rule keeps as best / at all. */
static void info_keep(const char *key, int k, int last, const int *best, const int *want)
{
	long step[16];
	double loss[16], acc[16];
	assert_int_equal(validations("val_loss", step, loss, 16), 6);
	assert_int_equal(validations("val_accuracy", step, acc, 16), 6);
	char *out = ckpt_info(ck), expect[200], line[400];
	snprintf(expect, sizeof expect, "validation    step 12: val_loss %g, val_accuracy %g\n",
		 loss[5], acc[5]);
	if (!strstr(out, expect))
		fail_msg("no \"%s\" in:\n%s", expect, out);
	snprintf(expect, sizeof expect, "keep          newest %d: ", last);
	line_of(out, expect, line, sizeof line);
	snprintf(expect, sizeof expect, "; best %d by %s (max): ", k, key);
	const char *b = strstr(line, expect);
	if (!b)
		fail_msg("no \"%s\" in \"%s\"", expect, line);
	for (int s = 2; s <= 12; s += 2) {
		char nm[32];
		snprintf(nm, sizeof nm, "step-%08d", s);
		const char *at = strstr(line, nm);
		int newest = want[s] && !best[s];
		if (best[s] != (strstr(b, nm) != NULL) || (newest && !(at && at < b)) || (!want[s] && at))
			fail_msg("%s: step %d misplaced in \"%s\"", key, s, line);
	}
	printf("  %s\n", line);
	free(out);
}

/* --keep-best val_loss:max,2 --keep-last 1, checkpoints and validations
 * every 2 steps, stopped at step 6 and resumed to 12: exactly the two of
 * the highest val_loss and step 12 are left, `latest` names step 12,
 * whose manifest names them and carries its own val_loss, as hpu-ckpt
 * info prints. Then the same from the config file's keys with
 * val_accuracy:max,1 and the newest 2. */
static void test_keep_best_across_resume(void **state)
{
	(void)state;
	const struct {
		const char *rule, *key, *cfg;
		int max, k, last;
	} c[2] = {{"val_loss:max,2", "val_loss", NULL, 1, 2, 1},
		  {"val_accuracy:max,1", "val_accuracy",
		   "{\"hputrain\": {\"keep_best\": \"val_accuracy:max,1\", \"keep_last\": 2}}", 1, 1,
		   2}};
	for (int t = 0; t < 2; t++) {
		for (int part = 0; part < 2; part++) {
			run r;
			start(&r, 2);
			args(&r, "--max-steps", "12", "--lr", "0.05", "--eval-every", "2",
			     "--checkpoint-every", "2", "--checkpoint-dir", ck, "--metrics", mfile, NULL);
			if (c[t].cfg) {
				FILE *f = fopen(cfg, "w");
				assert_non_null(f);
				fputs(c[t].cfg, f);
				fclose(f);
				args(&r, "--config", cfg, NULL);
			} else {
				args(&r, "--keep-best", c[t].rule, "--keep-last", "1", NULL);
			}
			args(&r, part ? "--resume" : "--stop-at-step", part ? "auto" : "6", NULL);
			free(finish(&r, 0, SMALL));
		}
		long step[16];
		double val[16];
		int n = validations(c[t].key, step, val, 16), want[16] = {0}, have[16] = {0}, nw = 0, best[16] = {0};
		assert_int_equal(n, 6);
		expected(step, val, n, c[t].max, c[t].k, c[t].last, want, best);
		int nh = present(have, 16);
		for (int s = 0; s < 16; s++) {
			nw += want[s];
			if (want[s] != have[s])
				fail_msg("%s: step %d is %s, the rule says %s", c[t].rule, s,
					 have[s] ? "kept" : "gone", want[s] ? "keep" : "drop");
		}
		assert_int_equal(nh, nw);
		char path[200], *text;
		snprintf(path, sizeof path, "%s/latest", ck);
		assert_non_null(text = h_slurp(path));
		assert_non_null(strstr(text, "step-00000012"));
		free(text);
		snprintf(path, sizeof path, "%s/step-00000012/manifest.json", ck);
		assert_non_null(text = h_slurp(path));
		squeeze(text);
		char pat[160];
		snprintf(pat, sizeof pat, "\"metric\":\"%s\",\"mode\":\"max\",\"best_k\":%d,\"best\":[",
			 c[t].key, c[t].k);
		if (!strstr(text, pat))
			fail_msg("no %s in %s", pat, text);
		for (int s = 0; s < 16; s++) { /* each best one is named */
			char nm[32];
			snprintf(nm, sizeof nm, "\"step-%08d\"", s);
			const char *list = strstr(text, pat), *in = strstr(list, nm);
			if (best[s] != (in && in < strchr(list, ']')))
				fail_msg("%s: step %d %s in the manifest's best: %s", c[t].rule, s,
					 best[s] ? "not" : "wrongly", list);
		}
		snprintf(pat, sizeof pat, "\"%s\":", c[t].key);
		const char *v = strstr(strstr(text, "\"validation\":"), pat);
		assert_non_null(v);
		assert_true(strtod(v + strlen(pat), NULL) == val[5]);
		free(text);
		info_keep(c[t].key, c[t].k, c[t].last, best, want);
		cleanup();
	}
}

/* Validations every 3 steps, checkpoints every 5 (hpulaunch notes the
 * misalignment): only step 15's checkpoint is validated at its own step,
 * so --keep-best val_loss:max,1 keeps it, beside the newest (20). The
 * others' manifests carry an earlier step's validation, by which later
 * saves ranked them: step 5, by step 3's higher val_loss, displaced step
 * 15 (max: the loss falls, so the earliest validation ranks first). */
static void test_keep_best_own_step(void **state)
{
	(void)state;
	run r;
	start(&r, 2);
	args(&r, "--max-steps", "20", "--lr", "0.05", "--eval-every", "3", "--checkpoint-every",
	     "5", "--keep-best", "val_loss:max,1", "--checkpoint-dir", ck, NULL);
	free(finish(&r, 0, SMALL));
	int have[32] = {0};
	assert_int_equal(present(have, 32), 2);
	if (!have[15] || !have[20])
		fail_msg("kept: %s%s%s%s; the rule keeps steps 15 and 20", have[5] ? "5 " : "",
			 have[10] ? "10 " : "", have[15] ? "15 " : "", have[20] ? "20" : "");
	char path[200], *text;
	snprintf(path, sizeof path, "%s/step-00000020/manifest.json", ck);
	assert_non_null(text = h_slurp(path));
	squeeze(text);
	if (!strstr(text, "\"best\":[\"step-00000015\"]"))
		fail_msg("step 15 is not the manifest's best: %s", strstr(text, "\"keep"));
	free(text);
	cleanup();
}

/* The step the rule stops at in the metrics file's validations; the best
 * value and its step in *best, *best_step. */
static long rule_stop(int max, long patience, double *best, long *best_step)
{
	long step[64];
	double val[64];
	int n = validations("val_loss", step, val, 64);
	long wait = 0;
	for (int i = 0; i < n; i++) {
		if (!i || (max ? val[i] > *best : val[i] < *best)) {
			*best = val[i];
			*best_step = step[i];
			wait = 0;
		} else if (++wait >= patience) {
			return step[i];
		}
	}
	return 0;
}

/* --early-stop val_loss:max,3 with a validation every step stops at the
 * same step S whether the run was stopped at step S - 1 (two validations
 * into its count) and resumed or not: the resumed run goes on with the
 * best value and the count. */
static void test_early_stop_resumed(void **state)
{
	(void)state;
	long stop[2] = {0};
	for (int resumed = 0; resumed < 2; resumed++) {
		char *out = NULL;
		for (int part = resumed ? 0 : 1; part < 2; part++) {
			run r;
			start(&r, 2);
			args(&r, "--max-steps", "30", "--lr", "0.05", "--eval-every", "1", "--early-stop",
			     "val_loss:max,3", "--checkpoint-dir", ck, "--metrics", mfile, NULL);
			char at[32];
			snprintf(at, sizeof at, "%ld", stop[0] - 1);
			if (resumed)
				args(&r, part ? "--resume" : "--stop-at-step", part ? "auto" : at, NULL);
			free(out);
			out = finish(&r, 0, SMALL);
		}
		if (resumed && !strstr(out, "resume: --early-stop goes on from the checkpoint: the "
					    "best val_loss, "))
			fail_msg("no note of the count going on in:\n%s", out);
		const char *p = strstr(out, "stopped early after step ");
		if (!p)
			fail_msg("no early stop in:\n%s", out);
		stop[resumed] = strtol(p + strlen("stopped early after step "), NULL, 10);
		double best = 0;
		long best_step = 0;
		assert_int_equal(stop[resumed], rule_stop(1, 3, &best, &best_step));
		char *info = ckpt_info(ck), expect[160];
		snprintf(expect, sizeof expect,
			 "early stop    val_loss (max): best %g at step %ld, 3 validations since\n",
			 best, best_step);
		if (!strstr(info, expect))
			fail_msg("no \"%s\" in:\n%s", expect, info);
		printf("  %s", expect);
		free(info);
		printf("  %s: stopped early after step %ld\n", resumed ? "resumed" : "in one go",
		       stop[resumed]);
		free(out);
		cleanup();
	}
	assert_true(stop[0] > 2);
	assert_int_equal(stop[0], stop[1]);
}

/* The refusals: K below 1, a metric the model lacks, no validation to
 * rank by, no checkpoint root, two counts of the newest. */
static void test_keep_bad(void **state)
{
	(void)state;
	const char *bad[][8] = {
		{"--keep-best", "val_loss,0", "--eval-every", "2", "--checkpoint-dir", ck, NULL},
		{"--keep-best", "val_loss", "--eval-every", "2", "--checkpoint-dir", ck, NULL},
		{"--keep-best", "loss,2", "--eval-every", "2", "--checkpoint-dir", ck, NULL},
		{"--keep-last", "0", "--checkpoint-dir", ck, NULL},
		{"--keep-best", "val_loss,2", "--checkpoint-dir", ck, NULL},
		{"--keep-best", "val_loss,2", "--eval-every", "2", NULL},
		{"--keep", "3", "--keep-last", "2", "--checkpoint-dir", ck, NULL},
		{"--keep-best", "val_f1,2", "--eval-every", "2", "--checkpoint-dir", ck, NULL},
	};
	const char *says[] = {
		"--keep-best val_loss,0: K '0' is not a whole number of checkpoints from 1",
		"--keep-best val_loss: no K: expected METRIC[:min|max],K",
		"--keep-best loss,2: the metric 'loss' is not a validation one: give val_loss or "
		"val_<a metric of the model>",
		"bad value '0' for --keep-last: expected an integer from 1 to",
		"--keep-best val_loss,2 ranks the checkpoints by the validation: add --eval-every N "
		"or --eval-every-epochs N",
		"--keep-best needs --checkpoint-dir DIR",
		"--keep 3 and --keep-last 2 both count the newest checkpoints kept: give one",
		"--keep-best val_f1,2: the model declares no metric f1 (it has val_loss and "
		"val_accuracy)",
	};
	for (size_t k = 0; k < sizeof says / sizeof *says; k++) {
		run r;
		start(&r, 1);
		for (int i = 0; bad[k][i]; i++)
			arg(&r, bad[k][i]);
		char *out = finish(&r, k == 7 ? 1 : 2, NULL);
		if (!strstr(out, says[k]))
			fail_msg("case %zu: no \"%s\" in:\n%s", k, says[k], out);
		free(out);
	}
	cleanup();
}

int main(void)
{
	int pid = (int)getpid();
	snprintf(ck, sizeof ck, "/tmp/hpu-keep-%d-ck", pid);
	snprintf(mfile, sizeof mfile, "/tmp/hpu-keep-%d.jsonl", pid);
	snprintf(cfg, sizeof cfg, "/tmp/hpu-keep-%d.json", pid);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keep_bad),
		cmocka_unit_test(test_keep_best_across_resume),
		cmocka_unit_test(test_keep_best_own_step),
		cmocka_unit_test(test_early_stop_resumed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
