/* data_set: hpu_data_declare (include/hpu/data.h): arrays as the fields
 * of a dataset split, converted to f32 or i32 on each fetch. */
#include "worker/hpu/dataio.h"

#include <string.h>

/* Element k of a as a double (exact for every type but i64 beyond 2^53). */
static double value(const hpu_array *a, size_t k)
{
	const void *d = a->data;
	switch (a->type) {
	case HPU_DATA_U8: return ((const uint8_t *)d)[k];
	case HPU_DATA_I8: return ((const int8_t *)d)[k];
	case HPU_DATA_U16: return ((const uint16_t *)d)[k];
	case HPU_DATA_I16: return ((const int16_t *)d)[k];
	case HPU_DATA_U32: return ((const uint32_t *)d)[k];
	case HPU_DATA_I32: return ((const int32_t *)d)[k];
	case HPU_DATA_I64: return (double)((const int64_t *)d)[k];
	case HPU_DATA_F32: return ((const float *)d)[k];
	case HPU_DATA_F64: return ((const double *)d)[k];
	}
	return 0;
}

static size_t field_numel(const hpu_data_field *fd)
{
	return fd->window ? fd->window : fd->array->row_numel;
}

/* x[k] = px[k] * scale + shift: an image's pixels, the loader's hot loop
 * (restrict and -O3: vectorized, 8 to 16 pixels an instruction, without
 * the alias check a char pointer would need; the same roundings, a
 * product then a sum: -ffp-contract=off). */
static void u8_affine(float *restrict x, const uint8_t *restrict px, size_t n, float scale,
		      float shift)
{
	for (size_t k = 0; k < n; k++)
		x[k] = (float)px[k] * scale + shift;
}

/* Writes field fd of sample i into out. */
static int fetch_field(const hpu_data_field *fd, size_t i, void *out)
{
	size_t n = field_numel(fd), first = fd->window ? i * fd->window + fd->offset : i * n;
	const hpu_array *a = fd->array;
	if (fd->dtype == HPU_I32) {
		int32_t *y = out;
		for (size_t k = 0; k < n; k++) {
			double v = value(a, first + k);
			if (v < -2147483648.0 || v > 2147483647.0 ||
			    (fd->classes > 0 && (v < 0 || v >= (double)fd->classes)))
				return -1;
			y[k] = (int32_t)v;
		}
		return 0;
	}
	float *x = out;
	if (a->type == HPU_DATA_U8 && (fd->scale != 0 || fd->shift != 0)) {
		u8_affine(x, (const uint8_t *)a->data + first, n, fd->scale, fd->shift);
	} else if (fd->scale != 0 || fd->shift != 0) {
		for (size_t k = 0; k < n; k++)
			x[k] = (float)value(a, first + k) * fd->scale + fd->shift;
	} else if (a->type == HPU_DATA_F32) {
		memcpy(x, (const float *)a->data + first, n * sizeof *x);
	} else {
		for (size_t k = 0; k < n; k++)
			x[k] = (float)value(a, first + k);
	}
	return 0;
}

static int fetch(void *user, size_t index, void *const *out)
{
	const hpu_data_split *s = user;
	if (index >= s->size)
		return -1;
	for (int f = 0; f < s->nfields; f++)
		if (fetch_field(&s->fields[f], index, out[f]) < 0)
			return -1;
	return 0;
}

void hpu__data_prefetch(const hpu_dataset *ds, size_t index)
{
	if (ds->fetch != fetch)
		return; /* the model's own fetch: its layout is its own */
	const hpu_data_split *s = ds->user;
	if (index >= s->size)
		return;
	for (int f = 0; f < s->nfields; f++) {
		const hpu_data_field *fd = &s->fields[f];
		size_t n = field_numel(fd), first = fd->window ? index * fd->window + fd->offset
							   : index * n;
		size_t es = hpu_data_type_size(fd->array->type);
		const char *p = (const char *)fd->array->data + first * es;
		for (size_t at = 0; at < n * es; at += 64)
			__builtin_prefetch(p + at);
		if (n * es > 0)
			__builtin_prefetch(p + n * es - 1);
	}
}

/* An HPU_I32 field's values, checked once when it is declared: whole
 * numbers in int32's range, and classes where it says how many (the
 * fetch checks again, but a failed fetch can only say which sample).
 * Types whose every value is a whole int32 are not walked unless
 * classes is set. */
static int check_ints(hpu_builder *b, const char *split, const hpu_data_field *fd)
{
	const hpu_array *a = fd->array;
	int small = a->type == HPU_DATA_U8 || a->type == HPU_DATA_I8 || a->type == HPU_DATA_U16 ||
		    a->type == HPU_DATA_I16 || a->type == HPU_DATA_I32;
	if (fd->dtype != HPU_I32 || (small && fd->classes <= 0))
		return HPU_OK;
	size_t total = a->count * a->row_numel;
	for (size_t k = 0; k < total; k++) {
		double v = value(a, k);
		size_t row = a->row_numel ? k / a->row_numel : k;
		if (!(v >= -2147483648.0 && v <= 2147483647.0) || v != (double)(int64_t)v)
			return hpu_error(b, "data field '%s' (%s split): row %zu holds %.17g, not a "
					 "whole number in int32's range (an HPU_I32 field)",
					 fd->name, split, row, v);
		if (fd->classes > 0 && (v < 0 || v >= (double)fd->classes))
			return hpu_error(b, "data field '%s' (%s split): row %zu holds %.17g, not a "
					 "class: its classes are 0 to %lld",
					 fd->name, split, row, v, (long long)fd->classes - 1);
	}
	return HPU_OK;
}

/* The samples field fd gives; its sample shape into hf. */
static int check_field(hpu_builder *b, const hpu_data_field *fd, hpu_field *hf, size_t *rows)
{
	const hpu_array *a = fd->array;
	const char *name = fd->name ? fd->name : "(null)";
	if (!fd->name || !a || !a->data || (fd->dtype != HPU_F32 && fd->dtype != HPU_I32))
		return hpu_error(b, "data field '%s': it needs a name, a loaded array and dtype HPU_F32 or HPU_I32",
				 name);
	size_t total = a->count * a->row_numel;
	if (fd->window) {
		*rows = total > fd->offset ? (total - fd->offset) / fd->window : 0;
	} else {
		if (fd->offset)
			return hpu_error(b, "data field '%s': an offset needs a window", name);
		*rows = a->count;
	}
	*hf = (hpu_field){.name = fd->name, .dtype = fd->dtype};
	if (fd->reshape) {
		size_t numel = 1;
		if (fd->ndim < 0 || fd->ndim > HPU_MAX_DIMS)
			return hpu_error(b, "data field '%s': ndim %d is not 0 to %d", name, fd->ndim,
					 HPU_MAX_DIMS);
		for (int d = 0; d < fd->ndim; d++)
			numel *= fd->shape[d] > 0 ? (size_t)fd->shape[d] : 0;
		if (numel != field_numel(fd))
			return hpu_error(b, "data field '%s': its shape has %zu elements, a sample of the array has %zu",
					 name, numel, field_numel(fd));
		hf->ndim = fd->ndim;
		memcpy(hf->shape, fd->shape, (size_t)fd->ndim * sizeof *fd->shape);
	} else if (fd->window) {
		hf->ndim = 1;
		hf->shape[0] = (int64_t)fd->window;
	} else {
		if (a->ndim - 1 > HPU_MAX_DIMS)
			return hpu_error(b, "data field '%s': a row of the array has %d dimensions; reshape it to at most %d",
					 name, a->ndim - 1, HPU_MAX_DIMS);
		hf->ndim = a->ndim > 0 ? a->ndim - 1 : 0;
		memcpy(hf->shape, a->shape + 1, (size_t)hf->ndim * sizeof *a->shape);
	}
	return HPU_OK;
}

int hpu_data_declare(hpu_builder *b, hpu_split split, hpu_data_split *s)
{
	if (!s || s->nfields < 1 || s->nfields > HPU_MAX_IO)
		return hpu_error(b, "hpu_data_declare: a split needs 1 to %d fields", HPU_MAX_IO);
	hpu_dataset d = {.nfields = s->nfields, .fetch = fetch, .user = s};
	const char *sname = split == HPU_SPLIT_TRAIN ? "training" : "test";
	size_t size = 0, rows0 = 0;
	const char *first = NULL, *fewest = NULL;
	for (int f = 0; f < s->nfields; f++) {
		size_t rows = 0;
		const hpu_data_field *fd = &s->fields[f];
		int rc = check_field(b, fd, &d.fields[f], &rows);
		if (!rc)
			rc = check_ints(b, sname, fd);
		if (rc)
			return rc;
		if (!fd->window && first && rows != rows0)
			return hpu_error(b, "data fields '%s' (%zu rows) and '%s' (%zu rows) differ in length",
					 first, rows0, fd->name, rows);
		if (!fd->window && !first) {
			first = fd->name;
			rows0 = rows;
		}
		if (f == 0 || rows < size) {
			size = rows;
			fewest = fd->name;
		}
	}
	if (!size) /* the field that gives none, not the first */
		return hpu_error(b, "data field '%s' (%s split): the array gives no samples",
				 fewest, sname);
	s->size = d.size = size;
	return hpu_dataset_set(b, split, &d);
}
