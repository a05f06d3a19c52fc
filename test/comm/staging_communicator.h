// A test communicator on device memory over a host one, so that several ranks (threads) can
// share one GPU, which NCCL refuses: each collective waits for this rank's stream, copies its
// input to the host, runs the host collective and copies the result back. Synchronous, so
// results are in place when a call returns. Split splits the host communicator and stages the
// part on a stream of its own, as NCCL's Split does.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cupcake/comm/communicator.h"

namespace cupcake::comm::testing {

class StagingCommunicator final : public Communicator {
 public:
  explicit StagingCommunicator(std::unique_ptr<Communicator> host) : host_(std::move(host)) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  ~StagingCommunicator() override { cudaStreamDestroy(stream_); }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& host() const override { return host_->host(); }
  std::string library() const override { return "staging over " + host_->library(); }
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  void* stream() const override { return stream_; }
  Status Barrier() override { return host_->Barrier(); }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    std::vector<std::byte> data = Down(buf, bytes);
    CUPCAKE_RETURN_IF_ERROR(host_->Broadcast(data.data(), bytes, root));
    return Up(buf, data);
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) override {
    std::vector<std::byte> data = Down(send, count * DataTypeBytes(type));
    CUPCAKE_RETURN_IF_ERROR(host_->Allreduce(data.data(), data.data(), count, type, op));
    return Up(recv, data);
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) override {
    std::vector<std::byte> in = Down(send, count_per_rank * DataTypeBytes(type) * size());
    std::vector<std::byte> out(static_cast<size_t>(count_per_rank * DataTypeBytes(type)));
    CUPCAKE_RETURN_IF_ERROR(host_->ReduceScatter(in.data(), out.data(), count_per_rank, type, op));
    return Up(recv, out);
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    std::vector<std::byte> in = Down(send, bytes_per_rank), out(static_cast<size_t>(bytes_per_rank * size()));
    CUPCAKE_RETURN_IF_ERROR(host_->Allgather(in.data(), out.data(), bytes_per_rank));
    return Up(recv, out);
  }
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    std::vector<std::byte> in = Down(send, bytes_per_rank * size()), out(in.size());
    CUPCAKE_RETURN_IF_ERROR(host_->Alltoall(in.data(), out.data(), bytes_per_rank));
    return Up(recv, out);
  }
  Status Alltoallv(const void* send, std::span<const int64_t> send_bytes, void* recv,
                   std::span<const int64_t> recv_bytes) override {
    std::vector<std::byte> in = Down(send, std::accumulate(send_bytes.begin(), send_bytes.end(), int64_t{0}));
    std::vector<std::byte> out(static_cast<size_t>(std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0})));
    CUPCAKE_RETURN_IF_ERROR(host_->Alltoallv(in.data(), send_bytes, out.data(), recv_bytes));
    return Up(recv, out);
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> part, host_->Split(color, key));
    if (part == nullptr) return part;
    return std::unique_ptr<Communicator>(std::make_unique<StagingCommunicator>(std::move(part)));
  }
  void Abort(const std::string& reason) override { host_->Abort(reason); }

 private:
  std::vector<std::byte> Down(const void* device, int64_t bytes) {
    std::vector<std::byte> host(static_cast<size_t>(bytes));
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), device, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }
  // On this rank's stream, and waited for: a pageable cudaMemcpy may return before its DMA lands.
  Status Up(void* device, const std::vector<std::byte>& host) {
    if (host.empty()) return Status::Ok();
    if (cudaMemcpyAsync(device, host.data(), host.size(), cudaMemcpyHostToDevice, stream_) != cudaSuccess ||
        cudaStreamSynchronize(stream_) != cudaSuccess) {
      return InternalError("staging: the copy to the device failed");
    }
    return Status::Ok();
  }
  std::unique_ptr<Communicator> host_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace cupcake::comm::testing
