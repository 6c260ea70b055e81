/* Unit tests for Slurm support (launcher/slurm.c): hostlist expansion
 * (ranges, zero padding, several brackets, errors), reading a job step's
 * environment, and how hpu__args_parse maps it: node rank, nodes, master
 * address and port, job id and token, with flags beating the environment
 * beating Slurm, one hpulaunch per node enforced, and nothing changed
 * outside an srun step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/args_testlib.h"

#include "launcher/args.h"
#include "launcher/slurm.h"

extern char **environ;

static char model[64];

/* ---- hostlist expansion ---- */

/* Expands list and compares with the space-separated names in want. */
static void expands_to(const char *list, const char *want)
{
	char **hosts, err[256] = "", joined[4096] = "";
	int n;
	if (hpu__slurm_hostlist_expand(list, &hosts, &n, err, sizeof err) != 0)
		fail_msg("'%s' refused: %s", list, err);
	for (int i = 0; i < n; i++) {
		strcat(joined, i ? " " : "");
		strcat(joined, hosts[i]);
	}
	printf("  %-40s -> %s\n", list, joined);
	assert_string_equal(joined, want);
	hpu__slurm_hostlist_free(hosts, n);
}

static void refused(const char *list, const char *needle)
{
	char **hosts = (char **)1, err[256] = "";
	int n = -1;
	int rc = hpu__slurm_hostlist_expand(list, &hosts, &n, err, sizeof err);
	printf("  %-40s -> %s\n", list, err);
	assert_int_equal(rc, -1);
	assert_null(hosts);
	assert_int_equal(n, 0);
	if (!strstr(err, needle))
		fail_msg("error \"%s\" does not say \"%s\"", err, needle);
}

static void test_hostlist(void **state)
{
	(void)state;
	expands_to("node1", "node1");
	expands_to("a,b,c", "a b c");
	expands_to(" a, b  c\n", "a b c");
	expands_to("node[1-3]", "node1 node2 node3");
	expands_to("node[01-03,07],gpu-a,rack[1-2]-n[3-4]",
		   "node01 node02 node03 node07 gpu-a rack1-n3 rack1-n4 rack2-n3 rack2-n4");
	expands_to("n[8-11]", "n8 n9 n10 n11");
	expands_to("n[08-11]", "n08 n09 n10 n11");
	expands_to("n[098-101]", "n098 n099 n100 n101");
	expands_to("n[007]", "n007");
	expands_to("n[1,3,5-6]x", "n1x n3x n5x n6x");
	expands_to("c[1-2]s[0-1]n[5]", "c1s0n5 c1s1n5 c2s0n5 c2s1n5");
	expands_to("[1-2]", "1 2");
	expands_to("10.0.0.[1-2]", "10.0.0.1 10.0.0.2");
	expands_to("a[1-2],b[01-02]", "a1 a2 b01 b02");
}

static void test_hostlist_large(void **state)
{
	(void)state;
	char **hosts, err[256];
	int n;
	assert_int_equal(hpu__slurm_hostlist_expand("n[00000-65535]", &hosts, &n, err, sizeof err), 0);
	assert_int_equal(n, 65536);
	assert_string_equal(hosts[0], "n00000");
	assert_string_equal(hosts[65535], "n65535");
	hpu__slurm_hostlist_free(hosts, n);
	hpu__slurm_hostlist_free(NULL, 0);
}

static void test_hostlist_errors(void **state)
{
	(void)state;
	refused("", "names no hosts");
	refused(" , ,", "names no hosts");
	refused("n[1-3", "unbalanced '['");
	refused("n1-3]", "unbalanced ']'");
	refused("n]1[", "unbalanced ']'");
	refused("n[[1]]", "unbalanced '['");
	refused("n[3-1]", "bad range '[3-1]'");
	refused("n[]", "bad range '[]'");
	refused("n[a-b]", "bad range '[a-b]'");
	refused("n[1-]", "bad range '[1-]'");
	refused("n[1-2-3]", "bad range '[1-2-3]'");
	refused("n[1,,2]", "bad range '[1,,2]'");
	refused("n[-1]", "bad range '[-1]'");
	refused("n[1234567890]", "bad range");
	refused("n[0-65536]", "more than 65536 hosts");
	refused("a[0-300]b[0-300]", "more than 65536 hosts");
	char longname[300];
	memset(longname, 'x', 256);
	longname[256] = 0;
	refused(longname, "longer than 255 characters");
	memset(longname, 'x', 253);
	strcpy(longname + 253, "[1-100]");
	refused(longname, "longer than 255 characters");
}

/* ---- the environment ---- */

/* Clears everything Slurm or a user may have set, so that the tests run
 * the same inside a Slurm job. */
static int clean_env(void **state)
{
	(void)state;
	static const char *const keep_out[] = {
		"MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "WORLD_SIZE", "HPU_JOB_ID",
		"HPU_JOB_TOKEN", "HPUCOLL_TRANSPORT", "HPU_KEY_FILE", NULL};
	for (int i = 0; keep_out[i]; i++)
		unsetenv(keep_out[i]);
	for (int again = 1; again;) {
		again = 0;
		for (char **e = environ; *e; e++)
			if (!strncmp(*e, "SLURM_", 6)) {
				char name[128];
				size_t n = strcspn(*e, "=");
				snprintf(name, sizeof name, "%.*s", (int)(n < 127 ? n : 127), *e);
				unsetenv(name);
				again = 1;
				break;
			}
	}
	return 0;
}

/* The environment of task `procid` of `srun -N<nodes> --ntasks-per-node=1`
 * in job 123456 on node[01-02] (or more nodes). */
static void srun_env(int procid, int nodes)
{
	char v[32];
	setenv("SLURM_JOB_ID", "123456", 1);
	setenv("SLURM_JOBID", "123456", 1);
	setenv("SLURM_STEP_ID", "0", 1);
	snprintf(v, sizeof v, "%d", procid);
	setenv("SLURM_PROCID", v, 1);
	setenv("SLURM_NODEID", v, 1);
	setenv("SLURM_LOCALID", "0", 1);
	snprintf(v, sizeof v, "%d", nodes);
	setenv("SLURM_NNODES", v, 1);
	setenv("SLURM_NTASKS", v, 1);
	snprintf(v, sizeof v, "node[01-%02d]", nodes);
	setenv("SLURM_JOB_NODELIST", v, 1);
	setenv("SLURM_NODELIST", v, 1);
}

static void test_read(void **state)
{
	(void)state;
	hpu_slurm s;
	char err[256] = "";
	assert_int_equal(hpu__slurm_read(&s, err, sizeof err), 0);
	assert_int_equal(s.present, 0);

	srun_env(1, 2);
	assert_int_equal(hpu__slurm_read(&s, err, sizeof err), 0);
	assert_int_equal(s.present, 1);
	assert_int_equal(s.job_id, 123456);
	assert_int_equal(s.step_id, 0);
	assert_int_equal(s.procid, 1);
	assert_int_equal(s.nodeid, 1);
	assert_int_equal(s.nnodes, 2);
	assert_int_equal(s.ntasks, 2);
	assert_string_equal(s.first_host, "node01");

	/* A step on part of the allocation: the step's variables win. */
	setenv("SLURM_JOB_NODELIST", "node[01-08]", 1);
	setenv("SLURM_STEP_NODELIST", "node[05-06]", 1);
	setenv("SLURM_STEP_NUM_NODES", "2", 1);
	setenv("SLURM_STEP_NUM_TASKS", "2", 1);
	setenv("SLURM_NNODES", "8", 1);
	setenv("SLURM_NTASKS", "8", 1);
	assert_int_equal(hpu__slurm_read(&s, err, sizeof err), 0);
	assert_string_equal(s.first_host, "node05");
	assert_int_equal(s.nnodes, 2);
	assert_int_equal(s.ntasks, 2);

	/* Without counts: the node list's length; without NODEID: -1. */
	clean_env(NULL);
	setenv("SLURM_JOB_ID", "77", 1);
	setenv("SLURM_STEP_ID", "3", 1);
	setenv("SLURM_PROCID", "0", 1);
	setenv("SLURM_JOB_NODELIST", "gpu-a,gpu-b,gpu-c", 1);
	assert_int_equal(hpu__slurm_read(&s, err, sizeof err), 0);
	assert_int_equal(s.present, 1);
	assert_int_equal(s.nnodes, 3);
	assert_int_equal(s.ntasks, 0);
	assert_int_equal(s.nodeid, -1);
	assert_string_equal(s.first_host, "gpu-a");
}

/* A batch script, an salloc shell or the interactive step: not an srun
 * step, so Slurm is not used. */
static void test_not_a_step(void **state)
{
	(void)state;
	hpu_slurm s;
	char err[256];
	srun_env(0, 2);
	unsetenv("SLURM_STEP_ID");
	assert_int_equal(hpu__slurm_read(&s, err, sizeof err), 0);
	assert_int_equal(s.present, 0);
	const char *special[] = {"4294967290", "4294967291", "4294967292", "4294967294", "-5", "batch"};
	for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
		setenv("SLURM_STEP_ID", special[i], 1);
		assert_int_equal(hpu__slurm_read(&s, err, sizeof err), 0);
		assert_int_equal(s.present, 0);
	}
	setenv("SLURM_STEPID", "2", 1); /* the old name still counts */
	assert_int_equal(hpu__slurm_read(&s, err, sizeof err), 0);
	assert_int_equal(s.present, 0); /* SLURM_STEP_ID, set, wins */
	unsetenv("SLURM_STEP_ID");
	assert_int_equal(hpu__slurm_read(&s, err, sizeof err), 0);
	assert_int_equal(s.present, 1);
}

static void read_fails(const char *needle)
{
	hpu_slurm s;
	char err[256] = "";
	assert_int_equal(hpu__slurm_read(&s, err, sizeof err), -1);
	printf("  -> %s\n", err);
	if (!strstr(err, needle))
		fail_msg("error \"%s\" does not say \"%s\"", err, needle);
}

static void test_read_errors(void **state)
{
	(void)state;
	srun_env(0, 2);
	unsetenv("SLURM_PROCID");
	read_fails("SLURM_PROCID is not set in Slurm job step 123456.0");
	srun_env(0, 2);
	setenv("SLURM_PROCID", "x", 1);
	read_fails("SLURM_PROCID='x' from Slurm is not a number");
	srun_env(0, 2);
	setenv("SLURM_NNODES", "0", 1);
	read_fails("SLURM_NNODES='0' from Slurm is not a number 1..");
	srun_env(0, 2);
	setenv("SLURM_JOB_ID", "12a", 1);
	read_fails("SLURM_JOB_ID='12a'");
	srun_env(0, 2);
	unsetenv("SLURM_JOB_NODELIST");
	unsetenv("SLURM_NODELIST");
	read_fails("SLURM_JOB_NODELIST is not set");
	srun_env(0, 2);
	setenv("SLURM_JOB_NODELIST", "node[1-", 1);
	unsetenv("SLURM_NODELIST");
	read_fails("SLURM_JOB_NODELIST='node[1-': unbalanced '['");
}

static void test_port_and_token(void **state)
{
	(void)state;
	assert_int_equal(hpu__slurm_master_port(123456), 23456);
	assert_int_equal(hpu__slurm_master_port(20000), 20000);
	assert_int_equal(hpu__slurm_master_port(19999), 39999);
	char tok[65];
	hpu__slurm_token(123456, tok);
	/* printf 'hputrain-slurm-123456' | sha256sum */
	assert_string_equal(tok, "dc08e47f9f837b14922d19ca0f10ea72ef8230a89b8b821c56569d2697fdba7b");
}

/* ---- through hpu__args_parse ---- */


static void test_args_mapping(void **state)
{
	(void)state;
	hpu_launch_args a;
	for (int procid = 0; procid < 2; procid++) {
		srun_env(procid, 2);
		parse_ok(&a, ARGV("--devices", "8", model));
		assert_int_equal(a.from_slurm, 1);
		assert_int_equal(a.nodes, 2);
		assert_int_equal(a.devices, 8);
		assert_int_equal(a.node_rank, procid);
		assert_string_equal(a.master_addr, "node01");
		assert_int_equal(a.master_port, 23456);
		assert_string_equal(a.job_id, "slurm-123456");
		assert_string_equal(a.token, "dc08e47f9f837b14922d19ca0f10ea72ef8230a89b8b821c56569d2697fdba7b");
		assert_int_equal(a.weak_token, 1);
		hpu__args_free(&a);
	}
	/* With HPU_JOB_TOKEN exported before srun. */
	setenv("HPU_JOB_TOKEN", "0123abcd", 1);
	parse_ok(&a, ARGV("--devices", "8", model));
	assert_string_equal(a.token, "0123abcd");
	assert_int_equal(a.weak_token, 0);
	hpu__args_free(&a);
	/* NTASKS absent: NNODES. */
	unsetenv("SLURM_NTASKS");
	srun_env(2, 4);
	unsetenv("SLURM_NTASKS");
	parse_ok(&a, ARGV("--devices", "2", "--exec", "/bin/true"));
	assert_int_equal(a.nodes, 4);
	assert_int_equal(a.node_rank, 2);
	assert_string_equal(a.master_addr, "node01");
	hpu__args_free(&a);
	/* SLURM_NODEID absent: SLURM_PROCID. */
	unsetenv("SLURM_NODEID");
	parse_ok(&a, ARGV("--exec", "/bin/true"));
	assert_int_equal(a.node_rank, 2);
	hpu__args_free(&a);
}

static void test_args_precedence(void **state)
{
	(void)state;
	hpu_launch_args a;
	srun_env(1, 2);
	setenv("MASTER_ADDR", "10.0.0.1", 1);
	setenv("MASTER_PORT", "29500", 1);
	setenv("HPU_JOB_ID", "myjob", 1);
	setenv("HPU_JOB_TOKEN", "tok", 1);
	parse_ok(&a, ARGV(model));
	assert_string_equal(a.master_addr, "10.0.0.1"); /* environment beats Slurm */
	assert_int_equal(a.master_port, 29500);
	assert_string_equal(a.job_id, "myjob");
	assert_string_equal(a.token, "tok");
	assert_int_equal(a.node_rank, 1);
	assert_int_equal(a.nodes, 2);
	hpu__args_free(&a);

	setenv("NODE_RANK", "0", 1);
	parse_ok(&a, ARGV(model));
	assert_int_equal(a.node_rank, 0); /* NODE_RANK beats SLURM_PROCID */
	hpu__args_free(&a);

	/* Flags beat both. */
	setenv("NODE_RANK", "1", 1);
	parse_ok(&a, ARGV("--node-rank", "0", "--master-addr", "head", "--master-port", "30001",
			  "--job-id", "flagjob", model));
	assert_int_equal(a.node_rank, 0);
	assert_string_equal(a.master_addr, "head");
	assert_int_equal(a.master_port, 30001);
	assert_string_equal(a.job_id, "flagjob");
	assert_int_equal(a.nodes, 2);
	hpu__args_free(&a);

	/* --nodes from a flag: Slurm still gives the rest. */
	clean_env(NULL);
	srun_env(1, 2);
	parse_ok(&a, ARGV("--nodes", "4", model));
	assert_int_equal(a.nodes, 4);
	assert_int_equal(a.node_rank, 1);
	assert_int_equal(a.master_port, 23456);
	assert_string_equal(a.master_addr, "node01");
	hpu__args_free(&a);

	/* WORLD_SIZE is checked against Slurm's nodes. */
	setenv("WORLD_SIZE", "16", 1);
	parse_ok(&a, ARGV("--devices", "8", model));
	hpu__args_free(&a);
	parse_fails(ARGV("--devices", "4", model),
		    "WORLD_SIZE=16 from the environment does not equal --nodes 2 x --devices 4 = 8");
}

static void test_args_one_launcher_per_node(void **state)
{
	(void)state;
	srun_env(3, 2);
	setenv("SLURM_NTASKS", "4", 1); /* srun -N2 -n4 */
	parse_fails(ARGV("--devices", "2", model),
		    "Slurm started 4 tasks on 2 nodes, but hpulaunch runs once per node and starts the workers itself: use srun --ntasks-per-node=1");
	setenv("SLURM_STEP_NUM_TASKS", "16", 1); /* the step's count wins */
	setenv("SLURM_NTASKS", "2", 1);
	parse_fails(ARGV(model), "Slurm started 16 tasks on 2 nodes");
	parse_fails(ARGV("--nodes", "2", model), "Slurm started 16 tasks");
	/* Issue 39: one node is "1 node", not "1 nodes". */
	srun_env(0, 1);
	setenv("SLURM_STEP_NUM_TASKS", "2", 1);
	parse_fails(ARGV(model), "Slurm started 2 tasks on 1 node, but hpulaunch runs once per node");
	srun_env(3, 2);
	setenv("SLURM_STEP_NUM_TASKS", "16", 1);
	/* Given both node rank and nodes, the user placed the launchers. */
	hpu_launch_args a;
	parse_ok(&a, ARGV("--nodes", "16", "--node-rank", "3", model));
	assert_int_equal(a.nodes, 16);
	assert_int_equal(a.node_rank, 3);
	assert_string_equal(a.master_addr, "node01");
	hpu__args_free(&a);
	/* A node rank out of range is caught as before. */
	clean_env(NULL);
	srun_env(1, 2);
	parse_fails(ARGV("--nodes", "1", model), "--node-rank 1 is not below --nodes 1");
	/* Bad Slurm values name the variable. */
	setenv("SLURM_PROCID", "-1", 1);
	parse_fails(ARGV(model), "SLURM_PROCID='-1' from Slurm");
}

/* Outside Slurm, in a batch script and in a single-node step, everything
 * stays as it was: loopback, a free port, a random token. */
static void test_args_unchanged(void **state)
{
	(void)state;
	hpu_launch_args a;
	for (int mode = 0; mode < 3; mode++) {
		clean_env(NULL);
		if (mode == 1) { /* sbatch script: no job step */
			srun_env(0, 2);
			unsetenv("SLURM_STEP_ID");
		} else if (mode == 2) { /* srun -N1 */
			srun_env(0, 1);
		}
		parse_ok(&a, ARGV("--devices", "2", model));
		assert_int_equal(a.nodes, 1);
		assert_int_equal(a.node_rank, 0);
		assert_string_equal(a.master_addr, "127.0.0.1");
		assert_int_equal(a.master_port, 0);
		assert_int_equal((int)strlen(a.token), 64);
		assert_int_equal(a.weak_token, 0);
		assert_int_equal(a.from_slurm, mode == 2);
		if (mode == 2)
			assert_string_equal(a.job_id, "slurm-123456");
		else
			assert_memory_equal(a.job_id, "job-", 4);
		hpu__args_free(&a);
	}
	/* A multi-node job outside Slurm still needs its port and token. */
	clean_env(NULL);
	parse_fails(ARGV("--nodes", "2", model), "--nodes 2 needs --master-port");
	parse_fails(ARGV("--nodes", "2", "--master-port", "29500", model),
		    "--nodes 2 needs HPU_JOB_TOKEN");
}

/* --hostfile ignores Slurm: the file says where the nodes are. */
static void test_args_hostfile_beats_slurm(void **state)
{
	(void)state;
	char hosts[64];
	strcpy(hosts, "/tmp/hpu-test-shosts-XXXXXX");
	int fd = mkstemp(hosts);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "h1 slots=2\nh2 slots=2\nh3 slots=2\nh4 slots=2\n", 44), 44);
	close(fd);
	srun_env(1, 2);
	hpu_launch_args a;
	parse_ok(&a, ARGV("--hostfile", hosts, model));
	assert_int_equal(a.nodes, 4);
	assert_int_equal(a.node_rank, 0);
	assert_string_equal(a.master_addr, "h1");
	assert_int_equal(a.from_slurm, 0);
	hpu__args_free(&a);
	unlink(hosts);
}

static int group_setup(void **state)
{
	(void)state;
	strcpy(model, "/tmp/hpu-test-model-XXXXXX");
	int fd = mkstemp(model);
	if (fd < 0)
		return -1;
	close(fd);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	unlink(model);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hostlist),
		cmocka_unit_test(test_hostlist_large),
		cmocka_unit_test(test_hostlist_errors),
		cmocka_unit_test(test_port_and_token),
		cmocka_unit_test_setup(test_read, clean_env),
		cmocka_unit_test_setup(test_not_a_step, clean_env),
		cmocka_unit_test_setup(test_read_errors, clean_env),
		cmocka_unit_test_setup(test_args_mapping, clean_env),
		cmocka_unit_test_setup(test_args_precedence, clean_env),
		cmocka_unit_test_setup(test_args_one_launcher_per_node, clean_env),
		cmocka_unit_test_setup(test_args_unchanged, clean_env),
		cmocka_unit_test_setup(test_args_hostfile_beats_slurm, clean_env),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
