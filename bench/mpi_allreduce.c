/* mpi-allreduce: MPI_Allreduce (float, sum) timed as hpucoll-bench times
 * its all_reduce, the peer it is measured against.
 *
 *   mpirun -np N mpi-allreduce [-b minbytes] [-e maxbytes] [-f factor]
 *                              [-n iters] [-w warmup] [-c 0|1]
 *
 * For each size: warmup iterations, a barrier, iters timed iterations; the
 * time is the mean per iteration, the maximum over ranks (MPI_MAX of each
 * rank's mean). Out-of-place, then in-place (MPI_IN_PLACE). busbw =
 * algbw * 2(n-1)/n. With -c 1, a further untimed iteration per group with
 * fresh inputs is checked element by element (small integers: exact). */
#include "bench/bench_common.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, nranks;

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: mpi-allreduce [-b minbytes] [-e maxbytes] [-f factor] "
	        "[-n iters] [-w warmup] [-c 0|1]\n");
}

static int parse(int argc, char **argv, struct bench_opts *o)
{
	int c, bad = 0;
	while ((c = getopt(argc, argv, "b:e:f:n:w:c:h")) != -1) {
		switch (c) {
		case 'h':
			if (rank == 0)
				usage(stdout);
			MPI_Finalize();
			exit(0);
		default:
			if (!bench_common_opt(o, c, optarg, &bad))
				bad = 1;
		}
	}
	if (bad || optind != argc || o->factor < 2 || o->check > 1 ||
	    o->maxbytes < o->minbytes) {
		if (rank == 0)
			usage(stderr);
		return -1;
	}
	return 0;
}

/* One all-reduce of `count` floats; in place when send == recv. */
static void allreduce(float *send, float *recv, size_t count)
{
	const void *s = send == recv ? MPI_IN_PLACE : send;
	MPI_Allreduce(s, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

/* Rank-max of the mean time in microseconds of `iters` all-reduces. */
static double timed(float *send, float *recv, size_t count,
                    const struct bench_opts *o)
{
	for (int i = 0; i < o->warmup; i++)
		allreduce(send, recv, count);
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (int i = 0; i < o->iters; i++)
		allreduce(send, recv, count);
	double us = (MPI_Wtime() - t0) / o->iters * 1e6, max;
	MPI_Allreduce(&us, &max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	return max;
}

static float value(size_t i, int r)
{
	return (float)((long)((i * 7 + (size_t)r * 3) % 11) - 5);
}

/* Wrong elements, summed over ranks, of one all-reduce on fresh inputs. */
static long check(float *send, float *recv, size_t count)
{
	for (size_t i = 0; i < count; i++) {
		recv[i] = 100.0f;
		send[i] = value(i, rank);
	}
	allreduce(send, recv, count);
	long wrong = 0, total;
	for (size_t i = 0; i < count; i++) {
		float want = 0;
		for (int r = 0; r < nranks; r++)
			want += value(i, r);
		wrong += recv[i] != want;
	}
	MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	return total;
}

int main(int argc, char **argv)
{
	struct bench_opts o;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	bench_opts_default(&o);
	if (parse(argc, argv, &o)) {
		MPI_Finalize();
		return 2;
	}
	size_t maxcount = o.maxbytes / sizeof(float);
	float *send = malloc((maxcount + 1) * sizeof *send);
	float *recv = malloc((maxcount + 1) * sizeof *recv);
	if (!send || !recv)
		MPI_Abort(MPI_COMM_WORLD, 1);
	memset(send, 0, (maxcount + 1) * sizeof *send);
	memset(recv, 0, (maxcount + 1) * sizeof *recv);
	int version_len;
	char version[MPI_MAX_LIBRARY_VERSION_STRING];
	MPI_Get_library_version(version, &version_len);
	if (rank == 0) {
		printf("# mpi-allreduce: MPI_Allreduce float sum, %d ranks, "
		       "%.*s\n",
		       nranks, (int)strcspn(version, ",\n"), version);
		bench_print_heads(stdout, &o, 2);
	}
	double factor = 2.0 * (nranks - 1) / nranks, sum = 0;
	int rows = 0;
	long wrong = 0;
	for (size_t n = o.minbytes; n <= o.maxbytes; n *= o.factor) {
		size_t count = n / sizeof(float), bytes = count * sizeof(float);
		double t_out = timed(send, recv, count, &o);
		long w_out = o.check ? check(send, recv, count) : -1;
		double t_in = timed(recv, recv, count, &o);
		long w_in = o.check ? check(recv, recv, count) : -1;
		wrong += (w_out > 0 ? w_out : 0) + (w_in > 0 ? w_in : 0);
		if (rank == 0) {
			bench_print_row(stdout, bytes, count, "float", "sum",
			                -1);
			bench_print_group(stdout, t_out, bytes, factor, w_out);
			bench_print_group(stdout, t_in, bytes, factor, w_in);
			printf("\n");
			fflush(stdout);
		}
		sum += bench_busbw(bytes, t_out, factor) +
		       bench_busbw(bytes, t_in, factor);
		rows += 2;
		if (n > o.maxbytes / o.factor)
			break;
	}
	if (rank == 0) {
		printf("# Out of bounds values : %ld %s\n", wrong,
		       wrong ? "FAILED" : "OK");
		printf("# Avg bus bandwidth    : %g\n",
		       rows ? sum / rows : 0.0);
	}
	free(send);
	free(recv);
	MPI_Finalize();
	return wrong ? 1 : 0;
}
