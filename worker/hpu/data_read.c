/* data_read: hpu_array_load (include/hpu/data.h): IDX, NumPy .npy and
 * .npz, llm.c token files. The format is told by the first bytes. */
#include "worker/hpu/dataio.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "common/shapetext.h"

/* Where bytes come from: a file through zlib (gzipped or not), or
 * memory (an .npz member). */
typedef struct rd {
	gzFile gz;
	const uint8_t *mem;
	size_t len, pos;
	int corrupt; /* zlib could not inflate the file */
	uint64_t fsize; /* the file's size (gz) */
	int direct;	/* the file is not gzipped (gz) */
} rd;

/* Deflate's largest ratio: a gzip file's inflated size is not told
 * reliably (its ISIZE is modulo 4 GiB), but cannot pass this times its
 * size. */
#define DEFLATE_MOST_RATIO 1032

/* The most bytes r can still give. */
static uint64_t rd_most(const rd *r)
{
	if (!r->gz)
		return r->len - r->pos;
	if (!r->direct)
		return r->fsize * DEFLATE_MOST_RATIO;
	z_off_t at = gztell(r->gz);
	return at >= 0 && (uint64_t)at < r->fsize ? r->fsize - (uint64_t)at : 0;
}

static size_t rd_read(rd *r, void *buf, size_t n)
{
	if (!r->gz) {
		size_t k = r->len - r->pos < n ? r->len - r->pos : n;
		memcpy(buf, r->mem + r->pos, k);
		r->pos += k;
		return k;
	}
	size_t got = 0;
	while (got < n) {
		size_t left = n - got;
		unsigned chunk = left > (1u << 30) ? (1u << 30) : (unsigned)left;
		int k = gzread(r->gz, (char *)buf + got, chunk);
		if (k < 0)
			r->corrupt = 1;
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	return got;
}

/* Refuses a read that came up short: as corrupt gzip data when zlib
 * could not inflate (a CRC-32 that does not match is found at the end of
 * whatever read inflates it, the first one for a small file), else with
 * the caller's sentence of what was cut off. */
static int rd_short(const rd *r, const hpu__dfile *f, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int rd_short(const rd *r, const hpu__dfile *f, const char *fmt, ...)
{
	if (r->corrupt)
		return hpu__data_fail(f, "corrupt gzip data");
	char what[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	return hpu__data_fail(f, "%s", what);
}

static int host_is_le(void)
{
	const uint16_t one = 1;
	return *(const uint8_t *)&one == 1;
}

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

static uint16_t le16(const uint8_t *p)
{
	return (uint16_t)(p[1] << 8 | p[0]);
}

static uint64_t le64(const uint8_t *p)
{
	return (uint64_t)le32(p + 4) << 32 | le32(p);
}

static void swap_bytes(void *data, size_t n, size_t size)
{
	uint8_t *p = data;
	for (size_t i = 0; i < n; i++, p += size)
		for (size_t k = 0; k < size / 2; k++) {
			uint8_t t = p[k];
			p[k] = p[size - 1 - k];
			p[size - 1 - k] = t;
		}
}

/* Reads a's data, which must end the file exactly; swaps it to the
 * host's order when the file's (big_endian) differs. */
static int read_body(rd *r, const hpu__dfile *f, hpu_array *a, int big_endian)
{
	char sh[160];
	size_t want = hpu__array_bytes(a), got = rd_read(r, a->data, want);
	if (got < want)
		return rd_short(r, f, "truncated: the header says %s of %s, %zu bytes of data, but only %zu follow",
				hpu__shape_text(sh, sizeof sh, a->ndim, a->shape), hpu_data_type_name(a->type), want, got);
	/* The read past the data is where zlib checks the CRC-32 of a file
	 * whose data was inflated straight into a->data. */
	uint8_t extra;
	size_t more = rd_read(r, &extra, 1);
	if (r->corrupt)
		return hpu__data_fail(f, "corrupt gzip data");
	if (more == 1)
		return hpu__data_fail(f, "mis-shaped: more data follows than the header's %s of %s (%zu bytes) holds",
				      hpu__shape_text(sh, sizeof sh, a->ndim, a->shape), hpu_data_type_name(a->type), want);
	size_t size = hpu_data_type_size(a->type);
	if (size > 1 && big_endian == host_is_le())
		swap_bytes(a->data, a->count * a->row_numel, size);
	return HPU_OK;
}

/* Shapes a and allocates its data, once the file is known to hold that
 * much: a damaged header's count (2^31 tokens, a 4 GiB image) said
 * "truncated" only after the memory was reserved, and "out of memory"
 * where it could not be. */
static int alloc_body(rd *r, const hpu__dfile *f, hpu_array *a, hpu_data_type t, int ndim,
		      const int64_t *shape)
{
	int rc = hpu__array_shape(a, f, t, ndim, shape);
	if (rc)
		return rc;
	char sh[160];
	uint64_t want = hpu__array_bytes(a), most = rd_most(r);
	if (want > most) {
		hpu__shape_text(sh, sizeof sh, a->ndim, a->shape);
		if (r->gz && !r->direct)
			return hpu__data_fail(f, "truncated: the header says %s of %s, %llu bytes of data, but the file's %llu gzipped bytes cannot inflate to that many",
					      sh, hpu_data_type_name(t), (unsigned long long)want,
					      (unsigned long long)r->fsize);
		return hpu__data_fail(f, "truncated: the header says %s of %s, %llu bytes of data, but only %llu follow",
				      sh, hpu_data_type_name(t), (unsigned long long)want,
				      (unsigned long long)most);
	}
	return hpu__array_data(a, f);
}

/* ---- IDX: 0, 0, type, ndim; ndim big-endian uint32 dims; data ---- */

static int idx_type(uint8_t code, hpu_data_type *t)
{
	switch (code) {
	case 0x08: *t = HPU_DATA_U8; return 0;
	case 0x09: *t = HPU_DATA_I8; return 0;
	case 0x0B: *t = HPU_DATA_I16; return 0;
	case 0x0C: *t = HPU_DATA_I32; return 0;
	case 0x0D: *t = HPU_DATA_F32; return 0;
	case 0x0E: *t = HPU_DATA_F64; return 0;
	default: return -1;
	}
}

static int load_idx(hpu_array *a, rd *r, const hpu__dfile *f, const uint8_t *magic)
{
	hpu_data_type t;
	if (idx_type(magic[2], &t) < 0)
		return hpu__data_fail(f, "bad IDX type 0x%02x: not ubyte (0x08), byte (0x09), short (0x0B), int (0x0C), float (0x0D) or double (0x0E)",
				      magic[2]);
	int ndim = magic[3];
	if (ndim < 1 || ndim > HPU_ARRAY_MAX_DIMS)
		return hpu__data_fail(f, "bad IDX header: %d dimensions (1 to %d are supported)", ndim,
				      HPU_ARRAY_MAX_DIMS);
	uint8_t dims[4 * HPU_ARRAY_MAX_DIMS];
	if (rd_read(r, dims, 4u * (unsigned)ndim) < 4u * (unsigned)ndim)
		return rd_short(r, f, "truncated: the IDX header ends before its %d dimensions", ndim);
	int64_t shape[HPU_ARRAY_MAX_DIMS];
	for (int d = 0; d < ndim; d++)
		shape[d] = be32(dims + 4 * d);
	int rc = alloc_body(r, f, a, t, ndim, shape);
	return rc ? rc : read_body(r, f, a, 1);
}

/* ---- llm.c tokens: 256 int32 (magic, version, tokens), then tokens ---- */

#define LLMC_GPT2_MAGIC 20240520
#define LLMC_LLAMA3_MAGIC 20240801

static int load_tokens(hpu_array *a, rd *r, const hpu__dfile *f, const uint8_t *magic)
{
	uint8_t h[1024];
	memcpy(h, magic, 4);
	if (rd_read(r, h + 4, sizeof h - 4) < sizeof h - 4)
		return rd_short(r, f, "truncated: an llm.c token file starts with a 1024-byte header");
	uint32_t m = le32(h), version = le32(h + 4);
	int32_t ntok = (int32_t)le32(h + 8);
	hpu_data_type t = m == LLMC_GPT2_MAGIC ? HPU_DATA_U16 : HPU_DATA_U32;
	uint32_t want = m == LLMC_GPT2_MAGIC ? 1 : 7;
	if (version != want)
		return hpu__data_fail(f, "llm.c token file of version %u: magic %u goes with version %u (%s tokens)",
				      version, m, want, hpu_data_type_name(t));
	if (ntok < 0)
		return hpu__data_fail(f, "mis-shaped: the header says %d tokens", ntok);
	int64_t shape[1] = {ntok};
	int rc = alloc_body(r, f, a, t, 1, shape);
	return rc ? rc : read_body(r, f, a, 0);
}

/* ---- .npy: "\x93NUMPY", major, minor, header length, a dict ---- */

/* Points at the value of key in the header dict, or NULL. */
static const char *npy_value(const char *hdr, const char *key)
{
	char q[40];
	for (int quote = 0; quote < 2; quote++) {
		snprintf(q, sizeof q, quote ? "\"%s\"" : "'%s'", key);
		const char *p = strstr(hdr, q);
		if (!p)
			continue;
		p += strlen(q);
		while (*p == ' ')
			p++;
		if (*p != ':')
			return NULL;
		for (p++; *p == ' '; p++)
			;
		return p;
	}
	return NULL;
}

static int npy_type(const char *descr, hpu_data_type *t, int *big_endian)
{
	static const struct {
		const char *code;
		hpu_data_type type;
	} codes[] = {{"b1", HPU_DATA_U8},  {"u1", HPU_DATA_U8},  {"i1", HPU_DATA_I8},
		     {"u2", HPU_DATA_U16}, {"i2", HPU_DATA_I16}, {"u4", HPU_DATA_U32},
		     {"i4", HPU_DATA_I32}, {"i8", HPU_DATA_I64}, {"f4", HPU_DATA_F32},
		     {"f8", HPU_DATA_F64}};
	if (!strchr("<>|=", descr[0]) || !descr[0])
		return -1;
	*big_endian = descr[0] == '>' || (descr[0] != '<' && !host_is_le());
	for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
		if (!strcmp(descr + 1, codes[i].code)) {
			*t = codes[i].type;
			return 0;
		}
	return -1;
}

static int npy_shape(const char *p, int *ndim, int64_t *shape)
{
	if (!p || *p++ != '(')
		return -1;
	for (*ndim = 0;;) {
		while (*p == ' ')
			p++;
		if (*p == ')')
			return 0;
		char *end;
		errno = 0;
		long long v = strtoll(p, &end, 10);
		if (end == p || errno || v < 0 || *ndim == HPU_ARRAY_MAX_DIMS)
			return -1;
		shape[(*ndim)++] = v;
		for (p = end; *p == ' ' || *p == 'L'; p++)
			;
		if (*p == ',')
			p++;
		else if (*p != ')')
			return -1;
	}
}

/* Parses the header dict into type, order and shape. */
static int npy_header(const char *hdr, const hpu__dfile *f, hpu_data_type *t, int *big_endian,
		      int *ndim, int64_t *shape)
{
	const char *d = npy_value(hdr, "descr"), *fo = npy_value(hdr, "fortran_order");
	if (!d || !fo || !npy_value(hdr, "shape"))
		return hpu__data_fail(f, "bad .npy header: it lacks 'descr', 'fortran_order' or 'shape'");
	char descr[32] = "";
	if (*d == '\'' || *d == '"') {
		const char *end = strchr(d + 1, *d);
		if (end && (size_t)(end - d - 1) < sizeof descr)
			memcpy(descr, d + 1, (size_t)(end - d - 1));
	}
	if (npy_type(descr, t, big_endian) < 0)
		return hpu__data_fail(f, "mis-typed: element type '%s' is not supported (b1, u1, i1, u2, i2, u4, i4, i8, f4 and f8 are; structured arrays are not)",
				      descr[0] ? descr : d);
	if (!strncmp(fo, "True", 4))
		return hpu__data_fail(f, "fortran_order is True: the array is stored column-major; save it in C order (numpy.ascontiguousarray) to load it");
	if (npy_shape(npy_value(hdr, "shape"), ndim, shape) < 0)
		return hpu__data_fail(f, "bad .npy header: its shape is not a tuple of at most %d sizes",
				      HPU_ARRAY_MAX_DIMS);
	return HPU_OK;
}

static int load_npy(hpu_array *a, rd *r, const hpu__dfile *f, const uint8_t *magic)
{
	uint8_t pre[12];
	memcpy(pre, magic, 4);
	if (rd_read(r, pre + 4, 4) < 4 || memcmp(pre, "\x93NUMPY", 6))
		return rd_short(r, f, "truncated or bad magic: not a .npy file");
	int major = pre[6];
	size_t lenlen = major == 1 ? 2 : 4, hlen;
	if (major < 1 || major > 3)
		return hpu__data_fail(f, ".npy format version %d.%d is not supported (1 to 3 are)", major,
				      pre[7]);
	if (rd_read(r, pre + 8, lenlen) < lenlen)
		return rd_short(r, f, "truncated: the .npy header ends before its length");
	hlen = major == 1 ? le16(pre + 8) : le32(pre + 8);
	if (hlen > (1u << 20))
		return hpu__data_fail(f, "bad .npy header: %zu bytes long", hlen);
	char *hdr = malloc(hlen + 1);
	if (!hdr)
		return hpu__data_fail(f, "out of memory");
	int rc;
	if (rd_read(r, hdr, hlen) < hlen) {
		rc = rd_short(r, f, "truncated: the .npy header is %zu bytes, the file ends before", hlen);
		goto out;
	}
	hdr[hlen] = 0;
	hpu_data_type t = HPU_DATA_U8;
	int big_endian = 0, ndim = 0;
	int64_t shape[HPU_ARRAY_MAX_DIMS];
	rc = npy_header(hdr, f, &t, &big_endian, &ndim, shape);
	if (!rc)
		rc = alloc_body(r, f, a, t, ndim, shape);
	if (!rc)
		rc = read_body(r, f, a, big_endian);
out:
	free(hdr);
	return rc;
}

/* ---- .npz: a zip archive of .npy members, read by its central directory ---- */

typedef struct zentry {
	char name[256];
	uint16_t flags, method;
	uint32_t crc;
	uint64_t csize, usize, offset;
} zentry;

static int read_at(FILE *fp, uint64_t off, void *buf, size_t n)
{
	return fseeko(fp, (off_t)off, SEEK_SET) == 0 && fread(buf, 1, n, fp) == n ? 0 : -1;
}

/* Finds the end-of-central-directory record: its entries, the central
 * directory's size and offset. */
static int zip_eocd(FILE *fp, const hpu__dfile *f, uint64_t fsize, unsigned *n, uint64_t *cd_size,
		    uint64_t *cd_off)
{
	size_t tail = fsize < 65557 ? (size_t)fsize : 65557;
	uint8_t *buf = malloc(tail + 1);
	if (!buf)
		return hpu__data_fail(f, "out of memory");
	int rc = hpu__data_fail(f, "truncated: no zip end-of-central-directory record (an .npz file is a zip archive)");
	if (read_at(fp, fsize - tail, buf, tail) == 0)
		for (size_t i = tail >= 22 ? tail - 22 + 1 : 0; i-- > 0;)
			if (!memcmp(buf + i, "PK\5\6", 4)) {
				*n = le16(buf + i + 10);
				*cd_size = le32(buf + i + 12);
				*cd_off = le32(buf + i + 16);
				rc = HPU_OK;
				if (*n == 0xFFFF || *cd_off == 0xFFFFFFFFu)
					rc = hpu__data_fail(f, "a ZIP64 archive's directory is not supported");
				else if (*cd_off + *cd_size > fsize - tail + i)
					rc = hpu__data_fail(f, "truncated: the zip central directory lies past the end of the file");
				break;
			}
	free(buf);
	return rc;
}

/* Values of 0xFFFFFFFF are in the zip64 extra field (id 1), in order. */
static void zip64_extra(zentry *e, const uint8_t *x, size_t xlen)
{
	for (size_t i = 0; i + 4 <= xlen;) {
		uint16_t id = le16(x + i), len = le16(x + i + 2);
		const uint8_t *v = x + i + 4, *end = v + len;
		if (id == 1) {
			uint64_t *fields[3] = {&e->usize, &e->csize, &e->offset};
			for (int k = 0; k < 3; k++)
				if (*fields[k] == 0xFFFFFFFFu && v + 8 <= end && v + 8 <= x + xlen) {
					*fields[k] = le64(v);
					v += 8;
				}
		}
		i += 4u + len;
	}
}

/* Parses central directory entry k at p (left bytes); returns its size
 * or 0 when it is cut off or not an entry. */
static size_t zip_entry(const uint8_t *p, size_t left, zentry *e)
{
	if (left < 46 || memcmp(p, "PK\1\2", 4))
		return 0;
	size_t nlen = le16(p + 28), xlen = le16(p + 30), clen = le16(p + 32);
	if (46 + nlen + xlen + clen > left)
		return 0;
	memset(e, 0, sizeof *e);
	e->flags = le16(p + 8);
	e->method = le16(p + 10);
	e->crc = le32(p + 16);
	e->csize = le32(p + 20);
	e->usize = le32(p + 24);
	e->offset = le32(p + 42);
	memcpy(e->name, p + 46, nlen < sizeof e->name ? nlen : sizeof e->name - 1);
	zip64_extra(e, p + 46 + nlen, xlen);
	return 46 + nlen + xlen + clen;
}

/* Whether entry name is the array `member` ("x" or "x.npy"). */
static int zip_is(const char *name, const char *member)
{
	size_t n = strlen(member);
	return !strcmp(name, member) || (!strncmp(name, member, n) && !strcmp(name + n, ".npy"));
}

/* Picks the member's entry from the central directory. */
static int zip_find(FILE *fp, const hpu__dfile *f, uint64_t fsize, const char *member, zentry *out)
{
	unsigned n = 0;
	uint64_t cd_size = 0, cd_off = 0;
	int rc = zip_eocd(fp, f, fsize, &n, &cd_size, &cd_off);
	if (rc)
		return rc;
	uint8_t *cd = malloc(cd_size + 1);
	if (!cd)
		return hpu__data_fail(f, "out of memory");
	char names[512] = "";
	int found = 0;
	rc = HPU_OK;
	if (read_at(fp, cd_off, cd, cd_size) < 0)
		rc = hpu__data_fail(f, "truncated: cannot read the zip central directory");
	for (size_t pos = 0, k = 0; !rc && k < n; k++) {
		zentry e;
		size_t len = zip_entry(cd + pos, cd_size - pos, &e);
		if (!len) {
			rc = hpu__data_fail(f, "bad zip central directory: entry %zu of %u is cut off", k, n);
			break;
		}
		pos += len;
		size_t used = strlen(names);
		snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", e.name);
		if (member ? zip_is(e.name, member) : n == 1) {
			*out = e;
			found = 1;
		}
	}
	free(cd);
	if (rc || found)
		return rc;
	if (!member)
		return hpu__data_fail(f, "holds %u arrays (%s): name the one to load", n, names);
	return hpu__data_fail(f, "has no array '%s' (it holds %s)", member, n ? names : "none");
}

/* Reads the entry's bytes, inflated, into *out (e->usize bytes). */
static int zip_member(FILE *fp, const hpu__dfile *f, uint64_t fsize, const zentry *e, uint8_t **out)
{
	uint8_t lh[30];
	if (e->flags & 1)
		return hpu__data_fail(f, "member %s is encrypted", e->name);
	if (e->method != 0 && e->method != 8)
		return hpu__data_fail(f, "member %s uses zip method %u (stored, 0, and deflated, 8, are supported)",
				      e->name, e->method);
	if (read_at(fp, e->offset, lh, sizeof lh) < 0 || memcmp(lh, "PK\3\4", 4))
		return hpu__data_fail(f, "bad zip: member %s's local header is missing", e->name);
	uint64_t start = e->offset + 30 + le16(lh + 26) + le16(lh + 28);
	if (start + e->csize > fsize || e->usize > ((uint64_t)1 << 40))
		return hpu__data_fail(f, "truncated: member %s ends past the end of the file", e->name);
	uint8_t *c = malloc(e->csize + 1), *u = e->method ? malloc(e->usize + 1) : c;
	int rc = HPU_OK;
	if (!c || !u) {
		rc = hpu__data_fail(f, "out of memory");
		goto out;
	}
	if (read_at(fp, start, c, e->csize) < 0) {
		rc = hpu__data_fail(f, "truncated: cannot read member %s", e->name);
		goto out;
	}
	if (e->method == 8) {
		z_stream z = {.next_in = c, .avail_in = (uInt)e->csize, .next_out = u,
			      .avail_out = (uInt)e->usize};
		int zr = inflateInit2(&z, -MAX_WBITS);
		if (zr == Z_OK)
			zr = inflate(&z, Z_FINISH);
		if (zr != Z_STREAM_END || z.total_out != e->usize)
			rc = hpu__data_fail(f, "member %s: its deflated data is corrupt", e->name);
		inflateEnd(&z);
	} else if (e->csize != e->usize) {
		rc = hpu__data_fail(f, "member %s: stored but its sizes differ", e->name);
	}
	if (!rc && crc32(0, u, (uInt)e->usize) != e->crc)
		rc = hpu__data_fail(f, "member %s is corrupt: its CRC-32 does not match", e->name);
out:
	if (u != c)
		free(c);
	if (rc)
		free(u);
	else
		*out = u;
	return rc;
}

static int load_npz(hpu_array *a, const hpu__dfile *f, const char *member)
{
	FILE *fp = fopen(f->path, "rb");
	if (!fp)
		return hpu__data_open_fail(f, errno);
	uint8_t *bytes = NULL;
	zentry e;
	int rc = fseeko(fp, 0, SEEK_END) ? hpu__data_fail(f, "cannot seek") : HPU_OK;
	uint64_t fsize = rc ? 0 : (uint64_t)ftello(fp);
	if (!rc)
		rc = zip_find(fp, f, fsize, member, &e);
	if (!rc)
		rc = zip_member(fp, f, fsize, &e, &bytes);
	if (!rc) {
		char path[1200];
		snprintf(path, sizeof path, "%s (member %s)", f->path, e.name);
		hpu__dfile mf = {.path = path, .err = f->err, .errlen = f->errlen};
		rd r = {.mem = bytes, .len = e.usize};
		uint8_t magic[4];
		rc = rd_read(&r, magic, 4) == 4 ? load_npy(a, &r, &mf, magic)
						: hpu__data_fail(&mf, "truncated: not a .npy array");
	}
	free(bytes);
	fclose(fp);
	return rc;
}

int hpu_array_load(hpu_array *a, const char *path, const char *member, char *err, size_t errlen)
{
	hpu__dfile f = {.path = path ? path : "(null)", .err = err, .errlen = errlen};
	memset(a, 0, sizeof *a);
	if (!path)
		return hpu__data_fail(&f, "no file named");
	if (hpu__data_regular(&f))
		return HPU_EINVAL;
	rd r = {.gz = gzopen(path, "rb")};
	if (!r.gz)
		return hpu__data_open_fail(&f, errno);
	uint8_t m[4];
	size_t got = rd_read(&r, m, 4);
	struct stat st;
	r.direct = gzdirect(r.gz);
	r.fsize = stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
	int rc, npz = got == 4 && (!memcmp(m, "PK\3\4", 4) || !memcmp(m, "PK\5\6", 4));
	if (got < 4 && !r.direct) /* the file's bytes were not the count */
		rc = rd_short(&r, &f, "truncated: its gzip data ends after %zu bytes (of %llu "
			      "compressed: cut short?), too short for any format", got,
			      (unsigned long long)r.fsize);
	else if (got < 4)
		rc = rd_short(&r, &f, "truncated: %zu bytes, too short for any format", got);
	else if (npz)
		rc = HPU_OK;
	else if (member)
		rc = hpu__data_fail(&f, "is not an .npz archive, but an array '%s' in it was asked for", member);
	else if (!memcmp(m, "\x93NUM", 4))
		rc = load_npy(a, &r, &f, m);
	else if (le32(m) == LLMC_GPT2_MAGIC || le32(m) == LLMC_LLAMA3_MAGIC)
		rc = load_tokens(a, &r, &f, m);
	else if (!m[0] && !m[1])
		rc = load_idx(a, &r, &f, m);
	else
		rc = hpu__data_fail(&f, "bad magic %02x %02x %02x %02x: not an IDX, .npy, .npz or llm.c token file (a CSV file loads with hpu_csv_load)",
				    m[0], m[1], m[2], m[3]);
	gzclose(r.gz);
	if (!rc && npz)
		rc = load_npz(a, &f, member);
	if (rc)
		hpu_array_free(a);
	return rc;
}
