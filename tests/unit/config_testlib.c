/* config_testlib: what test_config and test_config_file share. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/config_testlib.h"

static int count_args(char **argv)
{
	int n = 0;
	while (argv[n])
		n++;
	return n;
}

/* Parses argv (NULL-terminated, argv[0] the program) from index 1 into o;
 * returns hpu__opts_parse's result and leaves the stop index in *stop. */
int parse(hpu_train_opts *o, char **argv, int *stop, char *err,
		 size_t errlen)
{
	int i = 1;
	err[0] = 0;
	int rc = hpu__opts_parse(o, count_args(argv), argv, &i, err, errlen);
	*stop = i;
	return rc;
}

/* Asserts that parsing argv fails and that the message contains every
 * string in the NULL-terminated list `needles`. */
void expect_error(char **argv, const char *const *needles)
{
	hpu_train_opts o;
	char err[256];
	int stop;
	hpu__opts_defaults(&o);
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

/* Writes text to a new temporary file, with ' standing for " so that the
 * JSON in these tests reads easily; returns its path in path[64]. */
void write_temp(const char *text, char *path)
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
void load_ok(const char *json, hpu_train_opts *o)
{
	char path[64], err[512] = "";
	write_temp(json, path);
	hpu__opts_defaults(o);
	int rc = hpu__opts_load_file(o, path, err, sizeof(err));
	unlink(path);
	if (rc != 0)
		fail_msg("%s did not load: %s", json, err);
}

/* Asserts that json is refused with one line naming every needle, and
 * that the options are left as they were. */
void load_error(const char *json, const char *const *needles)
{
	char path[64], err[512] = "";
	hpu_train_opts o, d;
	write_temp(json, path);
	hpu__opts_defaults(&o);
	d = o;
	int rc = hpu__opts_load_file(&o, path, err, sizeof(err));
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

void set_ok(hpu_train_opts *o, const char *name, const char *v)
{
	char err[256];
	if (hpu__opts_set(o, name, v, err, sizeof(err)) != 0)
		fail_msg("--%s %s: %s", name, v, err);
}
