/* env: see env.h. The table below is the one list of the environment
 * variables the system reads; keep README.md's "Environment variables" in
 * step (tests/check_env.sh compares them). */
#include "common/env.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"

/* VAR(NAME, default, who, what): the entry of HPU_ENV_NAME, whose name is
 * NAME (so an id and its name cannot disagree). In "who", the agent is
 * hpulaunch's or hpud's (agent), libhpucoll any program that joins
 * a job through hpucoll_comm_init_env (hpu-worker, an --exec program). */
#define VAR(name, dflt, who, what) [HPU_ENV_##name] = {#name, dflt, who, what}

static const hpu_env_var table[HPU_ENV_COUNT] = {
	VAR(RANK, "", "libhpucoll, hpu-worker; set by the agent",
	    "this worker's rank in the job, 0..WORLD_SIZE-1"),
	VAR(LOCAL_RANK, "", "libhpucoll, hpu-worker; set by the agent",
	    "this worker's rank on its node (which cores its kernels take)"),
	VAR(WORLD_SIZE, "",
	    "libhpucoll, hpu-worker, hpulaunch; set by the agent",
	    "workers in the job; given to hpulaunch, it must equal nodes x "
	    "devices (--hostfile: the sum of the slots)"),
	VAR(LOCAL_WORLD_SIZE, "", "hpu-worker; set by the agent",
	    "workers on this node (they share its memory as device memory)"),
	VAR(NODE_RANK, "0",
	    "libhpucoll, hpu-worker, hpulaunch; set by the agent",
	    "this node's rank, 0..nodes-1 (hpulaunch: as --node-rank)"),
	VAR(NNODES, "", "models; set by the agent",
	    "nodes in the job"),
	VAR(MASTER_ADDR, "127.0.0.1", "libhpucoll, hpulaunch; set by the agent",
	    "node 0's address, where the coordinator listens (hpulaunch: as "
	    "--master-addr)"),
	VAR(MASTER_PORT, "", "libhpucoll, hpulaunch; set by the agent",
	    "the coordinator's port on node 0 (hpulaunch: as --master-port; "
	    "single node: a free port)"),
	VAR(HPU_JOB_ID, "",
	    "libhpucoll, hpu-worker, hpulaunch; set by the agent",
	    "the job's id: at most 63 letters, digits, '-', '_' or '.' "
	    "(hpulaunch: as --job-id)"),
	VAR(HPU_JOB_TOKEN, "", "libhpucoll, hpulaunch; set by the agent",
	    "the job's secret, the same on every node (required for several "
	    "nodes)"),
	VAR(HPUCOLL_TRANSPORT, "auto",
	    "libhpucoll, hpulaunch; set by the agent",
	    "auto, tcp, ipc or shm: how ranks reach each other (as "
	    "--transport)"),
	VAR(HPU_DEVICE_ID, "", "models; set by the agent",
	    "the device this worker drives (its local rank unless hpud maps "
	    "devices)"),
	VAR(HPU_DEVICE, "cpu", "hpulaunch, hpu-worker",
	    "the device workers compute on when --device is not given: cpu, "
	    "cpu-strict, cuda or auto"),
	VAR(HPU_STRICT_KERNELS, "0", "hpu-worker",
	    "1: under --device cpu-strict, device memory opens only inside the "
	    "kernel table and the runtime's ops, not for a whole layer (tests: "
	    "host loops in the ops fault as they would on a GPU)"),
	VAR(HPU_STRICT_STEP, "0", "hpu-worker",
	    "1: under --device cpu-strict, a device operation that brings a "
	    "value or bytes back to the host (a device-to-host copy, a check or "
	    "norm returned as a value, a wait on the host) inside a training "
	    "step ends the worker naming it, as a recorded step (--graphs) "
	    "could not do it on a GPU (tests; meant for 1 worker: between "
	    "workers cpu-strict stages the collectives through host memory)"),
	VAR(HPU_GRAPHS_FAIL_BEGIN, "", "hpu-worker",
	    "tests: the rank (a number) whose --graphs recordings fail to "
	    "begin, as running out of host memory would make them; the ranks "
	    "then agree to run that step eagerly"),
	VAR(HPU_CUDA_MODULE, "", "hpu-worker, test_cuda_device",
	    "the CUDA device's module to load for --device cuda or auto "
	    "(default: hpudev_cuda.so in ../lib or ../LIBDIR/hputrain beside "
	    "hpu-worker)"),
	VAR(HPU_CUDNN_FIND, "0", "hpu-worker",
	    "1: on --device cuda, each convolution shape's algorithms are timed "
	    "by cuDNN once (its Find) and the fastest exact, deterministic one "
	    "kept; 0: cuDNN's heuristics choose"),
	VAR(HPU_CUDNN_LOG, "0", "hpu-worker",
	    "1: on --device cuda, each new convolution shape's algorithm "
	    "candidates (cuDNN's heuristics', or Find's with their times under "
	    "`HPU_CUDNN_FIND=1`) and the ones chosen, one line a direction on "
	    "stderr (`hpu-worker: cudnn: ...`: algorithm:ms, d or n "
	    "deterministic, f or t the math, MiB of workspace, x where the exact "
	    "rule takes none such, * the choice); bench/gpu.sh prints them for "
	    "the CNN"),
	VAR(HPU_FUSED_ATTENTION, "0", "hpu-worker",
	    "1: the attention layer runs fused (flash-style) kernels, keeping "
	    "each query's log-sum-exp instead of the [B, heads, T, T] "
	    "probabilities (on the CPU: the host's row loops); not yet verified "
	    "on a GPU; 0: linear, bmm, softmax, bmm"),
	VAR(HPU_FP8_NATIVE, "1", "hpu-worker",
	    "1: --precision fp8's linear products run on the GPU's fp8 tensor "
	    "cores where it has them (cuBLASLt, sm_89 and later; shapes whose "
	    "sizes are multiples of 16); 0: on the bf16 kernels, exactly, as "
	    "on the CPU (the quantized values are bf16 values)"),
	VAR(HPU_RESTART_COUNT, "0", "hpu-worker; set by the agent",
	    "which attempt of the job this is (0, then 1, 2, ... after "
	    "restarts): resume, trace names"),
	VAR(HPU_MAX_RESTARTS, "0", "models; set by the agent",
	    "--max-restarts: how many times the job may be restarted"),
	VAR(HPU_STATUS_FD, "3", "hpu-worker; set by the agent",
	    "the pipe a worker writes its progress records to (see Live "
	    "progress)"),
	VAR(HPU_PROFILE_SYNC, "0", "hpu-worker",
	    "1: with --profile, the main thread waits for the device's queued "
	    "work at every range's start and end, so that on a GPU a layer's "
	    "range is the device's time for it, not the host's time to issue "
	    "its kernels (slower: no overlap); the CPU devices finish work as "
	    "it is issued and are not changed"),
	VAR(HPU_PROFILE_KERNELS, "", "hpu-worker",
	    "a directory: on --device cuda, every kernel, copy and memset the "
	    "GPU runs is timed by CUPTI and summed by name, eager or in a "
	    "replayed graph, into DIR/kernels-rank<R>.txt at the worker's end, "
	    "the costliest first, with each kernel's grid and block (made if "
	    "missing; no --profile needed)"),
	VAR(HPU_MEMORY_PEAK, "", "hpu-worker",
	    "a directory: the worker writes DIR/memory-peak-rank<R>.txt at its "
	    "end (and at its first refused allocation), the device memory live "
	    "at its peak (InUse's maximum) summed by name (layer indices "
	    "folded: one line for every block's \"activations h#.fc1\"), by "
	    "kind and by allocation, largest first, and the refusal if one was "
	    "refused (made with its parents when the device is set up; any "
	    "device)"),
	VAR(HPU_CUPTI_LIB, "", "hpu-worker",
	    "the CUPTI library HPU_PROFILE_KERNELS opens (default: "
	    "libcupti.so.13 on the loader's path, then /usr/local/cuda's)"),
	VAR(HPU_NCCL_LIB, "", "hpu-worker",
	    "the NCCL library --collectives nccl opens (default: libnccl.so.2 "
	    "on the loader's path, then /usr/local/cuda's)"),
	VAR(OPENBLAS_NUM_THREADS, "1", "OpenBLAS; set by the agent unless set",
	    "BLAS threads per worker for the reference kernels"),
	VAR(OMP_NUM_THREADS, "1", "OpenMP; set by the agent unless set",
	    "OpenMP threads per worker (torchrun's default); --kernel-threads "
	    "sets oneDNN's own"),
	VAR(GROUP_RANK, "", "models; set by the agent",
	    "torchrun's name for the node rank (NODE_RANK); Lightning looks "
	    "for it to detect torchelastic"),
	VAR(ROLE_RANK, "", "models; set by the agent",
	    "torchrun's rank within the worker's role: one role, so RANK"),
	VAR(ROLE_WORLD_SIZE, "", "models; set by the agent",
	    "torchrun's workers of the role: one role, so WORLD_SIZE"),
	VAR(TORCHELASTIC_RESTART_COUNT, "0", "models; set by the agent",
	    "torchrun's name for HPU_RESTART_COUNT"),
	VAR(TORCHELASTIC_MAX_RESTARTS, "0", "models; set by the agent",
	    "torchrun's name for HPU_MAX_RESTARTS (--max-restarts)"),
	VAR(TORCHELASTIC_RUN_ID, "", "models; set by the agent",
	    "torchrun's rendezvous id (--rdzv-id): the job id, HPU_JOB_ID"),
	VAR(CROSS_RANK, "", "models; set by the agent",
	    "DeepSpeed's launcher's name for the node rank (NODE_RANK)"),
	VAR(CROSS_SIZE, "", "models; set by the agent",
	    "DeepSpeed's launcher's name for the nodes (NNODES)"),
	VAR(LOCAL_SIZE, "", "models; set by the agent",
	    "DeepSpeed's launcher's name for the workers on this node "
	    "(LOCAL_WORLD_SIZE)"),
	VAR(HPUCOLL_SECURITY, "auth", "libhpucoll, hpulaunch",
	    "auth, encrypt or none: who may connect to a worker's data "
	    "socket (as --data-plane)"),
	VAR(HPUCOLL_TIMEOUT_MS, "60000", "libhpucoll",
	    "longest wait for a peer inside a collective; the error names "
	    "the rank (at least 1: hpulaunch and libhpucoll refuse 0 or "
	    "less, a wait without end)"),
	VAR(HPUCOLL_HEARTBEAT_MS, "30000", "libhpucoll",
	    "a data connection silent this long is closed and its peer "
	    "taken for lost (what was in flight on it is lost: a worker "
	    "stopped longer, by SIGSTOP, a debugger or a paused VM, fails "
	    "the job); at least 2000"),
	VAR(HPUCOLL_STALL_WARN_MS, "30000", "libhpucoll",
	    "warn once, naming the ranks that have and have not arrived, "
	    "when a collective has waited this long (0: never; "
	    "--stall-warning wins)"),
	VAR(HPUCOLL_ALGO, "auto", "libhpucoll",
	    "force ring, rd (recursive doubling) or hier for all_reduce"),
	VAR(HPUCOLL_SMALL_BYTES, "262144; 2048 on shm", "libhpucoll",
	    "all_reduce: recursive doubling up to this many bytes, a ring "
	    "above (shm: all the ranks share memory)"),
	VAR(HPUCOLL_BCAST_SMALL_BYTES, "1048576", "libhpucoll",
	    "broadcast: a binomial tree up to this many bytes, a pipelined "
	    "chain above"),
	VAR(HPUCOLL_REDUCE_SMALL_BYTES, "1048576; 1024 on shm", "libhpucoll",
	    "reduce: a binomial tree up to this many bytes, ring "
	    "reduce-scatter and a gather above"),
	VAR(HPUCOLL_IO_THREADS, "1", "libhpucoll",
	    "ZeroMQ I/O threads per communicator (1..64)"),
	VAR(HPU_JOIN_TIMEOUT_MS, "900000", "libhpucoll",
	    "how long a worker waits for the coordinator's rank table (15 "
	    "min)"),
	VAR(HPU_DATA_ADDR, "", "libhpucoll",
	    "the address a worker binds its data socket to (unset: the local "
	    "address that routes to MASTER_ADDR)"),
	VAR(LOWER_LIST, "", "hpu-worker; carried to hpud by --hostfile",
	    "a file of op names (one a line) that autocast runs in low "
	    "precision"),
	VAR(FP32_LIST, "", "hpu-worker; carried to hpud by --hostfile",
	    "a file of op names (one a line) that autocast keeps in fp32"),
	VAR(PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST, "", "hpu-worker; carried to hpud by --hostfile",
	    "LOWER_LIST's newer name (Optimum Habana sets it); both are read"),
	VAR(PT_HPU_AUTOCAST_FP32_OPS_LIST, "", "hpu-worker; carried to hpud by --hostfile",
	    "FP32_LIST's newer name; both are read"),
	VAR(QUANT_CONFIG, "", "hpu-worker; carried to hpud by --hostfile",
	    "the JSON file of an fp8 inference run: measure, or quantize "
	    "(see Precision)"),
	VAR(HPU_BACKEND, "onednn", "libhpu, hpu-worker",
	    "reference: the reference kernels (plain C and OpenBLAS sgemm, "
	    "fp32) instead of oneDNN, for comparisons"),
	VAR(HPU_DNNL_CONV_LAYOUT, "blocked", "libhpu, hpu-worker",
	    "plain: the oneDNN convolutions on NCHW layouts instead of "
	    "blocked ones (for measuring); set at all, it also decides for "
	    "dx of layers with under 16 input channels, which otherwise run "
	    "plain (measured faster)"),
	VAR(ONEDNN_MAX_CPU_ISA, "", "oneDNN (in libhpu, hpu-worker)",
	    "oneDNN's own: the highest instruction set its kernels may use "
	    "(e.g. AVX512_CORE: no bf16 instructions; bf16 then runs "
	    "emulated, and the worker says so)"),
	VAR(HPU_WORKER, "", "hpulaunch",
	    "the worker program hpulaunch starts (unset: hpu-worker next to "
	    "hpulaunch)"),
	VAR(HPU_KEY_FILE, "/etc/hpud/secret.key", "hpulaunch",
	    "the cluster secret for hpud (as --key)"),
	VAR(TERM, "", "hpulaunch",
	    "--progress auto draws the bar on a terminal unless TERM is "
	    "unset or dumb"),
	VAR(PATH, "/usr/local/bin:/usr/bin:/bin",
	    "hpu-plot; the agent (--exec)",
	    "where hpu-plot finds gnuplot, and the agent an --exec PROGRAM"),
	VAR(TMPDIR, "/tmp", "hpu-plot",
	    "where hpu-plot makes its temporary directory"),
	VAR(NOTIFY_SOCKET, "", "hpud (libsystemd's sd_notify); not passed to workers",
	    "systemd's socket for Type=notify: hpud says READY=1 once it "
	    "listens, RELOADING=1 on SIGHUP, STOPPING=1, and STATUS="),
	VAR(JOURNAL_STREAM, "", "every program (common/log); not passed to workers",
	    "systemd's DEV:INO of the journal stream: when it is the program's "
	    "stderr, log lines carry priority prefixes (<3> error, <4> warning, "
	    "<5> notice, <6> info, <7> debug)"),
	VAR(HPU_LOG_LEVEL, "info",
	    "every program (hpulaunch, hpud, hpu-worker, the tools); carried to hpud by --hostfile",
	    "error | warning | notice | info | debug: lines above it are not "
	    "printed (--log-level; hpud: overrides log_level)"),
	VAR(SLURM_JOB_ID, "", "hpulaunch (in srun)",
	    "the Slurm job: the job id and master port; the job token when "
	    "HPU_JOB_TOKEN is unset"),
	VAR(SLURM_JOBID, "", "hpulaunch (in srun)",
	    "older name of SLURM_JOB_ID"),
	VAR(SLURM_STEP_ID, "", "hpulaunch (in srun)",
	    "the job step: hpulaunch reads Slurm's variables only inside an "
	    "srun step"),
	VAR(SLURM_STEPID, "", "hpulaunch (in srun)",
	    "older name of SLURM_STEP_ID"),
	VAR(SLURM_PROCID, "", "hpulaunch (in srun)",
	    "this task's rank in the step: the node rank when SLURM_NODEID "
	    "is unset"),
	VAR(SLURM_NODEID, "", "hpulaunch (in srun)",
	    "this node's index in the step: the node rank"),
	VAR(SLURM_STEP_NUM_TASKS, "", "hpulaunch (in srun)",
	    "tasks in the step: the nodes (one hpulaunch a node)"),
	VAR(SLURM_NTASKS, "", "hpulaunch (in srun)",
	    "tasks in the job, when SLURM_STEP_NUM_TASKS is unset"),
	VAR(SLURM_STEP_NUM_NODES, "", "hpulaunch (in srun)",
	    "nodes in the step, when SLURM_STEP_NUM_TASKS is unset"),
	VAR(SLURM_NNODES, "", "hpulaunch (in srun)",
	    "nodes in the job, when SLURM_STEP_NUM_NODES is unset too"),
	VAR(SLURM_STEP_NODELIST, "", "hpulaunch (in srun)",
	    "the step's hosts: the first one is MASTER_ADDR"),
	VAR(SLURM_JOB_NODELIST, "", "hpulaunch (in srun)",
	    "the job's hosts, when SLURM_STEP_NODELIST is unset"),
	VAR(SLURM_NODELIST, "", "hpulaunch (in srun)",
	    "older name of SLURM_JOB_NODELIST"),
};

#undef VAR

const hpu_env_var *hpu__env_var_of(hpu_env_id id)
{
	assert((unsigned)id < HPU_ENV_COUNT && table[id].name);
	return &table[id];
}

const char *hpu__env_name(hpu_env_id id)
{
	return hpu__env_var_of(id)->name;
}

const char *hpu__env_str(hpu_env_id id)
{
	return getenv(hpu__env_name(id));
}

int hpu__env_long(hpu_env_id id, long lo, long hi, long *out)
{
	const char *v = hpu__env_str(id);
	if (!v || !*v)
		return 0;
	int r = hpu__parse_long(v, lo, hi, out);
	if (r == HPU_NUM_OK)
		return 1;
	errno = r == HPU_NUM_RANGE ? ERANGE : EINVAL;
	return -1;
}

int hpu__env_find(const char *s)
{
	size_t n = strcspn(s, "=");
	for (int i = 0; i < HPU_ENV_COUNT; i++)
		if (table[i].name && !strncmp(table[i].name, s, n) && table[i].name[n] == '\0')
			return i;
	return -1;
}

int hpu__env_in(hpu_env_id id, const hpu_env_id *list)
{
	for (; *list != HPU_ENV_COUNT; list++)
		if (*list == id)
			return 1;
	return 0;
}

/* Prints text indented by 6, in lines of at most 78 columns (a longer
 * word gets a line of its own). */
static void print_wrapped(FILE *f, const char *text)
{
	enum { INDENT = 6, WIDTH = 78 };
	while (*text) {
		int n = (int)strlen(text), cut = n;
		if (n > WIDTH - INDENT) {
			cut = WIDTH - INDENT;
			while (cut > 0 && text[cut] != ' ')
				cut--;
			if (cut == 0)
				cut = (int)strcspn(text, " ");
		}
		fprintf(f, "%*s%.*s\n", INDENT, "", cut, text);
		text += cut;
		while (*text == ' ')
			text++;
	}
}

void hpu__env_print(FILE *f)
{
	fprintf(f, "Environment variables (the default in parentheses; who reads them):\n");
	for (int i = 0; i < HPU_ENV_COUNT; i++) {
		const hpu_env_var *v = &table[i];
		fprintf(f, "  %s", v->name);
		if (*v->dflt)
			fprintf(f, " (%s)", v->dflt);
		fprintf(f, ": %s\n", v->who);
		print_wrapped(f, v->what);
	}
}
