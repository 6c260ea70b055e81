/* config_notes: what a loaded config file left to flags and defaults
 * ("auto" values) and the keys that change nothing here, printed once
 * (hpu__opts_config_notes, config.h).
 */
#include "options/config.h"
#include "options/config_internal.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* "key=value (--flag)" for one "auto" value, at buf. */
static size_t auto_text(const hpu_train_opts *o, const struct hpu_cfg_auto *a, char *buf,
			size_t len)
{
	char v[2][64];
	const struct hpu__opt *p[2] = {hpu__opt_at(a->slot[0]), hpu__opt_at(a->slot[1])};
	for (int i = 0; i < 2; i++)
		if (p[i])
			hpu__opt_text(o, p[i], v[i], sizeof v[i]);
	/* the values whose number means something else */
	if (p[0]->off == offsetof(hpu_train_opts, weight_decay))
		snprintf(v[0], sizeof v[0], "%.15g", hpu__opts_weight_decay(o));
	if (p[0]->off == offsetof(hpu_train_opts, total_steps) && !o->total_steps)
		snprintf(v[0], sizeof v[0], "the run's steps");
	int from = o->from[a->slot[0]];
	int n = p[1] ? snprintf(buf, len, "%s=[%s, %s] (--%s, --%s", a->key, v[0], v[1],
				p[0]->name, p[1]->name)
		     : snprintf(buf, len, "%s=%s (--%s", a->key, v[0], p[0]->name);
	if (n < 0 || (size_t)n >= len)
		return n < 0 ? 0 : len - 1;
	int m = snprintf(buf + n, len - (size_t)n, "%s)",
			 from == HPU_FROM_FLAG			? ""
			 : from == HPU_FROM_FILE		? ", another key"
			 : hpu__opts_resolved(o, p[0]->name)	? ", from the other two batch sizes"
								: ", default");
	return m < 0 ? (size_t)n : (size_t)n + (size_t)m < len ? (size_t)n + (size_t)m : len - 1;
}

/* Whether option `name` was given on the command line. (A config file's
 * keys are left out: DeepSpeed's templates carry an fp16 section beside
 * bf16's, a scheduler's warm-up for every type, which the user did not
 * choose one by one.) */
static int given(const hpu_train_opts *o, const char *name)
{
	return hpu__opts_from(o, name) == HPU_FROM_FLAG;
}

/* One note for the options of `names` (NULL-ended) that were given but
 * that the run never reads, `why` after them. */
static void unread(const hpu_train_opts *o, FILE *f, const char *prog, const char *const *names,
		   const char *why)
{
	char list[256];
	size_t at = 0;
	int n = 0;
	for (int i = 0; names[i] && at + 1 < sizeof list; i++)
		if (given(o, names[i])) {
			at += (size_t)snprintf(list + at, sizeof list - at, "%s--%s", n ? ", " : "",
					       names[i]);
			n++;
		}
	if (n)
		fprintf(f, "%s: note: %s %s no effect %s\n", prog, list, n == 1 ? "has" : "have", why);
}

/* The offload tier's flags with nothing to tune: the nvme tier's without
 * nvme offload, one side's beside the other side's nvme alone. */
static void unread_offload(const hpu_train_opts *o, FILE *f, const char *prog)
{
	int on = o->offload_optimizer == HPU_OFFLOAD_NVME, pn = o->offload_param == HPU_OFFLOAD_NVME;
	if (!on && !pn) {
		unread(o, f, prog,
		       (const char *const[]){"nvme-path", "param-nvme-path", "sub-group-size",
					     "offload-buffer-count", "param-buffer-count",
					     "param-buffer-size", "max-in-cpu", "aio-block-size",
					     "aio-queue-depth", "aio-thread-count", "aio-single-submit",
					     "no-aio-overlap-events", NULL},
		       "without --offload-optimizer nvme or --offload-param nvme");
		return;
	}
	if (!on)
		unread(o, f, prog, (const char *const[]){"sub-group-size", "offload-buffer-count", NULL},
		       "without --offload-optimizer nvme");
	if (!on && hpu__opts_from(o, "param-nvme-path") != HPU_FROM_DEFAULT)
		unread(o, f, prog, (const char *const[]){"nvme-path", NULL},
		       "beside --param-nvme-path when only the parameters go to nvme");
	if (!pn)
		unread(o, f, prog, (const char *const[]){"param-nvme-path", "param-buffer-count",
							 "param-buffer-size", "max-in-cpu", NULL},
		       "without --offload-param nvme");
}

/* The flags given that this run's other choices leave unread (they were
 * taken in silence: --loss-scale at fp32, --momentum with adamw). */
static void unread_notes(const hpu_train_opts *o, FILE *f, const char *prog)
{
	char why[160];
	const char *prec = hpu__precision_name(o->precision);
	if (o->precision != HPU_PREC_FP16_MIXED) {
		snprintf(why, sizeof why, "at --precision %s: only 16-mixed scales the loss", prec);
		unread(o, f, prog,
		       (const char *const[]){"loss-scale", "initial-scale-power", "loss-scale-window",
					     "hysteresis", "min-loss-scale", NULL},
		       why);
	} else if (o->loss_scale > 0) {
		unread(o, f, prog,
		       (const char *const[]){"initial-scale-power", "loss-scale-window", "hysteresis",
					     "min-loss-scale", NULL},
		       "with a static --loss-scale (only the dynamic scale has them)");
	}
	if (o->precision != HPU_PREC_FP32) {
		snprintf(why, sizeof why, "at --precision %s: the gradients are %s already and travel so",
			 prec, o->precision == HPU_PREC_FP16_MIXED ? "fp16" : "bf16");
		unread(o, f, prog, (const char *const[]){"grad-comm-dtype", NULL}, why);
	}
	if (o->precision != HPU_PREC_FP8) {
		snprintf(why, sizeof why, "at --precision %s: they are fp8's", prec);
		unread(o, f, prog,
		       (const char *const[]){"fp8-amax-history", "fp8-margin", "fp8-amax-compute-algo",
					     NULL},
		       why);
	}
	if (o->optimizer != HPU_OPTIM_SGD)
		unread(o, f, prog, (const char *const[]){"momentum", "nesterov", NULL},
		       "with --optimizer adamw or adam: they are SGD's");
	if (o->sched != HPU_SCHED_WARMUP && o->sched != HPU_SCHED_WARMUP_DECAY)
		unread(o, f, prog, (const char *const[]){"warmup-steps", "warmup-type", "warmup-min-lr", NULL},
		       "without --scheduler warmup or warmup_decay");
	if (o->sched != HPU_SCHED_STEP)
		unread(o, f, prog, (const char *const[]){"step-size", "gamma", NULL},
		       "without --scheduler step");
	if (o->sched != HPU_SCHED_COSINE)
		unread(o, f, prog, (const char *const[]){"min-lr", NULL}, "without --scheduler cosine");
	if (o->sched != HPU_SCHED_WARMUP_DECAY && o->sched != HPU_SCHED_COSINE)
		unread(o, f, prog, (const char *const[]){"total-steps", NULL},
		       "without --scheduler warmup_decay or cosine");
	if (o->optimizer == HPU_OPTIM_SGD)
		unread(o, f, prog, (const char *const[]){"beta1", "beta2", "eps", NULL},
		       "with --optimizer sgd: they are Adam's and AdamW's");
	if (!o->graphs)
		unread(o, f, prog, (const char *const[]){"graphs-warmup", "pad-last-batch", NULL},
		       "without --graphs");
	if (o->device == HPU_DEVICE_CPU || o->device == HPU_DEVICE_CPU_STRICT) {
		snprintf(why, sizeof why, "on --device %s: its fp32 products stay fp32",
			 hpu__device_name(o->device));
		unread(o, f, prog, (const char *const[]){"allow-tf32", NULL}, why);
	}
	const char *strat = hpu__strategy_name(o->strategy);
	if (o->strategy != HPU_STRATEGY_ZERO3) {
		snprintf(why, sizeof why, "under --strategy %s: they are zero3's", strat);
		unread(o, f, prog,
		       (const char *const[]){"param-persistence-threshold", "prefetch-bucket-size",
					     "max-live-parameters", NULL},
		       why);
	}
	if (o->strategy != HPU_STRATEGY_ZERO1) {
		snprintf(why, sizeof why, "under --strategy %s: it is zero1's", strat);
		unread(o, f, prog, (const char *const[]){"allgather-bucket-size", NULL}, why);
	}
	if (o->strategy != HPU_STRATEGY_DDP && o->strategy != HPU_STRATEGY_ZERO2) {
		/* one option under two names (one slot): named once */
		snprintf(why, sizeof why,
			 "under --strategy %s: it (or --bucket-cap-mb) is ddp's and zero2's", strat);
		unread(o, f, prog, (const char *const[]){"reduce-bucket-size", NULL}, why);
	}
	if (o->offload_optimizer == HPU_OFFLOAD_NONE && o->offload_param == HPU_OFFLOAD_NONE)
		unread(o, f, prog, (const char *const[]){"host-memory", NULL},
		       "without --offload-optimizer or --offload-param: it bounds their host tier");
	if (!o->save_params[0])
		unread(o, f, prog, (const char *const[]){"save-params-format", NULL},
		       "without --save-params");
	if (!o->profile[0])
		unread(o, f, prog,
		       (const char *const[]){"profile-filename", "profile-warmup-steps", "profile-steps",
					     NULL},
		       "without --profile");
	if (o->eval_only)
		unread(o, f, prog,
		       (const char *const[]){"max-steps", "epochs", "lr", "optimizer", "scheduler",
					     "grad-accum", "clip-grad-norm", "early-stop",
					     "eval-every", "eval-every-epochs", "stop-at-step",
					     "profile-warmup-steps", "profile-steps", NULL},
		       "with --eval-only: it trains nothing");
	if (o->eval_only)
		unread(o, f, prog, (const char *const[]){"no-eval", "val-fraction", NULL},
		       "with --eval-only: it evaluates the test split");
	unread_offload(o, f, prog);
	/* --keep-best ranks the checkpoints saved at a validation's step */
	if (o->keep_best[0] && o->eval_every > 0 && o->checkpoint_every > 0 &&
	    o->checkpoint_every % o->eval_every != 0) {
		long a = o->checkpoint_every, b = o->eval_every;
		while (b) {
			long t = a % b;
			a = b;
			b = t;
		}
		fprintf(f, "%s: note: --keep-best ranks the checkpoints saved where the run "
			   "validates: with --eval-every %ld and --checkpoint-every %ld, every "
			   "%ld steps' (and the last's if it validates); make --eval-every a divisor "
			   "of --checkpoint-every\n",
			prog, o->eval_every, o->checkpoint_every,
			o->checkpoint_every / a * o->eval_every);
	}
	/* DeepSpeed's WarmupDecayLR warns and runs: the lr warms up, then is
	 * warmup_min_lr, the decay's total being past (it was refused here,
	 * naming flags a file's keys had set) */
	if (o->sched == HPU_SCHED_WARMUP_DECAY && o->total_steps > 0 &&
	    o->total_steps < o->warmup_steps) {
		const char *kt = hpu__opts_file_key(o, "total-steps");
		const char *kw = hpu__opts_file_key(o, "warmup-steps");
		fprintf(f, "%s: warning: --scheduler warmup_decay: %s %ld is less than %s %ld: the lr "
			   "warms up over %ld steps, then is the warm-up min lr (DeepSpeed's "
			   "WarmupDecayLR warns of the same)\n",
			prog, *kt ? kt : "--total-steps", o->total_steps, *kw ? kw : "--warmup-steps",
			o->warmup_steps, o->warmup_steps);
	}
	if (o->stop_at_step > 0 && o->max_steps >= 0 && o->stop_at_step >= o->max_steps &&
	    given(o, "stop-at-step"))
		fprintf(f, "%s: note: --stop-at-step %ld is not before --max-steps %ld: the run ends "
			   "there anyway (and saves at its end where --checkpoint-dir is given)\n",
			prog, o->stop_at_step, o->max_steps);
	else if (o->stop_at_step > 0 && !o->checkpoint_dir[0] && given(o, "stop-at-step") &&
		 !o->eval_only)
		fprintf(f, "%s: warning: --stop-at-step %ld without --checkpoint-dir: the run stops "
			   "after step %ld and saves no checkpoint to resume from\n",
			prog, o->stop_at_step, o->stop_at_step);
}

void hpu__opts_config_notes(const hpu_train_opts *o, FILE *f, const char *prog)
{
	unread_notes(o, f, prog);
	char line[4096];
	size_t at = 0;
	for (int i = 0; i < o->ncfg_auto && at + 2 < sizeof line; i++) {
		at += (size_t)snprintf(line + at, sizeof line - at, "%s", i ? ", " : "");
		at += auto_text(o, &o->cfg_auto[i], line + at, sizeof line - at);
	}
	if (o->ncfg_auto)
		fprintf(f, "%s: note: %s: \"auto\" values take hputrain's flags and defaults: %s\n",
			prog, o->config, line);
	if (!o->cfg_ignored[0])
		return;
	/* "k1, k2 (why); k3 (why2)": keys with the same reason together, in
	 * the order the reasons first appear */
	at = 0;
	for (const char *l = o->cfg_ignored; *l; l = strchr(l, '\n') + 1) {
		const char *why = strchr(l, '\t') + 1;
		size_t wl = strcspn(why, "\n");
		int seen = 0; /* this reason was said already */
		for (const char *e = o->cfg_ignored; e != l && !seen; e = strchr(e, '\n') + 1)
			seen = !strncmp(strchr(e, '\t') + 1, why, wl) && strchr(e, '\t')[1 + wl] == '\n';
		if (seen)
			continue;
		int first = 1;
		for (const char *e = l; *e; e = strchr(e, '\n') + 1) {
			const char *t = strchr(e, '\t');
			if (strncmp(t + 1, why, wl) || t[1 + wl] != '\n')
				continue;
			at += (size_t)snprintf(line + at, sizeof line - at, "%s%.*s",
					       first ? (at ? "; " : "") : ", ", (int)(t - e), e);
			first = 0;
			if (at >= sizeof line)
				break;
		}
		if (at < sizeof line)
			at += (size_t)snprintf(line + at, sizeof line - at, " (%.*s)", (int)wl, why);
		if (at >= sizeof line) {
			at = sizeof line - 1;
			break;
		}
	}
	fprintf(f, "%s: warning: %s: keys with no effect in hputrain: %s\n", prog, o->config, line);
}
