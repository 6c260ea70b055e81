/* devmem_stats: the counts of a pool (InUse, the peaks, the bytes per
 * kind), DeviceStats and the per-kind reads, and the pieces of devmem's
 * sentences (sizes, who). */
#include "worker/hpu/devmem.h"
#include "worker/hpu/devmem_impl.h"

#include <pthread.h>
#include <stdio.h>

/* ---- a pool's counts ---- */

void hpu__devmem_tally_alloc(tally *t, hpu_mem_kind kind, size_t bytes)
{
	t->in_use += bytes;
	if (t->in_use > t->max_in_use)
		t->max_in_use = t->in_use;
	if (bytes > t->max_alloc_size)
		t->max_alloc_size = bytes;
	t->num_allocs++;
	t->kind_in_use[kind] += bytes;
	if (t->kind_in_use[kind] > t->kind_max[kind])
		t->kind_max[kind] = t->kind_in_use[kind];
	uint64_t states = t->kind_in_use[HPU_MEM_PARAMS] + t->kind_in_use[HPU_MEM_GRADS] +
			  t->kind_in_use[HPU_MEM_OPTIM];
	if (states > t->states_max)
		t->states_max = states;
}

void hpu__devmem_tally_free(tally *t, hpu_mem_kind kind, size_t bytes)
{
	t->in_use -= bytes;
	t->kind_in_use[kind] -= bytes;
	t->num_frees++;
}

/* ---- the sentences' pieces ---- */

static const char *const kind_names[HPU_MEM_NKINDS] = {
    "params", "grads", "optim", "acts", "comm", "other",
};

const char *hpu__mem_kind_name(hpu_mem_kind kind)
{
	if ((unsigned)kind >= HPU_MEM_NKINDS)
		return "?";
	return kind_names[kind];
}

void hpu__devmem_fmt_bytes(char *buf, size_t len, uint64_t n)
{
	static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
	if (n < 1024) {
		snprintf(buf, len, "%llu byte%s", (unsigned long long)n,
			 n == 1 ? "" : "s");
		return;
	}
	double v = (double)n / 1024;
	int u = 0;
	while (v >= 1024 && u < 3) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, "%.1f %s", v, units[u]);
}

/* "rank 3: " once the device is set up, "devmem: " before. */
void hpu__devmem_fmt_who(char *buf, size_t len)
{
	if (hpu__devmem.initialized)
		snprintf(buf, len, "rank %d: ", hpu__devmem.rank);
	else
		snprintf(buf, len, "devmem: ");
}

/* ---- statistics ---- */

void hpu__devmem_tally_stats(const tally *t, uint64_t limit, uint64_t sys_allocs,
			uint64_t sys_frees, hpu_device_stats *out)
{
	*out = (hpu_device_stats){
		.limit = limit,
		.in_use = t->in_use,
		.max_in_use = t->max_in_use,
		.num_allocs = t->num_allocs,
		.num_frees = t->num_frees,
		.active_allocs = t->num_allocs - t->num_frees,
		.max_alloc_size = t->max_alloc_size,
		.total_system_allocs = sys_allocs,
		.total_system_frees = sys_frees,
		.total_active_allocs = sys_allocs - sys_frees,
	};
}

static void fill_stats(hpu_device_stats *out)
{
	hpu__devmem_tally_stats(&hpu__devmem.t, hpu__devmem.limit, hpu__devmem.sys_allocs,
				hpu__devmem.sys_frees, out);
}

void hpu__devmem_stats(hpu_device_stats *out)
{
	pthread_mutex_lock(&hpu__devmem.mu);
	fill_stats(out);
	pthread_mutex_unlock(&hpu__devmem.mu);
}

int hpu_device_stats_get(hpu_device_stats *out)
{
	pthread_mutex_lock(&hpu__devmem.mu);
	bool up = hpu__devmem.initialized;
	if (up)
		fill_stats(out);
	pthread_mutex_unlock(&hpu__devmem.mu);
	return up ? HPU_OK : HPU_ENODEV;
}

static uint64_t locked_read(const uint64_t *v)
{
	pthread_mutex_lock(&hpu__devmem.mu);
	uint64_t x = *v;
	pthread_mutex_unlock(&hpu__devmem.mu);
	return x;
}

uint64_t hpu__devmem_kind_in_use(hpu_mem_kind kind)
{
	if ((unsigned)kind >= HPU_MEM_NKINDS)
		return 0;
	return locked_read(&hpu__devmem.t.kind_in_use[kind]);
}

uint64_t hpu__devmem_kind_max(hpu_mem_kind kind)
{
	if ((unsigned)kind >= HPU_MEM_NKINDS)
		return 0;
	return locked_read(&hpu__devmem.t.kind_max[kind]);
}

uint64_t hpu__devmem_states_max(void)
{
	return locked_read(&hpu__devmem.t.states_max);
}
