/* devmem_host: the host tier (devmem.h's hpu__halloc, --host-memory). */
#include "worker/hpu/devmem.h"
#include "worker/hpu/devmem_impl.h"
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- the host tier ----
 *
 * Memory the offloading strategies keep outside the device (ZeRO-Offload's
 * CPU tier): counted against --host-memory, not --device-memory, with the
 * same statistics. Blocks have the device's header (MAGIC_HOST), so
 * hpu__dfree frees either kind; they are not cached: the tier holds a few
 * large, long-lived buffers, each one block of the system. */

static struct {
	pthread_mutex_t mu;
	uint64_t limit; /* 0: none */
	tally t;
} host = {.mu = PTHREAD_MUTEX_INITIALIZER};

int hpu__hostmem_init(uint64_t limit)
{
	pthread_mutex_lock(&host.mu);
	/* blocks still held stay counted in InUse; the peaks start anew */
	host.limit = limit;
	host.t.max_in_use = host.t.in_use;
	host.t.max_alloc_size = 0;
	memcpy(host.t.kind_max, host.t.kind_in_use, sizeof host.t.kind_max);
	host.t.states_max = 0;
	pthread_mutex_unlock(&host.mu);
	return 0;
}

/* The sentence of a refused host allocation: over the limit (e == 0), or
 * the system refused with errno e. Under host.mu. */
static void set_host_error(size_t bytes, const char *what, int e)
{
	char who[32], req[32], used[32], lim[32];
	pthread_mutex_lock(&hpu__devmem.mu);
	hpu__devmem_fmt_who(who, sizeof who);
	pthread_mutex_unlock(&hpu__devmem.mu);
	hpu__devmem_fmt_bytes(req, sizeof req, bytes);
	hpu__devmem_fmt_bytes(used, sizeof used, host.t.in_use);
	if (host.limit)
		hpu__devmem_fmt_bytes(lim, sizeof lim, host.limit);
	else
		snprintf(lim, sizeof lim, "none");
	if (e) /* not the limit: the system (it read as --host-memory's doing) */
		snprintf(hpu__devmem_err, sizeof hpu__devmem_err,
			 "%sout of host memory allocating %s (offloaded): the system refused %s (%s); "
			 "InUse %s, Limit %s (--host-memory: free memory, or offload less)",
			 who, what, req, strerror(e), used, lim);
	else
		snprintf(hpu__devmem_err, sizeof hpu__devmem_err,
			 "%sout of host memory allocating %s (offloaded): %s requested, InUse %s, Limit %s (--host-memory)",
			 who, what, req, used, lim);
}

void *hpu__halloc(hpu_mem_kind kind, size_t bytes, const char *what)
{
	if ((unsigned)kind >= HPU_MEM_NKINDS) {
		hpu__log(HPU_LOG_ERROR, "hpu__halloc: bad memory kind %d", (int)kind);
		abort();
	}
	if (!what)
		what = "memory";
	/* held across the system call, as the device's lock is, so that the
	 * limit holds across threads */
	pthread_mutex_lock(&host.mu);
	if (host.limit && bytes > host.limit - host.t.in_use) {
		set_host_error(bytes, what, 0);
		pthread_mutex_unlock(&host.mu);
		return NULL;
	}
	blk *b = NULL;
	uint64_t rounded = bytes > MAX_REQUEST ? 0 : class_of(bytes);
	if (rounded && is_mapped(rounded)) { /* a fresh mapping is zero */
		void *m = mmap(NULL, HDR + rounded, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		b = m == MAP_FAILED ? NULL : m;
	} else if (rounded && (b = aligned_alloc(HDR, HDR + rounded))) {
		memset(b, 0, HDR + rounded);
	}
	if (!b) {
		set_host_error(bytes, what, ENOMEM);
		pthread_mutex_unlock(&host.mu);
		return NULL;
	}
	b->magic = MAGIC_HOST;
	b->bytes = bytes;
	b->rounded = rounded;
	b->kind = (uint16_t)kind;
	hpu__devmem_tally_alloc(&host.t, kind, bytes);
	pthread_mutex_unlock(&host.mu);
	return user_of(b);
}

void hpu__devmem_host_free(blk *b)
{
	pthread_mutex_lock(&host.mu);
	hpu__devmem_tally_free(&host.t, b->kind, b->bytes);
	pthread_mutex_unlock(&host.mu);
	b->magic = MAGIC_DEAD;
	if (is_mapped(b->rounded))
		munmap(b, HDR + b->rounded);
	else
		free(b);
}

void hpu__hostmem_stats(hpu_device_stats *out)
{
	pthread_mutex_lock(&host.mu);
	/* every block is one of the system's */
	hpu__devmem_tally_stats(&host.t, host.limit, host.t.num_allocs, host.t.num_frees, out);
	pthread_mutex_unlock(&host.mu);
}

uint64_t hpu__hostmem_kind_max(hpu_mem_kind kind)
{
	if ((unsigned)kind >= HPU_MEM_NKINDS)
		return 0;
	pthread_mutex_lock(&host.mu);
	uint64_t v = host.t.kind_max[kind];
	pthread_mutex_unlock(&host.mu);
	return v;
}

uint64_t hpu__hostmem_states_max(void)
{
	pthread_mutex_lock(&host.mu);
	uint64_t v = host.t.states_max;
	pthread_mutex_unlock(&host.mu);
	return v;
}
