/*
 * wanxport.sim._eventloop: the simulator's virtual-time event loop in C.
 *
 * A 256-path terabyte simulation runs about seven million events. With
 * ``heapq`` each one was a ``(time, seq, fn, args)`` tuple plus an args tuple,
 * and every heap step compared tuples through the generic rich comparison:
 * together about a fifth of the run. Here an event is a plain struct in a
 * binary heap ordered by (time, seq) with native comparisons; a callback's
 * arguments are kept inline (up to MAX_INLINE_ARGS) and passed with
 * vectorcall, so scheduling and running an event allocate nothing.
 *
 * Semantics are exactly those of ``wanxport.sim.eventloop.ReferenceEventLoop``
 * (the pure-Python reference; a test runs both on the same random schedules
 * and compares the traces): ties run in scheduling order, scheduling in the
 * past runs "now", cancelled handles are skipped.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>

#define MAX_INLINE_ARGS 4

typedef struct {
    double t;
    unsigned long long seq;
    PyObject *fn;
    Py_ssize_t nargs;            /* > MAX_INLINE_ARGS: args[0] is a tuple of them */
    PyObject *args[MAX_INLINE_ARGS];
} Event;

typedef struct {
    PyObject_HEAD
    double now;
    unsigned long long seq;
    unsigned long long processed;
    Event *heap;
    Py_ssize_t size;
    Py_ssize_t capacity;
    PyObject *cancelled;         /* set of int handles */
} EventLoop;

static inline int before(const Event *a, const Event *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static void event_clear(Event *e)
{
    Py_ssize_t n = e->nargs > MAX_INLINE_ARGS ? 1 : e->nargs;
    Py_CLEAR(e->fn);
    for (Py_ssize_t i = 0; i < n; i++)
        Py_CLEAR(e->args[i]);
}

static int heap_push(EventLoop *self, const Event *e)
{
    if (self->size == self->capacity) {
        Py_ssize_t capacity = self->capacity ? 2 * self->capacity : 256;
        Event *grown = PyMem_Realloc(self->heap, (size_t)capacity * sizeof(Event));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->heap = grown;
        self->capacity = capacity;
    }
    Event *heap = self->heap;
    Py_ssize_t pos = self->size++;
    while (pos > 0) {
        Py_ssize_t parent = (pos - 1) >> 1;
        if (!before(e, &heap[parent]))
            break;
        heap[pos] = heap[parent];
        pos = parent;
    }
    heap[pos] = *e;
    return 0;
}

/* Remove the earliest event into *out (the caller owns its references). */
static void heap_pop(EventLoop *self, Event *out)
{
    Event *heap = self->heap;
    *out = heap[0];
    Py_ssize_t size = --self->size;
    if (size == 0)
        return;
    Event last = heap[size];
    Py_ssize_t pos = 0;
    for (;;) {
        Py_ssize_t child = 2 * pos + 1;
        if (child >= size)
            break;
        if (child + 1 < size && before(&heap[child + 1], &heap[child]))
            child++;
        if (!before(&heap[child], &last))
            break;
        heap[pos] = heap[child];
        pos = child;
    }
    heap[pos] = last;
}

static PyObject *schedule(EventLoop *self, double t, PyObject *fn, PyObject *const *args,
                          Py_ssize_t nargs)
{
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "the callback must be callable");
        return NULL;
    }
    if (isnan(t)) {
        PyErr_SetString(PyExc_ValueError, "an event's time must be a number, not NaN");
        return NULL;
    }
    Event e;
    e.t = t > self->now ? t : self->now;
    e.seq = self->seq;
    e.nargs = nargs;
    if (nargs <= MAX_INLINE_ARGS) {
        for (Py_ssize_t i = 0; i < nargs; i++)
            e.args[i] = Py_NewRef(args[i]);
    } else {
        PyObject *packed = PyTuple_New(nargs);
        if (packed == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < nargs; i++)
            PyTuple_SET_ITEM(packed, i, Py_NewRef(args[i]));
        e.args[0] = packed;
    }
    e.fn = Py_NewRef(fn);
    if (heap_push(self, &e) < 0) {
        event_clear(&e);
        return NULL;
    }
    self->seq++;
    return PyLong_FromUnsignedLongLong(e.seq);
}

/* call_at / call_later: args[0] is a time (added to `base`), args[1] the callback. */
static PyObject *schedule_from_args(EventLoop *self, PyObject *const *args, Py_ssize_t nargs,
                                    double base, const char *usage)
{
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    double t = PyFloat_AsDouble(args[0]);
    if (t == -1.0 && PyErr_Occurred())
        return NULL;
    return schedule(self, base + t, args[1], args + 2, nargs - 2);
}

static PyObject *EventLoop_call_at(EventLoop *self, PyObject *const *args, Py_ssize_t nargs)
{
    return schedule_from_args(self, args, nargs, 0.0,
                              "call_at(t, fn, *args) takes a time and a callback");
}

static PyObject *EventLoop_call_later(EventLoop *self, PyObject *const *args, Py_ssize_t nargs)
{
    return schedule_from_args(self, args, nargs, self->now,
                              "call_later(delay, fn, *args) takes a delay and a callback");
}

static PyObject *EventLoop_cancel(EventLoop *self, PyObject *handle)
{
    if (!PyLong_Check(handle)) {
        PyErr_SetString(PyExc_TypeError, "cancel() takes a handle returned by call_at");
        return NULL;
    }
    if (PySet_Add(self->cancelled, handle) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *EventLoop_next_time(EventLoop *self, PyObject *Py_UNUSED(ignored))
{
    if (self->size == 0)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(self->heap[0].t);
}

/* 1: skip this event (it was cancelled), 0: run it, -1: error. */
static int take_cancelled(EventLoop *self, unsigned long long seq)
{
    if (PySet_GET_SIZE(self->cancelled) == 0)
        return 0;
    PyObject *key = PyLong_FromUnsignedLongLong(seq);
    if (key == NULL)
        return -1;
    int found = PySet_Discard(self->cancelled, key);
    Py_DECREF(key);
    return found;
}

/* Run events due at or before `until`, stopping early when stop() is true. */
static int run_events(EventLoop *self, double until, PyObject *stop)
{
    while (self->size > 0 && self->heap[0].t <= until) {
        Event e;
        heap_pop(self, &e);
        int skip = take_cancelled(self, e.seq);
        if (skip != 0) {
            event_clear(&e);
            if (skip < 0)
                return -1;
            continue;
        }
        self->now = e.t;
        self->processed++;
        PyObject *result;
        if (e.nargs <= MAX_INLINE_ARGS)
            result = PyObject_Vectorcall(e.fn, e.args, (size_t)e.nargs, NULL);
        else
            result = PyObject_Call(e.fn, e.args[0], NULL);
        event_clear(&e);
        if (result == NULL)
            return -1;
        Py_DECREF(result);
        if (stop != NULL) {
            PyObject *flag = PyObject_CallNoArgs(stop);
            if (flag == NULL)
                return -1;
            int done = PyObject_IsTrue(flag);
            Py_DECREF(flag);
            if (done < 0)
                return -1;
            if (done)
                break;
        }
    }
    return 0;
}

static PyObject *EventLoop_run(EventLoop *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"stop", "until", NULL};
    PyObject *stop = Py_None;
    double until = INFINITY;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Od:run", keywords, &stop, &until))
        return NULL;
    if (run_events(self, until, stop == Py_None ? NULL : stop) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *EventLoop_run_until(EventLoop *self, PyObject *arg)
{
    double t = PyFloat_AsDouble(arg);
    if (t == -1.0 && PyErr_Occurred())
        return NULL;
    if (run_events(self, t, NULL) < 0)
        return NULL;
    if (t > self->now && !isinf(t))
        self->now = t;
    Py_RETURN_NONE;
}

static Py_ssize_t EventLoop_len(EventLoop *self)
{
    return self->size;
}

static int EventLoop_init(EventLoop *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"start", NULL};
    double start = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|d:EventLoop", keywords, &start))
        return -1;
    self->now = start;
    if (self->cancelled == NULL) {
        self->cancelled = PySet_New(NULL);
        if (self->cancelled == NULL)
            return -1;
    }
    return 0;
}

static int EventLoop_traverse(EventLoop *self, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < self->size; i++) {
        Event *e = &self->heap[i];
        Py_VISIT(e->fn);
        Py_ssize_t n = e->nargs > MAX_INLINE_ARGS ? 1 : e->nargs;
        for (Py_ssize_t j = 0; j < n; j++)
            Py_VISIT(e->args[j]);
    }
    Py_VISIT(self->cancelled);
    return 0;
}

static int EventLoop_clear(EventLoop *self)
{
    /* Empty the heap first: clearing an event may run arbitrary code. */
    while (self->size > 0) {
        Event e = self->heap[--self->size];
        event_clear(&e);
    }
    Py_CLEAR(self->cancelled);
    return 0;
}

static void EventLoop_dealloc(EventLoop *self)
{
    PyObject_GC_UnTrack(self);
    EventLoop_clear(self);
    PyMem_Free(self->heap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef EventLoop_methods[] = {
    {"call_at", (PyCFunction)(void (*)(void))EventLoop_call_at, METH_FASTCALL,
     "call_at(t, fn, *args) -> handle: run fn(*args) at virtual time t (now, if t is past)."},
    {"call_later", (PyCFunction)(void (*)(void))EventLoop_call_later, METH_FASTCALL,
     "call_later(delay, fn, *args) -> handle: run fn(*args) delay seconds from now."},
    {"cancel", (PyCFunction)EventLoop_cancel, METH_O,
     "cancel(handle): skip a pending callback (only handles that have not run yet)."},
    {"next_time", (PyCFunction)EventLoop_next_time, METH_NOARGS,
     "Time of the earliest pending event (cancelled ones included), or None."},
    {"run", (PyCFunction)(void (*)(void))EventLoop_run, METH_VARARGS | METH_KEYWORDS,
     "run(stop=None, until=inf): run events until none are left, stop() is true after one, or until."},
    {"run_until", (PyCFunction)EventLoop_run_until, METH_O,
     "run_until(t): run every event due at or before t, then set now = t."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef EventLoop_members[] = {
    {"now", T_DOUBLE, offsetof(EventLoop, now), READONLY, "Current virtual time (seconds)."},
    {"processed", T_ULONGLONG, offsetof(EventLoop, processed), READONLY, "Events run so far."},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods EventLoop_as_sequence = {
    .sq_length = (lenfunc)EventLoop_len,
};

static PyTypeObject EventLoopType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wanxport.sim._eventloop.EventLoop",
    .tp_doc = "Discrete-event scheduler over virtual time in float seconds (native).",
    .tp_basicsize = sizeof(EventLoop),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)EventLoop_init,
    .tp_dealloc = (destructor)EventLoop_dealloc,
    .tp_traverse = (traverseproc)EventLoop_traverse,
    .tp_clear = (inquiry)EventLoop_clear,
    .tp_methods = EventLoop_methods,
    .tp_members = EventLoop_members,
    .tp_as_sequence = &EventLoop_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "wanxport.sim._eventloop",
    .m_doc = "The simulator's event loop in C (see wanxport.sim.eventloop).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__eventloop(void)
{
    if (PyType_Ready(&EventLoopType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "EventLoop", (PyObject *)&EventLoopType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
