/* cuda_graph: a recorded step as the CUDA device keeps it (the capture
 * table of cuda_device.c: hpu__dev_recorder): the graph and its
 * executable, its nodes by name (read once, when the recording ends)
 * and its one-dimensional copies, which hpu__dev_graph_rebind may point
 * at another source. */
#ifndef HPU_CUDA_GRAPH_H
#define HPU_CUDA_GRAPH_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "worker/device/device.h"

typedef struct hpu__cuda_graph hpu__cuda_graph;

/* g (n nodes) and its executable x as one; both are the result's from
 * then on (hpu__cuda_graph_free destroys them). NULL with a sentence in
 * why where the nodes' names cannot be read or host memory is short: g
 * and x stay the caller's. */
hpu__cuda_graph *hpu__cuda_graph_make(cudaGraph_t g, cudaGraphExec_t x, size_t n, char *why,
				      size_t len);

cudaGraphExec_t hpu__cuda_graph_exec(const hpu__cuda_graph *cg);
size_t hpu__cuda_graph_nodes(const hpu__cuda_graph *cg);

/* The nodes by name (*out owned by cg), and how many names. */
size_t hpu__cuda_graph_names(const hpu__cuda_graph *cg, const hpu__dev_node_count **out);

/* hpu__dev_graph_rebind on cg, whose device is GPU `dev` (for messages):
 * each copy reading `from` (at most `bytes`) reads `to` from the next
 * launch on (cudaGraphExecMemcpyNodeSetParams1D: a launch under way is
 * not changed). Returns the copies changed; where CUDA refuses one, the
 * ones this call changed are pointed back: 0 and the refusal in err; -1
 * where that failed too. */
int hpu__cuda_graph_rebind(hpu__cuda_graph *cg, const void *from, const void *to, size_t bytes,
			   int dev, char *err, size_t len);

/* Destroys the executable (a launch still running finishes first: CUDA
 * frees it then), the graph and cg; NULL: nothing. */
void hpu__cuda_graph_free(hpu__cuda_graph *cg);

#endif
