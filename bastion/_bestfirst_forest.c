/*
 * B best-first trees grown together in merged order: forest(), its growth loop and scatter.
 *
 * forest(probs, depth, k, caps, total[, token_ids])
 *     -> (parents, depths, ranks, scores, offsets, order, order_scores, more[, tokens])
 *
 * The B best-first trees of one serving step grown together: one heap over every request's
 * frontier, key (-score, request, depth, parent position, rank), so the nodes are added in the
 * merged order of bastion.joint (by score, ties by request index, each request's own best-first
 * order kept: within a request the key is build()'s). Request i takes at most caps[i] nodes
 * (its root included); `total` caps the nodes added beyond the B roots.
 *   outputs: the B trees concatenated request by request, each in its own best-first order,
 *            root first (as build() returns them), B + 1 offsets; order, order_scores: for the
 *            j-th added node, its request (int64) and its score; more: 1 if some request could
 *            still grow; tokens (given token_ids, B * depth * k int64): each node's token,
 *            the roots' -1.
 * The heap's push and sift are inlined into the growth loop (entries passed by address); its
 * scores (all > 0) compare as their bit patterns, integers, the whole key only on a tie.
 */
#include "_bestfirst.h"

#include <string.h>


/* A heap entry's score as an integer: every score in the heap is > 0 (NaN and 0 never enter),
   where IEEE doubles order as their bit patterns do (+inf included), and equal bits are equal
   scores. The sift below compares these (integer compares and selects: a shorter chain from
   one level's loads to the next's than the floating-point compare). */
static inline int64_t fbits(const fentry *a) {
    int64_t v;
    memcpy(&v, &a->score, sizeof v);
    return v;
}

static inline int fbefore(const fentry *a, const fentry *b) {
    int64_t as = fbits(a), bs = fbits(b);
    if (LIKELY(as != bs)) return as > bs;
    if (a->request != b->request) return a->request < b->request;
    if (a->depth != b->depth) return a->depth < b->depth;
    if (a->parent != b->parent) return a->parent < b->parent;
    return a->rank < b->rank;
}

#if defined(__GNUC__) || defined(__clang__)
#define HEAP_INLINE static inline __attribute__((always_inline))
#else
#define HEAP_INLINE static inline
#endif

HEAP_INLINE void fpush(fentry *heap, Py_ssize_t *n, const fentry *e) {
    Py_ssize_t i = (*n)++;
    while (i > 0) {
        Py_ssize_t up = (i - 1) / 2;
        if (!fbefore(e, &heap[up])) break;
        heap[i] = heap[up];
        i = up;
    }
    heap[i] = *e;
}


/* Put e at the root (replacing the top) and sift it down; the whole key only where scores tie. */
HEAP_INLINE void freplace_top(fentry *heap, Py_ssize_t size, const fentry *e) {
    Py_ssize_t i = 0;
    int64_t es = fbits(e);
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= size) break;
        int64_t cs = fbits(&heap[c]);
        if (c + 1 < size) {
            int64_t rs = fbits(&heap[c + 1]);
            if (LIKELY(rs != cs)) {
                c += rs > cs;
                cs = rs > cs ? rs : cs;
            } else {
                c += fbefore(&heap[c + 1], &heap[c]);
            }
        }
        if (LIKELY(cs != es) ? cs < es : !fbefore(&heap[c], e)) break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = *e;
}

static void fpop(fentry *heap, Py_ssize_t *n) {
    fentry last = heap[--(*n)];
    if (*n > 0) freplace_top(heap, *n, &last);
}

/* The growth loop of forest(): adds nodes beyond the B roots in merged order until `total`
   are added, writing the j-th added node's request, position in its tree, parent position,
   depth, rank and score into g_*[j] and each request's node count (root included) into count.
   Returns the nodes added; *more says whether some request could still grow. heap holds
   B + total + 1. *hn_io < 0 starts afresh; otherwise the growth resumes where the last call
   with this heap, count and g_* stopped (*hn_io entries in the heap, `added` nodes: what it
   returned): the merged order does not depend on where a round stopped, so growing on to a
   larger total adds the very nodes a fresh growth to it would (the joint budget's rounds grow
   on, not anew). */
Py_ssize_t bf_forest_grow(const double *p, Py_ssize_t b, Py_ssize_t depth, Py_ssize_t k,
                          const int64_t *cap, Py_ssize_t total, fentry *heap, int64_t *count,
                          int64_t *g_req, int64_t *g_pos, int64_t *g_par, int64_t *g_dep,
                          int64_t *g_rnk, double *g_sco, int *more, Py_ssize_t *hn_io,
                          Py_ssize_t added) {
    Py_ssize_t hn = *hn_io, m = added;
    if (hn < 0) {
        hn = m = 0;
        for (Py_ssize_t r = 0; r < b; r++) {
            count[r] = 1;
            const double *pr = p + r * depth * k;
            if (depth > 0 && k > 0 && cap[r] > 1 && pr[0] > 0.0) {
                fentry e = {pr[0], 1.0, (int32_t)r, 1, 0, 0};
                fpush(heap, &hn, &e);
            }
        }
    }
    while (hn > 0 && m < total) {
        fentry e = heap[0];
        Py_ssize_t r = e.request;
        if (count[r] >= cap[r]) { /* this request is full: its frontier is dropped */
            fpop(heap, &hn);
            continue;
        }
        Py_ssize_t pos = count[r]++;
        g_req[m] = r;
        g_pos[m] = pos;
        g_par[m] = e.parent;
        g_dep[m] = e.depth;
        g_rnk[m] = e.rank;
        g_sco[m] = e.score;
        m++;
        const double *pr = p + r * depth * k;
        fentry sib, child;
        int has_sib = 0, has_child = 0;
        if (e.rank + 1 < k) { /* next sibling */
            double s = e.parent_score * pr[(e.depth - 1) * k + e.rank + 1];
            if (s > 0.0) {
                sib = (fentry){s, e.parent_score, e.request, e.depth, e.parent, e.rank + 1};
                has_sib = 1;
            }
        }
        if (e.depth < depth) { /* first child */
            double s = e.score * pr[e.depth * k];
            if (s > 0.0) {
                child = (fentry){s, e.score, e.request, e.depth + 1, (int32_t)pos, 0};
                has_child = 1;
            }
        }
        /* the earlier successor replaces the top (a short sift), the later is pushed */
        if (has_sib && has_child) {
            if (fbefore(&sib, &child)) {
                freplace_top(heap, hn, &sib);
                fpush(heap, &hn, &child);
            } else {
                freplace_top(heap, hn, &child);
                fpush(heap, &hn, &sib);
            }
        } else if (has_sib) {
            freplace_top(heap, hn, &sib);
        } else if (has_child) {
            freplace_top(heap, hn, &child);
        } else {
            fpop(heap, &hn);
        }
    }
    int any = 0;
    for (Py_ssize_t i = 0; i < hn && !any; i++) any = count[heap[i].request] < cap[heap[i].request];
    *more = any;
    *hn_io = hn;
    return m;
}

/* The forest's trees as the caller returns them: each request's root, then the first
   keep[r] - 1 nodes added for it (all of them where keep is forest_grow's count), at its
   position in its own best-first order; offsets from keep. tokens (may be NULL): the roots'
   -1 and each node's token from ids [B, depth, k]. */
void bf_forest_scatter(Py_ssize_t b, Py_ssize_t m, const int64_t *keep, const int64_t *g_req,
                       const int64_t *g_pos, const int64_t *g_par, const int64_t *g_dep,
                       const int64_t *g_rnk, const double *g_sco, const int64_t *ids,
                       Py_ssize_t depth, Py_ssize_t k, int64_t *off, int64_t *par,
                       int64_t *dep, int64_t *rnk, double *sco, int64_t *tok) {
    off[0] = 0;
    for (Py_ssize_t r = 0; r < b; r++) {
        off[r + 1] = off[r] + keep[r];
        par[off[r]] = -1;
        dep[off[r]] = 0;
        rnk[off[r]] = -1;
        sco[off[r]] = 1.0;
        if (tok) tok[off[r]] = -1;
    }
    for (Py_ssize_t j = 0; j < m; j++) {
        Py_ssize_t r = g_req[j], pos = g_pos[j];
        if (pos >= keep[r]) continue;
        Py_ssize_t at = off[r] + pos;
        par[at] = g_par[j];
        dep[at] = g_dep[j];
        rnk[at] = g_rnk[j];
        sco[at] = g_sco[j];
        if (tok) tok[at] = ids[(r * depth + g_dep[j] - 1) * k + g_rnk[j]];
    }
}

PyObject *bf_forest(PyObject *self, PyObject *args) {
    Py_buffer probs, caps, ids = {0};
    Py_ssize_t depth, k, total;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*nny*n|y*", &probs, &depth, &k, &caps, &total, &ids))
        return NULL;
    Py_ssize_t b = caps.len / (Py_ssize_t)sizeof(int64_t);
    const double *p = (const double *)probs.buf;
    const int64_t *cap = (const int64_t *)caps.buf;
    fentry *heap = NULL;
    int64_t *count = NULL, *g_req = NULL, *g_pos = NULL, *g_par = NULL, *g_dep = NULL,
            *g_rnk = NULL;
    double *g_sco = NULL;
    PyObject *o_par = NULL, *o_dep = NULL, *o_rnk = NULL, *o_sco = NULL, *o_off = NULL,
             *o_ord = NULL, *o_osc = NULL, *o_tok = NULL;
    if (depth < 1 || k < 1 || total < 0 || b <= 0 || caps.len % (Py_ssize_t)sizeof(int64_t) ||
        depth > INT32_MAX || k > INT32_MAX || b > INT32_MAX ||
        b > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(double) / depth / k ||
        probs.len != b * depth * k * (Py_ssize_t)sizeof(double) ||
        (ids.buf && ids.len != b * depth * k * (Py_ssize_t)sizeof(int64_t))) {
        PyErr_SetString(PyExc_ValueError, "forest: inconsistent sizes");
        goto done;
    }
    for (Py_ssize_t r = 0; r < b; r++) {
        if (cap[r] < 1) {
            PyErr_SetString(PyExc_ValueError, "forest: every cap must be >= 1");
            goto done;
        }
    }
    /* every added node pushes at most two entries and pops one: the heap never exceeds
       B + total + 1 entries */
    if (total > (PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(fentry)) - b - 1) {
        PyErr_NoMemory();
        goto done;
    }
    heap = (fentry *)malloc((size_t)(b + total + 1) * sizeof(fentry));
    count = (int64_t *)calloc((size_t)b, sizeof(int64_t));
    g_req = (int64_t *)malloc((size_t)(total + 1) * sizeof(int64_t));
    g_pos = (int64_t *)malloc((size_t)(total + 1) * sizeof(int64_t));
    g_par = (int64_t *)malloc((size_t)(total + 1) * sizeof(int64_t));
    g_dep = (int64_t *)malloc((size_t)(total + 1) * sizeof(int64_t));
    g_rnk = (int64_t *)malloc((size_t)(total + 1) * sizeof(int64_t));
    g_sco = (double *)malloc((size_t)(total + 1) * sizeof(double));
    if (!heap || !count || !g_req || !g_pos || !g_par || !g_dep || !g_rnk || !g_sco) {
        PyErr_NoMemory();
        goto done;
    }
    int more = 0;
    Py_ssize_t hn = -1;
    Py_ssize_t m = bf_forest_grow(p, b, depth, k, cap, total, heap, count, g_req, g_pos, g_par,
                                  g_dep, g_rnk, g_sco, &more, &hn, 0);
    Py_ssize_t n = b + m;
    o_par = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    o_dep = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    o_rnk = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    o_sco = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(double));
    o_off = PyBytes_FromStringAndSize(NULL, (b + 1) * (Py_ssize_t)sizeof(int64_t));
    o_ord = PyBytes_FromStringAndSize(NULL, m * (Py_ssize_t)sizeof(int64_t));
    o_osc = PyBytes_FromStringAndSize(NULL, m * (Py_ssize_t)sizeof(double));
    if (!o_par || !o_dep || !o_rnk || !o_sco || !o_off || !o_ord || !o_osc) goto done;
    if (ids.buf) {
        o_tok = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
        if (!o_tok) goto done;
    }
    {
        int64_t *par = (int64_t *)PyBytes_AS_STRING(o_par);
        int64_t *dep = (int64_t *)PyBytes_AS_STRING(o_dep);
        int64_t *rnk = (int64_t *)PyBytes_AS_STRING(o_rnk);
        double *sco = (double *)PyBytes_AS_STRING(o_sco);
        int64_t *off = (int64_t *)PyBytes_AS_STRING(o_off);
        int64_t *ord = (int64_t *)PyBytes_AS_STRING(o_ord);
        double *osc = (double *)PyBytes_AS_STRING(o_osc);
        bf_forest_scatter(b, m, count, g_req, g_pos, g_par, g_dep, g_rnk, g_sco,
                          ids.buf ? (const int64_t *)ids.buf : NULL, depth, k, off, par, dep, rnk,
                          sco, o_tok ? (int64_t *)PyBytes_AS_STRING(o_tok) : NULL);
        for (Py_ssize_t j = 0; j < m; j++) {
            ord[j] = g_req[j];
            osc[j] = g_sco[j];
        }
    }
    if (o_tok)
        result = Py_BuildValue("(OOOOOOOiO)", o_par, o_dep, o_rnk, o_sco, o_off, o_ord, o_osc,
                               more, o_tok);
    else
        result = Py_BuildValue("(OOOOOOOi)", o_par, o_dep, o_rnk, o_sco, o_off, o_ord, o_osc,
                               more);
done:
    Py_XDECREF(o_tok);
    Py_XDECREF(o_par);
    Py_XDECREF(o_dep);
    Py_XDECREF(o_rnk);
    Py_XDECREF(o_sco);
    Py_XDECREF(o_off);
    Py_XDECREF(o_ord);
    Py_XDECREF(o_osc);
    free(heap);
    free(count);
    free(g_req);
    free(g_pos);
    free(g_par);
    free(g_dep);
    free(g_rnk);
    free(g_sco);
    PyBuffer_Release(&probs);
    PyBuffer_Release(&caps);
    if (ids.buf) PyBuffer_Release(&ids);
    return result;
}

/* The joint kernels' answer (joint(), paper()) in two buffers: int64 [offsets (B + 1), parents,
   tokens, depths, ranks (n each)] and float64 [scores (n), Â, Ĉ, Ŝ (m + 1 each)], n = B +
   chosen nodes kept (each request's first alloc[r] - 1 added ones, as forest_scatter writes
   them). 0, or -1 with an exception set. */
int bf_joint_buffers(Py_ssize_t b, Py_ssize_t m, Py_ssize_t chosen, const int64_t *alloc,
                     const int64_t *g_req, const int64_t *g_pos, const int64_t *g_par,
                     const int64_t *g_dep, const int64_t *g_rnk, const double *g_sco,
                     const int64_t *tid, Py_ssize_t depth, Py_ssize_t k, const double *a_hat,
                     const double *c_hat, const double *s_hat, PyObject **ints,
                     PyObject **floats) {
    Py_ssize_t n = b + chosen, i8 = sizeof(int64_t), f8 = sizeof(double);
    *ints = PyBytes_FromStringAndSize(NULL, (b + 1 + 4 * n) * i8);
    *floats = PyBytes_FromStringAndSize(NULL, (n + 3 * (m + 1)) * f8);
    if (!*ints || !*floats) {
        Py_CLEAR(*ints);
        Py_CLEAR(*floats);
        return -1;
    }
    int64_t *off = (int64_t *)PyBytes_AS_STRING(*ints);
    int64_t *par = off + b + 1, *tok = par + n, *dep = tok + n, *rnk = dep + n;
    double *sco = (double *)PyBytes_AS_STRING(*floats);
    bf_forest_scatter(b, m, alloc, g_req, g_pos, g_par, g_dep, g_rnk, g_sco, tid, depth, k, off,
                      par, dep, rnk, sco, tok);
    memcpy(sco + n, a_hat, (size_t)(m + 1) * sizeof(double));
    memcpy(sco + n + m + 1, c_hat, (size_t)(m + 1) * sizeof(double));
    memcpy(sco + n + 2 * (m + 1), s_hat, (size_t)(m + 1) * sizeof(double));
    return 0;
}
