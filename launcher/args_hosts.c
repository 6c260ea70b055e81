/* args_hosts: --hostfile's plan: the hosts kept by --include/--exclude,
 * the workers each runs, node 0's address. */
#include "launcher/args_impl.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Lists the hosts for which pick(a, i) holds into out, at most four, as
 * "a, b, c, d and 3 more" or, with slots, "a (8), b (4)". */
static void host_names(const hpu_launch_args *a,
		       int (*pick)(const hpu_launch_args *, int), int slots,
		       char *out, size_t outlen)
{
	size_t used = 0;
	int shown = 0, more = 0;
	out[0] = 0;
	for (int i = 0; i < a->nhosts; i++) {
		if (!pick(a, i))
			continue;
		if (shown == 4) {
			more++;
			continue;
		}
		int k = slots ? snprintf(out + used, outlen - used, "%s%s (%d)",
					 shown ? ", " : "", a->hosts[i].name,
					 a->hosts[i].slots)
			      : snprintf(out + used, outlen - used, "%s%s",
					 shown ? ", " : "", a->hosts[i].name);
		if (k > 0 && (size_t)k < outlen - used)
			used += (size_t)k;
		shown++;
	}
	if (more)
		snprintf(out + used, outlen - used, " and %d more", more);
}

static int no_slots(const hpu_launch_args *a, int i)
{
	return a->hosts[i].slots == 0;
}

static int too_few_slots(const hpu_launch_args *a, int i)
{
	return a->hosts[i].slots && a->hosts[i].slots < a->devices;
}

/* With --devices D every host runs D workers (no more than its slots);
 * otherwise each host runs its slots=N, which may differ from host to
 * host (DeepSpeed's hostfiles): node r's ranks then follow those of the
 * hosts before it. Each host's slots become the workers it runs; devices
 * is node 0's. */
static int hostfile_devices(hpu_launch_args *a, const sources *src,
			    char *err, size_t errlen)
{
	char names[300];
	if (src->flag & SET_DEVICES_AUTO) {
		snprintf(err, errlen, "--devices auto counts this machine's cores; with --hostfile give a number or slots=N in %s",
			 a->hostfile);
		return -1;
	}
	if (src->flag & SET_DEVICES) {
		host_names(a, too_few_slots, 1, names, sizeof names);
		if (names[0]) {
			snprintf(err, errlen, "--devices %d is more than the slots of host %s in %s",
				 a->devices, names, a->hostfile);
			return -1;
		}
		for (int i = 0; i < a->nhosts; i++)
			a->hosts[i].slots = a->devices;
		return 0;
	}
	host_names(a, no_slots, 0, names, sizeof names);
	if (names[0]) {
		snprintf(err, errlen, "%s gives no slots=N for host %s: give slots for every host, or --devices",
			 a->hostfile, names);
		return -1;
	}
	a->devices = a->hosts[0].slots;
	return 0;
}

/* Whether host `name` is in DeepSpeed's list "HOST@HOST...". */
static int in_host_list(const char *list, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = list;; p++) {
		size_t len = strcspn(p, "@");
		if (len == n && !strncmp(p, name, n))
			return 1;
		p += len;
		if (!*p)
			return 0;
	}
}

/* DeepSpeed's --include / --exclude: keeps (or drops) the hostfile's
 * hosts named in the list, in file order. Whole hosts only: "HOST:0,1"
 * picks devices, which hpulaunch does not (a host runs its slots). */
static int filter_hosts(hpu_launch_args *a, char *err, size_t errlen)
{
	const char *list = a->include ? a->include : a->exclude;
	const char *flag = a->include ? "--include" : "--exclude";
	if (!list)
		return 0;
	if (a->include && a->exclude) {
		snprintf(err, errlen, "--include and --exclude do not go together: give one of them");
		return -1;
	}
	if (strchr(list, ':')) {
		snprintf(err, errlen, "%s %s: hpulaunch does not pick a host's devices (HOST:SLOT,SLOT); name whole hosts (HOST@HOST) and set slots= in %s or --devices",
			 flag, list, a->hostfile);
		return -1;
	}
	for (const char *p = list;; p++) {
		size_t len = strcspn(p, "@");
		int found = 0;
		for (int i = 0; i < a->nhosts && !found; i++)
			found = strlen(a->hosts[i].name) == len && !strncmp(a->hosts[i].name, p, len);
		if (!found) {
			snprintf(err, errlen, "%s names host '%.*s', which is not in %s", flag, (int)len, p,
				 a->hostfile);
			return -1;
		}
		p += len;
		if (!*p)
			break;
	}
	int kept = 0;
	for (int i = 0; i < a->nhosts; i++)
		if (in_host_list(list, a->hosts[i].name) == (a->include != NULL))
			a->hosts[kept++] = a->hosts[i];
	if (!kept) {
		snprintf(err, errlen, "--exclude %s leaves no host of %s to run on", list, a->hostfile);
		return -1;
	}
	a->nhosts = kept;
	return 0;
}

/* One IPv4 address of a host at its hpud port (same_hpud). */
typedef struct endpoint {
	uint32_t addr; /* network order */
	int port, host;
} endpoint;

static int endpoint_cmp(const void *x, const void *y)
{
	const endpoint *p = x, *q = y;
	if (p->addr != q->addr)
		return p->addr < q->addr ? -1 : 1;
	if (p->port != q->port)
		return p->port < q->port ? -1 : 1;
	return (p->host > q->host) - (p->host < q->host);
}

/* "name" or "name:port", as the hostfile's line wrote it. */
static void as_written(const hpu_host *h, char *out, size_t len)
{
	if (h->port)
		snprintf(out, len, "%s:%d", h->name, h->port);
	else
		snprintf(out, len, "%s", h->name);
}

/* Refuses two hosts of the hostfile that are one hpud: the same port
 * (default_port where a line gives none) and an IPv4 address in common
 * (getaddrinfo: "localhost" is 127.0.0.1). A name that does not resolve
 * is left to the submitter, which refuses it. Before the default port is
 * set in a->hosts, so that the lines are named as written. */
static int same_hpud(const hpu_launch_args *a, int default_port, char *err, size_t errlen)
{
	enum { PER_HOST = 16 };
	endpoint *e = malloc((size_t)a->nhosts * PER_HOST * sizeof *e);
	size_t n = 0;
	if (!e) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (int i = 0; i < a->nhosts; i++) {
		struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
		if (getaddrinfo(a->hosts[i].name, NULL, &hints, &ai) != 0)
			continue;
		int k = 0;
		for (struct addrinfo *p = ai; p && k < PER_HOST; p = p->ai_next, k++) {
			e[n].addr = ((const struct sockaddr_in *)p->ai_addr)->sin_addr.s_addr;
			e[n].port = a->hosts[i].port ? a->hosts[i].port : default_port;
			e[n++].host = i;
		}
		freeaddrinfo(ai);
	}
	qsort(e, n, sizeof *e, endpoint_cmp);
	/* sorted by address, port, then host: of the pairs found, the one
	 * whose later line comes first */
	int first = -1, later = -1;
	uint32_t addr = 0;
	for (size_t k = 1; k < n; k++)
		if (e[k].addr == e[k - 1].addr && e[k].port == e[k - 1].port &&
		    e[k].host != e[k - 1].host && (later < 0 || e[k].host < later)) {
			first = e[k - 1].host;
			later = e[k].host;
			addr = e[k].addr;
		}
	free(e);
	if (later < 0)
		return 0;
	const hpu_host *h = &a->hosts[later], *f = &a->hosts[first];
	char was[300], fwas[300], ip[INET_ADDRSTRLEN];
	as_written(h, was, sizeof was);
	as_written(f, fwas, sizeof fwas);
	inet_ntop(AF_INET, &addr, ip, sizeof ip);
	snprintf(err, errlen, "%s:%d: duplicate host %s: the same hpud as line %d's %s (%s:%d)",
		 a->hostfile, h->line, was, f->line, fwas, ip, h->port ? h->port : default_port);
	return -1;
}

/* --hostfile: the nodes, devices and master address follow from the file. */
int hpu__args_hostfile_plan(hpu_launch_args *a, const sources *src, char *err, size_t errlen)
{
	static const struct {
		unsigned set;
		const char *flag;
	} no[] = {{SET_NODES, "--nodes"}, {SET_RANK, "--node-rank"},
		  {SET_ADDR, "--master-addr"}};
	for (size_t k = 0; k < sizeof no / sizeof no[0]; k++)
		if (src->flag & no[k].set) {
			snprintf(err, errlen, "%s does not go with --hostfile: the hostfile gives the nodes, and node 0 is its first host",
				 no[k].flag);
			return -1;
		}
	if (hpu__hostfile_read(a->hostfile, &a->hosts, &a->nhosts, err, errlen) < 0 ||
	    same_hpud(a, a->hpud_port, err, errlen) < 0)
		return -1;
	if (filter_hosts(a, err, errlen) < 0 || hostfile_devices(a, src, err, errlen) < 0)
		return -1;
	for (int i = 0; i < a->nhosts; i++)
		if (!a->hosts[i].port)
			a->hosts[i].port = a->hpud_port;
	a->nodes = a->nhosts;
	a->node_rank = 0; /* this launcher drives them all; NODE_RANK is moot */
	if (!(src->env & SET_ADDR))
		snprintf(a->master_addr, sizeof a->master_addr, "%s", a->hosts[0].name);
	/* master_port 0: node 0's hpud picks a free port for the coordinator
	 * and says which; the others get it from the submitter. */
	return 0;
}
