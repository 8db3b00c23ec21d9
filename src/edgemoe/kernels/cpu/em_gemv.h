/* Few-token matrix-vector products: bf16 weights × fp32 activations, fp32 accumulation.
 *
 * Memory-bound at batch 1, so the weights are read once with the widest loads and
 * converted for free: a 32-bit lane holding two bf16 weights (w[2j] low, w[2j+1] high)
 * becomes fp32 w[2j] by a left shift of 16 and fp32 w[2j+1] by masking the low half.
 * The activations are stored pre-split to match ("split layout": per block of 2*VW
 * values, the VW even-indexed ones then the VW odd-indexed ones), so the inner loop is
 * load, shift, and, FMA — no shuffles. Four weight rows share each activation load.
 *
 * gemv4(w, xs, xs_stride, nt, K, dots): dots[r*nt + t] = sum_k w[r][k] * x_t[k] for
 * r < 4 rows and t < nt <= EM_NT tokens; xs holds nt rows in split layout, zero-padded
 * to a multiple of 2*VW.
 */
#ifndef EM_GEMV_H
#define EM_GEMV_H

#include <stdint.h>
#include <string.h>

static inline float em_bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#if defined(EM_ISA_AVX512) || defined(EM_ISA_AMX)
#include <immintrin.h>
#define EM_VW 16
#define EM_NT 4
#define EM_PF 1024 /* prefetch distance in bytes along each weight row */

static inline __attribute__((always_inline)) void em_gemv4_impl(const uint16_t *const *w, const float *xs,
                                                                 int64_t xss, const int nt, int K, float *dots) {
    __m512 acc[4][EM_NT];
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) acc[r][t] = _mm512_setzero_ps();
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    int k = 0;
    for (; k < K; k += 32) {
        /* NOTE: the tail block loads only K-k weights (masked); xs is zero there. */
        __mmask32 m = K - k >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (K - k)) - 1u);
        __m512 xe[EM_NT], xo[EM_NT];
        for (int t = 0; t < nt; t++) {
            xe[t] = _mm512_loadu_ps(xs + t * xss + k);
            xo[t] = _mm512_loadu_ps(xs + t * xss + k + 16);
        }
        for (int r = 0; r < 4; r++) {
            _mm_prefetch((const char *)(w[r] + k) + EM_PF, _MM_HINT_T0);
            __m512i v = _mm512_maskz_loadu_epi16(m, w[r] + k);
            __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
            for (int t = 0; t < nt; t++) acc[r][t] = _mm512_fmadd_ps(wo, xo[t], _mm512_fmadd_ps(we, xe[t], acc[r][t]));
        }
    }
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) dots[r * nt + t] = _mm512_reduce_add_ps(acc[r][t]);
}

#elif defined(EM_ISA_AVX2)
#include <immintrin.h>
#define EM_VW 8
#define EM_NT 2 /* 16 ymm registers: 8 accumulators + 4 activations + 2 weights */
#define EM_PF 1024

static inline float em_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) void em_gemv4_impl(const uint16_t *const *w, const float *xs,
                                                                 int64_t xss, const int nt, int K, float *dots) {
    __m256 acc[4][EM_NT];
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) acc[r][t] = _mm256_setzero_ps();
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    for (int k = 0; k < K; k += 16) {
        __m256 xe[EM_NT], xo[EM_NT];
        for (int t = 0; t < nt; t++) {
            xe[t] = _mm256_loadu_ps(xs + t * xss + k);
            xo[t] = _mm256_loadu_ps(xs + t * xss + k + 8);
        }
        for (int r = 0; r < 4; r++) {
            __m256i v;
            if (K - k >= 16) {
                _mm_prefetch((const char *)(w[r] + k) + EM_PF, _MM_HINT_T0);
                v = _mm256_loadu_si256((const __m256i *)(w[r] + k));
            } else { /* tail: no 16-bit masked loads in AVX2 */
                uint16_t buf[16] = {0};
                memcpy(buf, w[r] + k, (size_t)(K - k) * 2);
                v = _mm256_loadu_si256((const __m256i *)buf);
            }
            __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
            for (int t = 0; t < nt; t++) acc[r][t] = _mm256_fmadd_ps(wo, xo[t], _mm256_fmadd_ps(we, xe[t], acc[r][t]));
        }
    }
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) dots[r * nt + t] = em_hsum256(acc[r][t]);
}

#else /* portable C; split layout with VW = 1 is the plain layout */
#define EM_VW 1
#define EM_NT 4

static inline __attribute__((always_inline)) void em_gemv4_impl(const uint16_t *const *w, const float *xs,
                                                                 int64_t xss, const int nt, int K, float *dots) {
    float acc[4][EM_NT] = {{0}};
    for (int k = 0; k < K; k++)
        for (int r = 0; r < 4; r++) {
            float wk = em_bf16_to_f32(w[r][k]);
            for (int t = 0; t < nt; t++) acc[r][t] += wk * xs[t * xss + k];
        }
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) dots[r * nt + t] = acc[r][t];
}
#endif

/* Position of element i in the split layout. */
static inline int64_t em_split_pos(int64_t i) {
    int64_t b = i / (2 * EM_VW), j = i % (2 * EM_VW);
    return b * 2 * EM_VW + (j & 1) * EM_VW + j / 2;
}

/* Constant token counts let the compiler keep the accumulators in registers. */
static void em_gemv4_1(const uint16_t *const *w, const float *xs, int64_t s, int K, float *d) { em_gemv4_impl(w, xs, s, 1, K, d); }
static void em_gemv4_2(const uint16_t *const *w, const float *xs, int64_t s, int K, float *d) { em_gemv4_impl(w, xs, s, 2, K, d); }
#if EM_NT >= 4
static void em_gemv4_3(const uint16_t *const *w, const float *xs, int64_t s, int K, float *d) { em_gemv4_impl(w, xs, s, 3, K, d); }
static void em_gemv4_4(const uint16_t *const *w, const float *xs, int64_t s, int K, float *d) { em_gemv4_impl(w, xs, s, 4, K, d); }
#endif

static void em_gemv4(const uint16_t *const *w, const float *xs, int64_t xss, int nt, int K, float *dots) {
    switch (nt) {
    case 1: em_gemv4_1(w, xs, xss, K, dots); break;
    case 2: em_gemv4_2(w, xs, xss, K, dots); break;
#if EM_NT >= 4
    case 3: em_gemv4_3(w, xs, xss, K, dots); break;
    default: em_gemv4_4(w, xs, xss, K, dots); break;
#endif
    }
}

#endif
