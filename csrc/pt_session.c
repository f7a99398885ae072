/*
 * pt_session.c: `proctable-lineage keep`, the helper of a durable session: one
 * command (and everything it starts) that outlives the supervisor which started
 * it, until a supervisor ends it or re-adopts it.
 *
 *     supervisor --Popen--> launcher --fork--> session --fork--> keeper --fork+exec--> command
 *                           (exits at once)    "pt-session"      "pt-keeper"
 *
 *   launcher: the supervisor's Popen. It forks the session process and exits as
 *     soon as that one has left the supervisor's session and process group, so a
 *     kill of the supervisor's whole group (or its death) reaches neither helper.
 *   session (the guard): a subreaper above the keeper, in a session of its own
 *     (and in --session-cgroup, where one is named: out of the supervisor's
 *     cgroup, so that a service manager's stop of the supervisor does not kill
 *     it). It only waits for the keeper. When the keeper ends cleanly it ends
 *     too; when the keeper is killed, every orphan of the run re-parents to the
 *     session process, which kills them all (and the lineage's cgroup), reaps
 *     them until none is left, and writes <name>.end saying so: a session never
 *     runs on untracked.
 *   keeper: a subreaper too (so every orphan of the run stays below it), it makes
 *     the lineage's cgroup (--cgroup-parent), opens the command's terminal or
 *     pipes, starts the command, and then serves one supervisor at a time on the
 *     Unix socket <name>.sock in the sessions folder (--dir-fd; peers of another
 *     uid are refused). It reads the command's output into a ring of --ring
 *     bytes, keeps the command's exit status, and sends both to the supervisor:
 *     paced by it while one is attached (no byte dropped that it has not been
 *     sent), dropping the oldest while none is. A supervisor that has torn the
 *     lineage down sends "release": the keeper then drains the output, says "end"
 *     and exits once nothing is left below it. Without a supervisor for
 *     --orphan-timeout-ms, or on SIGTERM, it tears the lineage down itself
 *     (SIGTERM, --orphan-grace-ms, SIGKILL, until nothing is left below it) and
 *     writes <name>.end.
 *
 * Status line on --status-fd (from the keeper): "ok <keeper> <command>
 * <command start> <inside> <pidfs handle or 0> <cgroup or -> <session pid>
 * <session start> <keeper start>", or "error <errno> <message>", or
 * "nosubreaper <errno> <message>".
 *
 * Frames on the socket, both ways: a 16-byte header (u32 payload length, u8 type,
 * u8 stream, u16 zero, u64 offset; host byte order: both ends are on this
 * machine), then the payload. From the supervisor: 'a' attach (offset: the
 * first output byte wanted; ~0: from the last one acknowledged), 'k' ack
 * (offset: every byte before it was delivered), 't' tail (offset: since;
 * payload: the most bytes wanted, u64), 'r' release, 'e' end of input (close the
 * stdin pipe), 'm' mode (payload "drop" or "block": whether the output waits for
 * the supervisor). From the keeper: 'H' hello (text lines; the input fd, a pty
 * master or the stdin pipe's write end, rides along with SCM_RIGHTS), 'O' output
 * (stream 1 stdout, 2 stderr, 3 pty; offset: its first byte's place in the
 * generation's output), 'X' the command's exit (payload: the raw wait status, in
 * decimal), 'T' tail's answer (offset: its first byte), 'E' end (released,
 * drained: nothing follows).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "pt_helper.h"

#ifndef PR_SET_CHILD_SUBREAPER
#define PR_SET_CHILD_SUBREAPER 36
#endif

#define HDR 16
#define FRAME_MAX (64 * 1024)
#define CTL_MAX (8 << 20)   /* control frames queued for a peer that does not read */
#define TAIL_MAX (64 << 20) /* the most one tail answer carries */
#define MAX_BELOW 4096
#define NEWCOMERS 4

enum { S_STDOUT = 1, S_STDERR = 2, S_PTY = 3 };

struct hdr {
    uint32_t len;
    uint8_t type;
    uint8_t stream;
    uint16_t zero;
    uint64_t off;
};

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* -- the ring of output ----------------------------------------------------------
 *
 * Chunks as read, each a 16-byte header (its offset, length and stream) and its
 * bytes, in a circular buffer; the oldest go first when room is needed. Offsets
 * count the command's bytes since the generation started (dropped ones too), so a
 * consumer sees a gap as a jump of the offset. */

struct chunk {
    uint64_t off;
    uint32_t len;
    uint8_t stream;
    uint8_t pad[3];
};

struct ring {
    char *buf;
    size_t cap, tail, head, used, count;
    uint64_t low, high;  /* the oldest byte kept, the next byte's offset */
    uint64_t dropped;    /* bytes that left the ring unsent to anyone */
};

static void ring_copy_out(const struct ring *r, size_t pos, void *dst, size_t n)
{
    size_t first = r->cap - pos < n ? r->cap - pos : n;
    memcpy(dst, r->buf + pos, first);
    if (n > first)
        memcpy((char *)dst + first, r->buf, n - first);
}

static void ring_copy_in(struct ring *r, size_t pos, const void *src, size_t n)
{
    size_t first = r->cap - pos < n ? r->cap - pos : n;
    memcpy(r->buf + pos, src, first);
    if (n > first)
        memcpy(r->buf, (const char *)src + first, n - first);
}

static struct chunk ring_at(const struct ring *r, size_t pos)
{
    struct chunk c;
    ring_copy_out(r, pos, &c, sizeof c);
    return c;
}

/* The oldest chunk leaves. */
static void ring_drop(struct ring *r)
{
    struct chunk c = ring_at(r, r->tail);
    r->tail = (r->tail + HDR + c.len) % r->cap;
    r->used -= HDR + c.len;
    r->count--;
    r->low = r->count ? ring_at(r, r->tail).off : r->high;
}

static void ring_push(struct ring *r, int stream, const char *data, size_t n)
{
    struct chunk c;
    while (r->cap - r->used < HDR + n)
        ring_drop(r);
    memset(&c, 0, sizeof c);
    c.off = r->high;
    c.len = (uint32_t)n;
    c.stream = (uint8_t)stream;
    ring_copy_in(r, r->head, &c, sizeof c);
    ring_copy_in(r, (r->head + HDR) % r->cap, data, n);
    if (!r->count)
        r->low = c.off;
    r->head = (r->head + HDR + n) % r->cap;
    r->used += HDR + n;
    r->count++;
    r->high += n;
}

/* -- the keeper ------------------------------------------------------------------ */

/* A cached place in the ring: where the chunk holding some offset starts. */
struct cur {
    size_t pos;
    uint64_t off;   /* that chunk's offset (it left the ring once low passed it) */
    int valid;
};

struct keeper {
    const struct opts *o;
    struct ring ring;
    size_t read_size;
    pid_t cmd, session;
    long long cmd_start, session_start, self_start;
    unsigned long long handle;
    int cmd_ended, cmd_status;
    int to_session;             /* lines for the session process */
    int lsock;                  /* the listening socket */
    int peer;                   /* the supervisor attached, or -1 */
    int attached;               /* it asked for output ('a') */
    int drop;                   /* mode: drop the oldest rather than wait for it */
    uint64_t sent;              /* the next output byte to send */
    struct cur sent_at, acked_at; /* where the chunks holding sent and acked are */
    uint64_t acked;             /* every byte before it was delivered */
    int told_exit;              /* 'X' went to the current peer */
    char in[HDR + 4096];        /* a frame being received */
    size_t in_len;
    char out[HDR + FRAME_MAX];  /* an output frame being sent */
    size_t out_len, out_pos;
    char *ctl;                  /* control frames queued for the peer */
    size_t ctl_len, ctl_pos, ctl_cap;
    int fd_out[3];              /* read ends: stdout, stderr, pty master (-1: none or EOF) */
    struct {                    /* connections whose first frame has not come yet */
        int fd;
        size_t len;
        char in[HDR + 8];
    } newcomer[NEWCOMERS];
    int input;                  /* stdin pipe's write end or pty master, for the peer */
    int released;
    int first_wait;             /* the supervisor that started us has not attached yet */
    int caller_fd;              /* a pidfd of it meanwhile (its death ends the wait) */
    long long detached_at;      /* when the last peer left (for --orphan-timeout-ms) */
    char cgroup[PATH_MAX];
    int inside;
};

static void tell_session(struct keeper *k, const char *line)
{
    say(k->to_session, line);
}

static void keeper_cgroup_remove(struct keeper *k)
{
    int i;
    if (!k->cgroup[0] || k->inside)
        return;
    for (i = 0; i < 100; i++) {
        if (rmdir(k->cgroup) == 0 || errno == ENOENT)
            break;
        if (errno != EBUSY)
            break;
        nap_ms(10);
    }
    k->cgroup[0] = 0;
}

static void drop_peer(struct keeper *k)
{
    if (k->peer >= 0)
        close(k->peer);
    k->peer = -1;
    k->attached = 0;
    k->drop = 0;
    k->in_len = 0;
    k->out_len = k->out_pos = 0;
    k->ctl_len = k->ctl_pos = 0;
    k->told_exit = 0;
    k->detached_at = mono_ms();
}

/* Queue a control frame for the peer; dropped with the peer when it reads nothing. */
static void queue_ctl(struct keeper *k, int type, int stream, uint64_t off, const void *data,
                      size_t len)
{
    struct hdr h;
    if (k->peer < 0)
        return;
    if (k->ctl_pos == k->ctl_len)
        k->ctl_pos = k->ctl_len = 0;
    if (k->ctl_len + HDR + len > k->ctl_cap) {
        size_t want = k->ctl_len + HDR + len, cap = k->ctl_cap ? k->ctl_cap : 4096;
        char *grown;
        if (want - k->ctl_pos > CTL_MAX + TAIL_MAX) {
            drop_peer(k); /* it reads nothing of what it asks for */
            return;
        }
        if (k->ctl_pos) { /* compact first */
            memmove(k->ctl, k->ctl + k->ctl_pos, k->ctl_len - k->ctl_pos);
            k->ctl_len -= k->ctl_pos;
            k->ctl_pos = 0;
            want = k->ctl_len + HDR + len;
        }
        while (cap < want)
            cap *= 2;
        grown = realloc(k->ctl, cap);
        if (!grown) {
            drop_peer(k);
            return;
        }
        k->ctl = grown;
        k->ctl_cap = cap;
    }
    memset(&h, 0, sizeof h);
    h.len = (uint32_t)len;
    h.type = (uint8_t)type;
    h.stream = (uint8_t)stream;
    h.off = off;
    memcpy(k->ctl + k->ctl_len, &h, HDR);
    if (len)
        memcpy(k->ctl + k->ctl_len + HDR, data, len);
    k->ctl_len += HDR + len;
}

static void queue_exit(struct keeper *k)
{
    char text[32];
    int n;
    if (!k->cmd_ended || k->told_exit || !k->attached)
        return;
    n = snprintf(text, sizeof text, "%d", k->cmd_status);
    queue_ctl(k, 'X', 0, 0, text, (size_t)n);
    k->told_exit = 1;
}

/* The chunk holding offset `at` (or the first after it): its position, or -1. */
static long find_chunk(const struct ring *r, uint64_t at)
{
    size_t pos = r->tail, i;
    for (i = 0; i < r->count; i++) {
        struct chunk c = ring_at(r, pos);
        if (c.off + c.len > at)
            return (long)pos;
        pos = (pos + HDR + c.len) % r->cap;
    }
    return -1;
}

/* The chunk holding offset at (or the first after it), or -1: from the cached place c
 * where it is still in the ring (a walk from the tail costs one step a chunk, and a
 * terminal's output comes in chunks of a few bytes), else found again. */
static long locate(const struct ring *r, struct cur *c, uint64_t at)
{
    long pos;
    if (c->valid && c->off >= r->low && c->off < r->high && c->off <= at) {
        /* (only forward from it: a place after `at`, as a re-attach's from the last
         * acknowledged byte leaves it, would skip the bytes in between) */
        size_t p = c->pos;
        struct chunk ch = ring_at(r, p);
        if (ch.off == c->off) {
            while (ch.off + ch.len <= at) { /* at is past it: step on */
                if (ch.off + ch.len >= r->high)
                    break;
                p = (p + HDR + ch.len) % r->cap;
                ch = ring_at(r, p);
            }
            if (ch.off + ch.len > at) {
                c->pos = p;
                c->off = ch.off;
                return (long)p;
            }
        }
    }
    pos = find_chunk(r, at);
    c->valid = pos >= 0;
    if (pos >= 0) {
        c->pos = (size_t)pos;
        c->off = ring_at(r, (size_t)pos).off;
    }
    return pos;
}

static long cursor(struct keeper *k)
{
    return locate(&k->ring, &k->sent_at, k->sent);
}

/* Fill the output frame with the next bytes to send, if any. */
static int next_output_frame(struct keeper *k)
{
    struct ring *r = &k->ring;
    long pos;
    struct chunk c;
    size_t skip, n;
    struct hdr h;
    if (k->sent < r->low)
        k->sent = r->low; /* dropped while nobody (or a dropping peer) read: a gap */
    if (k->sent >= r->high)
        return 0;
    pos = cursor(k);
    if (pos < 0)
        return 0;
    c = ring_at(r, (size_t)pos);
    if (c.off > k->sent)
        k->sent = c.off;
    skip = (size_t)(k->sent - c.off);
    n = c.len - skip;
    if (n > FRAME_MAX)
        n = FRAME_MAX;
    memset(&h, 0, sizeof h);
    h.len = (uint32_t)n;
    h.type = 'O';
    h.stream = c.stream;
    h.off = k->sent;
    memcpy(k->out, &h, HDR);
    ring_copy_out(r, ((size_t)pos + HDR + skip) % r->cap, k->out + HDR, n);
    k->out_len = HDR + n;
    k->out_pos = 0;
    k->sent += n;
    return 1;
}

/* Send what can be sent without blocking. */
static void pump(struct keeper *k)
{
    while (k->peer >= 0) {
        ssize_t n;
        if (k->out_pos == k->out_len) {
            k->out_len = k->out_pos = 0;
            if (k->ctl_pos < k->ctl_len) {
                n = send(k->peer, k->ctl + k->ctl_pos, k->ctl_len - k->ctl_pos,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n > 0) {
                    k->ctl_pos += (size_t)n;
                    continue;
                }
                if (n < 0 && (errno == EAGAIN || errno == EINTR))
                    return;
                drop_peer(k);
                return;
            }
            if (!k->attached || !next_output_frame(k))
                return;
        }
        n = send(k->peer, k->out + k->out_pos, k->out_len - k->out_pos,
                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            k->out_pos += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        drop_peer(k);
        return;
    }
}

static int want_send(const struct keeper *k)
{
    return k->peer >= 0 && (k->out_pos < k->out_len || k->ctl_pos < k->ctl_len ||
                            (k->attached && k->sent < k->ring.high));
}

/* Whether one more read may be made: always where nobody waits for the output (no
 * supervisor, or one that chose to drop: the oldest go), else only where it fits
 * without dropping a byte the supervisor has not acknowledged as delivered (bytes it
 * was sent and holds undelivered would be lost with it, were it killed). Until the
 * supervisor that started us attaches, its bytes wait for it as well. */
static int may_read(struct keeper *k)
{
    struct ring *r = &k->ring;
    size_t need = HDR + k->read_size, droppable;
    long pos;
    if (!k->first_wait && (k->peer < 0 || k->drop))
        return 1;
    if (!k->attached) /* (nothing was sent yet to this one: it asks from where) */
        return r->cap - r->used >= need;
    if (k->acked >= r->high)
        droppable = r->used;
    else if (k->acked <= r->low)
        droppable = 0;
    else {
        pos = locate(r, &k->acked_at, k->acked);
        droppable = pos < 0 ? r->used : ((size_t)pos + r->cap - r->tail) % r->cap;
    }
    return r->cap - r->used + droppable >= need;
}

static void hello(struct keeper *k)
{
    char text[PATH_MAX + 1024];
    struct hdr h;
    struct iovec iov[2];
    struct msghdr msg;
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } cm;
    int n;
    long long t0;
    const char *input = k->input < 0 ? "none" : k->o->pty_rows ? "pty" : "pipe";
    n = snprintf(text, sizeof text,
                 "version 1\nkey %s\ngeneration %ld\nkeeper %d %lld\nsession %d %lld\n"
                 "command %d %lld %llu\nstatus %s %d\nring %zu %llu %llu %llu %llu\n"
                 "cgroup %s\ninput %s\nreleased %d\n",
                 k->o->key_hex ? k->o->key_hex : "-", k->o->generation, (int)getpid(),
                 k->self_start, (int)k->session, k->session_start, (int)k->cmd, k->cmd_start,
                 k->handle, k->cmd_ended ? "exited" : "running", k->cmd_ended ? k->cmd_status : 0,
                 k->ring.cap, (unsigned long long)k->ring.low, (unsigned long long)k->ring.high,
                 (unsigned long long)k->acked, (unsigned long long)k->ring.dropped,
                 k->cgroup[0] ? k->cgroup : "-", input, k->released);
    if (n < 0 || (size_t)n >= sizeof text)
        n = (int)strlen(text);
    memset(&h, 0, sizeof h);
    h.len = (uint32_t)n;
    h.type = 'H';
    iov[0].iov_base = &h;
    iov[0].iov_len = HDR;
    iov[1].iov_base = text;
    iov[1].iov_len = (size_t)n;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    if (k->input >= 0) {
        struct cmsghdr *c;
        memset(&cm, 0, sizeof cm);
        msg.msg_control = cm.buf;
        msg.msg_controllen = sizeof cm.buf;
        c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &k->input, sizeof(int));
    }
    /* A new peer's socket is empty: the hello fits; bounded all the same. */
    t0 = mono_ms();
    for (;;) {
        ssize_t sent = sendmsg(k->peer, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent == (ssize_t)(HDR + (size_t)n))
            return;
        if (sent < 0 && (errno == EAGAIN || errno == EINTR) && mono_ms() - t0 < 2000) {
            struct pollfd pf = {k->peer, POLLOUT, 0};
            poll(&pf, 1, 100);
            continue;
        }
        drop_peer(k); /* (a part of a hello cannot be finished without its fd) */
        return;
    }
}

/* The tail's answer: a whole 'T' frame (header included) in a malloc'd buffer, its
 * length in *len; NULL without memory. */
static char *tail_frame(struct keeper *k, uint64_t since, uint64_t most, size_t *len)
{
    struct ring *r = &k->ring;
    uint64_t from = since < r->low ? r->low : since, total;
    char *buf;
    size_t got = 0, pos;
    long start;
    size_t i;
    struct hdr h;
    if (most > TAIL_MAX)
        most = TAIL_MAX;
    total = from < r->high ? r->high - from : 0; /* (past the end: nothing, at from) */
    if (total > most)
        total = most;
    buf = malloc(HDR + (size_t)total);
    if (!buf)
        return NULL;
    start = total ? find_chunk(r, from) : -1;
    pos = start < 0 ? 0 : (size_t)start;
    for (i = 0; start >= 0 && i < r->count && got < total; i++) {
        struct chunk c = ring_at(r, pos);
        size_t skip = c.off < from ? (size_t)(from - c.off) : 0, n = c.len - skip;
        if (n > total - got)
            n = (size_t)(total - got);
        ring_copy_out(r, (pos + HDR + skip) % r->cap, buf + HDR + got, n);
        got += n;
        pos = (pos + HDR + c.len) % r->cap;
    }
    memset(&h, 0, sizeof h);
    h.len = (uint32_t)got;
    h.type = 'T';
    h.off = from;
    memcpy(buf, &h, HDR);
    *len = HDR + got;
    return buf;
}

static void answer_tail(struct keeper *k, uint64_t since, uint64_t most)
{
    size_t len;
    char *buf = tail_frame(k, since, most, &len);
    struct hdr h;
    if (!buf) {
        queue_ctl(k, 'T', 0, since, NULL, 0);
        return;
    }
    memcpy(&h, buf, HDR);
    queue_ctl(k, 'T', 0, h.off, buf + HDR, len - HDR);
    free(buf);
}

static void handle_frame(struct keeper *k, const struct hdr *h, const char *payload)
{
    switch (h->type) {
    case 'a':
        k->attached = 1;
        k->sent_at.valid = 0;
        if (k->first_wait) {
            k->first_wait = 0;
            close(k->caller_fd);
            k->caller_fd = -1;
        }
        k->sent = h->off == UINT64_MAX ? k->acked : h->off;
        k->out_len = k->out_pos = 0;
        hello(k);
        if (k->peer >= 0)
            queue_exit(k);
        break;
    case 'k':
        if (h->off > k->acked && h->off <= k->ring.high)
            k->acked = h->off;
        break;
    case 't': {
        uint64_t most = 0;
        if (h->len >= 8)
            memcpy(&most, payload, 8);
        answer_tail(k, h->off, most);
        break;
    }
    case 'r':
        k->released = 1;
        break;
    case 'e':
        if (k->input >= 0 && !k->o->pty_rows) {
            close(k->input);
            k->input = -1;
        }
        break;
    case 'm':
        k->drop = h->len >= 4 && memcmp(payload, "drop", 4) == 0;
        break;
    default:
        drop_peer(k); /* not our protocol */
    }
}

static void read_peer(struct keeper *k)
{
    for (;;) {
        ssize_t n;
        struct hdr h;
        if (k->peer < 0)
            return;
        n = recv(k->peer, k->in + k->in_len, sizeof k->in - k->in_len, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            drop_peer(k);
            return;
        }
        if (n < 0)
            return;
        k->in_len += (size_t)n;
        while (k->peer >= 0 && k->in_len >= HDR) {
            memcpy(&h, k->in, HDR);
            if (h.len > sizeof k->in - HDR) {
                drop_peer(k);
                return;
            }
            if (k->in_len < HDR + h.len)
                break;
            handle_frame(k, &h, k->in + HDR);
            if (k->peer < 0)
                return;
            memmove(k->in, k->in + HDR + h.len, k->in_len - HDR - h.len);
            k->in_len -= HDR + h.len;
        }
    }
}

static void accept_peer(struct keeper *k)
{
    for (;;) {
        struct ucred cred;
        socklen_t len = sizeof cred;
        int fd = accept4(k->lsock, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            return;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
            cred.uid != geteuid()) {
            close(fd); /* only a supervisor of our own uid */
            continue;
        }
        /* Its first frame says what it is: a supervisor that attaches ('a': it
         * replaces the one before, as the state directory's lock holder), or a query
         * ('t': answered on its own connection, so a tail never waits behind output
         * the attached supervisor is slow to read). */
        {
            int i, slot = 0;
            for (i = 0; i < NEWCOMERS; i++)
                if (k->newcomer[i].fd < 0) {
                    slot = i;
                    break;
                }
            if (i == NEWCOMERS) /* all taken: the first goes */
                close(k->newcomer[slot].fd);
            k->newcomer[slot].fd = fd;
            k->newcomer[slot].len = 0;
        }
    }
}

/* A newcomer's bytes: once its first frame is whole, it attaches or is answered. */
static void read_newcomer(struct keeper *k, int i)
{
    struct hdr h;
    int fd = k->newcomer[i].fd;
    ssize_t n = recv(fd, k->newcomer[i].in + k->newcomer[i].len,
                     sizeof k->newcomer[i].in - k->newcomer[i].len, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        close(fd);
        k->newcomer[i].fd = -1;
        return;
    }
    if (n < 0)
        return;
    k->newcomer[i].len += (size_t)n;
    if (k->newcomer[i].len < HDR)
        return;
    memcpy(&h, k->newcomer[i].in, HDR);
    if (h.type == 'a' && h.len == 0) {
        k->newcomer[i].fd = -1;
        if (k->peer >= 0)
            drop_peer(k);
        k->peer = fd;
        k->detached_at = 0;
        handle_frame(k, &h, NULL);
        return;
    }
    if (h.type == 't' && h.len == 8) {
        uint64_t most;
        size_t len, sent = 0;
        char *buf;
        long long deadline = mono_ms() + 2000;
        if (k->newcomer[i].len < HDR + 8)
            return;
        memcpy(&most, k->newcomer[i].in + HDR, 8);
        buf = tail_frame(k, h.off, most, &len);
        while (buf && sent < len && mono_ms() < deadline) { /* bounded: it asked, it reads */
            struct pollfd pf = {fd, POLLOUT, 0};
            ssize_t w = send(fd, buf + sent, len - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0)
                sent += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR)
                break;
            else
                poll(&pf, 1, 100);
        }
        free(buf);
    }
    close(fd);
    k->newcomer[i].fd = -1;
}

static int stream_of(int i)
{
    return i == 0 ? S_STDOUT : i == 1 ? S_STDERR : S_PTY;
}

/* Read one chunk from output fd i; 0 at its end. */
static int read_output(struct keeper *k, int i)
{
    char buf[FRAME_MAX];
    ssize_t n = read(k->fd_out[i], buf, k->read_size < sizeof buf ? k->read_size : sizeof buf);
    if (n > 0) {
        uint64_t low = k->ring.low;
        ring_push(&k->ring, stream_of(i), buf, (size_t)n);
        if (k->ring.low > low && k->sent < k->ring.low) /* dropped unsent */
            k->ring.dropped += k->ring.low - (k->sent > low ? k->sent : low);
        return 1;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 1;
    close(k->fd_out[i]); /* EOF, or EIO: no slave side open any more */
    k->fd_out[i] = -1;
    return 0;
}

static void reap(struct keeper *k)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            return;
        if (pid == k->cmd && !k->cmd_ended) {
            char line[32];
            k->cmd_ended = 1;
            k->cmd_status = st;
            snprintf(line, sizeof line, "exit %d\n", st);
            tell_session(k, line);
            queue_exit(k);
        }
    }
}

/* Every process below us, breadth first (our children's children files). */
static int below(pid_t *out, int cap)
{
    int n = children(out, cap), i;
    for (i = 0; i < n && n < cap; i++) {
        int got = children_of(out[i], out + n, cap - n);
        if (got > 0)
            n += got;
    }
    return n;
}

/* Kill everything below us (and in cgroup, if given) and reap until nothing is left;
 * 1 once proven (no child left, the cgroup unpopulated), 0 past the bound. */
static int kill_below(const char *cgroup, long long deadline_ms)
{
    pid_t kids[MAX_BELOW];
    if (cgroup && cgroup[0])
        write_file(cgroup, "cgroup.kill", "1");
    for (;;) {
        int n = children(kids, MAX_BELOW), i, st, any = 0;
        pid_t pid;
        for (i = 0; i < n; i++) {
            kill(kids[i], SIGKILL); /* our unreaped children: their pids are theirs */
            any = 1;
        }
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
            ;
        if (!any && pid < 0 && errno == ECHILD) {
            if (!cgroup || !cgroup[0])
                return 1;
            {
                char ev[256];
                int fd;
                ssize_t got;
                snprintf(ev, sizeof ev, "%s/cgroup.events", cgroup);
                fd = open(ev, O_RDONLY | O_CLOEXEC);
                if (fd < 0)
                    return 1; /* gone: nothing in it */
                got = read(fd, ev, sizeof ev - 1);
                close(fd);
                ev[got > 0 ? got : 0] = 0;
                if (strstr(ev, "populated 0"))
                    return 1;
                write_file(cgroup, "cgroup.kill", "1");
            }
        }
        if (mono_ms() > deadline_ms)
            return 0;
        nap_ms(5);
    }
}

static void write_end(int dir_fd, const char *name, const char *text)
{
    char tmp[PATH_MAX], fin[PATH_MAX];
    int fd;
    snprintf(tmp, sizeof tmp, "%s.end.tmp", name);
    snprintf(fin, sizeof fin, "%s.end", name);
    fd = openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    say(fd, text);
    close(fd);
    renameat(dir_fd, tmp, dir_fd, fin);
}

static void unlink_socket(int dir_fd, const char *name)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.sock", name);
    unlinkat(dir_fd, path, 0);
}

/* Our own teardown (no supervisor came in time, or SIGTERM): SIGTERM everything
 * below, wait out the grace, SIGKILL what is left, until nothing is. */
static void keeper_teardown(struct keeper *k, const char *why)
{
    pid_t all[MAX_BELOW];
    long long deadline = mono_ms() + k->o->orphan_grace_ms;
    int n, i, proven, natural = k->cmd_ended;
    char text[256];
    if (k->cgroup[0] && !k->inside)
        write_file(k->cgroup, "cgroup.freeze", "1");
    n = below(all, MAX_BELOW);
    for (i = 0; i < n; i++)
        kill(all[i], SIGTERM); /* (a pid below us that exited and was reused elsewhere
                                  cannot be here: we reap our children ourselves) */
    if (k->cgroup[0] && !k->inside)
        write_file(k->cgroup, "cgroup.freeze", "0");
    for (i = 0; i < n; i++)
        kill(all[i], SIGCONT);
    while (mono_ms() < deadline) {
        pid_t kids[4];
        reap(k);
        if (children(kids, 4) == 0)
            break;
        nap_ms(10);
    }
    proven = kill_below(k->inside ? NULL : k->cgroup, mono_ms() + 10000);
    reap(k);
    /* "<why> <raw status or -> <proven|unproven> <natural|killed>": natural where the
     * command had ended by itself before this teardown began. */
    if (k->cmd_ended)
        snprintf(text, sizeof text, "%s %d %s %s\n", why, k->cmd_status,
                 proven ? "proven" : "unproven", natural ? "natural" : "killed");
    else
        snprintf(text, sizeof text, "%s - %s killed\n", why, proven ? "proven" : "unproven");
    write_end(k->o->dir_fd, k->o->name, text);
    keeper_cgroup_remove(k);
    unlink_socket(k->o->dir_fd, k->o->name);
}

/* Released, and nothing is left below us: the output's last bytes (paced by the
 * supervisor as before: none dropped that it was not sent), "end", out. Bounded: a
 * supervisor that stops reading for 10 s is dropped. */
static void keeper_finish(struct keeper *k)
{
    long long deadline = mono_ms() + 10000;
    int i, open_fds;
    for (;;) {
        struct pollfd pf[4];
        int npf = 0;
        open_fds = 0;
        for (i = 0; i < 3; i++) {
            if (k->fd_out[i] < 0)
                continue;
            open_fds = 1;
            while (k->fd_out[i] >= 0 && may_read(k)) {
                char buf[FRAME_MAX];
                ssize_t n = read(k->fd_out[i], buf, k->read_size);
                if (n > 0) {
                    ring_push(&k->ring, stream_of(i), buf, (size_t)n);
                    continue;
                }
                if (n < 0 && errno == EINTR)
                    continue;
                /* EOF, EIO, or EAGAIN: every writer is gone, so what is not there now
                 * never comes */
                close(k->fd_out[i]);
                k->fd_out[i] = -1;
            }
        }
        pump(k);
        if (!open_fds || k->peer < 0 || mono_ms() > deadline)
            break;
        /* Wait for room to send, or for the supervisor's acknowledgements (what it
         * delivered makes room for the rest), never spinning. */
        pf[npf++] = (struct pollfd){k->peer, (short)(POLLIN | (want_send(k) ? POLLOUT : 0)), 0};
        poll(pf, (nfds_t)npf, 100);
        if (pf[0].revents & (POLLIN | POLLHUP | POLLERR))
            read_peer(k);
    }
    for (i = 0; i < 3; i++)
        if (k->fd_out[i] >= 0) {
            close(k->fd_out[i]);
            k->fd_out[i] = -1;
        }
    queue_exit(k);
    while (k->peer >= 0 && want_send(k) && mono_ms() < deadline) {
        struct pollfd pf = {k->peer, POLLOUT, 0};
        pump(k);
        if (want_send(k))
            poll(&pf, 1, 100);
    }
    if (k->peer >= 0) {
        queue_ctl(k, 'E', 0, k->ring.high, NULL, 0);
        while (k->peer >= 0 && want_send(k) && mono_ms() < deadline) {
            struct pollfd pf = {k->peer, POLLOUT, 0};
            pump(k);
            if (want_send(k))
                poll(&pf, 1, 100);
        }
    }
    keeper_cgroup_remove(k);
    unlink_socket(k->o->dir_fd, k->o->name);
}

static int open_terminal(const struct opts *o, int *master, int *slave)
{
    struct winsize ws;
    char name[128];
    int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC), s;
    if (m < 0)
        return -1;
    if (grantpt(m) != 0 || unlockpt(m) != 0 || ptsname_r(m, name, sizeof name) != 0) {
        close(m);
        return -1;
    }
    s = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (s < 0) {
        close(m);
        return -1;
    }
    memset(&ws, 0, sizeof ws);
    ws.ws_row = (unsigned short)o->pty_rows;
    ws.ws_col = (unsigned short)o->pty_cols;
    ioctl(m, TIOCSWINSZ, &ws);
    *master = m;
    *slave = s;
    return 0;
}

static int bind_socket(const struct opts *o)
{
    struct sockaddr_un addr;
    mode_t old;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), rc;
    if (fd < 0)
        return -1;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    /* Through the folder's fd: a state directory's path may be longer than a socket
     * address can hold. */
    if ((size_t)snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/%s.sock",
                         o->dir_fd, o->name) >= sizeof addr.sun_path) {
        close(fd);
        errno = ENAMETOOLONG;
        return -1;
    }
    unlink_socket(o->dir_fd, o->name); /* a stale one of an earlier keeper of this name */
    old = umask(0177);
    rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
    umask(old);
    if (rc != 0 || listen(fd, 8) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static int run_keeper(const struct opts *o_in, int to_session, pid_t session)
{
    static struct keeper kk;
    struct keeper *k = &kk;
    struct opts o = *o_in;
    int slave = -1, pipes[3][2], i, sfd, cgroup_fd = -1, spawn_error = 0, term = 0;
    char line[PATH_MAX + 256];
    sigset_t all;

    memset(k, 0, sizeof *k);
    k->o = &o;
    k->to_session = to_session;
    k->session = session;
    k->peer = -1;
    k->input = -1;
    k->fd_out[0] = k->fd_out[1] = k->fd_out[2] = -1;
    for (i = 0; i < NEWCOMERS; i++)
        k->newcomer[i].fd = -1;
    for (i = 0; i < 3; i++)
        pipes[i][0] = pipes[i][1] = -1;
    prctl(PR_SET_NAME, "pt-keeper", 0, 0, 0);
    k->self_start = start_time(getpid());
    k->session_start = start_time(session);
    o.own_group = 1;
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
        say_error(o.status_fd, "nosubreaper", errno, "PR_SET_CHILD_SUBREAPER");
        return 126;
    }
    k->ring.cap = (size_t)o.ring;
    k->ring.buf = malloc(k->ring.cap); /* its pages are touched only as output comes */
    if (!k->ring.buf) {
        say_error(o.status_fd, "error", ENOMEM, "the session's output ring");
        return 126;
    }
    k->read_size = k->ring.cap / 4 > FRAME_MAX ? FRAME_MAX : k->ring.cap / 4 - HDR;
    k->lsock = bind_socket(&o);
    if (k->lsock < 0) {
        say_error(o.status_fd, "error", errno, "cannot make the session's socket");
        return 126;
    }
    /* The command's stdio. */
    if (o.pty_rows) {
        int master;
        if (open_terminal(&o, &master, &slave) != 0) {
            say_error(o.status_fd, "error", errno, "cannot open a pseudo-terminal");
            return 126;
        }
        k->fd_out[2] = master;
        k->input = fcntl(master, F_DUPFD_CLOEXEC, 3); /* its own fd: the reading one
                                                         closes at EIO */
        o.stdio[0] = o.stdio[1] = o.stdio[2] = slave;
        o.terminal = 1;
    } else {
        if (o.pipes)
            for (i = 1; i < 3; i++) {
                if (pipe2(pipes[i], O_CLOEXEC) != 0) {
                    say_error(o.status_fd, "error", errno, "cannot make the output pipes");
                    return 126;
                }
                fcntl(pipes[i][0], F_SETPIPE_SZ, 1 << 20);
                k->fd_out[i - 1] = pipes[i][0];
                o.stdio[i] = pipes[i][1];
            }
        if (o.stdin_pipe) {
            if (pipe2(pipes[0], O_CLOEXEC) != 0) {
                say_error(o.status_fd, "error", errno, "cannot make the input pipe");
                return 126;
            }
            k->input = pipes[0][1];
            o.stdio[0] = pipes[0][0];
        }
    }
    /* The lineage's cgroup (cgroup mode), named to the session process first. */
    if (o.cgroup_parent) {
        for (i = 0; i < 1000; i++) {
            if (i == 0)
                snprintf(k->cgroup, sizeof k->cgroup, "%s/proctable-%d-%d", o.cgroup_parent,
                         (int)o.caller, (int)getpid());
            else
                snprintf(k->cgroup, sizeof k->cgroup, "%s/proctable-%d-%d-%d",
                         o.cgroup_parent, (int)o.caller, (int)getpid(), i);
            snprintf(line, sizeof line, "cgroup %s\n", k->cgroup);
            tell_session(k, line);
            if (mkdir(k->cgroup, 0755) == 0) {
                /* The session's own mark on it: a record naming this cgroup is believed
                 * only where the mark is its session's (pt-session.c's users: see
                 * _own_lineage_cgroup in supervise/_durable.py). Optional: a kernel
                 * without user xattrs on cgroupfs (before 5.7) refuses it. */
                const char *mark = getenv("PROCTABLE_SESSION");
                if (mark)
                    setxattr(k->cgroup, "user.proctable.session", mark, strlen(mark), 0);
                break;
            }
            if (errno != EEXIST || i == 999) {
                int e = errno;
                k->cgroup[0] = 0;
                tell_session(k, "cgroup -\n");
                say_error(o.status_fd, "error", e, "cannot make the lineage's cgroup");
                unlink_socket(o.dir_fd, o.name);
                return 126;
            }
        }
        cgroup_fd = open(k->cgroup, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }
    sigfillset(&all);
    sfd = signalfd(-1, &all, SFD_CLOEXEC | SFD_NONBLOCK);
    k->cmd = cgroup_fd >= 0 ? spawn_command(&o, cgroup_fd) : -1;
    if (cgroup_fd >= 0 && k->cmd < 0 && errno != ENOSYS && errno != EPERM && errno != E2BIG &&
        errno != EINVAL) {
        spawn_error = errno;
    } else if (k->cmd < 0 && o.cgroup_parent) {
        if (!write_file(k->cgroup, "cgroup.procs", "0")) {
            int e = errno ? errno : EACCES;
            keeper_cgroup_remove(k);
            say_error(o.status_fd, "error", e, "cannot move into the lineage's cgroup");
            unlink_socket(o.dir_fd, o.name);
            return 126;
        }
        k->inside = 1;
        k->cmd = spawn_command(&o, -1);
        spawn_error = k->cmd < 0 ? errno : 0;
        if (o.home && write_file(o.home, "cgroup.procs", "0"))
            k->inside = 0;
    } else if (k->cmd < 0) {
        k->cmd = spawn_command(&o, -1);
        spawn_error = k->cmd < 0 ? errno : 0;
    }
    if (cgroup_fd >= 0)
        close(cgroup_fd);
    /* The command has its ends now (or never will). */
    if (slave >= 0)
        close(slave);
    for (i = 0; i < 3; i++) {
        int theirs = i == 0 ? pipes[0][0] : pipes[i][1];
        if (theirs >= 0)
            close(theirs);
    }
    if (k->cmd < 0) {
        int e = spawn_error ? spawn_error : EAGAIN;
        keeper_cgroup_remove(k);
        say_error(o.status_fd, "error", e, o.exe ? o.exe : o.cmd[0]);
        unlink_socket(o.dir_fd, o.name);
        return e == ENOENT ? 127 : 126;
    }
    k->cmd_start = start_time(k->cmd);
    {
        int fd = pidfd_open_(k->cmd);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0)
                k->handle = (unsigned long long)st.st_ino;
            close(fd);
        }
    }
    snprintf(line, sizeof line, "ok %d %d %lld %d %llu %s %d %lld %lld\n", (int)getpid(),
             (int)k->cmd, k->cmd_start, k->inside, k->handle, k->cgroup[0] ? k->cgroup : "-",
             (int)session, k->session_start, k->self_start);
    say(o.status_fd, line);
    close(o.status_fd);
    tell_session(k, "started\n");
    {
        int keep[] = {to_session, o.dir_fd, sfd, k->lsock, k->fd_out[0], k->fd_out[1],
                      k->fd_out[2], k->input};
        close_all_but(keep, 8); /* (the caller's pidfd is opened after this) */
    }
    quiet_stdio();
    forget_environment();
    shed_pages();
    for (i = 0; i < 3; i++)
        if (k->fd_out[i] >= 0)
            fcntl(k->fd_out[i], F_SETFL, O_NONBLOCK);
    k->detached_at = mono_ms(); /* until the supervisor that started us connects */
    k->first_wait = 1;
    k->caller_fd = pidfd_open_(o.caller);
    if (k->caller_fd < 0 || getppid() != session)
        k->first_wait = 0; /* no pidfd to tell its death (or it is gone): no waiting */

    for (;;) {
        struct pollfd pf[8 + NEWCOMERS];
        int npf = 0, timeout = -1, reading = may_read(k);
        int at_peer = -1, at_out[3] = {-1, -1, -1}, at_new[NEWCOMERS];
        pf[npf++] = (struct pollfd){sfd, POLLIN, 0};
        pf[npf++] = (struct pollfd){k->lsock, POLLIN, 0};
        if (k->peer >= 0) {
            at_peer = npf;
            pf[npf++] = (struct pollfd){k->peer, (short)(POLLIN | (want_send(k) ? POLLOUT : 0)),
                                        0};
        }
        for (i = 0; i < 3; i++)
            if (k->fd_out[i] >= 0 && reading) {
                at_out[i] = npf;
                pf[npf++] = (struct pollfd){k->fd_out[i], POLLIN, 0};
            }
        if (k->first_wait)
            pf[npf++] = (struct pollfd){k->caller_fd, POLLIN, 0};
        for (i = 0; i < NEWCOMERS; i++) {
            at_new[i] = -1;
            if (k->newcomer[i].fd >= 0) {
                at_new[i] = npf;
                pf[npf++] = (struct pollfd){k->newcomer[i].fd, POLLIN, 0};
            }
        }
        if (k->peer < 0 && o.orphan_timeout_ms >= 0 && !k->first_wait) {
            long long left = k->detached_at + o.orphan_timeout_ms - mono_ms();
            timeout = left < 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
        }
        if (sfd < 0) /* no signalfd: look for our children's ends every 50 ms */
            timeout = timeout < 0 || timeout > 50 ? 50 : timeout;
        if (poll(pf, (nfds_t)npf, timeout) < 0 && errno != EINTR)
            nap_ms(10);
        if (sfd >= 0) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                int sig = (int)si.ssi_signo;
                if (sig == SIGTERM || sig == SIGINT)
                    term = 1;
            }
        }
        reap(k);
        if (term) {
            keeper_teardown(k, "terminated");
            return 0;
        }
        if (k->first_wait && k->peer < 0) {
            struct pollfd cf = {k->caller_fd, POLLIN, 0};
            if (poll(&cf, 1, 0) > 0) { /* it died before it attached: we are on our own */
                k->first_wait = 0;
                close(k->caller_fd);
                k->caller_fd = -1;
                k->detached_at = mono_ms();
            }
        }
        for (i = 0; i < NEWCOMERS; i++)
            if (at_new[i] >= 0 && k->newcomer[i].fd >= 0 &&
                (pf[at_new[i]].revents & (POLLIN | POLLHUP | POLLERR)))
                read_newcomer(k, i);
        if (at_peer >= 0 && k->peer >= 0 && (pf[at_peer].revents & (POLLIN | POLLHUP | POLLERR)))
            read_peer(k);
        accept_peer(k);
        for (i = 0; i < 3; i++)
            if (at_out[i] >= 0 && k->fd_out[i] >= 0 &&
                (pf[at_out[i]].revents & (POLLIN | POLLHUP | POLLERR)) && may_read(k))
                read_output(k, i);
        pump(k);
        if (k->released) {
            pid_t kids[2];
            reap(k);
            if (children(kids, 2) == 0) {
                keeper_finish(k);
                return 0;
            }
        }
        if (k->peer < 0 && o.orphan_timeout_ms >= 0 && !k->first_wait &&
            mono_ms() - k->detached_at >= o.orphan_timeout_ms) {
            keeper_teardown(k, "orphan_timeout");
            return 0;
        }
    }
}

/* -- the session process ---------------------------------------------------------- */

static int run_session(const struct opts *o, int to_launcher)
{
    int k2s[2], sfd, started = 0, i;
    pid_t keeper;
    char cgroup[PATH_MAX] = "", session_dir[PATH_MAX] = "";
    int cmd_ended = 0, cmd_status = 0;
    sigset_t all;

    setsid();
    say(to_launcher, "s");
    close(to_launcher);
    prctl(PR_SET_NAME, "pt-session", 0, 0, 0);
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
        say_error(o->status_fd, "nosubreaper", errno, "PR_SET_CHILD_SUBREAPER");
        return 126;
    }
    if (o->session_cgroup) {
        snprintf(session_dir, sizeof session_dir, "%s/pt-%s", o->session_cgroup, o->name);
        if (mkdir(session_dir, 0755) != 0 && errno != EEXIST) {
            say_error(o->status_fd, "error", errno, "cannot make the session's cgroup");
            return 126;
        }
        if (!write_file(session_dir, "cgroup.procs", "0")) {
            int e = errno ? errno : EACCES;
            rmdir(session_dir);
            say_error(o->status_fd, "error", e, "cannot move into the session's cgroup");
            return 126;
        }
    }
    if (pipe2(k2s, O_CLOEXEC) != 0) {
        say_error(o->status_fd, "error", errno, "pipe");
        return 126;
    }
    keeper = fork();
    if (keeper < 0) {
        say_error(o->status_fd, "error", errno, "fork of the session's keeper");
        return 126;
    }
    if (keeper == 0) {
        close(k2s[0]);
        /* A group of its own: no single kill of a process group (the command's, the
         * guard's) ends both helpers of a session at once. */
        setpgid(0, 0);
        _exit(run_keeper(o, k2s[1], getppid()));
    }
    close(k2s[1]);
    {
        int keep[] = {k2s[0], o->dir_fd};
        close_all_but(keep, 2);
    }
    quiet_stdio();
    forget_environment();
    shed_pages();
    sigfillset(&all);
    sfd = signalfd(-1, &all, SFD_CLOEXEC | SFD_NONBLOCK);
    {
        char buf[PATH_MAX + 64];
        size_t have = 0;
        int keeper_status = 0, keeper_done = 0;
        for (;;) {
            /* (a closed pipe's entry is -1: poll skips it) */
            struct pollfd pf[2] = {{k2s[0], POLLIN, 0}, {sfd, POLLIN, 0}};
            int st;
            pid_t pid;
            poll(pf, 2, sfd < 0 ? 100 : -1);
            if (k2s[0] >= 0 && (pf[0].revents & (POLLIN | POLLHUP | POLLERR))) {
                ssize_t n = read(k2s[0], buf + have, sizeof buf - 1 - have);
                if (n <= 0) {
                    if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                        close(k2s[0]);
                        k2s[0] = -1;
                    }
                } else {
                    char *nl;
                    have += (size_t)n;
                    buf[have] = 0;
                    while ((nl = strchr(buf, '\n')) != NULL) {
                        *nl = 0;
                        if (strncmp(buf, "cgroup ", 7) == 0)
                            snprintf(cgroup, sizeof cgroup, "%.4000s",
                                     strcmp(buf + 7, "-") == 0 ? "" : buf + 7);
                        else if (strncmp(buf, "exit ", 5) == 0) {
                            cmd_ended = 1;
                            cmd_status = (int)strtol(buf + 5, NULL, 10);
                        } else if (strcmp(buf, "started") == 0)
                            started = 1;
                        have -= (size_t)(nl + 1 - buf);
                        memmove(buf, nl + 1, have + 1);
                    }
                    if (have >= sizeof buf - 1)
                        have = 0;
                }
            }
            if (sfd >= 0) {
                struct signalfd_siginfo si;
                while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si)
                    ; /* SIGCHLD: looked at below; anything else: we only wait */
            }
            while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
                if (pid == keeper) {
                    keeper_done = 1;
                    keeper_status = st;
                }
            if (!keeper_done)
                continue;
            if (WIFEXITED(keeper_status) && WEXITSTATUS(keeper_status) == 0)
                break; /* its own clean end: nothing is left below it */
            if (started) {
                /* Killed: its orphans are ours now. End them all, with proof. */
                char text[256];
                int proven = kill_below(cgroup, mono_ms() + 10000);
                if (cgroup[0]) {
                    for (i = 0; i < 100 && rmdir(cgroup) != 0 && errno == EBUSY; i++)
                        nap_ms(10);
                }
                if (cmd_ended)
                    snprintf(text, sizeof text, "helper_killed %d %s natural %d\n", cmd_status,
                             proven ? "proven" : "unproven",
                             WIFSIGNALED(keeper_status) ? WTERMSIG(keeper_status) : 0);
                else
                    snprintf(text, sizeof text, "helper_killed - %s killed %d\n",
                             proven ? "proven" : "unproven",
                             WIFSIGNALED(keeper_status) ? WTERMSIG(keeper_status) : 0);
                write_end(o->dir_fd, o->name, text);
                unlink_socket(o->dir_fd, o->name);
            } else {
                kill_below(cgroup, mono_ms() + 10000);
                if (cgroup[0])
                    rmdir(cgroup);
            }
            break;
        }
    }
    if (session_dir[0]) {
        /* Out of our own cgroup (to where the supervisor was, else its parent), so
         * that nothing of the session is left, not even an empty directory. */
        if (!(o->home && write_file(o->home, "cgroup.procs", "0")))
            write_file(o->session_cgroup, "cgroup.procs", "0");
        for (i = 0; i < 50 && rmdir(session_dir) != 0 && errno == EBUSY; i++)
            nap_ms(10);
    }
    return 0;
}

int job_keep(struct opts *o)
{
    sigset_t all;
    int p[2];
    pid_t session;
    char c;
    ssize_t n;
    if (o->dir_fd < 0 || !o->name || !o->name[0] || strchr(o->name, '/') ||
        o->ring < 64 * 1024) {
        fprintf(stderr, "proctable-lineage keep: needs --dir-fd, --name and --ring >= 65536\n");
        return 2;
    }
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL); /* every signal waits in a signalfd */
    cloexec(o->status_fd);
    cloexec(o->dir_fd);
    if (pipe2(p, O_CLOEXEC) != 0) {
        say_error(o->status_fd, "error", errno, "pipe");
        return 126;
    }
    session = fork();
    if (session < 0) {
        say_error(o->status_fd, "error", errno, "fork of the session process");
        return 126;
    }
    if (session == 0) {
        close(p[0]);
        _exit(run_session(o, p[1]));
    }
    close(p[1]);
    /* Until its setsid() the session process is in our caller's group, and a kill of
     * that group ends it with us: we exit once it has left (its byte says so). */
    do
        n = read(p[0], &c, 1);
    while (n < 0 && errno == EINTR);
    return n == 1 ? 0 : 126;
}
