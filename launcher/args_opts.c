/* args_opts: hpulaunch's own options and the environment variables that
 * stand for them, read into the launch arguments. */
#include "launcher/args_impl.h"
#include "common/env.h"
#include "common/log.h"
#include "common/num.h"
#include "agent/restart.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A number of seconds above 0 ("inf": no limit). */
static int to_seconds(const char *s, double *out)
{
	return hpu__parse_double(s, DBL_TRUE_MIN, INFINITY, out);
}

/* "HOST[:PORT]" for --status. */
static int status_target(hpu_launch_args *a, const char *v)
{
	const char *colon = strchr(v, ':');
	size_t n = colon ? (size_t)(colon - v) : strlen(v);
	if (n == 0 || n > 255 || (colon && strchr(colon + 1, ':')))
		return -1;
	if (colon && hpu__parse_int(colon + 1, 1, 65535, &a->status_port))
		return -1;
	free(a->status_host);
	a->status_host = strndup(v, n);
	return a->status_host ? 0 : -1;
}

/* --devices D|auto, and torchrun's --nproc-per-node, which also takes
 * "cpu" (one worker per CPU core, whatever --device), "gpu" (one per GPU,
 * on --device cuda) and its own "auto" (the GPUs where there are some,
 * else the cores); DeepSpeed's --num_gpus takes a number, auto or cpu. auto counts the cores here; after the command line,
 * hpu__args_auto_devices counts GPUs instead where the workers compute on them.
 * Returns 0, or -1 with a sentence in err. */
static int devices_opt(hpu_launch_args *a, sources *src, const char *name,
		       const char *v, char *err, size_t errlen)
{
	int torchrun = strcmp(name, "devices") != 0, nproc = !strncmp(name, "nproc", 5);
	src->flag &= ~(unsigned)(SET_DEVICES_AUTO | SET_DEVICES_CORES | SET_DEVICES_GPU |
				 SET_DEVICES_TORCH);
	if (torchrun && !nproc && (!strcmp(v, "gpu") || !strcmp(v, "xpu"))) {
		snprintf(err, errlen, "--%s %s: give a number of workers (one per GPU: --devices auto --device cuda)",
			 name, v);
		return -1;
	}
	if (!strcmp(v, "auto") || (torchrun && (!strcmp(v, "cpu") || !strcmp(v, "gpu")))) {
		a->devices = (int)sysconf(_SC_NPROCESSORS_ONLN);
		src->flag |= SET_DEVICES | SET_DEVICES_AUTO;
		src->flag |= !strcmp(v, "cpu")	  ? SET_DEVICES_CORES
			     : !strcmp(v, "gpu") ? SET_DEVICES_GPU
			     : nproc		  ? SET_DEVICES_TORCH
						  : 0;
		return 0;
	}
	if (torchrun && !strcmp(v, "xpu")) {
		snprintf(err, errlen, "--%s xpu: hpulaunch has no XPU device; give a number, gpu (one worker per GPU), auto or cpu (one per core)",
			 name);
		return -1;
	}
	if (hpu__parse_int(v, 1, 1024, &a->devices)) {
		snprintf(err, errlen, "--%s takes a number of workers from 1 to 1024%s, not '%s'", name,
			 nproc ? ", gpu, auto or cpu" : torchrun ? ", auto or cpu" : " or auto", v);
		return -1;
	}
	src->flag |= SET_DEVICES;
	return 0;
}

/* torchrun's --nnodes N, or MIN:MAX with MIN = MAX (hpulaunch's jobs do
 * not grow or shrink). */
static int nnodes_opt(hpu_launch_args *a, sources *src, const char *v, char *err,
		      size_t errlen)
{
	const char *colon = strchr(v, ':');
	int lo, hi;
	if (!colon) {
		lo = hi = -1;
		if (hpu__parse_int(v, 1, 4096, &lo) == 0)
			hi = lo;
	} else {
		char first[16];
		size_t n = (size_t)(colon - v);
		snprintf(first, sizeof first, "%.*s", (int)(n < sizeof first ? n : sizeof first - 1), v);
		if (n >= sizeof first || hpu__parse_int(first, 1, 4096, &lo) ||
		    hpu__parse_int(colon + 1, 1, 4096, &hi))
			lo = hi = -1;
	}
	if (lo < 0) {
		snprintf(err, errlen, "--nnodes takes a number of nodes from 1 to 4096 (or N:N), not '%s'", v);
		return -1;
	}
	if (lo != hi) {
		snprintf(err, errlen, "--nnodes %s: hpulaunch has no elastic range of nodes; give one number (--nnodes %d)",
			 v, hi);
		return -1;
	}
	a->nodes = lo;
	src->flag |= SET_NODES;
	return 0;
}

/* torchrun's --rdzv-endpoint HOST:PORT: node 0's address and the
 * coordinator's port. "[ADDR]:PORT" is read as an IPv6 address and
 * refused: the coordinator and the workers speak IPv4. */
static int rdzv_endpoint_opt(hpu_launch_args *a, sources *src, const char *v, char *err,
			     size_t errlen)
{
	const char *host = v, *colon = strrchr(v, ':');
	size_t n = colon ? (size_t)(colon - v) : 0;
	if (v[0] == '[' || (colon && memchr(v, ':', n))) {
		snprintf(err, errlen, "--rdzv-endpoint %s: an IPv6 address; hpulaunch speaks IPv4 only: give HOST:PORT with an IPv4 address or a name",
			 v);
		return -1;
	}
	if (!colon || n == 0 || n >= sizeof a->master_addr ||
	    hpu__parse_int(colon + 1, 1, 65535, &a->master_port)) {
		snprintf(err, errlen, "--rdzv-endpoint takes HOST:PORT (node 0's address and a port from 1 to 65535), not '%s'",
			 v);
		return -1;
	}
	snprintf(a->master_addr, sizeof a->master_addr, "%.*s", (int)n, host);
	src->flag |= SET_ADDR | SET_PORT;
	return 0;
}

/* Sets the launcher option p has read (id k, a value option or --quiet);
 * returns 0, or -1 with a sentence in err. */
static int set_opt(hpu_launch_args *a, sources *src, const hpu_optparse *p, int k, char *err,
		   size_t errlen)
{
	static const unsigned sets[] = {SET_NODES, SET_DEVICES, SET_RANK,
					SET_ADDR, SET_PORT, SET_JOB_ID};
	const char *v = p->val;
	int bad = 0;
	switch (k) {
	case O_QUIET: a->quiet = 1; break;
	case O_NODES: bad = hpu__parse_int(v, 1, 4096, &a->nodes); break;
	case O_DEVICES:
	case O_NPROC_PER_NODE:
		return devices_opt(a, src, p->spec->name, v, err, errlen);
	case O_NNODES: return nnodes_opt(a, src, v, err, errlen);
	case O_RDZV_ENDPOINT: return rdzv_endpoint_opt(a, src, v, err, errlen);
	case O_STANDALONE: a->standalone = 1; return 0;
	case O_NODE_RANK: bad = hpu__parse_int(v, 0, 4095, &a->node_rank); break;
	case O_MASTER_ADDR:
		if (strchr(v, ':') && strchr(v, ':') == strrchr(v, ':')) { /* HOST:PORT */
			snprintf(err, errlen, "--master-addr %s: give the address alone, and the port "
					      "with --master-port (or both as --rdzv-endpoint HOST:PORT)", v);
			return -1;
		}
		if (strchr(v, ':')) { /* as --rdzv-endpoint's (it said "cannot resolve", exit 1) */
			snprintf(err, errlen, "--master-addr %s: an IPv6 address; hpulaunch speaks IPv4 "
					      "only: give an IPv4 address or a name", v);
			return -1;
		}
		bad = snprintf(a->master_addr, sizeof a->master_addr, "%s", v) >= (int)sizeof a->master_addr || !*v;
		break;
	case O_MASTER_PORT: bad = hpu__parse_int(v, 1, 65535, &a->master_port); break;
	case O_JOB_ID:
		bad = snprintf(a->job_id, sizeof a->job_id, "%s", v) >= (int)sizeof a->job_id || !*v;
		if (bad && *v) { /* why, where it only said "bad value" */
			snprintf(err, errlen, "--job-id: '%.80s%s' is %zu characters, more than the %zu a job id may have",
				 v, strlen(v) > 80 ? "..." : "", strlen(v), sizeof a->job_id - 1);
			return -1;
		}
		break;
	case O_LOG_DIR: /* "" said "cannot make the log directory : ..." */
		a->log_dir = v;
		bad = !*v;
		break;
	case O_JOIN_TIMEOUT: bad = to_seconds(v, &a->join_timeout_s); break;
	case O_TRANSPORT:
		bad = strcmp(v, "auto") && strcmp(v, "tcp") && strcmp(v, "ipc") && strcmp(v, "shm");
		a->transport = v;
		break;
	case O_HOSTFILE: bad = !*v; a->hostfile = v; break;
	case O_INCLUDE: bad = !*v; a->include = v; break;
	case O_EXCLUDE: bad = !*v; a->exclude = v; break;
	case O_STATUS: bad = status_target(a, v); break;
	case O_HPUD_PORT: bad = hpu__parse_int(v, 1, 65535, &a->hpud_port); break;
	case O_KEY: bad = !*v; a->key_path = v; break;
	case O_MAX_RESTARTS:
		if (hpu__parse_int(v, 0, HPU_MAX_RESTARTS_LIMIT, &a->max_restarts)) {
			snprintf(err, errlen, "--max-restarts takes a whole number of restarts from 0 to %d, not '%s'",
				 HPU_MAX_RESTARTS_LIMIT, v);
			return -1;
		}
		break;
	case O_PROGRESS:
		if (hpu__progress_mode_parse(v, &a->progress)) {
			snprintf(err, errlen, "--progress takes auto, always or never, not '%s'", v);
			return -1;
		}
		break;
	case O_DATA_PLANE: a->data_plane = v; break;
	case O_LOG_LEVEL: {
		hpu_log_level lvl;
		if (hpu__log_parse_level(v, "--log-level", &lvl, err, errlen) < 0)
			return -1;
		a->log_level = v;
		break;
	}
	}
	if (bad) {
		snprintf(err, errlen, "bad value '%s' for --%s", v, p->spec->name);
		return -1;
	}
	if (k <= O_JOB_ID)
		src->flag |= sets[k - O_NODES];
	return 0;
}

int hpu__args_from_env(hpu_launch_args *a, sources *src, char *err, size_t errlen)
{
	const char *v;
	/* bad ones are noted, not refused yet: a flag (or --standalone)
	 * that sets the same wins over the environment */
	if ((v = hpu__env_str(HPU_ENV_MASTER_ADDR)) && *v) {
		if (strlen(v) >= sizeof a->master_addr)
			src->bad_addr = v; /* it was cut short in silence */
		else {
			snprintf(a->master_addr, sizeof a->master_addr, "%s", v);
			src->env |= SET_ADDR;
		}
	}
	if ((v = hpu__env_str(HPU_ENV_MASTER_PORT)) && *v) {
		if (hpu__parse_int(v, 1, 65535, &a->master_port)) {
			a->master_port = 0;
			src->bad_port = v;
		} else {
			src->env |= SET_PORT;
		}
	}
	if ((v = hpu__env_str(HPU_ENV_NODE_RANK)) && *v) {
		if (hpu__parse_int(v, 0, 4095, &a->node_rank)) {
			a->node_rank = 0;
			src->bad_rank = v;
		} else {
			src->env |= SET_RANK;
		}
	}
	if ((v = hpu__env_str(HPU_ENV_HPU_JOB_ID)) && *v) {
		if (strlen(v) >= sizeof a->job_id) { /* it was cut short in silence */
			src->bad_job = v;
		} else {
			snprintf(a->job_id, sizeof a->job_id, "%s", v);
			src->env |= SET_JOB_ID;
		}
	}
	/* libhpucoll's own: refused here, before any worker starts (a
	 * timeout of 0 or less would be a wait without end) */
	static const struct {
		hpu_env_id id;
		int lo;
	} ms[] = {{HPU_ENV_HPUCOLL_TIMEOUT_MS, 1},
		  {HPU_ENV_HPUCOLL_STALL_WARN_MS, 0},
		  {HPU_ENV_HPUCOLL_HEARTBEAT_MS, 2000},
		  {HPU_ENV_HPU_JOIN_TIMEOUT_MS, 1}}; /* its default was taken in silence */
	for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
		int x;
		if ((v = hpu__env_str(ms[i].id)) && *v && hpu__parse_int(v, ms[i].lo, INT_MAX, &x)) {
			snprintf(err, errlen, "%s='%s' is not a whole number of milliseconds from %d",
				 hpu__env_name(ms[i].id), v, ms[i].lo);
			return -1;
		}
	}
	/* the algorithm and the small-message thresholds libhpucoll reads
	 * (collectives/algo.c): a bad one stopped every worker at start-up,
	 * its name inside a socket error */
	if ((v = hpu__env_str(HPU_ENV_HPUCOLL_ALGO)) && *v && strcmp(v, "auto") &&
	    strcmp(v, "ring") && strcmp(v, "rd") && strcmp(v, "hier")) {
		snprintf(err, errlen, "HPUCOLL_ALGO='%s' is not one of auto, ring, rd, hier", v);
		return -1;
	}
	static const hpu_env_id sizes[] = {HPU_ENV_HPUCOLL_SMALL_BYTES, HPU_ENV_HPUCOLL_BCAST_SMALL_BYTES,
					   HPU_ENV_HPUCOLL_REDUCE_SMALL_BYTES};
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		uint64_t x;
		if ((v = hpu__env_str(sizes[i])) && *v && hpu__parse_u64(v, 0, SIZE_MAX, &x) != HPU_NUM_OK) {
			snprintf(err, errlen, "%s='%s' is not a number of bytes", hpu__env_name(sizes[i]), v);
			return -1;
		}
	}
	/* ZeroMQ's I/O threads (collectives/transport_zmq.c's range): a bad
	 * count stopped every worker, said inside a socket error */
	int io;
	if ((v = hpu__env_str(HPU_ENV_HPUCOLL_IO_THREADS)) && *v && hpu__parse_int(v, 1, 64, &io)) {
		snprintf(err, errlen, "HPUCOLL_IO_THREADS='%s' is not a whole number of threads from 1 to 64",
			 v);
		return -1;
	}
	/* the workers' OpenMP (libgomp said "Invalid value" under [rank 0]
	 * and went on with its default): a count, or a list of them */
	if ((v = hpu__env_str(HPU_ENV_OMP_NUM_THREADS)) && *v &&
	    (strspn(v, "0123456789,") != strlen(v) || v[0] == ',' || strstr(v, ",,") ||
	     v[strlen(v) - 1] == ',' || v[strspn(v, "0,")] == 0)) {
		snprintf(err, errlen, "OMP_NUM_THREADS='%.40s' is not a number of threads (or a list "
				      "of them, 4,2)", v);
		return -1;
	}
	if ((v = hpu__env_str(HPU_ENV_HPUCOLL_TRANSPORT)) && *v)
		a->transport = v;
	if ((v = hpu__env_str(HPU_ENV_HPUCOLL_SECURITY)) && *v)
		a->data_plane = v;
	if ((v = hpu__env_str(HPU_ENV_HPU_JOB_TOKEN)) && *v) {
		snprintf(a->token, sizeof a->token, "%s", v);
		src->env |= SET_TOKEN;
	}
	if ((v = hpu__env_str(HPU_ENV_HPU_KEY_FILE)) && *v)
		a->key_path = v;
	return 0;
}

/* The settings of A_* option k gives, as a mask of 1 << A_*. */
static unsigned settings_of(int k)
{
	switch (k) {
	case O_NODES:
	case O_NNODES: return 1u << A_NODES;
	case O_DEVICES:
	case O_NPROC_PER_NODE: return 1u << A_DEVICES;
	case O_NODE_RANK: return 1u << A_RANK;
	case O_MASTER_ADDR: return 1u << A_ADDR;
	case O_MASTER_PORT: return 1u << A_PORT;
	case O_RDZV_ENDPOINT: return 1u << A_ADDR | 1u << A_PORT;
	case O_JOB_ID: return 1u << A_JOB;
	case O_MAX_RESTARTS: return 1u << A_RESTARTS;
	}
	return 0;
}

/* Setting g as it stands, as text to compare. */
static void setting_text(const hpu_launch_args *a, const sources *src, int g, char *t, size_t n)
{
	unsigned how = src->flag & (SET_DEVICES_AUTO | SET_DEVICES_CORES | SET_DEVICES_GPU |
				    SET_DEVICES_TORCH);
	switch (g) {
	case A_NODES: snprintf(t, n, "%d", a->nodes); break;
	case A_DEVICES: snprintf(t, n, "%d/%x", a->devices, how); break;
	case A_RANK: snprintf(t, n, "%d", a->node_rank); break;
	case A_ADDR: snprintf(t, n, "%s", a->master_addr); break;
	case A_PORT: snprintf(t, n, "%d", a->master_port); break;
	case A_JOB: snprintf(t, n, "%s", a->job_id); break;
	default: snprintf(t, n, "%d", a->max_restarts); break;
	}
}

/* Whether a and b are one name, '-' and '_' alike (torchrun's
 * --nproc_per_node is its --nproc-per-node). */
static int same_name(const char *a, const char *b)
{
	for (; *a && *b; a++, b++)
		if (*a != *b && !((*a == '-' || *a == '_') && (*b == '-' || *b == '_')))
			return 0;
	return *a == *b;
}

/* Sets option k, refusing two names of one setting with two values
 * (--devices 2 --nproc-per-node 4 took the last, whichever a wrapper or
 * the user wrote last); one name given twice takes its last value. */
int hpu__args_opt(hpu_launch_args *a, sources *src, const hpu_optparse *p, int k, char *err,
		  size_t errlen)
{
	unsigned gs = settings_of(k);
	char was[A_COUNT][300], now[300];
	for (int g = 0; g < A_COUNT; g++)
		if (gs >> g & 1)
			setting_text(a, src, g, was[g], sizeof was[g]);
	if (set_opt(a, src, p, k, err, errlen) < 0)
		return -1;
	const char *name = p->spec->name;
	for (int g = 0; g < A_COUNT; g++) {
		if (!(gs >> g & 1))
			continue;
		setting_text(a, src, g, now, sizeof now);
		if (src->by[g] && !same_name(src->by[g], name) && strcmp(was[g], now) != 0) {
			/* one word that the two names read two ways (hpulaunch's
			 * auto and torchrun's) */
			snprintf(err, errlen,
				 strcmp(src->as[g], p->val)
					 ? "--%s %s and --%s %s give one setting two values: give one"
					 : "--%s %s and --%s %s do not mean the same here (see --help): "
					   "give one",
				 src->by[g], src->as[g], name, p->val);
			return -1;
		}
		src->by[g] = name;
		src->as[g] = p->val;
	}
	return 0;
}
