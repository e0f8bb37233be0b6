/*
 * Best-first tree construction: the lazy heap, one request's tree (built afresh or grown on),
 * the buffer-size checks, and build(probs, depth, k, budgets) (see _bestfirst.c).
 */
#include "_bestfirst.h"

/* a precedes b in best-first order. Scores almost never tie, so the first test is predictable
   and the answer is a plain comparison the compiler can turn into a flag, not a branch. */
static inline int before(const entry *a, const entry *b) {
    if (LIKELY(a->score != b->score)) return a->score > b->score;
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

/* Put e at the root (replacing the top) and sift it down. */
static void replace_top(entry *heap, Py_ssize_t size, entry e) {
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= size) break;
        if (c + 1 < size) c += before(&heap[c + 1], &heap[c]);
        if (!before(&heap[c], &e)) break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = e;
}

/* One request's best-first tree, grown on from *n nodes (0: start with the root) to up to
   `budget`, the frontier kept in heap[0 .. *hn): a larger budget resumes where a smaller one
   stopped (best-first trees are nested), so growing in doublings builds every node once. The
   top of the heap is the next node; the (up to two) nodes it makes available replace it in one
   sift-down plus a push, instead of a pop and two pushes. Any correct heap pops the same
   sequence: keys are unique. */
void bf_grow_one(const double *p, Py_ssize_t depth, Py_ssize_t k, Py_ssize_t budget,
                 entry *heap, Py_ssize_t *hn_io, Py_ssize_t *n_io, int64_t *parents,
                 int64_t *depths, int64_t *ranks, double *scores) {
    Py_ssize_t n = *n_io, hn = *hn_io;
    if (n == 0) {
        n = 1;
        hn = 0;
        parents[0] = -1;
        depths[0] = 0;
        ranks[0] = -1;
        scores[0] = 1.0;
        if (depth > 0 && k > 0 && p[0] > 0.0) {
            entry e = {p[0], 1, 0, 0};
            push(heap, &hn, e);
        }
    }
    while (hn > 0 && n < budget) {
        entry e = heap[0];
        Py_ssize_t pos = n++;
        parents[pos] = e.parent;
        depths[pos] = e.depth;
        ranks[pos] = e.rank;
        scores[pos] = e.score;
        entry add[2];
        int m = 0;
        if (e.rank + 1 < k) { /* next sibling */
            double s = scores[e.parent] * p[(e.depth - 1) * k + e.rank + 1];
            if (s > 0.0) {
                entry sib = {s, e.depth, e.parent, e.rank + 1};
                add[m++] = sib;
            }
        }
        if (e.depth < depth) { /* first child */
            double s = e.score * p[e.depth * k];
            if (s > 0.0) {
                entry child = {s, e.depth + 1, (int32_t)pos, 0};
                add[m++] = child;
            }
        }
        if (m == 0) { /* plain pop */
            entry last = heap[--hn];
            if (hn > 0) replace_top(heap, hn, last);
        } else {
            /* the earlier of the two tends to stay near the top, the later near the bottom */
            int late = m == 2 && before(&add[0], &add[1]) ? 1 : 0;
            replace_top(heap, hn, add[m == 2 ? 1 - late : 0]);
            if (m == 2) push(heap, &hn, add[late]);
        }
    }
    *n_io = n;
    *hn_io = hn;
}

/* One request's best-first tree of up to `budget` nodes, built afresh; returns how many. */
Py_ssize_t bf_build_one(const double *p, Py_ssize_t depth, Py_ssize_t k, Py_ssize_t budget,
                        entry *heap, int64_t *parents, int64_t *depths, int64_t *ranks,
                        double *scores) {
    Py_ssize_t n = 0, hn = 0;
    bf_grow_one(p, depth, k, budget, heap, &hn, &n, parents, depths, ranks, scores);
    return n;
}

/* Overflow-safe buffer checks: whether a buffer of len bytes holds exactly a*b*c elements of
   elem bytes, or at least n of them. Sizes come from Python and may be anything. */
int bf_holds_exactly(Py_ssize_t len, Py_ssize_t elem, Py_ssize_t a, Py_ssize_t b,
                     Py_ssize_t c) {
    if (a < 0 || b < 0 || c < 0) return 0;
    if (a == 0 || b == 0 || c == 0) return len == 0;
    Py_ssize_t max = PY_SSIZE_T_MAX / elem;
    if (a > max || b > max / a || c > max / a / b) return 0;
    return len == elem * a * b * c;
}

int bf_holds_at_least(Py_ssize_t len, Py_ssize_t elem, Py_ssize_t n) {
    return n >= 0 && n <= len / elem;
}

PyObject *bf_build(PyObject *self, PyObject *args) {
    Py_buffer probs, budgets;
    Py_ssize_t depth, k;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nny*", &probs, &depth, &k, &budgets)) return NULL;
    Py_ssize_t b = budgets.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *bud = (const int64_t *)budgets.buf;
    Py_ssize_t total = 0, max_budget = 1;
    if (budgets.len % (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "budgets buffer is not a whole number of int64");
        goto done;
    }
    for (Py_ssize_t j = 0; j < b; j++) {
        if (bud[j] < 1 || bud[j] > INT32_MAX / 2) {
            PyErr_SetString(PyExc_ValueError, "every budget must be in 1 ... 2^30 - 1");
            goto done;
        }
        if (total > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(int64_t) - bud[j]) {
            PyErr_NoMemory();
            goto done;
        }
        total += bud[j];
        if (bud[j] > max_budget) max_budget = bud[j];
    }
    if (!bf_holds_exactly(probs.len, (Py_ssize_t)sizeof(double), b, depth, k)) {
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
                at += bf_build_one(p + j * depth * k, depth, k, (Py_ssize_t)bud[j], heap,
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
