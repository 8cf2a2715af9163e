"""Builds torch_braid._C (and libbraid) with CMake, against the torch that
runs this script. No build isolation is needed or wanted: the extension must
match the installed torch exactly.

    /usr/bin/python3 setup.py build_ext --inplace     # for development and tests
    python3 -m pip install --no-build-isolation .       # into the venv that holds torch

The extension is compiled with the pybind11 headers that torch was built with
(Note [One pybind11 per process] in CMakeLists.txt): no pybind11 from pip is
needed or used.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch

        build_dir = os.environ.get(
            "BRAID_BUILD_DIR",
            os.path.join(ROOT, "build", f"py{sys.version_info.major}{sys.version_info.minor}"
                         f"-torch{torch.__version__.split('+')[0]}"))
        os.makedirs(build_dir, exist_ok=True)
        cfg = os.environ.get("BRAID_BUILD_TYPE", "Release")
        sim = os.environ.get("BRAID_BUILD_SIM", "0") in ("1", "ON", "on", "true")
        cmake_args = [
            f"-DCMAKE_BUILD_TYPE={cfg}",
            "-DBRAID_BUILD_PYTHON=ON",
            f"-DBRAID_BUILD_TESTS={os.environ.get('BRAID_BUILD_TESTS', 'ON')}",
            # The simulated device is for braid's own tests: never in what pip installs
            # (Note [Simulators outside the product] in csrc/python/testing_hooks.h).
            f"-DBRAID_BUILD_SIM={'ON' if sim else 'OFF'}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
        ]
        # braid's kernels for every GPU this torch was built for too (Note [Kernel images] in
        # csrc/cuda/kernel_images.h); from the build's flags, since get_arch_list() is empty
        # on a machine without a GPU. "" for a torch without CUDA.
        arch_flags = getattr(torch._C, "_cuda_getArchFlags", lambda: None)() or ""
        cmake_args.append(f"-DBRAID_CUDA_TORCH_ARCHS={arch_flags}")
        if os.environ.get("BRAID_SANITIZE"):
            cmake_args.append(f"-DBRAID_SANITIZE={os.environ['BRAID_SANITIZE']}")
        jobs = os.environ.get("BRAID_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir] + cmake_args)
        # The extension only (and, for tests, braid_sim's); tests/run_suite.sh builds the
        # C++ test targets.
        targets = ["_C"] + (["braid_sim_py"] if sim else [])
        subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs, "--target"] + targets)
        # _C is self-contained (libbraid's objects are linked in), so builds
        # for several Python/torch versions can sit side by side.
        target = os.path.abspath(self.get_ext_fullpath(ext.name))
        built = os.path.join(build_dir, os.path.basename(target))
        if not os.path.exists(built):
            raise RuntimeError(f"braid: the build made no {built} (is CMake's Python "
                               f"{sys.executable}?)")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(built, target)
        if sim:
            # Into the source tree, beside its Python half: tests import it from there.
            name = os.path.basename(target)
            shutil.copy2(os.path.join(build_dir, "braid_sim", name),
                         os.path.join(ROOT, "tests", "sim", "python", "braid_sim", name))


setup(
    name="torch_braid",
    version="0.1.0",
    description="A faster, safer c10d communication backend for PyTorch",
    package_dir={"": "python"},
    packages=["torch_braid"],
    ext_modules=[CMakeExtension("torch_braid._C")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
