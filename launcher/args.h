/* args: hpulaunch's command line and environment, resolved into one plan. */
#ifndef HPU_ARGS_H
#define HPU_ARGS_H

#include "config.h"

typedef struct hpu_launch_args {
	int nodes, devices, node_rank;
	char master_addr[256];
	int master_port;     /* 0: pick a free one (single node only) */
	char job_id[64];
	char token[129];
	const char *log_dir;
	const char *transport; /* --transport: exported as HPUCOLL_TRANSPORT */
	double join_timeout_s;
	double agent_timeout_s;
	double grace_s;      /* SIGTERM to SIGKILL */
	int quiet;
	/* What each worker runs: argv for execve / execvp. */
	char **worker_argv;
	int worker_argc;
	int exec_mode;       /* --exec: argv[0] is looked up in PATH */
	hpu_train_opts train;
} hpu_launch_args;

/* Parses argv and the environment (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
 * NODE_RANK, HPU_JOB_ID, HPU_JOB_TOKEN). Returns 0; 1 if --help was
 * printed; -1 with a sentence in err. */
int hpu_args_parse(hpu_launch_args *a, int argc, char **argv, char *err,
		   size_t errlen);

void hpu_args_free(hpu_launch_args *a);

void hpu_args_usage(FILE *f);

#endif
