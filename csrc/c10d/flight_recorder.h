// The backend's side of the flight recorder (Note [Flight recorder] in
// common/flight_recorder.h): what one group records per op, and when it
// writes dumps (Note [Flight-recorder dumps]).
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "c10d/compat.h"
#include "common/flight_recorder.h"

namespace braid {

// Python stacks, when BRAID_FR_STACKS is on: the module installs a function
// that reads the calling thread's Python frames (taking the GIL).
using StackCapture = fr::Frames (*)();
void setStackCapture(StackCapture f);

class GroupRecorder {
 public:
  GroupRecorder(c10::intrusive_ptr<c10d::Store> store, std::string storePrefix, int rank,
                int size);

  bool on() const { return rec_ != nullptr; }

  // Records a scheduled op (caller's thread); 0 when the recorder is off.
  // `inputs` empty: the op works in place on `outputs`. p2p ops give the peer.
  uint64_t record(c10d::OpType type, c10::ArrayRef<at::Tensor> inputs,
                  c10::ArrayRef<at::Tensor> outputs, int64_t timeoutMs, int peer = -2);
  void started(uint64_t id) {
    if (id) rec_->started(id);
  }
  // With the op's error, if any: a timeout or lost peer leaves it started and
  // triggers the dump on timeout (Note [Flight-recorder dumps]); any other
  // failure looks whether another rank asked for dumps.
  void finished(uint64_t id, const std::exception_ptr& error);

  // The name and description torch gave the group (torch 2.x), its members'
  // global ranks.
  void describe(const std::string& name, const std::string& desc, const std::vector<int>& ranks);

  // Dumps if another rank of the group asked for dumps through the store
  // (on shutdown and after a failed op). Never throws.
  void dumpIfAsked();

 private:
  void dumpOnFailure(const std::string& why);
  void dump(const std::string& why);

  fr::Recorder* rec_ = nullptr;
  uint32_t group_ = 0;
  int rank_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::string key_;            // the group's store key that asks for dumps
  std::string dumpFile_;       // BRAID_FR_DUMP_FILE
  bool dumpOnTimeout_ = false;
  bool stacks_ = false;
  std::atomic<bool> dumped_{false};
};

// BRAID_FR_DUMP_ON_EXIT: torch_braid dumps at exit.
bool dumpOnExit();

// Writes the process's dump to `${prefix}<rank>` (torch's TORCH_FR_DUMP_TEMP_FILE
// convention); returns the path. Throws on failure.
std::string dumpFlightRecorder(const std::string& prefix);

}  // namespace braid
