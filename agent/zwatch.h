/* zwatch: a libev watcher for a ZeroMQ socket. ZMQ_FD is edge-like: it
 * signals that the socket's state changed, not that a message is there, so
 * the socket is drained (ZMQ_EVENTS & ZMQ_POLLIN) both when the fd is
 * readable and before the loop blocks (ev_prepare), which also covers
 * messages made readable by our own sends. */
#ifndef HPU_ZWATCH_H
#define HPU_ZWATCH_H

#include <ev.h>

typedef struct hpu_zwatch hpu_zwatch;

/* Called once per readable message; it must receive exactly one message
 * from w->sock (or stop the watcher). */
typedef void (*hpu_zwatch_cb)(hpu_zwatch *w, void *arg);

struct hpu_zwatch {
	ev_io io;
	ev_prepare prep;
	struct ev_loop *loop;
	void *sock;
	hpu_zwatch_cb cb;
	void *arg;
	int active;
};

/* Starts watching `sock` on `loop`. Returns 0, or -1 if ZMQ_FD fails. */
int hpu__zwatch_start(hpu_zwatch *w, struct ev_loop *loop, void *sock,
		      hpu_zwatch_cb cb, void *arg);

/* Stops the watchers; safe twice. The socket stays the caller's. */
void hpu__zwatch_stop(hpu_zwatch *w);

#endif
