/* quant: QUANT_CONFIG and the measurement file of fp8 inference (see
 * quant.h). */
#include "worker/runtime/quant.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/env.h"
#include "common/fileio.h"
#include "worker/ops/fp8.h"

static int bad(char *err, size_t errlen, const char *file, const char *key, const char *what)
{
	snprintf(err, errlen, "QUANT_CONFIG %s: %s: %s", file, key, what);
	return -1;
}

/* A string member (NULL when absent); -1 when present but not a string. */
static int get_str(const cJSON *j, const char *key, const char **out)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, key);
	*out = NULL;
	if (!it)
		return 0;
	if (!cJSON_IsString(it))
		return -1;
	*out = it->valuestring;
	return 0;
}

/* Whether name/type is listed in list ({"names": [...], "types": [...]}). */
static int listed(const cJSON *list, const char *name, const char *type)
{
	const cJSON *e;
	cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(list, "names"))
		if (cJSON_IsString(e) && strcmp(e->valuestring, name) == 0)
			return 1;
	cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(list, "types"))
		if (cJSON_IsString(e) && strcmp(e->valuestring, type) == 0)
			return 1;
	return 0;
}

static int list_empty(const cJSON *list)
{
	return cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(list, "names")) == 0 &&
	       cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(list, "types")) == 0;
}

/* allowlist/blocklist: an object of two arrays of strings; types must be
 * ops fp8 inference quantizes. */
static int check_list(const cJSON *cfg, const char *key, const char *file, char *err,
		      size_t errlen)
{
	const cJSON *l = cJSON_GetObjectItemCaseSensitive(cfg, key), *it;
	if (!l)
		return 0;
	char path[64];
	if (!cJSON_IsObject(l))
		return bad(err, errlen, file, key, "expected an object with \"names\" and \"types\"");
	cJSON_ArrayForEach(it, l) {
		snprintf(path, sizeof path, "%s.%s", key, it->string);
		if (strcmp(it->string, "names") && strcmp(it->string, "types"))
			return bad(err, errlen, file, path, "unknown key (names, types)");
		if (!cJSON_IsArray(it))
			return bad(err, errlen, file, path, "expected an array of strings");
		const cJSON *e;
		cJSON_ArrayForEach(e, it) {
			if (!cJSON_IsString(e))
				return bad(err, errlen, file, path, "expected an array of strings");
			if (!strcmp(it->string, "types") && strcmp(e->valuestring, "linear") &&
			    strcmp(e->valuestring, "conv2d") && strcmp(e->valuestring, "matmul") &&
			    strcmp(e->valuestring, "bmm")) {
				char what[160];
				snprintf(what, sizeof what,
					 "'%.64s' is not an op fp8 inference quantizes "
					 "(linear, conv2d, matmul, bmm)",
					 e->valuestring);
				return bad(err, errlen, file, path, what);
			}
		}
	}
	return 0;
}

static const char *const known_keys[] = {
	"mode", "observer", "dump_stats_path", "scale_method", "fp8_config",
	"allowlist", "blocklist", "method", "measure_exclude", "whitelist",
	"blacklist", "dump_stats_xlsx_path",
};

/* The allow or block list under its name or its older one (whitelist,
 * blacklist: Lightning-Habana's and older INC files'); *key says which
 * was given. Both at once is an error. */
static int get_list(const cJSON *cfg, const char *name, const char *old, const char **key,
		    const char *file, char *err, size_t errlen)
{
	int a = cJSON_HasObjectItem(cfg, name), b = cJSON_HasObjectItem(cfg, old);
	*key = b ? old : name;
	if (a && b) {
		char what[96];
		snprintf(what, sizeof what, "give %s or %s (its older name), not both", name, old);
		return bad(err, errlen, file, old, what);
	}
	return check_list(cfg, *key, file, err, errlen);
}

/* QUANTIZE: the measurement file's figures into fp8.c (allow, block:
 * the config's lists, or NULL). */
static int load_stats(hpu_quant *q, const cJSON *allow, const cJSON *block, int unit_scale,
		      char *err, size_t errlen)
{
	char *text;
	size_t len;
	const char *why = hpu__read_file(q->stats, &text, &len);
	if (why) {
		snprintf(err, errlen,
			 "QUANT_CONFIG %s: cannot read the measurement file %s: %s "
			 "(run with mode MEASURE first)",
			 q->config, q->stats, why);
		return -1;
	}
	cJSON *j = cJSON_Parse(text);
	free(text);
	const cJSON *nodes = j ? cJSON_GetObjectItemCaseSensitive(j, "Nodes") : NULL;
	if (!cJSON_IsObject(nodes)) {
		snprintf(err, errlen, "measurement file %s: %s", q->stats,
			 j ? "no \"Nodes\" object" : "not valid JSON");
		cJSON_Delete(j);
		return -1;
	}
	const cJSON *n;
	int rc = 0;
	cJSON_ArrayForEach(n, nodes) {
		const cJSON *op = cJSON_GetObjectItemCaseSensitive(n, "op");
		const cJSON *in = cJSON_GetObjectItemCaseSensitive(n, "inputs");
		const cJSON *out = cJSON_GetObjectItemCaseSensitive(n, "outputs");
		float m[3];
		/* "outputs" is absent when measure_exclude left them out */
		int ok = cJSON_IsString(op) && cJSON_GetArraySize(in) == 2 &&
			 (!out || cJSON_IsNumber(out));
		for (int i = 0; ok && i < 2; i++) {
			const cJSON *v = cJSON_GetArrayItem(in, i);
			ok = cJSON_IsNumber(v) && v->valuedouble >= 0 && isfinite(v->valuedouble);
			m[i] = ok ? (float)v->valuedouble : 0;
		}
		if (!ok) {
			snprintf(err, errlen,
				 "measurement file %s: Nodes.%s: expected {\"op\": NAME, "
				 "\"inputs\": [maxabs, maxabs], \"outputs\": maxabs (optional)}",
				 q->stats, n->string);
			rc = -1;
			break;
		}
		m[2] = out ? (float)out->valuedouble : 0;
		if (unit_scale) /* scale 1: figures that give it */
			m[0] = m[1] = hpu__fp8_max(HPU_FP8_E4M3);
		int on = (!allow || list_empty(allow) || listed(allow, n->string, op->valuestring)) &&
			 !(block && listed(block, n->string, op->valuestring));
		if (hpu__fp8_preload(n->string, m, on) < 0) {
			snprintf(err, errlen, "out of memory loading %s", q->stats);
			rc = -1;
			break;
		}
	}
	cJSON_Delete(j);
	return rc;
}

int hpu__quant_init(hpu_quant *q, const hpu_train_opts *o, char *err, size_t errlen)
{
	memset(q, 0, sizeof *q);
	const char *path = hpu__env_str(HPU_ENV_QUANT_CONFIG);
	if (!path || !*path)
		return 0;
	snprintf(q->config, sizeof q->config, "%s", path);
	char *text;
	size_t len;
	const char *why = hpu__read_file(path, &text, &len);
	if (why) {
		snprintf(err, errlen, "QUANT_CONFIG %s: cannot read it: %s", path, why);
		return -1;
	}
	cJSON *cfg = cJSON_Parse(text);
	free(text);
	int rc = -1;
	if (!cJSON_IsObject(cfg)) {
		snprintf(err, errlen, "QUANT_CONFIG %s: not a JSON object", path);
		goto out;
	}
	const cJSON *it;
	cJSON_ArrayForEach(it, cfg) {
		size_t k = 0, nk = sizeof known_keys / sizeof *known_keys;
		while (k < nk && strcmp(known_keys[k], it->string))
			k++;
		if (k == nk) {
			bad(err, errlen, path, it->string,
			    "unknown key (mode, observer, dump_stats_path, scale_method, fp8_config, "
			    "allowlist, blocklist, whitelist, blacklist, measure_exclude, method, "
			    "dump_stats_xlsx_path)");
			goto out;
		}
	}
	const char *mode, *observer, *dump, *method, *fmt, *exclude, *xlsx, *allow_key, *block_key;
	if (get_str(cfg, "mode", &mode) || !mode) {
		bad(err, errlen, path, "mode", "expected \"MEASURE\", \"QUANTIZE\" or \"NONE\"");
		goto out;
	}
	if (!strcmp(mode, "NONE")) {
		rc = 0;
		goto out;
	}
	q->mode = !strcmp(mode, "MEASURE") ? HPU_FP8_MEASURE
		  : !strcmp(mode, "QUANTIZE") ? HPU_FP8_QUANTIZE : -1;
	if (q->mode < 0) {
		bad(err, errlen, path, "mode", "expected \"MEASURE\", \"QUANTIZE\" or \"NONE\"");
		goto out;
	}
	if (get_str(cfg, "observer", &observer) || (observer && strcmp(observer, "maxabs"))) {
		bad(err, errlen, path, "observer", "only \"maxabs\" is supported");
		goto out;
	}
	if (get_str(cfg, "fp8_config", &fmt) || (fmt && strcmp(fmt, "E4M3"))) {
		bad(err, errlen, path, "fp8_config", "only \"E4M3\" is supported");
		goto out;
	}
	if (get_str(cfg, "scale_method", &method) ||
	    (method && strcmp(method, "maxabs_hw") && strcmp(method, "unit_scale"))) {
		bad(err, errlen, path, "scale_method", "expected \"maxabs_hw\" or \"unit_scale\"");
		goto out;
	}
	if (get_str(cfg, "dump_stats_path", &dump) || !dump || !*dump ||
	    strlen(dump) + 20 >= sizeof q->stats) {
		bad(err, errlen, path, "dump_stats_path", "expected a path (a file name prefix)");
		goto out;
	}
	if (get_list(cfg, "allowlist", "whitelist", &allow_key, path, err, errlen) < 0 ||
	    get_list(cfg, "blocklist", "blacklist", &block_key, path, err, errlen) < 0)
		goto out;
	/* INC's measure_exclude: which figures MEASURE leaves out; quantizing
	 * needs the inputs' and weights', so only the outputs' can go */
	if (get_str(cfg, "measure_exclude", &exclude) ||
	    (exclude && strcmp(exclude, "NONE") && strcmp(exclude, "OUTPUT"))) {
		bad(err, errlen, path, "measure_exclude",
		    "expected \"NONE\" or \"OUTPUT\" (quantizing needs the inputs' and weights' "
		    "figures, so INPUT, PARAMS and ALL cannot be left out)");
		goto out;
	}
	q->exclude_outputs = exclude && !strcmp(exclude, "OUTPUT");
	if (get_str(cfg, "dump_stats_xlsx_path", &xlsx)) {
		bad(err, errlen, path, "dump_stats_xlsx_path", "expected a path");
		goto out;
	}
	if (xlsx)
		snprintf(q->warning, sizeof q->warning,
			 "QUANT_CONFIG %s: dump_stats_xlsx_path: no spreadsheet is written; the "
			 "figures are in %s_hooks_maxabs.json",
			 path, dump);
	if (!o->eval_only) {
		snprintf(err, errlen,
			 "QUANT_CONFIG %s is set (mode %s): fp8 inference runs with --eval-only "
			 "(and --load-params FILE)",
			 path, mode);
		goto out;
	}
	if (o->precision == HPU_PREC_FP8) {
		snprintf(err, errlen,
			 "QUANT_CONFIG %s and --precision fp8 do not go together: fp8 inference "
			 "quantizes a model trained in any precision; use --precision fp32 or "
			 "bf16-mixed",
			 path);
		goto out;
	}
	snprintf(q->stats, sizeof q->stats, "%s_hooks_maxabs.json", dump);
	/* MEASURE makes dump_stats_path's directory, as INC does */
	char at[sizeof q->stats];
	const char *slash = strrchr(q->stats, '/');
	if (q->mode == HPU_FP8_MEASURE && slash && slash > q->stats) {
		char dir[sizeof q->stats];
		snprintf(dir, sizeof dir, "%.*s", (int)(slash - q->stats), q->stats);
		if (hpu__make_dirs(dir, at, sizeof at) < 0) {
			snprintf(err, errlen, "QUANT_CONFIG %s: dump_stats_path: cannot make directory %s: %s",
				 path, at, strerror(errno));
			goto out;
		}
	}
	hpu__fp8_set_mode((hpu_fp8_mode)q->mode, NULL);
	if (q->mode == HPU_FP8_QUANTIZE &&
	    load_stats(q, cJSON_GetObjectItemCaseSensitive(cfg, allow_key),
		       cJSON_GetObjectItemCaseSensitive(cfg, block_key),
		       method && !strcmp(method, "unit_scale"), err, errlen) < 0)
		goto out;
	rc = 0;
out:
	cJSON_Delete(cfg);
	return rc;
}

int hpu__quant_save(const hpu_quant *q, hpucoll_comm *comm, const char *model,
		    double samples, char *err, size_t errlen)
{
	int n = hpu__fp8_count(), rank = hpucoll_comm_rank(comm);
	float *v = calloc((size_t)n * 3 + 1, sizeof *v);
	if (!v) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	hpu_fp8_info in;
	for (int i = 0; i < n; i++) {
		hpu__fp8_info_get(i, &in);
		memcpy(v + 3 * i, in.maxabs, sizeof in.maxabs);
	}
	int rc = hpucoll_all_reduce(comm, v, v, (size_t)n * 3, HPUCOLL_F32, HPUCOLL_MAX);
	if (rc) {
		snprintf(err, errlen, "measurement all-reduce failed: %s",
			 hpucoll_comm_why(comm, rc));
		free(v);
		return -1;
	}
	if (rank != 0) {
		free(v);
		return 0;
	}
	cJSON *j = cJSON_CreateObject(), *nodes = cJSON_CreateObject();
	cJSON_AddStringToObject(j, "Mode", "DynamicRange");
	cJSON_AddStringToObject(j, "Observer", "maxabs");
	cJSON_AddStringToObject(j, "Model", model);
	cJSON_AddNumberToObject(j, "WorldSize", hpucoll_comm_size(comm));
	cJSON_AddNumberToObject(j, "CalibrationSamples", samples);
	for (int i = 0; i < n; i++) {
		hpu__fp8_info_get(i, &in);
		cJSON *node = cJSON_CreateObject();
		cJSON_AddStringToObject(node, "op", hpu__autocast_op_name(in.op));
		float in2[2] = {v[3 * i], v[3 * i + 1]};
		cJSON_AddItemToObject(node, "inputs", cJSON_CreateFloatArray(in2, 2));
		if (!q->exclude_outputs)
			cJSON_AddNumberToObject(node, "outputs", v[3 * i + 2]);
		cJSON_AddItemToObject(nodes, in.name, node);
	}
	cJSON_AddItemToObject(j, "Nodes", nodes);
	free(v);
	char *text = cJSON_Print(j);
	cJSON_Delete(j);
	hpu_outfile o = {.fd = -1};
	/* a signal meanwhile removes the temporary file */
	int bad_write = !text || hpu__outfile_open_guarded(&o, q->stats, 0666) < 0 ||
			hpu__write_all(o.fd, text, strlen(text)) < 0 ||
			hpu__write_all(o.fd, "\n", 1) < 0 || hpu__outfile_commit(&o, NULL) < 0;
	hpu__outfile_abort(&o); /* errno stays */
	hpu__outfile_unguard();
	free(text);
	if (bad_write) {
		snprintf(err, errlen, "cannot write the measurement file %s: %s", q->stats,
			 strerror(errno));
		return -1;
	}
	return 0;
}
