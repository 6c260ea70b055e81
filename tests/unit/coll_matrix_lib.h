/* coll_matrix_lib: what the collectives matrix (test_coll_matrix) and
 * the asynchronous collectives' tests (test_coll_async) share: worlds of
 * forked ranks on a forced transport, one cmocka test each; inputs that
 * are a function of rank and index with references every rank computes
 * itself; buffers with guard bytes, the call of each collective, blocking
 * or not, and the check of every element of its results; per
 * configuration counts in a MAP_SHARED page that the parent reports.
 * See test_coll_matrix.c for the whole story. */
#ifndef HPU_COLL_MATRIX_LIB_H
#define HPU_COLL_MATRIX_LIB_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "hpu/coll.h"
#include "tests/unit/coll_testlib.h"

#define MAX_WS CT_MAX_WS
#define MAX_CFG 192
#define NAME_MAX_ 112
#define GUARD 64 /* bytes checked past the end of every buffer */
#define BIG_N (4u * 1024 * 1024 + 3)
#define COMM_TIMEOUT_MS 30000
#define SMALL_DEADLINE_MS 300000
#define BIG_DEADLINE_MS 420000

enum coll {
	C_ALL_REDUCE,
	C_REDUCE_SCATTER,
	C_REDUCE,
	C_ALL_GATHER,
	C_BCAST,
	C_BARRIER
};

extern const char *const mx_coll_names[]; /* by enum coll */

/* What one rank found for one configuration. */
struct cstat {
	long long checked; /* elements compared */
	int runs;          /* collectives run */
	int bad;           /* runs with a mismatch */
	double maxdiff;    /* largest |got - expected| */
};

/* Memory shared by the parent and the ranks of one world. */
struct shared {
	struct ct_eps eps;   /* the ranks' resolved endpoints */
	atomic_int counter;  /* barrier check: arrivals so far */
	atomic_int chunks;   /* overlap: chunks of work rank 0 has done */
	atomic_int ncfg;     /* configurations named so far (by rank 0) */
	atomic_int shm_seen; /* rank 0 mapped the node's shm segment */
	char name[MAX_CFG][NAME_MAX_];
	struct cstat st[MAX_WS][MAX_CFG];
	char note[MAX_WS][256]; /* a line each rank reports to the parent */
};

struct rk;

/* What the ranks of a world run once connected; non-zero fails it. */
typedef int (*mx_body)(struct rk *k);

/* One cmocka test: one world. */
struct world {
	hpucoll_transport tr;
	int ws;
	mx_body body;
	int deadline_ms; /* the parent kills ranks still running then */
	int ring; /* force ring (hier over 2 nodes) / chain at every size */
	int two_nodes;  /* ranks on nodes 0 and 1: hierarchical paths */
	char label[24]; /* "shm", "tcp ring", "shm 2 nodes", ... */
};

/* One collective to run and check. */
struct spec {
	enum coll coll;
	hpucoll_dtype dt;
	hpucoll_op op;
	size_t count;
	int inplace;
	int root;
};

/* A spec's buffers. */
struct run {
	struct spec s;
	unsigned char *a, *b; /* allocations (each with GUARD bytes after) */
	unsigned char *copy;  /* out of place: a as it was before the call */
	size_t a_n, b_n;      /* their sizes in elements */
	const void *send;
	void *recv;
};

/* A rank's view of its world. */
struct rk {
	hpucoll_comm *c;
	struct shared *sh;
	const struct world *w;
	int me, ws;
	int cfg;   /* current configuration index */
	int fatal; /* a collective returned an error */
};

/* A comparison in progress: counts, maxdiff, the first mismatch. */
struct cmp {
	const struct rk *k;
	const struct spec *s;
	long long checked;
	double maxdiff;
	int bad;
};

/* The transports forced in turn: shared memory, ZeroMQ TCP and IPC. */
#define MX_NTR 3
extern const hpucoll_transport mx_transports[MX_NTR];

/* A hash of (i, salt): the inputs are drawn from it. */
uint32_t mx_mix(size_t i, uint32_t salt);

/* Allocates and fills r->s's buffers for rank k->me (out of place, with a
 * copy of the sendbuf to check it is left alone); frees them. */
int mx_prep(const struct rk *k, struct run *r);
void mx_unprep(struct run *r);

/* Starts r (asynchronously when req is not NULL). */
int mx_issue(struct rk *k, struct run *r, hpucoll_req **req);

/* Checks r's results on rank k->me against the references; fills m, the
 * first mismatch printed. */
void mx_check(const struct rk *k, struct run *r, struct cmp *m);

/* Adds m to configuration k->cfg's counts of rank k->me. */
void mx_record(struct rk *k, const struct cmp *m);

/* Prints that `call` returned rc, marks the world fatal; returns -1. */
int mx_fail_rc(struct rk *k, const struct spec *s, const char *call, int rc);

/* Runs one collective blocking and checks it; -1 if it returned an
 * error (the world cannot go on). */
int mx_run_one(struct rk *k, const struct spec *s);

/* The next configuration index, kept by every rank in step (no shared
 * counter read races: each rank counts for itself); -1 past MAX_CFG. */
int mx_next_cfg(struct rk *k, int *idx);

/* Registers the world "KIND_TR[_2nodes][_ring|_hier]_wsN" as a test. */
void mx_add(hpucoll_transport tr, int ws, const char *kind, mx_body body,
            int deadline_ms, int ring, int two_nodes);

/* Runs the worlds registered as cmocka group `group`; argv[1], when
 * given, keeps only the tests whose name contains it. */
int mx_run(const char *group, int argc, char **argv);

#endif
