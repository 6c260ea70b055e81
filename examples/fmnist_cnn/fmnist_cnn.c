/* fmnist_cnn: a convolutional network on Fashion-MNIST.
 *
 *   conv 5x5 (1 -> C1, pad 2)  relu  maxpool 2x2    [C1, 28, 28] -> [C1, 14, 14]
 *   conv 5x5 (C1 -> C2, pad 2) relu  maxpool 2x2    [C2, 14, 14] -> [C2, 7, 7]
 *   linear C2*49 -> H  relu  linear H -> 10
 *
 * The dataset's benchmark calls this "2 Conv+pooling" (0.916 accuracy).
 * On 2 workers of a 2-core machine (about 1800 samples/s):
 *   hpulaunch --devices 2 --epochs 3 --batch-size 64 --scheduler cosine fmnist_cnn.so
 * reaches 0.915 test accuracy in about 100 s (2 epochs: 0.902-0.909).
 *
 * Model arguments (after "--" on the hpulaunch command line):
 *   --data DIR           where the IDX files are
 *                        (default: /usr/share/datasets/fashion-mnist)
 *   --channels C1,C2     output channels of the two convolutions (32,64)
 *   --hidden H           width of the hidden linear layer (256)
 *
 * Reads top to bottom: data, the layers (conv, relu, maxpool, linear:
 * parameters, forward, backward), the loss, the model's declaration.
 * Parameters can move between calls (ZeRO-3 gathers them), so every
 * forward and backward asks for them with hpu_param()/hpu_grad().
 */
#include <hpu/hpu.h>
#include <hpu/ops.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "idx.h"

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"
#define CLASSES 10
#define SIDE 28 /* images are SIDE x SIDE, one channel */
#define KERNEL 5

/* ---- data ---- */

typedef struct split {
	idx_array images, labels;
} split;

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
	if (s->images.count != s->labels.count || s->images.item != SIDE * SIDE) {
		snprintf(err, errlen, "%s/%s: %zu images of %zu bytes but %zu labels", dir,
			 prefix, s->images.count, s->images.item, s->labels.count);
		return -1;
	}
	return 0;
}

/* The training set's pixel mean and standard deviation, on the 0..1 scale. */
#define PIXEL_MEAN 0.2860f
#define PIXEL_STD 0.3530f

/* x[1, 28, 28] = (pixels / 255 - mean) / std, labels[0] = class. */
static int fetch(void *user, size_t i, float *x, int32_t *labels)
{
	const split *s = user;
	const uint8_t *px = s->images.data + i * SIDE * SIDE;
	const float scale = 1.0f / (255.0f * PIXEL_STD), shift = PIXEL_MEAN / PIXEL_STD;
	for (int k = 0; k < SIDE * SIDE; k++)
		x[k] = px[k] * scale - shift;
	labels[0] = s->labels.data[i];
	return labels[0] < CLASSES ? 0 : -1;
}

/* ---- conv: y[B, O, H, W] = conv5x5(x[B, C, H, W], w[O, C, 5, 5], pad 2) + b[O] ---- */

typedef struct conv {
	hpu_conv2d_shape s; /* batch is set per call */
	float *scratch;     /* im2col of one sample: the ops go sample by sample */
} conv;

static int conv_forward(hpu_layer *l, const float *in, float *out, int batch)
{
	conv *c = hpu_layer_user(l);
	hpu_conv2d_shape s = c->s;
	s.batch = batch;
	hpu_conv2d_forward(&s, in, hpu_param(l, 0), hpu_param(l, 1), out, c->scratch);
	return 0;
}

static int conv_backward(hpu_layer *l, const float *in, const float *out,
			 const float *dout, float *din, int batch)
{
	(void)out;
	conv *c = hpu_layer_user(l);
	hpu_conv2d_shape s = c->s;
	s.batch = batch;
	hpu_conv2d_backward(&s, in, hpu_param(l, 0), dout, din, hpu_grad(l, 0),
			    hpu_grad(l, 1), c->scratch);
	return 0;
}

static const hpu_layer_ops conv_ops = {conv_forward, conv_backward};

/* Same-size convolution of [in_ch, side, side] to [out_ch, side, side].
 * Note: the bias's fan-in for HPU_INIT_FAN_IN_UNIFORM is the layer's
 * in_size (in_ch*side*side), so it starts smaller than torch's conv bias. */
static int add_conv(hpu_builder *b, const char *name, conv *c, int in_ch, int out_ch,
		    int side)
{
	c->s = (hpu_conv2d_shape){.in_ch = in_ch, .height = side, .width = side,
				  .out_ch = out_ch, .kernel = KERNEL, .stride = 1,
				  .pad = KERNEL / 2};
	if (!(c->scratch = malloc(hpu_conv2d_scratch(&c->s) * sizeof(float))))
		return hpu_error(b, "out of memory");
	size_t in = (size_t)in_ch * side * side, out = (size_t)out_ch * side * side;
	hpu_layer *l = hpu_layer_add(b, name, in, out, &conv_ops, c);
	if (!l)
		return -1;
	int64_t w[4] = {out_ch, in_ch, KERNEL, KERNEL}, bias[1] = {out_ch};
	if (hpu_param_add(l, "weight", 4, w, HPU_INIT_FAN_IN_UNIFORM) < 0 ||
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

static int add_relu(hpu_builder *b, const char *name, size_t *n)
{
	return hpu_layer_add(b, name, *n, *n, &relu_ops, n) ? 0 : -1;
}

/* ---- maxpool 2x2: y[B, C, H/2, W/2] = max over each 2x2 window of x[B, C, H, W] ----
 *
 * The arg-max indices are not kept between forward and backward (the
 * runtime may recompute or drop activations): backward recomputes them
 * from its input, one sample at a time, into the layer's own buffers. */

typedef struct pool {
	int ch, side;  /* input [ch, side, side] */
	float *y;      /* one sample's output */
	int32_t *idx;  /* one sample's arg-max */
} pool;

static int pool_forward(hpu_layer *l, const float *in, float *out, int batch)
{
	pool *p = hpu_layer_user(l);
	size_t in_n = (size_t)p->ch * p->side * p->side, out_n = in_n / 4;
	for (int n = 0; n < batch; n++)
		hpu_maxpool2d_forward(in + n * in_n, out + n * out_n, p->idx, 1, p->ch,
				      p->side, p->side, 2, 2);
	return 0;
}

static int pool_backward(hpu_layer *l, const float *in, const float *out,
			 const float *dout, float *din, int batch)
{
	(void)out;
	pool *p = hpu_layer_user(l);
	size_t in_n = (size_t)p->ch * p->side * p->side, out_n = in_n / 4;
	for (int n = 0; n < batch; n++) {
		hpu_maxpool2d_forward(in + n * in_n, p->y, p->idx, 1, p->ch, p->side,
				      p->side, 2, 2);
		hpu_maxpool2d_backward(dout + n * out_n, p->idx, din + n * in_n, 1, p->ch,
				       p->side, p->side, 2, 2);
	}
	return 0;
}

static const hpu_layer_ops pool_ops = {pool_forward, pool_backward};

static int add_pool(hpu_builder *b, const char *name, pool *p, int ch, int side)
{
	p->ch = ch;
	p->side = side;
	size_t in = (size_t)ch * side * side, out = in / 4;
	p->y = malloc(out * sizeof *p->y);
	p->idx = malloc(out * sizeof *p->idx);
	if (!p->y || !p->idx)
		return hpu_error(b, "out of memory");
	return hpu_layer_add(b, name, in, out, &pool_ops, p) ? 0 : -1;
}

/* ---- linear: y[B, out] = x[B, in] w[out, in]^T + b[out] ---- */

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

static int add_linear(hpu_builder *b, const char *name, linear *p, int in, int out)
{
	p->in = in;
	p->out = out;
	hpu_layer *l = hpu_layer_add(b, name, (size_t)in, (size_t)out, &linear_ops, p);
	if (!l)
		return -1;
	int64_t w[2] = {out, in}, bias[1] = {out};
	if (hpu_param_add(l, "weight", 2, w, HPU_INIT_FAN_IN_UNIFORM) < 0 ||
	    hpu_param_add(l, "bias", 1, bias, HPU_INIT_FAN_IN_UNIFORM) < 0)
		return -1;
	return 0;
}

/* ---- loss and metric ---- */

static float xent(void *user, const float *out, const int32_t *labels,
		  float *dout, int batch)
{
	(void)user;
	return hpu_softmax_xent(out, labels, dout, batch, CLASSES);
}

static double correct(void *user, const float *out, const int32_t *labels, int batch)
{
	(void)user;
	return hpu_count_correct(out, labels, batch, CLASSES);
}

/* ---- the model ---- */

typedef struct cnn {
	split train, test;
	conv conv[2];
	pool pool[2];
	linear fc[2];
	size_t relu_n[3]; /* floats per sample of each relu */
} cnn;

static void teardown(void *user)
{
	cnn *m = user;
	if (!m)
		return;
	idx_free(&m->train.images);
	idx_free(&m->train.labels);
	idx_free(&m->test.images);
	idx_free(&m->test.labels);
	for (int i = 0; i < 2; i++) {
		free(m->conv[i].scratch);
		free(m->pool[i].y);
		free(m->pool[i].idx);
	}
	free(m);
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

static int parse_args(hpu_builder *b, int argc, char **argv, const char **dir,
		      long ch[2], long *hidden)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--data") && i + 1 < argc) {
			*dir = argv[++i];
		} else if (!strcmp(argv[i], "--channels") && i + 1 < argc) {
			if (channels_arg(b, argv[++i], ch) < 0)
				return -1;
		} else if (!strcmp(argv[i], "--hidden") && i + 1 < argc) {
			if (ex_arg_long(b, "--hidden", argv[++i], 1, 65536, hidden) < 0)
				return -1;
		} else {
			return hpu_error(b, "unknown model argument %s (model arguments: --data DIR, --channels C1,C2, --hidden N)",
					 argv[i]);
		}
	}
	return 0;
}

static int add_layers(hpu_builder *b, cnn *m, int c1, int c2, int hidden)
{
	const int s1 = SIDE, s2 = SIDE / 2, s3 = SIDE / 4;
	m->relu_n[0] = (size_t)c1 * s1 * s1;
	m->relu_n[1] = (size_t)c2 * s2 * s2;
	m->relu_n[2] = (size_t)hidden;
	if (add_conv(b, "conv1", &m->conv[0], 1, c1, s1) < 0 ||
	    add_relu(b, "relu1", &m->relu_n[0]) < 0 ||
	    add_pool(b, "pool1", &m->pool[0], c1, s1) < 0 ||
	    add_conv(b, "conv2", &m->conv[1], c1, c2, s2) < 0 ||
	    add_relu(b, "relu2", &m->relu_n[1]) < 0 ||
	    add_pool(b, "pool2", &m->pool[1], c2, s2) < 0 ||
	    add_linear(b, "fc1", &m->fc[0], c2 * s3 * s3, hidden) < 0 ||
	    add_relu(b, "relu3", &m->relu_n[2]) < 0 ||
	    add_linear(b, "fc2", &m->fc[1], hidden, CLASSES) < 0)
		return -1;
	return 0;
}

static int setup(hpu_builder *b, int argc, char **argv)
{
	const char *dir = DEFAULT_DATA;
	long ch[2] = {32, 64}, hidden = 256;
	if (parse_args(b, argc, argv, &dir, ch, &hidden) < 0)
		return -1;
	cnn *m = calloc(1, sizeof *m);
	if (!m)
		return hpu_error(b, "out of memory");
	hpu_set_user(b, m);
	char err[1200];
	if (load_split(&m->train, dir, "train", err, sizeof err) < 0 ||
	    load_split(&m->test, dir, "t10k", err, sizeof err) < 0)
		return hpu_error(b, "%s (on Debian: apt-get install dataset-fashion-mnist, or pass -- --data DIR)",
				 err);
	if (add_layers(b, m, (int)ch[0], (int)ch[1], (int)hidden) < 0)
		return -1;
	hpu_dataset train = {m->train.images.count, SIDE * SIDE, 1, fetch, &m->train};
	hpu_dataset test = {m->test.images.count, SIDE * SIDE, 1, fetch, &m->test};
	hpu_loss loss = {.loss = xent, .metric = correct, .metric_name = "accuracy"};
	if (hpu_dataset_set(b, HPU_SPLIT_TRAIN, &train) < 0 ||
	    hpu_dataset_set(b, HPU_SPLIT_TEST, &test) < 0 || hpu_loss_set(b, &loss) < 0)
		return -1;
	return 0;
}

HPU_MODEL(.name = "fmnist_cnn", .setup = setup, .teardown = teardown);
