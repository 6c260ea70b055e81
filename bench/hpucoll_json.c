/* hpucoll-bench's JSON results: see hpucoll_json.h. */
#include "bench/hpucoll_json.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#define JSON_FILE_VERSION 3 /* nccl-tests' */

FILE *hcb_json_open(const char *path, char *used, size_t nused, char *err,
                    size_t nerr)
{
	snprintf(used, nused, "%s", path);
	for (int k = 0; k < 1000; k++) {
		FILE *f = fopen(used, "wx");
		if (f)
			return f;
		if (errno != EEXIST) {
			snprintf(err, nerr, "cannot create %s: %s", used,
			         strerror(errno));
			return NULL;
		}
		snprintf(used, nused, "%s.%d", path, k);
	}
	snprintf(err, nerr, "%s and %s.0 to %s.999 all exist", path, path,
	         path);
	return NULL;
}

static void add_now(cJSON *o, const char *key)
{
	char buf[64];
	time_t now = time(NULL);
	struct tm tm;
	strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", localtime_r(&now, &tm));
	cJSON_AddStringToObject(o, key, buf);
}

static void add_config(cJSON *doc, const struct hcb_args *a, int ranks,
                       const char *transport)
{
	const struct bench_opts *o = &a->o;
	cJSON *c = cJSON_AddObjectToObject(doc, "config");
	cJSON_AddNumberToObject(c, "nthreads", 1);
	cJSON_AddNumberToObject(c, "ngpus", 1);
	cJSON_AddNumberToObject(c, "minimum_bytes", (double)o->minbytes);
	cJSON_AddNumberToObject(c, "maximum_bytes", (double)o->maxbytes);
	if (o->factor > 1)
		cJSON_AddNumberToObject(c, "step_factor", (double)o->factor);
	else
		cJSON_AddNumberToObject(c, "step_bytes", (double)o->stepbytes);
	cJSON_AddNumberToObject(c, "warmup_iters", o->warmup);
	cJSON_AddNumberToObject(c, "iterations", o->iters);
	cJSON_AddNumberToObject(c, "aggregated_iterations", o->agg);
	cJSON_AddNumberToObject(c, "validation", o->check);
	cJSON_AddNumberToObject(c, "graph", 0);
	cJSON_AddBoolToObject(c, "blocking_collectives",
	                      a->blocking != HCB_ISSUE_ALL);
	cJSON_AddStringToObject(c, "collective", hcb_coll_names[a->coll]);
	cJSON_AddNumberToObject(c, "ranks", ranks);
	cJSON_AddStringToObject(c, "transport", transport);
	cJSON_AddNumberToObject(c, "blocking", a->blocking);
	cJSON_AddNumberToObject(c, "average", a->average);
}

cJSON *hcb_json_new(const struct hcb_args *a, int argc, char **argv, int ranks,
                    const char *transport)
{
	cJSON *doc = cJSON_CreateObject();
	cJSON_AddNumberToObject(doc, "version", JSON_FILE_VERSION);
	add_now(doc, "start_time");
	cJSON *args = cJSON_AddArrayToObject(doc, "args");
	for (int i = 0; i < argc; i++)
		cJSON_AddItemToArray(args, cJSON_CreateString(argv[i]));
	add_config(doc, a, ranks, transport);
	cJSON_AddArrayToObject(doc, "results");
	return doc;
}

cJSON *hcb_json_row(cJSON *doc, size_t bytes, size_t count, const char *type,
                    const char *redop, int root)
{
	cJSON *row = cJSON_CreateObject();
	cJSON_AddNumberToObject(row, "size", (double)bytes);
	cJSON_AddNumberToObject(row, "count", (double)count);
	cJSON_AddStringToObject(row, "type", type);
	cJSON_AddStringToObject(row, "redop", redop);
	cJSON_AddNumberToObject(row, "root", root);
	cJSON_AddItemToArray(cJSON_GetObjectItem(doc, "results"), row);
	return row;
}

void hcb_json_group(cJSON *row, int inplace, const struct hcb_group *g,
                    int cputime)
{
	cJSON *o =
	    cJSON_AddObjectToObject(row, inplace ? "in_place" : "out_of_place");
	cJSON_AddNumberToObject(o, cputime ? "cpu_time" : "time", g->time);
	cJSON_AddNumberToObject(o, "alg_bw", g->algbw);
	cJSON_AddNumberToObject(o, "bus_bw", g->busbw);
	if (g->wrong < 0)
		cJSON_AddNullToObject(o, "nwrong");
	else
		cJSON_AddNumberToObject(o, "nwrong", (double)g->wrong);
	cJSON *r = cJSON_AddObjectToObject(o, "time_over_ranks");
	static const char *const keys[4] = {"rank0", "mean", "min", "max"};
	for (int k = 0; k < 4; k++)
		cJSON_AddNumberToObject(r, keys[k], g->over[k]);
}

void hcb_json_end_row(cJSON *row, int iters)
{
	cJSON_AddNumberToObject(row, "actual_iterations", iters);
	cJSON_AddStringToObject(row, "experiment_name", "");
}

int hcb_json_finish(cJSON *doc, FILE *f, long out_of_bounds, double avg_busbw,
                    char *err, size_t nerr)
{
	cJSON *oob = cJSON_AddObjectToObject(doc, "out_of_bounds");
	cJSON_AddNumberToObject(oob, "count", (double)out_of_bounds);
	cJSON_AddBoolToObject(oob, "okay", out_of_bounds == 0);
	cJSON *bw = cJSON_AddObjectToObject(doc, "average_bus_bandwidth");
	cJSON_AddNumberToObject(bw, "bandwidth", avg_busbw);
	cJSON_AddArrayToObject(doc, "errors");
	add_now(doc, "end_time");
	char *text = cJSON_Print(doc);
	cJSON_Delete(doc);
	int nomem = !text;
	int bad = nomem || fputs(text, f) < 0 || fputc('\n', f) == EOF;
	int e = errno;
	if (fclose(f) != 0 && !bad) {
		bad = 1;
		e = errno;
	}
	cJSON_free(text);
	if (bad)
		snprintf(err, nerr, "writing the JSON results: %s",
		         nomem ? "out of memory" : strerror(e));
	return bad ? -1 : 0;
}
