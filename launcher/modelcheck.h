/* modelcheck: hpulaunch looks at the model file before it starts any
 * worker: a 64-bit ELF shared library of this machine that defines the
 * model's entry symbol (hpu_model_entry, <hpu/hpu.h>). A light read of
 * the ELF headers and the dynamic symbol table; nothing is loaded. */
#ifndef HPU_LAUNCHER_MODELCHECK_H
#define HPU_LAUNCHER_MODELCHECK_H

#include <stddef.h>

/* Returns 0, or -1 with a sentence in err naming path and what is
 * wrong (no ELF file, not a shared library, another machine's, no entry
 * symbol, cut short). */
int hpu__model_check(const char *path, char *err, size_t errlen);

#endif
