#include "tests/integration/cudalib.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *dev_under_test;

/* hpu-worker --count-gpus: exit 0 with the count, else exit 1 with the
 * reason on stdout. Exits 77 where there is no GPU: exit 1 with the
 * worker's "--device cuda: ..." sentence on a machine without NVIDIA's
 * driver. A hang, a signal (a module that crashes as it loads), another
 * answer, or no GPU counted where the driver is loaded fails the test:
 * skipped, they would hide a broken module on the machine with a GPU. */
static void need_gpu(void)
{
	const char *worker = h_build("bin/hpu-worker");
	if (access(worker, X_OK) != 0) {
		printf("FAIL: no %s (HPU_BUILD_DIR names the build)\n", worker);
		exit(1);
	}
	char *argv[] = {(char *)worker, "--count-gpus", NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	const char *out = p.out ? p.out : "";
	int len = (int)strcspn(out, "\n");
	if (code != 0) {
		int driver = access("/proc/driver/nvidia/version", F_OK) == 0;
		if (code == 1 && !strncmp(out, "--device cuda: ", 15) && !driver) {
			printf("skipped: %.*s\n", len, out);
			exit(77);
		}
		if (code < 0)
			printf("FAIL: hpu-worker --count-gpus hung\n");
		else if (code >= 128)
			printf("FAIL: hpu-worker --count-gpus was killed by signal %d: %s\n",
			       code - 128, out);
		else
			printf("FAIL: hpu-worker --count-gpus exited %d%s: %s\n", code,
			       driver ? " where NVIDIA's driver is loaded" : "", out);
		exit(1);
	}
	printf("hpu-worker --count-gpus: %.*s GPU(s); device under test cuda, against cpu\n", len,
	       out);
	h_free(&p);
}

const char *gpu_device(void)
{
	if (dev_under_test)
		return dev_under_test;
	const char *e = getenv("HPU_TEST_GPU_DEVICE");
	if (e && *e && strcmp(e, "cuda") != 0) {
		printf("device under test %s (HPU_TEST_GPU_DEVICE), against cpu: "
		       "the tests' own check, no GPU\n", e);
		dev_under_test = e;
		return e;
	}
	need_gpu();
	dev_under_test = "cuda";
	return dev_under_test;
}

int gpu_is_cuda(void)
{
	return strcmp(gpu_device(), "cuda") == 0;
}

void gpu_args(run *r, const char *dev)
{
	static char *extra;
	static const char *words[16];
	static int nwords = -1;
	args(r, "--device", dev, NULL);
	if (strcmp(dev, gpu_device()) != 0)
		return;
	if (nwords < 0) {
		nwords = 0;
		const char *e = getenv("HPU_TEST_GPU_ARGS");
		extra = strdup(e ? e : "");
		assert_non_null(extra);
		for (char *t = strtok(extra, " "); t && nwords < 16; t = strtok(NULL, " "))
			words[nwords++] = t;
	}
	for (int i = 0; i < nwords; i++)
		arg(r, words[i]);
}

gpu_cmp gpu_compare(const char *ref, const char *got)
{
	size_t na, nb;
	float *a = load_params(ref, &na), *b = load_params(got, &nb);
	if (na != nb)
		fail_msg("%s holds %zu parameters, %s %zu", ref, na, got, nb);
	gpu_cmp c = {0, 0, 0, 0, na};
	double dd = 0, aa = 0;
	for (size_t i = 0; i < na; i++) {
		if (!isfinite(b[i])) {
			c.nonfinite++;
			continue;
		}
		double d = fabs((double)a[i] - (double)b[i]);
		dd += d * d;
		aa += (double)a[i] * a[i];
		if (d > c.max_diff)
			c.max_diff = d;
		if (fabs((double)a[i]) > c.max_abs)
			c.max_abs = fabs((double)a[i]);
	}
	c.rel_l2 = aa > 0 ? sqrt(dd / aa) : sqrt(dd);
	free(a);
	free(b);
	return c;
}

int gpu_within(const gpu_cmp *c, double max_tol, double l2_tol)
{
	return c->nonfinite == 0 && c->max_diff <= max_tol && c->rel_l2 <= l2_tol;
}
