/* Integration tests of hpud on loopback: a real daemon, real signed
 * frames, the real hpulaunch --hostfile and --status.
 *
 * - start-up refusals: a key readable by others, root without a user;
 *   --gen-key;
 * - bad input: unsigned, wrong key, replayed, expired, truncated, garbage
 *   (thousands of random frames), oversized, multi-frame -> all refused
 *   and logged with the peer, no job started, the daemon still answers a
 *   good request and its memory does not grow;
 * - jobs: a training job through hpulaunch --hostfile, its workers running
 *   as the configured user; devices not double-booked; --status; a
 *   submitter that goes away, Ctrl-C, SIGTERM and SIGHUP to the daemon;
 * - --max-restarts: a job that fails once is submitted again with
 *   HPU_RESTART_COUNT=1 and succeeds.
 * Needs root (the workers switch to the user 'nobody'). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "auth.h"
#include "codec.h"
#include "harness.h"

#define HPUD h_build("bin/hpud")
#define LAUNCH h_build("bin/hpulaunch")
#define MODEL h_build("lib/fmnist_mlp.so")

static char dir[64], key_path[128], conf_path[128], hostfile[128];
static int port;
static proc daemon_proc;
static uint8_t key[HPU_AUTH_KEY_BYTES];


static void write_conf(int devices, const char *extra)
{
	char text[1024];
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = %d\nkey = %s\nuser = nobody\n"
		 "log_level = info\nsubmitter_timeout = 3\n%s",
		 port, devices, key_path, extra ? extra : "");
	assert_int_equal(h_write_file(conf_path, text, 0644), 0);
}

static void stop_daemon(void);

/* hpud in the background (after any left by a failed test); waits until
 * it listens. */
static void start_daemon(void)
{
	stop_daemon();
	char *argv[] = {(char *)HPUD, "-c", conf_path, NULL};
	char *env[] = {"HPUCOLL_TIMEOUT_MS=10000", NULL};
	assert_int_equal(h_start(&daemon_proc, argv, env), 0);
	assert_int_equal(h_wait_for(&daemon_proc, "listening on", 10000), 0);
}

static void stop_daemon(void)
{
	if (daemon_proc.pid > 0 && !daemon_proc.exited) {
		h_wait(&daemon_proc, 0); /* it may have exited already */
	}
	if (daemon_proc.pid > 0 && !daemon_proc.exited) {
		kill(daemon_proc.pid, SIGTERM);
		if (h_wait(&daemon_proc, 15000) < 0)
			h_kill(&daemon_proc);
	}
	h_free(&daemon_proc);
	memset(&daemon_proc, 0, sizeof daemon_proc);
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof dir, "/tmp/hpud-test-XXXXXX");
	assert_non_null(mkdtemp(dir));
	chmod(dir, 0755);
	snprintf(key_path, sizeof key_path, "%s/secret.key", dir);
	snprintf(conf_path, sizeof conf_path, "%s/hpud.conf", dir);
	snprintf(hostfile, sizeof hostfile, "%s/hostfile", dir);
	char *argv[] = {(char *)HPUD, "--gen-key", key_path, NULL};
	proc p;
	assert_int_equal(h_run(&p, argv, NULL, 10000), 0);
	h_free(&p);
	char err[256];
	assert_int_equal(hpu_auth_load_key(key_path, key, err, sizeof err), 0);
	port = h_free_port();
	write_conf(2, NULL);
	char hf[128];
	snprintf(hf, sizeof hf, "127.0.0.1:%d slots=2\n", port);
	assert_int_equal(h_write_file(hostfile, hf, 0644), 0);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	stop_daemon();
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* ---- a raw client ---- */

typedef struct client {
	void *ctx, *sock;
	hpu_auth *auth;
} client;

static void client_open(client *c, const uint8_t *k)
{
	char ep[64];
	snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
	int linger = 0;
	c->ctx = zmq_ctx_new();
	c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
	zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
	assert_int_equal(zmq_connect(c->sock, ep), 0);
	c->auth = hpu_auth_new(k, 30000, 1 << 16);
}

static void client_close(client *c)
{
	zmq_close(c->sock);
	zmq_ctx_term(c->ctx);
	hpu_auth_destroy(&c->auth);
}

/* A signed status request stamped now + skew_ms; *len gets its size. */
static uint8_t *status_frame(client *c, int64_t skew_ms, size_t *len)
{
	Hpu__StatusRequest q = HPU__STATUS_REQUEST__INIT;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_STATUS_REQUEST;
	env.status_request = &q;
	uint8_t *body, *frame;
	size_t blen = hpu_codec_pack(&env, &body);
	*len = hpu_auth_sign(c->auth, body, blen, hpu_auth_now_ms() + skew_ms, &frame);
	free(body);
	assert_true(*len > 0);
	return frame;
}

/* The status reply to a frame just sent, or NULL after timeout_ms. */
static Hpu__Envelope *await_reply(client *c, int timeout_ms)
{
	zmq_pollitem_t it = {.socket = c->sock, .events = ZMQ_POLLIN};
	if (zmq_poll(&it, 1, timeout_ms) <= 0)
		return NULL;
	zmq_msg_t m;
	zmq_msg_init(&m);
	assert_true(zmq_msg_recv(&m, c->sock, 0) >= 0);
	const void *body;
	size_t blen;
	char why[128];
	Hpu__Envelope *env = NULL;
	if (hpu_auth_verify(c->auth, zmq_msg_data(&m), zmq_msg_size(&m), hpu_auth_now_ms(),
			    &body, &blen, why, sizeof why) == 0)
		env = hpu_codec_unpack(body, blen);
	zmq_msg_close(&m);
	return env;
}

static int jobs_running(void)
{
	client c;
	client_open(&c, key);
	size_t len;
	uint8_t *f = status_frame(&c, 0, &len);
	zmq_send(c.sock, f, len, 0);
	free(f);
	Hpu__Envelope *r = await_reply(&c, 5000);
	assert_non_null(r);
	assert_int_equal(r->msg_case, HPU__ENVELOPE__MSG_STATUS_REPLY);
	int n = (int)r->status_reply->n_jobs;
	hpu_codec_free(r);
	client_close(&c);
	return n;
}

/* The number after `field` ("VmRSS:", "Uid:") in /proc/PID/status, or -1. */
static long proc_status(pid_t pid, const char *field)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	long v = -1;
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, field, strlen(field)))
			v = atol(line + strlen(field));
	if (f)
		fclose(f);
	return v;
}

static long rss_kib(pid_t pid)
{
	return proc_status(pid, "VmRSS:");
}

static uint64_t rng = 0x1234567;
static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)rng;
}

/* Waits until hpud has handled everything c sent: a status request on
 * the same connection is answered after them. Reads hpud's log on the way,
 * so that it never blocks on a full pipe. */
static void sync_daemon(client *c)
{
	size_t len;
	uint8_t *f = status_frame(c, 0, &len);
	zmq_send(c->sock, f, len, 0);
	free(f);
	Hpu__Envelope *r = NULL;
	for (int i = 0; i < 300 && !r; i++) {
		h_wait(&daemon_proc, 10);
		r = await_reply(c, 50);
	}
	assert_non_null(r);
	hpu_codec_free(r);
}

static void send_garbage(client *c, int count)
{
	uint8_t buf[4096];
	for (int i = 0; i < count; i++) {
		size_t len = rnd() % sizeof buf;
		for (size_t k = 0; k < len; k++)
			buf[k] = (uint8_t)rnd();
		if (i % 3 == 0 && len >= 4)
			memcpy(buf, "HPU1", 4); /* get past the magic */
		zmq_send(c->sock, buf, len, 0);
		if (i % 500 == 499)
			sync_daemon(c);
	}
	sync_daemon(c);
}

/* ---- start-up ---- */

static void test_key_permissions(void **state)
{
	(void)state;
	chmod(key_path, 0644);
	char *argv[] = {(char *)HPUD, "-c", conf_path, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 10000);
	printf("  %s", p.out);
	chmod(key_path, 0600);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, key_path));
	assert_non_null(strstr(p.out, "group or others"));
	h_free(&p);
	/* root with no user for the workers */
	char conf2[160];
	snprintf(conf2, sizeof conf2, "%s/nouser.conf", dir);
	char text[512];
	snprintf(text, sizeof text, "listen = 127.0.0.1\nport = %d\nkey = %s\n", port, key_path);
	assert_int_equal(h_write_file(conf2, text, 0644), 0);
	char *argv2[] = {(char *)HPUD, "-c", conf2, NULL};
	code = h_run(&p, argv2, NULL, 10000);
	printf("  %s", p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "set 'user = NAME'"));
	h_free(&p);
	/* --gen-key does not overwrite */
	char *argv3[] = {(char *)HPUD, "--gen-key", key_path, NULL};
	code = h_run(&p, argv3, NULL, 10000);
	printf("  %s", p.out);
	assert_int_equal(code, 1);
	h_free(&p);
	struct stat st;
	assert_int_equal(stat(key_path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
}

/* ---- bad input ---- */

static void test_bad_requests(void **state)
{
	(void)state;
	start_daemon();
	client c, wrong;
	uint8_t other[HPU_AUTH_KEY_BYTES];
	memcpy(other, key, sizeof other);
	other[0] ^= 1;
	client_open(&c, key);
	client_open(&wrong, other);
	size_t len;
	/* a good one is answered */
	uint8_t *good = status_frame(&c, 0, &len);
	zmq_send(c.sock, good, len, 0);
	Hpu__Envelope *r = await_reply(&c, 5000);
	assert_non_null(r);
	hpu_codec_free(r);
	/* replayed: the same frame again */
	zmq_send(c.sock, good, len, 0);
	assert_null(await_reply(&c, 1000));
	/* truncated */
	for (size_t k = 0; k < len; k += 7)
		zmq_send(c.sock, good, k, 0);
	free(good);
	/* unsigned: a bare envelope */
	Hpu__StatusRequest q = HPU__STATUS_REQUEST__INIT;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_STATUS_REQUEST;
	env.status_request = &q;
	uint8_t *body;
	size_t blen = hpu_codec_pack(&env, &body);
	zmq_send(c.sock, body, blen, 0);
	free(body);
	/* wrong key; expired; from the future */
	uint8_t *f = status_frame(&wrong, 0, &len);
	zmq_send(wrong.sock, f, len, 0);
	free(f);
	f = status_frame(&c, -120000, &len);
	zmq_send(c.sock, f, len, 0);
	free(f);
	f = status_frame(&c, 120000, &len);
	zmq_send(c.sock, f, len, 0);
	free(f);
	/* two frames */
	zmq_send(c.sock, "HPU1", 4, ZMQ_SNDMORE);
	zmq_send(c.sock, "HPU1", 4, 0);
	assert_null(await_reply(&c, 500));
	assert_null(await_reply(&wrong, 100));
	/* garbage: warm up (ZeroMQ's and malloc's pools grow to a plateau
	 * over the first ~10000 frames), then measure over 30000 more; a
	 * leak of anything frame-sized (2 KiB on average) would add ~60 MiB,
	 * of 64 bytes ~2 MiB; the bound is 1 MiB */
	send_garbage(&c, 10000);
	assert_int_equal(jobs_running(), 0);
	long before = rss_kib(daemon_proc.pid);
	send_garbage(&c, 15000);
	/* oversized: ZeroMQ drops the connection; a new one still works */
	size_t big = HPU_AUTH_MAX_FRAME + 1024;
	uint8_t *huge = calloc(1, big);
	memcpy(huge, "HPU1", 4);
	zmq_send(wrong.sock, huge, big, 0);
	free(huge);
	send_garbage(&c, 15000);
	assert_int_equal(jobs_running(), 0);
	long after = rss_kib(daemon_proc.pid);
	printf("  hpud RSS %ld KiB after 10000 garbage frames, %ld KiB after 30000 more\n", before,
	       after);
	assert_true(before > 0 && after > 0);
	assert_true(after - before < 1024);
	pid_t kids[4];
	assert_int_equal(h_children(daemon_proc.pid, kids, 4), 0); /* nothing ran */
	/* every kind was refused, with the peer's address */
	h_wait(&daemon_proc, 300);
	const char *kinds[] = {"refused a request from 127.0.0.1", "replayed", "truncated",
			       "bad signature", "stale", "future", "more than one frame"};
	for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
		if (!strstr(daemon_proc.out, kinds[k]))
			fail_msg("hpud's log does not mention \"%s\":\n%s", kinds[k],
				 daemon_proc.out);
	client_close(&c);
	client_close(&wrong);
	stop_daemon();
}

/* ---- jobs ---- */

static char *launch_argv_str[32];

/* hpulaunch --hostfile ... MODEL with `extra` training options. */
static void launch_start(proc *p, const char *epochs)
{
	char **a = launch_argv_str;
	int n = 0;
	a[n++] = (char *)LAUNCH;
	a[n++] = "--hostfile";
	a[n++] = hostfile;
	a[n++] = "--key";
	a[n++] = key_path;
	a[n++] = "--devices";
	a[n++] = "2";
	a[n++] = "--epochs";
	a[n++] = (char *)epochs;
	a[n++] = "--log-every";
	a[n++] = "5";
	a[n++] = (char *)MODEL;
	a[n++] = "--";
	a[n++] = "--hidden";
	a[n++] = "64";
	a[n] = NULL;
	assert_int_equal(h_start(p, a, NULL), 0);
}

static int uid_of(pid_t pid)
{
	return (int)proc_status(pid, "Uid:");
}

static void test_job_through_hostfile(void **state)
{
	(void)state;
	start_daemon();
	proc p;
	launch_start(&p, "1");
	assert_int_equal(h_wait_for(&p, "step 5/", 120000), 0);
	pid_t kids[4];
	int n = h_children(daemon_proc.pid, kids, 4);
	assert_int_equal(n, 2);
	for (int i = 0; i < n; i++)
		assert_int_equal(uid_of(kids[i]), 65534); /* nobody */
	assert_int_equal(h_wait(&p, 300000), 0);
	printf("%s", strstr(p.out, "[rank 0] trained") ? strstr(p.out, "[rank 0] trained") : p.out);
	assert_int_equal(h_code(&p), 0);
	assert_non_null(strstr(p.out, "[rank 0] test accuracy"));
	h_free(&p);
	h_wait(&daemon_proc, 500);
	assert_non_null(strstr(daemon_proc.out, "ended successfully"));
	stop_daemon();
}

/* The variables the workers read (LOWER_LIST, FP32_LIST, QUANT_CONFIG)
 * travel with the request: hpud's own environment has none, and the
 * workers read the submitter's file (here a bad one, which they name). */
static void test_job_env_forwarded(void **state)
{
	(void)state;
	char list[64];
	snprintf(list, sizeof list, "/tmp/hpu-lower-%d.txt", (int)getpid());
	assert_int_equal(h_write_file(list, "relu\nlineer\n", 0644), 0); /* workers run as nobody */
	start_daemon();
	setenv("LOWER_LIST", list, 1);
	proc p;
	launch_start(&p, "1");
	unsetenv("LOWER_LIST");
	assert_int_equal(h_wait(&p, 120000), 0);
	printf("  %s", strstr(p.out, "LOWER_LIST") ? strstr(p.out, "LOWER_LIST") : p.out);
	assert_int_not_equal(h_code(&p), 0);
	char want[128];
	snprintf(want, sizeof want, "LOWER_LIST file %s line 2: unknown op 'lineer'", list);
	assert_non_null(strstr(p.out, want));
	h_free(&p);
	stop_daemon();
	unlink(list);
}

/* Devices are not double-booked; --status shows the job; a submitter that
 * dies is noticed and its job cancelled. */
static void test_busy_status_and_lost_submitter(void **state)
{
	(void)state;
	start_daemon();
	proc a, b, s;
	launch_start(&a, "50");
	assert_int_equal(h_wait_for(&a, "step 5/", 120000), 0);
	char target[64];
	snprintf(target, sizeof target, "127.0.0.1:%d", port);
	char *st[] = {(char *)LAUNCH, "--status", target, "--key", key_path, NULL};
	assert_int_equal(h_run(&s, st, NULL, 20000), 0);
	printf("%s", s.out);
	assert_non_null(strstr(s.out, "2 devices, 0 free, 1 jobs"));
	h_free(&s);
	launch_start(&b, "1");
	assert_int_equal(h_wait(&b, 30000), 0);
	printf("%s", b.out);
	assert_int_equal(h_code(&b), 1);
	assert_non_null(strstr(b.out, "refused the job: busy: this node has 2 devices, 0 free"));
	h_free(&b);
	pid_t kids[4];
	assert_int_equal(h_children(daemon_proc.pid, kids, 4), 2);
	h_kill(&a); /* the submitter dies */
	h_free(&a);
	int gone = 0;
	for (int i = 0; i < 100 && !gone; i++) { /* submitter_timeout 3 s + grace */
		usleep(100000);
		gone = h_children(daemon_proc.pid, kids, 4) == 0;
	}
	assert_true(gone);
	assert_int_equal(h_wait_for(&daemon_proc, "went away", 5000), 0);
	assert_int_equal(jobs_running(), 0);
	stop_daemon();
}

/* Whether process pid has a descriptor open on path. */
static int has_fd_on(pid_t pid, const char *path)
{
	char dirp[64], link[96], target[512];
	snprintf(dirp, sizeof dirp, "/proc/%d/fd", (int)pid);
	DIR *d = opendir(dirp);
	struct dirent *e;
	int found = 0;
	while (d && (e = readdir(d)) != NULL) {
		snprintf(link, sizeof link, "%s/%s", dirp, e->d_name);
		ssize_t n = readlink(link, target, sizeof target - 1);
		if (n > 0) {
			target[n] = '\0';
			found |= strcmp(target, path) == 0;
		}
	}
	if (d)
		closedir(d);
	return found;
}

/* hpud started with a descriptor it inherited (no close-on-exec): its
 * workers, which switch to the user nobody, do not get it; and kill -9 of
 * hpud ends them (the parent-death signal survives the switch of user),
 * rather than leaving them training. */
static void test_workers_die_with_hpud(void **state)
{
	(void)state;
	char marker[128];
	snprintf(marker, sizeof marker, "%s/inherited", dir);
	int fd0 = open(marker, O_RDWR | O_CREAT, 0600);
	assert_true(fd0 >= 0);
	int fd = fcntl(fd0, F_DUPFD, 100); /* no close-on-exec, clear of 0-2 */
	assert_true(fd >= 100);
	close(fd0);
	start_daemon();
	close(fd);
	assert_true(has_fd_on(daemon_proc.pid, marker));
	proc a;
	launch_start(&a, "50");
	assert_int_equal(h_wait_for(&a, "step 5/", 120000), 0);
	pid_t kids[4];
	assert_int_equal(h_children(daemon_proc.pid, kids, 4), 2);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(uid_of(kids[i]), 65534);
		printf("worker %d: descriptor on the inherited file: %s\n", (int)kids[i],
		       has_fd_on(kids[i], marker) ? "yes" : "no");
		assert_false(has_fd_on(kids[i], marker));
	}
	kill(daemon_proc.pid, SIGKILL);
	assert_int_equal(h_wait(&daemon_proc, 10000), 0);
	/* the kernel sends the workers SIGKILL as hpud dies; 10 s is for a
	 * loaded machine (they trained on for 52 s before) */
	int alive = 2;
	for (int t = 0; t < 100 && alive; t++) {
		usleep(100000);
		alive = h_alive(kids[0]) + h_alive(kids[1]);
	}
	printf("workers alive after kill -9 of hpud: %d\n", alive);
	assert_int_equal(alive, 0);
	h_kill(&a);
	h_free(&a);
	stop_daemon();
	unlink(marker);
}

static int fd_count(pid_t pid)
{
	char dirp[64];
	snprintf(dirp, sizeof dirp, "/proc/%d/fd", (int)pid);
	DIR *d = opendir(dirp);
	int n = 0;
	while (d && readdir(d))
		n++;
	if (d)
		closedir(d);
	return n;
}

/* Rounds of concurrent jobs leave hpud with the threads and descriptors
 * it had after the first round: every job's ZeroMQ context is gone (a
 * SIGCHLD that interrupts zmq_ctx_term used to leave its threads). */
static void test_concurrent_jobs_leave_nothing(void **state)
{
	(void)state;
	enum { JOBS = 4, ROUNDS = 3 };
	write_conf(JOBS, NULL);
	start_daemon();
	long threads[ROUNDS];
	int fds[ROUNDS];
	char hf[128], hfp[160];
	snprintf(hfp, sizeof hfp, "%s/hostfile1", dir);
	snprintf(hf, sizeof hf, "127.0.0.1:%d slots=1\n", port);
	assert_int_equal(h_write_file(hfp, hf, 0644), 0);
	for (int r = 0; r < ROUNDS; r++) {
		proc p[JOBS];
		for (int j = 0; j < JOBS; j++) {
			char *a[] = {(char *)LAUNCH, "--hostfile", hfp, "--key", key_path,
				     "--devices", "1", "--max-steps", "2", "--log-every", "0",
				     "--no-eval", (char *)MODEL, "--", "--hidden", "16", NULL};
			assert_int_equal(h_start(&p[j], a, NULL), 0);
		}
		for (int j = 0; j < JOBS; j++) {
			assert_int_equal(h_wait(&p[j], 120000), 0);
			if (h_code(&p[j]))
				printf("%s", p[j].out);
			assert_int_equal(h_code(&p[j]), 0);
			h_free(&p[j]);
		}
		for (int t = 0; t < 50 && jobs_running() > 0; t++)
			usleep(100000);
		threads[r] = proc_status(daemon_proc.pid, "Threads:");
		fds[r] = fd_count(daemon_proc.pid);
		printf("after round %d of %d concurrent jobs: hpud has %ld threads, %d descriptors\n",
		       r + 1, JOBS, threads[r], fds[r]);
	}
	assert_int_equal(threads[ROUNDS - 1], threads[0]);
	assert_int_equal(fds[ROUNDS - 1], fds[0]);
	stop_daemon();
	write_conf(2, NULL);
}

/* Ctrl-C on the submitter cancels the job on the node; SIGTERM to hpud
 * ends a job with a reason; SIGHUP reloads the configuration. */
static void test_cancel_term_and_reload(void **state)
{
	(void)state;
	start_daemon();
	proc a;
	pid_t kids[4];
	launch_start(&a, "50");
	assert_int_equal(h_wait_for(&a, "step 5/", 120000), 0);
	kill(a.pid, SIGINT);
	assert_int_equal(h_wait(&a, 20000), 0);
	assert_int_equal(h_code(&a), 128 + SIGINT);
	h_free(&a);
	assert_int_equal(h_children(daemon_proc.pid, kids, 4), 0);
	/* reload: one device now */
	write_conf(1, NULL);
	kill(daemon_proc.pid, SIGHUP);
	assert_int_equal(h_wait_for(&daemon_proc, "configuration reloaded", 5000), 0);
	char target[64];
	snprintf(target, sizeof target, "127.0.0.1:%d", port);
	char *st[] = {(char *)LAUNCH, "--status", target, "--key", key_path, NULL};
	proc s;
	assert_int_equal(h_run(&s, st, NULL, 20000), 0);
	assert_non_null(strstr(s.out, "1 devices, 1 free"));
	h_free(&s);
	write_conf(2, NULL);
	kill(daemon_proc.pid, SIGHUP);
	assert_int_equal(h_wait_for(&daemon_proc, "configuration reloaded", 5000), 0);
	/* SIGTERM: the job is cancelled with a reason, hpud exits 0 */
	launch_start(&a, "50");
	assert_int_equal(h_wait_for(&a, "step 5/", 120000), 0);
	kill(daemon_proc.pid, SIGTERM);
	assert_int_equal(h_wait(&daemon_proc, 20000), 0);
	assert_int_equal(h_code(&daemon_proc), 0);
	assert_int_equal(h_wait(&a, 20000), 0);
	printf("%s", strstr(a.out, "hpulaunch: error") ? strstr(a.out, "hpulaunch: error") : "");
	assert_int_equal(h_code(&a), 1);
	assert_non_null(strstr(a.out, "hpud is shutting down"));
	h_free(&a);
	stop_daemon();
}

/* hpulaunch --hostfile --max-restarts 1: rank 1 fails on the first
 * attempt (the worker program is a script in front of hpu-worker that reads
 * HPU_RESTART_COUNT); the job is submitted again, every rank sees
 * HPU_RESTART_COUNT=1 and HPU_MAX_RESTARTS=1, and it trains to the end. */
static void test_restart_through_hostfile(void **state)
{
	(void)state;
	char script[192], text[1024], extra[256];
	snprintf(script, sizeof script, "%s/restart-worker.sh", dir);
	snprintf(text, sizeof text,
		 "#!/bin/sh\n"
		 "echo \"restart count $HPU_RESTART_COUNT of $HPU_MAX_RESTARTS\"\n"
		 "if [ \"$HPU_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then exit 3; fi\n"
		 "exec %s \"$@\"\n",
		 h_build("bin/hpu-worker"));
	assert_int_equal(h_write_file(script, text, 0755), 0);
	snprintf(extra, sizeof extra, "worker = %s\n", script);
	write_conf(2, extra);
	start_daemon();
	char *argv[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path,
			"--devices", "2", "--max-restarts", "1", "--max-steps", "3",
			"--no-eval", (char *)MODEL, "--", "--hidden", "64", NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 180000);
	printf("%s", p.out);
	write_conf(2, NULL);
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "[rank 1] restart count 0 of 1"));
	assert_non_null(strstr(p.out, "hpulaunch: attempt 1 of 2 failed: rank 1 (node 0, pid "));
	assert_non_null(strstr(p.out, "exited with code 3; restarting (restart 1 of 1)"));
	assert_non_null(strstr(p.out, "[rank 0] restart count 1 of 1"));
	assert_non_null(strstr(p.out, "[rank 1] restart count 1 of 1"));
	assert_non_null(strstr(p.out, "[rank 0] trained 3 steps on 2 workers"));
	assert_null(strstr(p.out, "job failed after"));
	h_free(&p);
	h_wait(&daemon_proc, 500);
	assert_non_null(strstr(daemon_proc.out, "(restart 1 of 1)"));
	pid_t kids[4];
	assert_int_equal(h_children(daemon_proc.pid, kids, 4), 0);
	stop_daemon();
	unlink(script);
}

int main(void)
{
	if (geteuid() != 0) {
		printf("test_hpud needs root (workers switch to the user nobody): skipped\n");
		return 77;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_permissions),
		cmocka_unit_test(test_bad_requests),
		cmocka_unit_test(test_job_through_hostfile),
		cmocka_unit_test(test_job_env_forwarded),
		cmocka_unit_test(test_busy_status_and_lost_submitter),
		cmocka_unit_test(test_cancel_term_and_reload),
		cmocka_unit_test(test_workers_die_with_hpud),
		cmocka_unit_test(test_concurrent_jobs_leave_nothing),
		cmocka_unit_test(test_restart_through_hostfile),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
