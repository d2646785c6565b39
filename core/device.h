// Device: CPU always; CUDA when the backend is built and a GPU is present.
#pragma once

#include <ostream>
#include <string>

namespace linea {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  Device() = default;
  Device(DeviceType t, int i = 0) : type(t), index(i) {}
  // Parses "cpu", "cuda", "cuda:1". Throws linea::Error on anything else.
  Device(const std::string& spec);
  Device(const char* spec) : Device(std::string(spec)) {}

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

inline const Device kCPU{DeviceType::CPU, 0};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

// True when Linea was compiled with the CUDA backend.
bool cuda_built();
// True when the CUDA backend is built and at least one GPU with a working driver is present.
// Never throws; safe on machines with no driver.
bool cuda_available();
int cuda_device_count();

// Waits until the device has done the work queued on it (torch.cuda.synchronize): what a timer
// around GPU work needs at both ends. Nothing on the CPU, whose ops return done. Throws
// linea::Error for a CUDA device in a build without the CUDA backend.
void synchronize(const Device& device);

// The caching allocator that holds the device's tensors (core/allocator.h): cpu_allocator() or
// CUDA's. Its stats are the live bytes and their peak (torch.cuda.memory_allocated,
// max_memory_allocated). Throws like synchronize.
class CachingAllocator;
CachingAllocator& allocator_of(const Device& device);

}  // namespace linea
