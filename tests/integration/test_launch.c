/* Integration tests: the real hpulaunch, hpu-worker and model, with real
 * processes and sockets on loopback. Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

#include "collectives/comm_internal.h"
#include "tests/harness.h"

#define LAUNCH h_build("bin/hpulaunch")
#define MODEL h_build("lib/fmnist_mlp.so")
/* the MLP with the fault knobs (tests/fixtures/fault_mlp.c) */
#define FAULT_MODEL h_build("lib/fault_mlp.so")


/* The loss of the metrics record for `step`, or NAN. */
static double loss_at(const char *metrics, int step)
{
	char key[48];
	snprintf(key, sizeof key, "{\"step\":%d,", step);
	const char *p = strstr(metrics, key), *l = p ? strstr(p, "\"loss\":") : NULL;
	return l ? strtod(l + 7, NULL) : NAN;
}

static void train_20_steps(int devices, const char *optimizer, const char *lr,
			   const char *metrics)
{
	char dev[8];
	snprintf(dev, sizeof dev, "%d", devices);
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", dev, "--max-steps", "20",
			"--log-every", "1", "--no-eval", "--optimizer", (char *)optimizer,
			"--lr", (char *)lr, "--metrics", (char *)metrics, (char *)MODEL, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	if (code != 0)
		fprintf(stderr, "%s", p.out);
	assert_int_equal(code, 0);
	h_free(&p);
}

/* Trains 20 steps on 1 and on 2 workers (same global batch and seed) and
 * returns the relative loss difference at `step`, after checking that
 * every step up to `strict_until` agrees within 1e-5 and every later one
 * within 1e-4. */
static double compare_runs(const char *optimizer, const char *lr, int workers,
			   int step, int strict_until)
{
	const char *m1 = "/tmp/hpu-test-eq-1.jsonl", *m2 = "/tmp/hpu-test-eq-2.jsonl";
	train_20_steps(1, optimizer, lr, m1);
	train_20_steps(workers, optimizer, lr, m2);
	char *a = h_slurp(m1), *b = h_slurp(m2);
	assert_non_null(a);
	assert_non_null(b);
	for (int s = 1; s <= 20; s++) {
		double x = loss_at(a, s), y = loss_at(b, s);
		assert_true(isfinite(x) && isfinite(y));
		assert_true(fabs(x - y) <= (s <= strict_until ? 1e-5 : 1e-4) * fabs(x));
	}
	double first = loss_at(a, 1), l1 = loss_at(a, step), l2 = loss_at(b, step);
	double rel = fabs(l1 - l2) / fabs(l1);
	printf("%s lr %s: step %d loss: 1 worker %.9g, %d workers %.9g, relative difference %.3g\n",
	       optimizer, lr, step, l1, workers, l2, rel);
	assert_true(isfinite(l1) && isfinite(l2));
	assert_true(l1 < first); /* it trains */
	free(a);
	free(b);
	unlink(m1);
	unlink(m2);
	return rel;
}

/* A 2-worker run and a 1-worker run with the same global batch and seed
 * give the same loss at every one of 20 steps within 1e-5 relative, with
 * AdamW; with SGD-momentum at lr 0.05 for 10 steps, and within 1e-4 after:
 * the products sum in another order at batch 128 than at 256, and that run
 * amplifies it (measured on oneDNN's kernels: at most 1.2e-7 through step
 * 11, then 2.4e-6 at step 12 and 1.7e-5 at step 19; OpenBLAS's happened to
 * stay at 1.2e-7). */
static void test_two_workers_match_one_sgd(void **state)
{
	(void)state;
	assert_true(compare_runs("sgd", "0.05", 2, 20, 10) <= 1e-4);
}

/* More workers than cores: 4 workers on this 2-core machine. */
static void test_four_workers_match_one_sgd(void **state)
{
	(void)state;
	assert_true(compare_runs("sgd", "0.05", 4, 20, 10) <= 1e-4);
}

static void test_two_workers_match_one_adamw(void **state)
{
	(void)state;
	assert_true(compare_runs("adamw", "0.001", 2, 20, 20) <= 1e-5);
}

/* The demo itself: one epoch on 2 workers. The metrics file has a line per
 * 50 steps and a final record; the test accuracy is that of a trained
 * model. One epoch's accuracy varies with the seed between about 0.83 and
 * 0.86 (PyTorch's as much as ours, bench/RESULTS.md), so the bar here is
 * 0.82: far above what a broken gradient or sampler gives. */
static void test_demo_epoch(void **state)
{
	(void)state;
	const char *m = "/tmp/hpu-test-demo.jsonl";
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--metrics", (char *)m,
			(char *)MODEL, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 300000);
	printf("%s", p.out);
	assert_int_equal(code, 0);
	h_free(&p);
	char *s = h_slurp(m);
	assert_non_null(s);
	for (int step = 50; step <= 200; step += 50)
		assert_true(isfinite(loss_at(s, step)));
	const char *f = strstr(s, "\"final\":true");
	assert_non_null(f);
	const char *acc = strstr(f, "\"test_accuracy\":"), *steps = strstr(f, "\"steps\":");
	assert_non_null(acc);
	assert_non_null(steps);
	assert_int_equal(atoi(steps + 8), 234); /* 60000 / 256, drop_last */
	double a = strtod(acc + 16, NULL);
	printf("test accuracy %.4f\n", a);
	assert_true(a >= 0.82 && a <= 1.0);
	free(s);
	unlink(m);
}

/* kill -9 one worker mid-training: hpulaunch exits non-zero within 5 s
 * with the root-cause line, and no worker process remains. */
static void test_kill_worker(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--epochs", "20", "--log-every", "2",
			(char *)MODEL, NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	int seen = h_wait_for(&p, "step 4/", 60000);
	pid_t kids[8];
	int n = h_children(p.pid, kids, 8);
	if (seen != 0 || n != 2) {
		fprintf(stderr, "training did not start (%d workers):\n%s\n", n, p.out);
		h_kill_groups(kids, n);
		h_kill(&p);
		fail();
	}
	kill(kids[1], SIGKILL);
	int exited = h_wait(&p, 5000);
	int alive = h_alive(kids[0]) || h_alive(kids[1]);
	h_kill_groups(kids, n);
	if (exited != 0)
		h_kill(&p);
	char want[96];
	snprintf(want, sizeof want, "pid %d) was killed by signal 9", (int)kids[1]);
	if (!strstr(p.out, want))
		fprintf(stderr, "no root-cause line '%s' in:\n%s\n", want, p.out);
	assert_int_equal(exited, 0);
	assert_int_not_equal(h_code(&p), 0);
	assert_non_null(strstr(p.out, want));
	assert_non_null(strstr(p.out, "hpulaunch: error: rank "));
	assert_false(alive);
	h_free(&p);
}

/* SIGTERM to hpulaunch tears the job down: exit 143, no worker left. */
static void test_sigterm_teardown(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--epochs", "20", "--log-every", "2",
			(char *)MODEL, "--", "--hidden", "64", NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	int seen = h_wait_for(&p, "step 2/", 60000);
	pid_t kids[8];
	int n = h_children(p.pid, kids, 8);
	assert_int_equal(seen, 0);
	assert_int_equal(n, 2);
	kill(p.pid, SIGTERM);
	int exited = h_wait(&p, 10000);
	int alive = h_alive(kids[0]) || h_alive(kids[1]);
	h_kill_groups(kids, n);
	if (exited)
		h_kill(&p);
	assert_int_equal(exited, 0);
	assert_int_equal(h_code(&p), 128 + SIGTERM);
	assert_non_null(strstr(p.out, "interrupted by SIGTERM"));
	assert_false(alive);
	h_free(&p);
}

/* A worker with the wrong job token is refused by the coordinator; a rank
 * that never joins ends the job with an error naming it. */
static void test_wrong_token_and_missing_rank(void **state)
{
	(void)state;
	char port[16], master_port[32];
	snprintf(port, sizeof port, "%d", h_free_port());
	snprintf(master_port, sizeof master_port, "MASTER_PORT=%s", port);
	char *env0[] = {"HPU_JOB_TOKEN=the-right-secret", NULL};
	char *argv0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
			 "--master-port", port, "--join-timeout", "4", (char *)MODEL,
			 "--", "--hidden", "64", NULL};
	proc coord;
	assert_int_equal(h_start(&coord, argv0, env0), 0);
	usleep(300000);
	char *envw[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", "NODE_RANK=1",
			"MASTER_ADDR=127.0.0.1", master_port, "HPU_JOB_ID=hpujob",
			"HPU_JOB_TOKEN=a-wrong-guess", NULL};
	char *argvw[] = {(char *)h_build("bin/hpu-worker"), (char *)MODEL, "--", "--hidden", "64", NULL};
	proc w;
	int wcode = h_run(&w, argvw, envw, 30000);
	printf("impostor: %s", w.out);
	assert_int_equal(wcode, 1);
	assert_non_null(strstr(w.out, "refused rank 1: bad job token"));
	h_free(&w);

	int exited = h_wait(&coord, 30000);
	if (exited)
		h_kill(&coord);
	printf("launcher: %s", coord.out);
	assert_int_equal(exited, 0);
	assert_int_equal(h_code(&coord), 1);
	assert_non_null(strstr(coord.out, "refused a join from rank 1"));
	assert_non_null(strstr(coord.out, "rank 1 did not join within 4 s"));
	assert_non_null(strstr(coord.out, "no hpulaunch connected for node 1"));
	h_free(&coord);
}

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
			   "(and loads 2): ABI 1 (a chain of layers with float inputs) is gone");
}

/* A call in the wrong phase fails the run naming the call and the phase
 * (issue 37): hpu_param() in setup, a declaration in a forward or in a
 * hook. */
static void test_model_wrong_phase(void **state)
{
	(void)state;
	char *a1[] = {(char *)LAUNCH, "-q", "--devices", "2", (char *)h_build("lib/phase_misuse.so"),
		      "--", "--in-setup", NULL};
	char *a2[] = {(char *)LAUNCH, "-q", "--devices", "2", (char *)h_build("lib/phase_misuse.so"),
		      "--", "--in-forward", NULL};
	char *a3[] = {(char *)LAUNCH, "-q", "--devices", "2", (char *)h_build("lib/phase_misuse.so"),
		      "--", "--in-hook", NULL};
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

/* --exec: the environment every worker gets, and prefixed output. */
static void test_exec_environment(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "2", "--exec", "/bin/sh", "-c",
			"echo rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE "
			"node=$NODE_RANK master=$MASTER_ADDR blas=$OPENBLAS_NUM_THREADS "
			"job=${HPU_JOB_ID:+set} token=${HPU_JOB_TOKEN:+set}", NULL};
	proc p;
	assert_int_equal(h_run(&p, argv, NULL, 30000), 0);
	printf("%s", p.out);
	assert_non_null(strstr(p.out, "[rank 0] rank=0 local=0 world=2 lws=2 node=0 master=127.0.0.1 blas=1 job=set token=set"));
	assert_non_null(strstr(p.out, "[rank 1] rank=1 local=1 world=2 lws=2 node=0 master=127.0.0.1 blas=1 job=set token=set"));
	h_free(&p);
}

/* Collectives initialized from the environment, world sizes 1-4. */
static void test_exec_collectives(void **state)
{
	(void)state;
	for (int ws = 1; ws <= 4; ws++) {
		char dev[8], want[64];
		snprintf(dev, sizeof dev, "%d", ws);
		char *argv[] = {(char *)LAUNCH, "-q", "--devices", dev, "--exec",
				(char *)h_build("bin/coll_env_check"), NULL};
		proc p;
		int code = h_run(&p, argv, NULL, 120000);
		if (code)
			fprintf(stderr, "%s", p.out);
		assert_int_equal(code, 0);
		for (int r = 0; r < ws; r++) {
			snprintf(want, sizeof want, "[rank %d] coll ok: rank %d of %d", r, r, ws);
			assert_non_null(strstr(p.out, want));
		}
		h_free(&p);
	}
}

/* Entries of /dev/shm whose names start with prefix. */
static int shm_entries(const char *prefix)
{
	DIR *d = opendir("/dev/shm");
	struct dirent *e;
	int n = 0;
	while (d && (e = readdir(d)) != NULL)
		n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	if (d)
		closedir(d);
	return n;
}

/* Every transport, forced with --transport, through the environment path;
 * nothing is left in /dev/shm or /tmp afterwards. */
static void test_exec_transports(void **state)
{
	(void)state;
	static const char *transports[] = {"auto", "tcp", "ipc", "shm"};
	for (int t = 0; t < 4; t++) {
		char *argv[] = {(char *)LAUNCH, "--devices", "3", "--job-id", "hpu-test-transports",
				"--transport", (char *)transports[t], "--exec",
				(char *)h_build("bin/coll_env_check"), NULL};
		proc p;
		int code = h_run(&p, argv, NULL, 120000);
		printf("--transport %s: exit %d\n", transports[t], code);
		if (code)
			fprintf(stderr, "%s", p.out);
		assert_int_equal(code, 0);
		assert_non_null(strstr(p.out, "[rank 2] coll ok: rank 2 of 3"));
		h_free(&p);
		assert_int_equal(shm_entries("hpucoll-hpu-test-transports-"), 0);
		assert_int_not_equal(access("/tmp/hpucoll-hpu-test-transports-r0", F_OK), 0);
	}
}

/* An empty file at path owned by nobody (another local user), with mode;
 * 0 (and a line saying the test is skipped) when not root. */
static int nobodys_file(const char *path, mode_t mode)
{
	if (geteuid() != 0) {
		printf("skipped: needs root to make a file as nobody\n");
		return 0;
	}
	unlink(path);
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL, mode);
	assert_true(fd >= 0);
	assert_int_equal(fchown(fd, 65534, 65534), 0);
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
	return 1;
}

/* Another local user creates the shared-memory segment a job with a known
 * job id would have used, first (an empty file, mode 0666): the job's
 * segment name carries a random part from the coordinator, so the job
 * neither adopts nor waits on the squatter's file, and leaves it alone. */
static void test_shm_squatted_name(void **state)
{
	(void)state;
	const char *path = "/dev/shm/hpucoll-hpu-test-squat-n0";
	if (!nobodys_file(path, 0666))
		return;
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--job-id", "hpu-test-squat",
			"--transport", "shm", "--exec", (char *)h_build("bin/coll_env_check"),
			NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	printf("job beside a squatted segment name: exit %d\n", code);
	if (code)
		fprintf(stderr, "%s", p.out);
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "[rank 1] coll ok: rank 1 of 2"));
	h_free(&p);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_uid, 65534);
	assert_int_equal(st.st_size, 0);
	unlink(path);
}

/* Another user's file at a worker's ipc path (/tmp/hpucoll-<job>-r0): the
 * worker fails at once naming the path and its owner (under the default
 * --data-plane auth it used to hang until the join timeout), and the
 * cleanup after the job leaves the file alone (it used to remove it, as
 * root). */
static void test_ipc_squatted_path(void **state)
{
	(void)state;
	const char *path = "/tmp/hpucoll-hpu-test-ipcsquat-r0";
	if (!nobodys_file(path, 0644))
		return;
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--job-id", "hpu-test-ipcsquat",
			"--transport", "ipc", "--exec", (char *)h_build("bin/coll_env_check"),
			NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	printf("job with another user's file at its ipc path: exit %d\n", code);
	if (code <= 0)
		fprintf(stderr, "%s", p.out);
	assert_true(code > 0);
	assert_non_null(strstr(p.out, "cannot bind ipc:///tmp/hpucoll-hpu-test-ipcsquat-r0: "
				      "the path exists and is owned by uid 65534"));
	h_free(&p);
	struct stat st;
	assert_int_equal(lstat(path, &st), 0);
	assert_int_equal(st.st_uid, 65534);
	unlink(path);
}

/* A model that calls exit(0) in the middle of training: the job fails,
 * naming the rank that left, with one rank and with two (where the
 * survivor must not be blamed), and without --max-restarts hiding it. */
static void test_worker_leaves_early(void **state)
{
	(void)state;
	for (int world = 1; world <= 2; world++) {
		char devices[8], rank[8];
		snprintf(devices, sizeof devices, "%d", world);
		snprintf(rank, sizeof rank, "%d", world - 1);
		char *argv[] = {(char *)LAUNCH, "--devices", devices, "--max-steps", "20",
				"--log-every", "0", "--no-eval", (char *)FAULT_MODEL, "--",
				"--hidden", "16", "--exit-rank", rank, "--exit-at", "3", NULL};
		proc p;
		int code = h_run(&p, argv, NULL, 120000);
		printf("%d rank(s), rank %s calls exit(0) at step 3: exit %d\n%s", world, rank,
		       code, p.out);
		assert_int_equal(code, 1);
		char want[96];
		snprintf(want, sizeof want, "hpulaunch: error: rank %s (node 0, pid ", rank);
		const char *e = strstr(p.out, want);
		assert_non_null(e);
		const char *nl = strchr(e, '\n');
		const char *why = strstr(e, "exited with code 0 before the job ended (in step 3 of 20)");
		assert_true(why && (!nl || why < nl));
		h_free(&p);
	}
}

/* A worker that crashes (a model writing through a bad pointer) says so
 * before it dies: the signal, the address and a backtrace whose frames
 * name the model's library, so that a crash on a machine without a
 * debugger (a GPU machine) can be placed; the job fails naming the rank. */
static void test_worker_crash_reported(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--max-steps", "20", "--log-every", "0",
			"--no-eval", (char *)FAULT_MODEL, "--", "--hidden", "16", "--crash-rank", "1",
			"--crash-at", "3", NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	printf("rank 1 crashes at step 3: exit %d\n%s", code, p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "rank 1: crashed: signal 11 (Segmentation fault) at 0x10"));
	const char *bt = strstr(p.out, "rank 1: backtrace:");
	assert_non_null(bt);
	assert_non_null(strstr(bt, "fault_mlp.so("));
	assert_non_null(strstr(p.out, "was killed by signal 11 (Segmentation fault)"));
	h_free(&p);
}

/* Two nodes (two hpulaunch processes) on loopback; node 1's hpulaunch is
 * killed (SIGKILL: its workers die with it) mid-run. Rank 0 finds rank 1's
 * connection gone, and node 0's error names rank 1 on node 1 as the
 * cause, from that report (not the node's silence, nor rank 0's exit). */
static void test_node_killed_blamed(void **state)
{
	(void)state;
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	proc n0, n1;
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--max-steps", "100000", "--log-every", "1",
		      "--no-eval", (char *)MODEL, "--", "--hidden", "16", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--max-steps", "100000", "--log-every", "1",
		      "--no-eval", (char *)MODEL, "--", "--hidden", "16", NULL};
	assert_int_equal(h_start(&n0, a0, env), 0);
	assert_int_equal(h_start(&n1, a1, env), 0);
	assert_int_equal(h_wait_for(&n0, "step 3/", 120000), 0);
	kill(n1.pid, SIGKILL);
	int e0 = h_wait(&n0, 60000);
	h_wait(&n1, 10000);
	const char *err = n0.out ? strstr(n0.out, "hpulaunch: error: ") : NULL;
	printf("node 0: exit %d: %.300s\n", e0 ? -1 : h_code(&n0), err ? err : "(no error)");
	if (e0)
		h_kill(&n0);
	assert_int_equal(e0, 0);
	assert_int_equal(h_code(&n0), 1);
	assert_non_null(err);
	if (strncmp(err, "hpulaunch: error: rank 1 (node 1, pid ", 38) ||
	    !strstr(err, ") died; rank 0 found it gone"))
		fail_msg("node 0's error does not blame rank 1 on node 1:\n%s", n0.out);
	h_free(&n0);
	h_free(&n1);
}

/* Two nodes (two hpulaunch processes) on loopback train together. */
static void test_two_nodes(void **state)
{
	(void)state;
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	proc n0, n1;
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--max-steps", "5", "--log-every", "1",
		      (char *)MODEL, "--", "--hidden", "64", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--max-steps", "5", "--log-every", "1",
		      (char *)MODEL, "--", "--hidden", "64", NULL};
	assert_int_equal(h_start(&n0, a0, env), 0);
	assert_int_equal(h_start(&n1, a1, env), 0);
	int e0 = h_wait(&n0, 120000), e1 = h_wait(&n1, 30000);
	printf("node 0:\n%s\nnode 1:\n%s\n", n0.out, n1.out);
	if (e0)
		h_kill(&n0);
	if (e1)
		h_kill(&n1);
	assert_int_equal(e0, 0);
	assert_int_equal(e1, 0);
	assert_int_equal(h_code(&n0), 0);
	assert_int_equal(h_code(&n1), 0);
	assert_non_null(strstr(n0.out, "[rank 0] trained 5 steps on 2 workers"));
	assert_non_null(strstr(n0.out, "[rank 0] test accuracy"));
	h_free(&n0);
	h_free(&n1);
}

/* A worker killed on node 1 fails the job on node 0 too, naming it. */
static void test_two_nodes_remote_failure(void **state)
{
	(void)state;
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	proc n0, n1;
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--epochs", "20", "--log-every", "2",
		      (char *)MODEL, "--", "--hidden", "64", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--epochs", "20", "--log-every", "2",
		      (char *)MODEL, "--", "--hidden", "64", NULL};
	assert_int_equal(h_start(&n0, a0, env), 0);
	assert_int_equal(h_start(&n1, a1, env), 0);
	int seen = h_wait_for(&n0, "step 4/", 60000);
	pid_t k1[4], k0[4];
	int c1 = h_children(n1.pid, k1, 4), c0 = h_children(n0.pid, k0, 4);
	if (seen || c1 != 1) {
		h_kill_groups(k0, c0);
		h_kill_groups(k1, c1);
		h_kill(&n0);
		h_kill(&n1);
		fail_msg("training did not start: %s", n0.out);
	}
	kill(k1[0], SIGKILL);
	int e0 = h_wait(&n0, 15000), e1 = h_wait(&n1, 15000);
	int alive = h_alive(k0[0]) || h_alive(k1[0]);
	h_kill_groups(k0, c0);
	h_kill_groups(k1, c1);
	if (e0)
		h_kill(&n0);
	if (e1)
		h_kill(&n1);
	printf("node 0:\n%s\nnode 1:\n%s\n", n0.out, n1.out);
	char want[96];
	snprintf(want, sizeof want, "rank 1 (node 1, pid %d) was killed by signal 9", (int)k1[0]);
	assert_int_equal(e0, 0);
	assert_int_equal(e1, 0);
	assert_int_equal(h_code(&n0), 1);
	assert_int_equal(h_code(&n1), 1);
	assert_non_null(strstr(n0.out, want));
	assert_non_null(strstr(n1.out, want));
	assert_false(alive);
	h_free(&n0);
	h_free(&n1);
}

/* torchrun style, every node runs the same --devices: node 1's hpulaunch
 * with another count is refused by node 0's coordinator, which names why,
 * and both fail. */
static void test_two_nodes_devices_differ(void **state)
{
	(void)state;
	char port[16];
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--join-timeout", "5", "--exec", "sleep", "60", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "2", "--node-rank", "1",
		      "--master-port", port, "--join-timeout", "5", "--exec", "sleep", "60", NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, env, 60000, &n1, a1, env, 60000);
	assert_int_equal(h_code(&n0), 1);
	assert_int_equal(h_code(&n1), 1);
	assert_non_null(strstr(n0.out, "refused agent of node 1: its --nodes/--devices differ from node 0's"));
	assert_non_null(strstr(n1.out, "its --nodes/--devices differ from node 0's"));
	h_free(&n0);
	h_free(&n1);
}

/* Two nodes whose copies of the --config file differ (lr 0.001 and 0.5,
 * and the batch size) would train together to a useless model: the ranks
 * compare their options at start-up, and every rank fails naming the
 * ranks and the options that differ, with both values. */
static void test_two_nodes_options_differ(void **state)
{
	(void)state;
	char dir[] = "/tmp/hpu-test-optsdiff-XXXXXX", c0[64], c1[64], port[16];
	assert_non_null(mkdtemp(dir));
	snprintf(c0, sizeof c0, "%s/c0.json", dir);
	snprintf(c1, sizeof c1, "%s/c1.json", dir);
	assert_int_equal(h_write_file(c0, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}}", 0644), 0);
	assert_int_equal(h_write_file(c1, "{\"train_batch_size\": 128, \"optimizer\": "
					  "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.5}}}", 0644), 0);
	snprintf(port, sizeof port, "%d", h_free_port());
	char *env[] = {"HPU_JOB_TOKEN=shared-secret", NULL};
	/* the metrics file is rank 0's alone: it may differ */
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--max-steps", "3", "--config", c0,
		      "--metrics", "/dev/null", (char *)MODEL, "--", "--hidden", "64", NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--max-steps", "3", "--config", c1,
		      (char *)MODEL, "--", "--hidden", "64", NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, env, 120000, &n1, a1, env, 30000);
	unlink(c0);
	unlink(c1);
	rmdir(dir);
	assert_int_equal(h_code(&n0), 1);
	assert_int_equal(h_code(&n1), 1);
	const char *want = "the ranks' training options differ: rank 1 differs from rank 0 in "
			   "--batch-size (128 vs 256), --micro-batch-size (64 vs 128), --lr (0.5 vs 0.001)";
	assert_non_null(strstr(n0.out, want));
	assert_non_null(strstr(n1.out, want));
	assert_null(strstr(n0.out, "trained"));
	h_free(&n0);
	h_free(&n1);
}

/* The launch environment in torchrun's and DeepSpeed's names, on two
 * nodes of two workers each (two hpulaunch, loopback), before and after a
 * restart: each rank writes what it sees to DIR/rRANK.COUNT; on the first
 * attempt rank 3 exits 3 once every rank has written, and the job runs
 * again. Node 0 runs without OMP_NUM_THREADS (its workers get 1), node 1
 * with OMP_NUM_THREADS=4 (kept). */
static void test_torchrun_env_two_nodes(void **state)
{
	(void)state;
	char dir[64], port[16], script[2048];
	h_scratch_dir(dir, sizeof dir);
	snprintf(port, sizeof port, "%d", h_free_port());
	snprintf(script, sizeof script,
		 "echo \"rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE "
		 "node=$NODE_RANK group=$GROUP_RANK role_rank=$ROLE_RANK role_ws=$ROLE_WORLD_SIZE "
		 "count=$TORCHELASTIC_RESTART_COUNT max=$TORCHELASTIC_MAX_RESTARTS "
		 "run=$TORCHELASTIC_RUN_ID cross_rank=$CROSS_RANK cross_size=$CROSS_SIZE "
		 "local_size=$LOCAL_SIZE omp=${OMP_NUM_THREADS-unset}\" > %s/.r$RANK && "
		 "mv %s/.r$RANK %s/r$RANK.$HPU_RESTART_COUNT; "
		 "if [ \"$HPU_RESTART_COUNT\" = 0 ]; then "
		 "  if [ \"$RANK\" = 3 ]; then "
		 "    while [ ! -e %s/r0.0 ] || [ ! -e %s/r1.0 ] || [ ! -e %s/r2.0 ]; do sleep 0.05; done; "
		 "    exit 3; "
		 "  fi; exec sleep 300; "
		 "fi",
		 dir, dir, dir, dir, dir, dir);
	unsetenv("OMP_NUM_THREADS"); /* node 0's workers must see it unset */
	char *env0[] = {"HPU_JOB_TOKEN=env-secret", NULL};
	char *env1[] = {"HPU_JOB_TOKEN=env-secret", "OMP_NUM_THREADS=4", NULL};
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "2", "--node-rank", "0",
		      "--master-port", port, "--job-id", "envjob", "--max-restarts", "1",
		      "--exec", "/bin/sh", "-c", script, NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "2", "--node-rank", "1",
		      "--master-port", port, "--job-id", "envjob", "--max-restarts", "1",
		      "--exec", "/bin/sh", "-c", script, NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, env0, 120000, &n1, a1, env1, 30000);
	assert_int_equal(h_code(&n0), 0);
	assert_int_equal(h_code(&n1), 0);
	assert_non_null(strstr(n1.out, "restarting (restart 1 of 1)"));
	for (int count = 0; count < 2; count++)
		for (int r = 0; r < 4; r++) {
			char name[16], want[400];
			int node = r / 2;
			snprintf(name, sizeof name, "r%d.%d", r, count);
			snprintf(want, sizeof want,
				 "rank=%d local=%d world=4 lws=2 node=%d group=%d role_rank=%d role_ws=4 "
				 "count=%d max=1 run=envjob cross_rank=%d cross_size=2 local_size=2 omp=%s\n",
				 r, r % 2, node, node, r, count, node, node ? "4" : "1");
			if (!h_file_has(dir, name, want))
				fail_msg("%s/%s does not hold: %s", dir, name, want);
		}
	assert_false(h_file_exists(dir, "r0.2"));
	h_free(&n0);
	h_free(&n1);
	assert_int_equal(h_rmtree(dir), 0);
}

/* ---- torchrun's spellings ---- */

/* --standalone --nproc-per-node 2 trains the model; the coordinator is on
 * loopback at a port of its own, whatever MASTER_ADDR, MASTER_PORT and
 * NODE_RANK say. */
static void test_torchrun_standalone_trains(void **state)
{
	(void)state;
	char *env[] = {"MASTER_ADDR=10.255.255.1", "MASTER_PORT=1", "NODE_RANK=3", NULL};
	char *argv[] = {(char *)LAUNCH, "--standalone", "--nproc-per-node", "2", "--max-steps",
			"3", "--log-every", "1", "--no-eval", (char *)MODEL, "--", "--hidden", "32",
			NULL};
	proc p;
	int code = h_run(&p, argv, env, 120000);
	printf("%s", p.out);
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "node 0 of 1, ranks 0-1 of 2, coordinator 127.0.0.1:"));
	assert_null(strstr(p.out, "coordinator 127.0.0.1:1\n"));
	assert_non_null(strstr(p.out, "[rank 0] trained 3 steps on 2 workers"));
	h_free(&p);
}

/* What the workers of --standalone --nproc_per_node see, and
 * --nproc-per-node auto and cpu: one worker per core. */
static void test_torchrun_standalone_env(void **state)
{
	(void)state;
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	char *env[] = {"MASTER_ADDR=10.255.255.1", "MASTER_PORT=1", NULL};
	const char *echo = "echo \"rank=$RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE "
			   "nodes=$NNODES master=$MASTER_ADDR port=$MASTER_PORT\"";
	static const char *counts[] = {"2", "auto", "cpu"};
	for (int i = 0; i < 3; i++) {
		char *argv[] = {(char *)LAUNCH, "-q", "--standalone", "--nproc_per_node",
				(char *)counts[i], "--exec", "/bin/sh", "-c", (char *)echo, NULL};
		proc p;
		int code = h_run(&p, argv, env, 60000);
		printf("--nproc_per_node %s: exit %d\n%s", counts[i], code, p.out);
		assert_int_equal(code, 0);
		long n = i == 0 ? 2 : cores;
		for (long r = 0; r < n; r++) {
			char want[256];
			snprintf(want, sizeof want, "[rank %ld] rank=%ld world=%ld lws=%ld nodes=1 master=127.0.0.1 port=",
				 r, r, n, n);
			const char *at = strstr(p.out, want);
			assert_non_null(at);
			int port = atoi(at + strlen(want));
			assert_true(port > 1 && port <= 65535);
		}
		char extra[32];
		snprintf(extra, sizeof extra, "[rank %ld]", n);
		assert_null(strstr(p.out, extra));
		h_free(&p);
	}
}

/* Two nodes torchrun style in torchrun's words: node 0 with
 * --rdzv-endpoint, --nnodes N:N, --node_rank and --rdzv-id; node 1 with
 * --master_addr, --master_port, --rdzv_id, --max_restarts. They meet and
 * run the collectives; the workers see the job id as TORCHELASTIC_RUN_ID
 * and HPU_JOB_ID. */
static void test_torchrun_two_nodes_aliases(void **state)
{
	(void)state;
	char port[16], endpoint[32], script[512];
	snprintf(port, sizeof port, "%d", h_free_port());
	snprintf(endpoint, sizeof endpoint, "127.0.0.1:%s", port);
	snprintf(script, sizeof script,
		 "echo \"run=$TORCHELASTIC_RUN_ID job=$HPU_JOB_ID node=$NODE_RANK port=$MASTER_PORT "
		 "max=$TORCHELASTIC_MAX_RESTARTS\"; exec %s",
		 h_build("bin/coll_env_check"));
	char *env[] = {"HPU_JOB_TOKEN=alias-secret", NULL};
	char *a0[] = {(char *)LAUNCH, "--nnodes", "2:2", "--nproc-per-node", "1", "--node_rank",
		      "0", "--rdzv-endpoint", endpoint, "--rdzv-id", "torchjob", "--max_restarts",
		      "1", "--exec", "/bin/sh", "-c", script, NULL};
	char *a1[] = {(char *)LAUNCH, "--nnodes", "2", "--nproc_per_node", "1", "--node-rank",
		      "1", "--master_addr", "127.0.0.1", "--master_port", port, "--rdzv_id",
		      "torchjob", "--max_restarts", "1", "--exec", "/bin/sh", "-c", script, NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, env, 120000, &n1, a1, env, 30000);
	assert_int_equal(h_code(&n0), 0);
	assert_int_equal(h_code(&n1), 0);
	char want[128];
	snprintf(want, sizeof want, "[rank 0] run=torchjob job=torchjob node=0 port=%s max=1", port);
	assert_non_null(strstr(n0.out, want));
	snprintf(want, sizeof want, "[rank 1] run=torchjob job=torchjob node=1 port=%s max=1", port);
	assert_non_null(strstr(n1.out, want));
	assert_non_null(strstr(n0.out, "[rank 0] coll ok: rank 0 of 2"));
	assert_non_null(strstr(n1.out, "[rank 1] coll ok: rank 1 of 2"));
	h_free(&n0);
	h_free(&n1);
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

/* ---- processes a job's workers leave behind ---- */

#define SETSID_MODEL h_build("lib/setsid_child.so")

/* The pid the fixture setsid_child wrote for `rank` into dir, or -1. */
static pid_t leftover_pid(const char *dir, int rank)
{
	char path[256];
	snprintf(path, sizeof path, "%s/child.%d", dir, rank);
	char *s = h_slurp(path);
	pid_t pid = s ? (pid_t)atoi(s) : -1;
	free(s);
	return pid > 0 ? pid : -1;
}

/* Waits up to timeout_ms for both ranks' pid files; 0 when both are there. */
static int wait_leftover_pids(const char *dir, pid_t pids[2], int timeout_ms)
{
	for (int waited = 0;; waited += 50) {
		pids[0] = leftover_pid(dir, 0);
		pids[1] = leftover_pid(dir, 1);
		if (pids[0] > 0 && pids[1] > 0)
			return 0;
		if (waited >= timeout_ms)
			return -1;
		usleep(50000);
	}
}

/* Whether pid is gone altogether: not even a zombie (kill says ESRCH). */
static int gone(pid_t pid)
{
	return kill(pid, 0) == -1 && errno == ESRCH;
}

/* What a failed test must not leave sleeping for 300 s. */
static void kill_setsid_children(const char *dir)
{
	for (int r = 0; r < 2; r++) {
		pid_t pid = leftover_pid(dir, r);
		if (pid > 0)
			kill(pid, SIGKILL);
	}
}

/* Each rank of the model forks a child that calls setsid() and sleeps
 * with the worker's stdout, stderr and status pipe open. Training ends:
 * hpulaunch exits 0 soon after (not when the children's pipes close, 300
 * s later), says it ended the 2 processes left behind, and they are gone,
 * reaped. */
static void test_setsid_child_after_training(void **state)
{
	(void)state;
	char dir[64];
	h_scratch_dir(dir, sizeof dir);
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "2", "--max-steps", "3", "--no-eval",
			"--batch-size", "16", "--log-every", "1", (char *)SETSID_MODEL, "--",
			"--pid-dir", dir, NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	int exited = h_wait(&p, 60000);
	if (exited)
		h_kill(&p);
	pid_t pids[2] = {leftover_pid(dir, 0), leftover_pid(dir, 1)};
	int left[2] = {pids[0] > 0 && !gone(pids[0]), pids[1] > 0 && !gone(pids[1])};
	kill_setsid_children(dir);
	printf("%s", p.out);
	if (exited)
		fail_msg("hpulaunch still ran 60 s after starting a 3-step job");
	assert_int_equal(h_code(&p), 0);
	assert_non_null(strstr(p.out, "step 3/3"));
	assert_true(pids[0] > 0 && pids[1] > 0);
	assert_false(left[0]);
	assert_false(left[1]);
	assert_non_null(strstr(p.out, "hpulaunch: ended 2 processes left behind by the job's workers"));
	h_free(&p);
	assert_int_equal(h_rmtree(dir), 0);
}

/* SIGTERM to hpulaunch while the workers train and their setsid()
 * children sleep: it exits 143 and the children are gone too. */
static void test_setsid_child_sigterm(void **state)
{
	(void)state;
	char dir[64];
	h_scratch_dir(dir, sizeof dir);
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--epochs", "1000", "--no-eval",
			"--batch-size", "16", "--log-every", "1", (char *)SETSID_MODEL, "--",
			"--pid-dir", dir, "--step-ms", "50", NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	pid_t pids[2];
	int up = wait_leftover_pids(dir, pids, 60000) == 0 && h_wait_for(&p, "step 2/", 60000) == 0;
	if (!up || !h_alive(pids[0]) || !h_alive(pids[1])) {
		h_kill(&p);
		kill_setsid_children(dir);
		fail_msg("training or the setsid children did not start: %s", p.out);
	}
	kill(p.pid, SIGTERM);
	int exited = h_wait(&p, 60000);
	if (exited)
		h_kill(&p);
	int left[2] = {!gone(pids[0]), !gone(pids[1])};
	kill_setsid_children(dir);
	printf("%s", p.out);
	if (exited)
		fail_msg("hpulaunch still ran 60 s after SIGTERM");
	assert_int_equal(h_code(&p), 128 + SIGTERM);
	assert_non_null(strstr(p.out, "interrupted by SIGTERM"));
	assert_false(left[0]);
	assert_false(left[1]);
	assert_non_null(strstr(p.out, "hpulaunch: ended 2 processes left behind by the job's workers"));
	h_free(&p);
	assert_int_equal(h_rmtree(dir), 0);
}

/* The TCP ports process pid listens on; returns how many (at most max). */
static int listening_ports(pid_t pid, int *ports, int max)
{
	char path[64], link[64], line[512];
	unsigned long inodes[64];
	int ni = 0, n = 0;
	struct dirent *d;
	DIR *dir;
	FILE *f;

	snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
	if ((dir = opendir(path)) == NULL)
		return 0;
	while ((d = readdir(dir)) != NULL && ni < 64) {
		char fd[330];
		ssize_t len;

		snprintf(fd, sizeof fd, "%s/%s", path, d->d_name);
		len = readlink(fd, link, sizeof link - 1);
		if (len > 0) {
			link[len] = '\0';
			if (sscanf(link, "socket:[%lu]", &inodes[ni]) == 1)
				ni++;
		}
	}
	closedir(dir);
	if ((f = fopen("/proc/net/tcp", "r")) == NULL)
		return 0;
	while (fgets(line, sizeof line, f) && n < max) {
		unsigned port, st;
		unsigned long inode;

		if (sscanf(line, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu",
			   &port, &st, &inode) != 3 || st != 0x0A)
			continue;
		for (int i = 0; i < ni; i++)
			if (inodes[i] == inode)
				ports[n++] = (int)port;
	}
	fclose(f);
	return n;
}

/* The RANK in the environment of process pid (-1 if unknown). */
static int worker_rank(pid_t pid)
{
	char path[64], buf[8192];
	snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
	int fd = open(path, O_RDONLY), rank = -1;
	ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
	if (fd >= 0)
		close(fd);
	if (n > 0)
		buf[n] = '\0';
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1) {
		if (!strncmp(buf + i, "RANK=", 5))
			rank = atoi(buf + i + 5);
	}
	return rank;
}

/* What issue 16 found: any local process could end a job by sending one
 * forged ABORT to a worker's data port. Sends one to every port every
 * worker of p listens on; returns how many it sent. */
static int forge_aborts(void *ctx, const proc *p)
{
	static const char why[] = "rank 1 ran out of memory (forged)";
	struct hpucoll__hdr h = {.magic = HPUCOLL__MAGIC, .src = 1, .seq = 1,
				 .kind = HPUCOLL__ABORT, .arg = HPUCOLL_ENOMEM,
				 .len = sizeof why - 1};
	unsigned char b[HPUCOLL__HDR_SIZE];
	pid_t kids[8];
	int sent = 0, linger = 200;

	for (int k = 0, n = h_children(p->pid, kids, 8); k < n; k++) {
		int ports[8], np = listening_ports(kids[k], ports, 8);

		/* From the other rank of the two: a frame that claims to come
		 * from its receiver is refused as malformed, not believed. */
		h.src = worker_rank(kids[k]) == 0 ? 1 : 0;
		hpucoll__hdr_encode(b, &h);

		for (int i = 0; i < np; i++) {
			char ep[64];
			void *s = zmq_socket(ctx, ZMQ_PUSH);

			snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ports[i]);
			zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
			if (zmq_connect(s, ep) == 0 &&
			    zmq_send(s, b, sizeof b, ZMQ_SNDMORE) == (int)sizeof b &&
			    zmq_send(s, why, sizeof why - 1, 0) == (int)sizeof why - 1)
				sent++;
			zmq_close(s);
		}
	}
	return sent;
}

/* A 2-worker TCP job under --data-plane `mode`, attacked until it ends;
 * its output in out (caller frees) and its exit code returned. */
static int attacked_job(const char *mode, char **out)
{
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--transport", "tcp",
			"--data-plane", (char *)mode, "--max-steps", "30", (char *)FAULT_MODEL,
			"--sleep-rank", "1", "--sleep-ms", "3000", NULL};
	void *ctx = zmq_ctx_new();
	int sent = 0, code;
	proc p;

	assert_int_equal(h_start(&p, argv, NULL), 0);
	while (h_wait(&p, 200) != 0)
		sent += forge_aborts(ctx, &p);
	zmq_ctx_term(ctx);
	printf("--- --data-plane %s, %d forged frames sent ---\n%s", mode, sent, p.out);
	assert_true(sent > 0);
	code = h_code(&p);
	*out = strdup(p.out);
	h_free(&p);
	return code;
}

static void test_data_plane_refuses_forged_frames(void **state)
{
	(void)state;
	char *out;
	assert_int_equal(attacked_job("auth", &out), 0);
	assert_non_null(strstr(out, "refused a data-plane connection"));
	assert_null(strstr(out, "(forged)"));
	assert_non_null(strstr(out, "trained 30 steps"));
	free(out);
}

/* Without authentication the forgery is the job's root cause. */
static void test_data_plane_none_is_open(void **state)
{
	(void)state;
	char *out;
	assert_int_equal(attacked_job("none", &out), 1);
	assert_non_null(strstr(out, "(forged)"));
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_usage_errors),
		cmocka_unit_test(test_deepspeed_aliases_and_refusals),
		cmocka_unit_test(test_exec_environment),
		cmocka_unit_test(test_exec_collectives),
		cmocka_unit_test(test_exec_transports),
		cmocka_unit_test(test_shm_squatted_name),
		cmocka_unit_test(test_ipc_squatted_path),
		cmocka_unit_test(test_worker_leaves_early),
		cmocka_unit_test(test_worker_crash_reported),
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
		cmocka_unit_test(test_two_workers_match_one_sgd),
		cmocka_unit_test(test_two_workers_match_one_adamw),
		cmocka_unit_test(test_four_workers_match_one_sgd),
		cmocka_unit_test(test_demo_epoch),
		cmocka_unit_test(test_kill_worker),
		cmocka_unit_test(test_sigterm_teardown),
		cmocka_unit_test(test_setsid_child_after_training),
		cmocka_unit_test(test_setsid_child_sigterm),
		cmocka_unit_test(test_data_plane_refuses_forged_frames),
		cmocka_unit_test(test_data_plane_none_is_open),
		cmocka_unit_test(test_wrong_token_and_missing_rank),
		cmocka_unit_test(test_two_nodes),
		cmocka_unit_test(test_node_killed_blamed),
		cmocka_unit_test(test_two_nodes_remote_failure),
		cmocka_unit_test(test_two_nodes_devices_differ),
		cmocka_unit_test(test_two_nodes_options_differ),
		cmocka_unit_test(test_torchrun_env_two_nodes),
		cmocka_unit_test(test_torchrun_standalone_trains),
		cmocka_unit_test(test_torchrun_standalone_env),
		cmocka_unit_test(test_torchrun_two_nodes_aliases),
		cmocka_unit_test(test_torchrun_alias_errors),
	};
	/* HPU_TEST=test_name (a glob) runs only the tests it names. */
	if (getenv("HPU_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPU_TEST"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
