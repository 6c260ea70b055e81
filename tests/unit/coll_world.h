/* coll_world: worlds of forked ranks for the libhpucoll tests (test_coll,
 * test_coll_traffic): each rank binds, publishes its endpoint in shared
 * memory, connects (over shared memory when the world says so) and runs a
 * body; the parent waits for them with a deadline and checks that the
 * job's shared memory is gone afterwards. */
#ifndef HPU_COLL_WORLD_H
#define HPU_COLL_WORLD_H

#include <stdatomic.h>
#include <stddef.h>

#include "hpu/coll.h"
#include "tests/unit/coll_testlib.h"

#define MAX_WS 5
#define CHILD_DEADLINE_MS 120000

/* Memory shared by the parent and the ranks it forks. */
struct shared {
	struct ct_eps eps;  /* the ranks' resolved endpoints */
	atomic_int counter; /* barrier test: arrivals so far */
	hpucoll_stats stats[MAX_WS]; /* traffic test: each rank's totals */
	atomic_int pid[MAX_WS];      /* each rank's process id */
};

/* How a world of forked ranks is set up. */
struct world {
	int ws;
	int tcp;          /* bind tcp://127.0.0.1 (else ipc) */
	int shm;          /* set a topology, transport AUTO */
	const int *nodes; /* node of each rank (NULL: all on node 0) */
	const char *algo; /* HPUCOLL_ALGO for the ranks, or NULL */
	int big;          /* also run BIG_COUNT */
	int only_ar;      /* only all_reduce in the matrix */
	hpucoll_security sec; /* of every rank (NONE: hpucoll_comm_new) */
	const char *secret;   /* the job's secret for sec */
	const char *secret1;  /* rank 1's, when it must differ, or NULL */
};

typedef int (*rank_fn)(hpucoll_comm *c, struct shared *sh,
		       const struct world *w);

/* Bumped for each world: makes its ipc paths and job names unique. */
extern int cw_world_id;
/* A rank's communicator, in its child (for the fault tests). */
extern hpucoll_comm **cw_child_comm;

/* Two nodes of two ranks. */
extern const int cw_two_nodes[4];

/* Prefix of this world's ipc endpoints named `what`; rank's endpoint. */
void cw_ipc_prefix(char *buf, size_t len, const char *what);
void cw_ipc_path(char *buf, size_t len, const char *what, int rank);

/* The job name of this world (names its shared-memory segment). */
void cw_job_name(char *buf, size_t len);

/* Says which call failed on stderr; returns 1 (a rank's exit code). */
int cw_fail_rc(hpucoll_comm *c, const char *call, int rc);

/* Runs `body` on the ranks of world `w`. (A rank killed with SIGKILL
 * counts as a success: the fault tests kill one.) */
void cw_run_world(const struct world *w, rank_fn body);

#endif
