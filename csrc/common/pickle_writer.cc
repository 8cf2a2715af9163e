#include "common/pickle_writer.h"

#include <cstring>

#include "common/error.h"

namespace braid {

namespace {
// Opcodes of pickle protocols 0-2 (Python's Lib/pickle.py).
constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kMark = '(';
constexpr char kNone = 'N';
constexpr char kTrue = '\x88';
constexpr char kFalse = '\x89';
constexpr char kBinInt = 'J';  // 4-byte signed little-endian
constexpr char kLong1 = '\x8a';  // 1-byte length, two's complement little-endian
constexpr char kBinFloat = 'G';  // 8-byte big-endian double
constexpr char kBinUnicode = 'X';  // 4-byte length, UTF-8
constexpr char kEmptyDict = '}';
constexpr char kEmptyList = ']';
constexpr char kSetItems = 'u';
constexpr char kAppends = 'e';
constexpr char kTuple = 't';
}  // namespace

PickleWriter::PickleWriter() {
  op(kProto);
  op('\x02');
}

void PickleWriter::none() { op(kNone); }

void PickleWriter::boolean(bool v) { op(v ? kTrue : kFalse); }

void PickleWriter::integer(int64_t v) {
  if (v >= INT32_MIN && v <= INT32_MAX) {
    op(kBinInt);
    uint32_t u = static_cast<uint32_t>(static_cast<int32_t>(v));
    for (int i = 0; i < 4; ++i) op(static_cast<char>((u >> (8 * i)) & 0xff));
    return;
  }
  op(kLong1);
  op('\x08');
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) op(static_cast<char>((u >> (8 * i)) & 0xff));
}

void PickleWriter::real(double v) {
  op(kBinFloat);
  uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  for (int i = 7; i >= 0; --i) op(static_cast<char>((u >> (8 * i)) & 0xff));
}

void PickleWriter::str(const std::string& s) {
  op(kBinUnicode);
  uint32_t n = static_cast<uint32_t>(s.size());
  for (int i = 0; i < 4; ++i) op(static_cast<char>((n >> (8 * i)) & 0xff));
  raw(s.data(), s.size());
}

void PickleWriter::str(const char* s) { str(std::string(s ? s : "")); }

void PickleWriter::beginDict() {
  op(kEmptyDict);
  op(kMark);
  open_.push_back(Open::kDict);
}

void PickleWriter::beginList() {
  op(kEmptyList);
  op(kMark);
  open_.push_back(Open::kList);
}

void PickleWriter::beginTuple() {
  op(kMark);
  open_.push_back(Open::kTuple);
}

void PickleWriter::end() {
  if (open_.empty()) throw Error("braid pickle: end() without an open container");
  Open o = open_.back();
  open_.pop_back();
  op(o == Open::kDict ? kSetItems : o == Open::kList ? kAppends : kTuple);
}

std::string PickleWriter::finish() {
  if (!open_.empty()) throw Error("braid pickle: finish() with an open container");
  op(kStop);
  return std::move(out_);
}

}  // namespace braid
