/* Unit tests for the option parser (common/opt.c): long and short
 * options, "--name value" and "--name=value", flags, optional values,
 * positional arguments among the options, "--", a second table, and the
 * errors (unknown option, missing value, a value for a flag). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/opt.h"
#include "common/optdoc.h"

enum { OUTPUT = 1, TOP, ALL, PROFILE, HELP, LR = 100, NESTEROV };

static const hpu_optspec specs[] = {
	{"output", 'o', HPU_OPT_VALUE, OUTPUT, "FILE", .help = "where the *result* goes", .env = "OUT_FILE"},
	{"top", 0, HPU_OPT_VALUE, TOP, "N", .help = "-N or N: the first N of a_b <list>",
	 .section = "Selection"},
	{"all", 'a', HPU_OPT_FLAG, ALL, NULL, .help = "all of them, which is a long text that must be "
						       "wrapped at the 79th column of the help"},
	{"profile", 0, HPU_OPT_OPTIONAL, PROFILE, "DIR", .help = "profile"},
	{"help", 'h', HPU_OPT_FLAG, HELP, NULL, .help = NULL}, /* hidden */
	{"everything", 0, HPU_OPT_FLAG, ALL, .help = NULL},     /* --all's other name */
	{0},
};

static const hpu_optspec more[] = {
	{"lr", 0, HPU_OPT_VALUE, LR, .help = NULL},
	{"nesterov", 0, HPU_OPT_FLAG, NESTEROV, .help = NULL},
	{"all", 0, HPU_OPT_VALUE, 999, .help = NULL}, /* the first table wins */
	{0},
};

#define ARGV(...) ((char *[]){"prog", __VA_ARGS__, NULL})
#define ARGC(v) ((int)(sizeof(v) / sizeof(v[0])) - 1)

/* Reads argv to its end and writes what came back as "id:value " words
 * (P for a positional argument, E-N for error N, with its argument). */
static void trace(int argc, char **argv, const hpu_optspec *also, char *out, size_t n)
{
	hpu_optparse p;
	hpu__optparse_init(&p, argc, argv, specs);
	p.more = also;
	size_t len = 0;
	out[0] = 0;
	for (int r; (r = hpu__optparse_next(&p)) != HPU_OPT_END && len < n;) {
		if (r == HPU_OPT_POSITIONAL)
			len += (size_t)snprintf(out + len, n - len, "P:%s ", p.val);
		else if (r < 0)
			len += (size_t)snprintf(out + len, n - len, "E%d:%s ", -r, p.arg);
		else
			len += (size_t)snprintf(out + len, n - len, "%d:%s ", r, p.val ? p.val : "-");
		assert_ptr_equal(p.arg, p.argv[p.at]);
	}
}

#define EXPECT(want, ...)                                                  \
	do {                                                               \
		char *v_[] = {"prog", __VA_ARGS__, NULL}, got_[512];        \
		trace(ARGC(v_), v_, more, got_, sizeof got_);              \
		assert_string_equal(got_, want);                           \
	} while (0)

static void test_values(void **state)
{
	(void)state;
	EXPECT("1:f ", "--output", "f");
	EXPECT("1:f ", "--output=f");
	EXPECT("1:f ", "-o", "f");
	EXPECT("1: ", "--output=");       /* an empty value is a value */
	EXPECT("1:a=b ", "--output=a=b"); /* the first '=' splits */
	EXPECT("2:-1 ", "--top", "-1");   /* the next argument, whatever it is */
	EXPECT("2:--all ", "--top", "--all");
	EXPECT("100:0.1 101:- ", "--lr", "0.1", "--nesterov");
	EXPECT("3:- 3:- 5:- ", "--all", "-a", "-h");
}

static void test_positional(void **state)
{
	(void)state;
	EXPECT("P:a 3:- P:b 1:c P:d ", "a", "--all", "b", "-o", "c", "d");
	EXPECT("P:- ", "-");
	/* after "--" everything is positional, "--" too */
	EXPECT("3:- P:--all P:-o P:-- ", "--all", "--", "--all", "-o", "--");
	EXPECT("", "--");
}

static void test_optional(void **state)
{
	(void)state;
	/* no "=": no value; the caller decides about the next argument */
	EXPECT("4:- P:dir ", "--profile", "dir");
	EXPECT("4:d2 ", "--profile=d2");
	EXPECT("4: ", "--profile=");

	char *argv[] = {"prog", "--profile", "dir", "x", NULL};
	hpu_optparse p;
	hpu__optparse_init(&p, 4, argv, specs);
	assert_int_equal(hpu__optparse_next(&p), PROFILE);
	assert_null(p.val);
	assert_int_equal(p.ind, 2);
	p.val = p.argv[p.ind++]; /* taken */
	assert_int_equal(hpu__optparse_next(&p), HPU_OPT_POSITIONAL);
	assert_string_equal(p.val, "x");
	assert_int_equal(p.at, 3);
	assert_int_equal(hpu__optparse_next(&p), HPU_OPT_END);
	assert_int_equal(hpu__optparse_next(&p), HPU_OPT_END);
}

static void test_errors(void **state)
{
	(void)state;
	/* unknown: names match exactly, short options stand alone */
	EXPECT("E2:--frob ", "--frob");
	EXPECT("E2:--frob=3 ", "--frob=3");
	EXPECT("E2:--out ", "--out");
	EXPECT("E2:--outputx ", "--outputx");
	EXPECT("E2:--Output ", "--Output");
	EXPECT("E2:-x ", "-x");
	EXPECT("E2:-ofile ", "-ofile");
	EXPECT("E2:-o=file ", "-o=file");
	EXPECT("E2:-ah ", "-ah");
	EXPECT("E2:-output ", "-output");
	EXPECT("E2:--=x ", "--=x");
	EXPECT("E2:---all ", "---all");
	/* missing values */
	EXPECT("E3:--output ", "--output");
	EXPECT("E3:-o ", "-o");
	EXPECT("3:- E3:--lr ", "--all", "--lr");
	/* a flag given a value */
	EXPECT("E4:--all=1 ", "--all=1");
	EXPECT("E4:--nesterov= ", "--nesterov=");
	/* without the second table its options are unknown */
	char *argv[] = {"prog", "--lr", "1", NULL}, out[128];
	trace(3, argv, NULL, out, sizeof out);
	assert_string_equal(out, "E2:--lr P:1 ");
}

/* What the iterator says about an error, for the caller's message. */
static void test_error_fields(void **state)
{
	(void)state;
	char *argv[] = {"prog", "x", "--all=yes", "--top", NULL};
	hpu_optparse p;
	hpu__optparse_init(&p, 4, argv, specs);
	assert_int_equal(hpu__optparse_next(&p), HPU_OPT_POSITIONAL);
	assert_int_equal(p.at, 1);
	assert_null(p.spec);
	assert_int_equal(hpu__optparse_next(&p), HPU_OPT_UNWANTED);
	assert_string_equal(p.spec->name, "all");
	assert_string_equal(p.val, "yes");
	assert_int_equal(p.at, 2);
	assert_int_equal(hpu__optparse_next(&p), HPU_OPT_MISSING);
	assert_string_equal(p.spec->name, "top");
	assert_string_equal(p.arg, "--top");
	assert_null(p.val);
	assert_int_equal(hpu__optparse_next(&p), HPU_OPT_END);
	assert_null(p.arg);
	assert_int_equal(p.at, 4);
}

/* A caller that stops at the first positional argument (hpulaunch at the
 * model) finds it at argv[at]; the rest is untouched. */
static void test_stop_at_positional(void **state)
{
	(void)state;
	char *argv[] = {"prog", "--all", "--", "model.so", "--all", NULL};
	hpu_optparse p;
	hpu__optparse_init(&p, 5, argv, specs);
	assert_int_equal(hpu__optparse_next(&p), ALL);
	assert_int_equal(hpu__optparse_next(&p), HPU_OPT_POSITIONAL);
	assert_int_equal(p.at, 3);
	assert_int_equal(p.ind, 4);
	/* starting elsewhere than argv[1] */
	hpu__optparse_init(&p, 5, argv, specs);
	p.ind = 4;
	assert_int_equal(hpu__optparse_next(&p), ALL);
	assert_int_equal(hpu__optparse_next(&p), HPU_OPT_END);
}

/* The table printed in format how (col 16) into a string. */
static char *doc(int how)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	hpu__optdoc(f, specs, how, 16);
	fclose(f);
	return buf;
}

/* --help, scdoc and markdown from one table: values, short names, other
 * names on their option's line, hidden entries left out, the environment,
 * sections, wrapping at 79 columns, each format's escapes. */
static void test_doc(void **state)
{
	(void)state;
	char *h = doc(HPU_DOC_HELP);
	assert_string_equal(h,
		"  -o, --output FILE\n"
		"                where the *result* goes [OUT_FILE]\n"
		"\n"
		"Selection:\n"
		"  --top N       -N or N: the first N of a_b <list>\n"
		"  -a, --all, --everything\n"
		"                all of them, which is a long text that must be wrapped at the\n"
		"                79th column of the help\n"
		"  --profile [DIR]\n"
		"                profile\n");
	free(h);
	char *m = doc(HPU_DOC_SCDOC);
	assert_string_equal(m,
		"*-o*, *--output* _FILE_\n\twhere the \\*result\\* goes\n\n\tEnvironment: *OUT\\_FILE*\n\n"
		"## Selection\n\n"
		"*--top* _N_\n\t\\-N or N: the first N of a\\_b <list>\n\n"
		"*-a*, *--all*, *--everything*\n\tall of them, which is a long text that must be wrapped at "
		"the 79th column of the help\n\n"
		"*--profile* [_DIR_]\n\tprofile\n\n");
	free(m);
	char *md = doc(HPU_DOC_MARKDOWN);
	assert_string_equal(md,
		"- `-o, --output FILE`: where the \\*result\\* goes. Environment: `OUT_FILE`\n"
		"\n## Selection\n\n"
		"- `--top N`: -N or N: the first N of a\\_b \\<list>\n"
		"- `-a, --all, --everything`: all of them, which is a long text that must be wrapped at "
		"the 79th column of the help\n"
		"- `--profile [DIR]`: profile\n");
	free(md);
	assert_int_equal(hpu__optdoc_format("scdoc"), HPU_DOC_SCDOC);
	assert_int_equal(hpu__optdoc_format("markdown"), HPU_DOC_MARKDOWN);
	assert_int_equal(hpu__optdoc_format("man"), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_values),
		cmocka_unit_test(test_positional),
		cmocka_unit_test(test_optional),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_error_fields),
		cmocka_unit_test(test_stop_at_positional),
		cmocka_unit_test(test_doc),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
