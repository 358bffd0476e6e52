// TraceWriter: format, fields from a real DeviceAllocator on the simulated backend, threads,
// overflow, fork, kill and fatal signals, file safety.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "allocator/device_allocator.h"
#include "allocator/sim_backend.h"
#include "trace/trace_lanes.h"
#include "trace/trace_writer.h"

using namespace cudalloc;

namespace {

const char* kColumns =
    "ts_ns,pid,tid,device,event,stream,ptr,requested,rounded,result,hit,allocated,reserved,extra";

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/cudalloc-trace-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string l;
  while (std::getline(in, l)) lines.push_back(l);
  return lines;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

struct Row {
  std::map<std::string, std::string> f;
  const std::string& operator[](const char* k) const { return f.at(k); }
};

// Data records (not comments, not the two header lines).
std::vector<Row> records(const std::string& path) {
  auto lines = read_lines(path);
  REQUIRE(lines.size() >= 2);
  auto cols = split(lines[1], ',');
  std::vector<Row> rows;
  for (std::size_t i = 2; i < lines.size(); ++i) {
    if (lines[i].empty() || lines[i][0] == '#') continue;
    auto v = split(lines[i], ',');
    REQUIRE(v.size() == cols.size());
    Row r;
    for (std::size_t c = 0; c < cols.size(); ++c) r.f[cols[c]] = v[c];
    rows.push_back(r);
  }
  return rows;
}

std::vector<Row> only(const std::vector<Row>& rows, const std::string& event) {
  std::vector<Row> out;
  for (const auto& r : rows) {
    if (r["event"] == event) out.push_back(r);
  }
  return out;
}

std::string hex(std::uint64_t v) {
  std::ostringstream o;
  o << "0x" << std::hex << v;
  return o.str();
}

AllocatorEvent event(std::uint64_t ptr, EventKind kind = EventKind::kAlloc) {
  AllocatorEvent e{};
  e.kind = kind;
  e.ptr = ptr;
  e.requested = 100;
  e.rounded = 512;
  e.stream = 0x10;
  return e;
}

std::string run_capture(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = ::pclose(p);
  return out;
}

std::size_t nvtx_forward(char* out, std::size_t cap) noexcept {
  const char* s = "forward/layer,1";
  std::size_t n = std::strlen(s);
  if (n > cap) n = cap;
  std::memcpy(out, s, n);
  return n;
}

// A range name that is not all UTF-8: a Latin-1 byte, then 順 cut after its first byte by the
// capacity the writer gives (64 bytes).
std::size_t nvtx_not_utf8(char* out, std::size_t cap) noexcept {
  std::string s = "caf\xe9/\xe9\xa0\x86";  // "caf?/" then 順 whole
  while (s.size() < cap - 1) s += 'x';
  s += "\xe9\xa0\x86";  // 順 again, its last two bytes beyond the capacity
  const std::size_t n = std::min(s.size(), cap);
  std::memcpy(out, s.data(), n);
  return n;
}

bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    }
    i += len;
  }
  return true;
}

}  // namespace

TEST_CASE("a range name that is not UTF-8 is written as UTF-8: '?' for what is not") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  {
    TraceOptions o;
    o.nvtx = true;
    auto w = TraceWriter::open(path, o);
    REQUIRE(w != nullptr);
    TraceWriter::set_nvtx_hook(&nvtx_not_utf8);
    w->on_event(event(0x200));
    TraceWriter::set_nvtx_hook(nullptr);
  }
  auto rows = records(path);
  REQUIRE(rows.size() == 1);
  const std::string& ex = rows[0]["extra"];
  CHECK(ex.rfind("nvtx=caf?/\xe9\xa0\x86x", 0) == 0);  // the whole 順 kept
  CHECK(ex.back() == '?');                                // the cut one is not
  for (const auto& line : read_lines(path)) CHECK(valid_utf8(line));
}

TEST_CASE("the header names the format, the columns, the process and the start time") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  {
    std::string err;
    auto w = TraceWriter::open(path, {}, &err);
    REQUIRE(w != nullptr);
    CHECK(w->file_path() == path);
  }
  auto lines = read_lines(path);
  REQUIRE(lines.size() >= 5);
  CHECK(lines[0] == "#cudalloc-trace v1");
  CHECK(lines[1] == kColumns);
  CHECK(lines[2].rfind("# pid=" + std::to_string(::getpid()) + " ", 0) == 0);
  CHECK(lines[3].rfind("# cmdline=", 0) == 0);
  CHECK(lines[3].find("test_trace_writer") != std::string::npos);
  CHECK(lines[4].rfind("# start_time=", 0) == 0);
  CHECK(lines.back() == "# end records=0 dropped=0");
  CHECK(records(path).empty());

  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777 & ~0640) == 0);  // never group-writable or world-anything
}

TEST_CASE("ts_ns is CLOCK_MONOTONIC since load, whichever clock stamps the records") {
  // Three records spread over ~60 ms, each bracketed by CLOCK_MONOTONIC readings; the writer
  // drains between them, so the TSC's ticks are converted across several anchors. A wrong
  // rate (even 1%) puts the last record outside its bracket.
  for (const TraceClockSource source : {TraceClockSource::kTsc, TraceClockSource::kMonotonic}) {
    CAPTURE(static_cast<int>(source));
    TempDir dir;
    const std::string path = dir / "t.csv";
    std::vector<std::pair<std::int64_t, std::int64_t>> brackets;
    {
      TraceOptions options;
      options.clock = source;
      auto w = TraceWriter::open(path, options);
      REQUIRE(w != nullptr);
      for (int i = 0; i < 3; ++i) {
        const std::int64_t before = monotonic_ns() - trace_origin_ns();
        w->on_event(event(0x1000 + i));
        brackets.emplace_back(before, monotonic_ns() - trace_origin_ns());
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
      }
      w->flush();
    }
    const bool tsc = source == TraceClockSource::kTsc && tsc_usable();
    auto lines = read_lines(path);
    REQUIRE(lines.size() >= 6);
    CHECK(lines[5].rfind("# options ", 0) == 0);
    CHECK(lines[5].find(tsc ? " clock=tsc" : " clock=monotonic") != std::string::npos);
    auto rows = records(path);
    REQUIRE(rows.size() == 3);
    constexpr std::int64_t kSlackNs = 20000;  // the anchors' jitter is tens of ns
    for (int i = 0; i < 3; ++i) {
      const std::int64_t ts = std::stoll(rows[i]["ts_ns"]);
      CHECK(rows[i]["ptr"] == hex(0x1000 + i));
      CHECK(ts >= brackets[i].first - kSlackNs);
      CHECK(ts <= brackets[i].second + kSlackNs);
    }
  }
}

TEST_CASE("a process that never records starts no writer thread and writes no records") {
  TempDir dir;
  auto w = TraceWriter::open(dir / "t.csv", {});
  REQUIRE(w != nullptr);
  std::ifstream status("/proc/self/status");
  std::string line;
  int before = -1;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) before = std::stoi(line.substr(8));
  }
  CHECK(before == 1);
}

TEST_CASE("the writer thread is named cudalloc-trace") {
  auto named = []() {
    std::size_t n = 0;
    DIR* d = ::opendir("/proc/self/task");
    REQUIRE(d != nullptr);
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      std::getline(comm, name);
      if (name == "cudalloc-trace") ++n;
    }
    ::closedir(d);
    return n;
  };
  TempDir dir;
  auto w = TraceWriter::open(dir / "t.csv", {});
  REQUIRE(w != nullptr);
  CHECK(named() == 0);
  w->on_event(event(0x1000));
  // The thread names itself as it starts.
  for (int i = 0; i < 200 && named() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(named() == 1);
}

TEST_CASE("every allocator event becomes one record with the right fields") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  {
    SimBackend sim(SimOptions{.total_memory = 64 * kMiB, .host_memory = false});
    DeviceAllocator alloc(sim, AllocatorOptions{}, 3);
    auto w = TraceWriter::open(path, {});
    REQUIRE(w != nullptr);
    alloc.set_observer(w.get());

    DevicePtr a = 0, b = 0, c = 0;
    REQUIRE(alloc.allocate(1000, 0x10, &a) == Status::kOk);  // miss: segment + alloc
    REQUIRE(alloc.free(a, FreeOrder::kCompleted) == Status::kOk);
    REQUIRE(alloc.allocate(1000, 0x10, &b, /*async=*/true) == Status::kOk);  // hit
    REQUIRE(alloc.allocate(3 * kMiB, kNoStream, &c) == Status::kOk);
    DevicePtr big = 0;
    CHECK(alloc.allocate(512 * kMiB, kNoStream, &big) == Status::kOutOfMemory);
    REQUIRE(alloc.free(b, FreeOrder::kCompleted, 0x10, true) == Status::kOk);
    REQUIRE(alloc.free(c, FreeOrder::kCompleted) == Status::kOk);
    alloc.release_cached();
    alloc.set_observer(nullptr);

    AllocatorEvent pt{};
    pt.kind = EventKind::kPassthroughAlloc;
    pt.device = 1;
    pt.stream = kNoStream;
    pt.ptr = 0xabc000;
    pt.requested = pt.rounded = 4096;
    w->on_event(pt);
    w->flush();
    CHECK(w->written_total() > 0);
    CHECK(w->dropped_total() == 0);
  }
  auto rows = records(path);
  std::vector<std::string> kinds;
  for (auto& r : rows) kinds.push_back(r["event"]);
  std::vector<std::string> want = {"segment_alloc", "alloc", "free", "alloc", "segment_alloc",
                                   "alloc", "oom", "free", "free", "segment_free",
                                   "segment_free", "cache_release", "passthrough_alloc"};
  // The allocator releases idle segments while fighting the OOM; compare the stable parts.
  auto stable = [](const std::string& k) { return k != "segment_free" && k != "cache_release"; };
  std::vector<std::string> core;
  for (auto& k : kinds) {
    if (stable(k)) core.push_back(k);
  }
  std::vector<std::string> want_core;
  for (auto& k : want) {
    if (stable(k)) want_core.push_back(k);
  }
  CHECK(kinds[kinds.size() - 2] == "cache_release");
  CHECK(core == want_core);
  CHECK(only(rows, "segment_free").size() == only(rows, "segment_alloc").size());

  const std::string pid = std::to_string(::getpid());
  std::int64_t last_ts = -1;
  for (auto& r : rows) {
    CHECK(r["pid"] == pid);
    CHECK(std::stoll(r["ts_ns"]) >= last_ts);
    last_ts = std::stoll(r["ts_ns"]);
    if (r["event"] != "passthrough_alloc") CHECK(r["device"] == "3");
  }
  auto allocs = only(rows, "alloc");
  REQUIRE(allocs.size() == 3);
  CHECK(allocs[0]["stream"] == "0x10");
  CHECK(allocs[0]["requested"] == "1000");
  CHECK(allocs[0]["rounded"] == "1024");
  CHECK(allocs[0]["hit"] == "0");
  CHECK(allocs[0]["result"] == "ok");
  CHECK(allocs[0]["extra"] == "");
  CHECK(allocs[1]["hit"] == "1");
  CHECK(allocs[1]["extra"] == "async=1");
  CHECK(allocs[1]["ptr"] == allocs[0]["ptr"]);  // the cached block came back
  CHECK(allocs[2]["stream"] == "-");
  CHECK(allocs[2]["requested"] == std::to_string(3 * kMiB));
  CHECK(std::stoull(allocs[2]["allocated"]) == 1024 + std::stoull(allocs[2]["rounded"]));
  CHECK(std::stoull(allocs[2]["reserved"]) >= std::stoull(allocs[2]["allocated"]));

  auto oom = only(rows, "oom");
  REQUIRE(oom.size() == 1);
  CHECK(oom[0]["result"] == "out_of_memory");
  CHECK(oom[0]["ptr"] == "0x0");
  CHECK(oom[0]["requested"] == std::to_string(512 * kMiB));

  auto frees = only(rows, "free");
  CHECK(frees[1]["extra"] == "async=1");
  CHECK(frees.back()["allocated"] == "0");
  auto rel = only(rows, "cache_release");
  REQUIRE(!rel.empty());
  CHECK(rel.back()["reserved"] == "0");
  CHECK(rel.back()["allocated"] == "0");
  auto pt = only(rows, "passthrough_alloc");
  REQUIRE(pt.size() == 1);
  CHECK(pt[0]["device"] == "1");
  CHECK(pt[0]["ptr"] == "0xabc000");
  CHECK(pt[0]["stream"] == "-");
}

TEST_CASE("many threads at once: no lost and no torn lines") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
  std::set<std::string> tids;
  {
    TraceOptions o;
    o.ring_capacity = std::size_t{1} << 15;  // per thread: room for all 20000
    auto w = TraceWriter::open(path, o);
    REQUIRE(w != nullptr);
    std::vector<std::thread> threads;
    std::atomic<bool> go{false};
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        while (!go.load()) {
        }
        for (int i = 0; i < kPerThread; ++i) {
          w->on_event(event((std::uint64_t(t) << 32) | std::uint64_t(i)));
        }
      });
    }
    go = true;
    for (auto& th : threads) th.join();
    w->flush();
    CHECK(w->dropped_total() == 0);
    CHECK(w->written_total() == std::uint64_t(kThreads) * kPerThread);
  }
  auto rows = records(path);  // REQUIREs 14 fields on every line
  REQUIRE(rows.size() == std::size_t(kThreads) * kPerThread);
  std::set<std::string> ptrs;
  for (auto& r : rows) {
    ptrs.insert(r["ptr"]);
    tids.insert(r["tid"]);
    CHECK(r["requested"] == "100");
  }
  CHECK(ptrs.size() == rows.size());
  CHECK(tids.size() == kThreads);
  CHECK(only(rows, "dropped").empty());
  // Each thread has its own lane; the writer merges them by time. A thread's own records are
  // in order. Across threads, only a thread preempted between taking its timestamp and queueing
  // the record can land behind a later one (causal order is the next test's): rare.
  std::map<std::string, std::int64_t> last_of_thread;
  std::size_t thread_order_broken = 0, inversions = 0;
  std::int64_t last = -1;
  for (auto& r : rows) {
    const std::int64_t ts = std::stoll(r["ts_ns"]);
    auto it = last_of_thread.find(r["tid"]);
    if (it != last_of_thread.end() && ts < it->second) ++thread_order_broken;
    last_of_thread[r["tid"]] = ts;
    if (ts < last) ++inversions;
    last = std::max(last, ts);
  }
  CHECK(thread_order_broken == 0);
  CHECK(inversions * 100 < rows.size());
}

TEST_CASE("an event handed between threads is written after the one that caused it") {
  // Two threads take turns: each records step i, then lets the other record step i+1, as a
  // free on one thread lets another thread allocate the same block. The writer drains both
  // lanes while they run; the file must list the steps in causal order.
  TempDir dir;
  const std::string path = dir / "t.csv";
  constexpr int kSteps = 20000;
  {
    auto w = TraceWriter::open(path, TraceOptions{});
    REQUIRE(w != nullptr);
    std::atomic<int> turn{0};
    auto player = [&](int me) {
      for (int i = me; i < kSteps; i += 2) {
        while (turn.load(std::memory_order_acquire) != i) {
        }
        w->on_event(event(0x1000 + i, i % 2 == 0 ? EventKind::kFree : EventKind::kAlloc));
        turn.store(i + 1, std::memory_order_release);
      }
    };
    std::thread a(player, 0), b(player, 1);
    a.join();
    b.join();
    w->flush();
    REQUIRE(w->dropped_total() == 0);
  }
  auto rows = records(path);
  REQUIRE(rows.size() == std::size_t(kSteps));
  std::size_t misplaced = 0;
  for (int i = 0; i < kSteps; ++i) {
    if (rows[i]["ptr"] != hex(0x1000 + i)) ++misplaced;
  }
  CHECK(misplaced == 0);
}

TEST_CASE("a lane never stamps a record before the one it holds before it") {
  // Local events are stamped without a fence (TraceClock::stamp_local): an earlier reading can
  // come back; the lane raises it so a thread's records stay in time order.
  TraceLane lane(8, 0, 0);
  CHECK(lane.order_stamp(100) == 100);
  CHECK(lane.order_stamp(90) == 100);
  CHECK(lane.order_stamp(101) == 101);
  CHECK(lane.order_stamp(101) == 101);
  CHECK(lane.order_stamp(5) == 101);
}

TEST_CASE("local and fenced records of one thread keep its order") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  constexpr int kRecords = 5000;
  {
    auto w = TraceWriter::open(path, TraceOptions{});
    REQUIRE(w != nullptr);
    for (int i = 0; i < kRecords; ++i) {
      AllocatorEvent e = event(0x1000 + i, i % 2 == 0 ? EventKind::kAlloc : EventKind::kFree);
      e.local = i % 3 != 0;
      w->on_event(e);
    }
    w->flush();
    REQUIRE(w->dropped_total() == 0);
  }
  auto rows = records(path);
  REQUIRE(rows.size() == std::size_t(kRecords));
  std::int64_t last = -1;
  for (int i = 0; i < kRecords; ++i) {
    CHECK(rows[i]["ptr"] == hex(0x1000 + i));
    const std::int64_t ts = std::stoll(rows[i]["ts_ns"]);
    CHECK(ts >= last);
    last = ts;
  }
}

TEST_CASE("lanes of exited threads are reused once drained") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  constexpr int kThreads = 64;
  {
    auto w = TraceWriter::open(path, TraceOptions{});
    REQUIRE(w != nullptr);
    for (int t = 0; t < kThreads; ++t) {
      std::thread th([&, t] {
        for (int i = 0; i < 10; ++i) w->on_event(event((std::uint64_t(t) << 32) | i));
      });
      th.join();
      w->flush();  // drains the exited thread's lane, which frees it
    }
    CHECK(w->lanes_for_testing() <= 2);
  }
  auto rows = records(path);
  CHECK(rows.size() == std::size_t(kThreads) * 10);
}

TEST_CASE("a full ring drops, counts and never blocks") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  {
    TraceOptions o;
    o.ring_capacity = 16;
    auto w = TraceWriter::open(path, o);
    REQUIRE(w != nullptr);
    w->pause_writer_for_testing(true);  // the writer thread is stalled
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000; ++i) w->on_event(event(0x1000 + i));
    auto took = std::chrono::steady_clock::now() - t0;
    CHECK(took < std::chrono::milliseconds(500));
    CHECK(w->dropped_total() == 1000 - 16);
    w->flush();
    // After the drain there is room again.
    for (int i = 0; i < 10; ++i) w->on_event(event(0x9000 + i));
    w->flush();
    CHECK(w->dropped_total() == 1000 - 16);
  }
  auto rows = records(path);
  auto dropped = only(rows, "dropped");
  REQUIRE(dropped.size() == 1);
  CHECK(dropped[0]["extra"] == "count=984");
  CHECK(dropped[0]["device"] == "-1");
  CHECK(only(rows, "alloc").size() == 26);
  // The drop is reported after the records kept before it, before the later ones.
  CHECK(rows[16]["event"] == "dropped");
  CHECK(rows[17]["ptr"] == "0x9000");
  CHECK(read_lines(path).back() == "# end records=26 dropped=984");
}

TEST_CASE("the background writer drains a small ring under a steady stream") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  std::uint64_t dropped = 0;
  std::uint64_t sent = 0;
  {
    TraceOptions o;
    o.ring_capacity = 64;
    auto w = TraceWriter::open(path, o);
    REQUIRE(w != nullptr);
    for (int i = 0; i < 20000; ++i) {
      w->on_event(event(i));
      ++sent;
      if (i % 32 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    dropped = w->dropped_total();
  }
  auto rows = records(path);
  std::uint64_t counted = 0;
  for (auto& r : only(rows, "dropped")) counted += std::stoull(r["extra"].substr(6));
  CHECK(counted == dropped);
  CHECK(only(rows, "alloc").size() + dropped == sent);
}

TEST_CASE("NVTX ranges and native stacks go into extra") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  {
    TraceOptions o;
    o.nvtx = true;
    o.stack_depth = 4;
    auto w = TraceWriter::open(path, o);
    REQUIRE(w != nullptr);
    w->on_event(event(0x100));  // no hook yet: no nvtx
    TraceWriter::set_nvtx_hook(&nvtx_forward);
    w->on_event(event(0x200));
    TraceWriter::set_nvtx_hook(nullptr);
  }
  auto rows = records(path);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["extra"].find("nvtx=") == std::string::npos);
  const std::string& ex = rows[1]["extra"];
  CHECK(ex.rfind("nvtx=forward/layer_1;stack=0x", 0) == 0);
  auto stack = ex.substr(ex.find("stack=") + 6);
  auto pcs = split(stack, '/');
  CHECK(pcs.size() >= 1);
  CHECK(pcs.size() <= 4);
  bool maps = false;
  for (auto& l : read_lines(path)) {
    if (l.rfind("#map ", 0) == 0 && l.find("test_trace_writer") != std::string::npos) maps = true;
  }
  CHECK(maps);
}

TEST_CASE("processes sharing a path each get their own file") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  auto w = TraceWriter::open(path, {});
  REQUIRE(w != nullptr);
  REQUIRE(w->file_path() == path);
  w->on_event(event(0x1));

  std::vector<pid_t> kids;
  for (int k = 0; k < 3; ++k) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // A process of its own (as if exec'd) given the same path while the parent runs.
      auto mine = TraceWriter::open(path, {});
      if (!mine || mine->file_path() != path + "." + std::to_string(::getpid())) ::_exit(3);
      for (int i = 0; i < 100; ++i) mine->on_event(event(0xc000 + k * 1000 + i));
      mine.reset();
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
  }
  w.reset();

  auto parent = records(path);
  REQUIRE(parent.size() == 1);
  CHECK(parent[0]["ptr"] == "0x1");
  for (std::size_t k = 0; k < kids.size(); ++k) {
    auto rows = records(path + "." + std::to_string(kids[k]));
    REQUIRE(rows.size() == 100);
    CHECK(rows[0]["pid"] == std::to_string(kids[k]));
    CHECK(rows[0]["ptr"] == hex(0xc000 + k * 1000));
  }
}

TEST_CASE("fork children get path.PID with only their own records") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  auto w = TraceWriter::open(path, {});
  REQUIRE(w != nullptr);
  w->pause_writer_for_testing(true);
  w->on_event(event(0x2));  // queued in the parent at fork time
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    w->after_fork_child();
    w->pause_writer_for_testing(false);
    for (int i = 0; i < 50; ++i) w->on_event(event(0xc000 + i));
    w.reset();
    ::_exit(0);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  REQUIRE(WIFEXITED(st));
  w->pause_writer_for_testing(false);
  w.reset();
  auto parent = records(path);
  REQUIRE(parent.size() == 1);
  CHECK(parent[0]["ptr"] == "0x2");
  const std::string p = path + "." + std::to_string(pid);
  auto kid = records(p);
  REQUIRE(kid.size() == 50);
  for (auto& r : kid) CHECK(r["pid"] == std::to_string(pid));
  CHECK(kid[0]["ptr"] == "0xc000");
  auto lines = read_lines(p);
  CHECK(lines[2].rfind("# pid=" + std::to_string(pid) + " ppid=" + std::to_string(::getpid()), 0) ==
        0);
}

TEST_CASE("a process killed while tracing leaves a trace every reader accepts") {
  const char* script = std::getenv("CUDALLOC_TRACE_SCRIPT");
  const char* python = std::getenv("PYTHON");
  if (script == nullptr || python == nullptr) {
    WARN("CUDALLOC_TRACE_SCRIPT/PYTHON not set: run through meson test");
    return;
  }
  TempDir dir;
  const std::string path = dir / "t.csv";
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    SimBackend sim(SimOptions{.total_memory = 1 * kGiB, .host_memory = false});
    DeviceAllocator alloc(sim, AllocatorOptions{});
    TraceOptions o;
    o.ring_capacity = 1024;
    auto w = TraceWriter::open(path, o);
    if (!w) ::_exit(3);
    alloc.set_observer(w.get());
    std::vector<DevicePtr> live;
    for (std::uint64_t i = 0;; ++i) {
      DevicePtr p = 0;
      if (alloc.allocate(512 + (i * 7919) % (4 * kMiB), 0x10, &p) == Status::kOk) live.push_back(p);
      if (live.size() > 64) {
        alloc.free(live.front(), FreeOrder::kCompleted);
        live.erase(live.begin());
      }
    }
  }
  // Let it write a few chunks, then kill it mid-stream.
  struct stat st{};
  for (int i = 0; i < 500; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (::stat(path.c_str(), &st) == 0 && st.st_size > 3 * 1024 * 1024) break;
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(::stat(path.c_str(), &st) == 0);
  REQUIRE(st.st_size > 0);

  // Cut the file in the middle of a line as well, as a kill inside write(2) would.
  const std::string cut = dir / "cut.csv";
  std::system(("head -c " + std::to_string(st.st_size - 7) + " '" + path + "' > '" + cut + "'")
                  .c_str());
  for (const std::string& f : {path, cut}) {
    int rc = 0;
    std::string out = run_capture(std::string(python) + " " + script + " summary '" + f + "'", &rc);
    INFO(out);
    CHECK(rc == 0);
    CHECK(out.find("peak allocated") != std::string::npos);
    CHECK(out.find("Traceback") == std::string::npos);
  }
}

namespace {
void previous_term_handler(int) { ::_exit(42); }
}  // namespace

TEST_CASE("a fatal signal flushes the queued records, then the previous action runs") {
  TempDir dir;
  // SIGTERM twice: once with the default action before us, once with a program's own handler.
  struct Case {
    int sig;
    bool own_handler;
  };
  for (Case c : {Case{SIGTERM, false}, Case{SIGABRT, false}, Case{SIGSEGV, false},
                 Case{SIGTERM, true}}) {
    const std::string path =
        dir / ("sig" + std::to_string(c.sig) + (c.own_handler ? "h" : "") + ".csv");
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (int s : {SIGSEGV, SIGABRT, SIGBUS, SIGTERM, SIGINT}) ::signal(s, SIG_DFL);  // not Catch's
      if (c.own_handler) ::signal(c.sig, &previous_term_handler);
      auto w = TraceWriter::open(path, {});
      if (!w) ::_exit(3);
      w->install_fatal_signal_flush();
      w->pause_writer_for_testing(true);  // nothing reaches the file but through the handler
      for (int i = 0; i < 100; ++i) w->on_event(event(0x5000 + i));
      if (c.sig == SIGSEGV) {
        volatile int* null = nullptr;
        *null = 1;
      }
      ::raise(c.sig);
      ::_exit(4);  // not reached: the default action ends the process
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    INFO("signal " << c.sig << (c.own_handler ? " with the program's handler" : ""));
    if (c.own_handler) {
      REQUIRE(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 42);
    } else {
      REQUIRE(WIFSIGNALED(status));
      CHECK(WTERMSIG(status) == c.sig);
    }
    auto rows = records(path);
    CHECK(rows.size() == 100);
    CHECK(read_lines(path).back() == "# signal " + std::to_string(c.sig));
  }
}

TEST_CASE("a symlink or a non-regular file at the path is refused, never followed") {
  TempDir dir;
  const std::string target = dir / "target";
  { std::ofstream(target) << "keep\n"; }
  const std::string link = dir / "link.csv";
  REQUIRE(::symlink(target.c_str(), link.c_str()) == 0);
  std::string err;
  auto w = TraceWriter::open(link, {}, &err);
  CHECK(w == nullptr);
  CHECK(err.find("symbolic link") != std::string::npos);
  CHECK(read_lines(target) == std::vector<std::string>{"keep"});

  err.clear();
  CHECK(TraceWriter::open(dir.path, {}, &err) == nullptr);  // a directory
  CHECK(!err.empty());
  const std::string fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  err.clear();
  CHECK(TraceWriter::open(fifo, {}, &err) == nullptr);  // and it does not hang
  CHECK(!err.empty());
  err.clear();
  CHECK(TraceWriter::open(dir / "no/such/dir/t.csv", {}, &err) == nullptr);
  CHECK(err.find("cannot be created: No such file or directory") != std::string::npos);
}

TEST_CASE("a second run overwrites the trace of the first") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  {
    auto w = TraceWriter::open(path, {});
    for (int i = 0; i < 10; ++i) w->on_event(event(i));
  }
  {
    auto w = TraceWriter::open(path, {});
    REQUIRE(w->file_path() == path);
    w->on_event(event(0x77));
  }
  auto rows = records(path);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0]["ptr"] == "0x77");
}

namespace {
// A file system that takes `g_room` more bytes, then refuses with ENOSPC (a partial write
// first, as a real one does at the boundary).
std::atomic<long> g_room{-1};  // -1: no limit
std::atomic<long> g_refused{0};
std::vector<std::string> g_messages;
void keep_message(const char* m) noexcept { g_messages.emplace_back(m); }
ssize_t full_disk_write(int fd, const void* data, std::size_t n) {
  long room = g_room.load();
  if (room < 0) return ::write(fd, data, n);
  if (room == 0) {
    g_refused.fetch_add(1);
    errno = ENOSPC;
    return -1;
  }
  const std::size_t take = std::min<std::size_t>(n, static_cast<std::size_t>(room));
  const ssize_t w = ::write(fd, data, take);
  if (w > 0) g_room.fetch_sub(w);
  return w;
}
}  // namespace

TEST_CASE("a full disk loses records whole, counts them in the trace and the reader says so") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  TraceWriter::set_write_for_testing(&full_disk_write);
  g_room = -1;
  g_refused = 0;
  constexpr int kBefore = 40, kDuring = 300, kAfter = 25;
  std::uint64_t lost = 0;
  {
    auto w = TraceWriter::open(path, {});
    REQUIRE(w != nullptr);
    w->pause_writer_for_testing(true);
    for (int i = 0; i < kBefore; ++i) w->on_event(event(0x1000 + i));
    w->flush();
    // Room for a few records and part of one more: the write is cut mid-line.
    struct stat st{};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    const std::size_t line = read_lines(path).back().size() + 1;
    g_room = static_cast<long>(line * 3 + line / 2);
    for (int i = 0; i < kDuring; ++i) w->on_event(event(0x100000 + i));
    w->flush();
    CHECK(g_refused.load() > 0);
    lost = w->lost_total();
    CHECK(lost > 0);
    CHECK(lost < std::uint64_t(kDuring));
    // The file still ends with a whole line: the cut record is gone, not half there.
    {
      std::ifstream in(path, std::ios::binary);
      std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      REQUIRE(!all.empty());
      CHECK(all.back() == '\n');
    }
    g_room = -1;  // space returns
    for (int i = 0; i < kAfter; ++i) w->on_event(event(0x200000 + i));
    w->flush();
    CHECK(w->lost_total() == lost);
  }
  TraceWriter::set_write_for_testing(nullptr);
  auto rows = records(path);  // every line parses: no torn record
  CHECK(only(rows, "alloc").size() == std::size_t(kBefore + kDuring + kAfter) - lost);
  auto dropped = only(rows, "dropped");
  REQUIRE(dropped.size() == 1);
  CHECK(dropped[0]["extra"] == "count=" + std::to_string(lost) + ";reason=disk_full");
  // The count comes once space returned, right after the first lines written again.
  CHECK(read_lines(path).back() == "# end records=" + std::to_string(kBefore + kDuring + kAfter) +
                                       " dropped=0 lost=" + std::to_string(lost));

  const char* script = std::getenv("CUDALLOC_TRACE_SCRIPT");
  const char* python = std::getenv("PYTHON");
  if (script == nullptr || python == nullptr) {
    WARN("CUDALLOC_TRACE_SCRIPT/PYTHON not set: run through meson test");
    return;
  }
  int status = 0;
  const std::string out = run_capture(std::string(python) + " " + script + " summary " + path, &status);
  INFO(out);
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(out.find(std::to_string(lost) + " records lost: disk full") != std::string::npos);
  CHECK(out.find("truncated") == std::string::npos);
}

TEST_CASE("a disk still full at exit: the file ends with whole lines and the loss is logged") {
  TempDir dir;
  const std::string path = dir / "t.csv";
  TraceWriter::set_write_for_testing(&full_disk_write);
  g_room = -1;
  std::uint64_t lost = 0;
  g_messages.clear();
  TraceWriter::set_message_hook(&keep_message);
  {
    auto w = TraceWriter::open(path, {});
    REQUIRE(w != nullptr);
    w->pause_writer_for_testing(true);
    g_room = 100;  // less than the next chunk, and the end line later finds none
    for (int i = 0; i < 50; ++i) w->on_event(event(0x1000 + i));
    w->flush();
    lost = w->lost_total();
    CHECK(lost > 0);
  }
  TraceWriter::set_write_for_testing(nullptr);
  TraceWriter::set_message_hook(nullptr);
  g_room = -1;
  // Said once when the first write was refused, and the count at the end.
  REQUIRE(g_messages.size() == 2);
  CHECK(g_messages[0].find("No space left on device") != std::string::npos);
  CHECK(g_messages[1] == "trace " + path + ": " + std::to_string(lost) + " records lost: disk full");
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(!all.empty());
  CHECK(all.back() == '\n');
  CHECK(only(records(path), "alloc").size() == 50 - lost);
}
