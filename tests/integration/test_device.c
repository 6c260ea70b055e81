/* test_device: the device a worker computes on (--device).
 *
 * - --device cuda where it cannot run (its module missing, not built, no
 *   GPU visible) fails the job with the worker's reason in one line;
 *   --device auto there computes on cpu; --devices auto --device cuda
 *   there stops hpulaunch before any worker, naming why, and --devices
 *   auto --device auto is one worker per CPU core;
 * - the strict CPU device (cpu-strict) catches host code that touches
 *   device memory outside a device call: the fixture peek_param's hook
 *   reads a parameter through the pointer its layer got (a planted
 *   read); the rank exits naming itself, the address and the block, and
 *   the job fails. On cpu the same read passes: it is the strict device
 *   that catches it. Reads through the API (hpu_run_param,
 *   hpu_run_forward) pass on both;
 * - the strategies (ddp, fast_ddp, zero1, zero2, zero3) in fp32 and
 *   bf16-mixed on 2 workers, checkpoint save and resume, both offload
 *   tiers, --save-params and a model's buffers (synchronized, saved,
 *   resumed) run on cpu-strict with the same parameters,
 *   bit for bit, as on cpu;
 * - one DDP step on cpu-strict copies the batch in, the loss out and the
 *   gradients through the collectives' staging, and nothing else;
 * - the host waits for the device three times in an eager step, once in
 *   a recordable or replayed one (--verbose's count);
 * - every strategy in fp32 and bf16-mixed (zero3 with gathered layers,
 *   the host tier, gradient accumulation, a model's buffers, 1 and 2
 *   workers) copies per step exactly the bytes the placement plan says
 *   (worker/strategy/copies.h); on cpu, none; ddp's and fast_ddp's
 *   --verbose plan says the gradients' all-reduce is staged there (the
 *   CPU devices have no collectives of their own, as CUDA IPC is);
 * - a model's own layer that says hpu_layer_params_in_ops but not
 *   hpu_layer_grads_in_ops, and adds to its gradient itself, trains on
 *   cpu (where the library's layers get gradients owed zeros, issue 38)
 *   as on cpu-strict (where nothing does), bit for bit. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <unistd.h>

#include "tests/integration/runlib.h"
#include "worker/device/device.h" /* sizeof(hpu__dev_stepvars) */

/* The step's scalars per step (worker/strategy/strategy_vars.c): the
 * learning rate and Adam's beta powers in; the block out after the step and, the step being
 * eager (not recordable), once inside it; the loss's sums read after
 * each micro-step's backward and after the step. */
#define STEP_IN 24ull
#define STEP_OUT (2ull * sizeof(hpu__dev_stepvars))
#define LOSS_OUT(micro) (2ull * 8 * (micro))

#define PEEK h_build("lib/peek_param.so")
#define BUFMODEL h_build("lib/buffer_model.so")
#define MLP_ARGS "--hidden 64 --depth 3"

/* Runs the MLP on `device` with 2 workers, 4 steps of 64, and `extra`
 * (NULL-ended), saving the parameters to `path`. */
static void mlp_run(const char *device, const char *path, const char *const *extra)
{
	run r;
	start(&r, 2);
	args(&r, "--device", device, "--max-steps", "4", "--batch-size", "64", "--optimizer",
	     "adamw", "--save-params", path, NULL);
	for (; extra && *extra; extra++)
		arg(&r, *extra);
	free(finish(&r, 0, MLP_ARGS));
}

/* The same run on cpu and on cpu-strict: their --save-params files are
 * equal byte for byte. */
static void same_on_both(const char *name, const char *const *extra)
{
	char a[64], b[64];
	snprintf(a, sizeof a, "/tmp/hpu-dev-%d-cpu.bin", (int)getpid());
	snprintf(b, sizeof b, "/tmp/hpu-dev-%d-strict.bin", (int)getpid());
	mlp_run("cpu", a, extra);
	mlp_run("cpu-strict", b, extra);
	size_t na, nb;
	char *pa = h_slurp_n(a, &na), *pb = h_slurp_n(b, &nb);
	assert_non_null(pa);
	assert_non_null(pb);
	int same = na == nb && memcmp(pa, pb, na) == 0;
	printf("  %-40s cpu-strict %s cpu (%zu bytes of parameters)\n", name,
	       same ? "equals" : "DIFFERS FROM", na);
	assert_true(same);
	free(pa);
	free(pb);
	unlink(a);
	unlink(b);
}

/* --device cuda (by `opt`, NULL: HPU_DEVICE) where it cannot run: rank
 * 0's worker says `why` in one line naming its rank, and the job fails. */
static void cuda_fails(const char *opt, const char *val, const char *why)
{
	run r;
	start(&r, 1);
	if (opt)
		args(&r, opt, val, NULL);
	char *out = finish(&r, 1, MLP_ARGS);
	const char *line = strstr(out, "rank 0");
	assert_non_null(line);
	printf("  %.*s\n", (int)strcspn(line, "\n"), line);
	assert_non_null(strstr(out, why));
	free(out);
}

static void test_cuda_fails_with_reason(void **state)
{
	(void)state;
	/* a module that is not there: dlopen's reason */
	setenv("HPU_CUDA_MODULE", "/nonexistent/hpudev_cuda.so", 1);
	cuda_fails("--device", "cuda",
		   "--device cuda: cannot load the CUDA device's module: /nonexistent/hpudev_cuda.so");
	/* the configuration file's key */
	char path[64];
	snprintf(path, sizeof path, "/tmp/hpu-dev-cfg-%d.json", (int)getpid());
	assert_int_equal(h_write_file(path, "{\"hputrain\": {\"device\": \"cuda\"}}\n", 0600), 0);
	cuda_fails("--config", path, "--device cuda: cannot load the CUDA device's module");
	unlink(path);
	/* the environment, when no option says otherwise */
	setenv("HPU_DEVICE", "cuda", 1);
	cuda_fails(NULL, NULL, "--device cuda: cannot load the CUDA device's module");
	run r;
	start(&r, 1);
	args(&r, "--device", "cpu", "--max-steps", "1", NULL);
	free(finish(&r, 0, MLP_ARGS)); /* the option wins */
	unsetenv("HPU_DEVICE");
	unsetenv("HPU_CUDA_MODULE");
	/* this build's module on this machine: not built, or no GPU (a
	 * machine with NVIDIA's driver is test_cuda_device's) */
	if (access("/dev/nvidiactl", F_OK) == 0) {
		printf("  NVIDIA's driver is here: --device cuda's failure not checked\n");
		return;
	}
	run c;
	start(&c, 1);
	args(&c, "--device", "cuda", NULL);
	char *out = finish(&c, 1, MLP_ARGS);
	const char *line = strstr(out, "--device cuda: ");
	printf("  %.*s\n", line ? (int)strcspn(line, "\n") : 0, line ? line : "");
	assert_true(strstr(out, "--device cuda: no GPU is visible (") ||
		    strstr(out, "--device cuda: the CUDA device is not built in this build"));
	/* no driver at all is said so (CUDA's words asked for a newer one) */
	void *drv = dlopen("libcuda.so.1", RTLD_LAZY);
	if (drv)
		dlclose(drv);
	else if (strstr(out, "no GPU is visible ("))
		assert_non_null(strstr(out, "--device cuda: no GPU is visible (no NVIDIA driver: "
					    "libcuda.so.1 cannot be loaded)"));
	free(out);
}

/* --device auto without a GPU computes on cpu, and says so with
 * --verbose. */
static void test_auto_is_cpu(void **state)
{
	(void)state;
	if (access("/dev/nvidiactl", F_OK) == 0) {
		printf("  NVIDIA's driver is here: auto may be cuda, not checked\n");
		return;
	}
	run r;
	start(&r, 2);
	args(&r, "--device", "auto", "--max-steps", "2", "--verbose", NULL);
	char *out = finish(&r, 0, MLP_ARGS);
	assert_non_null(strstr(out, "rank 0: device cpu (--device auto)"));
	assert_non_null(strstr(out, "rank 1: device cpu (--device auto)"));
	free(out);
}

/* --allow-tf32 (and its key, hputrain.allow_tf32) reaches every worker
 * from hpulaunch; on the CPU devices it is accepted and --verbose says it
 * changes nothing there. Without it, nothing is said. */
static void test_allow_tf32(void **state)
{
	(void)state;
	run r;
	start(&r, 2);
	args(&r, "--device", "cpu", "--allow-tf32", "--max-steps", "1", "--verbose", NULL);
	char *out = finish(&r, 0, MLP_ARGS);
	const char *line = strstr(out, "rank 1: --allow-tf32");
	printf("  %.*s\n", line ? (int)strcspn(line, "\n") : 0, line ? line : "");
	assert_non_null(strstr(out, "rank 0: --allow-tf32 has no effect on device cpu: its fp32 "
				    "products stay fp32"));
	assert_non_null(strstr(out, "rank 1: --allow-tf32 has no effect on device cpu: its fp32 "
				    "products stay fp32"));
	free(out);
	char path[64];
	snprintf(path, sizeof path, "/tmp/hpu-dev-tf32-%d.json", (int)getpid());
	assert_int_equal(h_write_file(path, "{\"hputrain\": {\"allow_tf32\": true}}\n", 0600), 0);
	start(&r, 1);
	args(&r, "--device", "cpu-strict", "--config", path, "--max-steps", "1", "--verbose", NULL);
	out = finish(&r, 0, MLP_ARGS);
	unlink(path);
	assert_non_null(strstr(out, "rank 0: --allow-tf32 has no effect on device cpu-strict"));
	free(out);
	start(&r, 1);
	args(&r, "--device", "cpu", "--max-steps", "1", "--verbose", NULL);
	out = finish(&r, 0, MLP_ARGS);
	assert_null(strstr(out, "--allow-tf32 has no effect"));
	free(out);
}

/* hpulaunch --devices auto --device D, with `extra` (NULL-ended);
 * asserts exit code `want`. */
static char *devices_auto(const char *device, int want, const char *const *extra)
{
	run r;
	r.n = 0;
	args(&r, LAUNCH, "-q", "--devices", "auto", "--device", device, "--no-eval", "--log-every",
	     "0", NULL);
	for (; extra && *extra; extra++)
		arg(&r, *extra);
	return finish(&r, want, MLP_ARGS);
}

/* --devices auto --device cuda is one worker per GPU: without one,
 * hpulaunch stops before any worker starts, naming why in one line;
 * --devices auto --device auto there is one worker per CPU core. */
static void test_devices_auto(void **state)
{
	(void)state;
	if (access("/dev/nvidiactl", F_OK) == 0) {
		printf("  NVIDIA's driver is here: the count is test_cuda_device's, not checked\n");
		return;
	}
	char *out = devices_auto("cuda", 2, NULL);
	const char *line = strstr(out, "--devices auto --device cuda: ");
	assert_non_null(line);
	printf("  %.*s\n", (int)strcspn(line, "\n"), line);
	assert_true(strstr(out, "--devices auto --device cuda: no GPU is visible (") ||
		    strstr(out, "--devices auto --device cuda: the CUDA device is not built in this build"));
	assert_null(strstr(out, "rank 0")); /* no worker started */
	free(out);
	setenv("HPU_CUDA_MODULE", "/nonexistent/hpudev_cuda.so", 1);
	out = devices_auto("cuda", 2, NULL);
	assert_non_null(strstr(out, "--devices auto --device cuda: cannot load the CUDA device's "
				    "module: /nonexistent/hpudev_cuda.so"));
	free(out);
	unsetenv("HPU_CUDA_MODULE");
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	char batch[32], want[64];
	snprintf(batch, sizeof batch, "%ld", 8 * cores);
	out = devices_auto("auto", 0,
			   (const char *const[]){"--max-steps", "1", "--batch-size", batch, "--verbose", NULL});
	for (long k = 0; k <= cores; k++) {
		snprintf(want, sizeof want, "rank %ld: device cpu (--device auto)", k);
		if (k < cores)
			assert_non_null(strstr(out, want));
		else
			assert_null(strstr(out, want)); /* one per core, no more */
	}
	free(out);
}

static char *peek_run(const char *device, int peek, int want)
{
	run r;
	start(&r, 2);
	args(&r, "--device", device, "--max-steps", "2", "--batch-size", "16", NULL);
	return finish_with(&r, want, PEEK, peek ? "--peek" : NULL);
}

static void test_planted_read_caught(void **state)
{
	(void)state;
	char *out = peek_run("cpu-strict", 1, 1);
	/* both ranks fault; the first to do so may end the job before the
	 * other prints, so either rank's line will do */
	const char *line = strstr(out, "hpu-worker: rank 0: host code touched device memory at 0x");
	if (!line)
		line = strstr(out, "hpu-worker: rank 1: host code touched device memory at 0x");
	assert_non_null(line);
	printf("  %.*s\n", (int)strcspn(line, "\n"), line);
	assert_non_null(strstr(line, "(PARAMS block 'parameters') outside a device call under "
				     "--device cpu-strict\n"));
	/* both ranks fault; the launcher names the first to exit */
	assert_true(strstr(out, "hpulaunch: error: rank 0 (node 0") ||
		    strstr(out, "hpulaunch: error: rank 1 (node 0"));
	assert_null(strstr(out, "peeked:"));
	free(out);
}

/* A layer that says it runs on any device (the default) but loops over
 * its tensors itself: cpu-strict's kernels-only mode faults in it, and
 * the line names the layer and the pass (it named only the block). */
static void test_any_device_loop_named(void **state)
{
	(void)state;
	setenv("HPU_STRICT_KERNELS", "1", 1);
	char *out = peek_run("cpu-strict", 0, 1);
	unsetenv("HPU_STRICT_KERNELS");
	const char *line = strstr(out, "host code touched device memory at 0x");
	assert_non_null(line);
	printf("  %.*s\n", (int)strcspn(line, "\n"), line);
	assert_non_null(strstr(line, ") in layer fc's forward (a loop of its own, not an op: "
				     "HPU_LAYER_HOST_ONLY?) outside a device call under --device cpu-strict\n"));
	free(out);
}

static void test_planted_read_passes_on_cpu(void **state)
{
	(void)state;
	char *cpu = peek_run("cpu", 1, 0), *strict = peek_run("cpu-strict", 0, 0);
	assert_non_null(strstr(cpu, "peeked: "));
	/* the API's reads pass on cpu-strict, with the same values */
	const char *a = strstr(cpu, "peek: fc.weight[0] = "), *b = strstr(strict, "peek: fc.weight[0] = ");
	assert_non_null(a);
	assert_non_null(b);
	size_t n = strcspn(a, "\n");
	assert_int_equal(n, strcspn(b, "\n"));
	assert_memory_equal(a, b, n);
	free(cpu);
	free(strict);
}

static void test_strategies_fp32(void **state)
{
	(void)state;
	const char *names[] = {"ddp", "fast_ddp", "zero1", "zero2", "zero3"};
	for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
		const char *extra[] = {"--strategy", names[k], NULL};
		char what[64];
		snprintf(what, sizeof what, "%s fp32, 2 workers", names[k]);
		same_on_both(what, extra);
	}
}

static void test_strategies_bf16(void **state)
{
	(void)state;
	const char *names[] = {"ddp", "zero1", "zero2", "zero3"};
	for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
		const char *extra[] = {"--strategy", names[k], "--precision", "bf16-mixed", NULL};
		char what[64];
		snprintf(what, sizeof what, "%s bf16-mixed, 2 workers", names[k]);
		same_on_both(what, extra);
	}
}

/* Saved after 2 steps, resumed to 4: the same on both devices, and the
 * same as the uninterrupted run. */
static void resumed(const char *strategy, const char *precision)
{
	char dir[64], a[64], b[64], whole[64];
	snprintf(dir, sizeof dir, "/tmp/hpu-dev-ck-%d", (int)getpid());
	const char *devs[] = {"cpu", "cpu-strict"};
	char *paths[] = {a, b};
	for (int d = 0; d < 2; d++) {
		snprintf(paths[d], 64, "/tmp/hpu-dev-%d-resumed-%d.bin", (int)getpid(), d);
		h_rmtree(dir);
		const char *first[] = {"--strategy", strategy, "--precision", precision,
				       "--checkpoint-dir", dir, "--checkpoint-every", "2",
				       "--max-steps", "2", NULL};
		char scratch[64];
		snprintf(scratch, sizeof scratch, "/tmp/hpu-dev-%d-first.bin", (int)getpid());
		mlp_run(devs[d], scratch, first);
		unlink(scratch);
		const char *again[] = {"--strategy", strategy, "--precision", precision,
				       "--resume", dir, NULL};
		mlp_run(devs[d], paths[d], again);
	}
	h_rmtree(dir);
	snprintf(whole, sizeof whole, "/tmp/hpu-dev-%d-whole.bin", (int)getpid());
	const char *plain[] = {"--strategy", strategy, "--precision", precision, NULL};
	mlp_run("cpu", whole, plain);
	size_t na, nb, nw;
	char *pa = h_slurp_n(a, &na), *pb = h_slurp_n(b, &nb), *pw = h_slurp_n(whole, &nw);
	assert_non_null(pa);
	assert_non_null(pb);
	assert_non_null(pw);
	printf("  %s %s: resumed on cpu-strict %s resumed on cpu, %s the run without a stop\n",
	       strategy, precision, na == nb && !memcmp(pa, pb, na) ? "equals" : "DIFFERS FROM",
	       na == nw && !memcmp(pa, pw, na) ? "as" : "NOT as");
	assert_true(na == nb && memcmp(pa, pb, na) == 0);
	assert_true(na == nw && memcmp(pa, pw, na) == 0);
	free(pa);
	free(pb);
	free(pw);
	unlink(a);
	unlink(b);
	unlink(whole);
}

static void test_checkpoint_resume(void **state)
{
	(void)state;
	resumed("zero2", "fp32");
	resumed("ddp", "bf16-mixed");
}

static void test_offload(void **state)
{
	(void)state;
	const char *cpu_tier[] = {"--strategy", "zero3", "--offload-optimizer", "cpu",
				  "--offload-param", "cpu", NULL};
	same_on_both("zero3, both states offloaded to cpu", cpu_tier);
	/* the host's update: zero1's gradients out to it (and their norm on
	 * the device), zero2's pieces landing in the host tier and added
	 * there over micro-steps */
	const char *host1[] = {"--strategy", "zero1", "--precision", "bf16-mixed",
			       "--offload-optimizer", "cpu", "--clip-grad-norm", "0.5", NULL};
	same_on_both("zero1 bf16-mixed, the update on the host, clipped", host1);
	const char *host2[] = {"--strategy", "zero2", "--offload-optimizer", "cpu",
			       "--grad-accum", "2", "--clip-grad-norm", "0.5", NULL};
	same_on_both("zero2, the update on the host, accumulating, clipped", host2);
	const char *host2b[] = {"--strategy", "zero2", "--precision", "bf16-mixed",
				"--offload-optimizer", "cpu", "--grad-accum", "2", NULL};
	same_on_both("zero2 bf16-mixed, the update on the host, accumulating", host2b);
	/* the NVMe tier refuses tmpfs: then a directory in the build tree */
	struct statfs fs;
	int tmpfs = statfs("/tmp", &fs) == 0 && fs.f_type == 0x01021994;
	char nv[300];
	snprintf(nv, sizeof nv, "%s/hpu-dev-nvme.XXXXXX", tmpfs ? h_build("") : "/tmp");
	assert_non_null(mkdtemp(nv));
	const char *nvme[] = {"--strategy", "zero3", "--offload-optimizer", "nvme",
			      "--offload-param", "nvme", "--nvme-path", nv, NULL};
	same_on_both("zero3, both states offloaded to nvme", nvme);
	h_rmtree(nv);
}

/* buffer_model on `device`: 2 steps saved, resumed to 4; its parameters
 * and buffers (the after-training hook's file) into one string. */
static char *buffers_run(const char *device)
{
	char dir[64], params[64], bufs[64], margs[128];
	snprintf(dir, sizeof dir, "/tmp/hpu-dev-bk-%d", (int)getpid());
	snprintf(params, sizeof params, "/tmp/hpu-dev-%d-bp.bin", (int)getpid());
	snprintf(bufs, sizeof bufs, "/tmp/hpu-dev-%d-bb.bin", (int)getpid());
	snprintf(margs, sizeof margs, "--save-buffers %s", bufs);
	h_rmtree(dir);
	for (int pass = 0; pass < 2; pass++) {
		run r;
		start(&r, 2);
		args(&r, "--device", device, "--batch-size", "16", "--strategy", "zero2",
		     "--checkpoint-dir", dir, "--max-steps", pass ? "4" : "2", NULL);
		if (pass)
			args(&r, "--resume", dir, "--save-params", params, NULL);
		else
			args(&r, "--checkpoint-every", "2", NULL);
		free(finish_with(&r, 0, BUFMODEL, margs));
	}
	h_rmtree(dir);
	size_t np, nb;
	char *p = h_slurp_n(params, &np), *bb = h_slurp_n(bufs, &nb);
	assert_non_null(p);
	assert_non_null(bb);
	char *all = malloc(np + nb + 1);
	assert_non_null(all);
	memcpy(all, p, np);
	memcpy(all + np, bb, nb);
	all[np + nb] = 0;
	free(p);
	free(bb);
	unlink(params);
	unlink(bufs);
	return all;
}

/* peek_param --in-ops (its layer promises its parameters to the ops, not
 * its gradients, and adds to them itself), 4 steps fp32 on cpu and on
 * cpu-strict: the same --save-params file, byte for byte. */
static void test_own_layer_in_ops(void **state)
{
	(void)state;
	static const char *const devs[2] = {"cpu", "cpu-strict"};
	char path[2][64];
	char *p[2];
	size_t n[2];
	for (int d = 0; d < 2; d++) {
		snprintf(path[d], sizeof path[d], "/tmp/hpu-dev-%d-own%d.bin", (int)getpid(), d);
		run r;
		start(&r, 1);
		args(&r, "--device", devs[d], "--max-steps", "4", "--batch-size", "64",
		     "--save-params", path[d], NULL);
		free(finish_with(&r, 0, PEEK, "--in-ops"));
		p[d] = h_slurp_n(path[d], &n[d]);
		assert_non_null(p[d]);
		unlink(path[d]);
	}
	int same = n[0] == n[1] && memcmp(p[0], p[1], n[0]) == 0;
	printf("  peek_param --in-ops, 4 steps: cpu-strict %s cpu (%zu bytes)\n",
	       same ? "equals" : "DIFFERS FROM", n[0]);
	assert_true(same);
	free(p[0]);
	free(p[1]);
}

static void test_buffers(void **state)
{
	(void)state;
	char *a = buffers_run("cpu"), *b = buffers_run("cpu-strict");
	/* 4 + 4 + 4 + 1 floats of parameters and buffers */
	assert_memory_equal(a, b, 13 * 4);
	printf("  buffer_model, zero2, resumed: parameters and buffers equal on both devices\n");
	free(a);
	free(b);
}

/* The MLP's parameters: 784 -> 64 -> 64 -> 64 -> 10, weights and biases. */
static size_t mlp_params(void)
{
	size_t n = 0, in = 784;
	for (int i = 0; i <= 3; i++) {
		size_t out = i == 3 ? 10 : 64;
		n += out * in + out;
		in = out;
	}
	return n;
}

static void test_copied_bytes(void **state)
{
	(void)state;
	run r;
	start(&r, 2);
	args(&r, "--device", "cpu-strict", "--strategy", "ddp", "--max-steps", "1", "--batch-size",
	     "64", "--verbose", NULL);
	char *out = finish(&r, 0, MLP_ARGS);
	const char *line = strstr(out, "rank 0: step 1: device cpu-strict copied ");
	assert_non_null(line);
	unsigned long long h2d = 0, d2h = 0;
	assert_int_equal(sscanf(line, "rank 0: step 1: device cpu-strict copied %llu bytes "
				      "host-to-device, %llu bytes device-to-host",
				&h2d, &d2h),
			 2);
	/* per rank: 32 samples of 784 pixels and a label in; the loss's sum
	 * out (one double, summed on the device), the step's scalars in and
	 * out (with the non-finite flag's all-reduce staged: 4 bytes);
	 * the gradients (one bucket, padded to 16 floats) out to the
	 * all-reduce's staging and back */
	unsigned long long batch = 32ull * (784 + 1) * 4, loss = LOSS_OUT(1),
			   grads = (mlp_params() + 15) / 16 * 16 * 4;
	printf("  one ddp step: %llu bytes in (batch %llu + gradients %llu + step %llu), %llu out "
	       "(loss %llu + gradients %llu + step %llu)\n",
	       h2d, batch, grads, STEP_IN + 4, d2h, loss, grads, STEP_OUT + 4);
	assert_int_equal(h2d, batch + grads + STEP_IN + 4);
	assert_int_equal(d2h, loss + grads + STEP_OUT + 4);
	free(out);
}

/* ---- the host's waits for the device in a step ---- */

/* Runs the MLP on cpu-strict, 1 worker, 6 steps of 32 under --verbose
 * with `extra` (NULL-ended): how many times the host waited for the
 * device in step `step` (its line's "waited for the device N times"). */
static long step_waits(int step, const char *const *extra)
{
	run r;
	start(&r, 1);
	args(&r, "--device", "cpu-strict", "--max-steps", "6", "--batch-size", "32", "--verbose",
	     "--no-eval", NULL);
	for (; extra && *extra; extra++)
		arg(&r, *extra);
	char *out = finish(&r, 0, MLP_ARGS);
	char head[64];
	snprintf(head, sizeof head, "rank 0: step %d: device cpu-strict copied ", step);
	const char *line = strstr(out, head);
	assert_non_null(line);
	const char *w = strstr(line, "; the host waited for the device ");
	assert_non_null(w);
	assert_true(w < strchr(line, '\n'));
	long n = strtol(w + strlen("; the host waited for the device "), NULL, 10);
	free(out);
	return n;
}

/* On a GPU each wait is a round trip that stops the host from running
 * ahead. An eager step of one micro-step waits three times: for its loss
 * (read inside the step to name a non-finite tensor), for the step's
 * decisions before the update (read for the same diagnostics) and for
 * its result at the end, where the scalars, the loss sums and the ops'
 * deferred checks come back together (hpu__dev_d2h_n). The batch and the
 * learning rate go in without a wait (hpu__dev_copy_queued). A
 * recordable step (HPU_STRICT_STEP=1) and a replayed one (--graphs: steps
 * 4 to 6 after 3 eager ones) wait once, for their result; so does an
 * eager step under --graphs with two micro-steps (its batches in the
 * recordings' input buffers). Every run here also passes cpu-strict's
 * check that no queued copy's source is rewritten before the next wait
 * (the job would fail): with two micro-steps the loader reuses its
 * buffers inside the step, so there each batch's copy waits. */
static void test_waits(void **state)
{
	(void)state;
	assert_int_equal(step_waits(2, NULL), 3);
	assert_int_equal(step_waits(6, (const char *const[]){"--graphs", NULL}), 1);
	assert_int_equal(step_waits(2, (const char *const[]){"--graphs", "--grad-accum", "2", NULL}),
			 1);
	/* two micro-steps: each one's batch waits, as does each one's loss */
	assert_int_equal(step_waits(2, (const char *const[]){"--grad-accum", "2", NULL}), 8);
	assert_int_equal(setenv("HPU_STRICT_STEP", "1", 1), 0);
	long strict = step_waits(2, NULL);
	long strict2 = step_waits(2, (const char *const[]){"--grad-accum", "2", NULL});
	assert_int_equal(unsetenv("HPU_STRICT_STEP"), 0);
	assert_int_equal(strict, 1);
	assert_int_equal(strict2, 5);
}

/* ---- the bytes a step copies, as the placement plan says ---- */

#define SMALL_MLP "--hidden 32 --depth 2" /* 784-32-32-10: 25,120, 1,056, 330 */

/* Every rank's line of every step in `out` ("rank R: step S: device D
 * copied H bytes host-to-device, X bytes device-to-host; the plan: PH and
 * PX"): 1 when each measured pair equals the plan's exactly (bound: the
 * plan says "at least PH and PX", and they are); rank 0's first step
 * into *h2d, *d2h. */
static int as_planned(const char *out, const char *device, int workers, int steps, int bound,
		      unsigned long long *h2d, unsigned long long *d2h)
{
	const char *fmt = bound ? "%llu bytes host-to-device, %llu bytes device-to-host; "
				  "the plan: at least %llu and %llu"
				: "%llu bytes host-to-device, %llu bytes device-to-host; "
				  "the plan: %llu and %llu";
	int ok = 1;
	for (int r = 0; r < workers; r++)
		for (int st = 1; st <= steps; st++) {
			char head[96];
			snprintf(head, sizeof head, "rank %d: step %d: device %s copied ", r, st, device);
			const char *line = strstr(out, head);
			assert_non_null(line);
			unsigned long long h = 0, d = 0, ph = 0, pd = 0;
			assert_int_equal(sscanf(line + strlen(head), fmt, &h, &d, &ph, &pd), 4);
			if (bound ? h < ph || d < pd : h != ph || d != pd) {
				printf("    rank %d step %d: copied %llu in, %llu out; the plan says %llu "
				       "in, %llu out\n",
				       r, st, h, d, ph, pd);
				ok = 0;
			}
			if (r == 0 && st == 1) {
				*h2d = h;
				*d2h = d;
			}
		}
	return ok;
}

/* One case: `workers` ranks, 2 steps of 32 on `device`, and `extra`
 * (NULL-ended): 1 when the bytes copied are the plan's to the byte, 2
 * when the plan says "at least" and they are, 0 otherwise. */
static int copies_case(const char *device, int workers, const char *model, const char *margs,
		       const char *const *extra, unsigned long long *h2d, unsigned long long *d2h)
{
	run r;
	start(&r, workers);
	args(&r, "--device", device, "--max-steps", "2", "--batch-size", "32", "--verbose",
	     "--param-persistence-threshold", "1000", NULL);
	char what[160] = "";
	size_t n = 0;
	int all_reduce = 0; /* ddp, fast_ddp: the plan says how the gradients go */
	for (; extra && *extra; extra++) {
		arg(&r, *extra);
		n += (size_t)snprintf(what + n, sizeof what - n, "%s ", *extra);
		all_reduce |= !strcmp(*extra, "ddp") || !strcmp(*extra, "fast_ddp");
	}
	char *out = finish_with(&r, 0, model, margs);
	if (all_reduce && workers > 1 && !strcmp(device, "cpu-strict")) /* none of its own */
		assert_non_null(strstr(out, "gradients' all-reduce: libhpucoll, staged through host "
					    "memory (the device has no collectives of its own)"));
	int bound = strstr(out, "the plan: at least") != NULL;
	int ok = as_planned(out, device, workers, 2, bound, h2d, d2h);
	printf("  %-10s %d worker%s %-62s %7llu in, %7llu out per step: %s\n", device, workers,
	       workers == 1 ? " " : "s", what, *h2d, *d2h,
	       !ok ? "NOT AS PLANNED" : bound ? "within the plan's bound" : "as planned");
	free(out);
	return !ok ? 0 : bound ? 2 : 1;
}

static void test_copies_as_planned(void **state)
{
	(void)state;
	static const char *const cases[][9] = {
	    {"--strategy", "ddp"},
	    {"--strategy", "ddp", "--grad-comm-dtype", "bf16"},
	    {"--strategy", "fast_ddp"},
	    {"--strategy", "zero1"},
	    {"--strategy", "zero2"},
	    {"--strategy", "zero3"},
	    {"--strategy", "ddp", "--precision", "bf16-mixed"},
	    {"--strategy", "fast_ddp", "--precision", "bf16-mixed"},
	    {"--strategy", "zero1", "--precision", "bf16-mixed"},
	    {"--strategy", "zero2", "--precision", "bf16-mixed"},
	    {"--strategy", "zero3", "--precision", "bf16-mixed"},
	    /* the parameter shard in the host tier: nothing to copy out */
	    {"--strategy", "zero3", "--offload-param", "cpu", "--offload-optimizer", "cpu"},
	    {"--strategy", "zero3", "--precision", "bf16-mixed", "--offload-param", "cpu"},
	    {"--strategy", "zero2", "--grad-accum", "2"},
	    /* the host's update (offload): gradients out, parameters to it */
	    {"--strategy", "zero1", "--offload-optimizer", "cpu"},
	    {"--strategy", "zero2", "--offload-optimizer", "cpu", "--grad-accum", "2"},
	    {"--strategy", "zero3", "--offload-param", "cpu"},
	    {"--strategy", "zero1", "--precision", "bf16-mixed", "--offload-optimizer", "cpu"},
	    {"--strategy", "zero2", "--precision", "bf16-mixed", "--offload-optimizer", "cpu"},
	    {"--strategy", "zero3", "--precision", "bf16-mixed", "--offload-optimizer", "cpu"},
	};
	int bad = 0;
	unsigned long long h, d, zero1_h = 0, zero1_d = 0, zero3_h = 0;
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
		bad += 1 != copies_case("cpu-strict", 2, MODEL, SMALL_MLP, cases[k], &h, &d);
		if (k == 3) {
			zero1_h = h;
			zero1_d = d;
		}
		if (k == 5)
			zero3_h = h;
	}
	/* NVMe's tier: the pieces are read into host buffers, as the host
	 * tier's (a directory off tmpfs, which the tier refuses) */
	struct statfs fs;
	int tmpfs = statfs("/tmp", &fs) == 0 && fs.f_type == 0x01021994;
	char nv[300];
	snprintf(nv, sizeof nv, "%s/hpu-dev-copies.XXXXXX", tmpfs ? h_build("") : "/tmp");
	assert_non_null(mkdtemp(nv));
	const char *nvme[] = {"--strategy", "zero3", "--offload-param", "nvme",
			      "--offload-optimizer", "nvme", "--nvme-path", nv, NULL};
	bad += 1 != copies_case("cpu-strict", 2, MODEL, SMALL_MLP, nvme, &h, &d);
	const char *nvme16[] = {"--strategy", "zero2", "--precision", "bf16-mixed",
				"--offload-optimizer", "nvme", "--nvme-path", nv, NULL};
	bad += 1 != copies_case("cpu-strict", 2, MODEL, SMALL_MLP, nvme16, &h, &d);
	h_rmtree(nv);
	/* zero3 recomputing: layers gathered again, more than the plan
	 * counts, which it says ("at least"); zero2 recomputing gathers
	 * nothing: exact */
	const char *ckpt3[] = {"--strategy", "zero3", "--activation-checkpointing", NULL};
	bad += 2 != copies_case("cpu-strict", 2, MODEL, SMALL_MLP, ckpt3, &h, &d);
	const char *ckpt2[] = {"--strategy", "zero2", "--activation-checkpointing", NULL};
	bad += 1 != copies_case("cpu-strict", 2, MODEL, SMALL_MLP, ckpt2, &h, &d);
	/* one worker: no collective, only the batch in and the loss and the
	 * step's scalars out */
	const char *one[][5] = {{"--strategy", "ddp"},
				{"--strategy", "zero3", "--precision", "bf16-mixed"}};
	for (size_t k = 0; k < sizeof one / sizeof *one; k++) {
		bad += 1 != copies_case("cpu-strict", 1, MODEL, SMALL_MLP, one[k], &h, &d);
		assert_int_equal(h, 32ull * (784 + 1) * 4 + STEP_IN);
		assert_int_equal(d, LOSS_OUT(1) + STEP_OUT); /* the loss's sum, one double */
	}
	/* a model with buffers: synchronized after the step, out and back */
	const char *bufs[] = {"--strategy", "zero2", NULL};
	bad += 1 != copies_case("cpu-strict", 2, BUFMODEL, NULL, bufs, &h, &d);
	/* on cpu the host reads device memory: nothing is copied */
	const char *cpu[][5] = {{"--strategy", "ddp"}, {"--strategy", "zero3"},
				{"--strategy", "zero1", "--precision", "bf16-mixed"}};
	for (size_t k = 0; k < sizeof cpu / sizeof *cpu; k++) {
		bad += 1 != copies_case("cpu", 2, MODEL, SMALL_MLP, cpu[k], &h, &d);
		assert_int_equal(h, 0);
		assert_int_equal(d, 0);
	}
	/* the offload tier's copies are explicit on cpu too: zero2's host
	 * update, by hand (units as below): each rank's gradient piece out,
	 * its parameters' piece out to the host's update and back */
	const char *off[] = {"--strategy", "zero2", "--offload-optimizer", "cpu", NULL};
	bad += 1 != copies_case("cpu", 2, MODEL, SMALL_MLP, off, &h, &d);
	assert_int_equal(h, 26528 / 2 * 4);
	assert_int_equal(d, 2 * 26528 / 2 * 4);
	/* zero1 by hand: units 25,120 + 1,056 + 330 floats, each padded to
	 * 32: 25,120 + 1,056 + 352 = 26,528, pieces half. Gradients out
	 * whole and the piece back; the piece out and the others' back. The
	 * step's scalars, with the non-finite flag's all-reduce staged. */
	unsigned long long len = 26528, piece = len / 2, batch = 16ull * (784 + 1) * 4,
			   loss = LOSS_OUT(1), step_in = STEP_IN + 4, step_out = STEP_OUT + 4;
	assert_int_equal(zero1_h, batch + piece * 4 + (len - piece) * 4 + step_in);
	assert_int_equal(zero1_d, loss + len * 4 + piece * 4 + step_out);
	/* zero3 by hand: the units' pieces 12,560, 528 and 176 (the last
	 * persistent) back from the reduce-scatters; the first layer
	 * gathered for its forward and its backward, the second once (kept
	 * from its forward into its backward, which comes next), the
	 * persistent one after the step: the others' pieces in */
	assert_int_equal(zero3_h, batch + (12560 + 528 + 176) * 4 +
					  (2 * 12560 + 528 + 176) * 4 + step_in);
	assert_int_equal(bad, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_cuda_fails_with_reason),
	    cmocka_unit_test(test_auto_is_cpu),
	    cmocka_unit_test(test_allow_tf32),
	    cmocka_unit_test(test_devices_auto),
	    cmocka_unit_test(test_planted_read_caught),
	    cmocka_unit_test(test_any_device_loop_named),
	    cmocka_unit_test(test_planted_read_passes_on_cpu),
	    cmocka_unit_test(test_strategies_fp32),
	    cmocka_unit_test(test_strategies_bf16),
	    cmocka_unit_test(test_checkpoint_resume),
	    cmocka_unit_test(test_offload),
	    cmocka_unit_test(test_buffers),
	    cmocka_unit_test(test_own_layer_in_ops),
	    cmocka_unit_test(test_copied_bytes),
	    cmocka_unit_test(test_waits),
	    cmocka_unit_test(test_copies_as_planned),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
