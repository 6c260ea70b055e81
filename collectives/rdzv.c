/* rdzv: hpucoll_comm_init_env(), the worker's side of the coordinator's
 * join protocol. A worker binds its data socket, sends Join (job id, token,
 * rank, endpoint) to the coordinator at MASTER_ADDR:MASTER_PORT, and waits
 * for the JoinReply that carries the rank table once every rank has
 * joined, or says why this rank was refused. */
#include <hpu/coll.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "collectives/comm_internal.h"
#include <zmq.h>

#include "proto/codec.h"
#include "common/env.h"
#include "common/num.h"
#include "common/shmname.h"

#define DEFAULT_JOIN_TIMEOUT_MS (15 * 60 * 1000)
/* --transport ipc binds ipc:///tmp/hpucoll-<job>-r<rank>; hpulaunch
 * removes what a crashed worker leaves there. */
#define HPUCOLL_IPC_PATH_MAX 200

typedef struct env {
	int rank, world, local_rank, node_rank;
	const char *addr, *port, *job_id, *token;
	hpucoll_transport transport;
	hpucoll_security security;
} env;

static int read_int(hpu_env_id id, int *out, char *err, size_t errlen)
{
	const char *v = hpu__env_str(id);
	long x;
	if (hpu__env_long(id, 0, 1 << 24, &x) <= 0) {
		snprintf(err, errlen, "environment variable %s is %s%s%s", hpu__env_name(id),
			 v ? "'" : "not set", v ? v : "", v ? "', not a rank number" : "");
		return -1;
	}
	*out = (int)x;
	return 0;
}

static int read_str(hpu_env_id id, const char **out, char *err, size_t errlen)
{
	*out = hpu__env_str(id);
	if (!*out || !**out) {
		snprintf(err, errlen, "environment variable %s is not set (start this program with hpulaunch)",
			 hpu__env_name(id));
		return -1;
	}
	return 0;
}

static int read_env(env *e, char *err, size_t errlen)
{
	if (read_int(HPU_ENV_RANK, &e->rank, err, errlen) ||
	    read_int(HPU_ENV_WORLD_SIZE, &e->world, err, errlen) ||
	    read_int(HPU_ENV_LOCAL_RANK, &e->local_rank, err, errlen) ||
	    read_int(HPU_ENV_NODE_RANK, &e->node_rank, err, errlen) ||
	    read_str(HPU_ENV_MASTER_ADDR, &e->addr, err, errlen) ||
	    read_str(HPU_ENV_MASTER_PORT, &e->port, err, errlen) ||
	    read_str(HPU_ENV_HPU_JOB_ID, &e->job_id, err, errlen) ||
	    read_str(HPU_ENV_HPU_JOB_TOKEN, &e->token, err, errlen))
		return -1;
	for (const char *c = e->job_id; *c; c++)
		if (!(isalnum((unsigned char)*c) || *c == '-' || *c == '_' || *c == '.') ||
		    c - e->job_id >= 63) { /* hpulaunch's and hpud's limit too */
			snprintf(err, errlen, "HPU_JOB_ID='%.80s' must be at most 63 letters, digits, '-', '_' or '.'",
				 e->job_id);
			return -1;
		}
	const char *t = hpu__env_str(HPU_ENV_HPUCOLL_TRANSPORT);
	e->transport = HPUCOLL_TRANSPORT_AUTO;
	if (t && *t && hpucoll_transport_parse(t, &e->transport) < 0) {
		snprintf(err, errlen, "HPUCOLL_TRANSPORT='%s' is not one of auto, tcp, ipc, shm", t);
		return -1;
	}
	t = hpu__env_str(HPU_ENV_HPUCOLL_SECURITY);
	e->security = HPUCOLL_SECURITY_AUTH;
	if (t && *t && hpucoll_security_parse(t, &e->security) < 0) {
		snprintf(err, errlen, "HPUCOLL_SECURITY='%s' is not one of auth, encrypt, none", t);
		return -1;
	}
	if (e->world < 1 || e->rank >= e->world) {
		snprintf(err, errlen, "RANK=%d is not below WORLD_SIZE=%d", e->rank,
			 e->world);
		return -1;
	}
	return 0;
}

/* The numeric address of `host` (IPv4). */
static int resolve(const char *host, char *out, size_t outlen)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	if (getaddrinfo(host, NULL, &hints, &ai) != 0)
		return -1;
	struct sockaddr_in *sa = (struct sockaddr_in *)ai->ai_addr;
	const char *r = inet_ntop(AF_INET, &sa->sin_addr, out, (socklen_t)outlen);
	freeaddrinfo(ai);
	return r ? 0 : -1;
}

/* The local address this host uses to reach `master` (the address the
 * other ranks can reach us at), unless HPU_DATA_ADDR says otherwise. */
static int local_addr(const char *master, char *out, size_t outlen)
{
	const char *forced = hpu__env_str(HPU_ENV_HPU_DATA_ADDR);
	if (forced && *forced)
		return snprintf(out, outlen, "%s", forced) < (int)outlen ? 0 : -1;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(9)};
	socklen_t len = sizeof sa;
	if (inet_pton(AF_INET, master, &sa.sin_addr) != 1)
		return -1;
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0)
		return -1;
	int rc = -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sa, &len) == 0 &&
	    inet_ntop(AF_INET, &sa.sin_addr, out, (socklen_t)outlen))
		rc = 0;
	close(fd);
	return rc;
}

static int send_join(void *sock, const env *e, const char *endpoint,
		     const char *host)
{
	Hpu__RankInfo self = HPU__RANK_INFO__INIT;
	self.rank = (uint32_t)e->rank;
	self.node_rank = (uint32_t)e->node_rank;
	self.local_rank = (uint32_t)e->local_rank;
	self.pid = (uint32_t)getpid();
	self.endpoint = (char *)endpoint;
	self.host = (char *)host;
	Hpu__Join join = HPU__JOIN__INIT;
	join.job_id = (char *)e->job_id;
	join.token = (char *)e->token;
	join.self = &self;
	join.world_size = (uint32_t)e->world;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_JOIN;
	env.join = &join;
	return hpu__codec_send(sock, NULL, &env);
}

/* Checks the rank table, tells the communicator which ranks share a node
 * and connects it. */
static int take_table(hpucoll_comm *comm, const Hpu__JoinReply *r,
		      const env *e, char *err, size_t errlen)
{
	int world = e->world;
	if ((int)r->n_ranks != world) {
		snprintf(err, errlen, "the coordinator sent a rank table of %zu ranks for a world of %d",
			 r->n_ranks, world);
		return HPUCOLL_EPROTO;
	}
	const char **eps = calloc((size_t)world, sizeof *eps);
	int *nodes = calloc((size_t)world, sizeof *nodes);
	int rc = HPUCOLL_ENOMEM;
	if (!eps || !nodes)
		goto out;
	rc = HPUCOLL_EPROTO;
	for (int i = 0; i < world; i++) {
		if (!r->ranks[i] || (int)r->ranks[i]->rank != i ||
		    !r->ranks[i]->endpoint || !*r->ranks[i]->endpoint) {
			snprintf(err, errlen, "the coordinator's rank table has a bad entry %d", i);
			goto out;
		}
		eps[i] = r->ranks[i]->endpoint;
		nodes[i] = (int)r->ranks[i]->node_rank;
	}
	/* The shared-memory segments are named by job id and the
	 * coordinator's random session: a name nobody outside the job can
	 * guess, so nobody can create it first (shm.c). */
	char ns[HPUCOLL__JOB_MAX];
	if (!hpu__shm_session_ok(r->session)) {
		snprintf(err, errlen, "the coordinator sent no shared-memory session (32 hex digits): is hpulaunch of another version?");
		goto out;
	}
	if ((size_t)snprintf(ns, sizeof ns, "%s-%s", e->job_id, r->session) >= sizeof ns) {
		snprintf(err, errlen, "job id '%s' is too long", e->job_id);
		goto out;
	}
	rc = hpucoll_comm_set_topology(comm, nodes, ns, e->transport);
	if (rc == HPUCOLL_OK)
		rc = hpucoll_comm_connect(comm, eps);
	if (rc)
		snprintf(err, errlen, "connecting to the other ranks failed: %s",
			 hpucoll_comm_errmsg(comm));
out:
	free(eps);
	free(nodes);
	return rc;
}

/* Waits for the JoinReply and acts on it. */
static int await_reply(void *sock, hpucoll_comm *comm, const env *e,
		       char *err, size_t errlen)
{
	const char *t = hpu__env_str(HPU_ENV_HPU_JOIN_TIMEOUT_MS);
	int timeout;
	if (hpu__parse_int(t, 1, INT_MAX, &timeout))
		timeout = DEFAULT_JOIN_TIMEOUT_MS;
	zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
	for (;;) {
		Hpu__Envelope *m = hpu__codec_recv(sock, NULL, 0);
		if (!m && errno == EINTR)
			continue;
		if (!m && errno == EAGAIN) {
			snprintf(err, errlen, "no answer from the coordinator at %s:%s after %d ms",
				 e->addr, e->port, timeout);
			return HPUCOLL_ETIMEDOUT;
		}
		if (!m)
			continue; /* a malformed message: not for us */
		int rc = HPUCOLL_OK;
		if (m->msg_case == HPU__ENVELOPE__MSG_JOIN_REPLY) {
			Hpu__JoinReply *r = m->join_reply;
			if (!r->ok) {
				snprintf(err, errlen, "the coordinator refused rank %d: %s",
					 e->rank, r->error && *r->error ? r->error : "no reason given");
				rc = HPUCOLL_EREFUSED;
			} else {
				rc = take_table(comm, r, e, err, errlen);
			}
		} else if (m->msg_case == HPU__ENVELOPE__MSG_ABORT) {
			snprintf(err, errlen, "the job was aborted: %s", m->abort->reason);
			rc = HPUCOLL_EABORTED;
		} else {
			hpu__codec_free(m);
			continue;
		}
		hpu__codec_free(m);
		return rc;
	}
}

int hpucoll_comm_init_env(hpucoll_comm **out, char *err, size_t errlen)
{
	*out = NULL;
	env e;
	if (read_env(&e, err, errlen) < 0)
		return HPUCOLL_EENV;
	char master[64], mine[64], bind[HPUCOLL_IPC_PATH_MAX + 16], ctl[128], host[256] = "";
	if (resolve(e.addr, master, sizeof master) < 0 ||
	    local_addr(master, mine, sizeof mine) < 0) {
		snprintf(err, errlen, "cannot resolve MASTER_ADDR=%s to a reachable IPv4 address",
			 e.addr);
		return HPUCOLL_EENV;
	}
	gethostname(host, sizeof host - 1);
	if (e.transport == HPUCOLL_TRANSPORT_IPC)
		snprintf(bind, sizeof bind, "ipc:///tmp/hpucoll-%s-r%d", e.job_id, e.rank);
	else
		snprintf(bind, sizeof bind, "tcp://%s:*", mine);
	snprintf(ctl, sizeof ctl, "tcp://%s:%s", master, e.port);
	hpucoll_comm *comm = NULL;
	char why[HPUCOLL__ERRMSG_MAX];
	int rc = hpucoll__comm_new(&comm, e.rank, e.world, bind, e.security, e.token,
				   strlen(e.token), why, sizeof why);
	if (rc == HPUCOLL_EENV) { /* a variable's value, not the socket (it said the socket) */
		snprintf(err, errlen, "%s", why);
		return rc;
	}
	if (rc) {
		snprintf(err, errlen, "cannot make the data socket at %s: %s", bind, why);
		return rc;
	}
	void *ctx = zmq_ctx_new(), *sock = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
	int linger = 0;
	int64_t maxmsg = HPU_CODEC_MAX_MSG;
	rc = HPUCOLL_ETRANSPORT;
	if (!sock) {
		snprintf(err, errlen, "cannot create a ZeroMQ socket: %s", zmq_strerror(errno));
		goto out;
	}
	zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
	zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
	if (zmq_connect(sock, ctl) != 0 ||
	    send_join(sock, &e, hpucoll_comm_endpoint(comm), host) != 0) {
		snprintf(err, errlen, "cannot reach the coordinator at %s: %s", ctl,
			 zmq_strerror(errno));
		goto out;
	}
	rc = await_reply(sock, comm, &e, err, errlen);
out:
	if (sock)
		zmq_close(sock);
	if (ctx)
		hpu__zmq_ctx_term(ctx);
	if (rc)
		hpucoll_comm_destroy(&comm);
	*out = comm;
	return rc;
}
