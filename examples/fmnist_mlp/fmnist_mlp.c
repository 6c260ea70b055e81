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
 * -> "logits"; the loss is the cross-entropy of "logits" against the
 * label, the metric the accuracy: library layers all (<hpu/layers.h>),
 * no backward written here. One custom layer, "probe", hands the label
 * on as "target" (so it runs right before the loss, once per micro-step)
 * and holds the testing knobs and two profiling ranges of the model's own:
 * "loss" in training, "count_correct" in evaluation. It has no parameters
 * and its input needs no gradient, so it needs no backward either.
 */
#include <hpu/hpu.h>
#include <hpu/layers.h>
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
	long calls; /* training forwards of "probe" so far */
} mlp;

/* ---- the probe: a custom layer ---- */

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

/* target = label; the knobs and ranges around it. */
static int probe_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	if (!c->train) { /* the start/stop form of a range */
		hpu_profile_start("count_correct");
		memcpy(out[0].data, in[0].data, hpu_numel(&in[0]) * 4);
		hpu_profile_stop("count_correct");
		return 0;
	}
	HPU_PROFILE_SCOPE("loss"); /* the scoped form */
	if (!c->recompute)
		testing_knobs(hpu_layer_user(l));
	memcpy(out[0].data, in[0].data, hpu_numel(&in[0]) * 4);
	return 0;
}

static const hpu_layer_ops probe_ops = {.forward = probe_forward};

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
	hpu_layer *probe = hpu_layer_add(b, "probe", "label", &probe_ops, m);
	if (!probe || hpu_layer_output(probe, "target", HPU_I32, 0, NULL) < 0 ||
	    !hpu_cross_entropy(b, "xent", "logits,target", "loss") ||
	    !hpu_accuracy(b, "acc", "logits,target", "correct") ||
	    hpu_loss_add(b, "loss", 1.0f) < 0 || hpu_metric_add(b, "accuracy", "correct") < 0)
		return -1;
	return 0;
}

HPU_MODEL(.name = "fmnist_mlp", .setup = setup, .teardown = teardown);
