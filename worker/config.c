/* config: the training options (see config.h).
 *
 * One table lists every command-line option with its field, its kind and
 * its range. The JSON config file maps DeepSpeed's keys onto entries of
 * the same table, so a value is checked the same way whichever way it
 * comes in, and o->from[] (indexed by the table) says where it came from.
 */
#include "config.h"

#include <assert.h>
#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const strategy_names[] = {"fast_ddp", "ddp", "zero1",
					     "zero2", "zero3"};
static const char *const optim_names[] = {"sgd", "adamw", "adam"};
static const char *const sched_names[] = {"constant", "step", "cosine",
					  "warmup", "warmup_decay"};
static const char *const warmup_names[] = {"log", "linear"};
static const char *const comm_names[] = {"fp32", "bf16"};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Choices are stored through an int pointer. */
_Static_assert(sizeof(hpu_strategy) == sizeof(int), "enum size");
_Static_assert(sizeof(hpu_optim_kind) == sizeof(int), "enum size");
_Static_assert(sizeof(hpu_sched_kind) == sizeof(int), "enum size");
_Static_assert(sizeof(hpu_warmup_type) == sizeof(int), "enum size");
_Static_assert(sizeof(hpu_comm_dtype) == sizeof(int), "enum size");

void hpu_opts_defaults(hpu_train_opts *o)
{
	memset(o, 0, sizeof *o); /* from[] all HPU_FROM_DEFAULT */
	o->epochs = 1;
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
	o->log_every = 50;
	o->eval = 1;
}

static const char *name_of(const char *const *names, int n, int k)
{
	return k >= 0 && k < n ? names[k] : "unknown";
}

const char *hpu_strategy_name(hpu_strategy s)
{
	return name_of(strategy_names, COUNT(strategy_names), (int)s);
}

const char *hpu_optim_name(hpu_optim_kind k)
{
	return name_of(optim_names, COUNT(optim_names), (int)k);
}

const char *hpu_sched_name(hpu_sched_kind k)
{
	return name_of(sched_names, COUNT(sched_names), (int)k);
}

double hpu_opts_weight_decay(const hpu_train_opts *o)
{
	if (o->weight_decay >= 0)
		return o->weight_decay;
	return o->optimizer == HPU_OPTIM_ADAMW ? 0.01 : 0.0;
}

/* ---- sizes ---- */

int hpu_parse_size(const char *s, uint64_t *out)
{
	const char *p = s;
	if (!isdigit((unsigned char)*p))
		return -1;
	char *end;
	errno = 0;
	unsigned long long whole = strtoull(p, &end, 10);
	if (errno)
		return -1;
	p = end;
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

static int parse_long(const char *v, double lo, double hi, long *out)
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

static int pick(const char *v, const char *const *names, int n, int nocase)
{
	for (int i = 0; i < n; i++)
		if ((nocase ? strcasecmp : strcmp)(v, names[i]) == 0)
			return i;
	return -1;
}

enum kind {
	K_INT,    /* int in lo..hi */
	K_LONG,   /* long in lo..hi */
	K_U64,    /* uint64_t in lo..hi */
	K_DOUBLE, /* finite double in lo..hi */
	K_FLAG,   /* int set to 1 */
	K_NOFLAG, /* int set to 0 */
	K_STR,    /* non-empty string, fits the field */
	K_CHOICE, /* one of names[], stored as its index */
	K_SIZE,   /* hpu_parse_size(), not 0 */
	K_MB,     /* MiB of fp32 (lo..hi), stored as a long count of floats */
	K_CONFIG, /* --config FILE: loads the file */
};

struct opt {
	const char *name;
	enum kind kind;
	size_t off;
	double lo, hi;
	const char *const *names; /* K_CHOICE: accepted values */
	int nnames;
	const char *help;
};

#define OFF(f) offsetof(hpu_train_opts, f)
#define NUM(n, k, f, lo, hi, h) {n, k, OFF(f), lo, hi, NULL, 0, h}
#define OTHER(n, k, f, h) {n, k, OFF(f), 0, 0, NULL, 0, h}
#define CHOICE(n, f, a, h) {n, K_CHOICE, OFF(f), 0, 0, a, COUNT(a), h}

static const struct opt opts[] = {
	NUM("epochs", K_INT, epochs, 1, 1e6, "passes over the training set (1)"),
	NUM("max-steps", K_LONG, max_steps, 1, 1e15, "stop after N optimizer steps"),
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
	CHOICE("strategy", strategy, strategy_names, "fast_ddp | ddp | zero1 | zero2 | zero3 (fast_ddp)"),
	NUM("reduce-bucket-size", K_LONG, reduce_bucket, 1, 1e15, "ddp/zero2 gradient bucket, elements (6553600)"),
	NUM("bucket-cap-mb", K_MB, reduce_bucket, 0, 1e6, "the same in MiB of fp32, as torch DDP (25)"),
	NUM("allgather-bucket-size", K_LONG, allgather_bucket, 1, 1e15, "zero1 all-gather unit, elements (500000000)"),
	OTHER("overlap-comm", K_FLAG, overlap_comm, "communicate during backward (on)"),
	OTHER("no-overlap-comm", K_NOFLAG, overlap_comm, "communicate after backward"),
	NUM("prefetch-bucket-size", K_LONG, prefetch_bucket, 0, 1e15, "zero3: elements gathered ahead (50000000)"),
	NUM("param-persistence-threshold", K_LONG, persistence_threshold, 0, 1e15, "zero3: smaller layers stay whole (100000)"),
	NUM("max-live-parameters", K_LONG, max_live_params, 1, 1e15, "zero3: gathered elements alive at once (1000000000)"),
	CHOICE("grad-comm-dtype", grad_comm_dtype, comm_names, "fp32 | bf16 gradient all-reduce, ddp/fast_ddp (fp32)"),
	OTHER("activation-checkpointing", K_FLAG, activation_checkpointing, "recompute each layer's forward in backward"),
	OTHER("device-memory", K_SIZE, device_memory, "memory per device, e.g. 2GiB (node memory / local devices)"),
	NUM("log-every", K_INT, log_every, 0, 1e9, "log loss and samples/s every N steps (50; 0: never)"),
	OTHER("metrics", K_STR, metrics, "write JSON lines of metrics to FILE (rank 0)"),
	OTHER("save-params", K_STR, save_params, "save the trained fp32 parameters to FILE (rank 0)"),
	OTHER("config", K_CONFIG, config, "DeepSpeed-style JSON config; flags win over it"),
	OTHER("no-eval", K_NOFLAG, eval, "skip the test-set evaluation at the end"),
};
#define NOPTS (sizeof opts / sizeof opts[0])
_Static_assert(NOPTS <= HPU_OPTS_MAX, "from[] is too small for the table");

static const struct opt *find(const char *name)
{
	for (size_t i = 0; i < NOPTS; i++)
		if (strcmp(opts[i].name, name) == 0)
			return &opts[i];
	return NULL;
}

/* The from[] index of an option: the table index of the first option with
 * the same field, so that aliases (--bucket-cap-mb, --no-overlap-comm)
 * share one entry. */
static int slot(const struct opt *p)
{
	for (size_t i = 0; i < NOPTS; i++)
		if (opts[i].off == p->off)
			return (int)i;
	assert(0);
	return 0;
}

static int slot_named(const char *name)
{
	const struct opt *p = find(name);
	assert(p);
	return slot(p);
}

int hpu_opts_takes_value(const char *name)
{
	const struct opt *p = find(name);
	if (!p)
		return -1;
	return p->kind != K_FLAG && p->kind != K_NOFLAG;
}

/* Parses v into p's field; -1 (field untouched) if it is not valid. */
static int set_value(hpu_train_opts *o, const struct opt *p, const char *v)
{
	char *field = (char *)o + p->off;
	long l;
	double d;
	uint64_t u;
	int k;
	switch (p->kind) {
	case K_INT:
		if (parse_long(v, p->lo, p->hi, &l))
			return -1;
		*(int *)field = (int)l;
		return 0;
	case K_LONG:
		if (parse_long(v, p->lo, p->hi, &l))
			return -1;
		*(long *)field = l;
		return 0;
	case K_U64:
		if (parse_long(v, p->lo, p->hi, &l))
			return -1;
		*(uint64_t *)field = (uint64_t)l;
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
	case K_CHOICE:
		if ((k = pick(v, p->names, p->nnames, 0)) < 0)
			return -1;
		*(int *)field = k;
		return 0;
	case K_SIZE:
		if (hpu_parse_size(v, &u) || u == 0)
			return -1;
		*(uint64_t *)field = u;
		return 0;
	case K_MB:
		if (parse_double(v, p->lo, p->hi, &d) || d * 1048576 / 4 < 1)
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
static const char *expected(const struct opt *p, char *buf, size_t len)
{
	size_t n = 0;
	switch (p->kind) {
	case K_INT:
	case K_LONG:
	case K_U64:
		snprintf(buf, len, "an integer from %.0f to %.0f", p->lo, p->hi);
		return buf;
	case K_DOUBLE:
		snprintf(buf, len, "a number from %g to %g", p->lo, p->hi);
		return buf;
	case K_MB:
		snprintf(buf, len, "a number of MiB above 0, at most %g", p->hi);
		return buf;
	case K_CHOICE:
		n = (size_t)snprintf(buf, len, "one of");
		for (int i = 0; i < p->nnames && n < len; i++)
			n += (size_t)snprintf(buf + n, len - n, "%s %s",
					      i ? "," : "", p->names[i]);
		return buf;
	case K_SIZE:
		return "a size above 0 like 4096, 512K, 1.5G or 2GiB";
	default:
		return "a non-empty value";
	}
}

static int set_config(hpu_train_opts *o, const struct opt *p,
		      const char *path, char *err, size_t errlen)
{
	if (!*path || strlen(path) >= sizeof o->config) {
		snprintf(err, errlen, "bad value '%s' for --config: expected a file name shorter than %zu bytes",
			 path, sizeof o->config);
		return -1;
	}
	if (hpu_opts_load_file(o, path, err, errlen) < 0)
		return -1;
	strcpy(o->config, path);
	o->from[slot(p)] = HPU_FROM_FLAG;
	return 0;
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
	if (p->kind == K_CONFIG)
		return set_config(o, p, value, err, errlen);
	if (set_value(o, p, value) < 0) {
		char buf[160];
		snprintf(err, errlen, "bad value '%s' for --%s: expected %s",
			 value, name, expected(p, buf, sizeof buf));
		return -1;
	}
	o->from[slot(p)] = HPU_FROM_FLAG;
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

/* ---- the JSON config file ----
 *
 * Each section is a table of keys; a key either sets one option of the
 * table above (checked against that option's kind and range) or has a
 * function of its own. Every key of a section is checked first (unknown,
 * repeated, not for this optimizer or scheduler type), then the keys are
 * applied in the order of their table, not of the file: so
 * "hputrain.strategy" (applied last) overrides "zero_optimization.stage",
 * and "scheduler.params.warmup_max_lr" overrides "optimizer.params.lr".
 * A value is checked even when a flag overrides it. */

struct fctx {
	hpu_train_opts *o; /* a copy, committed only if the whole file loads */
	const char *file;
	char *err;
	size_t errlen;
	int adam_w_mode; /* optimizer.params.adam_w_mode */
};

struct fkey {
	const char *key;
	const char *opt; /* the option it sets, or NULL: fn */
	int (*fn)(struct fctx *c, const char *path, const cJSON *it);
	unsigned only; /* the optimizer/scheduler types it belongs to; 0: all */
};

static int ferr(struct fctx *c, const char *path, const char *fmt, ...)
{
	int n = snprintf(c->err, c->errlen, "%s: %s: ", c->file, path);
	if (n >= 0 && (size_t)n < c->errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -1;
}

/* The shortest text that reads back as x. */
static const char *num_text(double x, char *buf, size_t len)
{
	snprintf(buf, len, "%.15g", x);
	if (strtod(buf, NULL) != x)
		snprintf(buf, len, "%.17g", x);
	return buf;
}

/* What a JSON value is, for "expected X, got Y". */
static const char *describe(const cJSON *it, char *buf, size_t len)
{
	char num[32];
	if (cJSON_IsString(it))
		snprintf(buf, len, "a string \"%.40s%s\"", it->valuestring,
			 strlen(it->valuestring) > 40 ? "..." : "");
	else if (cJSON_IsNumber(it))
		snprintf(buf, len, "a number %s",
			 num_text(it->valuedouble, num, sizeof num));
	else if (cJSON_IsBool(it))
		snprintf(buf, len, "%s", cJSON_IsTrue(it) ? "true" : "false");
	else if (cJSON_IsNull(it))
		snprintf(buf, len, "null");
	else if (cJSON_IsArray(it))
		snprintf(buf, len, "an array");
	else
		snprintf(buf, len, "an object");
	return buf;
}

static int wrong_type(struct fctx *c, const char *path, const cJSON *it,
		      const char *want)
{
	char got[80];
	if (cJSON_IsString(it) && strcmp(it->valuestring, "auto") == 0)
		return ferr(c, path, "\"auto\" is not supported; give %s", want);
	return ferr(c, path, "expected %s, got %s", want,
		    describe(it, got, sizeof got));
}

static int want_number(struct fctx *c, const char *path, const cJSON *it,
		       double lo, double hi, int integral, double *out)
{
	char a[32], b[32], x[32];
	if (!cJSON_IsNumber(it))
		return wrong_type(c, path, it, "a number");
	double v = it->valuedouble;
	if (!isfinite(v))
		return ferr(c, path, "%s is not a finite number",
			    num_text(v, x, sizeof x));
	/* 5e8 is an integer; beyond 2^53 a double does not say which one. */
	if (integral && v != floor(v))
		return ferr(c, path, "%s is not an integer",
			    num_text(v, x, sizeof x));
	if (integral && fabs(v) > 9007199254740992.0)
		return ferr(c, path, "%s is too large to be exact in JSON",
			    num_text(v, x, sizeof x));
	if (v < lo || v > hi)
		return ferr(c, path, "%s is out of range %s..%s",
			    num_text(v, x, sizeof x), num_text(lo, a, sizeof a),
			    num_text(hi, b, sizeof b));
	*out = v;
	return 0;
}

static int want_bool(struct fctx *c, const char *path, const cJSON *it,
		     int *out)
{
	if (!cJSON_IsBool(it))
		return wrong_type(c, path, it, "true or false");
	*out = cJSON_IsTrue(it);
	return 0;
}

static int want_string(struct fctx *c, const char *path, const cJSON *it)
{
	if (!cJSON_IsString(it))
		return wrong_type(c, path, it, "a string");
	return 0;
}

/* Sets option p from text (already checked) unless a flag set it. */
static int put(struct fctx *c, const char *path, const struct opt *p,
	       const char *text)
{
	int s = slot(p);
	if (c->o->from[s] == HPU_FROM_FLAG)
		return 0;
	if (p->kind == K_FLAG || p->kind == K_NOFLAG) {
		/* JSON keys say the positive: "overlap_comm", "eval" */
		*(int *)((char *)c->o + p->off) = text[0] == '1';
	} else if (set_value(c->o, p, text) < 0) {
		char buf[160];
		return ferr(c, path, "bad value \"%.60s\": expected %s", text,
			    expected(p, buf, sizeof buf));
	}
	c->o->from[s] = HPU_FROM_FILE;
	return 0;
}

/* A key that sets option `name`, checked by the option's kind. */
static int file_opt(struct fctx *c, const char *path, const cJSON *it,
		    const char *name)
{
	const struct opt *p = find(name);
	char text[48], buf[160];
	double v;
	int b = 0, k;
	uint64_t u;
	assert(p);
	switch (p->kind) {
	case K_INT:
	case K_LONG:
	case K_U64:
		if (want_number(c, path, it, p->lo, p->hi, 1, &v))
			return -1;
		snprintf(text, sizeof text, "%.0f", v);
		return put(c, path, p, text);
	case K_DOUBLE:
		if (want_number(c, path, it, p->lo, p->hi, 0, &v))
			return -1;
		return put(c, path, p, num_text(v, text, sizeof text));
	case K_FLAG:
	case K_NOFLAG:
		if (want_bool(c, path, it, &b))
			return -1;
		return put(c, path, p, b ? "1" : "0");
	case K_CHOICE:
		if (want_string(c, path, it))
			return -1;
		k = pick(it->valuestring, p->names, p->nnames, 1);
		if (k < 0)
			return ferr(c, path, "\"%.40s\" is not %s",
				    it->valuestring, expected(p, buf, sizeof buf));
		return put(c, path, p, p->names[k]);
	case K_STR:
		if (want_string(c, path, it))
			return -1;
		if (!*it->valuestring || strlen(it->valuestring) >= sizeof c->o->metrics)
			return ferr(c, path, "expected a non-empty file name shorter than %zu bytes",
				    sizeof c->o->metrics);
		return put(c, path, p, it->valuestring);
	case K_SIZE:
		if (cJSON_IsNumber(it)) {
			if (want_number(c, path, it, 1, 9007199254740992.0, 1, &v))
				return -1;
			snprintf(text, sizeof text, "%.0f", v);
			return put(c, path, p, text);
		}
		if (!cJSON_IsString(it))
			return wrong_type(c, path, it, "a number of bytes or a size string");
		if (hpu_parse_size(it->valuestring, &u) || u == 0)
			return ferr(c, path, "\"%.40s\" is not %s",
				    it->valuestring, expected(p, buf, sizeof buf));
		return put(c, path, p, it->valuestring);
	default:
		assert(0);
		return -1;
	}
}

/* Edit distance (Levenshtein), for "did you mean". */
static size_t distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b), row[64];
	if (la >= 64 || lb >= 64)
		return 99;
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t up = row[j];
			size_t best = diag + (tolower((unsigned char)a[i - 1]) !=
					      tolower((unsigned char)b[j - 1]));
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

/* Whether JSON key k names table key t; in the hputrain section (dashes)
 * "max-steps" and "max_steps" are the same. */
static int key_is(const char *k, const char *t, int dashes)
{
	if (!dashes)
		return strcmp(k, t) == 0;
	for (; *k && *t; k++, t++)
		if (*k != *t && !(*k == '-' && *t == '_'))
			return 0;
	return *k == *t;
}

static const struct fkey *lookup(const struct fkey *keys, size_t n,
				 const char *k, int dashes)
{
	for (size_t i = 0; i < n; i++)
		if (key_is(k, keys[i].key, dashes))
			return &keys[i];
	return NULL;
}

static int unknown_key(struct fctx *c, const char *path, const char *k,
		       const struct fkey *keys, size_t n)
{
	const char *best = NULL;
	size_t bestd = 3;
	for (size_t i = 0; i < n; i++) {
		size_t d = distance(k, keys[i].key);
		if (d < bestd) {
			bestd = d;
			best = keys[i].key;
		}
	}
	int m = snprintf(c->err, c->errlen, "unknown key '%s' in %s", path,
			 c->file);
	if (best && m >= 0 && (size_t)m < c->errlen)
		snprintf(c->err + m, c->errlen - (size_t)m,
			 " (did you mean '%s'?)", best);
	return -1;
}

/* Checks every key of object obj (at prefix) against keys, then applies
 * them in the table's order. type/type_name: the optimizer or scheduler
 * type the keys must belong to (fkey.only). */
static int walk(struct fctx *c, const cJSON *obj, const char *prefix,
		const struct fkey *keys, size_t n, unsigned type,
		const char *type_name, int dashes)
{
	char path[256];
	if (!cJSON_IsObject(obj))
		return wrong_type(c, prefix, obj, "an object");
	for (const cJSON *it = obj->child; it; it = it->next) {
		snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "",
			 it->string);
		for (const cJSON *p = obj->child; p != it; p = p->next)
			if (key_is(p->string, it->string, dashes) ||
			    key_is(it->string, p->string, dashes))
				return ferr(c, path, "given twice");
		const struct fkey *k = lookup(keys, n, it->string, dashes);
		if (!k)
			return unknown_key(c, path, it->string, keys, n);
		if (k->only && !(k->only & type))
			return ferr(c, path, "%s takes no '%s'", type_name,
				    it->string);
	}
	for (size_t i = 0; i < n; i++) {
		const cJSON *it = obj->child;
		while (it && !key_is(it->string, keys[i].key, dashes))
			it = it->next;
		if (!it)
			continue;
		snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "",
			 it->string);
		int rc = keys[i].opt ? file_opt(c, path, it, keys[i].opt)
				     : keys[i].fn(c, path, it);
		if (rc < 0)
			return -1;
	}
	return 0;
}

#define WALK(c, obj, prefix, keys, type, tname, dashes)                        \
	walk(c, obj, prefix, keys, sizeof(keys) / sizeof((keys)[0]), type,    \
	     tname, dashes)

static int f_noop(struct fctx *c, const char *path, const cJSON *it)
{
	(void)c, (void)path, (void)it;
	return 0;
}

/* A boolean we accept and ignore. */
static int f_ignored_bool(struct fctx *c, const char *path, const cJSON *it)
{
	int b = 0;
	return want_bool(c, path, it, &b);
}

/* zero_optimization */

static int f_stage(struct fctx *c, const char *path, const cJSON *it)
{
	double v;
	if (want_number(c, path, it, 0, 3, 1, &v))
		return -1;
	/* stage 0 is plain data parallelism: ddp (not fast_ddp). */
	return put(c, path, find("strategy"), strategy_names[(int)v + 1]);
}

static const struct fkey zero_keys[] = {
	{"stage", NULL, f_stage, 0},
	{"reduce_bucket_size", "reduce-bucket-size", NULL, 0},
	{"allgather_bucket_size", "allgather-bucket-size", NULL, 0},
	{"overlap_comm", "overlap-comm", NULL, 0},
	{"stage3_prefetch_bucket_size", "prefetch-bucket-size", NULL, 0},
	{"stage3_param_persistence_threshold", "param-persistence-threshold", NULL, 0},
	{"stage3_max_live_parameters", "max-live-parameters", NULL, 0},
	/* Accepted and ignored: our gradients always live in one
	 * contiguous buffer. */
	{"contiguous_gradients", NULL, f_ignored_bool, 0},
};

static int f_zero(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, zero_keys, 0, "", 0);
}

/* optimizer: type and params. Keys not given keep hputrain's defaults
 * (e.g. SGD momentum 0.9), as flags not given do. */

enum { O_SGD = 1, O_ADAMW = 2, O_ADAM = 4 };

static int f_betas(struct fctx *c, const char *path, const cJSON *it)
{
	static const char *names[] = {"beta1", "beta2"};
	char p[280], text[32];
	double v;
	if (!cJSON_IsArray(it))
		return wrong_type(c, path, it, "an array of two numbers");
	if (cJSON_GetArraySize(it) != 2)
		return ferr(c, path, "expected two numbers [beta1, beta2], got %d",
			    cJSON_GetArraySize(it));
	for (int i = 0; i < 2; i++) {
		const struct opt *o = find(names[i]);
		snprintf(p, sizeof p, "%s[%d]", path, i);
		if (want_number(c, p, cJSON_GetArrayItem(it, i), o->lo, o->hi,
				0, &v) ||
		    put(c, p, o, num_text(v, text, sizeof text)))
			return -1;
	}
	return 0;
}

static int f_adam_w_mode(struct fctx *c, const char *path, const cJSON *it)
{
	return want_bool(c, path, it, &c->adam_w_mode);
}

static const struct fkey optim_param_keys[] = {
	{"lr", "lr", NULL, 0},
	{"betas", NULL, f_betas, O_ADAM | O_ADAMW},
	{"eps", "eps", NULL, O_ADAM | O_ADAMW},
	{"weight_decay", "weight-decay", NULL, 0},
	{"momentum", "momentum", NULL, O_SGD},
	{"nesterov", "nesterov", NULL, O_SGD},
	{"adam_w_mode", NULL, f_adam_w_mode, O_ADAM},
};

static const struct fkey typed_keys[] = {
	{"type", NULL, f_noop, 0},
	{"params", NULL, f_noop, 0},
};

static int f_optimizer(struct fctx *c, const char *path, const cJSON *it)
{
	static const char *types[] = {"SGD", "AdamW", "Adam"};
	static const unsigned masks[] = {O_SGD, O_ADAMW, O_ADAM};
	char p[280];
	if (WALK(c, it, path, typed_keys, 0, "", 0))
		return -1;
	const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
	const cJSON *params = cJSON_GetObjectItemCaseSensitive(it, "params");
	snprintf(p, sizeof p, "%s.type", path);
	if (!type && !params)
		return 0;
	if (!type)
		return ferr(c, p, "missing: give Adam, AdamW or SGD");
	if (want_string(c, p, type))
		return -1;
	int k = pick(type->valuestring, types, 3, 1);
	if (k < 0)
		return ferr(c, p, "\"%.40s\" is not one of Adam, AdamW, SGD",
			    type->valuestring);
	c->adam_w_mode = 1; /* DeepSpeed's default */
	snprintf(p, sizeof p, "%s.params", path);
	if (params && WALK(c, params, p, optim_param_keys, masks[k], types[k], 0))
		return -1;
	/* DeepSpeed's "Adam" is AdamW unless adam_w_mode is false. */
	hpu_optim_kind kind = k == 0 ? HPU_OPTIM_SGD
			      : k == 1 || c->adam_w_mode ? HPU_OPTIM_ADAMW
							 : HPU_OPTIM_ADAM;
	snprintf(p, sizeof p, "%s.type", path);
	return put(c, p, find("optimizer"), optim_names[kind]);
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
	{"warmup_min_lr", "warmup-min-lr", NULL, S_WARM | S_DECAY},
	{"warmup_max_lr", "lr", NULL, S_WARM | S_DECAY},
	{"warmup_num_steps", "warmup-steps", NULL, S_WARM | S_DECAY},
	{"warmup_type", "warmup-type", NULL, S_WARM | S_DECAY},
	{"total_num_steps", "total-steps", NULL, S_DECAY},
	{"step_size", "step-size", NULL, S_STEP},
	{"gamma", "gamma", NULL, S_STEP},
	{"T_max", "total-steps", NULL, S_COS},
	{"eta_min", "min-lr", NULL, S_COS},
};

static int f_scheduler(struct fctx *c, const char *path, const cJSON *it)
{
	/* in the order of hpu_sched_kind */
	static const char *types[] = {"constant", "StepLR", "CosineAnnealingLR",
				      "WarmupLR", "WarmupDecayLR"};
	char p[280];
	if (WALK(c, it, path, typed_keys, 0, "", 0))
		return -1;
	const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
	const cJSON *params = cJSON_GetObjectItemCaseSensitive(it, "params");
	snprintf(p, sizeof p, "%s.type", path);
	if (!type && !params)
		return 0;
	if (!type)
		return ferr(c, p, "missing: give WarmupLR, WarmupDecayLR, StepLR, CosineAnnealingLR or constant");
	if (want_string(c, p, type))
		return -1;
	int k = pick(type->valuestring, types, 5, 1);
	if (k < 0)
		return ferr(c, p, "\"%.40s\" is not one of WarmupLR, WarmupDecayLR, StepLR, CosineAnnealingLR, constant",
			    type->valuestring);
	if (put(c, p, find("scheduler"), sched_names[k]))
		return -1;
	snprintf(p, sizeof p, "%s.params", path);
	if (params && WALK(c, params, p, sched_param_keys, 1u << k, types[k], 0))
		return -1;
	if (k == HPU_SCHED_WARMUP_DECAY &&
	    !(params && cJSON_GetObjectItemCaseSensitive(params, "total_num_steps")) &&
	    c->o->from[slot_named("total-steps")] != HPU_FROM_FLAG) {
		snprintf(p, sizeof p, "%s.params.total_num_steps", path);
		return ferr(c, p, "missing: WarmupDecayLR needs it");
	}
	return 0;
}

/* bf16, fp16 */

static int f_enabled(struct fctx *c, const char *path, const cJSON *it)
{
	int on = 0;
	if (want_bool(c, path, it, &on))
		return -1;
	if (on)
		return ferr(c, path, "mixed precision is not available in this build yet");
	return 0;
}

static const struct fkey bf16_keys[] = {
	{"enabled", NULL, f_enabled, 0},
};

/* DeepSpeed's loss-scaler settings mean nothing while fp16 is off; they
 * are accepted so that DeepSpeed files load. */
static const struct fkey fp16_keys[] = {
	{"enabled", NULL, f_enabled, 0},
	{"auto_cast", NULL, f_noop, 0},
	{"loss_scale", NULL, f_noop, 0},
	{"initial_scale_power", NULL, f_noop, 0},
	{"loss_scale_window", NULL, f_noop, 0},
	{"hysteresis", NULL, f_noop, 0},
	{"consecutive_hysteresis", NULL, f_noop, 0},
	{"min_loss_scale", NULL, f_noop, 0},
};

static int f_bf16(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, bf16_keys, 0, "", 0);
}

static int f_fp16(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, fp16_keys, 0, "", 0);
}

/* hputrain: our own keys, named as our flags (dashes or underscores). */
static const struct fkey hputrain_keys[] = {
	{"strategy", "strategy", NULL, 0},
	{"epochs", "epochs", NULL, 0},
	{"max_steps", "max-steps", NULL, 0},
	{"seed", "seed", NULL, 0},
	{"device_memory", "device-memory", NULL, 0},
	{"activation_checkpointing", "activation-checkpointing", NULL, 0},
	{"grad_comm_dtype", "grad-comm-dtype", NULL, 0},
	{"log_every", "log-every", NULL, 0},
	{"metrics", "metrics", NULL, 0},
	{"save_params", "save-params", NULL, 0},
	{"eval", "no-eval", NULL, 0}, /* true or false */
};

static int f_hputrain(struct fctx *c, const char *path, const cJSON *it)
{
	return WALK(c, it, path, hputrain_keys, 0, "", 1);
}

/* The top level, applied in this order; hputrain last, so that its
 * "strategy" overrides zero_optimization.stage. */
static const struct fkey top_keys[] = {
	{"train_batch_size", "batch-size", NULL, 0},
	{"train_micro_batch_size_per_gpu", "micro-batch-size", NULL, 0},
	{"gradient_accumulation_steps", "grad-accum", NULL, 0},
	{"gradient_clipping", "clip-grad-norm", NULL, 0},
	{"steps_per_print", "log-every", NULL, 0},
	{"zero_optimization", NULL, f_zero, 0},
	{"optimizer", NULL, f_optimizer, 0},
	{"scheduler", NULL, f_scheduler, 0},
	{"bf16", NULL, f_bf16, 0},
	{"fp16", NULL, f_fp16, 0},
	{"hputrain", NULL, f_hputrain, 0},
};

/* Reads the whole file (NUL-terminated) into *buf. */
static int read_file(const char *path, char **buf, size_t *len, char *err,
		     size_t errlen)
{
	enum { MAX = 16 << 20 };
	const char *why = NULL;
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(err, errlen, "cannot read config file %s: %s", path,
			 strerror(errno));
		return -1;
	}
	char *b = NULL;
	size_t n = 0, cap = 0;
	for (;;) {
		if (n == cap) {
			char *g = cap < MAX ? realloc(b, cap * 2 + 4096 + 1) : NULL;
			if (!g) {
				why = cap < MAX ? "out of memory" : "larger than 16 MiB";
				break;
			}
			b = g;
			cap = cap * 2 + 4096;
		}
		size_t got = fread(b + n, 1, cap - n, f);
		n += got;
		if (got == 0) {
			if (ferror(f))
				why = strerror(errno);
			break;
		}
	}
	fclose(f);
	if (why) {
		snprintf(err, errlen, "cannot read config file %s: %s", path, why);
		free(b);
		return -1;
	}
	b[n] = 0;
	*buf = b;
	*len = n;
	return 0;
}

static void syntax_error(const char *path, const char *buf, size_t len,
			 const char *at, char *err, size_t errlen)
{
	size_t pos = at && at >= buf && at <= buf + len ? (size_t)(at - buf) : len;
	int line = 1;
	size_t col = 1;
	for (size_t i = 0; i < pos; i++, col++)
		if (buf[i] == '\n')
			line++, col = 0;
	if (pos >= len) {
		snprintf(err, errlen, "%s: line %d: JSON syntax error: the file ends too early",
			 path, line);
		return;
	}
	char near[24];
	size_t n = 0;
	while (n < sizeof near - 1 && pos + n < len && buf[pos + n] != '\n' &&
	       buf[pos + n] != '\r')
		near[n] = buf[pos + n], n++;
	near[n] = 0;
	snprintf(err, errlen, "%s: line %d, column %zu: JSON syntax error near '%s'",
		 path, line, col, near);
}

/* The error is one line whatever the file held. */
static void one_line(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

int hpu_opts_load_file(hpu_train_opts *o, const char *path, char *err,
		       size_t errlen)
{
	char *buf;
	size_t len;
	if (read_file(path, &buf, &len, err, errlen) < 0)
		return -1;
	int rc = -1;
	hpu_train_opts copy = *o;
	struct fctx c = {&copy, path, err, errlen, 1};
	const char *end = NULL;
	cJSON *root = NULL;
	if (strlen(buf) != len) {
		snprintf(err, errlen, "%s: not a JSON file (it holds a NUL byte)", path);
		goto out;
	}
	/* The position from ParseWithOpts is cJSON_GetErrorPtr()'s, without
	 * the global. */
	root = cJSON_ParseWithOpts(buf, &end, 1);
	if (!root) {
		syntax_error(path, buf, len, end, err, errlen);
		goto out;
	}
	if (!cJSON_IsObject(root)) {
		char got[80];
		snprintf(err, errlen, "%s: expected a JSON object at the top, got %s",
			 path, describe(root, got, sizeof got));
		goto out;
	}
	if (WALK(&c, root, "", top_keys, 0, "", 0) < 0)
		goto out;
	*o = copy;
	rc = 0;
out:
	if (rc < 0)
		one_line(err);
	cJSON_Delete(root);
	free(buf);
	return rc;
}

/* ---- resolving against the world size ---- */

/* How a batch number is named in messages: DeepSpeed's key if the config
 * file gave it, else the flag (that gave it, or that would change the
 * default). */
static const char *bname(const hpu_train_opts *o, const char *flag,
			 const char *key, char *buf, size_t len)
{
	if (o->from[slot_named(flag)] == HPU_FROM_FILE)
		snprintf(buf, len, "%s", key);
	else
		snprintf(buf, len, "--%s", flag);
	return buf;
}

static int resolve_batch(hpu_train_opts *o, int world, char *err,
			 size_t errlen)
{
	char nb[40], nm[40], ng[40];
	bname(o, "batch-size", "train_batch_size", nb, sizeof nb);
	bname(o, "micro-batch-size", "train_micro_batch_size_per_gpu", nm,
	      sizeof nm);
	bname(o, "grad-accum", "gradient_accumulation_steps", ng, sizeof ng);
	int gb = o->from[slot_named("batch-size")] != 0;
	int gm = o->from[slot_named("micro-batch-size")] != 0;
	int gg = o->from[slot_named("grad-accum")] != 0;
	long long b = o->batch_size, m = o->micro_batch, g = o->grad_accum,
		  w = world;
	double prod = (double)m * (double)g * (double)w; /* may not fit */
	const struct opt *pb = find("batch-size"), *pg = find("grad-accum");

	if (gb && gm && gg) {
		if ((double)b != prod) {
			snprintf(err, errlen, "%s %lld != %s %lld x %s %lld x world size %lld = %.0f",
				 nb, b, nm, m, ng, g, w, prod);
			return -1;
		}
	} else if (gb && gm) {
		if (b % (m * w)) {
			snprintf(err, errlen, "%s %lld is not divisible by %s %lld x world size %lld",
				 nb, b, nm, m, w);
			return -1;
		}
		g = b / (m * w);
		if (g > pg->hi) {
			snprintf(err, errlen, "%s %lld / (%s %lld x world size %lld) = %lld gradient accumulation steps, more than %.0f",
				 nb, b, nm, m, w, g, pg->hi);
			return -1;
		}
	} else if (gm) {
		if (prod > pb->hi) {
			snprintf(err, errlen, "%s %lld x %s %lld x world size %lld = %.0f, more than the largest global batch %.0f",
				 nm, m, ng, g, w, prod, pb->hi);
			return -1;
		}
		b = m * g * w;
	} else {
		if (b % (g * w)) {
			snprintf(err, errlen, "%s %lld is not divisible by %s %lld x world size %lld",
				 nb, b, ng, g, w);
			return -1;
		}
		m = b / (g * w);
	}
	o->batch_size = (int)b;
	o->micro_batch = (int)m;
	o->grad_accum = (int)g;
	return 0;
}

int hpu_opts_resolve(hpu_train_opts *o, int world_size, char *err,
		     size_t errlen)
{
	assert(world_size >= 1);
	if (resolve_batch(o, world_size, err, errlen) < 0)
		return -1;
	if (o->grad_comm_dtype == HPU_COMM_BF16 &&
	    o->strategy != HPU_STRATEGY_DDP &&
	    o->strategy != HPU_STRATEGY_FAST_DDP) {
		snprintf(err, errlen, "--grad-comm-dtype bf16 works with --strategy ddp or fast_ddp only, not %s",
			 hpu_strategy_name(o->strategy));
		return -1;
	}
	if (o->sched == HPU_SCHED_WARMUP_DECAY && o->total_steps > 0 &&
	    o->total_steps < o->warmup_steps) {
		snprintf(err, errlen, "--scheduler warmup_decay: --total-steps %ld is less than --warmup-steps %ld",
			 o->total_steps, o->warmup_steps);
		return -1;
	}
	return 0;
}

void hpu_opts_help(FILE *f)
{
	static const char *meta[] = {
	    [K_INT] = " N",      [K_LONG] = " N",    [K_U64] = " N",
	    [K_DOUBLE] = " X",   [K_FLAG] = "",      [K_NOFLAG] = "",
	    [K_STR] = " FILE",   [K_CHOICE] = " NAME", [K_SIZE] = " SIZE",
	    [K_MB] = " X",       [K_CONFIG] = " FILE"};
	for (size_t i = 0; i < NOPTS; i++) {
		char left[48];
		snprintf(left, sizeof left, "--%s%s", opts[i].name,
			 meta[opts[i].kind]);
		if (strlen(left) > 24)
			fprintf(f, "  %s\n  %-24s %s\n", left, "", opts[i].help);
		else
			fprintf(f, "  %-24s %s\n", left, opts[i].help);
	}
}
