/* cuda_kprof: the GPU's own time for each kernel, copy and memset, by
 * name (HPU_PROFILE_KERNELS=DIR): CUPTI's activity records, summed by
 * name while the worker runs and written at its end to
 * DIR/kernels-rank<R>.txt, the costliest first.
 *
 * The profiler's ranges (--profile) time what the host does; a GPU runs
 * the work later, so a range is the GPU's time only under
 * HPU_PROFILE_SYNC=1, and then per layer, not per kernel, and never
 * inside a replayed graph. This table says which kernels a step's GPU
 * time goes to, eager or replayed (a graph's kernels are counted apart),
 * with the grid and block of each kernel's last launch: a kernel of one
 * thread that takes a tenth of a step shows at once.
 *
 * libcupti is dlopened when asked for (HPU_CUPTI_LIB, else
 * libcupti.so.13 on the loader's path, else the toolkit's places): the
 * module does not need it to load. Where it cannot be opened or refuses,
 * the worker says so in one line and runs on untimed. */
#include "worker/cuda/cuda_device.h"

#include <stdio.h>
#include <stdlib.h>

#if !__has_include(<cupti.h>)
/* A toolkit without CUPTI's headers (a minimal one: nvcc and the
 * runtime): the module builds, and the variable says why it does nothing. */
void hpu__cuda_kprof_begin(int rank)
{
	const char *dir = getenv("HPU_PROFILE_KERNELS");
	if (dir && *dir)
		fprintf(stderr, "hpu-worker: rank %d: HPU_PROFILE_KERNELS: this build's CUDA "
				"toolkit had no CUPTI headers (cupti.h); the kernels are not timed\n",
			rank);
}

void hpu__cuda_kprof_end(void)
{
}
#else
#include <cupti.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KP_SLOTS 4096		/* distinct names (a GPT-2 run has a few hundred) */
#define KP_BUF (8u << 20)	/* bytes of one activity buffer */

typedef struct kp_row {
	char *name; /* NULL: a free slot */
	int kind;   /* 0 kernel, 1 copy, 2 memset */
	uint64_t count, graphed, ns, max_ns, bytes;
	int grid[3], block[3], regs;
} kp_row;

static struct {
	int on;
	void *lib;
	char dir[512];
	int rank;
	pthread_mutex_t mu;
	kp_row rows[KP_SLOTS];
	int nrows, full;
	uint64_t first, last, records, dropped;
	CUptiResult (*reg)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
	CUptiResult (*enable)(CUpti_ActivityKind);
	CUptiResult (*disable)(CUpti_ActivityKind);
	CUptiResult (*next)(uint8_t *, size_t, CUpti_Activity **);
	CUptiResult (*flush)(uint32_t);
	CUptiResult (*dropped_n)(CUcontext, uint32_t, size_t *);
	CUptiResult (*result)(CUptiResult, const char **);
} K = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
					   CUPTI_ACTIVITY_KIND_MEMCPY,
					   CUPTI_ACTIVITY_KIND_MEMSET};

static uint64_t hash(const char *s, int kind)
{
	uint64_t h = 1469598103934665603ull ^ (uint64_t)kind;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

/* The row of (name, kind), made where new; NULL when the table is full. */
static kp_row *row_of(const char *name, int kind)
{
	uint64_t h = hash(name, kind);
	for (unsigned i = 0; i < KP_SLOTS; i++) {
		kp_row *r = &K.rows[(h + i) % KP_SLOTS];
		if (!r->name) {
			if (K.nrows >= KP_SLOTS - 1)
				return NULL;
			r->name = strdup(name);
			if (!r->name)
				return NULL;
			r->kind = kind;
			K.nrows++;
			return r;
		}
		if (r->kind == kind && !strcmp(r->name, name))
			return r;
	}
	return NULL;
}

static void add(const char *name, int kind, uint64_t start, uint64_t end, int graphed,
		uint64_t bytes, kp_row **out)
{
	kp_row *r = row_of(name ? name : "(unnamed)", kind);
	*out = r;
	if (!r) {
		K.full = 1;
		return;
	}
	uint64_t d = end > start ? end - start : 0;
	r->count++;
	r->graphed += graphed != 0;
	r->ns += d;
	if (d > r->max_ns)
		r->max_ns = d;
	r->bytes += bytes;
	if (start && (!K.first || start < K.first))
		K.first = start;
	if (end > K.last)
		K.last = end;
}

static const char *copy_name(uint8_t k)
{
	switch (k) {
	case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
		return "memcpy host to device";
	case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
		return "memcpy device to host";
	case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
		return "memcpy device to device";
	case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
		return "memcpy host to host";
	case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
		return "memcpy peer to peer";
	default:
		return "memcpy (other)";
	}
}

static void CUPTIAPI buf_request(uint8_t **buf, size_t *size, size_t *max_records)
{
	*buf = aligned_alloc(8, KP_BUF);
	*size = *buf ? KP_BUF : 0;
	*max_records = 0;
}

static void CUPTIAPI buf_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
				  size_t valid)
{
	(void)size;
	CUpti_Activity *a = NULL;
	pthread_mutex_lock(&K.mu);
	while (valid && K.next(buf, valid, &a) == CUPTI_SUCCESS) {
		kp_row *r = NULL;
		K.records++;
		switch (a->kind) {
		case CUPTI_ACTIVITY_KIND_KERNEL:
		case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
			const CUpti_ActivityKernel10 *k = (const void *)a;
			char name[256];
			hpu__cuda_demangle(k->name ? k->name : "(unnamed)", name, sizeof name);
			add(name, 0, k->start, k->end, k->graphId != 0, 0, &r);
			if (r) {
				r->grid[0] = k->gridX, r->grid[1] = k->gridY, r->grid[2] = k->gridZ;
				r->block[0] = k->blockX, r->block[1] = k->blockY, r->block[2] = k->blockZ;
				r->regs = k->registersPerThread;
			}
			break;
		}
		case CUPTI_ACTIVITY_KIND_MEMCPY: {
			const CUpti_ActivityMemcpy6 *m = (const void *)a;
			add(copy_name(m->copyKind), 1, m->start, m->end, m->graphId != 0, m->bytes, &r);
			break;
		}
		case CUPTI_ACTIVITY_KIND_MEMSET: {
			const CUpti_ActivityMemset4 *m = (const void *)a;
			add("memset", 2, m->start, m->end, m->graphId != 0, m->bytes, &r);
			break;
		}
		default:
			break;
		}
	}
	size_t dropped = 0;
	if (K.dropped_n && K.dropped_n(ctx, stream, &dropped) == CUPTI_SUCCESS)
		K.dropped += dropped;
	pthread_mutex_unlock(&K.mu);
	free(buf);
}

static void *sym(const char *name, int *ok)
{
	void *p = dlsym(K.lib, name);
	if (!p)
		*ok = 0;
	return p;
}

static void *open_cupti(char *why, size_t len)
{
	static const char *const tries[] = {"libcupti.so.13", "/usr/local/cuda/lib64/libcupti.so.13",
					    "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
					    "libcupti.so"};
	return hpu__cuda_dlopen_first(getenv("HPU_CUPTI_LIB"), tries, sizeof tries / sizeof *tries, why,
				      len);
}

void hpu__cuda_kprof_begin(int rank)
{
	const char *dir = getenv("HPU_PROFILE_KERNELS");
	if (K.on || !dir || !*dir)
		return;
	char why[300];
	K.rank = rank;
	K.records = K.dropped = K.first = K.last = 0;
	K.full = 0;
	snprintf(K.dir, sizeof K.dir, "%s", dir);
	/* made if missing, with its parents */
	for (char *p = strchr(K.dir + 1, '/'); p; p = strchr(p + 1, '/')) {
		*p = '\0';
		mkdir(K.dir, 0755);
		*p = '/';
	}
	if (mkdir(K.dir, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "hpu-worker: rank %d: HPU_PROFILE_KERNELS: cannot make %s: %s; the "
				"kernels are not timed\n", rank, K.dir, strerror(errno));
		return;
	}
	K.lib = open_cupti(why, sizeof why);
	if (!K.lib) {
		fprintf(stderr, "hpu-worker: rank %d: HPU_PROFILE_KERNELS: CUPTI could not be opened "
				"(%s; HPU_CUPTI_LIB names the library); the kernels are not timed\n",
			rank, why);
		return;
	}
	int ok = 1;
	*(void **)&K.reg = sym("cuptiActivityRegisterCallbacks", &ok);
	*(void **)&K.enable = sym("cuptiActivityEnable", &ok);
	*(void **)&K.disable = sym("cuptiActivityDisable", &ok);
	*(void **)&K.next = sym("cuptiActivityGetNextRecord", &ok);
	*(void **)&K.flush = sym("cuptiActivityFlushAll", &ok);
	*(void **)&K.result = sym("cuptiGetResultString", &ok);
	*(void **)&K.dropped_n = dlsym(K.lib, "cuptiActivityGetNumDroppedRecords");
	CUptiResult e = CUPTI_SUCCESS;
	const char *what = "a function of its API is missing";
	int registered = 0;
	size_t enabled = 0;
	if (ok && (e = K.reg(buf_request, buf_complete)) != CUPTI_SUCCESS)
		what = "cuptiActivityRegisterCallbacks";
	registered = ok && e == CUPTI_SUCCESS;
	for (; registered && e == CUPTI_SUCCESS && enabled < sizeof kinds / sizeof *kinds; enabled++)
		if ((e = K.enable(kinds[enabled])) != CUPTI_SUCCESS)
			what = "cuptiActivityEnable";
	if (!ok || e != CUPTI_SUCCESS) {
		const char *s = "";
		if (ok && K.result)
			K.result(e, &s);
		fprintf(stderr, "hpu-worker: rank %d: HPU_PROFILE_KERNELS: CUPTI refused: %s%s%s; the "
				"kernels are not timed\n", rank, what, s && *s ? ": " : "", s ? s : "");
		/* what was enabled is turned off; once CUPTI has its callbacks
		 * the library stays loaded (its threads may run) */
		for (size_t i = 0; i + 1 < enabled; i++)
			K.disable(kinds[i]);
		if (!registered) {
			dlclose(K.lib);
			K.lib = NULL;
		}
		return;
	}
	K.on = 1;
}

static int by_time(const void *a, const void *b)
{
	const kp_row *x = *(kp_row *const *)a, *y = *(kp_row *const *)b;
	return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : strcmp(x->name, y->name);
}

static void write_table(void)
{
	char path[600];
	snprintf(path, sizeof path, "%s/kernels-rank%d.txt", K.dir, K.rank);
	FILE *f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "hpu-worker: rank %d: HPU_PROFILE_KERNELS: cannot write %s: %s\n",
			K.rank, path, strerror(errno));
		return;
	}
	kp_row **v = malloc((size_t)(K.nrows ? K.nrows : 1) * sizeof *v);
	int n = 0;
	uint64_t busy = 0;
	for (int i = 0; v && i < KP_SLOTS; i++)
		if (K.rows[i].name) {
			v[n++] = &K.rows[i];
			busy += K.rows[i].ns;
		}
	if (v)
		qsort(v, (size_t)n, sizeof *v, by_time);
	fprintf(f, "# GPU time by kernel, copy and memset (CUPTI), rank %d: %llu records, %d names, "
		   "%.3f ms busy in a window of %.3f ms%s%s\n",
		K.rank, (unsigned long long)K.records, n, (double)busy / 1e6,
		K.last > K.first ? (double)(K.last - K.first) / 1e6 : 0.0,
		K.dropped ? "; records dropped: " : "", K.dropped ? "yes" : "");
	if (K.full)
		fprintf(f, "# more names than the table holds: the others are not counted\n");
	fprintf(f, "# %-10s %5s %9s %10s %10s %9s  %-24s %s\n", "total_ms", "%busy", "count",
		"mean_us", "max_us", "in_graph", "grid x block (regs)", "name");
	for (int i = 0; v && i < n; i++) {
		kp_row *r = v[i];
		char shape[64] = "";
		if (r->kind == 0)
			snprintf(shape, sizeof shape, "%dx%dx%d x %dx%dx%d (%d)", r->grid[0], r->grid[1],
				 r->grid[2], r->block[0], r->block[1], r->block[2], r->regs);
		else
			snprintf(shape, sizeof shape, "%.1f MB a call",
				 r->count ? (double)r->bytes / (double)r->count / 1e6 : 0.0);
		fprintf(f, "  %-10.3f %5.1f %9llu %10.2f %10.2f %9llu  %-24s %s\n", (double)r->ns / 1e6,
			busy ? 100.0 * (double)r->ns / (double)busy : 0.0, (unsigned long long)r->count,
			r->count ? (double)r->ns / (double)r->count / 1e3 : 0.0,
			(double)r->max_ns / 1e3, (unsigned long long)r->graphed, shape, r->name);
	}
	free(v);
	fclose(f);
}

void hpu__cuda_kprof_end(void)
{
	if (!K.on)
		return;
	cudaDeviceSynchronize(); /* the last step's work done, then its records */
	cudaGetLastError();
	K.flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
	for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
		K.disable(kinds[i]);
	pthread_mutex_lock(&K.mu);
	write_table();
	for (int i = 0; i < KP_SLOTS; i++) {
		free(K.rows[i].name);
		K.rows[i].name = NULL;
	}
	K.nrows = 0;
	pthread_mutex_unlock(&K.mu);
	K.on = 0; /* the library stays open: CUPTI's threads may still run */
}
#endif
