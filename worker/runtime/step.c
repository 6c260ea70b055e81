/* step: one optimizer step of the loop (loop.h), eager or under --graphs
 * (graphs.h), and what is said after it: the bytes it copied (--verbose),
 * a step skipped for a non-finite loss or gradients. */
#include "worker/runtime/loop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/num.h"
#include "worker/device/device.h"
#include "worker/hpu/prof.h"
#include "worker/ops/fp8.h"
#include "worker/runtime/lrsched.h"
#include "worker/runtime/sampler.h"

/* fp8 training: the step's amax of every fp8 tensor, reduced with MAX
 * over the ranks (Transformer Engine's reduce_amax), goes into the
 * histories; every rank then uses the same scales. The state lives on
 * the device: one rank brings nothing back, the roll is a kernel. */
static int fp8_roll(loop *L)
{
	if (L->o->precision != HPU_PREC_FP8)
		return 0;
	if (L->world > 1) {
		size_t n;
		float *amax = hpu__fp8_step_amax(&n);
		int rc = n ? hpucoll_all_reduce(L->comm, amax, amax, n, HPUCOLL_F32, HPUCOLL_MAX)
			   : 0;
		if (rc)
			return hpu__loop_coll_fail(L, "fp8 amax all-reduce", rc);
	}
	hpu__fp8_roll();
	return 0;
}

/* Asks the loader for micro-batch k of global batch s (this rank's
 * share of it: micro-batches follow each other inside the share). */
void hpu__loop_prefetch(loop *L, size_t s, int k)
{
	const uint32_t *share = hpu__sampler_shard(L->perm, s, (size_t)L->o->batch_size,
						   L->rank, L->world);
	size_t m = s * (size_t)L->accum + (size_t)k;
	hpu__loader_request(L->loader, (int)(m & 1), share + (size_t)k * L->micro, L->micro);
}

static uint64_t bytes_sent(loop *L)
{
	hpucoll_stats st;
	hpucoll_comm_stats(L->comm, &st);
	return st.bytes_sent;
}

/* HPU_STRICT_STEP=1: the training steps are recordable (nothing comes
 * back to the host inside one; the ops' checks deferred to its end), on
 * every device; on cpu-strict the step guard proves it (device.h). */
void hpu__loop_strict_step(loop *L)
{
	const char *e = hpu__env_str(HPU_ENV_HPU_STRICT_STEP);
	if (!e || strcmp(e, "1"))
		return;
	hpu__strat_set_recordable(L->st, 1);
	if (L->o->verbose && L->rank == 0)
		printf("recordable training steps (HPU_STRICT_STEP=1): nothing comes back to the "
		       "host inside a step; the ops' checks of labels, ids and probabilities are "
		       "read after it\n");
}

/* --graphs: the steps recordable from the first one (so that the eager
 * ones compute what the replays do), and the recordings' input buffers.
 * On a device whose memory is the host's (host_mem: --device cpu) a
 * kernel's refusal is served by the ops' C loops eagerly and known to a
 * recording only from an eager call of its entry (device_kernels.c's
 * mark): a step (an evaluation batch) is recorded only after one ran
 * eagerly, --graphs-warmup 0 counting as 1 (a recording made first held
 * the refused kernel's node, whose launch failed). */
int hpu__loop_graphs_setup(loop *L)
{
	const hpu_dataset *d = &L->b->data[HPU_SPLIT_TRAIN];
	size_t bytes[HPU_MAX_IO];
	for (int f = 0; f < d->nfields; f++)
		bytes[f] = hpu__field_numel(&d->fields[f]) * 4;
	hpu__strat_set_recordable(L->st, 1);
	int warmup = L->o->graphs_warmup;
	if (warmup < 1 && hpu__dev_caps_get()->host_mem) {
		warmup = 1;
		if (L->o->verbose && L->rank == 0)
			printf("graphs: --graphs-warmup 0 counts as 1 on device %s: a kernel's "
			       "refusal is known only from an eager call\n",
			       hpu__dev_name());
	}
	return hpu__graphs_new(&L->graphs, warmup, L->accum, L->micro, d->nfields, bytes,
			       L->rank, L->o->verbose, L->err, L->errlen);
}

/* --graphs under --verbose: how the steps ran; then, where the run
 * evaluated, how its evaluation batches ran and the recordings kept. */
void hpu__loop_graphs_said(loop *L)
{
	if (!L->graphs || !L->o->verbose || L->rank != 0)
		return;
	long replayed, eager, ev_replayed, ev_eager;
	int recorded, ev_recorded;
	hpu__graphs_counts(L->graphs, &replayed, &eager, &recorded);
	hpu__graphs_eval_counts(L->graphs, &ev_replayed, &ev_eager, &ev_recorded);
	long dropped = hpu__graphs_dropped(L->graphs);
	/* launched: a recording's own step is its first launch */
	printf("graphs: %ld step%s launched from %d recording%s", replayed - dropped,
	       replayed - dropped == 1 ? "" : "s", recorded, recorded == 1 ? "" : "s");
	/* (it said "1 steps replayed from 0 recordings") */
	if (dropped)
		printf(", %ld from a recording its check refused", dropped);
	printf(", %ld run eagerly", eager);
	if (ev_replayed + ev_eager > 0)
		printf("; evaluation: %ld batch%s launched from %d recording%s, %ld run eagerly; "
		       "%d recording%s kept",
		       ev_replayed, ev_replayed == 1 ? "" : "es", ev_recorded,
		       ev_recorded == 1 ? "" : "s", ev_eager, recorded + ev_recorded,
		       recorded + ev_recorded == 1 ? "" : "s");
	printf("\n");
	long bound = hpu__graphs_bound(L->graphs);
	if (bound)
		printf("graphs: %ld replay%s read the batch where the loader put it (nothing copied "
		       "on the host)\n",
		       bound, bound == 1 ? "" : "s");
}

/* A step under way: where it is, for the agent and the strategy. */
static void step_begin(loop *L, long gstep)
{
	hpu__where.step = gstep; /* done; this one is under way */
	hpu__where.phase = HPU_PHASE_TRAIN;
	hpu__where_report(0);
	hpu__strat_set_pos(L->st, 1, gstep, L->epoch);
}

/* Micro-step k of global batch s: its batch once the loader has it, and
 * the next one asked for (batch s + 1's first where `more`). */
static int micro_batch(loop *L, size_t s, int k, int more, const hpu_batch **bt)
{
	size_t m = s * (size_t)L->accum + (size_t)k, bad;
	int64_t t0 = hpu__prof_t0();
	if (hpu__loader_wait(L->loader, (int)(m & 1), bt, &bad) < 0)
		return hpu__loop_fail(L, "the model's dataset failed to fetch sample %zu of its "
				      "training split (its fetch returned non-zero)", bad);
	hpu__prof_span("data", "data_loading", NULL, t0, "\"micro_step\":%d", k);
	if (k + 1 < L->accum)
		hpu__loop_prefetch(L, s, k + 1);
	else if (more)
		hpu__loop_prefetch(L, s + 1, 0);
	return 0;
}

/* Micro-step k's forward and backward on bt, the step guard on (nothing
 * back to the host: device.h; the loader's wait stays outside). `held`:
 * bt's buffers stay as they are until the step's result is read
 * (hpu__strat_batch_held). */
static int micro_work(loop *L, const hpu_batch *bt, int k, int held)
{
	const float scale = 1.0f / (float)(L->world * L->accum);
	hpu__strat_batch_held(L->st, held);
	hpu__dev_step_guard(1);
	int64_t t0 = hpu__prof_t0();
	int rc = hpu__strat_forward(L->st, bt, k, L->accum, -1);
	hpu__prof_span("forward", "forward", NULL, t0, "\"micro_step\":%d", k);
	t0 = hpu__prof_t0();
	if (rc == 0)
		rc = hpu__strat_backward(L->st, scale);
	hpu__prof_span("backward", "backward", NULL, t0, "\"micro_step\":%d", k);
	hpu__dev_step_guard(0);
	return rc;
}

/* The strategy's step with `lr`, the step guard on. */
static int strat_step(loop *L, double lr)
{
	hpu__dev_step_guard(1);
	int rc = hpu__strat_step(L->st, lr);
	hpu__dev_step_guard(0);
	return rc;
}

/* After the step's device work (the collectives' bytes at sent0): its
 * results read back and fp8's history rolled. */
static int step_done(loop *L, uint64_t sent0, float *loss_out, double *norm_out)
{
	/* its own range: on a GPU the wait for the step's queued work */
	int64_t t0 = hpu__prof_t0();
	int rc = hpu__strat_step_result(L->st, loss_out, norm_out);
	hpu__prof_span("step", "step_result", NULL, t0, NULL);
	if (rc < 0)
		return -1; /* a deferred check found bad input: the error says it */
	if (fp8_roll(L) < 0)
		return -1;
	L->comm_bytes += bytes_sent(L) - sent0;
	return 0;
}

/* One optimizer step on global batch `s` (step number `gstep` of the run,
 * from 0): accum micro-steps of forward and backward on this rank's share,
 * then the strategy's step. Asks for the next micro-batch (of batch s + 1
 * when `more`) before computing each, so that loading overlaps compute.
 * Sets the rank's mean loss over its micro-batches. */
int hpu__loop_train_step(loop *L, size_t s, long gstep, int more, float *loss_out,
			 double *norm_out)
{
	uint64_t sent0 = bytes_sent(L);
	step_begin(L, gstep);
	for (int k = 0; k < L->accum; k++) {
		const hpu_batch *bt;
		/* the loader's buffer: held at one micro-step (with more, it
		 * fills this one again for micro-step k + 2 of the step) */
		if (micro_batch(L, s, k, more, &bt) < 0 || micro_work(L, bt, k, L->accum == 1) < 0)
			return -1;
	}
	int64_t t0 = hpu__prof_t0();
	if (strat_step(L, hpu__sched_lr(&L->pos.sched, gstep)) < 0 ||
	    step_done(L, sent0, loss_out, norm_out) < 0)
		return -1;
	hpu__prof_span("optimizer", "optimizer_step", NULL, t0, NULL); /* the update's */
	return 0;
}

/* --graphs: every rank keeps a recording only where every rank's was
 * (the recorded steps hold the device's collectives between them): a MIN
 * over the ranks of the refusing rank (world: none). Where one refused,
 * the lowest such rank's reason goes to every rank (a broadcast, once per
 * refused recording: never on a replayed step), for rank 0 to say. */
static int graphs_agree(void *arg, int *who, char *why, size_t len)
{
	loop *L = arg;
	if (L->world == 1)
		return 0;
	int32_t v = *who < 0 ? L->world : *who;
	int rc = hpucoll_all_reduce(L->comm, &v, &v, 1, HPUCOLL_I32, HPUCOLL_MIN);
	if (rc)
		return hpu__loop_coll_fail(L, "--graphs' agreement", rc);
	*who = v < L->world ? (int)v : -1;
	if (*who < 0)
		return 0;
	rc = hpucoll_broadcast(L->comm, why, why, len, HPUCOLL_U8, *who);
	if (rc)
		return hpu__loop_coll_fail(L, "--graphs' agreement", rc);
	why[len - 1] = '\0';
	return 0;
}

/* The device work of one step on the micro-batches bt[0 .. accum): their
 * forwards and backwards, then the strategy's step. Under a recording it
 * runs on the host and records. */
static int step_work(loop *L, const hpu_batch *const *bt, double lr)
{
	for (int k = 0; k < L->accum; k++)
		if (micro_work(L, bt[k], k, 1) < 0) /* --graphs' input buffers: held */
			return -1;
	/* the update's span alone, after forward and backward, as an eager
	 * step's (a replay has graph_replay instead) */
	int64_t t0 = hpu__prof_t0();
	int rc = strat_step(L, lr);
	hpu__prof_span("optimizer", "optimizer_step", NULL, t0, NULL);
	return rc;
}

/* train_step under --graphs: the micro-batches copied into the
 * recording's input buffers as they come, then the step recorded,
 * replayed or run eagerly (graphs.h). */
int hpu__loop_graph_step(loop *L, size_t s, long gstep, int more, float *loss_out,
			 double *norm_out)
{
	/* any --grad-accum: a stack array of 64 overflowed above that */
	const hpu_batch *const *in = hpu__graphs_inputs(L->graphs);
	uint64_t sent0 = bytes_sent(L);
	step_begin(L, gstep);
	for (int k = 0; k < L->accum; k++) {
		const hpu_batch *bt;
		if (micro_batch(L, s, k, more, &bt) < 0)
			return -1;
		int64_t t0 = hpu__prof_t0();
		hpu__graphs_input(L->graphs, k, bt); /* in[k] */
		hpu__prof_span("data", "graph_input", NULL, t0, "\"micro_step\":%d", k);
	}
	double lr = hpu__sched_lr(&L->pos.sched, gstep);
	/* --inject-overflow-step's step is its own: never recorded or replayed */
	int own = L->o->inject_overflow_step > 0 && L->o->inject_overflow_step == gstep + 1;
	hpu__graph_mode mode = hpu__graphs_mode(L->graphs, gstep, own);
	if (L->world > 1) { /* every rank the same way, or all eagerly */
		int32_t v[2] = {(int32_t)mode, -(int32_t)mode};
		int rc = hpucoll_all_reduce(L->comm, v, v, 2, HPUCOLL_I32, HPUCOLL_MIN);
		if (rc)
			return hpu__loop_coll_fail(L, "--graphs' agreement", rc);
		if (v[0] != -v[1]) {
			hpu__graphs_mismatch(L->graphs, gstep);
			mode = HPU__GRAPH_EAGER;
		}
	}
	if (mode != HPU__GRAPH_REPLAY) { /* a replay reads the loader's buffers where it can */
		int64_t t0 = hpu__prof_t0();
		hpu__graphs_input_fill(L->graphs);
		hpu__prof_span("data", "graph_input", NULL, t0, "\"step\":%ld", gstep + 1);
	}
	if (mode == HPU__GRAPH_RECORD && hpu__graphs_record_begin(L->graphs, L->world > 1) < 0) {
		/* the others may be recording: they learn it at their end */
		if (L->world > 1 && hpu__graphs_unbegun(L->graphs, gstep, graphs_agree, L, L->err,
							L->errlen) < 0)
			return -1;
		mode = HPU__GRAPH_EAGER;
	}
	if (mode == HPU__GRAPH_RECORD) {
		/* host work in the step would run now, not at each launch */
		const char *host = hpu__strat_host_part(L->st);
		if (host)
			hpu__dev_capture_refuse("%s", host);
		int rc = host ? 0 : step_work(L, in, lr);
		int kept = hpu__graphs_record_end(L->graphs, L->st, gstep, graphs_agree, L, L->err,
						  L->errlen);
		if (rc < 0 || kept < 0)
			return -1;
		mode = kept ? HPU__GRAPH_REPLAY : HPU__GRAPH_EAGER; /* nothing ran yet */
	}
	if (mode == HPU__GRAPH_EAGER && step_work(L, in, lr) < 0)
		return -1;
	if (mode == HPU__GRAPH_REPLAY) {
		int64_t tb = hpu__prof_t0();
		if (hpu__graphs_bind(L->graphs, L->err, L->errlen) < 0)
			return -1;
		hpu__prof_span("data", "graph_input", NULL, tb, "\"step\":%ld", gstep + 1);
		int64_t tr = hpu__prof_t0();
		if (hpu__graphs_launch(L->graphs, L->st, lr, L->err, L->errlen) < 0)
			return -1;
		hpu__prof_span("graph", "graph_replay", NULL, tr, "\"step\":%ld,\"nodes\":{%s}",
			       gstep + 1, hpu__graphs_node_args(L->graphs));
	}
	return step_done(L, sent0, loss_out, norm_out); /* the update's span: step_work's */
}

/* --verbose: the bytes the step copied between host and device (the
 * batch in, the loss out, the collectives' staging; none where the host
 * may read device memory), what the placement plan says they must be,
 * and how many times the host waited for the device (hpu__dev_waits: on
 * a GPU each is a round trip), for tests and figures. */
void hpu__loop_copied_log(const loop *L, long step, uint64_t h2d0, uint64_t d2h0, uint64_t waits0)
{
	uint64_t h2d, d2h;
	hpu_plan_copies c;
	hpu__dev_copied(&h2d, &d2h);
	printf("rank %d: step %ld: device %s copied %llu bytes host-to-device, %llu bytes device-to-host",
	       L->rank, step, hpu__dev_name(), (unsigned long long)(h2d - h2d0),
	       (unsigned long long)(d2h - d2h0));
	if (hpu__strat_plan_copies(L->st, &c) == 0)
		printf("; the plan: %s%llu and %llu", c.exact ? "" : "at least ",
		       (unsigned long long)c.h2d_total, (unsigned long long)c.d2h_total);
	uint64_t w = hpu__dev_waits() - waits0;
	printf("; the host waited for the device %llu time%s\n", (unsigned long long)w,
	       w == 1 ? "" : "s");
}

/* "; not checked: output \"h\" of layer \"fc\", which was not kept after
 * forward": the n tensors before a finding that were not there to look
 * at, `tensor` the last of them (the closest to where the value may have
 * come from); "" when there were none. */
static void unchecked_note(loop *L, int tensor, double n, char *out, size_t outlen)
{
	char what[300];
	out[0] = 0;
	if (tensor < 0 || n < 1)
		return;
	hpu__strat_nonfinite_name(L->st, tensor, -1, what, sizeof what);
	if (n < 2)
		snprintf(out, outlen, "; not checked: %s, which was not kept after forward", what);
	else
		snprintf(out, outlen, "; not checked: %s and %.0f earlier tensor%s, which were not "
				      "kept after forward",
			 what, n - 1, n >= 3 ? "s" : "");
}

/* Where the skipped step's first non-finite value came from, as every
 * rank found it (hpu_nonfinite, gathered): the lowest rank whose loss
 * went non-finite, else the first unit whose gradients did; "" when no
 * rank found one. Every rank calls it (a collective). */
static int first_nonfinite(loop *L, char *out, size_t outlen)
{
	enum { F_FOUND, F_MICRO, F_TENSOR, F_COUNT, F_NUMEL, F_UNIT, F_UNCHECKED, F_NUNCHECKED,
	       F_N };
	hpu_nonfinite nf;
	hpu__strat_first_nonfinite(L->st, &nf);
	double mine[F_N] = {nf.found, nf.micro, nf.tensor, (double)nf.count, (double)nf.numel,
			    nf.unit, nf.unchecked, (double)nf.nunchecked};
	double *all = malloc((size_t)L->world * F_N * sizeof *all);
	if (!all)
		return hpu__loop_fail(L, "out of memory");
	int rc = hpucoll_all_gather(L->comm, mine, all, F_N, HPUCOLL_F64);
	if (rc) {
		free(all);
		return hpu__loop_coll_fail(L, "non-finite report all-gather", rc);
	}
	const double *v = NULL;
	for (int want = 1; want <= 2 && !v; want++)
		for (int r = 0; r < L->world && !v; r++)
			if ((int)all[(size_t)r * F_N + F_FOUND] == want)
				v = all + (size_t)r * F_N;
	char what[300], note[400];
	out[0] = 0;
	if (v && (int)v[F_FOUND] == 1) {
		hpu__strat_nonfinite_name(L->st, (int)v[F_TENSOR], -1, what, sizeof what);
		unchecked_note(L, (int)v[F_UNCHECKED], v[F_NUNCHECKED], note, sizeof note);
		snprintf(out, outlen, "first non-finite value: rank %d, micro-step %d of %d, %s "
				      "(%.0f of %.0f values)%s",
			 (int)((v - all) / F_N), (int)v[F_MICRO] + 1, L->accum, what, v[F_COUNT],
			 v[F_NUMEL], note);
	} else if (v) {
		hpu__strat_nonfinite_name(L->st, -1, (int)v[F_UNIT], what, sizeof what);
		snprintf(out, outlen, "first non-finite value: %s (every rank's loss was finite)",
			 what);
	}
	free(all);
	return 0;
}

/* After step `step` (from 0): a step skipped for a non-finite loss or
 * gradients is said; --max-skipped-steps of them in a row end the run. */
int hpu__loop_skipped_check(loop *L, long step)
{
	int run = hpu__strat_bad_run(L->st);
	long seen = L->bad_seen;
	char first[1000], sep[3] = "";
	L->bad_seen = hpu__strat_bad_total(L->st);
	if (L->bad_seen == seen)
		return 0;
	if (first_nonfinite(L, first, sizeof first) < 0)
		return -1;
	if (first[0])
		snprintf(sep, sizeof sep, "; ");
	if (L->rank == 0 && L->o->precision == HPU_PREC_FP32)
		printf("step %ld: non-finite loss or gradients: step skipped on every rank (%d in a "
		       "row)%s%s\n", step + 1, run, sep, first);
	/* a static loss scale that overflows every step is no divergence:
	 * the scale is too large for fp16 (a dynamic one would halve) */
	char hint[200] = "lower the learning rate, clip gradients (--clip-grad-norm) or check the "
			 "model's loss";
	if (L->o->precision == HPU_PREC_FP16_MIXED && L->o->loss_scale > 0)
		snprintf(hint, sizeof hint, "the static --loss-scale %g may overflow fp16's gradients: "
			 "lower it, or give 0 for the dynamic scale, or lower the learning rate",
			 L->o->loss_scale);
	/* the metrics file ends with the run's counts (no final record is
	 * written for a run that fails; the file said nothing of the skips) */
	if (run >= L->o->max_skipped_steps && L->metrics) {
		cJSON *j = cJSON_CreateObject();
		cJSON_AddNumberToObject(j, "step", (double)step + 1);
		cJSON_AddStringToObject(j, "stopped", "diverged");
		cJSON_AddNumberToObject(j, "nonfinite_steps_in_a_row", run);
		cJSON_AddNumberToObject(j, "nonfinite_steps_skipped",
					(double)hpu__strat_bad_total(L->st));
		cJSON_AddNumberToObject(j, "skipped_steps", (double)hpu__strat_skipped(L->st));
		if (hpu__loop_print_json(L, j) < 0)
			return -1;
	}
	char which[64];
	if (run == 1) /* "1 step in a row (steps 2 to 2)" */
		snprintf(which, sizeof which, "1 step (step %ld)", step + 1);
	else
		snprintf(which, sizeof which, "%d steps in a row (steps %ld to %ld)", run,
			 step + 2 - run, step + 1);
	if (run >= L->o->max_skipped_steps)
		return hpu__loop_fail(L, "%s had a non-finite loss or gradients (NaN or Inf) and %s "
					 "skipped: the run diverged (--max-skipped-steps %d); %s%s%s",
				      which, run == 1 ? "was" : "were", L->o->max_skipped_steps, hint,
				      sep, first);
	return 0;
}
