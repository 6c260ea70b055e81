/* fmnist: see fmnist.h. */
#include "examples/common/fmnist.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int load_split(fmnist_split *s, const char *dir, const char *prefix, char *err,
		      size_t errlen)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
	if (hpu_array_load(&s->images, path, NULL, err, errlen) != HPU_OK)
		return -1;
	snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
	if (hpu_array_load(&s->labels, path, NULL, err, errlen) != HPU_OK)
		return -1;
	if (s->labels.ndim != 1) { /* one class a sample: [n] */
		char shape[96];
		size_t n = 0;
		for (int d = 0; d < s->labels.ndim && n < sizeof shape; d++)
			n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%lld", d ? ", " : "",
					      (long long)s->labels.shape[d]);
		snprintf(err, errlen, "%s: labels of shape [%s]: Fashion-MNIST's are one class a sample, [n]",
			 path, shape);
		return -1;
	}
	if (!s->images.count) { /* the split's error knew no file */
		snprintf(err, errlen, "%s/%s-images-idx3-ubyte.gz: holds no image (its shape's first dimension is 0)",
			 dir, prefix);
		return -1;
	}
	if (s->images.count != s->labels.count) { /* the files named (it named DIR/train) */
		snprintf(err, errlen, "%s/%s-images-idx3-ubyte.gz holds %zu images but %s/%s-labels-idx1-ubyte.gz "
			 "%zu labels: one label an image",
			 dir, prefix, s->images.count, dir, prefix, s->labels.count);
		return -1;
	}
	if (s->images.type != HPU_DATA_U8 || s->labels.type != HPU_DATA_U8 ||
	    s->images.row_numel != FMNIST_PIXELS) {
		snprintf(err, errlen, "%s/%s: %zu images of %zu %s but %zu labels of %s (expected u8 images of %d pixels)",
			 dir, prefix, s->images.count, s->images.row_numel,
			 hpu_data_type_name(s->images.type), s->labels.count,
			 hpu_data_type_name(s->labels.type), FMNIST_PIXELS);
		return -1;
	}
	return 0;
}

/* Every label a class, 0 .. FMNIST_CLASSES - 1: checked here to name
 * the file (hpu_data_declare checks again, but knows only the field and
 * the row). */
static int check_labels(hpu_builder *b, const fmnist_split *s, const char *dir,
			const char *prefix)
{
	const uint8_t *l = s->labels.data;
	for (size_t k = 0; k < s->labels.count; k++)
		if (l[k] >= FMNIST_CLASSES)
			return hpu_error(b, "%s/%s-labels-idx1-ubyte.gz: row %zu holds %u, not a "
					 "class: Fashion-MNIST's are 0 to %d",
					 dir, prefix, k, l[k], FMNIST_CLASSES - 1);
	return 0;
}

int fmnist_declare(hpu_builder *b, fmnist *f, const char *dir, int ndim, const int64_t *shape,
		   float mean, float std)
{
	char err[1200];
	if (load_split(&f->train, dir, "train", err, sizeof err) < 0 ||
	    load_split(&f->test, dir, "t10k", err, sizeof err) < 0) {
		/* where to get the files, where one is missing, not where it is damaged */
		static const char *const files[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
						     "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
		int missing = 0;
		for (int k = 0; k < 4; k++) {
			char probe[1100];
			snprintf(probe, sizeof probe, "%s/%s", dir, files[k]);
			missing |= access(probe, F_OK) != 0;
		}
		return hpu_error(b, "%s%s", err,
				 missing ? " (on Debian: apt-get install dataset-fashion-mnist, or pass -- --data DIR)"
					 : "");
	}
	if (check_labels(b, &f->train, dir, "train") < 0 || check_labels(b, &f->test, dir, "t10k") < 0)
		return -1;
	fmnist_split *split[2] = {&f->train, &f->test};
	for (int k = 0; k < 2; k++) {
		hpu_data_split *s = &split[k]->split;
		*s = (hpu_data_split){.nfields = 2};
		/* image = pixel / 255 normalized: (pixel / 255 - mean) / std */
		s->fields[0] = (hpu_data_field){.name = "image", .array = &split[k]->images,
						.dtype = HPU_F32, .scale = 1.0f / (255.0f * std),
						.shift = -mean / std, .reshape = 1, .ndim = ndim};
		memcpy(s->fields[0].shape, shape, (size_t)ndim * sizeof *shape);
		s->fields[1] = (hpu_data_field){.name = "label", .array = &split[k]->labels,
						.dtype = HPU_I32, .classes = FMNIST_CLASSES};
		if (hpu_data_declare(b, k ? HPU_SPLIT_TEST : HPU_SPLIT_TRAIN, s) != HPU_OK)
			return -1;
	}
	return 0;
}

void fmnist_free(fmnist *f)
{
	hpu_array_free(&f->train.images);
	hpu_array_free(&f->train.labels);
	hpu_array_free(&f->test.images);
	hpu_array_free(&f->test.labels);
}
