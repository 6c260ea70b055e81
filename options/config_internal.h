/* config_internal: what config.c (the option table), config_args.c (the
 * command line, --config) and config_file.c with its config_*.c (the
 * JSON config file) share. Not installed; only their
 * unit tests include it besides.
 *
 * Every option lives in one table in config.c. The config file sets
 * options through the same entries, so a value is checked the same way
 * whichever way it comes in. The calls run one way: config_args.c calls
 * the loader and the table, the loader calls the table, the table calls
 * neither. */
#ifndef HPU_CONFIG_INTERNAL_H
#define HPU_CONFIG_INTERNAL_H

#include "options/config.h"

#include <stddef.h>

/* How an option's value is parsed and stored. */
enum hpu__opt_kind {
	K_INT,    /* int in lo..hi */
	K_LONG,   /* long in lo..hi */
	K_U64,    /* uint64_t in lo..hi */
	K_DOUBLE, /* finite double in lo..hi */
	K_FLAG,   /* int set to 1 */
	K_NOFLAG, /* int set to 0 */
	K_STR,    /* non-empty string, fits the field */
	K_OPTSTR, /* K_STR whose value may be left out (hpu__opt.dflt) */
	K_CHOICE, /* one of names[], stored as its index */
	K_SIZE,   /* hpu__parse_size(), not 0 */
	K_MB,     /* MiB of fp32 (lo..hi), stored as a long count of floats */
	K_CONFIG, /* --config FILE: loads the file */
};

/* One entry of the option table. */
struct hpu__opt {
	const char *name; /* the flag, without dashes */
	enum hpu__opt_kind kind;
	size_t off; /* of the field in hpu_train_opts */
	double lo, hi;
	const char *const *names; /* K_CHOICE: accepted values */
	int nnames;
	const char *help;
	const char *dflt; /* K_OPTSTR: the value when none is given */
	unsigned how;     /* HPU__OPT_* flags */
};

/* What struct hpu__opt.how says of an option beyond its kind. */
enum {
	/* Its value names a file or directory: relative to the directory
	 * hpulaunch runs in, which --hostfile makes absolute before hpud
	 * (in another directory) starts the workers. */
	HPU__OPT_PATH = 1 << 0,
	/* "auto" is a value of this path option, not a file name (--resume). */
	HPU__OPT_AUTO = 1 << 1,
	/* It may differ from rank to rank (a node's own files, memory, cores
	 * and I/O tuning, or what only prints): the ranks do not compare it
	 * (hpu__opts_shared_text). */
	HPU__OPT_LOCAL = 1 << 2,
	/* A file every rank uses, which a node may keep at a path of its
	 * own: the ranks compare only whether it is given. */
	HPU__OPT_GIVEN = 1 << 3,
};

/* The table entry for option `name` (without dashes), or NULL. */
const struct hpu__opt *hpu__opt_find(const char *name);

/* The from[] index of p: aliases of one field (--bucket-cap-mb,
 * --no-overlap-comm) share one. */
int hpu__opt_slot(const struct hpu__opt *p);

/* The from[] index of option `name`, which must exist. */
int hpu__opt_slot_named(const char *name);

/* Parses text v into p's field of o; returns 0, or -1 with the field
 * untouched if v is not valid. Leaves o->from[] alone. */
int hpu__opt_set_value(hpu_train_opts *o, const struct hpu__opt *p,
		       const char *v);

/* What a valid value of p looks like, for error messages; returns buf or
 * a constant string. */
const char *hpu__opt_expected(const struct hpu__opt *p, char *buf,
			      size_t len);

/* The option whose from[] index is slot, or NULL. */
const struct hpu__opt *hpu__opt_at(int slot);

/* The value of p in o as text (a choice by its name), in buf. */
const char *hpu__opt_text(const hpu_train_opts *o, const struct hpu__opt *p, char *buf,
			  size_t len);

/* The value of choice option p that v names (one of p->names, or another
 * spelling of one, case-insensitively if nocase), or -1. */
int hpu__choice(const struct hpu__opt *p, const char *v, int nocase);

/* Marks in repeated[i] (n bytes) whether keys[i] repeats one of
 * keys[0..i), compared as a config file's keys are (with dashes, '-' and
 * '_' alike); sorts, so n log n. Returns how many are marked, or -1 (out of
 * memory). */
int hpu__repeated_keys(const char *const *keys, size_t n, int dashes,
		       unsigned char *repeated);

/* The index of v in names[0..n-1] (case-insensitively if nocase), or -1. */
int hpu__pick(const char *v, const char *const *names, int n, int nocase);

/* The config file (--config), in five files whose calls run one way:
 * config_file.c (reads and parses the file, reports its errors) calls
 * config_keys.c (the top level, zero_optimization, aio), which calls
 * config_keys_train.c (optimizer, scheduler, bf16/fp16/fp8/amp,
 * hputrain), and all three call config_walk.c (a value checked against
 * its option, a section's keys walked), which calls the table.
 * config_notes.c prints what a loaded file left to flags and defaults. */

struct cJSON;

/* Every error of a file is reported, not only the first: each one is a
 * line of msgs, and the walk goes on past it. */
struct fctx {
	hpu_train_opts *o; /* a copy, committed only if the whole file loads */
	const char *file;
	/* what sets a W_LENIENT walk's unknown key that names one of our
	 * options, for the warning (text in buf; NULL: nothing does), which
	 * then stands for a "did you mean" error: config_keys.c's top_hint
	 * at the top level */
	const char *(*hint)(const char *key, char *buf, size_t len);
	int adam_w_mode; /* optimizer.params.adam_w_mode */
	/* DeepSpeed's defaults for what its sections leave out
	 * (hpu__cfg_deepspeed_defaults, after the walk): the optimizer's
	 * type (1 + its index: SGD, AdamW, Adam; 0 none) and its params'
	 * weight_decay and momentum given; a WarmupLR or WarmupDecayLR
	 * without warmup_max_lr */
	int ds_optim, ds_wd_given, ds_momentum_given, ds_no_max_lr;
	int ds_lr_given; /* optimizer.params.lr (a numeric one) ... */
	double ds_lr;    /* ... its value */
	int ds_torch_adam; /* optimizer.params.torch_adam true: torch's AdamW,
			    * whose weight_decay default is 0.01 */
	char prec_by[96]; /* the key that asked for a precision ("" none) */
	int prec;         /* ... and which (hpu_precision) */
	char offload_by[2][96]; /* the keys that asked where the optimizer's state
				 * [0] and the parameters [1] go ("" none) */
	int offload_at[2];      /* ... and where (hpu_offload) */
	/* the options a key of this file set (another key setting one to
	 * another value is refused), unless `over` (a DeepSpeed default that
	 * overrides a key: WarmupLR's lr) */
	unsigned char put[HPU_OPTS_MAX];
	int over;
	int nerr;
	char msgs[3072]; /* the errors, one per line ("\n  " between) */
	size_t used;
};

struct fkey {
	const char *key;
	const char *opt; /* the option it sets, or NULL: fn */
	int (*fn)(struct fctx *c, const char *path, const struct cJSON *it);
	unsigned only; /* the optimizer/scheduler types it belongs to; 0: all */
	/* A key DeepSpeed accepts that changes nothing here: why (any value
	 * is accepted, and the key is named in one warning). */
	const char *why;
};

/* Table entries: a key that sets an option, one with a function of its
 * own, one that changes nothing here (why). `only`: fkey.only. */
#define KEY(k, opt, only) {k, opt, NULL, only, NULL}
#define FN(k, fn, only) {k, NULL, fn, only, NULL}
#define NONE(k, why) {k, NULL, NULL, 0, why}

/* hpu__cfg_walk's mode. */
enum {
	W_DASHES = 1,  /* the hputrain section: "max-steps" is "max_steps" */
	W_LENIENT = 2, /* DeepSpeed's top level: an unknown key far from every
			* known one is ignored (named in the warning), as
			* DeepSpeed ignores it */
};

/* hpu__cfg_walk over a whole table. */
#define WALK(c, obj, prefix, keys, type, tname, mode)                          \
	hpu__cfg_walk(c, obj, prefix, keys, sizeof(keys) / sizeof((keys)[0]),  \
		      type, tname, mode)

/* Why DeepSpeed's keys change nothing here (fkey.why), shared by the
 * keys they explain, so that the warning groups them. */
static const char WHY_PROFILE[] = "timings and counters are --profile's and the metrics file's";
static const char WHY_MONITOR[] = "monitoring is --metrics (JSON lines) and hpu-plot";
static const char WHY_ALWAYS[] = "hputrain always does this";
static const char WHY_REDUCE[] = "gradients are summed, then divided by the world size once";
static const char WHY_COLL[] = "each strategy has one collective schedule";
static const char WHY_SAVE[] = "--save-params writes consolidated fp32 parameters, checkpoints reshard to any world size";
static const char WHY_DEVICES[] = "devices are hpulaunch's --devices";
static const char WHY_NOTHERE[] = "not implemented in hputrain: training runs without it";
static const char WHY_ZEROPP[] = "ZeRO++/MiCS are not implemented: ZeRO runs unquantized over all ranks";
static const char WHY_PINNED[] = "the host tier is plain memory; buffers are aligned for O_DIRECT";
static const char WHY_TORCH[] = "hputrain's optimizers are its own, one implementation each";
static const char WHY_CKPT[] = "use --activation-checkpointing or mark layers (hpu_layer_checkpoint)";

/* config_walk.c: the checks of one value and the walk of one section.
 * Each error is a line of c->msgs; these return -1 after one. */

/* Appends the error "FILE: path: what" (printf-style); returns -1. */
int hpu__cfg_ferr(struct fctx *c, const char *path, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The shortest text that reads back as x. */
const char *hpu__cfg_num_text(double x, char *buf, size_t len);

/* What a JSON value is, for "expected X, got Y". */
const char *hpu__cfg_describe(const struct cJSON *it, char *buf, size_t len);

/* "expected want, got ..." (or that "auto" is not supported). */
int hpu__cfg_wrong_type(struct fctx *c, const char *path,
			const struct cJSON *it, const char *want);

/* *out = it, a finite number in lo..hi (an exact integer if integral). */
int hpu__cfg_want_number(struct fctx *c, const char *path,
			 const struct cJSON *it, double lo, double hi,
			 int integral, double *out);

/* *out = it, true or false. */
int hpu__cfg_want_bool(struct fctx *c, const char *path,
		       const struct cJSON *it, int *out);

/* Whether it is a string without a control character. */
int hpu__cfg_want_string(struct fctx *c, const char *path,
			 const struct cJSON *it);

/* Sets option p from text (already checked) unless a flag set it. */
int hpu__cfg_put(struct fctx *c, const char *path, const struct hpu__opt *p,
		 const char *text);

/* A key that sets option `name`, checked by the option's kind. */
int hpu__cfg_file_opt(struct fctx *c, const char *path,
		      const struct cJSON *it, const char *name);

/* After the whole file is walked: the values DeepSpeed's optimizer and
 * scheduler constructors take for keys their sections leave out, where
 * they differ from hputrain's defaults (SGD's momentum 0, Adam's and
 * AdamW's weight_decay 0, WarmupLR's warmup_max_lr 0.001, which sets the
 * lr), unless a flag or another key gave the option. */
int hpu__cfg_deepspeed_defaults(struct fctx *c);

/* Key `path` was accepted and changes nothing here (`why`), named in the
 * config file's one warning. */
void hpu__cfg_note_ignored(struct fctx *c, const char *path, const char *why);

/* An "auto" value: the option(s) in the given slots (slot2 -1: one) keep
 * what flags and defaults give them, named in the one note. */
void hpu__cfg_note_auto(struct fctx *c, const char *path, int slot, int slot2);

/* Whether it is the string "auto". */
int hpu__cfg_is_auto(const struct cJSON *it);

/* Checks every key of object obj (at prefix) against keys[n], then
 * applies them in the table's order (WALK for a whole table). */
int hpu__cfg_walk(struct fctx *c, const struct cJSON *obj, const char *prefix,
		  const struct fkey *keys, size_t n, unsigned type,
		  const char *type_name, int mode);

/* config_keys_train.c: the sections of the top level it holds. */
int hpu__cfg_optimizer(struct fctx *c, const char *path, const struct cJSON *it);
int hpu__cfg_scheduler(struct fctx *c, const char *path, const struct cJSON *it);
int hpu__cfg_bf16(struct fctx *c, const char *path, const struct cJSON *it);
int hpu__cfg_fp16(struct fctx *c, const char *path, const struct cJSON *it);
int hpu__cfg_fp8(struct fctx *c, const char *path, const struct cJSON *it);
int hpu__cfg_amp(struct fctx *c, const char *path, const struct cJSON *it);
int hpu__cfg_hputrain(struct fctx *c, const char *path, const struct cJSON *it);

/* The i-th section table of config_keys_train.c with its path
 * ("optimizer.params"), for config_keys.c's top-level hints; NULL past
 * the last. */
const struct fkey *hpu__cfg_train_section(int i, const char **path, size_t *n);

/* config_args.c: whether batch number `name` (batch-size, micro-batch-size,
 * grad-accum) was not given and the two others determine it. */
int hpu__opts_resolved(const hpu_train_opts *o, const char *name);

/* config_keys.c: walks the top level of a parsed config file. */
int hpu__cfg_walk_top(struct fctx *c, const struct cJSON *root);

#endif
