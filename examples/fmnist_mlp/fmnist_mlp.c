/* fmnist_mlp: an MLP (ReLU) on Fashion-MNIST, 784-1024-1024-10 by default.
 *
 * Model arguments (after "--" on the hpulaunch command line):
 *   --data DIR     where the IDX files are
 *                  (default: /usr/share/datasets/fashion-mnist, from
 *                  Debian's dataset-fashion-mnist)
 *   --hidden N     width of the hidden layers (1024)
 *   --depth N      number of hidden layers (2): N+1 linear layers
 *   --checkpoint   activation checkpointing on every layer but the last
 * Testing knobs, all counted in training forwards of the loss (one per
 * micro-step) on the rank itself:
 *   --sleep-rank R --sleep-ms MS   rank R sleeps MS in its 10th, so that
 *                                  the others wait in a collective
 *   --exit-rank R --exit-at N      rank R calls exit(0) in its Nth
 *   --print-lines N                a chatty model: every rank prints N
 *                                  lines to stdout in each
 *
 * The graph: "image" -> fc1 -> relu1 -> fc2 -> relu2 -> ... -> fc<depth+1>
 * -> "logits", all library layers (<hpu/layers.h>), then one custom layer,
 * "xent": the softmax cross-entropy ("loss", what training minimizes) and
 * whether the arg-max is the label ("correct", the test accuracy). It is
 * the library's hpu_cross_entropy and hpu_accuracy in one, written out to
 * show a custom layer, with the testing knobs and two profiling ranges
 * of the model's own ("loss", "count_correct") in its forward.
 */
#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "fmnist.h"

#define CLASSES FMNIST_CLASSES
#define MAX_DEPTH 256

typedef struct mlp {
	fmnist data;
	int rank;
	long sleep_rank, sleep_ms, exit_rank, exit_at, print_lines; /* testing */
	long calls; /* training forwards of "xent" so far */
} mlp;

/* ---- the loss and the metric: a custom layer ---- */

/* log(sum(exp(z[0 .. CLASSES)))), stable. */
static double logsumexp(const float *z)
{
	float m = z[0];
	for (int j = 1; j < CLASSES; j++)
		m = z[j] > m ? z[j] : m;
	double s = 0;
	for (int j = 0; j < CLASSES; j++)
		s += exp((double)z[j] - m);
	return m + log(s);
}

/* The testing knobs (see the top), once per training micro-step. */
static void testing_knobs(mlp *m)
{
	m->calls++;
	if (m->sleep_ms > 0 && m->rank == m->sleep_rank && m->calls == 10) {
		struct timespec ts = {m->sleep_ms / 1000, (m->sleep_ms % 1000) * 1000000};
		nanosleep(&ts, NULL);
	}
	if (m->exit_at > 0 && m->rank == m->exit_rank && m->calls == m->exit_at)
		exit(0); /* a model that leaves in the middle */
	if (m->print_lines > 0) {
		for (long i = 0; i < m->print_lines; i++)
			printf("chatter rank %d call %ld line %ld of %ld\n", m->rank, m->calls,
			       i + 1, m->print_lines);
		fflush(stdout);
	}
}

/* in: logits [10], label; out: loss = -log softmax(logits)[label],
 * correct = 1 if the arg-max is the label (else 0). */
static int xent_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	const float *z = hpu_f32(&in[0]);
	const int32_t *y = hpu_i32(&in[1]);
	float *loss = hpu_f32(&out[0]), *correct = hpu_f32(&out[1]);
	{
		HPU_PROFILE_SCOPE("loss"); /* a range in the --profile trace, scoped form */
		if (c->train && !c->recompute)
			testing_knobs(hpu_layer_user(l));
		for (int i = 0; i < c->batch; i++) {
			if (y[i] < 0 || y[i] >= CLASSES)
				return hpu_layer_error(l, "label %d of row %d is not a class", y[i], i);
			loss[i] = (float)(logsumexp(z + i * CLASSES) - z[i * CLASSES + y[i]]);
		}
	}
	hpu_profile_start("count_correct"); /* the same with start and stop */
	for (int i = 0; i < c->batch; i++) {
		const float *zi = z + i * CLASSES;
		int best = 0;
		for (int j = 1; j < CLASSES; j++)
			best = zi[j] > zi[best] ? j : best;
		correct[i] = best == y[i];
	}
	hpu_profile_stop("count_correct");
	return 0;
}

/* dL/dlogits = (softmax(logits) - onehot(label)) dL/dloss; "correct"
 * has no gradient. */
static int xent_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			 const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)l;
	(void)out;
	const float *z = hpu_f32(&in[0]), *g = hpu_f32(&dout[0]);
	const int32_t *y = hpu_i32(&in[1]);
	float *dz = hpu_f32(&din[0]);
	for (int i = 0; dz && i < c->batch; i++) {
		const float *zi = z + i * CLASSES;
		double lse = logsumexp(zi);
		for (int j = 0; j < CLASSES; j++)
			dz[i * CLASSES + j] = ((float)exp(zi[j] - lse) - (j == y[i])) * g[i];
	}
	return 0;
}

static const hpu_layer_ops xent_ops = {.forward = xent_forward, .backward = xent_backward};

/* ---- the model ---- */

static void teardown(void *user)
{
	mlp *m = user;
	if (!m)
		return;
	fmnist_free(&m->data);
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
	const char *dir = FMNIST_DEFAULT_DIR;
	long hidden = 1024, depth = 2;
	int ckpt = 0;
	mlp *m = calloc(1, sizeof *m);
	if (!m)
		return hpu_error(b, "out of memory");
	hpu_set_user(b, m);
	m->rank = hpu_rank(b);
	if (parse_args(b, argc, argv, &dir, &hidden, &depth, &ckpt, m) < 0 ||
	    fmnist_declare(b, &m->data, dir, 1, (int64_t[]){FMNIST_PIXELS}, 0.0f, 1.0f) < 0)
		return -1;
	/* "image" -fc1-> h1 -relu1-> a1 -fc2-> h2 ... -fc<depth+1>-> "logits" */
	char x[32] = "image", name[32], h[32];
	for (int i = 1; i <= depth; i++) {
		snprintf(name, sizeof name, "fc%d", i);
		snprintf(h, sizeof h, "h%d", i);
		hpu_layer *fc = hpu_linear(b, name, x, h, hidden, 1);
		snprintf(name, sizeof name, "relu%d", i);
		snprintf(x, sizeof x, "a%d", i);
		hpu_layer *relu = fc ? hpu_relu(b, name, h, x) : NULL;
		if (!relu)
			return -1;
		hpu_layer_checkpoint(fc, ckpt);
		hpu_layer_checkpoint(relu, ckpt);
	}
	snprintf(name, sizeof name, "fc%ld", depth + 1);
	if (!hpu_linear(b, name, x, "logits", CLASSES, 1))
		return -1;
	hpu_layer *l = hpu_layer_add(b, "xent", "logits,label", &xent_ops, m);
	if (!l || hpu_layer_output(l, "loss", HPU_F32, 0, NULL) < 0 ||
	    hpu_layer_output(l, "correct", HPU_F32, 0, NULL) < 0 ||
	    hpu_loss_add(b, "loss", 1.0f) < 0 || hpu_metric_add(b, "accuracy", "correct") < 0)
		return -1;
	return 0;
}

HPU_MODEL(.name = "fmnist_mlp", .setup = setup, .teardown = teardown);
