/* device: choosing the device, the cpu device's table, and the calls
 * every device shares (see device.h). */
#include "worker/device/device.h"
#include "worker/device/device_impl.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/env.h"
#include "common/log.h"

struct hpu__dev_queue {
	atomic_uint_fast64_t seq; /* work issued so far */
};

static const hpu__device *cur = &hpu__dev_cpu;
static hpu__dev_caps cur_caps;
static int caps_known;
static int cur_rank;
static int kernels_set; /* the ops use hpu__dev_kernels_table */
static int table_set;   /* the ops use a device's own table (cuda) */
static atomic_uint_fast64_t copied_h2d, copied_d2h;
/* The step guard (hpu__dev_step_guard): step_strict is HPU_STRICT_STEP=1
 * on cpu-strict, read when the device opens; step_on is the guard, set
 * by the main thread and read by any thread that calls the device. */
static int step_strict;
static atomic_int step_on;

/* ---- the cpu device: host memory, work done when issued ---- */

static int cpu_setup(int rank, char *err, size_t errlen)
{
	(void)rank;
	(void)err;
	(void)errlen;
	return 0;
}

static void cpu_teardown(void)
{
}

static void cpu_caps(hpu__dev_caps *out)
{
	const hpu__backend *be = hpu__be();
	memset(out, 0, sizeof *out);
	out->bf16_native = be->bf16_native ? be->bf16_native() : 0;
	out->host_can_read = 1;
}

void hpu__dev_cpu_copy(hpu__dev_queue *q, void *dst, const void *src, size_t n)
{
	if (q)
		q->seq++;
	if (n)
		memmove(dst, src, n);
}

void hpu__dev_cpu_fill(hpu__dev_queue *q, void *dst, int byte, size_t n)
{
	if (q)
		q->seq++;
	if (n)
		memset(dst, byte, n);
}

void hpu__dev_cpu_record(hpu__dev_queue *q, hpu__dev_event *ev)
{
	ev->q = q;
	ev->seq = q ? q->seq : 0;
}

void hpu__dev_cpu_wait(const hpu__dev_event *ev)
{
	(void)ev; /* the work before it is done already */
}

void *hpu__dev_cpu_host_alloc(size_t bytes)
{
	size_t n = (bytes + 63) / 64 * 64;
	void *p = aligned_alloc(64, n ? n : 64);
	if (p)
		memset(p, 0, n);
	return p;
}

void hpu__dev_cpu_host_free(void *p)
{
	free(p);
}

const hpu__device hpu__dev_cpu = {
    .name = "cpu",
    .setup = cpu_setup,
    .teardown = cpu_teardown,
    .caps = cpu_caps,
    HPU__DEV_CPU_SHARED,
};

/* ---- the CUDA device's module ---- */

#define CUDA_MODULE "hpudev_cuda.so"
#ifndef HPU_INSTALL_LIBDIR
#define HPU_INSTALL_LIBDIR "lib"
#endif

/* The module's path in `out`: HPU_CUDA_MODULE, else the first that exists
 * of ../lib (the build tree) and ../LIBDIR/hputrain (an install) beside
 * the program. -1 with the sentence in err where this build has none. */
static int cuda_module_path(char *out, size_t len, char *err, size_t errlen)
{
	const char *env = hpu__env_str(HPU_ENV_HPU_CUDA_MODULE);
	if (env && *env) {
		snprintf(out, len, "%s", env);
		return 0;
	}
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	char *slash = n > 0 ? (exe[n] = '\0', strrchr(exe, '/')) : NULL;
	if (slash)
		*slash = '\0';
	static const char *const rel[] = {"/../lib/", "/../" HPU_INSTALL_LIBDIR "/hputrain/"};
	for (size_t i = 0; slash && i < sizeof rel / sizeof rel[0]; i++) {
		snprintf(out, len, "%s%s" CUDA_MODULE, exe, rel[i]);
		if (access(out, F_OK) == 0)
			return 0;
	}
#ifdef HPU_CUDA_BUILT
	snprintf(err, errlen,
		 "--device cuda: cannot find the CUDA device's module " CUDA_MODULE
		 " beside %s (../lib or ../%s/hputrain; HPU_CUDA_MODULE names another)",
		 slash ? exe : "the program", HPU_INSTALL_LIBDIR);
#else
	snprintf(err, errlen,
		 "--device cuda: the CUDA device is not built in this build (use --device cpu or auto)");
#endif
	return -1;
}

/* The CUDA device's table, and the GPUs it sees in *ngpus; NULL with the
 * sentence in err where the module is missing or does not load. A module
 * stays loaded (CUDA's run-time does not unload); another path, as
 * HPU_CUDA_MODULE may name, loads another. */
static const hpu__device *cuda_load(int *ngpus, char *err, size_t errlen)
{
	static void *handle;
	static char loaded[PATH_MAX + 64];
	char path[PATH_MAX + 64];
	*ngpus = 0;
	if (cuda_module_path(path, sizeof path, err, errlen) < 0)
		return NULL;
	if (!handle || strcmp(path, loaded)) {
		void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			snprintf(err, errlen, "--device cuda: cannot load the CUDA device's module: %s",
				 dlerror());
			return NULL;
		}
		handle = h;
		snprintf(loaded, sizeof loaded, "%s", path);
	}
	hpu__cuda_entry_fn *entry;
	*(void **)&entry = dlsym(handle, HPU__CUDA_ENTRY);
	if (!entry) {
		snprintf(err, errlen,
			 "--device cuda: the CUDA device's module has no " HPU__CUDA_ENTRY
			 " (a module of another version?)");
		return NULL;
	}
	char why[256] = "";
	const hpu__device *d = entry(ngpus, why, sizeof why);
	if (d && *ngpus <= 0)
		snprintf(err, errlen, "--device cuda: no GPU is visible (%s)", why);
	return d;
}

/* ---- choosing ---- */

static const hpu__device *by_name(const char *name, char *err, size_t errlen)
{
	if (!name || !*name || !strcmp(name, "cpu"))
		return &hpu__dev_cpu;
	if (!strcmp(name, "cpu-strict"))
		return &hpu__dev_cpu_strict;
	int ngpus;
	if (!strcmp(name, "auto")) { /* cuda where it loads and sees a GPU */
		char why[512];
		const hpu__device *d = cuda_load(&ngpus, why, sizeof why);
		return d && ngpus > 0 ? d : &hpu__dev_cpu;
	}
	if (!strcmp(name, "cuda")) {
		const hpu__device *d = cuda_load(&ngpus, err, errlen);
		return d && ngpus > 0 ? d : NULL;
	}
	snprintf(err, errlen, "--device %s: no such device (cpu, cpu-strict, cuda or auto)", name);
	return NULL;
}

int hpu__dev_check_name(const char *name, char *err, size_t errlen)
{
	return by_name(name, err, errlen) ? 0 : -1;
}

int hpu__dev_count_gpus(char *err, size_t errlen)
{
	int ngpus;
	const hpu__device *d = cuda_load(&ngpus, err, errlen);
	return d && ngpus > 0 ? ngpus : 0;
}

int hpu__dev_open(const char *name, int rank, char *err, size_t errlen)
{
	const hpu__device *d = by_name(name, err, errlen);
	if (!d)
		return -1;
	if (d->setup(rank, err, errlen) < 0) {
		if (!name || strcmp(name, "auto") || d == &hpu__dev_cpu)
			return -1;
		/* auto: a GPU that does not set up leaves the CPU */
		hpu__log(HPU_LOG_WARNING, "rank %d: --device auto: %s; computing on cpu", rank, err);
		d = &hpu__dev_cpu;
	}
	hpu__devmem_set_backing(d->backing);
	if (d == &hpu__dev_cpu_strict && hpu__dev_strict_kernels()) {
		hpu__be_set(hpu__dev_kernels_table(d));
		hpu__dev_kernels_scratch();
		kernels_set = 1;
	} else if (d != &hpu__dev_cpu && d != &hpu__dev_cpu_strict && d->ops) {
		/* a device with kernels of its own (cuda): the ops run on its
		 * table, their scratch in its memory; a layer stays one device
		 * call (the call binds the thread to the worker's GPU) */
		hpu__be_set(d->ops());
		hpu__dev_kernels_scratch();
		table_set = 1;
	}
	cur = d;
	cur_rank = rank;
	caps_known = 0;
	const char *e = hpu__env_str(HPU_ENV_HPU_STRICT_STEP);
	step_strict = d == &hpu__dev_cpu_strict && e && !strcmp(e, "1");
	atomic_store(&step_on, 0);
	atomic_store(&copied_h2d, 0);
	atomic_store(&copied_d2h, 0);
	return 0;
}

/* --graphs on --device cpu: the device becomes hpu__dev_cpu_rec (its
 * memory the arena that tells device memory from the host's, always open)
 * on the kernels-only table; devmem is not set up yet. Eager --device cpu
 * keeps its own table and memory. */
static int cpu_records(char *err, size_t errlen)
{
	if (hpu__dev_cpu_rec.setup(cur_rank, err, errlen) < 0)
		return -1;
	hpu__devmem_set_backing(hpu__dev_cpu_rec.backing);
	cur = &hpu__dev_cpu_rec;
	return 0;
}

int hpu__dev_configure(const hpu__dev_config *c, uint64_t *capacity, char *note,
		       size_t notelen, char *err, size_t errlen)
{
	*capacity = 0;
	if (notelen)
		note[0] = '\0';
	if (c->graphs && cur == &hpu__dev_cpu && cpu_records(err, errlen) < 0)
		return -1;
	int strict = cur == &hpu__dev_cpu_strict;
	if (c->graphs && (strict || cur == &hpu__dev_cpu_rec) && !kernels_set) {
		/* recording needs every access to device memory to be a call
		 * of the device: its kernels-only table, as HPU_STRICT_KERNELS=1 */
		hpu__be_set(hpu__dev_kernels_table(cur));
		hpu__dev_kernels_scratch();
		kernels_set = 1;
		caps_known = 0;
	}
	if (c->graphs && strict)
		snprintf(note, notelen,
			 "--graphs: the ops run on cpu-strict's kernels-only table, and a step is "
			 "recorded once and replayed");
	else if (c->graphs && cur == &hpu__dev_cpu_rec)
		snprintf(note, notelen,
			 "--graphs: the ops run on the kernels-only table (cpu-strict's without its "
			 "memory protection), and a step is recorded once and replayed");
	if (cur->configure)
		return cur->configure(c, capacity, note, notelen, err, errlen);
	if (c->allow_tf32) /* accepted, as PyTorch's flag is on a CPU */
		snprintf(note, notelen,
			 "--allow-tf32 has no effect on device %s: its fp32 products stay fp32",
			 cur->name);
	return 0;
}

int hpu__dev_gpu_sharers(const char *ids, size_t idlen, int world, int rank)
{
	if (!ids || !idlen || rank < 0 || rank >= world)
		return 1;
	const char *mine = ids + (size_t)rank * idlen;
	if (!memchr(mine, 0, idlen) || !mine[0])
		return 1;
	int n = 0;
	for (int r = 0; r < world; r++) {
		const char *e = ids + (size_t)r * idlen;
		n += memchr(e, 0, idlen) && !strcmp(e, mine);
	}
	return n;
}

void hpu__dev_gpu_ident(char *out, size_t outlen)
{
	const hpu__dev_caps *k = hpu__dev_caps_get();
	char host[256] = "";
	if (!outlen)
		return;
	out[0] = 0;
	if (!k->gpu_id[0] || gethostname(host, sizeof host - 1) < 0)
		return;
	if (snprintf(out, outlen, "%s %s", host, k->gpu_id) >= (int)outlen)
		out[0] = 0; /* too long to compare whole: counted alone */
}

uint64_t hpu__dev_default_memory(uint64_t capacity, int sharers, uint64_t host_bytes,
				 int local_workers)
{
	if (capacity)
		return capacity / (uint64_t)(sharers > 0 ? sharers : 1);
	return host_bytes / (uint64_t)(local_workers > 0 ? local_workers : 1);
}

void hpu__dev_close(void)
{
	hpu__devmem_set_backing(NULL);
	cur->teardown();
	if (kernels_set || table_set)
		hpu__be_set(NULL);
	kernels_set = table_set = 0;
	cur = &hpu__dev_cpu;
	caps_known = 0;
	step_strict = 0;
	atomic_store(&step_on, 0);
}

const hpu__device *hpu__dev(void)
{
	return cur;
}

const char *hpu__dev_name(void)
{
	return cur->name;
}

const hpu__dev_caps *hpu__dev_caps_get(void)
{
	if (!caps_known) {
		cur->caps(&cur_caps);
		if (cur == &hpu__dev_cpu_strict || cur == &hpu__dev_cpu_rec)
			/* on the kernels-only table: recording, and the ops'
			 * zeros as its calls */
			cur_caps.can_capture = cur_caps.ops_fill = kernels_set;
		caps_known = 1;
	}
	return &cur_caps;
}

int hpu__dev_kernels_on(void)
{
	return kernels_set;
}

int hpu__dev_host_can_read(void)
{
	return hpu__dev_caps_get()->host_can_read;
}

int hpu__dev_ops_fill(void)
{
	const hpu__dev_caps *c = hpu__dev_caps_get();
	return c->host_can_read || c->ops_fill;
}

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

/* 1 when [p, p + n) lies in one pinned block. */
static int pinned(const void *p, size_t n)
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
	return pinned_add(cur->host_alloc(bytes), bytes);
}

void hpu__dev_host_free(void *p)
{
	if (!p)
		return;
	pinned_del(p);
	cur->host_free(p);
}

void *hpu__dev_hbuf_alloc(hpu_mem_kind kind, size_t bytes, const char *what)
{
	if (!cur->owns)
		return hpu__dalloc(kind, bytes, what);
	(void)kind;
	(void)what;
	return pinned_add(cur->host_alloc(bytes), bytes);
}

void hpu__dev_hbuf_free(void *p)
{
	if (!p)
		return;
	if (!cur->owns || cur->owns(p)) {
		hpu__dfree(p);
	} else {
		pinned_del(p);
		cur->host_free(p);
	}
}

/* ---- the step guard ---- */

void hpu__dev_step_guard(int on)
{
	if (step_strict)
		atomic_store_explicit(&step_on, on != 0, memory_order_relaxed);
}

/* (A thread that records refuses what the guard would stop: its
 * recording fails, not the worker.) */
static int guarded(void)
{
	return atomic_load_explicit(&step_on, memory_order_relaxed) && !hpu__dev_capturing();
}

/* The guard caught `op` doing `what` (a phrase: "returned a value to
 * the host (...)"): one line, and the worker ends. */
static void step_caught(const char *op, const char *what)
{
	fprintf(stderr,
		"hpu-worker: rank %d: cpu-strict: %s %s inside a training step (HPU_STRICT_STEP=1): a recorded step (--graphs) cannot do that\n",
		cur_rank, op, what);
	fflush(stderr);
	_exit(1);
}

/* A copy from device memory into host memory under the guard. */
static void step_copy(const char *op, const void *dst, const void *src, size_t n)
{
	if (!guarded() || !n || !cur->owns || cur->owns(dst) || !cur->owns(src))
		return;
	char block[160] = "device memory", what[256];
	if (cur->describe)
		cur->describe(src, block, sizeof block);
	snprintf(what, sizeof what, "brought %zu bytes of %s back to the host", n, block);
	step_caught(op, what);
}

/* An op that returns a value computed from device memory at src. */
static void step_value(const char *op, const void *src)
{
	if (!guarded())
		return;
	char block[160] = "device memory", what[256];
	if (cur->describe)
		cur->describe(src, block, sizeof block);
	snprintf(what, sizeof what, "returned a value to the host (read from %s)", block);
	step_caught(op, what);
}

/* ---- device calls, copies ---- */

/* device.c's own device calls (copies, fills, the runtime's ops, a
 * launch) */
static void dev_open(void)
{
	if (cur->enter)
		cur->enter();
}

static void dev_close(void)
{
	if (cur->leave)
		cur->leave();
}

static int listing(void);

/* Host code that opens device memory while a step is recorded into the
 * CPU's list would do its work now, not at each launch: refused (it still
 * opens, so the code runs rather than faults). */
void hpu__dev_enter(void)
{
	hpu__dev_rec_foreign("hpu__dev_enter");
	if (listing())
		hpu__dev_capture_refuse("hpu__dev_enter: host code opened device memory while a "
					"step was recorded (its work runs now, not at each launch)");
	dev_open();
}

void hpu__dev_leave(void)
{
	dev_close();
}

void hpu__dev_layer_enter(void)
{
	if (!kernels_set)
		hpu__dev_enter();
}

void hpu__dev_layer_leave(void)
{
	if (!kernels_set)
		hpu__dev_leave();
}

static void copy(hpu__dev_queue *q, void *dst, const void *src, size_t n)
{
	dev_open();
	cur->copy(q, dst, src, n);
	dev_close();
}

/* ---- recording: the copies' and fills' nodes ---- */

/* 1 while this thread records into the CPU's list (a device with a
 * recorder records its own calls). */
static int listing(void)
{
	return hpu__dev_rec_listing();
}

typedef struct copy_args {
	void *dst;
	const void *src;
	size_t n;
	int byte;
} copy_args;

static int run_h2d(const void *p)
{
	const copy_args *a = p;
	atomic_fetch_add(&copied_h2d, a->n);
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
	dev_open();
	cur->fill(NULL, a->dst, a->byte, a->n);
	dev_close();
	return 0;
}

static void rec_copy(const char *what, hpu__dev_node_fn *run, void *dst, const void *src,
		     size_t n, int byte)
{
	copy_args *a = hpu__dev_rec_node(what, run, sizeof *a);
	if (a)
		*a = (copy_args){dst, src, n, byte};
}

/* A copy from host memory while recording: its source is read at each
 * launch (the pinned block the runtime rewrites before it), so it must
 * stay: pinned memory of the device's. 1 where refused. */
static int h2d_refused(const char *op, const void *src, size_t n)
{
	if (!n || pinned(src, n))
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
	if (listing()) {
		rec_copy("hpu__dev_h2d", run_h2d, dst, src, n, 0);
		return;
	}
	atomic_fetch_add(&copied_h2d, n);
	copy(q, dst, src, n);
}

void hpu__dev_d2h(hpu__dev_queue *q, void *dst, const void *src, size_t n)
{
	hpu__dev_rec_foreign("hpu__dev_d2h");
	if (hpu__dev_capturing()) {
		d2h_refused("hpu__dev_d2h");
		return;
	}
	step_copy("hpu__dev_d2h", dst, src, n);
	atomic_fetch_add(&copied_d2h, n);
	copy(q, dst, src, n);
}

/* Where one side is host memory (the host tier, a staging buffer) the
 * bytes cross the bus: counted as the h2d or d2h copy they are. */
void hpu__dev_d2d(hpu__dev_queue *q, void *dst, const void *src, size_t n)
{
	hpu__dev_rec_foreign("hpu__dev_d2d");
	if (hpu__dev_capturing() && n && cur->owns && !cur->owns(dst)) {
		d2h_refused("hpu__dev_d2d");
		return;
	}
	if (hpu__dev_capturing() && n && cur->owns && !cur->owns(src) && h2d_refused("hpu__dev_d2d", src, n))
		return;
	if (listing()) {
		int from_host = n && cur->owns && !cur->owns(src);
		rec_copy("hpu__dev_d2d", from_host ? run_h2d : run_d2d, dst, src, n, 0);
		return;
	}
	step_copy("hpu__dev_d2d", dst, src, n);
	if (cur->owns && !cur->owns(dst) && n)
		atomic_fetch_add(&copied_d2h, n);
	else if (cur->owns && !cur->owns(src) && n)
		atomic_fetch_add(&copied_h2d, n);
	copy(q, dst, src, n);
}

static void on_device(const char *op, const void *p);

void hpu__dev_memset(hpu__dev_queue *q, void *dst, int byte, size_t n)
{
	on_device("memset", dst);
	hpu__dev_rec_foreign("hpu__dev_memset");
	if (listing()) {
		rec_copy("hpu__dev_memset", run_fill, dst, NULL, n, byte);
		return;
	}
	dev_open();
	cur->fill(q, dst, byte, n);
	dev_close();
}

int hpu__dev_owns(const void *p)
{
	return cur->owns ? cur->owns(p) : 0;
}

void hpu__dev_copy(void *dst, const void *src, size_t n)
{
	if (!cur->owns) {
		if (n)
			memmove(dst, src, n);
		return;
	}
	int d = cur->owns(dst), s = cur->owns(src);
	if (hpu__dev_capturing() && s && !d && n) {
		d2h_refused("hpu__dev_copy");
		return;
	}
	step_copy("hpu__dev_copy", dst, src, n);
	if (d && s)
		hpu__dev_d2d(NULL, dst, src, n);
	else if (d)
		hpu__dev_h2d(NULL, dst, src, n);
	else if (s)
		hpu__dev_d2h(NULL, dst, src, n);
	else if (n) /* host to host: the host's own, done now */
		memmove(dst, src, n);
}

void hpu__dev_copied(uint64_t *h2d, uint64_t *d2h)
{
	*h2d = atomic_load(&copied_h2d);
	*d2h = atomic_load(&copied_d2h);
}

/* ---- collectives on device memory ---- */

int hpu__dev_group_open(hpu__dev_group **out, int rank, int world, size_t bytes,
			hpu__dev_xchg_fn *xchg, void *arg, char *why, size_t whylen)
{
	*out = NULL;
	if (!cur->coll) {
		snprintf(why, whylen, "device %s has no collectives of its own", cur->name);
		return 1;
	}
	if (hpu__dev_capturing()) { /* a set-up: exchanges through the host */
		hpu__dev_capture_refuse("hpu__dev_group_open: a group is set up through the host");
		snprintf(why, whylen, "a group cannot be set up while a step is recorded");
		return -1;
	}
	dev_open();
	int rc = cur->coll->open(out, rank, world, bytes, xchg, arg, why, whylen);
	dev_close();
	return rc;
}

int hpu__dev_group_all_reduce(hpu__dev_group *g, const void *send, void *recv, size_t count,
			      hpu__dev_dtype dt)
{
	on_device("group_all_reduce", send);
	on_device("group_all_reduce", recv);
	if (listing()) { /* the CPU's list holds no collectives (cpu has none) */
		hpu__dev_capture_refuse("hpu__dev_group_all_reduce: device %s records no "
					"collectives",
					cur->name);
		return 0;
	}
	dev_open();
	int rc = cur->coll->all_reduce(g, send, recv, count, dt);
	dev_close();
	return rc;
}

void hpu__dev_group_close(hpu__dev_group **g)
{
	if (!*g)
		return;
	if (hpu__dev_capturing()) /* a last exchange through the host */
		hpu__dev_capture_refuse("hpu__dev_group_close: a group is closed through the host");
	dev_open();
	cur->coll->close(*g);
	dev_close();
	*g = NULL;
}

/* ---- queues and events ---- */

hpu__dev_queue *hpu__dev_queue_new(void)
{
	if (cur->queue_new)
		return cur->queue_new();
	return calloc(1, sizeof(hpu__dev_queue));
}

void hpu__dev_queue_free(hpu__dev_queue **q)
{
	if (!q || !*q)
		return;
	if (cur->queue_free)
		cur->queue_free(*q);
	else
		free(*q);
	*q = NULL;
}

void hpu__dev_event_record(hpu__dev_queue *q, hpu__dev_event *ev)
{
	cur->record(q, ev);
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
	return 0;
}

void hpu__dev_event_wait(const hpu__dev_event *ev)
{
	if (!host_wait("hpu__dev_event_wait"))
		cur->wait(ev);
}

void hpu__dev_queue_sync(hpu__dev_queue *q)
{
	hpu__dev_event ev;
	if (host_wait("hpu__dev_queue_sync"))
		return;
	cur->record(q, &ev);
	cur->wait(&ev);
}

const hpu__backend *hpu__dev_ops(void)
{
	return cur->ops();
}

/* ---- the runtime's ops: each one device call ---- */

const hpu__dev_rtops *hpu__dev_host_rt(void)
{
	return &hpu__dev_cpu_rtops;
}

/* A device op's buffer must be device memory: on a device that tells
 * (cpu-strict, GPUs) host memory given to one -- the host tier, a
 * staging buffer -- is a bug in the caller, stopped here with one line
 * (the host's loops, hpu__dev_host_rt, are for host memory). */
static void on_device(const char *op, const void *p)
{
	if (!p || !cur->owns || cur->owns(p))
		return;
	fprintf(stderr,
		"hpu-worker: rank %d: device op %s given host memory at %p under --device %s (host memory is the host's: copy it to the device first)\n",
		cur_rank, op, p, cur->name);
	fflush(stderr);
	_exit(1);
}
#define ON_DEVICE2(op, a, b)                                                           \
	do {                                                                           \
		on_device(op, a);                                                      \
		on_device(op, b);                                                      \
	} while (0)

/* The ops that leave their results in device memory: recorded as a node
 * where this thread records into the CPU's list (the host structs they
 * point at copied: hpu__dev_optim, hpu__dev_stepcfg), else one device
 * call. */
#define RT_ARG(x) node_->x
#define RT_PIN(x) _Generic((node_->x), RT_PINS)(&node_->x);
#define RT_DEF(name, params, args)                                                     \
	struct rt_##name {                                                             \
		KL_FE(KL_FIELD, KL_UNPAREN params)                                     \
	};                                                                             \
	static int rr_##name(const void *p)                                            \
	{                                                                              \
		const struct rt_##name *node_ = p;                                         \
		dev_open();                                                      \
		cur->rt->name(KL_FC(RT_ARG, KL_UNPAREN args));                         \
		dev_close();                                                      \
		return 0;                                                              \
	}                                                                              \
	static void rec_##name params                                                  \
	{                                                                              \
		struct rt_##name *node_ = hpu__dev_rec_node("hpu__dev_" #name, rr_##name,  \
							sizeof *node_);                    \
		if (!node_)                                                                \
			return;                                                        \
		*node_ = (struct rt_##name){KL_UNPAREN args};                              \
		KL_FE(RT_PIN, KL_UNPAREN args)                                         \
	}

static void pin_scalar(const void *field)
{
	(void)field;
}

static void pin_optim(const hpu__dev_optim **k)
{
	*k = hpu__dev_rec_keep(*k, sizeof **k);
}

static void pin_stepcfg(const hpu__dev_stepcfg **c)
{
	*c = hpu__dev_rec_keep(*c, sizeof **c);
}

#define RT_PINS                                                                        \
	const hpu__dev_optim *: pin_optim, const hpu__dev_stepcfg *: pin_stepcfg,      \
	default: pin_scalar

RT_DEF(to16, (int fp16, uint16_t *dst, const float *src, size_t n), (fp16, dst, src, n))
RT_DEF(from16, (int fp16, float *dst, const uint16_t *src, size_t n), (fp16, dst, src, n))
RT_DEF(acc16, (int fp16, uint16_t *dst, const float *src, size_t n), (fp16, dst, src, n))
RT_DEF(bf16_expand, (float *dst, const uint16_t *src, size_t n), (dst, src, n))
RT_DEF(add, (float *dst, const float *src, size_t n), (dst, src, n))
RT_DEF(add_scalar, (float *dst, float v, size_t n), (dst, v, n))
RT_DEF(sum, (double *out, const float *v, size_t n), (out, v, n))
RT_DEF(flag_nonfinite, (float *flag, const float *g, size_t n), (flag, g, n))
RT_DEF(flag_nonfinite16, (float *flag, int fp16, const uint16_t *g, size_t n),
       (flag, fp16, g, n))
RT_DEF(sumsq_add, (double *acc, const float *g, size_t n), (acc, g, n))
RT_DEF(sumsq16_add,
       (double *acc, int fp16, const uint16_t *g, size_t n, float *scratch, size_t chunk),
       (acc, fp16, g, n, scratch, chunk))
RT_DEF(loss_seed,
       (float *g, size_t n, const double *sums, int nsums, float weight, float base, int batch,
	const hpu__dev_stepvars *sv),
       (g, n, sums, nsums, weight, base, batch, sv))
RT_DEF(step_begin, (hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c), (sv, c))
RT_DEF(step_end, (hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c), (sv, c))
RT_DEF(rows_add, (double *acc, const float *v, size_t n, const int *rows), (acc, v, n, rows))
RT_DEF(loss_add, (double *acc, const double *sums, const double *w, int nloss, const int *rows),
       (acc, sums, w, nloss, rows))
RT_DEF(optim,
       (const hpu__dev_optim *k, float *p, const float *g, float *m, float *v, size_t n),
       (k, p, g, m, v, n))
RT_DEF(optim16,
       (const hpu__dev_optim *k, int fp16, float *p, const uint16_t *g16, uint16_t *p16,
	float *m, float *v, size_t n, float *scratch, size_t chunk),
       (k, fp16, p, g16, p16, m, v, n, scratch, chunk))

#define RT_CALL(name, args)                                                            \
	do {                                                                           \
		hpu__dev_rec_foreign("hpu__dev_" #name);                               \
		if (listing()) {                                                       \
			rec_##name args;                                               \
			break;                                                         \
		}                                                                      \
		dev_open();                                                      \
		cur->rt->name args;                                                    \
		dev_close();                                                      \
	} while (0)
/* A value back to the host: no recording can hold one (refused, 0). */
#define RT_VALUE(type, name, args)                                                     \
	do {                                                                           \
		hpu__dev_rec_foreign("hpu__dev_" #name);                               \
		if (hpu__dev_capturing()) {                                                             \
			hpu__dev_capture_refuse("hpu__dev_" #name                      \
						": an op that returns a value to the host"); \
			return 0;                                                      \
		}                                                                      \
		dev_open();                                                      \
		type r_ = cur->rt->name args;                                          \
		dev_close();                                                      \
		return r_;                                                             \
	} while (0)

void hpu__dev_to16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	ON_DEVICE2("to16", dst, src);
	RT_CALL(to16, (fp16, dst, src, n));
}

void hpu__dev_from16(int fp16, float *dst, const uint16_t *src, size_t n)
{
	ON_DEVICE2("from16", dst, src);
	RT_CALL(from16, (fp16, dst, src, n));
}

void hpu__dev_acc16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	ON_DEVICE2("acc16", dst, src);
	RT_CALL(acc16, (fp16, dst, src, n));
}

int hpu__dev_bf16_exact(uint16_t *dst, const float *x, size_t n)
{
	step_value("hpu__dev_bf16_exact", x);
	ON_DEVICE2("bf16_exact", dst, x);
	RT_VALUE(int, bf16_exact, (dst, x, n));
}

void hpu__dev_bf16_expand(float *dst, const uint16_t *src, size_t n)
{
	ON_DEVICE2("bf16_expand", dst, src);
	RT_CALL(bf16_expand, (dst, src, n));
}

void hpu__dev_add(float *dst, const float *src, size_t n)
{
	ON_DEVICE2("add", dst, src);
	RT_CALL(add, (dst, src, n));
}

void hpu__dev_add_scalar(float *dst, float v, size_t n)
{
	on_device("add_scalar", dst);
	RT_CALL(add_scalar, (dst, v, n));
}

double hpu__dev_sumsq(const float *g, size_t n)
{
	step_value("hpu__dev_sumsq", g);
	on_device("sumsq", g);
	RT_VALUE(double, sumsq, (g, n));
}

double hpu__dev_sumsq16(double acc, int fp16, const uint16_t *g, size_t n, float *scratch,
			size_t chunk)
{
	step_value("hpu__dev_sumsq16", g);
	ON_DEVICE2("sumsq16", g, scratch);
	RT_VALUE(double, sumsq16, (acc, fp16, g, n, scratch, chunk));
}

void hpu__dev_sum(double *out, const float *v, size_t n)
{
	ON_DEVICE2("sum", out, v);
	RT_CALL(sum, (out, v, n));
}

int hpu__dev_nonfinite(const float *g, size_t n)
{
	step_value("hpu__dev_nonfinite", g);
	on_device("nonfinite", g);
	RT_VALUE(int, nonfinite, (g, n));
}

int hpu__dev_nonfinite16(int fp16, const uint16_t *g, size_t n)
{
	step_value("hpu__dev_nonfinite16", g);
	on_device("nonfinite16", g);
	RT_VALUE(int, nonfinite16, (fp16, g, n));
}

long hpu__dev_count_nonfinite(const float *v, size_t n)
{
	step_value("hpu__dev_count_nonfinite", v);
	on_device("count_nonfinite", v);
	RT_VALUE(long, count_nonfinite, (v, n));
}

long hpu__dev_count_nonfinite16(const uint16_t *v, size_t n)
{
	step_value("hpu__dev_count_nonfinite16", v);
	on_device("count_nonfinite16", v);
	RT_VALUE(long, count_nonfinite16, (v, n));
}

void hpu__dev_flag_nonfinite(float *flag, const float *g, size_t n)
{
	ON_DEVICE2("flag_nonfinite", flag, g);
	RT_CALL(flag_nonfinite, (flag, g, n));
}

void hpu__dev_flag_nonfinite16(float *flag, int fp16, const uint16_t *g, size_t n)
{
	ON_DEVICE2("flag_nonfinite16", flag, g);
	RT_CALL(flag_nonfinite16, (flag, fp16, g, n));
}

void hpu__dev_sumsq_add(double *acc, const float *g, size_t n)
{
	ON_DEVICE2("sumsq_add", acc, g);
	RT_CALL(sumsq_add, (acc, g, n));
}

void hpu__dev_sumsq16_add(double *acc, int fp16, const uint16_t *g, size_t n, float *scratch,
			  size_t chunk)
{
	ON_DEVICE2("sumsq16_add", acc, g);
	on_device("sumsq16_add", scratch);
	RT_CALL(sumsq16_add, (acc, fp16, g, n, scratch, chunk));
}

void hpu__dev_loss_seed(float *g, size_t n, const double *sums, int nsums, float weight,
			float base, int batch, const hpu__dev_stepvars *sv)
{
	ON_DEVICE2("loss_seed", g, sums);
	on_device("loss_seed", sv);
	RT_CALL(loss_seed, (g, n, sums, nsums, weight, base, batch, sv));
}

void hpu__dev_step_begin(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	on_device("step_begin", sv);
	RT_CALL(step_begin, (sv, c));
}

void hpu__dev_step_end(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	on_device("step_end", sv);
	RT_CALL(step_end, (sv, c));
}

void hpu__dev_rows_add(double *acc, const float *v, size_t n, const int *rows)
{
	ON_DEVICE2("rows_add", acc, v);
	on_device("rows_add", rows);
	RT_CALL(rows_add, (acc, v, n, rows));
}

void hpu__dev_loss_add(double *acc, const double *sums, const double *w, int nloss,
		       const int *rows)
{
	ON_DEVICE2("loss_add", acc, sums);
	ON_DEVICE2("loss_add", w, rows);
	RT_CALL(loss_add, (acc, sums, w, nloss, rows));
}

void hpu__dev_optim_update(const hpu__dev_optim *k, float *p, const float *g, float *m,
			   float *v, size_t n)
{
	ON_DEVICE2("optim", p, g);
	ON_DEVICE2("optim", m, v);
	RT_CALL(optim, (k, p, g, m, v, n));
}

void hpu__dev_optim_update16(const hpu__dev_optim *k, int fp16, float *p, const uint16_t *g16,
			     uint16_t *p16, float *m, float *v, size_t n, float *scratch,
			     size_t chunk)
{
	ON_DEVICE2("optim16", p, g16);
	ON_DEVICE2("optim16", p16, scratch);
	ON_DEVICE2("optim16", m, v);
	RT_CALL(optim16, (k, fp16, p, g16, p16, m, v, n, scratch, chunk));
}

/* ---- recording a step and replaying it (device.h; the recording's
 * state and the CPU's list: device_rec.c) ---- */

static void graph_drop(hpu__dev_graph *g)
{
	if (g->dev)
		cur->recorder->free(g->dev);
	hpu__dev_rec_drop_list(g);
	hpu__devmem_graph_release(g->held);
	free(g);
}

/* The CPU's list: a zeroed allocation while recording is a fill node
 * too (devmem's hpu__devmem_record_zero). */
static void zero_node(void *p, size_t bytes)
{
	hpu__dev_memset(NULL, p, 0, bytes);
}

int hpu__dev_capture_begin(char *err, size_t errlen)
{
	/* the CPU's list records the kernels-only table (cpu-strict's, or
	 * --device cpu's under --graphs); any other device records itself */
	int listed = (cur == &hpu__dev_cpu_strict || cur == &hpu__dev_cpu_rec) && kernels_set;
	int can = hpu__dev_caps_get()->can_capture && (cur->recorder || listed);
	if (!can) {
		if (cur == &hpu__dev_cpu)
			snprintf(err, errlen,
				 "--device cpu records a step under --graphs only (its kernels-only "
				 "table is set up with the device)");
		else if (cur == &hpu__dev_cpu_strict)
			snprintf(err, errlen,
				 "--device cpu-strict records a step on its kernels-only table only "
				 "(--graphs, or HPU_STRICT_KERNELS=1, when the device is set up)");
		else
			snprintf(err, errlen, "--device %s cannot record a step", cur->name);
		return -1;
	}
	if (hpu__dev_rec_claim() < 0) {
		snprintf(err, errlen, "a step is being recorded already (one recording at a time)");
		return -1;
	}
	hpu__dev_graph *g = calloc(1, sizeof *g);
	if (!g) {
		snprintf(err, errlen, "out of host memory for a recording");
		hpu__dev_rec_unclaim();
		return -1;
	}
	g->held = hpu__devmem_capture_begin();
	hpu__devmem_record_zero(cur->recorder ? NULL : zero_node);
	if (cur->recorder && cur->recorder->begin(err, errlen) < 0) {
		hpu__devmem_capture_end();
		hpu__devmem_record_zero(NULL);
		graph_drop(g);
		hpu__dev_rec_unclaim();
		return -1;
	}
	hpu__dev_rec_start(g, !cur->recorder);
	if (cur->rec_guard)
		cur->rec_guard(1, NULL, 0);
	return 0;
}

/* --device cpu's arena open again after a recording; host code that
 * touched device memory meanwhile (a custom layer's C loops) did its
 * work then, not at each launch: the recording refused. */
static void cpu_rec_unguard(void)
{
	char block[160];
	const void *a = cur->rec_guard(0, block, sizeof block);
	if (a)
		hpu__dev_capture_refuse("host code touched device memory at %p (%s) while a step was "
					"recorded (its work ran then, not at each launch: a custom "
					"layer's own loops over its tensors, which --device cpu-strict "
					"faults on unless the layer is HPU_LAYER_HOST_ONLY)",
					a, block);
}

int hpu__dev_capture_end(hpu__dev_graph **out, char *why, size_t whylen)
{
	*out = NULL;
	if (cur->rec_guard && hpu__dev_capturing())
		cpu_rec_unguard();
	hpu__dev_graph *g = hpu__dev_rec_stop();
	if (!g) {
		snprintf(why, whylen, "hpu__dev_capture_end: this thread records nothing");
		return -1;
	}
	hpu__devmem_capture_end();
	hpu__devmem_record_zero(NULL);
	int rc = 0;
	if (cur->recorder)
		rc = cur->recorder->end(&g->dev, why, whylen);
	else
		hpu__dev_rec_count(g);
	if (hpu__dev_rec_refused(why, whylen)) /* the first reason, whatever the device said */
		rc = 1;
	if (rc != 0)
		graph_drop(g);
	else
		*out = g;
	hpu__dev_rec_unclaim();
	return rc;
}

int hpu__dev_graph_launch(hpu__dev_graph *g, char *err, size_t errlen)
{
	if (hpu__dev_capturing()) {
		hpu__dev_capture_refuse("hpu__dev_graph_launch: a graph launched while recording");
		snprintf(err, errlen, "a graph cannot be launched while a step is recorded");
		return -1;
	}
	if (g->dev)
		return cur->recorder->launch(g->dev, err, errlen);
	dev_open(); /* one device call: the nodes' own nest inside it */
	int rc = hpu__dev_rec_run(g, err, errlen);
	dev_close();
	return rc;
}

size_t hpu__dev_graph_nodes(const hpu__dev_graph *g)
{
	if (!g)
		return 0;
	return g->dev ? cur->recorder->nodes(g->dev) : g->n;
}

size_t hpu__dev_graph_names(const hpu__dev_graph *g, const hpu__dev_node_count **out)
{
	*out = NULL;
	if (!g)
		return 0;
	if (!g->dev) {
		*out = g->names;
		return g->nnames;
	}
	return cur->recorder->names ? cur->recorder->names(g->dev, out) : 0;
}

void hpu__dev_graph_free(hpu__dev_graph **g)
{
	if (!g || !*g)
		return;
	graph_drop(*g);
	*g = NULL;
}
