/* Started by hpulaunch --exec for test_coll_faults: joins the job from the
 * environment, prints "rank R pid P ready", then runs large all-reduces in
 * a loop (32M floats unless argv[1] says how many), printing "rank R
 * iteration I ok" after each, until one fails; then it prints
 * "rank R: all_reduce failed: <errmsg>" and exits 1.
 *
 * SIGTERM is blocked, here and so in the library's threads: when one rank
 * is killed, hpulaunch sends SIGTERM to the others at once and SIGKILL 2 s
 * later. With SIGTERM blocked, each survivor keeps running until its
 * collective has returned the error and the error is printed (or until the
 * SIGKILL), so the test sees what every rank's collective reported, and a
 * signal arriving mid-wait cannot turn that error into an EINTR one. */
#include <hpu/coll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 32u << 20;
	hpucoll_comm *c = NULL;
	sigset_t term;
	char err[512];

	sigemptyset(&term);
	sigaddset(&term, SIGTERM);
	sigprocmask(SIG_BLOCK, &term, NULL);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (hpucoll_comm_init_env(&c, err, sizeof err) != HPUCOLL_OK) {
		fprintf(stderr, "init: %s\n", err);
		return 1;
	}
	int r = hpucoll_comm_rank(c), ws = hpucoll_comm_size(c), bad = 1;
	float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
	if (!x || !y) {
		fprintf(stderr, "rank %d: out of memory\n", r);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(r + 1);
	printf("rank %d pid %d ready\n", r, (int)getpid());
	float want = (float)(ws * (ws + 1) / 2);
	for (long it = 1; it <= 100000; it++) {
		int rc =
		    hpucoll_all_reduce(c, x, y, n, HPUCOLL_F32, HPUCOLL_SUM);
		if (rc != HPUCOLL_OK) {
			printf("rank %d: all_reduce failed: %s (%s)\n", r,
			       hpucoll_comm_errmsg(c), hpucoll_strerror(rc));
			goto out;
		}
		if (y[0] != want || y[n / 2] != want || y[n - 1] != want) {
			printf(
			    "rank %d: iteration %ld: wrong sum %g, want %g\n",
			    r, it, (double)y[n / 2], (double)want);
			goto out;
		}
		printf("rank %d iteration %ld ok\n", r, it);
	}
	bad = 0;
out:
	hpucoll_comm_destroy(&c);
	free(x);
	free(y);
	return bad;
}
