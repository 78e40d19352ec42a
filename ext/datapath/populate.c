/*
 * populate_write: fault a writable mapping's pages in ahead of the data.
 *
 * A receiver places datagrams straight into a file's mapped pages. The first
 * write to each page faults (the file system finds or zeroes the page and marks
 * it for write-back), and those faults ran inside the native receive, on the
 * event loop's thread: a quarter of a receiving daemon's loop thread, in bursts
 * that held back its acknowledgements. MADV_POPULATE_WRITE (Linux 5.14) takes
 * the same faults on whichever thread calls it, with the GIL released, and
 * changes no byte, so it may run while datagrams are being placed in the range.
 */
#include "datapath.h"

#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

PyObject *wx_populate_write(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_WRITABLE) < 0) return NULL;
    if (view.len == 0) {
        PyBuffer_Release(&view);
        Py_RETURN_TRUE;
    }
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)view.buf & ~(page - 1);
    uintptr_t end = ((uintptr_t)view.buf + (uintptr_t)view.len + page - 1) & ~(page - 1);
    int rc, err = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = madvise((void *)start, (size_t)(end - start), MADV_POPULATE_WRITE);
    if (rc != 0) err = errno;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc == 0) Py_RETURN_TRUE;
    /* A kernel before 5.14 (or a mapping it cannot populate, such as I/O memory):
     * nothing was populated, and the first writes fault as before. */
    if (err == EINVAL) Py_RETURN_FALSE;
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}
