/* harness: runs the real programs (hpulaunch, hpu-worker, models) from the
 * build tree for integration tests, with bounded waits so that no test can
 * hang: a command still running at its deadline is killed and reported. */
#ifndef HPU_TEST_HARNESS_H
#define HPU_TEST_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

typedef struct proc {
	pid_t pid;
	int out_fd;   /* stdout and stderr together */
	char *out;    /* collected output, NUL-terminated */
	size_t len, cap;
	int status;   /* waitpid status once exited */
	int exited;
} proc;

/* A path under the build tree ($HPU_BUILD_DIR), e.g. "bin/hpulaunch". */
const char *h_build(const char *rel);

/* Starts argv (NULL-terminated) with extra environment entries env
 * ("K=V", NULL-terminated, may be NULL), in its own process group. */
int h_start(proc *p, char *const argv[], char *const env[]);

/* Reads output until the process exits or timeout_ms passes. Returns 0
 * if it exited (p->status set), -1 on timeout (the process still runs). */
int h_wait(proc *p, int timeout_ms);

/* Kills the process group (SIGKILL), reaps, frees the output. */
void h_kill(proc *p);
void h_free(proc *p);

/* Runs argv to completion within timeout_ms (killing it after that);
 * returns the exit code, 128+signal, or -1 on timeout. */
int h_run(proc *p, char *const argv[], char *const env[], int timeout_ms);

/* Exit code (or 128+signal) of an exited process. */
int h_code(const proc *p);

/* Waits until `text` appears in p's output; 0 if seen, -1 otherwise. */
int h_wait_for(proc *p, const char *text, int timeout_ms);

/* Pids whose parent is `ppid`; returns how many (at most max). */
int h_children(pid_t ppid, pid_t *out, int max);

/* Whether pid still exists (and is not a zombie). */
int h_alive(pid_t pid);

/* Removes a directory tree (best effort); returns 0 if it is gone. */
int h_rmtree(const char *dir);

/* A new scratch directory /tmp/hpu-test-restart-XXXXXX, its name in dir
 * (len >= 29); fails the test if it cannot be made. */
void h_scratch_dir(char *dir, size_t len);

/* Whether DIR/NAME exists; whether it exists and holds `text`. */
int h_file_exists(const char *dir, const char *name);
int h_file_has(const char *dir, const char *name, const char *text);

/* SIGKILL to the process group of each of pids[0 .. n-1] still alive. */
void h_kill_groups(const pid_t *pids, int n);

/* Runs two hpulaunch (node 0 and node 1 of a torchrun-style job) to
 * their end, node 0 for at most ms0 and node 1 for ms1 after that, prints
 * their output and fails the test unless both ended in time. */
void h_two_nodes(proc *n0, char **a0, char **env0, int ms0, proc *n1, char **a1,
		 char **env1, int ms1);

/* Writes text to path (created or truncated) with the given mode;
 * returns 0, or -1 if it could not. */
int h_write_file(const char *path, const char *text, mode_t mode);

/* A TCP port free on 127.0.0.1 just now (the kernel's choice). */
int h_free_port(void);

/* Reads a whole file; NULL if it cannot. Caller frees. */
char *h_slurp(const char *path);
/* The same, with its length in *len (NUL-terminated all the same). */
char *h_slurp_n(const char *path, size_t *len);

#endif
