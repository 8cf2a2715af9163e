// The Python face of c10d::CommHookInterface: torch_braid._C.CommHook, held
// by std::shared_ptr. A C++ hook reaches the reducer from Python as an
// instance of a subclass, which the hook's *_py.cc binds like this:
//
//   braid::python::bindCommHookBase(m);  // whichever part runs first binds it
//   py::class_<MyHook, c10d::CommHookInterface, std::shared_ptr<MyHook>>(m, "MyHook")
//       .def(py::init<...>());
//
// and the Python state object returns it from state._cpp_hook(); see
// torch_braid.ddp.DistributedDataParallel.register_comm_hook.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <typeinfo>

namespace braid {
namespace python {

inline void bindCommHookBase(pybind11::module& m) {
  // Parts run in an unspecified order and pybind11 needs the base first.
  if (pybind11::detail::get_type_info(typeid(c10d::CommHookInterface))) return;
  pybind11::class_<c10d::CommHookInterface, std::shared_ptr<c10d::CommHookInterface>>(
      m, "CommHook",
      "A C++ DDP communication hook (c10d::CommHookInterface), for "
      "torch_braid.ddp.DistributedDataParallel.register_comm_hook.");
}

}  // namespace python
}  // namespace braid
