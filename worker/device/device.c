/* device: choosing the device, the cpu device's table, the CUDA
 * device's module, and the state of the device in use that the folder's
 * other files read (device_impl.h; see device.h). The calls every device
 * shares: device_mem.c (memory), device_call.c (device calls, the step
 * guard, queues), device_copy.c (copies, collectives), device_rt.c (the
 * runtime's ops), device_graph.c (recording a step). */
#include "worker/device/device.h"
#include "worker/device/device_impl.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/env.h"
#include "common/log.h"
#include "common/nodeid.h"

const hpu__device *hpu__dev_cur = &hpu__dev_cpu;
static hpu__dev_caps cur_caps;
static int caps_known;
int hpu__dev_cur_rank;
int hpu__dev_kernels_set; /* the ops use hpu__dev_kernels_table */
static int table_set;   /* the ops use a device's own table (cuda) */
atomic_uint_fast64_t hpu__dev_copied_h2d, hpu__dev_copied_d2h, hpu__dev_wait_count;
/* The step guard (hpu__dev_step_guard, device_impl.h) */
int hpu__dev_step_strict;
atomic_int hpu__dev_step_on;

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
		hpu__dev_kernels_set = 1;
	} else if (d != &hpu__dev_cpu && d != &hpu__dev_cpu_strict && d->ops) {
		/* a device with kernels of its own (cuda): the ops run on its
		 * table, their scratch in its memory; a layer stays one device
		 * call (the call binds the thread to the worker's GPU) */
		hpu__be_set(d->ops());
		hpu__dev_kernels_scratch();
		table_set = 1;
	}
	hpu__dev_cur = d;
	hpu__dev_cur_rank = rank;
	caps_known = 0;
	const char *e = hpu__env_str(HPU_ENV_HPU_STRICT_STEP);
	hpu__dev_step_strict = d == &hpu__dev_cpu_strict && e && !strcmp(e, "1");
	atomic_store(&hpu__dev_step_on, 0);
	atomic_store(&hpu__dev_copied_h2d, 0);
	atomic_store(&hpu__dev_copied_d2h, 0);
	atomic_store(&hpu__dev_wait_count, 0);
	return 0;
}

/* --graphs on --device cpu: the device becomes hpu__dev_cpu_rec (its
 * memory the arena that tells device memory from the host's, always open)
 * on the kernels-only table; devmem is not set up yet. Eager --device cpu
 * keeps its own table and memory. */
static int cpu_records(char *err, size_t errlen)
{
	if (hpu__dev_cpu_rec.setup(hpu__dev_cur_rank, err, errlen) < 0)
		return -1;
	hpu__devmem_set_backing(hpu__dev_cpu_rec.backing);
	hpu__dev_cur = &hpu__dev_cpu_rec;
	return 0;
}

int hpu__dev_configure(const hpu__dev_config *c, uint64_t *capacity, char *note,
		       size_t notelen, char *err, size_t errlen)
{
	*capacity = 0;
	if (notelen)
		note[0] = '\0';
	if (c->graphs && hpu__dev_cur == &hpu__dev_cpu && cpu_records(err, errlen) < 0)
		return -1;
	int strict = hpu__dev_cur == &hpu__dev_cpu_strict;
	if (c->graphs && (strict || hpu__dev_cur == &hpu__dev_cpu_rec) && !hpu__dev_kernels_set) {
		/* recording needs every access to device memory to be a call
		 * of the device: its kernels-only table, as HPU_STRICT_KERNELS=1 */
		hpu__be_set(hpu__dev_kernels_table(hpu__dev_cur));
		hpu__dev_kernels_scratch();
		hpu__dev_kernels_set = 1;
		caps_known = 0;
	}
	if (c->graphs && strict)
		snprintf(note, notelen,
			 "--graphs: the ops run on cpu-strict's kernels-only table, and a step is "
			 "recorded once and replayed");
	else if (c->graphs && hpu__dev_cur == &hpu__dev_cpu_rec)
		snprintf(note, notelen,
			 "--graphs: the ops run on the kernels-only table (cpu-strict's without its "
			 "memory protection), and a step is recorded once and replayed");
	if (hpu__dev_cur->configure)
		return hpu__dev_cur->configure(c, capacity, note, notelen, err, errlen);
	if (c->allow_tf32) /* accepted, as PyTorch's flag is on a CPU */
		snprintf(note, notelen,
			 "--allow-tf32 has no effect on device %s: its fp32 products stay fp32",
			 hpu__dev_cur->name);
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
	char node[320] = "";
	if (!outlen)
		return;
	out[0] = 0;
	if (!k->gpu_id[0])
		return;
	/* the machine by host name and boot id: two machines of one host
	 * name with GPUs at the same bus id are not one GPU */
	hpu__node_ident(node, sizeof node);
	if (snprintf(out, outlen, "%s %s", node, k->gpu_id) >= (int)outlen)
		out[0] = 0; /* too long to compare whole: counted alone */
}

uint64_t hpu__dev_default_memory(uint64_t capacity, int sharers, uint64_t host_bytes,
				 int local_workers)
{
	if (capacity) {
		/* less what each worker has on the GPU outside the limit (its
		 * context, workspace, scratch): a limit of the whole share could
		 * never be met, and a run growing to it would fail in cudaMalloc
		 * rather than at devmem's limit */
		uint64_t share = capacity / (uint64_t)(sharers > 0 ? sharers : 1);
		return share > 2 * HPU_DEV_GPU_RESERVE ? share - HPU_DEV_GPU_RESERVE : share / 2;
	}
	return host_bytes / (uint64_t)(local_workers > 0 ? local_workers : 1);
}

void hpu__dev_close(void)
{
	hpu__dev_queued_clear(0);
	hpu__devmem_set_backing(NULL);
	hpu__dev_cur->teardown();
	if (hpu__dev_kernels_set || table_set)
		hpu__be_set(NULL);
	hpu__dev_kernels_set = table_set = 0;
	hpu__dev_cur = &hpu__dev_cpu;
	caps_known = 0;
	hpu__dev_step_strict = 0;
	atomic_store(&hpu__dev_step_on, 0);
}

const hpu__device *hpu__dev(void)
{
	return hpu__dev_cur;
}

const char *hpu__dev_name(void)
{
	return hpu__dev_cur->name;
}

const hpu__dev_caps *hpu__dev_caps_get(void)
{
	if (!caps_known) {
		hpu__dev_cur->caps(&cur_caps);
		if (hpu__dev_cur == &hpu__dev_cpu_strict || hpu__dev_cur == &hpu__dev_cpu_rec)
			/* on the kernels-only table: recording, and the ops'
			 * zeros as its calls */
			cur_caps.can_capture = cur_caps.ops_fill = hpu__dev_kernels_set;
		caps_known = 1;
	}
	return &cur_caps;
}

int hpu__dev_kernels_on(void)
{
	return hpu__dev_kernels_set;
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

const hpu__backend *hpu__dev_ops(void)
{
	return hpu__dev_cur->ops();
}
