/* Integration tests of a model's buffers in checkpoints: the real
 * hpulaunch, hpu-worker, hpu-ckpt and the fixture buffer_model on
 * loopback, checkpoints on the real filesystem (test_checkpoint has the
 * parameters', the damage and the signals' cases).
 *
 * The fixture buffer_model ( MEAN and BROADCAST buffers updated
 *   by its training forward): 40 steps straight against 20, stop, resume,
 *   20 more: parameters and buffers bit-identical (ddp; zero3 with
 *   gradient accumulation), the checkpoint's buffers file equal to the
 *   buffers at the stop; resharded by hpu-ckpt from 2 to 3 workers (and
 *   read by 3 workers straight from the 2-worker checkpoint): the buffers
 *   and parameters loaded are the saved ones, and training goes on;
 *   export: raw is --save-params' file, safetensors adds the buffers;
 *   models whose buffers differ (none, renamed, reshaped), a checkpoint
 *   without buffers for a model with them, and a damaged or truncated
 *   buffers file are refused naming what is wrong (auto falls back).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/runlib.h"

static char tmp[256];

static int setup(void **state)
{
	(void)state;
	snprintf(tmp, sizeof tmp, "/tmp/hpu-ckpt-buffers-test-%d", (int)getpid());
	mkdir(tmp, 0755);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
	return system(cmd) == 0 ? 0 : -1;
}

#define BMODEL h_build("lib/buffer_model.so")
#define TOOL h_build("bin/hpu-ckpt")
#define BUF_FLOATS 9 /* buffer_model's: running_mean [4], last [2, 2], count [1] */

/* A path under the test's directory. */
static const char *tpath(const char *name)
{
	static char bufs[16][300];
	static int k;
	char *p = bufs[k++ & 15];
	snprintf(p, sizeof bufs[0], "%s/%s", tmp, name);
	return p;
}

/* buffer_model on `devices` workers, a global batch of 48 (which 2 and 3
 * workers and 2 micro-steps divide), 2 epochs of 32 steps, with the
 * options in opts (space-separated), its buffers written to bufs (NULL:
 * not) and the model variant (NULL: the normal one). Asserts exit code
 * `want`; returns the output. */
static char *bm_run(int devices, const char *opts, const char *bufs, const char *variant,
		    int want)
{
	run r;
	char o[1024], margs[400] = "";
	start(&r, devices);
	args(&r, "--batch-size", "48", "--epochs", "2", NULL);
	snprintf(o, sizeof o, "%s", opts);
	for (char *t = strtok(o, " "); t; t = strtok(NULL, " "))
		arg(&r, t);
	if (bufs)
		snprintf(margs, sizeof margs, "--save-buffers %s", bufs);
	if (variant)
		snprintf(margs + strlen(margs), sizeof margs - strlen(margs), "%s--variant %s",
			 bufs ? " " : "", variant);
	return finish_with(&r, want, BMODEL, margs[0] ? margs : NULL);
}

/* hpu-ckpt with the NULL-terminated arguments; asserts exit `want`. */
static char *tool(int want, ...)
{
	const char *argv[16] = {TOOL};
	int n = 1;
	va_list ap;
	va_start(ap, want);
	for (const char *a; n < 15 && (a = va_arg(ap, const char *));)
		argv[n++] = a;
	va_end(ap);
	proc p;
	int code = h_run(&p, (char *const *)argv, NULL, 60000);
	if (code != want) {
		for (int i = 0; i < n; i++)
			fprintf(stderr, "%s ", argv[i]);
		fprintf(stderr, "\nexit %d, wanted %d; output:\n%s\n", code, want, p.out);
	}
	assert_int_equal(code, want);
	char *out = strdup(p.out ? p.out : "");
	h_free(&p);
	return out;
}

/* The count buffer of a buffers file (its last float): training forwards. */
static float bm_count(const char *path)
{
	size_t n;
	float *v = load_params(path, &n);
	assert_int_equal(n, BUF_FLOATS);
	float c = v[n - 1];
	free(v);
	return c;
}

/* 40 steps straight, and 20 + resume + 20: the same parameters and
 * buffers; the checkpoint's buffers file is the buffers at step 20. */
static void buffers_case(const char *strategy, const char *extra, int accum)
{
	char o[700], dir[300], ckb[400];
	const char *straight = tpath("bm-straight.bin"), *sb = tpath("bm-straight-b.bin");
	const char *p20 = tpath("bm-20.bin"), *b20 = tpath("bm-20-b.bin");
	const char *resumed = tpath("bm-resumed.bin"), *rb = tpath("bm-resumed-b.bin");
	snprintf(dir, sizeof dir, "%s/bm-%s-ck", tmp, strategy);
	snprintf(o, sizeof o, "--strategy %s --max-steps 40 %s --save-params %s", strategy,
		 extra ? extra : "", straight);
	free(bm_run(2, o, sb, NULL, 0));

	snprintf(o, sizeof o, "--strategy %s --max-steps 40 %s --checkpoint-dir %s "
		 "--stop-at-step 20 --save-params %s", strategy, extra ? extra : "", dir, p20);
	char *out = bm_run(2, o, b20, NULL, 0);
	out_has(out, "checkpoint: step 20 saved");
	out_has(out, "2 shards and the buffers");
	free(out);
	snprintf(ckb, sizeof ckb, "%s/step-00000020/buffers.bin", dir);
	assert_true(files_same(ckb, b20));

	snprintf(o, sizeof o, "--strategy %s --max-steps 40 %s --checkpoint-dir %s --resume auto "
		 "--save-params %s", strategy, extra ? extra : "", dir, resumed);
	out = bm_run(2, o, rb, NULL, 0);
	out_has(out, "at step 20 (epoch 1, batch 20)");
	free(out);
	int same_p = files_same(straight, resumed), same_b = files_same(sb, rb);
	printf("  buffers %-6s %-16s parameters %s, buffers %s\n", strategy, extra ? extra : "",
	       same_p ? "bit-identical" : "DIFFERENT", same_b ? "bit-identical" : "DIFFERENT");
	assert_true(same_p);
	assert_true(same_b);
	/* the buffers moved after the checkpoint, and the count went on */
	assert_false(files_same(b20, sb));
	assert_true(bm_count(b20) == (float)(20 * accum));
	assert_true(bm_count(rb) == (float)(40 * accum));
}

static void test_buffers_resume(void **state)
{
	(void)state;
	buffers_case("ddp", NULL, 1);
	buffers_case("zero3", "--grad-accum 2", 2);
}

/* A 2-worker zero2 checkpoint of step 20 resharded to 3 workers by
 * hpu-ckpt, and read by 3 workers as it is: the buffers and parameters
 * loaded are the saved ones; training goes on. Export from it. */
static void test_buffers_reshard_export(void **state)
{
	(void)state;
	char o[700];
	const char *dir = tpath("bmr-ck"), *ck = tpath("bmr-ck/step-00000020");
	const char *p20 = tpath("bmr-20.bin"), *b20 = tpath("bmr-20-b.bin");
	const char *dst = tpath("bmr-3"), *pl = tpath("bmr-loaded.bin");
	const char *bl = tpath("bmr-loaded-b.bin");
	const char *metrics = tpath("bmr-3.jsonl");
	snprintf(o, sizeof o,
		 "--strategy zero2 --max-steps 40 --checkpoint-dir %s --stop-at-step 20 "
		 "--save-params %s",
		 dir, p20);
	free(bm_run(2, o, b20, NULL, 0));

	char *out = tool(0, "reshard", ck, dst, "--world", "3", "--strategy", "zero1", NULL);
	out_has(out, "3 shards for 3 x zero1 and the buffers");
	free(out);
	out = tool(0, "verify", dst, NULL);
	out_has(out, "ok   buffers.bin (36 bytes");
	out_has(out, "ok: 4 files");
	free(out);
	out = tool(0, "info", dst, NULL);
	out_has(out, "buffers       3 (9 floats) in buffers.bin");
	out_has(out, "shift.last          [2, 2]  4  sync broadcast");
	out_has(out, "resharded     by hpu-ckpt reshard, from 2 workers under zero2");
	free(out);
	const char *from[] = {dst, ck};
	for (int k = 0; k < 2; k++) {
		/* loads and saves without a step: --max-steps is the checkpoint's */
		snprintf(o, sizeof o,
			 "--strategy zero1 --max-steps 20 --resume %s --save-params %s", from[k],
			 pl);
		out = bm_run(3, o, bl, NULL, 0);
		/* the reshard's origin is said (it said "saved by 3 workers
		 * under zero1") */
		out_has(out, k ? "saved by 2 workers under zero2 (fp32)"
				 : "saved by 2 workers under zero2, resharded by hpu-ckpt for 3 "
				   "under zero1 (fp32)");
		free(out);
		int same_p = files_same(p20, pl), same_b = files_same(b20, bl);
		printf("  buffers: 2 x zero2 -> 3 x zero1 (%s): parameters %s, buffers %s\n",
		       k ? "read as saved" : "hpu-ckpt reshard",
		       same_p ? "bit-identical" : "DIFFERENT",
		       same_b ? "bit-identical" : "DIFFERENT");
		assert_true(same_p);
		assert_true(same_b);
	}
	/* and training goes on from the resharded one, the count too */
	snprintf(o, sizeof o, "--strategy zero1 --max-steps 40 --resume %s --metrics %s", dst,
		 metrics);
	out = bm_run(3, o, bl, NULL, 0);
	out_has(out, "trained 40 steps");
	/* 40 is the model's count: the run says how many it trained itself */
	out_has(out, "resumed at step 20: 20 of those steps trained in this run");
	free(out);
	assert_true(bm_count(bl) == 40.0f);

	/* export: raw is --save-params' file (no buffers, said); safetensors
	 * has the parameters' floats, then the buffers' */
	const char *raw = tpath("bmr.raw"), *st = tpath("bmr.safetensors");
	out = tool(0, "export", ck, "-o", raw, "--format", "raw", NULL);
	out_has(out, "the checkpoint's 3 buffers are not in");
	free(out);
	assert_true(files_same(raw, p20));
	out = tool(0, "export", ck, "-o", st, NULL);
	out_has(out, "1 parameter, 4 floats, and 3 buffers, 9 floats,");
	free(out);
	size_t len, plen, blen;
	unsigned char *f = (unsigned char *)h_slurp_n(st, &len);
	float *pv = load_params(p20, &plen), *bv = load_params(b20, &blen);
	assert_non_null(f);
	assert_true(len > 8);
	uint64_t hlen = 0;
	for (int i = 0; i < 8; i++)
		hlen |= (uint64_t)f[i] << (8 * i);
	assert_int_equal(len, 8 + hlen + (plen + blen) * 4);
	char *header = strndup((const char *)f + 8, (size_t)hlen);
#define ST_F32 "{\"dtype\":\"F32\",\"shape\":"
	out_has(header, "\"shift.scale\":" ST_F32 "[4],\"data_offsets\":[0,16]}");
	out_has(header, "\"shift.last\":" ST_F32 "[2,2],\"data_offsets\":[32,48]}");
	out_has(header, "\"shift.count\":" ST_F32 "[1],\"data_offsets\":[48,52]}");
#undef ST_F32
	assert_memory_equal(f + 8 + hlen, pv, plen * 4);
	assert_memory_equal(f + 8 + hlen + plen * 4, bv, blen * 4);
	free(header);
	free(pv);
	free(bv);
	free(f);
}

/* Resumes buffer_model (variant) from `from` on 2 workers; expects exit
 * `want` and every one of the texts. */
static void bm_resume_expect(const char *from, const char *variant, int want, ...)
{
	char o[600];
	snprintf(o, sizeof o, "--max-steps 12 --resume %s", from);
	char *out = bm_run(2, o, NULL, variant, want);
	va_list ap;
	va_start(ap, want);
	for (const char *t; (t = va_arg(ap, const char *));)
		out_has(out, t);
	va_end(ap);
	free(out);
}

static void test_buffers_refused(void **state)
{
	(void)state;
	char o[600], f[600], cmd[800];
	const char *dir = tpath("bmx-ck"), *ck10 = tpath("bmx-ck/step-00000010");
	const char *plain = tpath("bmx-plain");
	snprintf(o, sizeof o, "--max-steps 10 --checkpoint-dir %s --checkpoint-every 5", dir);
	free(bm_run(2, o, NULL, NULL, 0));
	snprintf(o, sizeof o, "--max-steps 10 --checkpoint-dir %s", plain);
	free(bm_run(2, o, NULL, "none", 0));
	/* a model without the checkpoint's buffers, or with them named or
	 * shaped otherwise; a checkpoint without buffers for a model with */
	bm_resume_expect(ck10, "none", 1,
			 "holds 3 buffers (shift.running_mean, ...), but the model",
			 "declares none", NULL);
	bm_resume_expect(ck10, "renamed", 1, "holds buffer shift.running_mean, which the model",
			 "does not declare", NULL);
	bm_resume_expect(ck10, "reshaped", 1, "buffer shift.last is [2, 2] there, [4] in the model",
			 NULL);
	bm_resume_expect(plain, NULL, 1, "holds no buffers, but the model",
			 "declares 3 (shift.running_mean, ...)", NULL);
	/* the same model without buffers resumes its own checkpoint */
	snprintf(o, sizeof o, "--max-steps 12 --resume %s", plain);
	char *out = bm_run(2, o, NULL, "none", 0);
	out_has(out, "at step 10");
	free(out);
	/* a changed byte of the buffers file: named by verify and resume;
	 * auto falls back to step 5 */
	snprintf(f, sizeof f, "%s/buffers.bin", ck10);
	snprintf(cmd, sizeof cmd,
		 "printf '\\377' | dd of=%s bs=1 seek=13 conv=notrunc 2>/dev/null", f);
	assert_int_equal(system(cmd), 0);
	out = tool(1, "verify", ck10, NULL);
	out_has(out, "BAD  checkpoint buffers file");
	out_has(out, "step-00000010/buffers.bin is damaged: SHA-256");
	out_has(out, "DAMAGED: 1 of 3 files bad");
	free(out);
	out = tool(1, "reshard", ck10, tpath("bmx-3"), "--world", "3", NULL);
	out_has(out, "buffers.bin is damaged");
	out_has(out, "refusing to reshard a damaged checkpoint");
	free(out);
	bm_resume_expect(ck10, NULL, 1, "step-00000010/buffers.bin is damaged: SHA-256", NULL);
	snprintf(o, sizeof o, "--max-steps 12 --checkpoint-dir %s --resume auto", dir);
	out = bm_run(2, o, NULL, NULL, 0);
	out_has(out, "buffers.bin is damaged");
	out_has(out, "falling back to");
	out_has(out, "step-00000005 at step 5");
	free(out);
	/* cut short */
	assert_int_equal(truncate(f, 20), 0);
	bm_resume_expect(ck10, NULL, 1, "step-00000010/buffers.bin is truncated: 20 bytes, the "
			 "manifest says 36", NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_buffers_resume),
		cmocka_unit_test(test_buffers_reshard_export),
		cmocka_unit_test(test_buffers_refused),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
