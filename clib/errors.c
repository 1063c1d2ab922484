/* errors.c: the calling thread's last failure (status, message and, for an
 * out-of-memory, the verdict), the bottom layer of the C files: recorded by
 * the Go side (export.go) and by the C files above through
 * gpumem_set_error, read by gpumem.h's gpumem_last_error, gpumem_last_status
 * and gpumem_last_oom, and by the C files above through gpumem_last_verdict.
 * It calls nothing of libgpumem's own. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define EXPORT __attribute__((visibility("default")))

/* The calling thread's last failure, in a block of its own found through a
 * pthread key. Not __thread: a Go c-shared library is loaded with static
 * TLS, of which glibc keeps only a little for libraries loaded by dlopen
 * (Python's ctypes then fails with "cannot allocate memory in static TLS
 * block"). The block is made at the thread's first failure and freed when
 * the thread exits. */
typedef struct {
	gpumem_status status;
	gpumem_oom oom;
	char msg[2048];
} last_failure;

static pthread_key_t last_key;
static pthread_once_t last_once = PTHREAD_ONCE_INIT;
static void make_last_key(void) { pthread_key_create(&last_key, free); }

/* The thread's block; NULL if it has none and create is 0, or if malloc
 * fails (the failure is then not recorded; gpumem_last_error says so). */
static last_failure *last(int create) {
	pthread_once(&last_once, make_last_key);
	last_failure *f = pthread_getspecific(last_key);
	if (!f && create) {
		f = calloc(1, sizeof *f);
		if (f && pthread_setspecific(last_key, f) != 0) {
			free(f);
			f = NULL;
		}
	}
	return f;
}

void gpumem_set_error(gpumem_status status, const char *msg, size_t n, const gpumem_oom *oom) {
	last_failure *f = last(1);
	if (!f) return;
	f->status = status;
	if (n >= sizeof f->msg) n = sizeof f->msg - 1;
	memcpy(f->msg, msg, n);
	f->msg[n] = 0;
	if (oom) f->oom = *oom;
	else memset(&f->oom, 0, sizeof f->oom);
}

void gpumem_last_verdict(gpumem_oom *out) {
	last_failure *f = last(0);
	if (f) *out = f->oom;
	else memset(out, 0, sizeof *out);
}

EXPORT const char *gpumem_last_error(void) {
	last_failure *f = last(0);
	return f ? f->msg : "";
}

EXPORT gpumem_status gpumem_last_status(void) {
	last_failure *f = last(0);
	return f ? f->status : GPUMEM_SUCCESS;
}

EXPORT gpumem_status gpumem_last_oom(gpumem_oom *out, size_t size) {
	if (!out) return GPUMEM_ERROR_INVALID_VALUE;
	gpumem_oom v;
	gpumem_last_verdict(&v);
	memcpy(out, &v, size < sizeof v ? size : sizeof v);
	return GPUMEM_SUCCESS;
}
