/* test_cuda_ipc: the CUDA device's all-reduce between workers of one node
 * over CUDA IPC (worker/cuda/cuda_coll.c), on a GPU.
 *
 * Two ranks, processes of their own (this program again, --rank R), share
 * GPU 0 (HPU_DEVICE_ID picks another per rank where set: R + its value),
 * join a libhpucoll communicator (ZeroMQ ipc) whose all-gather is the
 * group's exchange, make the group with a staging of 8 MiB a chunk and
 * all-reduce device buffers of awkward sizes (1, 7, 1000003, 64 MiB), in
 * fp32 and bf16, in place and not: every result must be, bit for bit,
 * libhpucoll's all-reduce of the same values in host memory (what the
 * staged path computes). Exit 77 (ctest: skipped), with the reason,
 * where the module is not built, no GPU is visible, or the device refuses
 * CUDA IPC (the strategy then stages through host memory: the warning
 * says so); the parent kills ranks that outlive 120 s. Then the same
 * group over NCCL (--collectives nccl: nccl_phase), where NCCL loads.
 *
 *   test_cuda_ipc           the test
 *   test_cuda_ipc --bench   also the figure: an all-reduce of 64 MiB fp32
 *       (and bf16) between the 2 workers, 20 times after 3, with the
 *       strategy's 32 MiB chunks: time, algbw and busbw (2(n-1)/n algbw),
 *       beside the GPU's device-to-device copy rate in the same run;
 *       where CUDA IPC is refused, the same figure for the staged path
 *       training falls back to (marked STAGED), and exit 77.
 * Plain C, not cmocka: the skip needs its own exit status. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/lowp.h"
#include "tests/unit/cuda_modlib.h"
#include "hpu/coll.h"
#include "worker/device/device.h"

#define WORLD 2
#define DEADLINE_S 120
#define SKIP CU_MOD_SKIP

static int failures, me;
static const hpu__device *D;
static hpucoll_comm *comm;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			printf("rank %d: FAIL %s:%d: ", me, __FILE__, __LINE__);                   \
			printf(__VA_ARGS__);                                                       \
			printf("\n");                                                              \
			fflush(stdout);                                                            \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("rank %d: ", me);
	vprintf(fmt, ap);
	printf("\n");
	fflush(stdout);
	va_end(ap);
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- a rank ---- */

static const hpu__device *load(void)
{
	char path[4096], who[32];
	snprintf(who, sizeof who, "rank %d: ", me);
	cu_mod_path(path, sizeof path);
	const hpu__device *d = cu_mod_load(path, who);
	if (!d->coll) {
		say("FAIL: the CUDA device has no collectives (hpu__device.coll is NULL)");
		exit(1);
	}
	return d;
}

static int xchg(void *arg, const void *mine, void *all, size_t bytes)
{
	(void)arg;
	int rc = hpucoll_all_gather(comm, mine, all, bytes, HPUCOLL_U8);
	if (rc)
		say("the exchange (hpucoll_all_gather) failed: %s", hpucoll_comm_errmsg(comm));
	return rc ? -1 : 0;
}

static void connect_world(const char *job)
{
	char ep[WORLD][256];
	const char *eps[WORLD];
	for (int r = 0; r < WORLD; r++) {
		snprintf(ep[r], sizeof ep[r], "ipc:///tmp/hpu-cuda-ipc-%s-%d", job, r);
		eps[r] = ep[r];
	}
	static const int nodes[WORLD] = {0, 0}; /* shared memory, as the workers of a node */
	char name[96];
	snprintf(name, sizeof name, "hpu-cuda-ipc-%s", job);
	int rc = hpucoll_comm_new(&comm, me, WORLD, ep[me]);
	if (!rc) {
		hpucoll_comm_set_timeout(comm, 30000);
		rc = hpucoll_comm_set_topology(comm, nodes, name, HPUCOLL_TRANSPORT_AUTO);
	}
	if (!rc)
		rc = hpucoll_comm_connect(comm, eps);
	if (rc) {
		say("FAIL: the communicator: %s (%s)", hpucoll_strerror(rc),
		    comm ? hpucoll_comm_errmsg(comm) : "");
		exit(1);
	}
}

static uint64_t rng;

static float frand(void)
{
	return cu_mod_frand(&rng);
}

/* This rank's values: n of dtype dt (bf16 as its bits), seeded by the
 * rank and the size, so that the ranks differ. */
static void *values(hpu__dev_dtype dt, size_t n)
{
	size_t esz = dt == HPU__DEV_BF16 ? 2 : 4;
	void *h = malloc(n * esz);
	rng = 0x9e3779b97f4a7c15ull ^ ((uint64_t)(me + 1) << 40) ^ n;
	for (size_t i = 0; i < n; i++) {
		float v = frand() * (i % 3 ? 1.0f : 1e-3f); /* sums that round */
		if (dt == HPU__DEV_BF16)
			((uint16_t *)h)[i] = hpu_to_bf16(v);
		else
			((float *)h)[i] = v;
	}
	return h;
}

static void *dev(size_t bytes)
{
	void *p = hpu__dalloc(HPU_MEM_OTHER, bytes ? bytes : 16, "test");
	if (!p) {
		say("FAIL: %s", hpu__devmem_error());
		exit(1);
	}
	return p;
}

static const char *dname(hpu__dev_dtype dt)
{
	return dt == HPU__DEV_BF16 ? "bf16" : "fp32";
}

/* One all-reduce of n values on the device (in place, or into another
 * buffer), against libhpucoll's of the same values in host memory. */
static void check_case(hpu__dev_group *g, hpu__dev_dtype dt, size_t n, int inplace)
{
	size_t esz = dt == HPU__DEV_BF16 ? 2 : 4, bytes = n * esz;
	void *h = values(dt, n), *want = malloc(bytes), *got = malloc(bytes);
	void *d = dev(bytes), *out = inplace ? d : dev(bytes);
	D->copy(NULL, d, h, bytes);
	int rc = D->coll->all_reduce(g, d, out, n, dt);
	CHECK(rc == 0, "%s n=%zu: the device's all-reduce failed", dname(dt), n);
	D->copy(NULL, got, out, bytes);
	rc = hpucoll_all_reduce(comm, h, want, n, dt == HPU__DEV_BF16 ? HPUCOLL_BF16 : HPUCOLL_F32,
				HPUCOLL_SUM);
	CHECK(rc == 0, "libhpucoll's all-reduce: %s", hpucoll_comm_errmsg(comm));
	size_t bad = 0, first = 0;
	for (size_t i = 0; i < n; i++)
		if (memcmp((char *)got + i * esz, (char *)want + i * esz, esz) && !bad++)
			first = i;
	if (bad && dt == HPU__DEV_BF16)
		CHECK(0, "bf16 n=%zu%s: %zu elements differ from libhpucoll's; the first, %zu: 0x%04x, not 0x%04x (mine 0x%04x)",
		      n, inplace ? "" : " (not in place)", bad, first, ((uint16_t *)got)[first],
		      ((uint16_t *)want)[first], ((uint16_t *)h)[first]);
	else if (bad)
		CHECK(0, "fp32 n=%zu%s: %zu elements differ from libhpucoll's; the first, %zu: %.9g, not %.9g (mine %.9g)",
		      n, inplace ? "" : " (not in place)", bad, first, (double)((float *)got)[first],
		      (double)((float *)want)[first], (double)((float *)h)[first]);
	else
		say("all-reduce %s n=%zu%s: the same bits as libhpucoll's", dname(dt), n,
		    inplace ? "" : " (not in place)");
	if (out != d)
		hpu__dfree(out);
	hpu__dfree(d);
	free(h);
	free(want);
	free(got);
}

/* A group of one rank's exchange: its own record. */
static int xchg_self(void *arg, const void *mine, void *all, size_t bytes)
{
	(void)arg;
	memcpy(all, mine, bytes);
	return 0;
}

/* --collectives nccl (worker/cuda/cuda_nccl.c), after the CUDA IPC
 * group: the two ranks on one GPU are refused on both, with the sentence
 * naming them (open answers -2: the job would fail); on a GPU each
 * (HPU_DEVICE_ID) the CUDA IPC group's checks (at two ranks NCCL's sum is
 * a + b: libhpucoll's bits); then each rank alone, a group of one whose
 * all-reduce gives its own values. Where NCCL cannot be loaded the
 * device's configure refuses the option, and where it loads but cannot
 * make an id (ncclGetUniqueId: no usable network interface in a
 * sandbox) the open says so: said, not failed (NCCL is optional;
 * HPU_NCCL_LIB names it). */
static void nccl_phase(int rank)
{
	hpu__dev_config c = {.nccl = 1};
	uint64_t cap = 0;
	char note[512], err[512];
	if (D->configure(&c, &cap, note, sizeof note, err, sizeof err) < 0) {
		say("NCCL: not tried: %s", err);
		return;
	}
	const char *v = strstr(note, "all-reduce: ");
	say("NCCL loaded: %s", v ? v + strlen("all-reduce: ") : note);
	const char *ids = getenv("HPU_DEVICE_ID");
	int shared = !(ids && *ids);
	hpu__dev_group *g = NULL;
	int rc = D->coll->open(&g, rank, WORLD, (size_t)1 << 20, xchg, NULL, err, sizeof err);
	if (rc == -2 && strstr(err, "ncclGetUniqueId")) { /* a sandbox's sockets, say */
		say("NCCL: loaded, not usable on this machine: %s", err);
		c.nccl = 0;
		if (D->configure(&c, &cap, note, sizeof note, err, sizeof err) < 0)
			CHECK(0, "configure without NCCL: %s", err);
		return;
	}
	if (shared) {
		CHECK(rc == -2 && strstr(err, "share GPU"),
		      "NCCL, 2 ranks on one GPU: open answered %d (%s), not -2 naming the shared GPU",
		      rc, err);
		if (rc == -2)
			say("NCCL, 2 ranks on one GPU: refused: %s", err);
	} else {
		CHECK(rc == 0, "NCCL, a GPU per rank: open answered %d: %s", rc, err);
		if (rc == 0) {
			check_case(g, HPU__DEV_F32, 1000003, 1);
			check_case(g, HPU__DEV_BF16, 1000003, 1);
			check_case(g, HPU__DEV_F32, 4099, 0);
		}
	}
	if (rc == 0)
		D->coll->close(g);
	g = NULL;
	rc = D->coll->open(&g, 0, 1, (size_t)1 << 20, xchg_self, NULL, err, sizeof err);
	CHECK(rc == 0, "NCCL, a group of one: open answered %d: %s", rc, err);
	if (rc == 0) {
		const size_t n = 4099;
		float *h = values(HPU__DEV_F32, n), *got = malloc(n * 4);
		void *d = dev(n * 4), *out = dev(n * 4);
		D->copy(NULL, d, h, n * 4);
		CHECK(D->coll->all_reduce(g, d, out, n, HPU__DEV_F32) == 0,
		      "NCCL, a group of one: the all-reduce failed");
		D->copy(NULL, got, out, n * 4);
		CHECK(!memcmp(got, h, n * 4), "NCCL, a group of one: the sum of one is not its values");
		say("NCCL, a group of one: its all-reduce of %zu fp32 gives its values", n);
		D->coll->close(g);
		hpu__dfree(out);
		hpu__dfree(d);
		free(h);
		free(got);
	}
	c.nccl = 0;
	if (D->configure(&c, &cap, note, sizeof note, err, sizeof err) < 0)
		CHECK(0, "configure without NCCL: %s", err);
}

/* The figure: 64 MiB all-reduced 20 times after 3, and the GPU's
 * device-to-device copy of 64 MiB (rank 0, the other waiting). */
static void bench(hpu__dev_group *g, hpu__dev_dtype dt)
{
	const size_t bytes = (size_t)64 << 20, esz = dt == HPU__DEV_BF16 ? 2 : 4, n = bytes / esz;
	const int warm = 3, iters = 20;
	void *d = dev(bytes), *e = dev(bytes);
	char one = 1, all[WORLD];
	for (int i = 0; i < warm; i++)
		CHECK(D->coll->all_reduce(g, d, d, n, dt) == 0, "bench: the all-reduce failed");
	double t0 = now_s();
	for (int i = 0; i < iters; i++)
		CHECK(D->coll->all_reduce(g, d, d, n, dt) == 0, "bench: the all-reduce failed");
	double t = (now_s() - t0) / iters; /* each call returns done */
	double copy = 0;
	if (me == 0) {
		hpu__dev_event ev;
		D->copy(NULL, e, d, bytes);
		D->record(NULL, &ev);
		D->wait(&ev);
		double c0 = now_s();
		for (int i = 0; i < iters; i++)
			D->copy(NULL, e, d, bytes);
		D->record(NULL, &ev);
		D->wait(&ev);
		copy = (now_s() - c0) / iters;
	}
	xchg(NULL, &one, all, 1);
	if (me == 0) {
		double alg = (double)bytes / t / 1e9, bus = alg * 2.0 * (WORLD - 1) / WORLD;
		double cp = (double)bytes / copy / 1e9;
		printf("bench: all_reduce %s 64 MiB, %d workers sharing the GPU: %.3f ms, algbw %.1f GB/s, busbw %.1f GB/s; device-to-device copy of 64 MiB: %.1f GB/s (%.3f ms); busbw / copy %.2f\n",
		       dname(dt), WORLD, t * 1e3, alg, bus, cp, copy * 1e3, bus / cp);
		fflush(stdout);
	}
	hpu__dfree(d);
	hpu__dfree(e);
}

/* Without the group: the figure of what training does then, the
 * strategy's staging (worker/strategy/strategy_dcoll.c: 1 MiB at a time
 * out to pinned host memory, libhpucoll's all-reduce there, back). */
static void bench_staged(hpu__dev_dtype dt, const char *why)
{
	const size_t bytes = (size_t)64 << 20, stage = (size_t)1 << 20;
	const size_t esz = dt == HPU__DEV_BF16 ? 2 : 4;
	const int warm = 2, iters = 10;
	char *d = dev(bytes), *h = D->host_alloc(stage);
	double t0 = 0;
	if (!h) {
		say("FAIL: no pinned host memory");
		exit(1);
	}
	for (int i = 0; i < warm + iters; i++) {
		if (i == warm)
			t0 = now_s();
		for (size_t at = 0; at < bytes; at += stage) {
			D->copy(NULL, h, d + at, stage);
			int rc = hpucoll_all_reduce(comm, h, h, stage / esz,
						    dt == HPU__DEV_BF16 ? HPUCOLL_BF16 : HPUCOLL_F32,
						    HPUCOLL_SUM);
			CHECK(rc == 0, "libhpucoll's all-reduce: %s", hpucoll_comm_errmsg(comm));
			D->copy(NULL, d + at, h, stage);
		}
	}
	double t = (now_s() - t0) / iters, alg = (double)bytes / t / 1e9;
	if (me == 0)
		printf("bench: all_reduce %s 64 MiB, %d workers sharing the GPU, STAGED through host "
		       "memory (no CUDA IPC: %s): %.3f ms, algbw %.1f GB/s, busbw %.1f GB/s\n",
		       dname(dt), WORLD, why, t * 1e3, alg, alg * 2.0 * (WORLD - 1) / WORLD);
	D->host_free(h);
	hpu__dfree(d);
}

static int rank_main(int rank, const char *job, int do_bench)
{
	me = rank;
	char dev_id[32];
	const char *base = getenv("HPU_DEVICE_ID");
	if (base && *base) { /* a GPU per rank where asked */
		snprintf(dev_id, sizeof dev_id, "%ld", strtol(base, NULL, 10) + rank);
		setenv("HPU_DEVICE_ID", dev_id, 1);
	}
	D = load();
	char err[512];
	if (D->setup(rank, err, sizeof err) < 0) {
		say("FAIL: setup: %s", err);
		return 1;
	}
	hpu__devmem_set_backing(D->backing);
	if (hpu__devmem_init(0, 0) < 0) {
		say("FAIL: devmem: %s", hpu__devmem_error());
		return 1;
	}
	connect_world(job);
	hpu__dev_group *g = NULL;
	size_t chunk = do_bench ? (size_t)32 << 20 : (size_t)8 << 20;
	int rc = D->coll->open(&g, rank, WORLD, chunk, xchg, NULL, err, sizeof err);
	if (rc != 0) {
		say("%s: the device's group of %d workers was not made (open answered %d): %s -- "
		    "where this happens in training the gradients' all-reduce is staged through "
		    "host memory instead, with one warning",
		    rc < 0 ? "skipped: CUDA IPC is not available here" : "FAIL", WORLD, rc, err);
		if (do_bench && rc < 0) {
			bench_staged(HPU__DEV_F32, err);
			bench_staged(HPU__DEV_BF16, err);
		}
		hpucoll_comm_destroy(&comm);
		return rc < 0 ? SKIP : 1;
	}
	say("the group is made: CUDA IPC between the %d workers on GPU %s", WORLD,
	    getenv("HPU_DEVICE_ID") ? getenv("HPU_DEVICE_ID") : "0");
	static const size_t sizes[] = {1, 7, 1000003};
	for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
		check_case(g, HPU__DEV_F32, sizes[k], 1);
		check_case(g, HPU__DEV_BF16, sizes[k], 1);
	}
	check_case(g, HPU__DEV_F32, 4099, 0);
	check_case(g, HPU__DEV_F32, (size_t)16 << 20, 1); /* 64 MiB: 8 chunks */
	check_case(g, HPU__DEV_BF16, (size_t)32 << 20, 1);
	check_case(g, HPU__DEV_F32, 0, 1);
	if (do_bench) {
		bench(g, HPU__DEV_F32);
		bench(g, HPU__DEV_BF16);
	}
	D->coll->close(g);
	if (!do_bench)
		nccl_phase(rank);
	hpu_device_stats s;
	hpu__devmem_stats(&s);
	CHECK(s.in_use == 0, "%llu bytes of device memory still in use",
	      (unsigned long long)s.in_use);
	hpucoll_comm_destroy(&comm);
	hpu__devmem_shutdown();
	hpu__devmem_set_backing(NULL);
	D->teardown();
	say("%s", failures ? "FAILED" : "passed");
	return failures ? 1 : 0;
}

/* ---- the parent: two ranks, a deadline ---- */

static pid_t spawn(const char *self, int rank, const char *job, int do_bench)
{
	char r[16];
	snprintf(r, sizeof r, "%d", rank);
	pid_t pid = fork();
	if (pid == 0) {
		char *argv[] = {(char *)self, "--rank", r, (char *)job,
				do_bench ? "--bench" : NULL, NULL};
		execv(self, argv);
		printf("cannot run %s: %s\n", self, strerror(errno));
		_exit(1);
	}
	return pid;
}

/* Waits for both ranks until the deadline, then kills what is left. */
static void wait_ranks(pid_t *pid, int *status)
{
	double end = now_s() + DEADLINE_S;
	int left = WORLD;
	while (left) {
		for (int r = 0; r < WORLD; r++)
			if (pid[r] > 0 && waitpid(pid[r], &status[r], WNOHANG) == pid[r]) {
				pid[r] = 0;
				left--;
			}
		if (left && now_s() > end) {
			printf("FAIL: a rank is still running after %d s: killed\n", DEADLINE_S);
			for (int r = 0; r < WORLD; r++)
				if (pid[r] > 0) {
					kill(pid[r], SIGKILL);
					waitpid(pid[r], &status[r], 0);
					status[r] = -1;
				}
			return;
		}
		if (left)
			usleep(20000);
	}
}

int main(int argc, char **argv)
{
	if (argc >= 4 && !strcmp(argv[1], "--rank"))
		return rank_main(atoi(argv[2]), argv[3], argc >= 5 && !strcmp(argv[4], "--bench"));
	int do_bench = argc >= 2 && !strcmp(argv[1], "--bench");
	setvbuf(stdout, NULL, _IONBF, 0);
	char path[4096];
	cu_mod_path(path, sizeof path); /* skips where the module is not built */
	char self[4096], job[64];
	ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
	if (k <= 0) {
		printf("FAIL: /proc/self/exe: %s\n", strerror(errno));
		return 1;
	}
	self[k] = 0;
	snprintf(job, sizeof job, "%ld", (long)getpid());
	pid_t pid[WORLD];
	int status[WORLD] = {0}, skips = 0, bad = 0;
	for (int r = 0; r < WORLD; r++)
		pid[r] = spawn(self, r, job, do_bench);
	wait_ranks(pid, status);
	for (int r = 0; r < WORLD; r++) {
		int code = status[r] >= 0 && WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : -1;
		skips += code == SKIP;
		bad += code != 0 && code != SKIP;
		if (code < 0)
			printf("rank %d: ended by a signal (%d) or killed\n", r,
			       status[r] >= 0 && WIFSIGNALED(status[r]) ? WTERMSIG(status[r]) : SIGKILL);
		else if (code != 0 && code != SKIP)
			printf("rank %d: exit status %d\n", r, code);
	}
	if (bad) {
		printf("FAILED\n");
		return 1;
	}
	if (skips) {
		printf("skipped (the ranks said why above)\n");
		return SKIP;
	}
	printf("passed\n");
	return 0;
}
