/* metrics: the loop's log lines and metrics records (loop.h): every
 * rank's device memory and traffic, the loss averaged over the ranks, the
 * final line and record. */
#include "worker/runtime/loop.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "worker/hpu/devmem.h"
#include "worker/hpu/prof.h"
#include "worker/ops/autocast.h"
#include "worker/ops/fp8.h"

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
int hpu__loop_close_metrics(loop *L)
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
int hpu__loop_log_step(loop *L, long step, long total, int epoch, float loss,
		       double lr, double norm, double sps)
{
	int64_t t0 = hpu__prof_t0();
	float l;
	double *all = reduce_for_log(L, loss, step, &l);
	if (!all)
		return -1;
	if (L->rank == 0) {
		/* sps NAN: a step of the throughput warm-up, not measured */
		char rate[32] = "-";
		if (!isnan(sps))
			snprintf(rate, sizeof rate, "%.1f", sps);
		printf("epoch %d/%d step %ld/%ld loss %.4f lr %.3g samples/s %s "
		       "memory_allocated %.1f MiB max_memory_allocated %.1f MiB "
		       "total_memory_available %.1f MiB\n",
		       epoch + 1, L->epochs, step, total, l, lr, rate,
		       mib(all[ST_IN_USE]), mib(all[ST_MAX_IN_USE]), mib(all[ST_LIMIT]));
		if (L->metrics) {
			cJSON *j = cJSON_CreateObject();
			cJSON_AddNumberToObject(j, "step", (double)step);
			cJSON_AddNumberToObject(j, "epoch", epoch + 1);
			cJSON_AddNumberToObject(j, "loss", l);
			cJSON_AddNumberToObject(j, "lr", lr);
			if (L->o->clip_norm > 0)
				cJSON_AddNumberToObject(j, "grad_norm", norm);
			/* every precision's, as the final record's (1 but at 16-mixed) */
			cJSON_AddNumberToObject(j, "loss_scale", hpu__strat_loss_scale(L->st));
			if (isnan(sps))
				cJSON_AddNullToObject(j, "samples_per_sec");
			else
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
int hpu__loop_write_final(loop *L, long steps, float loss, double sps, const evalres *ev)
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
	else if (steps == L->pos.step) /* --max-steps 0: no loss, no rate to say */
		printf("trained 0 steps on %d worker%s (%s): --max-steps 0, the initial model; "
		       "max_memory_allocated %.1f MiB\n",
		       L->world, hpu__plural(L->world), hpu__strategy_name(L->o->strategy),
		       mib(all[ST_MAX_IN_USE]));
	else
		printf("trained %ld step%s on %d worker%s (%s): final loss %.4f, %.1f samples/s, "
		       "%.0f bytes sent per step, max_memory_allocated %.1f MiB\n",
		       steps, hpu__plural(steps), L->world, hpu__plural(L->world), hpu__strategy_name(L->o->strategy), l, sps,
		       all[ST_COMM_BYTES], mib(all[ST_MAX_IN_USE]));
	/* the count is the model's; a resumed run trained fewer itself */
	if (!L->o->eval_only && L->pos.step > 0 && steps > L->pos.step)
		printf("resumed at step %ld: %ld of those steps trained in this run\n", L->pos.step,
		       steps - L->pos.step);
	/* no step of this run (--eval-only, --max-steps 0, resumed at the
	 * end): no loss of its own, null in the record (it wrote 0, which a
	 * reader of a resumed run's file took for its final loss) */
	int trained = !L->o->eval_only && steps > L->pos.step;
	long bad = hpu__strat_bad_total(L->st);
	if (bad)
		printf("%ld step%s skipped for a non-finite loss or gradients\n", bad,
		       bad == 1 ? " was" : "s were");
	/* 16-mixed's overflows while the dynamic scale is above its minimum are
	 * its search, not counted above (nor by --max-skipped-steps): a run
	 * that skipped 19 steps said 3 */
	long scaler = L->o->precision == HPU_PREC_FP16_MIXED && L->o->loss_scale <= 0 && trained
			      ? hpu__strat_skipped(L->st) - L->skipped0 - bad
			      : 0;
	if (scaler > 0)
		printf("%ld %sstep%s skipped for gradient overflows while the loss scale was "
		       "above --min-loss-scale (--max-skipped-steps counts them only at it)\n",
		       scaler, bad ? "more " : "", scaler == 1 ? " was" : "s were");
	if (L->o->verbose && L->o->precision == HPU_PREC_FP8 && trained) {
		uint64_t f8, b16;
		hpu__fp8_products(&f8, &b16);
		printf("fp8: rank 0's linear products: %llu on fp8 arithmetic, %llu on the bf16 "
		       "kernels (eager steps and recordings; a replay is not counted)\n",
		       (unsigned long long)f8, (unsigned long long)b16);
	}
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
		if (trained)
			cJSON_AddNumberToObject(j, "loss", l);
		else
			cJSON_AddNullToObject(j, "loss");
		/* nothing trained, nothing measured: null, as the loss (it
		 * wrote a 0 that reads as a measured rate) */
		if (trained)
			cJSON_AddNumberToObject(j, "samples_per_sec", sps);
		else
			cJSON_AddNullToObject(j, "samples_per_sec");
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
			/* the samples evaluated, as a validation's val_samples */
			cJSON_AddNumberToObject(j, "test_samples", ev->count);
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
