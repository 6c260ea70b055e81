/* config_file: the DeepSpeed-style JSON config file (see config.h,
 * hpu_opts_load_file; the keys are listed in README.md).
 *
 * Each section is a table of keys; a key either sets one option of the
 * option table in config.c (checked against that option's kind and range,
 * through config_internal.h) or has a function of its own. Every key of a
 * section is checked first (unknown, repeated, not for this optimizer or
 * scheduler type), then the keys are applied in the order of their table,
 * not of the file: so "hputrain.strategy" (applied last) overrides
 * "zero_optimization.stage", and "scheduler.params.warmup_max_lr"
 * overrides "optimizer.params.lr". A value is checked even when a flag
 * overrides it.
 */
#include "config.h"
#include "config_internal.h"
#include "fileio.h"

#include <assert.h>
#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct fctx {
	hpu_train_opts *o; /* a copy, committed only if the whole file loads */
	const char *file;
	char *err;
	size_t errlen;
	int adam_w_mode; /* optimizer.params.adam_w_mode */
};

struct fkey {
	const char *key;
	const char *opt; /* the option it sets, or NULL: fn */
	int (*fn)(struct fctx *c, const char *path, const cJSON *it);
	unsigned only; /* the optimizer/scheduler types it belongs to; 0: all */
};

static int ferr(struct fctx *c, const char *path, const char *fmt, ...)
{
	int n = snprintf(c->err, c->errlen, "%s: %s: ", c->file, path);
	if (n >= 0 && (size_t)n < c->errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -1;
}

/* The shortest text that reads back as x. */
static const char *num_text(double x, char *buf, size_t len)
{
	snprintf(buf, len, "%.15g", x);
	if (strtod(buf, NULL) != x)
		snprintf(buf, len, "%.17g", x);
	return buf;
}

/* What a JSON value is, for "expected X, got Y". */
static const char *describe(const cJSON *it, char *buf, size_t len)
{
	char num[32];
	if (cJSON_IsString(it))
		snprintf(buf, len, "a string \"%.40s%s\"", it->valuestring,
			 strlen(it->valuestring) > 40 ? "..." : "");
	else if (cJSON_IsNumber(it))
		snprintf(buf, len, "a number %s",
			 num_text(it->valuedouble, num, sizeof num));
	else if (cJSON_IsBool(it))
		snprintf(buf, len, "%s", cJSON_IsTrue(it) ? "true" : "false");
	else if (cJSON_IsNull(it))
		snprintf(buf, len, "null");
	else if (cJSON_IsArray(it))
		snprintf(buf, len, "an array");
	else
		snprintf(buf, len, "an object");
	return buf;
}

static int wrong_type(struct fctx *c, const char *path, const cJSON *it,
		      const char *want)
{
	char got[80];
	if (cJSON_IsString(it) && strcmp(it->valuestring, "auto") == 0)
		return ferr(c, path, "\"auto\" is not supported; give %s", want);
	return ferr(c, path, "expected %s, got %s", want,
		    describe(it, got, sizeof got));
}

static int want_number(struct fctx *c, const char *path, const cJSON *it,
		       double lo, double hi, int integral, double *out)
{
	char a[32], b[32], x[32];
	if (!cJSON_IsNumber(it))
		return wrong_type(c, path, it, "a number");
	double v = it->valuedouble;
	if (!isfinite(v))
		return ferr(c, path, "%s is not a finite number",
			    num_text(v, x, sizeof x));
	/* 5e8 is an integer; beyond 2^53 a double does not say which one. */
	if (integral && v != floor(v))
		return ferr(c, path, "%s is not an integer",
			    num_text(v, x, sizeof x));
	if (integral && fabs(v) > 9007199254740992.0)
		return ferr(c, path, "%s is too large to be exact in JSON",
			    num_text(v, x, sizeof x));
	if (v < lo || v > hi)
		return ferr(c, path, "%s is out of range %s..%s",
			    num_text(v, x, sizeof x), num_text(lo, a, sizeof a),
			    num_text(hi, b, sizeof b));
	*out = v;
	return 0;
}

static int want_bool(struct fctx *c, const char *path, const cJSON *it,
		     int *out)
{
	if (!cJSON_IsBool(it))
		return wrong_type(c, path, it, "true or false");
	*out = cJSON_IsTrue(it);
	return 0;
}

static int want_string(struct fctx *c, const char *path, const cJSON *it)
{
	if (!cJSON_IsString(it))
		return wrong_type(c, path, it, "a string");
	return 0;
}

/* Sets option p from text (already checked) unless a flag set it. */
static int put(struct fctx *c, const char *path, const struct hpu__opt *p,
	       const char *text)
{
	int s = hpu__opt_slot(p);
	if (c->o->from[s] == HPU_FROM_FLAG)
		return 0;
	if (p->kind == K_FLAG || p->kind == K_NOFLAG) {
		/* JSON keys say the positive: "overlap_comm", "eval" */
		*(int *)((char *)c->o + p->off) = text[0] == '1';
	} else if (hpu__opt_set_value(c->o, p, text) < 0) {
		char buf[160];
		return ferr(c, path, "bad value \"%.60s\": expected %s", text,
			    hpu__opt_expected(p, buf, sizeof buf));
	}
	c->o->from[s] = HPU_FROM_FILE;
	return 0;
}

/* A key that sets option `name`, checked by the option's kind. */
static int file_opt(struct fctx *c, const char *path, const cJSON *it,
		    const char *name)
{
	const struct hpu__opt *p = hpu__opt_find(name);
	char text[48], buf[160];
	double v;
	int b = 0, k;
	uint64_t u;
	assert(p);
	switch (p->kind) {
	case K_INT:
	case K_LONG:
	case K_U64:
		if (want_number(c, path, it, p->lo, p->hi, 1, &v))
			return -1;
		snprintf(text, sizeof text, "%.0f", v);
		return put(c, path, p, text);
	case K_DOUBLE:
		if (want_number(c, path, it, p->lo, p->hi, 0, &v))
			return -1;
		return put(c, path, p, num_text(v, text, sizeof text));
	case K_FLAG:
	case K_NOFLAG:
		if (want_bool(c, path, it, &b))
			return -1;
		return put(c, path, p, b ? "1" : "0");
	case K_CHOICE:
		if (want_string(c, path, it))
			return -1;
		k = hpu__pick(it->valuestring, p->names, p->nnames, 1);
		if (k < 0)
			return ferr(c, path, "\"%.40s\" is not %s",
				    it->valuestring,
				    hpu__opt_expected(p, buf, sizeof buf));
		return put(c, path, p, p->names[k]);
	case K_STR:
		if (want_string(c, path, it))
			return -1;
		if (!*it->valuestring || strlen(it->valuestring) >= sizeof c->o->metrics)
			return ferr(c, path, "expected a non-empty file name shorter than %zu bytes",
				    sizeof c->o->metrics);
		return put(c, path, p, it->valuestring);
	case K_SIZE:
		if (cJSON_IsNumber(it)) {
			if (want_number(c, path, it, 1, 9007199254740992.0, 1, &v))
				return -1;
			snprintf(text, sizeof text, "%.0f", v);
			return put(c, path, p, text);
		}
		if (!cJSON_IsString(it))
			return wrong_type(c, path, it, "a number of bytes or a size string");
		if (hpu_parse_size(it->valuestring, &u) || u == 0)
			return ferr(c, path, "\"%.40s\" is not %s",
				    it->valuestring,
				    hpu__opt_expected(p, buf, sizeof buf));
		return put(c, path, p, it->valuestring);
	default:
		assert(0);
		return -1;
	}
}

/* Edit distance (Levenshtein), for "did you mean". */
static size_t distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b), row[64];
	if (la >= 64 || lb >= 64)
		return 99;
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t up = row[j];
			size_t best = diag + (tolower((unsigned char)a[i - 1]) !=
					      tolower((unsigned char)b[j - 1]));
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

/* Whether JSON key k names table key t; in the hputrain section (dashes)
 * "max-steps" and "max_steps" are the same. */
static int key_is(const char *k, const char *t, int dashes)
{
	if (!dashes)
		return strcmp(k, t) == 0;
	for (; *k && *t; k++, t++)
		if (*k != *t && !(*k == '-' && *t == '_'))
			return 0;
	return *k == *t;
}

static const struct fkey *lookup(const struct fkey *keys, size_t n,
				 const char *k, int dashes)
{
	for (size_t i = 0; i < n; i++)
		if (key_is(k, keys[i].key, dashes))
			return &keys[i];
	return NULL;
}

static int unknown_key(struct fctx *c, const char *path, const char *k,
		       const struct fkey *keys, size_t n)
{
	const char *best = NULL;
	size_t bestd = 3;
	for (size_t i = 0; i < n; i++) {
		size_t d = distance(k, keys[i].key);
		if (d < bestd) {
			bestd = d;
			best = keys[i].key;
		}
	}
	int m = snprintf(c->err, c->errlen, "unknown key '%s' in %s", path,
			 c->file);
	if (best && m >= 0 && (size_t)m < c->errlen)
		snprintf(c->err + m, c->errlen - (size_t)m,
			 " (did you mean '%s'?)", best);
	return -1;
}

/* Checks every key of object obj (at prefix) against keys, then applies
 * them in the table's order. type/type_name: the optimizer or scheduler
 * type the keys must belong to (fkey.only). */
static int walk(struct fctx *c, const cJSON *obj, const char *prefix,
		const struct fkey *keys, size_t n, unsigned type,
		const char *type_name, int dashes)
{
	char path[256];
	if (!cJSON_IsObject(obj))
		return wrong_type(c, prefix, obj, "an object");
	for (const cJSON *it = obj->child; it; it = it->next) {
		snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "",
			 it->string);
		for (const cJSON *p = obj->child; p != it; p = p->next)
			if (key_is(p->string, it->string, dashes) ||
			    key_is(it->string, p->string, dashes))
				return ferr(c, path, "given twice");
		const struct fkey *k = lookup(keys, n, it->string, dashes);
		if (!k)
			return unknown_key(c, path, it->string, keys, n);
		if (k->only && !(k->only & type))
			return ferr(c, path, "%s takes no '%s'", type_name,
				    it->string);
	}
	for (size_t i = 0; i < n; i++) {
		const cJSON *it = obj->child;
		while (it && !key_is(it->string, keys[i].key, dashes))
			it = it->next;
		if (!it)
			continue;
		snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "",
			 it->string);
		int rc = keys[i].opt ? file_opt(c, path, it, keys[i].opt)
				     : keys[i].fn(c, path, it);
		if (rc < 0)
			return -1;
	}
	return 0;
}

#define WALK(c, obj, prefix, keys, type, tname, dashes)                        \
	walk(c, obj, prefix, keys, sizeof(keys) / sizeof((keys)[0]), type,    \
	     tname, dashes)

static int f_noop(struct fctx *c, const char *path, const cJSON *it)
{
	(void)c, (void)path, (void)it;
	return 0;
}

/* A boolean we accept and ignore. */
static int f_ignored_bool(struct fctx *c, const char *path, const cJSON *it)
{
	int b = 0;
	return want_bool(c, path, it, &b);
}

/* zero_optimization */

static int f_stage(struct fctx *c, const char *path, const cJSON *it)
{
	double v;
	if (want_number(c, path, it, 0, 3, 1, &v))
		return -1;
	/* stage 0 is plain data parallelism: ddp (not fast_ddp). */
	return put(c, path, hpu__opt_find("strategy"),
		   hpu_strategy_name((hpu_strategy)((int)v + 1)));
}

static int f_offload_optimizer(struct fctx *c, const char *path, const cJSON *it);
static int f_offload_param(struct fctx *c, const char *path, const cJSON *it);
static int f_cpu_offload(struct fctx *c, const char *path, const cJSON *it);
static int f_cpu_offload_params(struct fctx *c, const char *path, const cJSON *it);

static const struct fkey zero_keys[] = {
	{"stage", NULL, f_stage, 0},
	{"reduce_bucket_size", "reduce-bucket-size", NULL, 0},
	{"allgather_bucket_size", "allgather-bucket-size", NULL, 0},
	{"overlap_comm", "overlap-comm", NULL, 0},
	{"stage3_prefetch_bucket_size", "prefetch-bucket-size", NULL, 0},
	{"stage3_param_persistence_threshold", "param-persistence-threshold", NULL, 0},
	{"stage3_max_live_parameters", "max-live-parameters", NULL, 0},
	{"sub_group_size", "sub-group-size", NULL, 0},
	/* Accepted and ignored: our gradients always live in one
	 * contiguous buffer. */
	{"contiguous_gradients", NULL, f_ignored_bool, 0},
	{"offload_optimizer", NULL, f_offload_optimizer, 0},
	{"offload_param", NULL, f_offload_param, 0},
	{"cpu_offload", NULL, f_cpu_offload, 0},
	{"cpu_offload_params", NULL, f_cpu_offload_params, 0},
};

static int f_zero(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, zero_keys, 0, "", 0);
}

/* zero_optimization.offload_optimizer.ratio: the share of the optimizer
 * state offloaded; partial offload (ZeRO++'s twin-flow) is not here. */
static int f_offload_ratio(struct fctx *c, const char *path, const cJSON *it)
{
	double v;
	if (want_number(c, path, it, 0, 1, 0, &v))
		return -1;
	if (v != 1)
		return ferr(c, path, "%g: partial offload is not supported; give 1 (all of it)", v);
	return 0;
}

static const struct fkey offload_optimizer_keys[] = {
	{"device", "offload-optimizer", NULL, 0},
	{"nvme_path", "nvme-path", NULL, 0},
	{"buffer_count", "offload-buffer-count", NULL, 0},
	{"ratio", NULL, f_offload_ratio, 0},
	/* Accepted and ignored: pinned memory is what a device's DMA needs;
	 * the host tier here is plain memory. fast_init only speeds up
	 * DeepSpeed's own start-up. */
	{"pin_memory", NULL, f_ignored_bool, 0},
	{"fast_init", NULL, f_ignored_bool, 0},
};

static const struct fkey offload_param_keys[] = {
	{"device", "offload-param", NULL, 0},
	{"nvme_path", "param-nvme-path", NULL, 0},
	{"buffer_count", "param-buffer-count", NULL, 0},
	{"buffer_size", "param-buffer-size", NULL, 0},
	{"max_in_cpu", "max-in-cpu", NULL, 0},
	{"pin_memory", NULL, f_ignored_bool, 0},
};

static int f_offload_optimizer(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, offload_optimizer_keys, 0, "", 0);
}

static int f_offload_param(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, offload_param_keys, 0, "", 0);
}

/* cpu_offload / cpu_offload_params: DeepSpeed's older booleans for
 * offload_optimizer / offload_param {"device": "cpu"}. */
static int f_cpu_offload_as(struct fctx *c, const char *path, const cJSON *it,
			    const char *opt)
{
	int on = 0;
	if (want_bool(c, path, it, &on))
		return -1;
	return on ? put(c, path, hpu__opt_find(opt), "cpu") : 0;
}

static int f_cpu_offload(struct fctx *c, const char *path, const cJSON *it)
{
	return f_cpu_offload_as(c, path, it, "offload-optimizer");
}

static int f_cpu_offload_params(struct fctx *c, const char *path, const cJSON *it)
{
	return f_cpu_offload_as(c, path, it, "offload-param");
}

static const struct fkey aio_keys[] = {
	{"block_size", "aio-block-size", NULL, 0},
	{"queue_depth", "aio-queue-depth", NULL, 0},
	{"thread_count", "aio-thread-count", NULL, 0},
	{"single_submit", "aio-single-submit", NULL, 0},
	{"overlap_events", "no-aio-overlap-events", NULL, 0}, /* true or false */
};

static int f_aio(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, aio_keys, 0, "", 0);
}

/* optimizer: type and params. Keys not given keep hputrain's defaults
 * (e.g. SGD momentum 0.9), as flags not given do. */

enum { O_SGD = 1, O_ADAMW = 2, O_ADAM = 4 };

static int f_betas(struct fctx *c, const char *path, const cJSON *it)
{
	static const char *names[] = {"beta1", "beta2"};
	char p[280], text[32];
	double v;
	if (!cJSON_IsArray(it))
		return wrong_type(c, path, it, "an array of two numbers");
	if (cJSON_GetArraySize(it) != 2)
		return ferr(c, path, "expected two numbers [beta1, beta2], got %d",
			    cJSON_GetArraySize(it));
	for (int i = 0; i < 2; i++) {
		const struct hpu__opt *o = hpu__opt_find(names[i]);
		snprintf(p, sizeof p, "%s[%d]", path, i);
		if (want_number(c, p, cJSON_GetArrayItem(it, i), o->lo, o->hi,
				0, &v) ||
		    put(c, p, o, num_text(v, text, sizeof text)))
			return -1;
	}
	return 0;
}

static int f_adam_w_mode(struct fctx *c, const char *path, const cJSON *it)
{
	return want_bool(c, path, it, &c->adam_w_mode);
}

static const struct fkey optim_param_keys[] = {
	{"lr", "lr", NULL, 0},
	{"betas", NULL, f_betas, O_ADAM | O_ADAMW},
	{"eps", "eps", NULL, O_ADAM | O_ADAMW},
	{"weight_decay", "weight-decay", NULL, 0},
	{"momentum", "momentum", NULL, O_SGD},
	{"nesterov", "nesterov", NULL, O_SGD},
	{"adam_w_mode", NULL, f_adam_w_mode, O_ADAM},
};

static const struct fkey typed_keys[] = {
	{"type", NULL, f_noop, 0},
	{"params", NULL, f_noop, 0},
};

/* A {"type": NAME, "params": {...}} section: returns the index of NAME in
 * types[n] (matched without case) and sets *params; -2 when the section is
 * empty, -1 after an error naming the key (`choices` lists the types). */
static int typed_section(struct fctx *c, const char *path, const cJSON *it,
			 const char **types, int n, const char *choices,
			 const cJSON **params)
{
	char p[280];
	if (WALK(c, it, path, typed_keys, 0, "", 0))
		return -1;
	const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
	*params = cJSON_GetObjectItemCaseSensitive(it, "params");
	snprintf(p, sizeof p, "%s.type", path);
	if (!type && !*params)
		return -2;
	if (!type)
		return ferr(c, p, "missing: give one of %s", choices);
	if (want_string(c, p, type))
		return -1;
	int k = hpu__pick(type->valuestring, types, n, 1);
	if (k < 0)
		return ferr(c, p, "\"%.40s\" is not one of %s", type->valuestring, choices);
	return k;
}

static int f_optimizer(struct fctx *c, const char *path, const cJSON *it)
{
	static const char *types[] = {"SGD", "AdamW", "Adam"};
	static const unsigned masks[] = {O_SGD, O_ADAMW, O_ADAM};
	char p[280];
	const cJSON *params;
	int k = typed_section(c, path, it, types, 3, "Adam, AdamW, SGD", &params);
	if (k < 0)
		return k == -1 ? -1 : 0;
	c->adam_w_mode = 1; /* DeepSpeed's default */
	snprintf(p, sizeof p, "%s.params", path);
	if (params && WALK(c, params, p, optim_param_keys, masks[k], types[k], 0))
		return -1;
	/* DeepSpeed's "Adam" is AdamW unless adam_w_mode is false. */
	hpu_optim_kind kind = k == 0 ? HPU_OPTIM_SGD
			      : k == 1 || c->adam_w_mode ? HPU_OPTIM_ADAMW
							 : HPU_OPTIM_ADAM;
	snprintf(p, sizeof p, "%s.type", path);
	return put(c, p, hpu__opt_find("optimizer"), hpu_optim_name(kind));
}

/* scheduler: type and params */

enum {
	S_CONST = 1 << HPU_SCHED_CONSTANT,
	S_STEP = 1 << HPU_SCHED_STEP,
	S_COS = 1 << HPU_SCHED_COSINE,
	S_WARM = 1 << HPU_SCHED_WARMUP,
	S_DECAY = 1 << HPU_SCHED_WARMUP_DECAY,
};

static const struct fkey sched_param_keys[] = {
	{"warmup_min_lr", "warmup-min-lr", NULL, S_WARM | S_DECAY},
	{"warmup_max_lr", "lr", NULL, S_WARM | S_DECAY},
	{"warmup_num_steps", "warmup-steps", NULL, S_WARM | S_DECAY},
	{"warmup_type", "warmup-type", NULL, S_WARM | S_DECAY},
	{"total_num_steps", "total-steps", NULL, S_DECAY},
	{"step_size", "step-size", NULL, S_STEP},
	{"gamma", "gamma", NULL, S_STEP},
	{"T_max", "total-steps", NULL, S_COS},
	{"eta_min", "min-lr", NULL, S_COS},
};

static int f_scheduler(struct fctx *c, const char *path, const cJSON *it)
{
	/* in the order of hpu_sched_kind */
	static const char *types[] = {"constant", "StepLR", "CosineAnnealingLR",
				      "WarmupLR", "WarmupDecayLR"};
	char p[280];
	const cJSON *params;
	int k = typed_section(c, path, it, types, 5,
			      "WarmupLR, WarmupDecayLR, StepLR, CosineAnnealingLR, constant",
			      &params);
	if (k < 0)
		return k == -1 ? -1 : 0;
	snprintf(p, sizeof p, "%s.type", path);
	if (put(c, p, hpu__opt_find("scheduler"),
		hpu_sched_name((hpu_sched_kind)k)))
		return -1;
	snprintf(p, sizeof p, "%s.params", path);
	if (params && WALK(c, params, p, sched_param_keys, 1u << k, types[k], 0))
		return -1;
	if (k == HPU_SCHED_WARMUP_DECAY &&
	    !(params && cJSON_GetObjectItemCaseSensitive(params, "total_num_steps")) &&
	    c->o->from[hpu__opt_slot_named("total-steps")] != HPU_FROM_FLAG) {
		snprintf(p, sizeof p, "%s.params.total_num_steps", path);
		return ferr(c, p, "missing: WarmupDecayLR needs it");
	}
	return 0;
}

/* bf16, fp16, fp8: "enabled" picks the precision (two at once is an
 * error); fp16's loss-scaler keys set ours, fp8's the delayed-scaling
 * recipe (Transformer Engine's names). auto_cast and
 * consecutive_hysteresis are accepted and ignored (our scaler resets
 * hysteresis after a good window, DeepSpeed's default). */

static int f_enabled_as(struct fctx *c, const char *path, const cJSON *it,
			hpu_precision want)
{
	int on = 0;
	if (want_bool(c, path, it, &on))
		return -1;
	if (!on)
		return 0;
	if (c->o->precision != want && c->o->precision != HPU_PREC_FP32 &&
	    c->o->from[hpu__opt_slot_named("precision")] == HPU_FROM_FILE)
		return ferr(c, path, "only one of bf16.enabled, fp16.enabled and fp8.enabled can be true");
	return put(c, path, hpu__opt_find("precision"), hpu_precision_name(want));
}

static int f_bf16_enabled(struct fctx *c, const char *path, const cJSON *it)
{
	return f_enabled_as(c, path, it, HPU_PREC_BF16_MIXED);
}

static int f_fp16_enabled(struct fctx *c, const char *path, const cJSON *it)
{
	return f_enabled_as(c, path, it, HPU_PREC_FP16_MIXED);
}

static int f_fp8_enabled(struct fctx *c, const char *path, const cJSON *it)
{
	return f_enabled_as(c, path, it, HPU_PREC_FP8);
}

static const struct fkey fp8_keys[] = {
	{"enabled", NULL, f_fp8_enabled, 0},
	{"amax_history_len", "fp8-amax-history", NULL, 0},
	{"margin", "fp8-margin", NULL, 0},
	{"amax_compute_algo", "fp8-amax-compute-algo", NULL, 0},
};

static int f_fp8(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, fp8_keys, 0, "", 0);
}

static const struct fkey bf16_keys[] = {
	{"enabled", NULL, f_bf16_enabled, 0},
};

static const struct fkey fp16_keys[] = {
	{"enabled", NULL, f_fp16_enabled, 0},
	{"auto_cast", NULL, f_noop, 0},
	{"loss_scale", "loss-scale", NULL, 0},
	{"initial_scale_power", "initial-scale-power", NULL, 0},
	{"loss_scale_window", "loss-scale-window", NULL, 0},
	{"hysteresis", "hysteresis", NULL, 0},
	{"consecutive_hysteresis", NULL, f_noop, 0},
	{"min_loss_scale", "min-loss-scale", NULL, 0},
};

static int f_bf16(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, bf16_keys, 0, "", 0);
}

static int f_fp16(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, fp16_keys, 0, "", 0);
}

/* hputrain: our own keys, named as our flags (dashes or underscores). */
static const struct fkey hputrain_keys[] = {
	{"strategy", "strategy", NULL, 0},
	{"precision", "precision", NULL, 0},
	{"epochs", "epochs", NULL, 0},
	{"max_steps", "max-steps", NULL, 0},
	{"seed", "seed", NULL, 0},
	{"device_memory", "device-memory", NULL, 0},
	{"host_memory", "host-memory", NULL, 0},
	{"activation_checkpointing", "activation-checkpointing", NULL, 0},
	{"grad_comm_dtype", "grad-comm-dtype", NULL, 0},
	{"log_every", "log-every", NULL, 0},
	{"metrics", "metrics", NULL, 0},
	{"save_params", "save-params", NULL, 0},
	{"load_params", "load-params", NULL, 0},
	{"eval_only", "eval-only", NULL, 0},
	{"calibration_batches", "calibration-batches", NULL, 0},
	{"checkpoint_dir", "checkpoint-dir", NULL, 0},
	{"checkpoint_every", "checkpoint-every", NULL, 0},
	{"keep_checkpoints", "keep", NULL, 0},
	{"resume", "resume", NULL, 0},
	{"eval", "no-eval", NULL, 0}, /* true or false */
};

static int f_hputrain(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, hputrain_keys, 0, "", 1);
}

/* The top level, applied in this order; hputrain last, so that its
 * "strategy" overrides zero_optimization.stage. */
static const struct fkey top_keys[] = {
	{"train_batch_size", "batch-size", NULL, 0},
	{"train_micro_batch_size_per_gpu", "micro-batch-size", NULL, 0},
	{"gradient_accumulation_steps", "grad-accum", NULL, 0},
	{"gradient_clipping", "clip-grad-norm", NULL, 0},
	{"steps_per_print", "log-every", NULL, 0},
	{"zero_optimization", NULL, f_zero, 0},
	{"aio", NULL, f_aio, 0},
	{"optimizer", NULL, f_optimizer, 0},
	{"scheduler", NULL, f_scheduler, 0},
	{"bf16", NULL, f_bf16, 0},
	{"fp8", NULL, f_fp8, 0},
	{"fp16", NULL, f_fp16, 0},
	{"hputrain", NULL, f_hputrain, 0},
};

/* Reads the whole config file (NUL-terminated) into *buf. */
static int read_file(const char *path, char **buf, size_t *len, char *err,
		     size_t errlen)
{
	const char *why = hpu_read_file(path, buf, len);
	if (why) {
		snprintf(err, errlen, "cannot read config file %s: %s", path, why);
		return -1;
	}
	return 0;
}

static void syntax_error(const char *path, const char *buf, size_t len,
			 const char *at, char *err, size_t errlen)
{
	size_t pos = at && at >= buf && at <= buf + len ? (size_t)(at - buf) : len;
	int line = 1;
	size_t col = 1;
	for (size_t i = 0; i < pos; i++, col++)
		if (buf[i] == '\n')
			line++, col = 0;
	if (pos >= len) {
		snprintf(err, errlen, "%s: line %d: JSON syntax error: the file ends too early",
			 path, line);
		return;
	}
	char near[24];
	size_t n = 0;
	while (n < sizeof near - 1 && pos + n < len && buf[pos + n] != '\n' &&
	       buf[pos + n] != '\r')
		near[n] = buf[pos + n], n++;
	near[n] = 0;
	snprintf(err, errlen, "%s: line %d, column %zu: JSON syntax error near '%s'",
		 path, line, col, near);
}

/* The error is one line whatever the file held. */
static void one_line(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

int hpu_opts_load_file(hpu_train_opts *o, const char *path, char *err,
		       size_t errlen)
{
	char *buf;
	size_t len;
	if (read_file(path, &buf, &len, err, errlen) < 0)
		return -1;
	int rc = -1;
	hpu_train_opts copy = *o;
	struct fctx c = {&copy, path, err, errlen, 1};
	const char *end = NULL;
	cJSON *root = NULL;
	/* The position from ParseWithOpts is cJSON_GetErrorPtr()'s, without
	 * the global. */
	root = cJSON_ParseWithOpts(buf, &end, 1);
	if (!root) {
		syntax_error(path, buf, len, end, err, errlen);
		goto out;
	}
	if (!cJSON_IsObject(root)) {
		char got[80];
		snprintf(err, errlen, "%s: expected a JSON object at the top, got %s",
			 path, describe(root, got, sizeof got));
		goto out;
	}
	if (WALK(&c, root, "", top_keys, 0, "", 0) < 0)
		goto out;
	*o = copy;
	rc = 0;
out:
	if (rc < 0)
		one_line(err);
	cJSON_Delete(root);
	free(buf);
	return rc;
}
