/* hpucoll-bench: bandwidth and latency of libhpucoll's collectives, with
 * nccl-tests' command line and output (its src/common.cu):
 *
 *   hpulaunch --devices N --exec hpucoll-bench [--coll all_reduce]
 *       [-b minbytes] [-e maxbytes] [-f factor | -i stepbytes] [-n iters]
 *       [-m agg_iters] [-w warmup] [-c checks] [-d dtype|all] [-o op|all]
 *       [-r root|all] [-z 0-3 | --async] [-a 0-3] [-C 0|1] [-T seconds]
 *       [-J results.json] [-t 1] [-g 1]
 *
 * Called as all_reduce_perf, reduce_scatter_perf, all_gather_perf or
 * broadcast_perf (a link), it runs that collective, as nccl-tests' binaries
 * do. -t (threads per process) and -g (devices per thread) take only 1:
 * there is one rank per process, and hpulaunch --devices N makes N ranks.
 * hpucoll_args.c reads the command line; --help lists it all.
 *
 * For every datatype of -d and reduction of -o (-d all, -o all: each that
 * hpucoll has, in nccl-tests' order; all_gather and broadcast reduce
 * nothing and print "none"), every broadcast root of -r, and every size,
 * out-of-place then in-place: -w untimed iterations, a barrier, then -n
 * timed ones of -m collectives each. -z says how they are issued: 0 (or
 * --async) all issued, then waited for; 1 each iteration waited for, then
 * a barrier; 2 (the default, hpucoll's blocking calls when -m is 1) each
 * iteration waited for; 3 as 1, with the barriers left out of the time.
 * time(us) is the time per collective, total / (n x m), combined over
 * ranks as -a says: 0 rank 0's, 1 the mean over ranks (the default, as
 * nccl-tests), 2 the minimum, 3 the maximum. With -C 1 the time is that
 * until the last collective was issued (the same as the time but under
 * -z 0). As in nccl-tests, size is the larger of the send and receive
 * buffers and count the per-rank element count; algbw = size / time,
 * busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter and
 * all_gather, 1 for broadcast.
 *
 * With -c N each group is then run N more times, untimed (under -z 0 as
 * many at once as fit in 256 MiB, each on buffers of its own; else one by
 * one), each time on fresh inputs that depend on the iteration, and every
 * element of every result is compared with the value this program
 * computes; #wrong counts the elements that differ, over ranks. Inputs are
 * small integers, so sums, max and min are exact in every dtype; avg of a
 * floating type may differ by the rounding of one division.
 *
 * Only rank 0 prints. The closing lines are nccl-tests': "# Out of bounds
 * values : N OK|FAILED", N counting, as nccl-tests does, the results (one
 * rank's, one group's, one check iteration's) with any wrong element, and
 * "# Avg bus bandwidth    : X", the mean busbw of every group printed.
 * -J also writes the results as JSON (hpucoll_json.h). The exit status is
 * 1 if any element was wrong or a collective failed, 2 for bad usage. */
#include "bench/bench_common.h"
#include "bench/bench_data.h"
#include "bench/hpucoll_args.h"
#include "bench/hpucoll_json.h"

#include <hpu/coll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Everything a run needs: options, the communicator, the case being run
 * and the buffers of the timed iterations (maxbytes each). */
struct bench {
	struct hcb_args a;
	hpucoll_dtype dtype; /* the case: one of a.dtypes */
	hpucoll_op op;       /* one of a.ops */
	int root;            /* broadcast's root */
	hpucoll_comm *comm;
	int rank, size;
	char *send, *recv;
	hpucoll_req **reqs; /* nreqs of them, for -z 0, -m and checks */
	size_t nreqs;
	long wrong;   /* wrong elements, over ranks and groups */
	long bad;     /* results with a wrong element: out of bounds values */
	double bwsum; /* busbw summed over groups */
	int groups;
	cJSON *doc; /* -J, on rank 0 */
	FILE *json;
};

/* The buffers of one size. count is per rank, as the API takes it. */
struct shape {
	size_t count;
	size_t sendbytes; /* out-of-place send buffer */
	size_t bytes;     /* the larger buffer: what nccl-tests calls size */
};

/* ---- The buffers of one iteration ---- */

static struct shape shape_of(const struct bench *b, size_t bytes)
{
	size_t ds = hpucoll_dtype_size(b->dtype), w = (size_t)b->size;
	struct shape s;
	if (b->a.coll == BENCH_REDUCE_SCATTER ||
	    b->a.coll == BENCH_ALL_GATHER) {
		s.count = bytes / (ds * w);
		s.bytes = s.count * ds * w;
		s.sendbytes =
		    b->a.coll == BENCH_ALL_GATHER ? s.count * ds : s.bytes;
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
	switch (b->a.coll) {
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
	switch (b->a.coll) {
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

/* Waits for the first n requests of b->reqs. */
static void wait_all(struct bench *b, size_t n)
{
	int rc;
	for (size_t i = 0; i < n; i++)
		if ((rc = hpucoll_wait(&b->reqs[i])))
			die(b, "wait", rc);
}

static void barrier(struct bench *b)
{
	int rc = hpucoll_barrier(b->comm);
	if (rc)
		die(b, "barrier", rc);
}

/* Runs n iterations of -m collectives on the timing buffers as -z says.
 * Returns the seconds they took (-z 3: without the barriers), and in
 * *issued those until the last collective was issued (-C). */
static double iterate(struct bench *b, const struct shape *s, int inplace,
                      int n, double *issued)
{
	int m = b->a.o.agg, z = b->a.blocking, rc;
	int each = z != HCB_ISSUE_ALL, blocking = each && m == 1;
	double t0 = bench_now(), excluded = 0;
	size_t k = 0;
	for (int it = 0; it < n; it++) {
		double t1 = bench_now();
		for (int j = 0; j < m; j++) {
			rc = launch(b, s, inplace, b->send, b->recv,
			            blocking ? NULL : &b->reqs[k++]);
			if (rc)
				die(b, hcb_coll_names[b->a.coll], rc);
		}
		if (each) {
			wait_all(b, k);
			k = 0;
		}
		if (z == HCB_WAIT_EXCLUDE)
			excluded += bench_now() - t1;
		if (z == HCB_WAIT_BARRIER || z == HCB_WAIT_EXCLUDE)
			barrier(b);
	}
	*issued = bench_now() - t0;
	wait_all(b, k);
	double total = bench_now() - t0;
	if (z == HCB_WAIT_EXCLUDE)
		*issued = total = excluded;
	return total;
}

/* Runs n collectives on the buffer pairs (sends[i], recvs[i]): all issued,
 * then waited for, under -z 0; else one by one. */
static void run_pairs(struct bench *b, const struct shape *s, int inplace,
                      int n, char **sends, char **recvs)
{
	int async = b->a.blocking == HCB_ISSUE_ALL, rc;
	for (int i = 0; i < n; i++) {
		rc = launch(b, s, inplace, sends[i], recvs[i],
		            async ? &b->reqs[i] : NULL);
		if (rc)
			die(b, hcb_coll_names[b->a.coll], rc);
	}
	if (async)
		wait_all(b, (size_t)n);
}

/* ---- Timing and checking ---- */

static struct bench_case case_of(const struct bench *b, const struct shape *s)
{
	struct bench_case c = {b->a.coll, b->dtype, b->op,   b->rank,
	                       b->size,   b->root,  s->count};
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
	if (b->a.coll == BENCH_BROADCAST && b->rank != b->root)
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
	size_t block = b->a.coll == BENCH_ALL_GATHER ? s->count : v->nout;
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
			        "hpucoll-bench: rank %d: %s %s %s %zu B "
			        "iteration %d: element %zu is %g, want %g\n",
			        b->rank, hcb_coll_names[b->a.coll],
			        hcb_dtype_names[b->dtype],
			        inplace ? "in-place" : "out-of-place", s->bytes,
			        it, k0 + first,
			        bench_get(v->out, b->dtype, k0 + first),
			        want[first % BENCH_PERIOD]);
		wrong += (long)n;
	}
	return wrong;
}

/* Sums x[0..n) over ranks, in place. */
static void allsum(struct bench *b, int64_t *x, size_t n)
{
	int rc = hpucoll_all_reduce(b->comm, x, x, n, HPUCOLL_I64, HPUCOLL_SUM);
	if (rc)
		die(b, "all_reduce of the error counts", rc);
}

/* Every rank's (time, cputime) of one group, in us per collective,
 * combined over ranks into g->over (rank 0's, mean, min, max) of the
 * time -C reports, and g->time as -a says. */
static void combine(struct bench *b, double us, double cpu_us,
                    struct hcb_group *g)
{
	double mine[2] = {us, cpu_us};
	double *all = xmalloc(b, sizeof(double) * 2 * (size_t)b->size);
	int rc = hpucoll_all_gather(b->comm, mine, all, 2, HPUCOLL_F64);
	if (rc)
		die(b, "all_gather of the timings", rc);
	int k = b->a.o.cputime;
	double sum = 0, lo = all[k], hi = all[k];
	for (int r = 0; r < b->size; r++) {
		double t = all[2 * r + k];
		sum += t;
		lo = t < lo ? t : lo;
		hi = t > hi ? t : hi;
	}
	g->over[HCB_AVG_RANK0] = all[k];
	g->over[HCB_AVG_MEAN] = sum / b->size;
	g->over[HCB_AVG_MIN] = lo;
	g->over[HCB_AVG_MAX] = hi;
	g->time = g->over[b->a.average];
	free(all);
}

/* Times one group into g: -w iterations, a barrier, -n timed ones. */
static void timed(struct bench *b, const struct shape *s, int inplace,
                  struct hcb_group *g)
{
	struct view v = view_of(b, s, inplace, b->send, b->recv);
	double issued;
	fill(b, &v, 0);
	iterate(b, s, inplace, b->a.o.warmup, &issued);
	barrier(b);
	double secs = iterate(b, s, inplace, b->a.o.iters, &issued);
	double per = 1e6 / ((double)b->a.o.iters * b->a.o.agg);
	combine(b, secs * per, issued * per, g);
}

/* Checks -c iterations on fresh inputs: returns the wrong elements over
 * ranks, and adds to b->bad the results (this rank's, one iteration's)
 * with any, over ranks. Under -z 0 as many iterations as fit in 256 MiB
 * are in flight together, each on buffers of its own. */
static long checked(struct bench *b, const struct shape *s, int inplace)
{
	int checks = b->a.o.check;
	size_t per = s->sendbytes + s->bytes + 2;
	size_t fit = ((size_t)256 << 20) / per;
	fit = fit < b->nreqs ? fit : b->nreqs;
	int batch = b->a.blocking != HCB_ISSUE_ALL || fit < 1 ? 1
	            : fit > (size_t)checks                    ? checks
	                                                      : (int)fit;
	char **sends = xmalloc(b, sizeof(char *) * (size_t)batch);
	char **recvs = xmalloc(b, sizeof(char *) * (size_t)batch);
	int64_t wrong[2] = {0, 0}; /* elements, results */
	for (int i = 0; i < batch; i++) {
		sends[i] = xmalloc(b, s->sendbytes);
		recvs[i] = xmalloc(b, s->bytes);
	}
	for (int it0 = 0; it0 < checks; it0 += batch) {
		int n = checks - it0 < batch ? checks - it0 : batch;
		for (int i = 0; i < n; i++) {
			struct view v =
			    view_of(b, s, inplace, sends[i], recvs[i]);
			fill(b, &v, it0 + i);
		}
		run_pairs(b, s, inplace, n, sends, recvs);
		for (int i = 0; i < n; i++) {
			struct view v =
			    view_of(b, s, inplace, sends[i], recvs[i]);
			long w =
			    verify(b, s, inplace, &v, it0 + i, wrong[0] == 0);
			wrong[0] += w;
			wrong[1] += w > 0;
		}
	}
	for (int i = 0; i < batch; i++) {
		free(sends[i]);
		free(recvs[i]);
	}
	free(sends);
	free(recvs);
	allsum(b, wrong, 2);
	b->bad += (long)wrong[1];
	return (long)wrong[0];
}

/* ---- The sweep ---- */

static double bus_factor(const struct bench *b)
{
	double n = b->size;
	switch (b->a.coll) {
	case BENCH_ALL_REDUCE:
		return 2 * (n - 1) / n;
	case BENCH_REDUCE_SCATTER:
	case BENCH_ALL_GATHER:
		return (n - 1) / n;
	default:
		return 1;
	}
}

static int reduces(const struct bench *b)
{
	return b->a.coll == BENCH_ALL_REDUCE ||
	       b->a.coll == BENCH_REDUCE_SCATTER;
}

/* Prints (and adds to the JSON) one result line. */
static void report(struct bench *b, const struct shape *s,
                   const struct hcb_group g[2], double factor)
{
	const char *type = hcb_dtype_names[b->dtype];
	const char *redop = reduces(b) ? hcb_op_names[b->op] : "none";
	int root = b->a.coll == BENCH_BROADCAST ? b->root : -1;
	bench_print_row(stdout, s->bytes, s->count, type, redop, root);
	cJSON *row =
	    b->doc ? hcb_json_row(b->doc, s->bytes, s->count, type, redop, root)
	           : NULL;
	for (int inplace = 0; inplace < 2; inplace++) {
		bench_print_group(stdout, g[inplace].time, s->bytes, factor,
		                  g[inplace].wrong);
		if (row)
			hcb_json_group(row, inplace, &g[inplace],
			               b->a.o.cputime);
	}
	if (row)
		hcb_json_end_row(row, b->a.o.iters);
	printf("\n");
	fflush(stdout);
}

/* Times and checks both groups of every size of the current case. */
static void sweep(struct bench *b)
{
	double factor = bus_factor(b);
	for (size_t n = b->a.o.minbytes;; n = bench_next_size(&b->a.o, n)) {
		struct shape s = shape_of(b, n);
		struct hcb_group g[2];
		for (int inplace = 0; inplace < 2; inplace++) {
			struct hcb_group *x = &g[inplace];
			timed(b, &s, inplace, x);
			x->algbw = bench_busbw(s.bytes, x->time, 1.0);
			x->busbw = x->algbw * factor;
			x->wrong = b->a.o.check ? checked(b, &s, inplace) : -1;
			b->wrong += x->wrong > 0 ? x->wrong : 0;
			b->bwsum += x->busbw;
			b->groups++;
		}
		if (b->rank == 0)
			report(b, &s, g, factor);
		if (!bench_next_size(&b->a.o, n))
			break;
	}
}

/* Every case -d, -o and -r ask for, in nccl-tests' order. */
static void run_all(struct bench *b)
{
	int nops = reduces(b) ? b->a.nops : 1;
	int all_roots = b->a.coll == BENCH_BROADCAST && b->a.root < 0;
	int r0 = b->a.coll == BENCH_BROADCAST && b->a.root > 0 ? b->a.root : 0;
	int r1 = all_roots ? b->size : r0 + 1;
	for (int t = 0; t < b->a.ndtypes; t++)
		for (int o = 0; o < nops; o++)
			for (int r = r0; r < r1; r++) {
				b->dtype = b->a.dtypes[t];
				b->op = b->a.ops[o];
				b->root = r;
				sweep(b);
			}
}

/* ---- Main ---- */

static const char *transport_name(void)
{
	const char *env = getenv("HPUCOLL_TRANSPORT");
	return env && *env ? env : "auto";
}

static void print_title(const struct bench *b)
{
	const char *env = getenv("HPUCOLL_TRANSPORT");
	printf("# hpucoll-bench: %s, %d ranks, transport %s "
	       "(HPUCOLL_TRANSPORT%s); -z %d: %s; -a %d: time is the %s\n",
	       hcb_coll_names[b->a.coll], b->size, transport_name(),
	       env && *env ? "" : " unset: default", b->a.blocking,
	       hcb_blocking_names[b->a.blocking], b->a.average,
	       hcb_average_names[b->a.average]);
	printf("# Collective test starting: %s\n", b->a.prog);
	bench_print_heads(stdout, &b->a.o, 2);
	fflush(stdout); /* seen when the ranks have joined, not at the first row */
}

/* The closing lines, as nccl-tests prints them. */
static void print_footer(const struct bench *b, double avg)
{
	printf("# %-20s : %ld %s\n", "Out of bounds values", b->bad,
	       b->bad ? "FAILED" : "OK");
	printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg, "");
	printf("#\n");
	printf("# Collective test concluded: %s\n", b->a.prog);
}

/* Rank 0 creates the -J file; every rank learns whether it could. */
static int open_json(struct bench *b, int argc, char **argv)
{
	char used[4096], err[4200] = "";
	int64_t failed = 0;
	if (b->a.json && b->rank == 0) {
		b->json = hcb_json_open(b->a.json, used, sizeof used, err,
		                        sizeof err);
		if (b->json) {
			b->doc = hcb_json_new(&b->a, argc, argv, b->size,
			                      transport_name());
			printf("# Writing JSON output to %s\n", used);
		} else {
			fprintf(stderr, "%s: -J: %s\n", b->a.prog, err);
			failed = 1;
		}
	}
	if (b->a.json)
		allsum(b, &failed, 1);
	return failed ? -1 : 0;
}

/* Allocates the buffers (touched once, so that no page faults in the
 * timing) and the requests: -n x -m under -z 0, at least -w x -m, -m. */
static int allocate(struct bench *b)
{
	const struct bench_opts *o = &b->a.o;
	int n = o->iters > o->warmup ? o->iters : o->warmup;
	b->nreqs =
	    (size_t)o->agg * (b->a.blocking == HCB_ISSUE_ALL ? (size_t)n : 1);
	b->nreqs = b->nreqs > (size_t)o->check ? b->nreqs : (size_t)o->check;
	b->send = malloc(o->maxbytes + 1);
	b->recv = malloc(o->maxbytes + 1);
	b->reqs = calloc(b->nreqs, sizeof *b->reqs);
	if (!b->send || !b->recv || !b->reqs) {
		fprintf(stderr, "%s: cannot allocate 2 x %zu bytes\n",
		        b->a.prog, o->maxbytes);
		return -1;
	}
	memset(b->send, 0, o->maxbytes + 1);
	memset(b->recv, 0, o->maxbytes + 1);
	return 0;
}

int main(int argc, char **argv)
{
	struct bench b = {0};
	int rc = hcb_parse(&b.a, argc, argv);
	if (rc)
		return rc > 0 ? 0 : 2;
	char err[512];
	if (hpucoll_comm_init_env(&b.comm, err, sizeof err)) {
		fprintf(stderr, "%s: %s\n", b.a.prog, err);
		return 1;
	}
	if (b.a.timeout_s > 0)
		hpucoll_comm_set_timeout(b.comm, b.a.timeout_s * 1000);
	b.rank = hpucoll_comm_rank(b.comm);
	b.size = hpucoll_comm_size(b.comm);
	if (b.a.coll == BENCH_BROADCAST && b.a.root >= b.size) {
		fprintf(stderr, "%s: -r %d: the root must be below %d ranks\n",
		        b.a.prog, b.a.root, b.size);
		return 2;
	}
	if (open_json(&b, argc, argv))
		return 2;
	if (b.rank == 0)
		print_title(&b);
	if (allocate(&b))
		return 1;
	run_all(&b);
	double avg = b.groups ? b.bwsum / b.groups : 0.0;
	rc = b.wrong ? 1 : 0;
	if (b.rank == 0) {
		print_footer(&b, avg);
		if (b.doc && hcb_json_finish(b.doc, b.json, b.bad, avg, err,
		                             sizeof err)) {
			fprintf(stderr, "%s: -J: %s\n", b.a.prog, err);
			rc = 1;
		}
	}
	hpucoll_comm_destroy(&b.comm);
	free(b.send);
	free(b.recv);
	free(b.reqs);
	return rc;
}
