#include "tests/unit/coll_world.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

const int cw_two_nodes[4] = {0, 0, 1, 1};

int cw_world_id; /* makes each world's ipc paths and job names unique */
hpucoll_comm **cw_child_comm; /* a rank's communicator, in its child */

/* Prefix of this world's ipc endpoints named `what`. */
void cw_ipc_prefix(char *buf, size_t len, const char *what)
{
	snprintf(buf, len, "test-%d-%d-%s", (int)getpid(), cw_world_id, what);
}

void cw_ipc_path(char *buf, size_t len, const char *what, int rank)
{
	char prefix[64];

	cw_ipc_prefix(prefix, sizeof(prefix), what);
	ct_bind_ep(buf, len, 0, prefix, rank);
}

void cw_job_name(char *buf, size_t len)
{
	snprintf(buf, len, "utest%d-%d", (int)getppid(), cw_world_id);
}

/* ---- child side ---- */

int cw_fail_rc(hpucoll_comm *c, const char *call, int rc)
{
	fprintf(stderr, "rank %d: %s: %s %s\n", hpucoll_comm_rank(c), call,
		hpucoll_strerror(rc), hpucoll_comm_errmsg(c));
	return 1;
}

/* What cw_run_world gives each rank. */
struct child_arg {
	const struct world *w;
	struct shared *sh;
	rank_fn body;
	char prefix[64]; /* of the ipc endpoints */
};

static int child(int rank, void *arg)
{
	const struct child_arg *a = arg;
	const struct world *w = a->w;
	const char *eps[MAX_WS];
	int nodes[MAX_WS] = {0};
	hpucoll_comm *c = NULL;
	char ep[CT_EP_MAX], job[64];
	int rc;

	if (w->algo != NULL)
		setenv("HPUCOLL_ALGO", w->algo, 1);
	atomic_store(&a->sh->pid[rank], (int)getpid());
	ct_bind_ep(ep, sizeof(ep), w->tcp, a->prefix, rank);
	const char *secret = rank == 1 && w->secret1 ? w->secret1 : w->secret;
	rc = hpucoll_comm_new_secure(&c, rank, w->ws, ep, w->sec, secret,
				     secret ? strlen(secret) : 0);
	cw_child_comm = &c;
	if (rc != HPUCOLL_OK) {
		fprintf(stderr, "rank %d: comm_new: %s\n", rank,
			hpucoll_strerror(rc));
		return 1;
	}
	if (ct_eps_exchange(&a->sh->eps, rank, w->ws, hpucoll_comm_endpoint(c),
			    eps, 30000) != 0) {
		hpucoll_comm_destroy(&c);
		return 1;
	}
	rc = HPUCOLL_OK;
	if (w->shm) {
		cw_job_name(job, sizeof(job));
		rc = hpucoll_comm_set_topology(c, w->nodes ? w->nodes : nodes,
					       job, HPUCOLL_TRANSPORT_AUTO);
	}
	if (rc == HPUCOLL_OK)
		rc = hpucoll_comm_connect(c, eps);
	if (rc != HPUCOLL_OK)
		rc = cw_fail_rc(c, "connect", rc);
	else
		rc = a->body(c, a->sh, w);
	hpucoll_comm_destroy(&c);
	return rc;
}

/* Runs `body` on the ranks of world `w`. (A rank killed with SIGKILL
 * counts as a success: the fault tests kill one.) */
void cw_run_world(const struct world *w, rank_fn body)
{
	struct child_arg a = {.w = w, .body = body};
	char job[64];

	a.sh = ct_shared_new(sizeof(*a.sh));
	cw_world_id++;
	cw_ipc_prefix(a.prefix, sizeof(a.prefix), "r");
	assert_int_equal(ct_run_ranks(w->ws, child, &a, CHILD_DEADLINE_MS, 1),
			 0);
	ct_shared_free(a.sh, sizeof(*a.sh));
	/* A rank killed by a fault test leaves its ipc endpoint's file
	 * (a live rank's goes when its communicator is destroyed). */
	for (int r = 0; r < w->ws && !w->tcp; r++) {
		char ep[CT_EP_MAX];
		ct_bind_ep(ep, sizeof(ep), 0, a.prefix, r);
		unlink(ep + strlen("ipc://"));
		strcat(ep, ".lock"); /* and its lock, free now */
		unlink(ep + strlen("ipc://"));
	}
	/* The job's shared memory is gone, whatever happened. */
	snprintf(job, sizeof(job), "utest%d-%d", (int)getpid(), cw_world_id);
	assert_int_equal(ct_shm_segments(job), 0);
}

