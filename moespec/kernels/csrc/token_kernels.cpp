// Native per-token steps of moespec's verification pass, the small work between the streams: RMSNorm, rotary
// embedding, and the router's softmax and top-k.
//
// Shape legend
//   rows  tokens (or tokens x heads for a per-head norm)     d  features normalized together
//   x     [rows, d]  row stride x_s elements, fp32 or bf16          w  [d], x's dtype
//   y     [rows, d]  row stride y_s, x's dtype (may be x itself)
//     y = w * round(x * 1 / sqrt(mean(x^2) + eps))   in fp32, the inner rounding to x's dtype: what transformers'
//     Llama-family RMSNorm computes (`weight * hidden.to(input_dtype)`), the product rounded once more.
//   t     [n, H, D]  strides (t_sn, t_sh) elements, last dim contiguous, fp32 or bf16, rotated in place
//   cos, sin [n, D]  contiguous, t's dtype (transformers' rotary module output, already rounded to the dtype)
//     t = round(round(t * cos) + round(rotate_half(t) * sin)), rotate_half(t) = (-t[D/2:], t[:D/2]): the
//     non-interleaved rotary of transformers' apply_rotary_pos_emb, each torch op's rounding reproduced.
//   logits [n, N]   contiguous, fp32 or bf16 (a router's output)
//   scores [n, k]   contiguous, fp32 or bf16; ids [n, k] int64: the k largest of softmax(logits) per row in
//     descending order (ties in torch's topk order, see top_k), divided by their sum when renorm is set: the
//     softmax-then-top-k router of OLMoE, Qwen3-MoE and Mixtral, in fp32 and rounded once to the scores' dtype.
//
// Physics. These touch a few kilobytes per token, so their cost is not bytes but calls: in transformers an RMSNorm
// is eight torch operations and a rotary ten, each a few microseconds after a pass has streamed hundreds of
// megabytes through the caches. One call each, on the calling thread (no OpenMP fork for microseconds of work).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "simd_common.h"

namespace {

using namespace moespec_simd;  // bf16, to_f32, to_bf16, load8

inline float round_to(float v, float*) { return v; }
inline float round_to(float v, bf16*) { return to_f32(to_bf16(v)); }
inline void store(float* p, float v) { *p = v; }
inline void store(bf16* p, float v) { *p = to_bf16(v); }

// The sum of x[i]^2 over a row in fp64 (each square exact, and the order of the terms no longer matters at an fp32
// or bf16 rounding), in four chains of 4 lanes: one chain waits on the add's latency at every element, ~0.25 ms for
// a pass of 72 rows of 2048.
template <typename T>
double sum_squares(const T* x, int64_t d) {
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t i = 0;
    for (; i + 16 <= d; i += 16)
        for (int h = 0; h < 2; ++h) {
            const __m256 v = load8(x + i + 8 * h);
            const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
            const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
            acc[2 * h] = _mm256_fmadd_pd(lo, lo, acc[2 * h]);
            acc[2 * h + 1] = _mm256_fmadd_pd(hi, hi, acc[2 * h + 1]);
        }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3])));
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < d; ++i) {
        const float v = to_f32(x[i]);
        sum += static_cast<double>(v) * v;
    }
    return sum;
}

template <typename T>
void rms_norm(int64_t rows, int64_t d, const T* x, int64_t x_s, const T* w, float eps, T* y, int64_t y_s) {
    for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * x_s;
        T* yr = y + r * y_s;
        const double sum = sum_squares(xr, d);
        const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(d)) + eps);
        for (int64_t i = 0; i < d; ++i) {
            const float normed = round_to(to_f32(xr[i]) * scale, static_cast<T*>(nullptr));
            store(yr + i, to_f32(w[i]) * normed);
        }
    }
}

template <typename T>
void rope(int64_t n, int64_t H, int64_t D, T* t, int64_t t_sn, int64_t t_sh, const T* cos, const T* sin) {
    const int64_t half = D / 2;
    for (int64_t i = 0; i < n; ++i) {
        const T* c = cos + i * D;
        const T* s = sin + i * D;
        for (int64_t h = 0; h < H; ++h) {
            T* row = t + i * t_sn + h * t_sh;
            for (int64_t j = 0; j < half; ++j) {
                const float a = to_f32(row[j]), b = to_f32(row[j + half]);
                const float lo = round_to(a * to_f32(c[j]), static_cast<T*>(nullptr))
                               + round_to(-b * to_f32(s[j]), static_cast<T*>(nullptr));
                const float hi = round_to(b * to_f32(c[j + half]), static_cast<T*>(nullptr))
                               + round_to(a * to_f32(s[j + half]), static_cast<T*>(nullptr));
                store(row + j, lo);
                store(row + j + half, hi);
            }
        }
    }
}

// The k largest of p by value, in torch's CPU topk's order (aten's topk kernel): pairs (value, index) in index
// order, a partial sort when k * 64 <= N, else nth_element at k - 1 and a sort of the k - 1 before it, all with a
// comparator that looks at values only. With libstdc++'s algorithms this reproduces torch's order among equal
// values (equal bf16 logits are common), so the same experts are chosen when a tie straddles the k-th place.
inline void top_k(std::vector<std::pair<float, int64_t>>& q, int64_t k) {
    auto larger = [](const std::pair<float, int64_t>& x, const std::pair<float, int64_t>& y) {
        return x.first > y.first;
    };
    if (k * 64 <= static_cast<int64_t>(q.size())) {
        std::partial_sort(q.begin(), q.begin() + k, q.end(), larger);
    } else {
        std::nth_element(q.begin(), q.begin() + k - 1, q.end(), larger);
        std::sort(q.begin(), q.begin() + k - 1, larger);
    }
}

template <typename L, typename S>
void softmax_topk(int64_t n, int64_t N, const L* logits, int64_t k, bool renorm, S* scores, int64_t* ids) {
    std::vector<float> p(N);
    std::vector<std::pair<float, int64_t>> q(N);
    for (int64_t t = 0; t < n; ++t) {
        const L* row = logits + t * N;
        float top = -INFINITY;
        for (int64_t e = 0; e < N; ++e) top = std::max(top, to_f32(row[e]));
        float sum = 0.0f;
        for (int64_t e = 0; e < N; ++e) sum += (p[e] = std::exp(to_f32(row[e]) - top));
        for (int64_t e = 0; e < N; ++e) q[e] = {p[e] / sum, e};
        top_k(q, k);
        float kept = 0.0f;
        for (int64_t j = 0; j < k; ++j) kept += q[j].first;
        for (int64_t j = 0; j < k; ++j) {
            store(scores + t * k + j, renorm ? q[j].first / kept : q[j].first);
            ids[t * k + j] = q[j].second;
        }
    }
}

}  // namespace

extern "C" {

// The ABI of this file; moespec.kernels.native checks it after loading.
int moespec_token_abi_version() { return 1; }

// dtype: 0 fp32, 1 bf16 (x, w and y alike). Returns 0, or 1 for a bad dtype, 2 for a bad shape.
int moespec_rms_norm(int dtype, int64_t rows, int64_t d, const void* x, int64_t x_s, const void* w, float eps,
                     void* y, int64_t y_s) {
    if (rows < 1 || d < 1 || x_s < d || y_s < d) return 2;
    if (dtype == 0) {
        rms_norm(rows, d, static_cast<const float*>(x), x_s, static_cast<const float*>(w), eps,
                 static_cast<float*>(y), y_s);
    } else if (dtype == 1) {
        rms_norm(rows, d, static_cast<const bf16*>(x), x_s, static_cast<const bf16*>(w), eps,
                 static_cast<bf16*>(y), y_s);
    } else {
        return 1;
    }
    return 0;
}

// dtype as above; D even. Returns 0, 1 for a bad dtype, 2 for a bad shape.
int moespec_rope(int dtype, int64_t n, int64_t H, int64_t D, void* t, int64_t t_sn, int64_t t_sh, const void* cos,
                 const void* sin) {
    if (n < 1 || H < 1 || D < 2 || D % 2 || (H > 1 && t_sh < D) || (n > 1 && t_sn < D)) return 2;
    if (dtype == 0) {
        rope(n, H, D, static_cast<float*>(t), t_sn, t_sh, static_cast<const float*>(cos),
             static_cast<const float*>(sin));
    } else if (dtype == 1) {
        rope(n, H, D, static_cast<bf16*>(t), t_sn, t_sh, static_cast<const bf16*>(cos), static_cast<const bf16*>(sin));
    } else {
        return 1;
    }
    return 0;
}

// ldtype, sdtype: the dtypes of logits and scores (0 fp32, 1 bf16). Returns 0, 1 for a bad dtype, 2 for a bad
// shape (n < 1, N < 1, k outside 1..N).
int moespec_softmax_topk(int ldtype, int64_t n, int64_t N, const void* logits, int64_t k, int renorm, int sdtype,
                         void* scores, int64_t* ids) {
    if (n < 1 || N < 1 || k < 1 || k > N) return 2;
    if (ldtype == 0 && sdtype == 0)
        softmax_topk(n, N, static_cast<const float*>(logits), k, renorm, static_cast<float*>(scores), ids);
    else if (ldtype == 0 && sdtype == 1)
        softmax_topk(n, N, static_cast<const float*>(logits), k, renorm, static_cast<bf16*>(scores), ids);
    else if (ldtype == 1 && sdtype == 0)
        softmax_topk(n, N, static_cast<const bf16*>(logits), k, renorm, static_cast<float*>(scores), ids);
    else if (ldtype == 1 && sdtype == 1)
        softmax_topk(n, N, static_cast<const bf16*>(logits), k, renorm, static_cast<bf16*>(scores), ids);
    else
        return 1;
    return 0;
}

}  // extern "C"
