/* fileio: reading input files without hanging on a FIFO, and writing
 * output files whole or not at all (a temporary file, fsync, rename), for
 * every program and library of the system. The reasons returned are
 * fixed strings (strerror's or this module's); callers put them into
 * their own sentences. */
#ifndef HPU_FILEIO_H
#define HPU_FILEIO_H

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>

/* ---- errors ---- */

/* A sentence into err[errlen]; returns -1: the failure of every function
 * of the system that takes an err buffer. */
int hpu__say(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- reading ---- */

/* Opens path read-only (open(2) flags O_RDONLY | O_CLOEXEC | extra, e.g.
 * O_NOFOLLOW) if it is a regular file: a FIFO is refused at once (opened
 * with O_NONBLOCK, so no wait for a writer), and so are devices, sockets
 * and directories. Returns the descriptor, blocking as usual, with its
 * status in *st; or -1 with why in *why: strerror's text with errno set
 * when open or fstat failed (st->st_mode 0), else "not a regular file (a
 * FIFO)", "... (a character device)", strerror(EISDIR) for a directory
 * ... (st->st_mode the file's). */
int hpu__open_input_fd(const char *path, int extra, struct stat *st, const char **why);

/* hpu__open_input_fd's file as a stream; NULL with why in *why. */
FILE *hpu__open_input(const char *path, const char **why);

/* Reads f to its end into *buf (malloc'ed, NUL-terminated) and the length
 * into *len; text: at most 16 MiB and no NUL byte. Returns NULL, or why
 * not ("out of memory", "larger than 16 MiB", "it holds a NUL byte: not a
 * text file", strerror's text); f stays open either way. */
const char *hpu__read_stream(FILE *f, int text, char **buf, size_t *len);

/* Reads a whole text file (at most 16 MiB; hpu__open_input's checks) into
 * *buf (malloc'ed, NUL-terminated) and its length into *len. Returns
 * NULL, or why it could not (hpu__open_input's reasons, "out of memory",
 * "larger than 16 MiB", "it holds a NUL byte: not a text file"). */
const char *hpu__read_file(const char *path, char **buf, size_t *len);

/* ---- writing ---- */

/* Opens the output file path for writing (made with mode; emptied
 * unless append) that this process alone writes while it runs: a regular
 * file is locked (flock, exclusive) until the descriptor is closed, and
 * one another process holds is refused, *why hpu__in_use_why (two jobs
 * given one --metrics file, --profile directory or --log-dir tore each
 * other's lines). Returns the descriptor, or -1 with *why (strerror's, or
 * that). A device (/dev/null, a terminal) is not locked. A lock that
 * hpu__lock_honoured() says is not a job's is ignored: the descriptor is
 * returned with *why a warning to print (else NULL). A symbolic link of
 * another user but root is refused (not followed). */
int hpu__open_unshared(const char *path, int append, mode_t mode, const char **why);

/* Whether the flock another process holds on the file st is one to
 * honour (/proc/locks names its holder): 0 when the holder could write
 * neither the file nor, where given, the directory dir -- not their owner,
 * not root, not of a group or others the mode lets write -- as any local
 * user may flock a 0644 file to stop a job (then note says who); 1
 * otherwise, and when the holder cannot be told (an exited process's
 * descriptor, /proc mounted with hidepid). */
struct stat;
int hpu__lock_honoured(const struct stat *st, const struct stat *dir, char *note, size_t notelen);
extern const char *const hpu__in_use_why;

/* Writes all n bytes to fd, again after EINTR and short writes; 0, or -1
 * with errno set. In a process that sets hpu__write_watch (hpulaunch),
 * writes to descriptors 1 and 2 wait for room in slices of 100 ms, a
 * pipe's page at a time, and once hpu__write_interrupted is set (its
 * signal handler: the user asked it to stop) one that would wait fails at
 * once with EAGAIN: the process gets to the signal instead of waiting on
 * its output (Ctrl-C did nothing while a pager held it). */
extern volatile sig_atomic_t hpu__write_interrupted;
extern int hpu__write_watch;
int hpu__write_all(int fd, const void *p, size_t n);

/* hpu__write_all's wait for room on fd: 0 to write, or -1 (EAGAIN) where
 * interrupted and fd takes nothing. At once for other descriptors, or
 * without hpu__write_watch. */
int hpu__write_wait(int fd);

/* Appends one line of text (s and a '\n') to f, which must be
 * unbuffered (setvbuf _IONBF) and written only at its end: 0, or -1 with
 * errno, the part that went in cut off again, so that the file still
 * ends with its last whole line (a JSON-lines file after a full disk). */
int hpu__append_line(FILE *f, const char *s);

/* Whether paths a and b name the same file: the same device and inode
 * where both exist (links followed), else the same real directory and
 * the same last name (an output not made yet). */
int hpu__same_file(const char *a, const char *b);

/* How output `path` is written: in place (1) when it is a device or a
 * pipe (/dev/full, /dev/stdout into a pipe), which renaming over would
 * replace, or a symbolic link to nothing that cannot be made (/dev/stdout
 * with descriptor 1 closed, a link into a missing directory: opening it
 * fails, the link stays); else (0) as a temporary file renamed onto
 * real[len]: path itself, or the file a symbolic link at path leads to,
 * made if it is not there yet (the link stays). */
int hpu__out_in_place(const char *path, char *real, size_t len);

/* An output file written under a temporary name ("REAL.tmp.PID", next to
 * it) and renamed into place once complete, so that a reader sees the old
 * file or the whole new one; a device or a pipe is written in place
 * (hpu__out_in_place). */
typedef struct hpu_outfile {
	int fd;          /* open for writing; -1 once closed */
	int direct;      /* written in place: nothing to rename */
	char path[4096]; /* where it lands (through a symbolic link) */
	char tmp[4160];  /* the temporary file; "" when direct */
	int made;        /* tmp is ours to remove (until renamed) */
	FILE *f;         /* hpu__outfile_stream's, which owns fd */
} hpu_outfile;

/* Starts writing path: creates the temporary file with mode (and the
 * umask), read-write so that the writer may read back what it wrote; or
 * opens a device or a pipe write-only. Returns 0, or -1 with errno set
 * (o->tmp names the file that could not be created, "" when the open in
 * place failed); either way hpu__outfile_abort cleans up. */
int hpu__outfile_open(hpu_outfile *o, const char *path, mode_t mode);

/* o's descriptor as a stdio stream (which then owns it); NULL with errno
 * set. */
FILE *hpu__outfile_stream(hpu_outfile *o);

/* Finishes o: flushes its stream, fsyncs (a pipe or device that cannot
 * is fine), closes and renames the temporary file into place. Returns 0,
 * or -1 with errno set and *step (if step) "write", "fsync", "close" or
 * "rename"; then the caller still calls hpu__outfile_abort. */
int hpu__outfile_commit(hpu_outfile *o, const char **step);

/* Closes o and removes its temporary file; safe after commit, after a
 * failed open, and twice. errno stays as it was. */
void hpu__outfile_abort(hpu_outfile *o);

/* hpu__outfile_open, and from before its temporary file is made until
 * hpu__outfile_unguard, SIGTERM, SIGINT and SIGHUP whose action is the
 * default one first remove that file, then end the process as they would
 * have (a --save-params file of hundreds of MB was left as PATH.tmp.PID;
 * so was an empty one when the signal came as the open returned).
 * Handlers already set (a checkpoint save's, which names its own files)
 * are left alone. One file at a time; a failed open unguards. */
int hpu__outfile_open_guarded(hpu_outfile *o, const char *path, mode_t mode);
void hpu__outfile_unguard(void);

/* One sentence into err for o's failed step ("open", or commit's), from
 * errno: "cannot create TMP: ...", "cannot open PATH: ..." (in place),
 * "writing PATH: ...", "writing PATH: fsync: ...", "cannot rename TMP to
 * PATH: ...". Returns -1. */
int hpu__outfile_error(const hpu_outfile *o, const char *step, char *err, size_t errlen);

/* The whole of data[n] into path, atomically (an hpu_outfile, mode 0644).
 * Returns 0, or -1 with hpu__outfile_error's sentence in err. */
int hpu__write_atomic(const char *path, const void *data, size_t n, char *err,
		      size_t errlen);

/* path's directory into out: "." where it has no '/', "/" for a file at
 * the root. */
void hpu__dir_part(const char *path, char *out, size_t len);

/* Makes each missing directory of path (mkdir -p). Returns 0, or -1 with
 * the one that could not be made in at[atlen] and errno set. */
int hpu__make_dirs(const char *path, char *at, size_t atlen);

/* hpu__make_dirs(dir), a failure said in err as "cannot make the WHAT
 * directory DIR: WHY", with the part that could not be made before WHY
 * where it is not DIR itself. Returns 0 or -1. */
int hpu__make_dirs_said(const char *what, const char *dir, char *err, size_t errlen);

/* fsyncs directory dir, so that a rename or a new file in it lasts (a
 * filesystem that cannot sync a directory is fine). Returns 0, or -1 with
 * one sentence in err. */
int hpu__fsync_dir(const char *dir, char *err, size_t errlen);

#endif
