/*
 * pt_bpf.c: the BPF reader of the Linux process table.
 *
 * csrc/pt_iter.bpf.c is compiled at build time (clang -target bpf) into a
 * light skeleton (bpftool gen skeleton -L, included below as
 * pt_iter.lskel.h): a small loader program, run by the kernel, that loads our
 * program, lets the kernel relocate its field accesses against its own BTF
 * (kernel-side CO-RE, Linux 5.17+; the program itself needs 5.19) and hands
 * back its fds. So this file needs
 * no libbpf and no ELF parser at run time: only bpf(2). A build without clang
 * or bpftool compiles this file without PT_HAVE_BPF, and the /proc reader is
 * then the only one ("built without BPF").
 *
 * Once per process (pthread_once) the reader decides: PROCTABLE_DISABLE=bpf,
 * the kernel's BTF, /proc being this process's pid namespace, bpf() being
 * permitted, the verifier accepting the program, and one trial read. After
 * that each table read is one BPF_ITER_CREATE on the kept link and a few
 * reads of its fd: one record per task (pt_bpf_abi.h), turned here into the
 * rows the /proc reader would have made (state letter, clock ticks, the
 * utime/stime split of thread_group_cputime_adjusted(), tty number, pids of
 * the reader's namespace).
 *
 * Every process /proc lists: a kernel may keep tasks from BPF iterators (the
 * sandbox kernel this was written on hides its pid 1 and its threads, as it
 * also refuses root ptrace access to it). Each read therefore counts the
 * tasks it was shown against the kernel's own count (nr_threads from
 * /proc/loadavg in the initial pid namespace, pid_allocated in others); where
 * they differ it lists /proc and reads the pids the iterator left out through
 * the /proc reader, and remembers them, so that the next reads take those few
 * pids from /proc directly and the counts agree again.
 *
 * The link fd is checked on every read (by link id: an application may close
 * fds it did not open, and another file may take the number); a lost link is
 * loaded again, never closed. fork(): a child (getpid() changed) uses the
 * inherited link only while it still holds CAP_BPF and CAP_PERFMON and /proc
 * is its own (an iterator made from the link reads the child's view); a
 * process that gave the privileges up, or entered a user namespace, reads
 * /proc from then on, as /proc is what it may see. pthread_atfork keeps the
 * lock usable in the child.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "proctable.h"
#include "pt_internal.h"

#ifdef PT_HAVE_BPF
#include <linux/bpf.h>
#include "pt_iter.lskel.h"

typedef uint8_t __u8;       /* pt_bpf_abi.h's types (linux/types.h has the rest) */
#include "pt_bpf_abi.h"
#endif

#ifndef PT_BPF_BUILD_NOTE
#define PT_BPF_BUILD_NOTE "no BPF toolchain at build time"
#endif

#define WHY_MAX 256

/* The state of the BPF reader in this process. */
static struct {
    pthread_mutex_t lock;       /* fork adoption, reloads, the hidden-pid list */
    int usable;                 /* 1: table reads go through BPF */
    char why[WHY_MAX];          /* why not, when !usable */
    int pretend;                /* PT_PRETEND_* for the next decision */
    int decided;
    int done;                   /* decide() has run to its end (atomic) */
    pid_t loader;               /* the process that started the background load, 0: none */
    unsigned auto_reads;        /* reader="auto" reads done before the decision (atomic) */
    pid_t owner;                /* the process the link was checked for */
    int link_fd;
    uint32_t link_id;
    uint32_t ncpus;             /* possible CPUs, summed for rss */
    uint32_t pidns_level;       /* this process's pid namespace depth */
    int failures;               /* table reads in a row that fell back */
    int load_err;               /* errno of the last failed bring_up() */
    long retry_ms;              /* backoff after a transient load failure, 0: none */
    int64_t retry_at;           /* CLOCK_MONOTONIC ms of the next try, 0: never */
    int hidepid;                /* this process's /proc hides processes (read_hidepid) */
    long hidepid_gid;           /* its gid= option (exempt group), -1: none */
    char hidepid_opt[32];       /* its hidepid= option, as mountinfo says it */
} g = {PTHREAD_MUTEX_INITIALIZER, 0, "", 0, 0, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0, -1, ""};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void set_why(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Say why the BPF reader does not run (with g.lock held). */
static void
set_why(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(g.why, sizeof(g.why), fmt, ap);
    va_end(ap);
}

int
pt_bpf_pretend(int what)
{
    int rc = 0;

    pthread_mutex_lock(&g.lock);
    if (g.decided) {
        errno = EBUSY;
        rc = -1;
    } else {
        g.pretend |= what;
    }
    pthread_mutex_unlock(&g.lock);
    return rc;
}

#ifndef PT_HAVE_BPF

static void
decide(void)
{
    pthread_mutex_lock(&g.lock);
    g.decided = 1;
    g.usable = 0;
    set_why("built without BPF (%s)", PT_BPF_BUILD_NOTE);
    pthread_mutex_unlock(&g.lock);
    __atomic_store_n(&g.done, 1, __ATOMIC_RELEASE);
}

long
pt_bpf_scan(pt_proc *rows, size_t cap, int want, pt_scaninfo *info, pt_extra *extra)
{
    (void)rows;
    (void)cap;
    (void)extra;
    info->reader = PT_READER_PROC;
    if (want & PT_WANT_BPF) {
        errno = ENOTSUP;
        return -1;
    }
    return PT_BPF_DECLINED;
}

void
pt_bpf_auto_read_done(long n)
{
    (void)n;
}

#else /* PT_HAVE_BPF */

#define BTF_PATH "/sys/kernel/btf/vmlinux"
#define BTF_PRETEND_PATH "/sys/kernel/btf/.proctable-pretend-no-btf"
#define PT_MAX_CPUS 8192            /* as in pt_iter.bpf.c */
#define READ_CHUNK (64 * 1024)
#define HIDDEN_MAX 64               /* pids the iterator leaves out, remembered */
#define FAILURES_MAX 3              /* fallen-back reads in a row before giving up */
#define LOAD_TRIES 3                /* loads in a row after the verifier was interrupted */
#define RETRY_MIN_MS 20             /* first wait before a load is tried again */
#define RETRY_MAX_MS 5000           /* longest wait between two tries */
#define VERIFIER_LOG (256 * 1024)

/* PROCTABLE_DISABLE (comma separated, any case) names "bpf". */
static int
disabled_by_env(void)
{
    const char *v = getenv("PROCTABLE_DISABLE");
    size_t i = 0, start;

    if (v == NULL)
        return 0;
    while (v[i]) {
        while (v[i] == ',' || v[i] == ' ')
            i++;
        start = i;
        while (v[i] && v[i] != ',')
            i++;
        size_t end = i;
        while (end > start && v[end - 1] == ' ')
            end--;
        if (end - start == 3 && strncasecmp(v + start, "bpf", 3) == 0)
            return 1;
    }
    return 0;
}

/* An errno that says "not now" rather than "never here": a signal that
 * interrupted the verifier (EAGAIN, EINTR), fds or memory short for a moment. */
static int
transient(int err)
{
    return err == EAGAIN || err == EINTR || err == EMFILE || err == ENFILE ||
           err == ENOMEM || err == ENOBUFS;
}

/* Say that loading met a transient error and is tried again (g.lock held). */
static void
set_why_transient(const char *what, int err)
{
    set_why("%s failed for now (%s): the BPF reader is tried again on a later read", what,
            strerror(err));
    g.load_err = err;
}

static int64_t
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static long
sys_bpf(int cmd, union bpf_attr *attr, unsigned int size)
{
    return syscall(__NR_bpf, cmd, attr, size);
}

/* Pids remembered as left out by the iterator (read from /proc each time). */
static struct {
    int32_t pid[HIDDEN_MAX];
    size_t n;
} hidden;

/* CPUs the kernel may ever run (the highest in .../cpu/possible, plus one). */
static uint32_t
possible_cpus(void)
{
    char buf[256];
    long most = -1, v;
    ssize_t n;
    int fd;
    char *p, *end;

    fd = open("/sys/devices/system/cpu/possible", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n > 0) {
            buf[n] = '\0';
            /* "0-3", "0,2-5", "0" */
            for (p = buf; *p;) {
                v = strtol(p, &end, 10);
                if (end == p)
                    break;
                if (v > most)
                    most = v;
                p = end;
                while (*p == '-' || *p == ',' || *p == '\n')
                    p++;
            }
        }
    }
    if (most < 0) {
        v = sysconf(_SC_NPROCESSORS_CONF);
        most = v > 0 ? v - 1 : 0;
    }
    return (uint32_t)(most + 1);
}

/* Is /proc mounted for this process's pid namespace? /proc/self names us there. */
static int
proc_is_ours(void)
{
    char buf[32];
    ssize_t n = readlink("/proc/self", buf, sizeof(buf) - 1);

    if (n <= 0)
        return 0;
    buf[n] = '\0';
    return strtol(buf, NULL, 10) == (long)getpid();
}

static uint32_t
link_id_of(int fd)
{
    struct bpf_link_info info;
    union bpf_attr attr;

    if (fd < 0)
        return 0;
    memset(&info, 0, sizeof(info));
    memset(&attr, 0, sizeof(attr));
    attr.info.bpf_fd = (uint32_t)fd;
    attr.info.info_len = sizeof(info);
    attr.info.info = (uint64_t)(uintptr_t)&info;
    if (sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &attr, sizeof(attr)) != 0)
        return 0;
    return info.type == BPF_LINK_TYPE_ITER ? info.id : 0;
}

/* Does this process still hold what loading the program needs (CAP_BPF and
 * CAP_PERFMON, or CAP_SYS_ADMIN)? A process that dropped them after loading
 * (setuid, capset), or a child that did, must read what /proc shows it, not
 * what the link it kept would. 1: yes (or unknown: the kernel decides). */
/* Why this process may not read through the link now: CAPS_OK, CAPS_NONE
 * (neither root's CAP_SYS_ADMIN nor CAP_BPF and CAP_PERFMON), or CAPS_HIDDEN
 * (its /proc hides processes from it, g.hidepid, and it holds neither
 * CAP_SYS_PTRACE nor the mount's exempt group: BPF would show it more). */
static int in_group(long gid);

#define CAPS_OK     0
#define CAPS_NONE   1
#define CAPS_HIDDEN 2

static int
caps_ok(void)
{
    struct {
        uint32_t version;
        int pid;
    } hdr = {0x20080522, 0};            /* _LINUX_CAPABILITY_VERSION_3 */
    struct {
        uint32_t effective, permitted, inheritable;
    } data[2];
    uint64_t eff;
    int admin, bpf, perfmon;

    if (syscall(SYS_capget, &hdr, data) != 0)
        return g.hidepid ? CAPS_HIDDEN : CAPS_OK;
    eff = data[0].effective | ((uint64_t)data[1].effective << 32);
    admin = (eff >> 21) & 1;            /* CAP_SYS_ADMIN */
    perfmon = (eff >> 38) & 1;          /* CAP_PERFMON */
    bpf = (eff >> 39) & 1;              /* CAP_BPF */
    if (!((bpf || admin) && (perfmon || admin)))
        return CAPS_NONE;
    if (g.hidepid && !((eff >> 19) & 1) && !in_group(g.hidepid_gid))   /* CAP_SYS_PTRACE */
        return CAPS_HIDDEN;
    return CAPS_OK;
}

/* Is gid this process's effective gid or one of its groups (in_group_p())?
 * gid -1: no. */
static int
in_group(long gid)
{
    gid_t groups[256];
    int n;

    if (gid < 0)
        return 0;
    if ((long)getegid() == gid)
        return 1;
    n = getgroups((int)(sizeof(groups) / sizeof(groups[0])), groups);
    for (int i = 0; i < n; i++)
        if ((long)groups[i] == gid)
            return 1;
    return 0;
}

/* g.hidepid, g.hidepid_opt and g.hidepid_gid from this process's /proc mount. */
static void
read_hidepid(void)
{
    g.hidepid = pt_proc_hidepid(g.hidepid_opt, sizeof(g.hidepid_opt), &g.hidepid_gid);
}

/* Say why caps_ok() refused (g.lock held). */
static void
set_why_caps(int why)
{
    if (why == CAPS_HIDDEN)
        set_why("/proc is mounted %s and this process lacks CAP_SYS_PTRACE: the BPF reader "
                "would show it processes /proc hides from it", g.hidepid_opt);
    else
        set_why("this process gave up CAP_BPF and CAP_PERFMON after the BPF reader was "
                "loaded");
}

/* The last line of the verifier's log that says something (not the
 * "processed N insns" summary), into out. */
static void
verifier_says(const char *log, char *out, size_t len)
{
    const char *end = log + strlen(log), *line_end, *start;

    out[0] = '\0';
    while (end > log) {
        while (end > log && (end[-1] == '\n' || end[-1] == ' '))
            end--;
        line_end = end;
        start = end;
        while (start > log && start[-1] != '\n')
            start--;
        if (line_end > start && strncmp(start, "processed ", 10) != 0 &&
            strncmp(start, "verification time", 17) != 0 &&
            strncmp(start, "stack depth", 11) != 0) {
            size_t n = (size_t)(line_end - start);
            if (n >= len)
                n = len - 1;
            memcpy(out, start, n);
            out[n] = '\0';
            return;
        }
        end = start;
    }
}

/* Open, load and attach the program. Returns the skeleton, or NULL with
 * g.why saying why. */
static struct pt_iter *
load(void)
{
    struct pt_iter *skel;
    union bpf_attr attr;
    char said[160];
    char *log;
    int fd, err, rc;

    /* Privileges first: bpf() at all (seccomp, no CAP_BPF, unprivileged BPF off). */
    memset(&attr, 0, sizeof(attr));
    attr.map_type = BPF_MAP_TYPE_ARRAY;
    attr.key_size = 4;
    attr.value_size = 4;
    attr.max_entries = 1;
    g.load_err = 0;
    fd = (int)sys_bpf(BPF_MAP_CREATE, &attr, sizeof(attr));
    if (fd < 0) {
        err = errno;
        if (transient(err))
            set_why_transient("creating a BPF map", err);
        else if (err == ENOSYS)
            set_why("the kernel has no bpf() system call (%s)", strerror(err));
        else
            set_why("bpf() is not permitted here (%s): the BPF reader needs root, or "
                    "CAP_BPF and CAP_PERFMON", strerror(err));
        return NULL;
    }
    close(fd);

    for (int attempt = 0;; attempt++) {
        skel = pt_iter__open();
        if (skel == NULL) {
            set_why_transient("opening the BPF program", ENOMEM);
            return NULL;
        }
        skel->rodata->ncpus = g.ncpus;
        skel->rodata->pretend_refusal = (g.pretend & PT_PRETEND_REFUSAL) != 0;
        rc = pt_iter__load(skel);
        if (rc == 0) {
            if (pt_iter__attach(skel) == 0)
                return skel;
            err = errno;
            pt_iter__destroy(skel);
            if (transient(err))
                set_why_transient("attaching the task iterator", err);
            else
                set_why("the kernel refused to attach the task iterator (%s)", strerror(err));
            return NULL;
        }
        err = rc < 0 ? -rc : errno;
        pt_iter__destroy(skel);
        /* A signal during the ~30 ms of verification: at once, a few times. */
        if ((err == EAGAIN || err == EINTR) && attempt + 1 < LOAD_TRIES)
            continue;
        if (transient(err)) {
            set_why_transient("loading the BPF program", err);
            return NULL;
        }
        break;
    }

    /* Once more with the verifier's log, to say why. */
    log = calloc(1, VERIFIER_LOG);
    skel = log ? pt_iter__open() : NULL;
    said[0] = '\0';
    if (skel != NULL) {
        skel->rodata->ncpus = g.ncpus;
        skel->rodata->pretend_refusal = (g.pretend & PT_PRETEND_REFUSAL) != 0;
        skel->ctx.log_level = 1;
        skel->ctx.log_size = VERIFIER_LOG;
        skel->ctx.log_buf = (uint64_t)(uintptr_t)log;
        if (pt_iter__load(skel) != 0)
            verifier_says(log, said, sizeof(said));
        pt_iter__destroy(skel);
    }
    free(log);
    if (said[0])
        set_why("the BPF verifier refused the program: %s (%s)", said, strerror(err));
    else if (err == EPERM || err == EACCES)
        set_why("not permitted to load a BPF task iterator (%s): the BPF reader needs "
                "root, or CAP_BPF and CAP_PERFMON", strerror(err));
    else
        set_why("the kernel cannot load the BPF task iterator (%s): it needs Linux 5.19+ "
                "with BTF and BPF iterators", strerror(err));
    return NULL;
}

/* ---- one pass over the iterator --------------------------------------------- */

static long user_hz;

/* The kernel's nsec_to_clock_t() for USER_HZ = sysconf(_SC_CLK_TCK). */
static int64_t
ns_to_ticks(uint64_t ns)
{
    const uint64_t nsec = 1000000000ULL;
    uint64_t hz = (uint64_t)user_hz;

    if (nsec % hz == 0)
        return (int64_t)(ns / (nsec / hz));
    if (hz % 512 == 0)
        return (int64_t)(ns * hz / 512 / (nsec / 512));
    return (int64_t)(ns * 9 / ((9 * nsec + hz / 2) / hz));
}

/* a * b / c without overflow (the kernel's mul_u64_u64_div_u64, exact as on x86-64). */
static uint64_t
mul_div(uint64_t a, uint64_t b, uint64_t c)
{
    return (uint64_t)((unsigned __int128)a * b / c);
}

/* cputime_adjust(): split the precise runtime in the ratio of the sampled
 * utime and stime, never below what stat printed last (prev). The kernel
 * stores its answer in prev; this reader only reads, so a later /proc read
 * starts from the same prev and prints the same split. */
static void
adjust(uint64_t ut, uint64_t st, uint64_t rtime, uint64_t pu, uint64_t ps,
       int64_t *out_u, int64_t *out_s)
{
#if defined(__powerpc__) || defined(__s390__)
    /* CONFIG_VIRT_CPU_ACCOUNTING_NATIVE: the precise times themselves. */
    (void)rtime;
    (void)pu;
    (void)ps;
    *out_u = ns_to_ticks(ut);
    *out_s = ns_to_ticks(st);
    return;
#else
    uint64_t stime = st, utime = ut;

    if (ps + pu >= rtime) {
        utime = pu;
        stime = ps;
        goto out;
    }
    if (stime == 0) {
        utime = rtime;
    } else if (utime == 0) {
        stime = rtime;
    } else {
        stime = mul_div(stime, rtime, stime + utime);
        if (stime > rtime)
            stime = rtime;
    }
    if (stime < ps)
        stime = ps;
    utime = rtime - stime;
    if (utime < pu) {
        utime = pu;
        stime = rtime - utime;
    }
out:
    *out_u = ns_to_ticks(utime);
    *out_s = ns_to_ticks(stime);
#endif
}

/* include/linux/sched.h: exit_state of a task reaped by wait() (or autoreaped)
 * but not yet released. */
#define PT_EXIT_DEAD 0x10

/* get_task_state(): the letter stat prints for __state and exit_state. */
static char
state_letter(uint32_t state, uint32_t exit_state)
{
    static const char letters[] = "RSDTtXZPI";
    uint32_t s = (state | exit_state) & 0x7f;       /* TASK_REPORT */
    int idx = 0;

    if ((state & 0x402) == 0x402)                   /* TASK_IDLE */
        s = 0x80;                                   /* TASK_REPORT_IDLE */
    if (state & (0x1000 | 0x8000))                  /* TASK_RTLOCK_WAIT, TASK_FROZEN */
        s = 0x2;                                    /* TASK_UNINTERRUPTIBLE */
    while (s) {                                     /* fls() */
        idx++;
        s >>= 1;
    }
    return letters[idx];
}

/* new_encode_dev() of MKDEV(major, minor). */
static int64_t
encode_dev(uint32_t major, uint32_t minor)
{
    return (int64_t)((minor & 0xff) | (major << 8) | ((minor & ~0xffu) << 12));
}

/* A row whose CPU times wait for its threads' records. */
struct multi {
    uint32_t gtgid;
    size_t row;
    uint64_t ut, st, rt, pu, ps;
};

struct thread_rec {
    uint32_t gtgid;
    uint64_t ut, st, rt;
};

/* What a row's record says beyond the row, kept for pt_bpf_scan's extra[]
 * (stored in record order; the rows are sorted after, so matched by pid). */
struct x_rec {
    int32_t pid;
    uint32_t task_flags;
    uint32_t bits;              /* PT_RB_* */
    uint32_t ids[6];
    uint64_t cutime, cstime, blkio_ns, pid_ino;
};

struct pass {
    pt_proc *rows;
    size_t cap;
    size_t n;                   /* rows stored */
    size_t total;               /* processes seen (rows needed) */
    size_t visited;             /* tasks seen */
    int want;
    int sorted;
    int nosum;                  /* a row's rss could not be summed */
    int64_t prev_pid;
    struct multi *multi;
    size_t nmulti, multi_cap;
    struct thread_rec *threads;
    size_t nthreads, threads_cap;
    struct x_rec *xs;           /* NULL unless the caller wants extra[] */
    size_t nxs, xs_cap;
    int want_x;
    uint32_t skip_gtgid;        /* PT_PRETEND_SKIP_SELF: this process's tgid, else 0 */
    struct pt_rec_end end;
    int have_end;
};

static int
grow(void **arr, size_t *cap, size_t elem)
{
    size_t ncap = *cap ? *cap * 2 : 64;
    void *p = realloc(*arr, ncap * elem);

    if (p == NULL)
        return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

static void
fill_row(struct pass *ps, const struct pt_rec_proc *r)
{
    pt_proc *out = &ps->rows[ps->n];
    size_t len = r->comm_len > PT_COMM_MAX ? PT_COMM_MAX : r->comm_len;

    memset(out, 0, sizeof(*out));
    out->pid = r->pid;
    out->ppid = r->ppid;
    out->pgid = r->pgid;
    out->sid = r->sid;
    out->tty_nr = (r->bits & PT_RB_TTY) ? encode_dev(r->tty_major, r->tty_minor) : 0;
    /* In ns for now: the time namespace's offset comes with the end record. */
    out->start_time = (int64_t)r->start_ns;
    out->num_threads = r->num_threads;
    out->uid = r->uid;
    out->exit_code = r->exit_code;
    out->flags = PT_F_HAVE_SID | PT_F_HAVE_CPU | PT_F_HAVE_UID | PT_F_HAVE_EXIT;
    if (r->bits & PT_RB_THREAD)
        out->flags |= PT_F_THREAD;
    if (r->bits & PT_RB_KTHREAD)
        out->flags |= PT_F_KTHREAD;     /* PF_KTHREAD, as stat field 9 shows it */
    if (ps->want & PT_WANT_MEM) {
        /* No mm (a kernel thread, a zombie): statm prints zeros. */
        out->rss = (int64_t)r->rss;
        out->vms = (int64_t)r->vms;
        out->flags |= PT_F_HAVE_MEM;
        if (r->bits & PT_RB_NOSUM)
            ps->nosum = 1;
    }
    out->state = state_letter(r->state, r->exit_state);
    out->comm_len = (unsigned char)strnlen(r->comm, len);
    memcpy(out->comm, r->comm, out->comm_len);
    /* The CPU split waits for the threads' shares where there are others. */
    adjust(r->utime, r->stime, r->runtime, r->prev_utime, r->prev_stime,
           &out->utime, &out->stime);
}

/* Take one record. Returns 0, or -1 (out of memory). */
static int
take(struct pass *ps, const char *rec, size_t size)
{
    uint16_t kind = ((const uint16_t *)rec)[0];

    switch (kind) {
    case PT_REC_PROC: {
        const struct pt_rec_proc *r = (const void *)rec;
        if (size < offsetof(struct pt_rec_proc, comm))
            return 0;
        if (ps->skip_gtgid != 0 && r->gtgid == ps->skip_gtgid)
            return 0;           /* as if never visited (test switch) */
        ps->visited++;
        /* Reaped, not yet released (exit_state EXIT_DEAD), or a group whose
         * last thread is released already: gone, as /proc leaves them out. */
        if ((r->exit_state & PT_EXIT_DEAD) || r->num_threads < 1)
            return 0;
        ps->total++;
        if (r->pid <= 0)        /* not numbered in our namespace: /proc lists no such */
            return 0;
        if (ps->n < ps->cap) {
            if (r->pid <= ps->prev_pid)
                ps->sorted = 0;
            ps->prev_pid = r->pid;
            fill_row(ps, r);
            if (ps->want_x) {
                if (ps->nxs == ps->xs_cap &&
                    grow((void **)&ps->xs, &ps->xs_cap, sizeof(*ps->xs)) != 0)
                    return -1;
                ps->xs[ps->nxs++] = (struct x_rec){r->pid, r->task_flags, r->bits,
                                                   {r->ids[0], r->ids[1], r->ids[2],
                                                    r->ids[3], r->ids[4], r->ids[5]},
                                                   r->cutime, r->cstime, r->blkio_ns,
                                                   r->pid_ino};
            }
            if (r->num_threads > 1) {
                if (ps->nmulti == ps->multi_cap &&
                    grow((void **)&ps->multi, &ps->multi_cap, sizeof(*ps->multi)) != 0)
                    return -1;
                ps->multi[ps->nmulti++] = (struct multi){r->gtgid, ps->n, r->utime, r->stime,
                                                         r->runtime, r->prev_utime,
                                                         r->prev_stime};
            }
            ps->n++;
        }
        return 0;
    }
    case PT_REC_THREAD: {
        const struct pt_rec_thread *t = (const void *)rec;
        ps->visited++;
        if (size < sizeof(*t))
            return 0;
        if (ps->nthreads == ps->threads_cap &&
            grow((void **)&ps->threads, &ps->threads_cap, sizeof(*ps->threads)) != 0)
            return -1;
        ps->threads[ps->nthreads++] = (struct thread_rec){t->gtgid, t->utime, t->stime, t->runtime};
        return 0;
    }
    case PT_REC_GONE:
        ps->visited++;
        return 0;
    case PT_REC_END:
        if (size >= sizeof(ps->end)) {
            memcpy(&ps->end, rec, sizeof(ps->end));
            ps->have_end = 1;
        }
        return 0;
    default:
        return 0;
    }
}

static int
cmp_multi(const void *a, const void *b)
{
    uint32_t x = ((const struct multi *)a)->gtgid, y = ((const struct multi *)b)->gtgid;
    return (x > y) - (x < y);
}

static int
cmp_thread(const void *a, const void *b)
{
    uint32_t x = ((const struct thread_rec *)a)->gtgid, y = ((const struct thread_rec *)b)->gtgid;
    return (x > y) - (x < y);
}

/* thread_group_cputime(): add every other thread's share, then split. */
static void
sum_threads(struct pass *ps)
{
    size_t i, j = 0;

    if (ps->nmulti == 0)
        return;
    qsort(ps->multi, ps->nmulti, sizeof(*ps->multi), cmp_multi);
    qsort(ps->threads, ps->nthreads, sizeof(*ps->threads), cmp_thread);
    for (i = 0; i < ps->nmulti; i++) {
        struct multi *m = &ps->multi[i];
        while (j < ps->nthreads && ps->threads[j].gtgid < m->gtgid)
            j++;
        for (; j < ps->nthreads && ps->threads[j].gtgid == m->gtgid; j++) {
            m->ut += ps->threads[j].ut;
            m->st += ps->threads[j].st;
            m->rt += ps->threads[j].rt;
        }
        adjust(m->ut, m->st, m->rt, m->pu, m->ps, &ps->rows[m->row].utime,
               &ps->rows[m->row].stime);
    }
}

/* Read the iterator of link through to its end record into ps. Returns 0, or
 * -1 with errno. */
static int
run_pass(int link, struct pass *ps)
{
    union bpf_attr attr;
    char *buf;
    size_t have = 0, off;
    ssize_t got;
    int fd, rc = 0, saved;

    memset(&attr, 0, sizeof(attr));
    attr.iter_create.link_fd = (uint32_t)link;
    fd = (int)sys_bpf(BPF_ITER_CREATE, &attr, sizeof(attr));
    if (fd < 0)
        return -1;
    buf = malloc(READ_CHUNK);
    if (buf == NULL) {
        close(fd);
        errno = ENOMEM;
        return -1;
    }
    for (;;) {
        do {
            got = read(fd, buf + have, READ_CHUNK - have);
        } while (got < 0 && errno == EINTR);
        if (got < 0) {
            rc = -1;
            break;
        }
        if (got == 0)
            break;
        have += (size_t)got;
        /* Take every whole record; keep a split one for the next read. */
        for (off = 0; off + 4 <= have;) {
            uint16_t size = ((const uint16_t *)(buf + off))[1];
            if (size < 8 || size % 8) {
                errno = EBADMSG;
                rc = -1;
                goto done;
            }
            if (off + size > have)
                break;
            if (take(ps, buf + off, size) != 0) {
                errno = ENOMEM;
                rc = -1;
                goto done;
            }
            off += size;
        }
        memmove(buf, buf + off, have - off);
        have -= off;
    }
done:
    saved = errno;
    free(buf);
    close(fd);
    errno = saved;
    if (rc == 0 && !ps->have_end) {
        errno = EBADMSG;       /* cut short: never a partial table */
        rc = -1;
    }
    return rc;
}

static void
pass_free(struct pass *ps)
{
    free(ps->multi);
    free(ps->threads);
    free(ps->xs);
    ps->xs = NULL;
    ps->multi = NULL;
    ps->threads = NULL;
}

/* nr_threads from /proc/loadavg ("0.00 0.01 0.05 1/123 4567"): the tasks of
 * the whole host; -1 when it cannot be read. */
static long
host_tasks(void)
{
    char buf[128], *slash;
    ssize_t n;
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    slash = strchr(buf, '/');
    return slash ? strtol(slash + 1, NULL, 10) : -1;
}

/* ---- the decision -------------------------------------------------------------- */

static int bring_up_once(void);

static int
trial_read(int link)
{
    struct pass ps;
    int rc;

    memset(&ps, 0, sizeof(ps));
    ps.sorted = 1;
    rc = run_pass(link, &ps);
    pass_free(&ps);
    if (rc != 0) {
        if (transient(errno))
            set_why_transient("a first read of the BPF task iterator", errno);
        else
            set_why("reading the BPF task iterator failed (%s)", strerror(errno));
        return -1;
    }
    if (ps.end.cpus != g.ncpus) {
        set_why("the BPF program cannot sum the per-CPU rss counters here");
        return -1;
    }
    if (ps.end.userns_level != 0) {
        set_why("this process is in a user namespace: the BPF reader's uids would need "
                "mapping");
        return -1;
    }
    g.pidns_level = ps.end.pidns_level;
    return 0;
}

/* Load and check; with g.lock held. Returns 0 (g.link_fd and g.link_id set)
 * or -1 with g.why set; after a transient error (g.load_err) with the next
 * try scheduled (g.retry_at, backing off up to RETRY_MAX_MS), else with none. */
static int
bring_up(void)
{
    int rc = bring_up_once();

    if (rc == 0) {
        g.retry_ms = 0;
        g.retry_at = 0;
    } else if (transient(g.load_err)) {
        g.retry_ms = g.retry_ms == 0 ? RETRY_MIN_MS
                     : (g.retry_ms * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : g.retry_ms * 2);
        g.retry_at = now_ms() + g.retry_ms;
    } else {
        g.retry_at = 0;
    }
    return rc;
}

/* Load again where a transient error stopped the last try and its time has
 * come (any thread; g.lock taken here). */
static void
retry_load(void)
{
    int64_t at = __atomic_load_n(&g.retry_at, __ATOMIC_ACQUIRE);

    if (at == 0 || now_ms() < at)
        return;
    pthread_mutex_lock(&g.lock);
    if (!g.usable && g.retry_at != 0 && now_ms() >= g.retry_at && bring_up() == 0) {
        g.failures = 0;
        g.why[0] = '\0';
        __atomic_store_n(&g.usable, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g.lock);
}

static int
bring_up_once(void)
{
    struct pt_iter *skel;
    int link;

    g.load_err = 0;
    skel = load();
    if (skel == NULL)
        return -1;
    link = skel->links.dump_task_fd;
    /* The link holds the program and the program its maps: only the link
     * fd is kept (the read-only and bss mappings stay mapped, fd-less). */
    skel->links.dump_task_fd = -1;
    if (skel->progs.dump_task.prog_fd > 0)
        close(skel->progs.dump_task.prog_fd);
    if (skel->maps.pcpu_probe.map_fd > 0)
        close(skel->maps.pcpu_probe.map_fd);
    if (skel->maps.cpus.map_fd > 0)
        close(skel->maps.cpus.map_fd);
    if (skel->maps.rodata.map_fd > 0)
        close(skel->maps.rodata.map_fd);
    free(skel);
    if (trial_read(link) != 0) {
        close(link);
        return -1;
    }
    g.link_id = link_id_of(link);
    __atomic_store_n(&g.owner, getpid(), __ATOMIC_RELEASE);
    __atomic_store_n(&g.link_fd, link, __ATOMIC_RELEASE);
    return 0;
}

static void
atfork_prepare(void)
{
    pthread_mutex_lock(&g.lock);
}

static void
atfork_release(void)
{
    pthread_mutex_unlock(&g.lock);
}

static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

/* Once per process, whoever decides first (decide() may run again in the
 * child of a fork that met it half-way: glibc's pthread_once restarts it). */
static void
register_atfork(void)
{
    pthread_atfork(atfork_prepare, atfork_release, atfork_release);
}

static void
decide(void)
{
    const char *btf = BTF_PATH;
    int rc;

    user_hz = sysconf(_SC_CLK_TCK);
    if (user_hz <= 0)
        user_hz = 100;
    pthread_once(&g_atfork_once, register_atfork);
    pthread_mutex_lock(&g.lock);
    g.decided = 1;
    g.usable = 0;
    if (disabled_by_env()) {
        set_why("PROCTABLE_DISABLE=bpf");
        goto out;
    }
    if (g.pretend & PT_PRETEND_NO_BTF)
        btf = BTF_PRETEND_PATH;
    if (access(btf, R_OK) != 0) {
        set_why("no kernel BTF at " BTF_PATH " (%s)", strerror(errno));
        goto out;
    }
    if (!proc_is_ours()) {
        set_why("/proc is not mounted for this process's pid namespace");
        goto out;
    }
    read_hidepid();
    if (caps_ok() == CAPS_HIDDEN) {
        set_why_caps(CAPS_HIDDEN);
        goto out;
    }
    g.ncpus = possible_cpus();
    if (g.ncpus > PT_MAX_CPUS) {
        set_why("more possible CPUs than the BPF reader sums");
        goto out;
    }
    /* The load (tens of ms in the verifier) runs without the lock: fork()'s
     * handlers take it, and a fork meanwhile (a forked child restarts this
     * decision: glibc's pthread_once does for a once a fork interrupted) must not
     * wait for it. Nothing else reads g before the decision is done: readers
     * wait in pthread_once, reader="auto" reads look at g.done only. */
    pthread_mutex_unlock(&g.lock);
    rc = bring_up();
    pthread_mutex_lock(&g.lock);
    if (rc == 0) {
        g.usable = 1;
        g.why[0] = '\0';
    }
out:
    pthread_mutex_unlock(&g.lock);
    __atomic_store_n(&g.done, 1, __ATOMIC_RELEASE);
}

/* The link to read, checked on every read: still the link this process
 * loaded (by link id: an application may close fds it did not open, and
 * another file may take the number), and, in a forked child, still usable
 * there (see the top of this file). A lost link is loaded again; -1 when the
 * BPF reader no longer runs here. */
static int
current_link(void)
{
    pid_t me = getpid();
    int link = __atomic_load_n(&g.link_fd, __ATOMIC_ACQUIRE), skip = 0, why;

    if (__atomic_load_n(&g.owner, __ATOMIC_ACQUIRE) == me && link >= 0 &&
        link_id_of(link) == g.link_id)
        return link;
    pthread_mutex_lock(&g.lock);
    if (g.usable && g.owner != me)
        read_hidepid();     /* a child may have mounted a /proc of its own */
    if (g.usable && g.owner != me && (why = caps_ok()) != CAPS_OK) {
        if (g.link_id != 0 && link_id_of(g.link_fd) == g.link_id)
            close(g.link_fd);
        g.link_fd = -1;
        g.usable = 0;
        set_why_caps(why);
    } else if (g.usable && g.owner != me && !proc_is_ours()) {
        /* A child in a new pid namespace, under its parent's /proc. */
        g.usable = 0;
        set_why("/proc is not mounted for this process's pid namespace");
    } else if (g.usable && g.link_fd >= 0 && link_id_of(g.link_fd) == g.link_id) {
        if (g.owner != me) {
            /* Ours still: one read to learn this child's namespace depth. */
            if (trial_read(g.link_fd) == 0)
                __atomic_store_n(&g.owner, me, __ATOMIC_RELEASE);
            else if (transient(g.load_err))
                skip = 1;       /* /proc this time; the next read checks again */
            else
                g.usable = 0;
        }
    } else if (g.usable) {
        /* The fd is gone or names something else: never close it, it is not
         * ours any more. Load again. */
        __atomic_store_n(&g.link_fd, -1, __ATOMIC_RELEASE);
        if (bring_up() != 0)
            g.usable = 0;
    }
    link = g.usable && !skip ? g.link_fd : -1;
    pthread_mutex_unlock(&g.lock);
    return link;
}

/* current_link(), once this process is known to still hold the privileges
 * the link was loaded with; -1 (and /proc from now on) otherwise. */
static int
usable_link(void)
{
    int link, why;

    if (!__atomic_load_n(&g.usable, __ATOMIC_ACQUIRE))
        retry_load();
    link = __atomic_load_n(&g.usable, __ATOMIC_ACQUIRE) ? current_link() : -1;

    if (link >= 0 && (why = caps_ok()) != CAPS_OK) {
        pthread_mutex_lock(&g.lock);
        /* Stop using the link: it would show this process more than /proc
         * does. (Not closed: another thread may be reading through it.) */
        g.usable = 0;
        set_why_caps(why);
        pthread_mutex_unlock(&g.lock);
        link = -1;
    }
    return link;
}

/* A read fell back to /proc: after FAILURES_MAX in a row, stop trying; a
 * transient error (out of fds for a moment) is not counted. */
static void
fell_back(int err)
{
    if (transient(err))
        return;
    pthread_mutex_lock(&g.lock);
    if (++g.failures >= FAILURES_MAX && g.usable) {
        g.usable = 0;
        set_why("reading the BPF task iterator kept failing (%s)", strerror(err));
    }
    pthread_mutex_unlock(&g.lock);
}

/* ---- the extra records of process_iter ------------------------------------------ */

static int
cmp_x_rec(const void *a, const void *b)
{
    int32_t x = ((const struct x_rec *)a)->pid, y = ((const struct x_rec *)b)->pid;
    return (x > y) - (x < y);
}

/* extra[i] for rows[0..n) (sorted by pid): pid and start time, and for a row
 * the iterator made, PT_X_BPF_ROW with what stat and status would give beyond
 * the row: stat's field 9 and cpu fields (utime and stime the row's), status's
 * uids and gids. A row read through /proc here (a pid the iterator left out)
 * gets pid and start time only. */
static void
fill_extra(struct pass *ps, const pt_proc *rows, size_t n, pt_extra *extra)
{
    size_t j = 0;

    qsort(ps->xs, ps->nxs, sizeof(*ps->xs), cmp_x_rec);
    for (size_t i = 0; i < n; i++) {
        pt_extra *x = &extra[i];
        const struct x_rec *r;

        memset(x, 0, sizeof(*x));
        x->pid = rows[i].pid;
        x->start_time = rows[i].start_time;
        while (j < ps->nxs && ps->xs[j].pid < rows[i].pid)
            j++;
        if (j == ps->nxs || ps->xs[j].pid != rows[i].pid)
            continue;
        r = &ps->xs[j];
        x->flags = PT_X_BPF_ROW | PT_X_HAVE_BLKIO | (rows[i].state == 'Z' ? PT_X_ZOMBIE : 0) |
                   ((r->bits & PT_RB_MM) ? PT_X_HAD_MM : 0);
        x->task_flags = r->task_flags;
        for (int k = 0; k < 3; k++) {
            x->uid[k] = r->ids[k];
            x->gid[k] = r->ids[3 + k];
        }
        x->cpu[0] = rows[i].utime;
        x->cpu[1] = rows[i].stime;
        x->cpu[2] = ns_to_ticks(r->cutime);
        x->cpu[3] = ns_to_ticks(r->cstime);
        x->cpu[4] = ns_to_ticks(r->blkio_ns);
        x->pidfs_ino = (int64_t)r->pid_ino;
    }
}

/* ---- rows the iterator leaves out ---------------------------------------------- */

static int
cmp_row(const void *a, const void *b)
{
    int64_t x = ((const pt_proc *)a)->pid, y = ((const pt_proc *)b)->pid;
    return (x > y) - (x < y);
}

static int
has_pid(const pt_proc *rows, size_t n, int64_t pid)
{
    size_t lo = 0, hi = n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rows[mid].pid < pid)
            lo = mid + 1;
        else if (rows[mid].pid > pid)
            hi = mid;
        else
            return 1;
    }
    return 0;
}

static void
remember_hidden(int32_t pid)
{
    for (size_t i = 0; i < hidden.n; i++)
        if (hidden.pid[i] == pid)
            return;
    if (hidden.n < HIDDEN_MAX)
        hidden.pid[hidden.n++] = pid;
}

/* Read pid through the /proc reader into rows[*n] (if there is room) and
 * account for it. Returns its thread count (0: gone or denied). */
static long
add_from_proc(pt_proc *rows, size_t cap, size_t *n, size_t *needed, int pid, int want,
              pt_scaninfo *info)
{
    pt_proc row;

    if (pt_read(pid, want & PT_WANT_MEM, &row) != 0) {
        if (errno == EACCES) {
            if (info->denied != NULL && info->ndenied < info->denied_cap) {
                info->denied[info->ndenied].pid = pid;
                info->denied[info->ndenied].uid = -1;
            }
            info->ndenied++;
        }
        return 0;
    }
    (*needed)++;
    if (*n < cap)
        rows[(*n)++] = row;
    return row.num_threads > 0 ? (long)row.num_threads : 1;
}

/* Every pid /proc lists that rows[0..nsorted) lacks, read from /proc. */
static long
reconcile(pt_proc *rows, size_t cap, size_t nsorted, size_t *n, size_t *needed, int want,
          pt_scaninfo *info)
{
    char dents[16 * 1024];
    long nread, added = 0;
    int fd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    if (fd < 0)
        return -1;
    while ((nread = syscall(SYS_getdents64, fd, dents, sizeof(dents))) > 0) {
        for (long off = 0; off < nread;) {
            struct {
                uint64_t ino;
                int64_t off;
                unsigned short reclen;
                unsigned char type;
                char name[];
            } *d = (void *)(dents + off);
            long pid = pt_name_to_pid(d->name);
            off += d->reclen;
            if (pid <= 0)
                continue;
            if (has_pid(rows, nsorted, pid))
                continue;
            if (add_from_proc(rows, cap, n, needed, (int)pid, want, info) > 0) {
                pthread_mutex_lock(&g.lock);
                remember_hidden((int32_t)pid);
                pthread_mutex_unlock(&g.lock);
                added++;
            }
        }
    }
    close(fd);
    return nread < 0 ? -1 : added;
}

/* The first table read of a process does not wait for the program's load
 * (~30-60 ms of the verifier's time, more than the /proc reader needs for a
 * whole table): reader="auto" reads /proc until the decision is made. A
 * process that reads the table a second time is likely to read it again,
 * so that read starts the load on a thread of its own, all signals blocked,
 * and later reads take the BPF reader once it is there. One-shot readers
 * never pay for it; proctable.reader() and reader="bpf" decide at once. */
static void *
loader_main(void *arg)
{
    (void)arg;
    pthread_once(&g_once, decide);
    return NULL;
}

/* The load holds several fds (maps, programs, BTF) for its ~60 ms on a thread
 * the application does not know of: it starts only where that many cannot be
 * the application's last ones. */
#define LOADER_FDS_FREE 64

static int
fds_to_spare(void)
{
    struct rlimit lim;
    DIR *dir;
    long used = 0;

    if (getrlimit(RLIMIT_NOFILE, &lim) != 0)
        return 0;
    dir = opendir("/proc/self/fd");
    if (dir == NULL)
        return 0;
    while (readdir(dir) != NULL)
        used++;
    closedir(dir);
    used -= 2;                          /* "." and ".." (the directory's fd is freed) */
    return lim.rlim_cur == RLIM_INFINITY || (long)lim.rlim_cur - used >= LOADER_FDS_FREE;
}

static void
load_when_it_pays(void)
{
    pid_t me = getpid(), was;
    pthread_attr_t attr;
    pthread_t thread;
    sigset_t all, old;
    int rc;

    if (__atomic_load_n(&g.auto_reads, __ATOMIC_RELAXED) < 1)
        return;
    was = __atomic_load_n(&g.loader, __ATOMIC_ACQUIRE);
    if (was == me)      /* started by this process (a fork's child starts its own) */
        return;
    if (!fds_to_spare())
        return;         /* a later read looks again */
    if (!__atomic_compare_exchange_n(&g.loader, &was, me, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return;
    pthread_once(&g_atfork_once, register_atfork);
    if (pthread_attr_init(&attr) != 0)
        goto failed;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&thread, &attr, loader_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc == 0)
        return;
failed:
    /* No thread to spare (RLIMIT_NPROC, say): a later read tries again. */
    __atomic_store_n(&g.loader, 0, __ATOMIC_RELEASE);
}

void
pt_bpf_auto_read_done(long n)
{
    /* Counted once a read has its rows: a read retried on ENOSPC (a table
     * larger than the caller's buffer) is still one read. */
    if (n >= 0 && !__atomic_load_n(&g.done, __ATOMIC_ACQUIRE))
        __atomic_add_fetch(&g.auto_reads, 1, __ATOMIC_RELAXED);
}

long
pt_bpf_scan(pt_proc *rows, size_t cap, int want, pt_scaninfo *info, pt_extra *extra)
{
    struct pass ps;
    int32_t known[HIDDEN_MAX];
    size_t nknown, i, n, needed, nsorted;
    long before = -1, after = -1, hidden_threads = 0;
    int link, complete, err;

    info->reader = PT_READER_PROC;
    if (want & PT_WANT_PROCFS)
        return PT_BPF_DECLINED;
    if (!(want & PT_WANT_BPF) && !__atomic_load_n(&g.done, __ATOMIC_ACQUIRE)) {
        load_when_it_pays();
        return PT_BPF_DECLINED;
    }
    pthread_once(&g_once, decide);
    link = usable_link();
    if (link < 0) {
        if (want & PT_WANT_BPF) {
            errno = ENOTSUP;
            return -1;
        }
        return PT_BPF_DECLINED;
    }

    info->ndenied = 0;
    info->needed = 0;
    info->bad_pid = 0;
    info->threads = 1;

    memset(&ps, 0, sizeof(ps));
    ps.rows = rows;
    ps.cap = cap;
    ps.want = want;
    ps.want_x = extra != NULL;
    if ((g.pretend & PT_PRETEND_SKIP_SELF) && g.pidns_level == 0)
        ps.skip_gtgid = (uint32_t)getpid();     /* the global tgid: initial namespace */
    ps.sorted = 1;
    ps.prev_pid = 0;
    /* The host's task count brackets the pass (initial namespace only). */
    if (g.pidns_level == 0)
        before = host_tasks();
    if (run_pass(link, &ps) != 0)
        goto fallback;
    if (g.pidns_level == 0)
        after = host_tasks();
    if (ps.end.userns_level != 0) {
        /* Entered a user namespace since: uids would need mapping. */
        pass_free(&ps);
        pthread_mutex_lock(&g.lock);
        g.usable = 0;
        set_why("this process is in a user namespace: the BPF reader's uids would need "
                "mapping");
        pthread_mutex_unlock(&g.lock);
        if (want & PT_WANT_BPF) {
            errno = ENOTSUP;
            return -1;
        }
        return PT_BPF_DECLINED;
    }
    if (ps.end.cpus != g.ncpus) {
        errno = ENOTSUP;
        goto fallback;
    }
    sum_threads(&ps);
    for (i = 0; i < ps.n; i++)
        rows[i].start_time = ns_to_ticks((uint64_t)rows[i].start_time +
                                         (uint64_t)ps.end.boottime_off);
    n = ps.n;
    needed = ps.total;
    if (!ps.sorted)
        qsort(rows, n, sizeof(*rows), cmp_row);
    nsorted = n;

    /* The pids the iterator left out before: from /proc, if still there. */
    pthread_mutex_lock(&g.lock);
    nknown = hidden.n;
    memcpy(known, hidden.pid, nknown * sizeof(known[0]));
    pthread_mutex_unlock(&g.lock);
    for (i = 0; i < nknown; i++) {
        long t = 0;
        if (!has_pid(rows, nsorted, known[i]))
            t = add_from_proc(rows, cap, &n, &needed, known[i], want, info);
        if (t == 0) {
            /* Listed by the iterator now, or gone: not hidden any more. */
            pthread_mutex_lock(&g.lock);
            for (size_t k = 0; k < hidden.n; k++) {
                if (hidden.pid[k] == known[i]) {
                    hidden.pid[k] = hidden.pid[--hidden.n];
                    break;
                }
            }
            pthread_mutex_unlock(&g.lock);
        }
        hidden_threads += t;
    }
    if (n != nsorted) {
        qsort(rows, n, sizeof(*rows), cmp_row);
        nsorted = n;
    }

    /* Did the iterator show every task? */
    if (ps.end.pidns_level == 0)
        complete = before >= 0 && before == after &&
                   (long)ps.visited + hidden_threads == before;
    else
        complete = (long)ps.visited + hidden_threads == (long)(ps.end.pid_allocated & 0x7fffffff);
    if (!complete && reconcile(rows, cap, nsorted, &n, &needed, want, info) < 0)
        goto fallback;
    if (ps.nosum) {
        /* rss that could not be summed here: statm's, through /proc. */
        errno = ENOTSUP;
        goto fallback;
    }

    if (needed > cap) {
        pass_free(&ps);
        info->needed = needed + HIDDEN_MAX;
        errno = ENOSPC;
        return -1;
    }
    if (n != nsorted)
        qsort(rows, n, sizeof(*rows), cmp_row);
    if (extra != NULL)
        fill_extra(&ps, rows, n, extra);
    pass_free(&ps);
    info->reader = PT_READER_BPF;
    __atomic_store_n(&g.failures, 0, __ATOMIC_RELAXED);
    return (long)n;

fallback:
    err = errno;
    pass_free(&ps);
    info->ndenied = 0;
    fell_back(err);
    if (want & PT_WANT_BPF) {
        errno = err;
        return -1;
    }
    return PT_BPF_DECLINED;
}

#endif /* PT_HAVE_BPF */

int
pt_reader(char *why, size_t len)
{
    int usable;

    pthread_once(&g_once, decide);
#ifdef PT_HAVE_BPF
    (void)usable_link();            /* a forked child, dropped privileges: check now */
#endif
    pthread_mutex_lock(&g.lock);
    usable = g.usable;
    if (why != NULL && len > 0)
        snprintf(why, len, "%s", usable ? "" : g.why);
    pthread_mutex_unlock(&g.lock);
    return usable ? PT_READER_BPF : PT_READER_PROC;
}
