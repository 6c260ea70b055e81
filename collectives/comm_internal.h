/* Internals of libhpucoll shared by the communicator (comm.c), the
 * ZeroMQ transport (transport.c) and the collective algorithms (algo.c).
 *
 * Wire format. Every message is one header frame of HPUCOLL__HDR_SIZE
 * bytes, followed by exactly one payload frame of `len` bytes when len > 0
 * (no payload frame when len == 0). All header fields are little-endian:
 *
 *   offset size field
 *        0    4 magic   HPUCOLL__MAGIC
 *        4    4 src     sender's rank
 *        8    4 seq     the sender's collective sequence number (1, 2, ...)
 *       12    1 kind    enum hpucoll__kind
 *       13    1 arg     per kind: (dtype << 4 | op) for all-reduce, else 0
 *       14    2 tag     per kind: ring step, broadcast root, barrier round
 *       16    8 off     byte offset of the payload in the caller's buffer
 *       24    8 len     payload bytes
 *
 * A receiver knows every field of the next message it expects from a given
 * sender, so it checks them all; any difference is a protocol error.
 */
#ifndef HPUCOLL_COMM_INTERNAL_H
#define HPUCOLL_COMM_INTERNAL_H

#include <stdint.h>
#include <string.h>
#include <zmq.h>

#include "hpu/coll.h"

#define HPUCOLL__MAGIC 0x4c4f4348u /* "HCOL" on the wire */
#define HPUCOLL__HDR_SIZE 32
/* Large transfers are split into messages of at most this many bytes so
 * that forwarding and reducing overlap with the transfer. */
#define HPUCOLL__SEG_BYTES (1u << 20)
/* Frames larger than this make ZeroMQ drop the sending connection. */
#define HPUCOLL__MAX_FRAME (4 * (int64_t)HPUCOLL__SEG_BYTES)
/* The ring all-reduce numbers its 2 * (size - 1) steps in the 16-bit tag. */
#define HPUCOLL__MAX_SIZE 32768
#define HPUCOLL__DEFAULT_TIMEOUT_MS 60000
/* How long closing a send socket may wait to flush queued messages. */
#define HPUCOLL__LINGER_MS 1000
#define HPUCOLL__ENDPOINT_MAX 256
#define HPUCOLL__ERRMSG_MAX 512

enum hpucoll__kind {
	HPUCOLL__ALL_REDUCE = 1,
	HPUCOLL__BROADCAST = 2,
	HPUCOLL__BARRIER = 3,
};

struct hpucoll__hdr {
	uint32_t magic;
	uint32_t src;
	uint32_t seq;
	uint8_t kind;
	uint8_t arg;
	uint16_t tag;
	uint64_t off;
	uint64_t len;
};

/* A message received from a rank before it was asked for. */
struct hpucoll__msg {
	struct hpucoll__hdr hdr;
	zmq_msg_t body; /* the payload; an empty message when len == 0 */
	struct hpucoll__msg *next;
};

struct hpucoll__peer {
	char *endpoint;            /* the rank's bound endpoint */
	void *push;                /* send socket, made on the first send */
	struct hpucoll__msg *head; /* messages that arrived early, in order */
	struct hpucoll__msg *tail;
};

struct hpucoll_comm {
	int rank;
	int size;
	int timeout_ms; /* each wait for a peer; negative waits forever */
	void *ctx;
	void *pull; /* this rank's one receive socket */
	char endpoint[HPUCOLL__ENDPOINT_MAX];
	struct hpucoll__peer *peers; /* `size` entries once connected */
	uint32_t seq;                /* collectives started so far */
	/* The collective under way: its name (for errors), kind and arg. */
	const char *what;
	uint8_t kind;
	uint8_t arg;
	int failed; /* the error that left the communicator unusable, or 0 */
	char errmsg[HPUCOLL__ERRMSG_MAX];
};

/* Formats one sentence into comm->errmsg. */
void hpucoll__set_error(hpucoll_comm *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Maps zmq_errno() after a failed ZeroMQ call to an hpucoll_err and says
 * what failed in comm->errmsg. */
int hpucoll__zmq_error(hpucoll_comm *c, const char *call);

/* Sends a header and `hdr->len` bytes copied from `data` to rank `dst`. */
int hpucoll__send(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		  const void *data);

/* Sends a header and `body` (hdr->len bytes) to rank `dst` without copying
 * the payload. `body` is consumed whether or not this succeeds. */
int hpucoll__send_msg(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		      zmq_msg_t *body);

/* Waits for the next message from rank `want->src` and checks that its
 * header equals `want`. On success `body` (uninitialised on entry) holds the
 * payload and belongs to the caller, who closes it. */
int hpucoll__recv(hpucoll_comm *c, const struct hpucoll__hdr *want,
		  zmq_msg_t *body);

/* Closes the send sockets and frees what the peers table holds. */
void hpucoll__peers_free(hpucoll_comm *c);

/* Applies comm->timeout_ms to the send sockets made so far. */
void hpucoll__peers_set_timeout(hpucoll_comm *c);

static inline void hpucoll__put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline void hpucoll__put64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t hpucoll__get32(const unsigned char *p)
{
	uint32_t v = 0;

	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static inline uint64_t hpucoll__get64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static inline void hpucoll__hdr_encode(unsigned char *p,
				       const struct hpucoll__hdr *h)
{
	hpucoll__put32(p, h->magic);
	hpucoll__put32(p + 4, h->src);
	hpucoll__put32(p + 8, h->seq);
	p[12] = h->kind;
	p[13] = h->arg;
	p[14] = (unsigned char)(h->tag & 0xff);
	p[15] = (unsigned char)(h->tag >> 8);
	hpucoll__put64(p + 16, h->off);
	hpucoll__put64(p + 24, h->len);
}

static inline void hpucoll__hdr_decode(struct hpucoll__hdr *h,
				       const unsigned char *p)
{
	h->magic = hpucoll__get32(p);
	h->src = hpucoll__get32(p + 4);
	h->seq = hpucoll__get32(p + 8);
	h->kind = p[12];
	h->arg = p[13];
	h->tag = (uint16_t)(p[14] | p[15] << 8);
	h->off = hpucoll__get64(p + 16);
	h->len = hpucoll__get64(p + 24);
}

#endif
