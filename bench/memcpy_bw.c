/* memcpy-bw: single-thread memcpy bandwidth for the sizes the collective
 * benchmarks use -- the ceiling of a one-node all-reduce, which must at
 * least copy its data once.
 *
 *   memcpy-bw [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup]
 *
 * For each size it copies one buffer into another (both touched beforehand,
 * so no page faults are timed) max(iters, 256 MiB / size) times and prints
 * the mean time of one copy and size / time in GB/s (1e9 bytes; bytes
 * copied, not read plus written). Small sizes stay in cache, as the
 * collectives' buffers of those sizes do. */
#include "bench/bench_common.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
	fprintf(f, "usage: memcpy-bw [-b minbytes] [-e maxbytes] [-f factor] "
	           "[-n iters] [-w warmup]\n");
}

static int parse(int argc, char **argv, struct bench_opts *o)
{
	int c, bad = 0;
	while ((c = getopt(argc, argv, "b:e:f:n:w:c:h")) != -1) {
		switch (c) {
		case 'c':
			break; /* accepted for symmetry; nothing to check */
		case 'h':
			usage(stdout);
			exit(0);
		default:
			if (!bench_common_opt(o, c, optarg, &bad))
				bad = 1;
		}
	}
	if (bad || optind != argc || o->factor < 2 || o->minbytes < 1 ||
	    o->maxbytes < o->minbytes) {
		usage(stderr);
		return -1;
	}
	return 0;
}

/* Mean seconds of one memcpy of `bytes`, over `reps` copies. The copy
 * direction alternates so the compiler cannot drop repeated copies. */
static double time_copy(char *a, char *b, size_t bytes, long reps, int warmup)
{
	for (int i = 0; i < warmup; i++)
		memcpy(b, a, bytes);
	double t0 = bench_now();
	for (long i = 0; i < reps; i++) {
		if (i & 1)
			memcpy(a, b, bytes);
		else
			memcpy(b, a, bytes);
	}
	return (bench_now() - t0) / (double)reps;
}

int main(int argc, char **argv)
{
	struct bench_opts o;
	bench_opts_default(&o);
	if (parse(argc, argv, &o))
		return 2;
	char *a = malloc(o.maxbytes), *b = malloc(o.maxbytes);
	if (!a || !b) {
		fprintf(stderr, "memcpy-bw: cannot allocate 2 x %zu bytes\n",
		        o.maxbytes);
		return 1;
	}
	memset(a, 1, o.maxbytes);
	memset(b, 2, o.maxbytes);
	printf("# memcpy-bw: single thread, libc memcpy\n");
	printf("# %10s %10s %8s\n", "size", "time", "bw");
	printf("# %10s %10s %8s\n", "(B)", "(us)", "(GB/s)");
	for (size_t n = o.minbytes; n <= o.maxbytes; n *= o.factor) {
		long reps = (long)((256ul << 20) / n);
		if (reps < o.iters)
			reps = o.iters;
		double s = time_copy(a, b, n, reps, o.warmup);
		printf("  %10zu %10.3f %8.2f\n", n, s * 1e6,
		       (double)n / s / 1e9);
		if (n > o.maxbytes / o.factor)
			break;
	}
	free(a);
	free(b);
	return 0;
}
