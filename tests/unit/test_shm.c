/* Tests of the shared-memory transport (collectives/shm.c). Every test
 * forks the node's ranks as processes; a rank reports a failed check by
 * printing file:line and exiting non-zero, and the test (in the parent)
 * asserts that every rank exited 0. Timings are printed, never asserted. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "collectives/shm.h"
#include "tests/unit/coll_testlib.h"

#define MAXP HPUCOLL__SHM_MAX_PAYLOAD
#define LONG_MS 20000
#define PAIR_MSGS 20 /* more than the ring depth */
#define DEADLINE_MS 100000 /* for a test's rank processes to end */

#define CHECK(c)                                                              \
	do {                                                                  \
		if (!(c)) {                                                   \
			fprintf(stderr, "%s:%d: check failed: %s\n",          \
				__FILE__, __LINE__, #c);                      \
			_exit(1);                                             \
		}                                                             \
	} while (0)

#define CHECK_RC(x)                                                           \
	do {                                                                  \
		int rc_ = (x);                                                \
		if (rc_ != HPUCOLL_OK) {                                      \
			fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__,  \
				__LINE__, #x, rc_);                           \
			_exit(1);                                             \
		}                                                             \
	} while (0)

typedef void (*rank_fn)(int local, int nlocal, const char *job, void *arg);

static const size_t sizes[] = {0, 1, 4099, MAXP};

static void unique_job(char *buf, size_t n)
{
	static int k;

	snprintf(buf, n, "t%d-%d", (int)getpid(), k++);
}

static hpucoll__shm *open_rank(const char *job, int node, int local,
			       int nlocal)
{
	hpucoll__shm *s = NULL;
	char err[256] = "";
	int rc = hpucoll__shm_open(&s, job, node, local, nlocal, LONG_MS, err,
				   sizeof err);

	if (rc != HPUCOLL_OK) {
		fprintf(stderr, "rank %d: open failed (%d): %s\n", local, rc,
			err);
		_exit(1);
	}
	return s;
}

/* What a rank process runs: fn as local rank of nlocal in job. */
struct job_rank {
	rank_fn fn;
	int nlocal;
	const char *job;
	void *arg;
};

static int job_rank_main(int local, void *p)
{
	const struct job_rank *j = p;

	j->fn(local, j->nlocal, j->job, j->arg);
	return 0;
}

static pid_t fork_rank(rank_fn fn, int local, int nlocal, const char *job,
		       void *arg)
{
	struct job_rank j = {fn, nlocal, job, arg};

	return ct_fork(job_rank_main, local, &j);
}

/* Waits for the n rank processes pids; asserts that all exited 0. */
static void reap(pid_t *pids, int n)
{
	assert_int_equal(ct_reap(pids, n, DEADLINE_MS, 0), 0);
}

/* Runs fn as nlocal rank processes of a fresh job and checks that they
 * succeed and leave nothing in /dev/shm. */
static void run_ranks(int nlocal, rank_fn fn, void *arg)
{
	char job[64];
	struct job_rank j = {fn, nlocal, job, arg};

	unique_job(job, sizeof job);
	assert_int_equal(
		ct_run_ranks(nlocal, job_rank_main, &j, DEADLINE_MS, 0), 0);
	assert_int_equal(ct_shm_segments(job), 0);
}

/* ---- Content ---- */

static unsigned char pattern(int src, int dst, uint32_t k, size_t j)
{
	return (unsigned char)(src * 31 + dst * 17 + k * 7 + j * 13 +
			       (j >> 8));
}

static void fill(unsigned char *buf, size_t len, int src, int dst,
		 uint32_t k)
{
	for (size_t j = 0; j < len; j++)
		buf[j] = pattern(src, dst, k, j);
}

static struct hpucoll__hdr make_hdr(int src, int dst, uint32_t k, size_t len)
{
	struct hpucoll__hdr h = {
		.magic = HPUCOLL__MAGIC,
		.src = (uint32_t)src,
		.seq = k,
		.kind = HPUCOLL__ALL_REDUCE,
		.arg = (uint8_t)dst,
		.tag = (uint16_t)(k * 3),
		.off = (uint64_t)k * 1000003u + (uint64_t)src,
		.len = len,
	};
	return h;
}

static void send_msg(hpucoll__shm *s, unsigned char *buf, int src, int dst,
		     uint32_t k, size_t len)
{
	struct hpucoll__hdr h = make_hdr(src, dst, k, len);

	fill(buf, len, src, dst, k);
	CHECK_RC(hpucoll__shm_send(s, dst, &h, buf, LONG_MS));
}

static void recv_msg(hpucoll__shm *s, int src, int dst, uint32_t k,
		     size_t len)
{
	struct hpucoll__hdr want = make_hdr(src, dst, k, len), h;
	const unsigned char *p;

	CHECK_RC(hpucoll__shm_recv(s, src, &h, (const void **)&p, LONG_MS));
	CHECK(memcmp(&h, &want, sizeof h) == 0);
	for (size_t j = 0; j < len; j++)
		if (p[j] != pattern(src, dst, k, j)) {
			fprintf(stderr, "%d->%d msg %u byte %zu differs\n", src,
				dst, k, j);
			_exit(1);
		}
	hpucoll__shm_release(s, src);
}

/* ---- Exchange in every ordered pair ---- */

/* Pairs (a, b) in one global order; a sends PAIR_MSGS messages, b receives
 * them. Every rank follows the same order, so this cannot deadlock, and
 * the sender fills the ring and waits for the receiver. Then all ranks
 * exchange with all at once, round by round. */
static void pairs_rank(int me, int n, const char *job, void *arg)
{
	hpucoll__shm *s = open_rank(job, 0, me, n);
	unsigned char *buf = malloc(MAXP);
	uint32_t k;

	(void)arg;
	CHECK(buf != NULL);
	for (int a = 0; a < n; a++)
		for (int b = 0; b < n; b++) {
			if (a == b || (me != a && me != b))
				continue;
			for (k = 0; k < PAIR_MSGS; k++) {
				size_t len = sizes[k % 4];

				if (me == a)
					send_msg(s, buf, a, b, k, len);
				else
					recv_msg(s, a, b, k, len);
			}
		}
	for (k = PAIR_MSGS; k < PAIR_MSGS + 12; k++) {
		for (int d = 1; d < n; d++)
			send_msg(s, buf, me, (me + d) % n, k,
				 sizes[(k + me) % 4]);
		for (int d = 1; d < n; d++) {
			int src = (me + n - d) % n;

			recv_msg(s, src, me, k, sizes[(k + src) % 4]);
		}
	}
	free(buf);
	hpucoll__shm_close(&s);
	CHECK(s == NULL);
}

static void test_pairs_2(void **state)
{
	(void)state;
	run_ranks(2, pairs_rank, NULL);
}

static void test_pairs_3(void **state)
{
	(void)state;
	run_ranks(3, pairs_rank, NULL);
}

static void test_pairs_8(void **state)
{
	(void)state;
	run_ranks(8, pairs_rank, NULL);
}

/* ---- Payloads built in the slot ---- */

/* Rank 0 builds messages in the slots hpucoll__shm_slot hands out until
 * it says the ring is full (rank 1 does not receive before *go), then goes
 * on with slots where there is room and copied sends where not, and
 * leaves one slot written but unsent before a copied send. Rank 1 checks
 * every message. */
#define SLOT_MSGS (3 * PAIR_MSGS)

static void slot_rank(int me, int n, const char *job, void *arg)
{
	_Atomic int *go = arg;
	hpucoll__shm *s = open_rank(job, 0, me, n);
	unsigned char *buf = malloc(MAXP), *p;
	uint32_t k = 0, slots = 0;

	CHECK(buf != NULL);
	if (me == 1) {
		for (int i = 0; i < 100000 && !atomic_load(go); i++)
			usleep(1000);
		CHECK(atomic_load(go));
		for (k = 0; k < SLOT_MSGS; k++)
			recv_msg(s, 0, 1, k, sizes[k % 4]);
		goto out;
	}
	while ((p = hpucoll__shm_slot(s, 1)) != NULL) {
		struct hpucoll__hdr h = make_hdr(0, 1, k, sizes[k % 4]);

		CHECK(k < 64); /* the ring has a bound */
		fill(p, h.len, 0, 1, k);
		CHECK_RC(hpucoll__shm_send(s, 1, &h, p, LONG_MS));
		k++;
	}
	CHECK(k >= 2); /* at least MIN_SLOTS before the ring is full */
	atomic_store(go, 1);
	for (; k < SLOT_MSGS; k++) {
		struct hpucoll__hdr h = make_hdr(0, 1, k, sizes[k % 4]);

		p = hpucoll__shm_slot(s, 1);
		if (p != NULL && k % 5 == 0) { /* written, then not sent */
			memset(p, 0x5a, MAXP);
			p = NULL;
		}
		if (p == NULL) {
			send_msg(s, buf, 0, 1, k, h.len);
			continue;
		}
		slots++;
		fill(p, h.len, 0, 1, k);
		CHECK_RC(hpucoll__shm_send(s, 1, &h, p, LONG_MS));
	}
	printf("slot sends: %u of %d after the ring filled\n", slots,
	       SLOT_MSGS - PAIR_MSGS);
out:
	free(buf);
	hpucoll__shm_close(&s);
}

static void test_slot_send(void **state)
{
	_Atomic int *go = mmap(NULL, sizeof *go, PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	(void)state;
	assert_true(go != MAP_FAILED);
	atomic_store(go, 0);
	run_ranks(2, slot_rank, (void *)go);
	munmap((void *)go, sizeof *go);
}

/* ---- Latency and bandwidth (printed) ---- */

static void pingpong_rank(int me, int n, const char *job, void *arg)
{
	hpucoll__shm *s = open_rank(job, 0, me, n);
	struct hpucoll__hdr h = make_hdr(me, 1 - me, 0, 8), in;
	const void *p;
	uint64_t v = 42;
	int iters = 20000, warm = 2000;
	double t0 = 0;

	(void)arg;
	for (int i = 0; i < warm + iters; i++) {
		if (i == warm)
			t0 = ct_now_s();
		if (me == 0) {
			CHECK_RC(hpucoll__shm_send(s, 1, &h, &v, LONG_MS));
			CHECK_RC(hpucoll__shm_recv(s, 1, &in, &p, LONG_MS));
			CHECK(in.len == 8 && memcmp(p, &v, 8) == 0);
			hpucoll__shm_release(s, 1);
		} else {
			CHECK_RC(hpucoll__shm_recv(s, 0, &in, &p, LONG_MS));
			CHECK(in.len == 8);
			memcpy(&v, p, 8);
			hpucoll__shm_release(s, 0);
			CHECK_RC(hpucoll__shm_send(s, 0, &h, &v, LONG_MS));
		}
	}
	if (me == 0)
		printf("shm ping-pong, 8-byte messages: %.2f us round trip, %.2f us one way (%d iterations)\n",
		       (ct_now_s() - t0) / iters * 1e6,
		       (ct_now_s() - t0) / iters / 2 * 1e6, iters);
	hpucoll__shm_close(&s);
}

static void test_pingpong(void **state)
{
	(void)state;
	run_ranks(2, pingpong_rank, NULL);
}

#define STREAM_BYTES ((size_t)64 << 20)

/* Rank 1 streams STREAM_BYTES in max-payload messages to rank 0, which
 * copies each out (or, in the second round, only releases it). */
static void stream_rank(int me, int n, const char *job, void *arg)
{
	hpucoll__shm *s = open_rank(job, 0, me, n);
	unsigned char *buf = malloc(STREAM_BYTES);
	struct hpucoll__hdr h = make_hdr(me, 1 - me, 0, 0), in;
	const void *p;
	size_t nmsg = STREAM_BYTES / MAXP;

	(void)arg;
	CHECK(buf != NULL);
	memset(buf, me + 1, STREAM_BYTES);
	for (int round = 0; round < 6; round++) {
		int copy = round < 3;
		double t0;

		if (me == 1) {
			CHECK_RC(hpucoll__shm_recv(s, 0, &in, &p, LONG_MS));
			hpucoll__shm_release(s, 0);
			h.len = MAXP;
			for (size_t i = 0; i < nmsg; i++)
				CHECK_RC(hpucoll__shm_send(s, 0, &h,
							   buf + i * MAXP,
							   LONG_MS));
			continue;
		}
		CHECK_RC(hpucoll__shm_send(s, 1, &h, NULL, LONG_MS));
		t0 = ct_now_s();
		for (size_t i = 0; i < nmsg; i++) {
			CHECK_RC(hpucoll__shm_recv(s, 1, &in, &p, LONG_MS));
			CHECK(in.len == MAXP);
			if (copy)
				memcpy(buf + i * MAXP, p, MAXP);
			hpucoll__shm_release(s, 1);
		}
		printf("shm stream 64 MiB in %u-byte messages, receiver %s: %.2f GB/s\n",
		       MAXP, copy ? "copies out" : "only releases",
		       STREAM_BYTES / (ct_now_s() - t0) / 1e9);
	}
	if (me == 0)
		CHECK(buf[0] == 2 && buf[STREAM_BYTES - 1] == 2);
	free(buf);
	hpucoll__shm_close(&s);
}

static void memcpy_baseline(void)
{
	unsigned char *src = malloc(STREAM_BYTES), *dst = malloc(STREAM_BYTES);
	unsigned char *ring = malloc(8 * (size_t)MAXP);
	double best = 1e9, best_ring = 1e9, t0;

	assert_non_null(src);
	assert_non_null(dst);
	assert_non_null(ring);
	memset(src, 1, STREAM_BYTES);
	memset(dst, 2, STREAM_BYTES);
	memset(ring, 3, 8 * (size_t)MAXP);
	for (int r = 0; r < 3; r++) {
		t0 = ct_now_s();
		for (size_t off = 0; off < STREAM_BYTES; off += MAXP)
			memcpy(dst + off, src + off, MAXP);
		if (ct_now_s() - t0 < best)
			best = ct_now_s() - t0;
		t0 = ct_now_s();
		for (size_t off = 0; off < STREAM_BYTES; off += MAXP)
			memcpy(ring + off % (8 * (size_t)MAXP), src + off,
			       MAXP);
		if (ct_now_s() - t0 < best_ring)
			best_ring = ct_now_s() - t0;
	}
	printf("memcpy 64 MiB in %u-byte pieces, one thread: %.2f GB/s into a 64 MiB buffer, %.2f GB/s into a 2 MiB ring\n",
	       MAXP, STREAM_BYTES / best / 1e9, STREAM_BYTES / best_ring / 1e9);
	assert_int_equal(dst[STREAM_BYTES - 1], 1);
	free(src);
	free(dst);
	free(ring);
}

static void test_stream(void **state)
{
	(void)state;
	run_ranks(2, stream_rank, NULL);
	memcpy_baseline();
}

/* ---- Dead, silent and closed peers ---- */

static void exit_after_open(const char *job, int local, int nlocal)
{
	hpucoll__shm *s = open_rank(job, 0, local, nlocal);

	(void)s;
	_exit(0); /* dies attached, without closing */
}

/* Rank 0 forks rank 1 itself and never reaps it, so the dead peer stays a
 * zombie (kill(pid, 0) still succeeds) while rank 0 waits on it. */
static void dead_recv_rank(int me, int n, const char *job, void *arg)
{
	hpucoll__shm *s;
	struct hpucoll__hdr h;
	const void *p;
	double t0;
	int rc;

	(void)me;
	(void)arg;
	fflush(stdout);
	if (fork() == 0)
		exit_after_open(job, 1, n);
	s = open_rank(job, 0, 0, n);
	t0 = ct_now_s();
	rc = hpucoll__shm_recv(s, 1, &h, &p, LONG_MS);
	printf("recv from a dead (unreaped) peer: rc %d after %.0f ms: %s\n",
	       rc, (ct_now_s() - t0) * 1e3, hpucoll__shm_errmsg(s));
	CHECK(rc == HPUCOLL_EPEER);
	hpucoll__shm_close(&s);
}

static void dead_send_rank(int me, int n, const char *job, void *arg)
{
	hpucoll__shm *s;
	unsigned char *buf;
	struct hpucoll__hdr h = make_hdr(0, 1, 0, MAXP);
	double t0;
	int rc = HPUCOLL_OK, sent = 0;

	(void)arg;
	if (me == 1)
		exit_after_open(job, 1, n);
	s = open_rank(job, 0, 0, n);
	buf = calloc(1, MAXP);
	CHECK(buf != NULL);
	t0 = ct_now_s();
	while (sent < 100 &&
	       (rc = hpucoll__shm_send(s, 1, &h, buf, LONG_MS)) == HPUCOLL_OK)
		sent++;
	printf("send to a dead peer: rc %d after %d messages, %.0f ms: %s\n",
	       rc, sent, (ct_now_s() - t0) * 1e3, hpucoll__shm_errmsg(s));
	CHECK(rc == HPUCOLL_EPEER && sent < 100);
	free(buf);
	hpucoll__shm_close(&s);
}

static void test_dead_peer_recv(void **state)
{
	char job[64];
	pid_t pid;

	(void)state;
	unique_job(job, sizeof job);
	pid = fork_rank(dead_recv_rank, 0, 2, job, NULL);
	reap(&pid, 1);
	/* the zombie grandchild was reparented and reaped by init */
	assert_int_equal(ct_shm_segments(job), 0);
}

static void test_dead_peer_send(void **state)
{
	(void)state;
	run_ranks(2, dead_send_rank, NULL);
}

/* Rank 1 stays silent for 3 s, then closes. Rank 0 times out after
 * 200 ms, then sees the close as HPUCOLL_EPEER (the silence is long
 * enough for a loaded machine to start rank 0's wait within it). */
static void silent_rank(int me, int n, const char *job, void *arg)
{
	hpucoll__shm *s = open_rank(job, 0, me, n);
	struct hpucoll__hdr h;
	const void *p;
	double t0;
	int rc;

	(void)arg;
	if (me == 1) {
		usleep(3000000);
		hpucoll__shm_close(&s);
		return;
	}
	t0 = ct_now_s();
	rc = hpucoll__shm_recv(s, 1, &h, &p, 200);
	printf("recv from a silent peer, 200 ms timeout: rc %d after %.0f ms: %s\n",
	       rc, (ct_now_s() - t0) * 1e3, hpucoll__shm_errmsg(s));
	CHECK(rc == HPUCOLL_ETIMEDOUT);
	t0 = ct_now_s();
	rc = hpucoll__shm_recv(s, 1, &h, &p, LONG_MS);
	printf("recv from a peer that then closes: rc %d after %.0f ms: %s\n",
	       rc, (ct_now_s() - t0) * 1e3, hpucoll__shm_errmsg(s));
	CHECK(rc == HPUCOLL_EPEER);
	hpucoll__shm_close(&s);
}

static void test_silent_peer(void **state)
{
	(void)state;
	run_ranks(2, silent_rank, NULL);
}

/* ---- Segment names ---- */

static void wait_rank(int me, int n, const char *job, void *arg)
{
	hpucoll__shm *s = NULL;
	char err[256];
	int node = (int)(intptr_t)arg;

	(void)me;
	(void)n;
	hpucoll__shm_open(&s, job, node, 0, 2, -1, err, sizeof err);
	_exit(3); /* not reached: nobody else attaches */
}

static void make_file(const char *name, size_t size, int byte)
{
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	unsigned char buf[512];

	assert_true(fd >= 0);
	memset(buf, byte, sizeof buf);
	for (size_t off = 0; off < size; off += sizeof buf)
		assert_true(write(fd, buf, size - off < sizeof buf
						   ? size - off
						   : sizeof buf) > 0);
	close(fd);
}

static void test_unlink_job(void **state)
{
	char job[64], decoy[160];
	pid_t pid[2];
	int status;

	(void)state;
	unique_job(job, sizeof job);
	for (int node = 0; node < 2; node++)
		pid[node] = fork_rank(wait_rank, 0, 2, job,
				      (void *)(intptr_t)node);
	for (int i = 0; i < 500 && ct_shm_segments(job) < 2; i++)
		usleep(10000);
	usleep(50000);
	for (int node = 0; node < 2; node++) {
		kill(pid[node], SIGKILL);
		assert_int_equal(waitpid(pid[node], &status, 0), pid[node]);
		assert_true(WIFSIGNALED(status));
	}
	assert_int_equal(ct_shm_segments(job), 2);
	/* Job "<job>-n0" on node 1 must survive hpucoll__shm_unlink_job(job). */
	snprintf(decoy, sizeof decoy, "/hpucoll-%s-n0-n1", job);
	make_file(decoy, 0, 0);
	assert_int_equal(hpucoll__shm_unlink_job(job), 2);
	assert_int_equal(ct_shm_segments(job), 1);
	assert_int_equal(shm_unlink(decoy), 0);
	assert_int_equal(ct_shm_segments(job), 0);
	assert_int_equal(hpucoll__shm_unlink_job(job), 0);
}

/* Sets the modification time of /dev/shm/name back two minutes. */
static void age(const char *name)
{
	char path[256];
	struct timespec t[2] = {{.tv_sec = time(NULL) - 120}, {.tv_sec = time(NULL) - 120}};

	snprintf(path, sizeof path, "/dev/shm%s", name);
	assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
}

/* Whether rank 0 of segment name (from /dev/shm) has attached (as pid,
 * or any where pid is 0): its pid is in the segment's first rank record (shm.c's layout: the header's
 * block of 128 bytes, then struct seg_rank { int32 pid; ... }), written
 * after the header (a segment whose header is not written yet is one a
 * sweep takes for a crashed creator's). */
static int attached(const char *name, pid_t pid)
{
	char path[1024];
	int32_t seen = 0;
	snprintf(path, sizeof path, "/dev/shm%s", name);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	int ok = pread(fd, &seen, sizeof seen, 128) == (ssize_t)sizeof seen &&
		 (pid ? seen == (int32_t)pid : seen != 0);
	close(fd);
	return ok;
}

/* A job killed while its ranks attached (hpulaunch killed with -9, so
 * nobody ran hpucoll__shm_unlink_job for it) left its segment, 4 MiB to
 * 112 MiB, for good: a minute old with every attached rank dead, or
 * never initialised, it goes; a live rank's, a young one, another
 * layout's file stay. */
static void test_sweep_stale(void **state)
{
	char dead[64], live[80], young[80], nm[5][160], names[256];
	pid_t pid[3];
	int status;

	(void)state;
	unique_job(dead, sizeof dead);
	snprintf(live, sizeof live, "%s-live", dead);
	snprintf(young, sizeof young, "%s-young", dead);
	const char *jobs[3] = {dead, live, young};
	for (int k = 0; k < 3; k++)
		pid[k] = fork_rank(wait_rank, 0, 2, jobs[k], (void *)(intptr_t)0);
	snprintf(nm[0], sizeof nm[0], "/hpucoll-%s-n0", dead);
	snprintf(nm[1], sizeof nm[1], "/hpucoll-%s-n0", live);
	snprintf(nm[2], sizeof nm[2], "/hpucoll-%s-n0", young);
	/* every rank attached (a fixed 50 ms after the files appeared was
	 * too short on a loaded machine: the live one's header was not
	 * written yet, and the sweep took it for a crashed creator's) */
	int ready = 0;
	for (int i = 0; i < 6000 && ready < 3; i++) {
		ready = 0;
		for (int k = 0; k < 3; k++)
			ready += attached(nm[k], pid[k]);
		if (ready < 3)
			usleep(10000);
	}
	if (ready < 3) {
		for (int k = 0; k < 3; k++)
			kill(pid[k], SIGKILL);
		fail_msg("the ranks did not attach within 60 s");
	}
	for (int k = 0; k < 3; k += 2) {
		kill(pid[k], SIGKILL);
		assert_int_equal(waitpid(pid[k], &status, 0), pid[k]);
	}
	snprintf(nm[3], sizeof nm[3], "/hpucoll-%s-empty-n3", dead);
	snprintf(nm[4], sizeof nm[4], "/hpucoll-%s-other-n4", dead);
	make_file(nm[3], 0, 0);
	make_file(nm[4], 8192, 0xab);
	age(nm[0]);
	age(nm[1]);
	age(nm[3]);
	age(nm[4]);
	int n = hpucoll__shm_sweep_stale(names, sizeof names);
	printf("swept %d: %s\n", n, names);
	/* the live rank's part is done: not left waiting for good where an
	 * assertion below fails (its file stays until unlinked) */
	kill(pid[1], SIGKILL);
	assert_int_equal(waitpid(pid[1], &status, 0), pid[1]);
	assert_true(n >= 2); /* others' leftovers of this uid may go too */
	assert_non_null(strstr(names, nm[0] + 1));
	assert_non_null(strstr(names, nm[3] + 1));
	char path[256];
	const int stays[3] = {1, 2, 4};
	for (int k = 0; k < 3; k++) {
		snprintf(path, sizeof path, "/dev/shm%s", nm[stays[k]]);
		assert_int_equal(access(path, F_OK), 0);
	}
	snprintf(path, sizeof path, "/dev/shm%s", nm[0]);
	assert_int_equal(access(path, F_OK), -1);
	for (int k = 1; k < 5; k++)
		if (k != 3)
			shm_unlink(nm[k]);
	assert_int_equal(ct_shm_segments(dead), 0);
}

static int try_open(const char *job, int local, int nlocal, int timeout_ms)
{
	hpucoll__shm *s = NULL;
	char err[256] = "";
	int rc = hpucoll__shm_open(&s, job, 0, local, nlocal, timeout_ms, err,
				   sizeof err);

	printf("open (local %d of %d, %d ms): rc %d: %s\n", local, nlocal,
	       timeout_ms, rc, err);
	hpucoll__shm_close(&s);
	return rc;
}

static void test_foreign_segment(void **state)
{
	char job[64], name[128];

	(void)state;
	unique_job(job, sizeof job);
	snprintf(name, sizeof name, "/hpucoll-%s-n0", job);
	make_file(name, 100, 0xab);
	assert_int_equal(try_open(job, 0, 2, 1000), HPUCOLL_EPROTO);
	shm_unlink(name);
	make_file(name, 3 << 20, 0xab);
	assert_int_equal(try_open(job, 0, 2, 1000), HPUCOLL_EPROTO);
	shm_unlink(name);
	make_file(name, 0, 0); /* a creator that died before sizing it */
	assert_int_equal(try_open(job, 0, 2, 100), HPUCOLL_ETIMEDOUT);
	shm_unlink(name);
	assert_int_equal(try_open("bad/name", 0, 2, 100), HPUCOLL_EINVAL);
	assert_int_equal(try_open(job, 2, 2, 100), HPUCOLL_EINVAL);
	assert_int_equal(ct_shm_segments(job), 0);
}

/* A file another user made first at the job's name (mode 0666, or empty,
 * or even a well-formed segment) is refused at once, never mapped, never
 * waited on; so is one of our own user that others may open. */
static void test_squatted_segment(void **state)
{
	char job[64], name[128];

	(void)state;
	unique_job(job, sizeof job);
	snprintf(name, sizeof name, "/hpucoll-%s-n0", job);
	struct {
		uid_t uid;
		mode_t mode;
		size_t size;
	} squat[] = {{65534, 0666, 0}, {65534, 0600, 0}, {65534, 0666, 3 << 20},
		     {0, 0666, 0}, {0, 0640, 0}};
	for (size_t i = 0; i < sizeof squat / sizeof squat[0]; i++) {
		if (squat[i].uid != geteuid() && geteuid() != 0) {
			printf("skipping a foreign owner: not root\n");
			continue;
		}
		uid_t uid = squat[i].uid == 0 ? geteuid() : squat[i].uid;
		make_file(name, squat[i].size, 0);
		int fd = shm_open(name, O_RDWR, 0);
		assert_true(fd >= 0);
		assert_int_equal(fchown(fd, uid, (gid_t)-1), 0);
		assert_int_equal(fchmod(fd, squat[i].mode), 0);
		close(fd);
		hpucoll__shm *s = NULL;
		char err[256] = "";
		/* a 10 s timeout: the refusal must not be one */
		int rc = hpucoll__shm_open(&s, job, 0, 0, 2, 10000, err, sizeof err);
		printf("squatted by uid %u mode %04o: rc %d: %s\n", (unsigned)uid,
		       (unsigned)squat[i].mode, rc, err);
		assert_int_equal(rc, HPUCOLL_EPROTO);
		char want[160];
		snprintf(want, sizeof want,
			 "belongs to uid %u with mode %04o, not to this job (uid %u, mode 0600): refusing to map it",
			 (unsigned)uid, (unsigned)squat[i].mode, (unsigned)geteuid());
		assert_non_null(strstr(err, want));
		assert_null(s);
		/* the squatter's file is not ours to remove on the way out */
		struct stat st;
		char path[160];
		snprintf(path, sizeof path, "/dev/shm%s", name);
		assert_int_equal(stat(path, &st), 0);
		assert_int_equal(st.st_uid, uid);
		shm_unlink(name);
	}
	/* after a crash, only this user's segments of the job are removed,
	 * in both name forms */
	if (geteuid() == 0) {
		char mine[160], theirs[160];
		snprintf(mine, sizeof mine, "/hpucoll-%s-0123456789abcdef0123456789abcdef-n3", job);
		snprintf(theirs, sizeof theirs, "/hpucoll-%s-n1", job);
		make_file(mine, 0, 0);
		make_file(theirs, 0, 0);
		int fd = shm_open(theirs, O_RDWR, 0);
		assert_true(fd >= 0);
		assert_int_equal(fchown(fd, 65534, (gid_t)-1), 0);
		close(fd);
		assert_int_equal(hpucoll__shm_unlink_job(job), 1);
		assert_int_equal(ct_shm_segments(job), 1);
		assert_int_equal(shm_unlink(theirs), 0);
	}
	assert_int_equal(ct_shm_segments(job), 0);
}

/* A rank of nlocal 2 is waiting; one that says nlocal 3 must be refused,
 * one that reuses local rank 0 too. */
static void mismatch_rank(int me, int n, const char *job, void *arg)
{
	hpucoll__shm *s = NULL;
	char err[256];
	int rc;

	(void)arg;
	(void)n;
	if (me == 0) { /* waits long enough for rank 1 on a loaded machine */
		rc = hpucoll__shm_open(&s, job, 0, 0, 2, 5000, err, sizeof err);
		CHECK(rc == HPUCOLL_ETIMEDOUT);
		return;
	}
	char seg[320]; /* rank 0 attached first (a fixed 500 ms was a guess) */
	snprintf(seg, sizeof seg, "/hpucoll-%s-n0", job);
	for (int i = 0; i < 400 && !attached(seg, 0); i++)
		usleep(10000);
	rc = hpucoll__shm_open(&s, job, 0, 1, 3, 1000, err, sizeof err);
	printf("open with another nlocal: rc %d: %s\n", rc, err);
	CHECK(rc == HPUCOLL_EPROTO);
	rc = hpucoll__shm_open(&s, job, 0, 0, 2, 1000, err, sizeof err);
	printf("open of a taken local rank: rc %d: %s\n", rc, err);
	CHECK(rc == HPUCOLL_EPROTO);
	CHECK(strstr(err, "local rank 0 is already attached to shared memory") != NULL);
}

static void test_mismatch(void **state)
{
	(void)state;
	run_ranks(2, mismatch_rank, NULL);
}

/* A /dev/shm too small for even the shallowest ring (a container's
 * 64 MiB one, here a 256 KiB tmpfs mounted over it in a mount namespace
 * of a child) is an error at once, naming /dev/shm, not a SIGBUS later.
 * Needs CAP_SYS_ADMIN for the namespace; skipped without. */
static void test_small_dev_shm(void **state)
{
	char job[64], err[256] = "";
	hpucoll__shm *s = NULL;
	unsigned long long mib = 0;
	int status, pos = 0;
	pid_t pid;

	(void)state;
	unique_job(job, sizeof job);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (unshare(CLONE_NEWNS) < 0)
			_exit(77);
		if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
		    mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=256k,mode=1777") < 0)
			_exit(78);
		int rc = hpucoll__shm_open(&s, job, 0, 0, 2, 100, err, sizeof err);
		printf("open in a 256 KiB /dev/shm: rc %d: %s\n", rc, err);
		const char *at = strstr(err, "cannot reserve ");
		CHECK(rc != HPUCOLL_OK && s == NULL && at != NULL);
		CHECK(sscanf(at, "cannot reserve %llu MiB of shared memory in /dev/shm: %n", &mib,
			     &pos) == 1 && pos > 0);
		CHECK(strcmp(at + pos, "No space left on device") == 0);
		/* nothing is left in the small /dev/shm either */
		CHECK(ct_shm_segments(job) == 0);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) == 77 || WEXITSTATUS(status) == 78) {
		printf("skipping: no mount namespace with a tmpfs here (not root?)\n");
		return;
	}
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_equal(ct_shm_segments(job), 0);
}

/* ---- A corrupt length is a protocol error ---- */

struct corrupt {
	int sent[2]; /* rank 1 -> parent: the message is in the ring */
	int go[2];   /* parent -> rank 0: receive it now */
};

static void corrupt_rank(int me, int n, const char *job, void *arg)
{
	struct corrupt *c = arg;
	hpucoll__shm *s = open_rank(job, 0, me, n);
	struct hpucoll__hdr h = make_hdr(1, 0, 0x5eed5eed, 8);
	const void *p;
	uint64_t v = 7;
	char b = 1;
	int rc;

	if (me == 1) {
		CHECK_RC(hpucoll__shm_send(s, 0, &h, &v, LONG_MS));
		CHECK(write(c->sent[1], &b, 1) == 1);
		hpucoll__shm_close(&s);
		return;
	}
	CHECK(read(c->go[0], &b, 1) == 1);
	rc = hpucoll__shm_recv(s, 1, &h, &p, LONG_MS);
	printf("recv of a corrupt header: rc %d: %s\n", rc,
	       hpucoll__shm_errmsg(s));
	CHECK(rc == HPUCOLL_EPROTO);
	hpucoll__shm_close(&s);
}

static void test_corrupt_len(void **state)
{
	struct corrupt c;
	struct hpucoll__hdr h = make_hdr(1, 0, 0x5eed5eed, 8);
	char job[64], name[128], b;
	unsigned char *base, *hit;
	struct stat st = {0};
	pid_t pid[2];
	int fd = -1;

	(void)state;
	assert_int_equal(pipe(c.sent), 0);
	assert_int_equal(pipe(c.go), 0);
	unique_job(job, sizeof job);
	snprintf(name, sizeof name, "/hpucoll-%s-n0", job);
	pid[0] = fork_rank(corrupt_rank, 0, 2, job, &c);
	for (int i = 0; i < 500 && st.st_size == 0; i++) {
		if (fd < 0)
			fd = shm_open(name, O_RDWR, 0);
		if (fd >= 0)
			fstat(fd, &st);
		usleep(2000);
	}
	assert_true(st.st_size > 0);
	base = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		    0);
	assert_true(base != MAP_FAILED);
	close(fd);
	pid[1] = fork_rank(corrupt_rank, 1, 2, job, &c);
	assert_int_equal(read(c.sent[0], &b, 1), 1);
	hit = memmem(base, st.st_size, &h, sizeof h);
	assert_non_null(hit);
	h.len = (uint64_t)MAXP + 1;
	memcpy(hit, &h, sizeof h);
	assert_int_equal(write(c.go[1], &b, 1), 1);
	reap(pid, 2);
	munmap(base, st.st_size);
	for (int i = 0; i < 2; i++) {
		close(c.sent[i]);
		close(c.go[i]);
	}
	assert_int_equal(ct_shm_segments(job), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pairs_2),
		cmocka_unit_test(test_pairs_3),
		cmocka_unit_test(test_pairs_8),
		cmocka_unit_test(test_slot_send),
		cmocka_unit_test(test_pingpong),
		cmocka_unit_test(test_stream),
		cmocka_unit_test(test_dead_peer_recv),
		cmocka_unit_test(test_dead_peer_send),
		cmocka_unit_test(test_silent_peer),
		cmocka_unit_test(test_unlink_job),
		cmocka_unit_test(test_sweep_stale),
		cmocka_unit_test(test_squatted_segment),
		cmocka_unit_test(test_foreign_segment),
		cmocka_unit_test(test_mismatch),
		cmocka_unit_test(test_small_dev_shm),
		cmocka_unit_test(test_corrupt_len),
	};

	setvbuf(stdout, NULL, _IOLBF, 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
