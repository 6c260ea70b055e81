/* cuda_coll: the CUDA device's collectives between the ranks of one node
 * (worker/device/device.h's hpu__dev_coll), over CUDA IPC.
 *
 * The group. Each rank allocates one staging buffer, two halves of `cap`
 * bytes, exports it (cudaIpcGetMemHandle) and sends the handle with its
 * node's name through the caller's exchange (libhpucoll's all-gather, in
 * the worker); the others map it (cudaIpcOpenMemHandle), which works
 * between workers sharing a GPU and between GPUs with peer access. A
 * second exchange makes every rank agree: where one rank could not
 * export or map, none uses the group, and each says why (the first
 * failing rank's sentence). The buffers are plain cudaMalloc, outside
 * devmem's accounting (cudaIpcGetMemHandle wants an allocation of its
 * own).
 *
 * The all-reduce, a chunk of at most `cap` bytes at a time, in the half
 * the chunk's number picks:
 *   1. the chunk of send into this rank's half (d2d), waited for;
 *      exchange (every rank's half is filled);
 *   2. this rank's slice of the chunk summed over every rank's half, in
 *      rank order, into its own half (reduce-scatter), waited for;
 *      exchange (every slice is reduced);
 *   3. every rank's slice from its half into recv (all-gather).
 * The next chunk writes the other half, whose last readers (step 3 two
 * chunks back) finished before their rank entered the exchange of step
 * 2 one chunk back; after the last chunk the copies are waited for and
 * the ranks exchange once more, so that no rank reads a peer's buffer
 * once the call has returned (closing needs no exchange, and a rank that
 * fails never waits for its peers there). The exchanges are host
 * barriers (one byte each): the ranks' streams are waited for before each,
 * so a peer's kernel reads only what is complete. A CUDA error ends the
 * worker (hpu__cuda_check), which its peers' exchange reports naming the
 * rank; an exchange that fails returns -1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "common/nodeid.h"
#include "worker/cuda/cuda_coll.h"
#include "worker/cuda/cuda_device.h"

#define MAGIC 0x48495043u /* "HIPC" */
#define WHY 160

struct hpu__dev_group {
	hpu__cuda_nccl *nccl;              /* --collectives nccl: the rest unused */
	int rank, world;
	size_t cap;                        /* bytes of each half */
	char *mine;                        /* this rank's two halves */
	char *peer[HPU_CUDA_GROUP_MAX];    /* every rank's, as mapped here */
	uint64_t chunks;                   /* so far: the next one's half */
	hpu__dev_xchg_fn *xchg;
	void *arg;
};

/* What a rank tells the others when the group is made. */
struct rec {
	uint32_t magic;
	int32_t status; /* 0, or why says what failed */
	int32_t pid, dev;
	char node[128]; /* the host's name and boot id */
	cudaIpcMemHandle_t mem;
	char why[WHY];
};

/* The second exchange: whether the peers' buffers mapped. */
struct ack {
	int32_t status;
	char why[WHY];
};

/* This machine (IPC handles mean nothing elsewhere): common/nodeid.h. */
static void node_name(char *out, size_t len)
{
	hpu__node_ident(out, len);
}

static int barrier(hpu__dev_group *g)
{
	char me = 1, all[HPU_CUDA_GROUP_MAX];
	return g->xchg(g->arg, &me, all, 1) < 0 ? -1 : 0;
}

/* Unmaps the peers' buffers and frees this rank's; errors are forgotten
 * (the worker is leaving, or falling back to staging). */
static void group_free(hpu__dev_group *g)
{
	if (!g)
		return;
	hpu__cuda_bind();
	hpu__cuda_nccl_close(g->nccl, hpu__cuda_stream());
	/* an NCCL group maps nothing (its world may pass HPU_CUDA_GROUP_MAX) */
	for (int r = 0; !g->nccl && r < g->world && r < HPU_CUDA_GROUP_MAX; r++)
		if (r != g->rank && g->peer[r] && cudaIpcCloseMemHandle(g->peer[r]) != cudaSuccess)
			cudaGetLastError();
	if (g->mine && cudaFree(g->mine) != cudaSuccess)
		cudaGetLastError();
	free(g);
}

/* What rank r (process pid) writes at the start of its buffer before
 * exporting it, and its peers read through their mapping: a mapping that
 * "succeeds" without showing the peer's memory (a sandbox's) is refused
 * like one that fails. */
static void marker(uint32_t mark[4], int r, int32_t pid)
{
	mark[0] = MAGIC;
	mark[1] = (uint32_t)r;
	mark[2] = (uint32_t)pid;
	mark[3] = ~MAGIC;
}

/* This rank's record: its buffer allocated and exported. */
static void make_rec(hpu__dev_group *g, struct rec *me)
{
	memset(me, 0, sizeof *me);
	me->magic = MAGIC;
	me->pid = (int32_t)getpid();
	me->dev = hpu__cuda_device_index();
	node_name(me->node, sizeof me->node);
	cudaError_t e = cudaMalloc((void **)&g->mine, 2 * g->cap);
	if (e != cudaSuccess) {
		g->mine = NULL;
		snprintf(me->why, WHY, "cudaMalloc of %zu bytes on GPU %d: %s", 2 * g->cap, me->dev,
			 cudaGetErrorString(e));
	} else if ((e = cudaIpcGetMemHandle(&me->mem, g->mine)) != cudaSuccess) {
		snprintf(me->why, WHY, "cudaIpcGetMemHandle on GPU %d: %s", me->dev,
			 cudaGetErrorString(e));
	} else {
		uint32_t mark[4];
		marker(mark, g->rank, me->pid);
		if ((e = cudaMemcpy(g->mine, mark, sizeof mark, cudaMemcpyHostToDevice)) ==
		    cudaSuccess)
			e = cudaDeviceSynchronize();
		if (e != cudaSuccess)
			snprintf(me->why, WHY, "writing the staging buffer on GPU %d: %s", me->dev,
				 cudaGetErrorString(e));
	}
	if (e != cudaSuccess) {
		me->status = 1;
		cudaGetLastError();
	}
}

/* The peers' buffers mapped here: 0, or -1 with the sentence in a->why. */
static int map_peers(hpu__dev_group *g, const struct rec *all, struct ack *a)
{
	memset(a, 0, sizeof *a);
	g->peer[g->rank] = g->mine;
	for (int r = 0; r < g->world; r++) {
		if (r == g->rank)
			continue;
		void *p = NULL;
		cudaError_t e =
			cudaIpcOpenMemHandle(&p, all[r].mem, cudaIpcMemLazyEnablePeerAccess);
		if (e != cudaSuccess) {
			snprintf(a->why, WHY,
				 "cudaIpcOpenMemHandle of rank %d's buffer (GPU %d) on GPU %d: %s", r,
				 all[r].dev, hpu__cuda_device_index(), cudaGetErrorString(e));
			cudaGetLastError();
			a->status = 1;
			return -1;
		}
		g->peer[r] = p;
		uint32_t want[4], got[4] = {0};
		marker(want, r, all[r].pid);
		e = cudaMemcpy(got, p, sizeof got, cudaMemcpyDefault);
		if (e != cudaSuccess || memcmp(got, want, sizeof got)) {
			snprintf(a->why, WHY,
				 "rank %d's buffer (GPU %d) mapped on GPU %d does not read back: %s", r,
				 all[r].dev, hpu__cuda_device_index(),
				 e != cudaSuccess ? cudaGetErrorString(e) : "other bytes");
			cudaGetLastError();
			a->status = 1;
			return -1;
		}
	}
	return 0;
}

/* 1 where the ranks are not all on rank 0's node (sentence in why). */
static int other_node(const struct rec *all, int world, char *why, size_t whylen)
{
	for (int r = 1; r < world; r++)
		if (strcmp(all[r].node, all[0].node)) {
			snprintf(why, whylen, "rank %d is on another node than rank 0 (%.60s, not %.60s)",
				 r, all[r].node, all[0].node);
			return 1;
		}
	return 0;
}

/* --collectives nccl: the group is NCCL's (cuda_nccl.c), on any nodes. */
static int nccl_open(hpu__dev_group **out, int rank, int world, hpu__dev_xchg_fn *xchg,
		     void *arg, char *why, size_t whylen)
{
	hpu__cuda_bind();
	hpu__dev_group *g = calloc(1, sizeof *g);
	if (!g) {
		fprintf(stderr, "hpu-worker: rank %d: out of memory setting up NCCL\n", rank);
		exit(1);
	}
	int rc = hpu__cuda_nccl_open(&g->nccl, rank, world, hpu__cuda_device_index(), xchg, arg,
				     why, whylen);
	if (rc < 0) {
		free(g);
		return rc;
	}
	g->rank = rank;
	g->world = world;
	*out = g;
	return 0;
}

static int cc_open(hpu__dev_group **out, int rank, int world, size_t bytes,
		   hpu__dev_xchg_fn *xchg, void *arg, char *why, size_t whylen)
{
	*out = NULL;
	if (hpu__cuda_nccl_asked())
		return nccl_open(out, rank, world, xchg, arg, why, whylen);
	if (world < 2 || world > HPU_CUDA_GROUP_MAX || rank < 0 || rank >= world) {
		snprintf(why, whylen, "CUDA IPC groups have 2 to %d ranks, not %d",
			 HPU_CUDA_GROUP_MAX, world);
		return 1;
	}
	hpu__cuda_bind();
	hpu__dev_group *g = calloc(1, sizeof *g);
	struct rec *all = calloc((size_t)world, sizeof *all);
	struct ack *acks = calloc((size_t)world, sizeof *acks);
	struct rec me;
	struct ack a;
	int rc = -1;
	if (!g || !all || !acks) {
		/* the others wait in the exchange: this rank must end, so that
		 * theirs fails naming it, not carry on staged */
		fprintf(stderr, "hpu-worker: rank %d: out of memory setting up the device's "
				"all-reduce (%d ranks)\n", rank, world);
		exit(1);
	}
	g->rank = rank;
	g->world = world;
	g->cap = ((bytes ? bytes : 1) + 255) / 256 * 256;
	g->xchg = xchg;
	g->arg = arg;
	make_rec(g, &me);
	if (xchg(arg, &me, all, sizeof me) < 0) {
		snprintf(why, whylen, "exchanging the CUDA IPC handles failed");
		goto fail;
	}
	for (int r = 0; r < world; r++) {
		all[r].node[sizeof all[r].node - 1] = 0;
		all[r].why[WHY - 1] = 0;
		if (all[r].magic != MAGIC) {
			snprintf(why, whylen, "rank %d sent no CUDA IPC handle", r);
			goto fail;
		}
	}
	if (other_node(all, world, why, whylen)) {
		rc = 1;
		goto fail;
	}
	for (int r = 0; r < world; r++)
		if (all[r].status) {
			snprintf(why, whylen, "rank %d: %s", r, all[r].why);
			goto fail;
		}
	map_peers(g, all, &a);
	if (xchg(arg, &a, acks, sizeof a) < 0) {
		snprintf(why, whylen, "exchanging the CUDA IPC mappings failed");
		goto fail;
	}
	for (int r = 0; r < world; r++)
		if (acks[r].status) {
			acks[r].why[WHY - 1] = 0;
			snprintf(why, whylen, "rank %d: %s", r, acks[r].why);
			goto fail;
		}
	free(all);
	free(acks);
	*out = g;
	return 0;
fail:
	group_free(g);
	free(all);
	free(acks);
	return rc;
}

/* Rank r's slice of a chunk of n elements: multiples of 8 elements (16
 * bytes of bf16, 32 of fp32), so that every slice stays aligned. */
static void slice(size_t n, int world, int r, size_t *at, size_t *len)
{
	size_t q = ((n + (size_t)world - 1) / (size_t)world + 7) / 8 * 8;
	size_t a = (size_t)r * q;
	*at = a < n ? a : n;
	*len = n - *at < q ? n - *at : q;
}

#define K(call, what) hpu__cuda_check(call, what)

static int cc_all_reduce(hpu__dev_group *g, const void *send, void *recv, size_t count,
			 hpu__dev_dtype dt)
{
	if (g->nccl) { /* one NCCL call on the stream: recordable */
		const char *why = "";
		if (!hpu__cuda_nccl_all_reduce(g->nccl, &why, send, recv, count, dt,
					       hpu__cuda_stream()))
			return 0;
		/* while a step is recorded, a failure (a capture another call
		 * invalidated) refuses the recording as every CUDA error there
		 * does: the step runs eagerly, not the worker ends */
		if (hpu__cuda_capture_refuse("ncclAllReduce", why)) {
			(void)cudaGetLastError();
			return 0;
		}
		fprintf(stderr, "hpu-worker: rank %d: --collectives nccl: ncclAllReduce of %zu values: %s\n",
			g->rank, count, why);
		exit(1);
	}
	/* waits for the stream and meets the peers at host barriers between
	 * its stages: not recordable; every rank records the same step, so
	 * every rank refuses here and none waits at a barrier */
	if (hpu__cuda_capture_refuse("the all-reduce over CUDA IPC",
				     "it waits for the GPU and for its peers on the host between "
				     "its stages, which a recorded step cannot hold"))
		return 0;
	size_t esz = dt == HPU__DEV_BF16 ? 2 : 4, per = g->cap / esz;
	cudaStream_t s = hpu__cuda_stream();
	for (size_t i = 0; i < count; i += per) {
		size_t n = count - i < per ? count - i : per, at, len;
		size_t half = (size_t)(g->chunks++ & 1) * g->cap;
		K(cudaMemcpyAsync(g->mine + half, (const char *)send + i * esz, n * esz,
				  cudaMemcpyDeviceToDevice, s),
		  "cudaMemcpyAsync (all-reduce's staging)");
		K(cudaStreamSynchronize(s), "cudaStreamSynchronize (all-reduce)");
		if (barrier(g) < 0)
			return -1;
		hpu__cuda_slice in;
		memset(&in, 0, sizeof in);
		slice(n, g->world, g->rank, &at, &len);
		for (int r = 0; r < g->world; r++)
			in.in[r] = g->peer[r] + half + at * esz;
		K(hpu__cuda_k_group_sum(s, dt, &in, g->world, g->mine + half + at * esz, len),
		  "the all-reduce's sum");
		K(cudaStreamSynchronize(s), "cudaStreamSynchronize (all-reduce)");
		if (barrier(g) < 0)
			return -1;
		for (int r = 0; r < g->world; r++) {
			slice(n, g->world, r, &at, &len);
			if (len)
				K(cudaMemcpyAsync((char *)recv + (i + at) * esz,
						  g->peer[r] + half + at * esz, len * esz,
						  cudaMemcpyDefault, s),
				  "cudaMemcpyAsync (all-reduce's gather)");
		}
	}
	if (!count)
		return 0;
	K(cudaStreamSynchronize(s), "cudaStreamSynchronize (all-reduce)");
	return barrier(g); /* no peer reads this rank's buffer any more */
}

static void cc_close(hpu__dev_group *g)
{
	group_free(g);
}

const hpu__dev_coll hpu__cuda_coll = {
    .open = cc_open,
    .all_reduce = cc_all_reduce,
    .close = cc_close,
};
