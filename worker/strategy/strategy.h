/* strategy: where parameters, gradients and optimizer state live and how
 * they move, for ddp, fast_ddp and ZeRO stages 1-3; the forward and
 * backward passes over the model's layers with the strategy's hooks
 * (ZeRO-3 gathers and releases, DDP bucket all-reduces and ZeRO-2/3
 * reduce-scatters started as soon as a bucket's backward is done), and
 * activation checkpointing. All memory comes from the device allocator. */
#ifndef HPU_STRATEGY_H
#define HPU_STRATEGY_H

#include <hpu/coll.h>
#include <cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt/ckpt.h"
#include "options/config.h"
#include "worker/hpu/model.h"
#include "worker/strategy/copies.h"

typedef struct hpu_strat hpu_strat;

/* A batch of n samples: field f's values at data[f] (n times the field's
 * sample_numel values of its dtype, 4 bytes each), and the dataset index
 * of each row (idx[n]). The runtime's loader fills it; the passes read
 * it. */
typedef struct hpu_batch {
	int n;
	void *data[HPU_MAX_IO];
	const uint32_t *idx;
} hpu_batch;

/* Lays the model's parameters out for o->strategy, allocates and
 * initializes them (every rank computes the same initial values from
 * o->seed) and the optimizer state, for micro-batches of up to `maxbatch`
 * samples. With `resume` (an opened, verified checkpoint of this model,
 * saved under any strategy and world size), the master weights, the
 * optimizer state and the loss scaler come from it instead: each rank
 * reads only the ranges it keeps. Errors (including device memory) go to
 * err. */
int hpu__strat_new(hpu_strat **out, hpu_builder *b, hpucoll_comm *comm,
		   const hpu_train_opts *o, int maxbatch, hpu_ckpt *resume, char *err,
		   size_t errlen);

/* Where the next passes are (their hpu_ctx): training or evaluation,
 * the step being computed (or done, in evaluation), the epoch. */
void hpu__strat_set_pos(hpu_strat *s, int train, long step, long epoch);
/* The context of the passes so far (seed, rank, world, epoch, ...). */
const hpu_ctx *hpu__strat_ctx(const hpu_strat *s);

/* Forward pass over batch bt, micro-step `micro` of `accum`: training
 * runs the layers a loss depends on; evaluation (hpu__strat_set_pos's
 * train 0) those the losses and metrics depend on, or with want >= 0
 * those tensor `want` depends on. */
int hpu__strat_forward(hpu_strat *s, const hpu_batch *bt, int micro, int accum, int want);

/* For the next hpu__strat_forward only: 1 when its batch is held, the
 * host leaving bt's buffers as they are until this training step's
 * result has been read (hpu__strat_step_result waits for the device):
 * the batch then goes in without a wait (hpu__dev_copy_queued). The
 * loop says so for the loader's buffer at one micro-step (the loader
 * fills it again for the step after next, asked for after that read)
 * and for --graphs' input buffers (filled again at the next step). */
void hpu__strat_batch_held(hpu_strat *s, int held);

/* Tensor t after a forward (its rows of the batch) where the host may
 * read it (a copy where it may not read device memory), or NULL. */
const void *hpu__strat_tensor(hpu_strat *s, int t);

/* The loss of the last forward: the weighted sum of the loss tensors'
 * means over the batch (NaN or Inf as they come). */
double hpu__strat_loss(hpu_strat *s);

/* Backward pass after hpu__strat_forward() of the same batch: the loss
 * gradient multiplied by `scale`, seeded on the device from the loss's
 * sums (a non-finite loss gives NaN gradients: the step is then skipped
 * on every rank). The loss comes out after the step
 * (hpu__strat_step_result). */
int hpu__strat_backward(hpu_strat *s, float scale);

/* After the last micro-step: finishes the gradient communication, clips,
 * steps the optimizer with `lr` and brings the parameters back where the
 * next forward wants them. Whether the step is skipped, the clip factor
 * and the loss scale are decided on the device: unless the strategy is
 * recordable (hpu__strat_set_recordable), the host still reads some of
 * it inside the step, for diagnostics. */
int hpu__strat_step(hpu_strat *s, double lr);

/* After hpu__strat_step: reads the step's results back. *loss the mean of
 * its micro-steps' local losses; *grad_norm the global norm before
 * clipping where clipping is on and the step was not skipped, else 0.
 * Returns 0, or -1 with the error set where a check the ops deferred in
 * a recordable step found bad input (a label, an id, a probability:
 * worker/ops/checks.h); the run must end then, as it does when a
 * layer fails. */
int hpu__strat_step_result(hpu_strat *s, float *loss, double *grad_norm);

/* on: a training step brings nothing back to the host between the
 * first forward and the end of hpu__strat_step, as a recorded step
 * cannot (the eager step's readbacks that name the first non-finite
 * tensor or unit are left out; where the host takes part in the update,
 * the offloaded optimizer or the NVMe tier, it still reads). The ops'
 * checks of labels, ids and probabilities are deferred to the step's
 * end (worker/ops/checks.h: hpu__strat_step_result reports them) where
 * the kernel table writes host-readable memory; evaluation and eager
 * steps check as before. */
void hpu__strat_set_recordable(hpu_strat *s, int on);
int hpu__strat_recordable(const hpu_strat *s);

/* Why a training step cannot be recorded before any of it runs: the
 * host takes part in it (the offloaded optimizer, gradients or
 * parameters in host memory, the NVMe tier, a host-only layer staged
 * through host memory), one sentence; NULL where
 * it does not. A recording runs such host work at once on values the
 * device never computed (the optimizer's state stepped, the files
 * written): the runtime refuses the recording instead of beginning the
 * step in it. */
const char *hpu__strat_host_part(const hpu_strat *s);
/* The same of an evaluation's forward (a staged host-only layer, the
 * NVMe tier reading the parameters' pieces for zero3's gathers), or
 * NULL. */
const char *hpu__strat_forward_host_part(const hpu_strat *s);

/* An evaluation's loss and metrics summed on the device, read back once
 * at its end (a recordable strategy's: --graphs records evaluation
 * batches, HPU_STRICT_STEP=1), the same doubles as the host's sums of
 * hpu__strat_loss() x batch and of the metric tensors' values. open:
 * the sums zeroed; from then on the evaluation's forwards defer the
 * ops' checks as a recordable training step does. For each batch:
 * eval_rows (the host, before the batch's device work: its valid rows,
 * the first ones; rows past them, --pad-last-batch's padding, are left
 * out), hpu__strat_forward, eval_add (device work only: it can be
 * recorded), then eval_checks (after the batch's device work, replayed
 * or not: the deferred checks' findings, "evaluation: ..."). close:
 * sums[0] the loss's sum, sums[1 + k] metric k's. 0, or -1 with the
 * error set. */
int hpu__strat_eval_open(hpu_strat *s);
/* 1 where a forward holds collectives between the ranks (zero3's
 * gathers of the units that are not persistent): every rank must then
 * run as many forwards as the others. */
int hpu__strat_forward_meets(const hpu_strat *s);
void hpu__strat_eval_rows(hpu_strat *s, int rows);
int hpu__strat_eval_add(hpu_strat *s);
int hpu__strat_eval_checks(hpu_strat *s);
int hpu__strat_eval_close(hpu_strat *s, double *sums);

/* --graphs (issue 36). After a training step whose device work was
 * recorded (hpu__dev_capture_begin .. _end around its forwards,
 * backwards and hpu__strat_step: the host code ran, the device ran
 * nothing), what its replays need the strategy to hold again: the
 * micro-steps' batch sizes, the ops' deferred checks it armed. NULL when
 * out of memory. */
typedef struct hpu__strat_snap hpu__strat_snap;
hpu__strat_snap *hpu__strat_snap_take(hpu_strat *s);
/* Before launching that recording: restores them and puts `lr` into
 * the pinned block the recorded step copies its learning rate from
 * (NaN: left as it is, for a recorded evaluation batch);
 * then hpu__strat_step_result reads the replayed step's results as an
 * eager step's. 0, or -1 when out of memory. */
int hpu__strat_snap_replay(hpu_strat *s, const hpu__strat_snap *snap, double lr);
void hpu__strat_snap_free(hpu__strat_snap **snap);

/* Steps skipped for non-finite losses or gradients: in a row now, and in
 * all (the fp16 loss scaler's overflows excluded while it can still
 * lower the scale). */
int hpu__strat_bad_run(const hpu_strat *s);
long hpu__strat_bad_total(const hpu_strat *s);

/* Where a step's first non-finite value on this rank came from. A
 * micro-step whose loss is not finite looks, before its backward, through
 * the tensors its forward left (dataset fields, then each layer's outputs
 * in order): the first that holds an Inf or NaN. Those not there to look
 * at (freed after forward because no backward reads them, dropped by
 * activation checkpointing) are counted, and the last of them before the
 * one found is named: the value may have come from it. A step skipped
 * with finite losses names the first unit whose reduced gradients were
 * not finite (fp32). */
typedef struct hpu_nonfinite {
	int found;        /* 1: a tensor (below); 2: only a unit's gradients */
	int micro;        /* the micro-step (from 0) */
	int tensor;       /* a dataset field or a layer's output */
	long count, numel; /* non-finite values of it, of (its rows) */
	int unit;         /* found 2: the unit */
	int unchecked;    /* found 1: the last tensor before it not there to
			   * look at, or -1 */
	long nunchecked;  /* found 1: how many such tensors before it */
} hpu_nonfinite;

/* This step's first non-finite value (found 0: none), and forgets it. */
void hpu__strat_first_nonfinite(hpu_strat *s, hpu_nonfinite *out);

/* "output \"y\" of layer \"fc\"", "dataset field \"x\"" for a tensor (by
 * its producer), "the gradients of fc" for a unit (tensor -1). */
void hpu__strat_nonfinite_name(const hpu_strat *s, int tensor, int unit, char *out,
			       size_t outlen);

/* Every parameter consolidated, fp32, on every rank, into dst[psi] in
 * declaration order (unpadded); collective. */
int hpu__strat_gather_all(hpu_strat *s, float *dst);
/* The buffers (b->buffer_numel floats, the builder's layout), where the
 * host may read them: a copy where it may not read device memory (valid
 * until the next step). */
const float *hpu__strat_buffers(const hpu_strat *s);

/* Writes the consolidated fp32 parameters, each parameter's numel floats
 * in declaration order, to `path` on rank 0. Every rank must call it. */
int hpu__strat_save_params(hpu_strat *s, const char *path);

/* ---- checkpoints (strategy_ckpt.c) ---- */

/* The sections this strategy's checkpoints hold: "params", then the
 * optimizer's state. Returns their count (1 to 3). */
int hpu__strat_ckpt_sections(const hpu_strat *s, const char *names[3]);

/* The canonical segments rank r of this run saves, increasing and merged
 * (malloc'ed; *n may be 0). Under ZeRO, what the rank owns; otherwise,
 * every rank holding everything, the r-th of W equal slices. */
int hpu__strat_ckpt_segments(const hpu_strat *s, int r, hpu_ckpt_seg **segs, size_t *n);

/* Writes this rank's segments of every section into w. */
int hpu__strat_ckpt_write(hpu_strat *s, hpu_ckpt_writer *w);

/* The counters a checkpoint carries besides the floats. */
typedef struct hpu_strat_state {
	long opt_steps;     /* optimizer steps taken (skipped ones excluded) */
	double loss_scale;
	int hysteresis_left;
	long scaler_steps, last_overflow, skipped;
} hpu_strat_state;

void hpu__strat_get_state(const hpu_strat *s, hpu_strat_state *st);

/* Layout facts for logs and metrics. */
int hpu__strat_units(const hpu_strat *s);

/* Mixed precision: the loss scale now (1 unless 16-mixed) and the steps
 * skipped for a gradient overflow so far. */
double hpu__strat_loss_scale(const hpu_strat *s);
long hpu__strat_skipped(const hpu_strat *s);
/* The NVMe tier: bytes the swap files (--offload-optimizer nvme,
 * --offload-param nvme) have read and written, both and the parameters'
 * alone, and seconds waited for them (all 0 without the tier). */
typedef struct hpu_nvme_stats {
	uint64_t read, written;             /* both files */
	uint64_t param_read, param_written; /* the parameters' file */
	double wait_s;
} hpu_nvme_stats;
void hpu__strat_nvme_stats(const hpu_strat *s, hpu_nvme_stats *st);

/* ---- the placement plan (strategy_plan.c; worker/strategy/plan.h) ---- */

/* The model states (bytes) one rank keeps on the device for the whole
 * run, as the plan lays them out: its states, zero3's persistent units
 * and the buffers. The layers' passing states (mixed precision's fp32
 * copies, buckets, gathered layers) come on top. */
uint64_t hpu__strat_plan_states(const hpu_strat *s);
/* The model states that come and go on top, at their peak: mixed
 * precision's fp32 compute copy and gradients of the running layer (8
 * bytes a parameter of the largest layer), ZeRO-2/3's gradient buckets
 * (three consecutive units: one filling, two in flight) and zero3's
 * gathered layers (the one in use and --prefetch-bucket-size ahead).
 * *exact: 1 when that peak is reached exactly, 0 when it is a bound
 * (zero3: how much is gathered at once depends on the layers' order). */
uint64_t hpu__strat_plan_passing(const hpu_strat *s, int *exact);
/* The plan, a few lines (--verbose, rank 0). */
void hpu__strat_plan_print(const hpu_strat *s, FILE *f);
/* The plan as a JSON object (the checkpoint manifest's "placement"). */
cJSON *hpu__strat_plan_json(const hpu_strat *s);
/* The bytes one step must copy between host and device, as the plan
 * says (worker/strategy/copies.h). 0, or -1 out of memory. */
int hpu__strat_plan_copies(const hpu_strat *s, hpu_plan_copies *c);

void hpu__strat_free(hpu_strat **s);

#endif
