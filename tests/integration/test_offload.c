/* Integration tests of ZeRO-Offload (--offload-optimizer, --offload-param,
 * DeepSpeed's zero_optimization.offload_optimizer / offload_param): the
 * real hpulaunch, hpu-worker and MLP model.
 *
 * - offloading moves model states, not results: final parameters are
 *   bit-identical to the same run without offload, for every stage it
 *   applies to, in fp32 and bf16-mixed;
 * - the device's and the host tier's accounting follow the formulas
 *   (README, "ZeRO-Offload"); a --device-memory too small for a run
 *   without offload is enough with it;
 * - a DeepSpeed config asking for offload to cpu runs unchanged; what
 *   cannot work is refused with a sentence naming the key or flag.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "runlib.h"

#define SMALL_MODEL "--hidden 96 --depth 3"

/* hpulaunch on 2 workers, `steps` steps of batch 64, then `extra`
 * (NULL-terminated) and the model; saves the parameters to `params` when
 * given; asserts exit code `want`; returns the output. */
static char *offload_run(int want, const char *params, const char *metrics, const char *model,
			 const char *const *extra)
{
	run r;
	start(&r, 2);
	args(&r, "--max-steps", "6", "--batch-size", "64", NULL);
	if (params)
		args(&r, "--save-params", params, NULL);
	if (metrics)
		args(&r, "--metrics", metrics, NULL);
	for (; extra && *extra; extra++)
		arg(&r, *extra);
	return finish(&r, want, model);
}

static void tmp_name(char *buf, size_t len, const char *what)
{
	snprintf(buf, len, "/tmp/hpu-offload-%d-%s", (int)getpid(), what);
}

static void assert_same_file(const char *a, const char *b)
{
	size_t na, nb;
	float *pa = load_params(a, &na), *pb = load_params(b, &nb);
	assert_int_equal(na, nb);
	assert_memory_equal(pa, pb, na * sizeof *pa);
	free(pa);
	free(pb);
}

/* Each stage and precision, each offload DeepSpeed allows there: the
 * same bits as without. */
static void test_offload_bit_identical(void **state)
{
	(void)state;
	static const char *stages[] = {"zero1", "zero2", "zero3"};
	static const char *precisions[] = {"fp32", "bf16-mixed"};
	char ref[96], got[96];
	tmp_name(ref, sizeof ref, "ref.bin");
	tmp_name(got, sizeof got, "got.bin");
	for (int s = 0; s < 3; s++)
		for (int p = 0; p < 2; p++) {
			const char *base[] = {"--strategy", stages[s], "--precision",
					      precisions[p], NULL};
			free(offload_run(0, ref, NULL, SMALL_MODEL, base));
			const char *opt[] = {"--strategy", stages[s], "--precision", precisions[p],
					     "--offload-optimizer", "cpu", NULL};
			const char *both[] = {"--strategy", stages[s], "--precision", precisions[p],
					      "--offload-optimizer", "cpu", "--offload-param", "cpu",
					      NULL};
			const char *param[] = {"--strategy", stages[s], "--precision", precisions[p],
					       "--offload-param", "cpu", NULL};
			const char *const *variants[] = {opt, both, param};
			for (int v = 0; v < (s == 2 ? 3 : 1); v++) {
				printf("  %s %s %s%s\n", stages[s], precisions[p],
				       v == 2 ? "" : "offload-optimizer cpu ",
				       v ? "offload-param cpu" : "");
				free(offload_run(0, got, NULL, SMALL_MODEL, variants[v]));
				assert_same_file(ref, got);
			}
		}
	unlink(ref);
	unlink(got);
}

/* A number in the last "final" record's rank-0 device entry: `key`, or
 * host.`key` when host. */
static double final_stat(const char *metrics, int host, const char *key, double *psi)
{
	char *m = h_slurp(metrics);
	assert_non_null(m);
	const char *fin = strstr(m, "\"final\":true");
	assert_non_null(fin);
	const char *p = strstr(fin, "\"parameters\":");
	assert_non_null(p);
	*psi = atof(p + strlen("\"parameters\":"));
	const char *rec = strstr(fin, "{\"rank\":0,");
	assert_non_null(rec);
	if (host) {
		rec = strstr(rec, "\"host\":");
		assert_non_null(rec);
	}
	char k[64];
	snprintf(k, sizeof k, "\"%s\":", key);
	const char *v = strstr(rec, k);
	assert_non_null(v);
	double x = atof(v + strlen(k));
	free(m);
	return x;
}

/* 784-512x48-10 (Ψ about 12.8 M) in bf16-mixed on N = 2 ranks. Host
 * tier: fp32 master weights and Adam's two moments of the rank's range
 * (12Ψ/N), plus the 16-bit gradient shard under zero2/3 (2Ψ/N), plus the
 * 16-bit parameter shard with --offload-param (2Ψ/N): exact. Device: the
 * 16-bit parameters (2Ψ; zero3: the shard, 2Ψ/N, unless offloaded) and
 * zero1's whole 16-bit gradients (2Ψ), plus what the formulas leave out
 * (each layer's fp32 copies, gradient buckets, zero3's live layers). */
#define DEEP_MODEL "--hidden 512 --depth 48"
#define DEEP_EXTRA (4.0 * (600000 + 6 * 262656))

static void test_offload_memory_formulas(void **state)
{
	(void)state;
	static const struct {
		const char *strategy;
		int param;
		double dev, host; /* in Ψ, N = 2 */
	} cases[] = {
		{"zero1", 0, 4, 6},
		{"zero2", 0, 2, 7},
		{"zero3", 0, 1, 7},
		{"zero3", 1, 0, 8},
	};
	char metrics[96];
	tmp_name(metrics, sizeof metrics, "m.jsonl");
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		const char *extra[] = {"--strategy", cases[i].strategy, "--precision", "bf16-mixed",
				       "--offload-optimizer", "cpu", "--offload-param",
				       cases[i].param ? "cpu" : "none",
				       "--prefetch-bucket-size", "600000",
				       "--param-persistence-threshold", "1000",
				       "--reduce-bucket-size", "300000", NULL};
		free(offload_run(0, NULL, metrics, DEEP_MODEL, extra));
		double psi, psi2;
		double dev = final_stat(metrics, 0, "max_model_states", &psi);
		double host = final_stat(metrics, 1, "max_model_states", &psi2);
		double want_dev = cases[i].dev * psi, want_host = cases[i].host * psi;
		printf("  %s%s: device %.2f Ψ (formula %.0f Ψ + layers), host %.3f Ψ (formula %.0f Ψ)\n",
		       cases[i].strategy, cases[i].param ? " + offload-param" : "", dev / psi,
		       cases[i].dev, host / psi, cases[i].host);
		assert_true(host >= 0.999 * want_host && host <= 1.001 * want_host);
		assert_true(dev >= 0.99 * want_dev && dev <= want_dev + DEEP_EXTRA);
	}
	unlink(metrics);
}

/* zero2 bf16-mixed without offload needs 2Ψ + 14Ψ/N of device memory for
 * its model states (115 MB here); 80 MiB is not enough, and is with the
 * optimizer offloaded (2Ψ, 26 MB, on the device). */
static void test_offload_fits_where_plain_does_not(void **state)
{
	(void)state;
	const char *plain[] = {"--strategy", "zero2", "--precision", "bf16-mixed",
			       "--device-memory", "80MiB", NULL};
	char *out = offload_run(1, NULL, NULL, DEEP_MODEL, plain);
	assert_non_null(strstr(out, "out of device memory"));
	assert_non_null(strstr(out, "(--device-memory)"));
	free(out);
	const char *off[] = {"--strategy", "zero2", "--precision", "bf16-mixed",
			     "--device-memory", "80MiB", "--offload-optimizer", "cpu", NULL};
	free(offload_run(0, NULL, NULL, DEEP_MODEL, off));
	/* and the host tier has its own bound */
	const char *tight[] = {"--strategy", "zero2", "--precision", "bf16-mixed",
			       "--offload-optimizer", "cpu", "--host-memory", "16MiB", NULL};
	out = offload_run(1, NULL, NULL, DEEP_MODEL, tight);
	assert_non_null(strstr(out, "out of host memory"));
	assert_non_null(strstr(out, "(--host-memory)"));
	free(out);
}

static char *write_config(const char *text)
{
	static char path[96];
	tmp_name(path, sizeof path, "ds.json");
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	return path;
}

/* DeepSpeed configs that offload to cpu, as public repositories write
 * them, run unchanged, and train to the same bits as the flags. */
static void test_offload_deepspeed_config(void **state)
{
	(void)state;
	char ref[96], got[96];
	tmp_name(ref, sizeof ref, "ref.bin");
	tmp_name(got, sizeof got, "got.bin");
	const char *flags[] = {"--strategy", "zero3", "--precision", "bf16-mixed", NULL};
	free(offload_run(0, ref, NULL, SMALL_MODEL, flags));
	const char *cfg = write_config(
		"{\n"
		"  \"bf16\": {\"enabled\": true},\n"
		"  \"zero_optimization\": {\n"
		"    \"stage\": 3,\n"
		"    \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true},\n"
		"    \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true,\n"
		"                        \"buffer_count\": 5, \"buffer_size\": 1e8,\n"
		"                        \"max_in_cpu\": 1e9},\n"
		"    \"overlap_comm\": true,\n"
		"    \"contiguous_gradients\": true\n"
		"  },\n"
		"  \"aio\": {\"block_size\": 1048576, \"queue_depth\": 8, \"thread_count\": 1,\n"
		"          \"single_submit\": false, \"overlap_events\": true}\n"
		"}\n");
	const char *viacfg[] = {"--config", cfg, NULL};
	free(offload_run(0, got, NULL, SMALL_MODEL, viacfg));
	assert_same_file(ref, got);
	/* DeepSpeed's older boolean */
	cfg = write_config("{\"zero_optimization\": {\"stage\": 2, \"cpu_offload\": true}}");
	const char *old[] = {"--config", cfg, NULL};
	free(offload_run(0, NULL, NULL, SMALL_MODEL, old));
	unlink(cfg);
	unlink(ref);
	unlink(got);
}

/* Checkpoints of an offloaded run are the ordinary ones: stopped at step
 * 3 and resumed, it ends on the bits of the uninterrupted run; resumed on
 * 4 ranks under zero3 with both offloads, on the bits of the same reshard
 * without offload. */
static void test_offload_resume_reshard(void **state)
{
	(void)state;
	char ref[96], got[96], dir[96], cmd[256];
	tmp_name(ref, sizeof ref, "ref.bin");
	tmp_name(got, sizeof got, "got.bin");
	tmp_name(dir, sizeof dir, "ckpt");
	const char *whole[] = {"--strategy", "zero2", "--precision", "bf16-mixed",
			       "--offload-optimizer", "cpu", NULL};
	free(offload_run(0, ref, NULL, SMALL_MODEL, whole));
	const char *stop[] = {"--strategy", "zero2", "--precision", "bf16-mixed",
			      "--offload-optimizer", "cpu", "--checkpoint-dir", dir,
			      "--stop-at-step", "3", NULL};
	free(offload_run(0, NULL, NULL, SMALL_MODEL, stop));
	const char *resume[] = {"--strategy", "zero2", "--precision", "bf16-mixed",
				"--offload-optimizer", "cpu", "--resume", dir, NULL};
	free(offload_run(0, got, NULL, SMALL_MODEL, resume));
	assert_same_file(ref, got);
	/* reshard: 2 -> 4 ranks, zero2 -> zero3, with and without offload */
	for (int off = 0; off < 2; off++) {
		run r;
		start(&r, 4);
		args(&r, "--max-steps", "6", "--batch-size", "64", "--strategy", "zero3",
		     "--precision", "bf16-mixed", "--resume", dir, "--save-params",
		     off ? got : ref, NULL);
		if (off)
			args(&r, "--offload-optimizer", "cpu", "--offload-param", "cpu", NULL);
		free(finish(&r, 0, SMALL_MODEL));
	}
	assert_same_file(ref, got);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
	unlink(ref);
	unlink(got);
}

/* What cannot work says why, before training. */
static void test_offload_refusals(void **state)
{
	(void)state;
	static const struct {
		const char *argv[8];
		const char *config; /* or NULL */
		const char *says;
	} cases[] = {
		{{"--strategy", "ddp", "--offload-optimizer", "cpu", NULL}, NULL,
		 "--offload-optimizer cpu needs a ZeRO strategy (zero1, zero2 or zero3), not ddp"},
		{{"--strategy", "zero2", "--offload-param", "cpu", NULL}, NULL,
		 "--offload-param cpu works with --strategy zero3 only"},
		{{"--strategy", "zero2", "--offload-optimizer", "nvme", NULL}, NULL,
		 "--offload-optimizer nvme needs --nvme-path DIR"},
		{{"--strategy", "zero3", "--offload-param", "nvme", "--nvme-path", "/tmp", NULL},
		 NULL, "--offload-param nvme: the NVMe tier is not built yet; use cpu"},
		{{NULL}, "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
			 "{\"device\": \"cpu\", \"ratio\": 0.3}}}",
		 "zero_optimization.offload_optimizer.ratio: 0.3: partial offload is not supported"},
		{{NULL}, "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
			 "{\"device\": \"gpu\"}}}",
		 "zero_optimization.offload_optimizer.device: \"gpu\" is not"},
		{{NULL}, "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": "
			 "{\"device\": \"cpu\", \"buffer_cnt\": 4}}}",
		 "offload_param.buffer_cnt"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		const char *argv[12];
		int n = 0;
		for (int k = 0; cases[i].argv[k]; k++)
			argv[n++] = cases[i].argv[k];
		if (cases[i].config) {
			argv[n++] = "--config";
			argv[n++] = write_config(cases[i].config);
		}
		argv[n] = NULL;
		char *out = offload_run(2, NULL, NULL, SMALL_MODEL, argv);
		if (!strstr(out, cases[i].says)) {
			printf("case %zu: want \"%s\" in:\n%s\n", i, cases[i].says, out);
			fail();
		}
		free(out);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_offload_bit_identical),
		cmocka_unit_test(test_offload_memory_formulas),
		cmocka_unit_test(test_offload_fits_where_plain_does_not),
		cmocka_unit_test(test_offload_deepspeed_config),
		cmocka_unit_test(test_offload_resume_reshard),
		cmocka_unit_test(test_offload_refusals),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
