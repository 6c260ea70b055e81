/* idx: reads the IDX files of MNIST-style datasets, gzipped or not. */
#ifndef FMNIST_IDX_H
#define FMNIST_IDX_H

#include <stddef.h>
#include <stdint.h>

typedef struct idx_array {
	uint8_t *data;   /* unsigned bytes, row-major */
	uint32_t dims[3];
	int ndim;
	size_t count;    /* dims[0] */
	size_t item;     /* bytes per item: product of dims[1..] */
} idx_array;

/* Reads an unsigned-byte IDX file (through zlib, so .gz works too).
 * Returns 0, or -1 with a sentence in err. */
int idx_read(idx_array *out, const char *path, char *err, size_t errlen);

void idx_free(idx_array *a);

#endif
