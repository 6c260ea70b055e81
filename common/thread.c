/* thread: helper threads that leave the stop signals to the main thread
 * (thread.h). */
#include "common/thread.h"

#include <signal.h>

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
