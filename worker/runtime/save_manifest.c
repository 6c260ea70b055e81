/* save_manifest: a save's manifest (the run's position and state, the
 * parameters, every rank's shard, the buffers file) and --keep's plan,
 * written by rank 0 once every shard is in place, then published and
 * pruned. Calls no other file of the folder but lrsched.c
 * (save_resume_impl.h). */
#include "worker/runtime/save_resume_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "worker/ops/fp8.h"

#define say hpu__say

static cJSON *seed_json(uint64_t seed)
{
	char buf[32];
	snprintf(buf, sizeof buf, "%llu", (unsigned long long)seed);
	return cJSON_CreateString(buf);
}

/* The optimizer's settings, for a resume to say which differ (its
 * state goes on under this run's). */
static cJSON *optim_json(const hpu_train_opts *o)
{
	cJSON *j = cJSON_CreateObject();
	if (o->optimizer == HPU_OPTIM_SGD) {
		cJSON_AddNumberToObject(j, "momentum", o->momentum);
		cJSON_AddBoolToObject(j, "nesterov", o->nesterov);
	} else {
		cJSON_AddNumberToObject(j, "beta1", o->beta1);
		cJSON_AddNumberToObject(j, "beta2", o->beta2);
		cJSON_AddNumberToObject(j, "eps", o->eps);
	}
	cJSON_AddNumberToObject(j, "weight_decay", hpu__opts_weight_decay(o));
	return j;
}

static cJSON *sched_json(const hpu_sched *s)
{
	cJSON *j = cJSON_CreateObject();
	cJSON_AddStringToObject(j, "type", hpu__sched_name(s->kind));
	cJSON_AddNumberToObject(j, "lr", s->lr);
	cJSON_AddNumberToObject(j, "warmup_min_lr", s->warmup_min_lr);
	cJSON_AddNumberToObject(j, "warmup_steps", (double)s->warmup_steps);
	cJSON_AddStringToObject(j, "warmup_type", s->warmup_type == HPU_WARMUP_LINEAR ? "linear" : "log");
	cJSON_AddNumberToObject(j, "total_steps", (double)s->total_steps);
	cJSON_AddNumberToObject(j, "step_size", (double)s->step_size);
	cJSON_AddNumberToObject(j, "gamma", s->gamma);
	cJSON_AddNumberToObject(j, "min_lr", s->min_lr);
	return j;
}

static cJSON *floats_json(const float *v, int n)
{
	cJSON *a = cJSON_CreateArray();
	for (int i = 0; i < n; i++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
	return a;
}

/* fp8 training's per-call-site scales and amax histories (every rank
 * holds the same after the step's amax reduction). */
static cJSON *fp8_json(const hpu_train_opts *o)
{
	const hpu_fp8_recipe *r = hpu__fp8_recipe();
	cJSON *j = cJSON_CreateObject(), *sites = cJSON_CreateArray();
	cJSON_AddNumberToObject(j, "amax_history_len", r->history);
	cJSON_AddNumberToObject(j, "margin", o->fp8_margin);
	for (int i = 0; i < hpu__fp8_count(); i++) {
		hpu_fp8_saved sv;
		if (hpu__fp8_saved_get(i, &sv) < 0)
			continue;
		cJSON *s = cJSON_CreateObject();
		cJSON_AddStringToObject(s, "name", sv.name);
		cJSON_AddNumberToObject(s, "layer", sv.layer);
		cJSON_AddNumberToObject(s, "op", sv.op);
		cJSON_AddNumberToObject(s, "k", sv.k);
		cJSON_AddItemToObject(s, "scale", floats_json(sv.scale, 3));
		cJSON_AddNumberToObject(s, "filled", sv.nhist);
		cJSON_AddNumberToObject(s, "pos", sv.pos);
		cJSON_AddItemToObject(s, "amax_history", floats_json(sv.hist, 3 * r->history));
		cJSON_AddItemToArray(sites, s);
	}
	cJSON_AddItemToObject(j, "sites", sites);
	return j;
}

static cJSON *params_json(const hpu_builder *b)
{
	cJSON *arr = cJSON_CreateArray();
	uint64_t at = 0;
	for (int i = 0; i < b->nparams; i++) {
		const hpu_param_info *p = &b->params[i];
		cJSON *j = cJSON_CreateObject(), *shape = cJSON_CreateArray();
		cJSON_AddStringToObject(j, "name", p->name);
		for (int d = 0; d < p->ndim; d++)
			cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)p->shape[d]));
		cJSON_AddItemToObject(j, "shape", shape);
		cJSON_AddStringToObject(j, "dtype", "F32");
		cJSON_AddNumberToObject(j, "offset", (double)at);
		cJSON_AddNumberToObject(j, "numel", (double)p->numel);
		cJSON_AddItemToArray(arr, j);
		at += p->numel;
	}
	return arr;
}

static const char *sync_name(hpu_buffer_sync sync)
{
	return sync == HPU_BUFFER_MEAN ? "mean" : sync == HPU_BUFFER_LOCAL ? "local" : "broadcast";
}

/* The manifest's "buffers": file bf holding every buffer, unpadded, in
 * declaration order. NULL when out of memory. */
static cJSON *buffers_json(const hpu_builder *b, const hpu_ckpt_file *bf)
{
	hpu_ckpt_buffer *v = calloc((size_t)b->nbuffers, sizeof *v);
	if (!v)
		return NULL;
	uint64_t at = 0;
	for (int i = 0; i < b->nbuffers; i++) {
		const hpu_buffer_info *bi = &b->buffers[i];
		snprintf(v[i].name, sizeof v[i].name, "%s", bi->name);
		v[i].ndim = bi->ndim;
		memcpy(v[i].shape, bi->shape, (size_t)bi->ndim * sizeof *bi->shape);
		v[i].offset = at;
		v[i].numel = bi->numel;
		snprintf(v[i].sync, sizeof v[i].sync, "%s", sync_name(bi->sync));
		at += bi->numel;
	}
	cJSON *j = hpu__ckpt_buffers_json(bf, v, b->nbuffers);
	free(v);
	return j;
}

/* The last validation's figures, when there was one. */
static cJSON *validation_json(const hpu_builder *b, const hpu_run_pos *pos)
{
	cJSON *j = cJSON_CreateObject();
	cJSON_AddNumberToObject(j, "step", (double)pos->vstep);
	cJSON_AddNumberToObject(j, "val_loss", pos->vloss);
	for (int k = 0; k < b->nmetrics; k++) {
		char key[96];
		snprintf(key, sizeof key, "val_%s", b->metrics[k].name);
		cJSON_AddNumberToObject(j, key, pos->vmetric[k]);
	}
	return j;
}

/* --early-stop's rule and count (a best of NAN prints as null). */
static cJSON *early_json(const hpu_train_opts *o, const hpu_run_pos *pos)
{
	hpu_early_stop e;
	char why[256];
	if (hpu__early_stop_parse(o->early_stop, &e, why, sizeof why) < 0)
		return NULL; /* hpu__opts_resolve checked it */
	cJSON *j = cJSON_CreateObject();
	cJSON_AddStringToObject(j, "metric", e.metric);
	cJSON_AddStringToObject(j, "mode", e.max ? "max" : "min");
	cJSON_AddNumberToObject(j, "best", pos->es_best);
	cJSON_AddNumberToObject(j, "best_step", (double)pos->es_best_step);
	cJSON_AddNumberToObject(j, "wait", (double)pos->es_wait);
	return j;
}

/* Rank 0: the manifest of the shards every rank wrote (all[world]) and of
 * the buffers file (bf, when the model has buffers). */
static cJSON *manifest(hpucoll_comm *comm, const hpu_train_opts *o, const hpu_builder *b,
		       hpu_strat *st, const hpu_run_pos *pos, const rec *all,
		       const hpu_ckpt_file *bf, char *err, size_t errlen)
{
	int world = hpucoll_comm_size(comm);
	hpu_strat_state ss;
	hpu__strat_get_state(st, &ss);
	const char *names[3];
	int ns = hpu__strat_ckpt_sections(st, names);
	cJSON *m = cJSON_CreateObject();
	cJSON_AddStringToObject(m, "format", HPU_CKPT_FORMAT);
	cJSON_AddNumberToObject(m, "version", HPU_CKPT_VERSION);
	const char *slash = strrchr(b->path, '/');
	cJSON_AddStringToObject(m, "model", slash ? slash + 1 : b->path);
	cJSON_AddNumberToObject(m, "world_size", world);
	cJSON_AddStringToObject(m, "strategy", hpu__strategy_name(o->strategy));
	cJSON_AddStringToObject(m, "precision", hpu__precision_name(o->precision));
	cJSON_AddStringToObject(m, "optimizer", hpu__optim_name(o->optimizer));
	cJSON_AddItemToObject(m, "optimizer_settings", optim_json(o));
	cJSON_AddItemToObject(m, "placement", hpu__strat_plan_json(st));
	cJSON_AddNumberToObject(m, "step", (double)pos->step);
	cJSON_AddNumberToObject(m, "epoch", pos->epoch);
	cJSON_AddNumberToObject(m, "batch_in_epoch", (double)pos->batch);
	cJSON_AddNumberToObject(m, "global_batch", o->batch_size);
	if (pos->train_samples > 0)
		cJSON_AddNumberToObject(m, "train_samples", (double)pos->train_samples);
	if (pos->train_digest[0])
		cJSON_AddStringToObject(m, "train_digest", pos->train_digest);
	cJSON *rng = cJSON_CreateObject();
	cJSON_AddItemToObject(rng, "seed", seed_json(pos->seed));
	cJSON_AddStringToObject(rng, "sampler",
				"permutation of epoch e from (seed, e); no other random state");
	cJSON_AddItemToObject(m, "rng", rng);
	cJSON_AddItemToObject(m, "scheduler", sched_json(&pos->sched));
	cJSON_AddNumberToObject(m, "optimizer_steps", (double)ss.opt_steps);
	cJSON *ls = cJSON_CreateObject();
	cJSON_AddNumberToObject(ls, "scale", ss.loss_scale);
	cJSON_AddNumberToObject(ls, "hysteresis_left", ss.hysteresis_left);
	cJSON_AddNumberToObject(ls, "steps", (double)ss.scaler_steps);
	cJSON_AddNumberToObject(ls, "last_overflow", (double)ss.last_overflow);
	cJSON_AddNumberToObject(ls, "skipped", (double)ss.skipped);
	/* a fixed --loss-scale's: no state of the dynamic scaler's (a
	 * dynamic run resumed from it starts its own scale) */
	if (o->precision == HPU_PREC_FP16_MIXED && o->loss_scale > 0)
		cJSON_AddTrueToObject(ls, "static");
	cJSON_AddItemToObject(m, "loss_scaler", ls);
	if (o->precision == HPU_PREC_FP8)
		cJSON_AddItemToObject(m, "fp8", fp8_json(o));
	if (pos->vstep > 0)
		cJSON_AddItemToObject(m, "validation", validation_json(b, pos));
	cJSON *es = o->early_stop[0] ? early_json(o, pos) : NULL;
	if (es)
		cJSON_AddItemToObject(m, "early_stop", es);
	cJSON_AddNumberToObject(m, "numel", (double)b->psi);
	cJSON_AddItemToObject(m, "parameters", params_json(b));
	cJSON *secs = cJSON_CreateArray();
	for (int k = 0; k < ns; k++)
		cJSON_AddItemToArray(secs, cJSON_CreateString(names[k]));
	cJSON_AddItemToObject(m, "sections", secs);
	cJSON *files = cJSON_CreateArray();
	cJSON_AddItemToObject(m, "files", files);
	for (int r = 0; r < world; r++) {
		hpu_ckpt_file f = {.bytes = (uint64_t)all[r].bytes};
		hpu__ckpt_shard_name(r, world, f.name, sizeof f.name);
		memcpy(f.sha256, all[r].sha256, sizeof f.sha256);
		if (hpu__strat_ckpt_segments(st, r, &f.seg, &f.nseg) < 0) {
			say(err, errlen, "out of memory");
			cJSON_Delete(m);
			return NULL;
		}
		cJSON_AddItemToArray(files, hpu__ckpt_file_json(&f));
		free(f.seg);
	}
	if (b->nbuffers) { /* no key without buffers: as before buffers existed */
		cJSON *bj = buffers_json(b, bf);
		if (!bj) {
			say(err, errlen, "out of memory");
			cJSON_Delete(m);
			return NULL;
		}
		cJSON_AddItemToObject(m, "buffers", bj);
	}
	return m;
}

/* --keep-last and --keep-best: what survives this save. */
typedef struct keeping {
	hpu_keep_best kb; /* kb.k 0: no --keep-best */
	hpu_ckpt_keep k;
	char **best, **last;
} keeping;

/* The checkpoint's own value of the --keep-best metric: its step's
 * validation, else NAN (it is kept only as one of the newest). */
static double keep_value(const keeping *K, const hpu_builder *b, const hpu_run_pos *pos)
{
	if (!K->kb.k || pos->vstep != pos->step)
		return NAN;
	if (!strcmp(K->kb.metric, "val_loss"))
		return pos->vloss;
	for (int i = 0; i < b->nmetrics; i++)
		if (!strcmp(K->kb.metric + 4, b->metrics[i].name))
			return pos->vmetric[i];
	return NAN;
}

/* Rank 0: which checkpoints survive the save of `name`. */
static int keep_plan(keeping *K, const hpu_train_opts *o, const hpu_builder *b,
		     const hpu_run_pos *pos, const char *name, char *msg, size_t msglen)
{
	if (o->keep_best[0] && hpu__keep_best_parse(o->keep_best, &K->kb, msg, msglen) < 0)
		return -1;
	K->k = (hpu_ckpt_keep){.last = o->keep_last ? o->keep_last : o->keep ? o->keep : 1,
			       .best = K->kb.k, .max = K->kb.max, .metric = K->kb.metric};
	return hpu__ckpt_keep_plan(o->checkpoint_dir, &K->k, name, keep_value(K, b, pos), &K->best,
				   &K->last, msg, msglen);
}

static cJSON *names_json(char **names)
{
	cJSON *a = cJSON_CreateArray();
	for (char **p = names; p && *p; p++)
		cJSON_AddItemToArray(a, cJSON_CreateString(*p));
	return a;
}

/* The manifest's "keep": the rule and what it kept at this save. */
static cJSON *keep_json(const keeping *K)
{
	cJSON *j = cJSON_CreateObject();
	cJSON_AddNumberToObject(j, "last_k", K->k.last);
	cJSON_AddItemToObject(j, "last", names_json(K->last));
	if (K->k.best) {
		cJSON_AddStringToObject(j, "metric", K->kb.metric);
		cJSON_AddStringToObject(j, "mode", K->kb.max ? "max" : "min");
		cJSON_AddNumberToObject(j, "best_k", K->k.best);
		cJSON_AddItemToObject(j, "best", names_json(K->best));
	}
	return j;
}

/* Rank 0, after every shard is in place: the manifest, then publishing
 * and pruning (--keep, or --keep-last and --keep-best). */
int hpu__checkpoint_finish(hpucoll_comm *comm, const hpu_train_opts *o, const hpu_builder *b,
			   hpu_strat *st, const hpu_run_pos *pos, const rec *all,
			   const hpu_ckpt_file *bf, const char *partial, const char *name,
			   char *msg, size_t msglen)
{
	keeping K = {0};
	int keeps = o->keep_best[0] || o->keep_last, rc = -1;
	char *text = NULL, path[1200];
	cJSON *m;
	if (keeps && keep_plan(&K, o, b, pos, name, msg, msglen) < 0)
		goto out;
	if (!(m = manifest(comm, o, b, st, pos, all, bf, msg, msglen)))
		goto out;
	if (keeps)
		cJSON_AddItemToObject(m, "keep", keep_json(&K));
	text = hpu__ckpt_manifest_text(m); /* with its own digest */
	cJSON_Delete(m);
	if (!text) {
		say(msg, msglen, "out of memory");
		goto out;
	}
	snprintf(path, sizeof path, "%s/%s/%s", o->checkpoint_dir, partial, HPU_CKPT_MANIFEST);
	rc = hpu__write_atomic(path, text, strlen(text), msg, msglen);
	if (rc == 0)
		rc = hpu__ckpt_publish(o->checkpoint_dir, partial, name, keeps ? 0 : o->keep, msg,
				       msglen);
	if (rc == 0 && keeps)
		rc = hpu__ckpt_prune(o->checkpoint_dir, K.best, K.last, msg, msglen);
out:
	free(text);
	hpu__ckpt_free_names(K.best);
	hpu__ckpt_free_names(K.last);
	return rc;
}
