/* A model's declared training defaults (HPU_MODEL's .defaults), with the
 * real launcher and workers: they replace the built-in defaults, a
 * --config file and flags replace them (built-in < model < config <
 * flag), --verbose says where each setting came from, and a value no
 * flag would take is refused naming the model and the field; hpulaunch
 * checks the declared batch against the world size before the workers
 * start, or says it cannot read it and leaves that to them. */
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

/* Runs hpulaunch on `devices` workers with `extra` options
 * (NULL-terminated, at most 8) before `model`; returns its exit code with
 * its output in p. */
static int launch_on(proc *p, const char *devices, const char *model, const char *const *extra)
{
	char *argv[16] = {(char *)LAUNCH, "--devices", (char *)devices, "--verbose", "--log-every",
			  "1"};
	int n = 6;
	for (int k = 0; extra && extra[k] && n < 14; k++)
		argv[n++] = (char *)extra[k];
	argv[n++] = (char *)model;
	argv[n] = NULL;
	int code = h_run(p, argv, NULL, 120000);
	printf("%s", p->out);
	return code;
}

/* The same on 2 workers. */
static int launch(proc *p, const char *model, const char *const *extra)
{
	return launch_on(p, "2", model, extra);
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
	/* the key that set it (configuration.md: it said only "config") */
	has(&p, "setting --batch-size 32 (config: train_batch_size)");
	has(&p, "setting --momentum 0.5 (config: optimizer.params.momentum)");
	has(&p, "setting --lr 0.3 (flag)");
	has(&p, "setting --epochs 2 (model)");
	has(&p, "epoch 1/2 step 1/16 ");
	has(&p, "lr 0.3 ");
	h_free(&p);
	/* a value the file only implies (DeepSpeed's default for a key its
	 * section left out: WarmupLR's warmup_max_lr 0.001, the lr) gives
	 * way to the model's declared one */
	assert_int_equal(h_write_file(cfg, "{\"scheduler\": {\"type\": \"WarmupLR\", "
					   "\"params\": {\"warmup_num_steps\": 2}}}",
				      0644),
			 0);
	const char *implied[] = {"--config", cfg, NULL};
	assert_int_equal(launch(&p, MODEL, implied), 0);
	has(&p, "setting --lr 0.05 (model)");
	has(&p, "setting --scheduler warmup (config: scheduler.type)");
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

/* hpulaunch checks the batch the model declares, not the built-in 256,
 * against the world size before any worker starts: 96 divides among 3
 * workers (256 does not), not among 5; defaults_model's 16 not among 3. */
static void test_launcher_checks_model_batch(void **state)
{
	(void)state;
	proc p;
	assert_int_equal(launch_on(&p, "3", h_build("lib/batch96_model.so"), NULL), 0);
	has(&p, "setting --batch-size 96 (model)");
	has(&p, "setting --micro-batch-size 32 (resolved)");
	has(&p, "trained 4 steps on 3 workers"); /* 256 samples: 2 batches, 2 epochs */
	h_free(&p);
	assert_int_equal(launch_on(&p, "5", h_build("lib/batch96_model.so"), NULL), 2);
	has(&p, "hpulaunch: error: the model's default --batch-size 96 is not divisible by "
		"--grad-accum 1 x world size 5");
	assert_null(strstr(p.out, "[rank ")); /* no worker started */
	h_free(&p);
	assert_int_equal(launch_on(&p, "3", MODEL, NULL), 2);
	has(&p, "hpulaunch: error: the model's default --batch-size 16 is not divisible by "
		"--grad-accum 1 x world size 3");
	h_free(&p);
}

/* A model whose entry is filled in when it is loaded (late96_model: in
 * .bss): hpulaunch cannot read its batch from the file, says so and leaves
 * the check to the workers, which find 96. */
static void test_launcher_defers_unreadable_batch(void **state)
{
	(void)state;
	proc p;
	assert_int_equal(launch_on(&p, "3", h_build("lib/late96_model.so"), NULL), 0);
	has(&p, "late96_model.so may declare its own batch size, which cannot be read from the "
		"file (its hpu_model_entry has no bytes in the file, being set when the model is "
		"loaded): the 3 workers check the batch when they load the model");
	has(&p, "setting --batch-size 96 (model)");
	has(&p, "trained 4 steps on 3 workers");
	h_free(&p);
	assert_int_not_equal(launch_on(&p, "5", h_build("lib/late96_model.so"), NULL), 0);
	has(&p, "the model's default --batch-size 96 is not divisible by --grad-accum 1 x world "
		"size 5");
	assert_null(strstr(p.out, "--batch-size 256"));
	h_free(&p);
	/* --grad-accum 3 at 2 workers and at 1: 96 divides, 256 does not;
	 * it was refused "not divisible by --grad-accum 3 x world size 1" */
	const char *const ga3[] = {"--grad-accum", "3", "--max-steps", "2", NULL};
	for (int w = 1; w <= 2; w++) {
		assert_int_equal(launch_on(&p, w == 1 ? "1" : "2", h_build("lib/late96_model.so"),
					   ga3),
				 0);
		has(&p, w == 1 ? "cannot be read from the file (its hpu_model_entry has no bytes in "
				 "the file, being set when the model is loaded): the worker checks"
			       : "the 2 workers check the batch when they load the model");
		has(&p, "trained 2 steps");
		h_free(&p);
	}
	/* a --batch-size given is the job's whatever the model declares:
	 * refused here, naming the world size it is run at */
	const char *const given[] = {"--batch-size", "100", NULL};
	assert_int_equal(launch_on(&p, "3", h_build("lib/late96_model.so"), given), 2);
	has(&p, "--batch-size 100 is not divisible by --grad-accum 1 x world size 3");
	h_free(&p);
}

/* An entry whose bytes are in the file but whose batch size is set at
 * load (latedata96_model, in .data: a C++ default computed by a call):
 * hpulaunch read 0 there, took it as no batch declared and said nothing,
 * and the job ended "during setup" with no reason on hpulaunch's line.
 * Now the file's .data is not trusted (said as above), and a worker's
 * refusal of the batch is hpulaunch's closing error. */
static void test_launcher_defers_data_entry(void **state)
{
	(void)state;
	proc p;
	assert_int_equal(launch_on(&p, "3", h_build("lib/latedata96_model.so"), NULL), 0);
	has(&p, "latedata96_model.so may declare its own batch size, which cannot be read from "
		"the file (its hpu_model_entry is in writable data, not constant: part of it may "
		"be set when the model is loaded");
	has(&p, "setting --batch-size 96 (model)");
	has(&p, "trained 4 steps on 3 workers");
	h_free(&p);
	assert_int_not_equal(launch_on(&p, "5", h_build("lib/latedata96_model.so"), NULL), 0);
	has(&p, "hpulaunch: error: rank ");
	has(&p, "during setup, before step 1: the model's default --batch-size 96 is not divisible "
		"by --grad-accum 1 x world size 5");
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
		cmocka_unit_test(test_launcher_checks_model_batch),
		cmocka_unit_test(test_launcher_defers_unreadable_batch),
		cmocka_unit_test(test_launcher_defers_data_entry),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
