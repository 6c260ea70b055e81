/* cuda_ops: the CUDA device's kernels (the hpu__backend table of
 * worker/ops/backend.h filled with cuBLASLt, cuDNN and kernels of our own).
 *
 * worker/cuda/ is one program module, hpudev_cuda.so, built where CMake
 * finds the CUDA toolkit and loaded by the worker (worker/device) for
 * --device cuda and auto. The device part (cuda_device*.c/.cu: memory,
 * streams, events, pinned host memory, the runtime ops) fills an
 * hpu__device; its `ops` member returns this table. Internal to the
 * module. */
#ifndef HPU_CUDA_OPS_H
#define HPU_CUDA_OPS_H

#include "worker/ops/backend.h"

/* The CUDA kernels' table; the stream they run on is the device's
 * current compute stream (cuda_device.h). NULL before the device's setup. */
const hpu__backend *hpu__cuda_backend(void);

#endif
