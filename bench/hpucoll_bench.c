/* hpucoll-bench: bandwidth and latency of libhpucoll's collectives, read
 * as nccl-tests are read.
 *
 *   hpulaunch --devices N --exec hpucoll-bench [-t coll] [-b minbytes]
 *       [-e maxbytes] [-f factor] [-n iters] [-w warmup] [-c 0|1]
 *       [-d dtype] [-o op] [-r root] [-a]
 *
 * For each size, first out-of-place then in-place: -w untimed iterations,
 * a barrier, then -n timed ones (with -a all -n are issued, then waited
 * for). time(us) is the mean per iteration, the maximum over ranks (an
 * all_reduce MAX of each rank's mean). As in nccl-tests, size is the
 * larger of the send and receive buffers and count the per-rank element
 * count; algbw = size / time, busbw = algbw x 2(n-1)/n for all_reduce,
 * (n-1)/n for reduce_scatter and all_gather, 1 for broadcast.
 *
 * With -c 1 every group is run -n more times, untimed, in the same mode
 * (blocking or -a), each time on fresh inputs that depend on the
 * iteration, and every element of every result is compared with the value
 * this program computes; #wrong counts the elements that differ, over
 * ranks. Inputs are small integers, so sums, max and min are exact in
 * every dtype; avg of a floating type may differ by the rounding of one
 * division. Only rank 0 prints; the exit status is 1 if any element was
 * wrong or a collective failed. */
#include "bench_common.h"
#include "bench_data.h"

#include <hpu/coll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const coll_names[] = {"all_reduce", "reduce_scatter",
                                         "all_gather", "broadcast"};
static const char *const dtype_names[] = {"float", "double", "half", "bfloat16",
                                          "int32", "int64",  "uint8"};
static const char *const op_names[] = {"sum", "avg", "max", "min"};

/* Everything a run needs: options, the communicator and the buffers of
 * the timed iterations (maxbytes each). */
struct bench {
	struct bench_opts o;
	enum bench_coll coll;
	hpucoll_dtype dtype;
	hpucoll_op op;
	int root;
	int async;
	hpucoll_comm *comm;
	int rank, size;
	char *send, *recv;
	hpucoll_req **reqs; /* o.iters of them, for -a */
};

/* The buffers of one size. count is per rank, as the API takes it. */
struct shape {
	size_t count;
	size_t sendbytes; /* out-of-place send buffer */
	size_t bytes;     /* the larger buffer: what nccl-tests calls size */
};

/* ---- Command line ---- */

static int lookup(const char *s, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(s, names[i]))
			return i;
	return -1;
}

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: hpulaunch --devices N --exec hpucoll-bench [options]\n"
	        "  -t coll      all_reduce | reduce_scatter | all_gather | "
	        "broadcast (all_reduce)\n"
	        "  -b bytes     smallest size (8); K, M, G suffixes\n"
	        "  -e bytes     largest size (128M)\n"
	        "  -f factor    size step factor (2)\n"
	        "  -n iters     timed iterations per size and group (20)\n"
	        "  -w iters     warm-up iterations (5)\n"
	        "  -c 0|1       check every element of -n more iterations (1)\n"
	        "  -d dtype     float double half bfloat16 int32 int64 uint8 "
	        "(float)\n"
	        "  -o op        sum avg max min (sum)\n"
	        "  -r root      broadcast root (0)\n"
	        "  -a           asynchronous: issue all iterations, then wait\n"
	        "The transport comes from HPUCOLL_TRANSPORT (hpulaunch "
	        "--transport).\n");
}

static int parse_name(const char *s, const char *const *names, int n, int *out)
{
	int k = lookup(s, names, n);
	if (k < 0)
		return -1;
	*out = k;
	return 0;
}

static int parse(struct bench *b, int argc, char **argv)
{
	int c, bad = 0, v = 0;
	while ((c = getopt(argc, argv, "t:b:e:f:n:w:c:d:o:r:ah")) != -1) {
		switch (c) {
		case 't':
			bad |=
			    parse_name(optarg, coll_names, BENCH_NUM_COLLS, &v);
			b->coll = v;
			break;
		case 'd':
			bad |= parse_name(optarg, dtype_names,
			                  HPUCOLL_NUM_DTYPES, &v);
			b->dtype = v;
			break;
		case 'o':
			bad |=
			    parse_name(optarg, op_names, HPUCOLL_NUM_OPS, &v);
			b->op = v;
			break;
		case 'r':
			bad |= bench_parse_int(optarg, 1, &b->root);
			break;
		case 'a':
			b->async = 1;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			if (!bench_common_opt(&b->o, c, optarg, &bad))
				bad = 1;
		}
	}
	if (bad || optind != argc || b->o.factor < 2 || b->o.check > 1 ||
	    b->o.maxbytes < b->o.minbytes) {
		usage(stderr);
		return -1;
	}
	return 0;
}

/* ---- The buffers of one iteration ---- */

static struct shape shape_of(const struct bench *b, size_t bytes)
{
	size_t ds = hpucoll_dtype_size(b->dtype), w = (size_t)b->size;
	struct shape s;
	if (b->coll == BENCH_REDUCE_SCATTER || b->coll == BENCH_ALL_GATHER) {
		s.count = bytes / (ds * w);
		s.bytes = s.count * ds * w;
		s.sendbytes =
		    b->coll == BENCH_ALL_GATHER ? s.count * ds : s.bytes;
	} else {
		s.count = bytes / ds;
		s.bytes = s.sendbytes = s.count * ds;
	}
	return s;
}

/* Where a collective reads and writes. In place, everything is in recv
 * (which holds s->bytes), at the offsets the header defines. */
struct view {
	char *in;   /* this rank's input */
	size_t nin; /* its elements */
	char *out;  /* this rank's result */
	size_t nout;
};

static struct view view_of(const struct bench *b, const struct shape *s,
                           int inplace, char *send, char *recv)
{
	size_t block = s->count * hpucoll_dtype_size(b->dtype);
	size_t w = (size_t)b->size, r = (size_t)b->rank;
	struct view v = {inplace ? recv : send, s->count, recv, s->count};
	switch (b->coll) {
	case BENCH_REDUCE_SCATTER:
		v.nin = w * s->count;
		if (inplace)
			v.out = recv + r * block;
		break;
	case BENCH_ALL_GATHER:
		v.nout = w * s->count;
		if (inplace)
			v.in = recv + r * block;
		break;
	default:
		break;
	}
	return v;
}

/* Starts one collective (req != NULL) or runs it (req == NULL). */
static int launch(const struct bench *b, const struct shape *s, int inplace,
                  char *send, char *recv, hpucoll_req **req)
{
	struct view v = view_of(b, s, inplace, send, recv);
	hpucoll_comm *c = b->comm;
	hpucoll_dtype t = b->dtype;
	switch (b->coll) {
	case BENCH_ALL_REDUCE:
		return req ? hpucoll_iall_reduce(c, v.in, v.out, s->count, t,
		                                 b->op, req)
		           : hpucoll_all_reduce(c, v.in, v.out, s->count, t,
		                                b->op);
	case BENCH_REDUCE_SCATTER:
		return req ? hpucoll_ireduce_scatter(c, v.in, v.out, s->count,
		                                     t, b->op, req)
		           : hpucoll_reduce_scatter(c, v.in, v.out, s->count, t,
		                                    b->op);
	case BENCH_ALL_GATHER:
		return req ? hpucoll_iall_gather(c, v.in, v.out, s->count, t,
		                                 req)
		           : hpucoll_all_gather(c, v.in, v.out, s->count, t);
	default:
		return req ? hpucoll_ibroadcast(c, v.in, v.out, s->count, t,
		                                b->root, req)
		           : hpucoll_broadcast(c, v.in, v.out, s->count, t,
		                               b->root);
	}
}

static void die(const struct bench *b, const char *what, int rc)
{
	fprintf(stderr, "hpucoll-bench: rank %d: %s: %s (%s)\n", b->rank, what,
	        hpucoll_strerror(rc), hpucoll_comm_errmsg(b->comm));
	exit(1);
}

static void *xmalloc(const struct bench *b, size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p)
		die(b, "malloc", HPUCOLL_ENOMEM);
	return p;
}

/* Runs n iterations over the given buffer pairs (sends[i], recvs[i]),
 * blocking or, with -a, all issued then waited for in order. */
static void run(struct bench *b, const struct shape *s, int inplace, int n,
                char **sends, char **recvs)
{
	int rc;
	for (int i = 0; i < n; i++) {
		rc = launch(b, s, inplace, sends[i], recvs[i],
		            b->async ? &b->reqs[i] : NULL);
		if (rc)
			die(b, coll_names[b->coll], rc);
	}
	for (int i = 0; b->async && i < n; i++)
		if ((rc = hpucoll_wait(&b->reqs[i])))
			die(b, "wait", rc);
}

/* ---- Timing and checking ---- */

static struct bench_case case_of(const struct bench *b, const struct shape *s)
{
	struct bench_case c = {b->coll, b->dtype, b->op,   b->rank,
	                       b->size, b->root,  s->count};
	return c;
}

/* Sets this rank's output to the sentinel, then its input (on a
 * broadcast's root only) to check iteration it's values. */
static void fill(const struct bench *b, const struct view *v, int it)
{
	double vals[BENCH_PERIOD];
	for (int j = 0; j < BENCH_PERIOD; j++)
		vals[j] = BENCH_SENTINEL;
	bench_fill(v->out, b->dtype, v->nout, vals);
	if (b->coll == BENCH_BROADCAST && b->rank != b->root)
		return;
	for (int j = 0; j < BENCH_PERIOD; j++)
		vals[j] = bench_input(b->dtype, (size_t)j, b->rank, it);
	bench_fill(v->in, b->dtype, v->nin, vals);
}

/* Counts the wrong elements of one result, block by block (all_gather's
 * output has one block per rank); says where the first is when `say` is
 * set. */
static long verify(const struct bench *b, const struct shape *s, int inplace,
                   const struct view *v, int it, int say)
{
	struct bench_case c = case_of(b, s);
	size_t block = b->coll == BENCH_ALL_GATHER ? s->count : v->nout;
	size_t esize = hpucoll_dtype_size(b->dtype);
	long wrong = 0;
	for (size_t k0 = 0; k0 < v->nout; k0 += block) {
		double want[BENCH_PERIOD], tol[BENCH_PERIOD];
		for (int j = 0; j < BENCH_PERIOD; j++) {
			want[j] = bench_expected(&c, k0 + (size_t)j, it);
			tol[j] = bench_tolerance(b->dtype, b->op, want[j]);
		}
		size_t first,
		    n = bench_count_wrong(v->out + k0 * esize, b->dtype, block,
		                          want, tol, &first);
		if (n && !wrong && say)
			fprintf(stderr,
			        "hpucoll-bench: rank %d: %s %s %zu B iteration "
			        "%d: element %zu is %g, want %g\n",
			        b->rank, coll_names[b->coll],
			        inplace ? "in-place" : "out-of-place", s->bytes,
			        it, k0 + first,
			        bench_get(v->out, b->dtype, k0 + first),
			        want[first % BENCH_PERIOD]);
		wrong += (long)n;
	}
	return wrong;
}

static double allmax(struct bench *b, double x)
{
	int rc =
	    hpucoll_all_reduce(b->comm, &x, &x, 1, HPUCOLL_F64, HPUCOLL_MAX);
	if (rc)
		die(b, "all_reduce of the timings", rc);
	return x;
}

static long allsum(struct bench *b, long x)
{
	int64_t v = x;
	int rc =
	    hpucoll_all_reduce(b->comm, &v, &v, 1, HPUCOLL_I64, HPUCOLL_SUM);
	if (rc)
		die(b, "all_reduce of the error counts", rc);
	return (long)v;
}

/* Rank-max of the mean microseconds per iteration of one group. */
static double timed(struct bench *b, const struct shape *s, int inplace)
{
	int n = b->o.iters > b->o.warmup ? b->o.iters : b->o.warmup;
	char **sends = xmalloc(b, sizeof(char *) * (size_t)n);
	char **recvs = xmalloc(b, sizeof(char *) * (size_t)n);
	for (int i = 0; i < n; i++) {
		sends[i] = b->send;
		recvs[i] = b->recv;
	}
	struct view v = view_of(b, s, inplace, b->send, b->recv);
	fill(b, &v, 0);
	run(b, s, inplace, b->o.warmup, sends, recvs);
	int rc = hpucoll_barrier(b->comm);
	if (rc)
		die(b, "barrier", rc);
	double t0 = bench_now();
	run(b, s, inplace, b->o.iters, sends, recvs);
	double us = (bench_now() - t0) / b->o.iters * 1e6;
	free(sends);
	free(recvs);
	return allmax(b, us);
}

/* Wrong elements, over ranks, of -n iterations on fresh inputs. With -a,
 * as many iterations as fit in 256 MiB are in flight together, each on
 * buffers of its own. */
static long checked(struct bench *b, const struct shape *s, int inplace)
{
	size_t per = s->sendbytes + s->bytes + 2;
	int batch = (int)((256u << 20) / per);
	batch = !b->async || batch < 1 ? 1
	        : batch > b->o.iters   ? b->o.iters
	                               : batch;
	char **sends = xmalloc(b, sizeof(char *) * (size_t)batch);
	char **recvs = xmalloc(b, sizeof(char *) * (size_t)batch);
	long wrong = 0;
	for (int i = 0; i < batch; i++) {
		sends[i] = xmalloc(b, s->sendbytes);
		recvs[i] = xmalloc(b, s->bytes);
	}
	for (int it0 = 0; it0 < b->o.iters; it0 += batch) {
		int n = b->o.iters - it0 < batch ? b->o.iters - it0 : batch;
		for (int i = 0; i < n; i++) {
			struct view v =
			    view_of(b, s, inplace, sends[i], recvs[i]);
			fill(b, &v, it0 + i);
		}
		run(b, s, inplace, n, sends, recvs);
		for (int i = 0; i < n; i++) {
			struct view v =
			    view_of(b, s, inplace, sends[i], recvs[i]);
			wrong += verify(b, s, inplace, &v, it0 + i, wrong == 0);
		}
	}
	for (int i = 0; i < batch; i++) {
		free(sends[i]);
		free(recvs[i]);
	}
	free(sends);
	free(recvs);
	return allsum(b, wrong);
}

/* ---- Main ---- */

static double bus_factor(const struct bench *b)
{
	double n = b->size;
	switch (b->coll) {
	case BENCH_ALL_REDUCE:
		return 2 * (n - 1) / n;
	case BENCH_REDUCE_SCATTER:
	case BENCH_ALL_GATHER:
		return (n - 1) / n;
	default:
		return 1;
	}
}

static void print_title(const struct bench *b)
{
	const char *env = getenv("HPUCOLL_TRANSPORT");
	printf("# hpucoll-bench: %s, %d ranks, transport %s "
	       "(HPUCOLL_TRANSPORT%s), %s\n",
	       coll_names[b->coll], b->size, env && *env ? env : "auto",
	       env && *env ? "" : " unset: default",
	       b->async ? "asynchronous (-a)" : "blocking");
	bench_print_heads(stdout, &b->o, 2);
}

/* Times and checks both groups of every size; returns the wrong elements. */
static long sweep(struct bench *b)
{
	long wrong = 0;
	double sum = 0, factor = bus_factor(b);
	int rows = 0, root = b->coll == BENCH_BROADCAST ? b->root : -1;
	int reduces =
	    b->coll == BENCH_ALL_REDUCE || b->coll == BENCH_REDUCE_SCATTER;
	for (size_t n = b->o.minbytes; n <= b->o.maxbytes; n *= b->o.factor) {
		struct shape s = shape_of(b, n);
		double us[2];
		long bad[2];
		for (int inplace = 0; inplace < 2; inplace++) {
			us[inplace] = timed(b, &s, inplace);
			bad[inplace] =
			    b->o.check ? checked(b, &s, inplace) : -1;
			wrong += bad[inplace] > 0 ? bad[inplace] : 0;
			sum += bench_busbw(s.bytes, us[inplace], factor);
			rows++;
		}
		if (b->rank == 0) {
			bench_print_row(
			    stdout, s.bytes, s.count, dtype_names[b->dtype],
			    reduces ? op_names[b->op] : "none", root);
			for (int inplace = 0; inplace < 2; inplace++)
				bench_print_group(stdout, us[inplace], s.bytes,
				                  factor, bad[inplace]);
			printf("\n");
			fflush(stdout);
		}
		if (n > b->o.maxbytes / b->o.factor)
			break;
	}
	if (b->rank == 0) {
		printf("# Out of bounds values : %ld %s\n", wrong,
		       wrong ? "FAILED" : "OK");
		printf("# Avg bus bandwidth    : %g\n",
		       rows ? sum / rows : 0.0);
	}
	return wrong;
}

int main(int argc, char **argv)
{
	struct bench b = {
	    .coll = BENCH_ALL_REDUCE, .dtype = HPUCOLL_F32, .op = HPUCOLL_SUM};
	bench_opts_default(&b.o);
	if (parse(&b, argc, argv))
		return 2;
	char err[512];
	if (hpucoll_comm_init_env(&b.comm, err, sizeof err)) {
		fprintf(stderr, "hpucoll-bench: %s\n", err);
		return 1;
	}
	b.rank = hpucoll_comm_rank(b.comm);
	b.size = hpucoll_comm_size(b.comm);
	if (b.root >= b.size) {
		fprintf(stderr,
		        "hpucoll-bench: root %d is not below %d ranks\n",
		        b.root, b.size);
		return 2;
	}
	b.send = malloc(b.o.maxbytes + 1);
	b.recv = malloc(b.o.maxbytes + 1);
	b.reqs =
	    calloc((size_t)(b.o.iters > b.o.warmup ? b.o.iters : b.o.warmup),
	           sizeof *b.reqs);
	if (!b.send || !b.recv || !b.reqs) {
		fprintf(stderr,
		        "hpucoll-bench: cannot allocate 2 x %zu bytes\n",
		        b.o.maxbytes);
		return 1;
	}
	memset(b.send, 0, b.o.maxbytes + 1); /* no page faults in the timing */
	memset(b.recv, 0, b.o.maxbytes + 1);
	if (b.rank == 0)
		print_title(&b);
	long wrong = sweep(&b);
	hpucoll_comm_destroy(&b.comm);
	free(b.send);
	free(b.recv);
	free(b.reqs);
	return wrong ? 1 : 0;
}
