/* resume_apply: hpu__checkpoint_apply -- the run's state taken from the
 * checkpoint once the strategy read its floats: position, seed, schedule,
 * fp8's histories, --early-stop's count, and the report. Calls
 * save_resume_base.c and lrsched.c (save_resume_impl.h). */
#include "worker/runtime/save_resume_impl.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/num.h"
#include "worker/ops/fp8.h"

#define say hpu__say

static int pick(const char *v, const char *(*name)(int), int n)
{
	for (int i = 0; i < n; i++)
		if (v && strcmp(v, name(i)) == 0)
			return i;
	return -1;
}

static const char *sched_name_i(int i)
{
	return hpu__sched_name((hpu_sched_kind)i);
}

static int sched_from(const cJSON *j, hpu_sched *s)
{
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type"),
		    *wt = cJSON_GetObjectItemCaseSensitive(j, "warmup_type");
	int kind = pick(cJSON_IsString(t) ? t->valuestring : NULL, sched_name_i,
			HPU_SCHED_WARMUP_DECAY + 1);
	if (kind < 0)
		return -1;
	s->kind = (hpu_sched_kind)kind;
	s->lr = hpu__ckpt_num(j, "lr", s->lr);
	s->warmup_min_lr = hpu__ckpt_num(j, "warmup_min_lr", s->warmup_min_lr);
	s->warmup_steps = (long)hpu__ckpt_num(j, "warmup_steps", (double)s->warmup_steps);
	s->warmup_type = cJSON_IsString(wt) && !strcmp(wt->valuestring, "linear") ? HPU_WARMUP_LINEAR
										    : HPU_WARMUP_LOG;
	s->total_steps = (long)hpu__ckpt_num(j, "total_steps", (double)s->total_steps);
	s->step_size = (long)hpu__ckpt_num(j, "step_size", (double)s->step_size);
	s->gamma = hpu__ckpt_num(j, "gamma", s->gamma);
	s->min_lr = hpu__ckpt_num(j, "min_lr", s->min_lr);
	return 0;
}

static int floats_from(const cJSON *a, float *v, int n)
{
	if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
		return -1;
	int i = 0;
	const cJSON *x;
	cJSON_ArrayForEach(x, a) v[i++] = cJSON_IsNumber(x) ? (float)x->valuedouble : 0.0f;
	return 0;
}

/* fp8 training's state, when both runs train in fp8 with the same
 * history length; else the histories start afresh (said). */
static int fp8_from(const hpu_ckpt *c, const hpu_train_opts *o, int rank, char *err,
		    size_t errlen)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->m, "fp8");
	if (o->precision != HPU_PREC_FP8 || !cJSON_IsObject(j))
		return 0;
	int H = hpu__fp8_recipe()->history;
	if ((int)hpu__ckpt_num(j, "amax_history_len", -1) != H) {
		if (rank == 0)
			printf("resume: the checkpoint's fp8 amax history is %g steps, this run's %d: "
			       "the histories start afresh\n",
			       hpu__ckpt_num(j, "amax_history_len", -1), H);
		return 0;
	}
	float *hist = malloc((size_t)3 * H * sizeof *hist);
	if (!hist)
		return say(err, errlen, "out of memory");
	const cJSON *s;
	cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(j, "sites")) {
		const cJSON *nm = cJSON_GetObjectItemCaseSensitive(s, "name");
		hpu_fp8_saved sv = {.name = cJSON_IsString(nm) ? nm->valuestring : "",
				    .layer = (int)hpu__ckpt_num(s, "layer", -1),
				    .op = (int)hpu__ckpt_num(s, "op", -1),
				    .k = (int)hpu__ckpt_num(s, "k", 0),
				    .hist = hist,
				    .nhist = (int)hpu__ckpt_num(s, "filled", 0),
				    .pos = (int)hpu__ckpt_num(s, "pos", 0)};
		if (floats_from(cJSON_GetObjectItemCaseSensitive(s, "scale"), sv.scale, 3) < 0 ||
		    floats_from(cJSON_GetObjectItemCaseSensitive(s, "amax_history"), hist, 3 * H) < 0 ||
		    sv.pos < 0 || sv.pos >= H) {
			free(hist);
			return say(err, errlen, "checkpoint %s: a damaged fp8 entry (%s)", c->dir,
				   sv.name);
		}
		if (hpu__fp8_saved_put(&sv) < 0) {
			free(hist);
			return say(err, errlen, "out of memory");
		}
	}
	free(hist);
	return 0;
}

/* --early-stop's count goes on when the checkpoint's rule watched the
 * same metric the same way; else it starts afresh (said). */
static void early_from(const hpu_ckpt *c, const hpu_train_opts *o, hpu_run_pos *pos, int rank)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->m, "early_stop");
	const cJSON *jm = cJSON_GetObjectItemCaseSensitive(j, "metric"),
		    *jo = cJSON_GetObjectItemCaseSensitive(j, "mode");
	hpu_early_stop e;
	char why[256];
	if (!o->early_stop[0] || !cJSON_IsString(jm) || !cJSON_IsString(jo) ||
	    hpu__early_stop_parse(o->early_stop, &e, why, sizeof why) < 0)
		return;
	if (strcmp(jm->valuestring, e.metric) || strcmp(jo->valuestring, e.max ? "max" : "min")) {
		if (rank == 0)
			printf("resume: the checkpoint's early-stop count watched %s:%s, this run "
			       "%s:%s: it starts afresh\n",
			       jm->valuestring, jo->valuestring, e.metric, e.max ? "max" : "min");
		return;
	}
	pos->es_best = hpu__ckpt_num(j, "best", NAN);
	pos->es_best_step = (long)hpu__ckpt_num(j, "best_step", 0);
	pos->es_wait = (long)hpu__ckpt_num(j, "wait", 0);
	pos->es_restored = 1;
	if (rank == 0 && !isnan(pos->es_best))
		printf("resume: --early-stop goes on from the checkpoint: the best %s, %.4f, at step "
		       "%ld; %ld validation%s since without improvement\n",
		       e.metric, pos->es_best, pos->es_best_step, pos->es_wait,
		       hpu__plural(pos->es_wait));
}

/* Every rank's bytes read and verified and seconds, on rank 0's line and
 * in the metrics. */
static int load_report(hpucoll_comm *comm, const hpu_ckpt *c, double secs, FILE *metrics,
		       const char *mpath, char *err, size_t errlen)
{
	int rank = hpucoll_comm_rank(comm), world = hpucoll_comm_size(comm);
	double mine[3] = {(double)c->bytes_read, (double)c->bytes_verified, secs};
	double *all = calloc((size_t)world * 3, sizeof *all);
	if (!all)
		return say(err, errlen, "out of memory");
	int rc = hpucoll_all_gather(comm, mine, all, 3, HPUCOLL_F64);
	if (rc) {
		free(all);
		return say(err, errlen, "checkpoint statistics all-gather failed: %s",
			   hpucoll_comm_why(comm, rc));
	}
	if (rank == 0) {
		double rd = 0, vf = 0, slow = 0;
		cJSON *j = cJSON_CreateObject(), *ranks = cJSON_CreateArray();
		for (int r = 0; r < world; r++) {
			rd += all[3 * r];
			vf += all[3 * r + 1];
			slow = all[3 * r + 2] > slow ? all[3 * r + 2] : slow;
			cJSON *x = cJSON_CreateObject();
			cJSON_AddNumberToObject(x, "rank", r);
			cJSON_AddNumberToObject(x, "bytes_read", all[3 * r]);
			cJSON_AddNumberToObject(x, "bytes_verified", all[3 * r + 1]);
			cJSON_AddNumberToObject(x, "seconds", all[3 * r + 2]);
			cJSON_AddItemToArray(ranks, x);
		}
		printf("resume: %d rank%s verified %.1f MB and read %.1f MB in %.3f s (slowest rank)\n",
		       world, hpu__plural(world), vf / 1e6, rd / 1e6, slow);
		cJSON_AddStringToObject(j, "checkpoint", "loaded");
		cJSON_AddNumberToObject(j, "step", (double)c->step);
		cJSON_AddNumberToObject(j, "seconds", slow);
		cJSON_AddItemToObject(j, "ranks", ranks);
		if (hpu__checkpoint_metrics_put(metrics, mpath, j, err, errlen) < 0) {
			free(all);
			return -1;
		}
	}
	free(all);
	return 0;
}

/* Rank 0: the optimizer, its settings and a fixed --loss-scale are this
 * run's; where the checkpoint's differ, a line says so (they went on in
 * silence). */
static void optim_notes(const hpu_ckpt *c, const hpu_train_opts *o)
{
	const char *mine = hpu__optim_name(o->optimizer);
	if (strcmp(c->optimizer, mine) != 0)
		printf("note: checkpoint %s was saved with --optimizer %s; this run goes on with "
		       "--optimizer %s, its state taken as that one's\n",
		       c->dir, c->optimizer, mine);
	const cJSON *os = cJSON_GetObjectItemCaseSensitive(c->m, "optimizer_settings");
	/* another optimizer: its own settings, but the weight decay every one
	 * has (adamw's default 0.01 became adam's 0 unsaid) */
	int same = strcmp(c->optimizer, mine) == 0;
	if (cJSON_IsObject(os)) {
		const struct {
			const char *key, *flag;
			double now;
		} v[] = {{"momentum", "--momentum", o->momentum},
			 {"nesterov", "--nesterov", o->nesterov},
			 {"beta1", "--beta1", o->beta1},
			 {"beta2", "--beta2", o->beta2},
			 {"eps", "--eps", o->eps},
			 {"weight_decay", "--weight-decay", hpu__opts_weight_decay(o)}};
		char line[800] = "";
		size_t len = 0;
		for (size_t i = 0; i < sizeof v / sizeof *v && len < sizeof line; i++) {
			const cJSON *x = cJSON_GetObjectItemCaseSensitive(os, v[i].key);
			if ((!cJSON_IsNumber(x) && !cJSON_IsBool(x)) ||
			    (!same && strcmp(v[i].key, "weight_decay")))
				continue;
			double was = cJSON_IsBool(x) ? (double)cJSON_IsTrue(x) : x->valuedouble;
			if (was == v[i].now)
				continue;
			int n = cJSON_IsBool(x)
					? snprintf(line + len, sizeof line - len, "%s%s %s (saved: %s)",
						   len ? ", " : "", v[i].flag, v[i].now ? "on" : "off",
						   was ? "on" : "off")
					: snprintf(line + len, sizeof line - len, "%s%s %g (saved: %g)",
						   len ? ", " : "", v[i].flag, v[i].now, was);
			len += n > 0 ? (size_t)n : 0;
		}
		if (len)
			printf("resume: this run's optimizer settings are used where checkpoint %s's "
			       "differ: %s\n",
			       c->dir, line);
	}
	const cJSON *ls = cJSON_GetObjectItemCaseSensitive(c->m, "loss_scaler");
	double saved = hpu__ckpt_num(ls, "scale", 0);
	if (o->precision == HPU_PREC_FP16_MIXED && o->loss_scale > 0 &&
	    strcmp(c->precision, "16-mixed") == 0 && saved > 0 && saved != o->loss_scale)
		printf("resume: --loss-scale %g is used; checkpoint %s's loss scale was %g\n",
		       o->loss_scale, c->dir, saved);
	else if (o->precision == HPU_PREC_FP16_MIXED && !(o->loss_scale > 0) &&
		 strcmp(c->precision, "16-mixed") == 0 &&
		 cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ls, "static")))
		printf("resume: checkpoint %s's loss scale, %g, was a fixed --loss-scale; this run's "
		       "dynamic scale starts afresh at 2^%d\n",
		       c->dir, saved, o->initial_scale_power);
	/* the dynamic scale goes on from the saved one: a first scale given
	 * for this run is not used (it was taken in silence) */
	else if (o->precision == HPU_PREC_FP16_MIXED && !(o->loss_scale > 0) &&
		 strcmp(c->precision, "16-mixed") == 0 && saved > 0 &&
		 hpu__opts_from(o, "initial-scale-power") != HPU_FROM_DEFAULT &&
		 saved != ldexp(1.0, o->initial_scale_power))
		printf("resume: the dynamic loss scale goes on from checkpoint %s's, %g; "
		       "--initial-scale-power %d sets a fresh run's first scale\n",
		       c->dir, saved, o->initial_scale_power);
}

/* The kept schedule's settings that this run's options would change, and
 * that its kind uses (a constant lr has no total steps): said with both
 * values; nothing where none differs. */
static void sched_note(const hpu_sched *k, const hpu_sched *m)
{
	char d[512] = "";
	size_t n = 0;
#define DIFF(cond, ...)                                                                  \
	if ((cond) && n < sizeof d)                                                      \
		n += (size_t)snprintf(d + n, sizeof d - n, "%s", n ? ", " : ""),           \
		n += n < sizeof d ? (size_t)snprintf(d + n, sizeof d - n, __VA_ARGS__) : 0
	hpu_sched_kind kind = k->kind;
	int warm = kind == HPU_SCHED_WARMUP || kind == HPU_SCHED_WARMUP_DECAY;
	DIFF(kind != m->kind, "--scheduler %s (this run's: %s)", hpu__sched_name(k->kind),
	     hpu__sched_name(m->kind));
	DIFF(k->lr != m->lr, "lr %g (this run's: %g)", k->lr, m->lr);
	DIFF((kind == HPU_SCHED_COSINE || kind == HPU_SCHED_WARMUP_DECAY) &&
		     k->total_steps != m->total_steps,
	     "%ld total steps (this run's: %ld)", k->total_steps, m->total_steps);
	DIFF(kind == HPU_SCHED_COSINE && k->min_lr != m->min_lr, "min lr %g (this run's: %g)",
	     k->min_lr, m->min_lr);
	DIFF(kind == HPU_SCHED_STEP && k->step_size != m->step_size,
	     "step size %ld (this run's: %ld)", k->step_size, m->step_size);
	DIFF(kind == HPU_SCHED_STEP && k->gamma != m->gamma, "gamma %g (this run's: %g)",
	     k->gamma, m->gamma);
	DIFF(warm && k->warmup_steps != m->warmup_steps, "%ld warm-up steps (this run's: %ld)",
	     k->warmup_steps, m->warmup_steps);
	DIFF(warm && k->warmup_min_lr != m->warmup_min_lr,
	     "warm-up min lr %g (this run's: %g)", k->warmup_min_lr, m->warmup_min_lr);
	DIFF(warm && k->warmup_type != m->warmup_type, "another warm-up type");
#undef DIFF
	if (!n)
		return;
	const char *past = "";
	if (k->total_steps < m->total_steps && kind == HPU_SCHED_COSINE)
		past = "; past its last step the lr rises again along the cosine (as torch's "
		       "CosineAnnealingLR does)";
	else if (k->total_steps < m->total_steps && kind == HPU_SCHED_WARMUP_DECAY)
		past = "; past its last step the lr is its warm-up min lr";
	char total[40] = ""; /* where the kind has one */
	if (kind == HPU_SCHED_COSINE || kind == HPU_SCHED_WARMUP_DECAY)
		snprintf(total, sizeof total, ", %ld total steps", k->total_steps);
	printf("resume: the checkpoint's learning-rate schedule is kept (%s, lr %g%s): %s%s\n",
	       hpu__sched_name(k->kind), k->lr, total, d, past);
}

int hpu__checkpoint_apply(hpucoll_comm *comm, hpu_ckpt *c, const hpu_train_opts *o,
			  hpu_run_pos *pos, double secs, FILE *metrics, char *err, size_t errlen)
{
	int rank = hpucoll_comm_rank(comm), world = hpucoll_comm_size(comm);
	long gb = (long)hpu__ckpt_num(c->m, "global_batch", -1);
	if (gb != o->batch_size)
		return say(err, errlen,
			   "checkpoint %s was saved with a global batch of %ld; resuming needs the "
			   "same (--batch-size %ld), not %d",
			   c->dir, gb, gb, o->batch_size);
	long ns = (long)hpu__ckpt_num(c->m, "train_samples", -1);
	if (!o->eval_only && ns > 0 && pos->train_samples > 0 && ns != pos->train_samples)
		return say(err, errlen,
			   "checkpoint %s was saved by a run that trained on %ld samples; this run's "
			   "training split has %ld (another --val-fraction, which holds samples out "
			   "only with --eval-every or --eval-every-epochs, or another dataset): "
			   "its epochs' batches would not be the saved run's, so batches would be "
			   "skipped or trained twice",
			   c->dir, ns, pos->train_samples);
	const cJSON *td = cJSON_GetObjectItemCaseSensitive(c->m, "train_digest");
	if (!o->eval_only && cJSON_IsString(td) && pos->train_digest[0] &&
	    strcmp(td->valuestring, pos->train_digest))
		return say(err, errlen,
			   "checkpoint %s was saved by a run that trained on other data: its training "
			   "split has as many samples, but their bytes differ (a digest of the first, "
			   "middle and last: %.20s there, %s here); resume with the data it trained "
			   "on, or start afresh from its parameters (hpu-ckpt export, then --load-params)",
			   c->dir, td->valuestring, pos->train_digest);
	pos->step = c->step;
	pos->epoch = (int)hpu__ckpt_num(c->m, "epoch", 0);
	pos->batch = (long)hpu__ckpt_num(c->m, "batch_in_epoch", 0);
	pos->seed = hpu__checkpoint_seed(c, pos->seed);
	hpu_sched mine = pos->sched;
	if (sched_from(cJSON_GetObjectItemCaseSensitive(c->m, "scheduler"), &pos->sched) < 0)
		return say(err, errlen, "checkpoint %s: the scheduler entry is damaged", c->dir);
	if (c->step == 0) /* the initial model (--max-steps 0): no lr of its schedule was used */
		pos->sched = mine;
	early_from(c, o, pos, rank);
	if (fp8_from(c, o, rank, err, errlen) < 0 ||
	    load_report(comm, c, secs, metrics, o->metrics, err, errlen) < 0)
		return -1;
	if (rank != 0)
		return 0;
	int reshard = c->world != world || strcmp(c->strategy, hpu__strategy_name(o->strategy));
	/* a copy hpu-ckpt reshard wrote: who saved it first */
	const cJSON *rf = cJSON_GetObjectItemCaseSensitive(c->m, "resharded_from");
	const cJSON *rfs = cJSON_GetObjectItemCaseSensitive(rf, "strategy");
	int rfw = (int)hpu__ckpt_num(rf, "world_size", 0);
	char origin[160] = "";
	if (rfw > 0 && cJSON_IsString(rfs))
		snprintf(origin, sizeof origin, "saved by %d worker%s under %.20s, resharded by "
				   "hpu-ckpt for %d under %s",
			 rfw, hpu__plural(rfw), rfs->valuestring, c->world, c->strategy);
	else
		snprintf(origin, sizeof origin, "saved by %d worker%s under %s", c->world,
			 hpu__plural(c->world), c->strategy);
	printf("resumed from %s at step %ld (epoch %d, batch %ld): %s (%s)%s%s%s\n", c->dir,
	       c->step, pos->epoch + 1, pos->batch, origin, c->precision,
	       reshard ? ", resharded for " : "", reshard ? hpu__strategy_name(o->strategy) : "",
	       reshard ? " here" : "");
	if (strcmp(c->precision, hpu__precision_name(o->precision)) != 0)
		printf("note: checkpoint %s was saved at --precision %s; this run goes on at "
		       "--precision %s\n", c->dir, c->precision, hpu__precision_name(o->precision));
	optim_notes(c, o);
	sched_note(&pos->sched, &mine);
	return 0;
}

uint64_t hpu__checkpoint_seed(const hpu_ckpt *c, uint64_t dflt)
{
	const cJSON *rng = cJSON_GetObjectItemCaseSensitive(c->m, "rng");
	const cJSON *seed = cJSON_GetObjectItemCaseSensitive(rng, "seed");
	uint64_t v = dflt;
	if (cJSON_IsString(seed))
		hpu__parse_u64(seed->valuestring, 0, UINT64_MAX, &v); /* checked on open */
	return v;
}
