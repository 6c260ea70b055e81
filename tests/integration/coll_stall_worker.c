/* Started by hpulaunch --exec for test_coll_stall: joins the job from the
 * environment and runs a few small collectives, one rank sleeping before
 * one of them, so that the others' stall warnings have something to name.
 *
 *   coll_stall_worker MODE SLEEPER SLEEP_MS [STALL_MS]
 *
 * MODE late:   #1 all_reduce; SLEEPER sleeps; #2 all_reduce.
 * MODE behind: #1 all_reduce; SLEEPER sleeps; #2 broadcast from rank 0;
 *              #3 all_reduce. The ranks after SLEEPER in the broadcast
 *              wait in #2 while the others are already in #3.
 * MODE frozen: #1 all_reduce; #2 a large all_reduce started
 *              asynchronously, during which SLEEPER stops itself
 *              (SIGSTOP) after SLEEP_MS: frozen in the middle of #2,
 *              with part of its data sent. The others time out.
 * STALL_MS, when given, is set with hpucoll_comm_set_stall_warning (else
 * HPUCOLL_STALL_WARN_MS applies).
 *
 * Each rank checks every result and prints "rank R done" at the end, or
 * "rank R: ... failed: <errmsg>" and exits 1. */
#include <hpu/coll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N 1024

static int fail(hpucoll_comm *c, int r, const char *what, int rc)
{
	printf("rank %d: %s failed: %s (%s)\n", r, what, hpucoll_comm_errmsg(c),
	       hpucoll_strerror(rc));
	return 1;
}

/* all_reduce of N floats of (rank + 1): each must be the sum 1 + ... + ws. */
static int sum(hpucoll_comm *c, int r, int ws, int n)
{
	static float x[N], y[N];
	float want = (float)(ws * (ws + 1) / 2);
	int rc;

	for (int i = 0; i < N; i++)
		x[i] = (float)(r + 1);
	rc = hpucoll_all_reduce(c, x, y, N, HPUCOLL_F32, HPUCOLL_SUM);
	if (rc != HPUCOLL_OK)
		return fail(c, r, "all_reduce", rc);
	for (int i = 0; i < N; i++)
		if (y[i] != want) {
			printf("rank %d: all_reduce #%d: element %d is %g, "
			       "want %g\n",
			       r, n, i, (double)y[i], (double)want);
			return 1;
		}
	printf("rank %d all_reduce #%d ok\n", r, n);
	return 0;
}

static int bcast(hpucoll_comm *c, int r)
{
	int v[16];
	int rc;

	for (int i = 0; i < 16; i++)
		v[i] = r == 0 ? 42 + i : -1;
	rc = hpucoll_broadcast(c, v, v, 16, HPUCOLL_I32, 0);
	if (rc != HPUCOLL_OK)
		return fail(c, r, "broadcast", rc);
	for (int i = 0; i < 16; i++)
		if (v[i] != 42 + i) {
			printf("rank %d: broadcast: element %d is %d, want "
			       "%d\n",
			       r, i, v[i], 42 + i);
			return 1;
		}
	printf("rank %d broadcast #2 ok\n", r);
	return 0;
}

/* #2 of MODE frozen: 16M floats, so that SLEEPER stops inside it. */
static int frozen(hpucoll_comm *c, int r, int sleeper, int sleep_ms)
{
	size_t n = (size_t)16 << 20;
	float *x = calloc(n, sizeof(float));
	hpucoll_req *req = NULL;
	int rc;

	if (x == NULL)
		return 1;
	rc = hpucoll_iall_reduce(c, x, x, n, HPUCOLL_F32, HPUCOLL_SUM, &req);
	if (rc == HPUCOLL_OK && r == sleeper) {
		usleep((useconds_t)sleep_ms * 1000);
		printf("rank %d stops now\n", r);
		raise(SIGSTOP);
	}
	if (rc == HPUCOLL_OK)
		rc = hpucoll_wait(&req);
	free(x);
	if (rc != HPUCOLL_OK)
		return fail(c, r, "all_reduce #2", rc);
	printf("rank %d all_reduce #2 ok\n", r);
	return 0;
}

int main(int argc, char **argv)
{
	hpucoll_comm *c = NULL;
	char err[512];
	int bad = 1;

	if (argc < 4 ||
	    (strcmp(argv[1], "late") && strcmp(argv[1], "behind") &&
	     strcmp(argv[1], "frozen"))) {
		fprintf(stderr, "usage: coll_stall_worker late|behind|frozen SLEEPER "
		                "SLEEP_MS [STALL_MS]\n");
		return 2;
	}
	int sleeper = atoi(argv[2]), sleep_ms = atoi(argv[3]);
	int behind = !strcmp(argv[1], "behind");

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (hpucoll_comm_init_env(&c, err, sizeof err) != HPUCOLL_OK) {
		fprintf(stderr, "init: %s\n", err);
		return 1;
	}
	if (argc > 4)
		hpucoll_comm_set_stall_warning(c, atoi(argv[4]));
	int r = hpucoll_comm_rank(c), ws = hpucoll_comm_size(c);

	if (sum(c, r, ws, 1))
		goto out;
	if (!strcmp(argv[1], "frozen")) {
		bad = frozen(c, r, sleeper, sleep_ms);
		goto out;
	}
	if (r == sleeper)
		usleep((useconds_t)sleep_ms * 1000);
	if (behind ? bcast(c, r) || sum(c, r, ws, 3) : sum(c, r, ws, 2))
		goto out;
	printf("rank %d done\n", r);
	bad = 0;
out:
	hpucoll_comm_destroy(&c);
	return bad;
}
