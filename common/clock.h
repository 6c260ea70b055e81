#ifndef HPU_COMMON_CLOCK_H
#define HPU_COMMON_CLOCK_H

#include <time.h>

/* Seconds on the monotonic clock, for durations, deadlines, timeouts and
 * rate limits. The wall clock (time(), gettimeofday(), and libev's
 * ev_now() and ev_time(), which read it) steps when NTP or `date -s` sets
 * it or a VM resumes: a heartbeat timed with it took a one-hour step for
 * an hour of silence. libev's timers themselves run on the monotonic
 * clock, so durations measured with this agree with them. */
static inline double hpu__mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
