#include "launcher/hostfile.h"
#include "common/fileio.h"
#include "common/num.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct reader {
	const char *path;
	int line;
	char *err;
	size_t errlen;
} reader;

/* Formats "FILE:LINE: message" into the reader's err; returns -1. */
static int fail(reader *r, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	snprintf(r->err, r->errlen, "%s:%d: %s", r->path, r->line, msg);
	return -1;
}

/* A whole number lo..hi written in digits only (no sign, no spaces). */
static int to_count(const char *s, int lo, int hi, int *out)
{
	return isdigit((unsigned char)*s) ? hpu__parse_int(s, lo, hi, out) : -1;
}

static int all_digits_and_dots(const char *s)
{
	for (; *s; s++)
		if (!isdigit((unsigned char)*s) && *s != '.')
			return 0;
	return 1;
}

/* "name", "name:port", "1.2.3.4" or "1.2.3.4:port" into h. */
static int parse_host(reader *r, char *tok, hpu_host *h)
{
	char *colon = strchr(tok, ':');
	if (colon && strchr(colon + 1, ':'))
		return fail(r, "bad host '%s': IPv6 addresses are not supported; use a name or an IPv4 address",
			    tok);
	if (colon) {
		*colon = 0;
		if (to_count(colon + 1, 1, 65535, &h->port) < 0)
			return fail(r, "bad port '%s' for host %s (1-65535)",
				    colon + 1, tok);
	}
	size_t n = strlen(tok);
	if (n == 0)
		return fail(r, "no host name before ':%s'", colon + 1);
	if (n >= sizeof h->name)
		return fail(r, "host name longer than %d characters",
			    (int)sizeof h->name - 1);
	int ok = isalnum((unsigned char)tok[0]);
	for (const char *c = tok; *c && ok; c++)
		ok = isalnum((unsigned char)*c) || *c == '-' || *c == '.' ||
		     *c == '_';
	if (!ok)
		return fail(r, "bad host '%s': a name (letters, digits, '-', '.', '_') or an IPv4 address",
			    tok);
	struct in_addr ip;
	if (all_digits_and_dots(tok) && inet_pton(AF_INET, tok, &ip) != 1)
		return fail(r, "bad IPv4 address '%s'", tok);
	memcpy(h->name, tok, n + 1);
	return 0;
}

/* The attributes after the host: "key=value", spaces allowed around '='. */
static int parse_attrs(reader *r, char *p, hpu_host *h)
{
	int max_slots = 0;
	for (;;) {
		while (isspace((unsigned char)*p))
			p++;
		if (!*p)
			break;
		char *key = p;
		while (isalnum((unsigned char)*p) || *p == '_' || *p == '-')
			p++;
		size_t klen = (size_t)(p - key);
		while (isspace((unsigned char)*p))
			p++;
		if (klen == 0 || *p != '=') {
			char *end = key;
			while (*end && !isspace((unsigned char)*end))
				end++;
			*end = 0;
			return fail(r, "expected slots=N after host %s, found '%s'",
				    h->name, key);
		}
		key[klen] = 0; /* p points at '=', past the key */
		p++;
		while (isspace((unsigned char)*p))
			p++;
		char *val = p;
		while (*p && !isspace((unsigned char)*p))
			p++;
		if (*p)
			*p++ = 0;
		if (!strcmp(key, "slots")) {
			if (h->slots)
				return fail(r, "slots given twice for host %s",
					    h->name);
			if (to_count(val, 1, HPU_HOSTFILE_MAX_SLOTS, &h->slots) < 0)
				return fail(r, "bad slots '%s' for host %s (a whole number 1-%d)",
					    val, h->name, HPU_HOSTFILE_MAX_SLOTS);
		} else if (!strcmp(key, "max_slots") || !strcmp(key, "max-slots")) {
			if (to_count(val, 1, INT_MAX, &max_slots) < 0)
				return fail(r, "bad max_slots '%s' for host %s (a whole number >= 1)",
					    val, h->name);
		} else {
			return fail(r, "unknown attribute '%s' for host %s (slots=N and max_slots=N are understood)",
				    key, h->name);
		}
	}
	if (max_slots && h->slots > max_slots)
		return fail(r, "host %s has slots=%d above max_slots=%d",
			    h->name, h->slots, max_slots);
	return 0;
}

/* One line (newline stripped) into h; returns 1 for a host, 0 for a blank
 * or comment line, -1 on error. */
static int parse_line(reader *r, char *line, hpu_host *h)
{
	char *hash = strchr(line, '#');
	if (hash)
		*hash = 0;
	char *p = line;
	while (isspace((unsigned char)*p))
		p++;
	if (!*p)
		return 0;
	char *tok = p;
	while (*p && !isspace((unsigned char)*p))
		p++;
	if (*p)
		*p++ = 0;
	memset(h, 0, sizeof *h);
	if (parse_host(r, tok, h) < 0 || parse_attrs(r, p, h) < 0)
		return -1;
	return 1;
}

static int check_duplicate(reader *r, const hpu_host *hosts, int n,
			   const hpu_host *h)
{
	for (int i = 0; i < n; i++)
		if (hosts[i].port == h->port && !strcasecmp(hosts[i].name, h->name)) {
			if (h->port)
				return fail(r, "duplicate host %s:%d: the same as line %d's %s:%d",
					    h->name, h->port, hosts[i].line, hosts[i].name,
					    hosts[i].port);
			return fail(r, "duplicate host %s: the same as line %d's %s", h->name,
				    hosts[i].line, hosts[i].name);
		}
	return 0;
}

/* Whether byte c may appear in a text line: not NUL, DEL or a control
 * character other than white space (UTF-8 in comments is fine). */
static int text_byte(int c)
{
	return c >= 0x20 ? c != 0x7f : c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* Reads the next line (without its newline) into buf; 1: a line, 0: end
 * of file, -1: error (a read error, a byte that is not text, a line
 * longer than HPU_HOSTFILE_MAX_LINE). */
static int next_line(reader *r, FILE *f, char *buf, size_t size)
{
	size_t n = 0;
	int c, too_long = 0;
	while ((c = getc(f)) != EOF && c != '\n') {
		if (!text_byte(c)) {
			r->line++;
			if (c == 0)
				return fail(r, "a NUL byte: not a text file");
			return fail(r, "a control character (byte 0x%02x): not a text file", c);
		}
		if (n < size - 1)
			buf[n++] = (char)c;
		else
			too_long = 1;
	}
	if (c == EOF && ferror(f)) {
		snprintf(r->err, r->errlen, "cannot read the hostfile %s: %s",
			 r->path, strerror(errno));
		return -1;
	}
	if (c == EOF && n == 0 && !too_long)
		return 0;
	r->line++;
	buf[n] = 0;
	if (n && buf[n - 1] == '\r')
		buf[--n] = 0;
	if (too_long || n > HPU_HOSTFILE_MAX_LINE)
		return fail(r, "line longer than %d characters",
			    HPU_HOSTFILE_MAX_LINE);
	return 1;
}

int hpu__hostfile_read(const char *path, hpu_host **hosts, int *nhosts,
		       char *err, size_t errlen)
{
	reader r = {.path = path, .err = err, .errlen = errlen};
	hpu_host *list = NULL, h;
	int n = 0, cap = 0, rc;
	char buf[HPU_HOSTFILE_MAX_LINE + 2]; /* the line, '\r', NUL */
	*hosts = NULL;
	*nhosts = 0;
	const char *why;
	FILE *f = hpu__open_input(path, &why); /* a FIFO would block */
	if (!f) {
		snprintf(err, errlen, "cannot read the hostfile %s: %s", path, why);
		return -1;
	}
	while ((rc = next_line(&r, f, buf, sizeof buf)) > 0) {
		rc = parse_line(&r, buf, &h);
		if (rc < 0)
			goto fail;
		if (rc == 0)
			continue;
		h.line = r.line;
		if (check_duplicate(&r, list, n, &h) < 0)
			goto fail;
		if (n == HPU_HOSTFILE_MAX_HOSTS) {
			fail(&r, "more than %d hosts", HPU_HOSTFILE_MAX_HOSTS);
			goto fail;
		}
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			hpu_host *grown = realloc(list, (size_t)cap * sizeof *grown);
			if (!grown) {
				fail(&r, "out of memory");
				goto fail;
			}
			list = grown;
		}
		list[n++] = h;
	}
	if (rc < 0)
		goto fail;
	if (n == 0) {
		snprintf(err, errlen, "%s: no hosts in the hostfile (%s)", path,
			 r.line ? "only blank lines and comments" : "the file is empty");
		goto fail;
	}
	fclose(f);
	*hosts = list;
	*nhosts = n;
	return 0;
fail:
	fclose(f);
	free(list);
	return -1;
}
