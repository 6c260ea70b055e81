/* trust: the file and each directory above it, as sshd's StrictModes
 * (auth.c, secure_path) checks them, with root-owned sticky directories
 * allowed. */
#include "daemon/trust.h"

#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Checks p, which is `file` itself (top) or a directory above it. */
static int check_one(const char *p, int top, const char *what, const char *file,
                     char *err, size_t errlen)
{
	struct stat st;
	char whose[PATH_MAX + 600];
	if (!top)
		snprintf(whose, sizeof whose, "the directory %s above %s %s", p,
		         what, file);
	else if (strcmp(p, file) != 0)
		snprintf(whose, sizeof whose, "%s %s (%s)", what, file, p);
	else
		snprintf(whose, sizeof whose, "%s %s", what, file);
	if (stat(p, &st) < 0) {
		snprintf(err, errlen, "%s: %s", whose, strerror(errno));
		return -1;
	}
	uid_t me = geteuid();
	if (st.st_uid != 0 && st.st_uid != me) {
		const struct passwd *pw = getpwuid(st.st_uid);
		char name[80] = "", also[64] = "";
		if (pw)
			snprintf(name, sizeof name, " (%s)", pw->pw_name);
		if (me != 0)
			snprintf(also, sizeof also, " or hpud's user (uid %u)",
			         (unsigned)me);
		snprintf(err, errlen,
		         "%s is owned by uid %u%s, not root%s: chown root it",
		         whose, (unsigned)st.st_uid, name, also);
		return -1;
	}
	int sticky_root =
	    S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX) && st.st_uid == 0;
	if ((st.st_mode & 022) && !sticky_root) {
		snprintf(err, errlen,
		         "%s is writable by group or others (mode %04o): chmod "
		         "go-w it",
		         whose, (unsigned)(st.st_mode & 07777));
		return -1;
	}
	return 0;
}

/* abs (an absolute path) and each directory above it, up to /. */
static int check_chain(const char *abs, const char *what, const char *file,
                       char *err, size_t errlen)
{
	char p[PATH_MAX];
	if (snprintf(p, sizeof p, "%s", abs) >= (int)sizeof p) {
		snprintf(err, errlen, "%s %.200s...: the path is too long",
		         what, file);
		return -1;
	}
	if (check_one(p, 1, what, file, err, errlen) < 0)
		return -1;
	for (;;) {
		char *slash = strrchr(p, '/');
		if (!slash || (slash == p && !p[1]))
			return 0;      /* "/" was the last one */
		slash[slash == p] = 0; /* "/a/b" -> "/a", "/a" -> "/" */
		if (check_one(p, 0, what, file, err, errlen) < 0)
			return -1;
	}
}

int hpud__trust_path(const char *path, const char *what, char *err,
		     size_t errlen)
{
	char abs[PATH_MAX], real[PATH_MAX];
	int n;
	if (path[0] == '/') {
		n = snprintf(abs, sizeof abs, "%s", path);
	} else {
		char cwd[PATH_MAX];
		if (!getcwd(cwd, sizeof cwd)) {
			snprintf(err, errlen,
			         "%s %s: cannot find the working directory: %s",
			         what, path, strerror(errno));
			return -1;
		}
		n = snprintf(abs, sizeof abs, "%s/%s",
		             strcmp(cwd, "/") ? cwd : "", path);
	}
	if (n < 0 || n >= (int)sizeof abs) {
		snprintf(err, errlen, "%s %.200s...: the path is too long",
		         what, path);
		return -1;
	}
	if (check_chain(abs, what, path, err, errlen) < 0)
		return -1;
	if (!realpath(abs, real)) {
		snprintf(err, errlen, "%s %s: %s", what, path, strerror(errno));
		return -1;
	}
	/* through symbolic links: where they lead must be trusted too */
	return strcmp(real, abs) ? check_chain(real, what, path, err, errlen)
	                         : 0;
}
