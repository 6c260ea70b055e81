/* Unit tests for the training options (worker/options/config.c): defaults, parsing
 * of "--name value" / "--name=value" / flags up to the model path, the
 * error texts (each must name the offending option, so a user can find it
 * on a long command line), the DeepSpeed-style JSON config file (each
 * error one line naming the key path), flags beating the file, and
 * resolving the batch sizes against the world size.
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

#include "config.h"
#include "fileio.h" /* hpu_read_file */

#define ARGS(...) ((char *[]){"hpu-worker", __VA_ARGS__, NULL})

static int count_args(char **argv)
{
	int n = 0;
	while (argv[n])
		n++;
	return n;
}

/* Parses argv (NULL-terminated, argv[0] the program) from index 1 into o;
 * returns hpu_opts_parse's result and leaves the stop index in *stop. */
static int parse(hpu_train_opts *o, char **argv, int *stop, char *err,
		 size_t errlen)
{
	int i = 1;
	err[0] = 0;
	int rc = hpu_opts_parse(o, count_args(argv), argv, &i, err, errlen);
	*stop = i;
	return rc;
}

/* Asserts that parsing argv fails and that the message contains every
 * string in the NULL-terminated list `needles`. */
static void expect_error(char **argv, const char *const *needles)
{
	hpu_train_opts o;
	char err[256];
	int stop;
	hpu_opts_defaults(&o);
	int rc = parse(&o, argv, &stop, err, sizeof(err));
	printf("  %-28s -> \"%s\"\n", argv[1], err);
	assert_int_equal(rc, -1);
	assert_true(err[0] != 0);
	for (size_t k = 0; needles[k]; k++) {
		if (!strstr(err, needles[k]))
			fail_msg("error \"%s\" does not name \"%s\"", err,
				 needles[k]);
	}
}

#define EXPECT_ERROR(argv, ...)                                                \
	expect_error(argv, (const char *const[]){__VA_ARGS__, NULL})

/* ---- defaults ---- */

static void test_defaults(void **state)
{
	(void)state;
	hpu_train_opts o;
	memset(&o, 0x5a, sizeof(o)); /* defaults must set every field */
	hpu_opts_defaults(&o);
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
	assert_string_equal(hpu_optim_name(o.optimizer), "adamw");
	assert_string_equal(hpu_strategy_name(o.strategy), "fast_ddp");
}

static void test_weight_decay_default(void **state)
{
	(void)state;
	hpu_train_opts o;
	hpu_opts_defaults(&o);
	assert_true(hpu_opts_weight_decay(&o) == 0.01);
	o.optimizer = HPU_OPTIM_SGD;
	assert_true(hpu_opts_weight_decay(&o) == 0.0);

	/* set explicitly: taken as is for either optimizer, 0 included */
	char err[256];
	hpu_opts_defaults(&o);
	assert_int_equal(hpu_opts_set(&o, "weight-decay", "0", err,
				      sizeof(err)), 0);
	assert_true(hpu_opts_weight_decay(&o) == 0.0);
	hpu_opts_defaults(&o);
	assert_int_equal(hpu_opts_set(&o, "optimizer", "sgd", err,
				      sizeof(err)), 0);
	assert_int_equal(hpu_opts_set(&o, "weight-decay", "0.05", err,
				      sizeof(err)), 0);
	assert_true(hpu_opts_weight_decay(&o) == 0.05);
}

/* ---- parsing ---- */

static void test_takes_value(void **state)
{
	(void)state;
	assert_int_equal(hpu_opts_takes_value("lr"), 1);
	assert_int_equal(hpu_opts_takes_value("epochs"), 1);
	assert_int_equal(hpu_opts_takes_value("metrics"), 1);
	assert_int_equal(hpu_opts_takes_value("nesterov"), 0);
	assert_int_equal(hpu_opts_takes_value("no-eval"), 0);
	assert_int_equal(hpu_opts_takes_value("frobnicate"), -1);
	assert_int_equal(hpu_opts_takes_value("--lr"), -1);
	assert_int_equal(hpu_opts_takes_value(""), -1);
}

static void test_parse_separate_and_equals(void **state)
{
	(void)state;
	hpu_train_opts a, b;
	char err[256];
	int stop;
	hpu_opts_defaults(&a);
	hpu_opts_defaults(&b);
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
	hpu_opts_defaults(&o);
	assert_int_equal(parse(&o, argv, &stop, err, sizeof(err)), 0);
	assert_string_equal(argv[stop], "model.so");
	assert_int_equal(o.epochs, 3);
	assert_int_equal(o.max_steps, 100);
	assert_int_equal(o.batch_size, 120);
	assert_int_equal(o.optimizer, HPU_OPTIM_SGD);
	assert_true(o.momentum == 0.5);
	assert_int_equal(o.nesterov, 1);
	assert_true(hpu_opts_weight_decay(&o) == 0.0);
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
	hpu_opts_defaults(&d);

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
	hpu_opts_defaults(&o);
	assert_int_equal(hpu_opts_set(&o, "lr", "0.5", err, sizeof(err)), 0);
	assert_true(o.lr == 0.5);
	assert_int_equal(hpu_opts_set(&o, "nesterov", NULL, err, sizeof(err)),
			 0);
	assert_int_equal(o.nesterov, 1);
	assert_int_equal(hpu_opts_set(&o, "lr", NULL, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "lr"));
	assert_int_equal(hpu_opts_set(&o, "nesterov", "1", err, sizeof(err)),
			 -1);
	assert_non_null(strstr(err, "nesterov"));
	assert_int_equal(hpu_opts_set(&o, "bogus", "1", err, sizeof(err)), -1);
	assert_non_null(strstr(err, "bogus"));
	/* a short buffer is truncated, not overrun */
	char tiny[8];
	memset(tiny, 'x', sizeof(tiny));
	assert_int_equal(hpu_opts_set(&o, "bogus", "1", tiny, sizeof(tiny)),
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
}

/* A rejected value leaves its field as it was. */
static void test_rejected_value_keeps_field(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	hpu_opts_defaults(&o);
	assert_int_equal(hpu_opts_set(&o, "lr", "abc", err, sizeof(err)), -1);
	assert_true(o.lr == 1e-3);
	assert_int_equal(hpu_opts_set(&o, "epochs", "-1", err, sizeof(err)),
			 -1);
	assert_int_equal(o.epochs, 1);
	assert_int_equal(hpu_opts_set(&o, "optimizer", "lamb", err,
				      sizeof(err)), -1);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAMW);
	assert_int_equal(hpu_opts_set(&o, "strategy", "fsdp", err,
				      sizeof(err)), -1);
	assert_int_equal(o.strategy, HPU_STRATEGY_FAST_DDP);
	assert_int_equal(hpu_opts_set(&o, "metrics", "", err, sizeof(err)),
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
	hpu_opts_defaults(&o);
	for (int w = 1; w <= 8; w *= 2) {
		assert_int_equal(hpu_opts_resolve(&o, w, err, sizeof(err)), 0);
		assert_int_equal(o.batch_size, 256);
		assert_int_equal(o.grad_accum, 1);
		assert_int_equal(o.micro_batch, 256 / w);
	}

	hpu_opts_defaults(&o);
	assert_int_equal(hpu_opts_set(&o, "batch-size", "1000", err,
				      sizeof(err)), 0);
	assert_int_equal(hpu_opts_resolve(&o, 5, err, sizeof(err)), 0);
	assert_int_equal(o.micro_batch, 200);
	err[0] = 0;
	assert_int_equal(hpu_opts_resolve(&o, 7, err, sizeof(err)), -1);
	printf("  batch 1000, world 7 -> \"%s\"\n", err);
	assert_non_null(strstr(err, "--batch-size 1000"));
	assert_non_null(strstr(err, "world size 7"));

	/* every strategy is accepted now */
	const hpu_strategy all[] = {HPU_STRATEGY_FAST_DDP, HPU_STRATEGY_DDP,
				    HPU_STRATEGY_ZERO1, HPU_STRATEGY_ZERO2,
				    HPU_STRATEGY_ZERO3};
	const char *names[] = {"fast_ddp", "ddp", "zero1", "zero2", "zero3"};
	for (size_t k = 0; k < 5; k++) {
		hpu_opts_defaults(&o);
		assert_int_equal(hpu_opts_set(&o, "strategy", names[k], err,
					      sizeof(err)), 0);
		assert_int_equal(o.strategy, all[k]);
		assert_string_equal(hpu_strategy_name(o.strategy), names[k]);
		assert_int_equal(hpu_opts_resolve(&o, 4, err, sizeof(err)), 0);
	}
}

static void test_help_lists_options(void **state)
{
	(void)state;
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	hpu_opts_help(f);
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
		assert_int_not_equal(hpu_opts_takes_value(names[k] + 2), -1);
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
	hpu_opts_defaults(&o);
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
	assert_string_equal(hpu_sched_name(o.sched), "constant");
	assert_string_equal(hpu_sched_name(HPU_SCHED_STEP), "step");
	assert_string_equal(hpu_sched_name(HPU_SCHED_COSINE), "cosine");
	assert_string_equal(hpu_sched_name(HPU_SCHED_WARMUP), "warmup");
	assert_string_equal(hpu_sched_name(HPU_SCHED_WARMUP_DECAY),
			    "warmup_decay");
	assert_string_equal(hpu_optim_name(HPU_OPTIM_SGD), "sgd");
	assert_string_equal(hpu_optim_name(HPU_OPTIM_ADAM), "adam");
	/* torch.optim.Adam's weight decay defaults to 0, AdamW's to 0.01 */
	o.optimizer = HPU_OPTIM_ADAM;
	assert_true(hpu_opts_weight_decay(&o) == 0.0);
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
	hpu_opts_defaults(&o);
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
		assert_int_equal(hpu_opts_set(&o, "scheduler", sched[k], err,
					      sizeof(err)), 0);
		assert_int_equal(o.sched, k);
	}
	assert_int_equal(hpu_opts_set(&o, "overlap-comm", NULL, err,
				      sizeof(err)), 0);
	assert_int_equal(o.overlap_comm, 1);
	assert_int_equal(hpu_opts_set(&o, "bucket-cap-mb", "25", err,
				      sizeof(err)), 0);
	assert_int_equal(o.reduce_bucket, 6553600);
	assert_int_equal(hpu_opts_set(&o, "bucket-cap-mb", "0.5", err,
				      sizeof(err)), 0);
	assert_int_equal(o.reduce_bucket, 131072);
	assert_int_equal(hpu_opts_set(&o, "grad-comm-dtype", "fp32", err,
				      sizeof(err)), 0);
	assert_int_equal(o.grad_comm_dtype, HPU_COMM_FP32);
	assert_int_equal(hpu_opts_set(&o, "warmup-type", "log", err,
				      sizeof(err)), 0);
	assert_int_equal(o.warmup_type, HPU_WARMUP_LOG);
	assert_int_equal(hpu_opts_set(&o, "device-memory", "4096", err,
				      sizeof(err)), 0);
	assert_int_equal(o.device_memory, 4096);

	assert_int_equal(hpu_opts_takes_value("config"), 1);
	assert_int_equal(hpu_opts_takes_value("device-memory"), 1);
	assert_int_equal(hpu_opts_takes_value("activation-checkpointing"), 0);
	assert_int_equal(hpu_opts_takes_value("no-overlap-comm"), 0);
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
	EXPECT_ERROR(ARGS("--grad-comm-dtype", "fp16"), "--grad-comm-dtype",
		     "fp16");
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
		if (hpu_parse_size(good[k].s, &v) != 0 || v != good[k].v)
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
		if (hpu_parse_size(bad[k], &v) != -1 || v != 7)
			fail_msg("\"%s\" was accepted", bad[k]);
	}
}

/* ---- the JSON config file ---- */

/* Writes text to a new temporary file, with ' standing for " so that the
 * JSON in these tests reads easily; returns its path in path[64]. */
static void write_temp(const char *text, char *path)
{
	strcpy(path, "/tmp/hpu-test-config-XXXXXX");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	FILE *f = fdopen(fd, "w");
	assert_non_null(f);
	for (const char *c = text; *c; c++)
		fputc(*c == '\'' ? '"' : *c, f);
	assert_int_equal(fclose(f), 0);
}

/* Loads json on top of the defaults into o; asserts it loads. */
static void load_ok(const char *json, hpu_train_opts *o)
{
	char path[64], err[512] = "";
	write_temp(json, path);
	hpu_opts_defaults(o);
	int rc = hpu_opts_load_file(o, path, err, sizeof(err));
	unlink(path);
	if (rc != 0)
		fail_msg("%s did not load: %s", json, err);
}

/* Asserts that json is refused with one line naming every needle, and
 * that the options are left as they were. */
static void load_error(const char *json, const char *const *needles)
{
	char path[64], err[512] = "";
	hpu_train_opts o, d;
	write_temp(json, path);
	hpu_opts_defaults(&o);
	d = o;
	int rc = hpu_opts_load_file(&o, path, err, sizeof(err));
	unlink(path);
	printf("  -> \"%s\"\n", err);
	assert_int_equal(rc, -1);
	assert_null(strchr(err, '\n'));
	assert_non_null(strstr(err, path));
	for (size_t k = 0; needles[k]; k++)
		if (!strstr(err, needles[k]))
			fail_msg("error \"%s\" does not name \"%s\"", err,
				 needles[k]);
	assert_memory_equal(&o, &d, sizeof(o));
}

#define LOAD_ERROR(json, ...)                                                  \
	load_error(json, (const char *const[]){__VA_ARGS__, NULL})

static void test_file_top_and_zero(void **state)
{
	(void)state;
	hpu_train_opts o;
	load_ok("{'train_batch_size': 512, 'train_micro_batch_size_per_gpu': 16,"
		" 'gradient_accumulation_steps': 8, 'gradient_clipping': 1.0,"
		" 'steps_per_print': 10,"
		" 'zero_optimization': {'stage': 2, 'reduce_bucket_size': 5e8,"
		"  'allgather_bucket_size': 2e8, 'overlap_comm': false,"
		"  'stage3_prefetch_bucket_size': 1e7,"
		"  'stage3_param_persistence_threshold': 1e4,"
		"  'stage3_max_live_parameters': 3e9,"
		"  'contiguous_gradients': true}}",
		&o);
	assert_int_equal(o.batch_size, 512);
	assert_int_equal(o.micro_batch, 16);
	assert_int_equal(o.grad_accum, 8);
	assert_true(o.clip_norm == 1.0);
	assert_int_equal(o.log_every, 10);
	assert_int_equal(o.strategy, HPU_STRATEGY_ZERO2);
	assert_int_equal(o.reduce_bucket, 500000000);
	assert_int_equal(o.allgather_bucket, 200000000);
	assert_int_equal(o.overlap_comm, 0);
	assert_int_equal(o.prefetch_bucket, 10000000);
	assert_int_equal(o.persistence_threshold, 10000);
	assert_int_equal(o.max_live_params, 3000000000L);

	const hpu_strategy stages[] = {HPU_STRATEGY_DDP, HPU_STRATEGY_ZERO1,
				       HPU_STRATEGY_ZERO2, HPU_STRATEGY_ZERO3};
	const char *json[] = {"{'zero_optimization': {'stage': 0}}",
			      "{'zero_optimization': {'stage': 1}}",
			      "{'zero_optimization': {'stage': 2.0}}",
			      "{'zero_optimization': {'stage': 3}}"};
	for (int k = 0; k < 4; k++) {
		load_ok(json[k], &o);
		assert_int_equal(o.strategy, stages[k]);
	}
	load_ok("{}", &o);
	hpu_train_opts d;
	hpu_opts_defaults(&d);
	assert_memory_equal(&o, &d, sizeof(o));
}

static void test_file_optimizer(void **state)
{
	(void)state;
	hpu_train_opts o;
	load_ok("{'optimizer': {'type': 'AdamW', 'params': {'lr': 3e-4,"
		" 'betas': [0.8, 0.95], 'eps': 1e-6, 'weight_decay': 0.1}}}",
		&o);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAMW);
	assert_true(o.lr == 3e-4);
	assert_true(o.beta1 == 0.8);
	assert_true(o.beta2 == 0.95);
	assert_true(o.eps == 1e-6);
	assert_true(hpu_opts_weight_decay(&o) == 0.1);

	/* DeepSpeed's Adam is AdamW unless adam_w_mode is false */
	load_ok("{'optimizer': {'type': 'Adam', 'params': {'lr': 0.01}}}", &o);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAMW);
	load_ok("{'optimizer': {'type': 'adam', 'params': {'adam_w_mode': true}}}",
		&o);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAMW);
	load_ok("{'optimizer': {'type': 'Adam', 'params': {'adam_w_mode': false}}}",
		&o);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAM);
	load_ok("{'optimizer': {'type': 'ADAMW'}}", &o);
	assert_int_equal(o.optimizer, HPU_OPTIM_ADAMW);

	load_ok("{'optimizer': {'type': 'SGD', 'params': {'lr': 0.1,"
		" 'momentum': 0.5, 'nesterov': true, 'weight_decay': 0}}}",
		&o);
	assert_int_equal(o.optimizer, HPU_OPTIM_SGD);
	assert_true(o.lr == 0.1);
	assert_true(o.momentum == 0.5);
	assert_int_equal(o.nesterov, 1);
	assert_true(hpu_opts_weight_decay(&o) == 0);
	load_ok("{'optimizer': {'type': 'sgd', 'params': {'nesterov': false}}}",
		&o);
	assert_int_equal(o.nesterov, 0);

	LOAD_ERROR("{'optimizer': {'type': 'Lamb'}}", "optimizer.type", "Lamb");
	LOAD_ERROR("{'optimizer': {'params': {'lr': 1}}}", "optimizer.type",
		   "missing");
	LOAD_ERROR("{'optimizer': {'type': 'AdamW', 'params': {'momentum': 0.9}}}",
		   "optimizer.params.momentum", "AdamW");
	LOAD_ERROR("{'optimizer': {'type': 'SGD', 'params': {'betas': [0.9, 0.9]}}}",
		   "optimizer.params.betas", "SGD");
	LOAD_ERROR("{'optimizer': {'type': 'AdamW', 'params': {'adam_w_mode': true}}}",
		   "optimizer.params.adam_w_mode");
	LOAD_ERROR("{'optimizer': {'type': 'Adam', 'params': {'betas': [0.9]}}}",
		   "optimizer.params.betas", "two numbers", "got 1");
	LOAD_ERROR("{'optimizer': {'type': 'Adam', 'params': {'betas': [0.9, 1.5]}}}",
		   "optimizer.params.betas[1]", "1.5", "out of range");
	LOAD_ERROR("{'optimizer': {'type': 'SGD', 'params': {'nesterov': 1}}}",
		   "optimizer.params.nesterov", "true or false");
	LOAD_ERROR("{'optimizer': {'type': 'Adam', 'params': {'lrr': 1}}}",
		   "optimizer.params.lrr", "(did you mean 'lr'?)");
	LOAD_ERROR("{'optimizer': {'type': 'Adam', 'param': {}}}",
		   "optimizer.param", "did you mean 'params'");
	LOAD_ERROR("{'optimizer': 'Adam'}", "optimizer", "expected an object");
}

static void test_file_scheduler(void **state)
{
	(void)state;
	hpu_train_opts o;
	load_ok("{'scheduler': {'type': 'WarmupLR', 'params': {"
		" 'warmup_min_lr': 1e-5, 'warmup_max_lr': 2e-3,"
		" 'warmup_num_steps': 300, 'warmup_type': 'linear'}}}",
		&o);
	assert_int_equal(o.sched, HPU_SCHED_WARMUP);
	assert_true(o.warmup_min_lr == 1e-5);
	assert_true(o.lr == 2e-3);
	assert_int_equal(o.warmup_steps, 300);
	assert_int_equal(o.warmup_type, HPU_WARMUP_LINEAR);

	load_ok("{'scheduler': {'type': 'WarmupDecayLR', 'params': {"
		" 'warmup_num_steps': 10, 'total_num_steps': 1000,"
		" 'warmup_type': 'log'}}}",
		&o);
	assert_int_equal(o.sched, HPU_SCHED_WARMUP_DECAY);
	assert_int_equal(o.total_steps, 1000);
	assert_int_equal(o.warmup_type, HPU_WARMUP_LOG);

	load_ok("{'scheduler': {'type': 'StepLR', 'params': {'step_size': 7,"
		" 'gamma': 0.5}}}",
		&o);
	assert_int_equal(o.sched, HPU_SCHED_STEP);
	assert_int_equal(o.step_size, 7);
	assert_true(o.gamma == 0.5);

	load_ok("{'scheduler': {'type': 'CosineAnnealingLR', 'params': {"
		" 'T_max': 500, 'eta_min': 1e-6}}}",
		&o);
	assert_int_equal(o.sched, HPU_SCHED_COSINE);
	assert_int_equal(o.total_steps, 500);
	assert_true(o.min_lr == 1e-6);

	load_ok("{'scheduler': {'type': 'constant'}}", &o);
	assert_int_equal(o.sched, HPU_SCHED_CONSTANT);

	/* warmup_max_lr is the lr, whatever the order of the sections */
	load_ok("{'scheduler': {'type': 'WarmupLR', 'params': {"
		" 'warmup_max_lr': 0.5}},"
		" 'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}}",
		&o);
	assert_true(o.lr == 0.5);

	LOAD_ERROR("{'scheduler': {'type': 'WarmupDecayLR', 'params': {"
		   "'warmup_num_steps': 10}}}",
		   "scheduler.params.total_num_steps", "WarmupDecayLR");
	LOAD_ERROR("{'scheduler': {'type': 'WarmupLR', 'params': {'gamma': 0.1}}}",
		   "scheduler.params.gamma", "WarmupLR");
	LOAD_ERROR("{'scheduler': {'type': 'OneCycle'}}", "scheduler.type",
		   "OneCycle");
	LOAD_ERROR("{'scheduler': {'type': 'WarmupLR', 'params': {"
		   "'warmup_type': 'cubic'}}}",
		   "scheduler.params.warmup_type", "cubic");
	LOAD_ERROR("{'scheduler': {'type': 'StepLR', 'params': {'step_size': 2.5}}}",
		   "scheduler.params.step_size", "2.5", "not an integer");
}

static void test_file_precision(void **state)
{
	(void)state;
	hpu_train_opts o;
	load_ok("{'bf16': {'enabled': false}, 'fp16': {'enabled': false,"
		" 'loss_scale': 0, 'initial_scale_power': 16,"
		" 'loss_scale_window': 1000, 'hysteresis': 2,"
		" 'min_loss_scale': 1}}",
		&o);
	assert_int_equal(o.precision, HPU_PREC_FP32);
	load_ok("{'bf16': {'enabled': true}}", &o);
	assert_int_equal(o.precision, HPU_PREC_BF16_MIXED);
	load_ok("{'fp16': {'enabled': true, 'loss_scale': 0, 'initial_scale_power': 12,"
		" 'loss_scale_window': 50, 'hysteresis': 3, 'min_loss_scale': 0.5}}",
		&o);
	assert_int_equal(o.precision, HPU_PREC_FP16_MIXED);
	assert_int_equal(o.initial_scale_power, 12);
	assert_int_equal(o.loss_scale_window, 50);
	assert_int_equal(o.hysteresis, 3);
	assert_true(o.min_loss_scale == 0.5);
	LOAD_ERROR("{'bf16': {'enabled': true}, 'fp16': {'enabled': true}}",
		   "only one of bf16.enabled, fp16.enabled and fp8.enabled");
	load_ok("{'fp8': {'enabled': true, 'amax_history_len': 1024, 'margin': 1,"
		" 'amax_compute_algo': 'most_recent'}}",
		&o);
	assert_int_equal(o.precision, HPU_PREC_FP8);
	assert_int_equal(o.fp8_amax_history, 1024);
	assert_int_equal(o.fp8_margin, 1);
	assert_int_equal(o.fp8_amax_algo, HPU_FP8_ALGO_MOST_RECENT);
	LOAD_ERROR("{'fp8': {'enabled': true}, 'bf16': {'enabled': true}}",
		   "bf16.enabled", "only one of");
	LOAD_ERROR("{'fp8': {'amax_compute_algo': 'mean'}}", "fp8.amax_compute_algo", "mean");
	LOAD_ERROR("{'fp8': {'amax_history_len': 0}}", "fp8.amax_history_len");
	LOAD_ERROR("{'fp16': {'enabled': false, 'loss_scail': 0}}",
		   "fp16.loss_scail", "did you mean 'loss_scale'");
}

/* fp8 and fp8 inference's flags. */
static void test_fp8_flags(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	int stop;
	hpu_opts_defaults(&o);
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
	assert_string_equal(hpu_precision_name(o.precision), "fp8");
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
	assert_int_equal(hpu_opts_takes_value("profile"), 2);
	assert_int_equal(hpu_opts_takes_next("profile", "traces"), 1);
	assert_int_equal(hpu_opts_takes_next("profile", "model.so"), 0);
	assert_int_equal(hpu_opts_takes_next("profile", "--max-steps"), 0);
	assert_int_equal(hpu_opts_takes_next("profile", NULL), 0);
	assert_int_equal(hpu_opts_takes_next("profile", ""), 0);
	assert_int_equal(hpu_opts_takes_next("max-steps", "model.so"), 1);
	assert_int_equal(hpu_opts_takes_next("eval-only", "x"), 0);

	hpu_opts_defaults(&o);
	assert_string_equal(o.profile, "");
	assert_string_equal(o.profile_name, "perf-logs");
	assert_int_equal(o.throughput_warmup, 1);
	assert_true(o.stall_warning == 30);
	char *a1[] = {"w", "--profile", "m.so", NULL};
	assert_int_equal(parse(&o, a1, &stop, err, sizeof err), 0);
	assert_string_equal(o.profile, ".");
	assert_int_equal(stop, 2); /* stops at the model */

	hpu_opts_defaults(&o);
	char *a2[] = {"w", "--profile", "/tmp/tr", "--profile-filename", "run1",
		      "--throughput-warmup-steps", "0", "--stall-warning", "2.5", "m.so", NULL};
	assert_int_equal(parse(&o, a2, &stop, err, sizeof err), 0);
	assert_string_equal(o.profile, "/tmp/tr");
	assert_string_equal(o.profile_name, "run1");
	assert_int_equal(o.throughput_warmup, 0);
	assert_true(o.stall_warning == 2.5);
	assert_int_equal(stop, 9);

	hpu_opts_defaults(&o);
	char *a3[] = {"w", "--profile", "--max-steps", "3", NULL};
	assert_int_equal(parse(&o, a3, &stop, err, sizeof err), 0);
	assert_string_equal(o.profile, ".");
	assert_int_equal(o.max_steps, 3);

	hpu_opts_defaults(&o);
	char *a4[] = {"w", "--profile=d2", NULL};
	assert_int_equal(parse(&o, a4, &stop, err, sizeof err), 0);
	assert_string_equal(o.profile, "d2");

	expect_error((char *[]){"w", "--profile=", NULL}, (const char *const[]){"--profile", NULL});
	expect_error((char *[]){"w", "--stall-warning", "-1", NULL},
		     (const char *const[]){"--stall-warning", "-1", NULL});
	expect_error((char *[]){"w", "--throughput-warmup-steps", "x", NULL},
		     (const char *const[]){"--throughput-warmup-steps", NULL});
}

/* Checkpoint options: flags, config keys, and what they need together. */
static void test_checkpoint_flags(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	int stop;
	hpu_opts_defaults(&o);
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
	assert_int_equal(hpu_opts_resolve(&o, 2, err, sizeof err), 0);
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
		hpu_opts_defaults(&o);
		assert_int_equal(parse(&o, bad[i].argv, &stop, err, sizeof err), 0);
		assert_int_equal(hpu_opts_resolve(&o, 2, err, sizeof err), -1);
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

static void test_file_hputrain(void **state)
{
	(void)state;
	hpu_train_opts o;
	load_ok("{'hputrain': {'strategy': 'fast_ddp', 'epochs': 3,"
		" 'max_steps': 100, 'seed': 7, 'device_memory': '2GiB',"
		" 'activation_checkpointing': true, 'grad_comm_dtype': 'bf16',"
		" 'log_every': 5, 'metrics': '/tmp/m.jsonl',"
		" 'save_params': '/tmp/p.bin', 'eval': false}}",
		&o);
	assert_int_equal(o.strategy, HPU_STRATEGY_FAST_DDP);
	assert_int_equal(o.epochs, 3);
	assert_int_equal(o.max_steps, 100);
	assert_int_equal(o.seed, 7);
	assert_int_equal(o.device_memory, 2147483648ull);
	assert_int_equal(o.activation_checkpointing, 1);
	assert_int_equal(o.grad_comm_dtype, HPU_COMM_BF16);
	assert_int_equal(o.log_every, 5);
	assert_string_equal(o.metrics, "/tmp/m.jsonl");
	assert_string_equal(o.save_params, "/tmp/p.bin");
	assert_int_equal(o.eval, 0);

	/* dashes, as the flags are spelt; device memory as a number */
	load_ok("{'hputrain': {'max-steps': 9, 'device-memory': 1048576,"
		" 'grad-comm-dtype': 'fp32', 'save-params': 'x'}}",
		&o);
	assert_int_equal(o.max_steps, 9);
	assert_int_equal(o.device_memory, 1048576);
	assert_string_equal(o.save_params, "x");

	/* hputrain.strategy beats zero_optimization.stage, either order */
	load_ok("{'hputrain': {'strategy': 'zero1'},"
		" 'zero_optimization': {'stage': 3}}",
		&o);
	assert_int_equal(o.strategy, HPU_STRATEGY_ZERO1);
	load_ok("{'zero_optimization': {'stage': 3},"
		" 'hputrain': {'strategy': 'fast_ddp'}}",
		&o);
	assert_int_equal(o.strategy, HPU_STRATEGY_FAST_DDP);

	LOAD_ERROR("{'hputrain': {'strategy': 'fsdp'}}", "hputrain.strategy",
		   "fsdp");
	LOAD_ERROR("{'hputrain': {'device_memory': 0}}",
		   "hputrain.device_memory");
	LOAD_ERROR("{'hputrain': {'device_memory': '12 parsecs'}}",
		   "hputrain.device_memory", "12 parsecs");
	LOAD_ERROR("{'hputrain': {'metrics': ''}}", "hputrain.metrics");
	LOAD_ERROR("{'hputrain': {'max_steps': 5, 'max-steps': 6}}",
		   "max-steps", "twice");
	LOAD_ERROR("{'hputrain': {'epoch': 2}}", "hputrain.epoch",
		   "did you mean 'epochs'");
}


/* --config through the flags, on top of the defaults, resolved for world
 * 2; returns the notes hpu_opts_config_notes prints (malloc'd). Flags in
 * `before` come first on the command line. */
static char *notes_of(const char *json, char **before, hpu_train_opts *o)
{
	char path[64], err[2048] = "", *text = NULL;
	size_t len = 0;
	write_temp(json, path);
	hpu_opts_defaults(o);
	for (int k = 0; before && before[k]; k += 2)
		assert_int_equal(hpu_opts_set(o, before[k], before[k + 1], err, sizeof err), 0);
	int rc = hpu_opts_set(o, "config", path, err, sizeof err);
	if (rc == 0)
		rc = hpu_opts_resolve(o, 2, err, sizeof err);
	unlink(path);
	if (rc != 0)
		fail_msg("%s did not load: %s", json, err);
	FILE *f = open_memstream(&text, &len);
	hpu_opts_config_notes(o, f, "hpulaunch");
	fclose(f);
	printf("%s", text);
	return text;
}

static void assert_has(const char *text, const char *needle)
{
	if (!strstr(text, needle))
		fail_msg("\"%s\" is not in:\n%s", needle, text);
}

/* "auto" values (Hugging Face's DeepSpeed files) take our flags and
 * defaults, and one note says what each became. */
static void test_file_auto(void **state)
{
	(void)state;
	hpu_train_opts o;
	char *t = notes_of(
		"{'train_batch_size': 'auto', 'train_micro_batch_size_per_gpu': 'auto',"
		" 'gradient_accumulation_steps': 'auto', 'gradient_clipping': 'auto',"
		" 'fp16': {'enabled': 'auto'}, 'bf16': {'enabled': 'auto'},"
		" 'optimizer': {'type': 'AdamW', 'params': {'lr': 'auto', 'betas': 'auto',"
		"   'eps': 'auto', 'weight_decay': 'auto'}},"
		" 'scheduler': {'type': 'WarmupDecayLR', 'params': {'warmup_min_lr': 'auto',"
		"   'warmup_max_lr': 'auto', 'warmup_num_steps': 'auto', 'total_num_steps': 'auto'}},"
		" 'zero_optimization': {'stage': 3, 'reduce_bucket_size': 'auto',"
		"   'stage3_prefetch_bucket_size': 'auto', 'stage3_param_persistence_threshold': 'auto'}}",
		(char *[]){"lr", "0.02", "precision", "bf16", NULL}, &o);
	assert_int_equal(o.batch_size, 256);
	assert_int_equal(o.micro_batch, 128);
	assert_true(o.lr == 0.02);
	assert_int_equal(o.precision, HPU_PREC_BF16_MIXED);
	assert_int_equal(o.sched, HPU_SCHED_WARMUP_DECAY);
	assert_int_equal(o.strategy, HPU_STRATEGY_ZERO3);
	assert_int_equal(o.ncfg_auto, 17);
	/* one line */
	assert_ptr_equal(strchr(t, '\n'), t + strlen(t) - 1);
	assert_has(t, "hpulaunch: note: ");
	assert_has(t, "\"auto\" values take hputrain's flags and defaults: ");
	assert_has(t, "train_batch_size=256 (--batch-size, default)");
	assert_has(t, "train_micro_batch_size_per_gpu=128 (--micro-batch-size, default)");
	assert_has(t, "gradient_accumulation_steps=1 (--grad-accum, default)");
	assert_has(t, "fp16.enabled=bf16-mixed (--precision)");
	assert_has(t, "optimizer.params.lr=0.02 (--lr)");
	assert_has(t, "optimizer.params.betas=[0.9, 0.999] (--beta1, --beta2, default)");
	assert_has(t, "scheduler.params.warmup_max_lr=0.02 (--lr)");
	assert_has(t, "scheduler.params.total_num_steps=the run's steps (--total-steps, default)");
	assert_has(t, "optimizer.params.weight_decay=0.01 (--weight-decay, default)");
	assert_has(t, "zero_optimization.reduce_bucket_size=6553600 (--reduce-bucket-size, default)");
	free(t);
	/* a key without "auto" is not in the note; no note without any */
	t = notes_of("{'train_batch_size': 64}", NULL, &o);
	assert_string_equal(t, "");
	free(t);
}

/* Keys DeepSpeed accepts that change nothing here: accepted, named in
 * one warning with the reason, keys with one reason together. A top-level
 * key DeepSpeed does not know either is ignored, as DeepSpeed ignores it,
 * unless it is a misspelling of a known one. */
static void test_file_no_effect(void **state)
{
	(void)state;
	hpu_train_opts o;
	char *t = notes_of(
		"{'train_batch_size': 64, 'wall_clock_breakdown': false, 'timers': {},"
		" 'prescale_gradients': false, 'zero_allow_untested_optimizer': true,"
		" 'my_team_setting': 3, 'steps_per_print': 2000,"
		" 'zero_optimization': {'stage': 2, 'contiguous_gradients': true,"
		"   'reduce_scatter': true, 'allgather_partitions': true, 'sub_group_size': 1e9,"
		"   'stage3_gather_16bit_weights_on_model_save': true},"
		" 'optimizer': {'type': 'Adam', 'params': {'torch_adam': true, 'lr': 0.01}},"
		" 'bf16': {'enabled': true}}",
		NULL, &o);
	assert_int_equal(o.batch_size, 64);
	assert_int_equal(o.strategy, HPU_STRATEGY_ZERO2);
	assert_int_equal(o.precision, HPU_PREC_BF16_MIXED);
	assert_true(o.lr == 0.01);
	assert_ptr_equal(strchr(t, '\n'), t + strlen(t) - 1);
	assert_has(t, "hpulaunch: warning: ");
	assert_has(t, "keys with no effect in hputrain: ");
	assert_has(t, "wall_clock_breakdown, timers (timings and counters are --profile's");
	assert_has(t, "prescale_gradients (gradients are summed, then divided by the world size once)");
	assert_has(t, "zero_allow_untested_optimizer (every optimizer here works with every ZeRO stage)");
	assert_has(t, "my_team_setting (not a key hputrain knows)");
	assert_has(t, "zero_optimization.reduce_scatter, zero_optimization.allgather_partitions (each strategy");
	assert_has(t, "zero_optimization.contiguous_gradients (gradients always live in one contiguous buffer)");
	assert_has(t, "zero_optimization.stage3_gather_16bit_weights_on_model_save (--save-params");
	assert_has(t, "optimizer.params.torch_adam (");
	assert_null(strstr(t, "sub_group_size")); /* honoured */
	assert_null(strstr(t, "steps_per_print"));
	free(t);
	/* a misspelt top-level key is still an error */
	LOAD_ERROR("{'wall_clock_breakdwn': false}", "unknown key 'wall_clock_breakdwn'",
		   "did you mean 'wall_clock_breakdown'");
	/* zero_optimization is strict, as DeepSpeed's */
	LOAD_ERROR("{'zero_optimization': {'my_team_setting': 3}}",
		   "unknown key 'zero_optimization.my_team_setting'");
	/* values DeepSpeed takes that would change the training here */
	LOAD_ERROR("{'optimizer': {'type': 'AdamW', 'params': {'amsgrad': true}}}",
		   "optimizer.params.amsgrad: true is not supported");
	LOAD_ERROR("{'optimizer': {'type': 'SGD', 'params': {'dampening': 0.1}}}",
		   "optimizer.params.dampening: 0.1 is not supported");
}

/* Every bad key of a file in one run, one a line. */
static void test_file_all_errors(void **state)
{
	(void)state;
	char path[64], err[4096] = "";
	hpu_train_opts o, d;
	write_temp("{'train_batch_szie': 8,"
		   " 'zero_optimization': {'stage': 3, 'stage3_prefetch_bucket_sise': 5,"
		   "   'overlap_com': true},"
		   " 'optimizer': {'type': 'AdamW', 'params': {'lr': 'fast', 'betas': [0.9]}},"
		   " 'fp16': {'loss_scail': 0}, 'hputrain': {'epoch': 2}}",
		   path);
	hpu_opts_defaults(&o);
	d = o;
	assert_int_equal(hpu_opts_load_file(&o, path, err, sizeof err), -1);
	unlink(path);
	printf("  -> \"%s\"\n", err);
	assert_memory_equal(&o, &d, sizeof o);
	char head[128];
	snprintf(head, sizeof head, "%s has 7 errors:\n  ", path);
	assert_has(err, head);
	assert_has(err, "\n  unknown key 'train_batch_szie' in");
	assert_has(err, "(did you mean 'train_batch_size'?)");
	assert_has(err, "\n  unknown key 'zero_optimization.stage3_prefetch_bucket_sise'");
	assert_has(err, "\n  unknown key 'zero_optimization.overlap_com' in");
	assert_has(err, "optimizer.params.lr: expected a number, got a string \"fast\"");
	assert_has(err, "optimizer.params.betas: expected two numbers");
	assert_has(err, "\n  unknown key 'fp16.loss_scail'");
	assert_has(err, "\n  unknown key 'hputrain.epoch'");
	int lines = 0;
	for (const char *c = err; *c; c++)
		lines += *c == '\n';
	assert_int_equal(lines, 7);
}

/* Lightning's precision names; DeepSpeed's communication_data_type, amp,
 * and the sizes whose 0 means something in DeepSpeed. */
static void test_precision_names_and_zero_sizes(void **state)
{
	(void)state;
	static const struct {
		const char *name;
		hpu_precision p;
	} names[] = {{"32", HPU_PREC_FP32},           {"32-true", HPU_PREC_FP32},
		     {"fp32", HPU_PREC_FP32},         {"bf16", HPU_PREC_BF16_MIXED},
		     {"bf16-mixed", HPU_PREC_BF16_MIXED}, {"16-mixed", HPU_PREC_FP16_MIXED},
		     {"16", HPU_PREC_FP16_MIXED},     {"fp8", HPU_PREC_FP8}};
	hpu_train_opts o;
	char err[512];
	int stop;
	for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
		hpu_opts_defaults(&o);
		assert_int_equal(parse(&o, ARGS("--precision", (char *)names[k].name, "m.so"),
				       &stop, err, sizeof err), 0);
		assert_int_equal(o.precision, names[k].p);
	}
	EXPECT_ERROR(ARGS("--precision", "bf16-true"), "--precision", "bf16-true",
		     "bf16-mixed", "32-true");
	load_ok("{'hputrain': {'precision': '32-true'}}", &o);
	assert_int_equal(o.precision, HPU_PREC_FP32);
	load_ok("{'hputrain': {'precision': 'bf16'}}", &o);
	assert_int_equal(o.precision, HPU_PREC_BF16_MIXED);
	load_ok("{'amp': {'enabled': true, 'opt_level': 'O1'}}", &o);
	assert_int_equal(o.precision, HPU_PREC_FP16_MIXED);
	load_ok("{'bfloat16': {'enabled': true}}", &o);
	assert_int_equal(o.precision, HPU_PREC_BF16_MIXED);
	load_ok("{'communication_data_type': 'bf16'}", &o);
	assert_int_equal(o.grad_comm_dtype, HPU_COMM_BF16);
	LOAD_ERROR("{'communication_data_type': 'fp16'}", "communication_data_type", "fp16");
	load_ok("{'zero_optimization': {'reduce_bucket_size': 0, 'allgather_bucket_size': 0,"
		" 'stage3_max_live_parameters': 0, 'sub_group_size': 0,"
		" 'stage3_prefetch_bucket_size': 0, 'stage3_param_persistence_threshold': 0}}",
		&o);
	assert_int_equal(o.reduce_bucket, 0);
	assert_int_equal(o.allgather_bucket, 0);
	assert_int_equal(o.max_live_params, 0);
	assert_int_equal(o.sub_group_size, 0);
	/* the short names DeepSpeed also accepts */
	load_ok("{'zero_optimization': {'prefetch_bucket_size': 7, 'param_persistence_threshold': 8,"
		" 'max_live_parameters': 9}}",
		&o);
	assert_int_equal(o.prefetch_bucket, 7);
	assert_int_equal(o.persistence_threshold, 8);
	assert_int_equal(o.max_live_params, 9);
}

/* The four bad files the issue names, and the other kinds of error. */
static void test_file_errors(void **state)
{
	(void)state;
	/* an unknown key, with the closest known one */
	LOAD_ERROR("{'zero_optimization': {'stgae': 2}}",
		   "unknown key 'zero_optimization.stgae'",
		   "(did you mean 'stage'?)");
	LOAD_ERROR("{'train_batch_sizes': 2}", "'train_batch_sizes'",
		   "did you mean 'train_batch_size'");
	LOAD_ERROR("{'zero_optimization': {'frobnicate': 2}}",
		   "unknown key 'zero_optimization.frobnicate'");
	/* a stage out of range */
	LOAD_ERROR("{'zero_optimization': {'stage': 4}}",
		   "zero_optimization.stage: 4 is out of range 0..3");
	LOAD_ERROR("{'zero_optimization': {'stage': -1}}",
		   "zero_optimization.stage", "-1");
	/* a value that is not a number */
	LOAD_ERROR("{'zero_optimization': {'stage': 'two'}}",
		   "zero_optimization.stage: expected a number, got a string "
		   "\"two\"");
	LOAD_ERROR("{'train_batch_size': true}", "train_batch_size",
		   "expected a number, got true");
	LOAD_ERROR("{'gradient_clipping': null}", "gradient_clipping",
		   "got null");
	LOAD_ERROR("{'zero_optimization': {'overlap_comm': 'yes'}}",
		   "zero_optimization.overlap_comm", "true or false");
	LOAD_ERROR("{'zero_optimization': 2}", "zero_optimization",
		   "expected an object, got a number 2");
	/* "auto" where no flag or default can stand for it */
	LOAD_ERROR("{'zero_optimization': {'stage': 'auto'}}",
		   "zero_optimization.stage: \"auto\" is not supported; give a number");
	LOAD_ERROR("{'optimizer': {'type': 'auto'}}", "optimizer.type", "\"auto\"");
	/* integers */
	LOAD_ERROR("{'train_batch_size': 2.5}", "train_batch_size", "2.5",
		   "not an integer");
	LOAD_ERROR("{'train_batch_size': 0}", "train_batch_size",
		   "out of range");
	LOAD_ERROR("{'gradient_clipping': -1}", "gradient_clipping", "-1");
	/* a value holding a newline still makes one line */
	LOAD_ERROR("{'hputrain': {'strategy': 'a\\nb'}}", "hputrain.strategy");
	LOAD_ERROR("{'zero_optimization': {'stage': 1, 'stage': 2}}",
		   "zero_optimization.stage", "twice");
	LOAD_ERROR("[1, 2]", "expected a JSON object", "an array");
}

static void test_file_syntax_and_io(void **state)
{
	(void)state;
	char path[64], err[512];
	hpu_train_opts o;
	/* the error is on line 3 */
	write_temp("{\n  'train_batch_size': 8,\n  'gradient_clipping' 1.0\n}\n",
		   path);
	hpu_opts_defaults(&o);
	assert_int_equal(hpu_opts_load_file(&o, path, err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, "line 3"));
	assert_non_null(strstr(err, "JSON syntax error"));
	assert_null(strchr(err, '\n'));
	unlink(path);

	LOAD_ERROR("{'train_batch_size': 8,", "line 1", "ends too early");
	LOAD_ERROR("", "JSON syntax error");
	LOAD_ERROR("{'train_batch_size': 8}\n}", "line 2", "JSON syntax error");
	LOAD_ERROR("{'a': 1,\n\n 'b' 2}", "line 3", "JSON syntax error");

	err[0] = 0;
	assert_int_equal(hpu_opts_load_file(&o, "/nonexistent/x.json", err,
					    sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, "/nonexistent/x.json"));
	assert_non_null(strstr(err, strerror(ENOENT)));
	assert_int_equal(hpu_opts_load_file(&o, "/tmp", err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, strerror(EISDIR)));
}

/* A FIFO named as the config file is refused at once (not waited on for
 * a writer), and so is any other file that is not a regular one; a NUL
 * byte makes a file not text. */
static void test_file_not_regular(void **state)
{
	(void)state;
	char fifo[64] = "/tmp/hpu-test-config-fifo-XXXXXX", err[512] = "";
	int fd = mkstemp(fifo);
	assert_true(fd >= 0);
	close(fd);
	unlink(fifo);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	hpu_train_opts o;
	hpu_opts_defaults(&o);
	alarm(10); /* a hang fails the test instead of blocking ctest */
	int rc = hpu_opts_load_file(&o, fifo, err, sizeof err);
	printf("  -> \"%s\"\n", err);
	assert_int_equal(rc, -1);
	assert_non_null(strstr(err, fifo));
	assert_non_null(strstr(err, "not a regular file (a FIFO)"));
	int stop;
	err[0] = 0;
	assert_int_equal(parse(&o, ARGS("--config", fifo, "m.so"), &stop, err, sizeof err), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, fifo));
	assert_non_null(strstr(err, "not a regular file (a FIFO)"));
	char *buf = NULL;
	size_t len;
	const char *why = hpu_read_file(fifo, &buf, &len); /* QUANT_CONFIG's reader */
	assert_non_null(why);
	assert_string_equal(why, "not a regular file (a FIFO)");
	alarm(0);
	unlink(fifo);
	assert_int_equal(hpu_opts_load_file(&o, "/dev/null", err, sizeof err), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, "/dev/null: not a regular file (a character device)"));

	char path[64];
	write_temp("{'epochs': 2}", path);
	FILE *f = fopen(path, "a");
	assert_non_null(f);
	fputc(0, f);
	fclose(f);
	assert_int_equal(hpu_opts_load_file(&o, path, err, sizeof err), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, "NUL byte"));
	why = hpu_read_file(path, &buf, &len);
	assert_non_null(why);
	assert_non_null(strstr(why, "NUL byte"));
	unlink(path);
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
	hpu_opts_defaults(&o);
	assert_int_equal(hpu_opts_check_checkpoint_dir(&o, err, sizeof err), 0); /* none */
	snprintf(o.checkpoint_dir, sizeof o.checkpoint_dir, "%s/a/b/", base);
	if (hpu_opts_check_checkpoint_dir(&o, err, sizeof err) != 0)
		fail_msg("%s", err);
	struct stat st;
	snprintf(o.checkpoint_dir, sizeof o.checkpoint_dir, "%s/a/b", base);
	assert_int_equal(stat(o.checkpoint_dir, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(dir_entries(o.checkpoint_dir), 0); /* the probe is gone */
	assert_int_equal(hpu_opts_check_checkpoint_dir(&o, err, sizeof err), 0); /* again */

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
		assert_int_equal(hpu_opts_check_checkpoint_dir(&o, err, sizeof err), -1);
		printf("  -> \"%s\"\n", err);
		assert_non_null(strstr(err, "checkpoint directory"));
		assert_non_null(strstr(err, bad[i].want));
	}
	snprintf(o.checkpoint_dir, sizeof o.checkpoint_dir, "/dev/null/ckpt");
	hpu_opts_check_checkpoint_dir(&o, err, sizeof err);
	assert_non_null(strstr(err, strerror(ENOTDIR)));
	char rm[160];
	snprintf(rm, sizeof rm, "rm -rf %s", base);
	assert_int_equal(system(rm), 0);
}

/* --config through the flags: a flag beats the file in either order. */
static void test_flags_beat_file(void **state)
{
	(void)state;
	char path[64], cfg[80], err[512];
	int stop;
	write_temp("{'optimizer': {'type': 'SGD', 'params': {'lr': 0.5,"
		   " 'momentum': 0.7}}, 'train_batch_size': 64,"
		   " 'zero_optimization': {'stage': 2, 'overlap_comm': true},"
		   " 'hputrain': {'epochs': 4}}",
		   path);
	snprintf(cfg, sizeof(cfg), "--config=%s", path);
	hpu_train_opts a, b;
	hpu_opts_defaults(&a);
	hpu_opts_defaults(&b);
	assert_int_equal(parse(&a, ARGS("--lr", "0.1", "--no-overlap-comm",
					"--strategy", "ddp", "--config", path,
					"model.so"),
			       &stop, err, sizeof(err)), 0);
	assert_int_equal(parse(&b, ARGS(cfg, "--lr", "0.1", "--strategy", "ddp",
					"--no-overlap-comm", "model.so"),
			       &stop, err, sizeof(err)), 0);
	unlink(path);
	hpu_train_opts *both[] = {&a, &b};
	for (int k = 0; k < 2; k++) {
		hpu_train_opts *o = both[k];
		assert_true(o->lr == 0.1);
		assert_int_equal(o->strategy, HPU_STRATEGY_DDP);
		assert_int_equal(o->overlap_comm, 0);
		/* what no flag set comes from the file */
		assert_int_equal(o->optimizer, HPU_OPTIM_SGD);
		assert_true(o->momentum == 0.7);
		assert_int_equal(o->batch_size, 64);
		assert_int_equal(o->epochs, 4);
		assert_string_equal(o->config, path);
	}

	/* --bucket-cap-mb is the flag for reduce_bucket_size */
	write_temp("{'zero_optimization': {'reduce_bucket_size': 1000}}", path);
	hpu_opts_defaults(&a);
	assert_int_equal(parse(&a, ARGS("--bucket-cap-mb", "1", "--config",
					path),
			       &stop, err, sizeof(err)), 0);
	assert_int_equal(a.reduce_bucket, 262144);
	hpu_opts_defaults(&a);
	assert_int_equal(parse(&a, ARGS("--config", path), &stop, err,
			       sizeof(err)), 0);
	assert_int_equal(a.reduce_bucket, 1000);
	unlink(path);

	/* a flag also satisfies WarmupDecayLR's total_num_steps */
	write_temp("{'scheduler': {'type': 'WarmupDecayLR'}}", path);
	hpu_opts_defaults(&a);
	assert_int_equal(parse(&a, ARGS("--total-steps", "50", "--config",
					path),
			       &stop, err, sizeof(err)), 0);
	assert_int_equal(a.sched, HPU_SCHED_WARMUP_DECAY);
	assert_int_equal(a.total_steps, 50);
	unlink(path);

	/* a bad file through --config: the error is the file's */
	hpu_opts_defaults(&a);
	b = a;
	write_temp("{'zero_optimization': {'stage': 9}}", path);
	assert_int_equal(parse(&a, ARGS("--config", path), &stop, err,
			       sizeof(err)), -1);
	unlink(path);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, "zero_optimization.stage: 9 is out of range"));
	assert_memory_equal(&a, &b, sizeof(a));
}

/* ---- resolving the three batch numbers ---- */

static void set_ok(hpu_train_opts *o, const char *name, const char *v)
{
	char err[256];
	if (hpu_opts_set(o, name, v, err, sizeof(err)) != 0)
		fail_msg("--%s %s: %s", name, v, err);
}

static void test_resolve_batch(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];

	/* batch and micro-batch: grad_accum follows */
	hpu_opts_defaults(&o);
	set_ok(&o, "batch-size", "512");
	set_ok(&o, "micro-batch-size", "32");
	assert_int_equal(hpu_opts_resolve(&o, 4, err, sizeof(err)), 0);
	assert_int_equal(o.grad_accum, 4);
	/* batch and grad_accum: micro_batch follows */
	hpu_opts_defaults(&o);
	set_ok(&o, "batch-size", "512");
	set_ok(&o, "grad-accum", "2");
	assert_int_equal(hpu_opts_resolve(&o, 4, err, sizeof(err)), 0);
	assert_int_equal(o.micro_batch, 64);
	/* micro-batch and grad_accum: the batch follows */
	hpu_opts_defaults(&o);
	set_ok(&o, "micro-batch-size", "16");
	set_ok(&o, "grad-accum", "3");
	assert_int_equal(hpu_opts_resolve(&o, 2, err, sizeof(err)), 0);
	assert_int_equal(o.batch_size, 96);
	/* micro-batch alone: grad_accum 1 */
	hpu_opts_defaults(&o);
	set_ok(&o, "micro-batch-size", "16");
	assert_int_equal(hpu_opts_resolve(&o, 3, err, sizeof(err)), 0);
	assert_int_equal(o.batch_size, 48);
	assert_int_equal(o.grad_accum, 1);
	/* grad_accum alone: batch 256 */
	hpu_opts_defaults(&o);
	set_ok(&o, "grad-accum", "4");
	assert_int_equal(hpu_opts_resolve(&o, 2, err, sizeof(err)), 0);
	assert_int_equal(o.micro_batch, 32);
	/* all three, consistent; resolving twice changes nothing */
	hpu_opts_defaults(&o);
	set_ok(&o, "batch-size", "256");
	set_ok(&o, "micro-batch-size", "32");
	set_ok(&o, "grad-accum", "2");
	assert_int_equal(hpu_opts_resolve(&o, 4, err, sizeof(err)), 0);
	hpu_train_opts again = o;
	assert_int_equal(hpu_opts_resolve(&again, 4, err, sizeof(err)), 0);
	assert_memory_equal(&o, &again, sizeof(o));

	/* from the file, and the mismatch the issue names */
	load_ok("{'train_batch_size': 256, 'train_micro_batch_size_per_gpu': 32,"
		" 'gradient_accumulation_steps': 4}",
		&o);
	err[0] = 0;
	assert_int_equal(hpu_opts_resolve(&o, 4, err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_string_equal(err, "train_batch_size 256 != "
				 "train_micro_batch_size_per_gpu 32 x "
				 "gradient_accumulation_steps 4 x world size 4 "
				 "= 512");
	assert_int_equal(hpu_opts_resolve(&o, 2, err, sizeof(err)), 0);
	load_ok("{'train_micro_batch_size_per_gpu': 8,"
		" 'gradient_accumulation_steps': 2}",
		&o);
	assert_int_equal(hpu_opts_resolve(&o, 8, err, sizeof(err)), 0);
	assert_int_equal(o.batch_size, 128);

	/* not divisible */
	hpu_opts_defaults(&o);
	set_ok(&o, "batch-size", "100");
	assert_int_equal(hpu_opts_resolve(&o, 3, err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_string_equal(err, "--batch-size 100 is not divisible by "
				 "--grad-accum 1 x world size 3");
	hpu_opts_defaults(&o);
	set_ok(&o, "batch-size", "100");
	set_ok(&o, "micro-batch-size", "30");
	assert_int_equal(hpu_opts_resolve(&o, 1, err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, "--batch-size 100"));
	assert_non_null(strstr(err, "--micro-batch-size 30"));
	hpu_opts_defaults(&o);
	assert_int_equal(hpu_opts_resolve(&o, 3, err, sizeof(err)), -1);
	/* a default is named by the flag that changes it */
	assert_non_null(strstr(err, "--batch-size 256"));
	/* too large */
	hpu_opts_defaults(&o);
	set_ok(&o, "micro-batch-size", "16777216");
	set_ok(&o, "grad-accum", "1048576");
	assert_int_equal(hpu_opts_resolve(&o, 1 << 22, err, sizeof(err)), -1);
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
		hpu_opts_defaults(&o);
		set_ok(&o, "grad-comm-dtype", "bf16");
		set_ok(&o, "strategy", ok[k]);
		assert_int_equal(hpu_opts_resolve(&o, 2, err, sizeof(err)), 0);
	}
	for (int k = 0; k < 3; k++) {
		hpu_opts_defaults(&o);
		set_ok(&o, "grad-comm-dtype", "bf16");
		set_ok(&o, "strategy", bad[k]);
		assert_int_equal(hpu_opts_resolve(&o, 2, err, sizeof(err)), -1);
		printf("  -> \"%s\"\n", err);
		assert_non_null(strstr(err, "--grad-comm-dtype bf16"));
		assert_non_null(strstr(err, bad[k]));
	}
	hpu_opts_defaults(&o);
	set_ok(&o, "scheduler", "warmup_decay");
	set_ok(&o, "warmup-steps", "100");
	assert_int_equal(hpu_opts_resolve(&o, 1, err, sizeof(err)), 0);
	set_ok(&o, "total-steps", "100");
	assert_int_equal(hpu_opts_resolve(&o, 1, err, sizeof(err)), 0);
	set_ok(&o, "total-steps", "99");
	assert_int_equal(hpu_opts_resolve(&o, 1, err, sizeof(err)), -1);
	printf("  -> \"%s\"\n", err);
	assert_non_null(strstr(err, "--total-steps 99"));
	assert_non_null(strstr(err, "--warmup-steps 100"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_defaults),
	    cmocka_unit_test(test_weight_decay_default),
	    cmocka_unit_test(test_takes_value),
	    cmocka_unit_test(test_parse_separate_and_equals),
	    cmocka_unit_test(test_parse_all),
	    cmocka_unit_test(test_parse_stops_at_non_option),
	    cmocka_unit_test(test_set_direct),
	    cmocka_unit_test(test_errors_unknown_and_missing),
	    cmocka_unit_test(test_errors_bad_numbers),
	    cmocka_unit_test(test_errors_unknown_choice),
	    cmocka_unit_test(test_rejected_value_keeps_field),
	    cmocka_unit_test(test_resolve_world),
	    cmocka_unit_test(test_help_lists_options),
	    cmocka_unit_test(test_defaults_new_fields),
	    cmocka_unit_test(test_parse_new_flags),
	    cmocka_unit_test(test_errors_new_flags),
	    cmocka_unit_test(test_parse_size),
	    cmocka_unit_test(test_file_top_and_zero),
	    cmocka_unit_test(test_file_optimizer),
	    cmocka_unit_test(test_file_scheduler),
	    cmocka_unit_test(test_file_precision),
	    cmocka_unit_test(test_fp8_flags),
	    cmocka_unit_test(test_checkpoint_flags),
	    cmocka_unit_test(test_profile_flags),
	    cmocka_unit_test(test_file_hputrain),
	    cmocka_unit_test(test_file_errors),
	    cmocka_unit_test(test_file_auto),
	    cmocka_unit_test(test_file_no_effect),
	    cmocka_unit_test(test_file_all_errors),
	    cmocka_unit_test(test_precision_names_and_zero_sizes),
	    cmocka_unit_test(test_file_syntax_and_io),
	    cmocka_unit_test(test_file_not_regular),
	    cmocka_unit_test(test_checkpoint_dir_check),
	    cmocka_unit_test(test_flags_beat_file),
	    cmocka_unit_test(test_resolve_batch),
	    cmocka_unit_test(test_resolve_other_checks),
	};
	/* HPU_TEST=test_name (a glob) runs only the tests it names. */
	if (getenv("HPU_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPU_TEST"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
