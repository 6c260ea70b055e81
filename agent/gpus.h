/* gpus: --devices auto on a node whose workers compute on GPUs (hpulaunch
 * and hpud's devices = auto).
 *
 * With --device cuda, or auto where the CUDA device loads and sees a GPU,
 * --devices auto is one worker per GPU visible to this node
 * (CUDA_VISIBLE_DEVICES honoured, as CUDA itself counts); otherwise one
 * per CPU core. hpulaunch and hpud (devices = auto) link nothing of CUDA:
 * they ask the hpu-worker beside them, or hpud's worker program
 * ("hpu-worker --count-gpus", which loads the CUDA device's module,
 * worker/device) and read the count, or the reason there is none, from
 * its output. */
#ifndef HPU_AGENT_GPUS_H
#define HPU_AGENT_GPUS_H

#include <stddef.h>

/* What --devices auto is counted by. */
typedef enum hpu__count_by {
	HPU_COUNT_CORES = 0, /* --device cpu, cpu-strict: the CPU cores */
	HPU_COUNT_GPUS,      /* --device cuda: the GPUs, and none is an error */
	HPU_COUNT_EITHER,    /* --device auto: the GPUs where there are any, else cores */
} hpu__count_by;

/* Runs "`worker` --count-gpus" and reads its answer: the number of GPUs
 * into *ngpus (>= 1), or *ngpus 0 with the reason there is none in why
 * (the worker's sentence, or why the worker did not answer). Returns 0;
 * -1 only where the worker cannot be started (why says so). */
int hpu__gpus_count(const char *worker, int *ngpus, char *why, size_t whylen);

/* The workers --devices auto gives, into *devices: by `by`, from the GPUs
 * counted (ngpus, with `why` where 0) and the node's cores. Returns 0, or
 * -1 with one sentence in err (--device cuda without a GPU). Pure: the
 * count is the caller's. */
int hpu__gpus_devices(hpu__count_by by, int ngpus, const char *why, long cores, int *devices,
		      char *err, size_t errlen);

#endif
