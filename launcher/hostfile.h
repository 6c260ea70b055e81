/* hostfile: the list of nodes for `hpulaunch --hostfile FILE`, in the
 * format DeepSpeed and Open MPI write:
 *
 *     # comment
 *     worker-1 slots=8
 *     10.0.0.2:29401 slots=8 max_slots=8   # daemon on port 29401
 *     worker-3
 *
 * One host per line: a name or an IPv4 address, optionally ":PORT" for
 * that node's hpud control port; then attributes "slots=N" (workers on
 * the node) and Open MPI's "max_slots=N" (checked, then ignored), with or
 * without spaces around '='. '#' starts a comment; blank lines are
 * skipped. */
#ifndef HPU_HOSTFILE_H
#define HPU_HOSTFILE_H

#include <stddef.h>

#define HPU_HOSTFILE_MAX_HOSTS 4096
#define HPU_HOSTFILE_MAX_LINE 1024 /* characters, without the newline */
#define HPU_HOSTFILE_MAX_SLOTS 1024

typedef struct hpu_host {
	char name[256]; /* host name or IPv4 address, without the port */
	int slots;      /* workers on the node; 0: not given */
	int port;       /* the node's hpud port from "host:port"; 0: not given
			 * (--hostfile's plan then sets --hpud-port's) */
	int line;       /* the hostfile's line that named it */
} hpu_host;

/* Reads the hostfile at path into a malloc'ed array of *nhosts (>= 1)
 * hosts, in file order; the caller frees *hosts with free(). Returns 0,
 * or -1 with a sentence in err naming FILE:LINE and what is wrong (bad or
 * unknown attribute, bad host or port, duplicate host, a line too long, a
 * NUL or another control byte: not a text file, too many hosts, or no
 * hosts at all), or naming FILE when it cannot be read or is no regular
 * file (a FIFO is refused, not waited on); then *hosts is NULL. Host
 * names are not resolved here. A host is a
 * duplicate when its name (ignoring case) and port equal an earlier
 * line's, so two daemons on one machine may be listed with two ports
 * (--hostfile's plan also refuses two names of one address and port,
 * after the default port is applied: args_hosts.c). */
int hpu__hostfile_read(const char *path, hpu_host **hosts, int *nhosts,
		       char *err, size_t errlen);

#endif
