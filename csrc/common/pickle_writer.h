// A small writer of Python pickles (protocol 2) for the flight recorder's
// dumps: dicts, lists, tuples, str, int, float, bool and None, which is all
// that torch's flight-recorder layout uses. Values are written as they come
// (no object model, no memo), so a dump is built in one pass:
//
//   PickleWriter w;
//   w.beginDict();
//   w.str("version"); w.str("2.10");
//   w.str("entries"); w.beginList(); ... w.end();
//   w.end();
//   std::string bytes = w.finish();
//
// beginDict/beginList/beginTuple push a MARK; end() closes the innermost one
// with SETITEMS, APPENDS or TUPLE. Python's pickle.load reads the result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace braid {

class PickleWriter {
 public:
  PickleWriter();

  void none();
  void boolean(bool v);
  void integer(int64_t v);
  void real(double v);
  void str(const std::string& s);
  void str(const char* s);

  void beginDict();
  void beginList();
  void beginTuple();
  void end();

  // The pickle's bytes (adds STOP); the writer is spent afterwards.
  std::string finish();

 private:
  enum class Open : uint8_t { kDict, kList, kTuple };
  void op(char c) { out_.push_back(c); }
  void raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }

  std::string out_;
  std::vector<Open> open_;
};

}  // namespace braid
