#include "tests/unit/args_testlib.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static int argc_of(char **argv)
{
	int n = 0;
	while (argv[n])
		n++;
	return n;
}

void parse_ok(hpu_launch_args *a, char **argv)
{
	char err[512] = "";
	int rc = hpu__args_parse(a, argc_of(argv), argv, err, sizeof err);
	if (rc != 0)
		fail_msg("hpu__args_parse: %s", err);
}

void parse_fails(char **argv, const char *needle)
{
	hpu_launch_args a;
	char err[512] = "";
	int rc = hpu__args_parse(&a, argc_of(argv), argv, err, sizeof err);
	printf("  -> %s\n", err);
	hpu__args_free(&a);
	assert_int_equal(rc, -1);
	if (!strstr(err, needle))
		fail_msg("error \"%s\" does not say \"%s\"", err, needle);
}

static const char *const cleared[] = {
	"MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "WORLD_SIZE", "HPU_JOB_ID",
	"HPU_JOB_TOKEN", "HPUCOLL_TRANSPORT", "HPU_KEY_FILE", "SLURM_JOB_ID",
	"SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID", NULL};

int args_clean_env(void **state)
{
	(void)state;
	for (int i = 0; cleared[i]; i++)
		unsetenv(cleared[i]);
	return 0;
}
