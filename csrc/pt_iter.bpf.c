// SPDX-License-Identifier: GPL-2.0-only OR MIT
/*
 * pt_iter.bpf.c: the BPF task iterator behind proctable's BPF reader.
 *
 * Compiled at build time with clang -target bpf and embedded in the
 * extension as a light skeleton (bpftool gen skeleton -L): the kernel itself
 * relocates every field access below against its own BTF (CO-RE), so the
 * kernel structs are declared here with only the fields read, and no
 * vmlinux.h of the build host is needed.
 *
 * The kernel calls dump_task() for every task of the reader's pid namespace,
 * in pid order, then once with no task. For each it writes one record (see
 * pt_bpf_abi.h): the raw values that fs/proc/array.c (do_task_stat),
 * fs/proc/base.c (task_dump_owner) and task_statm() turn into the stat line,
 * the directory's owner and statm. Everything that is arithmetic (the state
 * letter, clock ticks, the utime/stime split) is left to the loader, so that
 * this program only reads.
 *
 * Licensed GPL-2.0-only OR MIT: the kernel requires a GPL-compatible
 * licence string for the helpers used here; the rest of proctable is MIT.
 */

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "pt_bpf_abi.h"

/* uapi/linux/bpf.h */
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_ARRAY 6

/* include/linux/sched.h, include/linux/sched/signal.h */
#define PF_WQ_WORKER        0x00000020
#define PF_KTHREAD          0x00200000
#define SIGNAL_STOP_STOPPED 0x00000001
#define SIGNAL_GROUP_EXIT   0x00000004

/* The most CPUs whose rss counters are summed (CONFIG_NR_CPUS tops out here). */
#define PT_MAX_CPUS 8192

/* ---- the kernel's structs, only the fields read (relocated by the kernel) ---- */

struct seq_file;
struct sighand_struct;
struct worker_pool;

struct pid_namespace {
    unsigned int pid_allocated;
    unsigned int level;
} __attribute__((preserve_access_index));

struct upid {
    int nr;
    struct pid_namespace *ns;
} __attribute__((preserve_access_index));

struct pid {
    unsigned int level;
    __u64 ino;                      /* pidfs (Linux 6.9+): a pidfd's st_ino */
    struct upid numbers[1];
} __attribute__((preserve_access_index));

struct user_namespace {
    int level;
} __attribute__((preserve_access_index));

typedef struct {
    __u32 val;
} kuid_t;

typedef struct {
    __u32 val;
} kgid_t;

struct cred {
    kuid_t uid;
    kgid_t gid;
    kuid_t suid;
    kgid_t sgid;
    kuid_t euid;
    kgid_t egid;
    struct user_namespace *user_ns;
} __attribute__((preserve_access_index));

/* CONFIG_TASK_DELAY_ACCT */
struct task_delay_info {
    __u64 blkio_delay;
} __attribute__((preserve_access_index));

struct timespec64 {
    __s64 tv_sec;
    long tv_nsec;
} __attribute__((preserve_access_index));

struct timens_offsets {
    struct timespec64 boottime;
} __attribute__((preserve_access_index));

struct time_namespace {
    struct timens_offsets offsets;
} __attribute__((preserve_access_index));

struct nsproxy {
    struct time_namespace *time_ns;
} __attribute__((preserve_access_index));

struct prev_cputime {
    __u64 utime;
    __u64 stime;
} __attribute__((preserve_access_index));

struct tty_driver {
    int major;
    int minor_start;
} __attribute__((preserve_access_index));

struct tty_struct {
    struct tty_driver *driver;
    int index;
} __attribute__((preserve_access_index));

struct signal_struct {
    int nr_threads;
    int group_exit_code;
    unsigned int flags;
    struct pid *pids[4];            /* enum pid_type: PID, TGID, PGID, SID */
    struct tty_struct *tty;
    __u64 utime;
    __u64 stime;
    struct prev_cputime prev_cputime;
    __u64 cutime;
    __u64 cstime;
    unsigned long long sum_sched_runtime;
} __attribute__((preserve_access_index));

struct sched_entity {
    __u64 sum_exec_runtime;
} __attribute__((preserve_access_index));

struct percpu_counter {
    __s64 count;
    __s32 *counters;
} __attribute__((preserve_access_index));

struct mm_struct {
    unsigned long total_vm;
    struct percpu_counter rss_stat[4];  /* MM_FILEPAGES, MM_ANONPAGES, MM_SWAPENTS, MM_SHMEMPAGES */
} __attribute__((preserve_access_index));

/* Before Linux 6.2 the counters were plain atomics (statm read them as they are). */
struct mm_rss_stat {
    struct {
        __s64 counter;
    } count[4];
} __attribute__((preserve_access_index));

struct mm_struct___pre62 {
    struct mm_rss_stat rss_stat;
} __attribute__((preserve_access_index));

/* The per-CPU element pointers of a per-CPU array map. */
struct bpf_array___pt {
    union {
        char value[0];
        void *ptrs[0];
        void *pptrs[0];
    };
} __attribute__((preserve_access_index));

struct kthread {
    void *data;
    char *full_name;
} __attribute__((preserve_access_index));

struct worker {
    void *current_work;
    struct worker_pool *pool;
    char desc[32];
} __attribute__((preserve_access_index));

struct task_struct {
    unsigned int __state;
    unsigned int flags;
    struct sched_entity se;
    struct mm_struct *mm;
    int exit_state;
    int exit_code;
    int exit_signal;
    int pid;
    int tgid;
    struct task_struct *real_parent;
    struct task_struct *group_leader;
    struct pid *thread_pid;
    void *worker_private;
    __u64 utime;
    __u64 stime;
    __u64 start_boottime;
    const struct cred *real_cred;
    const struct cred *cred;
    char comm[16];
    struct nsproxy *nsproxy;
    struct signal_struct *signal;
    struct sighand_struct *sighand;
    struct task_delay_info *delays;
} __attribute__((preserve_access_index));

struct bpf_iter_meta {
    struct seq_file *seq;
    __u64 session_id;
    __u64 seq_num;
} __attribute__((preserve_access_index));

struct bpf_iter__task {
    struct bpf_iter_meta *meta;
    struct task_struct *task;
} __attribute__((preserve_access_index));

/* ---- globals ---------------------------------------------------------------- */

/* Set by the loader before load (frozen: the verifier sees them as constants). */
const volatile __u32 ncpus = 1;             /* possible CPUs */
const volatile __u32 pretend_refusal = 0;   /* test switch: make the verifier say no */

/* Where each CPU's copy of a per-CPU variable lives (the kernel's
 * __per_cpu_offset[], which is no symbol a program may name): learnt from a
 * per-CPU array of our own, on first use, then shared by every read. An entry
 * is 0 until learnt and never changes after (racing readers store the same
 * value, one aligned word), so no flag and no barrier is needed. A map, not a
 * global, so that no initial value of it is embedded in the extension. */
struct cpu_table {
    __u64 base;                 /* per-CPU address of our array's element */
    __u64 off[PT_MAX_CPUS];
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct cpu_table);
} cpus SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} pcpu_probe SEC(".maps");

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* ---- helpers ---------------------------------------------------------------- */

/* A pointer's value as a number (the verifier does not let pointers be
 * subtracted from numbers; a copy through memory it does not track is fine). */
static __always_inline __u64
addr_of(void *p)
{
    __u64 v = 0;

    bpf_probe_read_kernel(&v, sizeof(v), &p);
    return v;
}

/* The table of per-CPU offsets, with its base learnt; NULL if it cannot be had. */
static __always_inline struct cpu_table *
cpu_table(void)
{
    struct cpu_table *tab;
    __u32 zero = 0;
    __u64 arr, base = 0;

    tab = bpf_map_lookup_elem(&cpus, &zero);
    if (!tab)
        return 0;
    if (tab->base)
        return tab;
    /* struct bpf_array's pptrs[0]: the per-CPU address of our element. */
    arr = addr_of(&pcpu_probe);
    if (bpf_probe_read_kernel(&base, sizeof(base),
                              (void *)(arr + bpf_core_field_offset(struct bpf_array___pt, pptrs))) != 0
        || !base)
        return 0;
    tab->base = base;
    return tab;
}

/* __per_cpu_offset[cpu], learnt on first use; 0 if it cannot be had. */
static __always_inline __u64
cpu_offset(struct cpu_table *tab, __u32 cpu)
{
    __u32 zero = 0, idx = cpu & (PT_MAX_CPUS - 1);    /* a bound the verifier keeps */
    __u64 off;
    void *mine;

    if (cpu >= PT_MAX_CPUS)
        return 0;
    off = tab->off[idx];
    if (off)
        return off;
    mine = bpf_map_lookup_percpu_elem(&pcpu_probe, &zero, cpu);
    if (!mine)
        return 0;
    off = addr_of(mine) - tab->base;
    asm volatile("" : "+r"(idx));
    tab->off[idx & (PT_MAX_CPUS - 1)] = off;
    return off;
}

struct learn_ctx {
    struct cpu_table *tab;
};

static long
learn_cpu(__u64 cpu, void *ctx)
{
    struct learn_ctx *l = ctx;

    return cpu_offset(l->tab, (__u32)cpu) ? 0 : 1;
}

/* All ncpus offsets, learnt (for the end record: did the sums cover every CPU?). */
static __always_inline int
all_cpus_known(void)
{
    struct learn_ctx l = {cpu_table()};

    return l.tab && bpf_loop(ncpus, learn_cpu, &l, 0) == (long)ncpus;
}

struct rss_sum {
    struct cpu_table *tab;
    __u64 counters[3];  /* per-CPU addresses of MM_FILEPAGES, MM_ANONPAGES, MM_SHMEMPAGES */
    __s64 sum[3];
    int block;          /* the three are one block: one read per CPU */
};

static long
add_cpu(__u64 cpu, void *ctx)
{
    struct rss_sum *s = ctx;
    __s32 v[4] = {};
    __u64 off;

    off = cpu_offset(s->tab, (__u32)cpu);
    if (!off)
        return 1;
    if (s->block) {
        bpf_probe_read_kernel(v, sizeof(v), (void *)(s->counters[0] + off));
        s->sum[0] += v[0];
        s->sum[1] += v[1];
        s->sum[2] += v[3];
        return 0;
    }
    for (int i = 0; i < 3; i++) {
        v[0] = 0;
        bpf_probe_read_kernel(v, sizeof(v[0]), (void *)(s->counters[i] + off));
        s->sum[i] += v[0];
    }
    return 0;
}

static __always_inline __u64
positive(__s64 v)
{
    return v > 0 ? (__u64)v : 0;
}

/* task_statm()'s resident: file + anon + shmem pages, each the exact sum of
 * its per-CPU counter (percpu_counter_sum_positive); *exact is cleared when
 * the per-CPU parts could not be read. */
static __always_inline __u64
rss_pages(struct mm_struct *mm, int *exact)
{
    struct rss_sum s = {};

    if (bpf_core_type_exists(struct mm_rss_stat)) {
        struct mm_struct___pre62 *old = (void *)mm;
        return positive(old->rss_stat.count[0].counter) +
               positive(old->rss_stat.count[1].counter) +
               positive(old->rss_stat.count[3].counter);
    }
    s.sum[0] = mm->rss_stat[0].count;
    s.sum[1] = mm->rss_stat[1].count;
    s.sum[2] = mm->rss_stat[3].count;
    s.counters[0] = (__u64)mm->rss_stat[0].counters;
    s.counters[1] = (__u64)mm->rss_stat[1].counters;
    s.counters[2] = (__u64)mm->rss_stat[3].counters;
    /* The kernel allocates the counters of one mm as one per-CPU block
     * (percpu_counter_init_many), so one read per CPU gets all of them. */
    s.block = s.counters[1] == s.counters[0] + 4 && s.counters[2] == s.counters[0] + 12;
    s.tab = cpu_table();
    if (!s.tab || bpf_loop(ncpus, add_cpu, &s, 0) != (long)ncpus)
        *exact = 0;
    return positive(s.sum[0]) + positive(s.sum[1]) + positive(s.sum[2]);
}

/* pid_nr_ns(pid, ns): the number of pid in the namespace ns at depth level,
 * 0 where it has none. */
static __always_inline __s32
nr_in_ns(struct pid *pid, struct pid_namespace *ns, __u32 level)
{
    struct upid up = {};
    __s32 nr = 0;

    if (!pid || pid->level < level)
        return 0;
    if (level == 0) {
        if (pid->numbers[0].ns == ns)
            nr = pid->numbers[0].nr;
        /* Keep this load apart from the stack read below (one instruction
         * may not read through two kinds of pointer). */
        asm volatile("" : "+r"(nr));
        return nr;
    }
    bpf_probe_read_kernel(&up, sizeof(up),
                          (void *)(addr_of(pid) + bpf_core_field_offset(struct pid, numbers) +
                                   level * bpf_core_type_size(struct upid)));
    if ((__u64)up.ns == addr_of(ns))
        nr = up.nr;
    asm volatile("" : "+r"(nr));
    return nr;
}

/* The worker or kthread behind a kernel thread (to_kthread()). */
static __always_inline struct kthread *
kthread_of(struct task_struct *t)
{
    if (bpf_core_field_exists(t->worker_private))
        return (struct kthread *)t->worker_private;
    return 0;
}

/* proc_task_name() for a kernel thread: its full name (the kthread's, else
 * task->comm), and for a workqueue worker '+' (working) or '-' and the
 * description of its last work, at most 63 bytes in all. Returns the bytes
 * written to comm (no NUL), or -1 to keep task->comm. */
static __always_inline int
kernel_comm(struct task_struct *t, char *comm)
{
    struct kthread *k = kthread_of(t);
    struct worker *w = 0;
    void *pool = 0, *current_work = 0;
    char buf[PT_REC_COMM_MAX + 40];
    char *name = 0, first = 0;
    long n, m;

    if (!k)
        return -1;
    bpf_core_read(&name, sizeof(name), &k->full_name);
    n = name ? bpf_probe_read_kernel_str(buf, PT_REC_COMM_MAX, name)
             : bpf_probe_read_kernel_str(buf, 16, t->comm);
    if (n < 1)
        return -1;
    n = (n - 1) & (PT_REC_COMM_MAX - 1);
    if (t->flags & PF_WQ_WORKER) {
        bpf_core_read(&w, sizeof(w), &k->data);
        if (w) {
            bpf_core_read(&pool, sizeof(pool), &w->pool);
            bpf_core_read(&first, 1, &w->desc[0]);
        }
        if (pool && first) {
            bpf_core_read(&current_work, sizeof(current_work), &w->current_work);
            buf[n] = current_work ? '+' : '-';
            m = bpf_probe_read_kernel_str(buf + n + 1, 32,
                                          __builtin_preserve_access_index(&w->desc));
            if (m > 1)
                n += m;     /* the sign and the description, no NUL */
        }
    }
    __builtin_memcpy(comm, buf, PT_REC_COMM_MAX);
    return n > PT_REC_COMM_MAX - 1 ? PT_REC_COMM_MAX - 1 : (int)n;
}

/* ---- the program ---------------------------------------------------------------- */

SEC("iter/task")
int
dump_task(struct bpf_iter__task *ctx)
{
    struct seq_file *seq = ctx->meta->seq;
    struct task_struct *t = ctx->task;
    struct task_struct *me = bpf_get_current_task_btf();
    struct pid *mypid = me->thread_pid;
    struct pid_namespace *ns;
    struct signal_struct *sig;
    struct mm_struct *mm;
    struct pt_rec_proc r;
    __u32 level = mypid->level;
    int n;

    if (pretend_refusal) {
        /* A read above the frame: no verifier accepts it. */
        asm volatile("r0 = *(u64 *)(r10 + 8)" ::: "r0");
    }

    if (level == 0) {
        ns = mypid->numbers[0].ns;
    } else {
        struct upid up = {};
        bpf_probe_read_kernel(&up, sizeof(up),
                              (void *)(addr_of(mypid) + bpf_core_field_offset(struct pid, numbers) +
                                       level * bpf_core_type_size(struct upid)));
        ns = up.ns;
    }

    if (!t) {
        struct pt_rec_end e = {};
        struct nsproxy *nsp = me->nsproxy;
        const struct cred *cred = me->cred;

        e.kind = PT_REC_END;
        e.size = sizeof(e);
        e.pidns_level = level;
        e.pid_allocated = 0;
        bpf_core_read(&e.pid_allocated, sizeof(e.pid_allocated), &ns->pid_allocated);
        e.userns_level = cred->user_ns->level;
        if (nsp && bpf_core_field_exists(nsp->time_ns)) {
            struct time_namespace *tns = nsp->time_ns;
            if (tns)
                e.boottime_off = tns->offsets.boottime.tv_sec * 1000000000LL +
                                 tns->offsets.boottime.tv_nsec;
        }
        e.cpus = all_cpus_known() ? ncpus : 0;
        bpf_seq_write(seq, &e, sizeof(e));
        return 0;
    }

    sig = t->signal;
    if (!t->sighand || !sig) {
        struct pt_rec_gone g = {PT_REC_GONE, sizeof(g), 0};
        bpf_seq_write(seq, &g, sizeof(g));
        return 0;
    }

    if (t->group_leader != t) {
        struct pt_rec_thread th;
        th.kind = PT_REC_THREAD;
        th.size = sizeof(th);
        th.gtgid = t->tgid;
        th.utime = t->utime;
        th.stime = t->stime;
        th.runtime = t->se.sum_exec_runtime;
        bpf_seq_write(seq, &th, sizeof(th));
        return 0;
    }

    __builtin_memset(&r, 0, sizeof(r));
    r.kind = PT_REC_PROC;
    r.pid = nr_in_ns(t->thread_pid, ns, level);
    r.ppid = nr_in_ns(t->real_parent->signal->pids[1], ns, level);
    r.pgid = nr_in_ns(sig->pids[2], ns, level);
    r.sid = nr_in_ns(sig->pids[3], ns, level);
    r.gtgid = t->tgid;
    r.state = t->__state;
    r.exit_state = t->exit_state;
    r.exit_code = t->exit_code;
    if (sig->flags & (SIGNAL_GROUP_EXIT | SIGNAL_STOP_STOPPED))
        r.exit_code = sig->group_exit_code;
    r.num_threads = sig->nr_threads;
    if (t->exit_signal < 0)
        r.bits |= PT_RB_THREAD;
    if (sig->tty) {
        struct tty_struct *tty = sig->tty;
        r.bits |= PT_RB_TTY;
        r.tty_major = tty->driver->major;
        r.tty_minor = tty->driver->minor_start + tty->index;
    }
    r.start_ns = t->start_boottime;
    r.utime = sig->utime + t->utime;
    r.stime = sig->stime + t->stime;
    r.runtime = sig->sum_sched_runtime + t->se.sum_exec_runtime;
    r.prev_utime = sig->prev_cputime.utime;
    r.prev_stime = sig->prev_cputime.stime;
    r.cutime = sig->cutime;
    r.cstime = sig->cstime;
    if (bpf_core_field_exists(t->delays)) {
        struct task_delay_info *d = t->delays;
        if (d)
            r.blkio_ns = d->blkio_delay;
    }
    r.task_flags = t->flags;
    if (bpf_core_field_exists(t->thread_pid->ino))
        r.pid_ino = t->thread_pid->ino;
    {
        /* status prints the objective cred (real_cred), a kernel thread's too. */
        const struct cred *rc = t->real_cred;
        r.ids[0] = rc->uid.val;
        r.ids[1] = rc->euid.val;
        r.ids[2] = rc->suid.val;
        r.ids[3] = rc->gid.val;
        r.ids[4] = rc->egid.val;
        r.ids[5] = rc->sgid.val;
    }

    n = -1;
    if (t->flags & PF_KTHREAD) {
        r.bits |= PT_RB_KTHREAD;
        r.uid = 0;
        n = kernel_comm(t, r.comm);
    } else {
        r.uid = t->real_cred->euid.val;
        mm = t->mm;
        if (mm) {
            int exact = 1;
            r.bits |= PT_RB_MM;
            r.vms = mm->total_vm;
            r.rss = rss_pages(mm, &exact);
            if (!exact)
                r.bits |= PT_RB_NOSUM;
        }
    }
    if (n < 0) {
        __builtin_memcpy(r.comm, t->comm, 16);
        r.comm_len = 16;
    } else {
        r.comm_len = n > PT_REC_COMM_MAX ? PT_REC_COMM_MAX : n;
    }
    r.size = (__builtin_offsetof(struct pt_rec_proc, comm) + r.comm_len + 7) & ~7;
    if (r.size > sizeof(r))
        r.size = sizeof(r);
    bpf_seq_write(seq, &r, r.size);
    return 0;
}
