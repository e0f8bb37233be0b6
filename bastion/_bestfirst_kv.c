/*
 * The simulated server's KV-cache block counts (bastion.sim.memory.KVCache.blocks_of): sums of
 * whole numbers, several a step, each a handful of numpy calls on a few dozen requests, in one
 * call here.
 *
 * blocks(tokens, add, block_tokens, sizes, floor) -> int or None
 *   tokens: int64 per request (any buffer; None comes back unless it is C-contiguous int64)
 *   sizes None: the sum over requests of ceil((tokens[i] + add) / block_tokens);
 *   sizes (int64, one per request): of ceil((tokens[i] + max(sizes[i], floor)) / block_tokens).
 * The divisions are floor divisions of the numerator plus block_tokens - 1, as Python's and
 * numpy's // are, so the count is the one the numpy expression gives (int64 arithmetic).
 */
#include "_bestfirst.h"

static int int64_view(PyObject *obj, Py_buffer *view) {
    /* 1: a C-contiguous buffer of 8-byte signed integers; 0: not one (no error set) */
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        return 0;
    }
    const char *f = view->format;
    if (f != NULL && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f++;
    if (view->itemsize != 8 || f == NULL || (f[0] != 'l' && f[0] != 'q') || f[1] != '\0') {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

static inline int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

PyObject *bf_kv_blocks(PyObject *self, PyObject *args) {
    PyObject *tokens_obj, *sizes_obj;
    long long add, bt, floor;
    if (!PyArg_ParseTuple(args, "OLLOL", &tokens_obj, &add, &bt, &sizes_obj, &floor)) return NULL;
    if (bt < 1) {
        PyErr_SetString(PyExc_ValueError, "blocks: block_tokens must be >= 1");
        return NULL;
    }
    Py_buffer tv, sv;
    if (!int64_view(tokens_obj, &tv)) Py_RETURN_NONE;
    const int64_t *t = (const int64_t *)tv.buf;
    Py_ssize_t n = tv.len / 8;
    int64_t total = 0, up = (int64_t)bt - 1;
    if (sizes_obj == Py_None) {
        for (Py_ssize_t i = 0; i < n; i++) total += floor_div(t[i] + (int64_t)add + up, bt);
    } else {
        if (!int64_view(sizes_obj, &sv)) {
            PyBuffer_Release(&tv);
            Py_RETURN_NONE;
        }
        if (sv.len != tv.len) {
            PyBuffer_Release(&sv);
            PyBuffer_Release(&tv);
            PyErr_SetString(PyExc_ValueError, "blocks: one size per request");
            return NULL;
        }
        const int64_t *s = (const int64_t *)sv.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t extra = s[i] > (int64_t)floor ? s[i] : (int64_t)floor;
            total += floor_div(t[i] + extra + up, bt);
        }
        PyBuffer_Release(&sv);
    }
    PyBuffer_Release(&tv);
    return PyLong_FromLongLong((long long)total);
}
