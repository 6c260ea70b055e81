/* args_impl: what the files of hpulaunch's command line share (args.c
 * parses, args_table.c holds the option table, args_opts.c sets the
 * launcher's own options, args_plan.c with args_hosts.c and
 * args_devices.c makes the plan). Calls go one way: args.c to the others,
 * args_plan.c to args_hosts.c and args_devices.c. launcher/ only. */
#ifndef HPU_ARGS_IMPL_H
#define HPU_ARGS_IMPL_H

#include "launcher/args.h"
#include "common/opt.h"

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

/* The settings that several options give (--devices, --nproc-per-node
 * and --num_gpus; --nodes, --nnodes and --num_nodes; --master-addr,
 * --master-port and --rdzv-endpoint; ...). */
enum { A_NODES, A_DEVICES, A_RANK, A_ADDR, A_PORT, A_JOB, A_RESTARTS, A_COUNT };

typedef struct sources {
	unsigned flag, env;
	/* environment values that are not what they set: an error only
	 * where no flag (or --standalone) sets it instead (hpu__args_plan) */
	const char *bad_port, *bad_rank, *bad_addr, *bad_job;
	/* the last flag that gave each setting of A_*: its name and value */
	const char *by[A_COUNT], *as[A_COUNT];
} sources;

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

/* The parser's table and the help's (args_table.c). */
extern const hpu_optspec hpu__args_specs[];

/* The message of an option hpu__optparse_next refused (code r): -1. */
int hpu__args_option_error(const hpu_optparse *p, int r, char *err, size_t errlen);

/* A bad numeric value of an option whose plural is the launcher's: says
 * so after err. */
void hpu__args_plural_hint(const hpu_optparse *p, char *err, size_t errlen);

/* Refuses hpulaunch's own options after the model argv[model], before
 * "--": 0, or -1 with a sentence in err. */
int hpu__args_options_after_model(char **argv, int argc, int model, char *err, size_t errlen);

/* Sets the launcher option p has read (id k); 0, or -1 with a sentence in
 * err (args_opts.c). */
int hpu__args_opt(hpu_launch_args *a, sources *src, const hpu_optparse *p, int k, char *err,
		  size_t errlen);

/* MASTER_ADDR, MASTER_PORT, NODE_RANK, HPU_JOB_ID, HPU_JOB_TOKEN, ...
 * into a, noted in src->env; 0, or -1 with a sentence in err. */
int hpu__args_from_env(hpu_launch_args *a, sources *src, char *err, size_t errlen);

/* After the command line: the plan filled in and checked (args_plan.c);
 * 0, or -1 with a sentence in err. */
int hpu__args_finish(hpu_launch_args *a, const sources *src, int extra_args, char *err,
		     size_t errlen);

/* --hostfile's plan (args_hosts.c); 0, or -1 with a sentence in err. */
int hpu__args_hostfile_plan(hpu_launch_args *a, const sources *src, char *err, size_t errlen);

/* The hpu-worker next to this executable, or $HPU_WORKER (args_devices.c):
 * 0, or -1. */
int hpu__args_worker_path(char *out, size_t outlen);

/* --devices auto counted by GPUs or cores (args_devices.c); 0, or -1
 * with a sentence in err. */
int hpu__args_auto_devices(hpu_launch_args *a, const sources *src, char *err, size_t errlen);

#endif
