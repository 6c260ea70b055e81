/* hpud's replies: envelopes packed for a submitter's session, signed
 * with the next sequence number as they leave, handed to ZeroMQ without
 * blocking; the launch reply. Calls logging.c (daemon/hpud.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "daemon/hpud.h"

/* ---- replies ---- */

/* env for the submitter's `session`, packed with this instance but no
 * sequence number yet (send_body adds it) into *body (malloc'd; NULL
 * without memory); returns its length. */
size_t hpud__pack_env(const char *session, Hpu__Envelope *env, uint8_t **body)
{
	env->instance = hpud__D.instance;
	env->session = (char *)session;
	env->seq = 0;
	return hpu__codec_pack(env, body);
}

/* Whether frames to peer are signed with the previous key: its job was
 * launched under it (a key rotated since; hpud.h's key_gen). */
int hpud__peer_prev_key(const hpu_codec_peer *peer)
{
	for (int i = 0; i < MAX_JOBS; i++) {
		const job *j = &hpud__D.jobs[i];
		if (j->used && j->key_gen + 1 == hpud__D.key_gen && j->peer.len == peer->len &&
		    memcmp(j->peer.id, peer->id, peer->len) == 0)
			return 1;
	}
	return 0;
}

/* Signs a packed envelope (hpud__pack_env) with the next sequence number (the
 * submitter refuses a replay by it) and hands it to ZeroMQ for peer.
 * Frames to one submitter must leave in the order they were signed: it
 * drops one whose seq is not above the last it took. So the number is
 * drawn here, as the frame leaves, never while it waits in a job's queue;
 * gaps (frames dropped here) are fine. seq, the envelope's last field, is
 * packed on its own and appended: protobuf reads the concatenation as one
 * message with all the fields.
 * Returns 0 when sent; 1 when ZeroMQ's queue to the peer is full (nothing
 * was sent: try again later); -1 when the frame was dropped (the peer is
 * gone, memory is short). */
int hpud__send_body(const hpu_codec_peer *peer, const uint8_t *body, size_t blen)
{
	/* A submitter that is gone or slow must not block the daemon: with
	 * ZMQ_ROUTER_MANDATORY a full queue refuses the routing id. */
	if (zmq_send(hpud__D.sock, peer->id, peer->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
		if (errno == EAGAIN)
			return 1;
		hpud__logmsg(HPUD_LOG_DEBUG, "a reply was dropped: %s", zmq_strerror(errno));
		return -1;
	}
	Hpu__Envelope s = HPU__ENVELOPE__INIT;
	s.seq = ++hpud__D.seq;
	uint8_t *tail = NULL, *whole = NULL, *frame = NULL;
	size_t tlen = hpu__codec_pack(&s, &tail), flen = 0;
	if (tail && (whole = malloc(blen + tlen))) {
		memcpy(whole, body, blen);
		memcpy(whole + blen, tail, tlen);
		flen = hpud__D.reply_prev || hpud__peer_prev_key(peer)
			       ? hpu__auth_sign_prev(hpud__D.auth, whole, blen + tlen, hpu__auth_now_ms(), &frame)
			       : hpu__auth_sign(hpud__D.auth, whole, blen + tlen, hpu__auth_now_ms(), &frame);
	}
	free(tail);
	free(whole);
	if (!frame) {
		hpud__logmsg(HPUD_LOG_ERROR, "cannot sign a reply (out of memory?)");
		zmq_send(hpud__D.sock, "", 0, ZMQ_DONTWAIT); /* ends what the routing id began */
		return -1;
	}
	int rc = zmq_send(hpud__D.sock, frame, flen, ZMQ_DONTWAIT) < 0 ? -1 : 0;
	if (rc < 0)
		hpud__logmsg(HPUD_LOG_DEBUG, "a reply was dropped: %s", zmq_strerror(errno));
	free(frame);
	return rc;
}

/* Packs env for the submitter's `session` and sends it at once: a reply,
 * dropped if ZeroMQ's queue to the peer is full. */
void hpud__send_env(const hpu_codec_peer *peer, const char *session, Hpu__Envelope *env)
{
	uint8_t *body = NULL;
	size_t blen = hpud__pack_env(session, env, &body);
	if (!body) {
		hpud__logmsg(HPUD_LOG_ERROR, "cannot pack a reply (out of memory?)");
		return;
	}
	if (hpud__send_body(peer, body, blen) == 1)
		hpud__logmsg(HPUD_LOG_DEBUG, "a reply was dropped: the queue to its peer is full");
	free(body);
}

void hpud__reply_launch(const hpu_codec_peer *peer, const char *session, const char *job_id,
			const job *j, const char *error)
{
	Hpu__LaunchReply r = HPU__LAUNCH_REPLY__INIT;
	uint32_t ids[MAX_DEVICES];
	r.job_id = (char *)job_id;
	r.ok = error == NULL;
	r.error = (char *)(error ? error : "");
	if (j) {
		for (int i = 0; i < j->devices; i++)
			ids[i] = (uint32_t)j->dev[i];
		r.n_device_ids = (size_t)j->devices;
		r.device_ids = ids;
		r.master_port = (uint32_t)hpu__nodejob_master_port(j->nj);
	}
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_LAUNCH_REPLY;
	env.launch_reply = &r;
	hpud__send_env(peer, session, &env);
}
