/* hpucoll-bench's command line: see hpucoll_args.h and hcb_usage(). */
#include "bench/hpucoll_args.h"

#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/num.h"
#include "common/opt.h"
#include "common/optdoc.h"

const char *const hcb_coll_names[BENCH_NUM_COLLS] = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast"};
const char *const hcb_dtype_names[HPUCOLL_NUM_DTYPES] = {
    "float", "double", "half", "bfloat16", "int32", "int64", "uint8"};
const char *const hcb_op_names[HPUCOLL_NUM_OPS] = {"sum", "avg", "max", "min"};
const char *const hcb_average_names[4] = {
    "rank 0's", "mean over ranks", "minimum over ranks", "maximum over ranks"};
const char *const hcb_blocking_names[4] = {
    "all issued, then waited for", "each waited for, then a barrier",
    "each waited for", "each waited for, then a barrier left out of the time"};

/* Every datatype spelling nccl-tests knows (the NCCL 1 names char and
 * int too), with hpucoll's dtype, or -1 where hpucoll has none. -d all
 * runs hpucoll's in this order, nccl-tests' order. The float16, float32
 * and float64 spellings are accepted as well. */
static const struct {
	const char *name;
	int dtype;
} dtype_spellings[] = {
    {"int8", -1},
    {"char", -1},
    {"uint8", HPUCOLL_U8},
    {"int32", HPUCOLL_I32},
    {"int", HPUCOLL_I32},
    {"uint32", -1},
    {"int64", HPUCOLL_I64},
    {"uint64", -1},
    {"half", HPUCOLL_F16},
    {"float16", HPUCOLL_F16},
    {"float", HPUCOLL_F32},
    {"float32", HPUCOLL_F32},
    {"double", HPUCOLL_F64},
    {"float64", HPUCOLL_F64},
    {"bfloat16", HPUCOLL_BF16},
    {"f8e4m3", -1},
    {"f8e5m2", -1},
};

/* nccl-tests' reductions in its order (-o all), hpucoll's op or -1. */
static const struct {
	const char *name;
	int op;
} op_spellings[] = {
    {"sum", HPUCOLL_SUM}, {"prod", -1},         {"max", HPUCOLL_MAX},
    {"min", HPUCOLL_MIN}, {"avg", HPUCOLL_AVG}, {"mulsum", -1},
};

#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))
#define SUPPORTED_DTYPES "uint8 int32 int64 half float double bfloat16"
#define SUPPORTED_OPS "sum max min avg"

/* nccl-tests options that mean nothing here (CUDA's streams, graphs,
 * registration, ...) and threads or GPUs per process: accepted with the
 * one value that means what hpucoll-bench does anyway. */
static const struct {
	char letter;
	const char *name;
	const char *value;
	const char *why;
} fixed[] = {
    {'t', "nthreads", "1",
     "hputrain runs one rank per process, with one thread; add ranks with "
     "hpulaunch --devices N (and nodes with --nodes)"},
    {'g', "ngpus", "1",
     "hputrain runs one rank per process, on one device; add ranks with "
     "hpulaunch --devices N (and nodes with --nodes)"},
    {'y', "stream_null", "0", "there are no CUDA streams"},
    {'G', "cudagraph", "0", "there are no CUDA graphs"},
    {'p', "parallel_init", "0", "each process initialises its one rank"},
    {'R', "local_register", "0", "there are no buffers to register"},
    {'D', "device_implementation", "0", "there is no device API"},
    {'M', "memory", "0", "there is no GPU memory to report"},
};

enum { OPT_COLL = 256, OPT_ASYNC, OPT_HELP_DOC };

#define NT "nccl-tests' options (one rank per process: -t and -g take only 1)"
#define NOCUDA(why) .help = "accepted with 0 only: " why

/* The parser's table and the help's (--help, man/hpucoll-bench.1,
 * docs/reference/hpucoll-bench.md). */
static const hpu_optspec specs[] = {
    {"nthreads", 't', HPU_OPT_VALUE, 't', "1", .help = "threads per process", .section = NT},
    {"ngpus", 'g', HPU_OPT_VALUE, 'g', "1", .help = "devices per thread"},
    {"minbytes", 'b', HPU_OPT_VALUE, 'b', "SIZE", .help = "smallest size (8); K, M, G suffixes"},
    {"maxbytes", 'e', HPU_OPT_VALUE, 'e', "SIZE", .help = "largest size (128M)"},
    {"stepfactor", 'f', HPU_OPT_VALUE, 'f', "N", .help = "sizes grow by this factor (2)"},
    {"stepbytes", 'i', HPU_OPT_VALUE, 'i', "SIZE", .help = "... or by this many bytes (-i without -f, or -f 1)"},
    {"iters", 'n', HPU_OPT_VALUE, 'n', "N", .help = "timed iterations per size and group (20)"},
    {"agg_iters", 'm', HPU_OPT_VALUE, 'm', "N", .help = "collectives issued together per iteration (1)"},
    {"warmup_iters", 'w', HPU_OPT_VALUE, 'w', "N", .help = "untimed iterations first (5)"},
    {"check", 'c', HPU_OPT_VALUE, 'c', "N",
     .help = "check every element of N more iterations on fresh inputs (1; 0: no check)"},
    {"op", 'o', HPU_OPT_VALUE, 'o', "OP",
     .help = SUPPORTED_OPS " or all (sum); nccl-tests' prod and mulsum are not in hpucoll"},
    {"datatype", 'd', HPU_OPT_VALUE, 'd', "TYPE",
     .help = SUPPORTED_DTYPES " or all (float); also int, float16, float32, float64; nccl-tests' "
             "int8, char, uint32, uint64, f8e4m3 and f8e5m2 are not in hpucoll"},
    {"root", 'r', HPU_OPT_VALUE, 'r', "N|all", .help = "broadcast's root (0); all (or -1): each in turn"},
    {"blocking", 'z', HPU_OPT_VALUE, 'z', "0|1|2|3",
     .help = "0: issue all -n x -m, then wait; 1: wait for each iteration, then a barrier; "
             "2 (default): wait for each; 3: as 1, the barriers left out of the time"},
    {"average", 'a', HPU_OPT_VALUE, 'a', "0|1|2|3",
     .help = "time over ranks: 0 rank 0's, 1 the mean (default), 2 the minimum, 3 the maximum"},
    {"report_cputime", 'C', HPU_OPT_VALUE, 'C', "0|1",
     .help = "report the time until the last collective was issued"},
    {"timeout", 'T', HPU_OPT_VALUE, 'T', "S",
     .help = "a collective fails after waiting S seconds for a peer (0: HPUCOLL_TIMEOUT_MS, or 60 s)"},
    {"output_file", 'J', HPU_OPT_VALUE, 'J', "F.json",
     .help = "also write the results as JSON; an existing F.json is kept and F.json.0, .1, ... tried, "
             "as nccl-tests does"},
    {"stream_null", 'y', HPU_OPT_VALUE, 'y', "0", NOCUDA("there are no CUDA streams")},
    {"cudagraph", 'G', HPU_OPT_VALUE, 'G', "0", NOCUDA("there are no CUDA graphs")},
    {"parallel_init", 'p', HPU_OPT_VALUE, 'p', "0", NOCUDA("each process initialises its one rank")},
    {"local_register", 'R', HPU_OPT_VALUE, 'R', "0", NOCUDA("there are no buffers to register")},
    {"device_implementation", 'D', HPU_OPT_VALUE, 'D', "0", NOCUDA("there is no device API")},
    {"memory", 'M', HPU_OPT_VALUE, 'M', "0", NOCUDA("there is no GPU memory to report")},
    {"help", 'h', HPU_OPT_FLAG, 'h', NULL, .help = "this help"},
    {"coll", 0, HPU_OPT_VALUE, OPT_COLL, "NAME",
     .help = "all_reduce | reduce_scatter | all_gather | broadcast; all_reduce, or NAME when the "
             "program is called NAME_perf (a link to hpucoll-bench)",
     .section = "hpucoll-bench's own"},
    {"async", 0, HPU_OPT_FLAG, OPT_ASYNC, NULL, .help = "-z 0"},
    /* the options' documentation (man/, docs/reference/): not listed */
    {"help-doc", 0, HPU_OPT_VALUE, OPT_HELP_DOC, .help = NULL},
    {0},
};

void hcb_usage(FILE *f, const char *prog)
{
	fprintf(f, "usage: hpulaunch --devices N --exec %s [options]\n", prog);
	hpu__optdoc(f, specs, HPU_DOC_HELP, 26);
	fprintf(f, "\nThe transport comes from HPUCOLL_TRANSPORT (hpulaunch --transport).\n");
}

static int fail(const struct hcb_args *a, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "%s: ", a->prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (%s --help lists the options)\n", a->prog);
	return -1;
}

static int coll_by_name(const char *s)
{
	for (int i = 0; i < BENCH_NUM_COLLS; i++)
		if (!strcmp(s, hcb_coll_names[i]))
			return i;
	return -1;
}

/* The collective a program called all_reduce_perf (and so on) runs. */
static int coll_by_prog(const char *prog)
{
	size_t n = strlen(prog);
	if (n < 6 || strcmp(prog + n - 5, "_perf"))
		return -1;
	for (int i = 0; i < BENCH_NUM_COLLS; i++)
		if (strlen(hcb_coll_names[i]) == n - 5 &&
		    !strncmp(prog, hcb_coll_names[i], n - 5))
			return i;
	return -1;
}

static int parse_dtype(struct hcb_args *a, const char *v)
{
	if (!strcmp(v, "all")) {
		a->ndtypes = 0;
		for (size_t i = 0; i < NELEMS(dtype_spellings); i++) {
			int t = dtype_spellings[i].dtype, seen = 0;
			for (int k = 0; k < a->ndtypes; k++)
				seen |= a->dtypes[k] == (hpucoll_dtype)t;
			if (t >= 0 && !seen)
				a->dtypes[a->ndtypes++] = (hpucoll_dtype)t;
		}
		return 0;
	}
	for (size_t i = 0; i < NELEMS(dtype_spellings); i++) {
		if (strcmp(v, dtype_spellings[i].name))
			continue;
		if (dtype_spellings[i].dtype < 0)
			return fail(a,
			            "-d %s: hpucoll has no %s; its datatypes "
			            "are " SUPPORTED_DTYPES " (or all)",
			            v, v);
		a->ndtypes = 1;
		a->dtypes[0] = (hpucoll_dtype)dtype_spellings[i].dtype;
		return 0;
	}
	return fail(a,
	            "-d %s: not a datatype; give one of " SUPPORTED_DTYPES
	            " (also int, float16, float32, float64) or all",
	            v);
}

static int parse_op(struct hcb_args *a, const char *v)
{
	int all = !strcmp(v, "all");
	if (all)
		a->nops = 0;
	for (size_t i = 0; i < NELEMS(op_spellings); i++) {
		if (all) {
			if (op_spellings[i].op >= 0)
				a->ops[a->nops++] =
				    (hpucoll_op)op_spellings[i].op;
			continue;
		}
		if (strcmp(v, op_spellings[i].name))
			continue;
		if (op_spellings[i].op < 0)
			return fail(a,
			            "-o %s: hpucoll has no %s reduction; its "
			            "reductions are " SUPPORTED_OPS " (or all)",
			            v, v);
		a->nops = 1;
		a->ops[0] = (hpucoll_op)op_spellings[i].op;
		return 0;
	}
	if (all)
		return 0;
	return fail(
	    a, "-o %s: not a reduction; give one of " SUPPORTED_OPS " or all",
	    v);
}

/* An option of `fixed`: its one value, or an error saying why. */
static int parse_fixed(const struct hcb_args *a, int id, const char *v)
{
	for (size_t i = 0; i < NELEMS(fixed); i++) {
		if (fixed[i].letter != id)
			continue;
		int n;
		if (hpu__parse_int(v, INT_MIN, INT_MAX, &n) == HPU_NUM_OK &&
		    n == atoi(fixed[i].value))
			return 0;
		if (id == 't' && coll_by_name(v) >= 0)
			return fail(
			    a,
			    "-t %s: -t is nccl-tests' --nthreads (threads "
			    "per process) now; choose the collective with "
			    "--coll %s",
			    v, v);
		return fail(a, "-%c %s (--%s): only %s is accepted: %s", id, v,
		            fixed[i].name, fixed[i].value, fixed[i].why);
	}
	return -1;
}

static int parse_int_opt(const struct hcb_args *a, int id, const char *v,
                         int lo, int hi, int *out)
{
	const char *name = "";
	for (const hpu_optspec *s = specs; s->name; s++)
		if (s->id == id)
			name = s->name;
	if (hpu__parse_int(v, lo, hi, out) == HPU_NUM_OK)
		return 0;
	if (hi == INT_MAX)
		return fail(a, "-%c %s (--%s): give a whole number, %d or more",
		            id, v, name, lo);
	return fail(a, "-%c %s (--%s): give a whole number from %d to %d", id,
	            v, name, lo, hi);
}

static int parse_size_opt(const struct hcb_args *a, int id, const char *v,
                          size_t *out)
{
	if (bench_parse_size(v, out) == 0)
		return 0;
	return fail(a, "-%c %s: not a size: bytes, with a K, M or G suffix", id,
	            v);
}

/* One option; 0, or -1 after its error. */
static int option(struct hcb_args *a, int id, const char *v, int *stepbytes,
                  int *factor)
{
	int n = 0, rc;
	switch (id) {
	case 'b':
		return parse_size_opt(a, id, v, &a->o.minbytes);
	case 'e':
		return parse_size_opt(a, id, v, &a->o.maxbytes);
	case 'i':
		*stepbytes = 1;
		return parse_size_opt(a, id, v, &a->o.stepbytes);
	case 'f':
		*factor = 1;
		rc = parse_int_opt(a, id, v, 1, INT_MAX, &n);
		a->o.factor = (size_t)n;
		return rc;
	case 'n':
		return parse_int_opt(a, id, v, 1, INT_MAX, &a->o.iters);
	case 'm':
		return parse_int_opt(a, id, v, 1, 1 << 20, &a->o.agg);
	case 'w':
		return parse_int_opt(a, id, v, 0, INT_MAX, &a->o.warmup);
	case 'c':
		return parse_int_opt(a, id, v, 0, INT_MAX, &a->o.check);
	case 'C':
		return parse_int_opt(a, id, v, 0, 1, &a->o.cputime);
	case 'T':
		return parse_int_opt(a, id, v, 0, INT_MAX / 1000,
		                     &a->timeout_s);
	case 'z':
		rc = parse_int_opt(a, id, v, 0, 3, &n);
		a->blocking = (enum hcb_blocking)n;
		return rc;
	case 'a':
		if (hpu__parse_int(v, 0, 3, &n) != HPU_NUM_OK)
			return fail(
			    a,
			    "-a %s (--average): give 0 (rank 0's time), 1 "
			    "(the mean over ranks), 2 (the minimum) or 3 "
			    "(the maximum); the old -a (issue all, then "
			    "wait) is --async, or -z 0",
			    v);
		a->average = (enum hcb_average)n;
		return 0;
	case 'd':
		return parse_dtype(a, v);
	case 'o':
		return parse_op(a, v);
	case 'r':
		if (!strcmp(v, "all")) {
			a->root = -1;
			return 0;
		}
		return parse_int_opt(a, id, v, -1, INT_MAX, &a->root);
	case 'J':
		a->json = v;
		return 0;
	case OPT_COLL:
		if ((n = coll_by_name(v)) < 0)
			return fail(
			    a,
			    "--coll %s: not a collective; give all_reduce, "
			    "reduce_scatter, all_gather or broadcast",
			    v);
		a->coll = (enum bench_coll)n;
		return 0;
	case OPT_ASYNC:
		a->blocking = HCB_ISSUE_ALL;
		return 0;
	default:
		return parse_fixed(a, id, v);
	}
}

/* What the options say together. */
static int check(struct hcb_args *a, int stepbytes, int factor)
{
	struct bench_opts *o = &a->o;
	if (stepbytes && factor && o->factor > 1)
		return fail(a,
		            "-f %zu and -i %zu: give one way to step the "
		            "sizes (-f 1 steps by -i)",
		            o->factor, o->stepbytes);
	if (stepbytes && !factor)
		o->factor = 1;
	if (o->minbytes > o->maxbytes)
		return fail(a, "-b %zu is above -e %zu", o->minbytes,
		            o->maxbytes);
	if (o->factor > 1 && o->minbytes == 0)
		return fail(a,
		            "-b 0 never grows by a factor: give -b 1 or more, "
		            "or step by bytes (-i)");
	if (o->factor == 1 && o->stepbytes == 0)
		return fail(a, "-i 0: sizes would never grow");
	size_t n = a->json ? strlen(a->json) : 0;
	if (a->json && (n < 6 || strcasecmp(a->json + n - 5, ".json")))
		return fail(a,
		            "-J %s: the results are written as JSON only, to a "
		            "file named *.json (nccl-tests reads the type from "
		            "the name)",
		            a->json);
	return 0;
}

/* Whether arg is a short option with its value glued on ("-b8"), which
 * getopt reads and the project's parser does not. */
static int glued(const char *arg)
{
	if (arg[0] != '-' || arg[1] == '-' || !arg[1] || !arg[2])
		return 0;
	for (const hpu_optspec *s = specs; s->id; s++)
		if (s->short_name == arg[1] && s->value == HPU_OPT_VALUE)
			return 1;
	return 0;
}

int hcb_parse(struct hcb_args *a, int argc, char **argv)
{
	const char *slash = strrchr(argv[0], '/');
	memset(a, 0, sizeof *a);
	bench_opts_default(&a->o);
	a->prog = slash ? slash + 1 : argv[0];
	int byname = coll_by_prog(a->prog);
	a->coll = byname >= 0 ? (enum bench_coll)byname : BENCH_ALL_REDUCE;
	a->ndtypes = a->nops = 1;
	a->dtypes[0] = HPUCOLL_F32;
	a->ops[0] = HPUCOLL_SUM;
	a->blocking = HCB_WAIT_EACH;
	a->average = HCB_AVG_MEAN;

	int stepbytes = 0, factor = 0;
	hpu_optparse p;
	hpu__optparse_init(&p, argc, argv, specs);
	for (int id; (id = hpu__optparse_next(&p)) != HPU_OPT_END;) {
		switch (id) {
		case 'h':
			hcb_usage(stdout, a->prog);
			return 1;
		case OPT_HELP_DOC:
			if (hpu__optdoc_format(p.val) < 0)
				return fail(a, "--help-doc takes help, scdoc or markdown, not '%s'", p.val);
			hpu__optdoc(stdout, specs, hpu__optdoc_format(p.val), 26);
			return 1;
		case HPU_OPT_POSITIONAL:
			return fail(a, "unexpected argument '%s'", p.val);
		case HPU_OPT_MISSING:
			return fail(a, "%s needs a value", p.arg);
		case HPU_OPT_UNWANTED:
			return fail(a, "%s takes no value", p.arg);
		case HPU_OPT_UNKNOWN:
			if (glued(p.arg))
				return fail(a,
				            "%s: write -%c %s, with a space "
				            "between the option and its value",
				            p.arg, p.arg[1], p.arg + 2);
			return fail(a, "unknown option '%s'", p.arg);
		default:
			if (option(a, id, p.val, &stepbytes, &factor))
				return -1;
		}
	}
	return check(a, stepbytes, factor);
}
