/* args: reading the example models' own arguments (those after "--"):
 * numbers checked against a range, with one wording of the error. Models
 * include only include/ and examples/common/, so this is theirs, not the
 * runtime's parser. */
#ifndef EXAMPLES_ARGS_H
#define EXAMPLES_ARGS_H

#include <hpu/hpu.h>

#include <stddef.h>

/* Reads the whole number at the start of s (base 10, as strtol reads it)
 * into *out and sets *end after it. Returns 0, or -1 when s starts with
 * none or it does not fit a long. */
int ex_long_prefix(const char *s, const char **end, long *out);

/* Reads all of v, the value of option name, as a whole number lo..hi into
 * *out. Returns 0, or hpu_error's -1 with "NAME wants a number in
 * LO..HI, got V" recorded. */
int ex_arg_long(hpu_builder *b, const char *name, const char *v, long lo, long hi, long *out);

/* The same for a real number lo..hi ("%g" bounds in the message). */
int ex_arg_double(hpu_builder *b, const char *name, const char *v, double lo, double hi,
		  double *out);

/* One model argument of a table for ex_args_parse: a number lo..hi
 * stored as a double (EX_ARG_INT: a whole one), a string (a pointer into
 * argv) or a flag (an int set to 1), at byte `off` of the model's
 * argument struct. `meta` names the value in the usage list ("DIR", "N";
 * NULL for a flag). */
typedef enum ex_arg_kind { EX_ARG_NUM, EX_ARG_INT, EX_ARG_STR, EX_ARG_FLAG } ex_arg_kind;
typedef struct ex_arg {
	const char *name; /* "--ctx" */
	ex_arg_kind kind;
	size_t off;
	const char *meta;
	double lo, hi;    /* EX_ARG_NUM */
} ex_arg;

/* Reads argv[1..argc-1] by the table args[n] into the struct at base.
 * Returns 0, or hpu_error's -1 with "unknown model argument X (model
 * arguments: --a N, --b, ...)", "--x needs a value", ex_arg_double's
 * error or "--x wants a whole number in LO..HI, got V" recorded. */
int ex_args_parse(hpu_builder *b, int argc, char **argv, const ex_arg *args, int n, void *base);

/* The error for argument `arg` that a model's own loop did not take,
 * given its usage list ("--data DIR, --hidden N, --checkpoint"): where
 * the list names arg with a value (it was the last argument), "--hidden
 * needs a value (--hidden N)"; else "unknown model argument ARG (model
 * arguments: LIST)". Returns hpu_error's -1. */
int ex_arg_unknown(hpu_builder *b, const char *arg, const char *list);

#endif
