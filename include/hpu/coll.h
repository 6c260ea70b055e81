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
} hpucoll_err;

typedef enum hpucoll_dtype {
	HPUCOLL_F32 = 0,
} hpucoll_dtype;

typedef enum hpucoll_op {
	HPUCOLL_SUM = 0,
	HPUCOLL_AVG,
} hpucoll_op;

typedef struct hpucoll_comm hpucoll_comm;

/* Returns a static sentence describing an error code. */
const char *hpucoll_strerror(int err);

/* Creates the communicator of `rank` in a job of `size` ranks and binds its
 * receive socket to `bind_endpoint` (a ZeroMQ endpoint; "tcp://ADDR:*" picks
 * a free port). On success *out belongs to the caller. */
int hpucoll_comm_new(hpucoll_comm **out, int rank, int size,
		     const char *bind_endpoint);

/* Returns the endpoint this rank is bound to, with the port resolved. */
const char *hpucoll_comm_endpoint(const hpucoll_comm *comm);

/* Connects to the other ranks; endpoints[i] is rank i's bound endpoint.
 * The strings are copied. */
int hpucoll_comm_connect(hpucoll_comm *comm, const char *const *endpoints);

/* Joins the coordinator named by the environment hpulaunch sets (RANK,
 * WORLD_SIZE, LOCAL_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT, HPU_JOB_ID,
 * HPU_JOB_TOKEN), gets the rank table and returns a connected communicator
 * in *out. On failure, writes one sentence saying why into err. */
int hpucoll_comm_init_env(hpucoll_comm **out, char *err, size_t errlen);

/* Closes the sockets and frees the communicator; sets *comm to NULL; safe
 * on NULL and twice. */
void hpucoll_comm_destroy(hpucoll_comm **comm);

/* Sets how long any single wait for a peer may last (default 60000 ms, or
 * HPUCOLL_TIMEOUT_MS from the environment). */
void hpucoll_comm_set_timeout(hpucoll_comm *comm, int timeout_ms);

int hpucoll_comm_rank(const hpucoll_comm *comm);
int hpucoll_comm_size(const hpucoll_comm *comm);

/* One sentence about the last error on this communicator ("" if none). */
const char *hpucoll_comm_errmsg(const hpucoll_comm *comm);

/* In-place all-reduce of `count` elements of `buf` over all ranks. */
int hpucoll_all_reduce(hpucoll_comm *comm, void *buf, size_t count,
		       hpucoll_dtype dtype, hpucoll_op op);

/* Copies `bytes` bytes of `buf` on `root` into `buf` on every rank. */
int hpucoll_broadcast(hpucoll_comm *comm, void *buf, size_t bytes, int root);

/* Returns on every rank only once every rank has entered it. */
int hpucoll_barrier(hpucoll_comm *comm);

#ifdef __cplusplus
}
#endif
#endif
