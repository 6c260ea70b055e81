/* manifest_tensors: the manifest's tensors: the parameters and their
 * shapes, the optimizer's sections, the buffers, each rank's file and its
 * segments, and the index of every segment by start. */
#include "ckpt/ckpt_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The sections an optimizer's state may be, in the order written. */
static const char *const section_names[] = {"params", "momentum_buffer", "exp_avg",
					    "exp_avg_sq"};

/* A shape: at most HPU_CKPT_MAX_DIMS whole dimensions from 1, their
 * product (1 for []) at most 2^53. Returns 0, or -1. */
static int parse_shape(const cJSON *shape, int *ndim, int64_t *dims, uint64_t *prod)
{
	const cJSON *d;
	*ndim = 0;
	*prod = 1;
	if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > HPU_CKPT_MAX_DIMS)
		return -1;
	cJSON_ArrayForEach(d, shape) {
		double v = cJSON_IsNumber(d) ? d->valuedouble : 0;
		if (!(v >= 1 && v <= SAFE_INT) || v != (double)(uint64_t)v ||
		    (double)*prod * v > SAFE_INT)
			return -1;
		dims[(*ndim)++] = (int64_t)v;
		*prod *= (uint64_t)v;
	}
	return 0;
}

int hpu__ckpt_parse_params(hpu_ckpt *c, const char *mpath, char *err, size_t errlen)
{
	const cJSON *arr = cJSON_GetObjectItemCaseSensitive(c->m, "parameters");
	int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
	if (n <= 0)
		return say(err, errlen, "%s: no \"parameters\" list", mpath);
	if (!(c->params = calloc((size_t)n, sizeof *c->params)))
		return say(err, errlen, "out of memory");
	c->nparams = n;
	uint64_t at = 0;
	int i = 0;
	const cJSON *p;
	cJSON_ArrayForEach(p, arr) {
		hpu_ckpt_param *q = &c->params[i];
		const cJSON *shape = cJSON_GetObjectItemCaseSensitive(p, "shape");
		if (hpu__ckpt_get_str(p, "name", q->name, sizeof q->name) < 0 || !q->name[0] ||
		    hpu__ckpt_get_u64(p, "offset", &q->offset) < 0 ||
		    hpu__ckpt_get_u64(p, "numel", &q->numel) < 0 || !cJSON_IsArray(shape) ||
		    cJSON_GetArraySize(shape) > HPU_CKPT_MAX_DIMS)
			return say(err, errlen, "%s: parameter %d lacks a name, shape, offset or numel",
				   mpath, i);
		char ctx[4400];
		snprintf(ctx, sizeof ctx, "%s: parameter %s", mpath, q->name);
		if (hpu__ckpt_check_name(p, ctx, "dtype", REQUIRED, hpu__ckpt_dtype_at, 1, NULL, 0,
					 err, errlen) < 0)
			return -1;
		uint64_t prod;
		if (parse_shape(shape, &q->ndim, q->shape, &prod) < 0)
			return say(err, errlen,
				   "%s has a bad shape (whole dimensions from 1, their product "
				   "at most 2^53)",
				   ctx);
		if (prod != q->numel || q->offset != at)
			return say(err, errlen,
				   "%s: parameter %s: numel %llu and offset %llu do not follow from "
				   "the shapes (expected offset %llu)",
				   mpath, q->name, (unsigned long long)q->numel,
				   (unsigned long long)q->offset, (unsigned long long)at);
		at += q->numel;
		i++;
	}
	c->numel = at;
	if (at > (uint64_t)SAFE_INT)
		return say(err, errlen, "%s: the parameters hold %llu floats, more than 2^53", mpath,
			   (unsigned long long)at);
	double numel = (double)at; /* when absent */
	if (hpu__ckpt_check_num(c->m, mpath, "numel", OPTIONAL, WHOLE, 0, SAFE_INT, &numel, err,
				errlen) < 0)
		return -1;
	if ((uint64_t)numel != at)
		return say(err, errlen, "%s: numel %.16g, but the parameters hold %llu floats", mpath,
			   numel, (unsigned long long)at);
	return 0;
}

int hpu__ckpt_parse_sections(hpu_ckpt *c, const char *mpath, char *err, size_t errlen)
{
	const cJSON *arr = cJSON_GetObjectItemCaseSensitive(c->m, "sections"), *s;
	int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
	if (n < 1 || n > HPU_CKPT_MAX_SECTIONS)
		return say(err, errlen, "%s: \"sections\" must list 1 to %d names", mpath,
			   HPU_CKPT_MAX_SECTIONS);
	cJSON_ArrayForEach(s, arr) {
		if (!cJSON_IsString(s) || strlen(s->valuestring) >= sizeof c->sections[0])
			return say(err, errlen, "%s: a section name is not a short string", mpath);
		strcpy(c->sections[c->nsections++], s->valuestring);
	}
	if (strcmp(c->sections[0], "params") != 0)
		return say(err, errlen, "%s: the first section must be \"params\"", mpath);
	for (int k = 0; k < c->nsections; k++) {
		int known = 0;
		for (size_t j = 0; j < sizeof section_names / sizeof *section_names; j++)
			known |= !strcmp(c->sections[k], section_names[j]);
		if (!known)
			return say(err, errlen,
				   "%s: section \"%s\" is not one of params, momentum_buffer, exp_avg, "
				   "exp_avg_sq",
				   mpath, c->sections[k]);
		if (hpu__ckpt_section(c, c->sections[k]) != k)
			return say(err, errlen, "%s: section \"%s\" is listed twice", mpath,
				   c->sections[k]);
	}
	/* the optimizer's state: Adam's two moments, SGD's momentum if any */
	int adam = strcmp(c->optimizer, "sgd") != 0;
	int mom = hpu__ckpt_section(c, "momentum_buffer") >= 0;
	if (adam ? c->nsections == 3 && !mom : c->nsections == 1 + mom)
		return 0;
	char list[4 * 34] = "";
	for (int k = 0, at = 0; k < c->nsections; k++)
		at += snprintf(list + at, sizeof list - (size_t)at, "%s%s", k ? ", " : "",
			       c->sections[k]);
	return say(err, errlen, "%s: sections %s are not the state of optimizer %s (%s)", mpath,
		   list, c->optimizer,
		   adam ? "params, exp_avg, exp_avg_sq" : "params, and momentum_buffer with momentum");
}

static const char *sync_at(int k)
{
	static const char *const names[] = {"broadcast", "mean", "local"};
	return names[k];
}

/* The optional "buffers" object: the file (a plain name of its own, its
 * size and digest) and the buffers laid end to end in it, each named once
 * (ckpt.h). */
int hpu__ckpt_parse_buffers(hpu_ckpt *c, const char *mpath, char *err, size_t errlen)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(c->m, "buffers");
	if (!j)
		return 0;
	hpu_ckpt_file *f = &c->buffer_file;
	const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "tensors"), *t;
	if (!cJSON_IsObject(j) || hpu__ckpt_get_str(j, "file", f->name, sizeof f->name) < 0 ||
	    !f->name[0] || strchr(f->name, '/') || hpu__ckpt_get_u64(j, "bytes", &f->bytes) < 0 ||
	    hpu__ckpt_get_str(j, "sha256", f->sha256, sizeof f->sha256) < 0 || strlen(f->sha256) != 64 ||
	    !cJSON_IsArray(arr))
		return say(err, errlen, "%s: \"buffers\" lacks a plain file name, bytes, sha256 or "
			   "tensors", mpath);
	if (!strcmp(f->name, HPU_CKPT_MANIFEST) || !strcmp(f->name, ".") || !strcmp(f->name, ".."))
		return say(err, errlen, "%s: buffers file \"%s\" is not a data file's name", mpath,
			   f->name);
	for (int i = 0; i < c->nfiles; i++)
		if (!strcmp(f->name, c->files[i].name))
			return say(err, errlen, "%s: buffers file %s is also a shard", mpath,
				   f->name);
	int n = cJSON_GetArraySize(arr);
	if (n < 1)
		return say(err, errlen, "%s: \"buffers\" lists no tensors (a model without buffers "
			   "has no \"buffers\")", mpath);
	if (!(c->buffers = calloc((size_t)n, sizeof *c->buffers)))
		return say(err, errlen, "out of memory");
	uint64_t at = 0;
	cJSON_ArrayForEach(t, arr) {
		hpu_ckpt_buffer *q = &c->buffers[c->nbuffers];
		uint64_t prod;
		char ctx[4400];
		if (hpu__ckpt_get_str(t, "name", q->name, sizeof q->name) < 0 || !q->name[0] ||
		    hpu__ckpt_get_u64(t, "offset", &q->offset) < 0 ||
		    hpu__ckpt_get_u64(t, "numel", &q->numel) < 0)
			return say(err, errlen, "%s: buffer %d lacks a name, offset or numel",
				   mpath, c->nbuffers);
		snprintf(ctx, sizeof ctx, "%s: buffer %s", mpath, q->name);
		if (hpu__ckpt_check_name(t, ctx, "dtype", REQUIRED, hpu__ckpt_dtype_at, 1, NULL, 0,
					 err, errlen) < 0 ||
		    hpu__ckpt_check_name(t, ctx, "sync", OPTIONAL, sync_at, 3, q->sync,
					 sizeof q->sync, err, errlen) < 0)
			return -1;
		if (parse_shape(cJSON_GetObjectItemCaseSensitive(t, "shape"), &q->ndim, q->shape,
				&prod) < 0)
			return say(err, errlen,
				   "%s has no shape or a bad one (whole dimensions from 1, their "
				   "product at most 2^53)",
				   ctx);
		if (prod != q->numel || q->offset != at)
			return say(err, errlen,
				   "%s: numel %llu and offset %llu do not follow from the shapes "
				   "(expected offset %llu)",
				   ctx, (unsigned long long)q->numel, (unsigned long long)q->offset,
				   (unsigned long long)at);
		if (hpu__ckpt_buffer_find(c, q->name) >= 0)
			return say(err, errlen, "%s is listed twice", ctx);
		at += q->numel;
		c->nbuffers++;
		if (at > (uint64_t)SAFE_INT / 4)
			return say(err, errlen, "%s: the buffers hold more than 2^51 floats",
				   mpath);
	}
	c->buffer_numel = at;
	double numel = (double)at; /* when absent */
	char ctx[4400];
	snprintf(ctx, sizeof ctx, "%s: buffers", mpath);
	if (hpu__ckpt_check_num(j, ctx, "numel", OPTIONAL, WHOLE, 0, SAFE_INT, &numel, err, errlen) < 0)
		return -1;
	if ((uint64_t)numel != at)
		return say(err, errlen, "%s: numel %.16g, but the buffers hold %llu floats", ctx,
			   numel, (unsigned long long)at);
	if (f->bytes != at * 4)
		return say(err, errlen, "%s: %s: %llu bytes listed, but its buffers make %llu",
			   mpath, f->name, (unsigned long long)f->bytes,
			   (unsigned long long)(at * 4));
	return 0;
}

int hpu__ckpt_parse_file(hpu_ckpt_file *f, const cJSON *j, int nsections, const char *mpath,
			 char *err, size_t errlen)
{
	const cJSON *segs = cJSON_GetObjectItemCaseSensitive(j, "segments"), *s;
	if (hpu__ckpt_get_str(j, "name", f->name, sizeof f->name) < 0 || strchr(f->name, '/') ||
	    hpu__ckpt_get_u64(j, "bytes", &f->bytes) < 0 ||
	    hpu__ckpt_get_str(j, "sha256", f->sha256, sizeof f->sha256) < 0 || strlen(f->sha256) != 64 ||
	    !cJSON_IsArray(segs))
		return say(err, errlen, "%s: a file entry lacks a plain name, bytes, sha256 or segments",
			   mpath);
	f->nseg = (size_t)cJSON_GetArraySize(segs);
	if (f->nseg && !(f->seg = calloc(f->nseg, sizeof *f->seg)))
		return say(err, errlen, "out of memory");
	size_t k = 0;
	uint64_t prev_end = 0;
	cJSON_ArrayForEach(s, segs) {
		if (!cJSON_IsArray(s) || cJSON_GetArraySize(s) != 2 ||
		    !cJSON_IsNumber(cJSON_GetArrayItem(s, 0)) ||
		    !cJSON_IsNumber(cJSON_GetArrayItem(s, 1)))
			return say(err, errlen, "%s: %s: a segment is not [start, count]", mpath,
				   f->name);
		double a = cJSON_GetArrayItem(s, 0)->valuedouble, b = cJSON_GetArrayItem(s, 1)->valuedouble;
		if (a < 0 || b < 1 || a > SAFE_INT || b > SAFE_INT || a != (double)(uint64_t)a ||
		    b != (double)(uint64_t)b || (k && (uint64_t)a < prev_end))
			return say(err, errlen, "%s: %s: segments must be increasing and not empty "
				   "(whole numbers below 2^53)", mpath, f->name);
		f->seg[k].start = (uint64_t)a;
		f->seg[k].count = (uint64_t)b;
		prev_end = f->seg[k].start + f->seg[k].count;
		f->elems += f->seg[k].count;
		k++;
	}
	if (f->bytes != f->elems * 4 * (uint64_t)nsections)
		return say(err, errlen, "%s: %s: %llu bytes listed, but its segments make %llu",
			   mpath, f->name, (unsigned long long)f->bytes,
			   (unsigned long long)(f->elems * 4 * (uint64_t)nsections));
	return 0;
}

static int by_start(const void *a, const void *b)
{
	const hpu_ckpt_index *x = a, *y = b;
	return x->start < y->start ? -1 : x->start > y->start;
}

/* Every segment, sorted; they must tile [0, numel). */
int hpu__ckpt_build_index(hpu_ckpt *c, const char *mpath, char *err, size_t errlen)
{
	size_t n = 0;
	for (int i = 0; i < c->nfiles; i++)
		n += c->files[i].nseg;
	if (!(c->index = calloc(n ? n : 1, sizeof *c->index)))
		return say(err, errlen, "out of memory");
	for (int i = 0; i < c->nfiles; i++) {
		uint64_t at = 0;
		for (size_t k = 0; k < c->files[i].nseg; k++) {
			hpu_ckpt_index *x = &c->index[c->nindex++];
			x->start = c->files[i].seg[k].start;
			x->count = c->files[i].seg[k].count;
			x->at = at;
			x->file = i;
			at += x->count;
		}
	}
	qsort(c->index, c->nindex, sizeof *c->index, by_start);
	uint64_t end = 0;
	for (size_t k = 0; k < c->nindex; k++) {
		if (c->index[k].start != end)
			return say(err, errlen,
				   "%s: the shards %s floats %llu-%llu of the parameters", mpath,
				   c->index[k].start > end ? "miss" : "hold twice",
				   (unsigned long long)(c->index[k].start > end ? end : c->index[k].start),
				   (unsigned long long)(c->index[k].start > end ? c->index[k].start : end));
		end += c->index[k].count;
	}
	if (end != c->numel)
		return say(err, errlen, "%s: the shards hold %llu floats, the parameters %llu", mpath,
			   (unsigned long long)end, (unsigned long long)c->numel);
	return 0;
}

int hpu__ckpt_section(const hpu_ckpt *c, const char *name)
{
	for (int i = 0; i < c->nsections; i++)
		if (strcmp(c->sections[i], name) == 0)
			return i;
	return -1;
}

int hpu__ckpt_param_find(const hpu_ckpt *c, const char *name)
{
	for (int i = 0; i < c->nparams; i++)
		if (strcmp(c->params[i].name, name) == 0)
			return i;
	return -1;
}

int hpu__ckpt_buffer_find(const hpu_ckpt *c, const char *name)
{
	for (int i = 0; i < c->nbuffers; i++)
		if (strcmp(c->buffers[i].name, name) == 0)
			return i;
	return -1;
}
