/* The progress engine and the public collective calls.
 *
 * Collectives run one at a time, in issue order. A blocking call that
 * finds nothing queued or running runs its collective inline, on the
 * caller's thread (no hand-off: the small-message latency is the
 * transport's). Everything else goes through a FIFO of requests that one
 * worker thread per communicator, started by the first asynchronous call,
 * runs; a blocking call behind queued requests queues too and sleeps until
 * the worker has run it. `busy` says that some thread runs a collective,
 * and with it owns the transport; comm->mu guards the queue and `busy`,
 * and its lock and unlock are the memory barriers ZeroMQ needs when a
 * socket changes threads. Only two things are waited for on comm->cv:
 * work, by an idle worker, and a request's completion, by its waiters;
 * it is signalled only when someone waits.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/comm_internal.h"
#include "common/thread.h"

static void *worker(void *arg)
{
	hpucoll_comm *c = arg;
	struct hpucoll_req *r;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		while (c->qhead == NULL && !c->stopping) {
			c->idle = 1;
			pthread_cond_wait(&c->cv, &c->mu);
			c->idle = 0;
		}
		r = c->qhead;
		if (r == NULL)
			break; /* stopping, and nothing left to run */
		c->qhead = r->next;
		if (c->qhead == NULL)
			c->qtail = NULL;
		c->busy = 1;
		pthread_mutex_unlock(&c->mu);
		r->rc = hpucoll__run(c, &r->args);
		pthread_mutex_lock(&c->mu);
		c->busy = 0;
		atomic_store_explicit(&r->done, 1, memory_order_release);
		if (c->waiters > 0)
			pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/* Appends r to the queue; called with mu held. */
static int enqueue(hpucoll_comm *c, struct hpucoll_req *r)
{
	if (!c->thread_started) {
		int e = hpu__thread_start(&c->thread, worker, c);
		if (e != 0) { /* EAGAIN: no memory for its stack, or a limit */
			hpucoll__set_error(c, "cannot start the progress thread: %s (its stack: "
					      "ulimit -v, ulimit -u)",
					   strerror(e));
			return HPUCOLL_ENOMEM;
		}
		c->thread_started = 1;
	}
	r->next = NULL;
	if (c->qtail != NULL)
		c->qtail->next = r;
	else
		c->qhead = r;
	c->qtail = r;
	if (c->idle)
		pthread_cond_broadcast(&c->cv);
	return HPUCOLL_OK;
}

/* Sleeps until r is done; called with mu held. */
static void await(hpucoll_comm *c, struct hpucoll_req *r)
{
	while (!atomic_load_explicit(&r->done, memory_order_acquire)) {
		c->waiters++;
		pthread_cond_wait(&c->cv, &c->mu);
		c->waiters--;
	}
}

/* A blocking collective: inline when the transport is free and nothing is
 * queued, else behind the queued requests. */
static int blocking(hpucoll_comm *c, const struct hpucoll__args *a)
{
	struct hpucoll_req r = {.comm = c, .args = *a};
	int rc;

	if (c == NULL)
		return HPUCOLL_EINVAL;
	rc = hpucoll__check_args(c, a);
	if (rc != HPUCOLL_OK)
		return rc;
	pthread_mutex_lock(&c->mu);
	if (!c->busy && c->qhead == NULL) {
		c->busy = 1;
		pthread_mutex_unlock(&c->mu);
		rc = hpucoll__run(c, a);
		pthread_mutex_lock(&c->mu);
		c->busy = 0; /* nobody waits for this: see the header */
		pthread_mutex_unlock(&c->mu);
		return rc;
	}
	rc = enqueue(c, &r);
	if (rc == HPUCOLL_OK) {
		await(c, &r);
		rc = r.rc;
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

static int start(hpucoll_comm *c, const struct hpucoll__args *a,
		 hpucoll_req **req)
{
	struct hpucoll_req *r;
	int rc;

	if (req == NULL) { /* said (why() gave the last error's sentence) */
		if (c)
			hpucoll__set_error(c, "%s: the request pointer is NULL.",
					   hpucoll__kind_name(a->kind));
		return HPUCOLL_EINVAL;
	}
	*req = NULL;
	if (c == NULL)
		return HPUCOLL_EINVAL;
	rc = hpucoll__check_args(c, a);
	if (rc != HPUCOLL_OK)
		return rc;
	r = calloc(1, sizeof(*r));
	if (r == NULL)
		return HPUCOLL_ENOMEM;
	r->comm = c;
	r->args = *a;
	r->args.async = 1;
	pthread_mutex_lock(&c->mu);
	rc = enqueue(c, r);
	pthread_mutex_unlock(&c->mu);
	if (rc != HPUCOLL_OK) {
		free(r);
		return rc;
	}
	*req = r;
	return HPUCOLL_OK;
}

void hpucoll__progress_stop(hpucoll_comm *c)
{
	pthread_mutex_lock(&c->mu);
	c->stopping = 1;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	if (c->thread_started)
		pthread_join(c->thread, NULL);
	c->thread_started = 0;
}

int hpucoll_wait(hpucoll_req **req)
{
	struct hpucoll_req *r;
	int rc;

	if (req == NULL || *req == NULL)
		return HPUCOLL_EINVAL;
	r = *req;
	/* Done requests never touch the communicator, which may be gone. */
	if (!atomic_load_explicit(&r->done, memory_order_acquire)) {
		pthread_mutex_lock(&r->comm->mu);
		await(r->comm, r);
		pthread_mutex_unlock(&r->comm->mu);
	}
	rc = r->rc;
	free(r);
	*req = NULL;
	return rc;
}

int hpucoll_test(hpucoll_req *req, int *done)
{
	if (req == NULL || done == NULL)
		return HPUCOLL_EINVAL;
	*done = atomic_load_explicit(&req->done, memory_order_acquire);
	return HPUCOLL_OK;
}

/* ---- The public calls ---- */

#define ARGS(k, s, r, n, t, o, rt)                                           \
	{                                                                    \
		.kind = (k), .sendbuf = (s), .recvbuf = (r), .count = (n),   \
		.dtype = (t), .op = (o), .root = (rt)                        \
	}

int hpucoll_all_reduce(hpucoll_comm *comm, const void *sendbuf,
		       void *recvbuf, size_t count, hpucoll_dtype dtype,
		       hpucoll_op op)
{
	struct hpucoll__args a = ARGS(HPUCOLL__ALL_REDUCE, sendbuf, recvbuf,
				      count, dtype, op, 0);

	return blocking(comm, &a);
}

int hpucoll_reduce_scatter(hpucoll_comm *comm, const void *sendbuf,
			   void *recvbuf, size_t recvcount,
			   hpucoll_dtype dtype, hpucoll_op op)
{
	struct hpucoll__args a = ARGS(HPUCOLL__REDUCE_SCATTER, sendbuf,
				      recvbuf, recvcount, dtype, op, 0);

	return blocking(comm, &a);
}

int hpucoll_all_gather(hpucoll_comm *comm, const void *sendbuf,
		       void *recvbuf, size_t sendcount, hpucoll_dtype dtype)
{
	struct hpucoll__args a = ARGS(HPUCOLL__ALL_GATHER, sendbuf, recvbuf,
				      sendcount, dtype, HPUCOLL_SUM, 0);

	return blocking(comm, &a);
}

int hpucoll_broadcast(hpucoll_comm *comm, const void *sendbuf, void *recvbuf,
		      size_t count, hpucoll_dtype dtype, int root)
{
	struct hpucoll__args a = ARGS(HPUCOLL__BROADCAST, sendbuf, recvbuf,
				      count, dtype, HPUCOLL_SUM, root);

	return blocking(comm, &a);
}

int hpucoll_reduce(hpucoll_comm *comm, const void *sendbuf, void *recvbuf,
		   size_t count, hpucoll_dtype dtype, hpucoll_op op, int root)
{
	struct hpucoll__args a = ARGS(HPUCOLL__REDUCE, sendbuf, recvbuf, count,
				      dtype, op, root);

	return blocking(comm, &a);
}

int hpucoll_barrier(hpucoll_comm *comm)
{
	struct hpucoll__args a = ARGS(HPUCOLL__BARRIER, NULL, NULL, 0,
				      HPUCOLL_F32, HPUCOLL_SUM, 0);

	return blocking(comm, &a);
}

int hpucoll_iall_reduce(hpucoll_comm *comm, const void *sendbuf,
			void *recvbuf, size_t count, hpucoll_dtype dtype,
			hpucoll_op op, hpucoll_req **req)
{
	struct hpucoll__args a = ARGS(HPUCOLL__ALL_REDUCE, sendbuf, recvbuf,
				      count, dtype, op, 0);

	return start(comm, &a, req);
}

int hpucoll_ireduce_scatter(hpucoll_comm *comm, const void *sendbuf,
			    void *recvbuf, size_t recvcount,
			    hpucoll_dtype dtype, hpucoll_op op,
			    hpucoll_req **req)
{
	struct hpucoll__args a = ARGS(HPUCOLL__REDUCE_SCATTER, sendbuf,
				      recvbuf, recvcount, dtype, op, 0);

	return start(comm, &a, req);
}

int hpucoll_iall_gather(hpucoll_comm *comm, const void *sendbuf,
			void *recvbuf, size_t sendcount, hpucoll_dtype dtype,
			hpucoll_req **req)
{
	struct hpucoll__args a = ARGS(HPUCOLL__ALL_GATHER, sendbuf, recvbuf,
				      sendcount, dtype, HPUCOLL_SUM, 0);

	return start(comm, &a, req);
}

int hpucoll_ibroadcast(hpucoll_comm *comm, const void *sendbuf,
		       void *recvbuf, size_t count, hpucoll_dtype dtype,
		       int root, hpucoll_req **req)
{
	struct hpucoll__args a = ARGS(HPUCOLL__BROADCAST, sendbuf, recvbuf,
				      count, dtype, HPUCOLL_SUM, root);

	return start(comm, &a, req);
}

int hpucoll_ireduce(hpucoll_comm *comm, const void *sendbuf, void *recvbuf,
		    size_t count, hpucoll_dtype dtype, hpucoll_op op, int root,
		    hpucoll_req **req)
{
	struct hpucoll__args a = ARGS(HPUCOLL__REDUCE, sendbuf, recvbuf, count,
				      dtype, op, root);

	return start(comm, &a, req);
}

int hpucoll_ibarrier(hpucoll_comm *comm, hpucoll_req **req)
{
	struct hpucoll__args a = ARGS(HPUCOLL__BARRIER, NULL, NULL, 0,
				      HPUCOLL_F32, HPUCOLL_SUM, 0);

	return start(comm, &a, req);
}
