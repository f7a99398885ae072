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
#define PT_F_THREAD       8   /* field 38 (exit_signal) is -1: a thread, not a process */

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

/* Read one process (a thread id that is not a thread-group leader is no
 * process: ESRCH). Returns 0, or -1 with errno ESRCH (no such process),
 * EBADMSG (unparsable line) or another errno from open/read. */
int pt_read(int pid, pt_proc *out);

/* The C floor for benchmarks: the same directory walk and open/read/fstat/close
 * of every stat file as pt_snapshot, with no parsing and no rows.
 * Returns the number of stat files read, or -1 with errno. */
long pt_floor_scan(void);

/* The floor of pt_read for benchmarks: the same open/read/fstat/close of
 * one stat file, with no parsing and no row. Returns the bytes read, or -1
 * with errno (ESRCH: no such process). */
long pt_floor_read(int pid);

/* ---- parallel scan ------------------------------------------------------ */

/* Below this many pids one thread reads the table faster than several (the
 * cost of starting a thread against ~10 us of kernel work per pid); measured
 * on a 2-vCPU VM, see README "Speed". Each extra thread gets at least half
 * this many pids. */
#define PT_PARALLEL_MIN 256
/* Upper bound on the threads of one scan. */
#define PT_THREADS_MAX 8

/* How many threads pt_scan would use for npids pids when asked for nthreads
 * (0: decide from npids, PT_PARALLEL_MIN and the CPUs this thread may run on;
 * n > 0: at most n). Returns >= 1; never fails. */
int pt_scan_threads(size_t npids, int nthreads);

/* pt_snapshot, in two passes: getdents64 lists every pid into rows[].pid,
 * then up to pt_scan_threads(count, nthreads) threads (this one included,
 * signals blocked in the others) read the stat files of slices of that list
 * in place. Same result, errors and ENOSPC/EBADMSG meaning of *needed as
 * pt_snapshot (ENOSPC: *needed is the number of pids listed). Threads are
 * started and joined inside the call; nothing outlives it. */
long pt_scan(pt_proc *rows, size_t cap, size_t *needed, int nthreads);

/* The floor of pt_scan: the same two passes, the same buffer (used for the
 * pid list only) and thread count, the same openat/read/fstat/close of every
 * stat file, with no parsing and no rows. Returns the number of stat files
 * read, or -1 with errno (ENOSPC as pt_scan). */
long pt_floor_scan_mt(pt_proc *scratch, size_t cap, size_t *needed, int nthreads);

/* ---- scanner: stat fds kept open between refreshes ------------------------ */

/* One kept stat fd. */
typedef struct pt_fdslot {
    int32_t pid;
    int32_t fd;           /* open O_RDONLY|O_CLOEXEC on <pid>/stat; -1 for none */
} pt_fdslot;

/* The state of a scanner. The caller allocates it and both slot arrays and
 * keeps them alive until pt_scanner_close(); the scanner owns the fds in
 * them. Not thread-safe: one call at a time per scanner. */
typedef struct pt_scanner {
    pt_fdslot *slots;     /* kept fds, nslots entries sorted by pid (caller's memory) */
    pt_fdslot *spare;     /* where a refresh builds the next slots (caller's memory) */
    size_t nslots;
    size_t cap;           /* entries in each of slots and spare */
    size_t max_fds;       /* most fds kept between refreshes, the /proc dirfd included */
    size_t open_fds;      /* fds kept now, the /proc dirfd included */
    int procfd;           /* /proc, kept when max_fds >= 1; -1 otherwise */
} pt_scanner;

/* Set up *sc over the caller's slots and spare (cap entries each). No I/O,
 * nothing opened yet. Returns 0. */
int pt_scanner_init(pt_scanner *sc, pt_fdslot *slots, pt_fdslot *spare, size_t cap,
                    size_t max_fds);

/* Move the kept fds into new caller arrays of cap entries each (the old ones
 * may then be freed). Returns 0, or -1 with ENOSPC when cap < sc->nslots. */
int pt_scanner_resize(pt_scanner *sc, pt_fdslot *slots, pt_fdslot *spare, size_t cap);

/* The whole table into rows[0..cap), sorted by pid, as pt_scan, where every
 * kept fd is re-read with pread (a pid whose kept fd fails with ESRCH was
 * reused, or has exited: it is opened afresh), pids not kept are opened and
 * read, and kept while fewer than max_fds fds are held; the fds of pids that
 * are gone are closed. A kept fd's fstat gives the uid /proc showed when the
 * stat file was last looked up. Returns the row count, or -1 with errno:
 * ENOSPC (*needed: pids listed; nothing changed; grow rows and the slots with
 * pt_scanner_resize, then retry), EBADMSG (*needed: the pid), or an errno of
 * open/getdents64/read. After a failure every kept fd is still accounted for. */
long pt_scanner_refresh(pt_scanner *sc, pt_proc *rows, size_t cap, size_t *needed,
                        int nthreads);

/* Close every fd the scanner holds. The scanner stays usable (the next
 * refresh opens afresh). Returns the number of fds closed; never fails. */
long pt_scanner_close(pt_scanner *sc);

/* cdef-end */

#endif /* PROCTABLE_H */
