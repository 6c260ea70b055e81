/* log: levelled lines on stderr, one write(2) each, with journald's
 * priorities when stderr is the journal stream (see log.h). */
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/env.h"
#include "common/fileio.h"

#define PREFIX_MAX 128
#define LINE_MAX_ 4096 /* a longer line is cut, and still ends in "\n" */

static struct {
	char prefix[PREFIX_MAX];
	atomic_int level;
	atomic_int journal;
	atomic_int from_env;
	atomic_int inited;
	atomic_int write_errno;        /* of the first write that failed */
	int named;                    /* JOURNAL_STREAM was read: */
	unsigned long long jdev, jino; /* the stream it names */
} L = {.level = HPU_LOG_INFO};

static pthread_once_t once = PTHREAD_ONCE_INIT;

static const char *const names[] = {
	[HPU_LOG_ERROR] = "error", [HPU_LOG_WARNING] = "warning", [HPU_LOG_NOTICE] = "notice",
	[HPU_LOG_INFO] = "info",   [HPU_LOG_DEBUG] = "debug",
};

const char *hpu__log_level_name(hpu_log_level lvl)
{
	return lvl >= HPU_LOG_ERROR && lvl <= HPU_LOG_DEBUG ? names[lvl] : "?";
}

int hpu__log_parse_level(const char *s, const char *what, hpu_log_level *out, char *err,
			 size_t errlen)
{
	for (int l = HPU_LOG_ERROR; s && l <= HPU_LOG_DEBUG; l++)
		if (strcmp(s, names[l]) == 0) {
			*out = (hpu_log_level)l;
			return 0;
		}
	if (s && strcmp(s, "warn") == 0) {
		*out = HPU_LOG_WARNING;
		return 0;
	}
	snprintf(err, errlen, "%s%s'%s' is not a log level (error, warning, notice, info or debug)",
		 what ? what : "", what ? ": " : "", s ? s : "");
	return -1;
}

/* Whether stderr is the stream JOURNAL_STREAM named (async-signal-safe). */
static int stderr_is_named(void)
{
	struct stat st;
	return L.named && fstat(STDERR_FILENO, &st) == 0 &&
	       (unsigned long long)st.st_dev == L.jdev && (unsigned long long)st.st_ino == L.jino;
}

/* Whether stderr is a stream to journald: JOURNAL_STREAM ("DEV:INO", set
 * by systemd for StandardError=journal) names the device and inode of
 * stderr itself (so not after stderr was redirected elsewhere). */
static int stderr_is_journal(void)
{
	const char *v = hpu__env_str(HPU_ENV_JOURNAL_STREAM);
	int end = 0;
	L.named = v && sscanf(v, "%llu:%llu%n", &L.jdev, &L.jino, &end) == 2 && !v[end];
	return stderr_is_named();
}

/* Reads HPU_LOG_LEVEL and JOURNAL_STREAM. */
static int read_env(char *err, size_t errlen)
{
	const char *v = hpu__env_str(HPU_ENV_HPU_LOG_LEVEL);
	hpu_log_level lvl = HPU_LOG_INFO;
	int rc = 0;
	atomic_store(&L.from_env, 0);
	if (v && *v) {
		rc = hpu__log_parse_level(v, "HPU_LOG_LEVEL", &lvl, err, errlen);
		if (rc == 0)
			atomic_store(&L.from_env, 1);
		else
			lvl = HPU_LOG_INFO;
	}
	atomic_store(&L.level, lvl);
	atomic_store(&L.journal, stderr_is_journal());
	atomic_store(&L.inited, 1);
	return rc;
}

/* A program that never called hpu__log_init: its own name, the
 * environment's level (a bad one is taken as info). */
static void default_init(void)
{
	char err[160];
	if (atomic_load(&L.inited))
		return;
	snprintf(L.prefix, sizeof L.prefix, "%s", program_invocation_short_name);
	read_env(err, sizeof err);
}

static void ensure(void)
{
	if (!atomic_load(&L.inited))
		pthread_once(&once, default_init);
}

int hpu__log_init(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(L.prefix, sizeof L.prefix, fmt, ap);
	va_end(ap);
	return read_env(err, errlen);
}

void hpu__log_set_prefix(const char *fmt, ...)
{
	ensure();
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(L.prefix, sizeof L.prefix, fmt, ap);
	va_end(ap);
}

const char *hpu__log_prefix(void)
{
	ensure();
	return L.prefix;
}

void hpu__log_set_level(hpu_log_level lvl)
{
	ensure();
	atomic_store(&L.level, lvl);
}

hpu_log_level hpu__log_get_level(void)
{
	ensure();
	return (hpu_log_level)atomic_load(&L.level);
}

int hpu__log_level_from_env(void)
{
	ensure();
	return atomic_load(&L.from_env);
}

int hpu__log_enabled(hpu_log_level lvl)
{
	ensure();
	return (int)lvl <= atomic_load(&L.level);
}

int hpu__log_write_errno(void)
{
	return atomic_load(&L.write_errno);
}

int hpu__log_journal(void)
{
	ensure();
	return atomic_load(&L.journal);
}

/* Writes the whole of buf to stderr (one write, unless it is cut short). */
static void put(const char *buf, size_t n)
{
	while (n > 0) {
		/* interrupted by the user: not held by a stderr nobody reads
		 * (common/fileio.h) */
		if (hpu__write_wait(STDERR_FILENO) < 0)
			return;
		ssize_t w = write(STDERR_FILENO, buf, hpu__write_watch && n > 4096 ? 4096 : n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) { /* stderr itself failed: nowhere left to say it */
			int zero = 0;
			atomic_compare_exchange_strong(&L.write_errno, &zero, w < 0 ? errno : EIO);
			return;
		}
		buf += w;
		n -= (size_t)w;
	}
}

/* "<N>" (journal only), then `prefix: ` (if any), then the text, "\n". */
static void line(hpu_log_level lvl, int with_prefix, const char *fmt, va_list ap)
{
	char buf[LINE_MAX_];
	size_t n = 0;
	if (!hpu__log_enabled(lvl))
		return;
	if (atomic_load(&L.journal))
		n += (size_t)snprintf(buf, sizeof buf, "<%d>", (int)lvl);
	if (with_prefix && L.prefix[0])
		n += (size_t)snprintf(buf + n, sizeof buf - n, "%s: ", L.prefix);
	int t = vsnprintf(buf + n, sizeof buf - n, fmt, ap);
	n = t < 0 ? n : n + (size_t)t < sizeof buf - 1 ? n + (size_t)t : sizeof buf - 2;
	buf[n++] = '\n';
	put(buf, n);
}

void hpu__log(hpu_log_level lvl, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	line(lvl, 1, fmt, ap);
	va_end(ap);
}

void hpu__log_plain(hpu_log_level lvl, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	line(lvl, 0, fmt, ap);
	va_end(ap);
}

/* Appends s to buf (of PREFIX_MAX + LINE_MAX_) at *n, cut to fit. */
static void append(char *buf, size_t cap, size_t *n, const char *s)
{
	size_t len = strlen(s);
	if (len > cap - *n)
		len = cap - *n;
	memcpy(buf + *n, s, len);
	*n += len;
}

void hpu__log_sigsafe(hpu_log_level lvl, const char *text)
{
	char buf[PREFIX_MAX + 512], pri[4] = {'<', (char)('0' + (int)lvl), '>', 0};
	size_t n = 0;
	/* No ensure(): pthread_once is not async-signal-safe. A program
	 * that logs from a child has set its prefix by then. The child's
	 * stderr may be another stream than its parent's (a pipe). */
	if ((int)lvl > atomic_load(&L.level))
		return;
	if (stderr_is_named())
		append(buf, sizeof buf - 1, &n, pri);
	if (L.prefix[0]) {
		append(buf, sizeof buf - 1, &n, L.prefix);
		append(buf, sizeof buf - 1, &n, ": ");
	}
	append(buf, sizeof buf - 1, &n, text);
	buf[n++] = '\n';
	put(buf, n);
}

void hpu__log_list_add(char *names, size_t len, size_t *used, const char *item)
{
	if (*used >= len)
		return;
	int k = snprintf(names + *used, len - *used, "%s%s", *used > 0 ? ", " : "", item);
	*used += k > 0 ? (size_t)k : 0;
	if (*used >= len && len > 4)
		memcpy(names + len - 4, "...", 4);
}
