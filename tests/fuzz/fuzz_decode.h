/* What the fuzz target and its seed generator share: the fixed key and
 * clock, so that the signed seed frames verify inside the target. */
#ifndef HPU_FUZZ_DECODE_H
#define HPU_FUZZ_DECODE_H

#include <stdint.h>

/* 2026-01-01T00:00:00Z: the target's clock and the seeds' timestamp. */
#define FUZZ_NOW_MS INT64_C(1767225600000)
#define FUZZ_WINDOW_MS 30000
#define FUZZ_MAX_NONCES 16

/* The key is 0x00, 0x01, ... 0x1f. */
static inline void fuzz_key(uint8_t key[32])
{
	for (int i = 0; i < 32; i++)
		key[i] = (uint8_t)i;
}

#endif
