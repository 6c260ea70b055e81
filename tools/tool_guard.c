/* tool_guard: what an offline tool removes when a signal stops it (see
 * tool.h). The handler does only what is async-signal-safe -- kill,
 * unlink, open, getdents64, unlinkat, rmdir, close -- on paths prepared
 * before the files were made, then dies of the signal as before (the
 * pattern of worker/runtime/save_checkpoint.c's guard). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tools/tool.h"

enum { SLOTS = 8 };

static struct {
	volatile sig_atomic_t kind; /* 0: free; else HPU_GUARD_* */
	pid_t pid;
	char path[4200];
} slot[SLOTS];

static pid_t owner;         /* the tool: a child before its exec cleans nothing */
static int installed;
static sigset_t held_old;   /* the mask hpu__tool_guard_hold(1) replaced */
static const int guarded[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
#define NGUARDED (int)(sizeof guarded / sizeof guarded[0])

/* getdents64's record (the kernel's layout; glibc's readdir may allocate) */
struct dirent64_raw {
	unsigned long long ino;
	long long off;
	unsigned short reclen;
	unsigned char type;
	char name[];
};

static int dot_or_dotdot(const char *s)
{
	return s[0] == '.' && (!s[1] || (s[1] == '.' && !s[2]));
}

/* Removes the files of directory `dir` (one level, as the tools' are),
 * then the directory. Passes until one finds nothing: entries removed
 * while being listed may hide others from that pass. */
static void remove_tree(const char *dir)
{
	static char buf[8192];
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		for (int pass = 0, removed = 1; removed && pass < 100; pass++) {
			removed = 0;
			lseek(fd, 0, SEEK_SET);
			long n;
			while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0)
				for (long at = 0; at < n;) {
					struct dirent64_raw *d = (struct dirent64_raw *)(buf + at);
					at += d->reclen;
					if (!dot_or_dotdot(d->name) && unlinkat(fd, d->name, 0) == 0)
						removed = 1;
				}
		}
		close(fd);
	}
	rmdir(dir);
}

static void on_signal(int sig)
{
	int e = errno;
	if (getpid() == owner) {
		for (int i = 0; i < SLOTS; i++) /* first the children that write */
			if (slot[i].kind == HPU_GUARD_PID)
				kill(slot[i].pid, SIGKILL);
		for (int i = 0; i < SLOTS; i++)
			if (slot[i].kind == HPU_GUARD_FILE)
				unlink(slot[i].path);
		for (int i = 0; i < SLOTS; i++)
			if (slot[i].kind == HPU_GUARD_TREE)
				remove_tree(slot[i].path);
	}
	errno = e;
	signal(sig, SIG_DFL);
	raise(sig); /* delivered when the handler returns: the tool dies of it */
}

/* Takes the signals whose action is the default (one ignored stays
 * ignored: a closed pipe is then a write error, cleaned up as one). */
static void install(void)
{
	struct sigaction sa, old;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	for (int i = 0; i < NGUARDED; i++)
		sigaddset(&sa.sa_mask, guarded[i]);
	owner = getpid();
	for (int i = 0; i < NGUARDED; i++)
		if (sigaction(guarded[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL)
			sigaction(guarded[i], &sa, NULL);
	installed = 1;
}

int hpu__tool_guard_add(int kind, const char *path, pid_t pid)
{
	if (!installed)
		install();
	for (int i = 0; i < SLOTS; i++)
		if (!slot[i].kind) {
			snprintf(slot[i].path, sizeof slot[i].path, "%s", path ? path : "");
			slot[i].pid = pid;
			atomic_signal_fence(memory_order_seq_cst);
			slot[i].kind = kind; /* last: the handler reads a whole slot */
			return i;
		}
	return -1;
}

void hpu__tool_guard_drop(int *id)
{
	if (*id >= 0 && *id < SLOTS)
		slot[*id].kind = 0;
	*id = -1;
}

void hpu__tool_guard_hold(int on)
{
	if (on) {
		sigset_t set;
		sigemptyset(&set);
		for (int i = 0; i < NGUARDED; i++)
			sigaddset(&set, guarded[i]);
		sigprocmask(SIG_BLOCK, &set, &held_old);
	} else {
		sigprocmask(SIG_SETMASK, &held_old, NULL);
	}
}
