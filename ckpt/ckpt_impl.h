/* ckpt_impl: what the files of the checkpoint format share. ckpt/ only:
 * other folders read ckpt.h (tests/check_includes.sh). Calls go one way:
 * open.c to manifest_tensors.c and manifest_fields.c, manifest_tensors.c
 * to manifest_fields.c, read.c to open.c; write.c and root.c stand alone. */
#ifndef HPU_CKPT_IMPL_H
#define HPU_CKPT_IMPL_H

#include "ckpt/ckpt.h"
#include "common/fileio.h"

#include <sys/stat.h>

struct hpu_ckpt_index {
	uint64_t start, count, at; /* at: floats into the file's section */
	int file;
};

#define say hpu__say

#define SAFE_INT 9007199254740992.0 /* 2^53: integers up to it are exact in a double */

enum { OPTIONAL = 0, REQUIRED = 1 };
enum { WHOLE = 1, REAL = 0 };
#define MAX_WORLD 99999.0      /* what hpu__ckpt_shard_name can spell */
#define MAX_INT 2147483647.0
#define MAX_LR 1e6             /* the options' own limits (config.c) */
#define MAX_STEPS 1e15

/* ---- manifest_fields.c ---- */

/* Number (any), non-negative integer below 2^53, string shorter than n
 * `key` of o: 0, or -1 when absent or not that. */
int hpu__ckpt_get_num(const cJSON *o, const char *key, double *v);
int hpu__ckpt_get_u64(const cJSON *o, const char *key, uint64_t *v);
int hpu__ckpt_get_str(const cJSON *o, const char *key, char *buf, size_t n);

/* Number `key` of o in [lo, hi] (whole if asked) into *v: 0, or -1 with
 * a sentence naming ctx, the field and its value. */
int hpu__ckpt_check_num(const cJSON *o, const char *ctx, const char *key, int required,
			int whole, double lo, double hi, double *v, char *err, size_t errlen);

/* String `key` of o, one of name(0..n-1), into buf[len] if not NULL: 0,
 * or -1 with a sentence naming the names it may have. */
int hpu__ckpt_check_name(const cJSON *o, const char *ctx, const char *key, int required,
			 const char *(*name)(int), int n, char *buf, size_t len, char *err,
			 size_t errlen);

/* The names check_name takes: strategies, precisions, optimizers, dtypes. */
const char *hpu__ckpt_strategy_at(int k);
const char *hpu__ckpt_precision_at(int k);
const char *hpu__ckpt_optimizer_at(int k);
const char *hpu__ckpt_dtype_at(int k);

/* The run's position and state beside the floats, where present: 0, or
 * -1 with a sentence in err. */
int hpu__ckpt_check_run(const cJSON *m, const char *mpath, char *err, size_t errlen);

/* ---- manifest_tensors.c: each 0, or -1 with a sentence in err ---- */

int hpu__ckpt_parse_params(hpu_ckpt *c, const char *mpath, char *err, size_t errlen);
int hpu__ckpt_parse_sections(hpu_ckpt *c, const char *mpath, char *err, size_t errlen);
int hpu__ckpt_parse_buffers(hpu_ckpt *c, const char *mpath, char *err, size_t errlen);
int hpu__ckpt_parse_file(hpu_ckpt_file *f, const cJSON *j, int nsections, const char *mpath,
			 char *err, size_t errlen);
int hpu__ckpt_build_index(hpu_ckpt *c, const char *mpath, char *err, size_t errlen);

/* ---- open.c ---- */

/* A checkpoint's file opened for reading, of a trusted owner: its
 * descriptor and status in *st; -1 with a sentence ("WHAT PATH: ..."). */
int hpu__ckpt_open_data(hpu_ckpt *c, const char *what, const char *path, struct stat *st,
			char *err, size_t errlen);

#endif
