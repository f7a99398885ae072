/*
 * pt_lineage.c: proctable-lineage, the native helper of a lineage (an executable
 * shipped in the package, run by Lineage.spawn). Standard C and Linux syscalls
 * only; no allocation after start; linked statically where the toolchain can,
 * so that it costs a few hundred KiB of memory and one exec.
 *
 * Two jobs, chosen by the first argument:
 *
 * reap: the reaper modes (subreaper, cgroup). Two processes:
 *
 *     caller --Popen--> mirror --fork--> reaper --fork+exec--> command
 *                       "pt-mirror"      "pt-reaper" (subreaper)
 *
 *   mirror (the caller's Popen): forwards every signal a process sends it
 *     (kill(), Popen.send_signal) to the reaper, which forwards it to the command;
 *     exits the way the command did (its code, or its signal raised on itself)
 *     once the reaper tells it the command's status, having written that status
 *     (core-dump bit included) on --exit-fd first. Its death before the command's
 *     (a SIGKILL, Popen.kill()) ends the command's lineage: the reaper sees it
 *     (parent-death signal) and kills every process below it, then writes the
 *     command's status on --exit-fd itself.
 *   reaper: PR_SET_CHILD_SUBREAPER, so every orphan of the run stays below it;
 *     in cgroup mode it makes the lineage's cgroup itself, moves in, forks the
 *     command there and moves back out (so no directory exists that no live
 *     process of ours would remove). It reaps everything, and exits once the
 *     caller has released it (a "release" line on --control-fd) and nothing is
 *     left below it. When the caller dies (its pidfd, or EOF on --control-fd
 *     without "release"), it kills everything below it and removes the cgroup.
 *
 * exec: scan mode. The caller's Popen runs this, which prepares the command's
 *   state and execs it in place (same pid): parent-death signal SIGKILL, then the
 *   same preparation as below. An exec failure is told on --status-fd
 *   ("error <errno> <message>"); success closes it (close-on-exec) with no word.
 *
 * Either way the command starts with every signal's disposition at default (the
 * ones named by --ignore at SIG_IGN) and an empty blocked mask, whatever the
 * caller ignored or blocked; --setsid makes it a session leader, --terminal also
 * makes its stdin (a terminal) its controlling terminal. Nothing of the helper's
 * own (its fds: all close-on-exec; its signal state) reaches the command.
 *
 * Status line of reap on --status-fd: "ok <reaper> <command> <start_time>
 * <inside> <pidfs handle or 0> <cgroup path or -> <guard pid or 0>", "error
 * <errno> <message>", or "nosubreaper <errno> <message>" (this host denies
 * PR_SET_CHILD_SUBREAPER). Where --status-fd is a Unix socket, "ok" comes as soon
 * as the command is forked, with (SCM_RIGHTS) the read end of a pipe on which the
 * command itself tells how its exec went: EOF at the exec, or the exec's errno
 * (a native int); through a pipe, "ok" comes once the exec worked.
 * Lines on --exit-fd: the command's raw wait status, in decimal: the reaper's as
 * soon as it reaped the command, then the mirror's (the first line counts).
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

static int wake_signal(void) { return SIGRTMIN + 5; }

/* How the mirror passes a signal on to the reaper: a queued real-time signal
 * whose value carries the signal and its sender's pid (sig | sender << 7;
 * pid_max is at most 2^22). Queued, it never merges with a signal of the
 * same number pending at the reaper (a SIGCHLD of its own children, say);
 * and with the sender the reaper can tell a signal sent to the whole group,
 * which reached it (and the command) directly too, from one sent to the
 * mirror alone (see struct reaper's direct[]). It is the highest signal: a
 * signalfd hands pending signals out lowest number first (a real-time signal's
 * copies in the order they came), so the reaper reads a signal's direct copy,
 * queued before the mirror could even wake, before the relay of it, whatever
 * its number. */
static int relay_signal(void) { return SIGRTMAX; }
#define RELAY_WINDOW_MS 5000
#define DIRECT_SENDERS 4

/* The small helpers both jobs share are in pt_helper.c. */

/* -- the reaper -------------------------------------------------------------- */

struct reaper {
    const struct opts *o;
    pid_t mirror, cmd;
    int cmd_status, cmd_ended; /* raw wait status, once reaped */
    int told_mirror;           /* the status went to the mirror (or to --exit-fd) */
    int caller_fd;             /* pidfd of the caller, or -1 */
    long long caller_start;
    char cgroup[PATH_MAX];     /* the cgroup we made, or "" */
    int inside;                /* we could not move back out of it */
    int released;              /* the caller said "release" */
    int exit_fd;               /* our copy: the status where the mirror died first */
    /* The copies of each signal that reached us directly (not through the
     * mirror) and whose relay has not come yet, by sender: a relay of the same
     * signal from the same sender was sent to the group we share with the
     * mirror (and with the command, unless it left it), so it is not passed on
     * again. One relay cancels one copy: a burst of a real-time signal to the
     * group comes as many copies and as many relays. The kernel signals a
     * group's newest members first, so our direct copy is queued before the
     * mirror can even wake (and read first: see relay_signal()). */
    struct { pid_t sender; int copies; long long at_ms; } direct[65][DIRECT_SENDERS];
    pid_t guard;               /* the cgroup's guard (run_guard), or 0 */
    int to_guard;              /* its pipe: EOF when we end, or -1 */
};

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A copy of sig from sender reached us directly. A standard signal merges
 * while pending (at the mirror too), so it counts once. */
static void note_direct(struct reaper *r, int sig, pid_t sender)
{
    long long now = now_ms();
    int i, slot = -1;
    for (i = 0; i < DIRECT_SENDERS; i++)
        if (r->direct[sig][i].copies > 0 && now - r->direct[sig][i].at_ms >= RELAY_WINDOW_MS)
            r->direct[sig][i].copies = 0; /* its relay never came */
    for (i = 0; i < DIRECT_SENDERS && slot < 0; i++)
        if (r->direct[sig][i].copies > 0 && r->direct[sig][i].sender == sender)
            slot = i;
    for (i = 0; i < DIRECT_SENDERS && slot < 0; i++)
        if (r->direct[sig][i].copies == 0)
            slot = i;
    if (slot < 0) { /* all taken: forget the oldest */
        slot = 0;
        for (i = 1; i < DIRECT_SENDERS; i++)
            if (r->direct[sig][i].at_ms < r->direct[sig][slot].at_ms)
                slot = i;
        r->direct[sig][slot].copies = 0;
    }
    if (r->direct[sig][slot].copies == 0)
        r->direct[sig][slot].sender = sender;
    r->direct[sig][slot].at_ms = now;
    if (sig >= SIGRTMIN || r->direct[sig][slot].copies == 0)
        r->direct[sig][slot].copies++;
}

/* A relay of sig from sender came: whether it answers a direct copy (then
 * dropped). */
static int take_direct(struct reaper *r, int sig, pid_t sender)
{
    int i;
    for (i = 0; i < DIRECT_SENDERS; i++) {
        if (r->direct[sig][i].copies > 0 && r->direct[sig][i].sender == sender &&
            now_ms() - r->direct[sig][i].at_ms < RELAY_WINDOW_MS) {
            r->direct[sig][i].copies--;
            return 1;
        }
    }
    return 0;
}

static int caller_ended(struct reaper *r)
{
    if (r->caller_fd >= 0) {
        struct pollfd pf = {r->caller_fd, POLLIN, 0};
        return poll(&pf, 1, 0) > 0;
    }
    return start_time(r->o->caller) != r->caller_start;
}

static void reap_all(struct reaper *r)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            return;
        if (pid == r->cmd && !r->cmd_ended) {
            r->cmd_ended = 1;
            r->cmd_status = st;
        }
        if (pid == r->guard)
            r->guard = 0;
    }
}

static void remove_cgroup(struct reaper *r)
{
    int i;
    if (!r->cgroup[0] || r->inside)
        return;
    for (i = 0; i < 100; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        if (rmdir(r->cgroup) == 0 || errno == ENOENT)
            break;
        if (errno != EBUSY)
            break;
        nanosleep(&ts, NULL);
    }
    r->cgroup[0] = 0;
}

/* Kill everything below us (our children by pid: unreaped, they cannot be
 * reused), reap, repeat as orphans re-parent to us; bounded. */
static void kill_all(struct reaper *r)
{
    struct timespec t0, now, nap = {0, 5 * 1000 * 1000};
    pid_t kids[4096];
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (r->cgroup[0] && !r->inside)
        write_file(r->cgroup, "cgroup.kill", "1");
    for (;;) {
        int n = children(kids, 4096), i, st;
        pid_t pid;
        for (i = 0; i < n; i++)
            kill(kids[i], SIGKILL);
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
            if (pid == r->cmd && !r->cmd_ended) {
                r->cmd_ended = 1;
                r->cmd_status = st;
            }
        }
        if (pid < 0 && errno == ECHILD)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 10)
            break;
        nanosleep(&nap, NULL);
    }
}

/* -- the guard ------------------------------------------------------------------
 *
 * The mirror and the reaper stay in the caller's process group (see the Python
 * side's docs), so a SIGKILL of that whole group (`timeout -s KILL`, `kill -9
 * -PGID`) ends them with the caller, and nobody would end what the command left.
 * In cgroup mode a third process, out of that group and session, keeps the
 * promise: it holds no child and no terminal, so it changes no group's standing;
 * it waits for the reaper's end (its pipe's EOF) and, if the lineage's cgroup is
 * still there while the caller is gone too, kills it and removes it. Where the
 * caller lives on (only the reaper was killed), the lineage is the caller's to
 * end, as before. */
static int run_guard(struct reaper *r, int from_reaper)
{
    int i;
    setsid();
    say(from_reaper, "s"); /* out of the caller's group: see start_guard() */
    prctl(PR_SET_NAME, "pt-guard", 0, 0, 0);
    {
        int keep[] = {from_reaper, r->caller_fd};
        close_all_but(keep, 2);
    }
    quiet_stdio();
    forget_environment();
    shed_pages();
    /* The reaper writes each cgroup path it is about to make, a line each,
     * before the mkdir: killed at any moment after, it leaves nothing we do
     * not know of. The last line counts ("" when it made none). */
    r->cgroup[0] = 0;
    {
        char buf[PATH_MAX + 2];
        size_t have = 0;
        for (;;) {
            struct pollfd pf = {from_reaper, POLLIN, 0};
            char *nl;
            ssize_t n;
            if (poll(&pf, 1, -1) < 0 && errno != EINTR)
                break;
            if (have == sizeof buf - 1)
                have = 0; /* no path is that long */
            n = read(from_reaper, buf + have, sizeof buf - 1 - have);
            if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
                break; /* the reaper has ended */
            if (n < 0)
                continue;
            have += (size_t)n;
            buf[have] = 0;
            while ((nl = strchr(buf, '\n')) != NULL) {
                size_t len = (size_t)(nl - buf);
                memcpy(r->cgroup, buf, len);
                r->cgroup[len] = 0;
                memmove(buf, nl + 1, have - len - 1);
                have -= len + 1;
                buf[have] = 0;
            }
        }
    }
    if (!r->cgroup[0])
        return 0;
    /* A group's SIGKILL reaches the caller with the reaper; a caller of many
     * threads takes a moment to be gone: look for 2 s, every 10 ms. */
    for (i = 0; i < 200; i++) {
        struct timespec nap = {0, 10 * 1000 * 1000};
        if (access(r->cgroup, F_OK) != 0)
            return 0; /* removed (the reaper's normal end, or the caller's teardown) */
        if (caller_ended(r)) {
            int k;
            write_file(r->cgroup, "cgroup.kill", "1");
            for (k = 0; k < 1000 && rmdir(r->cgroup) != 0 && errno == EBUSY; k++) {
                char procs[4096];
                int fd;
                ssize_t got;
                char *p, *end;
                /* Before cgroup.kill (Linux 5.14): by pid, as cgroup.procs lists them. */
                snprintf(procs, sizeof procs, "%s/cgroup.procs", r->cgroup);
                fd = open(procs, O_RDONLY | O_CLOEXEC);
                if (fd >= 0) {
                    got = read(fd, procs, sizeof procs - 1);
                    close(fd);
                    procs[got > 0 ? got : 0] = 0;
                    for (p = procs;; p = end) {
                        long v = strtol(p, &end, 10);
                        if (end == p)
                            break;
                        if (v > 0)
                            kill((pid_t)v, SIGKILL);
                    }
                }
                nanosleep(&nap, NULL);
            }
            return 0;
        }
        nanosleep(&nap, NULL);
    }
    return 0; /* the caller lives on: the lineage is its to end */
}

static void start_guard(struct reaper *r)
{
    int p[2], st;
    pid_t pid;
    char c;
    ssize_t n;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) != 0)
        return; /* no guard: as before it */
    pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return;
    }
    if (pid == 0) {
        close(p[1]);
        _exit(run_guard(r, p[0]));
    }
    close(p[0]);
    /* Until its setsid() the guard is in the caller's group, and a kill of that
     * group ends it with us: no cgroup before it has left (its byte says so). */
    do
        n = read(p[1], &c, 1);
    while (n < 0 && errno == EINTR);
    if (n != 1) {
        close(p[1]);
        waitpid(pid, &st, 0); /* it ended (EOF): our child, reaped */
        return;
    }
    r->guard = pid;
    r->to_guard = p[1];
}

/* The cgroup path we are about to make (or "": none), before we make it. */
static void tell_guard(struct reaper *r, const char *path)
{
    char line[PATH_MAX + 2];
    if (r->to_guard < 0)
        return;
    snprintf(line, sizeof line, "%s\n", path);
    say(r->to_guard, line);
}

/* Our normal end: the cgroup is removed; let the guard go, and reap it (bounded). */
static void end_guard(struct reaper *r)
{
    int i, st;
    if (r->to_guard >= 0) {
        close(r->to_guard);
        r->to_guard = -1;
    }
    if (r->guard > 0) {
        /* It leaves at once (the cgroup is gone): wait on its pidfd, bounded. */
        int fd = pidfd_open_(r->guard);
        if (fd >= 0) {
            struct pollfd pf = {fd, POLLIN, 0};
            (void)poll(&pf, 1, 5000);
            close(fd);
        }
    }
    for (i = 0; r->guard > 0 && i < 500; i++) {
        struct timespec nap = {0, 1000 * 1000};
        if (waitpid(r->guard, &st, WNOHANG) == r->guard)
            r->guard = 0;
        else
            nanosleep(&nap, NULL);
    }
    if (r->guard > 0) {
        kill(r->guard, SIGKILL); /* our unreaped child */
        waitpid(r->guard, &st, 0);
        r->guard = 0;
    }
}

/* A signal for the command, from the mirror. */
static void pass_on(struct reaper *r, int sig)
{
    reap_all(r);
    if (!r->cmd_ended) {
        kill(r->cmd, sig); /* our unreaped child: safe by pid */
    } else if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) {
        pid_t kids[4096];
        int n = children(kids, 4096), k;
        for (k = 0; k < n; k++)
            kill(kids[k], sig);
    }
}

static void tell_exit_fd(int fd, int raw)
{
    char line[32];
    snprintf(line, sizeof line, "%d\n", raw);
    say(fd, line);
}

static int run_reaper(const struct opts *o, pid_t mirror, int to_mirror)
{
    struct reaper r;
    sigset_t all;
    int sfd, wake = wake_signal(), relay = relay_signal(), mirror_eof = 0;
    char relayed[1024];
    size_t relayed_len = 0;
    char line[PATH_MAX + 128];
    long long cmd_start;
    unsigned long long handle = 0;
    int cgroup_fd = -1, spawn_error = 0, result = -1, tell[2] = {-1, -1};
    char word[64];

    memset(&r, 0, sizeof r);
    r.o = o;
    r.mirror = mirror;
    r.caller_fd = -1;
    r.exit_fd = o->exit_fd;
    r.to_guard = -1;
    prctl(PR_SET_NAME, "pt-reaper", 0, 0, 0);
    prctl(PR_SET_PDEATHSIG, wake, 0, 0, 0);
    if (getppid() != mirror)
        return REAPER_LOST; /* the mirror died before we could watch it */
    r.caller_fd = pidfd_open_(o->caller);
    if (r.caller_fd >= 0)
        cloexec(r.caller_fd);
    r.caller_start = start_time(o->caller);
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
        /* A sandbox that denies it: nothing was started, and the caller can
         * choose another backend. */
        say_error(o->status_fd, "nosubreaper", errno, "PR_SET_CHILD_SUBREAPER");
        say(to_mirror, "error\n");
        return 126;
    }
    if (o->cgroup_parent) {
        int i;
        start_guard(&r);
        for (i = 0; i < 1000; i++) {
            if (i == 0)
                snprintf(r.cgroup, sizeof r.cgroup, "%s/proctable-%d-%d", o->cgroup_parent,
                         (int)o->caller, (int)getpid());
            else
                snprintf(r.cgroup, sizeof r.cgroup, "%s/proctable-%d-%d-%d", o->cgroup_parent,
                         (int)o->caller, (int)getpid(), i);
            tell_guard(&r, r.cgroup);
            if (mkdir(r.cgroup, 0755) == 0)
                break;
            if (errno != EEXIST || i == 999) {
                int e = errno;
                r.cgroup[0] = 0;
                tell_guard(&r, "");
                end_guard(&r);
                say_error(o->status_fd, "error", e, "cannot make the lineage's cgroup");
                say(to_mirror, "error\n");
                return 126;
            }
        }
        if (caller_ended(&r)) { /* gone while we made it: take it away again */
            remove_cgroup(&r);
            end_guard(&r);
            return 0;
        }
        cgroup_fd = open(r.cgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }
    /* A socket for --status-fd: the status line goes out as soon as the command is
     * forked, with the read end of a pipe on which the command itself tells the
     * caller how its exec went (EOF at the exec, or the errno), so the caller
     * learns it without waiting for us to wake up and say so. A pipe: the line
     * after the exec, as before. */
    if (is_socket(o->status_fd) && pipe2(tell, O_CLOEXEC) != 0)
        tell[0] = tell[1] = -1;
    /* Every signal waits in the signalfd (blocked since main()). */
    sigfillset(&all);
    sfd = signalfd(-1, &all, SFD_CLOEXEC | SFD_NONBLOCK);
    r.cmd = cgroup_fd >= 0 ? start_command(o, cgroup_fd, tell[1], &result) : -1;
    if (cgroup_fd >= 0 && r.cmd < 0 && errno != ENOSYS && errno != EPERM &&
        errno != E2BIG && errno != EINVAL) {
        spawn_error = errno; /* no fork at all (EAGAIN, ...) */
    } else if (r.cmd < 0 && o->cgroup_parent) {
        /* No clone3 into a cgroup here: move in, fork there, move back out. */
        if (!write_file(r.cgroup, "cgroup.procs", "0")) {
            int e = errno ? errno : EACCES;
            remove_cgroup(&r);
            end_guard(&r);
            say_error(o->status_fd, "error", e, "cannot move into the lineage's cgroup");
            say(to_mirror, "error\n");
            return 126;
        }
        r.inside = 1;
        r.cmd = start_command(o, -1, tell[1], &result);
        spawn_error = r.cmd < 0 ? errno : 0;
        if (o->home && write_file(o->home, "cgroup.procs", "0"))
            r.inside = 0; /* back out: the cgroup holds the lineage only */
    } else if (r.cmd < 0) {
        r.cmd = start_command(o, -1, tell[1], &result);
        spawn_error = r.cmd < 0 ? errno : 0;
    }
    if (tell[1] >= 0)
        close(tell[1]); /* the command's own copy tells, or closes at its exec */
    if (cgroup_fd >= 0)
        close(cgroup_fd);
    if (r.cmd >= 0 && tell[0] < 0) { /* the exec's outcome before the status line */
        r.cmd = finish_command(r.cmd, result);
        spawn_error = r.cmd < 0 ? errno : 0;
    }
    if (r.cmd < 0) {
        int e = spawn_error ? spawn_error : EAGAIN;
        if (tell[0] >= 0)
            close(tell[0]);
        remove_cgroup(&r);
        end_guard(&r);
        say_error(o->status_fd, "error", e, o->exe ? o->exe : o->cmd[0]);
        say(to_mirror, "error\n");
        return e == ENOENT ? 127 : 126;
    }
    cmd_start = start_time(r.cmd); /* our unreaped child: its pid names no other */
    {
        int fd = pidfd_open_(r.cmd);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0)
                handle = (unsigned long long)st.st_ino;
            close(fd);
        }
    }
    if (r.inside) { /* we are in it: no guard's (as before it) */
        tell_guard(&r, "");
        end_guard(&r);
    }
    snprintf(word, sizeof word, "%d", (int)getpid());
    snprintf(line, sizeof line, "ok %s %d %lld %d %llu %s %d\n", word, (int)r.cmd, cmd_start,
             r.inside, handle, r.cgroup[0] ? r.cgroup : "-", (int)r.guard);
    if (tell[0] >= 0) {
        say_with_fd(o->status_fd, line, tell[0]);
        close(tell[0]);
        close(o->status_fd);
        if (finish_command(r.cmd, result) < 0) {
            /* The exec failed (the caller read why from the pipe): as above, but the
             * status line is said already. */
            int e = errno;
            remove_cgroup(&r);
            end_guard(&r);
            say(to_mirror, "error\n");
            return e == ENOENT ? 127 : 126;
        }
    } else {
        say(o->status_fd, line);
        close(o->status_fd);
    }
    {
        int keep[] = {to_mirror, r.exit_fd, o->control_fd, r.caller_fd, sfd, r.to_guard};
        close_all_but(keep, 6);
    }
    quiet_stdio();
    forget_environment();
    shed_pages();

    fcntl(to_mirror, F_SETFL, O_NONBLOCK);
    for (;;) {
        struct pollfd pf[4];
        int npf = 0, timeout, rc, i;
        char buf[256], *rl, *nl;
        pf[npf++] = (struct pollfd){sfd, POLLIN, 0};
        if (!mirror_eof)
            pf[npf++] = (struct pollfd){to_mirror, POLLIN, 0};
        if (o->control_fd >= 0)
            pf[npf++] = (struct pollfd){o->control_fd, POLLIN, 0};
        if (r.caller_fd >= 0)
            pf[npf++] = (struct pollfd){r.caller_fd, POLLIN, 0};
        timeout = r.caller_fd >= 0 ? -1 : 1000; /* without a pidfd: look every second */
        if (sfd < 0)
            timeout = 50;
        rc = poll(pf, (nfds_t)npf, timeout);
        if (rc < 0 && errno != EINTR)
            timeout = 50;
        /* The mirror's relays by line, read before the signals: each one's direct
         * copy, if any, was queued before it was written, so it is read below. */
        while (!mirror_eof && relayed_len < sizeof relayed - 1) {
            ssize_t n = read(to_mirror, relayed + relayed_len, sizeof relayed - 1 - relayed_len);
            if (n > 0)
                relayed_len += (size_t)n;
            else {
                if (n == 0 || (errno != EINTR && errno != EAGAIN))
                    mirror_eof = 1;
                break;
            }
        }
        relayed[relayed_len] = 0;
        /* Signals first, then reaping: a SIGCHLD read here is never lost to a
         * reap that ran before it came. */
        while (sfd >= 0) {
            struct signalfd_siginfo si;
            int sig;
            if (read(sfd, &si, sizeof si) != (ssize_t)sizeof si)
                break;
            sig = (int)si.ssi_signo;
            if (sig == SIGCHLD && si.ssi_code > 0)
                continue; /* a child's state changed: reaped below */
            if (sig == wake && getppid() != mirror)
                continue; /* our parent-death signal: looked at below */
            if (sig == relay && si.ssi_code == SI_QUEUE && (pid_t)si.ssi_pid == mirror) {
                pid_t sender = (pid_t)((unsigned)si.ssi_int >> 7);
                sig = (int)((unsigned)si.ssi_int & 0x7f);
                if (sig < 1 || sig > 64)
                    continue;
                if (take_direct(&r, sig, sender))
                    continue; /* sent to the group: the command had its own copy */
            } else if ((pid_t)si.ssi_pid != mirror || si.ssi_code == SI_KERNEL) {
                /* Sent to our group, or to us directly: not the command's. Kept
                 * to recognise the mirror's relay of the same signal. */
                if (sig >= 1 && sig <= 64 && si.ssi_code != SI_KERNEL)
                    note_direct(&r, sig, (pid_t)si.ssi_pid);
                continue;
            }
            /* (A plain signal from the mirror: its relay could not be sent.) */
            pass_on(&r, sig);
        }
        for (rl = relayed; (nl = strchr(rl, '\n')) != NULL; rl = nl + 1) {
            char *end;
            long sig = strtol(rl, &end, 10), sender = strtol(end, NULL, 10);
            if (sig >= 1 && sig <= 64 && !take_direct(&r, (int)sig, (pid_t)sender))
                pass_on(&r, (int)sig);
        }
        relayed_len = strlen(rl);
        memmove(relayed, rl, relayed_len + 1);
        reap_all(&r);
        if (r.cmd_ended && !r.told_mirror) {
            char msg[64];
            /* The caller first: it learns the status now, not once the mirror has
             * woken up to write it too (the first line counts). */
            if (r.exit_fd >= 0)
                tell_exit_fd(r.exit_fd, r.cmd_status);
            snprintf(msg, sizeof msg, "exit %d\n", r.cmd_status);
            say(to_mirror, msg); /* the mirror writes it on --exit-fd, then becomes it */
            r.told_mirror = 1;
        }
        if (r.exit_fd >= 0 && getppid() != mirror) {
            /* The mirror is gone. Before the command: Popen.kill() or a SIGKILL of
             * it, which ends the command's lineage, and the command's status goes on
             * --exit-fd from here (it is there already where the command ended
             * first). */
            if (!r.cmd_ended) {
                kill_all(&r);
                if (r.cmd_ended)
                    tell_exit_fd(r.exit_fd, r.cmd_status);
            }
            close(r.exit_fd);
            r.exit_fd = -1;
        }
        if (o->control_fd >= 0) {
            for (i = 0; i < npf; i++) {
                ssize_t n;
                if (pf[i].fd != o->control_fd || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                    continue;
                n = read(o->control_fd, buf, sizeof buf - 1);
                if (n > 0) {
                    buf[n] = 0;
                    if (strstr(buf, "release"))
                        r.released = 1;
                } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                    close(o->control_fd);
                    ((struct opts *)o)->control_fd = -1;
                    if (!r.released) { /* the caller died: end its run */
                        kill_all(&r);
                        remove_cgroup(&r);
                        return 0;
                    }
                }
            }
        }
        if (caller_ended(&r)) {
            kill_all(&r);
            remove_cgroup(&r);
            return 0;
        }
        if (r.cmd_ended && (r.released || o->control_fd < 0)) {
            int st;
            pid_t pid = waitpid(-1, &st, WNOHANG), kids[2];
            if ((pid < 0 && errno == ECHILD) ||
                (pid == 0 && r.guard > 0 && children(kids, 2) == 1 && kids[0] == r.guard)) {
                remove_cgroup(&r);
                end_guard(&r);
                return 0; /* released, and nothing is left below us but the guard */
            }
            if (pid == r.guard)
                r.guard = 0;
            else if (pid == r.cmd && !r.cmd_ended) {
                r.cmd_ended = 1;
                r.cmd_status = st;
            }
        }
    }
}

/* -- the mirror ----------------------------------------------------------------- */

static int is_core_signal(int sig)
{
    switch (sig) {
    case SIGQUIT: case SIGILL: case SIGTRAP: case SIGABRT: case SIGBUS:
    case SIGFPE: case SIGSEGV: case SIGSYS: case SIGXCPU: case SIGXFSZ:
        return 1;
    }
    return 0;
}

/* Exit the way the command did: its code, or its signal raised on ourselves. */
static int become(int raw)
{
    if (WIFSIGNALED(raw)) {
        int sig = WTERMSIG(raw);
        struct sigaction sa;
        sigset_t one;
        if (is_core_signal(sig)) {
            struct rlimit none = {0, 0};
            setrlimit(RLIMIT_CORE, &none); /* the command dumped, not us */
        }
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_DFL;
        sigaction(sig, &sa, NULL);
        sigemptyset(&one);
        sigaddset(&one, sig);
        sigprocmask(SIG_UNBLOCK, &one, NULL);
        kill(getpid(), sig);
        {
            struct timespec ts = {0, 500 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        return 128 + sig;
    }
    if (WIFEXITED(raw))
        return WEXITSTATUS(raw);
    return 1;
}

static int run_mirror(const struct opts *o, pid_t reaper, int from_reaper, int caller_fd)
{
    sigset_t all;
    int sfd, reaper_gone = 0;
    char buf[256];
    size_t have = 0;
    prctl(PR_SET_NAME, "pt-mirror", 0, 0, 0);
    sigfillset(&all);
    sfd = signalfd(-1, &all, SFD_CLOEXEC | SFD_NONBLOCK);
    fcntl(from_reaper, F_SETFL, O_NONBLOCK);
    shed_pages();
    for (;;) {
        struct pollfd pf[3] = {{from_reaper, POLLIN, 0}, {sfd, POLLIN, 0},
                               {caller_fd, POLLIN, 0}};
        ssize_t n;
        /* The caller's end comes through its pidfd; without one, look every second.
         * (No parent-death signal here: the kernel sends it when the caller's
         * *thread* that started us ends, and it would look like a signal the caller
         * sent to be passed on.) */
        int rc = poll(pf, caller_fd >= 0 ? 3 : 2, caller_fd >= 0 ? -1 : 1000);
        (void)rc;
        if (caller_fd >= 0 && (pf[2].revents & POLLIN))
            return REAPER_LOST; /* the caller is gone; the reaper ends the run */
        while (have < sizeof buf - 1 && (n = read(from_reaper, buf + have, sizeof buf - 1 - have)) > 0)
            have += (size_t)n;
        buf[have] = 0;
        if (strchr(buf, '\n')) {
            if (strncmp(buf, "exit ", 5) == 0) {
                int raw = (int)strtol(buf + 5, NULL, 10);
                tell_exit_fd(o->exit_fd, raw);
                close(o->exit_fd);
                return become(raw);
            }
            return 127; /* the command could not start; the reaper said why */
        }
        if (sfd >= 0) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                int sig = (int)si.ssi_signo;
                if (si.ssi_code == SI_KERNEL)
                    continue; /* a terminal's: it reached the command already */
                if (sig == SIGCHLD && si.ssi_code > 0)
                    continue; /* the reaper's state changed (looked at below) */
                if (!reaper_gone) {
                    /* Our unreaped child: it passes it on to the command. */
                    union sigval v;
                    v.sival_int = (int)((unsigned)sig | ((unsigned)si.ssi_pid << 7));
                    if (sigqueue(reaper, relay_signal(), v) != 0) {
                        /* No room in its queue (a plain kill() of a real-time
                         * signal would come without its sender): as a line. */
                        char msg[32];
                        int len = snprintf(msg, sizeof msg, "%d %d\n", sig, (int)si.ssi_pid);
                        if (send(from_reaper, msg, (size_t)len, MSG_NOSIGNAL | MSG_DONTWAIT) != len)
                            kill(reaper, sig); /* last resort: as it is */
                    }
                }
            }
        }
        if (!reaper_gone) {
            int st;
            if (waitpid(reaper, &st, WNOHANG) == reaper)
                reaper_gone = 1;
        }
        if (reaper_gone && !strchr(buf, '\n')) {
            while ((n = read(from_reaper, buf + have, sizeof buf - 1 - have)) > 0)
                have += (size_t)n;
            buf[have] = 0;
            if (strchr(buf, '\n'))
                continue;
            /* The reaper died without a word (killed from outside): the command's
             * status can no longer be known; no status line, so the caller says
             * "unknown" instead of inventing one. */
            return REAPER_LOST;
        }
        if (getppid() != o->caller)
            return REAPER_LOST; /* the caller is gone; the reaper ends the run */
    }
}

static int job_reap(struct opts *o)
{
    sigset_t all;
    int p[2];
    pid_t reaper, mirror = getpid();
    int caller_fd;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    caller_fd = pidfd_open_(o->caller);
    if (caller_fd >= 0)
        cloexec(caller_fd);
    if (getppid() != o->caller)
        return REAPER_LOST; /* the caller died before we could watch it */
    cloexec(o->status_fd);
    cloexec(o->exit_fd);
    cloexec(o->control_fd);
    /* Both ways: the reaper's word to the mirror, and the mirror's relays that
     * no signal queue had room for (RLIMIT_SIGPENDING), to the reaper. */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) != 0) {
        say_error(o->status_fd, "error", errno, "socketpair");
        return 126;
    }
    /* Named before the reaper exists: once the reaper says "ok", ps shows pt-mirror
     * (named after the fork, a look right after spawn() saw the helper's own name). */
    prctl(PR_SET_NAME, "pt-mirror", 0, 0, 0);
    reaper = fork();
    if (reaper < 0) {
        say_error(o->status_fd, "error", errno, "fork of the lineage's reaper");
        return 126;
    }
    if (reaper == 0) {
        close(p[0]);
        _exit(run_reaper(o, mirror, p[1]));
    }
    {
        int keep[] = {p[0], o->exit_fd, caller_fd};
        close_all_but(keep, 3);
    }
    quiet_stdio();
    forget_environment(); /* the reaper has its own copy, for the command */
    return run_mirror(o, reaper, p[0], caller_fd);
}

static int job_exec(struct opts *o)
{
    cloexec(o->status_fd);
    /* After the credentials change: a change of credentials clears the setting. */
    if (prepare_command(o) == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        if (o->caller > 0 && getppid() != o->caller)
            _exit(REAPER_LOST); /* the caller died before the signal could take effect */
        exec_command(o);
    }
    say_error(o->status_fd, "error", errno ? errno : ENOEXEC, o->exe ? o->exe : o->cmd[0]);
    return errno == ENOENT ? 127 : 126;
}

static void usage(void)
{
    fprintf(stderr, "usage: proctable-lineage reap|exec|keep --caller PID --status-fd N "
                    "[--exit-fd N] [--control-fd N] [--cgroup-parent DIR] [--home DIR] "
                    "[--exe PATH] [--setsid] [--terminal] [--ignore SIG,...] -- CMD...\n"
                    "(run by proctable's Lineage.spawn, not by hand)\n");
    exit(2);
}

int main(int argc, char **argv)
{
    struct opts o;
    int i;
    memset(&o, 0, sizeof o);
    o.status_fd = o.exit_fd = o.control_fd = -1;
    o.uid = o.gid = o.umask_ = -1;
    o.n_groups = -1;
    o.stdio[0] = o.stdio[1] = o.stdio[2] = -1;
    o.dir_fd = -1;
    o.ring = 1 << 20;
    o.orphan_timeout_ms = -1;
    o.orphan_grace_ms = 3000;
    if (argc < 2)
        usage();
    o.job = argv[1];
    for (i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            o.cmd = argv + i + 1;
            break;
        }
        if (strcmp(a, "--setsid") == 0) {
            o.setsid_ = 1;
            continue;
        }
        if (strcmp(a, "--terminal") == 0) {
            o.terminal = 1;
            continue;
        }
        if (strcmp(a, "--pipes") == 0) {
            o.pipes = 1;
            continue;
        }
        if (strcmp(a, "--stdin-pipe") == 0) {
            o.stdin_pipe = 1;
            continue;
        }
        if (i + 1 >= argc)
            usage();
        if (strcmp(a, "--caller") == 0)
            o.caller = (pid_t)parse_long(argv[++i], a);
        else if (strcmp(a, "--status-fd") == 0)
            o.status_fd = (int)parse_long(argv[++i], a);
        else if (strcmp(a, "--exit-fd") == 0)
            o.exit_fd = (int)parse_long(argv[++i], a);
        else if (strcmp(a, "--control-fd") == 0)
            o.control_fd = (int)parse_long(argv[++i], a);
        else if (strcmp(a, "--cgroup-parent") == 0)
            o.cgroup_parent = argv[++i];
        else if (strcmp(a, "--home") == 0)
            o.home = argv[++i];
        else if (strcmp(a, "--exe") == 0)
            o.exe = argv[++i];
        else if (strcmp(a, "--close-fd") == 0)
            close((int)parse_long(argv[++i], a)); /* how we were run: not the command's */
        else if (strcmp(a, "--dir-fd") == 0)
            o.dir_fd = (int)parse_long(argv[++i], a);
        else if (strcmp(a, "--name") == 0)
            o.name = argv[++i];
        else if (strcmp(a, "--key") == 0)
            o.key_hex = argv[++i];
        else if (strcmp(a, "--generation") == 0)
            o.generation = parse_long(argv[++i], a);
        else if (strcmp(a, "--ring") == 0)
            o.ring = parse_long(argv[++i], a);
        else if (strcmp(a, "--orphan-timeout-ms") == 0)
            o.orphan_timeout_ms = parse_long(argv[++i], a);
        else if (strcmp(a, "--orphan-grace-ms") == 0)
            o.orphan_grace_ms = parse_long(argv[++i], a);
        else if (strcmp(a, "--session-cgroup") == 0)
            o.session_cgroup = argv[++i];
        else if (strcmp(a, "--pty") == 0) {
            char *end;
            o.pty_rows = (int)strtol(argv[++i], &end, 10);
            if (*end != ',' || o.pty_rows <= 0)
                usage();
            o.pty_cols = (int)strtol(end + 1, &end, 10);
            if (*end || o.pty_cols <= 0)
                usage();
        }
        else if (strcmp(a, "--uid") == 0)
            o.uid = parse_long(argv[++i], a);
        else if (strcmp(a, "--gid") == 0)
            o.gid = parse_long(argv[++i], a);
        else if (strcmp(a, "--umask") == 0)
            o.umask_ = parse_long(argv[++i], a);
        else if (strcmp(a, "--groups") == 0) {
            char *g = argv[++i], *end;
            o.n_groups = 0;
            while (*g && o.n_groups < MAX_GROUPS) {
                o.groups[o.n_groups++] = (gid_t)strtoul(g, &end, 10);
                if (end == g || (*end && *end != ','))
                    usage();
                g = *end == ',' ? end + 1 : end;
            }
        }
        else if (strcmp(a, "--ignore") == 0) {
            char *s = argv[++i], *end;
            while (*s && o.n_ignored < MAX_IGNORED) {
                long sig = strtol(s, &end, 10);
                if (end == s || sig <= 0 || sig >= NSIG)
                    usage();
                o.ignored[o.n_ignored++] = (int)sig;
                s = *end == ',' ? end + 1 : end;
                if (*end && *end != ',')
                    usage();
            }
        } else
            usage();
    }
    if (!o.cmd || !o.cmd[0])
        usage();
    if (strcmp(o.job, "reap") == 0)
        return job_reap(&o);
    if (strcmp(o.job, "exec") == 0)
        return job_exec(&o);
    if (strcmp(o.job, "keep") == 0)
        return job_keep(&o);
    usage();
    return 2;
}
