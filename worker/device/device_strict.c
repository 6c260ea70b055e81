/* device_strict: the strict CPU device (--device cpu-strict), for tests.
 *
 * Its memory is one arena of address space reserved at set-up and mapped
 * without access (PROT_NONE). A device call (hpu__dev_enter) opens the
 * part in use for reading and writing, the last hpu__dev_leave closes it
 * again; devmem's own accesses (block headers, zeroing) are device calls
 * too. Host code that reads or writes device memory outside a device call
 * therefore faults at once; the SIGSEGV handler sees the address in the
 * arena, prints one line naming the rank, the address and the block
 * (its kind and what it holds) and exits with status 1, which the
 * launcher reports as the rank's failure. (Built with -DHPU_STRICT_DEBUG
 * it prints the stack too: where to look.)
 *
 * The arena is handed out in whole pages, first fit, from a list of free
 * extents kept in address order; a freed extent's pages are dropped
 * (MADV_DONTNEED), so a new block is zero as devmem expects. Device calls
 * nest and may come from several threads: a count under a mutex says
 * when the arena is open.
 *
 * hpu__dev_cpu_rec is the same arena, its pages opened for reading and
 * writing as they are handed out and closed only while a step is
 * recorded (rec_guard: host code's own accesses then are
 * caught, not fatal), with no device call: `--device cpu --graphs` switches
 * the cpu device to it (device.c's hpu__dev_configure, before devmem is
 * set up), so that a recording tells device memory from host memory
 * (owns, describe) as cpu-strict's does, while host code reads device
 * memory at no cost. Its caps say host_can_read 0 all the same: the
 * strategy takes cpu-strict's paths, whose every access to device memory
 * is a device call a recording holds; and host_mem 1: outside a recording
 * the ops may run their C loops over its memory where the kernel table
 * refuses a case (as on plain cpu). Only one of the two is opened in a
 * process. */
#include <errno.h>
#ifdef HPU_STRICT_DEBUG
#include <execinfo.h>
#endif
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "worker/device/device.h"
#include "worker/device/device_impl.h"
#include "worker/ops/fp8.h" /* hpu__op_layer_name: the layer running */

#define ARENA_BYTES ((size_t)64 << 30) /* address space, not memory */
#define PAGE_BYTES ((size_t)4096)

typedef struct extent {
	size_t off, len;
} extent;

/* A block handed out: its pages and what devmem said it holds. */
typedef struct label {
	size_t off, len;
	int kind; /* -1: pages mapped, not yet labelled */
	size_t user;       /* where labelled: its user part's offset */
	unsigned long seq; /* where labelled: the labelling's number */
	char what[96];
} label;

static unsigned long label_seq; /* labellings so far (under A.mu) */

static struct {
	pthread_mutex_t mu;
	char *base;
	size_t top; /* bytes from base ever handed out: the part opened */
	int depth;  /* device calls running */
	int open;   /* hpu__dev_cpu_rec's: pages open as they are handed out */
	int rank;
	extent *free;
	size_t nfree, capfree;
	label *live;
	size_t nlive, caplive;
} A = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void protect(size_t off, size_t len, int prot)
{
	if (len && mprotect(A.base + off, len, prot) < 0) {
		fprintf(stderr, "hpu-worker: rank %d: cpu-strict: mprotect failed: %s\n", A.rank,
			strerror(errno));
		_exit(1);
	}
}

/* ---- the arena's extents ---- */

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t n = *cap ? *cap * 2 : 64;
	void *p = realloc(*arr, n * elem);
	if (!p)
		return -1;
	*arr = p;
	*cap = n;
	return 0;
}

static void *arena_map(size_t bytes)
{
	void *p = NULL;
	pthread_mutex_lock(&A.mu);
	if (grow((void **)&A.live, &A.caplive, A.nlive + 1, sizeof(label)) < 0)
		goto out;
	for (size_t i = 0; i < A.nfree; i++) {
		extent *e = &A.free[i];
		if (e->len < bytes)
			continue;
		size_t off = e->off;
		e->off += bytes;
		e->len -= bytes;
		if (!e->len) {
			memmove(e, e + 1, (A.nfree - i - 1) * sizeof *e);
			A.nfree--;
		}
		if (off + bytes > A.top) {
			if (A.depth || A.open) /* inside a device call, or always open */
				protect(A.top, off + bytes - A.top, PROT_READ | PROT_WRITE);
			A.top = off + bytes;
		}
		A.live[A.nlive++] = (label){.off = off, .len = bytes, .kind = -1};
		p = A.base + off;
		break;
	}
out:
	pthread_mutex_unlock(&A.mu);
	if (!p)
		errno = ENOMEM;
	return p;
}

/* Puts [off, off + len) back into the free list, merged with its
 * neighbours. */
static void free_extent(size_t off, size_t len)
{
	size_t i = 0;
	while (i < A.nfree && A.free[i].off < off)
		i++;
	if (i > 0 && A.free[i - 1].off + A.free[i - 1].len == off) {
		A.free[i - 1].len += len;
		if (i < A.nfree && off + len == A.free[i].off) {
			A.free[i - 1].len += A.free[i].len;
			memmove(&A.free[i], &A.free[i + 1], (A.nfree - i - 1) * sizeof(extent));
			A.nfree--;
		}
		return;
	}
	if (i < A.nfree && off + len == A.free[i].off) {
		A.free[i].off = off;
		A.free[i].len += len;
		return;
	}
	if (grow((void **)&A.free, &A.capfree, A.nfree + 1, sizeof(extent)) < 0)
		return; /* the pages are lost to the arena, no harm */
	memmove(&A.free[i + 1], &A.free[i], (A.nfree - i) * sizeof(extent));
	A.free[i] = (extent){off, len};
	A.nfree++;
}

static void arena_unmap(void *p, size_t bytes)
{
	size_t off = (size_t)((char *)p - A.base);
	madvise(p, bytes, MADV_DONTNEED); /* zero when taken again */
	pthread_mutex_lock(&A.mu);
	for (size_t i = 0; i < A.nlive; i++)
		if (A.live[i].off == off) {
			A.live[i] = A.live[--A.nlive];
			break;
		}
	free_extent(off, bytes);
	pthread_mutex_unlock(&A.mu);
}

static void arena_label(void *user, size_t bytes, hpu_mem_kind kind, const char *what)
{
	size_t at = (size_t)((char *)user - A.base);
	(void)bytes;
	pthread_mutex_lock(&A.mu);
	for (size_t i = 0; i < A.nlive; i++) {
		label *l = &A.live[i];
		if (at >= l->off && at < l->off + l->len) {
			l->kind = what ? (int)kind : -1;
			l->user = at;
			l->seq = ++label_seq;
			snprintf(l->what, sizeof l->what, "%s", what ? what : "");
			break;
		}
	}
	pthread_mutex_unlock(&A.mu);
}

/* ---- device calls ---- */

static void strict_enter(void)
{
	pthread_mutex_lock(&A.mu);
	if (A.depth++ == 0)
		protect(0, A.top, PROT_READ | PROT_WRITE);
	pthread_mutex_unlock(&A.mu);
}

static void strict_leave(void)
{
	pthread_mutex_lock(&A.mu);
	if (--A.depth == 0)
		protect(0, A.top, PROT_NONE);
	pthread_mutex_unlock(&A.mu);
}

static int strict_owns(const void *p)
{
	const char *c = p;
	return A.base && c >= A.base && c < A.base + ARENA_BYTES;
}

static const hpu__devmem_backing backing = {
    .map = arena_map,
    .unmap = arena_unmap,
    .open = strict_enter,
    .close = strict_leave,
    .label = arena_label,
};

/* ---- the fault ---- */

static const char *const kind_upper[HPU_MEM_NKINDS] = {
    "PARAMS", "GRADS", "OPTIM", "ACTS", "COMM", "OTHER",
};

static struct sigaction old_segv;

/* The labelled block at a (an address in the arena) as "KIND block
 * 'what'", else none. It takes no lock (the faulting thread may
 * hold it): its other caller locks. */
static void block_at(const char *a, const char *none, char *out, size_t len)
{
	size_t at = (size_t)(a - A.base);
	const label *hit = NULL;
	for (size_t i = 0; i < A.nlive; i++)
		if (at >= A.live[i].off && at < A.live[i].off + A.live[i].len)
			hit = &A.live[i];
	if (hit && hit->kind >= 0 && hit->kind < HPU_MEM_NKINDS)
		snprintf(out, len, "%s block '%s'", kind_upper[hit->kind], hit->what);
	else
		snprintf(out, len, "%s", none);
}

/* The device's describe: the block at p, "device memory" where no
 * labelled block holds p. */
static void strict_describe(const void *p, char *out, size_t len)
{
	if (!strict_owns(p)) {
		snprintf(out, len, "host memory");
		return;
	}
	pthread_mutex_lock(&A.mu);
	block_at(p, "device memory", out, len);
	pthread_mutex_unlock(&A.mu);
}

/* A fault in the arena is host code touching device memory: say where and
 * exit, handing the sentence to hpu__dev_fatal_why (the closing error's
 * reason). Any other fault goes to the handler that was there before:
 * the faulting instruction runs again under it (a raise() would hand it
 * a signal's sender in place of the address). (The lookup takes no
 * lock: the faulting thread may hold it.) */
static void on_segv(int sig, siginfo_t *si, void *uc)
{
	char *a = si->si_addr;
	(void)uc;
	if (si->si_code <= 0 || !A.base || a < A.base || a >= A.base + ARENA_BYTES) {
		sigaction(SIGSEGV, &old_segv, NULL);
		if (si->si_code <= 0) /* sent (kill, raise): it does not repeat */
			raise(sig);
		return;
	}
	/* device memory open (inside a device call, or always) faults only
	 * past the pages handed out: a write or read beyond a tensor's end */
	int open = A.depth > 0 || A.open;
	char block[160];
	block_at(a, "no block in use", block, sizeof block);
	char why[480], line[512], in[200] = "";
	const char *layer = hpu__op_layer_name(); /* the strategy's hpu__op_layer */
	const char *part = hpu__op_layer_backward() ? "backward" : "forward";
	if (layer[0] && !open && hpu__dev_strict_kernels()) /* its own loop */
		snprintf(in, sizeof in, " in layer %s's %s (a loop of its own, not an op: "
			 "HPU_LAYER_HOST_ONLY?)", layer, part);
	else if (layer[0])
		snprintf(in, sizeof in, " in layer %s's %s", layer, part);
	if (open)
		snprintf(why, sizeof why, "host code touched device memory at %p (past the end of "
			 "every block in use: an overrun of a tensor?)%s under --device cpu-strict",
			 (void *)a, in);
	else
		snprintf(why, sizeof why, "host code touched device memory at %p (%s)%s outside a "
			 "device call under --device cpu-strict", (void *)a, block, in);
	int n = snprintf(line, sizeof line, "hpu-worker: rank %d: %s\n", A.rank, why);
	if (n > 0 && write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0)
		_exit(1);
	if (hpu__dev_fatal_why)
		hpu__dev_fatal_why(why);
#ifdef HPU_STRICT_DEBUG
	void *bt[32];
	backtrace_symbols_fd(bt, backtrace(bt, 32), 2);
#endif
	_exit(1);
}

/* ---- the table ---- */

/* Reserves the arena, without access: `open` 0, cpu-strict's, opened by
 * device calls; 1, hpu__dev_cpu_rec's, its pages opened for good as
 * they are first handed out (only those count as committed memory).
 * `name` is the device's in the error. */
static int arena_setup(const char *name, int open, int rank, char *err, size_t errlen)
{
	void *m = mmap(NULL, ARENA_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		       -1, 0);
	if (m == MAP_FAILED) {
		snprintf(err, errlen, "--device %s: cannot reserve its arena of %zu GiB: %s",
			 name, ARENA_BYTES >> 30, strerror(errno));
		return -1;
	}
	A.base = m;
	A.top = 0;
	A.depth = 0;
	A.open = open;
	A.rank = rank;
	A.nfree = A.nlive = 0;
	if (grow((void **)&A.free, &A.capfree, 1, sizeof(extent)) < 0) {
		munmap(m, ARENA_BYTES);
		A.base = NULL;
		snprintf(err, errlen, "--device %s: out of memory", name);
		return -1;
	}
	A.free[A.nfree++] = (extent){0, ARENA_BYTES};
	return 0;
}

static int strict_setup(int rank, char *err, size_t errlen)
{
	if (arena_setup("cpu-strict", 0, rank, err, errlen) < 0)
		return -1;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_segv;
	/* on the crash report's stack too: a stack overflow's fault has no
	 * stack left to run a handler on (it ended without a report) */
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGSEGV, &sa, &old_segv);
	return 0;
}

static void strict_teardown(void)
{
	sigaction(SIGSEGV, &old_segv, NULL);
	/* Blocks still in use keep their pages: the arena stays reserved. */
	A.nfree = A.nlive = 0;
}

static void strict_caps(hpu__dev_caps *out)
{
	hpu__dev_cpu.caps(out);
	out->host_can_read = 0;
}

const hpu__device hpu__dev_cpu_strict = {
    .name = "cpu-strict",
    .setup = strict_setup,
    .teardown = strict_teardown,
    .caps = strict_caps,
    .enter = strict_enter,
    .leave = strict_leave,
    HPU__DEV_CPU_SHARED,
    .owns = strict_owns,
    .backing = &backing,
    .describe = strict_describe,
};

/* ---- the cpu device under --graphs: the arena, always open ---- */

/* While a step is recorded the arena is closed (rec_guard):
 * a recording holds the kernels' calls, never host code's own loops over
 * device memory (a custom layer's C loops, which --device cpu allows),
 * so such an access is not part of the recording. Its fault opens the
 * page, lets the access run and is kept (the first address) for the
 * recording's end, which refuses the recording; the step then runs
 * eagerly. So that it runs once, not twice, each page is copied (R.save)
 * before host code's first access to it, and a refused recording puts
 * back what host code changed there in the blocks that were in use
 * before it began (their user parts: devmem's headers stay as they are;
 * blocks taken while recording are the recording's own, and so are
 * pages past R.pages). Without room for the copies (R.save NULL), the
 * first fault opens the whole arena, as it did before. */
static volatile sig_atomic_t rec_guarded;
static void *volatile rec_touched;
/* the layer and pass running at that first access ("" for none) */
static char rec_layer[64];
static int rec_layer_bwd;

static struct {
	char *save;              /* [pages * PAGE_BYTES], MAP_NORESERVE */
	unsigned long *claimed;  /* a page's copy is being made / is made */
	unsigned long *saved;
	size_t pages;
	unsigned long seq0;      /* labels numbered before it began */
} R;

#define BIT(p) (1UL << ((p) % (8 * sizeof(unsigned long))))
#define WORD(p) ((p) / (8 * sizeof(unsigned long)))

static void rec_on_segv(int sig, siginfo_t *si, void *uc)
{
	char *a = si->si_addr;
	(void)uc;
	size_t top = A.top;
	if (rec_guarded && A.base && a >= A.base && a < A.base + top) {
		if (!rec_touched) {
			const char *ln = hpu__op_layer_name(); /* a plain copy: signal-safe */
			size_t k = 0;
			for (; ln[k] && k < sizeof rec_layer - 1; k++)
				rec_layer[k] = ln[k];
			rec_layer[k] = '\0';
			rec_layer_bwd = hpu__op_layer_backward();
			rec_touched = a;
		}
		size_t p = (size_t)(a - A.base) / PAGE_BYTES;
		char *pg = A.base + p * PAGE_BYTES;
		if (R.save) {
			if (mprotect(pg, PAGE_BYTES, PROT_READ | PROT_WRITE) != 0)
				goto other;
			if (p >= R.pages)
				return; /* taken while recording */
			unsigned long b = BIT(p);
			if (!(__atomic_fetch_or(&R.claimed[WORD(p)], b, __ATOMIC_ACQ_REL) & b)) {
				memcpy(R.save + p * PAGE_BYTES, pg, PAGE_BYTES);
				__atomic_fetch_or(&R.saved[WORD(p)], b, __ATOMIC_RELEASE);
			}
			while (!(__atomic_load_n(&R.saved[WORD(p)], __ATOMIC_ACQUIRE) & b))
				;
			return; /* the access runs again, its page open */
		}
		rec_guarded = 0;
		A.open = 1;
		if (mprotect(A.base, top, PROT_READ | PROT_WRITE) == 0)
			return; /* the access runs again, now open */
	}
other: /* as on_segv: a fault runs again under the handler before */
	sigaction(SIGSEGV, &old_segv, NULL);
	if (si->si_code <= 0)
		raise(sig);
}

/* R for a recording of the arena's first `top` bytes (under A.mu); on
 * failure R.save stays NULL. */
static void save_begin(size_t top)
{
	size_t pages = top / PAGE_BYTES, words = WORD(pages) + 1;
	R.claimed = calloc(words, sizeof *R.claimed);
	R.saved = calloc(words, sizeof *R.saved);
	void *m = pages ? mmap(NULL, pages * PAGE_BYTES, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
			: MAP_FAILED;
	if (!R.claimed || !R.saved || m == MAP_FAILED) {
		free(R.claimed);
		free(R.saved);
		R.claimed = R.saved = NULL;
		if (m != MAP_FAILED)
			munmap(m, pages * PAGE_BYTES);
		return;
	}
	R.pages = pages;
	R.seq0 = label_seq;
	R.save = m;
}

/* The pages copied put back where they hold the user part of a block
 * labelled before the recording began (under A.mu, the arena open). */
static void save_restore(void)
{
	for (size_t p = 0; R.save && p < R.pages; p++) {
		if (!(R.saved[WORD(p)] & BIT(p)))
			continue;
		size_t lo = p * PAGE_BYTES, hi = lo + PAGE_BYTES;
		const label *l = NULL;
		for (size_t i = 0; i < A.nlive && !l; i++)
			if (lo >= A.live[i].off && lo < A.live[i].off + A.live[i].len)
				l = &A.live[i];
		if (!l || l->kind < 0 || l->seq > R.seq0)
			continue;
		size_t from = lo > l->user ? lo : l->user;
		size_t to = hi < l->off + l->len ? hi : l->off + l->len;
		if (from < to)
			memcpy(A.base + from, R.save + from, to - from);
	}
}

static void save_end(void)
{
	if (R.save)
		munmap(R.save, R.pages * PAGE_BYTES);
	free(R.claimed);
	free(R.saved);
	memset(&R, 0, sizeof R);
}

static void guard_on(void)
{
	pthread_mutex_lock(&A.mu);
	rec_touched = NULL;
	save_begin(A.top);
	A.open = 0; /* pages handed out meanwhile stay closed too */
	rec_guarded = 1;
	if (!A.depth)
		protect(0, A.top, PROT_NONE);
	pthread_mutex_unlock(&A.mu);
}

/* devmem's own accesses (its blocks' headers, in the arena): open while
 * they last, as cpu-strict's device calls open it. */
static void rec_open(void)
{
	pthread_mutex_lock(&A.mu);
	if (A.depth++ == 0 && rec_guarded)
		protect(0, A.top, PROT_READ | PROT_WRITE);
	pthread_mutex_unlock(&A.mu);
}

static void rec_close(void)
{
	pthread_mutex_lock(&A.mu);
	if (--A.depth == 0 && rec_guarded)
		protect(0, A.top, PROT_NONE);
	pthread_mutex_unlock(&A.mu);
}

static const void *guard_off(char *what, size_t len)
{
	pthread_mutex_lock(&A.mu);
	rec_guarded = 0;
	A.open = 1;
	protect(0, A.top, PROT_READ | PROT_WRITE);
	void *a = rec_touched;
	rec_touched = NULL;
	if (a) {
		block_at(a, "no block in use", what, len);
		size_t k = strlen(what);
		if (rec_layer[0] && k < len)
			snprintf(what + k, len - k, ", in layer %s's %s", rec_layer,
				 rec_layer_bwd ? "backward" : "forward");
		save_restore(); /* the step runs eagerly now: once */
	}
	save_end();
	pthread_mutex_unlock(&A.mu);
	return a;
}

/* The device's rec_guard (device.h). */
static const void *rec_guard(int on, char *what, size_t len)
{
	if (on) {
		guard_on();
		return NULL;
	}
	return guard_off(what, len);
}

static void rec_caps(hpu__dev_caps *out)
{
	strict_caps(out);
	out->host_mem = 1; /* the ops' C loops may run outside a recording */
}

static int rec_setup(int rank, char *err, size_t errlen)
{
	if (arena_setup("cpu", 1, rank, err, errlen) < 0)
		return -1;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = rec_on_segv;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGSEGV, &sa, &old_segv);
	return 0;
}

static void rec_teardown(void)
{
	sigaction(SIGSEGV, &old_segv, NULL);
	A.nfree = A.nlive = 0;
}

static const hpu__devmem_backing rec_backing = {
    .map = arena_map,
    .unmap = arena_unmap,
    .open = rec_open,
    .close = rec_close,
    .label = arena_label,
};

const hpu__device hpu__dev_cpu_rec = {
    .name = "cpu",
    .setup = rec_setup,
    .teardown = rec_teardown,
    .caps = rec_caps,
    HPU__DEV_CPU_SHARED,
    .owns = strict_owns,
    .backing = &rec_backing,
    .describe = strict_describe,
    .rec_guard = rec_guard,
};
