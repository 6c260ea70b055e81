#include "agent/zwatch.h"

#include <zmq.h>

static void drain(hpu_zwatch *w)
{
	while (w->active) {
		int ev = 0;
		size_t sz = sizeof ev;
		if (zmq_getsockopt(w->sock, ZMQ_EVENTS, &ev, &sz) != 0 ||
		    !(ev & ZMQ_POLLIN))
			return;
		w->cb(w, w->arg);
	}
}

static void on_io(struct ev_loop *loop, ev_io *io, int revents)
{
	(void)loop;
	(void)revents;
	drain(io->data);
}

static void on_prepare(struct ev_loop *loop, ev_prepare *p, int revents)
{
	(void)loop;
	(void)revents;
	drain(p->data);
}

int hpu__zwatch_start(hpu_zwatch *w, struct ev_loop *loop, void *sock,
		      hpu_zwatch_cb cb, void *arg)
{
	int fd;
	size_t sz = sizeof fd;
	if (zmq_getsockopt(sock, ZMQ_FD, &fd, &sz) != 0)
		return -1;
	w->loop = loop;
	w->sock = sock;
	w->cb = cb;
	w->arg = arg;
	w->active = 1;
	ev_io_init(&w->io, on_io, fd, EV_READ);
	w->io.data = w;
	ev_prepare_init(&w->prep, on_prepare);
	w->prep.data = w;
	ev_io_start(loop, &w->io);
	ev_prepare_start(loop, &w->prep);
	return 0;
}

void hpu__zwatch_stop(hpu_zwatch *w)
{
	if (!w->active)
		return;
	w->active = 0;
	ev_io_stop(w->loop, &w->io);
	ev_prepare_stop(w->loop, &w->prep);
}
