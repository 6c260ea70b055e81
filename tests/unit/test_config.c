/* Unit tests for the training options (worker/config.c): defaults, parsing
 * of "--name value" / "--name=value" / flags up to the model path, the
 * error texts (each must name the offending option, so a user can find it
 * on a long command line), and the checks against the world size.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config.h"

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
	assert_int_equal(hpu_opts_set(&o, "optimizer", "adam", err,
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
	EXPECT_ERROR(ARGS("--optimizer", "adam"), "optimizer", "adam");
	EXPECT_ERROR(ARGS("--optimizer=SGD"), "optimizer", "SGD");
	EXPECT_ERROR(ARGS("--strategy", "fsdp"), "strategy", "fsdp");
	EXPECT_ERROR(ARGS("--strategy="), "strategy");
}

/* ---- checks against the world size ---- */

static void test_check(void **state)
{
	(void)state;
	hpu_train_opts o;
	char err[256];
	hpu_opts_defaults(&o);
	for (int w = 1; w <= 8; w *= 2)
		assert_int_equal(hpu_opts_check(&o, w, err, sizeof(err)), 0);

	o.batch_size = 1000;
	assert_int_equal(hpu_opts_check(&o, 5, err, sizeof(err)), 0);
	err[0] = 0;
	assert_int_equal(hpu_opts_check(&o, 7, err, sizeof(err)), -1);
	printf("  batch 1000, world 7 -> \"%s\"\n", err);
	assert_non_null(strstr(err, "1000"));
	assert_non_null(strstr(err, "7"));

	/* every strategy but fast_ddp is refused, by name */
	const hpu_strategy refused[] = {HPU_STRATEGY_DDP, HPU_STRATEGY_ZERO1,
					HPU_STRATEGY_ZERO2, HPU_STRATEGY_ZERO3};
	const char *names[] = {"ddp", "zero1", "zero2", "zero3"};
	for (size_t k = 0; k < 4; k++) {
		hpu_opts_defaults(&o);
		assert_int_equal(hpu_opts_set(&o, "strategy", names[k], err,
					      sizeof(err)), 0);
		assert_int_equal(o.strategy, refused[k]);
		assert_string_equal(hpu_strategy_name(o.strategy), names[k]);
		err[0] = 0;
		assert_int_equal(hpu_opts_check(&o, 1, err, sizeof(err)), -1);
		printf("  strategy %-6s -> \"%s\"\n", names[k], err);
		assert_non_null(strstr(err, names[k]));
	}
	hpu_opts_defaults(&o);
	assert_int_equal(hpu_opts_set(&o, "strategy", "fast_ddp", err,
				      sizeof(err)), 0);
	assert_int_equal(hpu_opts_check(&o, 4, err, sizeof(err)), 0);
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
	const char *names[] = {"--epochs", "--lr", "--optimizer", "--nesterov",
			       "--strategy", "--no-eval", "--metrics"};
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++)
		assert_non_null(strstr(buf, names[k]));
	free(buf);
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
	    cmocka_unit_test(test_check),
	    cmocka_unit_test(test_help_lists_options),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
