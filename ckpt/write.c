/* write: writing a checkpoint's data file with its digest, and the
 * manifest's entries for the files written. */
#include "ckpt/ckpt_impl.h"
#include "common/hex.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

/* ---- writing ---- */

enum { WBUF = 4 << 20 };

int hpu__ckpt_writer_open(hpu_ckpt_writer *w, const char *path, char *err, size_t errlen)
{
	memset(w, 0, sizeof *w);
	if (!(w->buf = malloc(WBUF)) || !(w->md = EVP_MD_CTX_new()) ||
	    EVP_DigestInit_ex(w->md, EVP_sha256(), NULL) != 1) {
		EVP_MD_CTX_free(w->md);
		free(w->buf);
		return say(err, errlen, "out of memory");
	}
	if (hpu__outfile_open(&w->out, path, 0644) < 0) {
		hpu__outfile_error(&w->out, "open", err, errlen);
		hpu__ckpt_writer_abort(w);
		return -1;
	}
	return 0;
}

static int flush(hpu_ckpt_writer *w, char *err, size_t errlen)
{
	if (hpu__write_all(w->out.fd, w->buf, w->fill) < 0)
		return hpu__outfile_error(&w->out, "write", err, errlen);
	w->fill = 0;
	return 0;
}

int hpu__ckpt_writer_put(hpu_ckpt_writer *w, const void *p, size_t n, char *err, size_t errlen)
{
	const unsigned char *s = p;
	EVP_DigestUpdate(w->md, s, n);
	w->bytes += n;
	while (n) {
		size_t k = WBUF - w->fill < n ? WBUF - w->fill : n;
		memcpy(w->buf + w->fill, s, k);
		w->fill += k;
		s += k;
		n -= k;
		if (w->fill == WBUF && flush(w, err, errlen) < 0)
			return -1;
	}
	return 0;
}

int hpu__ckpt_writer_commit(hpu_ckpt_writer *w, char *sha256, char *err, size_t errlen)
{
	const char *step;
	if (flush(w, err, errlen) < 0)
		return -1;
	if (hpu__outfile_commit(&w->out, &step) < 0)
		return hpu__outfile_error(&w->out, step, err, errlen);
	unsigned char d[32];
	unsigned int dl = 0;
	EVP_DigestFinal_ex(w->md, d, &dl);
	if (sha256)
		hpu__hex(sha256, d, sizeof d);
	hpu__ckpt_writer_abort(w); /* frees; nothing left to remove */
	return 0;
}

void hpu__ckpt_writer_abort(hpu_ckpt_writer *w)
{
	if (w->buf) /* else closed already, or never opened */
		hpu__outfile_abort(&w->out);
	EVP_MD_CTX_free(w->md);
	w->md = NULL;
	free(w->buf);
	w->buf = NULL;
}

cJSON *hpu__ckpt_file_json(const hpu_ckpt_file *f)
{
	cJSON *j = cJSON_CreateObject(), *segs = cJSON_CreateArray();
	cJSON_AddStringToObject(j, "name", f->name);
	cJSON_AddNumberToObject(j, "bytes", (double)f->bytes);
	cJSON_AddStringToObject(j, "sha256", f->sha256);
	for (size_t k = 0; k < f->nseg; k++) {
		cJSON *s = cJSON_CreateArray();
		cJSON_AddItemToArray(s, cJSON_CreateNumber((double)f->seg[k].start));
		cJSON_AddItemToArray(s, cJSON_CreateNumber((double)f->seg[k].count));
		cJSON_AddItemToArray(segs, s);
	}
	cJSON_AddItemToObject(j, "segments", segs);
	return j;
}

cJSON *hpu__ckpt_buffers_json(const hpu_ckpt_file *f, const hpu_ckpt_buffer *v, int n)
{
	cJSON *j = cJSON_CreateObject(), *arr = cJSON_CreateArray();
	uint64_t numel = 0;
	cJSON_AddStringToObject(j, "file", f->name);
	cJSON_AddNumberToObject(j, "bytes", (double)f->bytes);
	cJSON_AddStringToObject(j, "sha256", f->sha256);
	for (int i = 0; i < n; i++) {
		cJSON *t = cJSON_CreateObject(), *shape = cJSON_CreateArray();
		cJSON_AddStringToObject(t, "name", v[i].name);
		for (int d = 0; d < v[i].ndim; d++)
			cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)v[i].shape[d]));
		cJSON_AddItemToObject(t, "shape", shape);
		cJSON_AddStringToObject(t, "dtype", "F32");
		cJSON_AddNumberToObject(t, "offset", (double)v[i].offset);
		cJSON_AddNumberToObject(t, "numel", (double)v[i].numel);
		if (v[i].sync[0])
			cJSON_AddStringToObject(t, "sync", v[i].sync);
		cJSON_AddItemToArray(arr, t);
		numel += v[i].numel;
	}
	cJSON_AddNumberToObject(j, "numel", (double)numel);
	cJSON_AddItemToObject(j, "tensors", arr);
	return j;
}
