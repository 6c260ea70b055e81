/* cuda_device: the CUDA device (worker/device/device.h's table) in the
 * module hpudev_cuda.so, which the worker loads for --device cuda and
 * auto (worker/device/device.c) through its one entry, hpu_cuda_device_v1.
 *
 * The GPU. A worker drives GPU (HPU_DEVICE_ID, else LOCAL_RANK, else 0)
 * modulo the GPUs visible to it (CUDA_VISIBLE_DEVICES is CUDA's own), so
 * that more workers than GPUs share them. Set-up creates the compute
 * stream, the default queue. CUDA's current device is per thread: every
 * entry of the table (a device call's enter among them) first makes the
 * worker's GPU the calling thread's (hpu__cuda_bind, once per thread).
 *
 * Memory. devmem takes the device's blocks from this backing: cudaMalloc
 * and cudaFree (devmem's own cache pools them; no cudaMallocAsync pool),
 * remote (the host never touches them: their headers stay on the host),
 * zeroed by cudaMemsetAsync on the compute stream; the work of other
 * queues waits for the last zeroing before it (the `zeroed` event).
 * Pinned host memory is cudaHostAlloc's.
 *
 * Copies. On a queue's stream with cudaMemcpyAsync(cudaMemcpyDefault);
 * one with a host side is waited for before it returns, as the CPU
 * devices' copies are done when they return (callers read the host side
 * at once). Copies between device buffers and fills stay asynchronous.
 *
 * Events. A queue keeps a ring of CUDA events; recording takes the next
 * one. Waiting for an event that was recorded again since waits for a
 * later point of the same stream: longer, never too short.
 *
 * The runtime ops run on the compute stream as kernels of cuda_rt.cu;
 * those that answer a value (sums, checks) copy it back and wait. The
 * step's decisions (flag_nonfinite to step_end, the optimizer with
 * hpu__dev_stepvars) never do: they only queue kernels, so that a
 * recorded step holds them.
 *
 * Collectives between the workers of one node on device memory, over
 * CUDA IPC: cuda_coll.c. */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "worker/cuda/cuda_coll.h"
#include "worker/cuda/cuda_device.h"
#include "worker/cuda/cuda_graph.h"
#include "worker/cuda/cuda_kernels.h"
#include "worker/device/device.h"
#ifdef HPU_CUDA_HAVE_OPS
#include "worker/cuda/cuda_ops.h"
#endif

#define RING 16 /* events per queue */
/* sumsq_add's parts summed per batch (doubles; 512 KiB, made at set-up:
 * nothing is allocated inside a step) */
#define SQ_PARTS 65536

struct hpu__dev_queue {
	cudaStream_t s;
	pthread_mutex_t mu;
	uint64_t issued;     /* events recorded */
	uint64_t zero_seen;  /* the zeroing this stream waited for last */
	cudaEvent_t ev[RING];
};

static struct {
	int up, rank, dev;
	hpu__dev_caps caps;
	hpu__dev_queue compute;
	pthread_mutex_t mu; /* the results' buffers and the zeroing event */
	void *dres;         /* device: flags, counts, partial sums */
	void *hres;         /* pinned host: their copy */
	size_t rescap;      /* bytes of each */
	double *sq;         /* device: sumsq_add's parts (SQ_PARTS) and running total */
	cudaEvent_t zeroed; /* after the last zeroing on the compute stream */
	uint64_t zero_seq;  /* zeroings so far */
	int gen;            /* set-ups so far */
} C = {.mu = PTHREAD_MUTEX_INITIALIZER, .dev = -1};

static _Thread_local int bound_gen; /* the set-up this thread is bound for */

/* Recording (the capture table below): on this thread, the first
 * refusal's sentence (kept in the kernel table's recording error where
 * the module has it, so that one sentence is the first of both). */
static _Thread_local struct {
	int on;
	char why[256];
} R;

/* Blocks freed while recording (devmem's, by cudaFree, and pinned host
 * memory, by cudaFreeHost: both wait for the device, which a capture
 * cannot hold): freed once it ends. Under C.mu. */
/* Some thread records the compute stream now. */
static volatile int capturing_any;

static struct late_free {
	void *p;
	int host;
} *late;
static size_t nlate, late_cap;

/* A wait on the host: what a recording refuses first. */
#define NO_WAIT "waits for the GPU on the host, which a recorded step cannot hold"

int hpu__cuda_capturing(void)
{
	return R.on;
}

int hpu__cuda_capture_refuse(const char *what, const char *why)
{
	if (!R.on)
		return 0;
#ifdef HPU_CUDA_HAVE_OPS
	hpu__cuda_ops_refuse(what, why);
#else
	if (!R.why[0])
		snprintf(R.why, sizeof R.why, "%s: %s", what, why);
#endif
	return 1;
}

static const char *capture_refusal(void)
{
#ifdef HPU_CUDA_HAVE_OPS
	return hpu__cuda_ops_recording_error();
#else
	return R.why;
#endif
}

/* ---- errors ---- */

void hpu__cuda_check(cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return;
	if (R.on) { /* the recording fails, not the worker */
		(void)cudaGetLastError();
		hpu__cuda_capture_refuse(what, cudaGetErrorString(e));
		return;
	}
	char line[512];
	int n = snprintf(line, sizeof line, "hpu-worker: rank %d: CUDA error in %s on GPU %d: %s\n",
			 C.rank, what, C.dev, cudaGetErrorString(e));
	if (n > 0 && write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0)
		_exit(1);
	_exit(1);
}

void hpu__cuda_bind(void)
{
	if (C.up && bound_gen != C.gen) {
		hpu__cuda_check(cudaSetDevice(C.dev), "cudaSetDevice");
		bound_gen = C.gen;
	}
}

cudaStream_t hpu__cuda_stream(void)
{
	hpu__cuda_bind();
	return C.up ? C.compute.s : 0;
}

int hpu__cuda_device_index(void)
{
	return C.up ? C.dev : -1;
}

/* ---- queues and events ---- */

static hpu__dev_queue *Q(hpu__dev_queue *q)
{
	return q ? q : &C.compute;
}

static int queue_init(hpu__dev_queue *q, cudaStream_t s)
{
	memset(q, 0, sizeof *q);
	q->s = s;
	pthread_mutex_init(&q->mu, NULL);
	for (int i = 0; i < RING; i++)
		if (cudaEventCreateWithFlags(&q->ev[i], cudaEventDisableTiming) != cudaSuccess) {
			while (i--)
				cudaEventDestroy(q->ev[i]);
			return -1;
		}
	return 0;
}

static void queue_fini(hpu__dev_queue *q)
{
	cudaStreamSynchronize(q->s);
	for (int i = 0; i < RING; i++)
		cudaEventDestroy(q->ev[i]);
	pthread_mutex_destroy(&q->mu);
}

static hpu__dev_queue *cuda_queue_new(void)
{
	hpu__cuda_bind();
	hpu__dev_queue *q = malloc(sizeof *q);
	cudaStream_t s;
	if (!q || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
		free(q);
		return NULL;
	}
	if (queue_init(q, s) < 0) {
		cudaStreamDestroy(s);
		free(q);
		return NULL;
	}
	return q;
}

static void cuda_queue_free(hpu__dev_queue *q)
{
	hpu__cuda_bind();
	cudaStream_t s = q->s;
	queue_fini(q);
	cudaStreamDestroy(s);
	free(q);
}

/* Work about to be issued on q waits for blocks zeroed on the compute
 * stream before it. */
static cudaStream_t stream_of(hpu__dev_queue *q)
{
	hpu__cuda_bind();
	if (!q || q == &C.compute)
		return C.compute.s;
	pthread_mutex_lock(&C.mu);
	if (q->zero_seen != C.zero_seq) {
		hpu__cuda_check(cudaStreamWaitEvent(q->s, C.zeroed, 0), "cudaStreamWaitEvent");
		q->zero_seen = C.zero_seq;
	}
	pthread_mutex_unlock(&C.mu);
	return q->s;
}

static void cuda_record(hpu__dev_queue *q, hpu__dev_event *ev)
{
	hpu__dev_queue *x = Q(q);
	/* an event recorded into the recording stream is a captured one: a
	 * host wait on it (or on an older event of its ring slot) after the
	 * recording would fail with cudaErrorCapturedEvent */
	if (x == &C.compute &&
	    hpu__cuda_capture_refuse("hpu__dev_event_record",
				     "an event on the recording stream: the host could not wait for "
				     "it after the recording")) {
		ev->q = q;
		ev->seq = 0;
		return;
	}
	hpu__cuda_bind();
	pthread_mutex_lock(&x->mu);
	uint64_t seq = ++x->issued;
	hpu__cuda_check(cudaEventRecord(x->ev[seq % RING], x->s), "cudaEventRecord");
	pthread_mutex_unlock(&x->mu);
	ev->q = q;
	ev->seq = seq;
}

static void cuda_wait(const hpu__dev_event *ev)
{
	if (!ev->seq)
		return;
	if (hpu__cuda_capture_refuse("hpu__dev_event_wait", "a wait: it " NO_WAIT))
		return;
	hpu__dev_queue *x = Q(ev->q);
	hpu__cuda_bind();
	pthread_mutex_lock(&x->mu);
	cudaEvent_t e = x->ev[ev->seq % RING];
	pthread_mutex_unlock(&x->mu);
	hpu__cuda_check(cudaEventSynchronize(e), "cudaEventSynchronize");
}

/* ---- memory ---- */

static int is_device(const void *p)
{
	hpu__cuda_bind();
	return hpu__cuda_on_device(p);
}

/* 1 when p is page-locked host memory (cudaHostAlloc's): what a recorded
 * copy may read when the graph runs. */
static int is_pinned(const void *p)
{
	return hpu__cuda_mem_type(p) == cudaMemoryTypeHost;
}

static int cuda_owns(const void *p)
{
	return is_device(p);
}

static void *bk_map(size_t bytes)
{
	void *p = NULL;
	/* devmem's pool may grow while a step records: cudaMalloc is not
	 * stream work (the graph keeps the address, devmem keeps the block
	 * for it), so the thread's mode is relaxed around it, as PyTorch's
	 * allocator does */
	enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
	hpu__cuda_bind();
	cudaThreadExchangeStreamCaptureMode(&mode);
	cudaError_t e = cudaMalloc(&p, bytes);
	cudaThreadExchangeStreamCaptureMode(&mode);
	if (e != cudaSuccess) {
		cudaGetLastError(); /* out of memory is not sticky */
		errno = ENOMEM;
		return NULL;
	}
	return p;
}

/* Puts p's free off until the recording ends (free_late); 0 when not
 * recording (the caller frees it now). */
static int free_later(void *p, int host)
{
	if (!R.on)
		return 0;
	pthread_mutex_lock(&C.mu);
	if (nlate == late_cap) {
		size_t cap = late_cap ? late_cap * 2 : 16;
		struct late_free *m = realloc(late, cap * sizeof *m);
		if (!m) {
			pthread_mutex_unlock(&C.mu);
			return 1; /* leaked: no host memory to note it */
		}
		late = m;
		late_cap = cap;
	}
	late[nlate].p = p;
	late[nlate++].host = host;
	pthread_mutex_unlock(&C.mu);
	return 1;
}

static void bk_unmap(void *p, size_t bytes)
{
	(void)bytes;
	hpu__cuda_bind();
	if (!free_later(p, 0))
		hpu__cuda_check(cudaFree(p), "cudaFree");
}

/* The blocks zeroed while recording (bk_zero: a cudaMemsetAsync in the
 * graph, which nothing runs until a replay): zeroed again once the
 * recording ends, before the frees put off. A refused recording leaves
 * no graph, and its step runs eagerly with the blocks it allocated and
 * keeps (their zeroing never ran: cpu-strict, whose zeroing is done
 * when asked, could not show it); after a recording taken, its replay
 * zeroes them again. Under C.mu. */
static struct late_zero {
	void *p;
	size_t bytes;
} *lz;
static size_t nlz, lz_cap;

static void zero_late(void)
{
	pthread_mutex_lock(&C.mu);
	/* on the compute stream, whose recording has ended: after the eager
	 * kernels queued before it, which may still use a block the pool
	 * gave the recording (freed by them: the pool's blocks are ordered
	 * by that stream alone; the legacy stream, which a non-blocking
	 * stream does not wait for, could zero one under a running kernel).
	 * The legacy stream only where another recording holds it. */
	enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
	cudaStream_t s = cudaStreamIsCapturing(C.compute.s, &cs) == cudaSuccess &&
				 cs == cudaStreamCaptureStatusNone
			 ? C.compute.s
			 : 0;
	for (size_t i = 0; i < nlz; i++)
		hpu__cuda_check(cudaMemsetAsync(lz[i].p, 0, lz[i].bytes, s), "cudaMemsetAsync");
	if (nlz)
		hpu__cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
	nlz = 0;
	pthread_mutex_unlock(&C.mu);
}

/* The frees put off while recording (after cudaStreamEndCapture). */
static void free_late(void)
{
	pthread_mutex_lock(&C.mu);
	for (size_t i = 0; i < nlate; i++)
		hpu__cuda_check(late[i].host ? cudaFreeHost(late[i].p) : cudaFree(late[i].p),
				late[i].host ? "cudaFreeHost" : "cudaFree");
	nlate = 0;
	pthread_mutex_unlock(&C.mu);
}

/* While recording, the zeroing is recorded with the step (a block the
 * step allocates is zeroed by each replay, as each eager step's fresh
 * block is), and no event: other queues' work is refused then. */
static void bk_zero(void *p, size_t bytes)
{
	hpu__cuda_bind();
	if (capturing_any && !R.on) {
		/* another thread records the compute stream: zeroed on the
		 * legacy stream (which the non-blocking compute stream does not
		 * wait for) and waited for here, outside the graph */
		hpu__cuda_check(cudaMemsetAsync(p, 0, bytes, 0), "cudaMemsetAsync");
		hpu__cuda_check(cudaStreamSynchronize(0), "cudaStreamSynchronize");
		return;
	}
	pthread_mutex_lock(&C.mu);
	hpu__cuda_check(cudaMemsetAsync(p, 0, bytes, C.compute.s), "cudaMemsetAsync");
	if (!R.on) {
		hpu__cuda_check(cudaEventRecord(C.zeroed, C.compute.s), "cudaEventRecord");
		C.zero_seq++;
	} else {
		if (nlz == lz_cap) {
			size_t cap = lz_cap ? 2 * lz_cap : 64;
			struct late_zero *g = realloc(lz, cap * sizeof *g);
			if (g) {
				lz = g;
				lz_cap = cap;
			}
		}
		if (nlz < lz_cap) { /* zeroed again when the recording ends: zero_late */
			lz[nlz].p = p;
			lz[nlz++].bytes = bytes;
		} else {
			hpu__cuda_capture_refuse("a zeroed block", "no host memory to note it");
		}
	}
	pthread_mutex_unlock(&C.mu);
}

static const hpu__devmem_backing backing = {
    .map = bk_map,
    .unmap = bk_unmap,
    .remote = 1,
    .zero = bk_zero,
};

static void *cuda_host_alloc(size_t bytes)
{
	size_t n = (bytes + 63) / 64 * 64;
	void *p = NULL;
	enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
	hpu__cuda_bind();
	cudaThreadExchangeStreamCaptureMode(&mode); /* not stream work (bk_map's) */
	cudaError_t e = cudaHostAlloc(&p, n ? n : 64, cudaHostAllocPortable);
	cudaThreadExchangeStreamCaptureMode(&mode);
	if (e != cudaSuccess) {
		cudaGetLastError();
		return NULL;
	}
	memset(p, 0, n ? n : 64);
	return p;
}

static void cuda_host_free(void *p)
{
	hpu__cuda_bind();
	if (free_later(p, 1)) /* cudaFreeHost waits for the device */
		return;
	hpu__cuda_check(cudaFreeHost(p), "cudaFreeHost");
}

/* ---- copies ---- */

static cudaStream_t S0(void)
{
	hpu__cuda_bind();
	return C.compute.s;
}

/* While recording: only the compute stream is recorded, nothing comes
 * back to the host, and a copy from the host reads pinned memory (the
 * graph reads it when it runs); 1 where the copy is refused. */
static int copy_refused(hpu__dev_queue *q, void *dst, const void *src)
{
	if (!R.on)
		return 0;
	if (q && q != &C.compute)
		return hpu__cuda_capture_refuse("a copy on a queue of its own",
						"only the default queue is recorded");
	if (!is_device(dst))
		return hpu__cuda_capture_refuse("hpu__dev_d2h",
						"a copy into host memory: it " NO_WAIT);
	if (!is_device(src) && !is_pinned(src))
		return hpu__cuda_capture_refuse(
			"hpu__dev_h2d", "a copy from pageable host memory: a recorded copy reads "
					"pinned memory only (hpu__dev_host_alloc)");
	return 0;
}

static void cuda_copy(hpu__dev_queue *q, void *dst, const void *src, size_t n)
{
	if (!n || copy_refused(q, dst, src))
		return;
	if (R.on) { /* from device or pinned memory: queued, read when the graph runs */
		hpu__cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, S0()),
				"cudaMemcpyAsync");
		return;
	}
	cudaStream_t s = stream_of(q);
	hpu__cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s), "cudaMemcpyAsync");
	if (!is_device(dst) || !is_device(src))
		hpu__cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

/* hpu__device.copy_queued: the copy without the wait (the caller waits
 * later, or leaves the pinned source alone until it does). */
static void cuda_copy_queued(hpu__dev_queue *q, void *dst, const void *src, size_t n)
{
	if (!n || copy_refused(q, dst, src))
		return;
	hpu__cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, R.on ? S0() : stream_of(q)),
			"cudaMemcpyAsync");
}

static void cuda_fill(hpu__dev_queue *q, void *dst, int byte, size_t n)
{
	if (n && R.on && q && q != &C.compute &&
	    hpu__cuda_capture_refuse("a fill on a queue of its own",
				     "only the default queue is recorded"))
		return;
	if (n)
		hpu__cuda_check(cudaMemsetAsync(dst, byte, n, stream_of(q)), "cudaMemsetAsync");
}

/* ---- set-up ---- */

static void caps_of(int dev, hpu__dev_caps *c, int *major, int *minor)
{
	cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, dev);
	cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, dev);
	memset(c, 0, sizeof *c);
	c->bf16_native = *major >= 8;
	c->fp16_native = *major >= 7;
	c->fp8_native = *major * 10 + *minor >= 89;
	c->host_can_read = 0;
	c->can_capture = 1;
}

/* The GPU this worker drives among `count`: HPU_DEVICE_ID (the agent's,
 * which hpud may map), else LOCAL_RANK, else 0, modulo count. */
static int pick(int count)
{
	const char *s = getenv("HPU_DEVICE_ID");
	if (!s || !*s)
		s = getenv("LOCAL_RANK");
	long id = s && *s ? strtol(s, NULL, 10) : 0;
	return (int)((id < 0 ? 0 : id) % count);
}

static int fail(char *err, size_t errlen, const char *what, cudaError_t e)
{
	snprintf(err, errlen, "--device cuda: %s on GPU %d: %s", what, C.dev,
		 cudaGetErrorString(e));
	cudaGetLastError();
	return -1;
}

/* The GPUs CUDA sees; none: why, in err. */
static int visible(char *err, size_t errlen);

static int setup_core(int rank, char *err, size_t errlen)
{
	int count = 0, major = 0, minor = 0;
	hpu__cuda_kprof_begin(rank); /* HPU_PROFILE_KERNELS: before any work */
	char why[160];
	count = visible(why, sizeof why);
	if (count <= 0) {
		snprintf(err, errlen, "--device cuda: no GPU is visible (%s)", why);
		return -1;
	}
	C.rank = rank;
	C.dev = pick(count);
	caps_of(C.dev, &C.caps, &major, &minor);
	C.caps.gpu = C.dev;
	C.caps.gpus = count;
	/* the GPU's identity, for counting the workers that share it */
	if (cudaDeviceGetPCIBusId(C.caps.gpu_id, (int)sizeof C.caps.gpu_id, C.dev) != cudaSuccess) {
		C.caps.gpu_id[0] = '\0';
		cudaGetLastError();
	}
	if (major < 8) {
		snprintf(err, errlen,
			 "--device cuda: GPU %d has compute capability %d.%d; the CUDA device needs 8.0 or later",
			 C.dev, major, minor);
		return -1;
	}
	cudaStream_t s;
	cudaError_t e;
	if ((e = cudaSetDevice(C.dev)) != cudaSuccess)
		return fail(err, errlen, "cudaSetDevice", e);
	if ((e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess)
		return fail(err, errlen, "creating the compute stream", e);
	if (queue_init(&C.compute, s) < 0) {
		cudaStreamDestroy(s);
		return fail(err, errlen, "creating events", cudaGetLastError());
	}
	if ((e = cudaEventCreateWithFlags(&C.zeroed, cudaEventDisableTiming)) != cudaSuccess) {
		queue_fini(&C.compute);
		cudaStreamDestroy(s);
		return fail(err, errlen, "creating events", e);
	}
	if ((e = cudaMalloc((void **)&C.sq, (SQ_PARTS + 1) * sizeof(double))) != cudaSuccess) {
		C.sq = NULL;
		cudaEventDestroy(C.zeroed);
		queue_fini(&C.compute);
		cudaStreamDestroy(s);
		return fail(err, errlen, "allocating the sums' scratch", e);
	}
	C.zero_seq = 0;
	C.gen++;
	C.up = 1;
	bound_gen = C.gen; /* cudaSetDevice above */
	return 0;
}

static int cuda_setup(int rank, char *err, size_t errlen)
{
	if (setup_core(rank, err, errlen) < 0)
		return -1;
#ifdef HPU_CUDA_HAVE_OPS
	hpu__cuda_ops_set_stream(C.compute.s); /* the table's kernels run on the compute stream */
	if (hpu__cuda_backend())
		return 0;
	snprintf(err, errlen, "--device cuda: the CUDA kernels did not set up on GPU %d", C.dev);
#else
	snprintf(err, errlen,
		 "--device cuda: the CUDA kernels are not built in this module (worker/cuda/ops.cmake lists none)");
#endif
	return -1;
}

static void cuda_teardown(void)
{
	if (!C.up)
		return;
	hpu__cuda_bind();
#ifdef HPU_CUDA_HAVE_OPS
	if (R.on) /* a recording left under way: no graph will come of it */
		hpu__cuda_ops_graph_drop();
	hpu__cuda_ops_release(); /* waits for the stream, frees handles and plans */
	hpu__cuda_ops_set_stream(NULL);
#endif
	R.on = 0;
	capturing_any = 0;
	hpu__cuda_kprof_end(); /* the stream idle: every record is in */
	free_late();
	free(late);
	late = NULL;
	late_cap = 0;
	cudaStream_t s = C.compute.s;
	queue_fini(&C.compute);
	cudaStreamDestroy(s);
	cudaEventDestroy(C.zeroed);
	if (C.dres)
		cudaFree(C.dres);
	if (C.hres)
		cudaFreeHost(C.hres);
	if (C.sq)
		cudaFree(C.sq);
	C.dres = C.hres = NULL;
	C.sq = NULL;
	C.rescap = 0;
	C.up = 0;
}

/* ---- the options ---- */

static int nccl_asked; /* --collectives nccl */

int hpu__cuda_nccl_asked(void)
{
	return nccl_asked;
}

#define GIB(n) ((double)(n) / (1024.0 * 1024.0 * 1024.0))

/* --device-memory against the GPU's memory (cudaMemGetInfo's total: a
 * larger limit could never be met, and would end in an out-of-memory
 * error in the middle of training), --allow-tf32 to the kernels,
 * --collectives nccl to the group (libnccl.so.2 opened now: where it
 * cannot be, the worker fails here, saying why). */
static int cuda_configure(const hpu__dev_config *c, uint64_t *capacity, char *note,
			  size_t notelen, char *err, size_t errlen)
{
	size_t free_b = 0, total = 0;
	struct cudaDeviceProp p;
	cudaError_t e;
	hpu__cuda_bind();
	if ((e = cudaMemGetInfo(&free_b, &total)) != cudaSuccess)
		return fail(err, errlen, "cudaMemGetInfo", e);
	if ((e = cudaGetDeviceProperties(&p, C.dev)) != cudaSuccess)
		return fail(err, errlen, "cudaGetDeviceProperties", e);
	p.name[sizeof p.name - 1] = '\0';
	*capacity = total;
	if (c->memory_limit > total) {
		snprintf(err, errlen,
			 "--device-memory %llu bytes (%.1f GiB) is more than GPU %d (%s) has: %llu "
			 "bytes (%.1f GiB) in all",
			 (unsigned long long)c->memory_limit, GIB(c->memory_limit), C.dev, p.name,
			 (unsigned long long)total, GIB(total));
		return -1;
	}
	char nccl[96] = "";
	if (c->nccl) {
		char why[200];
		if (hpu__cuda_nccl_load(why, sizeof why) < 0) {
			snprintf(err, errlen, "--collectives nccl: %s", why);
			return -1;
		}
		char v[48];
		snprintf(nccl, sizeof nccl, "%s (its buffers outside the limit too)",
			 hpu__cuda_nccl_version(v, sizeof v));
	}
	nccl_asked = c->nccl;
	size_t ws = 0;
#ifdef HPU_CUDA_HAVE_OPS
	hpu__cuda_ops_allow_tf32(c->allow_tf32);
	ws = hpu__cuda_ops_workspace_bytes();
#endif
	snprintf(note, notelen,
		 "device cuda: GPU %d (%s), %.1f GiB in all, %.1f GiB free; outside the "
		 "--device-memory limit: CUDA's context, the kernels' workspace (%zu MiB) and "
		 "scratch; TF32 for fp32 GEMMs and convolutions %s%s%s",
		 C.dev, p.name, GIB(total), GIB(free_b), ws >> 20,
		 c->allow_tf32 ? "allowed (--allow-tf32)" : "off",
		 c->nccl ? "; gradients' all-reduce: " : "", nccl);
	return 0;
}

/* A device call: its thread drives the worker's GPU. */
static void cuda_enter(void)
{
	hpu__cuda_bind();
}

static void cuda_caps(hpu__dev_caps *out)
{
	*out = C.caps;
}

static const hpu__backend *cuda_ops(void)
{
#ifdef HPU_CUDA_HAVE_OPS
	return hpu__cuda_backend();
#else
	return NULL; /* setup failed: the device never serves */
#endif
}

/* ---- the runtime ops ---- */

#define S (hpu__cuda_bind(), C.compute.s)
#define K(call, what) hpu__cuda_check(call, what)
/* The ops that answer a value refuse to be recorded (returning 0). */
#define VALUE "its value comes back to the host, which " NO_WAIT

/* The results' buffers, at least `bytes` each, zeroed on the device;
 * under C.mu. */
static void res_need(size_t bytes)
{
	if (bytes > C.rescap) {
		size_t cap = bytes < 4096 ? 4096 : bytes * 2;
		K(cudaStreamSynchronize(S), "cudaStreamSynchronize");
		if (C.dres)
			K(cudaFree(C.dres), "cudaFree");
		if (C.hres)
			K(cudaFreeHost(C.hres), "cudaFreeHost");
		C.dres = C.hres = NULL;
		C.rescap = 0;
		K(cudaMalloc(&C.dres, cap), "cudaMalloc (results)");
		K(cudaHostAlloc(&C.hres, cap, 0), "cudaHostAlloc (results)");
		C.rescap = cap;
	}
	K(cudaMemsetAsync(C.dres, 0, bytes, S), "cudaMemsetAsync");
}

/* Copies the first `bytes` of the results back and waits; under C.mu. */
static void res_fetch(size_t bytes)
{
	K(cudaMemcpyAsync(C.hres, C.dres, bytes, cudaMemcpyDeviceToHost, S), "cudaMemcpyAsync");
	K(cudaStreamSynchronize(S), "cudaStreamSynchronize");
}

static void rt_to16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	if (n)
		K(hpu__cuda_k_to16(S, fp16, dst, src, n), "to16");
}

static void rt_from16(int fp16, float *dst, const uint16_t *src, size_t n)
{
	if (n)
		K(hpu__cuda_k_from16(S, fp16, dst, src, n), "from16");
}

static void rt_acc16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	if (n)
		K(hpu__cuda_k_acc16(S, fp16, dst, src, n), "acc16");
}

static int rt_bf16_exact(uint16_t *dst, const float *x, size_t n)
{
	if (hpu__cuda_capture_refuse("bf16_exact", VALUE))
		return 0;
	if (!n)
		return 1;
	pthread_mutex_lock(&C.mu);
	res_need(sizeof(unsigned));
	K(hpu__cuda_k_bf16_exact(S, dst, x, n, C.dres), "bf16_exact");
	res_fetch(sizeof(unsigned));
	int exact = *(unsigned *)C.hres == 0;
	pthread_mutex_unlock(&C.mu);
	return exact;
}

static void rt_bf16_expand(float *dst, const uint16_t *src, size_t n)
{
	if (n)
		K(hpu__cuda_k_bf16_expand(S, dst, src, n), "bf16_expand");
}

static void rt_add(float *dst, const float *src, size_t n)
{
	if (n)
		K(hpu__cuda_k_add(S, dst, src, n), "add");
}

static void rt_add_scalar(float *dst, float v, size_t n)
{
	if (n)
		K(hpu__cuda_k_add_scalar(S, dst, v, n), "add_scalar");
}

static void rt_sum(double *out, const float *v, size_t n)
{
	K(hpu__cuda_k_sum(S, out, v, n), "sum");
}

/* device_ops.c's sumsq: the blocks' sums from the device, added here in
 * their order, then the rest's. */
static double rt_sumsq(const float *g, size_t n)
{
	if (hpu__cuda_capture_refuse("sumsq", VALUE))
		return 0;
	size_t nb = n / 256;
	pthread_mutex_lock(&C.mu);
	res_need((nb + 1) * sizeof(double));
	K(hpu__cuda_k_sumsq_parts(S, g, n, C.dres), "sumsq");
	res_fetch((nb + 1) * sizeof(double));
	const double *part = C.hres;
	double total = 0.0;
	for (size_t b = 0; b < nb; b++)
		total += part[b];
	total += part[nb];
	pthread_mutex_unlock(&C.mu);
	return total;
}

static double rt_sumsq16(double acc, int fp16, const uint16_t *g, size_t n, float *scratch,
			 size_t chunk)
{
	if (hpu__cuda_capture_refuse("sumsq16", VALUE))
		return 0;
	for (size_t i = 0; i < n; i += chunk) {
		size_t c = n - i < chunk ? n - i : chunk;
		rt_from16(fp16, scratch, g + i, c);
		acc += rt_sumsq(scratch, c);
	}
	return acc;
}

static int flag_op(int which, int fp16, const void *g, size_t n)
{
	if (hpu__cuda_capture_refuse(which ? "nonfinite16" : "nonfinite", VALUE))
		return 0;
	if (!n)
		return 0;
	pthread_mutex_lock(&C.mu);
	res_need(sizeof(unsigned));
	if (which == 0)
		K(hpu__cuda_k_nonfinite(S, g, n, C.dres), "nonfinite");
	else
		K(hpu__cuda_k_nonfinite16(S, fp16, g, n, C.dres), "nonfinite16");
	res_fetch(sizeof(unsigned));
	int bad = *(unsigned *)C.hres != 0;
	pthread_mutex_unlock(&C.mu);
	return bad;
}

static int rt_nonfinite(const float *g, size_t n)
{
	return flag_op(0, 0, g, n);
}

static int rt_nonfinite16(int fp16, const uint16_t *g, size_t n)
{
	return flag_op(1, fp16, g, n);
}

static long count_op(int is16, const void *v, size_t n)
{
	if (hpu__cuda_capture_refuse(is16 ? "count_nonfinite16" : "count_nonfinite", VALUE))
		return 0;
	if (!n)
		return 0;
	pthread_mutex_lock(&C.mu);
	res_need(sizeof(unsigned long long));
	if (is16)
		K(hpu__cuda_k_count_nonfinite16(S, v, n, C.dres), "count_nonfinite16");
	else
		K(hpu__cuda_k_count_nonfinite(S, v, n, C.dres), "count_nonfinite");
	res_fetch(sizeof(unsigned long long));
	long k = (long)*(unsigned long long *)C.hres;
	pthread_mutex_unlock(&C.mu);
	return k;
}

static long rt_count_nonfinite(const float *v, size_t n)
{
	return count_op(0, v, n);
}

static long rt_count_nonfinite16(const uint16_t *v, size_t n)
{
	return count_op(1, v, n);
}

static void rt_optim(const hpu__dev_optim *o, float *p, const float *g, float *m, float *v,
		     size_t n)
{
	if (n && o->sv) {
		K(hpu__cuda_k_optim_sv(S, o, p, g, NULL, 0, NULL, m, v, n), "optim");
		return;
	}
	hpu__cuda_optk k = hpu__cuda_optk_of(o);
	if (n)
		K(hpu__cuda_k_optim(S, &k, p, g, NULL, 0, NULL, m, v, n), "optim");
}

/* The gradients widened in the kernel itself: the scratch is not needed
 * (each element's arithmetic is the CPU's, chunked or not). */
static void rt_optim16(const hpu__dev_optim *o, int fp16, float *p, const uint16_t *g16,
		       uint16_t *p16, float *m, float *v, size_t n, float *scratch, size_t chunk)
{
	(void)scratch;
	(void)chunk;
	if (n && o->sv) {
		K(hpu__cuda_k_optim_sv(S, o, p, NULL, g16, fp16, p16, m, v, n), "optim16");
		return;
	}
	hpu__cuda_optk k = hpu__cuda_optk_of(o);
	if (n)
		K(hpu__cuda_k_optim(S, &k, p, NULL, g16, fp16, p16, m, v, n), "optim16");
}

/* ---- the step's decisions: kernels only, nothing comes back ----
 * No wait, no copy to the host, no allocation: a CUDA graph records
 * them (a failed call is fatal, as K's everywhere here). */

static void rt_flag_nonfinite(float *flag, const float *g, size_t n)
{
	if (n)
		K(hpu__cuda_k_flag_nonfinite(S, flag, g, n), "flag_nonfinite");
}

static void rt_flag_nonfinite16(float *flag, int fp16, const uint16_t *g, size_t n)
{
	if (n)
		K(hpu__cuda_k_flag_nonfinite16(S, flag, fp16, g, n), "flag_nonfinite16");
}

/* *acc += rt_sumsq(g, n), the same double: the parts SQ_PARTS at a time
 * into C.sq, each batch added in order onto the last's total (kept in
 * C.sq[SQ_PARTS]), the last batch's onto *acc. C.mu keeps another
 * thread's batches out of C.sq until the last fold is queued. */
static void rt_sumsq_add(double *acc, const float *g, size_t n)
{
	const size_t parts = n / HPU_SUMSQ_BLOCK + 1;
	pthread_mutex_lock(&C.mu);
	for (size_t b0 = 0; b0 < parts; b0 += SQ_PARTS) {
		size_t count = parts - b0 < SQ_PARTS ? parts - b0 : SQ_PARTS;
		int last = b0 + count == parts;
		K(hpu__cuda_k_sumsq_parts_at(S, g, n, b0, count, C.sq), "sumsq_add");
		K(hpu__cuda_k_sumsq_fold(S, C.sq, count, C.sq + SQ_PARTS, b0 == 0,
					 last ? acc : NULL),
		  "sumsq_add");
	}
	pthread_mutex_unlock(&C.mu);
}

/* rt_sumsq16's chunks, each added onto *acc as it goes: in batches of
 * chunks whose parts and totals fit C.sq, three launches a batch (chunk
 * by chunk, widened into scratch, it was three a chunk: about 23,000 a
 * step for GPT-2 124M's gradient norm in bf16). The same additions in the
 * same order (cuda_elem.h's sumsq16 functions; test_cuda_elem holds them
 * against device_ops.c's). */
static void rt_sumsq16_add(double *acc, int fp16, const uint16_t *g, size_t n, float *scratch,
			   size_t chunk)
{
	size_t pc, per = chunk ? hpu__elem_sumsq16_batch(chunk, SQ_PARTS, &pc) : 0;
	if (!per) { /* a chunk's parts do not fit C.sq: chunk by chunk */
		for (size_t i = 0; i < n; i += chunk) {
			size_t c = n - i < chunk ? n - i : chunk;
			rt_from16(fp16, scratch, g + i, c);
			rt_sumsq_add(acc, scratch, c);
		}
		return;
	}
	size_t chunks = (n + chunk - 1) / chunk;
	pthread_mutex_lock(&C.mu);
	for (size_t j0 = 0; j0 < chunks; j0 += per) {
		size_t nj = chunks - j0 < per ? chunks - j0 : per;
		K(hpu__cuda_k_sumsq16_batch(S, fp16, g, n, chunk, j0, nj, acc, C.sq), "sumsq16_add");
	}
	pthread_mutex_unlock(&C.mu);
}

static void rt_loss_seed(float *g, size_t n, const double *sums, int nsums, float weight,
			 float base, int batch, hpu__dev_stepvars *sv)
{
	/* at n = 0 too: sv->bad as the host's */
	K(hpu__cuda_k_loss_seed(S, g, n, sums, nsums, weight, base, batch, sv), "loss_seed");
}

static void rt_step_begin(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	K(hpu__cuda_k_step_begin(S, sv, c), "step_begin");
}

static void rt_step_end(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	K(hpu__cuda_k_step_end(S, sv, c), "step_end");
}

static void rt_rows_add(double *acc, const float *v, size_t n, const int *rows)
{
	K(hpu__cuda_k_rows_add(S, acc, v, n, rows), "rows_add");
}

static void rt_loss_add(double *acc, const double *sums, const double *w, int nloss,
			const int *rows)
{
	K(hpu__cuda_k_loss_add(S, acc, sums, w, nloss, rows), "loss_add");
}

static const hpu__dev_rtops rtops = {
    .to16 = rt_to16,
    .from16 = rt_from16,
    .acc16 = rt_acc16,
    .bf16_exact = rt_bf16_exact,
    .bf16_expand = rt_bf16_expand,
    .add = rt_add,
    .add_scalar = rt_add_scalar,
    .sumsq = rt_sumsq,
    .sumsq16 = rt_sumsq16,
    .sum = rt_sum,
    .nonfinite = rt_nonfinite,
    .nonfinite16 = rt_nonfinite16,
    .count_nonfinite = rt_count_nonfinite,
    .count_nonfinite16 = rt_count_nonfinite16,
    .optim = rt_optim,
    .optim16 = rt_optim16,
    .flag_nonfinite = rt_flag_nonfinite,
    .flag_nonfinite16 = rt_flag_nonfinite16,
    .sumsq_add = rt_sumsq_add,
    .sumsq16_add = rt_sumsq16_add,
    .loss_seed = rt_loss_seed,
    .step_begin = rt_step_begin,
    .step_end = rt_step_end,
    .rows_add = rt_rows_add,
    .loss_add = rt_loss_add,
};

/* ---- recording a step (the device's hpu__dev_recorder): CUDA's stream
 * capture into a CUDA graph ----
 *
 * The compute stream is captured in thread-local mode: a call of this
 * thread that would synchronize or otherwise break the capture is an
 * error of that call. The module refuses such calls before making them
 * (copies to the host, waits, value-returning ops, the kernel table's
 * readbacks, scratch growth, dropout with the host's keys, the IPC
 * all-reduce): the call does
 * nothing and the first refusal's sentence is kept; a CUDA error while
 * recording is kept the same way instead of ending the worker. devmem
 * may still allocate (bk_map: cudaMalloc in relaxed mode); its frees wait
 * for the end (bk_unmap). */

static int cap_begin(char *err, size_t len)
{
	if (!C.up) {
		snprintf(err, len, "--graphs: the CUDA device is not set up");
		return -1;
	}
	if (R.on) {
		snprintf(err, len, "--graphs: a recording is already under way on this thread");
		return -1;
	}
	hpu__cuda_bind();
	(void)cudaGetLastError(); /* an old, non-sticky error is not this recording's */
	cudaError_t e = cudaStreamBeginCapture(C.compute.s, cudaStreamCaptureModeThreadLocal);
	if (e != cudaSuccess) {
		snprintf(err, len, "--graphs: cudaStreamBeginCapture on GPU %d: %s", C.dev,
			 cudaGetErrorString(e));
		(void)cudaGetLastError();
		return -1;
	}
	R.on = 1;
	R.why[0] = '\0';
	capturing_any = 1;
#ifdef HPU_CUDA_HAVE_OPS
	hpu__cuda_ops_recording(1); /* the table's failed calls: refusals */
	hpu__cuda_ops_graph_hold(); /* the graph keeps the scratch it is given */
#endif
	return 0;
}

/* After a failed recording the stream must be usable again: where CUDA
 * still reports it capturing (or cannot say), a new compute stream
 * replaces it (the old one destroyed: its work, if any, completes). */
static void stream_recover(void)
{
	enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
	cudaError_t e = cudaStreamIsCapturing(C.compute.s, &st);
	(void)cudaGetLastError();
	if (e == cudaSuccess && st == cudaStreamCaptureStatusNone)
		return;
	cudaStream_t fresh;
	if (cudaStreamCreateWithFlags(&fresh, cudaStreamNonBlocking) != cudaSuccess) {
		(void)cudaGetLastError();
		return; /* the next call's error names it */
	}
	cudaStream_t old = C.compute.s;
	C.compute.s = fresh;
#ifdef HPU_CUDA_HAVE_OPS
	hpu__cuda_ops_set_stream(fresh);
#endif
	(void)cudaStreamDestroy(old);
	(void)cudaGetLastError();
}

static int cap_end(void **graph, char *why, size_t len)
{
	cudaGraph_t g = NULL;
	cudaGraphExec_t x = NULL;
	*graph = NULL;
	if (!R.on) {
		snprintf(why, len, "--graphs: no recording is under way on this thread");
		return -1;
	}
	hpu__cuda_bind();
	cudaError_t e = cudaStreamEndCapture(C.compute.s, &g);
	char first[256];
	snprintf(first, sizeof first, "%s", capture_refusal());
	R.on = 0;
	capturing_any = 0;
#ifdef HPU_CUDA_HAVE_OPS
	hpu__cuda_ops_recording(0);
#endif
	(void)cudaGetLastError(); /* a refused call's error is not the next kernel's */
	zero_late();
	free_late();
	if (first[0] || e != cudaSuccess || !g) {
		if (first[0])
			snprintf(why, len, "%s", first);
		else
			snprintf(why, len,
				 "a call the recording cannot hold invalidated it "
				 "(cudaStreamEndCapture: %s)",
				 e != cudaSuccess ? cudaGetErrorString(e) : "no graph");
		goto fail;
	}
	size_t n = 0;
	if ((e = cudaGraphGetNodes(g, NULL, &n)) != cudaSuccess) {
		snprintf(why, len, "cudaGraphGetNodes: %s", cudaGetErrorString(e));
		goto fail;
	}
	if ((e = cudaGraphInstantiate(&x, g, 0)) != cudaSuccess) {
		snprintf(why, len, "recorded %zu calls, but cudaGraphInstantiate refused them: %s",
			 n, cudaGetErrorString(e));
		x = NULL;
		goto fail;
	}
	hpu__cuda_graph *cg = hpu__cuda_graph_make(g, x, n, why, len);
	if (!cg)
		goto fail;
	*graph = cg;
	return 0;
fail:
	if (x)
		cudaGraphExecDestroy(x);
	if (g)
		cudaGraphDestroy(g);
	(void)cudaGetLastError();
	stream_recover();
#ifdef HPU_CUDA_HAVE_OPS
	hpu__cuda_ops_graph_drop(); /* no graph: cap_begin's hold goes */
#endif
	return 1;
}

/* One replay on the compute stream; nothing waits (the readback after
 * the step does). */
static int cap_launch(void *graph, char *err, size_t len)
{
	hpu__cuda_graph *cg = graph;
	if (!cg) {
		snprintf(err, len, "--graphs: no graph to launch");
		return -1;
	}
	hpu__cuda_bind();
	cudaError_t e = cudaGraphLaunch(hpu__cuda_graph_exec(cg), C.compute.s);
	if (e != cudaSuccess) {
		snprintf(err, len, "--graphs: cudaGraphLaunch on GPU %d: %s", C.dev,
			 cudaGetErrorString(e));
		(void)cudaGetLastError();
		return -1;
	}
	return 0;
}

/* The graph's nodes (kernels, copies, fills), counted at its end. */
static size_t cap_nodes(const void *graph)
{
	return hpu__cuda_graph_nodes(graph);
}

/* The nodes by name, read at the graph's end. */
static size_t cap_names(const void *graph, const hpu__dev_node_count **out)
{
	return hpu__cuda_graph_names(graph, out);
}

/* (an executable graph still running is freed by CUDA once it ends) */
static void cap_free(void *graph)
{
	if (!graph)
		return;
	hpu__cuda_bind();
	hpu__cuda_graph_free(graph);
#ifdef HPU_CUDA_HAVE_OPS
	hpu__cuda_ops_graph_drop(); /* the hold cap_begin took for it */
#endif
}

/* hpu__dev_graph_rebind (cuda_graph.c). */
static int cap_rebind(void *graph, const void *from, const void *to, size_t bytes, char *err,
		      size_t len)
{
	hpu__cuda_bind();
	return hpu__cuda_graph_rebind(graph, from, to, bytes, C.dev, err, len);
}

/* 1 while this recording holds a refusal (a call refused, a CUDA error):
 * the ops' refusal of the same call then leaves it, the more precise,
 * for end (device.h's hpu__dev_ops_hooks). */
static int cap_refused(void)
{
	return R.on && capture_refusal()[0] != 0;
}

static const hpu__dev_recorder recorder = {
    .begin = cap_begin,
    .end = cap_end,
    .launch = cap_launch,
    .nodes = cap_nodes,
    .free = cap_free,
    .names = cap_names,
    .refused = cap_refused,
    .rebind = cap_rebind,
};

/* ---- the tables and the entries ---- */

#define CUDA_MEMBERS                                                                               \
	.name = "cuda", .enter = cuda_enter, .teardown = cuda_teardown, .caps = cuda_caps, .copy = cuda_copy,           \
	.fill = cuda_fill, .record = cuda_record, .wait = cuda_wait,                               \
	.host_alloc = cuda_host_alloc, .host_free = cuda_host_free, .ops = cuda_ops,               \
	.rt = &rtops, .owns = cuda_owns, .backing = &backing, .queue_new = cuda_queue_new,         \
	.queue_free = cuda_queue_free, .configure = cuda_configure, .coll = &hpu__cuda_coll,  \
	.recorder = &recorder, .copy_queued = cuda_copy_queued

static const hpu__device dev_full = {.setup = cuda_setup, CUDA_MEMBERS};
static const hpu__device dev_core = {.setup = setup_core, CUDA_MEMBERS};

static int visible(char *err, size_t errlen)
{
	int count = 0;
	cudaError_t e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess) {
		/* CUDA's words for no driver at all are "driver version is
		 * insufficient": they sent users to upgrade one */
		void *drv = e == cudaErrorInsufficientDriver ? dlopen("libcuda.so.1", RTLD_LAZY) : NULL;
		if (e == cudaErrorInsufficientDriver && !drv)
			snprintf(err, errlen, "no NVIDIA driver: libcuda.so.1 cannot be loaded");
		else
			snprintf(err, errlen, "%s", cudaGetErrorString(e));
		if (drv)
			dlclose(drv);
		cudaGetLastError();
		return 0;
	}
	if (count <= 0)
		snprintf(err, errlen, "cudaGetDeviceCount found none");
	return count;
}

/* The device (worker/device/device.h's HPU__CUDA_ENTRY). */
__attribute__((visibility("default"))) const hpu__device *
hpu_cuda_device_v1(int *ngpus, char *err, size_t errlen)
{
	*ngpus = visible(err, errlen);
	return &dev_full;
}

/* The device without its kernel table, whose setup needs none: for
 * tests of memory, copies, events and the runtime ops
 * (tests/unit/test_cuda_device.c). */
__attribute__((visibility("default"))) const hpu__device *
hpu_cuda_device_core_v1(int *ngpus, char *err, size_t errlen)
{
	*ngpus = visible(err, errlen);
	return &dev_core;
}
