/* prof: the runtime's profiler (--profile). One Chrome trace per rank,
 * DIR/NAME-rank<R>.json, in the JSON object format that chrome://tracing
 * and Perfetto load:
 *
 *   {"otherData":{...},"displayTimeUnit":"ms","traceEvents":[
 *   {first event}
 *   ,{next event}
 *   ]}
 *
 * Events are complete events (ph "X", ts and dur in microseconds of
 * CLOCK_MONOTONIC), one per line, buffered in memory. A flush writes the
 * buffered lines followed by the tail "\n]}\n" over the previous tail in
 * one pwrite, so the file is valid JSON after every flush: a process
 * killed between flushes leaves a trace of everything up to the last one
 * (the runtime flushes after every step). pid is the rank; tid 1 is the
 * main thread, 2 the collectives' progress thread, 3 the data loader.
 *
 * Part of libhpu, because a model's hpu_profile_start()/stop() land
 * here; the worker opens it (hpu__prof_open) when --profile is given.
 * Everything is a no-op while it is not open. */
#ifndef HPU_PROF_H
#define HPU_PROF_H

#include <hpu/coll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Nonzero while a trace is open: callers test it before taking times
 * (hpu__prof_t0). Read by every thread, cleared when a write fails. */
extern _Atomic int hpu__prof_enabled;

/* Set while the runtime evaluates (or calibrates): layer passes are then
 * "eval_forward:<layer>", kept apart from training's. */
extern int hpu__prof_in_eval;

enum { HPU_PROF_MAIN = 1, HPU_PROF_COMM = 2, HPU_PROF_LOADER = 3 };

typedef struct hpu_prof_conf {
	const char *dir;  /* created if missing */
	const char *name; /* file prefix: DIR/NAME-rank<R>.json */
	int rank, world, node_rank;
	int attempt; /* the job's restart (HPU_RESTART_COUNT; 0: its first run) */
	const char *job_id, *model, *strategy, *precision;
} hpu_prof_conf;

static inline int64_t hpu__prof_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A wait for the device's queued work, where the runtime installs one
 * (HPU_PROFILE_SYNC=1 on a device that runs work after the host issues
 * it, as a GPU does): the main thread's ranges then start and end with
 * the device idle, so a layer's range is the device's time for it, not
 * the time the host took to issue its kernels. NULL (the default): no
 * wait. Called on the main thread only, while a trace is open. */
void hpu__prof_set_sync(void (*wait)(void));
void hpu__prof_sync(void);

/* The start of an event: now, or 0 while nothing is recorded. */
static inline int64_t hpu__prof_t0(void)
{
	if (!hpu__prof_enabled)
		return 0;
	hpu__prof_sync();
	return hpu__prof_now();
}

/* Creates the trace file and writes its header; the calling thread is
 * the main thread. Returns 0, or -1 with a sentence in err. */
int hpu__prof_open(const hpu_prof_conf *c, char *err, size_t errlen);

/* Stops (paused) or resumes recording, the trace staying open: steps
 * outside --profile-warmup-steps and --profile-steps' window. A range
 * begun while paused is not recorded when it ends. */
void hpu__prof_pause(int paused);

/* Puts the calling thread's events on row `tid` (HPU_PROF_LOADER). Other
 * threads that record ranges (a model's own) get rows of their own, 4
 * and up; a thread that runs collectives without recording anything else
 * is the progress thread's row. */
void hpu__prof_thread(int tid);

/* A complete event from t0 (hpu__prof_now) to now on the calling
 * thread's row, named `name` or "name:sub" when sub is not NULL. args,
 * when not NULL, is a printf format of the inside of a JSON object
 * ("\"step\":%ld"). */
void hpu__prof_span(const char *cat, const char *name, const char *sub, int64_t t0,
		    const char *args, ...) __attribute__((format(printf, 5, 6)));

/* hpucoll_comm_set_trace's callback: one event per collective, on the
 * collectives' row when it ran asynchronously. */
void hpu__prof_collective(void *arg, const hpucoll_event *ev);

/* Writes what is buffered (after every step). */
void hpu__prof_flush(void);

/* Closes ranges the model left open, flushes, closes the file. */
void hpu__prof_close(void);

#endif
