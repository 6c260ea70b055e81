/* device_copy: copies between host and device memory and their
 * counters (hpu__dev_copied), fills, their nodes in the CPU's list while
 * recording, and collectives on device memory. */
#include "worker/device/device.h"
#include "worker/device/device_impl.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* ---- copies ---- */

static void copy(hpu__dev_queue *q, void *dst, const void *src, size_t n)
{
	hpu__dev_call_open();
	hpu__dev_cur->copy(q, dst, src, n);
	hpu__dev_call_close();
}

/* ---- recording: the copies' and fills' nodes ---- */

typedef struct copy_args {
	void *dst;
	const void *src;
	size_t n;
	int byte;
} copy_args;

static int run_h2d(const void *p)
{
	const copy_args *a = p;
	atomic_fetch_add(&hpu__dev_copied_h2d, a->n);
	copy(NULL, a->dst, a->src, a->n);
	return 0;
}

static int run_d2d(const void *p)
{
	const copy_args *a = p;
	copy(NULL, a->dst, a->src, a->n);
	return 0;
}

static int run_fill(const void *p)
{
	const copy_args *a = p;
	hpu__dev_call_open();
	hpu__dev_cur->fill(NULL, a->dst, a->byte, a->n);
	hpu__dev_call_close();
	return 0;
}

static void rec_copy(const char *what, hpu__dev_node_fn *run, void *dst, const void *src,
		     size_t n, int byte)
{
	copy_args *a = hpu__dev_rec_node(what, run, sizeof *a);
	if (a)
		*a = (copy_args){dst, src, n, byte};
}

size_t hpu__dev_rec_rebind(hpu__dev_graph *g, const void *from, const void *to, size_t bytes)
{
	size_t changed = 0;
	for (size_t i = 0; i < g->n; i++) {
		copy_args *a = (copy_args *)g->nodes[i].args; /* the graph's own chunk */
		if (g->nodes[i].run == run_h2d && a->src == from && a->n <= bytes) {
			a->src = to;
			changed++;
		}
	}
	return changed;
}

/* A copy from host memory while recording: its source is read at each
 * launch (the pinned block the runtime rewrites before it), so it must
 * stay: pinned memory of the device's. 1 where refused. */
static int h2d_refused(const char *op, const void *src, size_t n)
{
	if (!n || hpu__dev_pinned(src, n))
		return 0;
	hpu__dev_capture_refuse("%s: a copy from host memory that is not pinned memory "
				"(hpu__dev_host_alloc): a replay reads its source when it runs",
				op);
	return 1;
}

/* A copy into host memory while recording: refused, nothing done. */
static void d2h_refused(const char *op)
{
	hpu__dev_capture_refuse("%s: a copy into host memory", op);
}

void hpu__dev_h2d(hpu__dev_queue *q, void *dst, const void *src, size_t n)
{
	hpu__dev_rec_foreign("hpu__dev_h2d");
	if (hpu__dev_capturing() && h2d_refused("hpu__dev_h2d", src, n))
		return;
	if (hpu__dev_rec_listing()) {
		rec_copy("hpu__dev_h2d", run_h2d, dst, src, n, 0);
		return;
	}
	atomic_fetch_add(&hpu__dev_copied_h2d, n);
	if (n && !hpu__dev_capturing()) /* the source may change once it returns */
		hpu__dev_waited();
	copy(q, dst, src, n);
}

void hpu__dev_d2h(hpu__dev_queue *q, void *dst, const void *src, size_t n)
{
	hpu__dev_rec_foreign("hpu__dev_d2h");
	if (hpu__dev_capturing()) {
		d2h_refused("hpu__dev_d2h");
		return;
	}
	hpu__dev_step_copy("hpu__dev_d2h", dst, src, n);
	atomic_fetch_add(&hpu__dev_copied_d2h, n);
	if (n)
		hpu__dev_waited();
	copy(q, dst, src, n);
}

/* Where one side is host memory (the host tier, a staging buffer) the
 * bytes cross the bus: counted as the h2d or d2h copy they are. */
void hpu__dev_d2d(hpu__dev_queue *q, void *dst, const void *src, size_t n)
{
	hpu__dev_rec_foreign("hpu__dev_d2d");
	if (hpu__dev_capturing() && n && hpu__dev_cur->owns && !hpu__dev_cur->owns(dst)) {
		d2h_refused("hpu__dev_d2d");
		return;
	}
	if (hpu__dev_capturing() && n && hpu__dev_cur->owns && !hpu__dev_cur->owns(src) && h2d_refused("hpu__dev_d2d", src, n))
		return;
	if (hpu__dev_rec_listing()) {
		int from_host = n && hpu__dev_cur->owns && !hpu__dev_cur->owns(src);
		rec_copy("hpu__dev_d2d", from_host ? run_h2d : run_d2d, dst, src, n, 0);
		return;
	}
	hpu__dev_step_copy("hpu__dev_d2d", dst, src, n);
	int host = 0;
	if (hpu__dev_cur->owns && !hpu__dev_cur->owns(dst) && n)
		atomic_fetch_add(&hpu__dev_copied_d2h, n), host = 1;
	else if (hpu__dev_cur->owns && !hpu__dev_cur->owns(src) && n)
		atomic_fetch_add(&hpu__dev_copied_h2d, n), host = !hpu__dev_capturing();
	if (host)
		hpu__dev_waited();
	copy(q, dst, src, n);
}

void hpu__dev_memset(hpu__dev_queue *q, void *dst, int byte, size_t n)
{
	hpu__dev_on_device("memset", dst);
	hpu__dev_rec_foreign("hpu__dev_memset");
	if (hpu__dev_rec_listing()) {
		rec_copy("hpu__dev_memset", run_fill, dst, NULL, n, byte);
		return;
	}
	hpu__dev_call_open();
	hpu__dev_cur->fill(q, dst, byte, n);
	hpu__dev_call_close();
}

int hpu__dev_owns(const void *p)
{
	return hpu__dev_cur->owns ? hpu__dev_cur->owns(p) : 0;
}

void hpu__dev_copy(void *dst, const void *src, size_t n)
{
	if (!hpu__dev_cur->owns) {
		if (n)
			memmove(dst, src, n);
		return;
	}
	int d = hpu__dev_cur->owns(dst), s = hpu__dev_cur->owns(src);
	if (hpu__dev_capturing() && s && !d && n) {
		d2h_refused("hpu__dev_copy");
		return;
	}
	hpu__dev_step_copy("hpu__dev_copy", dst, src, n);
	if (d && s)
		hpu__dev_d2d(NULL, dst, src, n);
	else if (d)
		hpu__dev_h2d(NULL, dst, src, n);
	else if (s)
		hpu__dev_d2h(NULL, dst, src, n);
	else if (n) /* host to host: the host's own, done now */
		memmove(dst, src, n);
}

/* A copy on the default queue, not waited for where the device can
 * leave it queued (copy_queued), else done now. */
static void issue_queued(void *dst, const void *src, size_t n)
{
	hpu__dev_call_open();
	if (hpu__dev_cur->copy_queued)
		hpu__dev_cur->copy_queued(NULL, dst, src, n);
	else
		hpu__dev_cur->copy(NULL, dst, src, n);
	hpu__dev_call_close();
}

void hpu__dev_copy_queued(void *dst, const void *src, size_t n)
{
	if (!hpu__dev_cur->owns || !n || hpu__dev_capturing() || hpu__dev_rec_listing() ||
	    !hpu__dev_cur->owns(dst) || hpu__dev_cur->owns(src) || !hpu__dev_pinned(src, n)) {
		hpu__dev_copy(dst, src, n);
		return;
	}
	hpu__dev_rec_foreign("hpu__dev_copy_queued");
	atomic_fetch_add(&hpu__dev_copied_h2d, n);
	hpu__dev_queued_note("hpu__dev_copy_queued", src, n);
	issue_queued(dst, src, n);
}

/* A span hpu__dev_d2h_n queues: from device memory into host memory. */
static int queues(const hpu__dev_span *c)
{
	return c->n && hpu__dev_cur->owns(c->src) && !hpu__dev_cur->owns(c->dst);
}

void hpu__dev_d2h_n(const hpu__dev_span *c, int n)
{
	int queued = 0;
	for (int i = 0; i < n; i++) {
		if (!c[i].n)
			continue;
		if (!hpu__dev_cur->owns || !queues(&c[i])) {
			hpu__dev_copy(c[i].dst, c[i].src, c[i].n);
			continue;
		}
		hpu__dev_rec_foreign("hpu__dev_d2h_n");
		if (hpu__dev_capturing()) {
			d2h_refused("hpu__dev_d2h_n");
			return;
		}
		hpu__dev_step_copy("hpu__dev_d2h_n", c[i].dst, c[i].src, c[i].n);
		atomic_fetch_add(&hpu__dev_copied_d2h, c[i].n);
		issue_queued(c[i].dst, c[i].src, c[i].n);
		queued++;
	}
	if (!queued)
		return;
	hpu__dev_waited();
	if (hpu__dev_cur->copy_queued) { /* the one wait: the default queue's */
		hpu__dev_event ev;
		hpu__dev_call_open();
		hpu__dev_cur->record(NULL, &ev);
		hpu__dev_cur->wait(&ev);
		hpu__dev_call_close();
	}
}

void hpu__dev_copied(uint64_t *h2d, uint64_t *d2h)
{
	*h2d = atomic_load(&hpu__dev_copied_h2d);
	*d2h = atomic_load(&hpu__dev_copied_d2h);
}

/* ---- collectives on device memory ---- */

int hpu__dev_group_open(hpu__dev_group **out, int rank, int world, size_t bytes,
			hpu__dev_xchg_fn *xchg, void *arg, char *why, size_t whylen)
{
	*out = NULL;
	if (!hpu__dev_cur->coll) {
		snprintf(why, whylen, "device %s has no collectives of its own", hpu__dev_cur->name);
		return 1;
	}
	if (hpu__dev_capturing()) { /* a set-up: exchanges through the host */
		hpu__dev_capture_refuse("hpu__dev_group_open: a group is set up through the host");
		snprintf(why, whylen, "a group cannot be set up while a step is recorded");
		return -1;
	}
	hpu__dev_call_open();
	int rc = hpu__dev_cur->coll->open(out, rank, world, bytes, xchg, arg, why, whylen);
	hpu__dev_call_close();
	return rc;
}

int hpu__dev_group_all_reduce(hpu__dev_group *g, const void *send, void *recv, size_t count,
			      hpu__dev_dtype dt)
{
	hpu__dev_on_device("group_all_reduce", send);
	hpu__dev_on_device("group_all_reduce", recv);
	if (hpu__dev_rec_listing()) { /* the CPU's list holds no collectives (cpu has none) */
		hpu__dev_capture_refuse("hpu__dev_group_all_reduce: device %s records no "
					"collectives",
					hpu__dev_cur->name);
		return 0;
	}
	hpu__dev_call_open();
	int rc = hpu__dev_cur->coll->all_reduce(g, send, recv, count, dt);
	hpu__dev_call_close();
	return rc;
}

void hpu__dev_group_close(hpu__dev_group **g)
{
	if (!*g)
		return;
	if (hpu__dev_capturing()) /* a last exchange through the host */
		hpu__dev_capture_refuse("hpu__dev_group_close: a group is closed through the host");
	hpu__dev_call_open();
	hpu__dev_cur->coll->close(*g);
	hpu__dev_call_close();
	*g = NULL;
}
