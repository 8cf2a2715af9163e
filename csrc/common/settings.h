// Environment settings. Each one is declared once, in the file that uses it:
//
//   BRAID_SETTING_INT(kSlotBytes, "BRAID_SHM_SLOT_BYTES", 1 << 20,
//                     "Bytes of data in each shared-memory slot.");
//   ...
//   size_t n = kSlotBytes.get();
//
// Declaration registers the setting, so `python -m torch_braid.info` can list
// every one with its default and doc. get() reads the environment each call;
// callers call it when a group is created (logging and the kernels' SIMD
// level: once per process) and keep the value, never per op, so a process
// sweeps a setting by making a new group per value. A setting that changes the steps an op takes
// must also be equal on every rank and be compared between them, see
// Note [Settings that shape an op] (collectives/shm/plan.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace braid {

struct SettingInfo {
  const char* name;
  const char* type;  // "int", "bool", "string", "secret" (its value is never shown)
  std::string defaultValue;
  const char* doc;
  const char* formerly = nullptr;    // its former name (Note [Renamed settings])
  std::string currentValue() const;  // the environment's value, or the default
};

// Every setting declared in the loaded libraries, sorted by name.
std::vector<SettingInfo> allSettings();

namespace detail {
void registerSetting(const SettingInfo& info);
}

// Note [Renamed settings]
// A setting that was renamed keeps its former name: get() still reads it
// when the new one is unset, and says so once per process (a warning naming
// both), so that a script written for the old name keeps its meaning and
// learns the new one. When both are set, the new one wins, and the warning
// says the old one is ignored.
class IntSetting {
 public:
  IntSetting(const char* name, int64_t def, const char* doc, const char* formerly = nullptr);
  int64_t get() const;
  const char* name() const { return name_; }

 private:
  const char* name_;
  int64_t default_;
  const char* formerly_;  // Note [Renamed settings]
};

class BoolSetting {
 public:
  BoolSetting(const char* name, bool def, const char* doc);
  bool get() const;

 private:
  const char* name_;
  bool default_;
};

class StringSetting {
 public:
  StringSetting(const char* name, const char* def, const char* doc, bool secret = false);
  std::string get() const;

 private:
  const char* name_;
  const char* default_;
};

}  // namespace braid

#define BRAID_SETTING_INT(var, name, def, doc) static const ::braid::IntSetting var(name, def, doc)
// An int setting whose former name is still read (Note [Renamed settings]).
#define BRAID_SETTING_INT_RENAMED(var, name, formerly, def, doc) \
  static const ::braid::IntSetting var(name, def, doc, formerly)
#define BRAID_SETTING_BOOL(var, name, def, doc) static const ::braid::BoolSetting var(name, def, doc)
#define BRAID_SETTING_STRING(var, name, def, doc) \
  static const ::braid::StringSetting var(name, def, doc)
// A string whose value currentValue() (and so torch_braid.info) never shows.
#define BRAID_SETTING_SECRET(var, name, doc) static const ::braid::StringSetting var(name, "", doc, true)
