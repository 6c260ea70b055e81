/* args_plan: after the command line, the job's plan: --status, the
 * hostfile, Slurm or --standalone fill in what flags left, and the whole
 * is checked (world size, transports, job identity, training options). */
#include "launcher/args_impl.h"
#include "common/env.h"
#include "common/hex.h"
#include "common/log.h"
#include "common/num.h"
#include "launcher/modelcheck.h"
#include "launcher/slurm.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* The environment's bad values (hpu__args_from_env) that no flag, nor
 * --standalone, set instead: refused. (A flag won only over good ones:
 * MASTER_PORT=abc failed beside --master-port 5000 or --standalone.) */
static int env_refused(const hpu_launch_args *a, const sources *src, char *err, size_t errlen)
{
	if (src->bad_port && !(src->flag & SET_PORT) && !a->standalone) {
		snprintf(err, errlen, "MASTER_PORT='%.60s' is not a port number", src->bad_port);
		return -1;
	}
	if (src->bad_rank && !(src->flag & SET_RANK) && !a->standalone) {
		snprintf(err, errlen, "NODE_RANK='%.60s' is not a node rank", src->bad_rank);
		return -1;
	}
	if (src->bad_addr && !(src->flag & SET_ADDR) && !a->standalone) {
		snprintf(err, errlen, "MASTER_ADDR is %zu characters, more than the %zu an address may have",
			 strlen(src->bad_addr), sizeof a->master_addr - 1);
		return -1;
	}
	if (src->bad_job && !(src->flag & SET_JOB_ID)) {
		snprintf(err, errlen, "HPU_JOB_ID='%.60s...' is %zu characters, more than the %zu a job id may have",
			 src->bad_job, strlen(src->bad_job), sizeof a->job_id - 1);
		return -1;
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
 * declared numbers. Where the file cannot tell them and the batch is the
 * built-in default (the model's would take its place), a failed division
 * of the batch (among the workers, or by --grad-accum) is left to the
 * workers, which load the model, saying so. */
static int resolve_train(hpu_launch_args *a, int world, char *err, size_t errlen)
{
	char why[256] = "", other[1024];
	int known = a->model ? model_numbers(a, why, sizeof why, err, errlen) : 0;
	if (known == -2)
		return -1;
	hpu_train_opts before = a->train;
	if (hpu__opts_resolve(&a->train, world, err, errlen) == 0)
		return 0;
	/* a file that is no model keeps the batch's error (hpu__model_check
	 * says what it is after the command line), as does a batch given:
	 * no declared default takes its place (it re-resolved at world 1
	 * and said "world size 1" where --grad-accum did not divide) */
	if (known >= 0 || hpu__opts_from(&a->train, "batch-size") != HPU_FROM_DEFAULT ||
	    hpu__model_check(a->model, other, sizeof other) < 0)
		return -1;
	a->train = before; /* the workers resolve it with the model's batch */
	char who[48] = "the worker checks";
	if (world > 1)
		snprintf(who, sizeof who, "the %d workers check", world);
	hpu__log(HPU_LOG_NOTICE, "note: the model %s may declare its own batch size, which cannot be read from the file (%s): %s the batch when they load the model",
		 a->model, why, who);
	err[0] = '\0';
	return 0;
}

static int check_plan(hpu_launch_args *a, const sources *src, char *err, size_t errlen)
{
	const char *ws = hpu__env_str(HPU_ENV_WORLD_SIZE);
	int world = a->nodes * a->devices, w;
	if (a->hostfile) {
		world = 0;
		for (int i = 0; i < a->nhosts; i++)
			world += a->hosts[i].slots;
	}
	a->world = world;
	if (ws && *ws && hpu__parse_int(ws, 1, 1 << 24, &w)) {
		snprintf(err, errlen, "WORLD_SIZE='%.40s' from the environment is not a number of ranks", ws);
		return -1;
	}
	if (ws && *ws && w != world) {
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
		/* named as given (NODE_RANK=5 was said as --node-rank 5) */
		if (!(src->flag & SET_RANK) && (src->env & SET_RANK))
			snprintf(err, errlen, "NODE_RANK=%d from the environment is not below --nodes %d",
				 a->node_rank, a->nodes);
		else
			snprintf(err, errlen, "--node-rank %d is not below --nodes %d", a->node_rank,
				 a->nodes);
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

/* After the command line: --status needs nothing more; otherwise the
 * hostfile or Slurm fill in the plan, which is then checked. */
int hpu__args_finish(hpu_launch_args *a, const sources *src, int extra_args, char *err,
		     size_t errlen)
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
	if (a->exec_mode && a->hostfile) {
		snprintf(err, errlen, "--exec does not go with --hostfile: each node's hpud runs the worker its "
				      "configuration names (hpud.conf's worker), not a program of hpulaunch's command line");
		return -1;
	}
	if ((a->include || a->exclude) && !a->hostfile) {
		snprintf(err, errlen, "%s picks hosts of a --hostfile: give one (DeepSpeed's hostfile format: HOST slots=N)",
			 a->include ? "--include" : "--exclude");
		return -1;
	}
	if (env_refused(a, src, err, errlen) < 0)
		return -1;
	if (a->standalone) {
		if (standalone_plan(a, src, err, errlen) < 0)
			return -1;
	} else if (a->hostfile ? hpu__args_hostfile_plan(a, src, err, errlen)
			       : slurm_plan(a, src, err, errlen)) {
		return -1;
	}
	if ((src->flag & SET_DEVICES_AUTO) && !(src->flag & SET_DEVICES_CORES) &&
	    hpu__args_auto_devices(a, src, err, errlen) < 0)
		return -1;
	return check_plan(a, src, err, errlen);
}
