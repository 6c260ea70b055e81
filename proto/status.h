/* status: a worker's live progress, for its agent (hpulaunch's progress
 * bar, hpud's and `hpulaunch --status`'s per-rank table).
 *
 * The agent gives each worker a pipe (HPU_STATUS_FD in its environment);
 * hpu__status_report() writes one record to it. Without that variable it
 * does nothing, so a worker started by hand is unaffected. The record is
 * written and parsed here, so both sides read one definition. */
#ifndef HPU_STATUS_H
#define HPU_STATUS_H

#include <stdint.h>

#include "proto/hpu.pb-c.h"

typedef struct hpu_status_rec {
	long step, total;       /* optimizer steps done, of the run */
	int epoch, epochs;      /* 1-based epoch under way, of the run */
	double loss;            /* this rank's loss of its last step */
	double samples_per_sec; /* the run's throughput so far (0: none yet) */
	double eta_s;           /* seconds to the end (< 0: unknown) */
	uint64_t mem_in_use;    /* InUse, MaxInUse, Limit (bytes) */
	uint64_t mem_max;
	uint64_t mem_limit;
	int phase;              /* HPU_PHASE_* */
} hpu_status_rec;

/* SETUP: from the worker's start to its first training step (loading
 * the model, its setup(), the strategy's layout, a resume); step is where
 * training will start. SAVE: the checkpoint after step `step` is being
 * written. */
enum {
	HPU_PHASE_TRAIN = 0,
	HPU_PHASE_EVAL = 1,
	HPU_PHASE_DONE = 2,
	HPU_PHASE_SETUP = 3,
	HPU_PHASE_SAVE = 4,
	HPU_PHASE_LAST = HPU_PHASE_SAVE
};

/* Reports r. Records come at most every 200 ms unless `force` (a log step,
 * the end): one held back goes out when its 200 ms are over (from a
 * thread, so also when the worker has stopped meanwhile); never blocks
 * training: a full pipe drops the record, except
 * the HPU_PHASE_DONE one, which waits up to 10 s for room: the agent takes
 * a worker that ends without it for one that left before the job ended. */
void hpu__status_report(const hpu_status_rec *r, int force);

/* From a fatal signal's handler: sends r's position now (its step, total,
 * epochs, memory and phase; the loss and the rates as unknown) with
 * async-signal-safe calls only, so that the agent says where a crashed
 * worker was, not where its last rate-limited record had it. Nothing
 * where no record was ever sent (the pipe not looked up). */
void hpu__status_report_fatal(const hpu_status_rec *r);

/* Tells the agent, first thing, that this worker speaks the protocol
 * ("H1"): from then on, exit code 0 without a HPU_PHASE_DONE record is a
 * failure (a model that called exit()), not success. */
void hpu__status_hello(void);

/* Starts a thread that says "K1" on the pipe every HPU_STATUS_KEEPALIVE_S
 * seconds while the worker lives: a worker whose pipe stays silent much
 * longer is stopped or frozen as a whole (SIGSTOP, a frozen cgroup), which
 * its agent tells from one that is busy. Without the pipe: nothing. */
#define HPU_STATUS_KEEPALIVE_S 1
void hpu__status_keepalive(void);

/* How another rank caused this worker's failure: it stopped answering,
 * it died, or its own collective failed first (its ABORT named no one
 * else). */
typedef enum hpu_blame { HPU_BLAME_SILENT = 0, HPU_BLAME_DIED, HPU_BLAME_FAILED } hpu_blame;

/* Tells the agent, before the worker exits with an error, that another
 * rank caused it, as the collectives found (hpucoll_comm_culprit). One
 * line "B1 RANK silent|died|failed"; the agent blames that rank rather
 * than this one. */
void hpu__status_blame(int rank, hpu_blame how);

/* The agent's side: parses a blame line (hpu__status_blame). Returns 0, or
 * -1 when the line is not one. */
int hpu__status_parse_blame(const char *line, size_t len, int *rank, hpu_blame *how);

/* Tells the agent, before the worker exits with an error, the sentence
 * it is for (the one it prints): one line "E1 WHY", control characters
 * as spaces, cut to HPU_STATUS_WHY_MAX bytes (then ending "..."). The agent relays it with
 * the exit to the other nodes, whose closing error repeats it. */
#define HPU_STATUS_WHY_MAX 400
void hpu__status_error(const char *why);

/* The agent's side: parses an error line (hpu__status_error) into
 * out[outlen]. Returns 0, or -1 when the line is not one. */
int hpu__status_parse_error(const char *line, size_t len, char *out, size_t outlen);

/* The agent's side: parses one record line (without its newline).
 * Returns 0, or -1 when it is not a well-formed record (st is then
 * unchanged). */
int hpu__status_parse(const char *line, size_t len, hpu_status_rec *st);

/* A rank's record (age_s old) as the protocol carries it, and back
 * (clamped to the record's ranges; eta_s travels beside it). */
void hpu__status_to_proto(Hpu__RankStatus *rs, int rank, const hpu_status_rec *st, double age_s);
void hpu__status_from_proto(const Hpu__RankStatus *rs, double eta_s, hpu_status_rec *st);

#endif
