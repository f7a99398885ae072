/*
 * pt_bpf_abi.h: the records the BPF task iterator (pt_iter.bpf.c) writes and
 * the loader (pt_bpf.c) reads. Shared by both sides; plain fixed-width types
 * only (the BPF side defines them itself, userspace takes them from
 * <stdint.h>). Nothing here is part of the public C contract.
 *
 * Every record starts with a u16 kind and a u16 size (bytes, a multiple of
 * 8, the header included), so the reader can step over records it does not
 * know. One record per task the iterator visits (PT_REC_PROC for a
 * thread-group leader, PT_REC_THREAD for any other thread, PT_REC_GONE for a
 * task already being released), then one PT_REC_END.
 */
#ifndef PT_BPF_ABI_H
#define PT_BPF_ABI_H

#define PT_REC_PROC    1
#define PT_REC_THREAD  2
#define PT_REC_GONE    3
#define PT_REC_END     4

#define PT_REC_COMM_MAX 64

/* pt_rec_proc.bits */
#define PT_RB_KTHREAD   1       /* PF_KTHREAD: owner root, no mm */
#define PT_RB_THREAD    2       /* exit_signal < 0 (field 38 is -1) */
#define PT_RB_TTY       4       /* tty_major/tty_minor are set */
#define PT_RB_MM        8       /* rss and vms come from an mm */
#define PT_RB_NOSUM    16       /* the per-CPU rss counters could not be summed */

/* A thread-group leader. Times in ns, memory in pages, pids in the reader's
 * pid namespace (0 where a pid is not visible there, as /proc prints it). */
struct pt_rec_proc {
    __u16 kind;
    __u16 size;                 /* offsetof(comm) + comm_len rounded up to 8 */
    __u8 comm_len;
    __u8 bits;                  /* PT_RB_* */
    __u8 pad[2];
    __s32 pid;
    __s32 ppid;
    __s32 pgid;
    __s32 sid;
    __u32 gtgid;                /* tgid in the initial namespace: the key of
                                   this process's PT_REC_THREAD records */
    __u32 state;                /* task->__state */
    __u32 exit_state;           /* task->exit_state */
    __s32 exit_code;            /* task->exit_code, or the group's as stat shows it */
    __u32 uid;                  /* euid of the task's objective cred (global uid) */
    __u32 num_threads;          /* signal->nr_threads */
    __u32 tty_major;
    __u32 tty_minor;            /* minor_start + index */
    __u32 task_flags;           /* task->flags (stat field 9) */
    __u32 ids[6];               /* real_cred's uid, euid, suid, gid, egid, sgid (global
                                   ids; status's Uid and Gid lines, first three) */
    __u64 start_ns;             /* task->start_boottime */
    __u64 utime;                /* signal->utime + the leader's own */
    __u64 stime;
    __u64 runtime;              /* signal->sum_sched_runtime + se.sum_exec_runtime */
    __u64 prev_utime;           /* signal->prev_cputime: what stat last printed */
    __u64 prev_stime;
    __u64 cutime;               /* signal->cutime: reaped children's, ns */
    __u64 cstime;
    __u64 blkio_ns;             /* delays->blkio_delay (0 without delays): stat field 42 */
    __u64 pid_ino;              /* the pidfs inode of its struct pid, what fstat of a
                                   pidfd says (Linux 6.9+; 0: unknown): its identity */
    __u64 rss;                  /* file + anon + shmem pages, per-CPU counters summed */
    __u64 vms;                  /* mm->total_vm */
    char comm[PT_REC_COMM_MAX]; /* comm_len bytes, no NUL */
};

/* Any other thread: its share of the process's CPU time. */
struct pt_rec_thread {
    __u16 kind;
    __u16 size;
    __u32 gtgid;
    __u64 utime;
    __u64 stime;
    __u64 runtime;
};

/* A task already being released (no sighand): counted as visited, no row. */
struct pt_rec_gone {
    __u16 kind;
    __u16 size;
    __u32 pad;
};

/* After the last task: what the reader needs to know about itself. */
struct pt_rec_end {
    __u16 kind;
    __u16 size;
    __u32 pidns_level;          /* the reader's pid namespace depth (0: initial) */
    __u32 pid_allocated;        /* pids allocated in that namespace */
    __u32 userns_level;         /* the reader's user namespace depth */
    __s64 boottime_off;         /* the reader's time namespace boottime offset, ns */
    __u32 cpus;                 /* CPUs whose rss counters were summed */
    __u32 pad;
};

#endif /* PT_BPF_ABI_H */
