/* device_call: the device calls the folder's other files make around
 * their work (hpu__dev_call_open), host code's (hpu__dev_enter), the
 * step guard (HPU_STRICT_STEP=1), a device op's check that its buffers
 * are device memory, and queues and events. */
#include "worker/device/device.h"
#include "worker/device/device_impl.h"
#include "worker/ops/fp8.h" /* hpu__op_layer_name: the layer running */

#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the step guard ---- */

void hpu__dev_step_guard(int on)
{
	if (hpu__dev_step_strict)
		atomic_store_explicit(&hpu__dev_step_on, on != 0, memory_order_relaxed);
}

/* (A thread that records refuses what the guard would stop: its
 * recording fails, not the worker.) */
static int guarded(void)
{
	return atomic_load_explicit(&hpu__dev_step_on, memory_order_relaxed) &&
	       !hpu__dev_capturing();
}

/* The guard caught `op` doing `what` (a phrase: "returned a value to
 * the host (...)"): one line, and the worker ends. */
void (*hpu__dev_fatal_why)(const char *why);

void hpu__dev_fatal(const char *fmt, ...)
{
	char why[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	fprintf(stderr, "hpu-worker: rank %d: %s\n", hpu__dev_cur_rank, why);
	fflush(stderr);
	if (hpu__dev_fatal_why)
		hpu__dev_fatal_why(why);
	_exit(1);
}

static void step_caught(const char *op, const char *what)
{
	hpu__dev_fatal("cpu-strict: %s %s inside a training step (HPU_STRICT_STEP=1): a CUDA "
		       "recording (--graphs on --device cuda) cannot do that",
		       op, what);
}

void hpu__dev_step_copy(const char *op, const void *dst, const void *src, size_t n)
{
	if (!guarded() || !n || !hpu__dev_cur->owns || hpu__dev_cur->owns(dst) ||
	    !hpu__dev_cur->owns(src))
		return;
	char block[160] = "device memory", what[256];
	if (hpu__dev_cur->describe)
		hpu__dev_cur->describe(src, block, sizeof block);
	snprintf(what, sizeof what, "brought %zu bytes of %s back to the host", n, block);
	step_caught(op, what);
}

void hpu__dev_step_value(const char *op, const void *src)
{
	if (!guarded())
		return;
	char block[160] = "device memory", what[256];
	if (hpu__dev_cur->describe)
		hpu__dev_cur->describe(src, block, sizeof block);
	snprintf(what, sizeof what, "returned a value to the host (read from %s)", block);
	step_caught(op, what);
}

/* ---- the host's waits for the device ----
 * and, on cpu-strict, the sources of the copies queued since the last
 * wait (hpu__dev_copy_queued): each kept as it was when queued and
 * compared at the next wait. cpu-strict copies at once, so a source the
 * host rewrote before that wait would pass there; on a GPU the queued
 * copy may read it only later: the worker ends naming it. */

typedef struct queued {
	const char *op;
	const void *src;
	size_t n;
	void *was; /* the bytes when queued */
} queued;

static pthread_mutex_t queued_mu = PTHREAD_MUTEX_INITIALIZER;
static queued *queued_v;
static size_t queued_n, queued_cap;

void hpu__dev_queued_note(const char *op, const void *src, size_t n)
{
	if (hpu__dev_cur != &hpu__dev_cpu_strict || !n)
		return;
	void *was = malloc(n);
	if (!was)
		return; /* unchecked, not wrong */
	memcpy(was, src, n);
	pthread_mutex_lock(&queued_mu);
	if (queued_n == queued_cap) {
		size_t cap = queued_cap ? 2 * queued_cap : 8;
		queued *v = realloc(queued_v, cap * sizeof *v);
		if (!v) {
			pthread_mutex_unlock(&queued_mu);
			free(was);
			return;
		}
		queued_v = v;
		queued_cap = cap;
	}
	queued_v[queued_n++] = (queued){op, src, n, was};
	pthread_mutex_unlock(&queued_mu);
}

void hpu__dev_queued_clear(int check)
{
	pthread_mutex_lock(&queued_mu);
	for (size_t i = 0; i < queued_n; i++) {
		queued *q = &queued_v[i];
		if (check && memcmp(q->src, q->was, q->n))
			hpu__dev_fatal("cpu-strict: the host rewrote the source of a queued copy "
				       "(%s, %zu bytes of pinned memory at %p) before its next wait on "
				       "the device: on a GPU the copy could read the new bytes",
				       q->op, q->n, q->src);
		free(q->was);
	}
	queued_n = 0;
	pthread_mutex_unlock(&queued_mu);
}

void hpu__dev_waited(void)
{
	if (hpu__dev_cur->owns)
		atomic_fetch_add(&hpu__dev_wait_count, 1);
	if (hpu__dev_cur == &hpu__dev_cpu_strict)
		hpu__dev_queued_clear(1);
}

uint64_t hpu__dev_waits(void)
{
	return atomic_load(&hpu__dev_wait_count);
}

/* ---- device calls ---- */

void hpu__dev_call_open(void)
{
	if (hpu__dev_cur->enter)
		hpu__dev_cur->enter();
}

void hpu__dev_call_close(void)
{
	if (hpu__dev_cur->leave)
		hpu__dev_cur->leave();
}

/* Host code that opens device memory while a step is recorded into the
 * CPU's list would do its work now, not at each launch: refused (it still
 * opens, so the code runs rather than faults). */
void hpu__dev_enter(void)
{
	hpu__dev_rec_foreign("hpu__dev_enter");
	if (hpu__dev_rec_listing() && hpu__op_layer_name()[0])
		hpu__dev_capture_refuse("layer %s's %s: host code opened device memory while a "
					"step was recorded (a host-only layer, HPU_LAYER_HOST_ONLY, "
					"whose tensors are staged through host memory, or host code "
					"of the layer; its work runs now, not at each launch)",
					hpu__op_layer_name(),
					hpu__op_layer_backward() ? "backward" : "forward");
	else if (hpu__dev_rec_listing())
		hpu__dev_capture_refuse("hpu__dev_enter: host code opened device memory while a "
					"step was recorded (its work runs now, not at each launch)");
	hpu__dev_call_open();
}

void hpu__dev_leave(void)
{
	hpu__dev_call_close();
}

void hpu__dev_layer_enter(void)
{
	if (!hpu__dev_kernels_set)
		hpu__dev_enter();
}

void hpu__dev_layer_leave(void)
{
	if (!hpu__dev_kernels_set)
		hpu__dev_leave();
}

const char *hpu__dev_staged_name;

void hpu__dev_staged_layer(const char *name)
{
	hpu__dev_staged_name = name;
}

/* A device op's buffer must be device memory: on a device that tells
 * (cpu-strict, GPUs) host memory given to one -- the host tier, a
 * staging buffer -- is a bug in the caller, stopped here with one line
 * (the host's loops, hpu__dev_host_rt, are for host memory). */
void hpu__dev_on_device(const char *op, const void *p)
{
	if (!p || !hpu__dev_cur->owns || hpu__dev_cur->owns(p))
		return;
	hpu__dev_fatal("device op %s given host memory at %p under --device %s (host memory is "
		       "the host's: copy it to the device first)",
		       op, p, hpu__dev_cur->name);
}

/* ---- queues and events ---- */

hpu__dev_queue *hpu__dev_queue_new(void)
{
	if (hpu__dev_cur->queue_new)
		return hpu__dev_cur->queue_new();
	return calloc(1, sizeof(hpu__dev_queue));
}

void hpu__dev_queue_free(hpu__dev_queue **q)
{
	if (!q || !*q)
		return;
	if (hpu__dev_cur->queue_free)
		hpu__dev_cur->queue_free(*q);
	else
		free(*q);
	*q = NULL;
}

void hpu__dev_event_record(hpu__dev_queue *q, hpu__dev_event *ev)
{
	hpu__dev_cur->record(q, ev);
}

/* A wait on the host inside a step: a CUDA graph cannot record one (a
 * stream or event synchronisation inside capture is refused and ends
 * the capture), and a step waits only to read something. 1 while
 * recording (refused: the caller waits for nothing); the step guard
 * stops the worker. */
static int host_wait(const char *op)
{
	hpu__dev_rec_foreign(op);
	if (hpu__dev_capturing()) {
		hpu__dev_capture_refuse("%s: a wait on the host", op);
		return 1;
	}
	if (guarded())
		step_caught(op, "waited on the host for the device's queue");
	hpu__dev_waited();
	return 0;
}

void hpu__dev_event_wait(const hpu__dev_event *ev)
{
	if (!host_wait("hpu__dev_event_wait"))
		hpu__dev_cur->wait(ev);
}

void hpu__dev_queue_sync(hpu__dev_queue *q)
{
	hpu__dev_event ev;
	if (host_wait("hpu__dev_queue_sync"))
		return;
	hpu__dev_cur->record(q, &ev);
	hpu__dev_cur->wait(&ev);
}
