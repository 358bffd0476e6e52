// The key table (config/config_keys.h) against what the parser and describe() do, so that
// README's table, which is printed from it, says what cudalloc does.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "config/config.h"
#include "config/config_keys.h"

using namespace cudalloc;

TEST_CASE("each key's default is what describe() prints for a default configuration", "[config]") {
  const std::string line = " " + describe(Config{});
  for (const ConfigKey& k : config_keys()) {
    INFO(k.name);
    CHECK(line.find(" " + std::string(k.name) + "=" + std::string(k.default_text) + " ") != std::string::npos);
  }
}

TEST_CASE("each key is named once, and its README form starts with its name", "[config]") {
  std::set<std::string_view> names;
  for (const ConfigKey& k : config_keys()) {
    INFO(k.name);
    CHECK(names.insert(k.name).second);
    CHECK(k.syntax.starts_with("`" + std::string(k.name) + ":"));
    CHECK(!k.help.empty());
  }
  CHECK(names.size() < 32);  // the parser's bit set of keys seen
}

TEST_CASE("the accepted keys are listed in the table's order", "[config]") {
  std::string listed;
  for (const ConfigKey& k : config_keys()) listed += (listed.empty() ? "" : ", ") + std::string(k.name);
  CHECK(accepted_keys() == listed);
  const std::string e = parse_alloc_conf("bogus:1").error;
  CHECK(e.ends_with("accepted keys: " + listed));
}

TEST_CASE("the table has one row per key", "[config]") {
  const std::string table = config_table();
  std::size_t rows = 0;
  for (char c : table) rows += c == '\n';
  CHECK(rows == config_keys().size() + 2);
  CHECK(table.starts_with("| key | default | meaning |\n| --- | --- | --- |\n"));
}
