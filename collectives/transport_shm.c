/* The shared-memory transport between the ranks of a node: shm.c's rings,
 * and the waits around them. A wait goes in slices of HPUCOLL__SLICE_MS,
 * looking between them at ABORTs arriving over ZeroMQ, the stall check
 * and the timeout. A peer that is gone may have left because its own
 * collective failed: its ABORT over ZeroMQ then says why, and is waited
 * for a moment so that the error names the rank that caused it.
 */
#include <stdlib.h>

#include "collectives/comm_internal.h"
#include "collectives/shm.h"

int hpucoll__shm_link_open(hpucoll_comm *c)
{
	int node = c->node_ids[c->rank], nlocal = 0, local = 0, rc;
	char err[256] = "";

	for (int i = 0; i < c->size; i++) {
		if (c->node_ids[i] != node)
			continue;
		if (i == c->rank) {
			local = nlocal;
		} else {
			c->peers[i].shm = nlocal;
			c->peers[i].tp = &hpucoll__shm_transport;
		}
		nlocal++;
	}
	if (nlocal < 2)
		return HPUCOLL_OK;
	c->shm_buf = malloc(HPUCOLL__SHM_MAX_PAYLOAD);
	if (c->shm_buf == NULL)
		return HPUCOLL_ENOMEM;
	rc = hpucoll__shm_open(&c->shm, c->job, node, local, nlocal,
			       atomic_load(&c->timeout_ms), err, sizeof(err));
	if (rc != HPUCOLL_OK)
		hpucoll__set_error(c, "connect: rank %d cannot attach the "
				      "shared memory of node %d: %s.",
				   c->rank, node, err);
	return rc;
}

void hpucoll__shm_link_close(hpucoll_comm *c)
{
	hpucoll__shm_close(&c->shm);
	free(c->shm_buf);
	c->shm_buf = NULL;
}

/* A local peer is gone. If it left because its own collective failed,
 * its ABORT is on the way over ZeroMQ and says why: wait a moment for it,
 * so that the error names the rank that caused it. */
static int peer_gone(hpucoll_comm *c, int src)
{
	int rc = hpucoll__zmq_await_abort(c, src, HPUCOLL__LOST_GRACE_MS);

	if (rc != HPUCOLL_OK)
		return rc;
	hpucoll__set_error(c, "%s: rank %d died (%s).", c->what, src,
			   hpucoll__shm_errmsg(c->shm));
	hpucoll__blame(c, src, HPUCOLL_EPEER);
	return HPUCOLL_EPEER;
}

/* Sends over shared memory, waiting in slices while the ring is full so
 * that aborts, the stall warning and the timeout are looked at. */
static int shm_send(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		    const void *data)
{
	struct hpucoll__wait w;
	int rc;

	rc = hpucoll__shm_send(c->shm, c->peers[dst].shm, hdr, data, 0);
	if (rc != HPUCOLL_ETIMEDOUT)
		goto out;
	hpucoll__wait_begin(c, &w);
	for (;;) {
		int64_t now = hpucoll__now_ms();
		long ms = hpucoll__wait_ms(c, &w, now, HPUCOLL__SLICE_MS);

		rc = hpucoll__shm_send(c->shm, c->peers[dst].shm, hdr, data,
				       (int)ms);
		if (rc != HPUCOLL_ETIMEDOUT)
			break;
		now = hpucoll__now_ms();
		if (w.deadline >= 0 && now >= w.deadline) {
			if (hpucoll__disagreement(c) != HPUCOLL_OK)
				return HPUCOLL_EPROTO;
			hpucoll__set_error(c, "%s: rank %d took no data for %d "
					      "ms (is it alive?).",
					   c->what, dst, w.timeout_ms);
			hpucoll__blame(c, dst, HPUCOLL_ETIMEDOUT);
			return HPUCOLL_ETIMEDOUT;
		}
		rc = hpucoll__stall_check(c, &w, dst, now);
		if (rc != HPUCOLL_OK)
			return rc;
		rc = hpucoll__zmq_poll_aborts(c, dst);
		if (rc != HPUCOLL_OK)
			return rc;
	}
out:
	if (rc == HPUCOLL_EPEER)
		return peer_gone(c, dst);
	if (rc != HPUCOLL_OK)
		hpucoll__set_error(c, "%s: sending to rank %d over shared "
				      "memory failed: %s.",
				   c->what, dst, hpucoll__shm_errmsg(c->shm));
	return rc;
}

/* The next slot towards dst itself when its ring has room now, so that
 * the payload is built where the peer reads it; else the staging buffer,
 * copied into the slot once there is room (a wait for room must not hold
 * a received slot). */
static void *shm_send_buf(hpucoll_comm *c, int dst, size_t len)
{
	/* never a payload beyond a slot in one (the rings' segments are
	 * capped below it: group_links) */
	void *slot = len <= HPUCOLL__SHM_MAX_PAYLOAD
			     ? hpucoll__shm_slot(c->shm, c->peers[dst].shm)
			     : NULL;

	c->shm_next = slot != NULL ? slot : c->shm_buf;
	return c->shm_next;
}

static int shm_send_commit(hpucoll_comm *c, int dst,
			   const struct hpucoll__hdr *hdr)
{
	return shm_send(c, dst, hdr, c->shm_next);
}

/* The shared-memory send never sends in place: the payload is copied into
 * the slot, unless it was built there (send_buf). */
static int shm_send_to(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		       const void *data, int zc)
{
	(void)zc;
	return shm_send(c, dst, hdr, data);
}

static int shm_error(hpucoll_comm *c, int src, int rc,
		     const struct hpucoll__wait *w)
{
	if (rc == HPUCOLL_EPEER)
		return peer_gone(c, src);
	else if (rc == HPUCOLL_ETIMEDOUT)
		return hpucoll__timed_out(c, w, src);
	else
		hpucoll__set_error(c, "%s: receiving from rank %d over shared "
				      "memory failed: %s.",
				   c->what, src, hpucoll__shm_errmsg(c->shm));
	return rc;
}

/* Waits in slices, looking between them at ABORTs arriving over ZeroMQ,
 * the stall warning and the timeout. */
static int shm_recv_from(hpucoll_comm *c, const struct hpucoll__hdr *want,
			 const void **data)
{
	int src = (int)want->src, local = c->peers[src].shm;
	struct hpucoll__hdr h;
	struct hpucoll__wait w;
	int rc;

	rc = hpucoll__shm_recv(c->shm, local, &h, data, 0);
	if (rc == HPUCOLL_ETIMEDOUT) {
		hpucoll__wait_begin(c, &w);
		for (;;) {
			int64_t now = hpucoll__now_ms();
			long ms = hpucoll__wait_ms(c, &w, now,
						   HPUCOLL__SLICE_MS);

			rc = hpucoll__shm_recv(c->shm, local, &h, data,
					       (int)ms);
			if (rc != HPUCOLL_ETIMEDOUT)
				break;
			now = hpucoll__now_ms();
			if (w.deadline >= 0 && now >= w.deadline)
				break;
			rc = hpucoll__stall_check(c, &w, src, now);
			if (rc != HPUCOLL_OK)
				return rc;
			rc = hpucoll__zmq_poll_aborts(c, src);
			if (rc != HPUCOLL_OK)
				return rc;
		}
	}
	if (rc != HPUCOLL_OK)
		return shm_error(c, src, rc, &w);
	hpucoll__saw_data(c, src, h.seq);
	rc = hpucoll__check_hdr(c, want, &h);
	if (rc != HPUCOLL_OK)
		hpucoll__shm_release(c->shm, local);
	return rc;
}

static void shm_release(hpucoll_comm *c, int src)
{
	hpucoll__shm_release(c->shm, c->peers[src].shm);
}

const struct hpucoll__transport hpucoll__shm_transport = {
	.copies = 1,
	.send = shm_send_to,
	.send_buf = shm_send_buf,
	.send_commit = shm_send_commit,
	.recv = shm_recv_from,
	.release = shm_release,
};
