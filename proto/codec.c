#include "proto/codec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <zmq.h>

int hpu__codec_send(void *sock, const hpu_codec_peer *peer,
		    const Hpu__Envelope *env)
{
	size_t len = hpu__envelope__get_packed_size(env);
	uint8_t stackbuf[1024];
	uint8_t *buf = len <= sizeof stackbuf ? stackbuf : malloc(len);
	if (!buf)
		return -1;
	hpu__envelope__pack(env, buf);
	int rc = 0;
	if (peer && zmq_send(sock, peer->id, peer->len, ZMQ_SNDMORE) < 0)
		rc = -1;
	if (rc == 0 && zmq_send(sock, buf, len, 0) < 0)
		rc = -1;
	if (buf != stackbuf) {
		int saved = errno;
		free(buf);
		errno = saved;
	}
	return rc;
}

/* Reads and drops whatever frames remain of a multipart message. */
static void drain_more(void *sock)
{
	int more = 0;
	size_t sz = sizeof more;
	while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0 && more) {
		zmq_msg_t m;
		zmq_msg_init(&m);
		zmq_msg_recv(&m, sock, 0);
		zmq_msg_close(&m);
	}
}

Hpu__Envelope *hpu__codec_recv(void *sock, hpu_codec_peer *peer, int flags)
{
	zmq_msg_t m;
	zmq_msg_init(&m);
	if (peer) {
		if (zmq_msg_recv(&m, sock, flags) < 0) {
			zmq_msg_close(&m);
			return NULL;
		}
		size_t n = zmq_msg_size(&m);
		peer->len = n < sizeof peer->id ? n : sizeof peer->id;
		memcpy(peer->id, zmq_msg_data(&m), peer->len);
		if (!zmq_msg_more(&m)) {
			zmq_msg_close(&m);
			errno = EPROTO;
			return NULL;
		}
		zmq_msg_close(&m);
		zmq_msg_init(&m);
		flags = 0; /* the rest of a multipart message is already here */
	}
	if (zmq_msg_recv(&m, sock, flags) < 0) {
		zmq_msg_close(&m);
		return NULL;
	}
	Hpu__Envelope *env = NULL;
	size_t n = zmq_msg_size(&m);
	if (n <= HPU_CODEC_MAX_MSG && !zmq_msg_more(&m))
		env = hpu__envelope__unpack(NULL, n, zmq_msg_data(&m));
	zmq_msg_close(&m);
	drain_more(sock);
	if (!env)
		errno = EPROTO;
	return env;
}

size_t hpu__codec_pack(const Hpu__Envelope *env, uint8_t **out)
{
	size_t len = hpu__envelope__get_packed_size(env);
	*out = malloc(len ? len : 1);
	if (!*out)
		return 0;
	return hpu__envelope__pack(env, *out);
}

Hpu__Envelope *hpu__codec_unpack(const void *buf, size_t len)
{
	if (!buf || len > HPU_CODEC_MAX_MSG)
		return NULL;
	return hpu__envelope__unpack(NULL, len, buf);
}

void hpu__codec_worker_exit(Hpu__WorkerExit *we, int rank, int node_rank, int pid,
			    int status)
{
	hpu__worker_exit__init(we);
	we->rank = (uint32_t)rank;
	we->node_rank = (uint32_t)node_rank;
	we->pid = (uint32_t)pid;
	we->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
	we->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
	we->left_early = status == 0x10000; /* HPU_AGENT_LEFT_EARLY */
}

void hpu__codec_free(Hpu__Envelope *env)
{
	if (env)
		hpu__envelope__free_unpacked(env, NULL);
}

void hpu__zmq_ctx_term(void *ctx)
{
	if (!ctx)
		return;
	while (zmq_ctx_term(ctx) != 0 && zmq_errno() == EINTR)
		;
}
