/* config: the training options, parsed the same way by hpulaunch (which
 * checks them before starting anything and forwards them) and hpu-worker.
 *
 * Options come from three places, in increasing precedence: the defaults,
 * a DeepSpeed-style JSON file (--config FILE), and command-line flags. A
 * flag beats the file whatever their order on the command line. */
#ifndef HPU_CONFIG_H
#define HPU_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/opt.h"

typedef enum hpu_optim_kind {
	HPU_OPTIM_SGD = 0,
	HPU_OPTIM_ADAMW, /* torch.optim.AdamW: decoupled weight decay */
	HPU_OPTIM_ADAM,  /* torch.optim.Adam: L2 weight decay added to g */
} hpu_optim_kind;

typedef enum hpu_strategy {
	HPU_STRATEGY_FAST_DDP = 0,
	HPU_STRATEGY_DDP,
	HPU_STRATEGY_ZERO1,
	HPU_STRATEGY_ZERO2,
	HPU_STRATEGY_ZERO3,
} hpu_strategy;

typedef enum hpu_sched_kind {
	HPU_SCHED_CONSTANT = 0,
	HPU_SCHED_STEP,         /* torch StepLR: lr * gamma^(k / step_size) */
	HPU_SCHED_COSINE,       /* torch CosineAnnealingLR to min_lr */
	HPU_SCHED_WARMUP,       /* DeepSpeed WarmupLR */
	HPU_SCHED_WARMUP_DECAY, /* DeepSpeed WarmupDecayLR */
} hpu_sched_kind;

typedef enum hpu_warmup_type {
	HPU_WARMUP_LOG = 0, /* DeepSpeed's default */
	HPU_WARMUP_LINEAR,
} hpu_warmup_type;

typedef enum hpu_comm_dtype {
	HPU_COMM_FP32 = 0,
	HPU_COMM_BF16,
	HPU_COMM_FP16, /* 16-mixed's own (DeepSpeed's communication_data_type
			* "fp16"): refused at any other precision */
} hpu_comm_dtype;

typedef enum hpu_precision {
	HPU_PREC_FP32 = 0,
	HPU_PREC_BF16_MIXED, /* bf16 working copies, gradients and traffic */
	HPU_PREC_FP16_MIXED, /* fp16 working copies, dynamic loss scaling */
	HPU_PREC_FP8,        /* bf16-mixed, with linear layers in fp8 */
} hpu_precision;

/* The device a worker computes on (--device; worker/device/device.h). */
typedef enum hpu_device_kind {
	HPU_DEVICE_CPU = 0,    /* the host's cores: the default */
	HPU_DEVICE_CPU_STRICT, /* cpu whose memory host code cannot touch (tests) */
	HPU_DEVICE_CUDA,       /* an NVIDIA GPU (worker/cuda's module) */
	HPU_DEVICE_AUTO,       /* cuda where built and visible, else cpu */
} hpu_device_kind;

/* What carries the gradients' all-reduce between GPU workers
 * (--collectives; worker/strategy/strategy_dcoll.c). */
typedef enum hpu_collectives {
	HPU_COLL_DEVICE = 0, /* the device's own (CUDA IPC on one node), else
			      * libhpucoll through host memory: the default */
	HPU_COLL_NCCL,       /* NCCL (cuda; libnccl.so.2 where installed; a
			      * GPU per rank) */
} hpu_collectives;

/* Where ZeRO-Offload keeps a model state (DeepSpeed's "device"). */
typedef enum hpu_offload {
	HPU_OFFLOAD_NONE = 0, /* on the device (--device-memory) */
	HPU_OFFLOAD_CPU,      /* in host memory (--host-memory) */
	HPU_OFFLOAD_NVME,     /* in files under an nvme_path */
} hpu_offload;

/* --save-params-format: the file --save-params writes. */
enum {
	HPU_PARAMS_AUTO = 0,     /* raw for a name ending in .bin or .raw, else safetensors */
	HPU_PARAMS_SAFETENSORS,  /* names, shapes, F32 (ckpt/safetensors.h) */
	HPU_PARAMS_RAW,          /* every parameter's floats, unpadded, in declaration order */
};

typedef enum hpu_fp8_algo {
	HPU_FP8_ALGO_MAX = 0,     /* the max over the amax history */
	HPU_FP8_ALGO_MOST_RECENT, /* the last step's amax */
} hpu_fp8_algo;

/* Where an option's value came from. The precedence, lowest first:
 * the built-in default, the model's declared default (HPU_MODEL's
 * .defaults, hpu__opts_set_model), the --config file, a flag. */
enum { HPU_FROM_DEFAULT = 0, HPU_FROM_FILE = 1, HPU_FROM_FLAG = 2, HPU_FROM_MODEL = 3 };
#define HPU_OPTS_MAX 112
#define HPU_CFG_AUTOS 48

typedef struct hpu_train_opts {
	int epochs;             /* passes over the training set */
	long max_steps;         /* stop after this many steps; -1: no limit */
	/* Batch sizes: batch_size = micro_batch * grad_accum * world size
	 * (DeepSpeed's train_batch_size, train_micro_batch_size_per_gpu,
	 * gradient_accumulation_steps). Any two determine the third;
	 * hpu__opts_resolve() fills in the one not given. */
	int batch_size;         /* global batch, summed over all ranks (256) */
	int micro_batch;        /* per rank per micro-step (resolved) */
	int grad_accum;         /* micro-steps per optimizer step (1) */
	double lr;              /* learning rate (the peak lr under warm-up) */
	hpu_optim_kind optimizer;
	double momentum;        /* SGD momentum */
	int nesterov;           /* SGD: Nesterov momentum */
	double weight_decay;    /* < 0: the optimizer's default */
	double beta1, beta2, eps; /* Adam, AdamW */
	double clip_norm;       /* gradient_clipping: max global L2 norm; 0: off */
	/* Learning-rate schedule; lr at optimizer step k (0-based) is the
	 * scheduler's value after k scheduler steps, as in torch and DeepSpeed. */
	hpu_sched_kind sched;
	long warmup_steps;      /* warmup_num_steps (1000) */
	hpu_warmup_type warmup_type;
	double warmup_min_lr;   /* warmup_min_lr (0); warmup_max_lr is lr */
	long total_steps;       /* WarmupDecayLR total_num_steps, cosine T_max;
				 * 0: the run's number of optimizer steps */
	long step_size;         /* StepLR (1000) */
	double gamma;           /* StepLR (0.1) */
	double min_lr;          /* cosine eta_min (0) */
	uint64_t seed;          /* parameter init and data shuffling */
	hpu_strategy strategy;
	/* Strategy knobs, in elements (floats) as DeepSpeed counts them. */
	long reduce_bucket;     /* ddp and zero2 gradient buckets (25 MiB of fp32) */
	long allgather_bucket;  /* zero1 partition/all-gather units (5e8) */
	int overlap_comm;       /* ddp/zero2/zero3: communicate during backward (1) */
	long prefetch_bucket;   /* zero3: elements gathered ahead (5e7) */
	long persistence_threshold; /* zero3: layers below stay whole (1e5) */
	long max_live_params;   /* zero3: gathered elements alive at once (1e9) */
	hpu_comm_dtype grad_comm_dtype; /* ddp / fast_ddp gradient all-reduce */
	/* Precision. Mixed: fp32 master weights in the optimizer, 16-bit
	 * working parameters and gradients, 16-bit traffic. */
	hpu_precision precision;
	double loss_scale;        /* 16-mixed: a static scale; 0: dynamic */
	int initial_scale_power;  /* dynamic: starts at 2^this (16) */
	long loss_scale_window;   /* doubles after this many good steps (1000) */
	int hysteresis;           /* overflows tolerated before halving (2) */
	double min_loss_scale;    /* never below (1) */
	long inject_overflow_step; /* testing: step N (1-based) overflows; 0: none */
	/* fp8: delayed scaling (Transformer Engine's DelayedScaling recipe) */
	int fp8_amax_history;     /* steps of amax kept per tensor (16) */
	int fp8_margin;           /* scales divided by 2^margin (0) */
	hpu_fp8_algo fp8_amax_algo; /* max | most_recent (max) */
	int activation_checkpointing; /* recompute every layer's forward */
	/* HPU graphs (issue 36): record a training step once per batch
	 * shape, after graphs_warmup eager steps, and replay it */
	int graphs;
	int graphs_warmup; /* (3) */
	int pad_last_batch; /* --graphs: an evaluation's last partial batch
			     * padded to the micro-batch (its padding left
			     * out of the sums) */
	/* ZeRO-Offload / ZeRO-Infinity (zero_optimization.offload_optimizer,
	 * .offload_param and aio in DeepSpeed's config). */
	hpu_offload offload_optimizer; /* zero1-3: optimizer state, master
					* weights, the gradient shard */
	hpu_offload offload_param;     /* zero3: the parameter shard */
	char nvme_path[512];           /* offload_optimizer.nvme_path */
	char param_nvme_path[512];     /* offload_param.nvme_path ("": nvme_path) */
	uint64_t host_memory;          /* bound on the host tier; 0: none */
	int offload_buffer_count;      /* offload_optimizer.buffer_count (4) */
	long sub_group_size;           /* zero_optimization.sub_group_size (1e9) */
	int param_buffer_count;        /* offload_param.buffer_count (5) */
	long param_buffer_size;        /* offload_param.buffer_size (1e8) */
	long max_in_cpu;               /* offload_param.max_in_cpu (1e9) */
	uint64_t aio_block_size;       /* aio.block_size (1 MiB) */
	int aio_queue_depth;           /* aio.queue_depth (8) */
	int aio_thread_count;          /* aio.thread_count (1) */
	int aio_single_submit;         /* aio.single_submit (0) */
	int aio_overlap_events;        /* aio.overlap_events (1) */
	uint64_t device_memory; /* bytes; 0: node memory / local devices */
	hpu_device_kind device; /* --device (cpu) */
	int allow_tf32;         /* --allow-tf32: fp32 products may use TF32 (cuda) */
	hpu_collectives collectives; /* --collectives (device) */
	int log_every;          /* log every N steps (0: never) */
	int verbose;            /* rank 0 prints the autocast policy at start-up,
				 * every worker its kernels (library, ISA) */
	int kernel_threads;     /* kernel threads per worker (1) */
	char metrics[512];      /* JSON-lines file written by rank 0, or "" */
	char save_params[512];  /* consolidated fp32 parameters (rank 0), or "" */
	char load_params[512];  /* start from a --save-params file, or "" */
	int save_params_format; /* HPU_PARAMS_AUTO | _SAFETENSORS | _RAW */
	int eval_only;          /* no training: evaluate (fp8 inference) */
	int calib_batches;      /* QUANT_CONFIG MEASURE: batches per rank (16) */
	/* Checkpoints (ckpt.h). */
	char checkpoint_dir[512]; /* the checkpoint root, or "" */
	long checkpoint_every;  /* save every N steps (0: only at the end) */
	int keep;               /* newest checkpoints kept (0: all) */
	int keep_last;          /* --keep-last: the same count (0: not given) */
	char keep_best[128];    /* --keep-best METRIC[:min|max],K or "" */
	char resume[512];       /* "auto", a checkpoint or a root, or "" */
	long stop_at_step;      /* checkpoint and stop after this step (0: no) */
	int max_skipped_steps;  /* non-finite steps in a row before the job stops */
	char config[512];       /* the JSON config file, or "" */
	/* Observing a run. */
	char profile[512];      /* --profile: trace directory, or "" (off) */
	char profile_name[512]; /* trace file prefix ("perf-logs") */
	long profile_warmup;    /* steps of the run not traced first (0) */
	long profile_steps;     /* steps traced after those (0: to the end) */
	long throughput_warmup; /* steps left out of samples/s (1) */
	double stall_warning;   /* seconds a collective waits before the
				 * stall warning (30; 0: never) */
	double hang_warning;    /* seconds a step, an evaluation or a save
				 * runs before one warning says where the
				 * rank is (600; 0: never) */
	int eval;               /* evaluate on the test split at the end */
	long eval_every;        /* validate every N steps (0: never) */
	double eval_every_epochs; /* validate every N epochs, or below 1: at
				   * every such fraction of one (0: never) */
	double val_fraction;    /* hold out this part of the training split to
				 * validate on (0: the test split) */
	char early_stop[512];   /* --early-stop METRIC[:min|max],PATIENCE[,MIN_DELTA] or "" */
	unsigned char from[HPU_OPTS_MAX]; /* HPU_FROM_* per option */
	char flag_name[HPU_OPTS_MAX][32]; /* the flag that set each option
					   * (aliases share one), for two
					   * names with two values */
	char file_key[HPU_OPTS_MAX][64]; /* the --config key that set each
					  * option ("" none), for messages */
	unsigned char implied[HPU_OPTS_MAX]; /* set from the file for a key its
					      * section left out (DeepSpeed's
					      * default): a model's declared
					      * default wins over it */
	/* What --config left to flags and defaults ("auto" values) and the
	 * keys it accepted that change nothing here ("key\twhy\n" lines):
	 * hpu__opts_config_notes says them. */
	struct hpu_cfg_auto {
		char key[80];  /* "optimizer.params.lr" */
		short slot[2]; /* the options' from[] slots; -1: none */
	} cfg_auto[HPU_CFG_AUTOS];
	int ncfg_auto;
	char cfg_ignored[4096];
} hpu_train_opts;

/* Fills o with the defaults (1 epoch, batch 256, AdamW lr 1e-3, ...). */
void hpu__opts_defaults(hpu_train_opts *o);

/* Whether `name` (without leading dashes) is a training option, and
 * whether it takes a value. Returns -1 if it is not one, else 0 (a flag),
 * 1 (a value) or 2 (an optional value: --profile [DIR]). */
int hpu__opts_takes_value(const char *name);

/* Whether option `name`, written without "=value", takes `next` (the
 * following argument, or NULL) as its value: always for a value; for an
 * optional value, unless next is missing, starts with '-' or names a
 * shared library (ends in ".so"). */
int hpu__opts_takes_next(const char *name, const char *next);

/* Sets option `name` (without dashes) from `value` (NULL for a flag), as a
 * command-line flag. --config FILE loads the file at once; values the file
 * sets never replace ones set by flags, before or after it. Returns 0, or
 * -1 with a sentence naming the option and value in err. */
int hpu__opts_set(hpu_train_opts *o, const char *name, const char *value,
		  char *err, size_t errlen);

/* Parses "--name value" / "--name=value" options from argv[*i] on, up to
 * the first argument that is not an option (after a "--", if one ends
 * them); leaves *i there. */
int hpu__opts_parse(hpu_train_opts *o, int argc, char **argv, int *i,
		    char *err, size_t errlen);

/* The training options as a table for the option parser (common/opt.h),
 * for a command that reads them among its own (hpulaunch): option i of
 * the table has the id HPU_OPTS_ID + i. */
enum { HPU_OPTS_ID = 1000 };
const hpu_optspec *hpu__opts_specs(void);

/* Sets the training option that p has just read (an id from
 * hpu__opts_specs()) from its value; an optional one written without
 * "=value" takes the next argument when hpu__opts_takes_next says so,
 * moving p->ind past it. Returns 0, or -1 with a sentence in err, as
 * hpu__opts_set. */
int hpu__opts_apply(hpu_train_opts *o, hpu_optparse *p, char *err,
		    size_t errlen);

/* Loads a DeepSpeed-style JSON config file (the keys are listed in
 * README.md). Unknown keys, wrong types and out-of-range values are errors
 * naming the key path ("zero_optimization.stage"); every one in the file is
 * in err, one a line. At the top level, as in DeepSpeed, an unknown key
 * far from every known one is ignored (and noted). */
int hpu__opts_load_file(hpu_train_opts *o, const char *path, char *err,
			size_t errlen);

/* After hpu__opts_resolve: a note for the flags given that the run's
 * other choices leave unread (--loss-scale at fp32,
 * --momentum with adamw, --graphs-warmup without --graphs), one note
 * naming the config file's "auto" values and what they were resolved to,
 * and one warning naming its keys that change nothing here and why;
 * nothing when there are none. */
void hpu__opts_config_notes(const hpu_train_opts *o, FILE *f, const char *prog);

/* Checks the options against a world size and fills in what follows from
 * them (the batch size not given). A batch mismatch names all three
 * values. Returns 0, or -1 with one sentence in err. */
/* --early-stop METRIC[:min|max],PATIENCE[,MIN_DELTA], parsed: stop when
 * `patience` validations in a row did not improve the metric by more
 * than min_delta (mode min: by falling; max: by rising). */
typedef struct hpu_early_stop {
	char metric[64]; /* "val_loss", "val_accuracy", ... */
	int max;         /* 1: larger is better; 0: smaller (the default) */
	long patience;
	double min_delta;
} hpu_early_stop;

/* Parses s into e; -1 with a sentence in err if it is not one. */
int hpu__early_stop_parse(const char *s, hpu_early_stop *e, char *err, size_t errlen);

/* --keep-best METRIC[:min|max],K, parsed: besides the newest, keep the
 * k checkpoints whose metric was best (min: lowest) at their save. */
typedef struct hpu_keep_best {
	char metric[64]; /* "val_loss", "val_accuracy", ... */
	int max;         /* 1: larger is better */
	int k;
} hpu_keep_best;

/* Parses s into k; -1 with a sentence in err if it is not one. */
int hpu__keep_best_parse(const char *s, hpu_keep_best *k, char *err, size_t errlen);

int hpu__opts_resolve(hpu_train_opts *o, int world_size, char *err,
		      size_t errlen);

/* The device alone, as hpu__opts_resolve sets it: HPU_DEVICE where no
 * option or config key gave --device. For hpulaunch, which needs it
 * before the world size (--devices auto counts GPUs for cuda). Returns 0,
 * or -1 with a sentence in err where HPU_DEVICE names no device. */
int hpu__opts_resolve_device(hpu_train_opts *o, char *err, size_t errlen);

/* Makes the checkpoint directory (--checkpoint-dir) if it is missing, as
 * the first save would, and checks that a file can be made in it (a
 * temporary file, removed again); nothing without a checkpoint directory.
 * Returns 0, or -1 with a sentence naming the directory and the reason in
 * err. */
int hpu__opts_check_checkpoint_dir(const hpu_train_opts *o, char *err,
				   size_t errlen);

/* What a run will write, checked at start rather than after training:
 * the checkpoint directory (hpu__opts_check_checkpoint_dir); and on node 0
 * (`node0`, where rank 0 writes them) --save-params names no directory, a
 * file can be made in its directory (a probe, removed again), and it is
 * not --metrics' file. 0, or -1 with a sentence naming the option, the
 * path and the reason in err. */
int hpu__opts_check_outputs(const hpu_train_opts *o, int node0, char *err, size_t errlen);

/* The options every rank of a job must share, as text in buf: a line
 * "name=value" each, in the table's order, of the resolved values (the
 * batch sizes filled in). Left out are what may differ between nodes or
 * ranks: --config (its values are in the text), --metrics (rank 0's),
 * a node's own files, memory, cores and I/O tuning (--nvme-path,
 * --device-memory, --host-memory, --kernel-threads, the aio options) and
 * what only prints (--verbose, --stall-warning, --profile-filename,
 * --throughput-warmup-steps). Of --checkpoint-dir, --resume, --load-params,
 * --save-params and --profile, which every rank acts on, only whether one
 * is given (and --resume auto): a node may keep its copy at another path.
 * Returns the length, or -1 if the text does not fit in len. */
int hpu__opts_shared_text(const hpu_train_opts *o, char *buf, size_t len);

/* The options whose lines differ between two hpu__opts_shared_text texts,
 * as "--lr (0.5 vs 0.001), --seed (1 vs 42)" in out (mine's value first;
 * "none" for an option one text lacks). Returns how many differ. */
int hpu__opts_shared_diff(const char *mine, const char *ref, char *out, size_t len);

/* The same for any two texts of "name=value" lines, each name shown after
 * `prefix` ("--" for the options). */
int hpu__lines_diff(const char *mine, const char *ref, const char *prefix, char *out, size_t len);

/* Whether training option `name` (without dashes) names a file or a
 * directory: --config, --metrics, --checkpoint-dir, --resume, ... */
int hpu__opts_is_path(const char *name);

/* Option `name`'s value made absolute against directory cwd, in *out
 * (malloc'd): value NULL is --profile's default ("."). Returns 1 with
 * *out set; 0 (*out NULL) when there is nothing to do (not a path option,
 * an empty or absolute value, --resume auto); -1 out of memory; -2 when
 * the result is longer than an option's value may be (511 bytes). */
int hpu__opts_abs_path(const char *name, const char *value, const char *cwd, char **out);

/* The k-th (from 0) path option whose value came from the --config file
 * (paths there are relative to the directory the command runs in, as a
 * flag's): returns its name, its value in *value; NULL past the last. */
const char *hpu__opts_file_path(const hpu_train_opts *o, int k, const char **value);

/* The weight decay in force (resolving the optimizer's default). */
double hpu__opts_weight_decay(const hpu_train_opts *o);

/* Where option `name` (which must exist) got its value: HPU_FROM_*. */
int hpu__opts_from(const hpu_train_opts *o, const char *name);

/* The config file's key that set option `name` ("zero_optimization.stage"),
 * or "" where its value did not come from the file. */
const char *hpu__opts_file_key(const hpu_train_opts *o, const char *name);

/* "default", "model", "config" or "flag": a HPU_FROM_* value in words. */
const char *hpu__opts_from_name(int from);

/* Sets option `name` (without dashes) from `value` as the model's
 * declared default: only where the option still has its built-in value,
 * since the --config file and flags beat the model. Returns 1 when set, 0
 * when a file or flag had set it (left alone), -1 with a sentence ending
 * in what was expected in err when the value is not one (checked in
 * either case: a model's bad declaration is refused even when overridden). */
int hpu__opts_set_model(hpu_train_opts *o, const char *name, const char *value,
			char *err, size_t errlen);

/* --verbose: the training settings (epochs, batch sizes, optimizer,
 * learning rate and schedule, precision, and every other option not at
 * its built-in value) as "setting --NAME VALUE (SOURCE)" lines, SOURCE
 * being where each came from (hpu__opts_from_name). After
 * hpu__opts_resolve: the batch size not given is "resolved". */
void hpu__opts_print_sources(const hpu_train_opts *o, FILE *f);

/* Parses a size: "4096", "512K", "1.5G", "2GiB", "64MB" (binary
 * multiples). Returns 0, or -1. */
int hpu__parse_size(const char *s, uint64_t *out);

const char *hpu__strategy_name(hpu_strategy s);
/* The strategy named s (fast_ddp .. zero3, or Lightning's names for them:
 * hpu_parallel, deepspeed_stage_1 .. 3, as --strategy takes them); -1. */
int hpu__strategy_of(const char *s);
const char *hpu__optim_name(hpu_optim_kind k);
const char *hpu__sched_name(hpu_sched_kind k);
const char *hpu__precision_name(hpu_precision p);
const char *hpu__device_name(hpu_device_kind d);
const char *hpu__offload_name(hpu_offload d);

/* Prints the training options' help. */
void hpu__opts_help(FILE *f);

#endif
