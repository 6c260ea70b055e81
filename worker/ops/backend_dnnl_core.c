/* backend_dnnl_core: the base of the oneDNN backend that its kernel files
 * (backend_dnnl_gemm.c, _conv.c, _nn.c) use -- the engine, the per-thread
 * primitive cache, the thread count and the ISA. It calls nothing of the
 * other backend_dnnl files; the table (backend_dnnl.c) stands above all.
 *
 * oneDNN (Debian's libdnnl, OpenMP runtime) JIT-compiles kernels for the
 * CPU it runs on: with avx512_bf16 a bf16 x bf16 product accumulates in
 * fp32 at about twice the fp32 rate. A worker is one device: its kernels
 * run on one OpenMP thread unless set_threads() says otherwise (per
 * calling thread: the OpenMP thread count is a per-thread setting).
 */
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ops/backend_dnnl.h"

/* ---- engine, stream, threads ---- */

static dnnl_engine_t engine;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static _Atomic int threads = 1;

static void engine_init(void)
{
	if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success)
		engine = NULL;
}

static dnnl_engine_t get_engine(void)
{
	pthread_once(&engine_once, engine_init);
	return engine;
}

/* ---- the per-thread cache ---- */

#define CACHE_SLOTS 256

typedef struct entry {
	unsigned char key[HPU__DNNL_MAX_KEY];
	size_t keylen; /* 0: empty */
	hpu__dnnl_prim p;
} entry;

typedef struct tcache {
	entry e[CACHE_SLOTS];
	unsigned next; /* the slot to evict next when full */
	dnnl_stream_t stream;
	int threads; /* the OpenMP thread count set for this thread */
} tcache;

static __thread tcache *tc;

static void prim_clear(hpu__dnnl_prim *p)
{
	for (int i = 0; i < p->nargs; i++)
		dnnl_memory_destroy(p->mem[i]);
	if (p->prim)
		dnnl_primitive_destroy(p->prim);
	free(p->scratch);
	memset(p, 0, sizeof *p);
}

static pthread_key_t tc_key;
static pthread_once_t tc_key_once = PTHREAD_ONCE_INIT;

static void tc_free(void *v)
{
	tcache *c = v;
	for (int i = 0; i < CACHE_SLOTS; i++)
		if (c->e[i].keylen)
			prim_clear(&c->e[i].p);
	if (c->stream)
		dnnl_stream_destroy(c->stream);
	free(c);
}

static void tc_key_init(void)
{
	pthread_key_create(&tc_key, tc_free);
}

static tcache *get_tc(void)
{
	if (tc) {
		int want = atomic_load(&threads);
		if (tc->threads != want) {
			omp_set_num_threads(want);
			tc->threads = want;
		}
		return tc;
	}
	dnnl_engine_t eng = get_engine();
	if (!eng)
		return NULL;
	tcache *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	if (dnnl_stream_create(&c->stream, eng, dnnl_stream_default_flags) != dnnl_success) {
		free(c);
		return NULL;
	}
	c->threads = atomic_load(&threads);
	omp_set_num_threads(c->threads);
	pthread_once(&tc_key_once, tc_key_init);
	pthread_setspecific(tc_key, c); /* freed when the thread ends */
	tc = c;
	return c;
}

static uint64_t hash_key(const unsigned char *k, size_t n)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (size_t i = 0; i < n; i++)
		h = (h ^ k[i]) * 1099511628211ull;
	return h;
}

hpu__dnnl_prim *hpu__dnnl_get(const void *key, size_t keylen, hpu__dnnl_make make)
{
	tcache *c = get_tc();
	if (!c || keylen == 0 || keylen > HPU__DNNL_MAX_KEY)
		return NULL;
	unsigned h = (unsigned)(hash_key(key, keylen) % CACHE_SLOTS);
	/* open addressing, probes bounded by the table */
	for (unsigned i = 0; i < CACHE_SLOTS; i++) {
		entry *e = &c->e[(h + i) % CACHE_SLOTS];
		if (e->keylen == 0)
			break;
		if (e->keylen == keylen && memcmp(e->key, key, keylen) == 0)
			return e->p.prim ? &e->p : NULL;
	}
	/* a miss: the first free slot on the probe path, or evict one */
	entry *e = NULL;
	for (unsigned i = 0; i < CACHE_SLOTS && !e; i++)
		if (c->e[(h + i) % CACHE_SLOTS].keylen == 0)
			e = &c->e[(h + i) % CACHE_SLOTS];
	if (!e) {
		/* full: start over (a model has far fewer shapes than slots, so
		 * this is rare and keeps probing simple) */
		for (int i = 0; i < CACHE_SLOTS; i++)
			if (c->e[i].keylen) {
				prim_clear(&c->e[i].p);
				c->e[i].keylen = 0;
			}
		e = &c->e[h];
	}
	memcpy(e->key, key, keylen);
	e->keylen = keylen;
	memset(&e->p, 0, sizeof e->p);
	if (make(&e->p, key, get_engine()) < 0 || !e->p.prim) {
		prim_clear(&e->p); /* remembered as unsupported */
		return NULL;
	}
	if (e->p.scratch_bytes && !(e->p.scratch = malloc(e->p.scratch_bytes))) {
		prim_clear(&e->p);
		e->keylen = 0;
		return NULL;
	}
	return &e->p;
}

int hpu__dnnl_arg(hpu__dnnl_prim *p, dnnl_engine_t eng, int arg,
		  const dnnl_memory_desc_t *md)
{
	if (p->nargs >= HPU__DNNL_MAX_ARGS)
		return -1;
	if (dnnl_memory_create(&p->mem[p->nargs], md, eng, DNNL_MEMORY_NONE) != dnnl_success)
		return -1;
	p->arg[p->nargs++] = arg;
	return 0;
}

int hpu__dnnl_run(hpu__dnnl_prim *p, void *const *data)
{
	dnnl_exec_arg_t args[HPU__DNNL_MAX_ARGS];
	for (int i = 0; i < p->nargs; i++) {
		if (dnnl_memory_set_data_handle(p->mem[i], data[i]) != dnnl_success)
			return HPU_BE_UNSUPPORTED;
		args[i].arg = p->arg[i];
		args[i].memory = p->mem[i];
	}
	if (dnnl_primitive_execute(p->prim, tc->stream, p->nargs, args) != dnnl_success ||
	    dnnl_stream_wait(tc->stream) != dnnl_success)
		return HPU_BE_UNSUPPORTED;
	return HPU_BE_OK;
}

void hpu__dnnl_md(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims,
		  dnnl_data_type_t dt)
{
	static const dnnl_format_tag_t tags[] = {dnnl_format_tag_undef, dnnl_a, dnnl_ab,
						 dnnl_abc, dnnl_abcd, dnnl_abcde};
	dnnl_memory_desc_init_by_tag(md, ndims, dims, dt, tags[ndims]);
}

int hpu__dnnl_create(dnnl_primitive_t *prim, dnnl_primitive_desc_t *pd,
		     const_dnnl_op_desc_t desc, const_dnnl_primitive_attr_t attr,
		     dnnl_engine_t eng, const_dnnl_primitive_desc_t hint)
{
	*prim = NULL;
	*pd = NULL;
	if (dnnl_primitive_desc_create(pd, desc, attr, eng, hint) != dnnl_success) {
		*pd = NULL;
		return -1;
	}
	if (dnnl_primitive_create(prim, *pd) != dnnl_success) {
		dnnl_primitive_desc_destroy(*pd);
		*pd = NULL;
		*prim = NULL;
		return -1;
	}
	return 0;
}

/* ---- the ISA ---- */

static const char *isa_name(dnnl_cpu_isa_t isa)
{
	switch (isa) {
	case dnnl_cpu_isa_sse41: return "sse41";
	case dnnl_cpu_isa_avx: return "avx";
	case dnnl_cpu_isa_avx2: return "avx2";
	case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
	case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
	case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
	case dnnl_cpu_isa_avx512_core: return "avx512_core";
	case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
	case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
	case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
	default: return "unknown";
	}
}

int hpu__dnnl_bf16_native(void)
{
	dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
	return isa == dnnl_cpu_isa_avx512_core_bf16 || isa == dnnl_cpu_isa_avx512_core_amx;
}

const char *hpu__dnnl_describe(void)
{
	static char line[200];
	const dnnl_version_t *v = dnnl_version();
	int native = hpu__dnnl_bf16_native();
	snprintf(line, sizeof line, "oneDNN %d.%d.%d, ISA %s, bf16 products %s, %d thread%s",
		 v->major, v->minor, v->patch, isa_name(dnnl_get_effective_cpu_isa()),
		 native ? "native" : "emulated (this CPU has no bf16 instructions)",
		 atomic_load(&threads), atomic_load(&threads) == 1 ? "" : "s");
	return line;
}

void hpu__dnnl_set_threads(int n)
{
	atomic_store(&threads, n < 1 ? 1 : n);
}
