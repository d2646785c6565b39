// The CUDA work counters (see cuda_counters.h).
#include "core/cuda_counters.h"

namespace linea::cuda {

namespace detail {
CounterCells& counter_cells() {
  static CounterCells cells;
  return cells;
}
}  // namespace detail

Counters Counters::operator-(const Counters& o) const {
  Counters d;
  d.kernel_launches = kernel_launches - o.kernel_launches;
  d.library_calls = library_calls - o.library_calls;
  d.graph_launches = graph_launches - o.graph_launches;
  d.host_syncs = host_syncs - o.host_syncs;
  d.host_waits = host_waits - o.host_waits;
  d.device_allocs = device_allocs - o.device_allocs;
  d.device_copies = device_copies - o.device_copies;
  d.h2d_copies = h2d_copies - o.h2d_copies;
  d.h2d_bytes = h2d_bytes - o.h2d_bytes;
  d.d2h_copies = d2h_copies - o.d2h_copies;
  d.d2h_bytes = d2h_bytes - o.d2h_bytes;
  return d;
}

namespace {
std::string plural(int64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}
}  // namespace

std::string Counters::str() const {
  return plural(kernel_launches, "launch", "launches") + ", " + plural(library_calls, "library call", "library calls") +
         ", " + plural(graph_launches, "graph launch", "graph launches") + ", " + plural(host_syncs, "sync", "syncs") +
         ", " + plural(host_waits, "wait", "waits") + ", " + plural(device_allocs, "allocation", "allocations") + ", " +
         plural(device_copies, "device copy", "device copies") + ", " + plural(h2d_copies, "H2D copy", "H2D copies") +
         " (" + std::to_string(h2d_bytes) + " B), " + plural(d2h_copies, "D2H copy", "D2H copies") + " (" +
         std::to_string(d2h_bytes) + " B)";
}

Counters counters() {
  const detail::CounterCells& c = detail::counter_cells();
  const auto r = [](const std::atomic<int64_t>& a) { return a.load(std::memory_order_relaxed); };
  Counters out;
  out.kernel_launches = r(c.kernel_launches);
  out.library_calls = r(c.library_calls);
  out.graph_launches = r(c.graph_launches);
  out.host_syncs = r(c.host_syncs);
  out.host_waits = r(c.host_waits);
  out.device_allocs = r(c.device_allocs);
  out.device_copies = r(c.device_copies);
  out.h2d_copies = r(c.h2d_copies);
  out.h2d_bytes = r(c.h2d_bytes);
  out.d2h_copies = r(c.d2h_copies);
  out.d2h_bytes = r(c.d2h_bytes);
  return out;
}

}  // namespace linea::cuda
