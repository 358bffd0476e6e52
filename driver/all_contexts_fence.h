// A fence made of one device fence per live context: done once every part is. For memory that
// work of any context may use (pinned host memory, the program's virtual memory with access
// granted to several devices), which no one context's streams order.
#pragma once

#include <memory>
#include <vector>

#include "allocator/backend.h"

namespace cudalloc::shim {

class AllContextsFence final : public Fence {
 public:
  bool done() override {
    while (!parts.empty()) {
      if (!parts.back()->done()) return false;
      parts.pop_back();
    }
    return true;
  }
  bool wait() override {
    while (!parts.empty()) {
      if (!parts.back()->wait()) return false;
      parts.pop_back();
    }
    return true;
  }
  std::vector<std::unique_ptr<Fence>> parts;
};

}  // namespace cudalloc::shim
