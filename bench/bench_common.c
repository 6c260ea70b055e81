#include "bench/bench_common.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

void bench_opts_default(struct bench_opts *o)
{
	o->minbytes = 8;
	o->maxbytes = (size_t)128 << 20;
	o->factor = 2;
	o->stepbytes = (size_t)1 << 20;
	o->iters = 20;
	o->agg = 1;
	o->warmup = 5;
	o->check = 1;
	o->cputime = 0;
}

size_t bench_next_size(const struct bench_opts *o, size_t n)
{
	if (o->factor > 1)
		return n && n <= o->maxbytes / o->factor ? n * o->factor : 0;
	if (o->stepbytes == 0 || o->stepbytes > o->maxbytes)
		return 0;
	return n <= o->maxbytes - o->stepbytes ? n + o->stepbytes : 0;
}

int bench_parse_size(const char *s, size_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -1;
	int shift = 0;
	switch (*end) {
	case 'K':
	case 'k':
		shift = 10;
		end++;
		break;
	case 'M':
	case 'm':
		shift = 20;
		end++;
		break;
	case 'G':
	case 'g':
		shift = 30;
		end++;
		break;
	}
	if (*end || v > (SIZE_MAX >> shift))
		return -1;
	*out = (size_t)v << shift;
	return 0;
}

int bench_parse_int(const char *s, int allow_zero, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v > INT_MAX ||
	    v < (allow_zero ? 0 : 1))
		return -1;
	*out = (int)v;
	return 0;
}

int bench_common_opt(struct bench_opts *o, int c, const char *arg, int *bad)
{
	int f = 0;
	switch (c) {
	case 'b':
		*bad |= bench_parse_size(arg, &o->minbytes);
		return 1;
	case 'e':
		*bad |= bench_parse_size(arg, &o->maxbytes);
		return 1;
	case 'f':
		*bad |= bench_parse_int(arg, 0, &f);
		o->factor = (size_t)f;
		return 1;
	case 'n':
		*bad |= bench_parse_int(arg, 0, &o->iters);
		return 1;
	case 'w':
		*bad |= bench_parse_int(arg, 1, &o->warmup);
		return 1;
	case 'c':
		*bad |= bench_parse_int(arg, 1, &o->check);
		return 1;
	default:
		return 0;
	}
}

double bench_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void bench_print_heads(FILE *f, const struct bench_opts *o, int groups)
{
	fprintf(f,
	        "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) "
	        "warmup iters: %d iters: %d agg iters: %d validation: %d "
	        "graph: 0\n",
	        o->minbytes, o->maxbytes,
	        o->factor > 1 ? o->factor : o->stepbytes,
	        o->factor > 1 ? "factor" : "bytes", o->warmup, o->iters, o->agg,
	        o->check);
	fprintf(f, "#\n");
	if (groups == 2)
		fprintf(f, "#%47s%34s%34s\n", "", "out-of-place", "in-place");
	else
		fprintf(f, "#%47s%34s\n", "", "in-place");
	fprintf(f, "# %10s %12s %8s %6s %6s", "size", "count", "type", "redop",
	        "root");
	for (int g = 0; g < groups; g++)
		fprintf(f, " %10s %7s %7s %6s", o->cputime ? "cputime" : "time",
		        "algbw", "busbw", "#wrong");
	fprintf(f, "\n# %10s %12s %8s %6s %6s", "(B)", "(elements)", "", "",
	        "");
	for (int g = 0; g < groups; g++)
		fprintf(f, " %10s %7s %7s %6s", "(us)", "(GB/s)", "(GB/s)", "");
	fprintf(f, "\n");
}

void bench_print_row(FILE *f, size_t bytes, size_t count, const char *type,
                     const char *redop, int root)
{
	fprintf(f, "  %10zu %12zu %8s %6s %6d", bytes, count, type, redop,
	        root < 0 ? -1 : root);
}

double bench_busbw(size_t bytes, double usec, double busfactor)
{
	if (usec <= 0)
		return 0;
	return (double)bytes / usec / 1e3 * busfactor;
}

void bench_print_group(FILE *f, double usec, size_t bytes, double busfactor,
                       long wrong)
{
	double algbw = bench_busbw(bytes, usec, 1.0);
	fprintf(f, " %10.2f %7.3f %7.3f", usec, algbw, algbw * busfactor);
	if (wrong < 0)
		fprintf(f, " %6s", "N/A");
	else
		fprintf(f, " %6ld", wrong);
}
