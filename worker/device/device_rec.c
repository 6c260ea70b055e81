/* device_rec: the recording of a step (device.h's hpu__dev_capture_begin,
 * device_graph.c) as this thread's state, and the CPU's list: the nodes
 * that device_copy.c (copies, fills), device_rt.c (the runtime's ops)
 * and device_kernels.c (the
 * kernel table's entries) append while the thread records, the host
 * nodes a caller appends (hpu__dev_rec_host: the strategy's collectives
 * through libhpucoll), their arguments kept in chunks that never move,
 * and a launch's walk over them, and the profiler's spans of a launch's nodes (worker/hpu/prof.h).
 * Calls no other file of the folder (device_call.c, device_copy.c,
 * device_rt.c, device_graph.c and device_kernels.c call it). */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/device/device.h"
#include "worker/device/device_impl.h"
#include "worker/hpu/prof.h"

/* The calling thread's graph; whether any thread records (one at a
 * time) and into the CPU's list; the first reason the recording was
 * refused (refused set; from any thread: work another thread gives the
 * device meanwhile is not recorded). */
static _Thread_local hpu__dev_graph *rec;
static atomic_int rec_busy, rec_lists;
static pthread_mutex_t refused_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int refused;
static char refused_why[512];

#define CHUNK_BYTES ((size_t)64 << 10)

/* Out of host memory while recording: refused. */
static void *rec_oom(void)
{
	hpu__dev_capture_refuse("the recording ran out of host memory");
	return NULL;
}

static void *graph_bytes(hpu__dev_graph *g, size_t bytes)
{
	size_t a = sizeof(max_align_t);
	bytes = (bytes + a - 1) / a * a;
	if (!g->mem || g->mem->cap - g->mem->used < bytes) {
		size_t cap = bytes > CHUNK_BYTES ? bytes : CHUNK_BYTES;
		gchunk *c = malloc(sizeof *c + cap);
		if (!c)
			return rec_oom();
		c->next = g->mem;
		c->used = 0;
		c->cap = cap;
		g->mem = c;
	}
	void *p = (char *)g->mem->data + g->mem->used;
	g->mem->used += bytes;
	memset(p, 0, bytes);
	return p;
}

/* A node's name for the profiler and hpu__dev_graph_names: `what`
 * without its prefix ("the kernel gemm": "gemm", "hpu__dev_h2d": "h2d"). */
static const char *short_name(const char *what)
{
	static const char *const prefix[] = {"the kernel ", "hpu__dev_"};
	for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++) {
		size_t n = strlen(prefix[i]);
		if (!strncmp(what, prefix[i], n))
			return what + n;
	}
	return what;
}

void *hpu__dev_rec_node(const char *what, hpu__dev_node_fn *run, size_t bytes)
{
	hpu__dev_graph *g = rec;
	if (!g || atomic_load_explicit(&refused, memory_order_relaxed)) /* nothing more kept */
		return NULL;
	if (g->n == g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 256;
		gnode *v = realloc(g->nodes, cap * sizeof *v);
		if (!v)
			return rec_oom();
		g->nodes = v;
		g->cap = cap;
	}
	void *args = graph_bytes(g, bytes);
	if (!args)
		return NULL;
	g->nodes[g->n++] = (gnode){run, args, what, short_name(what)};
	return args;
}

const void *hpu__dev_rec_keep(const void *src, size_t bytes)
{
	if (!rec || atomic_load_explicit(&refused, memory_order_relaxed) || !src)
		return NULL;
	void *p = graph_bytes(rec, bytes ? bytes : 1);
	if (p && bytes)
		memcpy(p, src, bytes);
	return p;
}

void hpu__dev_rec_drop_list(hpu__dev_graph *g)
{
	while (g->mem) {
		gchunk *next = g->mem->next;
		free(g->mem);
		g->mem = next;
	}
	free(g->nodes);
	g->nodes = NULL;
	g->n = g->cap = 0;
	free(g->names);
	g->names = NULL;
	g->nnames = 0;
}

static void refuse_other(const char *fmt, ...);

/* ---- host nodes (hpu__dev_rec_host) ---- */

/* A failed host node's sentence, for node_failed (the launching
 * thread's). */
static _Thread_local char host_err[512];

typedef struct host_args {
	hpu__dev_host_fn *fn;
	max_align_t arg[]; /* the caller's bytes */
} host_args;

static int run_host(const void *p)
{
	const host_args *a = p;
	host_err[0] = '\0';
	if (a->fn(a->arg, host_err, sizeof host_err) == 0)
		return 0;
	if (!host_err[0])
		snprintf(host_err, sizeof host_err, "a host call failed");
	return -1;
}

int hpu__dev_rec_host(const char *what, hpu__dev_host_fn *fn, const void *arg, size_t bytes)
{
	if (!hpu__dev_rec_listing())
		return -1;
	host_args *a = hpu__dev_rec_node(what, run_host, sizeof *a + bytes);
	if (!a) /* refused already, or now: nothing more is kept */
		return 0;
	a->fn = fn;
	if (bytes)
		memcpy(a->arg, arg, bytes);
	return 0;
}

size_t hpu__dev_graph_host_calls(const hpu__dev_graph *g)
{
	size_t n = 0;
	for (size_t i = 0; g && i < g->n; i++) /* a device's own graph: none */
		n += g->nodes[i].run == run_host;
	return n;
}

/* The index of name among g->names[0 .. g->nnames), or g->nnames. */
static size_t name_at(const hpu__dev_graph *g, const char *name)
{
	size_t k = 0;
	while (k < g->nnames && g->names[k].name != name && strcmp(g->names[k].name, name))
		k++;
	return k;
}

void hpu__dev_rec_count(hpu__dev_graph *g)
{
	size_t cap = 0;
	for (size_t i = 0; i < g->n; i++) {
		size_t k = name_at(g, g->nodes[i].name);
		if (k < g->nnames) {
			g->names[k].count++;
			continue;
		}
		if (g->nnames == cap) {
			cap = cap ? cap * 2 : 32;
			hpu__dev_node_count *v = realloc(g->names, cap * sizeof *v);
			if (!v) {
				refuse_other("the recording ran out of host memory");
				return;
			}
			g->names = v;
		}
		g->names[g->nnames++] = (hpu__dev_node_count){g->nodes[i].name, 1};
	}
}

int hpu__dev_rec_claim(void)
{
	int idle = 0;
	return atomic_compare_exchange_strong(&rec_busy, &idle, 1) ? 0 : -1;
}

void hpu__dev_rec_unclaim(void)
{
	atomic_store(&rec_busy, 0);
}

void hpu__dev_rec_start(hpu__dev_graph *g, int lists)
{
	pthread_mutex_lock(&refused_mu);
	atomic_store(&refused, 0);
	refused_why[0] = '\0';
	pthread_mutex_unlock(&refused_mu);
	atomic_store(&rec_lists, lists);
	rec = g;
}

hpu__dev_graph *hpu__dev_rec_stop(void)
{
	hpu__dev_graph *g = rec;
	rec = NULL;
	return g;
}

int hpu__dev_rec_refused(char *why, size_t whylen)
{
	pthread_mutex_lock(&refused_mu);
	int r = atomic_load(&refused);
	if (r)
		snprintf(why, whylen, "%s", refused_why);
	pthread_mutex_unlock(&refused_mu);
	return r;
}

int hpu__dev_capturing(void)
{
	return rec != NULL;
}

int hpu__dev_rec_listing(void)
{
	return rec && atomic_load_explicit(&rec_lists, memory_order_relaxed);
}

static void refuse_v(const char *fmt, va_list ap)
{
	pthread_mutex_lock(&refused_mu);
	if (!atomic_load(&refused)) {
		vsnprintf(refused_why, sizeof refused_why, fmt, ap);
		atomic_store(&refused, 1);
	}
	pthread_mutex_unlock(&refused_mu);
}

void hpu__dev_capture_refuse(const char *fmt, ...)
{
	if (!rec || atomic_load_explicit(&refused, memory_order_relaxed))
		return;
	va_list ap;
	va_start(ap, fmt);
	refuse_v(fmt, ap);
	va_end(ap);
}

static void refuse_other(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	refuse_v(fmt, ap);
	va_end(ap);
}

void hpu__dev_rec_foreign(const char *what)
{
	if (rec || !atomic_load_explicit(&rec_busy, memory_order_relaxed) ||
	    !atomic_load_explicit(&rec_lists, memory_order_relaxed))
		return;
	refuse_other("%s ran on another thread while a step was recorded (only the recording "
		     "thread's device work is recorded)",
		     what);
}

static int node_failed(const hpu__dev_graph *g, size_t i, int r, char *err, size_t errlen)
{
	if (g->nodes[i].run == run_host) { /* its own sentence */
		snprintf(err, errlen, "%s", host_err);
		return -1;
	}
	snprintf(err, errlen, "a recorded step's node %zu of %zu, %s, answered %d when replayed",
		 i + 1, g->n, g->nodes[i].what, r);
	return -1;
}

/* The walk with the profiler on: each node a span of its own. */
static int run_timed(hpu__dev_graph *g, char *err, size_t errlen)
{
	for (size_t i = 0; i < g->n; i++) {
		int64_t t0 = hpu__prof_now();
		int r = g->nodes[i].run(g->nodes[i].args);
		hpu__prof_span("graph_node", g->nodes[i].name, NULL, t0, NULL);
		if (r != 0)
			return node_failed(g, i, r, err, errlen);
	}
	return 0;
}

int hpu__dev_rec_run(hpu__dev_graph *g, char *err, size_t errlen)
{
	if (hpu__prof_enabled)
		return run_timed(g, err, errlen);
	for (size_t i = 0; i < g->n; i++) {
		int r = g->nodes[i].run(g->nodes[i].args);
		if (r != 0)
			return node_failed(g, i, r, err, errlen);
	}
	return 0;
}
