/* The transports behind one dispatch: each pair of ranks talks over shared
 * memory (transport_shm.c) when both are on one node and the transport
 * allows it, else over ZeroMQ (transport_zmq.c). Each is a table of
 * functions (struct hpucoll__transport) that a peer points at; the
 * algorithms see only hpucoll__send / send_buf / send_commit / recv /
 * release / fence, and this file knows no transport's internals.
 * ZeroMQ also connects the pairs that shared memory carries: the
 * messages that may arrive unasked (aborts, stall probes) take it.
 *
 * Traffic counters (comm->stats): every payload between two ranks passes
 * through hpucoll__send, hpucoll__send_commit and hpucoll__recv, which
 * count it once the transport has taken it (queued to ZeroMQ, in place or
 * copied, or written into a shared-memory slot) or handed it out. Headers
 * and ABORT sentences are not payload and are not counted; ZeroMQ's
 * heartbeats never pass through here.
 */
#include <inttypes.h>
#include <stdlib.h>

#include "collectives/comm_internal.h"
#include "collectives/shm.h"

/* Shared memory carries the pairs of one node when the topology says
 * where ranks are and the transport is AUTO or SHM. */
static int shm_on(const hpucoll_comm *c)
{
	return c->node_ids != NULL &&
	       (c->transport == HPUCOLL_TRANSPORT_AUTO ||
		c->transport == HPUCOLL_TRANSPORT_SHM);
}

size_t hpucoll__link_max(const hpucoll_comm *c, int a, int b)
{
	if (a != b && shm_on(c) && c->node_ids[a] == c->node_ids[b])
		return HPUCOLL__SHM_MAX_PAYLOAD < HPUCOLL__SEG_BYTES
			       ? HPUCOLL__SHM_MAX_PAYLOAD
			       : HPUCOLL__SEG_BYTES;
	return HPUCOLL__SEG_BYTES;
}

int hpucoll__transport_open(hpucoll_comm *c)
{
	int rc;

	for (int i = 0; i < c->size; i++)
		c->peers[i].tp = &hpucoll__zmq_transport;
	rc = hpucoll__zmq_open(c);
	if (rc != HPUCOLL_OK)
		return rc;
	return shm_on(c) ? hpucoll__shm_link_open(c) : HPUCOLL_OK;
}

void hpucoll__transport_close(hpucoll_comm *c)
{
	hpucoll__zmq_close(c);
	for (int i = 0; c->peers != NULL && i < c->size; i++)
		free(c->peers[i].endpoint);
	free(c->peers);
	c->peers = NULL;
	hpucoll__shm_link_close(c);
}

/* Counts a payload that the transport took for rank dst. */
static void count_sent(hpucoll_comm *c, int dst, uint64_t len)
{
	hpucoll__count(&c->stats.sent, len);
	if (c->peers[dst].shm >= 0)
		hpucoll__count(&c->stats.shm_sent, len);
}

int hpucoll__send(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		  const void *data, int zc)
{
	int rc = c->peers[dst].tp->send(c, dst, hdr, data, zc);

	if (rc == HPUCOLL_OK)
		count_sent(c, dst, hdr->len);
	return rc;
}

void *hpucoll__send_buf(hpucoll_comm *c, int dst, size_t len)
{
	return c->peers[dst].tp->send_buf(c, dst, len);
}

int hpucoll__send_copies(const hpucoll_comm *c, int dst)
{
	return c->peers[dst].tp->copies;
}

int hpucoll__send_commit(hpucoll_comm *c, int dst,
			 const struct hpucoll__hdr *hdr)
{
	int rc = c->peers[dst].tp->send_commit(c, dst, hdr);

	if (rc == HPUCOLL_OK)
		count_sent(c, dst, hdr->len);
	return rc;
}

int hpucoll__recv(hpucoll_comm *c, const struct hpucoll__hdr *want,
		  const void **data)
{
	int rc = c->peers[want->src].tp->recv(c, want, data);

	if (rc == HPUCOLL_OK)
		hpucoll__count(&c->stats.received, want->len);
	return rc;
}

void hpucoll__release(hpucoll_comm *c, int src)
{
	c->peers[src].tp->release(c, src);
}

int hpucoll__fence(hpucoll_comm *c)
{
	hpucoll__stall_flush(c, "its wait is over");
	return hpucoll__zmq_fence(c);
}

void hpucoll__fail_transport(hpucoll_comm *c, int rc)
{
	hpucoll__stall_flush(c, "it failed");
	hpucoll__zmq_fail(c, rc);
}
