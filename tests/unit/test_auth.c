/* Unit tests for signed frames and the key file (proto/auth.c).
 *
 * Checked: frames round-trip and match a reference HMAC computed here; any
 * flipped bit, a wrong key, a replay, a timestamp outside the window, a
 * truncated or oversized frame and random garbage are refused with the
 * sentence that names the check; the replay cache stays within max_nonces,
 * forgets only expired nonces and refuses rather than forget a live one;
 * hpu__auth_check makes the same checks without the cache, remembering
 * nothing;
 * key files are refused unless private, regular and 64 hex digits, and
 * gen_key makes one that load_key takes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "proto/auth.h"

#define T0 INT64_C(1700000000000) /* a fixed "now", ms */
#define W 5000                    /* the usual window, ms */

static const uint8_t key1[HPU_AUTH_KEY_BYTES] = {
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a,
    0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15,
    0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f};
static const uint8_t key2[HPU_AUTH_KEY_BYTES] = {
    0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99, 0x88, 0x77, 0x66, 0x55,
    0x44, 0x33, 0x22, 0x11, 0x00, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
    0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10};

static char err[256];

static hpu_auth *new_auth(const uint8_t *key, int64_t window, size_t max)
{
	hpu_auth *a = hpu__auth_new(key, window, max);
	assert_non_null(a);
	return a;
}

static size_t sign(hpu_auth *a, const void *body, size_t len, int64_t now,
		   uint8_t **frame)
{
	*frame = NULL;
	size_t n = hpu__auth_sign(a, body, len, now, frame);
	assert_int_equal(n, HPU_AUTH_HEADER + len);
	assert_non_null(*frame);
	return n;
}

static int verify(hpu_auth *a, const void *frame, size_t len, int64_t now)
{
	const void *body = NULL;
	size_t bodylen = 0;
	err[0] = 0;
	int rc = hpu__auth_verify(a, frame, len, now, &body, &bodylen, err,
				  sizeof(err));
	if (rc == 0) {
		assert_ptr_equal(body, (const uint8_t *)frame + HPU_AUTH_HEADER);
		assert_int_equal(bodylen, len - HPU_AUTH_HEADER);
	} else {
		assert_true(err[0] != 0);
	}
	return rc;
}

/* Asserts that verification fails with a message starting with `want`. */
static void assert_refused(hpu_auth *a, const void *frame, size_t len,
			   int64_t now, const char *want)
{
	assert_int_equal(verify(a, frame, len, now), -1);
	if (strncmp(err, want, strlen(want)) != 0)
		fail_msg("expected \"%s...\", got \"%s\"", want, err);
}

static void assert_accepted(hpu_auth *a, const void *frame, size_t len,
			    int64_t now)
{
	if (verify(a, frame, len, now) != 0)
		fail_msg("refused: %s", err);
}

static uint64_t rng_state;

static uint64_t rng(void)
{
	uint64_t x = rng_state; /* xorshift64 */
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng_state = x;
}

/* ---- frames ---- */

static void check_layout(const uint8_t *f, const void *body, size_t len,
			 int64_t now)
{
	assert_memory_equal(f, "HPU1", 4);
	uint64_t ts = 0;
	for (int i = 0; i < 8; i++)
		ts = ts << 8 | f[4 + i];
	assert_int_equal(ts, (uint64_t)now);

	uint8_t *msg = malloc(28 + len + 1);
	assert_non_null(msg);
	memcpy(msg, f, 28);
	if (len)
		memcpy(msg + 28, body, len);
	uint8_t mac[32];
	unsigned maclen = 0;
	assert_non_null(HMAC(EVP_sha256(), key1, sizeof(key1), msg, 28 + len,
			     mac, &maclen));
	assert_int_equal(maclen, 32);
	assert_memory_equal(f + 28, mac, 32);
	if (len)
		assert_memory_equal(f + HPU_AUTH_HEADER, body, len);
	free(msg);
}

static void test_round_trip(void **state)
{
	(void)state;
	static const size_t lens[] = {0, 1, 64 * 1024};
	hpu_auth *a = new_auth(key1, W, 1024);
	uint8_t *body = malloc(64 * 1024);
	assert_non_null(body);
	rng_state = 7;
	for (size_t i = 0; i < 64 * 1024; i++)
		body[i] = (uint8_t)rng();
	for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
		uint8_t *f;
		size_t n = sign(a, lens[k] ? body : NULL, lens[k], T0, &f);
		check_layout(f, body, lens[k], T0);
		const void *b = NULL;
		size_t blen = 99;
		assert_int_equal(hpu__auth_verify(a, f, n, T0, &b, &blen, err,
						  sizeof(err)),
				 0);
		assert_ptr_equal(b, f + HPU_AUTH_HEADER);
		assert_int_equal(blen, lens[k]);
		if (lens[k])
			assert_memory_equal(b, body, lens[k]);
		free(f);
	}
	/* NULL out-parameters are fine. */
	uint8_t *f;
	size_t n = sign(a, "x", 1, T0, &f);
	assert_int_equal(hpu__auth_verify(a, f, n, T0, NULL, NULL, NULL, 0), 0);
	free(f);
	free(body);
	hpu__auth_destroy(&a);
	hpu__auth_destroy(&a);
	assert_null(a);
}

static void test_sign_refuses_too_long(void **state)
{
	(void)state;
	hpu_auth *a = new_auth(key1, W, 16);
	size_t max = HPU_AUTH_MAX_FRAME - HPU_AUTH_HEADER;
	uint8_t *body = calloc(max + 1, 1);
	assert_non_null(body);
	uint8_t *f = (uint8_t *)&f; /* must stay untouched */
	assert_int_equal(hpu__auth_sign(a, body, max + 1, T0, &f), 0);
	assert_ptr_equal(f, (uint8_t *)&f);
	assert_int_equal(hpu__auth_sign(a, body, SIZE_MAX, T0, &f), 0);
	size_t n = sign(a, body, max, T0, &f);
	assert_int_equal(n, HPU_AUTH_MAX_FRAME);
	assert_accepted(a, f, n, T0);
	free(f);
	free(body);
	hpu__auth_destroy(&a);
}

static void test_flipped_bits(void **state)
{
	(void)state;
	hpu_auth *a = new_auth(key1, W, 16);
	uint8_t *f;
	size_t n = sign(a, "hello", 5, T0, &f);
	for (size_t i = 0; i < n; i++) {
		for (int bit = 0; bit < 8; bit++) {
			f[i] ^= (uint8_t)(1u << bit);
			assert_refused(a, f, n, T0,
				       i < 4 ? "bad magic"
					     : "bad signature (wrong key or "
					       "altered)");
			f[i] ^= (uint8_t)(1u << bit);
		}
	}
	/* None of that was remembered: the original still goes through. */
	assert_accepted(a, f, n, T0);
	free(f);
	hpu__auth_destroy(&a);
}

static void test_wrong_key(void **state)
{
	(void)state;
	hpu_auth *s = new_auth(key1, W, 16), *v = new_auth(key2, W, 16);
	uint8_t *f;
	size_t n = sign(s, "body", 4, T0, &f);
	assert_refused(v, f, n, T0, "bad signature (wrong key or altered)");
	assert_accepted(s, f, n, T0);
	free(f);
	hpu__auth_destroy(&s);
	hpu__auth_destroy(&v);
}

static void test_set_key(void **state)
{
	(void)state;
	hpu_auth *a = new_auth(key1, W, 16);
	uint8_t *f1, *f2;
	size_t n1 = sign(a, "one", 3, T0, &f1);
	assert_accepted(a, f1, n1, T0);
	hpu__auth_set_key(a, key2);
	uint8_t *f3;
	size_t n3 = sign(a, "one", 3, T0, &f3);
	assert_refused(a, f1, n1, T0, "bad signature");
	size_t n2 = sign(a, "two", 3, T0, &f2);
	assert_accepted(a, f2, n2, T0);
	/* Back to the first key: the replay cache stayed. */
	hpu__auth_set_key(a, key1);
	assert_refused(a, f1, n1, T0, "replayed nonce");
	assert_refused(a, f3, n3, T0, "bad signature");
	free(f1);
	free(f2);
	free(f3);
	hpu__auth_destroy(&a);
}

/* A rotation keeps the previous key for hpu__auth_verify_either, which
 * says which key verified; hpu__auth_verify takes the current one only;
 * one replay cache serves both keys (a frame accepted before the rotation
 * is a replay after it); a second rotation forgets the first key. */
static void test_rotate(void **state)
{
	(void)state;
	uint8_t key3[HPU_AUTH_KEY_BYTES];
	memset(key3, 0x33, sizeof key3);
	hpu_auth *a = new_auth(key1, W, 16);
	uint8_t *f1, *f2, *f3, *f4;
	const void *body;
	size_t blen;
	char err[256];
	int prev = -1;
	size_t n1 = sign(a, "one", 3, T0, &f1);
	size_t n2 = sign(a, "two", 3, T0, &f2);
	assert_accepted(a, f1, n1, T0);
	assert_int_equal(hpu__auth_rotate(a, key1), 0); /* the same key: nothing */
	assert_int_equal(hpu__auth_sign_prev(a, "x", 1, T0, &f4), 0);
	assert_int_equal(hpu__auth_rotate(a, key2), 1);
	assert_refused(a, f2, n2, T0, "bad signature");
	assert_int_equal(hpu__auth_verify_either(a, f2, n2, T0, &body, &blen, &prev, err, sizeof err), 0);
	assert_int_equal(prev, 1);
	assert_int_equal(hpu__auth_verify_either(a, f2, n2, T0, &body, &blen, &prev, err, sizeof err), -1);
	assert_non_null(strstr(err, "replayed nonce"));
	assert_int_equal(hpu__auth_verify_either(a, f1, n1, T0, &body, &blen, &prev, err, sizeof err), -1);
	assert_non_null(strstr(err, "replayed nonce"));
	size_t n3 = sign(a, "three", 5, T0, &f3);
	assert_int_equal(hpu__auth_verify_either(a, f3, n3, T0, &body, &blen, &prev, err, sizeof err), 0);
	assert_int_equal(prev, 0);
	size_t n4 = hpu__auth_sign_prev(a, "four", 4, T0, &f4);
	assert_true(n4 > 0);
	assert_int_equal(hpu__auth_rotate(a, key3), 1);
	assert_int_equal(hpu__auth_verify_either(a, f4, n4, T0, &body, &blen, &prev, err, sizeof err), -1);
	assert_non_null(strstr(err, "bad signature"));
	free(f1);
	free(f2);
	free(f3);
	free(f4);
	hpu__auth_destroy(&a);
}

/* hpu__auth_resize (SIGHUP's clock_window): the nonces still in the new
 * window are kept (a replay is refused), and a frame whose nonce the old
 * window had forgotten is refused as stale in a wider window; the keys
 * stay; a cache too small for the nonces to keep changes nothing. */
static void test_resize(void **state)
{
	(void)state;
	hpu_auth *a = new_auth(key1, W, 16);
	uint8_t *f1, *f2, *f3, *f4;
	size_t n1 = sign(a, "one", 3, T0, &f1);
	size_t n2 = sign(a, "two", 3, T0 + W, &f2);
	size_t n3 = sign(a, "three", 5, T0 + W + 2, &f3);
	assert_accepted(a, f1, n1, T0);
	assert_accepted(a, f2, n2, T0 + W);
	assert_accepted(a, f3, n3, T0 + W + 2); /* f1 forgotten */
	assert_int_equal(hpu__auth_resize(a, 1, 16, T0 + W + 2), 0); /* keeps f3 only */
	assert_int_equal(hpu__auth_resize(a, 10 * W, 1, T0 + W + 2), 0);
	assert_int_equal(hpu__auth_resize(a, 10 * W, 16, T0 + W + 3), 0);
	assert_refused(a, f3, n3, T0 + W + 3, "replayed nonce");
	assert_refused(a, f2, n2, T0 + W + 3, "stale");
	assert_refused(a, f1, n1, T0 + W + 3, "stale");
	size_t n4 = sign(a, "four", 4, T0 + W + 3, &f4);
	assert_accepted(a, f4, n4, T0 + W + 3);
	assert_int_equal(hpu__auth_resize(a, 10 * W, 1, T0 + W + 4), -1); /* f3 and f4 */
	assert_refused(a, f4, n4, T0 + W + 4, "replayed nonce");
	free(f1);
	free(f2);
	free(f3);
	free(f4);
	hpu__auth_destroy(&a);
}

/* The clock stepped back by more than the window (docs/troubleshooting.md):
 * a new frame is older than the nonces the cache has forgotten, so it
 * could be a replay the cache no longer knows, and is refused. */
static void test_clock_stepped_back(void **state)
{
	(void)state;
	hpu_auth *a = new_auth(key1, W, 16);
	uint8_t *f1, *f2, *f3;
	size_t n1 = sign(a, "one", 3, T0, &f1);
	size_t n2 = sign(a, "two", 3, T0 + W + 1, &f2);
	assert_accepted(a, f1, n1, T0);
	assert_accepted(a, f2, n2, T0 + W + 1); /* f1 forgotten */
	size_t n3 = sign(a, "three", 5, T0 - W, &f3); /* the clock 2W back */
	assert_refused(a, f3, n3, T0 - W,
		       "stale: timestamp older than nonces the replay cache has forgotten (did the "
		       "clock step back?)");
	free(f1);
	free(f2);
	free(f3);
	hpu__auth_destroy(&a);
}

static void test_replay(void **state)
{
	(void)state;
	hpu_auth *a = new_auth(key1, W, 16);
	uint8_t *f1, *f2;
	size_t n1 = sign(a, "same", 4, T0, &f1);
	size_t n2 = sign(a, "same", 4, T0, &f2);
	assert_memory_not_equal(f1 + 12, f2 + 12, 16);
	assert_accepted(a, f1, n1, T0);
	assert_refused(a, f1, n1, T0, "replayed nonce");
	assert_refused(a, f1, n1, T0 + W, "replayed nonce");
	assert_accepted(a, f2, n2, T0 + 1);
	assert_refused(a, f2, n2, T0 + 2, "replayed nonce");
	assert_string_equal(err, "replayed nonce");
	free(f1);
	free(f2);
	hpu__auth_destroy(&a);
}

/* hpu__auth_check: the same checks as verify but the replay cache. A stream
 * of 100000 frames (far more than the cache's 16) within one window is
 * taken whole, a frame twice too; a wrong key, a flipped bit, a stale or
 * truncated frame are refused as by verify; nothing is remembered, so that
 * verify still takes a frame check has seen. */
static void test_check_keeps_no_nonces(void **state)
{
	(void)state;
	hpu_auth *a = new_auth(key1, W, 16), *b = new_auth(key2, W, 16);
	uint8_t *f;
	size_t n = sign(a, "body", 4, T0, &f);
	const void *body = NULL;
	size_t blen = 0;
	for (int i = 0; i < 100000; i++)
		if (hpu__auth_check(a, f, n, T0 + i % W, &body, &blen, err, sizeof err) != 0)
			fail_msg("frame %d refused: %s", i, err);
	assert_ptr_equal(body, f + HPU_AUTH_HEADER);
	assert_int_equal(blen, 4);
	assert_int_equal(hpu__auth_check(b, f, n, T0, NULL, NULL, err, sizeof err), -1);
	assert_string_equal(err, "bad signature (wrong key or altered)");
	assert_int_equal(hpu__auth_check(a, f, n, T0 + W + 1, NULL, NULL, err, sizeof err), -1);
	assert_non_null(strstr(err, "stale"));
	assert_int_equal(hpu__auth_check(a, f, n - 1, T0, NULL, NULL, err, sizeof err), -1);
	assert_non_null(strstr(err, "bad signature"));
	assert_int_equal(hpu__auth_check(a, f, 20, T0, NULL, NULL, err, sizeof err), -1);
	assert_non_null(strstr(err, "truncated"));
	f[HPU_AUTH_HEADER] ^= 1;
	assert_int_equal(hpu__auth_check(a, f, n, T0, NULL, NULL, err, sizeof err), -1);
	f[HPU_AUTH_HEADER] ^= 1;
	assert_accepted(a, f, n, T0); /* check remembered nothing */
	assert_refused(a, f, n, T0, "replayed nonce");
	free(f);
	hpu__auth_destroy(&a);
	hpu__auth_destroy(&b);
}

/* Ids are 32 lowercase hex digits and differ. */
static void test_random_id(void **state)
{
	(void)state;
	char x[HPU_AUTH_ID_HEX + 1], y[HPU_AUTH_ID_HEX + 1];
	assert_int_equal(hpu__auth_random_id(x), 0);
	assert_int_equal(hpu__auth_random_id(y), 0);
	assert_int_equal(strlen(x), HPU_AUTH_ID_HEX);
	assert_int_equal(strspn(x, "0123456789abcdef"), HPU_AUTH_ID_HEX);
	assert_string_not_equal(x, y);
}

static void test_clock_window(void **state)
{
	(void)state;
	hpu_auth *a = new_auth(key1, W, 16);
	struct {
		int64_t ts;
		int ok;
	} cases[] = {
	    {T0, 1},
	    {T0 - W, 1},
	    {T0 + W, 1},
	    {T0 - W - 1, 0},
	    {T0 + W + 1, 0},
	    {T0 - 42000, 0},
	    {T0 + 42000, 0},
	    {0, 0},
	    {-1, 0}, /* 2^64 - 1 on the wire */
	    {INT64_MAX, 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint8_t *f;
		size_t n = sign(a, "t", 1, cases[i].ts, &f);
		if (cases[i].ok)
			assert_accepted(a, f, n, T0);
		else if (cases[i].ts >= 0 && cases[i].ts < T0)
			assert_refused(a, f, n, T0, "stale: timestamp ");
		else
			assert_refused(a, f, n, T0, "timestamp ");
		if (!cases[i].ok)
			assert_non_null(strstr(err, cases[i].ts >= 0 &&
							    cases[i].ts < T0
							? "s in the past"
							: "s in the future"));
		free(f);
	}
	uint8_t *f;
	size_t n = sign(a, "t", 1, T0 - 42000, &f);
	assert_refused(a, f, n, T0, "stale: timestamp 42.0 s in the past");
	free(f);
	n = sign(a, "t", 1, T0 + 42000, &f);
	assert_refused(a, f, n, T0, "timestamp 42.0 s in the future");
	free(f);
	hpu__auth_destroy(&a);
}

static void test_truncated(void **state)
{
	(void)state;
	hpu_auth *a = new_auth(key1, W, 16);
	uint8_t *f;
	size_t n = sign(a, NULL, 0, T0, &f);
	assert_int_equal(n, HPU_AUTH_HEADER);
	for (size_t len = 0; len < HPU_AUTH_HEADER; len++) {
		/* An exact copy, so that ASan sees any read past len. */
		uint8_t *c = malloc(len ? len : 1);
		assert_non_null(c);
		memcpy(c, f, len);
		char want[64];
		snprintf(want, sizeof(want), "truncated frame (%zu bytes", len);
		assert_refused(a, c, len, T0, want);
		free(c);
	}
	assert_refused(a, NULL, 0, T0, "truncated frame (0 bytes");
	assert_accepted(a, f, n, T0);
	free(f);
	hpu__auth_destroy(&a);
}

static void test_oversized(void **state)
{
	(void)state;
	hpu_auth *a = new_auth(key1, W, 16);
	size_t max = HPU_AUTH_MAX_FRAME - HPU_AUTH_HEADER;
	uint8_t *body = calloc(max, 1);
	assert_non_null(body);
	uint8_t *f;
	size_t n = sign(a, body, max, T0, &f);
	uint8_t *big = calloc(n + 1, 1);
	assert_non_null(big);
	memcpy(big, f, n);
	assert_refused(a, big, n + 1, T0, "oversized frame");
	assert_refused(a, big, SIZE_MAX, T0, "oversized frame");
	assert_accepted(a, big, n, T0);
	free(big);
	free(f);
	free(body);
	hpu__auth_destroy(&a);
}

static void test_garbage(void **state)
{
	(void)state;
	hpu_auth *a = new_auth(key1, W, 64);
	rng_state = 0x5eed5eed5eedULL;
	for (int i = 0; i < 10000; i++) {
		size_t len;
		uint64_t r = rng() % 10;
		if (r < 6)
			len = rng() % 200;
		else if (r < 9)
			len = rng() % 4096;
		else
			len = HPU_AUTH_MAX_FRAME - 8 + rng() % 16;
		uint8_t *g = malloc(len ? len : 1);
		assert_non_null(g);
		for (size_t j = 0; j < len; j++)
			g[j] = (uint8_t)rng();
		/* Most get past the magic, some carry a current timestamp
		 * too, so that the MAC is what stops them. */
		if (len >= 12 && rng() % 4 != 0) {
			memcpy(g, "HPU1", 4);
			if (rng() % 2) {
				uint64_t ts = (uint64_t)T0;
				for (int k = 7; k >= 0; k--, ts >>= 8)
					g[4 + k] = (uint8_t)ts;
			}
		}
		assert_int_equal(verify(a, g, len, T0), -1);
		free(g);
	}
	hpu__auth_destroy(&a);
}

/* ---- the replay cache ---- */

static void test_cache_full_then_evicted(void **state)
{
	(void)state;
	const int64_t win = 1000;
	hpu_auth *a = new_auth(key1, win, 4);
	uint8_t *f[8];
	size_t n[8];
	/* Four nonces stamped T0 .. T0+3 fill the cache. */
	for (int i = 0; i < 4; i++) {
		n[i] = sign(a, "x", 1, T0 + i, &f[i]);
		assert_accepted(a, f[i], n[i], T0 + 3);
	}
	n[4] = sign(a, "x", 1, T0 + 3, &f[4]);
	assert_refused(a, f[4], n[4], T0 + 3,
		       "replay cache full: too many requests within the clock "
		       "window");
	/* Still full until the oldest leaves the window... */
	assert_refused(a, f[4], n[4], T0 + win, "replay cache full");
	/* ... a replay is still a replay, full or not ... */
	assert_refused(a, f[1], n[1], T0 + win, "replayed nonce");
	/* ... and then exactly the one expired nonce makes room. */
	assert_accepted(a, f[4], n[4], T0 + win + 1);
	n[5] = sign(a, "x", 1, T0 + win + 1, &f[5]);
	assert_refused(a, f[5], n[5], T0 + win + 1, "replay cache full");
	/* The frame whose nonce was forgotten is stale anyway. */
	assert_refused(a, f[0], n[0], T0 + win + 1, "stale: timestamp");
	/* The clock stepping back must not let it through either. */
	assert_refused(a, f[0], n[0], T0 + 500, "stale: timestamp older than");
	/* The live ones are still remembered. */
	for (int i = 1; i < 5; i++)
		assert_refused(a, f[i], n[i], T0 + win + 1, "replayed nonce");
	/* Long after, everything has expired: room again. */
	int64_t later = T0 + 10 * win;
	for (int i = 5; i < 8; i++) {
		if (i > 5)
			n[i] = sign(a, "x", 1, later, &f[i]);
		else {
			free(f[5]);
			n[5] = sign(a, "x", 1, later, &f[5]);
		}
		assert_accepted(a, f[i], n[i], later);
	}
	for (int i = 0; i < 8; i++)
		free(f[i]);
	hpu__auth_destroy(&a);
}

/* Same timestamps, the cache full: nothing expires, all refused, and the
 * cache keeps every nonce it accepted. */
static void test_cache_full_same_ms(void **state)
{
	(void)state;
	hpu_auth *a = new_auth(key1, 1000, 100);
	uint8_t *f[100];
	size_t n[100];
	for (int i = 0; i < 100; i++) {
		n[i] = sign(a, &i, sizeof(i), T0, &f[i]);
		assert_accepted(a, f[i], n[i], T0);
	}
	for (int i = 0; i < 1000; i++) {
		uint8_t *g;
		size_t m = sign(a, "y", 1, T0, &g);
		assert_refused(a, g, m, T0 + i % 1000, "replay cache full");
		free(g);
	}
	for (int i = 0; i < 100; i++) {
		assert_refused(a, f[i], n[i], T0 + 999, "replayed nonce");
		free(f[i]);
	}
	hpu__auth_destroy(&a);
}

/* A steady stream: 100 frames a ms for 2 s with a 100 ms window needs about
 * 20100 live nonces; 32768 never fill. Recent frames stay replays. */
static void test_cache_stream(void **state)
{
	(void)state;
	const int frames = 200000, per_ms = 100;
	hpu_auth *a = new_auth(key1, 100, 32768);
	uint8_t *keep[8] = {0};
	size_t keepn[8] = {0};
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < frames; i++) {
		int64_t now = T0 + i / per_ms;
		uint8_t *f;
		size_t n = sign(a, &i, sizeof(i), now - (i % 7) * 10, &f);
		assert_accepted(a, f, n, now);
		int k = i % 8;
		if (i % 997 == 0) {
			free(keep[k]);
			keep[k] = f;
			keepn[k] = n;
		} else {
			free(f);
		}
		if (i % 1001 == 0 && keep[(k + 1) % 8]) {
			int j = (k + 1) % 8;
			if (verify(a, keep[j], keepn[j], now) == 0)
				fail_msg("a replay got through at frame %d", i);
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (double)(t1.tv_sec - t0.tv_sec) +
		   (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("# %d frames signed and verified in %.2f s (%.0f/s)\n", frames,
	       s, frames / s);
	for (int k = 0; k < 8; k++)
		free(keep[k]);
	hpu__auth_destroy(&a);
}

/* Random traffic against a model of the cache. With a clock that only moves
 * forward the cache must decide exactly as the model: accept a frame inside
 * the window unless its nonce is live (stamped within the window) or
 * max_nonces live nonces are remembered. With a clock that also steps back,
 * no frame may ever be accepted twice, and "full" needs max_nonces accepted
 * frames stamped within the window. Windows of 50 ms (1 ms buckets) and
 * 30 s (2 ms buckets, so that expired and live nonces share one). */
#define MODEL_FRAMES 512

struct model {
	uint8_t *f[MODEL_FRAMES];
	size_t n[MODEL_FRAMES];
	int64_t ts[MODEL_FRAMES];
	int accepted[MODEL_FRAMES];
	int count;
};

static void model_free(struct model *m)
{
	for (int i = 0; i < m->count; i++)
		free(m->f[i]);
	m->count = 0;
}

/* Picks a frame to offer: a fresh one stamped near now, or a recent one. */
static int model_pick(struct model *m, hpu_auth *a, int64_t now, int64_t win)
{
	if (m->count > 0 && (m->count == MODEL_FRAMES || rng() % 3 == 0)) {
		int recent = m->count < 32 ? m->count : 32;
		return m->count - 1 - (int)(rng() % (uint64_t)recent);
	}
	int i = m->count++;
	int64_t spread = win < 100 ? win : 100;
	if (rng() % 2)
		m->ts[i] = now + (int64_t)(rng() % (uint64_t)(2 * win + 7)) -
			   win - 3;
	else /* near an edge of the window */
		m->ts[i] = now + (rng() % 2 ? win : -win) +
			   (int64_t)(rng() % (uint64_t)(2 * spread)) - spread;
	m->n[i] = sign(a, &i, sizeof(i), m->ts[i], &m->f[i]);
	m->accepted[i] = 0;
	return i;
}

/* Accepted frames stamped no earlier than now - win; *replay: i is one. */
static size_t model_live(const struct model *m, int i, int64_t now,
			 int64_t win, int *replay)
{
	size_t live = 0;
	*replay = 0;
	for (int j = 0; j < m->count; j++) {
		if (!m->accepted[j] || m->ts[j] < now - win)
			continue;
		live++;
		*replay |= j == i;
	}
	return live;
}

static int64_t model_step(int64_t win, int round)
{
	if (round % 2 == 0)
		return (int64_t)(rng() % 4);
	return (int64_t)(rng() % (uint64_t)(win / 20 + 1));
}

static void test_cache_model_monotonic(void **state)
{
	(void)state;
	for (int round = 0; round < 40; round++) {
		const int64_t win = round < 20 ? 50 : 30000;
		const size_t max = 1 + (size_t)round % 9;
		struct model m = {0};
		hpu_auth *a = new_auth(key1, win, max);
		rng_state = 1000 + (uint64_t)round;
		int64_t now = T0 + round;
		for (int step = 0; step < 3000 && m.count < MODEL_FRAMES;
		     step++) {
			now += model_step(win, round);
			int i = model_pick(&m, a, now, win), replay;
			size_t live = model_live(&m, i, now, win, &replay);
			int want = m.ts[i] >= now - win &&
				   m.ts[i] <= now + win && !replay &&
				   live < max;
			int got = verify(a, m.f[i], m.n[i], now) == 0;
			if (got != want)
				fail_msg("round %d step %d: frame %d stamped "
					 "%+lld ms, %zu live%s: %s",
					 round, step, i,
					 (long long)(m.ts[i] - now), live,
					 replay ? ", a replay" : "",
					 got ? "accepted" : err);
			m.accepted[i] |= got;
		}
		model_free(&m);
		hpu__auth_destroy(&a);
	}
}

static void test_cache_model_clock_steps(void **state)
{
	(void)state;
	for (int round = 0; round < 40; round++) {
		const int64_t win = round < 20 ? 50 : 30000;
		const size_t max = 1 + (size_t)round % 9;
		struct model m = {0};
		hpu_auth *a = new_auth(key1, win, max);
		rng_state = 2000 + (uint64_t)round;
		int64_t now = T0;
		int accepted = 0;
		for (int step = 0; step < 3000 && m.count < MODEL_FRAMES;
		     step++) {
			uint64_t r = rng() % 100;
			if (r < 1)
				now -= (int64_t)(rng() % (uint64_t)(3 * win));
			else if (r < 3)
				now += (int64_t)(rng() % (uint64_t)(3 * win));
			else
				now += model_step(win, round);
			int i = model_pick(&m, a, now, win), replay;
			size_t live = model_live(&m, i, now, win, &replay);
			if (verify(a, m.f[i], m.n[i], now) != 0) {
				if (strncmp(err, "replay cache full", 17) == 0 &&
				    live < max)
					fail_msg("round %d step %d: full with "
						 "%zu live", round, step, live);
				continue;
			}
			if (m.accepted[i])
				fail_msg("round %d step %d: frame %d accepted "
					 "twice", round, step, i);
			m.accepted[i] = 1;
			accepted++;
		}
		/* The checks above must not have refused everything. */
		assert_true(accepted > 3);
		model_free(&m);
		hpu__auth_destroy(&a);
	}
}

/* The clock steps back past a nonce the cache forgot: the frame is still
 * refused although the window would take it and there is room. */
static void test_cache_clock_steps_back(void **state)
{
	(void)state;
	const int64_t win = 1000;
	hpu_auth *a = new_auth(key1, win, 16);
	uint8_t *f0, *f1, *f2;
	size_t n0 = sign(a, "0", 1, T0, &f0);
	size_t n1 = sign(a, "1", 1, T0 + win + 1, &f1);
	size_t n2 = sign(a, "2", 1, T0 + 400, &f2);
	assert_accepted(a, f0, n0, T0);
	assert_accepted(a, f1, n1, T0 + win + 1); /* forgets f0 */
	assert_refused(a, f0, n0, T0 + 500,
		       "stale: timestamp older than nonces the replay cache "
		       "has forgotten");
	/* A fresh frame stamped after the forgotten one is fine. */
	assert_accepted(a, f2, n2, T0 + 500);
	assert_refused(a, f2, n2, T0 + 500, "replayed nonce");
	assert_refused(a, f1, n1, T0 + 500, "replayed nonce");
	free(f0);
	free(f1);
	free(f2);
	hpu__auth_destroy(&a);
}

/* ---- key files ---- */

static char dir[64];

static int rm_one(const char *path, const struct stat *st, int type,
		  struct FTW *ftw)
{
	(void)st;
	(void)type;
	(void)ftw;
	return remove(path);
}

static int setup_dir(void **state)
{
	(void)state;
	strcpy(dir, "/tmp/test_auth.XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
	(void)state;
	return nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *path_of(const char *name)
{
	static char p[128];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return p;
}

/* Writes `text` to dir/name with `mode` (whatever the umask). */
static const char *write_file(const char *name, const char *text, mode_t mode)
{
	const char *p = path_of(name);
	unlink(p);
	int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
	return p;
}

static const char hex1[] =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

static int load(const char *path, uint8_t key[HPU_AUTH_KEY_BYTES])
{
	err[0] = 0;
	return hpu__auth_load_key(path, key, err, sizeof(err));
}

static void assert_load_fails(const char *path, const char *want)
{
	uint8_t key[HPU_AUTH_KEY_BYTES];
	memset(key, 0xa5, sizeof(key));
	assert_int_equal(load(path, key), -1);
	if (!strstr(err, path))
		fail_msg("error does not name %s: %s", path, err);
	if (!strstr(err, want))
		fail_msg("expected \"%s\" in \"%s\"", want, err);
	for (size_t i = 0; i < sizeof(key); i++)
		assert_int_equal(key[i], 0xa5);
	printf("# %s\n", err);
}

static void test_load_good(void **state)
{
	(void)state;
	uint8_t key[HPU_AUTH_KEY_BYTES];
	char text[80];
	snprintf(text, sizeof(text), "%s\n", hex1);
	assert_int_equal(load(write_file("nl.key", text, 0600), key), 0);
	assert_memory_equal(key, key1, sizeof(key));
	memset(key, 0, sizeof(key));
	assert_int_equal(load(write_file("bare.key", hex1, 0400), key), 0);
	assert_memory_equal(key, key1, sizeof(key));
	/* Upper-case digits are hex digits too. */
	for (size_t i = 0; i < 64; i++)
		text[i] = (char)((text[i] >= 'a' && text[i] <= 'f')
					 ? text[i] - 'a' + 'A'
					 : text[i]);
	memset(key, 0, sizeof(key));
	assert_int_equal(load(write_file("upper.key", text, 0600), key), 0);
	assert_memory_equal(key, key1, sizeof(key));
}

static void test_load_mode(void **state)
{
	(void)state;
	static const mode_t modes[] = {0644, 0640, 0604, 0660, 0620,
				       0602, 0610, 0601, 0700 | 040};
	char text[80];
	snprintf(text, sizeof(text), "%s\n", hex1);
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		const char *p = write_file("mode.key", text, modes[i]);
		char want[128];
		const char *what = (modes[i] & 044) && (modes[i] & 022)
					   ? "readable and writable"
				   : (modes[i] & 044) ? "readable"
				   : (modes[i] & 022) ? "writable"
						      : "accessible";
		snprintf(want, sizeof(want),
			 "is %s by group or others (mode %04o): chmod 600 it",
			 what, (unsigned)modes[i]);
		assert_load_fails(p, want);
	}
	char want[300];
	const char *p = write_file("secret.key", text, 0644);
	snprintf(want, sizeof(want),
		 "key file %s is readable by group or others (mode 0644): "
		 "chmod 600 it",
		 p);
	uint8_t key[HPU_AUTH_KEY_BYTES];
	assert_int_equal(load(p, key), -1);
	assert_string_equal(err, want);
}

static void test_load_bad_content(void **state)
{
	(void)state;
	char text[200];
	assert_load_fails(write_file("empty.key", "", 0600), "(it holds 0 bytes)");
	snprintf(text, sizeof(text), "%.63s", hex1);
	assert_load_fails(write_file("63.key", text, 0600),
			  "must hold exactly 64 hex digits and an optional "
			  "newline (it holds 63 bytes)");
	snprintf(text, sizeof(text), "%.63s\n", hex1);
	assert_load_fails(write_file("63nl.key", text, 0600),
			  "not a hex digit at byte 64");
	snprintf(text, sizeof(text), "%sa", hex1);
	assert_load_fails(write_file("65.key", text, 0600),
			  "(it holds 65 bytes)");
	snprintf(text, sizeof(text), "%s\n\n", hex1);
	assert_load_fails(write_file("2nl.key", text, 0600),
			  "(it holds more than 65 bytes)");
	snprintf(text, sizeof(text), "%s\r\n", hex1);
	assert_load_fails(write_file("crlf.key", text, 0600),
			  "must hold exactly 64 hex digits");
	snprintf(text, sizeof(text), "%s%s\n", hex1, hex1);
	assert_load_fails(write_file("128.key", text, 0600),
			  "must hold exactly 64 hex digits");
	snprintf(text, sizeof(text), "%s\n", hex1);
	text[11] = 'g';
	assert_load_fails(write_file("g.key", text, 0600),
			  "not a hex digit at byte 12");
	snprintf(text, sizeof(text), " %.63s", hex1);
	assert_load_fails(write_file("space.key", text, 0600),
			  "not a hex digit at byte 1");
	snprintf(text, sizeof(text), "%.63s\n\n", hex1);
	assert_load_fails(write_file("nlnl.key", text, 0600),
			  "not a hex digit at byte 64");
}

static void test_load_not_a_key_file(void **state)
{
	(void)state;
	char text[80];
	snprintf(text, sizeof(text), "%s\n", hex1);
	assert_load_fails(path_of("missing.key"), "does not exist");
	assert_int_equal(mkdir(path_of("d.key"), 0700), 0);
	assert_load_fails(path_of("d.key"), "is not a regular file");
	/* A FIFO is refused without waiting for a writer. */
	assert_int_equal(mkfifo(path_of("fifo.key"), 0600), 0);
	assert_load_fails(path_of("fifo.key"), "is not a regular file");
	/* Symbolic links are refused (O_NOFOLLOW), even to a good file. */
	write_file("target.key", text, 0600);
	assert_int_equal(symlink("target.key", path_of("link.key")), 0);
	assert_load_fails(path_of("link.key"),
			  "is a symbolic link: name the file itself");
	uint8_t key[HPU_AUTH_KEY_BYTES];
	assert_int_equal(load(path_of("target.key"), key), 0);
	/* A directory on the way that is not one. */
	assert_load_fails(path_of("target.key/x"), "cannot open key file");
}

static void test_gen_key(void **state)
{
	(void)state;
	/* A umask that would leave 0400: gen_key still makes 0600. */
	mode_t old = umask(0277);
	const char *p = path_of("gen.key");
	char path[128];
	strcpy(path, p);
	assert_int_equal(hpu__auth_gen_key(path, err, sizeof(err)), 0);
	umask(old);
	struct stat st;
	assert_int_equal(lstat(path, &st), 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(st.st_size, 65);

	char text[80] = {0};
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(read(fd, text, sizeof(text)), 65);
	close(fd);
	assert_int_equal(text[64], '\n');
	for (int i = 0; i < 64; i++)
		assert_non_null(strchr("0123456789abcdef", text[i]));

	uint8_t k1[HPU_AUTH_KEY_BYTES], k2[HPU_AUTH_KEY_BYTES];
	assert_int_equal(load(path, k1), 0);

	/* Refuses to overwrite; the file is left as it was. */
	assert_int_equal(hpu__auth_gen_key(path, err, sizeof(err)), -1);
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, "already exists: refusing to overwrite"));
	printf("# %s\n", err);
	assert_int_equal(load(path, k2), 0);
	assert_memory_equal(k1, k2, sizeof(k1));

	/* Nor through a dangling symbolic link. */
	assert_int_equal(symlink("nowhere.key", path_of("dangling.key")), 0);
	strcpy(path, path_of("dangling.key"));
	assert_int_equal(hpu__auth_gen_key(path, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "already exists"));
	assert_int_equal(access(path_of("nowhere.key"), F_OK), -1);

	/* Two keys differ. */
	strcpy(path, path_of("gen2.key"));
	assert_int_equal(hpu__auth_gen_key(path, err, sizeof(err)), 0);
	assert_int_equal(load(path, k2), 0);
	assert_memory_not_equal(k1, k2, sizeof(k1));

	/* A missing directory is an error naming the file. */
	strcpy(path, path_of("no/such.key"));
	assert_int_equal(hpu__auth_gen_key(path, err, sizeof(err)), -1);
	assert_non_null(strstr(err, path));
}

static void test_now(void **state)
{
	(void)state;
	struct timespec a, b;
	clock_gettime(CLOCK_REALTIME, &a);
	int64_t now = hpu__auth_now_ms();
	clock_gettime(CLOCK_REALTIME, &b);
	/* the wall clock in milliseconds: between two readings around it */
	assert_true(now >= (int64_t)a.tv_sec * 1000 + a.tv_nsec / 1000000 &&
		    now <= (int64_t)b.tv_sec * 1000 + b.tv_nsec / 1000000);
}

int main(void)
{
	const struct CMUnitTest frames[] = {
	    cmocka_unit_test(test_round_trip),
	    cmocka_unit_test(test_sign_refuses_too_long),
	    cmocka_unit_test(test_flipped_bits),
	    cmocka_unit_test(test_wrong_key),
	    cmocka_unit_test(test_set_key),
	    cmocka_unit_test(test_replay),
	    cmocka_unit_test(test_check_keeps_no_nonces),
	    cmocka_unit_test(test_random_id),
	    cmocka_unit_test(test_clock_window),
	    cmocka_unit_test(test_truncated),
	    cmocka_unit_test(test_oversized),
	    cmocka_unit_test(test_garbage),
	    cmocka_unit_test(test_cache_full_then_evicted),
	    cmocka_unit_test(test_cache_full_same_ms),
	    cmocka_unit_test(test_cache_stream),
	    cmocka_unit_test(test_cache_model_monotonic),
	    cmocka_unit_test(test_cache_model_clock_steps),
	    cmocka_unit_test(test_cache_clock_steps_back),
	    cmocka_unit_test(test_now),
	};
	const struct CMUnitTest keys[] = {
	    cmocka_unit_test(test_load_good),
	    cmocka_unit_test(test_load_mode),
	    cmocka_unit_test(test_load_bad_content),
	    cmocka_unit_test(test_load_not_a_key_file),
	    cmocka_unit_test(test_gen_key),
	    cmocka_unit_test(test_rotate),
	    cmocka_unit_test(test_resize), cmocka_unit_test(test_clock_stepped_back),
	};
	int failed = cmocka_run_group_tests_name("frames", frames, NULL, NULL);
	failed += cmocka_run_group_tests_name("key files", keys, setup_dir,
					      teardown_dir);
	return failed ? 1 : 0;
}
