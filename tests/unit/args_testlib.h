/* args_testlib: hpulaunch's argument parsing driven from unit tests
 * (test_hostfile, test_slurm, test_restart). */
#ifndef HPU_ARGS_TESTLIB_H
#define HPU_ARGS_TESTLIB_H

#include "launcher/args.h"

/* A NULL-terminated argv with "hpulaunch" as argv[0]. */
#define ARGV(...) ((char *[]){"hpulaunch", __VA_ARGS__, NULL})

/* A cmocka setup: unsets the launcher's environment variables (MASTER_*,
 * NODE_RANK, WORLD_SIZE, HPU_JOB_*, Slurm's, ...) so that only the test's
 * arguments count. */
int args_clean_env(void **state);

/* hpu__args_parse must succeed (else the test fails with its error). */
void parse_ok(hpu_launch_args *a, char **argv);

/* hpu__args_parse must fail with an error containing `needle`. */
void parse_fails(char **argv, const char *needle);

#endif
