/* auth: the cluster secret and signed control frames.
 *
 * hpud runs code on request, so every control frame, both ways, carries an
 * HMAC-SHA256 keyed by the cluster secret over everything else in it: a
 * random nonce, a timestamp and the body (a packed Envelope). A frame is
 *
 *     offset  size  field
 *          0     4  magic "HPU1"
 *          4     8  timestamp, ms since the epoch, big-endian
 *         12    16  nonce (random)
 *         28    32  HMAC-SHA256(key, bytes 0..27 || body)
 *         60     n  body
 *
 * The verifier refuses a frame that is too short or too long, has another
 * magic, a wrong MAC (compared in constant time), a timestamp outside the
 * clock window, or a nonce it has already accepted within the window (a
 * replay). A stream whose messages carry their own sequence numbers (hpud's
 * frames to a submitter) is checked with hpu__auth_check instead, which
 * keeps no nonces: the receiver refuses replays by the sequence number,
 * in O(1) memory whatever the rate. The secret is a file of 64 hex digits (32 bytes) that must not
 * be readable or writable by group or others. */
#ifndef HPU_AUTH_H
#define HPU_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define HPU_AUTH_KEY_BYTES 32
#define HPU_AUTH_HEADER 60
/* Largest frame accepted (header + body). */
#define HPU_AUTH_MAX_FRAME (HPU_AUTH_HEADER + 64 * 1024)
/* The widest clock window hpud takes (its clock_window, seconds): the
 * submitter checks hpud's replies within it, whatever the node's window. */
#define HPU_AUTH_WINDOW_MAX_S 3600
/* Hex digits in an id from hpu__auth_random_id (16 random bytes). */
#define HPU_AUTH_ID_HEX 32

typedef struct hpu_auth hpu_auth;

/* Reads the secret from `path` into key[]. Refuses (-1, one sentence in
 * err naming the file) a file that is missing, not a regular file,
 * readable or writable by group or others, or not 64 hex digits (an
 * optional trailing newline is fine). */
int hpu__auth_load_key(const char *path, uint8_t key[HPU_AUTH_KEY_BYTES],
		       char *err, size_t errlen);

/* Makes a new secret at `path` (mode 0600, refusing to overwrite an
 * existing file) from OpenSSL's RAND_bytes. Returns 0, or -1 with err. */
int hpu__auth_gen_key(const char *path, char *err, size_t errlen);

/* A verifier/signer for one key, with a replay cache of at most
 * `max_nonces` nonces and a clock window of +-window_ms. NULL on no
 * memory. */
hpu_auth *hpu__auth_new(const uint8_t key[HPU_AUTH_KEY_BYTES],
			int64_t window_ms, size_t max_nonces);

/* Replaces the key outright, forgetting any previous key; the replay
 * cache stays. */
void hpu__auth_set_key(hpu_auth *a, const uint8_t key[HPU_AUTH_KEY_BYTES]);

/* A key rotation (hpud's SIGHUP): when `key` differs from the current
 * key, the current key becomes the previous one (the one before it is
 * forgotten) and `key` the current; returns 1. Returns 0, changing
 * nothing, when it is the same key. The replay cache stays, one for both
 * keys: a nonce accepted under either is refused under both. */
int hpu__auth_rotate(hpu_auth *a, const uint8_t key[HPU_AUTH_KEY_BYTES]);

/* A new clock window and replay cache size (SIGHUP), keeping the keys and
 * every nonce the cache remembers that the new window at now_ms still
 * covers; what it forgets it refuses as stale, as ever (frames stamped
 * before the newest nonce forgotten). Returns 0, or -1 changing nothing:
 * no memory, or the nonces to keep do not fit in max_nonces. */
int hpu__auth_resize(hpu_auth *a, int64_t window_ms, size_t max_nonces, int64_t now_ms);

void hpu__auth_destroy(hpu_auth **a);

/* Signs `body` as a frame stamped `now_ms` with a fresh nonce into a
 * malloc'ed buffer (*frame, the caller frees). Returns the frame's length,
 * or 0 (no memory, body too long). */
size_t hpu__auth_sign(hpu_auth *a, const void *body, size_t len, int64_t now_ms,
		      uint8_t **frame);

/* Checks `frame` at time now_ms. On success returns 0 and points *body
 * (inside frame) and *bodylen at the body, and remembers the nonce. On
 * failure returns -1 and writes one sentence saying which check failed
 * into err ("bad signature", "stale: timestamp 42 s in the past", "replayed
 * nonce", ...); nothing is remembered. Never reads outside frame[0..len). */
int hpu__auth_verify(hpu_auth *a, const void *frame, size_t len, int64_t now_ms,
		     const void **body, size_t *bodylen, char *err, size_t errlen);

/* As hpu__auth_verify, but a frame signed with the previous key
 * (hpu__auth_rotate) is accepted too: *prev is 1 then, 0 for the current
 * key. The caller decides what a frame signed with the previous key may
 * ask. */
int hpu__auth_verify_either(hpu_auth *a, const void *frame, size_t len, int64_t now_ms,
			    const void **body, size_t *bodylen, int *prev, char *err,
			    size_t errlen);

/* As hpu__auth_sign, with the previous key (hpu__auth_rotate); 0 when
 * there is none. */
size_t hpu__auth_sign_prev(hpu_auth *a, const void *body, size_t len, int64_t now_ms,
			   uint8_t **frame);

/* Checks `frame` at time now_ms as hpu__auth_verify does (size, magic,
 * MAC, clock window), but neither looks up nor remembers its nonce: the
 * caller must refuse replays itself, by a sequence number inside the body
 * (the body is signed). Same results and err sentences otherwise. */
int hpu__auth_check(hpu_auth *a, const void *frame, size_t len, int64_t now_ms,
		    const void **body, size_t *bodylen, char *err, size_t errlen);

/* Writes HPU_AUTH_ID_HEX random hex digits and a NUL into out (OpenSSL's
 * RAND_bytes: unguessable). Returns 0, or -1 when the generator fails. */
int hpu__auth_random_id(char out[HPU_AUTH_ID_HEX + 1]);

/* The current time in ms since the epoch (CLOCK_REALTIME). */
int64_t hpu__auth_now_ms(void);

#endif
