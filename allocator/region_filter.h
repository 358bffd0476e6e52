// Which 2 MiB regions of the address space may hold this allocator's memory: a bit per region
// (hashed), set when device memory is obtained and never cleared, so a clear bit is a sure "not
// ours" and a set one only a "maybe". A free of a pointer another allocator owns (another
// device's, or the driver's own) is told apart without the device lock; with several devices a
// process tries each device's allocator in turn. Relaxed is enough: a region is marked before
// any block in it is handed out, so a thread that got the pointer from the allocating thread
// through any synchronization of the program sees the mark.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocator/types.h"

namespace cudalloc {

class RegionFilter {
 public:
  // Marks the regions of [base, base + bytes). A range longer than the filter marks it all.
  void add(DevicePtr base, std::size_t bytes) noexcept {
    if (bytes == 0) return;
    const std::uint64_t first = base >> kRegionShift;
    const std::uint64_t last = (base + bytes - 1) >> kRegionShift;
    if (last - first >= kBits) {
      for (auto& w : words_) w.store(~std::uint64_t{0}, std::memory_order_relaxed);
      return;
    }
    for (std::uint64_t r = first; r <= last; ++r) {
      const std::size_t bit = index(r);
      words_[bit / 64].fetch_or(std::uint64_t{1} << (bit % 64), std::memory_order_relaxed);
    }
  }

  // False only if no memory of this allocator ever lay in ptr's region.
  bool may_hold(DevicePtr ptr) const noexcept {
    const std::size_t bit = index(ptr >> kRegionShift);
    return (words_[bit / 64].load(std::memory_order_relaxed) >> (bit % 64)) & 1;
  }

 private:
  static constexpr unsigned kRegionShift = 21;
  static constexpr unsigned kLogBits = 16;
  static constexpr std::size_t kBits = std::size_t{1} << kLogBits;
  static std::size_t index(std::uint64_t region) noexcept {
    return static_cast<std::size_t>((region * 0x9E3779B97F4A7C15ull) >> (64 - kLogBits));
  }
  std::array<std::atomic<std::uint64_t>, kBits / 64> words_{};
};

}  // namespace cudalloc
