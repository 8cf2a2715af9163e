#include "common/settings.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "common/error.h"
#include "common/logging.h"

namespace braid {
namespace {

std::mutex& registryMutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, SettingInfo>& registry() {
  static std::map<std::string, SettingInfo> r;
  return r;
}

const char* envOrNull(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

}  // namespace

namespace detail {
void registerSetting(const SettingInfo& info) {
  std::lock_guard<std::mutex> lock(registryMutex());
  registry().emplace(info.name, info);
}
}  // namespace detail

std::string SettingInfo::currentValue() const {
  const char* v = envOrNull(name);
  if (v && std::strcmp(type, "secret") == 0) return "<hidden>";
  if (v) return v;
  const char* old = formerly ? envOrNull(formerly) : nullptr;  // Note [Renamed settings]
  return old ? strCat(old, " (from ", formerly, ")") : defaultValue;
}

std::vector<SettingInfo> allSettings() {
  std::lock_guard<std::mutex> lock(registryMutex());
  std::vector<SettingInfo> out;
  for (auto& kv : registry()) out.push_back(kv.second);
  return out;
}

IntSetting::IntSetting(const char* name, int64_t def, const char* doc, const char* formerly)
    : name_(name), default_(def), formerly_(formerly) {
  detail::registerSetting({name, "int", std::to_string(def), doc, formerly});
}

namespace {
// Once per process and former name (Note [Renamed settings]).
void sayRenamed(const char* formerly, const char* name, bool ignored) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  if (!said.insert(formerly).second) return;
  BRAID_LOG(kWarn, "settings", -1)
      << formerly << " was renamed " << name
      << (ignored ? ": both are set, so " + std::string(formerly) + " is ignored"
                  : ": its value is used; set " + std::string(name) + " instead");
}
}  // namespace

int64_t IntSetting::get() const {
  const char* v = envOrNull(name_);
  if (const char* old = formerly_ ? envOrNull(formerly_) : nullptr) {
    sayRenamed(formerly_, name_, v != nullptr);
    if (!v) v = old;
  }
  if (!v) return default_;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 0);
  // Accept K/M/G suffixes: sizes are the common case.
  if (end && *end) {
    switch (*end) {
      case 'k': case 'K': x <<= 10; ++end; break;
      case 'm': case 'M': x <<= 20; ++end; break;
      case 'g': case 'G': x <<= 30; ++end; break;
      default: break;
    }
  }
  if (end == v || (end && *end)) {
    throw Error(strCat("braid settings: ", name_, "='", v, "' is not an integer"));
  }
  return x;
}

BoolSetting::BoolSetting(const char* name, bool def, const char* doc) : name_(name), default_(def) {
  detail::registerSetting({name, "bool", def ? "1" : "0", doc});
}

bool BoolSetting::get() const {
  const char* v = envOrNull(name_);
  if (!v) return default_;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  throw Error(strCat("braid settings: ", name_, "='", v, "' is not a boolean (use 0 or 1)"));
}

StringSetting::StringSetting(const char* name, const char* def, const char* doc, bool secret)
    : name_(name), default_(def) {
  detail::registerSetting({name, secret ? "secret" : "string", def, doc});
}

std::string StringSetting::get() const {
  const char* v = envOrNull(name_);
  return v ? std::string(v) : std::string(default_);
}

}  // namespace braid
