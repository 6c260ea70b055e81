/* hpu-trace: the merged trace -- every rank's clock aligned at the first
 * barrier, its events written one at a time. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "tools/hpu_trace_impl.h"
#include "tools/tool.h"

/* ---- aligning ---- */

/* Rounded to the nanosecond, so that shifted timestamps print short. */
static double ns(double us)
{
	return round(us * 1000.0) / 1000.0;
}

/* Sets every trace's shift (in->t sorted by rank); warns about ranks that
 * have no barrier. Returns how many ranks were aligned. */
int hpu__trc_align(inputs *in)
{
	const trace *ref = NULL;
	for (int i = 0; i < in->n && !ref; i++)
		if (in->t[i].has_barrier)
			ref = &in->t[i];
	int aligned = 0;
	for (int i = 0; i < in->n; i++) {
		trace *t = &in->t[i];
		if (t->has_barrier) {
			t->shift = ref->barrier_end - t->barrier_end;
			aligned++;
		} else {
			t->shift = 0;
			warn("rank %d (%s) has no barrier event: its clock is not aligned with the "
			     "other ranks'",
			     t->rank, t->path);
		}
	}
	double earliest = INFINITY;
	for (int i = 0; i < in->n; i++)
		if (in->t[i].min_ts + in->t[i].shift < earliest)
			earliest = in->t[i].min_ts + in->t[i].shift;
	if (isinf(earliest))
		earliest = 0;
	for (int i = 0; i < in->n; i++)
		in->t[i].shift = ns(in->t[i].shift - earliest);
	return aligned;
}

/* ---- writing the merged trace ---- */

static cJSON *other_data(const inputs *in, int aligned)
{
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "tool", "hputrain");
	cJSON_AddNumberToObject(o, "version", 1);
	cJSON_AddStringToObject(o, "merged_by", "hpu-trace");
	/* what every rank says alike */
	static const char *const same[] = {"job_id", "model", "strategy", "precision"};
	for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
		const char *v = hpu__trc_str(in->t[0].other, same[k]);
		for (int i = 1; i < in->n && v; i++) {
			const char *w = hpu__trc_str(in->t[i].other, same[k]);
			if (!w || strcmp(v, w) != 0)
				v = NULL;
		}
		if (v)
			cJSON_AddStringToObject(o, same[k], v);
	}
	if (in->t[0].world_size > 0)
		cJSON_AddNumberToObject(o, "world_size", in->t[0].world_size);
	cJSON *ranks = cJSON_AddArrayToObject(o, "ranks");
	cJSON *hosts = cJSON_AddObjectToObject(o, "hostnames");
	cJSON *offs = cJSON_CreateObject();
	cJSON *files = cJSON_CreateArray();
	for (int i = 0; i < in->n; i++) {
		const trace *t = &in->t[i];
		char key[16];
		snprintf(key, sizeof key, "%d", t->rank);
		cJSON_AddItemToArray(ranks, cJSON_CreateNumber(t->rank));
		if (t->hostname)
			cJSON_AddStringToObject(hosts, key, t->hostname);
		cJSON_AddNumberToObject(offs, key, t->shift);
		cJSON_AddItemToArray(files, cJSON_CreateString(t->path));
	}
	cJSON_AddStringToObject(o, "aligned_at", aligned > 0 ? "first barrier" : "none");
	if (aligned > 0 && aligned < in->n) {
		cJSON *un = cJSON_AddArrayToObject(o, "unaligned_ranks");
		for (int i = 0; i < in->n; i++)
			if (!in->t[i].has_barrier)
				cJSON_AddItemToArray(un, cJSON_CreateNumber(in->t[i].rank));
	}
	cJSON_AddItemToObject(o, "offsets_us", offs);
	cJSON_AddStringToObject(o, "offsets_note",
				"merged ts = the rank's own ts + offsets_us[rank]");
	cJSON_AddItemToObject(o, "files", files);
	return o;
}

/* Writes one event (a line; every line after the first starts with ','). */
static int put(FILE *f, cJSON *e, long *written)
{
	char *s = cJSON_PrintUnformatted(e);
	if (!s) {
		exit(fail("out of memory"));
	}
	int rc = fprintf(f, "%s%s", *written ? "\n," : "", s);
	free(s);
	(*written)++;
	return rc < 0 ? -1 : 0;
}

/* The process row's name and place: "rank R (host)", sort index R; its
 * pid R + 1 (Perfetto treats pid 0 as the kernel's swapper). */
static int put_process(FILE *f, const trace *t, long *written)
{
	char name[300];
	if (t->hostname)
		snprintf(name, sizeof name, "rank %d (%s)", t->rank, t->hostname);
	else
		snprintf(name, sizeof name, "rank %d", t->rank);
	cJSON *e = cJSON_CreateObject();
	cJSON_AddStringToObject(e, "name", "process_name");
	cJSON_AddStringToObject(e, "ph", "M");
	cJSON_AddNumberToObject(e, "pid", t->rank + 1);
	cJSON_AddNumberToObject(e, "tid", 0);
	cJSON_AddStringToObject(cJSON_AddObjectToObject(e, "args"), "name", name);
	int rc = put(f, e, written);
	cJSON_Delete(e);
	e = cJSON_CreateObject();
	cJSON_AddStringToObject(e, "name", "process_sort_index");
	cJSON_AddStringToObject(e, "ph", "M");
	cJSON_AddNumberToObject(e, "pid", t->rank + 1);
	cJSON_AddNumberToObject(e, "tid", 0);
	cJSON_AddNumberToObject(cJSON_AddObjectToObject(e, "args"), "sort_index", t->rank);
	rc |= put(f, e, written);
	cJSON_Delete(e);
	return rc;
}

/* One rank's events: pid set to the rank + 1, ts shifted; its own
 * process_name and process_sort_index replaced by put_process's. OK, BAD
 * (said), or -1 when a write failed (errno set). */
static int put_rank(FILE *f, trace *t, long *written)
{
	cJSON *doc = hpu__trc_parse(t, 1);
	if (!doc)
		return fail("%s: could not parse it a second time", t->path);
	int rc = put_process(f, t, written), why = errno;
	cJSON *e;
	cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "traceEvents"))
	{
		if (!cJSON_IsObject(e) || rc)
			continue;
		const char *ph = hpu__trc_str(e, "ph"), *name = hpu__trc_str(e, "name");
		if (ph && !strcmp(ph, "M") && name &&
		    (!strcmp(name, "process_name") || !strcmp(name, "process_sort_index")))
			continue;
		cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
		if (cJSON_IsNumber(pid))
			cJSON_SetNumberValue(pid, t->rank + 1);
		else {
			cJSON_DeleteItemFromObjectCaseSensitive(e, "pid");
			cJSON_AddNumberToObject(e, "pid", t->rank + 1);
		}
		cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
		if (cJSON_IsNumber(ts))
			cJSON_SetNumberValue(ts, ns(ts->valuedouble + t->shift));
		if ((rc = put(f, e, written)))
			why = errno;
	}
	cJSON_Delete(doc);
	errno = why;
	return rc ? -1 : OK;
}

/* Writes the merged trace to out: as out.tmp.PID, renamed when complete
 * (an hpu_outfile: a device or a pipe in place). Every write, the flush,
 * the fsync and the close are checked. */
int hpu__trc_write_merged(inputs *in, const char *out, int aligned, long *written)
{
	hpu_outfile of;
	FILE *f = NULL;
	hpu__tool_guard_hold(1); /* a signal removes out.tmp.PID */
	int opened = hpu__outfile_open(&of, out, 0666) == 0;
	int guard = opened && !of.direct ? hpu__tool_guard_add(HPU_GUARD_FILE, of.tmp, 0) : -1;
	hpu__tool_guard_hold(0);
	if (!opened || !(f = hpu__outfile_stream(&of))) {
		hpu__outfile_abort(&of); /* errno stays */
		hpu__tool_guard_drop(&guard);
		return fail("%s: cannot write: %s", out, strerror(errno));
	}
	cJSON *o = other_data(in, aligned);
	char *s = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	int rc = OK, err = 0;
	/* no displayTimeUnit: older trace processors read it as ts's unit */
	if (fprintf(f, "{\"otherData\":%s,\n\"traceEvents\":[\n", s) < 0)
		rc = -1, err = errno;
	free(s);
	*written = 0;
	for (int i = 0; i < in->n && rc == OK; i++)
		if ((rc = put_rank(f, &in->t[i], written)) < 0)
			err = errno;
	if (rc == OK && (fputs("\n]}\n", f) < 0 || hpu__outfile_commit(&of, NULL) != 0))
		rc = -1, err = errno;
	hpu__outfile_abort(&of); /* what is left of it after a failure */
	hpu__tool_guard_drop(&guard);
	if (rc < 0) /* a write failed (BAD: put_rank said why) */
		return fail("%s: cannot write: %s", out, strerror(err ? err : EIO));
	return rc;
}
