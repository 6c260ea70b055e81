/* codec: the one place that packs, unpacks and frees the generated
 * protobuf-c structs of proto/hpu.proto, and moves them over ZeroMQ.
 * No other module frees a generated struct. */
#ifndef HPU_CODEC_H
#define HPU_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include "proto/hpu.pb-c.h"

/* Largest control message accepted off the wire (bytes). */
#define HPU_CODEC_MAX_MSG (64 * 1024)

/* A ZeroMQ ROUTER routing id. */
typedef struct hpu_codec_peer {
	unsigned char id[256];
	size_t len;
} hpu_codec_peer;

/* Packs `env` and sends it on `sock`; when `peer` is not NULL, the peer's
 * routing id goes first (for ROUTER sockets). Returns 0, or -1 with errno
 * set (EAGAIN with ZMQ_DONTWAIT and a full queue). */
int hpu__codec_send(void *sock, const hpu_codec_peer *peer,
		    const Hpu__Envelope *env);

/* Receives one message from `sock` (flags as for zmq_msg_recv). When
 * `peer` is not NULL the first frame is taken as the routing id. Returns
 * the envelope, to be freed with hpu__codec_free(), or NULL: errno EAGAIN
 * when nothing is there, EPROTO when the bytes are not a valid envelope
 * (the message is consumed). */
Hpu__Envelope *hpu__codec_recv(void *sock, hpu_codec_peer *peer, int flags);

/* Packs `env` into a malloc'ed buffer (*out, the caller frees); returns
 * its length, or 0 with *out NULL when memory is short. */
size_t hpu__codec_pack(const Hpu__Envelope *env, uint8_t **out);

/* Unpacks `len` bytes (at most HPU_CODEC_MAX_MSG) into an envelope, to be
 * freed with hpu__codec_free(); NULL when they are not a valid envelope. */
Hpu__Envelope *hpu__codec_unpack(const void *buf, size_t len);

/* Fills a WorkerExit from a waitpid status. */
void hpu__codec_worker_exit(Hpu__WorkerExit *we, int rank, int node_rank, int pid,
			    int status);

/* Frees an envelope from hpu__codec_recv() or hpu__codec_unpack(); safe on
 * NULL. */
void hpu__codec_free(Hpu__Envelope *env);

/* zmq_ctx_term(ctx), retried while a signal interrupts it (EINTR: a
 * SIGCHLD during teardown), so that the context's threads and descriptors
 * are really gone. NULL is a no-op. */
void hpu__zmq_ctx_term(void *ctx);

#endif
