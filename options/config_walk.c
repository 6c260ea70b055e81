/* config_walk: the checks of a config file's values and the walk of one
 * section's keys (config_internal.h; the sections are config_keys.c's
 * and config_keys_train.c's). Every error of a file is reported, not
 * only the first: each check appends a line and the walk goes on.
 */
#include "options/config.h"
#include "options/config_internal.h"
#include "common/num.h"

#include <assert.h>
#include <cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int hpu__cfg_ferr(struct fctx *c, const char *path, const char *fmt, ...)
{
	char what[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	return add_error(c, "%s: %s: %s", c->file, path, what);
}

/* The shortest text that reads back as x. */
const char *hpu__cfg_num_text(double x, char *buf, size_t len)
{
	snprintf(buf, len, "%.15g", x);
	if (strtod(buf, NULL) != x)
		snprintf(buf, len, "%.17g", x);
	return buf;
}

/* What a JSON value is, for "expected X, got Y". */
const char *hpu__cfg_describe(const cJSON *it, char *buf, size_t len)
{
	char num[32];
	if (cJSON_IsString(it))
		snprintf(buf, len, "a string \"%.40s%s\"", it->valuestring,
			 strlen(it->valuestring) > 40 ? "..." : "");
	else if (cJSON_IsNumber(it))
		snprintf(buf, len, "a number %s",
			 hpu__cfg_num_text(it->valuedouble, num, sizeof num));
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

int hpu__cfg_wrong_type(struct fctx *c, const char *path, const cJSON *it,
			const char *want)
{
	char got[80];
	if (cJSON_IsString(it) && strcmp(it->valuestring, "auto") == 0)
		return hpu__cfg_ferr(c, path, "\"auto\" is not supported; give %s", want);
	return hpu__cfg_ferr(c, path, "expected %s, got %s", want,
			     hpu__cfg_describe(it, got, sizeof got));
}

int hpu__cfg_want_number(struct fctx *c, const char *path, const cJSON *it,
			 double lo, double hi, int integral, double *out)
{
	char a[32], b[32], x[32];
	if (!cJSON_IsNumber(it))
		return hpu__cfg_wrong_type(c, path, it, "a number");
	double v = it->valuedouble;
	if (!isfinite(v))
		return hpu__cfg_ferr(c, path, "%s is not a finite number",
				     hpu__cfg_num_text(v, x, sizeof x));
	/* 5e8 is an integer; beyond 2^53 a double does not say which one. */
	if (integral && v != floor(v))
		return hpu__cfg_ferr(c, path, "%s is not an integer",
				     hpu__cfg_num_text(v, x, sizeof x));
	if (integral && fabs(v) > 9007199254740992.0)
		return hpu__cfg_ferr(c, path, "%s is too large to be exact in JSON",
				     hpu__cfg_num_text(v, x, sizeof x));
	if (v < lo || v > hi)
		return hpu__cfg_ferr(c, path, "%s is out of range %s..%s",
				     hpu__cfg_num_text(v, x, sizeof x), hpu__cfg_num_text(lo, a, sizeof a),
				     hpu__cfg_num_text(hi, b, sizeof b));
	*out = v;
	return 0;
}

int hpu__cfg_want_bool(struct fctx *c, const char *path, const cJSON *it,
		       int *out)
{
	if (!cJSON_IsBool(it))
		return hpu__cfg_wrong_type(c, path, it, "true or false");
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

int hpu__cfg_want_string(struct fctx *c, const char *path, const cJSON *it)
{
	if (!cJSON_IsString(it))
		return hpu__cfg_wrong_type(c, path, it, "a string");
	if (has_control(it->valuestring))
		return hpu__cfg_ferr(c, path, "the string holds a NUL (\\u0000) or another control character");
	return 0;
}

/* Whether keys a and b ("hputrain.eval_every") are in one section. */
static int same_section(const char *a, const char *b)
{
	const char *da = strrchr(a, '.'), *db = strrchr(b, '.');
	size_t na = da ? (size_t)(da - a) : 0, nb = db ? (size_t)(db - b) : 0;
	return na == nb && !strncmp(a, b, na);
}

/* Sets option p from text (already checked) unless a flag set it. */
int hpu__cfg_put(struct fctx *c, const char *path, const struct hpu__opt *p,
		 const char *text)
{
	int s = hpu__opt_slot(p);
	if (c->o->from[s] == HPU_FROM_FLAG)
		return 0;
	/* another key of the same section named it too: two names of one
	 * option. (Across sections, one key's precedence over another is
	 * DeepSpeed's or ours, and documented: hputrain.strategy over
	 * zero_optimization.stage, a scheduler's warmup_max_lr over the
	 * optimizer's lr; two precisions have their own check.) */
	char was[160], now[160];
	int again = c->put[s] && !c->over && same_section(c->o->file_key[s], path);
	if (again)
		hpu__opt_text(c->o, p, was, sizeof was);
	if (p->kind == K_FLAG || p->kind == K_NOFLAG) {
		/* JSON keys say the positive: "overlap_comm", "eval" */
		*(int *)((char *)c->o + p->off) = text[0] == '1';
	} else if (hpu__opt_set_value(c->o, p, text) < 0) {
		char buf[160];
		return hpu__cfg_ferr(c, path, "bad value \"%.60s\": expected %s", text,
				     hpu__opt_expected(p, buf, sizeof buf));
	}
	/* two names of one option (hputrain.eval_every and Lightning's
	 * val_check_interval, stage3_prefetch_bucket_size and
	 * prefetch_bucket_size) with two values: the later key's was taken
	 * in silence */
	if (again && strcmp(was, hpu__opt_text(c->o, p, now, sizeof now)))
		return hpu__cfg_ferr(c, path, "%s for --%s, but %s gave %s: both keys set --%s; give one",
				     now, p->name, c->o->file_key[s], was, p->name);
	c->put[s] = 1;
	c->o->from[s] = HPU_FROM_FILE;
	c->o->implied[s] = 0; /* a key of the file (ds_default marks its own) */
	snprintf(c->o->file_key[s], sizeof c->o->file_key[s], "%s", path);
	return 0;
}

/* A key that sets option `name`, checked by the option's kind. */
int hpu__cfg_file_opt(struct fctx *c, const char *path, const cJSON *it,
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
		if (hpu__cfg_want_number(c, path, it, p->lo, p->hi, 1, &v))
			return -1;
		snprintf(text, sizeof text, "%.0f", v);
		return hpu__cfg_put(c, path, p, text);
	case K_DOUBLE:
		if (hpu__cfg_want_number(c, path, it, p->lo, p->hi, 0, &v))
			return -1;
		return hpu__cfg_put(c, path, p, hpu__cfg_num_text(v, text, sizeof text));
	case K_FLAG:
	case K_NOFLAG:
		if (hpu__cfg_want_bool(c, path, it, &b))
			return -1;
		return hpu__cfg_put(c, path, p, b ? "1" : "0");
	case K_CHOICE:
		if (hpu__cfg_want_string(c, path, it))
			return -1;
		k = hpu__choice(p, it->valuestring, 1);
		if (k < 0)
			return hpu__cfg_ferr(c, path, "\"%.40s\" is not %s",
					     it->valuestring,
					     hpu__opt_expected(p, buf, sizeof buf));
		return hpu__cfg_put(c, path, p, p->names[k]);
	case K_STR:
		if (hpu__cfg_want_string(c, path, it))
			return -1;
		if (!*it->valuestring || strlen(it->valuestring) >= sizeof c->o->metrics)
			return hpu__cfg_ferr(c, path, "expected a non-empty file name shorter than %zu bytes",
					     sizeof c->o->metrics);
		return hpu__cfg_put(c, path, p, it->valuestring);
	case K_SIZE:
		if (cJSON_IsNumber(it)) {
			if (hpu__cfg_want_number(c, path, it, 1, 9007199254740992.0, 1, &v))
				return -1;
			snprintf(text, sizeof text, "%.0f", v);
			return hpu__cfg_put(c, path, p, text);
		}
		if (!cJSON_IsString(it))
			return hpu__cfg_wrong_type(c, path, it, "a number of bytes or a size string");
		if (hpu__parse_size(it->valuestring, &u) || u == 0)
			return hpu__cfg_ferr(c, path, "\"%.40s\" is not %s",
					     it->valuestring,
					     hpu__opt_expected(p, buf, sizeof buf));
		return hpu__cfg_put(c, path, p, it->valuestring);
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
	/* DeepSpeed's older samples' optimizer.params.max_grad_norm, which
	 * DeepSpeed itself refuses naming its successor */
	if (!strcmp(path, "optimizer.params.max_grad_norm"))
		return add_error(c, "unknown key '%s' in %s (DeepSpeed's older name: give "
				    "\"gradient_clipping\" at the file's top level, or --clip-grad-norm)",
				 path, c->file);
	if (best)
		return add_error(c, "unknown key '%s' in %s (did you mean '%s'?)",
				 path, c->file, best);
	return add_error(c, "unknown key '%s' in %s", path, c->file);
}

/* A key that changes nothing here, for the one warning. */
void hpu__cfg_note_ignored(struct fctx *c, const char *path, const char *why)
{
	char *l = c->o->cfg_ignored;
	size_t at = strlen(l), room = sizeof c->o->cfg_ignored - at;
	int n = snprintf(l + at, room, "%s\t%s\n", path, why);
	if (n < 0 || (size_t)n >= room)
		l[at] = '\0'; /* the list is full: the key goes unnamed */
}

/* An "auto" value: the option(s) in the given slots keep what flags and
 * defaults give them, named in the one note. */
void hpu__cfg_note_auto(struct fctx *c, const char *path, int slot, int slot2)
{
	hpu_train_opts *o = c->o;
	if (o->ncfg_auto == HPU_CFG_AUTOS)
		return;
	struct hpu_cfg_auto *a = &o->cfg_auto[o->ncfg_auto++];
	snprintf(a->key, sizeof a->key, "%.79s", path); /* key paths are short */
	a->slot[0] = (short)slot;
	a->slot[1] = (short)slot2;
}

int hpu__cfg_is_auto(const cJSON *it)
{
	return cJSON_IsString(it) && strcmp(it->valuestring, "auto") == 0;
}

/* Whether option p can take "auto" (a number, size, choice or switch:
 * a string option may mean "auto" itself, as resume does, and so may a
 * choice that has it: save_params_format). */
static int takes_auto(const struct hpu__opt *p)
{
	for (int i = 0; p->kind == K_CHOICE && i < p->nnames; i++)
		if (!strcmp(p->names[i], "auto"))
			return 0;
	return p->kind != K_STR && p->kind != K_OPTSTR;
}


/* Checks every key of object obj (at prefix) against keys, then applies
 * them in the table's order; an error is counted and the walk goes on,
 * so that one run names every bad key. type/type_name: the optimizer or
 * scheduler type the keys must belong to (fkey.only). */
int hpu__cfg_walk(struct fctx *c, const cJSON *obj, const char *prefix,
		  const struct fkey *keys, size_t n, unsigned type,
		  const char *type_name, int mode)
{
	char path[256], hint[160];
	int dashes = mode & W_DASHES, nerr = c->nerr;
	if (!cJSON_IsObject(obj))
		return hpu__cfg_wrong_type(c, prefix, obj, "an object");
	unsigned char *twice = repeats(obj, dashes);
	if (!twice)
		return add_error(c, "out of memory reading %s", c->file);
	size_t at = 0;
	for (const cJSON *it = obj->child; it; it = it->next, at++) {
		snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "",
			 it->string);
		if (has_control(it->string)) {
			hpu__cfg_ferr(c, path, "the key holds a NUL (\\u0000) or another control character");
			continue;
		}
		if (twice[at]) {
			hpu__cfg_ferr(c, path, "given twice");
			continue;
		}
		const struct fkey *k = lookup(keys, n, it->string, dashes);
		/* one of our options, misplaced, before a near key's "did
		 * you mean" (eps is two edits from fp8) */
		const char *sets = !k && (mode & W_LENIENT) && c->hint
					   ? c->hint(it->string, hint, sizeof hint)
					   : NULL;
		const char *best = k || sets ? NULL : closest(it->string, keys, n);
		if (sets)
			hpu__cfg_note_ignored(c, path, sets);
		else if (!k && !best && (mode & W_LENIENT))
			hpu__cfg_note_ignored(c, path, "not a key hputrain knows");
		else if (!k)
			unknown_key(c, path, best);
		else if (k->only && !(k->only & type))
			hpu__cfg_ferr(c, path, "%s takes no '%s'", type_name, it->string);
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
			hpu__cfg_note_ignored(c, path, k->why);
		else if (o && hpu__cfg_is_auto(it) && takes_auto(o))
			hpu__cfg_note_auto(c, path, hpu__opt_slot(o), -1);
		else if (o)
			hpu__cfg_file_opt(c, path, it, k->opt);
		else
			k->fn(c, path, it);
	}
	return c->nerr > nerr ? -1 : 0;
}
