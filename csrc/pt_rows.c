/*
 * pt_rows.c: proctable._rows, the Python row type over a copy of one pt_proc.
 *
 * Why this exists beside the cffi module: a whole-table read costs a few
 * microseconds of kernel work per process, and turning the C rows into Python
 * objects used to cost a quarter of that again (a tuple per row unpacked, a
 * second one built, then a Python property per field read). Here a row is one
 * allocation holding the pt_proc bytes, built straight from the C buffer, and
 * every field is a C getter. cffi cannot hand out Python objects, so this small
 * module does only that and holds no other logic.
 *
 * It is built against the limited API (abi3, CPython 3.9+) except on
 * free-threaded builds. Module state: three numbers set once at import
 * (configure()); rows are immutable, hold no references, and need no GC.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <string.h>

#include "proctable.h"

/* Set once by configure() at import of proctable._lowlevel, before any row. */
static double boot_epoch = 0.0;     /* seconds since the epoch at boot */
static double ticks_per_second = 100.0;
static long long page_size = 4096;

typedef struct {
    PyObject_HEAD
    pt_proc row;
} RowObject;

#define ROW(o) (&((RowObject *)(o))->row)

static PyObject *
int_or_none(int known, int64_t value)
{
    if (!known)
        Py_RETURN_NONE;
    return PyLong_FromLongLong((long long)value);
}

static PyObject *
get_sid(PyObject *self, void *closure)
{
    (void)closure;
    return int_or_none(ROW(self)->flags & PT_F_HAVE_SID, ROW(self)->sid);
}

static PyObject *
get_num_threads(PyObject *self, void *closure)
{
    (void)closure;
    return int_or_none(ROW(self)->flags & PT_F_HAVE_CPU, ROW(self)->num_threads);
}

static PyObject *
get_uid(PyObject *self, void *closure)
{
    (void)closure;
    return int_or_none(ROW(self)->flags & PT_F_HAVE_UID, ROW(self)->uid);
}

/* pages * page_size in bytes, as a Python int: a product that does not fit
 * in 64 bits (a row built by hand) is multiplied by Python, never wrapped. */
static PyObject *
bytes_of(int have, int64_t pages)
{
    long long bytes;
    PyObject *a, *b, *out;

    if (!have)
        Py_RETURN_NONE;
    if (!__builtin_mul_overflow((long long)pages, page_size, &bytes))
        return PyLong_FromLongLong(bytes);
    a = PyLong_FromLongLong((long long)pages);
    b = PyLong_FromLongLong(page_size);
    out = a != NULL && b != NULL ? PyNumber_Multiply(a, b) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    return out;
}

static PyObject *
get_rss(PyObject *self, void *closure)
{
    (void)closure;
    return bytes_of(ROW(self)->flags & PT_F_HAVE_MEM, ROW(self)->rss);
}

static PyObject *
get_vms(PyObject *self, void *closure)
{
    (void)closure;
    return bytes_of(ROW(self)->flags & PT_F_HAVE_MEM, ROW(self)->vms);
}

static PyObject *
get_utime(PyObject *self, void *closure)
{
    (void)closure;
    if (!(ROW(self)->flags & PT_F_HAVE_CPU))
        Py_RETURN_NONE;
    return PyFloat_FromDouble((double)ROW(self)->utime / ticks_per_second);
}

static PyObject *
get_stime(PyObject *self, void *closure)
{
    (void)closure;
    if (!(ROW(self)->flags & PT_F_HAVE_CPU))
        Py_RETURN_NONE;
    return PyFloat_FromDouble((double)ROW(self)->stime / ticks_per_second);
}

static PyObject *
get_create_time(PyObject *self, void *closure)
{
    (void)closure;
    return PyFloat_FromDouble(boot_epoch + (double)ROW(self)->start_time / ticks_per_second);
}

static PyObject *
get_state(PyObject *self, void *closure)
{
    char c = ROW(self)->state;

    (void)closure;
    /* A state is one ASCII letter (the parser checks it); anything else reads '?'. */
    if ((unsigned char)c >= 0x80)
        c = '?';
    return PyUnicode_FromStringAndSize(&c, 1);
}

static PyObject *
get_name(PyObject *self, void *closure)
{
    const pt_proc *r = ROW(self);

    (void)closure;
    return PyUnicode_DecodeUTF8(r->comm, r->comm_len, "surrogateescape");
}

static PyObject *
get_raw_exit_code(PyObject *self, void *closure)
{
    (void)closure;
    return int_or_none(ROW(self)->flags & PT_F_HAVE_EXIT, ROW(self)->exit_code);
}

static PyObject *
get_kernel_thread(PyObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong((ROW(self)->flags & PT_F_KTHREAD) != 0);
}

static PyObject *
get_exit_masked(PyObject *self, void *closure)
{
    const pt_proc *r = ROW(self);

    (void)closure;
    return PyBool_FromLong(r->state == 'Z' && (r->flags & PT_F_EXIT_MASKED));
}

/* The wait status of a whole-process zombie (state Z, one thread) whose field
 * 52 this reader may see; None otherwise. (The raw thread slot is read: a macOS
 * zombie has one thread and no known counters.) */
static PyObject *
get_exit_status_word(PyObject *self, void *closure)
{
    const pt_proc *r = ROW(self);

    (void)closure;
    if (r->state != 'Z' || r->num_threads != 1 || !(r->flags & PT_F_HAVE_EXIT)
        || (r->flags & PT_F_EXIT_MASKED))
        Py_RETURN_NONE;
    return PyLong_FromLongLong((long long)r->exit_code);
}

static PyGetSetDef row_getset[] = {
    {"sid", get_sid, NULL, "Session id; None where the kernel gives none (a macOS zombie).",
     NULL},
    {"num_threads", get_num_threads, NULL,
     "Number of threads; None where the kernel does not say (macOS: a zombie, whose task "
     "is gone, or another user's process).", NULL},
    {"uid", get_uid, NULL,
     "The effective uid (the owner of /proc/<pid>, which the kernel keeps right also for "
     "non-dumpable processes and zombies); None if unknown.", NULL},
    {"rss", get_rss, NULL,
     "Resident set size in bytes, the exact figure ps, top and psutil show (Linux: statm); "
     "None in a table read without memory figures.", NULL},
    {"vms", get_vms, NULL,
     "Virtual memory size in bytes (Linux: statm); None without memory figures.", NULL},
    {"utime", get_utime, NULL,
     "User CPU time in seconds (all threads); None where the kernel hides it.", NULL},
    {"stime", get_stime, NULL,
     "System CPU time in seconds (all threads); None where the kernel hides it.", NULL},
    {"create_time", get_create_time, NULL,
     "Start time in seconds since the epoch (boot time + start ticks, as ps does).", NULL},
    {"state", get_state, NULL, "The kernel's one-letter state: R, S, D, Z, T, t, X, I, ...",
     NULL},
    {"name", get_name, NULL,
     "The comm (up to 15 bytes, 64 for kernel threads); may hold spaces and ')'.", NULL},
    {"raw_exit_code", get_raw_exit_code, NULL,
     "Field 52 as printed (None on kernels before 3.5). Meaningful only in state Z.", NULL},
    {"kernel_thread", get_kernel_thread, NULL,
     "True for a kernel thread (kthreadd and its children: no user space, no cmdline).",
     NULL},
    {"exit_masked", get_exit_masked, NULL,
     "True when this is a zombie whose exit status the kernel hides from us.", NULL},
    {"_exit_status_word", get_exit_status_word, NULL,
     "The wait status behind Proc.exit, or None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef row_members[] = {
    {"pid", T_LONGLONG, offsetof(RowObject, row.pid), READONLY, "Process id."},
    {"ppid", T_LONGLONG, offsetof(RowObject, row.ppid), READONLY,
     "Parent's pid (0 for the kernel's roots)."},
    {"pgid", T_LONGLONG, offsetof(RowObject, row.pgid), READONLY, "Process group id."},
    {"tty_nr", T_LONGLONG, offsetof(RowObject, row.tty_nr), READONLY,
     "Controlling terminal's device number (0: none)."},
    {"start_time", T_LONGLONG, offsetof(RowObject, row.start_time), READONLY,
     "The kernel's start stamp in clock ticks since boot; with pid, the identity."},
    {NULL, 0, 0, 0, NULL},
};

/* The raw row as a tuple, in pt_proc's order: (pid, ppid, pgid, sid, tty_nr,
 * start_time, utime, stime, num_threads, rss, uid, exit_code, vms, flags,
 * state, comm), the last two as bytes. What pickling and Row(raw) use. */
static PyObject *
row_raw(PyObject *self, PyObject *unused)
{
    const pt_proc *r = ROW(self);

    (void)unused;
    return Py_BuildValue("(LLLLLLLLLLLLLiy#y#)", (long long)r->pid, (long long)r->ppid,
                         (long long)r->pgid, (long long)r->sid, (long long)r->tty_nr,
                         (long long)r->start_time, (long long)r->utime, (long long)r->stime,
                         (long long)r->num_threads, (long long)r->rss, (long long)r->uid,
                         (long long)r->exit_code, (long long)r->vms, (int)r->flags,
                         &r->state, (Py_ssize_t)1, r->comm, (Py_ssize_t)r->comm_len);
}

static PyObject *
row_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    long long v[13];
    int flags;
    const char *state, *comm;
    Py_ssize_t state_len, comm_len;
    PyObject *self;
    allocfunc alloc;
    pt_proc *r;

    if (kwds != NULL && PyDict_Size(kwds) > 0) {
        PyErr_SetString(PyExc_TypeError, "a row takes one tuple, no keywords");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "(LLLLLLLLLLLLLiy#y#):Proc", &v[0], &v[1], &v[2], &v[3],
                          &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10], &v[11],
                          &v[12], &flags, &state, &state_len, &comm, &comm_len))
        return NULL;
    if (state_len != 1 || comm_len > PT_COMM_MAX) {
        PyErr_Format(PyExc_ValueError, "a row's state is one byte and its comm at most %d",
                     PT_COMM_MAX);
        return NULL;
    }
    alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    self = alloc(type, 0);
    if (self == NULL)
        return NULL;
    r = ROW(self);
    memset(r, 0, sizeof(*r));
    r->pid = v[0];
    r->ppid = v[1];
    r->pgid = v[2];
    r->sid = v[3];
    r->tty_nr = v[4];
    r->start_time = v[5];
    r->utime = v[6];
    r->stime = v[7];
    r->num_threads = v[8];
    r->rss = v[9];
    r->uid = v[10];
    r->exit_code = v[11];
    r->vms = v[12];
    r->flags = flags;
    r->state = state[0];
    r->comm_len = (unsigned char)comm_len;
    memcpy(r->comm, comm, (size_t)comm_len);
    return self;
}

static void
row_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    freefunc tp_free = (freefunc)PyType_GetSlot(type, Py_tp_free);

    tp_free(self);
    Py_DECREF(type);
}

/* Two rows are equal when every field is (a row is a value, as the tuple it
 * used to be). */
static int
rows_equal(const pt_proc *a, const pt_proc *b)
{
    return a->pid == b->pid && a->ppid == b->ppid && a->pgid == b->pgid && a->sid == b->sid
        && a->tty_nr == b->tty_nr && a->start_time == b->start_time && a->utime == b->utime
        && a->stime == b->stime && a->num_threads == b->num_threads && a->rss == b->rss
        && a->uid == b->uid && a->exit_code == b->exit_code && a->vms == b->vms
        && a->flags == b->flags && a->state == b->state && a->comm_len == b->comm_len
        && memcmp(a->comm, b->comm, a->comm_len) == 0;
}

static PyObject *row_type_ref = NULL;  /* the base type, for richcompare's check */

static PyObject *
row_richcompare(PyObject *a, PyObject *b, int op)
{
    int eq;

    if ((op != Py_EQ && op != Py_NE) || !PyObject_TypeCheck(b, (PyTypeObject *)row_type_ref))
        Py_RETURN_NOTIMPLEMENTED;
    eq = rows_equal(ROW(a), ROW(b));
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static Py_hash_t
row_hash(PyObject *self)
{
    const pt_proc *r = ROW(self);
    uint64_t h = 1469598103934665603ULL;
    const int64_t parts[6] = {r->pid, r->start_time, r->utime, r->stime, r->rss, r->flags};

    for (int i = 0; i < 6; i++) {
        h ^= (uint64_t)parts[i];
        h *= 1099511628211ULL;
    }
    h ^= (uint64_t)(unsigned char)r->state;
    return (Py_hash_t)(h == (uint64_t)-1 ? 2 : h);
}

static PyMethodDef row_methods[] = {
    {"_raw", row_raw, METH_NOARGS, "The raw row as a tuple (see Row.__new__)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot row_slots[] = {
    {Py_tp_doc, (void *)"One process row over a copy of the C reader's pt_proc. Immutable."},
    {Py_tp_new, (void *)row_new},
    {Py_tp_dealloc, (void *)row_dealloc},
    {Py_tp_getset, row_getset},
    {Py_tp_members, row_members},
    {Py_tp_methods, row_methods},
    {Py_tp_richcompare, (void *)row_richcompare},
    {Py_tp_hash, (void *)row_hash},
    {0, NULL},
};

static PyType_Spec row_spec = {
    "proctable._rows.Row",
    sizeof(RowObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    row_slots,
};

/* build(cls, address, n): a list of n cls instances, one per pt_proc of the
 * array at address (a cffi pointer cast to an int by the caller, who keeps the
 * array alive for the call). cls must be Row or a subclass that adds no
 * instance storage (a Python subclass with __slots__ = ()). */
static PyObject *
rows_build(PyObject *module, PyObject *args)
{
    PyObject *cls, *list, *obj;
    unsigned long long address;
    Py_ssize_t n, i;
    allocfunc alloc;
    const pt_proc *rows;

    (void)module;
    if (!PyArg_ParseTuple(args, "OKn:build", &cls, &address, &n))
        return NULL;
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls,
                                                (PyTypeObject *)row_type_ref)) {
        PyErr_SetString(PyExc_TypeError, "build() needs Row or a subclass of it");
        return NULL;
    }
    if (n < 0 || (n > 0 && address == 0)) {
        PyErr_SetString(PyExc_ValueError, "build() needs a row array and a count >= 0");
        return NULL;
    }
    alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)cls, Py_tp_alloc);
    rows = (const pt_proc *)(uintptr_t)address;
    list = PyList_New(n);
    if (list == NULL)
        return NULL;
    for (i = 0; i < n; i++) {
        obj = alloc((PyTypeObject *)cls, 0);
        if (obj == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        memcpy(ROW(obj), &rows[i], sizeof(pt_proc));
        if (PyList_SetItem(list, i, obj) != 0) {    /* steals obj */
            Py_DECREF(list);
            return NULL;
        }
    }
    return list;
}

static PyObject *
rows_configure(PyObject *module, PyObject *args)
{
    double boot, hz;
    long long page;

    (void)module;
    if (!PyArg_ParseTuple(args, "ddL:configure", &boot, &hz, &page))
        return NULL;
    if (!(hz > 0) || page <= 0) {
        PyErr_SetString(PyExc_ValueError, "configure() needs hz > 0 and page > 0");
        return NULL;
    }
    boot_epoch = boot;
    ticks_per_second = hz;
    page_size = page;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"build", rows_build, METH_VARARGS,
     "build(cls, address, n) -> list: rows from a pt_proc array."},
    {"configure", rows_configure, METH_VARARGS,
     "configure(boot_epoch, ticks_per_second, page_size): the units rows convert with."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef rows_module = {
    PyModuleDef_HEAD_INIT, "proctable._rows",
    "The row type of proctable's tables (private; see proctable.Proc).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__rows(void)
{
    PyObject *m, *type;

    m = PyModule_Create(&rows_module);
    if (m == NULL)
        return NULL;
    type = PyType_FromSpec(&row_spec);
    if (type == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    row_type_ref = type;    /* the module keeps it alive for good (never unloaded) */
    Py_INCREF(type);
    if (PyModule_AddObject(m, "Row", type) != 0) {
        Py_DECREF(type);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "ROW_SIZE", (long)sizeof(pt_proc)) != 0) {
        Py_DECREF(m);
        return NULL;
    }
#ifdef Py_GIL_DISABLED
    PyUnstable_Module_SetGIL(m, Py_MOD_GIL_NOT_USED);
#endif
    return m;
}
