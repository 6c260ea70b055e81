/* libhpucoll's asynchronous collectives in worlds of forked ranks, with
 * each transport forced in turn (shared memory, ZeroMQ TCP, ZeroMQ IPC),
 * on the worlds, inputs and checks of coll_matrix_lib.c (see
 * test_coll_matrix.c):
 * - overlap (2 ranks): an iall_reduce completes while the caller computes,
 *   and gives the blocking form's result bit for bit (above overlap());
 * - issue order (3 ranks): mixed asynchronous collectives complete in the
 *   order issued, and before a blocking one issued after them (above
 *   order_round()).
 * An optional argument runs only the tests whose name contains it
 * ("overlap", "order_tcp", ...). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/unit/coll_matrix_lib.h"

#define OVERLAP_N (16u * 1024 * 1024)
#define HOLD_CHUNKS 16 /* chunks rank 0 computes before rank 1 joins */

/* ---- overlap: an async all-reduce completes while the caller computes ---- */

/* Non-integer floats: the sum is not exact in general, so the blocking and
 * the asynchronous forms must agree bit for bit. */
static float ofval(int r, size_t i)
{
	return (float)(mx_mix(i, (uint32_t)r + 5) >> 8) * 0x1p-24f - 0.5f;
}

/* One chunk of the caller's own work; returns its result. */
static double work_chunk(const float *w, size_t n)
{
	double s = 0;

	for (size_t j = 0; j < n; j++)
		s += sqrt((double)w[j] * w[j] + 1.0);
	return s;
}

/* Two ranks. The blocking all_reduce of 16M floats gives the reference
 * (each sum one rounding, so it must equal the float of the exact sum).
 * Then the asynchronous form: rank 0 issues it and computes chunks of its
 * own work, calling hpucoll_test between chunks; rank 1 issues only after
 * rank 0 has done HOLD_CHUNKS chunks, so rank 0's request cannot complete
 * before that, and rank 0's iall_reduce must have returned at once (else
 * the two would wait on each other until rank 1 gives up). Both ranks go
 * on computing until hpucoll_test says done, then wait. Asserted: test saw
 * the request done, the result is identical (memcmp) to the blocking
 * form's, in place too, and the caller's computation stayed right. The
 * chunk counts are printed, never compared with a time. */
static int overlap(struct rk *k)
{
	const size_t n = OVERLAP_N, wn = 1 << 15;
	struct spec s = {.coll = C_ALL_REDUCE,
	                 .dt = HPUCOLL_F32,
	                 .op = HPUCOLL_SUM,
	                 .count = n};
	float *x = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
	float *ip = malloc(n * 4), *w = malloc(wn * 4);
	struct cmp m = {.k = k, .s = &s};
	hpucoll_req *req = NULL;
	double work_ref, got;
	int rc, done = 0, chunks = 0, ok_chunks = 1, idx = 0;
	int64_t deadline;

	if (!x || !a || !b || !ip || !w) {
		fprintf(stderr, "rank %d: out of memory\n", k->me);
		return -1;
	}
	mx_next_cfg(k, &idx);
	if (k->me == 0)
		snprintf(k->sh->name[k->cfg], NAME_MAX_,
		         "overlap: iall_reduce f32 sum count %zu vs blocking",
		         n);
	for (size_t i = 0; i < n; i++)
		x[i] = ofval(k->me, i);
	for (size_t j = 0; j < wn; j++)
		w[j] = (float)j * 0.001f;
	work_ref = work_chunk(w, wn);

	/* The blocking form; with 2 ranks each sum is one rounding, so it
	 * equals the float of the exact double sum. */
	rc = hpucoll_all_reduce(k->c, x, a, n, HPUCOLL_F32, HPUCOLL_SUM);
	if (rc != HPUCOLL_OK)
		return mx_fail_rc(k, &s, "all_reduce", rc);
	for (size_t i = 0; i < n; i++) {
		float want = (float)((double)ofval(0, i) + (double)ofval(1, i));
		double d = fabs((double)a[i] - (double)want);

		m.checked++;
		if (d > m.maxdiff || isnan(d))
			m.maxdiff = isnan(d) ? INFINITY : d;
		if (a[i] != want && !m.bad++)
			fprintf(stderr,
			        "%s ws=2 rank %d: all_reduce f32 sum "
			        "count %zu out-of-place: index %zu "
			        "expected %a got %a\n",
			        k->w->label, k->me, n, i, (double)want,
			        (double)a[i]);
	}

	/* The asynchronous form. Rank 1 issues it only after rank 0 has
	 * computed HOLD_CHUNKS chunks, so rank 0's request cannot complete
	 * before that: iall_reduce must return without waiting for peers. */
	if (k->me == 1) {
		deadline = ct_now_ms() + 30000;
		while (atomic_load(&k->sh->chunks) < HOLD_CHUNKS &&
		       ct_now_ms() < deadline)
			usleep(1000);
		if (atomic_load(&k->sh->chunks) < HOLD_CHUNKS) {
			fprintf(stderr,
			        "%s ws=2: rank 0 never came back from "
			        "hpucoll_iall_reduce while rank 1 had "
			        "not issued its own: it is not "
			        "asynchronous\n",
			        k->w->label);
			m.bad++;
		}
	}
	rc = hpucoll_iall_reduce(k->c, x, b, n, HPUCOLL_F32, HPUCOLL_SUM, &req);
	if (rc != HPUCOLL_OK)
		return mx_fail_rc(k, &s, "iall_reduce", rc);
	deadline = ct_now_ms() + 120000;
	while (!done && ct_now_ms() < deadline) {
		got = work_chunk(w, wn);
		ok_chunks &= got == work_ref;
		chunks++;
		if (k->me == 0)
			atomic_store(&k->sh->chunks, chunks);
		rc = hpucoll_test(req, &done);
		if (rc != HPUCOLL_OK)
			return mx_fail_rc(k, &s, "test", rc);
	}
	if (!done) {
		fprintf(stderr,
		        "%s ws=2 rank %d: hpucoll_test never saw the "
		        "iall_reduce done in 120 s\n",
		        k->w->label, k->me);
		m.bad++;
	}
	rc = hpucoll_wait(&req);
	if (rc != HPUCOLL_OK)
		return mx_fail_rc(k, &s, "wait", rc);
	if (req != NULL) {
		fprintf(stderr, "rank %d: hpucoll_wait left *req set\n", k->me);
		m.bad++;
	}
	if (k->me == 0 && chunks < HOLD_CHUNKS) {
		fprintf(stderr,
		        "%s ws=2 rank 0: the request was done after %d "
		        "chunks, before rank 1 had issued its part\n",
		        k->w->label, chunks);
		m.bad++;
	}
	if (!ok_chunks) {
		fprintf(stderr,
		        "rank %d: the caller's computation gave a "
		        "wrong result during the collective\n",
		        k->me);
		m.bad++;
	}
	if (memcmp(a, b, n * 4) != 0) {
		for (size_t i = 0; i < n; i++)
			if (memcmp(&a[i], &b[i], 4) != 0) {
				fprintf(stderr,
				        "%s ws=2 rank %d: iall_reduce "
				        "differs from all_reduce at "
				        "index %zu: %a vs %a\n",
				        k->w->label, k->me, i, (double)b[i],
				        (double)a[i]);
				break;
			}
		m.bad++;
	}
	m.checked += (long long)n;

	/* In place, asynchronous, tested from the start. */
	memcpy(ip, x, n * 4);
	rc = hpucoll_iall_reduce(k->c, ip, ip, n, HPUCOLL_F32, HPUCOLL_SUM,
	                         &req);
	if (rc != HPUCOLL_OK)
		return mx_fail_rc(k, &s, "iall_reduce in place", rc);
	done = 0;
	int chunks2 = 0;
	deadline = ct_now_ms() + 120000;
	while (!done && ct_now_ms() < deadline) {
		ok_chunks &= work_chunk(w, wn) == work_ref;
		chunks2++;
		if (hpucoll_test(req, &done) != HPUCOLL_OK)
			break;
	}
	rc = hpucoll_wait(&req);
	if (rc != HPUCOLL_OK)
		return mx_fail_rc(k, &s, "wait (in place)", rc);
	if (!done || memcmp(a, ip, n * 4) != 0) {
		fprintf(stderr, "%s ws=2 rank %d: in-place iall_reduce: %s\n",
		        k->w->label, k->me,
		        done ? "differs from all_reduce" : "never seen done");
		m.bad++;
	}
	m.checked += (long long)n;
	snprintf(k->sh->note[k->me], sizeof(k->sh->note[k->me]),
	         "rank %d: %d chunks of work before hpucoll_test saw the "
	         "iall_reduce done (%d in place); result identical to the "
	         "blocking form: %s",
	         k->me, chunks, chunks2,
	         memcmp(a, b, n * 4) || memcmp(a, ip, n * 4) ? "no" : "yes");
	mx_record(k, &m);
	free(x);
	free(a);
	free(b);
	free(ip);
	free(w);
	return 0;
}

/* ---- issue order: mixed async collectives complete in order ---- */

static const struct spec order_batch[] = {
    {C_ALL_REDUCE, HPUCOLL_F32, HPUCOLL_SUM, BIG_N, 0, 0},
    {C_REDUCE_SCATTER, HPUCOLL_I32, HPUCOLL_MAX, 7, 0, 0},
    {C_ALL_GATHER, HPUCOLL_U8, HPUCOLL_SUM, 4099, 1, 0},
    {C_BCAST, HPUCOLL_F64, HPUCOLL_SUM, 1, 0, 2},
    {C_REDUCE, HPUCOLL_BF16, HPUCOLL_MIN, 4099, 1, 1},
    {C_BARRIER, HPUCOLL_F32, HPUCOLL_SUM, 0, 0, 0},
    {C_ALL_REDUCE, HPUCOLL_I64, HPUCOLL_AVG, 7, 1, 0},
    {C_REDUCE_SCATTER, HPUCOLL_F16, HPUCOLL_AVG, 4099, 1, 0},
    {C_ALL_REDUCE, HPUCOLL_U8, HPUCOLL_MIN, 1, 0, 0},
};
#define NBATCH (sizeof(order_batch) / sizeof(order_batch[0]))

/* Issues the batch; with `blocking_after`, a blocking all_reduce follows
 * it and every request must be done when that returns. Otherwise polls
 * from the last request to the first until all are done: a request seen
 * done while an earlier one, polled after it, is not, completed out of
 * order. Then waits and checks every result. */
static int order_round(struct rk *k, int blocking_after, struct cmp *tot)
{
	struct run r[NBATCH];
	hpucoll_req *req[NBATCH] = {0};
	int done[NBATCH] = {0}, all = 0, rc;
	int64_t deadline = ct_now_ms() + 120000;
	struct cmp m;

	for (size_t i = 0; i < NBATCH; i++) {
		r[i].s = order_batch[i];
		if (mx_prep(k, &r[i]) != 0) {
			fprintf(stderr, "rank %d: out of memory\n", k->me);
			return -1;
		}
	}
	for (size_t i = 0; i < NBATCH; i++) {
		rc = mx_issue(k, &r[i], &req[i]);
		if (rc != HPUCOLL_OK)
			return mx_fail_rc(k, &r[i].s, "issue", rc);
	}
	if (blocking_after) {
		struct spec s = {
		    C_ALL_REDUCE, HPUCOLL_F32, HPUCOLL_MAX, 7, 0, 0};

		if (mx_run_one(k, &s) != 0)
			return -1;
		for (size_t i = 0; i < NBATCH; i++) {
			if (hpucoll_test(req[i], &done[i]) != HPUCOLL_OK ||
			    !done[i]) {
				fprintf(stderr,
				        "%s ws=%d rank %d: request %zu "
				        "(%s) not done after a blocking "
				        "collective issued after it\n",
				        k->w->label, k->ws, k->me, i,
				        mx_coll_names[r[i].s.coll]);
				tot->bad++;
			}
		}
	}
	while (!all && ct_now_ms() < deadline) {
		all = 1;
		for (size_t i = NBATCH; i-- > 0;) {
			if (!done[i] &&
			    hpucoll_test(req[i], &done[i]) != HPUCOLL_OK) {
				fprintf(stderr,
				        "rank %d: hpucoll_test failed\n",
				        k->me);
				tot->bad++;
				done[i] = 1;
			}
			all &= done[i];
			for (size_t j = i + 1; j < NBATCH && !done[i]; j++) {
				if (done[j] && !tot->bad++)
					fprintf(stderr,
					        "%s ws=%d rank %d: "
					        "request %zu (%s) done "
					        "before request %zu (%s)\n",
					        k->w->label, k->ws, k->me, j,
					        mx_coll_names[r[j].s.coll], i,
					        mx_coll_names[r[i].s.coll]);
				if (done[j])
					break;
			}
		}
		if (!all)
			usleep(200);
	}
	if (!all) {
		fprintf(stderr,
		        "%s ws=%d rank %d: requests not done after "
		        "120 s\n",
		        k->w->label, k->ws, k->me);
		tot->bad++;
	}
	for (size_t i = 0; i < NBATCH; i++) {
		rc = hpucoll_wait(&req[i]);
		if (rc != HPUCOLL_OK)
			return mx_fail_rc(k, &r[i].s, "wait", rc);
		mx_check(k, &r[i], &m);
		tot->checked += m.checked + 1;
		tot->bad += m.bad;
		if (m.maxdiff > tot->maxdiff)
			tot->maxdiff = m.maxdiff;
		mx_unprep(&r[i]);
	}
	return 0;
}

static int order(struct rk *k)
{
	struct spec s = {.coll = C_BARRIER};
	struct cmp m = {.k = k, .s = &s};
	int idx = 0;

	mx_next_cfg(k, &idx);
	if (k->me == 0)
		snprintf(k->sh->name[k->cfg], NAME_MAX_,
		         "order: %zu mixed async collectives, then again "
		         "followed by a blocking one",
		         NBATCH);
	if (order_round(k, 0, &m) != 0 || order_round(k, 1, &m) != 0)
		return -1;
	mx_record(k, &m);
	return 0;
}

/* ---- tests ---- */

int main(int argc, char **argv)
{
	for (int t = 0; t < MX_NTR; t++) {
		mx_add(mx_transports[t], 2, "overlap", overlap, BIG_DEADLINE_MS,
		       0, 0);
		mx_add(mx_transports[t], 3, "order", order, BIG_DEADLINE_MS, 0,
		       0);
	}
	return mx_run("coll_async", argc, argv);
}
