/* data_array: the data library's base (include/hpu/data.h): element
 * types, errors naming the file, array memory. */
#include "worker/hpu/dataio.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/shapetext.h"

static const struct {
	const char *name;
	size_t size;
} types[] = {
	[HPU_DATA_U8] = {"u8", 1},   [HPU_DATA_I8] = {"i8", 1},   [HPU_DATA_U16] = {"u16", 2},
	[HPU_DATA_I16] = {"i16", 2}, [HPU_DATA_U32] = {"u32", 4}, [HPU_DATA_I32] = {"i32", 4},
	[HPU_DATA_I64] = {"i64", 8}, [HPU_DATA_F32] = {"f32", 4}, [HPU_DATA_F64] = {"f64", 8},
};

size_t hpu_data_type_size(hpu_data_type type)
{
	return (unsigned)type < sizeof types / sizeof *types ? types[type].size : 0;
}

const char *hpu_data_type_name(hpu_data_type type)
{
	return (unsigned)type < sizeof types / sizeof *types ? types[type].name : "unknown";
}

int hpu__data_fail(const hpu__dfile *f, const char *fmt, ...)
{
	if (!f->err || !f->errlen)
		return HPU_EINVAL;
	int n = snprintf(f->err, f->errlen, "%s: ", f->path);
	if (n < 0 || (size_t)n >= f->errlen)
		return HPU_EINVAL;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(f->err + n, f->errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return HPU_EINVAL;
}

int hpu__data_open_fail(const hpu__dfile *f, int errnum)
{
	if (f->err && f->errlen)
		snprintf(f->err, f->errlen, "cannot open %s: %s", f->path,
			 errnum ? strerror(errnum) : "out of memory");
	return HPU_EINVAL;
}

int hpu__data_regular(const hpu__dfile *f)
{
	struct stat st;
	if (stat(f->path, &st) != 0)
		return hpu__data_open_fail(f, errno);
	if (S_ISDIR(st.st_mode))
		return hpu__data_open_fail(f, EISDIR);
	if (!S_ISREG(st.st_mode))
		return hpu__data_fail(f, "is not a regular file but a %s: every worker reads the "
				      "file itself, whole; give a file",
				      S_ISFIFO(st.st_mode)   ? "FIFO (pipe)"
				      : S_ISSOCK(st.st_mode) ? "socket"
							     : "device");
	return HPU_OK;
}

size_t hpu__array_bytes(const hpu_array *a)
{
	return a->count * a->row_numel * hpu_data_type_size(a->type);
}

int hpu__array_shape(hpu_array *a, const hpu__dfile *f, hpu_data_type type, int ndim,
		     const int64_t *shape)
{
	memset(a, 0, sizeof *a);
	if (ndim < 0 || ndim > HPU_ARRAY_MAX_DIMS)
		return hpu__data_fail(f, "%d dimensions; at most %d are supported", ndim,
				      HPU_ARRAY_MAX_DIMS);
	for (int d = 0; d < ndim; d++)
		if (shape[d] < 0)
			return hpu__data_fail(f, "dimension %d is %lld: a size cannot be negative", d,
					      (long long)shape[d]);
	/* The whole shape is blamed: the dimension where the product first
	 * passes the bound is often not the one that is wrong. */
	size_t numel = 1, limit = ((size_t)1 << 40) / hpu_data_type_size(type);
	for (int d = 0; d < ndim; d++) {
		if (shape[d] && numel > limit / (size_t)shape[d]) {
			char sh[160];
			return hpu__data_fail(f, "a shape of %s of %s is past 1 TiB: implausible",
					      hpu__shape_text(sh, sizeof sh, ndim, shape),
					      hpu_data_type_name(type));
		}
		numel *= (size_t)shape[d];
		a->shape[d] = shape[d];
	}
	a->type = type;
	a->ndim = ndim;
	a->count = ndim ? (size_t)shape[0] : 1;
	a->row_numel = 1;
	for (int d = 1; d < ndim; d++)
		a->row_numel *= (size_t)shape[d];
	return HPU_OK;
}

int hpu__array_data(hpu_array *a, const hpu__dfile *f)
{
	a->data = malloc(hpu__array_bytes(a) + 1);
	if (!a->data)
		return hpu__data_fail(f, "out of memory for %zu elements", a->count * a->row_numel);
	return HPU_OK;
}

int hpu__array_alloc(hpu_array *a, const hpu__dfile *f, hpu_data_type type, int ndim,
		     const int64_t *shape)
{
	int rc = hpu__array_shape(a, f, type, ndim, shape);
	return rc ? rc : hpu__array_data(a, f);
}

void hpu_array_free(hpu_array *a)
{
	if (!a)
		return;
	free(a->data);
	memset(a, 0, sizeof *a);
}
