/*
 * AckRecord: the packet numbers one path received, as an ACK frame reports them.
 *
 * The receiver's record of a path: sorted, disjoint, non-touching ranges
 * [start, end), bounded like wanxport/wire/ack_record.py (its pure-Python
 * reference, held identical by tests/test_native_ack_record.py): past
 * ACK_RANGES_KEPT ranges only the newest half is kept. It exists in C because
 * the event loop asks it something for every run of datagrams it is told
 * about (record them, is there a gap before them) and for every ACK it sends
 * (the newest ranges, highest first): in Python those cost ~1.3 us a run and
 * ~6 us an ACK; here a fraction of that, whatever the number of ranges.
 */
#include "datapath.h"

#define ACK_MAX_PN (((uint64_t)1) << 62)

typedef struct {
    PyObject_HEAD
    uint64_t *starts;
    uint64_t *ends;
    size_t n, cap;
    uint64_t total; /* packet numbers held */
} AckRecord;

/* Index of the last range starting at or before v, or -1 (bisect_right - 1). */
static Py_ssize_t last_at_or_before(const AckRecord *r, uint64_t v) {
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->starts[mid] <= v) lo = mid + 1;
        else hi = mid;
    }
    return (Py_ssize_t)lo - 1;
}

static int grow(AckRecord *r) {
    size_t cap = r->cap ? r->cap * 2 : 16;
    uint64_t *s = PyMem_Realloc(r->starts, cap * sizeof(uint64_t));
    if (s == NULL) return -1;
    r->starts = s;
    uint64_t *e = PyMem_Realloc(r->ends, cap * sizeof(uint64_t));
    if (e == NULL) return -1;
    r->ends = e;
    r->cap = cap;
    return 0;
}

/* Merge [a, b) in (a < b). -1 only when out of memory. */
static int record_add(AckRecord *r, uint64_t a, uint64_t b) {
    size_t n = r->n;
    if (n && a == r->ends[n - 1]) { /* right after the newest: the common case */
        r->ends[n - 1] = b;
        r->total += b - a;
        return 0;
    }
    if (n == 0 || a > r->ends[n - 1]) {
        if (n == r->cap && grow(r) < 0) return -1;
        r->starts[n] = a;
        r->ends[n] = b;
        r->n = n + 1;
        r->total += b - a;
        return 0;
    }
    Py_ssize_t lo = last_at_or_before(r, a);
    if (lo < 0 || r->ends[lo] < a) lo++;
    size_t i = (size_t)lo, j = (size_t)(last_at_or_before(r, b) + 1); /* [i, j) touch [a, b) */
    if (i == j) {
        if (n == r->cap && grow(r) < 0) return -1;
        memmove(r->starts + i + 1, r->starts + i, (n - i) * sizeof(uint64_t));
        memmove(r->ends + i + 1, r->ends + i, (n - i) * sizeof(uint64_t));
        r->starts[i] = a;
        r->ends[i] = b;
        r->n = n + 1;
        r->total += b - a;
        return 0;
    }
    uint64_t ns = r->starts[i] < a ? r->starts[i] : a;
    uint64_t ne = r->ends[j - 1] > b ? r->ends[j - 1] : b, old = 0;
    for (size_t k = i; k < j; k++) old += r->ends[k] - r->starts[k];
    r->starts[i] = ns;
    r->ends[i] = ne;
    memmove(r->starts + i + 1, r->starts + j, (n - j) * sizeof(uint64_t));
    memmove(r->ends + i + 1, r->ends + j, (n - j) * sizeof(uint64_t));
    r->n = n - (j - i - 1);
    r->total += (ne - ns) - old;
    return 0;
}

/* Past ACK_RANGES_KEPT ranges, forget all but the newest half. */
static void record_bound(AckRecord *r) {
    if (r->n <= ACK_RANGES_KEPT) return;
    size_t drop = r->n - ACK_RANGES_KEPT / 2;
    for (size_t k = 0; k < drop; k++) r->total -= r->ends[k] - r->starts[k];
    memmove(r->starts, r->starts + drop, (r->n - drop) * sizeof(uint64_t));
    memmove(r->ends, r->ends + drop, (r->n - drop) * sizeof(uint64_t));
    r->n -= drop;
}

static int pn_arg(PyObject *o, const char *name, uint64_t *out) {
    long long v;
    if (wx_int_in_range(o, name, 0, (long long)ACK_MAX_PN, &v)) return -1;
    *out = (uint64_t)v;
    return 0;
}

static PyObject *AckRecord_add(AckRecord *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t a, b;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(first, end) takes 2 arguments");
        return NULL;
    }
    if (pn_arg(args[0], "first", &a) || pn_arg(args[1], "end", &b)) return NULL;
    if (a < b) {
        if (record_add(self, a, b) < 0) return PyErr_NoMemory();
        record_bound(self);
    }
    Py_RETURN_NONE;
}

static PyObject *AckRecord_contains(AckRecord *self, PyObject *const *args, Py_ssize_t nargs) {
    uint64_t a, b;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "contains(start, end) takes 2 arguments");
        return NULL;
    }
    if (pn_arg(args[0], "start", &a) || pn_arg(args[1], "end", &b)) return NULL;
    Py_ssize_t i = last_at_or_before(self, a);
    return PyBool_FromLong(i >= 0 && self->ends[i] >= b);
}

static PyObject *AckRecord_ranges(AckRecord *self, PyObject *unused) {
    size_t k = self->n < ACK_FRAME_RANGES ? self->n : ACK_FRAME_RANGES;
    PyObject *out = PyTuple_New((Py_ssize_t)k);
    if (out == NULL) return NULL;
    for (size_t i = 0; i < k; i++) {
        size_t at = self->n - 1 - i;
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)self->starts[at],
                                    (unsigned long long)(self->ends[at] - 1));
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    return out;
}

static PyObject *AckRecord_get_total(AckRecord *self, void *closure) {
    return PyLong_FromUnsignedLongLong(self->total);
}

static Py_ssize_t AckRecord_len(AckRecord *self) {
    return (Py_ssize_t)self->n;
}

static void AckRecord_dealloc(AckRecord *self) {
    PyMem_Free(self->starts);
    PyMem_Free(self->ends);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *AckRecord_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "AckRecord() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static PyMethodDef AckRecord_methods[] = {
    {"add", (PyCFunction)(void (*)(void))AckRecord_add, METH_FASTCALL,
     "add(first, end): packet numbers first .. end - 1 arrived."},
    {"contains", (PyCFunction)(void (*)(void))AckRecord_contains, METH_FASTCALL,
     "contains(start, end) -> bool: every number of [start, end) arrived."},
    {"ranges", (PyCFunction)AckRecord_ranges, METH_NOARGS,
     "ranges() -> tuple[(first, last)]: the newest 32 ranges, inclusive, highest first (an ACK "
     "frame's)."},
    {NULL},
};

static PyGetSetDef AckRecord_getset[] = {
    {"total", (getter)AckRecord_get_total, NULL, "packet numbers held", NULL},
    {NULL},
};

static PySequenceMethods AckRecord_as_sequence = {
    .sq_length = (lenfunc)AckRecord_len,
};

PyTypeObject WxAckRecord_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wanxport._native.AckRecord",
    .tp_basicsize = sizeof(AckRecord),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "AckRecord(): packet numbers one path received, for its ACK frames.",
    .tp_new = AckRecord_new,
    .tp_dealloc = (destructor)AckRecord_dealloc,
    .tp_methods = AckRecord_methods,
    .tp_getset = AckRecord_getset,
    .tp_as_sequence = &AckRecord_as_sequence,
};
