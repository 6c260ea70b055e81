/* uidproc: the processes that run under a uid, found in /proc and ended.
 * hpud gives each job a uid of its own (hpud.conf's job_uids); what runs
 * under that uid is the job's, wherever it went (a double fork, setsid,
 * an empty environment), so the job's end ends it all (agent.h), and a
 * uid is given out only while nothing runs under it (daemon/hpud.c).
 *
 * A process runs under uid when its real, effective, saved or filesystem
 * uid is uid; zombies (dead, waiting for their parent) and the calling
 * process do not count. */
#ifndef HPU_UIDPROC_H
#define HPU_UIDPROC_H

#include <sys/types.h>

/* What /proc/PID/status says of a process. */
typedef struct hpu_procinfo {
	pid_t ppid;
	char state;       /* 'R', 'S', ..., 'Z' */
	unsigned uid[4];  /* real, effective, saved, filesystem */
} hpu_procinfo;

/* Reads /proc/PID/NAME (its first len - 1 bytes) into buf, NUL-ended;
 * 0, or -1 when the process is gone or the file is empty. */
int hpu__proc_read(pid_t pid, const char *name, char *buf, size_t len);

/* Reads pid's status into *pi; 0, or -1 when it is gone. */
int hpu__proc_info(pid_t pid, hpu_procinfo *pi);

/* Whether one of pi's four uids is uid. */
int hpu__proc_has_uid(const hpu_procinfo *pi, unsigned uid);

/* Whether one of pi's four uids lies in first..last. */
int hpu__proc_uid_in(const hpu_procinfo *pi, unsigned first, unsigned last);

/* How many processes run under uid; the first `max` of their pids go to
 * pids (may be NULL with max 0). */
int hpu__uid_procs(unsigned uid, pid_t *pids, int max);

/* Sends SIGKILL to every process under uid: from a helper process that
 * runs as uid alone, kill(-1) (which the kernel does at once, so a
 * process that forks meanwhile cannot slip through), then, as the
 * caller, to each one hpu__uid_procs finds (one whose real and saved uid
 * differ from uid). Needs root; uid must not be 0. Returns how many were
 * found in the second pass (0: none was left for it). */
int hpu__uid_kill(unsigned uid);

#endif
