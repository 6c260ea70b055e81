/* hpucoll-bench -J FILE.json: the results as nccl-tests writes them (its
 * src/util.cu, JSON file version 3), made with cJSON on rank 0:
 *
 *   {"version": 3, "start_time": "YYYY-mm-dd HH:MM:SS",
 *    "args": [argv...],
 *    "config": {"nthreads": 1, "ngpus": 1, "minimum_bytes": B,
 *               "maximum_bytes": B, "step_factor": F | "step_bytes": B,
 *               "warmup_iters": W, "iterations": N,
 *               "aggregated_iterations": M, "validation": C, "graph": 0,
 *               "blocking_collectives": bool,
 *               hpucoll-bench's own: "collective", "ranks", "transport",
 *               "blocking" (-z), "average" (-a)},
 *    "results": [{"size": B, "count": elements, "type": "float",
 *                 "redop": "sum" | "none", "root": R (-1 if none),
 *                 "out_of_place": GROUP, "in_place": GROUP,
 *                 "actual_iterations": N, "experiment_name": ""}, ...],
 *    "out_of_bounds": {"count": N, "okay": bool},
 *    "average_bus_bandwidth": {"bandwidth": GB/s},
 *    "errors": [], "end_time": "..."}
 *
 *   GROUP: {"time" (or "cpu_time" with -C 1): us, as -a combines it,
 *           "alg_bw": GB/s, "bus_bw": GB/s,
 *           "nwrong": wrong elements over ranks, or null without -c,
 *           "time_over_ranks": {"rank0", "mean", "min", "max"}: us}
 *
 * Differences from nccl-tests: root is a number (nccl-tests writes the
 * padded text "    -1"), booleans are JSON booleans (nccl-tests writes
 * "true"), there is no "env" (the environment holds the job's token), no
 * "devices" and no "nccl_version"; time_over_ranks and the hpucoll keys of
 * config are hpucoll-bench's own. */
#ifndef HPU_BENCH_HPUCOLL_JSON_H
#define HPU_BENCH_HPUCOLL_JSON_H

#include <cJSON.h>
#include <stdio.h>

#include "bench/hpucoll_args.h"

/* One group (out-of-place or in-place) of a result line. */
struct hcb_group {
	double time;    /* us per collective, combined over ranks per -a */
	double over[4]; /* the same as rank 0's, mean, min, max (hcb_average) */
	double algbw, busbw; /* GB/s, from time */
	long wrong;          /* wrong elements over ranks; -1: not checked */
};

/* Creates the file: path, or path.0, path.1, ... while those exist (as
 * nccl-tests, it never overwrites). Its name goes to used. NULL, with the
 * reason in err, if it cannot. */
FILE *hcb_json_open(const char *path, char *used, size_t nused, char *err,
                    size_t nerr);

/* The document so far: version, start_time, args and config. */
cJSON *hcb_json_new(const struct hcb_args *a, int argc, char **argv, int ranks,
                    const char *transport);

/* Appends a result to "results" and returns it, for hcb_json_group. */
cJSON *hcb_json_row(cJSON *doc, size_t bytes, size_t count, const char *type,
                    const char *redop, int root);

/* Adds the row's out-of-place (inplace 0) or in-place group. */
void hcb_json_group(cJSON *row, int inplace, const struct hcb_group *g,
                    int cputime);

/* Ends the row as nccl-tests does (actual_iterations, experiment_name). */
void hcb_json_end_row(cJSON *row, int iters);

/* Adds the closing items, writes the document to f and closes it; frees
 * doc. Returns 0, or -1 with the reason in err. */
int hcb_json_finish(cJSON *doc, FILE *f, long out_of_bounds, double avg_busbw,
                    char *err, size_t nerr);

#endif
