/* Internals of libhpucoll shared by the communicator (comm.c, its
 * lifecycle; comm_core.c, the helpers every file calls), the
 * transports (transport.c dispatching to transport_zmq.c and
 * transport_shm.c over shm.c; waits and stall warnings in wait.c), the
 * progress engine (progress.c), the reduction kernels (reduce.c) and the
 * collective algorithms (algo.c).
 *
 * Threads. A communicator has at most one worker thread (progress.c),
 * started by the first asynchronous call. Collectives run one at a time,
 * in issue order, either on that thread or inline on the caller's thread
 * when nothing is queued or running; whoever runs one owns everything
 * below the "transport" line of struct hpucoll_comm until it ends. The
 * hand-over goes through comm->mu, which is also the memory barrier that
 * ZeroMQ asks for when a socket changes threads.
 *
 * Wire format. Every message is one header frame of HPUCOLL__HDR_SIZE
 * bytes, followed by exactly one payload frame of `len` bytes when len > 0
 * (no payload frame when len == 0). All header fields are little-endian:
 *
 *   offset size field
 *        0    4 magic   HPUCOLL__MAGIC
 *        4    4 src     sender's rank
 *        8    4 seq     the sender's collective sequence number (1, 2, ...)
 *       12    1 kind    enum hpucoll__kind in the low 4 bits, the
 *                       algorithm (enum hpucoll__algo) in the high 4 bits
 *       13    1 arg     (dtype << 4 | op) for reductions, dtype << 4 for
 *                       gathers and broadcasts, 0 for barriers
 *       14    2 tag     the step (ring step, doubling round, ...)
 *       16    8 off     byte offset of the payload in the result buffer
 *       24    8 len     payload bytes
 *
 * A receiver knows every field of the next message it expects from a given
 * sender, so it checks them all; any difference is a protocol error.
 * Three kinds may arrive unasked, always over ZeroMQ (never shared
 * memory), and are taken out of the stream before any header check, so
 * they never stand in for data:
 *
 *   HPUCOLL__ABORT        a rank whose collective failed sends it to every
 *                         peer (payload: its error sentence, arg: its
 *                         error code, off: the rank its error blames + 1,
 *                         or 0), so that the others fail at once
 *                         and name the rank that caused it instead of
 *                         waiting for their own timeouts.
 *   HPUCOLL__PROBE        a rank whose collective has waited past the
 *                         stall threshold asks every peer where it is
 *                         (seq: the prober's collective; no payload).
 *   HPUCOLL__PROBE_REPLY  the answer of a rank that is waiting inside a
 *                         collective (only there does it read its socket):
 *                         seq: its collective, arg: that collective's kind
 *                         byte, tag: its root + 1 (0: none), off: the seq
 *                         of the probe it answers, with the collective's
 *                         dtype << 4 | op in bits 32-39; no payload. A
 *                         reply to an older probe is dropped. A reply from
 *                         the prober's own collective whose kind, dtype,
 *                         op or root differs from the prober's is an error
 *                         at once (the ranks disagree; waiting on would
 *                         end in a timeout that blames a live rank).
 *
 * Shared memory (shm.h) carries the same header, without the encoding.
 */
#ifndef HPUCOLL_COMM_INTERNAL_H
#define HPUCOLL_COMM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <zmq.h>

#include "hpu/coll.h"

#define HPUCOLL__MAGIC 0x4c4f4348u /* "HCOL" on the wire */
#define HPUCOLL__HDR_SIZE 32
/* Largest payload of one ZeroMQ message: large transfers are split into
 * messages of at most this many bytes so that forwarding and reducing
 * overlap with the transfer. */
#define HPUCOLL__SEG_BYTES (1u << 20)
/* Frames larger than this make ZeroMQ drop the sending connection. */
#define HPUCOLL__MAX_FRAME (4 * (int64_t)HPUCOLL__SEG_BYTES)
/* ZeroMQ sends payloads of at least this many bytes in place, without
 * copying (zmq_msg_init_data); smaller ones are copied. Measured, 2 ranks
 * over TCP loopback, all_reduce busbw: 8 MiB 2.27 GB/s in place vs 1.40
 * copied, 128 MiB 1.99 vs 1.07. */
#define HPUCOLL__ZC_MIN (32u * 1024u)
/* The ring numbers its 2 * (size - 1) steps in the 16-bit tag. */
#define HPUCOLL__MAX_SIZE 32768
#define HPUCOLL__DEFAULT_TIMEOUT_MS 60000
#define HPUCOLL__DEFAULT_STALL_MS 30000
/* How long closing a send socket may wait to flush queued messages. */
#define HPUCOLL__LINGER_MS 1000
/* ZeroMQ heartbeats: a connection silent for the heartbeat timeout
 * (HPUCOLL_HEARTBEAT_MS, this by default) is closed, which is how a dead
 * or unreachable remote peer is noticed. What was in flight on it is
 * lost, so a peer stopped that long (SIGSTOP, a debugger, a paused VM)
 * fails the job: 5 s made a worker paused for 6 s end the job as a
 * collective mismatch or a hang; a vanished node is noticed sooner by
 * its launcher's heartbeat (10 s). */
#define HPUCOLL__HEARTBEAT_IVL_MS 1000
#define HPUCOLL__HEARTBEAT_TIMEOUT_MS 30000
/* A peer whose connection closed is declared dead if the awaited message
 * has not arrived this long afterwards (what it sent before dying may
 * still be on its way over another connection). */
#define HPUCOLL__LOST_GRACE_MS 500
/* Under auth, a rank makes a new connection (with a fresh proof) to a peer
 * at most this often (transport_zmq.c); ZeroMQ's own reconnect interval. */
#define HPUCOLL__REDIAL_MS 100
/* The ZAP status with which a rank refuses a proof it accepted before (a
 * replay), where a wrong proof gets 400 (secure.c). */
#define HPUCOLL__ZAP_REPLAY 300
/* And one from an address that is not of the job's peers. */
#define HPUCOLL__ZAP_NOT_A_PEER 500
/* A connection whose ZeroMQ handshake has not finished this long after it
 * was accepted is closed (a rank's descriptors are not held by
 * connections that never speak). */
#define HPUCOLL__HANDSHAKE_IVL_MS 5000
/* Waits on shared memory check for ABORT messages this often. */
#define HPUCOLL__SLICE_MS 100
#define HPUCOLL__ENDPOINT_MAX 256
#define HPUCOLL__ERRMSG_MAX 512
#define HPUCOLL__JOB_MAX 128 /* a job id (< 64) + '-' + a 32-digit session */

enum hpucoll__kind {
	HPUCOLL__ALL_REDUCE = 1,
	HPUCOLL__BROADCAST = 2,
	HPUCOLL__BARRIER = 3,
	HPUCOLL__REDUCE_SCATTER = 4,
	HPUCOLL__ALL_GATHER = 5,
	HPUCOLL__REDUCE = 6,
	HPUCOLL__ABORT = 7,
	HPUCOLL__PROBE = 8,
	HPUCOLL__PROBE_REPLY = 9,
};

/* Algorithms, as named in the high bits of the kind byte. 0 is the
 * default of each collective: ring, chain broadcast, dissemination
 * barrier. */
enum hpucoll__algo {
	HPUCOLL__ALGO_RING = 0,
	HPUCOLL__ALGO_RD = 1,       /* recursive doubling */
	HPUCOLL__ALGO_TREE = 2,     /* binomial tree */
	HPUCOLL__ALGO_HIER = 3,     /* hierarchical: node, then across nodes */
	HPUCOLL__ALGO_GATHER = 4,   /* reduce: the gather after the ring */
	HPUCOLL__NUM_ALGOS
};

struct hpucoll__hdr {
	uint32_t magic;
	uint32_t src;
	uint32_t seq;
	uint8_t kind;
	uint8_t arg;
	uint16_t tag;
	uint64_t off;
	uint64_t len;
};

/* A ZeroMQ message received from a rank before it was asked for. */
struct hpucoll__msg {
	struct hpucoll__hdr hdr;
	zmq_msg_t body; /* the payload; an empty message when len == 0 */
	struct hpucoll__msg *next;
};

struct hpucoll__transport;

struct hpucoll__peer {
	char *endpoint; /* the rank's bound endpoint */
	const struct hpucoll__transport *tp; /* what carries this pair's data */
	int node;       /* its node (its rank without a topology) */
	int shm;        /* its index on this node when shared memory carries
			   this pair, else -1 */
	void *push;     /* ZeroMQ send socket, connected at connect time */
	void *mon;      /* PAIR socket receiving push's monitor events */
	int lost;       /* push's connection closed and did not come back */
	int64_t lost_ms;
	int refused;    /* push's handshake failed (secure.c) */
	uint32_t refused_status; /* the ZAP status it failed with, or 0 */
	int redial;     /* push must be replaced (auth: transport_zmq.c) */
	unsigned dials; /* push sockets made so far (names their monitors) */
	int64_t dial_ms; /* when the latest was made */
	atomic_int zc;  /* zero-copy sends ZeroMQ has not released yet */
	struct hpucoll__msg *head; /* messages that arrived early, in order */
	struct hpucoll__msg *tail;
	zmq_msg_t held; /* payload handed out by hpucoll__recv, until release */
	int holding;
	/* Stall probes (wait.c): what is known of where this rank is. */
	uint32_t seen_seq;  /* collective of the latest data read from it */
	uint32_t reply_to;  /* our collective its last probe reply answers */
	uint32_t reply_seq; /* the collective that reply says it is in */
	uint8_t reply_kind; /* and that collective's kind byte */
	uint8_t reply_arg;  /* its dtype << 4 | op */
	int reply_root;     /* its root (broadcast, reduce), or -1 */
};

/* A set of ranks an algorithm runs on: index i is rank ranks[i] (or i when
 * ranks is NULL); `me` is this rank's index. */
struct hpucoll__group {
	int n;
	int me;
	int *ranks;
	size_t seg;   /* largest payload of a message between two members */
	int shm_only; /* every pair of members talks over shared memory */
};

/* Algorithm choice, from the environment at connect time (algo.c). Index
 * [1] applies to groups that talk only over shared memory, [0] to the
 * others. */
struct hpucoll__tune {
	int algo;               /* HPUCOLL_ALGO: -1 auto, else hpucoll__algo */
	size_t small_bytes[2];  /* all_reduce: recursive doubling up to this */
	size_t bcast_small;     /* broadcast: binomial tree up to this */
	size_t reduce_small[2]; /* reduce: binomial tree up to this */
};

/* The arguments of one collective. */
struct hpucoll__args {
	int async;    /* issued by an hpucoll_i* call (for the trace) */
	uint8_t kind; /* enum hpucoll__kind */
	const void *sendbuf;
	void *recvbuf;
	size_t count; /* per kind, as in the public call */
	hpucoll_dtype dtype;
	hpucoll_op op;
	int root;
};

struct hpucoll_req {
	hpucoll_comm *comm;
	struct hpucoll__args args;
	atomic_int done;
	int rc;
	struct hpucoll_req *next;
};

struct hpucoll_comm {
	int rank;
	int size;
	atomic_int timeout_ms; /* each wait for a peer; negative: forever */
	int stall_ms;          /* warn after waiting this long; 0: never */
	int heartbeat_ms;      /* a silent connection is closed after this */
	hpucoll_trace_fn trace; /* hpucoll_comm_set_trace */
	void *trace_arg;
	char endpoint[HPUCOLL__ENDPOINT_MAX];
	int ipc_lock; /* the flock on an ipc endpoint's PATH.lock, or -1 */
	int pid;      /* the process that made it (a fork's child may not end it) */
	char ipc_lock_path[HPUCOLL__ENDPOINT_MAX + 8];
	/* Topology, from hpucoll_comm_set_topology(). */
	int *node_ids; /* NULL: every rank is its own node */
	char job[HPUCOLL__JOB_MAX];
	hpucoll_transport transport;
	struct hpucoll__tune tune;

	/* Progress engine (progress.c), guarded by mu. */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t thread;
	int thread_started;
	int stopping;
	int busy;    /* a collective is running */
	int idle;    /* the worker sleeps on cv, waiting for work */
	int waiters; /* threads sleeping on cv until a request is done */
	struct hpucoll_req *qhead, *qtail;

	/* Errors: written by whoever runs a collective, and by the caller's
	 * thread for bad arguments; errlock keeps the sentence whole (readers
	 * copy it under the lock: hpucoll_comm_errmsg). */
	pthread_mutex_t errlock;
	char errmsg[HPUCOLL__ERRMSG_MAX];

	/* Traffic (hpucoll_comm_stats): added to by whoever runs a
	 * collective, read by any thread. */
	struct hpucoll__counters {
		_Atomic uint64_t sent;     /* payload bytes to other ranks */
		_Atomic uint64_t received; /* payload bytes from them */
		_Atomic uint64_t shm_sent; /* the part of sent over shm */
		_Atomic uint64_t collectives; /* that returned HPUCOLL_OK */
	} stats;

	/* Data-plane authentication (secure.c): the key, and the ZAP
	 * handler's thread, which alone touches the nonces. */
	struct hpucoll__sec {
		hpucoll_security mode;
		uint8_t key[32];
		char curve_sk[41], curve_pk[41]; /* Z85, ENCRYPT only */
		uint8_t curve_pub[32];
		void *zap;             /* REP at inproc://zeromq.zap.01 */
		void *mon;             /* PAIR: the pull socket's monitor */
		int logged;            /* refusals said on stderr */
		/* A handshake that did not finish, said only once this
		 * comm has lived HPUCOLL__SEC_UNFINISHED_MS past it: a peer
		 * that died in the middle of its start ends the job by
		 * itself, its rank named, and the line only distracted
		 * from that error. 0: none waiting. */
		int64_t unfinished_at;
		pthread_t thread;
		int running;
		uint8_t (*nonces)[16]; /* PLAIN proofs accepted so far */
		size_t n_nonces, cap_nonces;
		/* Where the job's peers connect from, set once at connect
		 * (hpucoll__sec_peers) before `filter`, which the handler
		 * reads: the hosts of their tcp endpoints, and whether
		 * ipc peers must be of this process's uid. */
		char (*hosts)[64];
		int n_hosts;
		int ipc;
		atomic_int filter;
		_Atomic uint64_t refused; /* connections refused */
	} sec;

	/* ---- transport: owned by the thread running a collective ---- */
	void *ctx;
	void *pull; /* this rank's one ZeroMQ receive socket */
	struct hpucoll__peer *peers; /* `size` entries once connected */
	struct hpucoll__shm *shm;    /* this node's segment, or NULL */
	unsigned char *shm_buf;      /* staging for shared-memory sends */
	void *shm_next;              /* what the last shared-memory send_buf
					handed out: a slot, or shm_buf */
	zmq_msg_t out;               /* staging for ZeroMQ sends */
	int zc_pending;              /* zero-copy sends in this collective */
	struct hpucoll__group all;   /* every rank */
	struct hpucoll__group local; /* the ranks of this node (hierarchy) */
	struct hpucoll__group cross; /* same local index, one per node */
	int hier_ok;                 /* the hierarchical all-reduce applies */
	void *tmp;                   /* scratch for algorithms */
	size_t tmp_len;
	/* The collective under way. */
	uint32_t seq;       /* collectives started so far */
	const char *what;   /* its name, for errors */
	uint8_t kind;       /* kind | algo << 4 */
	uint8_t arg;        /* dtype << 4 | op */
	int root;           /* broadcast's and reduce's root, else -1 */
	int stall_warned;   /* it printed its stall warning */
	uint32_t probe_seq; /* the collective whose stall probe went out */
	int64_t probe_ms;   /* when it went out */
	int64_t stall_start; /* start of the wait that passed the threshold */
	int stall_peer;     /* the rank that wait was for */
	int failed;         /* the error that left the communicator unusable */
	int got_abort;      /* it failed because another rank gave up */
	/* The rank the error blames (hpucoll_comm_culprit): -1 none. */
	int culprit;
	int culprit_code;   /* HPUCOLL_EPEER: died; HPUCOLL_ETIMEDOUT: silent;
			     * HPUCOLL_EABORTED: its own collective failed */
};

/* ---- comm_core.c: the base every file calls (and nothing else) ---- */

/* Adds n to one of comm->stats (relaxed: the counters order nothing). */
static inline void hpucoll__count(_Atomic uint64_t *ctr, uint64_t n)
{
	atomic_fetch_add_explicit(ctr, n, memory_order_relaxed);
}

/* One line of the library's (printf-style, no newline): to the hook of
 * hpucoll_set_log, or to stderr without one (log.c). */
void hpucoll__log(hpucoll_log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Formats one sentence into comm->errmsg. */
void hpucoll__set_error(hpucoll_comm *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Maps zmq_errno() after a failed ZeroMQ call to an hpucoll_err and says
 * what failed in comm->errmsg. */
int hpucoll__zmq_error(hpucoll_comm *c, const char *call);

/* A scratch buffer of at least `len` bytes, kept until destroy (NULL when
 * out of memory). */
void *hpucoll__scratch(hpucoll_comm *c, size_t len);

/* The name of the collective kind in the low 4 bits of `kind` (an enum
 * hpucoll__kind, or a header's kind byte), "unknown" if none. */
const char *hpucoll__kind_name(unsigned kind);

/* Checks that a received header equals `want`; if not, says how they
 * differ in errmsg and returns HPUCOLL_EPROTO. */
int hpucoll__check_hdr(hpucoll_comm *c, const struct hpucoll__hdr *want,
		       const struct hpucoll__hdr *got);

/* Takes one event off the monitor socket `mon` (NULL: none) without
 * waiting, with its endpoint frame; returns 1 with its number in *ev and
 * its value (a ZAP status, an fd, ...) in *value unless NULL, or 0 when
 * none. */
int hpucoll__monitor_event(void *mon, uint16_t *ev, uint32_t *value);

/* ---- comm.c: the lifecycle, above everything else ---- */

/* hpucoll_comm_new_secure() that also writes, when it fails, the sentence
 * saying why into err (errlen bytes; NULL for none): the communicator,
 * and with it hpucoll_comm_errmsg(), is gone by then. */
int hpucoll__comm_new(hpucoll_comm **out, int rank, int size,
		      const char *bind_endpoint, hpucoll_security security,
		      const void *secret, size_t secret_len, char *err,
		      size_t errlen);

/* The monitor events of a failed security handshake (secure.c). */
#define HPUCOLL__HANDSHAKE_FAILED                                            \
	(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |                              \
	 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)

/* secure.c: _start binds the ZAP handler's socket on c->ctx (before any
 * socket binds or connects); _run, once c->pull is bound, watches its
 * handshakes and starts the handler's thread; _unwatch before closing
 * c->pull (it also closes the handler's sockets when its thread never
 * started, which zmq_ctx_term() would wait for); _join after the context
 * is terminated. _server and _client
 * set a socket's options as the receiving side or the side connecting to
 * rank dst; they return 0, or -1 with zmq_errno() set. */
int hpucoll__sec_start(hpucoll_comm *c, hpucoll_security mode,
		       const void *secret, size_t len);
int hpucoll__sec_run(hpucoll_comm *c);
void hpucoll__sec_unwatch(hpucoll_comm *c);
void hpucoll__sec_join(hpucoll_comm *c);
int hpucoll__sec_server(hpucoll_comm *c, void *sock);
/* From the rank table on, the handler accepts connections only from the
 * hosts of the peers' tcp endpoints, and on ipc only from this process's
 * uid (no filter when an endpoint's host is not a numeric address). */
int hpucoll__sec_peers(hpucoll_comm *c, const char *const *endpoints);
int hpucoll__sec_client(hpucoll_comm *c, void *sock, int dst);

/* ---- transport.c: the dispatch ---- */

/* A transport's data path between this rank and one peer, behind
 * hpucoll__send / send_buf / send_commit / recv / release (each as
 * described there; the dispatch counts the traffic). */
struct hpucoll__transport {
	int copies; /* a send copies its payload (shared memory): one built
		       in send_buf's buffer is not copied again */
	int (*send)(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		    const void *data, int zc);
	void *(*send_buf)(hpucoll_comm *c, int dst, size_t len);
	int (*send_commit)(hpucoll_comm *c, int dst,
			   const struct hpucoll__hdr *hdr);
	int (*recv)(hpucoll_comm *c, const struct hpucoll__hdr *want,
		    const void **data);
	void (*release)(hpucoll_comm *c, int src);
};

/* Makes the send sockets and attaches shared memory (at connect). */
int hpucoll__transport_open(hpucoll_comm *c);

/* Closes the send sockets, shared memory and frees the peers table. */
void hpucoll__transport_close(hpucoll_comm *c);

/* Largest payload of one message between ranks a and b; every rank
 * computes the same value for the same pair. */
size_t hpucoll__link_max(const hpucoll_comm *c, int a, int b);

/* Sends a header and hdr->len bytes of `data` to rank `dst`. With `zc`,
 * ZeroMQ may send the bytes in place: then they must not change until the
 * receiver has them or hpucoll__fence() returned. Sends, and receives by
 * hpucoll__recv, that succeed are counted in c->stats. */
int hpucoll__send(hpucoll_comm *c, int dst, const struct hpucoll__hdr *hdr,
		  const void *data, int zc);

/* 1 when the transport to `dst` copies what hpucoll__send() sends (shared
 * memory): a payload built in hpucoll__send_buf() then saves that copy. */
int hpucoll__send_copies(const hpucoll_comm *c, int dst);

/* Returns a buffer of `len` bytes to build the payload of the next message
 * to `dst` in, sent by hpucoll__send_commit() (NULL: out of memory). No
 * other send to `dst` may come between the two: on shared memory the
 * buffer may be the ring's next slot, which that send would take. */
void *hpucoll__send_buf(hpucoll_comm *c, int dst, size_t len);
int hpucoll__send_commit(hpucoll_comm *c, int dst,
			 const struct hpucoll__hdr *hdr);

/* Waits for the next message from rank `want->src` and checks that its
 * header equals `want`. On success *data points at its payload, valid
 * until hpucoll__release(c, want->src); one message per sender at a time. */
int hpucoll__recv(hpucoll_comm *c, const struct hpucoll__hdr *want,
		  const void **data);
void hpucoll__release(hpucoll_comm *c, int src);

/* Waits until ZeroMQ has released every zero-copy send. */
int hpucoll__fence(hpucoll_comm *c);

/* After a failure: tells every peer (best effort), and makes sure ZeroMQ
 * holds no pointer into the caller's buffers any more. */
void hpucoll__fail_transport(hpucoll_comm *c, int rc);

/* ---- transport_zmq.c: ZeroMQ, and every pair's control messages ---- */

extern const struct hpucoll__transport hpucoll__zmq_transport;

/* Opens the send socket to every peer, with its monitor. */
int hpucoll__zmq_open(hpucoll_comm *c);

/* Closes them, dropping the messages queued and the payloads held; a
 * second call closes nothing. */
void hpucoll__zmq_close(hpucoll_comm *c);

/* Reads what ZeroMQ has without waiting, queueing data by sender and
 * answering probes; returns the error of an ABORT or a malformed message
 * (`want` names the awaited rank in it), else HPUCOLL_OK. */
int hpucoll__zmq_poll_aborts(hpucoll_comm *c, int want);

/* The same for up to `ms`: returns early only with an error. */
int hpucoll__zmq_await_abort(hpucoll_comm *c, int want, int64_t ms);

/* hpucoll__fence's and hpucoll__fail_transport's work on ZeroMQ: waits
 * for the zero-copy sends; sends ABORTs and lets go of the zero-copy
 * sends. */
int hpucoll__zmq_fence(hpucoll_comm *c);
void hpucoll__zmq_fail(hpucoll_comm *c, int rc);

/* ---- transport_shm.c: shared memory between the ranks of a node ---- */

extern const struct hpucoll__transport hpucoll__shm_transport;

/* Numbers this node's ranks, points the local peers at the shared-memory
 * transport and attaches the node's segment; _close detaches it. */
int hpucoll__shm_link_open(hpucoll_comm *c);
void hpucoll__shm_link_close(hpucoll_comm *c);

/* ---- wait.c: waiting for a peer ---- */

/* One wait of a collective for a peer. */
struct hpucoll__wait {
	int64_t start;
	int64_t deadline; /* -1: never */
	int timeout_ms;
};

/* CLOCK_MONOTONIC in milliseconds. */
int64_t hpucoll__now_ms(void);

/* Starts a wait with the communicator's timeout. */
void hpucoll__wait_begin(hpucoll_comm *c, struct hpucoll__wait *w);

/* Milliseconds until the next thing a wait must look at (the deadline or
 * the stall check), at most `cap`; -1 when there is none and no cap. */
long hpucoll__wait_ms(const hpucoll_comm *c, const struct hpucoll__wait *w,
		      int64_t now, long cap);

/* The stall check of a wait for `peer`, between two sleeps of every wait
 * loop: sends the stall probe once the threshold has passed, prints the
 * warning once the replies are in or the window is over. Returns
 * hpucoll__disagreement(): the wait ends with it when not HPUCOLL_OK. */
int hpucoll__stall_check(hpucoll_comm *c, const struct hpucoll__wait *w,
			 int peer, int64_t now);

/* "broadcast of f32 from root 1", "all_reduce of bf16 with sum",
 * "barrier": a collective's kind byte, arg byte (dtype << 4 | op) and
 * root (-1: none or unknown), in the user's terms, for errors. */
void hpucoll__describe(char *buf, size_t len, unsigned kind, unsigned arg,
		       int root);

/* Sets the error "ranks disagree on collective #seq: rank R called
 * THEIRS where this rank called MINE ..." (hpucoll__describe's words);
 * returns HPUCOLL_EPROTO. */
int hpucoll__disagree(hpucoll_comm *c, uint32_t seq, int rank, const char *theirs,
		      const char *mine);

/* HPUCOLL_EPROTO, with the error set, when a probe reply says that a rank
 * is in this collective with another kind, dtype, op or root; else
 * HPUCOLL_OK. */
int hpucoll__disagreement(hpucoll_comm *c);

/* A collective ends (`tail` says how) while its probe's window is open:
 * prints the warning with what is known. */
void hpucoll__stall_flush(hpucoll_comm *c, const char *tail);

/* Notes that the error being set is rank r's doing (code: HPUCOLL_EPEER
 * it died, HPUCOLL_ETIMEDOUT it stopped answering); the first one
 * stands. */
void hpucoll__blame(hpucoll_comm *c, int r, int code);

/* Wait w for src timed out: says so in errmsg, naming the ranks the stall
 * probe found silent if src itself waits; returns HPUCOLL_ETIMEDOUT. */
int hpucoll__timed_out(hpucoll_comm *c, const struct hpucoll__wait *w,
		       int src);

/* Notes that rank src sent data of collective seq. */
void hpucoll__saw_data(hpucoll_comm *c, int src, uint32_t seq);

/* A message off ZeroMQ: a probe is answered and a probe reply taken
 * (returns 1: the message is used up); data is noted (hpucoll__saw_data)
 * and left to the caller (returns 0). */
int hpucoll__probe_take(hpucoll_comm *c, const struct hpucoll__hdr *h);

/* ---- reduce.c ---- */

/* dst[i] = a[i] op b[i] for n elements; dst may be a or b, otherwise it
 * overlaps neither. AVG adds (hpucoll__divide finishes it). */
void hpucoll__reduce(hpucoll_dtype dtype, hpucoll_op op, void *dst,
		     const void *a, const void *b, size_t n);

/* dst[i] = dst2[i] = a[i] op b[i]: the same bytes as hpucoll__reduce()
 * into both, in one pass. dst may be a; dst2 overlaps nothing. */
void hpucoll__reduce2(hpucoll_dtype dtype, hpucoll_op op, void *dst,
		      void *dst2, const void *a, const void *b, size_t n);

/* x[i] /= by for n elements (integers truncate toward zero). */
void hpucoll__divide(hpucoll_dtype dtype, void *x, size_t n, int by);

/* ---- progress.c ---- */

/* Runs what is queued, then stops the worker thread (at destroy). */
void hpucoll__progress_stop(hpucoll_comm *c);

/* ---- algo.c ---- */

/* Reads the HPUCOLL_* tuning variables into c->tune. */
int hpucoll__tune_from_env(hpucoll_comm *c);

/* Builds c->all, c->local, c->cross and decides c->hier_ok. */
int hpucoll__groups_init(hpucoll_comm *c);
void hpucoll__groups_free(hpucoll_comm *c);

/* Checks the arguments of a collective before it is queued; on error
 * says why in errmsg. */
int hpucoll__check_args(hpucoll_comm *c, const struct hpucoll__args *a);

/* Runs one collective to its end on the calling thread. */
int hpucoll__run(hpucoll_comm *c, const struct hpucoll__args *a);

/* ---- wire helpers ---- */

static inline void hpucoll__put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline void hpucoll__put64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t hpucoll__get32(const unsigned char *p)
{
	uint32_t v = 0;

	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static inline uint64_t hpucoll__get64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static inline void hpucoll__hdr_encode(unsigned char *p,
				       const struct hpucoll__hdr *h)
{
	hpucoll__put32(p, h->magic);
	hpucoll__put32(p + 4, h->src);
	hpucoll__put32(p + 8, h->seq);
	p[12] = h->kind;
	p[13] = h->arg;
	p[14] = (unsigned char)(h->tag & 0xff);
	p[15] = (unsigned char)(h->tag >> 8);
	hpucoll__put64(p + 16, h->off);
	hpucoll__put64(p + 24, h->len);
}

static inline void hpucoll__hdr_decode(struct hpucoll__hdr *h,
				       const unsigned char *p)
{
	h->magic = hpucoll__get32(p);
	h->src = hpucoll__get32(p + 4);
	h->seq = hpucoll__get32(p + 8);
	h->kind = p[12];
	h->arg = p[13];
	h->tag = (uint16_t)(p[14] | p[15] << 8);
	h->off = hpucoll__get64(p + 16);
	h->len = hpucoll__get64(p + 24);
}

#endif
