/* shm: the shared-memory transport between the ranks of one node.
 *
 * One POSIX shared-memory segment per node and job, named
 * "/hpucoll-<job>-n<node>" (so /dev/shm/hpucoll-<job>-n<node>), holds for
 * every ordered pair of the node's ranks a single-producer single-consumer
 * ring of slots, each carrying one message: a struct hpucoll__hdr and up to
 * HPUCOLL__SHM_MAX_PAYLOAD bytes. A receiver reads (or reduces) straight
 * out of the slot and then releases it. Waits spin briefly, then sleep on
 * a futex, and check every ~100 ms that the peer process is alive (its pid
 * is in the segment), so a dead peer is reported at once (HPUCOLL_EPEER)
 * and a silent one after the timeout (HPUCOLL_ETIMEDOUT).
 *
 * Ranks are named here by their local index 0..nlocal-1 on the node. All
 * functions return an hpucoll_err code. The segment's name is unlinked as
 * soon as all nlocal ranks have attached (each keeps its mapping), so only
 * a job that dies while its ranks meet leaves a segment in /dev/shm;
 * hpucoll__shm_unlink_job() removes it (hpulaunch calls the equivalent when
 * its workers are gone).
 */
#ifndef HPUCOLL_SHM_H
#define HPUCOLL_SHM_H

#include <stddef.h>

#include "collectives/comm_internal.h"

/* Largest payload of one shared-memory message. */
#define HPUCOLL__SHM_MAX_PAYLOAD (256u * 1024u)

typedef struct hpucoll__shm hpucoll__shm;

/* Attaches local rank `local` of `nlocal` on node `node` of job `job` to
 * the node's segment, creating it if needed, and waits up to timeout_ms
 * (negative: forever) until all nlocal ranks have attached. On failure
 * writes a sentence into err. */
int hpucoll__shm_open(hpucoll__shm **out, const char *job, int node,
		      int local, int nlocal, int timeout_ms, char *err,
		      size_t errlen);

/* Copies hdr and hdr->len (<= HPUCOLL__SHM_MAX_PAYLOAD) bytes of data
 * into the ring towards local rank dst, waiting while it is full. */
int hpucoll__shm_send(hpucoll__shm *s, int dst, const struct hpucoll__hdr *hdr,
		      const void *data, int timeout_ms);

/* The payload area of the next slot towards local rank dst when the ring
 * has room for it now, else NULL (never waits). A payload written there
 * and passed to hpucoll__shm_send() as `data` is not copied again. Valid
 * until the next send to dst. */
void *hpucoll__shm_slot(hpucoll__shm *s, int dst);

/* Waits for the next message from local rank src; *hdr gets its header,
 * *data points at its payload inside the segment, valid until
 * hpucoll__shm_release(s, src). Only one message per source may be held. */
int hpucoll__shm_recv(hpucoll__shm *s, int src, struct hpucoll__hdr *hdr,
		      const void **data, int timeout_ms);

/* Gives the slot of the message last received from src back to it. */
void hpucoll__shm_release(hpucoll__shm *s, int src);

/* One sentence about the last error of send or recv (names the peer). */
const char *hpucoll__shm_errmsg(const hpucoll__shm *s);

/* Detaches; peers waiting on this rank then get HPUCOLL_EPEER. *s = NULL;
 * safe on NULL and twice. */
void hpucoll__shm_close(hpucoll__shm **s);

/* Unlinks every segment of job `job` (after a crash). Returns how many. */
int hpucoll__shm_unlink_job(const char *job);

/* Unlinks this user's segments of any job ("hpucoll-...-n<node>") that a
 * job killed while its ranks attached left in /dev/shm (a segment's last
 * rank to attach unlinks its name, and its launcher removes the job's
 * after a crash, unless the launcher itself was killed): a minute old,
 * and never initialised (its creator died while sizing it) or every
 * rank that attached has died in this pid namespace (one in another, or
 * not known, keeps it; so does a file that is not of this library's
 * layout). Their names, comma-separated, go into names
 * (cut with "..."). Returns how many. hpucoll__shm_open calls it when it
 * creates a segment and says so at HPUCOLL_LOG_NOTICE. */
int hpucoll__shm_sweep_stale(char *names, size_t len);

#endif
