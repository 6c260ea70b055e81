#include "tests/harness.h"

#include <dirent.h>
#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* HPU_TEST_FILTER=PATTERN runs only the tests whose names match it
 * (cmocka's wildcards), for working on one test of a long program. */
__attribute__((constructor)) static void h_filter(void)
{
	const char *f = getenv("HPU_TEST_FILTER");
	if (f && *f)
		cmocka_set_test_filter(f);
}

const char *h_build(const char *rel)
{
	static char bufs[8][1024];
	static int k;
	const char *b = getenv("HPU_BUILD_DIR");
	char *out = bufs[k++ % 8];
	snprintf(out, 1024, "%s/%s", b && *b ? b : ".", rel);
	return out;
}

int h_start(proc *p, char *const argv[], char *const env[])
{
	memset(p, 0, sizeof *p);
	int fds[2];
	if (pipe(fds) < 0)
		return -1;
	p->pid = fork();
	if (p->pid < 0)
		return -1;
	if (p->pid == 0) {
		setpgid(0, 0);
		dup2(fds[1], 1);
		dup2(fds[1], 2);
		close(fds[0]);
		close(fds[1]);
		for (int i = 0; env && env[i]; i++)
			putenv(env[i]);
		execv(argv[0], argv);
		fprintf(stderr, "cannot execute %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	setpgid(p->pid, p->pid);
	close(fds[1]);
	p->out_fd = fds[0];
	fcntl(p->out_fd, F_SETFL, O_NONBLOCK);
	p->cap = 4096;
	p->out = calloc(1, p->cap);
	return p->out ? 0 : -1;
}

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}

/* Appends whatever is readable; returns 0 at EOF, 1 otherwise. */
static int pump(proc *p, int timeout_ms)
{
	if (p->out_fd < 0)
		return 0;
	struct pollfd pf = {.fd = p->out_fd, .events = POLLIN};
	if (poll(&pf, 1, timeout_ms) <= 0)
		return 1;
	for (;;) {
		if (p->cap - p->len < 4096) {
			char *g = realloc(p->out, p->cap * 2);
			if (!g)
				return 1;
			p->out = g;
			p->cap *= 2;
		}
		ssize_t k = read(p->out_fd, p->out + p->len, p->cap - p->len - 1);
		if (k > 0) {
			p->len += (size_t)k;
			p->out[p->len] = 0;
			continue;
		}
		if (k < 0 && (errno == EAGAIN || errno == EINTR))
			return 1;
		close(p->out_fd);
		p->out_fd = -1;
		return 0;
	}
}

int h_wait(proc *p, int timeout_ms)
{
	long deadline = now_ms() + timeout_ms;
	while (!p->exited) {
		if (waitpid(p->pid, &p->status, WNOHANG) == p->pid) {
			p->exited = 1;
			break;
		}
		long left = deadline - now_ms();
		if (left <= 0)
			return -1;
		if (!pump(p, left < 50 ? (int)left : 50))
			usleep(10000);
	}
	/* Drain what is left, without waiting on grandchildren forever. */
	for (int i = 0; i < 100 && pump(p, 20);)
		i++;
	return 0;
}

int h_wait_for(proc *p, const char *text, int timeout_ms)
{
	long deadline = now_ms() + timeout_ms;
	while (!strstr(p->out, text)) {
		long left = deadline - now_ms();
		if (left <= 0)
			return -1;
		if (!pump(p, left < 50 ? (int)left : 50)) {
			if (!strstr(p->out, text))
				return -1;
		}
	}
	return 0;
}

int h_code(const proc *p)
{
	if (WIFEXITED(p->status))
		return WEXITSTATUS(p->status);
	return WIFSIGNALED(p->status) ? 128 + WTERMSIG(p->status) : -1;
}

void h_free(proc *p)
{
	if (p->out_fd >= 0)
		close(p->out_fd);
	p->out_fd = -1;
	free(p->out);
	p->out = NULL;
}

void h_kill(proc *p)
{
	if (p->pid > 0 && !p->exited) {
		kill(-p->pid, SIGKILL);
		waitpid(p->pid, &p->status, 0);
		p->exited = 1;
	}
}

int h_run(proc *p, char *const argv[], char *const env[], int timeout_ms)
{
	if (h_start(p, argv, env) < 0)
		return -1;
	if (h_wait(p, timeout_ms) < 0) {
		fprintf(stderr, "harness: %s still running after %d ms; killed. Output:\n%s\n",
			argv[0], timeout_ms, p->out);
		h_kill(p);
		return -1;
	}
	return h_code(p);
}

int h_children(pid_t ppid, pid_t *out, int max)
{
	DIR *d = opendir("/proc");
	if (!d)
		return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < max) {
		char path[300], buf[512];
		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		size_t k = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		buf[k] = 0;
		/* pid (comm) state ppid: comm may hold spaces; find the last ')'. */
		char *rp = strrchr(buf, ')');
		char state;
		int pp;
		if (rp && sscanf(rp + 1, " %c %d", &state, &pp) == 2 && pp == ppid)
			out[n++] = (pid_t)atoi(e->d_name);
	}
	closedir(d);
	return n;
}

int h_alive(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t k = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[k] = 0;
	char *rp = strrchr(buf, ')');
	return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

char *h_slurp_n(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseeko(f, 0, SEEK_END);
	off_t n = ftello(f);
	fseeko(f, 0, SEEK_SET);
	char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
	if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
		free(s);
		s = NULL;
	}
	if (s) {
		s[n] = 0;
		if (len)
			*len = (size_t)n;
	}
	fclose(f);
	return s;
}

char *h_slurp(const char *path)
{
	return h_slurp_n(path, NULL);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

int h_rmtree(const char *dir)
{
	nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	struct stat st;
	return stat(dir, &st) == 0 ? -1 : 0;
}

void h_scratch_dir(char *dir, size_t len)
{
	snprintf(dir, len, "/tmp/hpu-test-restart-XXXXXX");
	assert_non_null(mkdtemp(dir));
}

int h_file_has(const char *dir, const char *name, const char *text)
{
	char path[256];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	char *s = h_slurp(path);
	int ok = s && strstr(s, text) != NULL;
	free(s);
	return ok;
}

int h_file_exists(const char *dir, const char *name)
{
	char path[256];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return access(path, F_OK) == 0;
}

void h_kill_groups(const pid_t *pids, int n)
{
	for (int i = 0; i < n; i++)
		if (h_alive(pids[i]))
			kill(-pids[i], SIGKILL);
}

void h_two_nodes(proc *n0, char **a0, char **env0, int ms0, proc *n1, char **a1,
		 char **env1, int ms1)
{
	assert_int_equal(h_start(n0, a0, env0), 0);
	assert_int_equal(h_start(n1, a1, env1), 0);
	int e0 = h_wait(n0, ms0), e1 = h_wait(n1, ms1);
	if (e0)
		h_kill(n0);
	if (e1)
		h_kill(n1);
	printf("node 0:\n%s\nnode 1:\n%s\n", n0->out, n1->out);
	assert_int_equal(e0, 0);
	assert_int_equal(e1, 0);
}

int h_free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof sa;
	if (fd < 0)
		return -1;
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
		close(fd);
		return -1;
	}
	close(fd);
	return ntohs(sa.sin_port);
}

int h_write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	int ok = fputs(text, f) >= 0;
	ok &= fclose(f) == 0;
	return ok && chmod(path, mode) == 0 ? 0 : -1;
}
