/* strategy_dcoll: the strategies' collectives on device buffers (see
 * strategy_impl.h). libhpucoll stays standalone: it sees host memory
 * only. Where the device's host_can_read is 1 that is the device's
 * memory itself; otherwise the strategy stages: d2h into a pinned host
 * buffer, the blocking collective on it, h2d back -- only what the
 * device does not hold already: nothing at world size 1, and not an
 * all-gather's own piece (worker/strategy/copies.h counts the rest).
 *
 * The gradients' all-reduce of ddp and fast_ddp skips the host where the
 * device has collectives of its own (cuda: CUDA IPC between the ranks of
 * one node, or NCCL with --collectives nccl): hpu__dc_open makes the
 * group, and the all-reduces of fp32 and bf16 sums run in it, device
 * memory to device memory (CUDA IPC: in rank order; NCCL: its own order).
 * libhpucoll carries only the group's small exchanges (its all-gather). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/device/device.h"
#include "worker/strategy/strategy_impl.h"

/* The device group's staging: at most this much per chunk. */
#define GROUP_CHUNK ((size_t)32 << 20)

/* Ranks whose join bytes fit on the stack. */
#define HPU_STRAT_MAX_GROUP 256

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

/* ---- the device's group ---- */

/* The device's exchange: libhpucoll's all-gather of bytes. */
static int xchg(void *arg, const void *mine, void *all, size_t bytes)
{
	hpu_strat *s = arg;
	s->dc.rc = hpucoll_all_gather(s->comm, mine, all, bytes, HPUCOLL_U8);
	return s->dc.rc == HPUCOLL_OK ? 0 : -1;
}

/* The dtypes the group sums. */
static int group_dtype(hpucoll_dtype dt, hpu__dev_dtype *out)
{
	*out = dt == HPUCOLL_BF16 ? HPU__DEV_BF16 : HPU__DEV_F32;
	return dt == HPUCOLL_F32 || dt == HPUCOLL_BF16;
}

/* Why the gradients' all-reduce cannot run in a group on this run, the
 * same on every rank (the options), or NULL. */
static const char *no_group_job(const hpu_strat *s)
{
	const hpu_plan_entry *ge = &s->plan.e[HPU_PLAN_GRADS];
	if (ge->coll != HPU_PLAN_ALL_REDUCE && ge->coll != HPU_PLAN_ALL_REDUCE_FLAT)
		return "the strategy all-reduces no gradients";
	if (s->world == 1)
		return "one rank: nothing to reduce";
	return NULL;
}

/* Why this rank's device cannot join a group, or NULL. (Ranks may differ:
 * --device auto resolves on each node.) */
static const char *no_group_here(const hpu_strat *s, hpucoll_dtype dt)
{
	hpu__dev_dtype d;
	if (hpu__dev_host_can_read())
		return "libhpucoll reads the device's memory in place";
	if (!hpu__dev()->coll)
		return "the device has no collectives of its own";
	if (s->plan.e[HPU_PLAN_GRADS].where != HPU_PLAN_DEVICE)
		return "the gradients are not in device memory";
	if (!group_dtype(dt, &d))
		return "fp16 gradients are summed by libhpucoll only";
	return NULL;
}

/* Every rank says whether its device can join (one byte each through
 * libhpucoll), so that all open the group or none does: 1 when all can,
 * 0 with the first refusing rank's reason in why, -1 where the exchange
 * failed (s->dc.rc). */
static int all_can_join(hpu_strat *s, const char *here)
{
	unsigned char mine = here == NULL, all[HPU_STRAT_MAX_GROUP];
	unsigned char *v = s->world <= HPU_STRAT_MAX_GROUP ? all : calloc((size_t)s->world, 1);
	if (!v)
		return 0; /* cannot happen at the sizes a node holds; staged then */
	int rc = xchg(s, &mine, v, 1) < 0 ? -1 : 1;
	for (int r = 0; rc == 1 && r < s->world; r++)
		if (!v[r]) {
			if (here)
				snprintf(s->dc.why, sizeof s->dc.why, "%s", here);
			else
				snprintf(s->dc.why, sizeof s->dc.why,
					 "rank %d's device cannot join the device's all-reduce", r);
			rc = 0;
		}
	if (v != all)
		free(v);
	return rc;
}

/* --collectives nccl where NCCL carries nothing: rank 0 says why once. */
static void nccl_unused(const hpu_strat *s, const char *why)
{
	if (s->o->collectives == HPU_COLL_NCCL && s->rank == 0)
		hpu__log(HPU_LOG_WARNING, "--collectives nccl: NCCL carries nothing in this run: %s",
			 why);
}

int hpu__dc_open(hpu_strat *s)
{
	hpucoll_dtype dt = s->plan.grad_comm16 ? HPUCOLL_BF16 : hpu__strat_cdt(s, HPU_PLAN_GRADS);
	const char *no = no_group_job(s);
	if (no) {
		snprintf(s->dc.why, sizeof s->dc.why, "%s", no);
		nccl_unused(s, no);
		return 0;
	}
	s->dc.rc = HPUCOLL_OK;
	int can = all_can_join(s, no_group_here(s, dt));
	if (can < 0)
		return hpu__strat_coll_fail(s, "agreeing on the gradients' all-reduce path",
					    s->dc.rc);
	if (!can) {
		nccl_unused(s, s->dc.why);
		return 0;
	}
	size_t most = 0, esz = hpucoll_dtype_size(dt);
	for (int k = 0; k < s->nunits; k++)
		most = s->u[k].len > most ? s->u[k].len : most;
	size_t bytes = most * esz < GROUP_CHUNK ? most * esz : GROUP_CHUNK;
	s->dc.rc = HPUCOLL_OK;
	int rc = hpu__dev_group_open(&s->dc.group, s->rank, s->world, bytes, xchg, s, s->dc.why,
				     sizeof s->dc.why);
	if (rc < 0 && s->dc.rc != HPUCOLL_OK)
		return hpu__strat_coll_fail(s, "setting up the gradients' all-reduce on the device",
					    s->dc.rc);
	if (rc == -2)
		return hpu__strat_fail(s, "%s", s->dc.why);
	if (rc < 0 && s->rank == 0)
		hpu__log(HPU_LOG_WARNING,
			 "the gradients' all-reduce is staged through host memory: %s cannot "
			 "share device memory between the workers (%s)",
			 hpu__dev_name(), s->dc.why);
	return 0;
}

int hpu__dc_direct(const hpu_strat *s)
{
	return s->dc.group != NULL;
}

void hpu__dc_free(hpu_strat *s)
{
	hpu__dev_group_close(&s->dc.group);
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

/* 1 where libhpucoll may work on device memory in place now: the host
 * may read it, or it is host memory open outside a recording (--device
 * cpu --graphs: an eager step's collectives, and a replay's host nodes,
 * which run while the step is launched, not while it is recorded). */
static int in_place(void)
{
	return hpu__dev_host_can_read() || (hpu__dev_caps_get()->host_mem && !hpu__dev_capturing());
}

/* The staged collectives, blocking: the eager path's, and a recorded
 * step's host nodes' at each launch. Where the host may read device
 * memory (in_place), libhpucoll on it in place. */
static int all_reduce_now(hpu_strat *s, const void *send, void *recv, size_t count,
			  hpucoll_dtype dt, hpucoll_op op)
{
	if (in_place())
		return hpucoll_all_reduce(s->comm, send, recv, count, dt, op);
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

static int reduce_scatter_now(hpu_strat *s, const void *send, void *recv, size_t recvcount,
			      hpucoll_dtype dt, hpucoll_op op)
{
	if (in_place())
		return hpucoll_reduce_scatter(s->comm, send, recv, recvcount, dt, op);
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

static int all_gather_now(hpu_strat *s, const void *send, void *recv, size_t sendcount,
			  hpucoll_dtype dt)
{
	if (in_place())
		return hpucoll_all_gather(s->comm, send, recv, sendcount, dt);
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

/* ---- recording a step (--graphs) ----
 *
 * A collective between ranks through libhpucoll runs on the host. On the
 * CPU's list (cpu-strict) it is recorded as a host node that runs it,
 * blocking, at each launch in its place among the step's device calls:
 * every rank records the same calls in the same order (the same code on
 * the same plan) and the ranks agree on recording and replaying each
 * step (train.c), so the replays meet in the same order as the eager
 * steps do. Its buffers are device memory the graph holds; the staging
 * buffer is taken at the launch (stage). A device that records itself
 * (CUDA's stream capture) cannot hold a host call that waits on the
 * peers: there the recording is refused (the step then runs eagerly) and
 * the call is skipped, on every rank alike. */

typedef enum coll_kind { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER } coll_kind;

typedef struct coll_node {
	hpu_strat *s;
	coll_kind kind;
	const void *send;
	void *recv;
	size_t count;
	hpucoll_dtype dt;
	hpucoll_op op;
} coll_node;

static const char *const coll_what[] = {"an all-reduce", "a reduce-scatter", "an all-gather"};
static const char *const coll_node_name[] = {"hpucoll_all_reduce", "hpucoll_reduce_scatter",
					     "hpucoll_all_gather"};

/* A host node's work at a launch: the collective, blocking; a failure
 * (a dead peer) is one sentence naming it and, through libhpucoll, the
 * peer, as the eager path's hpu__strat_coll_fail says it. */
static int coll_replay(const void *arg, char *err, size_t errlen)
{
	const coll_node *a = arg;
	hpu_strat *s = a->s;
	int rc = a->kind == ALL_REDUCE ? all_reduce_now(s, a->send, a->recv, a->count, a->dt, a->op)
		 : a->kind == REDUCE_SCATTER
		     ? reduce_scatter_now(s, a->send, a->recv, a->count, a->dt, a->op)
		     : all_gather_now(s, a->send, a->recv, a->count, a->dt);
	if (rc == HPUCOLL_OK)
		return 0;
	snprintf(err, errlen, "%s between the %d workers (a recording's, replayed) failed: %s",
		 coll_what[a->kind], s->world, hpucoll_comm_why(s->comm, rc));
	return -1;
}

/* 1 where this call is a recording's (more than one rank, this thread
 * recording): recorded as a host node where the device's list holds one,
 * else the recording refused; either way nothing runs now. */
static int recorded(hpu_strat *s, coll_kind kind, const void *send, void *recv, size_t count,
		    hpucoll_dtype dt, hpucoll_op op)
{
	if (s->world == 1 || !hpu__dev_capturing())
		return 0;
	coll_node a = {s, kind, send, recv, count, dt, op};
	if (hpu__dev_rec_host(coll_node_name[kind], coll_replay, &a, sizeof a) < 0)
		hpu__dev_capture_refuse("%s between the %d workers runs on the host (libhpucoll, "
					"staged through host memory)",
					coll_what[kind], s->world);
	return 1;
}

int hpu__dc_wait(hpucoll_req **req)
{
	return *req ? hpucoll_wait(req) : HPUCOLL_OK;
}

int hpu__dc_iall_reduce(hpu_strat *s, const void *send, void *recv, size_t count,
			hpucoll_dtype dt, hpucoll_op op, hpucoll_req **req)
{
	hpu__dev_dtype gd;
	*req = NULL;
	if (s->dc.group && op == HPUCOLL_SUM && group_dtype(dt, &gd)) {
		if (hpu__dev_group_all_reduce(s->dc.group, send, recv, count, gd) == 0)
			return HPUCOLL_OK;
		return s->dc.rc != HPUCOLL_OK ? s->dc.rc : HPUCOLL_ETRANSPORT;
	}
	if (recorded(s, ALL_REDUCE, send, recv, count, dt, op))
		return HPUCOLL_OK;
	if (hpu__dev_host_can_read())
		return hpucoll_iall_reduce(s->comm, send, recv, count, dt, op, req);
	return all_reduce_now(s, send, recv, count, dt, op);
}

int hpu__dc_ireduce_scatter(hpu_strat *s, const void *send, void *recv, size_t recvcount,
			    hpucoll_dtype dt, hpucoll_op op, hpucoll_req **req)
{
	*req = NULL;
	if (recorded(s, REDUCE_SCATTER, send, recv, recvcount, dt, op))
		return HPUCOLL_OK;
	if (hpu__dev_host_can_read())
		return hpucoll_ireduce_scatter(s->comm, send, recv, recvcount, dt, op, req);
	return reduce_scatter_now(s, send, recv, recvcount, dt, op);
}

int hpu__dc_iall_gather(hpu_strat *s, const void *send, void *recv, size_t sendcount,
			hpucoll_dtype dt, hpucoll_req **req)
{
	*req = NULL;
	if (recorded(s, ALL_GATHER, send, recv, sendcount, dt, HPUCOLL_SUM))
		return HPUCOLL_OK;
	if (hpu__dev_host_can_read())
		return hpucoll_iall_gather(s->comm, send, recv, sendcount, dt, req);
	return all_gather_now(s, send, recv, sendcount, dt);
}
