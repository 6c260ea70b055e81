#include "examples/common/idx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static int read_exact(gzFile f, void *buf, size_t n)
{
	while (n) {
		unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
		int k = gzread(f, buf, chunk);
		if (k <= 0)
			return -1;
		buf = (char *)buf + k;
		n -= (size_t)k;
	}
	return 0;
}

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int idx_read(idx_array *out, const char *path, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	gzFile f = gzopen(path, "rb");
	if (!f) {
		snprintf(err, errlen, "cannot open %s: %s", path,
			 errno ? strerror(errno) : "out of memory");
		return -1;
	}
	uint8_t hdr[4 + 12];
	/* Magic: two zero bytes, type 0x08 (unsigned byte), number of dims. */
	if (read_exact(f, hdr, 4) || hdr[0] || hdr[1] || hdr[2] != 0x08 ||
	    hdr[3] < 1 || hdr[3] > 3) {
		snprintf(err, errlen, "%s is not an unsigned-byte IDX file", path);
		goto fail;
	}
	out->ndim = hdr[3];
	if (read_exact(f, hdr + 4, 4u * (unsigned)out->ndim)) {
		snprintf(err, errlen, "%s: truncated header", path);
		goto fail;
	}
	out->item = 1;
	for (int d = 0; d < out->ndim; d++) {
		out->dims[d] = be32(hdr + 4 + 4 * d);
		if (d)
			out->item *= out->dims[d];
	}
	out->count = out->dims[0];
	if (!out->count || out->item > (1u << 20) || out->count > (1u << 26)) {
		snprintf(err, errlen, "%s: implausible dimensions", path);
		goto fail;
	}
	out->data = malloc(out->count * out->item);
	if (!out->data) {
		snprintf(err, errlen, "%s: out of memory", path);
		goto fail;
	}
	if (read_exact(f, out->data, out->count * out->item)) {
		snprintf(err, errlen, "%s: truncated data (expected %zu items)", path,
			 out->count);
		goto fail;
	}
	gzclose(f);
	return 0;
fail:
	gzclose(f);
	idx_free(out);
	return -1;
}

void idx_free(idx_array *a)
{
	free(a->data);
	a->data = NULL;
}
