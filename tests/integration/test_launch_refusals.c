/* Integration tests of what hpulaunch refuses, through the real binary:
 * usage errors (its own options, DeepSpeed's and torchrun's), models
 * without an entry, of the wrong ABI, misusing the API or failing their
 * setup, a missing dataset, a relative model path, an unresolvable host,
 * inputs that are not regular files, an unwritable checkpoint directory.
 * Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/harness.h"

#define LAUNCH h_build("bin/hpulaunch")
#define MODEL h_build("lib/fmnist_mlp.so")

static void expect_model_error(const char *model, const char *text)
{
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "2", (char *)model, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, text));
	assert_non_null(strstr(p.out, "hpulaunch: error: rank "));
	h_free(&p);
}

static void expect_usage_error(char **argv, char *const env[], const char *text);

/* hpulaunch reads the model's ELF headers before any worker starts
 * (issue 39): a library without the entry symbol, or a file that is no
 * shared library, is refused as a usage error naming it. */
static void test_model_without_entry(void **state)
{
	(void)state;
	char want[512];
	snprintf(want, sizeof want, "the model %s has no entry symbol 'hpu_model_entry'",
		 h_build("lib/bad_noentry.so"));
	char *a1[] = {(char *)LAUNCH, "-q", "--devices", "2", (char *)h_build("lib/bad_noentry.so"), NULL};
	expect_usage_error(a1, NULL, want);
	char text[64] = "/tmp/hpu-test-model-XXXXXX";
	int fd = mkstemp(text);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "not a model\n", 12), 12);
	close(fd);
	snprintf(want, sizeof want, "the model %s is not a shared library (no ELF header)", text);
	char *a2[] = {(char *)LAUNCH, "-q", (char *)text, NULL};
	expect_usage_error(a2, NULL, want);
	unlink(text);
	/* an int named hpu_model_entry (3, a valid ABI version): the worker
	 * read a setup past its end and crashed at 0x0 */
	snprintf(want, sizeof want, "the model %s: its 'hpu_model_entry' is 4 bytes, not an hpu_model (at least 32)",
		 h_build("lib/bad_tiny.so"));
	char *a3[] = {(char *)LAUNCH, "-q", "--devices", "1", (char *)h_build("lib/bad_tiny.so"), NULL};
	expect_usage_error(a3, NULL, want);
}

static void test_model_wrong_abi(void **state)
{
	(void)state;
	expect_model_error(h_build("lib/bad_abi.so"),
			   "was built for hputrain ABI version 999, but this runtime has ABI "
			   "version 3 (and loads 2)");
	/* a model of the chain contract is told what changed */
	expect_model_error(h_build("lib/bad_abi1.so"),
			   "was built for hputrain ABI version 1, but this runtime has ABI version 3 "
			   "(and loads 2): ABI 1 (a chain of layers with float inputs) is gone; "
			   "declare the model as a graph (see <hpu/hpu.h>, <hpu/layers.h> and "
			   "docs/writing-a-model.md) and rebuild it");
}

/* A call in the wrong phase fails the run naming the call and the phase
 * (issue 37): hpu_param() in setup, a declaration in a forward or in a
 * hook; also where the forward or hook ignores the call's code and
 * returns 0 (the job trained on and exited 0, saying nothing). */
static void test_model_wrong_phase(void **state)
{
	(void)state;
	char *a1[] = {(char *)LAUNCH, "-q", "--devices", "2", (char *)h_build("lib/phase_misuse.so"),
		      "--", "--in-setup", NULL};
	char *a2[] = {(char *)LAUNCH, "-q", "--devices", "2", (char *)h_build("lib/phase_misuse.so"),
		      "--", "--in-forward", NULL};
	char *a3[] = {(char *)LAUNCH, "-q", "--devices", "2", (char *)h_build("lib/phase_misuse.so"),
		      "--", "--in-hook", NULL};
	char *a4[] = {(char *)LAUNCH, "-q", "--devices", "2", (char *)h_build("lib/phase_misuse.so"),
		      "--", "--in-forward", "--ignored", NULL};
	char *a5[] = {(char *)LAUNCH, "-q", "--devices", "2", (char *)h_build("lib/phase_misuse.so"),
		      "--", "--in-hook", "--ignored", NULL};
	struct {
		char **argv;
		const char *text;
	} c[] = {
		{a1, "layer head: hpu_param() called during setup, but a layer's parameters, "
		     "gradients, buffers and memory exist only once setup has returned"},
		{a2, "layer loss: forward failed: hpu_param_add() called after setup (while the "
		     "model runs), but declarations belong in setup"},
		{a3, "the model's hook after training failed: hpu_loss_add() called after setup "
		     "(while the model runs), but declarations belong in setup"},
		{a4, "layer loss: forward failed: hpu_param_add() called after setup (while the "
		     "model runs), but declarations belong in setup"},
		{a5, "the model's hook after training failed: hpu_loss_add() called after setup "
		     "(while the model runs), but declarations belong in setup"},
	};
	for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
		proc p;
		int code = h_run(&p, c[i].argv, NULL, 60000);
		printf("%s", p.out);
		assert_int_equal(code, 1);
		assert_non_null(strstr(p.out, c[i].text));
		assert_non_null(strstr(p.out, "hpulaunch: error: rank "));
		h_free(&p);
	}
}

/* Sticky builder errors (issue 37, ABI 3): a setup with no per-call
 * checks whose third declaration reads a tensor that does not exist.
 * The job reports that error (the layer's name and the reason) and none
 * of the declarations after it, which read what it would have written. */
static void test_model_sticky_error(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "2",
			(char *)h_build("lib/sticky_setup.so"), NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "setup failed: layer act: input hh is not a tensor "
				      "declared before it"));
	assert_null(strstr(p.out, "fc2"));
	assert_null(strstr(p.out, "xent"));
	assert_null(strstr(p.out, "no tensor named loss"));
	h_free(&p);
}

/* The dataset missing: the error names the Debian package. */
static void test_missing_dataset(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "2", (char *)MODEL, "--",
			"--data", "/nonexistent/fmnist", NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "cannot open /nonexistent/fmnist/train-images-idx3-ubyte.gz"));
	assert_non_null(strstr(p.out, "apt-get install dataset-fashion-mnist"));
	h_free(&p);
}

/* The workers' environment knobs take their values only: a typo stops
 * the job naming it, instead of silently running without it. */
static void test_worker_knob_values(void **state)
{
	(void)state;
	/* HPU_STRICT_STEP=2 and HPU_BACKEND=bogus ran as off and as oneDNN */
	static const char *const knobs[][2] = {
		{"HPU_FUSED_ATTENTION=yes", "HPU_FUSED_ATTENTION=yes: must be 0 or 1"},
		{"HPU_STRICT_STEP=2", "HPU_STRICT_STEP=2: must be 0 or 1"},
		{"HPU_BACKEND=bogus", "HPU_BACKEND=bogus: must be onednn (the default) or reference"},
		{"HPU_FP8_NATIVE=on", "HPU_FP8_NATIVE=on: must be 0 or 1"},
		/* these three ran as off */
		{"HPU_STRICT_KERNELS=true", "HPU_STRICT_KERNELS=true: must be 0 or 1"},
		{"HPU_CUDNN_FIND=yes", "HPU_CUDNN_FIND=yes: must be 0 or 1"},
		{"HPU_CUDNN_LOG=2", "HPU_CUDNN_LOG=2: must be 0 or 1"},
		/* a number, but read as strcmp(v, "1") where it acts: off */
		{"HPU_STRICT_KERNELS=+1", "HPU_STRICT_KERNELS=+1: must be 0 or 1"}};
	for (size_t k = 0; k < sizeof knobs / sizeof *knobs; k++) {
		char *env[] = {(char *)knobs[k][0], NULL};
		char *argv[] = {(char *)LAUNCH, "-q", "--devices", "1", "--max-steps", "1",
				"--no-eval", (char *)MODEL, NULL};
		proc p;
		int code = h_run(&p, argv, env, 60000);
		printf("%s", p.out);
		assert_int_not_equal(code, 0);
		assert_non_null(strstr(p.out, knobs[k][1]));
		assert_null(strstr(p.out, "trained "));
		h_free(&p);
	}
}

/* --collectives nccl is NCCL between GPUs: with --device cpu (or
 * cpu-strict, or HPU_DEVICE=cpu) hpulaunch refuses it at once, and not
 * with HPU_DEVICE=cuda; with --device auto on a node without a GPU each
 * worker refuses it naming its device (where auto finds a GPU the one
 * worker trains, nothing to reduce, or says NCCL cannot be loaded). */
static void test_collectives_nccl_needs_cuda(void **state)
{
	(void)state;
	static const char *const devs[] = {"cpu", "cpu-strict"};
	for (int k = 0; k < 2; k++) {
		char *argv[] = {(char *)LAUNCH, "-q", "--devices", "1", "--device", (char *)devs[k],
				"--collectives", "nccl", (char *)MODEL, NULL};
		char want[128];
		snprintf(want, sizeof want, "--collectives nccl runs NCCL between GPUs: it needs "
					    "--device cuda (or auto), not %s", devs[k]);
		expect_usage_error(argv, NULL, want);
	}
	/* the device from the environment: resolved before the check */
	char *env_cpu[] = {"HPU_DEVICE=cpu", NULL}, *env_cuda[] = {"HPU_DEVICE=cuda", NULL};
	char *plain[] = {(char *)LAUNCH, "-q", "--devices", "1", "--collectives", "nccl",
			 "--max-steps", "1", "--no-eval", (char *)MODEL, NULL};
	expect_usage_error(plain, env_cpu, "it needs --device cuda (or auto), not cpu");
	proc q;
	h_run(&q, plain, env_cuda, 60000);
	printf("%s", q.out);
	assert_null(strstr(q.out, "it needs --device cuda (or auto)"));
	h_free(&q);
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "1", "--device", "auto", "--collectives",
			"nccl", "--max-steps", "1", "--no-eval", (char *)MODEL, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	printf("%s", p.out);
	if (strstr(p.out, "trained ")) {
		printf("  --device auto found a GPU here: the worker trained\n");
		assert_int_equal(code, 0);
	} else if (strstr(p.out, "--collectives nccl: NCCL cannot be loaded") ||
		   strstr(p.out, "--collectives nccl: this build of the CUDA module has no NCCL")) {
		printf("  --device auto found a GPU here, without NCCL: refused, said\n");
		assert_int_equal(code, 1);
	} else {
		assert_int_equal(code, 1);
		assert_non_null(strstr(p.out, "--collectives nccl runs NCCL between GPUs: this "
					      "worker's device is cpu, not cuda"));
	}
	h_free(&p);
}

static void expect_usage_error(char **argv, char *const env[], const char *text)
{
	proc p;
	int code = h_run(&p, argv, env, 30000);
	printf("%s", p.out);
	assert_int_equal(code, 2);
	assert_non_null(strstr(p.out, text));
	h_free(&p);
}

static void test_usage_errors(void **state)
{
	(void)state;
	char *ws[] = {"WORLD_SIZE=3", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "2", "--master-port", "29500",
		      (char *)MODEL, NULL};
	expect_usage_error(a1, ws, "WORLD_SIZE=3 from the environment does not equal --nodes 2 x --devices 2 = 4");
	char *a2[] = {(char *)LAUNCH, "--lr", "fast", (char *)MODEL, NULL};
	expect_usage_error(a2, NULL, "bad value 'fast' for --lr");
	char *a3[] = {(char *)LAUNCH, "--devices", "3", (char *)MODEL, NULL};
	expect_usage_error(a3, NULL, "--batch-size 256 is not divisible by --grad-accum 1 x world size 3");
	char *a4[] = {(char *)LAUNCH, "--devices", "2", "/nonexistent/model.so", NULL};
	expect_usage_error(a4, NULL, "cannot read the model /nonexistent/model.so");
	char *a5[] = {(char *)LAUNCH, "--strategy", "zero4", (char *)MODEL, NULL};
	expect_usage_error(a5, NULL, "bad value 'zero4' for --strategy");
	char *a7[] = {(char *)LAUNCH, "--transport", "carrier-pigeon", (char *)MODEL, NULL};
	expect_usage_error(a7, NULL, "bad value 'carrier-pigeon' for --transport");
	char *tok[] = {"HPU_JOB_TOKEN=x", NULL};
	char *a8[] = {(char *)LAUNCH, "--nodes", "2", "--master-port", "29500", "--transport", "ipc",
		      (char *)MODEL, NULL};
	expect_usage_error(a8, tok, "--transport ipc works within one node only");
	char *a10[] = {(char *)LAUNCH, "--nodes", "2", "--master-port", "29500", (char *)MODEL, NULL};
	expect_usage_error(a10, NULL, "--nodes 2 needs HPU_JOB_TOKEN set to the same secret on every node");
	char *a9[] = {(char *)LAUNCH, "--job-id", "../../etc", (char *)MODEL, NULL};
	expect_usage_error(a9, NULL, "job id '../../etc' may hold only letters");
	char *a6[] = {(char *)LAUNCH, "--frobnicate", (char *)MODEL, NULL};
	expect_usage_error(a6, NULL, "unknown option --frobnicate");
}

/* Issue 39: DeepSpeed's launcher flags run a job; hpulaunch's options
 * after the model, unknown flags, a --resume that is no checkpoint and
 * --include without a hostfile are refused before any worker starts. */
static void test_deepspeed_aliases_and_refusals(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "--num_gpus", "2", "--num_nodes", "1", "--max-steps", "2",
			"--no-eval", (char *)MODEL, "--", "--hidden", "32", NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	printf("%s", p.out);
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "[rank 0] trained 2 steps on 2 workers"));
	h_free(&p);
	char *a1[] = {(char *)LAUNCH, "--devices", "2", (char *)MODEL, "--max-steps", "10", "--lr",
		      "0.1", NULL};
	expect_usage_error(a1, NULL, "hpulaunch's option --max-steps comes after the model");
	expect_usage_error(a1, NULL, "put it before the model, or after -- to hand it to the model");
	char *a2[] = {(char *)LAUNCH, "--device", "2", (char *)MODEL, NULL};
	expect_usage_error(a2, NULL, "bad value '2' for --device: expected one of cpu, cpu-strict, cuda, auto (did you mean --devices 2?)");
	char *a3[] = {(char *)LAUNCH, "--resume", "/nonexistent/ckpt", (char *)MODEL, NULL};
	expect_usage_error(a3, NULL, "--resume /nonexistent/ckpt: No such file or directory: give a checkpoint directory");
	char empty[64] = "/tmp/hpu-test-resume-XXXXXX", want[160];
	assert_non_null(mkdtemp(empty));
	snprintf(want, sizeof want, "--resume %s: no checkpoint there (neither manifest.json nor step-* directories)",
		 empty);
	char *a4[] = {(char *)LAUNCH, "--resume", empty, (char *)MODEL, NULL};
	expect_usage_error(a4, NULL, want);
	rmdir(empty);
	char *a5[] = {(char *)LAUNCH, "--exclude", "node1", (char *)MODEL, NULL};
	expect_usage_error(a5, NULL, "--exclude picks hosts of a --hostfile: give one");
}

/* Copies the file at from to to; 0 or -1. */
static int copy_file(const char *from, const char *to)
{
	size_t len;
	char *b = h_slurp_n(from, &len);
	FILE *f = b ? fopen(to, "wb") : NULL;
	int ok = f && fwrite(b, 1, len, f) == len;
	if (f)
		ok &= fclose(f) == 0;
	free(b);
	return ok ? 0 : -1;
}

/* Runs hpulaunch in directory dir (the test's own directory is kept). */
static int run_in(const char *dir, proc *p, char **argv, int timeout_ms)
{
	char cwd[4096];
	assert_non_null(getcwd(cwd, sizeof cwd));
	assert_int_equal(chdir(dir), 0);
	int code = h_run(p, argv, NULL, timeout_ms);
	assert_int_equal(chdir(cwd), 0);
	printf("%s", p->out);
	return code;
}

/* A model named without a directory is the file in the current
 * directory, not whatever the dynamic loader finds first on its search
 * path (build/lib holds an fmnist_mlp.so, and the worker's runpath points
 * there), and a relative name reaches the workers as an absolute path. */
static void test_model_relative_path(void **state)
{
	(void)state;
	char dir[64] = "/tmp/hpu-test-model-dir-XXXXXX", shadow[128], mine[128];
	assert_non_null(mkdtemp(dir));
	snprintf(shadow, sizeof shadow, "%s/fmnist_mlp.so", dir);
	snprintf(mine, sizeof mine, "%s/mine.so", dir);
	assert_int_equal(copy_file(h_build("lib/bad_noentry.so"), shadow), 0);
	assert_int_equal(copy_file(MODEL, mine), 0);
	proc p;
	char *a1[] = {(char *)LAUNCH, "-q", "--devices", "2", "--max-steps", "2", "--no-eval",
		      "fmnist_mlp.so", NULL};
	int code = run_in(dir, &p, a1, 60000);
	assert_int_equal(code, 2); /* refused by hpulaunch before the workers */
	assert_non_null(strstr(p.out, shadow));
	assert_non_null(strstr(p.out, "has no entry symbol 'hpu_model_entry'"));
	h_free(&p);
	char *a2[] = {(char *)LAUNCH, "-q", "--devices", "2", "--max-steps", "2", "--no-eval",
		      "mine.so", NULL};
	code = run_in(dir, &p, a2, 60000);
	assert_null(strstr(p.out, "cannot open shared object file"));
	assert_int_equal(code, 0);
	h_free(&p);
	unlink(shadow);
	unlink(mine);
	rmdir(dir);
}

/* A hostfile host that does not resolve is named at once, with the
 * resolver's reason, before any daemon is contacted (not "no answer from
 * hpud ... within 10 s: ... the same key?"); --status the same. */
static void test_hostfile_unresolvable_host(void **state)
{
	(void)state;
	char dir[64] = "/tmp/hpu-test-hosts-dir-XXXXXX", hosts[128], key[128];
	assert_non_null(mkdtemp(dir));
	snprintf(hosts, sizeof hosts, "%s/hosts", dir);
	snprintf(key, sizeof key, "%s/secret.key", dir);
	assert_int_equal(h_write_file(hosts, "localhost slots=1\nno-such-host.invalid slots=1\n", 0644), 0);
	assert_int_equal(h_write_file(key, "00112233445566778899aabbccddeeff"
					   "00112233445566778899aabbccddeeff\n", 0600), 0);
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *a1[] = {(char *)LAUNCH, "-q", "--hostfile", hosts, "--key", key, "--hpud-port", port,
		      (char *)MODEL, NULL};
	proc p;
	int code = h_run(&p, a1, NULL, 30000);
	printf("%s", p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "host no-such-host.invalid (node 1"));
	assert_non_null(strstr(p.out, "does not resolve"));
	assert_null(strstr(p.out, "the same key"));
	h_free(&p);
	char *a2[] = {(char *)LAUNCH, "--status", "no-such-host.invalid", "--key", key, NULL};
	code = h_run(&p, a2, NULL, 30000);
	printf("%s", p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "host no-such-host.invalid does not resolve"));
	assert_null(strstr(p.out, "the same key"));
	h_free(&p);
	unlink(hosts);
	unlink(key);
	rmdir(dir);
}

/* Input files named on the command line or in the environment (--config,
 * --hostfile, LOWER_LIST, FP32_LIST) that are FIFOs are refused at once,
 * naming the path, instead of waiting forever for a writer. */
static void test_inputs_not_regular(void **state)
{
	(void)state;
	char dir[64] = "/tmp/hpu-test-fifo-XXXXXX", fifo[128], lower[160];
	assert_non_null(mkdtemp(dir));
	snprintf(fifo, sizeof fifo, "%s/fifo", dir);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	char *a1[] = {(char *)LAUNCH, "--config", fifo, (char *)MODEL, NULL};
	proc p;
	int code = h_run(&p, a1, NULL, 15000);
	printf("%s", p.out);
	assert_int_equal(code, 2);
	assert_non_null(strstr(p.out, fifo));
	assert_non_null(strstr(p.out, "not a regular file (a FIFO)"));
	h_free(&p);
	char *a2[] = {(char *)LAUNCH, "--hostfile", fifo, (char *)MODEL, NULL};
	code = h_run(&p, a2, NULL, 15000);
	printf("%s", p.out);
	assert_int_equal(code, 2);
	assert_non_null(strstr(p.out, "cannot read the hostfile"));
	assert_non_null(strstr(p.out, "not a regular file (a FIFO)"));
	h_free(&p);
	snprintf(lower, sizeof lower, "LOWER_LIST=%s", fifo);
	char *env[] = {lower, NULL};
	char *a3[] = {(char *)LAUNCH, "-q", "--devices", "1", "--max-steps", "1", "--no-eval",
		      (char *)MODEL, NULL};
	code = h_run(&p, a3, env, 30000);
	printf("%s", p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "LOWER_LIST file "));
	assert_non_null(strstr(p.out, "not a regular file (a FIFO)"));
	h_free(&p);
	char *a4[] = {(char *)LAUNCH, "-q", "--devices", "1", "--max-steps", "1", "--no-eval",
		      "--load-params", fifo, (char *)MODEL, NULL};
	code = h_run(&p, a4, NULL, 30000);
	printf("%s", p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "--load-params "));
	assert_non_null(strstr(p.out, "not a regular file"));
	h_free(&p);
	unlink(fifo);
	rmdir(dir);
}

/* Issue 39: an autocast list at fp32 changes nothing and rank 0 says so in
 * one note; a one-worker run's summary says "1 worker", not "1 workers". */
static void test_fp32_list_note_and_singular(void **state)
{
	(void)state;
	char dir[64] = "/tmp/hpu-test-lower-XXXXXX", list[128], lower[160];
	assert_non_null(mkdtemp(dir));
	snprintf(list, sizeof list, "%s/lower.txt", dir);
	assert_int_equal(h_write_file(list, "linear\n", 0644), 0);
	snprintf(lower, sizeof lower, "LOWER_LIST=%s", list);
	char *env[] = {lower, NULL};
	char *argv[] = {(char *)LAUNCH, "--devices", "1", "--max-steps", "1", "--no-eval",
			(char *)MODEL, NULL};
	proc p;
	int code = h_run(&p, argv, env, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "note: LOWER_LIST="));
	assert_non_null(strstr(p.out, "has no effect at --precision fp32: every op runs in fp32"));
	assert_non_null(strstr(p.out, "trained 1 step on 1 worker ("));
	assert_null(strstr(p.out, "1 workers"));
	h_free(&p);
	unlink(list);
	rmdir(dir);
}

/* A checkpoint directory that cannot be made is found before training,
 * not at the first save after it: the launcher stops with the directory
 * and the reason, and no worker starts. The parent being a regular file
 * fails for root as well. */
static void test_checkpoint_dir_unwritable(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "2", "--max-steps", "2", "--no-eval",
			"--checkpoint-dir", "/dev/null/ckpt", (char *)MODEL, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 2);
	assert_non_null(strstr(p.out, "checkpoint directory /dev/null/ckpt"));
	assert_non_null(strstr(p.out, "Not a directory"));
	assert_null(strstr(p.out, "[rank "));
	h_free(&p);
}

/* A program that cannot be executed is named with the reason; a path
 * too long for the line keeps its end and the reason (the line was cut
 * in the middle of the path, without the reason). */
static void test_exec_failure_said(void **state)
{
	(void)state;
	char longp[700];
	int n = snprintf(longp, sizeof longp, "/nonexistent/");
	while (n < 600)
		n += snprintf(longp + n, sizeof longp - (size_t)n, "%s", "dddddddddd/");
	snprintf(longp + n, sizeof longp - (size_t)n, "prog-at-the-end");
	const char *progs[] = {"/nonexistent/prog", longp};
	for (int k = 0; k < 2; k++) {
		char *argv[] = {(char *)LAUNCH, "-q", "--devices", "1", "--exec", (char *)progs[k], NULL};
		proc p;
		int code = h_run(&p, argv, NULL, 60000);
		printf("%s", p.out);
		assert_int_equal(code, 1);
		assert_non_null(strstr(p.out, "exited with code 127"));
		assert_non_null(strstr(p.out, k ? "cannot execute the worker program ..."
						: "cannot execute the worker program /nonexistent/prog: no such file\n"));
		if (k)
			assert_non_null(strstr(p.out, "dddddddddd/prog-at-the-end: no such file\n"));
		h_free(&p);
	}
}

/* Bad values of torchrun's options are errors that say what was wrong. */
static void test_torchrun_alias_errors(void **state)
{
	(void)state;
	static const struct {
		const char *opt, *value, *want;
	} cases[] = {
		{"--nnodes", "1:4", "--nnodes 1:4: hpulaunch has no elastic range of nodes; give one number (--nnodes 4)"},
		{"--nnodes", "two", "--nnodes takes a number of nodes from 1 to 4096 (or N:N), not 'two'"},
		{"--nnodes", "2:", "--nnodes takes a number of nodes from 1 to 4096 (or N:N), not '2:'"},
		{"--nproc-per-node", "xpu", "--nproc-per-node xpu: hpulaunch has no XPU device; give a number, gpu (one worker per GPU), auto or cpu (one per core)"},
		{"--nproc_per_node", "0", "--nproc_per_node takes a number of workers from 1 to 1024, gpu, auto or cpu, not '0'"},
		{"--devices", "cpu", "--devices takes a number of workers from 1 to 1024 or auto, not 'cpu'"},
		{"--rdzv-endpoint", "[::1]:29500", "--rdzv-endpoint [::1]:29500: an IPv6 address; hpulaunch speaks IPv4 only"},
		{"--rdzv_endpoint", "fe80::1:29500", "--rdzv-endpoint fe80::1:29500: an IPv6 address"},
		{"--rdzv-endpoint", "node0", "--rdzv-endpoint takes HOST:PORT (node 0's address and a port from 1 to 65535), not 'node0'"},
		{"--rdzv-endpoint", "node0:70000", "--rdzv-endpoint takes HOST:PORT (node 0's address and a port from 1 to 65535), not 'node0:70000'"},
		{"--rdzv-endpoint", ":29500", "not ':29500'"},
		{"--master_port", "http", "bad value 'http' for --master_port"},
		{"--node_rank", "-1", "bad value '-1' for --node_rank"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *argv[] = {(char *)LAUNCH, (char *)cases[i].opt, (char *)cases[i].value,
				(char *)MODEL, NULL};
		expect_usage_error(argv, NULL, cases[i].want);
	}
	/* gpu: one worker per GPU (test_gpus); without one, the reason */
	if (access("/dev/nvidiactl", F_OK) != 0) {
		char *g[] = {(char *)LAUNCH, "--nproc-per-node", "gpu", (char *)MODEL, NULL};
		expect_usage_error(g, NULL, "--nproc-per-node gpu: ");
	}
	char *tok[] = {"HPU_JOB_TOKEN=x", NULL};
	char *s1[] = {(char *)LAUNCH, "--standalone", "--nnodes", "2", "--master-port", "29500",
		      (char *)MODEL, NULL};
	expect_usage_error(s1, tok, "--standalone runs one node with its own rendezvous on a free port: it does not go with more than one node");
	char *s2[] = {(char *)LAUNCH, "--standalone", "--rdzv-endpoint", "127.0.0.1:29500",
		      (char *)MODEL, NULL};
	expect_usage_error(s2, NULL, "it does not go with --master-addr or --rdzv-endpoint");
	char *s3[] = {(char *)LAUNCH, "--standalone", "--master_port", "29500", (char *)MODEL, NULL};
	expect_usage_error(s3, NULL, "it does not go with --master-port or --rdzv-endpoint");
	char *s4[] = {(char *)LAUNCH, "--standalone", "--hostfile", "/nonexistent/hosts",
		      (char *)MODEL, NULL};
	expect_usage_error(s4, NULL, "it does not go with --hostfile");
	char *s5[] = {(char *)LAUNCH, "--standalone", "--node_rank", "1", (char *)MODEL, NULL};
	expect_usage_error(s5, NULL, "it does not go with a --node-rank above 0");
}

/* Two names of one setting with two values are refused naming both (the
 * last one won, whichever a wrapper or the user wrote last); one value
 * under two names, or one name twice (its last value), runs. */
static void test_alias_two_values(void **state)
{
	(void)state;
	static const char *cases[][5] = {
		{"--devices", "2", "--nproc-per-node", "4", "--devices 2 and --nproc-per-node 4 give one setting two values: give one"},
		{"--num_gpus", "1", "--devices", "auto", "--num_gpus 1 and --devices auto give one"},
		{"--nodes", "2", "--nnodes", "1", "--nodes 2 and --nnodes 1 give one"},
		{"--master-addr", "10.0.0.1", "--rdzv-endpoint", "10.0.0.2:29500", "--master-addr 10.0.0.1 and --rdzv-endpoint 10.0.0.2:29500 give one"},
		{"--rdzv_endpoint", "127.0.0.1:29500", "--master-port", "29501", "--rdzv_endpoint 127.0.0.1:29500 and --master-port 29501 give one"},
		{"--job-id", "a", "--rdzv-id", "b", "--job-id a and --rdzv-id b give one"},
		{"--node-rank", "0", "--node_rank", "0", NULL}, /* one name */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		if (!cases[i][4])
			continue;
		char *argv[] = {(char *)LAUNCH, (char *)cases[i][0], (char *)cases[i][1],
				(char *)cases[i][2], (char *)cases[i][3], (char *)MODEL, NULL};
		expect_usage_error(argv, NULL, cases[i][4]);
	}
	char *same[] = {(char *)LAUNCH, "-q", "--devices", "1", "--nproc_per_node", "1",
			"--max-restarts", "1", "--max_restarts", "0", "--num_gpus", "1", "--no-eval",
			"--max-steps", "1", "--log-every", "0", (char *)MODEL, NULL};
	proc p;
	int code = h_run(&p, same, NULL, 120000);
	if (code != 0)
		fail_msg("exit %d:\n%s", code, p.out ? p.out : "");
	assert_non_null(strstr(p.out, "on 1 worker"));
	h_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_usage_errors),
		cmocka_unit_test(test_deepspeed_aliases_and_refusals),
		cmocka_unit_test(test_model_relative_path),
		cmocka_unit_test(test_hostfile_unresolvable_host),
		cmocka_unit_test(test_inputs_not_regular),
		cmocka_unit_test(test_fp32_list_note_and_singular),
		cmocka_unit_test(test_checkpoint_dir_unwritable),
		cmocka_unit_test(test_model_without_entry),
		cmocka_unit_test(test_model_wrong_abi),
		cmocka_unit_test(test_model_wrong_phase),
		cmocka_unit_test(test_model_sticky_error),
		cmocka_unit_test(test_missing_dataset),
		cmocka_unit_test(test_worker_knob_values),
		cmocka_unit_test(test_torchrun_alias_errors),
		cmocka_unit_test(test_alias_two_values),
		cmocka_unit_test(test_exec_failure_said),
		cmocka_unit_test(test_collectives_nccl_needs_cuda),
	};
	/* HPU_TEST=test_name (a glob) runs only the tests it names. */
	if (getenv("HPU_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPU_TEST"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
