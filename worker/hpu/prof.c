/* prof: see prof.h. */
#include "worker/hpu/prof.h"

#include <hpu/hpu.h>
#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/fileio.h"

#define TAIL "\n]}\n"
#define FLUSH_AT (256u * 1024u) /* buffered bytes that force a flush */
#define MAX_OPEN 64             /* the model's nested ranges per thread */

_Atomic int hpu__prof_enabled;
int hpu__prof_in_eval;

static struct {
	pthread_mutex_t mu;
	int fd;
	int rank;
	int pid;      /* the events' pid: rank + 1 (Perfetto treats pid 0 as
		       * the kernel's swapper) */
	char path[1100];
	off_t end;    /* where the tail starts in the file */
	char *buf;    /* events not written yet, then room for the tail */
	size_t len, cap;
	long events;  /* written or buffered: the first has no comma */
	int failed;   /* a write failed: profiling stopped, said once */
	int paused;   /* outside --profile-warmup-steps/--profile-steps' window */
	/* What profiling cost this process: time inside the recording and
	 * flushing calls (written at close as the "profiler" instant event). */
	int64_t record_ns, flush_ns;
	long flushes;
} P = {.mu = PTHREAD_MUTEX_INITIALIZER, .fd = -1};

/* Whether a trace is open (recording or paused): the model's ranges are
 * kept while paused too, so that a stop matches its start. */
static int trace_open(void)
{
	return P.fd >= 0 && !P.failed;
}

/* The calling thread's row; 0: not named yet (then the collectives' row:
 * the only unnamed thread that records is the progress thread). */
static __thread int my_tid;
static atomic_int next_tid = HPU_PROF_LOADER + 1;

/* The model's open ranges on this thread (hpu_profile_start). */
static __thread struct {
	char name[128];
	int64_t t0;
} open_ranges[MAX_OPEN];
static __thread int nopen;

/* hpu__prof_set_sync's wait (set before the trace opens, read after) */
static void (*device_sync)(void);

static int mkdirs(const char *dir)
{
	char p[1024];
	if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
		return errno = ENAMETOOLONG, -1;
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0777) < 0 && errno != EEXIST)
			return -1;
		*s = '/';
	}
	return mkdir(p, 0777) < 0 && errno != EEXIST ? -1 : 0;
}

static int reserve(size_t more)
{
	if (P.len + more + sizeof TAIL <= P.cap)
		return 0;
	size_t cap = P.cap ? P.cap : 64 * 1024;
	while (P.len + more + sizeof TAIL > cap)
		cap *= 2;
	char *b = realloc(P.buf, cap);
	if (!b)
		return -1;
	P.buf = b;
	P.cap = cap;
	return 0;
}

/* Writes the buffer and the tail where the tail was; mu held. */
static void flush_locked(void)
{
	if (P.fd < 0 || P.len == 0)
		return;
	memcpy(P.buf + P.len, TAIL, sizeof TAIL - 1);
	size_t n = P.len + sizeof TAIL - 1;
	ssize_t w = pwrite(P.fd, P.buf, n, P.end);
	int e = errno;
	if (w >= 0 && (size_t)w < n) { /* the rest, whose error says why (a full disk) */
		ssize_t more = pwrite(P.fd, P.buf + w, n - (size_t)w, P.end + (off_t)w);
		e = more < 0 ? errno : 0;
		if (more == (ssize_t)(n - (size_t)w))
			w = (ssize_t)n;
	}
	if (w != (ssize_t)n) {
		/* a short write may have overwritten the tail: put it back and
		 * cut what fit of the events after it, so that the file still
		 * parses (what fit stays unlisted) */
		(void)!pwrite(P.fd, TAIL + 1, sizeof TAIL - 2, P.end);
		(void)!ftruncate(P.fd, P.end + (off_t)(sizeof TAIL - 2));
		if (!P.failed)
			hpu__log(HPU_LOG_WARNING, "profiling stopped: writing %s: %s", P.path,
				 w < 0 || e ? strerror(e) : "short write");
		P.failed = 1;
		hpu__prof_enabled = 0;
		P.len = 0;
		return;
	}
	P.end += (off_t)P.len;
	P.len = 0;
}

/* Appends one event line (without its leading comma); mu held. */
static void add_locked(const char *line, size_t n)
{
	if (P.fd < 0 || reserve(n + 2) < 0)
		return;
	if (P.events++ > 0)
		P.buf[P.len++] = ',';
	memcpy(P.buf + P.len, line, n);
	P.len += n;
	P.buf[P.len++] = '\n';
	if (P.len >= FLUSH_AT)
		flush_locked();
}

/* Appends s as the inside of a JSON string (quotes, backslashes and
 * control characters escaped); returns the new length. */
static size_t put_escaped(char *dst, size_t at, size_t cap, const char *s)
{
	for (; *s && at + 7 < cap; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			dst[at++] = '\\';
			dst[at++] = (char)c;
		} else if (c < 0x20) {
			at += (size_t)snprintf(dst + at, cap - at, "\\u%04x", c);
		} else {
			dst[at++] = (char)c;
		}
	}
	dst[at] = 0;
	return at;
}

static void meta(int tid, const char *kind, const char *name)
{
	char line[320];
	size_t n = (size_t)snprintf(line, sizeof line,
				    "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"",
				    kind, P.pid, tid);
	n = put_escaped(line, n, sizeof line - 4, name);
	n += (size_t)snprintf(line + n, sizeof line - n, "\"}}");
	pthread_mutex_lock(&P.mu);
	add_locked(line, n);
	pthread_mutex_unlock(&P.mu);
}

static char *header(const hpu_prof_conf *c)
{
	char host[256] = "";
	gethostname(host, sizeof host - 1);
	cJSON *o = cJSON_CreateObject(), *d = cJSON_AddObjectToObject(o, "otherData");
	cJSON_AddStringToObject(d, "tool", "hputrain");
	cJSON_AddNumberToObject(d, "version", 1);
	cJSON_AddNumberToObject(d, "rank", c->rank);
	cJSON_AddNumberToObject(d, "world_size", c->world);
	cJSON_AddNumberToObject(d, "node_rank", c->node_rank);
	cJSON_AddStringToObject(d, "hostname", host);
	cJSON_AddStringToObject(d, "job_id", c->job_id ? c->job_id : "");
	cJSON_AddNumberToObject(d, "attempt", c->attempt);
	cJSON_AddStringToObject(d, "model", c->model ? c->model : "");
	cJSON_AddStringToObject(d, "strategy", c->strategy ? c->strategy : "");
	cJSON_AddStringToObject(d, "precision", c->precision ? c->precision : "");
	cJSON_AddStringToObject(d, "clock", "CLOCK_MONOTONIC");
	/* no displayTimeUnit: older trace processors read it as the unit of
	 * ts (which is microseconds) */
	char *s = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	if (!s)
		return NULL;
	/* {...} becomes {...,"traceEvents":[\n */
	size_t n = strlen(s);
	char *h = realloc(s, n + 32);
	if (!h) {
		free(s);
		return NULL;
	}
	snprintf(h + n - 1, 32, ",\"traceEvents\":[\n");
	return h;
}

int hpu__prof_open(const hpu_prof_conf *c, char *err, size_t errlen)
{
	if (mkdirs(c->dir) < 0) {
		snprintf(err, errlen, "--profile: cannot create the directory %s: %s", c->dir,
			 strerror(errno));
		return -1;
	}
	snprintf(P.path, sizeof P.path, "%s/%s-rank%d.json", c->dir, c->name, c->rank);
	char *h = header(c);
	const char *why = h ? NULL : "out of memory";
	int fd = h ? hpu__open_unshared(P.path, 0, 0644, &why) : -1; /* not another job's */
	if (fd >= 0 && why) { /* a lock that is not a job's, ignored */
		hpu__log(HPU_LOG_WARNING, "warning: %s: %s", P.path, why);
		why = NULL;
	}
	size_t hn = h ? strlen(h) : 0;
	if (fd >= 0 && (pwrite(fd, h, hn, 0) != (ssize_t)hn ||
			pwrite(fd, TAIL + 1, sizeof TAIL - 2, (off_t)hn) != (ssize_t)(sizeof TAIL - 2)))
		why = strerror(errno);
	if (fd < 0 || why != NULL) {
		snprintf(err, errlen, "--profile: cannot write %s: %s%s", P.path, why,
			 why == hpu__in_use_why ? " --profile directory or --profile-filename" : "");
		if (fd >= 0)
			close(fd);
		free(h);
		return -1;
	}
	free(h);
	P.fd = fd;
	P.rank = c->rank;
	P.pid = c->rank + 1;
	P.end = (off_t)hn;
	P.events = 0;
	P.failed = 0;
	P.paused = 0;
	char pname[64];
	snprintf(pname, sizeof pname, "rank %d", c->rank);
	meta(0, "process_name", pname);
	meta(HPU_PROF_MAIN, "thread_name", "main");
	meta(HPU_PROF_COMM, "thread_name", "collectives");
	meta(HPU_PROF_LOADER, "thread_name", "data loader");
	my_tid = HPU_PROF_MAIN;
	hpu__prof_enabled = 1;
	pthread_mutex_lock(&P.mu);
	flush_locked();
	pthread_mutex_unlock(&P.mu);
	return 0;
}

void hpu__prof_pause(int paused)
{
	pthread_mutex_lock(&P.mu);
	P.paused = paused;
	hpu__prof_enabled = P.fd >= 0 && !P.failed && !paused;
	pthread_mutex_unlock(&P.mu);
}

void hpu__prof_thread(int tid)
{
	my_tid = tid;
}

void hpu__prof_set_sync(void (*wait)(void))
{
	device_sync = wait;
}

void hpu__prof_sync(void)
{
	if (device_sync && my_tid == HPU_PROF_MAIN)
		device_sync();
}

/* The row of a thread that records ranges for the first time (a model's
 * own thread), named in the trace. */
static int own_row(void)
{
	if (!my_tid) {
		my_tid = atomic_fetch_add(&next_tid, 1);
		char name[32];
		snprintf(name, sizeof name, "thread %d", my_tid);
		meta(my_tid, "thread_name", name);
	}
	return my_tid;
}

static void span_v(int tid, const char *cat, const char *name, const char *sub, int64_t t0,
		   int64_t t1, const char *args, va_list ap)
{
	char line[4096]; /* the longest args: graph_replay's nodes, 2 KiB */
	size_t n = (size_t)snprintf(line, sizeof line, "{\"name\":\"");
	n = put_escaped(line, n, 400, name);
	if (sub) {
		line[n++] = ':';
		n = put_escaped(line, n, 600, sub);
	}
	n += (size_t)snprintf(line + n, sizeof line - n,
			      "\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f",
			      cat, P.pid, tid, (double)t0 / 1e3,
			      (double)(t1 - t0) / 1e3);
	if (args && n + 12 < sizeof line) {
		n += (size_t)snprintf(line + n, sizeof line - n, ",\"args\":{");
		int k = vsnprintf(line + n, sizeof line - n - 4, args, ap);
		if (k < 0 || (size_t)k >= sizeof line - n - 4)
			return; /* cannot happen with the runtime's formats */
		n += (size_t)k;
		line[n++] = '}';
	}
	line[n++] = '}';
	pthread_mutex_lock(&P.mu);
	add_locked(line, n);
	P.record_ns += hpu__prof_now() - t1;
	pthread_mutex_unlock(&P.mu);
}

void hpu__prof_span(const char *cat, const char *name, const char *sub, int64_t t0,
		    const char *args, ...)
{
	if (!hpu__prof_enabled || t0 == 0) /* 0: begun while paused */
		return;
	hpu__prof_sync();
	va_list ap;
	va_start(ap, args);
	span_v(own_row(), cat, name, sub, t0, hpu__prof_now(), args, ap);
	va_end(ap);
}

static void span_at(int tid, const char *cat, const char *name, int64_t t0, int64_t t1,
		    const char *args, ...) __attribute__((format(printf, 6, 7)));

static void span_at(int tid, const char *cat, const char *name, int64_t t0, int64_t t1,
		    const char *args, ...)
{
	va_list ap;
	va_start(ap, args);
	span_v(tid, cat, name, NULL, t0, t1, args, ap);
	va_end(ap);
}

static const char *dtype_name(hpucoll_dtype d)
{
	switch (d) {
	case HPUCOLL_F32: return "f32";
	case HPUCOLL_F64: return "f64";
	case HPUCOLL_BF16: return "bf16";
	case HPUCOLL_F16: return "f16";
	case HPUCOLL_I32: return "i32";
	case HPUCOLL_I64: return "i64";
	case HPUCOLL_U8: return "u8";
	default: return "?";
	}
}

void hpu__prof_collective(void *arg, const hpucoll_event *ev)
{
	(void)arg;
	if (!hpu__prof_enabled)
		return;
	span_at(my_tid ? my_tid : HPU_PROF_COMM, "collective", ev->name, ev->start_ns, ev->end_ns,
		"\"bytes\":%llu,\"algorithm\":\"%s\",\"seq\":%u,\"sent\":%llu,\"dtype\":\"%s\","
		"\"async\":%d%s",
		(unsigned long long)ev->bytes, ev->algorithm, ev->seq,
		(unsigned long long)ev->sent, dtype_name(ev->dtype), ev->async,
		ev->rc ? ",\"failed\":1" : "");
}

void hpu__prof_flush(void)
{
	if (!trace_open()) /* paused too: what the window recorded */
		return;
	int64_t t0 = hpu__prof_now();
	pthread_mutex_lock(&P.mu);
	flush_locked();
	P.flush_ns += hpu__prof_now() - t0;
	P.flushes++;
	pthread_mutex_unlock(&P.mu);
}

/* The "profiler" instant event: what recording cost this rank. */
static void cost_event(void)
{
	char line[400];
	int64_t now = hpu__prof_now();
	pthread_mutex_lock(&P.mu);
	size_t n = (size_t)snprintf(
		line, sizeof line,
		"{\"name\":\"profiler\",\"cat\":\"profiler\",\"ph\":\"i\",\"s\":\"p\",\"pid\":%d,"
		"\"tid\":%d,\"ts\":%.3f,\"args\":{\"events\":%ld,\"record_ms\":%.3f,"
		"\"flush_ms\":%.3f,\"flushes\":%ld}}",
		P.pid, HPU_PROF_MAIN, (double)now / 1e3, P.events, (double)P.record_ns / 1e6,
		(double)P.flush_ns / 1e6, P.flushes);
	add_locked(line, n);
	pthread_mutex_unlock(&P.mu);
}

void hpu__prof_close(void)
{
	if (P.fd < 0)
		return;
	while (nopen > 0) { /* ranges the model did not stop: closed here */
		nopen--;
		hpu__prof_span("user", open_ranges[nopen].name, NULL, open_ranges[nopen].t0,
			       "\"unclosed\":1");
	}
	if (!P.failed)
		cost_event();
	pthread_mutex_lock(&P.mu);
	flush_locked();
	hpu__prof_enabled = 0;
	close(P.fd);
	P.fd = -1;
	free(P.buf);
	P.buf = NULL;
	P.len = P.cap = 0;
	pthread_mutex_unlock(&P.mu);
}

/* ---- the model's API (hpu.h) ---- */

void hpu_profile_start(const char *action)
{
	if (!trace_open() || !action)
		return;
	if (nopen == MAX_OPEN) {
		static atomic_int said;
		if (!atomic_exchange(&said, 1))
			hpu__log(HPU_LOG_WARNING, "hpu_profile_start(\"%s\"): more than %d ranges open at once; ignored",
				 action, MAX_OPEN);
		return;
	}
	snprintf(open_ranges[nopen].name, sizeof open_ranges[nopen].name, "%s", action);
	open_ranges[nopen++].t0 = hpu__prof_enabled ? hpu__prof_now() : 0; /* 0: not recorded */
}

void hpu_profile_stop(const char *action)
{
	if (!trace_open() || !action)
		return;
	for (int i = nopen - 1; i >= 0; i--) {
		if (strncmp(open_ranges[i].name, action, sizeof open_ranges[i].name - 1) != 0)
			continue;
		hpu__prof_span("user", open_ranges[i].name, NULL, open_ranges[i].t0, NULL);
		memmove(&open_ranges[i], &open_ranges[i + 1], (size_t)(nopen - i - 1) * sizeof open_ranges[0]);
		nopen--;
		return;
	}
	static atomic_int said;
	if (!atomic_exchange(&said, 1))
		hpu__log(HPU_LOG_WARNING, "hpu_profile_stop(\"%s\") without hpu_profile_start; ignored",
			 action);
}
