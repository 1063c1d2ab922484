/* gate.h: the launch gate (gate.c), as preload.c uses it. */
#ifndef GPUMEM_GATE_H
#define GPUMEM_GATE_H

/* What the program gets for the driver function fn it looked up by name
 * (dlsym or cuGetProcAddress): fn itself, or a thunk that passes the gate
 * (a call that submits work) or notes an export of memory. Also notes a
 * name it cannot classify, or cuGetExportTable, which turn moves off. */
void *gate_lookup(const char *name, void *fn);

/* Whether name is one the gate hands out thunks for (the shim's dlsym
 * looks at those names, besides the driver's "cu" ones). */
int gate_watches(const char *name);

/* Closes the gate: returns 0 once no thread is inside a gated call and
 * none can enter, or -1 if moves are off in this process (and the gate
 * stays open). Then gate_open must follow. One mover at a time. */
int gate_close(void);
void gate_open(void);

/* Set from the environment before main. owns: whether an address is
 * gpumem's (NULL until gpumem is loaded: every address counts as its). */
void gate_init(int counting, int lookups);
void gate_set_owner(int (*owns)(const void *));

/* Why moves are off, or NULL while the gate is complete. */
const char *gate_off_reason(void);

/* The counts of the gated calls, for the shim's report; their total so
 * far (0 unless counting). */
void gate_report(void);
unsigned long gate_calls(void);

#endif
