/* The communicator's lifecycle: hpucoll_comm_new, connect and destroy,
 * its receive socket, the rank table and the topology. It calls down into
 * the algorithms (algo.c), the progress engine (progress.c), who may
 * connect (secure.c) and the transports (transport.c); the helpers every
 * file shares (errors, counters, scratch, names) are in comm_core.c, so
 * that no other file calls back into this one. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "collectives/comm_internal.h"
#include "common/env.h"

/* Reads the integer environment variable id into *v when it is set; a
 * value that is not a whole number in [lo, hi] is an error naming the
 * variable in c's errmsg. */
static int int_from_env(hpucoll_comm *c, hpu_env_id id, long lo, long hi, const char *unit,
			int *v)
{
	long x;
	int r = hpu__env_long(id, lo, hi, &x);

	if (r < 0) {
		hpucoll__set_error(c, "%s='%s' is not a whole number of %s from %ld to %ld",
				   hpu__env_name(id), hpu__env_str(id), unit, lo, hi);
		return HPUCOLL_EENV;
	}
	if (r > 0)
		*v = (int)x;
	return HPUCOLL_OK;
}

static int set_int(void *sock, int opt, int v)
{
	return zmq_setsockopt(sock, opt, &v, sizeof(v));
}

/* The file of an ipc:// endpoint, or NULL (another transport, or an
 * abstract "ipc://@name" endpoint, which has none). */
static const char *ipc_file(const char *endpoint)
{
	static const char prefix[] = "ipc://";
	const char *path = endpoint + sizeof(prefix) - 1;

	if (strncmp(endpoint, prefix, sizeof(prefix) - 1) != 0 ||
	    path[0] == '@' || path[0] == '\0')
		return NULL;
	return path;
}

/* An ipc path that exists and belongs to another user is never bound
 * over: ZeroMQ would remove it first when it may (as root), and fails
 * with "address in use" when it may not. Says so and returns 1. */
static int ipc_not_ours(hpucoll_comm *c, const char *endpoint)
{
	const char *path = ipc_file(endpoint);
	struct stat st;

	if (path == NULL || lstat(path, &st) != 0 || st.st_uid == geteuid())
		return 0;
	hpucoll__set_error(c, "comm_new: cannot bind %s: the path exists and "
			      "is owned by uid %u, not by this rank's uid %u "
			      "(another user's file; remove it or use another "
			      "job id).",
			   endpoint, (unsigned)st.st_uid, (unsigned)geteuid());
	return 1;
}

/* An ipc path is this rank's while it holds PATH.lock (flock): a running
 * job of the same job id on this machine holds it, and ZeroMQ would
 * remove the path and bind over it (the two jobs' ranks then joined each
 * other's collectives, failing both after a minute, blaming the wrong
 * thing). Two such jobs started at once may both be refused: neither
 * runs with the other's ranks. Says so and returns 1. A dead job's lock
 * is free. */
static int ipc_lock(hpucoll_comm *c, const char *endpoint)
{
	const char *path = ipc_file(endpoint);
	struct stat st;

	if (path == NULL)
		return 0;
	snprintf(c->ipc_lock_path, sizeof(c->ipc_lock_path), "%s.lock", path);
	int fd = -1;
	/* the lock held must be the one at the path: an agent's sweep
	 * removes a dead job's lock while holding it, and a rank that had
	 * opened it before takes the new one (a few tries: each removal
	 * needs a dead job's lock) */
	for (int tries = 0; tries < 8; tries++) {
		struct stat at;
		fd = open(c->ipc_lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0 || fstat(fd, &st) != 0 || st.st_uid != geteuid())
			break;
		/* held: a running job's rank, or a sweep removing a dead one's
		 * lock (it holds it for a moment, then the path is gone) */
		int held = flock(fd, LOCK_EX | LOCK_NB) != 0, same = 1;
		for (int w = 0; held && same && w < 10; w++) {
			usleep(10 * 1000);
			same = lstat(c->ipc_lock_path, &at) == 0 && at.st_ino == st.st_ino &&
			       at.st_dev == st.st_dev;
			held = same && flock(fd, LOCK_EX | LOCK_NB) != 0;
		}
		if (held && same)
			break; /* a running job's: refused below */
		if (!held && lstat(c->ipc_lock_path, &at) == 0 && at.st_ino == st.st_ino &&
		    at.st_dev == st.st_dev) {
			c->ipc_lock = fd;
			return 0;
		}
		close(fd); /* removed under us: the new one at the path */
		fd = -1;
		errno = ESTALE;
	}
	if (fd < 0 || fstat(fd, &st) != 0 || st.st_uid != geteuid()) {
		hpucoll__set_error(c, "comm_new: cannot bind %s: cannot take its lock %s: %s.",
				   endpoint, c->ipc_lock_path,
				   fd < 0 ? strerror(errno) : "another user's file");
		if (fd >= 0)
			close(fd);
		c->ipc_lock_path[0] = '\0';
		return 1;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		hpucoll__set_error(c, "comm_new: cannot bind %s: a running job's rank holds it "
				      "(another job with the same job id on this machine); give each "
				      "job its own --job-id.",
				   endpoint);
		close(fd);
		c->ipc_lock_path[0] = '\0';
		return 1;
	}
	c->ipc_lock = fd;
	return 0;
}

/* zmq_bind failed with err: names the endpoint and the reason. */
static int bind_failed(hpucoll_comm *c, const char *endpoint, int err)
{
	hpucoll__set_error(c, "comm_new: cannot bind %s: %s.", endpoint,
			   zmq_strerror(err));
	return err == ENOMEM ? HPUCOLL_ENOMEM : HPUCOLL_ETRANSPORT;
}

/* Makes the receive socket, binds it and records the resolved endpoint.
 * No high-water mark: the algorithms bound what is in flight, and a send
 * must never block (two ranks sending to each other would deadlock). */
static int bind_pull(hpucoll_comm *c, const char *endpoint)
{
	int64_t maxmsg = HPUCOLL__MAX_FRAME;
	size_t len = sizeof(c->endpoint);

	c->pull = zmq_socket(c->ctx, ZMQ_PULL);
	if (c->pull == NULL)
		return hpucoll__zmq_error(c, "zmq_socket");
	if (set_int(c->pull, ZMQ_RCVHWM, 0) != 0 ||
	    set_int(c->pull, ZMQ_LINGER, 0) != 0 ||
	    set_int(c->pull, ZMQ_HEARTBEAT_IVL,
		    HPUCOLL__HEARTBEAT_IVL_MS) != 0 ||
	    set_int(c->pull, ZMQ_HEARTBEAT_TIMEOUT, c->heartbeat_ms) != 0 ||
	    set_int(c->pull, ZMQ_HANDSHAKE_IVL, HPUCOLL__HANDSHAKE_IVL_MS) != 0 ||
	    zmq_setsockopt(c->pull, ZMQ_MAXMSGSIZE, &maxmsg,
			   sizeof(maxmsg)) != 0 ||
	    hpucoll__sec_server(c, c->pull) != 0)
		return hpucoll__zmq_error(c, "zmq_setsockopt");
	if (ipc_not_ours(c, endpoint) || ipc_lock(c, endpoint))
		return HPUCOLL_ETRANSPORT;
	if (zmq_bind(c->pull, endpoint) != 0)
		return bind_failed(c, endpoint, zmq_errno());
	if (zmq_getsockopt(c->pull, ZMQ_LAST_ENDPOINT, c->endpoint, &len) != 0)
		return hpucoll__zmq_error(c, "zmq_getsockopt");
	return HPUCOLL_OK;
}

/* Raises the soft limit on open files to the hard one: a rank holds a
 * descriptor for every connection to it, also for those that never finish
 * their handshake (until HPUCOLL__HANDSHAKE_IVL_MS), and a low soft limit
 * (1024 by default) is soon spent by a flood of them. Best effort. */
static void raise_nofile(void)
{
	struct rlimit r;
	long nr_open = 1L << 20;
	FILE *f;

	if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur >= r.rlim_max)
		return;
	if (r.rlim_max == RLIM_INFINITY) {
		/* The kernel takes no more than fs.nr_open. */
		f = fopen("/proc/sys/fs/nr_open", "r");
		if (f != NULL) {
			if (fscanf(f, "%ld", &nr_open) != 1)
				nr_open = 1L << 20;
			fclose(f);
		}
		r.rlim_cur = (rlim_t)nr_open;
	} else {
		r.rlim_cur = r.rlim_max;
	}
	setrlimit(RLIMIT_NOFILE, &r);
}

/* The descriptors a rank of `size` needs, with room to spare: about 10
 * of its own and 5 for each rank (measured: 20 at 2 ranks, 30 at 4),
 * more while connections are accepted. ZeroMQ aborts the process where
 * an accept finds none left (an assertion in its ipc listener), so a
 * limit below this is refused at start, naming it. */
static int nofile_enough(hpucoll_comm *c, int size)
{
	struct rlimit r;
	unsigned long long need = 24 + 6ull * (unsigned long long)size;
	if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY ||
	    (unsigned long long)r.rlim_cur >= need)
		return HPUCOLL_OK;
	hpucoll__set_error(c,
			   "the limit on open files (ulimit -n) is %llu, and a rank of %d needs "
			   "about %llu (its ZeroMQ sockets and connections to the other ranks): "
			   "raise it (ulimit -n, LimitNOFILE= in a systemd unit)",
			   (unsigned long long)r.rlim_cur, size, need);
	return HPUCOLL_EENV;
}

/* One ZeroMQ I/O thread moves everything of a rank (HPUCOLL_IO_THREADS
 * overrides): the zero-copy sends leave it little to do, and more threads
 * than cores only steal time from the ranks. */
static int make_ctx(hpucoll_comm *c)
{
	int io = 1;

	if (int_from_env(c, HPU_ENV_HPUCOLL_IO_THREADS, 1, 64, "threads", &io) != HPUCOLL_OK)
		return HPUCOLL_EENV;
	c->ctx = zmq_ctx_new();
	if (c->ctx == NULL)
		return hpucoll__zmq_error(c, "zmq_ctx_new");
	if (zmq_ctx_set(c->ctx, ZMQ_IO_THREADS, io) != 0 ||
	    zmq_ctx_set(c->ctx, ZMQ_BLOCKY, 0) != 0)
		return hpucoll__zmq_error(c, "zmq_ctx_set");
	return HPUCOLL_OK;
}

static hpucoll_comm *comm_alloc(int rank, int size)
{
	hpucoll_comm *c = calloc(1, sizeof(*c));

	if (c == NULL)
		return NULL;
	c->rank = rank;
	c->size = size;
	c->pid = (int)getpid();
	c->what = "comm_new";
	c->timeout_ms = HPUCOLL__DEFAULT_TIMEOUT_MS;
	c->stall_ms = HPUCOLL__DEFAULT_STALL_MS;
	c->heartbeat_ms = HPUCOLL__HEARTBEAT_TIMEOUT_MS;
	c->culprit = -1;
	c->ipc_lock = -1;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	pthread_mutex_init(&c->errlock, NULL);
	return c;
}

int hpucoll_comm_new(hpucoll_comm **out, int rank, int size,
		     const char *bind_endpoint)
{
	return hpucoll_comm_new_secure(out, rank, size, bind_endpoint,
				       HPUCOLL_SECURITY_NONE, NULL, 0);
}

int hpucoll__comm_new(hpucoll_comm **out, int rank, int size,
		      const char *bind_endpoint, hpucoll_security security,
		      const void *secret, size_t secret_len, char *err,
		      size_t errlen)
{
	hpucoll_comm *c;
	int rc, t = HPUCOLL__DEFAULT_TIMEOUT_MS;

	if (err != NULL && errlen > 0)
		snprintf(err, errlen, "comm_new: bad arguments (rank %d of %d).",
			 rank, size);
	if (out == NULL)
		return HPUCOLL_EINVAL;
	*out = NULL;
	if (size < 1 || size > HPUCOLL__MAX_SIZE || rank < 0 || rank >= size ||
	    bind_endpoint == NULL)
		return HPUCOLL_EINVAL;
	c = comm_alloc(rank, size);
	if (c == NULL) {
		if (err != NULL && errlen > 0)
			snprintf(err, errlen, "%s",
				 hpucoll_strerror(HPUCOLL_ENOMEM));
		return HPUCOLL_ENOMEM;
	}
	/* a wait without end would be a hang: at least 1 ms */
	rc = int_from_env(c, HPU_ENV_HPUCOLL_TIMEOUT_MS, 1, INT_MAX, "milliseconds", &t);
	if (rc == HPUCOLL_OK) /* 0: never */
		rc = int_from_env(c, HPU_ENV_HPUCOLL_STALL_WARN_MS, 0, INT_MAX, "milliseconds",
				  &c->stall_ms);
	if (rc == HPUCOLL_OK) /* above the heartbeats' interval */
		rc = int_from_env(c, HPU_ENV_HPUCOLL_HEARTBEAT_MS, 2000, INT_MAX, "milliseconds",
				  &c->heartbeat_ms);
	if (rc == HPUCOLL_OK)
		rc = hpucoll__tune_from_env(c);
	if (rc != HPUCOLL_OK)
		goto fail;
	c->timeout_ms = t;
	raise_nofile();
	rc = nofile_enough(c, size);
	if (rc == HPUCOLL_OK)
		rc = make_ctx(c);
	if (rc == HPUCOLL_OK && (unsigned)security > HPUCOLL_SECURITY_ENCRYPT)
		rc = HPUCOLL_EINVAL;
	if (rc == HPUCOLL_OK)
		rc = hpucoll__sec_start(c, security, secret, secret_len);
	if (rc == HPUCOLL_OK)
		rc = bind_pull(c, bind_endpoint);
	if (rc == HPUCOLL_OK)
		rc = hpucoll__sec_run(c);
	if (rc != HPUCOLL_OK)
		goto fail;
	*out = c;
	return HPUCOLL_OK;
fail:
	if (err != NULL && errlen > 0)
		snprintf(err, errlen, "%s",
			 c->errmsg[0] ? c->errmsg : hpucoll_strerror(rc));
	hpucoll_comm_destroy(&c);
	return rc;
}

int hpucoll_comm_new_secure(hpucoll_comm **out, int rank, int size,
			    const char *bind_endpoint,
			    hpucoll_security security, const void *secret,
			    size_t secret_len)
{
	return hpucoll__comm_new(out, rank, size, bind_endpoint, security,
				 secret, secret_len, NULL, 0);
}

const char *hpucoll_comm_endpoint(const hpucoll_comm *comm)
{
	return comm ? comm->endpoint : "";
}

/* Shared-memory names are made of the job name: keep it to characters
 * every file system takes. */
static int job_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n >= HPUCOLL__JOB_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' ||
		      ch == '.'))
			return 0;
	}
	return 1;
}

int hpucoll_comm_set_topology(hpucoll_comm *comm, const int *node_ids,
			      const char *job_name,
			      hpucoll_transport transport)
{
	int *ids;

	if (comm == NULL || node_ids == NULL ||
	    (unsigned)transport > HPUCOLL_TRANSPORT_SHM)
		return HPUCOLL_EINVAL;
	comm->what = "set_topology";
	if (comm->peers != NULL) {
		hpucoll__set_error(comm, "set_topology: rank %d is already "
					 "connected.", comm->rank);
		return HPUCOLL_EINVAL;
	}
	if (job_name == NULL || !job_name_ok(job_name)) {
		hpucoll__set_error(comm, "set_topology: the job name must be "
					 "1 to %d letters, digits, '-', '_' "
					 "or '.'.", HPUCOLL__JOB_MAX - 1);
		return HPUCOLL_EINVAL;
	}
	for (int i = 0; i < comm->size; i++) {
		if (node_ids[i] < 0) {
			hpucoll__set_error(comm, "set_topology: rank %d has "
						 "a negative node id.", i);
			return HPUCOLL_EINVAL;
		}
	}
	ids = malloc((size_t)comm->size * sizeof(*ids));
	if (ids == NULL)
		return HPUCOLL_ENOMEM;
	memcpy(ids, node_ids, (size_t)comm->size * sizeof(*ids));
	free(comm->node_ids);
	comm->node_ids = ids;
	snprintf(comm->job, sizeof(comm->job), "%s", job_name);
	comm->transport = transport;
	return HPUCOLL_OK;
}

int hpucoll_comm_connect(hpucoll_comm *comm, const char *const *endpoints)
{
	struct hpucoll__peer *peers;
	int i, rc;

	if (comm == NULL || endpoints == NULL)
		return HPUCOLL_EINVAL;
	comm->what = "connect";
	if (comm->peers != NULL) {
		hpucoll__set_error(comm, "connect: rank %d is already "
					 "connected.", comm->rank);
		return HPUCOLL_EINVAL;
	}
	for (i = 0; i < comm->size; i++) {
		if (endpoints[i] == NULL || endpoints[i][0] == '\0') {
			hpucoll__set_error(comm, "connect: no endpoint given "
						 "for rank %d.", i);
			return HPUCOLL_EINVAL;
		}
	}
	peers = calloc((unsigned)comm->size, sizeof(*peers));
	if (peers == NULL)
		return HPUCOLL_ENOMEM;
	comm->peers = peers;
	for (i = 0; i < comm->size; i++) {
		peers[i].node = comm->node_ids ? comm->node_ids[i] : i;
		peers[i].shm = -1;
		peers[i].endpoint = strdup(endpoints[i]);
		if (peers[i].endpoint == NULL) {
			rc = HPUCOLL_ENOMEM;
			goto fail;
		}
	}
	rc = hpucoll__sec_peers(comm, endpoints);
	if (rc == HPUCOLL_OK)
		rc = hpucoll__transport_open(comm);
	if (rc == HPUCOLL_OK)
		rc = hpucoll__groups_init(comm);
	if (rc == HPUCOLL_OK)
		return HPUCOLL_OK;
fail:
	hpucoll__groups_free(comm);
	hpucoll__transport_close(comm);
	return rc;
}

/* ZeroMQ leaves the file of an ipc:// endpoint behind; the rank that bound
 * it removes it. */
static void unlink_ipc(const char *endpoint)
{
	const char *path = ipc_file(endpoint);

	if (path != NULL)
		unlink(path);
}

void hpucoll_comm_destroy(hpucoll_comm **comm)
{
	hpucoll_comm *c;

	if (comm == NULL || *comm == NULL)
		return;
	c = *comm;
	*comm = NULL;
	/* in a child of fork(): its ZeroMQ context and threads are the
	 * parent's (zmq_ctx_term spun for ever), and so are its shared memory
	 * and endpoint: nothing is touched, its memory left to exit */
	if (c->pid != (int)getpid())
		return;
	hpucoll__progress_stop(c);
	hpucoll__groups_free(c);
	/* The sockets first, the peers table after zmq_ctx_term: a
	 * zero-copy send ZeroMQ still held after a failure
	 * (hpucoll__zmq_fail gives up waiting) is released by the term, and
	 * its free callback counts down the peer's zc in that table. */
	hpucoll__zmq_close(c);
	hpucoll__sec_unwatch(c);
	if (c->pull != NULL)
		zmq_close(c->pull);
	if (c->ctx != NULL) {
		while (zmq_ctx_term(c->ctx) != 0 && zmq_errno() == EINTR)
			;
	}
	hpucoll__transport_close(c);
	hpucoll__sec_join(c);
	unlink_ipc(c->endpoint);
	if (c->ipc_lock >= 0) { /* removed while held: nobody else's */
		unlink(c->ipc_lock_path);
		close(c->ipc_lock);
	}
	free(c->node_ids);
	free(c->tmp);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->errlock);
	free(c);
}

void hpucoll_comm_set_timeout(hpucoll_comm *comm, int timeout_ms)
{
	/* 0 failed every wait at once, a negative one never ended one */
	if (comm && timeout_ms > 0)
		atomic_store(&comm->timeout_ms, timeout_ms);
}

void hpucoll_comm_set_trace(hpucoll_comm *comm, hpucoll_trace_fn fn, void *arg)
{
	if (!comm)
		return;
	comm->trace = fn;
	comm->trace_arg = arg;
}

void hpucoll_comm_set_stall_warning(hpucoll_comm *comm, int stall_ms)
{
	if (comm)
		comm->stall_ms = stall_ms > 0 ? stall_ms : 0;
}
