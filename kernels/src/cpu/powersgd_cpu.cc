// PowerSGD on host memory (cupcake/kernels/powersgd.h): the matrix products through CBLAS
// (sgemm, from the system's BLAS), the Gram-Schmidt orthogonalization and the elementwise steps
// as plain loops.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "../backends.h"
#include "cupcake/kernels/powersgd.h"

namespace cupcake::kernels::powersgd {
namespace {

// The hook's Gram-Schmidt on a row-major rows x r matrix: column i normalized (a zero column
// stays zero), then its projection subtracted from the later columns. Dots and norms in double.
void Orthogonalize(float* a, int64_t rows, int64_t r) {
  for (int64_t i = 0; i < r; ++i) {
    double sq = 0;
    for (int64_t k = 0; k < rows; ++k) sq += static_cast<double>(a[k * r + i]) * a[k * r + i];
    const auto norm = static_cast<float>(std::sqrt(sq));
    if (norm > 0) {
      for (int64_t k = 0; k < rows; ++k) a[k * r + i] /= norm;
    }
    for (int64_t j = i + 1; j < r; ++j) {
      double dot = 0;
      for (int64_t k = 0; k < rows; ++k) dot += static_cast<double>(a[k * r + i]) * a[k * r + j];
      const auto d = static_cast<float>(dot);
      for (int64_t k = 0; k < rows; ++k) a[k * r + j] -= d * a[k * r + i];
    }
  }
}

int I(int64_t v) { return static_cast<int>(v); }  // BLAS dimensions; n <= 2^31 - 1 is validated

class CpuCodec final : public Codec {
 public:
  explicit CpuCodec(Layout layout)
      : Codec(std::move(layout), Backend::kCpu),
        square_(static_cast<size_t>(this->layout().batched ? this->layout().matrix_floats : 0)) {}

 private:
  Status InitImpl(const std::vector<float>& q, float* state, void*) override {
    std::fill_n(state, layout().matrix_floats, 0.0f);
    std::copy(q.begin(), q.end(), state + layout().matrix_floats);
    return Status::Ok();
  }

  Status EncodePImpl(const float* grad, float* state, float* first, void*) override {
    const Layout& l = layout();
    float* x = state;
    float* q = state + l.matrix_floats;
    for (int64_t i = 0; i < l.n; ++i) x[i] += grad[i];
    for (const Matrix& m : l.matrices) {
      Orthogonalize(q + m.q_offset, m.cols, m.rank);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, I(m.rows), I(m.rank), I(m.cols), 1.0f, x + m.offset,
                  I(m.cols), q + m.q_offset, I(m.rank), 0.0f, first + m.p_offset, I(m.rank));
    }
    for (const Segment& s : l.uncompressed) std::copy_n(x + s.offset, s.numel, first + l.p_floats + s.packed_offset);
    return Status::Ok();
  }

  // Q = M^T P is computed as its transpose, Q^T = P^T M (rank x cols, row-major), then transposed
  // into `second`: that product walks M's rows in order, one contiguous row per multiply-add
  // pass, where the direct form reads M down its columns, which a BLAS without its own blocking
  // (Debian's reference libblas) pays for on every element (bench/kernels/powersgd_bench).
  Status ComputeQImpl(float* first, const float* state, float* second, void*) override {
    for (const Matrix& m : layout().matrices) {
      Orthogonalize(first + m.p_offset, m.rows, m.rank);
      qt_.resize(static_cast<size_t>(m.rank * m.cols));
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, I(m.rank), I(m.cols), I(m.rows), 1.0f, first + m.p_offset,
                  I(m.rank), state + m.offset, I(m.cols), 0.0f, qt_.data(), I(m.cols));
      float* q = second + m.q_offset;
      for (int64_t j = 0; j < m.rank; ++j)
        for (int64_t i = 0; i < m.cols; ++i) q[i * m.rank + j] = qt_[static_cast<size_t>(j * m.cols + i)];
    }
    return Status::Ok();
  }

  Status DecodeImpl(const float* first, const float* second, float* state, float* out, void*) override {
    const Layout& l = layout();
    float* e = state;
    float* q = state + l.matrix_floats;
    const auto w = static_cast<float>(l.world_size);
    for (int64_t i = 0; i < l.q_floats; ++i) q[i] = second[i] / w;
    // Batched: the padded square goes to the workspace, its first n floats to out.
    float* approx = l.batched ? square_.data() : out;
    for (const Matrix& m : l.matrices) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, I(m.rows), I(m.cols), I(m.rank), 1.0f, first + m.p_offset,
                  I(m.rank), q + m.q_offset, I(m.rank), 0.0f, approx + m.offset, I(m.cols));
    }
    for (const Segment& s : l.uncompressed) {
      const float* sum = first + l.p_floats + s.packed_offset;
      for (int64_t i = 0; i < s.numel; ++i) out[s.offset + i] = sum[i] / w;
    }
    for (int64_t i = 0; i < l.matrix_floats; ++i) e[i] -= approx[i];
    if (l.batched) std::copy_n(approx, l.n, out);
    return Status::Ok();
  }

  std::vector<float> square_;
  std::vector<float> qt_;  // ComputeQ's Q^T, rank x cols of the matrix at hand
};

}  // namespace

std::unique_ptr<Codec> MakeCpuCodec(const Layout& layout) { return std::make_unique<CpuCodec>(layout); }

}  // namespace cupcake::kernels::powersgd
