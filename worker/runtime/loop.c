/* loop: what the parts of a worker's training loop share (loop.h): its
 * errors, the metrics file's records, the evaluation batch (and the
 * forward that evens the ranks' collectives), and where the worker is,
 * for its agent. */
#include "worker/runtime/loop.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fileio.h"
#include "proto/status.h"
#include "worker/hpu/devmem.h"
#include "worker/runtime/train.h"

/* Where this worker is, for its agent: the latest record, kept current
 * (a step under way has `step` steps done), which an exit() in the middle
 * (a model that leaves) reports on its way out, so that the agent says
 * where it left rather than where the last rate-limited record was. */
hpu_status_rec hpu__where = {.phase = HPU_PHASE_SETUP, .epoch = 1, .loss = NAN, .eta_s = -1};
/* (no loss yet, ETA unknown: the bar showed "epoch 0/1 ... loss 0.0000
 * ETA 0:00:00" through the whole first step) */
static int where_live;        /* the run is under way: report at exit */
static int where_said = -1;   /* the phase of the last record sent */

static void where_at_exit(void)
{
	if (where_live)
		hpu__status_report(&hpu__where, 1);
}

/* Sends `hpu__where`: at once when forced or when its phase changed. */
void hpu__where_report(int force)
{
	force |= hpu__where.phase != where_said;
	where_said = hpu__where.phase;
	hpu__status_report(&hpu__where, force);
}

void hpu__train_announce(const hpu_train_opts *o)
{
	hpu__where.total = o->max_steps > 0 ? o->max_steps : 0;
	/* --max-steps decides the epochs once the data's size is known: none
	 * said until then (not --epochs') */
	hpu__where.epochs = o->max_steps >= 0 ? 0 : o->epochs;
	hpu__where.phase = HPU_PHASE_SETUP;
	if (!where_live)
		atexit(where_at_exit);
	where_live = 1;
	hpu__where_report(1);
}

int hpu__loop_fail(loop *L, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(L->err, L->errlen, fmt, ap);
	va_end(ap);
	return -1;
}

int hpu__loop_coll_fail(loop *L, const char *what, int rc)
{
	snprintf(L->err, L->errlen, "%s failed: %s", what, hpucoll_comm_why(L->comm, rc));
	return -1;
}

/* Fetches the samples (done + i) * world + rank, i < n, of a split into
 * the evaluation batch; through map (the held-out slice) when not NULL. */
int hpu__loop_load_eval_batch(loop *L, hpu_split split, const uint32_t *map, size_t done, int n)
{
	size_t bad;
	for (int i = 0; i < n; i++) {
		size_t k = (done + (size_t)i) * (size_t)L->world + (size_t)L->rank;
		L->eval_idx[i] = map ? map[k] : (uint32_t)k;
	}
	if (hpu__batch_fetch(&L->b->data[split], L->eval_idx, n, &L->eval_bt, &bad) < 0)
		return hpu__loop_fail(L, "the model's dataset failed to fetch sample %zu of its %s "
				      "split (its fetch returned non-zero)",
				      bad, split == HPU_SPLIT_TEST ? "test" : "training");
	return 0;
}

/* The sampler leaves a rank one sample short of rank 0 where the
 * ranks do not split a split evenly; at a multiple of the micro-batch
 * that is a batch fewer than `most`, rank 0's count. Where a forward
 * meets the other ranks (zero3's gathers) such a rank runs one forward
 * more, on the split's first sample, its figures not counted (and not
 * measured: the caller's measurement is closed), so that every rank
 * calls the same collectives. */
int hpu__loop_forward_even(loop *L, hpu_split split, const uint32_t *map, size_t most, size_t mine)
{
	size_t mb = (size_t)L->micro;
	if (!hpu__strat_forward_meets(L->st) || (mine + mb - 1) / mb >= (most + mb - 1) / mb)
		return 0;
	L->eval_idx[0] = map ? map[0] : 0;
	size_t bad;
	if (hpu__batch_fetch(&L->b->data[split], L->eval_idx, 1, &L->eval_bt, &bad) < 0)
		return hpu__loop_fail(L, "the model's dataset failed to fetch sample %zu of its %s "
				      "split (its fetch returned non-zero)",
				      bad, split == HPU_SPLIT_TEST ? "test" : "training");
	return hpu__strat_forward(L->st, &L->eval_bt, 0, 1, -1);
}

/* Writes record j (freed) to the metrics file (unbuffered): a file that
 * cannot be written (a full disk) fails the run, naming it, and ends with
 * its last whole record (hpu__append_line). */
int hpu__loop_print_json(loop *L, cJSON *j)
{
	char *s = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	if (!s)
		return hpu__loop_fail(L, "out of memory writing the metrics file %s", L->o->metrics);
	int bad = hpu__append_line(L->metrics, s) < 0, e = errno;
	free(s);
	if (bad)
		return hpu__loop_fail(L, "cannot write the metrics file %s: %s", L->o->metrics, strerror(e));
	return 0;
}

/* This rank's progress, for the agent's progress bar and status table
 * (rate-limited in hpu__status_report unless forced or a new phase). */
void hpu__loop_report(loop *L, long step, long total, int epoch, float loss, double sps,
		      double eta, int phase, int force)
{
	hpu_device_stats d;
	hpu__devmem_stats(&d);
	hpu__where = (hpu_status_rec){
		.step = step, .total = total, .epoch = epoch + 1, .epochs = L->epochs,
		.loss = loss, .samples_per_sec = sps, .eta_s = eta, .mem_in_use = d.in_use,
		.mem_max = d.max_in_use, .mem_limit = d.limit, .phase = phase,
	};
	where_live = phase != HPU_PHASE_DONE;
	hpu__where_report(force);
}
