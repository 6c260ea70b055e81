/* calib: fp8 inference (QUANT_CONFIG, quant.h) in the loop (loop.h):
 * MEASURE's calibration passes, QUANTIZE's report. */
#include "worker/runtime/loop.h"

#include <stdio.h>

#include "worker/ops/fp8.h"
#include "worker/runtime/sampler.h"

/* fp8 inference, MEASURE: forward passes over --calibration-batches
 * batches of this rank's training samples (every world-th), recorded;
 * then the figures of all ranks go into the measurement file. */
int hpu__loop_calibrate(loop *L)
{
	const hpu_dataset *d = &L->b->data[HPU_SPLIT_TRAIN];
	size_t mine = hpu__sampler_eval_count(d->size, L->rank, L->world);
	size_t most = hpu__sampler_eval_count(d->size, 0, L->world);
	size_t want = (size_t)L->o->calib_batches * (size_t)L->micro;
	if (mine > want)
		mine = want;
	if (most > want)
		most = want;
	hpu__fp8_measuring(1);
	hpu__strat_set_pos(L->st, 0, L->eval_step, L->epoch);
	int rc = 0;
	for (size_t done = 0; done < mine && rc == 0;) {
		int n = (int)(mine - done < (size_t)L->micro ? mine - done : (size_t)L->micro);
		rc = hpu__loop_load_eval_batch(L, HPU_SPLIT_TRAIN, NULL, done, n) < 0 ||
				     hpu__strat_forward(L->st, &L->eval_bt, 0, 1, -1) < 0
			     ? -1
			     : 0;
		done += (size_t)n;
	}
	hpu__fp8_measuring(0);
	if (rc || hpu__loop_forward_even(L, HPU_SPLIT_TRAIN, NULL, most, mine) < 0)
		return -1;
	float count = (float)mine;
	int crc = hpucoll_all_reduce(L->comm, &count, &count, 1, HPUCOLL_F32, HPUCOLL_SUM);
	if (crc)
		return hpu__loop_coll_fail(L, "calibration all-reduce", crc);
	if (hpu__quant_save(&L->quant, L->comm, L->b->path, count, L->err, L->errlen) < 0)
		return -1;
	if (L->rank == 0)
		printf("fp8 measurement: %d ops over %.0f training samples -> %s\n",
		       hpu__fp8_count(), count, L->quant.stats);
	return 0;
}

/* QUANTIZE, after the evaluation: what ran quantized, and figures the
 * model never used (a different model measured?). */
void hpu__loop_quant_report(loop *L)
{
	int n = hpu__fp8_count(), q = 0, unused = 0;
	const char *first = NULL;
	hpu_fp8_info in;
	for (int i = 0; i < n; i++) {
		hpu__fp8_info_get(i, &in);
		if (in.used)
			q++;
		else if (unused++ == 0)
			first = in.name;
	}
	if (L->rank != 0)
		return;
	printf("fp8 quantization: %d of %d measured ops ran in fp8 (E4M3) from %s\n", q, n,
	       L->quant.stats);
	if (unused)
		printf("warning: %d ops in %s were never called quantized (%s%s): "
		       "blocklisted, or measured on another model\n",
		       unused, L->quant.stats, first, unused > 1 ? ", ..." : "");
}
