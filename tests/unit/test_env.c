/* Unit tests for the environment table (common/env.c): every id has a
 * complete entry with a name of its own, a lookup by name finds exactly
 * the table's names, the accessors read the variable (and a number in
 * range), and --help-env's printout lists them all. tests/check_env.sh
 * checks the table against the sources, docs/configuration.md and
 * hpulaunch. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/env.h"

static int is_name(const char *s)
{
	if (!*s || (*s >= '0' && *s <= '9'))
		return 0;
	for (; *s; s++)
		if (!((*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_'))
			return 0;
	return 1;
}

static void test_table_complete(void **state)
{
	(void)state;
	for (int i = 0; i < HPU_ENV_COUNT; i++) {
		const hpu_env_var *v = hpu__env_var_of(i);
		if (!v->name || !is_name(v->name))
			fail_msg("id %d: no name, or not a variable's name", i);
		if (!v->dflt || !v->who || !*v->who || !v->what || !*v->what)
			fail_msg("%s: the entry lacks a default, its readers or a description", v->name);
		assert_string_equal(hpu__env_name(i), v->name);
		/* the name leads back to the id: no two entries share one */
		assert_int_equal(hpu__env_find(v->name), i);
	}
}

/* Names that tools and models outside ours rely on (torchrun's, Slurm's). */
static void test_launch_names(void **state)
{
	(void)state;
	static const struct {
		hpu_env_id id;
		const char *name;
	} want[] = {
		{HPU_ENV_RANK, "RANK"},
		{HPU_ENV_LOCAL_RANK, "LOCAL_RANK"},
		{HPU_ENV_WORLD_SIZE, "WORLD_SIZE"},
		{HPU_ENV_LOCAL_WORLD_SIZE, "LOCAL_WORLD_SIZE"},
		{HPU_ENV_NODE_RANK, "NODE_RANK"},
		{HPU_ENV_NNODES, "NNODES"},
		{HPU_ENV_MASTER_ADDR, "MASTER_ADDR"},
		{HPU_ENV_MASTER_PORT, "MASTER_PORT"},
		{HPU_ENV_HPU_JOB_ID, "HPU_JOB_ID"},
		{HPU_ENV_HPU_JOB_TOKEN, "HPU_JOB_TOKEN"},
		{HPU_ENV_HPU_STATUS_FD, "HPU_STATUS_FD"},
		{HPU_ENV_HPU_RESTART_COUNT, "HPU_RESTART_COUNT"},
		{HPU_ENV_SLURM_JOB_NODELIST, "SLURM_JOB_NODELIST"},
	};
	for (size_t i = 0; i < sizeof want / sizeof *want; i++)
		assert_string_equal(hpu__env_name(want[i].id), want[i].name);
}

static void test_find_refuses_others(void **state)
{
	(void)state;
	assert_int_equal(hpu__env_find("RANK"), HPU_ENV_RANK);
	assert_int_equal(hpu__env_find("RANK=3"), HPU_ENV_RANK);
	assert_int_equal(hpu__env_find("RANK="), HPU_ENV_RANK);
	assert_int_equal(hpu__env_find("HPUCOLL_TIMEOUT_MS=5"), HPU_ENV_HPUCOLL_TIMEOUT_MS);
	static const char *const no[] = {"NOT_A_VARIABLE", "RAN", "RANKS", "RANK_", "rank",
					 "", "=RANK", "HPU_JOB", "HPUCOLL_TIMEOUT", "HOME"};
	for (size_t i = 0; i < sizeof no / sizeof *no; i++)
		if (hpu__env_find(no[i]) != -1)
			fail_msg("'%s' is not in the table, yet found", no[i]);
}

static void test_in(void **state)
{
	(void)state;
	const hpu_env_id list[] = {HPU_ENV_LOWER_LIST, HPU_ENV_FP32_LIST, HPU_ENV_COUNT};
	assert_true(hpu__env_in(HPU_ENV_LOWER_LIST, list));
	assert_true(hpu__env_in(HPU_ENV_FP32_LIST, list));
	assert_false(hpu__env_in(HPU_ENV_QUANT_CONFIG, list));
	assert_false(hpu__env_in(HPU_ENV_RANK, (const hpu_env_id[]){HPU_ENV_COUNT}));
}

static void test_str(void **state)
{
	(void)state;
	unsetenv("HPU_JOB_ID");
	assert_null(hpu__env_str(HPU_ENV_HPU_JOB_ID));
	setenv("HPU_JOB_ID", "job-7", 1);
	assert_string_equal(hpu__env_str(HPU_ENV_HPU_JOB_ID), "job-7");
	setenv("HPU_JOB_ID", "", 1);
	assert_string_equal(hpu__env_str(HPU_ENV_HPU_JOB_ID), "");
	unsetenv("HPU_JOB_ID");
}

/* hpu__env_long on HPUCOLL_IO_THREADS set to v (NULL: unset), range 1..64:
 * its return value, and *out (which starts at -5). */
static int read_long(const char *v, long *out)
{
	if (v)
		setenv("HPUCOLL_IO_THREADS", v, 1);
	else
		unsetenv("HPUCOLL_IO_THREADS");
	*out = -5;
	errno = 0;
	int r = hpu__env_long(HPU_ENV_HPUCOLL_IO_THREADS, 1, 64, out);
	unsetenv("HPUCOLL_IO_THREADS");
	return r;
}

static void test_long(void **state)
{
	(void)state;
	long x;
	assert_int_equal(read_long(NULL, &x), 0);
	assert_int_equal(x, -5);
	assert_int_equal(read_long("", &x), 0);
	assert_int_equal(x, -5);
	assert_int_equal(read_long("8", &x), 1);
	assert_int_equal(x, 8);
	assert_int_equal(read_long("1", &x), 1);
	assert_int_equal(x, 1);
	assert_int_equal(read_long("64", &x), 1);
	assert_int_equal(x, 64);
	assert_int_equal(read_long(" +7", &x), 1); /* as strtol reads it */
	assert_int_equal(x, 7);
	static const struct {
		const char *v;
		int err;
	} bad[] = {{"0", ERANGE}, {"65", ERANGE}, {"-1", ERANGE},
		   {"99999999999999999999", ERANGE}, {"8x", EINVAL}, {"x", EINVAL},
		   {" ", EINVAL}, {"8 ", EINVAL}, {"0x10", EINVAL}};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		if (read_long(bad[i].v, &x) != -1 || errno != bad[i].err)
			fail_msg("HPUCOLL_IO_THREADS='%s' read as %ld (errno %d), not refused with %s",
				 bad[i].v, x, errno, bad[i].err == ERANGE ? "ERANGE" : "EINVAL");
		assert_int_equal(x, -5);
	}
}

/* text with each "\n" + 6 spaces (a description's line break) a space. */
static void unwrap(char *text)
{
	char *w = text;
	for (const char *r = text; *r;)
		if (!strncmp(r, "\n      ", 7)) {
			*w++ = ' ';
			r += 7;
		} else {
			*w++ = *r++;
		}
	*w = '\0';
}

static void test_print(void **state)
{
	(void)state;
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	assert_non_null(f);
	hpu__env_print(f);
	fclose(f);
	/* descriptions are wrapped at 78 columns, at spaces */
	for (char *line = text, *nl; (nl = strchr(line, '\n')); line = nl + 1)
		if (!strncmp(line, "      ", 6) && nl - line > 78 && memchr(line + 6, ' ', (size_t)(nl - line - 6)))
			fail_msg("a line of %d columns: %.*s", (int)(nl - line), (int)(nl - line), line);
	char *flat = strdup(text);
	assert_non_null(flat);
	unwrap(flat);
	for (int i = 0; i < HPU_ENV_COUNT; i++) {
		const hpu_env_var *v = hpu__env_var_of(i);
		char line[256];
		if (*v->dflt)
			snprintf(line, sizeof line, "\n  %s (%s): %s\n", v->name, v->dflt, v->who);
		else
			snprintf(line, sizeof line, "\n  %s: %s\n", v->name, v->who);
		if (!strstr(text, line) || !strstr(flat, v->what))
			fail_msg("the printout lacks %s or its description:\n%s", v->name, text);
	}
	assert_non_null(strstr(text, "\n  HPUCOLL_TIMEOUT_MS (60000): libhpucoll\n"));
	free(flat);
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table_complete),
		cmocka_unit_test(test_launch_names),
		cmocka_unit_test(test_find_refuses_others),
		cmocka_unit_test(test_in),
		cmocka_unit_test(test_str),
		cmocka_unit_test(test_long),
		cmocka_unit_test(test_print),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
