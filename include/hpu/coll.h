/* libhpucoll: collective communication between the ranks of a job.
 *
 * A communicator is made in two phases, because each rank's receive
 * endpoint (with its ephemeral port) must be known to the others first:
 *   hpucoll_comm_new()      binds this rank's receive socket;
 *   hpucoll_comm_connect()  takes the rank table (one endpoint per rank).
 * hpucoll_comm_init_env() does both for a process started by hpulaunch,
 * by joining the job's coordinator (MASTER_ADDR, MASTER_PORT, RANK, ...).
 *
 * Every call returns HPUCOLL_OK (0) or an hpucoll_err code; on error,
 * hpucoll_comm_errmsg() gives one sentence that names the peer rank
 * involved where there is one. Collectives must be called in the same
 * order on every rank. A communicator is used by one thread at a time.
 */
#ifndef HPU_COLL_H
#define HPU_COLL_H

#include <hpu/export.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hpucoll_err {
	HPUCOLL_OK = 0,
	HPUCOLL_EINVAL,    /* bad argument */
	HPUCOLL_ENOMEM,    /* out of memory */
	HPUCOLL_ETIMEDOUT, /* a peer did not send in time */
	HPUCOLL_EPROTO,    /* a peer sent something malformed or unexpected */
	HPUCOLL_ETRANSPORT,/* the ZeroMQ transport failed */
	HPUCOLL_EREFUSED,  /* the coordinator refused this rank */
	HPUCOLL_EABORTED,  /* the job was aborted */
	HPUCOLL_EENV,      /* the launch environment is missing or invalid */
	HPUCOLL_EPEER,     /* a peer process died */
} hpucoll_err;

typedef enum hpucoll_dtype {
	HPUCOLL_F32 = 0,
	HPUCOLL_F64,
	HPUCOLL_F16,  /* IEEE binary16; sums accumulate in f32 within a step */
	HPUCOLL_BF16, /* bfloat16; sums accumulate in f32 within a step */
	HPUCOLL_I32,
	HPUCOLL_I64,
	HPUCOLL_U8,
	HPUCOLL_NUM_DTYPES
} hpucoll_dtype;

typedef enum hpucoll_op {
	HPUCOLL_SUM = 0,
	HPUCOLL_AVG, /* sum / size; integer types truncate toward zero, and
		      * their sum wraps as SUM does (as NCCL's) */
	HPUCOLL_MAX,
	HPUCOLL_MIN,
	HPUCOLL_NUM_OPS
} hpucoll_op;

/* How ranks reach each other. AUTO: shared memory between ranks of one
 * node, ZeroMQ TCP between nodes. TCP / IPC: ZeroMQ over that transport
 * for every pair (IPC only within a node). SHM: shared memory within a
 * node (ZeroMQ TCP between nodes). The environment variable
 * HPUCOLL_TRANSPORT=auto|tcp|ipc|shm (hpulaunch --transport) chooses it
 * for hpucoll_comm_init_env(). */
typedef enum hpucoll_transport {
	HPUCOLL_TRANSPORT_AUTO = 0,
	HPUCOLL_TRANSPORT_TCP,
	HPUCOLL_TRANSPORT_IPC,
	HPUCOLL_TRANSPORT_SHM,
} hpucoll_transport;

/* Who may connect to a rank over ZeroMQ (the data plane). AUTH: every
 * connection proves during ZeroMQ's handshake that it knows the job's
 * secret (a one-time MAC, never the secret itself); frames are not
 * encrypted. ENCRYPT: ZeroMQ CURVE with a key pair derived from the
 * secret: authenticated and encrypted. NONE: anyone who reaches the
 * socket. A refused connection is closed with none of its frames read,
 * counted in hpucoll_stats.refused_connections and logged. The
 * environment variable HPUCOLL_SECURITY=auth|encrypt|none (hpulaunch
 * --data-plane) chooses it for hpucoll_comm_init_env(), default auth;
 * shared memory is protected by its owner and mode instead. */
typedef enum hpucoll_security {
	HPUCOLL_SECURITY_NONE = 0,
	HPUCOLL_SECURITY_AUTH,
	HPUCOLL_SECURITY_ENCRYPT,
} hpucoll_security;

typedef struct hpucoll_comm hpucoll_comm;

/* An asynchronous collective in flight. */
typedef struct hpucoll_req hpucoll_req;

/* The version of this header; the build checks it is hputrain's
 * project version. HPUCOLL_VERSION_CODE is major * 10000 + minor * 100
 * + patch (NCCL_VERSION_CODE's form). */
#define HPUCOLL_VERSION_MAJOR 0
#define HPUCOLL_VERSION_MINOR 1
#define HPUCOLL_VERSION_PATCH 0
#define HPUCOLL_VERSION_CODE                                                             \
	(HPUCOLL_VERSION_MAJOR * 10000 + HPUCOLL_VERSION_MINOR * 100 + HPUCOLL_VERSION_PATCH)

/* The version of the library loaded, in HPUCOLL_VERSION_CODE's form: a
 * program built against one coll.h may run with another libhpucoll.so of
 * the same soname (ncclGetVersion's use). */
HPU_API int hpucoll_version(void);

/* Returns a static sentence describing an error code. */
HPU_API const char *hpucoll_strerror(int err);

/* Parses "auto", "tcp", "ipc" or "shm"; returns 0 or -1. */
HPU_API int hpucoll_transport_parse(const char *s, hpucoll_transport *out);
HPU_API const char *hpucoll_transport_name(hpucoll_transport t);

/* Parses "none", "auth" or "encrypt"; returns 0 or -1. */
HPU_API int hpucoll_security_parse(const char *s, hpucoll_security *out);
HPU_API const char *hpucoll_security_name(hpucoll_security s);

/* Size in bytes of one element of `dtype` (0 if it is not a dtype). */
HPU_API size_t hpucoll_dtype_size(hpucoll_dtype dtype);

/* Creates the communicator of `rank` in a job of `size` ranks and binds its
 * receive socket to `bind_endpoint` (a ZeroMQ endpoint; "tcp://ADDR:*" picks
 * a free port). On success *out belongs to the caller. It raises the
 * process's soft limit on open files to the hard one (every connection to
 * a rank holds a descriptor), and never binds over an ipc path of another
 * user. */
HPU_API int hpucoll_comm_new(hpucoll_comm **out, int rank, int size,
		     const char *bind_endpoint);

/* The same with the data plane secured: every rank of the job must pass
 * the same mode and the same secret (secret_len bytes, e.g. the job
 * token). hpucoll_comm_new() is this with HPUCOLL_SECURITY_NONE. */
HPU_API int hpucoll_comm_new_secure(hpucoll_comm **out, int rank, int size,
			    const char *bind_endpoint,
			    hpucoll_security security, const void *secret,
			    size_t secret_len);

/* Returns the endpoint this rank is bound to, with the port resolved
 * ("" for a NULL comm). */
HPU_API const char *hpucoll_comm_endpoint(const hpucoll_comm *comm);

/* Optional, before connect: which node each rank is on (node_ids[size],
 * copied), the job's name (names the shared-memory segment of each node;
 * every rank of the job must pass the same one) and the transport. Without
 * it every rank counts as its own node and ZeroMQ carries everything. */
HPU_API int hpucoll_comm_set_topology(hpucoll_comm *comm, const int *node_ids,
			      const char *job_name,
			      hpucoll_transport transport);

/* Connects to the other ranks; endpoints[i] is rank i's bound endpoint.
 * The strings are copied. Ranks of one node using shared memory meet here
 * (every one of them must call it). */
HPU_API int hpucoll_comm_connect(hpucoll_comm *comm, const char *const *endpoints);

/* Joins the coordinator named by the environment hpulaunch sets (RANK,
 * WORLD_SIZE, LOCAL_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT, HPU_JOB_ID,
 * HPU_JOB_TOKEN, HPUCOLL_TRANSPORT and HPUCOLL_SECURITY), gets the rank table and returns a
 * connected communicator in *out. On failure, writes one sentence saying
 * why into err. It waits for the coordinator up to HPU_JOIN_TIMEOUT_MS
 * (900000: hpulaunch's --join-timeout sets it for its workers). */
HPU_API int hpucoll_comm_init_env(hpucoll_comm **out, char *err, size_t errlen);

/* Waits for outstanding requests, closes the sockets, detaches shared
 * memory and frees the communicator; sets *comm to NULL; safe on NULL and
 * twice. In a child of fork() (a communicator is not to be used there)
 * it only sets *comm to NULL: the sockets, threads and shared memory are
 * the parent's. */
HPU_API void hpucoll_comm_destroy(hpucoll_comm **comm);

/* Sets how long any single wait for a peer may last (default 60000 ms, or
 * HPUCOLL_TIMEOUT_MS from the environment); the error names the peer. A
 * peer on this node that has died is reported without that wait (in
 * about 0.5 s: the time its ABORT, saying why, is waited for). A timeout_ms of 0
 * or less, or a NULL comm, changes nothing (a wait without end would be a
 * hang). A rank that gives up may leave another completing the same
 * collective (its data had arrived); the ABORT it sends fails that
 * rank's next call. */
HPU_API void hpucoll_comm_set_timeout(hpucoll_comm *comm, int timeout_ms);

/* -1 and 0 for a NULL comm (a destroyed one: destroy sets the pointer
 * NULL), as the calls below take NULL too. */
HPU_API int hpucoll_comm_rank(const hpucoll_comm *comm);
HPU_API int hpucoll_comm_size(const hpucoll_comm *comm);

/* One sentence about the last error on this communicator ("" if none, or
 * for a NULL comm): a
 * copy, valid in this thread until its next call of hpucoll_comm_errmsg()
 * or hpucoll_comm_why(). */
HPU_API const char *hpucoll_comm_errmsg(const hpucoll_comm *comm);

/* What to say of a collective that returned rc on comm: the
 * communicator's sentence (naming the peer) where it has one, else
 * hpucoll_strerror(rc). comm may be NULL. */
HPU_API const char *hpucoll_comm_why(const hpucoll_comm *comm, int rc);

/* The rank the last error blames, or -1: a peer that died (*code
 * HPUCOLL_EPEER) or stopped answering (HPUCOLL_ETIMEDOUT: the ranks that
 * did not arrive at the collective, found by a probe before the timeout,
 * rather than the one waited for). An error another rank relayed (its
 * collective failed first) carries that rank's culprit, or names that
 * rank itself (HPUCOLL_EABORTED) when it blamed no one. code may be
 * NULL; -1 for a NULL comm. */
HPU_API int hpucoll_comm_culprit(const hpucoll_comm *comm, int *code);

/* Traffic of one communicator since it was made. Payload bytes are
 * counted when the transport takes them (queued to ZeroMQ, copied or in
 * place, or written into shared memory) and when the receiving rank takes
 * them in; message headers, ZeroMQ heartbeats, the error sentences a
 * failing rank sends its peers, and copies a rank makes of its own data
 * are not counted. A collective that fails keeps what it moved before
 * failing in the byte counts but does not count as completed. */
typedef struct hpucoll_stats {
	uint64_t bytes_sent;     /* payload bytes sent to other ranks */
	uint64_t bytes_received; /* payload bytes received from other ranks */
	uint64_t shm_bytes_sent; /* the part of bytes_sent over shared memory */
	uint64_t collectives;    /* completed with HPUCOLL_OK, blocking or
				    asynchronous */
	uint64_t refused_connections; /* ZeroMQ connections refused because
					 they did not prove they belong to
					 the job (hpucoll_security) */
} hpucoll_stats;

/* Fills *out with the counters since the communicator was made (zeros
 * for a NULL comm); safe to call from any thread, also while
 * asynchronous collectives run. A request's traffic is all counted once
 * hpucoll_wait or hpucoll_test says it is done. */
HPU_API void hpucoll_comm_stats(const hpucoll_comm *comm, hpucoll_stats *out);

/* One collective as it ran, for a profiler (hpucoll_comm_set_trace). */
typedef struct hpucoll_event {
	const char *name;      /* "all_reduce", "reduce_scatter", "all_gather",
				* "broadcast", "reduce", "barrier" */
	const char *algorithm; /* "ring", "recursive_doubling", "hierarchical",
				* "chain", "binomial_tree", "ring_gather",
				* "dissemination", or "local" (one rank) */
	uint32_t seq;          /* its number on this communicator (1, 2, ...) */
	uint64_t bytes;        /* the whole buffer: count x dtype size for
				* all_reduce, broadcast, reduce; size x count
				* x dtype size for reduce_scatter, all_gather;
				* 0 for barrier */
	uint64_t sent;         /* payload bytes this rank sent for it */
	hpucoll_dtype dtype;
	int async;             /* issued by an hpucoll_i* call */
	int64_t start_ns;      /* CLOCK_MONOTONIC, when it began to run */
	int64_t end_ns;        /* when it ended */
	int rc;                /* HPUCOLL_OK or the error */
} hpucoll_event;

typedef void (*hpucoll_trace_fn)(void *arg, const hpucoll_event *ev);

/* Calls fn(arg, ev) after every collective of comm ends (also one that
 * failed), on the thread that ran it: the caller's for a blocking call
 * that found nothing queued, the progress thread otherwise. fn must be
 * quick and thread-safe. NULL turns it off. Set it while no collective
 * is in flight. */
HPU_API void hpucoll_comm_set_trace(hpucoll_comm *comm, hpucoll_trace_fn fn, void *arg);

/* Sets how long a collective may wait for a peer before one stall warning
 * is printed (default 30000 ms or HPUCOLL_STALL_WARN_MS; 0: never); the
 * warning names the ranks that have and have not arrived. */
HPU_API void hpucoll_comm_set_stall_warning(hpucoll_comm *comm, int stall_ms);

/* ---- Messages ----
 *
 * The library prints nothing by itself once a hook is set: its few lines
 * (a collective's stall warning, a refused data-plane connection, a
 * transport that could not settle after a failure) go to the hook, as
 * one line without its newline, starting "hpucoll: " as printed ("hpucoll:
 * rank 1 refused a data-plane connection from ..."). Without a hook they
 * are written to stderr. The levels are syslog's priorities. */
typedef enum hpucoll_log_level {
	HPUCOLL_LOG_ERROR = 3,
	HPUCOLL_LOG_WARNING = 4,
	HPUCOLL_LOG_NOTICE = 5,
	HPUCOLL_LOG_INFO = 6,
	HPUCOLL_LOG_DEBUG = 7,
} hpucoll_log_level;

typedef void (*hpucoll_log_fn)(void *user, hpucoll_log_level level, const char *line);

/* Sends the library's lines to fn(user, level, line) for the whole
 * process; NULL: back to stderr. fn may be called from the library's own
 * threads (the security handler's, the progress thread), at any time
 * while a communicator exists, and must be thread-safe; set the hook
 * before the first communicator is made. */
HPU_API void hpucoll_set_log(hpucoll_log_fn fn, void *user);

/* ---- Collectives ----
 *
 * Every collective must be called in the same order on every rank, with
 * the same count, dtype, op and root: a count, dtype, op or kind that
 * differs is an error naming the rank once its data arrives. Ranks left
 * waiting for each other by a difference (broadcast's or reduce's root,
 * most often) find it when their stall probe goes out (the stall
 * threshold, or a quarter of the timeout, at most 1 s, before it) and
 * fail with "ranks disagree on collective #N: rank R called broadcast of
 * f32 from root 1 where this rank (0) called broadcast of f32 from root
 * 0". Not checked: a count of 0 (a local no-op that sends nothing: the
 * others' mismatch is found at the next collective), and a difference
 * that leaves no rank waiting (two ranks that each pass itself as
 * broadcast's root both return; the data each sent is found at the next
 * collective). Out-of-place unless the buffers coincide as described
 * (in-place). count/recvcount/sendcount are in elements of dtype. */

/* recvbuf[i] = op over ranks of sendbuf[i], on every rank.
 * In place: sendbuf == recvbuf. */
HPU_API int hpucoll_all_reduce(hpucoll_comm *comm, const void *sendbuf,
		       void *recvbuf, size_t count, hpucoll_dtype dtype,
		       hpucoll_op op);

/* sendbuf holds size * recvcount elements; rank r gets the reduction of
 * block r in recvbuf. In place: recvbuf == sendbuf + r * recvcount. */
HPU_API int hpucoll_reduce_scatter(hpucoll_comm *comm, const void *sendbuf,
			   void *recvbuf, size_t recvcount,
			   hpucoll_dtype dtype, hpucoll_op op);

/* recvbuf (size * sendcount elements) gets every rank's sendbuf, in rank
 * order. In place: sendbuf == recvbuf + r * sendcount. */
HPU_API int hpucoll_all_gather(hpucoll_comm *comm, const void *sendbuf,
		       void *recvbuf, size_t sendcount, hpucoll_dtype dtype);

/* recvbuf on every rank gets root's sendbuf (sendbuf is read on the root
 * only). In place: sendbuf == recvbuf. */
HPU_API int hpucoll_broadcast(hpucoll_comm *comm, const void *sendbuf, void *recvbuf,
		      size_t count, hpucoll_dtype dtype, int root);

/* recvbuf on root gets op over ranks of sendbuf (recvbuf is ignored
 * elsewhere and may be NULL). In place: sendbuf == recvbuf. */
HPU_API int hpucoll_reduce(hpucoll_comm *comm, const void *sendbuf, void *recvbuf,
		   size_t count, hpucoll_dtype dtype, hpucoll_op op, int root);

/* Returns on every rank only once every rank has entered it. */
HPU_API int hpucoll_barrier(hpucoll_comm *comm);

/* ---- Asynchronous forms ----
 *
 * Each starts the collective and returns at once with *req; a progress
 * thread moves the data while the caller computes. The buffers must not be
 * touched until the request completes. Requests complete in the order they
 * were issued, on every rank; a blocking collective issued after them runs
 * after them. */
HPU_API int hpucoll_iall_reduce(hpucoll_comm *comm, const void *sendbuf,
			void *recvbuf, size_t count, hpucoll_dtype dtype,
			hpucoll_op op, hpucoll_req **req);
HPU_API int hpucoll_ireduce_scatter(hpucoll_comm *comm, const void *sendbuf,
			    void *recvbuf, size_t recvcount,
			    hpucoll_dtype dtype, hpucoll_op op,
			    hpucoll_req **req);
HPU_API int hpucoll_iall_gather(hpucoll_comm *comm, const void *sendbuf,
			void *recvbuf, size_t sendcount, hpucoll_dtype dtype,
			hpucoll_req **req);
HPU_API int hpucoll_ibroadcast(hpucoll_comm *comm, const void *sendbuf,
		       void *recvbuf, size_t count, hpucoll_dtype dtype,
		       int root, hpucoll_req **req);
HPU_API int hpucoll_ireduce(hpucoll_comm *comm, const void *sendbuf, void *recvbuf,
		    size_t count, hpucoll_dtype dtype, hpucoll_op op, int root,
		    hpucoll_req **req);
HPU_API int hpucoll_ibarrier(hpucoll_comm *comm, hpucoll_req **req);

/* Waits for the request, frees it and sets *req to NULL; returns the
 * collective's result. */
HPU_API int hpucoll_wait(hpucoll_req **req);

/* Sets *done to 1 if the request has completed (then hpucoll_wait returns
 * at once), else 0. Returns HPUCOLL_OK or HPUCOLL_EINVAL. */
HPU_API int hpucoll_test(hpucoll_req *req, int *done);

#ifdef __cplusplus
}
#endif
#endif
