/* Unit tests for the checkpoint format library (ckpt/), on small
 * checkpoints built here with the library's own writer and a manifest
 * assembled with hpu__ckpt_file_json, in a temporary directory:
 *
 * - hpu__ckpt_open accepts a good checkpoint and refuses, each with its own
 *   sentence, segments that overlap (across files and within one), leave
 *   a gap (inside, at the end), a file whose bytes do not match its
 *   segments, a parameter whose offset or numel do not follow from the
 *   shapes, a wrong format or version, a missing or non-JSON manifest;
 * - hpu__ckpt_read returns the right floats of every section for every
 *   range, also ranges across several segments and files;
 * - hpu__ckpt_verify catches a truncated, a lengthened, a changed and a
 *   missing file;
 * - the writer: commit renames with the right digest, abort leaves no
 *   temporary file, an unwritable path is named;
 * - the root: publish + keep prunes the oldest, never the new one, and
 *   `latest` names the new one; hpu__ckpt_candidates orders `latest` first
 *   then by step, descending, and ignores names that are not step-N;
 * - buffers: a manifest with a "buffers" object (hpu__ckpt_buffers_json)
 *   and its file opens, lists them and reads them back, range by range;
 *   one without has none; bad sizes, offsets, shapes, names, a sync or a
 *   file name are refused, each with its sentence; verify finds the
 *   buffers file truncated, lengthened, changed (digest mismatch) or
 *   missing, naming it;
 * - the manifest's own digest: sealed opens, keys reordered still opens,
 *   an edit in range is refused as altered, none at all is noted;
 * - owners: a shard, the directory or `latest` of a uid not trusted is
 *   refused naming it, its owner and the uids trusted; `latest` a link too;
 * - a shard that is a FIFO, a link or an 8 GiB sparse file, and a FIFO
 *   manifest, are refused at once naming what they are;
 * - stale partials: only this uid's unheld .step-N.partial directories go.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"

/* ---- the model: three parameters, 15 floats, three sections ---- */

#define NUMEL 15
#define NSEC 3
static const char *const sec_names[NSEC] = {"params", "exp_avg", "exp_avg_sq"};

/* The value of canonical float i of section s. */
static float value(int s, uint64_t i)
{
	return (float)(s * 1000) + (float)i + 0.25f;
}

/* Up to 4 files of up to 4 segments each. */
typedef struct layout {
	int nfiles;
	int nseg[4];
	hpu_ckpt_seg seg[4][4];
} layout;

/* f0: [0,4) [10,12); f1: [4,7) [12,15); f2: [7,10). */
static const layout good = {3, {2, 2, 1}, {{{0, 4}, {10, 2}}, {{4, 3}, {12, 3}}, {{7, 3}}}};

typedef void (*mutate_fn)(cJSON *m);

static char tmp_root[256];

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void rm_rf(const char *path)
{
	nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh directory under the test's temporary root. */
static const char *fresh(const char *name)
{
	static char path[4][512];
	static int k;
	char *p = path[k++ & 3];
	snprintf(p, sizeof path[0], "%s/%s", tmp_root, name);
	rm_rf(p);
	assert_int_equal(mkdir(p, 0755), 0);
	return p;
}

static cJSON *param_json(const char *name, const int *shape, int ndim, double offset,
			 double numel)
{
	cJSON *p = cJSON_CreateObject(), *s = cJSON_CreateArray();
	cJSON_AddStringToObject(p, "name", name);
	for (int d = 0; d < ndim; d++)
		cJSON_AddItemToArray(s, cJSON_CreateNumber(shape[d]));
	cJSON_AddItemToObject(p, "shape", s);
	cJSON_AddStringToObject(p, "dtype", "F32");
	cJSON_AddNumberToObject(p, "offset", offset);
	cJSON_AddNumberToObject(p, "numel", numel);
	return p;
}

/* Writes the shards of layout L into dir with the writer and the
 * manifest (after mutate, if given). */
static void build(const char *dir, const layout *L, mutate_fn mutate)
{
	char err[512], path[1024];
	cJSON *m = cJSON_CreateObject(), *files = cJSON_CreateArray();
	cJSON_AddStringToObject(m, "format", HPU_CKPT_FORMAT);
	cJSON_AddNumberToObject(m, "version", HPU_CKPT_VERSION);
	cJSON_AddStringToObject(m, "model", "test.so");
	cJSON_AddNumberToObject(m, "world_size", L->nfiles);
	cJSON_AddStringToObject(m, "strategy", "zero2");
	cJSON_AddStringToObject(m, "precision", "fp32");
	cJSON_AddStringToObject(m, "optimizer", "adamw");
	cJSON_AddNumberToObject(m, "step", 40);
	cJSON *params = cJSON_CreateArray();
	cJSON_AddItemToArray(params, param_json("a.weight", (int[]){2, 3}, 2, 0, 6));
	cJSON_AddItemToArray(params, param_json("a.bias", (int[]){4}, 1, 6, 4));
	cJSON_AddItemToArray(params, param_json("b.weight", (int[]){5, 1}, 2, 10, 5));
	cJSON_AddItemToObject(m, "parameters", params);
	cJSON *secs = cJSON_CreateArray();
	for (int s = 0; s < NSEC; s++)
		cJSON_AddItemToArray(secs, cJSON_CreateString(sec_names[s]));
	cJSON_AddItemToObject(m, "sections", secs);
	for (int f = 0; f < L->nfiles; f++) {
		hpu_ckpt_file hf = {.seg = (hpu_ckpt_seg *)L->seg[f], .nseg = (size_t)L->nseg[f]};
		hpu__ckpt_shard_name(f, L->nfiles, hf.name, sizeof hf.name);
		snprintf(path, sizeof path, "%s/%s", dir, hf.name);
		hpu_ckpt_writer w;
		assert_int_equal(hpu__ckpt_writer_open(&w, path, err, sizeof err), 0);
		for (int s = 0; s < NSEC; s++)
			for (int k = 0; k < L->nseg[f]; k++)
				for (uint64_t i = 0; i < L->seg[f][k].count; i++) {
					float v = value(s, L->seg[f][k].start + i);
					assert_int_equal(hpu__ckpt_writer_put(&w, &v, 4, err, sizeof err), 0);
				}
		hf.bytes = w.bytes;
		assert_int_equal(hpu__ckpt_writer_commit(&w, hf.sha256, err, sizeof err), 0);
		cJSON_AddItemToArray(files, hpu__ckpt_file_json(&hf));
	}
	cJSON_AddItemToObject(m, "files", files);
	if (mutate)
		mutate(m);
	char *text = cJSON_Print(m);
	snprintf(path, sizeof path, "%s/%s", dir, HPU_CKPT_MANIFEST);
	assert_int_equal(hpu__write_atomic(path, text, strlen(text), err, sizeof err), 0);
	free(text);
	cJSON_Delete(m);
}

/* Asserts that opening dir fails with a sentence holding every needle. */
static void expect_open_error(const char *dir, const char *const *needles)
{
	hpu_ckpt c;
	char err[1024] = "";
	int rc = hpu__ckpt_open(&c, dir, err, sizeof err);
	printf("  open %s -> \"%s\"\n", strrchr(dir, '/') + 1, err);
	hpu__ckpt_close(&c);
	assert_int_equal(rc, -1);
	for (size_t k = 0; needles[k]; k++)
		if (!strstr(err, needles[k]))
			fail_msg("error \"%s\" does not say \"%s\"", err, needles[k]);
}

#define EXPECT_OPEN_ERROR(dir, ...) expect_open_error(dir, (const char *const[]){__VA_ARGS__, NULL})

static void open_ok(hpu_ckpt *c, const char *dir)
{
	char err[1024] = "";
	if (hpu__ckpt_open(c, dir, err, sizeof err) < 0)
		fail_msg("hpu__ckpt_open(%s): %s", dir, err);
}

/* ---- opening ---- */

static void test_open_good(void **state)
{
	(void)state;
	const char *d = fresh("good");
	build(d, &good, NULL);
	hpu_ckpt c;
	open_ok(&c, d);
	assert_int_equal(c.world, 3);
	assert_int_equal(c.step, 40);
	assert_string_equal(c.strategy, "zero2");
	assert_string_equal(c.precision, "fp32");
	assert_string_equal(c.optimizer, "adamw");
	assert_int_equal(c.nparams, 3);
	assert_int_equal(c.numel, NUMEL);
	assert_int_equal(c.nsections, NSEC);
	assert_int_equal(c.nfiles, 3);
	assert_int_equal(hpu__ckpt_section(&c, "exp_avg_sq"), 2);
	assert_int_equal(hpu__ckpt_section(&c, "momentum_buffer"), -1);
	assert_int_equal(hpu__ckpt_param_find(&c, "a.bias"), 1);
	assert_int_equal(hpu__ckpt_param_find(&c, "c"), -1);
	assert_int_equal(c.params[2].ndim, 2);
	assert_int_equal(c.params[2].shape[0], 5);
	assert_int_equal(c.params[2].offset, 10);
	assert_int_equal(c.files[0].elems, 6);
	assert_int_equal(c.files[0].bytes, 6 * 4 * NSEC);
	assert_int_equal(c.files[1].nseg, 2);
	hpu__ckpt_close(&c);
	hpu__ckpt_close(&c); /* safe twice */
}

static void test_open_overlap(void **state)
{
	(void)state;
	/* f0 [0,5) and f1 [4,10): float 4 twice (each file's size is right) */
	const layout across = {2, {1, 2}, {{{0, 5}}, {{4, 6}, {10, 5}}}};
	const char *d = fresh("overlap");
	build(d, &across, NULL);
	EXPECT_OPEN_ERROR(d, "manifest.json", "hold twice", "floats 4-5");
	/* within one file: the second segment starts inside the first */
	const layout within = {1, {2}, {{{0, 10}, {8, 7}}}};
	d = fresh("overlap_within");
	build(d, &within, NULL);
	EXPECT_OPEN_ERROR(d, "rank-00000-of-00001.bin", "segments must be increasing");
}

static void test_open_gap(void **state)
{
	(void)state;
	const layout inside = {2, {1, 1}, {{{0, 4}}, {{5, 10}}}};
	const char *d = fresh("gap");
	build(d, &inside, NULL);
	EXPECT_OPEN_ERROR(d, "manifest.json", "miss floats 4-5");
	const layout end = {2, {1, 1}, {{{0, 4}}, {{4, 10}}}};
	d = fresh("gap_end");
	build(d, &end, NULL);
	EXPECT_OPEN_ERROR(d, "hold 14 floats, the parameters 15");
	const layout past = {1, {1}, {{{0, 16}}}};
	d = fresh("past_end");
	build(d, &past, NULL);
	EXPECT_OPEN_ERROR(d, "hold 16 floats, the parameters 15");
}

static void bytes_plus_4(cJSON *m)
{
	cJSON *f = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "files"), 1);
	double b = cJSON_GetObjectItem(f, "bytes")->valuedouble;
	cJSON_ReplaceItemInObject(f, "bytes", cJSON_CreateNumber(b + 4));
}

static void seg_shorter(cJSON *m)
{
	cJSON *f = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "files"), 2);
	cJSON *s = cJSON_GetArrayItem(cJSON_GetObjectItem(f, "segments"), 0);
	cJSON_ReplaceItemInArray(s, 1, cJSON_CreateNumber(2));
}

static void seg_fraction(cJSON *m)
{
	cJSON *f = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "files"), 2);
	cJSON *s = cJSON_GetArrayItem(cJSON_GetObjectItem(f, "segments"), 0);
	cJSON_ReplaceItemInArray(s, 0, cJSON_CreateNumber(1e30));
}

static void test_open_file_bytes(void **state)
{
	(void)state;
	const char *d = fresh("bytes");
	build(d, &good, bytes_plus_4);
	EXPECT_OPEN_ERROR(d, "rank-00001-of-00003.bin", "76 bytes listed, but its segments make 72");
	d = fresh("seg_shorter");
	build(d, &good, seg_shorter);
	EXPECT_OPEN_ERROR(d, "rank-00002-of-00003.bin", "36 bytes listed, but its segments make 24");
	d = fresh("seg_huge");
	build(d, &good, seg_fraction);
	EXPECT_OPEN_ERROR(d, "rank-00002-of-00003.bin", "whole numbers");
}

static void param_offset(cJSON *m)
{
	cJSON *p = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "parameters"), 1);
	cJSON_ReplaceItemInObject(p, "offset", cJSON_CreateNumber(7));
}

static void param_numel(cJSON *m)
{
	cJSON *p = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "parameters"), 0);
	cJSON_ReplaceItemInObject(p, "numel", cJSON_CreateNumber(5));
}

static void param_shape(cJSON *m)
{
	cJSON *p = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "parameters"), 2);
	cJSON_ReplaceItemInObject(p, "shape", cJSON_CreateIntArray((int[]){5, 2}, 2));
}

static void test_open_params(void **state)
{
	(void)state;
	const char *d = fresh("param_offset");
	build(d, &good, param_offset);
	EXPECT_OPEN_ERROR(d, "parameter a.bias", "offset 7", "expected offset 6",
			  "do not follow from the shapes");
	d = fresh("param_numel");
	build(d, &good, param_numel);
	EXPECT_OPEN_ERROR(d, "parameter a.weight", "numel 5", "do not follow from the shapes");
	d = fresh("param_shape");
	build(d, &good, param_shape);
	EXPECT_OPEN_ERROR(d, "parameter b.weight", "numel 5", "do not follow from the shapes");
}

static void bad_format(cJSON *m)
{
	cJSON_ReplaceItemInObject(m, "format", cJSON_CreateString("safetensors"));
}

static void bad_version(cJSON *m)
{
	cJSON_ReplaceItemInObject(m, "version", cJSON_CreateNumber(2));
}

static void no_files(cJSON *m)
{
	cJSON_DeleteItemFromObject(m, "files");
}

static void test_open_format(void **state)
{
	(void)state;
	const char *d = fresh("format");
	build(d, &good, bad_format);
	EXPECT_OPEN_ERROR(d, "manifest.json", "not a hputrain checkpoint manifest");
	d = fresh("version");
	build(d, &good, bad_version);
	EXPECT_OPEN_ERROR(d, "format version 2; this build reads version 1");
	d = fresh("nofiles");
	build(d, &good, no_files);
	EXPECT_OPEN_ERROR(d, "no \"files\"");
}

static void test_open_manifest_missing_or_not_json(void **state)
{
	(void)state;
	char err[256], path[1024];
	const char *d = fresh("missing");
	EXPECT_OPEN_ERROR(d, "cannot read the checkpoint manifest", "missing/manifest.json",
			  "No such file");
	d = fresh("notjson");
	build(d, &good, NULL);
	snprintf(path, sizeof path, "%s/manifest.json", d);
	const char *junk = "{\"format\": \"hputrain-checkpoint\", \"version\": 1,";
	assert_int_equal(hpu__write_atomic(path, junk, strlen(junk), err, sizeof err), 0);
	EXPECT_OPEN_ERROR(d, "notjson/manifest.json", "is not a JSON object (damaged?)");
	assert_int_equal(hpu__write_atomic(path, "[1, 2]", 6, err, sizeof err), 0);
	EXPECT_OPEN_ERROR(d, "is not a JSON object");
}

/* ---- reading ---- */

/* Every range [start, start + count) of every section against value(). */
static void check_all_ranges(hpu_ckpt *c)
{
	char err[512];
	float got[NUMEL];
	uint64_t before = c->bytes_read, expect_bytes = 0;
	for (int s = 0; s < NSEC; s++)
		for (uint64_t start = 0; start < NUMEL; start++)
			for (uint64_t count = 1; start + count <= NUMEL; count++) {
				memset(got, 0xff, sizeof got);
				if (hpu__ckpt_read(c, s, start, count, got, err, sizeof err) < 0)
					fail_msg("read %d [%llu, +%llu): %s", s,
						 (unsigned long long)start, (unsigned long long)count,
						 err);
				for (uint64_t i = 0; i < count; i++)
					if (got[i] != value(s, start + i))
						fail_msg("section %s float %llu: %g, want %g",
							 sec_names[s], (unsigned long long)(start + i),
							 got[i], value(s, start + i));
				expect_bytes += count * 4;
			}
	assert_int_equal(c->bytes_read - before, expect_bytes);
}

static void test_read_every_range(void **state)
{
	(void)state;
	const char *d = fresh("read");
	build(d, &good, NULL);
	hpu_ckpt c;
	open_ok(&c, d);
	check_all_ranges(&c);
	/* the whole of params, across all three files and five segments */
	float all[NUMEL];
	char err[512];
	assert_int_equal(hpu__ckpt_read(&c, 0, 0, NUMEL, all, err, sizeof err), 0);
	for (int i = 0; i < NUMEL; i++)
		assert_true(all[i] == value(0, (uint64_t)i));
	hpu__ckpt_close(&c);
	/* one segment per float, files in reverse order of the space */
	layout fine = {4, {4, 4, 4, 3}, {{{0, 1}, {4, 1}, {8, 1}, {12, 1}},
					 {{1, 1}, {5, 1}, {9, 1}, {13, 1}},
					 {{2, 1}, {6, 1}, {10, 1}, {14, 1}},
					 {{3, 1}, {7, 1}, {11, 1}}}};
	d = fresh("read_fine");
	build(d, &fine, NULL);
	open_ok(&c, d);
	check_all_ranges(&c);
	hpu__ckpt_close(&c);
	/* a single file */
	layout one = {1, {1}, {{{0, NUMEL}}}};
	d = fresh("read_one");
	build(d, &one, NULL);
	open_ok(&c, d);
	check_all_ranges(&c);
	hpu__ckpt_close(&c);
}

static void test_read_outside(void **state)
{
	(void)state;
	const char *d = fresh("read_outside");
	build(d, &good, NULL);
	hpu_ckpt c;
	char err[512] = "";
	float got[NUMEL + 1];
	open_ok(&c, d);
	assert_int_equal(hpu__ckpt_read(&c, 0, 10, 6, got, err, sizeof err), -1);
	assert_non_null(strstr(err, "floats 10-16 of section 0 are not there"));
	assert_int_equal(hpu__ckpt_read(&c, NSEC, 0, 1, got, err, sizeof err), -1);
	assert_int_equal(hpu__ckpt_read(&c, -1, 0, 1, got, err, sizeof err), -1);
	assert_int_equal(hpu__ckpt_read(&c, 0, NUMEL, 0, got, err, sizeof err), 0);
	hpu__ckpt_close(&c);
}

/* The file of a checkpoint, cut to `bytes`. */
static void cut(const char *dir, const char *name, off_t bytes)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	assert_int_equal(truncate(path, bytes), 0);
}

static void test_read_short_file(void **state)
{
	(void)state;
	const char *d = fresh("read_short");
	build(d, &good, NULL);
	cut(d, "rank-00002-of-00003.bin", 20);
	hpu_ckpt c;
	char err[512] = "";
	float got[NUMEL];
	open_ok(&c, d); /* sizes are verify's business */
	assert_int_equal(hpu__ckpt_read(&c, 0, 7, 3, got, err, sizeof err), 0);
	assert_int_equal(hpu__ckpt_read(&c, 1, 0, NUMEL, got, err, sizeof err), -1);
	printf("  short file -> \"%s\"\n", err);
	assert_non_null(strstr(err, "rank-00002-of-00003.bin: shorter than the manifest says"));
	hpu__ckpt_close(&c);
}

/* ---- verifying ---- */

static void expect_verify(hpu_ckpt *c, int i, const char *const *needles)
{
	char err[1024] = "";
	int rc = hpu__ckpt_verify(c, i, err, sizeof err);
	printf("  verify %s -> \"%s\"\n", c->files[i].name, err);
	assert_int_equal(rc, -1);
	for (size_t k = 0; needles[k]; k++)
		if (!strstr(err, needles[k]))
			fail_msg("error \"%s\" does not say \"%s\"", err, needles[k]);
}

#define EXPECT_VERIFY(c, i, ...) expect_verify(c, i, (const char *const[]){__VA_ARGS__, NULL})

static void flip_byte(const char *dir, const char *name, off_t at)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "r+b");
	assert_non_null(f);
	assert_int_equal(fseeko(f, at, SEEK_SET), 0);
	int ch = fgetc(f);
	assert_int_equal(fseeko(f, at, SEEK_SET), 0);
	fputc(ch ^ 0x01, f);
	assert_int_equal(fclose(f), 0);
}

static void test_verify(void **state)
{
	(void)state;
	const char *d = fresh("verify");
	char err[1024], path[1024];
	build(d, &good, NULL);
	hpu_ckpt c;
	open_ok(&c, d);
	for (int i = 0; i < c.nfiles; i++)
		if (hpu__ckpt_verify(&c, i, err, sizeof err) < 0)
			fail_msg("good file %d: %s", i, err);
	/* a digest of a file agrees with the writer's */
	char hex[65];
	uint64_t bytes;
	snprintf(path, sizeof path, "%s/%s", d, c.files[1].name);
	assert_int_equal(hpu__ckpt_sha256_file(path, hex, &bytes), 0);
	assert_string_equal(hex, c.files[1].sha256);
	assert_int_equal(bytes, c.files[1].bytes);

	cut(d, c.files[0].name, 70);
	EXPECT_VERIFY(&c, 0, "rank-00000-of-00003.bin is truncated", "70 bytes",
		      "the manifest says 72");
	flip_byte(d, c.files[1].name, 33);
	EXPECT_VERIFY(&c, 1, "rank-00001-of-00003.bin is damaged", "SHA-256",
		      "the manifest says", c.files[1].sha256);
	FILE *f = fopen(path, "ab");
	assert_non_null(f);
	fputs("x", f);
	fclose(f);
	EXPECT_VERIFY(&c, 1, "rank-00001-of-00003.bin is too long");
	snprintf(path, sizeof path, "%s/%s", d, c.files[2].name);
	assert_int_equal(unlink(path), 0);
	EXPECT_VERIFY(&c, 2, "rank-00002-of-00003.bin", "No such file or directory");
	hpu__ckpt_close(&c);
}

/* ---- writing ---- */

/* Entries of dir other than . and .., as "a b c" (sorted). */
static void listing(const char *dir, char *out, size_t n)
{
	struct dirent **v;
	int k = scandir(dir, &v, NULL, alphasort);
	assert_true(k >= 0);
	out[0] = '\0';
	for (int i = 0; i < k; i++) {
		if (strcmp(v[i]->d_name, ".") && strcmp(v[i]->d_name, ".."))
			snprintf(out + strlen(out), n - strlen(out), "%s%s", out[0] ? " " : "",
				 v[i]->d_name);
		free(v[i]);
	}
	free(v);
}

static void test_writer(void **state)
{
	(void)state;
	const char *d = fresh("writer");
	char err[512] = "", path[1024], list[1024], sha[65], hex[65];
	uint64_t bytes;
	hpu_ckpt_writer w;
	snprintf(path, sizeof path, "%s/shard.bin", d);
	/* abort: no file, temporary or final */
	assert_int_equal(hpu__ckpt_writer_open(&w, path, err, sizeof err), 0);
	static char big[5 << 20]; /* more than the writer's buffer */
	memset(big, 7, sizeof big);
	assert_int_equal(hpu__ckpt_writer_put(&w, big, sizeof big, err, sizeof err), 0);
	listing(d, list, sizeof list);
	assert_non_null(strstr(list, "shard.bin.tmp.")); /* while writing */
	hpu__ckpt_writer_abort(&w);
	hpu__ckpt_writer_abort(&w); /* safe twice */
	listing(d, list, sizeof list);
	assert_string_equal(list, "");
	/* commit: the final name only, and the digest of what is there */
	assert_int_equal(hpu__ckpt_writer_open(&w, path, err, sizeof err), 0);
	assert_int_equal(hpu__ckpt_writer_put(&w, big, sizeof big, err, sizeof err), 0);
	assert_int_equal(hpu__ckpt_writer_put(&w, "abc", 3, err, sizeof err), 0);
	assert_int_equal(w.bytes, sizeof big + 3);
	assert_int_equal(hpu__ckpt_writer_commit(&w, sha, err, sizeof err), 0);
	hpu__ckpt_writer_abort(&w); /* after commit: removes nothing */
	listing(d, list, sizeof list);
	assert_string_equal(list, "shard.bin");
	assert_int_equal(hpu__ckpt_sha256_file(path, hex, &bytes), 0);
	assert_string_equal(hex, sha);
	assert_int_equal(bytes, sizeof big + 3);
	/* write_atomic replaces */
	assert_int_equal(hpu__write_atomic(path, "xy", 2, err, sizeof err), 0);
	assert_int_equal(hpu__ckpt_sha256_file(path, hex, &bytes), 0);
	assert_int_equal(bytes, 2);
	/* an unwritable place is named */
	snprintf(path, sizeof path, "%s/no/such/dir/f", d);
	assert_int_equal(hpu__ckpt_writer_open(&w, path, err, sizeof err), -1);
	printf("  writer -> \"%s\"\n", err);
	assert_non_null(strstr(err, "no/such/dir/f.tmp."));
	assert_non_null(strstr(err, "No such file or directory"));
	assert_int_equal(hpu__write_atomic(path, "xy", 2, err, sizeof err), -1);
	listing(d, list, sizeof list);
	assert_string_equal(list, "shard.bin");
}

/* ---- the root ---- */

/* A whole small file as a string (caller frees), or NULL. */
static char *slurp(const char *path)
{
	char buf[4096];
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strdup(buf);
}

/* A whole file of any size as a string (caller frees). */
static char *slurp_big(const char *path)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	char *b = NULL;
	size_t cap = 0, n = 0, got;
	do {
		cap = cap * 2 + 4096;
		b = realloc(b, cap + 1);
		assert_non_null(b);
		got = fread(b + n, 1, cap - n, f);
		n += got;
	} while (n == cap);
	fclose(f);
	b[n] = '\0';
	return b;
}

static void make_dir(const char *root, const char *name)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", root, name);
	assert_int_equal(mkdir(path, 0755), 0);
}

static void write_latest(const char *root, const char *text)
{
	char path[1024], err[256];
	snprintf(path, sizeof path, "%s/%s", root, HPU_CKPT_LATEST);
	assert_int_equal(hpu__write_atomic(path, text, strlen(text), err, sizeof err), 0);
}

/* The candidates of root as "a b c". */
static int candidates(const char *root, char *out, size_t n)
{
	char **names = NULL, err[256];
	int k = hpu__ckpt_candidates(root, &names, err, sizeof err);
	assert_true(k >= 0);
	assert_non_null(names);
	out[0] = '\0';
	for (int i = 0; i < k; i++)
		snprintf(out + strlen(out), n - strlen(out), "%s%s", i ? " " : "", names[i]);
	assert_null(names[k]);
	hpu__ckpt_free_names(names);
	return k;
}

static void test_candidates(void **state)
{
	(void)state;
	char list[1024], path[1024], name[64];
	const char *r = fresh("cands");
	assert_int_equal(candidates(r, list, sizeof list), 0); /* empty */
	snprintf(path, sizeof path, "%s/nonexistent", r);
	assert_int_equal(candidates(path, list, sizeof list), 0); /* absent */
	const char *junk[] = {"step-abc", ".step-00000010.partial", "step-", "step--1",
			      "step-+3", "step- 7", "step-12x", "other", "step-00000010.tmp"};
	for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++)
		make_dir(r, junk[i]);
	assert_int_equal(candidates(r, list, sizeof list), 0);
	make_dir(r, "step-00000005");
	make_dir(r, "step-00000020");
	make_dir(r, "step-00000010");
	make_dir(r, "step-00000100");
	/* no latest: by step, descending */
	assert_int_equal(candidates(r, list, sizeof list), 4);
	assert_string_equal(list, "step-00000100 step-00000020 step-00000010 step-00000005");
	/* latest first, then the older ones by step, then those past
	 * latest's step (a run resumed from an earlier checkpoint abandoned
	 * them; they came second, before the resumed run's own) */
	write_latest(r, "step-00000010\n");
	candidates(r, list, sizeof list);
	assert_string_equal(list, "step-00000010 step-00000005 step-00000100 step-00000020");
	/* latest naming nothing there, or junk: ignored */
	write_latest(r, "step-00000042\n");
	candidates(r, list, sizeof list);
	assert_string_equal(list, "step-00000100 step-00000020 step-00000010 step-00000005");
	write_latest(r, "step-abc\n");
	candidates(r, list, sizeof list);
	assert_string_equal(list, "step-00000100 step-00000020 step-00000010 step-00000005");
	hpu__ckpt_step_name(40, name, sizeof name);
	assert_string_equal(name, "step-00000040");
	hpu__ckpt_shard_name(1, 4, name, sizeof name);
	assert_string_equal(name, "rank-00001-of-00004.bin");
}

/* A partial checkpoint of one file, as a save would leave it. */
static void partial(const char *root, long step)
{
	char name[64], path[1024], err[256];
	hpu__ckpt_step_name(step, name, sizeof name);
	snprintf(path, sizeof path, "%s/.%s.partial", root, name);
	assert_int_equal(mkdir(path, 0755), 0);
	snprintf(path + strlen(path), sizeof path - strlen(path), "/%s", HPU_CKPT_MANIFEST);
	assert_int_equal(hpu__write_atomic(path, "{}", 2, err, sizeof err), 0);
}

static void publish(const char *root, long step, int keep)
{
	char name[64], part[80], err[512] = "";
	hpu__ckpt_step_name(step, name, sizeof name);
	snprintf(part, sizeof part, ".%s.partial", name);
	partial(root, step);
	if (hpu__ckpt_publish(root, part, name, keep, err, sizeof err) < 0)
		fail_msg("publish %s: %s", name, err);
}

/* A root a run left at step 20 (checkpoints 15, 18, 20), whose latest a
 * resume from step 15 into it points back at, as its run's next save
 * finds it. */
static const char *resumed_root(const char *name)
{
	const char *r = fresh(name);
	publish(r, 15, 0);
	publish(r, 18, 0);
	publish(r, 20, 0);
	write_latest(r, "step-00000015\n");
	return r;
}

static void test_publish_keep(void **state)
{
	(void)state;
	char list[1024], path[1024], *text = NULL;
	const char *r = fresh("publish");
	publish(r, 10, 2);
	publish(r, 20, 2);
	listing(r, list, sizeof list);
	assert_string_equal(list, "latest step-00000010 step-00000020");
	publish(r, 30, 2); /* step 10 goes */
	listing(r, list, sizeof list);
	assert_string_equal(list, "latest step-00000020 step-00000030");
	snprintf(path, sizeof path, "%s/%s", r, HPU_CKPT_LATEST);
	assert_non_null(text = slurp(path));
	assert_string_equal(text, "step-00000030\n");
	free(text);
	snprintf(path, sizeof path, "%s/step-00000030/%s", r, HPU_CKPT_MANIFEST);
	assert_int_equal(access(path, F_OK), 0);
	/* the new one stays even when it is the oldest step (a run resumed
	 * from an earlier checkpoint): the others go */
	publish(r, 5, 1);
	listing(r, list, sizeof list);
	assert_string_equal(list, "latest step-00000005");
	snprintf(path, sizeof path, "%s/%s", r, HPU_CKPT_LATEST);
	assert_non_null(text = slurp(path));
	assert_string_equal(text, "step-00000005\n");
	free(text);
	/* keep 0 keeps every one; the same step again replaces it */
	publish(r, 6, 0);
	publish(r, 7, 0);
	publish(r, 7, 0);
	listing(r, list, sizeof list);
	assert_string_equal(list, "latest step-00000005 step-00000006 step-00000007");
	/* a publish of a partial that is not there fails, naming it */
	char err[512] = "";
	assert_int_equal(hpu__ckpt_publish(r, ".step-00000099.partial", "step-00000099", 1, err,
					   sizeof err),
			 -1);
	assert_non_null(strstr(err, ".step-00000099.partial"));
	listing(r, list, sizeof list);
	assert_string_equal(list, "latest step-00000005 step-00000006 step-00000007");

	/* resumed from an earlier checkpoint into the same root: its run's
	 * new one and the one it came from stay, the abandoned run's later
	 * ones go (step 15 went, 20 stayed, and --resume auto fell back from
	 * a damaged 16 to the abandoned 20) */
	r = resumed_root("publish-resumed");
	publish(r, 16, 2);
	listing(r, list, sizeof list);
	assert_string_equal(list, "latest step-00000015 step-00000016");
	/* --keep-last 2 alike */
	r = resumed_root("keep-resumed");
	hpu_ckpt_keep k = {.last = 2};
	char **best = NULL, **last = NULL;
	assert_int_equal(hpu__ckpt_keep_plan(r, &k, "step-00000016", NAN, &best, &last, err,
					     sizeof err),
			 0);
	assert_non_null(last);
	assert_string_equal(last[0], "step-00000016");
	assert_string_equal(last[1], "step-00000015");
	assert_null(last[2]);
	hpu__ckpt_free_names(best);
	hpu__ckpt_free_names(last);
}

/* ---- buffers ---- */

/* Two buffers, 7 floats, laid end to end in buffers.bin. */
#define BNUMEL 7
static const hpu_ckpt_buffer buf_decl[2] = {
	{.name = "bn.running_mean", .ndim = 1, .shape = {4}, .offset = 0, .numel = 4,
	 .sync = "mean"},
	{.name = "bn.last", .ndim = 2, .shape = {1, 3}, .offset = 4, .numel = 3,
	 .sync = "broadcast"},
};

static float bvalue(uint64_t i)
{
	return -1.5f - (float)i * 0.125f;
}

static hpu_ckpt_file buf_file;  /* the buffers file build_buffers wrote */
static mutate_fn buf_mutate;    /* applied after the buffers are added */

static void add_buffers(cJSON *m)
{
	cJSON_AddItemToObject(m, "buffers", hpu__ckpt_buffers_json(&buf_file, buf_decl, 2));
	if (buf_mutate)
		buf_mutate(m);
}

/* The good checkpoint with buffers.bin and its "buffers" (then mutate). */
static void build_buffers(const char *dir, mutate_fn mutate)
{
	char path[1024], err[512];
	hpu_ckpt_writer w;
	memset(&buf_file, 0, sizeof buf_file);
	snprintf(buf_file.name, sizeof buf_file.name, "%s", HPU_CKPT_BUFFERS);
	snprintf(path, sizeof path, "%s/%s", dir, buf_file.name);
	assert_int_equal(hpu__ckpt_writer_open(&w, path, err, sizeof err), 0);
	for (uint64_t i = 0; i < BNUMEL; i++) {
		float v = bvalue(i);
		assert_int_equal(hpu__ckpt_writer_put(&w, &v, 4, err, sizeof err), 0);
	}
	buf_file.bytes = w.bytes;
	assert_int_equal(hpu__ckpt_writer_commit(&w, buf_file.sha256, err, sizeof err), 0);
	buf_mutate = mutate;
	build(dir, &good, add_buffers);
}

static void test_buffers_open_read(void **state)
{
	(void)state;
	const char *d = fresh("buffers");
	char err[512] = "";
	float got[BNUMEL + 1];
	build_buffers(d, NULL);
	hpu_ckpt c;
	open_ok(&c, d);
	assert_int_equal(c.nbuffers, 2);
	assert_int_equal(c.buffer_numel, BNUMEL);
	assert_string_equal(c.buffer_file.name, "buffers.bin");
	assert_int_equal(c.buffer_file.bytes, BNUMEL * 4);
	assert_string_equal(c.buffer_file.sha256, buf_file.sha256);
	assert_int_equal(hpu__ckpt_buffer_find(&c, "bn.last"), 1);
	assert_int_equal(hpu__ckpt_buffer_find(&c, "a.weight"), -1);
	assert_int_equal(hpu__ckpt_param_find(&c, "bn.last"), -1);
	assert_int_equal(c.buffers[1].ndim, 2);
	assert_int_equal(c.buffers[1].shape[0], 1);
	assert_int_equal(c.buffers[1].shape[1], 3);
	assert_int_equal(c.buffers[1].offset, 4);
	assert_int_equal(c.buffers[1].numel, 3);
	assert_string_equal(c.buffers[0].sync, "mean");
	assert_string_equal(c.buffers[1].sync, "broadcast");
	/* the shards are as without buffers */
	assert_int_equal(c.nfiles, 3);
	assert_int_equal(c.numel, NUMEL);
	assert_int_equal(hpu__ckpt_verify_buffers(&c, err, sizeof err), 0);
	for (int i = 0; i < c.nfiles; i++)
		assert_int_equal(hpu__ckpt_verify(&c, i, err, sizeof err), 0);
	/* every range */
	uint64_t before = c.bytes_read;
	for (uint64_t start = 0; start < BNUMEL; start++)
		for (uint64_t count = 0; start + count <= BNUMEL; count++) {
			memset(got, 0xff, sizeof got);
			if (hpu__ckpt_read_buffers(&c, start, count, got, err, sizeof err) < 0)
				fail_msg("read buffers [%llu, +%llu): %s",
					 (unsigned long long)start, (unsigned long long)count, err);
			for (uint64_t i = 0; i < count; i++)
				assert_true(got[i] == bvalue(start + i));
		}
	/* float i is in (i + 1) * (BNUMEL - i) of the ranges */
	uint64_t want = 0;
	for (uint64_t i = 0; i < BNUMEL; i++)
		want += 4 * (i + 1) * (BNUMEL - i);
	assert_int_equal(c.bytes_read - before, want);
	/* and the parameters read as before */
	check_all_ranges(&c);
	assert_int_equal(hpu__ckpt_read_buffers(&c, 5, 3, got, err, sizeof err), -1);
	printf("  read past the buffers -> \"%s\"\n", err);
	assert_non_null(strstr(err, "buffer floats 5-8 are not there (it holds 7)"));
	assert_int_equal(hpu__ckpt_read_buffers(&c, 8, 0, got, err, sizeof err), -1);
	hpu__ckpt_close(&c);
	/* no "buffers": none, and nothing to verify or read */
	d = fresh("no_buffers");
	build(d, &good, NULL);
	open_ok(&c, d);
	assert_int_equal(c.nbuffers, 0);
	assert_int_equal(c.buffer_numel, 0);
	assert_string_equal(c.buffer_file.name, "");
	assert_int_equal(hpu__ckpt_verify_buffers(&c, err, sizeof err), 0);
	assert_int_equal(hpu__ckpt_read_buffers(&c, 0, 0, got, err, sizeof err), 0);
	assert_int_equal(hpu__ckpt_read_buffers(&c, 0, 1, got, err, sizeof err), -1);
	assert_null(cJSON_GetObjectItem(c.m, "buffers"));
	hpu__ckpt_close(&c);
}

static cJSON *bufs(cJSON *m)
{
	return cJSON_GetObjectItem(m, "buffers");
}

static cJSON *btensor(cJSON *m, int i)
{
	return cJSON_GetArrayItem(cJSON_GetObjectItem(bufs(m), "tensors"), i);
}

static void b_bytes_plus_4(cJSON *m)
{
	cJSON_ReplaceItemInObject(bufs(m), "bytes", cJSON_CreateNumber(BNUMEL * 4 + 4));
}

static void b_offset(cJSON *m)
{
	cJSON_ReplaceItemInObject(btensor(m, 1), "offset", cJSON_CreateNumber(5));
}

static void b_numel(cJSON *m)
{
	cJSON_ReplaceItemInObject(btensor(m, 0), "numel", cJSON_CreateNumber(3));
}

static void b_shape(cJSON *m)
{
	cJSON_ReplaceItemInObject(btensor(m, 1), "shape", cJSON_CreateIntArray((int[]){2, 3}, 2));
}

static void b_shape_zero(cJSON *m)
{
	cJSON_ReplaceItemInObject(btensor(m, 1), "shape", cJSON_CreateIntArray((int[]){3, 0}, 2));
}

static void b_total(cJSON *m)
{
	cJSON_ReplaceItemInObject(bufs(m), "numel", cJSON_CreateNumber(8));
}

static void b_twice(cJSON *m)
{
	cJSON_ReplaceItemInObject(btensor(m, 1), "name", cJSON_CreateString("bn.running_mean"));
}

static void b_slash(cJSON *m)
{
	cJSON_ReplaceItemInObject(bufs(m), "file", cJSON_CreateString("../buffers.bin"));
}

static void b_shard(cJSON *m)
{
	cJSON_ReplaceItemInObject(bufs(m), "file", cJSON_CreateString("rank-00001-of-00003.bin"));
}

static void b_manifest(cJSON *m)
{
	cJSON_ReplaceItemInObject(bufs(m), "file", cJSON_CreateString("manifest.json"));
}

static void b_no_sha(cJSON *m)
{
	cJSON_DeleteItemFromObject(bufs(m), "sha256");
}

static void b_empty(cJSON *m)
{
	cJSON_ReplaceItemInObject(bufs(m), "tensors", cJSON_CreateArray());
}

static void b_not_object(cJSON *m)
{
	cJSON_ReplaceItemInObject(m, "buffers", cJSON_CreateArray());
}

static void b_sync(cJSON *m)
{
	cJSON_ReplaceItemInObject(btensor(m, 0), "sync", cJSON_CreateString("sum"));
}

static void b_dtype(cJSON *m)
{
	cJSON_ReplaceItemInObject(btensor(m, 1), "dtype", cJSON_CreateString("BF16"));
}

static void b_no_name(cJSON *m)
{
	cJSON_DeleteItemFromObject(btensor(m, 1), "name");
}

static void test_buffers_refused(void **state)
{
	(void)state;
	const struct {
		const char *dir;
		mutate_fn fn;
		const char *say[3];
	} cases[] = {
		{"b_bytes", b_bytes_plus_4,
		 {"buffers.bin: 32 bytes listed, but its buffers make 28"}},
		{"b_offset", b_offset, {"buffer bn.last", "offset 5", "expected offset 4"}},
		{"b_numel", b_numel, {"buffer bn.running_mean", "numel 3",
				      "do not follow from the shapes"}},
		{"b_shape", b_shape,
		 {"buffer bn.last", "numel 3", "do not follow from the shapes"}},
		{"b_shape0", b_shape_zero, {"buffer bn.last has no shape or a bad one"}},
		{"b_total", b_total, {"buffers: numel 8, but the buffers hold 7 floats"}},
		{"b_twice", b_twice, {"buffer bn.running_mean is listed twice"}},
		{"b_slash", b_slash, {"\"buffers\" lacks a plain file name"}},
		{"b_shard", b_shard, {"buffers file rank-00001-of-00003.bin is also a shard"}},
		{"b_manifest", b_manifest,
		 {"buffers file \"manifest.json\" is not a data file's name"}},
		{"b_no_sha", b_no_sha, {"\"buffers\" lacks a plain file name, bytes, sha256"}},
		{"b_empty", b_empty, {"\"buffers\" lists no tensors"}},
		{"b_not_object", b_not_object, {"\"buffers\" lacks"}},
		{"b_sync", b_sync, {"buffer bn.running_mean: sync \"sum\" is not one of broadcast, "
				    "mean, local"}},
		{"b_dtype", b_dtype, {"buffer bn.last: dtype \"BF16\" is not one of F32"}},
		{"b_no_name", b_no_name, {"buffer 1 lacks a name, offset or numel"}},
	};
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
		const char *d = fresh(cases[k].dir);
		build_buffers(d, cases[k].fn);
		const char *needles[5] = {"manifest.json"};
		for (int n = 0; n < 3 && cases[k].say[n]; n++)
			needles[n + 1] = cases[k].say[n];
		expect_open_error(d, needles);
	}
}

static void test_buffers_verify(void **state)
{
	(void)state;
	const char *d = fresh("buffers_verify");
	char err[1024] = "", path[1024];
	float got[BNUMEL];
	build_buffers(d, NULL);
	hpu_ckpt c;
	open_ok(&c, d);
	snprintf(path, sizeof path, "%s/buffers.bin", d);
	/* a changed float: the digest no longer matches */
	flip_byte(d, "buffers.bin", 9);
	assert_int_equal(hpu__ckpt_verify_buffers(&c, err, sizeof err), -1);
	printf("  verify buffers.bin -> \"%s\"\n", err);
	assert_non_null(strstr(err, "checkpoint buffers file"));
	assert_non_null(strstr(err, "buffers_verify/buffers.bin is damaged: SHA-256"));
	assert_non_null(strstr(err, buf_file.sha256));
	flip_byte(d, "buffers.bin", 9);
	assert_int_equal(hpu__ckpt_verify_buffers(&c, err, sizeof err), 0);
	/* cut short, and read past its end */
	cut(d, "buffers.bin", 26);
	assert_int_equal(hpu__ckpt_verify_buffers(&c, err, sizeof err), -1);
	printf("  verify buffers.bin -> \"%s\"\n", err);
	assert_non_null(strstr(err, "buffers.bin is truncated: 26 bytes, the manifest says 28"));
	assert_int_equal(hpu__ckpt_read_buffers(&c, 0, 6, got, err, sizeof err), 0);
	assert_int_equal(hpu__ckpt_read_buffers(&c, 0, BNUMEL, got, err, sizeof err), -1);
	assert_non_null(strstr(err, "buffers.bin: shorter than the manifest says"));
	/* longer */
	cut(d, "buffers.bin", 40);
	assert_int_equal(hpu__ckpt_verify_buffers(&c, err, sizeof err), -1);
	assert_non_null(strstr(err, "buffers.bin is too long: 40 bytes"));
	/* gone */
	assert_int_equal(unlink(path), 0);
	assert_int_equal(hpu__ckpt_verify_buffers(&c, err, sizeof err), -1);
	printf("  verify buffers.bin -> \"%s\"\n", err);
	assert_non_null(strstr(err, "buffers.bin: No such file or directory"));
	/* the shards are still fine */
	for (int i = 0; i < c.nfiles; i++)
		assert_int_equal(hpu__ckpt_verify(&c, i, err, sizeof err), 0);
	hpu__ckpt_close(&c);
	/* the read descriptor was opened before the unlink: a fresh open
	 * finds the file missing */
	open_ok(&c, d);
	assert_int_equal(hpu__ckpt_read_buffers(&c, 0, 1, got, err, sizeof err), -1);
	assert_non_null(strstr(err, "checkpoint buffers file"));
	assert_non_null(strstr(err, "No such file or directory"));
	hpu__ckpt_close(&c);
}

/* ---- the manifest's own digest, owners, odd files, stale partials ---- */

/* Rewrites dir's manifest through edit(m) (may be NULL), sealed with
 * hpu__ckpt_manifest_text when `seal`. */
static void rewrite_manifest(const char *dir, mutate_fn edit, int seal)
{
	char path[1024], err[256];
	snprintf(path, sizeof path, "%s/%s", dir, HPU_CKPT_MANIFEST);
	char *text = slurp_big(path);
	cJSON *m = cJSON_Parse(text);
	free(text);
	assert_non_null(m);
	if (edit)
		edit(m);
	text = seal ? hpu__ckpt_manifest_text(m) : cJSON_Print(m);
	assert_non_null(text);
	assert_int_equal(hpu__write_atomic(path, text, strlen(text), err, sizeof err), 0);
	free(text);
	cJSON_Delete(m);
}

static void step_41(cJSON *m)
{
	cJSON_ReplaceItemInObjectCaseSensitive(m, "step", cJSON_CreateNumber(41));
}

/* The same content, the keys in another order. */
static void format_last(cJSON *m)
{
	cJSON *f = cJSON_DetachItemFromObjectCaseSensitive(m, "format");
	cJSON_AddItemToObject(m, "format", f);
}

static void digest_short(cJSON *m)
{
	cJSON_ReplaceItemInObjectCaseSensitive(m, HPU_CKPT_DIGEST, cJSON_CreateString("abc"));
}

static void test_manifest_digest(void **state)
{
	(void)state;
	const char *d = fresh("sealed");
	char note[4400];
	hpu_ckpt c;
	build(d, &good, NULL);
	open_ok(&c, d); /* a manifest from before: opens, said unsealed */
	assert_int_equal(c.unsealed, 1);
	hpu__ckpt_unsealed_note(&c, note, sizeof note);
	assert_non_null(strstr(note, "manifest.json has no manifest_sha256"));
	hpu__ckpt_close(&c);
	rewrite_manifest(d, NULL, 1);
	open_ok(&c, d);
	assert_int_equal(c.unsealed, 0);
	hpu__ckpt_close(&c);
	rewrite_manifest(d, format_last, 0); /* the keys reordered: the same content */
	open_ok(&c, d);
	assert_int_equal(c.unsealed, 0);
	hpu__ckpt_close(&c);
	rewrite_manifest(d, step_41, 0); /* an edit, in range */
	EXPECT_OPEN_ERROR(d, "manifest.json was altered after it was written: its content's SHA-256 is ",
			  ", its manifest_sha256 says ");
	rewrite_manifest(d, digest_short, 0);
	EXPECT_OPEN_ERROR(d, "manifest.json: manifest_sha256 is not a SHA-256 (64 hex digits)");
}

/* Owners: every file of a checkpoint, and `latest`, must be of a uid
 * trusted; another uid here is one that is not ours. */
static void test_owners(void **state)
{
	(void)state;
	const char *d = fresh("owners");
	char err[1024] = "", want[256];
	uid_t me = geteuid(), other = me + 1;
	hpu_ckpt_owners mine = {1, {me}}, theirs = {2, {other, other + 1}};
	build(d, &good, NULL);
	hpu_ckpt c;
	assert_int_equal(hpu__ckpt_open_owned(&c, d, &mine, err, sizeof err), 0);
	for (int i = 0; i < c.nfiles; i++)
		assert_int_equal(hpu__ckpt_verify(&c, i, err, sizeof err), 0);
	/* a shard another uid owns (the trust narrowed after opening) */
	c.owners = theirs;
	assert_int_equal(hpu__ckpt_verify(&c, 1, err, sizeof err), -1);
	snprintf(want, sizeof want, "rank-00001-of-00003.bin is owned by uid %u, not by uid %u or %u",
		 (unsigned)me, (unsigned)other, (unsigned)other + 1);
	printf("  %s\n", err);
	if (!strstr(err, want) || !strstr(err, "chmod +t"))
		fail_msg("\"%s\" does not say \"%s\"", err, want);
	assert_int_equal(c.foreign, 1);
	float v;
	assert_int_equal(hpu__ckpt_read(&c, 0, 0, 1, &v, err, sizeof err), -1);
	assert_non_null(strstr(err, "is owned by uid"));
	hpu__ckpt_close(&c);
	/* the directory itself */
	assert_int_equal(hpu__ckpt_open_owned(&c, d, &theirs, err, sizeof err), -1);
	snprintf(want, sizeof want, "owners is owned by uid %u, not by uid", (unsigned)me);
	assert_non_null(strstr(err, want));
	assert_int_equal(c.foreign, 1);
	hpu__ckpt_close(&c);
	/* latest: absent is fine; of another uid, or a link, is not */
	assert_int_equal(hpu__ckpt_check_latest(d, &theirs, err, sizeof err), 0);
	write_latest(d, "step-00000001\n");
	assert_int_equal(hpu__ckpt_check_latest(d, &mine, err, sizeof err), 0);
	assert_int_equal(hpu__ckpt_check_latest(d, NULL, err, sizeof err), 0);
	assert_int_equal(hpu__ckpt_check_latest(d, &theirs, err, sizeof err), -1);
	assert_non_null(strstr(err, "/latest is owned by uid"));
	char lp[1024];
	snprintf(lp, sizeof lp, "%s/latest", d);
	assert_int_equal(unlink(lp), 0);
	assert_int_equal(symlink("elsewhere", lp), 0);
	assert_int_equal(hpu__ckpt_check_latest(d, &mine, err, sizeof err), -1);
	assert_non_null(strstr(err, "/latest is a symbolic link (not followed"));
}

/* A shard that is a FIFO, a link or a sparse giant: refused at once. */
static void test_not_regular(void **state)
{
	(void)state;
	const char *d = fresh("odd");
	char path[1024], hex[65], err[1024];
	uint64_t bytes;
	build(d, &good, NULL);
	hpu_ckpt c;
	open_ok(&c, d);
	snprintf(path, sizeof path, "%s/%s", d, c.files[1].name);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(mkfifo(path, 0644), 0);
	EXPECT_VERIFY(&c, 1, "checkpoint shard ", "rank-00001-of-00003.bin: not a regular file (a FIFO)");
	float v[NUMEL];
	assert_int_equal(hpu__ckpt_read(&c, 0, 0, NUMEL, v, err, sizeof err), -1);
	assert_non_null(strstr(err, "not a regular file (a FIFO)"));
	errno = 0;
	assert_int_equal(hpu__ckpt_sha256_file(path, hex, &bytes), -1);
	assert_int_equal(errno, EINVAL);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(symlink("/dev/zero", path), 0);
	EXPECT_VERIFY(&c, 1, "rank-00001-of-00003.bin is a symbolic link (not followed");
	assert_int_equal(unlink(path), 0);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(ftruncate(fileno(f), (off_t)8 << 30), 0);
	fclose(f);
	EXPECT_VERIFY(&c, 1, "rank-00001-of-00003.bin is too long: 8589934592 bytes, the manifest says 72");
	assert_int_equal(unlink(path), 0);
	hpu__ckpt_close(&c);
	/* the manifest too */
	snprintf(path, sizeof path, "%s/%s", d, HPU_CKPT_MANIFEST);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(mkfifo(path, 0644), 0);
	EXPECT_OPEN_ERROR(d, "cannot read the checkpoint manifest ", "not a regular file (a FIFO)");
}

static void said(const char *path, void *arg)
{
	char *list = arg;
	snprintf(list + strlen(list), 1024 - strlen(list), "%s ", strrchr(path, '/') + 1);
}

/* Only this uid's .step-N.partial directories that nobody holds go. */
static void test_clean_partials(void **state)
{
	(void)state;
	const char *r = fresh("partials");
	char list[1024] = "", path[1024];
	partial(r, 1);
	make_dir(r, ".step-00000002.partial");
	make_dir(r, ".step-00000003.partial");
	make_dir(r, ".step-x.partial");
	make_dir(r, "step-00000004");
	make_dir(r, "elsewhere");
	snprintf(path, sizeof path, "%s/.step-00000005.partial", r);
	assert_int_equal(symlink("elsewhere", path), 0);
	snprintf(path, sizeof path, "%s/.step-00000003.partial", r);
	int held = hpu__ckpt_partial_lock(path);
	assert_true(held >= 0);
	assert_int_equal(hpu__ckpt_partial_lock(path), -1); /* one holder at a time */
	assert_int_equal(hpu__ckpt_clean_partials(r, said, list), 2);
	assert_string_equal(list, strstr(list, ".step-00000001") == list
					  ? ".step-00000001.partial .step-00000002.partial "
					  : ".step-00000002.partial .step-00000001.partial ");
	close(held);
	listing(r, list, sizeof list);
	assert_string_equal(list, ".step-00000003.partial .step-00000005.partial .step-x.partial "
				  "elsewhere step-00000004");
	assert_int_equal(hpu__ckpt_clean_partials(r, NULL, NULL), 1); /* no longer held */
	snprintf(path, sizeof path, "%s/nothing", r);
	assert_int_equal(hpu__ckpt_clean_partials(path, NULL, NULL), 0);
}

static void finish_and_exit(int sig)
{
	(void)sig;
	hpu__ckpt_discard_finish();
	_exit(3);
}

/* SIGTERM while a prune removes an old checkpoint: the worker's handler
 * finishes the removal (it left .step-N.partial with the shards not yet
 * unlinked, which only the next start removed). A child discards a
 * checkpoint of many files and is signalled once the rename is seen;
 * tried again where the removal ended before the signal came. */
static void test_prune_signalled(void **state)
{
	(void)state;
	char path[1024], gone[1024];
	int mid = 0;
	for (int attempt = 0; attempt < 6 && !mid; attempt++) {
		const char *r = fresh("prune-signal");
		publish(r, 1, 0);
		for (int i = 0; i < 30000; i++) {
			snprintf(path, sizeof path, "%s/step-00000001/shard-%05d", r, i);
			int fd = open(path, O_CREAT | O_WRONLY, 0644);
			assert_true(fd >= 0);
			close(fd);
		}
		snprintf(gone, sizeof gone, "%s/.step-00000001.partial", r);
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			signal(SIGTERM, finish_and_exit);
			hpu__ckpt_discard(r, "step-00000001");
			_exit(0); /* done before the signal: inconclusive */
		}
		struct stat st;
		while (stat(gone, &st) != 0) {
			int ws;
			if (waitpid(pid, &ws, WNOHANG) == pid)
				break;
		}
		kill(pid, SIGTERM);
		int ws = 0;
		assert_int_equal(waitpid(pid, &ws, 0), pid);
		assert_true(WIFEXITED(ws));
		mid = WEXITSTATUS(ws) == 3;
		printf("  attempt %d: the signal came %s the removal ended\n", attempt,
		       mid ? "before" : "after");
		assert_int_equal(stat(gone, &st), -1);
		assert_int_equal(errno, ENOENT);
		snprintf(path, sizeof path, "%s/step-00000001", r);
		assert_int_equal(stat(path, &st), -1);
	}
	if (!mid)
		printf("  every removal ended before its signal: the handler's part was not "
		       "exercised\n");
}

/* A prune cut short (here: a directory inside the old checkpoint, which
 * the one-level removal cannot take, as a signal would stop it) leaves
 * no step-N directory that still reads as a checkpoint (it kept its
 * manifest, with shards gone, and counted against --keep): the victim
 * is renamed to a stale partial first, which the next save removes; a
 * `latest` whose writing was cut short leaves latest.tmp.PID, which the
 * next save removes once it is a minute old. */
static void test_prune_cut_short(void **state)
{
	(void)state;
	char list[1024] = "", path[1024], **names = NULL, err[256];
	const char *r = fresh("prune-cut");
	publish(r, 1, 0);
	snprintf(path, sizeof path, "%s/step-00000001/stuck", r);
	assert_int_equal(mkdir(path, 0755), 0);
	publish(r, 2, 1); /* step 1's removal stops at "stuck" */
	assert_int_equal(hpu__ckpt_candidates(r, &names, err, sizeof err), 1);
	assert_string_equal(names[0], "step-00000002");
	hpu__ckpt_free_names(names);
	listing(r, list, sizeof list);
	assert_string_equal(list, ".step-00000001.partial latest step-00000002");
	snprintf(path, sizeof path, "%s/.step-00000001.partial/%s", r, HPU_CKPT_MANIFEST);
	assert_int_equal(access(path, F_OK), -1);
	/* the same step published again over one whose removal is cut
	 * short: the old one is renamed aside to .step-N.old.partial (the
	 * save works under .step-N.partial), and the new one published; it
	 * was removed in place, and a signal meanwhile left a step-N
	 * without its manifest, which nothing removed */
	publish(r, 3, 0);
	snprintf(path, sizeof path, "%s/step-00000003/stuck", r);
	assert_int_equal(mkdir(path, 0755), 0);
	char part[80] = ".step-00000003.partial";
	partial(r, 3);
	if (hpu__ckpt_publish(r, part, "step-00000003", 0, err, sizeof err) < 0)
		fail_msg("publish over a removal cut short: %s", err);
	snprintf(path, sizeof path, "%s/step-00000003/%s", r, HPU_CKPT_MANIFEST);
	assert_int_equal(access(path, F_OK), 0); /* the new one */
	snprintf(path, sizeof path, "%s/.step-00000003.old.partial/%s", r, HPU_CKPT_MANIFEST);
	assert_int_equal(access(path, F_OK), -1); /* the old one reads as no checkpoint */
	snprintf(path, sizeof path, "%s/.step-00000003.old.partial/stuck", r);
	assert_int_equal(rmdir(path), 0);
	list[0] = 0;
	assert_int_equal(hpu__ckpt_clean_partials(r, said, list), 1); /* (step 1's is stuck) */
	assert_string_equal(list, ".step-00000003.old.partial ");
	listing(r, list, sizeof list);
	assert_string_equal(list, ".step-00000001.partial latest step-00000002 step-00000003");

	/* latest.tmp.PID: a minute old goes, a fresh one (a write under way),
	 * a live writer's and other names stay */
	r = fresh("latest-tmp");
	char live[64];
	snprintf(live, sizeof live, "latest.tmp.%d", (int)getpid());
	const char *names_[] = {"latest.tmp.2147483646", "latest.tmp.77", "latest.tmp.",
				"latest.tmpx.5", "other.tmp.5", live};
	for (int i = 0; i < 6; i++) {
		snprintf(path, sizeof path, "%s/%s", r, names_[i]);
		assert_int_equal(hpu__write_atomic(path, "x", 1, err, sizeof err), 0);
		if (i != 1) {
			struct timespec old[2] = {{.tv_sec = time(NULL) - 120}, {.tv_sec = time(NULL) - 120}};
			assert_int_equal(utimensat(AT_FDCWD, path, old, 0), 0);
		}
	}
	list[0] = 0;
	assert_int_equal(hpu__ckpt_clean_partials(r, said, list), 1);
	assert_string_equal(list, "latest.tmp.2147483646 ");
	listing(r, list, sizeof list);
	/* (sorted: where the live pid falls among them varies) */
	const char *stay[] = {"latest.tmp. ", live, "latest.tmp.77", "latest.tmpx.5", "other.tmp.5"};
	for (int i = 0; i < 5; i++)
		assert_non_null(strstr(list, stay[i]));
	assert_null(strstr(list, "2147483646"));
}

/* ---- set-up ---- */

static int setup(void **state)
{
	(void)state;
	const char *t = getenv("TMPDIR");
	snprintf(tmp_root, sizeof tmp_root, "%s/test_ckpt.XXXXXX", t && *t ? t : "/tmp");
	return mkdtemp(tmp_root) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	rm_rf(tmp_root);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_open_good),
	    cmocka_unit_test(test_open_overlap),
	    cmocka_unit_test(test_open_gap),
	    cmocka_unit_test(test_open_file_bytes),
	    cmocka_unit_test(test_open_params),
	    cmocka_unit_test(test_open_format),
	    cmocka_unit_test(test_open_manifest_missing_or_not_json),
	    cmocka_unit_test(test_read_every_range),
	    cmocka_unit_test(test_read_outside),
	    cmocka_unit_test(test_read_short_file),
	    cmocka_unit_test(test_verify),
	    cmocka_unit_test(test_writer),
	    cmocka_unit_test(test_candidates),
	    cmocka_unit_test(test_publish_keep),
	    cmocka_unit_test(test_buffers_open_read),
	    cmocka_unit_test(test_buffers_refused),
	    cmocka_unit_test(test_buffers_verify),
	    cmocka_unit_test(test_manifest_digest),
	    cmocka_unit_test(test_owners),
	    cmocka_unit_test(test_not_regular),
	    cmocka_unit_test(test_clean_partials),
	    cmocka_unit_test(test_prune_cut_short),
	    cmocka_unit_test(test_prune_signalled),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
