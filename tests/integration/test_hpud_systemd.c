/* hpud under systemd, without systemd: the real hpud with NOTIFY_SOCKET
 * naming a datagram socket of this test (as systemd's for Type=notify),
 * and with JOURNAL_STREAM naming its stderr (as systemd's for
 * StandardError=journal).
 *
 * - READY=1 comes once hpud takes connections, never when it cannot
 *   listen; RELOADING=1 and READY=1 around SIGHUP; STATUS= counts the jobs
 *   and free devices; STOPPING=1 on SIGTERM;
 * - a job's workers get neither variable;
 * - log lines carry journald's priorities (<3>, <4>, <6>) when stderr is
 *   the journal stream, and are plain otherwise. */
#include "tests/integration/hpudlib.h"

#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

static char notify_path[108], notify_env[160];
static int notify_fd = -1;

/* A datagram socket at dir/notify.sock, as systemd's NOTIFY_SOCKET. */
static void notify_open(void)
{
	snprintf(notify_path, sizeof notify_path, "%.80s/notify.sock", dir);
	snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", notify_path);
	unlink(notify_path);
	notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(notify_fd >= 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", notify_path);
	assert_int_equal(bind(notify_fd, (struct sockaddr *)&sa, sizeof sa), 0);
}

static void notify_close(void)
{
	if (notify_fd >= 0)
		close(notify_fd);
	notify_fd = -1;
	unlink(notify_path);
}

/* The next datagram within timeout_ms into buf (NUL-terminated); 0, or -1
 * when none came. */
static int notify_next(char *buf, size_t len, int timeout_ms)
{
	struct pollfd pf = {.fd = notify_fd, .events = POLLIN};
	if (poll(&pf, 1, timeout_ms) <= 0)
		return -1;
	ssize_t n = recv(notify_fd, buf, len - 1, 0);
	if (n < 0)
		return -1;
	buf[n] = 0;
	return 0;
}

static int has_line(const char *text, const char *line)
{
	size_t n = strlen(line);
	for (const char *p = text; (p = strstr(p, line)); p += n)
		if ((p == text || p[-1] == '\n') && (p[n] == '\n' || p[n] == 0))
			return 1;
	return 0;
}

/* Reads datagrams until one holds the line `want` ("READY=1"), within
 * timeout_ms; it is left in buf. 0, or -1. */
static int notify_wait(const char *want, char *buf, size_t len, int timeout_ms)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long waited = 0; waited < timeout_ms;) {
		int got = notify_next(buf, len, 100);
		clock_gettime(CLOCK_MONOTONIC, &t);
		waited = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
		if (got < 0)
			continue;
		printf("  notify: %s\n", buf);
		if (has_line(buf, want))
			return 0;
	}
	return -1;
}

/* A TCP connection to hpud's port succeeds now. */
static int tcp_connects(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
	close(fd);
	return ok;
}

static void start_daemon_env(char *const env[])
{
	stop_daemon();
	char *argv[] = {(char *)HPUD, "-c", conf_path, NULL};
	assert_int_equal(h_start(&daemon_proc, argv, env), 0);
}

/* /proc/PID/environ as one string of "NAME=VALUE\n" lines; caller frees. */
static char *environ_of(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
	FILE *f = fopen(path, "r");
	char *s = calloc(1, 65536);
	size_t len = f && s ? fread(s, 1, 65535, f) : 0;
	if (f)
		fclose(f);
	for (size_t i = 0; s && i < len; i++)
		if (s[i] == 0)
			s[i] = '\n';
	return s;
}

/* READY=1 comes once hpud takes connections (a TCP connect and a signed
 * hello succeed at that moment), with STATUS=; SIGHUP brings RELOADING=1
 * then READY=1; a job shows in STATUS=, and its workers see neither
 * NOTIFY_SOCKET nor JOURNAL_STREAM; SIGTERM brings STOPPING=1. */
static void test_notify_lifecycle(void **state)
{
	(void)state;
	char buf[1024], want[160];
	notify_open();
	char *env[] = {notify_env, "JOURNAL_STREAM=1:1", "HPUCOLL_TIMEOUT_MS=10000", NULL};
	start_daemon_env(env);
	assert_int_equal(notify_wait("READY=1", buf, sizeof buf, 10000), 0);
	assert_true(tcp_connects());
	client c;
	client_open(&c, key); /* asserts a signed HelloReply */
	client_close(&c);
	snprintf(want, sizeof want, "STATUS=listening on tcp://127.0.0.1:%d: 0 jobs, 2 of 2 devices free",
		 port);
	assert_true(has_line(buf, want));
	assert_int_equal(h_wait_for(&daemon_proc, "listening on", 1000), 0);

	kill(daemon_proc.pid, SIGHUP);
	assert_int_equal(notify_wait("RELOADING=1", buf, sizeof buf, 10000), 0);
	assert_int_equal(notify_wait("READY=1", buf, sizeof buf, 10000), 0);
	assert_int_equal(h_wait_for(&daemon_proc, "configuration reloaded", 5000), 0);

	char *argv[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path, "--rdzv-id",
			"notifyjob", "--epochs", "50", "--log-every", "5", (char *)MODEL, "--",
			"--hidden", "64", NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	int seen = h_wait_for(&p, "step 5/", 120000);
	pid_t kids[4];
	int n = h_children(daemon_proc.pid, kids, 4);
	if (seen || n != 2) {
		h_kill(&p);
		fail_msg("the job did not start (%d workers): %s", n, p.out);
	}
	/* the launch's STATUS= is waiting by now */
	snprintf(want, sizeof want, "STATUS=listening on tcp://127.0.0.1:%d: 1 job, 0 of 2 devices free",
		 port);
	assert_int_equal(notify_wait(want, buf, sizeof buf, 10000), 0);
	for (int i = 0; i < n; i++) {
		char *e = environ_of(kids[i]);
		assert_non_null(e);
		assert_null(strstr(e, "NOTIFY_SOCKET="));
		assert_null(strstr(e, "JOURNAL_STREAM="));
		assert_true(has_line(e, "OMP_NUM_THREADS=1"));
		assert_true(has_line(e, "TORCHELASTIC_RUN_ID=notifyjob"));
		assert_true(has_line(e, "GROUP_RANK=0"));
		assert_true(has_line(e, "LOCAL_SIZE=2"));
		free(e);
	}
	kill(daemon_proc.pid, SIGTERM);
	assert_int_equal(notify_wait("STOPPING=1", buf, sizeof buf, 10000), 0);
	assert_true(has_line(buf, "STATUS=stopping: 1 job to end"));
	assert_int_equal(h_wait(&daemon_proc, 20000), 0);
	assert_int_equal(h_code(&daemon_proc), 0);
	assert_int_equal(h_wait(&p, 20000), 0);
	printf("%s", p.out);
	assert_non_null(strstr(p.out, "hpud is shutting down"));
	h_free(&p);
	notify_close();
}

/* hpud that cannot listen (its port taken) exits 1 saying so, and never
 * says READY=1. */
static void test_no_ready_without_listening(void **state)
{
	(void)state;
	char buf[1024];
	notify_open();
	int squat = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int one = 1;
	setsockopt(squat, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	assert_int_equal(bind(squat, (struct sockaddr *)&sa, sizeof sa), 0);
	assert_int_equal(listen(squat, 4), 0);
	char *env[] = {notify_env, NULL};
	start_daemon_env(env);
	int exited = h_wait(&daemon_proc, 10000);
	close(squat);
	printf("%s", daemon_proc.out);
	assert_int_equal(exited, 0);
	assert_int_equal(h_code(&daemon_proc), 1);
	char want[96];
	snprintf(want, sizeof want, "hpud: error: cannot listen on tcp://127.0.0.1:%d", port);
	assert_non_null(strstr(daemon_proc.out, want));
	while (notify_next(buf, sizeof buf, 200) == 0)
		assert_null(strstr(buf, "READY=1"));
	notify_close();
	stop_daemon();
}

/* hpud with JOURNAL_STREAM set to its own stderr, as systemd sets it. */
static void start_journal_daemon(const char *conf)
{
	stop_daemon();
	char *argv[] = {"/bin/sh", "-c",
			"export JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2) && exec \"$0\" \"$@\"",
			(char *)HPUD, "-c", (char *)conf, NULL};
	assert_int_equal(h_start(&daemon_proc, argv, NULL), 0);
}

/* Sends hpud a frame that is not signed: a warning. */
static void send_garbage(void)
{
	char ep[64];
	snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
	void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
	int linger = 1000;
	zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
	assert_int_equal(zmq_connect(s, ep), 0);
	assert_int_equal(zmq_send(s, "not a signed frame", 18, 0), 18);
	zmq_close(s);
	zmq_ctx_term(ctx);
}

/* Whether every line of out that holds "hpud: " starts with one of the
 * priority prefixes (journal) or with "hpud: " itself (plain). */
static int lines_all(const char *out, int journal)
{
	for (const char *l = out; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
		size_t n = strcspn(l, "\n");
		char line[2048];
		snprintf(line, sizeof line, "%.*s", (int)n, l);
		if (!strstr(line, "hpud: "))
			continue;
		int prefixed = line[0] == '<' && line[1] >= '0' && line[1] <= '7' && line[2] == '>' &&
			       !strncmp(line + 3, "hpud: ", 6);
		int plain = !strncmp(line, "hpud: ", 6);
		if (journal ? !prefixed : !plain) {
			printf("  not %s: %s\n", journal ? "prefixed" : "plain", line);
			return 0;
		}
	}
	return 1;
}

/* Each level's line with its priority when stderr is the journal stream:
 * info (listening) <6>, warning (an unsigned frame) <4>, error (a reload
 * of a broken configuration) <3>, and a start-up error <3>. Without
 * JOURNAL_STREAM, or with one that names another stream, the same lines
 * are plain. */
static void test_journal_priorities(void **state)
{
	(void)state;
	start_journal_daemon(conf_path);
	assert_int_equal(h_wait_for(&daemon_proc, "listening on", 10000), 0);
	send_garbage();
	assert_int_equal(h_wait_for(&daemon_proc, "refused a request", 10000), 0);
	write_conf(2, "prot = 1\n");
	kill(daemon_proc.pid, SIGHUP);
	assert_int_equal(h_wait_for(&daemon_proc, "reload refused", 10000), 0);
	write_conf(2, NULL);
	kill(daemon_proc.pid, SIGTERM);
	assert_int_equal(h_wait(&daemon_proc, 15000), 0);
	printf("%s", daemon_proc.out);
	assert_int_equal(h_code(&daemon_proc), 0);
	const char *out = daemon_proc.out;
	assert_non_null(strstr(out, "<6>hpud: info: listening on tcp://127.0.0.1:"));
	assert_non_null(strstr(out, "<4>hpud: warning: refused a request from 127.0.0.1"));
	assert_non_null(strstr(out, "<3>hpud: error: reload refused, keeping the old configuration: "));
	assert_non_null(strstr(out, "<6>hpud: info: stopped"));
	assert_true(lines_all(out, 1));

	char missing[160];
	snprintf(missing, sizeof missing, "%s/no-such.conf", dir);
	start_journal_daemon(missing);
	assert_int_equal(h_wait(&daemon_proc, 10000), 0);
	printf("%s", daemon_proc.out);
	assert_int_equal(h_code(&daemon_proc), 1);
	assert_true(!strncmp(daemon_proc.out, "<3>hpud: error: ", 16));

	/* plain: no JOURNAL_STREAM, then one that is not hpud's stderr */
	for (int k = 0; k < 2; k++) {
		char *env[] = {"JOURNAL_STREAM=1:1", NULL};
		start_daemon_env(k ? env : NULL);
		assert_int_equal(h_wait_for(&daemon_proc, "listening on", 10000), 0);
		send_garbage();
		assert_int_equal(h_wait_for(&daemon_proc, "refused a request", 10000), 0);
		kill(daemon_proc.pid, SIGTERM);
		assert_int_equal(h_wait(&daemon_proc, 15000), 0);
		printf("%s", daemon_proc.out);
		assert_non_null(strstr(daemon_proc.out, "hpud: info: listening on"));
		assert_null(strstr(daemon_proc.out, "<6>"));
		assert_null(strstr(daemon_proc.out, "<4>"));
		assert_true(lines_all(daemon_proc.out, 0));
	}
	stop_daemon();
}

/* A job's lines in hpud are hpud's: the agent's (a process the job's
 * worker left behind, ended) carry hpud's prefix and their priority when
 * stderr is the journal stream, like hpud's own. */
static void test_journal_job_lines(void **state)
{
	(void)state;
	start_journal_daemon(conf_path);
	assert_int_equal(h_wait_for(&daemon_proc, "listening on", 10000), 0);
	char pids[64];
	h_scratch_dir(pids, sizeof pids);
	assert_int_equal(chmod(pids, 0777), 0); /* the workers run as nobody */
	char *argv[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path, "--devices", "1",
			"--max-steps", "2", "--no-eval", "--batch-size", "16",
			(char *)h_build("lib/setsid_child.so"), "--", "--pid-dir", pids, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	printf("%s", p.out);
	h_free(&p);
	int seen = h_wait_for(&daemon_proc, "left behind", 10000);
	h_rmtree(pids);
	assert_int_equal(code, 0);
	assert_int_equal(seen, 0);
	kill(daemon_proc.pid, SIGTERM);
	assert_int_equal(h_wait(&daemon_proc, 15000), 0);
	printf("%s", daemon_proc.out);
	assert_non_null(strstr(daemon_proc.out, "<5>hpud: ended 1 process left behind by the job's workers"));
	assert_null(strstr(daemon_proc.out, "hpulaunch"));
	assert_true(lines_all(daemon_proc.out, 1));
	stop_daemon();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_notify_lifecycle),
		cmocka_unit_test(test_no_ready_without_listening),
		cmocka_unit_test(test_journal_priorities),
		cmocka_unit_test(test_journal_job_lines),
	};
	unsetenv("NOTIFY_SOCKET"); /* only where a test sets it */
	unsetenv("JOURNAL_STREAM");
	int skip = hpud_test_init("test_hpud_systemd");
	if (skip)
		return skip;
	return cmocka_run_group_tests(tests, hpud_setup, hpud_teardown);
}
