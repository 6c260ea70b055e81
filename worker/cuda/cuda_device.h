/* cuda_device: what the CUDA device's files share inside the module
 * hpudev_cuda.so (the kernels of worker/cuda/ops among them): the compute
 * stream every op runs on, and the one way a CUDA error ends the worker.
 * Internal to worker/cuda. */
#ifndef HPU_CUDA_DEVICE_H
#define HPU_CUDA_DEVICE_H

#include <cuda_runtime_api.h>
#include <stddef.h>

/* Makes the worker's GPU the calling thread's current device (CUDA's is
 * per thread), once per thread; every entry of the module calls it. */
void hpu__cuda_bind(void);

/* The compute stream of the device set up (NULL queue), the calling
 * thread bound to its GPU; 0 before setup. */
cudaStream_t hpu__cuda_stream(void);

/* The CUDA device index the worker drives; -1 before setup. */
int hpu__cuda_device_index(void);

/* A plain function's name out of C++'s mangling ("_ZL11k_loss_seedPfm...",
 * a static kernel: "k_loss_seed"); any other name as it is. */
void hpu__cuda_demangle(const char *mangled, char *out, size_t len);

/* An optional library (cuda_names.c): `named` where it is set and not
 * empty (the user's variable: that one or none), else the first of
 * tries[n] that dlopen opens (RTLD_NOW | RTLD_LOCAL); NULL with the first
 * failure's dlerror() in why. */
void *hpu__cuda_dlopen_first(const char *named, const char *const *tries, size_t n, char *why,
			     size_t len);

/* --collectives nccl, as configured (cuda_device.c): 1 where the group
 * runs NCCL (cuda_coll.c). */
int hpu__cuda_nccl_asked(void);

/* HPU_PROFILE_KERNELS=DIR (cuda_kprof.c): CUPTI's records of every
 * kernel, copy and memset timed from the device's setup (begin) to its
 * teardown (end), which writes DIR/kernels-rank<R>.txt. Nothing where the
 * variable is unset; one line on stderr where CUPTI cannot be had. */
void hpu__cuda_kprof_begin(int rank);
void hpu__cuda_kprof_end(void);

/* Where `e` is an error: prints one line naming the rank, `what` and
 * CUDA's text on stderr and exits with status 1 (a CUDA error leaves the
 * context unusable: the launcher reports the rank's failure). */
void hpu__cuda_check(cudaError_t e, const char *what);

/* 1 while this thread records the compute stream (the device's capture
 * table: --graphs); hpu__cuda_check then keeps its first error as the
 * recording's refusal instead of ending the worker. */
int hpu__cuda_capturing(void);

/* While this thread records: keeps "WHAT: WHY" as the recording's
 * refusal (the first one kept) and returns 1, so that the caller skips a
 * call the capture cannot hold before making it; 0 otherwise. */
int hpu__cuda_capture_refuse(const char *what, const char *why);

/* Where p points (cudaPointerGetAttributes): cudaMemoryTypeDevice,
 * cudaMemoryTypeManaged, cudaMemoryTypeHost (pinned: cudaHostAlloc's),
 * or cudaMemoryTypeUnregistered for NULL and memory CUDA does not know
 * (pageable host memory), whose error is forgotten (it is not sticky).
 * A query, no stream work, made in relaxed capture mode so that it ends
 * no capture of the thread's stream. The module's one test of where a
 * pointer lies: the device's copies, and the kernels' findings written
 * into device memory (findings_dev, worker/ops/backend.h). Inline: the
 * kernel table (worker/cuda/ops) is also built without the device's
 * files (test_cuda_ops), and the device without the table. */
static inline enum cudaMemoryType hpu__cuda_mem_type(const void *p)
{
	struct cudaPointerAttributes a;
	enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
	if (!p)
		return cudaMemoryTypeUnregistered;
	/* (a valid mode: the exchange cannot fail) */
	(void)cudaThreadExchangeStreamCaptureMode(&mode);
	cudaError_t e = cudaPointerGetAttributes(&a, p);
	(void)cudaThreadExchangeStreamCaptureMode(&mode);
	if (e != cudaSuccess) {
		(void)cudaGetLastError(); /* not sticky: forget it */
		return cudaMemoryTypeUnregistered;
	}
	return a.type;
}

/* 1 when p is device memory (managed memory counts), else 0. */
static inline int hpu__cuda_on_device(const void *p)
{
	enum cudaMemoryType t = hpu__cuda_mem_type(p);
	return t == cudaMemoryTypeDevice || t == cudaMemoryTypeManaged;
}

#endif
