/* resnet: a residual network (He et al., 2015; the CIFAR-style ResNet of
 * three stages) on Fashion-MNIST, built from the layer library.
 *
 *   stem:     conv 3x3 (1 -> W), batch norm, relu                [W, 28, 28]
 *   stage s = 0, 1, 2 of N blocks each, width W << s, the first block of
 *   stages 1 and 2 at stride 2:              [W, 28, 28] [2W, 14, 14] [4W, 7, 7]
 *     block:  y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
 *             conv1 3x3 at the block's stride, conv2 3x3; the shortcut is x,
 *             or bn(conv 1x1 at the stride) where the shape changes
 *   head:     global average pool (7x7), flatten, linear 4W -> 10
 * Convolutions have no bias (the batch norm after each has one). Loss:
 * softmax cross-entropy; metric: accuracy.
 *
 * Its declared training defaults (HPU_MODEL's .defaults; flags and
 * --config override them): 3 epochs, a global batch of 64, AdamW at lr
 * 2e-3 on a cosine schedule. On 2 workers of a 2-core machine (about 1000
 * samples/s), `hpulaunch --devices 2 resnet.so` with no flags
 * reaches 0.925 test accuracy in about 190 s (2 epochs: 0.916;
 * --blocks 1: 0.915 in 3 epochs, --width 32 --blocks 1: 0.922 in 290 s).
 *
 * Model arguments (after "--"):
 *   --data DIR     where the IDX files are (/usr/share/datasets/fashion-mnist)
 *   --width W      the stem's and the first stage's channels (16)
 *   --blocks N     residual blocks per stage (2)
 */
#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/common/args.h"
#include "examples/common/fmnist.h"

#define STAGES 3
#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.1f
#define NAME_LEN 32

/* The training set's pixel mean and standard deviation, on the 0..1 scale. */
#define PIXEL_MEAN 0.2860f
#define PIXEL_STD 0.3530f

/* ---- the model ---- */

/* A failed declaration makes the ones after it do nothing (sticky
 * errors): setup's hpu_builder_status() reports it, so none is checked
 * here. */

/* Batch norm `name` of tensor `in`, its running statistics averaged
 * over the ranks after every step. */
#define BN(name, in)                                                        \
	hpu_batchnorm(b, name, in, name,                                    \
		      (hpu_batchnorm_opts){.eps = BN_EPS, .momentum = BN_MOMENTUM, \
					   .sync = HPU_BUFFER_MEAN})

/* Each layer writes the tensor of its own name, "<block>.<part>" (block
 * names are "s<stage>.b<k>", well under 16 bytes). */
#define PART(v) char v[NAME_LEN]; snprintf(v, sizeof v, "%.16s." #v, p)

/* A 3x3 (or 1x1: `k`) convolution with no bias, zero padding keeping
 * the side at stride 1. */
#define CONV(name, in, w_, k_, s_)                                          \
	hpu_conv2d(b, name, in, name,                                       \
		   (hpu_conv2d_opts){.out = (w_), .kernel = (k_), .stride = (s_), .pad = (k_) / 2})

/* Block p: y = block(x) with `width` output channels, conv1 at `stride`. */
static void block(hpu_builder *b, const char *p, const char *x, char *y, int width, int stride)
{
	PART(conv1); PART(bn1); PART(relu1); PART(conv2); PART(bn2);
	PART(proj); PART(proj_bn); PART(sum);
	char in[2 * NAME_LEN + 1];
	hpu_tensor xi = {0}; /* stays zeros when an earlier declaration failed */
	hpu_tensor_info(b, x, &xi);
	snprintf(y, NAME_LEN, "%.16s.out", p);
	CONV(conv1, x, width, 3, stride);
	BN(bn1, conv1);
	hpu_relu(b, relu1, bn1, relu1);
	CONV(conv2, relu1, width, 3, 1);
	BN(bn2, conv2);
	const char *skip = x;
	if (stride != 1 || xi.shape[0] != width) {
		CONV(proj, x, width, 1, stride);
		BN(proj_bn, proj);
		skip = proj_bn;
	}
	snprintf(in, sizeof in, "%s,%s", bn2, skip);
	hpu_add(b, sum, in, sum);
	hpu_relu(b, y, sum, y);
}

static int declare(hpu_builder *b, int width, int blocks)
{
	char x[NAME_LEN] = "stem", y[NAME_LEN], p[NAME_LEN];
	CONV("stem.conv", "image", width, 3, 1);
	BN("stem.bn", "stem.conv");
	hpu_relu(b, "stem", "stem.bn", "stem");
	for (int s = 0; s < STAGES; s++)
		for (int k = 0; k < blocks; k++) {
			snprintf(p, sizeof p, "s%d.b%d", s, k);
			block(b, p, x, y, width << s, s > 0 && k == 0 ? 2 : 1);
			memcpy(x, y, sizeof x);
		}
	hpu_tensor last = {0};
	hpu_tensor_info(b, x, &last);
	int64_t side = last.shape[1]; /* 7: the pool covers the whole plane */
	hpu_avgpool2d(b, "pool", x, "pool", (hpu_pool2d_opts){.kernel = side});
	hpu_flatten(b, "flatten", "pool", "flatten");
	hpu_linear(b, "fc", "flatten", "logits",
		   (hpu_linear_opts){.out = FMNIST_CLASSES, .bias = true});
	hpu_cross_entropy(b, "xent", "logits,label", "xent");
	hpu_accuracy(b, "correct", "logits,label", "correct");
	hpu_loss_add(b, "xent", 1.0f);
	hpu_metric_add(b, "accuracy", "correct");
	return hpu_builder_status(b);
}

/* ---- arguments and setup ---- */

/* The arguments, as the errors list them. */
#define USAGE "--data DIR, --width W, --blocks N"

static int parse_args(hpu_builder *b, int argc, char **argv, const char **dir, long *width,
		      long *blocks)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--data") && ex_arg_has_value(argc, argv, i, USAGE)) {
			*dir = argv[++i];
		} else if (!strcmp(argv[i], "--width") && ex_arg_has_value(argc, argv, i, USAGE)) {
			if (ex_arg_long(b, "--width", argv[++i], 1, 1024, width) < 0)
				return -1;
		} else if (!strcmp(argv[i], "--blocks") && ex_arg_has_value(argc, argv, i, USAGE)) {
			if (ex_arg_long(b, "--blocks", argv[++i], 1, 64, blocks) < 0)
				return -1;
		} else {
			return ex_arg_unknown(b, argc, argv, i, USAGE);
		}
	}
	return 0;
}

static void teardown(void *user)
{
	fmnist *data = user;
	if (data)
		fmnist_free(data);
	free(data);
}

static int setup(hpu_builder *b, int argc, char **argv)
{
	const char *dir = FMNIST_DEFAULT_DIR;
	long width = 16, blocks = 2;
	if (parse_args(b, argc, argv, &dir, &width, &blocks) < 0)
		return -1;
	fmnist *data = calloc(1, sizeof *data);
	if (!data)
		return hpu_error(b, "out of memory");
	hpu_set_user(b, data);
	const int64_t image[3] = {1, 28, 28};
	fmnist_declare(b, data, dir, 3, image, PIXEL_MEAN, PIXEL_STD);
	return declare(b, (int)width, (int)blocks);
}

HPU_MODEL(.name = "resnet", .setup = setup, .teardown = teardown,
	  .defaults = {.epochs = 3, .batch_size = 64, .optimizer = "adamw", .lr = 2e-3,
		       .scheduler = "cosine"});
