/* Which checkpoints survive a save: the newest ones and the best ones by
 * a validation metric (--keep-last, --keep-best). */
#include "ckpt/ckpt.h"
#include "common/fileio.h"
#include "common/num.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define say hpu__say

typedef struct cand {
	long step;
	double value; /* NAN: not validated */
	const char *name;
	int past; /* a step past the new one's: an abandoned run's (hpu__ckpt_candidates) */
} cand;

/* The value of validation.<metric> in root/name's manifest, where that
 * validation is of the checkpoint's own step (`step`, from its name);
 * else NAN. The manifest holds the run's last validation, which for a
 * checkpoint saved between validations is an earlier step's: ranked by
 * it, such a checkpoint displaced the one validated at its step. */
static double value_of(const char *root, const char *name, long step, const char *metric)
{
	char path[4200], *text = NULL;
	size_t len;
	snprintf(path, sizeof path, "%s/%s/%s", root, name, HPU_CKPT_MANIFEST);
	if (hpu__read_file(path, &text, &len))
		return NAN;
	cJSON *m = cJSON_Parse(text);
	free(text);
	const cJSON *val = cJSON_GetObjectItemCaseSensitive(m, "validation");
	double at = hpu__ckpt_num(val, "step", NAN);
	double v = at == (double)step ? hpu__ckpt_num(val, metric, NAN) : NAN;
	cJSON_Delete(m);
	return v;
}

static int newest_first(const void *a, const void *b)
{
	const cand *x = a, *y = b;
	if (x->past != y->past)
		return x->past - y->past;
	return x->step > y->step ? -1 : x->step < y->step;
}

/* x goes before y: validated before not validated; then by value;
 * equal values, the older first (a newer checkpoint must do better to
 * displace one). */
static int better(const cand *x, const cand *y, int max)
{
	if (isnan(x->value) || isnan(y->value))
		return !isnan(x->value) && isnan(y->value);
	if (x->value != y->value)
		return max ? x->value > y->value : x->value < y->value;
	return x->step < y->step;
}

/* Sorts v best first (an insertion sort: a root holds few checkpoints). */
static void best_order(cand *v, int n, int max)
{
	for (int i = 1; i < n; i++) {
		cand c = v[i];
		int j = i;
		for (; j > 0 && better(&c, &v[j - 1], max); j--)
			v[j] = v[j - 1];
		v[j] = c;
	}
}

/* The first n of v[0 .. nv) (only validated ones when `valued`), as a
 * NULL-terminated copy of their names. */
static char **names_of(const cand *v, int nv, int n, int valued)
{
	char **out = calloc((size_t)(n < nv ? n : nv) + 1, sizeof *out);
	for (int i = 0, k = 0; out && i < nv && k < n; i++) {
		if (valued && isnan(v[i].value))
			break;
		if (!(out[k++] = strdup(v[i].name))) {
			hpu__ckpt_free_names(out);
			return NULL;
		}
	}
	return out;
}

int hpu__ckpt_keep_plan(const char *root, const hpu_ckpt_keep *k, const char *name,
			double value, char ***best, char ***last, char *err, size_t errlen)
{
	char **names = NULL;
	*best = *last = NULL;
	int n = hpu__ckpt_candidates(root, &names, err, errlen), nv = 0;
	if (n < 0)
		return -1;
	cand *v = calloc((size_t)n + 1, sizeof *v);
	if (!v) {
		hpu__ckpt_free_names(names);
		return say(err, errlen, "out of memory");
	}
	long s;
	v[nv++] = (cand){hpu__parse_long(name + 5, 0, LONG_MAX, &s) ? LONG_MAX : s, value, name, 0};
	const long ns = v[0].step;
	for (int i = 0; i < n; i++) {
		char path[4200];
		struct stat st;
		snprintf(path, sizeof path, "%s/%s", root, names[i]);
		if (!strcmp(names[i], name) || lstat(path, &st) < 0 || !S_ISDIR(st.st_mode) ||
		    hpu__parse_long(names[i] + 5, 0, LONG_MAX, &s))
			continue;
		v[nv++] = (cand){s, k->best ? value_of(root, names[i], s, k->metric) : NAN,
				 names[i], s > ns};
	}
	qsort(v, (size_t)nv, sizeof *v, newest_first);
	*last = names_of(v, nv, k->last, 0);
	best_order(v, nv, k->max);
	*best = names_of(v, nv, k->best, 1);
	free(v);
	hpu__ckpt_free_names(names);
	if (!*best || !*last) {
		hpu__ckpt_free_names(*best);
		hpu__ckpt_free_names(*last);
		*best = *last = NULL;
		return say(err, errlen, "out of memory");
	}
	return 0;
}

static int named(char **list, const char *name)
{
	for (char **p = list; p && *p; p++)
		if (!strcmp(*p, name))
			return 1;
	return 0;
}

int hpu__ckpt_prune(const char *root, char **best, char **last, char *err, size_t errlen)
{
	char **names, latest[256], path[4200];
	hpu__ckpt_latest(root, latest, sizeof latest);
	int n = hpu__ckpt_candidates(root, &names, err, errlen);
	if (n < 0)
		return -1;
	for (int i = 0; i < n; i++) {
		struct stat st;
		if (named(best, names[i]) || named(last, names[i]) || !strcmp(names[i], latest))
			continue;
		snprintf(path, sizeof path, "%s/%s", root, names[i]);
		if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid())
			hpu__ckpt_discard(root, names[i]); /* never another uid's, nor
							    * through a link */
	}
	hpu__ckpt_free_names(names);
	return 0;
}
