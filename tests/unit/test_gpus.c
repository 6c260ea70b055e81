/* test_gpus: hpulaunch's --devices auto on GPUs (agent/gpus.c): one
 * worker per GPU with --device cuda (none is an error naming why), the
 * GPUs or else the cores with --device auto, the cores with cpu; the
 * count read from "hpu-worker --count-gpus", here fake workers (shell
 * scripts named by HPU_WORKER) that answer as the real one would on a
 * machine with GPUs, without them, or not at all. The real worker on this
 * machine is test_device's. */
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
#include "agent/gpus.h"

static char dir[64], model[128], w_three[128], w_none[128], w_killed[128], w_junk[128],
	w_called[128];
static long cores;

/* a batch per worker, so that any number of workers divides the batch */
#define MICRO "--micro-batch-size", "8"

static void write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	assert_int_equal(chmod(path, mode), 0);
}

/* A fake hpu-worker in dir named `name` running `body` for --count-gpus. */
static void fake(char *path, size_t len, const char *name, const char *body)
{
	char text[512];
	snprintf(path, len, "%s/%s", dir, name);
	snprintf(text, sizeof text, "#!/bin/sh\n[ \"$1\" = --count-gpus ] || exit 9\n%s\n", body);
	write_file(path, text, 0755);
}

static int setup(void **state)
{
	snprintf(dir, sizeof dir, "/tmp/test_gpus.XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(model, sizeof model, "%s/model.so", dir);
	write_file(model, "a model\n", 0644);
	/* three GPUs, or as many as CUDA_VISIBLE_DEVICES names */
	fake(w_three, sizeof w_three, "three",
	     "if [ -n \"$CUDA_VISIBLE_DEVICES\" ]; then IFS=,; set -- $CUDA_VISIBLE_DEVICES; echo $#; "
	     "else echo 3; fi");
	fake(w_none, sizeof w_none, "none",
	     "echo '--device cuda: no GPU is visible (no CUDA-capable device is detected)'; exit 1");
	fake(w_killed, sizeof w_killed, "killed", "kill -9 $$");
	fake(w_junk, sizeof w_junk, "junk", "echo 'many GPUs'");
	char body[256];
	snprintf(body, sizeof body, "touch %s/asked; echo 3", dir);
	fake(w_called, sizeof w_called, "called", body);
	cores = sysconf(_SC_NPROCESSORS_ONLN);
	unsetenv("HPU_DEVICE");
	unsetenv("CUDA_VISIBLE_DEVICES");
	return args_clean_env(state);
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	unsetenv("HPU_WORKER");
	return system(cmd);
}

/* The choice alone: GPUs for cuda and auto where there are some; cores
 * for cpu and for auto without; cuda without is the worker's sentence. */
static void test_devices_by_count(void **state)
{
	(void)state;
	int d = 0;
	char err[256] = "";
	assert_int_equal(hpu__gpus_devices(HPU_COUNT_GPUS, 3, "", 16, &d, err, sizeof err), 0);
	assert_int_equal(d, 3);
	assert_int_equal(hpu__gpus_devices(HPU_COUNT_EITHER, 8, "", 16, &d, err, sizeof err), 0);
	assert_int_equal(d, 8);
	assert_int_equal(hpu__gpus_devices(HPU_COUNT_EITHER, 0, "--device cuda: x", 16, &d, err,
					   sizeof err), 0);
	assert_int_equal(d, 16);
	assert_int_equal(hpu__gpus_devices(HPU_COUNT_CORES, 4, "", 16, &d, err, sizeof err), 0);
	assert_int_equal(d, 16);
	assert_int_equal(hpu__gpus_devices(HPU_COUNT_CORES, 0, "", 5000, &d, err, sizeof err), 0);
	assert_int_equal(d, 1024);
	assert_int_equal(hpu__gpus_devices(HPU_COUNT_GPUS, 0,
					   "--device cuda: the CUDA device is not built in this build "
					   "(use --device cpu or auto)",
					   16, &d, err, sizeof err),
			 -1);
	printf("  -> %s\n", err);
	assert_string_equal(err, "--devices auto --device cuda: the CUDA device is not built in "
				 "this build (use --device cpu or auto)");
	assert_int_equal(hpu__gpus_devices(HPU_COUNT_GPUS, 0, "hpu-worker died", 16, &d, err,
					   sizeof err), -1);
	assert_string_equal(err, "--devices auto --device cuda: cannot count the GPUs: hpu-worker died");
}

/* The worker's answers as hpu__gpus_count reads them. */
static void test_count_from_worker(void **state)
{
	(void)state;
	int n = -1;
	char why[512] = "";
	assert_int_equal(hpu__gpus_count(w_three, &n, why, sizeof why), 0);
	assert_int_equal(n, 3);
	setenv("CUDA_VISIBLE_DEVICES", "0,2", 1); /* the worker sees the launcher's */
	assert_int_equal(hpu__gpus_count(w_three, &n, why, sizeof why), 0);
	assert_int_equal(n, 2);
	unsetenv("CUDA_VISIBLE_DEVICES");
	assert_int_equal(hpu__gpus_count(w_none, &n, why, sizeof why), 0);
	assert_int_equal(n, 0);
	assert_string_equal(why, "--device cuda: no GPU is visible (no CUDA-capable device is detected)");
	assert_int_equal(hpu__gpus_count(w_killed, &n, why, sizeof why), 0);
	assert_int_equal(n, 0);
	printf("  -> %s\n", why);
	assert_non_null(strstr(why, "--count-gpus died of signal 9"));
	assert_int_equal(hpu__gpus_count(w_junk, &n, why, sizeof why), 0);
	assert_int_equal(n, 0);
	printf("  -> %s\n", why);
	assert_non_null(strstr(why, "--count-gpus gave no count (exit 0: many GPUs)"));
	char missing[160];
	snprintf(missing, sizeof missing, "%s/no-such-worker", dir);
	assert_int_equal(hpu__gpus_count(missing, &n, why, sizeof why), -1);
	assert_int_equal(n, 0);
	assert_non_null(strstr(why, "cannot run"));
}

/* Parsed (hpulaunch's command line) with a fake worker `w` and
 * --devices auto --device `device` (NULL: none given): the workers on
 * this node. */
static int auto_devices(const char *w, const char *device)
{
	hpu_launch_args a;
	char dev[16];
	setenv("HPU_WORKER", w, 1);
	snprintf(dev, sizeof dev, "%s", device ? device : "");
	if (device)
		parse_ok(&a, ARGV("--devices", "auto", "--device", dev, MICRO, model));
	else
		parse_ok(&a, ARGV("--devices", "auto", MICRO, model));
	int d = a.devices;
	assert_int_equal(a.world, d);
	hpu__args_free(&a);
	return d;
}

static void test_launcher_counts_gpus(void **state)
{
	(void)state;
	assert_int_equal(auto_devices(w_three, "cuda"), 3);
	assert_int_equal(auto_devices(w_three, "auto"), 3);
	assert_int_equal(auto_devices(w_none, "auto"), (int)cores);
	setenv("HPU_DEVICE", "cuda", 1); /* the environment's device counts too */
	assert_int_equal(auto_devices(w_three, NULL), 3);
	assert_int_equal(auto_devices(w_three, "cpu"), (int)cores); /* the option wins */
	unsetenv("HPU_DEVICE");
	setenv("CUDA_VISIBLE_DEVICES", "1", 1);
	assert_int_equal(auto_devices(w_three, "cuda"), 1);
	unsetenv("CUDA_VISIBLE_DEVICES");
	/* cpu: the cores, and no worker asked */
	char called[160];
	snprintf(called, sizeof called, "%s/asked", dir);
	assert_int_equal(auto_devices(w_called, "cpu"), (int)cores);
	assert_int_equal(auto_devices(w_called, NULL), (int)cores);
	hpu_launch_args c; /* torchrun's "cpu" is the cores, whatever --device */
	parse_ok(&c, ARGV("--nproc-per-node", "cpu", "--device", "cuda", MICRO, model));
	assert_int_equal(c.devices, (int)cores);
	hpu__args_free(&c);
	assert_int_equal(access(called, F_OK), -1);
	/* an explicit count is kept: more workers than GPUs share them */
	hpu_launch_args a;
	setenv("HPU_WORKER", w_three, 1);
	parse_ok(&a, ARGV("--devices", "5", "--device", "cuda", MICRO, model));
	assert_int_equal(a.devices, 5);
	hpu__args_free(&a);
	/* cuda without a GPU: the worker's reason, before any worker starts */
	setenv("HPU_WORKER", w_none, 1);
	parse_fails(ARGV("--devices", "auto", "--device", "cuda", model),
		    "--devices auto --device cuda: no GPU is visible (no CUDA-capable device is detected)");
	setenv("HPU_WORKER", w_killed, 1);
	parse_fails(ARGV("--nproc-per-node", "auto", "--device", "cuda", model),
		    "--devices auto --device cuda: cannot count the GPUs: ");
	unsetenv("HPU_WORKER");
}

/* The index of "--device" followed by `dev` in a's worker argv, before
 * the model; -1 where there is none. */
static int device_arg(const hpu_launch_args *a, const char *dev)
{
	for (int i = 1; i + 1 < a->worker_argc && a->worker_argv[i] != a->model; i++)
		if (!strcmp(a->worker_argv[i], "--device") && !strcmp(a->worker_argv[i + 1], dev))
			return a->worker_argv[i + 2] == a->model ? i : -1;
	return -1;
}

/* torchrun's --nproc-per-node gpu: one worker per GPU on --device cuda,
 * which the workers are given; none is the worker's reason. Its auto:
 * the GPUs where there are some (the workers then compute on cuda), else
 * the cores, as torchrun counts. A --device given is kept. */
static void test_torchrun_gpu(void **state)
{
	(void)state;
	hpu_launch_args a;
	setenv("HPU_WORKER", w_three, 1);
	parse_ok(&a, ARGV("--nproc-per-node", "gpu", MICRO, model));
	assert_int_equal(a.devices, 3);
	assert_int_equal(a.train.device, HPU_DEVICE_CUDA);
	assert_true(device_arg(&a, "cuda") > 0);
	hpu__args_free(&a);
	parse_ok(&a, ARGV("--nproc_per_node", "gpu", "--device", "cuda", MICRO, model));
	assert_int_equal(a.devices, 3);
	hpu__args_free(&a);
	parse_ok(&a, ARGV("--nproc-per-node", "auto", MICRO, model));
	assert_int_equal(a.devices, 3);
	assert_true(device_arg(&a, "cuda") > 0);
	hpu__args_free(&a);
	/* no GPU: gpu is the worker's reason, auto the cores on cpu */
	setenv("HPU_WORKER", w_none, 1);
	parse_fails(ARGV("--nproc-per-node", "gpu", model),
		    "--nproc-per-node gpu: no GPU is visible (no CUDA-capable device is detected)");
	parse_ok(&a, ARGV("--nproc-per-node", "auto", MICRO, model));
	assert_int_equal(a.devices, (int)cores);
	assert_int_equal(a.train.device, HPU_DEVICE_CPU);
	assert_int_equal(device_arg(&a, "cuda"), -1);
	hpu__args_free(&a);
	/* a device that is not a GPU's does not go with gpu */
	setenv("HPU_WORKER", w_three, 1);
	parse_fails(ARGV("--nproc-per-node", "gpu", "--device", "cpu", model),
		    "--nproc-per-node gpu: one worker per GPU computes on --device cuda, not --device cpu");
	setenv("HPU_DEVICE", "cpu-strict", 1);
	parse_fails(ARGV("--nproc-per-node", "gpu", model),
		    "--nproc-per-node gpu: one worker per GPU computes on --device cuda, not --device cpu-strict");
	/* auto with a device given counts by it: cpu-strict is the cores */
	parse_ok(&a, ARGV("--nproc-per-node", "auto", MICRO, model));
	assert_int_equal(a.devices, (int)cores);
	assert_int_equal(device_arg(&a, "cuda"), -1);
	hpu__args_free(&a);
	unsetenv("HPU_DEVICE");
	parse_fails(ARGV("--nproc-per-node", "xpu", model), "--nproc-per-node xpu: ");
	unsetenv("HPU_WORKER");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_devices_by_count),
		cmocka_unit_test(test_count_from_worker),
		cmocka_unit_test(test_launcher_counts_gpus),
		cmocka_unit_test(test_torchrun_gpu),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
