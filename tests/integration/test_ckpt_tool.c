/* Integration test of hpu-ckpt on a real checkpoint: a 2-worker zero3 run
 * of the MLP saves checkpoints (--checkpoint-dir) and its final weights
 * (--save-params), then
 *
 * - info prints the step, world size, strategy and parameters, for a
 *   checkpoint and for the root (every checkpoint, `latest` marked);
 * - verify exits 0, and 1 naming the file after a byte of a copy is
 *   flipped; export and reshard refuse that copy;
 * - export --format raw is byte-identical to the --save-params file;
 * - export (safetensors) parses with the reader here (header length,
 *   JSON, contiguous offsets, every tensor equal to its floats of the
 *   --save-params file) and, where /usr/bin/python3 has torch, in Python;
 * - --load-params reads that export by name, and --save-params writes
 *   safetensors (by default, a name not ending in .bin or .raw) that
 *   passes the same reader, its floats the --save-params file's, equal
 *   byte for byte on --device cpu and cpu-strict; raw still round-trips;
 * - a state_dict written by PyTorch 1.13 (tests/fixtures/
 *   mlp_h8_torch.safetensors, in its own tensor order) loads by name; a
 *   renamed tensor and a shape that differs are refused naming them;
 *   trained from it for 20 steps, every step's loss is within 1e-5
 *   relative of PyTorch's (tests/fixtures/refs/mlp_h8_torch_train.txt,
 *   written by tests/fixtures/torch_mlp_train.py), and not when the same
 *   floats load in the wrong order or one of them is moved;
 * - reshard --world 3 writes a checkpoint that verifies, whose manifest is
 *   the source's but for world_size and files, whose export is
 *   bit-identical to the source's, and that 3 workers resume from and
 *   train one more step; also --world 1 --strategy ddp, whose manifest
 *   drops zero3's placement plan;
 * - a manifest with a field out of range or a name not known (world_size
 *   2^31, strategy zero9, dtype F128, ...) is refused by info, verify and
 *   reshard with a sentence naming the field and its value;
 * - export to a full disk (a link to /dev/full) and info into a full
 *   standard output fail naming the file and the error; export through a
 *   link to a regular file writes the file and leaves the link;
 * - export -o standard output (/dev/stdout or /proc/self/fd/1 into a pipe
 *   or a file, or the file stdout is redirected to): the weights alone
 *   there, the report on stderr;
 * - an edit of the manifest that stays in range (step, lr, seed, ...) is
 *   caught by its own digest; one without a digest is verified with a
 *   warning; a step directory, `latest` or shard of another uid is
 *   reported naming the owner (as root: the files are given to 65534);
 * - a shard that is a FIFO, a link to /dev/zero or an 8 GiB sparse file
 *   is refused at once, naming what it is;
 * - reshard refuses a DST named step-N for another step, or inside a
 *   checkpoint's directory; verify and info report a step-N directory
 *   (a link) holding another step as damaged;
 * - usage errors exit 2.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/harness.h"

#define TOOL h_build("bin/hpu-ckpt")
#define LAUNCH h_build("bin/hpulaunch")
#define MODEL h_build("lib/fmnist_mlp.so")
#define PYTHON "/usr/bin/python3"
#define STEPS 4
/* divisible by 2 and by 3 workers: resuming needs the same global batch */
#define BATCH "48"

static char T[256];      /* the test's temporary directory */
static char CK[512];     /* the checkpoint root */
static char LAST[600];   /* its latest checkpoint */
static char PARAMS[512]; /* --save-params of the same run */

static const char *path(const char *rel)
{
	static char bufs[8][600];
	static int k;
	char *p = bufs[k++ & 7];
	snprintf(p, sizeof bufs[0], "%s/%s", T, rel);
	return p;
}

/* ---- files ---- */

static unsigned char *read_all(const char *file, size_t *len)
{
	return (unsigned char *)h_slurp_n(file, len);
}

static void write_all(const char *file, const void *p, size_t n)
{
	FILE *f = fopen(file, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(p, 1, n, f), n);
	assert_int_equal(fclose(f), 0);
}

/* Asserts files a and b hold the same bytes. */
static void same_bytes(const char *a, const char *b)
{
	size_t na, nb;
	unsigned char *x = read_all(a, &na), *y = read_all(b, &nb);
	if (!x || !y)
		fail_msg("cannot read %s or %s", a, b);
	if (na != nb || memcmp(x, y, na) != 0)
		fail_msg("%s (%zu bytes) differs from %s (%zu bytes)", a, na, b, nb);
	free(x);
	free(y);
}

static int exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

/* A copy of a checkpoint directory (one level, as checkpoints are). */
static void copy_dir(const char *from, const char *to)
{
	static const char *files[] = {"manifest.json", "rank-00000-of-00002.bin",
				      "rank-00001-of-00002.bin"};
	assert_int_equal(mkdir(to, 0755), 0);
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
		char a[700], b[700];
		size_t n;
		snprintf(a, sizeof a, "%s/%s", from, files[i]);
		snprintf(b, sizeof b, "%s/%s", to, files[i]);
		unsigned char *d = read_all(a, &n);
		assert_non_null(d);
		write_all(b, d, n);
		free(d);
	}
}

/* ---- running ---- */

/* Runs argv (NULL-terminated), asserts its exit code, returns its output
 * (caller frees). */
static char *run_v(int want, const char **argv)
{
	proc p;
	int rc = h_run(&p, (char *const *)argv, NULL, 120000);
	char *out = strdup(p.out ? p.out : "");
	h_free(&p);
	if (rc != want) {
		fprintf(stderr, "---- %s %s ... exited %d, expected %d; output:\n%s----\n", argv[0],
			argv[1] ? argv[1] : "", rc, want, out);
		fail_msg("%s %s: exit %d, expected %d", argv[0], argv[1] ? argv[1] : "", rc, want);
	}
	return out;
}

#define RUN(want, ...) run_v(want, (const char *[]){__VA_ARGS__, NULL})
#define CKPT(want, ...) run_v(want, (const char *[]){TOOL, __VA_ARGS__, NULL})

static void has(const char *out, const char *needle)
{
	if (!strstr(out, needle))
		fail_msg("output does not say \"%s\":\n%s", needle, out);
}

/* ---- the run ---- */

static int setup(void **state)
{
	(void)state;
	const char *t = getenv("TMPDIR");
	snprintf(T, sizeof T, "%s/test_ckpt_tool.XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(T))
		return -1;
	snprintf(CK, sizeof CK, "%s/ck", T);
	snprintf(PARAMS, sizeof PARAMS, "%s/params.bin", T);
	snprintf(LAST, sizeof LAST, "%s/step-%08d", CK, STEPS);
	char steps[16];
	snprintf(steps, sizeof steps, "%d", STEPS);
	const char *argv[] = {LAUNCH, "-q", "--devices", "2", "--strategy", "zero3",
			      "--batch-size", BATCH, "--max-steps", steps, "--no-eval",
			      "--log-every", "0", "--checkpoint-dir", CK, "--checkpoint-every",
			      "2", "--keep", "3", "--save-params", PARAMS, MODEL, NULL};
	proc p;
	int rc = h_run(&p, (char *const *)argv, NULL, 120000);
	if (rc != 0 || !exists(LAST) || !exists(PARAMS)) {
		fprintf(stderr, "training run failed (exit %d):\n%s\n", rc, p.out ? p.out : "");
		h_free(&p);
		return -1;
	}
	h_free(&p);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	h_rmtree(T);
	return 0;
}

/* ---- info ---- */

static void test_info(void **state)
{
	(void)state;
	char *out = CKPT(0, "info", LAST);
	has(out, "step          4 (epoch 1, batch 4 of the epoch; global batch 48)");
	has(out, "world size    2\n");
	has(out, "strategy      zero3\n");
	has(out, "precision     fp32\n");
	has(out, "optimizer     adamw (4 optimizer steps)");
	has(out, "sections      params, exp_avg, exp_avg_sq\n");
	has(out, "parameters    6 (1863690 floats");
	has(out, "fc1.weight  [1024, 784]");
	has(out, "fc3.bias    [10]");
	has(out, "files         2, ");
	has(out, "rank-00001-of-00002.bin");
	has(out, "scheduler     type constant");
	has(out, "loss scaler   scale 1");
	has(out, "last_overflow -1 (none)");
	free(out);
	/* the root: every checkpoint, newest first, latest marked */
	out = CKPT(0, "info", CK);
	has(out, "2 checkpoints, newest first");
	has(out, "* step-00000004  step 4, 2 x zero3, fp32, 2 files");
	has(out, "  step-00000002  step 2, 2 x zero3");
	if (strstr(out, "step-00000004") > strstr(out, "  step-00000002"))
		fail_msg("not newest first:\n%s", out);
	has(out, "checkpoint    ");
	has(out, LAST);
	free(out);
}

/* 16-mixed's loss scaler: its last overflow said as the step the log
 * named (the manifest keeps DeepSpeed's iteration, from 0) */
static void test_info_loss_scaler(void **state)
{
	(void)state;
	const char *ck = path("ck16");
	char *out = RUN(0, LAUNCH, "-q", "--devices", "1", "--precision", "16-mixed",
			"--inject-overflow-step", "3", "--max-steps", "4", "--batch-size", "16",
			"--no-eval", "--checkpoint-dir", ck, MODEL, "--", "--hidden", "16");
	has(out, "step 3: gradient overflow");
	free(out);
	out = CKPT(0, "info", ck);
	has(out, "loss scaler   scale 65536, hysteresis_left 1, steps 4, last_overflow 2 (step 3), "
		 "skipped 1");
	free(out);
}

/* ---- verify ---- */

static void test_verify(void **state)
{
	(void)state;
	char *out = CKPT(0, "verify", LAST);
	has(out, "ok   rank-00000-of-00002.bin");
	has(out, "ok   rank-00001-of-00002.bin");
	has(out, "ok: 2 files");
	free(out);
	out = CKPT(0, "verify", CK); /* the root: what `latest` names */
	has(out, LAST);
	free(out);
	out = CKPT(0, "verify", "--all", CK);
	has(out, "step-00000002: ok");
	has(out, "2 checkpoints, all intact");
	free(out);

	/* a byte flipped in a copy */
	const char *bad = path("bad");
	copy_dir(LAST, bad);
	char shard[700];
	snprintf(shard, sizeof shard, "%s/rank-00001-of-00002.bin", bad);
	FILE *f = fopen(shard, "r+b");
	assert_non_null(f);
	fseek(f, 123457, SEEK_SET);
	int ch = fgetc(f);
	fseek(f, 123457, SEEK_SET);
	fputc(ch ^ 0x10, f);
	fclose(f);
	out = CKPT(1, "verify", bad);
	has(out, "ok   rank-00000-of-00002.bin");
	has(out, "BAD  checkpoint shard ");
	has(out, "rank-00001-of-00002.bin is damaged: SHA-256");
	has(out, "DAMAGED: 1 of 2 files bad");
	free(out);
	/* export and reshard refuse it, leaving nothing behind */
	out = CKPT(1, "export", bad, "-o", path("bad.safetensors"));
	has(out, "rank-00001-of-00002.bin is damaged");
	has(out, "refusing to export");
	assert_false(exists(path("bad.safetensors")));
	free(out);
	out = CKPT(1, "reshard", bad, path("bad3"), "--world", "3");
	has(out, "refusing to reshard");
	assert_false(exists(path("bad3")));
	assert_false(exists(path("bad3.partial")));
	free(out);
	/* a missing file */
	assert_int_equal(unlink(shard), 0);
	out = CKPT(1, "verify", bad);
	has(out, "rank-00001-of-00002.bin: No such file or directory");
	free(out);
}

/* ---- export ---- */

static void test_export_raw(void **state)
{
	(void)state;
	char *out = CKPT(0, "export", LAST, "--format", "raw", "-o", path("raw.bin"));
	has(out, "6 parameters, 1863690 floats");
	free(out);
	same_bytes(path("raw.bin"), PARAMS);
	/* a root exports what `latest` names; --output= works too */
	out = CKPT(0, "export", CK, "--format=raw", "--output", path("raw2.bin"));
	free(out);
	same_bytes(path("raw2.bin"), PARAMS);
	/* onto the checkpoint's own files, into its directory, or onto the
	 * root's latest: refused, the checkpoint intact (a shard was
	 * replaced by the export, exit 0) */
	char shard[700], fresh_in[700], latest[700];
	snprintf(shard, sizeof shard, "%s/rank-00000-of-00002.bin", LAST);
	snprintf(fresh_in, sizeof fresh_in, "%s/model.safetensors", LAST);
	snprintf(latest, sizeof latest, "%s/latest", CK);
	const char *onto[3] = {shard, fresh_in, latest};
	for (int k = 0; k < 3; k++) {
		out = CKPT(2, "export", k ? CK : LAST, "-o", onto[k]);
		has(out, k < 2 ? "is a checkpoint's directory (it holds manifest.json)"
			       : "is the checkpoint root's latest");
		free(out);
	}
	/* ... and through a symbolic link to its manifest or a shard (the
	 * file it leads to was replaced, exit 0, the checkpoint damaged) */
	char manifest[700];
	snprintf(manifest, sizeof manifest, "%s/manifest.json", LAST);
	const char *to[2] = {manifest, shard};
	for (int k = 0; k < 2; k++) {
		const char *link = path(k ? "to-shard.bin" : "to-manifest.st");
		unlink(link);
		assert_int_equal(symlink(to[k], link), 0);
		out = CKPT(2, "export", LAST, "--format", k ? "raw" : "safetensors", "-o", link);
		has(out, "is a checkpoint's directory (it holds manifest.json)");
		free(out);
		unlink(link);
	}
	free(CKPT(0, "verify", CK));
}

static uint64_t le64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* The safetensors file, read by the spec: 8-byte little-endian N, N bytes
 * of JSON (spaces after it allowed), then the tensors back to back. */
static void check_safetensors(const char *file, const unsigned char *raw, size_t rawlen,
			      const char *step)
{
	static const char *names[] = {"fc1.weight", "fc1.bias", "fc2.weight",
				      "fc2.bias",   "fc3.weight", "fc3.bias"};
	size_t len;
	unsigned char *st = read_all(file, &len);
	assert_non_null(st);
	assert_true(len >= 8);
	uint64_t n = le64(st);
	assert_true(8 + n <= len);
	assert_int_equal((8 + n) % 8, 0); /* the data is 8-byte aligned */
	assert_int_equal(st[8], '{');
	const char *jend = NULL;
	cJSON *h = cJSON_ParseWithLengthOpts((const char *)st + 8, n, &jend, 0);
	if (!h)
		fail_msg("the header is not JSON");
	for (const char *q = jend; q < (const char *)st + 8 + n; q++)
		assert_int_equal(*q, ' '); /* padding: spaces only */
	const cJSON *meta = cJSON_GetObjectItemCaseSensitive(h, "__metadata__");
	assert_true(cJSON_IsObject(meta));
	assert_string_equal(cJSON_GetObjectItemCaseSensitive(meta, "format")->valuestring, "pt");
	if (step) /* hpu-ckpt export's; --save-params has none */
		assert_string_equal(cJSON_GetObjectItemCaseSensitive(meta, "step")->valuestring, step);
	const cJSON *m;
	cJSON_ArrayForEach(m, meta) assert_true(cJSON_IsString(m)); /* values are strings */
	const unsigned char *data = st + 8 + n;
	uint64_t datalen = len - 8 - n, end = 0, canon = 0;
	int k = 0;
	const cJSON *t;
	cJSON_ArrayForEach(t, h) {
		if (!strcmp(t->string, "__metadata__"))
			continue;
		assert_true(k < 6);
		assert_string_equal(t->string, names[k]);
		assert_string_equal(cJSON_GetObjectItemCaseSensitive(t, "dtype")->valuestring, "F32");
		const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape"), *d;
		const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
		uint64_t numel = 1;
		cJSON_ArrayForEach(d, shape) numel *= (uint64_t)d->valuedouble;
		assert_int_equal(cJSON_GetArraySize(off), 2);
		uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble,
			 e = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
		assert_int_equal(b, end); /* contiguous, in order */
		assert_int_equal(e - b, numel * 4);
		assert_true(e <= datalen);
		/* the tensor is the parameter's floats of the --save-params file */
		assert_true((canon + numel) * 4 <= rawlen);
		if (memcmp(data + b, raw + canon * 4, numel * 4) != 0)
			fail_msg("tensor %s differs from its floats in the --save-params file",
				 t->string);
		canon += numel;
		end = e;
		k++;
	}
	assert_int_equal(k, 6);
	assert_int_equal(end, datalen); /* nothing after the last tensor */
	assert_int_equal(canon * 4, rawlen);
	printf("  safetensors: header %llu bytes, %d tensors, %llu data bytes: equal to the "
	       "--save-params file\n",
	       (unsigned long long)n, k, (unsigned long long)datalen);
	cJSON_Delete(h);
	free(st);
}

/* Loads the file in Python (safetensors if installed, else json + struct +
 * torch.frombuffer) and compares every tensor with torch.equal. */
static const char *py_check =
	"import json, struct, sys, torch\n"
	"st, raw = sys.argv[1], sys.argv[2]\n"
	"b = open(raw, 'rb').read()\n"
	"flat = torch.frombuffer(bytearray(b), dtype=torch.float32)\n"
	"try:\n"
	"    from safetensors.torch import load_file\n"
	"    tensors, how = load_file(st), 'safetensors.torch.load_file'\n"
	"except ImportError:\n"
	"    d = open(st, 'rb').read()\n"
	"    n = struct.unpack('<Q', d[:8])[0]\n"
	"    head = json.loads(d[8:8 + n])\n"
	"    assert head['__metadata__']['format'] == 'pt'\n"
	"    data = d[8 + n:]\n"
	"    tensors, how = {}, 'json + struct + torch.frombuffer'\n"
	"    for k, v in head.items():\n"
	"        if k == '__metadata__': continue\n"
	"        assert v['dtype'] == 'F32'\n"
	"        s, e = v['data_offsets']\n"
	"        tensors[k] = torch.frombuffer(bytearray(data[s:e]), dtype=torch.float32).reshape(v['shape'])\n"
	"at = 0\n"
	"for k in ['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias', 'fc3.weight', 'fc3.bias']:\n"
	"    t = tensors[k]\n"
	"    want = flat[at:at + t.numel()].reshape(t.shape)\n"
	"    assert torch.equal(t, want), k\n"
	"    at += t.numel()\n"
	"assert at == flat.numel() and len(tensors) == 6\n"
	"print('python-check ok: %d tensors (%d floats) loaded with %s under torch %s, each torch.equal to the --save-params floats' % (len(tensors), at, how, torch.__version__))\n";

static void test_export_safetensors(void **state)
{
	(void)state;
	const char *st = path("weights.safetensors");
	char *out = CKPT(0, "export", LAST, "-o", st);
	has(out, "safetensors");
	free(out);
	size_t rawlen;
	unsigned char *raw = read_all(PARAMS, &rawlen);
	assert_non_null(raw);
	check_safetensors(st, raw, rawlen, "4");
	free(raw);
	/* Python, where /usr/bin/python3 has torch */
	if (access(PYTHON, X_OK) != 0 ||
	    system(PYTHON " -c 'import torch' >/dev/null 2>&1") != 0) {
		printf("  python check skipped: %s cannot import torch\n", PYTHON);
		return;
	}
	write_all(path("check.py"), py_check, strlen(py_check));
	out = RUN(0, PYTHON, path("check.py"), st, PARAMS);
	has(out, "python-check ok: 6 tensors");
	printf("  %s", strstr(out, "python-check"));
	free(out);
}


/* ---- --save-params and --load-params: safetensors by name ---- */

/* One step at learning rate 0 on `device` from --load-params `from`,
 * saving to `to`, the MLP `hidden` wide: the parameters go through
 * unchanged. Returns the
 * output; asserts exit `want`. */
static char *pass_through(int want, const char *device, const char *from, const char *to,
			  const char *hidden)
{
	return run_v(want, (const char *[]){LAUNCH, "-q", "--devices", "1", "--device", device,
					    "--batch-size", BATCH, "--max-steps", "1", "--lr", "0",
					    "--no-eval", "--log-every", "0", "--load-params", from,
					    "--save-params", to, MODEL, "--hidden", hidden, NULL});
}

static void test_params_safetensors_roundtrip(void **state)
{
	(void)state;
	const char *st = path("rt-export.safetensors");
	char cpu[700], strict[700];
	snprintf(cpu, sizeof cpu, "%s", path("rt-cpu.safetensors"));
	snprintf(strict, sizeof strict, "%s", path("rt-strict.safetensors"));
	free(CKPT(0, "export", LAST, "-o", st));
	/* export -> --load-params by name -> --save-params, on both devices */
	free(pass_through(0, "cpu", st, cpu, "1024"));
	free(pass_through(0, "cpu-strict", st, strict, "1024"));
	same_bytes(cpu, strict);
	size_t rawlen;
	unsigned char *raw = read_all(PARAMS, &rawlen);
	assert_non_null(raw);
	check_safetensors(cpu, raw, rawlen, NULL);
	free(raw);
	/* the bare array: by its name, and on request */
	free(pass_through(0, "cpu", PARAMS, path("rt.bin"), "1024"));
	same_bytes(path("rt.bin"), PARAMS);
	free(run_v(0, (const char *[]){LAUNCH, "-q", "--devices", "1", "--batch-size", BATCH,
				       "--max-steps", "1", "--lr", "0", "--no-eval", "--log-every",
				       "0", "--load-params", cpu, "--save-params", path("rt-raw"),
				       "--save-params-format", "raw", MODEL, NULL}));
	same_bytes(path("rt-raw"), PARAMS);
}

/* made by tests/fixtures/make_mlp_torch_safetensors.py */
static const char *torch_fixture(void)
{
	static char p[700];
	const char *src = getenv("HPU_SOURCE_DIR");
	snprintf(p, sizeof p, "%s/tests/fixtures/mlp_h8_torch.safetensors", src ? src : ".");
	return p;
}
#define TORCH_FIXTURE torch_fixture()

/* The floats of tensor `name` in safetensors image st (n bytes). */
static const unsigned char *st_tensor(const unsigned char *st, size_t n, const char *name,
				      size_t *bytes)
{
	uint64_t h = le64(st);
	cJSON *j = cJSON_ParseWithLength((const char *)st + 8, h);
	assert_non_null(j);
	const cJSON *off = cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(j, name), "data_offsets");
	assert_non_null(off);
	uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble,
		 e = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
	cJSON_Delete(j);
	assert_true(8 + h + e <= n);
	*bytes = e - b;
	return st + 8 + h + b;
}

static void test_load_params_torch(void **state)
{
	(void)state;
	static const char *names[] = {"fc1.weight", "fc1.bias", "fc2.weight",
				      "fc2.bias",   "fc3.weight", "fc3.bias"};
	size_t n, m;
	unsigned char *st = read_all(TORCH_FIXTURE, &n);
	assert_non_null(st);
	free(pass_through(0, "cpu", TORCH_FIXTURE, path("torch.bin"), "8"));
	unsigned char *got = read_all(path("torch.bin"), &m);
	assert_non_null(got);
	size_t at = 0; /* raw: declaration order; the fixture's is reversed */
	for (int i = 0; i < 6; i++) {
		size_t bytes;
		const unsigned char *want = st_tensor(st, n, names[i], &bytes);
		assert_true(at + bytes <= m);
		if (memcmp(got + at, want, bytes))
			fail_msg("%s: not the state_dict's floats", names[i]);
		at += bytes;
	}
	assert_int_equal(at, m);
	printf("  torch state_dict: 6 tensors, %zu floats, loaded by name\n", at / 4);
	/* renamed: fc2.bias -> fc2.bian */
	unsigned char *bad = malloc(n + 1);
	assert_non_null(bad);
	memcpy(bad, st, n);
	bad[n] = '\0'; /* strstr ends there */
	char *q = strstr((char *)bad + 8, "\"fc2.bias\"");
	assert_non_null(q);
	memcpy(q, "\"fc2.bian\"", 10);
	write_all(path("renamed.safetensors"), bad, n);
	char *out = pass_through(1, "cpu", path("renamed.safetensors"), path("x.bin"), "8");
	char want[1200];
	has(out, "tensor \"fc2.bian\" is not a parameter of");
	snprintf(want, sizeof want, "is not a parameter of %s (saved from another model, or renamed?)",
		 MODEL);
	has(out, want);
	free(out);
	/* fc2.weight [8, 8] -> [64]: as many floats, another shape */
	memcpy(bad, st, n);
	q = strstr((char *)bad + 8, "\"fc2.weight\":{\"dtype\":\"F32\",\"shape\":[8,8]");
	assert_non_null(q);
	memcpy(strstr(q, "[8,8]"), "[64] ", 5);
	write_all(path("reshaped.safetensors"), bad, n);
	out = pass_through(1, "cpu", path("reshaped.safetensors"), path("x.bin"), "8");
	has(out, "parameter \"fc2.weight\" is F32 [64] in the file, but");
	snprintf(want, sizeof want, "in the file, but %s declares F32 %s", MODEL, "[8, 8]");
	has(out, want);
	free(out);
	/* a model of another width: fc1.weight is missing its shape */
	out = pass_through(1, "cpu", TORCH_FIXTURE, path("x.bin"), "16");
	has(out, "parameter \"fc1.weight\" is F32 [8, 784] in the file");
	free(out);
	free(bad);
	free(got);
	free(st);
}

/* ---- training from PyTorch's weights follows PyTorch ---- */

/* tests/fixtures/refs/mlp_h8_torch_train.txt (written by tests/fixtures/
 * torch_mlp_train.py): the options, as "KEY VALUE" lines, and PyTorch's
 * loss at each step, as "loss STEP VALUE" lines. */
#define REF_KEYS 16
#define REF_STEPS 64
typedef struct torch_ref {
	char key[REF_KEYS][24], val[REF_KEYS][32];
	int nkeys, steps;
	double loss[REF_STEPS + 1];
} torch_ref;

static const char *ref_get(const torch_ref *r, const char *key)
{
	for (int i = 0; i < r->nkeys; i++)
		if (!strcmp(r->key[i], key))
			return r->val[i];
	fail_msg("the PyTorch reference has no \"%s\"", key);
	return NULL;
}

static void read_torch_ref(torch_ref *r)
{
	char file[700], line[256];
	const char *src = getenv("HPU_SOURCE_DIR");
	snprintf(file, sizeof file, "%s/tests/fixtures/refs/mlp_h8_torch_train.txt",
		 src ? src : ".");
	FILE *f = fopen(file, "r");
	if (!f)
		fail_msg("cannot open %s", file);
	memset(r, 0, sizeof *r);
	while (fgets(line, sizeof line, f)) {
		int step;
		double v;
		if (line[0] == '#' || line[0] == '\n')
			continue;
		if (sscanf(line, "loss %d %lf", &step, &v) == 2) {
			assert_int_equal(step, r->steps + 1);
			assert_true(step <= REF_STEPS);
			r->loss[++r->steps] = v;
		} else {
			assert_true(r->nkeys < REF_KEYS);
			assert_int_equal(sscanf(line, "%23s %31s", r->key[r->nkeys], r->val[r->nkeys]), 2);
			r->nkeys++;
		}
	}
	fclose(f);
	assert_int_equal(r->steps, atoi(ref_get(r, "steps")));
}

/* The loss of `step` in a metrics file's text, NAN if none. */
static double loss_at(const char *metrics, int step)
{
	char key[48];
	snprintf(key, sizeof key, "{\"step\":%d,", step);
	const char *p = strstr(metrics, key), *l = p ? strstr(p, "\"loss\":") : NULL;
	return l ? strtod(l + 7, NULL) : NAN;
}

/* Trains the MLP --hidden 8 from --load-params `params` with the
 * reference's options; returns the largest relative difference of a
 * step's loss from PyTorch's (and prints the first step beyond 1e-5). */
static double torch_ref_diff(const torch_ref *r, const char *params)
{
	const char *m = path("torch-train.jsonl");
	unlink(m);
	free(run_v(0, (const char *[]){LAUNCH, "-q", "--devices", "1", "--precision", "fp32",
				       "--seed", ref_get(r, "seed"), "--batch-size",
				       ref_get(r, "batch"), "--max-steps", ref_get(r, "steps"),
				       "--optimizer", ref_get(r, "optimizer"), "--lr",
				       ref_get(r, "lr"), "--weight-decay", ref_get(r, "weight_decay"),
				       "--beta1", ref_get(r, "beta1"), "--beta2", ref_get(r, "beta2"),
				       "--eps", ref_get(r, "eps"), "--scheduler", "constant",
				       "--no-eval", "--log-every", "1", "--metrics", m,
				       "--load-params", params, MODEL, "--", "--hidden", "8", NULL}));
	char *s = h_slurp(m);
	assert_non_null(s);
	double worst = 0;
	for (int step = 1; step <= r->steps; step++) {
		double got = loss_at(s, step), rel = fabs(got - r->loss[step]) / r->loss[step];
		if (!isfinite(got))
			fail_msg("no loss for step %d in %s", step, m);
		if (rel > 1e-5 && worst <= 1e-5)
			printf("  step %d: loss %.9g, PyTorch %.9g, relative difference %.3g\n", step,
			       got, r->loss[step], rel);
		worst = rel > worst ? rel : worst;
	}
	free(s);
	return worst;
}

/* PyTorch's state_dict (mlp_h8_torch.safetensors), loaded by name, trains
 * on as PyTorch trains it: every step's loss within 1e-5 relative of
 * PyTorch 1.13's on the same batches with the same AdamW. The same floats
 * loaded in the file's order (a bare array: fc3.bias first) or with one
 * bias moved by 0.01 do not. */
static void test_load_params_torch_trains(void **state)
{
	(void)state;
	torch_ref r;
	read_torch_ref(&r);
	double d = torch_ref_diff(&r, TORCH_FIXTURE);
	printf("  %d steps from the torch state_dict: loss within %.3g relative of PyTorch's\n",
	       r.steps, d);
	assert_true(d <= 1e-5);
	assert_true(r.loss[r.steps] < r.loss[1]); /* it trains */
	/* the data section alone: the floats in the file's order, as raw */
	size_t n;
	unsigned char *st = read_all(TORCH_FIXTURE, &n);
	assert_non_null(st);
	size_t h = 8 + (size_t)le64(st);
	write_all(path("torch-file-order.bin"), st + h, n - h);
	d = torch_ref_diff(&r, path("torch-file-order.bin"));
	printf("  the same floats in the file's order: %.3g relative\n", d);
	assert_true(d > 1e-5);
	/* fc3.bias[0] + 0.01 */
	size_t bytes;
	size_t at = (size_t)(st_tensor(st, n, "fc3.bias", &bytes) - st);
	float f;
	memcpy(&f, st + at, sizeof f);
	f += 0.01f;
	memcpy(st + at, &f, sizeof f);
	write_all(path("torch-moved.safetensors"), st, n);
	d = torch_ref_diff(&r, path("torch-moved.safetensors"));
	printf("  fc3.bias[0] moved by 0.01: %.3g relative\n", d);
	assert_true(d > 1e-5);
	free(st);
}

/* ---- reshard ---- */

/* The manifest of dir without world_size, strategy, files and its digest
 * (of the rest, which differs), which it must have. */
static cJSON *manifest_rest(const char *dir)
{
	char p[700];
	snprintf(p, sizeof p, "%s/manifest.json", dir);
	size_t n;
	unsigned char *text = read_all(p, &n);
	assert_non_null(text);
	cJSON *m = cJSON_ParseWithLength((const char *)text, n);
	free(text);
	assert_non_null(m);
	cJSON_DeleteItemFromObjectCaseSensitive(m, "world_size");
	cJSON_DeleteItemFromObjectCaseSensitive(m, "strategy");
	cJSON_DeleteItemFromObjectCaseSensitive(m, "files");
	cJSON_DeleteItemFromObjectCaseSensitive(m, "resharded_from"); /* a copy's origin */
	assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "manifest_sha256")));
	cJSON_DeleteItemFromObjectCaseSensitive(m, "manifest_sha256");
	return m;
}

static void test_reshard_resume(void **state)
{
	(void)state;
	const char *r3 = path("r3");
	char *out = CKPT(0, "reshard", LAST, r3, "--world", "3");
	has(out, "3 shards for 3 x zero3");
	free(out);
	assert_false(exists(path("r3.partial")));
	out = CKPT(0, "verify", r3);
	has(out, "ok   rank-00000-of-00003.bin");
	has(out, "ok   rank-00002-of-00003.bin");
	has(out, "ok: 3 files");
	free(out);
	out = CKPT(0, "info", r3);
	has(out, "world size    3\n");
	has(out, "strategy      zero3\n");
	has(out, "rank-00001-of-00003.bin");
	/* the copy says where it came from: a resume names it */
	has(out, "resharded     by hpu-ckpt reshard, from 2 workers under zero3\n");
	free(out);
	cJSON *a = manifest_rest(LAST), *b = manifest_rest(r3);
	assert_true(cJSON_Compare(a, b, 1));
	cJSON_Delete(a);
	cJSON_Delete(b);
	/* the weights, bit for bit */
	out = CKPT(0, "export", r3, "--format", "raw", "-o", path("r3.raw"));
	free(out);
	same_bytes(path("r3.raw"), PARAMS);
	/* DST must not exist */
	out = CKPT(1, "reshard", LAST, r3, "--world", "2");
	has(out, "already exists");
	free(out);

	/* 3 workers resume from it and train one step more */
	char steps[16];
	snprintf(steps, sizeof steps, "%d", STEPS + 1);
	out = RUN(0, LAUNCH, "-q", "--devices", "3", "--strategy", "zero3", "--batch-size", BATCH,
		  "--max-steps", steps, "--no-eval", "--log-every", "0", "--resume", r3,
		  "--save-params", path("r3-next.bin"), MODEL);
	has(out, "resumed from ");
	has(out, "at step 4");
	has(out, "trained 5 steps on 3 workers");
	free(out);
	size_t n;
	unsigned char *next = read_all(path("r3-next.bin"), &n);
	assert_non_null(next);
	free(next);

	/* one shard, another strategy */
	const char *r1 = path("r1");
	out = CKPT(0, "reshard", CK, r1, "--world=1", "--strategy", "ddp");
	free(out);
	out = CKPT(0, "verify", r1);
	has(out, "ok: 1 file,");
	free(out);
	out = CKPT(0, "info", r1);
	has(out, "world size    1\n");
	has(out, "strategy      ddp\n");
	free(out);
	/* Lightning's name for a strategy, as --strategy takes it: the
	 * manifest names the strategy as hpulaunch does */
	out = CKPT(0, "reshard", CK, path("r1-ds"), "--world=1", "--strategy", "deepspeed_stage_2");
	free(out);
	out = CKPT(0, "info", path("r1-ds"));
	has(out, "strategy      zero2\n");
	free(out);
	/* zero3's placement plan is not ddp's: dropped, the rest kept (the
	 * same strategy kept it above) */
	a = manifest_rest(LAST);
	b = manifest_rest(r1);
	assert_non_null(cJSON_GetObjectItemCaseSensitive(a, "placement"));
	assert_null(cJSON_GetObjectItemCaseSensitive(b, "placement"));
	cJSON_DeleteItemFromObjectCaseSensitive(a, "placement");
	assert_true(cJSON_Compare(a, b, 1));
	cJSON_Delete(a);
	cJSON_Delete(b);
	out = CKPT(0, "export", r1, "--format", "raw", "-o", path("r1.raw"));
	free(out);
	same_bytes(path("r1.raw"), PARAMS);
}

/* ---- damaged manifests ---- */

/* A copy of LAST as T/name whose manifest has `key` of the object `in`
 * (the top level when NULL; "parameters": the first parameter) set to
 * the JSON text `value`. */
static const char *edited_copy(const char *name, const char *in, const char *key,
			       const char *value)
{
	const char *dir = path(name);
	char mp[700];
	copy_dir(LAST, dir);
	snprintf(mp, sizeof mp, "%s/manifest.json", dir);
	size_t n;
	unsigned char *text = read_all(mp, &n);
	assert_non_null(text);
	cJSON *m = cJSON_ParseWithLength((const char *)text, n), *o = m;
	free(text);
	assert_non_null(m);
	if (in)
		o = cJSON_GetObjectItemCaseSensitive(m, in);
	if (cJSON_IsArray(o))
		o = cJSON_GetArrayItem(o, 0);
	cJSON *v = cJSON_Parse(value);
	assert_non_null(o);
	assert_non_null(v);
	assert_true(cJSON_ReplaceItemInObjectCaseSensitive(o, key, v));
	char *out = cJSON_Print(m);
	write_all(mp, out, strlen(out));
	free(out);
	cJSON_Delete(m);
	return dir;
}

static void test_manifest_checked(void **state)
{
	(void)state;
	static const struct {
		const char *in, *key, *value, *says;
	} bad[] = {
		{NULL, "world_size", "2147483648", "world_size 2147483648 is out of range"},
		{NULL, "world_size", "0", "world_size 0 is out of range"},
		{NULL, "world_size", "3", "world_size 3, but 2 files listed"},
		{NULL, "strategy", "\"zero9\"",
		 "strategy \"zero9\" is not one of fast_ddp, ddp, zero1, zero2, zero3"},
		{"parameters", "dtype", "\"F128\"", "parameter fc1.weight: dtype \"F128\" is not one of F32"},
		{NULL, "precision", "\"fp64\"",
		 "precision \"fp64\" is not one of fp32, bf16-mixed, 16-mixed, fp8"},
		{NULL, "optimizer", "\"lamb\"", "optimizer \"lamb\" is not one of sgd, adamw, adam"},
		{NULL, "optimizer", "\"sgd\"",
		 "sections params, exp_avg, exp_avg_sq are not the state of optimizer sgd"},
		{NULL, "sections", "[\"params\", \"exp_avg\", \"exp_avg\"]",
		 "section \"exp_avg\" is listed twice"},
		{NULL, "sections", "[\"params\", \"ema\"]", "section \"ema\" is not one of"},
		{NULL, "step", "-1", "step -1 is out of range"},
		{NULL, "epoch", "0.5", "epoch 0.5 is out of range"},
		{NULL, "global_batch", "0", "global_batch 0 is out of range"},
		{NULL, "numel", "5", "numel 5, but the parameters hold 1863690 floats"},
		{"parameters", "shape", "[1024.5, 784]", "parameter fc1.weight has a bad shape"},
		{"scheduler", "type", "\"exponential\"",
		 "scheduler: type \"exponential\" is not one of constant, step, cosine"},
		{"scheduler", "lr", "1e300", "scheduler: lr 1e+300 is out of range"},
		{"loss_scaler", "scale", "-1", "loss_scaler: scale -1 is out of range"},
		{"rng", "seed", "\"-5\"", "rng: seed \"-5\" is not a whole number"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char name[32];
		snprintf(name, sizeof name, "edited%zu", i);
		const char *dir = edited_copy(name, bad[i].in, bad[i].key, bad[i].value);
		printf("  %s %s = %s\n", bad[i].in ? bad[i].in : "", bad[i].key, bad[i].value);
		char *out = CKPT(1, "info", dir);
		has(out, "manifest.json: ");
		has(out, bad[i].says);
		free(out);
		out = CKPT(1, "verify", dir);
		has(out, bad[i].says);
		free(out);
		/* reshard copies the manifest: it must not spread the damage */
		char dst[64];
		snprintf(dst, sizeof dst, "%s-r", name);
		out = CKPT(1, "reshard", dir, path(dst), "--world", "3");
		has(out, bad[i].says);
		assert_false(exists(path(dst)));
		free(out);
	}
}

/* ---- the manifest itself, and whose files ---- */

/* An edit of any field of the run's state that stays in range is caught:
 * the manifest carries the SHA-256 of its own content. */
static void test_manifest_sealed(void **state)
{
	(void)state;
	static const struct {
		const char *in, *key, *value;
	} edits[] = {
		{NULL, "step", "3"},
		{NULL, "optimizer_steps", "9"},
		{"scheduler", "lr", "0.5"},
		{"scheduler", "type", "\"cosine\""},
		{"rng", "seed", "\"7\""},
		{NULL, "epoch", "2"},
		{NULL, "batch_in_epoch", "1"},
		{NULL, "global_batch", "96"},
	};
	for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
		char name[32];
		snprintf(name, sizeof name, "altered%zu", i);
		const char *dir = edited_copy(name, edits[i].in, edits[i].key, edits[i].value);
		printf("  %s %s = %s\n", edits[i].in ? edits[i].in : "", edits[i].key,
		       edits[i].value);
		char *out = CKPT(1, "verify", dir);
		has(out, "manifest.json was altered after it was written: its content's SHA-256 is ");
		has(out, "DAMAGED");
		free(out);
		out = CKPT(1, "export", dir, "-o", path("altered.safetensors"));
		has(out, "was altered after it was written");
		free(out);
	}
	assert_false(exists(path("altered.safetensors")));
	/* the digest is over the content, not the layout: the manifest
	 * printed compactly still verifies */
	const char *dir = path("compact");
	char mp[700];
	copy_dir(LAST, dir);
	snprintf(mp, sizeof mp, "%s/manifest.json", dir);
	size_t n;
	unsigned char *text = read_all(mp, &n);
	cJSON *m = cJSON_ParseWithLength((const char *)text, n);
	free(text);
	assert_non_null(cJSON_GetObjectItemCaseSensitive(m, "manifest_sha256"));
	char *compact = cJSON_PrintUnformatted(m);
	write_all(mp, compact, strlen(compact));
	/* without the digest (a checkpoint from before it): a warning */
	cJSON_DeleteItemFromObjectCaseSensitive(m, "manifest_sha256");
	free(compact);
	compact = cJSON_PrintUnformatted(m);
	cJSON_Delete(m);
	char *out = CKPT(0, "verify", dir);
	has(out, "ok: 2 files");
	free(out);
	write_all(mp, compact, strlen(compact));
	free(compact);
	out = CKPT(0, "verify", dir);
	has(out, "has no manifest_sha256 (written before hputrain sealed its manifests?): an "
		 "edit of it cannot be detected");
	has(out, "ok: 2 files");
	free(out);
}

/* Another uid's step directory and `latest` in the root (a forgery with
 * consistent digests): verify --all reports them, naming the owner. Needs
 * root, to give the copy to another uid. */
static void test_foreign_owner(void **state)
{
	(void)state;
	if (geteuid() != 0) {
		printf("  not root: no file can be given to another uid; skipped\n");
		skip();
	}
	/* the foreign one is step 2's (a step-N directory holds step N) */
	const char *root = path("forged"), *step = path("forged/step-00000002");
	char latest[700], cmd[2000];
	assert_int_equal(mkdir(root, 0777), 0);
	snprintf(cmd, sizeof cmd, "cp -r '%s' '%s/step-00000004' && cp -r '%s/step-00000002' '%s' && "
		 "printf 'step-00000002\\n' > '%s/latest' && chown -R 65534 '%s' '%s/latest'",
		 LAST, root, CK, step, root, step, root);
	assert_int_equal(system(cmd), 0);
	snprintf(latest, sizeof latest, "%s/latest", root);
	char *out = CKPT(1, "verify", "--all", root);
	has(out, "forged/latest is owned by uid 65534, not by uid 0");
	has(out, "forged/step-00000002 is owned by uid 65534, not by uid 0");
	has(out, "DAMAGE FOUND");
	free(out);
	/* root naming a checkpoint trusts its owner: all of it is 65534's */
	out = CKPT(0, "verify", step);
	has(out, "ok: 2 files");
	free(out);
	/* one foreign shard in a checkpoint of ours */
	snprintf(cmd, sizeof cmd, "chown 0 '%s/latest' && printf 'step-00000004\\n' > '%s/latest' "
		 "&& chown 65534 '%s/step-00000004/rank-00001-of-00002.bin'", root, root, root);
	assert_int_equal(system(cmd), 0);
	out = CKPT(1, "verify", root);
	has(out, "step-00000004/rank-00001-of-00002.bin is owned by uid 65534, not by uid 0");
	free(out);
}

/* A shard that is not a regular file (a FIFO, a link to /dev/zero) or
 * far longer than the manifest says (8 GiB, sparse) is refused at once,
 * without reading it. */
static void test_not_regular(void **state)
{
	(void)state;
	const char *dir = path("odd");
	char shard[700];
	copy_dir(LAST, dir);
	snprintf(shard, sizeof shard, "%s/rank-00001-of-00002.bin", dir);
	assert_int_equal(unlink(shard), 0);
	assert_int_equal(mkfifo(shard, 0644), 0);
	char *out = CKPT(1, "verify", dir);
	has(out, "rank-00001-of-00002.bin: not a regular file (a FIFO)");
	free(out);
	out = CKPT(1, "export", dir, "-o", path("odd.safetensors"));
	has(out, "not a regular file (a FIFO)");
	free(out);
	assert_int_equal(unlink(shard), 0);
	assert_int_equal(symlink("/dev/zero", shard), 0);
	out = CKPT(1, "verify", dir);
	has(out, "rank-00001-of-00002.bin is a symbolic link (not followed: a checkpoint's "
		 "files are regular files)");
	free(out);
	assert_int_equal(unlink(shard), 0);
	FILE *f = fopen(shard, "w");
	assert_non_null(f);
	assert_int_equal(ftruncate(fileno(f), (off_t)8 << 30), 0);
	assert_int_equal(fclose(f), 0);
	out = CKPT(1, "verify", dir);
	has(out, "rank-00001-of-00002.bin is too long: 8589934592 bytes, the manifest says ");
	free(out);
	assert_int_equal(unlink(shard), 0);
}

/* ---- outputs that cannot be written ---- */

static void test_full_disk(void **state)
{
	(void)state;
	/* a link to /dev/full (every write: ENOSPC); a rename would replace
	 * the link, never the device */
	const char *full = path("full");
	assert_int_equal(symlink("/dev/full", full), 0);
	const char *formats[] = {"safetensors", "raw"};
	for (int i = 0; i < 2; i++) {
		char *out = CKPT(1, "export", LAST, "--format", formats[i], "-o", full);
		has(out, full);
		has(out, "No space left on device");
		free(out);
		struct stat st;
		assert_int_equal(lstat(full, &st), 0);
		assert_true(S_ISLNK(st.st_mode));
	}
	/* a link to a regular file: the file gets the weights, the link stays
	 * (a rename onto the link would have replaced it, /dev/stdout too) */
	const char *link = path("link.raw");
	write_all(path("target.raw"), "old", 3);
	assert_int_equal(symlink("target.raw", link), 0);
	free(CKPT(0, "export", LAST, "--format", "raw", "-o", link));
	struct stat st;
	assert_int_equal(lstat(link, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	same_bytes(path("target.raw"), PARAMS);
	/* what info prints, into a full standard output */
	char *out = RUN(1, "/bin/sh", "-c", "exec \"$0\" info \"$1\" >/dev/full", TOOL, LAST);
	has(out, "standard output");
	has(out, "No space left on device");
	free(out);
}

/* -o naming standard output (/dev/stdout, /proc/self/fd/1, the file
 * stdout is redirected to): the weights alone on stdout, into a pipe or
 * a file, and "exported ..." on stderr; before, it followed the weights
 * on stdout (into a pipe) or was lost (a file renamed over). */
static void test_export_stdout(void **state)
{
	(void)state;
	static const char *const scripts[] = {
		"exec \"$0\" export --format raw \"$1\" -o /dev/stdout 2>\"$2.err\" | cat >\"$2\"",
		"exec \"$0\" export --format raw \"$1\" -o /proc/self/fd/1 2>\"$2.err\" | cat >\"$2\"",
		"exec \"$0\" export --format raw \"$1\" -o /dev/stdout 2>\"$2.err\" >\"$2\"",
		"exec \"$0\" export --format raw \"$1\" -o \"$2\" 2>\"$2.err\" >\"$2\"",
		/* - is standard output (it wrote a file named -) */
		"exec \"$0\" export --format raw \"$1\" -o - 2>\"$2.err\" | cat >\"$2\"",
	};
	for (size_t k = 0; k < sizeof scripts / sizeof scripts[0]; k++) {
		char got[700], err[720];
		snprintf(got, sizeof got, "%s/stdout%zu.raw", T, k);
		snprintf(err, sizeof err, "%s.err", got);
		free(RUN(0, "/bin/sh", "-c", scripts[k], TOOL, LAST, got));
		same_bytes(got, PARAMS);
		char *said = h_slurp(err);
		assert_non_null(said);
		has(said, "exported ");
		free(said);
	}
}

/* info on a root: a shard of another size than its manifest's is damaged
 * (exit 1; a truncated shard was listed as fine), and an empty `latest`
 * is said as empty, not as missing. */
static void test_info_root_sizes(void **state)
{
	(void)state;
	char root[600], cmd[2400], shard[800], latest[700];
	snprintf(root, sizeof root, "%s", path("sized"));
	snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp -a '%s' '%s/step-%08d'", root, LAST, root,
		 STEPS);
	assert_int_equal(system(cmd), 0);
	snprintf(latest, sizeof latest, "%s/latest", root);
	assert_int_equal(h_write_file(latest, "", 0644), 0);
	char *out = CKPT(0, "info", root);
	has(out, "(`latest` is empty)");
	has(out, "`latest` is empty; using the newest");
	free(out);
	snprintf(shard, sizeof shard, "%s/step-%08d/rank-00001-of-00002.bin", root, STEPS);
	struct stat st;
	assert_int_equal(stat(shard, &st), 0);
	assert_int_equal(truncate(shard, st.st_size - 100), 0);
	out = CKPT(1, "info", root);
	char want[200];
	snprintf(want, sizeof want, "DAMAGED: rank-00001-of-00002.bin is %lld bytes, the manifest says %lld",
		 (long long)st.st_size - 100, (long long)st.st_size);
	has(out, want);
	free(out);
}

/* A step-N directory holding another step's checkpoint, which resume
 * refuses: reshard will not write one (nor a DST inside a checkpoint's
 * directory), and verify (one, a root, --all) and info on a root report
 * one (a link step-30 -> step-4) as damaged, with resume's sentence;
 * before, reshard wrote both and verify said "all intact". */
static void test_misnamed_step(void **state)
{
	(void)state;
	char root[600], wrong[700], inside[700], right[700], link[700];
	snprintf(root, sizeof root, "%s", path("named"));
	assert_int_equal(mkdir(root, 0755), 0);
	snprintf(wrong, sizeof wrong, "%s/step-00000009", root);
	snprintf(inside, sizeof inside, "%s/sub", LAST);
	snprintf(right, sizeof right, "%s/step-%08d", root, STEPS);
	snprintf(link, sizeof link, "%s/step-00000030", root);
	char *out = CKPT(2, "reshard", LAST, wrong, "--world", "1");
	has(out, "is named for step 9 but holds step 4's checkpoint (its manifest): renamed, or "
		 "a link to another step's directory?");
	free(out);
	assert_false(exists(wrong));
	out = CKPT(2, "reshard", LAST, inside, "--world", "1");
	has(out, "is a checkpoint's directory (it holds manifest.json)");
	free(out);
	assert_false(exists(inside));
	free(CKPT(0, "reshard", LAST, right, "--world", "1"));
	free(CKPT(0, "verify", "--all", root));
	assert_int_equal(symlink("step-00000004", link), 0);
	const char *said = "is named for step 30 but holds step 4's checkpoint (its manifest)";
	out = CKPT(1, "verify", "--all", root);
	has(out, "step-00000030: DAMAGED: ");
	has(out, said);
	has(out, "DAMAGE FOUND");
	free(out);
	out = CKPT(1, "verify", link);
	has(out, said);
	free(out);
	/* export and reshard read no checkpoint verify calls damaged (export
	 * wrote it, "exported ... (step 4)") */
	char exp[720];
	snprintf(exp, sizeof exp, "%s/misnamed.safetensors", root);
	out = CKPT(1, "export", link, "-o", exp);
	has(out, said);
	has(out, "(refusing to export it)");
	free(out);
	assert_false(exists(exp));
	snprintf(exp, sizeof exp, "%s", path("resharded-misnamed"));
	out = CKPT(1, "reshard", link, exp, "--world", "1");
	has(out, "(refusing to reshard it)");
	free(out);
	assert_false(exists(exp));
	/* info lists it, shows `latest`'s details and exits 1 */
	out = CKPT(1, "info", root);
	has(out, "step-00000030  DAMAGED: ");
	has(out, said);
	has(out, "strategy      zero3\n");
	has(out, "1 checkpoint of ");
	has(out, " is unreadable or damaged (listed above)");
	free(out);
	/* DST named for another step: the refusal names the step it holds
	 * (it said "step 0": the checkpoint was closed before) */
	out = CKPT(2, "reshard", LAST, wrong, "--world", "1");
	has(out, "name DST for step 4 (or not step-N)");
	free(out);
	assert_int_equal(unlink(link), 0);
	char empty[720];
	snprintf(empty, sizeof empty, "%s/step-00000099", root);
	assert_int_equal(mkdir(empty, 0755), 0);
	out = CKPT(1, "info", root);
	has(out, "step-00000099  unreadable: cannot read the checkpoint manifest");
	free(out);
}

/* ---- usage ---- */

static void test_usage(void **state)
{
	(void)state;
	free(run_v(2, (const char *[]){TOOL, NULL}));
	char *out = CKPT(2, "frobnicate");
	has(out, "unknown command 'frobnicate'");
	free(out);
	out = CKPT(0, "--help");
	has(out, "usage: hpu-ckpt COMMAND");
	free(out);
	const char *cmds[] = {"info", "verify", "export", "reshard"};
	for (int i = 0; i < 4; i++) {
		out = CKPT(0, cmds[i], "--help");
		has(out, "usage: hpu-ckpt ");
		has(out, cmds[i]);
		free(out);
	}
	free(CKPT(2, "info"));
	free(CKPT(2, "info", LAST, LAST));
	free(CKPT(2, "verify", "--bogus", LAST));
	free(CKPT(2, "export", LAST));
	out = CKPT(2, "export", LAST, "-o", path("x"), "--format", "npz");
	has(out, "--format is safetensors or raw");
	free(out);
	free(CKPT(2, "reshard", LAST, path("x")));
	out = CKPT(2, "reshard", LAST, path("x"), "--world", "0");
	has(out, "--world must be");
	free(out);
	out = CKPT(2, "reshard", LAST, path("x"), "--world", "2", "--strategy", "zero4");
	has(out, "--strategy is");
	free(out);
	out = CKPT(1, "info", path("nothing-here"));
	has(out, "nothing-here: No such file or directory");
	free(out);
	out = CKPT(1, "verify", T); /* a directory without checkpoints */
	has(out, "neither a checkpoint");
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_info),
	    cmocka_unit_test(test_info_loss_scaler),
	    cmocka_unit_test(test_verify),
	    cmocka_unit_test(test_export_raw),
	    cmocka_unit_test(test_export_safetensors),
	    cmocka_unit_test(test_params_safetensors_roundtrip),
	    cmocka_unit_test(test_load_params_torch),
	    cmocka_unit_test(test_load_params_torch_trains),
	    cmocka_unit_test(test_reshard_resume),
	    cmocka_unit_test(test_manifest_checked),
	    cmocka_unit_test(test_manifest_sealed),
	    cmocka_unit_test(test_foreign_owner),
	    cmocka_unit_test(test_not_regular),
	    cmocka_unit_test(test_full_disk),
	    cmocka_unit_test(test_export_stdout),
	    cmocka_unit_test(test_info_root_sizes),
	    cmocka_unit_test(test_misnamed_step),
	    cmocka_unit_test(test_usage),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
