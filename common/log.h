/* log: the one logging path of every program and internal library.
 *
 * A program sets its prefix once at start (hpu__log_init: "hpulaunch",
 * "hpud", "hpu-ckpt"; the worker "hpu-worker", then "hpu-worker: rank N"
 * once it knows its rank) and every line is "PREFIX: text", written to
 * stderr with one write(2) so that lines of several processes sharing a
 * pipe or file never interleave. Lines above the level (HPU_LOG_LEVEL, a
 * program's --log-level) are dropped.
 *
 * When stderr is the journal stream (systemd's JOURNAL_STREAM "DEV:INO"
 * names stderr's device and inode, as for StandardError=journal) each
 * line starts with its syslog priority, "<3>" for an error ... "<7>" for
 * debug, which journald takes off and keeps as the line's priority
 * (journalctl -p); on a terminal, a file or a pipe it does not.
 *
 * Libraries linked into programs (agent/, ckpt/, options/, worker/hpu/)
 * print through here; libhpucoll, which stands alone, reports through the
 * hook its caller sets (hpucoll_set_log, include/hpu/coll.h). */
#ifndef HPU_COMMON_LOG_H
#define HPU_COMMON_LOG_H

#include <stddef.h>

/* The levels, as syslog's priorities (sd-daemon.h's SD_ERR ...). */
typedef enum hpu_log_level {
	HPU_LOG_ERROR = 3,
	HPU_LOG_WARNING = 4,
	HPU_LOG_NOTICE = 5,
	HPU_LOG_INFO = 6, /* the default level */
	HPU_LOG_DEBUG = 7,
} hpu_log_level;

/* Sets the prefix (printf-style: "hpu-worker: rank %d") and reads the
 * environment again: the level from HPU_LOG_LEVEL (info when unset),
 * whether stderr is the journal stream now. Returns 0, or -1 with err
 * naming a bad HPU_LOG_LEVEL (the level stays info). A program that
 * never calls it logs with its own name as the prefix. */
int hpu__log_init(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Changes the prefix only (printf-style), e.g. once the rank is known. */
void hpu__log_set_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The prefix now ("hpulaunch"). */
const char *hpu__log_prefix(void);

/* "error", "warning", "notice", "info" or "debug" ("warn" is taken for
 * warning too): 0 and *out, or -1 with err naming `what` (unless NULL)
 * and the value. hpud.conf's log_level takes the same words. */
int hpu__log_parse_level(const char *s, const char *what, hpu_log_level *out, char *err,
			 size_t errlen);

/* The level's name ("warning"). */
const char *hpu__log_level_name(hpu_log_level lvl);

/* The level; lines above it are dropped. */
void hpu__log_set_level(hpu_log_level lvl);
hpu_log_level hpu__log_get_level(void);

/* Whether HPU_LOG_LEVEL set the level (a program's own setting, such as
 * hpud.conf's log_level, then yields to it). */
int hpu__log_level_from_env(void);

/* Whether a line at lvl is written. */
int hpu__log_enabled(hpu_log_level lvl);

/* The errno of the first line that could not be written to stderr, or 0
 * (a program's exit status may say its output was lost). */
int hpu__log_write_errno(void);

/* Whether lines carry journald's priorities (stderr is the journal). */
int hpu__log_journal(void);

/* "[<N>]PREFIX: text\n" on stderr, text printf-style. */
void hpu__log(hpu_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "[<N>]text\n": a line that carries its own prefix (a library's
 * "hpucoll: rank 3: ...", hpu-plot's copy of gnuplot's lines). */
void hpu__log_plain(hpu_log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* hpu__log of a fixed text, async-signal-safe (no stdio, no allocation):
 * for a child between fork and exec. */
void hpu__log_sigsafe(hpu_log_level lvl, const char *text);

/* Appends item to the comma-separated list in names[len] (which *used
 * bytes hold; "" when 0), for a message naming what was removed or
 * found; a list that no longer fits ends in "...". */
void hpu__log_list_add(char *names, size_t len, size_t *used, const char *item);

#endif
