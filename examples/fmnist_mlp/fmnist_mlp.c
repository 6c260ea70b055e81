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
 * The graph: "image" -> fc1 -> relu1 -> fc2 -> relu2 -> ... -> fc<depth+1>
 * -> "logits"; the loss is the cross-entropy of "logits" against the
 * label, the metric the accuracy: library layers all (<hpu/layers.h>),
 * no backward written here.
 */
#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/common/args.h"
#include "examples/common/fmnist.h"

#define CLASSES FMNIST_CLASSES
#define MAX_DEPTH 256

static void teardown(void *user)
{
	fmnist *data = user;
	if (!data)
		return;
	fmnist_free(data);
	free(data);
}

/* The arguments, as the errors list them. */
#define USAGE "--data DIR, --hidden N, --depth N, --checkpoint"

static int parse_args(hpu_builder *b, int argc, char **argv, const char **dir,
		      long *hidden, long *depth, int *ckpt)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--data") && ex_arg_has_value(argc, argv, i, USAGE)) {
			*dir = argv[++i];
		} else if (!strcmp(argv[i], "--hidden") && ex_arg_has_value(argc, argv, i, USAGE)) {
			if (ex_arg_long(b, "--hidden", argv[++i], 1, 65536, hidden) < 0)
				return -1;
		} else if (!strcmp(argv[i], "--depth") && ex_arg_has_value(argc, argv, i, USAGE)) {
			if (ex_arg_long(b, "--depth", argv[++i], 1, MAX_DEPTH, depth) < 0)
				return -1;
		} else if (!strcmp(argv[i], "--checkpoint")) {
			*ckpt = 1;
		} else {
			return ex_arg_unknown(b, argc, argv, i, USAGE);
		}
	}
	return 0;
}

static int setup(hpu_builder *b, int argc, char **argv)
{
	const char *dir = FMNIST_DEFAULT_DIR;
	long hidden = 1024, depth = 2;
	int ckpt = 0;
	if (parse_args(b, argc, argv, &dir, &hidden, &depth, &ckpt) < 0)
		return -1;
	fmnist *data = calloc(1, sizeof *data);
	if (!data)
		return hpu_error(b, "out of memory");
	hpu_set_user(b, data);
	fmnist_declare(b, data, dir, 1, (int64_t[]){FMNIST_PIXELS}, 0.0f, 1.0f);
	/* "image" -fc1-> h1 -relu1-> a1 -fc2-> h2 ... -fc<depth+1>-> "logits".
	 * A failed declaration makes the ones after it do nothing: the
	 * status at the end reports it. */
	char x[32] = "image", name[32], h[32];
	for (int i = 1; i <= depth; i++) {
		snprintf(name, sizeof name, "fc%d", i);
		snprintf(h, sizeof h, "h%d", i);
		hpu_layer *fc = hpu_linear(b, name, x, h, (hpu_linear_opts){.out = hidden, .bias = true});
		snprintf(name, sizeof name, "relu%d", i);
		snprintf(x, sizeof x, "a%d", i);
		hpu_layer *relu = hpu_relu(b, name, h, x);
		hpu_layer_checkpoint(fc, ckpt);
		hpu_layer_checkpoint(relu, ckpt);
	}
	snprintf(name, sizeof name, "fc%ld", depth + 1);
	hpu_linear(b, name, x, "logits", (hpu_linear_opts){.out = CLASSES, .bias = true});
	hpu_cross_entropy(b, "xent", "logits,label", "loss");
	hpu_accuracy(b, "acc", "logits,label", "correct");
	hpu_loss_add(b, "loss", 1.0f);
	hpu_metric_add(b, "accuracy", "correct");
	return hpu_builder_status(b);
}

HPU_MODEL(.name = "fmnist_mlp", .setup = setup, .teardown = teardown);
