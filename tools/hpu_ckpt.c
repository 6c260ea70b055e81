/* hpu-ckpt: looks at, checks, exports and reshards the checkpoints that
 * hpu-worker writes (the format is ckpt/ckpt.h).
 *
 *   hpu-ckpt info DIR                      what a checkpoint (or a root) holds
 *   hpu-ckpt verify DIR [--all]            sizes and SHA-256 of every file
 *   hpu-ckpt export DIR -o FILE [--format safetensors|raw]
 *   hpu-ckpt reshard SRC DST --world M [--strategy S]
 *
 * DIR is a checkpoint directory (it has manifest.json) or a checkpoint
 * root (--checkpoint-dir: `latest` and step-* directories), which stands
 * for the checkpoint `latest` names. Exit status: 0 done, 1 failed (damage
 * found, or a file could not be read or written), 2 usage. Floats are
 * copied in chunks of CHUNK floats, so memory stays bounded whatever the
 * checkpoint's size. */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt/safetensors.h"
#include "options/config.h"
#include "common/fileio.h"
#include "common/num.h"
#include "common/opt.h"
#include "common/optdoc.h"
#include "tools/tool.h"

enum { OK = HPU_TOOL_OK, BAD = HPU_TOOL_BAD, USAGE = HPU_TOOL_USAGE };
#define fail hpu__tool_fail
#define usage_error hpu__tool_usage
enum { CHUNK = 1 << 20 };      /* floats per read: 4 MiB */
enum { MAX_WORLD = 99999 };    /* what hpu__ckpt_shard_name can spell */
enum { SHOW_PARAMS = 20 };     /* parameters listed by info */

/* ---- messages ---- */

static const char *const help_main =
	"usage: hpu-ckpt COMMAND [options]\n"
	"\n"
	"Looks at, checks, exports and reshards hpu-worker checkpoints.\n"
	"DIR is a checkpoint directory (with manifest.json) or a checkpoint root\n"
	"(--checkpoint-dir: `latest` and step-* directories), which stands for\n"
	"the checkpoint `latest` names.\n"
	"\n"
	"commands:\n"
	"  info DIR                     the run, the parameters, the files\n"
	"  verify DIR [--all]           every file's size and SHA-256\n"
	"  export DIR -o FILE [--format safetensors|raw]\n"
	"                               the fp32 weights as one file\n"
	"  reshard SRC DST --world M [--strategy S]\n"
	"                               the same checkpoint as M shards\n"
	"\n"
	"hpu-ckpt COMMAND --help says more. Exit status: 0 done, 1 failed\n"
	"(damage found, or a file could not be read or written), 2 usage.\n";

static const char *const help_info =
	"usage: hpu-ckpt info DIR\n"
	"\n"
	"Prints what a checkpoint holds: model, step, epoch and batch, world size,\n"
	"strategy, precision, optimizer, sections, parameters (name and shape),\n"
	"buffers (name, shape, sync), files and bytes, scheduler, loss scaler,\n"
	"fp8 state, the last validation (--eval-every), what --keep-last and\n"
	"--keep-best kept, and --early-stop's count. For a checkpoint root,\n"
	"first lists every checkpoint in it, newest first, marking the one\n"
	"`latest` names with '*', then shows that one.\n";

static const char *const help_verify =
	"usage: hpu-ckpt verify DIR [--all]\n"
	"\n"
	"Checks the manifest against its own digest (manifest_sha256: an edit\n"
	"is found), then every file of the checkpoint (the shards and, when the\n"
	"model has buffers, the buffers file) against it: present, a regular\n"
	"file (a FIFO, a device or a link is refused unread), yours (run as\n"
	"root: DIR's owner's), the size, the SHA-256. One line per file, then a\n"
	"total. For a root, checks that `latest` is yours and the checkpoint it\n"
	"names; with --all, every checkpoint under it. Exits 1 if any file (or\n"
	"manifest) is damaged, missing or another user's.\n";

static const char *const help_export =
	"usage: hpu-ckpt export DIR -o FILE [--format safetensors|raw]\n"
	"\n"
	"Writes the checkpoint's fp32 weights (the \"params\" section) to FILE,\n"
	"atomically (a device or a pipe, such as /dev/stdout, in place), after\n"
	"checking every file's SHA-256:\n"
	"  safetensors  (default) one F32 tensor per parameter, then one per\n"
	"               buffer (batch norm's running statistics, ...), named as\n"
	"               in the model, as a state_dict has them; loads with\n"
	"               safetensors.torch.load_file\n"
	"  raw          every parameter's floats in declaration order, exactly\n"
	"               what --save-params writes (for --load-params); no\n"
	"               buffers (they stay in the checkpoint's buffers file)\n";

static const char *const help_reshard =
	"usage: hpu-ckpt reshard SRC DST --world M [--strategy S]\n"
	"\n"
	"Writes checkpoint SRC again as DST with M shard files, each an equal\n"
	"contiguous slice of the parameters and their optimizer state, so that\n"
	"M workers each read one file; the buffers file, whole on every rank\n"
	"whatever the world size, is copied as it is. DST must not exist; it is\n"
	"written as DST.partial and renamed when complete. The manifest is SRC's\n"
	"with world_size M (and strategy S, one of fast_ddp, ddp, zero1, zero2,\n"
	"zero3, if given). SRC's files are verified first. Resume from it with\n"
	"hpu-worker --resume DST (any world size and strategy reads it).\n";

/* ---- arguments ---- */

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

static const hpu_optspec info_specs[] = {COMMON_OPTS, {0}};
static const hpu_optspec verify_specs[] = {
	{"all", 0, HPU_OPT_FLAG, OPT_VAL, NULL,
	 .help = "for a checkpoint root, verify every checkpoint under it, not only the one `latest` names"},
	COMMON_OPTS, {0}};
static const hpu_optspec export_specs[] = {
	{"output", 'o', HPU_OPT_VALUE, OPT_VAL, "FILE", .help = "the file to write (required)"},
	{"format", 0, HPU_OPT_VALUE, OPT_VAL + 1, "FORMAT",
	 .help = "safetensors (default): one F32 tensor per parameter, then one per buffer; "
		 "raw: every parameter's floats in declaration order, as --save-params writes"},
	COMMON_OPTS, {0}};
static const hpu_optspec reshard_specs[] = {
	{"world", 0, HPU_OPT_VALUE, OPT_VAL, "M", .help = "the number of shards to write (required; 1..99999)"},
	{"strategy", 0, HPU_OPT_VALUE, OPT_VAL + 1, "S",
	 .help = "the strategy the manifest names: fast_ddp, ddp, zero1, zero2 or zero3 (SRC's)"},
	COMMON_OPTS, {0}};

/* Splits argv[1..] (argv[0] the command) into options, whose values go to
 * vals[id - OPT_VAL], and at most maxpos positional arguments. Returns -1
 * when parsed, OK after printing help, or USAGE after saying what is
 * wrong. */
static int parse_args(const char *cmd, const char *help, int argc, char **argv,
		      const hpu_optspec *specs, const char **vals, const char **pos, int maxpos,
		      int *npos)
{
	hpu_optparse p;
	hpu__optparse_init(&p, argc, argv, specs);
	*npos = 0;
	for (int r; (r = hpu__optparse_next(&p)) != HPU_OPT_END;) {
		if (r == OPT_HELP) {
			fputs(help, stdout);
			fputs("\noptions:\n", stdout);
			hpu__optdoc(stdout, specs, HPU_DOC_HELP, 21);
			return OK;
		} else if (r == OPT_LOG_LEVEL) {
			if (hpu__tool_log_level(p.val))
				return USAGE;
		} else if (r == HPU_OPT_POSITIONAL) {
			if (*npos == maxpos)
				return usage_error(cmd, "unexpected argument '%s'", p.val);
			pos[(*npos)++] = p.val;
		} else if (r == HPU_OPT_MISSING) {
			return usage_error(cmd, "--%s needs a value", p.spec->name);
		} else if (r == HPU_OPT_UNWANTED && p.spec->id != OPT_HELP) {
			return usage_error(cmd, "--%s takes no value", p.spec->name);
		} else if (r < 0) {
			return usage_error(cmd, "unknown option '%s'", p.arg);
		} else {
			assert(r - OPT_VAL < MAX_OPTS);
			vals[r - OPT_VAL] = p.spec->value == HPU_OPT_FLAG ? "1" : p.val;
		}
	}
	return -1;
}

/* ---- finding the checkpoint ---- */

static int is_dir(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int has_manifest(const char *dir)
{
	char p[4200];
	struct stat st;
	snprintf(p, sizeof p, "%s/%s", dir, HPU_CKPT_MANIFEST);
	return stat(p, &st) == 0;
}


/* A checkpoint root: its checkpoints newest first (hpu__ckpt_candidates)
 * and what `latest` says. */
typedef struct root {
	char **names;
	int n;
	char latest[256];
	int latest_ok; /* `latest` names names[0] */
} root;

/* Reads root `path`; BAD (said) when it is neither a checkpoint root nor
 * has any checkpoint. */
static int root_open(root *r, const char *path)
{
	char err[512];
	struct stat st;
	memset(r, 0, sizeof *r);
	if (stat(path, &st) < 0)
		return fail("%s: %s", path, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return fail("%s is not a directory (a checkpoint is one)", path);
	if ((r->n = hpu__ckpt_candidates(path, &r->names, err, sizeof err)) < 0)
		return fail("%s", err);
	if (r->n == 0) {
		hpu__ckpt_free_names(r->names);
		r->names = NULL;
		return fail("%s is neither a checkpoint (no %s) nor a checkpoint root (no step-* "
			    "directories)",
			    path, HPU_CKPT_MANIFEST);
	}
	hpu__ckpt_latest(path, r->latest, sizeof r->latest);
	r->latest_ok = r->latest[0] && !strcmp(r->latest, r->names[0]);
	return OK;
}

static void root_close(root *r)
{
	hpu__ckpt_free_names(r->names);
	r->names = NULL;
}

/* Says (on stderr) which checkpoint of a root stands for it, when `latest`
 * does not name it; BAD when `latest` names one that is not there. */
static int root_pick(const root *r, const char *path)
{
	if (r->latest_ok)
		return OK;
	if (r->latest[0])
		return fail("%s/%s names \"%s\", which is not a checkpoint there (newest present: "
			    "%s); name the checkpoint directory itself",
			    path, HPU_CKPT_LATEST, r->latest, r->names[0]);
	hpu__tool_note("%s has no `%s` file; using the newest, %s", path, HPU_CKPT_LATEST,
		       r->names[0]);
	return OK;
}

/* The checkpoint directory `arg` stands for, into dir[n]: arg itself, or
 * the latest checkpoint of the root arg. */
static int resolve(const char *arg, char *dir, size_t n)
{
	if (has_manifest(arg)) {
		snprintf(dir, n, "%s", arg);
		return OK;
	}
	root r;
	int rc = root_open(&r, arg);
	if (rc == OK && (rc = root_pick(&r, arg)) == OK)
		snprintf(dir, n, "%s/%s", arg, r.names[0]);
	root_close(&r);
	return rc;
}

/* Whose files verify, export and reshard trust (info: anyone's): the
 * user's who runs hpu-ckpt, as a job trusts its own uid's; run as root,
 * the owner of the DIR named (an administrator's look at a user's
 * checkpoints). n 0 until trust_for(). */
static hpu_ckpt_owners TRUST;

static void trust_for(const char *arg)
{
	struct stat st;
	TRUST.n = 1;
	TRUST.uid[0] = geteuid();
	if (TRUST.uid[0] == 0 && stat(arg, &st) == 0)
		TRUST.uid[0] = st.st_uid;
}

/* The warning for a manifest without its digest, on stderr. */
static void note_unsealed(const hpu_ckpt *c)
{
	char note[4400];
	if (!c->unsealed)
		return;
	hpu__ckpt_unsealed_note(c, note, sizeof note);
	hpu__tool_warn("%s", note);
}

/* Opens the checkpoint at dir; BAD (said) if its manifest is unusable. */
static int open_ckpt(hpu_ckpt *c, const char *dir)
{
	char err[1024];
	if (hpu__ckpt_open_owned(c, dir, &TRUST, err, sizeof err) < 0) {
		hpu__ckpt_close(c);
		return fail("%s", err);
	}
	return OK;
}

/* The shards and the buffers file. */
static uint64_t total_bytes(const hpu_ckpt *c)
{
	uint64_t b = c->nbuffers ? c->buffer_file.bytes : 0;
	for (int i = 0; i < c->nfiles; i++)
		b += c->files[i].bytes;
	return b;
}

static int total_files(const hpu_ckpt *c)
{
	return c->nfiles + (c->nbuffers > 0);
}

/* Every file checked; with `print`, one line each and a total. Returns
 * how many are bad; the first failure's sentence in first[]. */
static int verify_files(hpu_ckpt *c, int print, char *first, size_t firstlen)
{
	int bad = 0, n = total_files(c);
	uint64_t ok_bytes = 0;
	char err[1024];
	if (print)
		printf("%s: %d file%s, %llu bytes\n", c->dir, n, hpu__plural(n),
		       (unsigned long long)total_bytes(c));
	/* i == nfiles: the buffers file */
	for (int i = 0; i < n; i++) {
		const hpu_ckpt_file *f = i < c->nfiles ? &c->files[i] : &c->buffer_file;
		if ((i < c->nfiles ? hpu__ckpt_verify(c, i, err, sizeof err)
				   : hpu__ckpt_verify_buffers(c, err, sizeof err)) < 0) {
			if (!bad++ && first)
				snprintf(first, firstlen, "%s", err);
			if (print)
				printf("  BAD  %s\n", err);
		} else {
			ok_bytes += f->bytes;
			if (print)
				printf("  ok   %s (%llu bytes, sha256 %.16s...)\n", f->name,
				       (unsigned long long)f->bytes, f->sha256);
		}
	}
	if (print) {
		if (bad)
			printf("%s: DAMAGED: %d of %d file%s bad\n", c->dir, bad, n, hpu__plural(n));
		else
			printf("%s: ok: %d file%s, %llu bytes verified\n", c->dir, n, hpu__plural(n),
			       (unsigned long long)ok_bytes);
	}
	return bad;
}

/* ---- info ---- */

static const char *str(const cJSON *o, const char *key, const char *dflt)
{
	const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(j) ? j->valuestring : dflt;
}

/* "key value, key value" of a flat object's numbers and strings. */
static void print_fields(const char *label, const cJSON *o)
{
	printf("%-14s", label);
	if (!cJSON_IsObject(o)) {
		printf("(not recorded)\n");
		return;
	}
	const cJSON *f;
	int first = 1;
	cJSON_ArrayForEach(f, o) {
		if (cJSON_IsNumber(f))
			printf("%s%s %g", first ? "" : ", ", f->string, f->valuedouble);
		else if (cJSON_IsString(f))
			printf("%s%s %s", first ? "" : ", ", f->string, f->valuestring);
		else
			continue;
		first = 0;
	}
	printf("\n");
}

/* "[1024, 784]" */
static void shape_text(int ndim, const int64_t *shape, char *buf, size_t n)
{
	size_t at = (size_t)snprintf(buf, n, "[");
	for (int d = 0; d < ndim && at < n; d++)
		at += (size_t)snprintf(buf + at, n - at, "%s%lld", d ? ", " : "",
				       (long long)shape[d]);
	if (at < n)
		snprintf(buf + at, n - at, "]");
}

/* The buffers, at most SHOW_PARAMS of them: name, shape, floats, sync
 * (nothing for a model without: its lines stay as they were). */
static void print_buffers(const hpu_ckpt *c)
{
	if (!c->nbuffers)
		return;
	printf("%-14s%d (%llu floats) in %s\n", "buffers", c->nbuffers,
	       (unsigned long long)c->buffer_numel, c->buffer_file.name);
	int w = 0, ws = 0;
	char shape[SHOW_PARAMS][160];
	for (int i = 0; i < c->nbuffers && i < SHOW_PARAMS; i++) {
		w = (int)strlen(c->buffers[i].name) > w ? (int)strlen(c->buffers[i].name) : w;
		shape_text(c->buffers[i].ndim, c->buffers[i].shape, shape[i], sizeof shape[i]);
		ws = (int)strlen(shape[i]) > ws ? (int)strlen(shape[i]) : ws;
	}
	for (int i = 0; i < c->nbuffers && i < SHOW_PARAMS; i++)
		printf("  %-*s  %-*s  %llu%s%s\n", w, c->buffers[i].name, ws, shape[i],
		       (unsigned long long)c->buffers[i].numel,
		       c->buffers[i].sync[0] ? "  sync " : "", c->buffers[i].sync);
	if (c->nbuffers > SHOW_PARAMS)
		printf("  ... %d more\n", c->nbuffers - SHOW_PARAMS);
}

/* "validation    step 12: val_loss 0.51, val_accuracy 0.81": the last
 * validation before the save (--eval-every), when there was one. */
static void print_validation(const cJSON *v)
{
	if (!v)
		return;
	printf("%-14s", "validation");
	if (!cJSON_IsObject(v)) {
		printf("(not an object)\n");
		return;
	}
	printf("step %.0f:", hpu__ckpt_num(v, "step", 0));
	const cJSON *f;
	int first = 1;
	cJSON_ArrayForEach(f, v) {
		if (strcmp(f->string, "step") == 0 || strncmp(f->string, "val_", 4) != 0)
			continue;
		printf("%s %s ", first ? "" : ",", f->string);
		if (cJSON_IsNumber(f))
			printf("%g", f->valuedouble);
		else
			printf("(not a number)");
		first = 0;
	}
	printf("\n");
}

/* ", " between the strings of array a, or "none". */
static void print_names(const cJSON *a)
{
	const cJSON *e;
	int n = 0;
	cJSON_ArrayForEach(e, a)
		if (cJSON_IsString(e))
			printf("%s%s", n++ ? ", " : "", e->valuestring);
	if (!n)
		printf("none");
}

/* "keep          newest 1: step-00000012; best 2 by val_loss (max):
 * step-00000004, step-00000008" (--keep-last, --keep-best). */
static void print_keep(const cJSON *k)
{
	if (!k)
		return;
	printf("%-14s", "keep");
	if (!cJSON_IsObject(k)) {
		printf("(not an object)\n");
		return;
	}
	printf("newest %.0f: ", hpu__ckpt_num(k, "last_k", 0));
	print_names(cJSON_GetObjectItemCaseSensitive(k, "last"));
	if (cJSON_GetObjectItemCaseSensitive(k, "best_k")) {
		printf("; best %.0f by %s (%s): ", hpu__ckpt_num(k, "best_k", 0),
		       str(k, "metric", "?"), str(k, "mode", "?"));
		print_names(cJSON_GetObjectItemCaseSensitive(k, "best"));
	}
	printf("\n");
}

/* "early stop    val_loss (min): best 0.48 at step 8, 2 validations
 * since" (--early-stop's count at the save; "no best yet" before one). */
static void print_early_stop(const cJSON *e)
{
	if (!e)
		return;
	printf("%-14s", "early stop");
	if (!cJSON_IsObject(e)) {
		printf("(not an object)\n");
		return;
	}
	printf("%s (%s): ", str(e, "metric", "?"), str(e, "mode", "?"));
	const cJSON *best = cJSON_GetObjectItemCaseSensitive(e, "best");
	if (cJSON_IsNumber(best))
		printf("best %g at step %.0f", best->valuedouble, hpu__ckpt_num(e, "best_step", 0));
	else
		printf("no best yet");
	double wait = hpu__ckpt_num(e, "wait", 0);
	printf(", %.0f validation%s since\n", wait, wait == 1 ? "" : "s");
}

static void print_details(const hpu_ckpt *c)
{
	const cJSON *m = c->m;
	printf("%-14s%s\n", "checkpoint", c->dir);
	printf("%-14s%s\n", "model", str(m, "model", "(not recorded)"));
	printf("%-14s%ld (epoch %d, batch %.0f of the epoch; global batch %.0f)\n", "step",
	       c->step, (int)hpu__ckpt_num(m, "epoch", 0) + 1, hpu__ckpt_num(m, "batch_in_epoch", 0),
	       hpu__ckpt_num(m, "global_batch", 0));
	printf("%-14s%d\n", "world size", c->world);
	printf("%-14s%s\n", "strategy", c->strategy);
	printf("%-14s%s\n", "precision", c->precision);
	printf("%-14s%s (%.0f optimizer steps)\n", "optimizer", c->optimizer,
	       hpu__ckpt_num(m, "optimizer_steps", 0));
	printf("%-14s", "sections");
	for (int s = 0; s < c->nsections; s++)
		printf("%s%s", s ? ", " : "", c->sections[s]);
	printf("\n%-14s%d (%llu floats, %.1f MB in fp32)\n", "parameters", c->nparams,
	       (unsigned long long)c->numel, (double)c->numel * 4 / 1e6);
	int w = 0;
	char shape[SHOW_PARAMS][160];
	int ws = 0;
	for (int i = 0; i < c->nparams && i < SHOW_PARAMS; i++) {
		w = (int)strlen(c->params[i].name) > w ? (int)strlen(c->params[i].name) : w;
		shape_text(c->params[i].ndim, c->params[i].shape, shape[i], sizeof shape[i]);
		ws = (int)strlen(shape[i]) > ws ? (int)strlen(shape[i]) : ws;
	}
	for (int i = 0; i < c->nparams && i < SHOW_PARAMS; i++)
		printf("  %-*s  %-*s  %llu\n", w, c->params[i].name, ws, shape[i],
		       (unsigned long long)c->params[i].numel);
	if (c->nparams > SHOW_PARAMS)
		printf("  ... %d more\n", c->nparams - SHOW_PARAMS);
	print_buffers(c);
	printf("%-14s%d, %llu bytes (%.1f MB)\n", "files", total_files(c),
	       (unsigned long long)total_bytes(c), (double)total_bytes(c) / 1e6);
	for (int i = 0; i < c->nfiles; i++)
		printf("  %s  %llu bytes, %zu segments, %llu floats per section\n",
		       c->files[i].name, (unsigned long long)c->files[i].bytes, c->files[i].nseg,
		       (unsigned long long)c->files[i].elems);
	if (c->nbuffers)
		printf("  %s  %llu bytes, the buffers\n", c->buffer_file.name,
		       (unsigned long long)c->buffer_file.bytes);
	print_fields("scheduler", cJSON_GetObjectItemCaseSensitive(m, "scheduler"));
	print_fields("loss scaler", cJSON_GetObjectItemCaseSensitive(m, "loss_scaler"));
	const cJSON *fp8 = cJSON_GetObjectItemCaseSensitive(m, "fp8");
	if (cJSON_IsObject(fp8))
		printf("%-14s%d call sites (amax history %.0f, margin %g)\n", "fp8",
		       cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(fp8, "sites")),
		       hpu__ckpt_num(fp8, "amax_history_len", 0), hpu__ckpt_num(fp8, "margin", 0));
	print_validation(cJSON_GetObjectItemCaseSensitive(m, "validation"));
	print_keep(cJSON_GetObjectItemCaseSensitive(m, "keep"));
	print_early_stop(cJSON_GetObjectItemCaseSensitive(m, "early_stop"));
}

/* One line per checkpoint of a root, newest first. */
static void print_root(const root *r, const char *path)
{
	printf("checkpoint root %s: %d checkpoint%s, newest first (* = `latest`)\n", path, r->n,
	       r->n == 1 ? "" : "s");
	for (int i = 0; i < r->n; i++) {
		char dir[4400], err[1024];
		hpu_ckpt c;
		int mark = r->latest[0] && !strcmp(r->latest, r->names[i]);
		snprintf(dir, sizeof dir, "%s/%s", path, r->names[i]);
		if (hpu__ckpt_open(&c, dir, err, sizeof err) < 0)
			printf("%c %s  unreadable: %s\n", mark ? '*' : ' ', r->names[i], err);
		else
			printf("%c %s  step %ld, %d x %s, %s, %d file%s, %.1f MB\n", mark ? '*' : ' ',
			       r->names[i], c.step, c.world, c.strategy, c.precision,
			       total_files(&c), hpu__plural(total_files(&c)), (double)total_bytes(&c) / 1e6);
		hpu__ckpt_close(&c);
	}
	if (!r->latest[0])
		printf("(no `%s` file)\n", HPU_CKPT_LATEST);
	else if (!r->latest_ok)
		printf("warning: `%s` names \"%s\", which is not there\n", HPU_CKPT_LATEST,
		       r->latest);
	printf("\n");
}

static int cmd_info(int argc, char **argv)
{
	const char *pos[1];
	int npos;
	const char *vals[MAX_OPTS] = {0};
	int rc = parse_args("info", help_info, argc, argv, info_specs, vals, pos, 1, &npos);
	if (rc >= 0)
		return rc;
	if (npos != 1)
		return usage_error("info", "which checkpoint? (hpu-ckpt info DIR)");
	char dir[4400];
	if (!has_manifest(pos[0])) {
		root r;
		if ((rc = root_open(&r, pos[0])) != OK)
			return rc;
		print_root(&r, pos[0]);
		rc = root_pick(&r, pos[0]);
		snprintf(dir, sizeof dir, "%s/%s", pos[0], r.names[0]);
		root_close(&r);
		if (rc != OK)
			return rc;
	} else {
		snprintf(dir, sizeof dir, "%s", pos[0]);
	}
	hpu_ckpt c;
	if ((rc = open_ckpt(&c, dir)) != OK)
		return rc;
	print_details(&c);
	hpu__ckpt_close(&c);
	return OK;
}

/* ---- verify ---- */

/* Verifies the checkpoint at dir, printing; BAD if anything is wrong. */
static int verify_one(const char *dir)
{
	hpu_ckpt c;
	char err[1024];
	if (hpu__ckpt_open_owned(&c, dir, &TRUST, err, sizeof err) < 0) {
		printf("%s: DAMAGED: %s\n", dir, err);
		hpu__ckpt_close(&c);
		return BAD;
	}
	if (c.unsealed) {
		char note[4400];
		hpu__ckpt_unsealed_note(&c, note, sizeof note);
		printf("%s: warning: %s\n", dir, note);
	}
	int bad = verify_files(&c, 1, NULL, 0);
	hpu__ckpt_close(&c);
	return bad ? BAD : OK;
}

static int cmd_verify(int argc, char **argv)
{
	const char *pos[1];
	const char *vals[MAX_OPTS] = {0};
	int npos;
	int rc = parse_args("verify", help_verify, argc, argv, verify_specs, vals, pos, 1, &npos);
	if (rc >= 0)
		return rc;
	int all = vals[0] != NULL;
	if (npos != 1)
		return usage_error("verify", "which checkpoint? (hpu-ckpt verify DIR)");
	trust_for(pos[0]);
	if (has_manifest(pos[0])) {
		if (all)
			hpu__tool_note("%s is one checkpoint; --all is for a root", pos[0]);
		return verify_one(pos[0]);
	}
	root r;
	char err[1024];
	if ((rc = root_open(&r, pos[0])) != OK)
		return rc;
	/* `latest` of another uid: reported, and not followed */
	int bad = hpu__ckpt_check_latest(pos[0], &TRUST, err, sizeof err) < 0;
	if (bad)
		printf("BAD  %s\n", err);
	if (!all) {
		char dir[4400];
		if (bad)
			rc = BAD;
		else if ((rc = root_pick(&r, pos[0])) == OK) {
			snprintf(dir, sizeof dir, "%s/%s", pos[0], r.names[0]);
			rc = verify_one(dir);
		}
		root_close(&r);
		return rc;
	}
	for (int i = 0; i < r.n; i++) {
		char dir[4400];
		snprintf(dir, sizeof dir, "%s/%s", pos[0], r.names[i]);
		bad += verify_one(dir) != OK;
	}
	if (r.latest[0] && !r.latest_ok) {
		printf("%s/%s names \"%s\", which is not there\n", pos[0], HPU_CKPT_LATEST,
		       r.latest);
		bad++;
	}
	printf("%s: %d checkpoint%s, %s\n", pos[0], r.n, r.n == 1 ? "" : "s",
	       bad ? "DAMAGE FOUND" : "all intact");
	root_close(&r);
	return bad ? BAD : OK;
}

/* ---- copying floats ---- */

/* Canonical floats [start, start + count) of section s into w, CHUNK at
 * a time through buf. */
static int copy_range(hpu_ckpt *c, int s, uint64_t start, uint64_t count, float *buf,
		      hpu_ckpt_writer *w, char *err, size_t errlen)
{
	while (count) {
		uint64_t n = count < CHUNK ? count : CHUNK;
		if (hpu__ckpt_read(c, s, start, n, buf, err, errlen) < 0 ||
		    hpu__ckpt_writer_put(w, buf, (size_t)n * 4, err, errlen) < 0)
			return -1;
		start += n;
		count -= n;
	}
	return 0;
}

/* Floats [start, start + count) of the buffers file into w, CHUNK at a
 * time through buf. */
static int copy_buffers(hpu_ckpt *c, uint64_t start, uint64_t count, float *buf,
			hpu_ckpt_writer *w, char *err, size_t errlen)
{
	while (count) {
		uint64_t n = count < CHUNK ? count : CHUNK;
		if (hpu__ckpt_read_buffers(c, start, n, buf, err, errlen) < 0 ||
		    hpu__ckpt_writer_put(w, buf, (size_t)n * 4, err, errlen) < 0)
			return -1;
		start += n;
		count -= n;
	}
	return 0;
}

/* Opens the checkpoint DIR stands for and checks every file's digest;
 * `what` is said when refusing a damaged one. */
static int open_verified(hpu_ckpt *c, const char *arg, const char *what)
{
	char dir[4400], first[1024];
	trust_for(arg);
	int rc = resolve(arg, dir, sizeof dir);
	if (rc == OK && !has_manifest(arg) && hpu__ckpt_check_latest(arg, &TRUST, first, sizeof first) < 0)
		rc = fail("%s (refusing to %s it)", first, what);
	if (rc == OK)
		rc = open_ckpt(c, dir);
	if (rc != OK)
		return rc;
	note_unsealed(c);
	if (verify_files(c, 0, first, sizeof first)) {
		rc = fail("%s (refusing to %s a damaged checkpoint; hpu-ckpt verify %s lists every "
			  "file)",
			  first, what, c->dir);
		hpu__ckpt_close(c);
	}
	return rc;
}

/* ---- export ---- */

/* The safetensors file's first bytes (ckpt/safetensors.h): the length and
 * the JSON, padded with spaces to a multiple of 8 bytes so that the data
 * after it is aligned. The parameters' floats come first, then the
 * buffers'. NULL (said) on duplicate names or no memory. */
static char *safetensors_header(const hpu_ckpt *c, size_t *len)
{
	int n = c->nparams + c->nbuffers;
	const char **names = calloc((size_t)n + 1, sizeof *names);
	const int64_t **shapes = calloc((size_t)n + 1, sizeof *shapes);
	int *ndims = calloc((size_t)n + 1, sizeof *ndims);
	uint64_t *begins = calloc((size_t)n + 1, sizeof *begins);
	char step[64], err[1024], *out = NULL;
	snprintf(step, sizeof step, "%ld", c->step);
	const char *meta[] = {"format",    "pt",         "producer",  "hpu-ckpt export",
			      "model",     str(c->m, "model", ""),  "step", step,
			      "optimizer", c->optimizer, "precision", c->precision,
			      NULL};
	if (!names || !shapes || !ndims || !begins) {
		fail("out of memory");
		goto done;
	}
	for (int i = 0; i < c->nparams; i++) {
		const hpu_ckpt_param *p = &c->params[i];
		if (hpu__ckpt_param_find(c, p->name) != i || !strcmp(p->name, "__metadata__")) {
			fail("%s: parameter name \"%s\" appears twice (or is reserved); safetensors "
			     "needs unique names (use --format raw)",
			     c->dir, p->name);
			goto done;
		}
		names[i] = p->name;
		ndims[i] = p->ndim;
		shapes[i] = p->shape;
		begins[i] = p->offset * 4;
	}
	for (int i = 0; i < c->nbuffers; i++) {
		const hpu_ckpt_buffer *q = &c->buffers[i];
		if (hpu__ckpt_param_find(c, q->name) >= 0 || !strcmp(q->name, "__metadata__")) {
			fail("%s: buffer name \"%s\" is also a parameter's (or is reserved); "
			     "safetensors needs unique names (use --format raw)",
			     c->dir, q->name);
			goto done;
		}
		int k = c->nparams + i;
		names[k] = q->name;
		ndims[k] = q->ndim;
		shapes[k] = q->shape;
		begins[k] = (c->numel + q->offset) * 4;
	}
	if (!(out = hpu__st_header(n, names, ndims, shapes, begins, meta, len, err, sizeof err)))
		fail("%s: %s", c->dir, err);
done:
	free(names);
	free((void *)shapes);
	free(ndims);
	free(begins);
	return out;
}

static int cmd_export(int argc, char **argv)
{
	const char *pos[1], *vals[MAX_OPTS] = {0};
	int npos;
	int rc = parse_args("export", help_export, argc, argv, export_specs, vals, pos, 1, &npos);
	if (rc >= 0)
		return rc;
	const char *out = vals[0], *format = vals[1] ? vals[1] : "safetensors";
	if (npos != 1)
		return usage_error("export", "which checkpoint? (hpu-ckpt export DIR -o FILE)");
	if (!out || !*out)
		return usage_error("export", "where to? (-o FILE)");
	int st = !strcmp(format, "safetensors");
	if (!st && strcmp(format, "raw"))
		return usage_error("export", "--format is safetensors or raw, not '%s'", format);
	hpu_ckpt c;
	if ((rc = open_verified(&c, pos[0], "export")) != OK)
		return rc;
	char err[1024], *header = NULL;
	size_t hlen = 0;
	float *buf = malloc((size_t)CHUNK * sizeof *buf);
	hpu_ckpt_writer w;
	int section = hpu__ckpt_section(&c, "params");
	rc = BAD;
	if (!buf) {
		fail("out of memory");
		goto done;
	}
	if (st && !(header = safetensors_header(&c, &hlen)))
		goto done;
	if (hpu__ckpt_writer_open(&w, out, err, sizeof err) < 0) {
		fail("%s", err);
		goto done;
	}
	/* raw is --save-params' format: the parameters alone */
	uint64_t nbuf = st ? c.buffer_numel : 0;
	if ((header && hpu__ckpt_writer_put(&w, header, hlen, err, sizeof err) < 0) ||
	    copy_range(&c, section, 0, c.numel, buf, &w, err, sizeof err) < 0 ||
	    copy_buffers(&c, 0, nbuf, buf, &w, err, sizeof err) < 0 ||
	    hpu__ckpt_writer_commit(&w, NULL, err, sizeof err) < 0) {
		hpu__ckpt_writer_abort(&w);
		fail("exporting %s to %s: %s", c.dir, out, err);
		goto done;
	}
	char extra[160] = "";
	if (c.nbuffers && st)
		snprintf(extra, sizeof extra, " and %d buffer%s, %llu floats,", c.nbuffers,
			 hpu__plural(c.nbuffers),
			 (unsigned long long)c.buffer_numel);
	printf("exported %s (step %ld): %d parameter%s, %llu floats,%s to %s (%s, %llu bytes)\n",
	       c.dir, c.step, c.nparams, hpu__plural(c.nparams), (unsigned long long)c.numel, extra, out, format,
	       (unsigned long long)((c.numel + nbuf) * 4 + hlen));
	if (c.nbuffers && !st)
		hpu__tool_note("raw holds the parameters only; the checkpoint's %d "
			       "buffers are not in %s (they are in %s/%s; --format safetensors "
			       "exports them too)",
			       c.nbuffers, out, c.dir, c.buffer_file.name);
	rc = OK;
done:
	free(header);
	free(buf);
	hpu__ckpt_close(&c);
	return rc;
}

/* ---- reshard ---- */

static int known_strategy(const char *s)
{
	for (int k = HPU_STRATEGY_FAST_DDP; k <= HPU_STRATEGY_ZERO3; k++)
		if (!strcmp(s, hpu__strategy_name((hpu_strategy)k)))
			return 1;
	return 0;
}

/* Shard r of M: canonical floats [lo, hi), floor(numel * r / M) on. */
static void slice(uint64_t numel, int r, int m, uint64_t *lo, uint64_t *hi)
{
	uint64_t q = numel / (uint64_t)m, rem = numel % (uint64_t)m;
	*lo = q * (uint64_t)r + rem * (uint64_t)r / (uint64_t)m;
	*hi = q * (uint64_t)(r + 1) + rem * (uint64_t)(r + 1) / (uint64_t)m;
}

/* Writes shard r of m into dir, filling f (name, bytes, sha256, one
 * segment in seg). */
static int write_shard(hpu_ckpt *c, const char *dir, int r, int m, float *buf, hpu_ckpt_file *f,
		       hpu_ckpt_seg *seg, char *err, size_t errlen)
{
	char path[4600];
	uint64_t lo, hi;
	slice(c->numel, r, m, &lo, &hi);
	memset(f, 0, sizeof *f);
	hpu__ckpt_shard_name(r, m, f->name, sizeof f->name);
	seg->start = lo;
	seg->count = hi - lo;
	f->seg = seg;
	f->nseg = 1;
	f->elems = hi - lo;
	snprintf(path, sizeof path, "%s/%s", dir, f->name);
	hpu_ckpt_writer w;
	if (hpu__ckpt_writer_open(&w, path, err, errlen) < 0)
		return -1;
	for (int s = 0; s < c->nsections; s++)
		if (copy_range(c, s, lo, hi - lo, buf, &w, err, errlen) < 0) {
			hpu__ckpt_writer_abort(&w);
			return -1;
		}
	f->bytes = w.bytes;
	if (hpu__ckpt_writer_commit(&w, f->sha256, err, errlen) < 0) {
		hpu__ckpt_writer_abort(&w);
		return -1;
	}
	return 0;
}

/* The buffers file of c, copied into dir under its name. Its digest must
 * come out as the manifest's (which the copy's manifest keeps): SRC was
 * verified, so a difference is a change since, said. */
static int copy_buffers_file(hpu_ckpt *c, const char *dir, float *buf, char *err, size_t errlen)
{
	char path[4600], sha[65];
	snprintf(path, sizeof path, "%s/%s", dir, c->buffer_file.name);
	hpu_ckpt_writer w;
	if (hpu__ckpt_writer_open(&w, path, err, errlen) < 0)
		return -1;
	if (copy_buffers(c, 0, c->buffer_numel, buf, &w, err, errlen) < 0 ||
	    hpu__ckpt_writer_commit(&w, sha, err, errlen) < 0) {
		hpu__ckpt_writer_abort(&w);
		return -1;
	}
	if (strcmp(sha, c->buffer_file.sha256) != 0)
		return hpu__say(err, errlen,
				    "%s/%s changed while it was copied (SHA-256 %s, the manifest "
				    "says %s)",
				    c->dir, c->buffer_file.name, sha, c->buffer_file.sha256);
	return 0;
}

/* SRC's manifest with world_size, strategy and files replaced (its
 * "buffers" kept: the file is copied as it is). */
static char *reshard_manifest(const hpu_ckpt *c, int m, const char *strategy,
			      const hpu_ckpt_file *files)
{
	cJSON *j = cJSON_Duplicate(c->m, 1), *arr = cJSON_CreateArray();
	if (!j || !arr) {
		cJSON_Delete(j);
		cJSON_Delete(arr);
		return NULL;
	}
	cJSON_ReplaceItemInObjectCaseSensitive(j, "world_size", cJSON_CreateNumber(m));
	if (strategy)
		cJSON_ReplaceItemInObjectCaseSensitive(j, "strategy", cJSON_CreateString(strategy));
	for (int r = 0; r < m; r++)
		cJSON_AddItemToArray(arr, hpu__ckpt_file_json(&files[r]));
	cJSON_ReplaceItemInObjectCaseSensitive(j, "files", arr);
	char *text = hpu__ckpt_manifest_text(j); /* sealed again: its content changed */
	cJSON_Delete(j);
	return text;
}

/* The directory a path is in ("." for a bare name). */
static void parent_of(const char *path, char *out, size_t n)
{
	snprintf(out, n, "%s", path);
	size_t len = strlen(out);
	while (len > 1 && out[len - 1] == '/')
		out[--len] = '\0';
	char *slash = strrchr(out, '/');
	if (!slash)
		snprintf(out, n, ".");
	else if (slash == out)
		out[1] = '\0';
	else
		*slash = '\0';
}

static int cmd_reshard(int argc, char **argv)
{
	const char *pos[2], *vals[MAX_OPTS] = {0};
	int npos, m = 0;
	int rc = parse_args("reshard", help_reshard, argc, argv, reshard_specs, vals, pos, 2, &npos);
	if (rc >= 0)
		return rc;
	const char *world_s = vals[0], *strategy = vals[1];
	if (npos != 2)
		return usage_error("reshard", "needs SRC and DST (hpu-ckpt reshard SRC DST --world M)");
	if (!world_s)
		return usage_error("reshard", "how many shards? (--world M)");
	if (hpu__parse_int(world_s, 1, MAX_WORLD, &m))
		return usage_error("reshard", "--world must be 1 to %d, not '%s'", MAX_WORLD, world_s);
	if (strategy && !known_strategy(strategy))
		return usage_error("reshard",
				   "--strategy is fast_ddp, ddp, zero1, zero2 or zero3, not '%s'",
				   strategy);
	char dst[4096], partial[4200], parent[4200], err[1024];
	struct stat sb;
	snprintf(dst, sizeof dst, "%s", pos[1]);
	for (size_t n = strlen(dst); n > 1 && dst[n - 1] == '/'; n--)
		dst[n - 1] = '\0'; /* "out/" names "out", not a file in it */
	snprintf(partial, sizeof partial, "%s.partial", dst);
	parent_of(dst, parent, sizeof parent);
	if (lstat(dst, &sb) == 0)
		return fail("%s already exists; reshard writes a new directory", dst);
	if (lstat(partial, &sb) == 0)
		return fail("%s exists (left by an interrupted reshard?); remove it first", partial);
	if (!is_dir(parent))
		return fail("cannot write %s: directory %s does not exist", dst, parent);
	hpu_ckpt c;
	if ((rc = open_verified(&c, pos[0], "reshard")) != OK)
		return rc;
	rc = BAD;
	float *buf = malloc((size_t)CHUNK * sizeof *buf);
	hpu_ckpt_file *files = calloc((size_t)m, sizeof *files);
	hpu_ckpt_seg *segs = calloc((size_t)m, sizeof *segs);
	char *text = NULL, mpath[4400];
	int made = 0;
	if (!buf || !files || !segs) {
		fail("out of memory");
		goto done;
	}
	if ((uint64_t)m > c.numel) {
		fail("%s holds %llu floats: too few for %d shards", c.dir,
		     (unsigned long long)c.numel, m);
		goto done;
	}
	if (mkdir(partial, 0755) < 0) {
		fail("cannot make directory %s: %s", partial, strerror(errno));
		goto done;
	}
	made = 1;
	for (int r = 0; r < m; r++)
		if (write_shard(&c, partial, r, m, buf, &files[r], &segs[r], err, sizeof err) < 0) {
			fail("resharding %s: %s", c.dir, err);
			goto done;
		}
	if (c.nbuffers && copy_buffers_file(&c, partial, buf, err, sizeof err) < 0) {
		fail("resharding %s: %s", c.dir, err);
		goto done;
	}
	if (!(text = reshard_manifest(&c, m, strategy, files))) {
		fail("out of memory");
		goto done;
	}
	snprintf(mpath, sizeof mpath, "%s/%s", partial, HPU_CKPT_MANIFEST);
	if (hpu__write_atomic(mpath, text, strlen(text), err, sizeof err) < 0 ||
	    hpu__fsync_dir(partial, err, sizeof err) < 0) {
		fail("%s", err);
		goto done;
	}
	if (rename(partial, dst) < 0) {
		fail("cannot rename %s to %s: %s", partial, dst, strerror(errno));
		goto done;
	}
	made = 0;
	if (hpu__fsync_dir(parent, err, sizeof err) < 0) {
		fail("%s", err);
		goto done;
	}
	uint64_t bytes = c.nbuffers ? c.buffer_file.bytes : 0;
	for (int r = 0; r < m; r++)
		bytes += files[r].bytes;
	printf("resharded %s (step %ld, %d x %s) into %s: %d shard%s for %d x %s%s, %llu bytes\n",
	       c.dir, c.step, c.world, c.strategy, dst, m, hpu__plural(m), m, strategy ? strategy : c.strategy,
	       c.nbuffers ? " and the buffers" : "", (unsigned long long)bytes);
	rc = OK;
done:
	if (made)
		hpu__ckpt_rmtree(partial);
	free(text);
	free(segs);
	free(files);
	free(buf);
	hpu__ckpt_close(&c);
	return rc;
}

/* What the command printed must have reached standard output (a full
 * disk, say, would leave it short): rc, or BAD after saying so. */
static int stdout_checked(int rc)
{
	if (fflush(stdout) == 0 && !ferror(stdout))
		return rc;
	fail("cannot write the standard output: %s", strerror(errno));
	return rc == OK ? BAD : rc;
}

static const struct command {
	const char *name;
	int (*fn)(int, char **);
	const hpu_optspec *specs;
	const char *synopsis; /* the heading of its options in the manual */
} cmds[] = {{"info", cmd_info, info_specs, "hpu-ckpt info DIR"},
	    {"verify", cmd_verify, verify_specs, "hpu-ckpt verify DIR [--all]"},
	    {"export", cmd_export, export_specs, "hpu-ckpt export DIR -o FILE [--format safetensors|raw]"},
	    {"reshard", cmd_reshard, reshard_specs, "hpu-ckpt reshard SRC DST --world M [--strategy S]"}};
#define NCMDS (sizeof cmds / sizeof cmds[0])

/* hpu-ckpt --help-doc FORMAT: every command's options, under its
 * synopsis (man/hpu-ckpt.1, docs/reference/hpu-ckpt.md). */
static int help_doc(const char *format)
{
	int how = hpu__optdoc_format(format);
	if (how < 0)
		return usage_error(NULL, "--help-doc takes help, scdoc or markdown, not '%s'",
				   format ? format : "");
	for (size_t i = 0; i < NCMDS; i++) {
		hpu__optdoc_heading(stdout, cmds[i].synopsis, how);
		hpu__optdoc(stdout, cmds[i].specs, how, 21);
	}
	return OK;
}

int main(int argc, char **argv)
{
	if (hpu__tool_start("hpu-ckpt") < 0)
		return HPU_TOOL_USAGE;
	if (argc < 2)
		return usage_error(NULL, "which command? (info, verify, export, reshard)");
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		fputs(help_main, stdout);
		return stdout_checked(OK);
	}
	if (!strcmp(argv[1], "--help-doc"))
		return stdout_checked(help_doc(argc > 2 ? argv[2] : NULL));
	for (size_t i = 0; i < NCMDS; i++)
		if (!strcmp(argv[1], cmds[i].name))
			return stdout_checked(cmds[i].fn(argc - 1, argv + 1));
	return usage_error(NULL, "unknown command '%s' (info, verify, export, reshard)", argv[1]);
}
