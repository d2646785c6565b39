// Device parsing, CUDA availability queries (which never throw and never touch CUDA when the
// backend is not built), and a device's synchronization and allocator.
#include "core/device.h"

#include "core/cuda_interface.h"
#include "core/error.h"

namespace linea {

Device::Device(const std::string& spec) {
  if (spec == "cpu") {
    type = DeviceType::CPU;
    index = 0;
    return;
  }
  if (spec.rfind("cuda", 0) == 0) {
    type = DeviceType::CUDA;
    index = 0;
    if (spec.size() == 4) return;
    if (spec.size() > 5 && spec[4] == ':') {
      try {
        size_t used = 0;
        index = std::stoi(spec.substr(5), &used);
        if (used == spec.size() - 5 && index >= 0) return;
      } catch (const std::exception&) {
      }
    }
  }
  LINEA_FAIL("Device: cannot parse '", spec, "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const {
  if (is_cpu()) return "cpu";
  return "cuda:" + std::to_string(index);
}

bool cuda_built() {
#ifdef LINEA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef LINEA_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

void synchronize(const Device& device) {
  if (device.is_cpu()) return;
#ifdef LINEA_WITH_CUDA
  cuda::synchronize();
#else
  LINEA_FAIL("synchronize ", device.str(), ": this build of Linea has no CUDA backend");
#endif
}

CachingAllocator& allocator_of(const Device& device) {
  if (device.is_cpu()) return cpu_allocator();
#ifdef LINEA_WITH_CUDA
  return cuda::allocator();
#else
  LINEA_FAIL("allocator_of ", device.str(), ": this build of Linea has no CUDA backend");
#endif
}

}  // namespace linea
