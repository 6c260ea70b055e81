/* worker/strategy/swap.c: the NVMe tier's swap store. Pipelined round
 * trips through a queue shorter than the transfers, waits out of order,
 * the refusals at open (each sentence checked), transfers refused, no
 * file left behind (closed, killed, or by a dead run), and running out of
 * space at open and at a write, on small loop-mounted filesystems. */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/strategy/swap.h"

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

#define MiB (1024u * 1024u)

/* A directory on a disk filesystem, made for this run. */
static char base[PATH_MAX];
static char err[1024];

static const char *at(const char *name)
{
	static char p[4][PATH_MAX + 64];
	static int k;
	char *s = p[k++ & 3];
	snprintf(s, sizeof p[0], "%s/%s", base, name);
	return s;
}

static int is_tmpfs(const char *path)
{
	struct statfs fs;
	return statfs(path, &fs) == 0 && (unsigned long)fs.f_type == TMPFS_MAGIC;
}

static int run(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof cmd, fmt, ap);
	va_end(ap);
	return system(cmd);
}

/* /tmp, unless it is tmpfs (which the store refuses): then the current
 * directory, the build tree under ctest. */
static int setup(void **state)
{
	(void)state;
	const char *parent = is_tmpfs("/tmp") ? "." : "/tmp";
	char cwd[PATH_MAX - 32];
	if (parent[0] == '.') {
		if (!getcwd(cwd, sizeof cwd))
			return -1;
		parent = cwd;
	}
	snprintf(base, sizeof base, "%s/test_swap.XXXXXX", parent);
	return mkdtemp(base) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	/* A failed test may have left its mount. */
	run("for m in '%s'/*; do mountpoint -q \"$m\" && umount \"$m\"; done; true", base);
	return run("rm -rf '%s'", base);
}

/* A fresh empty directory under base. */
static const char *fresh_dir(const char *name)
{
	const char *d = at(name);
	run("rm -rf '%s'", d);
	assert_int_equal(mkdir(d, 0700), 0);
	return d;
}

/* Entries of dir but . and .. (printed when not `want`). */
static int entries_want(const char *dir, int want)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;
	assert_non_null(d);
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	rewinddir(d);
	while (n != want && (e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			print_message("  in %s: %s\n", dir, e->d_name);
	closedir(d);
	return n;
}

static int entries(const char *dir)
{
	return entries_want(dir, 0);
}

static int exists(const char *dir, const char *name)
{
	char p[PATH_MAX + 64];
	struct stat st;
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return stat(p, &st) == 0;
}

static void touch(const char *dir, const char *name)
{
	char p[PATH_MAX + 64];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	int fd = open(p, O_CREAT | O_WRONLY, 0600);
	assert_true(fd >= 0);
	close(fd);
}

static void assert_has(const char *text, const char *part)
{
	if (!strstr(text, part))
		fail_msg("'%s' does not say '%s'", text, part);
}

static void fill_random(uint32_t *p, size_t words, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	for (size_t i = 0; i < words; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint32_t)(x >> 16);
	}
}

/* The first differing byte of a and b, or -1. */
static long first_diff(const void *a, const void *b, size_t n)
{
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++)
		if (x[i] != y[i])
			return (long)i;
	return -1;
}

static void assert_same(const void *got, const void *want, size_t n, const char *what)
{
	long d = first_diff(got, want, n);
	if (d >= 0)
		fail_msg("%s differs first at byte %ld of %zu", what, d, n);
}

static hpu_swap *open_ok(const char *dir, const char *tag, uint64_t bytes,
			 const hpu_swap_opts *o)
{
	hpu_swap *s = hpu__swap_open(dir, tag, "optimizer state", bytes, o, err, sizeof err);
	if (!s)
		fail_msg("hpu__swap_open %s: %s", dir, err);
	return s;
}

static void ok(hpu_swap *s, int rc)
{
	if (rc < 0)
		fail_msg("%s", hpu__swap_error(s));
}

/* ---- round trips ---- */

#define NSUB 16
#define SUB (4 * MiB)
#define NBUF 3

/* DeepSpeed's pipelined optimizer swapping over 16 sub-groups of 4 MiB
 * with 3 buffers, through 64 KiB requests and a queue of 2 (so each 4 MiB
 * transfer waits in the store for entries): the state written out first,
 * then a step that reads sub-group i+1 and writes i-1 while i is
 * updated, then everything read back in one transfer. */
static void pipelined(int single_submit, int overlap_events)
{
	hpu_swap_opts o;
	hpu__swap_opts_defaults(&o);
	o.block_size = 64 * 1024;
	o.queue_depth = 2;
	o.single_submit = single_submit;
	o.overlap_events = overlap_events;
	const char *dir = fresh_dir("pipe");
	hpu_swap *s = open_ok(dir, "r0-optim", (uint64_t)NSUB * SUB, &o);
	uint32_t *ref = malloc((size_t)NSUB * SUB);
	uint8_t *buf[NBUF];
	int wt[NBUF], rt[NBUF];
	assert_non_null(ref);
	fill_random(ref, (size_t)NSUB * SUB / 4, 7 + single_submit);
	for (int b = 0; b < NBUF; b++) {
		buf[b] = hpu__swap_buffer(SUB);
		assert_non_null(buf[b]);
		wt[b] = rt[b] = -1;
	}
	/* The file is unnamed while open (O_TMPFILE on ext4). */
	assert_int_equal(entries(dir), 0);

	for (int i = 0; i < NSUB; i++) {
		int b = i % NBUF;
		if (wt[b] >= 0)
			ok(s, hpu__swap_wait(s, wt[b]));
		memcpy(buf[b], (char *)ref + (size_t)i * SUB, SUB);
		wt[b] = hpu__swap_write(s, (uint64_t)i * SUB, buf[b], SUB);
		ok(s, wt[b]);
	}
	ok(s, hpu__swap_wait_all(s));
	for (int b = 0; b < NBUF; b++)
		wt[b] = -1;

	rt[0] = hpu__swap_read(s, 0, buf[0], SUB);
	ok(s, rt[0]);
	for (int i = 0; i < NSUB; i++) {
		int b = i % NBUF, nb = (i + 1) % NBUF;
		ok(s, hpu__swap_wait(s, rt[b]));
		if (i + 1 < NSUB) {
			/* nb last held sub-group i-2, whose write may be in flight. */
			if (wt[nb] >= 0)
				ok(s, hpu__swap_wait(s, wt[nb]));
			wt[nb] = -1;
			rt[nb] = hpu__swap_read(s, (uint64_t)(i + 1) * SUB, buf[nb], SUB);
			ok(s, rt[nb]);
		}
		uint32_t *sg = ref + (size_t)i * SUB / 4, *w = (uint32_t *)buf[b];
		assert_same(w, sg, SUB, "a sub-group read back during the step");
		for (size_t k = 0; k < SUB / 4; k++)
			sg[k] = w[k] = w[k] * 2654435761u + (uint32_t)i;
		wt[b] = hpu__swap_write(s, (uint64_t)i * SUB, buf[b], SUB);
		ok(s, wt[b]);
	}
	ok(s, hpu__swap_wait_all(s));

	uint8_t *all = hpu__swap_buffer((size_t)NSUB * SUB);
	assert_non_null(all);
	memset(all, 0xee, (size_t)NSUB * SUB);
	ok(s, hpu__swap_wait(s, hpu__swap_read(s, 0, all, (size_t)NSUB * SUB)));
	assert_same(all, ref, (size_t)NSUB * SUB, "the store read back whole");

	uint64_t rd, wr;
	double ws;
	hpu__swap_stats(s, &rd, &wr, &ws);
	assert_int_equal(rd, 2ull * NSUB * SUB);
	assert_int_equal(wr, 2ull * NSUB * SUB);
	assert_true(ws >= 0);
	hpu__swap_close(s);
	assert_int_equal(entries(dir), 0);
	for (int b = 0; b < NBUF; b++)
		free(buf[b]);
	free(all);
	free(ref);
}

static void test_pipelined_batched(void **state)
{
	(void)state;
	pipelined(0, 1);
}

static void test_pipelined_single_submit(void **state)
{
	(void)state;
	pipelined(1, 1);
}

/* Without overlap_events queued requests only move in the waits. */
static void test_pipelined_no_overlap(void **state)
{
	(void)state;
	pipelined(0, 0);
}

/* Tickets waited for in another order than issued keep their contents;
 * a ticket retires once. */
static void test_out_of_order(void **state)
{
	(void)state;
	hpu_swap_opts o;
	hpu__swap_opts_defaults(&o);
	o.block_size = 256 * 1024;
	o.queue_depth = 3;
	const char *dir = fresh_dir("ooo");
	hpu_swap *s = open_ok(dir, "r1-params", 4 * MiB, &o);
	uint8_t *w[4], *r[4];
	int t[4];
	for (int i = 0; i < 4; i++) {
		w[i] = hpu__swap_buffer(MiB);
		r[i] = hpu__swap_buffer(MiB);
		fill_random((uint32_t *)w[i], MiB / 4, 100 + i);
		memset(r[i], 0, MiB);
		t[i] = hpu__swap_write(s, (uint64_t)i * MiB, w[i], MiB);
		ok(s, t[i]);
	}
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < i; j++)
			assert_int_not_equal(t[i], t[j]);
	ok(s, hpu__swap_wait(s, t[3]));
	ok(s, hpu__swap_wait(s, t[1]));
	ok(s, hpu__swap_wait(s, t[0]));
	ok(s, hpu__swap_wait(s, t[2]));
	assert_int_equal(hpu__swap_wait(s, t[2]), -1);
	assert_has(hpu__swap_error(s), "already waited for");
	assert_int_equal(hpu__swap_wait(s, 12345), -1);

	/* Read in reverse, into each other's places, waited for last first. */
	for (int i = 3; i >= 0; i--) {
		t[i] = hpu__swap_read(s, (uint64_t)i * MiB, r[i], MiB);
		ok(s, t[i]);
	}
	ok(s, hpu__swap_wait(s, t[0]));
	assert_same(r[0], w[0], MiB, "sub-group 0");
	ok(s, hpu__swap_wait(s, t[2]));
	ok(s, hpu__swap_wait_all(s));
	for (int i = 0; i < 4; i++) {
		assert_same(r[i], w[i], MiB, "a sub-group read out of order");
		free(w[i]);
		free(r[i]);
	}
	hpu__swap_close(s);
}

/* ---- refusals ---- */

static void refused(const char *dir, uint64_t bytes, const hpu_swap_opts *o, const char *tag,
		    const char *part)
{
	err[0] = 0;
	hpu_swap *s = hpu__swap_open(dir, tag, "optimizer state", bytes, o, err, sizeof err);
	if (s) {
		hpu__swap_close(s);
		fail_msg("the store in %s was opened, not refused for '%s'", dir, part);
	}
	assert_has(err, part);
}

static void test_refused_dir(void **state)
{
	(void)state;
	refused(at("missing"), MiB, NULL, "r0", "does not exist");
	refused(at("missing"), MiB, NULL, "r0", at("missing"));
	refused(at("missing"), MiB, NULL, "r0", "optimizer state");
	touch(base, "plain");
	refused(at("plain"), MiB, NULL, "r0", "is not a directory");
	refused(at("plain"), MiB, NULL, "r0", at("plain"));
	/* a relative directory says where it led (the worker's working
	 * directory, which under hpud is /) */
	char cwd[4096], want[8300];
	assert_non_null(getcwd(cwd, sizeof cwd));
	snprintf(want, sizeof want, "the swap directory no-such-swap (%s/no-such-swap: relative to "
				    "the worker's working directory) for optimizer state does not exist", cwd);
	refused("no-such-swap", MiB, NULL, "r0", want);
	const char *d = fresh_dir("free");
	refused(d, 1ull << 50, NULL, "r0", "GiB free, after");
	refused(d, 1ull << 50, NULL, "r0", "needs 1048576.0 GiB; ");
	refused(d, 1ull << 50, NULL, "r0", d);
	assert_int_equal(entries(d), 0);
}

static void test_refused_opts(void **state)
{
	(void)state;
	hpu_swap_opts o;
	const char *d = fresh_dir("opts");
	hpu__swap_opts_defaults(&o);
	o.block_size = 1000;
	refused(d, MiB, &o, "r0", "aio.block_size 1000");
	hpu__swap_opts_defaults(&o);
	o.queue_depth = 0;
	refused(d, MiB, &o, "r0", "aio.queue_depth 0");
	refused(d, MiB, NULL, "a/b", "tag 'a/b'");
	refused(d, MiB, NULL, "", "tag ''");
	assert_int_equal(entries(d), 0);
}

/* /dev/shm is tmpfs: memory, and refused as such. */
static void test_refused_tmpfs(void **state)
{
	(void)state;
	if (!is_tmpfs("/dev/shm")) {
		print_message("  /dev/shm is not tmpfs here: skipped\n");
		skip();
	}
	refused("/dev/shm", MiB, NULL, "r0", "/dev/shm");
	refused("/dev/shm", MiB, NULL, "r0", "give a path on a disk filesystem");
}

/* A mount for a test: `opts` are mount's options; 0, or -1 after saying
 * why. */
static int mount_at(const char *dir, const char *type, const char *opts)
{
	if (run("mount -t %s -o %s none '%s' 2>/dev/null", type, opts, dir)) {
		print_message("  cannot mount %s on %s (not root, or no privileges): skipped\n",
			      type, dir);
		return -1;
	}
	return 0;
}

/* ramfs refuses O_DIRECT at open (EINVAL), as tmpfs did before Linux 6.6;
 * neither way of creating the file leaves it there. */
static void test_refused_no_odirect(void **state)
{
	(void)state;
	const char *d = fresh_dir("ramfs");
	if (mount_at(d, "ramfs", "mode=0700"))
		skip();
	refused(d, MiB, NULL, "r0", "does not support O_DIRECT (tmpfs?); give a path on a "
				    "disk filesystem");
	refused(d, MiB, NULL, "r0", d);
	hpu__swap_no_tmpfile = 1;
	refused(d, MiB, NULL, "r0", "does not support O_DIRECT");
	hpu__swap_no_tmpfile = 0;
	int left = entries(d);
	run("umount '%s'", d);
	assert_int_equal(left, 0);
}

static void test_refused_not_writable(void **state)
{
	(void)state;
	const char *d = fresh_dir("ro");
	int mounted = 0;
	if (geteuid() == 0) {
		/* Root writes through any mode bits: a read-only mount. */
		if (mount_at(d, "ramfs", "ro"))
			skip();
		mounted = 1;
	} else {
		assert_int_equal(chmod(d, 0500), 0);
	}
	err[0] = 0;
	hpu_swap *s = hpu__swap_open(d, "r0", "parameters", MiB, NULL, err, sizeof err);
	if (mounted)
		run("umount '%s'", d);
	else
		chmod(d, 0700);
	hpu__swap_close(s);
	assert_null(s);
	assert_has(err, "is not writable");
	assert_has(err, d);
	assert_has(err, "parameters");
}

/* err names the swap directory as "DIR/(unnamed swap file)", never the
 * "hpu-swap-PID-TAG.bin" name the file has at most for an instant. */
static void assert_unnamed(const char *dir)
{
	char where[PATH_MAX + 64];
	snprintf(where, sizeof where, "%s/(unnamed swap file)", dir);
	assert_has(err, where);
	if (strstr(err, "hpu-swap-"))
		fail_msg("the message names a file that is not there: %s", err);
}

/* A failure after the file's name is gone (fallocate refused past the
 * file size limit, as `ulimit -f` sets it) or before it was made
 * (io_uring set up with no file descriptor left) names the directory. */
static void test_refused_names_directory(void **state)
{
	(void)state;
	const char *d = fresh_dir("named");
	struct rlimit was, lim;
	for (int named = 0; named < 2; named++) {
		hpu__swap_no_tmpfile = named;
		getrlimit(RLIMIT_FSIZE, &was);
		lim = was;
		lim.rlim_cur = 100 * 1024;
		signal(SIGXFSZ, SIG_IGN);
		setrlimit(RLIMIT_FSIZE, &lim);
		err[0] = 0;
		hpu_swap *s = hpu__swap_open(d, "r0", "optimizer state", MiB, NULL, err,
					     sizeof err);
		setrlimit(RLIMIT_FSIZE, &was);
		signal(SIGXFSZ, SIG_DFL);
		hpu__swap_no_tmpfile = 0;
		hpu__swap_close(s);
		assert_null(s);
		assert_has(err, "cannot reserve 1.0 MiB for the swap file");
		assert_has(err, "File too large");
		assert_unnamed(d);
	}
	/* No descriptor free for the ring: the lowest free one is the limit. */
	int fd = dup(0);
	assert_true(fd >= 0);
	close(fd);
	getrlimit(RLIMIT_NOFILE, &was);
	lim = was;
	lim.rlim_cur = (rlim_t)fd;
	setrlimit(RLIMIT_NOFILE, &lim);
	err[0] = 0;
	hpu_swap *s = hpu__swap_open(d, "r0", "optimizer state", MiB, NULL, err, sizeof err);
	setrlimit(RLIMIT_NOFILE, &was);
	hpu__swap_close(s);
	assert_null(s);
	assert_has(err, "io_uring");
	assert_unnamed(d);
	assert_int_equal(entries(d), 0);
}

/* Transfers outside the store or misaligned are refused, nothing started;
 * space reserved and never written reads as zeros. */
static void test_refused_transfer(void **state)
{
	(void)state;
	const char *d = fresh_dir("xfer");
	hpu_swap *s = open_ok(d, "r0", MiB + 1, NULL);  /* rounded up to MiB + 4096 */
	uint8_t *b = hpu__swap_buffer(2 * MiB);
	alarm(20);  /* a hang fails instead of blocking ctest */
	assert_int_equal(hpu__swap_read(s, MiB + 4096, b, 4096), -1);
	assert_has(hpu__swap_error(s), "past the end");
	assert_has(hpu__swap_error(s), hpu__swap_path(s));
	assert_int_equal(hpu__swap_read(s, 0, b, 2 * MiB), -1);
	assert_has(hpu__swap_error(s), "past the end");
	assert_int_equal(hpu__swap_write(s, UINT64_MAX - 4095, b, 4096), -1);
	assert_has(hpu__swap_error(s), "past the end");
	assert_int_equal(hpu__swap_read(s, 512, b, 4096), -1);
	assert_has(hpu__swap_error(s), "multiples of 4096");
	assert_int_equal(hpu__swap_read(s, 0, b + 512, 4096), -1);
	assert_has(hpu__swap_error(s), "multiples of 4096");
	assert_int_equal(hpu__swap_write(s, 0, b, 100), -1);
	assert_has(hpu__swap_error(s), "multiples of 4096");

	memset(b, 0x5a, 2 * MiB);
	ok(s, hpu__swap_wait(s, hpu__swap_read(s, 0, b, MiB + 4096)));
	for (size_t i = 0; i < MiB + 4096; i++)
		if (b[i])
			fail_msg("byte %zu of the unwritten store is %d", i, b[i]);
	ok(s, hpu__swap_wait_all(s));
	alarm(0);
	hpu__swap_close(s);
	free(b);
	hpu__swap_close(NULL);
}

/* ---- no file left behind ---- */

static void no_files_left(int named)
{
	const char *d = fresh_dir("left");
	hpu__swap_no_tmpfile = named;
	hpu_swap *s = open_ok(d, "r3-optim", 2 * MiB, NULL);
	hpu__swap_no_tmpfile = 0;
	/* Unnamed either way: O_TMPFILE, or unlinked right after creating;
	 * its messages say so (they named a path that was not there) */
	assert_has(hpu__swap_path(s), "/(unnamed swap file)");
	assert_null(strstr(hpu__swap_path(s), "/hpu-swap-"));
	assert_int_equal(entries(d), 0);
	uint8_t *w = hpu__swap_buffer(2 * MiB), *r = hpu__swap_buffer(2 * MiB);
	fill_random((uint32_t *)w, 2 * MiB / 4, 3);
	ok(s, hpu__swap_write(s, 0, w, 2 * MiB));
	ok(s, hpu__swap_wait_all(s));
	ok(s, hpu__swap_wait(s, hpu__swap_read(s, 0, r, 2 * MiB)));
	assert_same(r, w, 2 * MiB, "the unnamed file's contents");
	hpu__swap_close(s);
	assert_int_equal(entries(d), 0);
	free(w);
	free(r);
}

static void test_no_files_tmpfile(void **state)
{
	(void)state;
	no_files_left(0);
}

static void test_no_files_named(void **state)
{
	(void)state;
	no_files_left(1);
}

/* A child that opens a store, writes, and is killed with SIGKILL leaves
 * nothing in dir. */
static void killed(int named)
{
	const char *d = fresh_dir("killed");
	int p[2];
	assert_int_equal(pipe(p), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		char e[512];
		close(p[0]);
		hpu__swap_no_tmpfile = named;
		hpu_swap *s = hpu__swap_open(d, "r0-optim", "optimizer state", 8 * MiB, NULL, e,
					     sizeof e);
		void *b = hpu__swap_buffer(8 * MiB);
		if (!s || !b)
			_exit(1);
		memset(b, 1, 8 * MiB);
		if (hpu__swap_wait(s, hpu__swap_write(s, 0, b, 8 * MiB)))
			_exit(1);
		/* A second write in flight when the kill comes. */
		hpu__swap_write(s, 0, b, 8 * MiB);
		if (write(p[1], "k", 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(p[1]);
	char c;
	ssize_t n = read(p[0], &c, 1);
	close(p[0]);
	kill(pid, SIGKILL);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_int_equal(n, 1);  /* else the child could not open or write */
	assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	assert_int_equal(entries(d), 0);
}

static void test_killed_tmpfile(void **state)
{
	(void)state;
	killed(0);
}

static void test_killed_named(void **state)
{
	(void)state;
	killed(1);
}

/* A file of a run killed while its file had a name is removed by the
 * next open; live processes' files and other names stay. */
static void test_stale_removed(void **state)
{
	(void)state;
	const char *d = fresh_dir("stale");
	pid_t dead = fork();
	assert_true(dead >= 0);
	if (dead == 0)
		_exit(0);
	assert_int_equal(waitpid(dead, NULL, 0), dead);
	char stale[64], other[64], live[64];
	snprintf(stale, sizeof stale, "hpu-swap-%d-x.bin", (int)dead);
	snprintf(other, sizeof other, "hpu-swap-%d-x.txt", (int)dead);
	snprintf(live, sizeof live, "hpu-swap-%d-y.bin", (int)getppid());
	touch(d, stale);
	touch(d, other);
	touch(d, live);
	touch(d, "hpu-swap-x-y.bin");
	hpu_swap *s = open_ok(d, "r0", MiB, NULL);
	assert_false(exists(d, stale));
	assert_true(exists(d, other));
	assert_true(exists(d, live));
	assert_true(exists(d, "hpu-swap-x-y.bin"));
	hpu__swap_close(s);
	assert_int_equal(entries_want(d, 3), 3);
}

/* ---- out of space ---- */

/* A 16 MiB filesystem of `type` on a loop file, mounted on a fresh
 * directory; 0, or -1 after saying why not. */
static int loop_fs(const char *type, const char *dir)
{
	const char *img = at("fs.img");
	if (run("dd if=/dev/zero of='%s' bs=1M count=16 status=none && mkfs.%s -q -F '%s' "
		">/dev/null 2>&1", img, type, img)) {
		print_message("  cannot make a %s filesystem (mkfs.%s): skipped\n", type, type);
		return -1;
	}
	if (run("mount -o loop '%s' '%s' 2>/dev/null", img, dir)) {
		print_message("  cannot loop-mount %s (no root or no loop devices): skipped\n",
			      img);
		unlink(img);
		return -1;
	}
	return 0;
}

static void loop_fs_gone(const char *dir)
{
	run("umount '%s'", dir);
	unlink(at("fs.img"));
}

/* A store bigger than the free space is refused at open; one that fits
 * takes its space, so the next one no longer fits. */
static void test_enospc_at_open(void **state)
{
	(void)state;
	const char *d = fresh_dir("small");
	if (loop_fs("ext4", d))
		skip();
	char e1[1024], e2[1024];
	hpu_swap *big = hpu__swap_open(d, "r0", "optimizer state", 32 * MiB, NULL, e1, sizeof e1);
	hpu_swap *fits = hpu__swap_open(d, "r0", "optimizer state", 9 * MiB, NULL, e2, sizeof e2);
	hpu_swap *more = fits ? hpu__swap_open(d, "r1", "optimizer state", 9 * MiB, NULL, err,
					       sizeof err)
			      : NULL;
	int left = entries_want(d, 1);
	hpu__swap_close(more);
	hpu__swap_close(fits);
	hpu__swap_close(big);
	loop_fs_gone(d);
	assert_null(big);
	assert_has(e1, "needs 32.0 MiB; ");
	assert_has(e1, " MiB free, after the files already there (the swap files of ranks "
		       "sharing the directory among them)");
	assert_has(e1, d);
	if (!fits)
		fail_msg("a 9 MiB store on 16 MiB: %s", e2);
	assert_null(more);
	assert_has(err, "needs 9.0 MiB; ");
	assert_has(err, " MiB free, after the files already there");
	if (strstr(err, "0.00"))
		fail_msg("a size reads as nothing: %s", err);
	assert_int_equal(left, 1);  /* lost+found */
}

/* Two ranks opening their stores at once, each fitting alone, not both:
 * both may pass the free-space check before either reserves, and the
 * second's reservation then fails. The figure it says is what the file
 * system has once its own refused blocks are given back (it said 0
 * bytes with them held). Each child writes its message to a pipe. */
static void test_enospc_two_at_once(void **state)
{
	(void)state;
	const char *d = fresh_dir("race");
	if (loop_fs("ext4", d))
		skip();
	struct statvfs v;
	assert_int_equal(statvfs(d, &v), 0);
	size_t each = (size_t)v.f_bavail * v.f_frsize / 5 * 3;
	int go[2], said[2][2];
	assert_int_equal(pipe(go), 0);
	pid_t pid[2];
	for (int k = 0; k < 2; k++) {
		assert_int_equal(pipe(said[k]), 0);
		if ((pid[k] = fork()) == 0) {
			char c, who[8], e[1024 + 2] = "";
			close(go[1]);
			if (read(go[0], &c, 1) != 1)
				_exit(3);
			snprintf(who, sizeof who, "r%d", k);
			hpu_swap *s = hpu__swap_open(d, who, "optimizer state", each, NULL, e, sizeof e - 2);
			strcat(e, "\n"); /* never empty: the parent reads until it */
			ssize_t w = write(said[k][1], e, strlen(e));
			(void)w;
			/* held until the other has tried too */
			if (read(go[0], &c, 1) != 0)
				_exit(3);
			hpu__swap_close(s);
			_exit(s ? 0 : 1);
		}
		close(said[k][1]);
	}
	close(go[0]);
	assert_int_equal(write(go[1], "gg", 2), 2);
	char e[2][1024] = {"", ""};
	for (int k = 0; k < 2; k++) {
		ssize_t n = read(said[k][0], e[k], sizeof e[k] - 1);
		e[k][n > 0 ? n - 1 : 0] = 0;
		close(said[k][0]);
	}
	close(go[1]); /* both have tried: they close and exit */
	int st[2];
	for (int k = 0; k < 2; k++)
		waitpid(pid[k], &st[k], 0);
	int left = entries_want(d, 1);
	loop_fs_gone(d);
	if (!WIFEXITED(st[0]) || !WIFEXITED(st[1]) || WEXITSTATUS(st[0]) + WEXITSTATUS(st[1]) < 1)
		fail_msg("want at most one store to fit: %s | %s", e[0], e[1]);
	for (int k = 0; k < 2; k++) {
		if (WEXITSTATUS(st[k]) != 1)
			continue;
		print_message("  %s\n", e[k]);
		assert_has(e[k], "the file system has ");
		assert_has(e[k], " MiB free, after the files already there");
		if (strstr(e[k], "has 0 bytes free"))
			fail_msg("the refused call's own blocks counted as used: %s", e[k]);
		/* both refused at once: the space is free again, said as such */
		if (WEXITSTATUS(st[1 - k]) == 1 && strstr(e[k], "(No space"))
			assert_has(e[k], "but had not while others were reserved at the same time");
	}
	assert_int_equal(left, 1); /* lost+found: both files are gone */
}

/* Without fallocate (ext2) the space is not reserved: filled up by
 * someone else, a write fails with ENOSPC, naming the file and offset. */
static void test_enospc_at_write(void **state)
{
	(void)state;
	const char *d = fresh_dir("full");
	if (loop_fs("ext2", d))
		skip();
	hpu_swap_opts o;
	hpu__swap_opts_defaults(&o);
	o.block_size = 256 * 1024;
	hpu_swap *s = hpu__swap_open(d, "r0", "optimizer state", 8 * MiB, &o, err, sizeof err);
	if (!s) {
		loop_fs_gone(d);
		fail_msg("an 8 MiB store on 16 MiB ext2: %s", err);
	}
	run("dd if=/dev/zero of='%s/fill' bs=1M status=none 2>/dev/null", d);
	uint8_t *b = hpu__swap_buffer(8 * MiB);
	memset(b, 7, 8 * MiB);
	alarm(30);
	int t = hpu__swap_write(s, 0, b, 8 * MiB);
	int rc = t < 0 ? -2 : hpu__swap_wait(s, t);
	alarm(0);
	char msg[1024];
	snprintf(msg, sizeof msg, "%s", hpu__swap_error(s));
	hpu__swap_close(s);
	free(b);
	loop_fs_gone(d);
	assert_int_equal(rc, -1);
	assert_has(msg, "No space left on device");
	assert_has(msg, "at offset");
	assert_has(msg, "swap write");
	assert_has(msg, d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pipelined_batched),
		cmocka_unit_test(test_pipelined_single_submit),
		cmocka_unit_test(test_pipelined_no_overlap),
		cmocka_unit_test(test_out_of_order),
		cmocka_unit_test(test_refused_dir),
		cmocka_unit_test(test_refused_opts),
		cmocka_unit_test(test_refused_tmpfs),
		cmocka_unit_test(test_refused_no_odirect),
		cmocka_unit_test(test_refused_not_writable),
		cmocka_unit_test(test_refused_names_directory),
		cmocka_unit_test(test_refused_transfer),
		cmocka_unit_test(test_no_files_tmpfile),
		cmocka_unit_test(test_no_files_named),
		cmocka_unit_test(test_killed_tmpfile),
		cmocka_unit_test(test_killed_named),
		cmocka_unit_test(test_stale_removed),
		cmocka_unit_test(test_enospc_at_open),
		cmocka_unit_test(test_enospc_two_at_once),
		cmocka_unit_test(test_enospc_at_write),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
