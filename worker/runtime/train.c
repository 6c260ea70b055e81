#include "worker/runtime/train.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "worker/runtime/crash.h"
#include "worker/runtime/save_resume.h"
#include "worker/runtime/graphs.h"
#include "worker/device/device.h"
#include "worker/hpu/devmem.h"
#include "common/env.h"
#include "worker/ops/fp8.h"
#include "worker/runtime/hooks.h"
#include "common/num.h"
#include "worker/runtime/loader.h"
#include "worker/runtime/rate.h"
#include "worker/runtime/sampler.h"
#include "worker/runtime/same_opts.h"
#include "worker/runtime/lrsched.h"
#include "worker/hpu/prof.h"
#include "worker/runtime/quant.h"
#include "proto/status.h"
#include "worker/strategy/strategy.h"
#include "worker/runtime/loop.h"
#include "worker/runtime/watch.h"
#include "common/fileio.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *dalloc(loop *L, size_t bytes, const char *what)
{
	void *p = hpu__dev_hbuf_alloc(HPU_MEM_OTHER, bytes, what);
	if (!p)
		hpu__loop_fail(L, "%s", hpu__devmem_error());
	return p;
}

/* The evaluation batch only where something runs forward passes outside
 * training: validation, the test-set evaluation, fp8's measurement (a
 * --no-eval run without validation holds none: --device-memory counts
 * it). */
static int needs_eval_batch(const loop *L)
{
	const hpu_train_opts *o = L->o;
	return o->eval_only || o->eval || o->eval_every || o->eval_every_epochs ||
	       L->quant.mode == HPU_FP8_MEASURE;
}

/* The rows an evaluation batch can hold: a micro-batch, or fewer where
 * no evaluation of the run gives one rank that many (the test split, the
 * --val-fraction slice, fp8's calibration): a --batch-size past the data
 * asked for the whole micro-batch (29 GiB for a 10 000-sample test split
 * at --eval-only --batch-size 1e7). */
static int eval_rows(const loop *L)
{
	const hpu_builder *b = L->b;
	size_t most = 1;
	size_t n = b->has_data[HPU_SPLIT_TEST]
			   ? hpu__sampler_eval_count(b->data[HPU_SPLIT_TEST].size, 0, L->world)
			   : 0;
	if (n > most)
		most = n;
	if (L->val_map) {
		n = hpu__sampler_eval_count(L->nval, 0, L->world);
		if (n > most)
			most = n;
	}
	if (L->quant.mode == HPU_FP8_MEASURE) {
		n = hpu__sampler_eval_count(b->data[HPU_SPLIT_TRAIN].size, 0, L->world);
		size_t want = (size_t)L->o->calib_batches * (size_t)L->micro;
		n = n < want ? n : want;
		if (n > most)
			most = n;
	}
	return most < (size_t)L->micro ? (int)most : L->micro;
}

/* A run that trains no step (--eval-only, --max-steps 0) sizes its
 * batches by the data, not by a --batch-size past it: the activations
 * were made for the micro-batch (32 GiB to evaluate 10 000 samples at
 * --eval-only --batch-size 16777216), and --max-steps 0 started the
 * data loader for it. Returns 0. */
static int trains_nothing(loop *L, long total)
{
	if (!L->o->eval_only && total > 0)
		return 0;
	L->no_steps = 1;
	const hpu_builder *b = L->b;
	size_t most = hpu__sampler_eval_count(b->data[HPU_SPLIT_TRAIN].size, 0, L->world);
	if (b->has_data[HPU_SPLIT_TEST]) {
		size_t t = hpu__sampler_eval_count(b->data[HPU_SPLIT_TEST].size, 0, L->world);
		most = t > most ? t : most;
	}
	if (most >= 1 && most < (size_t)L->micro) {
		L->micro = (int)most;
		/* the hooks' forwards are checked against it
		 * (hpu_run_forward): past the buffers made for the capped
		 * micro-batch they would write outside them */
		L->b->max_batch = L->micro;
	}
	return 0;
}

static int alloc_buffers(loop *L)
{
	const hpu_dataset *d = &L->b->data[HPU_SPLIT_TRAIN];
	int rows = eval_rows(L);
	if (needs_eval_batch(L) &&
	    (hpu__batch_alloc(d, rows, &L->eval_bt, "evaluation batch") < 0 ||
	     !(L->eval_idx = dalloc(L, (size_t)rows * sizeof *L->eval_idx, "evaluation indices"))))
		return L->err[0] ? -1 : hpu__loop_fail(L, "%s", hpu__devmem_error());
	if (L->o->eval_only || L->no_steps)
		return 0; /* nothing trains: no sampler, no loader (a micro-batch each) */
	if (!(L->perm = dalloc(L, d->size * sizeof *L->perm, "the sampler's permutation")))
		return -1;
	if (!(L->loader = hpu__loader_new(d, L->micro))) {
		if (!L->err[0])
			hpu__loop_fail(L, "cannot start the data loader: %s", hpu__devmem_error());
		return -1;
	}
	return 0;
}

static void free_buffers(loop *L)
{
	hpu__graphs_free(&L->graphs); /* before the strategy: its memory kept */
	hpu__loader_destroy(&L->loader);
	hpu__batch_free(&L->eval_bt);
	hpu__dev_hbuf_free(L->eval_idx);
	hpu__dev_hbuf_free(L->perm);
	free(L->val_map);
	hpu__strat_free(&L->st);
	if (L->metrics)
		fclose(L->metrics);
}

/* The run's length in optimizer steps, and the steps of an epoch:
 * --max-steps wins over --epochs, as in the HF Trainer (the sampler goes
 * on into as many epochs as it takes), and 0 trains nothing. */
static int run_total(loop *L, long *total, size_t *per_epoch)
{
	*per_epoch = hpu__sampler_steps(L->ntrain, (size_t)L->o->batch_size);
	if (L->o->max_steps == 0) { /* no batch: the initial model is saved and evaluated */
		*total = 0;
		L->epochs = 1;
		return 0;
	}
	if (*per_epoch == 0)
		return hpu__loop_fail(L, "the training set (%zu sample%s%s) is smaller than one global "
					 "batch (--batch-size %d)",
				      L->ntrain, hpu__plural((long long)L->ntrain),
				      L->val_map ? ", after --val-fraction's" : "", L->o->batch_size);
	if (L->o->max_steps < 0) {
		*total = (long)*per_epoch * L->o->epochs;
		return 0;
	}
	*total = L->o->max_steps;
	long e = (*total + (long)*per_epoch - 1) / (long)*per_epoch;
	L->epochs = e < 1 ? 1 : e > INT_MAX ? INT_MAX : (int)e;
	return 0;
}

/* A checkpoint after `step` steps, the next of which is batch `batch`
 * of epoch `epoch`. */
static int save_checkpoint(loop *L, long step, int epoch, long batch)
{
	hpu_run_pos p = L->pos;
	p.step = step;
	p.epoch = epoch;
	p.batch = batch;
	p.vstep = L->vstep;
	p.vloss = L->vloss;
	memcpy(p.vmetric, L->vmetric, sizeof p.vmetric);
	p.es_best = L->es_best;
	p.es_best_step = L->es_best_step;
	p.es_wait = L->es_wait;
	/* where a rank that stops answering is said to be */
	hpu__where.step = step;
	hpu__where.phase = HPU_PHASE_SAVE;
	hpu__where_report(1);
	int64_t t0 = hpu__prof_t0();
	hpu__watch_begin(HPU_WATCH_SAVE, step);
	int rc = hpu__checkpoint_save(L->comm, L->o, L->b, L->st, &p, L->metrics, L->err, L->errlen);
	hpu__watch_end();
	hpu__prof_span("checkpoint", "checkpoint_save", NULL, t0, "\"step\":%ld", step);
	return rc;
}

/* --eval-every-epochs after batch s (from 0) of epoch e: N, after the last
 * batch of every Nth epoch; F below 1 (Lightning's val_check_interval=F),
 * after the batch that reaches each F of the epoch (rounded up) and after
 * its last. */
static int epoch_validates(double f, int e, size_t s, size_t per_epoch)
{
	if (f <= 0)
		return 0;
	if (f >= 1)
		return s + 1 == per_epoch && (e + 1) % (long)f == 0;
	double part = f * (double)per_epoch; /* batches per validation */
	return s + 1 == per_epoch ||
	       floor((double)(s + 1) / part + 1e-9) > floor((double)s / part + 1e-9);
}

/* --profile records the run's steps k (from 0) in --profile-warmup-steps'
 * and --profile-steps' window, with what runs after each of them. */
static void profile_window(const hpu_train_opts *o, long k)
{
	/* (--eval-only trains no step: its evaluation is recorded) */
	if (o->profile[0] && !o->eval_only && (o->profile_warmup > 0 || o->profile_steps > 0))
		hpu__prof_pause(k < o->profile_warmup ||
				(o->profile_steps > 0 && k >= o->profile_warmup + o->profile_steps));
}

/* Trains from L->pos to step `total`: checkpoints every
 * --checkpoint-every steps and at the end; stops early at --stop-at-step. */
static int run_epochs(loop *L, long total, size_t per_epoch, long *steps_out, float *loss_out,
		      double *sps_out)
{
	const hpu_train_opts *o = L->o;
	double norm = 0;
	long step = L->pos.step;
	float loss = 0;
	int e = L->pos.epoch;
	hpu_rate R;
	hpu__rate_start(&R, o->throughput_warmup, step, now_s());
	long first = step; /* this run's first step, for --profile's window */
	for (; e < L->epochs && step < total; e++) {
		/* The loader is idle here: the permutation may change. */
		hpu__sampler_permute(L->perm, L->ntrain, L->pos.seed, (uint64_t)e);
		for (size_t i = 0; L->val_map && i < L->ntrain; i++)
			L->perm[i] = L->val_map[L->perm[i]];
		size_t s0 = e == L->pos.epoch ? (size_t)L->pos.batch : 0, end = per_epoch;
		if ((long)(end - s0) > total - step)
			end = s0 + (size_t)(total - step);
		hpu__loop_prefetch(L, s0, 0);
		for (size_t s = s0; s < end; s++) {
			double lr = hpu__sched_lr(&L->pos.sched, step);
			profile_window(o, step - first);
			int64_t ts = hpu__prof_t0();
			L->epoch = e;
			uint64_t h2d0, d2h0, waits0 = hpu__dev_waits();
			hpu__dev_copied(&h2d0, &d2h0);
			hpu__watch_begin(HPU_WATCH_STEP, step + 1);
			int rc = L->graphs ? hpu__loop_graph_step(L, s, step, s + 1 < end, &loss, &norm)
						     : hpu__loop_train_step(L, s, step, s + 1 < end, &loss, &norm);
			hpu__watch_end();
			hpu__dev_step_guard(0); /* where the step failed too */
			if (rc < 0 || hpu__loop_skipped_check(L, step) < 0)
				return -1;
			if (o->verbose)
				hpu__loop_copied_log(L, step + 1, h2d0, d2h0, waits0);
			step++;
			L->epoch = e;
			hpu__prof_span("step", "step", NULL, ts, "\"step\":%ld,\"epoch\":%d", step, e + 1);
			double t = now_s();
			hpu__rate_tick(&R, step, t);
			int logs = o->log_every && step % o->log_every == 0;
			if (logs) {
				/* within --throughput-warmup-steps: not measured (NAN) */
				double lsps = hpu__rate_log(&R, step, t, o->batch_size);
				if (hpu__loop_log_step(L, step, total, e, loss, lr, norm,
						       hpu__rate_measuring(&R, step) ? lsps : NAN) < 0)
					return -1;
			}
			double sps = hpu__rate_final(&R, step, t, o->batch_size);
			hpu__loop_report(L, step, total, e, loss, sps,
					 hpu__rate_measuring(&R, step) && sps > 0
						 ? (double)(total - step) * o->batch_size / sps
						 : -1,
					 HPU_PHASE_TRAIN, logs);
			/* validation and saves are not training: out of samples/s */
			double tp = now_s();
			if ((o->eval_every && step % o->eval_every == 0) ||
			    epoch_validates(o->eval_every_epochs, e, s, per_epoch)) {
				hpu__watch_begin(HPU_WATCH_VALIDATE, step);
				int vrc = hpu__loop_validate(L, step, e);
				hpu__watch_end();
				if (vrc < 0)
					return -1;
			}
			int stop = (o->stop_at_step > 0 && step == o->stop_at_step) || (L->stop_early && step < total);
			if (o->checkpoint_dir[0] &&
			    ((o->checkpoint_every > 0 && step % o->checkpoint_every == 0) || stop ||
			     step == total) &&
			    save_checkpoint(L, step, s + 1 < per_epoch ? e : e + 1,
					    s + 1 < per_epoch ? (long)(s + 1) : 0) < 0)
				return -1;
			hpu__rate_pause(&R, now_s() - tp);
			hpu__prof_flush();
			if (stop) {
				if (L->rank == 0 && L->stop_early)
					printf("stopped early after step %ld of %ld (--early-stop %s): %s did not "
					       "improve by more than %g in %ld validation%s; the best, %.4f, was "
					       "at step %ld\n", step, total, o->early_stop, L->es.metric,
					       L->es.min_delta, L->es_wait, hpu__plural(L->es_wait),
					       L->es_best, L->es_best_step);
				else if (L->rank == 0)
					printf("stopped after step %ld of %ld (--stop-at-step)\n", step, total);
				goto done;
			}
		}
	}
done:
	/* a stop (--stop-at-step, --early-stop) leaves the next batch asked
	 * for: fetched before anything else fetches (the evaluation's, the
	 * calibration's), as hpu__loop_validate does: the model's fetch()
	 * ran on two threads at once */
	for (int k = 0; L->loader && k < 2; k++) {
		const hpu_batch *bt;
		size_t bad;
		(void)hpu__loader_wait(L->loader, k, &bt, &bad);
	}
	if (L->rank == 0 && o->profile[0] && o->profile_warmup > 0 && step - first <= o->profile_warmup)
		printf("profiling: this run's %ld step%s ended within --profile-warmup-steps %ld: "
		       "the traces hold no step\n",
		       step - first, hpu__plural(step - first), o->profile_warmup);
	*sps_out = hpu__rate_final(&R, step, now_s(), o->batch_size);
	*steps_out = step;
	*loss_out = loss;
	hpu__loop_report(L, step, total, L->epoch, loss, *sps_out, 0, HPU_PHASE_TRAIN, 1);
	return 0;
}

/* --stall-warning; --profile: the trace file, the collectives' events,
 * and the job's first barrier, at which hpu-trace aligns the ranks'
 * clocks. */
static void device_sync(void)
{
	hpu__dev_queue_sync(NULL);
}

static int observe_setup(loop *L)
{
	const hpu_train_opts *o = L->o;
	if (hpu__opts_from(o, "stall-warning") != HPU_FROM_DEFAULT)
		hpucoll_comm_set_stall_warning(L->comm, o->stall_warning > 0 && o->stall_warning < 0.001
								? 1 : (int)(o->stall_warning * 1000));
	if (!o->profile[0])
		return 0;
	const char *nr = hpu__env_str(HPU_ENV_NODE_RANK), *rc_env = hpu__env_str(HPU_ENV_HPU_RESTART_COUNT);
	/* a restarted job's attempt K keeps the earlier attempts' traces */
	char name[600];
	int attempt = 0, node_rank = 0; /* unset or not numbers: 0 */
	hpu__parse_int(rc_env, INT_MIN, INT_MAX, &attempt);
	hpu__parse_int(nr, INT_MIN, INT_MAX, &node_rank);
	if (attempt > 0)
		snprintf(name, sizeof name, "%s-restart%d", o->profile_name, attempt);
	else
		snprintf(name, sizeof name, "%s", o->profile_name);
	hpu_prof_conf c = {
		.dir = o->profile, .name = name, .rank = L->rank, .world = L->world,
		.node_rank = node_rank, .attempt = attempt > 0 ? attempt : 0,
		.job_id = hpu__env_str(HPU_ENV_HPU_JOB_ID),
		.model = L->b->model && L->b->model->name ? L->b->model->name : "",
		.strategy = hpu__strategy_name(o->strategy),
		.precision = hpu__precision_name(o->precision),
	};
	long sync = 0;
	if (hpu__env_long(HPU_ENV_HPU_PROFILE_SYNC, 0, 1, &sync) < 0)
		return hpu__loop_fail(L, "HPU_PROFILE_SYNC=%s: must be 0 or 1",
				      hpu__env_str(HPU_ENV_HPU_PROFILE_SYNC));
	hpu__prof_set_sync(sync ? device_sync : NULL);
	if (hpu__prof_open(&c, L->err, L->errlen) < 0)
		return -1;
	hpucoll_comm_set_trace(L->comm, hpu__prof_collective, NULL);
	int rc = hpucoll_barrier(L->comm);
	if (rc)
		return hpu__loop_coll_fail(L, "the profiler's first barrier", rc);
	/* before the window: nothing from here (a checkpoint's load); the
	 * first barrier is recorded, as hpu-trace aligns the ranks' clocks
	 * at it */
	profile_window(o, 0);
	snprintf(L->prof_name, sizeof L->prof_name, "%s", name);
	return 0;
}

/* Says where the traces go and which steps they hold, once a checkpoint
 * has set the step a resumed run starts from (the trace's events carry
 * the training step: a resumed run's step 3 is step 6 of training when
 * it resumed at step 3). */
static void profile_said(const loop *L, long resumed_at)
{
	const hpu_train_opts *o = L->o;
	if (!o->profile[0] || L->rank != 0)
		return;
	if (!o->eval_only && (o->profile_warmup > 0 || o->profile_steps > 0)) {
		char last[40] = "the end", of[160] = "";
		if (o->profile_steps > 0)
			snprintf(last, sizeof last, "%ld", o->profile_warmup + o->profile_steps);
		if (resumed_at > 0 && o->profile_steps > 0)
			snprintf(of, sizeof of, " (steps %ld to %ld of training: it resumed at step %ld)",
				 resumed_at + o->profile_warmup + 1,
				 resumed_at + o->profile_warmup + o->profile_steps, resumed_at);
		else if (resumed_at > 0)
			snprintf(of, sizeof of, " (step %ld of training on: it resumed at step %ld)",
				 resumed_at + o->profile_warmup + 1, resumed_at);
		printf("profiling: a Chrome trace per rank in %s/%s-rank<R>.json (hpu-trace merges "
		       "them), of this run's steps %ld to %s%s\n",
		       o->profile, L->prof_name, o->profile_warmup + 1, last, of);
	} else {
		printf("profiling: a Chrome trace per rank in %s/%s-rank<R>.json (hpu-trace merges them)\n",
		       o->profile, L->prof_name);
	}
}

int hpu__train_run(hpu_builder *b, hpucoll_comm *comm,
		   const hpu_train_opts *o, char *err, size_t errlen)
{
	loop L = {.b = b, .comm = comm, .o = o, .epochs = o->epochs, .err = err, .errlen = errlen};
	L.rank = hpucoll_comm_rank(comm);
	L.world = hpucoll_comm_size(comm);
	L.micro = o->micro_batch;
	L.accum = o->grad_accum;
	L.pos.seed = o->seed;
	err[0] = 0;
	int rc = -1;
	hpu_ckpt *ck = NULL;
	long total = 0;
	size_t per_epoch = 0;
	double tload = now_s();
	hpu_train_opts *resumed_o = NULL;
	if (observe_setup(&L) < 0 || hpu__quant_init(&L.quant, o, err, errlen) < 0 ||
	    hpu__checkpoint_find(comm, o, b, &ck, err, errlen) < 0)
		goto out;
	/* a resumed run is the run it continues: the checkpoint's seed holds
	 * out the same validation samples and draws the same dropout masks as
	 * it orders the data (only the order followed it: a resume with
	 * another --seed trained on what the run had validated on) */
	/* where a failure from here on is said to be: the step it resumes
	 * at (it said "before step 1") */
	if (ck)
		hpu__where.step = ck->step;
	if (ck && hpu__checkpoint_seed(ck, o->seed) != o->seed) {
		if (!(resumed_o = malloc(sizeof *resumed_o))) {
			hpu__loop_fail(&L, "out of memory");
			goto out;
		}
		*resumed_o = *o;
		resumed_o->seed = hpu__checkpoint_seed(ck, o->seed);
		if (L.rank == 0)
			printf("resume: the checkpoint's seed %llu is this run's (its data order, "
			       "held-out samples and dropout masks), not --seed %llu\n",
			       (unsigned long long)resumed_o->seed, (unsigned long long)o->seed);
		o = L.o = resumed_o;
		L.pos.seed = o->seed;
	}
	if (hpu__loop_val_setup(&L) < 0 ||
	    (!o->eval_only && run_total(&L, &total, &per_epoch) < 0) || trains_nothing(&L, total) < 0)
		goto out;
	/* what only an evaluation reads, where none will run (it was
	 * dropped in silence): the metrics without a test split or a
	 * validation, the after-evaluation hook without a test split */
	if (L.rank == 0 && !b->has_data[HPU_SPLIT_TEST] && (o->eval || o->eval_only)) {
		if (b->nmetrics && !L.val_map)
			printf("note: the model declares %d metric%s (%s%s) but no test split: no "
			       "evaluation reports %s (hold out part of the training split with "
			       "--val-fraction F and --eval-every N, or declare a test split)\n",
			       b->nmetrics, hpu__plural(b->nmetrics), b->metrics[0].name,
			       b->nmetrics > 1 ? ", ..." : "", b->nmetrics > 1 ? "them" : "it");
		if (b->nafter_eval)
			printf("note: the model's after-evaluation hook runs after the final evaluation, "
			       "on the test split, which the model does not declare: it will not run\n");
	}
	hpu__where.total = total;
	hpu__where.epochs = L.epochs;
	if (L.rank == 0 && L.quant.warning[0])
		printf("warning: %s\n", L.quant.warning);
	/* a resumed run adds to the metrics of the run it continues; so does
	 * a restart from the start, after a record saying so (it began the
	 * file afresh: the failed attempt's records were lost, its traces
	 * and logs kept) */
	int attempt = 0;
	hpu__parse_int(hpu__env_str(HPU_ENV_HPU_RESTART_COUNT), 0, INT_MAX, &attempt);
	if (L.rank == 0 && o->metrics[0]) {
		/* another running job's file is refused: two tore each
		 * other's lines */
		const char *why = NULL;
		int fd = hpu__open_unshared(o->metrics, ck != NULL || attempt > 0, 0644, &why);
		if (fd >= 0 && why) /* a lock that is not a job's, ignored */
			printf("warning: %s: %s\n", o->metrics, why);
		if (fd >= 0 && !(L.metrics = fdopen(fd, ck || attempt > 0 ? "a" : "w"))) {
			why = strerror(errno);
			close(fd);
		}
		if (!L.metrics) {
			hpu__loop_fail(&L, "cannot open the metrics file %s: %s%s", o->metrics, why,
				       why == hpu__in_use_why ? " --metrics file" : "");
			goto out;
		}
	}
	/* unbuffered: a record that cannot be written whole is cut off again
	 * (hpu__append_line), never left torn, nor flushed later at close */
	if (L.metrics)
		setvbuf(L.metrics, NULL, _IONBF, 0);
	if (L.metrics && attempt > 0 && !ck) {
		char rec[96];
		snprintf(rec, sizeof rec, "{\"restart\":%d,\"step\":0,\"from\":\"the start\"}", attempt);
		if (hpu__append_line(L.metrics, rec) < 0) {
			hpu__loop_fail(&L, "cannot write the metrics file %s: %s", o->metrics,
				       strerror(errno));
			goto out;
		}
	}
	hpu__sched_init(&L.pos.sched, o, total);
	L.pos.train_samples = o->eval_only ? 0 : (long)L.ntrain;
	snprintf(L.pos.train_digest, sizeof L.pos.train_digest, "%s",
		 o->eval_only ? "" : hpu__same_train_digest());
	int64_t tl = hpu__prof_t0();
	if (hpu__strat_new(&L.st, b, comm, o, L.micro, ck, err, errlen) < 0 ||
	    (ck && hpu__checkpoint_apply(comm, ck, o, &L.pos, now_s() - tload, L.metrics, err,
					 errlen) < 0))
		goto out;
	if (ck && o->stop_at_step > 0 && L.pos.step > o->stop_at_step && L.rank == 0)
		printf("note: --stop-at-step %ld: the run resumed at step %ld, past it: it trains on "
		       "to step %ld\n",
		       o->stop_at_step, L.pos.step, total);
	profile_said(&L, ck ? L.pos.step : 0);
	hpu__loop_early_resume(&L);
	hpu__loop_strict_step(&L); /* before the plan's copies are printed: they depend on it */
	if (o->graphs && hpu__loop_graphs_setup(&L) < 0)
		goto out;
	if (o->verbose && L.rank == 0)
		hpu__strat_plan_print(L.st, stdout);
	if (ck)
		hpu__prof_span("checkpoint", "checkpoint_load", NULL, tl, "\"step\":%ld", L.pos.step);
	hpu__where.step = L.pos.step;
	L.eval_step = L.pos.step;
	L.epoch = L.pos.epoch < L.epochs ? L.pos.epoch : L.epochs - 1;
	hpu__where.epoch = L.epoch + 1; /* the resumed one (it said 0 until a step ended) */
	if (alloc_buffers(&L) < 0)
		goto out;
	hpu__watch_start(o->hang_warning, L.rank, b);
	hpu__crash_report_model(b);
	L.skipped0 = hpu__strat_skipped(L.st); /* the checkpoint's: this run's are past it */
	int resumed = ck != NULL;
	if (ck) {
		hpu__ckpt_close(ck);
		free(ck);
		ck = NULL;
	}
	long steps = 0;
	float loss = 0;
	double sps = 0;
	evalres ev = {0};
	if (!o->eval_only && run_epochs(&L, total, per_epoch, &steps, &loss, &sps) < 0)
		goto out;
	/* --max-steps 0 (or --epochs 0) saves the initial model, as its help
	 * says: step 0's checkpoint, where a run started from nothing */
	if (!o->eval_only && total == 0 && !resumed && o->checkpoint_dir[0] &&
	    save_checkpoint(&L, 0, 0, 0) < 0)
		goto out;
	long done = steps > L.pos.step ? steps : L.pos.step; /* steps trained, resumed ones too */
	hpu__watch_begin(HPU_WATCH_HOOK, done);
	int hrc = hpu__hooks_run(L.st, b, b->after_train, b->nafter_train, "after training", done,
				 L.micro, NULL, err, errlen);
	hpu__watch_end();
	if (hrc < 0)
		goto out;
	L.eval_step = done; /* the calibration's and the test's ctx->step */
	hpu__prof_in_eval = 1; /* calibration: forward passes too */
	if (L.quant.mode == HPU_FP8_MEASURE && hpu__loop_calibrate(&L) < 0)
		goto out;
	int evaluates = (o->eval || o->eval_only) && b->has_data[HPU_SPLIT_TEST];
	if (evaluates)
		hpu__loop_report(&L, steps, total, L.epoch, loss, sps, -1, HPU_PHASE_EVAL, 1);
	if (evaluates) {
		hpu__watch_begin(HPU_WATCH_EVALUATE, done);
		int erc = hpu__loop_evaluate(&L, &ev);
		hpu__watch_end();
		if (erc < 0)
			goto out;
	}
	hpu__prof_in_eval = 0;
	hpu__loop_graphs_said(&L); /* the final evaluation's batches counted too */
	if (evaluates) {
		double fig[HPU_MAX_IO + 1] = {ev.loss};
		memcpy(fig + 1, ev.metric, sizeof ev.metric);
		hpu__watch_begin(HPU_WATCH_EVAL_HOOK, done);
		hrc = hpu__hooks_run(L.st, b, b->after_eval, b->nafter_eval, "after evaluation", done,
				     L.micro, fig, err, errlen);
		hpu__watch_end();
		if (hrc < 0)
			goto out;
	}
	if (L.quant.mode == HPU_FP8_QUANTIZE)
		hpu__loop_quant_report(&L);
	if (hpu__loop_write_final(&L, steps, loss, sps, evaluates ? &ev : NULL) < 0)
		goto out;
	if (o->save_params[0] && hpu__strat_save_params(L.st, o->save_params) < 0)
		goto out;
	if (hpu__loop_close_metrics(&L) < 0)
		goto out;
	hpu__loop_report(&L, steps, total, L.epoch, loss, sps, 0, HPU_PHASE_DONE, 1);
	rc = 0;
out:
	hpu__watch_stop();
	hpu__crash_report_model(NULL); /* its builder goes after this */
	hpu__prof_close();
	if (ck) {
		hpu__ckpt_close(ck);
		free(ck);
	}
	free_buffers(&L);
	free(resumed_o);
	return rc;
}
