/* swap: the NVMe tier of ZeRO-Infinity. A store is one file of this
 * process under an nvme_path, holding optimizer state or parameters that
 * do not stay in memory; sub-groups move between it and aligned buffers
 * with io_uring and O_DIRECT, several transfers in flight, so that reading
 * the next sub-group, updating this one and writing the previous one
 * overlap (DeepSpeed's pipelined optimizer swapping).
 *
 * The file has no name while the store is open (O_TMPFILE, or a named file
 * unlinked right after opening), so it is gone when the process ends, by
 * kill -9 too. Single-threaded: one thread (the training thread) calls
 * every function of a store. */
#ifndef HPU_SWAP_H
#define HPU_SWAP_H

#include <stddef.h>
#include <stdint.h>

/* Offsets, lengths and buffers of transfers are multiples of this (O_DIRECT
 * on 512-byte and 4 KiB sector disks alike). */
#define HPU_SWAP_ALIGN 4096

/* DeepSpeed's "aio" section. */
typedef struct hpu_swap_opts {
	size_t block_size;   /* aio.block_size: bytes per I/O request a transfer is split
			      * into, a multiple of HPU_SWAP_ALIGN (1048576) */
	int queue_depth;     /* aio.queue_depth: io_uring entries, requests in the kernel
			      * at once (8) */
	int single_submit;   /* aio.single_submit: submit each request alone instead of
			      * batching (0) */
	int overlap_events;  /* aio.overlap_events: hpu__swap_read/write also reap finished
			      * requests and submit queued ones, so a transfer longer than
			      * the queue keeps moving between calls; with 0 only the
			      * waits do (1) */
	int thread_count;    /* aio.thread_count: accepted and unused; io_uring needs no
			      * threads (1) */
} hpu_swap_opts;

/* Fills *o with DeepSpeed's defaults (the values in parentheses above). */
void hpu__swap_opts_defaults(hpu_swap_opts *o);

typedef struct hpu_swap hpu_swap;

/* Creates this process's swap file of `bytes` bytes (rounded up to
 * HPU_SWAP_ALIGN) in directory `dir`, for `what` ("optimizer state",
 * "parameters"); `tag` ("r0-optim": letters, digits, '.', '_', '-') names
 * it in file names and messages. Everything that would fail later is
 * checked now, before training, each failure a sentence naming the path
 * in err: dir missing, not a directory or not writable; a filesystem that
 * refuses O_DIRECT, or tmpfs (memory: swapping there saves none); less
 * free space than `bytes` ("needs X GiB, Y GiB free"); then the space is
 * reserved with fallocate (where the filesystem has none, the file is only
 * sized and running out of space shows at the write). Before creating, the
 * leftovers of dead processes, "hpu-swap-<pid>-*.bin" files in dir whose
 * pid no longer exists, are removed. `o` NULL takes the defaults. Returns
 * the store, or NULL with err filled. */
hpu_swap *hpu__swap_open(const char *dir, const char *tag, const char *what, uint64_t bytes,
			 const hpu_swap_opts *o, char *err, size_t errlen);

/* A buffer for transfers: `bytes` rounded up to HPU_SWAP_ALIGN, aligned to
 * it; free with free(). NULL when memory is short. */
void *hpu__swap_buffer(size_t bytes);

/* Starts a transfer from file offset `off` into buf[len] (read) or from
 * buf[len] to `off` (write), split into block_size requests. off, buf and
 * len are multiples of HPU_SWAP_ALIGN and [off, off + len) lies within the
 * store. Returns a ticket >= 0 for hpu__swap_wait(), or -1 with
 * hpu__swap_error() set (nothing started). Any number may be in flight:
 * requests beyond queue_depth wait in the store and are submitted as
 * entries free. buf belongs to the transfer until its ticket is waited
 * for. */
int hpu__swap_read(hpu_swap *s, uint64_t off, void *buf, size_t len);
int hpu__swap_write(hpu_swap *s, uint64_t off, const void *buf, size_t len);

/* Waits until `ticket`'s transfer is complete, moving the others along on
 * the way, and retires the ticket. Returns 0, or -1 with hpu__swap_error()
 * set: a failed request names the file, the offset and the system's
 * reason (No space left on device, Input/output error, ...); an unknown or
 * already retired ticket is refused too. */
int hpu__swap_wait(hpu_swap *s, int ticket);

/* Waits for every transfer in flight and retires all tickets. 0, or -1
 * with the first failure's sentence in hpu__swap_error(). */
int hpu__swap_wait_all(hpu_swap *s);

/* The last failure's sentence ("" when none). */
const char *hpu__swap_error(const hpu_swap *s);

/* "<dir>/(unnamed swap file)", for messages: an O_TMPFILE file never has
 * a name, and a named one is unlinked at once, so no path names it. */
const char *hpu__swap_path(const hpu_swap *s);

/* Bytes read and written so far, and seconds spent blocked in
 * hpu__swap_wait* for the kernel. Any pointer may be NULL. */
void hpu__swap_stats(const hpu_swap *s, uint64_t *read, uint64_t *written, double *wait_s);

/* Waits for the transfers in flight, then closes (the file goes with its
 * descriptor). NULL is fine. */
void hpu__swap_close(hpu_swap *s);

/* Tests only: nonzero makes hpu__swap_open skip O_TMPFILE and take the
 * named-file way (create, unlink at once) that filesystems without it
 * get. */
extern int hpu__swap_no_tmpfile;

#endif
