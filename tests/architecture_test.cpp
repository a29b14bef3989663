// The module dependency rule (docs/architecture.md), checked on the sources so it cannot
// drift: a module includes only its own headers, messages/ and the modules the design
// allows it; its CMake target declares no other troupe module.

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include <troupe/messages/supervision.hpp>

namespace fs = std::filesystem;

namespace {

/// The module graph as designed: module -> the troupe modules it may use.
const std::map<std::string, std::set<std::string>> allowed{
    {"messages", {}},
    {"actors", {"messages"}},
    {"supervision", {"messages"}},
    {"persistence", {"messages"}},
    {"durable", {"messages", "actors"}},
    {"runtime", {"messages", "actors", "supervision", "persistence", "durable"}},
};

std::string slurp(const fs::path& p) {
  std::ifstream in{p};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Returns the troupe modules `text` includes (`troupe/<module>/...`; the umbrella
/// `troupe/troupe.hpp` counts as every module).
std::set<std::string> included_modules(const std::string& text) {
  std::set<std::string> out;
  static const std::regex inc{R"(#\s*include\s*[<"]troupe/([a-z_]+)(/|\.hpp))"};
  for (std::sregex_iterator i{text.begin(), text.end(), inc}, end; i != end; ++i) {
    auto m = (*i)[1].str();
    if (m == "troupe")
      for (auto& kvp : allowed)
        out.insert(kvp.first);
    else
      out.insert(m);
  }
  return out;
}

} // namespace

TEST_CASE("every module includes only itself, messages/ and the modules it may use") {
  fs::path root{TROUPE_SOURCE_DIR};
  size_t files = 0;
  for (auto& [module, deps] : allowed) {
    auto dir = root / module;
    REQUIRE(fs::is_directory(dir));
    for (auto& entry : fs::recursive_directory_iterator(dir)) {
      auto ext = entry.path().extension();
      if (ext != ".hpp" && ext != ".cpp") continue;
      ++files;
      for (auto& used : included_modules(slurp(entry.path()))) {
        INFO(entry.path().string() << " includes troupe/" << used << "/");
        CHECK((used == module || deps.count(used) == 1));
      }
    }
  }
  CHECK(files > 40); // the walk found the sources
}

TEST_CASE("every module's target declares only the troupe modules it may use") {
  fs::path root{TROUPE_SOURCE_DIR};
  static const std::regex dep{R"(troupe::([a-z_]+))"};
  for (auto& [module, deps] : allowed) {
    auto text = slurp(root / module / "CMakeLists.txt");
    REQUIRE(text.find("troupe_module(NAME " + module) != std::string::npos);
    std::set<std::string> declared;
    for (std::sregex_iterator i{text.begin(), text.end(), dep}, end; i != end; ++i)
      declared.insert((*i)[1].str());
    for (auto& d : declared) {
      INFO(module << "/CMakeLists.txt links troupe::" << d);
      CHECK(deps.count(d) == 1);
    }
  }
}

TEST_CASE("docs/architecture.md draws the module graph the rule enforces") {
  std::ifstream in{std::string{TROUPE_SOURCE_DIR} + "/docs/architecture.md"};
  REQUIRE(in);
  // The "in words" block: `<module>  ──▶ a, b, c   (+ notes)`.
  static const std::regex row{R"(^([a-z_]+)\s+──▶\s+([^(]*))"};
  std::map<std::string, std::set<std::string>> drawn;
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, row)) continue;
    auto& deps = drawn[m[1].str()];
    std::stringstream list{m[2].str()};
    std::string item;
    while (std::getline(list, item, ',')) {
      item.erase(0, item.find_first_not_of(' '));
      item.erase(item.find_last_not_of(' ') + 1);
      if (allowed.count(item) == 1) deps.insert(item); // CAF, fmt... are not modules
    }
  }
  CHECK(drawn == allowed);
}

TEST_CASE("the dependency check catches a forbidden include") {
  // The checker itself: an include of persistence/ from durable/ is found.
  auto used = included_modules("#include \"troupe/persistence/storage.hpp\"\n"
                               "#include <troupe/messages/errc.hpp>\n");
  CHECK(used == std::set<std::string>{"messages", "persistence"});
  CHECK(allowed.at("durable").count("persistence") == 0);
  CHECK(included_modules("#include <troupe/troupe.hpp>").size() == allowed.size());
}

TEST_CASE("docs/protocols.md lists every atom messages/ defines, and no stale one") {
  fs::path root{TROUPE_SOURCE_DIR};
  static const std::regex def{R"re(using (\w+_atom) = caf::atom_constant<caf::atom\("([^"]+)"\)>)re"};
  std::map<std::string, std::string> defined; // name -> text
  for (auto& entry : fs::recursive_directory_iterator(root / "messages")) {
    if (entry.path().extension() != ".hpp") continue;
    auto text = slurp(entry.path());
    for (std::sregex_iterator i{text.begin(), text.end(), def}, end; i != end; ++i)
      CHECK(defined.emplace((*i)[1].str(), (*i)[2].str()).second); // each defined once
  }
  CHECK(defined.size() > 60);
  // No atom is defined outside messages/ (a protocol constant lives there, once).
  for (auto& module : {"actors", "supervision", "persistence", "durable", "runtime"})
    for (auto& entry : fs::recursive_directory_iterator(root / module)) {
      auto ext = entry.path().extension();
      if (ext != ".hpp" && ext != ".cpp") continue;
      INFO(entry.path().string() << " defines an atom: move it to messages/");
      CHECK(slurp(entry.path()).find("caf::atom_constant<caf::atom(") == std::string::npos);
    }
  auto doc = slurp(root / "docs" / "protocols.md");
  static const std::regex row{R"(\| `(\w+_atom)` \| `([^`]+)` \|)"};
  std::map<std::string, std::string> documented;
  for (std::sregex_iterator i{doc.begin(), doc.end(), row}, end; i != end; ++i)
    documented.emplace((*i)[1].str(), (*i)[2].str());
  CHECK(documented == defined);
}

TEST_CASE("docs/supervision.md documents every supervisor event kind, and no stale one") {
  auto doc = slurp(fs::path{TROUPE_SOURCE_DIR} / "docs" / "supervision.md");
  static const std::regex row{R"(\n\| `([a-z_]+)` \| )"};
  std::set<std::string> documented;
  auto events = doc.substr(doc.find("### Events"));
  events = events.substr(0, events.find("\n### ", 4));
  for (std::sregex_iterator i{events.begin(), events.end(), row}, end; i != end; ++i)
    CHECK(documented.insert((*i)[1].str()).second);
  std::set<std::string> defined;
  for (auto k : troupe::every_supervisor_event_kind) {
    defined.insert(troupe::to_string(k));
    CHECK(troupe::parse_supervisor_event_kind(troupe::to_string(k)) == k);
  }
  CHECK(documented == defined);
  CHECK(defined.size() == 14);
}
