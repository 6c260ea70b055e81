/* cuda_nccl: --collectives nccl, the CUDA device's group (cuda_coll.c's
 * hpu__dev_coll) over NCCL.
 *
 * libnccl.so.2 is opened where it is installed (HPU_NCCL_LIB, else on the
 * loader's path, else /usr/local/cuda's; dlopen: the module loads and
 * runs without it, and the option then fails the job at set-up naming
 * what dlopen said), its types from nccl.h beside the CUDA toolkit at
 * build time (without it the module is built without NCCL and says so).
 *
 * The group. Every rank sends through the caller's exchange (libhpucoll's
 * all-gather) its node's name, its GPU's UUID and whether NCCL loaded;
 * rank 0 also NCCL's unique id. Every rank then checks the same records:
 * a rank without NCCL, or two ranks on one GPU (NCCL takes a GPU per
 * rank: a one-GPU machine runs its workers with --collectives device),
 * ends the set-up on every rank with the same sentence (-2: the job
 * fails). Then ncclCommInitRank, collective: a rank that fails there
 * ends its worker (its peers wait in NCCL, and the launcher ends them
 * naming the rank). Closing aborts the communicator (ncclCommAbort: this
 * rank's alone), so that a rank leaving on an error of its own never
 * waits for peers that wait for it. Ranks on several nodes are one group: NCCL carries
 * the bytes between them (its own sockets or InfiniBand).
 *
 * The all-reduce is one ncclAllReduce (sum, fp32 or bf16) on the compute
 * stream: no host wait, so a recorded step (--graphs) holds it as
 * CUDA's stream capture holds NCCL's kernels. Its sums are NCCL's (ring
 * or tree order, its bf16 rounding): not the bits of libhpucoll's or the
 * CUDA IPC group's rank-order sums. */
#include <dlfcn.h> /* dlsym */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "common/nodeid.h"
#include "worker/cuda/cuda_coll.h"
#include "worker/cuda/cuda_device.h" /* hpu__cuda_dlopen_first (cuda_names.c) */

#ifdef HPU_CUDA_HAVE_NCCL
#include <nccl.h>

#define WHY 160
#define MAGIC 0x4e43434cu /* "NCCL" */

static struct {
	int tried, ok;
	char why[2 * WHY];
	int version;
	ncclResult_t (*get_version)(int *);
	ncclResult_t (*get_unique_id)(ncclUniqueId *);
	ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
	ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
				   ncclComm_t, cudaStream_t);
	ncclResult_t (*abort_comm)(ncclComm_t);
	const char *(*error_string)(ncclResult_t);
} N;

struct hpu__cuda_nccl {
	ncclComm_t comm;
	int rank, world;
};

/* What a rank tells the others. */
struct nrec {
	uint32_t magic;
	int32_t loaded; /* 1: NCCL opened; else why says */
	int32_t dev;
	char node[128];
	unsigned char uuid[16];
	char why[WHY];
	ncclUniqueId id; /* rank 0's */
};

int hpu__cuda_nccl_load(char *why, size_t whylen)
{
	if (!N.tried) {
		N.tried = 1;
		static const char *const tries[] = {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2",
						    "/usr/local/cuda/lib/libnccl.so.2"};
		char e[200];
		void *h = hpu__cuda_dlopen_first(getenv("HPU_NCCL_LIB"), tries, sizeof tries / sizeof *tries,
						 e, sizeof e);
		if (!h) {
			snprintf(N.why, sizeof N.why,
				 "NCCL cannot be loaded (%.120s; HPU_NCCL_LIB names the library)", e);
		} else {
			*(void **)&N.get_version = dlsym(h, "ncclGetVersion");
			*(void **)&N.get_unique_id = dlsym(h, "ncclGetUniqueId");
			*(void **)&N.init_rank = dlsym(h, "ncclCommInitRank");
			*(void **)&N.all_reduce = dlsym(h, "ncclAllReduce");
			*(void **)&N.abort_comm = dlsym(h, "ncclCommAbort");
			*(void **)&N.error_string = dlsym(h, "ncclGetErrorString");
			if (!N.get_version || !N.get_unique_id || !N.init_rank || !N.all_reduce ||
			    !N.abort_comm || !N.error_string)
				snprintf(N.why, sizeof N.why,
					 "libnccl.so.2 lacks one of ncclGetVersion, ncclGetUniqueId, "
					 "ncclCommInitRank, ncclAllReduce, ncclCommAbort, "
					 "ncclGetErrorString");
			else if (N.get_version(&N.version) != ncclSuccess || N.version < 21000)
				snprintf(N.why, sizeof N.why,
					 "libnccl.so.2 is version code %d: bf16 sums need 2.10 "
					 "(21000) or later",
					 N.version);
			else
				N.ok = 1;
		}
	}
	if (!N.ok)
		snprintf(why, whylen, "%s", N.why);
	return N.ok ? 0 : -1;
}

const char *hpu__cuda_nccl_version(char *buf, size_t len)
{
	if (!N.ok)
		return "";
	snprintf(buf, len, "NCCL %d.%d.%d", N.version / 10000, N.version / 100 % 100,
		 N.version % 100);
	return buf;
}

static void make_rec(int rank, int dev, struct nrec *me)
{
	memset(me, 0, sizeof *me);
	me->magic = MAGIC;
	me->dev = dev;
	hpu__node_ident(me->node, sizeof me->node);
	char why[WHY];
	me->loaded = hpu__cuda_nccl_load(why, sizeof why) == 0;
	if (!me->loaded) {
		snprintf(me->why, WHY, "%s", why);
		return;
	}
	struct cudaDeviceProp p;
	cudaError_t e = cudaGetDeviceProperties(&p, me->dev);
	if (e != cudaSuccess) {
		me->loaded = 0;
		snprintf(me->why, WHY, "cudaGetDeviceProperties of GPU %d: %s", me->dev,
			 cudaGetErrorString(e));
		cudaGetLastError();
		return;
	}
	memcpy(me->uuid, p.uuid.bytes, sizeof me->uuid);
	ncclResult_t r = rank == 0 ? N.get_unique_id(&me->id) : ncclSuccess;
	if (r != ncclSuccess) {
		me->loaded = 0;
		snprintf(me->why, WHY, "ncclGetUniqueId: %s", N.error_string(r));
	}
}

/* -2 with why where a rank has no NCCL or two ranks share a GPU. */
static int records_ok(const struct nrec *all, int world, char *why, size_t whylen)
{
	for (int r = 0; r < world; r++) {
		if (all[r].magic != MAGIC) {
			snprintf(why, whylen, "--collectives nccl: rank %d sent no record", r);
			return -2;
		}
		if (!all[r].loaded) {
			snprintf(why, whylen, "--collectives nccl: rank %d: %.*s", r, WHY - 1,
				 all[r].why);
			return -2;
		}
	}
	for (int r = 1; r < world; r++)
		for (int q = 0; q < r; q++)
			if (!memcmp(all[q].uuid, all[r].uuid, sizeof all[r].uuid)) { /* unique */
				snprintf(why, whylen,
					 "--collectives nccl: ranks %d and %d share GPU %d (node %.60s); "
					 "NCCL needs a GPU of its own for every rank (fewer --devices, "
					 "or --collectives device)",
					 q, r, all[r].dev, all[r].node);
				return -2;
			}
	return 0;
}

int hpu__cuda_nccl_open(hpu__cuda_nccl **out, int rank, int world, int dev,
			hpu__dev_xchg_fn *xchg, void *arg, char *why, size_t whylen)
{
	*out = NULL;
	struct nrec me, *all = calloc((size_t)world, sizeof *all);
	hpu__cuda_nccl *n = calloc(1, sizeof *n);
	if (!all || !n) {
		/* the others wait in the exchange: end, so that theirs fails
		 * naming this rank */
		fprintf(stderr, "hpu-worker: rank %d: out of memory setting up NCCL (%d ranks)\n",
			rank, world);
		exit(1);
	}
	make_rec(rank, dev, &me);
	int rc = -1;
	if (xchg(arg, &me, all, sizeof me) < 0) {
		snprintf(why, whylen, "--collectives nccl: exchanging the ranks' records failed");
		goto done;
	}
	for (int r = 0; r < world; r++) {
		all[r].node[sizeof all[r].node - 1] = 0;
		all[r].why[WHY - 1] = 0;
	}
	if ((rc = records_ok(all, world, why, whylen)) < 0)
		goto done;
	ncclResult_t r = N.init_rank(&n->comm, world, all[0].id, rank);
	if (r != ncclSuccess) {
		fprintf(stderr, "hpu-worker: rank %d: --collectives nccl: ncclCommInitRank (%d ranks): "
				"%s\n", rank, world, N.error_string(r));
		exit(1);
	}
	n->rank = rank;
	n->world = world;
	*out = n;
	n = NULL;
	rc = 0;
done:
	free(all);
	free(n);
	return rc;
}

int hpu__cuda_nccl_all_reduce(hpu__cuda_nccl *n, const char **why, const void *send, void *recv,
			      size_t count, hpu__dev_dtype dt, cudaStream_t s)
{
	ncclResult_t r = N.all_reduce(send, recv, count,
				      dt == HPU__DEV_BF16 ? ncclBfloat16 : ncclFloat32, ncclSum,
				      n->comm, s);
	if (r == ncclSuccess)
		return 0;
	*why = N.error_string(r);
	return -1;
}

void hpu__cuda_nccl_close(hpu__cuda_nccl *n, cudaStream_t s)
{
	if (!n)
		return;
	/* after the stream's last all-reduce (a pending one would be torn
	 * down under it) */
	if (cudaStreamSynchronize(s) != cudaSuccess)
		cudaGetLastError();
	/* ncclCommAbort, not ncclCommDestroy: Destroy is collective between
	 * the node's ranks, and a rank leaving on an error of its own while
	 * its peers wait in an all-reduce would wait there for good; Abort
	 * is this rank's alone (the launcher ends the peers when it exits) */
	N.abort_comm(n->comm);
	free(n);
}

#else /* built without nccl.h */

int hpu__cuda_nccl_load(char *why, size_t whylen)
{
	snprintf(why, whylen, "this build of the CUDA module has no NCCL support (nccl.h was not "
			      "found beside the CUDA toolkit when it was built)");
	return -1;
}

const char *hpu__cuda_nccl_version(char *buf, size_t len)
{
	(void)buf, (void)len;
	return "";
}

int hpu__cuda_nccl_open(hpu__cuda_nccl **out, int rank, int world, int dev,
			hpu__dev_xchg_fn *xchg, void *arg, char *why, size_t whylen)
{
	(void)rank, (void)world, (void)dev, (void)xchg, (void)arg;
	*out = NULL;
	hpu__cuda_nccl_load(why, whylen);
	return -2;
}

int hpu__cuda_nccl_all_reduce(hpu__cuda_nccl *n, const char **why, const void *send, void *recv,
			      size_t count, hpu__dev_dtype dt, cudaStream_t s)
{
	(void)n, (void)send, (void)recv, (void)count, (void)dt, (void)s;
	*why = "built without NCCL";
	return -1;
}

void hpu__cuda_nccl_close(hpu__cuda_nccl *n, cudaStream_t s)
{
	(void)n, (void)s;
}

#endif
