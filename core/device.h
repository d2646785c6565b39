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

}  // namespace linea
