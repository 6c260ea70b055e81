/* Unit tests for the device (worker/device): choosing it by name (cuda
 * refused in one sentence), the cpu device's pass-through, and the strict
 * CPU device: copies in and out with their byte counts, devmem's
 * accounting on its arena, fresh blocks zeroed after reuse, nested device
 * calls, and the fault -- host code touching device memory outside a
 * device call exits with one line naming the rank and the block; the
 * default device-memory limit's division among the workers; a copy
 * queued without a wait whose source the host rewrites before its next
 * wait ends the worker naming it, and the waits are counted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <sys/wait.h>
#include <unistd.h>

#include "common/nodeid.h"

#include "worker/device/device.h"

#define MiB (1024ull * 1024)

static int open_dev(const char *name, int rank)
{
	char err[256] = "";
	if (hpu__dev_open(name, rank, err, sizeof err) < 0) {
		fprintf(stderr, "%s\n", err);
		return -1;
	}
	return hpu__devmem_init(64 * MiB, rank);
}

static void close_dev(void)
{
	hpu__devmem_shutdown();
	hpu__dev_close();
}

/* Every rank's identity of its GPU, for hpu__dev_gpu_sharers. */
static char ids[8][64];

static void ident(int world, ...)
{
	va_list ap;
	va_start(ap, world);
	memset(ids, 0, sizeof ids);
	for (int r = 0; r < world; r++)
		snprintf(ids[r], sizeof ids[r], "%s", va_arg(ap, const char *));
	va_end(ap);
}

/* The default device-memory limit (no --device-memory): a GPU's memory
 * divided among the workers that drive that GPU (by its identity, the
 * host and its PCI bus id, not by its index: a worker that sees only its
 * own GPU has index 0), host memory among all the node's workers. */
static void test_default_memory(void **state)
{
	(void)state;
	const uint64_t gpu = 140ull << 30, host = 128ull << 30;
	/* 4 workers on one GPU */
	ident(4, "a 0000:01:00.0", "a 0000:01:00.0", "a 0000:01:00.0", "a 0000:01:00.0");
	for (int r = 0; r < 4; r++)
		assert_int_equal(hpu__dev_gpu_sharers(ids[0], sizeof ids[0], 4, r), 4);
	/* 5 on 2 GPUs, L mod 2 */
	ident(5, "a 0000:01:00.0", "a 0000:02:00.0", "a 0000:01:00.0", "a 0000:02:00.0",
	      "a 0000:01:00.0");
	assert_int_equal(hpu__dev_gpu_sharers(ids[0], sizeof ids[0], 5, 0), 3);
	assert_int_equal(hpu__dev_gpu_sharers(ids[0], sizeof ids[0], 5, 1), 2);
	/* one GPU each (CUDA_VISIBLE_DEVICES per rank: each sees index 0) */
	ident(3, "a 0000:01:00.0", "a 0000:02:00.0", "a 0000:03:00.0");
	assert_int_equal(hpu__dev_gpu_sharers(ids[0], sizeof ids[0], 3, 2), 1);
	/* the same bus id on two hosts: two GPUs */
	ident(2, "a 0000:01:00.0", "b 0000:01:00.0");
	assert_int_equal(hpu__dev_gpu_sharers(ids[0], sizeof ids[0], 2, 0), 1);
	/* not a GPU, or no entries */
	ident(2, "", "");
	assert_int_equal(hpu__dev_gpu_sharers(ids[0], sizeof ids[0], 2, 1), 1);
	assert_int_equal(hpu__dev_gpu_sharers(NULL, 0, 2, 1), 1);
	assert_int_equal(hpu__dev_gpu_sharers(ids[0], sizeof ids[0], 2, 5), 1);
	/* a GPU's entry names the machine by host name and boot id (two
	 * machines of one host name, GPUs at one bus id, are two GPUs) */
	char node[320], hn[256] = "", boot[64] = "", want[400];
	hpu__node_ident(node, sizeof node);
	gethostname(hn, sizeof hn - 1);
	FILE *bf = fopen("/proc/sys/kernel/random/boot_id", "r");
	assert_non_null(bf);
	assert_non_null(fgets(boot, sizeof boot, bf));
	fclose(bf);
	boot[strcspn(boot, "\n")] = 0;
	assert_int_equal(strlen(boot), 36);
	snprintf(want, sizeof want, "%s/%s", hn, boot);
	assert_string_equal(node, want);
	/* the CPU devices drive no GPU: their entry is "" */
	char me[64] = "x";
	hpu__dev_gpu_ident(me, sizeof me);
	assert_string_equal(me, "");
	/* 2 workers on one GPU: half of it each, less what each has outside
	 * the limit, whatever the host has */
	const uint64_t res = HPU_DEV_GPU_RESERVE;
	assert_true(hpu__dev_default_memory(gpu, 2, host, 2) == gpu / 2 - res);
	assert_true(hpu__dev_default_memory(gpu, 2, 1ull << 40, 2) == gpu / 2 - res);
	/* 8 workers on 8 GPUs: a GPU each, not an eighth of the host */
	assert_true(hpu__dev_default_memory(gpu, 1, host, 8) == gpu - res);
	assert_true(hpu__dev_default_memory(gpu, 3, 0, 5) == gpu / 3 - res);
	/* a share under twice the reserve: half of it */
	assert_true(hpu__dev_default_memory(3 * res, 2, host, 2) == 3 * res / 4);
	assert_true(hpu__dev_default_memory(2 * res, 1, host, 2) == res);
	assert_true(hpu__dev_default_memory(2 * res + 1, 1, host, 2) == res + 1);
	/* host memory: the node's shared by its workers; unknown: no limit */
	assert_true(hpu__dev_default_memory(0, 1, host, 4) == host / 4);
	assert_true(hpu__dev_default_memory(0, 1, host, 0) == host);
	assert_true(hpu__dev_default_memory(0, 1, 0, 4) == 0);
}

static void test_names(void **state)
{
	(void)state;
	char err[256] = "";
	assert_int_equal(hpu__dev_check_name("cpu", err, sizeof err), 0);
	assert_int_equal(hpu__dev_check_name("cpu-strict", err, sizeof err), 0);
	assert_int_equal(hpu__dev_check_name("auto", err, sizeof err), 0);
	assert_int_equal(hpu__dev_check_name("gpu", err, sizeof err), -1);
	assert_non_null(strstr(err, "--device gpu: no such device"));
	/* cuda's module where HPU_CUDA_MODULE says, and it is not there */
	setenv("HPU_CUDA_MODULE", "/nonexistent/hpudev_cuda.so", 1);
	assert_int_equal(hpu__dev_check_name("cuda", err, sizeof err), -1);
	assert_non_null(strstr(err, "--device cuda: cannot load the CUDA device's module: "
				    "/nonexistent/hpudev_cuda.so"));
	assert_int_equal(hpu__dev_open("cuda", 0, err, sizeof err), -1);
	assert_string_equal(hpu__dev_name(), "cpu"); /* unchanged */
	assert_int_equal(open_dev("auto", 0), 0); /* auto: cpu */
	assert_string_equal(hpu__dev_name(), "cpu");
	close_dev();
	unsetenv("HPU_CUDA_MODULE");
	/* this build's: not built, or built and no GPU here, or a GPU */
	if (hpu__dev_check_name("cuda", err, sizeof err) < 0) {
		printf("  --device cuda here: %s\n", err);
		char reason[256];
		assert_true(strstr(err, "--device cuda: the CUDA device is not built in this build") ||
			    sscanf(err, "--device cuda: no GPU is visible (%255[^)])", reason) == 1);
		assert_int_equal(open_dev("auto", 0), 0);
		assert_string_equal(hpu__dev_name(), "cpu");
		close_dev();
	}
}

static void test_cpu(void **state)
{
	(void)state;
	assert_int_equal(open_dev("cpu", 0), 0);
	assert_string_equal(hpu__dev_name(), "cpu");
	assert_int_equal(hpu__dev_host_can_read(), 1);
	float *p = hpu__dev_alloc(HPU_MEM_PARAMS, 1000 * 4, "weights");
	assert_non_null(p);
	assert_int_equal(hpu__dev_owns(p), 0);
	p[999] = 2.5f; /* the host may */
	float h[1000];
	hpu__dev_d2h(NULL, h, p, sizeof h);
	assert_true(h[999] == 2.5f);
	uint64_t in, out;
	hpu__dev_copied(&in, &out);
	assert_int_equal(in, 0);
	assert_int_equal(out, sizeof h);
	hpu__dev_free(p);
	close_dev();
}

static void test_strict_copies(void **state)
{
	(void)state;
	assert_int_equal(open_dev("cpu-strict", 0), 0);
	assert_int_equal(hpu__dev_host_can_read(), 0);
	enum { N = 300000 };
	float *h = malloc(N * 4), *back = malloc(N * 4);
	assert_non_null(h);
	assert_non_null(back);
	for (int i = 0; i < N; i++)
		h[i] = (float)i * 0.5f;
	float *a = hpu__dev_alloc(HPU_MEM_GRADS, N * 4, "gradients");
	float *b = hpu__dev_alloc_uninit(HPU_MEM_ACTS, 100, "small");
	assert_non_null(a);
	assert_non_null(b);
	assert_int_equal(hpu__dev_owns(a), 1);
	assert_int_equal(hpu__dev_owns(h), 0);
	hpu__dev_h2d(NULL, a, h, N * 4);
	hpu__dev_d2d(NULL, b, a + 7, 100);
	hpu__dev_copy(back, a, N * 4); /* d2h, by the pointers */
	assert_memory_equal(back, h, N * 4);
	hpu__dev_d2h(NULL, back, b, 100);
	assert_memory_equal(back, h + 7, 100);
	uint64_t in, out;
	hpu__dev_copied(&in, &out);
	assert_int_equal(in, N * 4);
	assert_int_equal(out, N * 4 + 100);
	/* devmem's accounting, on the arena */
	hpu_device_stats st;
	hpu__devmem_stats(&st);
	assert_int_equal(st.in_use, N * 4 + 100);
	assert_int_equal(hpu__devmem_kind_in_use(HPU_MEM_GRADS), N * 4);
	/* a freed block comes back zeroed */
	hpu__dev_memset(NULL, a, 0xff, N * 4);
	hpu__dev_free(a);
	float *c = hpu__dev_alloc(HPU_MEM_GRADS, N * 4, "again");
	assert_non_null(c);
	hpu__dev_d2h(NULL, back, c, N * 4);
	for (int i = 0; i < N; i++)
		assert_true(back[i] == 0.0f);
	/* a queue and an event: done when issued */
	hpu__dev_queue *q = hpu__dev_queue_new();
	assert_non_null(q);
	hpu__dev_event ev;
	hpu__dev_h2d(q, c, h, 64);
	hpu__dev_event_record(q, &ev);
	hpu__dev_event_wait(&ev);
	hpu__dev_queue_sync(q);
	hpu__dev_queue_free(&q);
	assert_null(q);
	hpu__dev_free(b);
	hpu__dev_free(c);
	free(h);
	free(back);
	close_dev();
}

/* Runs fn in a child with stderr into a pipe: its exit status and what it
 * wrote (caller frees). */
static int in_child(void (*fn)(void), char **text)
{
	int fd[2];
	assert_int_equal(pipe(fd), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fd[1], 2);
		close(fd[0]);
		fn();
		_exit(0);
	}
	close(fd[1]);
	char *buf = calloc(1, 4096);
	size_t n = 0;
	ssize_t k;
	while (buf && n < 4095 && (k = read(fd[0], buf + n, 4095 - n)) > 0)
		n += (size_t)k;
	close(fd[0]);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	*text = buf;
	return status;
}

static void touch_outside(void)
{
	if (open_dev("cpu-strict", 3) < 0)
		_exit(9);
	volatile float *p = hpu__dev_alloc(HPU_MEM_PARAMS, 4096, "weights of fc");
	p[10] = 1.0f; /* outside a device call */
	_exit(8);     /* not reached */
}

static void touch_inside(void)
{
	if (open_dev("cpu-strict", 0) < 0)
		_exit(9);
	volatile float *p = hpu__dev_alloc(HPU_MEM_OPTIM, 4096, "state");
	hpu__dev_enter();
	hpu__dev_enter(); /* nested */
	p[0] = 1.0f;
	hpu__dev_leave();
	p[1] = p[0] + 1.0f; /* still inside the outer call */
	hpu__dev_leave();
	/* a block allocated inside a device call is open too */
	hpu__dev_enter();
	volatile float *q = hpu__dev_alloc(HPU_MEM_OPTIM, 3 * MiB, "big");
	q[3 * MiB / 4 - 1] = 3.0f;
	hpu__dev_leave();
	close_dev();
	_exit(0);
}

static void op_on_host(void)
{
	if (open_dev("cpu-strict", 2) < 0)
		_exit(9);
	float *d = hpu__dev_alloc(HPU_MEM_GRADS, 4096, "gradients");
	float *h = calloc(1024, 4); /* the host tier's, say */
	hpu__dev_add(d, h, 1024);   /* the device reading host memory */
	_exit(8);                   /* not reached */
}

/* Host memory is the host's: a copy with one side in it counts as the
 * h2d or d2h it is, the host's own loops work on it, a device op given
 * it stops the worker. */
static void test_strict_host_memory(void **state)
{
	(void)state;
	assert_int_equal(open_dev("cpu-strict", 0), 0);
	float h[64], back[64];
	for (int i = 0; i < 64; i++)
		h[i] = (float)i;
	float *d = hpu__dev_alloc(HPU_MEM_GRADS, sizeof h, "gradients");
	assert_non_null(d);
	hpu__dev_d2d(NULL, d, h, sizeof h);    /* really host to device */
	hpu__dev_d2d(NULL, back, d, sizeof h); /* and back */
	assert_memory_equal(back, h, sizeof h);
	uint64_t in, out;
	hpu__dev_copied(&in, &out);
	assert_int_equal(in, sizeof h);
	assert_int_equal(out, sizeof h);
	hpu__dev_host_rt()->add(back, h, 64);
	assert_true(back[63] == 126.0f);
	hpu__dev_free(d);
	close_dev();
	char *text;
	int st = in_child(op_on_host, &text);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	printf("  %s", text);
	void *at = NULL;
	int end = -1;
	sscanf(text, "hpu-worker: rank 2: device op add given host memory at %p under --device cpu-strict (host memory is the host's: copy it to the device first)\n%n",
	       &at, &end);
	assert_true(end > 0 && (size_t)end == strlen(text));
	free(text);
}

static void test_strict_fault(void **state)
{
	(void)state;
	char *text;
	int st = in_child(touch_outside, &text);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	printf("  %s", text);
	void *at = NULL;
	int end = -1;
	sscanf(text, "hpu-worker: rank 3: host code touched device memory at %p (PARAMS block 'weights of fc') outside a device call under --device cpu-strict\n%n",
	       &at, &end);
	assert_true(end > 0 && (size_t)end == strlen(text)); /* that one line, whole */
	assert_non_null(at);
	free(text);
	st = in_child(touch_inside, &text);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_string_equal(text, "");
	free(text);
}

/* ---- the step guard (HPU_STRICT_STEP=1) ---- */

static float *guard_g; /* GRADS block 'gradients', 16 values */
static float guard_h[16];

/* cpu-strict (or `device`) for rank 1 with HPU_STRICT_STEP as `knob`
 * (NULL: unset), a block of gradients, the guard on; what a step may
 * do passes: h2d, memset, device-to-device copies, the ops that leave
 * their results on the device. */
static void guard_setup(const char *device, const char *knob)
{
	if (knob)
		setenv("HPU_STRICT_STEP", knob, 1);
	else
		unsetenv("HPU_STRICT_STEP");
	if (open_dev(device, 1) < 0)
		_exit(9);
	guard_g = hpu__dev_alloc(HPU_MEM_GRADS, sizeof guard_h, "gradients");
	float *d = hpu__dev_alloc(HPU_MEM_ACTS, sizeof guard_h, "acts");
	if (!guard_g || !d)
		_exit(9);
	hpu__dev_step_guard(1);
	hpu__dev_h2d(NULL, guard_g, guard_h, sizeof guard_h);
	hpu__dev_memset(NULL, d, 0, sizeof guard_h);
	hpu__dev_d2d(NULL, d, guard_g, sizeof guard_h);
	hpu__dev_copy(guard_g, d, sizeof guard_h);
	hpu__dev_copy(d, guard_h, sizeof guard_h); /* host to device */
	hpu__dev_add(d, guard_g, 16);
	hpu__dev_event ev;
	hpu__dev_event_record(NULL, &ev);
}

/* Everything a step may not do, in turn: with the guard on the first
 * ends the child with its line; off, none does. */
static void readbacks(void)
{
	float back[16];
	hpu__dev_d2h(NULL, back, guard_g, 64);
	(void)hpu__dev_nonfinite(guard_g, 16);
	hpu__dev_copy(back, guard_g, 64);
	hpu__dev_d2d(NULL, back, guard_g, 64);
	(void)hpu__dev_sumsq(guard_g, 16);
	hpu__dev_queue_sync(NULL);
}

static void guard_d2h(void)
{
	guard_setup("cpu-strict", "1");
	readbacks();
	_exit(0); /* not reached */
}

static void guard_nonfinite(void)
{
	guard_setup("cpu-strict", "1");
	(void)hpu__dev_nonfinite(guard_g, 16);
	_exit(0);
}

static void guard_copy(void)
{
	float back[16];
	guard_setup("cpu-strict", "1");
	hpu__dev_copy(back, guard_g, 8);
	_exit(0);
}

static void guard_sync(void)
{
	guard_setup("cpu-strict", "1");
	hpu__dev_queue_sync(NULL);
	_exit(0);
}

/* The guard turned off again: the readbacks pass. */
static void guard_off(void)
{
	guard_setup("cpu-strict", "1");
	hpu__dev_step_guard(0);
	readbacks();
	close_dev();
	_exit(0);
}

/* The guard on, HPU_STRICT_STEP unset or 0, or on cpu: nothing. */
static void guard_no_knob(void)
{
	guard_setup("cpu-strict", NULL);
	readbacks();
	close_dev();
	guard_setup("cpu-strict", "0");
	readbacks();
	close_dev();
	guard_setup("cpu", "1");
	readbacks();
	close_dev();
	_exit(0);
}

/* The child's exit status 1 and its one line: `op` then `what`, then
 * the guard's words. */
static void caught(void (*fn)(void), const char *op, const char *what)
{
	char *text, want[512];
	int st = in_child(fn, &text);
	snprintf(want, sizeof want,
		 "hpu-worker: rank 1: cpu-strict: %s %s inside a training step (HPU_STRICT_STEP=1): "
		 "a CUDA recording (--graphs on --device cuda) cannot do that\n",
		 op, what);
	printf("  %s", text);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_string_equal(text, want);
	free(text);
}

static void test_step_guard(void **state)
{
	(void)state;
	caught(guard_d2h, "hpu__dev_d2h",
	       "brought 64 bytes of GRADS block 'gradients' back to the host");
	caught(guard_nonfinite, "hpu__dev_nonfinite",
	       "returned a value to the host (read from GRADS block 'gradients')");
	caught(guard_copy, "hpu__dev_copy",
	       "brought 8 bytes of GRADS block 'gradients' back to the host");
	caught(guard_sync, "hpu__dev_queue_sync", "waited on the host for the device's queue");
	/* the same with the guard off, or not armed: exit 0, nothing said */
	void (*quiet[])(void) = {guard_off, guard_no_knob};
	for (int k = 0; k < 2; k++) {
		char *text;
		int st = in_child(quiet[k], &text);
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 0);
		assert_string_equal(text, "");
		free(text);
	}
}

/* ---- a queued copy's source, and the waits ---- */

/* Queues a copy from pinned memory, then (rewrite_early) rewrites the
 * source before the host's next wait, or after it: the race a GPU would
 * have, caught by cpu-strict at the wait; and the waits counted. */
static void queued(int rewrite_early)
{
	if (open_dev("cpu-strict", 2) < 0)
		_exit(9);
	float *pin = hpu__dev_host_alloc(64 * 4), *d = hpu__dev_alloc(HPU_MEM_OTHER, 64 * 4, "lr");
	float back[64];
	for (int i = 0; i < 64; i++)
		pin[i] = (float)i;
	uint64_t w0 = hpu__dev_waits();
	hpu__dev_copy_queued(d, pin, 64 * 4); /* no wait */
	if (hpu__dev_waits() != w0)
		_exit(7);
	if (rewrite_early)
		pin[5] = -1.0f; /* the host's next step, too early */
	hpu__dev_span sp[2] = {{back, d, 64 * 4}, {back, d, 0}};
	hpu__dev_d2h_n(sp, 2); /* one wait for both */
	if (hpu__dev_waits() != w0 + 1 || back[63] != 63.0f)
		_exit(6);
	pin[5] = -2.0f; /* after the wait: the copy has read it */
	hpu__dev_copy(d, pin, 64 * 4); /* an h2d that waits */
	hpu__dev_d2h(NULL, back, d, 64 * 4);
	if (hpu__dev_waits() != w0 + 3 || back[5] != -2.0f)
		_exit(5);
	close_dev();
	_exit(0);
}

static void queued_early(void)
{
	queued(1);
}

static void queued_late(void)
{
	queued(0);
}

static void test_queued_copy(void **state)
{
	(void)state;
	char *text;
	int st = in_child(queued_late, &text);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_string_equal(text, "");
	free(text);
	st = in_child(queued_early, &text);
	printf("  %s", text);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_non_null(strstr(text, "hpu-worker: rank 2: cpu-strict: the host rewrote the source of "
				     "a queued copy (hpu__dev_copy_queued, 256 bytes of pinned "
				     "memory at "));
	assert_non_null(strstr(text, ") before its next wait on the device: on a GPU the copy could "
				     "read the new bytes\n"));
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_names),
	    cmocka_unit_test(test_default_memory),
	    cmocka_unit_test(test_cpu),
	    cmocka_unit_test(test_strict_copies),
	    cmocka_unit_test(test_strict_fault),
	    cmocka_unit_test(test_strict_host_memory),
	    cmocka_unit_test(test_step_guard),
	    cmocka_unit_test(test_queued_copy),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
