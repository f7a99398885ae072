/*
 * pt_helper.c: the small helpers both jobs of proctable-lineage use (pt_lineage.c,
 * the per-run helper; pt_session.c, a durable session's keeper): saying a line on
 * a status fd, reading a pid's stat fields and children, preparing and starting
 * the command, closing fds, shedding pages. Async-signal-safe where they run
 * between fork and exec. Declared in pt_helper.h.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <stdint.h>
#include <linux/sched.h>

#ifndef PR_SET_CHILD_SUBREAPER
#define PR_SET_CHILD_SUBREAPER 36
#endif

#include "pt_helper.h"

/* -- small helpers (async-signal-safe: used between fork and exec too) -------- */

void say(int fd, const char *text)
{
    size_t len = strlen(text), off = 0;
    if (fd < 0)
        return;
    while (off < len) {
        ssize_t n = write(fd, text + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* the reader is gone: nothing to tell */
        off += (size_t)n;
    }
}

int is_socket(int fd)
{
    int type;
    socklen_t len = sizeof type;
    return fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0;
}

/* say() on a Unix socket, with a copy of fd passed along (SCM_RIGHTS). */
void say_with_fd(int sock, const char *text, int fd)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov;
    struct msghdr msg;
    struct cmsghdr *c;
    ssize_t n;
    memset(&u, 0, sizeof u);
    memset(&msg, 0, sizeof msg);
    iov.iov_base = (void *)text;
    iov.iov_len = strlen(text);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.buf;
    msg.msg_controllen = sizeof u.buf;
    c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    do
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n >= 0 && (size_t)n < iov.iov_len)
        say(sock, text + n); /* the rest (the fd went with the first byte) */
}

void say_error(int fd, const char *word, int err, const char *what)
{
    char line[512];
    snprintf(line, sizeof line, "%s %d %s: %s\n", word, err, what, strerror(err));
    say(fd, line);
}

void cloexec(int fd)
{
    if (fd >= 0)
        fcntl(fd, F_SETFD, FD_CLOEXEC);
}

long parse_long(const char *s, const char *name)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end) {
        fprintf(stderr, "proctable-lineage: bad %s %s\n", name, s);
        exit(2);
    }
    return v;
}

int pidfd_open_(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* /proc/<pidname>/stat read into buf; a pointer to the space after comm's last ")",
 * or NULL (gone, unreadable). comm may hold spaces and ")": the last one counts. */
static char *stat_fields(const char *pidname, char *buf, size_t len)
{
    char path[300];
    int fd;
    ssize_t n;
    char *p;
    snprintf(path, sizeof path, "/proc/%s/stat", pidname);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    n = read(fd, buf, len - 1);
    close(fd);
    if (n <= 0)
        return NULL;
    buf[n] = 0;
    p = strrchr(buf, ')');
    return p ? p + 1 : NULL;
}

/* Field n (n >= 3) of a stat line as a number, from stat_fields()'s pointer; -1. */
static long long stat_field(char *p, int n)
{
    int field;
    if (!p)
        return -1;
    for (field = 3; field < n && p; field++) /* p is at the space before field 3 */
        p = strchr(p + 1, ' ');
    return p ? strtoll(p + 1, NULL, 10) : -1;
}

/* Field 22 (start time) of /proc/<pid>/stat, or -1. */
long long start_time(pid_t pid)
{
    char name[32], buf[1024];
    snprintf(name, sizeof name, "%d", (int)pid);
    return stat_field(stat_fields(name, buf, sizeof buf), 22);
}

/* Field 4 (ppid) of /proc/<pidname>/stat, or -1. */
static long ppid_of(const char *pidname)
{
    char buf[1024];
    return (long)stat_field(stat_fields(pidname, buf, sizeof buf), 4);
}

static int no_children_cached = -1;

static int no_children_file(void)
{
    if (no_children_cached < 0) {
        const char *v = getenv("PROCTABLE_DISABLE");
        no_children_cached = v && strstr(v, "proc_children") != NULL;
    }
    return no_children_cached;
}

/* Once the command is started, the helpers need none of its environment: blank
 * it, so that /proc/<pid>/environ of a helper shows none of the command's (a tool
 * that finds a run's processes by an environment marker finds the run's own,
 * not the helpers that wait for its teardown). */
void forget_environment(void)
{
    char **e;
    (void)no_children_file(); /* read before it goes */
    for (e = environ; e && *e; e++)
        memset(*e, 0, strlen(*e));
}

/* The children of pid (its main thread's children file), into out (at most cap):
 * their count, or -1 with errno where the file cannot be opened. A full buffer
 * keeps whole entries only: never half a pid. */
int children_of(pid_t pid, pid_t *out, int cap)
{
    char path[64], buf[65536];
    int fd, n = 0;
    ssize_t len = 0, got;
    char *p = buf, *end;
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    while ((size_t)len < sizeof buf - 1 &&
           (got = read(fd, buf + len, sizeof buf - 1 - (size_t)len)) > 0)
        len += got;
    close(fd);
    if (len <= 0)
        return 0;
    while (len > 0 && buf[len - 1] != ' ' && buf[len - 1] != '\n' &&
           (size_t)len == sizeof buf - 1)
        len--;
    buf[len] = 0;
    while (n < cap) {
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        out[n++] = (pid_t)v;
        p = end;
    }
    return n;
}

/* Our direct children now, into out (at most cap); their count. We have one
 * thread, so our main thread's children file holds them all. */
int children(pid_t *out, int cap)
{
    int n = 0;
    pid_t me = getpid();
    if (!no_children_file()) {
        n = children_of(me, out, cap);
        if (n >= 0)
            return n;
        if (errno != ENOENT)
            return 0;
        n = 0;
    }
    { /* no CONFIG_PROC_CHILDREN: scan /proc for processes whose parent we are */
        DIR *d = opendir("/proc");
        struct dirent *e;
        if (!d)
            return 0;
        while ((e = readdir(d)) && n < cap) {
            if (e->d_name[0] < '1' || e->d_name[0] > '9')
                continue;
            if (ppid_of(e->d_name) == (long)me)
                out[n++] = (pid_t)strtol(e->d_name, NULL, 10);
        }
        closedir(d);
    }
    return n;
}

int write_file(const char *dir, const char *leaf, const char *value)
{
    char path[PATH_MAX];
    int fd, ok;
    snprintf(path, sizeof path, "%s/%s", dir, leaf);
    fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ok = write(fd, value, strlen(value)) == (ssize_t)strlen(value);
    close(fd);
    return ok;
}

/* -- the command's start ---------------------------------------------------- */

/* In the child, before exec: the signal state, group or session, credentials and
 * umask the command starts with. 0, or -1 with errno (credentials refused). */
int prepare_command(const struct opts *o)
{
    struct sigaction sa;
    sigset_t none;
    int sig, i;
    for (i = 0; i < 3; i++)
        if (o->stdio[i] >= 0 && o->stdio[i] != i && dup2(o->stdio[i], i) < 0)
            return -1;
    memset(&sa, 0, sizeof sa);
    for (sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        sa.sa_handler = SIG_DFL;
        for (i = 0; i < o->n_ignored; i++)
            if (o->ignored[i] == sig)
                sa.sa_handler = SIG_IGN;
        sigaction(sig, &sa, NULL); /* EINVAL for the few glibc keeps: nothing to do */
    }
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (o->setsid_ || o->terminal)
        setsid();
    else if (o->own_group)
        setpgid(0, 0); /* a durable session's command: no group kill of it reaches its helpers */
    /* Otherwise in the caller's process group, as the mirror and the reaper: each of
     * our processes has its parent in its own group, so none of them ever makes a
     * group orphaned when it ends (the kernel sends SIGHUP and SIGCONT to a group
     * that becomes orphaned with a stopped member: the caller's, if a command there
     * had its parent elsewhere and ended while a teardown had members stopped). */
    if (o->terminal)
        ioctl(0, TIOCSCTTY, 0);
    if (o->umask_ >= 0)
        umask((mode_t)o->umask_);
    if (o->n_groups >= 0 && setgroups((size_t)o->n_groups, o->groups) != 0)
        return -1;
    if (o->gid >= 0 && setregid((gid_t)o->gid, (gid_t)o->gid) != 0)
        return -1;
    if (o->uid >= 0 && setreuid((uid_t)o->uid, (uid_t)o->uid) != 0)
        return -1;
    return 0;
}

/* execve of file, searched in PATH as subprocess does (never through /bin/sh when
 * the file is no executable format: ENOEXEC, as subprocess raises). */
static void exec_search(const char *file, char **argv)
{
    const char *path, *p;
    char buf[PATH_MAX];
    int saw_eacces = 0;
    if (strchr(file, '/')) {
        execve(file, argv, environ);
        return;
    }
    path = getenv("PATH");
    if (!path)
        path = "/bin:/usr/bin";
    for (p = path;; p++) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len + strlen(file) + 2 <= sizeof buf) {
            if (len == 0)
                snprintf(buf, sizeof buf, "%s", file);
            else
                snprintf(buf, sizeof buf, "%.*s/%s", (int)len, p, file);
            execve(buf, argv, environ);
            if (errno == EACCES)
                saw_eacces = 1;
            else if (errno != ENOENT && errno != ENOTDIR && errno != ENAMETOOLONG &&
                     errno != ELOOP && errno != ENODEV && errno != ETIMEDOUT &&
                     errno != ESTALE)
                return; /* a real error of this file (ENOEXEC, E2BIG, ...) */
        }
        if (!end)
            break;
        p = end;
    }
    errno = saw_eacces ? EACCES : ENOENT;
}

void exec_command(const struct opts *o)
{
    exec_search(o->exe ? o->exe : o->cmd[0], o->cmd);
}

/* A fork whose child is born in the cgroup of cgroup_fd (clone3 with
 * CLONE_INTO_CGROUP, Linux 5.7+): no process migrates, which costs the kernel an
 * RCU grace period on every write to cgroup.procs. -1 with errno where the
 * kernel or a sandbox refuses clone3 (ENOSYS, EPERM, E2BIG, EINVAL). */
pid_t fork_into(int cgroup_fd)
{
#if defined(SYS_clone3) && defined(CLONE_INTO_CGROUP)
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = CLONE_INTO_CGROUP;
    args.exit_signal = SIGCHLD;
    args.cgroup = (uint64_t)cgroup_fd;
    /* No stack given: the child runs on a copy of ours, as after fork(). We have
     * one thread, and the child only resets signals and execs. */
    return (pid_t)syscall(SYS_clone3, &args, sizeof args);
#else
    (void)cgroup_fd;
    errno = ENOSYS;
    return -1;
#endif
}

static void tell_errno(int fd, int err)
{
    while (fd >= 0 && write(fd, &err, sizeof err) < 0 && errno == EINTR)
        ;
}

/* fork (into cgroup_fd's cgroup where it is >= 0) and have the child exec the
 * command; its pid, or -1 with errno (nothing forked). Whether the exec worked is
 * told on *result, the read end of a close-on-exec pipe (finish_command() reads
 * it): EOF at the exec, or the exec's errno. tell, where >= 0 (close-on-exec too),
 * gets that errno as well: the caller's own way to learn it (see run_reaper). */
pid_t start_command(const struct opts *o, int cgroup_fd, int tell, int *result)
{
    int p[2], err;
    pid_t pid;
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid = cgroup_fd >= 0 ? fork_into(cgroup_fd) : fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        errno = e;
        return -1;
    }
    if (pid == 0) {
        close(p[0]);
        if (prepare_command(o) == 0)
            exec_command(o);
        err = errno ? errno : ENOEXEC;
        tell_errno(p[1], err);
        tell_errno(tell, err);
        _exit(127);
    }
    close(p[1]);
    *result = p[0];
    return pid;
}

/* The exec of start_command()'s child: pid, or -1 with the exec's errno (the
 * child, which never ran the command, reaped here). Closes result. */
pid_t finish_command(pid_t pid, int result)
{
    int err = 0;
    ssize_t n;
    do {
        n = read(result, &err, sizeof err);
    } while (n < 0 && errno == EINTR);
    close(result);
    if (n == (ssize_t)sizeof err) {
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ; /* it never ran the command: reap it here */
        errno = err;
        return -1;
    }
    return pid;
}

/* fork (into cgroup_fd's cgroup where it is >= 0) and exec the command; its pid,
 * or -1 with errno (the exec's own errno when exec failed, told through a
 * close-on-exec pipe). */
pid_t spawn_command(const struct opts *o, int cgroup_fd)
{
    int result;
    pid_t pid = start_command(o, cgroup_fd, -1, &result);
    return pid < 0 ? -1 : finish_command(pid, result);
}

/* Close every fd above 2 but the kept ones: the caller's pass_fds are the
 * command's to hold, never ours (a pipe's reader would wait on us for its EOF). */
void close_all_but(const int *keep, int n)
{
    int want[16], m = 0, i, j, lo = 3;
    for (i = 0; i < n && m < 16; i++)
        if (keep[i] > 2)
            want[m++] = keep[i];
    for (i = 1; i < m; i++) /* sort (a handful) */
        for (j = i; j > 0 && want[j - 1] > want[j]; j--) {
            int t = want[j];
            want[j] = want[j - 1];
            want[j - 1] = t;
        }
    for (i = 0; i <= m; i++) {
        int hi = i < m ? want[i] - 1 : INT_MAX;
        if (hi >= lo) {
#ifdef SYS_close_range
            if (syscall(SYS_close_range, (unsigned)lo, (unsigned)hi, 0) != 0)
#endif
            {
                DIR *d = opendir("/proc/self/fd");
                struct dirent *e;
                int dfd = d ? dirfd(d) : -1;
                while (d && (e = readdir(d))) {
                    long fd = strtol(e->d_name, NULL, 10);
                    if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && fd >= lo && fd <= hi &&
                        fd != dfd)
                        close((int)fd);
                }
                if (d)
                    closedir(d);
            }
        }
        if (i < m)
            lo = want[i] + 1;
    }
}

/* The helper spends its life waiting in poll(): once it waits, its program's
 * read-only pages (the static C library's, mostly) leave this process's page
 * tables. They stay in the page cache, shared, and come back on the next touch,
 * so only the few pages the waiting loop uses count in its RSS (`ps`, the
 * figure users add up per lineage). Only [__executable_start, etext): the
 * writable and relocated segments keep their contents. */
extern char __executable_start[], etext[];

void shed_pages(void)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t from, to;

    if (page <= 0)
        return;
    from = ((uintptr_t)__executable_start + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    to = (uintptr_t)etext & ~((uintptr_t)page - 1);
    if (to > from)
        (void)madvise((void *)from, to - from, MADV_DONTNEED);
}

void quiet_stdio(void)
{
    /* Hold none of the caller's pipes or terminals longer than the command does. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    int fd;
    if (null < 0)
        return;
    for (fd = 0; fd < 3; fd++)
        dup2(null, fd);
    if (null > 2)
        close(null);
}
