/*
 * pt_stat.c: pure parser of one Linux /proc/<pid>/stat line.
 *
 * No I/O and no allocation, so that it can be fuzzed on its own. Every index
 * is checked against len: the buffer need not be NUL-terminated.
 *
 * (pt_parse_statm, the memory line, is here too: same rules, same checks.)
 *
 * Line shape (proc(5)): "pid (comm) S ppid pgrp session tty_nr ...". comm may
 * hold spaces and ')' itself, so it ends at the LAST ')' of the line. After it,
 * field n (1-based, as proc(5) numbers them) is token n - 3.
 */
#include <string.h>

#include "proctable.h"

#define FIELD_STATE      3
#define FIELD_PPID       4
#define FIELD_PGRP       5
#define FIELD_SESSION    6
#define FIELD_TTY        7
#define FIELD_FLAGS      9   /* the task's PF_* flags */
#define FIELD_UTIME     14
#define FIELD_STIME     15
#define FIELD_THREADS   20
#define FIELD_START     22
#define FIELD_RSS       24
#define FIELD_EXIT_SIG  38   /* -1 only for threads that lead no thread group */
#define FIELD_EXIT      52

#define PF_KTHREAD_ 0x00200000u  /* include/linux/sched.h: I am a kernel thread */
#define FIELD_MIN       FIELD_RSS   /* the last field we cannot do without */

/* Parse an optionally signed decimal token at buf[*pos..end), which must be
 * followed by a space, a newline or the end. Accepts magnitudes up to
 * UINT64_MAX (rsslim prints RLIM_INFINITY), so *neg and *mag carry the value;
 * the caller range-checks the fields it keeps. Returns 0 or -1. */
static inline int
parse_token(const char *buf, size_t end, size_t *pos, int *neg, uint64_t *mag)
{
    size_t i = *pos, first, fast_end;
    uint64_t v = 0;
    unsigned d;
    int n = 0;

    if (i < end && buf[i] == '-') {
        n = 1;
        i++;
    }
    /* Up to 19 digits cannot overflow a uint64_t: no check on those. */
    first = i;
    fast_end = end - i > 19 ? i + 19 : end;
    while (i < fast_end && (d = (unsigned)((unsigned char)buf[i] - '0')) <= 9) {
        v = v * 10 + d;
        i++;
    }
    if (i == first)
        return -1;
    while (i < end && (d = (unsigned)((unsigned char)buf[i] - '0')) <= 9) {
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
        i++;
    }
    if (i < end && buf[i] != ' ' && buf[i] != '\n')
        return -1;
    *pos = i;
    *neg = n;
    *mag = v;
    return 0;
}

/* Narrow a parsed token to an int64 in [lo, hi]. Returns 0 or -1. */
static int
to_range(int neg, uint64_t mag, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t v;

    if (neg) {
        if (mag > (uint64_t)INT64_MAX + 1)
            return -1;
        v = (mag == (uint64_t)INT64_MAX + 1) ? INT64_MIN : -(int64_t)mag;
    } else {
        if (mag > (uint64_t)INT64_MAX)
            return -1;
        v = (int64_t)mag;
    }
    if (v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int
pt_parse_stat(const char *buf, size_t len, pt_proc *out)
{
    size_t pos = 0, open_paren, close_paren, comm_len;
    int neg, field;
    uint64_t mag;
    int64_t v;

    memset(out, 0, sizeof(*out));
    out->uid = -1;
    if (buf == NULL)
        return PT_ENOPID;

    /* Field 1: pid, then " (". */
    if (parse_token(buf, len, &pos, &neg, &mag) != 0 || neg
        || to_range(0, mag, 1, INT32_MAX, &out->pid) != 0)
        return PT_ENOPID;
    if (pos + 1 >= len || buf[pos] != ' ' || buf[pos + 1] != '(')
        return PT_ENOCOMM;
    open_paren = pos + 1;

    /* Field 2: comm runs to the last ')' of the line. */
    close_paren = len;
    for (size_t i = len; i > open_paren + 1; i--) {
        if (buf[i - 1] == ')') {
            close_paren = i - 1;
            break;
        }
    }
    if (close_paren == len)
        return PT_ENOCOMM;
    comm_len = close_paren - open_paren - 1;
    if (comm_len > PT_COMM_MAX)
        return PT_ENOCOMM;
    memcpy(out->comm, buf + open_paren + 1, comm_len);
    out->comm_len = (unsigned char)comm_len;

    /* Field 3: one state letter between single spaces. */
    pos = close_paren + 1;
    if (pos + 2 >= len || buf[pos] != ' ' || buf[pos + 2] != ' ')
        return PT_ESTATE;
    if (!((buf[pos + 1] >= 'A' && buf[pos + 1] <= 'Z')
          || (buf[pos + 1] >= 'a' && buf[pos + 1] <= 'z')))
        return PT_ESTATE;
    out->state = buf[pos + 1];
    pos += 2;

    /* Fields 4..: space-separated decimals; later kernels may add more. */
    for (field = FIELD_STATE + 1;; field++) {
        if (pos >= len || buf[pos] == '\n') {
            /* A trailing newline must end the line. */
            if (pos < len && pos + 1 != len)
                return PT_EFIELD;
            break;
        }
        if (buf[pos] != ' ')
            return PT_EFIELD;
        pos++;
        if (parse_token(buf, len, &pos, &neg, &mag) != 0)
            return PT_EFIELD;

        switch (field) {
        case FIELD_PPID:
            if (to_range(neg, mag, 0, INT32_MAX, &out->ppid) != 0)
                return PT_EFIELD;
            break;
        case FIELD_PGRP:
            if (to_range(neg, mag, 0, INT32_MAX, &out->pgid) != 0)
                return PT_EFIELD;
            break;
        case FIELD_SESSION:
            if (to_range(neg, mag, 0, INT32_MAX, &out->sid) != 0)
                return PT_EFIELD;
            break;
        case FIELD_TTY:
            if (to_range(neg, mag, INT32_MIN, INT32_MAX, &out->tty_nr) != 0)
                return PT_EFIELD;
            break;
        case FIELD_FLAGS:
            if (neg || mag > UINT32_MAX)
                return PT_EFIELD;
            if (mag & PF_KTHREAD_)
                out->flags |= PT_F_KTHREAD;
            break;
        case FIELD_UTIME:
            if (to_range(neg, mag, 0, INT64_MAX, &out->utime) != 0)
                return PT_EFIELD;
            break;
        case FIELD_STIME:
            if (to_range(neg, mag, 0, INT64_MAX, &out->stime) != 0)
                return PT_EFIELD;
            break;
        case FIELD_THREADS:
            if (to_range(neg, mag, 0, INT32_MAX, &out->num_threads) != 0)
                return PT_EFIELD;
            break;
        case FIELD_START:
            if (to_range(neg, mag, 0, INT64_MAX, &out->start_time) != 0)
                return PT_EFIELD;
            break;
        case FIELD_RSS:
            /* Checked, not kept: this is get_mm_rss(), the per-CPU estimate;
             * the exact figure comes from statm (pt_parse_statm). It can dip
             * below zero transiently. */
            if (to_range(neg, mag, INT64_MIN, INT64_MAX, &v) != 0)
                return PT_EFIELD;
            break;
        case FIELD_EXIT_SIG:
            if (neg && mag == 1)
                out->flags |= PT_F_THREAD;
            break;
        case FIELD_EXIT:
            if (to_range(neg, mag, INT32_MIN, INT32_MAX, &out->exit_code) != 0)
                return PT_EFIELD;
            out->flags |= PT_F_HAVE_EXIT;
            break;
        default:
            break;
        }
    }
    if (field - 1 < FIELD_MIN)
        return PT_ESHORT;
    out->flags |= PT_F_HAVE_SID | PT_F_HAVE_CPU;
    return PT_OK;
}

int
pt_parse_statm(const char *buf, size_t len, pt_proc *out)
{
    size_t pos = 0;
    int neg, field;
    uint64_t mag;
    int64_t vals[2];

    if (buf == NULL)
        return PT_ESHORT;
    /* "size resident shared text lib data dt": we keep the first two. */
    for (field = 0; field < 2; field++) {
        if (field > 0) {
            if (pos >= len || buf[pos] != ' ')
                return pos >= len || buf[pos] == '\n' ? PT_ESHORT : PT_EFIELD;
            pos++;
        }
        if (pos >= len)
            return PT_ESHORT;
        if (parse_token(buf, len, &pos, &neg, &mag) != 0 || neg
            || to_range(0, mag, 0, INT64_MAX, &vals[field]) != 0)
            return PT_EFIELD;
    }
    out->vms = vals[0];
    out->rss = vals[1];
    out->flags |= PT_F_HAVE_MEM;
    return PT_OK;
}
