/* Started by hpulaunch --exec: joins the job from the environment, then
 * checks all_reduce (sum, avg) on odd counts, broadcast and barrier
 * against exact expected values. Exits 0 if every element is right. */
#include <hpu/coll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_all_reduce(hpucoll_comm *c, size_t n, hpucoll_op op)
{
	int r = hpucoll_comm_rank(c), w = hpucoll_comm_size(c);
	float *x = malloc((n ? n : 1) * sizeof *x);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)((i % 13) + r); /* small integers: exact sums */
	int rc = hpucoll_all_reduce(c, x, x, n, HPUCOLL_F32, op);
	if (rc) {
		fprintf(stderr, "all_reduce(%zu): %s\n", n, hpucoll_comm_errmsg(c));
		free(x);
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		double want = (double)(i % 13) * w + (double)w * (w - 1) / 2;
		if (op == HPUCOLL_AVG)
			want /= w;
		if (x[i] != (float)want) {
			fprintf(stderr, "all_reduce(%zu) op %d: x[%zu] = %g, want %g\n", n,
				(int)op, i, x[i], want);
			free(x);
			return 1;
		}
	}
	free(x);
	return 0;
}

int main(void)
{
	char err[512];
	hpucoll_comm *c = NULL;
	if (hpucoll_comm_init_env(&c, err, sizeof err)) {
		fprintf(stderr, "init: %s\n", err);
		return 1;
	}
	static const size_t counts[] = {0, 1, 2, 7, 4099, 1000003};
	int bad = 0;
	for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
		bad |= check_all_reduce(c, counts[k], HPUCOLL_SUM) |
		       check_all_reduce(c, counts[k], HPUCOLL_AVG);
	char msg[32] = "";
	if (hpucoll_comm_rank(c) == 0)
		strcpy(msg, "from rank zero");
	if (hpucoll_broadcast(c, msg, msg, sizeof msg, HPUCOLL_U8, 0) ||
	    strcmp(msg, "from rank zero")) {
		fprintf(stderr, "broadcast: got '%s'\n", msg);
		bad = 1;
	}
	if (hpucoll_barrier(c)) {
		fprintf(stderr, "barrier: %s\n", hpucoll_comm_errmsg(c));
		bad = 1;
	}
	if (!bad)
		printf("coll ok: rank %d of %d\n", hpucoll_comm_rank(c), hpucoll_comm_size(c));
	hpucoll_comm_destroy(&c);
	return bad;
}
