/* The one logging path (common/log.c) and libhpucoll's hook:
 * - a real libhpucoll message (a data-plane connection refused by the
 *   security handler) reaches the hook set with hpucoll_set_log and not
 *   stderr; without a hook it is on stderr, as before;
 * - levels filter lines; HPU_LOG_LEVEL is read, a bad value is an error
 *   naming it and the value;
 * - journald's priorities only when JOURNAL_STREAM names stderr itself,
 *   also for the async-signal-safe line of a child;
 * - one write per line: a long line arrives whole in one read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include <netinet/in.h>

#include "hpu/coll.h"
#include "common/log.h"

/* ---- fd 2 captured in a pipe ---- */

typedef struct capture {
	int rfd, saved;
	char *buf; /* what was read so far (cap_wait), NUL-terminated */
	size_t n;
} capture;

enum { CAP_MAX = 1 << 16 };

static void cap_start(capture *c)
{
	int p[2];
	assert_int_equal(pipe(p), 0);
	fflush(stderr);
	c->saved = dup(2);
	assert_true(c->saved >= 0);
	assert_int_equal(dup2(p[1], 2), 2);
	close(p[1]);
	c->rfd = p[0];
	c->buf = malloc(CAP_MAX + 1);
	assert_non_null(c->buf);
	c->buf[0] = 0;
	c->n = 0;
}

/* Reads what is there, waiting up to timeout_ms for more. */
static void cap_read(capture *c, int timeout_ms)
{
	struct pollfd pf = {.fd = c->rfd, .events = POLLIN};
	if (c->n == CAP_MAX || poll(&pf, 1, timeout_ms) <= 0)
		return;
	ssize_t r = read(c->rfd, c->buf + c->n, CAP_MAX - c->n);
	if (r > 0)
		c->n += (size_t)r;
	c->buf[c->n] = 0;
}

static int64_t now_ms(void);

/* Waits up to 10 s for `text` on the captured fd 2 (a line written by
 * another thread, after it counted what it says). */
static void cap_wait(capture *c, const char *text)
{
	fflush(stderr);
	for (int64_t end = now_ms() + 10000; !strstr(c->buf, text) && now_ms() < end;)
		cap_read(c, 50);
}

/* Gives fd 2 back; returns what was written to it (caller frees). */
static char *cap_end(capture *c)
{
	fflush(stderr);
	dup2(c->saved, 2);
	close(c->saved);
	for (size_t before = (size_t)-1; c->n != before && c->n < CAP_MAX;) {
		before = c->n;
		cap_read(c, -1); /* to the end: every writer closed */
	}
	close(c->rfd);
	return c->buf;
}

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ---- libhpucoll's lines through the hook ---- */

struct hooked {
	pthread_mutex_t mu;
	int calls;
	hpucoll_log_level level;
	char line[1024];
};

static void hook(void *user, hpucoll_log_level level, const char *line)
{
	struct hooked *h = user;
	pthread_mutex_lock(&h->mu);
	if (h->calls++ == 0) {
		h->level = level;
		snprintf(h->line, sizeof h->line, "%s", line);
	}
	pthread_mutex_unlock(&h->mu);
}

/* A stranger with a PLAIN proof that is no proof connects to c's data
 * socket and sends a frame. */
static void *stranger(void *ctx, const char *ep)
{
	void *s = zmq_socket(ctx, ZMQ_PUSH);
	int zero = 0;
	int never = -1;
	zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
	zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &never, sizeof never);
	zmq_setsockopt(s, ZMQ_PLAIN_USERNAME, "someone", 7);
	zmq_setsockopt(s, ZMQ_PLAIN_PASSWORD, "guess", 5);
	assert_int_equal(zmq_connect(s, ep), 0);
	zmq_send(s, "hello", 5, ZMQ_DONTWAIT);
	return s;
}

/* Waits until c has refused `want` connections (10 s at most). */
static void wait_refused(hpucoll_comm *c, uint64_t want)
{
	hpucoll_stats st;
	int64_t end = now_ms() + 10000;
	do {
		usleep(10000);
		hpucoll_comm_stats(c, &st);
	} while (st.refused_connections < want && now_ms() < end);
	assert_true(st.refused_connections >= want);
}

/* One stranger refused by a new communicator (rank 0 of 2, auth); waits
 * until the hook has it (h) or its line is on the captured stderr (cap). */
static void refuse_one(struct hooked *h, capture *cap)
{
	hpucoll_comm *c = NULL;
	assert_int_equal(hpucoll_comm_new_secure(&c, 0, 2, "tcp://127.0.0.1:*",
						 HPUCOLL_SECURITY_AUTH, "the job token", 13),
			 HPUCOLL_OK);
	void *ctx = zmq_ctx_new(), *s = stranger(ctx, hpucoll_comm_endpoint(c));
	wait_refused(c, 1);
	/* the handler says it after the monitor counted it, or before */
	for (int64_t end = now_ms() + 5000; h && now_ms() < end; usleep(10000)) {
		pthread_mutex_lock(&h->mu);
		int calls = h->calls;
		pthread_mutex_unlock(&h->mu);
		if (calls)
			break;
	}
	if (!h && cap)
		cap_wait(cap, "none of its frames was read\n");
	zmq_close(s);
	hpucoll_comm_destroy(&c);
	zmq_ctx_term(ctx);
}

static void test_coll_message_reaches_hook(void **state)
{
	(void)state;
	struct hooked h = {.mu = PTHREAD_MUTEX_INITIALIZER};
	capture cap;
	cap_start(&cap);
	hpucoll_set_log(hook, &h);
	refuse_one(&h, NULL);
	char *err = cap_end(&cap);
	printf("hook: %d call(s), level %d: %s\nstderr: \"%s\"\n", h.calls, (int)h.level, h.line,
	       err);
	assert_true(h.calls >= 1);
	assert_int_equal(h.level, HPUCOLL_LOG_WARNING);
	assert_int_equal(strncmp(h.line, "hpucoll: rank 0 refused a data-plane connection from ", 53), 0);
	assert_null(strchr(h.line, '\n'));
	assert_string_equal(err, ""); /* nothing on stderr */
	free(err);

	/* Without a hook: on stderr, as before. */
	hpucoll_set_log(NULL, NULL);
	cap_start(&cap);
	refuse_one(NULL, &cap);
	err = cap_end(&cap);
	printf("stderr without the hook: %s", err);
	assert_int_equal(strncmp(err, "hpucoll: rank 0 refused a data-plane connection from ", 53), 0);
	assert_non_null(strstr(err, "none of its frames was read\n"));
	free(err);
}

/* A connection that opens and never speaks (a peer stopped in the
 * middle of its start): after the handshake's 5 s it is refused as one
 * that did not finish, not as a security mismatch. */
static void test_silent_connection_said(void **state)
{
	(void)state;
	hpucoll_comm *c = NULL;
	assert_int_equal(hpucoll_comm_new_secure(&c, 0, 2, "tcp://127.0.0.1:*",
						 HPUCOLL_SECURITY_AUTH, "the job token", 13),
			 HPUCOLL_OK);
	const char *ep = hpucoll_comm_endpoint(c);
	const char *colon = strrchr(ep, ':');
	assert_non_null(colon);
	capture cap;
	cap_start(&cap);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	wait_refused(c, 1);
	cap_wait(&cap, ": its handshake did not finish (it stopped answering");
	char *err = cap_end(&cap);
	close(fd);
	hpucoll_comm_destroy(&c);
	printf("stderr: %s", err);
	assert_non_null(strstr(err, "refused a data-plane connection from "));
	assert_non_null(strstr(err, ": its handshake did not finish (it stopped answering"));
	free(err);
}

/* ---- the log ---- */

static char *log_lines(hpu_log_level level, void (*body)(void))
{
	capture cap;
	char err[200] = "";
	unsetenv("HPU_LOG_LEVEL");
	cap_start(&cap);
	assert_int_equal(hpu__log_init(err, sizeof err, "test-%s", "log"), 0);
	hpu__log_set_level(level);
	body();
	return cap_end(&cap);
}

static void every_level(void)
{
	hpu__log(HPU_LOG_DEBUG, "d %d", 7);
	hpu__log(HPU_LOG_INFO, "i %d", 6);
	hpu__log(HPU_LOG_NOTICE, "n %d", 5);
	hpu__log(HPU_LOG_WARNING, "w %d", 4);
	hpu__log(HPU_LOG_ERROR, "e %d", 3);
	hpu__log_plain(HPU_LOG_ERROR, "own: prefix");
}

static void test_levels_filter(void **state)
{
	(void)state;
	char *out = log_lines(HPU_LOG_WARNING, every_level);
	assert_string_equal(out, "test-log: w 4\ntest-log: e 3\nown: prefix\n");
	free(out);
	out = log_lines(HPU_LOG_DEBUG, every_level);
	assert_string_equal(out, "test-log: d 7\ntest-log: i 6\ntest-log: n 5\ntest-log: w 4\n"
				 "test-log: e 3\nown: prefix\n");
	free(out);
	out = log_lines(HPU_LOG_ERROR, every_level);
	assert_string_equal(out, "test-log: e 3\nown: prefix\n");
	free(out);
	assert_false(hpu__log_enabled(HPU_LOG_WARNING));
}

static void test_env_level(void **state)
{
	(void)state;
	char err[200];
	static const struct {
		const char *v;
		hpu_log_level want;
	} ok[] = {{"error", HPU_LOG_ERROR},   {"warning", HPU_LOG_WARNING}, {"warn", HPU_LOG_WARNING},
		  {"notice", HPU_LOG_NOTICE}, {"info", HPU_LOG_INFO},       {"debug", HPU_LOG_DEBUG}};
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		setenv("HPU_LOG_LEVEL", ok[i].v, 1);
		assert_int_equal(hpu__log_init(err, sizeof err, "t"), 0);
		assert_int_equal(hpu__log_get_level(), ok[i].want);
		assert_true(hpu__log_level_from_env());
	}
	unsetenv("HPU_LOG_LEVEL");
	assert_int_equal(hpu__log_init(err, sizeof err, "t"), 0);
	assert_int_equal(hpu__log_get_level(), HPU_LOG_INFO);
	assert_false(hpu__log_level_from_env());
	static const char *const bad[] = {"loud", "INFO", "3", " info", "info "};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		setenv("HPU_LOG_LEVEL", bad[i], 1);
		err[0] = 0;
		assert_int_equal(hpu__log_init(err, sizeof err, "t"), -1);
		char want[120];
		snprintf(want, sizeof want,
			 "HPU_LOG_LEVEL: '%s' is not a log level (error, warning, notice, info or debug)",
			 bad[i]);
		assert_string_equal(err, want);
		assert_int_equal(hpu__log_get_level(), HPU_LOG_INFO);
		assert_false(hpu__log_level_from_env());
	}
	unsetenv("HPU_LOG_LEVEL");
	hpu_log_level l;
	assert_int_equal(hpu__log_parse_level("", "--log-level", &l, err, sizeof err), -1);
	assert_string_equal(err, "--log-level: '' is not a log level (error, warning, notice, info or debug)");
}

/* fd 2 to a file; JOURNAL_STREAM naming it (or `other`: another inode). */
static char *journal_lines(int name_it, int other, void (*body)(void))
{
	char path[] = "/tmp/hpu-test-log-XXXXXX", err[200];
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	char js[64];
	snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino + (other ? 1 : 0));
	if (name_it)
		setenv("JOURNAL_STREAM", js, 1);
	else
		unsetenv("JOURNAL_STREAM");
	unsetenv("HPU_LOG_LEVEL");
	fflush(stderr);
	int saved = dup(2);
	dup2(fd, 2);
	assert_int_equal(hpu__log_init(err, sizeof err, "prog"), 0);
	int journal = hpu__log_journal();
	body();
	dup2(saved, 2);
	close(saved);
	close(fd);
	unsetenv("JOURNAL_STREAM");
	char *out = NULL;
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	out = calloc(1, 1 << 16);
	assert_non_null(out);
	(void)!fread(out, 1, (1 << 16) - 1, f);
	fclose(f);
	unlink(path);
	assert_int_equal(journal, name_it && !other);
	return out;
}

static void some_lines(void)
{
	hpu__log(HPU_LOG_ERROR, "error: e");
	hpu__log(HPU_LOG_WARNING, "warning: w");
	hpu__log(HPU_LOG_NOTICE, "n");
	hpu__log(HPU_LOG_INFO, "i");
	hpu__log_plain(HPU_LOG_WARNING, "hpucoll: rank 1: x");
	hpu__log_sigsafe(HPU_LOG_ERROR, "cannot execute the worker program");
}

static void test_journal_priorities(void **state)
{
	(void)state;
	char *out = journal_lines(1, 0, some_lines);
	assert_string_equal(out, "<3>prog: error: e\n<4>prog: warning: w\n<5>prog: n\n<6>prog: i\n"
				 "<4>hpucoll: rank 1: x\n<3>prog: cannot execute the worker program\n");
	free(out);
	for (int other = 0; other < 2; other++) {
		out = journal_lines(other, other, some_lines);
		assert_string_equal(out, "prog: error: e\nprog: warning: w\nprog: n\nprog: i\n"
					 "hpucoll: rank 1: x\nprog: cannot execute the worker program\n");
		free(out);
	}
}

/* A child's line after its stderr became a pipe: no priority there,
 * though the parent's stderr is the journal. */
static void child_line(void)
{
	capture cap;
	cap_start(&cap);
	hpu__log_sigsafe(HPU_LOG_ERROR, "in a pipe");
	char *got = cap_end(&cap);
	assert_string_equal(got, "prog: in a pipe\n");
	free(got);
	hpu__log(HPU_LOG_ERROR, "back");
}

static void test_sigsafe_checks_stderr(void **state)
{
	(void)state;
	char *out = journal_lines(1, 0, child_line);
	assert_string_equal(out, "<3>prog: back\n");
	free(out);
}

static void long_line(void)
{
	char text[3001];
	memset(text, 'x', 3000);
	text[3000] = 0;
	hpu__log(HPU_LOG_INFO, "%s", text);
}

/* A 3000-byte line is one write: the first read of the pipe has it all. */
static void test_one_write_per_line(void **state)
{
	(void)state;
	capture cap;
	char err[200];
	unsetenv("HPU_LOG_LEVEL");
	unsetenv("JOURNAL_STREAM");
	cap_start(&cap);
	assert_int_equal(hpu__log_init(err, sizeof err, "p"), 0);
	long_line();
	char buf[4096];
	ssize_t n = read(cap.rfd, buf, sizeof buf);
	assert_int_equal(n, 3 + 3000 + 1);
	assert_int_equal(memcmp(buf, "p: xxx", 6), 0);
	assert_int_equal(buf[n - 1], '\n');
	free(cap_end(&cap));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_coll_message_reaches_hook),
		cmocka_unit_test(test_silent_connection_said),
		cmocka_unit_test(test_levels_filter),
		cmocka_unit_test(test_env_level),
		cmocka_unit_test(test_journal_priorities),
		cmocka_unit_test(test_sigsafe_checks_stderr),
		cmocka_unit_test(test_one_write_per_line),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
