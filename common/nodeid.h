/* nodeid: this machine as "host/boot-id": the host's name and the
 * kernel's boot id. Processes on one machine share both; two machines
 * that share a host name (containers from one template, identical
 * servers) have different boot ids. Inline: the CUDA module uses it and
 * links no symbol of the worker. */
#ifndef HPU_COMMON_NODEID_H
#define HPU_COMMON_NODEID_H

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static inline void hpu__node_ident(char *out, size_t len)
{
	char host[256] = "", boot[40] = "";
	if (!len)
		return;
	if (gethostname(host, sizeof host - 1) < 0)
		host[0] = 0;
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
	if (f) {
		if (!fgets(boot, sizeof boot, f))
			boot[0] = 0;
		fclose(f);
	}
	boot[strcspn(boot, "\n")] = 0;
	snprintf(out, len, "%s/%s", host, boot);
}

#endif
