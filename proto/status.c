/* status: see status.h. One text line per record on the agent's pipe:
 *
 *   S1 step total epoch epochs loss samples_per_sec eta_s in_use max limit phase\n
 *
 * A line is far below PIPE_BUF, so it is written whole or not at all. */
#include "status.h"
#include "env.h"
#include "num.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int status_fd = -2; /* -2: not looked up yet; -1: none */
static double last_s = -1;

static int fd(void)
{
	if (status_fd == -2) {
		const char *v = hpu_env_str(HPU_ENV_HPU_STATUS_FD);
		int n;
		status_fd = !hpu_parse_int(v, 0, (1 << 20) - 1, &n) && fcntl(n, F_GETFD) >= 0 ? n : -1;
		if (status_fd >= 0) { /* a full pipe drops a record, never waits */
			fcntl(status_fd, F_SETFL, fcntl(status_fd, F_GETFL) | O_NONBLOCK);
			fcntl(status_fd, F_SETFD, FD_CLOEXEC); /* not for what the model starts */
		}
	}
	return status_fd;
}

void hpu_status_report(const hpu_status_rec *r, int force)
{
	int f = fd();
	if (f < 0)
		return;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	double now = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
	if (!force && last_s >= 0 && now - last_s < 0.2)
		return;
	last_s = now;
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

void hpu_status_hello(void)
{
	int f = fd();
	if (f >= 0 && write(f, "H1\n", 3) < 0 && errno == EPIPE)
		status_fd = -1;
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
	return hpu_parse_long(tmp, lo, hi, out) ? -1 : 0;
}

static int parse_u64(const char **p, const char *end, uint64_t *out)
{
	char tmp[32];
	if (token(p, end, tmp, sizeof tmp) < 0)
		return -1;
	return hpu_parse_u64(tmp, 0, UINT64_MAX, out) ? -1 : 0;
}

static int parse_double(const char **p, const char *end, double *out)
{
	char tmp[48];
	if (token(p, end, tmp, sizeof tmp) < 0)
		return -1;
	/* "nan" and "inf" are a loss's right */
	return hpu_parse_real(tmp, out) ? -1 : 0;
}

int hpu_status_parse(const char *line, size_t len, hpu_status_rec *st)
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
	    parse_long(&p, end, 0, 2, &phase))
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

/* ---- the record on the wire (hpud, hpulaunch --status) ---- */

void hpu_status_to_proto(Hpu__RankStatus *rs, int rank, const hpu_status_rec *st, double age_s)
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

void hpu_status_from_proto(const Hpu__RankStatus *rs, double eta_s, hpu_status_rec *st)
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
		.phase = rs->phase > 2 ? 0 : (int)rs->phase,
	};
}
