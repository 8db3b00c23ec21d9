/* The jobs' GLU and biases. Without biases under SiLU, h = silu(gate · x) · (up · x) as
 * always. gpt-oss's experts (transformers' GptOssExperts) add per-expert biases and clamp:
 * for gate_up row pair i (gate row i, up row I + i) of a job,
 *   g = gate · x + b_gu[i],  u = up · x + b_gu[I + i]           (fp32: the dots' precision)
 *   h = silu(g) · u                                             (EM_ACT_SILU)
 *   h = (clamp(u, ±L) + 1) · g' · sigmoid(α · g'), g' = min(g, L)   (EM_ACT_SWIGLU_OAI)
 * and each output row r is down_r · h + b_d[r], times the routing weight after (em_store,
 * em_store_rows). h then goes where it went before: fp32 on the GEMV, rounded once to bf16
 * on the blocked path (the reference's one rounding of h, after its fp32 bias and GLU).
 *
 * The biases are read in place — a job's rows of the layer's [E, 2I] / [E, H] bias banks,
 * in the model's dtype (bf16 or fp32, one dtype a call) — and widened a value at a time,
 * exactly: no fp32 copy to allocate, keep alive or keep in step with the banks (the CPU
 * share's mailboxes hold bank addresses for a captured graph's lifetime), and a value a
 * row of a 2048-long dot costs nothing. α and L are the call's (a config's values).
 *
 * A job without biases under SiLU takes the code of before (em_plain_glu: one branch a row
 * pair, the same operations), so its results are bitwise those of a kernel without biases.
 *
 * NOTE: included by expert.c after em_call and em_job; the 16-lane forms are em_epilogue.h's.
 */
#ifndef EM_GLU_H
#define EM_GLU_H

#define EM_ACT_SILU 0
#define EM_ACT_SWIGLU_OAI 1

static inline int em_glu_ok(const em_glu_spec *g) {
    if (!g || (g->bias_bf16 != 0 && g->bias_bf16 != 1)) return 0;
    if (g->act == EM_ACT_SILU) return 1;
    return g->act == EM_ACT_SWIGLU_OAI && g->alpha == g->alpha && g->limit == g->limit; /* not NaN */
}

/* Value i of the bias row at `addr` (the call's dtype) in fp32, exactly. */
static inline float em_bias_at(const em_call *c, int64_t addr, int64_t i) {
    if (c->glu.bias_bf16) return em_bf16_to_f32(((const uint16_t *)(intptr_t)addr)[i]);
    return ((const float *)(intptr_t)addr)[i];
}

/* Whether job jb's gate_up rows end as without biases: silu(gate) · up, nothing added. */
static inline int em_plain_glu(const em_call *c, const em_job *jb) {
    return c->glu.act == EM_ACT_SILU && !jb->gate_up_bias;
}

/* gpt-oss's clamped SwiGLU in fp32, the reference's operations in its order: (u + 1) ·
 * (g · sigmoid(α·g)). Comparisons, not fminf: a NaN stays NaN, as through torch's clamp. */
static inline float em_swiglu_oai(float g, float u, float alpha, float limit) {
    g = g > limit ? limit : g;
    u = u > limit ? limit : u < -limit ? -limit : u;
    return (u + 1.0f) * (g * (1.0f / (1.0f + expf(-(alpha * g)))));
}

/* h of row pair i from its dots g (gate row i) and u (up row I + i): the job's biases
 * added (if it has them), then the call's GLU. */
static inline float em_glu_biased(const em_call *c, const em_job *jb, int64_t i, float g, float u) {
    if (jb->gate_up_bias) {
        g += em_bias_at(c, jb->gate_up_bias, i);
        u += em_bias_at(c, jb->gate_up_bias, c->I + i);
    }
    return c->glu.act == EM_ACT_SILU ? em_silu(g) * u : em_swiglu_oai(g, u, c->glu.alpha, c->glu.limit);
}

/* The GEMV epilogue of row pair i (and the blocked path's one value at a time). */
static inline float em_glu(const em_call *c, const em_job *jb, int64_t i, float g, float u) {
    return em_plain_glu(c, jb) ? em_silu(g) * u : em_glu_biased(c, jb, i, g, u);
}

#endif
