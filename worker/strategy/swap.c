/* swap: optimizer state and parameters in a file, moved with io_uring and
 * O_DIRECT (swap.h).
 *
 * A transfer takes a ticket slot; its bytes are handed out block_size at a
 * time to requests, of which at most queue_depth exist (the ring never
 * holds more, so its completion queue cannot overflow). Blocks not yet
 * handed out are the internal queue: pump() gives free requests to the
 * oldest transfer first. A request that comes back short, or with EINTR /
 * EAGAIN, goes on the retry list and is submitted again before new ones. */
#include "worker/strategy/swap.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <liburing.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/num.h"

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

/* EINTR / EAGAIN completions retried before a request counts as failed:
 * a device that answers EAGAIN forever must not hang the step. */
#define SWAP_MAX_TRIES 1000

int hpu__swap_no_tmpfile;

struct swap_req {
	int slot;
	int write;
	uint64_t off;  /* where the request starts in the file */
	char *buf;
	size_t len;
	size_t done;   /* bytes already moved (a short transfer goes on from here) */
	int tries;
	int next;      /* free list or retry list */
};

struct swap_slot {
	int ticket;        /* -1: free */
	int write;
	uint64_t off;
	char *buf;
	size_t len;
	size_t handed;     /* bytes given to requests so far */
	uint64_t seq;      /* issue order: the oldest transfer's blocks go first */
	long outstanding;  /* blocks not finished, handed out or not */
	int err;           /* the first failed request's errno; -1: end of file */
	uint64_t err_off;
	size_t err_len;
};

struct hpu_swap {
	int fd;
	uint64_t size;
	hpu_swap_opts o;
	struct io_uring ring;
	int ring_ok;
	struct swap_req *reqs;  /* o.queue_depth of them */
	int free_head;
	int retry_head, retry_tail;
	int in_ring;            /* requests in the ring, submitted or not */
	int unsubmitted;
	struct swap_slot *slots;
	int nslots;
	int next_ticket;
	uint64_t seq;
	int dead;               /* the ring failed: every call refuses */
	uint64_t nread, nwritten;
	double wait_s;
	char what[64];
	char path[PATH_MAX]; /* "DIR/(unnamed swap file)": the file never has a name to give */
	int sparse;          /* sized without reserving (no fallocate) */
	char err[PATH_MAX + 256];
};

void hpu__swap_opts_defaults(hpu_swap_opts *o)
{
	o->block_size = 1048576;
	o->queue_depth = 8;
	o->single_submit = 0;
	o->overlap_events = 1;
	o->thread_count = 1;
}

static void say(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

#define fail(s, ...) say((s)->err, sizeof (s)->err, __VA_ARGS__)

static uint64_t free_bytes(const struct statvfs *v)
{
	return (uint64_t)v->f_bavail * v->f_frsize;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* ---- opening ---- */

static int check_opts(const hpu_swap_opts *o, char *err, size_t errlen)
{
	/* At most 1 GiB: an io_uring request's length is 32 bits. */
	if (o->block_size == 0 || o->block_size % HPU_SWAP_ALIGN || o->block_size > (1u << 30)) {
		say(err, errlen, "aio.block_size %zu must be a multiple of %d from %d to 1 GiB",
		    o->block_size, HPU_SWAP_ALIGN, HPU_SWAP_ALIGN);
		return -1;
	}
	if (o->queue_depth < 1 || o->queue_depth > 4096) {
		say(err, errlen, "aio.queue_depth %d is not between 1 and 4096", o->queue_depth);
		return -1;
	}
	return 0;
}

static int check_tag(const char *tag, char *err, size_t errlen)
{
	size_t n = strlen(tag);
	if (n == 0 || n > 64 || strspn(tag, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
					  "0123456789._-") != n) {
		say(err, errlen, "swap file tag '%s' is not 1 to 64 letters, digits, '.', '_', '-'",
		    tag);
		return -1;
	}
	return 0;
}

/* dir as said in an error: a relative one with where it leads (the
 * worker's working directory is not always the user's: hpud's is /). */
static const char *shown(const char *dir, char *buf, size_t len)
{
	char cwd[PATH_MAX];
	if (dir[0] == '/' || !getcwd(cwd, sizeof cwd))
		return dir;
	snprintf(buf, len, "%s (%s%s%s: relative to the worker's working directory)", dir, cwd,
		 strcmp(cwd, "/") ? "/" : "", dir);
	return buf;
}

/* dir exists, is a directory we may write and is not tmpfs. */
static int check_dir(const char *dir, const char *what, char *err, size_t errlen)
{
	struct stat st;
	struct statfs fs;
	char buf[PATH_MAX * 2 + 64];
	const char *d = shown(dir, buf, sizeof buf);

	if (stat(dir, &st)) {
		if (errno == ENOENT)
			say(err, errlen, "the swap directory %s for %s does not exist", d, what);
		else
			say(err, errlen, "cannot use the swap directory %s for %s: %s", d, what,
			    strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		say(err, errlen, "the swap directory %s for %s is not a directory", d, what);
		return -1;
	}
	if (access(dir, W_OK | X_OK)) {
		say(err, errlen, "the swap directory %s for %s is not writable: %s", d, what,
		    strerror(errno));
		return -1;
	}
	/* Kernels since 6.6 take O_DIRECT on tmpfs, but its pages are memory:
	 * swapping there would cost what it means to save. */
	if (statfs(dir, &fs) == 0 && (unsigned long)fs.f_type == TMPFS_MAGIC) {
		say(err, errlen, "the swap directory %s for %s is on tmpfs, which is memory; "
		    "give a path on a disk filesystem", d, what);
		return -1;
	}
	return 0;
}

/* The pid in an "hpu-swap-<pid>-<tag>.bin" name, or 0. */
static pid_t swap_file_pid(const char *name)
{
	static const char pre[] = "hpu-swap-";
	size_t n = strlen(name);
	if (strncmp(name, pre, sizeof pre - 1) || n < 4 || strcmp(name + n - 4, ".bin"))
		return 0;
	const char *p = name + sizeof pre - 1;
	char *end;
	errno = 0;
	long pid = strtol(p, &end, 10);
	if (end == p || *end != '-' || errno || pid <= 0 || pid > INT_MAX)
		return 0;
	return (pid_t)pid;
}

/* Removes the files of processes that died while their file had a name
 * (killed between creating and unlinking it), each said. Failures are
 * left alone: the file is someone else's problem, not this run's. */
static void remove_stale(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	if (!d)
		return;
	while ((e = readdir(d))) {
		pid_t pid = swap_file_pid(e->d_name);
		if (pid > 0 && kill(pid, 0) && errno == ESRCH && unlinkat(dirfd(d), e->d_name, 0) == 0)
			hpu__log(HPU_LOG_NOTICE, "removed %s/%s, a swap file left by process %d, "
				 "which is gone", dir, e->d_name, (int)pid);
	}
	closedir(d);
}

/* An unnamed file in dir: O_TMPFILE, else one named `name` unlinked at
 * once. */
static int create_file(hpu_swap *s, const char *dir, const char *name, char *err,
		       size_t errlen)
{
	int fd = -1;
	if (!hpu__swap_no_tmpfile) {
		fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
		/* EISDIR: a kernel without O_TMPFILE; EOPNOTSUPP: a filesystem. */
		if (fd < 0 && errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
			say(err, errlen, "cannot create the swap file for %s in %s: %s", s->what,
			    dir, strerror(errno));
			return -1;
		}
	}
	if (fd < 0) {
		fd = open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0) {
			say(err, errlen, "cannot create the swap file %s for %s: %s", name,
			    s->what, strerror(errno));
			return -1;
		}
		if (unlink(name)) {
			say(err, errlen, "cannot unlink the swap file %s for %s after creating "
			    "it: %s", name, s->what, strerror(errno));
			close(fd);
			return -1;
		}
	}
	/* O_DIRECT set afterwards: an open() with it that the filesystem
	 * refuses could leave a named file behind. */
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_DIRECT)) {
		if (errno == EINVAL)
			say(err, errlen, "the swap directory %s for %s does not support O_DIRECT "
			    "(tmpfs?); give a path on a disk filesystem", dir, s->what);
		else
			say(err, errlen, "cannot set O_DIRECT on the swap file %s for %s: %s",
			    s->path, s->what, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

/* What the free space figure is: each rank reserves its own file when it
 * opens it, so the space is what the others that came first left. */
#define LEFT_FREE "after the files already there (the swap files of ranks sharing the " \
		  "directory among them)"

/* Checks that s->size bytes are free and reserves them, so that writes
 * cannot run out of space. */
static int reserve(hpu_swap *s, const char *dir, char *err, size_t errlen)
{
	struct statvfs v;
	char a[32], b[32];
	if (fstatvfs(s->fd, &v)) {
		say(err, errlen, "cannot read the free space of the swap directory %s for %s: %s",
		    dir, s->what, strerror(errno));
		return -1;
	}
	if (free_bytes(&v) < s->size) {
		say(err, errlen, "the swap file for %s in %s needs %s; the file system has %s free, %s", s->what,
		    dir, hpu__human_size(a, sizeof a, (double)s->size),
		    hpu__human_size(b, sizeof b, (double)free_bytes(&v)), LEFT_FREE);
		return -1;
	}
	if (s->size == 0 || fallocate(s->fd, 0, 0, (off_t)s->size) == 0)
		return 0;
	if (errno == EOPNOTSUPP) {
		/* No fallocate (ext2, vfat): sized only; ENOSPC would show at
		 * a write, as a failed transfer naming the offset. */
		if (ftruncate(s->fd, (off_t)s->size) == 0) {
			s->sparse = 1;
			return 0;
		}
	}
	if (errno == ENOSPC || errno == EDQUOT) {
		const char *why = strerror(errno);
		/* the blocks this call did take are given back before the free
		 * space is read again (it read 0 bytes with them held): what
		 * is said is what the others left (another rank's file, made
		 * between the check above and this call) */
		int known = ftruncate(s->fd, 0) == 0 && fstatvfs(s->fd, &v) == 0;
		say(err, errlen, "the swap file for %s in %s needs %s; the file system has %s free, %s%s (%s)",
		    s->what, dir, hpu__human_size(a, sizeof a, (double)s->size),
		    known ? hpu__human_size(b, sizeof b, (double)free_bytes(&v)) : "?", LEFT_FREE,
		    /* both refused, each holding part of the space */
		    known && free_bytes(&v) >= s->size
			    ? ", but had not while others were reserved at the same time"
			    : "",
		    why);
		return -1;
	}
	say(err, errlen, "cannot reserve %s for the swap file %s for %s: %s",
	    hpu__human_size(a, sizeof a, (double)s->size), s->path, s->what, strerror(errno));
	return -1;
}

static int init_ring(hpu_swap *s, char *err, size_t errlen)
{
	int qd = s->o.queue_depth;
	int r = io_uring_queue_init((unsigned)qd, &s->ring, 0);
	if (r < 0) {
		say(err, errlen, "cannot set up io_uring for the swap file %s for %s: %s "
		    "(kernel.io_uring_disabled, or a container's seccomp profile?)", s->path,
		    s->what, strerror(-r));
		return -1;
	}
	s->ring_ok = 1;
	s->reqs = calloc((size_t)qd, sizeof *s->reqs);
	if (!s->reqs) {
		say(err, errlen, "out of memory for the swap file %s", s->path);
		return -1;
	}
	for (int i = 0; i < qd; i++)
		s->reqs[i].next = i + 1 < qd ? i + 1 : -1;
	s->free_head = 0;
	s->retry_head = s->retry_tail = -1;
	return 0;
}

hpu_swap *hpu__swap_open(const char *dir, const char *tag, const char *what, uint64_t bytes,
			 const hpu_swap_opts *o, char *err, size_t errlen)
{
	hpu_swap_opts def;
	if (!o) {
		hpu__swap_opts_defaults(&def);
		o = &def;
	}
	if (check_opts(o, err, errlen) || check_tag(tag, err, errlen))
		return NULL;
	if (bytes > UINT64_MAX - (HPU_SWAP_ALIGN - 1) || bytes > (uint64_t)INT64_MAX) {
		say(err, errlen, "a swap file of %llu bytes for %s is too big",
		    (unsigned long long)bytes, what);
		return NULL;
	}
	uint64_t size = (bytes + HPU_SWAP_ALIGN - 1) / HPU_SWAP_ALIGN * HPU_SWAP_ALIGN;
	if (check_dir(dir, what, err, errlen))
		return NULL;

	hpu_swap *s = calloc(1, sizeof *s);
	if (!s) {
		say(err, errlen, "out of memory for the swap file for %s", what);
		return NULL;
	}
	s->fd = -1;
	s->o = *o;
	s->size = size;
	snprintf(s->what, sizeof s->what, "%s", what);
	/* The file has no name once made (O_TMPFILE, or unlinked at once), and
	 * none before: the messages name where it is, "DIR/(unnamed swap
	 * file)", not a path that is not there. `name` is only for a
	 * filesystem without O_TMPFILE, for the instant before the unlink. */
	char name[PATH_MAX];
	if (snprintf(name, sizeof name, "%s/hpu-swap-%d-%s.bin", dir, (int)getpid(), tag) >=
	    (int)sizeof name) {
		say(err, errlen, "the swap directory %s for %s: path too long", dir, what);
		goto bad;
	}
	if (snprintf(s->path, sizeof s->path, "%s/(unnamed swap file)", dir) >= (int)sizeof s->path)
		snprintf(s->path, sizeof s->path, "(an unnamed swap file)");
	if (init_ring(s, err, errlen))
		goto bad;
	remove_stale(dir);
	s->fd = create_file(s, dir, name, err, errlen);
	if (s->fd < 0 || reserve(s, dir, err, errlen))
		goto bad;
	return s;
bad:
	hpu__swap_close(s);
	return NULL;
}

void *hpu__swap_buffer(size_t bytes)
{
	void *p = NULL;
	if (bytes > SIZE_MAX - HPU_SWAP_ALIGN)
		return NULL;
	bytes = bytes ? (bytes + HPU_SWAP_ALIGN - 1) / HPU_SWAP_ALIGN * HPU_SWAP_ALIGN
		      : HPU_SWAP_ALIGN;
	return posix_memalign(&p, HPU_SWAP_ALIGN, bytes) ? NULL : p;
}

/* ---- requests and the ring ---- */

static int broken(hpu_swap *s, const char *op, int e)
{
	s->dead = 1;
	fail(s, "io_uring %s failed for the swap file %s for %s: %s; the store cannot go on",
	     op, s->path, s->what, strerror(e));
	return -1;
}

static void req_free(hpu_swap *s, int r)
{
	s->reqs[r].next = s->free_head;
	s->free_head = r;
}

static void retry_push(hpu_swap *s, int r)
{
	s->reqs[r].next = -1;
	if (s->retry_tail < 0)
		s->retry_head = r;
	else
		s->reqs[s->retry_tail].next = r;
	s->retry_tail = r;
}

static int retry_pop(hpu_swap *s)
{
	int r = s->retry_head;
	if (r >= 0) {
		s->retry_head = s->reqs[r].next;
		if (s->retry_head < 0)
			s->retry_tail = -1;
	}
	return r;
}

/* Hands the ring's prepared entries to the kernel. A full completion side
 * (EBUSY) or a short-lived shortage (EAGAIN) is waited out by reaping. */
static int reap(hpu_swap *s, int block);

static int flush(hpu_swap *s)
{
	while (s->unsubmitted > 0) {
		int r = io_uring_submit(&s->ring);
		if (r > 0) {
			s->unsubmitted -= r;
			continue;
		}
		if (r == -EINTR)
			continue;
		if ((r == 0 || r == -EAGAIN || r == -EBUSY) && s->in_ring > s->unsubmitted) {
			if (reap(s, 1) < 0)
				return -1;
			continue;
		}
		return broken(s, "submit", r ? -r : EAGAIN);
	}
	return 0;
}

static int prep(hpu_swap *s, int r)
{
	struct swap_req *q = &s->reqs[r];
	struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
	if (!sqe)  /* cannot happen: the ring has room for every request */
		return broken(s, "get_sqe", EBUSY);
	unsigned n = (unsigned)(q->len - q->done);
	if (q->write)
		io_uring_prep_write(sqe, s->fd, q->buf + q->done, n, q->off + q->done);
	else
		io_uring_prep_read(sqe, s->fd, q->buf + q->done, n, q->off + q->done);
	io_uring_sqe_set_data(sqe, q);
	s->in_ring++;
	s->unsubmitted++;
	return s->o.single_submit ? flush(s) : 0;
}

/* The oldest transfer with blocks not yet handed out, or -1. */
static int oldest_waiting(const hpu_swap *s)
{
	int best = -1;
	for (int i = 0; i < s->nslots; i++) {
		const struct swap_slot *t = &s->slots[i];
		if (t->ticket >= 0 && t->handed < t->len &&
		    (best < 0 || t->seq < s->slots[best].seq))
			best = i;
	}
	return best;
}

/* Fills the ring: retries first, then the oldest transfers' next blocks. */
static int pump(hpu_swap *s)
{
	int r;
	while ((r = retry_pop(s)) >= 0) {
		struct swap_slot *t = &s->slots[s->reqs[r].slot];
		if (t->err) {  /* its transfer failed already: drop it */
			t->outstanding--;
			req_free(s, r);
		} else if (prep(s, r)) {
			return -1;
		}
	}
	int i;
	while (s->free_head >= 0 && (i = oldest_waiting(s)) >= 0) {
		struct swap_slot *t = &s->slots[i];
		r = s->free_head;
		s->free_head = s->reqs[r].next;
		struct swap_req *q = &s->reqs[r];
		size_t n = t->len - t->handed;
		*q = (struct swap_req){ .slot = i, .write = t->write, .off = t->off + t->handed,
					.buf = t->buf + t->handed, .next = -1,
					.len = n < s->o.block_size ? n : s->o.block_size };
		t->handed += q->len;
		if (prep(s, r))
			return -1;
	}
	return flush(s);
}

/* The transfer of request r failed with errno e (-1: end of file): keeps
 * the first failure, drops the blocks not handed out yet. */
static void slot_fail(hpu_swap *s, int r, int e)
{
	struct swap_req *q = &s->reqs[r];
	struct swap_slot *t = &s->slots[q->slot];
	if (!t->err) {
		t->err = e;
		t->err_off = q->off + q->done;
		t->err_len = q->len - q->done;
	}
	size_t left = t->len - t->handed;
	t->outstanding -= (long)((left + s->o.block_size - 1) / s->o.block_size);
	t->handed = t->len;
	t->outstanding--;
	req_free(s, r);
}

static void complete(hpu_swap *s, const struct io_uring_cqe *cqe)
{
	struct swap_req *q = io_uring_cqe_get_data(cqe);
	int r = (int)(q - s->reqs);
	int res = cqe->res;
	s->in_ring--;
	if ((res == -EINTR || res == -EAGAIN) && ++q->tries < SWAP_MAX_TRIES) {
		retry_push(s, r);
		return;
	}
	if (res <= 0) {
		slot_fail(s, r, res < 0 ? -res : -1);
		return;
	}
	if (q->write)
		s->nwritten += (uint64_t)res;
	else
		s->nread += (uint64_t)res;
	q->done += (size_t)res;
	if (q->done < q->len) {  /* short: the rest goes again */
		retry_push(s, r);
		return;
	}
	s->slots[q->slot].outstanding--;
	req_free(s, r);
}

/* Takes in the completions there are, first waiting for one if `block`.
 * Returns how many, or -1 when the ring failed. */
static int reap(hpu_swap *s, int block)
{
	struct io_uring_cqe *cqe;
	int n = 0, r;
	if (block) {
		double t0 = now();
		do
			r = io_uring_wait_cqe(&s->ring, &cqe);
		while (r == -EINTR);
		s->wait_s += now() - t0;
		if (r < 0)
			return broken(s, "wait_cqe", -r);
	}
	while (io_uring_peek_cqe(&s->ring, &cqe) == 0) {
		complete(s, cqe);
		io_uring_cqe_seen(&s->ring, cqe);
		n++;
	}
	return n;
}

/* ---- transfers ---- */

static int slot_new(hpu_swap *s)
{
	for (int i = 0; i < s->nslots; i++)
		if (s->slots[i].ticket < 0)
			return i;
	int n = s->nslots ? 2 * s->nslots : 8;
	struct swap_slot *p = realloc(s->slots, (size_t)n * sizeof *p);
	if (!p)
		return -1;
	for (int i = s->nslots; i < n; i++)
		p[i].ticket = -1;
	s->slots = p;
	int i = s->nslots;
	s->nslots = n;
	return i;
}

static int transfer(hpu_swap *s, int write, uint64_t off, void *buf, size_t len)
{
	const char *op = write ? "write" : "read";
	if (s->dead)
		return -1;
	if (off % HPU_SWAP_ALIGN || len % HPU_SWAP_ALIGN || (uintptr_t)buf % HPU_SWAP_ALIGN) {
		fail(s, "swap %s of %zu bytes at offset %llu of %s: offset, length and buffer must "
		     "be multiples of %d", op, len, (unsigned long long)off, s->path,
		     HPU_SWAP_ALIGN);
		return -1;
	}
	if (off > s->size || len > s->size - off) {
		fail(s, "swap %s of %zu bytes at offset %llu is past the end of %s (%llu bytes)",
		     op, len, (unsigned long long)off, s->path, (unsigned long long)s->size);
		return -1;
	}
	int i = slot_new(s);
	if (i < 0) {
		fail(s, "out of memory for a transfer of the swap file %s", s->path);
		return -1;
	}
	struct swap_slot *t = &s->slots[i];
	*t = (struct swap_slot){ .ticket = s->next_ticket, .write = write, .off = off, .buf = buf,
				 .len = len, .seq = s->seq++,
				 .outstanding = (long)((len + s->o.block_size - 1) /
						       s->o.block_size) };
	s->next_ticket = s->next_ticket == INT_MAX ? 0 : s->next_ticket + 1;
	if (pump(s))
		return -1;
	if (s->o.overlap_events) {
		int n;
		while ((n = reap(s, 0)) > 0)
			if (pump(s))
				return -1;
		if (n < 0)
			return -1;
	}
	return t->ticket;
}

int hpu__swap_read(hpu_swap *s, uint64_t off, void *buf, size_t len)
{
	return transfer(s, 0, off, buf, len);
}

int hpu__swap_write(hpu_swap *s, uint64_t off, const void *buf, size_t len)
{
	/* The buffer is only read from: io_uring_prep_write takes it const. */
	return transfer(s, 1, off, (void *)buf, len);
}

/* Retires slot i: 0, or -1 with its failure's sentence. */
static int slot_result(hpu_swap *s, int i)
{
	struct swap_slot *t = &s->slots[i];
	int rc = 0;
	if (t->err) {
		fail(s, "swap %s of %zu bytes at offset %llu of %s for %s failed: %s%s",
		     t->write ? "write" : "read", t->err_len, (unsigned long long)t->err_off,
		     s->path, s->what, t->err > 0 ? strerror(t->err) : "end of file",
		     s->sparse && (t->err == ENOSPC || t->err == EDQUOT)
			     ? " (the filesystem reserves no space ahead, having no fallocate: the "
			       "free space was checked for this file alone, and every rank sharing the "
			       "directory needs room for its own)"
			     : "");
		rc = -1;
	}
	t->ticket = -1;
	return rc;
}

int hpu__swap_wait(hpu_swap *s, int ticket)
{
	int i;
	if (s->dead)
		return -1;
	for (i = 0; i < s->nslots; i++)
		if (ticket >= 0 && s->slots[i].ticket == ticket)
			break;
	if (i == s->nslots) {
		fail(s, "no transfer of the swap file %s has ticket %d (already waited for?)",
		     s->path, ticket);
		return -1;
	}
	while (s->slots[i].outstanding > 0) {
		if (pump(s))
			return -1;
		if (s->slots[i].outstanding == 0)
			break;
		if (s->in_ring == 0) {
			/* pump() reaped while submitting and freed requests
			 * or left retries: go round again. Nothing at all
			 * would be a bug. */
			if (s->retry_head >= 0 || oldest_waiting(s) >= 0)
				continue;
			s->dead = 1;
			fail(s, "swap file %s: ticket %d has %ld requests that are nowhere",
			     s->path, ticket, s->slots[i].outstanding);
			return -1;
		}
		if (reap(s, 1) < 0)
			return -1;
	}
	return slot_result(s, i);
}

int hpu__swap_wait_all(hpu_swap *s)
{
	char first[sizeof s->err] = "";
	int rc = 0;
	for (;;) {
		int best = -1;
		for (int i = 0; i < s->nslots; i++)
			if (s->slots[i].ticket >= 0 &&
			    (best < 0 || s->slots[i].seq < s->slots[best].seq))
				best = i;
		if (best < 0 || s->dead)
			break;
		if (hpu__swap_wait(s, s->slots[best].ticket) && !rc) {
			rc = -1;
			snprintf(first, sizeof first, "%s", s->err);
		}
	}
	if (s->dead)
		return -1;
	if (rc)
		snprintf(s->err, sizeof s->err, "%s", first);
	return rc;
}

const char *hpu__swap_error(const hpu_swap *s)
{
	return s->err;
}

const char *hpu__swap_path(const hpu_swap *s)
{
	return s->path;
}

void hpu__swap_stats(const hpu_swap *s, uint64_t *read, uint64_t *written, double *wait_s)
{
	if (read)
		*read = s->nread;
	if (written)
		*written = s->nwritten;
	if (wait_s)
		*wait_s = s->wait_s;
}

/* A broken ring's requests that the kernel took still read into or
 * write from buffers the callers free after hpu__swap_close, and
 * io_uring_queue_exit does not wait for them: their completions are
 * waited for here, a second at a time, until 10 s pass with none or the
 * ring fails to give one. Without IORING_FEAT_EXT_ARG (before Linux
 * 5.11) the timed wait submits what was not yet submitted, so those
 * count too. */
static void drain_dead(hpu_swap *s)
{
	int in_kernel = s->ring.features & IORING_FEAT_EXT_ARG ? s->in_ring - s->unsubmitted
							       : s->in_ring;
	int idle = 0;
	while (in_kernel > 0 && idle < 10) {
		struct __kernel_timespec ts = {.tv_sec = 1};
		struct io_uring_cqe *cqe;
		int r = io_uring_wait_cqe_timeout(&s->ring, &cqe, &ts);
		if (r == -ETIME) {
			idle++;
		} else if (r == 0) {
			io_uring_cqe_seen(&s->ring, cqe);
			in_kernel--;
		} else if (r != -EINTR) {
			return;
		}
	}
}

void hpu__swap_close(hpu_swap *s)
{
	if (!s)
		return;
	if (s->ring_ok) {
		if (!s->dead)
			hpu__swap_wait_all(s);
		if (s->dead) /* before, or as the waits failed */
			drain_dead(s);
		io_uring_queue_exit(&s->ring);
	}
	if (s->fd >= 0)
		close(s->fd);
	free(s->reqs);
	free(s->slots);
	free(s);
}
