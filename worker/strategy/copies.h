/* copies: the bytes one training step must copy between the host and the
 * device, as the placement plan (plan.h) and the code that carries it out
 * say: per rank, for one step of `accum` micro-steps that each run forward
 * and backward once, then the optimizer step (not skipped).
 *
 * What crosses, on a device whose memory the host may not read
 * (host_can_read 0: cpu-strict, GPUs):
 *   - the batch in: every dataset field of every micro-batch, 4 bytes a
 *     value (strategy_pass.c's batch_in);
 *   - the loss out: each loss term's sum over the micro-batch, one
 *     double, summed on the device, read after the step (and after each
 *     micro-step's backward too where the step is eager: to name the
 *     first non-finite tensor);
 *   - the step's scalars (strategy_vars.c): the learning rate and
 *     Adam's beta powers in (24 bytes); the
 *     block out after the step, and once inside it where the host takes
 *     part (an eager step, the offload tier); the non-finite flag's
 *     all-reduce (and the norm's, sharded, where clipping) staged out and
 *     back like the gradients'; where the step is recordable, the ops'
 *     deferred checks' slots out after it, as many as the step took
 *     (worker/ops/checks.h): the plan is then a floor;
 *   - the gradients' collectives, staged through pinned host buffers
 *     (strategy_dcoll.c): an all-reduce copies its buffer out and back; a
 *     reduce-scatter the whole unit out and the rank's piece back; none
 *     where the all-reduce runs on the device itself (grads_direct: ddp
 *     and fast_ddp over CUDA IPC, the ranks on one node);
 *   - the parameters' all-gathers (ZeRO): the rank's piece out (unless it
 *     lives in the host tier or NVMe's buffers already) and the other
 *     ranks' pieces back (and the own piece too when it is not on the
 *     device); ZeRO-1/2 once after the step, ZeRO-3 for every use of a
 *     layer not kept whole in forward and backward, and its persistent
 *     layers after the step;
 *   - the buffers synchronized after the step: out and back.
 * At world size 1 nothing is staged: the collectives are the identity.
 * Where the host may read device memory (cpu) libhpucoll and the loss
 * read the device's memory itself and the batch is read in place:
 * nothing of the above is copied.
 *
 * The offload tier's traffic is copied on every device, cpu too (the
 * host tier: --offload-optimizer/--offload-param cpu, and NVMe's
 * buffers, which are host memory): no device op reads or writes host
 * memory, and the offloaded update runs on the host (plan.h's `update`):
 *   - zero2/3 with the gradient shard in the host tier: each micro-step
 *     the rank's reduced piece out;
 *   - at the step, over each unit's range the rank updates: gradients
 *     kept on the other side than the update go to it (zero1's whole
 *     gradients on the device, out to the host's update); parameters
 *     kept on the other side go to it and back (fp32), or only back as
 *     the update's 16-bit rounding (mixed precision: the master weights
 *     are on the update's side). */
#ifndef HPU_STRATEGY_COPIES_H
#define HPU_STRATEGY_COPIES_H

#include <stddef.h>
#include <stdint.h>

#include "worker/strategy/plan.h"

/* One unit of the strategy's layout (strategy_impl.h): `len` floats
 * (padded), `piece` of them each rank's under ZeRO; zero3: `persistent`
 * when kept whole, else gathered `gathers` times per micro-step (once per
 * forward and per backward call that uses it). */
typedef struct hpu_plan_unit {
	size_t len, piece;
	int persistent;
	int gathers;
} hpu_plan_unit;

/* The step, as the model and the options make it. */
typedef struct hpu_plan_step {
	const hpu_plan_unit *units;
	int nunits;
	int micro, accum;       /* samples per micro-step (per rank), micro-steps */
	size_t sample_bytes;    /* one sample's dataset fields as copied in */
	int nloss;              /* loss terms */
	size_t synced_buffers;  /* floats of buffers synchronized after the step */
	int host_can_read;      /* the device's capability */
	int grads_direct;       /* 1: the gradients' all-reduce runs on the
				 * device between the ranks of one node
				 * (CUDA IPC): nothing of it is staged */
	int colls_in_place;     /* 1: libhpucoll works on the device's memory
				 * in place, which is the host's (--device cpu
				 * --graphs): the gradients' collectives, ZeRO's
				 * all-gathers and the step's flag and norm
				 * all-reduces are not staged (the buffers still
				 * are) */
	int regathers;          /* 1: zero3 may gather layers more often than
				 * counted (recomputation, shared parameters) */
	uint64_t staged_h2d, staged_d2h; /* per micro-step: the host-only
				 * layers' staging (strategy_host.c) */
	size_t vars_bytes;      /* the step's scalars (hpu__dev_stepvars) */
	int host_decides;       /* 1: read inside the step too */
	int eager;              /* 1: each micro-step's loss read at once too */
	int sharded, clip, grads_host; /* ZeRO; clipping; gradients in host memory */
} hpu_plan_step;

/* What the bytes are for. */
typedef enum hpu_plan_copy {
	HPU_COPY_BATCH = 0,
	HPU_COPY_LOSS,
	HPU_COPY_GRADS,   /* the gradients' collectives' staging */
	HPU_COPY_PARAMS,  /* ZeRO's parameter all-gathers' staging */
	HPU_COPY_BUFFERS, /* the buffers' synchronization */
	HPU_COPY_OFFLOAD, /* the offload tier's gradients and parameters */
	HPU_COPY_HOSTLAYERS, /* host-only layers' tensors staged around their calls */
	HPU_COPY_STEP,    /* the step's scalars, their all-reduces' staging */
	HPU_COPY_N,
} hpu_plan_copy;

typedef struct hpu_plan_copies {
	uint64_t h2d[HPU_COPY_N], d2h[HPU_COPY_N];
	uint64_t h2d_total, d2h_total;
	int exact; /* 0: at least these */
} hpu_plan_copies;

/* The bytes one step of plan p copies, per rank, into out. */
void hpu__plan_copies(const hpu_plan *p, const hpu_plan_step *st, hpu_plan_copies *out);

const char *hpu__plan_copy_name(hpu_plan_copy c);

/* "N bytes host-to-device (batch A, gradients B, ...)" for one direction
 * (d2h 0: host-to-device), the parts that are not 0. */
void hpu__plan_copies_describe(const hpu_plan_copies *c, int d2h, char *out, size_t outlen);

#endif
