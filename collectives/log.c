/* The library's messages: to the caller's hook (hpucoll_set_log), or to
 * stderr as one write without one. */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "collectives/comm_internal.h"

/* The hook and its argument: set before the first communicator exists
 * (coll.h), read by any thread. */
static struct {
	_Atomic(hpucoll_log_fn) fn;
	_Atomic(void *) user;
} H;

void hpucoll_set_log(hpucoll_log_fn fn, void *user)
{
	atomic_store(&H.user, user);
	atomic_store(&H.fn, fn);
}

/* Writes the line and its newline to stderr in one write. */
static void to_stderr(char *buf, size_t n, size_t cap)
{
	const char *p = buf;
	if (n + 1 < cap)
		buf[n++] = '\n';
	while (n > 0) {
		ssize_t w = write(STDERR_FILENO, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		p += w;
		n -= (size_t)w;
	}
}

void hpucoll__log(hpucoll_log_level lvl, const char *fmt, ...)
{
	char buf[4096];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof buf - 1)
		n = (int)sizeof buf - 2;
	hpucoll_log_fn fn = atomic_load(&H.fn);
	if (fn)
		fn(atomic_load(&H.user), lvl, buf);
	else
		to_stderr(buf, (size_t)n, sizeof buf);
}
