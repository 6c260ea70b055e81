#include "agent/uidproc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/num.h"

int hpu__proc_read(pid_t pid, const char *name, char *buf, size_t len)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t k = read(fd, buf, len - 1);
	close(fd);
	if (k <= 0)
		return -1;
	buf[k] = 0;
	return 0;
}

int hpu__proc_info(pid_t pid, hpu_procinfo *pi)
{
	char buf[4096];
	if (hpu__proc_read(pid, "status", buf, sizeof buf) != 0)
		return -1;
	/* "Name:" may hold anything but a newline: every field is looked
	 * for at the start of a line */
	const char *st = strstr(buf, "\nState:"), *pp = strstr(buf, "\nPPid:"),
		   *u = strstr(buf, "\nUid:");
	int ppid;
	if (!st || !pp || !u || sscanf(st, "\nState: %c", &pi->state) != 1 ||
	    sscanf(pp, "\nPPid: %d", &ppid) != 1 ||
	    sscanf(u, "\nUid: %u %u %u %u", &pi->uid[0], &pi->uid[1], &pi->uid[2],
		   &pi->uid[3]) != 4)
		return -1;
	pi->ppid = ppid;
	return 0;
}

int hpu__proc_has_uid(const hpu_procinfo *pi, unsigned uid)
{
	for (int i = 0; i < 4; i++)
		if (pi->uid[i] == uid)
			return 1;
	return 0;
}

int hpu__proc_uid_in(const hpu_procinfo *pi, unsigned first, unsigned last)
{
	for (int i = 0; i < 4; i++)
		if (pi->uid[i] >= first && pi->uid[i] <= last)
			return 1;
	return 0;
}

/* Calls fn for every process under uid (zombies and this one aside);
 * returns how many there were. */
static int each_uid_proc(unsigned uid, void (*fn)(pid_t pid, void *arg), void *arg)
{
	pid_t self = getpid();
	int n = 0;
	DIR *dir = opendir("/proc");
	struct dirent *e;
	while (dir && (e = readdir(dir)) != NULL) {
		pid_t pid;
		hpu_procinfo pi;
		if (hpu__parse_int(e->d_name, 1, INT_MAX, &pid) || pid == self ||
		    hpu__proc_info(pid, &pi) < 0 || pi.state == 'Z' || pi.state == 'X' ||
		    !hpu__proc_has_uid(&pi, uid))
			continue;
		n++;
		if (fn)
			fn(pid, arg);
	}
	if (dir)
		closedir(dir);
	return n;
}

typedef struct pid_list {
	pid_t *pids;
	int max, n;
} pid_list;

static void add_pid(pid_t pid, void *arg)
{
	pid_list *l = arg;
	if (l->n < l->max)
		l->pids[l->n++] = pid;
}

int hpu__uid_procs(unsigned uid, pid_t *pids, int max)
{
	pid_list l = {pids, pids ? max : 0, 0};
	return each_uid_proc(uid, add_pid, &l);
}

static void kill_pid(pid_t pid, void *arg)
{
	(void)arg;
	kill(pid, SIGKILL);
}

int hpu__uid_kill(unsigned uid)
{
	if (uid == 0)
		return 0;
	pid_t helper = fork();
	if (helper == 0) {
		/* every process whose real or saved uid is ours, at once */
		if (setresuid(uid, uid, uid) == 0)
			kill(-1, SIGKILL);
		_exit(0);
	}
	while (helper > 0 && waitpid(helper, NULL, 0) < 0 && errno == EINTR)
		;
	return each_uid_proc(uid, kill_pid, NULL);
}
