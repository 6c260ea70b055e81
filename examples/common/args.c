/* args: see args.h. */
#include "examples/common/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ex_long_prefix(const char *s, const char **end, long *out)
{
	/* strtol alone would also take leading spaces and a '+': a
	 * number is an optional '-' and decimal digits, nothing else */
	const char *d = s + (*s == '-');
	*end = s;
	if (*d < '0' || *d > '9')
		return -1;
	char *e;
	errno = 0;
	long v = strtol(s, &e, 10);
	*end = e;
	if (errno == ERANGE)
		return -1;
	*out = v;
	return 0;
}

int ex_arg_long(hpu_builder *b, const char *name, const char *v, long lo, long hi, long *out)
{
	const char *end;
	long x;
	if (ex_long_prefix(v, &end, &x) < 0 || *end || x < lo || x > hi)
		return hpu_error(b, "%s wants a whole number in %ld..%ld, got %s", name, lo, hi, v);
	*out = x;
	return 0;
}

int ex_arg_double(hpu_builder *b, const char *name, const char *v, double lo, double hi,
		  double *out)
{
	/* strtod alone would also take leading spaces, a '+', hex ("0x1p-2"),
	 * "inf" and "nan": a number is an optional '-', decimal digits with
	 * an optional '.', and an optional exponent */
	const char *d = v + (*v == '-');
	char *end = (char *)v;
	double x = 0;
	if (((*d >= '0' && *d <= '9') || (*d == '.' && d[1] >= '0' && d[1] <= '9')) &&
	    !strpbrk(v, "xXpP"))
		x = strtod(v, &end);
	if (end == v || *end || !(x >= lo && x <= hi)) /* NaN is in no range */
		return hpu_error(b, "%s wants a number in %g..%g, got %s", name, lo, hi, v);
	*out = x == 0 ? 0.0 : x; /* -0 is 0 (it was said back as "-0") */
	return 0;
}

/* The usage list, "--a N, --b, ...", in buf. */
static const char *usage(const ex_arg *args, int n, char *buf, size_t len)
{
	size_t at = 0;
	buf[0] = 0;
	for (int k = 0; k < n && at < len; k++)
		at += (size_t)snprintf(buf + at, len - at, "%s%s%s%s", k ? ", " : "", args[k].name,
				       args[k].meta ? " " : "", args[k].meta ? args[k].meta : "");
	return buf;
}

/* The index of the table's argument named s, or n. */
static int arg_index(const ex_arg *args, int n, const char *s)
{
	int k = 0;
	while (k < n && strcmp(s, args[k].name))
		k++;
	return k;
}

int ex_args_parse(hpu_builder *b, int argc, char **argv, const ex_arg *args, int n, void *base)
{
	char list[1024];
	for (int i = 1; i < argc; i++) {
		int k = arg_index(args, n, argv[i]);
		if (k == n)
			return hpu_error(b, "unknown model argument %s (model arguments: %s)", argv[i],
					 usage(args, n, list, sizeof list));
		void *field = (char *)base + args[k].off;
		if (args[k].kind == EX_ARG_FLAG) {
			*(int *)field = 1;
			continue;
		}
		if (i + 1 >= argc)
			return hpu_error(b, "%s needs a value (%s %s)", argv[i], args[k].name,
					 args[k].meta);
		/* "--tokens --ctx 16" took "--ctx" as the file, then "16" was
		 * an unknown argument */
		if (arg_index(args, n, argv[i + 1]) < n)
			return hpu_error(b, "%s needs a value (the next argument, %s, is one of the model's "
					 "arguments)", argv[i], argv[i + 1]);
		long whole;
		if (args[k].kind == EX_ARG_STR)
			*(const char **)field = argv[i + 1];
		else if (args[k].kind == EX_ARG_INT &&
			 ex_arg_long(b, argv[i], argv[i + 1], (long)args[k].lo, (long)args[k].hi, &whole) < 0)
			return -1;
		else if (args[k].kind == EX_ARG_INT)
			*(double *)field = (double)whole;
		else if (ex_arg_double(b, argv[i], argv[i + 1], args[k].lo, args[k].hi, field) < 0)
			return -1;
		i++;
	}
	return 0;
}

/* The entry of usage list `list` ("--data DIR, --channels C1,C2,
 * --checkpoint") that names arg, and its length in *len; NULL where none
 * does. */
static const char *list_entry(const char *list, const char *arg, int *len)
{
	size_t n = strlen(arg);
	for (const char *p = list; n && (p = strstr(p, arg)); p += n) {
		int starts = p == list || (p >= list + 2 && !strncmp(p - 2, ", ", 2));
		if (starts && (p[n] == ' ' || p[n] == ',' || !p[n])) {
			const char *e = strstr(p, ", ");
			*len = e ? (int)(e - p) : (int)strlen(p);
			return p;
		}
	}
	return NULL;
}

int ex_arg_has_value(int argc, char **argv, int i, const char *list)
{
	int len;
	return i + 1 < argc && !list_entry(list, argv[i + 1], &len);
}

int ex_arg_unknown(hpu_builder *b, int argc, char **argv, int i, const char *list)
{
	const char *arg = argv[i];
	int len;
	const char *p = list_entry(list, arg, &len);
	if (p && p[strlen(arg)] == ' ') { /* "--hidden N": it takes a value */
		if (i + 1 < argc)
			return hpu_error(b, "%s needs a value (the next argument, %s, is one of the "
					 "model's arguments)", arg, argv[i + 1]);
		return hpu_error(b, "%s needs a value (%.*s)", arg, len, p);
	}
	return hpu_error(b, "unknown model argument %s (model arguments: %s)", arg, list);
}
