#include "launcher/slurm.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/hex.h"
#include "common/num.h"

/* Step ids from here up are Slurm's special steps (batch script, extern,
 * interactive, pending), not one started by srun. */
#define SLURM_SPECIAL_STEPS 0xfffffff0UL

typedef struct hostvec {
	char **v;
	int n, cap;
} hostvec;

static int push(hostvec *hv, const char *name, size_t len, char *err,
		size_t errlen)
{
	if (hv->n == HPU_SLURM_MAX_HOSTS) {
		snprintf(err, errlen, "the hostlist names more than %d hosts",
			 HPU_SLURM_MAX_HOSTS);
		return -1;
	}
	if (hv->n == hv->cap) {
		int cap = hv->cap ? 2 * hv->cap : 16;
		char **grown = realloc(hv->v, (size_t)cap * sizeof *grown);
		if (!grown)
			goto oom;
		hv->v = grown;
		hv->cap = cap;
	}
	char *s = malloc(len + 1);
	if (!s)
		goto oom;
	memcpy(s, name, len);
	s[len] = 0;
	hv->v[hv->n++] = s;
	return 0;
oom:
	snprintf(err, errlen, "out of memory expanding the hostlist");
	return -1;
}

/* One number of a range: digits only, at most 9 of them. */
static int range_number(const char **p, const char *end, unsigned long *v,
			int *width)
{
	const char *s = *p;
	*v = 0;
	while (*p < end && isdigit((unsigned char)**p) && *p - s < 9)
		*v = *v * 10 + (unsigned long)(*(*p)++ - '0');
	*width = (int)(*p - s);
	return *width > 0 && !(*p < end && isdigit((unsigned char)**p)) ? 0 : -1;
}

/* Appends every host of expr[0, len) (one host expression, no top-level
 * commas, brackets balanced), each prefixed with prefix[0, plen), to hv. */
static int expand_expr(const char *expr, size_t len, char *prefix,
		       size_t plen, size_t pcap, hostvec *hv, char *err,
		       size_t errlen)
{
	const char *lb = memchr(expr, '[', len);
	size_t lit = lb ? (size_t)(lb - expr) : len;
	if (plen + lit >= pcap) {
		snprintf(err, errlen, "a host name in the hostlist is longer than %d characters",
			 (int)pcap - 1);
		return -1;
	}
	memcpy(prefix + plen, expr, lit);
	plen += lit;
	if (!lb)
		return push(hv, prefix, plen, err, errlen);
	const char *rb = memchr(lb, ']', len - lit);
	const char *nested = memchr(lb + 1, '[', rb ? (size_t)(rb - lb - 1) : len - lit - 1);
	if (!rb || nested) {
		snprintf(err, errlen, "unbalanced '[' in the hostlist");
		return -1;
	}
	const char *rest = rb + 1;
	size_t restlen = len - (size_t)(rest - expr);
	const char *p = lb + 1;
	for (;;) {
		unsigned long lo, hi;
		int width, w2;
		if (range_number(&p, rb, &lo, &width) < 0)
			goto bad;
		hi = lo;
		if (p < rb && *p == '-') {
			p++;
			if (range_number(&p, rb, &hi, &w2) < 0 || hi < lo)
				goto bad;
		}
		if (hi - lo >= HPU_SLURM_MAX_HOSTS) {
			snprintf(err, errlen, "the hostlist names more than %d hosts",
				 HPU_SLURM_MAX_HOSTS);
			return -1;
		}
		for (unsigned long v = lo; v <= hi; v++) {
			char num[24];
			int k = snprintf(num, sizeof num, "%0*lu", width, v);
			if (plen + (size_t)k >= pcap) {
				snprintf(err, errlen, "a host name in the hostlist is longer than %d characters",
					 (int)pcap - 1);
				return -1;
			}
			memcpy(prefix + plen, num, (size_t)k);
			if (expand_expr(rest, restlen, prefix, plen + (size_t)k,
					pcap, hv, err, errlen) < 0)
				return -1;
		}
		if (p == rb)
			return 0;
		if (*p++ != ',')
			goto bad;
	}
bad:
	snprintf(err, errlen, "bad range '[%.*s]' in the hostlist (expected numbers like [1-4,7] or [01-16])",
		 (int)(rb - lb - 1), lb + 1);
	return -1;
}

int hpu__slurm_hostlist_expand(const char *list, char ***hosts, int *n,
			       char *err, size_t errlen)
{
	hostvec hv = {0};
	char prefix[256];
	const char *p = list;
	*hosts = NULL;
	*n = 0;
	for (;;) {
		while (*p == ',' || isspace((unsigned char)*p))
			p++;
		if (!*p)
			break;
		/* One host expression: up to a comma or space outside brackets. */
		const char *s = p;
		int depth = 0;
		while (*p && (depth || (*p != ',' && !isspace((unsigned char)*p)))) {
			if (*p == '[')
				depth++;
			else if (*p == ']')
				depth--;
			if (depth < 0)
				break;
			p++;
		}
		if (depth) {
			snprintf(err, errlen, "unbalanced '%c' in the hostlist '%s'",
				 depth > 0 ? '[' : ']', list);
			goto fail;
		}
		if (expand_expr(s, (size_t)(p - s), prefix, 0, sizeof prefix,
				&hv, err, errlen) < 0)
			goto fail;
	}
	if (hv.n == 0) {
		snprintf(err, errlen, "the hostlist '%s' names no hosts", list);
		goto fail;
	}
	*hosts = hv.v;
	*n = hv.n;
	return 0;
fail:
	hpu__slurm_hostlist_free(hv.v, hv.n);
	return -1;
}

void hpu__slurm_hostlist_free(char **hosts, int n)
{
	if (!hosts)
		return;
	for (int i = 0; i < n; i++)
		free(hosts[i]);
	free(hosts);
}

int hpu__slurm_master_port(long job_id)
{
	return 20000 + (int)(job_id % 20000);
}

void hpu__slurm_token(long job_id, char out[65])
{
	char msg[64];
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;
	int len = snprintf(msg, sizeof msg, "hputrain-slurm-%ld", job_id);
	if (EVP_Digest(msg, (size_t)len, md, &mdlen, EVP_sha256(), NULL) != 1 ||
	    mdlen != 32)
		abort(); /* SHA-256 is always there */
	hpu__hex(out, md, 32);
}

/* A list of variables for first_env. */
#define IDS(...) ((const hpu_env_id[]){__VA_ARGS__, HPU_ENV_COUNT})

/* The first of the variables ids (ended by HPU_ENV_COUNT) that is set and
 * not empty, or NULL; *which gets its name (the last one's when none is). */
static const char *first_env(const hpu_env_id *ids, const char **which)
{
	for (; *ids != HPU_ENV_COUNT; ids++) {
		const char *v = hpu__env_str(*ids);
		if (v && *v) {
			*which = hpu__env_name(*ids);
			return v;
		}
	}
	*which = hpu__env_name(ids[-1]);
	return NULL;
}

/* Reads a whole number lo..hi from the first set variable of names into
 * *out; unset leaves *out alone. Returns 1 if set, 0 if not, -1 if bad. */
static int env_num(const hpu_env_id *ids, long lo, long hi, long *out,
		   char *err, size_t errlen)
{
	const char *name, *v = first_env(ids, &name);
	if (!v)
		return 0;
	if (hpu__parse_long(v, lo, hi, out)) {
		snprintf(err, errlen, "%s='%s' from Slurm is not a number %ld..%ld",
			 name, v, lo, hi);
		return -1;
	}
	return 1;
}

/* Whether this process runs in a job step that srun started. */
static int in_srun_step(void)
{
	const char *name, *v = first_env(IDS(HPU_ENV_SLURM_STEP_ID, HPU_ENV_SLURM_STEPID), &name);
	if (!v)
		return 0;
	uint64_t id;
	return hpu__parse_u64(v, 0, SLURM_SPECIAL_STEPS - 1, &id) == HPU_NUM_OK;
}

int hpu__slurm_read(hpu_slurm *s, char *err, size_t errlen)
{
	long v;
	memset(s, 0, sizeof *s);
	s->nodeid = -1;
	const char *name;
	if (!first_env(IDS(HPU_ENV_SLURM_JOB_ID, HPU_ENV_SLURM_JOBID), &name) || !in_srun_step())
		return 0;
	s->present = 1;
	if (env_num(IDS(HPU_ENV_SLURM_JOB_ID, HPU_ENV_SLURM_JOBID), 1, 4294967295L, &s->job_id, err, errlen) < 0 ||
	    env_num(IDS(HPU_ENV_SLURM_STEP_ID, HPU_ENV_SLURM_STEPID), 0, 0x7fffffffL, &v, err, errlen) < 0)
		return -1;
	s->step_id = (int)v;
	int r = env_num(IDS(HPU_ENV_SLURM_PROCID), 0, 1 << 24, &v, err, errlen);
	if (r <= 0) {
		if (r == 0)
			snprintf(err, errlen, "SLURM_PROCID is not set in Slurm job step %ld.%d",
				 s->job_id, s->step_id);
		return -1;
	}
	s->procid = (int)v;
	if ((r = env_num(IDS(HPU_ENV_SLURM_NODEID), 0, 1 << 24, &v, err, errlen)) < 0)
		return -1;
	if (r)
		s->nodeid = (int)v;
	if ((r = env_num(IDS(HPU_ENV_SLURM_STEP_NUM_TASKS, HPU_ENV_SLURM_NTASKS), 1, 1 << 24, &v, err, errlen)) < 0)
		return -1;
	if (r)
		s->ntasks = (int)v;
	if ((r = env_num(IDS(HPU_ENV_SLURM_STEP_NUM_NODES, HPU_ENV_SLURM_NNODES), 1, 1 << 24, &v, err, errlen)) < 0)
		return -1;
	if (r)
		s->nnodes = (int)v;
	/* Node ids index the step's node list, which may be a part of the
	 * job's (salloc -N4, then srun -N2). */
	const char *list = first_env(IDS(HPU_ENV_SLURM_STEP_NODELIST, HPU_ENV_SLURM_JOB_NODELIST,
				  HPU_ENV_SLURM_NODELIST), &name);
	if (!list) {
		snprintf(err, errlen, "SLURM_JOB_NODELIST is not set in Slurm job step %ld.%d",
			 s->job_id, s->step_id);
		return -1;
	}
	char **hosts, e[200];
	int n;
	if (hpu__slurm_hostlist_expand(list, &hosts, &n, e, sizeof e) < 0) {
		snprintf(err, errlen, "%s='%s': %s", name, list, e);
		return -1;
	}
	snprintf(s->first_host, sizeof s->first_host, "%s", hosts[0]);
	hpu__slurm_hostlist_free(hosts, n);
	if (!s->nnodes)
		s->nnodes = n;
	return 0;
}
