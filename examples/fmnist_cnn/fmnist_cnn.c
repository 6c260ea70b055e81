/* fmnist_cnn: a convolutional network on Fashion-MNIST.
 *
 *   conv 5x5 (1 -> C1, pad 2)  relu  maxpool 2x2    [C1, 28, 28] -> [C1, 14, 14]
 *   conv 5x5 (C1 -> C2, pad 2) relu  maxpool 2x2    [C2, 14, 14] -> [C2, 7, 7]
 *   flatten  linear C2*49 -> H  relu  linear H -> 10
 *
 * The dataset's benchmark calls this "2 Conv+pooling" (0.916 accuracy).
 * Its declared training defaults (HPU_MODEL's .defaults; flags and
 * --config override them): 3 epochs, a global batch of 64, AdamW at lr
 * 1e-3 on a cosine schedule. On 2 workers of a 2-core machine (about 1100
 * samples/s), `hpulaunch --devices 2 fmnist_cnn.so` with no flags
 * reaches 0.912 test accuracy in about 160 s.
 *
 * Model arguments (after "--" on the hpulaunch command line):
 *   --data DIR           where the IDX files are
 *                        (default: /usr/share/datasets/fashion-mnist)
 *   --channels C1,C2     output channels of the two convolutions (32,64)
 *   --hidden H           width of the hidden linear layer (256)
 *
 * Every layer is the library's (<hpu/layers.h>), initialized as torch's.
 */
#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <stdlib.h>
#include <string.h>

#include "examples/common/args.h"
#include "examples/common/fmnist.h"

/* The training set's pixel mean and standard deviation, on the 0..1 scale. */
#define PIXEL_MEAN 0.2860f
#define PIXEL_STD 0.3530f

static void teardown(void *user)
{
	fmnist *data = user;
	if (!data)
		return;
	fmnist_free(data);
	free(data);
}

/* "C1,C2", each 1..1024 */
static int channels_arg(hpu_builder *b, const char *v, long ch[2])
{
	const char *end;
	if (ex_long_prefix(v, &end, &ch[0]) == 0 && *end == ',' &&
	    ex_long_prefix(end + 1, &end, &ch[1]) == 0 && !*end && ch[0] >= 1 && ch[0] <= 1024 &&
	    ch[1] >= 1 && ch[1] <= 1024)
		return 0;
	return hpu_error(b, "--channels wants two numbers in 1..1024 as C1,C2 (e.g. 32,64), got %s", v);
}

/* The arguments, as the errors list them. */
#define USAGE "--data DIR, --channels C1,C2, --hidden N"

static int parse_args(hpu_builder *b, int argc, char **argv, const char **dir,
		      long ch[2], long *hidden)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--data") && ex_arg_has_value(argc, argv, i, USAGE)) {
			*dir = argv[++i];
		} else if (!strcmp(argv[i], "--channels") && ex_arg_has_value(argc, argv, i, USAGE)) {
			if (channels_arg(b, argv[++i], ch) < 0)
				return -1;
		} else if (!strcmp(argv[i], "--hidden") && ex_arg_has_value(argc, argv, i, USAGE)) {
			if (ex_arg_long(b, "--hidden", argv[++i], 1, 65536, hidden) < 0)
				return -1;
		} else {
			return ex_arg_unknown(b, argc, argv, i, USAGE);
		}
	}
	return 0;
}

static int setup(hpu_builder *b, int argc, char **argv)
{
	const char *dir = FMNIST_DEFAULT_DIR;
	long ch[2] = {32, 64}, hidden = 256;
	if (parse_args(b, argc, argv, &dir, ch, &hidden) < 0)
		return -1;
	fmnist *data = calloc(1, sizeof *data);
	if (!data)
		return hpu_error(b, "out of memory");
	hpu_set_user(b, data);
	const int64_t image[3] = {1, 28, 28};
	fmnist_declare(b, data, dir, 3, image, PIXEL_MEAN, PIXEL_STD);
	/* conv 5x5, stride 1, pad 2 keeps the side; each pool halves it. A
	 * failed declaration makes the ones after it do nothing: the status
	 * at the end reports it. */
	hpu_conv2d(b, "conv1", "image", "c1",
		   (hpu_conv2d_opts){.out = ch[0], .kernel = 5, .pad = 2, .bias = true});
	hpu_relu(b, "relu1", "c1", "r1");
	hpu_maxpool2d(b, "pool1", "r1", "p1", (hpu_pool2d_opts){.kernel = 2});
	hpu_conv2d(b, "conv2", "p1", "c2",
		   (hpu_conv2d_opts){.out = ch[1], .kernel = 5, .pad = 2, .bias = true});
	hpu_relu(b, "relu2", "c2", "r2");
	hpu_maxpool2d(b, "pool2", "r2", "p2", (hpu_pool2d_opts){.kernel = 2});
	hpu_flatten(b, "flatten", "p2", "f");
	hpu_linear(b, "fc1", "f", "h", (hpu_linear_opts){.out = hidden, .bias = true});
	hpu_relu(b, "relu3", "h", "r3");
	hpu_linear(b, "fc2", "r3", "logits", (hpu_linear_opts){.out = FMNIST_CLASSES, .bias = true});
	hpu_cross_entropy(b, "xent", "logits,label", "loss");
	hpu_accuracy(b, "accuracy", "logits,label", "correct");
	hpu_loss_add(b, "loss", 1.0f);
	hpu_metric_add(b, "accuracy", "correct");
	return hpu_builder_status(b);
}

HPU_MODEL(.name = "fmnist_cnn", .setup = setup, .teardown = teardown,
	  .defaults = {.epochs = 3, .batch_size = 64, .optimizer = "adamw", .lr = 1e-3,
		       .scheduler = "cosine"});
