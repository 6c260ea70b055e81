/* output: the destinations whose writes failed, each said once. */
#include "agent/output.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/log.h"

#define MAX_SAID 64 /* distinct destinations said; more are counted only */

static struct {
	int std_err[3];        /* fd 1, 2: the errno of their first failure */
	char *said[MAX_SAID];  /* destinations already said */
	int n_said;
	int failed;
	int stdout_errno;      /* of the last write through the stdout stream */
} O;

static int said_before(const char *what)
{
	for (int i = 0; i < O.n_said; i++)
		if (!strcmp(O.said[i], what))
			return 1;
	if (O.n_said == MAX_SAID)
		return 1; /* beyond that: quiet, not unbounded */
	if ((O.said[O.n_said] = strdup(what)))
		O.n_said++;
	return 0;
}

void hpu__output_fail(const char *what, int err)
{
	O.failed = 1;
	if (err == EPIPE || said_before(what) || O.std_err[2])
		return; /* stderr itself failed: nowhere left to say it */
	fflush(stderr);
	if (err == EAGAIN && hpu__write_interrupted) { /* a reader that stopped reading */
		hpu__log(HPU_LOG_ERROR, "error: %s takes nothing after the interrupt: the rest of "
					"its output is dropped", what + (strncmp(what, "to ", 3) ? 0 : 3));
		if (hpu__log_write_errno())
			O.std_err[2] = hpu__log_write_errno();
		return;
	}
	hpu__log(HPU_LOG_ERROR,
		 "error: cannot write %s: %s; the rest of it is not written (exit status %d at the end)",
		 what, strerror(err), HPU_OUTPUT_EXIT);
	if (hpu__log_write_errno())
		O.std_err[2] = hpu__log_write_errno();
}

static void std_fail(int fd, int err)
{
	if (!O.std_err[fd])
		O.std_err[fd] = err ? err : EIO;
	hpu__output_fail(fd == 1 ? "to stdout" : "to stderr", O.std_err[fd]);
}

/* stdout closed at start: failed at its first write (nothing written,
 * nothing lost: a closed stderr or stdout of a quiet run exits 0) */
static int closed_out;

void hpu__output_std_closed(int fd)
{
	if (fd == 1)
		closed_out = 1;
}

/* A write to a stdout that was closed at start: said, and failed. */
static int closed_write(int fd)
{
	if (fd != 1 || !closed_out)
		return 0;
	std_fail(1, EBADF);
	return 1;
}

int hpu__output_std_ok(int fd)
{
	return (fd == 1 || fd == 2) && !O.std_err[fd];
}

int hpu__output_std(int fd, const void *p, size_t n)
{
	if (!hpu__output_std_ok(fd) || closed_write(fd))
		return -1;
	if (hpu__write_all(fd, p, n) == 0)
		return 0;
	std_fail(fd, errno);
	return -1;
}

int hpu__output_stream(FILE *f)
{
	int fd = f == stderr ? 2 : 1;
	if (O.std_err[fd])
		return -1;
	if (fflush(f) == 0 && !ferror(f))
		return 0;
	std_fail(fd, fd == 1 && O.stdout_errno ? O.stdout_errno : errno);
	clearerr(f);
	return -1;
}

int hpu__output_file(int fd, const char *path, const void *p, size_t n)
{
	if (hpu__write_all(fd, p, n) == 0)
		return 0;
	char what[1100];
	int err = errno ? errno : EIO;
	snprintf(what, sizeof what, "the log file %s", path);
	hpu__output_fail(what, err);
	return -1;
}

int hpu__output_file_close(int fd, const char *path)
{
	if (close(fd) == 0 || errno == EINTR)
		return 0;
	char what[1100];
	int err = errno;
	snprintf(what, sizeof what, "the log file %s", path);
	hpu__output_fail(what, err);
	return -1;
}

/* stdout's writes, as stdio makes them: the error they meet is kept, as
 * stdio keeps only that there was one. */
static ssize_t stdout_write(void *cookie, const char *buf, size_t n)
{
	(void)cookie;
	if (closed_out) {
		O.stdout_errno = EBADF;
		return -1;
	}
	if (hpu__write_all(1, buf, n) == 0)
		return (ssize_t)n;
	O.stdout_errno = errno ? errno : EIO;
	return -1;
}

void hpu__output_init(void)
{
	/* A terminal keeps the real stream: the progress bar asks it
	 * (isatty, its width), and a terminal is seldom full. */
	if (isatty(STDOUT_FILENO))
		return;
	FILE *f = fopencookie(NULL, "w", (cookie_io_functions_t){.write = stdout_write});
	if (!f)
		return; /* the plain stdout then, its errors reported as EIO */
	setvbuf(f, NULL, _IOLBF, 0);
	stdout = f;
}

int hpu__output_failed(void)
{
	return O.failed;
}

int hpu__output_finish(void)
{
	if (!O.std_err[1] && (fflush(stdout) != 0 || ferror(stdout)))
		std_fail(1, O.stdout_errno);
	/* stdout's close may report what the writes did not (NFS, a full
	 * disk reported late); nothing writes to it after this */
	if (fflush(stdout) == 0 && !O.std_err[1] && close(1) != 0 && errno != EBADF)
		std_fail(1, errno);
	if (!O.std_err[2] && (fflush(stderr) != 0 || ferror(stderr) || hpu__log_write_errno())) {
		O.std_err[2] = hpu__log_write_errno() ? hpu__log_write_errno() : errno ? errno : EIO;
		O.failed = 1;
	}
	for (int i = 0; i < O.n_said; i++)
		free(O.said[i]);
	O.n_said = 0;
	return O.failed;
}
