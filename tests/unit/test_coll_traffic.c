/* The traffic counters of libhpucoll (hpucoll_comm_stats) against the
 * bytes each algorithm sends, on every transport, with forked ranks (see
 * coll_world.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hpu/coll.h"
#include "tests/unit/coll_testlib.h"
#include "tests/unit/coll_world.h"

/* ---- traffic counters ---- */

/* f32 elements: divisible by 2, 3 and 4, so every ring chunk is the same
 * size and the figures below are exact. The big count is cut into several
 * shared-memory slices and sent in place by ZeroMQ; the small one is
 * copied. */
#define TRAFFIC_BIG 600000u
#define TRAFFIC_SMALL 48u

/* Payload bytes one rank should send and receive, and the part of what it
 * sends that goes through shared memory. */
struct traffic {
	uint64_t sent, received, shm;
};

static int node_of(const struct world *w, int rank)
{
	return w->nodes != NULL ? w->nodes[rank] : 0;
}

/* Whether rank a sends to rank b through shared memory. */
static int shm_link(const struct world *w, int a, int b)
{
	return w->shm && a != b && node_of(w, a) == node_of(w, b);
}

/* What the ring sends to the next rank: `bytes`, both ways. */
static struct traffic ring_traffic(const struct world *w, int me,
				   uint64_t bytes)
{
	struct traffic t = {bytes, bytes, 0};

	if (shm_link(w, me, (me + 1) % w->ws))
		t.shm = bytes;
	return t;
}

/* all_reduce of b bytes. The ring sends 2 (n - 1) of its n chunks. The
 * hierarchical form over two nodes of l ranks: 2 (l - 1) / l of the bytes
 * in the node's ring over shared memory, and this rank's chunk (b / l) to
 * the other node and back, over ZeroMQ. */
static struct traffic all_reduce_traffic(const struct world *w, int me,
					 uint64_t b)
{
	uint64_t n = (uint64_t)w->ws, l = n / 2;
	struct traffic t;

	if (w->algo != NULL && strcmp(w->algo, "hier") == 0) {
		t.shm = 2 * (l - 1) * b / l;
		t.sent = t.received = t.shm + b / l;
		return t;
	}
	return ring_traffic(w, me, 2 * (n - 1) * b / n);
}

/* broadcast of b bytes from root: each other rank receives b once. The
 * chain (above 1 MiB) sends from each rank to the next but the last; the
 * binomial tree from v (its distance from root) to v + m for each power
 * of two m below v's lowest set bit (every m for the root). */
static struct traffic bcast_traffic(const struct world *w, int me, int root,
				    uint64_t b)
{
	int n = w->ws, v = (me - root + n) % n;
	struct traffic t = {0, me == root ? 0 : b, 0};

	if (b > 1024 * 1024) {
		if (v + 1 < n) {
			t.sent = b;
			t.shm = shm_link(w, me, (me + 1) % n) ? b : 0;
		}
		return t;
	}
	for (int m = 1; m < n && (v == 0 || m < (v & -v)); m <<= 1) {
		int kid = (v + m + root) % n;

		if (v + m >= n)
			break;
		t.sent += b;
		t.shm += shm_link(w, me, kid) ? b : 0;
	}
	return t;
}

static void add_traffic(struct traffic *a, const struct traffic *b)
{
	a->sent += b->sent;
	a->received += b->received;
	a->shm += b->shm;
}

/* Checks what the counters moved since *last against `want` and `ncoll`
 * collectives; *last becomes the counters now. */
static int check_delta(hpucoll_comm *c, const struct world *w,
		       const char *what, hpucoll_stats *last,
		       const struct traffic *want, uint64_t ncoll)
{
	hpucoll_stats now;
	uint64_t sent, recv, shm, coll;

	hpucoll_comm_stats(c, &now);
	sent = now.bytes_sent - last->bytes_sent;
	recv = now.bytes_received - last->bytes_received;
	shm = now.shm_bytes_sent - last->shm_bytes_sent;
	coll = now.collectives - last->collectives;
	*last = now;
	if (sent == want->sent && recv == want->received &&
	    shm == want->shm && coll == ncoll)
		return 0;
	fprintf(stderr,
		"rank %d of %d (%s%s): %s: sent %" PRIu64 " received %" PRIu64
		" shm %" PRIu64 " collectives %" PRIu64 ", expected %" PRIu64
		" %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
		hpucoll_comm_rank(c), w->ws, w->tcp ? "tcp" : "ipc",
		w->shm ? "+shm" : "", what, sent, recv, shm, coll, want->sent,
		want->received, want->shm, ncoll);
	return 1;
}

/* The blocking collectives at one count, each checked on its own. */
static int traffic_blocking(hpucoll_comm *c, const struct world *w,
			    hpucoll_stats *last, float *send, float *recv,
			    size_t count)
{
	int n = w->ws, me = hpucoll_comm_rank(c);
	uint64_t b = count * sizeof(float), share = (n - 1) * b / n;
	int root = count == TRAFFIC_BIG ? 1 % n : n - 1;
	struct traffic t;
	int rc;

	rc = hpucoll_all_reduce(c, send, recv, count, HPUCOLL_F32,
				HPUCOLL_SUM);
	if (rc != HPUCOLL_OK)
		return cw_fail_rc(c, "all_reduce", rc);
	if (recv[0] != (float)n || recv[count - 1] != (float)n) {
		fprintf(stderr, "rank %d: all_reduce gave %g\n", me,
			(double)recv[0]);
		return 1;
	}
	t = all_reduce_traffic(w, me, b);
	if (check_delta(c, w, "all_reduce", last, &t, 1))
		return 1;
	rc = hpucoll_reduce_scatter(c, send, recv, count / n, HPUCOLL_F32,
				    HPUCOLL_SUM);
	if (rc != HPUCOLL_OK)
		return cw_fail_rc(c, "reduce_scatter", rc);
	t = ring_traffic(w, me, share);
	if (check_delta(c, w, "reduce_scatter", last, &t, 1))
		return 1;
	rc = hpucoll_all_gather(c, send, recv, count / n, HPUCOLL_F32);
	if (rc != HPUCOLL_OK)
		return cw_fail_rc(c, "all_gather", rc);
	if (check_delta(c, w, "all_gather", last, &t, 1))
		return 1;
	rc = hpucoll_broadcast(c, send, recv, count, HPUCOLL_F32, root);
	if (rc != HPUCOLL_OK)
		return cw_fail_rc(c, "broadcast", rc);
	t = bcast_traffic(w, me, root, b);
	return check_delta(c, w, count == TRAFFIC_BIG ? "broadcast (chain)"
						      : "broadcast (tree)",
			   last, &t, 1);
}

/* An iall_reduce and an ireduce_scatter: the counters, read while the
 * progress thread moves the data, only grow and stay within the total. */
static int traffic_async(hpucoll_comm *c, const struct world *w,
			 hpucoll_stats *last, float *send, float *recv)
{
	int n = w->ws, me = hpucoll_comm_rank(c), done = 0;
	uint64_t b = TRAFFIC_BIG * sizeof(float);
	struct traffic t = all_reduce_traffic(w, me, b);
	struct traffic rs = ring_traffic(w, me, (n - 1) * b / n);
	hpucoll_req *req[2] = {NULL, NULL};
	hpucoll_stats prev = *last, now;
	int rc;

	add_traffic(&t, &rs);
	rc = hpucoll_iall_reduce(c, send, recv, TRAFFIC_BIG, HPUCOLL_F32,
				 HPUCOLL_SUM, &req[0]);
	if (rc == HPUCOLL_OK)
		rc = hpucoll_ireduce_scatter(c, send, recv + TRAFFIC_BIG,
					     TRAFFIC_BIG / n, HPUCOLL_F32,
					     HPUCOLL_SUM, &req[1]);
	if (rc != HPUCOLL_OK)
		return cw_fail_rc(c, "issue", rc);
	while (!done) {
		hpucoll_test(req[1], &done);
		hpucoll_comm_stats(c, &now);
		if (now.bytes_sent < prev.bytes_sent ||
		    now.bytes_received < prev.bytes_received ||
		    now.shm_bytes_sent < prev.shm_bytes_sent ||
		    now.collectives < prev.collectives ||
		    now.bytes_sent - last->bytes_sent > t.sent ||
		    now.bytes_received - last->bytes_received > t.received) {
			fprintf(stderr, "rank %d: counters went from %" PRIu64
					" to %" PRIu64 " bytes sent\n",
				me, prev.bytes_sent, now.bytes_sent);
			return 1;
		}
		prev = now;
	}
	/* Done: all its traffic is counted, before hpucoll_wait. */
	if (check_delta(c, w, "iall_reduce + ireduce_scatter", last, &t, 2))
		return 1;
	rc = hpucoll_wait(&req[0]);
	if (rc == HPUCOLL_OK)
		rc = hpucoll_wait(&req[1]);
	return rc == HPUCOLL_OK ? 0 : cw_fail_rc(c, "wait", rc);
}

/* Every rank's totals: what all ranks sent is what all received. */
static int traffic_totals(hpucoll_comm *c, struct shared *sh,
			  const struct world *w, hpucoll_stats *last)
{
	struct traffic none = {0, 0, 0};
	uint64_t sent = 0, recv = 0;
	int rc;

	sh->stats[hpucoll_comm_rank(c)] = *last;
	rc = hpucoll_barrier(c); /* no payload */
	if (rc != HPUCOLL_OK)
		return cw_fail_rc(c, "barrier", rc);
	if (check_delta(c, w, "barrier", last, &none, 1))
		return 1;
	for (int r = 0; r < w->ws; r++) {
		sent += sh->stats[r].bytes_sent;
		recv += sh->stats[r].bytes_received;
	}
	if (sent != recv || (w->ws > 1 && sent == 0)) {
		fprintf(stderr, "rank %d of %d: the ranks sent %" PRIu64
				" bytes and received %" PRIu64 "\n",
			hpucoll_comm_rank(c), w->ws, sent, recv);
		return 1;
	}
	return 0;
}

static int check_traffic(hpucoll_comm *c, struct shared *sh,
			 const struct world *w)
{
	float *send = malloc(TRAFFIC_BIG * sizeof(float));
	float *recv = malloc(2 * TRAFFIC_BIG * sizeof(float));
	hpucoll_stats last, zero = {0};
	int bad = 1;

	if (send == NULL || recv == NULL)
		goto out;
	for (size_t i = 0; i < TRAFFIC_BIG; i++)
		send[i] = 1.0f;
	hpucoll_comm_stats(c, &last);
	if (memcmp(&last, &zero, sizeof(last)) != 0) {
		fprintf(stderr, "rank %d: counters not 0 after connect\n",
			hpucoll_comm_rank(c));
		goto out;
	}
	bad = traffic_blocking(c, w, &last, send, recv, TRAFFIC_SMALL) ||
	      traffic_blocking(c, w, &last, send, recv, TRAFFIC_BIG) ||
	      traffic_async(c, w, &last, send, recv) ||
	      traffic_totals(c, sh, w, &last);
out:
	free(send);
	free(recv);
	return bad;
}

/* The counters against each algorithm's traffic: ring all_reduce
 * (forced), reduce_scatter, all_gather, broadcast by tree and by chain,
 * over shared memory, TCP and IPC, and the hierarchical all_reduce over
 * shared memory inside two nodes and ZeroMQ between them. */
static void test_traffic(void **state)
{
	struct world worlds[] = {
		{.ws = 3, .shm = 1, .algo = "ring"},
		{.ws = 4, .tcp = 1, .algo = "ring"},
		{.ws = 3, .algo = "ring"},
		{.ws = 1, .tcp = 1, .algo = "ring"},
		{.ws = 4, .shm = 1, .nodes = cw_two_nodes, .algo = "hier"},
	};

	(void)state;
	for (size_t i = 0; i < sizeof(worlds) / sizeof(worlds[0]); i++)
		cw_run_world(&worlds[i], check_traffic);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_traffic),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
