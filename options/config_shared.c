/* config_shared: what the option table's flags (HPU__OPT_*, see
 * config_internal.h) say beyond a value: which options every rank of a job
 * must share (hpu__opts_shared_text, hpu__opts_shared_diff) and which name
 * files (hpu__opts_is_path, hpu__opts_abs_path, hpu__opts_file_path).
 */
#include "options/config.h"
#include "options/config_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A value as the ranks compare it: numbers exactly (a double in the
 * fewest digits that read back as it), flags as on or off (whether the
 * flag named is in effect), files by whether one is given. */
static const char *shared_value(const hpu_train_opts *o, const struct hpu__opt *p, char *buf,
				size_t len)
{
	const char *field = (const char *)o + p->off;
	if (p->how & HPU__OPT_GIVEN) {
		if (!field[0])
			return "not given";
		if ((p->how & HPU__OPT_AUTO) && !strcmp(field, "auto"))
			return "auto";
		return "given";
	}
	switch (p->kind) {
	case K_FLAG:
		return *(const int *)field ? "on" : "off";
	case K_NOFLAG:
		return *(const int *)field ? "off" : "on";
	case K_DOUBLE: {
		double x = *(const double *)field;
		snprintf(buf, len, "%.15g", x);
		if (strtod(buf, NULL) != x)
			snprintf(buf, len, "%.17g", x);
		return buf;
	}
	default:
		return hpu__opt_text(o, p, buf, len);
	}
}

int hpu__opts_shared_text(const hpu_train_opts *o, char *buf, size_t len)
{
	size_t at = 0;
	const struct hpu__opt *p;
	char v[600];
	buf[0] = 0;
	for (int i = 0; (p = hpu__opt_at(i)); i++) {
		/* an alias (--bucket-cap-mb) is its field's first option */
		if (hpu__opt_slot(p) != i || (p->how & HPU__OPT_LOCAL))
			continue;
		int n = snprintf(buf + at, len - at, "%s=%s\n", p->name,
				 shared_value(o, p, v, sizeof v));
		if (n < 0 || (size_t)n >= len - at)
			return -1;
		at += (size_t)n;
	}
	return (int)at;
}

/* The value of option `name` in a shared text, and its length in *n; NULL
 * when the text has no such line. */
static const char *value_in(const char *text, const char *name, size_t nlen, size_t *n)
{
	for (const char *l = text; *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != 0)) {
		if (!strncmp(l, name, nlen) && l[nlen] == '=') {
			*n = strcspn(l + nlen + 1, "\n");
			return l + nlen + 1;
		}
	}
	return NULL;
}

/* Appends "PREFIXname (a vs b)" to out, after ", " unless it is the first. */
static void add_diff(char *out, size_t len, size_t *at, const char *prefix, const char *name,
		     size_t nlen, const char *a, size_t alen, const char *b, size_t blen)
{
	if (*at >= len)
		return;
	int n = snprintf(out + *at, len - *at, "%s%s%.*s (%.*s vs %.*s)", *at ? ", " : "", prefix,
			 (int)nlen, name, (int)alen, a, (int)blen, b);
	if (n > 0)
		*at = *at + (size_t)n < len ? *at + (size_t)n : len;
}

int hpu__opts_shared_diff(const char *mine, const char *ref, char *out, size_t len)
{
	return hpu__lines_diff(mine, ref, "--", out, len);
}

int hpu__lines_diff(const char *mine, const char *ref, const char *prefix, char *out, size_t len)
{
	size_t at = 0;
	int count = 0;
	out[0] = 0;
	/* the options of mine in its order, then those only ref has (another
	 * version of hpu-worker) */
	for (int pass = 0; pass < 2; pass++) {
		const char *text = pass ? ref : mine, *other = pass ? mine : ref;
		for (const char *l = text; *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != 0)) {
			size_t ll = strcspn(l, "\n"), nlen = strcspn(l, "="), vlen = 0, olen = 0;
			if (nlen >= ll)
				continue;
			const char *v = l + nlen + 1, *ov = value_in(other, l, nlen, &olen);
			vlen = ll - nlen - 1;
			if (ov && olen == vlen && !strncmp(v, ov, vlen))
				continue;
			if (pass == 0)
				add_diff(out, len, &at, prefix, l, nlen, v, vlen, ov ? ov : "none", ov ? olen : 4);
			else if (!ov)
				add_diff(out, len, &at, prefix, l, nlen, "none", 4, v, vlen);
			else
				continue;
			count++;
		}
	}
	return count;
}

int hpu__opts_is_path(const char *name)
{
	const struct hpu__opt *p = hpu__opt_find(name);
	return p && (p->how & HPU__OPT_PATH);
}

int hpu__opts_abs_path(const char *name, const char *value, const char *cwd, char **out)
{
	const struct hpu__opt *p = hpu__opt_find(name);
	*out = NULL;
	if (!p || !(p->how & HPU__OPT_PATH))
		return 0;
	if (!value)
		value = p->dflt; /* --profile alone: "." */
	if (!value || !value[0] || value[0] == '/' ||
	    ((p->how & HPU__OPT_AUTO) && !strcmp(value, "auto")))
		return 0;
	size_t n = strlen(cwd) + 1 + strlen(value) + 1;
	if (!(*out = malloc(n)))
		return -1;
	if (!strcmp(value, ".")) /* the directory itself */
		snprintf(*out, n, "%s", cwd);
	else
		snprintf(*out, n, "%s%s%s", cwd, cwd[0] && cwd[strlen(cwd) - 1] == '/' ? "" : "/",
			 value);
	if (strlen(*out) >= sizeof ((hpu_train_opts *)0)->metrics) {
		free(*out);
		*out = NULL;
		return -2;
	}
	return 1;
}

const char *hpu__opts_file_path(const hpu_train_opts *o, int k, const char **value)
{
	const struct hpu__opt *p;
	for (int i = 0, seen = 0; (p = hpu__opt_at(i)); i++) {
		if (!(p->how & HPU__OPT_PATH) || hpu__opt_slot(p) != i || p->kind == K_CONFIG ||
		    o->from[i] != HPU_FROM_FILE)
			continue;
		if (seen++ == k) {
			*value = (const char *)o + p->off;
			return p->name;
		}
	}
	return NULL;
}
