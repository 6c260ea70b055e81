#ifndef HPU_COMMON_THREAD_H
#define HPU_COMMON_THREAD_H

#include <pthread.h>

/* Starts a helper thread with the signals that stop a process (SIGINT,
 * SIGTERM, SIGHUP) blocked in it, so that they reach the process's other
 * threads, its main one in our programs: a handler that cleans up after
 * the code it interrupts (a checkpoint save's) then runs in the thread
 * that code runs in, not beside it (a file the save went on writing
 * could outlive the handler's unlink). The caller's mask is kept.
 * Returns pthread_create's result. */
int hpu__thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

#endif
