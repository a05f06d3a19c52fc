// What every backend shares: data types, memory kinds, and the host reduction that the
// in-process group and MPI's user-defined operations apply.
#include <algorithm>
#include <cstring>

#include "cupcake/comm/communicator.h"
#include "cupcake/kernels/compressor.h"

namespace cupcake::comm {
namespace {

template <typename T>
void Reduce(const void* in, void* inout, int64_t count, ReduceOp op) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int64_t i = 0; i < count; ++i) b[i] = op == ReduceOp::kSum ? static_cast<T>(b[i] + a[i]) : std::max(b[i], a[i]);
}

float BFloat16ToFloat(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even; NaN stays a (quiet) NaN of the same sign.
uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

void ReduceBFloat16(const void* in, void* inout, int64_t count, ReduceOp op) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int64_t i = 0; i < count; ++i) {
    const float x = BFloat16ToFloat(a[i]), y = BFloat16ToFloat(b[i]);
    b[i] = op == ReduceOp::kSum ? FloatToBFloat16(x + y) : (y >= x ? b[i] : a[i]);
  }
}

}  // namespace

int64_t DataTypeBytes(DataType type) {
  switch (type) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kFloat64: return 8;
    case DataType::kInt8: return 1;
    case DataType::kUint8: return 1;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
  }
  return 0;
}

std::string_view Name(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat64: return "float64";
    case DataType::kInt8: return "int8";
    case DataType::kUint8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
  }
  return "?";
}

kernels::Backend BackendOf(MemoryKind memory) {
  return memory == MemoryKind::kDevice ? kernels::Backend::kCuda : kernels::Backend::kCpu;
}

void ReduceInto(const void* in, void* inout, int64_t count, DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kFloat32:
      if (op == ReduceOp::kSum) {  // the compressors' own sum (kernels), so results agree bit for bit
        kernels::SumFp32Payloads(static_cast<const float*>(in), static_cast<float*>(inout), count);
        return;
      }
      return Reduce<float>(in, inout, count, op);
    case DataType::kFloat16:
      if (op == ReduceOp::kSum) {
        kernels::SumFp16Payloads(static_cast<const std::byte*>(in), static_cast<std::byte*>(inout), count);
        return;
      }
      break;  // no max of halves: refused by every backend (internal::CheckReduce)
    case DataType::kBFloat16: return ReduceBFloat16(in, inout, count, op);
    case DataType::kFloat64: return Reduce<double>(in, inout, count, op);
    case DataType::kInt8: return Reduce<int8_t>(in, inout, count, op);
    case DataType::kUint8: return Reduce<uint8_t>(in, inout, count, op);
    case DataType::kInt32: return Reduce<int32_t>(in, inout, count, op);
    case DataType::kInt64: return Reduce<int64_t>(in, inout, count, op);
  }
}

}  // namespace cupcake::comm
