/* The cpu device's functions that the strict CPU device shares (its
 * memory is host memory too, only guarded). Internal to worker/device. */
#ifndef HPU_DEVICE_IMPL_H
#define HPU_DEVICE_IMPL_H

#include "worker/device/device.h"

#include <stdatomic.h>

void hpu__dev_cpu_copy(hpu__dev_queue *q, void *dst, const void *src, size_t n);
void hpu__dev_cpu_fill(hpu__dev_queue *q, void *dst, int byte, size_t n);
void hpu__dev_cpu_record(hpu__dev_queue *q, hpu__dev_event *ev);
void hpu__dev_cpu_wait(const hpu__dev_event *ev);
void *hpu__dev_cpu_host_alloc(size_t bytes);
void hpu__dev_cpu_host_free(void *p);

/* The members of an hpu__device that the cpu and strict CPU devices
 * share in their initializers: the functions above, the CPU kernels and
 * the cpu run-time ops. */
#define HPU__DEV_CPU_SHARED                                                                        \
	.copy = hpu__dev_cpu_copy, .fill = hpu__dev_cpu_fill, .record = hpu__dev_cpu_record,      \
	.wait = hpu__dev_cpu_wait, .host_alloc = hpu__dev_cpu_host_alloc,                          \
	.host_free = hpu__dev_cpu_host_free, .ops = hpu__be, .rt = &hpu__dev_cpu_rtops

/* ---- the device in use (device.c), for the folder's other files ---- */

/* A queue of the CPU devices (hpu__dev_queue_new without the device's
 * own): their work is done when issued. */
struct hpu__dev_queue {
	atomic_uint_fast64_t seq; /* work issued so far */
};

/* Set by device.c only (hpu__dev_open, _configure, _close): the device in
 * use, the worker's rank, and 1 when the ops use hpu__dev_kernels_table. */
extern const hpu__device *hpu__dev_cur;
extern int hpu__dev_cur_rank;
extern int hpu__dev_kernels_set;
extern const char *hpu__dev_staged_name; /* hpu__dev_staged_layer's */
/* The bytes hpu__dev_copied reports (device_copy.c counts them; zero
 * from hpu__dev_open). */
extern atomic_uint_fast64_t hpu__dev_copied_h2d, hpu__dev_copied_d2h;
/* hpu__dev_waits' count (zero from hpu__dev_open); hpu__dev_waited adds
 * one where the device's memory is its own. */
extern atomic_uint_fast64_t hpu__dev_wait_count;
void hpu__dev_waited(void);
/* cpu-strict's check of hpu__dev_copy_queued (device_call.c): the
 * source's n bytes at src kept now, compared at the next wait
 * (hpu__dev_waited), where a difference ends the worker naming op;
 * hpu__dev_queued_clear(0) forgets them (the device closing). */
void hpu__dev_queued_note(const char *op, const void *src, size_t n);
void hpu__dev_queued_clear(int check);
/* The step guard (hpu__dev_step_guard): hpu__dev_step_strict is
 * HPU_STRICT_STEP=1 on cpu-strict, read when the device opens;
 * hpu__dev_step_on is the guard, set by the main thread and read by any
 * thread that calls the device. */
extern int hpu__dev_step_strict;
extern atomic_int hpu__dev_step_on;

/* device_mem.c: 1 when [p, p + n) lies in one pinned block (memory from
 * hpu__dev_host_alloc, hbuf's host blocks). */
int hpu__dev_pinned(const void *p, size_t n);

/* device_call.c: the folder's own device calls (copies, fills, the
 * runtime's ops, a launch) open and close the device around their work;
 * host code's go through hpu__dev_enter. */
void hpu__dev_call_open(void);
void hpu__dev_call_close(void);
/* The guard: a copy from device memory into host memory (step_copy), an
 * op that returns a value computed from device memory at src
 * (step_value), under HPU_STRICT_STEP=1 inside a step: one line naming op,
 * and the worker ends. */
void hpu__dev_step_copy(const char *op, const void *dst, const void *src, size_t n);
void hpu__dev_step_value(const char *op, const void *src);
/* A device op's buffer must be device memory: host memory at p given to
 * `op` on a device that tells (cpu-strict, GPUs): one line, and the
 * worker ends. */
void hpu__dev_on_device(const char *op, const void *p);

/* The cpu device under --graphs (device_strict.c): cpu-strict's arena
 * always open, no device calls; named "cpu". hpu__dev_configure switches
 * --device cpu to it when --graphs is on. */
extern const hpu__device hpu__dev_cpu_rec;

/* The kernels-only mode (device_kernels.c): 1 when HPU_STRICT_KERNELS=1;
 * the table whose every function is a device call of `d` (cpu-strict, or
 * hpu__dev_cpu_rec, which has none: the bare kernel) around the CPU's
 * kernel (the backend's, else hpu__be_host's), a node while recording. */
int hpu__dev_strict_kernels(void);
const hpu__backend *hpu__dev_kernels_table(const hpu__device *d);
/* Makes the ops' scratch (autocast, fp8) device memory, as a GPU's is;
 * for the process's life (the worker's). */
void hpu__dev_kernels_scratch(void);

/* ---- recording (device.h's hpu__dev_capture_begin), the CPU's list ---- */


/* A node's work at a launch, on its arguments (the graph's copy): 0, or
 * what a kernel answered other than HPU_BE_OK. */
typedef int hpu__dev_node_fn(const void *args);

/* The CPU's list (device_rec.c): each node's work and its arguments. */
typedef struct gnode {
	hpu__dev_node_fn *run;
	const void *args;
	const char *what;
	const char *name; /* what's short name: "gemm", "optim", "h2d" */
} gnode;

/* The graph's storage for the nodes' arguments: chunks that never move. */
typedef struct gchunk {
	struct gchunk *next;
	size_t used, cap;
	max_align_t data[];
} gchunk;

struct hpu__dev_graph {
	gnode *nodes; /* the CPU's list */
	size_t n, cap;
	gchunk *mem;
	void *dev;     /* the device's own graph (a recorder's) */
	uint32_t held; /* devmem's blocks kept for the graph */
	hpu__dev_node_count *names; /* the list's calls by name (hpu__dev_rec_count) */
	size_t nnames;
	hpu__dev_calls *calls; /* the host's calls of the ops' table (device_fp.c) */
};

/* device_fp.c: while g records, the ops' table wrapped so that each call
 * of an entry notes its values in g->calls (begin), and the device's
 * table back (end; safe when not begun). */
void hpu__dev_fp_begin(hpu__dev_graph *g);
void hpu__dev_fp_end(void);

/* The recording's state (device_rec.c), for device_graph.c and the
 * device's calls: claim (0, or -1 where one is under way) and unclaim
 * the one recording; start this thread's into g (lists: into the CPU's
 * list; 0: the device records itself), stop it (the graph, NULL where
 * the thread recorded nothing); refused: 1 and the first reason in why;
 * listing: 1 while this thread records into the list (a device with a
 * recorder records its own calls); run: a launch of the list (0, or -1
 * with the sentence); drop_list: frees the list's nodes and storage. */
int hpu__dev_rec_claim(void);
void hpu__dev_rec_unclaim(void);
void hpu__dev_rec_start(hpu__dev_graph *g, int lists);
hpu__dev_graph *hpu__dev_rec_stop(void);
int hpu__dev_rec_refused(char *why, size_t whylen);
int hpu__dev_rec_listing(void);
int hpu__dev_rec_run(hpu__dev_graph *g, char *err, size_t errlen);
void hpu__dev_rec_drop_list(hpu__dev_graph *g);

/* The CPU list's hpu__dev_graph_rebind (device_copy.c: its copies' nodes). */
size_t hpu__dev_rec_rebind(hpu__dev_graph *g, const void *from, const void *to, size_t bytes);
/* Counts the list's calls by name into g->names (at the recording's
 * end); out of host memory: the recording is refused. */
void hpu__dev_rec_count(hpu__dev_graph *g);

/* Appends a node to the calling thread's recording: `what` names it
 * ("the kernel gemm", "hpu__dev_h2d": a string that lives; its short
 * name, for the profiler and hpu__dev_graph_names, is what without "the
 * kernel " or "hpu__dev_"), run does
 * its work at a launch on the node's `bytes` of arguments, returned here
 * zeroed (the graph's, for the caller to fill). NULL where the graph
 * could not grow: the recording is refused. */
void *hpu__dev_rec_node(const char *what, hpu__dev_node_fn *run, size_t bytes);
/* A copy of `bytes` of host memory at src kept with the recording (a
 * struct the call points at); NULL (refused) where it could not grow. */
const void *hpu__dev_rec_keep(const void *src, size_t bytes);

/* Device work (`what`) given on a thread that does not record while
 * another records into the CPU's list: the recording is refused (the
 * work runs, unrecorded). Nothing otherwise. */
void hpu__dev_rec_foreign(const char *what);

/* 1 when the ops run on the kernels-only table (device_kernels.c). */
int hpu__dev_kernels_on(void);

/* A node's arguments as a struct, from a parameter list: KL_FE(m, a, b)
 * is m(a) m(b), KL_FC(m, a, b) is m(a), m(b) (up to 16). */
#define KL_UNPAREN(...) __VA_ARGS__
#define KL_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, N, \
		  ...)                                                                       \
	N
#define KL_NARGS(...)                                                                        \
	KL_NARGS_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define KL_CAT_(a, b) a##b
#define KL_CAT(a, b) KL_CAT_(a, b)
/* m(x) for each x, joined by nothing (FE) or by commas (FC) */
#define KL_FE_1(m, x) m(x)
#define KL_FE_2(m, x, ...) m(x) KL_FE_1(m, __VA_ARGS__)
#define KL_FE_3(m, x, ...) m(x) KL_FE_2(m, __VA_ARGS__)
#define KL_FE_4(m, x, ...) m(x) KL_FE_3(m, __VA_ARGS__)
#define KL_FE_5(m, x, ...) m(x) KL_FE_4(m, __VA_ARGS__)
#define KL_FE_6(m, x, ...) m(x) KL_FE_5(m, __VA_ARGS__)
#define KL_FE_7(m, x, ...) m(x) KL_FE_6(m, __VA_ARGS__)
#define KL_FE_8(m, x, ...) m(x) KL_FE_7(m, __VA_ARGS__)
#define KL_FE_9(m, x, ...) m(x) KL_FE_8(m, __VA_ARGS__)
#define KL_FE_10(m, x, ...) m(x) KL_FE_9(m, __VA_ARGS__)
#define KL_FE_11(m, x, ...) m(x) KL_FE_10(m, __VA_ARGS__)
#define KL_FE_12(m, x, ...) m(x) KL_FE_11(m, __VA_ARGS__)
#define KL_FE_13(m, x, ...) m(x) KL_FE_12(m, __VA_ARGS__)
#define KL_FE_14(m, x, ...) m(x) KL_FE_13(m, __VA_ARGS__)
#define KL_FE_15(m, x, ...) m(x) KL_FE_14(m, __VA_ARGS__)
#define KL_FE_16(m, x, ...) m(x) KL_FE_15(m, __VA_ARGS__)
#define KL_FC_1(m, x) m(x)
#define KL_FC_2(m, x, ...) m(x), KL_FC_1(m, __VA_ARGS__)
#define KL_FC_3(m, x, ...) m(x), KL_FC_2(m, __VA_ARGS__)
#define KL_FC_4(m, x, ...) m(x), KL_FC_3(m, __VA_ARGS__)
#define KL_FC_5(m, x, ...) m(x), KL_FC_4(m, __VA_ARGS__)
#define KL_FC_6(m, x, ...) m(x), KL_FC_5(m, __VA_ARGS__)
#define KL_FC_7(m, x, ...) m(x), KL_FC_6(m, __VA_ARGS__)
#define KL_FC_8(m, x, ...) m(x), KL_FC_7(m, __VA_ARGS__)
#define KL_FC_9(m, x, ...) m(x), KL_FC_8(m, __VA_ARGS__)
#define KL_FC_10(m, x, ...) m(x), KL_FC_9(m, __VA_ARGS__)
#define KL_FC_11(m, x, ...) m(x), KL_FC_10(m, __VA_ARGS__)
#define KL_FC_12(m, x, ...) m(x), KL_FC_11(m, __VA_ARGS__)
#define KL_FC_13(m, x, ...) m(x), KL_FC_12(m, __VA_ARGS__)
#define KL_FC_14(m, x, ...) m(x), KL_FC_13(m, __VA_ARGS__)
#define KL_FC_15(m, x, ...) m(x), KL_FC_14(m, __VA_ARGS__)
#define KL_FC_16(m, x, ...) m(x), KL_FC_15(m, __VA_ARGS__)
#define KL_FE(m, ...) KL_CAT(KL_FE_, KL_NARGS(__VA_ARGS__))(m, __VA_ARGS__)
#define KL_FIELD(decl) decl;
#define KL_FC(m, ...) KL_CAT(KL_FC_, KL_NARGS(__VA_ARGS__))(m, __VA_ARGS__)

#endif
