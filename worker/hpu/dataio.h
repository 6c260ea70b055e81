/* dataio: what the data library's files share (include/hpu/data.h):
 * errors that name the file, and array allocation. */
#ifndef HPU_WORKER_DATAIO_H
#define HPU_WORKER_DATAIO_H

#include <hpu/data.h>

#include <stddef.h>
#include <stdint.h>

/* The file being read and where its error goes. */
typedef struct hpu__dfile {
	const char *path;
	char *err;
	size_t errlen;
} hpu__dfile;

/* Asks the CPU to bring sample `index`'s values of every field into its
 * caches (the loader, a few samples ahead: a sample's first line of a
 * large dataset is a miss to memory, most of the conversion's time).
 * Nothing where ds is not hpu_data_declare's, or index is past its end. */
void hpu__data_prefetch(const hpu_dataset *ds, size_t index);

/* Writes "PATH: <message>" into f's err; returns HPU_EINVAL. */
int hpu__data_fail(const hpu__dfile *f, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Writes "cannot open PATH: <strerror(errnum)>"; returns HPU_EINVAL. */
int hpu__data_open_fail(const hpu__dfile *f, int errnum);

/* HPU_OK where f's path is a regular file (or a link to one); else
 * HPU_EINVAL with an error naming it: missing, a directory, or a FIFO,
 * socket or device (opening a FIFO nobody writes would wait for ever,
 * and every worker reads the file whole itself). */
int hpu__data_regular(const hpu__dfile *f);

/* Sets a's type and shape, data NULL; HPU_OK, or an error naming f (a
 * negative dimension, a shape past 1 TiB). */
int hpu__array_shape(hpu_array *a, const hpu__dfile *f, hpu_data_type type, int ndim,
		     const int64_t *shape);

/* Allocates the data of a shaped a (at least one byte); HPU_OK, or an
 * error naming f. */
int hpu__array_data(hpu_array *a, const hpu__dfile *f);

/* hpu__array_shape, then hpu__array_data. Sets a's type and shape and allocates its data (count * row_numel
 * elements, at least one byte); HPU_OK, or an error naming f (a shape
 * too large, out of memory). */
int hpu__array_alloc(hpu_array *a, const hpu__dfile *f, hpu_data_type type, int ndim,
		     const int64_t *shape);

/* The bytes of a's data. */
size_t hpu__array_bytes(const hpu_array *a);

#endif
