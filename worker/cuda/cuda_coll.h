/* cuda_coll: the CUDA device's collectives between the ranks of one node
 * (worker/device/device.h's hpu__dev_coll) over CUDA IPC, and the kernel
 * that reduces the ranks' staging buffers (cuda_coll_k.cu); or, with
 * --collectives nccl, between any ranks over NCCL (cuda_nccl.c). Internal
 * to worker/cuda. */
#ifndef HPU_CUDA_COLL_H
#define HPU_CUDA_COLL_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "worker/device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ranks a group may have. */
#define HPU_CUDA_GROUP_MAX 16

/* in[r]: rank r's values of the slice reduced, as mapped here. */
typedef struct hpu__cuda_slice {
	const void *in[HPU_CUDA_GROUP_MAX];
} hpu__cuda_slice;

/* out[n] = in[0][i] + in[1][i] + ... + in[world-1][i], added in rank order
 * (cuda_elem.h's E_ADD): fp32, or bf16 (dt HPU__DEV_BF16) widened, each
 * partial sum rounded to bf16 as libhpucoll's reduce.c does. out may be
 * one of in (the same element is read before it is written). Every
 * pointer 16-byte aligned. */
cudaError_t hpu__cuda_k_group_sum(cudaStream_t s, hpu__dev_dtype dt, const hpu__cuda_slice *in,
				  int world, void *out, size_t n);

/* The table (cuda_coll.c), in the device's (cuda_device.c). */
extern const hpu__dev_coll hpu__cuda_coll;

/* NCCL (cuda_nccl.c): a group of `world` ranks over libnccl.so.2. */
typedef struct hpu__cuda_nccl hpu__cuda_nccl;

/* Opens libnccl.so.2 once: 0, or -1 with why (not installed, too old,
 * or this module built without nccl.h). */
int hpu__cuda_nccl_load(char *why, size_t whylen);

/* "NCCL 2.28.9" once loaded into buf (len bytes), else "". */
const char *hpu__cuda_nccl_version(char *buf, size_t len);

/* hpu__dev_coll's open over NCCL (this rank on CUDA device dev, the
 * calling thread bound to it): 0 and *out; -2 with why where a rank
 * has no NCCL or two ranks share a GPU (every rank the same answer); -1
 * where xchg failed. A failing ncclCommInitRank ends the worker. */
int hpu__cuda_nccl_open(hpu__cuda_nccl **out, int rank, int world, int dev,
			hpu__dev_xchg_fn *xchg, void *arg, char *why, size_t whylen);

/* recv[count] = the sum of every rank's send[count], on stream s (NCCL's
 * order). 0, or -1 with NCCL's error in *why (the caller refuses a
 * recording with it, or ends the worker). */
int hpu__cuda_nccl_all_reduce(hpu__cuda_nccl *n, const char **why, const void *send, void *recv,
			      size_t count,
			      hpu__dev_dtype dt, cudaStream_t s);

/* After stream s's work; NULL is fine. */
void hpu__cuda_nccl_close(hpu__cuda_nccl *n, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
