/*
 * The chain's shadow on a tree step: what the chain would have been worth, and what it would
 * have committed (the learning controller compares the chain with its trees every step, though
 * it rarely runs it once trees win).
 *
 * chain_cut(probs, b, depth, k) -> bytes
 *   [B, depth] float64: for each request the chain's Â less its root cut at every depth — the
 *   cumulative sum of the cumulative product of its top-1 marginals probs[i, :, 0] (probs:
 *   B * depth * k float64, request-major). numpy's cumprod then cumsum along the row, both
 *   sequential, so the same doubles (bastion.controller._chain_cut).
 *
 * shadow(run, deepest, chain, depth) -> (realised, predicted)
 *   bastion.observed.shadow_of: from each request's leading run of rank-0 accepted nodes and
 *   its tree's depth (int64 [B] each, learn()'s answer) and the chain cut above ([B, depth]):
 *   realised = B + Σ run, predicted = B + the pairwise sum (numpy's add.reduce) of
 *   chain[i, deepest_i - 1] over the requests whose tree is deeper than its root.
 */
#include "_bestfirst.h"

PyObject *bf_chain_cut(PyObject *self, PyObject *args) {
    Py_buffer pb;
    Py_ssize_t b, depth, k;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nnn", &pb, &b, &depth, &k)) return NULL;
    if (b < 1 || depth < 1 || k < 1 || !bf_holds_exactly(pb.len, sizeof(double), b, depth, k)) {
        PyErr_SetString(PyExc_ValueError, "chain_cut: inconsistent sizes");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, b * depth * (Py_ssize_t)sizeof(double));
    if (!result) goto done;
    {
        const double *p = (const double *)pb.buf;
        double *cut = (double *)PyBytes_AS_STRING(result);
        for (Py_ssize_t i = 0; i < b; i++) {
            const double *row = p + i * depth * k;
            double *out = cut + i * depth;
            double product = row[0], sum = product;
            out[0] = sum;
            for (Py_ssize_t d = 1; d < depth; d++) {
                product *= row[d * k];
                sum += product;
                out[d] = sum;
            }
        }
    }
done:
    PyBuffer_Release(&pb);
    return result;
}

PyObject *bf_shadow(PyObject *self, PyObject *args) {
    Py_buffer rb, db, cb;
    Py_ssize_t depth;
    PyObject *result = NULL;
    double *picked = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*n", &rb, &db, &cb, &depth)) return NULL;
    Py_ssize_t b = rb.len / (Py_ssize_t)sizeof(int64_t);
    if (b < 1 || depth < 1 || rb.len != b * (Py_ssize_t)sizeof(int64_t) || db.len != rb.len ||
        !bf_holds_exactly(cb.len, sizeof(double), b, depth, 1)) {
        PyErr_SetString(PyExc_ValueError, "shadow: inconsistent sizes");
        goto done;
    }
    picked = (double *)malloc((size_t)b * sizeof(double));
    if (!picked) {
        PyErr_NoMemory();
        goto done;
    }
    {
        const int64_t *run = (const int64_t *)rb.buf, *deep = (const int64_t *)db.buf;
        const double *chain = (const double *)cb.buf;
        int64_t runs = 0;
        Py_ssize_t n = 0;
        for (Py_ssize_t i = 0; i < b; i++) {
            if (deep[i] > depth || deep[i] < 0) {
                PyErr_SetString(PyExc_ValueError, "shadow: a tree deeper than the chain");
                goto done;
            }
            runs += run[i];
            if (deep[i] > 0) picked[n++] = chain[i * depth + deep[i] - 1];
        }
        result = Py_BuildValue("(dd)", (double)(b + runs), (double)b + bf_pairwise(picked, n));
    }
done:
    free(picked);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&db);
    PyBuffer_Release(&cb);
    return result;
}
