/* config_keys: the top level of the JSON config file and its
 * zero_optimization and aio sections (the other sections are
 * config_keys_train.c's). Each section is a table of keys; a key either
 * sets one option of the option table in config.c or has a function of
 * its own (config_internal.h, struct fkey).
 */
#include "options/config.h"
#include "options/config_internal.h"

#include <cJSON.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* zero_optimization */

static int f_stage(struct fctx *c, const char *path, const cJSON *it)
{
	double v;
	if (hpu__cfg_want_number(c, path, it, 0, 3, 1, &v))
		return -1;
	/* stage 0 is plain data parallelism: ddp (not fast_ddp). */
	return hpu__cfg_put(c, path, hpu__opt_find("strategy"),
			    hpu__strategy_name((hpu_strategy)((int)v + 1)));
}

static int f_offload_optimizer(struct fctx *c, const char *path, const cJSON *it);
static int f_offload_param(struct fctx *c, const char *path, const cJSON *it);
static int f_cpu_offload(struct fctx *c, const char *path, const cJSON *it);
static int f_cpu_offload_params(struct fctx *c, const char *path, const cJSON *it);

/* DeepSpeed's DeepSpeedZeroConfig, which forbids unknown keys; the
 * stage3_ names and their short aliases are both accepted, as there. */
static const struct fkey zero_keys[] = {
	FN("stage", f_stage, 0),
	KEY("reduce_bucket_size", "reduce-bucket-size", 0),
	KEY("allgather_bucket_size", "allgather-bucket-size", 0),
	KEY("overlap_comm", "overlap-comm", 0),
	KEY("stage3_prefetch_bucket_size", "prefetch-bucket-size", 0),
	KEY("prefetch_bucket_size", "prefetch-bucket-size", 0),
	KEY("stage3_param_persistence_threshold", "param-persistence-threshold", 0),
	KEY("param_persistence_threshold", "param-persistence-threshold", 0),
	KEY("stage3_max_live_parameters", "max-live-parameters", 0),
	KEY("max_live_parameters", "max-live-parameters", 0),
	KEY("sub_group_size", "sub-group-size", 0),
	FN("offload_optimizer", f_offload_optimizer, 0),
	FN("offload_param", f_offload_param, 0),
	FN("cpu_offload", f_cpu_offload, 0),
	FN("cpu_offload_params", f_cpu_offload_params, 0),
	FN("cpu_offload_param", f_cpu_offload_params, 0),
	NONE("contiguous_gradients", "gradients always live in one contiguous buffer"),
	NONE("reduce_scatter", WHY_COLL),
	NONE("allgather_partitions", WHY_COLL),
	NONE("use_multi_rank_bucket_allreduce", WHY_COLL),
	NONE("round_robin_gradients", WHY_COLL),
	NONE("stage3_max_reuse_distance", "zero3 releases a layer after use and gathers it again"),
	NONE("max_reuse_distance", "zero3 releases a layer after use and gathers it again"),
	NONE("stage3_gather_16bit_weights_on_model_save", WHY_SAVE),
	NONE("stage3_gather_fp16_weights_on_model_save", WHY_SAVE),
	NONE("gather_16bit_weights_on_model_save", WHY_SAVE),
	NONE("elastic_checkpoint", WHY_SAVE),
	NONE("load_from_fp32_weights", "resume always loads the fp32 master weights"),
	NONE("ignore_unused_parameters", "a parameter no layer used gets a zero gradient"),
	NONE("legacy_stage1", WHY_NOTHERE),
	NONE("stage3_model_persistence_threshold", "only stage3_param_persistence_threshold decides what stays whole"),
	NONE("model_persistence_threshold", "only stage3_param_persistence_threshold decides what stays whole"),
	NONE("stage3_use_all_reduce_for_fetch_params", WHY_COLL),
	NONE("use_all_reduce_for_fetch_params", WHY_COLL),
	NONE("stage3_module_granularity_threshold", "zero3 gathers one layer at a time"),
	NONE("module_granularity_threshold", "zero3 gathers one layer at a time"),
	NONE("zero_hpz_partition_size", WHY_ZEROPP),
	NONE("zero_quantized_weights", WHY_ZEROPP),
	NONE("zero_quantized_nontrainable_weights", WHY_ZEROPP),
	NONE("zero_quantized_gradients", WHY_ZEROPP),
	NONE("zeropp_loco_param", WHY_ZEROPP),
	NONE("mics_shard_size", WHY_ZEROPP),
	NONE("mics_hierarchical_params_gather", WHY_ZEROPP),
	NONE("memory_efficient_linear", WHY_ALWAYS),
	NONE("pipeline_loading_checkpoint", WHY_NOTHERE),
	NONE("override_module_apply", WHY_NOTHERE),
	NONE("log_trace_cache_warnings", WHY_PROFILE),
	NONE("cpu_offload_use_pin_memory", WHY_PINNED),
};

static int f_zero(struct fctx *c, const char *path, const cJSON *it)
{
	/* DeepSpeed's older form, still read there (its getting-started
	 * page's "zero_optimization": true): true is stage 1 (with its
	 * allgather_bucket_size, 5e8, hputrain's default), false stage 0 */
	if (cJSON_IsBool(it))
		return hpu__cfg_put(c, path, hpu__opt_find("strategy"),
				    cJSON_IsTrue(it) ? "zero1" : "ddp");
	return WALK(c, it, path, zero_keys, 0, "", 0);
}

/* zero_optimization.offload_optimizer.ratio: the share of the optimizer
 * state offloaded; partial offload (ZeRO++'s twin-flow) is not here. */
static int f_offload_ratio(struct fctx *c, const char *path, const cJSON *it)
{
	double v;
	if (hpu__cfg_want_number(c, path, it, 0, 1, 0, &v))
		return -1;
	if (v != 1)
		return hpu__cfg_ferr(c, path, "%g: partial offload is not supported; give 1 (all of it)", v);
	return 0;
}

/* Key `path` asks for the optimizer's state (which 0) or the parameters
 * (1) to go to `at`: refused where the other name of the same choice
 * asked for another place (cpu_offload beside offload_optimizer was taken
 * in silence, cpu_offload winning). */
static int asked_offload(struct fctx *c, const char *path, int which, int at)
{
	static const char *const newer[] = {"offload_optimizer", "offload_param"};
	const struct hpu__opt *p = hpu__opt_find(which ? "offload-param" : "offload-optimizer");
	if (c->offload_by[which][0] && c->offload_at[which] != at) {
		/* the older key is the one not ending in ".device" */
		const char *old = strstr(path, ".device") ? c->offload_by[which] : path;
		const char *dot = strrchr(old, '.');
		return hpu__cfg_ferr(c, path, "asks for %s, but %s asked for %s: %s is DeepSpeed's "
				     "older name for %s {\"device\": \"cpu\"}; give one of them",
				     p->names[at], c->offload_by[which],
				     p->names[c->offload_at[which]], dot ? dot + 1 : old,
				     newer[which]);
	}
	snprintf(c->offload_by[which], sizeof c->offload_by[which], "%s", path);
	c->offload_at[which] = at;
	return 0;
}

/* offload_optimizer.device / offload_param.device: set as the option
 * checks them, then compared with cpu_offload / cpu_offload_params. */
static int f_device_as(struct fctx *c, const char *path, const cJSON *it, int which)
{
	const char *name = which ? "offload-param" : "offload-optimizer";
	if (hpu__cfg_file_opt(c, path, it, name) < 0)
		return -1;
	if (hpu__cfg_is_auto(it) || !cJSON_IsString(it))
		return 0;
	int at = hpu__choice(hpu__opt_find(name), it->valuestring, 1);
	return at < 0 ? 0 : asked_offload(c, path, which, at);
}

static int f_optimizer_device(struct fctx *c, const char *path, const cJSON *it)
{
	return f_device_as(c, path, it, 0);
}

static int f_param_device(struct fctx *c, const char *path, const cJSON *it)
{
	return f_device_as(c, path, it, 1);
}

static const struct fkey offload_optimizer_keys[] = {
	FN("device", f_optimizer_device, 0),
	KEY("nvme_path", "nvme-path", 0),
	KEY("buffer_count", "offload-buffer-count", 0),
	FN("ratio", f_offload_ratio, 0),
	/* Pinned memory is what a device's DMA needs; fast_init only speeds
	 * up DeepSpeed's own start-up; reads and writes always overlap. */
	NONE("pin_memory", WHY_PINNED),
	NONE("fast_init", "it speeds up DeepSpeed's own start-up"),
	NONE("pipeline_read", "nvme reads and writes always overlap the updates"),
	NONE("pipeline_write", "nvme reads and writes always overlap the updates"),
	NONE("pipeline", "nvme reads and writes always overlap the updates"),
};

static const struct fkey offload_param_keys[] = {
	FN("device", f_param_device, 0),
	KEY("nvme_path", "param-nvme-path", 0),
	KEY("buffer_count", "param-buffer-count", 0),
	KEY("buffer_size", "param-buffer-size", 0),
	KEY("max_in_cpu", "max-in-cpu", 0),
	NONE("pin_memory", WHY_PINNED),
};

static int f_offload_optimizer(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, offload_optimizer_keys, 0, "", 0);
}

static int f_offload_param(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, offload_param_keys, 0, "", 0);
}

/* cpu_offload / cpu_offload_params: DeepSpeed's older booleans for
 * offload_optimizer / offload_param {"device": "cpu"}. */
static int f_cpu_offload_as(struct fctx *c, const char *path, const cJSON *it, int which)
{
	int on = 0;
	if (hpu__cfg_want_bool(c, path, it, &on))
		return -1;
	if (!on)
		return 0;
	if (asked_offload(c, path, which, HPU_OFFLOAD_CPU) < 0)
		return -1;
	return hpu__cfg_put(c, path, hpu__opt_find(which ? "offload-param" : "offload-optimizer"),
			    "cpu");
}

static int f_cpu_offload(struct fctx *c, const char *path, const cJSON *it)
{
	return f_cpu_offload_as(c, path, it, 0);
}

static int f_cpu_offload_params(struct fctx *c, const char *path, const cJSON *it)
{
	return f_cpu_offload_as(c, path, it, 1);
}

static const struct fkey aio_keys[] = {
	KEY("block_size", "aio-block-size", 0),
	KEY("queue_depth", "aio-queue-depth", 0),
	KEY("thread_count", "aio-thread-count", 0),
	KEY("single_submit", "aio-single-submit", 0),
	KEY("overlap_events", "no-aio-overlap-events", 0), /* true or false */
	KEY("intra_op_parallelism", "aio-thread-count", 0), /* thread_count's newer name */
	NONE("use_gds", "GPUDirect Storage: there is no GPU here"),
};

static int f_aio(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, aio_keys, 0, "", 0);
}

/* The top level, applied in this order; hputrain last, so that its
 * "strategy" overrides zero_optimization.stage. DeepSpeed ignores keys it
 * does not know here, so an unknown key is an error only when it is
 * close to a known one (a misspelling); others are named in the
 * warning (W_LENIENT). */
static const struct fkey top_keys[] = {
	KEY("train_batch_size", "batch-size", 0),
	KEY("train_micro_batch_size_per_gpu", "micro-batch-size", 0),
	KEY("gradient_accumulation_steps", "grad-accum", 0),
	KEY("gradient_clipping", "clip-grad-norm", 0),
	KEY("use_hpu_graphs_for_training", "graphs", 0), /* Optimum Habana's */
	KEY("steps_per_print", "log-every", 0),
	KEY("communication_data_type", "grad-comm-dtype", 0),
	FN("zero_optimization", f_zero, 0),
	FN("aio", f_aio, 0),
	FN("optimizer", hpu__cfg_optimizer, 0),
	FN("scheduler", hpu__cfg_scheduler, 0),
	FN("bf16", hpu__cfg_bf16, 0),
	FN("bfloat16", hpu__cfg_bf16, 0), /* DeepSpeed's older name */
	FN("fp8", hpu__cfg_fp8, 0),
	FN("fp16", hpu__cfg_fp16, 0),
	FN("amp", hpu__cfg_amp, 0),
	FN("hputrain", hpu__cfg_hputrain, 0),
	NONE("wall_clock_breakdown", WHY_PROFILE),
	NONE("memory_breakdown", WHY_PROFILE),
	NONE("timers", WHY_PROFILE),
	NONE("flops_profiler", WHY_PROFILE),
	NONE("comms_logger", WHY_PROFILE),
	NONE("tensorboard", WHY_MONITOR),
	NONE("wandb", WHY_MONITOR),
	NONE("csv_monitor", WHY_MONITOR),
	NONE("comet", WHY_MONITOR),
	NONE("prescale_gradients", WHY_REDUCE),
	NONE("gradient_predivide_factor", WHY_REDUCE),
	NONE("zero_allow_untested_optimizer", "every optimizer here works with every ZeRO stage"),
	NONE("zero_force_ds_cpu_optimizer", WHY_TORCH),
	NONE("cuda_visible_devices", WHY_DEVICES),
	NONE("sparse_gradients", "gradients are dense here"),
	NONE("disable_allgather", WHY_COLL),
	NONE("dump_state", "--verbose prints the configuration in force"),
	NONE("dataloader_drop_last", "the runtime's sampler makes the batches, and drops an epoch's last partial training batch either way"),
	NONE("activation_checkpointing", WHY_CKPT),
	NONE("checkpoint", "checkpoints are hputrain's own (--checkpoint-dir)"),
	NONE("load_universal_checkpoint", WHY_SAVE),
	NONE("data_types", "gradients accumulate in the precision's own type"),
	NONE("seq_parallel_communication_data_type", WHY_NOTHERE),
	NONE("elasticity", "batch sizes are as given; hpulaunch --max-restarts restarts a job"),
	NONE("autotuning", WHY_NOTHERE),
	NONE("compression_training", WHY_NOTHERE),
	NONE("quantize_training", WHY_NOTHERE),
	NONE("curriculum_learning", WHY_NOTHERE),
	NONE("data_efficiency", WHY_NOTHERE),
	NONE("progressive_layer_drop", WHY_NOTHERE),
	NONE("eigenvalue", WHY_NOTHERE),
	NONE("sparse_attention", WHY_NOTHERE),
	NONE("pipeline", WHY_NOTHERE),
	NONE("hybrid_engine", WHY_NOTHERE),
	NONE("nebula", WHY_NOTHERE),
	NONE("weight_quantization", WHY_NOTHERE),
	NONE("compile", WHY_NOTHERE),
	NONE("graph_harvesting", WHY_NOTHERE),
	NONE("use_data_before_expert_parallelism", WHY_NOTHERE),
};

/* ---- what sets a key misplaced at the top level ---- */

/* Names users put at a config file's top level for options of ours (the
 * Hugging Face and Optimum Habana TrainingArguments' names), as the
 * option they name; a section's key of the same name, or our flag's name
 * with underscores, needs no entry. */
static const struct {
	const char *name, *opt;
} hf_names[] = {
	{"distribution_strategy", "strategy"},
	{"logging_steps", "log-every"},
	{"num_train_epochs", "epochs"},
	{"learning_rate", "lr"},
	{"adam_beta1", "beta1"},
	{"adam_beta2", "beta2"},
	{"adam_epsilon", "eps"},
	{"lr_scheduler_type", "scheduler"},
	{"per_device_train_batch_size", "micro-batch-size"},
	{"max_grad_norm", "clip-grad-norm"},
	{"save_steps", "checkpoint-every"},
	{"save_total_limit", "keep-last"},
	{"eval_steps", "eval-every"},
	{"resume_from_checkpoint", "resume"},
};

/* A section table to search, with its path. */
struct hint_sec {
	const char *path;
	const struct fkey *keys;
	size_t n;
};

/* The sections in the order a hint prefers them: ours, the top level,
 * then DeepSpeed's. */
static int hint_sections(struct hint_sec *s, int max)
{
	int k = 0;
	const char *path;
	size_t n;
	const struct fkey *t = hpu__cfg_train_section(0, &path, &n); /* hputrain */
	s[k++] = (struct hint_sec){path, t, n};
	s[k++] = (struct hint_sec){"", top_keys, sizeof top_keys / sizeof top_keys[0]};
	for (int i = 1; k < max && (t = hpu__cfg_train_section(i, &path, &n)); i++)
		s[k++] = (struct hint_sec){path, t, n};
	const struct hint_sec own[] = {
		{"zero_optimization", zero_keys, sizeof zero_keys / sizeof zero_keys[0]},
		{"zero_optimization.offload_optimizer", offload_optimizer_keys,
		 sizeof offload_optimizer_keys / sizeof offload_optimizer_keys[0]},
		{"zero_optimization.offload_param", offload_param_keys,
		 sizeof offload_param_keys / sizeof offload_param_keys[0]},
		{"aio", aio_keys, sizeof aio_keys / sizeof aio_keys[0]},
	};
	for (size_t i = 0; k < max && i < sizeof own / sizeof own[0]; i++)
		s[k++] = own[i];
	return k;
}

/* The flag of table entry e: its option, or for a key with a function
 * of its own the option of the key's name (hputrain.precision); NULL
 * where none. */
static const char *entry_flag(const struct fkey *e, char *buf, size_t len)
{
	if (e->opt)
		return e->opt;
	size_t i;
	for (i = 0; e->key[i] && i + 1 < len; i++)
		buf[i] = e->key[i] == '_' ? '-' : e->key[i];
	buf[i] = '\0';
	return hpu__opt_find(buf) ? buf : NULL;
}

/* What sets top-level key `key`, which names one of our options
 * misplaced: a section's key of that name, else the key that sets the
 * option it names (hf_names, or the flag of its name). NULL: nothing. */
static const char *top_hint(const char *key, char *buf, size_t len)
{
	/* Optimum Habana's gaudi_config.json keys (coming-from.md): said
	 * with what does that here (a run given use_torch_autocast trained
	 * in fp32 with "not a key hputrain knows") */
	static const struct {
		const char *key, *what;
	} gaudi[] = {
	    {"use_torch_autocast", "Gaudi's bf16 autocast: here --precision bf16-mixed (or this "
				   "file's bf16.enabled) turns it on, or this run is fp32"},
	    {"autocast_bf16_ops", "Gaudi's autocast list: here LOWER_LIST=FILE (one op a line) "
				  "with --precision bf16-mixed"},
	    {"autocast_fp32_ops", "Gaudi's autocast list: here FP32_LIST=FILE (one op a line) "
				  "with --precision bf16-mixed"},
	    {"use_fused_adam", "the optimizers have one implementation each, fused"},
	    {"use_fused_clip_norm", "gradient clipping has one implementation, fused"},
	    {"use_fused_rope", "no rotary embedding layer here"},
	    {"use_fused_rms_norm", "no RMS norm layer here"},
	    {"use_dynamic_shapes", "a batch of another shape records its own graph (--graphs)"},
	    {"gradient_checkpointing", "Optimum Habana's: here --activation-checkpointing (or this "
				       "file's hputrain.activation_checkpointing)"},
	    {"use_hpu_graphs_for_inference", "Optimum Habana's: --graphs (use_hpu_graphs_for_"
					     "training) records the evaluation's batches too"},
	};
	for (size_t i = 0; i < sizeof gaudi / sizeof *gaudi; i++)
		if (!strcmp(key, gaudi[i].key)) {
			snprintf(buf, len, "%s", gaudi[i].what);
			return buf;
		}
	struct hint_sec s[16];
	int ns = hint_sections(s, 16);
	char fb[64], name[64];
	const char *opt = NULL;
	/* 1: a section's key of that name */
	for (int i = 0; i < ns; i++) {
		if (!*s[i].path)
			continue; /* the top level itself: not this key */
		for (size_t j = 0; j < s[i].n; j++) {
			const struct fkey *e = &s[i].keys[j];
			if (e->why || strcmp(e->key, key) != 0)
				continue;
			const char *f = entry_flag(e, fb, sizeof fb);
			if (f && !strncmp(f, "no-", 3)) /* hputrain.eval */
				snprintf(buf, len, "not a top-level key: this file's %s.%s, or the "
						   "flag --%s for false, sets it",
					 s[i].path, key, f);
			else if (f)
				snprintf(buf, len, "not a top-level key: this file's %s.%s, or the "
						   "flag --%s, sets it",
					 s[i].path, key, f);
			else
				snprintf(buf, len, "not a top-level key: this file's %s.%s sets it",
					 s[i].path, key);
			return buf;
		}
	}
	/* 2: the option it names */
	for (size_t i = 0; i < sizeof hf_names / sizeof hf_names[0]; i++)
		if (strcmp(key, hf_names[i].name) == 0)
			opt = hf_names[i].opt;
	if (!opt && strlen(key) < sizeof name) {
		size_t i;
		for (i = 0; key[i]; i++)
			name[i] = key[i] == '_' ? '-' : key[i];
		name[i] = '\0';
		opt = name;
	}
	if (!opt || !hpu__opt_find(opt))
		return NULL;
	for (int i = 0; i < ns; i++)
		for (size_t j = 0; j < s[i].n; j++) {
			const struct fkey *e = &s[i].keys[j];
			if (e->why || !e->opt || strcmp(e->opt, opt) != 0)
				continue;
			snprintf(buf, len, "not a top-level key: this file's %s%s%s%s, or the flag "
					   "--%s, sets it",
				 s[i].path, *s[i].path ? "." : "", e->key,
				 strncmp(opt, "no-", 3) ? "" : " (false)", opt);
			return buf;
		}
	/* the typed sections' type */
	if (!strcmp(opt, "optimizer") || !strcmp(opt, "scheduler"))
		snprintf(buf, len, "not a top-level key: this file's %s.type, or the flag --%s, "
				   "sets it",
			 opt, opt);
	else
		snprintf(buf, len, "not a key of this file: the flag --%s sets it", opt);
	return buf;
}

int hpu__cfg_walk_top(struct fctx *c, const cJSON *root)
{
	c->hint = top_hint;
	int rc = WALK(c, root, "", top_keys, 0, "", W_LENIENT);
	c->hint = NULL;
	return rc;
}
