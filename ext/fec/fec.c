/*
 * wanxport._fec: systematic Reed-Solomon over GF(2^8) for the erasure-coded tail,
 * one call per BLOCK (k data symbols, m repair symbols), never per datagram.
 *
 * Why ISA-L (Debian libisal-dev): benchmarks/fec_codes.py measures the PyPI
 * candidates on our block shapes; ISA-L (what pyeclib wraps) was the fastest and
 * is the only one with a plain C API, so this module calls it directly with the
 * GIL released, and the native data path could call the same functions.
 *
 * The encode matrix is ISA-L's Cauchy matrix (identity on top, so the code is
 * systematic): every k x k submatrix of it is invertible, so ANY k of the k+m
 * symbols rebuild the block. A block covers `length` bytes (the covered range of
 * a REPAIR frame); the last data symbol is zero-padded to the symbol size.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <isa-l/erasure_code.h>
#include <stdlib.h>
#include <string.h>

#define FEC_MAX_SYMBOLS 255 /* k + m over GF(2^8) */

/* The (k+m) x k Cauchy encode matrix; caller frees. */
static unsigned char *encode_matrix(int k, int m) {
    unsigned char *a = malloc((size_t)(k + m) * k);
    if (a) gf_gen_cauchy1_matrix(a, k + m, k);
    return a;
}

static int check_shape(int k, int m, Py_ssize_t symbol, Py_ssize_t length) {
    if (k < 1 || m < 1 || k + m > FEC_MAX_SYMBOLS) {
        PyErr_Format(PyExc_ValueError, "need 1 <= k, 1 <= m, k + m <= %d (got k=%d m=%d)",
                     FEC_MAX_SYMBOLS, k, m);
        return -1;
    }
    if (symbol < 1 || symbol > 65535 || length < 1 || length > (Py_ssize_t)k * symbol ||
        length <= (Py_ssize_t)(k - 1) * symbol) {
        PyErr_Format(PyExc_ValueError, "a block of k=%d symbols of %zd bytes covers %zd..%zd bytes, not %zd",
                     k, symbol, (Py_ssize_t)(k - 1) * symbol + 1, (Py_ssize_t)k * symbol, length);
        return -1;
    }
    return 0;
}

/* Padded copy of the block's data: k symbols, the last one zero-filled past `length`. */
static unsigned char *padded_copy(const unsigned char *data, Py_ssize_t length, int k, Py_ssize_t symbol) {
    unsigned char *block = malloc((size_t)k * symbol);
    if (!block) return NULL;
    memcpy(block, data, length);
    memset(block + length, 0, (size_t)k * symbol - length);
    return block;
}

static PyObject *fec_encode(PyObject *self, PyObject *args) {
    Py_buffer data;
    int k, m;
    Py_ssize_t symbol;
    if (!PyArg_ParseTuple(args, "y*iin", &data, &k, &m, &symbol)) return NULL;
    PyObject *out = NULL;
    unsigned char *a = NULL, *tables = NULL, *block = NULL;
    if (check_shape(k, m, symbol, data.len) < 0) goto done;
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)m * symbol);
    if (!out) goto done;
    a = encode_matrix(k, m);
    tables = malloc((size_t)32 * k * m);
    block = padded_copy(data.buf, data.len, k, symbol);
    if (!a || !tables || !block) {
        Py_CLEAR(out);
        PyErr_NoMemory();
        goto done;
    }
    unsigned char *sources[FEC_MAX_SYMBOLS], *repair[FEC_MAX_SYMBOLS];
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    for (int i = 0; i < k; i++) sources[i] = block + (size_t)i * symbol;
    for (int j = 0; j < m; j++) repair[j] = dst + (size_t)j * symbol;
    Py_BEGIN_ALLOW_THREADS
    ec_init_tables(k, m, a + (size_t)k * k, tables);
    ec_encode_data((int)symbol, k, m, tables, sources, repair);
    Py_END_ALLOW_THREADS
done:
    free(a);
    free(tables);
    free(block);
    PyBuffer_Release(&data);
    return out;
}

/*
 * decode(data, k, m, symbol, present, repair, repair_index) -> bytes
 *
 * data: the block's `length` bytes as the receiver holds them (missing symbols any
 * content); present: k bytes, non-zero where data symbol i arrived whole; repair:
 * the arrived repair symbols back to back; repair_index: their indexes 0..m-1.
 * Returns the missing data symbols, in index order, each `symbol` bytes (the
 * caller truncates the last one of the block to the covered length).
 */
static PyObject *fec_decode(PyObject *self, PyObject *args) {
    Py_buffer data, present, repair, rindex;
    int k, m;
    Py_ssize_t symbol;
    if (!PyArg_ParseTuple(args, "y*iiny*y*y*", &data, &k, &m, &symbol, &present, &repair, &rindex))
        return NULL;
    PyObject *out = NULL;
    unsigned char *a = NULL, *sub = NULL, *inv = NULL, *rows = NULL, *tables = NULL, *block = NULL;
    if (check_shape(k, m, symbol, data.len) < 0) goto done;
    const unsigned char *have = present.buf, *ridx = rindex.buf;
    if (present.len != k || rindex.len > m || repair.len != rindex.len * symbol) {
        PyErr_SetString(PyExc_ValueError, "present must be k bytes, repair len(repair_index) symbols");
        goto done;
    }
    int missing[FEC_MAX_SYMBOLS], n_missing = 0;
    for (int i = 0; i < k; i++)
        if (!have[i]) missing[n_missing++] = i;
    int used_repair[FEC_MAX_SYMBOLS], seen[FEC_MAX_SYMBOLS] = {0};
    int n_repair = 0;
    for (Py_ssize_t j = 0; j < rindex.len && n_repair < n_missing; j++) {
        if (ridx[j] >= m) {
            PyErr_Format(PyExc_ValueError, "repair index %d >= m=%d", ridx[j], m);
            goto done;
        }
        if (!seen[ridx[j]]) {
            seen[ridx[j]] = 1;
            used_repair[n_repair++] = (int)j;
        }
    }
    if (n_repair < n_missing) {
        PyErr_Format(PyExc_ValueError, "%d data symbols missing, %d distinct repair symbols", n_missing, n_repair);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n_missing * symbol);
    if (!out || n_missing == 0) goto done;
    a = encode_matrix(k, m);
    sub = malloc((size_t)k * k);
    inv = malloc((size_t)k * k);
    rows = malloc((size_t)k * n_missing);
    tables = malloc((size_t)32 * k * n_missing);
    block = padded_copy(data.buf, data.len, k, symbol);
    if (!a || !sub || !inv || !rows || !tables || !block) {
        Py_CLEAR(out);
        PyErr_NoMemory();
        goto done;
    }
    /*
     * Only the e missing symbols are solved for: with R the e repair rows used and
     * P/M the present/missing columns of the encode matrix, repair = R_P d_P + R_M d_M,
     * so d_M = R_M^-1 repair + R_M^-1 R_P d_P (minus is plus in GF(2^8)). R_M is a
     * square submatrix of a Cauchy matrix, hence invertible, and only e x e: inverting
     * the whole k x k survivor matrix instead made k=200 decodes 60 ms.
     */
    unsigned char *sources[FEC_MAX_SYMBOLS], *outputs[FEC_MAX_SYMBOLS];
    const unsigned char *rbuf = repair.buf;
    int e = n_missing, n_src = 0, col_of[FEC_MAX_SYMBOLS];
    for (int i = 0; i < k; i++)
        if (have[i]) {
            col_of[n_src] = i;
            sources[n_src++] = block + (size_t)i * symbol;
        }
    for (int t = 0; t < e; t++) {
        int j = used_repair[t];
        sources[n_src + t] = (unsigned char *)rbuf + (size_t)j * symbol;
        for (int u = 0; u < e; u++) sub[t * e + u] = a[(size_t)(k + ridx[j]) * k + missing[u]];
    }
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    for (int t = 0; t < e; t++) outputs[t] = dst + (size_t)t * symbol;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = gf_invert_matrix(sub, inv, e);
    if (!failed) {
        for (int t = 0; t < e; t++) {
            unsigned char *row = rows + (size_t)t * k;
            for (int c = 0; c < n_src; c++) {  /* (R_M^-1 R_P)[t][c] */
                unsigned char acc = 0;
                for (int u = 0; u < e; u++)
                    acc ^= gf_mul(inv[t * e + u], a[(size_t)(k + ridx[used_repair[u]]) * k + col_of[c]]);
                row[c] = acc;
            }
            memcpy(row + n_src, inv + (size_t)t * e, e);
        }
        ec_init_tables(k, e, rows, tables);
        ec_encode_data((int)symbol, k, e, tables, sources, outputs);
    }
    Py_END_ALLOW_THREADS
    if (failed) {  /* cannot happen for a Cauchy matrix; an error, never wrong bytes */
        Py_CLEAR(out);
        PyErr_SetString(PyExc_RuntimeError, "singular decode matrix");
    }
done:
    free(a);
    free(sub);
    free(inv);
    free(rows);
    free(tables);
    free(block);
    PyBuffer_Release(&data);
    PyBuffer_Release(&present);
    PyBuffer_Release(&repair);
    PyBuffer_Release(&rindex);
    return out;
}

static PyMethodDef methods[] = {
    {"encode", fec_encode, METH_VARARGS,
     "encode(data, k, m, symbol) -> bytes: the m repair symbols of a block (GIL released)."},
    {"decode", fec_decode, METH_VARARGS,
     "decode(data, k, m, symbol, present, repair, repair_index) -> bytes: the missing data symbols."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "wanxport._fec",
                                    "Systematic Reed-Solomon blocks (ISA-L).", -1, methods};

PyMODINIT_FUNC PyInit__fec(void) {
    PyObject *mod = PyModule_Create(&module);
    if (mod && PyModule_AddIntConstant(mod, "MAX_SYMBOLS", FEC_MAX_SYMBOLS) < 0) Py_CLEAR(mod);
    return mod;
}
