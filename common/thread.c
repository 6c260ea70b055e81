/* thread: helper threads that leave the stop signals to the main thread,
 * and the main thread's handlers of them (thread.h). */
#include "common/thread.h"

#include <signal.h>
#include <string.h>

int hpu__thread_start(pthread_t *t, void *(*fn)(void *), void *arg)
{
	sigset_t stop, old;
	sigemptyset(&stop);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGHUP);
	/* blocked before the thread exists, so none comes to it between
	 * its start and a mask it would set itself; it inherits this one */
	pthread_sigmask(SIG_BLOCK, &stop, &old);
	int rc = pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

static const int stop_signals[3] = {SIGTERM, SIGINT, SIGHUP};

void hpu__stop_signals_take(hpu_stop_handlers *h, void (*handler)(int))
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = handler;
	sigemptyset(&sa.sa_mask);
	for (int i = 0; i < 3; i++)
		h->taken[i] = sigaction(stop_signals[i], NULL, &h->old[i]) == 0 &&
			      h->old[i].sa_handler == SIG_DFL &&
			      sigaction(stop_signals[i], &sa, NULL) == 0;
}

void hpu__stop_signals_restore(hpu_stop_handlers *h)
{
	for (int i = 0; i < 3; i++) {
		if (h->taken[i])
			sigaction(stop_signals[i], &h->old[i], NULL);
		h->taken[i] = 0;
	}
}
