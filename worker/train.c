#include "train.h"

#include <cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader.h"
#include "optim.h"
#include "sampler.h"

/* Everything one worker's loop owns. */
typedef struct loop {
	hpu_builder *b;
	hpucoll_comm *comm;
	const hpu_train_opts *o;
	int rank, world, batch;  /* batch: this rank's share of the global */
	float *x;                /* the batch in use [batch, sample_size] */
	int32_t *labels;         /* its labels [batch, label_size] */
	float *eval_x;           /* evaluation's own batch buffers */
	int32_t *eval_labels;
	hpu_loader *loader;      /* training batches, one step ahead */
	float **acts;            /* acts[i]: layer i's output [batch, out] */
	float *dbuf[2];          /* ping-pong activation gradients */
	uint32_t *perm;
	hpu_optim opt;
	FILE *metrics;
	char *err;
	size_t errlen;
} loop;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fail(loop *L, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int fail(loop *L, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(L->err, L->errlen, fmt, ap);
	va_end(ap);
	return -1;
}

static int coll_fail(loop *L, const char *what, int rc)
{
	const char *msg = hpucoll_comm_errmsg(L->comm);
	snprintf(L->err, L->errlen, "%s failed: %s", what,
		 msg && *msg ? msg : hpucoll_strerror(rc));
	return -1;
}

static int alloc_buffers(loop *L)
{
	hpu_builder *b = L->b;
	const hpu_dataset *d = &b->data[HPU_SPLIT_TRAIN];
	size_t maxw = d->sample_size;
	L->eval_x = malloc((size_t)L->batch * d->sample_size * sizeof(float));
	L->eval_labels = malloc((size_t)L->batch * d->label_size * sizeof(int32_t));
	L->acts = calloc((size_t)b->nlayers, sizeof *L->acts);
	L->perm = malloc(d->size * sizeof *L->perm);
	L->loader = hpu_loader_new(d, L->batch);
	if (!L->eval_x || !L->eval_labels || !L->acts || !L->perm || !L->loader)
		return -1;
	for (int i = 0; i < b->nlayers; i++) {
		size_t w = b->layers[i]->out_size;
		if (w > maxw)
			maxw = w;
		L->acts[i] = malloc((size_t)L->batch * w * sizeof(float));
		if (!L->acts[i])
			return -1;
	}
	for (int k = 0; k < 2; k++)
		if (!(L->dbuf[k] = malloc((size_t)L->batch * maxw * sizeof(float))))
			return -1;
	return 0;
}

static void free_buffers(loop *L)
{
	for (int i = 0; L->acts && i < L->b->nlayers; i++)
		free(L->acts[i]);
	free(L->acts);
	free(L->eval_x);
	free(L->eval_labels);
	hpu_loader_destroy(&L->loader);
	free(L->perm);
	free(L->dbuf[0]);
	free(L->dbuf[1]);
	hpu_optim_free(&L->opt);
	if (L->metrics)
		fclose(L->metrics);
}

/* Fetches test samples idx[0..n) into the evaluation buffers and makes
 * them the batch in use. */
static int load_eval_batch(loop *L, const uint32_t *idx, int n)
{
	const hpu_dataset *d = &L->b->data[HPU_SPLIT_TEST];
	L->x = L->eval_x;
	L->labels = L->eval_labels;
	for (int i = 0; i < n; i++) {
		size_t k = idx[i];
		if (d->fetch(d->user, k, L->x + (size_t)i * d->sample_size,
			     L->labels + (size_t)i * d->label_size) != 0) {
			return fail(L, "the model's dataset failed to fetch sample %zu",
				    k);
		}
	}
	return 0;
}

static int forward(loop *L, int n)
{
	const float *in = L->x;
	for (int i = 0; i < L->b->nlayers; i++) {
		hpu_layer *l = L->b->layers[i];
		if (l->ops.forward(l, in, L->acts[i], n) != 0)
			return fail(L, "layer %s: forward failed: %s", l->name,
				    l->err[0] ? l->err : "(no reason given)");
		in = L->acts[i];
	}
	return 0;
}

/* Runs the loss and backward, with the loss gradient scaled by `scale`
 * (so every gradient comes out scaled, at the cost of scaling the last
 * layer's output only); returns the local mean loss (or NAN after
 * recording an error). */
static float backward(loop *L, int n, float scale)
{
	hpu_builder *b = L->b;
	int last = b->nlayers - 1;
	float *dout = L->dbuf[0];
	float loss = b->loss.loss(b->loss.user, L->acts[last], L->labels, dout, n);
	if (!(loss >= 0)) {
		fail(L, "the model's loss returned %s (bad labels?)",
		     isnan(loss) ? "NaN" : "a negative value");
		return NAN;
	}
	for (size_t i = 0, k = (size_t)n * b->layers[last]->out_size; i < k; i++)
		dout[i] *= scale;
	for (int i = last; i >= 0; i--) {
		hpu_layer *l = b->layers[i];
		float *din = i ? L->dbuf[(last - i + 1) & 1] : NULL;
		const float *in = i ? L->acts[i - 1] : L->x;
		if (l->ops.backward(l, in, L->acts[i], dout, din, n) != 0) {
			fail(L, "layer %s: backward failed: %s", l->name,
			     l->err[0] ? l->err : "(no reason given)");
			return NAN;
		}
		dout = din;
	}
	return loss;
}

static void log_step(loop *L, long step, long total, int epoch, float loss,
		     double sps)
{
	if (L->rank != 0)
		return;
	printf("epoch %d/%d step %ld/%ld loss %.4f lr %.3g samples/s %.1f\n",
	       epoch + 1, L->o->epochs, step, total, loss, L->o->lr, sps);
	if (L->metrics) {
		fprintf(L->metrics,
			"{\"step\":%ld,\"epoch\":%d,\"loss\":%.9g,\"lr\":%.9g,\"samples_per_sec\":%.3f}\n",
			step, epoch + 1, loss, L->o->lr, sps);
		fflush(L->metrics);
	}
}

/* Asks the loader for this rank's shard of global batch `s`. */
static void prefetch(loop *L, size_t s)
{
	hpu_loader_request(L->loader, (int)(s & 1),
			   hpu_sampler_shard(L->perm, s, (size_t)L->o->batch_size,
					     L->rank, L->world),
			   L->batch);
}

/* One optimizer step on this rank's shard of global batch `s`, fetched by
 * the loader; asks for batch s + 1 (if `more`) before computing. */
static int train_step(loop *L, size_t s, int more, float *loss_out)
{
	hpu_builder *b = L->b;
	size_t bad;
	if (hpu_loader_wait(L->loader, (int)(s & 1), &L->x, &L->labels, &bad) < 0)
		return fail(L, "the model's dataset failed to fetch sample %zu", bad);
	if (more)
		prefetch(L, s + 1);
	memset(b->grad_buf, 0, b->numel * sizeof(float));
	if (forward(L, L->batch) < 0)
		return -1;
	/* fast_ddp: gradients pre-divided by the world size (through the loss
	 * gradient), then one flat sum. The loss rides in the slot after the
	 * gradients. */
	float scale = 1.0f / (float)L->world;
	float loss = backward(L, L->batch, scale);
	if (isnan(loss))
		return -1;
	b->grad_buf[b->numel] = loss * scale;
	int rc = hpucoll_all_reduce(L->comm, b->grad_buf, b->grad_buf, b->numel + 1,
				    HPUCOLL_F32, HPUCOLL_SUM);
	if (rc)
		return coll_fail(L, "gradient all-reduce", rc);
	hpu_optim_step(&L->opt, b->param_buf, b->grad_buf);
	*loss_out = b->grad_buf[b->numel];
	return 0;
}

/* Test metric over all ranks: returns 0 and sets *value, or -1. */
static int evaluate(loop *L, double *value, double *count)
{
	hpu_builder *b = L->b;
	const hpu_dataset *d = &b->data[HPU_SPLIT_TEST];
	size_t mine = hpu_sampler_eval_count(d->size, L->rank, L->world);
	double sum = 0;
	uint32_t *idx = malloc((size_t)L->batch * sizeof *idx);
	if (!idx)
		return fail(L, "out of memory in evaluation");
	for (size_t done = 0; done < mine;) {
		int n = (int)(mine - done < (size_t)L->batch ? mine - done : (size_t)L->batch);
		for (int i = 0; i < n; i++)
			idx[i] = (uint32_t)((done + (size_t)i) * (size_t)L->world + (size_t)L->rank);
		if (load_eval_batch(L, idx, n) < 0 || forward(L, n) < 0) {
			free(idx);
			return -1;
		}
		sum += b->loss.metric(b->loss.user, L->acts[b->nlayers - 1],
				      L->labels, n);
		done += (size_t)n;
	}
	free(idx);
	float red[2] = {(float)sum, (float)mine};
	int rc = hpucoll_all_reduce(L->comm, red, red, 2, HPUCOLL_F32, HPUCOLL_SUM);
	if (rc)
		return coll_fail(L, "evaluation all-reduce", rc);
	*count = red[1];
	*value = red[1] > 0 ? red[0] / red[1] : 0;
	return 0;
}

static void write_final(loop *L, long steps, float loss, double sps,
			int have_metric, double metric, double count)
{
	const char *name = L->b->loss.metric_name ? L->b->loss.metric_name : "metric";
	printf("trained %ld steps on %d workers: final loss %.4f, %.1f samples/s\n",
	       steps, L->world, loss, sps);
	if (have_metric)
		printf("test %s %.4f (%.0f samples)\n", name, metric, count);
	if (!L->metrics)
		return;
	cJSON *j = cJSON_CreateObject();
	cJSON_AddBoolToObject(j, "final", 1);
	cJSON_AddNumberToObject(j, "steps", (double)steps);
	cJSON_AddNumberToObject(j, "loss", loss);
	cJSON_AddNumberToObject(j, "samples_per_sec", sps);
	cJSON_AddNumberToObject(j, "world_size", L->world);
	cJSON_AddStringToObject(j, "strategy", hpu_strategy_name(L->o->strategy));
	if (have_metric) {
		char key[96];
		snprintf(key, sizeof key, "test_%s", name);
		cJSON_AddNumberToObject(j, key, metric);
	}
	char *s = cJSON_PrintUnformatted(j);
	if (s)
		fprintf(L->metrics, "%s\n", s);
	free(s);
	cJSON_Delete(j);
}

static int run_epochs(loop *L, long *steps_out, float *loss_out, double *sps_out)
{
	const hpu_dataset *d = &L->b->data[HPU_SPLIT_TRAIN];
	size_t per_epoch = hpu_sampler_steps(d->size, (size_t)L->o->batch_size);
	long total = (long)per_epoch * L->o->epochs, step = 0;
	if (L->o->max_steps > 0 && L->o->max_steps < total)
		total = L->o->max_steps;
	if (per_epoch == 0)
		return fail(L, "the training set (%zu samples) is smaller than one global batch (--batch-size %d)",
			    d->size, L->o->batch_size);
	double t0 = 0, tlog = 0;
	long step0 = 0, steplog = 0;
	float loss = 0;
	for (int e = 0; e < L->o->epochs && step < total; e++) {
		/* The loader is idle here: the permutation may change. */
		hpu_sampler_permute(L->perm, d->size, L->o->seed, (uint64_t)e);
		size_t steps = per_epoch;
		if ((long)steps > total - step)
			steps = (size_t)(total - step);
		prefetch(L, 0);
		for (size_t s = 0; s < steps; s++) {
			if (train_step(L, s, s + 1 < steps, &loss) < 0)
				return -1;
			step++;
			double t = now_s();
			if (step == 1) { /* the first step pays for warm-up */
				t0 = tlog = t;
				step0 = steplog = 1;
			}
			if (L->o->log_every && step % L->o->log_every == 0) {
				double sps = t > tlog ? (double)(step - steplog) *
							L->o->batch_size / (t - tlog) : 0;
				log_step(L, step, total, e, loss, sps);
				tlog = t;
				steplog = step;
			}
		}
	}
	double t = now_s();
	*sps_out = step > step0 && t > t0 ? (double)(step - step0) * L->o->batch_size / (t - t0) : 0;
	*steps_out = step;
	*loss_out = loss;
	return 0;
}

int hpu_train_run(hpu_builder *b, hpucoll_comm *comm,
		  const hpu_train_opts *o, char *err, size_t errlen)
{
	loop L = {.b = b, .comm = comm, .o = o, .err = err, .errlen = errlen};
	L.rank = hpucoll_comm_rank(comm);
	L.world = hpucoll_comm_size(comm);
	L.batch = o->batch_size / L.world;
	int rc = -1;
	if (alloc_buffers(&L) < 0 || hpu_optim_init(&L.opt, o, b->numel) < 0) {
		fail(&L, "out of memory for the training buffers");
		goto out;
	}
	if (L.rank == 0 && o->metrics[0] && !(L.metrics = fopen(o->metrics, "w"))) {
		fail(&L, "cannot open the metrics file %s: %s", o->metrics, strerror(errno));
		goto out;
	}
	if (L.rank == 0)
		hpu__model_init_params(b, o->seed);
	int crc = hpucoll_broadcast(comm, b->param_buf, b->param_buf, b->numel,
				    HPUCOLL_F32, 0);
	if (crc) {
		coll_fail(&L, "initial parameter broadcast", crc);
		goto out;
	}
	long steps = 0;
	float loss = 0;
	double sps = 0, metric = 0, count = 0;
	if (run_epochs(&L, &steps, &loss, &sps) < 0)
		goto out;
	int have_metric = o->eval && b->has_data[HPU_SPLIT_TEST] && b->loss.metric;
	if (have_metric && evaluate(&L, &metric, &count) < 0)
		goto out;
	if (L.rank == 0)
		write_final(&L, steps, loss, sps, have_metric, metric, count);
	rc = 0;
out:
	free_buffers(&L);
	return rc;
}
