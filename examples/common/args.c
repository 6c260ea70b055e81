/* args: see args.h. */
#include "examples/common/args.h"

#include <errno.h>
#include <stdlib.h>

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
