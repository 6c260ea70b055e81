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

#include <stddef.h>

#include "worker/ops/backend.h"

/* The CUDA kernels' table; the stream they run on is the device's
 * current compute stream (hpu__cuda_ops_set_stream). Never NULL: each
 * GPU's handles (cuBLASLt, cuDNN) and workspace are made on its first
 * call there. Every pointer the table is given is device memory, except
 * softmax_xent's *loss (host). */
const hpu__backend *hpu__cuda_backend(void);

/* The stream every kernel of the table is queued on (a cudaStream_t; the
 * device calls this at its setup and whenever its compute stream
 * changes). 0, the legacy default stream, until then. Change it only
 * while the previous stream has no table work pending: the kernels'
 * scratch and workspace are reused in stream order. Functions that
 * return a value to the host (softmax_xent's loss) wait for this stream. */
void hpu__cuda_ops_set_stream(void *cuda_stream);

/* Recording (a CUDA graph's capture of the stream, on this thread): while
 * on, a CUDA, cuBLASLt or cuDNN call that fails inside an op (a wait or a
 * read back to the host, an allocation, which a capture refuses) does not
 * end the process as it does otherwise: the op returns
 * HPU_BE_UNSUPPORTED, and the first such call's sentence ("WHAT: <CUDA's
 * error>") is kept, "" when none; turning it on clears the sentence. The
 * recording is then to be abandoned (cudaStreamEndCapture, then
 * cudaGetLastError() to clear the refused call's error, which the next
 * kernel launch would report otherwise) and the work run eagerly: nothing
 * the failed op should have written can be trusted. Errors outside
 * CUDA's calls (no host memory) stay fatal. The ops (worker/ops) never
 * take this table's HPU_BE_UNSUPPORTED as "run the C loops" (which over
 * device memory would fault): while recording the op does nothing more,
 * the recording refused (this sentence kept, else the op's); outside a
 * recording the worker ends naming the op (backend.h, hpu__be_refused). */
void hpu__cuda_ops_recording(int on);
const char *hpu__cuda_ops_recording_error(void);
/* While this thread records: keeps "WHAT: WHY" as the recording's
 * refusal (unless one is kept already) and returns -1, so that the
 * caller skips a call the capture cannot hold (a wait, a copy to the
 * host) before making it; 0 when not recording. */
int hpu__cuda_ops_refuse(const char *what, const char *why);

/* A CUDA graph keeps the address of the kernels' scratch its ops were
 * given, which a later eager call may outgrow: hpu__cuda_ops_graph_hold()
 * when a recording begins (the graph made of it keeps the hold),
 * hpu__cuda_ops_graph_drop() when the recording fails or its graph is
 * freed. While any hold remains, a scratch buffer a recording was given
 * is not freed when the scratch grows but kept (outside --device-memory,
 * as the scratch is) until the last hold goes, or the release; the last
 * drop waits for the table's stream (a graph freed may still run) and
 * frees them. Never while this thread records. */
void hpu__cuda_ops_graph_hold(void);
void hpu__cuda_ops_graph_drop(void);

/* Waits for the stream, then frees every GPU's handles, workspace,
 * scratch (with the old buffers kept for graphs) and cached plans (the
 * device's close); the table makes them again on its next call. Not while
 * other threads call the table; graphs left then are not to be launched. */
void hpu__cuda_ops_release(void);

/* 1: fp32 products may run on TF32 tensor cores (cuBLASLt's
 * CUBLAS_COMPUTE_32F_FAST_TF32, cuDNN's default math), as PyTorch's
 * allow_tf32; 0 (the default): fp32 products are fp32 (CUBLAS_COMPUTE_32F,
 * CUDNN_FMA_MATH). */
void hpu__cuda_ops_allow_tf32(int allow);

/* The bytes of cuBLASLt's and cuDNN's workspace each GPU's context holds
 * (cudaMalloc'd beside devmem's blocks, outside --device-memory, as its
 * scratch is: the largest bf16 product's or convolution's operands
 * widened to fp32). */
size_t hpu__cuda_ops_workspace_bytes(void);

#endif
