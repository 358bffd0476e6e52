// The random mix every benchmark runs the same way: allocations and frees at random, sizes
// 512 B to 8 MiB log-uniform, one seed, so that each allocator meets the same sequence of
// sizes and choices. fill() allocates until `max_live` blocks are live; each step() after it
// frees a random live block or allocates, with even odds, and frees when the cap is reached.
// So the live set stays near the cap (it wanders below it by about the square root of the
// steps), and an operation is timed while the allocator holds about `max_live` blocks of many
// sizes; a walk with even odds from empty would hold only about the square root of the steps
// taken, whatever the cap. Header-only and C++17, for nvcc too.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace bench {

template <typename Ptr>
class RandomMix {
 public:
  explicit RandomMix(std::size_t max_live)
      : max_live_(max_live), rng_(42), log_size_(std::log(512.0), std::log(8.0 * 1024 * 1024)) {
    live_.reserve(max_live);
  }

  // `alloc(size)` returns the new block's pointer; `release(ptr)` frees one.
  template <typename Alloc>
  void fill(Alloc&& alloc) {
    while (live_.size() < max_live_) live_.push_back(alloc(next_size()));
  }
  template <typename Alloc, typename Release>
  void step(Alloc&& alloc, Release&& release) {
    if (live_.size() < max_live_ && (live_.empty() || rng_() % 2)) {
      live_.push_back(alloc(next_size()));
    } else {
      const std::size_t i = static_cast<std::size_t>(rng_() % live_.size());
      release(live_[i]);
      live_[i] = live_.back();
      live_.pop_back();
    }
  }
  template <typename Release>
  void drain(Release&& release) {
    for (Ptr p : live_) release(p);
    live_.clear();
  }
  std::size_t live() const { return live_.size(); }

 private:
  std::size_t next_size() { return static_cast<std::size_t>(std::exp(log_size_(rng_))); }

  std::size_t max_live_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> log_size_;
  std::vector<Ptr> live_;
};

}  // namespace bench
