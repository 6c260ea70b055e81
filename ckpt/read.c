/* read: a checkpoint's data files: their digests verified against the
 * manifest, and floats read from them. */
#include "ckpt/ckpt_impl.h"
#include "common/hex.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- digests ---- */

/* SHA-256 of what fd holds, read to its end but no further than `most`
 * bytes (a file that grows while read stops there). */
static int sha256_fd(int fd, uint64_t most, char *hexout, uint64_t *bytes)
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	enum { BUF = 1 << 20 };
	unsigned char *buf = malloc(BUF);
	int rc = -1, e = ENOMEM;
	*bytes = 0;
	if (md && buf && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1) {
		for (;;) {
			ssize_t got = *bytes >= most ? 0 : read(fd, buf, BUF);
			if (got < 0 && errno == EINTR)
				continue;
			if (got < 0) {
				e = errno;
				break;
			}
			if (got == 0) {
				unsigned char d[32];
				unsigned int dl = 0;
				EVP_DigestFinal_ex(md, d, &dl);
				hpu__hex(hexout, d, sizeof d);
				rc = 0;
				break;
			}
			EVP_DigestUpdate(md, buf, (size_t)got);
			*bytes += (uint64_t)got;
		}
	}
	EVP_MD_CTX_free(md);
	free(buf);
	if (rc)
		errno = e;
	return rc;
}

int hpu__ckpt_sha256_file(const char *path, char *hexout, uint64_t *bytes)
{
	struct stat st;
	const char *why;
	int fd = hpu__open_input_fd(path, 0, &st, &why);
	if (fd < 0) {
		if (st.st_mode)
			errno = EINVAL; /* not a regular file */
		return -1;
	}
	int rc = sha256_fd(fd, UINT64_MAX, hexout, bytes), e = errno;
	close(fd);
	errno = e;
	return rc;
}

/* A file's size against the manifest's: "truncated" or "too long". */
static int wrong_size(const char *what, const char *path, uint64_t bytes, uint64_t want,
		      char *err, size_t errlen)
{
	return say(err, errlen, "checkpoint %s %s is %s: %llu bytes, the manifest says %llu", what,
		   path, bytes < want ? "truncated" : "too long", (unsigned long long)bytes,
		   (unsigned long long)want);
}

/* File f of c, `what` naming its kind in the sentences: a regular file of
 * a trusted owner, its size (from fstat: nothing is read from a file of
 * the wrong size), then its digest. */
static int verify_file(hpu_ckpt *c, const hpu_ckpt_file *f, const char *what, char *err,
		       size_t errlen)
{
	char path[4200], got[65], pre[64];
	uint64_t bytes;
	struct stat st;
	snprintf(path, sizeof path, "%s/%s", c->dir, f->name);
	snprintf(pre, sizeof pre, "checkpoint %s ", what);
	int fd = hpu__ckpt_open_data(c, pre, path, &st, err, errlen);
	if (fd < 0)
		return -1;
	if ((uint64_t)st.st_size != f->bytes) {
		close(fd);
		return wrong_size(what, path, (uint64_t)st.st_size, f->bytes, err, errlen);
	}
	int rc = sha256_fd(fd, f->bytes + 1, got, &bytes), e = errno;
	close(fd);
	if (rc < 0)
		return say(err, errlen, "checkpoint %s %s: %s", what, path, strerror(e));
	if (bytes != f->bytes) /* changed while it was read */
		return wrong_size(what, path, bytes, f->bytes, err, errlen);
	if (strcmp(got, f->sha256) != 0)
		return say(err, errlen,
			   "checkpoint %s %s is damaged: SHA-256 %s, the manifest says %s", what,
			   path, got, f->sha256);
	return 0;
}

int hpu__ckpt_verify(hpu_ckpt *c, int i, char *err, size_t errlen)
{
	return verify_file(c, &c->files[i], "shard", err, errlen);
}

int hpu__ckpt_verify_buffers(hpu_ckpt *c, char *err, size_t errlen)
{
	if (!c->nbuffers)
		return 0;
	return verify_file(c, &c->buffer_file, "buffers file", err, errlen);
}

/* ---- reading floats ---- */

/* File i's descriptor; i == nfiles: the buffers file's. */
static int file_fd(hpu_ckpt *c, int i, char *err, size_t errlen)
{
	if (c->fds[i] >= 0)
		return c->fds[i];
	char path[4200];
	int shard = i < c->nfiles;
	snprintf(path, sizeof path, "%s/%s", c->dir,
		 shard ? c->files[i].name : c->buffer_file.name);
	struct stat st;
	c->fds[i] = hpu__ckpt_open_data(c, shard ? "checkpoint shard " : "checkpoint buffers file ",
					path, &st, err, errlen);
	return c->fds[i];
}

static int pread_all(int fd, void *dst, size_t n, off_t at)
{
	char *p = dst;
	while (n) {
		ssize_t got = pread(fd, p, n, at);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			if (got == 0)
				errno = EIO; /* shorter than the manifest says */
			return -1;
		}
		p += got;
		n -= (size_t)got;
		at += got;
	}
	return 0;
}

int hpu__ckpt_read(hpu_ckpt *c, int section, uint64_t start, uint64_t count, float *dst,
		   char *err, size_t errlen)
{
	if (section < 0 || section >= c->nsections || start + count > c->numel)
		return say(err, errlen, "checkpoint %s: floats %llu-%llu of section %d are not there",
			   c->dir, (unsigned long long)start, (unsigned long long)(start + count),
			   section);
	/* the last segment starting at or before `start` */
	size_t lo = 0, hi = c->nindex;
	while (hi - lo > 1) {
		size_t mid = (lo + hi) / 2;
		if (c->index[mid].start <= start)
			lo = mid;
		else
			hi = mid;
	}
	for (size_t k = lo; count > 0 && k < c->nindex; k++) {
		const hpu_ckpt_index *x = &c->index[k];
		uint64_t skip = start - x->start, n = x->count - skip;
		if (n > count)
			n = count;
		int fd = file_fd(c, x->file, err, errlen);
		if (fd < 0)
			return -1;
		const hpu_ckpt_file *f = &c->files[x->file];
		off_t at = (off_t)(((uint64_t)section * f->elems + x->at + skip) * 4);
		if (pread_all(fd, dst, n * 4, at) < 0)
			return say(err, errlen, "checkpoint shard %s/%s: %s", c->dir, f->name,
				   errno == EIO ? "shorter than the manifest says" : strerror(errno));
		c->bytes_read += n * 4;
		dst += n;
		start += n;
		count -= n;
	}
	return 0;
}

int hpu__ckpt_read_buffers(hpu_ckpt *c, uint64_t start, uint64_t count, float *dst, char *err,
			   size_t errlen)
{
	if (start > c->buffer_numel || count > c->buffer_numel - start)
		return say(err, errlen,
			   "checkpoint %s: buffer floats %llu-%llu are not there (it holds %llu)",
			   c->dir, (unsigned long long)start, (unsigned long long)(start + count),
			   (unsigned long long)c->buffer_numel);
	if (!count)
		return 0;
	int fd = file_fd(c, c->nfiles, err, errlen);
	if (fd < 0)
		return -1;
	if (pread_all(fd, dst, count * 4, (off_t)(start * 4)) < 0)
		return say(err, errlen, "checkpoint buffers file %s/%s: %s", c->dir,
			   c->buffer_file.name,
			   errno == EIO ? "shorter than the manifest says" : strerror(errno));
	c->bytes_read += count * 4;
	return 0;
}
