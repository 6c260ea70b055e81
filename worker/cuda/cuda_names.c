/* cuda_names: a kernel's name as people read it, for the graph's nodes by
 * name (cuda_device.c) and the kernels' GPU times (cuda_kprof.c); and the
 * optional libraries the module opens by name (CUPTI, NCCL). */
#include "worker/cuda/cuda_device.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hpu__cuda_demangle(const char *m, char *out, size_t len)
{
	const char *p = m;
	if (p[0] == '_' && p[1] == 'Z') {
		p += 2;
		if (*p == 'L')
			p++;
		if (*p >= '1' && *p <= '9') {
			char *end;
			unsigned long n = strtoul(p, &end, 10);
			if (n < len && strlen(end) >= n) {
				snprintf(out, len, "%.*s", (int)n, end);
				return;
			}
		}
	}
	snprintf(out, len, "%s", m);
}

void *hpu__cuda_dlopen_first(const char *named, const char *const *tries, size_t n, char *why,
			     size_t len)
{
	why[0] = '\0';
	if (named && *named) { /* the one asked for, or none */
		void *h = dlopen(named, RTLD_NOW | RTLD_LOCAL);
		if (!h)
			snprintf(why, len, "%s", dlerror());
		return h;
	}
	for (size_t i = 0; i < n; i++) {
		void *h = dlopen(tries[i], RTLD_NOW | RTLD_LOCAL);
		if (h)
			return h;
		if (!why[0])
			snprintf(why, len, "%s", dlerror());
	}
	return NULL;
}
