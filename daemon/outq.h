/* outq: one job's messages to its submitter that ZeroMQ has not taken
 * yet, counted in bytes: each message as its packed size plus
 * HPUD_OUTQ_OVERHEAD. hpud hands a message to ZeroMQ only while the
 * submitter's connection has room for it (a few dozen messages); the rest
 * wait here.
 *
 * Output lines are not dropped for a full queue: past its bound hpud
 * stops reading the job's workers' output (back-pressure: a worker then
 * waits in write), and reads again once the queue has drained to half
 * the bound. Only a submitter that takes nothing for a while stalls the
 * queue (hpud__outq_stall): then output lines are dropped, counted per
 * rank, but for each rank's latest (hpud__outq_keep_line), until the queue
 * has drained to half the bound; the counts go out as notices in their
 * place, each followed by the rank's kept line (hpud__outq_caught_up,
 * hpud__outq_take_drops).
 * Progress records are dropped past the bound, uncounted (the next one
 * says more); other messages (a worker's exit, the job's end) are never
 * dropped: they are few and small.
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
	char *last;             /* the rank's latest line, kept (malloc'd) ... */
	size_t last_len;        /* ... and its length; not counted above */
	int last_err;           /* ... from the worker's stderr */
} hpud_outq_drops;

typedef struct hpud_outq {
	hpud_outq_msg *head, *tail;
	size_t bytes;           /* counted, of the queued messages */
	long messages;          /* queued */
	int dropping;           /* stalled: output is dropped until bytes <=
				 * bound / 2 and the drops are taken */
	int first_rank, nranks; /* the ranks whose drops are counted */
	hpud_outq_drops *drops; /* [rank - first_rank]: since the last notice */
	hpud_outq_drops total;  /* all the drops of the queue's life */
} hpud_outq;

/* An empty queue counting the drops of ranks first_rank ..
 * first_rank + nranks - 1. Returns 0, or -1 without memory. */
int hpud__outq_init(hpud_outq *q, int first_rank, int nranks);

/* Frees the queued messages and the counts; q is then zeroed. */
void hpud__outq_free(hpud_outq *q);

/* Queues a message that is never dropped. The body belongs to the queue
 * whatever happens: returns 0, or -1 (freed) without memory. */
int hpud__outq_push(hpud_outq *q, uint8_t *body, size_t len);

/* Queues rank's output line (text_len bytes of text, packed into body),
 * unless the queue is stalled: then the line is dropped and counted. The
 * body belongs to the queue whatever happens. Returns 1 if queued, else
 * 0. */
int hpud__outq_push_line(hpud_outq *q, int rank, size_t text_len, uint8_t *body, size_t len);

/* Queues a record that the next one replaces (progress) if it keeps the
 * queue within `bound` bytes; else drops it, uncounted. The body belongs
 * to the queue whatever happens. Returns 1 if queued, else 0. */
int hpud__outq_push_record(hpud_outq *q, size_t bound, uint8_t *body, size_t len);

/* Whether the queue holds more than `bound` bytes: time to stop reading
 * the output, until hpud__outq_room. */
int hpud__outq_full(const hpud_outq *q, size_t bound);

/* Whether the queue has drained to half of `bound`: the output may be
 * read again. */
int hpud__outq_room(const hpud_outq *q, size_t bound);

/* The submitter takes nothing: output lines are dropped (and counted)
 * from now on until the queue has drained to half its bound and the
 * drops are taken. */
void hpud__outq_stall(hpud_outq *q);

/* Whether the queue drops output lines (stalled, until the drops are
 * taken): a line need not be packed then, only counted. */
int hpud__outq_dropping(const hpud_outq *q);

/* Counts rank's output line of text_len bytes as dropped (rank -1: not
 * counted). */
void hpud__outq_count_drop(hpud_outq *q, int rank, size_t text_len);

/* While stalled: keeps a copy of rank's output line in place of its
 * previous kept one, which is counted as dropped (is_err: it came from
 * the worker's stderr, and goes to the submitter's); so each rank's last line
 * (the end of a training, "trained ... final loss") goes out after its
 * notice. A rank outside the queue's, or no memory: the line is counted
 * as dropped instead. */
void hpud__outq_keep_line(hpud_outq *q, int rank, int is_err, const char *text, size_t len);

/* The oldest message, or NULL. */
const hpud_outq_msg *hpud__outq_peek(const hpud_outq *q);

/* Removes and frees the oldest message (if any). */
void hpud__outq_pop(hpud_outq *q);

/* Whether the queue dropped lines and has since drained to half of
 * `bound`: time to queue the notices. */
int hpud__outq_caught_up(const hpud_outq *q, size_t bound);

/* Whether any drop (or kept line) has not been taken yet. */
int hpud__outq_has_drops(const hpud_outq *q);

/* Takes the next rank's drops since its last notice: returns 1 with the
 * rank and its counts (then zeroed) and its kept line (d->last, the
 * caller's to free; NULL if none), or 0 when none are left, and then the
 * queue takes output lines again. */
int hpud__outq_take_drops(hpud_outq *q, int *rank, hpud_outq_drops *d);

#endif
