/* cuda_graph: see cuda_graph.h. */
#include "worker/cuda/cuda_graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cuda/cuda_device.h" /* hpu__cuda_demangle */

/* A one-dimensional copy node of a graph: what hpu__dev_graph_rebind
 * may point elsewhere. */
typedef struct graph_copy {
	cudaGraphNode_t node;
	const void *src; /* what the executable graph reads now */
	void *dst;
	size_t bytes;
	enum cudaMemcpyKind kind;
	int moved; /* changed by the rebind under way */
} graph_copy;

struct hpu__cuda_graph {
	cudaGraph_t g;
	cudaGraphExec_t x;
	size_t nodes;
	hpu__dev_node_count *names; /* the nodes by name (names: malloc'd) */
	size_t nnames;
	graph_copy *copies; /* its one-dimensional copies (malloc'd) */
	size_t ncopies;
};

/* ---- the graph's nodes by name (the recorder's names): read once at
 * the recording's end, untimed (their GPU times: HPU_PROFILE_KERNELS,
 * cuda_kprof.c; names without C++'s mangling: cuda_names.c) ---- */

/* A kernel node's function name; "kernel" where CUDA cannot say (a kernel
 * a library launched through the driver's API, whose function the
 * runtime may not know; a toolkit before 12.3, without cudaFuncGetName). */
static void kernel_name(cudaGraphNode_t node, char *out, size_t len)
{
	struct cudaKernelNodeParams kp;
	const char *name = NULL;
	cudaError_t e = cudaGraphKernelNodeGetParams(node, &kp);
#if CUDART_VERSION >= 12030
	if (e == cudaSuccess && kp.func)
		e = cudaFuncGetName(&name, kp.func);
#endif
	if (e != cudaSuccess || !name || !name[0]) {
		(void)cudaGetLastError(); /* not the next call's error */
		snprintf(out, len, "kernel");
		return;
	}
	hpu__cuda_demangle(name, out, len);
}

static const char *type_name(enum cudaGraphNodeType t)
{
	switch (t) {
	case cudaGraphNodeTypeKernel: return "kernel";
	case cudaGraphNodeTypeMemcpy: return "memcpy";
	case cudaGraphNodeTypeMemset: return "memset";
	case cudaGraphNodeTypeHost: return "host";
	case cudaGraphNodeTypeGraph: return "graph";
	case cudaGraphNodeTypeEmpty: return "empty";
	case cudaGraphNodeTypeWaitEvent: return "wait_event";
	case cudaGraphNodeTypeEventRecord: return "event_record";
	case cudaGraphNodeTypeMemAlloc: return "mem_alloc";
	case cudaGraphNodeTypeMemFree: return "mem_free";
	default: return "other";
	}
}

static void names_free(hpu__cuda_graph *cg)
{
	for (size_t i = 0; i < cg->nnames; i++)
		free((char *)cg->names[i].name);
	free(cg->names);
	cg->names = NULL;
	cg->nnames = 0;
}

/* One more node named `name` (cg->names has room for every node); 0, or
 * -1 out of host memory. */
static int add_name(hpu__cuda_graph *cg, const char *name)
{
	for (size_t i = 0; i < cg->nnames; i++)
		if (!strcmp(cg->names[i].name, name)) {
			cg->names[i].count++;
			return 0;
		}
	char *dup = strdup(name);
	if (!dup)
		return -1;
	cg->names[cg->nnames++] = (hpu__dev_node_count){dup, 1};
	return 0;
}

/* cg->g's n nodes by name into cg->names; 0, or -1 with a sentence. */
static int count_names(hpu__cuda_graph *cg, size_t n, char *why, size_t len)
{
	cudaGraphNode_t *nodes = malloc((n ? n : 1) * sizeof *nodes);
	cg->names = calloc(n ? n : 1, sizeof *cg->names);
	cg->nnames = 0;
	size_t got = n;
	cudaError_t e = cudaSuccess;
	if (!nodes || !cg->names) {
		snprintf(why, len, "no host memory for the graph's %zu nodes' names", n);
		goto fail;
	}
	if (n && (e = cudaGraphGetNodes(cg->g, nodes, &got)) != cudaSuccess) {
		snprintf(why, len, "cudaGraphGetNodes (the nodes' names): %s",
			 cudaGetErrorString(e));
		goto fail;
	}
	for (size_t i = 0; i < got && i < n; i++) {
		enum cudaGraphNodeType t;
		char name[256];
		if ((e = cudaGraphNodeGetType(nodes[i], &t)) != cudaSuccess) {
			snprintf(why, len, "cudaGraphNodeGetType (node %zu of %zu): %s", i + 1, n,
				 cudaGetErrorString(e));
			goto fail;
		}
		if (t == cudaGraphNodeTypeKernel)
			kernel_name(nodes[i], name, sizeof name);
		else
			snprintf(name, sizeof name, "%s", type_name(t));
		if (add_name(cg, name) < 0) {
			snprintf(why, len, "no host memory for the graph's nodes' names");
			goto fail;
		}
	}
	free(nodes);
	return 0;
fail:
	free(nodes);
	names_free(cg);
	(void)cudaGetLastError();
	return -1;
}

/* cg->g's one-dimensional copies (a captured cudaMemcpyAsync: linear
 * memory, one row, no offsets) into cg->copies. Where they cannot be
 * read, none: hpu__dev_graph_rebind then changes nothing, and the
 * runtime copies the batch into the input buffers instead. */
static void find_copies(hpu__cuda_graph *cg, size_t n)
{
	cudaGraphNode_t *nodes = malloc((n ? n : 1) * sizeof *nodes);
	cg->copies = malloc((n ? n : 1) * sizeof *cg->copies);
	cg->ncopies = 0;
	size_t got = n;
	if (!nodes || !cg->copies)
		goto fail;
	if (n && cudaGraphGetNodes(cg->g, nodes, &got) != cudaSuccess)
		goto fail;
	for (size_t i = 0; i < got && i < n; i++) {
		enum cudaGraphNodeType t;
		struct cudaMemcpy3DParms p;
		if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess)
			goto fail;
		if (t != cudaGraphNodeTypeMemcpy)
			continue;
		if (cudaGraphMemcpyNodeGetParams(nodes[i], &p) != cudaSuccess)
			goto fail;
		if (p.srcArray || p.dstArray || p.srcPos.x || p.srcPos.y || p.srcPos.z ||
		    p.dstPos.x || p.dstPos.y || p.dstPos.z || p.extent.height > 1 ||
		    p.extent.depth > 1)
			continue; /* not a copy the runtime made: left as it is */
		cg->copies[cg->ncopies++] = (graph_copy){nodes[i], p.srcPtr.ptr, p.dstPtr.ptr,
							 p.extent.width, p.kind, 0};
	}
	free(nodes);
	return;
fail:
	free(nodes);
	free(cg->copies);
	cg->copies = NULL;
	cg->ncopies = 0;
	(void)cudaGetLastError();
}

hpu__cuda_graph *hpu__cuda_graph_make(cudaGraph_t g, cudaGraphExec_t x, size_t n, char *why,
				      size_t len)
{
	hpu__cuda_graph *cg = calloc(1, sizeof *cg);
	if (!cg) {
		snprintf(why, len, "no host memory for the graph");
		return NULL;
	}
	cg->g = g;
	cg->x = x;
	cg->nodes = n;
	if (count_names(cg, n, why, len) < 0) {
		free(cg);
		return NULL;
	}
	find_copies(cg, n);
	return cg;
}

cudaGraphExec_t hpu__cuda_graph_exec(const hpu__cuda_graph *cg)
{
	return cg->x;
}

size_t hpu__cuda_graph_nodes(const hpu__cuda_graph *cg)
{
	return cg ? cg->nodes : 0;
}

size_t hpu__cuda_graph_names(const hpu__cuda_graph *cg, const hpu__dev_node_count **out)
{
	*out = cg ? cg->names : NULL;
	return cg ? cg->nnames : 0;
}

/* c's executable node reading `src` from the next launch on: with the
 * copy kind the node reports, else (where that is refused) with
 * cudaMemcpyDefault, the kind the runtime's copies were recorded with. */
static cudaError_t point_copy(hpu__cuda_graph *cg, graph_copy *c, const void *src)
{
	cudaError_t e = cudaGraphExecMemcpyNodeSetParams1D(cg->x, c->node, c->dst, src, c->bytes,
							   c->kind);
	if (e != cudaSuccess && c->kind != cudaMemcpyDefault) {
		(void)cudaGetLastError();
		e = cudaGraphExecMemcpyNodeSetParams1D(cg->x, c->node, c->dst, src, c->bytes,
						       cudaMemcpyDefault);
	}
	if (e == cudaSuccess)
		c->src = src;
	else
		(void)cudaGetLastError();
	return e;
}

int hpu__cuda_graph_rebind(hpu__cuda_graph *cg, const void *from, const void *to, size_t bytes,
			   int dev, char *err, size_t len)
{
	int changed = 0;
	if (!cg)
		return 0;
	for (size_t i = 0; i < cg->ncopies; i++)
		cg->copies[i].moved = 0;
	for (size_t i = 0; i < cg->ncopies; i++) {
		graph_copy *c = &cg->copies[i];
		if (c->src != from || c->bytes > bytes)
			continue;
		cudaError_t e = point_copy(cg, c, to);
		if (e == cudaSuccess) {
			c->moved = 1;
			changed++;
			continue;
		}
		snprintf(err, len, "--graphs: CUDA would not point a recorded copy at the loader's "
				   "buffer (cudaGraphExecMemcpyNodeSetParams1D on GPU %d, %zu bytes, "
				   "copy kind %d: %s)",
			 dev, c->bytes, (int)c->kind, cudaGetErrorString(e));
		for (size_t j = 0; j < i; j++) /* the ones changed now, back */
			if (cg->copies[j].moved && point_copy(cg, &cg->copies[j], from) != cudaSuccess)
				return -1;
		return 0;
	}
	return changed;
}

void hpu__cuda_graph_free(hpu__cuda_graph *cg)
{
	if (!cg)
		return;
	cudaGraphExecDestroy(cg->x);
	cudaGraphDestroy(cg->g);
	(void)cudaGetLastError();
	names_free(cg);
	free(cg->copies);
	free(cg);
}
