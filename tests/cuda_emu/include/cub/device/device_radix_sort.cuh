// CUB's DeviceRadixSort::SortPairs for the emulator (this folder comes before the CUDA headers on
// its include path): the same contract, a stable sort of (key, value) pairs by key, done by
// std::stable_sort on the host in stream order (submitted as a grid of one thread, so that a
// stream capture records it like a kernel). The bit range is ignored: all keys are compared.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

namespace emu {
void submit_grid(const void* kernel, dim3 grid, dim3 block, size_t smem, std::function<void()> body);
}  // namespace emu

namespace cub {
struct DeviceRadixSort {
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const KeyT* keys_in, KeyT* keys_out,
                               const ValueT* values_in, ValueT* values_out, NumItemsT num_items, int = 0,
                               int = static_cast<int>(sizeof(KeyT) * 8), cudaStream_t = nullptr) {
    if (temp == nullptr) {  // the size query
      temp_bytes = 1;
      return cudaSuccess;
    }
    const int64_t n = static_cast<int64_t>(num_items);
    emu::submit_grid(nullptr, dim3(1), dim3(1), 0, [=] {
      std::vector<int64_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), int64_t{0});
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys_in[a] < keys_in[b]; });
      std::vector<KeyT> k(static_cast<size_t>(n));
      std::vector<ValueT> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        k[static_cast<size_t>(i)] = keys_in[order[static_cast<size_t>(i)]];
        v[static_cast<size_t>(i)] = values_in[order[static_cast<size_t>(i)]];
      }
      std::copy(k.begin(), k.end(), keys_out);
      std::copy(v.begin(), v.end(), values_out);
    });
    return cudaSuccess;
  }
};
}  // namespace cub
