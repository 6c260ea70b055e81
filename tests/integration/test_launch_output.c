/* Integration tests of hpulaunch's output that cannot be written (a full
 * stdout, a closed pipe, a full log disk) and of over-long lines: the
 * real hpulaunch with shell workers (--exec). Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/harness.h"

#define LAUNCH h_build("bin/hpulaunch")

/* ---- output that cannot be written ---- */

/* How many times `text` occurs in out. */
static int occurrences(const char *out, const char *text)
{
	int n = 0;
	for (const char *s = out; (s = strstr(s, text)); s++)
		n++;
	return n;
}

/* hpulaunch > /dev/full: the workers' lines cannot be written. hpulaunch
 * says so once on stderr, naming stdout and the error, lets the job run
 * to its end and exits 3 (it said nothing and exited 0). */
static void test_stdout_full(void **state)
{
	(void)state;
	char done[64], script[256];
	snprintf(done, sizeof done, "/tmp/hpu-test-full-%d", (int)getpid());
	unlink(done);
	snprintf(script, sizeof script,
		 "for i in 1 2 3 4 5; do echo line $i; done; echo to stderr >&2; touch %s", done);
	char *argv[] = {"/bin/sh", "-c", "exec \"$0\" \"$@\" >/dev/full", (char *)LAUNCH,
			"--devices", "2", "--exec", "/bin/sh", "-c", script, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 3);
	assert_int_equal(occurrences(p.out, "hpulaunch: error: cannot write to stdout: No space "
					    "left on device; the rest of it is not written (exit "
					    "status 3 at the end)\n"),
			 1);
	assert_int_equal(occurrences(p.out, "cannot write"), 1);
	assert_non_null(strstr(p.out, "] to stderr")); /* stderr still works */
	assert_int_equal(access(done, F_OK), 0);      /* the job ran to its end */
	unlink(done);
	h_free(&p);
}

/* Ctrl-C while hpulaunch's output waits for a reader that stopped
 * reading (a pager scrolled back; here a pipe of 4 KiB nobody reads): it
 * stops the workers and exits 130 (it sat in write(2), the signals did
 * nothing, the job ran to its end). */
static void test_interrupt_while_output_waits(void **state)
{
	(void)state;
	char pidfile[64], script[256];
	snprintf(pidfile, sizeof pidfile, "/tmp/hpu-test-waits-%d", (int)getpid());
	unlink(pidfile);
	snprintf(script, sizeof script,
		 "echo $$ > %s; i=0; while [ $i -lt 4000 ]; do echo line $i of a job; "
		 "i=$((i+1)); done; exec sleep 120",
		 pidfile);
	int fds[2];
	assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
	assert_true(fcntl(fds[1], F_SETPIPE_SZ, 4096) >= 4096);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fds[1], 1);
		dup2(fds[1], 2);
		execl(LAUNCH, LAUNCH, "--devices", "1", "--exec", "/bin/sh", "-c", script,
		      (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	/* the job's lines fill the pipe: hpulaunch waits to write (the job
	 * has started, its pid written, and the bytes queued stop growing for
	 * a second; hpulaunch's own first line before a slow start is not
	 * that) */
	int full = 0, last = -1, same = 0;
	for (int i = 0; i < 600 && !full; i++) {
		int queued = 0;
		usleep(100 * 1000);
		if (ioctl(fds[0], FIONREAD, &queued) != 0)
			break;
		same = queued > 0 && queued == last && access(pidfile, F_OK) == 0 ? same + 1 : 0;
		last = queued;
		full = same >= 10;
	}
	assert_true(full);
	kill(pid, SIGINT);
	int st = 0, done = 0;
	for (int i = 0; i < 400 && !done; i++) { /* a hang guard, not a timing */
		done = waitpid(pid, &st, WNOHANG) == pid;
		if (!done)
			usleep(50 * 1000);
	}
	if (!done) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
	}
	FILE *f = fopen(pidfile, "r");
	int child = 0;
	if (f) {
		if (fscanf(f, "%d", &child) != 1)
			child = 0;
		fclose(f);
	}
	int child_left = child > 0 && kill(child, 0) == 0;
	if (child_left)
		kill(child, SIGKILL);
	close(fds[0]);
	unlink(pidfile);
	printf("  SIGINT with output waiting: %s, status %d; the job's process %s\n",
	       done ? "exited" : "DID NOT EXIT in 20 s", WIFEXITED(st) ? WEXITSTATUS(st) : -1,
	       child_left ? "LEFT" : "gone");
	assert_true(done);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 130);
	assert_true(child > 0);
	assert_false(child_left);
}

/* hpulaunch >&-: stdout closed from the start. Said once naming it, the
 * job runs, exit 3 (it said "Invalid argument": libev's epoll and
 * eventfd had taken descriptors 1 and 2, and the lines went there); a run
 * that writes nothing to the closed one exits 0. */
static void test_stdout_closed_at_start(void **state)
{
	(void)state;
	char *argv[] = {"/bin/sh", "-c", "exec \"$0\" \"$@\" >&-", (char *)LAUNCH, "--devices",
			"1", "--exec", "/bin/sh", "-c", "echo to stdout; echo to stderr >&2", NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 3);
	assert_int_equal(occurrences(p.out, "hpulaunch: error: cannot write to stdout: Bad file "
					    "descriptor; the rest of it is not written (exit status "
					    "3 at the end)\n"),
			 1);
	assert_non_null(strstr(p.out, "] to stderr"));
	h_free(&p);
	/* nothing written to the closed one, nothing lost: exit 0 (a first
	 * version failed every run with stderr closed) */
	char *quiet[] = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&-", (char *)LAUNCH, "-q",
			 "--devices", "1", "--exec", "/bin/sh", "-c", "echo to stdout", NULL};
	code = h_run(&p, quiet, NULL, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "] to stdout"));
	h_free(&p);
	char *silent[] = {"/bin/sh", "-c", "exec \"$0\" \"$@\" >&-", (char *)LAUNCH, "-q",
			  "--devices", "1", "--exec", "/bin/true", NULL};
	code = h_run(&p, silent, NULL, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 0);
	h_free(&p);
}

/* hpulaunch | head -n 1: the reader goes away; hpulaunch's later writes
 * get EPIPE. As with SIGPIPE nothing is said about it, the job runs to its
 * end, and the exit status is 3: output was lost. */
static void test_stdout_closed_pipe(void **state)
{
	(void)state;
	char *argv[] = {"/bin/bash", "-c",
			"\"$0\" \"$@\" | head -n 1 >/dev/null; echo \"status ${PIPESTATUS[0]}\"",
			(char *)LAUNCH, "-q", "--devices", "1", "--exec", "/bin/sh", "-c",
			"echo first; sleep 0.5; for i in 1 2 3; do echo line $i; done; echo done >&2",
			NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "[rank 0] done\n")); /* the job ran on */
	assert_non_null(strstr(p.out, "status 3\n"));
	assert_null(strstr(p.out, "cannot write"));
	h_free(&p);
}

/* --log-dir on a full disk (a tmpfs of 8 KiB, filled, in a mount
 * namespace): each rank's log file is said once to be unwritable, with
 * the error; the job runs to its end, its lines still on stdout, and
 * hpulaunch exits 3 (it said nothing and exited 0). Needs root for the
 * namespace; skipped without. */
static void test_log_dir_full_disk(void **state)
{
	(void)state;
	char dir[] = "/tmp/hpu-test-logfull-XXXXXX";
	assert_non_null(mkdtemp(dir));
	char *argv[] = {"/usr/bin/unshare", "-m", "/bin/sh", "-c",
			"mount -t tmpfs -o size=8k tmpfs \"$0\" || exit 77; "
			"cat /dev/zero >\"$0/fill\" 2>/dev/null; exec \"$@\"",
			dir, (char *)LAUNCH, "--devices", "2", "--log-dir", dir, "--exec",
			"/bin/sh", "-c", "for i in 1 2 3; do echo line $i; done", NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	printf("%s", p.out);
	if (code == 77 || code == 127 || (code == 1 && strstr(p.out, "unshare"))) {
		printf("skipping: no mount namespace with a tmpfs here (not root?)\n");
		h_free(&p);
		rmdir(dir);
		return;
	}
	assert_int_equal(code, 3);
	for (int r = 0; r < 2; r++) {
		char want[160];
		snprintf(want, sizeof want,
			 "hpulaunch: error: cannot write the log file %s/rank_%d.log: No space left "
			 "on device; the rest of it is not written",
			 dir, r);
		assert_int_equal(occurrences(p.out, want), 1);
		snprintf(want, sizeof want, "[rank %d] line 3\n", r);
		assert_non_null(strstr(p.out, want));
	}
	assert_int_equal(occurrences(p.out, "cannot write"), 2);
	h_free(&p);
	assert_int_equal(rmdir(dir), 0); /* the tmpfs went with the namespace */
}

/* A --log-dir that is not there is made, parents too, as --checkpoint-dir
 * is (each rank's log failed to open, exit 1); one that cannot be made
 * is refused before anything starts (exit 2). */
static void test_log_dir_made(void **state)
{
	(void)state;
	char base[] = "/tmp/hpu-test-logmk-XXXXXX", dir[96], log[128], rm[128];
	assert_non_null(mkdtemp(base));
	snprintf(dir, sizeof dir, "%s/a/b", base);
	char *argv[] = {(char *)LAUNCH, "--devices", "1", "--log-dir", dir, "--exec", "/bin/sh",
			"-c", "echo hello", NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	if (code != 0)
		fail_msg("exit %d:\n%s", code, p.out);
	h_free(&p);
	snprintf(log, sizeof log, "%s/rank_0.log", dir);
	char *text = h_slurp(log);
	assert_non_null(text);
	assert_non_null(strstr(text, "hello"));
	free(text);
	snprintf(log, sizeof log, "%s/file", base);
	FILE *f = fopen(log, "w");
	assert_non_null(f);
	fclose(f);
	snprintf(dir, sizeof dir, "%s/file/sub", base);
	code = h_run(&p, argv, NULL, 60000);
	assert_int_equal(code, 2);
	char want[200];
	snprintf(want, sizeof want, "error: cannot make the log directory %s", dir);
	if (!strstr(p.out, want) || !strstr(p.out, "Not a directory"))
		fail_msg("no \"%s\" in:\n%s", want, p.out);
	h_free(&p);
	/* a command refused for another output makes no log directory */
	snprintf(dir, sizeof dir, "%s/new/logs", base);
	char *refused[] = {(char *)LAUNCH, "-q", "--devices", "1", "--log-dir", dir, "--save-params",
			   "/nonexistent/x.bin", (char *)h_build("lib/fmnist_mlp.so"), NULL};
	code = h_run(&p, refused, NULL, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 2);
	assert_non_null(strstr(p.out, "--save-params"));
	snprintf(log, sizeof log, "%s/new", base);
	assert_int_equal(access(log, F_OK), -1);
	h_free(&p);
	snprintf(rm, sizeof rm, "rm -rf %s", base);
	assert_int_equal(system(rm), 0);
}

/* Holds an exclusive flock on path (made with `text`), as a running job
 * writing it does; returns the descriptor. */
static int held(const char *path, const char *text)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
	return fd;
}

/* Two jobs given one --metrics file, --log-dir or --profile directory
 * tore each other's lines (a metrics file hpu-plot then refused as not
 * JSON, a trace that was no JSON, one job's log lost), without a word: a
 * file another running job writes (holds locked; played here by the
 * test) is refused naming it, and left as it was (it was emptied). */
static void test_outputs_of_a_running_job(void **state)
{
	(void)state;
	char base[] = "/tmp/hpu-test-inuse-XXXXXX", path[128], want[300];
	assert_non_null(mkdtemp(base));
	const char *model = h_build("lib/fmnist_mlp.so");
	proc p;
	/* --metrics */
	snprintf(path, sizeof path, "%s/m.jsonl", base);
	int fd = held(path, "{\"other\":1}\n");
	char *m[] = {(char *)LAUNCH, "-q", "--devices", "1", "--max-steps", "2", "--no-eval",
		     "--metrics", path, (char *)model, "--", "--hidden", "8", NULL};
	int code = h_run(&p, m, NULL, 120000);
	snprintf(want, sizeof want, "cannot open the metrics file %s: another running job writes "
		 "it (it holds a lock on it): give each job its own --metrics file", path);
	if (code != 1 || !strstr(p.out, want))
		fail_msg("exit %d, no \"%s\" in:\n%s", code, want, p.out);
	h_free(&p);
	char *text = h_slurp(path);
	assert_string_equal(text, "{\"other\":1}\n");
	free(text);
	close(fd);
	/* --profile */
	snprintf(path, sizeof path, "%s/prof/perf-logs-rank0.json", base);
	char pdir[96];
	snprintf(pdir, sizeof pdir, "%s/prof", base);
	assert_int_equal(mkdir(pdir, 0755), 0);
	fd = held(path, "{}");
	char *pr[] = {(char *)LAUNCH, "-q", "--devices", "1", "--max-steps", "2", "--no-eval",
		      "--profile", pdir, (char *)model, "--", "--hidden", "8", NULL};
	code = h_run(&p, pr, NULL, 120000);
	snprintf(want, sizeof want, "--profile: cannot write %s: another running job writes it "
		 "(it holds a lock on it): give each job its own --profile directory", path);
	if (code != 1 || !strstr(p.out, want))
		fail_msg("exit %d, no \"%s\" in:\n%s", code, want, p.out);
	h_free(&p);
	close(fd);
	/* --log-dir */
	snprintf(path, sizeof path, "%s/rank_0.log", base);
	fd = held(path, "the other job's\n");
	char *lg[] = {(char *)LAUNCH, "--devices", "1", "--log-dir", base, "--exec", "/bin/sh",
		      "-c", "echo hello", NULL};
	code = h_run(&p, lg, NULL, 60000);
	snprintf(want, sizeof want, "cannot write the log file %s: another running job writes it "
		 "(it holds a lock on it): give each job its own --log-dir", path);
	if (code == 0 || !strstr(p.out, want))
		fail_msg("exit %d, no \"%s\" in:\n%s", code, want, p.out);
	h_free(&p);
	text = h_slurp(path);
	assert_string_equal(text, "the other job's\n");
	free(text);
	close(fd);
	/* nobody holds them now: taken */
	code = h_run(&p, lg, NULL, 60000);
	if (code != 0)
		fail_msg("exit %d:\n%s", code, p.out);
	h_free(&p);
	char rm[128];
	snprintf(rm, sizeof rm, "rm -rf %s", base);
	assert_int_equal(system(rm), 0);
}

/* A line longer than the agent's 64 KiB buffer goes out in pieces, each
 * but the last marked " [hpu: line continues]"; no byte is lost. */
static void test_over_long_line_marked(void **state)
{
	(void)state;
	char *argv[] = {(char *)LAUNCH, "--devices", "1", "--exec", "/bin/sh", "-c",
			"head -c 70000 /dev/zero | tr '\\0' x; echo; echo after", NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 60000);
	assert_int_equal(code, 0);
	const char *a = strstr(p.out, "[rank 0] x");
	assert_non_null(a);
	a += strlen("[rank 0] ");
	size_t first = strspn(a, "x");
	assert_int_equal(first, 65536);
	assert_int_equal(strncmp(a + first, " [hpu: line continues]\n[rank 0] ", 32), 0);
	const char *b = a + first + 32;
	assert_int_equal(strspn(b, "x"), 70000 - 65536);
	assert_int_equal(strncmp(b + 70000 - 65536, "\n[rank 0] after\n", 16), 0);
	h_free(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stdout_full),
		cmocka_unit_test(test_interrupt_while_output_waits),
		cmocka_unit_test(test_stdout_closed_at_start),
		cmocka_unit_test(test_stdout_closed_pipe),
		cmocka_unit_test(test_log_dir_made),
		cmocka_unit_test(test_log_dir_full_disk),
		cmocka_unit_test(test_over_long_line_marked),
		cmocka_unit_test(test_outputs_of_a_running_job),
	};
	/* HPU_TEST=test_name (a glob) runs only the tests it names. */
	if (getenv("HPU_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPU_TEST"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
