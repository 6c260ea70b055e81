/* Integration test of hpu-plot on the metrics of a real run: a 2-worker
 * run of the MLP (20 steps, a log record every 2, checkpoints at 10 and
 * 20) and its resumption from step 10 write one metrics file -- step
 * records, checkpoint records, two "final" records, steps 12..20 twice.
 *
 * - the PNG (to a path with spaces and quotes, with a quoted title) is
 *   checked for real: signature, every chunk's CRC (zlib crc32), IHDR
 *   equal to --width/--height, IDAT inflating to exactly
 *   height * (1 + row bytes) for its colour type and bit depth, every row
 *   un-filtered, several distinct colours, IEND last; no OUT.tmp.PID is left
 *   and the temporary directory ($TMPDIR) is empty again;
 * - the default output name and size;
 * - --print-data: one row per step, ascending, each the last record of
 *   its step in the file (the resumed run's samples/s), memory in MiB;
 * - validation records (--eval-every): their table after the steps' in
 *   --print-data, and a whole PNG with their panels;
 * - an unterminated last line is skipped with a warning;
 * - a line that is not JSON (named by number), a record whose "step" is
 *   not a number (named by line, not "no step records"), a file without
 *   step records, a missing file: exit 1 and no output file; /dev/zero, a link
 *   to it and a FIFO are refused at once, naming what they are;
 * - a --profile trace given instead: said to be a trace, for hpu-trace;
 * - an empty file (or blank lines only): exit 1 saying it is empty, also
 *   with --print-data (no qsort(NULL, 0) for UBSan to trip on);
 * - a full disk: -o a link to /dev/full (written through, not renamed
 *   over) and --print-data into a full standard output exit 1, naming
 *   the file and the error; -o a link to a regular file writes the file
 *   and leaves the link; a gnuplot that exits 0 after writing part of a
 *   PNG is caught;
 * - no gnuplot on PATH: the install hint; a gnuplot that fails: its
 *   stderr passed on, an existing OUT left as it was;
 * - a null loss and a rank missing from a record are NaN in the table
 *   gnuplot reads (a gap; '?' would be joined across), as --print-data
 *   prints them;
 * - SIGTERM while gnuplot runs (a stand-in that sleeps), and a closed
 *   output pipe (SIGPIPE): gnuplot killed, no OUT.tmp.PID, the temporary
 *   directory removed, hpu-plot dead of the signal;
 * - usage errors exit 2, --help 0.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "tests/harness.h"

#define PLOT h_build("bin/hpu-plot")
#define LAUNCH h_build("bin/hpulaunch")
#define MODEL h_build("lib/fmnist_mlp.so")

static char T[256];       /* the test's temporary directory */
static char M[512];       /* the metrics file of the two runs */
static char TMPENV[600];  /* "TMPDIR=T/tmp" for hpu-plot */

static const char *path(const char *rel)
{
	static char bufs[8][600];
	static int k;
	char *p = bufs[k++ & 7];
	snprintf(p, sizeof bufs[0], "%s/%s", T, rel);
	return p;
}

/* ---- files ---- */


static int exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

/* Whether a temporary file of output p ("P.tmp.PID") is left beside it. */
static int tmp_left(const char *p)
{
	const char *slash = strrchr(p, '/');
	char dir[700], pre[300];
	snprintf(dir, sizeof dir, "%.*s", (int)(slash - p), p);
	snprintf(pre, sizeof pre, "%s.tmp", slash + 1);
	DIR *d = opendir(dir);
	assert_non_null(d);
	struct dirent *e;
	int found = 0;
	while ((e = readdir(d)))
		found |= strncmp(e->d_name, pre, strlen(pre)) == 0;
	closedir(d);
	return found;
}

/* Asserts directory d has no entries (hpu-plot removed its temp dir). */
static void empty_dir(const char *d)
{
	DIR *dir = opendir(d);
	assert_non_null(dir);
	struct dirent *e;
	while ((e = readdir(dir)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			fail_msg("%s/%s was left behind", d, e->d_name);
	closedir(dir);
}

/* ---- running ---- */

/* Runs argv (NULL-terminated) with env entries (may be NULL), asserts its
 * exit code, returns its output (caller frees). */
static char *run_v(int want, const char **env, const char **argv)
{
	proc p;
	int rc = h_run(&p, (char *const *)argv, (char *const *)env, 120000);
	char *out = strdup(p.out ? p.out : "");
	h_free(&p);
	if (rc != want) {
		fprintf(stderr, "---- %s %s ... exited %d, expected %d; output:\n%s----\n", argv[0],
			argv[1] ? argv[1] : "", rc, want, out);
		fail_msg("%s: exit %d, expected %d", argv[0], rc, want);
	}
	return out;
}

#define PLOT_ENV(want, env, ...) run_v(want, env, (const char *[]){PLOT, __VA_ARGS__, NULL})
static const char *ENV_T[] = {TMPENV, NULL}; /* $TMPDIR for hpu-plot */
#define HPU_PLOT(want, ...) PLOT_ENV(want, ENV_T, __VA_ARGS__)

static void has(const char *out, const char *needle)
{
	if (!strstr(out, needle))
		fail_msg("output does not say \"%s\":\n%s", needle, out);
}

/* ---- PNG ---- */

static uint32_t be32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int paeth(int a, int b, int c)
{
	int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
	return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/* Undoes the row filters of raw (h rows of 1 + rb bytes, bpp bytes per
 * pixel for the filters) in place; asserts each filter type is 0..4. */
static void unfilter(unsigned char *raw, uint32_t h, size_t rb, size_t bpp)
{
	for (uint32_t y = 0; y < h; y++) {
		unsigned char *row = raw + y * (rb + 1), *cur = row + 1;
		const unsigned char *up = y ? raw + (y - 1) * (rb + 1) + 1 : NULL;
		int type = row[0];
		if (type > 4)
			fail_msg("row %u has filter type %d", y, type);
		for (size_t x = 0; x < rb; x++) {
			int a = x >= bpp ? cur[x - bpp] : 0, b = up ? up[x] : 0;
			int c = up && x >= bpp ? up[x - bpp] : 0;
			int add[5] = {0, a, b, (a + b) / 2, paeth(a, b, c)};
			cur[x] = (unsigned char)(cur[x] + add[type]);
		}
	}
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

/* How many distinct pixel values the un-filtered image has (8- or
 * 16-bit samples: whole pixels of up to 8 bytes). */
static size_t distinct_pixels(const unsigned char *raw, uint32_t w, uint32_t h, size_t rb,
			      size_t px)
{
	uint64_t *v = malloc((size_t)w * h * sizeof *v);
	assert_non_null(v);
	size_t n = 0;
	for (uint32_t y = 0; y < h; y++)
		for (uint32_t x = 0; x < w; x++) {
			uint64_t k = 0;
			memcpy(&k, raw + y * (rb + 1) + 1 + x * px, px);
			v[n++] = k;
		}
	qsort(v, n, sizeof *v, cmp_u64);
	size_t d = n ? 1 : 0;
	for (size_t i = 1; i < n; i++)
		d += v[i] != v[i - 1];
	free(v);
	return d;
}

/* Checks that `file` is a complete, uncorrupted PNG of want_w x want_h
 * that is not blank. */
static void check_png(const char *file, uint32_t want_w, uint32_t want_h)
{
	static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
	size_t len;
	unsigned char *d = (unsigned char *)h_slurp_n(file, &len);
	if (!d)
		fail_msg("cannot read %s", file);
	assert_true(len > 8 && memcmp(d, sig, 8) == 0);
	uint32_t w = 0, h = 0;
	int depth = 0, ctype = -1, chunks = 0, ended = 0;
	unsigned char *idat = NULL;
	size_t nidat = 0;
	for (size_t at = 8; at < len;) {
		if (ended)
			fail_msg("%s: %zu bytes after IEND", file, len - at);
		assert_true(len - at >= 12);
		uint32_t n = be32(d + at);
		assert_true(n <= len - at - 12);
		const unsigned char *type = d + at + 4, *data = d + at + 8;
		uLong crc = crc32(crc32(0L, Z_NULL, 0), type, n + 4);
		if (crc != be32(data + n))
			fail_msg("%s: chunk %d (%.4s) CRC %08lx, stored %08x", file, chunks,
				 (const char *)type, crc, be32(data + n));
		if (chunks == 0) {
			assert_memory_equal(type, "IHDR", 4);
			assert_int_equal(n, 13);
			w = be32(data);
			h = be32(data + 4);
			depth = data[8];
			ctype = data[9];
			assert_int_equal(data[10], 0); /* deflate */
			assert_int_equal(data[11], 0); /* adaptive filters */
			assert_int_equal(data[12], 0); /* not interlaced */
		} else if (!memcmp(type, "IDAT", 4)) {
			idat = realloc(idat, nidat + n + 1);
			assert_non_null(idat);
			memcpy(idat + nidat, data, n);
			nidat += n;
		} else if (!memcmp(type, "IEND", 4)) {
			assert_int_equal(n, 0);
			ended = 1;
		}
		chunks++;
		at += 12 + (size_t)n;
	}
	assert_true(ended);
	assert_int_equal(w, want_w);
	assert_int_equal(h, want_h);
	int channels = ctype == 0 ? 1 : ctype == 2 ? 3 : ctype == 3 ? 1 : ctype == 4 ? 2 : 4;
	assert_true(ctype == 0 || ctype == 2 || ctype == 3 || ctype == 4 || ctype == 6);
	assert_true(depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16);
	size_t bits = (size_t)channels * depth, rb = ((size_t)w * bits + 7) / 8;
	size_t want = (size_t)h * (1 + rb);
	unsigned char *raw = malloc(want + 64);
	assert_non_null(raw);
	z_stream z = {0};
	assert_int_equal(inflateInit(&z), Z_OK);
	z.next_in = idat;
	z.avail_in = (uInt)nidat;
	z.next_out = raw;
	z.avail_out = (uInt)(want + 64);
	int zrc = inflate(&z, Z_FINISH);
	if (zrc != Z_STREAM_END || z.total_out != want)
		fail_msg("%s: IDAT inflated to %lu bytes (zlib %d), want %zu for %ux%u, colour "
			 "type %d, depth %d",
			 file, z.total_out, zrc, want, w, h, ctype, depth);
	inflateEnd(&z);
	size_t same = 0;
	for (size_t i = 1; i < want; i++)
		same += raw[i] == raw[0];
	assert_true(same < want - 1); /* not one byte value throughout */
	if (depth >= 8) {
		size_t px = bits / 8;
		unfilter(raw, h, rb, px);
		size_t colours = distinct_pixels(raw, w, h, rb, px);
		printf("  %s: %ux%u, colour type %d, %d-bit, %d chunks, %zu distinct colours\n",
		       strrchr(file, '/') + 1, w, h, ctype, depth, chunks, colours);
		/* white, black, and the lines' colours at the least */
		assert_true(colours >= 5);
	}
	free(raw);
	free(idat);
	free(d);
}

/* ---- the runs ---- */

static int setup(void **state)
{
	(void)state;
	const char *t = getenv("TMPDIR");
	snprintf(T, sizeof T, "%s/test_plot.XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(T))
		return -1;
	snprintf(M, sizeof M, "%s/metrics.jsonl", T);
	snprintf(TMPENV, sizeof TMPENV, "TMPDIR=%s/tmp", T);
	if (mkdir(path("tmp"), 0755) < 0)
		return -1;
	const char *first[] = {LAUNCH, "-q", "--devices", "2", "--max-steps", "20",
			       "--log-every", "2", "--no-eval", "--metrics", M,
			       "--checkpoint-dir", path("ck"), "--checkpoint-every", "10",
			       MODEL, NULL};
	const char *again[] = {LAUNCH, "-q", "--devices", "2", "--max-steps", "20",
			       "--log-every", "2", "--no-eval", "--metrics", M,
			       "--resume", path("ck/step-00000010"), MODEL, NULL};
	const char **runs[] = {first, again};
	for (int i = 0; i < 2; i++) {
		proc p;
		int rc = h_run(&p, (char *const *)runs[i], NULL, 120000);
		if (rc != 0) {
			fprintf(stderr, "training run %d failed (exit %d):\n%s\n", i + 1, rc,
				p.out ? p.out : "");
			h_free(&p);
			return -1;
		}
		h_free(&p);
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	h_rmtree(T);
	return 0;
}

/* The metrics file as lines (a NULL-terminated array; free lines[0] and
 * lines). */
static char **metrics_lines(size_t *n)
{
	char *text = h_slurp(M);
	assert_non_null(text);
	char **lines = calloc(strlen(text) + 2, sizeof *lines);
	assert_non_null(lines);
	*n = 0;
	for (char *s = text, *nl; *s; s = nl + 1) {
		lines[(*n)++] = s;
		if (!(nl = strchr(s, '\n')))
			break;
		*nl = '\0';
	}
	if (*n == 0)
		free(text);
	return lines;
}

/* ---- drawing ---- */

static void test_png(void **state)
{
	(void)state;
	assert_int_equal(mkdir(path("out dir"), 0755), 0);
	const char *out = path("out dir/it's a \"plot\" $(x).png");
	char *o = HPU_PLOT(0, "-o", out, "--width", "900", "--height", "600", "--title",
			   "it's a \"title\" with\na newline", M);
	free(o);
	check_png(out, 900, 600);
	assert_false(tmp_left(out));
	empty_dir(path("tmp"));
	/* drawn again over the first: replaced, whole */
	char opt[720];
	snprintf(opt, sizeof opt, "--output=%s", out);
	o = HPU_PLOT(0, opt, "--width=800", "--height=500", M);
	free(o);
	check_png(out, 800, 500);
	assert_false(tmp_left(out));
}

static void test_default_output(void **state)
{
	(void)state;
	char *o = HPU_PLOT(0, M);
	free(o);
	check_png(path("metrics.png"), 1200, 900);
	assert_false(tmp_left(path("metrics.png")));
	empty_dir(path("tmp"));
}

/* --print-data: the table drawn, checked against the metrics file read
 * here: the last record of each step, in ascending steps. */
static void test_table(void **state)
{
	(void)state;
	size_t n;
	char **lines = metrics_lines(&n);
	double sps[64], in_use1[64], limit[64];
	int seen[64] = {0}, records = 0, repeats = 0;
	for (size_t i = 0; i < n; i++) {
		cJSON *j = cJSON_Parse(lines[i]);
		assert_non_null(j);
		cJSON *step = cJSON_GetObjectItem(j, "step");
		cJSON *dev = cJSON_GetObjectItem(j, "device");
		if (cJSON_IsNumber(step) && cJSON_GetObjectItem(j, "loss")) {
			int s = step->valueint;
			assert_true(s > 0 && s < 64);
			repeats += seen[s];
			seen[s] = 1;
			records++;
			/* null within --throughput-warmup-steps: not measured */
			cJSON *v = cJSON_GetObjectItem(j, "samples_per_sec");
			assert_true(cJSON_IsNumber(v) || cJSON_IsNull(v));
			sps[s] = cJSON_IsNumber(v) ? v->valuedouble : NAN;
			cJSON *r0 = cJSON_GetArrayItem(dev, 0), *r1 = cJSON_GetArrayItem(dev, 1);
			assert_non_null(r0);
			assert_non_null(r1);
			in_use1[s] = cJSON_GetObjectItem(r1, "InUse")->valuedouble;
			limit[s] = cJSON_GetObjectItem(r0, "Limit")->valuedouble;
		}
		cJSON_Delete(j);
	}
	free(lines[0]);
	free(lines);
	/* the resumed run repeated steps 12..20 */
	assert_int_equal(records, 15);
	assert_int_equal(repeats, 5);

	char *o = HPU_PLOT(0, "--print-data", M);
	has(o, "# step loss lr samples_per_sec Limit_MiB InUse_r0_MiB MaxInUse_r0_MiB "
	       "InUse_r1_MiB MaxInUse_r1_MiB\n");
	int rows = 0, last = 0;
	for (char *l = strchr(o, '\n') + 1; *l; l = strchr(l, '\n') + 1) {
		double v[9];
		int got = sscanf(l, "%lf %lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2],
				 &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]);
		assert_int_equal(got, 9);
		int s = (int)v[0];
		assert_true(s > last && s < 64 && seen[s]);
		last = s;
		rows++;
		if (isnan(sps[s]) ? !isnan(v[3]) : fabs(v[3] - sps[s]) > 1e-6 * sps[s])
			fail_msg("step %d: samples/s %.10g, the last record says %.10g", s, v[3],
				 sps[s]);
		assert_true(fabs(v[4] - limit[s] / 1048576.0) < 1e-6 * v[4]);
		assert_true(fabs(v[7] - in_use1[s] / 1048576.0) < 1e-6 * v[7]);
		assert_true(v[2] > 0 && v[2] < 1);
		if (!strchr(l, '\n'))
			break;
	}
	assert_int_equal(rows, 10);
	assert_int_equal(last, 20);
	free(o);
}

/* Validation records (--eval-every 2 on 4 steps): --print-data follows
 * the step table with a blank line and the validations' table, whose
 * rows are the metrics file's val_loss and val_accuracy; the PNG with
 * their panels is drawn whole, and the temporary directory (val.txt too)
 * emptied. */
static void test_validation_records(void **state)
{
	(void)state;
	const char *vm = path("val.jsonl"), *png = path("val.png");
	const char *train[] = {LAUNCH, "-q", "--devices", "1", "--max-steps", "4",
			       "--log-every", "1", "--eval-every", "2", "--no-eval", "--metrics", vm,
			       MODEL, "--hidden", "64", "--depth", "1", NULL};
	free(run_v(0, NULL, train));
	char *text = h_slurp(vm), want[256] = "", row[96];
	assert_non_null(text);
	for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n")) {
		cJSON *j = cJSON_Parse(l);
		assert_non_null(j);
		cJSON *vl = cJSON_GetObjectItem(j, "val_loss");
		if (vl) {
			snprintf(row, sizeof row, "%.10g %.10g %.10g\n",
				 cJSON_GetObjectItem(j, "step")->valuedouble, vl->valuedouble,
				 cJSON_GetObjectItem(j, "val_accuracy")->valuedouble);
			strcat(want, row);
		}
		cJSON_Delete(j);
	}
	free(text);
	assert_int_equal(strncmp(want, "2 ", 2), 0);
	assert_non_null(strstr(want, "\n4 "));
	char *o = HPU_PLOT(0, "--print-data", vm);
	const char *v = strstr(o, "\n\n# validation: step val_loss val_accuracy\n");
	if (!v)
		fail_msg("no validation table in:\n%s", o);
	assert_string_equal(strchr(v + 2, '\n') + 1, want);
	free(o);
	free(HPU_PLOT(0, "-o", png, vm));
	check_png(png, 1200, 900);
	empty_dir(path("tmp"));
}

/* A run resumed from step 4 that logs other steps than the abandoned
 * run did: what that run logged past step 4 (steps 6 and 8, its
 * validation at 6) is dropped at the "checkpoint": "loaded" record (they
 * were kept beside the resumed run's 5 and 7, two runs in one line). */
static void test_resumed_other_steps(void **state)
{
	(void)state;
	const char *f = path("resumed.jsonl");
	const char *text =
		"{\"step\":2,\"epoch\":1,\"loss\":2.0,\"lr\":0.001,\"samples_per_sec\":10}\n"
		"{\"step\":4,\"epoch\":1,\"loss\":1.5,\"lr\":0.001,\"samples_per_sec\":10}\n"
		"{\"step\":6,\"epoch\":1,\"loss\":1.2,\"lr\":0.001,\"samples_per_sec\":10}\n"
		"{\"step\":6,\"val_loss\":1.3,\"val_samples\":100}\n"
		"{\"step\":8,\"epoch\":1,\"loss\":1.0,\"lr\":0.001,\"samples_per_sec\":10}\n"
		"{\"checkpoint\":\"loaded\",\"step\":4,\"seconds\":0.1}\n"
		"{\"step\":5,\"epoch\":1,\"loss\":1.4,\"lr\":0.001,\"samples_per_sec\":11}\n"
		"{\"step\":7,\"epoch\":1,\"loss\":1.1,\"lr\":0.001,\"samples_per_sec\":11}\n";
	assert_int_equal(h_write_file(f, text, 0644), 0);
	char *o = HPU_PLOT(0, "--print-data", f);
	printf("%s", o);
	const char *rows = strchr(o, '\n') + 1;
	assert_int_equal(strncmp(rows, "2 2 ", 4), 0);
	has(o, "\n4 1.5 ");
	has(o, "\n5 1.4 ");
	has(o, "\n7 1.1 ");
	assert_null(strstr(o, "\n6 "));
	assert_null(strstr(o, "\n8 "));
	assert_null(strstr(o, "# validation"));
	free(o);
}

/* A run still writing (or killed mid-line) leaves an unterminated line. */
static void test_incomplete_last_line(void **state)
{
	(void)state;
	char *text = h_slurp(M);
	assert_non_null(text);
	size_t nlines = 0;
	for (char *s = text; *s; s++)
		nlines += *s == '\n';
	char *cut = malloc(strlen(text) + 64);
	assert_non_null(cut);
	sprintf(cut, "%s{\"step\":22,\"epoch\":1,\"loss\":0.6", text);
	assert_int_equal(h_write_file(path("running.jsonl"), cut, 0644), 0);
	char *o = HPU_PLOT(0, "--width", "640", "--height", "480", path("running.jsonl"));
	char want[700];
	snprintf(want, sizeof want, "running.jsonl:%zu: the last line is incomplete", nlines + 1);
	has(o, want);
	check_png(path("running.png"), 640, 480);
	free(o);
	free(cut);
	free(text);
}

/* ---- errors ---- */

static void test_not_json(void **state)
{
	(void)state;
	size_t n;
	char **lines = metrics_lines(&n);
	assert_true(n > 8);
	FILE *f = fopen(path("bad.jsonl"), "w");
	assert_non_null(f);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s\n", i == 6 ? "{\"step\": 14, \"loss\": }" : lines[i]);
	assert_int_equal(fclose(f), 0);
	free(lines[0]);
	free(lines);
	char *o = HPU_PLOT(1, path("bad.jsonl"));
	has(o, "bad.jsonl:7: not JSON");
	assert_false(exists(path("bad.png")));
	assert_false(tmp_left(path("bad.png")));
	free(o);
}

/* A record whose "step" is not a number is an error naming its line,
 * not "no step records with a loss" (the record was there, damaged). */
/* A --profile trace given for a metrics file: said to be a trace, for
 * hpu-trace (it said only "not JSON"). */
static void test_trace_given(void **state)
{
	(void)state;
	char tr[600];
	snprintf(tr, sizeof tr, "%s", path("perf-logs-rank0.json"));
	assert_int_equal(
		h_write_file(tr,
			     "{\"otherData\":{\"tool\":\"hputrain\",\"version\":1,\"rank\":0},"
			     "\"traceEvents\":[\n"
			     "{\"name\":\"step\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":1,\"dur\":2}\n"
			     "\n]}\n",
			     0644),
		0);
	char *o = HPU_PLOT(1, tr);
	has(o, "perf-logs-rank0.json:1: this looks like a trace (hpulaunch --profile writes "
	       "them; hpu-trace reads them), not a metrics file");
	free(o);
	/* all on one line (it parses): the same */
	assert_int_equal(h_write_file(tr, "{\"otherData\":{},\"traceEvents\":[]}\n", 0644), 0);
	o = HPU_PLOT(1, tr);
	has(o, "this looks like a trace");
	free(o);
}

static void test_step_not_a_number(void **state)
{
	(void)state;
	assert_int_equal(h_write_file(path("badstep.jsonl"),
				      "{\"step\":2,\"loss\":1.5}\n\n{\"step\":\"x\",\"loss\":1}\n",
				      0644),
			 0);
	char *o = HPU_PLOT(1, "--print-data", path("badstep.jsonl"));
	has(o, "badstep.jsonl:3: \"step\" is not a number (\"x\")");
	assert_null(strstr(o, "no step records"));
	free(o);
	/* drawing says the same, and a null step too */
	assert_int_equal(h_write_file(path("nullstep.jsonl"), "{\"step\":null,\"loss\":1}\n", 0644),
			 0);
	o = HPU_PLOT(1, path("nullstep.jsonl"));
	has(o, "nullstep.jsonl:1: \"step\" is not a number (null)");
	assert_false(exists(path("nullstep.png")));
	free(o);
}

static void test_no_step_records(void **state)
{
	(void)state;
	size_t n;
	char **lines = metrics_lines(&n);
	FILE *f = fopen(path("nosteps.jsonl"), "w");
	assert_non_null(f);
	int kept = 0;
	for (size_t i = 0; i < n; i++)
		if (!strstr(lines[i], "\"epoch\"")) { /* checkpoint and final records */
			fprintf(f, "%s\n", lines[i]);
			kept++;
		}
	assert_int_equal(fclose(f), 0);
	assert_true(kept >= 4);
	free(lines[0]);
	free(lines);
	char *o = HPU_PLOT(1, path("nosteps.jsonl"));
	has(o, "no step records with a loss: nothing to plot");
	assert_false(exists(path("nosteps.png")));
	free(o);
	o = HPU_PLOT(1, "--print-data", path("nosteps.jsonl"));
	has(o, "no step records with a loss: nothing to plot");
	free(o);
	/* validations but no step (--log-every 0 writes none): the
	 * validations' loss counted as the steps' and the script read an
	 * empty table (SIGSEGV) */
	assert_int_equal(h_write_file(path("valonly.jsonl"),
				      "{\"step\":10,\"epoch\":1,\"val_loss\":2.1,\"val_samples\":10}\n",
				      0644),
			 0);
	o = HPU_PLOT(1, path("valonly.jsonl"));
	has(o, "valonly.jsonl has no step records with a loss: nothing to plot");
	assert_false(exists(path("valonly.png")));
	assert_false(tmp_left(path("valonly.png")));
	free(o);
	o = HPU_PLOT(1, "--print-data", path("valonly.jsonl"));
	has(o, "valonly.jsonl has no step records with a loss: nothing to plot");
	free(o);
}

/* Nothing at all in the file: said so, with and without --print-data. */
static void test_empty_input(void **state)
{
	(void)state;
	const char *files[] = {"empty.jsonl", "blank.jsonl"};
	assert_int_equal(h_write_file(path(files[0]), "", 0644), 0);
	assert_int_equal(h_write_file(path(files[1]), "\n  \n\t\n", 0644), 0);
	for (int i = 0; i < 2; i++) {
		char want[700];
		snprintf(want, sizeof want, "%s is empty: no metrics records to plot",
			 path(files[i]));
		char *o = HPU_PLOT(1, path(files[i]));
		has(o, want);
		free(o);
		o = HPU_PLOT(1, "--print-data", path(files[i]));
		has(o, want);
		free(o);
	}
	assert_false(exists(path("empty.png")));
	assert_false(exists(path("blank.png")));
	/* a run that has just started: its first record half written is
	 * not an empty file (it was said to be) */
	assert_int_equal(h_write_file(path("torn1.jsonl"), "{\"step\":1,\"epoch\":1,\"lo", 0644), 0);
	char *o = HPU_PLOT(1, path("torn1.jsonl"));
	has(o, "the last line is incomplete");
	has(o, "torn1.jsonl holds no complete metrics record yet: nothing to plot");
	assert_null(strstr(o, "is empty"));
	free(o);
	empty_dir(path("tmp"));
}

/* A metrics file that is not a regular file (a device, directly or
 * through a link; a FIFO) is refused at once, naming what it is. */
static void test_not_a_file(void **state)
{
	(void)state;
	char *o = HPU_PLOT(1, "--print-data", "/dev/zero");
	has(o, "cannot read /dev/zero: not a regular file (a character device)");
	free(o);
	assert_int_equal(symlink("/dev/zero", path("zero.jsonl")), 0);
	o = HPU_PLOT(1, path("zero.jsonl"));
	has(o, "zero.jsonl: not a regular file (a character device)");
	free(o);
	assert_int_equal(mkfifo(path("fifo.jsonl"), 0644), 0);
	o = HPU_PLOT(1, path("fifo.jsonl"));
	has(o, "fifo.jsonl: not a regular file (a FIFO)");
	free(o);
	assert_false(exists(path("zero.png")));
	assert_false(exists(path("fifo.png")));
}

/* ---- outputs that cannot be written ---- */

static void test_full_disk(void **state)
{
	(void)state;
	const char *full = path("full.png");
	assert_int_equal(symlink("/dev/full", full), 0);
	char *o = HPU_PLOT(1, "-o", full, M);
	has(o, full);
	has(o, "No space left on device");
	free(o);
	struct stat st;
	assert_int_equal(lstat(full, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	assert_false(tmp_left(path("full.png")));
	empty_dir(path("tmp"));
	/* a link to a regular file: the file gets the PNG, the link stays */
	const char *link = path("link.png");
	assert_int_equal(h_write_file(path("target.png"), "old", 0644), 0);
	assert_int_equal(symlink("target.png", link), 0);
	free(HPU_PLOT(0, "-o", link, "--width", "640", "--height", "480", M));
	assert_int_equal(lstat(link, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	check_png(path("target.png"), 640, 480);
	/* the table into a full standard output */
	o = run_v(1, ENV_T, (const char *[]){"/bin/sh", "-c", "exec \"$0\" --print-data \"$1\" >/dev/full",
					      PLOT, M, NULL});
	has(o, "standard output");
	has(o, "No space left on device");
	free(o);
}

/* A gnuplot that exits 0 after writing only the start of a PNG (as one
 * whose writes failed may): refused, the old OUT left as it was. */
static void test_gnuplot_short_png(void **state)
{
	(void)state;
	char env_path[700];
	assert_int_equal(mkdir(path("shortbin"), 0755), 0);
	assert_int_equal(h_write_file(path("shortbin/gnuplot"),
				      "#!/bin/sh\n"
				      "printf '\\211PNG\\r\\n\\032\\n\\0\\0\\0\\rIHDR'\n"
				      "exit 0\n",
				      0755),
			 0);
	assert_int_equal(h_write_file(path("short.png"), "the previous picture", 0644), 0);
	snprintf(env_path, sizeof env_path, "PATH=%s", path("shortbin"));
	char *o = PLOT_ENV(1, ((const char *[]){env_path, TMPENV, NULL}), "-o", path("short.png"), M);
	has(o, "no complete PNG");
	char *old = h_slurp(path("short.png"));
	assert_string_equal(old, "the previous picture");
	assert_false(tmp_left(path("short.png")));
	empty_dir(path("tmp"));
	free(old);
	free(o);
}

static void test_missing_file(void **state)
{
	(void)state;
	char *o = HPU_PLOT(1, path("none.jsonl"));
	char want[700];
	snprintf(want, sizeof want, "cannot open %s: No such file or directory",
		 path("none.jsonl"));
	has(o, want);
	free(o);
}

static void test_no_gnuplot(void **state)
{
	(void)state;
	char env_path[700];
	assert_int_equal(mkdir(path("emptybin"), 0755), 0);
	snprintf(env_path, sizeof env_path, "PATH=%s", path("emptybin"));
	char *o = PLOT_ENV(1, ((const char *[]){env_path, TMPENV, NULL}), "-o", path("nog.png"), M);
	has(o, "gnuplot not found: install gnuplot-nox (deploy/install-deps.sh does)");
	assert_false(exists(path("nog.png")));
	assert_false(tmp_left(path("nog.png")));
	free(o);
}

/* A gnuplot that fails: what it said is passed on, the old OUT stays. */
static void test_gnuplot_fails(void **state)
{
	(void)state;
	char env_path[700];
	assert_int_equal(mkdir(path("failbin"), 0755), 0);
	assert_int_equal(h_write_file(path("failbin/gnuplot"),
				      "#!/bin/sh\n"
				      "printf 'partial' \n"
				      "echo \"plot.gp, line 9: fake failure in $1\" >&2\n"
				      "exit 3\n",
				      0755),
			 0);
	assert_int_equal(h_write_file(path("old.png"), "the previous picture", 0644), 0);
	snprintf(env_path, sizeof env_path, "PATH=%s", path("failbin"));
	char *o = PLOT_ENV(1, ((const char *[]){env_path, TMPENV, NULL}), "-o", path("old.png"), M);
	has(o, "failed with exit status 3");
	has(o, "plot.gp, line 9: fake failure in plot.gp");
	char *old = h_slurp(path("old.png"));
	assert_string_equal(old, "the previous picture");
	assert_false(tmp_left(path("old.png")));
	empty_dir(path("tmp"));
	free(old);
	free(o);
}

/* A loss that was not finite ("loss":null) and a rank missing from a
 * record's "device" are NaN in the table gnuplot reads, and the script
 * declares no other "missing" marker: gnuplot breaks a line at a NaN,
 * where a point it skips as missing ('?') is joined across (5.4). A
 * stand-in gnuplot keeps the files it was given; --print-data prints the
 * same rows. */
static void test_missing_is_gap(void **state)
{
	(void)state;
	char env_path[700], script[1600], gm[600];
	snprintf(gm, sizeof gm, "%s", path("gap.jsonl"));
	assert_int_equal(
		h_write_file(gm,
			     "{\"step\":1,\"loss\":2.5,\"lr\":0.1,\"samples_per_sec\":100,\"device\":"
			     "[{\"rank\":0,\"Limit\":8388608,\"InUse\":1048576,\"MaxInUse\":2097152},"
			     "{\"rank\":1,\"Limit\":8388608,\"InUse\":1048576,\"MaxInUse\":2097152}]}\n"
			     "{\"step\":2,\"loss\":null,\"lr\":0.1,\"samples_per_sec\":100,\"device\":"
			     "[{\"rank\":0,\"Limit\":8388608,\"InUse\":1048576,\"MaxInUse\":2097152}]}\n"
			     "{\"step\":3,\"loss\":1.5,\"lr\":0.1,\"samples_per_sec\":100,\"device\":"
			     "[{\"rank\":0,\"Limit\":8388608,\"InUse\":1048576,\"MaxInUse\":2097152},"
			     "{\"rank\":1,\"Limit\":8388608,\"InUse\":1048576,\"MaxInUse\":2097152}]}\n",
			     0644),
		0);
	assert_int_equal(mkdir(path("gapbin"), 0755), 0);
	assert_int_equal(mkdir(path("gapseen"), 0755), 0);
	snprintf(script, sizeof script, "#!/bin/sh\ncp data.txt plot.gp '%s'\nexit 5\n",
		 path("gapseen"));
	assert_int_equal(h_write_file(path("gapbin/gnuplot"), script, 0755), 0);
	snprintf(env_path, sizeof env_path, "PATH=%s:/usr/bin:/bin", path("gapbin"));
	free(PLOT_ENV(1, ((const char *[]){env_path, TMPENV, NULL}), "-o", path("gap.png"), gm));
	empty_dir(path("tmp"));
	char *data = h_slurp(path("gapseen/data.txt")), *gp = h_slurp(path("gapseen/plot.gp"));
	assert_non_null(data);
	assert_non_null(gp);
	if (strchr(data, '?'))
		fail_msg("the table marks a missing value with '?', which gnuplot joins across:\n%s",
			 data);
	has(data, "\n2 NaN 0.1 100 8 1 2 NaN NaN\n");
	if (strstr(gp, "datafile missing"))
		fail_msg("the script sets a missing marker:\n%s", gp);
	char *o = HPU_PLOT(0, "--print-data", gm);
	assert_string_equal(o, data);
	free(o);
	free(data);
	free(gp);
}

/* SIGTERM while gnuplot draws (a stand-in that sleeps): hpu-plot kills
 * gnuplot, removes OUT.tmp.PID and its temporary directory, and dies of
 * the signal; before, all three were left. */
static void test_signal_cleans_up(void **state)
{
	(void)state;
	char env_path[700], script[2200], out[600], pidfile[600];
	snprintf(out, sizeof out, "%s", path("sig.png"));
	snprintf(pidfile, sizeof pidfile, "%s", path("sigbin.pid"));
	assert_int_equal(mkdir(path("sigbin"), 0755), 0);
	snprintf(script, sizeof script, "#!/bin/sh\necho $$ >'%s.new'\nmv '%s.new' '%s'\nexec sleep 60\n",
		 pidfile, pidfile, pidfile);
	assert_int_equal(h_write_file(path("sigbin/gnuplot"), script, 0755), 0);
	snprintf(env_path, sizeof env_path, "PATH=%s:/usr/bin:/bin", path("sigbin"));
	const char *argv[] = {PLOT, "-o", out, M, NULL};
	const char *env[] = {env_path, TMPENV, NULL};
	proc p;
	assert_int_equal(h_start(&p, (char *const *)argv, (char *const *)env), 0);
	char *pid_text = NULL;
	for (int k = 0; k < 1000 && !(pid_text = h_slurp(pidfile)); k++)
		usleep(10000);
	if (!pid_text) {
		h_kill(&p);
		fail_msg("the stand-in gnuplot did not start");
	}
	pid_t gp = (pid_t)atoi(pid_text);
	free(pid_text);
	assert_true(gp > 0 && h_alive(gp));
	assert_true(tmp_left(out));
	assert_int_equal(kill(p.pid, SIGTERM), 0);
	if (h_wait(&p, 20000) != 0) {
		h_kill(&p);
		fail_msg("hpu-plot did not end after SIGTERM");
	}
	assert_int_equal(h_code(&p), 128 + SIGTERM);
	h_free(&p);
	for (int k = 0; k < 200 && h_alive(gp); k++)
		usleep(10000);
	if (h_alive(gp)) {
		kill(gp, SIGKILL);
		fail_msg("gnuplot (pid %d) still runs after hpu-plot's SIGTERM", (int)gp);
	}
	assert_false(tmp_left(out));
	assert_false(exists(out));
	empty_dir(path("tmp"));
}

/* -o /dev/stdout into a pipe closed early: hpu-plot dies of SIGPIPE (as
 * before) and leaves no temporary directory. */
static void test_closed_pipe_cleans_up(void **state)
{
	(void)state;
	char env_path[700];
	assert_int_equal(mkdir(path("pipebin"), 0755), 0);
	/* a whole (if empty) PNG after a pause: the reader has gone by then */
	assert_int_equal(h_write_file(path("pipebin/gnuplot"),
				      "#!/bin/sh\n"
				      "sleep 0.5\n"
				      "printf '\\211PNG\\r\\n\\032\\n'\n"
				      "head -c 100000 /dev/zero\n"
				      "printf '\\0\\0\\0\\0IEND\\256B`\\202'\n",
				      0755),
			 0);
	snprintf(env_path, sizeof env_path, "PATH=%s:/usr/bin:/bin", path("pipebin"));
	const char *argv[] = {"/bin/sh", "-c",
			      "\"$0\" -o /dev/stdout \"$1\"; echo \"exit $?\" >&2", PLOT, M, NULL};
	const char *wrap[] = {"/bin/sh", "-c", "\"$@\" | true", "sh", argv[0], argv[1], argv[2],
			      argv[3], argv[4], NULL};
	char *o = run_v(0, ((const char *[]){env_path, TMPENV, NULL}), wrap);
	has(o, "exit 141");
	free(o);
	empty_dir(path("tmp"));
}

static void test_usage(void **state)
{
	(void)state;
	char *o = HPU_PLOT(0, "--help");
	has(o, "usage: hpu-plot [-o OUT.png]");
	free(o);
	o = run_v(2, NULL, (const char *[]){PLOT, NULL});
	has(o, "which metrics file?");
	free(o);
	o = HPU_PLOT(2, "--width", "12", M);
	has(o, "--width wants a whole number of pixels from 200 to 16384, not '12'");
	free(o);
	o = HPU_PLOT(2, "--height", "tall", M);
	has(o, "--height wants a whole number");
	free(o);
	o = HPU_PLOT(2, "--frobnicate", M);
	has(o, "unknown option '--frobnicate'");
	free(o);
	o = HPU_PLOT(2, M, M);
	has(o, "one metrics file only");
	free(o);
	o = HPU_PLOT(2, M, "-o");
	has(o, "--output needs a value");
	free(o);
	o = HPU_PLOT(1, "-o", M, M);
	has(o, "is the metrics file itself");
	free(o);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_png),
		cmocka_unit_test(test_default_output),
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_validation_records),
		cmocka_unit_test(test_resumed_other_steps),
		cmocka_unit_test(test_incomplete_last_line),
		cmocka_unit_test(test_not_json),
		cmocka_unit_test(test_trace_given),
		cmocka_unit_test(test_step_not_a_number),
		cmocka_unit_test(test_no_step_records),
		cmocka_unit_test(test_empty_input),
		cmocka_unit_test(test_not_a_file),
		cmocka_unit_test(test_full_disk),
		cmocka_unit_test(test_gnuplot_short_png),
		cmocka_unit_test(test_missing_file),
		cmocka_unit_test(test_no_gnuplot),
		cmocka_unit_test(test_gnuplot_fails),
		cmocka_unit_test(test_missing_is_gap),
		cmocka_unit_test(test_signal_cleans_up),
		cmocka_unit_test(test_closed_pipe_cleans_up),
		cmocka_unit_test(test_usage),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
