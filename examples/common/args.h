/* args: reading the example models' own arguments (those after "--"):
 * numbers checked against a range, with one wording of the error. Models
 * include only include/ and examples/common/, so this is theirs, not the
 * runtime's parser. */
#ifndef EXAMPLES_ARGS_H
#define EXAMPLES_ARGS_H

#include <hpu/hpu.h>

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

#endif
