#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void hpu_args_usage(FILE *f)
{
	fprintf(f,
		"usage: hpulaunch [options] [training options] MODEL.so [-- model args]\n"
		"       hpulaunch [options] --exec PROGRAM [args...]\n"
		"\n"
		"Starts one worker per device on this node; with --nodes N, run it on\n"
		"every node with its --node-rank (torchrun style).\n"
		"\n"
		"Options (environment variables in brackets; flags win):\n"
		"  --nodes N              nodes in the job (1)\n"
		"  --devices D|auto       workers on this node (1; auto: one per CPU core)\n"
		"  --node-rank R          this node's rank, 0..N-1 [NODE_RANK] (0)\n"
		"  --master-addr A        node 0's address [MASTER_ADDR] (127.0.0.1)\n"
		"  --master-port P        coordinator port on node 0 [MASTER_PORT]\n"
		"                         (single node: a free port)\n"
		"  --job-id ID            job id [HPU_JOB_ID]; the job token comes from\n"
		"                         [HPU_JOB_TOKEN] (required with --nodes > 1)\n"
		"  --log-dir DIR          also write each rank's output to DIR/rank_N.log\n"
		"  --transport T          auto | tcp | ipc | shm: how ranks reach each other\n"
		"                         (auto: shared memory within a node, TCP between)\n"
		"                         [HPUCOLL_TRANSPORT]\n"
		"  --join-timeout S       seconds for every rank to join (300)\n"
		"  --exec PROGRAM ...     run PROGRAM (from PATH) instead of hpu-worker;\n"
		"                         it initializes from the environment\n"
		"  -q, --quiet            no start-up summary line\n"
		"  -h, --help             this help\n"
		"[WORLD_SIZE], if set, must equal nodes x devices.\n"
		"\n"
		"Training options (passed to every worker):\n");
	hpu_opts_help(f);
}

static int to_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = (int)v;
	return 0;
}

static int to_double(const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !(v > 0))
		return -1;
	*out = v;
	return 0;
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
	for (size_t i = 0; i < bytes; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
}

/* The hpu-worker next to this executable, or $HPU_WORKER. */
static int worker_path(char *out, size_t outlen)
{
	const char *env = getenv("HPU_WORKER");
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

/* Launcher options; returns 1 if argv[*i] was one, 0 if not, -1 on error. */
static int launcher_opt(hpu_launch_args *a, int argc, char **argv, int *i,
			char *err, size_t errlen)
{
	static const char *names[] = {"--nodes", "--devices", "--node-rank",
				      "--master-addr", "--master-port", "--job-id",
				      "--log-dir", "--join-timeout", "--transport"};
	const char *arg = argv[*i];
	int k = -1;
	for (int j = 0; j < 9; j++)
		if (!strcmp(arg, names[j]))
			k = j;
	if (!strcmp(arg, "-q") || !strcmp(arg, "--quiet")) {
		a->quiet = 1;
		(*i)++;
		return 1;
	}
	if (k < 0)
		return 0;
	if (*i + 1 >= argc) {
		snprintf(err, errlen, "option %s needs a value", arg);
		return -1;
	}
	const char *v = argv[++*i];
	int bad = 0;
	switch (k) {
	case 0: bad = to_int(v, 1, 4096, &a->nodes); break;
	case 1:
		if (!strcmp(v, "auto"))
			a->devices = (int)sysconf(_SC_NPROCESSORS_ONLN);
		else
			bad = to_int(v, 1, 1024, &a->devices);
		break;
	case 2: bad = to_int(v, 0, 4095, &a->node_rank); break;
	case 3: bad = snprintf(a->master_addr, sizeof a->master_addr, "%s", v) >= (int)sizeof a->master_addr || !*v; break;
	case 4: bad = to_int(v, 1, 65535, &a->master_port); break;
	case 5: bad = snprintf(a->job_id, sizeof a->job_id, "%s", v) >= (int)sizeof a->job_id || !*v; break;
	case 6: a->log_dir = v; break;
	case 7: bad = to_double(v, &a->join_timeout_s); break;
	case 8:
		bad = strcmp(v, "auto") && strcmp(v, "tcp") && strcmp(v, "ipc") && strcmp(v, "shm");
		a->transport = v;
		break;
	}
	if (bad) {
		snprintf(err, errlen, "bad value '%s' for %s", v, arg);
		return -1;
	}
	(*i)++;
	return 1;
}

static int from_env(hpu_launch_args *a, char *err, size_t errlen)
{
	const char *v;
	if ((v = getenv("MASTER_ADDR")) && *v)
		snprintf(a->master_addr, sizeof a->master_addr, "%s", v);
	if ((v = getenv("MASTER_PORT")) && *v && to_int(v, 1, 65535, &a->master_port)) {
		snprintf(err, errlen, "MASTER_PORT='%s' is not a port number", v);
		return -1;
	}
	if ((v = getenv("NODE_RANK")) && *v && to_int(v, 0, 4095, &a->node_rank)) {
		snprintf(err, errlen, "NODE_RANK='%s' is not a node rank", v);
		return -1;
	}
	if ((v = getenv("HPU_JOB_ID")) && *v)
		snprintf(a->job_id, sizeof a->job_id, "%s", v);
	if ((v = getenv("HPUCOLL_TRANSPORT")) && *v)
		a->transport = v;
	if ((v = getenv("HPU_JOB_TOKEN")) && *v)
		snprintf(a->token, sizeof a->token, "%s", v);
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

/* One training option at argv[*i] ("--name value" or "--name=value"):
 * checked here, forwarded to the workers as written. */
static int train_opt(hpu_launch_args *a, int argc, char **argv, int *i,
		     char *err, size_t errlen)
{
	char name[64];
	const char *arg = argv[*i] + 2, *eq = strchr(arg, '=');
	size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
	snprintf(name, sizeof name, "%.*s", (int)(n < 63 ? n : 63), arg);
	int wants = hpu_opts_takes_value(name);
	if (wants < 0 || n >= sizeof name) {
		snprintf(err, errlen, "unknown option %s (see hpulaunch --help)", argv[*i]);
		return -1;
	}
	const char *value = eq ? eq + 1 : NULL;
	if (wants && !eq) {
		if (*i + 1 >= argc) {
			snprintf(err, errlen, "option --%s needs a value", name);
			return -1;
		}
		value = argv[++*i];
	}
	if (hpu_opts_set(&a->train, name, value, err, errlen) < 0)
		return -1;
	(*i)++;
	return 0;
}

/* The job id and token a job needs; a single-node job makes its own. */
static void job_identity(hpu_launch_args *a)
{
	if (!a->token[0])
		random_hex(a->token, 32);
	if (!a->job_id[0]) {
		if (a->nodes > 1) {
			strcpy(a->job_id, "hpujob");
		} else {
			strcpy(a->job_id, "job-");
			random_hex(a->job_id + 4, 6);
		}
	}
}

static int check_plan(hpu_launch_args *a, char *err, size_t errlen)
{
	const char *ws = getenv("WORLD_SIZE");
	int world = a->nodes * a->devices, w;
	if (ws && *ws && (to_int(ws, 1, 1 << 24, &w) || w != world)) {
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
	if (a->nodes > 1 && !a->master_port) {
		snprintf(err, errlen, "--nodes %d needs --master-port (or MASTER_PORT): every node must know where node 0 listens",
			 a->nodes);
		return -1;
	}
	if (a->nodes > 1 && !a->token[0]) {
		snprintf(err, errlen, "--nodes %d needs HPU_JOB_TOKEN set to the same secret on every node",
			 a->nodes);
		return -1;
	}
	if (!a->exec_mode && hpu_opts_resolve(&a->train, world, err, errlen) < 0)
		return -1;
	job_identity(a);
	return 0;
}

int hpu_args_parse(hpu_launch_args *a, int argc, char **argv, char *err,
		   size_t errlen)
{
	memset(a, 0, sizeof *a);
	a->nodes = 1;
	a->devices = 1;
	a->join_timeout_s = 300;
	a->agent_timeout_s = 10;
	a->grace_s = 2;
	strcpy(a->master_addr, "127.0.0.1");
	hpu_opts_defaults(&a->train);
	if (from_env(a, err, errlen) < 0)
		return -1;
	static char wpath[PATH_MAX];
	if (worker_path(wpath, sizeof wpath) < 0 || add_args(a, (char *[]){wpath}, 0, 1) < 0) {
		snprintf(err, errlen, "cannot find hpu-worker");
		return -1;
	}
	int i = 1;
	while (i < argc) {
		const char *arg = argv[i];
		if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
			hpu_args_usage(stdout);
			return 1;
		}
		if (!strcmp(arg, "--exec")) {
			if (i + 1 >= argc) {
				snprintf(err, errlen, "--exec needs a program");
				return -1;
			}
			a->exec_mode = 1;
			a->worker_argc = 0;
			add_args(a, argv, i + 1, argc);
			return check_plan(a, err, errlen);
		}
		int r = launcher_opt(a, argc, argv, &i, err, errlen);
		if (r < 0)
			return -1;
		if (r)
			continue;
		if (strncmp(arg, "--", 2) != 0 || !arg[2])
			break; /* the model */
		int start = i;
		if (train_opt(a, argc, argv, &i, err, errlen) < 0 ||
		    add_args(a, argv, start, i) < 0)
			return -1;
	}
	if (i >= argc || argv[i][0] == '-') {
		snprintf(err, errlen, "no model given: hpulaunch [options] MODEL.so (see --help)");
		return -1;
	}
	if (access(argv[i], R_OK) != 0) {
		snprintf(err, errlen, "cannot read the model %s: %s", argv[i], strerror(errno));
		return -1;
	}
	if (add_args(a, argv, i, argc) < 0) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return check_plan(a, err, errlen);
}

void hpu_args_free(hpu_launch_args *a)
{
	free(a->worker_argv);
	a->worker_argv = NULL;
}
