/* args: hpulaunch's command line and environment, resolved into one plan. */
#ifndef HPU_ARGS_H
#define HPU_ARGS_H

#include "options/config.h"
#include "launcher/hostfile.h"
#include "agent/progress.h"

typedef struct hpu_launch_args {
	int nodes, devices, node_rank;
	/* Ranks in the job: nodes x devices; with --hostfile, the sum of the
	 * hosts' slots (hosts may differ; devices is then node 0's). */
	int world;
	char master_addr[256];
	int master_port;     /* 0: pick a free one (single node only) */
	char job_id[64];
	char token[129];
	const char *log_dir;
	const char *transport; /* --transport: exported as HPUCOLL_TRANSPORT */
	const char *data_plane; /* --data-plane: exported as HPUCOLL_SECURITY */
	const char *log_level;  /* --log-level: set, and exported as HPU_LOG_LEVEL */
	double join_timeout_s;
	double agent_timeout_s;
	double grace_s;      /* SIGTERM to SIGKILL */
	/* --max-restarts K (0..HPU_MAX_RESTARTS_LIMIT): a failed job is
	 * stopped and started again up to K times (restart.h). */
	int max_restarts;
	/* --standalone (torchrun's): one node, the coordinator on loopback at
	 * a free port; MASTER_ADDR, MASTER_PORT and NODE_RANK from the
	 * environment and Slurm's variables are ignored. */
	int standalone;
	int quiet;
	/* --progress: HPU_PROGRESS_AUTO (the default), _ALWAYS or _NEVER
	 * (progress.h): rank 0's progress bar on stdout. */
	int progress;
	/* What each worker runs: argv for execve / execvp. */
	char **worker_argv;
	/* The model as the workers get it: an absolute path (a relative one
	 * resolved against this process's directory, so neither the dynamic
	 * loader's search path nor hpud's directory decides which file it
	 * is). NULL with --exec or --status; malloc'ed, freed by
	 * hpu__args_free. */
	char *model;
	int worker_argc;
	/* Strings of worker_argv that hpu__args_parse made (absolute paths
	 * for --hostfile), malloc'ed, freed by hpu__args_free. */
	char **owned;
	int nowned;
	int exec_mode;       /* --exec: argv[0] is looked up in PATH */
	const char *exec_ignored; /* --exec: the first training option given
				   * before it, which the program does not get */
	hpu_train_opts train;

	/* --hostfile FILE: the job's nodes in node-rank order; nodes = nhosts,
	 * node_rank 0, master_addr the first host unless MASTER_ADDR is set.
	 * Each host's port is its hpud port (hpud_port where the file gives
	 * none), its slots the workers it runs (--devices on each, else the
	 * file's slots=N, which may differ from host to host). NULL / 0
	 * without --hostfile. Freed by hpu__args_free. */
	const char *hostfile;
	hpu_host *hosts;
	int nhosts;
	/* DeepSpeed's --include / --exclude HOST@HOST...: the hostfile's hosts
	 * kept or dropped (whole hosts; HOST:SLOTS is refused). NULL: all. */
	const char *include, *exclude;
	/* --status HOST[:PORT]: print that hpud's jobs instead of running one
	 * (no model, no plan); status_port is PORT, else hpud_port. NULL
	 * otherwise; malloc'ed, freed by hpu__args_free. */
	char *status_host;
	int status_port;
	int hpud_port;        /* --hpud-port: the daemons' control port (29400) */
	const char *key_path; /* --key, else $HPU_KEY_FILE, else
			       * /etc/hpud/secret.key: the cluster secret */
	/* Inside an srun job step: node rank, nodes, master address and port
	 * and job id not given by flags or environment came from SLURM_*. */
	int from_slurm;
	/* The token was derived from SLURM_JOB_ID because HPU_JOB_TOKEN was not
	 * set: it is no secret (anyone who knows the job id can make it). */
	int weak_token;
} hpu_launch_args;

#define HPU_HPUD_PORT 29400
#define HPU_KEY_FILE_DEFAULT "/etc/hpud/secret.key"

/* Parses argv and the environment (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
 * NODE_RANK, HPU_JOB_ID, HPU_JOB_TOKEN, HPU_KEY_FILE, and inside an srun
 * job step SLURM_*; flags beat the environment, which beats Slurm).
 * Returns 0; 1 if --help was printed; -1 with a sentence in err. Call
 * hpu__args_free afterwards whatever it returned. */
int hpu__args_parse(hpu_launch_args *a, int argc, char **argv, char *err,
		    size_t errlen);

/* Frees what hpu__args_parse allocated; safe twice. */
void hpu__args_free(hpu_launch_args *a);

/* Prints hpulaunch's --help text. */
void hpu__args_usage(FILE *f);

/* Prints hpulaunch's options, its own and the training options, in the
 * format named (hpu__optdoc_format: help, scdoc, markdown): the OPTIONS of
 * its manual page and docs/reference/hpulaunch.md. Returns 0, or -1 for
 * a format it does not know. */
int hpu__args_doc(FILE *f, const char *format);

#endif
