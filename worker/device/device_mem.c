/* device_mem: the device's memory (device.h's "memory"): devmem's
 * blocks, pinned host memory, the host buffers; and which host memory is
 * pinned, for recorded copies (hpu__dev_pinned). */
#include "worker/device/device.h"
#include "worker/device/device_impl.h"

#include <pthread.h>
#include <stdlib.h>

/* ---- memory ---- */

void *hpu__dev_alloc(hpu_mem_kind kind, size_t bytes, const char *what)
{
	return hpu__dalloc(kind, bytes, what);
}

void *hpu__dev_alloc_uninit(hpu_mem_kind kind, size_t bytes, const char *what)
{
	return hpu__dalloc_uninit(kind, bytes, what);
}

void hpu__dev_free(void *p)
{
	hpu__dfree(p);
}

/* Pinned host memory handed out (hpu__dev_host_alloc, hbuf's host
 * blocks): a recorded copy from the host reads its source at each launch,
 * so the source must be one of these, not a stack or a temporary. */
static struct {
	pthread_mutex_t mu;
	struct pinned {
		const char *p;
		size_t n;
	} *v;
	size_t n, cap;
} pins = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *pinned_add(void *p, size_t n)
{
	if (!p)
		return NULL;
	pthread_mutex_lock(&pins.mu);
	if (pins.n == pins.cap) {
		size_t cap = pins.cap ? pins.cap * 2 : 64;
		struct pinned *v = realloc(pins.v, cap * sizeof *v);
		if (v) {
			pins.v = v;
			pins.cap = cap;
		}
	}
	if (pins.n < pins.cap) /* else not known: a recorded copy from it is refused */
		pins.v[pins.n++] = (struct pinned){p, n};
	pthread_mutex_unlock(&pins.mu);
	return p;
}

static void pinned_del(const void *p)
{
	pthread_mutex_lock(&pins.mu);
	for (size_t i = 0; i < pins.n; i++)
		if (pins.v[i].p == p) {
			pins.v[i] = pins.v[--pins.n];
			break;
		}
	pthread_mutex_unlock(&pins.mu);
}

int hpu__dev_pinned(const void *p, size_t n)
{
	const char *c = p;
	int in = 0;
	pthread_mutex_lock(&pins.mu);
	for (size_t i = 0; i < pins.n && !in; i++)
		in = c >= pins.v[i].p && n <= pins.v[i].n && (size_t)(c - pins.v[i].p) <= pins.v[i].n - n;
	pthread_mutex_unlock(&pins.mu);
	return in;
}

void *hpu__dev_host_alloc(size_t bytes)
{
	return pinned_add(hpu__dev_cur->host_alloc(bytes), bytes);
}

void hpu__dev_host_free(void *p)
{
	if (!p)
		return;
	pinned_del(p);
	hpu__dev_cur->host_free(p);
}

void *hpu__dev_hbuf_alloc(hpu_mem_kind kind, size_t bytes, const char *what)
{
	if (!hpu__dev_cur->owns)
		return hpu__dalloc(kind, bytes, what);
	(void)kind;
	(void)what;
	return pinned_add(hpu__dev_cur->host_alloc(bytes), bytes);
}

void hpu__dev_hbuf_free(void *p)
{
	if (!p)
		return;
	if (!hpu__dev_cur->owns || hpu__dev_cur->owns(p)) {
		hpu__dfree(p);
	} else {
		pinned_del(p);
		hpu__dev_cur->host_free(p);
	}
}
