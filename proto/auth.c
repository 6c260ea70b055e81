/* auth: the cluster secret and signed control frames (see auth.h).
 *
 * The replay cache remembers the nonce and timestamp of every frame
 * accepted within the clock window. Nonces live in a pool of max_nonces
 * entries, found through a chained hash table and filed, by timestamp, in a
 * ring of time buckets `width` ms wide. Every verification that gets past
 * the MAC and the clock forgets the buckets that now lie wholly before
 * now - window, which costs O(1) amortized: each entry is filed once and
 * forgotten once, and the ring moves forward one bucket per `width` ms
 * (1 ms for windows under 16 s, 2 ms for 30 s). When the cache is full, the
 * oldest bucket, the only one that can still hold expired nonces, is
 * searched for them too, at most once per nonce it frees plus once per
 * bucket; only then is the frame refused.
 *
 * Forgetting a nonce is only safe while a frame with its timestamp would be
 * refused as stale. The cache keeps that true even when the clock steps
 * back: `horizon` is one past the newest timestamp it ever forgot, and a
 * frame stamped before it is refused, since it could be a replay the cache
 * no longer remembers. With a clock that only moves forward the horizon
 * lies before now - window and never refuses anything the window accepts.
 */
#include "proto/auth.h"
#include "common/fileio.h"
#include "common/hex.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#define MAGIC "HPU1"
#define OFF_TS 4
#define OFF_NONCE 12
#define OFF_MAC 28
#define NONCE_BYTES 16
#define MAC_BYTES 32
#define KEY_HEX (2 * HPU_AUTH_KEY_BYTES)
#define NONE UINT32_MAX
/* Largest window the arithmetic below is meant for (about 35 years). */
#define MAX_WINDOW_MS (INT64_C(1) << 50)

struct nonce_entry {
	uint8_t nonce[NONCE_BYTES];
	int64_t ts;     /* the frame's timestamp */
	uint32_t hnext; /* next in the hash chain, or in the free list */
	uint32_t tnext; /* next in the time bucket */
};

struct hpu_auth {
	uint8_t key[HPU_AUTH_KEY_BYTES];
	uint8_t prev[HPU_AUTH_KEY_BYTES]; /* the key before a rotation ... */
	int has_prev;                     /* ... if there was one */
	EVP_MAC *mac;
	EVP_MAC_CTX *ctx; /* HMAC-SHA256, re-keyed for every frame */
	int64_t window_ms;

	struct nonce_entry *e; /* the pool: max entries */
	size_t max, count;
	uint32_t free; /* head of the free list */
	uint32_t *hash; /* chain heads, hmask + 1 of them */
	size_t hmask;
	uint64_t seed; /* random, mixed into the hash */

	uint32_t *ring; /* time bucket heads, rmask + 1 of them */
	size_t rmask;
	int64_t width; /* ms per bucket */
	int64_t base;  /* oldest bucket that may hold entries */
	int64_t base_min; /* no entry in bucket base is stamped earlier */
	int64_t horizon; /* frames stamped before this are refused */
};

static void seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
	if (!err || !errlen)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* ---- the key file ---- */

/* "readable by group or others" and the like, for st_mode & 077 != 0. */
static const char *exposure(mode_t mode)
{
	int r = (mode & 044) != 0, w = (mode & 022) != 0;
	if (r && w)
		return "readable and writable";
	if (r)
		return "readable";
	if (w)
		return "writable";
	return "accessible";
}

/* Reads at most cap bytes of fd into buf; returns the count or -1. */
static ssize_t read_upto(int fd, char *buf, size_t cap)
{
	size_t n = 0;
	while (n < cap) {
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		n += (size_t)r;
	}
	return (ssize_t)n;
}

/* Opens the key file refusing symbolic links (O_NOFOLLOW: the file named in
 * the configuration is the one whose mode is checked), FIFOs (no wait for
 * a writer), devices and directories, and a file others may read. */
static int open_key(const char *path, char *err, size_t errlen)
{
	struct stat st;
	const char *why;
	int fd = hpu__open_input_fd(path, O_NOFOLLOW, &st, &why);
	if (fd < 0 && st.st_mode != 0)
		seterr(err, errlen, "key file %s is not a regular file", path);
	else if (fd < 0 && errno == ENOENT)
		seterr(err, errlen, "key file %s does not exist", path);
	else if (fd < 0 && errno == ELOOP)
		seterr(err, errlen,
		       "key file %s is a symbolic link: name the file itself",
		       path);
	else if (fd < 0)
		seterr(err, errlen, "cannot open key file %s: %s", path, why);
	if (fd < 0)
		return -1;
	if (st.st_mode & 077) {
		seterr(err, errlen,
		       "key file %s is %s by group or others (mode %04o): "
		       "chmod 600 it",
		       path, exposure(st.st_mode),
		       (unsigned)(st.st_mode & 07777));
		close(fd);
		return -1;
	}
	return fd;
}

/* Decodes n bytes of key file text (64 hex digits, then at most one
 * newline) into key[]. */
static int parse_key(const char *buf, size_t n, const char *path,
		     uint8_t key[HPU_AUTH_KEY_BYTES], char *err, size_t errlen)
{
	if (n == KEY_HEX + 1 && buf[KEY_HEX] == '\n')
		n = KEY_HEX;
	if (n != KEY_HEX) {
		seterr(err, errlen,
		       "key file %s must hold exactly 64 hex digits and an "
		       "optional newline (it holds %s%zu bytes)",
		       path, n > KEY_HEX + 1 ? "more than " : "",
		       n > KEY_HEX + 1 ? (size_t)KEY_HEX + 1 : n);
		return -1;
	}
	for (size_t i = 0; i < KEY_HEX; i += 2) {
		int hi = hpu__hex_digit((unsigned char)buf[i]);
		int lo = hpu__hex_digit((unsigned char)buf[i + 1]);
		if (hi < 0 || lo < 0) {
			seterr(err, errlen,
			       "key file %s has a character that is not a hex "
			       "digit at byte %zu",
			       path, hi < 0 ? i + 1 : i + 2);
			return -1;
		}
		key[i / 2] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

int hpu__auth_load_key(const char *path, uint8_t key[HPU_AUTH_KEY_BYTES],
		       char *err, size_t errlen)
{
	char buf[KEY_HEX + 2]; /* one more than a good file holds */
	uint8_t tmp[HPU_AUTH_KEY_BYTES];
	int rc = -1;

	int fd = open_key(path, err, errlen);
	if (fd < 0)
		return -1;
	ssize_t n = read_upto(fd, buf, sizeof(buf));
	if (n < 0) {
		seterr(err, errlen, "cannot read key file %s: %s", path,
		       strerror(errno));
		goto out;
	}
	if (parse_key(buf, (size_t)n, path, tmp, err, errlen) < 0)
		goto out;
	memcpy(key, tmp, sizeof(tmp));
	rc = 0;
out:
	OPENSSL_cleanse(buf, sizeof(buf));
	OPENSSL_cleanse(tmp, sizeof(tmp));
	close(fd);
	return rc;
}

int hpu__auth_gen_key(const char *path, char *err, size_t errlen)
{
	uint8_t key[HPU_AUTH_KEY_BYTES];
	char text[KEY_HEX + 1]; /* the digits and a newline */
	int rc = -1;

	if (RAND_bytes(key, sizeof(key)) != 1) {
		seterr(err, errlen,
		       "cannot make key file %s: the random generator failed",
		       path);
		return -1;
	}
	hpu__hex(text, key, sizeof(key));
	text[KEY_HEX] = '\n';

	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		      0600);
	if (fd < 0) {
		if (errno == EEXIST)
			seterr(err, errlen,
			       "key file %s already exists: refusing to "
			       "overwrite it",
			       path);
		else
			seterr(err, errlen, "cannot create key file %s: %s",
			       path, strerror(errno));
		goto out;
	}
	/* The umask may have taken bits off 0600; it cannot have added any. */
	if (fchmod(fd, 0600) < 0 || hpu__write_all(fd, text, sizeof(text)) < 0 ||
	    fsync(fd) < 0) {
		seterr(err, errlen, "cannot write key file %s: %s", path,
		       strerror(errno));
		close(fd);
		unlink(path); /* ours: O_EXCL created it */
		goto out;
	}
	if (close(fd) < 0) {
		seterr(err, errlen, "cannot write key file %s: %s", path,
		       strerror(errno));
		unlink(path);
		goto out;
	}
	rc = 0;
out:
	OPENSSL_cleanse(key, sizeof(key));
	OPENSSL_cleanse(text, sizeof(text));
	return rc;
}

/* ---- HMAC ---- */

/* mac = HMAC-SHA256(key, head[0..OFF_MAC) || body[0..len)). */
static int compute_mac(hpu_auth *a, const uint8_t *key, const uint8_t *head,
		       const void *body, size_t len, uint8_t mac[MAC_BYTES])
{
	size_t outl = 0;
	if (!EVP_MAC_init(a->ctx, key, HPU_AUTH_KEY_BYTES, NULL) ||
	    !EVP_MAC_update(a->ctx, head, OFF_MAC) ||
	    (len && !EVP_MAC_update(a->ctx, body, len)) ||
	    !EVP_MAC_final(a->ctx, mac, &outl, MAC_BYTES) || outl != MAC_BYTES)
		return -1;
	return 0;
}

/* ---- the replay cache ---- */

static size_t pow2_at_least(size_t n)
{
	size_t p = 1;
	while (p < n)
		p <<= 1;
	return p;
}

static int64_t floor_div(int64_t a, int64_t b)
{
	int64_t q = a / b;
	return (a % b != 0 && a < 0) ? q - 1 : q;
}

static uint64_t load64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static size_t hash_slot(const hpu_auth *a, const uint8_t *nonce)
{
	uint64_t h = (load64(nonce) ^ a->seed) * UINT64_C(0x9e3779b97f4a7c15);
	h = (h ^ load64(nonce + 8)) * UINT64_C(0xc2b2ae3d27d4eb4f);
	return (size_t)(h ^ (h >> 29)) & a->hmask;
}

static int cache_has(const hpu_auth *a, const uint8_t *nonce)
{
	for (uint32_t i = a->hash[hash_slot(a, nonce)]; i != NONE;
	     i = a->e[i].hnext)
		if (memcmp(a->e[i].nonce, nonce, NONCE_BYTES) == 0)
			return 1;
	return 0;
}

static size_t ring_slot(const hpu_auth *a, int64_t bucket)
{
	return (size_t)((uint64_t)bucket & a->rmask);
}

/* Unlinks entry i from its hash chain and returns it to the free list. */
static void forget(hpu_auth *a, uint32_t i)
{
	uint32_t *p = &a->hash[hash_slot(a, a->e[i].nonce)];
	while (*p != i)
		p = &a->e[*p].hnext;
	*p = a->e[i].hnext;
	if (a->e[i].ts >= a->horizon)
		a->horizon = a->e[i].ts + 1;
	a->e[i].hnext = a->free;
	a->free = i;
	a->count--;
}

/* Forgets every bucket that lies wholly before now - window. A bucket is
 * walked once as the ring moves past it; when the cache is empty the ring
 * jumps. */
static void expire(hpu_auth *a, int64_t now_ms)
{
	int64_t target = floor_div(now_ms - a->window_ms, a->width);
	if (a->base >= target)
		return;
	while (a->base < target && a->count > 0) {
		uint32_t *head = &a->ring[ring_slot(a, a->base)];
		for (uint32_t i = *head, next; i != NONE; i = next) {
			next = a->e[i].tnext;
			forget(a, i);
		}
		*head = NONE;
		a->base++;
	}
	a->base = target;
	a->base_min = target * a->width;
}

/* Forgets the entries of the oldest bucket stamped before now - window:
 * after expire(), the only expired ones left. The walk is skipped while
 * base_min says none is, so each walk frees an entry, or is the first since
 * the ring moved. */
static void expire_oldest_bucket(hpu_auth *a, int64_t now_ms)
{
	int64_t limit = now_ms - a->window_ms, min = INT64_MAX;
	if (a->base_min >= limit)
		return;
	uint32_t *p = &a->ring[ring_slot(a, a->base)];
	while (*p != NONE) {
		uint32_t i = *p;
		if (a->e[i].ts < limit) {
			*p = a->e[i].tnext;
			forget(a, i);
		} else {
			if (a->e[i].ts < min)
				min = a->e[i].ts;
			p = &a->e[i].tnext;
		}
	}
	a->base_min = min;
}

/* Files a nonce stamped ts, accepted at now_ms; the caller made sure there
 * is room. */
static void remember(hpu_auth *a, const uint8_t *nonce, int64_t ts,
		     int64_t now_ms)
{
	if (a->count == 0) { /* the ring may start anywhere */
		a->base = floor_div(now_ms - a->window_ms, a->width);
		a->base_min = a->base * a->width;
	}
	uint32_t i = a->free;
	assert(i != NONE);
	a->free = a->e[i].hnext;
	memcpy(a->e[i].nonce, nonce, NONCE_BYTES);
	a->e[i].ts = ts;
	size_t h = hash_slot(a, nonce);
	a->e[i].hnext = a->hash[h];
	a->hash[h] = i;

	/* A frame stamped before the oldest bucket (the clock stepped back)
	 * goes into that bucket, to be forgotten later than need be. One past
	 * the newest bucket cannot happen while ts <= now + window; were it
	 * to, it goes into the newest and is forgotten early, which the
	 * horizon makes safe. */
	int64_t b = floor_div(ts, a->width);
	if (b <= a->base) {
		b = a->base;
		if (ts < a->base_min)
			a->base_min = ts;
	}
	if (b > a->base + (int64_t)a->rmask)
		b = a->base + (int64_t)a->rmask;
	uint32_t *head = &a->ring[ring_slot(a, b)];
	a->e[i].tnext = *head;
	*head = i;
	a->count++;
}

/* ---- the object ---- */

hpu_auth *hpu__auth_new(const uint8_t key[HPU_AUTH_KEY_BYTES],
			int64_t window_ms, size_t max_nonces)
{
	assert(window_ms >= 0 && window_ms <= MAX_WINDOW_MS);
	assert(max_nonces >= 1 && max_nonces < NONE);
	hpu_auth *a = calloc(1, sizeof(*a));
	if (!a)
		return NULL;
	a->window_ms = window_ms;
	a->max = max_nonces;
	/* At most 32768 buckets span the window both ways; a few more make
	 * room for the partial buckets at its ends. */
	a->width = 1 + 2 * window_ms / 32768;
	a->rmask = pow2_at_least((size_t)(2 * window_ms / a->width) + 4) - 1;
	a->hmask = pow2_at_least(max_nonces) - 1;
	a->e = malloc(max_nonces * sizeof(*a->e));
	a->hash = malloc((a->hmask + 1) * sizeof(*a->hash));
	a->ring = malloc((a->rmask + 1) * sizeof(*a->ring));
	a->mac = EVP_MAC_fetch(NULL, OSSL_MAC_NAME_HMAC, NULL);
	a->ctx = a->mac ? EVP_MAC_CTX_new(a->mac) : NULL;
	if (!a->e || !a->hash || !a->ring || !a->ctx)
		goto fail;
	OSSL_PARAM params[] = {
	    OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, "SHA256",
					     0),
	    OSSL_PARAM_construct_end(),
	};
	if (!EVP_MAC_CTX_set_params(a->ctx, params))
		goto fail;
	if (RAND_bytes((unsigned char *)&a->seed, sizeof(a->seed)) != 1)
		goto fail;
	for (size_t i = 0; i < max_nonces; i++)
		a->e[i].hnext = i + 1 < max_nonces ? (uint32_t)(i + 1) : NONE;
	a->free = 0;
	memset(a->hash, 0xff, (a->hmask + 1) * sizeof(*a->hash));
	memset(a->ring, 0xff, (a->rmask + 1) * sizeof(*a->ring));
	a->horizon = INT64_MIN;
	memcpy(a->key, key, sizeof(a->key));
	return a;
fail:
	hpu__auth_destroy(&a);
	return NULL;
}

void hpu__auth_set_key(hpu_auth *a, const uint8_t key[HPU_AUTH_KEY_BYTES])
{
	memcpy(a->key, key, sizeof(a->key));
	OPENSSL_cleanse(a->prev, sizeof(a->prev));
	a->has_prev = 0;
}

int hpu__auth_rotate(hpu_auth *a, const uint8_t key[HPU_AUTH_KEY_BYTES])
{
	if (CRYPTO_memcmp(a->key, key, sizeof(a->key)) == 0)
		return 0;
	memcpy(a->prev, a->key, sizeof(a->prev));
	a->has_prev = 1;
	memcpy(a->key, key, sizeof(a->key));
	return 1;
}

int hpu__auth_resize(hpu_auth *a, int64_t window_ms, size_t max_nonces, int64_t now_ms)
{
	hpu_auth *n = hpu__auth_new(a->key, window_ms, max_nonces);
	if (!n)
		return -1;
	memcpy(n->prev, a->prev, sizeof(n->prev));
	n->has_prev = a->has_prev;
	n->horizon = a->horizon;
	for (size_t h = 0; h <= a->hmask; h++)
		for (uint32_t i = a->hash[h]; i != NONE; i = a->e[i].hnext) {
			const struct nonce_entry *x = &a->e[i];
			if (x->ts < now_ms - window_ms) { /* forgotten, as forget() does */
				if (x->ts >= n->horizon)
					n->horizon = x->ts + 1;
				continue;
			}
			if (n->count == n->max) {
				hpu__auth_destroy(&n);
				return -1;
			}
			remember(n, x->nonce, x->ts, now_ms);
		}
	hpu_auth t = *a;
	*a = *n;
	*n = t;
	hpu__auth_destroy(&n);
	return 0;
}

void hpu__auth_destroy(hpu_auth **ap)
{
	hpu_auth *a = *ap;
	if (!a)
		return;
	OPENSSL_cleanse(a->key, sizeof(a->key));
	OPENSSL_cleanse(a->prev, sizeof(a->prev));
	EVP_MAC_CTX_free(a->ctx);
	EVP_MAC_free(a->mac);
	free(a->e);
	free(a->hash);
	free(a->ring);
	free(a);
	*ap = NULL;
}

/* ---- frames ---- */

static void put_be64(uint8_t *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		p[i] = (uint8_t)v;
}

static uint64_t get_be64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

static size_t sign_with(hpu_auth *a, const uint8_t *key, const void *body, size_t len,
			int64_t now_ms, uint8_t **frame)
{
	assert(frame);
	if (len > HPU_AUTH_MAX_FRAME - HPU_AUTH_HEADER)
		return 0;
	uint8_t *f = malloc(HPU_AUTH_HEADER + len);
	if (!f)
		return 0;
	memcpy(f, MAGIC, 4);
	put_be64(f + OFF_TS, (uint64_t)now_ms);
	if (RAND_bytes(f + OFF_NONCE, NONCE_BYTES) != 1 ||
	    compute_mac(a, key, f, body, len, f + OFF_MAC) < 0) {
		free(f);
		return 0;
	}
	if (len)
		memcpy(f + HPU_AUTH_HEADER, body, len);
	*frame = f;
	return HPU_AUTH_HEADER + len;
}

size_t hpu__auth_sign(hpu_auth *a, const void *body, size_t len, int64_t now_ms,
		      uint8_t **frame)
{
	return sign_with(a, a->key, body, len, now_ms, frame);
}

size_t hpu__auth_sign_prev(hpu_auth *a, const void *body, size_t len, int64_t now_ms,
			   uint8_t **frame)
{
	assert(frame);
	return a->has_prev ? sign_with(a, a->prev, body, len, now_ms, frame) : 0;
}

/* Checks the timestamp against now_ms +- window. */
static int check_clock(const hpu_auth *a, uint64_t ts_wire, int64_t now_ms,
		       char *err, size_t errlen)
{
	int64_t lo = now_ms - a->window_ms, hi = now_ms + a->window_ms;
	double off_s = ((double)ts_wire - (double)now_ms) / 1000.0;
	double win_s = (double)a->window_ms / 1000.0;
	if (ts_wire > (uint64_t)INT64_MAX || (int64_t)ts_wire > hi) {
		seterr(err, errlen,
		       "timestamp %.1f s in the future (the window is %.1f s): "
		       "check the clocks",
		       off_s, win_s);
		return -1;
	}
	if ((int64_t)ts_wire < lo) {
		seterr(err, errlen,
		       "stale: timestamp %.1f s in the past (the window is "
		       "%.1f s)",
		       -off_s, win_s);
		return -1;
	}
	return 0;
}

/* Whether f's MAC is HMAC(key, ...) (constant time); -1 when OpenSSL
 * fails. */
static int mac_matches(hpu_auth *a, const uint8_t *key, const uint8_t *f, size_t len)
{
	uint8_t mac[MAC_BYTES];
	if (compute_mac(a, key, f, f + HPU_AUTH_HEADER, len - HPU_AUTH_HEADER, mac) < 0)
		return -1;
	int bad = CRYPTO_memcmp(mac, f + OFF_MAC, MAC_BYTES);
	OPENSSL_cleanse(mac, sizeof(mac));
	return !bad;
}

/* Everything hpu__auth_verify checks but the replay cache: size, magic, MAC
 * and clock. With `prev` non-NULL, a frame signed with the previous key
 * passes too, and *prev says so. */
static int check_frame(hpu_auth *a, const uint8_t *f, size_t len,
		       int64_t now_ms, int *prev, char *err, size_t errlen)
{
	if (len < HPU_AUTH_HEADER) {
		seterr(err, errlen, "truncated frame (%zu bytes, under the %d "
		       "of a header)", len, HPU_AUTH_HEADER);
		return -1;
	}
	if (len > HPU_AUTH_MAX_FRAME) {
		seterr(err, errlen, "oversized frame (%zu bytes, over %d)",
		       len, HPU_AUTH_MAX_FRAME);
		return -1;
	}
	if (memcmp(f, MAGIC, 4) != 0) {
		seterr(err, errlen, "bad magic (not an hpud frame)");
		return -1;
	}
	int ok = mac_matches(a, a->key, f, len);
	if (prev)
		*prev = 0;
	if (ok == 0 && prev && a->has_prev) {
		ok = mac_matches(a, a->prev, f, len);
		*prev = ok == 1;
	}
	if (ok < 0) {
		seterr(err, errlen, "cannot compute the HMAC (OpenSSL failed)");
		return -1;
	}
	if (!ok) {
		seterr(err, errlen, "bad signature (wrong key or altered)");
		return -1;
	}
	return check_clock(a, get_be64(f + OFF_TS), now_ms, err, errlen);
}

int hpu__auth_check(hpu_auth *a, const void *frame, size_t len, int64_t now_ms,
		    const void **body, size_t *bodylen, char *err, size_t errlen)
{
	const uint8_t *f = frame;
	assert(now_ms > INT64_MIN / 2 && now_ms < INT64_MAX / 2);
	if (check_frame(a, f, len, now_ms, NULL, err, errlen) < 0)
		return -1;
	if (body)
		*body = f + HPU_AUTH_HEADER;
	if (bodylen)
		*bodylen = len - HPU_AUTH_HEADER;
	return 0;
}

/* hpu__auth_verify, with the previous key too when prev is non-NULL. */
static int verify(hpu_auth *a, const void *frame, size_t len, int64_t now_ms,
		  const void **body, size_t *bodylen, int *prev, char *err, size_t errlen)
{
	const uint8_t *f = frame;
	assert(now_ms > INT64_MIN / 2 && now_ms < INT64_MAX / 2);
	if (check_frame(a, f, len, now_ms, prev, err, errlen) < 0)
		return -1;
	int64_t ts = (int64_t)get_be64(f + OFF_TS);

	expire(a, now_ms);
	if (ts < a->horizon) {
		seterr(err, errlen,
		       "stale: timestamp older than nonces the replay cache "
		       "has forgotten (did the clock step back?)");
		return -1;
	}
	if (cache_has(a, f + OFF_NONCE)) {
		seterr(err, errlen, "replayed nonce");
		return -1;
	}
	if (a->count == a->max)
		expire_oldest_bucket(a, now_ms);
	if (a->count == a->max) {
		seterr(err, errlen, "replay cache full: too many requests "
		       "within the clock window");
		return -1;
	}
	remember(a, f + OFF_NONCE, ts, now_ms);
	if (body)
		*body = f + HPU_AUTH_HEADER;
	if (bodylen)
		*bodylen = len - HPU_AUTH_HEADER;
	return 0;
}

int hpu__auth_verify(hpu_auth *a, const void *frame, size_t len, int64_t now_ms,
		     const void **body, size_t *bodylen, char *err, size_t errlen)
{
	return verify(a, frame, len, now_ms, body, bodylen, NULL, err, errlen);
}

int hpu__auth_verify_either(hpu_auth *a, const void *frame, size_t len, int64_t now_ms,
			    const void **body, size_t *bodylen, int *prev, char *err,
			    size_t errlen)
{
	assert(prev);
	return verify(a, frame, len, now_ms, body, bodylen, prev, err, errlen);
}

int hpu__auth_random_id(char out[HPU_AUTH_ID_HEX + 1])
{
	uint8_t r[HPU_AUTH_ID_HEX / 2];
	if (RAND_bytes(r, sizeof(r)) != 1)
		return -1;
	hpu__hex(out, r, sizeof(r));
	return 0;
}

int64_t hpu__auth_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
