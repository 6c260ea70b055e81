/* <hpu/data.h> (worker/hpu/data_*.c): each format's good file loads with
 * its shape, type and values; a truncated, mis-typed or mis-shaped one is
 * refused with a sentence naming the file and the problem; arrays become
 * a dataset split whose fetch gives the values. The files are written
 * byte by byte here, as numpy, llm.c and the IDX tools write them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include <hpu/data.h>

#include "tests/unit/tmp_testlib.h"
#include "worker/hpu/dataio.h" /* hpu__data_prefetch */
#include "worker/hpu/model.h" /* worker/hpu: a builder without the runtime */

static char err[1024];
static hpu_array a, y;

static int reset(void **state)
{
	(void)state;
	hpu_array_free(&a);
	hpu_array_free(&y);
	err[0] = 0;
	return 0;
}

static const char *put(const char *name, const void *data, size_t n)
{
	const char *path = tmp_at(name);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, n, f), n);
	fclose(f);
	return path;
}

static const char *put_str(const char *name, const char *text)
{
	return put(name, text, strlen(text));
}

/* The load fails, naming path and saying `what`. */
static void refused(int rc, const char *path, const char *what)
{
	assert_int_not_equal(rc, HPU_OK);
	if (!strstr(err, path) || !strstr(err, what))
		fail_msg("message \"%s\" should name %s and say \"%s\"", err, path, what);
	assert_null(a.data);
}

static void be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

static void le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

static void le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}

/* ---- IDX ---- */

/* An unsigned-byte IDX file of shape [3, 2, 2] holding 0 .. 11. */
static size_t idx_u8(uint8_t *buf)
{
	uint8_t h[4] = {0, 0, 0x08, 3};
	memcpy(buf, h, 4);
	be32(buf + 4, 3), be32(buf + 8, 2), be32(buf + 12, 2);
	for (int i = 0; i < 12; i++)
		buf[16 + i] = (uint8_t)i;
	return 28;
}

static void test_idx_good(void **state)
{
	(void)state;
	uint8_t buf[64];
	size_t n = idx_u8(buf);
	assert_int_equal(hpu_array_load(&a, put("u8.idx", buf, n), NULL, err, sizeof err), HPU_OK);
	assert_int_equal(a.type, HPU_DATA_U8);
	assert_int_equal(a.ndim, 3);
	assert_int_equal(a.shape[0], 3);
	assert_int_equal(a.shape[2], 2);
	assert_int_equal(a.count, 3);
	assert_int_equal(a.row_numel, 4);
	assert_int_equal(((uint8_t *)a.data)[11], 11);
	hpu_array_free(&a);

	/* gzipped, as the MNIST family ships */
	gzFile gz = gzopen(tmp_at("u8.idx.gz"), "wb");
	assert_int_equal(gzwrite(gz, buf, (unsigned)n), (int)n);
	gzclose(gz);
	assert_int_equal(hpu_array_load(&a, tmp_at("u8.idx.gz"), NULL, err, sizeof err), HPU_OK);
	assert_int_equal(((uint8_t *)a.data)[7], 7);
	hpu_array_free(&a);

	/* float, big-endian: [2] of 1.5, -2 */
	uint8_t f[16] = {0, 0, 0x0D, 1};
	be32(f + 4, 2);
	float v[2] = {1.5f, -2.0f};
	uint32_t bits;
	memcpy(&bits, &v[0], 4), be32(f + 8, bits);
	memcpy(&bits, &v[1], 4), be32(f + 12, bits);
	assert_int_equal(hpu_array_load(&a, put("f32.idx", f, 16), NULL, err, sizeof err), HPU_OK);
	assert_int_equal(a.type, HPU_DATA_F32);
	assert_true(((float *)a.data)[0] == 1.5f && ((float *)a.data)[1] == -2.0f);
}

static void test_idx_refused(void **state)
{
	(void)state;
	uint8_t buf[64];
	size_t n = idx_u8(buf);
	const char *p = put("cut.idx", buf, n - 1);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "truncated");
	buf[2] = 0x0A;
	p = put("type.idx", buf, n);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "bad IDX type 0x0a");
	buf[2] = 0x08;
	buf[n] = 99;
	p = put("long.idx", buf, n + 1);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p,
		"mis-shaped: more data follows than the header's [3, 2, 2] of u8 (12 bytes) holds");
	p = tmp_at("missing.idx");
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "cannot open");
	assert_non_null(strstr(err, "No such file or directory"));
	p = put_str("junk.idx", "hello");
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "bad magic");
	/* a directory is said to be one (it was "truncated: 0 bytes"); a
	 * FIFO is refused (opening one nobody writes waited for ever), by
	 * the CSV reader too */
	p = tmp_at("adir");
	assert_int_equal(mkdir(p, 0700), 0);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "cannot open");
	assert_non_null(strstr(err, "Is a directory"));
	refused(hpu_csv_load(&a, &y, p, NULL, NULL, err, sizeof err), p, "Is a directory");
	rmdir(p);
	p = tmp_at("fifo");
	assert_int_equal(mkfifo(p, 0600), 0);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p,
		"is not a regular file but a FIFO (pipe): every worker reads the file itself");
	refused(hpu_csv_load(&a, &y, p, NULL, NULL, err, sizeof err), p, "a FIFO (pipe)");
	unlink(p);
}

/* A damaged header's counts: a shape past 1 TiB is blamed whole (it was
 * "dimension 2 is 1000", where the product passed the bound, and not
 * the dimension that was wrong); a shape the file cannot hold is
 * "truncated" before any memory is reserved for it (a header claiming
 * 10^12 bytes was "out of memory for 1000000000000 elements", or, where
 * memory is overcommitted, reserved it first), gzipped or not. */
static void test_idx_counts(void **state)
{
	(void)state;
	uint8_t buf[64];
	size_t n = idx_u8(buf);
	be32(buf + 4, 100000), be32(buf + 8, 100000), be32(buf + 12, 1000);
	const char *p = put("huge.idx", buf, n);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p,
		"a shape of [100000, 100000, 1000] of u8 is past 1 TiB: implausible");
	be32(buf + 4, 1000000), be32(buf + 8, 1000), be32(buf + 12, 1000);
	p = put("tera.idx", buf, n);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p,
		"truncated: the header says [1000000, 1000, 1000] of u8, 1000000000000 bytes of data, but only 12 follow");
	gzFile gz = gzopen(tmp_at("tera.idx.gz"), "wb");
	assert_int_equal(gzwrite(gz, buf, (unsigned)n), (int)n);
	gzclose(gz);
	p = tmp_at("tera.idx.gz");
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p,
		"truncated: the header says [1000000, 1000, 1000] of u8, 1000000000000 bytes of data, but the file's ");
	assert_non_null(strstr(err, "gzipped bytes cannot inflate to that many"));
	/* a gzipped file may hold far more than its size: 4 MB of zeros */
	size_t big = (size_t)4 << 20;
	uint8_t *zeros = calloc(1, big + 16);
	assert_non_null(zeros);
	uint8_t h[16] = {0, 0, 0x08, 3};
	memcpy(zeros, h, 4);
	be32(zeros + 4, 1024), be32(zeros + 8, 64), be32(zeros + 12, 64);
	gz = gzopen(tmp_at("zeros.idx.gz"), "wb9");
	assert_int_equal(gzwrite(gz, zeros, (unsigned)(big + 16)), (int)(big + 16));
	gzclose(gz);
	free(zeros);
	struct stat st;
	assert_int_equal(stat(tmp_at("zeros.idx.gz"), &st), 0);
	assert_true((size_t)st.st_size * 100 < big);
	assert_int_equal(hpu_array_load(&a, tmp_at("zeros.idx.gz"), NULL, err, sizeof err), HPU_OK);
	assert_int_equal(a.count, 1024);
	assert_int_equal(a.row_numel, 64 * 64);
}

/* ---- gzip ---- */

/* Writes data to name gzipped, as `members` gzip members (split evenly),
 * each one stored deflate block (at most 65535 bytes), the first with
 * its CRC-32 spoilt, as a bit flipped on disk leaves it; returns the
 * path. Stored blocks put every byte where the test needs it. */
static const char *put_gz_badcrc(const char *name, const uint8_t *data, size_t n, int members)
{
	const char *path = tmp_at(name);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	for (int m = 0; m < members; m++) {
		size_t from = n * (size_t)m / (size_t)members, len = n * (size_t)(m + 1) / (size_t)members - from;
		assert_true(len <= 65535);
		uint8_t h[15] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff, 1}, t[8];
		le16(h + 11, (uint16_t)len), le16(h + 13, (uint16_t)~len);
		le32(t, (uint32_t)crc32(0, data + from, (uInt)len) ^ (m == 0));
		le32(t + 4, (uint32_t)len);
		assert_int_equal(fwrite(h, 1, sizeof h, f), sizeof h);
		assert_int_equal(fwrite(data + from, 1, len, f), len);
		assert_int_equal(fwrite(t, 1, sizeof t, f), sizeof t);
	}
	fclose(f);
	return path;
}

/* A gzipped file whose CRC-32 does not match is refused as corrupt
 * wherever zlib finds it: in the first four bytes' read (a small file
 * is inflated whole by it; it was "truncated: 0 bytes"), in the header's
 * read, or in the read after the data that checks nothing follows (the
 * data loaded and training ran on it). */
static void test_gz_corrupt(void **state)
{
	(void)state;
	uint8_t buf[64];
	size_t n = idx_u8(buf);
	const char *p = put_gz_badcrc("small.idx.gz", buf, n, 1);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "corrupt gzip data");

	/* IDX u8 [65513] in a file of 8 * 8192 + 8 bytes: zlib reads 8 KiB at
	 * a time, so the data is inflated by the time the eighth read is used
	 * up, and the ninth, the trailer alone, is read only by the read
	 * after the data */
	size_t big = 8 * 8192 - 15;
	uint8_t *d = malloc(big);
	assert_non_null(d);
	memcpy(d, (uint8_t[]){0, 0, 0x08, 1}, 4);
	be32(d + 4, (uint32_t)(big - 8));
	for (size_t i = 8; i < big; i++)
		d[i] = (uint8_t)(i * 7);
	p = put_gz_badcrc("big.idx.gz", d, big, 1);
	struct stat st;
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_size, 8 * 8192 + 8);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "corrupt gzip data");
	free(d);

	/* a .npy of a 40000-byte header in two gzip members, the first's CRC
	 * spoilt: the first read inflates 16 KiB of it, the header's read
	 * reaches the first member's end */
	size_t hn = 40000;
	uint8_t *h = malloc(hn + 4);
	assert_non_null(h);
	const char *dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }";
	memcpy(h, "\x93NUMPY\x02\x00", 8);
	le32(h + 8, (uint32_t)(hn - 12));
	memset(h + 12, ' ', hn - 12);
	memcpy(h + 12, dict, strlen(dict));
	h[hn - 1] = '\n';
	memset(h + hn, 7, 4);
	p = put_gz_badcrc("hdr.npy.gz", h, hn + 4, 2);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "corrupt gzip data");
	free(h);

	/* a gzipped file cut within its first deflate block: its gzip data
	 * is said to end early (it said "0 bytes", of a 40-byte file) */
	p = tmp_at("cut.idx.gz");
	gzFile gz = gzopen(p, "wb9");
	for (int i = 0; i < 64; i++)
		assert_int_equal(gzwrite(gz, buf, (unsigned)n), (int)n);
	gzclose(gz);
	assert_int_equal(truncate(p, 10), 0); /* its header alone */
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p,
		"truncated: its gzip data ends after 0 bytes (of 10 compressed: cut short?), too "
		"short for any format");
}

/* ---- .npy ---- */

/* A .npy file (format `major`) with the header dict and data. */
static size_t npy(uint8_t *buf, int major, const char *dict, const void *data, size_t n)
{
	size_t pre = major == 1 ? 10 : 12, len = strlen(dict) + 1;
	len += (64 - (pre + len) % 64) % 64;
	memcpy(buf, "\x93NUMPY", 6);
	buf[6] = (uint8_t)major, buf[7] = 0;
	if (major == 1)
		le16(buf + 8, (uint16_t)len);
	else
		le32(buf + 8, (uint32_t)len);
	memset(buf + pre, ' ', len);
	memcpy(buf + pre, dict, strlen(dict));
	buf[pre + len - 1] = '\n';
	memcpy(buf + pre + len, data, n);
	return pre + len + n;
}

static void test_npy_good(void **state)
{
	(void)state;
	uint8_t buf[512];
	float f[6] = {0, 1, 2, 3, 4, 5.5f};
	size_t n = npy(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f, sizeof f);
	assert_int_equal(hpu_array_load(&a, put("f.npy", buf, n), NULL, err, sizeof err), HPU_OK);
	assert_int_equal(a.type, HPU_DATA_F32);
	assert_int_equal(a.ndim, 2);
	assert_int_equal(a.count, 2);
	assert_int_equal(a.row_numel, 3);
	assert_true(((float *)a.data)[5] == 5.5f);
	hpu_array_free(&a);

	int64_t l[4] = {-1, 2, 1LL << 40, 7};
	n = npy(buf, 2, "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", l, sizeof l);
	assert_int_equal(hpu_array_load(&a, put("l.npy", buf, n), NULL, err, sizeof err), HPU_OK);
	assert_int_equal(a.type, HPU_DATA_I64);
	assert_int_equal(a.ndim, 1);
	assert_true(((int64_t *)a.data)[2] == 1LL << 40 && ((int64_t *)a.data)[0] == -1);
	hpu_array_free(&a);

	uint8_t be[4] = {0x01, 0x02, 0xff, 0xfe}; /* '>u2': 258, 65534 */
	n = npy(buf, 1, "{'descr': '>u2', 'fortran_order': False, 'shape': (2,), }", be, 4);
	assert_int_equal(hpu_array_load(&a, put("be.npy", buf, n), NULL, err, sizeof err), HPU_OK);
	assert_int_equal(a.type, HPU_DATA_U16);
	assert_int_equal(((uint16_t *)a.data)[0], 258);
	assert_int_equal(((uint16_t *)a.data)[1], 65534);
}

static void test_npy_refused(void **state)
{
	(void)state;
	uint8_t buf[512];
	float f[6] = {0};
	const char *d = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
	size_t n = npy(buf, 1, d, f, sizeof f);
	const char *p = put("cut.npy", buf, n - 2);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "truncated");
	memset(buf + n, 0, 4); /* the shape says 6 floats, 7 follow */
	p = put("long.npy", buf, n + 4);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "mis-shaped");
	n = npy(buf, 1, "{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", f, sizeof f);
	p = put("c8.npy", buf, n);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "mis-typed: element type '<c8'");
	n = npy(buf, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f, sizeof f);
	p = put("fortran.npy", buf, n);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "fortran_order is True");
	n = npy(buf, 1, d, f, sizeof f);
	p = put("named.npy", buf, n);
	refused(hpu_array_load(&a, p, "x", err, sizeof err), p, "is not an .npz archive");
}

/* ---- .npz ---- */

typedef struct zmember {
	const char *name;
	const uint8_t *data;
	size_t len;
	int deflate;
} zmember;

/* A zip archive of the members, as numpy's savez / savez_compressed. */
static size_t zip(uint8_t *buf, const zmember *m, int n)
{
	uint8_t cd[1024];
	size_t pos = 0, cpos = 0;
	for (int i = 0; i < n; i++) {
		uint8_t comp[2048];
		uLongf clen = sizeof comp;
		const uint8_t *body = m[i].data;
		if (m[i].deflate) {
			z_stream z = {0};
			assert_int_equal(deflateInit2(&z, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
			z.next_in = (Bytef *)m[i].data, z.avail_in = (uInt)m[i].len;
			z.next_out = comp, z.avail_out = sizeof comp;
			assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
			clen = z.total_out;
			deflateEnd(&z);
			body = comp;
		} else {
			clen = m[i].len;
		}
		uint32_t crc = (uint32_t)crc32(0, m[i].data, (uInt)m[i].len);
		size_t nl = strlen(m[i].name);
		uint8_t *l = buf + pos;
		memset(l, 0, 30);
		memcpy(l, "PK\3\4", 4);
		le16(l + 8, m[i].deflate ? 8 : 0);
		le16(l + 26, (uint16_t)nl);
		le16(l + 28, 4); /* an extra field the reader must skip */
		memcpy(l + 30, m[i].name, nl);
		memset(l + 30 + nl, 0, 4);
		memcpy(l + 34 + nl, body, clen);
		uint8_t *c = cd + cpos;
		memset(c, 0, 46);
		memcpy(c, "PK\1\2", 4);
		le16(c + 10, m[i].deflate ? 8 : 0);
		le32(c + 16, crc);
		le32(c + 20, (uint32_t)clen);
		le32(c + 24, (uint32_t)m[i].len);
		le16(c + 28, (uint16_t)nl);
		le32(c + 42, (uint32_t)pos);
		memcpy(c + 46, m[i].name, nl);
		cpos += 46 + nl;
		pos += 34 + nl + clen;
	}
	memcpy(buf + pos, cd, cpos);
	uint8_t *e = buf + pos + cpos;
	memset(e, 0, 22);
	memcpy(e, "PK\5\6", 4);
	le16(e + 8, (uint16_t)n), le16(e + 10, (uint16_t)n);
	le32(e + 12, (uint32_t)cpos), le32(e + 16, (uint32_t)pos);
	return pos + cpos + 22;
}

static void test_npz_good(void **state)
{
	(void)state;
	uint8_t x[256], l[256], buf[2048];
	float f[4] = {1, 2, 3, 4};
	int32_t lab[2] = {7, 9};
	zmember m[2] = {
		{"x.npy", x, npy(x, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", f, sizeof f), 0},
		{"y.npy", l, npy(l, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", lab, sizeof lab), 1},
	};
	const char *p = put("xy.npz", buf, zip(buf, m, 2));
	assert_int_equal(hpu_array_load(&a, p, "x", err, sizeof err), HPU_OK);
	assert_int_equal(a.type, HPU_DATA_F32);
	assert_int_equal(a.count, 2);
	assert_true(((float *)a.data)[3] == 4.0f);
	assert_int_equal(hpu_array_load(&y, p, "y", err, sizeof err), HPU_OK); /* deflated */
	assert_int_equal(y.type, HPU_DATA_I32);
	assert_int_equal(((int32_t *)y.data)[1], 9);
	hpu_array_free(&a);
	p = put("one.npz", buf, zip(buf, m + 1, 1));
	assert_int_equal(hpu_array_load(&a, p, NULL, err, sizeof err), HPU_OK);
	assert_int_equal(((int32_t *)a.data)[0], 7);
}

static void test_npz_refused(void **state)
{
	(void)state;
	uint8_t x[256], c8[256], buf[2048];
	float f[4] = {1, 2, 3, 4};
	zmember m[2] = {
		{"x.npy", x, npy(x, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", f, sizeof f), 1},
		{"c.npy", c8, npy(c8, 1, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", f, sizeof f), 0},
	};
	size_t n = zip(buf, m, 2);
	const char *p = put("xc.npz", buf, n);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "holds 2 arrays (x.npy, c.npy)");
	refused(hpu_array_load(&a, p, "z", err, sizeof err), p, "has no array 'z'");
	refused(hpu_array_load(&a, p, "c", err, sizeof err), p, "(member c.npy): mis-typed");
	p = put("cut.npz", buf, n - 10);
	refused(hpu_array_load(&a, p, "x", err, sizeof err), p, "truncated");
	m[0].len -= 4; /* the shape says 4 floats, 3 follow */
	p = put("short.npz", buf, zip(buf, m, 1));
	refused(hpu_array_load(&a, p, "x", err, sizeof err), p, "(member x.npy): truncated");
	m[0].len += 8;
	p = put("long.npz", buf, zip(buf, m, 1));
	refused(hpu_array_load(&a, p, "x", err, sizeof err), p, "(member x.npy): mis-shaped");
}

/* ---- llm.c tokens ---- */

static size_t tokens(uint8_t *buf, uint32_t magic, uint32_t version, int32_t ntok, int have)
{
	memset(buf, 0, 1024);
	le32(buf, magic), le32(buf + 4, version), le32(buf + 8, (uint32_t)ntok);
	for (int i = 0; i < have; i++)
		le16(buf + 1024 + 2 * i, (uint16_t)(100 + i));
	return 1024 + 2 * (size_t)have;
}

static void test_tokens_good(void **state)
{
	(void)state;
	uint8_t buf[2048];
	const char *p = put("tok.bin", buf, tokens(buf, 20240520, 1, 9, 9));
	assert_int_equal(hpu_array_load(&a, p, NULL, err, sizeof err), HPU_OK);
	assert_int_equal(a.type, HPU_DATA_U16);
	assert_int_equal(a.ndim, 1);
	assert_int_equal(a.count, 9);
	assert_int_equal(((uint16_t *)a.data)[8], 108);
}

static void test_tokens_refused(void **state)
{
	(void)state;
	uint8_t buf[2048];
	const char *p = put("cut.bin", buf, tokens(buf, 20240520, 1, 9, 8));
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "truncated: the header says [9] of u16");
	p = put("hdr.bin", buf, 600);
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "truncated: an llm.c token file");
	p = put("v2.bin", buf, tokens(buf, 20240520, 2, 9, 9));
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "of version 2");
	p = put("long.bin", buf, tokens(buf, 20240520, 1, 8, 9));
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p, "mis-shaped");
	/* LLaMA-3's u32 tokens, 2^31 - 1 of them claimed: 8 GiB were reserved
	 * before the read found 16 bytes */
	p = put("llama.bin", buf, tokens(buf, 20240801, 7, 0x7fffffff, 8));
	refused(hpu_array_load(&a, p, NULL, err, sizeof err), p,
		"truncated: the header says [2147483647] of u32, 8589934588 bytes of data, but only 16 follow");
}

/* ---- CSV ---- */

static void test_csv_good(void **state)
{
	(void)state;
	const char *p = put_str("t.csv", "a, \"b\",label,c\r\n1,2,0,-1\n\n3.5,4e1,2,0.25\n");
	assert_int_equal(hpu_csv_load(&a, &y, p, NULL, "label", err, sizeof err), HPU_OK);
	assert_int_equal(a.type, HPU_DATA_F32);
	assert_int_equal(a.count, 2);
	assert_int_equal(a.row_numel, 3);
	float *x = a.data;
	assert_true(x[0] == 1 && x[1] == 2 && x[2] == -1 && x[3] == 3.5f && x[4] == 40 && x[5] == 0.25f);
	assert_int_equal(y.type, HPU_DATA_I32);
	assert_int_equal(((int32_t *)y.data)[1], 2);
	hpu_array_free(&a);
	hpu_array_free(&y);
	/* chosen features, in the order named */
	assert_int_equal(hpu_csv_load(&a, &y, p, "c,a", "b", err, sizeof err), HPU_OK);
	x = a.data;
	assert_int_equal(a.row_numel, 2);
	assert_true(x[0] == -1 && x[1] == 1 && x[2] == 0.25f && x[3] == 3.5f);
	assert_int_equal(y.type, HPU_DATA_I32);
	hpu_array_free(&a);
	hpu_array_free(&y);
	p = put_str("r.csv", "x,t\n1,0.5\n2,1\n");
	assert_int_equal(hpu_csv_load(&a, &y, p, NULL, "t", err, sizeof err), HPU_OK);
	assert_int_equal(y.type, HPU_DATA_F32);
	assert_true(((float *)y.data)[0] == 0.5f);
}

static void test_csv_refused(void **state)
{
	(void)state;
	const char *p = put_str("fields.csv", "a,b,label\n1,2,0\n3,4\n");
	refused(hpu_csv_load(&a, &y, p, NULL, "label", err, sizeof err), p,
		"line 3 has 2 fields, the header has 3");
	p = put_str("nan.csv", "a,b,label\n1,x,0\n");
	refused(hpu_csv_load(&a, &y, p, NULL, "label", err, sizeof err), p,
		"line 2: column 'b' is 'x', not a number");
	p = put_str("nolabel.csv", "a,b\n1,2\n");
	refused(hpu_csv_load(&a, &y, p, NULL, "label", err, sizeof err), p,
		"has no label column 'label'");
	refused(hpu_csv_load(&a, &y, p, "a,z", NULL, err, sizeof err), p, "has no column 'z'");
	p = put_str("empty.csv", "a,b\n");
	refused(hpu_csv_load(&a, &y, p, NULL, NULL, err, sizeof err), p, "no rows");
}

/* ---- a split from arrays ---- */

static void test_declare(void **state)
{
	(void)state;
	uint8_t buf[2048];
	hpu_array img, lab, tok;
	size_t n = idx_u8(buf);
	assert_int_equal(hpu_array_load(&img, put("img.idx", buf, n), NULL, err, sizeof err), HPU_OK);
	uint8_t l[12] = {0, 0, 0x08, 1, 0, 0, 0, 3, 2, 0, 9};
	assert_int_equal(hpu_array_load(&lab, put("lab.idx", l, 11), NULL, err, sizeof err), HPU_OK);
	assert_int_equal(hpu_array_load(&tok, put("t.bin", buf, tokens(buf, 20240520, 1, 9, 9)), NULL,
					err, sizeof err), HPU_OK);
	hpu_builder *b = hpu__model_new(0, 1, 8);
	assert_non_null(b);
	hpu_data_split s = {.nfields = 2};
	s.fields[0] = (hpu_data_field){.name = "image", .array = &img, .dtype = HPU_F32,
				       .scale = 0.5f, .shift = -1, .reshape = 1, .ndim = 1, .shape = {4}};
	s.fields[1] = (hpu_data_field){.name = "label", .array = &lab, .dtype = HPU_I32, .classes = 3};
	/* label 9 is no class of 3: refused when declared, naming the row
	 * (it failed only the fetch of sample 2, saying no more) */
	assert_int_not_equal(hpu_data_declare(b, HPU_SPLIT_TRAIN, &s), HPU_OK);
	assert_non_null(strstr(b->err, "data field 'label' (training split): row 2 holds 9, not a "
				       "class: its classes are 0 to 2"));
	hpu__model_destroy(&b);
	b = hpu__model_new(0, 1, 8);
	assert_non_null(b);
	s.fields[1].classes = 10;
	assert_int_equal(hpu_data_declare(b, HPU_SPLIT_TRAIN, &s), HPU_OK);
	const hpu_dataset *d = &b->data[HPU_SPLIT_TRAIN];
	assert_int_equal(d->size, 3);
	assert_int_equal(d->fields[0].ndim, 1);
	assert_int_equal(d->fields[0].shape[0], 4);
	assert_int_equal(d->fields[1].ndim, 0);
	float x[4];
	int32_t c;
	void *out[2] = {x, &c};
	assert_int_equal(d->fetch(d->user, 1, out), 0);
	assert_true(x[0] == 1.0f && x[3] == 2.5f); /* pixels 4 .. 7 * 0.5 - 1 */
	assert_int_equal(c, 0);
	s.fields[1].classes = 3; /* changed after: the fetch checks too */
	assert_int_not_equal(d->fetch(d->user, 2, out), 0);
	s.fields[1].classes = 10;
	assert_int_equal(d->fetch(d->user, 2, out), 0);
	assert_int_equal(c, 9);

	/* a long row (the vectorized conversion, and its tail past a
	 * multiple of 16): each value the scalar product then sum */
	hpu__model_destroy(&b);
	b = hpu__model_new(0, 1, 8);
	assert_non_null(b);
	enum { ROW = 1001 };
	static uint8_t px[3 * ROW];
	for (size_t k = 0; k < sizeof px; k++)
		px[k] = (uint8_t)(k * 37 + 11);
	hpu_array pa = {.type = HPU_DATA_U8, .ndim = 2, .shape = {3, ROW}, .count = 3,
			.row_numel = ROW, .data = px};
	hpu_data_split ps = {.nfields = 1};
	const float sc = 1.0f / (255.0f * 0.3530f), sh = -0.2860f / 0.3530f;
	ps.fields[0] = (hpu_data_field){.name = "image", .array = &pa, .dtype = HPU_F32,
					.scale = sc, .shift = sh};
	assert_int_equal(hpu_data_declare(b, HPU_SPLIT_TRAIN, &ps), HPU_OK);
	d = &b->data[HPU_SPLIT_TRAIN];
	static float row[ROW];
	void *pout[1] = {row};
	hpu__data_prefetch(d, 2);
	hpu__data_prefetch(d, 3); /* past the end: nothing */
	assert_int_equal(d->fetch(d->user, 2, pout), 0);
	for (size_t k = 0; k < ROW; k++) {
		volatile float prod = (float)px[2 * ROW + k] * sc; /* rounded, then the sum */
		assert_true(row[k] == prod + sh);
	}
	/* a model's own fetch: its layout unknown, nothing read (user NULL) */
	hpu_dataset own = {.size = 1, .nfields = 1, .fetch = NULL, .user = NULL};
	hpu__data_prefetch(&own, 0);

	/* an f32 array as an HPU_I32 field: whole numbers only */
	hpu__model_destroy(&b);
	b = hpu__model_new(0, 1, 8);
	assert_non_null(b);
	float fl[3] = {1, 2.5f, 0};
	hpu_array fa = {.type = HPU_DATA_F32, .ndim = 1, .shape = {3}, .count = 3,
			.row_numel = 1, .data = fl};
	hpu_data_split fs = {.nfields = 1};
	fs.fields[0] = (hpu_data_field){.name = "label", .array = &fa, .dtype = HPU_I32};
	assert_int_not_equal(hpu_data_declare(b, HPU_SPLIT_TEST, &fs), HPU_OK);
	assert_non_null(strstr(b->err, "data field 'label' (test split): row 1 holds 2.5, not a "
				       "whole number in int32's range"));

	/* windows of a token file: inputs and next-token targets (a new
	 * builder: a test split must have the training split's fields) */
	hpu__model_destroy(&b);
	b = hpu__model_new(0, 1, 8);
	assert_non_null(b);
	hpu_data_split w = {.nfields = 2};
	w.fields[0] = (hpu_data_field){.name = "x", .array = &tok, .dtype = HPU_I32, .window = 4};
	w.fields[1] = (hpu_data_field){.name = "y", .array = &tok, .dtype = HPU_I32, .window = 4, .offset = 1};
	assert_int_equal(hpu_data_declare(b, HPU_SPLIT_TRAIN, &w), HPU_OK);
	d = &b->data[HPU_SPLIT_TRAIN];
	assert_int_equal(d->size, 2);
	int32_t xi[4], yi[4];
	void *o2[2] = {xi, yi};
	assert_int_equal(d->fetch(d->user, 1, o2), 0);
	assert_true(xi[0] == 104 && xi[3] == 107 && yi[0] == 105 && yi[3] == 108);

	/* fields of different lengths are refused, naming both */
	hpu_data_split bad = {.nfields = 2};
	bad.fields[0] = (hpu_data_field){.name = "image", .array = &img, .dtype = HPU_F32};
	bad.fields[1] = (hpu_data_field){.name = "t", .array = &tok, .dtype = HPU_I32};
	assert_int_not_equal(hpu_data_declare(b, HPU_SPLIT_TEST, &bad), HPU_OK);
	assert_non_null(strstr(b->err, "data fields 'image' (3 rows) and 't' (9 rows) differ"));
	/* a split of no sample names the field that gives none (it named
	 * the first field, which gave 3) */
	hpu__model_destroy(&b);
	b = hpu__model_new(0, 1, 8);
	assert_non_null(b);
	hpu_data_split none = {.nfields = 2};
	none.fields[0] = (hpu_data_field){.name = "image", .array = &img, .dtype = HPU_F32};
	none.fields[1] = (hpu_data_field){.name = "t", .array = &tok, .dtype = HPU_I32, .window = 10};
	assert_int_not_equal(hpu_data_declare(b, HPU_SPLIT_TRAIN, &none), HPU_OK);
	if (!strstr(b->err, "data field 't' (training split): the array gives no samples"))
		fail_msg("%s", b->err);
	hpu__model_destroy(&b);
	hpu_array_free(&img);
	hpu_array_free(&lab);
	hpu_array_free(&tok);
}

static int no_fetch(void *user, size_t i, void *const *out)
{
	(void)user, (void)i, (void)out;
	return -1;
}

/* A dataset of more samples than 32 bits number is refused, naming it
 * and the limit: the sampler's permutation is of uint32_t, and one of
 * 2^32 + 5 samples trained on samples 0 to 4 only. The size alone is
 * declared: nothing is fetched or allocated. */
static void test_dataset_limit(void **state)
{
	(void)state;
	hpu_builder *b = hpu__model_new(0, 1, 64);
	assert_non_null(b);
	hpu_dataset ds = {.size = (size_t)UINT32_MAX + 5, .nfields = 1, .fetch = no_fetch,
			  .fields = {{"x", HPU_F32, 1, {4}}}};
	assert_int_not_equal(hpu_dataset_set(b, HPU_SPLIT_TRAIN, &ds), HPU_OK);
	if (!strstr(b->err, "training dataset: 4294967300 samples; at most 4294967295 are supported"))
		fail_msg("error \"%s\"", b->err);
	hpu__model_destroy(&b);
	b = hpu__model_new(0, 1, 64);
	ds.size = UINT32_MAX;
	assert_int_equal(hpu_dataset_set(b, HPU_SPLIT_TRAIN, &ds), HPU_OK);
	ds.size = (size_t)UINT32_MAX + 1;
	assert_int_not_equal(hpu_dataset_set(b, HPU_SPLIT_TEST, &ds), HPU_OK);
	if (!strstr(b->err, "test dataset: 4294967296 samples; at most 4294967295"))
		fail_msg("error \"%s\"", b->err);
	hpu__model_destroy(&b);
}

/* A test split whose field differs from training's names both sides'
 * dtype and shape (it named the fields only: "field 0 (x) differs from
 * the training dataset's (x)"). */
static void test_test_split_differs(void **state)
{
	(void)state;
	hpu_builder *b = hpu__model_new(0, 1, 64);
	assert_non_null(b);
	hpu_dataset tr = {.size = 8, .nfields = 1, .fetch = no_fetch,
			  .fields = {{"x", HPU_F32, 1, {3}}}};
	hpu_dataset te = {.size = 4, .nfields = 1, .fetch = no_fetch,
			  .fields = {{"x", HPU_F32, 1, {2}}}};
	assert_int_equal(hpu_dataset_set(b, HPU_SPLIT_TRAIN, &tr), HPU_OK);
	assert_int_not_equal(hpu_dataset_set(b, HPU_SPLIT_TEST, &te), HPU_OK);
	if (!strstr(b->err, "test dataset: field 0 (x f32 [2]) differs from the training dataset's "
			    "(x f32 [3]): the splits need the same fields, dtypes and shapes"))
		fail_msg("error \"%s\"", b->err);
	hpu__model_destroy(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_test_split_differs),
		cmocka_unit_test_teardown(test_idx_good, reset),
		cmocka_unit_test_teardown(test_idx_refused, reset),
		cmocka_unit_test_teardown(test_idx_counts, reset),
		cmocka_unit_test_teardown(test_gz_corrupt, reset),
		cmocka_unit_test_teardown(test_npy_good, reset),
		cmocka_unit_test_teardown(test_npy_refused, reset),
		cmocka_unit_test_teardown(test_npz_good, reset),
		cmocka_unit_test_teardown(test_npz_refused, reset),
		cmocka_unit_test_teardown(test_tokens_good, reset),
		cmocka_unit_test_teardown(test_tokens_refused, reset),
		cmocka_unit_test_teardown(test_csv_good, reset),
		cmocka_unit_test_teardown(test_csv_refused, reset),
		cmocka_unit_test_teardown(test_declare, reset),
		cmocka_unit_test(test_dataset_limit),
	};
	return cmocka_run_group_tests(tests, tmp_setup, tmp_teardown);
}
