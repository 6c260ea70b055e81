/* hex: bytes as lowercase hex digits and back, the one spelling of keys,
 * digests, nonces and session names. */
#ifndef HPU_HEX_H
#define HPU_HEX_H

#include <stddef.h>

/* Writes the n bytes at in as 2n lowercase hex digits and a NUL into
 * out[2n + 1]. */
void hpu__hex(char *out, const void *in, size_t n);

/* The value of hex digit c (0-9, a-f, A-F), or -1. */
int hpu__hex_digit(int c);

/* Reads 2n lowercase hex digits (what hpu__hex writes, so that one value
 * has one spelling) into the n bytes at out. Returns 0, or -1 at the
 * first character that is not one (out then partly written). */
int hpu__unhex(void *out, const char *in, size_t n);

/* Whether s starts with exactly n lowercase hex digits (s[n] is none). */
int hpu__is_hex(const char *s, size_t n);

#endif
