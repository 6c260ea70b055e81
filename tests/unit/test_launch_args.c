/* hpulaunch's command line (launcher/args.c), issue 39: hpulaunch's own
 * options after the model are refused (they would reach the model);
 * DeepSpeed's launcher flags are aliases (--num_gpus, --num_nodes,
 * --master_addr, --master_port, --include/--exclude over a hostfile);
 * an unknown flag gets "did you mean"; --resume must name a checkpoint
 * before the workers start. (test_launch_refusals runs the same refusals
 * through the hpulaunch binary.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/args_testlib.h"

#include "launcher/args.h"

static char dir[64], model[128], hostfile[128];

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static int setup(void **state)
{
	snprintf(dir, sizeof dir, "/tmp/test_launch_args.XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(model, sizeof model, "%s/model.so", dir);
	snprintf(hostfile, sizeof hostfile, "%s/hosts", dir);
	write_file(model, "a model\n");
	write_file(hostfile, "alpha slots=2\nbeta slots=2\ngamma slots=2\n");
	return args_clean_env(state);
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	return system(cmd);
}

/* The worker's arguments end with the n strings of tail. */
static void argv_ends(const hpu_launch_args *a, const char *const *tail, int n)
{
	assert_true(a->worker_argc >= n);
	for (int k = 0; k < n; k++)
		assert_string_equal(a->worker_argv[a->worker_argc - n + k], tail[k]);
}

static void test_options_after_model(void **state)
{
	(void)state;
	parse_fails(ARGV("--devices", "2", model, "--max-steps", "10", "--lr", "0.1"),
		    "hpulaunch's option --max-steps comes after the model");
	parse_fails(ARGV(model, "--lr=0.1"), "put it before the model, or after -- to hand it to the model");
	parse_fails(ARGV(model, "--data", "d", "--devices", "2", "--", "--hidden", "8"),
		    "option --devices comes after the model");
	/* short ones too (-q started the job and the model failed on it) */
	parse_fails(ARGV("--max-steps", "1", model, "-q"),
		    "hpulaunch's option -q (--quiet) comes after the model");
	parse_fails(ARGV(model, "-h"), "option -h (--help) comes after the model");
	/* after --, the model's; arguments that are not hpulaunch's pass */
	hpu_launch_args a;
	parse_ok(&a, ARGV("--max-steps", "10", model, "--", "--lr", "0.1"));
	argv_ends(&a, (const char *[]){"--", "--lr", "0.1"}, 3);
	assert_int_equal(a.train.max_steps, 10);
	hpu__args_free(&a);
	/* the user's "--" among the model's arguments goes: the worker's
	 * own follows the model (one after some of them reached the model,
	 * "unknown model argument --") */
	parse_ok(&a, ARGV(model, "--data", "/d", "--", "--hidden", "8"));
	argv_ends(&a, (const char *[]){model, "--", "--data", "/d", "--hidden", "8"}, 6);
	hpu__args_free(&a);
	/* --profile's optional DIR takes a model named without .so: said */
	char plain[] = "/tmp/hpu-test-model-XXXXXX";
	int pfd = mkstemp(plain);
	assert_true(pfd >= 0);
	close(pfd);
	parse_fails(ARGV("--profile", plain), "--profile took '");
	unlink(plain);
	/* training options before --exec: noted (main.c), not forwarded */
	parse_ok(&a, ARGV("--lr", "5", "--max-steps", "1", "--exec", "echo", "hi"));
	assert_non_null(a.exec_ignored);
	assert_string_equal(a.exec_ignored, "--lr");
	argv_ends(&a, (const char *[]){"echo", "hi"}, 2);
	assert_int_equal(a.worker_argc, 2);
	hpu__args_free(&a);
	parse_ok(&a, ARGV("--devices", "2", "--exec", "echo"));
	assert_null(a.exec_ignored);
	hpu__args_free(&a);
}

/* libhpucoll's timeouts are checked before any worker starts: 0 or less
 * would be a wait without end (-1 hung on a stopped peer). */
static void test_coll_env_checked(void **state)
{
	(void)state;
	hpu_launch_args a;
	setenv("HPUCOLL_TIMEOUT_MS", "-1", 1);
	parse_fails(ARGV(model), "HPUCOLL_TIMEOUT_MS='-1' is not a whole number of milliseconds from 1");
	setenv("HPUCOLL_TIMEOUT_MS", "soon", 1);
	parse_fails(ARGV(model), "HPUCOLL_TIMEOUT_MS='soon' is not a whole number");
	setenv("HPUCOLL_TIMEOUT_MS", "5000", 1);
	setenv("HPUCOLL_STALL_WARN_MS", "-1", 1);
	parse_fails(ARGV(model), "HPUCOLL_STALL_WARN_MS='-1' is not a whole number of milliseconds from 0");
	setenv("HPUCOLL_STALL_WARN_MS", "0", 1);
	parse_ok(&a, ARGV(model));
	hpu__args_free(&a);
	unsetenv("HPUCOLL_TIMEOUT_MS");
	unsetenv("HPUCOLL_STALL_WARN_MS");
	/* the algorithm and thresholds: named before any worker starts */
	setenv("HPUCOLL_ALGO", "fastest", 1);
	parse_fails(ARGV(model), "HPUCOLL_ALGO='fastest' is not one of auto, ring, rd, hier");
	setenv("HPUCOLL_ALGO", "hier", 1);
	setenv("HPUCOLL_SMALL_BYTES", "64k", 1);
	parse_fails(ARGV(model), "HPUCOLL_SMALL_BYTES='64k' is not a number of bytes");
	unsetenv("HPUCOLL_SMALL_BYTES");
	setenv("HPUCOLL_REDUCE_SMALL_BYTES", "-1", 1);
	parse_fails(ARGV(model), "HPUCOLL_REDUCE_SMALL_BYTES='-1' is not a number of bytes");
	unsetenv("HPUCOLL_REDUCE_SMALL_BYTES");
	setenv("HPU_JOIN_TIMEOUT_MS", "abc", 1); /* the default was taken in silence */
	parse_fails(ARGV(model), "HPU_JOIN_TIMEOUT_MS='abc' is not a whole number of milliseconds from 1");
	unsetenv("HPU_JOIN_TIMEOUT_MS");
	setenv("OMP_NUM_THREADS", "abc", 1); /* libgomp said so under [rank 0] */
	parse_fails(ARGV(model), "OMP_NUM_THREADS='abc' is not a number of threads");
	setenv("OMP_NUM_THREADS", "4,2", 1);
	parse_ok(&a, ARGV(model));
	hpu__args_free(&a);
	unsetenv("OMP_NUM_THREADS");
	setenv("WORLD_SIZE", "abc", 1); /* "does not equal" was said */
	parse_fails(ARGV(model), "WORLD_SIZE='abc' from the environment is not a number of ranks");
	unsetenv("WORLD_SIZE");
	setenv("HPUCOLL_IO_THREADS", "65", 1);
	parse_fails(ARGV(model), "HPUCOLL_IO_THREADS='65' is not a whole number of threads from 1 to 64");
	unsetenv("HPUCOLL_IO_THREADS");
	parse_ok(&a, ARGV(model));
	hpu__args_free(&a);
	unsetenv("HPUCOLL_ALGO");
}

static void test_deepspeed_aliases(void **state)
{
	(void)state;
	hpu_launch_args a;
	parse_ok(&a, ARGV("--num_gpus", "4", "--batch-size", "64", model));
	assert_int_equal(a.devices, 4);
	assert_int_equal(a.world, 4);
	hpu__args_free(&a);
	setenv("HPU_JOB_TOKEN", "secret", 1);
	parse_ok(&a, ARGV("--num_nodes", "2", "--node_rank", "1", "--master_addr", "10.1.2.3",
			  "--master_port", "29555", model));
	unsetenv("HPU_JOB_TOKEN");
	assert_int_equal(a.nodes, 2);
	assert_int_equal(a.node_rank, 1);
	assert_string_equal(a.master_addr, "10.1.2.3");
	assert_int_equal(a.master_port, 29555);
	hpu__args_free(&a);
	parse_fails(ARGV("--num_gpus", "gpu", model), "--num_gpus gpu: give a number of workers (one per GPU: --devices auto --device cuda)");
}

static void test_include_exclude(void **state)
{
	(void)state;
	hpu_launch_args a;
	parse_ok(&a, ARGV("--hostfile", hostfile, "--include", "gamma@alpha", "--batch-size", "64", model));
	assert_int_equal(a.nhosts, 2);
	assert_string_equal(a.hosts[0].name, "alpha"); /* the file's order */
	assert_string_equal(a.hosts[1].name, "gamma");
	assert_int_equal(a.nodes, 2);
	assert_int_equal(a.world, 4);
	hpu__args_free(&a);
	parse_ok(&a, ARGV("--hostfile", hostfile, "--exclude", "alpha", "--batch-size", "64", model));
	assert_int_equal(a.nhosts, 2);
	assert_string_equal(a.hosts[0].name, "beta");
	assert_string_equal(a.master_addr, "beta"); /* node 0: the first host kept */
	hpu__args_free(&a);
	parse_fails(ARGV("--hostfile", hostfile, "--include", "alpha:0,1", model),
		    "--include alpha:0,1: hpulaunch does not pick a host's devices (HOST:SLOT,SLOT)");
	parse_fails(ARGV("--hostfile", hostfile, "--include", "alpha@delta", model),
		    "--include names host 'delta', which is not in");
	parse_fails(ARGV("--hostfile", hostfile, "--exclude", "alpha@beta@gamma", model),
		    "--exclude alpha@beta@gamma leaves no host of");
	parse_fails(ARGV("--hostfile", hostfile, "--include", "alpha", "--exclude", "beta", model),
		    "--include and --exclude do not go together");
	parse_fails(ARGV("--include", "alpha", model), "--include picks hosts of a --hostfile: give one");
}

/* hpud runs the worker its configuration names: a program after --exec
 * would be dropped and its arguments handed to hpu-worker. */
static void test_exec_hostfile(void **state)
{
	(void)state;
	parse_fails(ARGV("--hostfile", hostfile, "--devices", "1", "--exec", "/bin/echo", "hi", model),
		    "--exec does not go with --hostfile: each node's hpud runs the worker its configuration names");
}

static void test_did_you_mean(void **state)
{
	(void)state;
	parse_fails(ARGV("--device", "2", model), "for --device: expected one of cpu, cpu-strict, cuda, auto (did you mean --devices 2?)");
	parse_fails(ARGV("--devics", "2", model), "unknown option --devics (did you mean --devices?)");
	parse_fails(ARGV("--max-step=3", model), "unknown option --max-step (did you mean --max-steps?)");
	parse_fails(ARGV("--num-gpus", "2", model), "unknown option --num-gpus (did you mean --num_gpus?)");
	parse_fails(ARGV("--frobnicate", model), "unknown option --frobnicate (see hpulaunch --help)");
	/* a single dash: it said "no model given", beside the model */
	parse_fails(ARGV("-v", model), "unknown option -v (hpulaunch's short options are -q and -h");
	parse_fails(ARGV("-qh", model), "unknown option -qh");
	/* a launcher flag with a value: it said "unknown option --quiet (did
	 * you mean --quiet?)" */
	parse_fails(ARGV("--quiet=1", model), "option --quiet takes no value");
	parse_fails(ARGV("--standalone=yes", model), "option --standalone takes no value");
}

/* A flag wins over the environment's bad value as over a good one (bad
 * ones were refused first); --standalone ignores MASTER_PORT and
 * NODE_RANK; a bad value nothing sets instead is refused; a job id past
 * 63 characters is refused, from the flag with why, from the
 * environment too (it was cut short in silence). */
static void test_env_under_flags(void **state)
{
	(void)state;
	hpu_launch_args a;
	setenv("MASTER_PORT", "abc", 1);
	parse_fails(ARGV(model), "MASTER_PORT='abc' is not a port number");
	parse_ok(&a, ARGV("--master-port", "5000", model));
	assert_int_equal(a.master_port, 5000);
	hpu__args_free(&a);
	parse_ok(&a, ARGV("--standalone", model));
	hpu__args_free(&a);
	unsetenv("MASTER_PORT");
	setenv("NODE_RANK", "x", 1);
	parse_fails(ARGV(model), "NODE_RANK='x' is not a node rank");
	parse_ok(&a, ARGV("--standalone", model));
	hpu__args_free(&a);
	parse_ok(&a, ARGV("--node-rank", "0", model));
	hpu__args_free(&a);
	/* IPv6, as --rdzv-endpoint's (it was "cannot resolve", exit 1) */
	parse_fails(ARGV("--master-addr", "::1", model), "--master-addr ::1: an IPv6 address; hpulaunch speaks IPv4 only");
	parse_fails(ARGV("--master-addr", "10.0.0.1:29500", model),
		    "--master-addr 10.0.0.1:29500: give the address alone, and the port with --master-port");
	/* named as given (it was said as --node-rank 5) */
	setenv("NODE_RANK", "5", 1);
	parse_fails(ARGV("--nodes", "2", "--master-port", "5000", model),
		    "NODE_RANK=5 from the environment is not below --nodes 2");
	unsetenv("NODE_RANK");
	char id[101];
	memset(id, 'a', 100);
	id[100] = 0;
	setenv("HPU_JOB_ID", id, 1);
	parse_fails(ARGV(model), "is 100 characters, more than the 63 a job id may have");
	parse_ok(&a, ARGV("--job-id", "mine", model));
	assert_string_equal(a.job_id, "mine");
	hpu__args_free(&a);
	unsetenv("HPU_JOB_ID");
	id[64] = 0;
	parse_fails(ARGV("--job-id", id, model), "is 64 characters, more than the 63 a job id may have");
	id[63] = 0;
	parse_ok(&a, ARGV("--job-id", id, model));
	hpu__args_free(&a);
}

static void test_resume_checked(void **state)
{
	(void)state;
	char missing[160], file[160], empty[160], ckpt[256], root[160];
	snprintf(missing, sizeof missing, "%s/nowhere", dir);
	parse_fails(ARGV("--resume", missing, model), "No such file or directory: give a checkpoint directory");
	snprintf(file, sizeof file, "%s/afile", dir);
	write_file(file, "x");
	parse_fails(ARGV("--resume", file, model), "is not a directory");
	snprintf(empty, sizeof empty, "%s/empty", dir);
	assert_int_equal(mkdir(empty, 0700), 0);
	parse_fails(ARGV("--resume", empty, model),
		    "no checkpoint there (neither manifest.json nor step-* directories)");
	hpu_launch_args a;
	snprintf(ckpt, sizeof ckpt, "%s/manifest.json", empty);
	write_file(ckpt, "{}");
	parse_ok(&a, ARGV("--resume", empty, model)); /* a checkpoint */
	hpu__args_free(&a);
	snprintf(root, sizeof root, "%s/root", dir);
	assert_int_equal(mkdir(root, 0700), 0);
	snprintf(ckpt, sizeof ckpt, "%s/root/step-00000010", dir);
	assert_int_equal(mkdir(ckpt, 0700), 0);
	parse_ok(&a, ARGV("--resume", root, model)); /* a root */
	hpu__args_free(&a);
	parse_ok(&a, ARGV("--resume", "auto", "--checkpoint-dir", missing, model));
	hpu__args_free(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_options_after_model),
		cmocka_unit_test(test_deepspeed_aliases),
		cmocka_unit_test(test_coll_env_checked),
		cmocka_unit_test(test_include_exclude),
		cmocka_unit_test(test_exec_hostfile),
		cmocka_unit_test(test_did_you_mean),
		cmocka_unit_test(test_env_under_flags),
		cmocka_unit_test(test_resume_checked),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
