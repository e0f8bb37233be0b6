/*
 * The learning controller's calibrated marginals calibrate() (bastion.observed), on its own
 * beside _bestfirst_learn.c's accept() and learn(), which read what it returns.
 */
#include "_bestfirst.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <string.h>

/* q = min(p * g, 1) over one row of k, returning whether some q[j - 1] < q[j] (SSE2: a pair
   at a time, each pair checked within and against the next one while in registers; MINPD is
   a < b ? a : b, the scalar form's result for every input, NaN included) */
static inline int calibrated_row(const double *p, const double *g, double *q, Py_ssize_t k) {
    Py_ssize_t j = 0;
    int rises = 0;
#if defined(__SSE2__)
    if (k >= 2) {
        const __m128d one = _mm_set1_pd(1.0);
        __m128d rise = _mm_setzero_pd();
        __m128d prev = _mm_min_pd(_mm_mul_pd(_mm_loadu_pd(p), _mm_loadu_pd(g)), one);
        _mm_storeu_pd(q, prev);
        for (j = 2; j + 1 < k; j += 2) {
            __m128d here = _mm_min_pd(_mm_mul_pd(_mm_loadu_pd(p + j), _mm_loadu_pd(g + j)), one);
            _mm_storeu_pd(q + j, here);
            /* (q[j - 2] < q[j - 1], q[j - 1] < q[j]) */
            rise = _mm_or_pd(rise, _mm_cmplt_pd(prev, _mm_shuffle_pd(prev, here, 1)));
            prev = here;
        }
        /* the last pair within itself: lane 0 of (q[j - 2] < q[j - 1], q[j - 1] < q[j - 2]) */
        rise = _mm_or_pd(rise, _mm_and_pd(_mm_cmplt_pd(prev, _mm_shuffle_pd(prev, prev, 1)),
                                          _mm_castsi128_pd(_mm_set_epi64x(0, -1))));
        rises = _mm_movemask_pd(rise) != 0;
    }
#endif
    for (; j < k; j++) {
        double v = p[j] * g[j];
        q[j] = v < 1.0 ? v : 1.0;
        if (j > 0) rises |= q[j - 1] < q[j];
    }
    return rises;
}

/* calibrate(probs, ids, g, rows, k) -> (q, ids_sorted, order) or (q, None, None)
 *   The learning controller's calibrated marginals (bastion.observed.AcceptanceCalibration):
 *   q = min(p * g, 1) for every candidate of every row (rows = B * D request-major rows of k,
 *   g one [D, k] factor matrix shared by the requests), each row then sorted descending with
 *   ties in their original order (numpy's stable argsort of -q). When every row is still
 *   sorted, only q comes back (the order is the identity and the ids are unchanged). Each
 *   row's q is formed and its order checked in one pass (calibrated_row, above); a sorted
 *   row's order is the identity, an unsorted row's its insertion sort's. Where every row's ids
 *   are its ranks 0 … k − 1 (each row's ids equal the identity order: the simulator's drafters,
 *   sim/synthetic.py's _rank_ids) the sorted ids are the order itself, and the one bytes
 *   object comes back as both; otherwise the ids are copied, the unsorted rows' gathered over
 *   them. (The 249 calls of a bastion C = 32 serve replayed, p freshly written before each,
 *   interleaved with the former form — q and the rows' order in two passes, the ids always
 *   copied: 5.3 against 6.7 µs a call, medians of 60 pairs on a shared 2-core machine.) */
PyObject *bf_calibrate(PyObject *self, PyObject *args) {
    Py_buffer pb, ib, gb;
    Py_ssize_t rows, k;
    PyObject *result = NULL, *o_q = NULL, *o_ids = NULL, *o_ord = NULL;
    unsigned char *unsorted = NULL;
    int64_t *iota = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*nn", &pb, &ib, &gb, &rows, &k)) return NULL;
    Py_ssize_t cells = pb.len / (Py_ssize_t)sizeof(double);
    Py_ssize_t gcells = gb.len / (Py_ssize_t)sizeof(double);
    if (rows < 1 || k < 1 || rows > PY_SSIZE_T_MAX / k || cells != rows * k ||
        ib.len != cells * (Py_ssize_t)sizeof(int64_t) || gcells < k || gcells % k != 0 ||
        rows % (gcells / k) != 0) {
        PyErr_SetString(PyExc_ValueError, "calibrate: inconsistent sizes");
        goto done;
    }
    {
        const double *p = (const double *)pb.buf, *g = (const double *)gb.buf;
        const int64_t *ids = (const int64_t *)ib.buf;
        o_q = PyBytes_FromStringAndSize(NULL, cells * (Py_ssize_t)sizeof(double));
        if (!o_q) goto done;
        double *q = (double *)PyBytes_AS_STRING(o_q);
        /* unsorted[r]: row r is out of order after calibration (most rows are not) */
        unsorted = (unsigned char *)malloc((size_t)rows);
        if (!unsorted) {
            PyErr_NoMemory();
            goto done;
        }
        int sorted = 1;
        for (Py_ssize_t r = 0, at = 0, gat = 0; r < rows; r++, at += k) { /* g's rows cycle */
            int out_of_order = calibrated_row(p + at, g + gat, q + at, k);
            unsorted[r] = (unsigned char)out_of_order;
            sorted &= !out_of_order;
            gat = gat + k == gcells ? 0 : gat + k;
        }
        if (sorted) {
            result = Py_BuildValue("(OOO)", o_q, Py_None, Py_None);
            goto done;
        }
        o_ord = PyBytes_FromStringAndSize(NULL, cells * (Py_ssize_t)sizeof(int64_t));
        if (!o_ord) goto done;
        int64_t *order = (int64_t *)PyBytes_AS_STRING(o_ord), *out_ids = NULL;
        /* iota: the identity order of one row, what the sort leaves a sorted row; the ids
           are the ranks where every row's equal it (compared row by row, stopping at the
           first that differs, against this one row, not a whole identity order: that read
           and wrote the order twice more) */
        iota = (int64_t *)malloc((size_t)k * sizeof(int64_t));
        if (!iota) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t j = 0; j < k; j++) iota[j] = j;
        size_t row_bytes = (size_t)k * sizeof(int64_t);
        int ranks = 1;
        for (Py_ssize_t r = 0; r < rows && ranks; r++) ranks = !memcmp(ids + r * k, iota, row_bytes);
        if (ranks) { /* ids: the ranks */
            o_ids = o_ord;
            Py_INCREF(o_ids);
        } else {
            o_ids = PyBytes_FromStringAndSize(NULL, cells * (Py_ssize_t)sizeof(int64_t));
            if (!o_ids) goto done;
            out_ids = (int64_t *)PyBytes_AS_STRING(o_ids);
            memcpy(out_ids, ids, (size_t)cells * sizeof(int64_t));
        }
        for (Py_ssize_t r = 0; r < rows; r++) {
            double *qr = q + r * k;
            int64_t *o = order + r * k;
            if (!unsorted[r]) {
                memcpy(o, iota, row_bytes);
                continue;
            }
            for (Py_ssize_t j = 0; j < k; j++) { /* insertion sort: stable, descending (it
                                                    writes o[0 .. j] before reading them) */
                double v = qr[j];
                Py_ssize_t i = j;
                while (i > 0 && qr[i - 1] < v) {
                    qr[i] = qr[i - 1];
                    o[i] = o[i - 1];
                    i--;
                }
                qr[i] = v;
                o[i] = j;
            }
            if (out_ids)
                for (Py_ssize_t j = 0; j < k; j++) out_ids[r * k + j] = ids[r * k + o[j]];
        }
        result = Py_BuildValue("(OOO)", o_q, o_ids, o_ord);
    }
done:
    free(unsorted);
    free(iota);
    Py_XDECREF(o_q);
    Py_XDECREF(o_ids);
    Py_XDECREF(o_ord);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&ib);
    PyBuffer_Release(&gb);
    return result;
}
