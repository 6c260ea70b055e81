/* --save-params and --load-params files by name (params_file.h). */
#include "worker/strategy/params_file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "common/fileio.h"
#include "common/shapetext.h"
#include "options/config.h"

static int ends_with(const char *s, const char *tail)
{
	size_t n = strlen(s), t = strlen(tail);
	return n >= t && !strcmp(s + n - t, tail);
}

int hpu__params_is_safetensors(int format, const char *path)
{
	if (format != HPU_PARAMS_AUTO)
		return format == HPU_PARAMS_SAFETENSORS;
	return !ends_with(path, ".bin") && !ends_with(path, ".raw");
}

int hpu__params_write_header(hpu_builder *b, FILE *f, int format, const char *path)
{
	if (!hpu__params_is_safetensors(format, path))
		return 0;
	int n = b->nparams;
	const char **names = calloc((size_t)n + 1, sizeof *names);
	const int64_t **shapes = calloc((size_t)n + 1, sizeof *shapes);
	int *ndims = calloc((size_t)n + 1, sizeof *ndims);
	const char *meta[] = {"format", "pt", "producer", "hpu-worker --save-params", NULL};
	char err[512], *h = NULL;
	size_t len = 0;
	int rc = -1;
	if (!names || !shapes || !ndims) {
		errno = ENOMEM;
		goto done;
	}
	for (int i = 0; i < n; i++) {
		names[i] = b->params[i].name;
		shapes[i] = b->params[i].shape;
		ndims[i] = b->params[i].ndim;
	}
	if (!(h = hpu__st_header(n, names, ndims, shapes, NULL, meta, &len, err, sizeof err))) {
		errno = EINVAL;
		goto done;
	}
	if (fwrite(h, 1, len, f) == len)
		rc = 0;
done:
	free(h);
	free(names);
	free((void *)shapes);
	free(ndims);
	return rc;
}

/* The file's header, read whole: its tensors (malloc'd) and count, or -1
 * with err. */
static int read_header(int fd, uint64_t size, const char *path, hpu_st_tensor **t,
		       uint64_t *data_at, char *err, size_t errlen)
{
	size_t have = 8, need = 0;
	unsigned char *buf = NULL;
	char why[400];
	for (;;) {
		unsigned char *nb = realloc(buf, have);
		if (!nb) {
			free(buf);
			snprintf(err, errlen, "--load-params %s: out of memory", path);
			return -1;
		}
		buf = nb;
		if (pread(fd, buf, have, 0) != (ssize_t)have) {
			free(buf);
			snprintf(err, errlen, "--load-params %s: cannot read its header", path);
			return -1;
		}
		int n = hpu__st_parse(buf, have, size, t, data_at, &need, why, sizeof why);
		if (n != -2) {
			free(buf);
			if (n < 0)
				snprintf(err, errlen, "--load-params %s: not a safetensors file: %s", path,
					 why);
			return n;
		}
		have = need;
	}
}

static int same_shape(const hpu_st_tensor *t, int ndim, const int64_t *shape)
{
	if (t->ndim != ndim)
		return 0;
	for (int d = 0; d < ndim; d++)
		if (t->shape[d] != shape[d])
			return 0;
	return 1;
}

/* Every parameter of b in t (F32, its shape), every tensor of t one of b's
 * parameters or buffers: b->load_at filled. 0, or -1 with err. */
static int match(hpu_builder *b, const hpu_st_tensor *t, int n, uint64_t data_at,
		 const char *path, char *err, size_t errlen)
{
	char want[160], got[160];
	for (int k = 0; k < n; k++) {
		int found = 0;
		for (int i = 0; i < b->nparams && !found; i++)
			found = !strcmp(b->params[i].name, t[k].name);
		for (int i = 0; i < b->nbuffers && !found; i++)
			found = !strcmp(b->buffers[i].name, t[k].name);
		if (!found) {
			snprintf(err, errlen,
				 "--load-params %s: tensor \"%s\" is not a parameter of %s (saved from "
				 "another model, or renamed?)",
				 path, t[k].name, b->path);
			return -1;
		}
	}
	if (!(b->load_at = calloc((size_t)b->nparams + 1, sizeof *b->load_at))) {
		snprintf(err, errlen, "--load-params %s: out of memory", path);
		return -1;
	}
	for (int i = 0; i < b->nparams; i++) {
		const hpu_param_info *p = &b->params[i];
		const hpu_st_tensor *m = NULL;
		for (int k = 0; k < n && !m; k++)
			if (!strcmp(t[k].name, p->name))
				m = &t[k];
		hpu__shape_text(want, sizeof want, p->ndim, p->shape);
		if (!m) {
			snprintf(err, errlen, "--load-params %s: parameter \"%s\" (F32 %s) is missing",
				 path, p->name, want);
			return -1;
		}
		hpu__shape_text(got, sizeof got, m->ndim, m->shape);
		if (strcmp(m->dtype, "F32") || !same_shape(m, p->ndim, p->shape)) {
			snprintf(err, errlen,
				 "--load-params %s: parameter \"%s\" is %s %s in the file, but %s "
				 "declares F32 %s",
				 path, p->name, m->dtype, got, b->path, want);
			return -1;
		}
		b->load_at[i] = data_at + m->begin;
	}
	return 0;
}

int hpu__params_open(hpu_builder *b, const char *path, char *err, size_t errlen)
{
	struct stat st;
	unsigned char head[9];
	free(b->load_at);
	b->load_at = NULL;
	const char *why;
	int fd = hpu__open_input_fd(path, 0, &st, &why); /* a FIFO would hang */
	if (fd < 0) /* said as for the raw file */
		return hpu__model_params_open(b, path, err, errlen);
	if ((uint64_t)st.st_size < 9 || pread(fd, head, 9, 0) != 9 ||
	    !hpu__st_sniff(head, (uint64_t)st.st_size)) {
		close(fd);
		return hpu__model_params_open(b, path, err, errlen); /* raw, checked as before */
	}
	hpu_st_tensor *t = NULL;
	uint64_t data_at = 0;
	int n = read_header(fd, (uint64_t)st.st_size, path, &t, &data_at, err, errlen);
	if (n < 0 || match(b, t, n, data_at, path, err, errlen) < 0) {
		free(t);
		free(b->load_at);
		b->load_at = NULL;
		close(fd);
		return -1;
	}
	free(t);
	return fd;
}
