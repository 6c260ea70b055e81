/* config_file: the DeepSpeed-style JSON config file (see config.h,
 * hpu__opts_load_file; the keys are listed in README.md).
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
#include "options/config.h"
#include "options/config_internal.h"
#include "common/fileio.h"
#include "common/num.h"

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

/* Every error of a file is reported, not only the first: each one is a
 * line of msgs, and the walk goes on past it. */
struct fctx {
	hpu_train_opts *o; /* a copy, committed only if the whole file loads */
	const char *file;
	int adam_w_mode; /* optimizer.params.adam_w_mode */
	int nerr;
	char msgs[3072]; /* the errors, one per line ("\n  " between) */
	size_t used;
};

struct fkey {
	const char *key;
	const char *opt; /* the option it sets, or NULL: fn */
	int (*fn)(struct fctx *c, const char *path, const cJSON *it);
	unsigned only; /* the optimizer/scheduler types it belongs to; 0: all */
	/* A key DeepSpeed accepts that changes nothing here: why (any value
	 * is accepted, and the key is named in one warning). */
	const char *why;
};

/* Table entries: a key that sets an option, one with a function of its
 * own, one that changes nothing here (why). `only`: fkey.only. */
#define KEY(k, opt, only) {k, opt, NULL, only, NULL}
#define FN(k, fn, only) {k, NULL, fn, only, NULL}
#define NONE(k, why) {k, NULL, NULL, 0, why}

/* Appends one error line; returns -1. */
static int add_error(struct fctx *c, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	for (char *s = line; *s; s++) /* one line whatever the file held */
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
	size_t room = sizeof c->msgs - c->used;
	int n = snprintf(c->msgs + c->used, room, "%s%s", c->nerr ? "\n  " : "", line);
	if (n > 0)
		c->used += (size_t)n < room ? (size_t)n : room - 1;
	c->nerr++;
	return -1;
}

static int ferr(struct fctx *c, const char *path, const char *fmt, ...)
{
	char what[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	return add_error(c, "%s: %s: %s", c->file, path, what);
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

/* Whether s holds a control character. A NUL (JSON's \u0000) would cut
 * the string short, so hpu__opts_load_file turns each one into another
 * control character before parsing (mark_nuls), and this finds it. */
static int has_control(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return 1;
	return 0;
}

static int want_string(struct fctx *c, const char *path, const cJSON *it)
{
	if (!cJSON_IsString(it))
		return wrong_type(c, path, it, "a string");
	if (has_control(it->valuestring))
		return ferr(c, path, "the string holds a NUL (\\u0000) or another control character");
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
		k = hpu__choice(p, it->valuestring, 1);
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
		if (hpu__parse_size(it->valuestring, &u) || u == 0)
			return ferr(c, path, "\"%.40s\" is not %s",
				    it->valuestring,
				    hpu__opt_expected(p, buf, sizeof buf));
		return put(c, path, p, it->valuestring);
	default:
		assert(0);
		return -1;
	}
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

/* One key for the sort of hpu__repeated_keys. */
struct keyref {
	const char *key;
	size_t at; /* its place in the object */
	int dashes;
};

/* Orders keys as key_is compares them ('-' as '_' with dashes), equal
 * ones by their place. */
static int keyref_cmp(const void *x, const void *y)
{
	const struct keyref *a = x, *b = y;
	const unsigned char *p = (const unsigned char *)a->key, *q = (const unsigned char *)b->key;
	for (;; p++, q++) {
		int u = *p == '-' && a->dashes ? '_' : *p, v = *q == '-' && a->dashes ? '_' : *q;
		if (u != v)
			return u < v ? -1 : 1;
		if (!u)
			break;
	}
	return a->at < b->at ? -1 : a->at > b->at;
}

int hpu__repeated_keys(const char *const *keys, size_t n, int dashes,
		       unsigned char *repeated)
{
	struct keyref *r = malloc((n ? n : 1) * sizeof *r);
	if (!r)
		return -1;
	for (size_t i = 0; i < n; i++)
		r[i] = (struct keyref){keys[i], i, dashes};
	qsort(r, n, sizeof *r, keyref_cmp);
	memset(repeated, 0, n);
	int count = 0;
	for (size_t i = 1; i < n; i++) {
		struct keyref a = r[i - 1], b = r[i];
		a.at = b.at = 0; /* the keys alone */
		if (keyref_cmp(&a, &b) == 0) {
			repeated[r[i].at] = 1;
			count++;
		}
	}
	free(r);
	return count;
}

/* Which members of obj repeat an earlier one's key: a malloc'd array of
 * one flag per member (at least one byte), or NULL. */
static unsigned char *repeats(const cJSON *obj, int dashes)
{
	size_t n = 0;
	for (const cJSON *it = obj->child; it; it = it->next)
		n++;
	const char **keys = malloc((n ? n : 1) * sizeof *keys);
	unsigned char *twice = malloc(n ? n : 1);
	if (keys && twice) {
		n = 0;
		for (const cJSON *it = obj->child; it; it = it->next)
			keys[n++] = it->string;
	}
	if (!keys || !twice || hpu__repeated_keys(keys, n, dashes, twice) < 0) {
		free(twice);
		twice = NULL;
	}
	free(keys);
	return twice;
}

/* The table key closest to k (edit distance under 3), or NULL. */
static const char *closest(const char *k, const struct fkey *keys, size_t n)
{
	const char *best = NULL;
	size_t bestd = 3;
	for (size_t i = 0; i < n; i++) {
		size_t d = hpu__edit_distance(k, keys[i].key);
		if (d < bestd) {
			bestd = d;
			best = keys[i].key;
		}
	}
	return best;
}

static int unknown_key(struct fctx *c, const char *path, const char *best)
{
	if (best)
		return add_error(c, "unknown key '%s' in %s (did you mean '%s'?)",
				 path, c->file, best);
	return add_error(c, "unknown key '%s' in %s", path, c->file);
}

/* A key that changes nothing here, for the one warning. */
static void note_ignored(struct fctx *c, const char *path, const char *why)
{
	char *l = c->o->cfg_ignored;
	size_t at = strlen(l), room = sizeof c->o->cfg_ignored - at;
	int n = snprintf(l + at, room, "%s\t%s\n", path, why);
	if (n < 0 || (size_t)n >= room)
		l[at] = '\0'; /* the list is full: the key goes unnamed */
}

/* An "auto" value: the option(s) in the given slots keep what flags and
 * defaults give them, named in the one note. */
static void note_auto(struct fctx *c, const char *path, int slot, int slot2)
{
	hpu_train_opts *o = c->o;
	if (o->ncfg_auto == HPU_CFG_AUTOS)
		return;
	struct hpu_cfg_auto *a = &o->cfg_auto[o->ncfg_auto++];
	snprintf(a->key, sizeof a->key, "%.79s", path); /* key paths are short */
	a->slot[0] = (short)slot;
	a->slot[1] = (short)slot2;
}

static int is_auto(const cJSON *it)
{
	return cJSON_IsString(it) && strcmp(it->valuestring, "auto") == 0;
}

/* Whether option p can take "auto" (a number, size, choice or switch:
 * a string option may mean "auto" itself, as resume does). */
static int takes_auto(const struct hpu__opt *p)
{
	return p->kind != K_STR && p->kind != K_OPTSTR;
}

enum {
	W_DASHES = 1,  /* the hputrain section: "max-steps" is "max_steps" */
	W_LENIENT = 2, /* DeepSpeed's top level: an unknown key far from every
			* known one is ignored (named in the warning), as
			* DeepSpeed ignores it */
};

/* Checks every key of object obj (at prefix) against keys, then applies
 * them in the table's order; an error is counted and the walk goes on,
 * so that one run names every bad key. type/type_name: the optimizer or
 * scheduler type the keys must belong to (fkey.only). */
static int walk(struct fctx *c, const cJSON *obj, const char *prefix,
		const struct fkey *keys, size_t n, unsigned type,
		const char *type_name, int mode)
{
	char path[256];
	int dashes = mode & W_DASHES, nerr = c->nerr;
	if (!cJSON_IsObject(obj))
		return wrong_type(c, prefix, obj, "an object");
	unsigned char *twice = repeats(obj, dashes);
	if (!twice)
		return add_error(c, "out of memory reading %s", c->file);
	size_t at = 0;
	for (const cJSON *it = obj->child; it; it = it->next, at++) {
		snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "",
			 it->string);
		if (has_control(it->string)) {
			ferr(c, path, "the key holds a NUL (\\u0000) or another control character");
			continue;
		}
		if (twice[at]) {
			ferr(c, path, "given twice");
			continue;
		}
		const struct fkey *k = lookup(keys, n, it->string, dashes);
		const char *best = k ? NULL : closest(it->string, keys, n);
		if (!k && !best && (mode & W_LENIENT))
			note_ignored(c, path, "not a key hputrain knows");
		else if (!k)
			unknown_key(c, path, best);
		else if (k->only && !(k->only & type))
			ferr(c, path, "%s takes no '%s'", type_name, it->string);
	}
	free(twice);
	for (size_t i = 0; i < n; i++) {
		const struct fkey *k = &keys[i];
		const cJSON *it = obj->child;
		while (it && !key_is(it->string, k->key, dashes))
			it = it->next;
		if (!it || (k->only && !(k->only & type)))
			continue;
		snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "",
			 it->string);
		const struct hpu__opt *o = k->opt ? hpu__opt_find(k->opt) : NULL;
		if (k->why)
			note_ignored(c, path, k->why);
		else if (o && is_auto(it) && takes_auto(o))
			note_auto(c, path, hpu__opt_slot(o), -1);
		else if (o)
			file_opt(c, path, it, k->opt);
		else
			k->fn(c, path, it);
	}
	return c->nerr > nerr ? -1 : 0;
}

#define WALK(c, obj, prefix, keys, type, tname, mode)                          \
	walk(c, obj, prefix, keys, sizeof(keys) / sizeof((keys)[0]), type,    \
	     tname, mode)

static int f_noop(struct fctx *c, const char *path, const cJSON *it)
{
	(void)c, (void)path, (void)it;
	return 0;
}

/* Why DeepSpeed's keys change nothing here (fkey.why), shared by the
 * keys they explain, so that the warning groups them. */
static const char WHY_PROFILE[] = "timings and counters are --profile's and the metrics file's";
static const char WHY_MONITOR[] = "monitoring is --metrics (JSON lines) and hpu-plot";
static const char WHY_ALWAYS[] = "hputrain always does this";
static const char WHY_REDUCE[] = "gradients are summed, then divided by the world size once";
static const char WHY_COLL[] = "each strategy has one collective schedule";
static const char WHY_SAVE[] = "--save-params writes consolidated fp32 parameters, checkpoints reshard to any world size";
static const char WHY_DEVICES[] = "devices are hpulaunch's --devices";
static const char WHY_NOTHERE[] = "not implemented in hputrain: training runs without it";
static const char WHY_ZEROPP[] = "ZeRO++/MiCS are not implemented: ZeRO runs unquantized over all ranks";
static const char WHY_PINNED[] = "the host tier is plain memory; buffers are aligned for O_DIRECT";
static const char WHY_TORCH[] = "hputrain's optimizers are its own, one implementation each";
static const char WHY_CKPT[] = "use --activation-checkpointing or mark layers (hpu_layer_checkpoint)";

/* zero_optimization */

static int f_stage(struct fctx *c, const char *path, const cJSON *it)
{
	double v;
	if (want_number(c, path, it, 0, 3, 1, &v))
		return -1;
	/* stage 0 is plain data parallelism: ddp (not fast_ddp). */
	return put(c, path, hpu__opt_find("strategy"),
		   hpu__strategy_name((hpu_strategy)((int)v + 1)));
}

static int f_offload_optimizer(struct fctx *c, const char *path, const cJSON *it);
static int f_offload_param(struct fctx *c, const char *path, const cJSON *it);
static int f_cpu_offload(struct fctx *c, const char *path, const cJSON *it);
static int f_cpu_offload_params(struct fctx *c, const char *path, const cJSON *it);

/* DeepSpeed's DeepSpeedZeroConfig, which forbids unknown keys; the
 * stage3_ names and their short aliases are both accepted, as there. */
static const struct fkey zero_keys[] = {
	FN("stage", f_stage, 0),
	KEY("reduce_bucket_size", "reduce-bucket-size", 0),
	KEY("allgather_bucket_size", "allgather-bucket-size", 0),
	KEY("overlap_comm", "overlap-comm", 0),
	KEY("stage3_prefetch_bucket_size", "prefetch-bucket-size", 0),
	KEY("prefetch_bucket_size", "prefetch-bucket-size", 0),
	KEY("stage3_param_persistence_threshold", "param-persistence-threshold", 0),
	KEY("param_persistence_threshold", "param-persistence-threshold", 0),
	KEY("stage3_max_live_parameters", "max-live-parameters", 0),
	KEY("max_live_parameters", "max-live-parameters", 0),
	KEY("sub_group_size", "sub-group-size", 0),
	FN("offload_optimizer", f_offload_optimizer, 0),
	FN("offload_param", f_offload_param, 0),
	FN("cpu_offload", f_cpu_offload, 0),
	FN("cpu_offload_params", f_cpu_offload_params, 0),
	FN("cpu_offload_param", f_cpu_offload_params, 0),
	NONE("contiguous_gradients", "gradients always live in one contiguous buffer"),
	NONE("reduce_scatter", WHY_COLL),
	NONE("allgather_partitions", WHY_COLL),
	NONE("use_multi_rank_bucket_allreduce", WHY_COLL),
	NONE("round_robin_gradients", WHY_COLL),
	NONE("stage3_max_reuse_distance", "zero3 releases a layer after use and gathers it again"),
	NONE("max_reuse_distance", "zero3 releases a layer after use and gathers it again"),
	NONE("stage3_gather_16bit_weights_on_model_save", WHY_SAVE),
	NONE("stage3_gather_fp16_weights_on_model_save", WHY_SAVE),
	NONE("gather_16bit_weights_on_model_save", WHY_SAVE),
	NONE("elastic_checkpoint", WHY_SAVE),
	NONE("load_from_fp32_weights", "resume always loads the fp32 master weights"),
	NONE("ignore_unused_parameters", "a parameter no layer used gets a zero gradient"),
	NONE("legacy_stage1", WHY_NOTHERE),
	NONE("stage3_model_persistence_threshold", "only stage3_param_persistence_threshold decides what stays whole"),
	NONE("model_persistence_threshold", "only stage3_param_persistence_threshold decides what stays whole"),
	NONE("stage3_use_all_reduce_for_fetch_params", WHY_COLL),
	NONE("use_all_reduce_for_fetch_params", WHY_COLL),
	NONE("stage3_module_granularity_threshold", "zero3 gathers one layer at a time"),
	NONE("module_granularity_threshold", "zero3 gathers one layer at a time"),
	NONE("zero_hpz_partition_size", WHY_ZEROPP),
	NONE("zero_quantized_weights", WHY_ZEROPP),
	NONE("zero_quantized_nontrainable_weights", WHY_ZEROPP),
	NONE("zero_quantized_gradients", WHY_ZEROPP),
	NONE("zeropp_loco_param", WHY_ZEROPP),
	NONE("mics_shard_size", WHY_ZEROPP),
	NONE("mics_hierarchical_params_gather", WHY_ZEROPP),
	NONE("memory_efficient_linear", WHY_ALWAYS),
	NONE("pipeline_loading_checkpoint", WHY_NOTHERE),
	NONE("override_module_apply", WHY_NOTHERE),
	NONE("log_trace_cache_warnings", WHY_PROFILE),
	NONE("cpu_offload_use_pin_memory", WHY_PINNED),
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
	KEY("device", "offload-optimizer", 0),
	KEY("nvme_path", "nvme-path", 0),
	KEY("buffer_count", "offload-buffer-count", 0),
	FN("ratio", f_offload_ratio, 0),
	/* Pinned memory is what a device's DMA needs; fast_init only speeds
	 * up DeepSpeed's own start-up; reads and writes always overlap. */
	NONE("pin_memory", WHY_PINNED),
	NONE("fast_init", "it speeds up DeepSpeed's own start-up"),
	NONE("pipeline_read", "nvme reads and writes always overlap the updates"),
	NONE("pipeline_write", "nvme reads and writes always overlap the updates"),
	NONE("pipeline", "nvme reads and writes always overlap the updates"),
};

static const struct fkey offload_param_keys[] = {
	KEY("device", "offload-param", 0),
	KEY("nvme_path", "param-nvme-path", 0),
	KEY("buffer_count", "param-buffer-count", 0),
	KEY("buffer_size", "param-buffer-size", 0),
	KEY("max_in_cpu", "max-in-cpu", 0),
	NONE("pin_memory", WHY_PINNED),
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
	KEY("block_size", "aio-block-size", 0),
	KEY("queue_depth", "aio-queue-depth", 0),
	KEY("thread_count", "aio-thread-count", 0),
	KEY("single_submit", "aio-single-submit", 0),
	KEY("overlap_events", "no-aio-overlap-events", 0), /* true or false */
	KEY("intra_op_parallelism", "aio-thread-count", 0), /* thread_count's newer name */
	NONE("use_gds", "GPUDirect Storage: there is no GPU here"),
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
	if (is_auto(it)) {
		note_auto(c, path, hpu__opt_slot_named("beta1"), hpu__opt_slot_named("beta2"));
		return 0;
	}
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

/* A boolean that must have the value hputrain implements. */
static int must_be(struct fctx *c, const char *path, const cJSON *it, int want,
		   const char *why)
{
	int b = 0;
	if (want_bool(c, path, it, &b))
		return -1;
	return b == want ? 0 : ferr(c, path, "%s is not supported: %s", b ? "true" : "false", why);
}

static int f_amsgrad(struct fctx *c, const char *path, const cJSON *it)
{
	return must_be(c, path, it, 0, "hputrain's Adam has no AMSGrad variant");
}

static int f_bias_correction(struct fctx *c, const char *path, const cJSON *it)
{
	return must_be(c, path, it, 1, "Adam here always corrects its bias");
}

static int f_maximize(struct fctx *c, const char *path, const cJSON *it)
{
	return must_be(c, path, it, 0, "the optimizers minimize the loss");
}

static int f_dampening(struct fctx *c, const char *path, const cJSON *it)
{
	double v;
	if (want_number(c, path, it, 0, 1, 0, &v))
		return -1;
	return v == 0 ? 0 : ferr(c, path, "%g is not supported: SGD momentum here has no dampening", v);
}

static const struct fkey optim_param_keys[] = {
	KEY("lr", "lr", 0),
	FN("betas", f_betas, O_ADAM | O_ADAMW),
	KEY("eps", "eps", O_ADAM | O_ADAMW),
	KEY("weight_decay", "weight-decay", 0),
	KEY("momentum", "momentum", O_SGD),
	KEY("nesterov", "nesterov", O_SGD),
	FN("adam_w_mode", f_adam_w_mode, O_ADAM),
	FN("amsgrad", f_amsgrad, O_ADAM | O_ADAMW),
	FN("bias_correction", f_bias_correction, O_ADAM | O_ADAMW),
	FN("maximize", f_maximize, 0),
	FN("dampening", f_dampening, O_SGD),
	NONE("torch_adam", WHY_TORCH),
	NONE("fused", WHY_TORCH),
	NONE("foreach", WHY_TORCH),
	NONE("capturable", WHY_TORCH),
	NONE("differentiable", WHY_TORCH),
};

static const struct fkey typed_keys[] = {
	FN("type", f_noop, 0),
	FN("params", f_noop, 0),
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
	return put(c, p, hpu__opt_find("optimizer"), hpu__optim_name(kind));
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
	KEY("warmup_min_lr", "warmup-min-lr", S_WARM | S_DECAY),
	KEY("warmup_max_lr", "lr", S_WARM | S_DECAY),
	KEY("warmup_num_steps", "warmup-steps", S_WARM | S_DECAY),
	KEY("warmup_type", "warmup-type", S_WARM | S_DECAY),
	KEY("total_num_steps", "total-steps", S_DECAY),
	KEY("step_size", "step-size", S_STEP),
	KEY("gamma", "gamma", S_STEP),
	KEY("T_max", "total-steps", S_COS),
	KEY("eta_min", "min-lr", S_COS),
	NONE("last_batch_iteration", "a resumed run restores its scheduler from the checkpoint"),
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
		hpu__sched_name((hpu_sched_kind)k)))
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
	if (is_auto(it)) {
		note_auto(c, path, hpu__opt_slot_named("precision"), -1);
		return 0;
	}
	if (want_bool(c, path, it, &on))
		return -1;
	if (!on)
		return 0;
	if (c->o->precision != want && c->o->precision != HPU_PREC_FP32 &&
	    c->o->from[hpu__opt_slot_named("precision")] == HPU_FROM_FILE)
		return ferr(c, path, "only one of bf16.enabled, fp16.enabled and fp8.enabled can be true");
	return put(c, path, hpu__opt_find("precision"), hpu__precision_name(want));
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
	FN("enabled", f_fp8_enabled, 0),
	KEY("amax_history_len", "fp8-amax-history", 0),
	KEY("margin", "fp8-margin", 0),
	KEY("amax_compute_algo", "fp8-amax-compute-algo", 0),
};

static int f_fp8(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, fp8_keys, 0, "", 0);
}

static const struct fkey bf16_keys[] = {
	FN("enabled", f_bf16_enabled, 0),
	NONE("immediate_grad_update", WHY_ALWAYS),
	NONE("check_grad_overflow", "a non-finite loss or gradient always skips the step"),
	NONE("bf16_master_weights_and_grads", "master weights are always fp32"),
	NONE("bf16_optimizer_states", "optimizer states are always fp32"),
};

static const struct fkey fp16_keys[] = {
	FN("enabled", f_fp16_enabled, 0),
	KEY("loss_scale", "loss-scale", 0),
	KEY("initial_scale_power", "initial-scale-power", 0),
	KEY("loss_scale_window", "loss-scale-window", 0),
	KEY("hysteresis", "hysteresis", 0),
	KEY("min_loss_scale", "min-loss-scale", 0),
	NONE("auto_cast", "autocast decides per op what runs in 16 bits"),
	NONE("consecutive_hysteresis", "the scaler restores its hysteresis after a good window (DeepSpeed's default)"),
	NONE("fp16_master_weights_and_grads", "master weights are always fp32"),
};

static int f_bf16(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, bf16_keys, 0, "", 0);
}

static int f_fp16(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, fp16_keys, 0, "", 0);
}

/* hputrain.val_check_interval, Lightning's: a fraction below 1 is a part
 * of an epoch (--eval-every-epochs F), else steps (--eval-every N). */
static int f_val_check_interval(struct fctx *c, const char *path, const cJSON *it)
{
	if (cJSON_IsNumber(it) && it->valuedouble > 0 && it->valuedouble < 1)
		return file_opt(c, path, it, "eval-every-epochs");
	return file_opt(c, path, it, "eval-every");
}

/* hputrain: our own keys, named as our flags (dashes or underscores). */
static const struct fkey hputrain_keys[] = {
	KEY("strategy", "strategy", 0),
	KEY("precision", "precision", 0),
	KEY("epochs", "epochs", 0),
	KEY("max_steps", "max-steps", 0),
	KEY("seed", "seed", 0),
	KEY("device", "device", 0),
	KEY("device_memory", "device-memory", 0),
	KEY("allow_tf32", "allow-tf32", 0),
	KEY("host_memory", "host-memory", 0),
	KEY("activation_checkpointing", "activation-checkpointing", 0),
	KEY("graphs", "graphs", 0),
	KEY("graphs_warmup", "graphs-warmup", 0),
	KEY("pad_last_batch", "pad-last-batch", 0),
	KEY("grad_comm_dtype", "grad-comm-dtype", 0),
	KEY("log_every", "log-every", 0),
	KEY("metrics", "metrics", 0),
	KEY("save_params", "save-params", 0),
	KEY("save_params_format", "save-params-format", 0),
	KEY("load_params", "load-params", 0),
	KEY("eval_only", "eval-only", 0),
	KEY("calibration_batches", "calibration-batches", 0),
	KEY("checkpoint_dir", "checkpoint-dir", 0),
	KEY("checkpoint_every", "checkpoint-every", 0),
	KEY("keep_checkpoints", "keep", 0),
	KEY("keep_last", "keep-last", 0),
	KEY("keep_best", "keep-best", 0),
	KEY("resume", "resume", 0),
	KEY("eval", "no-eval", 0), /* true or false */
	KEY("eval_every", "eval-every", 0),
	KEY("eval_every_epochs", "eval-every-epochs", 0),
	KEY("val_fraction", "val-fraction", 0),
	KEY("early_stop", "early-stop", 0),
	FN("val_check_interval", f_val_check_interval, 0), /* Lightning's: steps, or a fraction */
	KEY("check_val_every_n_epoch", "eval-every-epochs", 0), /* Lightning's */
};

static int f_hputrain(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, hputrain_keys, 0, "", W_DASHES);
}

/* amp: apex's mixed precision, which is fp16 with loss scaling here. */
static int f_amp_enabled(struct fctx *c, const char *path, const cJSON *it)
{
	return f_enabled_as(c, path, it, HPU_PREC_FP16_MIXED);
}

static const struct fkey amp_keys[] = {
	FN("enabled", f_amp_enabled, 0),
	NONE("opt_level", "apex's levels: amp runs as 16-mixed, fp32 master weights (O2)"),
};

static int f_amp(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, amp_keys, 0, "", 0);
}

/* The top level, applied in this order; hputrain last, so that its
 * "strategy" overrides zero_optimization.stage. DeepSpeed ignores keys it
 * does not know here, so an unknown key is an error only when it is
 * close to a known one (a misspelling); others are named in the
 * warning (W_LENIENT). */
static const struct fkey top_keys[] = {
	KEY("train_batch_size", "batch-size", 0),
	KEY("train_micro_batch_size_per_gpu", "micro-batch-size", 0),
	KEY("gradient_accumulation_steps", "grad-accum", 0),
	KEY("gradient_clipping", "clip-grad-norm", 0),
	KEY("use_hpu_graphs_for_training", "graphs", 0), /* Optimum Habana's */
	KEY("steps_per_print", "log-every", 0),
	KEY("communication_data_type", "grad-comm-dtype", 0),
	FN("zero_optimization", f_zero, 0),
	FN("aio", f_aio, 0),
	FN("optimizer", f_optimizer, 0),
	FN("scheduler", f_scheduler, 0),
	FN("bf16", f_bf16, 0),
	FN("bfloat16", f_bf16, 0), /* DeepSpeed's older name */
	FN("fp8", f_fp8, 0),
	FN("fp16", f_fp16, 0),
	FN("amp", f_amp, 0),
	FN("hputrain", f_hputrain, 0),
	NONE("wall_clock_breakdown", WHY_PROFILE),
	NONE("memory_breakdown", WHY_PROFILE),
	NONE("timers", WHY_PROFILE),
	NONE("flops_profiler", WHY_PROFILE),
	NONE("comms_logger", WHY_PROFILE),
	NONE("tensorboard", WHY_MONITOR),
	NONE("wandb", WHY_MONITOR),
	NONE("csv_monitor", WHY_MONITOR),
	NONE("comet", WHY_MONITOR),
	NONE("prescale_gradients", WHY_REDUCE),
	NONE("gradient_predivide_factor", WHY_REDUCE),
	NONE("zero_allow_untested_optimizer", "every optimizer here works with every ZeRO stage"),
	NONE("zero_force_ds_cpu_optimizer", WHY_TORCH),
	NONE("cuda_visible_devices", WHY_DEVICES),
	NONE("sparse_gradients", "gradients are dense here"),
	NONE("disable_allgather", WHY_COLL),
	NONE("dump_state", "--verbose prints the configuration in force"),
	NONE("dataloader_drop_last", "the runtime's sampler makes the batches"),
	NONE("activation_checkpointing", WHY_CKPT),
	NONE("checkpoint", "checkpoints are hputrain's own (--checkpoint-dir)"),
	NONE("load_universal_checkpoint", WHY_SAVE),
	NONE("data_types", "gradients accumulate in the precision's own type"),
	NONE("seq_parallel_communication_data_type", WHY_NOTHERE),
	NONE("elasticity", "batch sizes are as given; hpulaunch --max-restarts restarts a job"),
	NONE("autotuning", WHY_NOTHERE),
	NONE("compression_training", WHY_NOTHERE),
	NONE("quantize_training", WHY_NOTHERE),
	NONE("curriculum_learning", WHY_NOTHERE),
	NONE("data_efficiency", WHY_NOTHERE),
	NONE("progressive_layer_drop", WHY_NOTHERE),
	NONE("eigenvalue", WHY_NOTHERE),
	NONE("sparse_attention", WHY_NOTHERE),
	NONE("pipeline", WHY_NOTHERE),
	NONE("hybrid_engine", WHY_NOTHERE),
	NONE("nebula", WHY_NOTHERE),
	NONE("weight_quantization", WHY_NOTHERE),
	NONE("compile", WHY_NOTHERE),
	NONE("graph_harvesting", WHY_NOTHERE),
	NONE("use_data_before_expert_parallelism", WHY_NOTHERE),
};

/* Reads the whole config file (NUL-terminated) into *buf. */
static int read_file(const char *path, char **buf, size_t *len, char *err,
		     size_t errlen)
{
	const char *why = hpu__read_file(path, buf, len);
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

/* The file's errors into err: one as it is, several under a line that
 * counts them. */
static void report(const struct fctx *c, char *err, size_t errlen)
{
	if (c->nerr == 1)
		snprintf(err, errlen, "%s", c->msgs);
	else
		snprintf(err, errlen, "%s has %d errors:\n  %s", c->file, c->nerr, c->msgs);
}

/* Turns every \u0000 escape of the JSON text buf into \u0001, of the
 * same length: cJSON would make it a NUL that ends the string there (a
 * path "/tmp/a\u0000b" would name /tmp/a); a control character stays in
 * the string, where has_control finds it and the key is named. An escape
 * is one when an odd number of backslashes leads up to its "u": "\\u0000"
 * is a backslash and "u0000". */
static void mark_nuls(char *buf)
{
	for (char *p = buf; (p = strstr(p, "\\u0000")); p += 6) {
		size_t at = (size_t)(p - buf), slashes = 1;
		while (slashes <= at && buf[at - slashes] == '\\')
			slashes++;
		if (slashes % 2)
			p[5] = '1';
	}
}

int hpu__opts_load_file(hpu_train_opts *o, const char *path, char *err,
			size_t errlen)
{
	char *buf;
	size_t len;
	if (read_file(path, &buf, &len, err, errlen) < 0)
		return -1;
	int rc = -1;
	/* the copy keeps nothing a previous --config noted */
	hpu_train_opts *copy = malloc(sizeof *copy);
	struct fctx *c = calloc(1, sizeof *c);
	cJSON *root = NULL;
	if (!copy || !c) {
		snprintf(err, errlen, "out of memory reading %s", path);
		goto out;
	}
	*copy = *o;
	copy->ncfg_auto = 0;
	copy->cfg_ignored[0] = '\0';
	*c = (struct fctx){.o = copy, .file = path, .adam_w_mode = 1};
	const char *end = NULL;
	/* The position from ParseWithOpts is cJSON_GetErrorPtr()'s, without
	 * the global. */
	mark_nuls(buf);
	root = cJSON_ParseWithOpts(buf, &end, 1);
	if (!root) {
		syntax_error(path, buf, len, end, err, errlen);
		one_line(err);
		goto out;
	}
	if (!cJSON_IsObject(root)) {
		char got[80];
		snprintf(err, errlen, "%s: expected a JSON object at the top, got %s",
			 path, describe(root, got, sizeof got));
		one_line(err);
		goto out;
	}
	if (WALK(c, root, "", top_keys, 0, "", W_LENIENT) < 0) {
		report(c, err, errlen);
		goto out;
	}
	*o = *copy;
	rc = 0;
out:
	cJSON_Delete(root);
	free(copy);
	free(c);
	free(buf);
	return rc;
}

/* "key=value (--flag)" for one "auto" value, at buf. */
static size_t auto_text(const hpu_train_opts *o, const struct hpu_cfg_auto *a, char *buf,
			size_t len)
{
	char v[2][64];
	const struct hpu__opt *p[2] = {hpu__opt_at(a->slot[0]), hpu__opt_at(a->slot[1])};
	for (int i = 0; i < 2; i++)
		if (p[i])
			hpu__opt_text(o, p[i], v[i], sizeof v[i]);
	/* the values whose number means something else */
	if (p[0]->off == offsetof(hpu_train_opts, weight_decay))
		snprintf(v[0], sizeof v[0], "%.15g", hpu__opts_weight_decay(o));
	if (p[0]->off == offsetof(hpu_train_opts, total_steps) && !o->total_steps)
		snprintf(v[0], sizeof v[0], "the run's steps");
	int from = o->from[a->slot[0]];
	int n = p[1] ? snprintf(buf, len, "%s=[%s, %s] (--%s, --%s", a->key, v[0], v[1],
				p[0]->name, p[1]->name)
		     : snprintf(buf, len, "%s=%s (--%s", a->key, v[0], p[0]->name);
	if (n < 0 || (size_t)n >= len)
		return n < 0 ? 0 : len - 1;
	int m = snprintf(buf + n, len - (size_t)n, "%s)",
			 from == HPU_FROM_FLAG ? "" : from == HPU_FROM_FILE ? ", another key" : ", default");
	return m < 0 ? (size_t)n : (size_t)n + (size_t)m < len ? (size_t)n + (size_t)m : len - 1;
}

void hpu__opts_config_notes(const hpu_train_opts *o, FILE *f, const char *prog)
{
	char line[4096];
	size_t at = 0;
	for (int i = 0; i < o->ncfg_auto && at + 2 < sizeof line; i++) {
		at += (size_t)snprintf(line + at, sizeof line - at, "%s", i ? ", " : "");
		at += auto_text(o, &o->cfg_auto[i], line + at, sizeof line - at);
	}
	if (o->ncfg_auto)
		fprintf(f, "%s: note: %s: \"auto\" values take hputrain's flags and defaults: %s\n",
			prog, o->config, line);
	if (!o->cfg_ignored[0])
		return;
	/* "k1, k2 (why); k3 (why2)": keys with the same reason together, in
	 * the order the reasons first appear */
	at = 0;
	for (const char *l = o->cfg_ignored; *l; l = strchr(l, '\n') + 1) {
		const char *why = strchr(l, '\t') + 1;
		size_t wl = strcspn(why, "\n");
		int seen = 0; /* this reason was said already */
		for (const char *e = o->cfg_ignored; e != l && !seen; e = strchr(e, '\n') + 1)
			seen = !strncmp(strchr(e, '\t') + 1, why, wl) && strchr(e, '\t')[1 + wl] == '\n';
		if (seen)
			continue;
		int first = 1;
		for (const char *e = l; *e; e = strchr(e, '\n') + 1) {
			const char *t = strchr(e, '\t');
			if (strncmp(t + 1, why, wl) || t[1 + wl] != '\n')
				continue;
			at += (size_t)snprintf(line + at, sizeof line - at, "%s%.*s",
					       first ? (at ? "; " : "") : ", ", (int)(t - e), e);
			first = 0;
			if (at >= sizeof line)
				break;
		}
		if (at < sizeof line)
			at += (size_t)snprintf(line + at, sizeof line - at, " (%.*s)", (int)wl, why);
		if (at >= sizeof line) {
			at = sizeof line - 1;
			break;
		}
	}
	fprintf(f, "%s: warning: %s: keys with no effect in hputrain: %s\n", prog, o->config, line);
}
