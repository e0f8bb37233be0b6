/*
 * The compiled kernel bastion._bestfirst: its method table and module, and what it offers.
 *
 * Best-first tree construction: the same lazy heap as bastion.bestfirst.best_first_heap
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
 *
 * beam(...), eagle(...): BeamPolicy's and EaglePolicy's trees for a batch (_bestfirst_shaped.c).
 *
 * draws(...), neg_logit(...), seed_words(...), seed_state(...): the simulator's synthetic
 *   drafter, the drafted steps' marginals and target tokens from their requests' random draws,
 *   a block's log-odds, and the words and PCG64 state a request's generator is seeded from
 *   (_bestfirst_draws.c).
 *
 * joint(...), floor(...): the learning controller's joint budget and the stepped decision floor
 *   it is priced from (_bestfirst_joint.c).
 *
 * paper(...): the paper controller's joint budget on a calibrated roofline it prices itself
 *   (_bestfirst_paper.c, with drafter_s(...) and pass_sums(...): the simulated GPU's operator
 *   sums of a drafter pass and of a target pass); request(...): the paper's per-request
 *   rule at batch > 1, the same way (_bestfirst_request.c).
 *
 * blocks(...), sums(...), commit(...), verify(...), gather(...), settle(...): the simulated
 *   server's KV-cache block counts, the ground truth's sums over a step's requests, a verified
 *   step's counts (verify: with accept()'s walk first) and a serving step's per-request inputs
 *   and closing bookkeeping (_bestfirst_kv.c); mean_floor(...): a step's mean context, rounded
 *   down (the learning controller's prior is priced per step of it).
 *
 * forest(...), accept(...): the joint budget's merged chain and the simulator's acceptance walk
 *   over a batch of trees (see the comments opening _bestfirst_forest.c and above accept() in
 *   _bestfirst_learn.c).
 *
 * chunk(...) -> (status, n, chosen): one growth round of bastion.budget.choose_tree (see
 *   bf_chunk_doc in _bestfirst_size.c): validate the priced curve, build T_budget, write its
 *   tree arrays and Â/Ĉ/Ŝ into caller-owned buffers, apply the stopping rule. Every
 *   floating-point operation is the one numpy performs in the reference path, in the same
 *   order, so the results are bit-identical; contraction into fused multiply-adds is therefore
 *   switched off.
 *
 * The sources: _bestfirst_tree.c (the heap, one request's tree, build()), _bestfirst_size.c
 * (chunk() and choose()), _bestfirst_forest.c (forest()), _bestfirst_joint.c (joint(), floor()),
 * _bestfirst_learn.c (accept(), learn(), gains(), size_factors(), medians(), fill_row(),
 * finite_median()),
 * _bestfirst_calibrate.c (calibrate()),
 * _bestfirst_shaped.c (beam(), eagle()),
 * _bestfirst_draws.c (draws(), neg_logit(), advance(), seed_words(), seed_state()),
 * _bestfirst_paper.c (paper(), joint_price(), drafter_s(), pass_sums()), _bestfirst_request.c
 * (request()), _bestfirst_kv.c (blocks(), sums(), commit(), verify(), gather(), settle(),
 * mean_floor()),
 * _bestfirst_chain.c (chain_cut(), shadow()); _bestfirst.h declares what they share.
 */
#include "_bestfirst.h"

static PyMethodDef methods[] = {
    {"build", bf_build, METH_VARARGS, "Best-first trees for B requests (see module comment)."},
    {"choose", bf_choose, METH_VARARGS, bf_choose_doc},
    {"chunk", bf_chunk, METH_VARARGS, bf_chunk_doc},
    {"forest", bf_forest, METH_VARARGS, "B best-first trees grown together in merged order."},
    {"joint", bf_joint, METH_VARARGS, "The learning controller's joint budget (see above)."},
    {"floor", bf_floor, METH_VARARGS,
     "The learning controller's stepped decision floor (see _bestfirst_joint.c)."},
    {"accept", bf_accept, METH_VARARGS, "Accepted paths of a batch of trees against targets."},
    {"calibrate", bf_calibrate, METH_VARARGS,
     "Calibrated marginals, rows re-sorted (_bestfirst_calibrate.c)."},
    {"learn", bf_learn, METH_VARARGS, "A tree step folded into both calibrations, in place."},
    {"gains", bf_gains, METH_VARARGS, "The size calibration's gain ratios (_bestfirst_learn.c)."},
    {"medians", bf_medians, METH_VARARGS, "The cycle table's cell medians (_bestfirst_learn.c)."},
    {"fill_row", bf_fill_row, METH_VARARGS,
     "A cycle-table row's gaps filled as np.interp fills them (_bestfirst_learn.c)."},
    {"finite_median", bf_finite_median, METH_VARARGS,
     "The median of a cycle-table row's finite cells (_bestfirst_learn.c)."},
    {"size_factors", bf_size_factors, METH_VARARGS,
     "The size calibration's factors per lattice cell (_bestfirst_learn.c)."},
    {"beam", bf_beam, METH_VARARGS, "Beam trees for B requests (see _bestfirst_shaped.c)."},
    {"eagle", bf_eagle, METH_VARARGS, "EAGLE trees for B requests (see _bestfirst_shaped.c)."},
    {"draws", bf_draws, METH_VARARGS, "Synthetic steps from their draws (see _bestfirst_draws.c)."},
    {"draws_pin", bf_draws_pin, METH_VARARGS,
     "A synthetic source's stored draws, pinned for draws() (see _bestfirst_draws.c)."},
    {"advance", bf_advance, METH_VARARGS,
     "The synthetic source's rows of a step, cursors moved on (_bestfirst_draws.c)."},
    {"neg_logit", bf_neg_logit, METH_VARARGS,
     "A synthetic block's negated head log-odds (see _bestfirst_draws.c)."},
    {"seed_words", bf_seed_words, METH_VARARGS,
     "numpy SeedSequence words of an entropy (see _bestfirst_draws.c)."},
    {"seed_state", bf_seed_state, METH_O,
     "numpy's PCG64 state seeded from an entropy (see _bestfirst_draws.c)."},
    {"paper", bf_paper, METH_VARARGS, "The paper controller's joint budget (_bestfirst_paper.c)."},
    {"drafter_s", bf_drafter_s, METH_VARARGS,
     "A drafter pass's operator seconds, summed (_bestfirst_paper.c)."},
    {"pass_sums", bf_pass_sums, METH_VARARGS,
     "A simulated target pass's operator sums (_bestfirst_paper.c)."},
    {"joint_price", bf_joint_price, METH_VARARGS,
     "A calibrated roofline's joint curve along a growth (_bestfirst_paper.c)."},
    {"request", bf_request, METH_VARARGS, "The per-request rule (_bestfirst_request.c)."},
    {"blocks", bf_kv_blocks, METH_VARARGS, "A sum of KV-cache block counts (_bestfirst_kv.c)."},
    {"sums", bf_sums, METH_VARARGS, "A step's pass sums for the ground truth (_bestfirst_kv.c)."},
    {"commit", bf_commit, METH_VARARGS,
     "A simulated verified step's context and generated counts updated (_bestfirst_kv.c)."},
    {"verify", bf_verify, METH_VARARGS,
     "A simulated step's trees walked and its counts committed (_bestfirst_kv.c)."},
    {"pool_pin", bf_pool_pin, METH_VARARGS,
     "A simulated pool's count arrays' buffers held for verify() and gather() (_bestfirst_kv.c)."},
    {"gather", bf_gather, METH_VARARGS,
     "A serving step's contexts, wanted tokens, KV room and last sizes (_bestfirst_kv.c)."},
    {"settle", bf_settle, METH_VARARGS,
     "A served step's last sizes kept and its finished requests counted (_bestfirst_kv.c)."},
    {"mean_floor", bf_mean_floor, METH_O,
     "floor(sum / n) of a non-empty int64 buffer, or None (_bestfirst_kv.c)."},
    {"chain_cut", bf_chain_cut, METH_VARARGS,
     "The chain's Â less its root, cut at every depth (_bestfirst_chain.c)."},
    {"shadow", bf_shadow, METH_VARARGS,
     "The chain's shadow on a tree step: realised and predicted τ (_bestfirst_chain.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_bestfirst", "Compiled best-first tree construction.", -1, methods,
};

PyMODINIT_FUNC PyInit__bestfirst(void) { return PyModule_Create(&module); }
