// PowerSGD restated from its definition (cupcake/kernels/powersgd.h; Vogels et al. 2019 and
// torch's powerSGD_hook), in double, one plain loop per step, sharing no code with kernels/src:
// the independent reference of the typed suite. W ranks step together; the matrices are kept in
// buffer order (the codec's P and Q order is checked elsewhere), each with its own Q.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace cupcake::kernels::reference::powersgd {

struct Matrix {
  int64_t offset, rows, cols, r;
};

struct Group {
  int64_t n = 0;  // the tensors' floats
  int64_t padded = 0;  // n, or side^2 when batched
  std::vector<Matrix> matrices;  // buffer order
  std::vector<std::pair<int64_t, int64_t>> plain;  // (offset, numel) sent as is
};

// The hook's rule: d0 x (d1...dk); r = min(rows, cols, rank); compressed when
// (rows + cols) r rate < rows cols. Batched: one side x side matrix, side^2 >= n > (side-1)^2.
inline Group Plan(const std::vector<std::vector<int64_t>>& shapes, int rank, bool batched, double rate) {
  Group g;
  for (const auto& s : shapes) {
    int64_t numel = 1;
    for (int64_t d : s) numel *= d;
    const int64_t rows = s[0], cols = numel / s[0];
    const int64_t r = std::min<int64_t>(std::min(rows, cols), rank);
    if (!batched && static_cast<double>((rows + cols) * r) * rate < static_cast<double>(rows * cols)) {
      g.matrices.push_back({g.n, rows, cols, r});
    } else if (!batched) {
      g.plain.push_back({g.n, numel});
    }
    g.n += numel;
  }
  g.padded = g.n;
  if (batched) {
    int64_t side = 1;
    while (side * side < g.n) ++side;
    g.padded = side * side;
    g.matrices.push_back({0, side, side, std::min<int64_t>(side, rank)});
  }
  return g;
}

// One rank's memory: e over the padded group, and per matrix Q (cols x r, row-major).
struct Rank {
  std::vector<double> e;
  std::vector<std::vector<double>> q;
};

// Gram-Schmidt on the columns of a row-major len x r matrix: each column in turn divided by its
// length (a zero column left alone), then removed from the later ones.
inline void Orthonormalize(std::vector<double>& a, int64_t len, int64_t r) {
  for (int64_t i = 0; i < r; ++i) {
    double len2 = 0;
    for (int64_t k = 0; k < len; ++k) len2 += a[k * r + i] * a[k * r + i];
    if (len2 > 0) {
      for (int64_t k = 0; k < len; ++k) a[k * r + i] /= std::sqrt(len2);
    }
    for (int64_t j = i + 1; j < r; ++j) {
      double dot = 0;
      for (int64_t k = 0; k < len; ++k) dot += a[k * r + i] * a[k * r + j];
      for (int64_t k = 0; k < len; ++k) a[k * r + j] -= dot * a[k * r + i];
    }
  }
}

// One step of every rank; returns the average approximation (the same on every rank) over the
// group's n floats and updates each rank's e and Q.
inline std::vector<double> Step(const Group& g, std::vector<Rank>& ranks, const std::vector<std::vector<float>>& grads) {
  const auto w = static_cast<double>(ranks.size());
  std::vector<std::vector<double>> x(ranks.size());
  for (size_t k = 0; k < ranks.size(); ++k) {
    x[k] = ranks[k].e;
    for (int64_t i = 0; i < g.n; ++i) x[k][i] += grads[k][i];
  }
  std::vector<double> approx(g.padded, 0.0);
  for (size_t mi = 0; mi < g.matrices.size(); ++mi) {
    const Matrix& m = g.matrices[mi];
    // P = sum_k M_k Q_k, orthonormalized; Q = sum_k M_k^T P / W; approx = P Q^T.
    std::vector<double> p(m.rows * m.r, 0.0), q(m.cols * m.r, 0.0);
    for (size_t k = 0; k < ranks.size(); ++k) {
      std::vector<double> qk = ranks[k].q[mi];
      Orthonormalize(qk, m.cols, m.r);
      for (int64_t a = 0; a < m.rows; ++a)
        for (int64_t c = 0; c < m.r; ++c)
          for (int64_t b = 0; b < m.cols; ++b) p[a * m.r + c] += x[k][m.offset + a * m.cols + b] * qk[b * m.r + c];
    }
    Orthonormalize(p, m.rows, m.r);
    for (size_t k = 0; k < ranks.size(); ++k)
      for (int64_t b = 0; b < m.cols; ++b)
        for (int64_t c = 0; c < m.r; ++c)
          for (int64_t a = 0; a < m.rows; ++a) q[b * m.r + c] += x[k][m.offset + a * m.cols + b] * p[a * m.r + c] / w;
    for (int64_t a = 0; a < m.rows; ++a)
      for (int64_t b = 0; b < m.cols; ++b)
        for (int64_t c = 0; c < m.r; ++c) approx[m.offset + a * m.cols + b] += p[a * m.r + c] * q[b * m.r + c];
    for (Rank& rank : ranks) rank.q[mi] = q;
  }
  for (const auto& [offset, numel] : g.plain)
    for (int64_t i = offset; i < offset + numel; ++i) {
      for (size_t k = 0; k < ranks.size(); ++k) approx[i] += x[k][i] / w;
    }
  for (size_t k = 0; k < ranks.size(); ++k)
    for (int64_t i = 0; i < g.padded; ++i) ranks[k].e[i] = x[k][i] - approx[i];
  approx.resize(g.n);
  return approx;
}

}  // namespace cupcake::kernels::reference::powersgd
