/* strategy_eval.c: an evaluation's loss and metrics summed on the device
 * (strategy.h's hpu__strat_eval_*), for a recordable strategy: nothing
 * of an evaluation batch comes back to the host inside it, so that
 * --graphs can record it (train.c's evaluate_on, graphs.c), and the sums
 * are read once when the evaluation ends. The device's ops rows_add and
 * loss_add (device.h) do the host loop's arithmetic in its order, so the
 * sums are the doubles the host's would be, bit for bit. */
#include <string.h>

#include "worker/device/device.h"
#include "worker/strategy/strategy_impl.h"

/* The device's blocks, made once (before any recording). */
static int eval_alloc(hpu_strat *s)
{
	hpu_builder *b = s->b;
	size_t nl = (size_t)(b->nloss > 0 ? b->nloss : 1);
	size_t nacc = (size_t)b->nmetrics + 1, nh = nacc > nl ? nacc : nl;
	if (!(s->ev.acc = hpu__strat_dalloc(s, HPU_MEM_OTHER, nacc * sizeof(double),
					    "the evaluation's sums")) ||
	    !(s->ev.lsum = hpu__strat_dalloc(s, HPU_MEM_OTHER, nl * sizeof(double),
					     "the evaluation's loss sums")) ||
	    !(s->ev.w = hpu__strat_dalloc(s, HPU_MEM_OTHER, nl * sizeof(double),
					  "the losses' weights")) ||
	    !(s->ev.rows = hpu__strat_dalloc(s, HPU_MEM_OTHER, sizeof(int),
					     "the evaluation batch's rows")))
		return -1;
	if (!(s->ev.acc_host = hpu__dev_host_alloc(nh * sizeof(double))) ||
	    !(s->ev.rows_host = hpu__dev_host_alloc(sizeof(int))))
		return hpu__strat_fail(s, "out of host memory for the evaluation's sums");
	for (int k = 0; k < b->nloss; k++)
		s->ev.acc_host[k] = b->loss[k].weight;
	hpu__dev_h2d(NULL, s->ev.w, s->ev.acc_host, (size_t)b->nloss * sizeof(double));
	return 0;
}

int hpu__strat_eval_open(hpu_strat *s)
{
	if (!s->ev.rows_host && eval_alloc(s) < 0)
		return -1;
	hpu__dev_memset(NULL, s->ev.acc, 0, ((size_t)s->b->nmetrics + 1) * sizeof(double));
	s->ev.on = 1;
	return 0;
}

void hpu__strat_eval_rows(hpu_strat *s, int rows)
{
	*s->ev.rows_host = rows;
}

int hpu__strat_eval_add(hpu_strat *s)
{
	hpu_builder *b = s->b;
	size_t n = (size_t)s->ctx.batch;
	/* the rows from the pinned block: a replay reads it when it runs */
	hpu__dev_h2d(NULL, s->ev.rows, s->ev.rows_host, sizeof *s->ev.rows);
	hpu__dev_memset(NULL, s->ev.lsum, 0, (size_t)b->nloss * sizeof(double));
	for (int k = 0; k < b->nloss; k++)
		hpu__dev_rows_add(s->ev.lsum + k, s->t_data[b->loss[k].tensor], n, s->ev.rows);
	hpu__dev_loss_add(s->ev.acc, s->ev.lsum, s->ev.w, b->nloss, s->ev.rows);
	for (int k = 0; k < b->nmetrics; k++) {
		int t = b->metrics[k].tensor;
		if (hpu__act_expand(s, t, s->ctx.batch) < 0)
			return -1;
		hpu__dev_rows_add(s->ev.acc + 1 + k, s->t_data[t], n, s->ev.rows);
	}
	hpu__vars_checks_end(s);
	return 0;
}

int hpu__strat_eval_checks(hpu_strat *s)
{
	return hpu__vars_checks_result(s, "evaluation");
}

int hpu__strat_eval_close(hpu_strat *s, double *sums)
{
	size_t bytes = ((size_t)s->b->nmetrics + 1) * sizeof(double);
	s->ev.on = 0;
	hpu__dev_copy(s->ev.acc_host, s->ev.acc, bytes);
	memcpy(sums, s->ev.acc_host, bytes);
	return 0;
}
