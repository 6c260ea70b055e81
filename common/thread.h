#ifndef HPU_COMMON_THREAD_H
#define HPU_COMMON_THREAD_H

#include <pthread.h>
#include <signal.h>

/* Starts a helper thread with the signals that stop a process (SIGINT,
 * SIGTERM, SIGHUP) blocked in it, so that they reach the process's other
 * threads, its main one in our programs: a handler that cleans up after
 * the code it interrupts (a checkpoint save's) then runs in the thread
 * that code runs in, not beside it (a file the save went on writing
 * could outlive the handler's unlink). The caller's mask is kept.
 * Returns pthread_create's result. */
int hpu__thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

/* The stop signals (SIGTERM, SIGINT, SIGHUP) whose action is the default
 * one, handed to a handler that cleans up and then dies of the signal;
 * those with an action of their own (a caller's guard already set) are
 * left alone. hpu__stop_signals_restore puts back what was taken. */
typedef struct hpu_stop_handlers {
	int taken[3];
	struct sigaction old[3];
} hpu_stop_handlers;
void hpu__stop_signals_take(hpu_stop_handlers *h, void (*handler)(int));
void hpu__stop_signals_restore(hpu_stop_handlers *h);

#endif
