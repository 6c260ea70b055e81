/* strategy_vars.c: the step's scalars on the device (device.h,
 * hpu__dev_stepvars). A training step decides on the device whether it
 * is skipped (a gradient holding Inf or NaN on some rank), by how much
 * the gradients are clipped and how 16-mixed's loss scale moves; the
 * losses' gradients are seeded there from the losses' sums. Nothing of
 * it comes back to the host inside the step, so that a step can be
 * recorded and replayed (issue 36) with its decisions in it; the host
 * reads the block and the micro-steps' loss sums once the step is done
 * (hpu__vars_result), and keeps its copy of the scaler's state for logs
 * and checkpoints.
 *
 * Where the host itself takes part in the step (the update or the
 * gradients on the host, the NVMe tier) it reads the decisions inside
 * the step (vars.known); so does an eager step, for the diagnostics
 * that name the first non-finite tensor, unless the strategy is marked
 * recordable. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/device/device.h"
#include "worker/ops/checks.h"
#include "worker/ops/dropkeys.h"
#include "worker/strategy/strategy_impl.h"

/* The ops' checks one step may defer (a micro-step's forward takes one
 * or a few: its losses', embeddings' and key masks'); past them, the ops
 * check eagerly. */
#define CHECK_SLOTS 256

/* Reads the device's block into the host's copy (hpu__dev_copy: a d2h copy
 * where the host may not read device memory, else memcpy, not counted). */
static void read_vars(hpu_strat *s)
{
	hpu__dev_copy(s->vars.svh, s->vars.sv, sizeof *s->vars.sv);
}

/* Room for m micro-steps' loss sums. */
static int grow(hpu_strat *s, int m)
{
	size_t per = (size_t)s->b->nloss * sizeof(double);
	int cap = s->vars.cap ? s->vars.cap : 1;
	while (cap < m)
		cap *= 2;
	double *d = hpu__strat_dalloc(s, HPU_MEM_OTHER, (size_t)cap * per, "micro-steps' loss sums");
	double *h = hpu__dev_host_alloc((size_t)cap * per);
	int *mb = calloc((size_t)cap, sizeof *mb);
	if (!d || !h || !mb) {
		hpu__dfree(d);
		hpu__dev_host_free(h);
		free(mb);
		return d ? hpu__strat_fail(s, "out of host memory for the loss sums") : -1;
	}
	if (s->vars.cap) { /* the micro-steps already summed stay */
		hpu__dev_copy(d, s->vars.msum, (size_t)s->vars.cap * per);
		memcpy(mb, s->vars.mbatch, (size_t)s->vars.cap * sizeof *mb);
	}
	hpu__dfree(s->vars.msum);
	hpu__dev_host_free(s->vars.msum_host);
	free(s->vars.mbatch);
	s->vars.msum = d;
	s->vars.msum_host = h;
	s->vars.mbatch = mb;
	s->vars.cap = cap;
	return 0;
}

int hpu__vars_open(hpu_strat *s)
{
	const hpu_train_opts *o = s->o;
	if (!(s->vars.sv = hpu__strat_dalloc(s, HPU_MEM_OTHER, sizeof *s->vars.sv, "step's scalars")))
		return -1;
	s->vars.svh = hpu__dev_host_alloc(sizeof *s->vars.svh);
	s->vars.lr_host = hpu__dev_host_alloc(4 * sizeof *s->vars.lr_host);
	s->vars.flag_host = hpu__dev_host_alloc(sizeof *s->vars.flag_host);
	s->vars.step_host = hpu__dev_host_alloc(sizeof *s->vars.step_host);
	if (!s->vars.svh || !s->vars.lr_host || !s->vars.flag_host || !s->vars.step_host)
		return hpu__strat_fail(s, "out of host memory for the step's scalars");
	s->vars.cfg = (hpu__dev_stepcfg){
		.clip_norm = o->clip_norm,
		.mixed = s->plan.mixed,
		.fp16 = s->plan.fp16,
		.dynamic = s->plan.fp16 && o->loss_scale <= 0,
		.hysteresis = o->hysteresis,
		.window = o->loss_scale_window,
		.min_scale = o->min_loss_scale,
	};
	*s->vars.svh = (hpu__dev_stepvars){
		.t = s->nunits ? s->u[0].opt.t : 0,
		.gscale = 1.0f,
		.loss_scale = s->steps.scale,
		.step_no = s->steps.step_no,
		.last_overflow = s->steps.last_overflow,
		.hyst_left = s->steps.hyst_left,
		.skipped = s->steps.skipped,
	};
	hpu__dev_copy(s->vars.sv, s->vars.svh, sizeof *s->vars.sv);
	for (int k = 0; k < s->nunits; k++)
		s->u[k].opt.sv = s->vars.sv;
	/* the micro-steps' loss sums: made now, not inside a step */
	return grow(s, o->grad_accum > 0 ? o->grad_accum : 1);
}

void hpu__vars_close(hpu_strat *s)
{
	if (s->vars.checks) {
		hpu__checks_disarm();
		hpu__checks_free();
	}
	hpu__dfree(s->vars.checks);
	hpu__dev_host_free(s->vars.checks_host);
	hpu__dfree(s->vars.sv);
	hpu__dfree(s->vars.msum);
	hpu__dev_host_free(s->vars.svh);
	hpu__dev_host_free(s->vars.lr_host);
	hpu__dev_host_free(s->vars.flag_host);
	hpu__dev_host_free(s->vars.msum_host);
	free(s->vars.mbatch);
	hpu__dropkeys_set(NULL);
	hpu__dev_host_free(s->vars.step_host);
	hpu__dfree(s->vars.dk_samples);
	hpu__dfree(s->vars.dk_keys);
	memset(&s->vars, 0, sizeof s->vars);
}

/* The step's learning rate and beta1^t, beta2^t for the t its update
 * would have (the last step's, as read after it, plus one) into the
 * pinned block copied to sv->lr, bp1, bp2. */
static void put_lr(hpu_strat *s, double lr)
{
	double t = (double)(s->vars.svh->t + 1);
	s->vars.lr_host[0] = lr;
	s->vars.lr_host[1] = pow(s->o->beta1, t);
	s->vars.lr_host[2] = pow(s->o->beta2, t);
}

void hpu__vars_lr(hpu_strat *s, double lr)
{
	put_lr(s, lr);
	/* not waited for: the block is written again only by the next step,
	 * after this one's result was read (hpu__vars_result: a wait) */
	hpu__dev_copy_queued(&s->vars.sv->lr, s->vars.lr_host, 3 * sizeof lr);
}

const double *hpu__vars_sums(const hpu_strat *s, int micro)
{
	return s->vars.msum + (size_t)micro * (size_t)s->b->nloss;
}

int hpu__vars_loss(hpu_strat *s)
{
	hpu_builder *b = s->b;
	int m = s->ctx.micro;
	if (m >= s->vars.cap && grow(s, m + 1) < 0)
		return -1;
	double *sums = s->vars.msum + (size_t)m * (size_t)b->nloss;
	for (int k = 0; k < b->nloss; k++)
		hpu__dev_sum(sums + k, s->t_data[b->loss[k].tensor], (size_t)s->ctx.batch);
	s->vars.mbatch[m] = s->ctx.batch;
	s->vars.micros = m + 1;
	return 0;
}

double hpu__vars_loss_of(const hpu_strat *s, const double *sums, int batch)
{
	double sum = 0;
	for (int k = 0; k < s->b->nloss; k++)
		sum += s->b->loss[k].weight * (sums[k] / batch);
	return sum;
}

double hpu__vars_micro_loss(hpu_strat *s, int m)
{
	size_t n = (size_t)s->b->nloss;
	double *h = s->vars.msum_host + (size_t)m * n;
	hpu__dev_copy(h, s->vars.msum + (size_t)m * n, n * sizeof *h);
	return hpu__vars_loss_of(s, h, s->vars.mbatch[m]);
}

/* The gradients g[n] of a unit (the plan's dtype) into the non-finite
 * flag: on the device, or checked by the host where they are in host
 * memory and the finding copied over. */
static void flag(hpu_strat *s, const void *g, size_t n)
{
	float *bad = &s->vars.sv->bad;
	if (hpu__strat_grads_host(s)) {
		if (!hpu__strat_nonfinite(s, g, n))
			return;
		*s->vars.flag_host = 1;
		hpu__dev_copy(bad, s->vars.flag_host, sizeof *bad);
	} else if (s->plan.mixed) {
		hpu__dev_flag_nonfinite16(bad, s->plan.fp16, g, n);
	} else {
		hpu__dev_flag_nonfinite(bad, g, n);
	}
}

/* Where every rank holds the same gradients (an all-reduce made them:
 * ddp, fast_ddp), each checks 1/world of every unit and the sum of the
 * flags tells the others; sharded, each checks its shard. */
static int flags(hpu_strat *s)
{
	int split = !s->sharded && s->world > 1;
	for (int k = 0; k < s->nunits; k++) {
		size_t n = s->u[k].opt.n, at = 0, end = n;
		if (split) {
			at = n / (size_t)s->world * (size_t)s->rank;
			end = s->rank == s->world - 1 ? n : at + n / (size_t)s->world;
		}
		if (end > at) /* a unit smaller than the world leaves some ranks none */
			flag(s, hpu__strat_at(s, HPU_PLAN_GRADS, s->u[k].opt_g, at), end - at);
	}
	if (!s->sharded && !split)
		return 0;
	hpucoll_req *req = NULL;
	float *bad = &s->vars.sv->bad;
	int rc = hpu__dc_iall_reduce(s, bad, bad, 1, HPUCOLL_F32, HPUCOLL_SUM, &req);
	if (rc == HPUCOLL_OK)
		rc = hpu__dc_wait(&req);
	return rc ? hpu__strat_coll_fail(s, "non-finite check all-reduce", rc) : 0;
}

/* The gradients' sum of squares into sv->sumsq (every unit, then every
 * rank's where sharded). */
static int norm(hpu_strat *s)
{
	double *acc = &s->vars.sv->sumsq;
	if (hpu__strat_grads_host(s)) { /* summed by the host, copied over */
		double ss = 0;
		for (int k = 0; k < s->nunits; k++)
			hpu__strat_sumsq_host(s, &ss, s->u[k].opt_g, s->u[k].opt.n);
		s->vars.lr_host[3] = ss;
		hpu__dev_copy(acc, &s->vars.lr_host[3], sizeof ss);
	} else {
		/* mixed: a device scratch of its own where s->chunk is the
		 * host's (zero1 with the update on the host) */
		float *scratch = s->chunk;
		if (s->plan.mixed && hpu__strat_update_host(s) &&
		    !(scratch = hpu__strat_dalloc(s, HPU_MEM_OTHER, HPU__STRAT_CHUNK * 4,
						  "gradient norm's scratch")))
			return -1;
		for (int k = 0; k < s->nunits; k++) {
			const unit *u = &s->u[k];
			if (s->plan.mixed)
				hpu__dev_sumsq16_add(acc, s->plan.fp16, u->opt_g, u->opt.n, scratch,
						     HPU__STRAT_CHUNK);
			else
				hpu__dev_sumsq_add(acc, u->opt_g, u->opt.n);
		}
		if (scratch != s->chunk)
			hpu__dfree(scratch);
	}
	if (!s->sharded)
		return 0;
	hpucoll_req *req = NULL;
	int rc = hpu__dc_iall_reduce(s, acc, acc, 1, HPUCOLL_F64, HPUCOLL_SUM, &req);
	if (rc == HPUCOLL_OK)
		rc = hpu__dc_wait(&req);
	return rc ? hpu__strat_coll_fail(s, "gradient-norm all-reduce", rc) : 0;
}

int hpu__vars_host_decides(const hpu_strat *s)
{
	/* and the parameters in host memory: the update's staging copies
	 * them back after it (hpu__strat_update), skipped or not */
	return !s->vars.recordable || hpu__strat_update_host(s) || hpu__strat_grads_host(s) ||
	       hpu__strat_params_host(s) || s->nv || s->nvp;
}

int hpu__vars_decide(hpu_strat *s)
{
	if (flags(s) < 0 || (s->o->clip_norm > 0 && norm(s) < 0))
		return -1;
	hpu__dev_step_begin(s->vars.sv, &s->vars.cfg);
	s->vars.known = hpu__vars_host_decides(s);
	if (!s->vars.known)
		return 0;
	read_vars(s);
	for (int k = 0; k < s->nunits; k++) /* the host's update counts from these */
		s->u[k].opt.t = s->vars.svh->t;
	return 0;
}

void hpu__vars_end(hpu_strat *s)
{
	hpu__dev_step_end(s->vars.sv, &s->vars.cfg);
	s->steps.injected = 0;
}

int hpu__vars_checks_arm(hpu_strat *s)
{
	size_t bytes = CHECK_SLOTS * sizeof(hpu__check_slot);
	if (!s->vars.checks &&
	    !(s->vars.checks = hpu__strat_dalloc(s, HPU_MEM_OTHER, bytes, "the ops' deferred checks")))
		return -1;
	if (!s->vars.checks_host && !(s->vars.checks_host = hpu__dev_host_alloc(bytes)))
		return hpu__strat_fail(s, "out of host memory for the ops' deferred checks");
	hpu__checks_arm(s->vars.checks, CHECK_SLOTS);
	s->vars.checks_armed = 1;
	s->vars.checks_used = 0;
	return 0;
}

void hpu__vars_checks_end(hpu_strat *s)
{
	if (!s->vars.checks_armed)
		return;
	s->vars.checks_used = hpu__checks_used();
	s->vars.checks_armed = 0;
	hpu__checks_disarm();
}

/* The used slots of the ops' deferred checks, as a span for
 * hpu__dev_d2h_n (0 bytes where none were used). */
static hpu__dev_span checks_span(const hpu_strat *s)
{
	int n = s->vars.checks_used > 0 ? s->vars.checks_used : 0;
	return (hpu__dev_span){s->vars.checks_host, s->vars.checks,
			       (size_t)n * sizeof(hpu__check_slot)};
}

/* What the checks found, once their slots are in checks_host. */
static int checks_said(hpu_strat *s, const char *what)
{
	char msg[512];
	int n = s->vars.checks_used;
	s->vars.checks_used = 0;
	if (n <= 0 || !hpu__checks_report(s->vars.checks_host, msg, sizeof msg))
		return 0;
	if (what)
		return hpu__strat_fail(s, "%s: %s", what, msg);
	return hpu__strat_fail(s, "step %ld: %s", s->ctx.step + 1, msg);
}

int hpu__vars_checks_result(hpu_strat *s, const char *what)
{
	hpu__dev_span c = checks_span(s);
	hpu__dev_d2h_n(&c, 1);
	return checks_said(s, what);
}

int hpu__vars_result(hpu_strat *s, float *loss, double *grad_norm, int *skipped)
{
	const hpu__dev_stepvars *h = s->vars.svh;
	size_t n = (size_t)s->b->nloss;
	double before = s->steps.scale;
	/* the step's scalars, its loss sums and its checks: one wait */
	hpu__dev_span c[3] = {
		{s->vars.svh, s->vars.sv, sizeof *s->vars.sv},
		{s->vars.msum_host, s->vars.msum, (size_t)s->vars.micros * n * sizeof *s->vars.msum_host},
		checks_span(s),
	};
	hpu__dev_d2h_n(c, 3);
	float sum = 0;
	for (int m = 0; m < s->vars.micros; m++)
		sum += (float)hpu__vars_loss_of(s, s->vars.msum_host + (size_t)m * n, s->vars.mbatch[m]);
	*loss = s->vars.micros ? sum / (float)s->vars.micros : 0;
	s->vars.micros = 0;
	s->vars.known = 0;
	*grad_norm = h->norm;
	*skipped = h->skip;
	for (int k = 0; k < s->nunits; k++)
		s->u[k].opt.t = h->t;
	s->steps.scale = h->loss_scale;
	s->steps.step_no = h->step_no;
	s->steps.last_overflow = h->last_overflow;
	s->steps.hyst_left = h->hyst_left;
	s->steps.skipped = h->skipped;
	if (s->vars.cfg.mixed && h->skip && s->rank == 0 && s->vars.cfg.fp16)
		printf("step %ld: gradient overflow: step skipped on every rank; loss scale %g -> %g\n",
		       h->step_no, before, h->loss_scale);
	else if (s->vars.cfg.mixed && h->skip && s->rank == 0) /* bf16, fp8: no loss scale */
		printf("step %ld: gradient overflow: step skipped on every rank\n", h->step_no);
	return checks_said(s, NULL);
}

/* ---- dropout's keys on the device (worker/ops/dropkeys.h) ---- */

_Static_assert(sizeof(long) == sizeof(int64_t), "hpu__dev_stepvars.step is an int64_t");

/* The ops' ready: the micro-batch's step and sample indices copied to
 * the device once (from pinned memory where the step is recorded: the
 * step's, hpu__strat_set_pos's, and --graphs' input buffers), and the
 * device memory the key kernel reads and writes. */
static int keys_ready(void *arg, const int64_t **step, const uint32_t **samples, uint64_t **keys)
{
	hpu_strat *s = arg;
	size_t rows = (size_t)s->maxbatch;
	int in_place = hpu__dev_host_can_read();
	if (!s->vars.dk_keys && !(s->vars.dk_keys = hpu__strat_dalloc(s, HPU_MEM_OTHER,
								      rows * sizeof **keys,
								      "dropout's keys")))
		return -1;
	if (!in_place && !s->vars.dk_samples &&
	    !(s->vars.dk_samples = hpu__strat_dalloc(s, HPU_MEM_OTHER, rows * sizeof **samples,
						     "dropout's sample indices")))
		return -1;
	if (!s->vars.dk_fresh) {
		hpu__dev_h2d(NULL, &s->vars.sv->step, s->vars.step_host, sizeof *s->vars.step_host);
		if (!in_place && s->ctx.samples)
			hpu__dev_h2d(NULL, s->vars.dk_samples, s->ctx.samples,
				     (size_t)s->ctx.batch * sizeof *s->ctx.samples);
		s->vars.dk_fresh = 1;
	}
	*step = (const int64_t *)&s->vars.sv->step;
	*samples = !s->ctx.samples ? NULL : in_place ? s->ctx.samples : s->vars.dk_samples;
	*keys = s->vars.dk_keys;
	return 0;
}

void hpu__vars_step(hpu_strat *s, int train, long step)
{
	if (train && s->vars.step_host)
		*s->vars.step_host = step;
}

void hpu__vars_keys(hpu_strat *s)
{
	s->vars.dk_fresh = 0;
	if (!s->vars.recordable || !s->ctx.train || !s->vars.step_host) {
		hpu__dropkeys_set(NULL); /* the host's keys, as eager */
		return;
	}
	hpu__dropkeys_set(&(hpu__dropkeys){.host = s->ctx.samples,
					   .step = s->ctx.step,
					   .rows = s->maxbatch,
					   .ready = keys_ready,
					   .arg = s});
}

/* ---- --graphs: what a recorded step's replays restore ---- */

struct hpu__strat_snap {
	int micros, checks_used;
	hpu__checks_snap *checks;
	int mbatch[];
};

hpu__strat_snap *hpu__strat_snap_take(hpu_strat *s)
{
	int n = s->vars.micros;
	hpu__strat_snap *p = calloc(1, sizeof *p + (size_t)n * sizeof *p->mbatch);
	if (!p)
		return NULL;
	p->micros = n;
	p->checks_used = s->vars.checks_used;
	if (n)
		memcpy(p->mbatch, s->vars.mbatch, (size_t)n * sizeof *p->mbatch);
	if (p->checks_used && !(p->checks = hpu__checks_save())) {
		free(p);
		return NULL;
	}
	return p;
}

int hpu__strat_snap_replay(hpu_strat *s, const hpu__strat_snap *p, double lr)
{
	if (p->micros > s->vars.cap)
		return hpu__strat_fail(s, "a recorded step of %d micro-steps replayed with room for %d",
				       p->micros, s->vars.cap);
	s->vars.micros = p->micros;
	if (p->micros)
		memcpy(s->vars.mbatch, p->mbatch, (size_t)p->micros * sizeof *p->mbatch);
	s->vars.checks_used = p->checks_used;
	if (p->checks && hpu__checks_restore(p->checks) < 0)
		return hpu__strat_fail(s, "out of host memory for the recorded step's checks");
	if (!isnan(lr))
		put_lr(s, lr);
	s->vars.known = 0;
	return 0;
}

void hpu__strat_snap_free(hpu__strat_snap **p)
{
	if (!*p)
		return;
	hpu__checks_snap_free((*p)->checks);
	free(*p);
	*p = NULL;
}
