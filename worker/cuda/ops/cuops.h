/* cuops: what the CUDA kernel table's files share (worker/cuda/ops/).
 *
 * One context per GPU (the current device when a function is called):
 * the cuBLASLt and cuDNN handles, one workspace for both, a scratch
 * buffer for conversions and partial sums, and the caches of matmul and
 * convolution plans per shape. A table function takes its context with
 * hpu__cuops_enter (which locks it: the table may be called from any
 * thread) and gives it back with hpu__cuops_leave. Everything is queued
 * on the stream of hpu__cuda_ops_set_stream; the scratch and workspace
 * are reused by later calls on that same stream, in stream order. */
#ifndef HPU_CUOPS_H
#define HPU_CUOPS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "worker/cuda/cuda_device.h"
#include "worker/ops/backend.h"

#define HPU_CUOPS_WORKSPACE (32u << 20) /* cuBLASLt's advice for Hopper */
#define HPU_CUOPS_GEMM_CACHE 64
#define HPU_CUOPS_CONV_CACHE 32

/* A planned cuBLASLt product: its descriptors and algorithm, for the key. */
typedef struct hpu__cuops_gemm_plan {
	int used;
	uint64_t stamp;  /* last use, for eviction */
	int64_t key[16]; /* hpu__cuops_gemm_key */
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, lc;
	cublasLtMatmulAlgo_t algo;
} hpu__cuops_gemm_plan;

/* A planned cuDNN convolution of one shape, data type and math. */
typedef struct hpu__cuops_conv_plan {
	int used;
	uint64_t stamp;
	hpu_conv2d_shape s;
	int tf32; /* the math it was planned with (1: tensor ops allowed) */
	cudnnTensorDescriptor_t x, y, bias;
	cudnnFilterDescriptor_t w;
	/* one per direction (forward, backward data, backward filter), each
	 * with the math its algorithm was chosen for */
	cudnnConvolutionDescriptor_t conv[3];
	cudnnConvolutionFwdAlgo_t fwd;
	cudnnConvolutionBwdDataAlgo_t bwd_data;
	cudnnConvolutionBwdFilterAlgo_t bwd_filter;
	size_t ws_fwd, ws_data, ws_filter;
} hpu__cuops_conv_plan;

typedef struct hpu__cuops_ctx {
	int dev;
	int cc_major, cc_minor;
	pthread_mutex_t mu;
	cublasLtHandle_t lt;
	cudnnHandle_t dnn;
	void *ws; /* HPU_CUOPS_WORKSPACE bytes */
	void *scratch;
	size_t scratch_size;
	int scratch_recorded; /* a recording was given this scratch (cuops_core.c) */
	uint64_t clock; /* plan stamps */
	/* the last new GEMM plan's heuristic: its cublasStatus_t, or -1
	 * where the plan failed before asking it (the reason said then) */
	int gemm_heuristic;
	hpu__cuops_gemm_plan gemm[HPU_CUOPS_GEMM_CACHE];
	hpu__cuops_conv_plan conv[HPU_CUOPS_CONV_CACHE];
} hpu__cuops_ctx;

/* The current GPU's context, locked (made on first use; a failure there
 * is fatal). */
hpu__cuops_ctx *hpu__cuops_enter(void);
/* Contexts are made by hpu__cuops_enter, one per GPU; at most this many. */
#define HPU_CUOPS_MAX_GPUS 64
/* Detaches every context (at most max) into out; frees one whose plans
 * are freed (the release, cuops.c). */
int hpu__cuops_ctx_take(hpu__cuops_ctx **out, int max);
void hpu__cuops_ctx_destroy(hpu__cuops_ctx *c);
void hpu__cuops_leave(hpu__cuops_ctx *c);

/* The stream of hpu__cuda_ops_set_stream, and whether TF32 is allowed. */
cudaStream_t hpu__cuops_stream(void);
int hpu__cuops_tf32(void);

/* At least `bytes` of device scratch (grown as needed; the old buffer is
 * freed once the stream is done with it, or, where a recording was given
 * it and a graph may hold it, once no graph does:
 * hpu__cuda_ops_graph_hold); out of memory is fatal. */
void *hpu__cuops_scratch(hpu__cuops_ctx *c, size_t bytes);
/* Frees the old scratch buffers kept for graphs (the release's, with
 * every context's own). */
void hpu__cuops_retired_free(void);

/* Writes "hpu-worker: cuda ops: <message>" to stderr and ends the
 * process (exit status 1). */
void hpu__cuops_fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* 1 while this thread records and a call failed (hpu__cuops_cuda): what
 * would be fatal otherwise (no algorithm for a shape) is then the op's
 * refusal. */
int hpu__cuops_refused(void);

/* 0 when e is success; else hpu__cuops_fatal("WHAT: <error>"), or,
 * while this thread records (hpu__cuda_ops_recording), -1 with the
 * sentence kept for hpu__cuda_ops_recording_error(). */
int hpu__cuops_cuda(cudaError_t e, const char *what);
int hpu__cuops_blas(cublasStatus_t e, const char *what);
int hpu__cuops_dnn(cudnnStatus_t e, const char *what);

/* Dropout's refusal while recording, where its keys are the host's
 * (dropout_fwd's seed and stream, dropout_rows' keys in host memory):
 * kernel arguments a replay would repeat. Keys the device made
 * (dropout_keys) record. */
#define HPU_CUOPS_DROPOUT_WHY                                                          \
	"dropout draws its keys on the host each step: a replay would repeat the "     \
	"recorded step's mask"

/* A pass whose result is one value in device scratch (a count, an
 * amax, a loss, the first bad index), read back on the host:
 * hpu__cuops_slot_begin takes the current GPU's context and its slot
 * (`bytes` of scratch, each byte set to `fill` on the stream unless fill
 * is negative, then `extra` bytes more for the kernels at s->more, 16-byte
 * aligned); the caller queues its kernels on s->st; hpu__cuops_slot_end
 * checks their launch's result, copies the slot into out, waits for the
 * stream and gives the context back. Both return HPU_BE_OK or
 * HPU_BE_UNSUPPORTED; begin holds nothing when it fails (a CUDA error is
 * fatal, hpu__cuops_fatal, except while recording). */
typedef struct hpu__cuops_slot {
	hpu__cuops_ctx *c;
	cudaStream_t st;
	void *d;    /* the slot, device scratch */
	void *more; /* the extra bytes after it */
	size_t bytes;
} hpu__cuops_slot;
int hpu__cuops_slot_begin(hpu__cuops_slot *s, size_t bytes, int fill, size_t extra,
			  const char *what);
int hpu__cuops_slot_end(hpu__cuops_slot *s, cudaError_t launched, void *out, const char *what);
/* `bytes` at device address p (not scratch) into host memory out, queued
 * on the stream after the work before it; waits. */
int hpu__cuops_fetch(void *out, const void *p, size_t bytes, const char *what);

/* Runs `launch` (a kernel launcher's result) inside the current GPU's
 * context, so that calls from several threads stay ordered. */
#define CU_KERNEL(what, call)                                                          \
	do {                                                                           \
		hpu__cuops_ctx *c_ = hpu__cuops_enter();                               \
		if (!c_)                                                               \
			return HPU_BE_UNSUPPORTED;                                     \
		cudaStream_t st = hpu__cuops_stream();                                 \
		int rc_ = hpu__cuops_cuda((call), what) ? HPU_BE_UNSUPPORTED : HPU_BE_OK; \
		hpu__cuops_leave(c_);                                                  \
		return rc_;                                                            \
	} while (0)

/* The table's entries, by file. */
int hpu__cuops_gemm(const hpu__gemm *g);          /* cuops_gemm.c */
int hpu__cuops_gemm_fp8(int m, int n, int k, const uint8_t *a, int fa, const uint8_t *b, int fb,
			const float *ia, const float *ib, const float *bias, float *c,
			int accumulate);
const char *hpu__cuops_blas_version(void);
void hpu__cuops_gemm_free(hpu__cuops_ctx *c);

int hpu__cuops_conv_fwd(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
			const void *w, const float *b, float *y); /* cuops_conv.c */
int hpu__cuops_conv_bwd_data(const hpu_conv2d_shape *s, hpu__dtype dt, const void *w,
			     const void *dy, float *dx);
int hpu__cuops_conv_bwd_weights(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
				const void *dy, float *dw, float *db);
void hpu__cuops_conv_free(hpu__cuops_ctx *c);

/* cuops_layers.c: the layers' own passes (backend.h's xent_pos_fwd ..
 * batchnorm_bwd). */
int hpu__cuops_xent_pos_fwd(const float *logits, const int32_t *labels, float *lse, float *loss,
			    int rows, size_t positions, int classes, long *bad,
			    int32_t *bad_label);
int hpu__cuops_xent_pos_bwd(const float *logits, const int32_t *labels, const float *lse,
			    const float *dloss, float *dx, int rows, size_t positions,
			    int classes);
int hpu__cuops_accuracy_pos(const float *logits, const int32_t *labels, float *acc, int rows,
			    size_t positions, int classes, long *bad, int32_t *bad_label);
int hpu__cuops_heads(int merge, const float *src, float *dst, size_t ld, int batch, int heads,
		     int t, int hd, float mul);
int hpu__cuops_mask_scores(float *att, const int32_t *mask, int batch, int heads, int t,
			   int causal, int after);
int hpu__cuops_dropout_rows(const float *x, float *y, const uint64_t *keys, int keys_dev,
			    int rows, size_t n, uint32_t cut, float scale);
int hpu__cuops_dropout_keys(uint64_t *keys, const uint32_t *samples, const int64_t *step,
			    uint64_t seed, int layer, int rows);
int hpu__cuops_batchnorm_fwd(const float *x, float *y, const float *w, const float *bias,
			     float *run_mean, float *run_var, float *saved, int batch, int ch,
			     size_t spatial, float eps, float momentum, int train, int update);
int hpu__cuops_batchnorm_bwd(const float *x, const float *dy, const float *w, const float *saved,
			     float *dw, float *dbias, float *dx, int batch, int ch, size_t spatial);

#endif
