/* hpu-ckpt info: what a checkpoint (or a root) holds. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt.h"
#include "common/num.h"
#include "common/opt.h"
#include "common/shapetext.h"
#include "tools/hpu_ckpt_impl.h"
#include "tools/tool.h"

static const char *const help_info =
	"usage: hpu-ckpt info DIR\n"
	"\n"
	"Prints what a checkpoint holds: model, step, epoch and batch, world size,\n"
	"strategy, precision, optimizer, sections, parameters (name and shape),\n"
	"buffers (name, shape, sync), files and bytes, scheduler, loss scaler,\n"
	"fp8 state, the last validation (--eval-every), what --keep-last and\n"
	"--keep-best kept, and --early-stop's count. For a checkpoint root,\n"
	"first lists every checkpoint in it, newest first, marking the one\n"
	"`latest` names with '*', then shows that one; exits 1 when one it lists\n"
	"is unreadable or damaged (its manifest, or a file of another size than\n"
	"the manifest's: hpu-ckpt verify reads the contents).\n";

const hpu_optspec hpu__ckt_info_specs[] = {COMMON_OPTS, {0}};

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
		/* the loss scaler's last overflow is DeepSpeed's iteration, from
		 * 0: said as the step the log named too, from 1 */
		if (cJSON_IsNumber(f) && !strcmp(f->string, "last_overflow") &&
		    !strcmp(label, "loss scaler"))
			printf(f->valuedouble >= 0 ? "%slast_overflow %g (step %g)"
						   : "%slast_overflow %g (none)",
			       first ? "" : ", ", f->valuedouble, f->valuedouble + 1);
		else if (cJSON_IsNumber(f))
			printf("%s%s %g", first ? "" : ", ", f->string, f->valuedouble);
		else if (cJSON_IsString(f))
			printf("%s%s %s", first ? "" : ", ", f->string, f->valuestring);
		else if (cJSON_IsBool(f))
			printf("%s%s %s", first ? "" : ", ", f->string, cJSON_IsTrue(f) ? "true" : "false");
		else
			continue;
		first = 0;
	}
	printf("\n");
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
		hpu__shape_text(shape[i], sizeof shape[i], c->buffers[i].ndim, c->buffers[i].shape);
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
		       hpu__ckt_str(k, "metric", "?"), hpu__ckt_str(k, "mode", "?"));
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
	printf("%s (%s): ", hpu__ckt_str(e, "metric", "?"), hpu__ckt_str(e, "mode", "?"));
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
	printf("%-14s%s\n", "model", hpu__ckt_str(m, "model", "(not recorded)"));
	printf("%-14s%ld (epoch %d, batch %.0f of the epoch; global batch %.0f)\n", "step",
	       c->step, (int)hpu__ckpt_num(m, "epoch", 0) + 1, hpu__ckpt_num(m, "batch_in_epoch", 0),
	       hpu__ckpt_num(m, "global_batch", 0));
	printf("%-14s%d\n", "world size", c->world);
	printf("%-14s%s\n", "strategy", c->strategy);
	const cJSON *rf = cJSON_GetObjectItemCaseSensitive(m, "resharded_from");
	const cJSON *rfs = cJSON_GetObjectItemCaseSensitive(rf, "strategy");
	if (cJSON_IsObject(rf) && cJSON_IsString(rfs))
		printf("%-14sby hpu-ckpt reshard, from %.0f workers under %s\n", "resharded",
		       hpu__ckpt_num(rf, "world_size", 0), rfs->valuestring);
	printf("%-14s%s\n", "precision", c->precision);
	printf("%-14s%s (%.0f optimizer steps)\n", "optimizer", c->optimizer,
	       hpu__ckpt_num(m, "optimizer_steps", 0));
	const cJSON *os = cJSON_GetObjectItemCaseSensitive(m, "optimizer_settings");
	if (cJSON_IsObject(os)) /* the line under it (not recorded before) */
		print_fields("", os);
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
		hpu__shape_text(shape[i], sizeof shape[i], c->params[i].ndim, c->params[i].shape);
		ws = (int)strlen(shape[i]) > ws ? (int)strlen(shape[i]) : ws;
	}
	for (int i = 0; i < c->nparams && i < SHOW_PARAMS; i++)
		printf("  %-*s  %-*s  %llu\n", w, c->params[i].name, ws, shape[i],
		       (unsigned long long)c->params[i].numel);
	if (c->nparams > SHOW_PARAMS)
		printf("  ... %d more\n", c->nparams - SHOW_PARAMS);
	print_buffers(c);
	printf("%-14s%d, %llu bytes (%.1f MB)\n", "files", hpu__ckt_total_files(c),
	       (unsigned long long)hpu__ckt_total_bytes(c), (double)hpu__ckt_total_bytes(c) / 1e6);
	for (int i = 0; i < c->nfiles; i++)
		printf("  %s  %llu bytes, %zu segment%s, %llu floats per section\n",
		       c->files[i].name, (unsigned long long)c->files[i].bytes, c->files[i].nseg,
		       hpu__plural((long long)c->files[i].nseg),
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

/* A file of checkpoint dir whose size is not the manifest's, said in
 * err; 0 when all are as listed (a truncated shard passed info). The
 * contents are verify's to check. */
static int sizes_differ(const hpu_ckpt *c, const char *dir, char *err, size_t n)
{
	for (int i = 0; i <= c->nfiles; i++) {
		const hpu_ckpt_file *f = i < c->nfiles ? &c->files[i] : &c->buffer_file;
		if (!f->name[0])
			continue;
		char p[4600];
		struct stat st;
		snprintf(p, sizeof p, "%s/%s", dir, f->name);
		if (stat(p, &st) < 0) {
			snprintf(err, n, "%s: %s", f->name, strerror(errno));
			return -1;
		}
		if ((uint64_t)st.st_size != f->bytes) {
			snprintf(err, n, "%s is %llu bytes, the manifest says %llu (hpu-ckpt verify "
				 "checks the contents)",
				 f->name, (unsigned long long)st.st_size, (unsigned long long)f->bytes);
			return -1;
		}
	}
	return 0;
}

/* One line per checkpoint of a root, newest first; returns how many are
 * unreadable or damaged. */
static int print_root(const root *r, const char *path)
{
	int bad = 0;
	printf("checkpoint root %s: %d checkpoint%s, newest first (* = `latest`)\n", path, r->n,
	       r->n == 1 ? "" : "s");
	for (int i = 0; i < r->n; i++) {
		char dir[4400], err[1024];
		hpu_ckpt c;
		int mark = r->latest[0] && !strcmp(r->latest, r->names[i]);
		snprintf(dir, sizeof dir, "%s/%s", path, r->names[i]);
		if (hpu__ckpt_open(&c, dir, err, sizeof err) < 0)
			bad++, printf("%c %s  unreadable: %s\n", mark ? '*' : ' ', r->names[i], err);
		else if (hpu__ckpt_check_named_step(&c, dir, err, sizeof err) < 0 ||
			 sizes_differ(&c, dir, err, sizeof err) < 0)
			bad++, printf("%c %s  DAMAGED: %s\n", mark ? '*' : ' ', r->names[i], err);
		else
			printf("%c %s  step %ld, %d x %s, %s, %d file%s, %.1f MB\n", mark ? '*' : ' ',
			       r->names[i], c.step, c.world, c.strategy, c.precision,
			       hpu__ckt_total_files(&c), hpu__plural(hpu__ckt_total_files(&c)), (double)hpu__ckt_total_bytes(&c) / 1e6);
		hpu__ckpt_close(&c);
	}
	if (r->latest_empty)
		printf("(`%s` is empty)\n", HPU_CKPT_LATEST);
	else if (!r->latest[0])
		printf("(no `%s` file)\n", HPU_CKPT_LATEST);
	else if (!r->latest_ok)
		printf("warning: `%s` names \"%s\", which is not there\n", HPU_CKPT_LATEST,
		       r->latest);
	printf("\n");
	return bad;
}

int hpu__ckt_info(int argc, char **argv)
{
	const char *pos[1];
	int npos;
	const char *vals[MAX_OPTS] = {0};
	int rc = hpu__ckt_parse_args("info", help_info, argc, argv, hpu__ckt_info_specs, vals, pos, 1, &npos);
	if (rc >= 0)
		return rc;
	if (npos != 1)
		return usage_error("info", "which checkpoint? (hpu-ckpt info DIR)");
	char dir[4400];
	int bad = 0;
	if (!hpu__ckt_has_manifest(pos[0])) {
		root r;
		if ((rc = hpu__ckt_root_open(&r, pos[0])) != OK)
			return rc;
		bad = print_root(&r, pos[0]);
		rc = hpu__ckt_root_pick(&r, pos[0]);
		snprintf(dir, sizeof dir, "%s/%s", pos[0], r.names[0]);
		hpu__ckt_root_close(&r);
		if (rc != OK)
			return rc;
	} else {
		snprintf(dir, sizeof dir, "%s", pos[0]);
	}
	hpu_ckpt c;
	if ((rc = hpu__ckt_open(&c, dir)) != OK)
		return rc;
	print_details(&c);
	hpu__ckpt_close(&c);
	if (bad) {
		fprintf(stderr, "hpu-ckpt info: %d checkpoint%s of %s %s unreadable or damaged (listed above); "
				"`hpu-ckpt verify --all %s` checks every one\n",
			bad, hpu__plural(bad), pos[0], bad == 1 ? "is" : "are", pos[0]);
		return BAD;
	}
	return OK;
}
