/* The communicator: its lifetime, its receive socket, the rank table and
 * error reporting. The transport is in transport.c, the collectives in
 * algo.c. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_internal.h"

static const char *const errstr[] = {
	[HPUCOLL_OK] = "Success.",
	[HPUCOLL_EINVAL] = "Invalid argument.",
	[HPUCOLL_ENOMEM] = "Out of memory.",
	[HPUCOLL_ETIMEDOUT] = "A peer did not send in time.",
	[HPUCOLL_EPROTO] = "A peer sent a malformed or unexpected message.",
	[HPUCOLL_ETRANSPORT] = "The ZeroMQ transport failed.",
	[HPUCOLL_EREFUSED] = "The coordinator refused this rank.",
	[HPUCOLL_EABORTED] = "The job was aborted.",
	[HPUCOLL_EENV] = "The launch environment is missing or invalid.",
};

const char *hpucoll_strerror(int err)
{
	if (err < 0 || (size_t)err >= sizeof(errstr) / sizeof(errstr[0]) ||
	    errstr[err] == NULL)
		return "Unknown error code.";
	return errstr[err];
}

void hpucoll__set_error(hpucoll_comm *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
	va_end(ap);
}

int hpucoll__zmq_error(hpucoll_comm *c, const char *call)
{
	int err = zmq_errno();

	hpucoll__set_error(c, "%s: %s failed: %s.", c->what, call,
			   zmq_strerror(err));
	return err == ENOMEM ? HPUCOLL_ENOMEM : HPUCOLL_ETRANSPORT;
}

/* Reads HPUCOLL_TIMEOUT_MS into *ms when it is set; a value that is not a
 * whole number of milliseconds is an error. */
static int timeout_from_env(int *ms)
{
	const char *s = getenv("HPUCOLL_TIMEOUT_MS");
	char *end;
	long v;

	if (s == NULL || *s == '\0')
		return HPUCOLL_OK;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < INT_MIN || v > INT_MAX)
		return HPUCOLL_EENV;
	*ms = (int)v;
	return HPUCOLL_OK;
}

static int set_int(void *sock, int opt, int v)
{
	return zmq_setsockopt(sock, opt, &v, sizeof(v));
}

/* Makes the receive socket, binds it and records the resolved endpoint. */
static int bind_pull(hpucoll_comm *c, const char *endpoint)
{
	int64_t maxmsg = HPUCOLL__MAX_FRAME;
	size_t len = sizeof(c->endpoint);

	c->pull = zmq_socket(c->ctx, ZMQ_PULL);
	if (c->pull == NULL)
		return hpucoll__zmq_error(c, "zmq_socket");
	if (set_int(c->pull, ZMQ_RCVHWM, 0) != 0 ||
	    set_int(c->pull, ZMQ_LINGER, 0) != 0 ||
	    zmq_setsockopt(c->pull, ZMQ_MAXMSGSIZE, &maxmsg,
			   sizeof(maxmsg)) != 0)
		return hpucoll__zmq_error(c, "zmq_setsockopt");
	if (zmq_bind(c->pull, endpoint) != 0)
		return hpucoll__zmq_error(c, "zmq_bind");
	if (zmq_getsockopt(c->pull, ZMQ_LAST_ENDPOINT, c->endpoint, &len) != 0)
		return hpucoll__zmq_error(c, "zmq_getsockopt");
	return HPUCOLL_OK;
}

int hpucoll_comm_new(hpucoll_comm **out, int rank, int size,
		     const char *bind_endpoint)
{
	hpucoll_comm *c;
	int rc;

	if (out == NULL)
		return HPUCOLL_EINVAL;
	*out = NULL;
	if (size < 1 || size > HPUCOLL__MAX_SIZE || rank < 0 || rank >= size ||
	    bind_endpoint == NULL)
		return HPUCOLL_EINVAL;
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return HPUCOLL_ENOMEM;
	c->rank = rank;
	c->size = size;
	c->what = "comm_new";
	c->timeout_ms = HPUCOLL__DEFAULT_TIMEOUT_MS;
	rc = timeout_from_env(&c->timeout_ms);
	if (rc != HPUCOLL_OK)
		goto fail;
	c->ctx = zmq_ctx_new();
	if (c->ctx == NULL) {
		rc = hpucoll__zmq_error(c, "zmq_ctx_new");
		goto fail;
	}
	rc = bind_pull(c, bind_endpoint);
	if (rc != HPUCOLL_OK)
		goto fail;
	*out = c;
	return HPUCOLL_OK;
fail:
	hpucoll_comm_destroy(&c);
	return rc;
}

const char *hpucoll_comm_endpoint(const hpucoll_comm *comm)
{
	return comm->endpoint;
}

int hpucoll_comm_connect(hpucoll_comm *comm, const char *const *endpoints)
{
	struct hpucoll__peer *peers;
	int i;

	if (comm == NULL || endpoints == NULL)
		return HPUCOLL_EINVAL;
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
		peers[i].endpoint = strdup(endpoints[i]);
		if (peers[i].endpoint == NULL) {
			hpucoll__peers_free(comm);
			return HPUCOLL_ENOMEM;
		}
	}
	return HPUCOLL_OK;
}

/* ZeroMQ leaves the file of an ipc:// endpoint behind; the rank that bound
 * it removes it (abstract "ipc://@name" endpoints have no file). */
static void unlink_ipc(const char *endpoint)
{
	static const char prefix[] = "ipc://";
	const char *path = endpoint + sizeof(prefix) - 1;

	if (strncmp(endpoint, prefix, sizeof(prefix) - 1) == 0 &&
	    path[0] != '@' && path[0] != '\0')
		unlink(path);
}

void hpucoll_comm_destroy(hpucoll_comm **comm)
{
	hpucoll_comm *c;

	if (comm == NULL || *comm == NULL)
		return;
	c = *comm;
	*comm = NULL;
	hpucoll__peers_free(c);
	if (c->pull != NULL)
		zmq_close(c->pull);
	if (c->ctx != NULL) {
		while (zmq_ctx_term(c->ctx) != 0 && zmq_errno() == EINTR)
			;
	}
	unlink_ipc(c->endpoint);
	free(c);
}

void hpucoll_comm_set_timeout(hpucoll_comm *comm, int timeout_ms)
{
	comm->timeout_ms = timeout_ms;
	hpucoll__peers_set_timeout(comm);
}

int hpucoll_comm_rank(const hpucoll_comm *comm)
{
	return comm->rank;
}

int hpucoll_comm_size(const hpucoll_comm *comm)
{
	return comm->size;
}

const char *hpucoll_comm_errmsg(const hpucoll_comm *comm)
{
	return comm->errmsg;
}
