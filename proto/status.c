/* status: see status.h. One text line per record on the agent's pipe:
 *
 *   S1 step total epoch epochs loss samples_per_sec eta_s in_use max limit phase\n
 *
 * and, before a worker fails because of another rank, "B1 rank silent|died|failed\n".
 *
 * A line is far below PIPE_BUF, so it is written whole or not at all. */
#include "proto/status.h"
#include "common/env.h"
#include "common/num.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* -2: not looked up yet; -1: none. Atomic: the flusher thread sets -1
 * when the agent closed the pipe while the worker's thread reads it. */
static atomic_int status_fd = -2;
static double last_s = -1;

static int fd(void)
{
	int f = atomic_load(&status_fd);
	if (f == -2) { /* the first record, before the flusher starts */
		const char *v = hpu__env_str(HPU_ENV_HPU_STATUS_FD);
		int n;
		f = !hpu__parse_int(v, 0, (1 << 20) - 1, &n) && fcntl(n, F_GETFD) >= 0 ? n : -1;
		if (f >= 0) { /* a full pipe drops a record, never waits */
			fcntl(f, F_SETFL, fcntl(f, F_GETFL) | O_NONBLOCK);
			fcntl(f, F_SETFD, FD_CLOEXEC); /* not for what the model starts */
		}
		atomic_store(&status_fd, f);
	}
	return f;
}

/* Writes record r; the HPU_PHASE_DONE one waits for room. */
static void send_rec(int f, const hpu_status_rec *r)
{
	char line[320];
	int n = snprintf(line, sizeof line,
			 "S1 %ld %ld %d %d %.6g %.6g %.6g %llu %llu %llu %d\n", r->step, r->total,
			 r->epoch, r->epochs, (double)r->loss, r->samples_per_sec, r->eta_s,
			 (unsigned long long)r->mem_in_use, (unsigned long long)r->mem_max,
			 (unsigned long long)r->mem_limit, r->phase);
	if (n <= 0 || (size_t)n >= sizeof line)
		return;
	for (int tries = 0;; tries++) {
		if (write(f, line, (size_t)n) >= 0)
			return;
		if (errno == EPIPE)
			status_fd = -1; /* the agent closed it: stop */
		if (errno != EAGAIN || r->phase != HPU_PHASE_DONE || tries == 100)
			return;
		struct pollfd p = {.fd = f, .events = POLLOUT};
		poll(&p, 1, 100);
	}
}

/* v's decimal digits at p (at most 21 bytes); returns the end. */
static char *put_num(char *p, long long v)
{
	char tmp[24];
	int n = 0;
	unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
	do {
		tmp[n++] = (char)('0' + u % 10);
		u /= 10;
	} while (u && n < 22);
	if (v < 0)
		*p++ = '-';
	while (n)
		*p++ = tmp[--n];
	return p;
}

void hpu__status_report_fatal(const hpu_status_rec *r)
{
	int f = atomic_load(&status_fd);
	if (f < 0)
		return;
	char line[320], *p = line;
	const long long v[] = {r->step, r->total, r->epoch, r->epochs};
	const long long m[] = {(long long)r->mem_in_use, (long long)r->mem_max,
			       (long long)r->mem_limit, r->phase};
	memcpy(p, "S1", 2);
	p += 2;
	for (size_t i = 0; i < 4; i++) {
		*p++ = ' ';
		p = put_num(p, v[i]);
	}
	memcpy(p, " nan 0 -1", 9); /* loss, samples/s, ETA: unknown */
	p += 9;
	for (size_t i = 0; i < 4; i++) {
		*p++ = ' ';
		p = put_num(p, m[i]);
	}
	*p++ = '\n';
	if (write(f, line, (size_t)(p - line)) < 0)
		return; /* a full or closed pipe: the older record stands */
}

/* A record the rate limit held back goes out once its 200 ms are over,
 * from a thread of its own: a worker that then stops (frozen inside its
 * model) leaves its agent the step it stopped in, not one from up to
 * 200 ms of steps before. mu guards held, last_s and the writes. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static hpu_status_rec held;
static int held_set, flusher; /* flusher: 1 running, -1 could not start */

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *flush_held(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		while (!held_set)
			pthread_cond_wait(&cv, &mu);
		double due = last_s + 0.2, now = mono_s();
		if (now < due) {
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			long ns = ts.tv_nsec + (long)((due - now) * 1e9) + 1000000;
			ts.tv_sec += ns / 1000000000L;
			ts.tv_nsec = ns % 1000000000L;
			pthread_cond_timedwait(&cv, &mu, &ts);
			continue;
		}
		int f = status_fd;
		if (f >= 0)
			send_rec(f, &held);
		last_s = now;
		held_set = 0;
	}
	return NULL;
}

/* Starts the flusher (under mu); without it, held records are dropped as
 * before. */
static void start_flusher(void)
{
	pthread_condattr_t ca;
	pthread_attr_t at;
	pthread_t t;
	sigset_t all, old;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	sigfillset(&all); /* signals stay the worker's main thread's */
	pthread_sigmask(SIG_SETMASK, &all, &old);
	flusher = pthread_create(&t, &at, flush_held, NULL) == 0 ? 1 : -1;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&at);
}

void hpu__status_report(const hpu_status_rec *r, int force)
{
	int f = fd();
	if (f < 0)
		return;
	pthread_mutex_lock(&mu);
	double now = mono_s();
	if (!force && last_s >= 0 && now - last_s < 0.2) {
		if (!flusher)
			start_flusher();
		/* a record held already: the flusher waits for its due time,
		 * and sends whichever is held then (no wake-up every step) */
		int waiting = held_set;
		held = *r;
		held_set = flusher > 0;
		if (!waiting)
			pthread_cond_signal(&cv);
		pthread_mutex_unlock(&mu);
		return;
	}
	last_s = now;
	held_set = 0;
	send_rec(f, r);
	pthread_mutex_unlock(&mu);
}

void hpu__status_hello(void)
{
	int f = fd();
	if (f >= 0 && write(f, "H1\n", 3) < 0 && errno == EPIPE)
		status_fd = -1;
}

/* One keepalive: a write of 3 bytes, never torn by the other writers'
 * lines. Returns 0 once the pipe is gone. */
static int say_alive(void)
{
	int f = atomic_load(&status_fd);
	if (f < 0)
		return 0;
	if (write(f, "K1\n", 3) < 0 && errno == EPIPE)
		atomic_store(&status_fd, -1);
	return 1;
}

static void *keepalive(void *arg)
{
	(void)arg;
	do
		sleep(HPU_STATUS_KEEPALIVE_S);
	while (say_alive());
	return NULL;
}

void hpu__status_keepalive(void)
{
	static int started;
	if (started || fd() < 0)
		return;
	started = 1;
	/* the first at once: the agent watches only workers that keep alive
	 * (an older hpu-worker's silence is no sign), from this one on */
	say_alive();
	pthread_attr_t at;
	pthread_t t;
	sigset_t all, old;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	sigfillset(&all); /* signals stay the worker's main thread's */
	pthread_sigmask(SIG_SETMASK, &all, &old);
	if (pthread_create(&t, &at, keepalive, NULL) != 0)
		started = 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&at);
}

static const char *const blame_words[] = {"silent", "died", "failed"};

/* A line that must get there (the worker exits next): waits for room, up
 * to 2 s. */
static void write_must(int f, const char *line, size_t n)
{
	for (int tries = 0; tries < 20; tries++) {
		if (write(f, line, n) >= 0 || errno != EAGAIN)
			return;
		struct pollfd p = {.fd = f, .events = POLLOUT};
		poll(&p, 1, 100);
	}
}

void hpu__status_blame(int rank, hpu_blame how)
{
	char line[64];
	int f = fd(), n = snprintf(line, sizeof line, "B1 %d %s\n", rank, blame_words[how]);
	if (f < 0 || rank < 0)
		return;
	write_must(f, line, (size_t)n);
}

void hpu__status_error(const char *why)
{
	char line[HPU_STATUS_WHY_MAX + 8];
	int f = fd();
	if (f < 0 || !why || !*why)
		return;
	/* a longer one ends "..." (it was cut mid-word without a sign) */
	size_t len = strlen(why);
	size_t n = len > HPU_STATUS_WHY_MAX
			   ? (size_t)snprintf(line, sizeof line, "E1 %.*s...", HPU_STATUS_WHY_MAX - 3, why)
			   : (size_t)snprintf(line, sizeof line, "E1 %s", why);
	if (n > sizeof line - 2)
		n = sizeof line - 2;
	for (size_t i = 3; i < n; i++)
		if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
			line[i] = ' ';
	line[n++] = '\n';
	write_must(f, line, n);
}

/* ---- reading records (the agent) ---- */

/* The next space-separated token of [*p, end) into tmp (NUL-terminated),
 * *p moved past it; -1 if there is none or it does not fit. */
static int token(const char **p, const char *end, char *tmp, size_t cap)
{
	const char *s = *p;
	while (s < end && *s == ' ')
		s++;
	size_t n = 0;
	while (s + n < end && s[n] != ' ')
		n++;
	if (n == 0 || n >= cap)
		return -1;
	memcpy(tmp, s, n);
	tmp[n] = 0;
	*p = s + n;
	return 0;
}

static int parse_long(const char **p, const char *end, long lo, long hi, long *out)
{
	char tmp[32];
	if (token(p, end, tmp, sizeof tmp) < 0)
		return -1;
	return hpu__parse_long(tmp, lo, hi, out) ? -1 : 0;
}

static int parse_u64(const char **p, const char *end, uint64_t *out)
{
	char tmp[32];
	if (token(p, end, tmp, sizeof tmp) < 0)
		return -1;
	return hpu__parse_u64(tmp, 0, UINT64_MAX, out) ? -1 : 0;
}

static int parse_double(const char **p, const char *end, double *out)
{
	char tmp[48];
	if (token(p, end, tmp, sizeof tmp) < 0)
		return -1;
	/* "nan" and "inf" are a loss's right */
	return hpu__parse_real(tmp, out) ? -1 : 0;
}

int hpu__status_parse(const char *line, size_t len, hpu_status_rec *st)
{
	const char *p = line, *end = line + len;
	hpu_status_rec r;
	long epoch, epochs, phase;
	if (len < 3 || memcmp(line, "S1 ", 3) != 0)
		return -1;
	p += 3;
	if (parse_long(&p, end, 0, LONG_MAX, &r.step) || parse_long(&p, end, 0, LONG_MAX, &r.total) ||
	    parse_long(&p, end, 0, INT_MAX, &epoch) || parse_long(&p, end, 0, INT_MAX, &epochs) ||
	    parse_double(&p, end, &r.loss) || parse_double(&p, end, &r.samples_per_sec) ||
	    parse_double(&p, end, &r.eta_s) || parse_u64(&p, end, &r.mem_in_use) ||
	    parse_u64(&p, end, &r.mem_max) || parse_u64(&p, end, &r.mem_limit) ||
	    parse_long(&p, end, 0, HPU_PHASE_LAST, &phase))
		return -1;
	while (p < end && *p == ' ')
		p++;
	if (p != end)
		return -1;
	if (!isfinite(r.samples_per_sec) || r.samples_per_sec < 0)
		r.samples_per_sec = 0; /* none */
	if (!isfinite(r.eta_s))
		r.eta_s = -1; /* unknown */
	r.epoch = (int)epoch;
	r.epochs = (int)epochs;
	r.phase = (int)phase;
	*st = r;
	return 0;
}

int hpu__status_parse_blame(const char *line, size_t len, int *rank, hpu_blame *how)
{
	const char *p = line, *end = line + len;
	char word[8];
	long r;
	int k = 0;
	if (len < 3 || memcmp(line, "B1 ", 3) != 0)
		return -1;
	p += 3;
	if (parse_long(&p, end, 0, INT_MAX, &r) || token(&p, end, word, sizeof word) < 0)
		return -1;
	while (k < 3 && strcmp(word, blame_words[k]))
		k++;
	while (p < end && *p == ' ')
		p++;
	if (k == 3 || p != end)
		return -1;
	*rank = (int)r;
	*how = (hpu_blame)k;
	return 0;
}

int hpu__status_parse_error(const char *line, size_t len, char *out, size_t outlen)
{
	if (len < 4 || memcmp(line, "E1 ", 3) != 0 || !outlen)
		return -1;
	snprintf(out, outlen, "%.*s", (int)(len - 3), line + 3);
	return 0;
}

/* ---- the record on the wire (hpud, hpulaunch --status) ---- */

void hpu__status_to_proto(Hpu__RankStatus *rs, int rank, const hpu_status_rec *st, double age_s)
{
	hpu__rank_status__init(rs);
	rs->rank = (uint32_t)rank;
	if (!st)
		return;
	rs->reported = 1;
	rs->step = (uint64_t)st->step;
	rs->total = (uint64_t)st->total;
	rs->epoch = (uint32_t)st->epoch;
	rs->epochs = (uint32_t)st->epochs;
	rs->loss = st->loss;
	rs->samples_per_sec = st->samples_per_sec;
	rs->mem_in_use = st->mem_in_use;
	rs->mem_max = st->mem_max;
	rs->mem_limit = st->mem_limit;
	rs->phase = (uint32_t)st->phase;
	rs->age_s = age_s;
}

void hpu__status_from_proto(const Hpu__RankStatus *rs, double eta_s, hpu_status_rec *st)
{
	*st = (hpu_status_rec){
		.step = rs->step > LONG_MAX ? LONG_MAX : (long)rs->step,
		.total = rs->total > LONG_MAX ? LONG_MAX : (long)rs->total,
		.epoch = rs->epoch > INT_MAX ? INT_MAX : (int)rs->epoch,
		.epochs = rs->epochs > INT_MAX ? INT_MAX : (int)rs->epochs,
		.loss = rs->loss,
		.samples_per_sec = isfinite(rs->samples_per_sec) ? rs->samples_per_sec : 0,
		.eta_s = isfinite(eta_s) ? eta_s : -1,
		.mem_in_use = rs->mem_in_use,
		.mem_max = rs->mem_max,
		.mem_limit = rs->mem_limit,
		.phase = rs->phase > HPU_PHASE_LAST ? 0 : (int)rs->phase,
	};
}
