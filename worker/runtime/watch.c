/* watch: see watch.h. */
#include "worker/runtime/watch.h"
#include "worker/ops/fp8.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/thread.h"

static struct {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int running, stop;
	double secs;
	int rank;
	const hpu_builder *b;
	/* what the main thread does now: written between two increments
	 * of gen (odd while it writes), read where gen held still */
	_Atomic uint64_t gen;
	_Atomic int active, what;
	_Atomic long step;
	_Atomic int64_t start_ns;
} W = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static int64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void set(int active, hpu_watch_what what, long step)
{
	atomic_fetch_add(&W.gen, 1);
	atomic_store(&W.active, active);
	atomic_store(&W.what, (int)what);
	atomic_store(&W.step, step);
	atomic_store(&W.start_ns, mono_ns());
	atomic_fetch_add(&W.gen, 1);
}

void hpu__watch_begin(hpu_watch_what what, long step)
{
	if (W.running)
		set(1, what, step);
}

void hpu__watch_end(void)
{
	if (W.running)
		set(0, HPU_WATCH_STEP, 0);
}

static void describe(int what, long step, char *out, size_t len)
{
	if (what == HPU_WATCH_STEP)
		snprintf(out, len, "step %ld", step);
	else if (what == HPU_WATCH_VALIDATE)
		snprintf(out, len, "the validation after step %ld", step);
	else if (what == HPU_WATCH_EVALUATE)
		snprintf(out, len, "the evaluation on the test split");
	else if (what == HPU_WATCH_HOOK)
		snprintf(out, len, "the model's hook after training");
	else if (what == HPU_WATCH_EVAL_HOOK)
		snprintf(out, len, "the model's hook after the evaluation");
	else
		snprintf(out, len, "the checkpoint save of step %ld", step);
}

/* One warning for the piece of work of generation `gen`. */
static void warn(int what, long step, double ran)
{
	char piece[96], where[HPU_NAME_MAX + 96];
	int backward = 0, l = hpu__op_layer_now(&backward);
	describe(what, step, piece, sizeof piece);
	if (l >= 0 && l < W.b->nlayers)
		snprintf(where, sizeof where, "in layer %s's %s", W.b->layers[l]->name,
			 backward ? "backward" : "forward");
	else
		snprintf(where, sizeof where,
			 "outside any layer (the runtime, a collective, a hook or the "
			 "model's own code)");
	fprintf(stderr,
		"hpu-worker: rank %d: warning: %s has run for %.0f s (--hang-warning %g), %s: "
		"a piece of work that long, or a hang; `gdb -p %d` shows where\n",
		W.rank, piece, ran, W.secs, where, (int)getpid());
	fflush(stderr);
}

static void *watch_main(void *arg)
{
	(void)arg;
	uint64_t warned = 0;
	double tick = W.secs / 4 < 1 ? W.secs / 4 : 1;
	if (tick < 0.01)
		tick = 0.01; /* a tiny --hang-warning: not a busy thread */
	pthread_mutex_lock(&W.mu);
	while (!W.stop) {
		struct timespec until;
		clock_gettime(CLOCK_MONOTONIC, &until); /* the condition's clock */
		int64_t ns = until.tv_nsec + (int64_t)(tick * 1e9);
		until.tv_sec += ns / 1000000000;
		until.tv_nsec = ns % 1000000000;
		pthread_cond_timedwait(&W.cv, &W.mu, &until);
		if (W.stop)
			break;
		uint64_t g = atomic_load(&W.gen);
		int active = atomic_load(&W.active), what = atomic_load(&W.what);
		long step = atomic_load(&W.step);
		int64_t start = atomic_load(&W.start_ns);
		if ((g & 1) || g != atomic_load(&W.gen) || !active || g == warned)
			continue; /* changing, idle, or said */
		double ran = (double)(mono_ns() - start) / 1e9;
		if (ran < W.secs)
			continue;
		warned = g;
		warn(what, step, ran);
	}
	pthread_mutex_unlock(&W.mu);
	return NULL;
}

int hpu__watch_start(double secs, int rank, const hpu_builder *b)
{
	if (secs <= 0 || W.running)
		return 0;
	W.secs = secs;
	W.rank = rank;
	W.b = b;
	W.stop = 0;
	atomic_store(&W.active, 0);
	/* waits timed on the monotonic clock: a wall-clock step changes
	 * nothing */
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_destroy(&W.cv);
	pthread_cond_init(&W.cv, &ca);
	pthread_condattr_destroy(&ca);
	/* the stop signals held off in it: they reach the main thread, whose
	 * handlers clean up after the code they interrupt (a save's) */
	int rc = hpu__thread_start(&W.thread, watch_main, NULL);
	if (rc) {
		fprintf(stderr, "hpu-worker: rank %d: warning: --hang-warning is off: no thread: %s\n",
			rank, strerror(rc));
		return -1;
	}
	W.running = 1;
	return 0;
}

void hpu__watch_stop(void)
{
	if (!W.running)
		return;
	pthread_mutex_lock(&W.mu);
	W.stop = 1;
	pthread_cond_signal(&W.cv);
	pthread_mutex_unlock(&W.mu);
	pthread_join(W.thread, NULL);
	W.running = 0;
}
