/* fmnist: see fmnist.h. */
#include "examples/common/fmnist.h"

#include <stdio.h>
#include <string.h>

static int load_split(fmnist_split *s, const char *dir, const char *prefix, char *err,
		      size_t errlen)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
	if (idx_read(&s->images, path, err, errlen) < 0)
		return -1;
	snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
	if (idx_read(&s->labels, path, err, errlen) < 0)
		return -1;
	if (s->images.count != s->labels.count || s->images.item != FMNIST_PIXELS) {
		snprintf(err, errlen, "%s/%s: %zu images of %zu bytes but %zu labels", dir,
			 prefix, s->images.count, s->images.item, s->labels.count);
		return -1;
	}
	return 0;
}

/* out[0]: the image, out[1]: the label. A label that is not a class
 * fails the fetch (the layers index with it). */
static int fetch(void *user, size_t i, void *const *out)
{
	const fmnist_split *s = user;
	const uint8_t *px = s->images.data + i * FMNIST_PIXELS;
	float *x = out[0];
	for (int k = 0; k < FMNIST_PIXELS; k++)
		x[k] = px[k] * s->scale + s->shift;
	*(int32_t *)out[1] = s->labels.data[i];
	return s->labels.data[i] < FMNIST_CLASSES ? 0 : -1;
}

int fmnist_declare(hpu_builder *b, fmnist *f, const char *dir, int ndim, const int64_t *shape,
		   float mean, float std)
{
	char err[1200];
	if (load_split(&f->train, dir, "train", err, sizeof err) < 0 ||
	    load_split(&f->test, dir, "t10k", err, sizeof err) < 0)
		return hpu_error(b, "%s (on Debian: apt-get install dataset-fashion-mnist, or pass -- --data DIR)",
				 err);
	hpu_dataset d = {.nfields = 2, .fetch = fetch};
	d.fields[0] = (hpu_field){.name = "image", .dtype = HPU_F32, .ndim = ndim};
	memcpy(d.fields[0].shape, shape, (size_t)ndim * sizeof *shape);
	d.fields[1] = (hpu_field){.name = "label", .dtype = HPU_I32, .ndim = 0};
	fmnist_split *split[2] = {&f->train, &f->test};
	for (int k = 0; k < 2; k++) {
		split[k]->scale = 1.0f / (255.0f * std);
		split[k]->shift = -mean / std;
		d.size = split[k]->images.count;
		d.user = split[k];
		if (hpu_dataset_set(b, k ? HPU_SPLIT_TEST : HPU_SPLIT_TRAIN, &d) < 0)
			return -1;
	}
	return 0;
}

void fmnist_free(fmnist *f)
{
	idx_free(&f->train.images);
	idx_free(&f->train.labels);
	idx_free(&f->test.images);
	idx_free(&f->test.labels);
}
