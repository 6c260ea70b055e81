/* device: the device a worker computes on. One table per device, in the
 * style of the collectives' transports: memory (device memory through
 * devmem's accounting, so DeviceStats, the bytes per kind and
 * --device-memory hold on every device; pinned host memory), copies
 * host->device, device->host, device->device and memset issued on a
 * queue, queues and events, capabilities, and the ops: the kernel table
 * of worker/ops/backend.h (which stays where it is) and the runtime's own
 * ops (hpu__dev_rtops: casts, the optimizer's update, norms and checks).
 *
 * Device calls. Work the device does on its memory (a layer's forward or
 * backward, an optimizer update over a flat buffer, a cast, a copy) runs
 * between hpu__dev_enter() and hpu__dev_leave(); host code outside such a
 * bracket must not read or write device memory, only copy it with
 * hpu__dev_d2h / hpu__dev_h2d. On "cpu" the brackets cost nothing and the
 * host may read device memory (host_can_read); on "cpu-strict" device
 * memory is mapped without access outside the brackets, so a host access
 * faults at once and the worker exits naming the block
 * (device_strict.c).
 *
 * One device per process, chosen by hpu__dev_open before devmem is set
 * up; thread-safe once open. */
#ifndef HPU_DEVICE_H
#define HPU_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "worker/ops/backend.h"
#include "worker/hpu/devmem.h"

/* What a device can do. */
typedef struct hpu__dev_caps {
	int bf16_native, fp16_native, fp8_native; /* arithmetic in that type */
	int host_can_read;                        /* host code may touch device memory */
	int host_mem; /* its memory is the host's, closed only while a step is
		       * recorded (hpu__dev_cpu_rec: --device cpu --graphs):
		       * host code may touch it outside a recording, though
		       * host_can_read says 0 (the strategy's paths are those
		       * of a device the host may not read). 0 elsewhere,
		       * CUDA's included */
	int can_capture;                          /* a step can be captured and replayed */
	int ops_fill; /* the ops' kernel table zeroes device memory itself (its
		       * zero entry, a device call a recording keeps), so that
		       * the ops may take gradients owed zeros where the host
		       * may not touch the memory (hpu__dev_ops_fill): the CPU
		       * devices on their kernels-only table; 0 on CUDA, whose
		       * ops never take them */
	int gpu, gpus; /* the GPU this worker drives among the gpus visible to
			* it (0 and 0: not a GPU) */
	char gpu_id[32]; /* that GPU's PCI bus id (cudaDeviceGetPCIBusId),
			  * the same whatever each worker sees; "": not
			  * a GPU */
} hpu__dev_caps;

/* The optimizers the device's update knows (optim.c maps its kinds). */
typedef enum hpu__dev_optkind {
	HPU__DEV_SGD = 0,
	HPU__DEV_ADAM,  /* torch.optim.Adam: L2, g += wd*p */
	HPU__DEV_ADAMW, /* torch.optim.AdamW: decoupled, p *= 1 - lr*wd */
} hpu__dev_optkind;

/* A training step's own scalars, in device memory (one block per
 * strategy): what a step decides from its results (skip a step whose
 * gradients hold Inf or NaN, clip by the global norm, 16-mixed's loss
 * scale) is decided on the device from these, so that no value comes
 * back to the host inside a step and a recorded step (--graphs) replays
 * the decisions too. The host writes lr before a step (a copy from
 * pinned memory) and reads the block back after it; nothing else of it
 * is written by the host but at set-up and when a checkpoint resumes. */
typedef struct hpu__dev_stepvars {
	/* written by the host before each step, together: the learning
	 * rate, and beta1^t and beta2^t for the t this step's update would
	 * have (Adam's bias corrections, glibc's pow on the host, so that a
	 * GPU's update uses the CPU's values) */
	double lr, bp1, bp2;
	/* this step's: the checks and the norm add into bad and sumsq
	 * (step_end clears them); step_begin sets skip, norm and gscale */
	double sumsq;  /* sum of squares of the gradients (all ranks' once reduced) */
	double norm;   /* the global norm, unscaled (0 without clipping) */
	float bad;     /* > 0: some gradient held Inf or NaN (on some rank) */
	float gscale;  /* the update's gradient scale: 1/loss_scale x the clip factor */
	int skip;      /* 1: this step's update is skipped */
	/* kept across steps (and in checkpoints, through the host's copy) */
	long t;              /* updates done; step_begin counts this one */
	double loss_scale;   /* 16-mixed's (1 otherwise) */
	long step_no;        /* mixed precision's steps ended, skipped or not */
	long last_overflow;  /* DynamicLossScaler's: step_no of the last overflow */
	int hyst_left;       /* and the overflows it still forgives */
	long skipped;        /* mixed precision's steps skipped */
	/* the step being computed (hpu_ctx.step, counted from 0 over every
	 * step, skipped or not, and resumed): the host's, copied in from
	 * pinned memory where a recordable step's dropout makes its keys on
	 * the device (worker/ops/dropkeys.h); a replay copies the new step's */
	long step;
} hpu__dev_stepvars;

/* What step_begin and step_end apply (host memory, the same every step). */
typedef struct hpu__dev_stepcfg {
	double clip_norm;   /* > 0: clip by the global norm (hpu__clip_factor) */
	int mixed;          /* bf16-mixed or 16-mixed: step_end counts */
	int fp16;           /* 16-mixed: gradients carry loss_scale */
	int dynamic;        /* 16-mixed's dynamic scaler (--loss-scale 0) */
	int hysteresis;     /* DeepSpeed's DynamicLossScaler: overflows forgiven */
	long window;        /* loss_scale_window: steps without overflow to double */
	double min_scale;   /* min_loss_scale */
} hpu__dev_stepcfg;

/* One optimizer step's scalars: the gradients are gscale * g, `t` the
 * step counted from 1, `lr` the learning rate. With sv set (device
 * memory), lr, t and gscale are read from it on the device instead,
 * and the update does nothing where sv->skip is set. */
typedef struct hpu__dev_optim {
	hpu__dev_optkind kind;
	double momentum, weight_decay, beta1, beta2, eps;
	int nesterov;
	long t;
	double lr;
	float gscale;
	const hpu__dev_stepvars *sv;
} hpu__dev_optim;

/* The runtime's own ops: what the runtime does to device memory itself,
 * outside the layers (mixed precision's casts, the optimizer's update,
 * the gradient norm, the non-finite checks, adding gradients). Separate
 * from hpu__backend: those kernels are chosen by HPU_BACKEND and may
 * answer HPU_BE_UNSUPPORTED to fall back on the reference ones, while
 * these are the same on every backend, have no fallback, and each one is
 * a device call of its own (the hpu__dev_* wrappers below enter the
 * device). Every buffer is device memory unless said otherwise; `fp16`
 * picks IEEE binary16 over bf16 (common/lowp.h's rounding). */
typedef struct hpu__dev_rtops {
	/* dst[n] = the 16-bit rounding of src[n]; src[n] widened */
	void (*to16)(int fp16, uint16_t *dst, const float *src, size_t n);
	void (*from16)(int fp16, float *dst, const uint16_t *src, size_t n);
	/* dst[n] = the 16-bit rounding of dst + src (fp32 sum) */
	void (*acc16)(int fp16, uint16_t *dst, const float *src, size_t n);
	/* dst[n] = the top halves of x[n]; 1 when x[n] were all bf16 values */
	int (*bf16_exact)(uint16_t *dst, const float *x, size_t n);
	void (*bf16_expand)(float *dst, const uint16_t *src, size_t n);
	/* dst[n] += src[n]; dst[n] += v */
	void (*add)(float *dst, const float *src, size_t n);
	void (*add_scalar)(float *dst, float v, size_t n);
	/* Sum of squares of g[n] (fp32 in blocks of 256, the blocks in
	 * double). sumsq16: acc plus, chunk by chunk of `chunk` values
	 * widened into scratch (device memory), each chunk's sum. */
	double (*sumsq)(const float *g, size_t n);
	double (*sumsq16)(double acc, int fp16, const uint16_t *g, size_t n, float *scratch,
			  size_t chunk);
	/* out[0] = the sum of v[n] in double, in order (a loss's mean) */
	void (*sum)(double *out, const float *v, size_t n);
	/* 1 when some value is Inf or NaN; how many are. */
	int (*nonfinite)(const float *g, size_t n);
	int (*nonfinite16)(int fp16, const uint16_t *g, size_t n);
	long (*count_nonfinite)(const float *v, size_t n);
	long (*count_nonfinite16)(const uint16_t *v, size_t n); /* bf16 */
	/* One optimizer step over p[n] from g[n] with its state m[n], v[n]
	 * (NULL where the optimizer keeps none). optim16: the gradients are
	 * 16-bit, widened chunk by chunk into scratch[chunk], and the result
	 * rounded into p16[n] too. */
	void (*optim)(const hpu__dev_optim *k, float *p, const float *g, float *m, float *v,
		      size_t n);
	void (*optim16)(const hpu__dev_optim *k, int fp16, float *p, const uint16_t *g16,
			uint16_t *p16, float *m, float *v, size_t n, float *scratch, size_t chunk);

	/* The step's decisions on the device (hpu__dev_stepvars, device
	 * memory; c is host memory). Nothing comes back to the host. */
	/* *flag = 1 where g[n] holds an Inf or NaN (else left as it is) */
	void (*flag_nonfinite)(float *flag, const float *g, size_t n);
	void (*flag_nonfinite16)(float *flag, int fp16, const uint16_t *g, size_t n);
	/* *acc += sumsq(g, n); *acc = sumsq16(*acc, ...): the same sums */
	void (*sumsq_add)(double *acc, const float *g, size_t n);
	void (*sumsq16_add)(double *acc, int fp16, const uint16_t *g, size_t n, float *scratch,
			    size_t chunk);
	/* A loss term's seed: g[n] += weight * s / (float)batch in fp32,
	 * s = (float)(base * sv->loss_scale); NaN instead where one of the
	 * micro-step's loss sums sums[nsums] (device memory) is not finite,
	 * and sv->bad = 1 then, so that the step is skipped on every rank
	 * even where no gradient carries the seed on (a loss layer whose
	 * backward does not read dout). */
	void (*loss_seed)(float *g, size_t n, const double *sums, int nsums, float weight,
			  float base, int batch, hpu__dev_stepvars *sv);
	/* Before the update, after bad and sumsq are complete (reduced
	 * across ranks): skip = bad > 0; unless skipped, t += 1, norm =
	 * sqrt(sumsq) (divided by loss_scale in 16-mixed; only where
	 * clip_norm > 0, else 0) and gscale = (16-mixed: (float)(1 /
	 * loss_scale), else 1) x hpu__clip_factor(norm, clip_norm) (x 1
	 * without clipping), exactly the host's arithmetic. */
	void (*step_begin)(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c);
	/* After the update: the dynamic scaler's update (halve on overflow
	 * after `hysteresis` of them, not below min_scale; double every
	 * `window` steps since the last), then under mixed precision
	 * skipped += skip and step_no += 1 (strategy_mp.c's update_scale);
	 * bad and sumsq cleared for the next step. */
	void (*step_end)(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c);

	/* An evaluation's sums on the device (train.c's evaluate_on in a
	 * recordable run: nothing read back until the evaluation ends), rows
	 * a device int read when the op runs (a replay's batch may hold
	 * padding past it: --pad-last-batch). rows_add: *acc += v[r] for r
	 * < min(n, *rows), one value at a time in double, in order (the
	 * host's loop over a metric's values). loss_add: *acc += (the sum
	 * over k < nloss of w[k] * (sums[k] / *rows)) * *rows in double, in
	 * that order (hpu__vars_loss_of's mean times the batch; w device
	 * memory). */
	void (*rows_add)(double *acc, const float *v, size_t n, const int *rows);
	void (*loss_add)(double *acc, const double *sums, const double *w, int nloss,
			 const int *rows);
} hpu__dev_rtops;

/* torch.nn.utils.clip_grad_norm_'s factor for a global norm, in fp32 as
 * torch computes it: max_norm / (norm + 1e-6), at most 1 (the host's
 * and every device's step_begin). */
static inline float hpu__dev_clip_factor(double norm, double max_norm)
{
	float denom = (float)norm + (float)1e-6;
	float coef = (1.0f / denom) * (float)max_norm;
	return coef > 1.0f ? 1.0f : coef;
}

/* The CPU devices' runtime ops (device_ops.c): today's host loops. */
extern const hpu__dev_rtops hpu__dev_cpu_rtops;

/* The host's own loops over host memory, called directly (no device
 * call): the offloaded optimizer's update over the host tier, as
 * ZeRO-Offload runs it on the CPU. Never on device memory (on
 * cpu-strict that faults); the device's ops (hpu__dev_* below) take
 * device memory only, and on a device that tells host memory from its
 * own, host memory given to one stops the worker with a line naming
 * the op. */
const hpu__dev_rtops *hpu__dev_host_rt(void);

/* A queue: work issued on it runs in order. NULL is the default queue. */
typedef struct hpu__dev_queue hpu__dev_queue;

/* A point on a queue: the host can wait for the work before it. */
typedef struct hpu__dev_event {
	hpu__dev_queue *q;
	uint64_t seq;
} hpu__dev_event;

/* What the worker's options ask of the device, applied once it is set
 * up (hpu__dev_configure). */
typedef struct hpu__dev_config {
	uint64_t memory_limit; /* --device-memory where given; 0: not given */
	int allow_tf32;        /* --allow-tf32: fp32 GEMMs and convolutions may
				* run on TF32 tensor cores */
	int nccl;              /* --collectives nccl: the device's group runs
				* NCCL (cuda; others refuse it) */
	int graphs;            /* --graphs: steps will be recorded
				* (hpu__dev_capture_begin); on cpu-strict the
				* ops then run on its kernels-only table, as
				* HPU_STRICT_KERNELS=1; cpu becomes
				* cpu-strict's arena without its protection,
				* on the same table */
} hpu__dev_config;

/* Collectives between the ranks of one node on device memory (the CUDA
 * device: CUDA IPC). The device module links no collectives library: the
 * host's collectives come in as an exchange, `xchg`, that puts every
 * rank's `bytes` bytes at `mine` into all[rank * bytes], in rank order
 * (an all-gather; 0, or -1 where it failed: the caller's communicator
 * holds the sentence, naming the peer). Every rank of the group calls
 * each function at once, in the same order. */
typedef int hpu__dev_xchg_fn(void *arg, const void *mine, void *all, size_t bytes);

typedef struct hpu__dev_group hpu__dev_group;

typedef enum hpu__dev_dtype {
	HPU__DEV_F32 = 0,
	HPU__DEV_BF16,
} hpu__dev_dtype;

typedef struct hpu__dev_coll {
	/* The group of `world` ranks (this one `rank`), each with a staging
	 * buffer of twice `bytes` in its device memory that the others map.
	 * 0 and *out; 1 where the group cannot be and nothing failed (ranks
	 * on more than one node, too many ranks); -1 where the device
	 * refused it (CUDA IPC unsupported, no peer access) or xchg failed;
	 * -2 where the collectives the user asked for (--collectives nccl)
	 * cannot run (ranks sharing a GPU, NCCL missing on a rank): the job
	 * ends with why. Every rank gets the same answer (the ranks agree
	 * through xchg, unless xchg itself failed); on 1, -1 and -2, one
	 * sentence in why. */
	int (*open)(hpu__dev_group **out, int rank, int world, size_t bytes,
		    hpu__dev_xchg_fn *xchg, void *arg, char *why, size_t whylen);
	/* recv[count] = the sum of every rank's send[count] (device
	 * memory; recv may be send), issued on the default queue: fp32
	 * added in rank order, or bf16 widened to fp32 and each partial sum
	 * rounded to bf16 in rank order (libhpucoll's rounding: at two
	 * ranks the same bits as its all-reduce). Every rank gives the same
	 * count and dtype. 0; -1 where xchg failed. */
	int (*all_reduce)(hpu__dev_group *g, const void *send, void *recv, size_t count,
			  hpu__dev_dtype dt);
	/* Unmaps the peers' buffers and frees this rank's (after a last
	 * exchange, so that no peer still reads it). NULL is fine. */
	void (*close)(hpu__dev_group *g);
} hpu__dev_coll;

/* One name among a recorded step's calls, and how many calls carry it
 * (hpu__dev_graph_names). */
typedef struct hpu__dev_node_count {
	const char *name;
	size_t count;
} hpu__dev_node_count;

/* A device that records a step itself (CUDA: stream capture into a CUDA
 * graph), behind device_graph.c's hpu__dev_capture_begin ... hpu__dev_graph_free,
 * which keep the refusals, the reasons, the memory held for a graph
 * (devmem) and the one-at-a-time rule for every device. begin: start
 * recording the calling thread's work on the default queue (0, or -1 with
 * a sentence); end: stop, *graph the device's graph (0), or 1 / -1 with a
 * sentence in why (the device refused, or failed), *graph NULL; launch:
 * run it once (0, or -1 with a sentence); nodes: the calls it holds;
 * free: frees it (NULL is fine). */
typedef struct hpu__dev_recorder {
	int (*begin)(char *err, size_t errlen);
	int (*end)(void **graph, char *why, size_t whylen);
	int (*launch)(void *graph, char *err, size_t errlen);
	size_t (*nodes)(const void *graph);
	void (*free)(void *graph);
	/* the calls it holds counted by name (hpu__dev_graph_names; *out
	 * owned by the graph); NULL: the device names none */
	size_t (*names)(const void *graph, const hpu__dev_node_count **out);
	/* 1 when the recording under way on the calling thread holds a
	 * refusal of the device's own (end will answer 1 with it); NULL: the
	 * device keeps none but end's */
	int (*refused)(void);
	/* hpu__dev_graph_rebind on its graph (`to` checked pinned already);
	 * NULL: its copies keep their sources */
	int (*rebind)(void *graph, const void *from, const void *to, size_t bytes, char *err,
		      size_t errlen);
} hpu__dev_recorder;

/* One device's table. */
typedef struct hpu__device {
	const char *name; /* "cpu", "cpu-strict", "cuda" */
	/* Sets the device up for `rank` (before devmem); 0, or -1 with a
	 * sentence in err. */
	int (*setup)(int rank, char *err, size_t errlen);
	void (*teardown)(void);
	void (*caps)(hpu__dev_caps *out);
	/* Open and close device memory around a device call (NULL: always
	 * open). Nested calls are counted. */
	void (*enter)(void);
	void (*leave)(void);
	/* Copies and fills, issued on q (inside a device call). */
	void (*copy)(hpu__dev_queue *q, void *dst, const void *src, size_t n);
	void (*fill)(hpu__dev_queue *q, void *dst, int byte, size_t n);
	/* Events: record a point on q; wait for it on the host. */
	void (*record)(hpu__dev_queue *q, hpu__dev_event *ev);
	void (*wait)(const hpu__dev_event *ev);
	/* Pinned host memory: zeroed, 64-byte aligned. */
	void *(*host_alloc)(size_t bytes);
	void (*host_free)(void *p);
	/* The kernels, and the runtime's own ops. */
	const hpu__backend *(*ops)(void);
	const hpu__dev_rtops *rt;
	/* 1 when p is device memory (NULL: host and device memory are
	 * one, as on cpu). */
	int (*owns)(const void *p);
	/* Where devmem takes the device's blocks (NULL: host memory from
	 * the system); hpu__dev_open installs it after setup,
	 * hpu__dev_close removes it before teardown. */
	const hpu__devmem_backing *backing;
	/* Queues of the device's own (NULL: device_call.c's, for devices whose
	 * work is done when issued). queue_free takes a queue from
	 * queue_new. */
	hpu__dev_queue *(*queue_new)(void);
	void (*queue_free)(hpu__dev_queue *q);
	/* Applies c after setup (NULL: the device takes none of it, as the
	 * CPU devices, whose fp32 products are fp32 whatever allow_tf32
	 * says). *capacity: the bytes of memory the device has of its own
	 * (0: host memory); note: one line for --verbose on what c does
	 * there. 0, or -1 with a sentence in err (a memory_limit above
	 * the device's memory). */
	int (*configure)(const hpu__dev_config *c, uint64_t *capacity, char *note,
			 size_t notelen, char *err, size_t errlen);

	/* Collectives on device memory between the ranks of one node
	 * (NULL: none; the strategy stages through host memory). */
	const hpu__dev_coll *coll;

	/* What p is, for a message: "GRADS block 'gradients'" (devmem's
	 * kind and what), "host memory" (NULL: the device keeps no labels;
	 * cpu-strict's). */
	void (*describe)(const void *p, char *out, size_t len);

	/* Recording a step (NULL: the CPU's list of device_rec.c, where
	 * caps.can_capture says it records: cpu-strict, and cpu under
	 * --graphs, on the kernels-only table). While a device with a recorder records, worker/device still
	 * refuses what no recording can hold (copies into host memory,
	 * values, waits) and hands it the rest as when eager. */
	const hpu__dev_recorder *recorder;

	/* The CPU's list only (NULL elsewhere): on 1, as this thread begins
	 * recording, the device's memory closed to host code (--device cpu
	 * under --graphs, whose memory is otherwise open), so that host
	 * code's own loops over it fault and run; on 0, as it ends, open
	 * again: NULL, or the first address touched meanwhile, its block said
	 * in what, and the recording is refused. */
	const void *(*rec_guard)(int on, char *what, size_t len);

	/* A copy issued on q and not waited for (NULL: copy, whose work is
	 * done when issued, as on the CPU devices): a GPU's copy from pinned
	 * host memory, or into it, that the caller waits for later
	 * (hpu__dev_copy_queued, hpu__dev_d2h_n). */
	void (*copy_queued)(hpu__dev_queue *q, void *dst, const void *src, size_t n);
} hpu__device;

/* The CUDA device lives in a program module, hpudev_cuda.so
 * (worker/cuda), that exports one function of this type by the name
 * HPU__CUDA_ENTRY. It returns the device's table and sets *ngpus to the
 * GPUs visible to the process; where there are none, or CUDA cannot say,
 * 0 and one sentence in err. The module needs no symbol of the worker. */
#define HPU__CUDA_ENTRY "hpu_cuda_device_v1"
typedef const hpu__device *hpu__cuda_entry_fn(int *ngpus, char *err, size_t errlen);

/* The devices built in. */
extern const hpu__device hpu__dev_cpu;
extern const hpu__device hpu__dev_cpu_strict;

/* Chooses the device named `name` ("cpu", "cpu-strict", "cuda", "auto";
 * NULL or "": cpu) for `rank` and sets it up; call before
 * hpu__devmem_init. "cuda" loads hpudev_cuda.so (HPU_CUDA_MODULE, else
 * beside the program: ../lib, ../LIBDIR/hputrain); "auto" is cuda where
 * it loads and sees a GPU, else cpu. 0, or -1 with one sentence in err
 * (an unknown name, "cuda" in a build without it, a module that does not
 * load, no GPU visible, CUDA's error). */
int hpu__dev_open(const char *name, int rank, char *err, size_t errlen);

/* Applies the options to the open device, before hpu__devmem_init:
 * *capacity is the memory the device has of its own (0: host memory,
 * as on the CPU devices), note one line for --verbose on what c does
 * there ("" where there is nothing to say). 0, or -1 with a sentence in
 * err (--device-memory above a GPU's memory). */
int hpu__dev_configure(const hpu__dev_config *c, uint64_t *capacity, char *note,
		       size_t notelen, char *err, size_t errlen);

/* Which workers share a GPU, from every rank's identity of it: ids
 * holds world entries of idlen bytes each, in rank order, each a
 * NUL-terminated "host GPU" string (the host's name and the GPU's PCI
 * bus id: hpu__dev_gpu_ident), "" for a rank on no GPU. Returns how many
 * ranks name the same GPU as rank `rank` (itself included: at least 1;
 * 1 when its entry is ""). The GPU's identity, not its index, counts: a
 * worker that sees only its own GPU (CUDA_VISIBLE_DEVICES set per rank)
 * and hpud's device maps give the right count. */
int hpu__dev_gpu_sharers(const char *ids, size_t idlen, int world, int rank);

/* This worker's entry for hpu__dev_gpu_sharers: "host bus-id" of the
 * open device's GPU, or "" where it drives none. */
void hpu__dev_gpu_ident(char *out, size_t outlen);

/* What a worker on a GPU uses there outside devmem's limit (CUDA's
 * context, the libraries' handles, the kernel table's workspace and
 * scratch), kept out of the default limit. */
#define HPU_DEV_GPU_RESERVE (1ull << 30)

/* The device-memory limit of a worker without --device-memory: the
 * device's own memory (capacity bytes, a GPU's) divided among the
 * `sharers` workers that drive it, less HPU_DEV_GPU_RESERVE each (half
 * the share where that is under twice the reserve); on host memory
 * (capacity 0) the node's
 * memory (host_bytes; 0: unknown, no limit) divided among its
 * local_workers workers. */
uint64_t hpu__dev_default_memory(uint64_t capacity, int sharers, uint64_t host_bytes,
				 int local_workers);

/* Tears the device down after devmem's shutdown; the cpu device serves
 * again. */
void hpu__dev_close(void);

/* 0 when `name` names a device this build has, else -1 with a sentence
 * in err (the option's check before workers start). */
int hpu__dev_check_name(const char *name, char *err, size_t errlen);

/* The GPUs the CUDA device's module sees (CUDA_VISIBLE_DEVICES honoured,
 * as CUDA counts them): hpu-worker --count-gpus, which hpulaunch asks for
 * --devices auto. 0 with the sentence in err ("--device cuda: ...") where
 * the module is not built, does not load or sees none. Loads the module
 * and CUDA's driver into this process. */
int hpu__dev_count_gpus(char *err, size_t errlen);

const hpu__device *hpu__dev(void);
const char *hpu__dev_name(void);
const hpu__dev_caps *hpu__dev_caps_get(void);

/* 1 when host code may read and write device memory directly. */
int hpu__dev_host_can_read(void);

/* 1 when the ops may zero gradients owed zeros themselves
 * (worker/ops/autocast.h, hpu__ac_fresh_add; hpu__strat_fresh_ok): the
 * host may touch device memory, or caps.ops_fill (every zero the ops
 * and the owed zeros' flush make is a call of the kernel table, which a
 * recording keeps: the same claims every step, replayed). */
int hpu__dev_ops_fill(void);

/* Device memory (devmem: zeroed or not; freed by hpu__dev_free). */
void *hpu__dev_alloc(hpu_mem_kind kind, size_t bytes, const char *what);
void *hpu__dev_alloc_uninit(hpu_mem_kind kind, size_t bytes, const char *what);
void hpu__dev_free(void *p);

/* Pinned host memory, zeroed; NULL when the system refuses. */
void *hpu__dev_host_alloc(size_t bytes);
void hpu__dev_host_free(void *p);

/* Memory the host itself reads and writes (batches as loaded, the
 * sampler's indices, the hooks' parameters): device memory where the
 * host may read it (counted in DeviceStats, as before), else pinned host
 * memory. NULL with hpu__devmem_error() set. Freed by hpu__dev_hbuf_free
 * (NULL is fine). */
void *hpu__dev_hbuf_alloc(hpu_mem_kind kind, size_t bytes, const char *what);
void hpu__dev_hbuf_free(void *p);

/* A device call: device memory is open between these. Nest freely. */
void hpu__dev_enter(void);
void hpu__dev_leave(void);

/* The strategy's bracket around a layer's forward or backward: a device
 * call, except under cpu-strict's kernels-only mode (HPU_STRICT_KERNELS=1,
 * device_kernels.c), where only the kernel table's functions and the
 * runtime's ops open device memory, as on a GPU. */
void hpu__dev_layer_enter(void);
void hpu__dev_layer_leave(void);

/* The host-only layer (HPU_LAYER_HOST_ONLY) whose call runs now on its
 * staged host copies (strategy_host.c), or NULL after it. Under the
 * kernels-only mode a kernel given host memory meanwhile stops the
 * worker naming the layer: the layer handed its host tensors to ops,
 * which run on device memory (on a GPU too). */
void hpu__dev_staged_layer(const char *name);

/* Where the device's checks that end the worker (cpu-strict's: a host-only
 * layer's op, the step guard, a rewritten queued copy, host memory given
 * to a device op, and its SIGSEGV handler's fault) hand their sentence
 * before _exit, for the agent to end its closing error with (the runtime
 * sets it to hpu__status_error); NULL: nowhere. Called from a signal
 * handler too: it takes no lock and writes the pipe once (its first use
 * looks the pipe up, which the status records have done by then). */
extern void (*hpu__dev_fatal_why)(const char *why);

/* Says "hpu-worker: rank R: <sentence>" on stderr, hands the sentence to
 * hpu__dev_fatal_why and ends the worker (_exit(1)). Not from a signal
 * handler. */
void hpu__dev_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* The step guard: the runtime turns it on while a training step runs
 * (train.c's train_step: from the first micro-step's forward to the end
 * of the strategy's step) and off again. A recorded step (--graphs, a
 * CUDA graph) cannot bring anything back to the host in its middle: no
 * copy into host memory, no value returned by an op, no wait on the
 * host. Under --device cpu-strict with HPU_STRICT_STEP=1 (read when the
 * device opens), while the guard is on, every device call that does so
 * ends the worker at once with one line naming the call and what it
 * read: hpu__dev_d2h, hpu__dev_d2d and hpu__dev_copy into host memory,
 * the ops that return a value (sumsq, sumsq16, nonfinite, nonfinite16,
 * count_nonfinite, count_nonfinite16, bf16_exact), hpu__dev_event_wait
 * and hpu__dev_queue_sync. The collectives' staging through pinned host
 * memory (between workers, on devices without collectives of their own)
 * is such a copy too: at more than one worker on cpu-strict the guard
 * stops at it. Elsewhere (other devices, the knob unset) this costs a
 * branch and does nothing. */
void hpu__dev_step_guard(int on);

/* Copies and memset on queue q (NULL: the default), each a device call;
 * h2d and d2h count their bytes, and so does d2d where one side is host
 * memory (as the h2d or d2h copy it is). */
void hpu__dev_h2d(hpu__dev_queue *q, void *dst, const void *src, size_t n);
void hpu__dev_d2h(hpu__dev_queue *q, void *dst, const void *src, size_t n);
void hpu__dev_d2d(hpu__dev_queue *q, void *dst, const void *src, size_t n);
void hpu__dev_memset(hpu__dev_queue *q, void *dst, int byte, size_t n);

/* A copy of n bytes where either side may be device memory or host
 * memory (the host tier, a staging buffer): an h2d, d2h or d2d copy as
 * the pointers say, or memcpy between host buffers; on cpu, memcpy. */
void hpu__dev_copy(void *dst, const void *src, size_t n);

/* As hpu__dev_copy, except that a copy from pinned host memory
 * (hpu__dev_host_alloc) into device memory is queued and not waited for:
 * the caller leaves the source unchanged until its next wait on the
 * device (a copy into host memory, a value, a sync: hpu__dev_waits). An
 * eager step's learning rate and its batch go in so, the step's result
 * read at its end being that wait. cpu-strict, which copies at once,
 * keeps the source's bytes and compares them at the next wait: a source
 * rewritten before it ends the worker with one line naming the copy (on
 * a GPU the copy could have read the new bytes). */
void hpu__dev_copy_queued(void *dst, const void *src, size_t n);

/* Copies from device memory into host memory, each as hpu__dev_copy's
 * (counted as hpu__dev_d2h's), all queued before one wait for them: one
 * round trip on a GPU where n copies would make n. A span whose source is
 * not device memory, or whose destination is, is copied as
 * hpu__dev_copy does. */
typedef struct hpu__dev_span {
	void *dst;
	const void *src;
	size_t n;
} hpu__dev_span;
void hpu__dev_d2h_n(const hpu__dev_span *c, int n);

/* How many times since the device opened the host has waited for it: a
 * copy into host memory or from host memory not queued (one for all of
 * an hpu__dev_d2h_n), an op that returns a value, hpu__dev_event_wait and
 * hpu__dev_queue_sync. Counted on devices whose memory is their own
 * (cpu-strict, cuda: where a GPU waits), as the calls ask, not as the
 * device does them (cpu-strict copies at once either way); 0 on cpu. */
uint64_t hpu__dev_waits(void);

/* 1 when p lies in this device's memory (0 on cpu: host code may read it
 * anyway). */
int hpu__dev_owns(const void *p);

/* Queues and events (on the CPU devices work is done when issued). */
hpu__dev_queue *hpu__dev_queue_new(void);
void hpu__dev_queue_free(hpu__dev_queue **q);
void hpu__dev_event_record(hpu__dev_queue *q, hpu__dev_event *ev);
void hpu__dev_event_wait(const hpu__dev_event *ev);
void hpu__dev_queue_sync(hpu__dev_queue *q);

/* The kernel table the ops use on this device. */
const hpu__backend *hpu__dev_ops(void);

/* The runtime's ops on the device (hpu__dev_rtops), each a device call
 * on the default queue; results the host needs come back as values. */
void hpu__dev_to16(int fp16, uint16_t *dst, const float *src, size_t n);
void hpu__dev_from16(int fp16, float *dst, const uint16_t *src, size_t n);
void hpu__dev_acc16(int fp16, uint16_t *dst, const float *src, size_t n);
int hpu__dev_bf16_exact(uint16_t *dst, const float *x, size_t n);
void hpu__dev_bf16_expand(float *dst, const uint16_t *src, size_t n);
void hpu__dev_add(float *dst, const float *src, size_t n);
void hpu__dev_add_scalar(float *dst, float v, size_t n);
double hpu__dev_sumsq(const float *g, size_t n);
double hpu__dev_sumsq16(double acc, int fp16, const uint16_t *g, size_t n, float *scratch,
			size_t chunk);
void hpu__dev_sum(double *out, const float *v, size_t n);
int hpu__dev_nonfinite(const float *g, size_t n);
int hpu__dev_nonfinite16(int fp16, const uint16_t *g, size_t n);
long hpu__dev_count_nonfinite(const float *v, size_t n);
long hpu__dev_count_nonfinite16(const uint16_t *v, size_t n);
void hpu__dev_optim_update(const hpu__dev_optim *k, float *p, const float *g, float *m,
			   float *v, size_t n);
void hpu__dev_optim_update16(const hpu__dev_optim *k, int fp16, float *p, const uint16_t *g16,
			     uint16_t *p16, float *m, float *v, size_t n, float *scratch,
			     size_t chunk);

/* The step's decisions on the device (hpu__dev_rtops' flag_nonfinite
 * to step_end), each a device call on the default queue. */
void hpu__dev_flag_nonfinite(float *flag, const float *g, size_t n);
void hpu__dev_flag_nonfinite16(float *flag, int fp16, const uint16_t *g, size_t n);
void hpu__dev_sumsq_add(double *acc, const float *g, size_t n);
void hpu__dev_sumsq16_add(double *acc, int fp16, const uint16_t *g, size_t n, float *scratch,
			  size_t chunk);
void hpu__dev_loss_seed(float *g, size_t n, const double *sums, int nsums, float weight,
			float base, int batch, hpu__dev_stepvars *sv);
void hpu__dev_step_begin(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c);
void hpu__dev_step_end(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c);
void hpu__dev_rows_add(double *acc, const float *v, size_t n, const int *rows);
void hpu__dev_loss_add(double *acc, const double *sums, const double *w, int nloss,
		       const int *rows);

/* The device's collectives (hpu__dev_coll), each a device call: where
 * the device has none, group_open answers 1 with the sentence in why. */
int hpu__dev_group_open(hpu__dev_group **out, int rank, int world, size_t bytes,
			hpu__dev_xchg_fn *xchg, void *arg, char *why, size_t whylen);
int hpu__dev_group_all_reduce(hpu__dev_group *g, const void *send, void *recv, size_t count,
			      hpu__dev_dtype dt);
/* Closes *g (NULL is fine) and sets it to NULL. */
void hpu__dev_group_close(hpu__dev_group **g);

/* ---- recording a step and replaying it (--graphs, issue 36) ----
 *
 * Between hpu__dev_capture_begin and hpu__dev_capture_end the calling
 * thread's device work is recorded, not run, as CUDA's stream capture
 * records a stream: every kernel-table call, runtime op (hpu__dev_rtops),
 * copy and fill, and the device's own collectives, with its arguments as
 * they are at the call: device pointers, scalars, and the contents of
 * host structs and arrays passed by pointer (an hpu__gemm, a
 * convolution's shape), copied; a copy from host memory reads that
 * memory when the graph runs (the pinned block the runtime rewrites
 * before each launch: the learning rate, the batch). A launch then runs
 * the recorded work in order. The CUDA device records with CUDA's
 * stream capture into a CUDA graph; the CPU's twin (cpu-strict, and cpu
 * under --graphs, on the kernels-only table: every access to device
 * memory is a table call) keeps the calls in a list.
 *
 * What cannot be recorded makes the recording fail, not the worker:
 * anything that brings a value back to the host (a copy into host
 * memory, an op that returns a value, a wait), a table call that writes
 * host memory or whose kernels take host values that change every step
 * (dropout's keys drawn on the host), the libhpucoll collectives the strategy runs through
 * the host where the device records itself (CUDA: hpu__dev_capture_refuse;
 * the CPU's list holds them as host nodes, hpu__dev_rec_host), a failed
 * CUDA call; and, so that
 * nothing escapes a recording silently, a copy from host memory that is
 * not pinned memory of hpu__dev_host_alloc or hbuf's (a stack value: a
 * replay reads the source when it runs), and on the CPU's list host code
 * that opens device memory (hpu__dev_enter) or device work from another
 * thread meanwhile (that work runs, unrecorded). The call does
 * nothing (a value-returning op returns 0), the first reason is kept,
 * and hpu__dev_capture_end answers it: nothing of the step ran, and the
 * caller runs the step again eagerly.
 *
 * Memory: device memory allocated while recording, and device memory
 * freed while recording, stays reserved for the graph (devmem does not
 * hand it out again) until hpu__dev_graph_free, even where its owner
 * frees it later: the graph's kernels keep the addresses they recorded.
 *
 * One recording at a time, on the thread that runs the step. */
typedef struct hpu__dev_graph hpu__dev_graph;

/* Starts recording. 0, or -1 with a sentence in err (the device cannot
 * record: caps.can_capture 0, cpu-strict without its kernels-only table
 * (--graphs, or HPU_STRICT_KERNELS=1), cpu without --graphs; or a
 * recording is under way). */
int hpu__dev_capture_begin(char *err, size_t errlen);

/* 1 while this thread records. */
int hpu__dev_capturing(void);

/* The caller (the strategy, the runtime) met something the recording
 * cannot hold: the recording fails with this reason (the first one
 * given is kept). Nothing happens when not recording. */
void hpu__dev_capture_refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A host call a launch makes in its place among the device's calls (a
 * host node): fn(arg, err, errlen) on the host, arg the recording's
 * copy of the caller's bytes; 0, or -1 with one sentence in err, which
 * the launch then answers as it is (the rest of the graph is not run). */
typedef int hpu__dev_host_fn(const void *arg, char *err, size_t errlen);

/* While this thread records into the CPU's list (cpu-strict): appends a
 * host node, `what` its name (a string that lives: "hpucoll_all_reduce"),
 * fn run at each launch on a copy of the `bytes` at arg, after the
 * device's calls recorded before it and before those after it; 0 (also
 * where the recording was refused already: nothing more is kept). The
 * caller does not run the work now: the launch right after a kept
 * recording does. -1 where nothing is appended: not recording, or the
 * device records itself (CUDA's stream capture cannot hold a host call
 * that waits, as a collective's does): the caller refuses the recording
 * (hpu__dev_capture_refuse) itself. What fn reads must stay where it is
 * while the graph lives (device memory the graph holds, the caller's
 * long-lived state). */
int hpu__dev_rec_host(const char *what, hpu__dev_host_fn *fn, const void *arg, size_t bytes);

/* Ends the recording: 0 and *out the graph (its nodes counted), or 1,
 * *out NULL and the first reason in why, one sentence naming the call
 * ("hpu__dev_d2h: a copy into host memory"); nothing was run either way.
 * -1 with why where the device failed otherwise. */
int hpu__dev_capture_end(hpu__dev_graph **out, char *why, size_t whylen);

/* Runs g's recorded work once, in order (issued on the default queue).
 * 0, or -1 with a sentence in err. While the profiler records
 * (worker/hpu/prof.h: hpu__prof_enabled), the CPU's list times each call:
 * one complete event of category "graph_node" per call, named as
 * hpu__dev_graph_names names it, on the calling thread's row (inside the
 * runtime's graph_replay range); with the profiler off the walk takes
 * no time. A device's own graph (CUDA) is one launch: its kernels run
 * on the GPU after it returns, and no span is made for them. */
int hpu__dev_graph_launch(hpu__dev_graph *g, char *err, size_t errlen);

/* g's copies from the host that read `from` (the whole copy starting
 * there) read `to` from the next launch on: a replay's batch read where
 * the loader put it rather than copied into the recording's input
 * buffers first. `to` must be pinned (hpu__dev_host_alloc's) and hold
 * `bytes`, at least each such copy's size; where it is not, or the
 * device's graph cannot change a copy, nothing changes. A launch already
 * under way reads what it read. Returns the copies changed; 0 where none
 * was (the caller copies into `from` as before; where the device refused
 * a change, err says why); or -1 with a sentence in err where the device
 * failed part way and could not undo it (g then reads from both: not to
 * be launched again before a call that succeeds). */
int hpu__dev_graph_rebind(hpu__dev_graph *g, const void *from, const void *to, size_t bytes,
			  char *err, size_t errlen);

/* The calls g holds (kernels, ops, copies, fills). */
size_t hpu__dev_graph_nodes(const hpu__dev_graph *g);

/* g's calls counted by name, in the order each name first comes: *out
 * (owned by g, valid until hpu__dev_graph_free) and the number of names;
 * their counts add up to hpu__dev_graph_nodes. The CPU's list names a
 * call by its kernel-table entry ("gemm", "conv_fwd"), runtime op
 * ("optim", "loss_seed") or copy ("h2d", "d2d", "memset"); a CUDA graph
 * names a kernel by its function's name and other nodes by their type
 * ("memcpy", "memset"). 0 and *out NULL where the device names none. */
size_t hpu__dev_graph_names(const hpu__dev_graph *g, const hpu__dev_node_count **out);

/* The host nodes among g's calls (hpu__dev_rec_host; 0 in a device's
 * own graph, which holds none). */
size_t hpu__dev_graph_host_calls(const hpu__dev_graph *g);

/* Frees *g (NULL is fine) and gives devmem back the memory kept for it;
 * sets *g to NULL. */
void hpu__dev_graph_free(hpu__dev_graph **g);

/* What a recording's host code gave the ops' kernels, call by call: the
 * entry, the layer and pass running, and the values passed (scalars,
 * shapes, whether each pointer is NULL; never device memory). A launch
 * repeats the recorded values; a value the host computes each step (from
 * ctx->step, the host's random numbers) would be replayed as recorded.
 * take_calls: g's, taken from it (the caller frees them; NULL for none);
 * same_calls: 1 when g's calls are before's, else 0 with a sentence
 * naming the first call that differs (layer, kernel, call number). */
typedef struct hpu__dev_calls hpu__dev_calls;
hpu__dev_calls *hpu__dev_graph_take_calls(hpu__dev_graph *g);
int hpu__dev_graph_same_calls(const hpu__dev_calls *before, const hpu__dev_graph *g,
			      char *why, size_t len);
void hpu__dev_calls_free(hpu__dev_calls **c);

/* Tells the ops (worker/ops/backend.h, hpu__be_set_dev_hooks) the open
 * device's name, whether the host may touch its memory
 * (hpu__dev_host_can_read) and whether the calling thread records, so
 * that a kernel table that is not the host's, over memory the host cannot
 * touch, never sends an op to its C loops: while
 * recording, an entry's refusal refuses the recording, naming the op
 * (unless the recording holds a reason already, worker/device's or the
 * device recorder's own); outside one the worker ends naming the op and
 * the device (device_refuse.c). The worker calls it once at start. */
void hpu__dev_ops_hooks(void);

/* Bytes copied host->device and device->host since the device opened. */
void hpu__dev_copied(uint64_t *h2d, uint64_t *d2h);

#endif
