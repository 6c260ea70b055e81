#include "ckpt/ckpt.h"
#include "common/fileio.h"
#include "common/hex.h"
#include "common/num.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "options/config.h" /* the options' kinds and limits */

struct hpu_ckpt_index {
	uint64_t start, count, at; /* at: floats into the file's section */
	int file;
};

#define say hpu__say

/* ---- reading the manifest ---- */

double hpu__ckpt_num(const cJSON *o, const char *key, double dflt)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(j) ? j->valuedouble : dflt;
}

static int get_num(const cJSON *o, const char *key, double *v)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!cJSON_IsNumber(j))
		return -1;
	*v = j->valuedouble;
	return 0;
}

#define SAFE_INT 9007199254740992.0 /* 2^53: integers up to it are exact in a double */

/* A non-negative integer below 2^53 (exact in a double). */
static int get_u64(const cJSON *o, const char *key, uint64_t *v)
{
	double d;
	if (get_num(o, key, &d) < 0 || d < 0 || d > SAFE_INT || d != (double)(uint64_t)d)
		return -1;
	*v = (uint64_t)d;
	return 0;
}

static int get_str(const cJSON *o, const char *key, char *buf, size_t n)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
	if (!cJSON_IsString(j) || strlen(j->valuestring) >= n)
		return -1;
	memcpy(buf, j->valuestring, strlen(j->valuestring) + 1);
	return 0;
}

/* ---- checking the fields ---- */

enum { OPTIONAL = 0, REQUIRED = 1 };
enum { WHOLE = 1, REAL = 0 };
#define MAX_WORLD 99999.0      /* what hpu__ckpt_shard_name can spell */
#define MAX_INT 2147483647.0
#define MAX_LR 1e6             /* the options' own limits (config.c) */
#define MAX_STEPS 1e15

/* Number `key` of object o (the manifest, or the part of it that ctx
 * names), in [lo, hi] and whole if asked, into *v (when v is not NULL).
 * An optional field may be absent (*v is left alone). Returns 0, or -1
 * with a sentence naming the field and its value. */
static int check_num(const cJSON *o, const char *ctx, const char *key, int required,
		     int whole, double lo, double hi, double *v, char *err, size_t errlen)
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
static int check_name(const cJSON *o, const char *ctx, const char *key, int required,
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

static const char *strategy_at(int k)
{
	return hpu__strategy_name((hpu_strategy)k);
}

static const char *precision_at(int k)
{
	return hpu__precision_name((hpu_precision)k);
}

static const char *optimizer_at(int k)
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

static const char *dtype_at(int k)
{
	(void)k;
	return "F32"; /* the only dtype a checkpoint holds */
}

/* The sections an optimizer's state may be, in the order written. */
static const char *const section_names[] = {"params", "momentum_buffer", "exp_avg",
					    "exp_avg_sq"};

/* The learning-rate schedule, as hpu__sched_init resolves it. */
static int check_sched(const cJSON *j, const char *mpath, char *err, size_t errlen)
{
	char ctx[4400];
	snprintf(ctx, sizeof ctx, "%s: scheduler", mpath);
	if (!cJSON_IsObject(j))
		return say(err, errlen, "%s is not an object", ctx);
	if (check_name(j, ctx, "type", REQUIRED, sched_at, HPU_SCHED_WARMUP_DECAY + 1, NULL, 0,
		       err, errlen) < 0 ||
	    check_name(j, ctx, "warmup_type", OPTIONAL, warmup_at, HPU_WARMUP_LINEAR + 1, NULL, 0,
		       err, errlen) < 0)
		return -1;
	static const char *const rates[] = {"lr", "warmup_min_lr", "gamma", "min_lr"};
	for (size_t k = 0; k < sizeof rates / sizeof *rates; k++)
		if (check_num(j, ctx, rates[k], OPTIONAL, REAL, 0, MAX_LR, NULL, err, errlen) < 0)
			return -1;
	if (check_num(j, ctx, "warmup_steps", OPTIONAL, WHOLE, 2, MAX_STEPS, NULL, err, errlen) < 0 ||
	    check_num(j, ctx, "total_steps", OPTIONAL, WHOLE, 1, MAX_STEPS, NULL, err, errlen) < 0 ||
	    check_num(j, ctx, "step_size", OPTIONAL, WHOLE, 1, MAX_STEPS, NULL, err, errlen) < 0)
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
	if (check_num(j, ctx, "scale", OPTIONAL, REAL, 1e-300, 1e300, NULL, err, errlen) < 0 ||
	    check_num(j, ctx, "hysteresis_left", OPTIONAL, WHOLE, 0, MAX_INT, NULL, err, errlen) < 0 ||
	    check_num(j, ctx, "steps", OPTIONAL, WHOLE, 0, MAX_STEPS, NULL, err, errlen) < 0 ||
	    check_num(j, ctx, "last_overflow", OPTIONAL, WHOLE, -1, MAX_STEPS, NULL, err, errlen) < 0 ||
	    check_num(j, ctx, "skipped", OPTIONAL, WHOLE, 0, MAX_STEPS, NULL, err, errlen) < 0)
		return -1;
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
	if (check_num(j, ctx, "amax_history_len", REQUIRED, WHOLE, 1, 1 << 20, &hlen, err, errlen) < 0 ||
	    check_num(j, ctx, "margin", OPTIONAL, WHOLE, 0, 64, NULL, err, errlen) < 0)
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
		if (check_num(s, ctx, "layer", REQUIRED, WHOLE, 0, MAX_INT, NULL, err, errlen) < 0 ||
		    check_num(s, ctx, "op", REQUIRED, WHOLE, 0, MAX_INT, NULL, err, errlen) < 0 ||
		    check_num(s, ctx, "k", OPTIONAL, WHOLE, 0, MAX_INT, NULL, err, errlen) < 0 ||
		    check_num(s, ctx, "filled", REQUIRED, WHOLE, 0, h, NULL, err, errlen) < 0 ||
		    check_num(s, ctx, "pos", REQUIRED, WHOLE, 0, h - 1, NULL, err, errlen) < 0 ||
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
static int check_run(const cJSON *m, const char *mpath, char *err, size_t errlen)
{
	const cJSON *rng = cJSON_GetObjectItemCaseSensitive(m, "rng"), *x;
	if ((x = cJSON_GetObjectItemCaseSensitive(m, "model")) && !cJSON_IsString(x))
		return say(err, errlen, "%s: model is not a string", mpath);
	if (check_num(m, mpath, "epoch", OPTIONAL, WHOLE, 0, 1e6, NULL, err, errlen) < 0 ||
	    check_num(m, mpath, "batch_in_epoch", OPTIONAL, WHOLE, 0, MAX_STEPS, NULL, err, errlen) < 0 ||
	    check_num(m, mpath, "global_batch", OPTIONAL, WHOLE, 1, 1 << 24, NULL, err, errlen) < 0 ||
	    check_num(m, mpath, "optimizer_steps", OPTIONAL, WHOLE, 0, MAX_STEPS, NULL, err, errlen) < 0)
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
	if ((x = cJSON_GetObjectItemCaseSensitive(m, "fp8")) && check_fp8(x, mpath, err, errlen) < 0)
		return -1;
	return 0;
}

/* A shape: at most HPU_CKPT_MAX_DIMS whole dimensions from 1, their
 * product (1 for []) at most 2^53. Returns 0, or -1. */
static int parse_shape(const cJSON *shape, int *ndim, int64_t *dims, uint64_t *prod)
{
	const cJSON *d;
	*ndim = 0;
	*prod = 1;
	if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > HPU_CKPT_MAX_DIMS)
		return -1;
	cJSON_ArrayForEach(d, shape) {
		double v = cJSON_IsNumber(d) ? d->valuedouble : 0;
		if (!(v >= 1 && v <= SAFE_INT) || v != (double)(uint64_t)v ||
		    (double)*prod * v > SAFE_INT)
			return -1;
		dims[(*ndim)++] = (int64_t)v;
		*prod *= (uint64_t)v;
	}
	return 0;
}

static int parse_params(hpu_ckpt *c, const char *mpath, char *err, size_t errlen)
{
	const cJSON *arr = cJSON_GetObjectItemCaseSensitive(c->m, "parameters");
	int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
	if (n <= 0)
		return say(err, errlen, "%s: no \"parameters\" list", mpath);
	if (!(c->params = calloc((size_t)n, sizeof *c->params)))
		return say(err, errlen, "out of memory");
	c->nparams = n;
	uint64_t at = 0;
	int i = 0;
	const cJSON *p;
	cJSON_ArrayForEach(p, arr) {
		hpu_ckpt_param *q = &c->params[i];
		const cJSON *shape = cJSON_GetObjectItemCaseSensitive(p, "shape");
		if (get_str(p, "name", q->name, sizeof q->name) < 0 || !q->name[0] ||
		    get_u64(p, "offset", &q->offset) < 0 || get_u64(p, "numel", &q->numel) < 0 ||
		    !cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > HPU_CKPT_MAX_DIMS)
			return say(err, errlen, "%s: parameter %d lacks a name, shape, offset or numel",
				   mpath, i);
		char ctx[4400];
		snprintf(ctx, sizeof ctx, "%s: parameter %s", mpath, q->name);
		if (check_name(p, ctx, "dtype", REQUIRED, dtype_at, 1, NULL, 0, err, errlen) < 0)
			return -1;
		uint64_t prod;
		if (parse_shape(shape, &q->ndim, q->shape, &prod) < 0)
			return say(err, errlen,
				   "%s has a bad shape (whole dimensions from 1, their product "
				   "at most 2^53)",
				   ctx);
		if (prod != q->numel || q->offset != at)
			return say(err, errlen,
				   "%s: parameter %s: numel %llu and offset %llu do not follow from "
				   "the shapes (expected offset %llu)",
				   mpath, q->name, (unsigned long long)q->numel,
				   (unsigned long long)q->offset, (unsigned long long)at);
		at += q->numel;
		i++;
	}
	c->numel = at;
	if (at > (uint64_t)SAFE_INT)
		return say(err, errlen, "%s: the parameters hold %llu floats, more than 2^53", mpath,
			   (unsigned long long)at);
	double numel = (double)at; /* when absent */
	if (check_num(c->m, mpath, "numel", OPTIONAL, WHOLE, 0, SAFE_INT, &numel, err, errlen) < 0)
		return -1;
	if ((uint64_t)numel != at)
		return say(err, errlen, "%s: numel %.16g, but the parameters hold %llu floats", mpath,
			   numel, (unsigned long long)at);
	return 0;
}

static int parse_sections(hpu_ckpt *c, const char *mpath, char *err, size_t errlen)
{
	const cJSON *arr = cJSON_GetObjectItemCaseSensitive(c->m, "sections"), *s;
	int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
	if (n < 1 || n > HPU_CKPT_MAX_SECTIONS)
		return say(err, errlen, "%s: \"sections\" must list 1 to %d names", mpath,
			   HPU_CKPT_MAX_SECTIONS);
	cJSON_ArrayForEach(s, arr) {
		if (!cJSON_IsString(s) || strlen(s->valuestring) >= sizeof c->sections[0])
			return say(err, errlen, "%s: a section name is not a short string", mpath);
		strcpy(c->sections[c->nsections++], s->valuestring);
	}
	if (strcmp(c->sections[0], "params") != 0)
		return say(err, errlen, "%s: the first section must be \"params\"", mpath);
	for (int k = 0; k < c->nsections; k++) {
		int known = 0;
		for (size_t j = 0; j < sizeof section_names / sizeof *section_names; j++)
			known |= !strcmp(c->sections[k], section_names[j]);
		if (!known)
			return say(err, errlen,
				   "%s: section \"%s\" is not one of params, momentum_buffer, exp_avg, "
				   "exp_avg_sq",
				   mpath, c->sections[k]);
		if (hpu__ckpt_section(c, c->sections[k]) != k)
			return say(err, errlen, "%s: section \"%s\" is listed twice", mpath,
				   c->sections[k]);
	}
	/* the optimizer's state: Adam's two moments, SGD's momentum if any */
	int adam = strcmp(c->optimizer, "sgd") != 0;
	int mom = hpu__ckpt_section(c, "momentum_buffer") >= 0;
	if (adam ? c->nsections == 3 && !mom : c->nsections == 1 + mom)
		return 0;
	char list[4 * 34] = "";
	for (int k = 0, at = 0; k < c->nsections; k++)
		at += snprintf(list + at, sizeof list - (size_t)at, "%s%s", k ? ", " : "",
			       c->sections[k]);
	return say(err, errlen, "%s: sections %s are not the state of optimizer %s (%s)", mpath,
		   list, c->optimizer,
		   adam ? "params, exp_avg, exp_avg_sq" : "params, and momentum_buffer with momentum");
}

static const char *sync_at(int k)
{
	static const char *const names[] = {"broadcast", "mean", "local"};
	return names[k];
}

/* The optional "buffers" object: the file (a plain name of its own, its
 * size and digest) and the buffers laid end to end in it, each named once
 * (ckpt.h). */
static int parse_buffers(hpu_ckpt *c, const char *mpath, char *err, size_t errlen)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->m, "buffers");
	if (!j)
		return 0;
	hpu_ckpt_file *f = &c->buffer_file;
	const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "tensors"), *t;
	if (!cJSON_IsObject(j) || get_str(j, "file", f->name, sizeof f->name) < 0 ||
	    !f->name[0] || strchr(f->name, '/') || get_u64(j, "bytes", &f->bytes) < 0 ||
	    get_str(j, "sha256", f->sha256, sizeof f->sha256) < 0 || strlen(f->sha256) != 64 ||
	    !cJSON_IsArray(arr))
		return say(err, errlen, "%s: \"buffers\" lacks a plain file name, bytes, sha256 or "
			   "tensors", mpath);
	if (!strcmp(f->name, HPU_CKPT_MANIFEST) || !strcmp(f->name, ".") || !strcmp(f->name, ".."))
		return say(err, errlen, "%s: buffers file \"%s\" is not a data file's name", mpath,
			   f->name);
	for (int i = 0; i < c->nfiles; i++)
		if (!strcmp(f->name, c->files[i].name))
			return say(err, errlen, "%s: buffers file %s is also a shard", mpath,
				   f->name);
	int n = cJSON_GetArraySize(arr);
	if (n < 1)
		return say(err, errlen, "%s: \"buffers\" lists no tensors (a model without buffers "
			   "has no \"buffers\")", mpath);
	if (!(c->buffers = calloc((size_t)n, sizeof *c->buffers)))
		return say(err, errlen, "out of memory");
	uint64_t at = 0;
	cJSON_ArrayForEach(t, arr) {
		hpu_ckpt_buffer *q = &c->buffers[c->nbuffers];
		uint64_t prod;
		char ctx[4400];
		if (get_str(t, "name", q->name, sizeof q->name) < 0 || !q->name[0] ||
		    get_u64(t, "offset", &q->offset) < 0 || get_u64(t, "numel", &q->numel) < 0)
			return say(err, errlen, "%s: buffer %d lacks a name, offset or numel",
				   mpath, c->nbuffers);
		snprintf(ctx, sizeof ctx, "%s: buffer %s", mpath, q->name);
		if (check_name(t, ctx, "dtype", REQUIRED, dtype_at, 1, NULL, 0, err, errlen) < 0 ||
		    check_name(t, ctx, "sync", OPTIONAL, sync_at, 3, q->sync, sizeof q->sync, err,
			       errlen) < 0)
			return -1;
		if (parse_shape(cJSON_GetObjectItemCaseSensitive(t, "shape"), &q->ndim, q->shape,
				&prod) < 0)
			return say(err, errlen,
				   "%s has no shape or a bad one (whole dimensions from 1, their "
				   "product at most 2^53)",
				   ctx);
		if (prod != q->numel || q->offset != at)
			return say(err, errlen,
				   "%s: numel %llu and offset %llu do not follow from the shapes "
				   "(expected offset %llu)",
				   ctx, (unsigned long long)q->numel, (unsigned long long)q->offset,
				   (unsigned long long)at);
		if (hpu__ckpt_buffer_find(c, q->name) >= 0)
			return say(err, errlen, "%s is listed twice", ctx);
		at += q->numel;
		c->nbuffers++;
		if (at > (uint64_t)SAFE_INT / 4)
			return say(err, errlen, "%s: the buffers hold more than 2^51 floats",
				   mpath);
	}
	c->buffer_numel = at;
	double numel = (double)at; /* when absent */
	char ctx[4400];
	snprintf(ctx, sizeof ctx, "%s: buffers", mpath);
	if (check_num(j, ctx, "numel", OPTIONAL, WHOLE, 0, SAFE_INT, &numel, err, errlen) < 0)
		return -1;
	if ((uint64_t)numel != at)
		return say(err, errlen, "%s: numel %.16g, but the buffers hold %llu floats", ctx,
			   numel, (unsigned long long)at);
	if (f->bytes != at * 4)
		return say(err, errlen, "%s: %s: %llu bytes listed, but its buffers make %llu",
			   mpath, f->name, (unsigned long long)f->bytes,
			   (unsigned long long)(at * 4));
	return 0;
}

static int parse_file(hpu_ckpt_file *f, const cJSON *j, int nsections, const char *mpath,
		      char *err, size_t errlen)
{
	const cJSON *segs = cJSON_GetObjectItemCaseSensitive(j, "segments"), *s;
	if (get_str(j, "name", f->name, sizeof f->name) < 0 || strchr(f->name, '/') ||
	    get_u64(j, "bytes", &f->bytes) < 0 ||
	    get_str(j, "sha256", f->sha256, sizeof f->sha256) < 0 || strlen(f->sha256) != 64 ||
	    !cJSON_IsArray(segs))
		return say(err, errlen, "%s: a file entry lacks a plain name, bytes, sha256 or segments",
			   mpath);
	f->nseg = (size_t)cJSON_GetArraySize(segs);
	if (f->nseg && !(f->seg = calloc(f->nseg, sizeof *f->seg)))
		return say(err, errlen, "out of memory");
	size_t k = 0;
	uint64_t prev_end = 0;
	cJSON_ArrayForEach(s, segs) {
		if (!cJSON_IsArray(s) || cJSON_GetArraySize(s) != 2 ||
		    !cJSON_IsNumber(cJSON_GetArrayItem(s, 0)) ||
		    !cJSON_IsNumber(cJSON_GetArrayItem(s, 1)))
			return say(err, errlen, "%s: %s: a segment is not [start, count]", mpath,
				   f->name);
		double a = cJSON_GetArrayItem(s, 0)->valuedouble, b = cJSON_GetArrayItem(s, 1)->valuedouble;
		if (a < 0 || b < 1 || a > SAFE_INT || b > SAFE_INT || a != (double)(uint64_t)a ||
		    b != (double)(uint64_t)b || (k && (uint64_t)a < prev_end))
			return say(err, errlen, "%s: %s: segments must be increasing and not empty "
				   "(whole numbers below 2^53)", mpath, f->name);
		f->seg[k].start = (uint64_t)a;
		f->seg[k].count = (uint64_t)b;
		prev_end = f->seg[k].start + f->seg[k].count;
		f->elems += f->seg[k].count;
		k++;
	}
	if (f->bytes != f->elems * 4 * (uint64_t)nsections)
		return say(err, errlen, "%s: %s: %llu bytes listed, but its segments make %llu",
			   mpath, f->name, (unsigned long long)f->bytes,
			   (unsigned long long)(f->elems * 4 * (uint64_t)nsections));
	return 0;
}

static int by_start(const void *a, const void *b)
{
	const hpu_ckpt_index *x = a, *y = b;
	return x->start < y->start ? -1 : x->start > y->start;
}

/* Every segment, sorted; they must tile [0, numel). */
static int build_index(hpu_ckpt *c, const char *mpath, char *err, size_t errlen)
{
	size_t n = 0;
	for (int i = 0; i < c->nfiles; i++)
		n += c->files[i].nseg;
	if (!(c->index = calloc(n ? n : 1, sizeof *c->index)))
		return say(err, errlen, "out of memory");
	for (int i = 0; i < c->nfiles; i++) {
		uint64_t at = 0;
		for (size_t k = 0; k < c->files[i].nseg; k++) {
			hpu_ckpt_index *x = &c->index[c->nindex++];
			x->start = c->files[i].seg[k].start;
			x->count = c->files[i].seg[k].count;
			x->at = at;
			x->file = i;
			at += x->count;
		}
	}
	qsort(c->index, c->nindex, sizeof *c->index, by_start);
	uint64_t end = 0;
	for (size_t k = 0; k < c->nindex; k++) {
		if (c->index[k].start != end)
			return say(err, errlen,
				   "%s: the shards %s floats %llu-%llu of the parameters", mpath,
				   c->index[k].start > end ? "miss" : "hold twice",
				   (unsigned long long)(c->index[k].start > end ? end : c->index[k].start),
				   (unsigned long long)(c->index[k].start > end ? c->index[k].start : end));
		end += c->index[k].count;
	}
	if (end != c->numel)
		return say(err, errlen, "%s: the shards hold %llu floats, the parameters %llu", mpath,
			   (unsigned long long)end, (unsigned long long)c->numel);
	return 0;
}

/* ---- whose files, and the manifest's own digest ---- */

/* "0", "0 or 1001", "0, 1001 or 1002" */
static void uid_list(const hpu_ckpt_owners *who, char *buf, size_t n)
{
	size_t at = 0;
	buf[0] = '\0';
	for (int i = 0; i < who->n && at < n; i++)
		at += (size_t)snprintf(buf + at, n - at, "%s%u",
				       !i ? "" : i + 1 == who->n ? " or " : ", ",
				       (unsigned)who->uid[i]);
}

int hpu__ckpt_check_owner(const char *path, const struct stat *st, const hpu_ckpt_owners *who,
			  char *err, size_t errlen)
{
	if (!who || who->n <= 0)
		return 0;
	for (int i = 0; i < who->n; i++)
		if (st->st_uid == who->uid[i])
			return 0;
	char list[HPU_CKPT_MAX_OWNERS * 12];
	uid_list(who, list, sizeof list);
	return say(err, errlen,
		   "%s is owned by uid %u, not by uid %s: refusing it (another user's file in a "
		   "checkpoint directory others may write? give the checkpoint root the sticky bit, "
		   "chmod +t)",
		   path, (unsigned)st->st_uid, list);
}

/* Why path could not be opened as a checkpoint's file: a symbolic link
 * (O_NOFOLLOW's ELOOP) said as one, else why. */
static int open_failed(const char *what, const char *path, const char *why, char *err,
		       size_t errlen)
{
	struct stat st;
	if (errno == ELOOP && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
		return say(err, errlen,
			   "%s%s is a symbolic link (not followed: a checkpoint's files are regular "
			   "files)",
			   what, path);
	return say(err, errlen, "%s%s: %s", what, path, why);
}

/* A checkpoint's file opened for reading: a regular file, not through a
 * symbolic link, of a trusted owner (a FIFO or a device is refused
 * unopened for reading, so nothing waits). Its descriptor, its status in
 * *st; -1 with a sentence ("checkpoint shard PATH: ..."). */
static int open_data(hpu_ckpt *c, const char *what, const char *path, struct stat *st,
		     char *err, size_t errlen)
{
	const char *why = NULL;
	int fd = hpu__open_input_fd(path, O_NOFOLLOW, st, &why);
	if (fd < 0)
		return open_failed(what, path, why, err, errlen);
	if (hpu__ckpt_check_owner(path, st, &c->owners, err, errlen) < 0) {
		c->foreign = 1;
		close(fd);
		return -1;
	}
	return fd;
}

/* The checkpoint's directory: of a trusted owner, and so is a symbolic
 * link that leads to it (lstat first). A directory that is not there is
 * left to the manifest's reading to say. */
static int check_dir(hpu_ckpt *c, char *err, size_t errlen)
{
	struct stat st;
	if (c->owners.n <= 0 || lstat(c->dir, &st) < 0)
		return 0;
	if (S_ISLNK(st.st_mode) &&
	    (hpu__ckpt_check_owner(c->dir, &st, &c->owners, err, errlen) < 0 || stat(c->dir, &st) < 0))
		return c->foreign = 1, -1;
	if (hpu__ckpt_check_owner(c->dir, &st, &c->owners, err, errlen) < 0)
		return c->foreign = 1, -1;
	return 0;
}

int hpu__ckpt_check_latest(const char *root, const hpu_ckpt_owners *who, char *err,
			   size_t errlen)
{
	char path[4200];
	struct stat st;
	snprintf(path, sizeof path, "%s/%s", root, HPU_CKPT_LATEST);
	if (!who || who->n <= 0 || lstat(path, &st) < 0)
		return 0;
	if (S_ISLNK(st.st_mode))
		return say(err, errlen,
			   "%s is a symbolic link (not followed: `latest` is a regular file): "
			   "refusing it",
			   path);
	if (!S_ISREG(st.st_mode))
		return say(err, errlen, "%s is not a regular file: refusing it", path);
	return hpu__ckpt_check_owner(path, &st, who, err, errlen);
}

/* Sorts the keys of every object under o (in place), keeping the order
 * of repeated keys: the canonical form the digest is over. -1 when out
 * of memory. */
static int canon(cJSON *o)
{
	if (!cJSON_IsObject(o) && !cJSON_IsArray(o))
		return 0;
	int n = cJSON_GetArraySize(o), i = 0;
	if (n == 0)
		return 0;
	cJSON **v = malloc((size_t)n * sizeof *v), *x;
	if (!v)
		return -1;
	for (x = o->child; x; x = x->next)
		v[i++] = x;
	for (i = 0; i < n; i++)
		if (canon(v[i]) < 0) {
			free(v);
			return -1;
		}
	if (cJSON_IsObject(o)) {
		/* equal keys keep their order: a merge by key, stable */
		for (i = 1; i < n; i++) {
			cJSON *k = v[i];
			int j = i;
			while (j > 0 && strcmp(v[j - 1]->string, k->string) > 0) {
				v[j] = v[j - 1];
				j--;
			}
			v[j] = k;
		}
		for (i = 0; i < n; i++)
			cJSON_DetachItemViaPointer(o, v[i]);
		for (i = 0; i < n; i++)
			cJSON_AddItemToArray(o, v[i]);
	}
	free(v);
	return 0;
}

int hpu__ckpt_manifest_digest(const cJSON *m, char *hex)
{
	cJSON *d = cJSON_Duplicate(m, 1);
	if (!d)
		return -1;
	cJSON_DeleteItemFromObjectCaseSensitive(d, HPU_CKPT_DIGEST);
	char *text = canon(d) < 0 ? NULL : cJSON_PrintUnformatted(d);
	cJSON_Delete(d);
	if (!text)
		return -1;
	unsigned char md[32];
	unsigned int ml = 0;
	int rc = EVP_Digest(text, strlen(text), md, &ml, EVP_sha256(), NULL) == 1 ? 0 : -1;
	free(text);
	if (rc == 0)
		hpu__hex(hex, md, sizeof md);
	return rc;
}

char *hpu__ckpt_manifest_text(cJSON *m)
{
	char hex[65];
	if (hpu__ckpt_manifest_digest(m, hex) < 0)
		return NULL;
	cJSON *s = cJSON_CreateString(hex);
	if (!s)
		return NULL;
	if (cJSON_GetObjectItemCaseSensitive(m, HPU_CKPT_DIGEST))
		cJSON_ReplaceItemInObjectCaseSensitive(m, HPU_CKPT_DIGEST, s);
	else
		cJSON_AddItemToObject(m, HPU_CKPT_DIGEST, s);
	return cJSON_Print(m);
}

/* The manifest's digest against its content: an edit since it was
 * written is an error; none at all (a manifest from before) is noted. */
static int check_sealed(hpu_ckpt *c, const char *mpath, char *err, size_t errlen)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->m, HPU_CKPT_DIGEST);
	char hex[65];
	if (!j) {
		c->unsealed = 1;
		return 0;
	}
	if (!cJSON_IsString(j) || strlen(j->valuestring) != 64)
		return say(err, errlen, "%s: %s is not a SHA-256 (64 hex digits)", mpath,
			   HPU_CKPT_DIGEST);
	if (hpu__ckpt_manifest_digest(c->m, hex) < 0)
		return say(err, errlen, "out of memory");
	if (strcmp(hex, j->valuestring) != 0)
		return say(err, errlen,
			   "%s was altered after it was written: its content's SHA-256 is %s, its "
			   "%s says %s",
			   mpath, hex, HPU_CKPT_DIGEST, j->valuestring);
	return 0;
}

void hpu__ckpt_unsealed_note(const hpu_ckpt *c, char *buf, size_t n)
{
	snprintf(buf, n,
		 "%s/%s has no %s (written before hputrain sealed its manifests?): an edit of it "
		 "cannot be detected",
		 c->dir, HPU_CKPT_MANIFEST, HPU_CKPT_DIGEST);
}

/* The manifest's text, read from a regular file of a trusted owner. */
static int read_manifest(hpu_ckpt *c, const char *mpath, char **text, size_t *len, char *err,
			 size_t errlen)
{
	struct stat st;
	int fd = open_data(c, "cannot read the checkpoint manifest ", mpath, &st, err, errlen);
	if (fd < 0)
		return -1;
	FILE *f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		return say(err, errlen, "out of memory");
	}
	const char *why = hpu__read_stream(f, 1, text, len);
	fclose(f);
	if (why)
		return say(err, errlen, "cannot read the checkpoint manifest %s: %s", mpath, why);
	return 0;
}

int hpu__ckpt_open(hpu_ckpt *c, const char *dir, char *err, size_t errlen)
{
	return hpu__ckpt_open_owned(c, dir, NULL, err, errlen);
}

int hpu__ckpt_open_owned(hpu_ckpt *c, const char *dir, const hpu_ckpt_owners *who, char *err,
			 size_t errlen)
{
	memset(c, 0, sizeof *c);
	snprintf(c->dir, sizeof c->dir, "%s", dir);
	if (who)
		c->owners = *who;
	char mpath[4200], *text = NULL;
	size_t len;
	snprintf(mpath, sizeof mpath, "%s/%s", dir, HPU_CKPT_MANIFEST);
	if (check_dir(c, err, errlen) < 0 || read_manifest(c, mpath, &text, &len, err, errlen) < 0)
		return -1;
	c->m = cJSON_ParseWithLength(text, len);
	free(text);
	if (!cJSON_IsObject(c->m))
		return say(err, errlen, "%s is not a JSON object (damaged?)", mpath);
	char fmt[64] = "";
	double ver = 0, world = 0, step = 0;
	if (get_str(c->m, "format", fmt, sizeof fmt) < 0 || strcmp(fmt, HPU_CKPT_FORMAT) != 0)
		return say(err, errlen, "%s: not a hputrain checkpoint manifest (\"format\")", mpath);
	if (get_num(c->m, "version", &ver) < 0 || ver != HPU_CKPT_VERSION)
		return say(err, errlen, "%s: format version %g; this build reads version %d", mpath,
			   ver, HPU_CKPT_VERSION);
	if (check_num(c->m, mpath, "world_size", REQUIRED, WHOLE, 1, MAX_WORLD, &world, err,
		      errlen) < 0 ||
	    check_num(c->m, mpath, "step", REQUIRED, WHOLE, 0, MAX_STEPS, &step, err, errlen) < 0 ||
	    check_name(c->m, mpath, "strategy", REQUIRED, strategy_at, HPU_STRATEGY_ZERO3 + 1,
		       c->strategy, sizeof c->strategy, err, errlen) < 0 ||
	    check_name(c->m, mpath, "precision", REQUIRED, precision_at, HPU_PREC_FP8 + 1,
		       c->precision, sizeof c->precision, err, errlen) < 0 ||
	    check_name(c->m, mpath, "optimizer", REQUIRED, optimizer_at, HPU_OPTIM_ADAM + 1,
		       c->optimizer, sizeof c->optimizer, err, errlen) < 0 ||
	    check_run(c->m, mpath, err, errlen) < 0)
		return -1;
	c->world = (int)world;
	c->step = (long)step;
	if (parse_params(c, mpath, err, errlen) < 0 || parse_sections(c, mpath, err, errlen) < 0)
		return -1;
	const cJSON *files = cJSON_GetObjectItemCaseSensitive(c->m, "files"), *f;
	int n = cJSON_IsArray(files) ? cJSON_GetArraySize(files) : 0;
	if (n < 1)
		return say(err, errlen, "%s: no \"files\"", mpath);
	if (n != c->world)
		return say(err, errlen, "%s: world_size %d, but %d files listed (one per rank)", mpath,
			   c->world, n);
	if (!(c->files = calloc((size_t)n, sizeof *c->files)) ||
	    !(c->fds = malloc((size_t)(n + 1) * sizeof *c->fds)))
		return say(err, errlen, "out of memory");
	for (int i = 0; i <= n; i++)
		c->fds[i] = -1;
	c->nfiles = n;
	int i = 0;
	cJSON_ArrayForEach(f, files) {
		if (parse_file(&c->files[i++], f, c->nsections, mpath, err, errlen) < 0)
			return -1;
	}
	if (build_index(c, mpath, err, errlen) < 0 || parse_buffers(c, mpath, err, errlen) < 0)
		return -1;
	return check_sealed(c, mpath, err, errlen);
}

void hpu__ckpt_close(hpu_ckpt *c)
{
	for (int i = 0; i < c->nfiles; i++) {
		free(c->files[i].seg);
		if (c->fds && c->fds[i] >= 0)
			close(c->fds[i]);
	}
	if (c->fds && c->fds[c->nfiles] >= 0)
		close(c->fds[c->nfiles]);
	free(c->files);
	free(c->fds);
	free(c->params);
	free(c->buffers);
	free(c->index);
	cJSON_Delete(c->m);
	memset(c, 0, sizeof *c);
}

int hpu__ckpt_section(const hpu_ckpt *c, const char *name)
{
	for (int i = 0; i < c->nsections; i++)
		if (strcmp(c->sections[i], name) == 0)
			return i;
	return -1;
}

int hpu__ckpt_param_find(const hpu_ckpt *c, const char *name)
{
	for (int i = 0; i < c->nparams; i++)
		if (strcmp(c->params[i].name, name) == 0)
			return i;
	return -1;
}

int hpu__ckpt_buffer_find(const hpu_ckpt *c, const char *name)
{
	for (int i = 0; i < c->nbuffers; i++)
		if (strcmp(c->buffers[i].name, name) == 0)
			return i;
	return -1;
}

/* ---- digests ---- */

/* SHA-256 of what fd holds, read to its end but no further than `most`
 * bytes (a file that grows while read stops there). */
static int sha256_fd(int fd, uint64_t most, char *hexout, uint64_t *bytes)
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	enum { BUF = 1 << 20 };
	unsigned char *buf = malloc(BUF);
	int rc = -1, e = ENOMEM;
	*bytes = 0;
	if (md && buf && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1) {
		for (;;) {
			ssize_t got = *bytes >= most ? 0 : read(fd, buf, BUF);
			if (got < 0 && errno == EINTR)
				continue;
			if (got < 0) {
				e = errno;
				break;
			}
			if (got == 0) {
				unsigned char d[32];
				unsigned int dl = 0;
				EVP_DigestFinal_ex(md, d, &dl);
				hpu__hex(hexout, d, sizeof d);
				rc = 0;
				break;
			}
			EVP_DigestUpdate(md, buf, (size_t)got);
			*bytes += (uint64_t)got;
		}
	}
	EVP_MD_CTX_free(md);
	free(buf);
	if (rc)
		errno = e;
	return rc;
}

int hpu__ckpt_sha256_file(const char *path, char *hexout, uint64_t *bytes)
{
	struct stat st;
	const char *why;
	int fd = hpu__open_input_fd(path, 0, &st, &why);
	if (fd < 0) {
		if (st.st_mode)
			errno = EINVAL; /* not a regular file */
		return -1;
	}
	int rc = sha256_fd(fd, UINT64_MAX, hexout, bytes), e = errno;
	close(fd);
	errno = e;
	return rc;
}

/* A file's size against the manifest's: "truncated" or "too long". */
static int wrong_size(const char *what, const char *path, uint64_t bytes, uint64_t want,
		      char *err, size_t errlen)
{
	return say(err, errlen, "checkpoint %s %s is %s: %llu bytes, the manifest says %llu", what,
		   path, bytes < want ? "truncated" : "too long", (unsigned long long)bytes,
		   (unsigned long long)want);
}

/* File f of c, `what` naming its kind in the sentences: a regular file of
 * a trusted owner, its size (from fstat: nothing is read from a file of
 * the wrong size), then its digest. */
static int verify_file(hpu_ckpt *c, const hpu_ckpt_file *f, const char *what, char *err,
		       size_t errlen)
{
	char path[4200], got[65], pre[64];
	uint64_t bytes;
	struct stat st;
	snprintf(path, sizeof path, "%s/%s", c->dir, f->name);
	snprintf(pre, sizeof pre, "checkpoint %s ", what);
	int fd = open_data(c, pre, path, &st, err, errlen);
	if (fd < 0)
		return -1;
	if ((uint64_t)st.st_size != f->bytes) {
		close(fd);
		return wrong_size(what, path, (uint64_t)st.st_size, f->bytes, err, errlen);
	}
	int rc = sha256_fd(fd, f->bytes + 1, got, &bytes), e = errno;
	close(fd);
	if (rc < 0)
		return say(err, errlen, "checkpoint %s %s: %s", what, path, strerror(e));
	if (bytes != f->bytes) /* changed while it was read */
		return wrong_size(what, path, bytes, f->bytes, err, errlen);
	if (strcmp(got, f->sha256) != 0)
		return say(err, errlen,
			   "checkpoint %s %s is damaged: SHA-256 %s, the manifest says %s", what,
			   path, got, f->sha256);
	return 0;
}

int hpu__ckpt_verify(hpu_ckpt *c, int i, char *err, size_t errlen)
{
	return verify_file(c, &c->files[i], "shard", err, errlen);
}

int hpu__ckpt_verify_buffers(hpu_ckpt *c, char *err, size_t errlen)
{
	if (!c->nbuffers)
		return 0;
	return verify_file(c, &c->buffer_file, "buffers file", err, errlen);
}

/* ---- reading floats ---- */

/* File i's descriptor; i == nfiles: the buffers file's. */
static int file_fd(hpu_ckpt *c, int i, char *err, size_t errlen)
{
	if (c->fds[i] >= 0)
		return c->fds[i];
	char path[4200];
	int shard = i < c->nfiles;
	snprintf(path, sizeof path, "%s/%s", c->dir,
		 shard ? c->files[i].name : c->buffer_file.name);
	struct stat st;
	c->fds[i] = open_data(c, shard ? "checkpoint shard " : "checkpoint buffers file ", path, &st,
			      err, errlen);
	return c->fds[i];
}

static int pread_all(int fd, void *dst, size_t n, off_t at)
{
	char *p = dst;
	while (n) {
		ssize_t got = pread(fd, p, n, at);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			if (got == 0)
				errno = EIO; /* shorter than the manifest says */
			return -1;
		}
		p += got;
		n -= (size_t)got;
		at += got;
	}
	return 0;
}

int hpu__ckpt_read(hpu_ckpt *c, int section, uint64_t start, uint64_t count, float *dst,
		   char *err, size_t errlen)
{
	if (section < 0 || section >= c->nsections || start + count > c->numel)
		return say(err, errlen, "checkpoint %s: floats %llu-%llu of section %d are not there",
			   c->dir, (unsigned long long)start, (unsigned long long)(start + count),
			   section);
	/* the last segment starting at or before `start` */
	size_t lo = 0, hi = c->nindex;
	while (hi - lo > 1) {
		size_t mid = (lo + hi) / 2;
		if (c->index[mid].start <= start)
			lo = mid;
		else
			hi = mid;
	}
	for (size_t k = lo; count > 0 && k < c->nindex; k++) {
		const hpu_ckpt_index *x = &c->index[k];
		uint64_t skip = start - x->start, n = x->count - skip;
		if (n > count)
			n = count;
		int fd = file_fd(c, x->file, err, errlen);
		if (fd < 0)
			return -1;
		const hpu_ckpt_file *f = &c->files[x->file];
		off_t at = (off_t)(((uint64_t)section * f->elems + x->at + skip) * 4);
		if (pread_all(fd, dst, n * 4, at) < 0)
			return say(err, errlen, "checkpoint shard %s/%s: %s", c->dir, f->name,
				   errno == EIO ? "shorter than the manifest says" : strerror(errno));
		c->bytes_read += n * 4;
		dst += n;
		start += n;
		count -= n;
	}
	return 0;
}

int hpu__ckpt_read_buffers(hpu_ckpt *c, uint64_t start, uint64_t count, float *dst, char *err,
			   size_t errlen)
{
	if (start > c->buffer_numel || count > c->buffer_numel - start)
		return say(err, errlen,
			   "checkpoint %s: buffer floats %llu-%llu are not there (it holds %llu)",
			   c->dir, (unsigned long long)start, (unsigned long long)(start + count),
			   (unsigned long long)c->buffer_numel);
	if (!count)
		return 0;
	int fd = file_fd(c, c->nfiles, err, errlen);
	if (fd < 0)
		return -1;
	if (pread_all(fd, dst, count * 4, (off_t)(start * 4)) < 0)
		return say(err, errlen, "checkpoint buffers file %s/%s: %s", c->dir,
			   c->buffer_file.name,
			   errno == EIO ? "shorter than the manifest says" : strerror(errno));
	c->bytes_read += count * 4;
	return 0;
}

/* ---- writing ---- */

enum { WBUF = 4 << 20 };

int hpu__ckpt_writer_open(hpu_ckpt_writer *w, const char *path, char *err, size_t errlen)
{
	memset(w, 0, sizeof *w);
	if (!(w->buf = malloc(WBUF)) || !(w->md = EVP_MD_CTX_new()) ||
	    EVP_DigestInit_ex(w->md, EVP_sha256(), NULL) != 1) {
		EVP_MD_CTX_free(w->md);
		free(w->buf);
		return say(err, errlen, "out of memory");
	}
	if (hpu__outfile_open(&w->out, path, 0644) < 0) {
		hpu__outfile_error(&w->out, "open", err, errlen);
		hpu__ckpt_writer_abort(w);
		return -1;
	}
	return 0;
}

static int flush(hpu_ckpt_writer *w, char *err, size_t errlen)
{
	if (hpu__write_all(w->out.fd, w->buf, w->fill) < 0)
		return hpu__outfile_error(&w->out, "write", err, errlen);
	w->fill = 0;
	return 0;
}

int hpu__ckpt_writer_put(hpu_ckpt_writer *w, const void *p, size_t n, char *err, size_t errlen)
{
	const unsigned char *s = p;
	EVP_DigestUpdate(w->md, s, n);
	w->bytes += n;
	while (n) {
		size_t k = WBUF - w->fill < n ? WBUF - w->fill : n;
		memcpy(w->buf + w->fill, s, k);
		w->fill += k;
		s += k;
		n -= k;
		if (w->fill == WBUF && flush(w, err, errlen) < 0)
			return -1;
	}
	return 0;
}

int hpu__ckpt_writer_commit(hpu_ckpt_writer *w, char *sha256, char *err, size_t errlen)
{
	const char *step;
	if (flush(w, err, errlen) < 0)
		return -1;
	if (hpu__outfile_commit(&w->out, &step) < 0)
		return hpu__outfile_error(&w->out, step, err, errlen);
	unsigned char d[32];
	unsigned int dl = 0;
	EVP_DigestFinal_ex(w->md, d, &dl);
	if (sha256)
		hpu__hex(sha256, d, sizeof d);
	hpu__ckpt_writer_abort(w); /* frees; nothing left to remove */
	return 0;
}

void hpu__ckpt_writer_abort(hpu_ckpt_writer *w)
{
	if (w->buf) /* else closed already, or never opened */
		hpu__outfile_abort(&w->out);
	EVP_MD_CTX_free(w->md);
	w->md = NULL;
	free(w->buf);
	w->buf = NULL;
}

int hpu__ckpt_rmtree(const char *path)
{
	DIR *d = opendir(path);
	if (!d)
		return errno == ENOENT ? 0 : -1;
	struct dirent *e;
	char p[4400];
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof p, "%s/%s", path, e->d_name);
		unlink(p);
	}
	closedir(d);
	return rmdir(path);
}

int hpu__ckpt_partial_lock(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/* ".step-<digits>.partial", the name a save works under */
static int partial_name(const char *name)
{
	const char *p = name + 6;
	if (strncmp(name, ".step-", 6) != 0 || !isdigit((unsigned char)*p))
		return 0;
	while (isdigit((unsigned char)*p))
		p++;
	return strcmp(p, ".partial") == 0;
}

/* Removes partial directory path if it is one of ours that nobody holds
 * (the lock taken on the directory lstat saw, then kept while removing).
 * Returns 1 when removed. */
static int clean_one(const char *path)
{
	struct stat st, fst;
	if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
		return 0;
	int fd = hpu__ckpt_partial_lock(path);
	if (fd < 0)
		return 0; /* held by a live save, or gone */
	int same = fstat(fd, &fst) == 0 && fst.st_dev == st.st_dev && fst.st_ino == st.st_ino;
	int gone = same && hpu__ckpt_rmtree(path) == 0;
	close(fd);
	return gone;
}

int hpu__ckpt_clean_partials(const char *root, void (*said)(const char *path, void *arg),
			     void *arg)
{
	DIR *d = opendir(root);
	if (!d)
		return 0;
	struct dirent *e;
	char path[4400];
	int n = 0;
	while ((e = readdir(d))) {
		if (!partial_name(e->d_name))
			continue;
		snprintf(path, sizeof path, "%s/%s", root, e->d_name);
		if (clean_one(path)) {
			n++;
			if (said)
				said(path, arg);
		}
	}
	closedir(d);
	return n;
}

/* ---- the root ---- */

void hpu__ckpt_step_name(long step, char *buf, size_t n)
{
	snprintf(buf, n, "step-%08ld", step);
}

void hpu__ckpt_shard_name(int rank, int world, char *buf, size_t n)
{
	snprintf(buf, n, "rank-%05d-of-%05d.bin", rank, world);
}

/* The step of a name "step-N" (digits only), or -1. */
static long step_of(const char *name)
{
	if (strncmp(name, "step-", 5) != 0 || !isdigit((unsigned char)name[5]))
		return -1; /* strtol would skip spaces and take signs */
	long v;
	return hpu__parse_long(name + 5, 0, LONG_MAX, &v) ? -1 : v;
}

void hpu__ckpt_latest(const char *root, char *out, size_t n)
{
	char path[4200], *text = NULL;
	size_t len;
	out[0] = '\0';
	snprintf(path, sizeof path, "%s/%s", root, HPU_CKPT_LATEST);
	if (hpu__read_file(path, &text, &len))
		return;
	while (len && (text[len - 1] == '\n' || text[len - 1] == ' ' || text[len - 1] == '\r'))
		text[--len] = '\0';
	snprintf(out, n, "%s", text);
	free(text);
}

/* The step `latest` names, or "" when absent or not a step. */
static void read_latest(const char *root, char *out, size_t n)
{
	hpu__ckpt_latest(root, out, n);
	if (step_of(out) < 0)
		out[0] = '\0';
}

typedef struct named {
	long step;
	char *name;
} named;

static int by_step_desc(const void *a, const void *b)
{
	const named *x = a, *y = b;
	return x->step > y->step ? -1 : x->step < y->step;
}

void hpu__ckpt_free_names(char **names)
{
	if (!names)
		return;
	for (char **p = names; *p; p++)
		free(*p);
	free(names);
}

int hpu__ckpt_candidates(const char *root, char ***names, char *err, size_t errlen)
{
	*names = NULL;
	char latest[256];
	read_latest(root, latest, sizeof latest);
	DIR *d = opendir(root);
	if (!d && errno != ENOENT)
		return say(err, errlen, "cannot read checkpoint directory %s: %s", root,
			   strerror(errno));
	named *v = NULL;
	int n = 0, cap = 0;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		long st = step_of(e->d_name);
		if (st < 0)
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			named *g = realloc(v, (size_t)cap * sizeof *v);
			if (!g)
				break;
			v = g;
		}
		v[n].step = strcmp(e->d_name, latest) == 0 ? -2 : st; /* latest first */
		if (!(v[n].name = strdup(e->d_name)))
			break;
		n++;
	}
	if (d)
		closedir(d);
	for (int i = 0; i < n; i++)
		if (v[i].step == -2)
			v[i].step = 0x7fffffffffffffffL;
	if (n > 1) /* v is NULL when there is none */
		qsort(v, (size_t)n, sizeof *v, by_step_desc);
	char **out = calloc((size_t)n + 1, sizeof *out);
	if (!out) {
		for (int i = 0; i < n; i++)
			free(v[i].name);
		free(v);
		return say(err, errlen, "out of memory");
	}
	for (int i = 0; i < n; i++)
		out[i] = v[i].name;
	free(v);
	*names = out;
	return n;
}

int hpu__ckpt_publish(const char *root, const char *partial, const char *name, int keep,
		      char *err, size_t errlen)
{
	char from[4200], to[4200], lpath[4200], line[300];
	snprintf(from, sizeof from, "%s/%s", root, partial);
	snprintf(to, sizeof to, "%s/%s", root, name);
	if (hpu__fsync_dir(from, err, errlen) < 0)
		return -1;
	hpu__ckpt_rmtree(to); /* a checkpoint of the same step from before */
	if (rename(from, to) < 0)
		return say(err, errlen, "cannot rename %s to %s: %s", from, to, strerror(errno));
	if (hpu__fsync_dir(root, err, errlen) < 0)
		return -1;
	snprintf(lpath, sizeof lpath, "%s/%s", root, HPU_CKPT_LATEST);
	int n = snprintf(line, sizeof line, "%s\n", name);
	if (hpu__write_atomic(lpath, line, (size_t)n, err, errlen) < 0 ||
	    hpu__fsync_dir(root, err, errlen) < 0)
		return -1;
	if (keep <= 0)
		return 0;
	char **names;
	int k = hpu__ckpt_candidates(root, &names, err, errlen);
	if (k < 0)
		return -1;
	for (int i = keep; i < k; i++) { /* names[0] is the new one */
		struct stat st;
		snprintf(to, sizeof to, "%s/%s", root, names[i]);
		if (lstat(to, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid())
			hpu__ckpt_rmtree(to); /* never another uid's, nor through a link */
	}
	hpu__ckpt_free_names(names);
	return 0;
}

cJSON *hpu__ckpt_file_json(const hpu_ckpt_file *f)
{
	cJSON *j = cJSON_CreateObject(), *segs = cJSON_CreateArray();
	cJSON_AddStringToObject(j, "name", f->name);
	cJSON_AddNumberToObject(j, "bytes", (double)f->bytes);
	cJSON_AddStringToObject(j, "sha256", f->sha256);
	for (size_t k = 0; k < f->nseg; k++) {
		cJSON *s = cJSON_CreateArray();
		cJSON_AddItemToArray(s, cJSON_CreateNumber((double)f->seg[k].start));
		cJSON_AddItemToArray(s, cJSON_CreateNumber((double)f->seg[k].count));
		cJSON_AddItemToArray(segs, s);
	}
	cJSON_AddItemToObject(j, "segments", segs);
	return j;
}

cJSON *hpu__ckpt_buffers_json(const hpu_ckpt_file *f, const hpu_ckpt_buffer *v, int n)
{
	cJSON *j = cJSON_CreateObject(), *arr = cJSON_CreateArray();
	uint64_t numel = 0;
	cJSON_AddStringToObject(j, "file", f->name);
	cJSON_AddNumberToObject(j, "bytes", (double)f->bytes);
	cJSON_AddStringToObject(j, "sha256", f->sha256);
	for (int i = 0; i < n; i++) {
		cJSON *t = cJSON_CreateObject(), *shape = cJSON_CreateArray();
		cJSON_AddStringToObject(t, "name", v[i].name);
		for (int d = 0; d < v[i].ndim; d++)
			cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)v[i].shape[d]));
		cJSON_AddItemToObject(t, "shape", shape);
		cJSON_AddStringToObject(t, "dtype", "F32");
		cJSON_AddNumberToObject(t, "offset", (double)v[i].offset);
		cJSON_AddNumberToObject(t, "numel", (double)v[i].numel);
		if (v[i].sync[0])
			cJSON_AddStringToObject(t, "sync", v[i].sync);
		cJSON_AddItemToArray(arr, t);
		numel += v[i].numel;
	}
	cJSON_AddNumberToObject(j, "numel", (double)numel);
	cJSON_AddItemToObject(j, "tensors", arr);
	return j;
}
