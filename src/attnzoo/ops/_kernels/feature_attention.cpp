// Fused CPU kernel of feature-map attention, out_i = sum_j (phi(q_i) . phi(k_j)) v_j / (sum_j phi(q_i) . phi(k_j)
// + eps): linear attention (Katharopoulos et al. 2020, eqs 5-6; causal eqs 8-10) with phi = elu + 1 or relu, and
// Fastmax (FAST eqs 24-27) with phi = [1, x] (p = 1) or [1, x, x x^T / sqrt 2] (p = 2, its symmetric half: see
// kFastmax2); unmasked or over padded
// batches / packed rows, forward and backward, float32 and float64.
//
// Why: the PyTorch paths make a pass per step (phi of q and k, the moment sums, the products with the queries,
// the denominator, the division), and over padded batches or packed rows they ran each sequence's slice from a
// Python loop. Here a task is one (row, sequence, head): it reads its tokens of q, k, v once per pass and keeps
// the moments S = sum_j phi(k_j) v_j^T (F x R, stored transposed) and z = sum_j phi(k_j) in a small buffer, so
// padding is never read and sequences are never copied, padded or sliced; all tasks run in one at::parallel_for.
//
// Sequences: ids (B, N) int64, each token's sequence within its row (-1 at padding); the ids never decrease over
// a row's real tokens, so sequence s of row b lies in [first, last] with only padding between its tokens. Without
// ids each row is one sequence of N tokens.
//
// Forward (den_i = phi(q_i) . z_i + eps, the divisor; 1 at padding):
//   out_i = phi(q_i)^T S_i / den_i, with S_i, z_i over the query's sequence (causal: its tokens j <= i).
// Backward, with g_i = dout_i / den_i and gd_i = -g_i . out_i:
//   dphi(q_i) = S_i g_i + z_i gd_i                               (S_i, z_i as in the forward)
//   dphi(k_j) = T_j v_j + t_j,  dv_j = T_j^T phi(k_j)             (T_j = sum_i phi(q_i) g_i^T, t_j = sum_i phi(q_i) gd_i
//                                                                 over the sequence; causal: its tokens i >= j)
// then dq, dk by the vector-Jacobian product of phi. Sums are kept in the input's dtype (float32 or float64);
// padding gets zero output and zero gradients.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

using at::Tensor;

namespace {

constexpr int kG = 4;  // tokens per group: each pass over a moment matrix serves four tokens

struct Strides {
  int64_t b, h, n;
  explicit Strides(const Tensor& t) : b(t.stride(0)), h(t.stride(1)), n(t.stride(2)) {}
};

// one sequence of one row: its real tokens lie in [first, last]
struct Task {
  int64_t b, seq, first, last;
};

std::vector<Task> tasks_of(const int64_t* ids, int64_t B, int64_t N) {
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    if (!ids) {
      tasks.push_back({b, 0, 0, N - 1});
      continue;
    }
    const int64_t* row = ids + b * N;
    for (int64_t n = 0; n < N; ++n) {
      if (row[n] < 0) continue;
      if (tasks.empty() || tasks.back().b != b || tasks.back().seq != row[n]) tasks.push_back({b, row[n], n, n});
      tasks.back().last = n;
    }
  }
  return tasks;
}

// The integer type of T's bits, the bits of 1.5 * 2^M (the rounding constant of exp_clamped) and M, T's mantissa bits.
template <typename T>
struct ExpBits;
template <>
struct ExpBits<float> {
  using I = int32_t;
  static constexpr I kRound = 0x4B400000;
  static constexpr int kMantissa = 23;
};
template <>
struct ExpBits<double> {
  using I = int64_t;
  static constexpr I kRound = 0x4338000000000000;
  static constexpr int kMantissa = 52;
};

// p * 2^n for the integer n that big = n + 1.5 * 2^M holds in its low bits: n is added to p's exponent field.
template <typename T>
inline T times_two_to_n(T p, T big) {
  using I = typename ExpBits<T>::I;
  I bits, nb;
  std::memcpy(&bits, &p, sizeof bits);
  std::memcpy(&nb, &big, sizeof nb);
  bits += (nb - ExpBits<T>::kRound) * (I(1) << ExpBits<T>::kMantissa);
  std::memcpy(&p, &bits, sizeof p);
  return p;
}

// exp(x) for x in [lo, 0] (the callers clamp) without calls, branches or selects, so that the loops around it
// vectorise on AVX2 as on AVX-512 (std::exp does not): 2^n times a polynomial on |r| <= ln2 / 2 (Taylor to r^7 /
// r^13: within 2 ulp of std::exp). n is rounded by adding 1.5 * 2^23 (2^52), which also leaves it in the low bits
// of the sum, from which the exponent is built by integer arithmetic (no float -> int conversion, which AVX2 lacks
// for doubles). lo keeps 2^n normal: there exp(x) < 1.2e-38 / 3.3e-308 is returned as exp(lo).
inline float exp_clamped(float x) {
  const float big = x * 1.44269504088896341f + 12582912.0f;
  const float n = big - 12582912.0f;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // ln 2 in two parts: r is exact to float
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return times_two_to_n(p * r * r + r + 1.0f, big);
}

inline double exp_clamped(double x) {
  const double big = x * 1.44269504088896340736 + 6755399441055744.0;
  const double n = big - 6755399441055744.0;
  const double r = (x - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
  double p = 1.0 / 6227020800.0;
  for (double c : {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0,
                   1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5})
    p = p * r + c;
  return times_two_to_n(p * r * r + r + 1.0, big);
}

template <typename T>
constexpr T kExpLo = sizeof(T) == 4 ? T(-87) : T(-708);

// e[p] = exp(min(x[p], 0)) (x clamped below at kExpLo): exp(x) for x <= 0 and exactly 1 for x >= 0, so that it is
// both elu + 1's exponential part and its derivative. Two loops: GCC if-converts neither loop when the select and
// the exponential share one (measured on AVX2)
template <typename T>
inline void exp_nonpos(T* __restrict e, const T* __restrict x, int64_t D) {
  for (int64_t p = 0; p < D; ++p) e[p] = std::min(std::max(x[p], kExpLo<T>), T(0));
  for (int64_t p = 0; p < D; ++p) e[p] = exp_clamped(e[p]);
}

// The feature maps: phi(x) of a token's D inputs has F values, phi(q) . phi(k) is the attention weight
enum Map : int64_t {
  kElu = 0,       // elu(x) + 1 = max(x, 0) + exp(min(x, 0)), F = D (Katharopoulos et al.)
  kRelu = 1,      // max(x, 0), F = D
  kFastmax1 = 2,  // [1, x], F = 1 + D: phi(q) . phi(k) = 1 + q . k (FAST eq 24, p = 1)
  kFastmax2 = 3,  // 1 + s + s^2 / 2 (FAST eqs 25-27, p = 2) from the symmetric half of x x^T / sqrt 2:
                  // [1, x, (x_a^2 / sqrt 2)_a, (x_a x_b)_{a < b}], F = 1 + D + D (D + 1) / 2, since
                  // (q . k)^2 / 2 = sum_a (q_a^2 k_a^2) / 2 + sum_{a < b} (q_a q_b)(k_a k_b); the full
                  // D^2 block repeats every product with a < b, nearly doubling F and the work along it
};

constexpr double kSqrtHalf = 0.70710678118654752440;

// long feature rows are padded with zeros to whole 64-byte vectors: no scalar tail in the loops along them
int64_t padded(int64_t F, int64_t lanes) { return F >= 4 * lanes ? (F + lanes - 1) / lanes * lanes : F; }

int64_t feature_dim(int64_t mode, int64_t D) {
  return mode == kFastmax1 ? 1 + D : mode == kFastmax2 ? 1 + D + D * (D + 1) / 2 : D;
}

// f (F) = phi(x (D))
template <typename T>
inline void features(T* __restrict f, const T* __restrict x, int64_t D, int64_t mode) {
  switch (mode) {
    case kElu:  // max(x, 0) = (x + |x|) / 2, exactly, and without a select
      exp_nonpos(f, x, D);
      for (int64_t p = 0; p < D; ++p) f[p] += (x[p] + std::abs(x[p])) * T(0.5);
      return;
    case kRelu:
      for (int64_t p = 0; p < D; ++p) f[p] = x[p] > T(0) ? x[p] : T(0);
      return;
    default:
      f[0] = T(1);
      for (int64_t p = 0; p < D; ++p) f[1 + p] = x[p];
      if (mode == kFastmax2) {  // row a of the half: x_a^2 / sqrt 2, then x_a x_b for b > a
        T* row = f + 1 + D;
        for (int64_t a = 0; a < D; ++a) {
          const T xa = x[a];
          row[0] = xa * xa * T(kSqrtHalf);
          for (int64_t b = a + 1; b < D; ++b) row[b - a] = xa * x[b];
          row += D - a;
        }
      }
  }
}

// d (D) = the vector-Jacobian product of phi at x with a (F)
template <typename T>
inline void chain(T* __restrict d, const T* __restrict a, const T* __restrict x, int64_t D, int64_t mode) {
  switch (mode) {
    case kElu:  // phi'(x) = exp(min(x, 0))
      exp_nonpos(d, x, D);
      for (int64_t p = 0; p < D; ++p) d[p] *= a[p];
      return;
    case kRelu:
      for (int64_t p = 0; p < D; ++p) d[p] = x[p] > T(0) ? a[p] : T(0);
      return;
    default:
      for (int64_t p = 0; p < D; ++p) d[p] = a[1 + p];
      if (mode == kFastmax2) {  // d/dx_a: sqrt 2 x_a u_aa + sum_{b != a} u_{min(a,b) max(a,b)} x_b
        const T* u = a + 1 + D;
        for (int64_t p = 0; p < D; ++p) {
          const T xp = x[p];
          T s = T(2 * kSqrtHalf) * xp * u[0];
          for (int64_t b = p + 1; b < D; ++b) {
            s += u[b - p] * x[b];
            d[b] += u[b - p] * xp;
          }
          d[p] += s;
          u += D - p;
        }
      }
  }
}

// y[0:R] += sum_j a[j] x[j][0:R] over kG rows (a zero coefficient for a row that is not there)
template <typename T>
inline void acc4(T* __restrict y, const T* a, const T* const* x, int64_t R) {
  const T a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
  const T *__restrict x0 = x[0], *__restrict x1 = x[1], *__restrict x2 = x[2], *__restrict x3 = x[3];
#pragma omp simd
  for (int64_t r = 0; r < R; ++r) y[r] += a0 * x0[r] + a1 * x1[r] + a2 * x2[r] + a3 * x3[r];
}

template <typename T>
inline T dot(const T* __restrict a, const T* __restrict x, int64_t n) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * x[i];
  return s;
}

// The moments are kept transposed, St (R x F) = sum_j v_j phi(k_j)^T, so that every loop runs along the feature
// axis, the long one for Fastmax's p = 2 features (F = 1 + D + D (D + 1) / 2 against R = D): each pass over a row
// of St serves the four tokens of a group.

// y[a][0:F] += sum_b c[a][b] x[b][0:F] for a, b < 4: a 4 x 4 register block, 16 multiply-adds per 8 loads and
// 4 stores (the y rows are distinct)
template <typename T>
inline void block44(T* const* y, const T (&c)[kG][kG], const T* const* x, int64_t F) {
  T *__restrict y0 = y[0], *__restrict y1 = y[1], *__restrict y2 = y[2], *__restrict y3 = y[3];
  const T *__restrict x0 = x[0], *__restrict x1 = x[1], *__restrict x2 = x[2], *__restrict x3 = x[3];
  const T c00 = c[0][0], c01 = c[0][1], c02 = c[0][2], c03 = c[0][3], c10 = c[1][0], c11 = c[1][1], c12 = c[1][2],
          c13 = c[1][3], c20 = c[2][0], c21 = c[2][1], c22 = c[2][2], c23 = c[2][3], c30 = c[3][0], c31 = c[3][1],
          c32 = c[3][2], c33 = c[3][3];
#pragma omp simd
  for (int64_t f = 0; f < F; ++f) {
    const T a0 = x0[f], a1 = x1[f], a2 = x2[f], a3 = x3[f];
    y0[f] += c00 * a0 + c01 * a1 + c02 * a2 + c03 * a3;
    y1[f] += c10 * a0 + c11 * a1 + c12 * a2 + c13 * a3;
    y2[f] += c20 * a0 + c21 * a1 + c22 * a2 + c23 * a3;
    y3[f] += c30 * a0 + c31 * a1 + c32 * a2 + c33 * a3;
  }
}

// St (R x F) += sum_j x[j] f[j]^T and z (F) += sum_j w[j] f[j] over a group's rows (f rows past the group are
// zero), four rows of St at a time; junk (F) stands in for the rows past R
template <typename T>
inline void update(T* St, T* z, const T* const* f, const T* const* x, const T* w, int64_t F, int64_t R, T* junk) {
  for (int64_t r = 0; r < R; r += kG) {
    T c[kG][kG];
    T* rows[kG];
    for (int a = 0; a < kG; ++a) {
      rows[a] = r + a < R ? St + (r + a) * F : junk;
      for (int b = 0; b < kG; ++b) c[a][b] = r + a < R ? x[b][r + a] : T(0);
    }
    block44(rows, c, f, F);
  }
  acc4(z, w, f, F);
}

// y[j] (F) += sum_r c[j][r] St[r] for the kG rows y[j], coefficient rows c[j] (R), four rows of St at a time
template <typename T>
inline void combine(T* const* y, const T* const* c, const T* St, int64_t F, int64_t R) {
  for (int64_t r = 0; r < R; r += kG) {
    T a[kG][kG];
    const T* rows[kG];
    for (int b = 0; b < kG; ++b) {
      rows[b] = St + (r + b < R ? r + b : r) * F;
      for (int j = 0; j < kG; ++j) a[j][b] = r + b < R ? c[j][r + b] : T(0);
    }
    block44(y, a, rows, F);
  }
}

// s[i][j] = u[i][0:F] . x[j][0:F] for two rows u and the kG rows x: 8 multiply-adds per 6 loads
template <typename T>
inline void dot24(T (&s)[2][kG], const T* __restrict u0, const T* __restrict u1, const T* const* x, int64_t F) {
  T s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
  const T *__restrict x0 = x[0], *__restrict x1 = x[1], *__restrict x2 = x[2], *__restrict x3 = x[3];
#pragma omp simd reduction(+ : s00, s01, s02, s03, s10, s11, s12, s13)
  for (int64_t f = 0; f < F; ++f) {
    const T a = u0[f], b = u1[f], w0 = x0[f], w1 = x1[f], w2 = x2[f], w3 = x3[f];
    s00 += a * w0, s01 += a * w1, s02 += a * w2, s03 += a * w3;
    s10 += b * w0, s11 += b * w1, s12 += b * w2, s13 += b * w3;
  }
  s[0][0] = s00, s[0][1] = s01, s[0][2] = s02, s[0][3] = s03;
  s[1][0] = s10, s[1][1] = s11, s[1][2] = s12, s[1][3] = s13;
}

// s[i][j] = u[i][0:F] . x[j][0:F] for four rows u and the kG rows x: 16 multiply-adds per 8 loads, 16 accumulators
// (for the 32 vector registers of AVX-512)
template <typename T>
inline void dot44(T (&s)[kG][kG], const T* const* u, const T* const* x, int64_t F) {
  T s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
  T s20 = 0, s21 = 0, s22 = 0, s23 = 0, s30 = 0, s31 = 0, s32 = 0, s33 = 0;
  const T *__restrict u0 = u[0], *__restrict u1 = u[1], *__restrict u2 = u[2], *__restrict u3 = u[3];
  const T *__restrict x0 = x[0], *__restrict x1 = x[1], *__restrict x2 = x[2], *__restrict x3 = x[3];
#pragma omp simd reduction(+ : s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33)
  for (int64_t f = 0; f < F; ++f) {
    const T w0 = x0[f], w1 = x1[f], w2 = x2[f], w3 = x3[f];
    const T a = u0[f], b = u1[f], c = u2[f], d = u3[f];
    s00 += a * w0, s01 += a * w1, s02 += a * w2, s03 += a * w3;
    s10 += b * w0, s11 += b * w1, s12 += b * w2, s13 += b * w3;
    s20 += c * w0, s21 += c * w1, s22 += c * w2, s23 += c * w3;
    s30 += d * w0, s31 += d * w1, s32 += d * w2, s33 += d * w3;
  }
  const T all[kG][kG] = {{s00, s01, s02, s03}, {s10, s11, s12, s13}, {s20, s21, s22, s23}, {s30, s31, s32, s33}};
  for (int i = 0; i < kG; ++i)
    for (int j = 0; j < kG; ++j) s[i][j] = all[i][j];
}

#if defined(__AVX512F__)
constexpr int kReadRows = 4;  // rows of St per pass in read4
#else
constexpr int kReadRows = 2;
#endif

// y[j][r] = St[r] . f[j] for the kG rows of a group (y rows of R, their own stride), kReadRows rows of St at a time
template <typename T>
inline void read4(T* y, int64_t ystride, const T* St, const T* const* f, int64_t F, int64_t R) {
  for (int64_t r = 0; r < R; r += kReadRows) {
    const T* u[kG];
    for (int i = 0; i < kG; ++i) u[i] = St + (r + i < R ? r + i : r) * F;
    if (kReadRows == 4) {
      T s[kG][kG];
      dot44(s, u, f, F);
      for (int i = 0; i < kG && r + i < R; ++i)
        for (int j = 0; j < kG; ++j) y[j * ystride + r + i] = s[i][j];
    } else {
      T s[2][kG];
      dot24(s, u[0], u[1], f, F);
      for (int i = 0; i < 2 && r + i < R; ++i)
        for (int j = 0; j < kG; ++j) y[j * ystride + r + i] = s[i][j];
    }
  }
}

template <typename T>
struct Args {
  const T *q, *k, *v;
  Strides sq, sk, sv;
  int64_t H, N, D, R;  // D: the width of q and k
  const int64_t* ids;
  int64_t mode;  // Map
  int64_t P;     // the feature width F = feature_dim(mode, D): the rows of the moments
};

// up to kG real tokens of one task in increasing order, with their rows
template <typename T>
struct Group {
  int n = 0;
  int64_t tok[kG];
  const T *q[kG], *k[kG], *v[kG];
};

// walks the real tokens of a task in groups of kG, forwards or backwards (each group still in increasing order)
template <typename T>
struct Walk {
  const Args<T>& a;
  const Task& t;
  int64_t h, cur;
  bool back;
  Walk(const Args<T>& a_, const Task& t_, int64_t h_, bool back_)
      : a(a_), t(t_), h(h_), cur(back_ ? t_.last : t_.first), back(back_) {}

  bool next(Group<T>& g) {
    int64_t toks[kG];
    g.n = 0;
    while (g.n < kG && (back ? cur >= t.first : cur <= t.last)) {
      const int64_t n = cur;
      cur += back ? -1 : 1;
      if (!a.ids || a.ids[t.b * a.N + n] == t.seq) toks[g.n++] = n;
    }
    for (int j = 0; j < g.n; ++j) {
      const int64_t n = back ? toks[g.n - 1 - j] : toks[j];
      g.tok[j] = n;
      g.q[j] = a.q + t.b * a.sq.b + h * a.sq.h + n * a.sq.n;
      g.k[j] = a.k + t.b * a.sk.b + h * a.sk.h + n * a.sk.n;
      g.v[j] = a.v + t.b * a.sv.b + h * a.sv.h + n * a.sv.n;
    }
    for (int j = g.n; j < kG; ++j) g.tok[j] = g.tok[0], g.q[j] = g.q[0], g.k[j] = g.k[0], g.v[j] = g.v[0];
    return g.n > 0;
  }
};

// phi of kG rows into f (kG x P); rows past the group are zero
template <typename T>
inline void group_features(T* f, const T* const* x, int n, const Args<T>& a) {
  const int64_t P = a.P;
  for (int j = 0; j < kG; ++j) {
    if (j < n) features(f + j * P, x[j], a.D, a.mode);
    else std::fill(f + j * P, f + (j + 1) * P, T(0));
  }
}

// rows of a kG x F buffer
template <typename T>
struct Rows {
  const T* r[kG];
  Rows(const T* base, int64_t F) {
    for (int j = 0; j < kG; ++j) r[j] = base + j * F;
  }
};

template <typename T>
void forward_task(const Args<T>& a, const Task& t, int64_t h, bool causal, T eps, T* out, T* den) {
  const int64_t F = a.P, R = a.R, base = (t.b * a.H + h) * a.N;
  std::vector<T> buf(R * F + 2 * F + 2 * kG * F + kG * R, T(0));
  T *St = buf.data(), *z = St + R * F, *fk = z + F, *fq = fk + kG * F, *y = fq + kG * F, *junk = y + kG * R;
  const Rows<T> krows(fk, F), qrows(fq, F);
  const T ones[kG] = {1, 1, 1, 1};
  Group<T> g;
  if (!causal) {
    for (Walk<T> w(a, t, h, false); w.next(g);) {
      group_features(fk, g.k, g.n, a);
      update(St, z, krows.r, g.v, ones, F, R, junk);
    }
  }
  for (Walk<T> w(a, t, h, false); w.next(g);) {
    group_features(fq, g.q, g.n, a);
    read4(y, R, St, qrows.r, F, R);  // the moments of earlier groups (causal) or of the whole sequence
    if (causal) group_features(fk, g.k, g.n, a);
    for (int j = 0; j < g.n; ++j) {
      T* yj = y + j * R;
      T d = dot(fq + j * F, z, F) + eps;
      if (causal) {  // this group's keys m <= j
        T c[kG] = {0, 0, 0, 0};
        for (int m = 0; m <= j; ++m) c[m] = dot(fq + j * F, fk + m * F, F), d += c[m];
        acc4(yj, c, g.v, R);
      }
      T* o = out + (base + g.tok[j]) * R;
      const T inv = T(1) / d;
      for (int64_t r = 0; r < R; ++r) o[r] = yj[r] * inv;
      den[base + g.tok[j]] = d;
    }
    if (causal) update(St, z, krows.r, g.v, ones, F, R, junk);
  }
}

template <typename T>
struct Grads {
  const T *out, *den, *dout;
  T *dq, *dk, *dv;
};

// g_j = dout_j / den_j (rows of gr, kG x R; rows past the group zero) and gd_j = -g_j . out_j
template <typename T>
inline void group_grads(T* gr, T* gd, const T** grow, const Group<T>& g, const Grads<T>& o, int64_t base, int64_t R) {
  for (int j = 0; j < kG; ++j) {
    T* gj = gr + j * R;
    grow[j] = gj;
    if (j >= g.n) {
      std::fill(gj, gj + R, T(0));
      gd[j] = 0;
      continue;
    }
    const int64_t n = base + g.tok[j];
    const T inv = T(1) / o.den[n];
    const T* d = o.dout + n * R;
    for (int64_t r = 0; r < R; ++r) gj[r] = d[r] * inv;
    gd[j] = -dot(gj, o.out + n * R, R);
  }
}

template <typename T>
void backward_task(const Args<T>& a, const Task& t, int64_t h, bool causal, const Grads<T>& o) {
  const int64_t F = a.P, R = a.R, base = (t.b * a.H + h) * a.N;
  std::vector<T> buf(2 * R * F + 3 * F + 3 * kG * F + 2 * kG * R, T(0));
  T *St = buf.data(), *Tt = St + R * F, *z = Tt + R * F, *tz = z + F, *fk = tz + F, *fq = fk + kG * F,
    *acc = fq + kG * F, *gr = acc + kG * F, *dvs = gr + kG * R, *junk = dvs + kG * R;
  T* arows[kG];
  for (int j = 0; j < kG; ++j) arows[j] = acc + j * F;
  const Rows<T> krows(fk, F), qrows(fq, F);
  const T ones[kG] = {1, 1, 1, 1};
  T gd[kG];
  const T* grow[kG];
  Group<T> g;
  // dq_j = phi'(q_j) (S g_j + z gd_j) with the key moments S, z of the sequence (causal: keys m <= j)
  auto write_dq = [&](bool intra) {
    for (int j = 0; j < kG; ++j)
      for (int64_t f = 0; f < F; ++f) acc[j * F + f] = z[f] * gd[j];
    combine(arows, grow, St, F, R);
    for (int j = 0; j < g.n; ++j) {
      T* aj = acc + j * F;
      if (intra) {  // keys m <= j of this group: (v_m . g_j + gd_j) phi(k_m)
        T c[kG] = {0, 0, 0, 0};
        for (int m = 0; m <= j; ++m) c[m] = dot(g.v[m], grow[j], R) + gd[j];
        acc4(aj, c, krows.r, F);
      }
      chain(o.dq + (base + g.tok[j]) * a.D, aj, g.q[j], a.D, a.mode);
    }
  };
  // dk_j = phi'(k_j) (T v_j + t), dv_j = T^T phi(k_j) with the query moments T = sum_i phi(q_i) g_i^T,
  // t = sum_i phi(q_i) gd_i (causal: queries i >= j)
  auto write_dkv = [&](bool intra) {
    read4(dvs, R, Tt, krows.r, F, R);
    for (int j = 0; j < kG; ++j) std::copy(tz, tz + F, acc + j * F);
    combine(arows, g.v, Tt, F, R);
    for (int j = 0; j < g.n; ++j) {
      T* aj = acc + j * F;
      T* dvj = o.dv + (base + g.tok[j]) * R;
      std::copy(dvs + j * R, dvs + (j + 1) * R, dvj);
      if (intra) {  // queries i >= j of this group
        T c[kG] = {0, 0, 0, 0}, e[kG] = {0, 0, 0, 0};
        for (int i = j; i < g.n; ++i) c[i] = dot(grow[i], g.v[j], R) + gd[i], e[i] = dot(fq + i * F, fk + j * F, F);
        acc4(aj, c, qrows.r, F);
        acc4(dvj, e, grow, R);
      }
      chain(o.dk + (base + g.tok[j]) * a.D, aj, g.k[j], a.D, a.mode);
    }
  };
  auto load = [&]() {
    group_features(fk, g.k, g.n, a);
    group_features(fq, g.q, g.n, a);
    group_grads(gr, gd, grow, g, o, base, R);
  };
  if (!causal) {
    for (Walk<T> w(a, t, h, false); w.next(g);) {
      load();
      update(St, z, krows.r, g.v, ones, F, R, junk);
      update(Tt, tz, qrows.r, grow, gd, F, R, junk);
    }
    for (Walk<T> w(a, t, h, false); w.next(g);) {
      load();
      write_dq(false);
      write_dkv(false);
    }
    return;
  }
  for (Walk<T> w(a, t, h, false); w.next(g);) {  // prefix sums: dq
    load();
    write_dq(true);
    update(St, z, krows.r, g.v, ones, F, R, junk);
  }
  for (Walk<T> w(a, t, h, true); w.next(g);) {  // suffix sums: dk, dv
    load();
    write_dkv(true);
    update(Tt, tz, qrows.r, grow, gd, F, R, junk);
  }
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.dim() == 4 && v.sizes().slice(0, 3) == q.sizes().slice(0, 3),
              "q, k must be (B, H, N, P) and v (B, H, N, R)");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "q, k, v must share one dtype");
  for (const Tensor* t : {&q, &k, &v})
    TORCH_CHECK(t->size(3) == 1 || t->stride(3) == 1, "q, k, v must have unit stride over their last dim");
}

const int64_t* ids_ptr(const std::optional<Tensor>& ids, const Tensor& q) {
  if (!ids) return nullptr;
  TORCH_CHECK(ids->scalar_type() == at::kLong && ids->dim() == 2 && ids->size(0) == q.size(0) &&
                  ids->size(1) == q.size(2) && ids->is_contiguous(),
              "ids must be a contiguous (B, N) int64 tensor");
  return ids->data_ptr<int64_t>();
}

template <typename T>
Args<T> args_of(const Tensor& q, const Tensor& k, const Tensor& v, const int64_t* ids, int64_t mode) {
  TORCH_CHECK(mode >= kElu && mode <= kFastmax2, "unknown feature map ", mode);
  return Args<T>{q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), Strides(q), Strides(k), Strides(v),
                 q.size(1),       q.size(2),       q.size(3),       v.size(3),  ids,        mode,
                 padded(feature_dim(mode, q.size(3)), 64 / static_cast<int64_t>(sizeof(T)))};
}

// (out (B, H, N, R), den (B, H, N)): den is the divisor phi(q_i) . z_i + eps (1 at padding), kept for the backward
std::vector<Tensor> linear_forward(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& ids,
                                   bool causal, int64_t mode, double eps) {
  check_inputs(q, k, v);
  const int64_t* idp = ids_ptr(ids, q);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2);
  Tensor out = idp ? at::zeros(v.sizes(), v.options()) : at::empty(v.sizes(), v.options());
  Tensor den = idp ? at::ones({B, H, N}, q.options()) : at::empty({B, H, N}, q.options());
  const std::vector<Task> tasks = tasks_of(idp, B, N);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "linear_forward", [&] {
    const Args<scalar_t> a = args_of<scalar_t>(q, k, v, idp, mode);
    scalar_t* o = out.data_ptr<scalar_t>();
    scalar_t* d = den.data_ptr<scalar_t>();
    at::parallel_for(0, static_cast<int64_t>(tasks.size()) * H, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t w = lo; w < hi; ++w) forward_task(a, tasks[w / H], w % H, causal, scalar_t(eps), o, d);
    });
  });
  return {out, den};
}

// (dq, dk (B, H, N, P), dv (B, H, N, R)), zero at padding
std::vector<Tensor> linear_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                    const Tensor& den, const Tensor& dout, const std::optional<Tensor>& ids, bool causal,
                                    int64_t mode) {
  check_inputs(q, k, v);
  const int64_t* idp = ids_ptr(ids, q);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), P = q.size(3), R = v.size(3);
  for (const Tensor* t : {&out, &den, &dout})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == q.scalar_type(), "out, den, dout: contiguous, q's dtype");
  TORCH_CHECK(out.sizes() == v.sizes() && dout.sizes() == v.sizes() && den.numel() == B * H * N,
              "out, dout must be (B, H, N, R) and den (B, H, N)");
  auto make = [&](at::IntArrayRef shape) {
    return idp ? at::zeros(shape, q.options()) : at::empty(shape, q.options());
  };
  Tensor dq = make({B, H, N, P}), dk = make({B, H, N, P}), dv = make({B, H, N, R});
  const std::vector<Task> tasks = tasks_of(idp, B, N);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "linear_backward", [&] {
    const Args<scalar_t> a = args_of<scalar_t>(q, k, v, idp, mode);
    const Grads<scalar_t> o{out.data_ptr<scalar_t>(), den.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(),
                            dq.data_ptr<scalar_t>(),  dk.data_ptr<scalar_t>(),  dv.data_ptr<scalar_t>()};
    at::parallel_for(0, static_cast<int64_t>(tasks.size()) * H, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t w = lo; w < hi; ++w) backward_task(a, tasks[w / H], w % H, causal, o);
    });
  });
  return {dq, dk, dv};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnzoo_cpu, m) {
  m.def("linear_forward(Tensor q, Tensor k, Tensor v, Tensor? ids, bool causal, int mode, float eps) -> Tensor[]");
  m.def(
      "linear_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor den, Tensor dout, Tensor? ids, bool causal, "
      "int mode) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(attnzoo_cpu, CPU, m) {
  m.impl("linear_forward", &linear_forward);
  m.impl("linear_backward", &linear_backward);
}
