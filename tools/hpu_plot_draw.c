/* hpu-plot: drawing -- running gnuplot on the table and the script in a
 * temporary directory, and the PNG written to its output. Calls the
 * table and the script (hpu_plot_table.c, hpu_plot_script.c). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/env.h"
#include "common/fileio.h"
#include "common/log.h"
#include "tools/hpu_plot_impl.h"
#include "tools/tool.h"

/* ---- running gnuplot ---- */

/* The gnuplot program on PATH, as an absolute path (caller frees); NULL
 * if there is none. */
char *hpu__plt_find_gnuplot(void)
{
	const char *path = hpu__env_str(HPU_ENV_PATH);
	if (!path || !*path)
		path = "/usr/local/bin:/usr/bin:/bin";
	char cwd[4096];
	while (*path) {
		size_t n = strcspn(path, ":");
		char dir[4096];
		if (n == 0)
			snprintf(dir, sizeof dir, ".");
		else
			snprintf(dir, sizeof dir, "%.*s", (int)n, path);
		path += n + (path[n] == ':');
		char *cand = NULL;
		if (dir[0] != '/' && getcwd(cwd, sizeof cwd))
			(void)!asprintf(&cand, "%s/%s/gnuplot", cwd, dir);
		else if (dir[0] == '/')
			(void)!asprintf(&cand, "%s/gnuplot", dir);
		struct stat st;
		if (cand && stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0)
			return cand;
		free(cand);
	}
	return NULL;
}

/* `dir`/`name` into buf. */
static const char *in_dir(char *buf, size_t len, const char *dir, const char *name)
{
	snprintf(buf, len, "%s/%s", dir, name);
	return buf;
}

/* Copies what gnuplot said (file `err`) to our stderr, each line marked. */
static void pass_on(const char *err)
{
	FILE *f = fopen(err, "r");
	if (!f)
		return;
	char line[1024];
	int any = 0;
	while (fgets(line, sizeof line, f)) {
		if (hpu__plt_blank(line))
			continue;
		line[strcspn(line, "\n")] = 0;
		hpu__log(HPU_LOG_ERROR, "gnuplot: %s", line);
		any = 1;
	}
	if (!any)
		hpu__log(HPU_LOG_ERROR, "gnuplot said nothing on stderr");
	fclose(f);
}

/* Waits at most GNUPLOT_TIMEOUT_S for pid; kills it after that. Returns
 * its wait status, or -1 if it had to be killed. */
static int wait_bounded(pid_t pid)
{
	struct timespec nap = {0, 20 * 1000 * 1000};
	for (long waited_ms = 0; waited_ms < GNUPLOT_TIMEOUT_S * 1000L; waited_ms += 20) {
		int status;
		pid_t r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			return status;
		if (r < 0 && errno != EINTR)
			return -1;
		nanosleep(&nap, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

/* Runs `gnuplot plot.gp` in `dir`, its stdout to out_fd, its stderr to
 * dir/gnuplot.err; OK or BAD (said, with gnuplot's stderr). */
static int run_gnuplot(const char *gp, const char *dir, int out_fd)
{
	char err[4200];
	in_dir(err, sizeof err, dir, "gnuplot.err");
	int err_fd = open(err, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (err_fd < 0 || null_fd < 0) {
		if (err_fd >= 0)
			close(err_fd);
		if (null_fd >= 0)
			close(null_fd);
		return fail("cannot create %s: %s", err, strerror(errno));
	}
	fflush(NULL);
	hpu__tool_guard_hold(1); /* a signal kills gnuplot */
	pid_t pid = fork();
	if (pid == 0) {
		hpu__tool_guard_hold(0);
		if (chdir(dir) < 0 || dup2(null_fd, 0) < 0 || dup2(out_fd, 1) < 0 ||
		    dup2(err_fd, 2) < 0)
			_exit(127);
		execl(gp, "gnuplot", "plot.gp", (char *)NULL);
		dprintf(2, "cannot run %s: %s\n", gp, strerror(errno));
		_exit(127);
	}
	int fork_errno = errno;
	int guard = pid > 0 ? hpu__tool_guard_add(HPU_GUARD_PID, NULL, pid) : -1;
	hpu__tool_guard_hold(0);
	close(err_fd);
	close(null_fd);
	if (pid < 0)
		return fail("cannot start gnuplot: %s", strerror(fork_errno));
	int status = wait_bounded(pid), rc;
	hpu__tool_guard_drop(&guard); /* reaped: its pid may be another's now */
	if (status == -1)
		rc = fail("gnuplot (%s) did not finish within %d s and was killed", gp,
			  GNUPLOT_TIMEOUT_S);
	else if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return OK;
	else if (WIFEXITED(status))
		rc = fail("gnuplot (%s) failed with exit status %d", gp, WEXITSTATUS(status));
	else
		rc = fail("gnuplot (%s) was killed by signal %d", gp, WTERMSIG(status));
	pass_on(err);
	return rc;
}

/* ---- the output ---- */

/* The default output: `metrics` with its extension (if any, in its last
 * component) replaced by .png. Caller frees. */
char *hpu__plt_default_out(const char *metrics)
{
	const char *base = strrchr(metrics, '/');
	base = base ? base + 1 : metrics;
	const char *dot = strrchr(base, '.');
	size_t keep = dot && dot != base ? (size_t)(dot - metrics) : strlen(metrics);
	char *out = NULL;
	if (asprintf(&out, "%.*s.png", (int)keep, metrics) < 0)
		return NULL;
	return out;
}

/* Whether paths a and b name the same existing file. */
int hpu__plt_same_file(const char *a, const char *b)
{
	struct stat x, y;
	return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev &&
	       x.st_ino == y.st_ino;
}

/* Whether fd (a file just written) holds a whole PNG: the signature
 * first and the IEND chunk last (gnuplot may exit 0 after a short write,
 * on a full disk). */
static int looks_like_png(int fd)
{
	static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
	static const unsigned char iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
	unsigned char b[12];
	off_t end = lseek(fd, 0, SEEK_END);
	return end >= (off_t)(sizeof sig + sizeof iend) && pread(fd, b, 8, 0) == 8 &&
	       !memcmp(b, sig, sizeof sig) && pread(fd, b, 12, end - 12) == 12 &&
	       !memcmp(b, iend, sizeof iend);
}

/* Copies the PNG in fd to `to`, the descriptor of `out`, a device or a
 * pipe (written in place: renaming over it would replace it), every
 * write checked. */
static int copy_out(int fd, int to, const char *out)
{
	char buf[65536];
	off_t at = 0;
	ssize_t n;
	while ((n = pread(fd, buf, sizeof buf, at)) > 0) {
		if (hpu__write_all(to, buf, (size_t)n) < 0)
			return fail("cannot write %s: %s", out, strerror(errno));
		at += n;
	}
	if (n < 0)
		return fail("cannot read the PNG back: %s", strerror(errno));
	return OK;
}

/* Runs gnuplot into fd, a regular file at `into`, and checks the PNG. */
static int render(const char *gp, const char *dir, int fd, const char *into)
{
	int rc = run_gnuplot(gp, dir, fd);
	if (rc == OK && !looks_like_png(fd))
		rc = fail("gnuplot wrote no complete PNG to %s (a full disk?)", into);
	return rc;
}

/* Writes table and script into dir, runs gnuplot into OUT's temporary
 * file and renames that to OUT (an hpu_outfile); for an OUT written in
 * place (a device or a pipe), into dir/plot.png, then copied. */
static int draw(const args *A, const table *t, const layout *L, const char *gp,
		const char *dir)
{
	char data[4200], script[4200], png[4200];
	FILE *f = fopen(in_dir(data, sizeof data, dir, "data.txt"), "w");
	int bad = !f || hpu__plt_write_table(f, t, L) < 0;
	if (f && fclose(f) != 0)
		bad = 1;
	if (bad)
		return fail("cannot write %s: %s", data, strerror(errno));
	if (t->vn) {
		f = fopen(in_dir(data, sizeof data, dir, "val.txt"), "w");
		bad = !f || hpu__plt_write_vtable(f, t) < 0;
		if (f && fclose(f) != 0)
			bad = 1;
		if (bad)
			return fail("cannot write %s: %s", data, strerror(errno));
	}
	f = fopen(in_dir(script, sizeof script, dir, "plot.gp"), "w");
	bad = !f || hpu__plt_write_script(f, A, t, L) < 0;
	if (f && fclose(f) != 0)
		bad = 1;
	if (bad)
		return fail("cannot write %s: %s", script, strerror(errno));
	hpu_outfile o;
	const char *step;
	int rc = OK;
	hpu__tool_guard_hold(1); /* a signal removes OUT.tmp.PID */
	int opened = hpu__outfile_open(&o, A->out, 0666) == 0;
	int guard = opened && !o.direct ? hpu__tool_guard_add(HPU_GUARD_FILE, o.tmp, 0) : -1;
	hpu__tool_guard_hold(0);
	if (!opened) {
		rc = fail("cannot write %s: %s", o.direct ? A->out : o.tmp, strerror(errno));
	} else if (!o.direct) {
		rc = render(gp, dir, o.fd, o.tmp);
	} else { /* the PNG is read back: a regular file first */
		int fd = open(in_dir(png, sizeof png, dir, "plot.png"),
			      O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
		rc = fd < 0 ? fail("cannot write %s: %s", png, strerror(errno))
			    : render(gp, dir, fd, png);
		if (rc == OK)
			rc = copy_out(fd, o.fd, A->out);
		if (fd >= 0)
			close(fd);
	}
	if (rc == OK && hpu__outfile_commit(&o, &step) != 0) {
		if (!strcmp(step, "rename"))
			rc = fail("cannot rename %s to %s: %s", o.tmp, o.path, strerror(errno));
		else
			rc = fail("cannot write %s: %s", o.direct ? A->out : o.tmp,
				  strerror(errno));
	}
	hpu__outfile_abort(&o); /* what is left after a failure */
	hpu__tool_guard_drop(&guard);
	return rc;
}

/* Makes the temporary directory, draws, removes the directory. */
int hpu__plt_draw_in_tmpdir(const args *A, const table *t, const layout *L, const char *gp)
{
	const char *base = hpu__env_str(HPU_ENV_TMPDIR);
	char dir[4096], p[4200];
	snprintf(dir, sizeof dir, "%s/hpu-plot.XXXXXX", base && *base ? base : "/tmp");
	hpu__tool_guard_hold(1); /* a signal removes the directory and its files */
	if (!mkdtemp(dir)) {
		hpu__tool_guard_hold(0);
		return fail("cannot make a temporary directory in %s: %s",
			    base && *base ? base : "/tmp", strerror(errno));
	}
	int guard = hpu__tool_guard_add(HPU_GUARD_TREE, dir, 0);
	hpu__tool_guard_hold(0);
	int rc = draw(A, t, L, gp, dir);
	static const char *const files[] = {"data.txt", "val.txt", "plot.gp", "gnuplot.err",
					    "plot.png"};
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
		unlink(in_dir(p, sizeof p, dir, files[i]));
	rmdir(dir);
	hpu__tool_guard_drop(&guard);
	return rc;
}
