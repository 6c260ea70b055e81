/* examples/common/args.c, the example models' own argument parser: a
 * whole number is decimal digits and nothing else (strtod had taken
 * "0x10" and "1e1" for --ctx, strtol " 16" and "+16"), and an argument
 * that takes a value, followed by another of the model's arguments, is
 * said to need one (it took that argument as its value). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "examples/common/args.h"
#include "worker/hpu/model.h" /* worker/hpu: a builder without the runtime */

typedef struct targs {
	const char *tokens;
	double ctx, temp;
	int ckpt;
} targs;

static const ex_arg table[] = {
	{"--tokens", EX_ARG_STR, offsetof(targs, tokens), "FILE", 0, 0},
	{"--ctx", EX_ARG_INT, offsetof(targs, ctx), "T", 1, 4096},
	{"--temp", EX_ARG_NUM, offsetof(targs, temp), "X", 0, 100},
	{"--ckpt", EX_ARG_FLAG, offsetof(targs, ckpt), NULL, 0, 0},
};

#define ARGV(...) ((char *[]){"model", __VA_ARGS__, NULL})

/* ex_args_parse of argv by the table: -1 with `want` in the builder's
 * error, or 0 (want NULL) with *out filled. */
static void parse(int argc, char **argv, const char *want, targs *out)
{
	hpu_builder *b = hpu__model_new(0, 1, 64);
	assert_non_null(b);
	memset(out, 0, sizeof *out);
	int rc = ex_args_parse(b, argc, argv, table, 4, out);
	if (want && (rc != -1 || !strstr(b->err, want)))
		fail_msg("%s %s: rc %d, error \"%s\", wanted \"%s\"", argv[1], argc > 2 ? argv[2] : "", rc,
			 b->err, want);
	if (!want && rc != 0)
		fail_msg("%s %s: refused: %s", argv[1], argc > 2 ? argv[2] : "", b->err);
	hpu__model_destroy(&b);
}

static void test_table_values(void **state)
{
	(void)state;
	targs a;
	parse(8, ARGV("--tokens", "t.bin", "--ctx", "16", "--temp", "0.5", "--ckpt"), NULL, &a);
	assert_string_equal(a.tokens, "t.bin");
	assert_true(a.ctx == 16 && a.temp == 0.5 && a.ckpt == 1);
	/* a value that is the next argument of the table: "--tokens --ctx 16"
	 * read "--ctx" as the file, then "16" was unknown */
	parse(4, ARGV("--tokens", "--ctx", "16"),
	      "--tokens needs a value (the next argument, --ctx, is one of the model's arguments)", &a);
	parse(3, ARGV("--ctx", "--ckpt"),
	      "--ctx needs a value (the next argument, --ckpt, is one of the model's arguments)", &a);
	parse(2, ARGV("--ctx"), "--ctx needs a value (--ctx T)", &a);
	/* a whole number is decimal digits: no hex, exponent, fraction,
	 * space or '+' */
	static const char *const bad[] = {"0x10", "1e1", "16.5", " 16", "+16", "16 ", "", "-"};
	for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
		char want[80];
		snprintf(want, sizeof want, "--ctx wants a whole number in 1..4096, got %s", bad[k]);
		parse(3, ARGV("--ctx", (char *)bad[k]), want, &a);
	}
	parse(3, ARGV("--ctx", "4097"), "--ctx wants a whole number in 1..4096, got 4097", &a);
	parse(3, ARGV("--ctx", "99999999999999999999"), "got 99999999999999999999", &a);
	parse(3, ARGV("--ctx", "4096"), NULL, &a);
	assert_true(a.ctx == 4096);
	/* a real number is decimal too: strtod took hex, spaces and '+' */
	static const char *const badnum[] = {"0x1p-2", " 0.5", "+0.5", "0.5 ", "", "-", ".",
					     "e1", "inf", "nan", "0.5x"};
	for (size_t k = 0; k < sizeof badnum / sizeof *badnum; k++) {
		char want[80];
		snprintf(want, sizeof want, "--temp wants a number in 0..100, got %s", badnum[k]);
		parse(3, ARGV("--temp", (char *)badnum[k]), want, &a);
	}
	static const char *const goodnum[] = {"0.5", ".5", "5.", "5e-1", "0.05E1", "-0"};
	for (size_t k = 0; k < sizeof goodnum / sizeof *goodnum; k++) {
		parse(3, ARGV("--temp", (char *)goodnum[k]), NULL, &a);
		assert_true(a.temp == 0.5 || (k == 2 && a.temp == 5) || (k == 5 && a.temp == 0));
	}
}

static void test_whole_numbers(void **state)
{
	(void)state;
	hpu_builder *b;
	long x = 0;
	static const char *const bad[] = {" 5", "+5", "0x5", "5e0", "5.0", "--5", "5 "};
	for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
		b = hpu__model_new(0, 1, 64);
		assert_int_equal(ex_arg_long(b, "--hidden", bad[k], -9, 9, &x), -1);
		char want[80];
		snprintf(want, sizeof want, "--hidden wants a whole number in -9..9, got %s", bad[k]);
		if (!strstr(b->err, want))
			fail_msg("\"%s\": error \"%s\", wanted \"%s\"", bad[k], b->err, want);
		hpu__model_destroy(&b);
	}
	b = hpu__model_new(0, 1, 64);
	assert_int_equal(ex_arg_long(b, "--hidden", "-7", -9, 9, &x), 0);
	assert_int_equal(x, -7);
	assert_int_equal(ex_arg_long(b, "--hidden", "007", -9, 9, &x), 0);
	assert_int_equal(x, 7);
	hpu__model_destroy(&b);
	/* the prefix reader (the CNN's "C1,C2") */
	const char *end;
	assert_int_equal(ex_long_prefix("32,64", &end, &x), 0);
	assert_int_equal(x, 32);
	assert_string_equal(end, ",64");
	assert_int_equal(ex_long_prefix(" 32", &end, &x), -1);
	assert_int_equal(ex_long_prefix("+32", &end, &x), -1);
}

/* A model's own loop: ex_arg_has_value and ex_arg_unknown on its usage
 * list; `want` in the error, or NULL where argv[1] has its value. */
static void own(int argc, char **argv, const char *want)
{
	static const char list[] = "--data DIR, --channels C1,C2, --hidden N, --checkpoint";
	int has = ex_arg_has_value(argc, argv, 1, list);
	if (!want) {
		if (!has)
			fail_msg("%s %s: said to have no value", argv[1], argv[2]);
		return;
	}
	hpu_builder *b = hpu__model_new(0, 1, 64);
	assert_non_null(b);
	assert_int_equal(ex_arg_unknown(b, argc, argv, 1, list), -1);
	if (has || !strstr(b->err, want))
		fail_msg("%s: has a value %d, error \"%s\", wanted \"%s\"", argv[1], has, b->err, want);
	hpu__model_destroy(&b);
}

static void test_own_loop(void **state)
{
	(void)state;
	own(4, ARGV("--data", "--hidden", "16"),
	    "--data needs a value (the next argument, --hidden, is one of the model's arguments)");
	own(3, ARGV("--hidden", "--checkpoint"),
	    "--hidden needs a value (the next argument, --checkpoint, is one of the model's arguments)");
	own(3, ARGV("--data", "--channels"), "--data needs a value (the next argument, --channels,");
	own(2, ARGV("--hidden"), "--hidden needs a value (--hidden N)");
	own(2, ARGV("--channels"), "--channels needs a value (--channels C1,C2)");
	own(2, ARGV("--bogus"), "unknown model argument --bogus (model arguments: --data DIR, ");
	own(3, ARGV("--data", "dir"), NULL);
	own(3, ARGV("--data", "--hid"), NULL); /* not one of its arguments: a name */
	own(3, ARGV("--hidden", "-3"), NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table_values),
		cmocka_unit_test(test_whole_numbers),
		cmocka_unit_test(test_own_loop),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
