/* shmname: the names of a job's shared-memory segments, which the
 * collectives create (one per node) and the launcher's agent and the
 * collectives remove after a crash: "hpucoll-<job>-n<node>", or, in a job
 * started by hpulaunch, "hpucoll-<job>-<session>-n<node>" where the
 * session is the coordinator's random 32 hex digits, so that nobody
 * outside the job can guess the name and create it first. */
#ifndef HPU_SHMNAME_H
#define HPU_SHMNAME_H

enum { HPU_SHM_SESSION_HEX = 32 };

/* Whether s is a session: exactly HPU_SHM_SESSION_HEX lowercase hex
 * digits. */
int hpu__shm_session_ok(const char *s);

/* The node of segment `name` (a /dev/shm entry, no leading '/') when it
 * is one of job's, in either form, else -1; *session (if not NULL) says
 * whether the name carries a session. */
int hpu__shm_seg_node(const char *name, const char *job, int *session);

#endif
