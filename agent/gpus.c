/* gpus: see gpus.h. */
#include "agent/gpus.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define COUNT_TIMEOUT_MS 60000 /* loading CUDA takes seconds at worst */

/* The child: stdout to the pipe, stderr to /dev/null (the answer is on
 * stdout), then the worker. */
static void count_child(const char *worker, int out)
{
	int null = open("/dev/null", O_WRONLY);
	if (dup2(out, STDOUT_FILENO) < 0 || (null >= 0 && dup2(null, STDERR_FILENO) < 0))
		_exit(127);
	execl(worker, worker, "--count-gpus", (char *)NULL);
	_exit(127);
}

/* Reads what fd gives into buf (NUL-ended) until EOF or the time limit;
 * 0, or -1 at the limit. */
static int read_answer(int fd, char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = '\0';
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int r = poll(&p, 1, COUNT_TIMEOUT_MS);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		char tmp[256];
		ssize_t n = read(fd, tmp, sizeof tmp);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return 0;
		size_t k = (size_t)n < len - 1 - used ? (size_t)n : len - 1 - used;
		memcpy(buf + used, tmp, k);
		buf[used += k] = '\0';
	}
}

/* The worker's answer: "N" (exit 0) or a sentence (exit 1). */
static void parse_answer(const char *worker, const char *out, int status, int *ngpus,
			 char *why, size_t whylen)
{
	char *end;
	long n = strtol(out, &end, 10);
	int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
	if (code == 0 && end != out && (*end == '\n' || !*end) && n >= 1 && n <= 1024) {
		*ngpus = (int)n;
		return;
	}
	*ngpus = 0;
	if (code == 1 && *out)
		snprintf(why, whylen, "%.*s", (int)strcspn(out, "\n"), out);
	else if (WIFSIGNALED(status))
		snprintf(why, whylen, "%s --count-gpus died of signal %d", worker, WTERMSIG(status));
	else
		snprintf(why, whylen, "%s --count-gpus gave no count (exit %d%s%.*s)", worker, code,
			 *out ? ": " : "", (int)strcspn(out, "\n"), out);
}

int hpu__gpus_count(const char *worker, int *ngpus, char *why, size_t whylen)
{
	int fds[2];
	*ngpus = 0;
	if (pipe2(fds, O_CLOEXEC) < 0) {
		snprintf(why, whylen, "cannot run %s --count-gpus: %s", worker, strerror(errno));
		return -1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		snprintf(why, whylen, "cannot run %s --count-gpus: %s", worker, strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return -1;
	}
	if (pid == 0)
		count_child(worker, fds[1]);
	close(fds[1]);
	char out[1024];
	int late = read_answer(fds[0], out, sizeof out) < 0;
	close(fds[0]);
	if (late)
		kill(pid, SIGKILL);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (late) {
		snprintf(why, whylen, "%s --count-gpus did not answer in %d s", worker,
			 COUNT_TIMEOUT_MS / 1000);
		return 0;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && !*out) {
		snprintf(why, whylen, "cannot run %s --count-gpus", worker);
		return -1;
	}
	parse_answer(worker, out, status, ngpus, why, whylen);
	return 0;
}

int hpu__gpus_devices(hpu__count_by by, int ngpus, const char *why, long cores, int *devices,
		      char *err, size_t errlen)
{
	static const char cuda[] = "--device cuda: ";
	if (by != HPU_COUNT_CORES && ngpus > 0) {
		*devices = ngpus;
		return 0;
	}
	if (by == HPU_COUNT_GPUS) {
		/* the worker's sentence names --device cuda: say --devices too */
		if (why && !strncmp(why, cuda, sizeof cuda - 1))
			snprintf(err, errlen, "--devices auto --device cuda: %s", why + sizeof cuda - 1);
		else
			snprintf(err, errlen, "--devices auto --device cuda: cannot count the GPUs: %s",
				 why && *why ? why : "no GPU is visible");
		return -1;
	}
	*devices = cores < 1 ? 1 : cores > 1024 ? 1024 : (int)cores;
	return 0;
}
