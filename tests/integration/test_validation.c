/* Validation during training (--eval-every, --eval-every-epochs,
 * --val-fraction) through the real launcher and workers on the MLP:
 * the values equal a separate --eval-only run of the saved parameters;
 * a held-out slice leaves fewer samples to train on; the config file's
 * keys (Lightning's names too) work; a fraction of an epoch
 * (Lightning's val_check_interval=0.25); bad values are refused;
 * --early-stop stops where its rule says on every rank. */
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

#define SMALL "--hidden 64 --depth 1"

static char tmp[3][96];

static void paths(void)
{
	const char *name[3] = {"train.jsonl", "eval.jsonl", "params.safetensors"};
	for (int k = 0; k < 3; k++)
		snprintf(tmp[k], sizeof tmp[k], "/tmp/hpu-val-%d-%s", (int)getpid(), name[k]);
}

/* The number after "key": in the first line of the file that has `has`
 * (NULL: any) and the key; fails the test if none. */
static double field(const char *file, const char *has, const char *key)
{
	char *text = h_slurp(file), pat[96];
	assert_non_null(text);
	snprintf(pat, sizeof pat, "\"%s\":", key);
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		const char *p = strstr(line, pat);
		if (p && (!has || strstr(line, has))) {
			double v = strtod(p + strlen(pat), NULL);
			free(text);
			return v;
		}
	}
	fail_msg("no \"%s\" (in a line with %s) in %s", key, has ? has : "anything", file);
	free(text);
	return 0;
}

/* Validation at step 4 equals --eval-only of the parameters saved at
 * step 4, to the last digit, loss and accuracy. */
static void test_eval_every_matches_eval_only(void **state)
{
	(void)state;
	run r;
	start(&r, 2);
	args(&r, "--max-steps", "4", "--eval-every", "2", "--metrics", tmp[0], "--save-params",
	     tmp[2], NULL);
	char *out = finish(&r, 0, SMALL);
	assert_non_null(strstr(out, "step 2 validation: val_loss "));
	assert_non_null(strstr(out, "step 4 validation: val_loss "));
	assert_non_null(strstr(out, " val_accuracy "));
	free(out);
	start(&r, 2);
	args(&r, "--eval-only", "--load-params", tmp[2], "--metrics", tmp[1], NULL);
	free(finish(&r, 0, SMALL));
	double vl = field(tmp[0], "\"step\":4,", "val_loss");
	double va = field(tmp[0], "\"step\":4,", "val_accuracy");
	double vs = field(tmp[0], "\"step\":4,", "val_samples");
	assert_true(vl == field(tmp[1], NULL, "test_loss"));
	assert_true(va == field(tmp[1], NULL, "test_accuracy"));
	assert_true(vs == 10000);
	/* the final record counts its samples too */
	assert_true(field(tmp[1], NULL, "test_samples") == vs);
	/* a batch past the data: the evaluation's buffers hold what a rank
	 * evaluates (5 000 samples), not the 50 000-sample micro-batch (157
	 * MB, which failed under --device-memory 64MiB), and nothing of
	 * training's is allocated; the same figures */
	start(&r, 2);
	args(&r, "--eval-only", "--load-params", tmp[2], "--metrics", tmp[1], "--batch-size",
	     "100000", "--device-memory", "64MiB", NULL);
	free(finish(&r, 0, SMALL));
	assert_true(vl == field(tmp[1], NULL, "test_loss"));
	assert_true(va == field(tmp[1], NULL, "test_accuracy"));
	/* the step-2 validation is another model's */
	assert_true(field(tmp[0], "\"step\":2,", "val_loss") != vl);
	for (int k = 0; k < 3; k++)
		unlink(tmp[k]);
}

/* Validating changes nothing of the training: the parameters after 6
 * steps with a validation after every one are those without, bit for
 * bit (fp8 too, whose scales come from the training forwards only; zero3
 * with micro-steps). */
static void test_validation_leaves_training_alone(void **state)
{
	(void)state;
	const char *prec[2][6] = {{"--precision", "fp8", NULL},
				  {"--strategy", "zero3", "--precision", "bf16-mixed", "--grad-accum", "2"}};
	for (int c = 0; c < 2; c++) {
		float *w[2];
		size_t n[2];
		for (int v = 0; v < 2; v++) {
			run r;
			start(&r, 2);
			args(&r, "--max-steps", "6", "--save-params", tmp[2], NULL);
			for (int i = 0; i < 6 && prec[c][i]; i++)
				arg(&r, prec[c][i]);
			if (v)
				args(&r, "--eval-every", "1", NULL);
			free(finish(&r, 0, SMALL));
			w[v] = load_params(tmp[2], &n[v]);
			assert_non_null(w[v]);
		}
		assert_int_equal(n[0], n[1]);
		assert_memory_equal(w[0], w[1], n[0] * sizeof *w[0]);
		free(w[0]);
		free(w[1]);
	}
	unlink(tmp[2]);
}

/* --val-fraction 0.5 holds out half the 60000 training samples: an epoch
 * of batches of 6000 is 5 steps, not 10, and --eval-every-epochs 1
 * validates on the 30000 held out after it. */
static void test_val_fraction(void **state)
{
	(void)state;
	run r;
	start(&r, 2);
	args(&r, "--epochs", "1", "--batch-size", "6000", "--log-every", "1", "--val-fraction",
	     "0.5", "--eval-every-epochs", "1", NULL);
	char *out = finish(&r, 0, SMALL);
	assert_non_null(strstr(out, "validation: 30000 samples of the training split held out "
				    "(--val-fraction 0.5), 30000 left to train on"));
	assert_non_null(strstr(out, "step 5/5 "));
	assert_null(strstr(out, "step 6/"));
	assert_non_null(strstr(out, "epoch 1/1 step 5 validation: val_loss "));
	assert_non_null(strstr(out, "(30000 samples)"));
	free(out);
}

/* gpt_lm's samples are windows at every token, which share tokens with
 * the 16 on either side (it says so with hpu_dataset_overlap): its
 * --val-fraction holds out one run of windows and trains on none of the
 * windows whose tokens it holds. Drawn at random, every held-out window
 * sat between trained ones, and on random tokens the validation loss
 * fell far below the test split's (1.49 against 4.23). */
static void test_val_fraction_windows(void **state)
{
	(void)state;
	char tokens[64];
	snprintf(tokens, sizeof tokens, "/tmp/hpu-valwin-%d.bin", (int)getpid());
	FILE *f = fopen(tokens, "wb");
	assert_non_null(f);
	int32_t head[256] = {20240520, 1, 2000};
	fwrite(head, sizeof head, 1, f);
	uint32_t x = 1;
	for (int i = 0; i < 2000; i++) {
		x = x * 1664525u + 1013904223u;
		uint16_t t = (uint16_t)(x >> 28);
		fwrite(&t, sizeof t, 1, f);
	}
	fclose(f);
	run r;
	start(&r, 2);
	args(&r, "--max-steps", "4", "--batch-size", "32", "--val-fraction", "0.1", "--eval-every",
	     "2", NULL);
	char margs[200];
	snprintf(margs, sizeof margs, "--tokens %s --ctx 16 --dim 32 --heads 2 --layers 1", tokens);
	char *out = finish_with(&r, 0, h_build("lib/gpt_lm.so"), margs);
	assert_non_null(strstr(out, "validation: 178 samples of the training split held out "
				    "(--val-fraction 0.1) in one run, and the 29 within 16 of it, "
				    "whose data overlaps it, used for neither; 1577 left to train on"));
	assert_non_null(strstr(out, "step 4 validation: val_loss "));
	assert_non_null(strstr(out, "(178 samples)"));
	free(out);
	unlink(tokens);
}

/* --eval-every-epochs 0.25 (and Lightning's val_check_interval 0.25 in
 * the config file): an epoch of 10 steps validates after the steps that
 * reach each quarter, rounded up: 3, 5, 8 and 10, and at no other. */
static void test_eval_fraction_of_epoch(void **state)
{
	(void)state;
	FILE *f = fopen(tmp[1], "w");
	assert_non_null(f);
	fputs("{\"hputrain\": {\"val_check_interval\": 0.25}}", f);
	fclose(f);
	for (int k = 0; k < 2; k++) {
		run r;
		start(&r, 2);
		args(&r, "--epochs", "1", "--batch-size", "6000", NULL);
		args(&r, k ? "--config" : "--eval-every-epochs", k ? tmp[1] : "0.25", NULL);
		char *out = finish(&r, 0, SMALL);
		for (int step = 1; step <= 10; step++) {
			char want[64];
			snprintf(want, sizeof want, "step %d validation: val_loss ", step);
			int at = step == 3 || step == 5 || step == 8 || step == 10;
			if (!strstr(out, want) != !at)
				fail_msg("case %d: step %d %s:\n%s", k, step,
					 at ? "not validated" : "validated", out);
		}
		free(out);
	}
	unlink(tmp[1]);
}

/* The config file's keys: our names and Lightning's. */
static void test_config_keys(void **state)
{
	(void)state;
	const char *body[2] = {"{\"hputrain\": {\"eval_every\": 1, \"val_fraction\": 0.1}}",
			       "{\"hputrain\": {\"val_check_interval\": 1, \"val_fraction\": 0.1}}"};
	for (int k = 0; k < 2; k++) {
		FILE *f = fopen(tmp[1], "w");
		assert_non_null(f);
		fputs(body[k], f);
		fclose(f);
		run r;
		start(&r, 1);
		args(&r, "--max-steps", "2", "--config", tmp[1], NULL);
		char *out = finish(&r, 0, SMALL);
		assert_non_null(strstr(out, "6000 samples of the training split held out"));
		assert_non_null(strstr(out, "step 1 validation: val_loss "));
		assert_non_null(strstr(out, "step 2 validation: val_loss "));
		free(out);
	}
	unlink(tmp[1]);
}

/* The step the rule METRIC,PATIENCE,MIN_DELTA (min, or max) stops at,
 * worked out from the validations of the metrics file; 0: none. */
static long rule_stop(const char *file, const char *key, int max, long patience, double delta)
{
	char *text = h_slurp(file), pat[64];
	assert_non_null(text);
	snprintf(pat, sizeof pat, "\"%s\":", key);
	double best = 0;
	long wait = 0, seen = 0, stop = 0;
	for (char *line = strtok(text, "\n"); line && !stop; line = strtok(NULL, "\n")) {
		const char *p = strstr(line, pat);
		if (!p)
			continue;
		double v = strtod(p + strlen(pat), NULL);
		long step = strtol(strstr(line, "\"step\":") + 7, NULL, 10);
		if (!seen++ || (max ? v > best + delta : v < best - delta)) {
			best = v;
			wait = 0;
		} else if (++wait >= patience) {
			stop = step;
		}
	}
	free(text);
	return stop;
}

/* --early-stop stops at the validation its rule names, on every rank:
 * both ranks write their shard of the checkpoint of that step, and the
 * run trains no further; min with a delta, and max. */
static void test_early_stop(void **state)
{
	(void)state;
	const struct {
		const char *rule, *key;
		int max;
		long patience;
		double delta;
	} c[2] = {{"val_loss,2,0.05", "val_loss", 0, 2, 0.05},
		  {"val_accuracy:max,2", "val_accuracy", 1, 2, 0}};
	for (int k = 0; k < 2; k++) {
		char ck[128], want[64], shard[192];
		snprintf(ck, sizeof ck, "/tmp/hpu-val-%d-ck", (int)getpid());
		run r;
		start(&r, 2);
		args(&r, "--max-steps", "60", "--lr", "0.05", "--eval-every", "2", "--early-stop",
		     c[k].rule, "--metrics", tmp[0], "--checkpoint-dir", ck, NULL);
		char *out = finish(&r, 0, SMALL);
		long stop = rule_stop(tmp[0], c[k].key, c[k].max, c[k].patience, c[k].delta);
		printf("  --early-stop %s: the rule stops at step %ld\n", c[k].rule, stop);
		assert_true(stop > 0 && stop < 60);
		snprintf(want, sizeof want, "stopped early after step %ld of 60 (--early-stop ", stop);
		if (!strstr(out, want))
			fail_msg("no \"%s\" in:\n%s", want, out);
		snprintf(want, sizeof want, "trained %ld steps on 2 workers", stop);
		assert_non_null(strstr(out, want));
		for (int rank = 0; rank < 2; rank++) {
			snprintf(shard, sizeof shard, "%s/step-%08ld/rank-%05d-of-00002.bin", ck, stop, rank);
			assert_int_equal(access(shard, R_OK), 0);
		}
		assert_true(field(tmp[0], "\"final\":true", "steps") == stop);
		free(out);
		char cmd[300];
		snprintf(cmd, sizeof cmd, "rm -rf %s", ck);
		assert_int_equal(system(cmd), 0);
		unlink(tmp[0]);
	}
}

/* A model with a training split only (bad_loss, 256 samples, its loss
 * left finite): validation needs --val-fraction, which must hold out at
 * least one sample. */
static void test_no_test_split(void **state)
{
	(void)state;
	const char *model = h_build("lib/bad_loss.so"), *margs = "--from 1000000";
	run r;
	start(&r, 2);
	args(&r, "--max-steps", "2", "--batch-size", "32", "--eval-every", "1", NULL);
	char *out = finish_with(&r, 1, model, margs);
	assert_non_null(strstr(out, "--eval-every: the model declares no test split to validate "
				    "on; hold out part of the training split with --val-fraction F"));
	free(out);
	start(&r, 2);
	args(&r, "--max-steps", "2", "--batch-size", "32", "--eval-every", "1", "--val-fraction",
	     "0.001", NULL);
	out = finish_with(&r, 1, model, margs);
	assert_non_null(strstr(out, "--val-fraction 0.001 of the training split's 256 samples "
				    "holds out 0: nothing to validate on"));
	free(out);
	/* a fraction just below 1 is said as given (it said "--val-fraction
	 * 1", a value hpulaunch refuses) */
	start(&r, 2);
	args(&r, "--max-steps", "2", "--batch-size", "32", "--eval-every", "1", "--val-fraction",
	     "0.99999999", NULL);
	out = finish_with(&r, 1, model, margs);
	assert_non_null(strstr(out, "--val-fraction 0.99999999 of the training split's 256 samples "
				    "holds out 256: nothing to train on"));
	free(out);
	start(&r, 2);
	args(&r, "--max-steps", "2", "--batch-size", "32", "--eval-every", "1", "--val-fraction",
	     "0.25", NULL);
	out = finish_with(&r, 0, model, margs);
	assert_non_null(strstr(out, "64 samples of the training split held out (--val-fraction "
				    "0.25), 192 left to train on"));
	assert_non_null(strstr(out, "step 2 validation: val_loss "));
	assert_non_null(strstr(out, "(64 samples)"));
	free(out);
}

/* --early-stop's refusals: its form, its metric, no validation. */
static void test_early_stop_bad(void **state)
{
	(void)state;
	const char *rule[] = {"val_loss", "loss,2", "val_loss:up,2", "val_loss,0", "val_loss,2,-1",
			      "val_f1,2"};
	const char *says[] = {
		"--early-stop val_loss: no PATIENCE: expected METRIC[:min|max],PATIENCE[,MIN_DELTA]",
		"--early-stop loss,2: the metric 'loss' is not a validation one: give val_loss or "
		"val_<a metric of the model>",
		"--early-stop val_loss:up,2: mode 'up' is neither min nor max",
		"--early-stop val_loss,0: PATIENCE '0' is not a whole number of validations from 1",
		"--early-stop val_loss,2,-1: MIN_DELTA '-1' is not a number of 0 or more",
		"--early-stop val_f1,2: the model declares no metric f1 (it has val_loss and "
		"val_accuracy)",
	};
	for (size_t k = 0; k < sizeof says / sizeof *says; k++) {
		run r;
		start(&r, 1);
		args(&r, "--eval-every", "2", "--early-stop", rule[k], NULL);
		char *out = finish(&r, k == 5 ? 1 : 2, NULL);
		if (!strstr(out, says[k]))
			fail_msg("case %zu: no \"%s\" in:\n%s", k, says[k], out);
		free(out);
	}
	run r;
	start(&r, 1);
	args(&r, "--early-stop", "val_loss,2", NULL);
	char *out = finish(&r, 2, NULL);
	assert_non_null(strstr(out, "--early-stop val_loss,2 watches the validation: add "
				    "--eval-every N or --eval-every-epochs N"));
	free(out);
}

/* 0, negative and fractions outside (0, 1) are refused, saying so. */
static void test_bad_values(void **state)
{
	(void)state;
	const char *bad[][5] = {
		{"--eval-every", "0", NULL},
		{"--eval-every", "-2", NULL},
		{"--eval-every-epochs", "0", NULL},
		{"--eval-every-epochs", "1.5", NULL},
		{"--val-fraction", "1", "--eval-every", "2", NULL},
		{"--val-fraction", "0", "--eval-every", "2", NULL},
		{"--val-fraction", "-0.1", "--eval-every", "2", NULL},
		{"--val-fraction", "0.2", NULL},
	};
	const char *says[] = {
		"bad value '0' for --eval-every: expected an integer from 1 to",
		"bad value '-2' for --eval-every: expected an integer from 1 to",
		"--eval-every-epochs 0: give a whole number of epochs from 1, or a fraction of one "
		"above 0 and below 1 (0.25: every quarter of an epoch)",
		"--eval-every-epochs 1.5: give a whole number of epochs from 1, or a fraction",
		"--val-fraction 1: give a fraction above 0 and below 1 of the training split to "
		"hold out for validation",
		"--val-fraction 0: give a fraction above 0 and below 1",
		"bad value '-0.1' for --val-fraction: expected a number from 0 to 1",
		"--val-fraction 0.2 holds out samples that nothing validates on: add --eval-every N "
		"or --eval-every-epochs N",
	};
	for (size_t k = 0; k < sizeof says / sizeof *says; k++) {
		run r;
		start(&r, 1);
		for (int i = 0; bad[k][i]; i++)
			arg(&r, bad[k][i]);
		char *out = finish(&r, 2, NULL);
		if (!strstr(out, says[k]))
			fail_msg("case %zu: no \"%s\" in:\n%s", k, says[k], out);
		free(out);
	}
}

int main(void)
{
	paths();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_values),
		cmocka_unit_test(test_eval_every_matches_eval_only),
		cmocka_unit_test(test_validation_leaves_training_alone),
		cmocka_unit_test(test_val_fraction),
		cmocka_unit_test(test_val_fraction_windows),
		cmocka_unit_test(test_config_keys),
		cmocka_unit_test(test_eval_fraction_of_epoch),
		cmocka_unit_test(test_no_test_split),
		cmocka_unit_test(test_early_stop),
		cmocka_unit_test(test_early_stop_bad),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
