#include <catch2/catch.hpp>

#include "allocator/memory_stats.h"

using namespace cudalloc;

TEST_CASE("a stat keeps current, peak and cumulative totals") {
  Stat s;
  s.increase(10);
  s.increase(5);
  s.decrease(12);
  CHECK(s.current == 3);
  CHECK(s.peak == 15);
  CHECK(s.allocated == 15);
  CHECK(s.freed == 12);
  s.reset_peak();
  CHECK(s.peak == 3);
}

TEST_CASE("memory_stats keys use PyTorch's names") {
  MemoryStats m;
  m.allocated_bytes[kStatAll].increase(1024);
  m.allocated_bytes[stat_index(PoolKind::kLarge)].increase(1024);
  m.num_ooms = 2;
  const auto map = m.to_map();
  for (const char* key : {"allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                          "active_bytes.all.current", "inactive_split_bytes.all.current", "requested_bytes.all.peak",
                          "allocated_bytes.small_pool.current", "segment.large_pool.peak", "num_alloc_retries",
                          "num_ooms", "num_device_alloc", "num_device_free"}) {
    INFO(key);
    CHECK(map.count(key) == 1);
  }
  CHECK(map.at("allocated_bytes.all.current") == 1024);
  CHECK(map.at("allocated_bytes.large_pool.peak") == 1024);
  CHECK(map.at("allocated_bytes.small_pool.current") == 0);
  CHECK(map.at("num_ooms") == 2);
  m.allocated_bytes[kStatAll].decrease(1024);
  m.reset_peaks();
  CHECK(m.to_map().at("allocated_bytes.all.peak") == 0);
}

TEST_CASE("the summary table shows the figures") {
  MemoryStats m;
  m.allocated_bytes[kStatAll].increase(3 * 1024 * 1024);
  m.reserved_bytes[kStatAll].increase(20 * 1024 * 1024);
  m.num_cache_hits = 41;
  const std::string table = format_memory_summary(m, 1, 80ull << 30);
  CHECK(table.find("device 1") != std::string::npos);
  CHECK(table.find("limit 80.00 GiB") != std::string::npos);
  CHECK(table.find("Allocated memory") != std::string::npos);
  CHECK(table.find("3.00 MiB") != std::string::npos);
  CHECK(table.find("20.00 MiB") != std::string::npos);
  CHECK(table.find("cache hits: 41") != std::string::npos);
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1536) == "1.50 KiB");
}
