/* args: see args.h. */
#include "examples/common/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ex_long_prefix(const char *s, const char **end, long *out)
{
	char *e;
	errno = 0;
	long v = strtol(s, &e, 10);
	*end = e;
	if (e == s || errno == ERANGE)
		return -1;
	*out = v;
	return 0;
}

int ex_arg_long(hpu_builder *b, const char *name, const char *v, long lo, long hi, long *out)
{
	const char *end;
	long x;
	if (ex_long_prefix(v, &end, &x) < 0 || *end || x < lo || x > hi)
		return hpu_error(b, "%s wants a number in %ld..%ld, got %s", name, lo, hi, v);
	*out = x;
	return 0;
}

int ex_arg_double(hpu_builder *b, const char *name, const char *v, double lo, double hi,
		  double *out)
{
	char *end;
	double x = strtod(v, &end);
	if (end == v || *end || !(x >= lo && x <= hi)) /* NaN is in no range */
		return hpu_error(b, "%s wants a number in %g..%g, got %s", name, lo, hi, v);
	*out = x;
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

int ex_args_parse(hpu_builder *b, int argc, char **argv, const ex_arg *args, int n, void *base)
{
	char list[1024];
	for (int i = 1; i < argc; i++) {
		int k = 0;
		while (k < n && strcmp(argv[i], args[k].name))
			k++;
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
		if (args[k].kind == EX_ARG_STR)
			*(const char **)field = argv[++i];
		else if (ex_arg_double(b, argv[i], argv[i + 1], args[k].lo, args[k].hi, field) < 0)
			return -1;
		else if (args[k].kind == EX_ARG_INT && *(double *)field != (double)(long long)*(double *)field)
			return hpu_error(b, "%s wants a whole number in %g..%g, got %s", argv[i],
					 args[k].lo, args[k].hi, argv[i + 1]);
		else
			i++;
	}
	return 0;
}

int ex_arg_unknown(hpu_builder *b, const char *arg, const char *list)
{
	size_t n = strlen(arg);
	for (const char *p = list; n && (p = strstr(p, arg)); p += n) {
		int starts = p == list || p[-1] == ' ';
		if (starts && p[n] == ' ') { /* "--hidden N": it takes a value */
			const char *e = strstr(p, ", "); /* "--channels C1,C2, ..." */
			int m = e ? (int)(e - p) : (int)strlen(p);
			return hpu_error(b, "%s needs a value (%.*s)", arg, m, p);
		}
	}
	return hpu_error(b, "unknown model argument %s (model arguments: %s)", arg, list);
}
