#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "allocator/size_classes.h"
#include "config/config.h"

using namespace cudalloc;

namespace {

constexpr std::size_t kOneMiB = std::size_t{1} << 20;

Config parse_ok(const std::string& text, const Config& base = Config{}) {
  ConfigResult r = parse_alloc_conf(text, base);
  INFO("text: " << text << " error: " << r.error);
  REQUIRE(r.config.has_value());
  CHECK(r.error.empty());
  return *r.config;
}

std::string parse_err(const std::string& text) {
  ConfigResult r = parse_alloc_conf(text);
  INFO("text: " << text);
  REQUIRE_FALSE(r.config.has_value());
  REQUIRE_FALSE(r.error.empty());
  CHECK(r.error.find('\n') == std::string::npos);
  CHECK(r.error.rfind("CUDALLOC_CONF: ", 0) == 0);
  return r.error;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

using Divisions = std::array<std::size_t, kRoundupIntervals>;

}  // namespace

TEST_CASE("defaults", "[config]") {
  const Config c;
  CHECK(c.allocator.max_split_size == std::numeric_limits<std::size_t>::max());
  CHECK(c.allocator.garbage_collection_threshold == 0.0);
  CHECK(c.allocator.roundup_power2_divisions == Divisions{});
  CHECK_FALSE(c.allocator.expandable_segments);
  CHECK(c.allocator.per_process_memory_fraction == 1.0);
  CHECK(c.allocator.memory_limit_bytes == 0);
  CHECK_FALSE(c.free_sync);
  CHECK(c.trace_stacks == 0);
  CHECK_FALSE(c.trace_nvtx);
  CHECK(c.trace_tsc);
  CHECK_FALSE(c.no_caching);
  CHECK(c.trace_path.empty());
  CHECK(c.log_level == LogLevel::kWarn);
  CHECK(c.log_file.empty());
  CHECK_FALSE(c.stats_at_exit);
  CHECK(c.sanitizer == SanitizerMode::kAuto);
}

TEST_CASE("empty text leaves the base unchanged", "[config]") {
  Config base;
  base.free_sync = true;
  base.allocator.max_split_size = 64 * kOneMiB;
  for (const char* text : {"", "   ", " \t "}) {
    const Config c = parse_ok(text, base);
    CHECK(c.free_sync);
    CHECK(c.allocator.max_split_size == 64 * kOneMiB);
  }
}

TEST_CASE("parse applies on top of the base", "[config]") {
  Config base;
  base.trace_nvtx = true;
  base.allocator.memory_limit_bytes = 5 * kOneMiB;
  const Config c = parse_ok("free_sync:true", base);
  CHECK(c.free_sync);
  CHECK(c.trace_nvtx);
  CHECK(c.allocator.memory_limit_bytes == 5 * kOneMiB);
}

TEST_CASE("max_split_size_mb", "[config]") {
  CHECK(parse_ok("max_split_size_mb:20").allocator.max_split_size == 20 * kOneMiB);
  CHECK(parse_ok("max_split_size_mb:512").allocator.max_split_size == 512 * kOneMiB);
  CHECK(parse_ok("max_split_size_mb:17592186044415").allocator.max_split_size ==
        std::size_t{17592186044415} * kOneMiB);

  std::string e = parse_err("max_split_size_mb:19");
  CHECK(e.rfind("CUDALLOC_CONF: max_split_size_mb:19 is not accepted: out of range", 0) == 0);
  CHECK(contains(e, "from 20"));
  CHECK(contains(e, "PyTorch"));
  e = parse_err("max_split_size_mb:0");
  CHECK(contains(e, "max_split_size_mb:0 "));
  e = parse_err("max_split_size_mb:17592186044416");  // * 1 MiB overflows 64 bits
  CHECK(contains(e, "max_split_size_mb:17592186044416 is not accepted: out of range"));
}

TEST_CASE("garbage_collection_threshold", "[config]") {
  CHECK(parse_ok("garbage_collection_threshold:0.6").allocator.garbage_collection_threshold ==
        0.6);
  CHECK(parse_ok("garbage_collection_threshold:.25").allocator.garbage_collection_threshold ==
        0.25);
  CHECK(parse_ok("garbage_collection_threshold:0.999").allocator.garbage_collection_threshold ==
        0.999);

  CHECK(parse_err("garbage_collection_threshold:1.5") ==
        "CUDALLOC_CONF: garbage_collection_threshold:1.5 is not accepted: expected a number "
        "between 0 and 1 (exclusive)");
  for (const char* bad : {"0", "1", "1.0", "0.0"}) {
    const std::string e = parse_err(std::string("garbage_collection_threshold:") + bad);
    CHECK(contains(e, std::string("garbage_collection_threshold:") + bad + " is not accepted"));
    CHECK(contains(e, "between 0 and 1 (exclusive)"));
  }
  for (const char* bad : {"nan", "inf", "+0.5", "0.5x", "abc", "1e999"}) {
    const std::string e = parse_err(std::string("garbage_collection_threshold:") + bad);
    CHECK(contains(e, std::string("garbage_collection_threshold:") + bad + " is not accepted"));
  }
  CHECK(contains(parse_err("garbage_collection_threshold:-0.5"), "negative"));
  CHECK(contains(parse_err("garbage_collection_threshold:0.5x"), "trailing"));
}

TEST_CASE("per_process_memory_fraction", "[config]") {
  CHECK(parse_ok("per_process_memory_fraction:0.5").allocator.per_process_memory_fraction ==
        0.5);
  CHECK(parse_ok("per_process_memory_fraction:1").allocator.per_process_memory_fraction == 1.0);
  CHECK(parse_ok("per_process_memory_fraction:1e-3").allocator.per_process_memory_fraction ==
        0.001);
  for (const char* bad : {"0", "1.01", "2", "-0.1", "x"}) {
    const std::string e = parse_err(std::string("per_process_memory_fraction:") + bad);
    CHECK(contains(e, std::string("per_process_memory_fraction:") + bad + " is not accepted"));
    CHECK(contains(e, "greater than 0 and at most 1"));
  }
}

TEST_CASE("memory_limit_mb", "[config]") {
  // The smallest segment is the smallest limit that can serve anything.
  const std::string smallest = std::to_string(kSmallBuffer / kOneMiB);
  CHECK(parse_ok("memory_limit_mb:" + smallest).allocator.memory_limit_bytes == kSmallBuffer);
  const std::string below = std::to_string(kSmallBuffer / kOneMiB - 1);
  CHECK(contains(parse_err("memory_limit_mb:" + below), "memory_limit_mb:" + below + " is not accepted: out of range"));
  CHECK(contains(parse_err("memory_limit_mb:" + below), "the smallest segment"));
  CHECK(parse_ok("memory_limit_mb:40960").allocator.memory_limit_bytes == 40960 * kOneMiB);
  CHECK(contains(parse_err("memory_limit_mb:0"), "memory_limit_mb:0 is not accepted: out of range"));
  CHECK(contains(parse_err("memory_limit_mb:-4"), "memory_limit_mb:-4 is not accepted: negative"));
  CHECK(contains(parse_err("memory_limit_mb:12abc"),
                 "memory_limit_mb:12abc is not accepted: trailing characters"));
  CHECK(contains(parse_err("memory_limit_mb:99999999999999999999"),
                 "memory_limit_mb:99999999999999999999 is not accepted: number too large"));
  CHECK(contains(parse_err("memory_limit_mb:1.5"), "memory_limit_mb:1.5 is not accepted"));
  CHECK(contains(parse_err("memory_limit_mb:lots"),
                 "memory_limit_mb:lots is not accepted: not a number"));
}

TEST_CASE("booleans", "[config]") {
  CHECK(parse_ok("expandable_segments:true").allocator.expandable_segments);
  CHECK(parse_ok("expandable_segments:True").allocator.expandable_segments);
  CHECK(parse_ok("expandable_segments:TRUE").allocator.expandable_segments);
  Config base;
  base.allocator.expandable_segments = true;
  base.free_sync = true;
  base.trace_nvtx = true;
  CHECK_FALSE(parse_ok("expandable_segments:False", base).allocator.expandable_segments);
  CHECK_FALSE(parse_ok("free_sync:FALSE", base).free_sync);
  CHECK_FALSE(parse_ok("trace_nvtx:false", base).trace_nvtx);
  CHECK(parse_ok("free_sync:tRuE").free_sync);
  CHECK(parse_ok("trace_nvtx:True").trace_nvtx);

  for (const char* key : {"expandable_segments", "free_sync", "trace_nvtx"}) {
    for (const char* bad : {"1", "0", "yes", "on", "truex"}) {
      const std::string e = parse_err(std::string(key) + ":" + bad);
      CHECK(e == std::string("CUDALLOC_CONF: ") + key + ":" + bad +
                     " is not accepted: expected true or false (any case)");
    }
  }
}

TEST_CASE("trace_stacks", "[config]") {
  CHECK(parse_ok("trace_stacks:0").trace_stacks == 0);
  CHECK(parse_ok("trace_stacks:16").trace_stacks == 16);
  CHECK(parse_ok("trace_stacks:64").trace_stacks == 64);
  const std::string e = parse_err("trace_stacks:65");
  CHECK(contains(e, "trace_stacks:65 is not accepted: out of range"));
  CHECK(contains(e, "from 0 to 64"));
  CHECK(contains(parse_err("trace_stacks:-1"), "trace_stacks:-1 is not accepted: negative"));
}

TEST_CASE("trace_clock", "[config]") {
  CHECK_FALSE(parse_ok("trace_clock:monotonic").trace_tsc);
  CHECK_FALSE(parse_ok("trace_clock:Monotonic").trace_tsc);
  Config base;
  base.trace_tsc = false;
  CHECK(parse_ok("trace_clock:TSC", base).trace_tsc);
  const std::string e = parse_err("trace_clock:realtime");
  CHECK(contains(e, "trace_clock:realtime is not accepted: expected tsc or monotonic"));
}

TEST_CASE("roundup_power2_divisions single value", "[config]") {
  Divisions four;
  four.fill(4);
  CHECK(parse_ok("roundup_power2_divisions:4").allocator.roundup_power2_divisions == four);
  Divisions one;
  one.fill(1);
  CHECK(parse_ok("roundup_power2_divisions:1").allocator.roundup_power2_divisions == one);
  Config base;
  base.allocator.roundup_power2_divisions.fill(8);
  CHECK(parse_ok("roundup_power2_divisions:0", base).allocator.roundup_power2_divisions ==
        Divisions{});

  const std::string e = parse_err("roundup_power2_divisions:3");
  CHECK(contains(e, "roundup_power2_divisions:3 is not accepted: not a power of two"));
  CHECK(contains(parse_err("roundup_power2_divisions:-2"), "roundup_power2_divisions:-2 "));
  CHECK(contains(parse_err("roundup_power2_divisions:4k"), "trailing"));
}

TEST_CASE("roundup_power2_divisions that cannot be honoured are refused", "[config]") {
  const std::string top = std::to_string(kMaxRoundupDivisions);
  Divisions most;
  most.fill(kMaxRoundupDivisions);
  CHECK(parse_ok("roundup_power2_divisions:" + top).allocator.roundup_power2_divisions == most);
  CHECK(parse_ok("roundup_power2_divisions:[1:" + top + ",>:" + top + "]").allocator.roundup_power2_divisions == most);
  // 2^55 and up wrapped kMinBlockSize * divisions and rounded every size to a power of two.
  for (std::size_t d : {kMaxRoundupDivisions * 2, std::size_t{1} << 55, std::size_t{1} << 63}) {
    const std::string v = std::to_string(d);
    const std::string single = parse_err("roundup_power2_divisions:" + v);
    CHECK(contains(single, "roundup_power2_divisions:" + v + " is not accepted: more than " + top));
    CHECK(contains(single, "PyTorch also requires a power of two"));
    const std::string list = parse_err("roundup_power2_divisions:[64:" + v + "]");
    CHECK(contains(list, "divisions " + v + " is more than " + top));
  }
}

TEST_CASE("roundup_power2_divisions list form", "[config]") {
  SECTION("PyTorch's documented example") {
    const Divisions d =
        parse_ok("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").allocator.roundup_power2_divisions;
    // 256 MiB -> index 8; the first key also covers every smaller interval.
    for (std::size_t i = 0; i <= 8; ++i) CHECK(d[i] == 1);
    CHECK(d[9] == 2);   // 512 MiB
    CHECK(d[10] == 4);  // 1 GiB
    for (std::size_t i = 11; i < kRoundupIntervals; ++i) CHECK(d[i] == 8);
  }
  SECTION("as in PyTorch, a later key sets its own interval only: the others are not rounded") {
    const Divisions d =
        parse_ok("roundup_power2_divisions:[ 1 : 2 , 64 : 4 , 4096 : 16 ]").allocator.roundup_power2_divisions;
    const Divisions want = {2, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 16, 0, 0, 0};
    CHECK(d == want);
  }
  SECTION("as in PyTorch, keys in any order; a repeated key's last value holds") {
    const Divisions d =
        parse_ok("roundup_power2_divisions:[512:2,256:1,256:4]").allocator.roundup_power2_divisions;
    const Divisions want = {2, 2, 2, 2, 2, 2, 2, 2, 4, 2, 0, 0, 0, 0, 0, 0};
    CHECK(d == want);
    // '>' covers the intervals above the last key given, here 256 MiB's.
    const Divisions e = parse_ok("roundup_power2_divisions:[512:2,256:1,>:8]").allocator.roundup_power2_divisions;
    const Divisions want_e = {2, 2, 2, 2, 2, 2, 2, 2, 1, 8, 8, 8, 8, 8, 8, 8};
    CHECK(e == want_e);
  }
  SECTION("the list replaces the whole table, whatever the base") {
    Config base;
    base.allocator.roundup_power2_divisions.fill(32);
    const Divisions d =
        parse_ok("roundup_power2_divisions:[2:0,8:8]", base).allocator.roundup_power2_divisions;
    const Divisions want = {0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK(d == want);
  }
  SECTION("keys beyond 32 GiB land in the last interval") {
    const Divisions d =
        parse_ok("roundup_power2_divisions:[16384:2,65536:4]").allocator.roundup_power2_divisions;
    CHECK(d[13] == 2);
    CHECK(d[14] == 2);
    CHECK(d[15] == 4);
    CHECK(d[0] == 2);
  }
  SECTION("'>' alone sets every interval above the first, as in PyTorch") {
    Divisions want;
    want.fill(8);
    want[0] = 0;
    CHECK(parse_ok("roundup_power2_divisions:[>:8]").allocator.roundup_power2_divisions == want);
  }
  SECTION("combined with other keys (commas inside brackets)") {
    const Config c = parse_ok(
        "max_split_size_mb:128, roundup_power2_divisions:[128:2,>:4] ,expandable_segments:true");
    CHECK(c.allocator.max_split_size == 128 * kOneMiB);
    CHECK(c.allocator.expandable_segments);
    CHECK(c.allocator.roundup_power2_divisions[7] == 2);
    CHECK(c.allocator.roundup_power2_divisions[8] == 4);
    CHECK(c.allocator.roundup_power2_divisions[0] == 2);
    CHECK(c.allocator.roundup_power2_divisions[15] == 4);
  }
}

TEST_CASE("roundup_power2_divisions list errors", "[config]") {
  struct Bad {
    const char* value;
    const char* says;
  };
  const Bad cases[] = {
      {"[]", "empty list"},
      {"[ ]", "empty list"},
      {"[256:1,,512:2]", "empty list entry"},
      {"[256:1,]", "empty list entry"},
      {"[256]", "has no ':'"},
      {"[300:2]", "300 MiB is not a power of two"},
      {"[0:2]", "0 MiB is not a power of two"},
      {"[256:3]", "divisions 3 is not a power of two"},
      {"[256:x]", "divisions 'x': not a number"},
      {"[256:-1]", "divisions '-1': negative"},
      {"[abc:2]", "size 'abc': not a number"},
      {"[>:8,256:1]", "'>' must be the last"},
      {"[256:1,>:2,>:4]", "'>' must be the last"},
      {"[256:99999999999999999999]", "number too large"},
  };
  for (const Bad& b : cases) {
    const std::string e = parse_err(std::string("roundup_power2_divisions:") + b.value);
    INFO(e);
    CHECK(contains(e, std::string("roundup_power2_divisions:") + b.value + " is not accepted"));
    CHECK(contains(e, b.says));
  }
}

TEST_CASE("brackets", "[config]") {
  std::string e = parse_err("roundup_power2_divisions:[256:1,512:2");
  CHECK(contains(e, "unbalanced brackets, '[' without ']'"));
  CHECK(contains(e, "roundup_power2_divisions:[256:1,512:2"));
  e = parse_err("roundup_power2_divisions:256:1]");
  CHECK(contains(e, "']' without '['"));
  CHECK(contains(e, "roundup_power2_divisions:256:1]"));
  e = parse_err("roundup_power2_divisions:[[256:1]]");
  CHECK(contains(e, "nested"));
  e = parse_err("roundup_power2_divisions:[256:1][512:2]");
  CHECK(contains(e, "nested or repeated"));
  e = parse_err("roundup_power2_divisions:[256:1]x,free_sync:true");
  CHECK(contains(e, "characters after ']'"));
  // A bracket in a key that takes no list is caught by that key's value check.
  e = parse_err("memory_limit_mb:[1]");
  CHECK(contains(e, "memory_limit_mb:[1] is not accepted: not a number"));
}

TEST_CASE("entry syntax errors", "[config]") {
  std::string e = parse_err("max_split_size_mb=64");
  CHECK(e == "CUDALLOC_CONF: entry 'max_split_size_mb=64' is not accepted: bad separator, "
             "expected key:value");
  e = parse_err(":64");
  CHECK(contains(e, "entry ':64' is not accepted: empty key"));
  e = parse_err("max_split_size_mb:");
  CHECK(contains(e, "max_split_size_mb: is not accepted: empty value"));
  e = parse_err("max_split_size_mb:  ,free_sync:true");
  CHECK(contains(e, "empty value"));
  e = parse_err("free_sync:true,,trace_nvtx:true");
  CHECK(contains(e, "empty entry"));
  e = parse_err(",free_sync:true");
  CHECK(contains(e, "empty entry at offset 0"));
  e = parse_err("free_sync:true,,");
  CHECK(contains(e, "empty entry"));
  e = parse_err("free_sync:true, ,");
  CHECK(contains(e, "empty entry"));
}

TEST_CASE("a single trailing comma is tolerated, as in PyTorch", "[config]") {
  CHECK(parse_ok("free_sync:true,").free_sync);
  CHECK(parse_ok("free_sync:true , ").free_sync);
}

TEST_CASE("whitespace around keys and values", "[config]") {
  const Config c = parse_ok("  max_split_size_mb : 64 ,\tgarbage_collection_threshold:0.5 ");
  CHECK(c.allocator.max_split_size == 64 * kOneMiB);
  CHECK(c.allocator.garbage_collection_threshold == 0.5);
}

TEST_CASE("keys are case-sensitive and must be known", "[config]") {
  std::string e = parse_err("Max_Split_Size_MB:64");
  CHECK(contains(e, "Max_Split_Size_MB:64 is not accepted: unknown key 'Max_Split_Size_MB'"));
  e = parse_err("bogus:1");
  CHECK(contains(e, "bogus:1 is not accepted: unknown key 'bogus'; accepted keys: "
                    "max_split_size_mb, garbage_collection_threshold, roundup_power2_divisions, "
                    "expandable_segments, per_process_memory_fraction, memory_limit_mb, "
                    "free_sync, watch_submissions, trace_stacks, trace_nvtx"));
}

TEST_CASE("PyTorch keys cudalloc does not implement", "[config]") {
  for (const char* entry :
       {"backend:cudaMallocAsync", "release_lock_on_cudamalloc:True",
        "pinned_use_cuda_host_register:True", "pinned_num_register_threads:8",
        "pinned_use_background_threads:True", "graph_capture_record_stream_reuse:True",
        "max_non_split_rounding_mb:64"}) {
    const std::string e = parse_err(entry);
    const std::string key = std::string(entry).substr(0, std::string(entry).find(':'));
    CHECK(contains(e, std::string(entry) + " is not accepted: " + key +
                          " is a PyTorch allocator key that cudalloc does not support"));
  }
}

TEST_CASE("backend:native, PyTorch's default, is accepted and changes nothing", "[config]") {
  const Config c = parse_ok("backend:native,max_split_size_mb:64");
  CHECK(c.allocator.max_split_size == 64 * kOneMiB);
  Config plain;
  plain.allocator.max_split_size = 64 * kOneMiB;
  CHECK(describe(c) == describe(plain));
}

TEST_CASE("duplicate keys", "[config]") {
  const std::string e = parse_err("max_split_size_mb:64,free_sync:true,max_split_size_mb:128");
  CHECK(contains(e, "max_split_size_mb:128 is not accepted: duplicate key"));
  CHECK(contains(parse_err("free_sync:true,free_sync:true"), "duplicate key"));
}

TEST_CASE("an error leaves nothing half-applied", "[config]") {
  Config base;
  const ConfigResult r = parse_alloc_conf("free_sync:true,memory_limit_mb:x", base);
  CHECK_FALSE(r.config.has_value());
  CHECK(contains(r.error, "memory_limit_mb:x"));
}

TEST_CASE("hostile input", "[config]") {
  SECTION("1 MB without separators") {
    const std::string text(1 << 20, 'a');
    const std::string e = parse_err(text);
    CHECK(contains(e, "bad separator"));
    CHECK(e.size() < 300);
  }
  SECTION("1 MB value") {
    const std::string text = "max_split_size_mb:" + std::string(1 << 20, '7');
    const std::string e = parse_err(text);
    CHECK(contains(e, "number too large"));
    CHECK(e.size() < 400);
  }
  SECTION("1 MB of list entries") {
    std::string text = "roundup_power2_divisions:[";
    while (text.size() < (1u << 20)) text += "1:1,";
    text += "1:3]";
    const std::string e = parse_err(text);
    CHECK(contains(e, "divisions 3 is not a power of two"));
    CHECK(e.size() < 600);
  }
  SECTION("1 MB of unclosed brackets") {
    const std::string text = "roundup_power2_divisions:" + std::string(1 << 20, '[');
    CHECK(contains(parse_err(text), "nested"));
  }
  SECTION("1 MB of commas and spaces") {
    std::string text = "free_sync:true";
    text += std::string(1 << 20, ' ');
    CHECK(parse_ok(text).free_sync);
    CHECK(contains(parse_err(std::string(1 << 20, ',')), "empty entry"));
  }
  SECTION("control characters are escaped, the error stays one line") {
    const std::string e = parse_err("free_sync:tr\nue");
    CHECK(contains(e, "free_sync:tr\\x0aue is not accepted"));
  }
}

TEST_CASE("load_config with no variables gives the defaults", "[config]") {
  const ConfigResult r = load_config(fake_env({}));
  REQUIRE(r.config.has_value());
  CHECK(r.error.empty());
  CHECK(describe(*r.config) == describe(Config{}));
}

TEST_CASE("load_config reads every variable", "[config]") {
  const ConfigResult r = load_config(fake_env({
      {"CUDALLOC_CONF", "max_split_size_mb:256,expandable_segments:true"},
      {"CUDALLOC_NO_CACHING", "1"},
      {"CUDALLOC_TRACE", "/tmp/trace.bin"},
      {"CUDALLOC_LOG_LEVEL", "DEBUG"},
      {"CUDALLOC_LOG_FILE", "/tmp/cudalloc.log"},
      {"CUDALLOC_STATS", "true"},
      {"CUDALLOC_SANITIZER", "Passthrough"},
  }));
  INFO(r.error);
  REQUIRE(r.config.has_value());
  const Config& c = *r.config;
  CHECK(c.allocator.max_split_size == 256 * kOneMiB);
  CHECK(c.allocator.expandable_segments);
  CHECK(c.no_caching);
  CHECK(c.trace_path == "/tmp/trace.bin");
  CHECK(c.log_level == LogLevel::kDebug);
  CHECK(c.log_file == "/tmp/cudalloc.log");
  CHECK(c.stats_at_exit);
  CHECK(c.sanitizer == SanitizerMode::kPassthrough);
}

TEST_CASE("load_config flags", "[config]") {
  for (const char* name : {"CUDALLOC_NO_CACHING", "CUDALLOC_STATS"}) {
    const auto get = [&](const char* value) {
      const ConfigResult r = load_config(fake_env({{name, value}}));
      REQUIRE(r.config.has_value());
      return std::string(name) == "CUDALLOC_STATS" ? r.config->stats_at_exit
                                                   : r.config->no_caching;
    };
    CHECK(get("1"));
    CHECK(get("TRUE"));
    CHECK(get("true"));
    CHECK_FALSE(get("0"));
    CHECK_FALSE(get("False"));
    for (const char* bad : {"", "yes", "2", "on"}) {
      const ConfigResult r = load_config(fake_env({{name, bad}}));
      CHECK_FALSE(r.config.has_value());
      CHECK(r.error == std::string(name) + "=" + bad +
                           " is not accepted: expected 1, 0, true or false");
    }
  }
}

TEST_CASE("load_config log levels", "[config]") {
  const std::pair<const char*, LogLevel> levels[] = {
      {"trace", LogLevel::kTrace}, {"Debug", LogLevel::kDebug}, {"INFO", LogLevel::kInfo},
      {"warn", LogLevel::kWarn},   {"warning", LogLevel::kWarn}, {"error", LogLevel::kError},
      {"off", LogLevel::kOff},
  };
  for (const auto& [text, level] : levels) {
    const ConfigResult r = load_config(fake_env({{"CUDALLOC_LOG_LEVEL", text}}));
    REQUIRE(r.config.has_value());
    CHECK(r.config->log_level == level);
  }
  const ConfigResult r = load_config(fake_env({{"CUDALLOC_LOG_LEVEL", "verbose"}}));
  CHECK_FALSE(r.config.has_value());
  CHECK(r.error ==
        "CUDALLOC_LOG_LEVEL=verbose is not accepted: expected one of trace, debug, info, warn, "
        "warning, error, off (any case)");
}

TEST_CASE("load_config sanitizer modes", "[config]") {
  const std::pair<const char*, SanitizerMode> modes[] = {
      {"auto", SanitizerMode::kAuto},
      {"PASSTHROUGH", SanitizerMode::kPassthrough},
      {"nvtx", SanitizerMode::kNvtx},
      {"Off", SanitizerMode::kOff},
  };
  for (const auto& [text, mode] : modes) {
    const ConfigResult r = load_config(fake_env({{"CUDALLOC_SANITIZER", text}}));
    REQUIRE(r.config.has_value());
    CHECK(r.config->sanitizer == mode);
  }
  const ConfigResult r = load_config(fake_env({{"CUDALLOC_SANITIZER", "memcheck"}}));
  CHECK_FALSE(r.config.has_value());
  CHECK(r.error == "CUDALLOC_SANITIZER=memcheck is not accepted: expected one of auto, "
                   "passthrough, nvtx, off (any case)");
}

TEST_CASE("load_config paths must be non-empty", "[config]") {
  for (const char* name : {"CUDALLOC_TRACE", "CUDALLOC_LOG_FILE"}) {
    const ConfigResult r = load_config(fake_env({{name, ""}}));
    CHECK_FALSE(r.config.has_value());
    CHECK(r.error == std::string(name) + "= is not accepted: expected a non-empty file path");
  }
}

TEST_CASE("load_config CUDALLOC_CONF errors and empty value", "[config]") {
  ConfigResult r = load_config(fake_env({{"CUDALLOC_CONF", "garbage_collection_threshold:1.5"},
                                         {"CUDALLOC_STATS", "1"}}));
  CHECK_FALSE(r.config.has_value());
  CHECK(r.error ==
        "CUDALLOC_CONF: garbage_collection_threshold:1.5 is not accepted: expected a number "
        "between 0 and 1 (exclusive)");
  r = load_config(fake_env({{"CUDALLOC_CONF", ""}}));
  REQUIRE(r.config.has_value());
  CHECK(describe(*r.config) == describe(Config{}));
}

TEST_CASE("load_config survives a throwing lookup and an empty one", "[config]") {
  const EnvLookup throwing = [](const char*) -> std::optional<std::string> {
    throw std::runtime_error("boom");
  };
  ConfigResult r = load_config(throwing);
  CHECK_FALSE(r.config.has_value());
  CHECK_FALSE(r.error.empty());
  r = load_config(EnvLookup{});
  CHECK_FALSE(r.config.has_value());
  CHECK_FALSE(r.error.empty());
}

TEST_CASE("process_env reads the process environment", "[config]") {
  const EnvLookup env = process_env();
  REQUIRE(setenv("CUDALLOC_TEST_CONFIG_VAR", "hello", 1) == 0);
  CHECK(env("CUDALLOC_TEST_CONFIG_VAR") == std::optional<std::string>("hello"));
  REQUIRE(unsetenv("CUDALLOC_TEST_CONFIG_VAR") == 0);
  CHECK_FALSE(env("CUDALLOC_TEST_CONFIG_VAR").has_value());
  CHECK_FALSE(env(nullptr).has_value());
}

TEST_CASE("describe", "[config]") {
  CHECK(describe(Config{}) ==
        "max_split_size_mb=unlimited garbage_collection_threshold=off "
        "roundup_power2_divisions=off expandable_segments=false page_stitching=false per_process_memory_fraction=1 "
        "memory_limit_mb=none pinned_memory_limit_mb=none free_sync=false single_stream=false watch_submissions=true trace_stacks=0 trace_nvtx=false trace_clock=tsc free_epoch_mb=64 "
                             "max_pending_mb=1024 thread_cache=true no_caching=false "
        "trace=off log_level=warn log_file=default stats=false sanitizer=auto");

  Config c = parse_ok(
      "max_split_size_mb:512,garbage_collection_threshold:0.75,"
      "roundup_power2_divisions:[256:1,512:2,1024:4,>:8],expandable_segments:true,"
      "per_process_memory_fraction:0.5,memory_limit_mb:4096,free_sync:true,trace_stacks:8,"
      "trace_nvtx:true,single_stream:true,trace_clock:monotonic,watch_submissions:false");
  c.no_caching = true;
  c.trace_path = "/tmp/t.bin";
  c.log_level = LogLevel::kError;
  c.log_file = "/tmp/l.log";
  c.stats_at_exit = true;
  c.sanitizer = SanitizerMode::kNvtx;
  CHECK(describe(c) ==
        "max_split_size_mb=512 garbage_collection_threshold=0.75 "
        "roundup_power2_divisions=[256:1,512:2,1024:4,>:8] expandable_segments=true page_stitching=false "
        "per_process_memory_fraction=0.5 memory_limit_mb=4096 pinned_memory_limit_mb=none free_sync=true single_stream=true watch_submissions=false trace_stacks=8 "
        "trace_nvtx=true trace_clock=monotonic free_epoch_mb=64 max_pending_mb=1024 thread_cache=true no_caching=true trace=/tmp/t.bin "
                       "log_level=error log_file=/tmp/l.log "
        "stats=true sanitizer=nvtx");

  Config u;
  u.allocator.roundup_power2_divisions.fill(4);
  u.allocator.max_split_size = 20 * kOneMiB + 1;
  CHECK(contains(describe(u), "roundup_power2_divisions=4 "));
  CHECK(contains(describe(u), "max_split_size_mb=20971521B "));

  Config weird;
  weird.trace_path = "/tmp/a\nb";
  CHECK(contains(describe(weird), "trace=/tmp/a\\x0ab "));
}

TEST_CASE("describe's roundup list reads back to the same table", "[config]") {
  for (const char* text : {"[256:1,512:2,1024:4,>:8]", "[1:2,64:4,4096:16]", "[2:0,8:8]",
                           "[16384:2,65536:4]", "[1:4,2:8,4:4,8:8,16:4,>:2]", "[>:8]", "[1:4,>:4]",
                           "[2:4,4:0,>:8]", "[1:0,32768:2]", "[512:2,256:1,>:8]"}) {
    const Config c = parse_ok(std::string("roundup_power2_divisions:") + text);
    const std::string d = describe(c);
    const std::size_t from = d.find("roundup_power2_divisions=") + 25;
    const std::string list = d.substr(from, d.find(' ', from) - from);
    INFO(text << " -> " << list);
    const Config back = parse_ok("roundup_power2_divisions:" + list);
    CHECK(back.allocator.roundup_power2_divisions == c.allocator.roundup_power2_divisions);
  }
}

TEST_CASE("single_stream is a boolean, off by default", "[config]") {
  CHECK_FALSE(parse_ok("").single_stream);
  CHECK(parse_ok("single_stream:true").single_stream);
  CHECK_FALSE(parse_ok("single_stream:False").single_stream);
  const std::string e = parse_err("single_stream:1");
  CHECK(contains(e, "single_stream:1"));
  CHECK(contains(e, "expected true or false"));
}

TEST_CASE("free_epoch_mb and thread_cache tune the hot path") {
  auto r = parse_alloc_conf("free_epoch_mb:0,thread_cache:False");
  REQUIRE(r.config);
  CHECK(r.config->allocator.free_epoch_bytes == 0);
  CHECK_FALSE(r.config->allocator.thread_cache);
  r = parse_alloc_conf("free_epoch_mb:256");
  REQUIRE(r.config);
  CHECK(r.config->allocator.free_epoch_bytes == 256ull << 20);
  CHECK(r.config->allocator.thread_cache);
  r = parse_alloc_conf("thread_cache:maybe");
  CHECK_FALSE(r.config);
  CHECK(r.error.find("thread_cache:maybe") != std::string::npos);
  r = parse_alloc_conf("max_pending_mb:0");
  REQUIRE(r.config);
  CHECK(r.config->allocator.max_pending_bytes == 0);
  r = parse_alloc_conf("max_pending_mb:2048");
  REQUIRE(r.config);
  CHECK(r.config->allocator.max_pending_bytes == 2048ull << 20);
  r = parse_alloc_conf("max_pending_mb:lots");
  CHECK_FALSE(r.config);
  CHECK(r.error.find("max_pending_mb") != std::string::npos);
  r = parse_alloc_conf("free_epoch_mb:-1");
  CHECK_FALSE(r.config);
  CHECK(r.error.find("free_epoch_mb") != std::string::npos);
}

TEST_CASE("pinned_memory_limit_mb, and PyTorch's pinned defaults") {
  ConfigResult r = parse_alloc_conf("pinned_memory_limit_mb:512");
  REQUIRE(r.config);
  CHECK(r.config->allocator.pinned_memory_limit_bytes == std::size_t{512} << 20);
  CHECK(describe(*r.config).find("pinned_memory_limit_mb=512") != std::string::npos);
  CHECK(!parse_alloc_conf("pinned_memory_limit_mb:0").config);
  CHECK(!parse_alloc_conf("pinned_memory_limit_mb:lots").config);
  // What cudalloc does anyway is accepted; what it cannot do is refused.
  CHECK(parse_alloc_conf("pinned_use_cuda_host_register:False,pinned_use_background_threads:false").config);
  const ConfigResult reg = parse_alloc_conf("pinned_use_cuda_host_register:True");
  CHECK(!reg.config);
  CHECK(reg.error.find("does not support") != std::string::npos);
  CHECK(!parse_alloc_conf("pinned_use_background_threads:true").config);
  CHECK(!parse_alloc_conf("pinned_num_register_threads:8").config);
}
