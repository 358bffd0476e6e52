// TraceWriter's NVTX id hooks (what the shim's NVTX injection uses): the allocating thread
// stores only an id; the text is looked up when the record is written.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "trace/trace_writer.h"

using namespace cudalloc;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/cudalloc-nvtx-ids-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

// The extra column of each data record, in order.
std::vector<std::string> extras(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string l;
  int n = 0;
  while (std::getline(in, l)) {
    if (n++ < 2 || l.empty() || l[0] == '#') continue;
    out.push_back(l.substr(l.rfind(',') + 1));
  }
  return out;
}

thread_local std::uint32_t t_range = 0;
std::atomic<int> g_text_calls{0};
const char* const kTexts[] = {"", "forward", "forward/attn", "a,b;c\x01"};

std::uint32_t current() noexcept { return t_range; }
std::size_t text(std::uint32_t id, const char** out) noexcept {
  g_text_calls.fetch_add(1);
  if (id >= sizeof kTexts / sizeof kTexts[0]) return 0;  // unknown: no field
  *out = kTexts[id];
  return std::strlen(kTexts[id]);
}
std::size_t legacy(char* out, std::size_t cap) noexcept {
  const char s[] = "legacy";
  std::size_t n = std::min(cap, sizeof s - 1);
  std::memcpy(out, s, n);
  return n;
}

AllocatorEvent event() {
  AllocatorEvent e{};
  e.kind = EventKind::kAlloc;
  e.ptr = 0x1000;
  e.requested = 100;
  e.rounded = 512;
  e.stream = kNoStream;
  return e;
}

struct Hooks {
  ~Hooks() {
    TraceWriter::set_nvtx_id_hooks(nullptr, nullptr);
    TraceWriter::set_nvtx_hook(nullptr);
  }
};

}  // namespace

TEST_CASE("records carry the recording thread's range id, written out as its text") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  Hooks restore;
  TraceOptions o;
  o.nvtx = true;
  {
    auto w = TraceWriter::open(path, o);
    REQUIRE(w != nullptr);
    TraceWriter::set_nvtx_id_hooks(&current, &text);
    w->pause_writer_for_testing(true);
    g_text_calls = 0;
    t_range = 0;
    w->on_event(event());  // no range
    t_range = 1;
    w->on_event(event());
    std::thread other([&] {
      t_range = 2;  // this thread's own range
      w->on_event(event());
    });
    other.join();
    w->on_event(event());  // still "forward" here
    t_range = 3;
    w->on_event(event());  // separators made '_'
    t_range = 99;
    w->on_event(event());  // an id the text hook does not know: no field
    // Nothing was turned into text while recording.
    CHECK(g_text_calls.load() == 0);
    w->flush();
    CHECK(g_text_calls.load() == 5);
  }
  auto ex = extras(path);
  REQUIRE(ex.size() == 6);
  CHECK(ex[0] == "");
  CHECK(ex[1] == "nvtx=forward");
  CHECK(ex[2] == "nvtx=forward/attn");
  CHECK(ex[3] == "nvtx=forward");
  CHECK(ex[4] == "nvtx=a_b_c_");
  CHECK(ex[5] == "");
}

TEST_CASE("the id hooks take precedence over the text hook; without them the text hook is used") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  Hooks restore;
  TraceOptions o;
  o.nvtx = true;
  {
    auto w = TraceWriter::open(path, o);
    REQUIRE(w != nullptr);
    TraceWriter::set_nvtx_hook(&legacy);
    TraceWriter::set_nvtx_id_hooks(&current, &text);
    t_range = 1;
    w->on_event(event());
    TraceWriter::set_nvtx_id_hooks(nullptr, nullptr);
    w->on_event(event());
  }
  auto ex = extras(path);
  REQUIRE(ex.size() == 2);
  CHECK(ex[0] == "nvtx=forward");
  CHECK(ex[1] == "nvtx=legacy");
}

TEST_CASE("trace_nvtx off: no range even with the hooks set") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  Hooks restore;
  {
    auto w = TraceWriter::open(path, {});
    REQUIRE(w != nullptr);
    TraceWriter::set_nvtx_id_hooks(&current, &text);
    t_range = 2;
    w->on_event(event());
  }
  auto ex = extras(path);
  REQUIRE(ex.size() == 1);
  CHECK(ex[0] == "");
}
