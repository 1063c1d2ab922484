/* check.h: the shim's C test programs' checks (paths.c, tfalloc.c,
 * gatecheck.c). CHECK says what failed, where, and counts it; ok says
 * "ok: what" if no check failed since the last ok. Each program exits 1
 * if failures is not 0. */
#ifndef GPUMEM_SHIM_CHECK_H
#define GPUMEM_SHIM_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                         \
	do {                                                         \
		if (!(cond)) {                                           \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                        \
			fprintf(stderr, "\n");                               \
			failures++;                                          \
		}                                                        \
	} while (0)

__attribute__((unused)) static void ok(const char *what) {
	static int reported;
	if (failures == reported) printf("ok: %s\n", what);
	reported = failures;
}

#endif
