/* config_internal: what config.c (the option table), config_args.c (the
 * command line, --config) and config_file.c (the JSON config file)
 * share. Not installed; only their
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

#endif
