/* cuops_core: the base of the CUDA kernel table (cuops.h): each GPU's
 * context (handles, workspace, scratch), the stream, the tf32 switch, the
 * error helpers and the readback of one value (the slot). Calls no other
 * file of the table; cuops_gemm.c, cuops_conv.c and the table (cuops.c)
 * stand on it. A failing CUDA call ends the worker with a line naming it
 * (hpu__cuops_fatal): backend.h's only refusal, HPU_BE_UNSUPPORTED, would
 * send the ops to their C loops over device memory. While a thread
 * records (hpu__cuda_ops_recording), it is the op's refusal instead. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "worker/cuda/cuda_ops.h"
#include "worker/cuda/ops/cuops.h"

#define MAX_GPUS HPU_CUOPS_MAX_GPUS

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static hpu__cuops_ctx *ctxs[MAX_GPUS];
static void *volatile cur_stream;
static volatile int tf32_allowed;

void hpu__cuda_ops_set_stream(void *cuda_stream)
{
	cur_stream = cuda_stream;
}

void hpu__cuda_ops_allow_tf32(int allow)
{
	tf32_allowed = allow != 0;
}

size_t hpu__cuda_ops_workspace_bytes(void)
{
	return HPU_CUOPS_WORKSPACE;
}

cudaStream_t hpu__cuops_stream(void)
{
	return (cudaStream_t)cur_stream;
}

int hpu__cuops_tf32(void)
{
	return tf32_allowed;
}

/* The ops cannot fail (a table function's refusal would send them to C
 * loops over device memory): a CUDA error ends the worker with one line
 * on stderr, which the launcher reports with the worker's rank. */
void hpu__cuops_fatal(const char *fmt, ...)
{
	char line[512];
	int n = snprintf(line, sizeof line, "hpu-worker: cuda ops: ");
	va_list ap;
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof line)
		n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t)n >= sizeof line - 1)
		n = (int)sizeof line - 2;
	line[n++] = '\n';
	if (write(2, line, (size_t)n) < 0)
		_exit(1);
	_exit(1);
}

/* Recording on this thread (hpu__cuda_ops_recording), and the first
 * failed call's sentence while it is. */
static __thread int recording;
static __thread char recording_error[256];

void hpu__cuda_ops_recording(int on)
{
	recording = on != 0;
	if (recording)
		recording_error[0] = 0;
}

const char *hpu__cuda_ops_recording_error(void)
{
	return recording_error;
}

int hpu__cuops_refused(void)
{
	return recording && recording_error[0];
}

/* A failed call: while recording, kept (the first) and -1; else fatal. */
static int failed(const char *what, const char *why)
{
	if (!recording)
		hpu__cuops_fatal("%s: %s", what, why);
	if (!recording_error[0])
		snprintf(recording_error, sizeof recording_error, "%s: %s", what, why);
	return -1;
}

int hpu__cuda_ops_refuse(const char *what, const char *why)
{
	if (!recording)
		return 0;
	if (!recording_error[0])
		snprintf(recording_error, sizeof recording_error, "%s: %s", what, why);
	return -1;
}

/* What a recording refuses before the call that would end it: a wait on
 * the host (CUDA's capture would be invalidated, the stream left in
 * error). */
#define NO_WAIT "waits for the GPU on the host, which a recorded step cannot hold"


int hpu__cuops_cuda(cudaError_t e, const char *what)
{
	return e == cudaSuccess ? 0 : failed(what, cudaGetErrorString(e));
}

int hpu__cuops_blas(cublasStatus_t e, const char *what)
{
	if (e == CUBLAS_STATUS_SUCCESS)
		return 0;
	char why[40];
	snprintf(why, sizeof why, "cuBLASLt status %d", (int)e);
	return failed(what, why);
}

int hpu__cuops_dnn(cudnnStatus_t e, const char *what)
{
	return e == CUDNN_STATUS_SUCCESS ? 0 : failed(what, cudnnGetErrorString(e));
}

/* ---- contexts ---- */

static hpu__cuops_ctx *ctx_new(int dev)
{
	hpu__cuops_ctx *c = calloc(1, sizeof *c);
	if (!c)
		hpu__cuops_fatal("out of memory for GPU %d's context", dev);
	c->dev = dev;
	pthread_mutex_init(&c->mu, NULL);
	if (hpu__cuops_cuda(cudaDeviceGetAttribute(&c->cc_major,
						   cudaDevAttrComputeCapabilityMajor, dev),
			    "compute capability") ||
	    hpu__cuops_cuda(cudaDeviceGetAttribute(&c->cc_minor,
						   cudaDevAttrComputeCapabilityMinor, dev),
			    "compute capability"))
		goto fail;
	if (hpu__cuops_blas(cublasLtCreate(&c->lt), "cublasLtCreate"))
		goto fail;
	if (hpu__cuops_dnn(cudnnCreate(&c->dnn), "cudnnCreate"))
		goto fail;
	if (hpu__cuops_cuda(cudaMalloc(&c->ws, HPU_CUOPS_WORKSPACE), "workspace"))
		goto fail;
	return c;
fail:
	if (c->dnn)
		cudnnDestroy(c->dnn);
	if (c->lt)
		cublasLtDestroy(c->lt);
	pthread_mutex_destroy(&c->mu);
	free(c);
	return NULL;
}

void hpu__cuops_ctx_destroy(hpu__cuops_ctx *c)
{
	if (c->scratch)
		cudaFree(c->scratch);
	cudaFree(c->ws);
	cudnnDestroy(c->dnn);
	cublasLtDestroy(c->lt);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

int hpu__cuops_ctx_take(hpu__cuops_ctx **out, int max)
{
	int n = 0;
	pthread_mutex_lock(&ctx_mu);
	for (int i = 0; i < MAX_GPUS && n < max; i++)
		if (ctxs[i]) {
			out[n++] = ctxs[i];
			ctxs[i] = NULL;
		}
	pthread_mutex_unlock(&ctx_mu);
	return n;
}

hpu__cuops_ctx *hpu__cuops_enter(void)
{
	int dev;
	if (hpu__cuops_cuda(cudaGetDevice(&dev), "cudaGetDevice"))
		return NULL;
	if (dev < 0 || dev >= MAX_GPUS) {
		hpu__cuops_fatal("GPU %d: at most %d GPUs per process", dev, MAX_GPUS);
		return NULL;
	}
	pthread_mutex_lock(&ctx_mu);
	if (!ctxs[dev] && recording) { /* handles and workspace: allocations, waits */
		pthread_mutex_unlock(&ctx_mu);
		hpu__cuda_ops_refuse("the CUDA kernels' first call on this GPU",
				     "it makes their handles and workspace, which a recording cannot "
				     "hold (run a step eagerly first)");
		return NULL;
	}
	if (!ctxs[dev])
		ctxs[dev] = ctx_new(dev);
	hpu__cuops_ctx *c = ctxs[dev];
	pthread_mutex_unlock(&ctx_mu);
	if (!c)
		return NULL;
	pthread_mutex_lock(&c->mu);
	if (hpu__cuops_dnn(cudnnSetStream(c->dnn, hpu__cuops_stream()), "cudnnSetStream")) {
		pthread_mutex_unlock(&c->mu);
		return NULL;
	}
	return c;
}

void hpu__cuops_leave(hpu__cuops_ctx *c)
{
	pthread_mutex_unlock(&c->mu);
}

/* ---- scratch, and the graphs that hold its address ----
 *
 * A recorded graph keeps the address of the scratch its ops were given
 * (the scratch cannot grow while recording, so that is the buffer of the
 * time). When an eager call later needs more, the buffer a recording was
 * given (c->scratch_recorded) is not freed while any hold remains (a
 * recording under way or a graph made of one: hpu__cuda_ops_graph_hold)
 * but kept on `retired`, to be freed when the last hold goes or at the
 * release. What is held then, beyond the current scratch, is the buffers
 * graphs were given and later outgrown: each smaller than the one after
 * it, all of it outside --device-memory as the scratch is. */

typedef struct retired_buf {
	int dev;
	void *p;
} retired_buf;

/* Under held_mu (taken inside a context's mu, never around it). */
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static long graphs_held;
static retired_buf *retired;
static size_t nretired, retired_cap;

/* Keeps c's scratch for the graphs that may hold it; 1 when kept, 0 when
 * no hold remains (the caller frees it). */
static int retire(hpu__cuops_ctx *c)
{
	int kept = 0;
	pthread_mutex_lock(&held_mu);
	if (graphs_held > 0 && c->scratch_recorded) {
		if (nretired == retired_cap) {
			size_t cap = retired_cap ? retired_cap * 2 : 8;
			retired_buf *m = realloc(retired, cap * sizeof *m);
			if (!m)
				hpu__cuops_fatal("out of host memory to keep GPU %d's old scratch "
						 "for its graphs",
						 c->dev);
			retired = m;
			retired_cap = cap;
		}
		retired[nretired++] = (retired_buf){c->dev, c->scratch};
		kept = 1;
	}
	pthread_mutex_unlock(&held_mu);
	return kept;
}

/* Takes the kept buffers off the list; under held_mu. */
static retired_buf *take_retired(size_t *n)
{
	retired_buf *all = retired;
	*n = nretired;
	retired = NULL;
	nretired = retired_cap = 0;
	return all;
}

/* Frees all[n], taken off the list, once the table's stream is done with
 * them (a graph freed may still be running on it). Not while recording. */
static void free_retired(retired_buf *all, size_t n)
{
	int dev = -1;
	if (n)
		cudaGetDevice(&dev);
	for (size_t i = 0; i < n; i++) {
		cudaSetDevice(all[i].dev);
		cudaStreamSynchronize(hpu__cuops_stream());
		cudaFree(all[i].p);
	}
	if (dev >= 0) {
		cudaSetDevice(dev);
		(void)cudaGetLastError();
	}
	free(all);
}

void hpu__cuda_ops_graph_hold(void)
{
	pthread_mutex_lock(&held_mu);
	graphs_held++;
	pthread_mutex_unlock(&held_mu);
}

void hpu__cuda_ops_graph_drop(void)
{
	retired_buf *all = NULL;
	size_t n = 0;
	pthread_mutex_lock(&held_mu);
	/* taken with the last hold: a buffer kept for a graph recorded after
	 * it stays on the list */
	if (graphs_held > 0 && --graphs_held == 0)
		all = take_retired(&n);
	pthread_mutex_unlock(&held_mu);
	free_retired(all, n);
}

void hpu__cuops_retired_free(void)
{
	size_t n;
	pthread_mutex_lock(&held_mu);
	retired_buf *all = take_retired(&n);
	pthread_mutex_unlock(&held_mu);
	free_retired(all, n);
}

void *hpu__cuops_scratch(hpu__cuops_ctx *c, size_t bytes)
{
	if (bytes <= c->scratch_size) {
		if (recording) /* its address goes into the graph */
			c->scratch_recorded = 1;
		return c->scratch;
	}
	char why[160];
	snprintf(why, sizeof why,
		 "it must grow to %zu bytes, which frees and allocates and " NO_WAIT
		 " (run a step eagerly first)",
		 bytes);
	if (hpu__cuda_ops_refuse("the kernels' scratch", why))
		return NULL;
	/* calls queued before may still read the old buffer: it is freed
	 * once the stream is done with them; graphs that hold it keep it */
	if (c->scratch && !retire(c)) { /* (a refused wait, recording: the old buffer kept) */
		if (hpu__cuops_cuda(cudaStreamSynchronize(hpu__cuops_stream()), "scratch"))
			return NULL;
		cudaFree(c->scratch);
	}
	c->scratch = NULL;
	c->scratch_size = 0;
	c->scratch_recorded = 0;
	size_t want = bytes + bytes / 4;
	if (hpu__cuops_cuda(cudaMalloc(&c->scratch, want), "scratch"))
		return NULL;
	c->scratch_size = want;
	return c->scratch;
}


/* ---- one value back on the host ---- */

/* The copy into host memory and the wait: every readback's end. */
static int read_back(void *out, const void *p, size_t bytes, cudaStream_t st, const char *what)
{
	if (hpu__cuda_ops_refuse(what, "its result comes back to the host, which " NO_WAIT))
		return HPU_BE_UNSUPPORTED;
	if (hpu__cuops_cuda(cudaMemcpyAsync(out, p, bytes, cudaMemcpyDeviceToHost, st), what) ||
	    hpu__cuops_cuda(cudaStreamSynchronize(st), what))
		return HPU_BE_UNSUPPORTED;
	return HPU_BE_OK;
}

int hpu__cuops_slot_begin(hpu__cuops_slot *s, size_t bytes, int fill, size_t extra,
			  const char *what)
{
	size_t at = (bytes + 15) & ~(size_t)15; /* where the extra bytes begin */
	s->c = hpu__cuops_enter();
	if (!s->c)
		return HPU_BE_UNSUPPORTED;
	s->st = hpu__cuops_stream();
	s->bytes = bytes;
	s->d = at >= bytes && extra <= SIZE_MAX - at ? hpu__cuops_scratch(s->c, at + extra) : NULL;
	s->more = s->d ? (char *)s->d + at : NULL;
	if (s->d && (fill < 0 || !hpu__cuops_cuda(cudaMemsetAsync(s->d, fill, bytes, s->st), what)))
		return HPU_BE_OK;
	hpu__cuops_leave(s->c);
	return HPU_BE_UNSUPPORTED;
}

int hpu__cuops_slot_end(hpu__cuops_slot *s, cudaError_t launched, void *out, const char *what)
{
	int rc = HPU_BE_UNSUPPORTED;
	if (!hpu__cuops_cuda(launched, what))
		rc = read_back(out, s->d, s->bytes, s->st, what);
	hpu__cuops_leave(s->c);
	return rc;
}

int hpu__cuops_fetch(void *out, const void *p, size_t bytes, const char *what)
{
	hpu__cuops_ctx *c = hpu__cuops_enter();
	if (!c)
		return HPU_BE_UNSUPPORTED;
	int rc = read_back(out, p, bytes, hpu__cuops_stream(), what);
	hpu__cuops_leave(c);
	return rc;
}
