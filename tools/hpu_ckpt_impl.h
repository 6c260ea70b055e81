/* hpu_ckpt_impl: what the files of hpu-ckpt share. Not installed.
 *
 * The calls run one way: hpu_ckpt.c (main) calls the commands, one file
 * each (hpu_ckpt_info.c, hpu_ckpt_verify.c, hpu_ckpt_export.c,
 * hpu_ckpt_reshard.c); they call hpu_ckpt_args.c (their options) and
 * hpu_ckpt_open.c (finding, opening, verifying and copying a
 * checkpoint), which call neither the commands nor each other. */
#ifndef HPU_TOOLS_HPU_CKPT_IMPL_H
#define HPU_TOOLS_HPU_CKPT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt.h"
#include "common/opt.h"
#include "tools/tool.h"

enum { OK = HPU_TOOL_OK, BAD = HPU_TOOL_BAD, USAGE = HPU_TOOL_USAGE };
#define fail hpu__tool_fail
#define usage_error hpu__tool_usage
enum { CHUNK = 1 << 20 };      /* floats per read: 4 MiB */
enum { MAX_WORLD = 99999 };    /* what hpu__ckpt_shard_name can spell */
enum { SHOW_PARAMS = 20 };     /* parameters listed by info */

/* ---- arguments (hpu_ckpt_args.c) ---- */

/* Each command's options: the parser's table and the help's (its --help,
 * man/hpu-ckpt.1, docs/reference/hpu-ckpt.md). An option's id is 2 + the
 * index of its value in the command's vals[]; a flag's value is "1". */
enum { OPT_HELP = 1, OPT_VAL = 2, OPT_LOG_LEVEL = 100 };
/* Every command's --log-level and --help. */
#define COMMON_OPTS \
	{"log-level", 0, HPU_OPT_VALUE, OPT_LOG_LEVEL, "LEVEL", .help = HPU_TOOL_LOG_LEVEL_HELP, \
	 .env = "HPU_LOG_LEVEL"}, \
	{"help", 'h', HPU_OPT_FLAG, OPT_HELP, NULL, .help = "this text"}
#define MAX_OPTS 6

/* Each command's table (in its file). */
extern const hpu_optspec hpu__ckt_info_specs[];
extern const hpu_optspec hpu__ckt_verify_specs[];
extern const hpu_optspec hpu__ckt_export_specs[];
extern const hpu_optspec hpu__ckt_reshard_specs[];

/* argv[1..] into vals[] and pos[]: -1 parsed, OK help printed, USAGE said. */
int hpu__ckt_parse_args(const char *cmd, const char *help, int argc, char **argv,
			const hpu_optspec *specs, const char **vals, const char **pos, int maxpos,
			int *npos);

/* ---- the commands (hpu_ckpt_CMD.c): argv[0] is the command ---- */

int hpu__ckt_info(int argc, char **argv);
int hpu__ckt_verify(int argc, char **argv);
int hpu__ckt_export(int argc, char **argv);
int hpu__ckt_reshard(int argc, char **argv);

/* ---- the checkpoint (hpu_ckpt_open.c) ---- */

/* A checkpoint root: its checkpoints newest first (hpu__ckpt_candidates)
 * and what `latest` says. */
typedef struct root {
	char **names;
	int n;
	char latest[256];
	int latest_ok; /* `latest` names names[0] */
	int latest_empty; /* `latest` is there but names nothing */
} root;

/* dir has a manifest (is a checkpoint, not a root). */
int hpu__ckt_has_manifest(const char *dir);
/* A root's checkpoints (BAD said when none), closed by root_close; which
 * of them stands for it (BAD said when `latest` names a missing one). */
int hpu__ckt_root_open(root *r, const char *path);
void hpu__ckt_root_close(root *r);
int hpu__ckt_root_pick(const root *r, const char *path);

/* Whose files are trusted (verify, export, reshard), set by trust_for. */
extern hpu_ckpt_owners hpu__ckt_trust;
void hpu__ckt_trust_for(const char *arg);

/* Opens the checkpoint at dir; BAD (said) if its manifest is unusable. */
int hpu__ckt_open(hpu_ckpt *c, const char *dir);
/* The shards and the buffers file: bytes, count. */
uint64_t hpu__ckt_total_bytes(const hpu_ckpt *c);
int hpu__ckt_total_files(const hpu_ckpt *c);
/* Every file checked (printed with `print`); how many are bad. */
int hpu__ckt_verify_files(hpu_ckpt *c, int print, char *first, size_t firstlen);
/* The string o[key], or dflt. */
const char *hpu__ckt_str(const cJSON *o, const char *key, const char *dflt);

/* Floats of section s, or of the buffers file, into w, CHUNK at a time. */
int hpu__ckt_copy_range(hpu_ckpt *c, int s, uint64_t start, uint64_t count, float *buf,
			hpu_ckpt_writer *w, char *err, size_t errlen);
int hpu__ckt_copy_buffers(hpu_ckpt *c, uint64_t start, uint64_t count, float *buf,
			  hpu_ckpt_writer *w, char *err, size_t errlen);
/* The checkpoint arg stands for, opened with every file's digest checked;
 * `what` ("export") is said when refusing. */
int hpu__ckt_open_verified(hpu_ckpt *c, const char *arg, const char *what);

#endif
