/* Unit tests for hpud's per-job output queue (daemon/outq.c): the byte
 * count; output lines are never dropped for a full queue (it says it is
 * full, and when it has room again: the caller holds the workers' output
 * meanwhile); a stalled queue drops lines until it has drained to half,
 * with per-rank counts for the notices; progress records dropped past the
 * bound, uncounted; messages that are never dropped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/outq.h"

#define LINE 1000                        /* packed bytes of a test line */
#define COST (LINE + HPUD_OUTQ_OVERHEAD) /* counted per line */
#define BOUND (10 * COST)                /* ten lines */

static uint8_t *body(size_t n, uint8_t fill)
{
	uint8_t *b = malloc(n);
	assert_non_null(b);
	memset(b, fill, n);
	return b;
}

static int push_line(hpud_outq *q, int rank)
{
	return hpud__outq_push_line(q, rank, LINE - 20, body(LINE, (uint8_t)rank), LINE);
}

/* Past the bound the queue is full but takes every line all the same: no
 * line is lost to a submitter that keeps up. */
static void test_full_keeps_lines(void **state)
{
	(void)state;
	hpud_outq q;
	assert_int_equal(hpud__outq_init(&q, 0, 1), 0);
	for (int i = 0; i < 10; i++)
		assert_int_equal(push_line(&q, 0), 1);
	assert_false(hpud__outq_full(&q, BOUND));
	for (int i = 0; i < 5; i++)
		assert_int_equal(push_line(&q, 0), 1); /* 15 of 10 */
	assert_true(hpud__outq_full(&q, BOUND));
	assert_false(hpud__outq_room(&q, BOUND));
	assert_false(hpud__outq_dropping(&q));
	assert_int_equal(q.messages, 15);
	for (int i = 0; i < 9; i++)
		hpud__outq_pop(&q);
	assert_false(hpud__outq_room(&q, BOUND)); /* 6 of 10 */
	hpud__outq_pop(&q);
	assert_true(hpud__outq_room(&q, BOUND)); /* 5 of 10 */
	assert_false(hpud__outq_caught_up(&q, BOUND)); /* nothing was dropped */
	assert_int_equal(q.total.lines, 0);
	hpud__outq_free(&q);
}

/* A stalled queue drops lines, counted per rank, until it has drained to
 * half its bound and the notices have taken the counts. */
static void test_stall_and_drain_to_half(void **state)
{
	(void)state;
	hpud_outq q;
	assert_int_equal(hpud__outq_init(&q, 4, 2), 0); /* ranks 4 and 5 */
	for (int i = 0; i < 11; i++)
		assert_int_equal(push_line(&q, 4 + i % 2), 1);
	assert_int_equal(q.bytes, 11 * COST);
	assert_int_equal(q.messages, 11);
	assert_false(hpud__outq_dropping(&q));
	hpud__outq_stall(&q);
	assert_true(hpud__outq_dropping(&q));
	assert_int_equal(push_line(&q, 5), 0);
	hpud__outq_pop(&q);
	assert_int_equal(push_line(&q, 4), 0); /* there is room, but stalled */
	hpud__outq_count_drop(&q, 4, 7);        /* one not even packed */
	assert_int_equal(q.messages, 10);
	assert_true(hpud__outq_has_drops(&q));
	/* drained to 6 lines: not yet half */
	for (int i = 0; i < 4; i++)
		hpud__outq_pop(&q);
	assert_false(hpud__outq_caught_up(&q, BOUND));
	hpud__outq_pop(&q);
	assert_true(hpud__outq_caught_up(&q, BOUND)); /* 5 of 10 */
	int rank;
	hpud_outq_drops d;
	assert_int_equal(hpud__outq_take_drops(&q, &rank, &d), 1);
	assert_int_equal(rank, 4);
	assert_int_equal(d.lines, 2);
	assert_int_equal(d.bytes, LINE - 20 + 7);
	assert_int_equal(hpud__outq_take_drops(&q, &rank, &d), 1);
	assert_int_equal(rank, 5);
	assert_int_equal(d.lines, 1);
	assert_true(hpud__outq_dropping(&q)); /* until every rank's are taken */
	assert_int_equal(hpud__outq_take_drops(&q, &rank, &d), 0);
	assert_false(hpud__outq_dropping(&q));
	assert_false(hpud__outq_has_drops(&q));
	assert_int_equal(q.total.lines, 3);
	/* lines are taken again */
	assert_int_equal(push_line(&q, 5), 1);
	while (hpud__outq_peek(&q))
		hpud__outq_pop(&q);
	assert_int_equal(q.bytes, 0);
	assert_int_equal(q.messages, 0);
	hpud__outq_free(&q);
	hpud__outq_free(&q); /* safe twice */
}

/* While stalled each rank's latest line is kept, the one it replaces
 * counted as dropped; the notice's counts leave it out and hand it over. */
static void test_stall_keeps_last_line(void **state)
{
	(void)state;
	hpud_outq q;
	assert_int_equal(hpud__outq_init(&q, 0, 2), 0);
	hpud__outq_stall(&q);
	hpud__outq_keep_line(&q, 0, 0, "line 1", 6);
	assert_true(hpud__outq_has_drops(&q));
	assert_int_equal(q.total.lines, 0); /* kept, not lost */
	hpud__outq_keep_line(&q, 0, 1, "line 22", 7);
	hpud__outq_keep_line(&q, 0, 0, "trained: final loss", 19);
	hpud__outq_keep_line(&q, 1, 1, "only", 4); /* from stderr */
	hpud__outq_keep_line(&q, 5, 0, "not ours", 8); /* counted only */
	assert_int_equal(q.total.lines, 3);
	assert_int_equal(q.total.bytes, 6 + 7 + 8);
	assert_true(hpud__outq_caught_up(&q, BOUND));
	int rank;
	hpud_outq_drops d;
	assert_int_equal(hpud__outq_take_drops(&q, &rank, &d), 1);
	assert_int_equal(rank, 0);
	assert_int_equal(d.lines, 2);
	assert_int_equal(d.bytes, 13);
	assert_non_null(d.last);
	assert_int_equal(d.last_len, 19);
	assert_string_equal(d.last, "trained: final loss");
	assert_int_equal(d.last_err, 0);
	free(d.last);
	assert_int_equal(hpud__outq_take_drops(&q, &rank, &d), 1);
	assert_int_equal(rank, 1);
	assert_int_equal(d.lines, 0); /* nothing lost: no notice, just the line */
	assert_string_equal(d.last, "only");
	assert_int_equal(d.last_err, 1); /* its stream kept, for the submitter */
	free(d.last);
	assert_int_equal(hpud__outq_take_drops(&q, &rank, &d), 0);
	assert_false(hpud__outq_dropping(&q));
	/* a kept line the queue still holds is freed with it */
	hpud__outq_stall(&q);
	hpud__outq_keep_line(&q, 1, 0, "left", 4);
	hpud__outq_free(&q);
}

/* Other messages are never dropped, also past the bound; progress
 * records are dropped past it without being counted as output. */
static void test_control_and_uncounted(void **state)
{
	(void)state;
	hpud_outq q;
	assert_int_equal(hpud__outq_init(&q, 0, 1), 0);
	for (int i = 0; i < 12; i++)
		assert_int_equal(hpud__outq_push(&q, body(LINE, 1), LINE), 0);
	assert_int_equal(q.bytes, 12 * COST);
	assert_int_equal(hpud__outq_push_record(&q, BOUND, body(LINE, 2), LINE), 0);
	assert_false(hpud__outq_dropping(&q));
	assert_false(hpud__outq_has_drops(&q));
	hpud__outq_count_drop(&q, -1, 100);
	assert_int_equal(q.total.lines, 0);
	/* a rank outside the queue's counts in the total only */
	hpud__outq_stall(&q);
	assert_int_equal(push_line(&q, 7), 0);
	assert_int_equal(q.total.lines, 1);
	assert_false(hpud__outq_has_drops(&q));
	/* the order is kept */
	assert_int_equal(hpud__outq_push(&q, body(3, 9), 3), 0);
	for (int i = 0; i < 12; i++)
		hpud__outq_pop(&q);
	assert_int_equal(hpud__outq_peek(&q)->len, 3);
	assert_int_equal(hpud__outq_peek(&q)->body[0], 9);
	hpud__outq_pop(&q);
	/* an empty queue takes a record */
	assert_int_equal(hpud__outq_take_drops(&q, &(int){0}, &(hpud_outq_drops){0}), 0);
	assert_int_equal(hpud__outq_push_record(&q, BOUND, body(LINE, 2), LINE), 1);
	hpud__outq_free(&q); /* frees what is left */
	assert_null(hpud__outq_peek(&q));
}

/* A zeroed queue is empty and counts drops of no rank. */
static void test_zeroed(void **state)
{
	(void)state;
	hpud_outq q;
	memset(&q, 0, sizeof q);
	assert_null(hpud__outq_peek(&q));
	hpud__outq_pop(&q);
	assert_int_equal(push_line(&q, 0), 1);
	hpud__outq_free(&q);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_full_keeps_lines),
	    cmocka_unit_test(test_stall_and_drain_to_half),
	    cmocka_unit_test(test_stall_keeps_last_line),
	    cmocka_unit_test(test_control_and_uncounted),
	    cmocka_unit_test(test_zeroed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
