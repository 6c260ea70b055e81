/* device_graph: recording a step and replaying it (device.h's
 * hpu__dev_capture_begin ... hpu__dev_graph_free): a device's recorder,
 * else the CPU's list of device_rec.c. */
#include "worker/device/device.h"
#include "worker/device/device_impl.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- recording a step and replaying it (device.h; the recording's
 * state and the CPU's list: device_rec.c) ---- */

static void graph_drop(hpu__dev_graph *g)
{
	if (g->dev)
		hpu__dev_cur->recorder->free(g->dev);
	hpu__dev_calls_free(&g->calls);
	hpu__dev_rec_drop_list(g);
	hpu__devmem_graph_release(g->held);
	free(g);
}

/* The CPU's list: a zeroed allocation while recording is a fill node
 * too (devmem's hpu__devmem_record_zero). */
static void zero_node(void *p, size_t bytes)
{
	hpu__dev_memset(NULL, p, 0, bytes);
}

int hpu__dev_capture_begin(char *err, size_t errlen)
{
	/* the CPU's list records the kernels-only table (cpu-strict's, or
	 * --device cpu's under --graphs); any other device records itself */
	int listed = (hpu__dev_cur == &hpu__dev_cpu_strict || hpu__dev_cur == &hpu__dev_cpu_rec) &&
		     hpu__dev_kernels_set;
	int can = hpu__dev_caps_get()->can_capture && (hpu__dev_cur->recorder || listed);
	if (!can) {
		if (hpu__dev_cur == &hpu__dev_cpu)
			snprintf(err, errlen,
				 "--device cpu records a step under --graphs only (its kernels-only "
				 "table is set up with the device)");
		else if (hpu__dev_cur == &hpu__dev_cpu_strict)
			snprintf(err, errlen,
				 "--device cpu-strict records a step on its kernels-only table only "
				 "(--graphs, or HPU_STRICT_KERNELS=1, when the device is set up)");
		else
			snprintf(err, errlen, "--device %s cannot record a step", hpu__dev_cur->name);
		return -1;
	}
	if (hpu__dev_rec_claim() < 0) {
		snprintf(err, errlen, "a step is being recorded already (one recording at a time)");
		return -1;
	}
	hpu__dev_graph *g = calloc(1, sizeof *g);
	if (!g) {
		snprintf(err, errlen, "out of host memory for a recording");
		hpu__dev_rec_unclaim();
		return -1;
	}
	g->held = hpu__devmem_capture_begin();
	hpu__devmem_record_zero(hpu__dev_cur->recorder ? NULL : zero_node);
	if (hpu__dev_cur->recorder && hpu__dev_cur->recorder->begin(err, errlen) < 0) {
		hpu__devmem_capture_end();
		hpu__devmem_record_zero(NULL);
		graph_drop(g);
		hpu__dev_rec_unclaim();
		return -1;
	}
	hpu__dev_rec_start(g, !hpu__dev_cur->recorder);
	if (hpu__dev_cur->rec_guard)
		hpu__dev_cur->rec_guard(1, NULL, 0);
	hpu__dev_fp_begin(g);
	return 0;
}

/* --device cpu's arena open again after a recording; host code that
 * touched device memory meanwhile (a custom layer's C loops) did its
 * work then, not at each launch: the recording refused. */
static void cpu_rec_unguard(void)
{
	char block[256];
	const void *a = hpu__dev_cur->rec_guard(0, block, sizeof block);
	if (a)
		hpu__dev_capture_refuse("host code touched device memory at %p (%s) while a step was "
					"recorded (its work ran then, not at each launch: a custom "
					"layer's own loops over its tensors, which --device cpu-strict "
					"faults on unless the layer is HPU_LAYER_HOST_ONLY)",
					a, block);
}

int hpu__dev_capture_end(hpu__dev_graph **out, char *why, size_t whylen)
{
	*out = NULL;
	hpu__dev_fp_end();
	if (hpu__dev_cur->rec_guard && hpu__dev_capturing())
		cpu_rec_unguard();
	hpu__dev_graph *g = hpu__dev_rec_stop();
	if (!g) {
		snprintf(why, whylen, "hpu__dev_capture_end: this thread records nothing");
		return -1;
	}
	hpu__devmem_capture_end();
	hpu__devmem_record_zero(NULL);
	int rc = 0;
	if (hpu__dev_cur->recorder)
		rc = hpu__dev_cur->recorder->end(&g->dev, why, whylen);
	else
		hpu__dev_rec_count(g);
	if (hpu__dev_rec_refused(why, whylen)) /* the first reason, whatever the device said */
		rc = 1;
	if (rc != 0)
		graph_drop(g);
	else
		*out = g;
	hpu__dev_rec_unclaim();
	return rc;
}

int hpu__dev_graph_launch(hpu__dev_graph *g, char *err, size_t errlen)
{
	if (hpu__dev_capturing()) {
		hpu__dev_capture_refuse("hpu__dev_graph_launch: a graph launched while recording");
		snprintf(err, errlen, "a graph cannot be launched while a step is recorded");
		return -1;
	}
	if (g->dev)
		return hpu__dev_cur->recorder->launch(g->dev, err, errlen);
	hpu__dev_call_open(); /* one device call: the nodes' own nest inside it */
	int rc = hpu__dev_rec_run(g, err, errlen);
	hpu__dev_call_close();
	return rc;
}

int hpu__dev_graph_rebind(hpu__dev_graph *g, const void *from, const void *to, size_t bytes,
			  char *err, size_t errlen)
{
	if (!g || !from || !to || from == to || !bytes || !hpu__dev_pinned(to, bytes))
		return 0;
	if (!g->dev)
		return (int)hpu__dev_rec_rebind(g, from, to, bytes);
	const hpu__dev_recorder *r = hpu__dev_cur->recorder;
	return r->rebind ? r->rebind(g->dev, from, to, bytes, err, errlen) : 0;
}

size_t hpu__dev_graph_nodes(const hpu__dev_graph *g)
{
	if (!g)
		return 0;
	return g->dev ? hpu__dev_cur->recorder->nodes(g->dev) : g->n;
}

size_t hpu__dev_graph_names(const hpu__dev_graph *g, const hpu__dev_node_count **out)
{
	*out = NULL;
	if (!g)
		return 0;
	if (!g->dev) {
		*out = g->names;
		return g->nnames;
	}
	return hpu__dev_cur->recorder->names ? hpu__dev_cur->recorder->names(g->dev, out) : 0;
}

void hpu__dev_graph_free(hpu__dev_graph **g)
{
	if (!g || !*g)
		return;
	graph_drop(*g);
	*g = NULL;
}
