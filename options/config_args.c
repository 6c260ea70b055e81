/* config_args: the training options from the command line (see config.h).
 *
 * hpu__opts_parse and hpu__opts_set put each --flag through the option table
 * (config.c), and --config FILE through the config file loader
 * (config_file.c), which sets its keys through the same table. This file
 * stands above both; neither calls back into it, nor the table into the
 * loader.
 */
#include "options/config.h"
#include "options/config_internal.h"
#include "common/optdoc.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Lightning's names that mean something else here, said with what does
 * it (coming-from.md), after a refusal's list of names; "" for others. */
static const char *lightning_hint(const char *opt, const char *v)
{
	if (!strcmp(opt, "strategy")) {
		if (!strncmp(v, "deepspeed_stage_", 16) && strstr(v, "_offload_nvme"))
			return "; here: zero1-3 with --offload-optimizer nvme --nvme-path DIR";
		if (!strncmp(v, "deepspeed_stage_3_offload", 25))
			return "; here: zero3 with --offload-optimizer cpu --offload-param cpu";
		if (!strncmp(v, "deepspeed_stage_", 16) && strstr(v, "_offload"))
			return "; here: zero1-2 with --offload-optimizer cpu";
		if (!strcmp(v, "hpu_single") || !strcmp(v, "single_device"))
			return "; one worker is --devices 1, under any strategy";
		if (!strcmp(v, "auto"))
			return "; without --strategy it is fast_ddp";
	}
	if (!strcmp(opt, "precision") && !strcmp(v, "bf16-true"))
		return "; the master weights stay fp32 here (bf16-mixed)";
	if (!strcmp(opt, "precision") && !strcmp(v, "16-true"))
		return "; the master weights stay fp32 here (16-mixed)";
	return "";
}

static int set_config(hpu_train_opts *o, const struct hpu__opt *p,
		      const char *path, char *err, size_t errlen)
{
	if (!*path || strlen(path) >= sizeof o->config) {
		snprintf(err, errlen, "bad value '%s' for --config: expected a file name shorter than %zu bytes",
			 path, sizeof o->config);
		return -1;
	}
	/* one file: a second's keys mixed with the first's (an error in one
	 * named the other, a batch check failed on neither, the first's notes
	 * were lost) */
	if (o->config[0]) {
		snprintf(err, errlen, "--config given twice (%.200s, then %.200s): give one file",
			 o->config, path);
		return -1;
	}
	if (hpu__opts_load_file(o, path, err, errlen) < 0)
		return -1;
	strcpy(o->config, path);
	o->from[hpu__opt_slot(p)] = HPU_FROM_FLAG;
	return 0;
}

int hpu__opts_set(hpu_train_opts *o, const char *name, const char *value,
		  char *err, size_t errlen)
{
	const struct hpu__opt *p = hpu__opt_find(name);
	if (!p) {
		snprintf(err, errlen, "unknown option --%s", name);
		return -1;
	}
	int wants = hpu__opts_takes_value(name);
	if (wants == 1 && !value) {
		snprintf(err, errlen, "option --%s needs a value", name);
		return -1;
	}
	if (!wants && value) {
		snprintf(err, errlen, "option --%s takes no value", name);
		return -1;
	}
	if (p->kind == K_CONFIG)
		return set_config(o, p, value, err, errlen);
	/* two names of one option with two values (--bucket-cap-mb 2
	 * --reduce-bucket-size 10): refused, as in a config file's section;
	 * one name given twice takes its last value */
	int slot = hpu__opt_slot(p);
	const struct hpu__opt *prev = o->flag_name[slot][0] ? hpu__opt_find(o->flag_name[slot]) : NULL;
	char was[128] = "", now[128] = "";
	/* (a flag and its --no- form: the later wins, as a wrapper's default
	 * overridden by the user) */
	int other = o->from[slot] == HPU_FROM_FLAG && prev && strcmp(o->flag_name[slot], name) != 0 &&
		    wants && hpu__opts_takes_value(o->flag_name[slot]);
	hpu_train_opts *keep = other ? malloc(sizeof *keep) : NULL;
	if (other && !keep) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (other) {
		hpu__opt_text(o, prev, was, sizeof was); /* in the first name's units */
		*keep = *o; /* put back where refused */
	}
	if (hpu__opt_set_value(o, p, value) < 0) {
		free(keep);
		/* at most 200 bytes of the value: a path of thousands must not
		 * push the reason out of the message */
		char buf[160];
		int n = (int)strlen(value);
		snprintf(err, errlen, "bad value '%.*s%s' for --%s: expected %s%s", n > 200 ? 200 : n,
			 value, n > 200 ? "..." : "", name, hpu__opt_expected(p, buf, sizeof buf),
			 lightning_hint(p->name, value));
		return -1;
	}
	char again[128] = "";
	if (other && strcmp(hpu__opt_text(o, prev, again, sizeof again), was) != 0) {
		hpu__opt_text(o, p, now, sizeof now);
		snprintf(err, errlen, "--%s %s and --%s %s name one option with two values: give "
				      "one",
			 o->flag_name[slot], was, name, now);
		*o = *keep;
		free(keep);
		return -1;
	}
	free(keep);
	o->from[slot] = HPU_FROM_FLAG;
	snprintf(o->flag_name[slot], sizeof o->flag_name[slot], "%s", name);
	return 0;
}

int hpu__opts_apply(hpu_train_opts *o, hpu_optparse *p, char *err,
		    size_t errlen)
{
	const char *name = p->spec->name;
	if (!p->val && p->spec->value == HPU_OPT_OPTIONAL &&
	    hpu__opts_takes_next(name, p->ind < p->argc ? p->argv[p->ind] : NULL))
		p->val = p->argv[p->ind++];
	return hpu__opts_set(o, name, p->val, err, errlen);
}

/* The message of an option hpu__optparse_next refused (code r). */
static int parse_error(const hpu_optparse *p, int r, char *err, size_t errlen)
{
	size_t n = strcspn(p->arg + 2, "=");
	if (r == HPU_OPT_MISSING)
		snprintf(err, errlen, "option --%s needs a value", p->spec->name);
	else if (r == HPU_OPT_UNWANTED)
		snprintf(err, errlen, "option --%s takes no value", p->spec->name);
	else if (n >= 64) /* longer than any name */
		snprintf(err, errlen, "unknown option %s", p->arg);
	else
		snprintf(err, errlen, "unknown option --%.*s", (int)n, p->arg + 2);
	return -1;
}

int hpu__opts_parse(hpu_train_opts *o, int argc, char **argv, int *i,
		    char *err, size_t errlen)
{
	hpu_optparse p;
	hpu__optparse_init(&p, argc, argv, hpu__opts_specs());
	p.ind = *i;
	for (;;) {
		int r = hpu__optparse_next(&p);
		if (r > 0 && hpu__opts_apply(o, &p, err, errlen) < 0)
			return -1;
		if (r > 0)
			continue;
		/* the end, the model, or a single-dash argument: not ours */
		if (r == HPU_OPT_END || r == HPU_OPT_POSITIONAL ||
		    (r == HPU_OPT_UNKNOWN && p.arg[1] != '-')) {
			*i = p.at;
			return 0;
		}
		return parse_error(&p, r, err, errlen);
	}
}

int hpu__opts_set_model(hpu_train_opts *o, const char *name, const char *value,
			char *err, size_t errlen)
{
	const struct hpu__opt *p = hpu__opt_find(name);
	assert(p && hpu__opts_takes_value(name) == 1);
	/* a flag or a file's key wins; a default the file implied does not */
	int slot = hpu__opt_slot(p),
	    kept = o->from[slot] != HPU_FROM_DEFAULT &&
		   !(o->from[slot] == HPU_FROM_FILE && o->implied[slot]);
	/* checked whether or not a file or flag overrides it */
	hpu_train_opts *into = kept ? malloc(sizeof *into) : o;
	if (!into) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (kept)
		*into = *o;
	int bad = hpu__opt_set_value(into, p, value) < 0;
	if (kept)
		free(into);
	if (bad) {
		char buf[160];
		snprintf(err, errlen, "'%s' is not a valid --%s: expected %s", value, name,
			 hpu__opt_expected(p, buf, sizeof buf));
		return -1;
	}
	if (kept)
		return 0;
	o->from[slot] = HPU_FROM_MODEL;
	o->implied[slot] = 0;
	return 1;
}

const char *hpu__opts_from_name(int from)
{
	switch (from) {
	case HPU_FROM_FILE: return "config";
	case HPU_FROM_FLAG: return "flag";
	case HPU_FROM_MODEL: return "model";
	default: return "default";
	}
}

/* The settings --verbose always shows, given or not. */
static const char *const core_settings[] = {
	"epochs", "max-steps", "batch-size", "micro-batch-size", "grad-accum",
	"optimizer", "lr", "weight-decay", "scheduler", "warmup-steps", "min-lr",
	"precision", "seed",
};

static int is_core(const char *name)
{
	for (size_t k = 0; k < sizeof core_settings / sizeof *core_settings; k++)
		if (!strcmp(core_settings[k], name))
			return 1;
	return 0;
}

int hpu__opts_resolved(const hpu_train_opts *o, const char *name)
{
	int gb = hpu__opts_from(o, "batch-size") != HPU_FROM_DEFAULT;
	int gm = hpu__opts_from(o, "micro-batch-size") != HPU_FROM_DEFAULT;
	return hpu__opts_from(o, name) == HPU_FROM_DEFAULT &&
	       (!strcmp(name, "micro-batch-size") || (!strcmp(name, "batch-size") && gm) ||
		(!strcmp(name, "grad-accum") && gb && gm));
}

/* Where a batch number left to hpu__opts_resolve came from: "resolved"
 * for the one the other two determined. */
static const char *source_of(const hpu_train_opts *o, const char *name, int from)
{
	if (from == HPU_FROM_DEFAULT && hpu__opts_resolved(o, name))
		return "resolved";
	return hpu__opts_from_name(from);
}

void hpu__opts_print_sources(const hpu_train_opts *o, FILE *f)
{
	const struct hpu__opt *p;
	char buf[600];
	for (int i = 0; (p = hpu__opt_at(i)); i++) {
		if (hpu__opt_slot(p) != i || p->kind == K_CONFIG ||
		    (o->from[i] == HPU_FROM_DEFAULT && !is_core(p->name)))
			continue;
		const char *v = !strcmp(p->name, "weight-decay")
					? (snprintf(buf, sizeof buf, "%g", hpu__opts_weight_decay(o)), buf)
					: hpu__opt_text(o, p, buf, sizeof buf);
		if (p->kind == K_NOFLAG) /* --no-eval true: the field is eval's */
			v = *(const int *)((const char *)o + p->off) ? "false" : "true";
		if (!strcmp(p->name, "max-steps") && o->max_steps < 0) /* unset: -1, which it refuses */
			v = "none: --epochs decides";
		/* the file's key that set it, as configuration.md says ("config"
		 * alone left two keys of one option apart unnamed) */
		const char *key = o->from[i] == HPU_FROM_FILE ? o->file_key[i] : "";
		fprintf(f, "setting --%s %s (%s%s%s)\n", p->name, v, source_of(o, p->name, o->from[i]),
			*key ? ": " : "", key);
	}
}
