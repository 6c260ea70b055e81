/* config: the training options (see config.h).
 *
 * One table lists every command-line option with its field, its kind and
 * its range; o->from[] (indexed by the table) says where each value came
 * from. The JSON config file (config_file.c) maps DeepSpeed's keys onto
 * entries of the same table (config_internal.h), so a value is checked the
 * same way whichever way it comes in. The command line that reads
 * them (and loads --config's file) is config_args.c, above both: this
 * file calls neither.
 */
#include "options/config.h"
#include "options/config_internal.h"
#include "common/env.h"
#include "common/fileio.h"
#include "common/num.h"
#include "common/optdoc.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const strategy_names[] = {"fast_ddp", "ddp", "zero1",
					     "zero2", "zero3"};
static const char *const optim_names[] = {"sgd", "adamw", "adam"};
static const char *const sched_names[] = {"constant", "step", "cosine",
					  "warmup", "warmup_decay"};
static const char *const warmup_names[] = {"log", "linear"};
static const char *const comm_names[] = {"fp32", "bf16", "fp16"};
static const char *const precision_names[] = {"fp32", "bf16-mixed", "16-mixed", "fp8"};
static const char *const fp8_algo_names[] = {"max", "most_recent"};
static const char *const offload_names[] = {"none", "cpu", "nvme"};
static const char *const params_format_names[] = {"auto", "safetensors", "raw"};
static const char *const device_names[] = {"cpu", "cpu-strict", "cuda", "auto"};
static const char *const collectives_names[] = {"device", "nccl"};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Choices are stored through an int pointer. */
_Static_assert(sizeof(hpu_strategy) == sizeof(int), "enum size");
_Static_assert(sizeof(hpu_optim_kind) == sizeof(int), "enum size");
_Static_assert(sizeof(hpu_sched_kind) == sizeof(int), "enum size");
_Static_assert(sizeof(hpu_warmup_type) == sizeof(int), "enum size");
_Static_assert(sizeof(hpu_comm_dtype) == sizeof(int), "enum size");
_Static_assert(sizeof(hpu_precision) == sizeof(int), "enum size");
_Static_assert(sizeof(hpu_fp8_algo) == sizeof(int), "enum size");
_Static_assert(sizeof(hpu_offload) == sizeof(int), "enum size");

void hpu__opts_defaults(hpu_train_opts *o)
{
	memset(o, 0, sizeof *o); /* from[] all HPU_FROM_DEFAULT */
	o->epochs = 1;
	o->kernel_threads = 1;
	o->max_steps = -1;
	o->batch_size = 256;
	o->micro_batch = 0;
	o->grad_accum = 1;
	o->lr = 1e-3;
	o->optimizer = HPU_OPTIM_ADAMW;
	o->momentum = 0.9;
	o->weight_decay = -1;
	o->beta1 = 0.9;
	o->beta2 = 0.999;
	o->eps = 1e-8;
	o->sched = HPU_SCHED_CONSTANT;
	o->warmup_steps = 1000;
	o->warmup_type = HPU_WARMUP_LOG;
	o->step_size = 1000;
	o->gamma = 0.1;
	o->seed = 42;
	o->strategy = HPU_STRATEGY_FAST_DDP;
	o->reduce_bucket = 25L * 1048576 / 4;
	o->allgather_bucket = 500000000;
	o->overlap_comm = 1;
	o->prefetch_bucket = 50000000;
	o->persistence_threshold = 100000;
	o->max_live_params = 1000000000;
	o->grad_comm_dtype = HPU_COMM_FP32;
	o->precision = HPU_PREC_FP32;
	o->initial_scale_power = 16;
	o->loss_scale_window = 1000;
	o->hysteresis = 2;
	o->graphs_warmup = 3;
	o->min_loss_scale = 1;
	o->max_skipped_steps = 5;
	o->offload_buffer_count = 4;
	o->param_buffer_count = 5;
	o->param_buffer_size = 100000000;
	o->max_in_cpu = 1000000000;
	o->sub_group_size = 1000000000;
	o->aio_block_size = 1 << 20;
	o->aio_queue_depth = 8;
	o->aio_thread_count = 1;
	o->aio_overlap_events = 1;
	o->fp8_amax_history = 16;
	o->calib_batches = 16;
	o->log_every = 50;
	strcpy(o->profile_name, "perf-logs");
	o->throughput_warmup = 1;
	o->stall_warning = 30;
	o->hang_warning = 600;
	o->eval = 1;
}

static const char *name_of(const char *const *names, int n, int k)
{
	return k >= 0 && k < n ? names[k] : "unknown";
}

const char *hpu__strategy_name(hpu_strategy s)
{
	return name_of(strategy_names, COUNT(strategy_names), (int)s);
}

const char *hpu__optim_name(hpu_optim_kind k)
{
	return name_of(optim_names, COUNT(optim_names), (int)k);
}

const char *hpu__offload_name(hpu_offload d)
{
	return name_of(offload_names, COUNT(offload_names), (int)d);
}

const char *hpu__sched_name(hpu_sched_kind k)
{
	return name_of(sched_names, COUNT(sched_names), (int)k);
}

const char *hpu__precision_name(hpu_precision p)
{
	return name_of(precision_names, COUNT(precision_names), (int)p);
}

const char *hpu__device_name(hpu_device_kind d)
{
	return name_of(device_names, COUNT(device_names), (int)d);
}

double hpu__opts_weight_decay(const hpu_train_opts *o)
{
	if (o->weight_decay >= 0)
		return o->weight_decay;
	return o->optimizer == HPU_OPTIM_ADAMW ? 0.01 : 0.0;
}

/* ---- sizes ---- */

int hpu__parse_size(const char *s, uint64_t *out)
{
	const char *p = s;
	if (!isdigit((unsigned char)*p))
		return -1;
	uint64_t whole;
	if (hpu__parse_u64_prefix(p, &p, &whole) != HPU_NUM_OK)
		return -1;
	double frac = 0;
	if (*p == '.') {
		/* Only digits: strtod alone would also take "1.5e3". */
		char digits[32] = "0.";
		size_t n = 2;
		for (p++; isdigit((unsigned char)*p); p++)
			if (n < sizeof digits - 1)
				digits[n++] = *p;
		if (n == 2)
			return -1;
		digits[n] = 0;
		frac = strtod(digits, NULL);
	}
	int shift = 0;
	switch (tolower((unsigned char)*p)) {
	case 'k': shift = 10; break;
	case 'm': shift = 20; break;
	case 'g': shift = 30; break;
	case 't': shift = 40; break;
	}
	if (shift)
		p++;
	if (shift && strcasecmp(p, "ib") == 0)
		p += 2;
	else if (tolower((unsigned char)*p) == 'b')
		p++;
	if (*p || whole > (UINT64_MAX >> shift))
		return -1;
	if (!shift && frac != 0)
		return -1; /* a fraction of a byte */
	uint64_t v = (uint64_t)whole << shift;
	/* A fraction of a unit is rounded down to a whole byte. */
	uint64_t part = (uint64_t)floor(frac * (double)(1ull << shift));
	if (v + part < v)
		return -1;
	*out = v + part;
	return 0;
}

/* ---- the option table ---- */

int hpu__pick(const char *v, const char *const *names, int n, int nocase)
{
	for (int i = 0; i < n; i++)
		if ((nocase ? strcasecmp : strcmp)(v, names[i]) == 0)
			return i;
	return -1;
}

/* Other spellings of a choice: Lightning's precision names ("32-true",
 * "bf16") and its older ones ("32", "16"); Lightning's strategy names
 * (HPUParallelStrategy's "hpu_parallel" is DDP; DeepSpeed's stages). */
static const struct {
	const char *opt, *alias;
	int value;
} choice_aliases[] = {
	{"precision", "32", HPU_PREC_FP32},
	{"precision", "32-true", HPU_PREC_FP32},
	{"precision", "bf16", HPU_PREC_BF16_MIXED},
	{"precision", "16", HPU_PREC_FP16_MIXED},
	{"strategy", "hpu_parallel", HPU_STRATEGY_DDP},
	{"strategy", "deepspeed_stage_1", HPU_STRATEGY_ZERO1},
	{"strategy", "deepspeed_stage_2", HPU_STRATEGY_ZERO2},
	{"strategy", "deepspeed_stage_3", HPU_STRATEGY_ZERO3},
};

/* The value of option opt's choice v: one of names[n], else an alias. */
static int choice_of(const char *opt, const char *const *names, int n, const char *v,
		     int nocase)
{
	int k = hpu__pick(v, names, n, nocase);
	for (size_t i = 0; k < 0 && i < sizeof choice_aliases / sizeof *choice_aliases; i++)
		if (!strcmp(opt, choice_aliases[i].opt) &&
		    !(nocase ? strcasecmp : strcmp)(v, choice_aliases[i].alias))
			k = choice_aliases[i].value;
	return k;
}

int hpu__strategy_of(const char *s)
{
	return s ? choice_of("strategy", strategy_names, (int)COUNT(strategy_names), s, 0) : -1;
}

int hpu__choice(const struct hpu__opt *p, const char *v, int nocase)
{
	return choice_of(p->name, p->names, p->nnames, v, nocase);
}

#define OFF(f) offsetof(hpu_train_opts, f)
#define NUM(n, k, f, lo, hi, h) {n, k, OFF(f), lo, hi, NULL, 0, h, NULL, 0}
#define OTHER(n, k, f, h) {n, k, OFF(f), 0, 0, NULL, 0, h, NULL, 0}
#define CHOICE(n, f, a, h) {n, K_CHOICE, OFF(f), 0, 0, a, COUNT(a), h, NULL, 0}
/* The same with HPU__OPT_* flags (how): a path, or an option the ranks
 * may hold different values of. */
#define NUM_(n, k, f, lo, hi, how, h) {n, k, OFF(f), lo, hi, NULL, 0, h, NULL, how}
#define OTHER_(n, k, f, how, h) {n, k, OFF(f), 0, 0, NULL, 0, h, NULL, how}
#define PATH HPU__OPT_PATH
#define LOCAL HPU__OPT_LOCAL
#define GIVEN HPU__OPT_GIVEN

static const struct hpu__opt opts[] = {
	NUM("epochs", K_INT, epochs, 1, 1e6, "passes over the training set (1)"),
	NUM("max-steps", K_LONG, max_steps, 0, 1e15, "train N optimizer steps, over as many epochs as that takes (wins over --epochs); 0: none, save and evaluate the initial model"),
	NUM("batch-size", K_INT, batch_size, 1, 1 << 24, "global batch, all ranks together (256) [train_batch_size]"),
	NUM("micro-batch-size", K_INT, micro_batch, 1, 1 << 24, "batch per rank per micro-step (batch / grad-accum / world)"),
	NUM("grad-accum", K_INT, grad_accum, 1, 1 << 20, "micro-steps per optimizer step (1) [gradient_accumulation_steps]"),
	NUM("lr", K_DOUBLE, lr, 0, 1e6, "learning rate; the peak under warm-up (1e-3)"),
	CHOICE("optimizer", optimizer, optim_names, "sgd | adamw | adam (adamw; adam: L2 weight decay)"),
	NUM("momentum", K_DOUBLE, momentum, 0, 1, "SGD momentum (0.9)"),
	OTHER("nesterov", K_FLAG, nesterov, "SGD with Nesterov momentum"),
	NUM("weight-decay", K_DOUBLE, weight_decay, 0, 1e6, "weight decay (adamw 0.01, adam and sgd 0)"),
	NUM("beta1", K_DOUBLE, beta1, 0, 0.999999, "Adam/AdamW beta1 (0.9)"),
	NUM("beta2", K_DOUBLE, beta2, 0, 0.999999999, "Adam/AdamW beta2 (0.999)"),
	NUM("eps", K_DOUBLE, eps, 0, 1, "Adam/AdamW epsilon (1e-8)"),
	NUM("clip-grad-norm", K_DOUBLE, clip_norm, 0, 1e9, "clip gradients to global L2 norm X (0: off)"),
	CHOICE("scheduler", sched, sched_names, "constant | step | cosine | warmup | warmup_decay (constant)"),
	NUM("warmup-steps", K_LONG, warmup_steps, 0, 1e15, "warm-up steps (1000)"),
	CHOICE("warmup-type", warmup_type, warmup_names, "log | linear warm-up (log)"),
	NUM("warmup-min-lr", K_DOUBLE, warmup_min_lr, 0, 1e6, "lr at the start of warm-up (0)"),
	NUM("total-steps", K_LONG, total_steps, 0, 1e15, "warmup_decay and cosine length (0: the whole run)"),
	NUM("step-size", K_LONG, step_size, 1, 1e15, "step: multiply lr by gamma every N steps (1000)"),
	NUM("gamma", K_DOUBLE, gamma, 0, 1e6, "step: the factor (0.1)"),
	NUM("min-lr", K_DOUBLE, min_lr, 0, 1e6, "cosine: the final lr (0)"),
	NUM("seed", K_U64, seed, 0, 9e18, "seed for parameter init and shuffling (42)"),
	CHOICE("strategy", strategy, strategy_names, "fast_ddp | ddp | zero1 | zero2 | zero3 (fast_ddp), or Lightning's hpu_parallel (ddp) and deepspeed_stage_1, _2, _3 (zero1-3)"),
	NUM("reduce-bucket-size", K_LONG, reduce_bucket, 0, 1e15, "ddp/zero2 gradient bucket, elements; 0: a bucket per layer, as DeepSpeed (6553600)"),
	NUM("bucket-cap-mb", K_MB, reduce_bucket, 0, 1e6, "the same in MiB of fp32, as torch DDP (25)"),
	NUM("allgather-bucket-size", K_LONG, allgather_bucket, 0, 1e15, "zero1 all-gather unit, elements; 0: one for all (500000000)"),
	OTHER("overlap-comm", K_FLAG, overlap_comm, "communicate during backward (on)"),
	OTHER("no-overlap-comm", K_NOFLAG, overlap_comm, "communicate after backward"),
	NUM("prefetch-bucket-size", K_LONG, prefetch_bucket, 0, 1e15, "zero3: elements gathered ahead (50000000)"),
	NUM("param-persistence-threshold", K_LONG, persistence_threshold, 0, 1e15, "zero3: smaller layers stay whole (100000)"),
	NUM("max-live-parameters", K_LONG, max_live_params, 0, 1e15, "zero3: gathered elements alive at once; 0: none ahead of use (1000000000)"),
	CHOICE("grad-comm-dtype", grad_comm_dtype, comm_names, "fp32 | bf16 gradient all-reduce, ddp/fast_ddp (fp32); fp16: 16-mixed's, whose gradients travel in fp16 anyway"),
	OTHER("activation-checkpointing", K_FLAG, activation_checkpointing, "recompute every layer's forward but the last one's in backward (strategies.md: about 2 sqrt(m) outputs alive instead of m)"),
	OTHER("graphs", K_FLAG, graphs, "HPU graphs: record a training step once per batch shape, after --graphs-warmup eager steps, and replay it (a CUDA graph; on --device cpu and cpu-strict its twin, a list of kernel calls); what cannot be recorded runs eagerly, --verbose says why [use_hpu_graphs_for_training]"),
	NUM("graphs-warmup", K_INT, graphs_warmup, 0, 1e6, "--graphs: eager steps before the first recording; an evaluation batch's size runs eagerly as many times before its recording (3)"),
	OTHER("pad-last-batch", K_FLAG, pad_last_batch, "--graphs: an evaluation's last partial batch is padded to the full micro-batch (copies of its first sample, left out of the loss and metrics) and replays the full batch's recording instead of recording its own; training drops an epoch's partial batch already; without --graphs nothing is padded, the figures are the same (off)"),
	CHOICE("device", device, device_names, "cpu | cpu-strict | cuda | auto: the device workers compute on; cpu-strict (tests) faults when host code touches device memory outside the device's calls (a layer's own loops over its tensors: under --graphs or HPU_STRICT_KERNELS=1); cuda: an NVIDIA GPU (the worker says why where it has none); auto: cuda where its module loads and a GPU is visible, else cpu (cpu) [HPU_DEVICE]"),
	OTHER_("device-memory", K_SIZE, device_memory, LOCAL, "memory per device, e.g. 2GiB (node memory / local devices; on a GPU its memory / the node's workers on it, less 1 GiB each; more than a GPU has is an error)"),
	CHOICE("collectives", collectives, collectives_names, "device | nccl: what carries ddp's and fast_ddp's gradient all-reduce between GPU workers; device: the device's own (cuda: CUDA IPC between the workers of one node), else libhpucoll through host memory; nccl: NCCL (--device cuda, libnccl.so.2 where installed, a GPU of its own for every rank, nodes apart too); ZeRO's collectives run through libhpucoll either way (device)"),
	OTHER("allow-tf32", K_FLAG, allow_tf32, "fp32 GEMMs and convolutions may run on TF32 tensor cores (--device cuda), as PyTorch's allow_tf32; accepted on cpu and cpu-strict with a note that it has no effect there (off)"),
	CHOICE("offload-optimizer", offload_optimizer, offload_names, "zero1-3: optimizer state, fp32 master weights and gradient shard in none | cpu (host memory) | nvme (--nvme-path) (none)"),
	CHOICE("offload-param", offload_param, offload_names, "zero3: the parameter shard in none | cpu | nvme (none)"),
	OTHER_("nvme-path", K_STR, nvme_path, PATH | LOCAL, "directory for the nvme tier's swap files (a disk filesystem with O_DIRECT)"),
	OTHER_("param-nvme-path", K_STR, param_nvme_path, PATH | LOCAL, "the same for --offload-param nvme (--nvme-path)"),
	OTHER_("host-memory", K_SIZE, host_memory, LOCAL, "bound on the offloaded host tier per worker, e.g. 8GiB (none)"),
	NUM("offload-buffer-count", K_INT, offload_buffer_count, 1, 64, "nvme: optimizer sub-group buffers; 1 reads, updates and writes one sub-group at a time, more overlap them (4) [offload_optimizer.buffer_count]"),
	NUM("sub-group-size", K_LONG, sub_group_size, 0, 1e15, "nvme: optimizer elements swapped and updated together, at most; 0: a layer each, as DeepSpeed's one tensor each (1e9) [zero_optimization.sub_group_size]"),
	NUM("param-buffer-count", K_INT, param_buffer_count, 2, 64, "nvme: buffers for the parameter shard's pieces in memory at once, 2 to 64 (5) [offload_param.buffer_count]"),
	NUM("param-buffer-size", K_LONG, param_buffer_size, 1, 1e15, "nvme: a layer's piece of the shard may have at most this many elements (1e8) [offload_param.buffer_size]"),
	NUM("max-in-cpu", K_LONG, max_in_cpu, 0, 1e15, "accepted, no effect: every non-persistent piece goes to the file (1e9) [offload_param.max_in_cpu]"),
	OTHER_("aio-block-size", K_SIZE, aio_block_size, LOCAL, "nvme: bytes per I/O request (1MiB) [aio.block_size]"),
	NUM_("aio-queue-depth", K_INT, aio_queue_depth, 1, 4096, LOCAL, "nvme: I/O requests in flight (8) [aio.queue_depth]"),
	NUM_("aio-thread-count", K_INT, aio_thread_count, 1, 1024, LOCAL, "nvme: accepted; io_uring needs no I/O threads (1) [aio.thread_count]"),
	OTHER_("aio-single-submit", K_FLAG, aio_single_submit, LOCAL, "nvme: submit I/O requests one at a time [aio.single_submit]"),
	OTHER_("no-aio-overlap-events", K_NOFLAG, aio_overlap_events, LOCAL, "nvme: reap I/O completions only after submitting all [aio.overlap_events]"),
	NUM("log-every", K_INT, log_every, 0, 1e9, "log loss and samples/s every N steps (50; 0: never)"),
	OTHER_("verbose", K_FLAG, verbose, LOCAL, "print the autocast policy (rank 0) and each worker's kernels (ISA)"),
	NUM_("kernel-threads", K_INT, kernel_threads, 1, 4096, LOCAL, "kernel threads per worker (1: a worker is one device)"),
	CHOICE("precision", precision, precision_names, "fp32 | bf16-mixed | 16-mixed | fp8, or Lightning's 32, 32-true, bf16, 16 (fp32)"),
	NUM("loss-scale", K_DOUBLE, loss_scale, 0, 1e30, "16-mixed: a static loss scale (0: dynamic)"),
	NUM("initial-scale-power", K_INT, initial_scale_power, 0, 60, "16-mixed: dynamic scale starts at 2^N (16)"),
	NUM("loss-scale-window", K_LONG, loss_scale_window, 1, 1e15, "16-mixed: double the scale after N good steps (1000)"),
	NUM("hysteresis", K_INT, hysteresis, 1, 1000, "16-mixed: overflows before the scale halves (2)"),
	NUM("min-loss-scale", K_DOUBLE, min_loss_scale, 1e-30, 1e30, "16-mixed: the smallest scale (1)"),
	NUM("fp8-amax-history", K_INT, fp8_amax_history, 1, 1 << 20, "fp8: steps of amax history per tensor (16)"),
	NUM("fp8-margin", K_INT, fp8_margin, 0, 64, "fp8: scales divided by 2^N (0)"),
	CHOICE("fp8-amax-compute-algo", fp8_amax_algo, fp8_algo_names, "fp8: max | most_recent over the history (max)"),
	NUM("inject-overflow-step", K_LONG, inject_overflow_step, 0, 1e15, "testing: make step N's gradients overflow (a mixed precision: 16-mixed, bf16-mixed, fp8)"),
	OTHER_("metrics", K_STR, metrics, PATH | LOCAL, "write JSON lines of metrics to FILE (rank 0)"),
	OTHER_("save-params", K_STR, save_params, PATH | GIVEN, "save the trained fp32 parameters to FILE (rank 0)"),
	CHOICE("save-params-format", save_params_format, params_format_names, "auto | safetensors | raw: auto is raw for a --save-params name ending in .bin or .raw, else safetensors (auto)"),
	OTHER_("load-params", K_STR, load_params, PATH | GIVEN, "start from the fp32 parameters in FILE (safetensors, matched by name, or a raw --save-params file)"),
	OTHER("eval-only", K_FLAG, eval_only, "no training: evaluate on the test split (fp8 inference: QUANT_CONFIG)"),
	NUM("calibration-batches", K_INT, calib_batches, 1, 1e9, "QUANT_CONFIG MEASURE: training batches per rank measured (16)"),
	OTHER_("checkpoint-dir", K_STR, checkpoint_dir, PATH | GIVEN, "save checkpoints under DIR (each rank its shard)"),
	NUM("checkpoint-every", K_LONG, checkpoint_every, 0, 1e15, "checkpoint every N steps, and at the end (0: only at the end)"),
	NUM("keep", K_INT, keep, 0, 1e6, "keep the newest N checkpoints (0: all)"),
	NUM("keep-last", K_INT, keep_last, 1, 1e6, "keep the newest K checkpoints, besides --keep-best's (as --keep K; 1 with --keep-best)"),
	OTHER("keep-best", K_STR, keep_best, "METRIC[:min|max],K: keep the K checkpoints with the best val_loss or val_<metric> at their save, besides the newest (min unless :max)"),
	OTHER_("resume", K_STR, resume, PATH | GIVEN | HPU__OPT_AUTO, "resume from DIR (a checkpoint or a --checkpoint-dir), or auto: the newest intact one"),
	NUM("stop-at-step", K_LONG, stop_at_step, 1, 1e15, "checkpoint and stop after step N, schedule unchanged (to resume later)"),
	NUM("max-skipped-steps", K_INT, max_skipped_steps, 1, 1e9, "stop after N steps in a row skipped for a non-finite loss or gradients; under 16-mixed's dynamic loss scale, counted once the scale is at --min-loss-scale, as DeepSpeed does (5)"),
	OTHER_("config", K_CONFIG, config, PATH | LOCAL, "DeepSpeed-style JSON config; flags win over it"),
	OTHER("no-eval", K_NOFLAG, eval, "skip the test-set evaluation at the end"),
	NUM("eval-every", K_LONG, eval_every, 1, 1e15, "validate every N steps: loss and metrics on the test split or the --val-fraction slice (never)"),
	NUM("eval-every-epochs", K_DOUBLE, eval_every_epochs, 0, 1e9, "validate at the end of every Nth epoch, or F below 1: at every F of an epoch, 0.25 every quarter (never)"),
	NUM("val-fraction", K_DOUBLE, val_fraction, 0, 1, "validate on this fraction (above 0, below 1) of the training split, held out of training, chosen from --seed (not given: the test split)"),
	OTHER("early-stop", K_STR, early_stop, "METRIC[:min|max],PATIENCE[,MIN_DELTA]: stop when PATIENCE validations in a row did not improve val_loss or val_<metric> by more than MIN_DELTA (0); min unless :max"),
	{"profile", K_OPTSTR, OFF(profile), 0, 0, NULL, 0, "write a Chrome trace per rank into DIR (default .)", ".", PATH | GIVEN},
	OTHER_("profile-filename", K_STR, profile_name, LOCAL, "trace files are DIR/NAME-rank<R>.json (perf-logs)"),
	NUM("profile-warmup-steps", K_LONG, profile_warmup, 0, 1e15, "--profile traces nothing during the first N steps of the run (0; Optimum Habana's profiling_warmup_steps)"),
	NUM("profile-steps", K_LONG, profile_steps, 0, 1e15, "--profile traces N steps after those, with what runs between them (validations, saves), then nothing (0: to the end, where Optimum Habana's profiling_steps 0 profiles nothing)"),
	NUM_("throughput-warmup-steps", K_LONG, throughput_warmup, 0, 1e15, LOCAL, "leave the first N steps out of samples/s (1)"),
	NUM_("stall-warning", K_DOUBLE, stall_warning, 0, 1e6, LOCAL, "warn when a collective waits X seconds, naming the ranks not arrived (30; 0: never)"),
	NUM_("hang-warning", K_DOUBLE, hang_warning, 0, 1e6, LOCAL, "warn when a step, an evaluation, a checkpoint save or a hook has run X seconds, naming where the rank is: its layer, or the model's own code (600; 0: never)"),
};
#define NOPTS (sizeof opts / sizeof opts[0])
_Static_assert(NOPTS <= HPU_OPTS_MAX, "from[] is too small for the table");

const struct hpu__opt *hpu__opt_find(const char *name)
{
	for (size_t i = 0; i < NOPTS; i++)
		if (strcmp(opts[i].name, name) == 0)
			return &opts[i];
	return NULL;
}

/* The from[] index of an option: the table index of the first option with
 * the same field, so that aliases (--bucket-cap-mb, --no-overlap-comm)
 * share one entry. */
int hpu__opt_slot(const struct hpu__opt *p)
{
	for (size_t i = 0; i < NOPTS; i++)
		if (opts[i].off == p->off)
			return (int)i;
	assert(0);
	return 0;
}

const struct hpu__opt *hpu__opt_at(int slot)
{
	return slot >= 0 && (size_t)slot < NOPTS ? &opts[slot] : NULL;
}

const char *hpu__opt_text(const hpu_train_opts *o, const struct hpu__opt *p, char *buf,
			  size_t len)
{
	const char *field = (const char *)o + p->off;
	switch (p->kind) {
	case K_INT:
		snprintf(buf, len, "%d", *(const int *)field);
		break;
	case K_LONG:
		snprintf(buf, len, "%ld", *(const long *)field);
		break;
	case K_U64:
	case K_SIZE:
		snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)field);
		break;
	case K_DOUBLE:
		snprintf(buf, len, "%.15g", *(const double *)field);
		break;
	case K_MB:
		snprintf(buf, len, "%g MiB", (double)*(const long *)field * 4 / 1048576);
		break;
	case K_FLAG:
	case K_NOFLAG:
		snprintf(buf, len, "%s", *(const int *)field ? "true" : "false");
		break;
	case K_CHOICE:
		snprintf(buf, len, "%s", name_of(p->names, p->nnames, *(const int *)field));
		break;
	default:
		snprintf(buf, len, "%s", field);
		break;
	}
	return buf;
}

int hpu__opt_slot_named(const char *name)
{
	const struct hpu__opt *p = hpu__opt_find(name);
	assert(p);
	return hpu__opt_slot(p);
}

int hpu__opts_from(const hpu_train_opts *o, const char *name)
{
	return o->from[hpu__opt_slot_named(name)];
}

const char *hpu__opts_file_key(const hpu_train_opts *o, const char *name)
{
	int s = hpu__opt_slot_named(name);
	return o->from[s] == HPU_FROM_FILE ? o->file_key[s] : "";
}

int hpu__opts_takes_value(const char *name)
{
	const struct hpu__opt *p = hpu__opt_find(name);
	if (!p)
		return -1;
	return p->kind == K_OPTSTR ? 2 : p->kind != K_FLAG && p->kind != K_NOFLAG;
}

int hpu__opts_takes_next(const char *name, const char *next)
{
	int wants = hpu__opts_takes_value(name);
	if (wants != 2)
		return wants == 1;
	size_t n = next ? strlen(next) : 0;
	return n > 0 && next[0] != '-' && !(n >= 3 && strcmp(next + n - 3, ".so") == 0);
}

/* A whole number lo..hi, also in the exponent form the help prints
 * defaults in and the config file takes (--sub-group-size 1e9, 5e7):
 * 0, else -1. */
static int parse_whole(const char *v, double lo, double hi, long *out)
{
	if (hpu__parse_long(v, (long)lo, (long)hi, out) == HPU_NUM_OK)
		return 0;
	/* [+-]DIGITS[.DIGITS](e|E)[+-]DIGITS, read exactly (no double: a
	 * seed past 2^53 read back rounded) */
	const char *s = v ? v + strspn(v, " \t") : NULL;
	if (!s || !strpbrk(s, "eE"))
		return -1;
	int neg = *s == '-';
	s += *s == '-' || *s == '+';
	unsigned __int128 m = 0;
	int digits = 0, frac = 0, seen = 0;
	for (; (*s >= '0' && *s <= '9') || (*s == '.' && !seen); s++) {
		if (*s == '.') {
			seen = 1;
			continue;
		}
		if (m > ((unsigned __int128)1 << 100)) /* more digits than any value here */
			return -1;
		m = m * 10 + (unsigned)(*s - '0');
		digits++;
		frac += seen;
	}
	if (!digits || (*s != 'e' && *s != 'E'))
		return -1;
	s++;
	int eneg = *s == '-';
	s += *s == '-' || *s == '+';
	long e = 0;
	if (*s < '0' || *s > '9')
		return -1;
	for (; *s >= '0' && *s <= '9'; s++)
		if ((e = e * 10 + (*s - '0')) > 1000)
			return -1;
	if (*s)
		return -1;
	long net = (eneg ? -e : e) - frac;
	for (; net < 0; net++) { /* a fraction: whole only if its digits are 0 */
		if (m % 10)
			return -1;
		m /= 10;
	}
	for (; net > 0 && m; net--)
		if ((m *= 10) > ((unsigned __int128)1 << 64))
			return -1;
	double mag = (double)m; /* for the range only: exact enough at its ends */
	if (neg ? -mag < lo : mag > hi)
		return -1;
	if (m > (unsigned __int128)LONG_MAX || (neg && m && lo >= 0))
		return -1;
	*out = neg ? -(long)m : (long)m;
	return *out >= (long)lo && (double)*out <= hi ? 0 : -1;
}

/* Parses v into p's field; -1 (field untouched) if it is not valid. */
int hpu__opt_set_value(hpu_train_opts *o, const struct hpu__opt *p,
		       const char *v)
{
	char *field = (char *)o + p->off;
	long l;
	double d;
	uint64_t u;
	int k;
	switch (p->kind) {
	case K_INT:
		if (parse_whole(v, p->lo, p->hi, &l))
			return -1;
		*(int *)field = (int)l;
		return 0;
	case K_LONG:
		if (parse_whole(v, p->lo, p->hi, &l))
			return -1;
		*(long *)field = l;
		return 0;
	case K_U64:
		if (parse_whole(v, p->lo, p->hi, &l))
			return -1;
		*(uint64_t *)field = (uint64_t)l;
		return 0;
	case K_DOUBLE:
		if (hpu__parse_double(v, p->lo, p->hi, &d))
			return -1;
		*(double *)field = d;
		return 0;
	case K_OPTSTR:
		if (!v)
			v = p->dflt;
		/* fall through */
	case K_STR:
		if (strlen(v) >= sizeof o->metrics || !*v)
			return -1;
		strcpy(field, v);
		return 0;
	case K_CHOICE:
		if ((k = hpu__choice(p, v, 0)) < 0)
			return -1;
		*(int *)field = k;
		return 0;
	case K_SIZE:
		if (hpu__parse_size(v, &u) || u == 0)
			return -1;
		*(uint64_t *)field = u;
		return 0;
	case K_MB:
		if (hpu__parse_double(v, p->lo, p->hi, &d) || d * 1048576 / 4 < 1)
			return -1;
		*(long *)field = (long)(d * 1048576 / 4);
		return 0;
	case K_FLAG:
		*(int *)field = 1;
		return 0;
	case K_NOFLAG:
		*(int *)field = 0;
		return 0;
	case K_CONFIG:
		break;
	}
	return -1;
}

/* What a valid value of p looks like, for error messages. */
const char *hpu__opt_expected(const struct hpu__opt *p, char *buf,
			      size_t len)
{
	size_t n = 0;
	switch (p->kind) {
	case K_INT:
	case K_LONG:
	case K_U64:
		snprintf(buf, len, "an integer from %.0f to %.0f", p->lo, p->hi);
		return buf;
	case K_DOUBLE:
		/* enough digits that a bound just below 1 does not print as 1
		 * (--beta2's 0.999999999) */
		snprintf(buf, len, "a number from %.10g to %.10g", p->lo, p->hi);
		return buf;
	case K_MB:
		snprintf(buf, len, "a number of MiB from 4 bytes (one fp32 element, 0.0000039) to %g",
			 p->hi);
		return buf;
	case K_CHOICE:
		n = (size_t)snprintf(buf, len, "one of");
		for (int i = 0; i < p->nnames && n < len; i++)
			n += (size_t)snprintf(buf + n, len - n, "%s %s",
					      i ? "," : "", p->names[i]);
		for (size_t i = 0, k = 0; i < sizeof choice_aliases / sizeof *choice_aliases; i++)
			if (!strcmp(p->name, choice_aliases[i].opt) && n < len)
				n += (size_t)snprintf(buf + n, len - n, "%s%s", k++ ? ", " : " (or ",
						      choice_aliases[i].alias);
		if (strchr(buf, '(') && n < len)
			snprintf(buf + n, len - n, ")");
		return buf;
	case K_SIZE:
		return "a size above 0 like 4096, 512K, 1.5G or 2GiB";
	default:
		return "a non-empty value";
	}
}

/* The option parser's value kinds are hpu__opts_takes_value's answers. */
_Static_assert(HPU_OPT_FLAG == 0 && HPU_OPT_VALUE == 1 && HPU_OPT_OPTIONAL == 2,
	       "hpu__opts_specs copies hpu__opts_takes_value");

/* The value's name in the help, by kind. */
static const char *const kind_arg[] = {
    [K_INT] = "N",      [K_LONG] = "N",    [K_U64] = "N",
    [K_DOUBLE] = "X",   [K_FLAG] = NULL,   [K_NOFLAG] = NULL,
    [K_STR] = "FILE",   [K_CHOICE] = "NAME", [K_SIZE] = "SIZE",
    [K_MB] = "X",       [K_CONFIG] = "FILE", [K_OPTSTR] = "DIR"};

/* The options whose value is not what their kind's name says: a string
 * that names a directory or a file name without its directory. The help
 * text names the value the same way. */
static const struct {
	const char *opt, *arg;
} opt_args[] = {
    {"checkpoint-dir", "DIR"}, {"resume", "DIR"}, {"nvme-path", "DIR"},
    {"param-nvme-path", "DIR"}, {"profile-filename", "NAME"},
    {"keep-best", "RULE"}, {"early-stop", "RULE"}, {"keep-last", "K"},
};

static const char *arg_of(const struct hpu__opt *p)
{
	for (size_t i = 0; i < sizeof opt_args / sizeof *opt_args; i++)
		if (!strcmp(p->name, opt_args[i].opt))
			return opt_args[i].arg;
	return kind_arg[p->kind];
}

const hpu_optspec *hpu__opts_specs(void)
{
	static hpu_optspec specs[NOPTS + 1]; /* filled on the first call */
	if (!specs[0].name)
		for (size_t i = 0; i < NOPTS; i++)
			specs[i] = (hpu_optspec){opts[i].name, 0, hpu__opts_takes_value(opts[i].name),
						 HPU_OPTS_ID + (int)i, arg_of(&opts[i]),
						 .help = opts[i].help};
	return specs;
}

/* ---- resolving against the world size ---- */

/* How a batch number is named in messages: DeepSpeed's key if the config
 * file gave it, else the flag (that gave it, or that would change the
 * default). */
static const char *bname(const hpu_train_opts *o, const char *flag,
			 const char *key, char *buf, size_t len)
{
	int from = o->from[hpu__opt_slot_named(flag)];
	if (from == HPU_FROM_FILE)
		snprintf(buf, len, "%s", key);
	else if (from == HPU_FROM_MODEL)
		snprintf(buf, len, "the model's default --%s", flag);
	else
		snprintf(buf, len, "--%s", flag);
	return buf;
}

static const char *in_file(const hpu_train_opts *o, const char *a, const char *b, char *buf,
			   size_t len);

static int resolve_batch(hpu_train_opts *o, int world, char *err,
			 size_t errlen)
{
	char nb[40], nm[40], ng[40], in[600];
	/* the file, where one of the three came from it (it went unnamed) */
	if (!*in_file(o, "batch-size", "micro-batch-size", in, sizeof in))
		in_file(o, "grad-accum", NULL, in, sizeof in);
	bname(o, "batch-size", "train_batch_size", nb, sizeof nb);
	bname(o, "micro-batch-size", "train_micro_batch_size_per_gpu", nm,
	      sizeof nm);
	bname(o, "grad-accum", "gradient_accumulation_steps", ng, sizeof ng);
	int gb = o->from[hpu__opt_slot_named("batch-size")] != 0;
	int gm = o->from[hpu__opt_slot_named("micro-batch-size")] != 0;
	int gg = o->from[hpu__opt_slot_named("grad-accum")] != 0;
	long long b = o->batch_size, m = o->micro_batch, g = o->grad_accum,
		  w = world;
	double prod = (double)m * (double)g * (double)w; /* may not fit */
	const struct hpu__opt *pb = hpu__opt_find("batch-size");
	const struct hpu__opt *pg = hpu__opt_find("grad-accum");

	if (gb && gm && gg) {
		if ((double)b != prod) {
			snprintf(err, errlen, "%s %lld != %s %lld x %s %lld x world size %lld = %.0f%s",
				 nb, b, nm, m, ng, g, w, prod, in);
			return -1;
		}
	} else if (gb && gm) {
		if (b % (m * w)) {
			snprintf(err, errlen, "%s %lld is not divisible by %s %lld x world size %lld%s",
				 nb, b, nm, m, w, in);
			return -1;
		}
		g = b / (m * w);
		if (g > pg->hi) {
			snprintf(err, errlen, "%s %lld / (%s %lld x world size %lld) = %lld gradient accumulation steps, more than %.0f%s",
				 nb, b, nm, m, w, g, pg->hi, in);
			return -1;
		}
	} else if (gm) {
		if (prod > pb->hi) {
			snprintf(err, errlen, "%s %lld x %s %lld x world size %lld = %.0f, more than the largest global batch %.0f%s",
				 nm, m, ng, g, w, prod, pb->hi, in);
			return -1;
		}
		b = m * g * w;
	} else {
		if (b % (g * w)) {
			snprintf(err, errlen, "%s %lld is not divisible by %s %lld x world size %lld%s",
				 nb, b, ng, g, w, in);
			return -1;
		}
		m = b / (g * w);
	}
	o->batch_size = (int)b;
	o->micro_batch = (int)m;
	o->grad_accum = (int)g;
	return 0;
}

/* Option `flag` with value `v` as a message names it: the config
 * file's key where the file set it ("zero_optimization.stage 2",
 * "zero_optimization.cpu_offload true"), else the flag ("--strategy
 * zero2"). */
static const char *said(const hpu_train_opts *o, const char *flag, const char *v, char *buf,
			size_t len)
{
	const char *k = hpu__opts_file_key(o, flag);
	const char *last = strrchr(k, '.');
	last = last ? last + 1 : k;
	if (!k[0] && hpu__opt_find(flag) && hpu__opt_find(flag)->kind == K_FLAG)
		snprintf(buf, len, "--%s", flag); /* a flag has no value ("--nesterov true") */
	else if (!k[0])
		snprintf(buf, len, "--%s %s", flag, v);
	else if (!strcmp(last, "stage"))
		snprintf(buf, len, "%s %d", k, (int)o->strategy - 1); /* f_stage: stage + 1 */
	else if (!strncmp(last, "cpu_offload", 11))
		snprintf(buf, len, "%s true", k);
	else
		snprintf(buf, len, "%s %s", k, v);
	return buf;
}

/* " (config file FILE)" where option a or b came from the file, else "". */
static const char *in_file(const hpu_train_opts *o, const char *a, const char *b, char *buf,
			   size_t len)
{
	if (o->config[0] &&
	    (hpu__opts_from(o, a) == HPU_FROM_FILE || (b && hpu__opts_from(o, b) == HPU_FROM_FILE)))
		snprintf(buf, len, " (config file %s)", o->config);
	else
		buf[0] = 0;
	return buf;
}

/* ZeRO-Offload as DeepSpeed allows it: the optimizer's state with
 * stages 1-3, parameters with stage 3; nvme needs a path. Values from
 * the config file are named by its keys. */
static int check_offload(hpu_train_opts *o, char *err, size_t errlen)
{
	hpu_strategy s = o->strategy;
	const char *so = hpu__strategy_name(s);
	char a[128], b[128], f[600];
	if (o->offload_optimizer && (s == HPU_STRATEGY_DDP || s == HPU_STRATEGY_FAST_DDP)) {
		const char *v = hpu__offload_name(o->offload_optimizer);
		if (in_file(o, "offload-optimizer", "strategy", f, sizeof f)[0])
			snprintf(err, errlen, "%s needs a ZeRO strategy (zero1, zero2 or zero3), not %s%s",
				 said(o, "offload-optimizer", v, a, sizeof a),
				 said(o, "strategy", so, b, sizeof b), f);
		else
			snprintf(err, errlen, "--offload-optimizer %s needs a ZeRO strategy (zero1, zero2 or zero3), not %s",
				 v, so);
		return -1;
	}
	if (o->offload_param && s != HPU_STRATEGY_ZERO3) {
		const char *v = hpu__offload_name(o->offload_param);
		if (in_file(o, "offload-param", "strategy", f, sizeof f)[0])
			snprintf(err, errlen, "%s works with zero3 only (DeepSpeed's stage 3), not %s%s",
				 said(o, "offload-param", v, a, sizeof a),
				 said(o, "strategy", so, b, sizeof b), f);
		else
			snprintf(err, errlen, "--offload-param %s works with --strategy zero3 only (DeepSpeed's stage 3), not %s",
				 v, so);
		return -1;
	}
	if (!o->param_nvme_path[0])
		snprintf(o->param_nvme_path, sizeof o->param_nvme_path, "%s", o->nvme_path);
	if (o->offload_optimizer == HPU_OFFLOAD_NVME && !o->nvme_path[0]) {
		if (in_file(o, "offload-optimizer", NULL, f, sizeof f)[0])
			snprintf(err, errlen, "%s needs zero_optimization.offload_optimizer.nvme_path "
				 "(or --nvme-path DIR)%s", said(o, "offload-optimizer", "nvme", a, sizeof a), f);
		else
			snprintf(err, errlen, "--offload-optimizer nvme needs --nvme-path DIR (offload_optimizer.nvme_path)");
		return -1;
	}
	if (o->offload_param == HPU_OFFLOAD_NVME && !o->param_nvme_path[0]) {
		if (in_file(o, "offload-param", NULL, f, sizeof f)[0])
			snprintf(err, errlen, "%s needs zero_optimization.offload_param.nvme_path "
				 "(or --param-nvme-path DIR)%s", said(o, "offload-param", "nvme", a, sizeof a), f);
		else
			snprintf(err, errlen, "--offload-param nvme needs --param-nvme-path DIR, or "
					      "--nvme-path DIR for both tiers (offload_param.nvme_path)");
		return -1;
	}
	if (o->aio_block_size % 4096) {
		snprintf(err, errlen, "--aio-block-size %llu is not a multiple of 4096 (O_DIRECT transfers whole blocks)",
			 (unsigned long long)o->aio_block_size);
		return -1;
	}
	if (o->aio_block_size > (1u << 30)) { /* an io_uring request's length is 32 bits */
		snprintf(err, errlen, "--aio-block-size %llu is above 1 GiB, the most one I/O request takes",
			 (unsigned long long)o->aio_block_size);
		return -1;
	}
	return 0;
}

/* --device: HPU_DEVICE when the option is not given. cuda and auto are
 * the worker's to resolve: whether the CUDA device's module loads and sees
 * a GPU is a question for the worker's node (worker/device). */
int hpu__opts_resolve_device(hpu_train_opts *o, char *err, size_t errlen)
{
	const char *env = hpu__env_str(HPU_ENV_HPU_DEVICE);
	int slot = hpu__opt_slot_named("device");
	if (env && *env && slot >= 0 && o->from[slot] == HPU_FROM_DEFAULT) {
		int k = hpu__pick(env, device_names, COUNT(device_names), 0);
		if (k < 0) {
			snprintf(err, errlen, "HPU_DEVICE=%s: not a device (cpu, cpu-strict, cuda or auto)",
				 env);
			return -1;
		}
		o->device = (hpu_device_kind)k;
	}
	return 0;
}

/* METRIC[:min|max] of option `opt`'s value s (buf, cut at the first
 * comma): into metric[64] and *max; -1 with a sentence. */
static int metric_mode(const char *opt, const char *s, char *buf, char *metric, int *max,
		       char *err, size_t errlen)
{
	char *mode = strchr(buf, ':');
	*max = 0;
	if (mode) {
		*mode++ = 0;
		if (strcmp(mode, "min") && strcmp(mode, "max")) {
			snprintf(err, errlen, "%s %s: mode '%s' is neither min nor max", opt, s, mode);
			return -1;
		}
		*max = !strcmp(mode, "max");
	}
	if (strncmp(buf, "val_", 4) || !buf[4] || strlen(buf) >= 64) {
		snprintf(err, errlen, "%s %s: the metric '%s' is not a validation one: "
				      "give val_loss or val_<a metric of the model>", opt, s, buf);
		return -1;
	}
	snprintf(metric, 64, "%s", buf);
	return 0;
}

int hpu__early_stop_parse(const char *s, hpu_early_stop *e, char *err, size_t errlen)
{
	static const char form[] = "expected METRIC[:min|max],PATIENCE[,MIN_DELTA], e.g. val_loss,3 or "
				   "val_accuracy:max,5,0.001";
	char buf[512];
	*e = (hpu_early_stop){0};
	snprintf(buf, sizeof buf, "%s", s);
	char *pat = strchr(buf, ','), *delta = NULL;
	if (!pat) {
		snprintf(err, errlen, "--early-stop %s: no PATIENCE: %s", s, form);
		return -1;
	}
	*pat++ = 0;
	if ((delta = strchr(pat, ',')))
		*delta++ = 0;
	if (metric_mode("--early-stop", s, buf, e->metric, &e->max, err, errlen) < 0)
		return -1;
	if (hpu__parse_long(pat, 1, 1000000000L, &e->patience)) {
		snprintf(err, errlen, "--early-stop %s: PATIENCE '%s' is not a whole number of "
				      "validations from 1", s, pat);
		return -1;
	}
	if (delta && hpu__parse_double(delta, 0, 1e30, &e->min_delta)) {
		snprintf(err, errlen, "--early-stop %s: MIN_DELTA '%s' is not a number of 0 or more",
			 s, delta);
		return -1;
	}
	return 0;
}

int hpu__keep_best_parse(const char *s, hpu_keep_best *k, char *err, size_t errlen)
{
	char buf[128];
	*k = (hpu_keep_best){0};
	snprintf(buf, sizeof buf, "%s", s);
	char *n = strchr(buf, ',');
	if (!n) {
		snprintf(err, errlen, "--keep-best %s: no K: expected METRIC[:min|max],K, e.g. "
				      "val_loss,3 or val_accuracy:max,2", s);
		return -1;
	}
	*n++ = 0;
	if (metric_mode("--keep-best", s, buf, k->metric, &k->max, err, errlen) < 0)
		return -1;
	long v;
	if (hpu__parse_long(n, 1, 1000000L, &v)) {
		snprintf(err, errlen, "--keep-best %s: K '%s' is not a whole number of checkpoints "
				      "from 1", s, n);
		return -1;
	}
	k->k = (int)v;
	return 0;
}

/* --keep-best and --keep-last: a checkpoint root, a validation to rank
 * by, and one count of the newest kept. */
static int check_keep(const hpu_train_opts *o, char *err, size_t errlen)
{
	if (o->keep_last && o->keep && o->keep != o->keep_last) {
		snprintf(err, errlen, "--keep %d and --keep-last %d both count the newest checkpoints "
				      "kept: give one", o->keep, o->keep_last);
		return -1;
	}
	if (!o->keep_best[0])
		return 0;
	hpu_keep_best k;
	if (hpu__keep_best_parse(o->keep_best, &k, err, errlen) < 0)
		return -1;
	if (!o->eval_every && !o->eval_every_epochs) {
		char a[400], in[600];
		snprintf(err, errlen, "%s ranks the checkpoints by the validation: add "
				      "--eval-every N or --eval-every-epochs N%s",
			 said(o, "keep-best", o->keep_best, a, sizeof a),
			 in_file(o, "keep-best", NULL, in, sizeof in));
		return -1;
	}
	return 0;
}

/* --eval-every, --eval-every-epochs and --val-fraction agree. */
static int check_validation(const hpu_train_opts *o, char *err, size_t errlen)
{
	/* named as given: a config file's key (hputrain.check_val_every_n_epoch
	 * 0 was "--eval-every-epochs 0", a flag the user never passed) */
	char v[40], a[128], in[600];
	int given = hpu__opts_from(o, "val-fraction") != HPU_FROM_DEFAULT;
	if (given && !(o->val_fraction > 0 && o->val_fraction < 1)) {
		snprintf(v, sizeof v, "%g", o->val_fraction);
		snprintf(err, errlen, "%s: give a fraction above 0 and below 1 of the training split to "
				      "hold out for validation%s",
			 said(o, "val-fraction", v, a, sizeof a),
			 in_file(o, "val-fraction", NULL, in, sizeof in));
		return -1;
	}
	double f = o->eval_every_epochs;
	if (hpu__opts_from(o, "eval-every-epochs") != HPU_FROM_DEFAULT &&
	    !(f > 0 && (f < 1 || f == floor(f)))) {
		snprintf(v, sizeof v, "%g", f);
		snprintf(err, errlen, "%s: give a whole number of epochs from 1, or a fraction of one "
				      "above 0 and below 1 (0.25: every quarter of an epoch)%s",
			 said(o, "eval-every-epochs", v, a, sizeof a),
			 in_file(o, "eval-every-epochs", NULL, in, sizeof in));
		return -1;
	}
	if (o->early_stop[0]) {
		hpu_early_stop e;
		if (hpu__early_stop_parse(o->early_stop, &e, err, errlen) < 0)
			return -1;
		if (!o->eval_every && !o->eval_every_epochs) {
			char e[400];
			snprintf(err, errlen, "%s watches the validation: add --eval-every N "
					      "or --eval-every-epochs N%s",
				 said(o, "early-stop", o->early_stop, e, sizeof e),
				 in_file(o, "early-stop", NULL, in, sizeof in));
			return -1;
		}
	}
	if (given && !o->eval_every && !o->eval_every_epochs) {
		snprintf(v, sizeof v, "%g", o->val_fraction);
		snprintf(err, errlen, "%s holds out samples that nothing validates on: "
				      "add --eval-every N or --eval-every-epochs N%s",
			 said(o, "val-fraction", v, a, sizeof a),
			 in_file(o, "val-fraction", NULL, in, sizeof in));
		return -1;
	}
	return 0;
}

int hpu__opts_resolve(hpu_train_opts *o, int world_size, char *err,
		      size_t errlen)
{
	char in[600];
	assert(world_size >= 1);
	if (resolve_batch(o, world_size, err, errlen) < 0)
		return -1;
	if (o->grad_comm_dtype == HPU_COMM_FP16 && o->precision != HPU_PREC_FP16_MIXED) {
		snprintf(err, errlen, "--grad-comm-dtype fp16 is 16-mixed's: its gradients are fp16 "
				      "and travel so; at --precision %s give fp32 or bf16%s",
			 hpu__precision_name(o->precision),
			 in_file(o, "grad-comm-dtype", NULL, in, sizeof in));
		return -1;
	}
	if (o->grad_comm_dtype == HPU_COMM_BF16 &&
	    o->strategy != HPU_STRATEGY_DDP &&
	    o->strategy != HPU_STRATEGY_FAST_DDP) {
		snprintf(err, errlen, "--grad-comm-dtype bf16 works with --strategy ddp or fast_ddp only, not %s",
			 hpu__strategy_name(o->strategy));
		return -1;
	}
	if (o->inject_overflow_step > 0 && o->precision == HPU_PREC_FP32) {
		snprintf(err, errlen, "--inject-overflow-step makes a mixed precision's 16-bit gradients "
				      "overflow: it needs --precision 16-mixed, bf16-mixed or fp8, not fp32");
		return -1;
	}
	/* the dynamic scale starts above its floor: an overflow lowers it
	 * to max(scale / 2, min), which from below the floor raised it */
	if (o->precision == HPU_PREC_FP16_MIXED && !(o->loss_scale > 0) &&
	    o->min_loss_scale > ldexp(1.0, o->initial_scale_power)) {
		char a[160], b[160], va[40], vb[16];
		snprintf(va, sizeof va, "%g", o->min_loss_scale);
		snprintf(vb, sizeof vb, "%d", o->initial_scale_power);
		snprintf(err, errlen, "%s is above the first loss scale, 2^%d = %g (%s): the first "
				      "overflow would raise the scale to it; lower it or raise "
				      "the first scale%s",
			 said(o, "min-loss-scale", va, a, sizeof a), o->initial_scale_power,
			 ldexp(1.0, o->initial_scale_power),
			 said(o, "initial-scale-power", vb, b, sizeof b),
			 in_file(o, "min-loss-scale", "initial-scale-power", in, sizeof in));
		return -1;
	}
	if (!o->checkpoint_dir[0] && (o->checkpoint_every || o->keep || o->keep_last ||
				      o->keep_best[0] || !strcmp(o->resume, "auto"))) {
		/* named as given: hputrain.checkpoint_every in a file was
		 * "--checkpoint-every" */
		const char *opt = o->checkpoint_every ? "checkpoint-every" : o->keep ? "keep"
				  : o->keep_last ? "keep-last" : o->keep_best[0] ? "keep-best"
				  : "resume";
		const char *key = hpu__opts_file_key(o, opt);
		snprintf(err, errlen, "%s%s needs --checkpoint-dir DIR%s", key[0] ? "" : "--",
			 key[0] ? key : !strcmp(opt, "resume") ? "resume auto" : opt,
			 in_file(o, opt, NULL, in, sizeof in));
		return -1;
	}
	if (check_validation(o, err, errlen) < 0 || check_keep(o, err, errlen) < 0)
		return -1;
	char a[160], b[160];
	/* a name, not a path: the ranks failed at their first write ("cannot
	 * write pf/a/b-rank1.json: No such file or directory") */
	if (strchr(o->profile_name, '/') || !strcmp(o->profile_name, ".") ||
	    !strcmp(o->profile_name, "..")) {
		snprintf(err, errlen, "%s: the traces' file name, not a path (they are "
				      "DIR/NAME-rank<R>.json, DIR from --profile)%s",
			 said(o, "profile-filename", o->profile_name, a, sizeof a),
			 in_file(o, "profile-filename", NULL, in, sizeof in));
		return -1;
	}
	if (o->optimizer == HPU_OPTIM_SGD && o->nesterov && !(o->momentum > 0)) {
		snprintf(err, errlen, "%s needs momentum, not %s%s: Nesterov momentum without one "
				      "is plain SGD (torch.optim.SGD refuses it)",
			 said(o, "nesterov", "true", a, sizeof a), said(o, "momentum", "0", b, sizeof b),
			 in_file(o, "nesterov", "momentum", in, sizeof in));
		return -1;
	}
	if (o->eval_only && (o->resume[0] || o->checkpoint_dir[0])) {
		snprintf(err, errlen, "--eval-only does not train: it takes no --resume or --checkpoint-dir "
				      "(hpu-ckpt export --format raw makes a --load-params file)");
		return -1;
	}
	if (check_offload(o, err, errlen) < 0 || hpu__opts_resolve_device(o, err, errlen) < 0)
		return -1;
	/* after the device is resolved (HPU_DEVICE may set it) */
	if (o->collectives == HPU_COLL_NCCL &&
	    (o->device == HPU_DEVICE_CPU || o->device == HPU_DEVICE_CPU_STRICT)) {
		snprintf(err, errlen, "--collectives nccl runs NCCL between GPUs: it needs --device cuda "
				      "(or auto), not %s", hpu__device_name(o->device));
		return -1;
	}
	if (o->resume[0] && o->load_params[0]) {
		snprintf(err, errlen, "--resume and --load-params both say where the parameters come from: give one");
		return -1;
	}
	return 0;
}

/* Whether a file can be made in dir: one made there and removed again;
 * 0, or -1 with errno. */
static int write_probe(const char *dir)
{
	char probe[4200];
	snprintf(probe, sizeof probe, "%s/.hpu-write-test-XXXXXX", dir);
	int fd = mkstemp(probe);
	if (fd < 0)
		return -1;
	close(fd);
	unlink(probe);
	return 0;
}

int hpu__opts_check_checkpoint_dir(const hpu_train_opts *o, char *err,
				   size_t errlen)
{
	const char *dir = o->checkpoint_dir;
	if (!dir[0])
		return 0;
	if (hpu__make_dirs_said("checkpoint", dir, err, errlen) < 0)
		return -1;
	if (write_probe(dir) < 0) {
		snprintf(err, errlen, "cannot write in the checkpoint directory %s: %s", dir,
			 strerror(errno));
		return -1;
	}
	return 0;
}

/* Output file `path` of option --opt (node 0's): not a directory, in a
 * directory it can write in, found before the workers start (not after
 * training, or at the worker's start-up for --metrics); "" passes. */
static int check_out_file(const char *opt, const char *path, char *err, size_t errlen)
{
	struct stat st;
	if (!path[0])
		return 0;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "--%s %s is a directory: give a file name", opt, path);
		return -1;
	}
	char dir[4096];
	hpu__dir_part(path, dir, sizeof dir);
	if (write_probe(dir) < 0) {
		snprintf(err, errlen, "--%s %s: cannot write in %s: %s", opt, path, dir,
			 strerror(errno));
		return -1;
	}
	return 0;
}

int hpu__opts_check_outputs(const hpu_train_opts *o, int node0, char *err, size_t errlen)
{
	if (hpu__opts_check_checkpoint_dir(o, err, errlen) < 0)
		return -1;
	if (!node0)
		return 0;
	if (check_out_file("metrics", o->metrics, err, errlen) < 0 ||
	    check_out_file("save-params", o->save_params, err, errlen) < 0)
		return -1;
	if (o->save_params[0] && o->metrics[0] && hpu__same_file(o->save_params, o->metrics)) {
		snprintf(err, errlen, "--save-params and --metrics name the same file (%s): the "
				      "parameters would overwrite the metrics", o->save_params);
		return -1;
	}
	return 0;
}

void hpu__opts_help(FILE *f)
{
	hpu__optdoc(f, hpu__opts_specs(), HPU_DOC_HELP, 27);
}
