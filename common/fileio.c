/* fileio: input files opened without hanging on a FIFO, output files
 * written through a temporary file, an fsync and a rename. */
#include "common/fileio.h"
#include "common/thread.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* ---- reading ---- */

/* Why a file of mode m is no input file. */
static const char *not_regular(mode_t m)
{
	return S_ISDIR(m)    ? strerror(EISDIR)
	       : S_ISFIFO(m) ? "not a regular file (a FIFO)"
	       : S_ISCHR(m)  ? "not a regular file (a character device)"
	       : S_ISBLK(m)  ? "not a regular file (a block device)"
	       : S_ISSOCK(m) ? "not a regular file (a socket)"
			     : "not a regular file";
}

int hpu__open_input_fd(const char *path, int extra, struct stat *st, const char **why)
{
	st->st_mode = 0;
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | extra), fl;
	if (fd < 0) {
		*why = strerror(errno);
		return -1;
	}
	if (fstat(fd, st) < 0) {
		st->st_mode = 0;
		goto fail;
	}
	if (!S_ISREG(st->st_mode)) {
		*why = not_regular(st->st_mode);
		close(fd);
		return -1;
	}
	/* A regular file: reads block as they always did. */
	if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
		st->st_mode = 0;
		goto fail;
	}
	return fd;
fail:
	*why = strerror(errno);
	int e = errno;
	close(fd);
	errno = e;
	return -1;
}

FILE *hpu__open_input(const char *path, const char **why)
{
	struct stat st;
	int fd = hpu__open_input_fd(path, 0, &st, why);
	if (fd < 0)
		return NULL;
	FILE *f = fdopen(fd, "r");
	if (!f) {
		*why = strerror(errno);
		close(fd);
	}
	return f;
}

const char *hpu__read_stream(FILE *f, int text, char **buf, size_t *len)
{
	enum { MAX = 16 << 20 };
	/* a text file may fill MAX + 1 bytes: one more than it may hold */
	size_t lim = text ? (size_t)MAX + 1 : (size_t)-1 / 2;
	struct stat st;
	const char *why = NULL;
	char *b = NULL;
	size_t n = 0, cap = 0;
	/* a first guess: the size of a regular file (read to the end anyway) */
	size_t want = fstat(fileno(f), &st) == 0 && st.st_size > 0 ? (size_t)st.st_size + 1 : 0;
	for (;;) {
		if (n == cap) {
			size_t more = want > cap ? want : cap * 2 + 4096;
			more = more < lim ? more : lim;
			char *g = cap < lim ? realloc(b, more + 1) : NULL;
			if (!g) {
				why = cap < lim ? "out of memory" : "larger than 16 MiB";
				break;
			}
			b = g;
			cap = more;
		}
		size_t got = fread(b + n, 1, cap - n, f);
		n += got;
		if (got == 0) {
			if (ferror(f))
				why = strerror(errno);
			break;
		}
	}
	if (!why && text && memchr(b, 0, n))
		why = "it holds a NUL byte: not a text file";
	if (why) {
		free(b);
		return why;
	}
	b[n] = 0;
	*buf = b;
	*len = n;
	return NULL;
}

const char *hpu__read_file(const char *path, char **buf, size_t *len)
{
	const char *why = NULL;
	FILE *f = hpu__open_input(path, &why);
	if (!f)
		return why;
	why = hpu__read_stream(f, 1, buf, len);
	fclose(f);
	return why;
}

/* ---- writing ---- */

const char *const hpu__in_use_why =
	"another running job writes it (it holds a lock on it): give each job its own";

/* The effective uid and gid of process pid; -1 when unknown (gone, or
 * /proc hides it). */
static void ids_of(long pid, long *uid, long *gid)
{
	char path[64], line[256];
	long real, eff;
	*uid = *gid = -1;
	snprintf(path, sizeof path, "/proc/%ld/status", pid);
	FILE *f = fopen(path, "re");
	while (f && fgets(line, sizeof line, f)) {
		if (sscanf(line, "Uid: %ld %ld", &real, &eff) == 2)
			*uid = eff;
		else if (sscanf(line, "Gid: %ld %ld", &real, &eff) == 2)
			*gid = eff;
	}
	if (f)
		fclose(f);
}

/* Whether a process of uid and gid may write a file of st's owner and
 * mode (its supplementary groups are not looked at: a group-writable
 * file counts for its group alone). */
static int may_write(long uid, long gid, const struct stat *st)
{
	return uid == 0 || (uid_t)uid == st->st_uid || (st->st_mode & S_IWOTH) ||
	       ((st->st_mode & S_IWGRP) && (gid_t)gid == st->st_gid);
}

int hpu__lock_honoured(const struct stat *st, const struct stat *dir, char *note, size_t notelen)
{
	FILE *f = fopen("/proc/locks", "re");
	char line[256];
	int honoured = 1;
	while (f && fgets(line, sizeof line, f)) {
		long pid;
		unsigned maj, min;
		unsigned long long ino;
		char kind[16], how[16], rw[16];
		if (strstr(line, "->") || /* a waiter, not a holder */
		    sscanf(line, "%*d: %15s %15s %15s %ld %x:%x:%llu", kind, how, rw, &pid, &maj, &min,
			   &ino) != 7 ||
		    strcmp(kind, "FLOCK") != 0 || /* the lock flock found: another's flock */
		    maj != major(st->st_dev) || min != minor(st->st_dev) || ino != st->st_ino)
			continue;
		long uid, gid;
		ids_of(pid, &uid, &gid);
		/* unknown (an exited process's descriptor, /proc's hidepid):
		 * honoured, as before */
		int can_write = uid < 0 || may_write(uid, gid, st) || (dir && may_write(uid, gid, dir));
		if (!can_write) {
			snprintf(note, notelen, "uid %ld (pid %ld) holds a lock on it but cannot write it%s: "
				 "not a job writing it; ignored", uid, pid, dir ? " nor its directory" : "");
			honoured = 0;
		}
		break;
	}
	if (f)
		fclose(f);
	return honoured;
}

int hpu__open_unshared(const char *path, int append, mode_t mode, const char **why)
{
	static char note[200];
	*why = NULL;
	struct stat ls;
	int link = lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode);
	/* another user's link (in /tmp, in a directory of theirs) would point
	 * this process's writes at any file it may write (root's: any); root's
	 * own links (/dev/stdout) are no one else's doing */
	if (link && ls.st_uid != geteuid() && ls.st_uid != 0) {
		snprintf(note, sizeof note, "a symbolic link of uid %ld's: not followed (it could point "
			 "at any file)", (long)ls.st_uid);
		*why = note;
		return -1;
	}
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : 0) |
				    (link ? 0 : O_NOFOLLOW), mode);
	struct stat st;
	if (fd < 0) {
		*why = errno == ELOOP && !link ? "it became a symbolic link as it was opened: not followed"
					      : strerror(errno);
		return -1;
	}
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
		/* a lock the file system cannot take (ENOLCK) is done without;
		 * one held by a process that cannot write the file (any user
		 * may flock a 0644 file) is not another job's */
		if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
			if (hpu__lock_honoured(&st, NULL, note, sizeof note)) {
				close(fd);
				*why = hpu__in_use_why;
				return -1;
			}
			*why = note; /* a warning for the caller to print */
		}
		if (!append && ftruncate(fd, 0) != 0) {
			*why = strerror(errno);
			close(fd);
			return -1;
		}
	}
	return fd;
}

volatile sig_atomic_t hpu__write_interrupted;
int hpu__write_watch;

/* After the interrupt, output waits this long in all for a reader that
 * is slow but alive (it drains a full pipe), then gives up. */
#define WRITE_GRACE_MS 1000

int hpu__write_wait(int fd)
{
	static int grace_ms = WRITE_GRACE_MS;
	if (!hpu__write_watch || (fd != 1 && fd != 2))
		return 0;
	for (;;) {
		struct pollfd pf = {.fd = fd, .events = POLLOUT};
		int slice = hpu__write_interrupted ? (grace_ms < 100 ? grace_ms : 100) : 100;
		int r = poll(&pf, 1, slice);
		if (r > 0 || (r < 0 && errno != EINTR))
			return 0; /* room, or an error the write will name */
		if (hpu__write_interrupted && r == 0)
			grace_ms -= slice;
		if (hpu__write_interrupted && grace_ms <= 0) {
			errno = EAGAIN;
			return -1;
		}
	}
}

int hpu__write_all(int fd, const void *p, size_t n)
{
	const char *s = p;
	int watched = hpu__write_watch && (fd == 1 || fd == 2);
	while (n) {
		if (hpu__write_wait(fd) < 0)
			return -1;
		/* a pipe's page at a time: a pipe that polls writable takes it
		 * without waiting */
		size_t chunk = watched && n > 4096 ? 4096 : n;
		ssize_t k = write(fd, s, chunk);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -1;
		s += k;
		n -= (size_t)k;
	}
	return 0;
}

/* Where a symbolic link `path` to nothing leads: the name its chain of
 * links ends at, into real[len]; 0 when that name can be made (its
 * directory is there), 1 when not: a descriptor's link in /proc (fd 1
 * closed, for /dev/stdout), a missing directory, a loop. */
static int dangling_target(const char *path, char *real, size_t len)
{
	char cur[PATH_MAX], to[PATH_MAX];
	snprintf(cur, sizeof cur, "%s", path);
	for (int hops = 0; hops < 40; hops++) {
		ssize_t n = readlink(cur, to, sizeof to - 1);
		if (n < 0) { /* not a link: the name to make */
			char dir[PATH_MAX];
			struct stat ds;
			hpu__dir_part(cur, dir, sizeof dir);
			if ((errno != ENOENT && errno != EINVAL) || stat(dir, &ds) != 0 || !S_ISDIR(ds.st_mode) ||
			    strlen(cur) >= len)
				return 1;
			snprintf(real, len, "%s", cur);
			return 0;
		}
		to[n] = '\0';
		if (!strncmp(to, "/proc/", 6))
			return 1;
		const char *slash = strrchr(cur, '/');
		char next[PATH_MAX];
		if (to[0] == '/' || !slash)
			snprintf(next, sizeof next, "%s", to);
		else {
			size_t d = (size_t)(slash - cur) + 1, t = strlen(to); /* "DIR/" + to */
			if (d + t >= sizeof next)
				return 1;
			memcpy(next, cur, d);
			memcpy(next + d, to, t + 1);
		}
		memcpy(cur, next, sizeof cur);
	}
	return 1;
}

int hpu__out_in_place(const char *path, char *real, size_t len)
{
	struct stat st, lst;
	snprintf(real, len, "%s", path);
	if (stat(path, &st) != 0) { /* a new file, or a link to nothing */
		if (lstat(path, &lst) != 0 || !S_ISLNK(lst.st_mode))
			return 0;
		/* the file it names is made (the link stays), where it can
		 * be; else opened in place, which fails naming the link */
		int in_place = dangling_target(path, real, len);
		if (in_place)
			snprintf(real, len, "%s", path);
		return in_place;
	}
	if (!S_ISREG(st.st_mode))
		return !S_ISDIR(st.st_mode); /* a directory: the rename says so */
	if (lstat(path, &lst) != 0 || !S_ISLNK(lst.st_mode))
		return 0;
	char *r = realpath(path, NULL);
	if (!r || strlen(r) >= len) {
		free(r);
		return 1;
	}
	snprintf(real, len, "%s", r);
	free(r);
	return 0;
}


static struct {
	char tmp[4160];
	volatile sig_atomic_t on;
	hpu_stop_handlers saved;
} OG;

static void on_outfile_stop(int sig)
{
	int e = errno;
	if (OG.on)
		unlink(OG.tmp);
	errno = e;
	signal(sig, SIG_DFL);
	raise(sig);
}

/* The guard on tmp (a name of this process: PATH.tmp.PID) */
static void outfile_guard(const char *tmp)
{
	if (OG.on)
		return;
	snprintf(OG.tmp, sizeof OG.tmp, "%s", tmp);
	OG.on = 1;
	hpu__stop_signals_take(&OG.saved, on_outfile_stop);
}

static int outfile_open(hpu_outfile *o, const char *path, mode_t mode, int guard)
{
	memset(o, 0, sizeof *o);
	o->direct = hpu__out_in_place(path, o->path, sizeof o->path);
	if (o->direct) {
		o->fd = open(path, O_WRONLY | O_CLOEXEC);
		return o->fd < 0 ? -1 : 0;
	}
	snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%d", o->path, (int)getpid());
	/* before the open: a signal as it returns finds the file named */
	if (guard)
		outfile_guard(o->tmp);
	o->fd = open(o->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	o->made = o->fd >= 0; /* else o->tmp is for the message: not ours */
	if (!o->made && guard)
		hpu__outfile_unguard();
	return o->fd < 0 ? -1 : 0;
}

int hpu__outfile_open(hpu_outfile *o, const char *path, mode_t mode)
{
	return outfile_open(o, path, mode, 0);
}

int hpu__outfile_open_guarded(hpu_outfile *o, const char *path, mode_t mode)
{
	return outfile_open(o, path, mode, 1);
}

void hpu__outfile_unguard(void)
{
	int e = errno;
	hpu__stop_signals_restore(&OG.saved);
	OG.on = 0;
	errno = e;
}

FILE *hpu__outfile_stream(hpu_outfile *o)
{
	if (!o->f && (o->f = fdopen(o->fd, "w")) == NULL)
		return NULL;
	return o->f;
}

/* -1 with *step = what and errno kept. */
static int failed(const char **step, const char *what)
{
	if (step)
		*step = what;
	return -1;
}

int hpu__outfile_commit(hpu_outfile *o, const char **step)
{
	if (o->f && fflush(o->f) != 0)
		return failed(step, "write");
	int fd = o->f ? fileno(o->f) : o->fd;
	if (fsync(fd) < 0 && !(o->direct && errno == EINVAL)) /* a pipe cannot sync */
		return failed(step, "fsync");
	int rc = o->f ? fclose(o->f) : close(o->fd);
	o->f = NULL;
	o->fd = -1;
	if (rc != 0)
		return failed(step, "close");
	if (!o->direct && rename(o->tmp, o->path) < 0)
		return failed(step, "rename");
	o->made = 0;
	return 0;
}

void hpu__outfile_abort(hpu_outfile *o)
{
	int e = errno; /* the caller's message may still want it */
	if (o->f)
		fclose(o->f);
	else if (o->fd >= 0)
		close(o->fd);
	o->f = NULL;
	o->fd = -1;
	if (o->made)
		unlink(o->tmp);
	o->made = 0;
	errno = e;
}

int hpu__say(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

int hpu__outfile_error(const hpu_outfile *o, const char *step, char *err, size_t errlen)
{
	const char *e = strerror(errno);
	char to[256];
	ssize_t n;
	if (!strcmp(step, "open") && o->direct && errno == ENOENT &&
	    (n = readlink(o->path, to, sizeof to - 1)) > 0) {
		to[n] = '\0';
		return hpu__say(err, errlen, "cannot open %s: a symbolic link to %s, which does not exist%s",
				o->path, to, !strncmp(to, "/proc/self/fd/", 14) ? " (that descriptor is closed)" : "");
	}
	if (!strcmp(step, "open") && o->direct)
		return hpu__say(err, errlen, "cannot open %s: %s", o->path, e);
	if (!strcmp(step, "open"))
		return hpu__say(err, errlen, "cannot create %s: %s", o->tmp, e);
	if (!strcmp(step, "write"))
		return hpu__say(err, errlen, "writing %s: %s", o->path, e);
	if (!strcmp(step, "rename"))
		return hpu__say(err, errlen, "cannot rename %s to %s: %s", o->tmp, o->path, e);
	return hpu__say(err, errlen, "writing %s: %s: %s", o->path, step, e);
}

int hpu__write_atomic(const char *path, const void *data, size_t n, char *err,
		      size_t errlen)
{
	hpu_outfile o;
	const char *step = "write";
	if (hpu__outfile_open(&o, path, 0644) < 0)
		return hpu__outfile_error(&o, "open", err, errlen);
	if (hpu__write_all(o.fd, data, n) == 0 && hpu__outfile_commit(&o, &step) == 0)
		return 0;
	hpu__outfile_error(&o, step, err, errlen);
	hpu__outfile_abort(&o);
	return -1;
}

int hpu__fsync_dir(const char *dir, char *err, size_t errlen)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return hpu__say(err, errlen, "cannot open directory %s: %s", dir, strerror(errno));
	int rc = fsync(fd);
	int e = errno;
	close(fd);
	if (rc < 0 && e != EINVAL) /* some filesystems cannot fsync a directory */
		return hpu__say(err, errlen, "fsync of directory %s: %s", dir, strerror(e));
	return 0;
}

int hpu__make_dirs(const char *path, char *at, size_t atlen)
{
	snprintf(at, atlen, "%s", path);
	for (char *s = at + 1;; s++) {
		if (*s != '/' && *s)
			continue;
		char c = *s;
		*s = '\0';
		if (mkdir(at, 0755) < 0) {
			struct stat st;
			if (errno != EEXIST)
				return -1;
			/* a file by that name is no directory (a later
			 * component says so itself: ENOTDIR) */
			if (stat(at, &st) == 0 && !S_ISDIR(st.st_mode)) {
				errno = ENOTDIR;
				return -1;
			}
		}
		*s = c;
		if (!c)
			return 0;
	}
}

int hpu__make_dirs_said(const char *what, const char *dir, char *err, size_t errlen)
{
	char at[4096];
	if (hpu__make_dirs(dir, at, sizeof at) == 0)
		return 0;
	int e = errno;
	if (strcmp(at, dir) == 0)
		snprintf(err, errlen, "cannot make the %s directory %s: %s", what, dir, strerror(e));
	else
		snprintf(err, errlen, "cannot make the %s directory %s: %s: %s", what, dir, at,
			 strerror(e));
	return -1;
}

int hpu__append_line(FILE *f, const char *s)
{
	struct stat st;
	int known = fstat(fileno(f), &st) == 0;
	if (fprintf(f, "%s\n", s) >= 0 && fflush(f) == 0)
		return 0;
	int e = errno;
	if (known && ftruncate(fileno(f), st.st_size) == 0)
		clearerr(f);
	errno = e;
	return -1;
}

void hpu__dir_part(const char *path, char *out, size_t len)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		snprintf(out, len, ".");
	else if (slash == path)
		snprintf(out, len, "/");
	else
		snprintf(out, len, "%.*s", (int)(slash - path), path);
}

int hpu__same_file(const char *a, const char *b)
{
	struct stat sa, sb;
	if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
		return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
	char da[PATH_MAX], db[PATH_MAX], ra[PATH_MAX], rb[PATH_MAX];
	hpu__dir_part(a, da, sizeof da);
	hpu__dir_part(b, db, sizeof db);
	const char *na = strrchr(a, '/') ? strrchr(a, '/') + 1 : a;
	const char *nb = strrchr(b, '/') ? strrchr(b, '/') + 1 : b;
	if (!realpath(da, ra) || !realpath(db, rb))
		return strcmp(a, b) == 0;
	return strcmp(ra, rb) == 0 && strcmp(na, nb) == 0;
}
