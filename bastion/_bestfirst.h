/*
 * Private declarations shared by the C sources of the compiled kernel bastion._bestfirst.
 *
 * Not an API: the types and helpers one source uses from another (the helpers prefixed bf_ and
 * hidden from the shared object's exported symbols, which stay PyInit__bestfirst alone) and the
 * Python-level functions the method table in _bestfirst.c names. Every source includes this
 * header first, so every one is compiled with contraction into fused multiply-adds switched off
 * (its floating-point operations are numpy's, in the same order: see _bestfirst.c).
 */
#ifndef BASTION_BESTFIRST_H
#define BASTION_BESTFIRST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* build()'s heap entry (see _bestfirst_tree.c): key (-score, depth, parent position, rank) */
typedef struct {
    double score;
    int32_t depth;
    int32_t parent;
    int32_t rank;
} entry;

#if defined(__GNUC__) || defined(__clang__)
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define LIKELY(x) (x)
#define PREFETCH(p) ((void)(p))
#endif
#define PREFETCH_AHEAD 4 /* nodes ahead whose rows a walk over trees prefetches */

/* The joint budget's regrowth of a bounded round, shared by joint() and paper():
   bf_growth is bastion.joint._growth (c_hat: the m + 1 priced passes' Ĉ), bf_regrown is
   bastion.joint._regrown (Python's min(max(math.ceil(growth * total), total + b), most), the
   same doubles). */
#define GROWTH_MIN 1.25
static inline double bf_growth(const double *c_hat, Py_ssize_t m, double c_needed) {
    if (m < 2) return 2.0;
    double slope = (c_hat[m] - c_hat[m / 2]) / (double)(m - m / 2);
    if (slope <= 0.0) return 8.0;
    double g = ((double)m + (c_needed - c_hat[m]) / slope) / (double)m;
    if (!(g >= GROWTH_MIN)) return GROWTH_MIN; /* min(8, max(GROWTH_MIN, g)): NaN too */
    return g > 8.0 ? 8.0 : g;
}
static inline Py_ssize_t bf_regrown(Py_ssize_t total, double growth, Py_ssize_t b,
                                    Py_ssize_t most) {
    Py_ssize_t next = (Py_ssize_t)ceil(growth * (double)total);
    if (next < total + b) next = total + b;
    return next < most ? next : most;
}

/* forest()'s heap entry (see _bestfirst_forest.c): key (-score, request, depth, parent
   position, rank); joint() allocates the heap forest_grow() fills. */
typedef struct {
    double score;
    double parent_score;
    int32_t request;
    int32_t depth;
    int32_t parent;
    int32_t rank;
} fentry;

#if defined(__GNUC__) || defined(__clang__)
#define BF_PRIVATE __attribute__((visibility("hidden")))
#else
#define BF_PRIVATE
#endif

/* _bestfirst_tree.c: one request's best-first tree and the buffer-size checks */
BF_PRIVATE void bf_grow_one(const double *p, Py_ssize_t depth, Py_ssize_t k, Py_ssize_t budget,
                            entry *heap, Py_ssize_t *hn_io, Py_ssize_t *n_io, int64_t *parents,
                            int64_t *depths, int64_t *ranks, double *scores);
BF_PRIVATE Py_ssize_t bf_build_one(const double *p, Py_ssize_t depth, Py_ssize_t k,
                                  Py_ssize_t budget, entry *heap, int64_t *parents,
                                  int64_t *depths, int64_t *ranks, double *scores);
BF_PRIVATE int bf_holds_exactly(Py_ssize_t len, Py_ssize_t elem, Py_ssize_t a, Py_ssize_t b,
                                Py_ssize_t c);
BF_PRIVATE int bf_holds_at_least(Py_ssize_t len, Py_ssize_t elem, Py_ssize_t n);

/* _bestfirst_size.c: one growth round of bastion.budget.choose_tree on a priced curve */
BF_PRIVATE int bf_size_round(const double *p, const int64_t *tid, Py_ssize_t depth, Py_ssize_t k,
                             Py_ssize_t budget, Py_ssize_t ahead, Py_ssize_t n_max, int rule,
                             int64_t root_token, const double *v, double draft, double prep,
                             double dp, double ar, double base, double a_ceiling, int64_t *ints,
                             double *floats, entry *heap, Py_ssize_t *n_out,
                             Py_ssize_t *chosen_out);

/* _bestfirst_forest.c: the merged growth of B trees and their scatter into per-request trees */
BF_PRIVATE Py_ssize_t bf_forest_grow(const double *p, Py_ssize_t b, Py_ssize_t depth,
                                    Py_ssize_t k, const int64_t *cap, Py_ssize_t total,
                                    fentry *heap, int64_t *count, int64_t *g_req,
                                    int64_t *g_pos, int64_t *g_par, int64_t *g_dep,
                                    int64_t *g_rnk, double *g_sco, int *more,
                                    Py_ssize_t *hn_io, Py_ssize_t added);
BF_PRIVATE int bf_joint_buffers(Py_ssize_t b, Py_ssize_t m, Py_ssize_t chosen,
                                const int64_t *alloc, const int64_t *g_req, const int64_t *g_pos,
                                const int64_t *g_par, const int64_t *g_dep, const int64_t *g_rnk,
                                const double *g_sco, const int64_t *tid, Py_ssize_t depth,
                                Py_ssize_t k, const double *a_hat, const double *c_hat,
                                const double *s_hat, PyObject **ints, PyObject **floats);
BF_PRIVATE void bf_forest_scatter(Py_ssize_t b, Py_ssize_t m, const int64_t *keep,
                                  const int64_t *g_req, const int64_t *g_pos,
                                  const int64_t *g_par, const int64_t *g_dep,
                                  const int64_t *g_rnk, const double *g_sco, const int64_t *ids,
                                  Py_ssize_t depth, Py_ssize_t k, int64_t *off, int64_t *par,
                                  int64_t *dep, int64_t *rnk, double *sco, int64_t *tok);

/* _bestfirst_learn.c: the acceptance walk of accept() and verify() (see above bf_accept_walk) */
BF_PRIVATE Py_ssize_t bf_accept_walk(const int64_t *parents, const int64_t *tokens,
                                     const int64_t *depths, const int64_t *offsets,
                                     const int64_t *target, Py_ssize_t b, Py_ssize_t n,
                                     Py_ssize_t width, char *on, int64_t *counts,
                                     int64_t *lengths);
BF_PRIVATE void bf_accept_emit(const int64_t *tokens, const int64_t *offsets,
                               const int64_t *target, Py_ssize_t b, Py_ssize_t width,
                               const char *on, const int64_t *lengths, int64_t *committed,
                               int64_t *nodes);

/* _bestfirst_paper.c: numpy's add.reduce of n contiguous doubles (pairwise), bit for bit */
BF_PRIVATE double bf_pairwise(const double *a, Py_ssize_t n);

/* the functions of the module (its method table is in _bestfirst.c) */
BF_PRIVATE PyObject *bf_build(PyObject *self, PyObject *args);     /* _bestfirst_tree.c */
BF_PRIVATE PyObject *bf_chunk(PyObject *self, PyObject *args);     /* _bestfirst_size.c */
BF_PRIVATE PyObject *bf_choose(PyObject *self, PyObject *args);    /* _bestfirst_size.c */
BF_PRIVATE PyObject *bf_forest(PyObject *self, PyObject *args);    /* _bestfirst_forest.c */
BF_PRIVATE PyObject *bf_joint(PyObject *self, PyObject *args);     /* _bestfirst_joint.c */
BF_PRIVATE PyObject *bf_floor(PyObject *self, PyObject *args);     /* _bestfirst_joint.c */
BF_PRIVATE PyObject *bf_accept(PyObject *self, PyObject *args);    /* _bestfirst_learn.c */
BF_PRIVATE PyObject *bf_learn(PyObject *self, PyObject *args);     /* _bestfirst_learn.c */
BF_PRIVATE PyObject *bf_calibrate(PyObject *self, PyObject *args); /* _bestfirst_calibrate.c */
BF_PRIVATE PyObject *bf_gains(PyObject *self, PyObject *args);     /* _bestfirst_learn.c */
BF_PRIVATE PyObject *bf_drafter_s(PyObject *self, PyObject *args); /* _bestfirst_paper.c */
BF_PRIVATE PyObject *bf_pass_sums(PyObject *self, PyObject *args); /* _bestfirst_paper.c */
BF_PRIVATE PyObject *bf_advance(PyObject *self, PyObject *args);   /* _bestfirst_draws.c */
BF_PRIVATE PyObject *bf_medians(PyObject *self, PyObject *args);   /* _bestfirst_learn.c */
BF_PRIVATE PyObject *bf_fill_row(PyObject *self, PyObject *args);  /* _bestfirst_learn.c */
BF_PRIVATE PyObject *bf_finite_median(PyObject *self, PyObject *args); /* _bestfirst_learn.c */
BF_PRIVATE PyObject *bf_size_factors(PyObject *self, PyObject *args); /* _bestfirst_learn.c */
BF_PRIVATE PyObject *bf_beam(PyObject *self, PyObject *args);      /* _bestfirst_shaped.c */
BF_PRIVATE PyObject *bf_eagle(PyObject *self, PyObject *args);     /* _bestfirst_shaped.c */
BF_PRIVATE PyObject *bf_draws(PyObject *self, PyObject *args);     /* _bestfirst_draws.c */
BF_PRIVATE PyObject *bf_draws_pin(PyObject *self, PyObject *args);     /* _bestfirst_draws.c */
BF_PRIVATE PyObject *bf_neg_logit(PyObject *self, PyObject *args); /* _bestfirst_draws.c */
BF_PRIVATE PyObject *bf_seed_words(PyObject *self, PyObject *args); /* _bestfirst_draws.c */
BF_PRIVATE PyObject *bf_seed_state(PyObject *self, PyObject *entropy); /* _bestfirst_draws.c */
BF_PRIVATE PyObject *bf_paper(PyObject *self, PyObject *args);     /* _bestfirst_paper.c */
BF_PRIVATE PyObject *bf_joint_price(PyObject *self, PyObject *args); /* _bestfirst_paper.c */
BF_PRIVATE PyObject *bf_request(PyObject *self, PyObject *args);   /* _bestfirst_request.c */
BF_PRIVATE PyObject *bf_kv_blocks(PyObject *self, PyObject *args); /* _bestfirst_kv.c */
BF_PRIVATE PyObject *bf_sums(PyObject *self, PyObject *args);      /* _bestfirst_kv.c */
BF_PRIVATE PyObject *bf_commit(PyObject *self, PyObject *args);    /* _bestfirst_kv.c */
BF_PRIVATE PyObject *bf_verify(PyObject *self, PyObject *args);    /* _bestfirst_kv.c */
BF_PRIVATE PyObject *bf_gather(PyObject *self, PyObject *args);    /* _bestfirst_kv.c */
BF_PRIVATE PyObject *bf_pool_pin(PyObject *self, PyObject *args);  /* _bestfirst_kv.c */
BF_PRIVATE PyObject *bf_settle(PyObject *self, PyObject *args);    /* _bestfirst_kv.c */
BF_PRIVATE PyObject *bf_mean_floor(PyObject *self, PyObject *arg); /* _bestfirst_kv.c */
BF_PRIVATE PyObject *bf_chain_cut(PyObject *self, PyObject *args); /* _bestfirst_chain.c */
BF_PRIVATE PyObject *bf_shadow(PyObject *self, PyObject *args);    /* _bestfirst_chain.c */
BF_PRIVATE extern const char bf_chunk_doc[];
BF_PRIVATE extern const char bf_choose_doc[];

#endif /* BASTION_BESTFIRST_H */
