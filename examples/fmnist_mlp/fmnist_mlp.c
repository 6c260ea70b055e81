/* fmnist_mlp: an MLP (ReLU) on Fashion-MNIST, 784-1024-1024-10 by default.
 *
 * Model arguments (after "--" on the hpulaunch command line):
 *   --data DIR     where the IDX files are
 *                  (default: /usr/share/datasets/fashion-mnist, from
 *                  Debian's dataset-fashion-mnist)
 *   --hidden N     width of the hidden layers (1024)
 *   --depth N      number of hidden layers (2): N+1 linear layers
 *   --checkpoint   activation checkpointing on every layer but the last
 *
 * Reads top to bottom: data, the linear and ReLU layers (parameters,
 * forward, backward), the loss, the model's declaration.
 */
#include <hpu/hpu.h>
#include <hpu/ops.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "idx.h"

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"
#define CLASSES 10

/* ---- data ---- */

typedef struct split {
	idx_array images, labels;
} split;

#define MAX_DEPTH 256

typedef struct mlp {
	split train, test;
	size_t hidden;
	int nlin;
	struct linear *lin[MAX_DEPTH + 1];
	char names[2 * MAX_DEPTH + 1][16];
	/* testing (--sleep-rank R --sleep-ms MS): rank R sleeps MS in its
	 * 10th loss call, so that the others wait in a collective */
	int rank;
	long sleep_rank, sleep_ms;
	long loss_calls;
	long exit_rank, exit_at, exit_calls; /* testing: exit(0) at that loss call */
	long print_lines, print_calls; /* testing (--print-lines N): a chatty
					* model, N lines to stdout at every
					* loss call of every rank */
} mlp;

static int load_split(split *s, const char *dir, const char *prefix,
		      char *err, size_t errlen)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
	if (idx_read(&s->images, path, err, errlen) < 0)
		return -1;
	snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
	if (idx_read(&s->labels, path, err, errlen) < 0)
		return -1;
	if (s->images.count != s->labels.count || s->images.item != 784) {
		snprintf(err, errlen, "%s/%s: %zu images of %zu bytes but %zu labels", dir,
			 prefix, s->images.count, s->images.item, s->labels.count);
		return -1;
	}
	return 0;
}

/* x[784] = pixels / 255, labels[0] = class. */
static int fetch(void *user, size_t i, float *x, int32_t *labels)
{
	const split *s = user;
	const uint8_t *px = s->images.data + i * 784;
	for (int k = 0; k < 784; k++)
		x[k] = px[k] * (1.0f / 255.0f);
	labels[0] = s->labels.data[i];
	return labels[0] < CLASSES ? 0 : -1;
}

/* ---- linear: y[B,out] = x[B,in] w[out,in]^T + b[out] ---- */

typedef struct linear {
	int in, out;
} linear;

static int linear_forward(hpu_layer *l, const float *in, float *out, int batch)
{
	linear *p = hpu_layer_user(l);
	hpu_linear_forward(in, hpu_param(l, 0), hpu_param(l, 1), out, batch, p->in, p->out);
	return 0;
}

static int linear_backward(hpu_layer *l, const float *in, const float *out,
			   const float *dout, float *din, int batch)
{
	(void)out;
	linear *p = hpu_layer_user(l);
	hpu_linear_backward(in, hpu_param(l, 0), dout, din, hpu_grad(l, 0),
			    hpu_grad(l, 1), batch, p->in, p->out);
	return 0;
}

static const hpu_layer_ops linear_ops = {linear_forward, linear_backward};

static int add_linear(hpu_builder *b, const char *name, linear *p, int in, int out,
		      int ckpt)
{
	p->in = in;
	p->out = out;
	hpu_layer *l = hpu_layer_add(b, name, (size_t)in, (size_t)out, &linear_ops, p);
	if (!l)
		return -1;
	hpu_layer_checkpoint(l, ckpt);
	int64_t w[2] = {out, in}, bias[1] = {out};
	if (hpu_param_add(l, "weight", 2, w, HPU_INIT_FAN_IN_UNIFORM) < 0 ||
	    hpu_param_add(l, "bias", 1, bias, HPU_INIT_FAN_IN_UNIFORM) < 0)
		return -1;
	return 0;
}

/* ---- relu ---- */

static int relu_forward(hpu_layer *l, const float *in, float *out, int batch)
{
	size_t n = *(size_t *)hpu_layer_user(l) * (size_t)batch;
	hpu_relu_forward(in, out, n);
	return 0;
}

static int relu_backward(hpu_layer *l, const float *in, const float *out,
			 const float *dout, float *din, int batch)
{
	(void)in;
	size_t n = *(size_t *)hpu_layer_user(l) * (size_t)batch;
	hpu_relu_backward(out, dout, din, n);
	return 0;
}

static const hpu_layer_ops relu_ops = {relu_forward, relu_backward};

/* ---- loss and metric ---- */

static float xent(void *user, const float *out, const int32_t *labels,
		  float *dout, int batch)
{
	mlp *m = user;
	/* A range of the model's own in the --profile trace, scoped form. */
	HPU_PROFILE_SCOPE("loss");
	if (m->sleep_ms > 0 && m->rank == m->sleep_rank && ++m->loss_calls == 10) {
		struct timespec ts = {m->sleep_ms / 1000, (m->sleep_ms % 1000) * 1000000};
		nanosleep(&ts, NULL);
	}
	if (m->exit_at > 0 && m->rank == m->exit_rank && ++m->exit_calls == m->exit_at)
		exit(0); /* testing: a model that leaves in the middle */
	if (m->print_lines > 0) {
		++m->print_calls;
		for (long i = 0; i < m->print_lines; i++)
			printf("chatter rank %d call %ld line %ld of %ld\n", m->rank,
			       m->print_calls, i + 1, m->print_lines);
		fflush(stdout);
	}
	return hpu_softmax_xent(out, labels, dout, batch, CLASSES);
}

static double correct(void *user, const float *out, const int32_t *labels, int batch)
{
	(void)user;
	/* The same with start and stop. */
	hpu_profile_start("count_correct");
	double n = hpu_count_correct(out, labels, batch, CLASSES);
	hpu_profile_stop("count_correct");
	return n;
}

/* ---- the model ---- */

static void teardown(void *user)
{
	mlp *m = user;
	if (!m)
		return;
	idx_free(&m->train.images);
	idx_free(&m->train.labels);
	idx_free(&m->test.images);
	idx_free(&m->test.labels);
	for (int i = 0; i < m->nlin; i++)
		free(m->lin[i]);
	free(m);
}

static int parse_args(hpu_builder *b, int argc, char **argv, const char **dir,
		      long *hidden, long *depth, int *ckpt, mlp *m)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--data") && i + 1 < argc) {
			*dir = argv[++i];
		} else if (!strcmp(argv[i], "--hidden") && i + 1 < argc) {
			if (ex_arg_long(b, "--hidden", argv[++i], 1, 65536, hidden) < 0)
				return -1;
		} else if (!strcmp(argv[i], "--depth") && i + 1 < argc) {
			if (ex_arg_long(b, "--depth", argv[++i], 1, MAX_DEPTH, depth) < 0)
				return -1;
		} else if (!strcmp(argv[i], "--checkpoint")) {
			*ckpt = 1;
		} else if (!strcmp(argv[i], "--sleep-rank") && i + 1 < argc) {
			if (ex_arg_long(b, "--sleep-rank", argv[++i], 0, 1 << 20, &m->sleep_rank) < 0)
				return -1;
		} else if (!strcmp(argv[i], "--exit-rank") && i + 1 < argc) {
			if (ex_arg_long(b, "--exit-rank", argv[++i], 0, 1 << 20, &m->exit_rank) < 0)
				return -1;
		} else if (!strcmp(argv[i], "--exit-at") && i + 1 < argc) {
			if (ex_arg_long(b, "--exit-at", argv[++i], 1, 1L << 40, &m->exit_at) < 0)
				return -1;
		} else if (!strcmp(argv[i], "--sleep-ms") && i + 1 < argc) {
			if (ex_arg_long(b, "--sleep-ms", argv[++i], 0, 3600000, &m->sleep_ms) < 0)
				return -1;
		} else if (!strcmp(argv[i], "--print-lines") && i + 1 < argc) {
			if (ex_arg_long(b, "--print-lines", argv[++i], 0, 1000000, &m->print_lines) < 0)
				return -1;
		} else {
			return hpu_error(b, "unknown model argument %s (model arguments: --data DIR, --hidden N, --depth N, --checkpoint; testing: --sleep-rank R --sleep-ms MS, --exit-rank R --exit-at N, --print-lines N)",
					 argv[i]);
		}
	}
	return 0;
}

static int setup(hpu_builder *b, int argc, char **argv)
{
	const char *dir = DEFAULT_DATA;
	long hidden = 1024, depth = 2;
	int ckpt = 0;
	mlp *m = calloc(1, sizeof *m);
	if (!m)
		return hpu_error(b, "out of memory");
	hpu_set_user(b, m);
	m->rank = hpu_rank(b);
	if (parse_args(b, argc, argv, &dir, &hidden, &depth, &ckpt, m) < 0)
		return -1;
	m->hidden = (size_t)hidden;
	char err[1200];
	if (load_split(&m->train, dir, "train", err, sizeof err) < 0 ||
	    load_split(&m->test, dir, "t10k", err, sizeof err) < 0)
		return hpu_error(b, "%s (on Debian: apt-get install dataset-fashion-mnist, or pass -- --data DIR)",
				 err);
	/* fc1, relu1, fc2, relu2, ..., fc<depth+1> */
	m->nlin = (int)depth + 1;
	for (int i = 0; i < m->nlin; i++)
		if (!(m->lin[i] = calloc(1, sizeof(linear))))
			return hpu_error(b, "out of memory");
	int h = (int)hidden;
	for (int i = 0; i < m->nlin; i++) {
		char *fc = m->names[2 * i], *relu = m->names[2 * i + 1];
		snprintf(fc, 16, "fc%d", i + 1);
		snprintf(relu, 16, "relu%d", i + 1);
		int last = i + 1 == m->nlin;
		if (add_linear(b, fc, m->lin[i], i ? h : 784, last ? CLASSES : h, ckpt && !last) < 0)
			return -1;
		if (last)
			break;
		hpu_layer *r = hpu_layer_add(b, relu, m->hidden, m->hidden, &relu_ops, &m->hidden);
		if (!r)
			return -1;
		if (ckpt)
			hpu_layer_checkpoint(r, 1);
	}
	hpu_dataset train = {m->train.images.count, 784, 1, fetch, &m->train};
	hpu_dataset test = {m->test.images.count, 784, 1, fetch, &m->test};
	hpu_loss loss = {.loss = xent, .metric = correct, .metric_name = "accuracy", .user = m};
	if (hpu_dataset_set(b, HPU_SPLIT_TRAIN, &train) < 0 ||
	    hpu_dataset_set(b, HPU_SPLIT_TEST, &test) < 0 || hpu_loss_set(b, &loss) < 0)
		return -1;
	return 0;
}

HPU_MODEL(.name = "fmnist_mlp", .setup = setup, .teardown = teardown);
