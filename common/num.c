/* num: see num.h. Every parser here wraps one strto* call: errno is
 * cleared for it and restored after, so a caller's errno survives. */
#include "common/num.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "strtoull reads a uint64_t");

int hpu__parse_long(const char *s, long lo, long hi, long *out)
{
	if (!s)
		return HPU_NUM_INVALID;
	int saved = errno, r = HPU_NUM_OK;
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (end == s || *end)
		r = HPU_NUM_INVALID;
	else if (errno == ERANGE || v < lo || v > hi)
		r = HPU_NUM_RANGE;
	else
		*out = v;
	errno = saved;
	return r;
}

int hpu__parse_int(const char *s, int lo, int hi, int *out)
{
	long v;
	int r = hpu__parse_long(s, lo, hi, &v);
	if (r == HPU_NUM_OK)
		*out = (int)v;
	return r;
}

int hpu__parse_u64_prefix(const char *s, const char **end, uint64_t *out)
{
	if (!s) {
		*end = s;
		return HPU_NUM_INVALID;
	}
	const char *p = s;
	while (isspace((unsigned char)*p))
		p++;
	int saved = errno, r = HPU_NUM_OK;
	char *e;
	errno = 0;
	unsigned long long v = strtoull(s, &e, 10);
	*end = e;
	if (e == s)
		r = HPU_NUM_INVALID;
	else if (*p == '-' || errno == ERANGE)
		r = HPU_NUM_RANGE;
	else
		*out = (uint64_t)v;
	errno = saved;
	return r;
}

int hpu__parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	const char *end;
	uint64_t v;
	int r = hpu__parse_u64_prefix(s, &end, &v);
	if (r == HPU_NUM_INVALID || *end)
		return HPU_NUM_INVALID;
	if (r == HPU_NUM_RANGE || v < lo || v > hi)
		return HPU_NUM_RANGE;
	*out = v;
	return HPU_NUM_OK;
}

int hpu__parse_double(const char *s, double lo, double hi, double *out)
{
	if (!s)
		return HPU_NUM_INVALID;
	int saved = errno, r = HPU_NUM_OK;
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (end == s || *end)
		r = HPU_NUM_INVALID;
	else if (errno == ERANGE || !(v >= lo && v <= hi))
		r = HPU_NUM_RANGE;
	else
		*out = v;
	errno = saved;
	return r;
}

int hpu__parse_real(const char *s, double *out)
{
	if (!s)
		return HPU_NUM_INVALID;
	int saved = errno;
	char *end;
	double v = strtod(s, &end);
	errno = saved;
	if (end == s || *end)
		return HPU_NUM_INVALID;
	*out = v;
	return HPU_NUM_OK;
}

size_t hpu__edit_distance(const char *a, const char *b)
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

const char *hpu__human_size(char *buf, size_t len, double n)
{
	if (n < 1024)
		snprintf(buf, len, "%.0f bytes", n);
	else if (n < 1024.0 * 1024)
		snprintf(buf, len, "%.1f KiB", n / 1024);
	else if (n < 1024.0 * 1024 * 1024)
		snprintf(buf, len, "%.1f MiB", n / (1024.0 * 1024));
	else
		snprintf(buf, len, "%.1f GiB", n / (1024.0 * 1024 * 1024));
	return buf;
}
