/* rate: the run's throughput, samples/s, as the log lines, the metrics
 * records, the progress bar and the final line give it. The first
 * --throughput-warmup-steps steps of the run are left out (they pay for
 * allocation and first touches), and so is the time spent validating and
 * saving checkpoints (hpu__rate_pause): neither is training. Times are
 * seconds of any one clock, passed in. */
#ifndef HPU_RATE_H
#define HPU_RATE_H

typedef struct hpu_rate {
	long warm;        /* steps left out */
	long step0;       /* the step the measurement starts after */
	double t0;        /* ... and when */
	long steplog;     /* the last log line's step and time (or step0) */
	double tlog;
	double start;     /* the run's start, for a run shorter than warm */
	long first;       /* the run's first step - 1 */
} hpu_rate;

/* A run (or the rest of a resumed one) beginning after `step` steps at
 * time t, leaving out its first `warm` steps. */
void hpu__rate_start(hpu_rate *R, long warm, long step, double t);

/* After `step` steps at time t: starts the measurement when warm-up ends. */
void hpu__rate_tick(hpu_rate *R, long step, double t);

/* Whether the figures after `step` steps are measured (past warm-up). */
int hpu__rate_measuring(const hpu_rate *R, long step);

/* samples/s since the last log line (and after warm-up), `batch` samples
 * a step; 0 before. */
double hpu__rate_log(hpu_rate *R, long step, double t, int batch);

/* dt seconds of validation or checkpoint saving, left out of every
 * figure: the windows' starts move on by it. */
void hpu__rate_pause(hpu_rate *R, double dt);

/* The run's samples/s after warm-up; a run no longer than the warm-up is
 * measured whole. */
double hpu__rate_final(const hpu_rate *R, long step, double t, int batch);

#endif
