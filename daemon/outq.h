/* outq: one job's messages to its submitter that ZeroMQ has not taken
 * yet, bounded in bytes. hpud hands a message to ZeroMQ only while the
 * submitter's connection has room for it (a few dozen messages), so a
 * submitter that stops reading leaves the job's output here, where it
 * is counted: each message as its packed size plus HPUD_OUTQ_OVERHEAD.
 *
 * An output line that would take the queue past its bound is dropped,
 * and so is every later one until the queue has drained to half the
 * bound; the drops are counted per rank, for the notices that the caller
 * then queues in their place (hpud_outq_caught_up, hpud_outq_take_drops).
 * Other messages (a worker's exit, the job's end) are never dropped:
 * they are few and small.
 *
 * A zeroed hpud_outq is an empty queue that counts drops of no rank. */
#ifndef HPUD_OUTQ_H
#define HPUD_OUTQ_H

#include <stddef.h>
#include <stdint.h>

/* Counted per message besides its body: the queue's node and malloc's. */
#define HPUD_OUTQ_OVERHEAD 64

typedef struct hpud_outq_msg {
	struct hpud_outq_msg *next;
	uint8_t *body; /* a packed Hpu__Envelope (malloc'd) */
	size_t len;
} hpud_outq_msg;

typedef struct hpud_outq_drops {
	long long lines, bytes; /* bytes: of the lines' text */
} hpud_outq_drops;

typedef struct hpud_outq {
	hpud_outq_msg *head, *tail;
	size_t bytes;           /* counted, of the queued messages */
	long messages;          /* queued */
	int dropping;           /* output is dropped until bytes <= bound / 2 */
	int first_rank, nranks; /* the ranks whose drops are counted */
	hpud_outq_drops *drops; /* [rank - first_rank]: since the last notice */
	hpud_outq_drops total;  /* all the drops of the queue's life */
} hpud_outq;

/* An empty queue counting the drops of ranks first_rank ..
 * first_rank + nranks - 1. Returns 0, or -1 without memory. */
int hpud_outq_init(hpud_outq *q, int first_rank, int nranks);

/* Frees the queued messages and the counts; q is then zeroed. */
void hpud_outq_free(hpud_outq *q);

/* Queues a message that is never dropped. The body belongs to the queue
 * whatever happens: returns 0, or -1 (freed) without memory. */
int hpud_outq_push(hpud_outq *q, uint8_t *body, size_t len);

/* Queues rank's output line (text_len bytes of text, packed into body)
 * unless the queue is dropping or the line would take it past `bound`
 * bytes; then the line is dropped and counted (rank -1: dropped
 * uncounted, for what is not output, e.g. progress records). The body
 * belongs to the queue whatever happens. Returns 1 if queued, else 0. */
int hpud_outq_push_line(hpud_outq *q, size_t bound, int rank, size_t text_len,
                        uint8_t *body, size_t len);

/* Whether the queue is dropping output lines (until it has drained to
 * half its bound): a line need not be packed then, only counted. */
int hpud_outq_dropping(const hpud_outq *q);

/* Counts rank's output line of text_len bytes as dropped (rank -1: not
 * counted) and sets the queue dropping. */
void hpud_outq_count_drop(hpud_outq *q, int rank, size_t text_len);

/* The oldest message, or NULL. */
const hpud_outq_msg *hpud_outq_peek(const hpud_outq *q);

/* Removes and frees the oldest message (if any). */
void hpud_outq_pop(hpud_outq *q);

/* Whether lines were dropped and the queue has since drained to half of
 * `bound`: time to queue the notices. */
int hpud_outq_caught_up(const hpud_outq *q, size_t bound);

/* Whether any drop has not been taken yet. */
int hpud_outq_has_drops(const hpud_outq *q);

/* Takes the next rank's drops since its last notice: returns 1 with the
 * rank and its counts (then zeroed), or 0 when none are left, and then
 * the queue takes output lines again. */
int hpud_outq_take_drops(hpud_outq *q, int *rank, hpud_outq_drops *d);

#endif
