/* loop: the state of one worker's training loop (train.c) and what its
 * parts share: metrics.c (log lines and metrics records), step.c (one
 * optimizer step, eager or under --graphs), eval.c (evaluation and
 * validation), calib.c (fp8 inference's calibration and report), loop.c
 * (errors, the metrics file, the evaluation batch, where the worker is).
 * The calls go one way: train.c calls the others, which call loop.c. */
#ifndef HPU_LOOP_H
#define HPU_LOOP_H

#include <cJSON.h>
#include <hpu/coll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "options/config.h"
#include "proto/status.h"
#include "worker/hpu/model.h"
#include "worker/runtime/graphs.h"
#include "worker/runtime/loader.h"
#include "worker/runtime/quant.h"
#include "worker/runtime/save_resume.h"
#include "worker/strategy/strategy.h"

/* Everything one worker's loop owns. */
typedef struct loop {
	hpu_builder *b;
	hpucoll_comm *comm;
	const hpu_train_opts *o;
	int rank, world;
	int micro, accum;        /* micro-batch per rank, micro-steps per step
				  * (micro: at most the data's rows where no
				  * step trains) */
	int no_steps;            /* --eval-only or --max-steps 0: no step */
	hpu_batch eval_bt;       /* evaluation's own batch buffers */
	uint32_t *eval_idx;
	hpu_loader *loader;      /* training micro-batches, one ahead */
	uint32_t *perm;
	size_t ntrain;           /* training samples: the training split less
				  * the --val-fraction slice */
	uint32_t *val_map;       /* --val-fraction: the training split's
				  * samples, training ones first, or NULL */
	size_t nval;             /* --val-fraction: held out, after the
				  * ntrain in val_map (samples between
				  * them, where they overlap, are neither) */
	hpu_strat *st;
	hpu_early_stop es;       /* --early-stop, when es.patience > 0 */
	int es_metric;           /* the watched metric's index; -1: the loss */
	double es_best;          /* its best value so far (NAN: none yet) */
	long es_best_step, es_wait; /* ... at which step; validations since */
	int stop_early;          /* the rule says stop (every rank alike) */
	long vstep;              /* the last validation's step (0: none) */
	long eval_step;          /* an evaluation's ctx->step: the steps
				  * done (hpu.h), from the resumed one */
	double vloss, vmetric[HPU_MAX_IO]; /* ... and its figures */
	hpu_run_pos pos;         /* where the run starts (resumed or 0); its
				  * schedule */
	int epochs;              /* --epochs, or as many as --max-steps takes */
	int epoch;               /* the epoch of the last step trained (from 0),
				  * for progress records */
	uint64_t comm_bytes;     /* sent by the steps' collectives */
	long bad_seen;           /* skipped steps already said */
	long skipped0;           /* the strategy's skipped steps when this run began */
	FILE *metrics;
	hpu_quant quant;         /* QUANT_CONFIG (fp8 inference) */
	hpu__graphs *graphs;     /* --graphs, or NULL */
	char prof_name[600];     /* --profile: the traces' name (a restart's
				  * attempt in it) */
	char *err;
	size_t errlen;
} loop;

/* The test loss and the metrics over all ranks' shares of the test
 * split: means over the samples, into ev. */
typedef struct evalres {
	double loss, metric[HPU_MAX_IO], count;
} evalres;

/* ---- loop.c ---- */

/* Where this worker is, for its agent (hpu__train_announce, train.h):
 * the latest record, kept current. */
extern hpu_status_rec hpu__where;

/* Sends hpu__where: at once when forced or when its phase changed. */
void hpu__where_report(int force);

/* This rank's progress, for the agent's progress bar and status table. */
void hpu__loop_report(loop *L, long step, long total, int epoch, float loss, double sps,
		      double eta, int phase, int force);

/* Puts the sentence in L->err; returns -1. */
int hpu__loop_fail(loop *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "WHAT failed: " the collective's error rc in L->err; returns -1. */
int hpu__loop_coll_fail(loop *L, const char *what, int rc);

/* Fetches the samples (done + i) * world + rank, i < n, of a split into
 * L->eval_bt; through map when not NULL. Returns 0 or -1. */
int hpu__loop_load_eval_batch(loop *L, hpu_split split, const uint32_t *map, size_t done,
			      int n);

/* A rank with a batch fewer than rank 0's (`most` samples to its `mine`)
 * runs one uncounted forward more where forwards meet the other ranks
 * (zero3's gathers). Returns 0 or -1. */
int hpu__loop_forward_even(loop *L, hpu_split split, const uint32_t *map, size_t most,
			   size_t mine);

/* Writes record j (freed) to the metrics file, flushed. Returns 0 or -1. */
int hpu__loop_print_json(loop *L, cJSON *j);

/* ---- eval.c ---- */

/* The test split evaluated, every rank together: its figures into ev. */
int hpu__loop_evaluate(loop *L, evalres *ev);

/* --val-fraction, --early-stop and --keep-best checked and set up. */
int hpu__loop_val_setup(loop *L);

/* A resumed run's --early-stop count, from its checkpoint. */
void hpu__loop_early_resume(loop *L);

/* Validation after `step` steps of epoch e (from 0): logged and recorded. */
int hpu__loop_validate(loop *L, long step, int e);

/* ---- calib.c ---- */

/* fp8 inference, MEASURE: the calibration passes and the measurement file. */
int hpu__loop_calibrate(loop *L);

/* QUANTIZE, after the evaluation: what ran quantized (rank 0 says it). */
void hpu__loop_quant_report(loop *L);

/* ---- step.c ---- */

/* Asks the loader for micro-batch k of global batch s. */
void hpu__loop_prefetch(loop *L, size_t s, int k);

/* HPU_STRICT_STEP=1: the training steps made recordable. */
void hpu__loop_strict_step(loop *L);

/* --graphs: the steps recordable, the recordings' input buffers. */
int hpu__loop_graphs_setup(loop *L);

/* --graphs under --verbose: how the steps and evaluation batches ran. */
void hpu__loop_graphs_said(loop *L);

/* One optimizer step on global batch s (step gstep of the run, from 0);
 * the next micro-batch asked for (of batch s + 1 where `more`). */
int hpu__loop_train_step(loop *L, size_t s, long gstep, int more, float *loss_out,
			 double *norm_out);

/* hpu__loop_train_step under --graphs: recorded, replayed or eager. */
int hpu__loop_graph_step(loop *L, size_t s, long gstep, int more, float *loss_out,
			 double *norm_out);

/* --verbose: the bytes step `step` copied between host and device. */
void hpu__loop_copied_log(const loop *L, long step, uint64_t h2d0, uint64_t d2h0, uint64_t waits0);

/* After step `step` (from 0): a skipped step said; too many in a row fail. */
int hpu__loop_skipped_check(loop *L, long step);

/* ---- metrics.c ---- */

/* Closes the metrics file at the end of a run. Returns 0 or -1. */
int hpu__loop_close_metrics(loop *L);

/* A log line and metrics record after `step` steps (every rank calls it);
 * sps NAN: within --throughput-warmup-steps, not measured ("samples/s -",
 * "samples_per_sec": null). */
int hpu__loop_log_step(loop *L, long step, long total, int epoch, float loss, double lr,
		       double norm, double sps);

/* The final line and record (every rank calls it; rank 0 writes). */
int hpu__loop_write_final(loop *L, long steps, float loss, double sps, const evalres *ev);

#endif
