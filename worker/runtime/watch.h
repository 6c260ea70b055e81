/* watch: --hang-warning. A thread that warns once, on stderr, when a
 * training step, an evaluation, a checkpoint save or the model's hooks
 * have run longer than
 * the limit, saying where the rank is: the layer and pass its ops run
 * for, or none (the model's own code, a hook, a collective's wait). A
 * forward that loops for ever on every rank used to hang with nothing
 * said: no collective waits for a missing peer there, so no stall
 * warning came. The work goes on; the warning only says so. */
#ifndef HPU_RUNTIME_WATCH_H
#define HPU_RUNTIME_WATCH_H

#include "worker/hpu/model.h"

typedef enum hpu_watch_what {
	HPU_WATCH_STEP = 0,  /* training step `step` (from 1) */
	HPU_WATCH_VALIDATE,  /* the validation after step `step` */
	HPU_WATCH_EVALUATE,  /* the evaluation on the test split */
	HPU_WATCH_SAVE,      /* the checkpoint of step `step` */
	HPU_WATCH_HOOK,      /* the model's hooks after training */
	HPU_WATCH_EVAL_HOOK, /* the model's hooks after the evaluation */
} hpu_watch_what;

/* Starts the thread for rank `rank` of model b (its layers' names),
 * warning after `secs` seconds (0: no thread). Returns 0, or -1 where the
 * thread could not start (the run goes on without it, said once). */
int hpu__watch_start(double secs, int rank, const hpu_builder *b);

/* Marks the beginning and the end of one watched piece of work. */
void hpu__watch_begin(hpu_watch_what what, long step);
void hpu__watch_end(void);

/* Stops the thread (safe where none runs). */
void hpu__watch_stop(void);

#endif
