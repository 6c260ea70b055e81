/* Unit tests for the training options (options/config.c): defaults, parsing
 * of "--name value" / "--name=value" / flags up to the model path, the
 * error texts (each must name the offending option, so a user can find it
 * on a long command line), and resolving the batch sizes against the world
 * size. The JSON config file's tests are in test_config_file.c.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "options/config.h"
#include "tests/unit/config_testlib.h"
#include "common/fileio.h" /* hpu__read_file */


/* ---- defaults ---- */

static void test_defaults(void **state)
{
	(void)state;
	hpu_train_opts o;
	memset(&o, 0x5a, sizeof(o)); /* defaults must set every field */
	hpu__opts_defaults(&o);
	assert_int_equal(o.epochs, 1);
	assert_int_equal(o.max_steps, -1);
	assert_int_equal(o.batch_size, 256);
	assert_true(o.lr == 1e-3);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAMW);
	assert_true(o.momentum == 0.9);
	assert_int_equal(o.nesterov, 0);
	assert_true(o.beta1 == 0.9);
	assert_true(o.beta2 == 0.999);
	assert_true(o.eps == 1e-8);
	assert_int_equal(o.seed, 42);
	assert_int_equal(o.strategy, HPU_STRATEGY_FAST_DDP);
	assert_int_equal(o.eval, 1);
	assert_string_equal(o.metrics, "");
	assert_string_equal(hpu__optim_name(o.optimizer), "adamw");
	assert_string_equal(hpu__strategy_name(o.strategy), "fast_ddp");
}

static void test_weight_decay_default(void **state)
{
	(void)state;
	hpu_train_opts o;
	hpu__opts_defaults(&o);
	assert_true(hpu__opts_weight_decay(&o) == 0.01);
	o.optimizer = HPU_OPTIM_SGD;
	assert_true(hpu__opts_weight_decay(&o) == 0.0);

	/* set explicitly: taken as is for either optimizer, 0 included */
	char err[256];
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "weight-decay", "0", err,
				       sizeof(err)), 0);
	assert_true(hpu__opts_weight_decay(&o) == 0.0);
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "optimizer", "sgd", err,
				       sizeof(err)), 0);
	assert_int_equal(hpu__opts_set(&o, "weight-decay", "0.05", err,
				       sizeof(err)), 0);
	assert_true(hpu__opts_weight_decay(&o) == 0.05);
}

/* ---- parsing ---- */

static void test_takes_value(void **state)
{
	(void)state;
	assert_int_equal(hpu__opts_takes_value("lr"), 1);
	assert_int_equal(hpu__opts_takes_value("epochs"), 1);
	assert_int_equal(hpu__opts_takes_value("metrics"), 1);
	assert_int_equal(hpu__opts_takes_value("nesterov"), 0);
	assert_int_equal(hpu__opts_takes_value("no-eval"), 0);
	assert_int_equal(hpu__opts_takes_value("frobnicate"), -1);
	assert_int_equal(hpu__opts_takes_value("--lr"), -1);
	assert_int_equal(hpu__opts_takes_value(""), -1);
}

static void test_parse_separate_and_equals(void **state)
{
	(void)state;
	hpu_train_opts a, b;
	char err[256];
	int stop;
	hpu__opts_defaults(&a);
	hpu__opts_defaults(&b);
	assert_int_equal(parse(&a, ARGS("--lr", "0.1", "model.so"), &stop,
			       err, sizeof(err)), 0);
	assert_int_equal(stop, 3);
	assert_true(a.lr == 0.1);
	assert_int_equal(parse(&b, ARGS("--lr=0.1", "model.so"), &stop, err,
			       sizeof(err)), 0);
	assert_int_equal(stop, 2);
	assert_true(b.lr == 0.1);
	assert_memory_equal(&a, &b, sizeof(a));
}

static void test_parse_all(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	int stop;
	char **argv = ARGS("--epochs", "3", "--max-steps=100",
			   "--batch-size", "120", "--optimizer", "sgd",
			   "--momentum", "0.5", "--nesterov", "--weight-decay=0",
			   "--seed", "7", "--strategy=fast_ddp", "--log-every",
			   "0", "--metrics", "/tmp/m.jsonl", "--no-eval",
			   "--beta1", "0.8", "--beta2=0.99", "--eps", "1e-6",
			   "--lr", "2.5e-2", "model.so", "--lr", "9", "--epochs",
			   "5");
	hpu__opts_defaults(&o);
	assert_int_equal(parse(&o, argv, &stop, err, sizeof(err)), 0);
	assert_string_equal(argv[stop], "model.so");
	assert_int_equal(o.epochs, 3);
	assert_int_equal(o.max_steps, 100);
	assert_int_equal(o.batch_size, 120);
	assert_int_equal(o.optimizer, HPU_OPTIM_SGD);
	assert_true(o.momentum == 0.5);
	assert_int_equal(o.nesterov, 1);
	assert_true(hpu__opts_weight_decay(&o) == 0.0);
	assert_int_equal(o.seed, 7);
	assert_int_equal(o.strategy, HPU_STRATEGY_FAST_DDP);
	assert_int_equal(o.log_every, 0);
	assert_string_equal(o.metrics, "/tmp/m.jsonl");
	assert_int_equal(o.eval, 0);
	assert_true(o.beta1 == 0.8);
	assert_true(o.beta2 == 0.99);
	assert_true(o.eps == 1e-6);
	/* options after the model path belong to the model, not to us */
	assert_true(o.lr == 2.5e-2);
}

static void test_parse_stops_at_non_option(void **state)
{
	(void)state;
	hpu_train_opts o, d;
	char err[256];
	int stop;
	hpu__opts_defaults(&d);

	/* nothing to parse */
	char *only[] = {"hpu-worker", NULL};
	o = d;
	assert_int_equal(parse(&o, only, &stop, err, sizeof(err)), 0);
	assert_int_equal(stop, 1);
	assert_memory_equal(&o, &d, sizeof(o));

	/* the model path first: nothing is consumed */
	o = d;
	assert_int_equal(parse(&o, ARGS("model.so", "--lr", "0.5"), &stop,
			       err, sizeof(err)), 0);
	assert_int_equal(stop, 1);
	assert_memory_equal(&o, &d, sizeof(o));

	/* a single-dash argument is not one of our options */
	o = d;
	assert_int_equal(parse(&o, ARGS("--nesterov", "-v", "--lr", "0.5"),
			       &stop, err, sizeof(err)), 0);
	assert_int_equal(stop, 2);
	assert_int_equal(o.nesterov, 1);
	assert_true(o.lr == 1e-3);

	/* a flag does not swallow the model path */
	o = d;
	assert_int_equal(parse(&o, ARGS("--no-eval", "model.so"), &stop, err,
			       sizeof(err)), 0);
	assert_int_equal(stop, 2);
	assert_int_equal(o.eval, 0);

	/* options only, up to the end */
	o = d;
	assert_int_equal(parse(&o, ARGS("--seed", "0", "--nesterov"), &stop,
			       err, sizeof(err)), 0);
	assert_int_equal(stop, 4);
	assert_int_equal(o.seed, 0);
	assert_int_equal(o.nesterov, 1);
}

static void test_set_direct(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "lr", "0.5", err, sizeof(err)), 0);
	assert_true(o.lr == 0.5);
	assert_int_equal(hpu__opts_set(&o, "nesterov", NULL, err, sizeof(err)),
			 0);
	assert_int_equal(o.nesterov, 1);
	assert_int_equal(hpu__opts_set(&o, "lr", NULL, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "lr"));
	assert_int_equal(hpu__opts_set(&o, "nesterov", "1", err, sizeof(err)),
			 -1);
	assert_non_null(strstr(err, "nesterov"));
	assert_int_equal(hpu__opts_set(&o, "bogus", "1", err, sizeof(err)), -1);
	assert_non_null(strstr(err, "bogus"));
	/* a short buffer is truncated, not overrun */
	char tiny[8];
	memset(tiny, 'x', sizeof(tiny));
	assert_int_equal(hpu__opts_set(&o, "bogus", "1", tiny, sizeof(tiny)),
			 -1);
	assert_int_equal(strlen(tiny), sizeof(tiny) - 1);
}

/* ---- errors ---- */

static void test_errors_unknown_and_missing(void **state)
{
	(void)state;
	EXPECT_ERROR(ARGS("--frobnicate", "model.so"), "frobnicate");
	EXPECT_ERROR(ARGS("--frobnicate=3", "model.so"), "frobnicate");
	EXPECT_ERROR(ARGS("--Lr", "0.1"), "Lr");
	EXPECT_ERROR(ARGS("--lr"), "--lr");
	EXPECT_ERROR(ARGS("--epochs", "2", "--batch-size"), "batch-size");
	EXPECT_ERROR(ARGS("--nesterov=1", "model.so"), "nesterov");
	EXPECT_ERROR(ARGS("--no-eval=yes"), "no-eval");
	EXPECT_ERROR(ARGS("--metrics="), "metrics");
	/* longer than any name the parser buffers (64 bytes) */
	EXPECT_ERROR(ARGS("--an-option-name-far-longer-than-any-real-one-"
			  "and-longer-than-sixty-four-bytes=1"),
		     "an-option-name-far-longer");
}

static void test_errors_bad_numbers(void **state)
{
	(void)state;
	EXPECT_ERROR(ARGS("--lr", "abc"), "--lr", "abc");
	EXPECT_ERROR(ARGS("--lr=abc"), "--lr", "abc");
	EXPECT_ERROR(ARGS("--lr", "1e400"), "--lr", "1e400");
	EXPECT_ERROR(ARGS("--lr", "0.1x"), "--lr", "0.1x");
	EXPECT_ERROR(ARGS("--lr", ""), "--lr");
	EXPECT_ERROR(ARGS("--lr", "nan"), "--lr", "nan");
	EXPECT_ERROR(ARGS("--lr", "inf"), "--lr", "inf");
	EXPECT_ERROR(ARGS("--lr", "-0.1"), "--lr", "-0.1");
	EXPECT_ERROR(ARGS("--epochs", "-1"), "--epochs", "-1");
	EXPECT_ERROR(ARGS("--epochs", "0"), "--epochs");
	EXPECT_ERROR(ARGS("--epochs", "1.5"), "--epochs", "1.5");
	EXPECT_ERROR(ARGS("--epochs", "99999999999999999999"), "--epochs");
	EXPECT_ERROR(ARGS("--batch-size", "abc"), "--batch-size", "abc");
	EXPECT_ERROR(ARGS("--batch-size", "0"), "--batch-size");
	EXPECT_ERROR(ARGS("--max-steps", "-5"), "--max-steps", "-5");
	EXPECT_ERROR(ARGS("--momentum", "1.5"), "--momentum", "1.5");
	EXPECT_ERROR(ARGS("--beta2", "1"), "--beta2");
	EXPECT_ERROR(ARGS("--seed", "-1"), "--seed", "-1");
	EXPECT_ERROR(ARGS("--log-every", "-1"), "--log-every");
	/* the error is reported for the bad one, not an earlier good one */
	EXPECT_ERROR(ARGS("--epochs", "2", "--lr", "abc", "model.so"), "--lr",
		     "abc");
	/* a whole number in the exponent form --help prints defaults in
	 * (and the config file takes) is one; a fraction, hex or out of
	 * range is not */
	EXPECT_ERROR(ARGS("--sub-group-size", "1.5e0"), "--sub-group-size", "1.5e0");
	EXPECT_ERROR(ARGS("--sub-group-size", "1e16"), "--sub-group-size", "1e16");
	EXPECT_ERROR(ARGS("--max-steps", "-1e3"), "--max-steps", "-1e3");
	EXPECT_ERROR(ARGS("--epochs", "0x1p3"), "--epochs", "0x1p3");
	EXPECT_ERROR(ARGS("--epochs", "1e"), "--epochs", "1e");
}

/* --sub-group-size 1e9 as --help prints its default (it was refused as
 * "expected an integer", while the config file's 1e9 was taken). */
static void test_exponent_whole_numbers(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	int stop;
	hpu__opts_defaults(&o);
	assert_int_equal(parse(&o, ARGS("--sub-group-size", "1e9", "--reduce-bucket-size", "5E8",
					"--max-steps", "2.5e2", "model.so"),
			       &stop, err, sizeof(err)),
			 0);
	assert_true(o.sub_group_size == 1000000000);
	assert_true(o.reduce_bucket == 500000000);
	assert_int_equal(o.max_steps, 250);
	/* read exactly, past 2^53 too (a double rounded 2^53 + 1 down) */
	assert_int_equal(parse(&o, ARGS("--seed", "9007199254740993e0", "--epochs", "150e-1",
					"model.so"),
			       &stop, err, sizeof(err)),
			 0);
	assert_true(o.seed == 9007199254740993ull);
	assert_int_equal(o.epochs, 15);
	assert_int_equal(parse(&o, ARGS("--seed", "1e16", "model.so"), &stop, err, sizeof(err)), 0);
	assert_true(o.seed == 10000000000000000ull);
}

/* A rejected value leaves its field as it was. */
static void test_rejected_value_keeps_field(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "lr", "abc", err, sizeof(err)), -1);
	assert_true(o.lr == 1e-3);
	assert_int_equal(hpu__opts_set(&o, "epochs", "-1", err, sizeof(err)),
			 -1);
	assert_int_equal(o.epochs, 1);
	assert_int_equal(hpu__opts_set(&o, "optimizer", "lamb", err,
				       sizeof(err)), -1);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAMW);
	assert_int_equal(hpu__opts_set(&o, "strategy", "fsdp", err,
				       sizeof(err)), -1);
	assert_int_equal(o.strategy, HPU_STRATEGY_FAST_DDP);
	assert_int_equal(hpu__opts_set(&o, "metrics", "", err, sizeof(err)),
			 -1);
	assert_string_equal(o.metrics, "");
}

static void test_errors_unknown_choice(void **state)
{
	(void)state;
	EXPECT_ERROR(ARGS("--optimizer", "lamb"), "optimizer", "lamb");
	EXPECT_ERROR(ARGS("--optimizer=SGD"), "optimizer", "SGD");
	EXPECT_ERROR(ARGS("--strategy", "fsdp"), "strategy", "fsdp");
	EXPECT_ERROR(ARGS("--strategy="), "strategy");
}

/* ---- checks against the world size ---- */

static void test_resolve_world(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	hpu__opts_defaults(&o);
	for (int w = 1; w <= 8; w *= 2) {
		assert_int_equal(hpu__opts_resolve(&o, w, err, sizeof(err)), 0);
		assert_int_equal(o.batch_size, 256);
		assert_int_equal(o.grad_accum, 1);
		assert_int_equal(o.micro_batch, 256 / w);
	}

	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "batch-size", "1000", err,
				       sizeof(err)), 0);
	assert_int_equal(hpu__opts_resolve(&o, 5, err, sizeof(err)), 0);
	assert_int_equal(o.micro_batch, 200);
	err[0] = 0;
	assert_int_equal(hpu__opts_resolve(&o, 7, err, sizeof(err)), -1);
	printf("  batch 1000, world 7 -> \"%s\"\n", err);
	assert_non_null(strstr(err, "--batch-size 1000"));
	assert_non_null(strstr(err, "world size 7"));

	/* every strategy is accepted now */
	const hpu_strategy all[] = {HPU_STRATEGY_FAST_DDP, HPU_STRATEGY_DDP,
				    HPU_STRATEGY_ZERO1, HPU_STRATEGY_ZERO2,
				    HPU_STRATEGY_ZERO3};
	const char *names[] = {"fast_ddp", "ddp", "zero1", "zero2", "zero3"};
	for (size_t k = 0; k < 5; k++) {
		hpu__opts_defaults(&o);
		assert_int_equal(hpu__opts_set(&o, "strategy", names[k], err,
					       sizeof(err)), 0);
		assert_int_equal(o.strategy, all[k]);
		assert_string_equal(hpu__strategy_name(o.strategy), names[k]);
		assert_int_equal(hpu__opts_resolve(&o, 4, err, sizeof(err)), 0);
	}
}

static void test_help_lists_options(void **state)
{
	(void)state;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	hpu__opts_help(f);
	fclose(f);
	const char *names[] = {
	    "--epochs", "--max-steps", "--batch-size", "--micro-batch-size",
	    "--grad-accum", "--lr", "--optimizer", "--momentum", "--nesterov",
	    "--weight-decay", "--beta1", "--beta2", "--eps", "--clip-grad-norm",
	    "--scheduler", "--warmup-steps", "--warmup-type", "--warmup-min-lr",
	    "--total-steps", "--step-size", "--gamma", "--min-lr", "--seed",
	    "--strategy", "--reduce-bucket-size", "--bucket-cap-mb",
	    "--allgather-bucket-size", "--overlap-comm", "--no-overlap-comm",
	    "--prefetch-bucket-size", "--param-persistence-threshold",
	    "--max-live-parameters", "--grad-comm-dtype",
	    "--activation-checkpointing", "--device-memory", "--log-every",
	    "--metrics", "--save-params", "--config", "--no-eval"};
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		assert_non_null(strstr(buf, names[k]));
		assert_int_not_equal(hpu__opts_takes_value(names[k] + 2), -1);
	}
	assert_null(strstr(buf, "not yet"));
	free(buf);
}

/* ---- the options added with the config file ---- */

static void test_defaults_new_fields(void **state)
{
	(void)state;
	hpu_train_opts o;
	memset(&o, 0x5a, sizeof(o));
	hpu__opts_defaults(&o);
	assert_int_equal(o.micro_batch, 0);
	assert_int_equal(o.grad_accum, 1);
	assert_true(o.clip_norm == 0);
	assert_int_equal(o.sched, HPU_SCHED_CONSTANT);
	assert_int_equal(o.warmup_steps, 1000);
	assert_int_equal(o.warmup_type, HPU_WARMUP_LOG);
	assert_true(o.warmup_min_lr == 0);
	assert_int_equal(o.total_steps, 0);
	assert_int_equal(o.step_size, 1000);
	assert_true(o.gamma == 0.1);
	assert_true(o.min_lr == 0);
	assert_int_equal(o.reduce_bucket, 6553600);
	assert_int_equal(o.allgather_bucket, 500000000);
	assert_int_equal(o.overlap_comm, 1);
	assert_int_equal(o.prefetch_bucket, 50000000);
	assert_int_equal(o.persistence_threshold, 100000);
	assert_int_equal(o.max_live_params, 1000000000);
	assert_int_equal(o.grad_comm_dtype, HPU_COMM_FP32);
	assert_int_equal(o.activation_checkpointing, 0);
	assert_int_equal(o.device_memory, 0);
	assert_int_equal(o.log_every, 50);
	assert_string_equal(o.save_params, "");
	assert_string_equal(o.config, "");
	for (int k = 0; k < HPU_OPTS_MAX; k++)
		assert_int_equal(o.from[k], HPU_FROM_DEFAULT);
	assert_string_equal(hpu__sched_name(o.sched), "constant");
	assert_string_equal(hpu__sched_name(HPU_SCHED_STEP), "step");
	assert_string_equal(hpu__sched_name(HPU_SCHED_COSINE), "cosine");
	assert_string_equal(hpu__sched_name(HPU_SCHED_WARMUP), "warmup");
	assert_string_equal(hpu__sched_name(HPU_SCHED_WARMUP_DECAY),
			    "warmup_decay");
	assert_string_equal(hpu__optim_name(HPU_OPTIM_SGD), "sgd");
	assert_string_equal(hpu__optim_name(HPU_OPTIM_ADAM), "adam");
	/* torch.optim.Adam's weight decay defaults to 0, AdamW's to 0.01 */
	o.optimizer = HPU_OPTIM_ADAM;
	assert_true(hpu__opts_weight_decay(&o) == 0.0);
}

static void test_parse_new_flags(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	int stop;
	char **argv = ARGS(
	    "--micro-batch-size", "8", "--grad-accum=4", "--clip-grad-norm",
	    "1.5", "--scheduler", "warmup_decay", "--warmup-steps", "10",
	    "--warmup-type", "linear", "--warmup-min-lr", "1e-5",
	    "--total-steps", "100", "--step-size", "30", "--gamma", "0.5",
	    "--min-lr", "1e-6", "--optimizer", "adam", "--reduce-bucket-size",
	    "1000", "--allgather-bucket-size", "2000", "--no-overlap-comm",
	    "--prefetch-bucket-size", "0", "--param-persistence-threshold",
	    "7", "--max-live-parameters", "9", "--grad-comm-dtype", "bf16",
	    "--activation-checkpointing", "--device-memory", "1.5G",
	    "--save-params", "/tmp/p.bin", "--strategy", "zero3", "model.so");
	hpu__opts_defaults(&o);
	assert_int_equal(parse(&o, argv, &stop, err, sizeof(err)), 0);
	assert_string_equal(argv[stop], "model.so");
	assert_int_equal(o.micro_batch, 8);
	assert_int_equal(o.grad_accum, 4);
	assert_true(o.clip_norm == 1.5);
	assert_int_equal(o.sched, HPU_SCHED_WARMUP_DECAY);
	assert_int_equal(o.warmup_steps, 10);
	assert_int_equal(o.warmup_type, HPU_WARMUP_LINEAR);
	assert_true(o.warmup_min_lr == 1e-5);
	assert_int_equal(o.total_steps, 100);
	assert_int_equal(o.step_size, 30);
	assert_true(o.gamma == 0.5);
	assert_true(o.min_lr == 1e-6);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAM);
	assert_int_equal(o.reduce_bucket, 1000);
	assert_int_equal(o.allgather_bucket, 2000);
	assert_int_equal(o.overlap_comm, 0);
	assert_int_equal(o.prefetch_bucket, 0);
	assert_int_equal(o.persistence_threshold, 7);
	assert_int_equal(o.max_live_params, 9);
	assert_int_equal(o.grad_comm_dtype, HPU_COMM_BF16);
	assert_int_equal(o.activation_checkpointing, 1);
	assert_int_equal(o.device_memory, 1610612736ull);
	assert_string_equal(o.save_params, "/tmp/p.bin");
	assert_int_equal(o.strategy, HPU_STRATEGY_ZERO3);

	/* every scheduler and strategy name, the aliases */
	const char *sched[] = {"constant", "step", "cosine", "warmup",
			       "warmup_decay"};
	for (int k = 0; k < 5; k++) {
		assert_int_equal(hpu__opts_set(&o, "scheduler", sched[k], err,
					       sizeof(err)), 0);
		assert_int_equal(o.sched, k);
	}
	/* another name of an option given with another value is refused
	 * (it took the last in silence), the same value taken; a flag and
	 * its --no- form: the later wins (a wrapper's default overridden) */
	assert_int_equal(hpu__opts_set(&o, "overlap-comm", NULL, err,
				       sizeof(err)), 0);
	assert_int_equal(o.overlap_comm, 1);
	assert_int_equal(hpu__opts_set(&o, "bucket-cap-mb", "25", err,
				       sizeof(err)), -1);
	assert_non_null(strstr(err, "--reduce-bucket-size 1000 and --bucket-cap-mb 25 MiB name "
				    "one option with two values: give one"));
	assert_int_equal(o.reduce_bucket, 1000);
	assert_int_equal(hpu__opts_set(&o, "reduce-bucket-size", "6553600", err,
				       sizeof(err)), 0);
	assert_int_equal(hpu__opts_set(&o, "bucket-cap-mb", "25", err,
				       sizeof(err)), 0);
	/* one name given twice: its last value */
	assert_int_equal(hpu__opts_set(&o, "no-overlap-comm", NULL, err,
				       sizeof(err)), 0);
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "overlap-comm", NULL, err,
				       sizeof(err)), 0);
	assert_int_equal(o.overlap_comm, 1);
	assert_int_equal(hpu__opts_set(&o, "bucket-cap-mb", "25", err,
				       sizeof(err)), 0);
	assert_int_equal(o.reduce_bucket, 6553600);
	assert_int_equal(hpu__opts_set(&o, "bucket-cap-mb", "0.5", err,
				       sizeof(err)), 0);
	assert_int_equal(o.reduce_bucket, 131072);
	assert_int_equal(hpu__opts_set(&o, "grad-comm-dtype", "fp32", err,
				       sizeof(err)), 0);
	assert_int_equal(o.grad_comm_dtype, HPU_COMM_FP32);
	assert_int_equal(hpu__opts_set(&o, "warmup-type", "log", err,
				       sizeof(err)), 0);
	assert_int_equal(o.warmup_type, HPU_WARMUP_LOG);
	assert_int_equal(hpu__opts_set(&o, "device-memory", "4096", err,
				       sizeof(err)), 0);
	assert_int_equal(o.device_memory, 4096);

	assert_int_equal(hpu__opts_takes_value("config"), 1);
	assert_int_equal(hpu__opts_takes_value("device-memory"), 1);
	assert_int_equal(hpu__opts_takes_value("activation-checkpointing"), 0);
	assert_int_equal(hpu__opts_takes_value("no-overlap-comm"), 0);
}

static void test_errors_new_flags(void **state)
{
	(void)state;
	EXPECT_ERROR(ARGS("--micro-batch-size", "0"), "--micro-batch-size");
	EXPECT_ERROR(ARGS("--grad-accum", "x"), "--grad-accum", "x");
	EXPECT_ERROR(ARGS("--clip-grad-norm", "-1"), "--clip-grad-norm", "-1");
	EXPECT_ERROR(ARGS("--scheduler", "onecycle"), "--scheduler",
		     "onecycle", "warmup_decay");
	EXPECT_ERROR(ARGS("--warmup-type", "exp"), "--warmup-type", "exp");
	EXPECT_ERROR(ARGS("--step-size", "0"), "--step-size");
	EXPECT_ERROR(ARGS("--reduce-bucket-size", "-1"), "--reduce-bucket-size");
	EXPECT_ERROR(ARGS("--bucket-cap-mb", "0"), "--bucket-cap-mb");
	/* below one fp32 element: "above 0" was said of a value above 0 */
	EXPECT_ERROR(ARGS("--bucket-cap-mb", "0.0000038"), "--bucket-cap-mb",
		     "from 4 bytes (one fp32 element, 0.0000039)");
	EXPECT_ERROR(ARGS("--grad-comm-dtype", "fp8"), "--grad-comm-dtype",
		     "fp8");
	EXPECT_ERROR(ARGS("--device-memory", "0"), "--device-memory");
	EXPECT_ERROR(ARGS("--device-memory", "lots"), "--device-memory",
		     "lots");
	EXPECT_ERROR(ARGS("--activation-checkpointing=1"),
		     "activation-checkpointing");
	EXPECT_ERROR(ARGS("--save-params="), "save-params");
	EXPECT_ERROR(ARGS("--config="), "--config");
	EXPECT_ERROR(ARGS("--config", "/nonexistent/hpu.json"),
		     "/nonexistent/hpu.json", "No such file");
}

static void test_parse_size(void **state)
{
	(void)state;
	static const struct {
		const char *s;
		uint64_t v;
	} good[] = {
	    {"0", 0},
	    {"4096", 4096},
	    {"4096B", 4096},
	    {"512K", 524288},
	    {"512k", 524288},
	    {"512KB", 524288},
	    {"512KiB", 524288},
	    {"1.5G", 1610612736ull},
	    {"2GiB", 2147483648ull},
	    {"2gib", 2147483648ull},
	    {"64MB", 67108864},
	    {"64MiB", 67108864},
	    {"64mb", 67108864},
	    {"1T", 1099511627776ull},
	    {"0.5K", 512},
	    {"18446744073709551615", UINT64_MAX},
	};
	for (size_t k = 0; k < sizeof(good) / sizeof(good[0]); k++) {
		uint64_t v = 1;
		if (hpu__parse_size(good[k].s, &v) != 0 || v != good[k].v)
			fail_msg("\"%s\" -> %llu, expected %llu", good[k].s,
				 (unsigned long long)v,
				 (unsigned long long)good[k].v);
	}
	const char *bad[] = {"", "K", "-1", "+1", " 1", "1 ", "1.", ".5K",
			     "1.5", "1e3", "0x10", "12Q", "1KK", "1iB", "1Kb2",
			     "2GB!", "inf", "20000000T",
			     "18446744073709551616", "99999999999999999999K"};
	for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
		uint64_t v = 7;
		if (hpu__parse_size(bad[k], &v) != -1 || v != 7)
			fail_msg("\"%s\" was accepted", bad[k]);
	}
}

/* fp8 and fp8 inference's flags. */
static void test_fp8_flags(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	int stop;
	hpu__opts_defaults(&o);
	assert_int_equal(o.fp8_amax_history, 16);
	assert_int_equal(o.fp8_margin, 0);
	assert_int_equal(o.fp8_amax_algo, HPU_FP8_ALGO_MAX);
	assert_int_equal(o.calib_batches, 16);
	assert_int_equal(o.eval_only, 0);
	assert_int_equal(parse(&o, ARGS("--precision", "fp8", "--fp8-amax-history", "4",
					"--fp8-margin", "2", "--fp8-amax-compute-algo",
					"most_recent", "--eval-only", "--load-params", "p.bin",
					"--calibration-batches", "3", "m.so"),
			       &stop, err, sizeof err),
			 0);
	assert_int_equal(o.precision, HPU_PREC_FP8);
	assert_string_equal(hpu__precision_name(o.precision), "fp8");
	assert_int_equal(o.fp8_amax_history, 4);
	assert_int_equal(o.fp8_margin, 2);
	assert_int_equal(o.fp8_amax_algo, HPU_FP8_ALGO_MOST_RECENT);
	assert_int_equal(o.eval_only, 1);
	assert_string_equal(o.load_params, "p.bin");
	assert_int_equal(o.calib_batches, 3);
	EXPECT_ERROR(ARGS("--precision", "fp4"), "--precision", "fp4", "fp8");
	EXPECT_ERROR(ARGS("--fp8-amax-history", "0"), "--fp8-amax-history", "0");
	EXPECT_ERROR(ARGS("--fp8-amax-compute-algo", "avg"), "--fp8-amax-compute-algo", "avg");
}

/* --profile takes a directory when one follows, and not the model or the
 * next option; the observing options' values and defaults. */
static void test_profile_flags(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	int stop;
	assert_int_equal(hpu__opts_takes_value("profile"), 2);
	assert_int_equal(hpu__opts_takes_next("profile", "traces"), 1);
	assert_int_equal(hpu__opts_takes_next("profile", "model.so"), 0);
	assert_int_equal(hpu__opts_takes_next("profile", "--max-steps"), 0);
	assert_int_equal(hpu__opts_takes_next("profile", NULL), 0);
	assert_int_equal(hpu__opts_takes_next("profile", ""), 0);
	assert_int_equal(hpu__opts_takes_next("max-steps", "model.so"), 1);
	assert_int_equal(hpu__opts_takes_next("eval-only", "x"), 0);

	hpu__opts_defaults(&o);
	assert_string_equal(o.profile, "");
	assert_string_equal(o.profile_name, "perf-logs");
	assert_int_equal(o.throughput_warmup, 1);
	assert_true(o.stall_warning == 30);
	char *a1[] = {"w", "--profile", "m.so", NULL};
	assert_int_equal(parse(&o, a1, &stop, err, sizeof err), 0);
	assert_string_equal(o.profile, ".");
	assert_int_equal(stop, 2); /* stops at the model */

	hpu__opts_defaults(&o);
	char *a2[] = {"w", "--profile", "/tmp/tr", "--profile-filename", "run1",
		      "--throughput-warmup-steps", "0", "--stall-warning", "2.5", "m.so", NULL};
	assert_int_equal(parse(&o, a2, &stop, err, sizeof err), 0);
	assert_string_equal(o.profile, "/tmp/tr");
	assert_string_equal(o.profile_name, "run1");
	assert_int_equal(o.throughput_warmup, 0);
	assert_true(o.stall_warning == 2.5);
	assert_int_equal(stop, 9);

	hpu__opts_defaults(&o);
	char *a3[] = {"w", "--profile", "--max-steps", "3", NULL};
	assert_int_equal(parse(&o, a3, &stop, err, sizeof err), 0);
	assert_string_equal(o.profile, ".");
	assert_int_equal(o.max_steps, 3);

	hpu__opts_defaults(&o);
	char *a4[] = {"w", "--profile=d2", NULL};
	assert_int_equal(parse(&o, a4, &stop, err, sizeof err), 0);
	assert_string_equal(o.profile, "d2");

	expect_error((char *[]){"w", "--profile=", NULL}, (const char *const[]){"--profile", NULL});
	expect_error((char *[]){"w", "--stall-warning", "-1", NULL},
		     (const char *const[]){"--stall-warning", "-1", NULL});
	expect_error((char *[]){"w", "--throughput-warmup-steps", "x", NULL},
		     (const char *const[]){"--throughput-warmup-steps", NULL});
	/* a name, not a path: refused before the workers start (each failed
	 * at its first write, "cannot write pf/a/b-rank1.json") */
	const char *names[] = {"a/b", "..", "/abs"};
	for (int k = 0; k < 3; k++) {
		hpu__opts_defaults(&o);
		set_ok(&o, "profile", "pf");
		set_ok(&o, "profile-filename", names[k]);
		assert_int_equal(hpu__opts_resolve(&o, 1, err, sizeof(err)), -1);
		printf("  -> \"%s\"\n", err);
		assert_non_null(strstr(err, "the traces' file name, not a path"));
		assert_non_null(strstr(err, names[k]));
	}
}

/* Checkpoint options: flags, config keys, and what they need together. */
static void test_checkpoint_flags(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	int stop;
	hpu__opts_defaults(&o);
	assert_string_equal(o.checkpoint_dir, "");
	assert_int_equal(o.checkpoint_every, 0);
	assert_int_equal(o.keep, 0);
	assert_string_equal(o.resume, "");
	assert_int_equal(o.stop_at_step, 0);
	assert_int_equal(parse(&o, ARGS("--checkpoint-dir", "/ck", "--checkpoint-every", "5",
					"--keep", "2", "--resume", "auto", "--stop-at-step", "7",
					"m.so"),
			       &stop, err, sizeof err),
			 0);
	assert_string_equal(o.checkpoint_dir, "/ck");
	assert_int_equal(o.checkpoint_every, 5);
	assert_int_equal(o.keep, 2);
	assert_string_equal(o.resume, "auto");
	assert_int_equal(o.stop_at_step, 7);
	assert_int_equal(hpu__opts_resolve(&o, 2, err, sizeof err), 0);
	EXPECT_ERROR(ARGS("--keep", "-1"), "--keep", "-1");
	EXPECT_ERROR(ARGS("--stop-at-step", "0"), "--stop-at-step", "0");

	const struct {
		char **argv;
		const char *want;
	} bad[] = {
		{ARGS("--checkpoint-every", "5"), "--checkpoint-every needs --checkpoint-dir"},
		{ARGS("--keep", "3"), "--keep needs --checkpoint-dir"},
		{ARGS("--resume", "auto"), "--resume auto needs --checkpoint-dir"},
		{ARGS("--resume", "/ck/step-00000010", "--load-params", "p.bin"), "give one"},
		{ARGS("--eval-only", "--resume", "/ck"), "--eval-only does not train"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		hpu__opts_defaults(&o);
		assert_int_equal(parse(&o, bad[i].argv, &stop, err, sizeof err), 0);
		assert_int_equal(hpu__opts_resolve(&o, 2, err, sizeof err), -1);
		if (!strstr(err, bad[i].want))
			fail_msg("'%s' lacks '%s'", err, bad[i].want);
	}

	load_ok("{'hputrain': {'checkpoint_dir': '/c', 'checkpoint_every': 10,"
		" 'keep_checkpoints': 4, 'resume': 'auto'}}",
		&o);
	assert_string_equal(o.checkpoint_dir, "/c");
	assert_int_equal(o.checkpoint_every, 10);
	assert_int_equal(o.keep, 4);
	assert_string_equal(o.resume, "auto");
}

static int dir_entries(const char *path)
{
	DIR *d = opendir(path);
	assert_non_null(d);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

/* The checkpoint directory is made and tried at start, not at the first
 * save after training: an error names the directory and the reason. The
 * failing paths fail for root too. */
static void test_checkpoint_dir_check(void **state)
{
	(void)state;
	hpu_train_opts o;
	char base[64] = "/tmp/hpu-test-ckdir-XXXXXX", err[512] = "";
	assert_non_null(mkdtemp(base));
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_check_checkpoint_dir(&o, err, sizeof err), 0); /* none */
	snprintf(o.checkpoint_dir, sizeof o.checkpoint_dir, "%s/a/b/", base);
	if (hpu__opts_check_checkpoint_dir(&o, err, sizeof err) != 0)
		fail_msg("%s", err);
	struct stat st;
	snprintf(o.checkpoint_dir, sizeof o.checkpoint_dir, "%s/a/b", base);
	assert_int_equal(stat(o.checkpoint_dir, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(dir_entries(o.checkpoint_dir), 0); /* the probe is gone */
	assert_int_equal(hpu__opts_check_checkpoint_dir(&o, err, sizeof err), 0); /* again */

	const struct {
		const char *dir, *want;
	} bad[] = {
		{"/dev/null/ckpt", "/dev/null/ckpt: "},
		{"/proc/self", "/proc/self: "},
		{"/proc/hpu-test-ckpt/x", "/proc/hpu-test-ckpt"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		snprintf(o.checkpoint_dir, sizeof o.checkpoint_dir, "%s", bad[i].dir);
		err[0] = 0;
		assert_int_equal(hpu__opts_check_checkpoint_dir(&o, err, sizeof err), -1);
		printf("  -> \"%s\"\n", err);
		assert_non_null(strstr(err, "checkpoint directory"));
		assert_non_null(strstr(err, bad[i].want));
	}
	snprintf(o.checkpoint_dir, sizeof o.checkpoint_dir, "/dev/null/ckpt");
	hpu__opts_check_checkpoint_dir(&o, err, sizeof err);
	assert_non_null(strstr(err, strerror(ENOTDIR)));
	char rm[160];
	snprintf(rm, sizeof rm, "rm -rf %s", base);
	assert_int_equal(system(rm), 0);
}

/* --save-params is tried at start too (it was found unwritable only
 * after training): no directory, a writable directory, not --metrics'
 * file; only on node 0, where rank 0 writes it. */
static void test_outputs_check(void **state)
{
	(void)state;
	hpu_train_opts o;
	char base[64] = "/tmp/hpu-test-out-XXXXXX", err[512] = "";
	assert_non_null(mkdtemp(base));
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_check_outputs(&o, 1, err, sizeof err), 0); /* none */
	snprintf(o.save_params, sizeof o.save_params, "%s/p.bin", base);
	assert_int_equal(hpu__opts_check_outputs(&o, 1, err, sizeof err), 0);
	assert_int_equal(dir_entries(base), 0); /* the probe is gone */
	snprintf(o.metrics, sizeof o.metrics, "%s/m.jsonl", base);
	assert_int_equal(hpu__opts_check_outputs(&o, 1, err, sizeof err), 0);
	const struct {
		const char *params, *metrics, *want;
	} bad[] = {
		{"/nonexist-hpu/p.bin", "", "--save-params /nonexist-hpu/p.bin: cannot write in "
					    "/nonexist-hpu: No such file or directory"},
		{"/tmp", "", "--save-params /tmp is a directory: give a file name"},
		{"%s/same", "%s/same", "--save-params and --metrics name the same file"},
		{"%s/./same", "%s/same", "--save-params and --metrics name the same file"},
		/* --metrics too (a missing directory was found by the worker) */
		{"", "/nonexist-hpu/m.jsonl", "--metrics /nonexist-hpu/m.jsonl: cannot write in "
					      "/nonexist-hpu: No such file or directory"},
		{"", "/tmp", "--metrics /tmp is a directory: give a file name"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		snprintf(o.save_params, sizeof o.save_params, bad[i].params, base);
		snprintf(o.metrics, sizeof o.metrics, bad[i].metrics, base);
		err[0] = 0;
		assert_int_equal(hpu__opts_check_outputs(&o, 1, err, sizeof err), -1);
		printf("  -> \"%s\"\n", err);
		if (!strstr(err, bad[i].want))
			fail_msg("\"%s\" does not say \"%s\"", err, bad[i].want);
		assert_int_equal(hpu__opts_check_outputs(&o, 0, err, sizeof err), 0); /* not node 0 */
	}
	char rm[160];
	snprintf(rm, sizeof rm, "rm -rf %s", base);
	assert_int_equal(system(rm), 0);
}

/* ---- resolving the three batch numbers ---- */

static void test_resolve_batch(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];

	/* batch and micro-batch: grad_accum follows */
	hpu__opts_defaults(&o);
	set_ok(&o, "batch-size", "512");
	set_ok(&o, "micro-batch-size", "32");
	assert_int_equal(hpu__opts_resolve(&o, 4, err, sizeof(err)), 0);
	assert_int_equal(o.grad_accum, 4);
	/* batch and grad_accum: micro_batch follows */
	hpu__opts_defaults(&o);
	set_ok(&o, "batch-size", "512");
	set_ok(&o, "grad-accum", "2");
	assert_int_equal(hpu__opts_resolve(&o, 4, err, sizeof(err)), 0);
	assert_int_equal(o.micro_batch, 64);
	/* micro-batch and grad_accum: the batch follows */
	hpu__opts_defaults(&o);
	set_ok(&o, "micro-batch-size", "16");
	set_ok(&o, "grad-accum", "3");
	assert_int_equal(hpu__opts_resolve(&o, 2, err, sizeof(err)), 0);
	assert_int_equal(o.batch_size, 96);
	/* micro-batch alone: grad_accum 1 */
	hpu__opts_defaults(&o);
	set_ok(&o, "micro-batch-size", "16");
	assert_int_equal(hpu__opts_resolve(&o, 3, err, sizeof(err)), 0);
	assert_int_equal(o.batch_size, 48);
	assert_int_equal(o.grad_accum, 1);
	/* grad_accum alone: batch 256 */
	hpu__opts_defaults(&o);
	set_ok(&o, "grad-accum", "4");
	assert_int_equal(hpu__opts_resolve(&o, 2, err, sizeof(err)), 0);
	assert_int_equal(o.micro_batch, 32);
	/* all three, consistent; resolving twice changes nothing */
	hpu__opts_defaults(&o);
	set_ok(&o, "batch-size", "256");
	set_ok(&o, "micro-batch-size", "32");
	set_ok(&o, "grad-accum", "2");
	assert_int_equal(hpu__opts_resolve(&o, 4, err, sizeof(err)), 0);
	hpu_train_opts again = o;
	assert_int_equal(hpu__opts_resolve(&again, 4, err, sizeof(err)), 0);
	assert_memory_equal(&o, &again, sizeof(o));

	/* from the file, and the mismatch the issue names */
	load_ok("{'train_batch_size': 256, 'train_micro_batch_size_per_gpu': 32,"
		" 'gradient_accumulation_steps': 4}",
		&o);
	err[0] = 0;
	assert_int_equal(hpu__opts_resolve(&o, 4, err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_string_equal(err, "train_batch_size 256 != "
				 "train_micro_batch_size_per_gpu 32 x "
				 "gradient_accumulation_steps 4 x world size 4 "
				 "= 512");
	assert_int_equal(hpu__opts_resolve(&o, 2, err, sizeof(err)), 0);
	load_ok("{'train_micro_batch_size_per_gpu': 8,"
		" 'gradient_accumulation_steps': 2}",
		&o);
	assert_int_equal(hpu__opts_resolve(&o, 8, err, sizeof(err)), 0);
	assert_int_equal(o.batch_size, 128);

	/* not divisible */
	hpu__opts_defaults(&o);
	set_ok(&o, "batch-size", "100");
	assert_int_equal(hpu__opts_resolve(&o, 3, err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_string_equal(err, "--batch-size 100 is not divisible by "
				 "--grad-accum 1 x world size 3");
	hpu__opts_defaults(&o);
	set_ok(&o, "batch-size", "100");
	set_ok(&o, "micro-batch-size", "30");
	assert_int_equal(hpu__opts_resolve(&o, 1, err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, "--batch-size 100"));
	assert_non_null(strstr(err, "--micro-batch-size 30"));
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_resolve(&o, 3, err, sizeof(err)), -1);
	/* a default is named by the flag that changes it */
	assert_non_null(strstr(err, "--batch-size 256"));
	/* too large */
	hpu__opts_defaults(&o);
	set_ok(&o, "micro-batch-size", "16777216");
	set_ok(&o, "grad-accum", "1048576");
	assert_int_equal(hpu__opts_resolve(&o, 1 << 22, err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, "largest"));
}

static void test_resolve_other_checks(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	const char *ok[] = {"ddp", "fast_ddp"}, *bad[] = {"zero1", "zero2",
							   "zero3"};
	for (int k = 0; k < 2; k++) {
		hpu__opts_defaults(&o);
		set_ok(&o, "grad-comm-dtype", "bf16");
		set_ok(&o, "strategy", ok[k]);
		assert_int_equal(hpu__opts_resolve(&o, 2, err, sizeof(err)), 0);
	}
	for (int k = 0; k < 3; k++) {
		hpu__opts_defaults(&o);
		set_ok(&o, "grad-comm-dtype", "bf16");
		set_ok(&o, "strategy", bad[k]);
		assert_int_equal(hpu__opts_resolve(&o, 2, err, sizeof(err)), -1);
		printf("  -> \"%s\"\n", err);
		assert_non_null(strstr(err, "--grad-comm-dtype bf16"));
		assert_non_null(strstr(err, bad[k]));
	}
	/* fp16 (DeepSpeed's communication_data_type "fp16", refused as an
	 * unknown value): 16-mixed's own, refused at another precision */
	hpu__opts_defaults(&o);
	set_ok(&o, "grad-comm-dtype", "fp16");
	set_ok(&o, "precision", "16-mixed");
	assert_int_equal(hpu__opts_resolve(&o, 2, err, sizeof(err)), 0);
	set_ok(&o, "precision", "bf16-mixed");
	assert_int_equal(hpu__opts_resolve(&o, 2, err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, "--grad-comm-dtype fp16 is 16-mixed's"));
	assert_non_null(strstr(err, "at --precision bf16-mixed give fp32 or bf16"));
	hpu__opts_defaults(&o);
	set_ok(&o, "scheduler", "warmup_decay");
	set_ok(&o, "warmup-steps", "100");
	assert_int_equal(hpu__opts_resolve(&o, 1, err, sizeof(err)), 0);
	set_ok(&o, "total-steps", "100");
	assert_int_equal(hpu__opts_resolve(&o, 1, err, sizeof(err)), 0);
	/* fewer total steps than warm-up ones: run, as DeepSpeed does, with
	 * a warning (test_config_file's test_warmup_decay_short_total) */
	set_ok(&o, "total-steps", "99");
	assert_int_equal(hpu__opts_resolve(&o, 1, err, sizeof(err)), 0);
	/* --aio-block-size: whole 4 KiB blocks, 1 GiB at most (above, it got
	 * past hpulaunch and each worker refused it, as "not a multiple") */
	const char *sizes[] = {"1GiB", "2GiB", "1000"};
	const char *said[] = {NULL, "--aio-block-size 2147483648 is above 1 GiB", "is not a multiple of 4096"};
	for (int k = 0; k < 3; k++) {
		hpu__opts_defaults(&o);
		set_ok(&o, "aio-block-size", sizes[k]);
		assert_int_equal(hpu__opts_resolve(&o, 1, err, sizeof(err)), said[k] ? -1 : 0);
		if (said[k])
			assert_non_null(strstr(err, said[k]));
	}
}

/* What the ranks compare (hpu__opts_shared_text): resolved values, not
 * where they came from; a node's own paths, memory and cores are left
 * out, and of the files every rank acts on only whether one is given. */
static void test_shared_text(void **state)
{
	(void)state;
	char ta[4096], tb[4096], diff[512], err[256];
	hpu_train_opts a, b;
	hpu__opts_defaults(&a);
	hpu__opts_defaults(&b);
	set_ok(&a, "checkpoint-dir", "/mnt/a/ck");
	set_ok(&b, "checkpoint-dir", "/mnt/b/ck");
	set_ok(&a, "metrics", "m.jsonl");
	set_ok(&b, "kernel-threads", "4");
	set_ok(&b, "nvme-path", "/nvme1");
	set_ok(&b, "device-memory", "2GiB");
	set_ok(&a, "lr", "0.001"); /* the default, from a flag */
	set_ok(&b, "batch-size", "256");
	assert_int_equal(hpu__opts_resolve(&a, 2, err, sizeof err), 0);
	assert_int_equal(hpu__opts_resolve(&b, 2, err, sizeof err), 0);
	assert_true(hpu__opts_shared_text(&a, ta, sizeof ta) > 0);
	assert_true(hpu__opts_shared_text(&b, tb, sizeof tb) > 0);
	assert_string_equal(ta, tb);
	assert_non_null(strstr(ta, "lr=0.001\n"));
	assert_non_null(strstr(ta, "checkpoint-dir=given\n"));
	assert_null(strstr(ta, "metrics="));
	assert_null(strstr(ta, "kernel-threads="));
	assert_null(strstr(ta, "bucket-cap-mb=")); /* an alias of reduce-bucket-size */
	assert_int_equal(hpu__opts_shared_diff(ta, tb, diff, sizeof diff), 0);
	assert_string_equal(diff, "");

	/* what differs, mine's value first, in the table's order */
	set_ok(&b, "lr", "0.1");
	set_ok(&b, "resume", "auto");
	set_ok(&b, "no-eval", NULL);
	set_ok(&b, "seed", "7");
	assert_true(hpu__opts_shared_text(&b, tb, sizeof tb) > 0);
	assert_int_equal(hpu__opts_shared_diff(tb, ta, diff, sizeof diff), 4);
	printf("  -> %s\n", diff);
	assert_string_equal(diff, "--lr (0.1 vs 0.001), --seed (7 vs 42), --resume (auto vs not given), "
				  "--no-eval (on vs off)");
	/* a line only one side has (another version): "none" */
	assert_int_equal(hpu__opts_shared_diff("lr=1\nx=2\n", "lr=1\ny=3\n", diff, sizeof diff), 2);
	assert_string_equal(diff, "--x (2 vs none), --y (none vs 3)");
	/* too small a buffer */
	assert_int_equal(hpu__opts_shared_text(&a, ta, 64), -1);
}

/* Path options and making them absolute (hpulaunch --hostfile). */
/* A model's declared defaults: only over built-in values, checked even
 * when a flag overrides them, and --verbose's sources. */
static void test_model_defaults(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[512], *text = NULL;
	size_t len = 0;
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "lr", "0.2", err, sizeof err), 0);
	assert_int_equal(hpu__opts_set_model(&o, "lr", "0.05", err, sizeof err), 0);
	assert_true(o.lr == 0.2);
	assert_int_equal(hpu__opts_set_model(&o, "epochs", "3", err, sizeof err), 1);
	assert_int_equal(o.epochs, 3);
	assert_int_equal(hpu__opts_from(&o, "epochs"), HPU_FROM_MODEL);
	assert_int_equal(hpu__opts_set_model(&o, "scheduler", "cosin", err, sizeof err), -1);
	assert_non_null(strstr(err, "'cosin' is not a valid --scheduler: expected"));
	assert_int_equal(hpu__opts_set_model(&o, "lr", "-1", err, sizeof err), -1);
	assert_non_null(strstr(err, "'-1' is not a valid --lr"));
	assert_int_equal(hpu__opts_set(&o, "no-eval", NULL, err, sizeof err), 0);
	assert_int_equal(hpu__opts_resolve(&o, 2, err, sizeof err), 0);
	FILE *f = open_memstream(&text, &len);
	assert_non_null(f);
	hpu__opts_print_sources(&o, f);
	fclose(f);
	/* a negative flag given is true (it printed "--no-eval false") */
	assert_non_null(strstr(text, "setting --no-eval true (flag)\n"));
	assert_non_null(strstr(text, "setting --epochs 3 (model)\n"));
	assert_non_null(strstr(text, "setting --lr 0.2 (flag)\n"));
	assert_non_null(strstr(text, "setting --batch-size 256 (default)\n"));
	assert_non_null(strstr(text, "setting --micro-batch-size 128 (resolved)\n"));
	free(text);
}

static void test_abs_path(void **state)
{
	(void)state;
	char *out;
	assert_true(hpu__opts_is_path("config"));
	assert_true(hpu__opts_is_path("metrics"));
	assert_true(hpu__opts_is_path("checkpoint-dir"));
	assert_true(hpu__opts_is_path("profile"));
	assert_false(hpu__opts_is_path("profile-filename")); /* a file name's prefix */
	assert_false(hpu__opts_is_path("lr"));
	assert_false(hpu__opts_is_path("no-such-option"));
	assert_int_equal(hpu__opts_abs_path("metrics", "out/m.jsonl", "/home/u", &out), 1);
	assert_string_equal(out, "/home/u/out/m.jsonl");
	free(out);
	assert_int_equal(hpu__opts_abs_path("profile", NULL, "/", &out), 1);
	assert_string_equal(out, "/");
	free(out);
	assert_int_equal(hpu__opts_abs_path("profile", "prof", "/", &out), 1);
	assert_string_equal(out, "/prof");
	free(out);
	assert_int_equal(hpu__opts_abs_path("metrics", "/abs", "/home/u", &out), 0);
	assert_null(out);
	assert_int_equal(hpu__opts_abs_path("resume", "auto", "/home/u", &out), 0);
	assert_int_equal(hpu__opts_abs_path("resume", "ck/step-5", "/home/u", &out), 1);
	assert_string_equal(out, "/home/u/ck/step-5");
	free(out);
	assert_int_equal(hpu__opts_abs_path("lr", "0.1", "/home/u", &out), 0);
	char cwd[600];
	memset(cwd, 'd', sizeof cwd - 1);
	cwd[0] = '/';
	cwd[sizeof cwd - 1] = 0;
	assert_int_equal(hpu__opts_abs_path("metrics", "m", cwd, &out), -2);
	assert_null(out);
}

/* Whether word appears in text as a whole upper-case word. */
static int has_word(const char *text, const char *word)
{
	size_t n = strlen(word);
	for (const char *p = text; (p = strstr(p, word)) != NULL; p += n) {
		int before = p > text && (p[-1] >= 'A' && p[-1] <= 'Z');
		int after = p[n] >= 'A' && p[n] <= 'Z';
		if (!before && !after)
			return 1;
	}
	return 0;
}

/* Issue 39: an option's placeholder is the one its help text uses
 * ("--checkpoint-dir DIR: ... under DIR", not FILE): a help that names
 * a FILE, DIR or NAME names the option's own. */
static void test_placeholders_match_help(void **state)
{
	(void)state;
	static const char *const words[] = {"FILE", "DIR", "NAME"};
	for (const hpu_optspec *s = hpu__opts_specs(); s->name; s++) {
		if (!s->arg || !s->help)
			continue;
		for (size_t w = 0; w < sizeof words / sizeof *words; w++)
			if (has_word(s->help, words[w]) && !has_word(s->help, s->arg))
				fail_msg("--%s %s: its help says %s: \"%s\"", s->name, s->arg,
					 words[w], s->help);
	}
	for (const hpu_optspec *s = hpu__opts_specs(); s->name; s++)
		if (!strcmp(s->name, "checkpoint-dir") || !strcmp(s->name, "nvme-path"))
			assert_string_equal(s->arg, "DIR");
}

/* A very long value is quoted in part, so that the reason after it is
 * not cut off with the message. */
static void test_long_value_cut(void **state)
{
	(void)state;
	hpu_train_opts o;
	char v[5000], err[1024];
	memset(v, 'd', sizeof v - 1);
	v[0] = '/';
	v[sizeof v - 1] = 0;
	hpu__opts_defaults(&o);
	assert_int_equal(hpu__opts_set(&o, "nvme-path", v, err, sizeof err), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, "dddd...' for --nvme-path: expected "));
	assert_true(strlen(err) < 400);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_defaults),
	    cmocka_unit_test(test_placeholders_match_help),
	    cmocka_unit_test(test_weight_decay_default),
	    cmocka_unit_test(test_takes_value),
	    cmocka_unit_test(test_parse_separate_and_equals),
	    cmocka_unit_test(test_parse_all),
	    cmocka_unit_test(test_parse_stops_at_non_option),
	    cmocka_unit_test(test_set_direct),
	    cmocka_unit_test(test_errors_unknown_and_missing),
	    cmocka_unit_test(test_errors_bad_numbers),
	    cmocka_unit_test(test_exponent_whole_numbers),
	    cmocka_unit_test(test_errors_unknown_choice),
	    cmocka_unit_test(test_rejected_value_keeps_field),
	    cmocka_unit_test(test_resolve_world),
	    cmocka_unit_test(test_help_lists_options),
	    cmocka_unit_test(test_defaults_new_fields),
	    cmocka_unit_test(test_parse_new_flags),
	    cmocka_unit_test(test_errors_new_flags),
	    cmocka_unit_test(test_parse_size),
	    cmocka_unit_test(test_fp8_flags),
	    cmocka_unit_test(test_checkpoint_flags),
	    cmocka_unit_test(test_profile_flags),
	    cmocka_unit_test(test_checkpoint_dir_check),
	    cmocka_unit_test(test_outputs_check),
	    cmocka_unit_test(test_resolve_batch),
	    cmocka_unit_test(test_resolve_other_checks),
	    cmocka_unit_test(test_shared_text),
	    cmocka_unit_test(test_model_defaults),
	    cmocka_unit_test(test_abs_path),
	    cmocka_unit_test(test_long_value_cut),
	};
	/* HPU_TEST=test_name (a glob) runs only the tests it names. */
	if (getenv("HPU_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPU_TEST"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
