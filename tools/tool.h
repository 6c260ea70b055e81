/* tool: what the offline commands (hpu-ckpt, hpu-trace, hpu-plot) say on
 * stderr (through common/log.h), and their exit codes; whether an output
 * is standard output's file; what a signal removes (tool_guard.c). Each
 * calls hpu__tool_start first thing in main. */
#ifndef HPU_TOOL_H
#define HPU_TOOL_H

#include <sys/types.h>

enum { HPU_TOOL_OK = 0, HPU_TOOL_BAD = 1, HPU_TOOL_USAGE = 2 };

/* "hpu-trace": the prefix of every message. */
extern const char *hpu__tool_name;

/* Sets the name and starts the log with it as the prefix (HPU_LOG_LEVEL,
 * journald's priorities): 0, or -1 after saying what was wrong (exit
 * with HPU_TOOL_USAGE). */
int hpu__tool_start(const char *name);

/* The tools' --log-level LEVEL (HPU_LOG_LEVEL too): the entry of their
 * option tables, and its value set (0), or said wrong (HPU_TOOL_USAGE). */
#define HPU_TOOL_LOG_LEVEL_HELP \
	"error | warning | notice | info | debug: messages above it are not printed (info)"
int hpu__tool_log_level(const char *value);

/* "NAME: error: ..." on stderr; returns HPU_TOOL_BAD. */
int hpu__tool_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "NAME: warning: ..." on stderr. */
void hpu__tool_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "NAME: note: ..." on stderr. */
void hpu__tool_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "NAME[ CMD]: ..." and where the help is ("NAME [CMD ]--help");
 * returns HPU_TOOL_USAGE. cmd may be NULL. */
int hpu__tool_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether output file `path` is standard output's file (the same device
 * and inode: /dev/stdout, /proc/self/fd/1, or the file stdout is
 * redirected to, named directly): a tool writing it reports on stderr,
 * not after (or, renamed over, into a replaced copy of) its data. Ask
 * before writing: a renamed output is another inode. */
int hpu__tool_out_is_stdout(const char *path);

/* ---- a signal's leftovers (tool_guard.c) ----
 *
 * SIGINT, SIGTERM, SIGHUP or SIGPIPE (a closed output pipe), where their
 * action is the default, first remove what the tool has added here --
 * children killed, files unlinked, directories emptied (one level) and
 * removed -- then the tool dies of the signal as it would have. Make a
 * file and add it between hpu__tool_guard_hold(1) and (0), so that no
 * signal falls between; drop it once it is renamed into place, removed
 * or reaped (a pid may be reused). */
enum { HPU_GUARD_FILE = 1, HPU_GUARD_TREE, HPU_GUARD_PID };
/* Adds path (FILE, TREE) or pid (PID); the slot's id, or -1 when all are
 * taken (then it is not removed). */
int hpu__tool_guard_add(int kind, const char *path, pid_t pid);
/* Forgets slot *id (-1: nothing) and sets *id to -1. */
void hpu__tool_guard_drop(int *id);
/* Blocks (1) the guarded signals, or restores the mask (0); not nested.
 * A child forked while they are blocked restores the mask before exec. */
void hpu__tool_guard_hold(int on);

/* --help-doc FORMAT: prints specs (opt.h) in the format named (help,
 * scdoc, markdown; col as optdoc.h's) and returns HPU_TOOL_OK, or says
 * the format is unknown and returns HPU_TOOL_USAGE. */
struct hpu_optspec;
int hpu__tool_doc(const struct hpu_optspec *specs, const char *format, int col);

#endif
