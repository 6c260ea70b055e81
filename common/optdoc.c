/* optdoc: see optdoc.h. */
#include "common/optdoc.h"

#include <string.h>

enum { WIDTH = 79, LEFT_MAX = 160 };

int hpu__optdoc_format(const char *name)
{
	static const char *const names[HPU_DOC_FORMATS] = {"help", "scdoc", "markdown"};
	for (int i = 0; i < HPU_DOC_FORMATS; i++)
		if (name && !strcmp(name, names[i]))
			return i;
	return -1;
}

static int is_end(const hpu_optspec *s)
{
	return !s->name && !s->short_name;
}

/* For s without help: the option documented above it, nearest first,
 * of which it is another name; NULL if none (s is hidden). */
static const hpu_optspec *alias_of(const hpu_optspec *specs, const hpu_optspec *s)
{
	for (const hpu_optspec *t = s; t-- > specs;)
		if (t->id == s->id && t->help)
			return t;
	return NULL;
}

/* s written with special characters escaped (a backslash before each
 * one of chars). */
static void put_escaped(FILE *f, const char *s, const char *chars)
{
	for (; *s; s++) {
		if (strchr(chars, *s))
			fputc('\\', f);
		fputc(*s, f);
	}
}

/* One name of s: "-x, --name", "--name" or "-x"; for keys, "name".
 * lead and trail wrap each (scdoc's '*', markdown's '`'). */
static void put_names(FILE *f, const hpu_optspec *s, int keys, const char *lead,
		      const char *trail)
{
	if (keys) {
		fprintf(f, "%s%s%s", lead, s->name, trail);
		return;
	}
	if (s->short_name)
		fprintf(f, "%s-%c%s%s", lead, s->short_name, trail, s->name ? ", " : "");
	if (s->name)
		fprintf(f, "%s--%s%s", lead, s->name, trail);
}

/* " ARG", " [ARG]" or, for keys, " = ARG"; for a flag, what follows it
 * if it names that (--exec PROGRAM ...), else nothing. */
static void put_arg(FILE *f, const hpu_optspec *s, int keys, const char *lead,
		    const char *trail)
{
	const char *arg = s->arg ? s->arg : "VALUE";
	if (keys)
		fprintf(f, " = %s%s%s", lead, arg, trail);
	else if (s->value == HPU_OPT_VALUE)
		fprintf(f, " %s%s%s", lead, arg, trail);
	else if (s->value == HPU_OPT_OPTIONAL)
		fprintf(f, " [%s%s%s]", lead, arg, trail);
	else if (s->arg)
		fprintf(f, " %s%s%s", lead, arg, trail);
}

/* The names of s and of its other names below it, then its value; in
 * scdoc the names bold, the value underlined. */
static void put_left(FILE *f, const hpu_optspec *specs, const hpu_optspec *s, int keys,
		     int scdoc)
{
	const char *bold = scdoc ? "*" : "", *under = scdoc ? "_" : "";
	put_names(f, s, keys, bold, bold);
	for (const hpu_optspec *t = s + 1; !is_end(t); t++)
		if (!t->help && alias_of(specs, t) == s) {
			fputs(", ", f);
			put_names(f, t, keys, bold, bold);
		}
	put_arg(f, s, keys, under, under);
}

/* text from column at, its words wrapped at WIDTH, continued at col. */
static void put_wrapped(FILE *f, const char *text, int at, int col)
{
	while (*text) {
		size_t n = strcspn(text, " ");
		if (at > col && at + 1 + (int)n > WIDTH) {
			fprintf(f, "\n%*s", col, "");
			at = col;
		} else if (at > col) {
			fputc(' ', f);
			at++;
		}
		fwrite(text, 1, n, f);
		at += (int)n;
		text += n;
		text += strspn(text, " ");
	}
	fputc('\n', f);
}

static void help_entry(FILE *f, const hpu_optspec *specs, const hpu_optspec *s, int keys,
		       int col)
{
	char left[LEFT_MAX], text[1024];
	FILE *m = fmemopen(left, sizeof left, "w");
	if (!m)
		return;
	put_left(m, specs, s, keys, 0);
	fputc(0, m);
	fclose(m);
	left[sizeof left - 1] = 0;
	snprintf(text, sizeof text, "%s%s%s%s", s->help, s->env ? " [" : "",
		 s->env ? s->env : "", s->env ? "]" : "");
	int at = fprintf(f, "  %s", left);
	if (at + 1 > col) {
		fputc('\n', f);
		at = 0;
	}
	fprintf(f, "%*s", col - at, "");
	/* at col: the first word always goes on this line */
	put_wrapped(f, text, col, col);
}

static void scdoc_entry(FILE *f, const hpu_optspec *specs, const hpu_optspec *s, int keys)
{
	put_left(f, specs, s, keys, 1);
	fputs("\n\t", f);
	if (s->help[0] == '-')
		fputc('\\', f); /* not a list entry */
	put_escaped(f, s->help, "\\*_");
	if (s->env) {
		fputs("\n\n\tEnvironment: *", f);
		put_escaped(f, s->env, "\\*_");
		fputc('*', f);
	}
	fputs("\n\n", f);
}

static void markdown_entry(FILE *f, const hpu_optspec *specs, const hpu_optspec *s, int keys)
{
	fputs("- `", f);
	put_left(f, specs, s, keys, 0);
	fputs("`: ", f);
	put_escaped(f, s->help, "\\*_<`");
	if (s->env)
		fprintf(f, ". Environment: `%s`", s->env);
	fputc('\n', f);
}

void hpu__optdoc_heading(FILE *f, const char *title, int how)
{
	switch (how & ~HPU_DOC_KEYS) {
	case HPU_DOC_HELP: fprintf(f, "\n%s:\n", title); break;
	case HPU_DOC_SCDOC:
		fputs("## ", f);
		put_escaped(f, title, "\\*_");
		fputs("\n\n", f);
		break;
	default:
		fputs("\n## ", f);
		put_escaped(f, title, "\\*_<`");
		fputs("\n\n", f);
		break;
	}
}

void hpu__optdoc(FILE *f, const hpu_optspec *specs, int how, int col)
{
	int keys = (how & HPU_DOC_KEYS) != 0;
	for (const hpu_optspec *s = specs; !is_end(s); s++) {
		if (s->section)
			hpu__optdoc_heading(f, s->section, how);
		if (!s->help)
			continue; /* another name (printed with its option), or hidden */
		switch (how & ~HPU_DOC_KEYS) {
		case HPU_DOC_HELP: help_entry(f, specs, s, keys, col); break;
		case HPU_DOC_SCDOC: scdoc_entry(f, specs, s, keys); break;
		default: markdown_entry(f, specs, s, keys); break;
		}
	}
}
