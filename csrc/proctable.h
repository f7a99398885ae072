/*
 * proctable.h: the C contract of proctable's native core.
 *
 * Everything between the cdef-begin and cdef-end markers is also the cffi cdef
 * (csrc/build_ffi.py extracts it), so it holds plain declarations only.
 *
 * Conventions:
 *  - Functions return >= 0 on success and -1 with errno set on failure.
 *  - No function allocates memory that the caller must free: the caller passes
 *    buffers; a function that needs more room fails with ENOSPC and says how
 *    much it needs through an out parameter.
 *  - Every function is thread-safe: no static mutable state.
 */
#ifndef PROCTABLE_H
#define PROCTABLE_H

#include <stddef.h>
#include <stdint.h>

/* cdef-begin */

/* Longest comm the kernel prints (kernel threads may carry up to 64 bytes). */
#define PT_COMM_MAX 64

/* pt_proc.flags */
#define PT_F_HAVE_EXIT    1   /* the line had field 52 (Linux >= 3.5) */
#define PT_F_EXIT_MASKED  2   /* field 52 is hidden from this reader (ptrace rules) */
#define PT_F_HAVE_UID     4   /* uid is known */

/* pt_parse_stat() error codes (returned negated as errno EBADMSG by readers). */
#define PT_OK             0
#define PT_ENOPID        -1   /* no pid, or pid out of range */
#define PT_ENOCOMM       -2   /* no "(comm)", or comm longer than PT_COMM_MAX */
#define PT_ESTATE        -3   /* no single-letter state after the comm */
#define PT_EFIELD        -4   /* a field is not a decimal number, or overflows */
#define PT_ESHORT        -5   /* fewer fields than the 24 we need */

/*
 * One process. All counters are raw kernel units: start_time, utime, stime in
 * clock ticks; rss in pages. Unknown values are -1 (uid) or flagged (exit).
 * Layout is fixed (int64 fields first) so that Python can unpack rows in bulk:
 * 12 x int64, int32, char, then a length-prefixed comm (Pascal string).
 */
typedef struct pt_proc {
    int64_t pid;
    int64_t ppid;
    int64_t pgid;
    int64_t sid;
    int64_t tty_nr;
    int64_t start_time;
    int64_t utime;
    int64_t stime;
    int64_t num_threads;
    int64_t rss;
    int64_t uid;          /* owner of /proc/<pid>, -1 when unknown */
    int64_t exit_code;    /* raw field 52 (waitpid status of a zombie) */
    int32_t flags;        /* PT_F_* */
    char state;           /* field 3: R S D Z T t X I ... */
    unsigned char comm_len;
    char comm[PT_COMM_MAX];
} pt_proc;

/* Parse one /proc/<pid>/stat line of len bytes (no NUL needed) into *out.
 * Pure: no I/O, never reads outside buf[0..len). Returns PT_OK or a PT_E* code.
 * uid is left at -1 and PT_F_HAVE_UID clear: the line does not carry it. */
int pt_parse_stat(const char *buf, size_t len, pt_proc *out);

/* Read the whole process table in one pass into rows[0..cap).
 * Returns the row count (sorted by pid). Fails with -1 and errno:
 *   ENOSPC  more than cap processes; *needed holds the count seen so far
 *           (a lower bound): retry with more room.
 *   EBADMSG a stat line did not parse (*needed holds the pid).
 *   anything else from open/getdents64/read.
 * Processes that exit during the scan are skipped. */
long pt_snapshot(pt_proc *rows, size_t cap, size_t *needed);

/* Read one process. Returns 0, or -1 with errno ESRCH (no such process),
 * EBADMSG (unparsable line) or another errno from open/read. */
int pt_read(int pid, pt_proc *out);

/* The C floor for benchmarks: the same directory walk and open/read/fstat/close
 * of every stat file as pt_snapshot, with no parsing and no rows.
 * Returns the number of stat files read, or -1 with errno. */
long pt_floor_scan(void);

/* cdef-end */

#endif /* PROCTABLE_H */
