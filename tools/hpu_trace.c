/* hpu-trace: merges the per-rank Chrome traces that hpu-worker --profile
 * writes (DIR/NAME-rank<R>.json) into one timeline and prints a summary
 * table of the actions.
 *
 *   hpu-trace [-o OUT.json] [--no-merge] [--top N] [--sort KEY] PATH...
 *
 * Each file is read whole with cJSON. A file that does not parse is taken
 * as one torn by a killed worker: its trailing lines are dropped back to
 * the last complete event and it is closed with "]}" (a warning says so).
 * The merged file has one process row per rank (pid = rank), the clocks
 * aligned at the job's first barrier (its end is the same instant on every
 * rank) and then shifted so that the earliest event is at ts 0. Events
 * are written one at a time (cJSON_PrintUnformatted each), so only one
 * input's tree is in memory at a time besides the files' text.
 *
 * Exit status: 0 done, 1 a file unreadable, not a trace, or two files of
 * the same rank (the message names the file), 2 usage. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "common/fileio.h"
#include "common/num.h"
#include "common/opt.h"
#include "common/optdoc.h"
#include "tools/tool.h"

enum { OK = HPU_TOOL_OK, BAD = HPU_TOOL_BAD, USAGE = HPU_TOOL_USAGE };
#define fail hpu__tool_fail
#define warn hpu__tool_warn

static const char *const help =
	"usage: hpu-trace [-o OUT.json] [--no-merge] [--top N]\n"
	"                 [--sort total|count|mean|max|name] PATH...\n"
	"\n"
	"Merges the per-rank Chrome traces of hpu-worker --profile into one\n"
	"timeline (for chrome://tracing or https://ui.perfetto.dev) and prints\n"
	"a summary of the actions: count, total, mean and max time, and the\n"
	"share of the step time.\n"
	"\n"
	"PATH is a trace file or a directory; a directory stands for every\n"
	"*-rank<R>.json in it. Every file must be of a different rank.\n"
	"\n"
	"options:\n";

static const char *const help_tail =
	"\n"
	"The merged file has one process row per rank (\"rank R (host)\", in\n"
	"rank order). Clocks are aligned at the job's first barrier: every\n"
	"rank's events are shifted so that its first barrier ends when rank 0's\n"
	"does; then all so that the earliest event is at 0. otherData says by\n"
	"how much (offsets_us). A file torn by a killed worker is repaired: its\n"
	"incomplete last lines are dropped, with a warning.\n"
	"\n"
	"Exit status: 0 done, 1 a file could not be read or is not a trace (or\n"
	"two files hold the same rank), 2 usage.\n";

/* ---- memory ---- */

static void *xrealloc(void *p, size_t n)
{
	void *q = realloc(p, n ? n : 1);
	if (!q) {
		exit(fail("out of memory"));
	}
	return q;
}

static char *xstrdup(const char *s)
{
	size_t n = strlen(s) + 1;
	return memcpy(xrealloc(NULL, n), s, n);
}

/* ---- one input ---- */

typedef struct trace {
	char *path;        /* as given or found in a directory */
	char *text;        /* the file's text, repaired if it was torn */
	size_t len;
	int rank;
	int order;         /* its place among the inputs */
	int world_size;    /* otherData.world_size, or -1 */
	char *hostname;    /* otherData.hostname, or NULL */
	char *job_id;      /* otherData.job_id, or NULL */
	cJSON *other;      /* a copy of otherData, or NULL */
	int has_barrier;   /* found its first barrier */
	double barrier_end; /* ts + dur of that barrier, µs */
	double min_ts;     /* the earliest ts, µs (INFINITY if none) */
	long events;       /* traceEvents entries */
	long steps;        /* "step" complete events */
	double shift;      /* µs added to every ts when merging */
} trace;

static void trace_free(trace *t)
{
	free(t->path);
	free(t->text);
	free(t->hostname);
	free(t->job_id);
	cJSON_Delete(t->other);
}

/* R of a file name ".../NAME-rank<R>.json", or -1. With name (size n),
 * also NAME (empty if the file is not named so). */
static int name_rank(const char *path, char *name, size_t n)
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
static int read_file(trace *t)
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
	char *out = xrealloc(NULL, n + 5);
	memcpy(out, text, n);
	memcpy(out + n, "\n]}\n", 5);
	return out;
}

/* Parses t->text, repairing a torn file (with a warning). Returns the
 * document, or NULL after saying why not. With quiet, says nothing (the
 * second pass, which parses text already checked). */
static cJSON *parse(trace *t, int quiet)
{
	cJSON *doc = cJSON_ParseWithLength(t->text, t->len);
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

static const char *str(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- the summary ---- */

typedef struct action {
	char *name;
	long count;
	double total, max; /* µs */
} action;

/* Actions by name: an open-addressing hash table. */
typedef struct actions {
	action *a;
	size_t n, cap; /* cap a power of two */
	double step_total; /* µs, over every rank */
	long steps;
} actions;

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
		action *a = xrealloc(NULL, cap * sizeof *a);
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
		s->a[j].name = xstrdup(name);
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
static int scan(trace *t, cJSON *doc, actions *s)
{
	if (!cJSON_IsObject(doc))
		return fail("%s: not a trace: not a JSON object", t->path);
	cJSON *ev = cJSON_GetObjectItemCaseSensitive(doc, "traceEvents");
	if (!cJSON_IsArray(ev))
		return fail("%s: not a trace: no traceEvents array", t->path);
	cJSON *other = cJSON_GetObjectItemCaseSensitive(doc, "otherData");
	double r = num(other, "rank", -1);
	if (r < 0)
		r = name_rank(t->path, NULL, 0);
	if (r < 0 || r != floor(r) || r > 1e6)
		return fail("%s: not a trace of a rank: no otherData.rank and no -rank<R>.json "
			    "name",
			    t->path);
	t->rank = (int)r;
	double ws = num(other, "world_size", -1);
	t->world_size = ws >= 1 && ws <= 1e6 ? (int)ws : -1; /* else unknown */
	const char *h = str(other, "hostname"), *j = str(other, "job_id");
	t->hostname = h ? xstrdup(h) : NULL;
	t->job_id = j ? xstrdup(j) : NULL;
	t->other = cJSON_IsObject(other) ? cJSON_Duplicate(other, 1) : NULL;
	t->min_ts = INFINITY;
	double first_barrier = INFINITY;
	cJSON *e;
	cJSON_ArrayForEach(e, ev)
	{
		t->events++;
		if (!cJSON_IsObject(e))
			continue;
		double ts = num(e, "ts", NAN), dur = num(e, "dur", NAN);
		if (!isnan(ts) && ts < t->min_ts)
			t->min_ts = ts;
		const char *ph = str(e, "ph"), *name = str(e, "name"), *cat = str(e, "cat");
		if (!ph || strcmp(ph, "X") != 0 || !name || isnan(ts) || isnan(dur))
			continue;
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
	return OK;
}

/* ---- finding the inputs ---- */

typedef struct inputs {
	trace *t;
	int n, cap;
} inputs;

static void add_input(inputs *in, const char *path)
{
	if (in->n == in->cap) {
		in->cap = in->cap ? 2 * in->cap : 8;
		in->t = xrealloc(in->t, (size_t)in->cap * sizeof *in->t);
	}
	memset(&in->t[in->n], 0, sizeof in->t[0]);
	in->t[in->n].order = in->n;
	in->t[in->n++].path = xstrdup(path);
}

static int by_path(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds every *-rank<R>.json of directory dir; BAD (said) if none. */
static int add_dir(inputs *in, const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return fail("%s: cannot open the directory: %s", dir, strerror(errno));
	char **names = NULL;
	int n = 0;
	for (struct dirent *de; (de = readdir(d));) {
		if (name_rank(de->d_name, NULL, 0) < 0)
			continue;
		names = xrealloc(names, (size_t)(n + 1) * sizeof *names);
		names[n++] = xstrdup(de->d_name);
	}
	closedir(d);
	if (n == 0)
		return fail("%s: no trace files (*-rank<R>.json) in it", dir);
	qsort(names, (size_t)n, sizeof *names, by_path);
	/* one run's files: a directory with several names (another
	 * --profile-filename, a restarted job's NAME-restart<K>) is ambiguous */
	char first[256], other[256];
	name_rank(names[0], first, sizeof first);
	for (int i = 1; i < n; i++) {
		name_rank(names[i], other, sizeof other);
		if (strcmp(first, other) != 0) {
			int rc = fail("%s holds the traces of more than one run (%s-rank*.json and "
				      "%s-rank*.json): name the files of one, e.g. %s/%s-rank*.json",
				      dir, first, other, dir, first);
			for (int k = 0; k < n; k++)
				free(names[k]);
			free(names);
			return rc;
		}
	}
	for (int i = 0; i < n; i++) {
		size_t len = strlen(dir) + strlen(names[i]) + 2;
		char *p = xrealloc(NULL, len);
		snprintf(p, len, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", names[i]);
		add_input(in, p);
		free(p);
		free(names[i]);
	}
	free(names);
	return OK;
}

static int by_rank(const void *a, const void *b)
{
	const trace *x = a, *y = b;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return (x->order > y->order) - (x->order < y->order);
}

/* The default output: DIR/NAME-merged.json. */
static char *default_output(const char *first, int first_is_dir, const inputs *in)
{
	char name[256] = "", other[256];
	for (int i = 0; i < in->n; i++) {
		name_rank(in->t[i].path, other, sizeof other);
		if (i == 0)
			snprintf(name, sizeof name, "%s", other);
		else if (strcmp(name, other) != 0)
			name[0] = 0;
	}
	if (!name[0])
		snprintf(name, sizeof name, "hpu-trace");
	char dir[4096];
	if (first_is_dir) {
		snprintf(dir, sizeof dir, "%s", first);
	} else {
		const char *slash = strrchr(first, '/');
		if (!slash)
			snprintf(dir, sizeof dir, ".");
		else if (slash == first)
			snprintf(dir, sizeof dir, "/");
		else
			snprintf(dir, sizeof dir, "%.*s", (int)(slash - first), first);
	}
	size_t len = strlen(dir) + strlen(name) + 16;
	char *out = xrealloc(NULL, len);
	snprintf(out, len, "%s%s%s-merged.json", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", name);
	return out;
}

/* ---- aligning ---- */

/* Rounded to the nanosecond, so that shifted timestamps print short. */
static double ns(double us)
{
	return round(us * 1000.0) / 1000.0;
}

/* Sets every trace's shift (in->t sorted by rank); warns about ranks that
 * have no barrier. Returns how many ranks were aligned. */
static int align(inputs *in)
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
		const char *v = str(in->t[0].other, same[k]);
		for (int i = 1; i < in->n && v; i++) {
			const char *w = str(in->t[i].other, same[k]);
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
	cJSON *doc = parse(t, 1);
	if (!doc)
		return fail("%s: could not parse it a second time", t->path);
	int rc = put_process(f, t, written), why = errno;
	cJSON *e;
	cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "traceEvents"))
	{
		if (!cJSON_IsObject(e) || rc)
			continue;
		const char *ph = str(e, "ph"), *name = str(e, "name");
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
static int write_merged(inputs *in, const char *out, int aligned, long *written)
{
	hpu_outfile of;
	FILE *f = NULL;
	if (hpu__outfile_open(&of, out, 0666) < 0 || !(f = hpu__outfile_stream(&of))) {
		hpu__outfile_abort(&of); /* errno stays */
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
	if (rc < 0) /* a write failed (BAD: put_rank said why) */
		return fail("%s: cannot write: %s", out, strerror(err ? err : EIO));
	return rc;
}

/* ---- printing the summary ---- */

enum sort_key { BY_TOTAL, BY_COUNT, BY_MEAN, BY_MAX, BY_NAME };
static enum sort_key sort_key;

static int cmp_action(const void *pa, const void *pb)
{
	const action *a = pa, *b = pb;
	double x = 0, y = 0;
	switch (sort_key) {
	case BY_TOTAL:
		x = a->total, y = b->total;
		break;
	case BY_COUNT:
		x = (double)a->count, y = (double)b->count;
		break;
	case BY_MEAN:
		x = a->total / (double)a->count, y = b->total / (double)b->count;
		break;
	case BY_MAX:
		x = a->max, y = b->max;
		break;
	case BY_NAME:
		break;
	}
	if (x != y)
		return x < y ? 1 : -1;
	return strcmp(a->name, b->name);
}

static int digits(double v, int decimals)
{
	char b[64];
	return snprintf(b, sizeof b, "%.*f", decimals, v);
}

static void summary(actions *s, const inputs *in, int top)
{
	action *a = xrealloc(NULL, (s->n ? s->n : 1) * sizeof *a);
	size_t n = 0;
	for (size_t i = 0; i < s->cap; i++)
		if (s->a[i].name)
			a[n++] = s->a[i];
	qsort(a, n, sizeof *a, cmp_action);
	size_t rows = top > 0 && (size_t)top < n ? (size_t)top : n;
	int wn = 6, wc = 5, wt = 8, wm = 7, wx = 6, wp = 5;
	for (size_t i = 0; i < rows; i++) {
		int l = (int)strlen(a[i].name);
		wn = l > wn ? l : wn;
		l = digits((double)a[i].count, 0);
		wc = l > wc ? l : wc;
		l = digits(a[i].total / 1e3, 3);
		wt = l > wt ? l : wt;
		l = digits(a[i].total / 1e3 / (double)a[i].count, 3);
		wm = l > wm ? l : wm;
		l = digits(a[i].max / 1e3, 3);
		wx = l > wx ? l : wx;
		if (s->step_total > 0) {
			l = digits(100.0 * a[i].total / s->step_total, 1);
			wp = l > wp ? l : wp;
		}
	}
	printf("%-*s  %*s  %*s  %*s  %*s  %*s\n", wn, "action", wc, "count", wt, "total_ms", wm,
	       "mean_ms", wx, "max_ms", wp, "%step");
	for (size_t i = 0; i < rows; i++) {
		printf("%-*s  %*ld  %*.3f  %*.3f  %*.3f  ", wn, a[i].name, wc, a[i].count, wt,
		       a[i].total / 1e3, wm, a[i].total / 1e3 / (double)a[i].count, wx,
		       a[i].max / 1e3);
		if (s->step_total > 0)
			printf("%*.1f\n", wp, 100.0 * a[i].total / s->step_total);
		else
			printf("%*s\n", wp, "-");
	}
	if (rows < n)
		printf("(%zu more action%s; --top %d shows the first %d)\n", n - rows,
		       n - rows == 1 ? "" : "s", top, top);
	long lo = -1, hi = -1;
	for (int i = 0; i < in->n; i++) {
		if (lo < 0 || in->t[i].steps < lo)
			lo = in->t[i].steps;
		if (hi < 0 || in->t[i].steps > hi)
			hi = in->t[i].steps;
	}
	char per[64];
	if (lo == hi)
		snprintf(per, sizeof per, "%ld per rank", lo);
	else
		snprintf(per, sizeof per, "%ld to %ld per rank", lo, hi);
	if (s->steps == 0) {
		printf("%d rank%s, no step events: no %%step.\n", in->n, in->n == 1 ? "" : "s");
		free(a);
		return;
	}
	printf("%d rank%s, %ld step%s (%s), step time %.3f ms (all ranks). Nested actions "
	       "(forward:<layer> inside forward) and the collectives thread overlap, and actions "
	       "outside the steps (evaluate) count too, so %%step does not add up to 100%%.\n",
	       in->n, in->n == 1 ? "" : "s", s->steps, s->steps == 1 ? "" : "s", per,
	       s->step_total / 1e3);
	free(a);
}

/* ---- main ---- */

typedef struct opts {
	const char *out;
	int no_merge, top;
	const char **paths;
	int npaths;
} opts;

enum { OPT_HELP = 1, OPT_NO_MERGE, OPT_OUTPUT, OPT_TOP, OPT_SORT, OPT_HELP_DOC, OPT_LOG_LEVEL };

/* The parser's table and the help's (--help, man/hpu-trace.1,
 * docs/reference/hpu-trace.md). */
static const hpu_optspec specs[] = {
	{"output", 'o', HPU_OPT_VALUE, OPT_OUTPUT, "FILE",
	 .help = "the merged trace (default: DIR/NAME-merged.json, DIR the first PATH's directory, "
		 "NAME the files' name before -rank<R>.json)"},
	{"no-merge", 0, HPU_OPT_FLAG, OPT_NO_MERGE, NULL, .help = "only print the summary, write no file"},
	{"top", 0, HPU_OPT_VALUE, OPT_TOP, "N", .help = "print only the first N actions"},
	{"sort", 0, HPU_OPT_VALUE, OPT_SORT, "KEY",
	 .help = "order of the actions: total (default), count, mean, max (all largest first) or name"},
	{"log-level", 0, HPU_OPT_VALUE, OPT_LOG_LEVEL, "LEVEL", .help = HPU_TOOL_LOG_LEVEL_HELP,
	 .env = "HPU_LOG_LEVEL"},
	{"help", 'h', HPU_OPT_FLAG, OPT_HELP, NULL, .help = "this text"},
	/* the options' documentation (man/, docs/reference/): not listed */
	{"help-doc", 0, HPU_OPT_VALUE, OPT_HELP_DOC, .help = NULL},
	{0},
};

/* Returns -1 when parsed, OK after --help, USAGE after saying why not. */
static int parse_args(opts *o, int argc, char **argv)
{
	o->paths = xrealloc(NULL, (size_t)argc * sizeof *o->paths);
	hpu_optparse p;
	hpu__optparse_init(&p, argc, argv, specs);
	for (int r; (r = hpu__optparse_next(&p)) != HPU_OPT_END;) {
		const char *val = p.val;
		if (r == HPU_OPT_POSITIONAL) {
			o->paths[o->npaths++] = val;
		} else if (r == OPT_HELP) {
			fputs(help, stdout);
			hpu__optdoc(stdout, specs, HPU_DOC_HELP, 21);
			fputs(help_tail, stdout);
			return OK;
		} else if (r == OPT_HELP_DOC) {
			return hpu__tool_doc(specs, val, 21);
		} else if (r == OPT_NO_MERGE) {
			o->no_merge = 1;
		} else if (r == HPU_OPT_MISSING) {
			/* named as written: -o or --output */
			return hpu__tool_usage(NULL, "%s needs a value", p.arg);
		} else if (r < 0) { /* unknown, or a flag with a value */
			return hpu__tool_usage(NULL, "unknown option '%s'", p.arg);
		} else if (r == OPT_OUTPUT) {
			o->out = val;
		} else if (r == OPT_LOG_LEVEL) {
			if (hpu__tool_log_level(val))
				return USAGE;
		} else if (r == OPT_TOP) {
			if (hpu__parse_int(val, 1, 1000000, &o->top))
				return hpu__tool_usage(NULL, "--top wants a whole number of at least 1, not '%s'",
						   val);
		} else {
			static const char *keys[] = {"total", "count", "mean", "max", "name"};
			int k = 0;
			while (k < 5 && strcmp(val, keys[k]) != 0)
				k++;
			if (k == 5)
				return hpu__tool_usage(NULL, "--sort wants total, count, mean, max or name, not "
						   "'%s'",
						   val);
			sort_key = (enum sort_key)k;
		}
	}
	if (o->npaths == 0)
		return hpu__tool_usage(NULL, "no trace given: name trace files or a directory of them");
	if (o->no_merge && o->out)
		return hpu__tool_usage(NULL, "-o and --no-merge together: --no-merge writes no file");
	return -1;
}

static int run(const opts *o)
{
	inputs in = {0};
	actions s = {0};
	char *out = NULL;
	int rc = OK, first_is_dir = 0;
	for (int i = 0; i < o->npaths && rc == OK; i++) {
		struct stat st;
		if (stat(o->paths[i], &st) != 0)
			rc = fail("%s: cannot open: %s", o->paths[i], strerror(errno));
		else if (S_ISDIR(st.st_mode))
			rc = add_dir(&in, o->paths[i]), first_is_dir |= i == 0;
		else
			add_input(&in, o->paths[i]);
	}
	for (int i = 0; i < in.n && rc == OK; i++) {
		trace *t = &in.t[i];
		if ((rc = read_file(t)) != OK)
			break;
		cJSON *doc = parse(t, 0);
		rc = doc ? scan(t, doc, &s) : BAD;
		cJSON_Delete(doc);
	}
	if (rc != OK)
		goto done;
	qsort(in.t, (size_t)in.n, sizeof *in.t, by_rank);
	for (int i = 1; i < in.n; i++)
		if (in.t[i].rank == in.t[i - 1].rank) {
			rc = fail("%s and %s both hold rank %d: give each rank's trace once",
				  in.t[i - 1].path, in.t[i].path, in.t[i].rank);
			goto done;
		}
	for (int i = 1; i < in.n; i++)
		if (in.t[i].job_id && in.t[0].job_id && strcmp(in.t[i].job_id, in.t[0].job_id)) {
			warn("%s is of job %s, %s of job %s: merging traces of different jobs",
			     in.t[0].path, in.t[0].job_id, in.t[i].path, in.t[i].job_id);
			break;
		}
	if (in.t[0].world_size > in.n)
		warn("%d of the job's %d ranks given: the others are missing from the merge and "
		     "the summary",
		     in.n, in.t[0].world_size);
	if (!o->no_merge) {
		out = o->out ? xstrdup(o->out) : default_output(o->paths[0], first_is_dir, &in);
		int aligned = align(&in);
		long written = 0;
		if ((rc = write_merged(&in, out, aligned, &written)) != OK)
			goto done;
		printf("merged %d rank%s (%ld events) into %s", in.n, in.n == 1 ? "" : "s", written,
		       out);
		if (aligned > 1)
			printf("; clocks aligned at the first barrier");
		printf("\n");
	}
	summary(&s, &in, o->top);
done:
	for (int i = 0; i < in.n; i++)
		trace_free(&in.t[i]);
	free(in.t);
	for (size_t i = 0; i < s.cap; i++)
		free(s.a[i].name);
	free(s.a);
	free(out);
	return rc;
}

int main(int argc, char **argv)
{
	if (hpu__tool_start("hpu-trace") < 0)
		return HPU_TOOL_USAGE;
	opts o = {0};
	int rc = parse_args(&o, argc, argv);
	if (rc < 0)
		rc = run(&o);
	free(o.paths);
	/* the summary must have reached standard output (a full disk...) */
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fail("cannot write the standard output: %s", strerror(errno));
		rc = rc == OK ? BAD : rc;
	}
	return rc;
}
