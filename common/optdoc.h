/* optdoc: an option table (opt.h) printed as a program's --help, as the
 * OPTIONS of its manual page (scdoc source, man/) and as a markdown list
 * (docs/reference/). The three come from the one table the parser reads,
 * so none of them can name an option the program does not take, or leave
 * one out.
 *
 * An entry with help is printed as "-x, --name ARG" and its help (with
 * " [ENV]" when env is set); an entry without help whose id is that of an
 * entry above it is another name of that option, printed on its line
 * ("--rdzv-id, --rdzv_id ID"); any other entry without help is not
 * documented (a hidden option such as --help-doc). An entry with a
 * section starts a heading. */
#ifndef HPU_COMMON_OPTDOC_H
#define HPU_COMMON_OPTDOC_H

#include <stdio.h>

#include "common/opt.h"

/* How the table is printed. */
enum {
	HPU_DOC_HELP = 0,     /* --help: aligned, wrapped at 79 columns */
	HPU_DOC_SCDOC = 1,    /* scdoc source for a manual page */
	HPU_DOC_MARKDOWN = 2, /* a markdown list */
	HPU_DOC_FORMATS = 3,
	/* or-ed in: the entries are the keys of a configuration file,
	 * written "name = ARG" rather than "--name ARG" */
	HPU_DOC_KEYS = 8,
};

/* The format named "help", "scdoc" or "markdown", or -1 (the value of
 * the programs' hidden --help-doc FORMAT). */
int hpu__optdoc_format(const char *name);

/* Prints the documented entries of specs (up to its empty entry) in
 * format how. col: where --help's texts start (the options before them
 * are indented by two); unused by the other formats. */
void hpu__optdoc(FILE *f, const hpu_optspec *specs, int how, int col);

/* A heading in format how, as an entry's section is printed. */
void hpu__optdoc_heading(FILE *f, const char *title, int how);

#endif
