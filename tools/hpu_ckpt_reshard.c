/* hpu-ckpt reshard: the same checkpoint written again as M shards. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "options/config.h"
#include "common/fileio.h"
#include "common/num.h"
#include "common/opt.h"
#include "tools/hpu_ckpt_impl.h"
#include "tools/tool.h"

static const char *const help_reshard =
	"usage: hpu-ckpt reshard SRC DST --world M [--strategy S]\n"
	"\n"
	"Writes checkpoint SRC again as DST with M shard files, each an equal\n"
	"contiguous slice of the parameters and their optimizer state, so that\n"
	"M workers each read one file; the buffers file, whole on every rank\n"
	"whatever the world size, is copied as it is. DST must not exist, nor be\n"
	"named step-N for another step than SRC's, nor lie in a checkpoint's\n"
	"directory; it is written as DST.partial and renamed when complete (a\n"
	"signal removes DST.partial). The manifest is SRC's with world_size M\n"
	"(and strategy S, one of fast_ddp, ddp, zero1, zero2, zero3, if given),\n"
	"and resharded_from: the world size and strategy that saved it.\n"
	"SRC's files are verified first. Resume from it with hpulaunch\n"
	"--resume DST (any world size and strategy reads it).\n";

const hpu_optspec hpu__ckt_reshard_specs[] = {
	{"world", 0, HPU_OPT_VALUE, OPT_VAL, "M", .help = "the number of shards to write (required; 1..99999)"},
	{"strategy", 0, HPU_OPT_VALUE, OPT_VAL + 1, "S",
	 .help = "the strategy the manifest names: fast_ddp, ddp, zero1, zero2 or zero3, or "
		 "Lightning's hpu_parallel (ddp), deepspeed_stage_1, _2, _3 (SRC's)"},
	COMMON_OPTS, {0}};

static int is_dir(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
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
		if (hpu__ckt_copy_range(c, s, lo, hi - lo, buf, &w, err, errlen) < 0) {
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
	if (hpu__ckt_copy_buffers(c, 0, c->buffer_numel, buf, &w, err, errlen) < 0 ||
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
 * "buffers" kept: the file is copied as it is; "placement" dropped with
 * another strategy). */
static char *reshard_manifest(const hpu_ckpt *c, int m, const char *strategy,
			      const hpu_ckpt_file *files)
{
	cJSON *j = cJSON_Duplicate(c->m, 1), *arr = cJSON_CreateArray();
	if (!j || !arr) {
		cJSON_Delete(j);
		cJSON_Delete(arr);
		return NULL;
	}
	/* where it came from, for a resume to say (the first reshard's
	 * source, where SRC is a reshard itself) */
	if (!cJSON_GetObjectItemCaseSensitive(j, "resharded_from")) {
		cJSON *from = cJSON_CreateObject();
		cJSON_AddNumberToObject(from, "world_size", c->world);
		cJSON_AddStringToObject(from, "strategy", c->strategy);
		cJSON_AddItemToObject(j, "resharded_from", from);
	}
	cJSON_ReplaceItemInObjectCaseSensitive(j, "world_size", cJSON_CreateNumber(m));
	/* "placement" is the saving run's plan, for its strategy: another
	 * strategy's cannot be made here (the strategy engine's, with the
	 * run's options); resume does not read it, the next save writes it */
	if (strategy && strcmp(strategy, c->strategy) != 0) {
		cJSON_ReplaceItemInObjectCaseSensitive(j, "strategy", cJSON_CreateString(strategy));
		cJSON_DeleteItemFromObjectCaseSensitive(j, "placement");
	}
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

int hpu__ckt_reshard(int argc, char **argv)
{
	const char *pos[2], *vals[MAX_OPTS] = {0};
	int npos, m = 0;
	int rc = hpu__ckt_parse_args("reshard", help_reshard, argc, argv, hpu__ckt_reshard_specs, vals, pos, 2, &npos);
	if (rc >= 0)
		return rc;
	const char *world_s = vals[0], *strategy = vals[1];
	if (npos != 2)
		return usage_error("reshard", "needs SRC and DST (hpu-ckpt reshard SRC DST --world M)");
	if (!world_s)
		return usage_error("reshard", "how many shards? (--world M)");
	if (hpu__parse_int(world_s, 1, MAX_WORLD, &m))
		return usage_error("reshard", "--world must be 1 to %d, not '%s'", MAX_WORLD, world_s);
	if (strategy && hpu__strategy_of(strategy) < 0)
		return usage_error("reshard",
				   "--strategy is fast_ddp, ddp, zero1, zero2 or zero3 (or Lightning's "
				   "hpu_parallel, deepspeed_stage_1, _2, _3), not '%s'",
				   strategy);
	if (strategy) /* the manifest names it as hpulaunch does */
		strategy = hpu__strategy_name((hpu_strategy)hpu__strategy_of(strategy));
	char dst[4096], partial[4200], parent[4200], err[1024], mpath[4400];
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
	snprintf(mpath, sizeof mpath, "%s/%s", parent, HPU_CKPT_MANIFEST);
	if (access(mpath, F_OK) == 0)
		return usage_error("reshard", "%s: %s is a checkpoint's directory (it holds %s): a "
				   "checkpoint inside it would be no checkpoint of its root; write "
				   "it elsewhere",
				   dst, parent, HPU_CKPT_MANIFEST);
	hpu_ckpt c;
	if ((rc = hpu__ckt_open_verified(&c, pos[0], "reshard")) != OK)
		return rc;
	/* resume refuses a step-N directory holding another step */
	if (hpu__ckpt_check_named_step(&c, dst, err, sizeof err) < 0) {
		long step = c.step; /* the close clears c */
		hpu__ckpt_close(&c);
		return usage_error("reshard", "%s; name DST for step %ld (or not step-N)", err, step);
	}
	rc = BAD;
	float *buf = malloc((size_t)CHUNK * sizeof *buf);
	hpu_ckpt_file *files = calloc((size_t)m, sizeof *files);
	hpu_ckpt_seg *segs = calloc((size_t)m, sizeof *segs);
	char *text = NULL;
	int made = 0, guard = -1;
	if (!buf || !files || !segs) {
		fail("out of memory");
		goto done;
	}
	if ((uint64_t)m > c.numel) {
		fail("%s holds %llu floats: too few for %d shards", c.dir,
		     (unsigned long long)c.numel, m);
		goto done;
	}
	hpu__tool_guard_hold(1); /* a signal removes DST.partial and its files */
	if (mkdir(partial, 0755) < 0) {
		hpu__tool_guard_hold(0);
		fail("cannot make directory %s: %s", partial, strerror(errno));
		goto done;
	}
	made = 1;
	guard = hpu__tool_guard_add(HPU_GUARD_TREE, partial, 0);
	hpu__tool_guard_hold(0);
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
	hpu__tool_guard_hold(1);
	if (rename(partial, dst) < 0) {
		hpu__tool_guard_hold(0);
		fail("cannot rename %s to %s: %s", partial, dst, strerror(errno));
		goto done;
	}
	made = 0;
	hpu__tool_guard_drop(&guard); /* DST now: no longer the handler's */
	hpu__tool_guard_hold(0);
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
	hpu__tool_guard_drop(&guard);
	free(text);
	free(segs);
	free(files);
	free(buf);
	hpu__ckpt_close(&c);
	return rc;
}
