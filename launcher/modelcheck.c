/* modelcheck: see modelcheck.h. */
#include "launcher/modelcheck.h"

#include <hpu/hpu.h>

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
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
 * defines name (its entry in *out), 0 when not, -1 when cut short. */
static int defines(int fd, uint64_t size, const Elf64_Shdr *sh, const Elf64_Shdr *strs,
		   const char *name, Elf64_Sym *out)
{
	Elf64_Sym *syms = read_at(fd, size, sh->sh_offset, sh->sh_size);
	char *str = read_at(fd, size, strs->sh_offset, strs->sh_size);
	int found = syms && str ? 0 : -1;
	size_t n = syms && str ? sh->sh_size / sizeof *syms : 0, len = strlen(name);
	for (size_t i = 0; i < n && !found; i++)
		if (syms[i].st_shndx != SHN_UNDEF && syms[i].st_name < strs->sh_size &&
		    strs->sh_size - syms[i].st_name > len &&
		    !memcmp(str + syms[i].st_name, name, len + 1)) {
			*out = syms[i];
			found = 1;
		}
	free(syms);
	free(str);
	return found;
}

/* Whether the shared library defines the entry symbol: 1 (its symbol in
 * *sym and, where the symbol's section index is one of the file's, that
 * section's header in *sec, else sec->sh_type SHT_NULL), 0, or -1. */
static int find_entry(int fd, uint64_t size, const Elf64_Ehdr *eh, Elf64_Sym *sym,
		      Elf64_Shdr *sec)
{
	if (eh->e_shentsize != sizeof(Elf64_Shdr))
		return -1;
	Elf64_Shdr *sh = read_at(fd, size, eh->e_shoff, (uint64_t)eh->e_shnum * sizeof *sh);
	if (!sh)
		return -1;
	int found = -1;
	for (int i = 0; i < eh->e_shnum && found <= 0; i++)
		if (sh[i].sh_type == SHT_DYNSYM && sh[i].sh_link < eh->e_shnum)
			found = defines(fd, size, &sh[i], &sh[sh[i].sh_link], HPU_MODEL_ENTRY_SYMBOL,
					sym);
	memset(sec, 0, sizeof *sec);
	if (found == 1 && sym->st_shndx < eh->e_shnum)
		*sec = sh[sym->st_shndx];
	free(sh);
	return found;
}

static const char *elf_kind(int type)
{
	return type == ET_EXEC ? "executable" : type == ET_REL ? "object file (.o)"
	       : type == ET_CORE ? "core dump" : "file of an unknown type";
}

/* The smallest hpu_model of any ABI: abi_version, name, setup, teardown. */
#define MODEL_MIN_SIZE (offsetof(hpu_model, teardown) + sizeof(void (*)(void *)))

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
	Elf64_Sym sym;
	Elf64_Shdr sec;
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
	else if ((rc = find_entry(fd, size, &eh, &sym, &sec)) < 0)
		snprintf(err, errlen, "the model %s is cut short or damaged: its ELF section headers point past its end",
			 path);
	else if (rc == 0)
		snprintf(err, errlen, "the model %s has no entry symbol '%s': not an hputrain model (define it with HPU_MODEL() from <hpu/hpu.h>)",
			 path, HPU_MODEL_ENTRY_SYMBOL);
	else if (sym.st_size && sym.st_size < MODEL_MIN_SIZE) {
		/* every ABI's hpu_model holds abi_version, name, setup and
		 * teardown: the worker would read past a smaller symbol and
		 * call what lies there */
		snprintf(err, errlen, "the model %s: its '%s' is %llu bytes, not an hpu_model (at least %zu): define it with HPU_MODEL() from <hpu/hpu.h>",
			 path, HPU_MODEL_ENTRY_SYMBOL, (unsigned long long)sym.st_size,
			 (size_t)MODEL_MIN_SIZE);
		rc = -1;
	}
	close(fd);
	return rc == 1 ? 0 : -1;
}

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HOST_DATA ELFDATA2LSB
#else
#define HOST_DATA ELFDATA2MSB
#endif

/* Whether section sec of the file is constant data: not writable, or
 * written only by the loader's relocations (.data.rel.ro: what
 * HPU_MODEL's const object with pointers is). A const C++ object with a
 * dynamic initializer (a default computed by a call) is put in .data,
 * its file bytes 0 where the initializer writes at load. */
static int constant_section(int fd, uint64_t size, const Elf64_Ehdr *eh, const Elf64_Shdr *sec)
{
	if (!(sec->sh_flags & SHF_WRITE))
		return 1;
	if (eh->e_shstrndx == SHN_UNDEF || eh->e_shstrndx >= eh->e_shnum)
		return 0;
	Elf64_Shdr *names = read_at(fd, size, eh->e_shoff + (uint64_t)eh->e_shstrndx * sizeof *names,
				    sizeof *names);
	static const char relro[] = ".data.rel.ro";
	char got[sizeof relro] = "";
	int ok = names && sec->sh_name < names->sh_size &&
		 names->sh_size - sec->sh_name >= sizeof relro - 1 &&
		 pread(fd, got, sizeof relro - 1, (off_t)(names->sh_offset + sec->sh_name)) ==
			 (ssize_t)(sizeof relro - 1) &&
		 !memcmp(got, relro, sizeof relro - 1);
	free(names);
	return ok;
}

/* The entry's bytes up to the end of .defaults, read from the file where
 * the entry symbol's section places them: 1, 0 for a symbol too small
 * to hold .defaults (a model built before them), -1 with why. */
static int entry_bytes(int fd, uint64_t size, unsigned char *buf, size_t n, char *why,
		       size_t whylen)
{
	Elf64_Ehdr eh;
	Elf64_Sym sym;
	Elf64_Shdr sec;
	if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh || memcmp(eh.e_ident, ELFMAG, SELFMAG) ||
	    eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != HOST_DATA ||
	    eh.e_type != ET_DYN || (HOST_MACHINE != EM_NONE && eh.e_machine != HOST_MACHINE) ||
	    find_entry(fd, size, &eh, &sym, &sec) != 1) {
		snprintf(why, whylen, "not a shared library of this machine with the entry symbol");
		return -1;
	}
	if (sym.st_size < n)
		return 0;
	if (sec.sh_type == SHT_NULL || sec.sh_type == SHT_NOBITS) {
		snprintf(why, whylen, "its %s has no bytes in the file, being set when the model is loaded",
			 HPU_MODEL_ENTRY_SYMBOL);
		return -1;
	}
	if (!constant_section(fd, size, &eh, &sec)) {
		snprintf(why, whylen, "its %s is in writable data, not constant: part of it may be set "
			 "when the model is loaded (a C++ dynamic initializer: a default computed by a call)",
			 HPU_MODEL_ENTRY_SYMBOL);
		return -1;
	}
	uint64_t at = sym.st_value - sec.sh_addr;
	if (sym.st_value < sec.sh_addr || at > sec.sh_size || sec.sh_size - at < n ||
	    sec.sh_offset > size || at > size - sec.sh_offset || size - sec.sh_offset - at < n ||
	    pread(fd, buf, n, (off_t)(sec.sh_offset + at)) != (ssize_t)n) {
		snprintf(why, whylen, "its %s lies outside its section or the file",
			 HPU_MODEL_ENTRY_SYMBOL);
		return -1;
	}
	return 1;
}

int hpu__model_declared(const char *path, hpu_train_defaults *d, char *why, size_t whylen)
{
	enum { N = offsetof(hpu_model, defaults) + sizeof(hpu_train_defaults) };
	unsigned char buf[N];
	uint32_t abi;
	memset(d, 0, sizeof *d);
	why[0] = '\0';
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		snprintf(why, whylen, "%s", strerror(errno));
		return -1;
	}
	struct stat st;
	int rc = fstat(fd, &st) == 0 ? entry_bytes(fd, (uint64_t)st.st_size, buf, N, why, whylen)
				     : -1;
	if (rc < 0 && !why[0])
		snprintf(why, whylen, "%s", strerror(errno));
	close(fd);
	if (rc <= 0)
		return rc;
	/* numbers only: the pointers (name, setup, the strings of .defaults)
	 * are set by the dynamic loader's relocations, not in these bytes */
	memcpy(&abi, buf + offsetof(hpu_model, abi_version), sizeof abi);
	if (abi < 3)
		return 0;
#define FIELD(f) memcpy(&d->f, buf + offsetof(hpu_model, defaults.f), sizeof d->f)
	FIELD(epochs);
	FIELD(batch_size);
	FIELD(lr);
	FIELD(weight_decay);
	FIELD(warmup_steps);
	FIELD(min_lr);
#undef FIELD
	return 1;
}
