#pragma once
// The PromQL that ships with Ferry (docs/grafana/ferry.json's queries, docs/prometheus/
// ferry-rules.yml's alerts) checked against what real daemons serve: every ferry_* name is a
// family a scrape declares, every label a query matches, groups by or shows is one those series
// carry (or Prometheus's own instance and job), and every value it matches with = is one they
// take. tests/prometheus/check_rules.py has promtool parse and evaluate the same text.

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace ferry::test {

/// What scrapes served: each family, its labels and the values each label took.
struct served_series {
  std::map<std::string, std::map<std::string, std::set<std::string>>> families;

  /// Add a scrape (Prometheus text format): a histogram's _bucket, _sum and _count lines count
  /// as its family's.
  void add(const std::string& text) {
    std::set<std::string> histograms;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("# TYPE ", 0) == 0) {
        const auto name = line.substr(7, line.find(' ', 7) - 7);
        families[name];
        if (line.ends_with(" histogram")) histograms.insert(name);
      }
      if (line.empty() || line[0] == '#') continue;
      const auto brace = line.find('{');
      std::string name = line.substr(0, std::min(brace, line.find(' ')));
      for (const std::string suffix : {"_bucket", "_count", "_sum"})
        if (name.ends_with(suffix) && histograms.count(name.substr(0, name.size() - suffix.size())))
          name.resize(name.size() - suffix.size());
      auto& labels = families[name];
      if (brace == std::string::npos) continue;
      static const std::regex pair("([A-Za-z_][A-Za-z0-9_]*)=\"([^\"]*)\"");
      const auto body = line.substr(brace, line.find('}', brace) - brace);
      for (std::sregex_iterator it(body.begin(), body.end(), pair), end; it != end; ++it)
        labels[(*it)[1]].insert((*it)[2]);
    }
  }
};

/// Why `expr` (and the labels `shown` by its legend or annotations) does not fit what was
/// served; empty when it fits.
inline std::vector<std::string> query_problems(const std::string& expr,
                                               const std::set<std::string>& shown,
                                               const served_series& served) {
  std::vector<std::string> out;
  std::set<std::string> allowed{"instance", "job"};  // added by Prometheus at the scrape
  static const std::regex selector("(^|[^A-Za-z0-9_:])(ferry_[A-Za-z0-9_]+)(\\{[^}]*\\})?");
  static const std::regex matcher("([A-Za-z_][A-Za-z0-9_]*)\\s*(=~|!~|!=|=)\\s*\"([^\"]*)\"");
  for (std::sregex_iterator it(expr.begin(), expr.end(), selector), end; it != end; ++it) {
    std::string name = (*it)[2];
    if (!served.families.count(name))
      for (const std::string suffix : {"_bucket", "_count", "_sum"})
        if (name.ends_with(suffix)) name.resize(name.size() - suffix.size());
    const auto f = served.families.find(name);
    if (f == served.families.end()) {
      out.push_back("no daemon serves " + std::string((*it)[2]));
      continue;
    }
    for (const auto& [label, values] : f->second) allowed.insert(label);
    const std::string braces = (*it)[3];
    for (std::sregex_iterator m(braces.begin(), braces.end(), matcher); m != end; ++m) {
      const auto l = f->second.find((*m)[1]);
      if (l == f->second.end())
        out.push_back(name + " has no label " + std::string((*m)[1]));
      else if ((*m)[2] == "=" && !l->second.count((*m)[3]))
        out.push_back(name + "'s label " + std::string((*m)[1]) + " never takes \"" +
                      std::string((*m)[3]) + "\"");
    }
  }
  std::set<std::string> used = shown;
  static const std::regex grouping(
      "\\b(by|without|on|ignoring|group_left|group_right)\\s*\\(([^)]*)\\)");
  static const std::regex word("[A-Za-z_][A-Za-z0-9_]*");
  for (std::sregex_iterator it(expr.begin(), expr.end(), grouping), end; it != end; ++it) {
    const std::string list = (*it)[2];
    for (std::sregex_iterator w(list.begin(), list.end(), word); w != end; ++w)
      used.insert(w->str());
  }
  for (const auto& l : used)
    if (!allowed.count(l)) out.push_back("no series of the query has the label " + l);
  return out;
}

/// The labels a text shows: Grafana's {{label}}, an alert's {{ $labels.label }}.
inline std::set<std::string> shown_labels(const std::string& text) {
  static const std::regex shown("\\{\\{\\s*(?:\\$labels\\.)?([A-Za-z_][A-Za-z0-9_]*)\\s*\\}\\}");
  std::set<std::string> out;
  for (std::sregex_iterator it(text.begin(), text.end(), shown), end; it != end; ++it)
    out.insert((*it)[1]);
  return out;
}

inline std::string source_file(const std::string& relative) {
  const char* dir = std::getenv("FERRY_SOURCE_DIR");
  std::ifstream f(std::string(dir ? dir : FERRY_DEFAULT_SOURCE_DIR) + "/" + relative);
  std::stringstream text;
  text << f.rdbuf();
  return text.str();
}

/// The shipped queries: {where, expression, labels shown}: each target of the dashboard's
/// panels (with its legend), each rule of docs/prometheus/ferry-rules.yml (with its
/// annotations; the file keeps each expr on one line).
struct shipped_query {
  std::string where, expr;
  std::set<std::string> shown;
};

}  // namespace ferry::test
