/* The data plane's authentication (collectives/secure.c), on real forked
 * ranks over TCP loopback.
 *
 * - auth and encrypt: while rank 0 and rank 1 run collectives, a stranger
 *   connects to rank 1's port and sends a forged ABORT (what ended a job
 *   before): without credentials, with a PLAIN proof made from a wrong
 *   secret, with a proof taken from the right job but replayed, and with a
 *   CURVE key of its own. Every collective still gives the right values,
 *   rank 1 counts each connection as refused, and no forged frame is read.
 * - none: the same forged ABORT ends rank 1's collective (the attack the
 *   modes above stop).
 * - ranks with different secrets fail at once, naming the rank that
 *   refused them, instead of waiting for the timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <openssl/hmac.h>
#include <zmq.h>

#include "collectives/comm_internal.h"
#include "tests/unit/coll_world.h"

/* What a stranger does to rank 1's receive socket. */
enum attack { BARE, WRONG_SECRET, REPLAY, OWN_CURVE_KEY, N_ATTACKS };

/* A proof rank 0 could give rank 1, made as secure.c documents it. */
static void real_proof(const char *secret, char user[64], char pass[65])
{
	static const char label[] = "hpucoll data plane v1";
	uint8_t key[32], mac[32], msg[6 + 8 + 16] = "plain";
	unsigned len = 32;

	HMAC(EVP_sha256(), secret, (int)strlen(secret),
	     (const uint8_t *)label, sizeof(label) - 1, key, &len);
	msg[10] = 1; /* src 0, dst 1, little-endian */
	memset(msg + 14, 0xab, 16);
	HMAC(EVP_sha256(), key, sizeof(key), msg, sizeof(msg), mac, &len);
	snprintf(user, 64, "0-%s", "abababababababababababababababab");
	for (int i = 0; i < 32; i++)
		snprintf(pass + 2 * i, 3, "%02x", mac[i]);
}

/* watch: a monitor of s's handshake, set up before s connects (set up
 * after, a quick handshake's event came before it and was missed: a
 * stranger let in read as refused after 10 s); handshake: waits until s
 * has finished its handshake (1) or failed it (0), and closes m. */
static void *watch(void *ctx, void *s)
{
	char ep[64];
	void *m = zmq_socket(ctx, ZMQ_PAIR);

	snprintf(ep, sizeof(ep), "inproc://handshake-%p", s);
	assert_int_equal(zmq_socket_monitor(s, ep,
					    ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
						    ZMQ_EVENT_HANDSHAKE_FAILED_AUTH),
			 0);
	assert_int_equal(zmq_connect(m, ep), 0);
	return m;
}

static int handshake(void *m, void *s)
{
	zmq_pollitem_t it = {.socket = m, .events = ZMQ_POLLIN};
	uint16_t ev = 0;
	zmq_msg_t f;

	if (zmq_poll(&it, 1, 10000) == 1) {
		zmq_msg_init(&f);
		if (zmq_msg_recv(&f, m, 0) >= 2)
			memcpy(&ev, zmq_msg_data(&f), sizeof(ev));
		zmq_msg_close(&f);
	}
	zmq_socket_monitor(s, NULL, 0);
	zmq_close(m);
	return ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
}

/* Connects to `ep` as `how` says and sends one forged ABORT; returns the
 * socket (closed by the caller, so that the connection stays while the
 * ranks run). */
static void *forge(void *ctx, const char *ep, enum attack how,
		   hpucoll_security sec, const char *secret)
{
	static const char why[] = "rank 1 ran out of memory (forged)";
	void *s = zmq_socket(ctx, ZMQ_PUSH);
	unsigned char b[HPUCOLL__HDR_SIZE];
	struct hpucoll__hdr h = {
		.magic = HPUCOLL__MAGIC,
		.src = 0,
		.seq = 1,
		.kind = HPUCOLL__ABORT,
		.arg = HPUCOLL_ENOMEM,
		.len = sizeof(why) - 1,
	};
	char pub[41], priv[41];
	int zero = 0;

	zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
	if (how == WRONG_SECRET || how == REPLAY) {
		/* A well-formed proof from another job's secret, or a
		 * proof of this job seen once already: a second socket
		 * presents the same one first, and is let in (silent). */
		char user[64], pass[65];

		real_proof(how == REPLAY ? secret : "a guess", user, pass);
		for (int i = how == REPLAY ? 0 : 1; i < 2; i++) {
			void *t = i ? s : zmq_socket(ctx, ZMQ_PUSH);

			zmq_setsockopt(t, ZMQ_LINGER, &zero, sizeof(zero));
			zmq_setsockopt(t, ZMQ_PLAIN_USERNAME, user,
				       strlen(user));
			zmq_setsockopt(t, ZMQ_PLAIN_PASSWORD, pass, 64);
			if (i == 0) {
				void *m = watch(ctx, t);

				zmq_connect(t, ep);
				/* Let in, unless PLAIN is not spoken. */
				assert_int_equal(handshake(m, t),
						 sec == HPUCOLL_SECURITY_AUTH);
				zmq_close(t);
			}
		}
	} else if (how == OWN_CURVE_KEY) {
		zmq_curve_keypair(pub, priv);
		/* It even knows a server key: its own. */
		zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, pub, 40);
		zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 40);
		zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, priv, 40);
	}
	zmq_connect(s, ep);
	hpucoll__hdr_encode(b, &h);
	zmq_send(s, b, sizeof(b), ZMQ_SNDMORE | ZMQ_DONTWAIT);
	zmq_send(s, why, sizeof(why) - 1, ZMQ_DONTWAIT);
	return s;
}

static int all_reduce_ok(hpucoll_comm *c, int round)
{
	float x[1000], want = 0;
	int ws = hpucoll_comm_size(c), rc;

	for (int r = 0; r < ws; r++)
		want += (float)(r + round);
	for (int i = 0; i < 1000; i++)
		x[i] = (float)(hpucoll_comm_rank(c) + round);
	rc = hpucoll_all_reduce(c, x, x, 1000, HPUCOLL_F32, HPUCOLL_SUM);
	if (rc != HPUCOLL_OK)
		return cw_fail_rc(c, "all_reduce", rc);
	for (int i = 0; i < 1000; i++) {
		if (x[i] != want) {
			fprintf(stderr, "rank %d: x[%d] = %g, want %g\n",
				hpucoll_comm_rank(c), i, x[i], want);
			return 1;
		}
	}
	return 0;
}

/* Rank 0 attacks rank 1 between collectives; rank 1 waits until it has
 * refused every stranger. */
static int under_attack(hpucoll_comm *c, struct shared *sh,
			const struct world *w)
{
	int me = hpucoll_comm_rank(c), n = 0, rc = 0;
	void *ctx = zmq_ctx_new(), *socks[N_ATTACKS];
	hpucoll_stats st;

	if (me == 0) {
		for (int a = 0; a < N_ATTACKS; a++)
			if (w->sec == HPUCOLL_SECURITY_ENCRYPT || a != OWN_CURVE_KEY)
				socks[n++] = forge(ctx, sh->eps.ep[1], a,
						   w->sec, w->secret);
	}
	for (int round = 0; round < 3 && rc == 0; round++)
		rc = all_reduce_ok(c, round);
	if (rc == 0 && me == 1) {
		int64_t end = ct_now_ms() + 20000;
		/* Under encrypt the PLAIN proofs are refused too, the
		 * first of REPLAY's two sockets included. */
		int want = w->sec == HPUCOLL_SECURITY_ENCRYPT ? 5 : 3;

		do {
			usleep(20000);
			hpucoll_comm_stats(c, &st);
		} while (st.refused_connections < (uint64_t)want &&
			 ct_now_ms() < end);
		if (st.refused_connections < (uint64_t)want) {
			fprintf(stderr, "rank 1 refused %llu connections, "
					"want %d\n",
				(unsigned long long)st.refused_connections,
				want);
			rc = 1;
		}
	}
	/* After the refusals: the job still works. */
	if (rc == 0)
		rc = all_reduce_ok(c, 7);
	if (rc == 0 && hpucoll_barrier(c) != HPUCOLL_OK)
		rc = cw_fail_rc(c, "barrier", HPUCOLL_EPROTO);
	for (int i = 0; i < n; i++)
		zmq_close(socks[i]);
	zmq_ctx_term(ctx);
	return rc;
}

static void test_auth_refuses_strangers(void **state)
{
	struct world w = {.ws = 2, .tcp = 1, .sec = HPUCOLL_SECURITY_AUTH,
			  .secret = "the job token"};

	(void)state;
	cw_run_world(&w, under_attack);
}

static void test_encrypt_refuses_strangers(void **state)
{
	struct world w = {.ws = 3, .tcp = 1, .sec = HPUCOLL_SECURITY_ENCRYPT,
			  .secret = "the job token"};

	(void)state;
	cw_run_world(&w, under_attack);
}

/* Without security the stranger's ABORT is taken for rank 0's. */
static int forged_abort_wins(hpucoll_comm *c, struct shared *sh,
			     const struct world *w)
{
	int rc;

	(void)w;
	if (hpucoll_comm_rank(c) == 0) {
		/* Rank 0 stays out of the collective: only the forged frame
		 * can end rank 1's wait. It stays (its socket open) until rank
		 * 1's barrier has returned: gone earlier, rank 1 could see it
		 * gone before the forged frame arrived. */
		void *ctx = zmq_ctx_new(), *s = forge(ctx, sh->eps.ep[1], BARE,
						 HPUCOLL_SECURITY_NONE, NULL);

		for (int64_t end = ct_now_ms() + 30000;
		     atomic_load(&sh->counter) == 0 && ct_now_ms() < end;)
			usleep(10000);
		zmq_close(s);
		zmq_ctx_term(ctx);
		return 0;
	}
	hpucoll_comm_set_timeout(c, 20000);
	rc = hpucoll_barrier(c);
	atomic_store(&sh->counter, 1);
	if (rc == HPUCOLL_ENOMEM && strstr(hpucoll_comm_errmsg(c), "(forged)"))
		return 0;
	fprintf(stderr, "rank 1: barrier gave %d \"%s\", want the forgery\n",
		rc, hpucoll_comm_errmsg(c));
	return 1;
}

static void test_none_takes_forged_abort(void **state)
{
	struct world w = {.ws = 2, .tcp = 1};

	(void)state;
	cw_run_world(&w, forged_abort_wins);
}

/* Each rank refuses the other's proof. The first to hear of it fails at
 * once naming the rank that refused it; the other may instead find that
 * rank gone (it left before the other's connection got through), but
 * nobody waits for the 60 s timeout. */
static int refused_both_ways(hpucoll_comm *c, struct shared *sh,
			     const struct world *w)
{
	int me = hpucoll_comm_rank(c), rc;
	int64_t end;
	char want[128];

	(void)w;
	hpucoll_comm_set_timeout(c, 8000);
	rc = hpucoll_barrier(c);
	snprintf(want, sizeof(want),
		 "rank %d refused this rank's data-plane connection (its security handshake failed)",
		 1 - me);
	if (rc == HPUCOLL_ETRANSPORT && strstr(hpucoll_comm_errmsg(c), want)) {
		atomic_fetch_add(&sh->counter, 1);
		return 0;
	}
	fprintf(stderr, "rank %d: barrier gave %d \"%s\"\n", me, rc,
		hpucoll_comm_errmsg(c));
	if (rc != HPUCOLL_ETIMEDOUT && rc != HPUCOLL_EPEER)
		return 1;
	end = ct_now_ms() + 10000;
	while (atomic_load(&sh->counter) == 0 && ct_now_ms() < end)
		usleep(10000);
	return atomic_load(&sh->counter) == 0;
}

/* The same, once each rank's refusal has long been settled: the
 * connection is gone before the first send, so neither the send nor the
 * abort that follows may hide (or wait on) the refusal. */
static int refused_settled(hpucoll_comm *c, struct shared *sh,
			   const struct world *w)
{
	usleep(1000 * 1000);
	return refused_both_ways(c, sh, w);
}

static void test_different_secrets(void **state)
{
	struct world w = {.ws = 2, .tcp = 1, .sec = HPUCOLL_SECURITY_AUTH,
			  .secret = "one token", .secret1 = "another token"};

	(void)state;
	cw_run_world(&w, refused_both_ways);
	cw_run_world(&w, refused_settled);
	w.sec = HPUCOLL_SECURITY_ENCRYPT;
	cw_run_world(&w, refused_both_ways);
	cw_run_world(&w, refused_settled);
}


/* ---- Connections that break ---- */

/* The TCP port of a "tcp://127.0.0.1:PORT" endpoint. */
static int ep_port(const char *ep)
{
	const char *colon = strrchr(ep, ':');

	return colon ? atoi(colon + 1) : -1;
}

/* Cuts (shutdown, as `ss -K` would) every TCP connection of this process
 * to `port`; returns how many. */
static int cut_connections_to(int port)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	while (d != NULL && (e = readdir(d)) != NULL) {
		struct sockaddr_in a;
		socklen_t len = sizeof(a);
		int fd = atoi(e->d_name);

		if (e->d_name[0] == '.' || fd == dirfd(d) ||
		    getpeername(fd, (struct sockaddr *)&a, &len) != 0 ||
		    a.sin_family != AF_INET || ntohs(a.sin_port) != port)
			continue;
		n += shutdown(fd, SHUT_RDWR) == 0;
	}
	if (d != NULL)
		closedir(d);
	return n;
}

/* Each rank cuts its connection to the next one between collectives, so
 * that ZeroMQ's connections must be made again: the collectives after it
 * still give the right values (under auth, a reconnection used to
 * present its one-time proof again, and be refused as a replay). */
static int cut_between(hpucoll_comm *c, struct shared *sh,
		       const struct world *w)
{
	int me = hpucoll_comm_rank(c), next = (me + 1) % w->ws, rc;
	hpucoll_stats st;

	hpucoll_comm_set_timeout(c, 20000);
	rc = all_reduce_ok(c, 0);
	for (int cut = 0; cut < 2 && rc == 0; cut++) {
		/* Every rank has finished its collectives, so every message
		 * sent was read: nothing is in flight on what is cut. */
		int64_t end = ct_now_ms() + 20000;

		atomic_fetch_add(&sh->counter, 1);
		while (atomic_load(&sh->counter) < (cut + 1) * w->ws &&
		       ct_now_ms() < end)
			usleep(1000);
		if (cut_connections_to(ep_port(sh->eps.ep[next])) < 1) {
			fprintf(stderr, "%s: rank %d: no connection to rank %d "
					"to cut (%s)\n",
				hpucoll_security_name(w->sec), me, next,
				sh->eps.ep[next]);
			return 1;
		}
		usleep(1000 * 1000); /* ZeroMQ sees it close (300 ms was
				      * tight on a loaded machine) */
		for (int round = 1; round < 4 && rc == 0; round++)
			rc = all_reduce_ok(c, round);
	}
	hpucoll_comm_stats(c, &st);
	if (rc == 0 && st.refused_connections != 0) {
		fprintf(stderr, "rank %d refused %llu connections of its "
				"peers\n",
			me, (unsigned long long)st.refused_connections);
		rc = 1;
	}
	return rc;
}

static void test_connections_cut(void **state)
{
	struct world w = {.ws = 2, .tcp = 1, .secret = "the job token"};

	(void)state;
	for (int sec = HPUCOLL_SECURITY_NONE; sec <= HPUCOLL_SECURITY_ENCRYPT;
	     sec++) {
		w.sec = (hpucoll_security)sec;
		cw_run_world(&w, cut_between);
	}
}

/* test_rank_stopped's heartbeat timeout (HPUCOLL_HEARTBEAT_MS). */
#define HEARTBEAT_MS 3000

/* Whether process pid is stopped (its /proc stat says "... (name) T"). */
static int is_stopped(int pid)
{
	char path[64], st[256] = "";
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "r");
	if (f != NULL && fgets(st, sizeof(st), f) == NULL)
		st[0] = '\0';
	if (f != NULL)
		fclose(f);
	return strstr(st, ") T ") != NULL;
}

/* Rank 1 stops (SIGSTOP, as a debugger or the kernel may) between two
 * collectives for longer than ZeroMQ's heartbeat timeout: both
 * connections between rank 0 and rank 1 close, and must be made again
 * once rank 1 goes on. The collectives after it give the right values.
 * (Nothing is in flight while it stops: what is, is lost with the
 * connection, under every mode.) */
static int stopped_a_while(hpucoll_comm *c, struct shared *sh,
			   const struct world *w)
{
	int me = hpucoll_comm_rank(c), rc, pid = atomic_load(&sh->pid[1]);
	int64_t end;

	(void)w;
	hpucoll_comm_set_timeout(c, 30000);
	rc = all_reduce_ok(c, 0);
	end = ct_now_ms() + 30000;
	if (rc == 0 && me == 1) {
		atomic_store(&sh->counter, 1);
		/* Rank 0 stops this process here, and lets it go on. */
		while (atomic_load(&sh->counter) < 2 && ct_now_ms() < end)
			usleep(10000);
		/* As a rank that was stopped in its forward pass goes on
		 * computing: a message sent at the very instant it goes on
		 * may meet a connection ZeroMQ has not yet seen closed, and
		 * be lost with it, under every mode. */
		usleep(1000 * 1000);
	} else if (rc == 0) {
		while (atomic_load(&sh->counter) < 1 && ct_now_ms() < end)
			usleep(10000);
		kill(pid, SIGSTOP);
		while (!is_stopped(pid) && ct_now_ms() < end)
			usleep(10000);
		if (!is_stopped(pid)) {
			fprintf(stderr, "rank 1 did not stop\n");
			rc = 1;
		}
		usleep((HEARTBEAT_MS + 1500) * 1000);
		kill(pid, SIGCONT);
		atomic_store(&sh->counter, 2);
	}
	for (int round = 1; round < 4 && rc == 0; round++)
		rc = all_reduce_ok(c, round);
	return rc;
}

static void test_rank_stopped(void **state)
{
	struct world w = {.ws = 2, .tcp = 1, .sec = HPUCOLL_SECURITY_AUTH,
			  .secret = "the job token"};
	char hb[32];

	(void)state;
	/* a short heartbeat timeout, that the stop outlasts */
	snprintf(hb, sizeof(hb), "%d", HEARTBEAT_MS);
	setenv("HPUCOLL_HEARTBEAT_MS", hb, 1); /* the teardown unsets it */
	cw_run_world(&w, stopped_a_while);
}

static int heartbeat_unset(void **state)
{
	(void)state;
	unsetenv("HPUCOLL_HEARTBEAT_MS");
	return 0;
}

/* ---- Connections from strangers that never speak, or from elsewhere ---- */

#define FLOOD 100

/* How many descriptors this process has open. */
static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	while (d != NULL && readdir(d) != NULL)
		n++;
	if (d != NULL)
		closedir(d);
	return n - 3; /* ".", ".." and the directory's own */
}

/* Opens FLOOD TCP connections to port that never send a byte. */
static int flood(int port, int *fds)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons((uint16_t)port)};
	int n = 0;

	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	for (int i = 0; i < FLOOD; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		if (fds[i] >= 0 &&
		    (connect(fds[i], (struct sockaddr *)&a, sizeof(a)) == 0 ||
		     errno == EINPROGRESS))
			n++;
	}
	return n;
}

/* Whether c has refused exactly `want` connections, once its handler has
 * counted them (it counts on its own thread, a moment later). */
static int refused_exactly(hpucoll_comm *c, uint64_t want)
{
	int64_t end = ct_now_ms() + 5000;
	hpucoll_stats st;

	hpucoll_comm_stats(c, &st);
	while (st.refused_connections < want && ct_now_ms() < end) {
		usleep(10000);
		hpucoll_comm_stats(c, &st);
	}
	if (st.refused_connections == want)
		return 1;
	fprintf(stderr, "rank %d refused %llu connections, want %llu\n",
		hpucoll_comm_rank(c),
		(unsigned long long)st.refused_connections,
		(unsigned long long)want);
	return 0;
}

/* A stranger (rank 0's process, as another program on the node) opens
 * FLOOD connections to rank 1's port that never handshake and keeps them
 * open: rank 1 can still open files (a checkpoint failed with "Too many
 * open files"), its collectives work, and its descriptors come back while
 * the stranger still holds its end. */
static int flooded(hpucoll_comm *c, struct shared *sh, const struct world *w)
{
	int me = hpucoll_comm_rank(c), rc, base = open_fds(), fds[FLOOD];
	int64_t end = ct_now_ms() + 60000;

	(void)w;
	rc = all_reduce_ok(c, 0);
	if (rc == 0 && me == 0) {
		struct rlimit r;

		/* The stranger is not bound by this test's low limit. */
		getrlimit(RLIMIT_NOFILE, &r);
		r.rlim_cur = r.rlim_max;
		setrlimit(RLIMIT_NOFILE, &r);
		if (flood(ep_port(sh->eps.ep[1]), fds) != FLOOD) {
			perror("rank 0: flood");
			rc = 1;
		}
		atomic_store(&sh->counter, 1);
	}
	if (rc == 0 && me == 1) {
		int fd;

		while (atomic_load(&sh->counter) < 1 && ct_now_ms() < end)
			usleep(10000);
		usleep(1000 * 1000); /* ZeroMQ takes them in */
		fd = open("/dev/null", O_RDONLY);
		if (fd < 0) {
			perror("rank 1: open /dev/null under the flood");
			rc = 1;
		}
		close(fd);
	}
	for (int round = 1; round < 3 && rc == 0; round++)
		rc = all_reduce_ok(c, round);
	if (me == 1) {
		/* Well before ZeroMQ's own 30 s handshake limit. */
		end = ct_now_ms() + 20000;
		while (open_fds() > base + 2 && ct_now_ms() < end)
			usleep(100 * 1000);
		if (rc == 0 && open_fds() > base + 2) {
			fprintf(stderr, "rank 1 still has %d descriptors open, "
					"%d before the flood\n",
				open_fds(), base);
			rc = 1;
		}
		atomic_store(&sh->counter, 2);
	} else {
		while (atomic_load(&sh->counter) < 2 && ct_now_ms() < end)
			usleep(10000);
		for (int i = 0; i < FLOOD; i++)
			close(fds[i]);
	}
	return rc;
}

static void test_flood_of_silent_connections(void **state)
{
	struct world w = {.ws = 2, .tcp = 1, .sec = HPUCOLL_SECURITY_AUTH,
			  .secret = "the job token"};
	struct rlimit old, low;

	(void)state;
	/* A limit the flood exceeds (a rank's own need is about 20). */
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
	low = old;
	low.rlim_cur = 64;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
	cw_run_world(&w, flooded);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
}

/* A stranger with a good proof (as if it had the token) is let in from
 * the job's address, and refused from another one (127.0.0.2 is also
 * this machine, but no rank's address). */
static int from_elsewhere(hpucoll_comm *c, struct shared *sh,
			  const struct world *w)
{
	int me = hpucoll_comm_rank(c), rc = all_reduce_ok(c, 0);

	if (rc == 0 && me == 0) {
		static const char *const from[2] = {"127.0.0.2", "127.0.0.1"};
		void *ctx = zmq_ctx_new();
		char user[64], pass[65], ep[128];
		int zero = 0;

		real_proof(w->secret, user, pass);
		for (int i = 0; i < 2 && rc == 0; i++) {
			void *t = zmq_socket(ctx, ZMQ_PUSH);

			zmq_setsockopt(t, ZMQ_LINGER, &zero, sizeof(zero));
			zmq_setsockopt(t, ZMQ_PLAIN_USERNAME, user,
				       strlen(user));
			zmq_setsockopt(t, ZMQ_PLAIN_PASSWORD, pass, 64);
			snprintf(ep, sizeof(ep), "tcp://%s:0;%s", from[i],
				 sh->eps.ep[1] + 6);
			void *m = watch(ctx, t);

			if (zmq_connect(t, ep) != 0 || handshake(m, t) != i) {
				fprintf(stderr, "a stranger from %s was %s\n",
					from[i], i ? "refused" : "let in");
				rc = 1;
			}
			zmq_close(t);
		}
		zmq_ctx_term(ctx);
	}
	if (rc == 0)
		rc = all_reduce_ok(c, 1);
	if (rc == 0 && !refused_exactly(c, me == 1))
		rc = 1;
	return rc;
}

/* Connects to ipc endpoint ep with a good proof, as user uid (a forked
 * process); returns whether it was let in, or -1 when it could not try. */
static int ipc_stranger(const char *ep, const char *secret, uid_t uid)
{
	pid_t pid = fork();
	int status;

	if (pid == 0) {
		char user[64], pass[65];
		void *ctx, *t;
		int zero = 0, in;

		if (setgid(uid) != 0 || setuid(uid) != 0)
			_exit(3);
		ctx = zmq_ctx_new();
		t = zmq_socket(ctx, ZMQ_PUSH);
		real_proof(secret, user, pass);
		zmq_setsockopt(t, ZMQ_LINGER, &zero, sizeof(zero));
		zmq_setsockopt(t, ZMQ_PLAIN_USERNAME, user, strlen(user));
		zmq_setsockopt(t, ZMQ_PLAIN_PASSWORD, pass, 64);
		void *m = watch(ctx, t);

		if (zmq_connect(t, ep) != 0)
			_exit(3);
		in = handshake(m, t);
		zmq_close(t);
		zmq_ctx_term(ctx);
		_exit(in);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
	    WEXITSTATUS(status) > 1)
		return -1;
	return WEXITSTATUS(status);
}

/* On ipc, the ranks (of this uid) are let in; as root, a stranger of
 * another uid with a good proof is not (the socket file made writable
 * for it), one of this uid is. */
static int on_ipc(hpucoll_comm *c, struct shared *sh, const struct world *w)
{
	int rc = 0;

	int me = hpucoll_comm_rank(c), strangers = 0;

	for (int round = 0; round < 3 && rc == 0; round++)
		rc = all_reduce_ok(c, round);
	if (rc == 0 && me == 0 && geteuid() == 0 &&
	    w->sec == HPUCOLL_SECURITY_AUTH) {
		const char *ep = sh->eps.ep[1];

		strangers = 1;
		if (chmod(ep + 6, 0777) != 0 ||
		    ipc_stranger(ep, w->secret, 65534) != 0 ||
		    ipc_stranger(ep, w->secret, 0) != 1) {
			fprintf(stderr, "ipc: uid 65534 let in, or uid 0 not\n");
			rc = 1;
		}
		atomic_store(&sh->counter, 1);
	}
	if (rc == 0)
		rc = all_reduce_ok(c, 3);
	strangers = strangers || atomic_load(&sh->counter);
	if (rc == 0 && !refused_exactly(c, strangers && me == 1))
		rc = 1;
	return rc;
}

static void test_only_the_jobs_addresses(void **state)
{
	struct world w = {.ws = 2, .tcp = 1, .sec = HPUCOLL_SECURITY_AUTH,
			  .secret = "the job token"};

	(void)state;
	cw_run_world(&w, from_elsewhere);
	w.tcp = 0;
	cw_run_world(&w, on_ipc);
	w.sec = HPUCOLL_SECURITY_ENCRYPT;
	w.ws = 3;
	cw_run_world(&w, on_ipc);
}

/* ---- A bind that fails ---- */

/* What bind_fails tries: an ipc path taken by a directory, and whether
 * that directory belongs to another user. */
struct bind_case {
	hpucoll_security sec;
	char path[128];
	int other_uid;
};

/* comm_new must fail at once, naming the endpoint and why (it used to
 * wait forever in zmq_ctx_term under auth and encrypt). */
static int bind_fails(int rank, void *arg)
{
	const struct bind_case *b = arg;
	char ep[160], err[HPUCOLL__ERRMSG_MAX], want[256];
	hpucoll_comm *c = NULL;
	int rc;

	(void)rank;
	snprintf(ep, sizeof(ep), "ipc://%s", b->path);
	rc = hpucoll__comm_new(&c, 0, 2, ep, b->sec, "the job token", 13, err,
			       sizeof(err));
	if (b->other_uid)
		snprintf(want, sizeof(want),
			 "cannot bind %s: the path exists and is owned by uid "
			 "65534, not by this rank's uid %u",
			 ep, (unsigned)geteuid());
	else
		snprintf(want, sizeof(want), "cannot bind %s: Address already "
					     "in use", ep);
	if (rc == HPUCOLL_ETRANSPORT && c == NULL && strstr(err, want))
		return 0;
	fprintf(stderr, "%s: comm_new gave %d \"%s\", want \"%s\"\n",
		hpucoll_security_name(b->sec), rc, err, want);
	hpucoll_comm_destroy(&c);
	return 1;
}

static void test_bind_fails_at_once(void **state)
{
	struct bind_case b;
	struct stat st;

	(void)state;
	for (int sec = HPUCOLL_SECURITY_NONE; sec <= HPUCOLL_SECURITY_ENCRYPT;
	     sec++) {
		for (int other = 0; other < 2; other++) {
			if (other && geteuid() != 0)
				continue; /* cannot give a file away */
			b.sec = (hpucoll_security)sec;
			b.other_uid = other;
			snprintf(b.path, sizeof(b.path),
				 "/tmp/hpucoll-test-%d-bind%d%d", (int)getpid(),
				 sec, other);
			/* A directory: not even root's ZeroMQ removes it. */
			assert_int_equal(mkdir(b.path, 0755), 0);
			if (other)
				assert_int_equal(chown(b.path, 65534, 65534), 0);
			/* A hang would be killed at the deadline, and fail. */
			assert_int_equal(ct_run_ranks(1, bind_fails, &b, 20000,
						      0),
					 0);
			/* Not bound over, not removed. */
			assert_int_equal(lstat(b.path, &st), 0);
			assert_true(S_ISDIR(st.st_mode));
			rmdir(b.path);
		}
	}
}

static void test_bad_args(void **state)
{
	hpucoll_comm *c = NULL;
	hpucoll_security s;

	(void)state;
	assert_int_equal(hpucoll_comm_new_secure(&c, 0, 1, "tcp://127.0.0.1:*",
						 HPUCOLL_SECURITY_AUTH, NULL,
						 0),
			 HPUCOLL_EINVAL);
	assert_null(c);
	assert_int_equal(hpucoll_comm_new_secure(&c, 0, 1, "tcp://127.0.0.1:*",
						 (hpucoll_security)9, "x", 1),
			 HPUCOLL_EINVAL);
	assert_int_equal(hpucoll_security_parse("encrypt", &s), 0);
	assert_int_equal(s, HPUCOLL_SECURITY_ENCRYPT);
	assert_int_equal(hpucoll_security_parse("curve", &s), -1);
	assert_string_equal(hpucoll_security_name(HPUCOLL_SECURITY_AUTH),
			    "auth");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_auth_refuses_strangers),
		cmocka_unit_test(test_encrypt_refuses_strangers),
		cmocka_unit_test(test_none_takes_forged_abort),

		cmocka_unit_test(test_different_secrets),
		cmocka_unit_test(test_connections_cut),
		cmocka_unit_test_teardown(test_rank_stopped, heartbeat_unset),
		cmocka_unit_test(test_flood_of_silent_connections),
		cmocka_unit_test(test_only_the_jobs_addresses),
		cmocka_unit_test(test_bad_args),
		cmocka_unit_test(test_bind_fails_at_once),
	};

	if (getenv("HPU_TEST_FILTER") != NULL)
		cmocka_set_test_filter(getenv("HPU_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
