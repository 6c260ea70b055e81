/* Unit tests for the number parser (common/num.c): ranges and their
 * bounds, overflow, trailing and missing text, signs on unsigned numbers,
 * the prefix form, NaN and infinities, and that a failure leaves *out
 * and errno alone. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "common/num.h"

/* Parses s as a long lo..hi; checks the code, and *out: the value on
 * success, untouched (7) on failure. */
static void check_long(const char *s, long lo, long hi, int want, long v)
{
	long out = 7;
	int r = hpu__parse_long(s, lo, hi, &out);
	if (r != want || out != (want == HPU_NUM_OK ? v : 7))
		fail_msg("\"%s\" in %ld..%ld: code %d, value %ld; expected %d, %ld", s ? s : "(null)",
			 lo, hi, r, out, want, want == HPU_NUM_OK ? v : 7);
}

static void check_u64(const char *s, uint64_t lo, uint64_t hi, int want, uint64_t v)
{
	uint64_t out = 7;
	int r = hpu__parse_u64(s, lo, hi, &out);
	if (r != want || out != (want == HPU_NUM_OK ? v : 7))
		fail_msg("\"%s\": code %d, value %llu; expected %d, %llu", s, r,
			 (unsigned long long)out, want,
			 (unsigned long long)(want == HPU_NUM_OK ? v : 7));
}

static void check_double(const char *s, double lo, double hi, int want, double v)
{
	double out = 7;
	int r = hpu__parse_double(s, lo, hi, &out);
	if (r != want || out != (want == HPU_NUM_OK ? v : 7))
		fail_msg("\"%s\" in %g..%g: code %d, value %g; expected %d, %g", s, lo, hi, r, out,
			 want, want == HPU_NUM_OK ? v : 7);
}

static void test_long(void **state)
{
	(void)state;
	check_long("42", 0, 100, HPU_NUM_OK, 42);
	check_long("-42", -100, 100, HPU_NUM_OK, -42);
	check_long("+5", 0, 10, HPU_NUM_OK, 5);
	check_long(" 5", 0, 10, HPU_NUM_OK, 5); /* as strtol: leading space */
	check_long("007", 0, 10, HPU_NUM_OK, 7);
	/* the bounds are inclusive */
	check_long("1", 1, 4096, HPU_NUM_OK, 1);
	check_long("4096", 1, 4096, HPU_NUM_OK, 4096);
	check_long("0", 1, 4096, HPU_NUM_RANGE, 0);
	check_long("4097", 1, 4096, HPU_NUM_RANGE, 0);
	check_long("-1", 0, 10, HPU_NUM_RANGE, 0);
	/* the type's own range */
	check_long("9223372036854775807", LONG_MIN, LONG_MAX, HPU_NUM_OK, LONG_MAX);
	check_long("-9223372036854775808", LONG_MIN, LONG_MAX, HPU_NUM_OK, LONG_MIN);
	check_long("9223372036854775808", LONG_MIN, LONG_MAX, HPU_NUM_RANGE, 0);
	check_long("-9223372036854775809", LONG_MIN, LONG_MAX, HPU_NUM_RANGE, 0);
	check_long("99999999999999999999", 0, 10, HPU_NUM_RANGE, 0);
	/* not numbers */
	check_long("", 0, 10, HPU_NUM_INVALID, 0);
	check_long(" ", 0, 10, HPU_NUM_INVALID, 0);
	check_long(NULL, 0, 10, HPU_NUM_INVALID, 0);
	check_long("-", 0, 10, HPU_NUM_INVALID, 0);
	check_long("abc", 0, 10, HPU_NUM_INVALID, 0);
	check_long("5x", 0, 10, HPU_NUM_INVALID, 0);
	check_long("5 ", 0, 10, HPU_NUM_INVALID, 0);
	check_long("1.5", 0, 10, HPU_NUM_INVALID, 0);
	check_long("1e3", 0, 10000, HPU_NUM_INVALID, 0);
	check_long("0x10", 0, 100, HPU_NUM_INVALID, 0); /* base 10 only */
	/* junk after an overflowing number is junk first */
	check_long("99999999999999999999x", 0, 10, HPU_NUM_INVALID, 0);
}

static void test_int(void **state)
{
	(void)state;
	int out = 7;
	assert_int_equal(hpu__parse_int("2147483647", INT_MIN, INT_MAX, &out), HPU_NUM_OK);
	assert_int_equal(out, INT_MAX);
	assert_int_equal(hpu__parse_int("-2147483648", INT_MIN, INT_MAX, &out), HPU_NUM_OK);
	assert_int_equal(out, INT_MIN);
	out = 7;
	/* a long but not an int: out of range, never truncated */
	assert_int_equal(hpu__parse_int("2147483648", INT_MIN, INT_MAX, &out), HPU_NUM_RANGE);
	assert_int_equal(hpu__parse_int("4294967297", INT_MIN, INT_MAX, &out), HPU_NUM_RANGE);
	assert_int_equal(hpu__parse_int("65536", 1, 65535, &out), HPU_NUM_RANGE);
	assert_int_equal(hpu__parse_int("port", 1, 65535, &out), HPU_NUM_INVALID);
	assert_int_equal(out, 7);
}

static void test_u64(void **state)
{
	(void)state;
	check_u64("0", 0, UINT64_MAX, HPU_NUM_OK, 0);
	check_u64("18446744073709551615", 0, UINT64_MAX, HPU_NUM_OK, UINT64_MAX);
	check_u64("18446744073709551616", 0, UINT64_MAX, HPU_NUM_RANGE, 0);
	check_u64("+3", 0, 10, HPU_NUM_OK, 3);
	check_u64("11", 0, 10, HPU_NUM_RANGE, 0);
	check_u64("2", 3, 10, HPU_NUM_RANGE, 0);
	/* a sign on an unsigned number: strtoull would wrap -1 to 2^64-1 */
	check_u64("-1", 0, UINT64_MAX, HPU_NUM_RANGE, 0);
	check_u64(" -1", 0, UINT64_MAX, HPU_NUM_RANGE, 0);
	check_u64("-0", 0, UINT64_MAX, HPU_NUM_RANGE, 0);
	check_u64("-18446744073709551615", 0, UINT64_MAX, HPU_NUM_RANGE, 0);
	check_u64("-1x", 0, UINT64_MAX, HPU_NUM_INVALID, 0);
	check_u64("", 0, 10, HPU_NUM_INVALID, 0);
	check_u64("-", 0, 10, HPU_NUM_INVALID, 0);
	check_u64("1 ", 0, 10, HPU_NUM_INVALID, 0);
	check_u64(NULL, 0, 10, HPU_NUM_INVALID, 0);
}

static void test_u64_prefix(void **state)
{
	(void)state;
	const char *s = "17-22", *end = NULL;
	uint64_t v = 7;
	assert_int_equal(hpu__parse_u64_prefix(s, &end, &v), HPU_NUM_OK);
	assert_int_equal(v, 17);
	assert_ptr_equal(end, s + 2);
	s = "64K";
	assert_int_equal(hpu__parse_u64_prefix(s, &end, &v), HPU_NUM_OK);
	assert_int_equal(v, 64);
	assert_string_equal(end, "K");
	s = "123";
	assert_int_equal(hpu__parse_u64_prefix(s, &end, &v), HPU_NUM_OK);
	assert_int_equal(v, 123);
	assert_int_equal(*end, '\0');
	/* no digits: end stays at s */
	v = 7;
	s = "K";
	assert_int_equal(hpu__parse_u64_prefix(s, &end, &v), HPU_NUM_INVALID);
	assert_ptr_equal(end, s);
	assert_int_equal(v, 7);
	s = "99999999999999999999K";
	assert_int_equal(hpu__parse_u64_prefix(s, &end, &v), HPU_NUM_RANGE);
	assert_string_equal(end, "K");
	assert_int_equal(hpu__parse_u64_prefix("-5-6", &end, &v), HPU_NUM_RANGE);
	assert_int_equal(v, 7);
}

static void test_double(void **state)
{
	(void)state;
	check_double("0.5", 0, 1, HPU_NUM_OK, 0.5);
	check_double("1e-3", 0, 1, HPU_NUM_OK, 1e-3);
	check_double("-2.5", -10, 10, HPU_NUM_OK, -2.5);
	check_double(" 3", 0, 10, HPU_NUM_OK, 3);
	check_double("0", 0, 1, HPU_NUM_OK, 0);
	check_double("1", 0, 1, HPU_NUM_OK, 1);
	check_double("1.0000001", 0, 1, HPU_NUM_RANGE, 0);
	check_double("-0.1", 0, 1, HPU_NUM_RANGE, 0);
	/* overflow and underflow are refused, whatever the range */
	check_double("1e400", -INFINITY, INFINITY, HPU_NUM_RANGE, 0);
	check_double("-1e400", -INFINITY, INFINITY, HPU_NUM_RANGE, 0);
	check_double("1e-400", -1, 1, HPU_NUM_RANGE, 0);
	/* NaN is in no range; an infinity only in an infinite one */
	check_double("nan", -INFINITY, INFINITY, HPU_NUM_RANGE, 0);
	check_double("inf", 0, 1e300, HPU_NUM_RANGE, 0);
	check_double("inf", 0, INFINITY, HPU_NUM_OK, INFINITY);
	check_double("-inf", -INFINITY, 0, HPU_NUM_OK, -INFINITY);
	/* an exclusive lower bound 0: the smallest double above it */
	check_double("0", 4.9406564584124654e-324, INFINITY, HPU_NUM_RANGE, 0);
	check_double("300", 4.9406564584124654e-324, INFINITY, HPU_NUM_OK, 300);
	/* not numbers */
	check_double("", 0, 1, HPU_NUM_INVALID, 0);
	check_double("abc", 0, 1, HPU_NUM_INVALID, 0);
	check_double("0.1x", 0, 1, HPU_NUM_INVALID, 0);
	check_double("0.5 ", 0, 1, HPU_NUM_INVALID, 0);
	check_double(".", 0, 1, HPU_NUM_INVALID, 0);
	double out = 7;
	assert_int_equal(hpu__parse_double(NULL, 0, 1, &out), HPU_NUM_INVALID);
	assert_true(out == 7);
}

static void test_real(void **state)
{
	(void)state;
	double v = 7;
	assert_int_equal(hpu__parse_real("0.412345", &v), HPU_NUM_OK);
	assert_true(v == 0.412345);
	assert_int_equal(hpu__parse_real("-nan", &v), HPU_NUM_OK);
	assert_true(isnan(v));
	assert_int_equal(hpu__parse_real("inf", &v), HPU_NUM_OK);
	assert_true(isinf(v) && v > 0);
	assert_int_equal(hpu__parse_real("1e400", &v), HPU_NUM_OK); /* as strtod rounds it */
	assert_true(isinf(v));
	v = 7;
	assert_int_equal(hpu__parse_real("0.5x", &v), HPU_NUM_INVALID);
	assert_int_equal(hpu__parse_real("", &v), HPU_NUM_INVALID);
	assert_int_equal(hpu__parse_real(NULL, &v), HPU_NUM_INVALID);
	assert_true(v == 7);
}

/* A caller's errno survives a parse, failed or not. */
static void test_errno_kept(void **state)
{
	(void)state;
	long l;
	uint64_t u;
	double d;
	const char *end;
	errno = EACCES;
	assert_int_equal(hpu__parse_long("99999999999999999999", 0, 1, &l), HPU_NUM_RANGE);
	assert_int_equal(hpu__parse_u64("18446744073709551616", 0, UINT64_MAX, &u), HPU_NUM_RANGE);
	assert_int_equal(hpu__parse_u64_prefix("18446744073709551616", &end, &u), HPU_NUM_RANGE);
	assert_int_equal(hpu__parse_double("1e400", 0, 1, &d), HPU_NUM_RANGE);
	assert_int_equal(hpu__parse_real("1e400", &d), HPU_NUM_OK);
	assert_int_equal(hpu__parse_long("3", 0, 5, &l), HPU_NUM_OK);
	assert_int_equal(errno, EACCES);
}

/* Issue 39: a message's count agrees with its noun ("1 worker",
 * "0 workers", "2 workers"). */
static void test_plural(void **state)
{
	(void)state;
	char buf[64];
	snprintf(buf, sizeof buf, "%d worker%s, %d rank%s, %ld step%s", 1, hpu__plural(1), 2,
		 hpu__plural(2), 0L, hpu__plural(0));
	assert_string_equal(buf, "1 worker, 2 ranks, 0 steps");
	assert_string_equal(hpu__plural(-1), "s");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_long),
		cmocka_unit_test(test_int),
		cmocka_unit_test(test_u64),
		cmocka_unit_test(test_u64_prefix),
		cmocka_unit_test(test_double),
		cmocka_unit_test(test_real),
		cmocka_unit_test(test_errno_kept),
		cmocka_unit_test(test_plural),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
