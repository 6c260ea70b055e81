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
 *   cannot work is refused with a sentence naming the key or flag;
 * - the NVMe tier (--offload-optimizer nvme, --offload-param nvme) keeps
 *   the optimizer's space and zero3's parameter shard in swap files that
 *   no run leaves behind, by kill -9 neither; the host holds only its
 *   buffers, and the files move the bytes the formulas say; a worker
 *   killed in a step that is mostly swap I/O restarts from the last
 *   checkpoint and ends on the bits of an uninterrupted run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>

#include "tests/harness.h"
#include "tests/integration/runlib.h"

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

/* The NVMe tier's directory: under /tmp, unless /tmp is tmpfs (which the
 * tier refuses: memory), then under the build tree. */
static char NV[300];

static int setup(void **state)
{
	(void)state;
	struct statfs fs;
	int tmpfs = statfs("/tmp", &fs) == 0 && fs.f_type == 0x01021994;
	snprintf(NV, sizeof NV, "%s/hpu-offload-nvme.XXXXXX", tmpfs ? h_build("") : "/tmp");
	return mkdtemp(NV) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	h_rmtree(NV);
	return 0;
}

/* Nothing left in the NVMe directory: every swap file went with its
 * process. */
static void assert_nv_empty(void)
{
	DIR *d = opendir(NV);
	assert_non_null(d);
	for (struct dirent *e; (e = readdir(d));)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			fail_msg("%s/%s left behind", NV, e->d_name);
	closedir(d);
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
			/* several sub-groups per unit; zero1 one at a time (no
			 * overlap), zero3 with the parameters on NVMe too (all
			 * but the last layer: the others are not persistent) */
			const char *nvme[] = {"--strategy", stages[s], "--precision", precisions[p],
					      "--offload-optimizer", "nvme", "--nvme-path", NV,
					      "--sub-group-size", "5000", "--offload-buffer-count",
					      s == 0 ? "1" : "4", s == 2 ? "--offload-param" : NULL,
					      "nvme", "--param-persistence-threshold", "1000", NULL};
			/* the fewest parameter buffers: they are taken back from
			 * gathers in flight and read-aheads */
			const char *param_nv[] = {"--strategy", stages[s], "--precision",
						  precisions[p], "--offload-param", "nvme",
						  "--nvme-path", NV, "--param-buffer-count", "2",
						  "--param-persistence-threshold", "1000", NULL};
			const char *const *variants[] = {opt, nvme, both, param, param_nv};
			static const char *names[] = {"offload-optimizer cpu", "offload-optimizer nvme",
						      "both cpu", "offload-param cpu",
						      "offload-param nvme"};
			for (int v = 0; v < (s == 2 ? 5 : 2); v++) {
				printf("  %s %s %s\n", stages[s], precisions[p], names[v]);
				free(offload_run(0, got, NULL, SMALL_MODEL, variants[v]));
				assert_same_file(ref, got);
			}
			assert_nv_empty();
		}
	unlink(ref);
	unlink(got);
}

/* A number in the last "final" record's rank-0 device entry: `key`, or
 * host.`key` when host is "host" (nvme.`key` when "nvme"). */
static double final_stat(const char *metrics, const char *host, const char *key, double *psi)
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
		char h[32];
		snprintf(h, sizeof h, "\"%s\":", host);
		rec = strstr(rec, h);
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
		double dev = final_stat(metrics, NULL, "max_model_states", &psi);
		double host = final_stat(metrics, "host", "max_model_states", &psi2);
		double want_dev = cases[i].dev * psi, want_host = cases[i].host * psi;
		printf("  %s%s: device %.2f Ψ (formula %.0f Ψ + layers), host %.3f Ψ (formula %.0f Ψ)\n",
		       cases[i].strategy, cases[i].param ? " + offload-param" : "", dev / psi,
		       cases[i].dev, host / psi, cases[i].host);
		assert_true(host >= 0.999 * want_host && host <= 1.001 * want_host);
		assert_true(dev >= 0.99 * want_dev && dev <= want_dev + DEEP_EXTRA);
	}
	unlink(metrics);
}

/* The NVMe tier, DEEP_MODEL in bf16-mixed under zero2 on N = 2 ranks,
 * sub-groups of S = 65536 elements, B = 4 buffers: the host holds the
 * 16-bit gradient shard (2Ψ/N) and the buffers, B (12 S + 4096) bytes (a
 * sub-group's master weights and two moments, 4 KiB of alignment slack);
 * so --host-memory 24MiB, far below the cpu tier's 7Ψ, is enough. The
 * swap file is read once a step and written once a step and once at the
 * start: 12Ψ/N a time, plus a sub-group's alignment padding. */
static void test_offload_nvme_memory(void **state)
{
	(void)state;
	char metrics[96];
	tmp_name(metrics, sizeof metrics, "m.jsonl");
	const char *cpu[] = {"--strategy", "zero2", "--precision", "bf16-mixed",
			     "--offload-optimizer", "cpu", "--host-memory", "24MiB", NULL};
	char *out = offload_run(1, NULL, NULL, DEEP_MODEL, cpu);
	assert_non_null(strstr(out, "out of host memory"));
	free(out);
	const char *nvme[] = {"--strategy", "zero2", "--precision", "bf16-mixed",
			      "--offload-optimizer", "nvme", "--nvme-path", NV, "--sub-group-size",
			      "65536", "--host-memory", "24MiB", NULL};
	free(offload_run(0, NULL, metrics, DEEP_MODEL, nvme));
	assert_nv_empty();
	double psi;
	double optim = final_stat(metrics, "host", "max_optim", &psi);
	double states = final_stat(metrics, "host", "max_model_states", &psi);
	double buffers = 4.0 * (12 * 65536 + 4096);
	printf("  host: optimizer %.0f bytes (formula %.0f), model states %.4f Ψ "
	       "(formula Ψ + buffers = %.4f Ψ)\n",
	       optim, buffers, states / psi, 1 + buffers / psi);
	assert_true(optim == buffers);
	/* the shard is padded to whole pieces: within 0.1% */
	assert_true(states >= psi + buffers && states <= 1.001 * psi + buffers);
	double rd = final_stat(metrics, "nvme", "read_bytes", &psi);
	double wr = final_stat(metrics, "nvme", "written_bytes", &psi);
	double pass = 12 * psi / 2;
	printf("  swap file: read %.3f, written %.3f passes of 12Ψ/N over 6 steps\n", rd / pass,
	       wr / pass);
	assert_true(rd >= 6 * pass && rd <= 6 * pass * 1.01);
	assert_true(wr >= 7 * pass && wr <= 7 * pass * 1.01);
	unlink(metrics);
}

static double align4k(double bytes)
{
	return ceil(bytes / 4096) * 4096;
}

/* --offload-param nvme, DEEP_MODEL (784-512x48-10) in bf16-mixed under
 * zero3 on N = 2, the optimizer on NVMe too, B = 3 parameter buffers, no
 * evaluation. A layer's piece is its parameters padded to 16N, over N,
 * 2 bytes each; the last layer (5130 parameters) is persistent and stays
 * in memory; the other pieces are in the file, each 4 KiB-aligned: P
 * bytes in all. The host's parameters are the B buffers, each the
 * largest piece + 4 KiB of alignment slack, and the persistent piece --
 * not the 2Ψ/N shard that --offload-param cpu holds, so --host-memory
 * 24MiB fails with cpu and trains with nvme. The file is written once at
 * the start and once a step, and read three times a step (the forward's
 * and the backward's gathers, the step), but for the last layer gathered
 * (a hidden one), kept from its forward into its backward: twice. 7 P
 * written and 18 P less 6 such pieces read over 6 steps. */
static void test_offload_param_nvme_memory(void **state)
{
	(void)state;
	char metrics[96];
	tmp_name(metrics, sizeof metrics, "pm.jsonl");
	const char *common[] = {"--strategy", "zero3", "--precision", "bf16-mixed", "--no-eval",
				"--offload-optimizer", "nvme", "--nvme-path", NV,
				"--sub-group-size", "65536", "--host-memory", "24MiB",
				"--param-buffer-count", "3", "--offload-param", NULL};
	const char *cpu[20], *nvme[20];
	int n = 0;
	for (; common[n]; n++)
		cpu[n] = nvme[n] = common[n];
	cpu[n] = "cpu";
	nvme[n] = "nvme";
	cpu[n + 1] = nvme[n + 1] = NULL;
	char *out = offload_run(1, NULL, NULL, DEEP_MODEL, cpu);
	assert_non_null(strstr(out, "out of host memory"));
	free(out);
	free(offload_run(0, NULL, metrics, DEEP_MODEL, nvme));
	assert_nv_empty();
	double psi;
	double first = align4k(2.0 * (784 * 512 + 512) / 2);  /* 784*512+512 = 16N * 12560 */
	double hidden = align4k(2.0 * (512 * 512 + 512) / 2); /* 262656 = 16N * 8208 */
	double persistent = 2.0 * 5152 / 2;                    /* 5130 padded to 5152 */
	double P = first + 47 * hidden;
	double params = final_stat(metrics, "host", "max_params", &psi);
	double formula = 3 * (first + 4096) + persistent;
	printf("  host parameters: %.0f bytes (formula B (largest piece + 4 KiB) + persistent = "
	       "%.0f; the shard, 2Ψ/N, is %.0f)\n", params, formula, 2 * psi / 2);
	assert_true(params == formula);
	double rd = final_stat(metrics, "nvme", "param_read_bytes", &psi);
	double wr = final_stat(metrics, "nvme", "param_written_bytes", &psi);
	printf("  parameter swap file: read %.3f P, written %.3f P over 6 steps (P = %.0f bytes)\n",
	       rd / P, wr / P, P);
	assert_true(rd == 18 * P - 6 * hidden);
	assert_true(wr == 7 * P);
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
 * 3 and resumed, it ends on the bits of the uninterrupted run; the NVMe
 * tier's checkpoint has the cpu tier's shards byte for byte and resumes
 * the same way; resumed on 4 ranks under zero3 with both offloads to cpu,
 * or both on NVMe, on the bits of the same reshard without offload; an
 * fp32 zero3 run with its parameters on NVMe (its master weights, then)
 * checkpoints and resumes the same way. */
static void test_offload_resume_reshard(void **state)
{
	(void)state;
	char ref[96], got[96], dir[96], cmd[320];
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
	/* the NVMe tier saves the same checkpoint, and resumes from it */
	char nvdir[100];
	snprintf(nvdir, sizeof nvdir, "%s-nv", dir);
	const char *nv_stop[] = {"--strategy", "zero2", "--precision", "bf16-mixed",
				 "--offload-optimizer", "nvme", "--nvme-path", NV,
				 "--sub-group-size", "3000", "--checkpoint-dir", nvdir,
				 "--stop-at-step", "3", "--checkpoint-every", "1", NULL};
	free(offload_run(0, NULL, NULL, SMALL_MODEL, nv_stop));
	const char *nv_resume[] = {"--strategy", "zero2", "--precision", "bf16-mixed",
				   "--offload-optimizer", "nvme", "--nvme-path", NV,
				   "--sub-group-size", "3000", "--resume", nvdir, NULL};
	free(offload_run(0, got, NULL, SMALL_MODEL, nv_resume));
	assert_same_file(ref, got);
	/* the same shards, byte for byte, as the cpu tier's */
	for (int r = 0; r < 2; r++) {
		snprintf(cmd, sizeof cmd, "cmp '%s/step-00000003/rank-%05d-of-00002.bin' "
			 "'%s/step-00000003/rank-%05d-of-00002.bin'", dir, r, nvdir, r);
		assert_int_equal(system(cmd), 0);
	}
	/* reshard: 2 -> 4 ranks, zero2 -> zero3, without offload, with both
	 * offloads to cpu, with the optimizer on NVMe */
	for (int off = 0; off < 3; off++) {
		run r;
		start(&r, 4);
		args(&r, "--max-steps", "6", "--batch-size", "64", "--strategy", "zero3",
		     "--precision", "bf16-mixed", "--resume", dir, "--save-params",
		     off ? got : ref, NULL);
		if (off == 1)
			args(&r, "--offload-optimizer", "cpu", "--offload-param", "cpu", NULL);
		if (off == 2)
			args(&r, "--offload-optimizer", "nvme", "--nvme-path", NV,
			     "--sub-group-size", "2000", "--offload-param", "nvme",
			     "--param-persistence-threshold", "1000", NULL);
		free(finish(&r, 0, SMALL_MODEL));
		if (off)
			assert_same_file(ref, got);
	}
	/* fp32 zero3, parameters on NVMe */
	const char *f_whole[] = {"--strategy", "zero3", NULL};
	free(offload_run(0, ref, NULL, SMALL_MODEL, f_whole));
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", nvdir);
	assert_int_equal(system(cmd), 0);
	const char *f_stop[] = {"--strategy", "zero3", "--offload-param", "nvme", "--nvme-path", NV,
				"--param-persistence-threshold", "1000", "--checkpoint-dir",
				nvdir, "--stop-at-step", "3", NULL};
	free(offload_run(0, NULL, NULL, SMALL_MODEL, f_stop));
	const char *f_resume[] = {"--strategy", "zero3", "--offload-param", "nvme",
				  "--nvme-path", NV, "--param-persistence-threshold", "1000",
				  "--resume", nvdir, NULL};
	free(offload_run(0, got, NULL, SMALL_MODEL, f_resume));
	assert_same_file(ref, got);
	assert_nv_empty();
	snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, nvdir);
	assert_int_equal(system(cmd), 0);
	unlink(ref);
	unlink(got);
}

/* A worker killed with SIGKILL in a step that is mostly swap I/O (zero3,
 * the optimizer's space and the parameter shard of DEEP_MODEL on NVMe:
 * 12Ψ/N + 3 × 2Ψ/N = 115 MB read and 12Ψ/N + 2Ψ/N = 89 MB written per
 * rank and step): the job restarts from its last checkpoint
 * (--max-restarts 1) and ends on the bits of an uninterrupted run; no swap file is left, of
 * the killed worker or of the others. */
static void test_offload_nvme_kill(void **state)
{
	(void)state;
	char straight[96], after[96], dir[96], cmd[160];
	tmp_name(straight, sizeof straight, "straight.bin");
	tmp_name(after, sizeof after, "after.bin");
	tmp_name(dir, sizeof dir, "kill-ck");
	const char *nv[] = {"--strategy", "zero3", "--precision", "bf16-mixed",
			    "--offload-optimizer", "nvme", "--nvme-path", NV, "--sub-group-size",
			    "1000000", "--offload-param", "nvme", NULL};
	run r;
	start(&r, 2);
	args(&r, "--max-steps", "16", "--batch-size", "64", "--save-params", straight, NULL);
	for (const char *const *a = nv; *a; a++)
		arg(&r, *a);
	free(finish(&r, 0, DEEP_MODEL));

	srand((unsigned)time(NULL) ^ (unsigned)getpid());
	int at = 5 + rand() % 8;
	r.n = 0;
	args(&r, LAUNCH, "--devices", "2", "--no-eval", "--log-every", "1", "--batch-size", "64",
	     "--max-steps", "16", "--checkpoint-dir", dir, "--checkpoint-every", "4",
	     "--max-restarts", "1", "--save-params", after, NULL);
	for (const char *const *a = nv; *a; a++)
		arg(&r, *a);
	args(&r, MODEL, "--", "--hidden", "512", "--depth", "48", NULL);
	proc p;
	assert_int_equal(h_start(&p, (char *const *)r.argv, NULL), 0);
	char line[64];
	snprintf(line, sizeof line, " step %d/", at);
	if (h_wait_for(&p, line, 120000) < 0) {
		h_kill(&p);
		fail_msg("never saw '%s'", line);
	}
	pid_t kids[4];
	int n = h_children(p.pid, kids, 4);
	assert_int_equal(n, 2);
	pid_t victim = kids[rand() % n];
	assert_int_equal(kill(victim, SIGKILL), 0);
	if (h_wait(&p, 240000) < 0) {
		h_kill(&p);
		fail_msg("the job did not end after the kill");
	}
	int code = h_code(&p);
	if (code != 0 || !strstr(p.out, "restart 1 (HPU_RESTART_COUNT)"))
		fail_msg("exit %d:\n%s", code, p.out);
	h_free(&p);
	size_t na, nb;
	float *a = load_params(straight, &na), *b = load_params(after, &nb);
	int same = na == nb && memcmp(a, b, na * sizeof *a) == 0;
	printf("  SIGKILL to worker pid %d at step %d, restarted: final parameters %s\n",
	       (int)victim, at, same ? "bit-identical to the uninterrupted run" : "DIFFERENT");
	free(a);
	free(b);
	assert_true(same);
	assert_nv_empty();
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
	unlink(straight);
	unlink(after);
}

/* What cannot work says why, before training. */
static void test_offload_refusals(void **state)
{
	(void)state;
	static const struct {
		const char *argv[8];
		const char *config; /* or NULL */
		const char *says;
		int code; /* 2: refused by the options; 1: by the worker (the swap
			   * directory is the worker's node's) */
	} cases[] = {
		{{"--strategy", "ddp", "--offload-optimizer", "cpu", NULL}, NULL,
		 "--offload-optimizer cpu needs a ZeRO strategy (zero1, zero2 or zero3), not ddp", 2},
		{{"--strategy", "zero2", "--offload-param", "cpu", NULL}, NULL,
		 "--offload-param cpu works with --strategy zero3 only", 2},
		{{"--strategy", "zero2", "--offload-optimizer", "nvme", NULL}, NULL,
		 "--offload-optimizer nvme needs --nvme-path DIR", 2},
		{{NULL}, "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": "
			 "{\"device\": \"nvme\", \"nvme_path\": \"/nonexistent/p\"}}}",
		 "the swap directory /nonexistent/p for parameters does not exist", 1},
		{{NULL}, "{\"zero_optimization\": {\"stage\": 3, "
			 "\"stage3_param_persistence_threshold\": 0, \"offload_param\": "
			 "{\"device\": \"nvme\", \"nvme_path\": \"/tmp\", \"buffer_size\": 1000}}}",
		 "--param-buffer-size 1000 (offload_param.buffer_size) is smaller than the piece of", 1},
		{{"--strategy", "zero2", "--offload-optimizer", "nvme", "--nvme-path",
		  "/nonexistent/swap", NULL},
		 NULL, "the swap directory /nonexistent/swap for optimizer state does not exist", 1},
		{{"--strategy", "zero1", "--offload-optimizer", "nvme", "--nvme-path", "/dev/shm",
		  NULL},
		 NULL, "the swap directory /dev/shm for optimizer state is on tmpfs", 1},
		{{NULL}, "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
			 "{\"device\": \"nvme\", \"nvme_path\": \"/etc/hostname\"}}}",
		 "the swap directory /etc/hostname for optimizer state is not a directory", 1},
		{{NULL}, "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
			 "{\"device\": \"cpu\", \"ratio\": 0.3}}}",
		 "zero_optimization.offload_optimizer.ratio: 0.3: partial offload is not supported", 2},
		{{NULL}, "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
			 "{\"device\": \"gpu\"}}}",
		 "zero_optimization.offload_optimizer.device: \"gpu\" is not", 2},
		{{NULL}, "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": "
			 "{\"device\": \"cpu\", \"buffer_cnt\": 4}}}",
		 "offload_param.buffer_cnt", 2},
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
		struct statfs fs;
		if (strstr(cases[i].says, "tmpfs") &&
		    (statfs("/dev/shm", &fs) != 0 || fs.f_type != 0x01021994)) {
			printf("  /dev/shm is not tmpfs here: case %zu skipped\n", i);
			continue;
		}
		char *out = offload_run(cases[i].code, NULL, NULL, SMALL_MODEL, argv);
		if (!strstr(out, cases[i].says)) {
			printf("case %zu: want \"%s\" in:\n%s\n", i, cases[i].says, out);
			fail();
		}
		free(out);
	}
	char cfg[96];
	tmp_name(cfg, sizeof cfg, "ds.json");
	unlink(cfg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_offload_bit_identical),
		cmocka_unit_test(test_offload_memory_formulas),
		cmocka_unit_test(test_offload_fits_where_plain_does_not),
		cmocka_unit_test(test_offload_nvme_memory),
		cmocka_unit_test(test_offload_param_nvme_memory),
		cmocka_unit_test(test_offload_deepspeed_config),
		cmocka_unit_test(test_offload_resume_reshard),
		cmocka_unit_test(test_offload_nvme_kill),
		cmocka_unit_test(test_offload_refusals),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
