/* strategy_impl: the strategy's state and the internals its files share:
 *   strategy.c       making it, the layout, the optimizer step
 *   strategy_state.c the states' values: initial parameters
 *   strategy_base.c  errors, allocations, unit names (calls no other file)
 *   strategy_plan.c  the placement plan shown (worker/strategy/plan.c)
 *   strategy_pass.c  the forward and backward passes with their hooks
 *   strategy_sync.c  the gradients' collectives and buckets
 *   strategy_zero.c  ZeRO's parameter gathers and releases
 *   strategy_mp.c    mixed precision: 16-bit copies, master weights, loss scale
 *   strategy_act.c   the layers' outputs, activation checkpointing
 *   strategy_ckpt.c  checkpoints and --save-params
 *   strategy_nvme.c  the NVMe tier
 *   strategy_dcoll.c collectives on device buffers (staged where needed)
 *   strategy_vars.c  the step's scalars on the device (skip, clip, scale)
 * They call one way (tests/check_circles.sh): strategy.c on strategy_mp,
 * _sync, _zero, _act, _state; _pass on _sync, _zero, _act; _mp on _zero,
 * _state; _state on _ckpt; _sync, _zero and _vars on _dcoll; strategy.c,
 * _pass and _mp on _vars; _mp, _zero and
 * _ckpt on _nvme; everything on _base; under them plan.c, optim.c,
 * params_file.c and swap.c, which call no file of the folder. Their
 * work on tensors (casts, sums, non-finite checks, updates) is the device's
 * (worker/device: hpu__dev_to16, _sumsq, _nonfinite, ...).
 * Not for other users: other folders include only strategy.h
 * (tests/check_includes.sh). */
#ifndef HPU_STRATEGY_IMPL_H
#define HPU_STRATEGY_IMPL_H

#include <hpu/coll.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt.h"
#include "worker/device/device.h"
#include "worker/hpu/devmem.h"
#include "worker/hpu/model.h"
#include "worker/strategy/optim.h"
#include "worker/strategy/params_file.h"
#include "worker/strategy/strategy.h"
#include "worker/strategy/plan.h"

/* A unit is a run of consecutive layers whose parameters are communicated
 * together: a DDP or ZeRO-2 gradient bucket, a ZeRO-1 partition unit, one
 * layer under ZeRO-3, everything under fast_ddp. In the strategy's layout a
 * unit is the floats [off, off + len); under ZeRO, len is padded to a
 * multiple of 16 * world and rank r owns the piece [off + r*piece, off +
 * (r+1)*piece), found at shard_off in the shard buffers. */
typedef struct unit {
	int first, last;     /* layers */
	int nparam_layers;
	int pending;         /* of those, the ones whose backward is still due */
	size_t off, len, piece, shard_off;
	int persistent;      /* zero3: small enough to stay whole */
	void *full;          /* zero3: gathered (or persistent) parameters, in
			      * the plan's parameter dtype */
	hpucoll_req *gather; /* zero3: the gather of `full` in flight */
	void *gbuf;          /* zero2/3: the unit's gradients in backward, in
			      * the plan's gradient dtype (mixed: the 16-bit
			      * bucket being reduced) */
	uint16_t *cbuf;      /* bf16 staging of a gradient all-reduce */
	hpu_optim opt;
	float *opt_p;        /* what the optimizer updates, opt.n floats: the
			      * master weights where the plan keeps them, else
			      * the parameters (opt_w) */
	void *opt_w;         /* the working parameters of that range, in the
			      * plan's parameter dtype */
	void *opt_g;         /* its gradients, in the plan's gradient dtype */
	/* mixed precision */
	float *cp;           /* the fp32 compute copy of the parameters */
	float *gs;           /* fp32 gradients while the unit's backward runs */
} unit;

/* A gradient collective in flight; they complete in issue order. */
typedef struct flight {
	int unit;
	hpucoll_req *req;
} flight;

typedef struct hpu_nv hpu_nv;
typedef struct hpu_nvp hpu_nvp;

/* A strategy's hooks into the passes and the step, chosen once by
 * hpu__strat_new from the placement plan (the precision, the gradients'
 * collective); strategy_pass.c calls only these. */
typedef struct hpu__strat_hooks {
	/* the parameters' initial values (and the master weights), into
	 * the states strategy.c laid out */
	int (*init_params)(hpu_strat *s);
	/* layer i's own parameters ready for its call, prefetching what
	 * follows in direction dir (up to layer `stop`); released after */
	int (*acquire)(hpu_strat *s, int i, int dir, int stop);
	int (*release)(hpu_strat *s, int i);
	/* layer i's gradient buffers ready for its backward; complete after
	 * every backward that uses them (NULL: nothing to do) */
	int (*grads_for)(hpu_strat *s, int i);
	void (*grads_done)(hpu_strat *s, int i, int final);
	/* every layer of unit k has run its backward in this micro-step */
	int (*unit_done)(hpu_strat *s, int k, int final);
	/* at the step: the gradients' collectives finished; the update */
	int (*reduce)(hpu_strat *s);
	int (*step)(hpu_strat *s);
} hpu__strat_hooks;

struct hpu_strat {
	hpu_builder *b;
	hpucoll_comm *comm;
	const hpu_train_opts *o;
	hpu_strategy kind;
	hpu_plan plan;     /* where each state lives (worker/strategy/plan.h) */
	hpu__strat_hooks hooks; /* the strategy's, from the plan */
	int rank, world, sharded, nlayers;
	unit *u;
	int nunits;
	size_t total, shard_total;
	/* The model states in the plan's dtypes (hpu__strat_at): whole
	 * parameters, where kept, and zero3's parameter shard; whole
	 * gradients and zero2/3's gradient shard. */
	void *P, *PS;
	void *G, *GS;
	float *state;      /* optimizer state */
	int maxbatch;
	/* The graph's tensors (strategy_act.c): data, bf16 copies, gradients;
	 * per layer its saved memory; the shared scratch. */
	void **t_data;
	uint16_t **a16;       /* act16 (bf16-mixed, fp8): tensors kept in bf16 */
	float **t_grad;
	char *transient;      /* per tensor: dropped by activation checkpointing */
	char *unread;         /* per tensor: dropped after forward, no backward
			       * or recomputation reading it */
	char *nobwd;          /* per tensor: no backward reads it */
	char *keep32;         /* per tensor: not put into bf16 after forward
			       * (only the first backward to run reads it) */
	unsigned *inplace;    /* per layer: bit k, its backward writes din[k]
			       * over in[k] (hpu_layer_backward_in_place) */
	char *round16;        /* per tensor: kept as its bf16 rounding after
			       * forward (bf16-mixed; its backwards read it
			       * only as linear products' x) */
	int round_ok;         /* bf16-mixed: round16 may be set */
	void **saved;
	char *saved_transient; /* per layer: its saved memory goes with them */
	int *seg_start;       /* per layer: its checkpointing segment's first */
	void *scratch;
	int *last_train, *last_eval; /* per tensor: its last reader in forward */
	char *run_mask;       /* per layer: what hpu__strat_forward runs now */
	int *gusers, *gpend;  /* per layer: the backward calls that use its
			       * parameters (its own and its users'), left */
	hpu_ctx ctx;          /* of the pass in progress */
	int act16;            /* bf16-mixed, fp8: outputs kept in bf16 */
	flight *q;         /* FIFO of gradient collectives */
	int qhead, qn;
	int micro;         /* the micro-step in backward */
	int batch_held;    /* hpu__strat_batch_held, for the next forward */
	int fwd_want;      /* the forward's `want`: >= 0, a hook's hpu_run_forward */
	float **lcp, **lgs; /* mixed: per layer, fp32 parameters (their values
			     * made as read: hpu__ac_param16_add) / gradients */
	float *B;          /* buffers, whole on every rank */
	/* zero3's gathering (strategy_zero.c, strategy_mp.c) */
	struct {
		size_t live;      /* gathered floats alive (not persistent) */
		int keep;         /* the last layer training's forward gathers,
				   * kept gathered into its backward, which
				   * comes next (DeepSpeed's
				   * stage3_max_reuse_distance, minimal form),
				   * or -1 */
		int keep_armed;   /* a whole training forward is running */
		uint16_t **own16; /* mixed: per layer, the gathered 16-bit
				   * unit it holds while it runs */
	} z3;
	/* Mixed precision (s->plan.mixed; fp16 or bf16: s->plan.fp16): 16-bit
	 * working parameters and gradients (whole or shards, as the fp32 ones
	 * otherwise), fp32 master weights in the optimizer's space, 16-bit
	 * traffic. */
	float *M;          /* master weights */
	float *chunk;      /* gradients converted for the optimizer */
	/* The steps: the loss scale, skipped and non-finite steps. */
	struct {
		double scale;   /* the loss scale (1 unless 16-mixed) */
		int hyst_left;  /* overflows left before the scale halves */
		long step_no, last_overflow, skipped;
		int bad_run;    /* steps skipped in a row (non-finite) */
		long bad_total;
		hpu_nonfinite first_bad; /* this step's first non-finite value */
		int injected;   /* --inject-overflow-step done this step */
	} steps;
	char *err;
	size_t errlen;
	int load_fd;             /* --load-params, or -1 */
	hpu_ckpt *resume;        /* --resume: the checkpoint to start from */
	uint64_t *canon;         /* checkpoints: parameter i's first float in
				  * the canonical space (ckpt.h) */
	hpu_nv *nv;              /* --offload-optimizer nvme: the optimizer's
				  * space in a swap file (s->state, s->M and
				  * the units' opt.m, opt.v and, mixed, opt_p
				  * are NULL then) */
	hpu_nvp *nvp;            /* --offload-param nvme: the parameter
				  * shard in a swap file (s->PS is NULL; a
				  * unit's piece is in memory, at opt_w, only
				  * while used) */
	double *lsum, *lsum_host; /* the loss terms' sums on the device, and
				   * the host's copy (hpu__strat_loss) */
	/* strategy_eval.c: an evaluation's sums on the device (acc: the
	 * loss's and each metric's, read once at its end into acc_host);
	 * its loss terms' sums for one batch, their weights (lsum, w: nloss
	 * each); the batch's valid rows (rows, copied from rows_host, pinned,
	 * with the batch); on: between hpu__strat_eval_open and _close (a
	 * recordable strategy's evaluation forward defers the ops' checks) */
	struct {
		double *acc, *acc_host, *lsum, *w;
		int *rows, *rows_host;
		int on;
	} ev;
	/* strategy_vars.c: the step's scalars on the device, so that a
	 * training step brings nothing back to the host (issue 36's
	 * recorded steps). sv in device memory; svh the host's copy as last
	 * read (after each step; inside it too where the host decides
	 * something from it: vars.known); lr_host the pinned block the
	 * step's learning rate and beta powers are copied from (sv->lr,
	 * bp1, bp2; [3]: the host's norm, copied over); msum the micro-steps' loss
	 * sums [accum][nloss] on the device (msum_host: their copy),
	 * mbatch their batch sizes. */
	struct {
		hpu__dev_stepvars *sv, *svh;
		double *lr_host;
		hpu__dev_stepcfg cfg;
		double *msum, *msum_host;
		int *mbatch;
		int cap;        /* micro-steps msum holds */
		int micros;     /* this step's so far */
		int known;      /* svh holds this step's decisions */
		int recordable; /* no readback inside a step (the diagnostics
				 * that need one are left out) */
		float *flag_host; /* pinned: a host-side check's finding */
		/* recordable: the ops' checks' findings (worker/ops/checks.h)
		 * on the device, read after the step (checks_host) */
		void *checks, *checks_host;
		int checks_armed; /* this step's forwards take slots */
		int checks_used;  /* slots the step used, for the result */
		/* recordable: dropout's keys made on the device
		 * (worker/ops/dropkeys.h, keys_ready): step_host the pinned
		 * step copied to sv->step, the micro-batch's sample indices
		 * (dk_samples; in place where the host reads device memory)
		 * and the keys (dk_keys, maxbatch each); dk_fresh: this
		 * micro-batch's are on the device */
		int64_t *step_host;
		uint32_t *dk_samples;
		uint64_t *dk_keys;
		int dk_fresh;
	} vars;
	/* strategy_dcoll.c: the gradients' all-reduce on the device itself,
	 * between the ranks of one node (the device's collectives, CUDA
	 * IPC), where hpu__dc_open made the group; else staged. */
	struct {
		struct hpu__dev_group *group;
		int rc;         /* the last exchange's libhpucoll code */
		char why[256];  /* where staged: why */
	} dc;
	/* Staging: what crosses between the host and the device. */
	struct {
		void *coll;        /* strategy_dcoll.c: pinned host staging of
				    * the collectives where the host may not
				    * read device memory */
		size_t coll_bytes;
		void *update;      /* strategy_base.c: the optimizer's staging
				    * across the bus, on the update's side */
		float *bsync;      /* the buffers' step collectives */
		void **t_host;     /* per tensor: the host's copy that
				    * hpu__strat_tensor returns where the
				    * host may not read device memory, or
				    * NULL */
		struct hpu__lstage **lstage; /* strategy_host.c: per layer,
				    * a host-only layer's staging, or NULL */
	} stg;
};

/* strategy_host.c: a host-only layer (HPU_LAYER_HOST_ONLY) where the host
 * may not read device memory runs on host copies of its tensors.
 * hpu__host_staged: 1 when layer i's calls are staged. stage_in points
 * the views, the layer's (and its shared parameters' owners') parameters,
 * gradients, buffers, saved and scratch memory at host copies (din: in
 * backward only); stage_out copies back what the call wrote (where rc is
 * 0) and points everything at the device again. */
int hpu__host_staged(const hpu_strat *s, int i);
int hpu__host_stage_in(hpu_strat *s, int i, int backward, hpu_tensor *in, hpu_tensor *out,
		       hpu_tensor *dout, hpu_tensor *din);
void hpu__host_stage_out(hpu_strat *s, int i, int backward, int rc);
void hpu__host_stage_free(hpu_strat *s);
/* strategy_written.c: on cpu-strict (not while recording), the fp32
 * views v of layer i's outputs (backward 0) or dins (1), but those whose
 * bit is set in skip, marked before the call; after it, check fails
 * naming the layer and the tensor where a value was left unwritten. */
void hpu__written_mark(const hpu_strat *s, int i, int backward, const hpu_tensor *v,
		       unsigned skip);
int hpu__written_check(hpu_strat *s, int i, int backward, const hpu_tensor *v, unsigned skip);
/* Why a recording of a training step (eval 0) or an evaluation batch
 * (eval 1) cannot hold its host-only layers: the first staged layer that
 * runs there, named (a sentence in a static buffer), or NULL. Its host
 * code would run while recording, on whatever the staging buffers last
 * held, and not at the replays. */
const char *hpu__host_stage_unrecordable(const hpu_strat *s, int eval);
/* The bytes one training micro-step of `micro` samples stages (0 where
 * nothing is staged); 1 where they are a floor (a staged layer under
 * activation checkpointing runs its forward again), else 0. */
int hpu__host_stage_plan(const hpu_strat *s, int micro, uint64_t *h2d, uint64_t *d2h);

/* What the plan says, as the strategy files ask it: zero3 shards the
 * working parameters (gathered per layer), zero2/3 the gradients
 * (reduce-scattered per bucket, no whole gradient kept). */
static inline int hpu__strat_params_sharded(const hpu_strat *s)
{
	return s->plan.e[HPU_PLAN_PARAMS].sharded;
}

static inline int hpu__strat_grads_sharded(const hpu_strat *s)
{
	return s->plan.e[HPU_PLAN_GRADS].sharded;
}

/* Bytes of one value of state st as the plan keeps it (fp32 4, 16-bit 2). */
static inline size_t hpu__strat_esize(const hpu_strat *s, hpu_plan_state st)
{
	return hpu__plan_esize(&s->plan.e[st]);
}

/* The element i of a buffer of state st at base (NULL stays NULL). */
static inline void *hpu__strat_at(const hpu_strat *s, hpu_plan_state st, const void *base,
				  size_t i)
{
	return base ? (char *)(uintptr_t)base + i * hpu__strat_esize(s, st) : NULL;
}

/* The layers compute on the parameters and gradients the plan keeps
 * (fp32), not on fp32 copies made per layer (mixed: strategy_mp.c). */
static inline int hpu__strat_direct(const hpu_strat *s)
{
	return s->plan.e[HPU_PLAN_PARAMS].dtype == HPU_PLAN_FP32;
}

/* The plan keeps master weights apart from the parameters (mixed). */
static inline int hpu__strat_has_master(const hpu_strat *s)
{
	return s->plan.e[HPU_PLAN_MASTER].where != HPU_PLAN_NOWHERE;
}

/* The collectives' dtype of state st. */
static inline hpucoll_dtype hpu__strat_cdt(const hpu_strat *s, hpu_plan_state st)
{
	switch (s->plan.e[st].dtype) {
	case HPU_PLAN_BF16:
		return HPUCOLL_BF16;
	case HPU_PLAN_FP16:
		return HPUCOLL_F16;
	default:
		return HPUCOLL_F32;
	}
}

/* A layer's saved and scratch floats (hpu_layer_memory) at the largest
 * batch: checked against overflow once, at setup (strategy.c's
 * memory_floats refuses the layer), so not again here. */
static inline size_t hpu__strat_saved_floats(const hpu_strat *s, const hpu_layer *l)
{
	return (size_t)s->maxbatch * l->saved_ps + l->saved_fixed;
}

static inline size_t hpu__strat_scratch_floats(const hpu_strat *s, const hpu_layer *l)
{
	return (size_t)s->maxbatch * l->scratch_ps + l->scratch_fixed;
}

/* Floats converted at a time for the optimizer (s->chunk). */
#define HPU__STRAT_CHUNK 16384

/* The length of the chunk at i of n floats. */
static inline size_t hpu__strat_chunk(size_t n, size_t i)
{
	return n - i < HPU__STRAT_CHUNK ? n - i : HPU__STRAT_CHUNK;
}

/* ---- strategy_base.c ---- */

/* A sentence into s->err; returns -1. */
int hpu__strat_fail(hpu_strat *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "<what> failed: <the communicator's error>" into s->err; returns -1. */
int hpu__strat_coll_fail(hpu_strat *s, const char *what, int rc);
/* Device memory for `what`, or NULL with the allocator's sentence in err. */
void *hpu__strat_dalloc(hpu_strat *s, hpu_mem_kind kind, size_t bytes, const char *what);
/* The name of unit k (its first layer's), for messages. */
const char *hpu__strat_unit_name(const hpu_strat *s, int k);
/* Gradients owed zeros (worker/ops/autocast.h, hpu__ac_fresh_add): layer
 * i's gradients may be left unzeroed for the ops to claim when it hands
 * them only to the ops (hpu_layer_grads_in_ops), no other layer uses its
 * parameters and the ops' zeros reach the memory (hpu__strat_fresh_ok:
 * hpu__dev_ops_fill, the host's memset where it may touch it, else the
 * kernel table's zero entry, which a recording keeps: a recorded step
 * makes the same claims every replay). Then
 * hpu__strat_fresh_add(s, i, g, g16) registers each parameter's range of
 * its gradients g[0 .. plen) (with its padding), with the place of their
 * bf16 rounding g16[0 .. plen) when not NULL (hpu__ac_fresh_add16); 0, or
 * -1 when out of memory (nothing left registered: g is to be zeroed as
 * ever). */
int hpu__strat_fresh_ok(const hpu_strat *s, int i);
int hpu__strat_fresh_add(hpu_strat *s, int i, float *g, uint16_t *g16);
/* Points the layers of unit k at parameters starting at `p` (the unit's
 * first float) or gradients at `g` (NULL: leave as is). */
void hpu__strat_point(hpu_strat *s, int k, float *p, float *g);
/* The plan's sides: 1 when the optimizer's update runs on the host
 * (--offload-optimizer cpu, nvme); when the gradients it reads are in
 * host memory. */
int hpu__strat_update_host(const hpu_strat *s);
int hpu__strat_grads_host(const hpu_strat *s);
int hpu__strat_params_host(const hpu_strat *s);
/* s->stg.update, where something crosses to the update; freed by _close. */
int hpu__strat_ustage_open(hpu_strat *s);
void hpu__strat_ustage_close(hpu_strat *s);
/* One optimizer update (o->t counting this step) over floats [from, from
 * + n) of o's range: p the fp32 parameters (mixed precision: the master
 * weights), g their gradients, w the working parameters (all in the
 * plan's dtypes; where the plan keeps master weights the update is
 * rounded into w, else w is p); on the side the plan runs the update,
 * what is kept on the other crossing by counted copies
 * (strategy_base.c). */
void hpu__strat_update(hpu_strat *s, hpu_optim *o, size_t from, size_t n, float *p,
		       const void *g, void *w, float gscale, double lr);
/* 1 when gradients g[n] (mixed: 16-bit) hold an Inf or NaN, where they
 * are kept (host memory or the device's). */
int hpu__strat_nonfinite(const hpu_strat *s, const void *g, size_t n);
/* Gradients g[n] in host memory (hpu__strat_grads_host; mixed: 16-bit,
 * widened chunk by chunk into s->chunk): their sum of squares added to
 * *acc by the host. (On the device the norm adds into the step's
 * scalars: strategy_vars.c.) */
void hpu__strat_sumsq_host(hpu_strat *s, double *acc, const void *g, size_t n);
/* Gradients src[n] added into dst[n], both in the plan's gradient dtype,
 * by the host (host: memory the host reads) or the device. */
void hpu__strat_gacc(hpu_strat *s, int host, void *dst, const void *src, size_t n);
/* ---- strategy.c ---- */

/* s->state: the optimizer's floats for the parameters this rank updates.
 * 0, or -1 (s->err). */
int hpu__strat_alloc_optim(hpu_strat *s);
/* Unit j's optimizer over the floats this rank updates (its piece under
 * ZeRO, the whole unit otherwise), with its part of s->state. */
void hpu__strat_optim_init(hpu_strat *s, int j);
/* ---- strategy_state.c ---- */

/* Unit j's initial parameters into full[0 .. len): from the initializers,
 * --load-params, or (--resume) the checkpoint's master weights; a ZeRO-3
 * unit not kept whole reads only this rank's piece of the checkpoint. */
int hpu__strat_fill_unit(hpu_strat *s, int j, float *full);
/* The same for the unit's floats [c0, c1) into buf[0 .. c1 - c0), the
 * rest zero: [c0, c1) holds whole layers (or only the unit's padding). */
int hpu__strat_fill_span(hpu_strat *s, int j, size_t c0, size_t c1, float *buf);
/* ---- strategy_vars.c: the step's scalars on the device ---- */

/* Makes s->vars once the strategy's state is set (after a resume): the
 * device's block from the host's copy of the scaler and the units'
 * step count; every unit's update then reads it (hpu_optim.sv). */
int hpu__vars_open(hpu_strat *s);
void hpu__vars_close(hpu_strat *s);
/* Before a step: its learning rate into the block. */
void hpu__vars_lr(hpu_strat *s, double lr);
/* Dropout's keys on the device where the strategy is recordable
 * (worker/ops/dropkeys.h): the training step's number into the pinned
 * block (hpu__strat_set_pos: before a replay too), and, at each forward
 * (hpu__strat_forward), the ops told where the micro-batch's keys come
 * from. */
void hpu__vars_step(hpu_strat *s, int train, long step);
void hpu__vars_keys(hpu_strat *s);
/* Backward of micro-step s->ctx.micro: the loss terms' sums on the
 * device (hpu__vars_sums: where, for loss_seed). */
int hpu__vars_loss(hpu_strat *s);
const double *hpu__vars_sums(const hpu_strat *s, int micro);
/* A loss from its terms' sums over `batch` samples (host memory): the
 * terms' weighted means, in double (a micro-step's; evaluation's). */
double hpu__vars_loss_of(const hpu_strat *s, const double *sums, int batch);
/* Micro-step m's loss read back now (the eager step's diagnostics). */
double hpu__vars_micro_loss(hpu_strat *s, int m);
/* The step's decisions on the device: the non-finite flag (all ranks'),
 * the norm where clipping, step_begin; read back into vars.svh (known
 * set) where the host takes part in the update or the step is eager. */
int hpu__vars_decide(hpu_strat *s);
/* 1 where the host reads the step's decisions inside the step: an eager
 * (not recordable) step, or the host taking part in the update
 * (offloaded optimizer, gradients or parameters, the NVMe tier). */
int hpu__vars_host_decides(const hpu_strat *s);
/* After the update: step_end (the scaler). */
void hpu__vars_end(hpu_strat *s);
/* After the step: the block and the loss sums read back; the step's mean
 * loss over its micro-steps, its norm (0 without clipping or when
 * skipped) and whether it was skipped; the host's copies of the scaler
 * and the units' step counts updated. Then the ops' deferred checks:
 * 0, or -1 with the first finding as the strategy's error. */
int hpu__vars_result(hpu_strat *s, float *loss, double *grad_norm, int *skipped);
/* A recordable training step's first forward: the ops' checks write
 * their findings into the device's slots from now on (checks.h); 0, or
 * -1 with the error set. */
int hpu__vars_checks_arm(hpu_strat *s);
/* The step's end (hpu__strat_step): the ops check eagerly again; the
 * slots the step used are kept for hpu__vars_result. */
void hpu__vars_checks_end(hpu_strat *s);
/* The deferred checks' slots read back after a step (`what` NULL:
 * the finding's sentence begins "step N: ") or an evaluation batch
 * ("evaluation: "): 0, or -1 with the first finding as the error. */
int hpu__vars_checks_result(hpu_strat *s, const char *what);

/* ---- strategy_sync.c: the gradients' collectives ---- */

/* strategy_dcoll.c: the strategies' collectives on device buffers, as
 * libhpucoll's hpucoll_iall_reduce, hpucoll_ireduce_scatter and
 * hpucoll_iall_gather. Where the host may read device memory (cpu) they
 * are those calls. Where it may not (cpu-strict) the buffers go through
 * pinned host staging: copied out, the collective run there at once
 * (after those in flight, as libhpucoll orders them) and the result
 * copied back, the all-reduce in chunks; *req is NULL then, nothing is
 * left in flight. Return libhpucoll's codes. */
int hpu__dc_iall_reduce(hpu_strat *s, const void *send, void *recv, size_t count,
			hpucoll_dtype dt, hpucoll_op op, hpucoll_req **req);
int hpu__dc_ireduce_scatter(hpu_strat *s, const void *send, void *recv, size_t recvcount,
			    hpucoll_dtype dt, hpucoll_op op, hpucoll_req **req);
int hpu__dc_iall_gather(hpu_strat *s, const void *send, void *recv, size_t sendcount,
			hpucoll_dtype dt, hpucoll_req **req);
/* ddp and fast_ddp on a device with collectives of its own (cuda), the
 * ranks on one node: the group the gradients' all-reduces run in, device
 * memory to device memory (nothing staged), made now by every rank at
 * once. Elsewhere, or where the device refuses (CUDA IPC unsupported:
 * one warning on rank 0), nothing: the all-reduces stay staged and
 * s->dc.why says why. 0, or -1 (s->err) where the ranks' exchange
 * failed. hpu__dc_free closes the group. */
int hpu__dc_open(hpu_strat *s);
/* 1 when the gradients' all-reduces run in the device's group. */
int hpu__dc_direct(const hpu_strat *s);
/* hpucoll_wait for a request of the above (a NULL one is done). */
int hpu__dc_wait(hpucoll_req **req);
void hpu__dc_free(hpu_strat *s);
/* zero2/3 fp32: unit k's gradient bucket, made if not there yet. */
int hpu__sync_grads_for(hpu_strat *s, int k);
/* Every layer of unit k has run its backward in this micro-step: starts
 * its collective where the strategy does it now. */
int hpu__sync_unit_done(hpu_strat *s, int k, int final);
/* Lands the collectives that have completed, without waiting. */
int hpu__sync_poll(hpu_strat *s);
/* Waits for every collective in flight, and lands them. */
int hpu__sync_drain(hpu_strat *s);
/* At the step: the gradients' collectives not done yet, all landed. */
int hpu__sync_reduce(hpu_strat *s);

/* ---- strategy_zero.c: ZeRO's parameters ---- */

/* fp32 zero3: layer i's unit gathered and the layer pointed at it,
 * prefetching the units after layer i in direction dir (stopping before
 * layer `stop`). Other strategies: nothing to do. */
int hpu__zero_acquire(hpu_strat *s, int i, int dir, int stop);
/* Starts gathers of the units after layer i in direction dir (stopping
 * before layer `stop`), up to the prefetch and live-parameter budgets. */
int hpu__zero_prefetch(hpu_strat *s, int i, int dir, int stop);
/* zero3: unit k gathered (started now if it was not prefetched) and the
 * gather waited for. */
int hpu__zero_gather_wait(hpu_strat *s, int k);
/* fp32 zero3: frees unit k's gathered parameters. */
int hpu__zero_release(hpu_strat *s, int k);
/* After backward: every gathered unit and fp32 copy freed. */
int hpu__zero_release_all(hpu_strat *s);
/* After the optimizer: zero1/2 gather every unit in place, zero3 only
 * its persistent units. */
int hpu__zero_gather_params(hpu_strat *s);

/* ---- strategy_mp.c: mixed precision ---- */

/* The initial values of the 16-bit parameters and the master weights,
 * laid out by strategy.c's alloc_states. 0, or -1 (s->err). */
int hpu__mp_init_params(hpu_strat *s);
/* Layer i's fp32 compute copy, before its forward or backward (zero3:
 * gathered first, prefetching as hpu__zero_acquire); freed after. */
void *hpu__strat_salloc(hpu_strat *s, hpu_offload where, hpu_mem_kind kind, size_t bytes,
			const char *what);
int hpu__mp_acquire(hpu_strat *s, int i, int dir, int stop);
void hpu__mp_release_layer(hpu_strat *s, int i);
/* Layer i's fp32 gradients for its backward; after it, into the 16-bit
 * ones. */
int hpu__mp_grads_for(hpu_strat *s, int i);
void hpu__mp_grads_done(hpu_strat *s, int i, int final);
/* The optimizer step on the master weights, skipped on every rank after
 * an overflow on any; the loss scale updated (on the device). */
int hpu__mp_step(hpu_strat *s);

/* ---- strategy_act.c: tensors, their gradients, saved memory ---- */

/* Activation checkpointing: which tensors and saved memory are dropped
 * (s->transient, s->saved_transient) and the segments (s->seg_start);
 * then the tensors no backward reads (s->unread). */
void hpu__act_plan(hpu_strat *s);
/* Layer l's backward reads its input k / output k
 * (hpu_layer_backward_reads). */
static inline int hpu__act_reads_in(const hpu_layer *l, int k)
{
	return (int)(l->reads_in >> k & 1u);
}
static inline int hpu__act_reads_out(const hpu_layer *l, int k)
{
	return (int)(l->reads_out >> k & 1u);
}

/* Tensor t's fp32/i32 buffer exists (made if not; dataset fields are the
 * batch's). 0, or -1 (s->err). */
int hpu__act_ensure(hpu_strat *s, int t);
/* Frees tensor t, both forms (not a dataset field). */
void hpu__act_drop(hpu_strat *s, int t);
/* Tensor t is kept (fp32 or bf16). */
int hpu__act_kept(const hpu_strat *s, int t);
/* act16: keeps tensor t (n rows) in bf16 where it is exact, freeing the
 * fp32 one (not where the strategy is recordable: it stays fp32). 0, or
 * -1 (s->err). */
int hpu__act_compress(hpu_strat *s, int t, int n);
/* act16: tensor t as fp32 again (for backward). 0, or -1. */
int hpu__act_expand(hpu_strat *s, int t, int n);
/* act16, once backward is done with t: frees its fp32 form if a bf16 one
 * is kept. */
void hpu__act_release(hpu_strat *s, int t);
/* Layer i's saved memory exists (made if not and it declared some); 0 or
 * -1. Dropped with hpu__act_saved_drop. */
int hpu__act_saved(hpu_strat *s, int i);
void hpu__act_saved_drop(hpu_strat *s, int i);
/* The gradient buffer of tensor t (made, zeroed when `zero`, if not
 * there), or NULL (s->err). */
float *hpu__act_grad(hpu_strat *s, int t, int zero);
void hpu__act_grad_drop(hpu_strat *s, int t);
/* --verbose: how the activations are kept between forward and backward
 * (the placement plan's lines). */
void hpu__act_describe(const hpu_strat *s, FILE *f);
/* Tensor t's memory (fp32, there) as its gradient buffer, for a backward
 * that writes the gradient over it (s->inplace); its values and bf16 form
 * go. */
float *hpu__act_grad_in_place(hpu_strat *s, int t);

/* ---- strategy_nvme.c: the optimizer's space on NVMe ---- */

/* --offload-optimizer nvme: the sub-groups, the swap file under
 * --nvme-path (checked now: missing, unwritable, tmpfs, too small) and the
 * buffers; s->nv. 0, or -1 (s->err). */
int hpu__nv_open(hpu_strat *s);
void hpu__nv_close(hpu_strat *s);
/* Section k (0 the master weights, 1 m / the momentum, 2 v) of the
 * optimizer's space is in the swap file. */
int hpu__nv_has(const hpu_strat *s, int k);

typedef enum hpu__nv_mode {
	HPU_NV_READ,   /* read each sub-group */
	HPU_NV_UPDATE, /* read, then write back */
	HPU_NV_FILL,   /* start from zeros, write: nothing read */
} hpu__nv_mode;
/* fn(s, layout position, n, floats, arg) on section k of unit j's owned
 * range, one sub-group at a time; fn returns 0 or -1 (s->err). */
typedef int (*hpu__nv_fn)(hpu_strat *s, size_t from, size_t n, float *sec, void *arg);
int hpu__nv_each(hpu_strat *s, int j, int k, hpu__nv_mode mode, hpu__nv_fn fn, void *arg);
/* Section k of unit j's owned range into dst[n] / the master weights
 * (mixed precision) from master[n] with zero moments, n its length. */
int hpu__nv_get(hpu_strat *s, int j, int k, float *dst);
int hpu__nv_fill(hpu_strat *s, int j, const float *master);
/* The optimizer step over every sub-group, its transfers overlapped. */
int hpu__nv_step(hpu_strat *s, float gscale, double lr);

/* --offload-param nvme: the parameter store and its buffers, after the
 * units' opt_w are set (s->nvp). 0, or -1 (s->err). */
int hpu__nvp_open(hpu_strat *s);
void hpu__nvp_close(hpu_strat *s);
/* Starts reading unit k's piece if a buffer is free (0 also when none is). */
int hpu__nvp_fetch(hpu_strat *s, int k);
/* Unit k's piece is in memory, or its read started. */
int hpu__nvp_fetched(const hpu_strat *s, int k);
/* Unit k's piece in memory (read: its values read from the file, else as
 * the buffer holds them, to be overwritten) -- u->opt_w -- or
 * NULL (s->err). It stays until dropped or its buffer is taken. */
void *hpu__nvp_get(hpu_strat *s, int k, int read);
/* Starts writing unit k's piece back (after it was changed). */
int hpu__nvp_put(hpu_strat *s, int k);
/* Unit k's piece (every unit's) out of memory, transfers waited for. */
int hpu__nvp_drop(hpu_strat *s, int k);
int hpu__nvp_drop_all(hpu_strat *s);
/* The optimizer step comes to unit k, in order: its piece read in (the
 * next one's read started), the previous unit's written back; k = nunits
 * at the end. 0, or -1 (s->err). */
int hpu__nvp_step_at(hpu_strat *s, int k);

/* ---- strategy_ckpt.c, for strategy.c ---- */

/* Floats [from, from + n) of the strategy's layout (within one unit) of
 * checkpoint section `section` into dst[n]; padding gets zeros. */
int hpu__strat_read_layout(hpu_strat *s, int section, size_t from, size_t n, float *dst);

/* The buffers (s->B) from s->resume. */
int hpu__strat_resume_buffers(hpu_strat *s, float *dst);

/* After the parameters: the optimizer state and counters from s->resume. */
int hpu__strat_resume_state(hpu_strat *s);

#endif
