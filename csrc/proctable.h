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
 *  - Every function is thread-safe: no static mutable state, but the BPF
 *    reader's one per process (pt_bpf.c: its link and decision, behind a lock).
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
#define PT_F_HAVE_MEM    16   /* rss and vms are known (Linux: statm, the exact sums) */
#define PT_F_HAVE_SID    32   /* sid is known (a macOS zombie has none) */
#define PT_F_HAVE_CPU    64   /* utime, stime and num_threads are known */
#define PT_F_KTHREAD    128   /* a kernel thread (Linux: PF_KTHREAD in stat field 9) */

/* The want argument of the table reads: what to read besides the stat line. */
#define PT_WANT_MEM       1   /* rss and vms (Linux: one more file, statm, per process) */
#define PT_WANT_PROCFS    2   /* Linux: the /proc reader, even where the BPF reader runs */
#define PT_WANT_BPF       4   /* Linux: the BPF reader or nothing (ENOTSUP where it cannot run) */

/* The readers behind pt_scan, pt_snapshot and pt_scanner_refresh. */
#define PT_READER_PROC    0   /* /proc (Linux), libproc (macOS) */
#define PT_READER_BPF     1   /* Linux: a BPF task iterator (root, or CAP_BPF + CAP_PERFMON) */

/* pt_bpf_pretend() switches, for tests only. */
#define PT_PRETEND_NO_BTF   1 /* look for the kernel's BTF where there is none */
#define PT_PRETEND_REFUSAL  2 /* load the program with a branch no verifier accepts */
#define PT_PRETEND_SKIP_SELF 4 /* drop this process's own record from every pass, as the
                                  iterator leaves a task out (its row then comes from /proc) */

/* pt_parse_stat() error codes (returned negated as errno EBADMSG by readers). */
#define PT_OK             0
#define PT_ENOPID        -1   /* no pid, or pid out of range */
#define PT_ENOCOMM       -2   /* no "(comm)", or comm longer than PT_COMM_MAX */
#define PT_ESTATE        -3   /* no single-letter state after the comm */
#define PT_EFIELD        -4   /* a field is not a decimal number, or overflows */
#define PT_ESHORT        -5   /* fewer fields than the 24 we need */

/*
 * One process. All counters are raw kernel units: start_time, utime, stime in
 * clock ticks; rss and vms in pages. Unknown values are flagged (PT_F_HAVE_*),
 * never made up. Layout is fixed (int64 fields first) so that Python can
 * unpack rows in bulk: 13 x int64, int32, char, then a length-prefixed comm
 * (Pascal string).
 */
typedef struct pt_proc {
    int64_t pid;
    int64_t ppid;
    int64_t pgid;
    int64_t sid;          /* PT_F_HAVE_SID */
    int64_t tty_nr;
    int64_t start_time;
    int64_t utime;        /* PT_F_HAVE_CPU */
    int64_t stime;        /* PT_F_HAVE_CPU */
    int64_t num_threads;  /* PT_F_HAVE_CPU */
    int64_t rss;          /* resident pages, PT_F_HAVE_MEM */
    int64_t uid;          /* effective uid (owner of the /proc/<pid> directory), PT_F_HAVE_UID */
    int64_t exit_code;    /* raw field 52 (waitpid status of a zombie), PT_F_HAVE_EXIT */
    int64_t vms;          /* virtual size in pages, PT_F_HAVE_MEM */
    int32_t flags;        /* PT_F_* */
    char state;           /* field 3: R S D Z T t X I ... */
    unsigned char comm_len;
    char comm[PT_COMM_MAX];
} pt_proc;

/* A pid listed in /proc that this caller may not read (hidepid=1, an LSM). */
typedef struct pt_denied {
    int64_t pid;
    int64_t uid;          /* owner of /proc/<pid>, -1 when that is hidden too */
} pt_denied;

/* What a table read reports besides its rows. The caller sets the two "in"
 * fields (denied may be NULL) and the read fills the rest. */
typedef struct pt_scaninfo {
    pt_denied *denied;    /* in: the caller's array for pids it may not read */
    size_t denied_cap;    /* in: entries in denied */
    size_t ndenied;       /* out: pids listed but not readable, in pid order (only
                             the first denied_cap are stored) */
    size_t needed;        /* out, ENOSPC: the pids listed, the room to retry with */
    int64_t bad_pid;      /* out, EBADMSG: the pid whose line did not parse */
    int32_t threads;      /* out: threads the read used, the caller's included */
    int32_t reader;       /* out: PT_READER_* that made the rows */
} pt_scaninfo;

/* Parse one /proc/<pid>/stat line of len bytes (no NUL needed) into *out.
 * Pure: no I/O, never reads outside buf[0..len). Returns PT_OK or a PT_E* code.
 * Sets every field the line carries and PT_F_HAVE_SID | PT_F_HAVE_CPU; uid,
 * rss and vms are not in the line (their flags stay clear). */
int pt_parse_stat(const char *buf, size_t len, pt_proc *out);

/* Parse one /proc/<pid>/statm line ("size resident shared ...", pages) into
 * out->vms and out->rss and set PT_F_HAVE_MEM. Pure, as pt_parse_stat.
 * Returns PT_OK, or PT_EFIELD / PT_ESHORT leaving *out unchanged. */
int pt_parse_statm(const char *buf, size_t len, pt_proc *out);

/* Read the whole process table with up to pt_scan_threads(npids, nthreads)
 * threads (this one included, signals blocked in the others): list every pid,
 * then read each one's stat line (and, with PT_WANT_MEM, statm) and owner.
 * rows[0..n) are the readable processes sorted by pid, n the return value;
 * the pids this caller may not read go to info->denied instead (sorted).
 * Processes that exit during the scan are left out (a pid that reads as gone,
 * as state X or as a thread while a process holds it, as during de_thread,
 * is read again, at most three times). Returns n, or
 * -1 with errno: ENOSPC (info->needed: pids listed; retry with more room),
 * EBADMSG (info->bad_pid), or an errno of open/getdents64/read. Threads are
 * started and joined inside the call; nothing outlives it. */
long pt_scan(pt_proc *rows, size_t cap, int want, int nthreads, pt_scaninfo *info);

/* pt_scan with one thread: the reader's own pass (every platform has it).
 * On Linux both use the BPF reader where pt_reader() says so (one pass in the
 * kernel, the same rows; want PT_WANT_PROCFS / PT_WANT_BPF choose). */
long pt_snapshot(pt_proc *rows, size_t cap, int want, pt_scaninfo *info);

/* Read one process (a thread id that is not a thread-group leader is no
 * process: ESRCH). Returns 0, or -1 with errno ESRCH (no such process), EACCES
 * (this caller may not read it: hidepid, an LSM; also a pid that hidepid=2
 * hides while a process holds it), EBADMSG (unparsable line) or
 * another errno from open/read. */
int pt_read(int pid, int want, pt_proc *out);

/* The C floor for benchmarks: exactly the system calls of pt_scan with the
 * same want and threads (the listing, then per pid the same opens, reads,
 * owner lookup and closes, the ptrace check of a zombie whose status reads 0,
 * the one pidfd_open of a pid that reads as gone; not the re-reads of a pid
 * that a process still holds), with no parsing and no rows; scratch holds the pid
 * list. Returns the number of processes read, or -1 with errno (ENOSPC as
 * pt_scan). */
long pt_floor_scan(pt_proc *scratch, size_t cap, int want, int nthreads, pt_scaninfo *info);

/* The floor of pt_read: the same system calls, no parsing, no row. Returns the
 * bytes read, or -1 with errno (ESRCH: no such process). */
long pt_floor_read(int pid, int want);

/* Which reader the table reads of this process use: PT_READER_BPF or
 * PT_READER_PROC. Decided once per process, on the first call of this or of a
 * table read (loading the BPF program then, ~30 ms; thread-safe; a forked
 * child checks that the parent's link is still its own, else loads again;
 * a load that met a transient error, EAGAIN/EINTR/EMFILE/ENFILE/ENOMEM, is
 * tried again by a later call, backing off from 20 ms to 5 s).
 * Writes why the BPF reader is not used (or "" when it is) into why[0..len),
 * NUL-terminated and truncated. Never fails. */
int pt_reader(char *why, size_t len);

/* Test switch: make the next decision of pt_reader() meet a fault
 * (PT_PRETEND_*), through the same detection code as the real one. Returns 0,
 * or -1 with EBUSY once the decision is made. */
int pt_bpf_pretend(int what);

/* ---- parallel scan ------------------------------------------------------ */

/* Below this many pids one thread reads the table faster than several (the
 * cost of starting a thread against ~10 us of kernel work per pid); measured
 * on a 2-vCPU VM, see README "Speed". Each extra thread gets at least half
 * this many pids. */
#define PT_PARALLEL_MIN 256
/* Upper bound on the threads of one scan. */
#define PT_THREADS_MAX 8

/* How many threads a scan of npids pids uses when asked for nthreads (0:
 * decide from npids, PT_PARALLEL_MIN, the CPUs this thread may run on and how
 * many of them are busy now (/proc/loadavg's runnable count): a thread is
 * added only for a CPU that is free; n > 0: at most n). Returns >= 1; never
 * fails. */
int pt_scan_threads(size_t npids, int nthreads);

/* ---- scanner: per-process fds kept open between refreshes ----------------- */

/* The fds kept for one process: its stat file, its statm file (PT_WANT_MEM),
 * and its /proc/<pid> directory (O_PATH), whose owner is read afresh on every
 * refresh (a kept file's owner is only updated by a path lookup). -1: none. */
typedef struct pt_fdslot {
    int32_t pid;
    int32_t stat;
    int32_t statm;
    int32_t dir;
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
    int want;             /* PT_WANT_* of every refresh */
    int hidepid;          /* -1: not checked yet; 1: /proc is mounted hidepid, so
                             every refresh re-checks access through the kept fds */
} pt_scanner;

/* Set up *sc over the caller's slots and spare (cap entries each). No I/O,
 * nothing opened yet (the first refresh reads /proc/self/mountinfo once, for
 * sc->hidepid). Returns 0. */
int pt_scanner_init(pt_scanner *sc, pt_fdslot *slots, pt_fdslot *spare, size_t cap,
                    size_t max_fds, int want);

/* Move the kept fds into new caller arrays of cap entries each (the old ones
 * may then be freed). Returns 0, or -1 with ENOSPC when cap < sc->nslots. */
int pt_scanner_resize(pt_scanner *sc, pt_fdslot *slots, pt_fdslot *spare, size_t cap);

/* The whole table into rows[0..cap) (and info->denied), as pt_scan, where the kept fds of a process are re-read with
 * pread after an fstat of its kept directory fd (its owner now; where /proc is mounted hidepid, also
 * faccessat of "stat" through it, and a process this caller may no longer read
 * goes to info->denied, its fds closed); a process
 * whose kept stat fd fails with ESRCH is gone, and its pid, if listed again, is
 * opened afresh (a reused pid); pids not kept are opened and read, and kept
 * while the fds held stay within max_fds (all of a process's fds or none);
 * the fds of pids that are gone are closed. Returns the row count, or -1 with
 * errno: ENOSPC (info->needed: pids listed; nothing changed; grow rows and the
 * slots with pt_scanner_resize, then retry), EBADMSG (info->bad_pid), or an
 * errno of open/getdents64/read. After a failure every kept fd is still
 * accounted for (EMFILE/ENFILE included: the caller may close the kept fds,
 * lower max_fds and retry, which is what the Python Scanner does). */
long pt_scanner_refresh(pt_scanner *sc, pt_proc *rows, size_t cap, int nthreads,
                        pt_scaninfo *info);

/* The floor of pt_scanner_refresh for benchmarks: the same listing, the same
 * kept fds (kept and opened under the same rules) and the same fstat and
 * preads, with no parsing and no rows. Returns the processes read, or -1 as
 * pt_scanner_refresh. Use a scanner of its own. */
long pt_scanner_floor(pt_scanner *sc, pt_proc *rows, size_t cap, int nthreads,
                      pt_scaninfo *info);

/* Close every fd the scanner holds. The scanner stays usable (the next
 * refresh opens afresh). Returns the number of fds closed; never fails. */
long pt_scanner_close(pt_scanner *sc);

/* ==== extra per-process reads (csrc/pt_extra.c): proctable.process_iter ==== */

/* What pt_read_extra reads for one process (pt_extra.want), besides the stat
 * line it always reads last to prove the pid still names that process. */
#define PT_X_STATUS       1   /* status: the Uid and Gid lines */
#define PT_X_STATM        2   /* statm: all seven fields */
#define PT_X_CMDLINE      4   /* cmdline: the raw bytes, into the arena */
#define PT_X_EXE          8   /* exe: the link's target, into the arena */
#define PT_X_CMDLINE_LONG 16  /* cmdline only where the comm is 15 bytes or more (the
                                 kernel's limit) and it is no kernel thread or zombie:
                                 read after the stat line, which is then read again */
#define PT_X_PROCFS       32  /* pt_scan_extra: the /proc reader even where the BPF
                                 reader runs (as PT_WANT_PROCFS) */
#define PT_X_BPF          64  /* pt_scan_extra: the BPF reader or nothing (ENOTSUP
                                 where it cannot run, as PT_WANT_BPF) */
#define PT_X_CWD          128 /* cwd: the link's target, into the arena */
#define PT_X_ENVIRON      256 /* environ: the raw bytes, into the arena */
#define PT_X_FDS          512 /* fd/: the number of its entries, into nfds */
#define PT_X_NICE         1024 /* getpriority(PRIO_PROCESS, pid), into nice (no /proc
                                  file: it works where hidepid denies the others) */
#define PT_X_PIN          2048 /* pt_read_one: first a pidfd of the pid (its inode into
                                  pidfs_ino; PT_X_PIDFD_ENDED if it polls readable after
                                  the stat line was read) and the inode of /proc/<pid>
                                  (dir_ino), both before the stat line is read */
#define PT_X_DIR          4096 /* pt_read_one: the inode of /proc/<pid> after the stat
                                  line was read (dir_ino; 0 where it cannot be looked up) */

/* pt_extra.flags (out) */
#define PT_X_GONE         1   /* exited, or the pid names another process now: no data */
#define PT_X_ZOMBIE       2   /* the stat line read last says state Z */
#define PT_X_HAVE_BLKIO   4   /* the stat line has field 42 (delayacct_blkio_ticks) */
#define PT_X_TRUNCATED    8   /* cmdline did not fit PT_X_BLOB_MAX bytes: not stored */
#define PT_X_HAVE_CMDLINE 16  /* cmdline was read: its bytes are in the arena */
#define PT_X_ENV_TRUNCATED 32 /* environ did not fit PT_X_BLOB_MAX bytes: not stored */
#define PT_X_PIDFD_ENDED  64  /* PT_X_PIN: the pidfd's process had ended by then */

/* Longest cmdline or exe target stored; a longer cmdline sets PT_X_TRUNCATED,
 * a longer exe target err_exe ENAMETOOLONG. */
#define PT_X_BLOB_MAX 65536

/* One process's extra data. Every field is an int64 (one struct format for a
 * bulk unpack). The caller sets pid, start_time and want; pt_read_extra
 * fills the rest. An err_* field is 0 when that file was read, else its
 * errno (EACCES: denied to this caller; ENOENT: no such file for it, e.g. a
 * kernel thread's exe; EBADMSG: it did not parse); the values of a failed
 * read are 0. */
typedef struct pt_extra {
    int64_t pid;          /* in */
    int64_t start_time;   /* in: the start time (clock ticks) the caller knows */
    int64_t want;         /* in: PT_X_* */
    int64_t flags;        /* out: PT_X_GONE ... */
    int64_t task_flags;   /* out: stat field 9, the kernel's PF_* flags (PF_KTHREAD...) */
    int64_t pidfs_ino;    /* out: the inode of its pidfs file (what fstat of a pidfd of it
                             says), where the BPF reader knows it; else 0 */
    int64_t uid[3];       /* real, effective, saved (PT_X_STATUS) */
    int64_t gid[3];
    int64_t cpu[5];       /* utime, stime, cutime, cstime, blkio (fields 14-17, 42), ticks */
    int64_t statm[7];     /* size, resident, shared, text, lib, data, dt, pages */
    int64_t cmdline_off;  /* cmdline bytes: arena[cmdline_off .. +cmdline_len) */
    int64_t cmdline_len;
    int64_t exe_off;      /* exe target bytes: arena[exe_off .. +exe_len) */
    int64_t exe_len;
    int64_t err_stat;     /* the stat file itself: EACCES (hidepid, an LSM: nothing
                             else is read), or an errno such as EMFILE */
    int64_t err_status;
    int64_t err_statm;
    int64_t err_cmdline;
    int64_t err_exe;
    int64_t cwd_off;      /* cwd target bytes: arena[cwd_off .. +cwd_len) (PT_X_CWD) */
    int64_t cwd_len;
    int64_t env_off;      /* environ bytes: arena[env_off .. +env_len) (PT_X_ENVIRON) */
    int64_t env_len;
    int64_t nfds;         /* entries of fd/ (PT_X_FDS) */
    int64_t nice;         /* getpriority's nice value (PT_X_NICE) */
    int64_t err_cwd;
    int64_t err_environ;
    int64_t err_fds;
    int64_t err_nice;     /* getpriority's errno (ESRCH: no such process) */
    int64_t dir_ino;      /* the inode of /proc/<pid> (PT_X_PIN, PT_X_DIR), else 0 */
} pt_extra;

/* Read the extra data of rows[0..n) (each row's own want) with up to
 * pt_scan_threads(n, nthreads) threads. Per process: open its stat file
 * (which binds the fd to that process), read the wanted files, then read the
 * stat fd: a process gone meanwhile fails that read, and a start time other
 * than rows[i].start_time means another process holds the pid; both set
 * PT_X_GONE. cmdline and exe bytes go to the caller's arena (arena_cap
 * bytes); *arena_used says how many bytes the blobs took, also when they did
 * not fit. Returns n, or -1 with errno: ENOSPC (the arena is too small:
 * retry with *arena_used bytes or more), or an errno of open("/proc").
 * Other errors of one file are left in that row's err_* field. */
long pt_read_extra(pt_extra *rows, size_t n, char *arena, size_t arena_cap,
                   size_t *arena_used, int nthreads);

/* One process as pt_read_extra reads it (x->pid, x->start_time, x->want), on
 * the calling thread, with its stat line (the one read last, the proof) parsed
 * into *row as pt_read() gives it (without memory, uid or exit). PT_X_GONE
 * also where the pid is a thread id, not a process. The files are opened by
 * their /proc/<pid>/... paths. Returns 0, or -1 with errno: ENOSPC (retry
 * with *arena_used bytes of arena), ENOMEM, or an errno that fails the read
 * as it would fail a table read (EMFILE). */
int pt_read_one(pt_extra *x, pt_proc *row, char *arena, size_t arena_cap, size_t *arena_used);

/* Is there a process (a thread-group leader) with this pid that /proc shows
 * to this caller? 1 yes, 0 no (none, a thread id, or hidden by hidepid), -1
 * with errno where pidfds cannot be had here (the caller asks otherwise). */
int pt_pid_exists(int pid);

/* The pids /proc lists, sorted, into pids[0..cap). Returns how many there are
 * (more than cap: only cap were stored; retry with room for that many), or -1
 * with errno (of open or getdents64 on /proc). */
long pt_list_pids(int64_t *pids, size_t cap);

/* The whole table and the extra data of every process in one pass: list the
 * pids of /proc into extra[0..cap).pid, then per pid as pt_read_extra (any
 * start time), where the stat line read last also becomes rows[i] (with the
 * owner of /proc/<pid> as its uid, looked up before that read, as pt_scan
 * does; a zombie's row is pt_read()'s, so its exit and masking are the
 * snapshot's). Where the BPF reader runs (and want has no PT_X_PROCFS), the
 * table and what stat and status give (cpu fields, uids and gids) come from
 * its records instead, and /proc is read, as pt_read_extra reads it, only for
 * statm, cmdline and exe and for the rows it did not make; info->reader says
 * which. want (PT_X_*) is every process's want. rows[0..n) and
 * extra[0..n) are the readable processes sorted by pid, n the return value;
 * the pids this caller may not read go to info->denied (sorted). Returns n, or
 * -1 with errno: ENOSPC (info->needed: pids listed, retry with that many
 * rows; or *arena_used > arena_cap: retry with a larger arena), or an errno
 * of open/getdents64. */
long pt_scan_extra(pt_proc *rows, pt_extra *extra, size_t cap, int want, char *arena,
                   size_t arena_cap, size_t *arena_used, int nthreads, pt_scaninfo *info);

/* The pure parsers behind pt_read_extra (no I/O; never read outside
 * buf[0..len)). Each returns PT_OK or PT_EFIELD / PT_ESHORT, leaving *out's
 * fields unchanged on failure. */
/* status: the "Uid:" and "Gid:" lines (real, effective, saved). */
int pt_parse_status_ids(const char *buf, size_t len, pt_extra *out);
/* stat: field 9 into task_flags, fields 14-17 and 42 into cpu[] (42 absent:
 * 0, PT_X_HAVE_BLKIO clear), and PT_X_ZOMBIE for state Z. */
int pt_parse_stat_cpu(const char *buf, size_t len, pt_extra *out);
/* statm: the seven fields. */
int pt_parse_statm_all(const char *buf, size_t len, pt_extra *out);

/* ==== end of extra per-process reads ==== */

/* cdef-end */

#endif /* PROCTABLE_H */
