/* config_keys_train: the config file's sections of the training itself:
 * optimizer, scheduler, the precision (bf16, fp16, fp8, amp) and
 * hputrain's own keys (config_keys.c holds the top level that names them).
 */
#include "options/config.h"
#include "options/config_internal.h"

#include <cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static int f_noop(struct fctx *c, const char *path, const cJSON *it)
{
	(void)c, (void)path, (void)it;
	return 0;
}

/* optimizer: type and params. Keys not given take the defaults of the
 * constructor DeepSpeed calls (torch.optim.SGD's momentum 0, FusedAdam's
 * weight_decay 0: hpu__cfg_deepspeed_defaults), where no flag gives them;
 * the rest are hputrain's, which are the same. */

enum { O_SGD = 1, O_ADAMW = 2, O_ADAM = 4 };

static int f_betas(struct fctx *c, const char *path, const cJSON *it)
{
	static const char *names[] = {"beta1", "beta2"};
	char p[280], text[32];
	double v;
	if (hpu__cfg_is_auto(it)) {
		hpu__cfg_note_auto(c, path, hpu__opt_slot_named("beta1"), hpu__opt_slot_named("beta2"));
		return 0;
	}
	if (!cJSON_IsArray(it))
		return hpu__cfg_wrong_type(c, path, it, "an array of two numbers");
	if (cJSON_GetArraySize(it) != 2)
		return hpu__cfg_ferr(c, path, "expected two numbers [beta1, beta2], got %d",
				     cJSON_GetArraySize(it));
	for (int i = 0; i < 2; i++) {
		const struct hpu__opt *o = hpu__opt_find(names[i]);
		snprintf(p, sizeof p, "%s[%d]", path, i);
		if (hpu__cfg_want_number(c, p, cJSON_GetArrayItem(it, i), o->lo, o->hi,
					 0, &v) ||
		    hpu__cfg_put(c, p, o, hpu__cfg_num_text(v, text, sizeof text)))
			return -1;
	}
	return 0;
}

static int f_adam_w_mode(struct fctx *c, const char *path, const cJSON *it)
{
	return hpu__cfg_want_bool(c, path, it, &c->adam_w_mode);
}

/* A boolean that must have the value hputrain implements. */
static int must_be(struct fctx *c, const char *path, const cJSON *it, int want,
		   const char *why)
{
	int b = 0;
	if (hpu__cfg_want_bool(c, path, it, &b))
		return -1;
	return b == want ? 0 : hpu__cfg_ferr(c, path, "%s is not supported: %s", b ? "true" : "false", why);
}

static int f_amsgrad(struct fctx *c, const char *path, const cJSON *it)
{
	return must_be(c, path, it, 0, "hputrain's Adam has no AMSGrad variant");
}

static int f_bias_correction(struct fctx *c, const char *path, const cJSON *it)
{
	return must_be(c, path, it, 1, "Adam here always corrects its bias");
}

static int f_maximize(struct fctx *c, const char *path, const cJSON *it)
{
	return must_be(c, path, it, 0, "the optimizers minimize the loss");
}

static int f_dampening(struct fctx *c, const char *path, const cJSON *it)
{
	double v;
	if (hpu__cfg_want_number(c, path, it, 0, 1, 0, &v))
		return -1;
	return v == 0 ? 0 : hpu__cfg_ferr(c, path, "%g is not supported: SGD momentum here has no dampening", v);
}

static const struct fkey optim_param_keys[] = {
	KEY("lr", "lr", 0),
	FN("betas", f_betas, O_ADAM | O_ADAMW),
	KEY("eps", "eps", O_ADAM | O_ADAMW),
	KEY("weight_decay", "weight-decay", 0),
	KEY("momentum", "momentum", O_SGD),
	KEY("nesterov", "nesterov", O_SGD),
	FN("adam_w_mode", f_adam_w_mode, O_ADAM),
	FN("amsgrad", f_amsgrad, O_ADAM | O_ADAMW),
	FN("bias_correction", f_bias_correction, O_ADAM | O_ADAMW),
	FN("maximize", f_maximize, 0),
	FN("dampening", f_dampening, O_SGD),
	NONE("torch_adam", WHY_TORCH),
	NONE("fused", WHY_TORCH),
	NONE("foreach", WHY_TORCH),
	NONE("capturable", WHY_TORCH),
	NONE("differentiable", WHY_TORCH),
};

static const struct fkey typed_keys[] = {
	FN("type", f_noop, 0),
	FN("params", f_noop, 0),
};

/* A {"type": NAME, "params": {...}} section: returns the index of NAME in
 * types[n] (matched without case) and sets *params; -2 when the section is
 * empty, -1 after an error naming the key (`choices` lists the types). */
static int typed_section(struct fctx *c, const char *path, const cJSON *it,
			 const char **types, int n, const char *choices,
			 const cJSON **params)
{
	char p[280];
	if (WALK(c, it, path, typed_keys, 0, "", 0))
		return -1;
	const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
	*params = cJSON_GetObjectItemCaseSensitive(it, "params");
	snprintf(p, sizeof p, "%s.type", path);
	if (!type && !*params)
		return -2;
	if (!type)
		return hpu__cfg_ferr(c, p, "missing: give one of %s", choices);
	if (hpu__cfg_want_string(c, p, type))
		return -1;
	int k = hpu__pick(type->valuestring, types, n, 1);
	if (k < 0)
		return hpu__cfg_ferr(c, p, "\"%.40s\" is not one of %s", type->valuestring, choices);
	return k;
}

int hpu__cfg_optimizer(struct fctx *c, const char *path, const cJSON *it)
{
	static const char *types[] = {"SGD", "AdamW", "Adam"};
	static const unsigned masks[] = {O_SGD, O_ADAMW, O_ADAM};
	char p[280];
	const cJSON *params;
	int k = typed_section(c, path, it, types, 3, "Adam, AdamW, SGD", &params);
	if (k < 0)
		return k == -1 ? -1 : 0;
	c->adam_w_mode = 1; /* DeepSpeed's default */
	snprintf(p, sizeof p, "%s.params", path);
	if (params && WALK(c, params, p, optim_param_keys, masks[k], types[k], 0))
		return -1;
	c->ds_optim = k + 1;
	c->ds_wd_given = params && cJSON_GetObjectItemCaseSensitive(params, "weight_decay");
	c->ds_momentum_given = params && cJSON_GetObjectItemCaseSensitive(params, "momentum");
	const cJSON *lr = params ? cJSON_GetObjectItemCaseSensitive(params, "lr") : NULL;
	c->ds_lr_given = cJSON_IsNumber(lr);
	c->ds_lr = c->ds_lr_given ? lr->valuedouble : 0;
	c->ds_torch_adam =
		params && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(params, "torch_adam"));
	/* torch.optim.SGD refuses Nesterov without momentum, which the
	 * section leaving it out gives (DeepSpeed's SGD is torch's) */
	const cJSON *nest = params ? cJSON_GetObjectItemCaseSensitive(params, "nesterov") : NULL;
	if (k == 0 && cJSON_IsTrue(nest) && !c->ds_momentum_given) {
		snprintf(p, sizeof p, "%s.params.nesterov", path);
		return hpu__cfg_ferr(c, p, "true needs optimizer.params.momentum: SGD's momentum "
				     "is 0 where the section leaves it out, and Nesterov momentum "
				     "needs one (torch.optim.SGD refuses it)");
	}
	/* DeepSpeed's "Adam" is AdamW unless adam_w_mode is false. */
	hpu_optim_kind kind = k == 0 ? HPU_OPTIM_SGD
			      : k == 1 || c->adam_w_mode ? HPU_OPTIM_ADAMW
							 : HPU_OPTIM_ADAM;
	snprintf(p, sizeof p, "%s.type", path);
	return hpu__cfg_put(c, p, hpu__opt_find("optimizer"), hpu__optim_name(kind));
}

/* scheduler: type and params */

enum {
	S_CONST = 1 << HPU_SCHED_CONSTANT,
	S_STEP = 1 << HPU_SCHED_STEP,
	S_COS = 1 << HPU_SCHED_COSINE,
	S_WARM = 1 << HPU_SCHED_WARMUP,
	S_DECAY = 1 << HPU_SCHED_WARMUP_DECAY,
};

static const struct fkey sched_param_keys[] = {
	KEY("warmup_min_lr", "warmup-min-lr", S_WARM | S_DECAY),
	KEY("warmup_max_lr", "lr", S_WARM | S_DECAY),
	KEY("warmup_num_steps", "warmup-steps", S_WARM | S_DECAY),
	KEY("warmup_type", "warmup-type", S_WARM | S_DECAY),
	KEY("total_num_steps", "total-steps", S_DECAY),
	KEY("step_size", "step-size", S_STEP),
	KEY("gamma", "gamma", S_STEP),
	KEY("T_max", "total-steps", S_COS),
	KEY("eta_min", "min-lr", S_COS),
	NONE("last_batch_iteration", "a resumed run restores its scheduler from the checkpoint"),
};

int hpu__cfg_scheduler(struct fctx *c, const char *path, const cJSON *it)
{
	/* in the order of hpu_sched_kind */
	static const char *types[] = {"constant", "StepLR", "CosineAnnealingLR",
				      "WarmupLR", "WarmupDecayLR"};
	char p[280];
	const cJSON *params;
	int k = typed_section(c, path, it, types, 5,
			      "WarmupLR, WarmupDecayLR, StepLR, CosineAnnealingLR, constant",
			      &params);
	if (k < 0)
		return k == -1 ? -1 : 0;
	snprintf(p, sizeof p, "%s.type", path);
	if (hpu__cfg_put(c, p, hpu__opt_find("scheduler"),
			 hpu__sched_name((hpu_sched_kind)k)))
		return -1;
	snprintf(p, sizeof p, "%s.params", path);
	if (params && WALK(c, params, p, sched_param_keys, 1u << k, types[k], 0))
		return -1;
	c->ds_no_max_lr = (k == HPU_SCHED_WARMUP || k == HPU_SCHED_WARMUP_DECAY) &&
			  !(params && cJSON_GetObjectItemCaseSensitive(params, "warmup_max_lr"));
	if (k == HPU_SCHED_WARMUP_DECAY &&
	    !(params && cJSON_GetObjectItemCaseSensitive(params, "total_num_steps")) &&
	    c->o->from[hpu__opt_slot_named("total-steps")] != HPU_FROM_FLAG) {
		snprintf(p, sizeof p, "%s.params.total_num_steps", path);
		return hpu__cfg_ferr(c, p, "missing: WarmupDecayLR needs it");
	}
	return 0;
}

/* Option `name` takes `text` for a key its section left out, where
 * neither a flag nor a key of the file gave it (a key under the prefix
 * `over`, where not NULL, is overridden: DeepSpeed's scheduler sets the
 * lr its optimizer section gave). */
static int ds_default(struct fctx *c, const char *path, const char *name, const char *text,
		      const char *over)
{
	int s = hpu__opt_slot_named(name);
	int from = c->o->from[s];
	if (from == HPU_FROM_FLAG ||
	    (from == HPU_FROM_FILE && (!over || strncmp(c->o->file_key[s], over, strlen(over)))))
		return 0;
	c->over = 1;
	int rc = hpu__cfg_put(c, path, hpu__opt_find(name), text);
	c->over = 0;
	if (rc < 0)
		return -1;
	c->o->implied[s] = 1;
	return 0;
}

int hpu__cfg_deepspeed_defaults(struct fctx *c)
{
	/* the optimizer's own keys are walked already: only another section
	 * (hputrain's) may have given these */
	if (c->ds_optim == 1 && !c->ds_momentum_given &&
	    ds_default(c, "optimizer.params.momentum", "momentum", "0", NULL) < 0)
		return -1;
	/* FusedAdam's 0; with torch_adam, torch's AdamW (0.01, ours) or Adam
	 * (0, ours) */
	if (c->ds_optim > 1 && !c->ds_wd_given && !c->ds_torch_adam &&
	    ds_default(c, "optimizer.params.weight_decay", "weight-decay", "0", NULL) < 0)
		return -1;
	/* WarmupLR's max_lr replaces the optimizer's lr at every step: a
	 * given optimizer.params.lr then changes nothing, said */
	int lr = hpu__opt_slot_named("lr");
	int had_lr = c->o->from[lr] == HPU_FROM_FILE &&
		     !strncmp(c->o->file_key[lr], "optimizer.", 10);
	if (c->ds_no_max_lr &&
	    ds_default(c, "scheduler.params.warmup_max_lr", "lr", "0.001", "optimizer.") < 0)
		return -1;
	if (had_lr && c->o->from[lr] == HPU_FROM_FILE &&
	    strncmp(c->o->file_key[lr], "optimizer.", 10))
		hpu__cfg_note_ignored(c, "optimizer.params.lr",
				      "WarmupLR and WarmupDecayLR without warmup_max_lr set the lr "
				      "to DeepSpeed's 0.001 at every step");
	/* ... and with it, its value (it went unsaid: the same key changing
	 * nothing was named only without warmup_max_lr) */
	else if (c->ds_lr_given && c->o->from[lr] == HPU_FROM_FILE && c->ds_lr != c->o->lr &&
		 !strcmp(c->o->file_key[lr], "scheduler.params.warmup_max_lr"))
		hpu__cfg_note_ignored(c, "optimizer.params.lr",
				      "the scheduler's warmup_max_lr sets the lr at every step, as "
				      "DeepSpeed's WarmupLR and WarmupDecayLR do");
	return 0;
}

/* bf16, fp16, fp8: "enabled" picks the precision (two at once is an
 * error); fp16's loss-scaler keys set ours, fp8's the delayed-scaling
 * recipe (Transformer Engine's names). auto_cast and
 * consecutive_hysteresis are accepted and ignored (our scaler resets
 * hysteresis after a good window, DeepSpeed's default). */

/* Key `path` asks for precision `want`: refused where another key of the
 * file asked for another (hputrain.precision beside bf16.enabled was
 * taken in silence, the later key winning). */
static int asked_precision(struct fctx *c, const char *path, hpu_precision want)
{
	if (c->prec_by[0] && c->prec != (int)want) {
		size_t n = strlen(path), m = strlen(c->prec_by);
		if (n > 8 && m > 8 && !strcmp(path + n - 8, ".enabled") &&
		    !strcmp(c->prec_by + m - 8, ".enabled"))
			return hpu__cfg_ferr(c, path, "only one of bf16.enabled, fp16.enabled and fp8.enabled "
					     "can be true");
		return hpu__cfg_ferr(c, path, "asks for %s, but %s asked for %s: the file may name one "
				     "precision", hpu__precision_name(want), c->prec_by,
				     hpu__precision_name((hpu_precision)c->prec));
	}
	snprintf(c->prec_by, sizeof c->prec_by, "%s", path);
	c->prec = (int)want;
	return 0;
}

/* hputrain.precision, as the option checks it (aliases too); compared
 * with an enabled section where the file's value is the one in force (a
 * --precision flag wins over both) */
static int f_precision(struct fctx *c, const char *path, const cJSON *it)
{
	if (hpu__cfg_file_opt(c, path, it, "precision") < 0)
		return -1;
	if (hpu__cfg_is_auto(it) || c->o->from[hpu__opt_slot_named("precision")] != HPU_FROM_FILE)
		return 0;
	return asked_precision(c, path, c->o->precision);
}

static int f_enabled_as(struct fctx *c, const char *path, const cJSON *it,
			hpu_precision want)
{
	int on = 0;
	if (hpu__cfg_is_auto(it)) {
		hpu__cfg_note_auto(c, path, hpu__opt_slot_named("precision"), -1);
		return 0;
	}
	if (hpu__cfg_want_bool(c, path, it, &on))
		return -1;
	if (!on)
		return 0;
	if (asked_precision(c, path, want) < 0)
		return -1;
	return hpu__cfg_put(c, path, hpu__opt_find("precision"), hpu__precision_name(want));
}

static int f_bf16_enabled(struct fctx *c, const char *path, const cJSON *it)
{
	return f_enabled_as(c, path, it, HPU_PREC_BF16_MIXED);
}

static int f_fp16_enabled(struct fctx *c, const char *path, const cJSON *it)
{
	return f_enabled_as(c, path, it, HPU_PREC_FP16_MIXED);
}

static int f_fp8_enabled(struct fctx *c, const char *path, const cJSON *it)
{
	return f_enabled_as(c, path, it, HPU_PREC_FP8);
}

/* Transformer Engine's recipe format: HYBRID (E4M3 forward, E5M2
 * backward) is the one fp8 here runs; E4M3 everywhere is not. */
static int f_fp8_format(struct fctx *c, const char *path, const cJSON *it)
{
	if (hpu__cfg_want_string(c, path, it) < 0)
		return -1;
	if (!strcasecmp(it->valuestring, "HYBRID"))
		return 0;
	return hpu__cfg_ferr(c, path, "\"%.40s\" is not supported: fp8 here is Transformer Engine's "
				      "HYBRID recipe (E4M3 forward, E5M2 for the backward's gradients)",
			     it->valuestring);
}

static int f_consecutive_hysteresis(struct fctx *c, const char *path, const cJSON *it)
{
	return must_be(c, path, it, 0, "the scaler restores its hysteresis only after a good "
				       "window, as DeepSpeed's default (false) does, not after every "
				       "good step");
}

static const struct fkey fp8_keys[] = {
	FN("enabled", f_fp8_enabled, 0),
	FN("fp8_format", f_fp8_format, 0),
	KEY("amax_history_len", "fp8-amax-history", 0),
	KEY("margin", "fp8-margin", 0),
	KEY("amax_compute_algo", "fp8-amax-compute-algo", 0),
};

int hpu__cfg_fp8(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, fp8_keys, 0, "", 0);
}

static const struct fkey bf16_keys[] = {
	FN("enabled", f_bf16_enabled, 0),
	NONE("immediate_grad_update", WHY_ALWAYS),
	NONE("check_grad_overflow", "a non-finite loss or gradient always skips the step"),
	NONE("bf16_master_weights_and_grads", "master weights are always fp32"),
	NONE("bf16_optimizer_states", "optimizer states are always fp32"),
};

static const struct fkey fp16_keys[] = {
	FN("enabled", f_fp16_enabled, 0),
	KEY("loss_scale", "loss-scale", 0),
	KEY("initial_scale_power", "initial-scale-power", 0),
	KEY("loss_scale_window", "loss-scale-window", 0),
	KEY("hysteresis", "hysteresis", 0),
	KEY("min_loss_scale", "min-loss-scale", 0),
	NONE("auto_cast", "autocast decides per op what runs in 16 bits"),
	FN("consecutive_hysteresis", f_consecutive_hysteresis, 0),
	NONE("fp16_master_weights_and_grads", "master weights are always fp32"),
};

int hpu__cfg_bf16(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, bf16_keys, 0, "", 0);
}

int hpu__cfg_fp16(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, fp16_keys, 0, "", 0);
}

/* hputrain.val_check_interval, Lightning's: a fraction below 1 is a part
 * of an epoch (--eval-every-epochs F), else steps (--eval-every N). */
/* Whether --eval-every-epochs was set by this file's key `key` (its
 * last name) with value 1 (want_one) or with a fraction of an epoch. */
static int epochs_set_by(const struct fctx *c, const char *key, int want_one)
{
	int s = hpu__opt_slot_named("eval-every-epochs");
	const char *k = c->o->file_key[s], *last = strrchr(k, '.');
	double v = c->o->eval_every_epochs;
	return c->put[s] && !strcmp(last ? last + 1 : k, key) &&
	       (want_one ? v == 1 : v > 0 && v < 1);
}

/* Lightning's val_check_interval=0.25 beside its default
 * check_val_every_n_epoch=1, written out: a quarter of every epoch, the
 * fraction (it was refused as two values of --eval-every-epochs). */
static int f_check_val_every_n_epoch(struct fctx *c, const char *path, const cJSON *it)
{
	if (cJSON_IsNumber(it) && it->valuedouble == 1 &&
	    epochs_set_by(c, "val_check_interval", 0))
		return 0;
	return hpu__cfg_file_opt(c, path, it, "eval-every-epochs");
}

static int f_val_check_interval(struct fctx *c, const char *path, const cJSON *it)
{
	if (cJSON_IsNumber(it) && it->valuedouble > 0 && it->valuedouble < 1) {
		/* over check_val_every_n_epoch's 1, given before it */
		c->over = epochs_set_by(c, "check_val_every_n_epoch", 1);
		int rc = hpu__cfg_file_opt(c, path, it, "eval-every-epochs");
		c->over = 0;
		return rc;
	}
	/* said as Lightning's two meanings (it named --eval-every's range,
	 * 1..1e+15, where 0.5 is taken too) */
	if (cJSON_IsNumber(it) &&
	    (!(it->valuedouble > 0) || it->valuedouble != floor(it->valuedouble)))
		return hpu__cfg_ferr(c, path, "%g is neither a fraction of an epoch (above 0, below 1) "
				     "nor a whole number of steps (1 or more)", it->valuedouble);
	return hpu__cfg_file_opt(c, path, it, "eval-every");
}

/* hputrain: our own keys, named as our flags (dashes or underscores). */
static const struct fkey hputrain_keys[] = {
	KEY("strategy", "strategy", 0),
	FN("precision", f_precision, 0),
	KEY("epochs", "epochs", 0),
	KEY("max_steps", "max-steps", 0),
	KEY("seed", "seed", 0),
	KEY("device", "device", 0),
	KEY("device_memory", "device-memory", 0),
	KEY("allow_tf32", "allow-tf32", 0),
	KEY("collectives", "collectives", 0),
	KEY("host_memory", "host-memory", 0),
	KEY("activation_checkpointing", "activation-checkpointing", 0),
	KEY("graphs", "graphs", 0),
	KEY("graphs_warmup", "graphs-warmup", 0),
	KEY("pad_last_batch", "pad-last-batch", 0),
	KEY("grad_comm_dtype", "grad-comm-dtype", 0),
	KEY("log_every", "log-every", 0),
	KEY("metrics", "metrics", 0),
	KEY("save_params", "save-params", 0),
	KEY("save_params_format", "save-params-format", 0),
	KEY("load_params", "load-params", 0),
	KEY("eval_only", "eval-only", 0),
	KEY("calibration_batches", "calibration-batches", 0),
	KEY("checkpoint_dir", "checkpoint-dir", 0),
	KEY("checkpoint_every", "checkpoint-every", 0),
	KEY("keep_checkpoints", "keep", 0),
	KEY("keep_last", "keep-last", 0),
	KEY("keep_best", "keep-best", 0),
	KEY("resume", "resume", 0),
	KEY("eval", "no-eval", 0), /* true or false */
	KEY("eval_every", "eval-every", 0),
	KEY("eval_every_epochs", "eval-every-epochs", 0),
	KEY("val_fraction", "val-fraction", 0),
	KEY("early_stop", "early-stop", 0),
	FN("val_check_interval", f_val_check_interval, 0), /* Lightning's: steps, or a fraction */
	FN("check_val_every_n_epoch", f_check_val_every_n_epoch, 0), /* Lightning's */
};

int hpu__cfg_hputrain(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, hputrain_keys, 0, "", W_DASHES);
}

#define NKEYS(t) (sizeof(t) / sizeof((t)[0]))

const struct fkey *hpu__cfg_train_section(int i, const char **path, size_t *n)
{
	static const struct {
		const char *path;
		const struct fkey *keys;
		size_t n;
	} s[] = {
		{"hputrain", hputrain_keys, NKEYS(hputrain_keys)},
		{"optimizer.params", optim_param_keys, NKEYS(optim_param_keys)},
		{"scheduler.params", sched_param_keys, NKEYS(sched_param_keys)},
		{"fp16", fp16_keys, NKEYS(fp16_keys)},
		{"fp8", fp8_keys, NKEYS(fp8_keys)},
	};
	if (i < 0 || (size_t)i >= NKEYS(s))
		return NULL;
	*path = s[i].path;
	*n = s[i].n;
	return s[i].keys;
}

/* amp: apex's mixed precision, which is fp16 with loss scaling here. */
static int f_amp_enabled(struct fctx *c, const char *path, const cJSON *it)
{
	return f_enabled_as(c, path, it, HPU_PREC_FP16_MIXED);
}

static const struct fkey amp_keys[] = {
	FN("enabled", f_amp_enabled, 0),
	NONE("opt_level", "apex's levels: amp runs as 16-mixed, fp32 master weights (O2)"),
};

int hpu__cfg_amp(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, amp_keys, 0, "", 0);
}
