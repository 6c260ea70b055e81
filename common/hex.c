/* hex: bytes as lowercase hex digits and back. */
#include "common/hex.h"

#include <stdint.h>

void hpu__hex(char *out, const void *in, size_t n)
{
	static const char digits[] = "0123456789abcdef";
	const uint8_t *b = in;
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[b[i] >> 4];
		out[2 * i + 1] = digits[b[i] & 15];
	}
	out[2 * n] = '\0';
}

int hpu__hex_digit(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* The value of lowercase hex digit c, or -1. */
static int lower_digit(char c)
{
	return c >= 'A' && c <= 'F' ? -1 : hpu__hex_digit((unsigned char)c);
}

int hpu__unhex(void *out, const char *in, size_t n)
{
	uint8_t *b = out;
	for (size_t i = 0; i < n; i++) {
		int hi = lower_digit(in[2 * i]);
		int lo = hi < 0 ? -1 : lower_digit(in[2 * i + 1]);
		if (lo < 0)
			return -1;
		b[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

int hpu__is_hex(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (lower_digit(s[i]) < 0)
			return 0;
	return lower_digit(s[n]) < 0;
}
