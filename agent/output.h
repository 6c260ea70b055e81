/* output: what a launcher writes for a job and must not lose unnoticed:
 * the workers' lines on its stdout and stderr, and the files of
 * --log-dir. A write that fails (a full disk, an I/O error, /dev/full, a
 * reader that closed the pipe) is said once per destination on stderr,
 * naming it and the error; the job runs on (its checkpoints, metrics and
 * parameters are its products, its printed lines a copy), nothing more is
 * written to that destination, and hpu__output_failed() tells the program
 * to exit HPU_OUTPUT_EXIT at the end. EPIPE (the reader went away: `| head`)
 * is not said, as a program that SIGPIPE ends says nothing, but it counts
 * the same. Process-wide: a restarted job's agents share it. */
#ifndef HPU_OUTPUT_H
#define HPU_OUTPUT_H

#include <stddef.h>
#include <stdio.h>

/* hpulaunch's exit status when the job succeeded but some of its output
 * could not be written. */
#define HPU_OUTPUT_EXIT 3

/* Unless fd 1 is a terminal, puts stdout (the stream) on it through a
 * writer that keeps the error a failed write meets, for the message;
 * line-buffered. Call first in main, before anything is printed. */
void hpu__output_init(void);

/* Writes n bytes to fd 1 or 2 (the program's stdout, stderr), unless an
 * earlier write there failed. Returns 0, or -1 when it failed (now or
 * before; said once). */
int hpu__output_std(int fd, const void *p, size_t n);

/* fd 1 or 2 as a stream: f (stdout or stderr) after a line was printed
 * into it, flushed and checked. Returns 0, or -1 (said once). */
int hpu__output_stream(FILE *f);

/* Whether writes to fd 1 or 2 are still made (no failure yet). */
int hpu__output_std_ok(int fd);

/* Descriptor 1 was closed when the program started (>&-; it holds
 * /dev/null now): a write to it fails as EBADF would, said once on stderr
 * where stderr is open, and the exit status is HPU_OUTPUT_EXIT; a run
 * that writes nothing there exits as it would. (A closed stderr holds
 * /dev/full: a line written there counts as lost.) */
void hpu__output_std_closed(int fd);

/* Writes n bytes to the file fd that is `path` (a --log-dir file):
 * returns 0, or -1 with the failure said ("cannot write the log file
 * PATH: ..."); the caller then stops writing to it. */
int hpu__output_file(int fd, const char *path, const void *p, size_t n);

/* Closes the file fd that is `path`, as hpu__output_file: a close that
 * fails (NFS, a full disk reported late) is said. Returns 0 or -1. */
int hpu__output_file_close(int fd, const char *path);

/* Records a failed write of `what` (a sentence's object: "to stdout",
 * "the log file PATH") with errno value err, and says it once per what
 * (EPIPE: silently), prefixed with the program's name. */
void hpu__output_fail(const char *what, int err);

/* At the program's end: flushes, checks and closes stdout (fd 1), flushes and
 * checks stderr (a failure is said, as any other). Returns whether any
 * output was lost (then exit HPU_OUTPUT_EXIT if the job otherwise
 * succeeded). Nothing may write to stdout after it. */
int hpu__output_finish(void);

/* Whether any output was lost so far. */
int hpu__output_failed(void);

#endif
