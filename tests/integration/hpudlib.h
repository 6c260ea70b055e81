/* hpudlib: the harness of the hpud tests (test_hpud_*.c): a real hpud on
 * loopback with a fresh key, configuration and hostfile in a temporary
 * directory, and a raw client that speaks hpud's signed frames. cmocka
 * assertions inside. */
#ifndef HPU_TEST_HPUDLIB_H
#define HPU_TEST_HPUDLIB_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sys/types.h>

#include "proto/auth.h"
#include "proto/codec.h"
#include "tests/harness.h"

#define HPUD h_build("bin/hpud")
#define LAUNCH h_build("bin/hpulaunch")
#define MODEL h_build("lib/fmnist_mlp.so")
/* the MLP with the fault knobs (tests/fixtures/fault_mlp.c) */
#define FAULT_MODEL h_build("lib/fault_mlp.so")

/* What setup() made: the directory, the cluster's key (its file and its
 * bytes), hpud's configuration and a hostfile naming it (2 slots), the
 * port it listens on. daemon_proc is the hpud start_daemon() started. */
extern char dir[64], key_path[128], conf_path[128], hostfile[128];
extern int port;
extern proc daemon_proc;
extern uint8_t key[HPU_AUTH_KEY_BYTES];

/* Writes conf_path: 127.0.0.1:port, `devices` devices, the key, user
 * nobody, submitter_timeout 3 s, then the lines of `extra` (may be NULL). */
void write_conf(int devices, const char *extra);

/* hpud -c conf_path in the background (after any left by a failed test);
 * waits until it listens. */
void start_daemon(void);

/* Ends hpud (SIGTERM, then SIGKILL after 15 s) if it still runs. */
void stop_daemon(void);

/* dir/NAME made for flag files that the workers (the user nobody) write
 * or that a worker script waits for; its path in out. */
void flags_dir(const char *name, char *out, size_t len);

/* hpulaunch --hostfile (2 devices, 2 steps, no evaluation, the MLP at
 * --hidden 16) started into p; returns once it says the job runs through
 * hpud (failing the test, with hpud's log, if not within 60 s). */
void start_small_job(proc *p);

/* cmocka group setup and teardown: the directory, a key from
 * hpud --gen-key, write_conf(2, NULL), the hostfile; and all of it gone. */
int hpud_setup(void **state);
int hpud_teardown(void **state);

/* Before cmocka_run_group_tests: 77 (and why, on stdout) when not root,
 * as the workers switch to the user nobody; else 0, having set the test
 * filter from HPU_TEST_FILTER (e.g. "test_chatty*": run just those). */
int hpud_test_init(const char *prog);

/* A raw client of hpud: a ZeroMQ DEALER with the signing state. */
typedef struct client {
	void *ctx, *sock;
	hpu_auth *auth;
	char session[HPU_AUTH_ID_HEX + 1]; /* ours, named by every request */
	char instance[64];                 /* hpud's, from its HelloReply */
} client;

/* A client of the hpud on port p; with the cluster's key, it says hello
 * (as hpulaunch does) so that its requests name hpud's instance. */
void client_open_port(client *c, const uint8_t *k, int p);
/* The same for the hpud on `port`. */
void client_open(client *c, const uint8_t *k);
void client_close(client *c);

/* env as c sends it: under c's session, for the instance c said hello
 * to ("" before), signed and stamped now + skew_ms; *len gets its size.
 * Caller frees. */
uint8_t *sign_env(client *c, Hpu__Envelope *env, int64_t skew_ms, size_t *len);

/* A signed status request stamped now + skew_ms; *len gets its size. */
uint8_t *status_frame(client *c, int64_t skew_ms, size_t *len);

/* The reply to a frame just sent, verified and unpacked, or NULL after
 * timeout_ms (or when it is not genuine). Free with hpu__codec_free. */
Hpu__Envelope *await_reply(client *c, int timeout_ms);

/* A fake hpud, for the submitter's side: a ZeroMQ ROUTER with the
 * cluster's key. */
typedef struct fake {
	void *ctx, *sock;
	hpu_auth *auth;
	uint8_t id[256]; /* hpulaunch's routing id */
	size_t idlen;
} fake;

/* A fake hpud on 127.0.0.1:p, with the cluster's key. Its sends wait for
 * room (up to 20 s) rather than drop (ZMQ_ROUTER_MANDATORY). */
void fake_open(fake *f, int p);
void fake_close(fake *f);

/* The next request to the fake hpud, verified, or NULL (nothing within
 * 10 s, or not genuine); f->id becomes its sender's. No cmocka
 * assertion: a thread may call it. Free with hpu__codec_free. */
Hpu__Envelope *fake_recv(fake *f);

/* env signed as hpud signs it (for `instance`, `session`, numbered seq);
 * *len gets the frame's size. NULL only without memory; caller frees. */
uint8_t *fake_sign(fake *f, Hpu__Envelope *env, const char *instance, const char *session,
		   uint64_t seq, size_t *len);

/* Sends a frame to the last sender (waiting for room); 0, or -1 when it
 * is gone. */
int fake_put(fake *f, const void *frame, size_t len);

/* The number of jobs hpud runs, from a status request. */
int jobs_running(void);

/* The number after `field` ("VmRSS:", "Uid:") in /proc/PID/status, or -1. */
long proc_status(pid_t pid, const char *field);

/* A process's resident set in KiB, or -1. */
long rss_kib(pid_t pid);

#endif
