/* checks: the ops' validations deferred to the end of a recorded step.
 *
 * Some ops check what comes from data files before their kernel reads
 * it: a cross-entropy's labels (xent_pos_fwd, and softmax_xent's ids
 * check), an embedding's ids, a binary cross-entropy's probabilities
 * (bce_fwd), the attention layer's key mask (ids_first_bad). Eager, the
 * kernel writes its finding into host memory and the op returns an error
 * at once; on a GPU that is a copy back and a wait, which a recorded
 * step (CUDA stream capture, issue 36) may not hold.
 *
 * Armed (hpu__checks_arm, by a recordable strategy for one training
 * step), each of those ops takes the next slot of the caller's device
 * memory instead: the kernel writes its finding there, the op returns as
 * if the input were good (HPU_OK, *bad = -1) and the kernels that read
 * the input skip or zero an out-of-range id rather than read outside
 * their table. The host keeps what it needs to explain a finding (the
 * op, the layer, the limit, the rows and their dataset samples); after
 * the step the caller copies the used slots to host memory and asks
 * hpu__checks_report. Where the slots run out, or where the kernel table
 * cannot write device memory without a wait (a table whose memory the
 * host cannot read and that does not set findings_dev, backend.h: CUDA's
 * today), an op checks eagerly, as disarmed.
 *
 * The state is per thread, as the layer running is (hpu__op_layer). */
#ifndef HPU_OPS_CHECKS_H
#define HPU_OPS_CHECKS_H

#include <stddef.h>
#include <stdint.h>

/* One check's finding, written by the kernel (device memory), in the
 * kernels' types. */
typedef struct hpu__check_slot {
	long bad;        /* the first bad index, or -1 */
	int32_t bad_id;  /* its label or id (cross-entropy, the id checks) */
	float bad_value; /* its probability (binary cross-entropy) */
} hpu__check_slot;

/* The op a slot belongs to. */
typedef enum hpu__check_op {
	HPU__CHECK_XENT_POS = 0, /* labels over positions, -100 ignored */
	HPU__CHECK_XENT,         /* softmax cross-entropy's labels */
	HPU__CHECK_EMBEDDING,    /* an embedding's ids */
	HPU__CHECK_BCE,          /* probabilities in [0, 1] */
	HPU__CHECK_IDS,          /* ids in [0, limit) (the key mask) */
} hpu__check_op;

/* From now on until hpu__checks_disarm, the ops take slots[0 ..
 * nslots) in turn (device memory of nslots hpu__check_slot); forgets
 * the previous arming's records. */
void hpu__checks_arm(void *slots, int nslots);
/* The ops check eagerly again; the records stay for the report. */
void hpu__checks_disarm(void);
/* Forgets the records and frees the host memory they hold. */
void hpu__checks_free(void);

/* The rows of the batch the layers run on now and their dataset sample
 * indices (host memory, read when an op takes a slot; NULL: unknown). */
void hpu__checks_batch(const uint32_t *samples, int rows);

/* For an op: the next slot, its record made (`key` the input checked,
 * `limit` its bound, `rows` x `per` its shape; rows 0: per values in
 * all, the batch's rows where they divide), or NULL where the op checks
 * eagerly. */
hpu__check_slot *hpu__checks_take(hpu__check_op op, const void *key, long limit, int rows,
				  size_t per);
/* The limit an armed check recorded for the ids at `key` (an
 * embedding's backward reads the ids its forward checked), or -1. */
long hpu__checks_limit(const void *key);

/* A recorded step (--graphs) replays the checks its recording armed,
 * with no op taking a slot again: hpu__checks_save keeps the last
 * arming's records (NULL when out of memory), hpu__checks_restore makes
 * them the current ones before a replay's report (used as saved; each
 * record's dataset samples read at report time from where they were
 * copied at the recording, the batch's host memory, which the caller
 * keeps in place and refilled: the replayed batch's), 0 or -1. */
typedef struct hpu__checks_snap hpu__checks_snap;
hpu__checks_snap *hpu__checks_save(void);
int hpu__checks_restore(const hpu__checks_snap *s);
void hpu__checks_snap_free(hpu__checks_snap *s);

/* The slots the last arming used (they are slots[0 .. used)). */
int hpu__checks_used(void);
/* host_copy: the used slots copied to host memory. 1 with the first
 * finding as one sentence in msg (the layer, the op, the bad value,
 * found after the step), or 0 when every check passed. */
int hpu__checks_report(const void *host_copy, char *msg, size_t len);

#endif
