/* safetensors headers, written and parsed (see safetensors.h). */
#include "ckpt/safetensors.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t le64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

int hpu__st_dtype_size(const char *dtype)
{
	static const struct {
		const char *name;
		int size;
	} t[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
		 {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U16", 2}, {"U32", 4},
		 {"U64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
		if (!strcmp(dtype, t[i].name))
			return t[i].size;
	return 0;
}

int hpu__st_sniff(const unsigned char *head9, uint64_t file_size)
{
	uint64_t n = le64(head9);
	return file_size >= 9 && n >= 2 && n <= file_size - 8 && head9[8] == '{';
}

static void add_tensor(cJSON *h, const char *name, int ndim, const int64_t *shape, uint64_t at,
		       uint64_t bytes)
{
	cJSON *t = cJSON_AddObjectToObject(h, name), *sh = cJSON_CreateArray(),
	      *off = cJSON_CreateArray();
	cJSON_AddStringToObject(t, "dtype", "F32");
	for (int d = 0; d < ndim; d++)
		cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shape[d]));
	cJSON_AddItemToObject(t, "shape", sh);
	cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
	cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(at + bytes)));
	cJSON_AddItemToObject(t, "data_offsets", off);
}

char *hpu__st_header(int n, const char *const *names, const int *ndims,
		     const int64_t *const *shapes, const uint64_t *begins,
		     const char *const *meta, size_t *len, char *err, size_t errlen)
{
	cJSON *h = cJSON_CreateObject();
	char *json = NULL, *out = NULL;
	uint64_t at = 0;
	if (!h)
		goto nomem;
	if (meta && meta[0]) {
		cJSON *m = cJSON_AddObjectToObject(h, "__metadata__");
		for (int i = 0; meta[i] && meta[i + 1]; i += 2)
			cJSON_AddStringToObject(m, meta[i], meta[i + 1]);
	}
	for (int i = 0; i < n; i++) {
		if (!strcmp(names[i], "__metadata__") || cJSON_GetObjectItemCaseSensitive(h, names[i])) {
			snprintf(err, errlen,
				 "parameter name \"%s\" appears twice (or is reserved); safetensors "
				 "needs unique names",
				 names[i]);
			cJSON_Delete(h);
			return NULL;
		}
		uint64_t numel = 1;
		for (int d = 0; d < ndims[i]; d++)
			numel *= (uint64_t)shapes[i][d];
		if (begins)
			at = begins[i];
		add_tensor(h, names[i], ndims[i], shapes[i], at, numel * 4);
		at += numel * 4;
	}
	if (!(json = cJSON_PrintUnformatted(h)))
		goto nomem;
	size_t j = strlen(json), padded = (j + 7) / 8 * 8;
	if (!(out = malloc(8 + padded)))
		goto nomem;
	for (int i = 0; i < 8; i++)
		out[i] = (char)(unsigned char)((uint64_t)padded >> (8 * i));
	memcpy(out + 8, json, j);
	memset(out + 8 + j, ' ', padded - j);
	*len = 8 + padded;
	free(json);
	cJSON_Delete(h);
	return out;
nomem:
	snprintf(err, errlen, "out of memory");
	free(json);
	cJSON_Delete(h);
	return NULL;
}

static int cmp_begin(const void *a, const void *b)
{
	const hpu_st_tensor *x = a, *y = b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* One tensor's entry into t; -1 with err if malformed. */
static int parse_entry(const cJSON *e, hpu_st_tensor *t, uint64_t data_len, char *err,
		       size_t errlen)
{
	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype"),
		    *sh = cJSON_GetObjectItemCaseSensitive(e, "shape"),
		    *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
	if (strlen(e->string) >= sizeof t->name) {
		snprintf(err, errlen, "tensor name \"%.40s...\" is too long", e->string);
		return -1;
	}
	snprintf(t->name, sizeof t->name, "%s", e->string);
	if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) ||
	    !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2) {
		snprintf(err, errlen, "tensor \"%s\": needs dtype, shape and data_offsets [begin, end]",
			 t->name);
		return -1;
	}
	int size = hpu__st_dtype_size(dt->valuestring);
	if (!size || strlen(dt->valuestring) >= sizeof t->dtype) {
		snprintf(err, errlen, "tensor \"%s\": unknown dtype \"%s\"", t->name, dt->valuestring);
		return -1;
	}
	snprintf(t->dtype, sizeof t->dtype, "%s", dt->valuestring);
	t->ndim = cJSON_GetArraySize(sh);
	if (t->ndim > HPU__ST_MAX_DIMS) {
		snprintf(err, errlen, "tensor \"%s\": %d dimensions (at most %d)", t->name, t->ndim,
			 HPU__ST_MAX_DIMS);
		return -1;
	}
	uint64_t numel = 1;
	for (int d = 0; d < t->ndim; d++) {
		const cJSON *v = cJSON_GetArrayItem(sh, d);
		if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9e15 ||
		    v->valuedouble != (double)(int64_t)v->valuedouble) {
			snprintf(err, errlen, "tensor \"%s\": shape[%d] is not a size", t->name, d);
			return -1;
		}
		t->shape[d] = (int64_t)v->valuedouble;
		numel *= (uint64_t)t->shape[d];
	}
	const cJSON *b = cJSON_GetArrayItem(off, 0), *en = cJSON_GetArrayItem(off, 1);
	if (!cJSON_IsNumber(b) || !cJSON_IsNumber(en) || b->valuedouble < 0 ||
	    en->valuedouble < b->valuedouble || en->valuedouble > (double)data_len) {
		snprintf(err, errlen, "tensor \"%s\": data_offsets outside the file's %llu data bytes",
			 t->name, (unsigned long long)data_len);
		return -1;
	}
	t->begin = (uint64_t)b->valuedouble;
	t->end = (uint64_t)en->valuedouble;
	if (t->end - t->begin != numel * (uint64_t)size) {
		snprintf(err, errlen,
			 "tensor \"%s\": data_offsets hold %llu bytes, but %s of that shape needs %llu",
			 t->name, (unsigned long long)(t->end - t->begin), t->dtype,
			 (unsigned long long)(numel * (uint64_t)size));
		return -1;
	}
	return 0;
}

int hpu__st_parse(const void *head, size_t have, uint64_t file_size, hpu_st_tensor **out,
		  uint64_t *data_at, size_t *need, char *err, size_t errlen)
{
	const unsigned char *p = head;
	*out = NULL;
	if (have < 8 || file_size < 8) {
		*need = 8;
		if (file_size < 8) {
			snprintf(err, errlen, "%llu bytes: too short for safetensors",
				 (unsigned long long)file_size);
			return -1;
		}
		return -2;
	}
	uint64_t n = le64(p);
	if (n > file_size - 8 || n > (uint64_t)100 << 20) {
		snprintf(err, errlen, "header length %llu does not fit the file's %llu bytes",
			 (unsigned long long)n, (unsigned long long)file_size);
		return -1;
	}
	if (have < 8 + n) {
		*need = (size_t)(8 + n);
		return -2;
	}
	cJSON *h = cJSON_ParseWithLength((const char *)p + 8, (size_t)n);
	if (!cJSON_IsObject(h)) {
		snprintf(err, errlen, "the header is not a JSON object");
		cJSON_Delete(h);
		return -1;
	}
	uint64_t data_len = file_size - 8 - n;
	int count = 0, k = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, h) count += strcmp(e->string, "__metadata__") != 0;
	hpu_st_tensor *t = calloc(count ? (size_t)count : 1, sizeof *t);
	if (!t) {
		snprintf(err, errlen, "out of memory");
		cJSON_Delete(h);
		return -1;
	}
	cJSON_ArrayForEach(e, h)
	{
		if (!strcmp(e->string, "__metadata__"))
			continue;
		if (parse_entry(e, &t[k], data_len, err, errlen) < 0)
			goto fail;
		for (int i = 0; i < k; i++)
			if (!strcmp(t[i].name, t[k].name)) {
				snprintf(err, errlen, "tensor \"%s\" appears twice", t[k].name);
				goto fail;
			}
		k++;
	}
	hpu_st_tensor *sorted = malloc((count ? (size_t)count : 1) * sizeof *t);
	if (!sorted) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	memcpy(sorted, t, (size_t)count * sizeof *t);
	qsort(sorted, (size_t)count, sizeof *t, cmp_begin);
	for (int i = 1; i < count; i++)
		if (sorted[i].begin < sorted[i - 1].end) {
			snprintf(err, errlen, "tensors \"%s\" and \"%s\" overlap", sorted[i - 1].name,
				 sorted[i].name);
			free(sorted);
			goto fail;
		}
	free(sorted);
	cJSON_Delete(h);
	*out = t;
	*data_at = 8 + n;
	return count;
fail:
	free(t);
	cJSON_Delete(h);
	return -1;
}
