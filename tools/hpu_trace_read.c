/* hpu-trace: reading one input -- its text (a torn file repaired), its
 * rank, host and first barrier -- and adding its complete events to the
 * table of actions; the memory helpers every file of hpu-trace uses.
 * Calls nothing of the other hpu_trace_*.c. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/hpu_trace_impl.h"
#include "tools/tool.h"

/* ---- memory ---- */

void *hpu__trc_xrealloc(void *p, size_t n)
{
	void *q = realloc(p, n ? n : 1);
	if (!q) {
		exit(fail("out of memory"));
	}
	return q;
}

char *hpu__trc_xstrdup(const char *s)
{
	size_t n = strlen(s) + 1;
	return memcpy(hpu__trc_xrealloc(NULL, n), s, n);
}

/* ---- one input ---- */

void hpu__trc_trace_free(trace *t)
{
	free(t->path);
	free(t->text);
	free(t->hostname);
	free(t->job_id);
	cJSON_Delete(t->other);
}

/* R of a file name ".../NAME-rank<R>.json", or -1. With name (size n),
 * also NAME (empty if the file is not named so). */
int hpu__trc_name_rank(const char *path, char *name, size_t n)
{
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	if (name && n)
		name[0] = 0;
	size_t len = strlen(base);
	if (len < 11 || strcmp(base + len - 5, ".json") != 0)
		return -1;
	const char *end = base + len - 5, *d = end;
	while (d > base && d[-1] >= '0' && d[-1] <= '9')
		d--;
	if (d == end || end - d > 6 || d - base < 5 || strncmp(d - 5, "-rank", 5) != 0)
		return -1;
	if (name && n)
		snprintf(name, n, "%.*s", (int)(d - 5 - base), base);
	return atoi(d);
}

enum { MAX_PIPE = 1 << 30 }; /* what a pipe may bring: 1 GiB */

/* What a file of mode m is, when it is no trace file and no pipe. */
static const char *kind(mode_t m)
{
	return S_ISCHR(m)    ? "a character device"
	       : S_ISBLK(m)  ? "a block device"
	       : S_ISSOCK(m) ? "a socket"
			     : "neither";
}

/* Reads fd to its end, at most `most` bytes, into *buf (NUL-terminated)
 * and *len; NULL, or why not. */
static const char *read_upto(int fd, size_t most, char **buf, size_t *len)
{
	size_t n = 0, cap = 0;
	char *b = NULL;
	for (;;) {
		if (n == cap) {
			size_t more = cap ? cap * 2 : 1 << 16;
			char *g = cap > most ? NULL : realloc(b, more + 1);
			if (!g) {
				free(b);
				return cap > most ? "larger than 1 GiB: not a trace" : "out of memory";
			}
			b = g;
			cap = more;
		}
		ssize_t got = read(fd, b + n, cap - n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			free(b);
			return strerror(errno);
		}
		if (got == 0)
			break;
		n += (size_t)got;
	}
	b[n] = 0;
	*buf = b;
	*len = n;
	return NULL;
}

/* Reads a whole file (or a pipe, such as /dev/stdin, up to 1 GiB) into
 * t->text; BAD (said) if it cannot. A device, a socket or a directory is
 * refused unread; a FIFO is opened without waiting for a writer (none:
 * empty). */
int hpu__trc_read_file(trace *t)
{
	struct stat st;
	int fd = open(t->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC), fl;
	if (fd < 0)
		return fail("%s: cannot open: %s", t->path, strerror(errno));
	if (fstat(fd, &st) < 0 || (fl = fcntl(fd, F_GETFL)) < 0 ||
	    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
		int e = errno;
		close(fd);
		return fail("%s: cannot read: %s", t->path, strerror(e));
	}
	if (S_ISDIR(st.st_mode) || (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode))) {
		close(fd);
		if (S_ISDIR(st.st_mode))
			return fail("%s: cannot read: %s", t->path, strerror(EISDIR));
		return fail("%s: cannot read: not a regular file or a pipe (%s)", t->path,
			    kind(st.st_mode));
	}
	const char *why = read_upto(fd, S_ISREG(st.st_mode) ? (size_t)-1 / 4 : MAX_PIPE, &t->text,
				    &t->len);
	close(fd);
	if (why)
		return fail("%s: cannot read: %s", t->path, why);
	return OK;
}

/* Whether line [p, e) is one complete event: "{...}" or ",{...}" that
 * parses as a JSON object with a "ph". (A write torn after 2 bytes leaves
 * ",{" before the old tail's "}": no event.) */
static int complete_event(const char *p, const char *e)
{
	while (e > p && (e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t'))
		e--;
	if (p < e && *p == ',')
		p++;
	if (p >= e || *p != '{' || e[-1] != '}')
		return 0;
	cJSON *o = cJSON_ParseWithLength(p, (size_t)(e - p));
	int ok = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "ph"));
	cJSON_Delete(o);
	return ok;
}

/* A torn trace: keeps the text up to its last complete event line and
 * closes it with "]}". Returns the new text (caller frees) and the number
 * of lines dropped, or NULL when the text has no traceEvents array to
 * repair. */
static char *repair(const char *text, size_t len, int *dropped)
{
	const char *k = strstr(text, "\"traceEvents\"");
	if (!k)
		return NULL;
	const char *p = k + strlen("\"traceEvents\"");
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	if (*p++ != ':')
		return NULL;
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	if (*p++ != '[')
		return NULL;
	const char *end = text + len, *keep = p;
	int stopped = 0;
	*dropped = 0;
	/* the rest of the "[" line, then one event a line */
	for (const char *line = p; line < end;) {
		const char *nl = memchr(line, '\n', (size_t)(end - line));
		const char *e = nl ? nl : end;
		int blank = 1;
		for (const char *q = line; q < e; q++)
			if (*q != ' ' && *q != '\t' && *q != '\r')
				blank = 0;
		if (!blank) {
			if (!stopped && complete_event(line, e))
				keep = e;
			else
				stopped = 1;
			if (stopped)
				(*dropped)++;
		}
		line = nl ? nl + 1 : end;
	}
	size_t n = (size_t)(keep - text);
	char *out = hpu__trc_xrealloc(NULL, n + 5);
	memcpy(out, text, n);
	memcpy(out + n, "\n]}\n", 5);
	return out;
}

/* Warns about what follows the end of doc's text at `end`, unless it is
 * only white space: a short write on a full disk leaves the writer's
 * "]}" put back before what fit of its last events, which the trace does
 * not list (they are ignored, as cJSON leaves them). */
static void past_end(const trace *t, const char *end, const cJSON *doc)
{
	const cJSON *ev = cJSON_GetObjectItemCaseSensitive(doc, "traceEvents");
	const char *stop = t->text + t->len;
	int lines = 0, blank = 1;
	if (!end || end < t->text || end > stop || !cJSON_IsArray(ev))
		return; /* not a trace: hpu__trc_scan says so */
	for (const char *q = end; q < stop; q++) {
		if (*q == '\n') {
			lines += !blank;
			blank = 1;
		} else if (*q != ' ' && *q != '\t' && *q != '\r') {
			blank = 0;
		}
	}
	lines += !blank;
	if (lines > 0)
		warn("%s: damaged: %d line%s past the end of the trace (a worker stopped by a "
		     "full disk?) ignored; %d events kept",
		     t->path, lines, lines == 1 ? "" : "s", cJSON_GetArraySize(ev));
}

/* Parses t->text, repairing a torn file (with a warning), and warning
 * about data past its end. Returns the document, or NULL after saying why
 * not. With quiet, says nothing (the second pass, which parses text
 * already checked). */
cJSON *hpu__trc_parse(trace *t, int quiet)
{
	const char *end = NULL;
	cJSON *doc = cJSON_ParseWithLengthOpts(t->text, t->len, &end, 0);
	if (doc && !quiet)
		past_end(t, end, doc);
	if (doc || quiet)
		return doc;
	const char *at = cJSON_GetErrorPtr();
	size_t off = at && at >= t->text && at <= t->text + t->len ? (size_t)(at - t->text) : 0;
	if (t->len == 0) {
		fail("%s: not a trace: the file is empty", t->path);
		return NULL;
	}
	int dropped = 0;
	char *fixed = repair(t->text, t->len, &dropped);
	cJSON *d = fixed ? cJSON_Parse(fixed) : NULL;
	if (!d) {
		fail("%s: not a trace: not JSON (a syntax error at byte %zu)", t->path, off);
		free(fixed);
		return NULL;
	}
	cJSON *ev = cJSON_GetObjectItemCaseSensitive(d, "traceEvents");
	warn("%s: torn at the end (a worker killed while writing?): dropped %d "
	     "incomplete line%s and closed it; %d complete events kept",
	     t->path, dropped, dropped == 1 ? "" : "s", cJSON_GetArraySize(ev));
	free(t->text);
	t->text = fixed;
	t->len = strlen(fixed);
	return d;
}

static double num(const cJSON *o, const char *key, double dflt)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

const char *hpu__trc_str(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- the summary ---- */

static uint64_t hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static action *find(actions *s, const char *name)
{
	if (2 * (s->n + 1) > s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 64;
		action *a = hpu__trc_xrealloc(NULL, cap * sizeof *a);
		memset(a, 0, cap * sizeof *a);
		for (size_t i = 0; i < s->cap; i++) {
			if (!s->a[i].name)
				continue;
			size_t j = hash(s->a[i].name) & (cap - 1);
			while (a[j].name)
				j = (j + 1) & (cap - 1);
			a[j] = s->a[i];
		}
		free(s->a);
		s->a = a;
		s->cap = cap;
	}
	size_t j = hash(name) & (s->cap - 1);
	while (s->a[j].name && strcmp(s->a[j].name, name) != 0)
		j = (j + 1) & (s->cap - 1);
	if (!s->a[j].name) {
		s->a[j].name = hpu__trc_xstrdup(name);
		s->n++;
	}
	return &s->a[j];
}

static void add(actions *s, const char *name, double dur)
{
	action *a = find(s, name);
	if (a->count == 0 || dur > a->max)
		a->max = dur;
	a->count++;
	a->total += dur;
}

/* ---- reading: rank, host, first barrier, earliest event, actions ---- */

/* Fills t's fields and adds its complete events to s. BAD (said) if the
 * document is not a trace. */
int hpu__trc_scan(trace *t, cJSON *doc, actions *s)
{
	if (!cJSON_IsObject(doc))
		return fail("%s: not a trace: not a JSON object", t->path);
	cJSON *ev = cJSON_GetObjectItemCaseSensitive(doc, "traceEvents");
	if (!cJSON_IsArray(ev))
		return fail("%s: not a trace: no traceEvents array", t->path);
	cJSON *other = cJSON_GetObjectItemCaseSensitive(doc, "otherData");
	/* a merge has no rank of its own: its events would count twice beside
	 * the files it was merged from (or be taken for the rank in its name) */
	if (cJSON_GetObjectItemCaseSensitive(other, "merged_by"))
		return fail("%s: already a merged trace (otherData.merged_by), not one rank's: give "
			    "the per-rank traces it was merged from",
			    t->path);
	/* otherData.rank, where there is one, must be a rank: a bad one is
	 * named (1.5 read as missing, "zero" and -3 fell back to the name's) */
	const cJSON *rj = cJSON_GetObjectItemCaseSensitive(other, "rank");
	if (rj && !(cJSON_IsNumber(rj) && rj->valuedouble >= 0 &&
		    rj->valuedouble == floor(rj->valuedouble) && rj->valuedouble <= 1e6)) {
		char *v = cJSON_PrintUnformatted(rj);
		int rc = fail("%s: not a trace of a rank: its otherData.rank, %.60s, is not a rank "
			      "(a whole number from 0)",
			      t->path, v ? v : "?");
		cJSON_free(v);
		return rc;
	}
	double r = rj ? rj->valuedouble : hpu__trc_name_rank(t->path, NULL, 0);
	if (r < 0 || r != floor(r) || r > 1e6)
		return fail("%s: not a trace of a rank: no otherData.rank and no -rank<R>.json "
			    "name",
			    t->path);
	t->rank = (int)r;
	double ws = num(other, "world_size", -1);
	t->world_size = ws >= 1 && ws <= 1e6 ? (int)ws : -1; /* else unknown */
	double at = num(other, "attempt", -1);
	t->attempt = at >= 0 && at <= 1e6 && at == floor(at) ? (int)at : -1;
	/* a format this reader does not know, a rank outside its job: said,
	 * and read as far as it goes (they were taken in silence) */
	cJSON *ver = cJSON_GetObjectItemCaseSensitive(other, "version");
	if (ver && !(cJSON_IsNumber(ver) && ver->valuedouble == 1)) {
		char v[80];
		if (cJSON_IsNumber(ver))
			snprintf(v, sizeof v, "%g", ver->valuedouble);
		else if (cJSON_IsString(ver))
			snprintf(v, sizeof v, "\"%.60s\"", ver->valuestring);
		else
			snprintf(v, sizeof v, "not a number");
		warn("%s: otherData.version is %s, not 1 (the version this hpu-trace reads): read as "
		     "version 1",
		     t->path, v);
	}
	if (t->world_size > 0 && t->rank >= t->world_size)
		warn("%s: rank %d of a job of %d ranks (otherData.world_size): the file is of "
		     "another job, or was changed",
		     t->path, t->rank, t->world_size);
	int name_rank = hpu__trc_name_rank(t->path, NULL, 0);
	if (name_rank >= 0 && name_rank != t->rank)
		warn("%s: its name says rank %d, its otherData.rank %d: read as rank %d", t->path,
		     name_rank, t->rank, t->rank);
	const char *h = hpu__trc_str(other, "hostname"), *j = hpu__trc_str(other, "job_id");
	t->hostname = h ? hpu__trc_xstrdup(h) : NULL;
	t->job_id = j ? hpu__trc_xstrdup(j) : NULL;
	t->other = cJSON_IsObject(other) ? cJSON_Duplicate(other, 1) : NULL;
	t->min_ts = INFINITY;
	double first_barrier = INFINITY;
	long out_of_range = 0, malformed = 0;
	cJSON *e;
	cJSON_ArrayForEach(e, ev)
	{
		t->events++;
		if (!cJSON_IsObject(e))
			continue;
		double ts = num(e, "ts", NAN), dur = num(e, "dur", NAN);
		if (fabs(ts) <= HPU__TRC_MAX_TS && ts < t->min_ts)
			t->min_ts = ts;
		const char *ph = hpu__trc_str(e, "ph"), *name = hpu__trc_str(e, "name"), *cat = hpu__trc_str(e, "cat");
		if (!ph || strcmp(ph, "X") != 0)
			continue; /* not a complete event: metadata, counters... */
		if (!name || isnan(ts) || isnan(dur)) {
			malformed++;
			continue;
		}
		if (!(dur >= 0 && dur <= HPU__TRC_MAX_DUR && fabs(ts) <= HPU__TRC_MAX_TS)) {
			out_of_range++;
			continue;
		}
		add(s, name, dur);
		if (!strcmp(name, "step")) {
			s->step_total += dur;
			s->steps++;
			t->steps++;
		}
		if (!strcmp(name, "barrier") && cat && !strcmp(cat, "collective") &&
		    ts < first_barrier) {
			first_barrier = ts;
			t->has_barrier = 1;
			t->barrier_end = ts + dur;
		}
	}
	if (malformed > 0)
		warn("%s: %ld complete event%s without a name, or a number for ts or dur, left out "
		     "of the summary",
		     t->path, malformed, malformed == 1 ? "" : "s");
	if (out_of_range > 0)
		warn("%s: %ld complete event%s with a dur below 0 or over %.0e µs, or a ts beyond "
		     "%.0e µs, left out of the summary",
		     t->path, out_of_range, out_of_range == 1 ? "" : "s", HPU__TRC_MAX_DUR,
		     HPU__TRC_MAX_TS);
	return OK;
}
