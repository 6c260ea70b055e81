/* coll_testlib: forked ranks, endpoint exchange and dtype elements for
 * the collectives tests. See coll_testlib.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/unit/coll_testlib.h"

/* ---- time ---- */

int64_t ct_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double ct_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- ranks as processes ---- */

void *ct_shared_new(size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	assert_true(p != MAP_FAILED);
	memset(p, 0, size);
	return p;
}

void ct_shared_free(void *p, size_t size)
{
	munmap(p, size);
}

/* cmocka turns crashes into longjmps back into its test runner; a crashed
 * rank must die instead. */
static void child_signals(void)
{
	static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		signal(sigs[i], SIG_DFL);
}

pid_t ct_fork(ct_rank_fn fn, int rank, void *arg)
{
	pid_t pid;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int rc;

		child_signals();
		rc = fn(rank, arg);
		fflush(stdout);
		_exit(rc);
	}
	return pid;
}

/* Whether a rank that ended with `status` failed; says why if so. */
static int ended_badly(int rank, int status, int kill_ok)
{
	if (WIFSIGNALED(status)) {
		if (kill_ok && WTERMSIG(status) == SIGKILL)
			return 0;
		fprintf(stderr, "rank %d died of signal %d\n", rank,
			WTERMSIG(status));
		return 1;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "rank %d exited with status %d\n", rank,
			WEXITSTATUS(status));
		return 1;
	}
	return 0;
}

int ct_reap(pid_t *pids, int n, int deadline_ms, int kill_ok)
{
	int64_t deadline = ct_now_ms() + deadline_ms;
	int left = 0, bad = 0, status;

	for (int i = 0; i < n; i++)
		left += pids[i] > 0;
	while (left > 0 && ct_now_ms() < deadline) {
		for (int i = 0; i < n; i++) {
			if (pids[i] <= 0 ||
			    waitpid(pids[i], &status, WNOHANG) != pids[i])
				continue;
			bad += ended_badly(i, status, kill_ok);
			pids[i] = 0;
			left--;
		}
		if (left > 0)
			usleep(2000);
	}
	for (int i = 0; i < n; i++) {
		if (pids[i] > 0) {
			fprintf(stderr,
				"rank %d still running after %d s; killing "
				"it\n",
				i, deadline_ms / 1000);
			kill(pids[i], SIGKILL);
			waitpid(pids[i], &status, 0);
			pids[i] = 0;
			bad++;
		}
	}
	return bad;
}

int ct_run_ranks(int n, ct_rank_fn fn, void *arg, int deadline_ms,
		 int kill_ok)
{
	pid_t pids[CT_MAX_WS];

	assert_true(n <= CT_MAX_WS);
	for (int r = 0; r < n; r++)
		pids[r] = ct_fork(fn, r, arg);
	return ct_reap(pids, n, deadline_ms, kill_ok);
}

/* ---- endpoints ---- */

void ct_bind_ep(char *buf, size_t len, int tcp, const char *prefix,
		int rank)
{
	if (tcp)
		snprintf(buf, len, "tcp://127.0.0.1:*");
	else
		snprintf(buf, len, "ipc:///tmp/hpucoll-%s%d", prefix, rank);
}

int ct_eps_exchange(struct ct_eps *x, int rank, int ws, const char *mine,
		    const char **eps, int timeout_ms)
{
	int64_t deadline = ct_now_ms() + timeout_ms;

	snprintf(x->ep[rank], sizeof(x->ep[rank]), "%s", mine);
	atomic_fetch_add(&x->ready, 1);
	while (atomic_load(&x->ready) < ws) {
		if (ct_now_ms() > deadline) {
			fprintf(stderr, "rank %d: the others never showed up\n",
				rank);
			return -1;
		}
		usleep(1000);
	}
	for (int i = 0; i < ws; i++)
		eps[i] = x->ep[i];
	return 0;
}

int ct_shm_segments(const char *job)
{
	char prefix[128];
	struct dirent *e;
	DIR *d = opendir("/dev/shm");
	int n = 0;

	if (d == NULL)
		return 0;
	snprintf(prefix, sizeof(prefix), "hpucoll-%s-", job);
	while ((e = readdir(d)) != NULL)
		n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	closedir(d);
	return n;
}

/* ---- elements of every dtype ---- */

const char *const ct_dtype_names[HPUCOLL_NUM_DTYPES] = {
	"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
const char *const ct_op_names[HPUCOLL_NUM_OPS] = {"sum", "avg", "max",
						  "min"};

static double pow2(int k)
{
	uint64_t u = (uint64_t)(k + 1023) << 52;
	double d;

	memcpy(&d, &u, sizeof(d));
	return d;
}

double ct_small_float(uint32_t b, int mbits, int ebits)
{
	int bias = (1 << (ebits - 1)) - 1;
	uint32_t man = b & ((1u << mbits) - 1);
	int exp = (int)((b >> mbits) & ((1u << ebits) - 1));
	double v;

	if (exp == (1 << ebits) - 1)
		v = man ? 0.0 / 0.0 : 1.0 / 0.0;
	else if (exp == 0)
		v = man * pow2(1 - bias - mbits);
	else
		v = ((1u << mbits) + man) * pow2(exp - bias - mbits);
	return b >> (mbits + ebits) ? -v : v;
}

uint32_t ct_round_small_float(double x, int mbits, int ebits)
{
	int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias;
	int emax = (1 << ebits) - 2 - bias, e, shift;
	uint32_t sign = 0, inf = ((1u << ebits) - 1) << mbits;
	uint64_t u, sig, q, rem, half;

	memcpy(&u, &x, sizeof(u));
	if (u >> 63)
		sign = 1u << (mbits + ebits);
	if ((u & ~(1ull << 63)) == 0)
		return sign;
	e = (int)((u >> 52) & 0x7ff) - 1023;
	sig = (u & ((1ull << 52) - 1)) | 1ull << 52;
	shift = 52 - mbits + (e < emin ? emin - e : 0);
	if (shift >= 60)
		return sign;
	q = sig >> shift;
	rem = sig & ((1ull << shift) - 1);
	half = 1ull << (shift - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	if (e < emin)
		return sign | (uint32_t)q; /* may carry into the exponent */
	if (q == 1ull << (mbits + 1)) {
		q >>= 1;
		e++;
	}
	if (e > emax)
		return sign | inf;
	return sign | (uint32_t)(e + bias) << mbits |
	       (uint32_t)(q - (1ull << mbits));
}

/* The fixed-size memcpy calls below compile to plain loads and stores:
 * the matrix test reads and writes every element through them. */

/* bf16 is the top half of an f32. */
static double bf16_value(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* v rounded to nearest-even in bf16: through the f32 bits when v is an
 * exact f32, else through the general rounding. */
static uint16_t bf16_round(int64_t v)
{
	float f = (float)v;
	uint32_t u;

	if (v < -(1 << 24) || v > 1 << 24)
		return (uint16_t)ct_round_small_float((double)v, 7, 8);
	memcpy(&u, &f, 4);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

double ct_get(hpucoll_dtype t, const void *p, size_t i)
{
	const unsigned char *b = p;
	uint16_t h;
	float f;
	double d;

	switch (t) {
	case HPUCOLL_F32:
		memcpy(&f, b + 4 * i, 4);
		return f;
	case HPUCOLL_F64:
		memcpy(&d, b + 8 * i, 8);
		return d;
	case HPUCOLL_F16:
		memcpy(&h, b + 2 * i, 2);
		return ct_small_float(h, 10, 5);
	case HPUCOLL_BF16:
		memcpy(&h, b + 2 * i, 2);
		return bf16_value(h);
	default:
		return (double)ct_get_int(t, p, i);
	}
}

int64_t ct_get_int(hpucoll_dtype t, const void *p, size_t i)
{
	const unsigned char *b = p;
	int32_t i32;
	int64_t i64;

	switch (t) {
	case HPUCOLL_I32:
		memcpy(&i32, b + 4 * i, 4);
		return i32;
	case HPUCOLL_I64:
		memcpy(&i64, b + 8 * i, 8);
		return i64;
	default:
		return b[i];
	}
}

void ct_put(hpucoll_dtype t, void *p, size_t i, int64_t v)
{
	unsigned char *b = p;
	uint16_t h;
	int32_t i32;
	float f;
	double d;

	switch (t) {
	case HPUCOLL_F32:
		f = (float)v;
		memcpy(b + 4 * i, &f, 4);
		break;
	case HPUCOLL_F64:
		d = (double)v;
		memcpy(b + 8 * i, &d, 8);
		break;
	case HPUCOLL_F16:
		h = (uint16_t)ct_round_small_float((double)v, 10, 5);
		memcpy(b + 2 * i, &h, 2);
		break;
	case HPUCOLL_BF16:
		h = bf16_round(v);
		memcpy(b + 2 * i, &h, 2);
		break;
	case HPUCOLL_I32:
		i32 = (int32_t)v;
		memcpy(b + 4 * i, &i32, 4);
		break;
	case HPUCOLL_I64:
		memcpy(b + 8 * i, &v, 8);
		break;
	default:
		b[i] = (uint8_t)v;
		break;
	}
}
