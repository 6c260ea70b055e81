/* fmnist: Fashion-MNIST for the example models: both splits read from
 * their IDX files (<hpu/data.h>) and declared as the model's datasets, two fields a
 * sample:
 *   "image" f32, 784 values in the shape the model asks for ([784] or
 *           [1, 28, 28]): (pixel / 255 - mean) / std
 *   "label" i32, ndim 0: the class, 0..9
 */
#ifndef EXAMPLES_FMNIST_H
#define EXAMPLES_FMNIST_H

#include <hpu/data.h>
#include <hpu/hpu.h>

/* Debian's dataset-fashion-mnist puts the files here. */
#define FMNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#define FMNIST_CLASSES 10
#define FMNIST_PIXELS 784 /* 28 x 28, one channel */

typedef struct fmnist_split {
	hpu_array images, labels; /* u8 [n, 28, 28] and u8 [n] */
	hpu_data_split split;     /* the fields the runtime fetches from */
} fmnist_split;

typedef struct fmnist {
	fmnist_split train, test;
} fmnist;

/* Reads dir's train-* and t10k-* files into f and declares them as the
 * training and test datasets, "image" of shape[0 .. ndim) (784 values in
 * all). Returns 0, or hpu_error's -1 naming the file that could not be
 * read and how to get it. f is the model's: fmnist_free() it at teardown,
 * whatever this returned. */
int fmnist_declare(hpu_builder *b, fmnist *f, const char *dir, int ndim, const int64_t *shape,
		   float mean, float std);

void fmnist_free(fmnist *f);

#endif
