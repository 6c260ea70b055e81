/* What the node agent removes after a job (hpu__agent_cleanup): the ZeroMQ
 * ipc files /tmp/hpucoll-<job>-r<rank> of its workers, and nothing that
 * another user made at those names (hpud runs as root: it used to remove
 * any file there). A link is judged by its own owner and never followed.
 * And what it removes before one (hpu__agent_sweep_ipc): the ipc files of
 * jobs that ended by kill -9, with nobody left to remove them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ev.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/coord.h" /* hpu__coord_reason_interrupted */

static void make_file(const char *path, uid_t uid)
{
	int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);

	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(chown(path, uid, uid), 0);
}

static void test_ipc_files_of_the_workers_only(void **state)
{
	char job[64], p[4][128], target[128];
	struct stat st;
	hpu_agent_cfg cfg = {.devices = 4, .nodes = 1};
	hpu_agent *a;

	(void)state;
	if (geteuid() != 0)
		skip(); /* giving files to other users needs root */
	snprintf(job, sizeof(job), "cleanup%d", (int)getpid());
	cfg.job_id = job;
	for (int r = 0; r < 4; r++)
		snprintf(p[r], sizeof(p[r]), "/tmp/hpucoll-%s-r%d", job, r);
	snprintf(target, sizeof(target), "/tmp/hpucoll-test-%d-target",
		 (int)getpid());
	make_file(p[0], 0);         /* the workers' (root's): removed */
	make_file(p[1], 65534);     /* another user's: stays */
	make_file(target, 0);       /* rank 2: another user's link to ours */
	assert_int_equal(symlink(target, p[2]), 0);
	assert_int_equal(lchown(p[2], 65534, 65534), 0);
	/* rank 3: nothing there */

	a = hpu__agent_new(ev_default_loop(0), &cfg);
	assert_non_null(a);
	assert_int_equal(hpu__agent_cleanup(a), 1);
	assert_int_equal(lstat(p[0], &st), -1);
	assert_int_equal(lstat(p[1], &st), 0);
	assert_int_equal(lstat(p[2], &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	assert_int_equal(lstat(target, &st), 0);

	/* The same files as the workers' user 65534 (job_uids): its
	 * file and its link go, root's file the link points at stays. */
	cfg.set_user = 1;
	cfg.uid = cfg.gid = 65534;
	make_file(p[0], 0);
	hpu__agent_destroy(&a);
	a = hpu__agent_new(ev_default_loop(0), &cfg);
	assert_non_null(a);
	assert_int_equal(hpu__agent_cleanup(a), 2);
	assert_int_equal(lstat(p[0], &st), 0);
	assert_int_equal(lstat(p[1], &st), -1);
	assert_int_equal(lstat(p[2], &st), -1);
	assert_int_equal(lstat(target, &st), 0);
	hpu__agent_destroy(&a);
	unlink(p[0]);
	unlink(target);
}

/* A unix socket bound at path, listening or not, its file dated
 * age_s seconds back; returns its descriptor, or closes it (-1): the file
 * stays with nothing bound, as after kill -9. */
static int make_socket(const char *path, int listening, int keep, int age_s)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timespec t[2];
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	unlink(path);
	strcpy(sa.sun_path, path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	if (listening)
		assert_int_equal(listen(fd, 4), 0);
	t[0].tv_sec = t[1].tv_sec = time(NULL) - age_s;
	t[0].tv_nsec = t[1].tv_nsec = 0;
	assert_int_equal(utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW), 0);
	if (!keep) {
		close(fd);
		return -1;
	}
	return fd;
}

/* What jobs killed with kill -9 leave (their hpulaunch, then the workers,
 * by SIGKILL): ipc files nobody listens at. The next job's agent removes
 * those, and only those: not a socket bound or listening, not one just
 * made (a job starting), not a file that is no socket, not another
 * user's. */
/* The job's shared-memory segment left by a job that died attaching is
 * removed, in any session (the agent does not learn its job's); one a
 * live process holds, open or mapped, stays: another job of the same job
 * id, its ranks attaching, lost its segment to this one's end and waited
 * a minute for a peer that had made another. */
static void test_segments_held_stay(void **state)
{
	(void)state;
	char job[64], held[160], left[160];
	snprintf(job, sizeof job, "segs%d", (int)getpid());
	snprintf(held, sizeof held, "/hpucoll-%s-%032x-n0", job, 1);
	snprintf(left, sizeof left, "/hpucoll-%s-%032x-n0", job, 2);
	int fh = shm_open(held, O_CREAT | O_EXCL | O_RDWR, 0600);
	int fl = shm_open(left, O_CREAT | O_EXCL | O_RDWR, 0600);
	assert_true(fh >= 0 && fl >= 0);
	close(fl); /* nobody holds it: a dead job's */
	hpu_agent_cfg cfg = {.devices = 1, .nodes = 1, .job_id = job};
	hpu_agent *a = hpu__agent_new(ev_default_loop(0), &cfg);
	assert_non_null(a);
	assert_int_equal(hpu__agent_cleanup(a), 1);
	struct stat st;
	char path[200];
	snprintf(path, sizeof path, "/dev/shm%s", held);
	assert_int_equal(stat(path, &st), 0); /* open here: stays */
	snprintf(path, sizeof path, "/dev/shm%s", left);
	assert_int_equal(stat(path, &st), -1);
	/* mapped, its descriptor closed: stays too */
	assert_int_equal(ftruncate(fh, 4096), 0);
	void *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fh, 0);
	assert_true(m != MAP_FAILED);
	close(fh);
	assert_int_equal(hpu__agent_cleanup(a), 0);
	snprintf(path, sizeof path, "/dev/shm%s", held);
	assert_int_equal(stat(path, &st), 0);
	munmap(m, 4096);
	assert_int_equal(hpu__agent_cleanup(a), 1); /* no one holds it now */
	assert_int_equal(stat(path, &st), -1);
	hpu__agent_destroy(&a);
}

static void test_stale_ipc_swept_at_start(void **state)
{
	char p[7][128], names[256];
	struct stat st;
	hpu_agent_cfg cfg = {.devices = 1, .nodes = 1, .job_id = "sweeper"};
	hpu_agent *a;
	int live, bound;

	(void)state;
	for (int i = 0; i < 7; i++)
		snprintf(p[i], sizeof p[i], "/tmp/hpucoll-sweep%d-%d-r%d", (int)getpid(), i, i);
	make_socket(p[0], 1, 0, 120);            /* dead: removed */
	make_socket(p[1], 0, 0, 3600);           /* dead, never listened: removed */
	live = make_socket(p[2], 1, 1, 120);     /* listening: stays */
	bound = make_socket(p[3], 0, 1, 120);    /* bound, not yet listening: stays */
	make_socket(p[4], 1, 0, 5);              /* dead but just made: stays */
	make_file(p[5], geteuid());              /* no socket: stays */
	make_socket(p[6], 1, 0, 120);            /* dead, another user's: stays */
	if (geteuid() == 0)
		assert_int_equal(lchown(p[6], 65534, 65534), 0);

	a = hpu__agent_new(ev_default_loop(0), &cfg);
	assert_non_null(a);
	/* other jobs' leftovers in /tmp may go too: at least ours */
	assert_true(hpu__agent_sweep_ipc(a, names, sizeof names) >= (geteuid() == 0 ? 2 : 3));
	assert_non_null(strstr(names, p[0] + 5));
	assert_non_null(strstr(names, p[1] + 5));
	assert_int_equal(lstat(p[0], &st), -1);
	assert_int_equal(lstat(p[1], &st), -1);
	for (int i = 2; i < 6; i++)
		assert_int_equal(lstat(p[i], &st), 0);
	if (geteuid() == 0)
		assert_int_equal(lstat(p[6], &st), 0);
	/* nothing left to remove: a second sweep finds none */
	assert_int_equal(hpu__agent_sweep_ipc(a, names, sizeof names), 0);
	assert_string_equal(names, "");
	hpu__agent_destroy(&a);
	close(live);
	close(bound);
	for (int i = 0; i < 7; i++)
		unlink(p[i]);
}

/* A lock file dated age_s seconds back, of this user. */
static void make_lock(const char *path, int age_s)
{
	struct timespec t[2];
	unlink(path);
	make_file(path, geteuid());
	t[0].tv_sec = t[1].tv_sec = time(NULL) - age_s;
	t[0].tv_nsec = t[1].tv_nsec = 0;
	assert_int_equal(utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW), 0);
}

/* The lock files beside ipc files (collectives/comm.c holds PATH.lock):
 * kill -9 left them, and nothing removed them (one per rank of every such
 * job, for ever). Removed with a dead socket beside them, or alone when
 * old and held by no process; a held one and a new one stay. */
static void test_stale_locks_swept(void **state)
{
	char sock[128], l[4][140], names[512];
	struct stat st;
	hpu_agent_cfg cfg = {.devices = 1, .nodes = 1, .job_id = "sweeper"};

	(void)state;
	snprintf(sock, sizeof sock, "/tmp/hpucoll-locks%d-0-r0", (int)getpid());
	make_socket(sock, 1, 0, 120);                    /* dead */
	snprintf(l[0], sizeof l[0], "%s.lock", sock);   /* beside it: removed */
	make_lock(l[0], 120);
	snprintf(l[1], sizeof l[1], "/tmp/hpucoll-locks%d-1-r1.lock", (int)getpid());
	make_lock(l[1], 120);                            /* alone, old, free: removed */
	snprintf(l[2], sizeof l[2], "/tmp/hpucoll-locks%d-2-r2.lock", (int)getpid());
	make_lock(l[2], 120);                            /* alone, old, held: stays */
	snprintf(l[3], sizeof l[3], "/tmp/hpucoll-locks%d-3-r3.lock", (int)getpid());
	make_lock(l[3], 5);                              /* alone, new: stays */
	int held = open(l[2], O_RDWR | O_CLOEXEC);
	assert_true(held >= 0);
	assert_int_equal(flock(held, LOCK_EX | LOCK_NB), 0);

	hpu_agent *a = hpu__agent_new(ev_default_loop(0), &cfg);
	assert_non_null(a);
	assert_true(hpu__agent_sweep_ipc(a, names, sizeof names) >= 2);
	printf("  swept: %s\n", names);
	assert_int_equal(lstat(sock, &st), -1);
	assert_int_equal(lstat(l[0], &st), -1);
	assert_int_equal(lstat(l[1], &st), -1);
	assert_int_equal(lstat(l[2], &st), 0);
	assert_int_equal(lstat(l[3], &st), 0);
	assert_non_null(strstr(names, l[1] + 5));
	hpu__agent_destroy(&a);
	close(held);
	for (int i = 0; i < 4; i++)
		unlink(l[i]);
}

/* The reasons that say a user interrupted a node's hpulaunch (no node
 * restarts then), bare or as the coordinator passes them on. */
static void test_interrupt_reasons(void **state)
{
	(void)state;
	assert_true(hpu__coord_reason_interrupted("interrupted by SIGINT on node 1"));
	assert_true(hpu__coord_reason_interrupted("node 12: interrupted by SIGTERM on node 12"));
	assert_false(hpu__coord_reason_interrupted(NULL));
	assert_false(hpu__coord_reason_interrupted(""));
	assert_false(hpu__coord_reason_interrupted("node : interrupted by SIGINT"));
	assert_false(hpu__coord_reason_interrupted("node 1: rank 2 died"));
	assert_false(hpu__coord_reason_interrupted("rank 1 was interrupted by SIGINT"));
	assert_false(hpu__coord_reason_interrupted("node 1:interrupted by SIGINT"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ipc_files_of_the_workers_only),
		cmocka_unit_test(test_segments_held_stay),
		cmocka_unit_test(test_stale_ipc_swept_at_start),
		cmocka_unit_test(test_interrupt_reasons),
		cmocka_unit_test(test_stale_locks_swept),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
