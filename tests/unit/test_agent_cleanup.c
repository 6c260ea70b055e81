/* What the node agent removes after a job (hpu__agent_cleanup): the ZeroMQ
 * ipc files /tmp/hpucoll-<job>-r<rank> of its workers, and nothing that
 * another user made at those names (hpud runs as root: it used to remove
 * any file there). A link is judged by its own owner and never followed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ev.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent.h"

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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ipc_files_of_the_workers_only),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
