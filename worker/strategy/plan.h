/* plan: the strategy engine's placement plan, computed once at start from
 * the options, the model's sizes and the world. For each model state
 * (parameters, gradients, master weights, optimizer state, activations)
 * it says where the state lives (the device, the host tier, NVMe), in
 * which dtype, whole or sharded over the ranks, and through which
 * collective it moves. The strategies allocate their states from it (one
 * layout for every precision), --verbose prints it, checkpoint manifests
 * record it, and it predicts the model-state bytes a rank keeps. */
#ifndef HPU_STRATEGY_PLAN_H
#define HPU_STRATEGY_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "options/config.h"

typedef enum hpu_plan_state {
	HPU_PLAN_PARAMS = 0, /* the working parameters */
	HPU_PLAN_GRADS,      /* their gradients */
	HPU_PLAN_MASTER,     /* mixed precision: fp32 master weights */
	HPU_PLAN_OPTIM,      /* the optimizer's state */
	HPU_PLAN_ACTS,       /* the layers' outputs */
	HPU_PLAN_NSTATES,
} hpu_plan_state;

typedef enum hpu_plan_where {
	HPU_PLAN_NOWHERE = 0, /* not kept (fp32's master weights, SGD's state) */
	HPU_PLAN_DEVICE,
	HPU_PLAN_HOST, /* the host tier (--offload-*) */
	HPU_PLAN_NVME, /* a swap file under --nvme-path */
} hpu_plan_where;

typedef enum hpu_plan_dtype {
	HPU_PLAN_FP32 = 0,
	HPU_PLAN_BF16,
	HPU_PLAN_FP16,
} hpu_plan_dtype;

typedef enum hpu_plan_coll {
	HPU_PLAN_NO_COLL = 0,
	HPU_PLAN_ALL_REDUCE,           /* ddp: buckets during backward */
	HPU_PLAN_ALL_REDUCE_FLAT,      /* fast_ddp: one after backward */
	HPU_PLAN_REDUCE_SCATTER,       /* zero1: after backward */
	HPU_PLAN_REDUCE_SCATTER_BUCKETS, /* zero2/3: buckets during backward */
	HPU_PLAN_ALL_GATHER_STEP,      /* zero1/2: the updated shard after the step */
	HPU_PLAN_ALL_GATHER_LAYER,     /* zero3: each layer before its use */
} hpu_plan_coll;

typedef struct hpu_plan_entry {
	hpu_plan_where where;
	hpu_plan_dtype dtype;
	int sharded; /* 1: each rank keeps 1/N (its piece of every unit) */
	int copies;  /* values per parameter (Adam: 2 moments), 0 when not kept */
	hpu_plan_coll coll;
} hpu_plan_entry;

typedef struct hpu_plan {
	hpu_strategy kind;
	hpu_precision precision;
	int world;
	int mixed;  /* 16-bit working parameters and gradients, fp32 master */
	int fp16;   /* ... in fp16 (else bf16) */
	int grad_comm16; /* fp32 ddp/fast_ddp: gradients all-reduced as bf16
			  * copies (--grad-comm-dtype bf16) */
	hpu_plan_where update; /* where the optimizer's update runs: the host
				* under --offload-optimizer cpu or nvme
				* (ZeRO-Offload's CPU update), else the
				* device */
	hpu_plan_entry e[HPU_PLAN_NSTATES];
} hpu_plan;

/* Fills p from the options and the world size; opt_floats is the
 * optimizer's state floats per parameter (hpu__optim_state_floats). */
void hpu__plan_make(hpu_plan *p, const hpu_train_opts *o, int world, int opt_floats);

/* 1 when a state kept at w is in host memory (the host tier; NVMe's
 * in-memory buffers): on the host's side of the bus. */
int hpu__plan_on_host(hpu_plan_where w);

/* Bytes of one value of entry e (fp32 4, 16-bit 2). */
size_t hpu__plan_esize(const hpu_plan_entry *e);

/* The bytes entry s keeps on the device of one rank for a layout of
 * `total` floats (`shard` of them this rank's, under ZeRO). */
uint64_t hpu__plan_device_bytes(const hpu_plan *p, hpu_plan_state s, size_t total,
				size_t shard);

/* The model states (parameters, gradients, master weights, optimizer
 * state) one rank keeps on the device for the whole run, in bytes. */
uint64_t hpu__plan_states_bytes(const hpu_plan *p, size_t total, size_t shard);

/* Names, for the plan's print and the checkpoint manifest. */
const char *hpu__plan_state_name(hpu_plan_state s);
const char *hpu__plan_where_name(hpu_plan_where w);
const char *hpu__plan_dtype_name(hpu_plan_dtype d);
const char *hpu__plan_coll_name(hpu_plan_coll c);

/* Entry s as one line: "gradients: device bf16 sharded, reduce-scatter
 * per bucket in backward". */
void hpu__plan_describe(const hpu_plan *p, hpu_plan_state s, char *out, size_t outlen);

#endif
