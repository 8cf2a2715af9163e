// torch_braid._C's flight-recorder functions (python/torch_braid/fr.py wraps
// them) and the Python-stack capture behind BRAID_FR_STACKS.
#include <Python.h>
#include <frameobject.h>
#include <pybind11/stl.h>

#include "c10d/flight_recorder.h"
#include "python/python_parts.h"
#include "common/flight_recorder.h"

namespace py = pybind11;

namespace braid {
namespace {

std::string text(PyObject* o, const char* attr) {
  PyObject* v = PyObject_GetAttrString(o, attr);
  std::string s;
  if (v && PyUnicode_Check(v)) {
    const char* c = PyUnicode_AsUTF8(v);
    if (c) s = c;
  }
  Py_XDECREF(v);
  PyErr_Clear();
  return s;
}

// The calling thread's Python frames, innermost first (as torch's
// CapturedTraceback lists them); takes the GIL. None on a thread that runs no
// Python (DDP's autograd hooks, C++ programs).
fr::Frames captureStack() {
  if (!Py_IsInitialized()) return nullptr;
  PyGILState_STATE gil = PyGILState_Ensure();
  auto frames = std::make_shared<std::vector<fr::Frame>>();
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f && frames->size() < 64) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new reference
    fr::Frame fr;
    fr.name = text(reinterpret_cast<PyObject*>(code), "co_name");
    fr.filename = text(reinterpret_cast<PyObject*>(code), "co_filename");
    fr.line = PyFrame_GetLineNumber(f);
    frames->push_back(std::move(fr));
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  PyGILState_Release(gil);
  if (frames->empty()) return nullptr;
  return frames;
}

}  // namespace
}  // namespace braid

BRAID_PY_PART(flight_recorder, m) {
  braid::setStackCapture(&braid::captureStack);
  m.def("fr_enabled", [] { return braid::fr::Recorder::global().enabled(); });
  m.def("fr_capacity", [] { return braid::fr::Recorder::global().capacity(); });
  m.def(
      "fr_dump_bytes",
      [] {
        std::string b;
        {
          py::gil_scoped_release release;
          b = braid::fr::Recorder::global().dumpPickle();
        }
        return py::bytes(b);
      },
      "The flight recorder's dump (torch's pickle layout) as bytes.");
  m.def("fr_dump", &braid::dumpFlightRecorder, py::arg("prefix"),
        py::call_guard<py::gil_scoped_release>(),
        "Writes the flight recorder's dump to <prefix><rank>; returns the path.");
  m.def("fr_dump_on_exit", &braid::dumpOnExit);
  m.def("_fr_pause", [](bool p) { braid::fr::Recorder::global().setPaused(p); },
        "Benchmarks only: record nothing while paused (benchmarks/fr_overhead.py).");
  m.def("fr_set_rank", [](int rank) { braid::fr::Recorder::global().setProcessRank(rank); },
        "The rank in dump file names (default: the rank in the process's first group).");
}
