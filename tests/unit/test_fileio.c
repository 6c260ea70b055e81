/* common/fileio.c, hex.c, shmname.c and thread.c: input files refused or
 * read whole, output files written whole or not at all, hex digits both
 * ways, shared-memory segment names recognized, helper threads started
 * with the stop signals blocked. (The callers' sentences are
 * tested with them: test_config, test_ckpt, test_auth, test_shm.) */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/fileio.h"
#include "common/hex.h"
#include "common/shmname.h"
#include "common/thread.h"

#include <pthread.h>
#include <signal.h>
#include "tests/unit/tmp_testlib.h"


/* The names in dir that start with prefix. */
static int count_prefix(const char *prefix)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c '^%s'", tmp_dir, prefix);
	FILE *p = popen(cmd, "r");
	int n = -1;
	assert_non_null(p);
	assert_int_equal(fscanf(p, "%d", &n), 1);
	pclose(p);
	return n;
}

static void put(const char *path, const void *data, size_t n)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, n, f), n);
	assert_int_equal(fclose(f), 0);
}

/* ---- reading ---- */

static void test_open_input(void **state)
{
	(void)state;
	struct stat st;
	const char *why = NULL;
	assert_int_equal(mkfifo(tmp_at("fifo"), 0600), 0);
	alarm(10); /* a hang fails instead of blocking ctest */
	assert_int_equal(hpu__open_input_fd(tmp_at("fifo"), 0, &st, &why), -1);
	assert_string_equal(why, "not a regular file (a FIFO)");
	assert_true(S_ISFIFO(st.st_mode));
	alarm(0);
	assert_int_equal(hpu__open_input_fd(tmp_dir, 0, &st, &why), -1);
	assert_string_equal(why, strerror(EISDIR));
	assert_int_equal(hpu__open_input_fd("/dev/null", 0, &st, &why), -1);
	assert_string_equal(why, "not a regular file (a character device)");
	assert_int_equal(hpu__open_input_fd(tmp_at("none"), 0, &st, &why), -1);
	assert_int_equal(errno, ENOENT);
	assert_int_equal(st.st_mode, 0);
	/* a regular file: open, blocking, through a link unless O_NOFOLLOW */
	put(tmp_at("f"), "abc", 3);
	assert_int_equal(symlink("f", tmp_at("link")), 0);
	int fd = hpu__open_input_fd(tmp_at("link"), 0, &st, &why);
	assert_true(fd >= 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
	close(fd);
	assert_int_equal(hpu__open_input_fd(tmp_at("link"), O_NOFOLLOW, &st, &why), -1);
	assert_int_equal(errno, ELOOP);
}

static void test_read(void **state)
{
	(void)state;
	char *buf = NULL;
	size_t len = 0;
	put(tmp_at("t"), "one\ntwo\n", 8);
	assert_null(hpu__read_file(tmp_at("t"), &buf, &len));
	assert_int_equal(len, 8);
	assert_string_equal(buf, "one\ntwo\n");
	free(buf);
	/* text: 16 MiB is the most, and no NUL */
	size_t max = 16 << 20;
	char *big = malloc(max + 1);
	assert_non_null(big);
	memset(big, 'x', max + 1);
	put(tmp_at("max"), big, max);
	put(tmp_at("over"), big, max + 1);
	assert_null(hpu__read_file(tmp_at("max"), &buf, &len));
	assert_int_equal(len, max);
	free(buf);
	assert_string_equal(hpu__read_file(tmp_at("over"), &buf, &len), "larger than 16 MiB");
	/* not text: any size, NULs too */
	big[7] = 0;
	put(tmp_at("bin"), big, max + 1);
	FILE *f = fopen(tmp_at("bin"), "rb");
	assert_non_null(f);
	assert_null(hpu__read_stream(f, 0, &buf, &len));
	fclose(f);
	assert_int_equal(len, max + 1);
	assert_memory_equal(buf, big, max + 1);
	assert_int_equal(buf[len], 0);
	free(buf);
	put(tmp_at("nul"), "a\0b", 3);
	assert_string_equal(hpu__read_file(tmp_at("nul"), &buf, &len),
			    "it holds a NUL byte: not a text file");
	free(big);
}

/* ---- writing ---- */

static void test_write_atomic(void **state)
{
	(void)state;
	char err[512], *buf;
	size_t len;
	put(tmp_at("out"), "old", 3);
	assert_int_equal(hpu__write_atomic(tmp_at("out"), "new text", 8, err, sizeof err), 0);
	assert_null(hpu__read_file(tmp_at("out"), &buf, &len));
	assert_string_equal(buf, "new text");
	free(buf);
	/* through a symbolic link: the file it leads to, the link stays */
	assert_int_equal(symlink("out", tmp_at("ln")), 0);
	assert_int_equal(hpu__write_atomic(tmp_at("ln"), "via link", 8, err, sizeof err), 0);
	struct stat st;
	assert_int_equal(lstat(tmp_at("ln"), &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	assert_null(hpu__read_file(tmp_at("out"), &buf, &len));
	assert_string_equal(buf, "via link");
	free(buf);
	assert_int_equal(count_prefix("out.tmp"), 0);
	/* a device in place; a full one says so */
	assert_int_equal(hpu__write_atomic("/dev/null", "x", 1, err, sizeof err), 0);
	assert_int_equal(hpu__write_atomic("/dev/full", "x", 1, err, sizeof err), -1);
	assert_string_equal(err, "writing /dev/full: No space left on device");
	/* no directory to create the temporary file in */
	assert_int_equal(hpu__write_atomic(tmp_at("no/f"), "x", 1, err, sizeof err), -1);
	assert_non_null(strstr(err, "cannot create "));
	assert_non_null(strstr(err, "/no/f.tmp."));
	/* onto a directory: the rename fails, the temporary file goes */
	assert_int_equal(mkdir(tmp_at("d"), 0755), 0);
	put(tmp_at("d/x"), "x", 1);
	assert_int_equal(hpu__write_atomic(tmp_at("d"), "x", 1, err, sizeof err), -1);
	assert_non_null(strstr(err, "cannot rename "));
	assert_int_equal(count_prefix("d.tmp"), 0);
	assert_int_equal(hpu__fsync_dir(tmp_dir, err, sizeof err), 0);
	assert_int_equal(hpu__fsync_dir(tmp_at("none"), err, sizeof err), -1);
	assert_non_null(strstr(err, "cannot open directory "));
}

/* Directories made with their parents; a file in the way of the last
 * component is no directory (it was taken as one: HPU_MEMORY_PEAK=FILE
 * found out only when it wrote its report). */
static void test_make_dirs(void **state)
{
	(void)state;
	char err[512];
	struct stat st;
	assert_int_equal(hpu__make_dirs_said("test", tmp_at("a/b/c"), err, sizeof err), 0);
	assert_int_equal(stat(tmp_at("a/b/c"), &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(hpu__make_dirs_said("test", tmp_at("a/b/c/"), err, sizeof err), 0);
	put(tmp_at("f"), "x", 1);
	assert_int_equal(hpu__make_dirs_said("test", tmp_at("f"), err, sizeof err), -1);
	assert_non_null(strstr(err, "cannot make the test directory "));
	assert_non_null(strstr(err, "/f: Not a directory"));
	assert_int_equal(hpu__make_dirs_said("test", tmp_at("f/sub"), err, sizeof err), -1);
	assert_non_null(strstr(err, "Not a directory"));
}

/* An abandoned outfile leaves the old file and no temporary one; a
 * committed stream replaces it whole. */
static void test_outfile(void **state)
{
	(void)state;
	hpu_outfile o;
	char *buf;
	size_t len;
	put(tmp_at("keep"), "old", 3);
	assert_int_equal(hpu__outfile_open(&o, tmp_at("keep"), 0644), 0);
	assert_int_equal(hpu__write_all(o.fd, "half", 4), 0);
	assert_int_equal(count_prefix("keep.tmp."), 1);
	hpu__outfile_abort(&o);
	hpu__outfile_abort(&o); /* twice is fine */
	assert_int_equal(count_prefix("keep.tmp."), 0);
	assert_null(hpu__read_file(tmp_at("keep"), &buf, &len));
	assert_string_equal(buf, "old");
	free(buf);
	assert_int_equal(hpu__outfile_open(&o, tmp_at("keep"), 0644), 0);
	FILE *f = hpu__outfile_stream(&o);
	assert_non_null(f);
	assert_true(fprintf(f, "%s %d\n", "streamed", 42) > 0);
	const char *step = NULL;
	assert_int_equal(hpu__outfile_commit(&o, &step), 0);
	hpu__outfile_abort(&o); /* after commit: nothing to do */
	assert_null(hpu__read_file(tmp_at("keep"), &buf, &len));
	assert_string_equal(buf, "streamed 42\n");
	free(buf);
	assert_int_equal(count_prefix("keep.tmp."), 0);
	assert_int_equal(hpu__outfile_open(&o, "/dev/full", 0644), 0);
	assert_true(o.direct);
	f = hpu__outfile_stream(&o);
	assert_non_null(f);
	fputs("x", f);
	assert_int_equal(hpu__outfile_commit(&o, &step), -1);
	assert_string_equal(step, "write");
	assert_int_equal(errno, ENOSPC);
	hpu__outfile_abort(&o);
}

static void exit_seven(int sig)
{
	(void)sig;
	_exit(7);
}

/* A signal while an outfile opened by hpu__outfile_open_guarded is
 * written removes its temporary file, then ends the process as it would
 * have (--save-params left PATH.tmp.PID of hundreds of MB); a handler
 * already set is left alone (a checkpoint save's names its own files);
 * unguarded, or after an open that failed, the actions are the default
 * ones again. */
static void test_outfile_guard(void **state)
{
	(void)state;
	for (int own = 0; own < 2; own++) {
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			hpu_outfile o;
			if (own)
				signal(SIGTERM, exit_seven);
			if (hpu__outfile_open_guarded(&o, tmp_at("guarded"), 0644) < 0 ||
			    hpu__write_all(o.fd, "half", 4) < 0)
				_exit(3);
			raise(SIGTERM);
			_exit(4);
		}
		int st = 0;
		assert_int_equal(waitpid(pid, &st, 0), pid);
		if (own) {
			assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 7);
			assert_int_equal(count_prefix("guarded.tmp."), 1);
		} else {
			assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
			assert_int_equal(count_prefix("guarded.tmp."), 0);
		}
		assert_int_equal(access(tmp_at("guarded"), F_OK), -1);
	}
	/* unguarded: the default action is back */
	hpu_outfile o;
	assert_int_equal(hpu__outfile_open_guarded(&o, tmp_at("plain"), 0644), 0);
	hpu__outfile_unguard();
	struct sigaction now;
	assert_int_equal(sigaction(SIGTERM, NULL, &now), 0);
	assert_true(now.sa_handler == SIG_DFL);
	hpu__outfile_abort(&o);
	assert_int_equal(hpu__outfile_open_guarded(&o, tmp_at("no-such-dir/x"), 0644), -1);
	assert_int_equal(errno, ENOENT);
	hpu__outfile_abort(&o);
	assert_int_equal(sigaction(SIGTERM, NULL, &now), 0);
	assert_true(now.sa_handler == SIG_DFL);
}

/* A symbolic link to nothing (as /dev/stdout is with descriptor 1 closed)
 * is opened in place, which fails naming the link and its target, and
 * stays: renamed over, it became a regular file (as root, /dev/stdout
 * itself). */
static void test_outfile_dangling_link(void **state)
{
	(void)state;
	char link[600], err[512];
	struct stat st;
	snprintf(link, sizeof link, "%s", tmp_at("stdout-link"));
	assert_int_equal(symlink("/proc/self/fd/987", link), 0);
	assert_int_equal(hpu__write_atomic(link, "data", 4, err, sizeof err), -1);
	assert_non_null(strstr(err, "stdout-link: a symbolic link to /proc/self/fd/987, which does not "
				    "exist (that descriptor is closed)"));
	assert_int_equal(lstat(link, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	assert_int_equal(count_prefix("stdout-link.tmp."), 0);
	assert_int_equal(unlink(link), 0);
	assert_int_equal(symlink(tmp_at("no-such-dir/out"), link), 0);
	assert_int_equal(hpu__write_atomic(link, "data", 4, err, sizeof err), -1);
	assert_non_null(strstr(err, "no-such-dir/out, which does not exist"));
	assert_null(strstr(err, "descriptor"));
	assert_int_equal(lstat(link, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	assert_int_equal(unlink(link), 0);
	/* a link to a file not made yet, in a directory that is there (by a
	 * relative name, through a second link): the file is written, the
	 * links stay */
	char made[600], mid[600];
	snprintf(made, sizeof made, "%s", tmp_at("made-later"));
	snprintf(mid, sizeof mid, "%s", tmp_at("mid-link"));
	assert_int_equal(symlink("made-later", mid), 0);
	assert_int_equal(symlink(mid, link), 0);
	assert_int_equal(hpu__write_atomic(link, "data", 4, err, sizeof err), 0);
	char *buf;
	size_t n;
	assert_null(hpu__read_file(made, &buf, &n));
	assert_int_equal(n, 4);
	assert_memory_equal(buf, "data", 4);
	free(buf);
	assert_int_equal(lstat(link, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	assert_int_equal(lstat(mid, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	assert_int_equal(count_prefix("made-later.tmp."), 0);
	assert_int_equal(unlink(link), 0);
	assert_int_equal(unlink(mid), 0);
	assert_int_equal(unlink(made), 0);
}

/* ---- hex ---- */

/* hpu__open_unshared against another user (as root; skipped otherwise):
 * a lock on the file held by a process that cannot write it (any user may
 * flock a 0644 file) is not another job's: the file opens, with a
 * warning (it was refused, "another running job writes it", which let
 * any local user stop a job's restart); one held by the file's owner is
 * honoured; a symbolic link of another (not root) user is not followed
 * (it pointed root's writes at any file). */
static void test_unshared_other_user(void **state)
{
	(void)state;
	if (geteuid() != 0) {
		printf("  skipped: needs root to act as another user\n");
		return;
	}
	const char *path = tmp_at("locked.jsonl");
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(chmod(tmp_dir, 0755), 0);
	int go[2], held[2];
	assert_int_equal(pipe(go), 0);
	assert_int_equal(pipe(held), 0);
	for (int owner = 0; owner < 2; owner++) {
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) { /* nobody, or (owner) root: the file's owner */
			if (!owner && (setgid(65534) || setuid(65534)))
				_exit(2);
			int rfd = open(path, O_RDONLY);
			char c = 1;
			if (rfd < 0 || flock(rfd, LOCK_EX | LOCK_NB) != 0 || write(held[1], &c, 1) != 1 ||
			    read(go[0], &c, 1) != 1)
				_exit(3);
			_exit(0);
		}
		char c;
		assert_int_equal(read(held[0], &c, 1), 1);
		const char *why = NULL;
		fd = hpu__open_unshared(path, 1, 0644, &why);
		if (owner) {
			assert_int_equal(fd, -1);
			assert_ptr_equal(why, hpu__in_use_why);
		} else {
			assert_true(fd >= 0);
			assert_non_null(why); /* the warning, for the caller */
			assert_non_null(strstr(why, "uid 65534 ("));
			assert_non_null(strstr(why, "holds a lock on it but cannot write it"));
			close(fd);
		}
		c = 1;
		assert_int_equal(write(go[1], &c, 1), 1);
		int st;
		assert_int_equal(waitpid(pid, &st, 0), pid);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	close(go[0]);
	close(go[1]);
	close(held[0]);
	close(held[1]);
	/* a link of nobody's to a file of root's */
	const char *victim = tmp_at("victim"), *link = tmp_at("nobodys-link");
	fd = open(victim, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "keep", 4), 4);
	close(fd);
	assert_int_equal(symlink(victim, link), 0);
	assert_int_equal(lchown(link, 65534, 65534), 0);
	const char *why = NULL;
	assert_int_equal(hpu__open_unshared(link, 0, 0644, &why), -1);
	assert_non_null(strstr(why, "a symbolic link of uid 65534's: not followed"));
	struct stat sb;
	assert_int_equal(stat(victim, &sb), 0);
	assert_int_equal(sb.st_size, 4); /* not truncated */
	unlink(link);
	unlink(victim);
	unlink(path);
}

static void test_hex(void **state)
{
	(void)state;
	uint8_t b[256], back[256];
	char s[513];
	for (int i = 0; i < 256; i++)
		b[i] = (uint8_t)i;
	hpu__hex(s, b, sizeof b);
	assert_int_equal(strlen(s), 512);
	assert_memory_equal(s, "000102", 6);
	assert_string_equal(s + 500, "fafbfcfdfeff");
	assert_int_equal(hpu__unhex(back, s, sizeof back), 0);
	assert_memory_equal(back, b, sizeof b);
	assert_true(hpu__is_hex(s, 512));
	assert_false(hpu__is_hex(s, 511)); /* s[511] is a digit too */
	/* one spelling: no capitals, no other characters */
	assert_int_equal(hpu__unhex(back, "0A", 1), -1);
	assert_int_equal(hpu__unhex(back, "0g", 1), -1);
	assert_int_equal(hpu__unhex(back, "0", 1), -1);
	assert_false(hpu__is_hex("abC", 3));
	/* a digit's value in either case (key files) */
	assert_int_equal(hpu__hex_digit('0'), 0);
	assert_int_equal(hpu__hex_digit('f'), 15);
	assert_int_equal(hpu__hex_digit('F'), 15);
	assert_int_equal(hpu__hex_digit('g'), -1);
	assert_int_equal(hpu__hex_digit('/'), -1);
}

/* ---- shared-memory segment names ---- */

static void test_shm_names(void **state)
{
	(void)state;
	const char *ses = "0123456789abcdef0123456789abcdef";
	char name[128];
	int s = -1;
	assert_true(hpu__shm_session_ok(ses));
	assert_false(hpu__shm_session_ok("0123456789abcdef0123456789abcde"));
	assert_false(hpu__shm_session_ok("0123456789abcdef0123456789abcdef0"));
	assert_false(hpu__shm_session_ok("0123456789ABCDEF0123456789abcdef"));
	assert_false(hpu__shm_session_ok(NULL));
	assert_int_equal(hpu__shm_seg_node("hpucoll-job7-n3", "job7", &s), 3);
	assert_int_equal(s, 0);
	snprintf(name, sizeof name, "hpucoll-job7-%s-n12", ses);
	assert_int_equal(hpu__shm_seg_node(name, "job7", &s), 12);
	assert_int_equal(s, 1);
	assert_int_equal(hpu__shm_seg_node(name, "job", NULL), -1);
	/* another job whose id starts with this one's */
	assert_int_equal(hpu__shm_seg_node("hpucoll-job7-n0-n1", "job7", NULL), -1);
	assert_int_equal(hpu__shm_seg_node("hpucoll-job7-x-n1", "job7", NULL), -1);
	/* the node as %d writes it */
	assert_int_equal(hpu__shm_seg_node("hpucoll-job7-n", "job7", NULL), -1);
	assert_int_equal(hpu__shm_seg_node("hpucoll-job7-n01", "job7", NULL), -1);
	assert_int_equal(hpu__shm_seg_node("hpucoll-job7-n-1", "job7", NULL), -1);
	assert_int_equal(hpu__shm_seg_node("hpucoll-job7-n0", "job7", NULL), 0);
	assert_int_equal(hpu__shm_seg_node("hpucoll-job7-n999999999", "job7", NULL), 999999999);
	assert_int_equal(hpu__shm_seg_node("hpucoll-job7-n9999999999", "job7", NULL), -1);
	assert_int_equal(hpu__shm_seg_node("hpucoll-job7-n3x", "job7", NULL), -1);
	snprintf(name, sizeof name, "hpucoll-job7-%.31s-n1", ses); /* a session too short */
	assert_int_equal(hpu__shm_seg_node(name, "job7", NULL), -1);
}

/* The mask a helper thread started with (its SIGTERM, SIGINT, SIGHUP
 * blocked: the stop signals go to the main thread, where a checkpoint
 * save's cleanup handler runs in the thread it cleans up after). */
static void *mask_of(void *arg)
{
	pthread_sigmask(SIG_BLOCK, NULL, (sigset_t *)arg);
	return NULL;
}

static void test_thread_quiet(void **state)
{
	(void)state;
	sigset_t in, mine;
	pthread_t t;
	assert_int_equal(hpu__thread_start(&t, mask_of, &in), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_true(sigismember(&in, SIGTERM) && sigismember(&in, SIGINT) &&
		    sigismember(&in, SIGHUP));
	assert_false(sigismember(&in, SIGSEGV));
	pthread_sigmask(SIG_BLOCK, NULL, &mine); /* the caller's is kept */
	assert_false(sigismember(&mine, SIGTERM));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_open_input), cmocka_unit_test(test_read),
		cmocka_unit_test(test_write_atomic), cmocka_unit_test(test_make_dirs),
		cmocka_unit_test(test_outfile),
		cmocka_unit_test(test_outfile_dangling_link),
		cmocka_unit_test(test_outfile_guard),
		cmocka_unit_test(test_unshared_other_user),
		cmocka_unit_test(test_hex), cmocka_unit_test(test_shm_names),
		cmocka_unit_test(test_thread_quiet),
	};
	return cmocka_run_group_tests(tests, tmp_setup, tmp_teardown);
}
