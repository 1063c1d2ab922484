// Package trace reads and writes gpumem-trace, the text format in which
// gpumem stores the device-memory requests of a program: the traces shipped
// in testdata/traces, and the traces the allocator records of its own use.
// Version 1 is the exchange format; version 2, its packed form (below),
// says the same in a third to a quarter of the bytes gzipped and holds the
// corpus of bench/corpus/traces. Readers read both.
//
// # Format
//
// A trace is text, one event per line, optionally gzip-compressed (readers
// detect gzip by its magic bytes, not by the file name). The first line is
// the header:
//
//	# gpumem-trace v1: a ID SIZE STREAM T_US | f ID T_US
//	a 0 154389504 0 4
//	a 1 3145728 0 31442
//	f 1 31502
//
// Only the "# gpumem-trace v1" prefix of the header is significant. Each
// later line is one of
//
//	a ID SIZE STREAM T_US [SITE]   request ID asked for SIZE bytes on STREAM
//	f ID T_US                      request ID was freed
//	t T_US                         the program emptied the allocator's cache
//	s SITE TEXT                    site number SITE is the call stack TEXT
//
// where ID, SIZE, STREAM and T_US are unsigned decimal numbers that fit in
// 64 bits. STREAM 0 is the default stream; any other value is a stream
// handle of which only the identity matters. T_US is microseconds since the
// first event. IDs are unique within a file (recorders number them up from
// 0, but readers only require uniqueness). A request that is never freed
// was live when recording stopped. Fields are separated by spaces or tabs; a
// trailing "\r" is ignored, as are blank lines and comment lines starting
// with "#" after the header.
//
// A "t" line says that the program gave the allocator's cached memory back
// at that moment (torch.cuda.empty_cache; gpumem's Trim): the real
// allocator's layout after it is not the one a replay that never trims
// would have, so a replay trims where the line is ([Trace.Trims]). It is
// optional (the traces converted from PyTorch's history have none) and is
// not an event: readers that do not care skip it.
//
// Call sites are optional: a trace without "s" lines and SITE fields is as
// valid as one with them, and a reader that does not care may skip both.
// An "s" line defines SITE, a decimal number from 1 to 2^32-1, as TEXT: the
// rest of the line without the spaces and tabs around it. TEXT is a call
// stack, innermost frame first, the frames separated by " < ", each frame
// written "function file:line":
//
//	s 3 _conv_forward torch/nn/modules/conv.py:543 < forward train.py:41
//	a 17 802816 0 5210 3
//
// TEXT is UTF-8, holds no carriage return, and is at most [MaxSiteText]
// bytes. An "s" line is not an event and has no time; it may come anywhere
// before the first alloc line that names its SITE, and each SITE is defined
// once. The optional sixth field of an alloc line names the site where the
// request was made; without it the request has no site.
//
// # Version 2
//
// A v2 trace starts with the header "# gpumem-trace v2" (the rest of the
// line is a comment, as in v1) and says the same with fewer digits:
//
//	a SIZE STREAM DT_US [SITE]   the next request asked for SIZE bytes on STREAM
//	f BACK DT_US                 request N-1-BACK was freed, N requests allocated so far
//	t DT_US                      the program emptied the allocator's cache
//	s SITE TEXT                  as in v1
//
// Requests are numbered by their alloc lines, 0, 1, ...: the ID a v1 line
// would give. DT_US is the microseconds since the previous a, f or t line
// (since 0 for the first), so times never go backwards. A Reader returns
// the same Events for a v2 trace as for its v1 form (IDs and absolute
// times), and checks the same faults, with two more: a BACK that reaches
// before the first request, and a time that overflows 64 bits.
// `go run ./bench/corpus/pack FILE...` rewrites traces in v2 in place,
// checking each against its original first.
//
// # Checks
//
// [Reader], [Read] and [Load] reject malformed input with a [*SyntaxError]
// that matches [ErrSyntax] under errors.Is and names the file (when known),
// the line number and the fault, for example
//
//	trace gpt2.trace.gz:1234: f 77: request 77 was never allocated
//
// The faults are: a missing or wrong header line (including another format
// version); an unknown event kind; the wrong number of fields; a field that
// is not a decimal number, is negative or overflows 64 bits (32 bits for
// SITE); a SIZE of 0 or above [MaxSize] (1 PiB, far beyond any device); an
// ID allocated twice; a free of an ID never allocated; a second free of the
// same ID; a T_US smaller than the previous event's (all six shipped traces
// are monotone in time, so a trace that goes backwards is taken to be
// corrupt); a SITE of 0; an alloc line naming a SITE not defined before it;
// a SITE defined twice; an "s" line without TEXT, or whose TEXT is longer
// than MaxSiteText, is not UTF-8 or holds a carriage return; a line longer
// than 64 KiB; a last line without a newline (every line ends with one, so
// such a file was cut short, and its cut line may read as a shorter valid
// one: "f 4" of "f 421 ..."); and gzip data that is corrupt or truncated (the error then
// also wraps the gzip error, e.g. io.ErrUnexpectedEOF). The two faults of a
// trace that stops early, truncated gzip data and a last line without its
// newline, also match [ErrCutShort]: [ReadPartial] and [LoadPartial] read
// such a trace up to its last whole line (a recording whose process died).
// Errors from the underlying io.Reader itself are returned wrapped, not as
// syntax errors.
//
// # Replay
//
// [Trace] holds a whole trace in memory. Besides the events it numbers the
// requests densely: Trace.Slot[i] is the request number (0 to Requests-1, in
// order of allocation) that event i allocates or frees, so a replay can keep
// its per-request state in a plain slice instead of a map keyed by ID.
// Trace.Sites holds the sites' texts; [Reader.Site] gives them while
// streaming, since Next returns only events.
//
// # Writing
//
// [Writer] writes the format, v1 unless asked for v2 ([NewWriterFormat],
// [CreateFormat]: a v2 Writer takes requests numbered in order from 0);
// [Create] writes a file, gzip-compressed when its name ends in ".gz". A Writer checks what it can without remembering
// requests (SIZE in range, time not going backwards, sites defined once and
// before use, TEXT that reads back the same); the reader checks the rest.
// It writes the same header whether or not the trace has sites.
package trace
