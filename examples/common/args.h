/* args: reading the example models' own arguments (those after "--"):
 * numbers checked against a range, with one wording of the error. Models
 * include only include/ and examples/common/, so this is theirs, not the
 * runtime's parser. */
#ifndef EXAMPLES_ARGS_H
#define EXAMPLES_ARGS_H

#include <hpu/hpu.h>

#include <stddef.h>

/* Reads the whole number at the start of s (an optional '-' and decimal
 * digits: no spaces, '+', hex or exponent) into *out and sets *end after
 * it. Returns 0, or -1 when s starts with none or it does not fit a
 * long. */
int ex_long_prefix(const char *s, const char **end, long *out);

/* Reads all of v, the value of option name, as a whole number lo..hi into
 * *out (as ex_long_prefix reads one). Returns 0, or hpu_error's -1 with
 * "NAME wants a whole number in LO..HI, got V" recorded. */
int ex_arg_long(hpu_builder *b, const char *name, const char *v, long lo, long hi, long *out);

/* The same for a real number lo..hi ("%g" bounds in the message): an
 * optional '-', decimal digits with an optional '.' and exponent; no
 * spaces, '+', hex, inf or nan. */
int ex_arg_double(hpu_builder *b, const char *name, const char *v, double lo, double hi,
		  double *out);

/* One model argument of a table for ex_args_parse: a number lo..hi
 * stored as a double (EX_ARG_INT: a whole one, read by ex_arg_long), a
 * string (a pointer into
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
 * arguments: --a N, --b, ...)", "--x needs a value" (last, or followed
 * by one of the table's arguments), ex_arg_long's or ex_arg_double's
 * error recorded. */
int ex_args_parse(hpu_builder *b, int argc, char **argv, const ex_arg *args, int n, void *base);

/* Whether argv[i], an argument of a model's own loop that takes a value,
 * has one: a next argument that is not one of the arguments its usage
 * list names ("--data DIR, --hidden N, --checkpoint"), so that "--data
 * --hidden 16" is not read as the directory "--hidden". */
int ex_arg_has_value(int argc, char **argv, int i, const char *list);

/* The error for argument argv[i] that a model's own loop did not take,
 * given its usage list: where the list names it with a value, "--hidden
 * needs a value (--hidden N)" when it is last, or "--data needs a value
 * (the next argument, --hidden, is one of the model's arguments)";
 * else "unknown model argument ARG (model arguments: LIST)". Returns
 * hpu_error's -1. */
int ex_arg_unknown(hpu_builder *b, int argc, char **argv, int i, const char *list);

#endif
