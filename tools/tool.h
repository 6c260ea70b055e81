/* tool: what the offline commands (hpu-ckpt, hpu-trace, hpu-plot) say on
 * stderr (through common/log.h), and their exit codes. Each calls
 * hpu__tool_start first thing in main. */
#ifndef HPU_TOOL_H
#define HPU_TOOL_H

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

/* --help-doc FORMAT: prints specs (opt.h) in the format named (help,
 * scdoc, markdown; col as optdoc.h's) and returns HPU_TOOL_OK, or says
 * the format is unknown and returns HPU_TOOL_USAGE. */
struct hpu_optspec;
int hpu__tool_doc(const struct hpu_optspec *specs, const char *format, int col);

#endif
