/* eval: the loop's evaluation (loop.h): the test split at the end,
 * validation during training (the test split or --val-fraction's slice of
 * the training split), --early-stop and --keep-best's metrics. */
#include "worker/runtime/loop.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "worker/device/device.h"
#include "worker/hpu/prof.h"
#include "worker/ops/fp8.h"
#include "worker/runtime/sampler.h"

/* An evaluation batch of n samples (in L->eval_bt) added to sums by
 * the host: the loss and each metric read back (a run that is not
 * recordable). */
static int eval_host(loop *L, int n, double *sums)
{
	hpu_builder *b = L->b;
	if (hpu__strat_forward(L->st, &L->eval_bt, 0, 1, -1) < 0)
		return -1;
	if (hpu__fp8_error()) /* every rank meets it at the same op */
		return hpu__loop_fail(L, "QUANT_CONFIG %s: %s", L->quant.config, hpu__fp8_error());
	sums[0] += hpu__strat_loss(L->st) * n;
	for (int k = 0; k < b->nmetrics; k++) {
		const float *v = hpu__strat_tensor(L->st, b->metrics[k].tensor);
		for (int r = 0; r < n; r++)
			sums[1 + k] += v[r];
	}
	return 0;
}

/* An evaluation batch's device work: its forward and its sums added on
 * the device, the step guard on (nothing back to the host inside it). */
static int eval_work(loop *L, const hpu_batch *bt)
{
	hpu__dev_step_guard(1);
	int rc = hpu__strat_forward(L->st, bt, 0, 1, -1) < 0 || hpu__strat_eval_add(L->st) < 0;
	hpu__dev_step_guard(0);
	return rc ? -1 : 0;
}

/* An evaluation batch of n samples added to the device's sums (a
 * recordable run): under --graphs copied into the recording's input
 * buffers (padded to the micro-batch with --pad-last-batch) and
 * recorded, replayed or run eagerly as its size says (graphs.h). */
static int eval_device(loop *L, int n)
{
	const hpu_batch *bt = &L->eval_bt;
	hpu__graph_mode mode = HPU__GRAPH_EAGER;
	if (L->graphs) {
		bt = hpu__graphs_eval_input(L->graphs, bt, L->o->pad_last_batch ? L->micro : n);
		mode = hpu__graphs_eval_mode(L->graphs, bt->n, L->eval_step);
	}
	hpu__strat_eval_rows(L->st, n);
	if (mode == HPU__GRAPH_RECORD && hpu__graphs_eval_begin(L->graphs) < 0)
		mode = HPU__GRAPH_EAGER;
	if (mode == HPU__GRAPH_RECORD) {
		/* host work in the forward would run now, not at each launch */
		const char *host = hpu__strat_forward_host_part(L->st);
		if (host)
			hpu__dev_capture_refuse("%s", host);
		int rc = host ? 0 : eval_work(L, bt);
		int kept = hpu__graphs_eval_end(L->graphs, L->st, L->err, L->errlen);
		if (rc < 0 || kept < 0)
			return -1;
		mode = kept ? HPU__GRAPH_REPLAY : HPU__GRAPH_EAGER; /* nothing ran yet */
	}
	if (mode == HPU__GRAPH_EAGER && eval_work(L, bt) < 0)
		return -1;
	if (mode == HPU__GRAPH_REPLAY) {
		int64_t tr = hpu__prof_t0();
		if (hpu__graphs_eval_launch(L->graphs, L->st, L->err, L->errlen) < 0)
			return -1;
		hpu__prof_span("graph", "graph_replay", NULL, tr, "\"eval_samples\":%d,\"nodes\":{%s}",
				n, hpu__graphs_node_args(L->graphs));
	}
	if (hpu__fp8_error())
		return hpu__loop_fail(L, "QUANT_CONFIG %s: %s", L->quant.config, hpu__fp8_error());
	return hpu__strat_eval_checks(L->st);
}

/* Evaluates the n samples of `split` (through map when not NULL). A
 * recordable run (--graphs, HPU_STRICT_STEP=1) sums the loss and the
 * metrics on the device and reads them once at the end; others read
 * each batch's back, as always: the same doubles either way. */
static int evaluate_on(loop *L, hpu_split split, const uint32_t *map, size_t n_all, evalres *ev)
{
	int64_t t0 = hpu__prof_t0();
	hpu_builder *b = L->b;
	size_t mine = hpu__sampler_eval_count(n_all, L->rank, L->world);
	int nm = b->nmetrics;
	double sums[HPU_MAX_IO + 2] = {0}; /* loss, metrics, count */
	int dev = hpu__strat_recordable(L->st);
	hpu__strat_set_pos(L->st, 0, L->eval_step, L->epoch);
	if (dev && hpu__strat_eval_open(L->st) < 0)
		return -1;
	hpu__dev_event prev = {0};
	for (size_t done = 0; done < mine;) {
		int n = (int)(mine - done < (size_t)L->micro ? mine - done : (size_t)L->micro);
		/* the device path reads nothing back per batch: the previous
		 * batch's copies from the pinned buffers must be done before
		 * they are refilled (a GPU runs them after the host goes on) */
		if (dev && done)
			hpu__dev_event_wait(&prev);
		if (hpu__loop_load_eval_batch(L, split, map, done, n) < 0 ||
		    (dev ? eval_device(L, n) : eval_host(L, n, sums)) < 0)
			return -1;
		if (dev)
			hpu__dev_event_record(NULL, &prev);
		done += (size_t)n;
	}
	if (dev && hpu__strat_eval_close(L->st, sums) < 0)
		return -1;
	if (hpu__loop_forward_even(L, split, map, hpu__sampler_eval_count(n_all, 0, L->world), mine) < 0)
		return -1;
	sums[nm + 1] = (double)mine;
	int rc = hpucoll_all_reduce(L->comm, sums, sums, (size_t)nm + 2, HPUCOLL_F64, HPUCOLL_SUM);
	if (rc)
		return hpu__loop_coll_fail(L, "evaluation all-reduce", rc);
	ev->count = sums[nm + 1];
	ev->loss = ev->count > 0 ? sums[0] / ev->count : NAN;
	for (int k = 0; k < nm; k++)
		ev->metric[k] = ev->count > 0 ? sums[1 + k] / ev->count : NAN;
	hpu__prof_span("eval", "evaluate", NULL, t0, "\"samples\":%.0f", ev->count);
	return 0;
}

int hpu__loop_evaluate(loop *L, evalres *ev)
{
	return evaluate_on(L, HPU_SPLIT_TEST, NULL, L->b->data[HPU_SPLIT_TEST].size, ev);
}

/* The index of validation metric `metric` ("val_loss": -1) among the
 * model's, which option `opt` (given `spec`) names; -2 after saying it
 * names none. */
static int metric_index(loop *L, const char *opt, const char *spec, const char *metric)
{
	const hpu_builder *b = L->b;
	if (!strcmp(metric, "val_loss"))
		return -1;
	for (int k = 0; k < b->nmetrics; k++)
		if (!strcmp(metric + 4, b->metrics[k].name))
			return k;
	char names[256] = "";
	for (int k = 0, n = 0; k < b->nmetrics && n < (int)sizeof names; k++)
		n += snprintf(names + n, sizeof names - (size_t)n, "%s val_%s", k ? "," : "",
			      b->metrics[k].name);
	hpu__loop_fail(L, "%s %s: the model declares no metric %s (it has val_loss%s%s)", opt, spec,
		       metric + 4, b->nmetrics ? " and" : "", names);
	return -2;
}

/* --early-stop: the metric it watches must be the loss or one the model
 * declares. */
static int early_setup(loop *L)
{
	if (hpu__early_stop_parse(L->o->early_stop, &L->es, L->err, L->errlen) < 0)
		return -1;
	L->es_best = NAN;
	L->es_metric = metric_index(L, "--early-stop", L->o->early_stop, L->es.metric);
	return L->es_metric == -2 ? -1 : 0;
}

/* --keep-best: the same check of its metric. */
static int keep_setup(loop *L)
{
	hpu_keep_best k;
	if (hpu__keep_best_parse(L->o->keep_best, &k, L->err, L->errlen) < 0)
		return -1;
	return metric_index(L, "--keep-best", L->o->keep_best, k.metric) == -2 ? -1 : 0;
}

/* A resumed run's --early-stop count, when its checkpoint had the same
 * rule's. */
void hpu__loop_early_resume(loop *L)
{
	if (!L->pos.es_restored)
		return;
	L->es_best = L->pos.es_best;
	L->es_best_step = L->pos.es_best_step;
	L->es_wait = L->pos.es_wait;
}

/* After a validation: one more without improvement, or a new best;
 * every rank holds the same figures and decides alike. */
static void early_check(loop *L, const evalres *ev, long step)
{
	if (L->es.patience <= 0)
		return;
	double v = L->es_metric < 0 ? ev->loss : ev->metric[L->es_metric], d = L->es.min_delta;
	int better = isnan(L->es_best) ? !isnan(v)
		     : L->es.max ? v > L->es_best + d : v < L->es_best - d;
	if (better) {
		L->es_best = v;
		L->es_best_step = step;
		L->es_wait = 0;
	} else if (++L->es_wait >= L->es.patience) {
		L->stop_early = 1;
	}
}

/* --val-fraction: the training split in an order drawn from the seed
 * alone (the same on every rank), its last part held out for validation;
 * else every training sample trains. */
int hpu__loop_val_setup(loop *L)
{
	const hpu_train_opts *o = L->o;
	size_t n = L->b->data[HPU_SPLIT_TRAIN].size;
	L->ntrain = n;
	if (o->eval_only || (!o->eval_every && !o->eval_every_epochs))
		return 0;
	if ((o->early_stop[0] && early_setup(L) < 0) || (o->keep_best[0] && keep_setup(L) < 0))
		return -1;
	if (!(o->val_fraction > 0)) {
		if (!L->b->has_data[HPU_SPLIT_TEST])
			return hpu__loop_fail(L, "%s: the model declares no test split to validate on; hold out part "
						 "of the training split with --val-fraction F",
					      o->eval_every ? "--eval-every" : "--eval-every-epochs");
		return 0;
	}
	size_t nval = (size_t)((double)n * o->val_fraction + 0.5);
	if (nval == 0 || nval >= n)
		return hpu__loop_fail(L, "--val-fraction %.15g of the training split's %zu sample%s holds "
					 "out %zu: nothing to %s", o->val_fraction, n,
				      hpu__plural((long long)n), nval,
				      nval ? "train on" : "validate on");
	if (!(L->val_map = malloc(n * sizeof *L->val_map)))
		return hpu__loop_fail(L, "out of memory holding out the validation samples");
	L->nval = nval;
	size_t span = L->b->overlap[HPU_SPLIT_TRAIN];
	if (span > 1) {
		/* samples that share data (sliding windows): held-out ones at
		 * random would each sit between trained neighbours, and the
		 * validation would read text it trained on */
		L->ntrain = hpu__sampler_holdout_run(L->val_map, n, nval, span, o->seed);
		if (L->ntrain == 0)
			return hpu__loop_fail(L, "--val-fraction %.15g holds out %zu of the training split's "
						 "%zu samples, and its samples overlap (the model says: by "
						 "%zu): none is left to train on that shares nothing with "
						 "them",
					      o->val_fraction, nval, n, span - 1);
		if (L->rank == 0)
			printf("validation: %zu sample%s of the training split held out (--val-fraction "
			       "%g) in one run, and the %zu within %zu of it, whose data overlaps "
			       "it, used for neither; %zu left to train on\n",
			       nval, hpu__plural((long long)nval), o->val_fraction,
			       n - nval - L->ntrain, span - 1, L->ntrain);
		return 0;
	}
	hpu__sampler_permute(L->val_map, n, o->seed, UINT64_MAX);
	L->ntrain = n - nval;
	if (L->rank == 0)
		printf("validation: %zu sample%s of the training split held out (--val-fraction %g), "
		       "%zu left to train on\n", nval, hpu__plural((long long)nval), o->val_fraction,
		       L->ntrain);
	return 0;
}

/* Validation during training after `step` steps of epoch e (from 0):
 * the loss and the model's metrics in the log and the metrics file. */
int hpu__loop_validate(loop *L, long step, int e)
{
	const hpu_builder *b = L->b;
	evalres ev = {0};
	int rc;
	/* the model's fetch() is not called from two threads at once: the
	 * next training batch, already asked for, is fetched first (a failure
	 * is said when training waits for it) */
	for (int k = 0; k < 2; k++) {
		const hpu_batch *bt;
		size_t bad;
		(void)hpu__loader_wait(L->loader, k, &bt, &bad);
	}
	hpu__prof_in_eval = 1;
	L->eval_step = step;
	if (L->val_map)
		rc = evaluate_on(L, HPU_SPLIT_TRAIN, L->val_map + L->ntrain, L->nval, &ev);
	else
		rc = hpu__loop_evaluate(L, &ev);
	hpu__prof_in_eval = 0;
	if (rc == 0) {
		early_check(L, &ev, step);
		L->vstep = step;
		L->vloss = ev.loss;
		memcpy(L->vmetric, ev.metric, sizeof L->vmetric);
	}
	if (rc < 0 || L->rank != 0)
		return rc;
	printf("epoch %d/%d step %ld validation: val_loss %.4f", e + 1, L->epochs, step, ev.loss);
	for (int k = 0; k < b->nmetrics; k++)
		printf(" val_%s %.4f", b->metrics[k].name, ev.metric[k]);
	printf(" (%.0f samples)\n", ev.count);
	if (!L->metrics)
		return 0;
	cJSON *j = cJSON_CreateObject();
	cJSON_AddNumberToObject(j, "step", (double)step);
	cJSON_AddNumberToObject(j, "epoch", e + 1);
	cJSON_AddNumberToObject(j, "val_loss", ev.loss);
	for (int k = 0; k < b->nmetrics; k++) {
		char key[96];
		snprintf(key, sizeof key, "val_%s", b->metrics[k].name);
		cJSON_AddNumberToObject(j, key, ev.metric[k]);
	}
	cJSON_AddNumberToObject(j, "val_samples", ev.count);
	return hpu__loop_print_json(L, j);
}
