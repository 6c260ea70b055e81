/* Who may talk to a rank over ZeroMQ: the data plane's authentication.
 *
 * Every ZeroMQ connection into a rank's receive socket must prove, during
 * ZeroMQ's own handshake and so before any of its frames is delivered,
 * that it belongs to the job. The proof is checked by a ZAP handler (RFC
 * 27) on the communicator's context: a thread with a REP socket at
 * inproc://zeromq.zap.01 that ZeroMQ asks about every new connection.
 * A connection it refuses is closed by ZeroMQ with none of its frames
 * read. The handler's thread also watches the receive socket's
 * handshakes (its monitor), so that a peer offering no proof or another
 * mechanism, which ZeroMQ closes without asking the handler, is counted
 * too (hpucoll_stats.refused_connections); the first refusals are logged
 * with the peer's address when known.
 *
 * Both modes start from the job's secret (hpulaunch's job token):
 *   key = HMAC-SHA256(secret, "hpucoll data plane v1")
 *
 * HPUCOLL_SECURITY_AUTH (the default under hpulaunch): ZeroMQ's PLAIN
 * mechanism carries a one-time proof, not the secret. A rank connecting
 * to rank `dst` draws a 16-byte nonce and sends
 *   username = "<src>-<nonce in hex>"
 *   password = hex(HMAC-SHA256(key, "plain" 0 src dst nonce))
 * (src and dst as 4-byte little-endian). The handler recomputes the MAC
 * for itself as dst, compares in constant time and accepts each nonce
 * once, so a proof seen on the wire is worth nothing at another rank or a
 * second time (a replay is refused with ZAP status 300, a wrong proof with
 * 400). ZeroMQ's own reconnect would present a socket's proof again, so
 * under auth a rank makes every connection itself, each with a new nonce
 * (transport_zmq.c). Frames are not encrypted and not protected against a
 * man in the middle who can rewrite TCP traffic.
 *
 * HPUCOLL_SECURITY_ENCRYPT: ZeroMQ's CURVE (CurveZMQ: X25519 handshake,
 * XSalsa20-Poly1305 frames). All ranks share one key pair whose secret is
 * derived from the key (HMAC-SHA256(key, "curve")); the handshake proves
 * the client holds it, and the handler accepts only that public key.
 * Everything after the handshake is encrypted and authenticated.
 *
 * HPUCOLL_SECURITY_NONE: no handler, no check (hpucoll_comm_new, for
 * programs that wire ranks themselves on a network they trust).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "collectives/comm_internal.h"
#include "common/hex.h"
#include "common/num.h"
#include "common/thread.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define NONCE_BYTES 16
/* Refusals logged in full; after that one line at 10, 100, 1000, ... */
#define LOG_FIRST 3
/* An unfinished handshake's refusal is said this long after it, if the
 * comm still lives (comm_internal.h, sec.unfinished_at). */
#define UNFINISHED_MS 3000

static const char LABEL[] = "hpucoll data plane v1";
/* Why a proof accepted once before is refused (ZAP status
 * HPUCOLL__ZAP_REPLAY, so that its sender can tell). */
/* Why a connection from an address of no peer is refused (ZAP status
 * HPUCOLL__ZAP_NOT_A_PEER). */
static const char NOT_A_PEER[] = "an address that is not of the job's ranks";
static const char REPLAYED[] = "a proof it had accepted before (a replay: "
			       "ranks send a fresh one on every connection)";

const char *hpucoll_security_name(hpucoll_security s)
{
	switch (s) {
	case HPUCOLL_SECURITY_NONE:
		return "none";
	case HPUCOLL_SECURITY_AUTH:
		return "auth";
	case HPUCOLL_SECURITY_ENCRYPT:
		return "encrypt";
	}
	return "?";
}

int hpucoll_security_parse(const char *s, hpucoll_security *out)
{
	for (int i = HPUCOLL_SECURITY_NONE; i <= HPUCOLL_SECURITY_ENCRYPT; i++) {
		if (strcmp(s, hpucoll_security_name((hpucoll_security)i)) == 0) {
			*out = (hpucoll_security)i;
			return 0;
		}
	}
	return -1;
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* The PLAIN password of a connection from src to dst with this nonce. */
static void plain_mac(const struct hpucoll__sec *s, uint32_t src, uint32_t dst,
		      const uint8_t *nonce, char out[65])
{
	uint8_t msg[6 + 8 + NONCE_BYTES], mac[32];
	unsigned len = sizeof(mac);

	memcpy(msg, "plain", 6);
	put32(msg + 6, src);
	put32(msg + 10, dst);
	memcpy(msg + 14, nonce, NONCE_BYTES);
	HMAC(EVP_sha256(), s->key, sizeof(s->key), msg, sizeof(msg), mac, &len);
	hpu__hex(out, mac, sizeof(mac));
}

/* ---- The ZAP handler ---- */

/* Records a nonce; 0 when it was new, -1 when seen before (or no memory). */
static int nonce_once(struct hpucoll__sec *s, const uint8_t *nonce)
{
	for (size_t i = 0; i < s->n_nonces; i++)
		if (memcmp(s->nonces[i], nonce, NONCE_BYTES) == 0)
			return -1;
	if (s->n_nonces == s->cap_nonces) {
		size_t cap = s->cap_nonces ? 2 * s->cap_nonces : 16;
		uint8_t(*p)[NONCE_BYTES] = realloc(s->nonces, cap * NONCE_BYTES);

		if (p == NULL)
			return -1;
		s->nonces = p;
		s->cap_nonces = cap;
	}
	memcpy(s->nonces[s->n_nonces++], nonce, NONCE_BYTES);
	return 0;
}

/* Checks PLAIN credentials; NULL when good, else why not. */
static const char *check_plain(hpucoll_comm *c, const zmq_msg_t *user,
			       const zmq_msg_t *pass)
{
	struct hpucoll__sec *s = &c->sec;
	char u[64], want[65];
	uint8_t nonce[NONCE_BYTES];
	size_t ulen = zmq_msg_size(user);
	uint64_t src;
	const char *dash;

	if (ulen == 0 || ulen >= sizeof(u))
		return "malformed credentials";
	memcpy(u, zmq_msg_data((zmq_msg_t *)user), ulen);
	u[ulen] = '\0';
	if (hpu__parse_u64_prefix(u, &dash, &src) != HPU_NUM_OK || *dash != '-' ||
	    strlen(dash + 1) != 2 * NONCE_BYTES ||
	    hpu__unhex(nonce, dash + 1, NONCE_BYTES) != 0)
		return "malformed credentials";
	if (src >= (uint64_t)c->size || src == (uint64_t)c->rank)
		return "claims a rank that is not a peer";
	plain_mac(s, (uint32_t)src, (uint32_t)c->rank, nonce, want);
	if (zmq_msg_size(pass) != 64 ||
	    CRYPTO_memcmp(zmq_msg_data((zmq_msg_t *)pass), want, 64) != 0)
		return "wrong proof (not of this job)";
	if (nonce_once(s, nonce) != 0)
		return REPLAYED;
	return NULL;
}

/* Whether a connection from `addr` (ZeroMQ's peer address: an IP, or
 * "localhost:uid:gid:pid" on ipc) may be of a peer, once the rank table
 * is in. */
static int from_a_peer(hpucoll_comm *c, const zmq_msg_t *addr)
{
	struct hpucoll__sec *s = &c->sec;
	size_t len = zmq_msg_size((zmq_msg_t *)addr);
	char a[64];

	if (!atomic_load_explicit(&s->filter, memory_order_acquire))
		return 1;
	if (len >= sizeof(a))
		return 0;
	memcpy(a, zmq_msg_data((zmq_msg_t *)addr), len);
	a[len] = '\0';
	if (strncmp(a, "localhost:", 10) == 0 || a[0] == ':') {
		/* ipc, with its peer's credentials */
		const char *end, *cred = strchr(a, ':') + 1;
		uint64_t uid;

		return s->ipc &&
		       hpu__parse_u64_prefix(cred, &end, &uid) == HPU_NUM_OK &&
		       *end == ':' && uid == (uint64_t)geteuid();
	}
	if (a[0] == '\0' || strcmp(a, "localhost") == 0)
		return s->ipc; /* ipc without credentials: nothing to judge */
	for (int i = 0; i < s->n_hosts; i++)
		if (strcmp(a, s->hosts[i]) == 0)
			return 1;
	return 0;
}

static const char *check(hpucoll_comm *c, zmq_msg_t *f, int n)
{
	const char *mech = c->sec.mode == HPUCOLL_SECURITY_ENCRYPT ? "CURVE"
								   : "PLAIN";
	size_t mlen = n > 5 ? zmq_msg_size(&f[5]) : 0;

	if (n > 3 && !from_a_peer(c, &f[3]))
		return NOT_A_PEER;
	if (n < 6 || mlen != strlen(mech) ||
	    memcmp(zmq_msg_data(&f[5]), mech, mlen) != 0)
		return "no credentials (another security mode?)";
	if (c->sec.mode == HPUCOLL_SECURITY_ENCRYPT) {
		if (n != 7 || zmq_msg_size(&f[6]) != 32 ||
		    memcmp(zmq_msg_data(&f[6]), c->sec.curve_pub, 32) != 0)
			return "a key not of this job";
		return NULL;
	}
	if (n != 8)
		return "malformed credentials";
	return check_plain(c, &f[6], &f[7]);
}

/* Says why a connection was refused: the first LOG_FIRST ones in full,
 * then one line at 10, 100, 1000, ... refusals. */
static void say(hpucoll_comm *c, const zmq_msg_t *addr, const char *why)
{
	char a[64] = "a peer";
	size_t len = addr ? zmq_msg_size(addr) : 0;

	if (c->sec.logged >= LOG_FIRST)
		return;
	c->sec.logged++;
	if (len > 0 && len < sizeof(a)) {
		memcpy(a, zmq_msg_data((zmq_msg_t *)addr), len);
		a[len] = '\0';
	}
	for (char *q = a; *q; q++)
		if (*q < 0x20 || *q > 0x7e)
			*q = '?';
	hpucoll__log(HPUCOLL_LOG_WARNING,
		     "hpucoll: rank %d refused a data-plane connection from %s: %s; "
		     "none of its frames was read",
		     c->rank, a, why);
}

/* A handshake on the receive socket failed (its monitor says so): the
 * one place refusals are counted, whether the ZAP handler refused the
 * proof or the peer offered no or another mechanism (ZeroMQ closes those
 * before asking the handler). */
static void count_refusal(hpucoll_comm *c, uint16_t ev)
{
	uint64_t n = atomic_fetch_add(&c->sec.refused, 1) + 1, p = 10;

	/* NO_DETAIL: the handshake ran out of time or its connection
	 * closed (a peer stopped or gone in the middle of it); PROTOCOL: it
	 * spoke another mechanism */
	if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
		if (!c->sec.unfinished_at)
			c->sec.unfinished_at = hpucoll__now_ms() + UNFINISHED_MS;
	} else if (ev != ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
		say(c, NULL, "its handshake failed (no proof, or another "
			     "security mode)");
	while (p < n && p < UINT64_MAX / 10)
		p *= 10;
	if (n == p)
		hpucoll__log(HPUCOLL_LOG_WARNING,
			     "hpucoll: rank %d has refused %" PRIu64
			     " data-plane connections so far",
			     c->rank, n);
}

/* A refusal of an unfinished handshake, waited for long enough: said. */
static void say_unfinished(hpucoll_comm *c)
{
	c->sec.unfinished_at = 0;
	say(c, NULL, "its handshake did not finish (it stopped answering or "
		     "closed the connection in the middle: a stopped, dead or "
		     "slow peer, or no peer at all)");
}

/* zmq_poll's timeout: until an unfinished handshake's refusal is due. */
static long unfinished_wait(const hpucoll_comm *c)
{
	if (!c->sec.unfinished_at)
		return -1;
	int64_t left = c->sec.unfinished_at - hpucoll__now_ms();
	return left > 0 ? (long)left : 0;
}

static void read_monitor(hpucoll_comm *c, void *mon)
{
	uint16_t ev;

	while (hpucoll__monitor_event(mon, &ev, NULL))
		if (ev & HPUCOLL__HANDSHAKE_FAILED)
			count_refusal(c, ev);
}

/* Answers a request: 200 when why is NULL, else 400, or 300 for a
 * replayed proof (the client's monitor sees the status). */
static void reply(void *rep, const zmq_msg_t *reqid, const char *why)
{
	int ok = why == NULL;
	const char *status = ok		      ? "200"
			     : why == REPLAYED   ? "300"
			     : why == NOT_A_PEER ? "500"
						 : "400";
	zmq_msg_t id;

	zmq_msg_init(&id);
	zmq_msg_copy(&id, (zmq_msg_t *)reqid);
	zmq_send(rep, "1.0", 3, ZMQ_SNDMORE);
	zmq_msg_send(&id, rep, ZMQ_SNDMORE);
	zmq_send(rep, status, 3, ZMQ_SNDMORE);
	zmq_send(rep, ok ? "OK" : "refused", ok ? 2 : 7, ZMQ_SNDMORE);
	zmq_send(rep, "", 0, ZMQ_SNDMORE);
	zmq_send(rep, "", 0, 0);
	zmq_msg_close(&id);
}

/* Answers one request of ZeroMQ's. Frames: version, request id,
 * domain, address, routing id, mechanism, credentials (none for NULL, 1
 * for CURVE, 2 for PLAIN). */
static void answer(hpucoll_comm *c, void *rep)
{
	zmq_msg_t f[8];
	int n = 0, more = 1;

	while (more) {
		zmq_msg_t *m = &f[n < 8 ? n : 7];

		if (n >= 8)
			zmq_msg_close(m);
		zmq_msg_init(m);
		if (zmq_msg_recv(m, rep, 0) < 0) {
			zmq_msg_close(m);
			if (zmq_errno() == EINTR)
				continue;
			break; /* terminated: nothing to answer */
		}
		more = zmq_msg_more(m);
		n++;
	}
	if (!more) {
		const char *why = n > 8 ? "malformed request" : check(c, f, n);

		if (why != NULL)
			say(c, n > 3 ? &f[3] : NULL, why);
		if (n >= 2)
			reply(rep, &f[1], why);
	}
	for (int i = 0; i < n && i < 8; i++)
		zmq_msg_close(&f[i]);
}

/* Serves ZAP requests and watches the receive socket's handshakes until
 * the context is terminated. */
static void *zap_main(void *arg)
{
	hpucoll_comm *c = arg;
	zmq_pollitem_t it[2] = {
		{.socket = c->sec.zap, .events = ZMQ_POLLIN},
		{.socket = c->sec.mon, .events = ZMQ_POLLIN},
	};

	for (;;) {
		if (zmq_poll(it, 2, unfinished_wait(c)) < 0) {
			if (zmq_errno() == EINTR)
				continue;
			break;
		}
		if (c->sec.unfinished_at && hpucoll__now_ms() >= c->sec.unfinished_at)
			say_unfinished(c);
		if (it[0].revents & ZMQ_POLLIN)
			answer(c, c->sec.zap);
		if (it[1].revents & ZMQ_POLLIN)
			read_monitor(c, c->sec.mon);
	}
	zmq_close(c->sec.zap);
	zmq_close(c->sec.mon);
	return NULL;
}

/* ---- Setting up ---- */

int hpucoll__sec_start(hpucoll_comm *c, hpucoll_security mode,
		       const void *secret, size_t len)
{
	struct hpucoll__sec *s = &c->sec;
	unsigned mlen = sizeof(s->key);
	uint8_t curve_sk[32];
	char sk_z85[41], pk_z85[41];

	s->mode = mode;
	if (mode == HPUCOLL_SECURITY_NONE)
		return HPUCOLL_OK;
	if (secret == NULL || len == 0) {
		hpucoll__set_error(c, "comm_new: security mode '%s' needs the "
				      "job's secret.",
				   hpucoll_security_name(mode));
		return HPUCOLL_EINVAL;
	}
	HMAC(EVP_sha256(), secret, (int)len, (const uint8_t *)LABEL,
	     sizeof(LABEL) - 1, s->key, &mlen);
	if (mode == HPUCOLL_SECURITY_ENCRYPT) {
		if (!zmq_has("curve")) {
			hpucoll__set_error(c, "comm_new: this libzmq has no "
					      "CURVE, so the data plane cannot "
					      "be encrypted.");
			return HPUCOLL_EINVAL;
		}
		mlen = sizeof(curve_sk);
		HMAC(EVP_sha256(), s->key, sizeof(s->key),
		     (const uint8_t *)"curve", 5, curve_sk, &mlen);
		zmq_z85_encode(sk_z85, curve_sk, sizeof(curve_sk));
		if (zmq_curve_public(pk_z85, sk_z85) != 0)
			return hpucoll__zmq_error(c, "zmq_curve_public");
		memcpy(s->curve_sk, sk_z85, sizeof(sk_z85));
		memcpy(s->curve_pk, pk_z85, sizeof(pk_z85));
		zmq_z85_decode(s->curve_pub, pk_z85);
		OPENSSL_cleanse(curve_sk, sizeof(curve_sk));
	}
	s->zap = zmq_socket(c->ctx, ZMQ_REP);
	if (s->zap == NULL)
		return hpucoll__zmq_error(c, "zmq_socket");
	if (zmq_bind(s->zap, ZAP_ENDPOINT) != 0) {
		zmq_close(s->zap);
		s->zap = NULL;
		return hpucoll__zmq_error(c, "zmq_bind");
	}
	return HPUCOLL_OK;
}

int hpucoll__sec_run(hpucoll_comm *c)
{
	struct hpucoll__sec *s = &c->sec;
	char ep[64];
	int zero = 0;

	if (s->mode == HPUCOLL_SECURITY_NONE)
		return HPUCOLL_OK;
	snprintf(ep, sizeof(ep), "inproc://hpucoll-secmon-%p", (void *)c);
	if (zmq_socket_monitor(c->pull, ep, HPUCOLL__HANDSHAKE_FAILED) != 0)
		return hpucoll__zmq_error(c, "zmq_socket_monitor");
	s->mon = zmq_socket(c->ctx, ZMQ_PAIR);
	if (s->mon == NULL)
		return hpucoll__zmq_error(c, "zmq_socket");
	if (zmq_setsockopt(s->mon, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
	    zmq_connect(s->mon, ep) != 0)
		return hpucoll__zmq_error(c, "zmq_connect");
	if (hpu__thread_start(&s->thread, zap_main, c) != 0) {
		hpucoll__set_error(c, "comm_new: cannot start the "
				      "authentication thread.");
		return HPUCOLL_ENOMEM;
	}
	s->running = 1;
	return HPUCOLL_OK;
}

void hpucoll__sec_unwatch(hpucoll_comm *c)
{
	struct hpucoll__sec *s = &c->sec;

	if (s->mon != NULL && c->pull != NULL)
		zmq_socket_monitor(c->pull, NULL, 0);
	if (s->running)
		return;
	/* The handler's thread never started (comm_new failed, e.g. its
	 * bind): close its sockets now, since zmq_ctx_term() would wait for
	 * them forever. */
	if (s->zap != NULL)
		zmq_close(s->zap);
	if (s->mon != NULL)
		zmq_close(s->mon);
	s->zap = s->mon = NULL;
}

void hpucoll__sec_join(hpucoll_comm *c)
{
	struct hpucoll__sec *s = &c->sec;

	if (s->running)
		pthread_join(s->thread, NULL);
	s->running = 0;
	s->zap = s->mon = NULL;
	free(s->nonces);
	s->nonces = NULL;
	free(s->hosts);
	s->hosts = NULL;
	OPENSSL_cleanse(s->key, sizeof(s->key));
	OPENSSL_cleanse(s->curve_sk, sizeof(s->curve_sk));
}

/* The host of a "tcp://HOST:PORT" endpoint ("[...]" removed) into out;
 * returns 0 when it is a numeric address, else -1. */
static int tcp_host(const char *ep, char out[64])
{
	const char *h = ep + 6, *colon = strrchr(ep, ':');
	size_t len = colon && colon > h ? (size_t)(colon - h) : 0;
	unsigned char buf[16];

	if (len > 1 && h[0] == '[' && h[len - 1] == ']') {
		h++;
		len -= 2;
	}
	if (len == 0 || len >= 64)
		return -1;
	memcpy(out, h, len);
	out[len] = '\0';
	if (inet_pton(AF_INET, out, buf) == 1)
		return strcmp(out, "0.0.0.0") == 0 ? -1 : 0;
	if (inet_pton(AF_INET6, out, buf) == 1)
		return strcmp(out, "::") == 0 ? -1 : 0;
	return -1;
}

int hpucoll__sec_peers(hpucoll_comm *c, const char *const *endpoints)
{
	struct hpucoll__sec *s = &c->sec;
	char(*hosts)[64];
	int n = 0;

	if (s->mode == HPUCOLL_SECURITY_NONE || s->hosts != NULL)
		return HPUCOLL_OK;
	hosts = calloc((size_t)c->size, sizeof(*hosts));
	if (hosts == NULL)
		return HPUCOLL_ENOMEM;
	for (int i = 0; i < c->size; i++) {
		const char *ep = endpoints[i];
		int seen = 0;

		if (i == c->rank)
			continue;
		if (strncmp(ep, "ipc://", 6) == 0) {
			s->ipc = 1;
			continue;
		}
		if (strncmp(ep, "tcp://", 6) != 0 || tcp_host(ep, hosts[n]) != 0) {
			/* A host name, a wildcard, another transport: where
			 * it connects from is not known; no filter. */
			free(hosts);
			s->ipc = 0;
			return HPUCOLL_OK;
		}
		for (int j = 0; j < n && !seen; j++)
			seen = strcmp(hosts[j], hosts[n]) == 0;
		n += !seen;
	}
	s->hosts = hosts;
	s->n_hosts = n;
	atomic_store_explicit(&s->filter, 1, memory_order_release);
	return HPUCOLL_OK;
}

static int set_str(void *sock, int opt, const char *v)
{
	return zmq_setsockopt(sock, opt, v, strlen(v));
}

int hpucoll__sec_server(hpucoll_comm *c, void *sock)
{
	struct hpucoll__sec *s = &c->sec;
	int one = 1;

	if (s->mode == HPUCOLL_SECURITY_NONE)
		return 0;
	if (set_str(sock, ZMQ_ZAP_DOMAIN, "hpucoll") != 0)
		return -1;
	if (s->mode == HPUCOLL_SECURITY_AUTH)
		return zmq_setsockopt(sock, ZMQ_PLAIN_SERVER, &one, sizeof(one));
	return zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof(one)) ||
	       set_str(sock, ZMQ_CURVE_SECRETKEY, s->curve_sk);
}

int hpucoll__sec_client(hpucoll_comm *c, void *sock, int dst)
{
	struct hpucoll__sec *s = &c->sec;
	uint8_t nonce[NONCE_BYTES];
	char user[16 + 2 * NONCE_BYTES], pass[65];

	if (s->mode == HPUCOLL_SECURITY_NONE)
		return 0;
	if (s->mode == HPUCOLL_SECURITY_ENCRYPT)
		return set_str(sock, ZMQ_CURVE_SERVERKEY, s->curve_pk) ||
		       set_str(sock, ZMQ_CURVE_PUBLICKEY, s->curve_pk) ||
		       set_str(sock, ZMQ_CURVE_SECRETKEY, s->curve_sk);
	if (RAND_bytes(nonce, sizeof(nonce)) != 1)
		return -1;
	snprintf(user, sizeof(user), "%d-", c->rank);
	hpu__hex(user + strlen(user), nonce, sizeof(nonce));
	plain_mac(s, (uint32_t)c->rank, (uint32_t)dst, nonce, pass);
	return set_str(sock, ZMQ_PLAIN_USERNAME, user) ||
	       set_str(sock, ZMQ_PLAIN_PASSWORD, pass);
}
