/* hpu-plot: the metrics file read into a table of step records and
 * validation records, the last record of each step kept. Calls nothing
 * of the other hpu_plot_*.c. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "common/fileio.h"
#include "tools/hpu_plot_impl.h"
#include "tools/tool.h"

/* ---- the metrics ---- */

void hpu__plt_table_free(table *t)
{
	free(t->vp);
	for (size_t i = 0; i < t->n; i++) {
		free(t->p[i].in_use);
		free(t->p[i].max_in_use);
	}
	free(t->p);
	*t = (table){0};
}

/* o's member `key` if it is a number, else NAN (missing or null). */
static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* The rank of device entry e, the k-th of its array: its "rank", or k
 * where it has none; -1 for a rank that is not a small whole number. */
static int rank_of(const cJSON *e, int k)
{
	double r = num(e, "rank");
	if (isnan(r))
		return k;
	return r >= 0 && r < MAX_RANKS && r == floor(r) ? (int)r : -1;
}

/* The per-rank memory of a record's "device" array into *p; 0, or -1
 * when out of memory. Entries without a usable rank are skipped. */
static int read_device(const cJSON *dev, point *p)
{
	int n = 0, k = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, dev)
	{
		int r = rank_of(e, k++);
		n = r + 1 > n ? r + 1 : n;
	}
	if (n == 0)
		return 0;
	p->in_use = malloc((size_t)n * sizeof *p->in_use);
	p->max_in_use = malloc((size_t)n * sizeof *p->max_in_use);
	if (!p->in_use || !p->max_in_use)
		return -1;
	p->nranks = n;
	for (int r = 0; r < n; r++)
		p->in_use[r] = p->max_in_use[r] = NAN;
	k = 0;
	cJSON_ArrayForEach(e, dev)
	{
		int r = rank_of(e, k++);
		if (r < 0)
			continue;
		double lim = num(e, "Limit");
		p->in_use[r] = num(e, "InUse");
		p->max_in_use[r] = num(e, "MaxInUse");
		if (!isnan(lim) && (isnan(p->limit) || lim > p->limit))
			p->limit = lim;
	}
	return 0;
}

/* The series of validation key `key`, added when new; -1 when there are
 * MAX_VAL already. */
static int vseries(table *t, const char *key)
{
	for (int k = 0; k < t->nv; k++)
		if (!strcmp(t->vname[k], key))
			return k;
	if (t->nv == MAX_VAL)
		return -1;
	snprintf(t->vname[t->nv], sizeof t->vname[0], "%s", key);
	return t->nv++;
}

/* Adds validation record j: "step", "val_loss" and every other numeric
 * "val_*" but val_samples (a count, not a figure). 0, or -1 when out of
 * memory. */
static int add_validation(table *t, const cJSON *j, long line)
{
	if (t->vn == t->vcap) {
		size_t cap = t->vcap ? 2 * t->vcap : 64;
		vpoint *p = realloc(t->vp, cap * sizeof *p);
		if (!p)
			return -1;
		t->vp = p;
		t->vcap = cap;
	}
	vpoint *p = &t->vp[t->vn++];
	p->step = num(j, "step");
	p->line = line;
	for (int k = 0; k < MAX_VAL; k++)
		p->v[k] = NAN;
	vseries(t, "val_loss");
	const cJSON *e;
	cJSON_ArrayForEach(e, j)
	{
		if (strncmp(e->string, "val_", 4) || !strcmp(e->string, "val_samples") ||
		    strlen(e->string) >= sizeof t->vname[0])
			continue;
		int k = vseries(t, e->string);
		if (k >= 0)
			p->v[k] = num(j, e->string);
	}
	return 0;
}

/* A resume from step `from` (its "checkpoint": "loaded" record): the
 * records read so far past that step were the abandoned run's, which the
 * resumed one replaces whether or not it logs the same steps. */
static void resumed_at(table *t, double from)
{
	size_t k = 0;
	for (size_t i = 0; i < t->n; i++) {
		if (t->p[i].step > from) {
			free(t->p[i].in_use);
			free(t->p[i].max_in_use);
			continue;
		}
		t->p[k++] = t->p[i];
	}
	t->n = k;
	k = 0;
	for (size_t i = 0; i < t->vn; i++)
		if (!(t->vp[i].step > from))
			t->vp[k++] = t->vp[i];
	t->vn = k;
}

/* Adds record j (from line `line`) to t if it is a step record: an
 * object with a numeric "step" and a "loss" (a number, or null where the
 * loss was not finite). 0, or -1 when out of memory. */
static int add_record(table *t, const cJSON *j, long line)
{
	const cJSON *ck = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "checkpoint") : NULL;
	/* ... or a restart from the start ({"restart": K, "step": 0}) */
	const cJSON *rs = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "restart") : NULL;
	if (((cJSON_IsString(ck) && !strcmp(ck->valuestring, "loaded")) || cJSON_IsNumber(rs)) &&
	    !isnan(num(j, "step"))) {
		resumed_at(t, num(j, "step"));
		return 0;
	}
	if (cJSON_IsObject(j) && !isnan(num(j, "step")) &&
	    cJSON_GetObjectItemCaseSensitive(j, "val_loss"))
		return add_validation(t, j, line);
	if (!cJSON_IsObject(j) || isnan(num(j, "step")) ||
	    !cJSON_GetObjectItemCaseSensitive(j, "loss") ||
	    cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "final")))
		return 0;
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 256;
		point *p = realloc(t->p, cap * sizeof *p);
		if (!p)
			return -1;
		t->p = p;
		t->cap = cap;
	}
	point *p = &t->p[t->n++];
	*p = (point){.step = num(j, "step"), .line = line, .loss = num(j, "loss"),
		     .lr = num(j, "lr"), .sps = num(j, "samples_per_sec"), .limit = NAN};
	const cJSON *dev = cJSON_GetObjectItemCaseSensitive(j, "device");
	if (cJSON_IsArray(dev) && read_device(dev, p) < 0)
		return -1;
	if (p->nranks > t->nranks)
		t->nranks = p->nranks;
	return 0;
}

/* Whether record j has a "step" that is not a number (a string, null,
 * ...): the writer only writes numbers, so the line is damaged or hand
 * made. If so, its value (cut short) into why. */
static int bad_step(const cJSON *j, char *why, size_t n)
{
	const cJSON *s = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
	if (!s || cJSON_IsNumber(s))
		return 0;
	char *v = cJSON_PrintUnformatted(s);
	snprintf(why, n, "%.40s%s", v ? v : "?", v && strlen(v) > 40 ? "..." : "");
	free(v);
	return 1;
}

/* Whether s is nothing but white space. */
int hpu__plt_blank(const char *s)
{
	while (*s && isspace((unsigned char)*s))
		s++;
	return !*s;
}

/* Whether a line starts a Chrome trace (--profile's perf-logs-rankN.json,
 * hpu-trace's merged file): its object opens with "otherData" or holds
 * "traceEvents". */
static int looks_like_trace(const char *line)
{
	while (*line == ' ' || *line == '\t')
		line++;
	return !strncmp(line, "{\"otherData\"", 12) || strstr(line, "\"traceEvents\"");
}

/* Reads every step record of `file` (a regular file) into t. A line that
 * is not JSON, or a record whose "step" is not a number, is an error
 * naming its number -- except an unterminated last line that does not
 * parse, which a run still writing (or killed while writing) leaves: that
 * one is skipped with a warning (a whole record without its newline is
 * read). Returns OK or BAD (said). */
int hpu__plt_read_metrics(const char *file, table *t)
{
	struct stat st;
	const char *why = NULL;
	int fd = hpu__open_input_fd(file, 0, &st, &why); /* a FIFO or a device: refused */
	FILE *f = fd < 0 ? NULL : fdopen(fd, "r");
	if (fd >= 0 && !f)
		close(fd);
	if (!f)
		return fail("cannot %s %s: %s", st.st_mode ? "read" : "open", file,
			    fd >= 0 ? strerror(ENOMEM) : why);
	char *buf = NULL;
	size_t cap = 0;
	ssize_t len;
	long line = 0;
	int rc = OK;
	char why_step[64];
	errno = 0;
	while (rc == OK && (len = getline(&buf, &cap, f)) >= 0) {
		line++;
		int ended = len > 0 && buf[len - 1] == '\n';
		if (hpu__plt_blank(buf))
			continue;
		cJSON *j = cJSON_ParseWithOpts(buf, NULL, 1);
		if (!j && !ended && !hpu__plt_blank(buf)) {
			hpu__tool_warn("%s:%ld: the last line is incomplete (a run still writing it?): "
				       "skipped",
				       file, line);
			t->torn = 1;
		}
		else if ((!j || cJSON_GetObjectItemCaseSensitive(j, "traceEvents")) &&
			 looks_like_trace(buf))
			rc = fail("%s:%ld: this looks like a trace (hpulaunch --profile writes them; "
				  "hpu-trace reads them), not a metrics file (hpulaunch --metrics "
				  "FILE)",
				  file, line);
		else if (!j)
			rc = fail("%s:%ld: not JSON", file, line);
		else if (bad_step(j, why_step, sizeof why_step))
			rc = fail("%s:%ld: \"step\" is not a number (%s)", file, line, why_step);
		else if (add_record(t, j, line) < 0)
			rc = fail("out of memory reading %s", file);
		t->records += j != NULL;
		cJSON_Delete(j);
	}
	if (rc == OK && ferror(f))
		rc = fail("cannot read %s: %s", file, strerror(errno ? errno : EIO));
	free(buf);
	fclose(f);
	return rc;
}

static int by_step_then_line(const void *a, const void *b)
{
	const point *x = a, *y = b;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	return (x->line > y->line) - (x->line < y->line);
}

static int vby_step_then_line(const void *a, const void *b)
{
	const vpoint *x = a, *y = b;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	return (x->line > y->line) - (x->line < y->line);
}

/* Sorts t by step, keeping only the last record (in the file) of each;
 * the validation records too. */
void hpu__plt_keep_last_per_step(table *t)
{
	if (t->vn > 1)
		qsort(t->vp, t->vn, sizeof *t->vp, vby_step_then_line);
	size_t v = 0;
	for (size_t i = 0; i < t->vn; i++)
		if (i + 1 == t->vn || t->vp[i + 1].step != t->vp[i].step)
			t->vp[v++] = t->vp[i];
	t->vn = v;
	if (t->n > 1) /* t->p is NULL when there is none */
		qsort(t->p, t->n, sizeof *t->p, by_step_then_line);
	size_t k = 0;
	for (size_t i = 0; i < t->n; i++) {
		if (i + 1 < t->n && t->p[i + 1].step == t->p[i].step) {
			free(t->p[i].in_use);
			free(t->p[i].max_in_use);
			continue;
		}
		t->p[k++] = t->p[i];
	}
	t->n = k;
}
