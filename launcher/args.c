#include "launcher/args.h"
#include "common/env.h"
#include "common/hex.h"
#include "common/log.h"
#include "common/num.h"
#include "common/opt.h"
#include "common/optdoc.h"
#include "agent/restart.h"
#include "agent/gpus.h"
#include "launcher/modelcheck.h"
#include "launcher/slurm.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A number of seconds above 0 ("inf": no limit). */
static int to_seconds(const char *s, double *out)
{
	return hpu__parse_double(s, DBL_TRUE_MIN, INFINITY, out);
}

static void random_hex(char *out, size_t bytes)
{
	unsigned char b[64];
	if (bytes > sizeof b)
		bytes = sizeof b;
	if (RAND_bytes(b, (int)bytes) != 1) {
		/* Should not happen; fall back to the kernel. */
		FILE *f = fopen("/dev/urandom", "rb");
		if (!f || fread(b, 1, bytes, f) != bytes)
			abort();
		fclose(f);
	}
	hpu__hex(out, b, bytes);
}

/* The hpu-worker next to this executable, or $HPU_WORKER. */
static int worker_path(char *out, size_t outlen)
{
	const char *env = hpu__env_str(HPU_ENV_HPU_WORKER);
	if (env && *env)
		return snprintf(out, outlen, "%s", env) < (int)outlen ? 0 : -1;
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		return -1;
	self[n] = 0;
	char *slash = strrchr(self, '/');
	if (!slash)
		return -1;
	*slash = 0;
	return snprintf(out, outlen, "%s/hpu-worker", self) < (int)outlen ? 0 : -1;
}

/* Which settings came from a flag and which from the environment, so that
 * Slurm and --hostfile fill in only the rest. */
enum {
	SET_NODES = 1 << 0,
	SET_DEVICES = 1 << 1,
	SET_RANK = 1 << 2,
	SET_ADDR = 1 << 3,
	SET_PORT = 1 << 4,
	SET_JOB_ID = 1 << 5,
	SET_TOKEN = 1 << 6,
	SET_DEVICES_AUTO = 1 << 7,
	SET_DEVICES_CORES = 1 << 8, /* torchrun's --nproc-per-node cpu: cores, not GPUs */
	SET_DEVICES_GPU = 1 << 9,   /* torchrun's gpu: the GPUs, on --device cuda */
	SET_DEVICES_TORCH = 1 << 10, /* torchrun's auto: the GPUs where there are some */
};

typedef struct sources {
	unsigned flag, env;
} sources;

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

/* hpulaunch's own options; the training options follow them
 * (hpu__opts_specs, ids from HPU_OPTS_ID on). The first six are the
 * settings of sources. */
enum {
	O_NODES = 1, O_DEVICES, O_NODE_RANK, O_MASTER_ADDR, O_MASTER_PORT,
	O_JOB_ID, O_LOG_DIR, O_JOIN_TIMEOUT, O_TRANSPORT, O_HOSTFILE, O_STATUS,
	O_HPUD_PORT, O_KEY, O_MAX_RESTARTS, O_PROGRESS, O_DATA_PLANE, O_QUIET, O_LOG_LEVEL,
	O_HELP, O_HELP_ENV, O_HELP_DOC, O_EXEC,
	/* torchrun's spellings that are more than another name: */
	O_NNODES, O_NPROC_PER_NODE, O_STANDALONE, O_RDZV_ENDPOINT,
	/* DeepSpeed's */
	O_INCLUDE, O_EXCLUDE,
};

/* The parser's table and the help's (--help, man/hpulaunch.1,
 * docs/reference/hpulaunch.md): an entry without help is another name of
 * the option of its id above it. */
static const hpu_optspec launcher_specs[] = {
	{"nodes", 0, HPU_OPT_VALUE, O_NODES, "N", .help = "nodes in the job (1)",
	 .section = "Options (environment variables in brackets; flags win)"},
	{"devices", 0, HPU_OPT_VALUE, O_DEVICES, "D|auto",
	 .help = "workers on this node (1; auto: one per GPU with --device cuda, or auto where a GPU is "
		 "visible; else one per CPU core)"},
	{"node-rank", 0, HPU_OPT_VALUE, O_NODE_RANK, "R", .help = "this node's rank, 0..N-1 (0)", .env = "NODE_RANK"},
	{"master-addr", 0, HPU_OPT_VALUE, O_MASTER_ADDR, "A", .help = "node 0's address (127.0.0.1)", .env = "MASTER_ADDR"},
	{"master-port", 0, HPU_OPT_VALUE, O_MASTER_PORT, "P", .help = "coordinator port on node 0 (single node: a free port)",
	 .env = "MASTER_PORT"},
	{"job-id", 0, HPU_OPT_VALUE, O_JOB_ID, "ID", .help = "job id; the job token comes from HPU_JOB_TOKEN (required with --nodes > 1)",
	 .env = "HPU_JOB_ID"},
	{"log-dir", 0, HPU_OPT_VALUE, O_LOG_DIR, "DIR", .help = "also write each rank's output to DIR/rank_N.log"},
	{"transport", 0, HPU_OPT_VALUE, O_TRANSPORT, "T",
	 .help = "auto | tcp | ipc | shm: how ranks reach each other (auto: shared memory within a node, TCP between)",
	 .env = "HPUCOLL_TRANSPORT"},
	{"data-plane", 0, HPU_OPT_VALUE, O_DATA_PLANE, "M",
	 .help = "auth | encrypt | none: who may connect to a worker's data socket (auth: only the job's ranks, "
		 "proven at connect; encrypt: also encrypted, CURVE; none: anyone) (auth)",
	 .env = "HPUCOLL_SECURITY"},
	{"join-timeout", 0, HPU_OPT_VALUE, O_JOIN_TIMEOUT, "S", .help = "seconds for every rank to join (300)"},
	{"max-restarts", 0, HPU_OPT_VALUE, O_MAX_RESTARTS, "K",
	 .help = "when a worker or a node fails, stop the job and start it again, up to K times (0..1000; 0); "
		 "the workers get HPU_RESTART_COUNT (0 first, then 1, 2, ...) and HPU_MAX_RESTARTS. "
		 "Not after Ctrl-C or SIGTERM to hpulaunch"},
	{"exec", 0, HPU_OPT_FLAG, O_EXEC, "PROGRAM ...",
	 .help = "run PROGRAM (from PATH) instead of hpu-worker, the rest of the command line its "
		 "arguments; it initializes from the environment"},
	{"progress", 0, HPU_OPT_VALUE, O_PROGRESS, "MODE",
	 .help = "auto | always | never: a progress bar of rank 0 (epoch, step, loss, samples/s, ETA) on the "
		 "last line of the terminal, below the workers' lines (auto: when stdout is a terminal and "
		 "TERM is not dumb; also with --hostfile)"},
	{"quiet", 'q', HPU_OPT_FLAG, O_QUIET, NULL, .help = "no start-up summary line"},
	{"log-level", 0, HPU_OPT_VALUE, O_LOG_LEVEL, "LEVEL",
	 .help = "error | warning | notice | info | debug: hpulaunch's lines above it are not printed; "
		 "the workers get it too (info)",
	 .env = "HPU_LOG_LEVEL"},
	{"help", 'h', HPU_OPT_FLAG, O_HELP, NULL, .help = "this help"},
	{"help-env", 0, HPU_OPT_FLAG, O_HELP_ENV, NULL,
	 .help = "every environment variable hpulaunch, hpud and the workers read, with its default"},
	/* the options' documentation (man/, docs/reference/): not listed */
	{"help-doc", 0, HPU_OPT_VALUE, O_HELP_DOC, .help = NULL},
	/* torchrun's names (it takes '-' and '_' alike) */
	{"nnodes", 0, HPU_OPT_VALUE, O_NNODES, "N", .help = "--nodes N (N:N too; no elastic MIN:MAX range)",
	 .section = "torchrun's names, as aliases (with '-' or '_' where torchrun takes both)"},
	{"nproc-per-node", 0, HPU_OPT_VALUE, O_NPROC_PER_NODE, "D",
	 .help = "--devices D; gpu: one worker per GPU on --device cuda (--devices auto --device cuda); "
		 "auto: as torchrun, one per GPU on cuda where a GPU is visible, else one per CPU core "
		 "(a --device given counts as with --devices auto); cpu: one per CPU core"},
	{"nproc_per_node", 0, HPU_OPT_VALUE, O_NPROC_PER_NODE, .help = NULL},
	{"node_rank", 0, HPU_OPT_VALUE, O_NODE_RANK, "R", .help = "--node-rank R"},
	{"master_addr", 0, HPU_OPT_VALUE, O_MASTER_ADDR, "A", .help = "--master-addr A"},
	{"master_port", 0, HPU_OPT_VALUE, O_MASTER_PORT, "P", .help = "--master-port P"},
	{"max_restarts", 0, HPU_OPT_VALUE, O_MAX_RESTARTS, "K", .help = "--max-restarts K"},
	{"rdzv-endpoint", 0, HPU_OPT_VALUE, O_RDZV_ENDPOINT, "HOST:PORT",
	 .help = "--master-addr HOST --master-port PORT (IPv4 or a name; an IPv6 [ADDR]:PORT is refused)"},
	{"rdzv_endpoint", 0, HPU_OPT_VALUE, O_RDZV_ENDPOINT, .help = NULL},
	{"rdzv-id", 0, HPU_OPT_VALUE, O_JOB_ID, "ID", .help = "--job-id ID (the workers' TORCHELASTIC_RUN_ID)"},
	{"rdzv_id", 0, HPU_OPT_VALUE, O_JOB_ID, .help = NULL},
	{"standalone", 0, HPU_OPT_FLAG, O_STANDALONE, NULL,
	 .help = "one node, the coordinator on 127.0.0.1 at a free port; MASTER_ADDR, MASTER_PORT, NODE_RANK ignored"},
	/* DeepSpeed's launcher's names */
	{"num_gpus", 0, HPU_OPT_VALUE, O_DEVICES, "D", .help = "--devices D",
	 .section = "DeepSpeed's launcher's names, as aliases (--master_addr and --master_port as above)"},
	{"num_nodes", 0, HPU_OPT_VALUE, O_NODES, "N", .help = "--nodes N"},
	{"include", 0, HPU_OPT_VALUE, O_INCLUDE, "HOST@HOST...",
	 .help = "run on these hosts of the hostfile only, in the file's order (whole hosts: DeepSpeed's "
		 "HOST:SLOT,SLOT device lists are refused; set slots= instead)"},
	{"exclude", 0, HPU_OPT_VALUE, O_EXCLUDE, "HOST@HOST...",
	 .help = "run on every host of the hostfile but these (whole hosts, as --include)"},
	{"hostfile", 0, HPU_OPT_VALUE, O_HOSTFILE, "FILE",
	 .help = "one host a line, \"HOST[:PORT] [slots=N]\" (DeepSpeed and Open MPI style; PORT: that node's "
		 "hpud port); nodes = hosts, node 0 = the first host [MASTER_ADDR], each host runs its slots "
		 "(they may differ; ranks go host by host), or --devices on each; not with --nodes, "
		 "--node-rank or --master-addr",
	 .section = "Several nodes from one command, through each node's hpud"},
	{"status", 0, HPU_OPT_VALUE, O_STATUS, "HOST[:PORT]", .help = "print the jobs of the hpud on HOST and exit"},
	{"hpud-port", 0, HPU_OPT_VALUE, O_HPUD_PORT, "P", .help = "the daemons' control port (29400)"},
	{"key", 0, HPU_OPT_VALUE, O_KEY, "FILE", .help = "the cluster secret for hpud (/etc/hpud/secret.key)",
	 .env = "HPU_KEY_FILE"},
	{0},
};

void hpu__args_usage(FILE *f)
{
	fprintf(f,
		"usage: hpulaunch [options] [training options] MODEL.so [-- model args]\n"
		"       hpulaunch [options] --exec PROGRAM [args...]\n"
		"\n"
		"MODEL.so is a file: a relative path (a bare name too) is made absolute\n"
		"against this directory before the workers get it, also with --hostfile,\n"
		"where that path must then hold the model on every node. Arguments after\n"
		"it go to the model; hpulaunch's own options there are refused (put them\n"
		"before the model, or after -- to hand them to the model).\n"
		"\n"
		"Starts one worker per device on this node; with --nodes N, run it on\n"
		"every node with its --node-rank (torchrun style).\n");
	hpu__optdoc(f, launcher_specs, HPU_DOC_HELP, 25);
	fprintf(f,
		"\n"
		"[WORLD_SIZE], if set, must equal nodes x devices (--hostfile: the slots\n"
		"added up).\n"
		"\n"
		"Under Slurm, run one hpulaunch per node inside srun:\n"
		"  srun -N2 --ntasks-per-node=1 hpulaunch --devices 8 MODEL.so\n"
		"The node rank, nodes, master address (the first node) and port and the\n"
		"job id then come from SLURM_*; flags and the variables above win. Export\n"
		"HPU_JOB_TOKEN first: without it the token derives from the job id, which\n"
		"keeps jobs apart but not users.\n"
		"\n"
		"Training options (passed to every worker):\n");
	hpu__opts_help(f);
}

int hpu__args_doc(FILE *f, const char *format)
{
	int how = hpu__optdoc_format(format);
	if (how < 0)
		return -1;
	hpu__optdoc(f, launcher_specs, how, 25);
	hpu__optdoc_heading(f, "Training options (passed to every worker)", how);
	hpu__optdoc(f, hpu__opts_specs(), how, 27);
	return 0;
}

/* --devices D|auto, and torchrun's --nproc-per-node, which also takes
 * "cpu" (one worker per CPU core, whatever --device), "gpu" (one per GPU,
 * on --device cuda) and its own "auto" (the GPUs where there are some,
 * else the cores); DeepSpeed's --num_gpus takes a number, auto or cpu. auto counts the cores here; after the command line,
 * auto_devices counts GPUs instead where the workers compute on them.
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
static int launcher_opt(hpu_launch_args *a, sources *src, const hpu_optparse *p,
			int k, char *err, size_t errlen)
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
	case O_MASTER_ADDR: bad = snprintf(a->master_addr, sizeof a->master_addr, "%s", v) >= (int)sizeof a->master_addr || !*v; break;
	case O_MASTER_PORT: bad = hpu__parse_int(v, 1, 65535, &a->master_port); break;
	case O_JOB_ID: bad = snprintf(a->job_id, sizeof a->job_id, "%s", v) >= (int)sizeof a->job_id || !*v; break;
	case O_LOG_DIR: a->log_dir = v; break;
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

static int from_env(hpu_launch_args *a, sources *src, char *err,
		    size_t errlen)
{
	const char *v;
	if ((v = hpu__env_str(HPU_ENV_MASTER_ADDR)) && *v) {
		snprintf(a->master_addr, sizeof a->master_addr, "%s", v);
		src->env |= SET_ADDR;
	}
	if ((v = hpu__env_str(HPU_ENV_MASTER_PORT)) && *v) {
		if (hpu__parse_int(v, 1, 65535, &a->master_port)) {
			snprintf(err, errlen, "MASTER_PORT='%s' is not a port number", v);
			return -1;
		}
		src->env |= SET_PORT;
	}
	if ((v = hpu__env_str(HPU_ENV_NODE_RANK)) && *v) {
		if (hpu__parse_int(v, 0, 4095, &a->node_rank)) {
			snprintf(err, errlen, "NODE_RANK='%s' is not a node rank", v);
			return -1;
		}
		src->env |= SET_RANK;
	}
	if ((v = hpu__env_str(HPU_ENV_HPU_JOB_ID)) && *v) {
		snprintf(a->job_id, sizeof a->job_id, "%s", v);
		src->env |= SET_JOB_ID;
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

/* Appends argv[from..to) to the worker's argv. */
static int add_args(hpu_launch_args *a, char **argv, int from, int to)
{
	char **grown = realloc(a->worker_argv, (size_t)(a->worker_argc + (to - from) + 1) * sizeof *grown);
	if (!grown)
		return -1;
	a->worker_argv = grown;
	for (int i = from; i < to; i++)
		a->worker_argv[a->worker_argc++] = argv[i];
	a->worker_argv[a->worker_argc] = NULL;
	return 0;
}

/* The option of either table nearest to `name` (without dashes and
 * "=VALUE"): within an edit distance of 2, or NULL. */
static const char *nearest_option(const char *name, size_t len)
{
	char want[64];
	if (len >= sizeof want)
		return NULL;
	memcpy(want, name, len);
	want[len] = 0;
	const char *best = NULL;
	size_t bestd = 3;
	const hpu_optspec *tables[2] = {launcher_specs, hpu__opts_specs()};
	for (int t = 0; t < 2; t++)
		for (const hpu_optspec *o = tables[t]; o->name || o->short_name; o++) {
			size_t d = o->name && strcmp(o->name, "help-doc") ? hpu__edit_distance(want, o->name) : 99;
			if (d < bestd) {
				bestd = d;
				best = o->name;
			}
		}
	return best;
}

/* A bad value that is a number, given to an option whose plural is one of
 * the launcher's (--device 2 for --devices 2): says so after err. */
static void plural_hint(const hpu_optparse *p, char *err, size_t errlen)
{
	const char *v = p->val;
	if (!p->spec || !p->spec->name || !v || !v[0] || strspn(v, "0123456789") != strlen(v))
		return;
	for (const hpu_optspec *o = launcher_specs; o->name || o->short_name; o++) {
		size_t n = strlen(p->spec->name);
		if (o->name && !strncmp(o->name, p->spec->name, n) && !strcmp(o->name + n, "s")) {
			size_t len = strlen(err);
			snprintf(err + len, errlen - len, " (did you mean --%s %s?)", o->name, v);
			return;
		}
	}
}

/* The message of an option hpu__optparse_next refused (code r). */
static int option_error(const hpu_optparse *p, int r, char *err, size_t errlen)
{
	if (r == HPU_OPT_MISSING) {
		snprintf(err, errlen, "option --%s needs a value", p->spec->name);
	} else if (r == HPU_OPT_UNWANTED && p->spec->id >= HPU_OPTS_ID) {
		snprintf(err, errlen, "option --%s takes no value", p->spec->name);
	} else {
		const char *name = p->arg + 2, *near = nearest_option(name, strcspn(name, "="));
		int n = (int)strcspn(p->arg, "=");
		if (near)
			snprintf(err, errlen, "unknown option %.*s (did you mean --%s?) (see hpulaunch --help)",
				 n, p->arg, near);
		else
			snprintf(err, errlen, "unknown option %.*s (see hpulaunch --help)", n, p->arg);
	}
	return -1;
}

/* The option of either table that argument arg ("--name" or
 * "--name=VALUE") is, or NULL. */
static const hpu_optspec *known_option(const char *arg)
{
	if (strncmp(arg, "--", 2) || !arg[2])
		return NULL;
	size_t len = strcspn(arg + 2, "=");
	const hpu_optspec *tables[2] = {launcher_specs, hpu__opts_specs()};
	for (int t = 0; t < 2; t++)
		for (const hpu_optspec *o = tables[t]; o->name || o->short_name; o++)
			if (o->name && strlen(o->name) == len && !strncmp(o->name, arg + 2, len))
				return o;
	return NULL;
}

/* Refuses hpulaunch's own options among the arguments after the model
 * argv[model] up to "--": they would reach the model, not hpulaunch (the
 * model's arguments go after "--"; others, not hpulaunch's, pass). */
static int options_after_model(char **argv, int argc, int model, char *err, size_t errlen)
{
	for (int i = model + 1; i < argc && strcmp(argv[i], "--"); i++) {
		const hpu_optspec *o = known_option(argv[i]);
		if (o) {
			snprintf(err, errlen, "hpulaunch's option --%s comes after the model %s, where the model would get it: put it before the model, or after -- to hand it to the model (hpulaunch ... %s -- %s)",
				 o->name, argv[model], argv[model], argv[i]);
			return -1;
		}
	}
	return 0;
}

/* --resume DIR (not auto) must be a checkpoint (DIR/manifest.json) or a
 * checkpoint root (step-* directories, or latest) on this node before the
 * workers start; with --hostfile the path is the nodes', not this one's. */
static int check_resume(const hpu_launch_args *a, char *err, size_t errlen)
{
	const char *r = a->train.resume;
	struct stat st;
	char path[1200];
	if (!r[0] || !strcmp(r, "auto") || a->hostfile || a->exec_mode)
		return 0;
	if (stat(r, &st) != 0) {
		snprintf(err, errlen, "--resume %s: %s: give a checkpoint directory (with manifest.json), a checkpoint root (with step-* directories) or auto",
			 r, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "--resume %s is not a directory: give a checkpoint directory (with manifest.json), a checkpoint root (with step-* directories) or auto",
			 r);
		return -1;
	}
	snprintf(path, sizeof path, "%s/manifest.json", r);
	if (access(path, F_OK) == 0)
		return 0;
	snprintf(path, sizeof path, "%s/latest", r);
	if (access(path, F_OK) == 0)
		return 0;
	DIR *d = opendir(r);
	struct dirent *e;
	int found = 0;
	while (d && !found && (e = readdir(d)))
		found = !strncmp(e->d_name, "step-", 5);
	if (d)
		closedir(d);
	if (!found) {
		snprintf(err, errlen, "--resume %s: no checkpoint there (neither manifest.json nor step-* directories)",
			 r);
		return -1;
	}
	return 0;
}

/* The job id and token a job needs; a single-node job, and one started
 * from a hostfile, makes its own. */
static void job_identity(hpu_launch_args *a)
{
	if (!a->token[0])
		random_hex(a->token, 32);
	if (!a->job_id[0]) {
		if (a->nodes > 1 && !a->hostfile) {
			strcpy(a->job_id, "hpujob");
		} else {
			strcpy(a->job_id, "job-");
			random_hex(a->job_id + 4, 6);
		}
	}
}

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

/* --hostfile: the nodes, devices and master address follow from the file. */
static int hostfile_plan(hpu_launch_args *a, const sources *src, char *err,
			 size_t errlen)
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
	if (hpu__hostfile_read(a->hostfile, &a->hosts, &a->nhosts, err, errlen) < 0)
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

/* Inside an srun job step, Slurm gives what flags and the environment
 * did not. A single-node step keeps the single-node defaults (loopback, a
 * free port, a random token): nobody else needs to find it. */
static int slurm_plan(hpu_launch_args *a, const sources *src, char *err,
		      size_t errlen)
{
	hpu_slurm s;
	if (hpu__slurm_read(&s, err, errlen) < 0)
		return -1;
	if (!s.present)
		return 0;
	unsigned given = src->flag | src->env;
	int own_nodes = !(given & SET_NODES), own_rank = !(given & SET_RANK);
	if ((own_nodes || own_rank) && s.ntasks && s.ntasks != s.nnodes) {
		snprintf(err, errlen, "Slurm started %d task%s on %d node%s, but hpulaunch runs once per node and starts the workers itself: use srun --ntasks-per-node=1 (and --devices for the workers per node)",
			 s.ntasks, hpu__plural(s.ntasks), s.nnodes, hpu__plural(s.nnodes));
		return -1;
	}
	int nodes = s.ntasks ? s.ntasks : s.nnodes;
	if (own_nodes && nodes > 4096) {
		snprintf(err, errlen, "Slurm job step %ld.%d has %d nodes; hpulaunch supports up to 4096",
			 s.job_id, s.step_id, nodes);
		return -1;
	}
	a->from_slurm = 1;
	if (own_nodes)
		a->nodes = nodes;
	if (own_rank)
		a->node_rank = s.nodeid >= 0 ? s.nodeid : s.procid;
	if (!(given & SET_JOB_ID))
		snprintf(a->job_id, sizeof a->job_id, "slurm-%ld", s.job_id);
	if (a->nodes < 2)
		return 0;
	if (!(given & SET_ADDR))
		snprintf(a->master_addr, sizeof a->master_addr, "%s", s.first_host);
	if (!(given & SET_PORT))
		a->master_port = hpu__slurm_master_port(s.job_id);
	if (!(given & SET_TOKEN)) {
		/* Not a secret: see hpu__slurm_token. */
		hpu__slurm_token(s.job_id, a->token);
		a->weak_token = 1;
	}
	return 0;
}

/* torchrun's --standalone: a single node whose coordinator listens on
 * loopback at a free port, whatever MASTER_ADDR, MASTER_PORT and NODE_RANK
 * (or Slurm) say; flags that name other nodes or a rendezvous contradict
 * it. */
static int standalone_plan(hpu_launch_args *a, const sources *src, char *err,
			   size_t errlen)
{
	const char *clash = a->hostfile		     ? "--hostfile"
			    : a->nodes > 1	     ? "more than one node"
			    : src->flag & SET_ADDR   ? "--master-addr or --rdzv-endpoint"
			    : src->flag & SET_PORT   ? "--master-port or --rdzv-endpoint"
			    : src->flag & SET_RANK && a->node_rank ? "a --node-rank above 0"
								     : NULL;
	if (clash) {
		snprintf(err, errlen, "--standalone runs one node with its own rendezvous on a free port: it does not go with %s",
			 clash);
		return -1;
	}
	a->nodes = 1;
	a->node_rank = 0;
	strcpy(a->master_addr, "127.0.0.1");
	a->master_port = 0;
	return 0;
}

/* The batch size and epochs the model declares (HPU_MODEL's .defaults),
 * where no flag or --config file set them, as the workers apply them
 * (worker/runtime/main.c): the batch is then checked against the world
 * size as the workers will check it. 1 when read, 0 when it declares
 * none, -1 when the file cannot tell (why says so), -2 with err when a
 * declared value is one no flag would take. */
static int model_numbers(hpu_launch_args *a, char *why, size_t whylen, char *err,
			 size_t errlen)
{
	hpu_train_defaults d;
	int rc = hpu__model_declared(a->model, &d, why, whylen);
	const struct {
		const char *field, *name;
		int value;
	} f[] = {{"batch_size", "batch-size", d.batch_size}, {"epochs", "epochs", d.epochs}};
	for (size_t k = 0; rc > 0 && k < sizeof f / sizeof f[0]; k++) {
		char v[24], bad[400];
		snprintf(v, sizeof v, "%d", f[k].value);
		if (f[k].value && hpu__opts_set_model(&a->train, f[k].name, v, bad, sizeof bad) < 0) {
			snprintf(err, errlen, "model %s declares an invalid default .defaults.%s in HPU_MODEL: %s",
				 a->model, f[k].field, bad);
			return -2;
		}
	}
	return rc;
}

/* The training options resolved for `world` workers, with the model's
 * declared numbers. Where the file cannot tell them and only the batch
 * size's division among the workers fails, that check is left to the
 * workers, which load the model, saying so. */
static int resolve_train(hpu_launch_args *a, int world, char *err, size_t errlen)
{
	char why[256] = "", other[1024];
	int known = a->model ? model_numbers(a, why, sizeof why, err, errlen) : 0;
	if (known == -2)
		return -1;
	if (hpu__opts_resolve(&a->train, world, err, errlen) == 0)
		return 0;
	/* a file that is no model keeps the batch's error (hpu__model_check
	 * says what it is after the command line) */
	if (known >= 0 || world == 1 || hpu__model_check(a->model, other, sizeof other) < 0 ||
	    hpu__opts_resolve(&a->train, 1, err, errlen) < 0)
		return -1;
	hpu__log(HPU_LOG_NOTICE, "note: the model %s may declare its own batch size, which cannot be read from the file (%s): the %d workers check the batch when they load the model",
		 a->model, why, world);
	err[0] = '\0';
	return 0;
}

static int check_plan(hpu_launch_args *a, char *err, size_t errlen)
{
	const char *ws = hpu__env_str(HPU_ENV_WORLD_SIZE);
	int world = a->nodes * a->devices, w;
	if (a->hostfile) {
		world = 0;
		for (int i = 0; i < a->nhosts; i++)
			world += a->hosts[i].slots;
	}
	a->world = world;
	if (ws && *ws && (hpu__parse_int(ws, 1, 1 << 24, &w) || w != world)) {
		if (a->hostfile)
			snprintf(err, errlen, "WORLD_SIZE=%s from the environment does not equal the %d worker%s of %s's %d host%s",
				 ws, world, hpu__plural(world), a->hostfile, a->nhosts,
				 hpu__plural(a->nhosts));
		else
			snprintf(err, errlen, "WORLD_SIZE=%s from the environment does not equal --nodes %d x --devices %d = %d",
				 ws, a->nodes, a->devices, world);
		return -1;
	}
	if (a->node_rank >= a->nodes) {
		snprintf(err, errlen, "--node-rank %d is not below --nodes %d", a->node_rank, a->nodes);
		return -1;
	}
	if (a->transport && strcmp(a->transport, "auto") && strcmp(a->transport, "tcp") &&
	    strcmp(a->transport, "ipc") && strcmp(a->transport, "shm")) {
		snprintf(err, errlen, "HPUCOLL_TRANSPORT='%s' is not one of auto, tcp, ipc, shm",
			 a->transport);
		return -1;
	}
	if (a->data_plane && strcmp(a->data_plane, "auth") &&
	    strcmp(a->data_plane, "encrypt") && strcmp(a->data_plane, "none")) {
		snprintf(err, errlen, "--data-plane (HPUCOLL_SECURITY) takes auth, encrypt or none, not '%s'",
			 a->data_plane);
		return -1;
	}
	if (a->nodes > 1 && a->transport && !strcmp(a->transport, "ipc")) {
		snprintf(err, errlen, "--transport ipc works within one node only; use tcp, shm or auto with --nodes %d",
			 a->nodes);
		return -1;
	}
	for (const char *c = a->job_id; *c; c++)
		if (!(isalnum((unsigned char)*c) || *c == '-' || *c == '_' || *c == '.')) {
			snprintf(err, errlen, "job id '%s' may hold only letters, digits, '-', '_' and '.'",
				 a->job_id);
			return -1;
		}
	if (a->nodes > 1 && !a->master_port && !a->hostfile) {
		snprintf(err, errlen, "--nodes %d needs --master-port (or MASTER_PORT): every node must know where node 0 listens",
			 a->nodes);
		return -1;
	}
	if (a->nodes > 1 && !a->token[0] && !a->hostfile) {
		snprintf(err, errlen, "--nodes %d needs HPU_JOB_TOKEN set to the same secret on every node",
			 a->nodes);
		return -1;
	}
	if (!a->exec_mode && resolve_train(a, world, err, errlen) < 0)
		return -1;
	if (check_resume(a, err, errlen) < 0)
		return -1;
	job_identity(a);
	return 0;
}

/* Gives the workers "--device cuda" among their training options,
 * before the model (torchrun's gpu, or its auto where it found GPUs,
 * with no device given): 0, or -1 out of memory. */
static int add_device_cuda(hpu_launch_args *a)
{
	int at = 1;
	while (at < a->worker_argc && a->worker_argv[at] != a->model)
		at++;
	char **grown = realloc(a->worker_argv, (size_t)(a->worker_argc + 3) * sizeof *grown);
	if (!grown)
		return -1;
	memmove(grown + at + 2, grown + at, (size_t)(a->worker_argc - at + 1) * sizeof *grown);
	grown[at] = (char *)"--device";
	grown[at + 1] = (char *)"cuda";
	a->worker_argv = grown;
	a->worker_argc += 2;
	a->train.device = HPU_DEVICE_CUDA;
	return 0;
}

/* What --devices auto counts by (gpus.h): the device; torchrun's gpu the
 * GPUs on cuda, its auto the GPUs where there are some, where no device
 * is given (the option, the file or HPU_DEVICE). *given: one was. -1 with
 * a sentence in err for gpu with a CPU device. */
static int count_by(const hpu_launch_args *a, const sources *src, hpu__count_by *by,
		    int *given, char *err, size_t errlen)
{
	const char *env = hpu__env_str(HPU_ENV_HPU_DEVICE);
	hpu_device_kind d = a->train.device;
	*given = hpu__opts_from(&a->train, "device") != HPU_FROM_DEFAULT || (env && *env);
	*by = d == HPU_DEVICE_CUDA ? HPU_COUNT_GPUS : d == HPU_DEVICE_AUTO ? HPU_COUNT_EITHER
									    : HPU_COUNT_CORES;
	if ((src->flag & SET_DEVICES_GPU) && *given && *by == HPU_COUNT_CORES) {
		snprintf(err, errlen, "--nproc-per-node gpu: one worker per GPU computes on --device cuda, not --device %s",
			 hpu__device_name(d));
		return -1;
	}
	if (src->flag & SET_DEVICES_GPU)
		*by = HPU_COUNT_GPUS;
	else if ((src->flag & SET_DEVICES_TORCH) && !*given)
		*by = HPU_COUNT_EITHER;
	return 0;
}

/* --devices auto: one worker per GPU with --device cuda (none is an
 * error), or auto where the CUDA device sees GPUs; else one per CPU core
 * (gpus.h). hpu-worker counts them: this program links nothing of CUDA.
 * torchrun's --nproc-per-node gpu and auto, as count_by says. */
static int auto_devices(hpu_launch_args *a, const sources *src, char *err, size_t errlen)
{
	static const char cuda[] = "--devices auto --device cuda: ";
	hpu__count_by by;
	int given;
	if (hpu__opts_resolve_device(&a->train, err, errlen) < 0 ||
	    count_by(a, src, &by, &given, err, errlen) < 0)
		return -1;
	int ngpus = 0;
	char why[1024] = "", worker[PATH_MAX];
	if (by != HPU_COUNT_CORES) {
		if (worker_path(worker, sizeof worker) < 0)
			snprintf(why, sizeof why, "cannot find hpu-worker");
		else
			hpu__gpus_count(worker, &ngpus, why, sizeof why);
	}
	if (hpu__gpus_devices(by, ngpus, why, sysconf(_SC_NPROCESSORS_ONLN), &a->devices, err,
			      errlen) < 0) {
		/* torchrun's spelling is named as given */
		if ((src->flag & SET_DEVICES_GPU) && !strncmp(err, cuda, sizeof cuda - 1)) {
			snprintf(why, sizeof why, "--nproc-per-node gpu: %s", err + sizeof cuda - 1);
			snprintf(err, errlen, "%s", why);
		}
		return -1;
	}
	if ((src->flag & (SET_DEVICES_GPU | SET_DEVICES_TORCH)) && !given && ngpus > 0 &&
	    a->model && add_device_cuda(a) < 0) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

/* After the command line: --status needs nothing more; otherwise the
 * hostfile or Slurm fill in the plan, which is then checked. */
static int finish(hpu_launch_args *a, const sources *src, int extra_args,
		  char *err, size_t errlen)
{
	if (a->status_host) {
		if (a->hostfile || a->exec_mode || extra_args) {
			snprintf(err, errlen, "--status prints a daemon's jobs and takes no %s",
				 a->hostfile ? "--hostfile" : a->exec_mode ? "--exec" : "model");
			return -1;
		}
		if (!a->status_port)
			a->status_port = a->hpud_port;
		return 0;
	}
	if ((a->include || a->exclude) && !a->hostfile) {
		snprintf(err, errlen, "%s picks hosts of a --hostfile: give one (DeepSpeed's hostfile format: HOST slots=N)",
			 a->include ? "--include" : "--exclude");
		return -1;
	}
	if (a->standalone) {
		if (standalone_plan(a, src, err, errlen) < 0)
			return -1;
	} else if (a->hostfile ? hostfile_plan(a, src, err, errlen)
			       : slurm_plan(a, src, err, errlen)) {
		return -1;
	}
	if ((src->flag & SET_DEVICES_AUTO) && !(src->flag & SET_DEVICES_CORES) &&
	    auto_devices(a, src, err, errlen) < 0)
		return -1;
	return check_plan(a, err, errlen);
}

/* The model the workers load, as an absolute path in a->model: dlopen
 * would look a bare "model.so" up on the library search path (and might
 * find another one there), and hpud would resolve any relative path
 * against its own directory. An absolute path is kept as given. */
static int model_path(hpu_launch_args *a, const char *path, char *err,
		      size_t errlen)
{
	struct stat st;
	if (access(path, R_OK) != 0 || stat(path, &st) != 0) {
		snprintf(err, errlen, "cannot read the model %s: %s", path, strerror(errno));
		return -1;
	}
	if (!S_ISREG(st.st_mode)) { /* dlopen would wait on a FIFO */
		const char *kind = S_ISDIR(st.st_mode)    ? "a directory"
				   : S_ISFIFO(st.st_mode) ? "a FIFO"
							  : "a device or socket";
		snprintf(err, errlen, "the model %s is not a regular file (%s)", path, kind);
		return -1;
	}
	a->model = path[0] == '/' ? strdup(path) : realpath(path, NULL);
	if (!a->model) {
		snprintf(err, errlen, "cannot make the model path %s absolute: %s", path,
			 strerror(errno));
		return -1;
	}
	return 0;
}

/* Keeps s (malloc'ed, or NULL: out of memory) for hpu__args_free. */
static char *own(hpu_launch_args *a, char *s)
{
	char **grown = s ? realloc(a->owned, (size_t)(a->nowned + 1) * sizeof *grown) : NULL;
	if (!grown) {
		free(s);
		return NULL;
	}
	a->owned = grown;
	return a->owned[a->nowned++] = s;
}

/* "--name=PATH" with `value` of path option `name` made absolute against
 * cwd (kept in a->owned); NULL with *rc 0 when it needs nothing, else
 * with *rc < 0 and a sentence in err. */
static char *abs_flag(hpu_launch_args *a, const char *name, const char *value, const char *cwd,
		      int *rc, char *err, size_t errlen)
{
	char *path, *flag = NULL;
	*rc = hpu__opts_abs_path(name, value, cwd, &path);
	if (*rc == -2) {
		snprintf(err, errlen, "--%s %s made absolute (hpud starts the workers in its own directory) is longer than %zu bytes: give a shorter path",
			 name, value ? value : ".", sizeof a->train.metrics - 1);
		return NULL;
	}
	if (*rc == 1 && asprintf(&flag, "--%s=%s", name, path) < 0)
		flag = NULL;
	free(path);
	if (*rc == -1 || (*rc == 1 && !own(a, flag))) {
		snprintf(err, errlen, "out of memory");
		*rc = -1;
		return NULL;
	}
	return *rc == 1 ? flag : NULL;
}

/* The file variables hostfile jobs carry to the workers (hpu__job_env):
 * made absolute in this process's environment before they are sent. */
static const hpu_env_id file_vars[] = {
	HPU_ENV_LOWER_LIST, HPU_ENV_FP32_LIST, HPU_ENV_PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST,
	HPU_ENV_PT_HPU_AUTOCAST_FP32_OPS_LIST, HPU_ENV_QUANT_CONFIG};

static int absolute_vars(const char *cwd, char *err, size_t errlen)
{
	for (size_t k = 0; k < sizeof file_vars / sizeof file_vars[0]; k++) {
		const char *v = hpu__env_str(file_vars[k]);
		char *abs = NULL;
		if (!v || !*v || v[0] == '/')
			continue;
		if (asprintf(&abs, "%s%s%s", cwd, strcmp(cwd, "/") ? "/" : "", v) < 0 ||
		    setenv(hpu__env_name(file_vars[k]), abs, 1) < 0) {
			free(abs);
			snprintf(err, errlen, "out of memory");
			return -1;
		}
		free(abs);
	}
	return 0;
}

/* --hostfile: hpud starts the workers in its own directory, so each
 * relative path is made absolute against this one, where hpulaunch read
 * and checked them: in the training options as written, which the workers
 * get (--metrics x, --metrics=x, --profile alone), in a flag for each one
 * the --config file gave (a flag wins over the file), and in the file
 * variables (LOWER_LIST, QUANT_CONFIG, ...). Which options are paths is
 * the option table's to say (hpu__opts_is_path). worker_argv holds the
 * program and the training options. */
static int absolute_paths(hpu_launch_args *a, char *err, size_t errlen)
{
	char cwd[PATH_MAX], **in = a->worker_argv;
	int n = a->worker_argc, rc = 0;
	if (!getcwd(cwd, sizeof cwd)) {
		snprintf(err, errlen, "cannot make relative paths absolute for hpud: this directory: %s",
			 strerror(errno));
		return -1;
	}
	if (absolute_vars(cwd, err, errlen) < 0)
		return -1;
	a->worker_argv = NULL;
	a->worker_argc = 0;
	if (add_args(a, in, 0, 1) < 0)
		goto oom;
	hpu_optparse p;
	hpu__optparse_init(&p, n, in, hpu__opts_specs());
	for (int r; (r = hpu__optparse_next(&p)) > 0;) {
		const char *name = p.spec->name, *v = p.val;
		if (!v && p.spec->value == HPU_OPT_OPTIONAL &&
		    hpu__opts_takes_next(name, p.ind < n ? in[p.ind] : NULL))
			v = in[p.ind++];
		char *flag = abs_flag(a, name, v, cwd, &rc, err, errlen);
		if (rc < 0)
			goto out;
		if (flag ? add_args(a, &flag, 0, 1) < 0 : add_args(a, in, p.at, p.ind) < 0)
			goto oom;
	}
	const char *name, *v;
	for (int k = 0; (name = hpu__opts_file_path(&a->train, k, &v)); k++) {
		char *flag = abs_flag(a, name, v, cwd, &rc, err, errlen);
		if (rc < 0)
			goto out;
		if (flag && add_args(a, &flag, 0, 1) < 0)
			goto oom;
	}
	rc = 0;
	goto out;
oom:
	snprintf(err, errlen, "out of memory");
	rc = -1;
out:
	free(in);
	return rc < 0 ? -1 : 0;
}

int hpu__args_parse(hpu_launch_args *a, int argc, char **argv, char *err,
		    size_t errlen)
{
	sources src = {0, 0};
	memset(a, 0, sizeof *a);
	a->nodes = 1;
	a->devices = 1;
	a->join_timeout_s = 300;
	a->agent_timeout_s = 10;
	a->grace_s = 2;
	a->hpud_port = HPU_HPUD_PORT;
	a->key_path = HPU_KEY_FILE_DEFAULT;
	strcpy(a->master_addr, "127.0.0.1");
	hpu__opts_defaults(&a->train);
	if (from_env(a, &src, err, errlen) < 0)
		return -1;
	static char wpath[PATH_MAX];
	if (worker_path(wpath, sizeof wpath) < 0 || add_args(a, (char *[]){wpath}, 0, 1) < 0) {
		snprintf(err, errlen, "cannot find hpu-worker");
		return -1;
	}
	hpu_optparse p;
	hpu__optparse_init(&p, argc, argv, launcher_specs);
	p.more = hpu__opts_specs();
	int r;
	while ((r = hpu__optparse_next(&p)) > 0) {
		if (r == O_HELP) {
			hpu__args_usage(stdout);
			return 1;
		}
		if (r == O_HELP_ENV) {
			hpu__env_print(stdout);
			return 1;
		}
		if (r == O_HELP_DOC) {
			if (hpu__args_doc(stdout, p.val) < 0) {
				snprintf(err, errlen, "--help-doc takes help, scdoc or markdown, not '%s'", p.val);
				return -1;
			}
			return 1;
		}
		if (r == O_EXEC) {
			if (p.ind >= argc) {
				snprintf(err, errlen, "--exec needs a program");
				return -1;
			}
			a->exec_mode = 1;
			a->worker_argc = 0;
			if (add_args(a, argv, p.ind, argc) < 0) {
				snprintf(err, errlen, "out of memory");
				return -1;
			}
			char cwd[PATH_MAX];
			if (a->hostfile && getcwd(cwd, sizeof cwd) && absolute_vars(cwd, err, errlen) < 0)
				return -1;
			return finish(a, &src, 0, err, errlen);
		}
		if (r < HPU_OPTS_ID) {
			if (launcher_opt(a, &src, &p, r, err, errlen) < 0)
				return -1;
		} else if (hpu__opts_apply(&a->train, &p, err, errlen) < 0) {
			plural_hint(&p, err, errlen);
			return -1;
		} else if (add_args(a, argv, p.at, p.ind) < 0) {
			return -1; /* a training option: checked, forwarded as written */
		}
	}
	/* The model, where an argument that is not an option (or a single-dash
	 * one) starts, or the end. */
	if (r == HPU_OPT_MISSING || r == HPU_OPT_UNWANTED || (r == HPU_OPT_UNKNOWN && p.arg[1] == '-'))
		return option_error(&p, r, err, errlen);
	int i = p.at;
	if (a->status_host)
		return finish(a, &src, i < argc, err, errlen);
	if (i >= argc || argv[i][0] == '-') {
		snprintf(err, errlen, "no model given: hpulaunch [options] MODEL.so (see --help)");
		return -1;
	}
	if (options_after_model(argv, argc, i, err, errlen) < 0 ||
	    model_path(a, argv[i], err, errlen) < 0)
		return -1;
	if (a->hostfile && absolute_paths(a, err, errlen) < 0)
		return -1;
	if (add_args(a, &a->model, 0, 1) < 0 || add_args(a, argv, i + 1, argc) < 0) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return finish(a, &src, 0, err, errlen);
}

void hpu__args_free(hpu_launch_args *a)
{
	free(a->worker_argv);
	a->worker_argv = NULL;
	for (int i = 0; i < a->nowned; i++)
		free(a->owned[i]);
	free(a->owned);
	a->owned = NULL;
	a->nowned = 0;
	free(a->model);
	a->model = NULL;
	free(a->hosts);
	a->hosts = NULL;
	a->nhosts = 0;
	free(a->status_host);
	a->status_host = NULL;
}
