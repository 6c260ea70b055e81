/* env: every environment variable the system reads or sets for its
 * workers, in one table (NCCL's NCCL_PARAM idea). Code names a variable by
 * its id, so reading one without an id does not compile, and the launch
 * variables have one name on the side that sets them (the agent) and the
 * side that reads them (hpu-worker, libhpucoll).
 *
 * `hpulaunch --help-env` prints the table and README.md's "Environment
 * variables" lists it; tests/check_env.sh fails when a getenv() names a
 * variable the table lacks, or when either of those misses an entry. */
#ifndef HPU_COMMON_ENV_H
#define HPU_COMMON_ENV_H

#include <stdio.h>

/* HPU_ENV_ + the variable's name, always. */
typedef enum hpu_env_id {
	/* The launch environment: the agent (hpulaunch or hpud) sets these
	 * for every worker it starts. */
	HPU_ENV_RANK,
	HPU_ENV_LOCAL_RANK,
	HPU_ENV_WORLD_SIZE,
	HPU_ENV_LOCAL_WORLD_SIZE,
	HPU_ENV_NODE_RANK,
	HPU_ENV_NNODES,
	HPU_ENV_MASTER_ADDR,
	HPU_ENV_MASTER_PORT,
	HPU_ENV_HPU_JOB_ID,
	HPU_ENV_HPU_JOB_TOKEN,
	HPU_ENV_HPUCOLL_TRANSPORT,
	HPU_ENV_HPU_DEVICE_ID,
	HPU_ENV_HPU_DEVICE,
	HPU_ENV_HPU_STRICT_KERNELS,
	HPU_ENV_HPU_STRICT_STEP,
	HPU_ENV_HPU_GRAPHS_FAIL_BEGIN,
	HPU_ENV_HPU_CUDA_MODULE,
	HPU_ENV_HPU_CUDNN_FIND,
	HPU_ENV_HPU_CUDNN_LOG,
	HPU_ENV_HPU_FUSED_ATTENTION,
	HPU_ENV_HPU_FP8_NATIVE,
	HPU_ENV_HPU_RESTART_COUNT,
	HPU_ENV_HPU_MAX_RESTARTS,
	HPU_ENV_HPU_STATUS_FD,
	HPU_ENV_HPU_PROFILE_SYNC,
	HPU_ENV_HPU_PROFILE_KERNELS,
	HPU_ENV_HPU_MEMORY_PEAK,
	HPU_ENV_HPU_CUPTI_LIB,
	HPU_ENV_HPU_NCCL_LIB,
	HPU_ENV_OPENBLAS_NUM_THREADS,
	HPU_ENV_OMP_NUM_THREADS,
	/* The same launch, in torchrun's names (torch.distributed.elastic,
	 * Lightning's TorchElasticEnvironment) and DeepSpeed's launcher's. */
	HPU_ENV_GROUP_RANK,
	HPU_ENV_ROLE_RANK,
	HPU_ENV_ROLE_WORLD_SIZE,
	HPU_ENV_TORCHELASTIC_RESTART_COUNT,
	HPU_ENV_TORCHELASTIC_MAX_RESTARTS,
	HPU_ENV_TORCHELASTIC_RUN_ID,
	HPU_ENV_CROSS_RANK,
	HPU_ENV_CROSS_SIZE,
	HPU_ENV_LOCAL_SIZE,
	/* The collectives (libhpucoll). */
	HPU_ENV_HPUCOLL_SECURITY,
	HPU_ENV_HPUCOLL_TIMEOUT_MS,
	HPU_ENV_HPUCOLL_HEARTBEAT_MS,
	HPU_ENV_HPUCOLL_STALL_WARN_MS,
	HPU_ENV_HPUCOLL_ALGO,
	HPU_ENV_HPUCOLL_SMALL_BYTES,
	HPU_ENV_HPUCOLL_BCAST_SMALL_BYTES,
	HPU_ENV_HPUCOLL_REDUCE_SMALL_BYTES,
	HPU_ENV_HPUCOLL_IO_THREADS,
	HPU_ENV_HPU_JOIN_TIMEOUT_MS,
	HPU_ENV_HPU_DATA_ADDR,
	/* The worker: precision lists, fp8 inference, kernels. */
	HPU_ENV_LOWER_LIST,
	HPU_ENV_FP32_LIST,
	HPU_ENV_PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST,
	HPU_ENV_PT_HPU_AUTOCAST_FP32_OPS_LIST,
	HPU_ENV_QUANT_CONFIG,
	HPU_ENV_HPU_BACKEND,
	HPU_ENV_HPU_DNNL_CONV_LAYOUT,
	HPU_ENV_ONEDNN_MAX_CPU_ISA,
	/* hpulaunch and the tools. */
	HPU_ENV_HPU_WORKER,
	HPU_ENV_HPU_KEY_FILE,
	HPU_ENV_TERM,
	HPU_ENV_PATH,
	HPU_ENV_TMPDIR,
	/* systemd's, for hpud as a service (never passed to workers). */
	HPU_ENV_NOTIFY_SOCKET,
	HPU_ENV_JOURNAL_STREAM,
	/* Every program's log (common/log.h). */
	HPU_ENV_HPU_LOG_LEVEL,
	/* Slurm's, read by hpulaunch inside srun (several names: the first
	 * one set wins, in the order launcher/slurm.c asks). */
	HPU_ENV_SLURM_JOB_ID,
	HPU_ENV_SLURM_JOBID,
	HPU_ENV_SLURM_STEP_ID,
	HPU_ENV_SLURM_STEPID,
	HPU_ENV_SLURM_PROCID,
	HPU_ENV_SLURM_NODEID,
	HPU_ENV_SLURM_STEP_NUM_TASKS,
	HPU_ENV_SLURM_NTASKS,
	HPU_ENV_SLURM_STEP_NUM_NODES,
	HPU_ENV_SLURM_NNODES,
	HPU_ENV_SLURM_STEP_NODELIST,
	HPU_ENV_SLURM_JOB_NODELIST,
	HPU_ENV_SLURM_NODELIST,
	HPU_ENV_COUNT /* not a variable: the number of them, and a list's end */
} hpu_env_id;

/* One table entry. */
typedef struct hpu_env_var {
	const char *name; /* "RANK" */
	const char *dflt; /* the default, as text; "" when unset means none */
	const char *who;  /* the programs that read it (and set it) */
	const char *what; /* one line: what it does */
} hpu_env_var;

/* The table entry of id, which must be below HPU_ENV_COUNT. */
const hpu_env_var *hpu__env_var_of(hpu_env_id id);

/* The variable's name: hpu__env_name(HPU_ENV_RANK) is "RANK". */
const char *hpu__env_name(hpu_env_id id);

/* Its value as getenv() gives it: NULL when unset, maybe "". */
const char *hpu__env_str(hpu_env_id id);

/* Reads the variable as a whole decimal number lo..hi. Returns 1 with
 * *out set; 0 when it is unset or empty (*out untouched); -1 when it is
 * not such a number (*out untouched, errno EINVAL or ERANGE). */
int hpu__env_long(hpu_env_id id, long lo, long hi, long *out);

/* The id of the variable that s names ("NAME", or an environment entry
 * "NAME=VALUE"); -1 for a name the table lacks: the table is the one list
 * of the variables we read, so reading another one is a bug. */
int hpu__env_find(const char *s);

/* Whether id is one of list (ended by HPU_ENV_COUNT). */
int hpu__env_in(hpu_env_id id, const hpu_env_id *list);

/* Prints the table for --help-env: each variable with its default and
 * readers, then its description. */
void hpu__env_print(FILE *f);

#endif
