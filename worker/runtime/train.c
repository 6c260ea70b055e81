#include "worker/runtime/train.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/runtime/save_resume.h"
#include "worker/runtime/graphs.h"
#include "worker/device/device.h"
#include "worker/hpu/devmem.h"
#include "common/env.h"
#include "worker/ops/fp8.h"
#include "worker/runtime/hooks.h"
#include "common/num.h"
#include "worker/runtime/loader.h"
#include "worker/runtime/sampler.h"
#include "worker/runtime/lrsched.h"
#include "worker/hpu/prof.h"
#include "worker/runtime/quant.h"
#include "proto/status.h"
#include "worker/strategy/strategy.h"
#include "worker/runtime/loop.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *dalloc(loop *L, size_t bytes, const char *what)
{
	void *p = hpu__dev_hbuf_alloc(HPU_MEM_OTHER, bytes, what);
	if (!p)
		hpu__loop_fail(L, "%s", hpu__devmem_error());
	return p;
}

static int alloc_buffers(loop *L)
{
	const hpu_dataset *d = &L->b->data[HPU_SPLIT_TRAIN];
	if (hpu__batch_alloc(d, L->micro, &L->eval_bt, "evaluation batch") < 0)
		return hpu__loop_fail(L, "%s", hpu__devmem_error());
	if (!(L->eval_idx = dalloc(L, (size_t)L->micro * sizeof *L->eval_idx, "evaluation indices")) ||
	    !(L->perm = dalloc(L, d->size * sizeof *L->perm, "the sampler's permutation")))
		return -1;
	if (!(L->loader = hpu__loader_new(d, L->micro))) {
		if (!L->err[0])
			hpu__loop_fail(L, "cannot start the data loader: %s", hpu__devmem_error());
		return -1;
	}
	return 0;
}

static void free_buffers(loop *L)
{
	hpu__graphs_free(&L->graphs); /* before the strategy: its memory kept */
	hpu__loader_destroy(&L->loader);
	hpu__batch_free(&L->eval_bt);
	hpu__dev_hbuf_free(L->eval_idx);
	hpu__dev_hbuf_free(L->perm);
	free(L->val_map);
	hpu__strat_free(&L->st);
	if (L->metrics)
		fclose(L->metrics);
}

/* ---- per-rank statistics: device memory and traffic ---- */

enum {
	ST_LIMIT, ST_IN_USE, ST_MAX_IN_USE, ST_NUM_ALLOCS, ST_NUM_FREES,
	ST_ACTIVE_ALLOCS, ST_MAX_ALLOC_SIZE, ST_SYS_ALLOCS, ST_SYS_FREES,
	ST_SYS_ACTIVE, ST_KIND0, ST_STATES_MAX = ST_KIND0 + HPU_MEM_NKINDS,
	ST_COMM_BYTES, ST_SKIPPED,
	/* the host tier (offload): Limit, InUse, MaxInUse, params, grads,
	 * optim, model states */
	ST_HOST0, ST_HOST_STATES = ST_HOST0 + 6,
	/* the NVMe tier: bytes read, written (both files), seconds waited,
	 * the parameters' file's bytes read, written */
	ST_NV0, ST_N = ST_NV0 + 5
};

static const char *stat_names[ST_KIND0] = {
	"Limit", "InUse", "MaxInUse", "NumAllocs", "NumFrees", "ActiveAllocs",
	"MaxAllocSize", "TotalSystemAllocs", "TotalSystemFrees", "TotalActiveAllocs"};

/* Every rank's statistics, gathered to every rank (all[world][ST_N]):
 * comm_per_step is this rank's bytes sent per optimizer step. */
static int gather_stats(loop *L, double comm_per_step, double *all)
{
	hpu_device_stats d;
	hpu__devmem_stats(&d);
	double mine[ST_N] = {
		(double)d.limit, (double)d.in_use, (double)d.max_in_use,
		(double)d.num_allocs, (double)d.num_frees, (double)d.active_allocs,
		(double)d.max_alloc_size, (double)d.total_system_allocs,
		(double)d.total_system_frees, (double)d.total_active_allocs};
	for (int k = 0; k < HPU_MEM_NKINDS; k++)
		mine[ST_KIND0 + k] = (double)hpu__devmem_kind_max((hpu_mem_kind)k);
	mine[ST_STATES_MAX] = (double)hpu__devmem_states_max();
	mine[ST_COMM_BYTES] = comm_per_step;
	mine[ST_SKIPPED] = L->st ? (double)hpu__strat_skipped(L->st) : 0;
	hpu__hostmem_stats(&d);
	mine[ST_HOST0] = (double)d.limit;
	mine[ST_HOST0 + 1] = (double)d.in_use;
	mine[ST_HOST0 + 2] = (double)d.max_in_use;
	for (int k = 0; k < 3; k++) /* params, grads, optim */
		mine[ST_HOST0 + 3 + k] = (double)hpu__hostmem_kind_max((hpu_mem_kind)k);
	mine[ST_HOST_STATES] = (double)hpu__hostmem_states_max();
	hpu_nvme_stats nv = {0};
	if (L->st)
		hpu__strat_nvme_stats(L->st, &nv);
	mine[ST_NV0] = (double)nv.read;
	mine[ST_NV0 + 1] = (double)nv.written;
	mine[ST_NV0 + 2] = nv.wait_s;
	mine[ST_NV0 + 3] = (double)nv.param_read;
	mine[ST_NV0 + 4] = (double)nv.param_written;
	int rc = hpucoll_all_gather(L->comm, mine, all, ST_N, HPUCOLL_F64);
	return rc ? hpu__loop_coll_fail(L, "statistics all-gather", rc) : 0;
}

static cJSON *stats_json(loop *L, const double *all)
{
	cJSON *arr = cJSON_CreateArray();
	for (int r = 0; r < L->world; r++) {
		const double *v = all + (size_t)r * ST_N;
		cJSON *j = cJSON_CreateObject();
		cJSON_AddNumberToObject(j, "rank", r);
		for (int k = 0; k < ST_KIND0; k++)
			cJSON_AddNumberToObject(j, stat_names[k], v[k]);
		for (int k = 0; k < HPU_MEM_NKINDS; k++) {
			char key[32];
			snprintf(key, sizeof key, "max_%s", hpu__mem_kind_name((hpu_mem_kind)k));
			cJSON_AddNumberToObject(j, key, v[ST_KIND0 + k]);
		}
		cJSON_AddNumberToObject(j, "max_model_states", v[ST_STATES_MAX]);
		cJSON_AddNumberToObject(j, "comm_bytes_per_step", v[ST_COMM_BYTES]);
		cJSON_AddNumberToObject(j, "skipped_steps", v[ST_SKIPPED]);
		static const char *host_names[] = {"Limit", "InUse", "MaxInUse", "max_params",
						   "max_grads", "max_optim", "max_model_states"};
		cJSON *h = cJSON_AddObjectToObject(j, "host");
		for (int k = 0; k < 7; k++)
			cJSON_AddNumberToObject(h, host_names[k], v[ST_HOST0 + k]);
		static const char *nv_names[] = {"read_bytes", "written_bytes", "wait_s",
						 "param_read_bytes", "param_written_bytes"};
		cJSON *nv = cJSON_AddObjectToObject(j, "nvme");
		for (int k = 0; k < 5; k++)
			cJSON_AddNumberToObject(nv, nv_names[k], v[ST_NV0 + k]);
		cJSON_AddItemToArray(arr, j);
	}
	return arr;
}

/* Closes the metrics file at the end of a run; its last bytes may only
 * reach the disk (or fail to) here. */
static int close_metrics(loop *L)
{
	FILE *f = L->metrics;
	L->metrics = NULL;
	if (f && fclose(f) != 0)
		return hpu__loop_fail(L, "cannot write the metrics file %s: %s", L->o->metrics,
				      strerror(errno));
	return 0;
}

static double mib(double bytes)
{
	return bytes / (1024.0 * 1024.0);
}

/* What every rank contributes to a log line after `steps` steps: *mean
 * gets the loss averaged over the ranks; returns every rank's statistics
 * (all[world][ST_N], the caller frees), or NULL after an error. */
static double *reduce_for_log(loop *L, float loss, long steps, float *mean)
{
	*mean = loss / (float)L->world;
	int rc = hpucoll_all_reduce(L->comm, mean, mean, 1, HPUCOLL_F32, HPUCOLL_SUM);
	if (rc) {
		hpu__loop_coll_fail(L, "loss all-reduce", rc);
		return NULL;
	}
	double *all = malloc((size_t)L->world * ST_N * sizeof *all);
	if (!all) {
		hpu__loop_fail(L, "out of memory");
		return NULL;
	}
	/* the traffic of the steps this run trained (not those before a
	 * resume or restart) */
	long mine = steps - L->pos.step;
	if (gather_stats(L, mine > 0 ? (double)L->comm_bytes / (double)mine : 0, all) < 0) {
		free(all);
		return NULL;
	}
	return all;
}

/* A log line and metrics record: loss averaged over every rank, the
 * learning rate, throughput, device memory of every rank. */
static int log_step(loop *L, long step, long total, int epoch, float loss,
		    double lr, double norm, double sps)
{
	int64_t t0 = hpu__prof_t0();
	float l;
	double *all = reduce_for_log(L, loss, step, &l);
	if (!all)
		return -1;
	if (L->rank == 0) {
		printf("epoch %d/%d step %ld/%ld loss %.4f lr %.3g samples/s %.1f "
		       "memory_allocated %.1f MiB max_memory_allocated %.1f MiB "
		       "total_memory_available %.1f MiB\n",
		       epoch + 1, L->epochs, step, total, l, lr, sps,
		       mib(all[ST_IN_USE]), mib(all[ST_MAX_IN_USE]), mib(all[ST_LIMIT]));
		if (L->metrics) {
			cJSON *j = cJSON_CreateObject();
			cJSON_AddNumberToObject(j, "step", (double)step);
			cJSON_AddNumberToObject(j, "epoch", epoch + 1);
			cJSON_AddNumberToObject(j, "loss", l);
			cJSON_AddNumberToObject(j, "lr", lr);
			if (L->o->clip_norm > 0)
				cJSON_AddNumberToObject(j, "grad_norm", norm);
			if (L->o->precision != HPU_PREC_FP32)
				cJSON_AddNumberToObject(j, "loss_scale", hpu__strat_loss_scale(L->st));
			cJSON_AddNumberToObject(j, "samples_per_sec", sps);
			cJSON_AddItemToObject(j, "device", stats_json(L, all));
			if (hpu__loop_print_json(L, j) < 0) {
				free(all);
				return -1;
			}
		}
	}
	free(all);
	hpu__prof_span("log", "log_step", NULL, t0, "\"step\":%ld", step);
	return 0;
}

/* fp8 training: the step's amax of every fp8 tensor, reduced with MAX
 * over the ranks (Transformer Engine's reduce_amax), goes into the
 * histories; every rank then uses the same scales. */
static int fp8_roll(loop *L)
{
	if (L->o->precision != HPU_PREC_FP8)
		return 0;
	size_t n;
	float *amax = hpu__fp8_step_amax(&n);
	int rc = n ? hpucoll_all_reduce(L->comm, amax, amax, n, HPUCOLL_F32, HPUCOLL_MAX) : 0;
	if (rc)
		return hpu__loop_coll_fail(L, "fp8 amax all-reduce", rc);
	hpu__fp8_roll();
	return 0;
}

/* Asks the loader for micro-batch k of global batch s (this rank's
 * share of it: micro-batches follow each other inside the share). */
static void prefetch(loop *L, size_t s, int k)
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
static void strict_step(loop *L)
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
 * ones compute what the replays do), and the recordings' input buffers. */
static int graphs_setup(loop *L)
{
	const hpu_dataset *d = &L->b->data[HPU_SPLIT_TRAIN];
	size_t bytes[HPU_MAX_IO];
	for (int f = 0; f < d->nfields; f++)
		bytes[f] = hpu__field_numel(&d->fields[f]) * 4;
	hpu__strat_set_recordable(L->st, 1);
	return hpu__graphs_new(&L->graphs, L->o->graphs_warmup, L->accum, L->micro, d->nfields,
			       bytes, L->rank, L->o->verbose, L->err, L->errlen);
}

/* --graphs under --verbose: how the steps ran; then, where the run
 * evaluated, how its evaluation batches ran and the recordings kept. */
static void graphs_said(loop *L)
{
	if (!L->graphs || !L->o->verbose || L->rank != 0)
		return;
	long replayed, eager, ev_replayed, ev_eager;
	int recorded, ev_recorded;
	hpu__graphs_counts(L->graphs, &replayed, &eager, &recorded);
	hpu__graphs_eval_counts(L->graphs, &ev_replayed, &ev_eager, &ev_recorded);
	printf("graphs: %ld steps replayed from %d recording%s, %ld run eagerly", replayed,
	       recorded, recorded == 1 ? "" : "s", eager);
	if (ev_replayed + ev_eager > 0)
		printf("; evaluation: %ld batches replayed from %d recording%s, %ld run eagerly; "
		       "%d recording%s kept",
		       ev_replayed, ev_recorded, ev_recorded == 1 ? "" : "s", ev_eager,
		       recorded + ev_recorded, recorded + ev_recorded == 1 ? "" : "s");
	printf("\n");
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
		return hpu__loop_fail(L, "the model's dataset failed to fetch sample %zu", bad);
	hpu__prof_span("data", "data_loading", NULL, t0, "\"micro_step\":%d", k);
	if (k + 1 < L->accum)
		prefetch(L, s, k + 1);
	else if (more)
		prefetch(L, s + 1, 0);
	return 0;
}

/* Micro-step k's forward and backward on bt, the step guard on (nothing
 * back to the host: device.h; the loader's wait stays outside). */
static int micro_work(loop *L, const hpu_batch *bt, int k)
{
	const float scale = 1.0f / (float)(L->world * L->accum);
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

/* After the step's device work (begun at t0, the collectives' bytes at
 * sent0): its results read back, fp8's history rolled, the span. */
static int step_done(loop *L, int64_t t0, uint64_t sent0, float *loss_out, double *norm_out)
{
	if (hpu__strat_step_result(L->st, loss_out, norm_out) < 0)
		return -1; /* a deferred check found bad input: the error says it */
	if (fp8_roll(L) < 0)
		return -1;
	hpu__prof_span("optimizer", "optimizer_step", NULL, t0, NULL);
	L->comm_bytes += bytes_sent(L) - sent0;
	return 0;
}

/* One optimizer step on global batch `s` (step number `gstep` of the run,
 * from 0): accum micro-steps of forward and backward on this rank's share,
 * then the strategy's step. Asks for the next micro-batch (of batch s + 1
 * when `more`) before computing each, so that loading overlaps compute.
 * Sets the rank's mean loss over its micro-batches. */
static int train_step(loop *L, size_t s, long gstep, int more, float *loss_out,
		      double *norm_out)
{
	uint64_t sent0 = bytes_sent(L);
	step_begin(L, gstep);
	for (int k = 0; k < L->accum; k++) {
		const hpu_batch *bt;
		if (micro_batch(L, s, k, more, &bt) < 0 || micro_work(L, bt, k) < 0)
			return -1;
	}
	int64_t t0 = hpu__prof_t0();
	if (strat_step(L, hpu__sched_lr(&L->pos.sched, gstep)) < 0)
		return -1;
	return step_done(L, t0, sent0, loss_out, norm_out);
}

/* --graphs: every rank keeps a recording only where every rank's was
 * (the recorded steps hold the device's collectives between them). */
static int graphs_agree(void *arg, int *ok)
{
	loop *L = arg;
	if (L->world == 1)
		return 0;
	int32_t v = *ok;
	int rc = hpucoll_all_reduce(L->comm, &v, &v, 1, HPUCOLL_I32, HPUCOLL_MIN);
	if (rc)
		return hpu__loop_coll_fail(L, "--graphs' agreement", rc);
	*ok = v;
	return 0;
}

/* The device work of one step on the micro-batches bt[0 .. accum): their
 * forwards and backwards, then the strategy's step. Under a recording it
 * runs on the host and records. */
static int step_work(loop *L, const hpu_batch *const *bt, double lr)
{
	for (int k = 0; k < L->accum; k++)
		if (micro_work(L, bt[k], k) < 0)
			return -1;
	return strat_step(L, lr);
}

/* train_step under --graphs: the micro-batches copied into the
 * recording's input buffers as they come, then the step recorded,
 * replayed or run eagerly (graphs.h). */
static int graph_step(loop *L, size_t s, long gstep, int more, float *loss_out,
		      double *norm_out)
{
	const hpu_batch *in[64];
	uint64_t sent0 = bytes_sent(L);
	step_begin(L, gstep);
	for (int k = 0; k < L->accum; k++) {
		const hpu_batch *bt;
		if (micro_batch(L, s, k, more, &bt) < 0)
			return -1;
		in[k] = hpu__graphs_input(L->graphs, k, bt);
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
	int64_t t0 = hpu__prof_t0();
	if (mode == HPU__GRAPH_RECORD && hpu__graphs_record_begin(L->graphs) < 0)
		mode = HPU__GRAPH_EAGER;
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
		int64_t tr = hpu__prof_t0();
		if (hpu__graphs_launch(L->graphs, L->st, lr, L->err, L->errlen) < 0)
			return -1;
		hpu__prof_span("graph", "graph_replay", NULL, tr, "\"step\":%ld,\"nodes\":{%s}",
			       gstep + 1, hpu__graphs_node_args(L->graphs));
	}
	return step_done(L, t0, sent0, loss_out, norm_out);
}

/* --verbose: the bytes the step copied between host and device (the
 * batch in, the loss out, the collectives' staging; none where the host
 * may read device memory), and what the placement plan says they must
 * be, for tests and figures. */
static void copied_log(const loop *L, long step, uint64_t h2d0, uint64_t d2h0)
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
	printf("\n");
}

/* {"linear": {"low": N, "fp32": M}, ...}: this rank's op calls by the
 * precision they ran in, for the ops called at all. */
static cJSON *autocast_json(void)
{
	cJSON *j = cJSON_CreateObject();
	for (int i = 0; i < hpu__autocast_ops(); i++) {
		const char *name = hpu__autocast_op_name(i);
		uint64_t low = hpu__autocast_count(name, 1), fp32 = hpu__autocast_count(name, 0);
		uint64_t fp8 = hpu__autocast_count(name, HPU_AUTOCAST_COUNT_FP8);
		if (low + fp32 + fp8 == 0)
			continue;
		cJSON *c = cJSON_CreateObject();
		cJSON_AddNumberToObject(c, "low", (double)low);
		cJSON_AddNumberToObject(c, "fp32", (double)fp32);
		if (fp8)
			cJSON_AddNumberToObject(c, "fp8", (double)fp8);
		cJSON_AddItemToObject(j, name, c);
	}
	return j;
}

/* The final line and record: every rank takes part (the loss and the
 * statistics are reduced); rank 0 writes. */
static int write_final(loop *L, long steps, float loss, double sps, const evalres *ev)
{
	float l;
	double *all = reduce_for_log(L, loss, steps, &l);
	if (!all)
		return -1;
	if (L->rank != 0) {
		free(all);
		return 0;
	}
	const hpu_builder *b = L->b;
	if (!L->o->eval_only && steps == L->pos.step && steps > 0) /* resumed at the end */
		printf("resumed at step %ld on %d worker%s (%s): no steps left to train\n", steps,
		       L->world, hpu__plural(L->world), hpu__strategy_name(L->o->strategy));
	else if (L->o->eval_only)
		printf("evaluated without training (--eval-only) on %d worker%s (%s, %s): "
		       "max_memory_allocated %.1f MiB\n",
		       L->world, hpu__plural(L->world), hpu__strategy_name(L->o->strategy),
		       hpu__precision_name(L->o->precision), mib(all[ST_MAX_IN_USE]));
	else
		printf("trained %ld step%s on %d worker%s (%s): final loss %.4f, %.1f samples/s, "
		       "%.0f bytes sent per step, max_memory_allocated %.1f MiB\n",
		       steps, hpu__plural(steps), L->world, hpu__plural(L->world), hpu__strategy_name(L->o->strategy), l, sps,
		       all[ST_COMM_BYTES], mib(all[ST_MAX_IN_USE]));
	long bad = hpu__strat_bad_total(L->st);
	if (bad)
		printf("%ld step%s skipped for a non-finite loss or gradients\n", bad,
		       bad == 1 ? " was" : "s were");
	if (ev) {
		printf("test loss %.4f (%.0f samples)\n", ev->loss, ev->count);
		for (int k = 0; k < b->nmetrics; k++)
			printf("test %s %.4f (%.0f samples)\n", b->metrics[k].name, ev->metric[k],
			       ev->count);
	}
	if (L->metrics) {
		cJSON *j = cJSON_CreateObject();
		cJSON_AddBoolToObject(j, "final", 1);
		cJSON_AddNumberToObject(j, "steps", (double)steps);
		cJSON_AddNumberToObject(j, "loss", l);
		cJSON_AddNumberToObject(j, "samples_per_sec", sps);
		cJSON_AddNumberToObject(j, "world_size", L->world);
		cJSON_AddStringToObject(j, "strategy", hpu__strategy_name(L->o->strategy));
		cJSON_AddStringToObject(j, "precision", hpu__precision_name(L->o->precision));
		cJSON_AddNumberToObject(j, "loss_scale", hpu__strat_loss_scale(L->st));
		cJSON_AddNumberToObject(j, "micro_batch", L->micro);
		cJSON_AddNumberToObject(j, "grad_accum", L->accum);
		cJSON_AddNumberToObject(j, "parameters", (double)L->b->psi);
		cJSON_AddNumberToObject(j, "units", hpu__strat_units(L->st));
		cJSON_AddNumberToObject(j, "nonfinite_steps_skipped",
					(double)hpu__strat_bad_total(L->st));
		if (ev) {
			cJSON_AddNumberToObject(j, "test_loss", ev->loss);
			for (int k = 0; k < b->nmetrics; k++) {
				char key[96];
				snprintf(key, sizeof key, "test_%s", b->metrics[k].name);
				cJSON_AddNumberToObject(j, key, ev->metric[k]);
			}
		}
		cJSON_AddItemToObject(j, "device", stats_json(L, all));
		cJSON_AddItemToObject(j, "autocast", autocast_json());
		if (hpu__loop_print_json(L, j) < 0) {
			free(all);
			return -1;
		}
	}
	free(all);
	return 0;
}

/* The run's length in optimizer steps, and the steps of an epoch:
 * --max-steps wins over --epochs, as in the HF Trainer (the sampler goes
 * on into as many epochs as it takes), and 0 trains nothing. */
static int run_total(loop *L, long *total, size_t *per_epoch)
{
	*per_epoch = hpu__sampler_steps(L->ntrain, (size_t)L->o->batch_size);
	if (*per_epoch == 0)
		return hpu__loop_fail(L, "the training set (%zu samples) is smaller than one global batch (--batch-size %d)",
				      L->ntrain, L->o->batch_size);
	if (L->o->max_steps < 0) {
		*total = (long)*per_epoch * L->o->epochs;
		return 0;
	}
	*total = L->o->max_steps;
	long e = (*total + (long)*per_epoch - 1) / (long)*per_epoch;
	L->epochs = e < 1 ? 1 : e > INT_MAX ? INT_MAX : (int)e;
	return 0;
}

/* A checkpoint after `step` steps, the last of which was batch s of
 * epoch e. */
static int save_checkpoint(loop *L, long step, int e, size_t s, size_t per_epoch)
{
	hpu_run_pos p = L->pos;
	p.step = step;
	p.epoch = s + 1 < per_epoch ? e : e + 1;
	p.batch = s + 1 < per_epoch ? (long)(s + 1) : 0;
	p.vstep = L->vstep;
	p.vloss = L->vloss;
	memcpy(p.vmetric, L->vmetric, sizeof p.vmetric);
	p.es_best = L->es_best;
	p.es_best_step = L->es_best_step;
	p.es_wait = L->es_wait;
	int64_t t0 = hpu__prof_t0();
	int rc = hpu__checkpoint_save(L->comm, L->o, L->b, L->st, &p, L->metrics, L->err, L->errlen);
	hpu__prof_span("checkpoint", "checkpoint_save", NULL, t0, "\"step\":%ld", step);
	return rc;
}

/* Throughput: the first --throughput-warmup-steps steps of this run are
 * left out (they pay for allocation and first touches). */
typedef struct rate {
	long warm;        /* steps left out */
	long step0;       /* the step the measurement starts after */
	double t0;        /* ... and when */
	long steplog;     /* the last log line's step and time (or step0) */
	double tlog;
	double start;     /* the run's start, for a run shorter than warm */
	long first;       /* the run's first step - 1 */
} rate;

static void rate_start(rate *R, long warm, long step)
{
	*R = (rate){.warm = warm, .step0 = step, .steplog = step, .first = step};
	R->t0 = R->tlog = R->start = now_s();
}

/* After `step` steps at time t: starts the measurement when warm-up ends. */
static void rate_tick(rate *R, long step, double t)
{
	if (R->warm > 0 && step == R->first + R->warm) {
		R->step0 = R->steplog = step;
		R->t0 = R->tlog = t;
	}
}

static int rate_measuring(const rate *R, long step)
{
	return step > R->first + R->warm;
}

/* samples/s since the last log line (and after warm-up); 0 before. */
static double rate_log(rate *R, long step, double t, int batch)
{
	double sps = rate_measuring(R, step) && t > R->tlog
			     ? (double)(step - R->steplog) * batch / (t - R->tlog)
			     : 0;
	if (rate_measuring(R, step) || R->warm == 0) {
		R->tlog = t;
		R->steplog = step;
	}
	return sps;
}

/* The run's samples/s after warm-up; a run no longer than the warm-up is
 * measured whole. */
static double rate_final(const rate *R, long step, double t, int batch)
{
	if (rate_measuring(R, step) && t > R->t0)
		return (double)(step - R->step0) * batch / (t - R->t0);
	return step > R->first && t > R->start ? (double)(step - R->first) * batch / (t - R->start)
						: 0;
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
static int skipped_check(loop *L, long step)
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
	if (run >= L->o->max_skipped_steps)
		return hpu__loop_fail(L, "%d step%s in a row (steps %ld to %ld) had a non-finite loss or "
					 "gradients (NaN or Inf) and were skipped: the run diverged "
					 "(--max-skipped-steps %d); lower the learning rate, clip gradients "
					 "(--clip-grad-norm) or check the model's loss%s%s",
				      run, hpu__plural(run), step + 2 - run, step + 1, L->o->max_skipped_steps,
				      sep, first);
	return 0;
}

/* --eval-every-epochs after batch s (from 0) of epoch e: N, after the last
 * batch of every Nth epoch; F below 1 (Lightning's val_check_interval=F),
 * after the batch that reaches each F of the epoch (rounded up) and after
 * its last. */
static int epoch_validates(double f, int e, size_t s, size_t per_epoch)
{
	if (f <= 0)
		return 0;
	if (f >= 1)
		return s + 1 == per_epoch && (e + 1) % (long)f == 0;
	double part = f * (double)per_epoch; /* batches per validation */
	return s + 1 == per_epoch ||
	       floor((double)(s + 1) / part + 1e-9) > floor((double)s / part + 1e-9);
}

/* Trains from L->pos to step `total`: checkpoints every
 * --checkpoint-every steps and at the end; stops early at --stop-at-step. */
static int run_epochs(loop *L, long total, size_t per_epoch, long *steps_out, float *loss_out,
		      double *sps_out)
{
	const hpu_train_opts *o = L->o;
	double norm = 0;
	long step = L->pos.step;
	float loss = 0;
	int e = L->pos.epoch;
	rate R;
	rate_start(&R, o->throughput_warmup, step);
	for (; e < L->epochs && step < total; e++) {
		/* The loader is idle here: the permutation may change. */
		hpu__sampler_permute(L->perm, L->ntrain, L->pos.seed, (uint64_t)e);
		for (size_t i = 0; L->val_map && i < L->ntrain; i++)
			L->perm[i] = L->val_map[L->perm[i]];
		size_t s0 = e == L->pos.epoch ? (size_t)L->pos.batch : 0, end = per_epoch;
		if ((long)(end - s0) > total - step)
			end = s0 + (size_t)(total - step);
		prefetch(L, s0, 0);
		for (size_t s = s0; s < end; s++) {
			double lr = hpu__sched_lr(&L->pos.sched, step);
			int64_t ts = hpu__prof_t0();
			L->epoch = e;
			uint64_t h2d0, d2h0;
			hpu__dev_copied(&h2d0, &d2h0);
			int rc = L->graphs ? graph_step(L, s, step, s + 1 < end, &loss, &norm)
					   : train_step(L, s, step, s + 1 < end, &loss, &norm);
			hpu__dev_step_guard(0); /* where the step failed too */
			if (rc < 0 || skipped_check(L, step) < 0)
				return -1;
			if (o->verbose)
				copied_log(L, step + 1, h2d0, d2h0);
			step++;
			L->epoch = e;
			hpu__prof_span("step", "step", NULL, ts, "\"step\":%ld,\"epoch\":%d", step, e + 1);
			double t = now_s();
			rate_tick(&R, step, t);
			int logs = o->log_every && step % o->log_every == 0;
			if (logs && log_step(L, step, total, e, loss, lr, norm,
					     rate_log(&R, step, t, o->batch_size)) < 0)
				return -1;
			double sps = rate_final(&R, step, t, o->batch_size);
			hpu__loop_report(L, step, total, e, loss, sps,
					 rate_measuring(&R, step) && sps > 0
						 ? (double)(total - step) * o->batch_size / sps
						 : -1,
					 HPU_PHASE_TRAIN, logs);
			if (((o->eval_every && step % o->eval_every == 0) ||
			     epoch_validates(o->eval_every_epochs, e, s, per_epoch)) &&
			    hpu__loop_validate(L, step, e) < 0)
				return -1;
			int stop = (o->stop_at_step > 0 && step == o->stop_at_step) || (L->stop_early && step < total);
			if (o->checkpoint_dir[0] &&
			    ((o->checkpoint_every > 0 && step % o->checkpoint_every == 0) || stop ||
			     step == total) &&
			    save_checkpoint(L, step, e, s, per_epoch) < 0)
				return -1;
			hpu__prof_flush();
			if (stop) {
				if (L->rank == 0 && L->stop_early)
					printf("stopped early after step %ld of %ld (--early-stop %s): %s did not "
					       "improve by more than %g in %ld validation%s; the best, %.4f, was "
					       "at step %ld\n", step, total, o->early_stop, L->es.metric,
					       L->es.min_delta, L->es_wait, hpu__plural(L->es_wait),
					       L->es_best, L->es_best_step);
				else if (L->rank == 0)
					printf("stopped after step %ld of %ld (--stop-at-step)\n", step, total);
				goto done;
			}
		}
	}
done:
	*sps_out = rate_final(&R, step, now_s(), o->batch_size);
	*steps_out = step;
	*loss_out = loss;
	hpu__loop_report(L, step, total, L->epoch, loss, *sps_out, 0, HPU_PHASE_TRAIN, 1);
	return 0;
}

/* --stall-warning; --profile: the trace file, the collectives' events,
 * and the job's first barrier, at which hpu-trace aligns the ranks'
 * clocks. */
static void device_sync(void)
{
	hpu__dev_queue_sync(NULL);
}

static int observe_setup(loop *L)
{
	const hpu_train_opts *o = L->o;
	if (hpu__opts_from(o, "stall-warning") != HPU_FROM_DEFAULT)
		hpucoll_comm_set_stall_warning(L->comm, o->stall_warning > 0 && o->stall_warning < 0.001
								? 1 : (int)(o->stall_warning * 1000));
	if (!o->profile[0])
		return 0;
	const char *nr = hpu__env_str(HPU_ENV_NODE_RANK), *rc_env = hpu__env_str(HPU_ENV_HPU_RESTART_COUNT);
	/* a restarted job's attempt K keeps the earlier attempts' traces */
	char name[600];
	int attempt = 0, node_rank = 0; /* unset or not numbers: 0 */
	hpu__parse_int(rc_env, INT_MIN, INT_MAX, &attempt);
	hpu__parse_int(nr, INT_MIN, INT_MAX, &node_rank);
	if (attempt > 0)
		snprintf(name, sizeof name, "%s-restart%d", o->profile_name, attempt);
	else
		snprintf(name, sizeof name, "%s", o->profile_name);
	hpu_prof_conf c = {
		.dir = o->profile, .name = name, .rank = L->rank, .world = L->world,
		.node_rank = node_rank, .job_id = hpu__env_str(HPU_ENV_HPU_JOB_ID),
		.model = L->b->model && L->b->model->name ? L->b->model->name : "",
		.strategy = hpu__strategy_name(o->strategy),
		.precision = hpu__precision_name(o->precision),
	};
	long sync = 0;
	if (hpu__env_long(HPU_ENV_HPU_PROFILE_SYNC, 0, 1, &sync) < 0)
		return hpu__loop_fail(L, "HPU_PROFILE_SYNC=%s: must be 0 or 1",
				      hpu__env_str(HPU_ENV_HPU_PROFILE_SYNC));
	hpu__prof_set_sync(sync ? device_sync : NULL);
	if (hpu__prof_open(&c, L->err, L->errlen) < 0)
		return -1;
	hpucoll_comm_set_trace(L->comm, hpu__prof_collective, NULL);
	int rc = hpucoll_barrier(L->comm);
	if (rc)
		return hpu__loop_coll_fail(L, "the profiler's first barrier", rc);
	if (L->rank == 0)
		printf("profiling: a Chrome trace per rank in %s/%s-rank<R>.json (hpu-trace merges them)\n",
		       o->profile, name);
	return 0;
}

int hpu__train_run(hpu_builder *b, hpucoll_comm *comm,
		   const hpu_train_opts *o, char *err, size_t errlen)
{
	loop L = {.b = b, .comm = comm, .o = o, .epochs = o->epochs, .err = err, .errlen = errlen};
	L.rank = hpucoll_comm_rank(comm);
	L.world = hpucoll_comm_size(comm);
	L.micro = o->micro_batch;
	L.accum = o->grad_accum;
	L.pos.seed = o->seed;
	err[0] = 0;
	int rc = -1;
	hpu_ckpt *ck = NULL;
	long total = 0;
	size_t per_epoch = 0;
	double tload = now_s();
	if (observe_setup(&L) < 0 || hpu__quant_init(&L.quant, o, err, errlen) < 0 ||
	    hpu__loop_val_setup(&L) < 0 ||
	    (!o->eval_only && run_total(&L, &total, &per_epoch) < 0) ||
	    hpu__checkpoint_find(comm, o, b, &ck, err, errlen) < 0)
		goto out;
	hpu__where.total = total;
	hpu__where.epochs = L.epochs;
	if (L.rank == 0 && L.quant.warning[0])
		printf("warning: %s\n", L.quant.warning);
	/* a resumed run adds to the metrics of the run it continues */
	if (L.rank == 0 && o->metrics[0] && !(L.metrics = fopen(o->metrics, ck ? "a" : "w"))) {
		hpu__loop_fail(&L, "cannot open the metrics file %s: %s", o->metrics, strerror(errno));
		goto out;
	}
	hpu__sched_init(&L.pos.sched, o, total);
	int64_t tl = hpu__prof_t0();
	if (hpu__strat_new(&L.st, b, comm, o, L.micro, ck, err, errlen) < 0 ||
	    (ck && hpu__checkpoint_apply(comm, ck, o, &L.pos, now_s() - tload, L.metrics, err,
					 errlen) < 0))
		goto out;
	hpu__loop_early_resume(&L);
	strict_step(&L); /* before the plan's copies are printed: they depend on it */
	if (o->graphs && graphs_setup(&L) < 0)
		goto out;
	if (o->verbose && L.rank == 0)
		hpu__strat_plan_print(L.st, stdout);
	if (ck)
		hpu__prof_span("checkpoint", "checkpoint_load", NULL, tl, "\"step\":%ld", L.pos.step);
	hpu__where.step = L.pos.step;
	L.epoch = L.pos.epoch < L.epochs ? L.pos.epoch : L.epochs - 1;
	if (alloc_buffers(&L) < 0)
		goto out;
	if (ck) {
		hpu__ckpt_close(ck);
		free(ck);
		ck = NULL;
	}
	long steps = 0;
	float loss = 0;
	double sps = 0;
	evalres ev = {0};
	if (!o->eval_only && run_epochs(&L, total, per_epoch, &steps, &loss, &sps) < 0)
		goto out;
	long done = steps > L.pos.step ? steps : L.pos.step; /* steps trained, resumed ones too */
	if (hpu__hooks_run(L.st, b, b->after_train, b->nafter_train, "after training", done,
			   L.micro, NULL, err, errlen) < 0)
		goto out;
	hpu__prof_in_eval = 1; /* calibration: forward passes too */
	if (L.quant.mode == HPU_FP8_MEASURE && hpu__loop_calibrate(&L) < 0)
		goto out;
	int evaluates = (o->eval || o->eval_only) && b->has_data[HPU_SPLIT_TEST];
	if (evaluates)
		hpu__loop_report(&L, steps, total, L.epoch, loss, sps, -1, HPU_PHASE_EVAL, 1);
	if (evaluates && hpu__loop_evaluate(&L, &ev) < 0)
		goto out;
	hpu__prof_in_eval = 0;
	graphs_said(&L); /* the final evaluation's batches counted too */
	if (evaluates) {
		double fig[HPU_MAX_IO + 1] = {ev.loss};
		memcpy(fig + 1, ev.metric, sizeof ev.metric);
		if (hpu__hooks_run(L.st, b, b->after_eval, b->nafter_eval, "after evaluation",
				   done, L.micro, fig, err, errlen) < 0)
			goto out;
	}
	if (L.quant.mode == HPU_FP8_QUANTIZE)
		hpu__loop_quant_report(&L);
	if (write_final(&L, steps, loss, sps, evaluates ? &ev : NULL) < 0)
		goto out;
	if (o->save_params[0] && hpu__strat_save_params(L.st, o->save_params) < 0)
		goto out;
	if (close_metrics(&L) < 0)
		goto out;
	hpu__loop_report(&L, steps, total, L.epoch, loss, sps, 0, HPU_PHASE_DONE, 1);
	rc = 0;
out:
	hpu__prof_close();
	if (ck) {
		hpu__ckpt_close(ck);
		free(ck);
	}
	free_buffers(&L);
	return rc;
}
