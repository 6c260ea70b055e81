/* hpu-worker: one training process, started by hpulaunch with RANK,
 * WORLD_SIZE, MASTER_ADDR, ... in its environment.
 *
 *   hpu-worker [training options] MODEL.so [-- model args]
 */
#include <hpu/coll.h>
#include <hpu/ops.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/ops/backend.h"
#include "options/config.h"
#include "worker/device/device.h"
#include "worker/hpu/devmem.h"
#include "common/env.h"
#include "worker/ops/fp8.h"
#include "common/log.h"
#include "worker/hpu/model.h"
#include "common/num.h"
#include "worker/runtime/crash.h"
#include "worker/runtime/same_opts.h"
#include "proto/status.h"
#include "worker/runtime/train.h"

/* The variable as a whole number; dflt when it is unset or not one. */
static int env_int(hpu_env_id id, int dflt)
{
	int v;
	return hpu__parse_int(hpu__env_str(id), INT_MIN, INT_MAX, &v) ? dflt : v;
}

/* How many ranks drive this rank's GPU: every rank's identity of its
 * GPU gathered (hpu__dev_gpu_ident; one all-gather that every rank
 * makes, whatever its device), then counted. 1 on the CPU devices. 0,
 * or -1 with a sentence in err. */
#define GPU_IDENT 320
static int gpu_sharers(hpucoll_comm *comm, int rank, int world, int *sharers, char *err,
		       size_t errlen)
{
	char mine[GPU_IDENT];
	hpu__dev_gpu_ident(mine, sizeof mine);
	char *all = calloc((size_t)world, GPU_IDENT);
	if (!all) {
		snprintf(err, errlen, "out of memory gathering the ranks' GPUs");
		return -1;
	}
	int rc = hpucoll_all_gather(comm, mine, all, GPU_IDENT, HPUCOLL_U8);
	if (rc) {
		snprintf(err, errlen, "gathering the ranks' GPUs failed: %s",
			 hpucoll_comm_why(comm, rc));
		free(all);
		return -1;
	}
	*sharers = hpu__dev_gpu_sharers(all, GPU_IDENT, world, rank);
	free(all);
	return 0;
}

/* --device-memory, or by default the device's memory shared by the
 * workers that drive it (hpu__dev_default_memory). */
static uint64_t device_memory(const hpu_train_opts *o, uint64_t capacity, int sharers)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	int local = env_int(HPU_ENV_LOCAL_WORLD_SIZE, 1);
	uint64_t host = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
	if (o->device_memory)
		return o->device_memory;
	return hpu__dev_default_memory(capacity, sharers, host, local);
}

/* The options the device takes (--device-memory, --allow-tf32,
 * --collectives nccl), after it
 * is open; --verbose says what they do there. Its memory in *capacity. */
static int device_configure(const hpu_train_opts *o, int rank, uint64_t *capacity, char *err,
			    size_t errlen)
{
	hpu__dev_config c = {.memory_limit = o->device_memory, .allow_tf32 = o->allow_tf32,
			     .graphs = o->graphs, .nccl = o->collectives == HPU_COLL_NCCL};
	char note[512];
	if (c.nccl && strcmp(hpu__dev_name(), "cuda") != 0) { /* --device auto found no GPU */
		snprintf(err, errlen, "--collectives nccl runs NCCL between GPUs: this worker's "
				      "device is %s, not cuda", hpu__dev_name());
		return -1;
	}
	if (hpu__dev_configure(&c, capacity, note, sizeof note, err, errlen) < 0)
		return -1;
	if (o->verbose && note[0])
		printf("rank %d: %s\n", rank, note);
	return 0;
}

/* The low-precision type the ops' autocast policy emulates. */
static int autocast_type(hpu_precision p)
{
	return p == HPU_PREC_BF16_MIXED   ? HPU_AUTOCAST_BF16
	       : p == HPU_PREC_FP16_MIXED ? HPU_AUTOCAST_FP16
	       : p == HPU_PREC_FP8        ? HPU_AUTOCAST_FP8
					  : HPU_AUTOCAST_NONE;
}

/* The autocast lists only move ops between fp32 and a low precision: at
 * fp32 there is none, so a list set there changes nothing; say so. */
static void note_lists_at_fp32(const hpu_train_opts *o)
{
	static const hpu_env_id vars[] = {HPU_ENV_LOWER_LIST, HPU_ENV_FP32_LIST,
					  HPU_ENV_PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST,
					  HPU_ENV_PT_HPU_AUTOCAST_FP32_OPS_LIST};
	if (autocast_type(o->precision) != HPU_AUTOCAST_NONE)
		return;
	for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
		const char *v = hpu__env_str(vars[i]);
		if (v && *v)
			printf("note: %s=%s has no effect at --precision %s: every op runs in "
			       "fp32 (the autocast lists apply to bf16-mixed, 16-mixed and fp8)\n",
			       hpu__env_name(vars[i]), v, hpu__precision_name(o->precision));
	}
}

/* The kernels' threads (--kernel-threads): with more than one, the worker
 * widens the one core the agent pinned it to into its own run of N cores
 * (local rank L takes L*N .. L*N+N-1) where the node has them, else all. */
static void kernels_setup(const hpu_train_opts *o)
{
	const hpu__backend *be = hpu__be();
	int n = o->kernel_threads, local = env_int(HPU_ENV_LOCAL_RANK, 0);
	be->set_threads(n);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	if (n > 1 && ncpu > 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		int first = (long)(local + 1) * n <= ncpu ? local * n : 0;
		int count = (long)(local + 1) * n <= ncpu ? n : (int)ncpu;
		for (int c = first; c < first + count && c < CPU_SETSIZE; c++)
			CPU_SET(c, &set);
		sched_setaffinity(0, sizeof set, &set);
	}
	int low = o->precision == HPU_PREC_BF16_MIXED || o->precision == HPU_PREC_FP8;
	if (o->verbose)
		printf("kernels: %s\n", be->describe()); /* the agent adds [rank R] */
	else if (low && !be->bf16_native() && local == 0)
		hpu__log(HPU_LOG_NOTICE, "kernels: %s: bf16 products run as fp32 "
					"products of bf16-rounded values, without the speed-up: "
					"close to bf16 kernels' results, not the same (the sums "
					"run in another order)",
			 be->describe());
}

/* A failure that another rank caused (it died, stopped answering, or
 * failed first, as the collectives found): the agent is told which, to
 * blame that rank. */
static void blame_peer(const hpucoll_comm *comm)
{
	int code, culprit = comm ? hpucoll_comm_culprit(comm, &code) : -1;
	if (culprit >= 0)
		hpu__status_blame(culprit, code == HPUCOLL_EPEER       ? HPU_BLAME_DIED
					  : code == HPUCOLL_ETIMEDOUT ? HPU_BLAME_SILENT
								      : HPU_BLAME_FAILED);
}

/* libhpucoll's lines ("hpucoll: rank 3: ..."), as they are, through the
 * worker's log: its level, journald's priorities. */
static void coll_log(void *user, hpucoll_log_level lvl, const char *line)
{
	(void)user;
	hpu__log_plain((hpu_log_level)lvl, "%s", line);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: hpu-worker [training options] MODEL.so [-- model args]\n"
		   "Started by hpulaunch, which sets RANK, WORLD_SIZE, MASTER_ADDR, ...\n"
		   "Training options:\n");
	hpu__opts_help(f);
}

/* --verbose: a model of an older ABI, and the layers that run on the
 * host only (hpu_layer_ops.device). */
static void note_model(const hpu_builder *b)
{
	if (b->abi < HPU_ABI_VERSION)
		printf("model %s uses ABI %u's deprecated forms: it loads, but rebuild it against "
		       "this <hpu/hpu.h> (ABI %u) before they go\n", b->path, b->abi, HPU_ABI_VERSION);
	/* staged only where the device's memory is not the host's (on cpu
	 * it said "stages" too, which nothing did) */
	int host_mem = hpu__dev_host_can_read();
	for (int i = 0; i < b->nlayers; i++) {
		if (b->layers[i]->device != HPU_LAYER_HOST_ONLY)
			continue;
		if (host_mem)
			printf("model: layer %s runs on the host only (HPU_LAYER_HOST_ONLY: device "
			       "%s's memory is the host's, so nothing is staged)\n",
			       b->layers[i]->name, hpu__dev_name());
		else
			printf("model: layer %s runs on the host only (HPU_LAYER_HOST_ONLY: the runtime "
			       "stages its tensors in host memory)\n", b->layers[i]->name);
	}
}

/* hpu-worker --count-gpus: the GPUs the CUDA device sees, for
 * hpulaunch's --devices auto (agent/gpus.h): the number and exit 0,
 * or the reason there is none and exit 1, on stdout. */
static int count_gpus(void)
{
	char why[512] = "";
	int n = hpu__dev_count_gpus(why, sizeof why);
	if (n > 0)
		printf("%d\n", n);
	else
		printf("%s\n", why[0] ? why : "--device cuda: no GPU is visible");
	return n > 0 ? 0 : 1;
}

/* One declared default, as text, applied where no file or flag set it. */
static int model_default(hpu_train_opts *o, const hpu_builder *b, const char *field,
			 const char *name, const char *value, char *err, size_t errlen)
{
	char why[400];
	if (hpu__opts_set_model(o, name, value, why, sizeof why) >= 0)
		return 0;
	snprintf(err, errlen, "model %s declares an invalid default .defaults.%s in HPU_MODEL: %s",
		 b->path, field, why);
	return -1;
}

/* The model's declared training defaults (hpu_model.defaults) over the
 * built-in ones: built-in < model < --config file < flag. */
static int apply_model_defaults(hpu_train_opts *o, const hpu_builder *b, char *err,
				size_t errlen)
{
	const hpu_train_defaults *d = hpu__model_defaults(b);
	char v[64];
	int rc = 0;
	if (!d)
		return 0;
#define NUMBER(field, name, fmt)                                                          \
	if (!rc && d->field != 0) {                                                       \
		snprintf(v, sizeof v, fmt, d->field);                                      \
		rc = model_default(o, b, #field, name, v, err, errlen);                    \
	}
#define WORD(field, name)                                                                 \
	if (!rc && d->field)                                                              \
		rc = model_default(o, b, #field, name, d->field, err, errlen);
	NUMBER(epochs, "epochs", "%d")
	NUMBER(batch_size, "batch-size", "%d")
	WORD(optimizer, "optimizer")
	NUMBER(lr, "lr", "%.17g")
	NUMBER(weight_decay, "weight-decay", "%.17g")
	WORD(scheduler, "scheduler")
	NUMBER(warmup_steps, "warmup-steps", "%ld")
	NUMBER(min_lr, "min-lr", "%.17g")
	WORD(precision, "precision")
#undef NUMBER
#undef WORD
	return rc;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 2 && !strcmp(argv[1], "--count-gpus"))
		return count_gpus();
	signal(SIGPIPE, SIG_IGN); /* a closed status pipe or socket is EPIPE, not death */
	hpu__status_hello();
	hpu__status_keepalive();
	hpu__dev_fatal_why = hpu__status_error; /* the device's checks' sentences */
	char err[4096] = ""; /* a config file's errors, one a line */
	int rank = env_int(HPU_ENV_RANK, 0), world = env_int(HPU_ENV_WORLD_SIZE, 1);
	if (hpu__log_init(err, sizeof err, "hpu-worker: rank %d", rank) < 0) {
		hpu__log(HPU_LOG_ERROR, "%s", err);
		return 2;
	}
	hpucoll_set_log(coll_log, NULL);
	hpu__crash_report_install(rank);
	hpu_train_opts o;
	hpu__opts_defaults(&o);
	int i = 1;
	if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		usage(stdout);
		return 0;
	}
	/* the checkpoint directory is checked here too (hpud's node can be
	 * another machine than the launcher's): before training, not at the
	 * first save */
	if (hpu__opts_parse(&o, argc, argv, &i, err, sizeof err) < 0) {
		hpu__log(HPU_LOG_ERROR, "%s", err);
		return 2;
	}
	if (i >= argc) {
		usage(stderr);
		return 2;
	}
	/* The switches read where they act, each taking 0 or 1: another
	 * value (true, yes, 2) meant the default there without a word. */
	static const hpu_env_id flags[] = {
		HPU_ENV_HPU_FUSED_ATTENTION, /* by the attention layer when declared */
		HPU_ENV_HPU_FP8_NATIVE,	     /* by fp8's linear (worker/ops/fp8.c) */
		HPU_ENV_HPU_STRICT_STEP,     HPU_ENV_HPU_STRICT_KERNELS,
		HPU_ENV_HPU_CUDNN_FIND,	     HPU_ENV_HPU_CUDNN_LOG,
	};
	for (size_t k = 0; k < sizeof flags / sizeof *flags; k++) {
		/* exactly: some are read as strcmp(v, "1"), where +1 or 01 was off */
		const char *v = hpu__env_str(flags[k]);
		if (v && *v && strcmp(v, "0") && strcmp(v, "1")) {
			hpu__log(HPU_LOG_ERROR, "%s=%s: must be 0 or 1", hpu__env_name(flags[k]), v);
			return 2;
		}
	}
	const char *be = hpu__env_str(HPU_ENV_HPU_BACKEND);
	if (be && *be && strcmp(be, "onednn") && strcmp(be, "reference")) {
		hpu__log(HPU_LOG_ERROR, "HPU_BACKEND=%s: must be onednn (the default) or reference",
			 be);
		return 2;
	}
	const char *path = argv[i++];
	hpu_builder *b = NULL;
	hpucoll_comm *comm = NULL;
	int rc = 1;
	/* the model first: its declared defaults come before resolving */
	if (hpu__model_load(&b, path, rank, world, 0, err, sizeof err) < 0 ||
	    apply_model_defaults(&o, b, err, sizeof err) < 0)
		goto out;
	if (hpu__opts_resolve(&o, world, err, sizeof err) < 0 ||
	    hpu__opts_check_checkpoint_dir(&o, err, sizeof err) < 0) {
		/* the agent's closing line says it too (a default the model
		 * computes at load, which hpulaunch could not read, ended
		 * the job "during setup" with no reason) */
		hpu__status_error(err);
		hpu__log(HPU_LOG_ERROR, "%s", err);
		hpu__model_destroy(&b);
		return 2;
	}
	b->max_batch = o.micro_batch;
	if (o.verbose && rank == 0)
		hpu__opts_print_sources(&o, stdout);
	hpu__train_announce(&o);
	/* Model arguments follow "--"; the model sees its path as argv[0]. */
	if (i < argc && strcmp(argv[i], "--") == 0)
		i++;
	argv[i - 1] = (char *)path;
	int margc = argc - i + 1;
	char **margv = argv + i - 1;

	if (hpu__dev_open(hpu__device_name(o.device), rank, err, sizeof err) < 0)
		goto out;
	hpu__dev_ops_hooks(); /* a kernel's refusal on a device's table: no C loop runs */
	if (o.verbose) /* what auto chose */
		printf("rank %d: device %s (--device %s)\n", rank, hpu__dev_name(),
		       hpu__device_name(o.device));
	uint64_t capacity = 0;
	if (device_configure(&o, rank, &capacity, err, sizeof err) < 0)
		goto out;
	/* the ranks meet before devmem: its limit counts the workers that
	 * share this rank's GPU */
	if (hpucoll_comm_init_env(&comm, err, sizeof err) != HPUCOLL_OK ||
	    hpu__same_opts_check(comm, &o, err, sizeof err) < 0)
		goto out;
	int sharers = 1;
	if (gpu_sharers(comm, rank, world, &sharers, err, sizeof err) < 0)
		goto out;
	uint64_t limit = device_memory(&o, capacity, sharers);
	if (hpu__devmem_init(limit, rank) < 0) {
		snprintf(err, sizeof err, "cannot set up device memory");
		goto out;
	}
	if (o.verbose && capacity && !o.device_memory)
		printf("rank %d: device memory limit %.1f GiB: the device's %.1f GiB shared by "
		       "the %d worker%s on it, less %.1f GiB each for what is outside the limit "
		       "(--device-memory sets another)\n",
		       rank, (double)limit / (1 << 30), (double)capacity / (1 << 30), sharers,
		       sharers == 1 ? "" : "s",
		       (double)(capacity / (uint64_t)sharers - limit) / (1 << 30));
	/* on the CPU devices the machine's memory is the device's (a GPU's
	 * limit past its memory is refused where the device opens) */
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	double ram = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
	if (rank == 0 && !capacity && o.device_memory && ram > 0 && (double)o.device_memory > ram)
		printf("warning: --device-memory %.1f GiB is more than this machine's memory, %.1f "
		       "GiB: the system, not the limit, will refuse what does not fit (or its "
		       "out-of-memory killer end the worker)\n",
		       (double)o.device_memory / (1 << 30), ram / (1 << 30));
	hpu__hostmem_init(o.host_memory);
	if (hpu__autocast_init(autocast_type(o.precision), err, sizeof err) < 0)
		goto out;
	for (const char *w = hpu__autocast_warnings(); rank == 0 && *w; w = strchr(w, '\n') + 1)
		printf("warning: %.*s\n", (int)strcspn(w, "\n"), w);
	if (rank == 0)
		note_lists_at_fp32(&o);
	if (o.precision == HPU_PREC_FP8) {
		hpu_fp8_recipe r = {o.fp8_amax_history, o.fp8_margin,
				    o.fp8_amax_algo == HPU_FP8_ALGO_MAX ? HPU_FP8_AMAX_MAX
									: HPU_FP8_AMAX_MOST_RECENT};
		hpu__fp8_set_mode(HPU_FP8_TRAIN, &r);
	}
	if (o.verbose && rank == 0)
		hpu__autocast_print(stdout);
	kernels_setup(&o);
	hpu__crash_in_setup(b);
	int setup_rc = hpu__model_setup(b, margc, margv, err, sizeof err);
	hpu__crash_in_setup(NULL);
	if (setup_rc < 0 || hpu__same_model_check(comm, b, err, sizeof err) < 0)
		goto out;
	if (o.verbose && rank == 0)
		note_model(b);
	if (hpu__train_run(b, comm, &o, err, sizeof err) < 0)
		goto out;
	rc = 0;
out:
	blame_peer(rc ? comm : NULL);
	if (rc) /* the agent relays it to the other nodes with the exit */
		hpu__status_error(err);
	if (rc && strncmp(err, "rank ", 5) == 0) /* it names the rank itself */
		hpu__log_plain(HPU_LOG_ERROR, "hpu-worker: %s", err);
	else if (rc)
		hpu__log(HPU_LOG_ERROR, "%s", err);
	hpu__model_destroy(&b);
	hpucoll_comm_destroy(&comm);
	hpu__devmem_shutdown();
	hpu__dev_close();
	return rc;
}
