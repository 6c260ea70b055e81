/* conf: hpud's configuration file. Each key has a parser that checks and
 * stores its value; the file is read into a copy of the caller's struct,
 * which is copied back only when every line was good, so that a bad file
 * (or a SIGHUP reload of one) leaves the running configuration alone. */
#include "daemon/conf.h"
#include "agent/gpus.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/num.h"
#include "common/optdoc.h"
#include "proto/auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_DEVICES 1024
#define MAX_CLOCK_WINDOW_S ((double)HPU_AUTH_WINDOW_MAX_S)

/* The word after "hpud: " in hpud's own lines ("hpud: warning: ..."); the
 * levels log_level takes are common/log.c's. */
static const char *const line_words[] = {"error", "warning", "info", "debug"};

const char *hpud__log_level_name(hpud_log_level l)
{
	if ((unsigned)l >= sizeof line_words / sizeof line_words[0])
		return "?";
	return line_words[l];
}

void hpud__conf_defaults(hpud_conf *c)
{
	memset(c, 0, sizeof *c);
	strcpy(c->listen, "0.0.0.0");
	c->port = 29400;
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	c->devices = n < 1 ? 1 : n > MAX_DEVICES ? MAX_DEVICES : (int)n;
	c->devices_auto = 1;
	strcpy(c->device, "cpu");
	strcpy(c->key_path, "/etc/hpud/secret.key");
	c->log_level = HPU_LOG_INFO;
	c->clock_window_s = 30;
	c->submitter_timeout_s = 10;
	c->output_buffer = 4 << 20;
}

/* ---- value parsers: 0, or -1 with the reason (after "key 'k': ") ---- */

/* An integer lo..hi, all of v. */
static int parse_int(const char *v, int lo, int hi, int *out, char *why,
		     size_t whylen)
{
	if (hpu__parse_int(v, lo, hi, out)) {
		snprintf(why, whylen, "'%s' is not an integer from %d to %d",
			 v, lo, hi);
		return -1;
	}
	return 0;
}

/* A number of seconds in (0, hi]; hi may be HUGE_VAL (no bound). */
static int parse_seconds(const char *v, double lo, double hi, double *out, char *why,
			 size_t whylen)
{
	/* at least lo (above 0 where lo is 0), and finite */
	if (hpu__parse_double(v, lo > 0 ? lo : DBL_TRUE_MIN, hi < HUGE_VAL ? hi : DBL_MAX, out)) {
		char low[48];
		if (lo > 0)
			snprintf(low, sizeof low, ">= %g", lo);
		else
			snprintf(low, sizeof low, "> 0");
		if (hi < HUGE_VAL)
			snprintf(why, whylen, "'%s' is not a number of seconds %s and <= %g", v, low, hi);
		else
			snprintf(why, whylen, "'%s' is not a number of seconds %s", v, low);
		return -1;
	}
	return 0;
}

static int parse_string(const char *v, char *dst, size_t cap, char *why,
			size_t whylen)
{
	size_t n = strlen(v);
	if (n >= cap) {
		snprintf(why, whylen,
			 "value too long (%zu characters, at most %zu)", n,
			 cap - 1);
		return -1;
	}
	memcpy(dst, v, n + 1);
	return 0;
}

static int set_listen(hpud_conf *c, const char *v, char *why, size_t whylen)
{
	struct in_addr a;
	if (strlen(v) >= sizeof c->listen || inet_pton(AF_INET, v, &a) != 1) {
		snprintf(why, whylen, "'%s' is not a numeric IPv4 address", v);
		return -1;
	}
	strcpy(c->listen, v);
	return 0;
}

static int set_port(hpud_conf *c, const char *v, char *why, size_t whylen)
{
	return parse_int(v, 1, 65535, &c->port, why, whylen);
}

static int set_devices(hpud_conf *c, const char *v, char *why, size_t whylen)
{
	if (!strcmp(v, "auto")) {
		c->devices_auto = 1;
		return 0;
	}
	if (hpu__parse_int(v, 1, MAX_DEVICES, &c->devices)) {
		snprintf(why, whylen, "'%s' is not an integer from 1 to %d, or auto", v, MAX_DEVICES);
		return -1;
	}
	c->devices_auto = 0;
	return 0;
}

static const char *const device_names[] = {"cpu", "cpu-strict", "cuda", "auto"};
#define NDEVICES (sizeof device_names / sizeof device_names[0])

static int set_device(hpud_conf *c, const char *v, char *why, size_t whylen)
{
	for (size_t i = 0; i < NDEVICES; i++)
		if (!strcmp(v, device_names[i])) {
			snprintf(c->device, sizeof c->device, "%s", v);
			return 0;
		}
	snprintf(why, whylen, "'%s' is not a device (cpu, cpu-strict, cuda or auto)", v);
	return -1;
}

/* A relative path was hpud's working directory's (/ under systemd), not
 * the configuration file's: only an absolute one. */
static int absolute(const char *v, char *why, size_t whylen)
{
	if (v[0] == '/')
		return 0;
	snprintf(why, whylen, "'%s' is not an absolute path (hpud would look for it in its "
		 "working directory, / under systemd)", v);
	return -1;
}

static int set_key(hpud_conf *c, const char *v, char *why, size_t whylen)
{
	if (absolute(v, why, whylen) < 0)
		return -1;
	return parse_string(v, c->key_path, sizeof c->key_path, why, whylen);
}

/* A user name: 1..63 of [a-z0-9_-]; whether it exists is hpud's check. */
static int set_user(hpud_conf *c, const char *v, char *why, size_t whylen)
{
	size_t n = strlen(v);
	if (n >= sizeof c->user) {
		snprintf(why, whylen,
			 "user name too long (%zu characters, at most %zu)", n,
			 sizeof c->user - 1);
		return -1;
	}
	if (strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789_-") != n) {
		snprintf(why, whylen,
			 "'%s' is not a user name (only a-z, 0-9, '_' and '-')",
			 v);
		return -1;
	}
	memcpy(c->user, v, n + 1);
	return 0;
}

static int set_log_level(hpud_conf *c, const char *v, char *why,
			 size_t whylen)
{
	/* the levels hpud --log-level and HPU_LOG_LEVEL take, "warn" too */
	return hpu__log_parse_level(v, NULL, &c->log_level, why, whylen);
}

static int set_clock_window(hpud_conf *c, const char *v, char *why,
			    size_t whylen)
{
	/* a request's stamp is in whole milliseconds, and clocks differ:
	 * below a second every request was stale ("0.0 s in the past (the
	 * window is 0.0 s)") */
	return parse_seconds(v, 1, MAX_CLOCK_WINDOW_S, &c->clock_window_s, why, whylen);
}

static int set_worker(hpud_conf *c, const char *v, char *why, size_t whylen)
{
	if (absolute(v, why, whylen) < 0) /* as the key's (it was taken) */
		return -1;
	return parse_string(v, c->worker, sizeof c->worker, why, whylen);
}

static int set_submitter_timeout(hpud_conf *c, const char *v, char *why,
				 size_t whylen)
{
	/* the submitter pings every second (launcher/submit.c): a timeout
	 * below three pings cancelled healthy jobs, "went away" */
	return parse_seconds(v, 3, HUGE_VAL, &c->submitter_timeout_s, why, whylen);
}

/* A size in bytes: digits, then K, M or G (KiB, MiB, GiB) or nothing;
 * 64 KiB .. 1 GiB. */
static int set_output_buffer(hpud_conf *c, const char *v, char *why, size_t whylen)
{
	const char *end;
	uint64_t x;
	int bad = v[0] < '0' || v[0] > '9' || hpu__parse_u64_prefix(v, &end, &x);
	int shift = bad ? 0 : *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
	if (shift)
		end++;
	if (bad || *end || x > (1ULL << 30) >> shift || x << shift < (64ULL << 10)) {
		snprintf(why, whylen,
			 "'%s' is not a size from 64K to 1G (bytes, or a number "
			 "and K, M or G)",
			 v);
		return -1;
	}
	c->output_buffer = (size_t)(x << shift);
	return 0;
}

/* A range of uids "FIRST-LAST", 1 .. 2^31-2, at most 65536 of them. */
static int set_job_uids(hpud_conf *c, const char *v, char *why, size_t whylen)
{
	const char *end;
	uint64_t a, b;
	int ok = v[0] >= '0' && v[0] <= '9' && !hpu__parse_u64_prefix(v, &end, &a) &&
		 *end == '-' && end[1] >= '0' && end[1] <= '9' &&
		 !hpu__parse_u64(end + 1, 1, 0x7ffffffe, &b) && a >= 1 && a <= b && b - a < 65536;
	if (!ok) {
		snprintf(why, whylen,
			 "'%s' is not a range of uids FIRST-LAST (1 to 2147483646, "
			 "at most 65536 of them)",
			 v);
		return -1;
	}
	c->job_uid_first = (unsigned)a;
	c->job_uid_last = (unsigned)b;
	return 0;
}

/* Every key: its parser, and what the documentation says of it (the
 * keys of man/hpud.conf.5 and docs/reference/hpud.conf.md). */
static const struct conf_key {
	const char *name;
	int (*set)(hpud_conf *c, const char *v, char *why, size_t whylen);
	const char *arg, *help;
} keys[] = {
	{"listen", set_listen, "ADDRESS", "the numeric IPv4 address of the control socket (0.0.0.0)"},
	{"port", set_port, "PORT", "the control socket's TCP port, 1..65535 (29400)"},
	{"devices", set_devices, "N|auto", "devices (workers) this node offers, 1..1024, or auto: counted as "
					   "hpulaunch's --devices auto counts for the device below (auto)"},
	{"device", set_device, "NAME", "what devices = auto counts, as hpulaunch's --device: cpu and "
				       "cpu-strict the online CPU cores, cuda the GPUs that the worker's "
				       "--count-gpus sees (none: hpud does not start, naming why), auto "
				       "those or else the cores; the jobs' workers compute on their own "
				       "--device (cpu)"},
	{"key", set_key, "FILE", "the cluster secret, made by hpud --gen-key, an absolute path; it and "
				 "the directories above it must belong to root or hpud's user, writable "
				 "by no one else (/etc/hpud/secret.key)"},
	{"user", set_user, "NAME", "run the workers as this user (a-z, 0-9, '_', '-'); hpud running as root "
				   "needs it, and runs workers as root only if it says root (hpud's own user)"},
	{"log_level", set_log_level, "LEVEL", "error | warning | notice | info | debug, as hpud --log-level (warn is taken for warning); HPU_LOG_LEVEL or --log-level overrides it (info)"},
	{"clock_window", set_clock_window, "S", "seconds a signed request's clock may be off, 1 to 3600 "
						"(30)"},
	{"worker", set_worker, "PATH", "the worker program, an absolute path to a regular file (hpu-worker next to hpud)"},
	{"submitter_timeout", set_submitter_timeout, "S", "seconds without a ping from the submitting "
							  "hpulaunch before its job is cancelled, at least 3 "
							  "(it pings every second) (10)"},
	{"output_buffer", set_output_buffer, "SIZE", "a job's output waiting for its submitter, at most: "
						     "bytes, or a number and K, M or G (KiB, MiB, GiB), "
						     "64K..1G; past it hpud stops reading the workers' "
						     "output until half has left; only a submitter that "
						     "takes none of it for 5 s has it dropped and counted (4M)"},
	{"job_uids", set_job_uids, "FIRST-LAST", "run each job's workers as a uid of its own from this range "
						 "(group: user's), so that jobs cannot see or signal each "
						 "other; at most 65536 uids (off: every job runs as user)"},
};
#define NKEYS (sizeof keys / sizeof keys[0])

/* ---- lines ---- */

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	char *e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' ||
			 e[-1] == '\n'))
		*--e = 0;
	return s;
}

/* Applies one line (NUL-terminated, `len` bytes read) to c. first_line[k]
 * is the line that set keys[k], 0 if none yet. Returns 0, or -1 with err. */
static int apply_line(hpud_conf *c, char *line, size_t len, int *first_line,
		      const char *path, int lineno, char *err, size_t errlen)
{
	if (strlen(line) != len) {
		snprintf(err, errlen, "%s:%d: NUL byte in line", path, lineno);
		return -1;
	}
	char *hash = strchr(line, '#');
	if (hash)
		*hash = 0;
	char *s = trim(line);
	if (!*s)
		return 0;
	char *eq = strchr(s, '=');
	if (!eq) {
		snprintf(err, errlen, "%s:%d: expected 'key = value', got '%s'",
			 path, lineno, s);
		return -1;
	}
	*eq = 0;
	char *key = trim(s), *val = trim(eq + 1);
	if (!*key) {
		snprintf(err, errlen, "%s:%d: missing key before '='", path,
			 lineno);
		return -1;
	}
	size_t k = 0;
	while (k < NKEYS && strcmp(key, keys[k].name) != 0)
		k++;
	if (k == NKEYS) {
		snprintf(err, errlen, "%s:%d: unknown key '%s'", path, lineno,
			 key);
		return -1;
	}
	if (first_line[k]) {
		snprintf(err, errlen,
			 "%s:%d: duplicate key '%s' (first set on line %d)",
			 path, lineno, key, first_line[k]);
		return -1;
	}
	if (!*val) {
		snprintf(err, errlen, "%s:%d: empty value for key '%s'", path,
			 lineno, key);
		return -1;
	}
	char why[200];
	if (keys[k].set(c, val, why, sizeof why) < 0) {
		snprintf(err, errlen, "%s:%d: bad value for key '%s': %s", path,
			 lineno, key, why);
		return -1;
	}
	first_line[k] = lineno;
	return 0;
}

int hpud__conf_load(hpud_conf *c, const char *path, char *err, size_t errlen)
{
	const char *why;
	FILE *f = hpu__open_input(path, &why); /* a FIFO would block */
	if (!f) {
		snprintf(err, errlen, "the configuration %s: %s", path, why);
		return -1;
	}
	hpud_conf tmp = *c;
	int first_line[NKEYS] = {0};
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	int lineno = 0, rc = 0;
	errno = 0;
	while ((n = getline(&line, &cap, f)) >= 0) {
		lineno++;
		rc = apply_line(&tmp, line, (size_t)n, first_line, path, lineno,
				err, errlen);
		if (rc < 0)
			goto done;
	}
	if (ferror(f)) {
		snprintf(err, errlen, "%s: %s", path,
			 strerror(errno ? errno : EIO));
		rc = -1;
	}
done:
	free(line);
	fclose(f);
	if (rc == 0)
		*c = tmp;
	return rc;
}

int hpud__conf_count_devices(hpud_conf *c, const char *worker, char *note, size_t notelen,
			     char *err, size_t errlen)
{
	static const char cuda[] = "--devices auto --device cuda: ";
	if (notelen)
		note[0] = '\0';
	if (!c->devices_auto)
		return 0;
	hpu__count_by by = !strcmp(c->device, "cuda")	? HPU_COUNT_GPUS
			   : !strcmp(c->device, "auto") ? HPU_COUNT_EITHER
							: HPU_COUNT_CORES;
	int ngpus = 0, n = 0;
	char why[1024] = "", msg[1200];
	if (by != HPU_COUNT_CORES)
		hpu__gpus_count(worker, &ngpus, why, sizeof why);
	if (hpu__gpus_devices(by, ngpus, why, sysconf(_SC_NPROCESSORS_ONLN), &n, msg,
			      sizeof msg) < 0) {
		/* hpulaunch's sentence, in the file's words */
		snprintf(err, errlen, "devices = auto, device = %s: %s", c->device,
			 strncmp(msg, cuda, sizeof cuda - 1) ? msg : msg + sizeof cuda - 1);
		return -1;
	}
	c->devices = n;
	if (by != HPU_COUNT_CORES && ngpus > 0)
		snprintf(note, notelen, "devices = auto, device = %s: %d, one per GPU %s --count-gpus sees",
			 c->device, n, worker);
	else
		snprintf(note, notelen, "devices = auto, device = %s: %d, one per online CPU core%s%s",
			 c->device, n, why[0] ? "; no GPU: " : "", why);
	return 0;
}

void hpud__conf_doc(FILE *f, int how)
{
	hpu_optspec specs[NKEYS + 1] = {{0}};
	for (size_t k = 0; k < NKEYS; k++)
		specs[k] = (hpu_optspec){keys[k].name, 0, HPU_OPT_VALUE, (int)k + 1, keys[k].arg,
					 .help = keys[k].help};
	hpu__optdoc(f, specs, how | HPU_DOC_KEYS, 28);
}
