#include <algorithm>
#include <fstream>
#include <set>
#include <string>

#include <caf/sec.hpp>
#include <catch2/catch.hpp>

#include <troupe/messages/errc.hpp>
#include <troupe/runtime/config.hpp>

using troupe::errc;

namespace {

const errc all_codes[] = {
    errc::config_not_json,
    errc::config_unknown_key,
    errc::config_wrong_type,
    errc::config_out_of_range,
    errc::config_unreadable,
    errc::runtime_stopped,
    errc::runtime_start_failed,
    errc::stalled,
    errc::empty_body,
    errc::task_failed,
    errc::already_awaited,
    errc::foreign_task,
    errc::cancelled,
    errc::invalid_handle,
    errc::blocking_failed,
    errc::invalid_argument,
};

} // namespace

TEST_CASE("every troupe error has a unique stable code, a name and a description") {
  std::set<std::string> codes;
  std::set<std::string> names;
  for (auto x : all_codes) {
    auto code = std::string{troupe::code_of(x)};
    CHECK(code.rfind("TROUPE-", 0) == 0);
    CHECK(code != "TROUPE-UNKNOWN");
    CHECK(codes.insert(code).second);
    CHECK(names.insert(std::string{troupe::name_of(x)}).second);
    CHECK(troupe::describe(x) != "unknown troupe error");
  }
  // The codes are a public contract: spot-check that they never move.
  CHECK(troupe::code_of(errc::config_not_json) == "TROUPE-CFG-001");
  CHECK(troupe::code_of(errc::config_unknown_key) == "TROUPE-CFG-002");
  CHECK(troupe::code_of(errc::runtime_stopped) == "TROUPE-RT-001");
  CHECK(troupe::code_of(errc::empty_body) == "TROUPE-TSK-001");
  CHECK(troupe::code_of(errc::cancelled) == "TROUPE-TSK-005");
  CHECK(static_cast<int>(errc::cancelled) == 44);
}

TEST_CASE("an error names its field, keeps its detail and renders with its code") {
  auto e = troupe::make_error(errc::config_unknown_key, "treads", "unknown key");
  CHECK(troupe::is(e, errc::config_unknown_key));
  CHECK_FALSE(troupe::is(e, errc::config_wrong_type));
  CHECK(troupe::field_of(e) == "treads");
  CHECK(troupe::detail_of(e) == "unknown key");
  CHECK(troupe::render(e) == "TROUPE-CFG-002 config_unknown_key: field \"treads\": unknown key");
  caf::error plain = errc::cancelled;
  CHECK(troupe::is_cancellation(plain));
  CHECK(troupe::render(plain) == "TROUPE-TSK-005 cancelled");
}

TEST_CASE("errors of other categories render through CAF and carry no troupe field") {
  caf::error e = caf::sec::request_timeout;
  CHECK_FALSE(troupe::is(e, errc::cancelled));
  CHECK(troupe::field_of(e).empty());
  CHECK(troupe::render(e).find("request_timeout") != std::string::npos);
  CHECK(troupe::render(caf::error{}) == "none");
}

TEST_CASE("the error table documents every code, and no stale one") {
  std::ifstream in{std::string{TROUPE_SOURCE_DIR} + "/docs/errors.md"};
  REQUIRE(in);
  std::set<std::string> documented;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| TROUPE-", 0) != 0) continue;
    auto code = line.substr(2, line.find(' ', 2) - 2);
    CHECK(documented.insert(code).second); // one row per code
    // The row names the errc and its value as the code says.
    for (auto x : troupe::every_errc())
      if (troupe::code_of(x) == code) {
        INFO(line);
        CHECK(line.find("`" + std::string{troupe::name_of(x)} + "` (" +
                        std::to_string(static_cast<int>(x)) + ")") != std::string::npos);
      }
  }
  std::set<std::string> defined;
  for (auto x : troupe::every_errc()) {
    auto code = std::string{troupe::code_of(x)};
    defined.insert(code);
    INFO(code);
    CHECK(documented.count(code) == 1);
  }
  for (auto& code : documented) {
    INFO(code);
    CHECK(defined.count(code) == 1); // no stale row
  }
}

TEST_CASE("the error helpers answer false or empty for an empty (no-error) caf::error") {
  caf::error none;
  CHECK_FALSE(troupe::is(none, errc::cancelled));
  CHECK_FALSE(troupe::is_cancellation(none));
  CHECK(troupe::field_of(none).empty());
  CHECK(troupe::detail_of(none).empty());
  CHECK(troupe::errors_of(none).empty());
  CHECK(troupe::render(none) == "none");
}


TEST_CASE("the config error row lists every key the configuration takes, and each is taken") {
  std::ifstream in{std::string{TROUPE_SOURCE_DIR} + "/docs/errors.md"};
  REQUIRE(in);
  std::string line, row;
  while (std::getline(in, line))
    if (line.rfind("| TROUPE-CFG-002 ", 0) == 0) row = line;
  REQUIRE(!row.empty());
  auto listed = row.substr(row.find("any key outside `"));
  listed = listed.substr(0, listed.find('`', 17) + 1);
  size_t n = 0;
  for (auto k : troupe::runtime_config::keys()) {
    INFO(k);
    CHECK(listed.find(std::string{k}) != std::string::npos);
    ++n;
    // accepted: never config_unknown_key (a value of the wrong type is another error)
    auto r = troupe::runtime_config::from_json("{\"" + std::string{k} + "\": null}");
    CHECK((r || !troupe::is(r.error(), errc::config_unknown_key)));
  }
  CHECK(n == static_cast<size_t>(std::count(listed.begin(), listed.end(), ',') + 1));
  auto bad = troupe::runtime_config::from_json(R"({"thread": 2})");
  REQUIRE(!bad);
  CHECK(troupe::is(bad.error(), errc::config_unknown_key));
  CHECK(troupe::field_of(bad.error()) == "thread");
  CHECK(troupe::render(bad.error()).find("session_channel_capacity") != std::string::npos);
}
