/* num: the one parser of numbers written as text: option values,
 * configuration keys, environment variables, records read from a pipe.
 *
 * Each function reads all of s in base 10 the way strtol, strtoull or
 * strtod would (leading white space and a sign are allowed; a caller that
 * wants digits only checks the first character itself), checks the value
 * against its range and stores it in *out. On failure *out is untouched,
 * errno is kept, and the caller words the message: the codes say only
 * what was wrong. A NULL s is not a number. hpu__human_size writes a
 * size the other way. */
#ifndef HPU_COMMON_NUM_H
#define HPU_COMMON_NUM_H

#include <stddef.h>
#include <stdint.h>

enum {
	HPU_NUM_OK = 0,
	HPU_NUM_INVALID = -1, /* not a number: empty, no digits, or text after it */
	HPU_NUM_RANGE = -2,   /* a number, but outside lo..hi or the type */
};

/* A whole number lo..hi. */
int hpu__parse_long(const char *s, long lo, long hi, long *out);

/* The same for an int. */
int hpu__parse_int(const char *s, int lo, int hi, int *out);

/* An unsigned whole number lo..hi; a minus sign is out of range (strtoull
 * would wrap "-1" around to 2^64-1). */
int hpu__parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);

/* The unsigned whole number at the start of s, for a number followed by
 * more ("17-22", "64K"): *end is set after its digits (to s when there
 * are none). Returns HPU_NUM_OK, HPU_NUM_INVALID (no digits) or
 * HPU_NUM_RANGE (a minus sign, or above 2^64-1). */
int hpu__parse_u64_prefix(const char *s, const char **end, uint64_t *out);

/* A real number lo..hi, overflow and underflow refused. NaN lies in no
 * range; an infinity ("inf") only in one whose bound is infinite, so
 * finite bounds also mean a finite value. */
int hpu__parse_double(const char *s, double lo, double hi, double *out);

/* Any real number strtod reads from all of s, "nan" and "inf" included,
 * rounded as strtod rounds it (to 0 or an infinity when out of range):
 * for values that may rightly be NaN, like a loss. */
int hpu__parse_real(const char *s, double *out);

/* The edit distance (Levenshtein, ignoring case) between a and b, for
 * "did you mean"; 99 when either is 64 bytes or longer. */
size_t hpu__edit_distance(const char *a, const char *b);

/* n bytes for a person, in buf: "812 bytes", "7.9 KiB", "58.1 MiB",
 * "1.5 GiB" (the largest unit that keeps the figure at 1 or more). */
const char *hpu__human_size(char *buf, size_t len, double n);

/* The plural ending for a count in a message, "" for one and "s" for any
 * other: printf("%d worker%s", n, hpu__plural(n)) says "1 worker" and
 * "2 workers". */
static inline const char *hpu__plural(long long n)
{
	return n == 1 ? "" : "s";
}

#endif
