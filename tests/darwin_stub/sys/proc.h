/*
 * Stand-in for macOS <sys/proc.h>: the p_stat values, and struct extern_proc
 * (the kp_proc part of struct kinfo_proc) reduced to the members pt_darwin.c
 * reads. Member names and types are Apple's; the layout is not.
 */
#ifndef _SYS_PROC_H_
#define _SYS_PROC_H_

#include <sys/param.h>
#include <sys/time.h>
#include <sys/types.h>

#ifndef MAXCOMLEN
#define MAXCOMLEN 16
#endif

struct extern_proc {
    union {
        struct timeval __p_starttime;   /* process start time */
    } p_un;
#define p_starttime p_un.__p_starttime
    char p_stat;                        /* S* process status */
    pid_t p_pid;
    char p_comm[MAXCOMLEN + 1];
    unsigned short p_xstat;             /* exit status for wait; also stop signal */
};

/* Status values. */
#define SIDL    1               /* being created by fork */
#define SRUN    2               /* runnable */
#define SSLEEP  3               /* sleeping on an address */
#define SSTOP   4               /* debugging or suspension */
#define SZOMB   5               /* awaiting collection by parent */

#endif /* _SYS_PROC_H_ */
