// PowerSGD's three steps on the CPU backend, one matrix per row: EncodeP (x = g + e; Q
// orthogonalized; P = M Q), ComputeQ (the summed P orthogonalized; Q = M^T P, the step between
// the two allreduces) and Decode (P Q^T, the memory updated), each timed on its own, so that a
// step the profile does not time (ComputeQ, priced as an EncodeP of the same work;
// docs/MODEL.md, "PowerSGD") can be compared with the one it is priced by.
//
// Rows: <rows>x<cols>/rank:<r>/<step>; shapes: the profile's square-ish matrix of 2^21 elements
// (1448 x 1448) and the same elements as a tall (2048 x 1024) and a wide (1024 x 2048) layer, at
// ranks 1, 4 and 16. W = 2 ranks (the decode divides by W). Every buffer is written before
// timing and one untimed step runs first; for a spread, --benchmark_repetitions.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "cupcake/kernels/powersgd.h"

namespace {

namespace ps = cupcake::kernels::powersgd;

struct Step {
  std::unique_ptr<ps::Codec> codec;
  std::vector<float> grad, state, first, second, out;
};

Step Make(int64_t rows, int64_t cols, int rank) {
  ps::Config config;
  config.shapes = {{rows, cols}};
  config.rank = rank;
  config.world_size = 2;
  auto codec = ps::MakeCodec(config, cupcake::kernels::Backend::kCpu);
  if (!codec.ok()) std::abort();
  Step s;
  s.codec = std::move(*codec);
  const ps::Layout& l = s.codec->layout();
  s.grad.resize(static_cast<size_t>(l.n));
  for (size_t i = 0; i < s.grad.size(); ++i) s.grad[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  s.state.resize(static_cast<size_t>(l.state_floats()));
  s.first.resize(static_cast<size_t>(l.first_floats()));
  s.second.resize(static_cast<size_t>(l.second_floats()));
  s.out.resize(static_cast<size_t>(l.n));
  if (!s.codec->InitState(s.state).ok() || !s.codec->EncodeP(s.grad, s.state, s.first).ok() ||
      !s.codec->ComputeQ(s.first, s.state, s.second).ok() ||
      !s.codec->Decode(s.first, s.second, s.state, s.out).ok())
    std::abort();
  return s;
}

void BM_Step(benchmark::State& state, int64_t rows, int64_t cols, int rank, int which) {
  Step s = Make(rows, cols, rank);
  for (auto _ : state) {
    cupcake::Status st = which == 0   ? s.codec->EncodeP(s.grad, s.state, s.first)
                         : which == 1 ? s.codec->ComputeQ(s.first, s.state, s.second)
                                      : s.codec->Decode(s.first, s.second, s.state, s.out);
    if (!st.ok()) state.SkipWithError(st.message().c_str());
    benchmark::ClobberMemory();
  }
}

int Register() {
  const int64_t shapes[][2] = {{1448, 1448}, {2048, 1024}, {1024, 2048}};
  const char* steps[] = {"encode_p", "compute_q", "decode"};
  for (const auto& sh : shapes)
    for (int rank : {1, 4, 16})
      for (int which = 0; which < 3; ++which)
        benchmark::RegisterBenchmark((std::to_string(sh[0]) + "x" + std::to_string(sh[1]) + "/rank:" +
                                      std::to_string(rank) + "/" + steps[which])
                                         .c_str(),
                                     BM_Step, sh[0], sh[1], rank, which)
            ->Unit(benchmark::kMillisecond);
  return 0;
}
const int registered = Register();

}  // namespace

BENCHMARK_MAIN();
