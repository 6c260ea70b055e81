/* strategy_dcoll: the strategies' collectives on device buffers (see
 * strategy_impl.h). libhpucoll stays standalone: it sees host memory
 * only. Where the device's host_can_read is 1 that is the device's
 * memory itself; otherwise the strategy stages: d2h into a pinned host
 * buffer, the blocking collective on it, h2d back -- only what the
 * device does not hold already: nothing at world size 1, and not an
 * all-gather's own piece (worker/strategy/copies.h counts the rest). */
#include <string.h>

#include "worker/device/device.h"
#include "worker/strategy/strategy_impl.h"

/* Bytes staged at a time by an all-reduce (a whole chunk of elements). */
#define STAGE_CHUNK ((size_t)1 << 20)

static void *stage(hpu_strat *s, size_t bytes)
{
	if (bytes <= s->stg.coll_bytes)
		return s->stg.coll;
	hpu__dev_host_free(s->stg.coll);
	s->stg.coll = hpu__dev_host_alloc(bytes);
	s->stg.coll_bytes = s->stg.coll ? bytes : 0;
	return s->stg.coll;
}

void hpu__dc_free(hpu_strat *s)
{
	hpu__dev_host_free(s->stg.coll);
	s->stg.coll = NULL;
	s->stg.coll_bytes = 0;
}

/* A collective of one rank, or a rank's own piece of an all-gather:
 * send's n bytes into recv where they are not there already. */
static int one_rank(void *recv, const void *send, size_t n)
{
	if (recv != send)
		hpu__dev_copy(recv, send, n);
	return HPUCOLL_OK;
}

int hpu__dc_wait(hpucoll_req **req)
{
	return *req ? hpucoll_wait(req) : HPUCOLL_OK;
}

int hpu__dc_iall_reduce(hpu_strat *s, const void *send, void *recv, size_t count,
			hpucoll_dtype dt, hpucoll_op op, hpucoll_req **req)
{
	if (hpu__dev_host_can_read())
		return hpucoll_iall_reduce(s->comm, send, recv, count, dt, op, req);
	*req = NULL;
	size_t esz = hpucoll_dtype_size(dt), per = STAGE_CHUNK / esz;
	if (s->world == 1) /* the identity: nothing to stage */
		return one_rank(recv, send, count * esz);
	char *h = stage(s, (count < per ? count : per) * esz);
	if (!h && count)
		return HPUCOLL_ENOMEM;
	for (size_t i = 0; i < count; i += per) {
		size_t n = count - i < per ? count - i : per;
		hpu__dev_copy(h, (const char *)send + i * esz, n * esz);
		int rc = hpucoll_all_reduce(s->comm, h, h, n, dt, op);
		if (rc)
			return rc;
		hpu__dev_copy((char *)recv + i * esz, h, n * esz);
	}
	return HPUCOLL_OK;
}

int hpu__dc_ireduce_scatter(hpu_strat *s, const void *send, void *recv, size_t recvcount,
			    hpucoll_dtype dt, hpucoll_op op, hpucoll_req **req)
{
	if (hpu__dev_host_can_read())
		return hpucoll_ireduce_scatter(s->comm, send, recv, recvcount, dt, op, req);
	*req = NULL;
	size_t esz = hpucoll_dtype_size(dt), all = (size_t)s->world * recvcount * esz;
	if (s->world == 1)
		return one_rank(recv, send, all);
	char *h = stage(s, all);
	if (!h && all)
		return HPUCOLL_ENOMEM;
	hpu__dev_copy(h, send, all);
	char *mine = h + (size_t)s->rank * recvcount * esz;
	int rc = hpucoll_reduce_scatter(s->comm, h, mine, recvcount, dt, op);
	if (rc == HPUCOLL_OK)
		hpu__dev_copy(recv, mine, recvcount * esz);
	return rc;
}

int hpu__dc_iall_gather(hpu_strat *s, const void *send, void *recv, size_t sendcount,
			hpucoll_dtype dt, hpucoll_req **req)
{
	if (hpu__dev_host_can_read())
		return hpucoll_iall_gather(s->comm, send, recv, sendcount, dt, req);
	*req = NULL;
	size_t esz = hpucoll_dtype_size(dt), n = sendcount * esz, at = (size_t)s->rank * n,
	       all = (size_t)s->world * n;
	/* the own piece goes into place directly (in place: it is there) */
	int rc = one_rank((char *)recv + at, send, n);
	if (s->world == 1)
		return rc;
	char *h = stage(s, all);
	if (!h && all)
		return HPUCOLL_ENOMEM;
	hpu__dev_copy(h + at, send, n);
	rc = hpucoll_all_gather(s->comm, h + at, h, sendcount, dt);
	if (rc == HPUCOLL_OK) { /* only the other ranks' pieces come back */
		hpu__dev_copy(recv, h, at);
		hpu__dev_copy((char *)recv + at + n, h + at + n, all - at - n);
	}
	return rc;
}
