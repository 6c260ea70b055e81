/* Integration tests of hpud on loopback: a real daemon, real signed
 * frames, the real hpulaunch --hostfile and --status.
 *
 * - start-up refusals: a key readable by others, root without a user;
 *   --gen-key; a configuration, key or worker program (or a directory
 *   above them) that someone else owns or may write, also on SIGHUP;
 * - bad input: unsigned, wrong key, replayed, expired, truncated, garbage
 *   (thousands of random frames), oversized, multi-frame -> all refused
 *   and logged with the peer, no job started, the daemon still answers a
 *   good request and its memory does not grow;
 * - jobs: a training job through hpulaunch --hostfile, its workers running
 *   as the configured user; devices not double-booked; --status; a
 *   submitter that goes away, Ctrl-C, SIGTERM and SIGHUP to the daemon;
 * - --max-restarts: a job that fails once is submitted again with
 *   HPU_RESTART_COUNT=1 and succeeds;
 * - a stopped submitter: hpud keeps at most output_buffer of the job's
 *   output, drops the rest and says so; the job runs to the end;
 * - job_uids: two jobs run as uids of their own and cannot read each
 *   other's environment or signal each other's workers.
 * Needs root (the workers switch to the user 'nobody'). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
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
	char session[HPU_AUTH_ID_HEX + 1]; /* ours, named by every request */
	char instance[64];                 /* hpud's, from its HelloReply */
} client;

static void client_hello(client *c);

/* A client of the hpud on port p; with the cluster's key, it says hello
 * (as hpulaunch does) so that its requests name hpud's instance. */
static void client_open_port(client *c, const uint8_t *k, int p)
{
	char ep[64];
	snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", p);
	int linger = 0;
	c->ctx = zmq_ctx_new();
	c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
	zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
	assert_int_equal(zmq_connect(c->sock, ep), 0);
	c->auth = hpu_auth_new(k, 30000, 1 << 16);
	assert_int_equal(hpu_auth_random_id(c->session), 0);
	c->instance[0] = 0;
	if (!memcmp(k, key, sizeof key))
		client_hello(c);
}

static void client_open(client *c, const uint8_t *k)
{
	client_open_port(c, k, port);
}

static void client_close(client *c)
{
	zmq_close(c->sock);
	zmq_ctx_term(c->ctx);
	hpu_auth_destroy(&c->auth);
}

/* env as c sends it: under c's session, for the instance c said hello
 * to ("" before), signed and stamped now + skew_ms; *len gets its size. */
static uint8_t *sign_env(client *c, Hpu__Envelope *env, int64_t skew_ms, size_t *len)
{
	env->instance = c->instance;
	env->session = c->session;
	uint8_t *body, *frame;
	size_t blen = hpu_codec_pack(env, &body);
	*len = hpu_auth_sign(c->auth, body, blen, hpu_auth_now_ms() + skew_ms, &frame);
	free(body);
	assert_true(*len > 0);
	return frame;
}

/* A signed status request stamped now + skew_ms; *len gets its size. */
static uint8_t *status_frame(client *c, int64_t skew_ms, size_t *len)
{
	Hpu__StatusRequest q = HPU__STATUS_REQUEST__INIT;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_STATUS_REQUEST;
	env.status_request = &q;
	return sign_env(c, &env, skew_ms, len);
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

/* Asks hpud for its instance id, under c's session. */
static void client_hello(client *c)
{
	Hpu__Hello h = HPU__HELLO__INIT;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_HELLO;
	env.hello = &h;
	size_t len;
	uint8_t *frame = sign_env(c, &env, 0, &len);
	zmq_send(c->sock, frame, len, 0);
	free(frame);
	Hpu__Envelope *r = await_reply(c, 5000);
	assert_non_null(r);
	assert_int_equal(r->msg_case, HPU__ENVELOPE__MSG_HELLO_REPLY);
	assert_string_equal(r->session, c->session);
	snprintf(c->instance, sizeof c->instance, "%s", r->hello_reply->instance);
	hpu_codec_free(r);
	assert_int_equal(strlen(c->instance), HPU_AUTH_ID_HEX);
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

/* hpud -c conf --check; its exit code, its output printed and in *p. */
static int check_conf(proc *p, const char *conf)
{
	char *argv[] = {(char *)HPUD, "-c", (char *)conf, "--check", NULL};
	int code = h_run(p, argv, NULL, 10000);
	printf("  %s", p->out);
	return code;
}

/* hpud -c conf --check refuses to start, naming `file` and saying `what`. */
static void assert_refused(const char *conf, const char *file, const char *what)
{
	proc p;
	int code = check_conf(&p, conf);
	if (code != 1 || !strstr(p.out, file) || !strstr(p.out, what))
		fail_msg("hpud -c %s --check exited %d; expected 1 and a message naming %s "
			 "with \"%s\"; it said:\n%s",
			 conf, code, file, what, p.out);
	h_free(&p);
}

/* Jobs cannot see or signal each other (issue 16, item 5): with
 * `job_uids`, every job's workers run as a uid of their own from the
 * range. Job isoa's worker looks up job isob's worker (both alive) and
 * tries to read its environment, where the job token is, and to signal
 * it: both are refused. The uids differ, lie in the range and are
 * nobody's; a range holding a user's uid is refused at start. */
static void test_jobs_isolated(void **state)
{
	(void)state;
	char flags[128], script[192], text[2048], path[256], line[256];
	snprintf(flags, sizeof flags, "%s/iso", dir);
	assert_int_equal(mkdir(flags, 0755), 0);
	assert_int_equal(chmod(flags, 01777), 0); /* the jobs' uids write here */
	snprintf(script, sizeof script, "%s/iso-worker.sh", dir);
	snprintf(text, sizeof text,
		 "#!/bin/sh\n"
		 "F=%s\n"
		 "echo \"$(id -u) $$\" > $F/.who.$HPU_JOB_ID && mv $F/.who.$HPU_JOB_ID $F/who.$HPU_JOB_ID\n"
		 "if [ \"$HPU_JOB_ID\" = isoa ]; then\n"
		 "  while [ ! -e $F/who.isob ]; do sleep 0.05; done\n"
		 "  read u p < $F/who.isob\n"
		 "  if cat /proc/$p/environ > /dev/null 2>&1; then e=read; else e=denied; fi\n"
		 "  if kill -0 $p 2> /dev/null; then k=signalled; else k=denied; fi\n"
		 "  echo \"environ $e kill $k\" > $F/.result && mv $F/.result $F/result\n"
		 "else\n"
		 "  while [ ! -e $F/result ]; do sleep 0.05; done\n"
		 "fi\n"
		 "exec %s \"$@\"\n",
		 flags, h_build("bin/hpu-worker"));
	assert_int_equal(h_write_file(script, text, 0755), 0);
	/* A range that holds nobody's uid (65534) is refused. */
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = 2\nkey = %s\nuser = nobody\n"
		 "worker = %s\njob_uids = 65530-65535\n",
		 port, key_path, script);
	assert_int_equal(h_write_file(conf_path, text, 0644), 0);
	assert_refused(conf_path, "job_uids 65530-65535", "belongs to user 'nobody'");
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = 2\nkey = %s\nuser = nobody\n"
		 "log_level = info\nsubmitter_timeout = 600\nworker = %s\n"
		 "job_uids = 61000-61009\n",
		 port, key_path, script);
	assert_int_equal(h_write_file(conf_path, text, 0644), 0);
	start_daemon();
	proc p[2];
	const char *ids[2] = {"isob", "isoa"};
	for (int i = 0; i < 2; i++) {
		char *a[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path,
			     "--job-id", (char *)ids[i], "--devices", "1", "--max-steps", "2",
			     "--log-every", "0", "--no-eval", (char *)MODEL, "--", "--hidden",
			     "16", NULL};
		assert_int_equal(h_start(&p[i], a, NULL), 0);
	}
	for (int i = 0; i < 2; i++) {
		assert_int_equal(h_wait(&p[i], 120000), 0);
		printf("%s", p[i].out);
		assert_int_equal(h_code(&p[i]), 0);
		h_free(&p[i]);
	}
	unsigned uid[2];
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof path, "%s/who.%s", flags, ids[i]);
		FILE *f = fopen(path, "r");
		assert_non_null(f);
		assert_int_equal(fscanf(f, "%u", &uid[i]), 1);
		fclose(f);
		printf("  job %s ran as uid %u\n", ids[i], uid[i]);
		assert_true(uid[i] >= 61000 && uid[i] <= 61009);
	}
	assert_int_not_equal(uid[0], uid[1]);
	snprintf(path, sizeof path, "%s/result", flags);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	assert_non_null(fgets(line, sizeof line, f));
	fclose(f);
	printf("  job isoa on job isob's worker: %s", line);
	assert_string_equal(line, "environ denied kill denied\n");
	stop_daemon();
	write_conf(2, NULL);
}

/* hpud trusts no file that someone else could have written (as sshd's
 * StrictModes): the configuration, the key, the worker program and every
 * directory above them belong to root (or hpud's own user) and are not
 * writable by group or others; a root-owned sticky directory (/tmp, where
 * these files are) is fine. The attack of the review: a configuration of
 * mode 0666 saying `user = root`, with a key and a worker program owned by
 * nobody. A reload (SIGHUP) is refused the same way. */
static void test_untrusted_files(void **state)
{
	(void)state;
	const uid_t nobody = 65534;
	const gid_t same = (gid_t)-1;
	char sub[128], conf[192], key2[192], worker[192], text[1024];
	snprintf(sub, sizeof sub, "%s/trust", dir);
	assert_int_equal(mkdir(sub, 0755), 0);
	snprintf(conf, sizeof conf, "%s/hpud.conf", sub);
	snprintf(key2, sizeof key2, "%s/secret.key", sub);
	snprintf(worker, sizeof worker, "%s/worker.sh", sub);
	char *k = h_slurp(key_path);
	assert_non_null(k);
	assert_int_equal(h_write_file(key2, k, 0600), 0);
	free(k);
	snprintf(text, sizeof text, "#!/bin/sh\nexec %s \"$@\"\n", h_build("bin/hpu-worker"));
	assert_int_equal(h_write_file(worker, text, 0755), 0);
	snprintf(text, sizeof text, "listen = 127.0.0.1\nport = %d\nkey = %s\nuser = root\nworker = %s\n",
		 port, key2, worker);
	assert_int_equal(h_write_file(conf, text, 0644), 0);
	proc p;
	assert_int_equal(check_conf(&p, conf), 0); /* all root's: fine */
	h_free(&p);

	/* the attack: everything writable by nobody */
	assert_int_equal(chmod(conf, 0666), 0);
	assert_int_equal(chown(key2, nobody, same), 0);
	assert_int_equal(chown(worker, nobody, same), 0);
	assert_refused(conf, conf, "writable by group or others (mode 0666)");
	assert_int_equal(chmod(conf, 0644), 0);
	assert_int_equal(chown(conf, nobody, same), 0);
	assert_refused(conf, conf, "owned by uid 65534");
	assert_int_equal(chown(conf, 0, same), 0);
	assert_refused(conf, key2, "owned by uid 65534");
	assert_int_equal(chown(key2, 0, same), 0);
	assert_refused(conf, worker, "owned by uid 65534");
	assert_int_equal(chown(worker, 0, same), 0);
	assert_int_equal(chmod(worker, 0775), 0);
	assert_refused(conf, worker, "writable by group or others (mode 0775)");
	assert_int_equal(chmod(worker, 0755), 0);

	/* the directory above them */
	assert_int_equal(chown(sub, nobody, same), 0);
	assert_refused(conf, sub, "owned by uid 65534");
	assert_int_equal(chmod(sub, 01777), 0); /* sticky, but nobody's */
	assert_refused(conf, sub, "owned by uid 65534");
	assert_int_equal(chown(sub, 0, same), 0);
	assert_int_equal(chmod(sub, 0777), 0);
	assert_refused(conf, sub, "writable by group or others (mode 0777)");
	assert_int_equal(chmod(sub, 01777), 0); /* root's and sticky, like /tmp */
	assert_int_equal(check_conf(&p, conf), 0);
	h_free(&p);
	assert_int_equal(chmod(sub, 0755), 0);

	/* a reload of a configuration others may write is refused */
	start_daemon();
	assert_int_equal(chmod(conf_path, 0666), 0);
	kill(daemon_proc.pid, SIGHUP);
	int refused = h_wait_for(&daemon_proc, "reload refused", 5000);
	assert_int_equal(chmod(conf_path, 0644), 0);
	printf("  %s", refused == 0 ? strstr(daemon_proc.out, "reload refused") : daemon_proc.out);
	assert_int_equal(refused, 0);
	assert_non_null(strstr(strstr(daemon_proc.out, "reload refused"), conf_path));
	kill(daemon_proc.pid, SIGHUP);
	assert_int_equal(h_wait_for(&daemon_proc, "configuration reloaded", 5000), 0);
	stop_daemon();
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
	/* truncated: within the header, then a few in the body (few enough
	 * that hpud logs every kind in its 20 refusals a second) */
	for (size_t k = 0; k < len; k += k < HPU_AUTH_HEADER ? 7 : 40)
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
	char dirp[64], link[320], target[512];
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

/* ---- a signed request is bound to one hpud instance ---- */

/* A signed launch request as hpulaunch --hostfile sends it (for the
 * instance of hpud c said hello to): one node, one device, a long run of
 * the model. */
static uint8_t *launch_frame(client *c, const char *job_id, size_t *len)
{
	char *argv[] = {"--max-steps", "100000", "--log-every", "0", "--no-eval",
			(char *)MODEL, "--", "--hidden", "16"};
	Hpu__LaunchRequest q = HPU__LAUNCH_REQUEST__INIT;
	q.job_id = (char *)job_id;
	q.job_token = "replayed-token";
	q.node_rank = 0;
	q.nodes = 1;
	q.devices = 1;
	q.master_addr = "127.0.0.1";
	q.n_argv = sizeof argv / sizeof *argv;
	q.argv = argv;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_LAUNCH_REQUEST;
	env.launch_request = &q;
	return sign_env(c, &env, 0, len);
}

/* Sends a captured frame on a fresh connection to the hpud on port p;
 * returns whether a launch reply that says ok came back. */
static int replay_to(int p, const uint8_t *frame, size_t len)
{
	client c;
	client_open_port(&c, key, p);
	zmq_send(c.sock, frame, len, 0);
	Hpu__Envelope *r = await_reply(&c, 3000);
	int ok = r && r->msg_case == HPU__ENVELOPE__MSG_LAUNCH_REPLY && r->launch_reply->ok;
	hpu_codec_free(r);
	client_close(&c);
	return ok;
}

/* A signed launch captured on the wire starts nothing on a second hpud
 * with the same key (another port), nor on its own hpud after a restart:
 * both refuse it and log why. */
static void test_launch_bound_to_instance(void **state)
{
	(void)state;
	char conf2[160], text[512];
	int port2 = h_free_port();
	snprintf(conf2, sizeof conf2, "%s/second.conf", dir);
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = 2\nkey = %s\nuser = nobody\n"
		 "log_level = info\nsubmitter_timeout = 3\n",
		 port2, key_path);
	assert_int_equal(h_write_file(conf2, text, 0644), 0);
	start_daemon();
	proc b;
	char *argv[] = {(char *)HPUD, "-c", conf2, NULL};
	char *env[] = {"HPUCOLL_TIMEOUT_MS=10000", NULL};
	assert_int_equal(h_start(&b, argv, env), 0);
	assert_int_equal(h_wait_for(&b, "listening on", 10000), 0);

	/* the submitter's frame for hpud A, captured */
	client a;
	client_open(&a, key);
	size_t len;
	uint8_t *f = launch_frame(&a, "captured-job", &len);
	/* it starts the job on A */
	zmq_send(a.sock, f, len, 0);
	Hpu__Envelope *r = await_reply(&a, 10000);
	assert_non_null(r);
	assert_int_equal(r->msg_case, HPU__ENVELOPE__MSG_LAUNCH_REPLY);
	if (!r->launch_reply->ok)
		fail_msg("hpud refused the genuine launch: %s", r->launch_reply->error);
	hpu_codec_free(r);
	client_close(&a);
	pid_t kids[4];
	assert_int_equal(h_children(daemon_proc.pid, kids, 4), 1);

	/* replayed to B, which has the same key */
	int on_b = replay_to(port2, f, len);
	h_wait(&b, 300);
	int b_kids = h_children(b.pid, kids, 4);
	/* replayed to A after a restart (its job ended with it) */
	stop_daemon();
	start_daemon();
	int on_a = replay_to(port, f, len);
	h_wait(&daemon_proc, 300);
	int a_kids = h_children(daemon_proc.pid, kids, 4);
	free(f);
	printf("  the captured launch replayed: to a second hpud %s (%d workers), "
	       "to the restarted hpud %s (%d workers)\n",
	       on_b ? "STARTED THE JOB" : "refused", b_kids, on_a ? "STARTED THE JOB" : "refused",
	       a_kids);
	const char *why = "signed for another hpud or before a restart";
	int b_logged = strstr(b.out, why) != NULL, a_logged = strstr(daemon_proc.out, why) != NULL;
	printf("  hpud B %s, the restarted hpud A %s \"%s\"\n", b_logged ? "logged" : "did not log",
	       a_logged ? "logged" : "did not log", why);
	const char *line = strstr(b.out, "refused a request");
	if (line)
		printf("  hpud B: %.*s\n", (int)strcspn(line, "\n"), line);
	kill(b.pid, SIGTERM);
	if (h_wait(&b, 15000) < 0)
		h_kill(&b);
	h_free(&b);
	assert_false(on_b);
	assert_int_equal(b_kids, 0);
	assert_false(on_a);
	assert_int_equal(a_kids, 0);
	assert_true(b_logged);
	assert_true(a_logged);
	assert_int_equal(jobs_running(), 0);
	stop_daemon();
}

/* ---- a chatty model ---- */

/* A model that prints as fast as it can (2 ranks x 40 steps x 1000 lines,
 * more frames than the submitter's old replay cache took in its 30 s
 * window: it filled, every later frame was dropped, and the job failed
 * with "lost contact ... silent for 10 s") trains to the end: nothing is
 * dropped as a replay, the submitter never loses contact and says nothing
 * of a replay cache. How many lines arrive is hpud's output queue's
 * business (output_buffer); test_submitter_takes_a_flood sends more than
 * 65536 frames whatever hpud's pace. */
static void test_chatty_job(void **state)
{
	(void)state;
	start_daemon();
	char *argv[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path,
			"--devices", "2", "--max-steps", "40", "--log-every", "0",
			"--no-eval", (char *)MODEL, "--", "--hidden", "16",
			"--print-lines", "1000", NULL};
	proc p;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int code = h_run(&p, argv, NULL, 180000);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	long lines = 0, cache_full = 0;
	for (const char *s = p.out; (s = strstr(s, "] chatter rank ")); s++)
		lines++;
	for (const char *s = p.out; (s = strstr(s, "replay cache full")); s++)
		cache_full++;
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
	printf("  exit %d after %.1f s: %ld of 80000 lines (%.0f/s), %ld 'replay cache full' "
	       "warnings\n",
	       code, secs, lines, lines / secs, cache_full);
	const char *err = strstr(p.out, "hpulaunch: error");
	if (err)
		printf("  %.300s\n", err);
	assert_int_equal(cache_full, 0);
	assert_null(strstr(p.out, "lost contact"));
	assert_int_equal(code, 0);
	/* the last line, unless it went with the lines hpud dropped past
	 * output_buffer (then a notice says how many) */
	assert_true(strstr(p.out, "[rank 0] trained 40 steps") ||
		    strstr(p.out, "[rank 0] hpud: dropped "));
	assert_true(lines > 0);
	h_free(&p);
	stop_daemon();
}

/* ---- the submitter's side of the binding, against a fake hpud ---- */

typedef struct fake {
	void *ctx, *sock;
	hpu_auth *auth;
	uint8_t id[256]; /* hpulaunch's routing id */
	size_t idlen;
} fake;

/* The next request to the fake hpud, verified, or NULL (nothing within
 * 10 s, or not genuine). No cmocka assertion: the flood test calls it
 * from a thread. */
static Hpu__Envelope *fake_recv(fake *f)
{
	static uint8_t buf[HPU_AUTH_MAX_FRAME];
	zmq_pollitem_t it = {.socket = f->sock, .events = ZMQ_POLLIN};
	if (zmq_poll(&it, 1, 10000) <= 0)
		return NULL;
	int n = zmq_recv(f->sock, f->id, sizeof f->id, 0);
	if (n <= 0 || n > (int)sizeof f->id)
		return NULL;
	f->idlen = (size_t)n;
	n = zmq_recv(f->sock, buf, sizeof buf, 0);
	const void *body;
	size_t blen;
	if (n <= 0 || n > (int)sizeof buf ||
	    hpu_auth_verify(f->auth, buf, (size_t)n, hpu_auth_now_ms(), &body, &blen, NULL, 0) < 0)
		return NULL;
	return hpu_codec_unpack(body, blen);
}

/* env signed as hpud signs it; *len gets the frame's size. */
static uint8_t *fake_sign(fake *f, Hpu__Envelope *env, const char *instance,
			  const char *session, uint64_t seq, size_t *len)
{
	env->instance = (char *)instance;
	env->session = (char *)session;
	env->seq = seq;
	uint8_t *body = NULL, *frame = NULL;
	size_t blen = hpu_codec_pack(env, &body);
	*len = body ? hpu_auth_sign(f->auth, body, blen, hpu_auth_now_ms(), &frame) : 0;
	free(body);
	return frame; /* NULL only without memory */
}

/* Sends a frame to hpulaunch (waiting for room); 0, or -1 when it is
 * gone. */
static int fake_put(fake *f, const void *frame, size_t len)
{
	if (!frame || zmq_send(f->sock, f->id, f->idlen, ZMQ_SNDMORE) < 0)
		return -1;
	return zmq_send(f->sock, frame, len, 0) < 0 ? -1 : 0;
}

/* A fake hpud on 127.0.0.1:p, with the cluster's key. Its sends wait for
 * room (up to 20 s) rather than drop (ZMQ_ROUTER_MANDATORY). */
static void fake_open(fake *f, int p)
{
	char ep[64];
	int one = 1, hwm = 100000, wait_ms = 20000;
	snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", p);
	memset(f, 0, sizeof *f);
	f->ctx = zmq_ctx_new();
	f->sock = zmq_socket(f->ctx, ZMQ_ROUTER);
	zmq_setsockopt(f->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
	zmq_setsockopt(f->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
	zmq_setsockopt(f->sock, ZMQ_SNDTIMEO, &wait_ms, sizeof wait_ms);
	assert_int_equal(zmq_bind(f->sock, ep), 0);
	f->auth = hpu_auth_new(key, 30000, 1 << 16);
}

static void fake_close(fake *f)
{
	int zero = 0;
	zmq_setsockopt(f->sock, ZMQ_LINGER, &zero, sizeof zero);
	zmq_close(f->sock);
	zmq_ctx_term(f->ctx);
	hpu_auth_destroy(&f->auth);
}

/* hpulaunch --status against a fake hpud that answers with frames hpud
 * never sends to it: a reply for another session, a replayed reply (an
 * old sequence number), one from another instance, then 3000 garbage
 * frames. The submitter drops each, warning of at most 5 a second and
 * summing up the rest in one line, and takes the genuine reply after
 * them; its requests name the instance and session of the hello. */
static void test_submitter_refuses_replays(void **state)
{
	(void)state;
	fake f;
	int fport = h_free_port();
	char target[64];
	snprintf(target, sizeof target, "127.0.0.1:%d", fport);
	fake_open(&f, fport);
	proc p;
	char *argv[] = {(char *)LAUNCH, "--status", target, "--key", key_path, NULL};
	assert_int_equal(h_start(&p, argv, NULL), 0);

	Hpu__Envelope *q = fake_recv(&f);
	assert_non_null(q);
	assert_int_equal(q->msg_case, HPU__ENVELOPE__MSG_HELLO);
	char session[64], other[HPU_AUTH_ID_HEX + 1];
	snprintf(session, sizeof session, "%s", q->session);
	assert_int_equal(strlen(session), HPU_AUTH_ID_HEX);
	hpu_codec_free(q);
	assert_int_equal(hpu_auth_random_id(other), 0);
	const char *instance = "0123456789abcdef0123456789abcdef";
	Hpu__HelloReply hr = HPU__HELLO_REPLY__INIT;
	hr.instance = (char *)instance;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_HELLO_REPLY;
	env.hello_reply = &hr;
	size_t len;
	uint8_t *fr = fake_sign(&f, &env, instance, other, 9, &len); /* another session */
	assert_int_equal(fake_put(&f, fr, len), 0);
	free(fr);
	uint8_t *hello = fake_sign(&f, &env, instance, session, 10, &len);
	assert_int_equal(fake_put(&f, hello, len), 0);

	q = fake_recv(&f);
	assert_non_null(q);
	assert_int_equal(q->msg_case, HPU__ENVELOPE__MSG_STATUS_REQUEST);
	assert_string_equal(q->instance, instance);
	assert_string_equal(q->session, session);
	hpu_codec_free(q);
	assert_int_equal(fake_put(&f, hello, len), 0); /* replayed: seq 10 again */
	free(hello);
	Hpu__StatusReply sr = HPU__STATUS_REPLY__INIT;
	sr.devices_total = 7;
	sr.devices_free = 7;
	env.msg_case = HPU__ENVELOPE__MSG_STATUS_REPLY;
	env.status_reply = &sr;
	fr = fake_sign(&f, &env, other, session, 20, &len); /* another instance */
	assert_int_equal(fake_put(&f, fr, len), 0);
	free(fr);
	uint8_t junk[200];
	for (int i = 0; i < 3000; i++) {
		for (size_t k = 0; k < sizeof junk; k++)
			junk[k] = (uint8_t)rnd();
		memcpy(junk, "HPU1", 4);
		assert_int_equal(fake_put(&f, junk, sizeof junk), 0);
	}
	fr = fake_sign(&f, &env, instance, session, 11, &len); /* the genuine one */
	assert_int_equal(fake_put(&f, fr, len), 0);
	free(fr);

	assert_int_equal(h_wait(&p, 20000), 0);
	printf("%s", p.out);
	int warned = 0;
	for (const char *s = p.out; (s = strstr(s, "hpulaunch: warning: dropped")); s++)
		warned++;
	printf("  %d warnings shown for 3003 frames dropped\n", warned);
	assert_int_equal(h_code(&p), 0);
	assert_non_null(strstr(p.out, "7 devices, 7 free"));
	assert_non_null(strstr(p.out, "not for this session"));
	assert_non_null(strstr(p.out, "replayed or out of order (seq 10, the last was 10)"));
	assert_non_null(strstr(p.out, "from another hpud instance"));
	assert_non_null(strstr(p.out, "more messages dropped (not shown)"));
	assert_true(warned >= 5 && warned <= 15);
	h_free(&p);
	fake_close(&f);
}

#define FLOOD_LINES 100000

/* The fake hpud's side of a job: it answers hello and the launch, then
 * streams FLOOD_LINES output lines as fast as it signs them and the job's
 * end. Runs in a thread, while the test reads hpulaunch's output; returns
 * NULL, or what went wrong. */
static void *fake_flood(void *arg)
{
	fake *f = arg;
	Hpu__Envelope *q = fake_recv(f);
	if (!q || q->msg_case != HPU__ENVELOPE__MSG_HELLO)
		return "no hello";
	char session[64], job_id[64];
	snprintf(session, sizeof session, "%s", q->session);
	hpu_codec_free(q);
	const char *instance = "00112233445566778899aabbccddeeff";
	uint64_t seq = 0;
	size_t len;
	uint8_t *fr;
	Hpu__HelloReply hr = HPU__HELLO_REPLY__INIT;
	hr.instance = (char *)instance;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_HELLO_REPLY;
	env.hello_reply = &hr;
	fr = fake_sign(f, &env, instance, session, ++seq, &len);
	int bad = fake_put(f, fr, len);
	free(fr);
	if (bad < 0)
		return "hpulaunch went away";
	if (!(q = fake_recv(f)) || q->msg_case != HPU__ENVELOPE__MSG_LAUNCH_REQUEST ||
	    strcmp(q->instance, instance) || strcmp(q->session, session)) {
		hpu_codec_free(q);
		return "no launch request naming the instance and session";
	}
	snprintf(job_id, sizeof job_id, "%s", q->launch_request->job_id);
	hpu_codec_free(q);
	Hpu__LaunchReply lr = HPU__LAUNCH_REPLY__INIT;
	lr.job_id = job_id;
	lr.ok = 1;
	lr.master_port = 29999;
	env.msg_case = HPU__ENVELOPE__MSG_LAUNCH_REPLY;
	env.launch_reply = &lr;
	fr = fake_sign(f, &env, instance, session, ++seq, &len);
	bad = fake_put(f, fr, len);
	free(fr);
	if (bad < 0)
		return "hpulaunch went away";
	char text[64];
	Hpu__LogLine ll = HPU__LOG_LINE__INIT;
	ll.job_id = job_id;
	ll.text = text;
	env.msg_case = HPU__ENVELOPE__MSG_LOG_LINE;
	env.log_line = &ll;
	for (int i = 0; i < FLOOD_LINES; i++) {
		ll.rank = (uint32_t)(i % 2);
		snprintf(text, sizeof text, "flood line %d", i);
		fr = fake_sign(f, &env, instance, session, ++seq, &len);
		bad = fake_put(f, fr, len);
		free(fr);
		if (bad < 0)
			return "hpulaunch went away";
	}
	Hpu__JobEnd je = HPU__JOB_END__INIT;
	je.job_id = job_id;
	je.ok = 1;
	je.reason = "";
	env.msg_case = HPU__ENVELOPE__MSG_JOB_END;
	env.job_end = &je;
	fr = fake_sign(f, &env, instance, session, ++seq, &len);
	bad = fake_put(f, fr, len);
	free(fr);
	return bad < 0 ? "hpulaunch went away" : NULL;
}

/* hpulaunch --hostfile against a fake hpud that streams 100000 output
 * lines as fast as it can sign them, well past the 65536 nonces in 30 s
 * that the submitter's replay cache used to hold: the submitter takes
 * every line, in order, warns of nothing and exits 0. */
static void test_submitter_takes_a_flood(void **state)
{
	(void)state;
	fake f;
	int fport = h_free_port();
	char hf[160], text[64];
	snprintf(hf, sizeof hf, "%s/hostfile-fake", dir);
	snprintf(text, sizeof text, "127.0.0.1:%d slots=1\n", fport);
	assert_int_equal(h_write_file(hf, text, 0644), 0);
	fake_open(&f, fport);
	proc p;
	char *argv[] = {(char *)LAUNCH, "--hostfile", hf, "--key", key_path, "--devices", "1",
			(char *)MODEL, NULL};
	assert_int_equal(h_start(&p, argv, NULL), 0);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, fake_flood, &f), 0);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int exited = h_wait(&p, 60000) == 0;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	void *res;
	if (!exited)
		h_kill(&p); /* the thread's sends then fail, and it ends */
	pthread_join(t, &res);
	long lines = 0, in_order = 1;
	const char *s = p.out;
	char want[64];
	for (int i = 0; i < FLOOD_LINES && in_order; i++) {
		snprintf(want, sizeof want, "[rank %d] flood line %d\n", i % 2, i);
		const char *at = strstr(s, want);
		if (at) {
			lines++;
			s = at + strlen(want);
		} else {
			in_order = 0;
		}
	}
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
	printf("  exit %d after %.1f s: %ld of %d lines, in order; the fake hpud: %s\n",
	       exited ? h_code(&p) : -1, secs, lines, FLOOD_LINES,
	       res ? (const char *)res : "all sent");
	const char *warn = strstr(p.out, "hpulaunch: warning");
	const char *err = strstr(p.out, "hpulaunch: error");
	if (warn || err)
		printf("  %.300s\n", warn ? warn : err);
	assert_null(res);
	assert_true(exited);
	assert_int_equal(h_code(&p), 0);
	assert_int_equal(lines, FLOOD_LINES);
	assert_null(warn);
	h_free(&p);
	fake_close(&f);
	unlink(hf);
}

/* A submitter stopped (SIGSTOP) while its job prints 8 KB lines as fast
 * as it can (2 ranks x 8000 of them, 128 MB): hpud holds at most
 * output_buffer (4 MiB by default) of the job's output, drops the rest
 * and, once the submitter reads again (SIGCONT), tells it how much per
 * rank; then the job's output comes through again, and the job trains to
 * the end. The worker program is a script that waits for the submitter
 * to be stopped, prints, waits for it to have caught up, and then runs
 * hpu-worker. */
static void test_stopped_submitter_output_bounded(void **state)
{
	(void)state;
	enum { LINES = 8000 };
	char flags[128], go[160], go2[160], done[2][160], script[192], text[1536];
	snprintf(flags, sizeof flags, "%s/flags", dir);
	assert_int_equal(mkdir(flags, 0755), 0);
	assert_int_equal(chown(flags, 65534, (gid_t)-1), 0); /* the workers are nobody */
	snprintf(go, sizeof go, "%s/go", flags);
	snprintf(go2, sizeof go2, "%s/go2", flags);
	for (int r = 0; r < 2; r++)
		snprintf(done[r], sizeof done[r], "%s/printed.%d", flags, r);
	snprintf(script, sizeof script, "%s/loud-worker.sh", dir);
	snprintf(text, sizeof text,
		 "#!/bin/sh\n"
		 "while [ ! -e %s ]; do sleep 0.05; done\n"
		 "yes \"$RANK $(printf '%%7998s' '' | tr ' ' x)\" | head -n %d\n"
		 "touch %s/printed.$RANK\n"
		 "while [ ! -e %s ]; do sleep 0.05; done\n"
		 "exec %s \"$@\"\n",
		 go, LINES, flags, go2, h_build("bin/hpu-worker"));
	assert_int_equal(h_write_file(script, text, 0755), 0);
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = 2\nkey = %s\nuser = nobody\n"
		 "log_level = info\nsubmitter_timeout = 600\nworker = %s\n",
		 port, key_path, script);
	assert_int_equal(h_write_file(conf_path, text, 0644), 0);
	start_daemon();
	long base = rss_kib(daemon_proc.pid);
	char *argv[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path,
			"--devices", "2", "--max-steps", "2", "--log-every", "0",
			"--no-eval", (char *)MODEL, "--", "--hidden", "16", NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	if (h_wait_for(&p, "through hpud", 60000) < 0)
		fail_msg("the job did not start:\n%s\nhpud:\n%s", p.out, daemon_proc.out);
	assert_int_equal(kill(p.pid, SIGSTOP), 0);
	assert_int_equal(h_write_file(go, "", 0644), 0);
	int printed = 0;
	for (int i = 0; i < 3000 && !printed; i++) { /* a loaded machine: 300 s */
		h_wait(&daemon_proc, 100);
		printed = access(done[0], F_OK) == 0 && access(done[1], F_OK) == 0;
	}
	jobs_running(); /* hpud has read what was left in the pipes */
	h_wait(&daemon_proc, 200);
	long peak = proc_status(daemon_proc.pid, "VmHWM:");
	printf("  hpud RSS %ld KiB before the job, peak %ld KiB with the submitter stopped "
	       "(%d lines of 8000 bytes printed)\n",
	       base, peak, printed ? 2 * LINES : -1);
	kill(p.pid, SIGCONT);
	assert_true(printed);
	assert_true(base > 0 && peak > 0);
	/* 4 MiB queued, 64 messages in ZeroMQ's queue, malloc's slack; without
	 * a bound: > 128 MiB. AddressSanitizer's quarantine keeps freed frames. */
#ifdef __SANITIZE_ADDRESS__
	assert_true(peak - base < 64 * 1024);
#else
	assert_true(peak - base < 16 * 1024);
#endif
	/* caught up: the notices, one per rank */
	int told = h_wait_for(&p, "[rank 0] hpud: dropped ", 120000) == 0 &&
		   h_wait_for(&p, "[rank 1] hpud: dropped ", 120000) == 0;
	for (int r = 0; r < 2; r++) {
		char want[32];
		snprintf(want, sizeof want, "[rank %d] hpud: dropped ", r);
		const char *s = strstr(p.out, want);
		printf("  %.*s\n", s ? (int)strcspn(s, "\n") : 0, s ? s : "");
	}
	if (!told)
		fail_msg("no notice of the dropped output; the submitter's last words:\n%s",
			 p.len > 2000 ? p.out + p.len - 2000 : p.out);
	assert_int_equal(h_write_file(go2, "", 0644), 0); /* the job goes on */
	assert_int_equal(h_wait(&p, 300000), 0);
	assert_int_equal(h_code(&p), 0);
	if (!strstr(p.out, "[rank 0] trained 2 steps"))
		fail_msg("no '[rank 0] trained 2 steps'; the submitter's last words:\n%s",
			 p.len > 2000 ? p.out + p.len - 2000 : p.out);
	h_free(&p);
	h_wait(&daemon_proc, 500);
	assert_non_null(strstr(daemon_proc.out, "ended successfully"));
	stop_daemon();
	write_conf(2, NULL);
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
		cmocka_unit_test(test_untrusted_files),
		cmocka_unit_test(test_bad_requests),
		cmocka_unit_test(test_job_through_hostfile),
		cmocka_unit_test(test_job_env_forwarded),
		cmocka_unit_test(test_busy_status_and_lost_submitter),
		cmocka_unit_test(test_cancel_term_and_reload),
		cmocka_unit_test(test_workers_die_with_hpud),
		cmocka_unit_test(test_concurrent_jobs_leave_nothing),
		cmocka_unit_test(test_restart_through_hostfile),
		cmocka_unit_test(test_launch_bound_to_instance),
		cmocka_unit_test(test_chatty_job),
		cmocka_unit_test(test_submitter_refuses_replays),
		cmocka_unit_test(test_submitter_takes_a_flood),
		cmocka_unit_test(test_stopped_submitter_output_bounded),
		cmocka_unit_test(test_jobs_isolated),
	};
	if (getenv("HPU_TEST_FILTER")) /* e.g. "test_chatty*": run just those */
		cmocka_set_test_filter(getenv("HPU_TEST_FILTER"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
