/* status: see status.h. One text line per record on the agent's pipe:
 *
 *   S1 step total epoch epochs loss samples_per_sec eta_s in_use max limit phase\n
 *
 * A line is far below PIPE_BUF, so it is written whole or not at all. */
#include "status.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int status_fd = -2; /* -2: not looked up yet; -1: none */
static double last_s = -1;

static int fd(void)
{
	if (status_fd == -2) {
		const char *v = getenv("HPU_STATUS_FD");
		char *end;
		long n = v && *v ? strtol(v, &end, 10) : -1;
		status_fd = n >= 0 && n < 1 << 20 && !*end && fcntl((int)n, F_GETFD) >= 0 ? (int)n : -1;
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
