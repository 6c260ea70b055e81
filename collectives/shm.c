/* The shared-memory transport (see shm.h for the contract).
 *
 * Segment layout (all offsets computed from nlocal and nslots, never read
 * from the segment):
 *
 *   0            struct seg_hdr: magic (stored last, release), version,
 *                geometry, attach and detach counters
 *   RANKS_OFF    struct seg_rank[nlocal]: pid and state of each local rank
 *   ctl_off      struct ring_ctl[npairs]: one per ordered pair (src, dst),
 *                src != dst; tail and the two "waiter present" flags, each
 *                on its own 128-byte block (the adjacent-line prefetcher
 *                pairs 64-byte lines)
 *   slots_off    npairs rings of nslots slots of SLOT_SIZE bytes (page
 *                aligned): a 64-byte slot header (sequence word and the
 *                struct hpucoll__hdr) followed by the payload, 64-byte
 *                aligned
 *
 * Ring protocol (single producer, single consumer). Message n (counting
 * from 0) of a pair goes to slot n % nslots. The producer waits until
 * n - tail < nslots, copies the header and payload into the slot and
 * stores seq = n + 1 with release; the consumer waits until that slot's seq
 * is n + 1 (acquire), hands out a pointer to the payload and, on release,
 * stores tail = n + 1 with release. A producer may also build message n's
 * payload in its slot before sending it (hpucoll__shm_slot(), only once
 * n - tail < nslots): the send then copies nothing. The producer keeps its own count and
 * the consumer its own tail in process memory, so the only shared words
 * on the fast path are the slot's header line, the tail (read by the
 * producer only when the ring looks full) and the consumer's waiter flag.
 *
 * Waiting: spin briefly, yield a few times, then sleep on a futex on the
 * awaited word after raising a "waiter present" flag; the other side wakes
 * it only when that flag is up (a seq_cst fence on both sides orders the
 * flag against the word, as in Dekker's algorithm). Every ~100 ms of
 * waiting the peer's liveness and the caller's timeout are checked.
 *
 * Names: the last rank to attach unlinks the segment's name, so once a
 * node's ranks have met nothing is left in /dev/shm whatever happens to
 * them later; only a job that dies while attaching leaves a segment,
 * which hpucoll__shm_unlink_job() removes.
 *
 * Trust: /dev/shm is writable by every user. The first rank creates the
 * segment with O_EXCL and mode 0600; the others join only a segment owned
 * by their own user that nobody else may open (checked with fstat on the
 * open descriptor), so a segment another user made first at the name is
 * refused at once rather than mapped. The name itself carries the
 * coordinator's random session (rdzv.c), so nobody can make it first.
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "collectives/shm.h"
#include "common/log.h"
#include "common/shmname.h"

#define SEG_MAGIC 0x4d485348u /* "HSHM" */
#define SEG_VERSION 1u
#define SEG_PAGE 4096u
#define MAX_LOCAL 256
#define MAX_SLOTS 8u
#define MIN_SLOTS 2u
/* The creator halves the ring depth until the segment fits this budget. */
#define SLOT_BUDGET ((uint64_t)256 << 20)
#define SLOT_HDR 64u
#define SLOT_SIZE ((uint64_t)SLOT_HDR + HPUCOLL__SHM_MAX_PAYLOAD)
#define LINE 128

#define SPIN_NS 5000       /* busy-wait this long first */
#define YIELDS 8           /* then sched_yield() this many times */
#define SLEEP_NS 100000000 /* then futex sleeps of at most this */
#define CHECK_NS 100000000 /* liveness/timeout check period */

enum { RANK_FREE = 0, RANK_ATTACHED = 1, RANK_CLOSED = 2 };

struct seg_hdr {
	_Atomic uint32_t magic; /* SEG_MAGIC once the rest is written */
	uint32_t version;
	uint32_t nlocal;
	uint32_t nslots;
	uint64_t slot_size;
	uint64_t max_payload;
	uint64_t total_size;
	_Atomic uint32_t attached; /* ranks that have attached (futex word) */
	_Atomic uint32_t detached; /* ranks that have closed */
};

struct seg_rank {
	_Atomic int32_t pid;
	_Atomic uint32_t state; /* RANK_* */
	uint64_t pidns; /* inode of its pid namespace; 0 if unknown */
};

struct ring_ctl {
	alignas(LINE) _Atomic uint32_t tail; /* messages released */
	alignas(LINE) _Atomic uint32_t cons_wait; /* consumer sleeps on a seq */
	alignas(LINE) _Atomic uint32_t prod_wait; /* producer sleeps on tail */
};

struct slot {
	_Atomic uint32_t seq; /* n + 1 once message n is in this slot */
	uint32_t pad;
	struct hpucoll__hdr hdr;
	unsigned char pad2[SLOT_HDR - 8 - sizeof(struct hpucoll__hdr)];
};

_Static_assert(sizeof(struct hpucoll__hdr) == 32, "hdr is 32 bytes");
_Static_assert(sizeof(struct slot) == SLOT_HDR, "slot header is 64 bytes");
_Static_assert(sizeof(struct seg_hdr) <= LINE, "seg_hdr fits a block");
_Static_assert(sizeof(struct ring_ctl) == 3 * LINE, "ring_ctl blocks");

#define RANKS_OFF ((uint64_t)LINE)

struct tx {
	struct ring_ctl *ctl;
	unsigned char *slots;
	uint32_t head;      /* messages sent */
	uint32_t tail_seen; /* last tail read from ctl */
};

struct rx {
	struct ring_ctl *ctl;
	unsigned char *slots;
	uint32_t tail; /* messages released */
	int held;      /* a message is handed out */
};

struct hpucoll__shm {
	unsigned char *base;
	size_t size;
	int local;
	int nlocal;
	uint32_t nslots;
	struct seg_hdr *hdr;
	struct seg_rank *ranks;
	struct tx *tx;   /* by destination */
	struct rx *rx;   /* by source */
	pid_t *pid;      /* by local rank */
	int *pidfd;      /* by local rank; -1 where pidfd_open failed */
	int claimed;     /* this rank's entry in the segment is ours */
	char errmsg[256];
};

struct layout {
	uint64_t ctl_off;
	uint64_t slots_off;
	uint64_t total;
};

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static uint64_t npairs(int nlocal)
{
	return (uint64_t)nlocal * (uint64_t)(nlocal - 1);
}

static struct layout layout_of(int nlocal, uint32_t nslots)
{
	struct layout l;

	l.ctl_off = align_up(RANKS_OFF + nlocal * sizeof(struct seg_rank),
			     LINE);
	l.slots_off = align_up(l.ctl_off + npairs(nlocal) *
				       sizeof(struct ring_ctl), SEG_PAGE);
	l.total = l.slots_off + npairs(nlocal) * nslots * SLOT_SIZE;
	return l;
}

static uint64_t pair_index(int nlocal, int src, int dst)
{
	return (uint64_t)src * (nlocal - 1) + (dst < src ? dst : dst - 1);
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t deadline_of(int timeout_ms)
{
	return timeout_ms < 0 ? -1 : now_ns() + (int64_t)timeout_ms * 1000000;
}

static void futex_wait(_Atomic uint32_t *word, uint32_t seen, int64_t ns)
{
	struct timespec ts = {ns / 1000000000, ns % 1000000000};

	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word, int n)
{
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, n, NULL, NULL, 0);
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static void fmt(char *buf, size_t len, const char *f, ...)
	__attribute__((format(printf, 3, 4)));

static void fmt(char *buf, size_t len, const char *f, ...)
{
	va_list ap;

	if (buf == NULL || len == 0)
		return;
	va_start(ap, f);
	vsnprintf(buf, len, f, ap);
	va_end(ap);
}

/* ---- Liveness ---- */

/* Returns 0 while local rank `peer` lives and is attached, else an error
 * with a sentence in s->errmsg. */
static int peer_check(hpucoll__shm *s, int peer)
{
	uint32_t st = atomic_load_explicit(&s->ranks[peer].state,
					   memory_order_acquire);
	pid_t pid = s->pid[peer];
	struct pollfd p;

	if (st == RANK_CLOSED) {
		fmt(s->errmsg, sizeof s->errmsg,
		    "local rank %d (pid %d) has closed its shared memory",
		    peer, (int)pid);
		return HPUCOLL_EPEER;
	}
	if (pid > 0 && kill(pid, 0) < 0 && errno == ESRCH)
		goto dead;
	if (s->pidfd != NULL && s->pidfd[peer] >= 0) {
		p.fd = s->pidfd[peer];
		p.events = POLLIN;
		if (poll(&p, 1, 0) > 0) /* exited, perhaps not yet reaped */
			goto dead;
	}
	return HPUCOLL_OK;
dead:
	fmt(s->errmsg, sizeof s->errmsg, "local rank %d (pid %d) died", peer,
	    (int)pid);
	return HPUCOLL_EPEER;
}

/* ---- Waiting ---- */

enum { PHASE_SPIN, PHASE_YIELD, PHASE_SLEEP };

struct waiter {
	int64_t deadline; /* -1: forever */
	int64_t spin_end;
	int64_t next_check;
	int phase;
	int yields;
};

static void waiter_init(struct waiter *w, int timeout_ms)
{
	w->deadline = deadline_of(timeout_ms);
	w->spin_end = 0;
	w->next_check = 0;
	w->phase = PHASE_SPIN;
	w->yields = 0;
}

static int changed(_Atomic uint32_t *word, uint32_t seen)
{
	return atomic_load_explicit(word, memory_order_acquire) != seen;
}

/* Sleeps on *word while it equals `seen`, telling the other side through
 * *flag that it must wake us. The flag store and the word load are
 * seq_cst, as are the other side's word store and flag load: one of the
 * two sees the other's store (Dekker). */
static void sleep_on(_Atomic uint32_t *word, uint32_t seen,
		     _Atomic uint32_t *flag, int64_t ns)
{
	atomic_store(flag, 1);
	if (atomic_load(word) == seen)
		futex_wait(word, seen, ns);
	atomic_store_explicit(flag, 0, memory_order_relaxed);
}

/* Time to sleep at most: until the next check, the deadline, or SLEEP_NS. */
static int64_t sleep_ns(const struct waiter *w, int64_t now)
{
	int64_t ns = SLEEP_NS;

	if (w->next_check - now < ns)
		ns = w->next_check - now;
	if (w->deadline >= 0 && w->deadline - now < ns)
		ns = w->deadline - now;
	return ns > 0 ? ns : 1;
}

/* Checks the peer and the deadline when due. */
static int waiter_check(hpucoll__shm *s, struct waiter *w, int peer,
			_Atomic uint32_t *word, uint32_t seen, int64_t now)
{
	int rc;

	if (now >= w->next_check) {
		w->next_check = now + CHECK_NS;
		rc = peer_check(s, peer);
		if (rc != HPUCOLL_OK)
			return changed(word, seen) ? HPUCOLL_OK : rc;
	}
	if (w->deadline >= 0 && now >= w->deadline && !changed(word, seen)) {
		fmt(s->errmsg, sizeof s->errmsg,
		    "timed out waiting for local rank %d", peer);
		return HPUCOLL_ETIMEDOUT;
	}
	return HPUCOLL_OK;
}

/* Waits a while for *word to differ from `seen` (the caller re-checks its
 * condition and calls again). Returns an error when the peer is gone or
 * the deadline has passed. */
static int wait_step(hpucoll__shm *s, struct waiter *w, int peer,
		     _Atomic uint32_t *word, uint32_t seen,
		     _Atomic uint32_t *flag)
{
	int64_t now;

	if (w->phase == PHASE_SPIN) {
		for (int i = 0; i < 64; i++) {
			if (changed(word, seen))
				return HPUCOLL_OK;
			cpu_relax();
		}
	}
	now = now_ns();
	switch (w->phase) {
	case PHASE_SPIN:
		if (w->spin_end == 0) {
			w->spin_end = now + SPIN_NS;
			w->next_check = now + CHECK_NS;
		} else if (now >= w->spin_end) {
			w->phase = PHASE_YIELD;
		}
		break;
	case PHASE_YIELD:
		sched_yield();
		if (++w->yields >= YIELDS)
			w->phase = PHASE_SLEEP;
		break;
	default:
		sleep_on(word, seen, flag, sleep_ns(w, now));
		now = now_ns();
		w->next_check = now; /* woken: perhaps the peer closed */
		break;
	}
	return waiter_check(s, w, peer, word, seen, now);
}

/* ---- Send, receive ---- */

static struct slot *slot_at(unsigned char *slots, uint32_t n, uint32_t nslots)
{
	return (struct slot *)(slots + (uint64_t)(n % nslots) * SLOT_SIZE);
}

int hpucoll__shm_send(hpucoll__shm *s, int dst, const struct hpucoll__hdr *hdr,
		      const void *data, int timeout_ms)
{
	struct tx *t;
	struct slot *sl;
	struct waiter w;
	int rc;

	assert(dst >= 0 && dst < s->nlocal && dst != s->local);
	assert(hdr->len <= HPUCOLL__SHM_MAX_PAYLOAD);
	t = &s->tx[dst];
	if (t->head - t->tail_seen >= s->nslots) {
		waiter_init(&w, timeout_ms);
		for (;;) {
			t->tail_seen = atomic_load_explicit(
				&t->ctl->tail, memory_order_acquire);
			if (t->head - t->tail_seen < s->nslots)
				break;
			rc = wait_step(s, &w, dst, &t->ctl->tail, t->tail_seen,
				       &t->ctl->prod_wait);
			if (rc != HPUCOLL_OK)
				return rc;
		}
	}
	sl = slot_at(t->slots, t->head, s->nslots);
	sl->hdr = *hdr;
	if (hdr->len > 0 && data != (const void *)(sl + 1))
		memcpy(sl + 1, data, hdr->len);
	t->head++;
	atomic_store(&sl->seq, t->head); /* seq_cst: see sleep_on() */
	if (atomic_load(&t->ctl->cons_wait))
		futex_wake(&sl->seq, 1);
	return HPUCOLL_OK;
}

void *hpucoll__shm_slot(hpucoll__shm *s, int dst)
{
	struct tx *t;

	assert(dst >= 0 && dst < s->nlocal && dst != s->local);
	t = &s->tx[dst];
	if (t->head - t->tail_seen >= s->nslots)
		t->tail_seen = atomic_load_explicit(&t->ctl->tail,
						    memory_order_acquire);
	if (t->head - t->tail_seen >= s->nslots)
		return NULL;
	return slot_at(t->slots, t->head, s->nslots) + 1;
}

int hpucoll__shm_recv(hpucoll__shm *s, int src, struct hpucoll__hdr *hdr,
		      const void **data, int timeout_ms)
{
	struct rx *r;
	struct slot *sl;
	struct waiter w;
	uint32_t want, seq;
	int rc;

	assert(src >= 0 && src < s->nlocal && src != s->local);
	r = &s->rx[src];
	assert(!r->held);
	sl = slot_at(r->slots, r->tail, s->nslots);
	want = r->tail + 1;
	seq = atomic_load_explicit(&sl->seq, memory_order_acquire);
	if (seq != want) {
		waiter_init(&w, timeout_ms);
		do {
			rc = wait_step(s, &w, src, &sl->seq, seq,
				       &r->ctl->cons_wait);
			if (rc != HPUCOLL_OK)
				return rc;
			seq = atomic_load_explicit(&sl->seq,
						   memory_order_acquire);
		} while (seq != want);
	}
	*hdr = sl->hdr;
	if (hdr->len > HPUCOLL__SHM_MAX_PAYLOAD) {
		fmt(s->errmsg, sizeof s->errmsg,
		    "a message from local rank %d claims %llu bytes, more than a slot's %u",
		    src, (unsigned long long)hdr->len,
		    HPUCOLL__SHM_MAX_PAYLOAD);
		return HPUCOLL_EPROTO;
	}
	*data = sl + 1;
	r->held = 1;
	return HPUCOLL_OK;
}

void hpucoll__shm_release(hpucoll__shm *s, int src)
{
	struct rx *r;

	assert(src >= 0 && src < s->nlocal && src != s->local);
	r = &s->rx[src];
	assert(r->held);
	r->held = 0;
	r->tail++;
	atomic_store(&r->ctl->tail, r->tail); /* seq_cst: see sleep_on() */
	if (atomic_load(&r->ctl->prod_wait))
		futex_wake(&r->ctl->tail, 1);
}

const char *hpucoll__shm_errmsg(const hpucoll__shm *s)
{
	return s->errmsg;
}

/* ---- Open ---- */

static int job_ok(const char *job)
{
	size_t n = job == NULL ? 0 : strlen(job);

	if (n == 0 || n >= HPUCOLL__JOB_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = job[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '-' || c == '_' ||
		      c == '.'))
			return 0;
	}
	return 1;
}

static int errno_code(int e)
{
	return e == ENOMEM || e == ENOSPC || e == EMFILE || e == ENFILE
		       ? HPUCOLL_ENOMEM
		       : HPUCOLL_EINVAL;
}

/* Sizes the new segment and reserves its memory, halving the ring depth
 * while /dev/shm is too small, so that a full /dev/shm is an error here
 * rather than a SIGBUS later. */
static int create_size(int fd, int nlocal, uint32_t *nslots, char *err,
		       size_t errlen)
{
	uint32_t n = MAX_SLOTS;
	uint64_t total;
	int e;

	while (n > MIN_SLOTS && npairs(nlocal) * n * SLOT_SIZE > SLOT_BUDGET)
		n /= 2;
	for (;;) {
		total = layout_of(nlocal, n).total;
		if (ftruncate(fd, (off_t)total) < 0) {
			e = errno;
			fmt(err, errlen, "cannot size shared memory to %llu bytes: %s",
			    (unsigned long long)total, strerror(e));
			return errno_code(e);
		}
		e = posix_fallocate(fd, 0, (off_t)total);
		if (e == 0 || e == EOPNOTSUPP || e == EINVAL)
			break;
		if (e != ENOSPC || n == MIN_SLOTS) {
			fmt(err, errlen,
			    "cannot reserve %llu MiB of shared memory in /dev/shm: %s",
			    (unsigned long long)(total >> 20), strerror(e));
			return errno_code(e);
		}
		n /= 2;
	}
	*nslots = n;
	return HPUCOLL_OK;
}

static int map_all(hpucoll__shm *s, int fd, uint64_t total, char *err,
		   size_t errlen)
{
	void *p = mmap(NULL, total, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_POPULATE, fd, 0);

	if (p == MAP_FAILED) {
		int e = errno;

		fmt(err, errlen, "cannot map %llu bytes of shared memory: %s",
		    (unsigned long long)total, strerror(e));
		return errno_code(e);
	}
	s->base = p;
	s->size = total;
	s->hdr = p;
	s->ranks = (struct seg_rank *)(s->base + RANKS_OFF);
	return HPUCOLL_OK;
}

static int create_seg(hpucoll__shm *s, int fd, char *err, size_t errlen)
{
	uint32_t nslots = MIN_SLOTS;
	uint64_t total;
	int rc;

	rc = create_size(fd, s->nlocal, &nslots, err, errlen);
	if (rc != HPUCOLL_OK)
		return rc;
	total = layout_of(s->nlocal, nslots).total;
	rc = map_all(s, fd, total, err, errlen);
	if (rc != HPUCOLL_OK)
		return rc;
	/* The file is zero-filled: counters, flags and seq words start at 0. */
	s->hdr->version = SEG_VERSION;
	s->hdr->nlocal = (uint32_t)s->nlocal;
	s->hdr->nslots = nslots;
	s->hdr->slot_size = SLOT_SIZE;
	s->hdr->max_payload = HPUCOLL__SHM_MAX_PAYLOAD;
	s->hdr->total_size = total;
	s->nslots = nslots;
	atomic_store_explicit(&s->hdr->magic, SEG_MAGIC, memory_order_release);
	futex_wake(&s->hdr->magic, INT_MAX);
	return HPUCOLL_OK;
}

static int timed_out(int64_t deadline)
{
	return deadline >= 0 && now_ns() >= deadline;
}

/* Waits until the creator has sized the segment; returns its size. */
static int wait_sized(int fd, int64_t deadline, off_t *size, const char *name,
		      char *err, size_t errlen)
{
	struct stat st;
	struct timespec ms = {0, 1000000};

	for (;;) {
		if (fstat(fd, &st) < 0) {
			fmt(err, errlen, "cannot stat %s: %s", name,
			    strerror(errno));
			return HPUCOLL_EINVAL;
		}
		if (st.st_size > 0)
			break;
		if (timed_out(deadline)) {
			fmt(err, errlen,
			    "shared memory %s was never initialised (left by a crashed job?)",
			    name);
			return HPUCOLL_ETIMEDOUT;
		}
		nanosleep(&ms, NULL);
	}
	if ((uint64_t)st.st_size < SEG_PAGE) {
		fmt(err, errlen, "shared memory %s has %lld bytes, too few to be ours",
		    name, (long long)st.st_size);
		return HPUCOLL_EPROTO;
	}
	*size = st.st_size;
	return HPUCOLL_OK;
}

/* Waits for the creator's magic word; the page mapping p holds the header. */
static int wait_magic(struct seg_hdr *h, int64_t deadline, const char *name,
		      char *err, size_t errlen)
{
	uint32_t m;

	while ((m = atomic_load_explicit(&h->magic, memory_order_acquire)) == 0) {
		if (timed_out(deadline)) {
			fmt(err, errlen,
			    "shared memory %s was never initialised (left by a crashed job?)",
			    name);
			return HPUCOLL_ETIMEDOUT;
		}
		futex_wait(&h->magic, 0, 10000000);
	}
	if (m != SEG_MAGIC) {
		fmt(err, errlen, "shared memory %s is not an hpucoll segment",
		    name);
		return HPUCOLL_EPROTO;
	}
	return HPUCOLL_OK;
}

/* Checks everything the header says against what this rank expects. */
static int check_hdr(const struct seg_hdr *h, int nlocal, off_t size,
		     uint32_t *nslots, const char *name, char *err,
		     size_t errlen)
{
	uint32_t n = h->nslots;

	if (h->version != SEG_VERSION || h->slot_size != SLOT_SIZE ||
	    h->max_payload != HPUCOLL__SHM_MAX_PAYLOAD) {
		fmt(err, errlen,
		    "shared memory %s has version %u and slots of %llu bytes, this library %u and %llu",
		    name, h->version, (unsigned long long)h->slot_size,
		    SEG_VERSION, (unsigned long long)SLOT_SIZE);
		return HPUCOLL_EPROTO;
	}
	if (h->nlocal != (uint32_t)nlocal) {
		fmt(err, errlen,
		    "shared memory %s is for %u local ranks, this rank says %d",
		    name, h->nlocal, nlocal);
		return HPUCOLL_EPROTO;
	}
	if (n < MIN_SLOTS || n > MAX_SLOTS || (n & (n - 1)) != 0 ||
	    h->total_size != layout_of(nlocal, n).total ||
	    (uint64_t)size != h->total_size) {
		fmt(err, errlen, "shared memory %s has an inconsistent layout",
		    name);
		return HPUCOLL_EPROTO;
	}
	*nslots = n;
	return HPUCOLL_OK;
}

/* A segment to join must be this user's and closed to everyone else: one
 * another user made first at our name would be a foreign writer mapped
 * into the job (or an empty file that never gets initialised). */
static int check_owner(int fd, const char *name, char *err, size_t errlen)
{
	struct stat st;

	if (fstat(fd, &st) < 0) {
		fmt(err, errlen, "cannot stat %s: %s", name, strerror(errno));
		return HPUCOLL_EINVAL;
	}
	if (st.st_uid != geteuid() || (st.st_mode & 077) != 0 ||
	    !S_ISREG(st.st_mode)) {
		fmt(err, errlen,
		    "shared memory /dev/shm%s belongs to uid %u with mode %04o, "
		    "not to this job (uid %u, mode 0600): refusing to map it, "
		    "as another user made it or can open it",
		    name, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
		    (unsigned)geteuid());
		return HPUCOLL_EPROTO;
	}
	return HPUCOLL_OK;
}

static int join_seg(hpucoll__shm *s, int fd, int64_t deadline,
		    const char *name, char *err, size_t errlen)
{
	off_t size;
	void *p;
	int rc;

	rc = check_owner(fd, name, err, errlen);
	if (rc != HPUCOLL_OK)
		return rc;
	rc = wait_sized(fd, deadline, &size, name, err, errlen);
	if (rc != HPUCOLL_OK)
		return rc;
	p = mmap(NULL, SEG_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		fmt(err, errlen, "cannot map %s: %s", name, strerror(errno));
		return errno_code(errno);
	}
	rc = wait_magic(p, deadline, name, err, errlen);
	if (rc == HPUCOLL_OK)
		rc = check_hdr(p, s->nlocal, size, &s->nslots, name, err,
			       errlen);
	munmap(p, SEG_PAGE);
	if (rc != HPUCOLL_OK)
		return rc;
	return map_all(s, fd, (uint64_t)size, err, errlen);
}

/* Creates the segment or joins the one another rank created. */
static int open_seg(hpucoll__shm *s, const char *name, int64_t deadline,
		    char *err, size_t errlen)
{
	int fd, rc;

	for (;;) {
		fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
		if (fd >= 0) {
			rc = create_seg(s, fd, err, errlen);
			close(fd);
			if (rc != HPUCOLL_OK) {
				shm_unlink(name);
				return rc;
			}
			char swept[256];
			int n = hpucoll__shm_sweep_stale(swept, sizeof swept);
			if (n > 0)
				hpucoll__log(HPUCOLL_LOG_NOTICE,
					     "hpucoll: removed %d shared-memory segment%s left in "
					     "/dev/shm by jobs killed while their ranks attached "
					     "(%s)",
					     n, n == 1 ? "" : "s", swept);
			return rc;
		}
		if (errno != EEXIST)
			break;
		fd = shm_open(name, O_RDWR, 0);
		if (fd >= 0) {
			rc = join_seg(s, fd, deadline, name, err, errlen);
			close(fd);
			return rc;
		}
		if (errno != ENOENT)
			break;
		if (timed_out(deadline)) /* created and unlinked repeatedly */
			break;
	}
	fmt(err, errlen, "cannot open shared memory %s: %s", name,
	    strerror(errno));
	return errno_code(errno);
}

/* The inode of this process's pid namespace, or 0. */
static uint64_t pid_ns(void)
{
	struct stat st;

	return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* The pid of local rank i as this process can check it: 0 (not checked)
 * when it lives in another pid namespace, where the number means nothing
 * here. */
static pid_t peer_pid(hpucoll__shm *s, int i)
{
	uint64_t ns = s->ranks[i].pidns, mine = s->ranks[s->local].pidns;

	if (ns != 0 && mine != 0 && ns != mine)
		return 0;
	return atomic_load_explicit(&s->ranks[i].pid, memory_order_relaxed);
}

/* Takes this rank's entry in the segment. */
static int claim(hpucoll__shm *s, const char *name, char *err, size_t errlen)
{
	struct seg_rank *me = &s->ranks[s->local];
	uint32_t st = RANK_FREE;

	me->pidns = pid_ns();
	atomic_store_explicit(&me->pid, (int32_t)getpid(),
			      memory_order_relaxed);
	if (!atomic_compare_exchange_strong(&me->state, &st, RANK_ATTACHED)) {
		fmt(err, errlen,
		    "local rank %d is already attached to shared memory %s (left by a crashed job, or two ranks share a local rank)",
		    s->local, name);
		return HPUCOLL_EPROTO;
	}
	s->claimed = 1;
	return HPUCOLL_OK;
}

/* Reads the pid of every attached rank; checks those that have died. */
static int check_attached(hpucoll__shm *s, char *err, size_t errlen)
{
	int rc;

	for (int i = 0; i < s->nlocal; i++) {
		if (i == s->local ||
		    atomic_load_explicit(&s->ranks[i].state,
					 memory_order_acquire) == RANK_FREE)
			continue;
		s->pid[i] = peer_pid(s, i);
		rc = peer_check(s, i);
		if (rc != HPUCOLL_OK) {
			fmt(err, errlen, "%s while the node's ranks met",
			    s->errmsg);
			return rc;
		}
	}
	return HPUCOLL_OK;
}

/* Counts this rank in and waits until all nlocal have attached. */
static int wait_all(hpucoll__shm *s, const char *name, int64_t deadline,
		    char *err, size_t errlen)
{
	uint32_t n, want = (uint32_t)s->nlocal;
	int64_t now, next_check = now_ns() + CHECK_NS / 10;
	int rc;

	n = atomic_fetch_add(&s->hdr->attached, 1) + 1;
	if (n >= want) {
		shm_unlink(name); /* all have it mapped; the name is not needed */
		futex_wake(&s->hdr->attached, INT_MAX);
	}
	while ((n = atomic_load(&s->hdr->attached)) < want) {
		now = now_ns();
		if (now >= next_check) {
			next_check = now + CHECK_NS;
			rc = check_attached(s, err, errlen);
			if (rc != HPUCOLL_OK)
				return rc;
		}
		if (deadline >= 0 && now >= deadline) {
			fmt(err, errlen,
			    "timed out: %u of %d local ranks attached to shared memory %s",
			    n, s->nlocal, name);
			return HPUCOLL_ETIMEDOUT;
		}
		futex_wait(&s->hdr->attached, n, 10000000);
	}
	return HPUCOLL_OK;
}

static int read_pids(hpucoll__shm *s, char *err, size_t errlen)
{
	for (int i = 0; i < s->nlocal; i++) {
		pid_t pid = peer_pid(s, i);

		if (pid < 0) {
			fmt(err, errlen,
			    "local rank %d has an invalid pid %d in shared memory",
			    i, (int)pid);
			return HPUCOLL_EPROTO;
		}
		s->pid[i] = pid;
		if (i != s->local && pid > 0)
			s->pidfd[i] = (int)syscall(SYS_pidfd_open, pid, 0);
	}
	return HPUCOLL_OK;
}

static void setup_rings(hpucoll__shm *s)
{
	struct layout l = layout_of(s->nlocal, s->nslots);
	struct ring_ctl *ctl = (struct ring_ctl *)(s->base + l.ctl_off);
	unsigned char *slots = s->base + l.slots_off;
	uint64_t ring = (uint64_t)s->nslots * SLOT_SIZE, p;

	for (int j = 0; j < s->nlocal; j++) {
		if (j == s->local)
			continue;
		p = pair_index(s->nlocal, s->local, j);
		s->tx[j].ctl = &ctl[p];
		s->tx[j].slots = slots + p * ring;
		p = pair_index(s->nlocal, j, s->local);
		s->rx[j].ctl = &ctl[p];
		s->rx[j].slots = slots + p * ring;
	}
}

static hpucoll__shm *shm_alloc(int local, int nlocal)
{
	hpucoll__shm *s = calloc(1, sizeof(*s));

	if (s == NULL)
		return NULL;
	s->local = local;
	s->nlocal = nlocal;
	s->tx = calloc(nlocal, sizeof(*s->tx));
	s->rx = calloc(nlocal, sizeof(*s->rx));
	s->pid = calloc(nlocal, sizeof(*s->pid));
	s->pidfd = malloc(nlocal * sizeof(*s->pidfd));
	for (int i = 0; s->pidfd != NULL && i < nlocal; i++)
		s->pidfd[i] = -1;
	if (s->tx == NULL || s->rx == NULL || s->pid == NULL ||
	    s->pidfd == NULL)
		hpucoll__shm_close(&s);
	return s;
}

static int check_args(const char *job, int node, int local, int nlocal,
		      char *err, size_t errlen)
{
	if (!job_ok(job)) {
		fmt(err, errlen,
		    "job name '%.80s' must be 1 to %d letters, digits, '-', '_' or '.'",
		    job ? job : "(null)", HPUCOLL__JOB_MAX - 1);
		return HPUCOLL_EINVAL;
	}
	if (node < 0 || nlocal < 1 || nlocal > MAX_LOCAL || local < 0 ||
	    local >= nlocal) {
		fmt(err, errlen,
		    "bad shared-memory rank: node %d, local rank %d of %d (at most %d)",
		    node, local, nlocal, MAX_LOCAL);
		return HPUCOLL_EINVAL;
	}
	return HPUCOLL_OK;
}

int hpucoll__shm_open(hpucoll__shm **out, const char *job, int node,
		      int local, int nlocal, int timeout_ms, char *err,
		      size_t errlen)
{
	int64_t deadline = deadline_of(timeout_ms);
	char name[HPUCOLL__JOB_MAX + 32];
	hpucoll__shm *s;
	int rc;

	*out = NULL;
	rc = check_args(job, node, local, nlocal, err, errlen);
	if (rc != HPUCOLL_OK)
		return rc;
	snprintf(name, sizeof name, "/hpucoll-%s-n%d", job, node);
	s = shm_alloc(local, nlocal);
	if (s == NULL) {
		fmt(err, errlen, "out of memory");
		return HPUCOLL_ENOMEM;
	}
	rc = open_seg(s, name, deadline, err, errlen);
	if (rc == HPUCOLL_OK)
		rc = claim(s, name, err, errlen);
	if (rc == HPUCOLL_OK)
		rc = wait_all(s, name, deadline, err, errlen);
	if (rc == HPUCOLL_OK)
		rc = read_pids(s, err, errlen);
	if (rc != HPUCOLL_OK) {
		if (s->claimed) /* the job is failing: leave nothing behind */
			shm_unlink(name);
		hpucoll__shm_close(&s);
		return rc;
	}
	setup_rings(s);
	*out = s;
	return HPUCOLL_OK;
}

/* ---- Close ---- */

/* Wakes peers sleeping on a ring with this rank so they notice it left. */
static void wake_peers(hpucoll__shm *s)
{
	for (int j = 0; j < s->nlocal; j++) {
		struct tx *t = &s->tx[j];
		struct rx *r = &s->rx[j];

		if (t->ctl != NULL && atomic_load(&t->ctl->cons_wait))
			futex_wake(&slot_at(t->slots, t->head, s->nslots)->seq,
				   1);
		if (r->ctl != NULL && atomic_load(&r->ctl->prod_wait))
			futex_wake(&r->ctl->tail, 1);
	}
}

void hpucoll__shm_close(hpucoll__shm **sp)
{
	hpucoll__shm *s = sp ? *sp : NULL;

	if (s == NULL)
		return;
	if (s->claimed) {
		atomic_store(&s->ranks[s->local].state, RANK_CLOSED);
		atomic_fetch_add(&s->hdr->detached, 1);
		wake_peers(s);
	}
	if (s->base != NULL)
		munmap(s->base, s->size);
	for (int i = 0; s->pidfd != NULL && i < s->nlocal; i++)
		if (s->pidfd[i] >= 0)
			close(s->pidfd[i]);
	free(s->tx);
	free(s->rx);
	free(s->pid);
	free(s->pidfd);
	free(s);
	*sp = NULL;
}

/* ---- Cleanup after a crash ---- */

/* Whether name is "hpucoll-<something>-n<digits>". */
static int seg_name(const char *name)
{
	const char *n = strrchr(name, '-');
	size_t digits;

	if (strncmp(name, "hpucoll-", 8) != 0 || n == NULL || n < name + 9 ||
	    n[1] != 'n')
		return 0;
	digits = strspn(n + 2, "0123456789");
	return digits > 0 && digits < 10 && n[2 + digits] == '\0';
}

/* Whether the segment open at fd (its size `size`), a minute old, is dead:
 * never initialised (empty, or zero-filled with no magic yet: its creator
 * died while sizing it), or ours with every rank that attached dead in
 * this pid namespace. */
static int seg_dead(int fd, off_t size)
{
	uint64_t mine = pid_ns();
	size_t len;
	int attached = 0, dead = 1;
	void *p;

	if (size == 0)
		return 1;
	if (size < (off_t)SEG_PAGE || mine == 0)
		return 0;
	p = mmap(NULL, SEG_PAGE, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return 0;
	const struct seg_hdr *h = p;
	uint32_t nlocal = h->nlocal;
	if (atomic_load(&h->magic) == 0 && nlocal == 0 && h->total_size == 0) {
		munmap(p, SEG_PAGE);
		return 1; /* its creator died before writing the header */
	}
	if (atomic_load(&h->magic) != SEG_MAGIC || h->version != SEG_VERSION ||
	    nlocal == 0 || nlocal > MAX_LOCAL ||
	    h->total_size != (uint64_t)size) {
		munmap(p, SEG_PAGE);
		return 0;
	}
	munmap(p, SEG_PAGE);
	len = (size_t)RANKS_OFF + nlocal * sizeof(struct seg_rank);
	p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return 0;
	const struct seg_rank *r = (const struct seg_rank *)((char *)p + RANKS_OFF);
	for (uint32_t i = 0; i < nlocal && dead; i++) {
		int32_t pid = atomic_load(&r[i].pid);
		if (atomic_load(&r[i].state) == RANK_FREE && pid == 0)
			continue;
		attached = 1;
		if (r[i].pidns != mine || pid <= 0 ||
		    kill(pid, 0) == 0 || errno != ESRCH)
			dead = 0;
	}
	munmap(p, len);
	return attached && dead;
}

int hpucoll__shm_sweep_stale(char *names, size_t len)
{
	char name[320];
	size_t used = 0;
	struct dirent *e;
	struct stat st, fst;
	time_t now = time(NULL);
	DIR *dir;
	int n = 0;

	if (len > 0)
		names[0] = '\0';
	dir = opendir("/dev/shm");
	if (dir == NULL)
		return 0;
	while ((e = readdir(dir)) != NULL) {
		if (!seg_name(e->d_name) ||
		    fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
		    now - st.st_mtime < 60)
			continue;
		snprintf(name, sizeof name, "/%s", e->d_name);
		int fd = shm_open(name, O_RDONLY | O_NOFOLLOW, 0);
		if (fd < 0)
			continue;
		int dead = fstat(fd, &fst) == 0 && fst.st_ino == st.st_ino &&
			   fst.st_uid == geteuid() && seg_dead(fd, fst.st_size);
		close(fd);
		if (!dead || shm_unlink(name) != 0)
			continue;
		n++;
		hpu__log_list_add(names, len, &used, e->d_name);
	}
	closedir(dir);
	return n;
}

int hpucoll__shm_unlink_job(const char *job)
{
	char name[320];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	if (!job_ok(job))
		return 0;
	dir = opendir("/dev/shm");
	if (dir == NULL)
		return 0;
	while ((e = readdir(dir)) != NULL) {
		/* either name form (shmname.h), any node */
		if (hpu__shm_seg_node(e->d_name, job, NULL) < 0)
			continue;
		/* only this user's: never another user's file at our name */
		struct stat st;
		if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    st.st_uid != geteuid())
			continue;
		snprintf(name, sizeof name, "/%s", e->d_name);
		if (shm_unlink(name) == 0)
			n++;
	}
	closedir(dir);
	return n;
}
