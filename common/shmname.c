/* shmname: a job's shared-memory segment names, recognized. */
#include "common/shmname.h"

#include <string.h>

#include "common/hex.h"

int hpu__shm_session_ok(const char *s)
{
	return s && hpu__is_hex(s, HPU_SHM_SESSION_HEX) && s[HPU_SHM_SESSION_HEX] == '\0';
}

int hpu__shm_seg_node(const char *name, const char *job, int *session)
{
	size_t jl = strlen(job);
	if (strncmp(name, "hpucoll-", 8) != 0 || strncmp(name + 8, job, jl) != 0 ||
	    name[8 + jl] != '-')
		return -1;
	const char *d = name + 9 + jl;
	int s = hpu__is_hex(d, HPU_SHM_SESSION_HEX) && d[HPU_SHM_SESSION_HEX] == '-';
	if (s)
		d += HPU_SHM_SESSION_HEX + 1;
	/* "n" and the node as %d writes it: no sign, no leading zero */
	if (*d++ != 'n' || *d < '0' || *d > '9' || (d[0] == '0' && d[1]))
		return -1;
	int node = 0;
	for (int i = 0; *d; d++, i++) {
		if (*d < '0' || *d > '9' || i == 9)
			return -1;
		node = node * 10 + (*d - '0');
	}
	if (session)
		*session = s;
	return node;
}
