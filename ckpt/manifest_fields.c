/* manifest_fields: reading and checking the manifest's single fields:
 * numbers in range, names from a list, the run's state beside the floats
 * (position, schedule, loss scaler, fp8's scales). */
#include "ckpt/ckpt_impl.h"
#include "common/num.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "options/config.h" /* the options' kinds and limits */

/* ---- reading the manifest ---- */

double hpu__ckpt_num(const cJSON *o, const char *key, double dflt)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(j) ? j->valuedouble : dflt;
}

int hpu__ckpt_get_num(const cJSON *o, const char *key, double *v)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!cJSON_IsNumber(j))
		return -1;
	*v = j->valuedouble;
	return 0;
}

/* A non-negative integer below 2^53 (exact in a double). */
int hpu__ckpt_get_u64(const cJSON *o, const char *key, uint64_t *v)
{
	double d;
	if (hpu__ckpt_get_num(o, key, &d) < 0 || d < 0 || d > SAFE_INT || d != (double)(uint64_t)d)
		return -1;
	*v = (uint64_t)d;
	return 0;
}

int hpu__ckpt_get_str(const cJSON *o, const char *key, char *buf, size_t n)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!cJSON_IsString(j) || strlen(j->valuestring) >= n)
		return -1;
	memcpy(buf, j->valuestring, strlen(j->valuestring) + 1);
	return 0;
}

/* ---- checking the fields ---- */

/* Number `key` of object o (the manifest, or the part of it that ctx
 * names), in [lo, hi] and whole if asked, into *v (when v is not NULL).
 * An optional field may be absent (*v is left alone). Returns 0, or -1
 * with a sentence naming the field and its value. */
int hpu__ckpt_check_num(const cJSON *o, const char *ctx, const char *key, int required, int whole,
			double lo, double hi, double *v, char *err, size_t errlen)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!j && !required)
		return 0;
	if (!cJSON_IsNumber(j))
		return say(err, errlen, "%s: %s is %s", ctx, key, j ? "not a number" : "missing");
	double d = j->valuedouble;
	/* in range first: NaN fails it, and then d fits an int64_t */
	if (!(d >= lo && d <= hi) || (whole && d != (double)(int64_t)d))
		return say(err, errlen, "%s: %s %.16g is out of range (%s from %.16g to %.16g)", ctx,
			   key, d, whole ? "a whole number" : "a number", lo, hi);
	if (v)
		*v = d;
	return 0;
}

/* String `key` of o, one of the n names name(0..n-1), copied into
 * buf[len] when buf is not NULL. Returns 0, or -1 with a sentence naming
 * the field, its value and the names it may have. */
int hpu__ckpt_check_name(const cJSON *o, const char *ctx, const char *key, int required,
			 const char *(*name)(int), int n, char *buf, size_t len, char *err,
			 size_t errlen)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!j && !required)
		return 0;
	if (!cJSON_IsString(j))
		return say(err, errlen, "%s: %s is %s", ctx, key, j ? "not a string" : "missing");
	for (int k = 0; k < n; k++)
		if (!strcmp(j->valuestring, name(k))) {
			if (buf)
				snprintf(buf, len, "%s", name(k));
			return 0;
		}
	char list[256] = "";
	for (int k = 0, at = 0; k < n && at < (int)sizeof list; k++)
		at += snprintf(list + at, sizeof list - (size_t)at, "%s%s", k ? ", " : "", name(k));
	return say(err, errlen, "%s: %s \"%.80s\" is not one of %s", ctx, key, j->valuestring,
		   list);
}

const char *hpu__ckpt_strategy_at(int k)
{
	return hpu__strategy_name((hpu_strategy)k);
}

const char *hpu__ckpt_precision_at(int k)
{
	return hpu__precision_name((hpu_precision)k);
}

const char *hpu__ckpt_optimizer_at(int k)
{
	return hpu__optim_name((hpu_optim_kind)k);
}

static const char *sched_at(int k)
{
	return hpu__sched_name((hpu_sched_kind)k);
}

static const char *warmup_at(int k)
{
	return k == HPU_WARMUP_LINEAR ? "linear" : "log";
}

const char *hpu__ckpt_dtype_at(int k)
{
	(void)k;
	return "F32"; /* the only dtype a checkpoint holds */
}

/* The learning-rate schedule, as hpu__sched_init resolves it. */
static int check_sched(const cJSON *j, const char *mpath, char *err, size_t errlen)
{
	char ctx[4400];
	snprintf(ctx, sizeof ctx, "%s: scheduler", mpath);
	if (!cJSON_IsObject(j))
		return say(err, errlen, "%s is not an object", ctx);
	if (hpu__ckpt_check_name(j, ctx, "type", REQUIRED, sched_at, HPU_SCHED_WARMUP_DECAY + 1,
				 NULL, 0, err, errlen) < 0 ||
	    hpu__ckpt_check_name(j, ctx, "warmup_type", OPTIONAL, warmup_at, HPU_WARMUP_LINEAR + 1,
				 NULL, 0, err, errlen) < 0)
		return -1;
	static const char *const rates[] = {"lr", "warmup_min_lr", "gamma", "min_lr"};
	for (size_t k = 0; k < sizeof rates / sizeof *rates; k++)
		if (hpu__ckpt_check_num(j, ctx, rates[k], OPTIONAL, REAL, 0, MAX_LR, NULL, err, errlen) < 0)
			return -1;
	if (hpu__ckpt_check_num(j, ctx, "warmup_steps", OPTIONAL, WHOLE, 2, MAX_STEPS, NULL, err,
				errlen) < 0 ||
	    hpu__ckpt_check_num(j, ctx, "total_steps", OPTIONAL, WHOLE, 1, MAX_STEPS, NULL, err,
				errlen) < 0 ||
	    hpu__ckpt_check_num(j, ctx, "step_size", OPTIONAL, WHOLE, 1, MAX_STEPS, NULL, err,
				errlen) < 0)
		return -1;
	return 0;
}

/* The dynamic loss scaler of 16-mixed (its scale is 1 otherwise). */
static int check_scaler(const cJSON *j, const char *mpath, char *err, size_t errlen)
{
	char ctx[4400];
	snprintf(ctx, sizeof ctx, "%s: loss_scaler", mpath);
	if (!cJSON_IsObject(j))
		return say(err, errlen, "%s is not an object", ctx);
	if (hpu__ckpt_check_num(j, ctx, "scale", OPTIONAL, REAL, 1e-300, 1e300, NULL, err,
				errlen) < 0 ||
	    hpu__ckpt_check_num(j, ctx, "hysteresis_left", OPTIONAL, WHOLE, 0, MAX_INT, NULL, err,
				errlen) < 0 ||
	    hpu__ckpt_check_num(j, ctx, "steps", OPTIONAL, WHOLE, 0, MAX_STEPS, NULL, err,
				errlen) < 0 ||
	    hpu__ckpt_check_num(j, ctx, "last_overflow", OPTIONAL, WHOLE, -1, MAX_STEPS, NULL, err,
				errlen) < 0 ||
	    hpu__ckpt_check_num(j, ctx, "skipped", OPTIONAL, WHOLE, 0, MAX_STEPS, NULL, err,
				errlen) < 0)
		return -1;
	return 0;
}

/* optimizer_settings: an object of finite numbers and booleans. */
static int check_optim(const cJSON *j, const char *mpath, char *err, size_t errlen)
{
	if (!cJSON_IsObject(j))
		return say(err, errlen, "%s: optimizer_settings is not an object", mpath);
	for (const cJSON *x = j->child; x; x = x->next)
		if (!cJSON_IsBool(x) && !(cJSON_IsNumber(x) && isfinite(x->valuedouble)))
			return say(err, errlen,
				   "%s: optimizer_settings: %.40s is not a finite number or a boolean",
				   mpath, x->string ? x->string : "?");
	return 0;
}

/* n finite numbers of at least `lo` (a scale, an amax history). */
static int check_floats(const cJSON *a, const char *ctx, const char *key, int n, double lo,
			char *err, size_t errlen)
{
	if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
		return say(err, errlen, "%s: %s is not a list of %d numbers", ctx, key, n);
	const cJSON *x;
	cJSON_ArrayForEach(x, a) {
		if (!cJSON_IsNumber(x) || !(x->valuedouble >= lo && x->valuedouble <= 1e300))
			return say(err, errlen, "%s: %s holds %s (numbers from %g wanted)", ctx, key,
				   cJSON_IsNumber(x) ? "a number out of range" : "something else", lo);
	}
	return 0;
}

/* fp8 training's delayed-scaling state: per call site its scales (x, w,
 * dy) and amax histories, 3 x amax_history_len floats. */
static int check_fp8(const cJSON *j, const char *mpath, char *err, size_t errlen)
{
	char ctx[4500];
	double hlen;
	snprintf(ctx, sizeof ctx, "%s: fp8", mpath);
	if (!cJSON_IsObject(j))
		return say(err, errlen, "%s is not an object", ctx);
	const cJSON *sites = cJSON_GetObjectItemCaseSensitive(j, "sites"), *s;
	if (hpu__ckpt_check_num(j, ctx, "amax_history_len", REQUIRED, WHOLE, 1, 1 << 20, &hlen, err,
				errlen) < 0 ||
	    hpu__ckpt_check_num(j, ctx, "margin", OPTIONAL, WHOLE, 0, 64, NULL, err, errlen) < 0)
		return -1;
	if (!cJSON_IsArray(sites))
		return say(err, errlen, "%s: sites is not a list", ctx);
	int k = 0, h = (int)hlen;
	cJSON_ArrayForEach(s, sites) {
		const cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "name");
		snprintf(ctx, sizeof ctx, "%s: fp8 site %d", mpath, k++);
		if (!cJSON_IsString(name))
			return say(err, errlen, "%s has no name", ctx);
		snprintf(ctx, sizeof ctx, "%s: fp8 site %.200s", mpath, name->valuestring);
		if (hpu__ckpt_check_num(s, ctx, "layer", REQUIRED, WHOLE, 0, MAX_INT, NULL, err, errlen) < 0 ||
		    hpu__ckpt_check_num(s, ctx, "op", REQUIRED, WHOLE, 0, MAX_INT, NULL, err, errlen) < 0 ||
		    hpu__ckpt_check_num(s, ctx, "k", OPTIONAL, WHOLE, 0, MAX_INT, NULL, err, errlen) < 0 ||
		    hpu__ckpt_check_num(s, ctx, "filled", REQUIRED, WHOLE, 0, h, NULL, err, errlen) < 0 ||
		    hpu__ckpt_check_num(s, ctx, "pos", REQUIRED, WHOLE, 0, h - 1, NULL, err, errlen) < 0 ||
		    check_floats(cJSON_GetObjectItemCaseSensitive(s, "scale"), ctx, "scale", 3, 1e-300,
				 err, errlen) < 0 ||
		    check_floats(cJSON_GetObjectItemCaseSensitive(s, "amax_history"), ctx,
				 "amax_history", 3 * h, 0, err, errlen) < 0)
			return -1;
	}
	return 0;
}

/* The run's position and state beside the floats: where it stopped, the
 * data order, the schedule, the loss scaler, fp8's scales. Each is
 * checked where present (hand-made manifests may leave them out). */
int hpu__ckpt_check_run(const cJSON *m, const char *mpath, char *err, size_t errlen)
{
	const cJSON *rng = cJSON_GetObjectItemCaseSensitive(m, "rng"), *x;
	if ((x = cJSON_GetObjectItemCaseSensitive(m, "model")) && !cJSON_IsString(x))
		return say(err, errlen, "%s: model is not a string", mpath);
	if (hpu__ckpt_check_num(m, mpath, "epoch", OPTIONAL, WHOLE, 0, 1e6, NULL, err,
				errlen) < 0 ||
	    hpu__ckpt_check_num(m, mpath, "batch_in_epoch", OPTIONAL, WHOLE, 0, MAX_STEPS, NULL,
				err, errlen) < 0 ||
	    hpu__ckpt_check_num(m, mpath, "global_batch", OPTIONAL, WHOLE, 1, 1 << 24, NULL, err,
				errlen) < 0 ||
	    hpu__ckpt_check_num(m, mpath, "train_samples", OPTIONAL, WHOLE, 1, 4294967295.0, NULL,
				err, errlen) < 0 ||
	    hpu__ckpt_check_num(m, mpath, "optimizer_steps", OPTIONAL, WHOLE, 0, MAX_STEPS, NULL,
				err, errlen) < 0)
		return -1;
	if (rng) {
		const cJSON *seed = cJSON_GetObjectItemCaseSensitive(rng, "seed");
		const char *v = cJSON_IsString(seed) ? seed->valuestring : "";
		uint64_t u;
		if (!cJSON_IsObject(rng) || !isdigit((unsigned char)v[0]) ||
		    hpu__parse_u64(v, 0, UINT64_MAX, &u))
			return say(err, errlen, "%s: rng: seed \"%.40s\" is not a whole number below 2^64",
				   mpath, v);
	}
	if ((x = cJSON_GetObjectItemCaseSensitive(m, "scheduler")) &&
	    check_sched(x, mpath, err, errlen) < 0)
		return -1;
	if ((x = cJSON_GetObjectItemCaseSensitive(m, "loss_scaler")) &&
	    check_scaler(x, mpath, err, errlen) < 0)
		return -1;
	if ((x = cJSON_GetObjectItemCaseSensitive(m, "optimizer_settings")) &&
	    check_optim(x, mpath, err, errlen) < 0)
		return -1;
	if ((x = cJSON_GetObjectItemCaseSensitive(m, "fp8")) && check_fp8(x, mpath, err, errlen) < 0)
		return -1;
	return 0;
}
