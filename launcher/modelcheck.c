/* modelcheck: see modelcheck.h. */
#include "launcher/modelcheck.h"

#include <hpu/hpu.h>

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__)
#define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_MACHINE EM_AARCH64
#else
#define HOST_MACHINE EM_NONE /* not checked */
#endif

/* Reads n bytes at off of fd (of size size) into a new buffer, or NULL. */
static void *read_at(int fd, uint64_t size, uint64_t off, uint64_t n)
{
	if (off > size || n > size - off || n > ((uint64_t)1 << 31))
		return NULL;
	void *buf = malloc(n ? n : 1);
	if (buf && pread(fd, buf, n, (off_t)off) != (ssize_t)n) {
		free(buf);
		buf = NULL;
	}
	return buf;
}

/* 1 when the dynamic symbol table (section sh, its strings in strs)
 * defines name, 0 when not, -1 when cut short. */
static int defines(int fd, uint64_t size, const Elf64_Shdr *sh, const Elf64_Shdr *strs,
		   const char *name)
{
	Elf64_Sym *syms = read_at(fd, size, sh->sh_offset, sh->sh_size);
	char *str = read_at(fd, size, strs->sh_offset, strs->sh_size);
	int found = syms && str ? 0 : -1;
	size_t n = syms && str ? sh->sh_size / sizeof *syms : 0, len = strlen(name);
	for (size_t i = 0; i < n && !found; i++)
		found = syms[i].st_shndx != SHN_UNDEF && syms[i].st_name < strs->sh_size &&
			strs->sh_size - syms[i].st_name > len &&
			!memcmp(str + syms[i].st_name, name, len + 1);
	free(syms);
	free(str);
	return found;
}

/* Whether the shared library defines the entry symbol: 1, 0, or -1. */
static int has_entry(int fd, uint64_t size, const Elf64_Ehdr *eh)
{
	if (eh->e_shentsize != sizeof(Elf64_Shdr))
		return -1;
	Elf64_Shdr *sh = read_at(fd, size, eh->e_shoff, (uint64_t)eh->e_shnum * sizeof *sh);
	if (!sh)
		return -1;
	int found = -1;
	for (int i = 0; i < eh->e_shnum && found <= 0; i++)
		if (sh[i].sh_type == SHT_DYNSYM && sh[i].sh_link < eh->e_shnum)
			found = defines(fd, size, &sh[i], &sh[sh[i].sh_link], HPU_MODEL_ENTRY_SYMBOL);
	free(sh);
	return found;
}

static const char *elf_kind(int type)
{
	return type == ET_EXEC ? "executable" : type == ET_REL ? "object file (.o)"
	       : type == ET_CORE ? "core dump" : "file of an unknown type";
}

int hpu__model_check(const char *path, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		snprintf(err, errlen, "cannot read the model %s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	Elf64_Ehdr eh;
	uint64_t size = (uint64_t)st.st_size;
	int rc = -1, got = (int)pread(fd, &eh, sizeof eh, 0);
	if (got < 4 || memcmp(eh.e_ident, ELFMAG, SELFMAG))
		snprintf(err, errlen, "the model %s is not a shared library (no ELF header): build it with cc -shared -fPIC (docs/writing-a-model.md)",
			 path);
	else if (got < (int)sizeof eh || eh.e_ident[EI_CLASS] != ELFCLASS64)
		snprintf(err, errlen, "the model %s is not a 64-bit ELF shared library, which hpu-worker loads",
			 path);
	else if (eh.e_type != ET_DYN)
		snprintf(err, errlen, "the model %s is an ELF %s, not a shared library: build it with cc -shared -fPIC",
			 path, elf_kind(eh.e_type));
	else if (HOST_MACHINE != EM_NONE && eh.e_machine != HOST_MACHINE)
		snprintf(err, errlen, "the model %s is built for another machine (ELF machine %d, this one is %d)",
			 path, eh.e_machine, HOST_MACHINE);
	else if ((rc = has_entry(fd, size, &eh)) < 0)
		snprintf(err, errlen, "the model %s is cut short or damaged: its ELF section headers point past its end",
			 path);
	else if (rc == 0)
		snprintf(err, errlen, "the model %s has no entry symbol '%s': not an hputrain model (define it with HPU_MODEL() from <hpu/hpu.h>)",
			 path, HPU_MODEL_ENTRY_SYMBOL);
	close(fd);
	return rc == 1 ? 0 : -1;
}
