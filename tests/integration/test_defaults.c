/* A model's declared training defaults (HPU_MODEL's .defaults), with the
 * real launcher and workers: they replace the built-in defaults, a
 * --config file and flags replace them (built-in < model < config <
 * flag), --verbose says where each setting came from, and a value no
 * flag would take is refused naming the model and the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness.h"

#define LAUNCH h_build("bin/hpulaunch")
#define MODEL h_build("lib/defaults_model.so")

/* Runs hpulaunch on 2 workers with `extra` options (NULL-terminated, at
 * most 8) before `model`; returns its exit code with its output in p. */
static int launch(proc *p, const char *model, const char *const *extra)
{
	char *argv[16] = {(char *)LAUNCH, "--devices", "2", "--verbose", "--log-every", "1"};
	int n = 6;
	for (int k = 0; extra && extra[k] && n < 14; k++)
		argv[n++] = (char *)extra[k];
	argv[n++] = (char *)model;
	argv[n] = NULL;
	int code = h_run(p, argv, NULL, 120000);
	printf("%s", p->out);
	return code;
}

static void has(const proc *p, const char *text)
{
	if (!strstr(p->out, text))
		fail_msg("missing from the output: \"%s\"", text);
}

/* No flags: the model's defaults are the run's settings. */
static void test_model_defaults_apply(void **state)
{
	(void)state;
	proc p;
	assert_int_equal(launch(&p, MODEL, NULL), 0);
	has(&p, "setting --epochs 2 (model)");
	has(&p, "setting --batch-size 16 (model)");
	has(&p, "setting --micro-batch-size 8 (resolved)");
	has(&p, "setting --optimizer sgd (model)");
	has(&p, "setting --lr 0.05 (model)");
	has(&p, "setting --scheduler cosine (model)");
	has(&p, "setting --seed 42 (default)");
	/* 256 samples in batches of 16, twice; the first step at the peak lr */
	has(&p, "epoch 1/2 step 1/32 ");
	has(&p, "lr 0.05 ");
	h_free(&p);
}

/* A flag beats the model's default; the rest stay the model's. */
static void test_flag_beats_model(void **state)
{
	(void)state;
	proc p;
	const char *extra[] = {"--lr", "0.2", "--epochs", "1", NULL};
	assert_int_equal(launch(&p, MODEL, extra), 0);
	has(&p, "setting --lr 0.2 (flag)");
	has(&p, "setting --epochs 1 (flag)");
	has(&p, "setting --scheduler cosine (model)");
	has(&p, "epoch 1/1 step 1/16 ");
	has(&p, "lr 0.2 ");
	h_free(&p);
}

/* The config file beats the model's default, and a flag the file. */
static void test_config_beats_model(void **state)
{
	(void)state;
	char dir[256], cfg[300];
	h_scratch_dir(dir, sizeof dir);
	snprintf(cfg, sizeof cfg, "%s/ds.json", dir);
	assert_int_equal(h_write_file(cfg, "{\"train_batch_size\": 32, \"optimizer\": {\"type\": "
					   "\"SGD\", \"params\": {\"lr\": 0.1, \"momentum\": 0.5}}}",
				      0644),
			 0);
	proc p;
	const char *extra[] = {"--config", cfg, "--lr", "0.3", NULL};
	assert_int_equal(launch(&p, MODEL, extra), 0);
	has(&p, "setting --batch-size 32 (config)");
	has(&p, "setting --momentum 0.5 (config)");
	has(&p, "setting --lr 0.3 (flag)");
	has(&p, "setting --epochs 2 (model)");
	has(&p, "epoch 1/2 step 1/16 ");
	has(&p, "lr 0.3 ");
	h_free(&p);
	h_rmtree(dir);
}

/* A run stopped at a checkpoint resumes with the model's defaults again
 * (its global batch of 16, which the checkpoint recorded). */
static void test_resume_keeps_model_defaults(void **state)
{
	(void)state;
	char dir[256];
	h_scratch_dir(dir, sizeof dir);
	proc p;
	const char *first[] = {"--checkpoint-dir", dir, "--stop-at-step", "5", NULL};
	assert_int_equal(launch(&p, MODEL, first), 0);
	h_free(&p);
	const char *again[] = {"--checkpoint-dir", dir, "--resume", "auto", NULL};
	assert_int_equal(launch(&p, MODEL, again), 0);
	has(&p, "setting --batch-size 16 (model)");
	has(&p, "resumed from ");
	has(&p, "epoch 1/2 step 6/32 ");
	h_free(&p);
	h_rmtree(dir);
}

/* A declared value no flag would take stops the job, naming the model
 * and the field. */
static void test_invalid_default_refused(void **state)
{
	(void)state;
	proc p;
	assert_int_equal(launch(&p, h_build("lib/bad_defaults_model.so"), NULL), 1);
	has(&p, "bad_defaults_model.so declares an invalid default .defaults.scheduler in "
		"HPU_MODEL: 'cosin' is not a valid --scheduler: expected");
	h_free(&p);
	/* refused even where a flag overrides it: the model is wrong */
	const char *extra[] = {"--scheduler", "constant", NULL};
	assert_int_equal(launch(&p, h_build("lib/bad_defaults_model.so"), extra), 1);
	has(&p, "declares an invalid default .defaults.scheduler");
	h_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_model_defaults_apply),
		cmocka_unit_test(test_flag_beats_model),
		cmocka_unit_test(test_config_beats_model),
		cmocka_unit_test(test_resume_keeps_model_defaults),
		cmocka_unit_test(test_invalid_default_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
