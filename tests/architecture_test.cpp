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

TEST_CASE("the dependency check catches a forbidden include") {
  // The checker itself: an include of persistence/ from durable/ is found.
  auto used = included_modules("#include \"troupe/persistence/storage.hpp\"\n"
                               "#include <troupe/messages/errc.hpp>\n");
  CHECK(used == std::set<std::string>{"messages", "persistence"});
  CHECK(allowed.at("durable").count("persistence") == 0);
  CHECK(included_modules("#include <troupe/troupe.hpp>").size() == allowed.size());
}
