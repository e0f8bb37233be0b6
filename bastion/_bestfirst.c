/*
 * Compiled best-first tree construction: the same lazy heap as bastion.bestfirst.best_first_heap
 * (pop a node, push its next sibling and its first child), node for node, in C.
 *
 * Key order (smallest first): (-score, depth, parent position, rank). Scores are computed as
 * parent score * marginal, in double precision, exactly as the Python reference does, so the
 * two produce identical trees. The module uses only the stable C API and the buffer protocol
 * (no numpy headers): inputs are C-contiguous float64 buffers, outputs are bytes objects that
 * Python wraps with numpy.frombuffer.
 *
 * build(probs, depth, k, budgets) -> (parents, depths, ranks, scores, offsets)
 *   probs:   B * depth * k doubles (request-major), rows sorted descending
 *   budgets: B int64 values, each >= 1
 *   outputs: concatenated per-request trees (int64, int64, int64, float64) and B + 1 int64
 *            offsets into them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    double score;
    int32_t depth;
    int32_t parent;
    int32_t rank;
} entry;

/* a precedes b in best-first order */
static inline int before(const entry *a, const entry *b) {
    if (a->score != b->score) return a->score > b->score;
    if (a->depth != b->depth) return a->depth < b->depth;
    if (a->parent != b->parent) return a->parent < b->parent;
    return a->rank < b->rank;
}

static void push(entry *heap, Py_ssize_t *n, entry e) {
    Py_ssize_t i = (*n)++;
    while (i > 0) {
        Py_ssize_t up = (i - 1) / 2;
        if (!before(&e, &heap[up])) break;
        heap[i] = heap[up];
        i = up;
    }
    heap[i] = e;
}

static entry pop(entry *heap, Py_ssize_t *n) {
    entry top = heap[0];
    entry last = heap[--(*n)];
    Py_ssize_t i = 0, size = *n;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= size) break;
        if (c + 1 < size && before(&heap[c + 1], &heap[c])) c++;
        if (!before(&heap[c], &last)) break;
        heap[i] = heap[c];
        i = c;
    }
    if (size > 0) heap[i] = last;
    return top;
}

/* One request: writes up to `budget` nodes, returns how many. */
static Py_ssize_t build_one(const double *p, Py_ssize_t depth, Py_ssize_t k, Py_ssize_t budget,
                            entry *heap, int64_t *parents, int64_t *depths, int64_t *ranks,
                            double *scores) {
    Py_ssize_t n = 1, hn = 0;
    parents[0] = -1;
    depths[0] = 0;
    ranks[0] = -1;
    scores[0] = 1.0;
    if (depth > 0 && k > 0 && p[0] > 0.0) {
        entry e = {p[0], 1, 0, 0};
        push(heap, &hn, e);
    }
    while (hn > 0 && n < budget) {
        entry e = pop(heap, &hn);
        Py_ssize_t pos = n++;
        parents[pos] = e.parent;
        depths[pos] = e.depth;
        ranks[pos] = e.rank;
        scores[pos] = e.score;
        if (e.rank + 1 < k) { /* next sibling */
            double s = scores[e.parent] * p[(e.depth - 1) * k + e.rank + 1];
            if (s > 0.0) {
                entry sib = {s, e.depth, e.parent, e.rank + 1};
                push(heap, &hn, sib);
            }
        }
        if (e.depth < depth) { /* first child */
            double s = e.score * p[e.depth * k];
            if (s > 0.0) {
                entry child = {s, e.depth + 1, (int32_t)pos, 0};
                push(heap, &hn, child);
            }
        }
    }
    return n;
}

static PyObject *build(PyObject *self, PyObject *args) {
    Py_buffer probs, budgets;
    Py_ssize_t depth, k;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nny*", &probs, &depth, &k, &budgets)) return NULL;
    Py_ssize_t b = budgets.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *bud = (const int64_t *)budgets.buf;
    Py_ssize_t total = 0, max_budget = 1;
    for (Py_ssize_t j = 0; j < b; j++) {
        if (bud[j] < 1 || bud[j] > INT32_MAX / 2) {
            PyErr_SetString(PyExc_ValueError, "budgets must be in [1, 2^30]");
            goto done;
        }
        total += bud[j];
        if (bud[j] > max_budget) max_budget = bud[j];
    }
    if (depth < 0 || k < 0 || probs.len != (Py_ssize_t)sizeof(double) * b * depth * k) {
        PyErr_SetString(PyExc_ValueError, "probs buffer does not match B * depth * k doubles");
        goto done;
    }
    {
        entry *heap = PyMem_Malloc(sizeof(entry) * (size_t)(2 * max_budget + 2));
        int64_t *parents = PyMem_Malloc(sizeof(int64_t) * (size_t)total);
        int64_t *dep = PyMem_Malloc(sizeof(int64_t) * (size_t)total);
        int64_t *ranks = PyMem_Malloc(sizeof(int64_t) * (size_t)total);
        double *scores = PyMem_Malloc(sizeof(double) * (size_t)total);
        int64_t *offsets = PyMem_Malloc(sizeof(int64_t) * (size_t)(b + 1));
        if (!heap || !parents || !dep || !ranks || !scores || !offsets) {
            PyErr_NoMemory();
        } else {
            Py_ssize_t at = 0;
            const double *p = (const double *)probs.buf;
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t j = 0; j < b; j++) {
                offsets[j] = at;
                at += build_one(p + j * depth * k, depth, k, (Py_ssize_t)bud[j], heap,
                                parents + at, dep + at, ranks + at, scores + at);
            }
            offsets[b] = at;
            Py_END_ALLOW_THREADS
            result = Py_BuildValue(
                "(y#y#y#y#y#)", (char *)parents, (Py_ssize_t)(at * sizeof(int64_t)),
                (char *)dep, (Py_ssize_t)(at * sizeof(int64_t)), (char *)ranks,
                (Py_ssize_t)(at * sizeof(int64_t)), (char *)scores,
                (Py_ssize_t)(at * sizeof(double)), (char *)offsets,
                (Py_ssize_t)((b + 1) * sizeof(int64_t)));
        }
        PyMem_Free(heap);
        PyMem_Free(parents);
        PyMem_Free(dep);
        PyMem_Free(ranks);
        PyMem_Free(scores);
        PyMem_Free(offsets);
    }
done:
    PyBuffer_Release(&probs);
    PyBuffer_Release(&budgets);
    return result;
}

static PyMethodDef methods[] = {
    {"build", build, METH_VARARGS, "Best-first trees for B requests (see module comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_bestfirst", "Compiled best-first tree construction.", -1, methods,
};

PyMODINIT_FUNC PyInit__bestfirst(void) { return PyModule_Create(&module); }
