/* slurm: what hpulaunch takes from a Slurm job step's environment, and
 * Slurm's hostlist syntax ("node[01-03,07],gpu-a,rack[1-2]-n[3-4]").
 *
 * hpulaunch runs once per node under srun:
 *
 *     srun -N2 --ntasks-per-node=1 hpulaunch --devices 8 MODEL.so
 *
 * and takes its node rank from SLURM_NODEID (SLURM_PROCID when that is
 * absent; the two are equal with one task per node), the node count from
 * the step's task count, node 0's address from the first host of the
 * step's node list, and the job id, master port and (without
 * HPU_JOB_TOKEN) the job token from SLURM_JOB_ID. Only a job step started
 * by srun counts: a batch script or an salloc shell has SLURM_JOB_ID but
 * no SLURM_STEP_ID of a real step, and hpulaunch there runs as it would
 * outside Slurm. */
#ifndef HPU_SLURM_H
#define HPU_SLURM_H

#include <stddef.h>

#define HPU_SLURM_MAX_HOSTS 65536 /* hosts one hostlist may expand to */

typedef struct hpu_slurm {
	int present;   /* inside an srun job step; the rest is set only then */
	long job_id;   /* SLURM_JOB_ID */
	int step_id;   /* SLURM_STEP_ID */
	int procid;    /* SLURM_PROCID: this task's rank in the step */
	int nodeid;    /* SLURM_NODEID: this node's index in the step; -1: unset */
	int nnodes;    /* nodes in the step (SLURM_STEP_NUM_NODES, else
			* SLURM_NNODES, else the node list's length) */
	int ntasks;    /* tasks in the step (SLURM_STEP_NUM_TASKS, else
			* SLURM_NTASKS); 0: unset */
	char first_host[256]; /* the node list's first host: node 0 */
} hpu_slurm;

/* Reads the Slurm environment into s. Returns 0 with s->present 0 outside
 * a job step, or 0 with everything filled in; -1 with a sentence in err
 * naming the variable when a step's variable is missing or malformed. */
int hpu__slurm_read(hpu_slurm *s, char *err, size_t errlen);

/* Expands a Slurm hostlist: comma-separated hosts, each with any number of
 * bracketed ranges ("n[1-3,7]", "rack[1-2]-n[3-4]"), keeping the low
 * bound's zero padding ("node[08-10]": node08 node09 node10); ranges
 * multiply out leftmost first, as Slurm orders them. On success *hosts is
 * a malloc'ed array of *n malloc'ed names that the caller releases with
 * hpu__slurm_hostlist_free() and returns 0; -1 with a sentence in err on a
 * syntax error or more than HPU_SLURM_MAX_HOSTS hosts (then *hosts is
 * NULL). */
int hpu__slurm_hostlist_expand(const char *list, char ***hosts, int *n,
			       char *err, size_t errlen);

/* Frees what hpu__slurm_hostlist_expand returned; hosts may be NULL. */
void hpu__slurm_hostlist_free(char **hosts, int n);

/* The master port every node of job job_id agrees on:
 * 20000 + job_id % 20000. */
int hpu__slurm_master_port(long job_id);

/* The job token every node of job job_id agrees on without being told:
 * the hex SHA-256 of "hputrain-slurm-<job_id>" (64 characters and a NUL
 * into out). It is NOT a secret: anyone who knows the job id can compute
 * it, so it keeps apart jobs, not users. To keep other users out, export
 * HPU_JOB_TOKEN (e.g. `export HPU_JOB_TOKEN=$(openssl rand -hex 32)`)
 * before srun, which passes the environment on to every node. */
void hpu__slurm_token(long job_id, char out[65]);

#endif
