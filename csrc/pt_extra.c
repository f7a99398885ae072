/*
 * pt_extra.c: the extra per-process reads behind proctable.process_iter().
 *
 * A snapshot gives the stat line of every process; psutil-style callers also
 * want the real and saved uids (status), all of statm, cmdline and exe. This
 * file reads those for the pids of a snapshot, in bulk, with the GIL released
 * (cffi releases it around every lib call) and a few threads where a second
 * CPU is free. Per process, in this order:
 *
 *   openat(procfd, "<pid>/stat")        binds the fd to that process
 *   open/read/close status, statm, cmdline, readlinkat exe (as wanted)
 *   read(stat fd)                       fails (ESRCH) once that process is gone
 *
 * so a successful last read proves every path looked up before it named the
 * process the fd was opened for; its start time is then compared with the
 * snapshot's, so a pid reused between the snapshot and this read is not taken
 * for the process the caller holds. The stat line read last also gives the
 * cpu fields the snapshot's row does not keep (cutime, cstime, blkio).
 *
 * Memory: the caller owns every buffer (rows and the arena of cmdline and exe
 * bytes); blobs are placed in the arena through an atomic cursor and a blob
 * that does not fit is counted, not stored, so the caller can retry with the
 * room the call reports (ENOSPC). Each thread reads into its own stack buffer.
 *
 * The parsers are pure and built on every platform; the reader is Linux-only
 * (elsewhere it fails with ENOSYS).
 */
#ifdef __linux__
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <string.h>

#include "proctable.h"

/* ---- pure parsers ---------------------------------------------------------- */

/* Parse an unsigned decimal at buf[*pos..len) into *out (at most 19 digits,
 * so no overflow). Returns 0 or -1. */
static int
parse_u64(const char *buf, size_t len, size_t *pos, int64_t *out)
{
    size_t i = *pos, first = i;
    int64_t v = 0;

    while (i < len && i - first < 19 && buf[i] >= '0' && buf[i] <= '9')
        v = v * 10 + (buf[i++] - '0');
    if (i == first || (i < len && buf[i] >= '0' && buf[i] <= '9'))
        return -1;
    *pos = i;
    *out = v;
    return 0;
}

/* Find "\n<key>" (or <key> at the very start) in buf[0..len); returns the
 * offset just after it, or -1. */
static long
find_line(const char *buf, size_t len, const char *key)
{
    size_t klen = strlen(key);

    for (size_t i = 0; i + klen <= len; i++) {
        if ((i == 0 || buf[i - 1] == '\n') && memcmp(buf + i, key, klen) == 0)
            return (long)(i + klen);
        /* skip to the next line */
        const char *nl = memchr(buf + i, '\n', len - i);
        if (nl == NULL)
            break;
        i = (size_t)(nl - buf);
    }
    return -1;
}

/* Three tab-separated numbers after a "Uid:\t"-style key (psutil's rule:
 * "Uid:\t(\d+)\t(\d+)\t(\d+)"). Returns 0 or -1. */
static int
parse_ids(const char *buf, size_t len, const char *key, int64_t vals[3])
{
    long at = find_line(buf, len, key);
    size_t pos;

    if (at < 0)
        return -1;
    pos = (size_t)at;
    for (int k = 0; k < 3; k++) {
        if (k > 0) {
            if (pos >= len || buf[pos] != '\t')
                return -1;
            pos++;
        }
        if (parse_u64(buf, len, &pos, &vals[k]) != 0)
            return -1;
    }
    return 0;
}

int
pt_parse_status_ids(const char *buf, size_t len, pt_extra *out)
{
    int64_t uid[3], gid[3];

    if (parse_ids(buf, len, "Uid:\t", uid) != 0)
        return find_line(buf, len, "Uid:\t") < 0 ? PT_ESHORT : PT_EFIELD;
    if (parse_ids(buf, len, "Gid:\t", gid) != 0)
        return find_line(buf, len, "Gid:\t") < 0 ? PT_ESHORT : PT_EFIELD;
    memcpy(out->uid, uid, sizeof(uid));
    memcpy(out->gid, gid, sizeof(gid));
    return PT_OK;
}

/* Fields after the comm: field n is token n - 3 after the last ')'. */
#define TASK_FLAGS_FIELD 9
#define CPU_FIRST_FIELD 14   /* utime; 15 stime, 16 cutime, 17 cstime */
#define BLKIO_FIELD     42

int
pt_parse_stat_cpu(const char *buf, size_t len, pt_extra *out)
{
    const char *paren = NULL;
    int64_t cpu[5] = {0, 0, 0, 0, 0}, task_flags = 0;
    size_t pos;
    int field, have_blkio = 0;
    char state;

    for (size_t i = len; i > 0; i--) {
        if (buf[i - 1] == ')') {
            paren = buf + i - 1;
            break;
        }
    }
    if (paren == NULL)
        return PT_ESHORT;
    pos = (size_t)(paren - buf) + 1;
    /* " S " */
    if (pos + 2 >= len || buf[pos] != ' ' || buf[pos + 2] != ' ')
        return PT_ESHORT;
    state = buf[pos + 1];
    pos += 2;
    for (field = 4; field <= BLKIO_FIELD; field++) {
        size_t start;
        if (pos >= len || buf[pos] == '\n')
            break;
        if (buf[pos] != ' ')
            return PT_EFIELD;
        pos++;
        start = pos;
        if (pos < len && buf[pos] == '-')
            pos++;
        while (pos < len && buf[pos] != ' ' && buf[pos] != '\n')
            pos++;
        if (pos == start)
            return PT_EFIELD;
        if ((field >= CPU_FIRST_FIELD && field < CPU_FIRST_FIELD + 4) || field == BLKIO_FIELD
            || field == TASK_FLAGS_FIELD) {
            size_t p = start;
            int64_t v;
            if (parse_u64(buf, pos, &p, &v) != 0 || p != pos)
                return PT_EFIELD;
            if (field == TASK_FLAGS_FIELD) {
                task_flags = v;
            } else if (field == BLKIO_FIELD) {
                cpu[4] = v;
                have_blkio = 1;
            } else {
                cpu[field - CPU_FIRST_FIELD] = v;
            }
        }
    }
    if (field <= CPU_FIRST_FIELD + 3)
        return PT_ESHORT;
    memcpy(out->cpu, cpu, sizeof(cpu));
    out->task_flags = task_flags;
    if (have_blkio)
        out->flags |= PT_X_HAVE_BLKIO;
    else
        out->flags &= ~(int64_t)PT_X_HAVE_BLKIO;
    if (state == 'Z')
        out->flags |= PT_X_ZOMBIE;
    else
        out->flags &= ~(int64_t)PT_X_ZOMBIE;
    return PT_OK;
}

int
pt_parse_statm_all(const char *buf, size_t len, pt_extra *out)
{
    int64_t vals[7];
    size_t pos = 0;

    for (int k = 0; k < 7; k++) {
        if (k > 0) {
            if (pos >= len || buf[pos] != ' ')
                return PT_ESHORT;
            pos++;
        }
        if (pos >= len)
            return PT_ESHORT;
        if (parse_u64(buf, len, &pos, &vals[k]) != 0)
            return PT_EFIELD;
    }
    if (pos < len && buf[pos] != '\n' && buf[pos] != ' ')
        return PT_EFIELD;
    memcpy(out->statm, vals, sizeof(vals));
    return PT_OK;
}

/* ---- the reader (Linux) ----------------------------------------------------- */

#ifdef __linux__

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pt_internal.h"

#define STAT_LINE 2048
#define STATUS_BUF 8192     /* status is ~1.5 KiB; Uid/Gid come in its first lines */

/* One read of fd into buf (EINTR retried). Returns bytes (>= 0) or -1. */
static ssize_t
read_some(int fd, char *buf, size_t size)
{
    ssize_t n;

    do {
        n = read(fd, buf, size);
    } while (n < 0 && errno == EINTR);
    return n;
}

/* Read all of fd into buf[0..size); returns the length, or -1 with errno
 * (E2BIG when it does not fit). A short read is the end: these /proc files
 * (single-record seq files, and cmdline) hand over everything that fits in one
 * read, which saves the read that would return 0. */
static ssize_t
read_all(int fd, char *buf, size_t size)
{
    size_t have = 0;

    for (;;) {
        ssize_t n = read_some(fd, buf + have, size - have);
        if (n < 0)
            return -1;
        if (n == 0 || (size_t)n < size - have)
            return (ssize_t)(have + (size_t)n);
        have += (size_t)n;
        if (have == size) {
            char probe;
            n = read_some(fd, &probe, 1);
            if (n == 0)
                return (ssize_t)have;
            errno = n < 0 ? errno : E2BIG;
            return -1;
        }
    }
}

/* "<pid>/<leaf>" (leaf NULL: "<pid>") relative to procfd, or "/proc/<pid>/<leaf>"
 * where procfd is AT_FDCWD (pt_read_one: no fd of /proc to open and close). */
static void
xpath(int procfd, char *out, long pid, const char *leaf)
{
    if (procfd == AT_FDCWD) {
        memcpy(out, "/proc/", 6);
        pt_pid_path(out + 6, pid, leaf);
    } else {
        pt_pid_path(out, pid, leaf);
    }
}

/* Open "<pid>/<leaf>" and read it whole into buf. Returns the length or -1
 * with errno (ENOENT mapped to ESRCH: the directory is gone). */
static ssize_t
slurp(int procfd, long pid, const char *leaf, char *buf, size_t size)
{
    char path[48];
    ssize_t n;
    int fd, saved;

    xpath(procfd, path, pid, leaf);
    fd = openat(procfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return -1;
    n = read_all(fd, buf, size);
    saved = errno;
    close(fd);
    errno = saved;
    return n;
}

/* Row marks in pt_extra.flags while a scan runs (compact() removes them). */
#define X_DENIED   (1 << 20)    /* this caller may not read it: a denied entry */

struct xjob {
    int procfd;
    pt_extra *rows;
    pt_proc *procs;         /* pt_scan_extra: the table rows, beside rows[] */
    int by_pidfd;           /* x_by_pidfd, not x_one (the BPF road's rest) */
    int single;             /* pt_read_one: procs[0] is the row, checked as pt_read_extra's */
    size_t n;
    char *arena;
    size_t arena_cap;
    /* shared, through __atomic builtins */
    size_t cursor;
    size_t arena_used;
    int err;                /* first error that fails the call, 0 if none */
    long err_pid;
};

static void
xjob_fail(struct xjob *job, int err, long pid)
{
    int none = 0;

    if (__atomic_compare_exchange_n(&job->err, &none, err, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST))
        __atomic_store_n(&job->err_pid, pid, __ATOMIC_SEQ_CST);
}

/* Place len bytes in the arena; returns the offset, or -1 when they do not
 * fit (the bytes are counted either way). */
static long
arena_put(struct xjob *job, const char *src, size_t len)
{
    size_t off = __atomic_fetch_add(&job->arena_used, len, __ATOMIC_RELAXED);

    if (off + len > job->arena_cap)
        return -1;
    memcpy(job->arena + off, src, len);
    return (long)off;
}

/* errno of a failed read of a process's file: EACCES for every denial. */
static int
file_err(int err)
{
    return (err == EPERM) ? EACCES : err;
}

static int
is_gone(int err)
{
    return err == ENOENT || err == ESRCH;
}

/* cmdline of x into the arena (PT_X_HAVE_CMDLINE), or err_cmdline, or
 * PT_X_TRUNCATED. */
static void
read_cmdline(struct xjob *job, pt_extra *x, char *blob)
{
    ssize_t n = slurp(job->procfd, (long)x->pid, "cmdline", blob, PT_X_BLOB_MAX);
    long off;

    if (n < 0 && errno == E2BIG) {
        x->flags |= PT_X_TRUNCATED;
    } else if (n < 0) {
        x->err_cmdline = file_err(errno);
    } else {
        off = arena_put(job, blob, (size_t)n);
        x->cmdline_off = off < 0 ? 0 : off;
        x->cmdline_len = n;
        x->flags |= PT_X_HAVE_CMDLINE;
    }
}

/* The entries of x's fd/ directory into x->nfds, or err_fds. */
static void
count_fds(int procfd, pt_extra *x)
{
    char path[48], dents[4096];
    int64_t count = 0;
    int dfd;

    xpath(procfd, path, (long)x->pid, "fd");
    dfd = openat(procfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        x->err_fds = file_err(errno);
        return;
    }
    for (;;) {
        long nread = syscall(SYS_getdents64, dfd, dents, sizeof(dents));
        if (nread < 0) {
            if (errno == EINTR)
                continue;
            x->err_fds = file_err(errno);
            break;
        }
        if (nread == 0)
            break;
        for (long off = 0; off < nread;) {
            const char *name = dents + off + 19;    /* d_name of a linux_dirent64 */
            unsigned short reclen;
            memcpy(&reclen, dents + off + 16, sizeof(reclen));
            off += reclen;
            if (!(name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0))))
                count++;
        }
    }
    close(dfd);
    if (x->err_fds == 0)
        x->nfds = count;
}

#define PF_KTHREAD 0x00200000   /* stat field 9: a kernel thread */

/* The files of x->want, read after the stat fd was opened (see the top). */
static void
read_wanted(struct xjob *job, pt_extra *x, char *blob)
{
    char path[48];
    long pid = (long)x->pid, off;
    int want = (int)x->want;
    ssize_t n;

    if (want & PT_X_STATUS) {
        n = slurp(job->procfd, pid, "status", blob, STATUS_BUF);
        if (n < 0)
            x->err_status = file_err(errno);
        else if (pt_parse_status_ids(blob, (size_t)n, x) != PT_OK)
            x->err_status = EBADMSG;
    }
    if (want & PT_X_STATM) {
        n = slurp(job->procfd, pid, "statm", blob, 256);
        if (n < 0)
            x->err_statm = file_err(errno);
        else if (pt_parse_statm_all(blob, (size_t)n, x) != PT_OK)
            x->err_statm = EBADMSG;
    }
    if (want & PT_X_CMDLINE)
        read_cmdline(job, x, blob);
    if (want & PT_X_EXE) {
        xpath(job->procfd, path, pid, "exe");
        n = readlinkat(job->procfd, path, blob, PT_X_BLOB_MAX);
        if (n < 0) {
            x->err_exe = file_err(errno);
        } else if (n == PT_X_BLOB_MAX) {
            x->err_exe = ENAMETOOLONG;  /* not seen: the kernel prints at most a page */
        } else {
            off = arena_put(job, blob, (size_t)n);
            x->exe_off = off < 0 ? 0 : off;
            x->exe_len = n;
        }
    }
    if (want & PT_X_CWD) {
        xpath(job->procfd, path, pid, "cwd");
        n = readlinkat(job->procfd, path, blob, PT_X_BLOB_MAX);
        if (n < 0) {
            x->err_cwd = file_err(errno);
        } else if (n == PT_X_BLOB_MAX) {
            x->err_cwd = ENAMETOOLONG;
        } else {
            off = arena_put(job, blob, (size_t)n);
            x->cwd_off = off < 0 ? 0 : off;
            x->cwd_len = n;
        }
    }
    if (want & PT_X_ENVIRON) {
        n = slurp(job->procfd, pid, "environ", blob, PT_X_BLOB_MAX);
        if (n < 0 && errno == E2BIG) {
            x->flags |= PT_X_ENV_TRUNCATED;
        } else if (n < 0) {
            x->err_environ = file_err(errno);
        } else {
            off = arena_put(job, blob, (size_t)n);
            x->env_off = off < 0 ? 0 : off;
            x->env_len = n;
        }
    }
    if (want & PT_X_FDS)
        count_fds(job->procfd, x);
    if (want & PT_X_NICE) {
        int prio;
        errno = 0;
        prio = getpriority(PRIO_PROCESS, (id_t)pid);
        if (prio == -1 && errno != 0)
            x->err_nice = errno;
        else
            x->nice = prio;
    }
}

static void
clear_out(pt_extra *x)
{
    x->flags = 0;
    x->task_flags = 0;
    x->pidfs_ino = 0;
    memset(x->uid, 0, sizeof(x->uid));
    memset(x->gid, 0, sizeof(x->gid));
    memset(x->cpu, 0, sizeof(x->cpu));
    memset(x->statm, 0, sizeof(x->statm));
    x->cmdline_off = x->cmdline_len = x->exe_off = x->exe_len = 0;
    x->err_stat = x->err_status = x->err_statm = x->err_cmdline = x->err_exe = 0;
    x->cwd_off = x->cwd_len = x->env_off = x->env_len = x->nfds = x->nice = 0;
    x->err_cwd = x->err_environ = x->err_fds = x->err_nice = 0;
    x->dir_ino = 0;
}

/* Read the stat fd (from offset 0 when again) into line; -1 with errno. */
static ssize_t
read_stat(int fd, char *line, size_t size, int again)
{
    ssize_t n;

    do {
        n = again ? pread(fd, line, size, 0) : read(fd, line, size);
    } while (n < 0 && errno == EINTR);
    if (n == 0) {
        errno = ESRCH;
        return -1;
    }
    return n;
}

/* One process of job: rows[i] (and, for a scan, procs[i]). */
static void
x_one(struct xjob *job, size_t i, char *blob)
{
    char path[48], line[STAT_LINE];
    pt_extra *x = &job->rows[i];
    pt_proc tmp, *row = job->procs != NULL ? &job->procs[i] : &tmp;
    long pid = (long)x->pid;
    int statfd, attempt;
    int64_t uid = -1;
    ssize_t n;
    struct stat st;

    clear_out(x);
    xpath(job->procfd, path, pid, "stat");
    statfd = openat(job->procfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (statfd < 0) {
        int err = errno;
        if (is_gone(err)) {
            x->flags |= PT_X_GONE;
        } else if (err == EACCES || err == EPERM) {
            /* hidepid=1, an LSM: nothing of it can be read (its owner maybe) */
            x->err_stat = EACCES;
            if (job->procs != NULL && !job->single) {
                x->flags |= X_DENIED;
                pt_pid_path(path, pid, NULL);
                x->uid[1] = fstatat(job->procfd, path, &st, 0) == 0 ? (int64_t)st.st_uid : -1;
            }
        } else {
            xjob_fail(job, err, pid);
        }
        return;
    }
    read_wanted(job, x, blob);
    if (job->procs != NULL && !job->single) {
        /* The uid a snapshot gives: the owner of /proc/<pid>, which the kernel
         * sets to the task's effective uid, also for a non-dumpable process
         * (task_dump_owner() keeps it for the directory). The status file read
         * above prints that same cred->euid: use it, one lookup less. */
        if ((x->want & PT_X_STATUS) && x->err_status == 0) {
            uid = x->uid[1];
        } else {
            pt_pid_path(path, pid, NULL);
            if (fstatat(job->procfd, path, &st, 0) == 0)
                uid = (int64_t)st.st_uid;
        }
    }
    /* Last: the proof that everything above was of this process. */
    for (attempt = 0;; attempt++) {
        n = read_stat(statfd, line, sizeof(line), attempt > 0);
        if (n < 0) {
            if (!is_gone(errno))
                xjob_fail(job, file_err(errno), pid);
            x->flags |= PT_X_GONE;
            close(statfd);
            return;
        }
        if (pt_parse_stat(line, (size_t)n, row) == PT_OK && row->pid == pid
            && pt_parse_stat_cpu(line, (size_t)n, x) == PT_OK)
            break;
        if (row->state == 'X' || attempt == 1) {
            /* A task being released (state X) prints -1s: gone. A line that
             * fails twice otherwise is reported, as pt_scan does. */
            if (row->state != 'X' && job->procs != NULL)
                xjob_fail(job, EBADMSG, pid);
            x->flags |= PT_X_GONE;
            close(statfd);
            return;
        }
    }
    if ((x->want & PT_X_CMDLINE_LONG) && !(x->want & PT_X_CMDLINE) && row->comm_len >= 15
        && !(x->task_flags & PF_KTHREAD) && row->state != 'Z' && row->state != 'X') {
        /* psutil's name rule wants argv[0] of a truncated comm: read it now, and
         * the stat line once more for the proof */
        read_cmdline(job, x, blob);
        n = read_stat(statfd, line, sizeof(line), 1);
        if (n < 0 || pt_parse_stat(line, (size_t)n, &tmp) != PT_OK || tmp.pid != pid
            || tmp.start_time != row->start_time) {
            x->flags |= PT_X_GONE;
            close(statfd);
            return;
        }
    }
    close(statfd);
    if (job->procs == NULL || job->single) {
        if (x->start_time >= 0 && row->start_time != x->start_time)
            x->flags |= PT_X_GONE;  /* the pid names another process now */
        else if (row->flags & PT_F_THREAD)
            x->flags |= PT_X_GONE;  /* a thread id, not a process */
        return;
    }
    if (row->flags & PT_F_THREAD) {
        x->flags |= PT_X_GONE;      /* a thread id, not a process */
        return;
    }
    x->start_time = row->start_time;
    if (uid >= 0) {
        row->uid = uid;
        row->flags |= PT_F_HAVE_UID;
    }
    if ((x->want & PT_X_STATM) && x->err_statm == 0) {
        /* statm was read for this process: the row's memory, as a snapshot's */
        row->vms = x->statm[0];
        row->rss = x->statm[1];
        row->flags |= PT_F_HAVE_MEM;
    }
    if (row->state == 'Z') {
        /* A zombie's exit status and its masking: exactly the snapshot's row. */
        if (pt_read((int)pid, (x->want & PT_X_STATM) ? PT_WANT_MEM : 0, &tmp) == 0) {
            if (tmp.start_time == row->start_time)
                *row = tmp;
            else
                x->flags |= PT_X_GONE;      /* reaped, and the pid reused already */
        } else if (errno == ESRCH) {
            x->flags |= PT_X_GONE;
        } else {
            row->flags &= ~PT_F_HAVE_EXIT;  /* unknown, never "exit 0" */
        }
    }
}

/* Row marks of the BPF road's rest pass (scan_extra_rest clears them). */
#define X_REDO     (1 << 22)    /* not proven by its pidfd: read it whole from /proc */

/* Do the files read for x say its task has no memory map any more (an empty
 * command line, no exe, statm all zeros)? Then its leader exited, or it is
 * inside its exit, since the BPF pass saw one: the row's state is stale. */
static int
lost_mm(const pt_extra *x)
{
    int64_t want = x->want, sum = 0;

    if ((want & PT_X_CMDLINE) && x->err_cmdline == 0 && (x->flags & PT_X_HAVE_CMDLINE)
        && x->cmdline_len == 0)
        return 1;
    if ((want & PT_X_EXE) && x->err_exe == ENOENT)
        return 1;
    if ((want & PT_X_STATM) && x->err_statm == 0) {
        for (int k = 0; k < 7; k++)
            sum |= x->statm[k];
        if (sum == 0)
            return 1;
    }
    return 0;
}

/* The BPF road's rest of one process, rows[i] of a job: x->pidfs_ino (in) is
 * its identity from the BPF record, PT_X_ZOMBIE and PT_X_HAD_MM (in) what the
 * record said of it. A pidfd of the pid with that inode proves the pid still
 * names that process; the wanted files are read by path; then, for a live
 * process, a pidfd that is still not readable proves the group has not exited
 * (so the pid named it throughout), and files that still show the memory map
 * the record saw prove its leader has not exited either (a pidfd turns
 * readable only when the whole group has): the row's state still holds. For a
 * zombie, a signal 0 through the pidfd proves it has not been reaped. A pid
 * that another process holds now is PT_X_GONE; anything unproven (exited
 * meanwhile, no pidfd here, any error) is X_REDO: read whole. */
static void
x_by_pidfd(struct xjob *job, size_t i, char *blob)
{
    pt_extra *x = &job->rows[i];
    int64_t ino = x->pidfs_ino;
    int zombie = (x->flags & PT_X_ZOMBIE) != 0, had_mm = (x->flags & PT_X_HAD_MM) != 0;
    int pfd, redo = 0;
    struct stat st;

    clear_out(x);
    x->pidfs_ino = ino;
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
    pfd = (int)syscall(SYS_pidfd_open, (pid_t)x->pid, 0);
    if (pfd < 0) {
        /* Gone (ESRCH), seccomp, EMFILE: the whole road decides, and finds out
         * for itself whether a process holds the pid. */
        x->flags |= X_REDO;
        return;
    }
    if (fstat(pfd, &st) != 0) {
        redo = 1;
    } else if (st.st_ino != (ino_t)ino) {
        /* (ino_t: where it is 32 bits wide, pidfs gives the low half) */
        x->flags |= PT_X_GONE;      /* another process has the pid now */
        close(pfd);
        return;
    } else {
        read_wanted(job, x, blob);
        if (zombie) {
            /* Only a signal that reaches it is proof (EPERM could be a filter). */
            redo = syscall(SYS_pidfd_send_signal, pfd, 0, NULL, 0) != 0;
        } else {
            struct pollfd pf = {pfd, POLLIN, 0};
            int n;
            do {
                n = poll(&pf, 1, 0);
            } while (n < 0 && errno == EINTR);
            redo = n != 0 || (had_mm && lost_mm(x));   /* exited meanwhile, or poll failed */
        }
    }
    close(pfd);
#else
    redo = 1;
#endif
    if (redo) {
        clear_out(x);
        x->flags |= X_REDO;
    } else if (zombie) {
        x->flags |= PT_X_ZOMBIE;
    }
}

#define XCHUNK 16

static void *
xworker(void *arg)
{
    struct xjob *job = arg;
    char blob[PT_X_BLOB_MAX];   /* this thread's scratch (64 KiB of stack) */

    for (;;) {
        size_t start, end;
        if (__atomic_load_n(&job->err, __ATOMIC_RELAXED) != 0)
            break;
        start = __atomic_fetch_add(&job->cursor, XCHUNK, __ATOMIC_RELAXED);
        if (start >= job->n)
            break;
        end = start + XCHUNK < job->n ? start + XCHUNK : job->n;
        for (size_t i = start; i < end; i++) {
            if (job->by_pidfd)
                x_by_pidfd(job, i, blob);
            else
                x_one(job, i, blob);
        }
    }
    return NULL;
}

/* Run job over up to nthreads threads (0: pt_scan_threads decides), this one
 * included. A process's extra reads cost several times a stat read (status
 * alone costs more than the stat line; measured on a 2-vCPU VM: stat 6.3 us,
 * status 9.0, statm 4.1, cmdline 3.1, exe 1.9), so the thread count is asked
 * for XWEIGHT times the pids: a second thread pays from a few dozen processes. */
#define XWEIGHT 8
static void
xjob_run(struct xjob *job, int nthreads)
{
    pthread_t tids[PT_THREADS_MAX];
    pthread_attr_t attr;
    sigset_t all, old;
    int threads, started = 0, have_attr;

    threads = pt_scan_threads(job->n * XWEIGHT, nthreads);
    if ((size_t)threads > (job->n + XCHUNK - 1) / XCHUNK)
        threads = (int)((job->n + XCHUNK - 1) / XCHUNK);
    if (threads > 1) {
        /* Room for the 64 KiB scratch whatever the default stack size. */
        have_attr = pthread_attr_init(&attr) == 0;
        if (have_attr)
            (void)pthread_attr_setstacksize(&attr, 256 * 1024);
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);   /* signals stay with the caller */
        for (int t = 1; t < threads && t < PT_THREADS_MAX; t++) {
            if (pthread_create(&tids[started], have_attr ? &attr : NULL, xworker, job) != 0)
                break;
            started++;
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (have_attr)
            pthread_attr_destroy(&attr);
    }
    xworker(job);
    for (int t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
}

long
pt_read_extra(pt_extra *rows, size_t n, char *arena, size_t arena_cap,
              size_t *arena_used, int nthreads)
{
    struct xjob job;

    *arena_used = 0;
    memset(&job, 0, sizeof(job));
    job.procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (job.procfd < 0)
        return -1;
    job.rows = rows;
    job.n = n;
    job.arena = arena;
    job.arena_cap = arena_cap;
    xjob_run(&job, nthreads);
    close(job.procfd);
    *arena_used = job.arena_used;
    if (job.err != 0) {
        errno = job.err;
        return -1;
    }
    if (job.arena_used > arena_cap) {
        errno = ENOSPC;
        return -1;
    }
    return (long)n;
}

int
pt_read_one(pt_extra *x, pt_proc *row, char *arena, size_t arena_cap, size_t *arena_used)
{
    struct xjob job;
    struct stat st;
    char *blob, path[48];
    int64_t pidfs_ino = 0, dir_ino = 0;
    int pfd = -1, ended = 0;

    *arena_used = 0;
    memset(&job, 0, sizeof(job));
    job.procfd = AT_FDCWD;
    job.rows = x;
    job.procs = row;
    job.single = 1;
    job.n = 1;
    job.arena = arena;
    job.arena_cap = arena_cap;
    if (x->want & PT_X_PIN) {
#ifdef SYS_pidfd_open
        pfd = (int)syscall(SYS_pidfd_open, (pid_t)x->pid, 0);
        if (pfd < 0 && (errno == ESRCH || errno == ENOENT || errno == EINVAL)) {
            clear_out(x);           /* no process holds the pid (a thread id holds none) */
            x->flags = PT_X_GONE;
            return 0;
        }
        /* else EPERM or ENOSYS (a filter), EMFILE: no pidfd, no handle */
        if (pfd >= 0 && fstat(pfd, &st) == 0)
            pidfs_ino = (int64_t)st.st_ino;
#endif
        xpath(AT_FDCWD, path, (long)x->pid, NULL);
        if (stat(path, &st) == 0)
            dir_ino = (int64_t)st.st_ino;
    }
    /* Heap, not stack, for the 64 KiB scratch: this runs on the caller's thread,
     * whose stack may be small (threading.stack_size). */
    blob = malloc(PT_X_BLOB_MAX);
    if (blob == NULL) {
        if (pfd >= 0)
            close(pfd);
        return -1;
    }
    x_one(&job, 0, blob);
    free(blob);
    if (pfd >= 0) {
        struct pollfd pf = {pfd, POLLIN, 0};
        int n;
        do {
            n = poll(&pf, 1, 0);
        } while (n < 0 && errno == EINTR);
        ended = n > 0;
        close(pfd);
    }
    if (x->want & PT_X_PIN) {
        x->pidfs_ino = pidfs_ino;
        x->dir_ino = dir_ino;
        if (ended)
            x->flags |= PT_X_PIDFD_ENDED;
    }
    if (x->want & PT_X_DIR) {
        xpath(AT_FDCWD, path, (long)x->pid, NULL);
        x->dir_ino = stat(path, &st) == 0 ? (int64_t)st.st_ino : 0;
    }
    *arena_used = job.arena_used;
    if (job.err != 0) {
        errno = job.err;
        return -1;
    }
    if (job.arena_used > arena_cap) {
        errno = ENOSPC;
        return -1;
    }
    return 0;
}

/* ---- the one-pass table with extras ------------------------------------------ */

#define DENTS_BUF (32 * 1024)

struct dirent64_hdr {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static int
cmp_extra_pid(const void *a, const void *b)
{
    int64_t x = ((const pt_extra *)a)->pid, y = ((const pt_extra *)b)->pid;
    return (x > y) - (x < y);
}

/* The pids of /proc into out[0..cap).pid; returns how many there are (which
 * may exceed cap: only the first cap are stored), or -1 with errno. */
static long
list_pids(int procfd, pt_extra *out, size_t cap)
{
    char dents[DENTS_BUF];
    size_t count = 0;
    int sorted = 1;

    for (;;) {
        long nread = syscall(SYS_getdents64, procfd, dents, sizeof(dents));
        if (nread < 0)
            return -1;
        if (nread == 0)
            break;
        for (long off = 0; off < nread;) {
            struct dirent64_hdr *d = (struct dirent64_hdr *)(dents + off);
            long pid = pt_name_to_pid(d->d_name);
            off += d->d_reclen;
            if (pid <= 0)
                continue;
            if (count < cap) {
                out[count].pid = pid;
                if (count > 0 && out[count - 1].pid > pid)
                    sorted = 0;
            }
            count++;
        }
    }
    if (!sorted && count <= cap)
        qsort(out, count, sizeof(*out), cmp_extra_pid);
    return (long)count;
}

/* The files of x that a BPF row (PT_X_BPF_ROW) still needs from /proc: the
 * records carry stat's and status's part, not statm, cmdline or exe; psutil's
 * name rule wants the cmdline of a comm cut at 15 bytes (as x_one decides). */
static int
bpf_row_rest(const pt_proc *row, const pt_extra *x, int want)
{
    int rest = want & (PT_X_STATM | PT_X_CMDLINE | PT_X_EXE);

    if ((want & PT_X_CMDLINE_LONG) && !(want & PT_X_CMDLINE) && row->comm_len >= 15
        && !(x->task_flags & PF_KTHREAD) && row->state != 'Z' && row->state != 'X')
        rest |= PT_X_CMDLINE;
    return rest;
}

/* Take the /proc part t of a BPF row's extra x (and its row). */
static void
merge_rest(pt_extra *x, pt_proc *row, const pt_extra *t)
{
    if (t->want & PT_X_STATM) {
        memcpy(x->statm, t->statm, sizeof(x->statm));
        x->err_statm = t->err_statm;
        if (x->err_statm == 0) {
            row->vms = x->statm[0];
            row->rss = x->statm[1];
            row->flags |= PT_F_HAVE_MEM;
        }
    }
    if (t->want & PT_X_CMDLINE) {
        x->cmdline_off = t->cmdline_off;
        x->cmdline_len = t->cmdline_len;
        x->err_cmdline = t->err_cmdline;
        x->flags |= t->flags & (PT_X_HAVE_CMDLINE | PT_X_TRUNCATED);
    }
    if (t->want & PT_X_EXE) {
        x->exe_off = t->exe_off;
        x->exe_len = t->exe_len;
        x->err_exe = t->err_exe;
    }
}

/* Run one job over todo[0..k) (procs: the whole road's rows, else NULL for
 * the pidfd road), its blobs placed after *arena_used. Returns 0, or the
 * errno that fails the call. */
static int
run_rest(pt_extra *todo, pt_proc *procs, size_t k, int by_pidfd, char *arena,
         size_t arena_cap, size_t *arena_used, int nthreads)
{
    struct xjob job;

    if (k == 0)
        return 0;
    memset(&job, 0, sizeof(job));
    job.procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (job.procfd < 0)
        return errno;
    job.rows = todo;
    job.procs = procs;
    job.by_pidfd = by_pidfd;
    job.n = k;
    job.arena = arena;
    job.arena_cap = arena_cap;
    job.arena_used = *arena_used;
    xjob_run(&job, nthreads);
    close(job.procfd);
    *arena_used = job.arena_used;
    return job.err;
}

/* Queue extra[i] for a rest pass: todo[*k], cleared, with its pid and want. */
static pt_extra *
queue(pt_extra *todo, size_t *at, size_t *k, size_t i, int64_t pid, int want)
{
    pt_extra *t = &todo[*k];

    memset(t, 0, sizeof(*t));
    t->pid = pid;
    t->want = want;
    at[(*k)++] = i;
    return t;
}

static int
cmp_denied(const void *a, const void *b)
{
    int64_t x = ((const pt_denied *)a)->pid, y = ((const pt_denied *)b)->pid;
    return (x > y) - (x < y);
}

/* pt_scan_extra once pt_bpf_scan made rows[0..n) and extra[0..n): read from
 * /proc what the records lack. A BPF row's rest (bpf_row_rest) is proven of
 * its process through a pidfd and the record's pidfs inode (x_by_pidfd); a row
 * that cannot be proven so (no inode, no pidfd here, or it exited meanwhile),
 * and a row the BPF pass read through /proc itself, is read whole as the
 * /proc road reads it (x_one: the row from its own stat fd, every wanted file
 * after it). Then the rows gone meanwhile are dropped, and the denied ones
 * listed in info. */
static long
scan_extra_rest(pt_proc *rows, pt_extra *extra, size_t n, int want, char *arena,
                size_t arena_cap, size_t *arena_used, int nthreads, pt_scaninfo *info)
{
    pt_extra *todo = NULL;
    pt_proc *whole = NULL;
    size_t *at = NULL, k = 0, w = 0, out = 0, ndenied = info->ndenied;
    int err = 0;

    *arena_used = 0;
    if (n > 0) {
        todo = malloc(n * sizeof(*todo));
        whole = malloc(n * sizeof(*whole));
        at = malloc(n * sizeof(*at));
        if (todo == NULL || whole == NULL || at == NULL) {
            err = ENOMEM;
            goto done;
        }
    }
    /* The pidfd road: todo[0..k), for extra[at[j]]. */
    for (size_t i = 0; i < n; i++) {
        pt_extra *t;
        int rest;
        if (!(extra[i].flags & PT_X_BPF_ROW))
            continue;
        rest = bpf_row_rest(&rows[i], &extra[i], want);
        if (rest == 0)
            continue;
        if (extra[i].pidfs_ino == 0) {
            extra[i].flags |= X_REDO;
            continue;
        }
        t = queue(todo, at, &k, i, extra[i].pid, rest);
        t->start_time = extra[i].start_time;
        t->pidfs_ino = extra[i].pidfs_ino;
        t->flags = (rows[i].state == 'Z' ? PT_X_ZOMBIE : 0) | (extra[i].flags & PT_X_HAD_MM);
    }
    err = run_rest(todo, NULL, k, 1, arena, arena_cap, arena_used, nthreads);
    if (err != 0)
        goto done;
    for (size_t j = 0; j < k; j++) {
        pt_extra *x = &extra[at[j]];
        if (todo[j].flags & PT_X_GONE)
            x->flags |= PT_X_GONE;
        else if (todo[j].flags & X_REDO)
            x->flags |= X_REDO;
        else
            merge_rest(x, &rows[at[j]], &todo[j]);
    }
    /* The whole road: todo[0..w) and whole[0..w), for extra[at[j]]. */
    for (size_t i = 0; i < n; i++) {
        if ((extra[i].flags & PT_X_BPF_ROW) && !(extra[i].flags & X_REDO))
            continue;
        queue(todo, at, &w, i, extra[i].pid, want)->start_time = -1;
    }
    err = run_rest(todo, whole, w, 0, arena, arena_cap, arena_used, nthreads);
    if (err != 0)
        goto done;
    for (size_t j = 0; j < w; j++) {
        extra[at[j]] = todo[j];
        rows[at[j]] = whole[j];
    }
    if (*arena_used > arena_cap) {
        err = ENOSPC;
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        pt_extra *x = &extra[i];
        if (x->flags & X_DENIED) {
            if (info->denied != NULL && ndenied < info->denied_cap) {
                info->denied[ndenied].pid = x->pid;
                info->denied[ndenied].uid = x->uid[1];
            }
            ndenied++;
            continue;
        }
        if (x->flags & PT_X_GONE)
            continue;
        x->flags &= ~(int64_t)(PT_X_BPF_ROW | PT_X_HAD_MM | X_REDO);
        x->want = want;
        if (out != i) {
            extra[out] = *x;
            rows[out] = rows[i];
        }
        out++;
    }
    if (ndenied != info->ndenied && info->denied != NULL) {
        size_t stored = ndenied < info->denied_cap ? ndenied : info->denied_cap;
        qsort(info->denied, stored, sizeof(*info->denied), cmp_denied);
    }
    info->ndenied = ndenied;

done:
    free(todo);
    free(whole);
    free(at);
    if (err != 0) {
        errno = err;
        return -1;
    }
    return (long)out;
}

static long
scan_extra(pt_proc *rows, pt_extra *extra, size_t cap, int want, char *arena,
           size_t arena_cap, size_t *arena_used, int nthreads, pt_scaninfo *info)
{
    struct xjob job;
    long listed;
    size_t out = 0;
    int saved;

    info->ndenied = 0;
    info->needed = 0;
    info->bad_pid = 0;
    info->threads = 1;
    info->reader = PT_READER_PROC;
    *arena_used = 0;
    if (!(want & PT_X_PROCFS)) {
        /* The row's memory (PT_WANT_MEM) is not asked of it: statm, where wanted,
         * is read from /proc for all seven fields and becomes the row's. */
        long n = pt_bpf_scan(rows, cap, (want & PT_X_BPF) ? PT_WANT_BPF : 0, info, extra);
        want &= ~PT_X_BPF;
        if (n >= 0)
            return scan_extra_rest(rows, extra, (size_t)n, want, arena, arena_cap,
                                   arena_used, nthreads, info);
        if (n != PT_BPF_DECLINED)
            return -1;
        info->reader = PT_READER_PROC;
    }
    want &= ~(PT_X_PROCFS | PT_X_BPF);
    memset(&job, 0, sizeof(job));
    job.procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (job.procfd < 0)
        return -1;
    listed = list_pids(job.procfd, extra, cap);
    if (listed < 0 || (size_t)listed > cap) {
        saved = listed < 0 ? errno : ENOSPC;
        if (listed >= 0)
            info->needed = (size_t)listed;
        close(job.procfd);
        errno = saved;
        return -1;
    }
    for (long i = 0; i < listed; i++) {
        extra[i].want = want;
        extra[i].start_time = -1;
    }
    job.rows = extra;
    job.procs = rows;
    job.n = (size_t)listed;
    job.arena = arena;
    job.arena_cap = arena_cap;
    xjob_run(&job, nthreads);
    close(job.procfd);
    *arena_used = job.arena_used;
    if (job.err != 0) {
        if (job.err == EBADMSG)
            info->bad_pid = job.err_pid;
        errno = job.err;
        return -1;
    }
    if (job.arena_used > arena_cap) {
        errno = ENOSPC;
        return -1;
    }
    for (size_t i = 0; i < job.n; i++) {
        pt_extra *x = &extra[i];
        if (x->flags & X_DENIED) {
            if (info->denied != NULL && info->ndenied < info->denied_cap) {
                info->denied[info->ndenied].pid = x->pid;
                info->denied[info->ndenied].uid = x->uid[1];
            }
            info->ndenied++;
            continue;
        }
        if (x->flags & PT_X_GONE)
            continue;
        if (out != i) {
            extra[out] = *x;
            rows[out] = rows[i];
        }
        out++;
    }
    return (long)out;
}

long
pt_scan_extra(pt_proc *rows, pt_extra *extra, size_t cap, int want, char *arena,
              size_t arena_cap, size_t *arena_used, int nthreads, pt_scaninfo *info)
{
    long n = scan_extra(rows, extra, cap, want, arena, arena_cap, arena_used, nthreads, info);

    if (!(want & (PT_X_PROCFS | PT_X_BPF)))
        pt_bpf_auto_read_done(n);
    return n;
}

/* ---- the pid list ------------------------------------------------------------- */

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

long
pt_list_pids(int64_t *pids, size_t cap)
{
    char dents[DENTS_BUF];
    size_t count = 0;
    int procfd, sorted = 1, saved;

    procfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (procfd < 0)
        return -1;
    for (;;) {
        long nread = syscall(SYS_getdents64, procfd, dents, sizeof(dents));
        if (nread < 0) {
            if (errno == EINTR)
                continue;
            saved = errno;
            close(procfd);
            errno = saved;
            return -1;
        }
        if (nread == 0)
            break;
        for (long off = 0; off < nread;) {
            struct dirent64_hdr *d = (struct dirent64_hdr *)(dents + off);
            long pid = pt_name_to_pid(d->d_name);
            off += d->d_reclen;
            if (pid <= 0)
                continue;
            if (count < cap) {
                pids[count] = pid;
                if (count > 0 && pids[count - 1] > pid)
                    sorted = 0;
            }
            count++;
        }
    }
    close(procfd);
    if (!sorted && count <= cap)
        qsort(pids, count, sizeof(*pids), cmp_i64);
    return (long)count;
}

int
pt_pid_exists(int pid)
{
#ifdef SYS_pidfd_open
    char path[48];
    struct stat st;
    int fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);

    if (fd < 0) {
        if (errno == ESRCH || errno == ENOENT || errno == EINVAL)
            return 0;   /* none, or a thread id (not a thread-group leader) */
        return -1;
    }
    close(fd);
    xpath(AT_FDCWD, path, pid, NULL);
    return stat(path, &st) == 0;    /* hidepid=2 hides it: psutil says no */
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

#else /* not Linux */

int
pt_read_one(pt_extra *x, pt_proc *row, char *arena, size_t arena_cap, size_t *arena_used)
{
    (void)x;
    (void)row;
    (void)arena;
    (void)arena_cap;
    *arena_used = 0;
    errno = ENOSYS;
    return -1;
}

long
pt_list_pids(int64_t *pids, size_t cap)
{
    (void)pids;
    (void)cap;
    errno = ENOSYS;
    return -1;
}

int
pt_pid_exists(int pid)
{
    (void)pid;
    errno = ENOSYS;
    return -1;
}

long
pt_read_extra(pt_extra *rows, size_t n, char *arena, size_t arena_cap,
              size_t *arena_used, int nthreads)
{
    (void)rows;
    (void)n;
    (void)arena;
    (void)arena_cap;
    (void)nthreads;
    *arena_used = 0;
    errno = ENOSYS;
    return -1;
}

long
pt_scan_extra(pt_proc *rows, pt_extra *extra, size_t cap, int want, char *arena,
              size_t arena_cap, size_t *arena_used, int nthreads, pt_scaninfo *info)
{
    (void)rows;
    (void)extra;
    (void)cap;
    (void)want;
    (void)arena;
    (void)arena_cap;
    (void)nthreads;
    (void)info;
    *arena_used = 0;
    errno = ENOSYS;
    return -1;
}

#endif
