/* graphs: --graphs (issue 36), HPU graphs for training. After
 * --graphs-warmup eager steps, a training step is recorded once per
 * batch shape (the micro-batches' sizes) with the device's recording
 * (device.h: hpu__dev_capture_begin .. _end; a CUDA graph, or the CPU's
 * twin on cpu and cpu-strict) and replayed every later step of that shape: the
 * host copies the micro-batches into the recording's input buffers,
 * puts the step's learning rate into the pinned block it reads, launches
 * it and reads the step's results after it (hpu__strat_step_result).
 * The micro-batches' sample indices are pinned too: a recorded step's
 * dropout copies them to the device (worker/ops/dropkeys.h).
 * A shape whose step cannot be recorded (the device's reason, or the
 * runtime's: collectives through the host, a host-only layer, dropout
 * keys a custom layer drew on the host, fp8) runs eagerly, said once under --verbose; a device
 * that records nothing makes every step eager, said once as a warning.
 *
 * The steps are recordable (hpu__strat_set_recordable) from the first
 * one, so that the eager steps compute what the replays compute, bit for
 * bit. */
#ifndef HPU_GRAPHS_H
#define HPU_GRAPHS_H

#include <stddef.h>
#include <stdint.h>

#include "worker/strategy/strategy.h"

typedef struct hpu__graphs hpu__graphs;

/* How one step is to run. */
typedef enum hpu__graph_mode {
	HPU__GRAPH_EAGER = 0, /* the host code runs the step on the device */
	HPU__GRAPH_RECORD,    /* record it now (then launch, or run it eagerly) */
	HPU__GRAPH_REPLAY,    /* launch the shape's recording */
} hpu__graph_mode;

/* For `accum` micro-steps of up to `micro` samples of the training
 * set's fields (fields, field_bytes[f] bytes a sample). 0, or -1 with a
 * sentence in err. */
int hpu__graphs_new(hpu__graphs **out, int warmup, int accum, int micro, int fields,
		    const size_t *field_bytes, int rank, int verbose, char *err, size_t errlen);
void hpu__graphs_free(hpu__graphs **g);

/* Micro-step k's batch bt (the loader's) for the step: its sample
 * indices copied into the input buffers, and its fields too where the
 * step has several micro-steps (the loader writes bt's buffer again
 * before the step's end). With one micro-step bt stays the loader's
 * until the step's end: its fields follow by hpu__graphs_input_fill
 * where the step records or runs eagerly, or a replay reads them where
 * the loader put them (hpu__graphs_launch). Returns the batch the
 * step's forward reads (the input buffers: the same addresses every
 * step). */
const hpu_batch *hpu__graphs_input(hpu__graphs *g, int k, const hpu_batch *bt);

/* The batches hpu__graphs_input returns, micro-step k's at [k] (accum of
 * them, the same every step). */
const hpu_batch *const *hpu__graphs_inputs(const hpu__graphs *g);

/* This step's fields copied into the input buffers, where
 * hpu__graphs_input left them out (once a step). */
void hpu__graphs_input_fill(hpu__graphs *g);

/* Before a replay (hpu__graphs_launch calls it too; once a step): the
 * step's batch where the replay reads it. With one micro-step the
 * recording's copies are pointed at the loader's buffer
 * (hpu__dev_graph_rebind), which the loader writes again only after the
 * step's result is read (step.c); a field none of whose copies can be
 * pointed there is copied into the input buffers, from then on (a
 * device's refusal said once, as a warning). 0, or -1 with a sentence in
 * err. */
int hpu__graphs_bind(hpu__graphs *g, char *err, size_t errlen);

/* Replays that read their batch where the loader put it (nothing copied
 * on the host). */
long hpu__graphs_bound(const hpu__graphs *g);

/* Once every micro-batch is in: how this step runs (`eager_only`: it
 * must run eagerly, e.g. --inject-overflow-step's step). */
hpu__graph_mode hpu__graphs_mode(hpu__graphs *g, long step, int eager_only);

/* The ranks did not all choose the same mode for this step (their
 * micro-batches' sizes differ): it runs eagerly; a recording it was to
 * make is given up for good (the shape stays eager), said under
 * --verbose. */
void hpu__graphs_mismatch(hpu__graphs *g, long step);

/* HPU__GRAPH_RECORD: start before the step's host code (0; -1 where the
 * device records nothing: the mode falls to eager for good, with a
 * warning on rank 0); end after hpu__strat_step, keeping the recording
 * (1: launch it now, as a replay) or its refusal (0: run the step
 * eagerly now; the shape stays eager). `agree` makes every rank's answer
 * the same (NULL at one rank): given this rank's (*who: -1 where its
 * recording was kept, else its rank; why: its reason), it answers the
 * lowest rank whose recording was refused (-1: none) and, only where one
 * was, that rank's reason in why (len bytes, the same on every rank), so
 * that rank 0 says which rank refused and why. -1 with err on a
 * failure. */
int hpu__graphs_record_begin(hpu__graphs *g, int agreed);
typedef int hpu__graphs_agree_fn(void *arg, int *who, char *why, size_t len);
/* After record_begin failed with `agreed` (the run's ranks agree on each
 * recording: world > 1): the other ranks may have begun theirs, and end
 * them with record_end's agreement; this rank takes part in it as the
 * one refused, with why the recording did not begin, so that every rank
 * runs the step eagerly, and says it once (the lowest such rank). From
 * then on this rank records nothing, and the steps' mode agreement makes
 * every rank run eagerly. 0, or -1 with err. */
int hpu__graphs_unbegun(hpu__graphs *g, long step, hpu__graphs_agree_fn *agree, void *arg,
			char *err, size_t errlen);
int hpu__graphs_record_end(hpu__graphs *g, hpu_strat *s, long step,
			   hpu__graphs_agree_fn *agree, void *arg, char *err, size_t errlen);

/* HPU__GRAPH_REPLAY (and after a kept recording): the strategy's state
 * restored, `lr` put in place, the recording launched. 0, or -1 with
 * err. */
int hpu__graphs_launch(hpu__graphs *g, hpu_strat *s, double lr, char *err, size_t errlen);

/* The recording this step launches, its calls counted by name
 * (hpu__dev_graph_names) as the inside of a JSON object
 * ("\"gemm\":6,\"optim\":4", at most 2 KiB: names past that counted
 * together as "(others)"), for the profiler's graph_replay range; ""
 * where the device names none or no recording is launched. */
const char *hpu__graphs_node_args(const hpu__graphs *g);

/* Training steps replayed and run eagerly so far; their recordings
 * kept. eval_counts: the same of evaluation batches. */
void hpu__graphs_counts(const hpu__graphs *g, long *replayed, long *eager, int *recorded);
/* Of the steps hpu__graphs_counts says were replayed, those launched
 * from a recording that its check then refused (not among those kept). */
long hpu__graphs_dropped(const hpu__graphs *g);
void hpu__graphs_eval_counts(const hpu__graphs *g, long *replayed, long *eager, int *recorded);

/* Evaluation batches (forward only, train.c's evaluate_on), recorded
 * and replayed in the same cache as the training steps, keyed by their
 * size and by being an evaluation's. A size runs eagerly the first
 * `warmup` times it is seen (counted per size, across evaluations), then
 * the next batch of that size is recorded. Every rank decides alone (the
 * ranks' last batches differ in size): zero3's gathers in an evaluation's
 * forward are host calls of its recording, which run at the launch right
 * after it, so a rank replaying a batch and one running it eagerly meet
 * the same collectives in the same order.
 *
 * eval_input: the batch copied into micro-step 0's input buffers, its
 * rows from bt->n up to pad_to (at most the micro-batch) filled with
 * copies of its first sample (--pad-last-batch; pad_to <= bt->n: none);
 * the batch returned holds them (n = pad_to). eval_mode: how the batch
 * of n rows runs. eval_begin, eval_end, eval_launch: as record_begin,
 * record_end (no agreement between ranks: a refusal is said by the rank
 * that refused, naming itself where it is not rank 0) and launch (the
 * learning rate left alone; a failure says an evaluation batch's
 * recording); said as "graphs: evaluation: ..." under --verbose. */
const hpu_batch *hpu__graphs_eval_input(hpu__graphs *g, const hpu_batch *bt, int pad_to);
hpu__graph_mode hpu__graphs_eval_mode(hpu__graphs *g, int n, long step);
int hpu__graphs_eval_begin(hpu__graphs *g);
int hpu__graphs_eval_end(hpu__graphs *g, hpu_strat *s, char *err, size_t errlen);
int hpu__graphs_eval_launch(hpu__graphs *g, hpu_strat *s, char *err, size_t errlen);

#endif
