/* coll_testlib: what the collectives tests (test_coll, test_coll_matrix,
 * test_coll_async, test_shm) share. Ranks run as forked processes that
 * the parent waits for with a deadline; they exchange their resolved
 * endpoints through a MAP_SHARED page; elements of every dtype are read and written as
 * numbers, f16 and bf16 through an exact reference encoder and decoder.
 *
 * It uses the types of hpu/coll.h but calls nothing in libhpucoll, so
 * that test_shm, which links only collectives/shm.c, can use it too. */
#ifndef HPU_COLL_TESTLIB_H
#define HPU_COLL_TESTLIB_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "hpu/coll.h"

#define CT_MAX_WS 8   /* ranks in a world, at most */
#define CT_EP_MAX 256 /* an endpoint string, NUL included */

/* ---- time ---- */

/* The monotonic clock in whole milliseconds. */
int64_t ct_now_ms(void);

/* The monotonic clock in seconds, to the nanosecond (for printed
 * timings). */
double ct_now_s(void);

/* ---- ranks as processes ---- */

/* What a forked rank runs; it exits with the value returned. */
typedef int (*ct_rank_fn)(int rank, void *arg);

/* A zeroed MAP_SHARED anonymous mapping of `size` bytes, shared with the
 * processes forked after it; asserts that it was made. */
void *ct_shared_new(size_t size);

/* Unmaps what ct_shared_new returned. */
void ct_shared_free(void *p, size_t size);

/* Flushes stdio and forks a process that restores the default action of
 * the crash signals (cmocka's handlers would longjmp back into the
 * parent's test runner), runs fn(rank, arg), flushes stdout and exits
 * with what fn returned. Returns its pid; asserts that the fork worked. */
pid_t ct_fork(ct_rank_fn fn, int rank, void *arg);

/* Waits for the processes pids[0..n) for at most deadline_ms, then kills
 * (SIGKILL) and reaps those still running, setting each pid reaped to 0.
 * Returns how many failed: exited non-zero, died of a signal (SIGKILL
 * excepted when kill_ok: the fault tests kill a rank on purpose), or
 * were still running. Failures are described on stderr. */
int ct_reap(pid_t *pids, int n, int deadline_ms, int kill_ok);

/* Forks ranks 0..n-1 (n <= CT_MAX_WS) running fn(rank, arg) and reaps
 * them as ct_reap does; returns how many failed. */
int ct_run_ranks(int n, ct_rank_fn fn, void *arg, int deadline_ms,
		 int kill_ok);

/* ---- endpoints ---- */

/* What rank binds: "tcp://127.0.0.1:*" when tcp (the port is resolved at
 * bind), else "ipc:///tmp/hpucoll-<prefix><rank>". */
void ct_bind_ep(char *buf, size_t len, int tcp, const char *prefix,
		int rank);

/* The resolved endpoints of a world's ranks, in a MAP_SHARED page. */
struct ct_eps {
	atomic_int ready; /* ranks that published theirs */
	char ep[CT_MAX_WS][CT_EP_MAX];
};

/* Publishes `mine` as rank's endpoint, waits at most timeout_ms until all
 * ws ranks have, and points eps[i] at rank i's. Returns 0, or -1 (said on
 * stderr) when some rank never published. */
int ct_eps_exchange(struct ct_eps *x, int rank, int ws, const char *mine,
		    const char **eps, int timeout_ms);

/* How many shared-memory segments of job `job` ("hpucoll-<job>-...") are
 * in /dev/shm. */
int ct_shm_segments(const char *job);

/* ---- elements of every dtype ---- */

extern const char *const ct_dtype_names[HPUCOLL_NUM_DTYPES];
extern const char *const ct_op_names[HPUCOLL_NUM_OPS];

/* Whether t is f32, f64, f16 or bf16. */
static inline int ct_is_float(hpucoll_dtype t)
{
	return t <= HPUCOLL_BF16;
}

/* The value of `bits` in a binary float format with `mbits` mantissa and
 * `ebits` exponent bits (f16: 10, 5; bf16: 7, 8), infinities and NaN
 * included. */
double ct_small_float(uint32_t bits, int mbits, int ebits);

/* The finite double x rounded to nearest-even in that format (overflow
 * gives infinity, underflow a subnormal or zero of x's sign). */
uint32_t ct_round_small_float(double x, int mbits, int ebits);

/* Element i of the array p of dtype t, as a double. */
double ct_get(hpucoll_dtype t, const void *p, size_t i);

/* Element i of the array p of integer dtype t (i32, i64, u8), exactly. */
int64_t ct_get_int(hpucoll_dtype t, const void *p, size_t i);

/* Stores the integer v as element i of the array p of dtype t (f16 and
 * bf16 rounded to nearest-even; integer types converted as C does). */
void ct_put(hpucoll_dtype t, void *p, size_t i, int64_t v);

#endif
