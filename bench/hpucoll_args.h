/* hpucoll-bench's command line: nccl-tests' options (src/common.cu) with
 * their meanings, and the long options that are hpucoll-bench's own. The
 * names of collectives, datatypes and reductions as the output prints
 * them (nccl-tests' names) are here too. */
#ifndef HPU_BENCH_HPUCOLL_ARGS_H
#define HPU_BENCH_HPUCOLL_ARGS_H

#include "bench/bench_common.h"
#include "bench/bench_data.h"

#include <hpu/coll.h>
#include <stdio.h>

/* How the reported time is combined over ranks (-a). */
enum hcb_average {
	HCB_AVG_RANK0 = 0, /* rank 0's */
	HCB_AVG_MEAN = 1,  /* the mean over ranks (the default) */
	HCB_AVG_MIN = 2,
	HCB_AVG_MAX = 3,
};

/* How the timed collectives are issued (-z, --async). */
enum hcb_blocking {
	HCB_ISSUE_ALL = 0,    /* all -n x -m issued, then waited for */
	HCB_WAIT_BARRIER = 1, /* each iteration waited for, then a barrier */
	HCB_WAIT_EACH = 2,    /* each iteration waited for (the default) */
	HCB_WAIT_EXCLUDE = 3, /* as 1, the barriers left out of the time */
};

struct hcb_args {
	struct bench_opts o;  /* -b -e -f -i -n -w -c -m, -C */
	enum bench_coll coll; /* --coll, or the program's name */
	int ndtypes;          /* -d: one, or every dtype (all) */
	hpucoll_dtype dtypes[HPUCOLL_NUM_DTYPES];
	int nops; /* -o: one, or every op (all) */
	hpucoll_op ops[HPUCOLL_NUM_OPS];
	int root;                   /* -r; -1: every rank in turn (all) */
	enum hcb_blocking blocking; /* -z */
	enum hcb_average average;   /* -a */
	int timeout_s;              /* -T: a wait for a peer, in seconds (0:
	                               HPUCOLL_TIMEOUT_MS) */
	const char *json;           /* -J: the JSON file's name, or NULL */
	const char *prog;           /* the program's name (argv[0] without its
	                               directory), as nccl-tests prints it */
};

/* The names the output prints: all_reduce ..., float ..., sum .... */
extern const char *const hcb_coll_names[BENCH_NUM_COLLS];
extern const char *const hcb_dtype_names[HPUCOLL_NUM_DTYPES];
extern const char *const hcb_op_names[HPUCOLL_NUM_OPS];
extern const char *const hcb_average_names[4];
extern const char *const hcb_blocking_names[4];

/* Reads argv into *a. Returns 0 to run, 1 after --help (printed on
 * stdout), or -1 after an error, which it has printed on stderr, naming
 * the option and what it accepts. */
int hcb_parse(struct hcb_args *a, int argc, char **argv);

/* The --help text. */
void hcb_usage(FILE *f, const char *prog);

#endif
