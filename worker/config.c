#include "config.h"

#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *strategy_names[] = {"fast_ddp", "ddp", "zero1", "zero2",
				       "zero3"};
static const char *optim_names[] = {"sgd", "adamw"};

void hpu_opts_defaults(hpu_train_opts *o)
{
	memset(o, 0, sizeof *o);
	o->epochs = 1;
	o->max_steps = -1;
	o->batch_size = 256;
	o->lr = 1e-3;
	o->optimizer = HPU_OPTIM_ADAMW;
	o->momentum = 0.9;
	o->weight_decay = -1;
	o->beta1 = 0.9;
	o->beta2 = 0.999;
	o->eps = 1e-8;
	o->seed = 42;
	o->strategy = HPU_STRATEGY_FAST_DDP;
	o->log_every = 50;
	o->eval = 1;
}

const char *hpu_strategy_name(hpu_strategy s)
{
	return strategy_names[s];
}

const char *hpu_optim_name(hpu_optim_kind k)
{
	return optim_names[k];
}

double hpu_opts_weight_decay(const hpu_train_opts *o)
{
	if (o->weight_decay >= 0)
		return o->weight_decay;
	return o->optimizer == HPU_OPTIM_ADAMW ? 0.01 : 0.0;
}

static int parse_long(const char *v, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (errno || end == v || *end || x < lo || x > hi)
		return -1;
	*out = x;
	return 0;
}

static int parse_double(const char *v, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double x = strtod(v, &end);
	if (errno || end == v || *end || !isfinite(x) || x < lo || x > hi)
		return -1;
	*out = x;
	return 0;
}

static int pick(const char *v, const char **names, int n)
{
	for (int i = 0; i < n; i++)
		if (strcmp(v, names[i]) == 0)
			return i;
	return -1;
}

enum kind { K_INT, K_LONG, K_DOUBLE, K_FLAG, K_NOFLAG, K_STR, K_OPTIM,
	    K_STRATEGY };

struct opt {
	const char *name;
	enum kind kind;
	size_t off;
	double lo, hi;
	const char *help;
};

#define OFF(f) offsetof(hpu_train_opts, f)
static const struct opt opts[] = {
	{"epochs", K_INT, OFF(epochs), 1, 1e6, "passes over the training set (1)"},
	{"max-steps", K_LONG, OFF(max_steps), 1, 1e15, "stop after N optimizer steps"},
	{"batch-size", K_INT, OFF(batch_size), 1, 1 << 24, "global batch, all ranks together (256)"},
	{"lr", K_DOUBLE, OFF(lr), 0, 1e6, "learning rate (1e-3)"},
	{"optimizer", K_OPTIM, OFF(optimizer), 0, 0, "sgd | adamw (adamw)"},
	{"momentum", K_DOUBLE, OFF(momentum), 0, 1, "SGD momentum (0.9)"},
	{"nesterov", K_FLAG, OFF(nesterov), 0, 0, "SGD with Nesterov momentum"},
	{"weight-decay", K_DOUBLE, OFF(weight_decay), 0, 1e6, "weight decay (adamw 0.01, sgd 0)"},
	{"beta1", K_DOUBLE, OFF(beta1), 0, 0.999999, "AdamW beta1 (0.9)"},
	{"beta2", K_DOUBLE, OFF(beta2), 0, 0.999999999, "AdamW beta2 (0.999)"},
	{"eps", K_DOUBLE, OFF(eps), 0, 1, "AdamW epsilon (1e-8)"},
	{"seed", K_LONG, OFF(seed), 0, 9e18, "seed for parameter init and shuffling (42)"},
	{"strategy", K_STRATEGY, OFF(strategy), 0, 0, "fast_ddp (ddp and zero1/2/3: not yet)"},
	{"log-every", K_INT, OFF(log_every), 0, 1e9, "log loss and samples/s every N steps (50; 0: never)"},
	{"metrics", K_STR, OFF(metrics), 0, 0, "write JSON lines of metrics to FILE (rank 0)"},
	{"no-eval", K_NOFLAG, OFF(eval), 0, 0, "skip the test-set evaluation at the end"},
};
#define NOPTS (sizeof opts / sizeof opts[0])

static const struct opt *find(const char *name)
{
	for (size_t i = 0; i < NOPTS; i++)
		if (strcmp(opts[i].name, name) == 0)
			return &opts[i];
	return NULL;
}

int hpu_opts_takes_value(const char *name)
{
	const struct opt *p = find(name);
	if (!p)
		return -1;
	return p->kind != K_FLAG && p->kind != K_NOFLAG;
}

static int set_value(hpu_train_opts *o, const struct opt *p, const char *v)
{
	char *field = (char *)o + p->off;
	long l;
	double d;
	int k;
	switch (p->kind) {
	case K_INT:
		if (parse_long(v, (long)p->lo, (long)p->hi, &l))
			return -1;
		*(int *)field = (int)l;
		return 0;
	case K_LONG:
		if (parse_long(v, (long)p->lo, (long)p->hi, &l))
			return -1;
		if (p->off == OFF(seed))
			o->seed = (uint64_t)l;
		else
			*(long *)field = l;
		return 0;
	case K_DOUBLE:
		if (parse_double(v, p->lo, p->hi, &d))
			return -1;
		*(double *)field = d;
		return 0;
	case K_STR:
		if (strlen(v) >= sizeof o->metrics || !*v)
			return -1;
		strcpy(field, v);
		return 0;
	case K_OPTIM:
		if ((k = pick(v, optim_names, 2)) < 0)
			return -1;
		o->optimizer = (hpu_optim_kind)k;
		return 0;
	case K_STRATEGY:
		if ((k = pick(v, strategy_names, 5)) < 0)
			return -1;
		o->strategy = (hpu_strategy)k;
		return 0;
	case K_FLAG:
		*(int *)field = 1;
		return 0;
	case K_NOFLAG:
		*(int *)field = 0;
		return 0;
	}
	return -1;
}

static const char *expected(const struct opt *p)
{
	switch (p->kind) {
	case K_INT:
	case K_LONG:
		return "an integer in range";
	case K_DOUBLE:
		return "a number in range";
	case K_OPTIM:
		return "one of sgd, adamw";
	case K_STRATEGY:
		return "one of fast_ddp, ddp, zero1, zero2, zero3";
	default:
		return "a non-empty value";
	}
}

int hpu_opts_set(hpu_train_opts *o, const char *name, const char *value,
		 char *err, size_t errlen)
{
	const struct opt *p = find(name);
	if (!p) {
		snprintf(err, errlen, "unknown option --%s", name);
		return -1;
	}
	int wants = hpu_opts_takes_value(name);
	if (wants && !value) {
		snprintf(err, errlen, "option --%s needs a value", name);
		return -1;
	}
	if (!wants && value) {
		snprintf(err, errlen, "option --%s takes no value", name);
		return -1;
	}
	if (set_value(o, p, value) < 0) {
		snprintf(err, errlen, "bad value '%s' for --%s: expected %s",
			 value, name, expected(p));
		return -1;
	}
	return 0;
}

int hpu_opts_parse(hpu_train_opts *o, int argc, char **argv, int *i,
		   char *err, size_t errlen)
{
	while (*i < argc && strncmp(argv[*i], "--", 2) == 0 && argv[*i][2]) {
		char name[64];
		const char *arg = argv[*i] + 2, *eq = strchr(arg, '=');
		size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
		if (n >= sizeof name) {
			snprintf(err, errlen, "unknown option %s", argv[*i]);
			return -1;
		}
		memcpy(name, arg, n);
		name[n] = 0;
		const char *value = eq ? eq + 1 : NULL;
		if (!eq && hpu_opts_takes_value(name) == 1) {
			if (*i + 1 >= argc) {
				snprintf(err, errlen, "option --%s needs a value", name);
				return -1;
			}
			value = argv[++*i];
		}
		if (hpu_opts_set(o, name, value, err, errlen) < 0)
			return -1;
		(*i)++;
	}
	return 0;
}

int hpu_opts_check(const hpu_train_opts *o, int world_size, char *err,
		   size_t errlen)
{
	if (o->strategy != HPU_STRATEGY_FAST_DDP) {
		snprintf(err, errlen,
			 "--strategy %s is not implemented yet; this build has fast_ddp",
			 hpu_strategy_name(o->strategy));
		return -1;
	}
	if (o->batch_size % world_size != 0) {
		snprintf(err, errlen,
			 "--batch-size %d is not divisible by the world size %d",
			 o->batch_size, world_size);
		return -1;
	}
	return 0;
}

void hpu_opts_help(FILE *f)
{
	for (size_t i = 0; i < NOPTS; i++) {
		char left[48];
		static const char *meta[] = {[K_INT] = " N", [K_LONG] = " N",
					     [K_DOUBLE] = " X", [K_STR] = " FILE",
					     [K_OPTIM] = " NAME", [K_STRATEGY] = " NAME",
					     [K_FLAG] = "", [K_NOFLAG] = ""};
		snprintf(left, sizeof left, "--%s%s", opts[i].name, meta[opts[i].kind]);
		fprintf(f, "  %-24s %s\n", left, opts[i].help);
	}
}
