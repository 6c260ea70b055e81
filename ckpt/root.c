/* root: a checkpoint root's step directories: their names, `latest`,
 * the partial directories of saves, publishing one and pruning the old. */
#include "ckpt/ckpt_impl.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/num.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int hpu__ckpt_rmtree(const char *path)
{
	DIR *d = opendir(path);
	if (!d)
		return errno == ENOENT ? 0 : -1;
	struct dirent *e;
	char p[4400];
	snprintf(p, sizeof p, "%s/%s", path, HPU_CKPT_MANIFEST);
	unlink(p);
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof p, "%s/%s", path, e->d_name);
		unlink(p);
	}
	closedir(d);
	return rmdir(path);
}

int hpu__ckpt_partial_lock(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/* ".step-<digits>.partial", the name a save works under, or
 * ".step-<digits>.old.partial", an old checkpoint's being removed while
 * a save of its step holds the first */
static int partial_name(const char *name)
{
	const char *p = name + 6;
	if (strncmp(name, ".step-", 6) != 0 || !isdigit((unsigned char)*p))
		return 0;
	while (isdigit((unsigned char)*p))
		p++;
	return strcmp(p, ".partial") == 0 || strcmp(p, ".old.partial") == 0;
}

/* The directory a discard is removing, for hpu__ckpt_discard_finish (a
 * signal handler): set while it is removed. */
static char discarding[4400];
static volatile sig_atomic_t discarding_set;
/* ... and a rename to that name under way (from, to): a signal then, in
 * any thread, finds the directory under `to` once `from` is gone (before,
 * it is still whole under its step-N name) */
static char renaming_from[4400], renaming_to[4400];
static volatile sig_atomic_t renaming_set;

void hpu__ckpt_discard_finish(void)
{
	const char *dir = discarding;
	struct stat st;
	if (!discarding_set) {
		if (!renaming_set || lstat(renaming_from, &st) == 0 || lstat(renaming_to, &st) != 0)
			return; /* not renamed (yet, or ever: `to` is then another's) */
		dir = renaming_to;
	}
	hpu__ckpt_remove_sigsafe(dir);
}

void hpu__ckpt_remove_sigsafe(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return;
	/* getdents64 and unlinkat: system calls, safe in a handler, where
	 * opendir (malloc) is not */
	char buf[4096] __attribute__((aligned(8)));
	long n;
	while ((n = getdents64(fd, buf, sizeof buf)) > 0)
		for (long off = 0; off < n;) {
			struct dirent64 *e = (struct dirent64 *)(buf + off);
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
				unlinkat(fd, e->d_name, 0);
			off += e->d_reclen;
		}
	close(fd);
	rmdir(dir);
}

/* A publish under way (hpu__ckpt_publish), for hpu__ckpt_publish_finish:
 * the new checkpoint's directory (its device and inode) and `latest`'s
 * path, temporary name and line, set before the rename and cleared once
 * `latest` names it. */
static struct {
	char to[4200], latest[4200], tmp[4300], root[4200], line[300];
	size_t n;
	dev_t dev;
	ino_t ino;
} pub;
static volatile sig_atomic_t publishing;

int hpu__ckpt_publish_finish(void)
{
	struct stat st;
	if (!publishing || stat(pub.to, &st) != 0 || st.st_dev != pub.dev || st.st_ino != pub.ino)
		return 0; /* not renamed yet: the caller removes the partial */
	/* open, write, fsync, rename: all safe in a handler */
	int fd = open(pub.tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int ok = fd >= 0 && write(fd, pub.line, pub.n) == (ssize_t)pub.n && fsync(fd) == 0;
	if (fd >= 0)
		close(fd);
	if (!ok || rename(pub.tmp, pub.latest) != 0) {
		unlink(pub.tmp);
		return 1;
	}
	if ((fd = open(pub.root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
		(void)fsync(fd);
		close(fd);
	}
	return 1;
}

static void name_discarding(const char *dir)
{
	snprintf(discarding, sizeof discarding, "%s", dir);
	discarding_set = 1;
}

/* Removes dir, named for hpu__ckpt_discard_finish meanwhile. */
static int discard_tree(const char *dir)
{
	name_discarding(dir);
	int rc = hpu__ckpt_rmtree(dir);
	discarding_set = 0;
	return rc;
}

int hpu__ckpt_discard(const char *root, const char *name)
{
	char from[4400], to[4400];
	long step = hpu__ckpt_step_of(name);
	snprintf(from, sizeof from, "%s/%s", root, name);
	int fd = step >= 0 ? open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	/* not over a partial that exists (a save's, live or stale): the
	 * second name where the first is the save of this step's own (a save
	 * replacing a checkpoint of its step removed that one in place, and
	 * a signal meanwhile left a step-N without its manifest) */
	for (int k = 0; fd >= 0 && k < 2; k++) {
		snprintf(to, sizeof to, "%s/.step-%08ld.%spartial", root, step, k ? "old." : "");
		snprintf(renaming_from, sizeof renaming_from, "%s", from);
		snprintf(renaming_to, sizeof renaming_to, "%s", to);
		renaming_set = 1;
		int moved = renameat2(fd, strrchr(from, '/') + 1, fd, strrchr(to, '/') + 1,
				      RENAME_NOREPLACE) == 0;
		if (moved)
			name_discarding(to);
		renaming_set = 0;
		if (!moved)
			continue;
		close(fd);
		/* held while removed, as a stale partial is: another job's
		 * cleaner and a save of that step keep off */
		int lk = hpu__ckpt_partial_lock(to);
		if (lk < 0) {
			discarding_set = 0;
			return 0; /* another cleaner holds it: it removes it */
		}
		int rc = discard_tree(to);
		close(lk);
		return rc;
	}
	if (fd >= 0)
		close(fd);
	return discard_tree(from);
}

int hpu__ckpt_root_lock(const char *root, char *err, size_t errlen)
{
	char path[4400], who[128] = "";
	snprintf(path, sizeof path, "%s/%s", root, HPU_CKPT_ROOT_LOCK);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0 && errno == EACCES) /* another uid's: a read-only lock still holds */
		fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return say(err, errlen, "cannot open the checkpoint directory's lock %s: %s", path,
			   strerror(errno));
	struct stat st, dir;
	char note[200];
	int locked = flock(fd, LOCK_EX | LOCK_NB) == 0, e = errno;
	/* any local user may flock a 0644 lock file: one who can write
	 * neither it nor the root (another uid's job saving there may hold it
	 * read-only) is not a job saving there */
	if (!locked && e == EWOULDBLOCK && fstat(fd, &st) == 0 && stat(root, &dir) == 0 &&
	    !hpu__lock_honoured(&st, &dir, note, sizeof note)) {
		hpu__log(HPU_LOG_WARNING, "warning: %s: %s", path, note);
		locked = 1;
	}
	if (!locked) {
		ssize_t n = e == EWOULDBLOCK ? pread(fd, who, sizeof who - 1, 0) : -1;
		close(fd);
		if (e != EWOULDBLOCK)
			return say(err, errlen, "cannot lock %s: %s", path, strerror(e));
		who[n > 0 ? n : 0] = '\0';
		who[strcspn(who, "\n")] = '\0';
		return say(err, errlen, "--checkpoint-dir %s is in use: another running job saves its "
					"checkpoints there (its rank 0%s%s holds %s); give each job its "
					"own --checkpoint-dir",
			   root, who[0] ? ", " : "", who, path);
	}
	char host[64] = "", line[128];
	gethostname(host, sizeof host - 1);
	int n = snprintf(line, sizeof line, "pid %d on %s\n", (int)getpid(), host);
	if (ftruncate(fd, 0) == 0 && pwrite(fd, line, (size_t)n, 0) < 0)
		(void)0; /* the pid is for the message only */
	return fd;
}

/* "latest.tmp.<digits>": a `latest` written by hpu__write_atomic */
static int latest_tmp_name(const char *name)
{
	size_t n = strlen(HPU_CKPT_LATEST);
	const char *p = name + n + 5;
	if (strncmp(name, HPU_CKPT_LATEST, n) || strncmp(name + n, ".tmp.", 5) ||
	    !isdigit((unsigned char)*p))
		return 0;
	while (isdigit((unsigned char)*p))
		p++;
	return *p == 0;
}

/* Removes a cut-short `latest`'s temporary file: this uid's, regular,
 * a minute old. Returns 1 when removed. */
static int clean_latest_tmp(const char *path)
{
	struct stat st;
	long pid = strtol(strrchr(path, '.') + 1, NULL, 10);
	if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    time(NULL) - st.st_mtime < 60)
		return 0;
	/* its writer, where it is a live process here, may still be at it */
	if (pid > 0 && pid <= INT_MAX && (kill((pid_t)pid, 0) == 0 || errno != ESRCH))
		return 0;
	return unlink(path) == 0;
}

/* Removes partial directory path if it is one of ours that nobody holds
 * (the lock taken on the directory lstat saw, then kept while removing).
 * Returns 1 when removed. */
static int clean_one(const char *path)
{
	struct stat st, fst;
	if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
		return 0;
	int fd = hpu__ckpt_partial_lock(path);
	if (fd < 0)
		return 0; /* held by a live save, or gone */
	int same = fstat(fd, &fst) == 0 && fst.st_dev == st.st_dev && fst.st_ino == st.st_ino;
	int gone = same && hpu__ckpt_rmtree(path) == 0;
	close(fd);
	return gone;
}

int hpu__ckpt_clean_partials(const char *root, void (*said)(const char *path, void *arg),
			     void *arg)
{
	DIR *d = opendir(root);
	if (!d)
		return 0;
	struct dirent *e;
	char path[4400];
	int n = 0;
	while ((e = readdir(d))) {
		int tmp = latest_tmp_name(e->d_name);
		if (!tmp && !partial_name(e->d_name))
			continue;
		snprintf(path, sizeof path, "%s/%s", root, e->d_name);
		if (tmp ? clean_latest_tmp(path) : clean_one(path)) {
			n++;
			if (said)
				said(path, arg);
		}
	}
	closedir(d);
	return n;
}

/* ---- the root ---- */

void hpu__ckpt_step_name(long step, char *buf, size_t n)
{
	snprintf(buf, n, "step-%08ld", step);
}

void hpu__ckpt_shard_name(int rank, int world, char *buf, size_t n)
{
	snprintf(buf, n, "rank-%05d-of-%05d.bin", rank, world);
}

long hpu__ckpt_step_of(const char *name)
{
	if (strncmp(name, "step-", 5) != 0 || !isdigit((unsigned char)name[5]))
		return -1; /* strtol would skip spaces and take signs */
	long v;
	return hpu__parse_long(name + 5, 0, LONG_MAX, &v) ? -1 : v;
}

int hpu__ckpt_check_named_step(const hpu_ckpt *c, const char *dir, char *err, size_t n)
{
	char name[4200];
	snprintf(name, sizeof name, "%s", dir);
	for (size_t len = strlen(name); len > 1 && name[len - 1] == '/'; len--)
		name[len - 1] = '\0';
	const char *base = strrchr(name, '/');
	long st = hpu__ckpt_step_of(base ? base + 1 : name);
	if (st < 0 || st == c->step)
		return 0;
	snprintf(err, n,
		 "%s is named for step %ld but holds step %ld's checkpoint (its manifest): "
		 "renamed, or a link to another step's directory?",
		 dir, st, c->step);
	return -1;
}

void hpu__ckpt_latest(const char *root, char *out, size_t n)
{
	char path[4200], *text = NULL;
	size_t len;
	out[0] = '\0';
	snprintf(path, sizeof path, "%s/%s", root, HPU_CKPT_LATEST);
	if (hpu__read_file(path, &text, &len))
		return;
	while (len && (text[len - 1] == '\n' || text[len - 1] == ' ' || text[len - 1] == '\r'))
		text[--len] = '\0';
	snprintf(out, n, "%s", text);
	free(text);
}

/* The step `latest` names, or "" when absent or not a step. */
static void read_latest(const char *root, char *out, size_t n)
{
	hpu__ckpt_latest(root, out, n);
	if (hpu__ckpt_step_of(out) < 0)
		out[0] = '\0';
}

typedef struct named {
	int group; /* 0 latest's, 1 before it, 2 past it (an abandoned run's) */
	long step;
	char *name;
} named;

static int by_group_step_desc(const void *a, const void *b)
{
	const named *x = a, *y = b;
	if (x->group != y->group)
		return x->group < y->group ? -1 : 1;
	return x->step > y->step ? -1 : x->step < y->step;
}

void hpu__ckpt_free_names(char **names)
{
	if (!names)
		return;
	for (char **p = names; *p; p++)
		free(*p);
	free(names);
}

int hpu__ckpt_candidates(const char *root, char ***names, char *err, size_t errlen)
{
	*names = NULL;
	char latest[256];
	read_latest(root, latest, sizeof latest);
	DIR *d = opendir(root);
	if (!d && errno != ENOENT)
		return say(err, errlen, "cannot read checkpoint directory %s: %s", root,
			   strerror(errno));
	named *v = NULL;
	int n = 0, cap = 0;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		long st = hpu__ckpt_step_of(e->d_name);
		if (st < 0)
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			named *g = realloc(v, (size_t)cap * sizeof *v);
			if (!g)
				break;
			v = g;
		}
		v[n].step = st;
		v[n].group = strcmp(e->d_name, latest) == 0 ? 0 : 1;
		if (!(v[n].name = strdup(e->d_name)))
			break;
		n++;
	}
	if (d)
		closedir(d);
	/* where latest is there, a step past its was left by the run a
	 * resume from an earlier checkpoint abandoned: after the others */
	long head = -1;
	for (int i = 0; i < n; i++)
		if (v[i].group == 0)
			head = v[i].step;
	for (int i = 0; i < n && head >= 0; i++)
		if (v[i].group == 1 && v[i].step > head)
			v[i].group = 2;
	if (n > 1) /* v is NULL when there is none */
		qsort(v, (size_t)n, sizeof *v, by_group_step_desc);
	char **out = calloc((size_t)n + 1, sizeof *out);
	if (!out) {
		for (int i = 0; i < n; i++)
			free(v[i].name);
		free(v);
		return say(err, errlen, "out of memory");
	}
	for (int i = 0; i < n; i++)
		out[i] = v[i].name;
	free(v);
	*names = out;
	return n;
}

int hpu__ckpt_publish(const char *root, const char *partial, const char *name, int keep,
		      char *err, size_t errlen)
{
	char from[4200], to[4200], lpath[4200], line[300];
	snprintf(from, sizeof from, "%s/%s", root, partial);
	snprintf(to, sizeof to, "%s/%s", root, name);
	if (hpu__fsync_dir(from, err, errlen) < 0)
		return -1;
	/* a checkpoint of the same step from before (an abandoned run's, or
	 * the one a resume came from): swapped with the new one, so that it
	 * can come back where `latest` cannot be written, and removed under
	 * the partial's name once it is; a filesystem without the swap
	 * removes it first, as before */
	struct stat sb;
	snprintf(lpath, sizeof lpath, "%s/%s", root, HPU_CKPT_LATEST);
	int n = snprintf(line, sizeof line, "%s\n", name);
	/* from here a signal that finds the new one renamed finishes the
	 * publish (it was left as a step past `latest`, which a resume
	 * passes over as an abandoned run's, and latest.tmp.PID) */
	if (stat(from, &sb) == 0) {
		snprintf(pub.to, sizeof pub.to, "%s", to);
		snprintf(pub.latest, sizeof pub.latest, "%s", lpath);
		snprintf(pub.tmp, sizeof pub.tmp, "%s.tmp.%d", lpath, (int)getpid());
		snprintf(pub.root, sizeof pub.root, "%s", root);
		memcpy(pub.line, line, (size_t)n);
		pub.n = (size_t)n;
		pub.dev = sb.st_dev;
		pub.ino = sb.st_ino;
		atomic_signal_fence(memory_order_seq_cst); /* pub written first */
		publishing = 1;
	}
	int had = lstat(to, &sb) == 0, swapped = 0;
	if (had) {
		swapped = renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE) == 0;
		if (!swapped)
			hpu__ckpt_discard(root, name);
	}
	if (!swapped && rename(from, to) < 0) {
		publishing = 0;
		return say(err, errlen, "cannot rename %s to %s: %s", from, to, strerror(errno));
	}
	if (hpu__fsync_dir(root, err, errlen) < 0 ||
	    hpu__write_atomic(lpath, line, (size_t)n, err, errlen) < 0) {
		publishing = 0;
		/* not named by `latest`, a resume would pass it over as an
		 * abandoned run's step past it (and the run resumed would
		 * replace it): taken back to its partial name, for the caller
		 * to remove as a save that failed, and the one it replaced put
		 * back (where it was removed first, the new one stays) */
		int back = swapped ? renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE) == 0
			   : !had   ? rename(to, from) == 0
				    : 0;
		if (back)
			(void)hpu__fsync_dir(root, NULL, 0);
		return -1;
	}
	int synced = hpu__fsync_dir(root, err, errlen);
	publishing = 0;
	if (synced < 0)
		return -1;
	if (swapped) { /* the old one, now under the partial's name: named
			* .step-N.old.partial while removed, as a replaced
			* one is (the cleaner's name for it) */
		char old[4400];
		long step = hpu__ckpt_step_of(name);
		snprintf(old, sizeof old, "%s/.step-%08ld.old.partial", root, step);
		int moved = step >= 0 &&
			    renameat2(AT_FDCWD, from, AT_FDCWD, old, RENAME_NOREPLACE) == 0;
		discard_tree(moved ? old : from);
	}
	if (keep <= 0)
		return 0;
	char **names;
	int k = hpu__ckpt_candidates(root, &names, err, errlen);
	if (k < 0)
		return -1;
	for (int i = keep; i < k; i++) { /* names[0] is the new one */
		struct stat st;
		snprintf(to, sizeof to, "%s/%s", root, names[i]);
		if (lstat(to, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid())
			hpu__ckpt_discard(root, names[i]); /* never another uid's, nor
							    * through a link */
	}
	hpu__ckpt_free_names(names);
	return 0;
}
