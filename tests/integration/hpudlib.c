/* hpudlib: a real hpud on loopback and a raw client of it, for the hpud
 * tests (hpudlib.h). */
#include "tests/integration/hpudlib.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

char dir[64], key_path[128], conf_path[128], hostfile[128];
int port;
proc daemon_proc;
uint8_t key[HPU_AUTH_KEY_BYTES];

void write_conf(int devices, const char *extra)
{
	char text[1024];
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = %d\nkey = %s\nuser = nobody\n"
		 "log_level = info\nsubmitter_timeout = 3\n%s",
		 port, devices, key_path, extra ? extra : "");
	assert_int_equal(h_write_file(conf_path, text, 0644), 0);
}

void start_daemon(void)
{
	stop_daemon();
	char *argv[] = {(char *)HPUD, "-c", conf_path, NULL};
	char *env[] = {"HPUCOLL_TIMEOUT_MS=10000", NULL};
	assert_int_equal(h_start(&daemon_proc, argv, env), 0);
	assert_int_equal(h_wait_for(&daemon_proc, "listening on", 10000), 0);
}

void stop_daemon(void)
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

int hpud_setup(void **state)
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
	assert_int_equal(hpu__auth_load_key(key_path, key, err, sizeof err), 0);
	port = h_free_port();
	write_conf(2, NULL);
	char hf[128];
	snprintf(hf, sizeof hf, "127.0.0.1:%d slots=2\n", port);
	assert_int_equal(h_write_file(hostfile, hf, 0644), 0);
	return 0;
}

int hpud_teardown(void **state)
{
	(void)state;
	stop_daemon();
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

int hpud_test_init(const char *prog)
{
	if (geteuid() != 0) {
		printf("%s needs root (workers switch to the user nobody): skipped\n", prog);
		return 77;
	}
	if (getenv("HPU_TEST_FILTER")) /* e.g. "test_chatty*": run just those */
		cmocka_set_test_filter(getenv("HPU_TEST_FILTER"));
	return 0;
}

/* ---- a raw client ---- */

static void client_hello(client *c);

void client_open_port(client *c, const uint8_t *k, int p)
{
	char ep[64];
	snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", p);
	int linger = 0;
	c->ctx = zmq_ctx_new();
	c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
	zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
	assert_int_equal(zmq_connect(c->sock, ep), 0);
	c->auth = hpu__auth_new(k, 30000, 1 << 16);
	assert_int_equal(hpu__auth_random_id(c->session), 0);
	c->instance[0] = 0;
	if (!memcmp(k, key, sizeof key))
		client_hello(c);
}

void client_open(client *c, const uint8_t *k)
{
	client_open_port(c, k, port);
}

void client_close(client *c)
{
	zmq_close(c->sock);
	zmq_ctx_term(c->ctx);
	hpu__auth_destroy(&c->auth);
}

uint8_t *sign_env(client *c, Hpu__Envelope *env, int64_t skew_ms, size_t *len)
{
	env->instance = c->instance;
	env->session = c->session;
	uint8_t *body, *frame;
	size_t blen = hpu__codec_pack(env, &body);
	*len = hpu__auth_sign(c->auth, body, blen, hpu__auth_now_ms() + skew_ms, &frame);
	free(body);
	assert_true(*len > 0);
	return frame;
}

uint8_t *status_frame(client *c, int64_t skew_ms, size_t *len)
{
	Hpu__StatusRequest q = HPU__STATUS_REQUEST__INIT;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_STATUS_REQUEST;
	env.status_request = &q;
	return sign_env(c, &env, skew_ms, len);
}

Hpu__Envelope *await_reply(client *c, int timeout_ms)
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
	if (hpu__auth_verify(c->auth, zmq_msg_data(&m), zmq_msg_size(&m), hpu__auth_now_ms(),
			     &body, &blen, why, sizeof why) == 0)
		env = hpu__codec_unpack(body, blen);
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
	hpu__codec_free(r);
	assert_int_equal(strlen(c->instance), HPU_AUTH_ID_HEX);
}

int jobs_running(void)
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
	hpu__codec_free(r);
	client_close(&c);
	return n;
}

long proc_status(pid_t pid, const char *field)
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

long rss_kib(pid_t pid)
{
	return proc_status(pid, "VmRSS:");
}

/* ---- a fake hpud ---- */

Hpu__Envelope *fake_recv(fake *f)
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
	    hpu__auth_verify(f->auth, buf, (size_t)n, hpu__auth_now_ms(), &body, &blen, NULL, 0) < 0)
		return NULL;
	return hpu__codec_unpack(body, blen);
}

uint8_t *fake_sign(fake *f, Hpu__Envelope *env, const char *instance, const char *session,
		   uint64_t seq, size_t *len)
{
	env->instance = (char *)instance;
	env->session = (char *)session;
	env->seq = seq;
	uint8_t *body = NULL, *frame = NULL;
	size_t blen = hpu__codec_pack(env, &body);
	*len = body ? hpu__auth_sign(f->auth, body, blen, hpu__auth_now_ms(), &frame) : 0;
	free(body);
	return frame; /* NULL only without memory */
}

int fake_put(fake *f, const void *frame, size_t len)
{
	if (!frame || zmq_send(f->sock, f->id, f->idlen, ZMQ_SNDMORE) < 0)
		return -1;
	return zmq_send(f->sock, frame, len, 0) < 0 ? -1 : 0;
}

void fake_open(fake *f, int p)
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
	f->auth = hpu__auth_new(key, 30000, 1 << 16);
}

void fake_close(fake *f)
{
	int zero = 0;
	zmq_setsockopt(f->sock, ZMQ_LINGER, &zero, sizeof zero);
	zmq_close(f->sock);
	zmq_ctx_term(f->ctx);
	hpu__auth_destroy(&f->auth);
}

void flags_dir(const char *name, char *out, size_t len)
{
	snprintf(out, len, "%s/%s", dir, name);
	assert_int_equal(mkdir(out, 0755), 0);
	assert_int_equal(chown(out, 65534, (gid_t)-1), 0); /* the workers are nobody */
}

void start_small_job(proc *p)
{
	char *argv[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key_path,
			"--devices", "2", "--max-steps", "2", "--log-every", "0",
			"--no-eval", (char *)MODEL, "--", "--hidden", "16", NULL};
	assert_int_equal(h_start(p, argv, NULL), 0);
	if (h_wait_for(p, "through hpud", 60000) < 0)
		fail_msg("the job did not start:\n%s\nhpud:\n%s", p->out, daemon_proc.out);
}
