/* cuda_coll: the CUDA device's collectives between the ranks of one node
 * (worker/device/device.h's hpu__dev_coll) over CUDA IPC, and the kernel
 * that reduces the ranks' staging buffers (cuda_coll_k.cu). Internal to
 * worker/cuda. */
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

#ifdef __cplusplus
}
#endif

#endif
