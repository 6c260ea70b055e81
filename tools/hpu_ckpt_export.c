/* hpu-ckpt export: the fp32 weights as one file (safetensors or raw). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt/safetensors.h"
#include "common/fileio.h"
#include "common/num.h"
#include "common/opt.h"
#include "tools/hpu_ckpt_impl.h"
#include "tools/tool.h"

static const char *const help_export =
	"usage: hpu-ckpt export DIR -o FILE [--format safetensors|raw]\n"
	"\n"
	"Writes the checkpoint's fp32 weights (the \"params\" section) to FILE,\n"
	"atomically (a device or a pipe, such as /dev/stdout, in place), after\n"
	"checking every file's SHA-256 (FILE standard output: the report goes\n"
	"to stderr):\n"
	"  safetensors  (default) one F32 tensor per parameter, then one per\n"
	"               buffer (batch norm's running statistics, ...), named as\n"
	"               in the model, as a state_dict has them; loads with\n"
	"               safetensors.torch.load_file\n"
	"  raw          every parameter's floats in declaration order, exactly\n"
	"               what --save-params writes (for --load-params); no\n"
	"               buffers (they stay in the checkpoint's buffers file)\n";

const hpu_optspec hpu__ckt_export_specs[] = {
	{"output", 'o', HPU_OPT_VALUE, OPT_VAL, "FILE", .help = "the file to write (required; - is standard output)"},
	{"format", 0, HPU_OPT_VALUE, OPT_VAL + 1, "FORMAT",
	 .help = "safetensors (default): one F32 tensor per parameter, then one per buffer; "
		 "raw: every parameter's floats in declaration order, as --save-params writes"},
	COMMON_OPTS, {0}};

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
			      "model",     hpu__ckt_str(c->m, "model", ""),  "step", step,
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

/* An output in a checkpoint's directory (one holding a manifest: the
 * exported one's or another's) or onto its root's `latest` would replace
 * or add to a checkpoint's files: a reason into why, else 0. */
static int in_ckpt_dir(const char *path, char *why, size_t n)
{
	char parent[4200], probe[4400];
	hpu__dir_part(path, parent, sizeof parent);
	snprintf(probe, sizeof probe, "%s/%s", parent, HPU_CKPT_MANIFEST);
	if (access(probe, F_OK) == 0)
		return snprintf(why, n, "%s is a checkpoint's directory (it holds %s): the export "
			       "would replace or add to its files; write it elsewhere",
			       parent, HPU_CKPT_MANIFEST);
	return 0;
}

/* ... also through a symbolic link: the file written is where the link
 * leads (hpu__out_in_place; a link to a checkpoint's manifest or shard
 * had it replaced) */
static int clobbers(const hpu_ckpt *c, const char *out, char *why, size_t n)
{
	char real[4200], probe[4400];
	if (in_ckpt_dir(out, why, n) ||
	    (!hpu__out_in_place(out, real, sizeof real) && strcmp(real, out) &&
	     in_ckpt_dir(real, why, n)))
		return 1;
	snprintf(probe, sizeof probe, "%s/../%s", c->dir, HPU_CKPT_LATEST);
	if (hpu__same_file(out, probe))
		return snprintf(why, n, "%s is the checkpoint root's %s; write it elsewhere", out,
				HPU_CKPT_LATEST);
	return 0;
}

int hpu__ckt_export(int argc, char **argv)
{
	const char *pos[1], *vals[MAX_OPTS] = {0};
	int npos;
	int rc = hpu__ckt_parse_args("export", help_export, argc, argv, hpu__ckt_export_specs, vals, pos, 1, &npos);
	if (rc >= 0)
		return rc;
	const char *out = vals[0], *format = vals[1] ? vals[1] : "safetensors";
	if (out && !strcmp(out, "-")) /* standard output (it wrote a file named -) */
		out = "/dev/stdout";
	if (npos != 1)
		return usage_error("export", "which checkpoint? (hpu-ckpt export DIR -o FILE)");
	if (!out || !*out)
		return usage_error("export", "where to? (-o FILE)");
	int st = !strcmp(format, "safetensors");
	if (!st && strcmp(format, "raw"))
		return usage_error("export", "--format is safetensors or raw, not '%s'", format);
	hpu_ckpt c;
	if ((rc = hpu__ckt_open_verified(&c, pos[0], "export")) != OK)
		return rc;
	char err[1024], *header = NULL;
	if (clobbers(&c, out, err, sizeof err)) {
		hpu__ckpt_close(&c);
		return usage_error("export", "-o %s: %s", out, err);
	}
	size_t hlen = 0;
	int guard = -1;
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
	/* the export on standard output: the report after it would corrupt
	 * it (or, stdout a file renamed over, be lost) */
	FILE *report = hpu__tool_out_is_stdout(out) ? stderr : stdout;
	hpu__tool_guard_hold(1); /* a signal removes OUT.tmp.PID */
	if (hpu__ckpt_writer_open(&w, out, err, sizeof err) < 0) {
		hpu__tool_guard_hold(0);
		fail("%s", err);
		goto done;
	}
	if (!w.out.direct)
		guard = hpu__tool_guard_add(HPU_GUARD_FILE, w.out.tmp, 0);
	hpu__tool_guard_hold(0);
	/* raw is --save-params' format: the parameters alone */
	uint64_t nbuf = st ? c.buffer_numel : 0;
	if ((header && hpu__ckpt_writer_put(&w, header, hlen, err, sizeof err) < 0) ||
	    hpu__ckt_copy_range(&c, section, 0, c.numel, buf, &w, err, sizeof err) < 0 ||
	    hpu__ckt_copy_buffers(&c, 0, nbuf, buf, &w, err, sizeof err) < 0 ||
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
	fprintf(report, "exported %s (step %ld): %d parameter%s, %llu floats,%s to %s (%s, %llu bytes)\n",
	       c.dir, c.step, c.nparams, hpu__plural(c.nparams), (unsigned long long)c.numel, extra, out, format,
	       (unsigned long long)((c.numel + nbuf) * 4 + hlen));
	if (c.nbuffers && !st)
		hpu__tool_note("raw holds the parameters only; the checkpoint's %d "
			       "buffers are not in %s (they are in %s/%s; --format safetensors "
			       "exports them too)",
			       c.nbuffers, out, c.dir, c.buffer_file.name);
	rc = OK;
done:
	hpu__tool_guard_drop(&guard); /* renamed, or removed by the abort */
	free(header);
	free(buf);
	hpu__ckpt_close(&c);
	return rc;
}
