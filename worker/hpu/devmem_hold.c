/* devmem_hold: the blocks recorded steps hold (devmem.h's
 * hpu__devmem_capture_begin): which graph holds which block, and a
 * graph's release. */
#include "worker/hpu/devmem.h"
#include "worker/hpu/devmem_impl.h"

#include <pthread.h>
#include <stdlib.h>

/* ---- blocks held for recorded steps (under hpu__devmem.mu) ---- */

/* Room for one pair more; -1 where the host has no memory. */
int hpu__devmem_hold_room(void)
{
	if (hpu__devmem.nholds < hpu__devmem.capholds)
		return 0;
	size_t cap = hpu__devmem.capholds ? hpu__devmem.capholds * 2 : 256;
	hold *v = realloc(hpu__devmem.holds, cap * sizeof *v);
	if (!v)
		return -1;
	hpu__devmem.holds = v;
	hpu__devmem.capholds = cap;
	return 0;
}

static bool held_by(const blk *b, uint32_t graph)
{
	for (size_t i = 0; i < hpu__devmem.nholds; i++)
		if (hpu__devmem.holds[i].b == b && hpu__devmem.holds[i].graph == graph)
			return true;
	return false;
}

/* The recording graph holds b from now on (b HELD). Without room for the
 * pair, b is held for good: kept, never reused under a graph's nodes. */
void hpu__devmem_hold_add(blk *b, uint32_t graph)
{
	b->flags |= HELD;
	if (held_by(b, graph))
		return;
	if (hpu__devmem_hold_room() < 0) {
		b->flags |= OWNER_FREED; /* never released: the pages stay */
		return;
	}
	hpu__devmem.holds[hpu__devmem.nholds++] = (hold){b, graph};
}

/* ---- a graph's release (hpu__devmem_graph_release) ---- */

void hpu__devmem_graph_release(uint32_t graph)
{
	if (!graph)
		return;
	pthread_mutex_lock(&hpu__devmem.mu);
	bk_open();
	size_t keep = 0;
	for (size_t i = 0; i < hpu__devmem.nholds; i++) {
		hold h = hpu__devmem.holds[i];
		if (h.graph != graph) {
			hpu__devmem.holds[keep++] = h;
			continue;
		}
		/* the last pair of its block: other graphs' are before keep
		 * or after i */
		bool other = false;
		for (size_t j = 0; j < hpu__devmem.nholds && !other; j++)
			other = j != i && hpu__devmem.holds[j].b == h.b &&
				hpu__devmem.holds[j].graph != graph;
		if (other)
			continue;
		h.b->flags &= (uint16_t)~HELD;
		if (h.b->flags & OWNER_FREED)
			hpu__devmem_release_block(h.b, user_of(h.b));
	}
	hpu__devmem.nholds = keep;
	bk_close();
	pthread_mutex_unlock(&hpu__devmem.mu);
}

void hpu__devmem_held(uint64_t *blocks, uint64_t *bytes)
{
	*blocks = *bytes = 0;
	pthread_mutex_lock(&hpu__devmem.mu);
	bk_open(); /* the headers */
	for (size_t i = 0; i < hpu__devmem.nholds; i++) {
		const blk *b = hpu__devmem.holds[i].b;
		bool first = true;
		for (size_t j = 0; j < i && first; j++)
			first = hpu__devmem.holds[j].b != b;
		if (first && (b->flags & OWNER_FREED)) {
			(*blocks)++;
			*bytes += b->bytes;
		}
	}
	bk_close();
	pthread_mutex_unlock(&hpu__devmem.mu);
}
