/* cuda_names: a kernel's name as people read it, for the graph's nodes by
 * name (cuda_device.c) and the kernels' GPU times (cuda_kprof.c). */
#include "worker/cuda/cuda_device.h"

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
