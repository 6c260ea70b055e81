/* tool: see tool.h. */
#include "tool.h"
#include "optdoc.h"

#include <stdarg.h>
#include <stdio.h>

const char *hpu_tool_name = "hputrain";

int hpu_tool_fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "%s: error: ", hpu_tool_name);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return HPU_TOOL_BAD;
}

void hpu_tool_warn(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "%s: warning: ", hpu_tool_name);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

int hpu_tool_usage(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "%s%s%s: ", hpu_tool_name, cmd ? " " : "", cmd ? cmd : "");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n(%s %s%s--help for the usage)\n", hpu_tool_name, cmd ? cmd : "",
		cmd ? " " : "");
	va_end(ap);
	return HPU_TOOL_USAGE;
}

int hpu_tool_doc(const struct hpu_optspec *specs, const char *format, int col)
{
	int how = hpu_optdoc_format(format);
	if (how < 0)
		return hpu_tool_usage(NULL, "--help-doc takes help, scdoc or markdown, not '%s'", format);
	hpu_optdoc(stdout, specs, how, col);
	return HPU_TOOL_OK;
}
