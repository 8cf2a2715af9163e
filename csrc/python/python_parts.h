// Parts of the torch_braid._C module register themselves here, so each
// layer keeps its bindings beside its code (reducer/*_py.cc, hooks/*_py.cc):
//
//   BRAID_PY_PART(hooks, m) { m.def("bf16_compress_hook", ...); }
//
// The module's init (python/module_py.cc) runs every registered part.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <vector>

namespace braid {
namespace python {

using PartInit = void (*)(pybind11::module&);

inline std::vector<std::pair<const char*, PartInit>>& parts() {
  static std::vector<std::pair<const char*, PartInit>> p;
  return p;
}

struct PartRegistrar {
  PartRegistrar(const char* name, PartInit init) { parts().emplace_back(name, init); }
};

}  // namespace python
}  // namespace braid

#define BRAID_PY_PART(name, module_var)                                               \
  static void braidPyPart_##name(pybind11::module& module_var);                       \
  static ::braid::python::PartRegistrar braidPyPartReg_##name(#name, &braidPyPart_##name); \
  static void braidPyPart_##name(pybind11::module& module_var)
