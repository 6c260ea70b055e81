/* What the collective benchmarks share: the nccl-tests command line and
 * output columns, so that hpucoll-bench, mpi-allreduce, memcpy-bw (and
 * gloo_allreduce.py, which prints the same) can be read side by side.
 *
 * A result line has the size in bytes, the element count, the type, the
 * reduction and the root, then for each group (out-of-place, in-place)
 * time(us), algbw(GB/s), busbw(GB/s) and #wrong. */
#ifndef HPU_BENCH_COMMON_H
#define HPU_BENCH_COMMON_H

#include <stddef.h>
#include <stdio.h>

/* The options every benchmark takes (nccl-tests letters). */
struct bench_opts {
	size_t minbytes;  /* -b */
	size_t maxbytes;  /* -e */
	size_t factor;    /* -f: sizes grow by this factor, if above 1 */
	size_t stepbytes; /* -i: else by this many bytes */
	int iters;        /* -n: timed iterations per size and group */
	int agg;          /* -m: collectives per iteration */
	int warmup;       /* -w: untimed iterations before them */
	int check;        /* -c: iterations whose every element is checked */
	int cputime;      /* -C: the time column is "cputime" */
};

/* Sets the defaults: -b 8 -e 128M -f 2 -i 1M -n 20 -m 1 -w 5 -c 1 -C 0
 * (nccl-tests' -b 32M -e 32M -f 1 -w 1 sweep no sizes worth comparing). */
void bench_opts_default(struct bench_opts *o);

/* Parses a byte count such as "8", "64K", "128M" or "1G" (binary
 * multiples). Returns 0, or -1 if it is not one. */
int bench_parse_size(const char *s, size_t *out);

/* Parses a positive (or, with allow_zero, non-negative) int; -1 if bad. */
int bench_parse_int(const char *s, int allow_zero, int *out);

/* The size after n in the sweep o describes (times -f, or plus -i when
 * -f is 1); 0 when it would pass -e (or overflow). */
size_t bench_next_size(const struct bench_opts *o, size_t n);

/* Handles one of the options every benchmark takes (-b -e -f -n -w -c)
 * from getopt: returns 1 if `c` is one of them, setting *bad when its value
 * is not valid, or 0 if it is not one of them. */
int bench_common_opt(struct bench_opts *o, int c, const char *arg, int *bad);

/* Seconds on a monotonic clock. */
double bench_now(void);

/* Prints nccl-tests' "# nThread 1 nGpus 1 minBytes ..." line and the
 * column heads for `groups` groups (1: in-place only; 2: out-of-place
 * then in-place). */
void bench_print_heads(FILE *f, const struct bench_opts *o, int groups);

/* Prints the start of a result line. root < 0 prints -1 as nccl-tests. */
void bench_print_row(FILE *f, size_t bytes, size_t count, const char *type,
                     const char *redop, int root);

/* Prints one group of a result line; wrong < 0 prints N/A (no check). */
void bench_print_group(FILE *f, double usec, size_t bytes, double busfactor,
                       long wrong);

/* Bus bandwidth in GB/s of `bytes` moved in `usec`, times busfactor. */
double bench_busbw(size_t bytes, double usec, double busfactor);

#endif
