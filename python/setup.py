"""Build step of `pip install ./python`: bundle libpsclient.so.1 into the package.

The library comes from $EMBERPS_LIBPSCLIENT (a path), else from the repository's build tree
(../build/lib), which is built first when missing (`cmake -S .. -B ../build` and the
psclient_shared target: needs the project's build dependencies, deploy/install-deps.sh). The
package's loader (emberps/_lib.py) finds the bundled copy first.
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SONAME = "libpsclient.so.1"


def find_or_build():
    env = os.environ.get("EMBERPS_LIBPSCLIENT")
    if env:
        return env
    build = os.path.join(HERE, "..", "build")
    lib = os.path.join(build, "lib", SONAME)
    if not os.path.exists(lib):
        if not os.path.exists(os.path.join(HERE, "..", "CMakeLists.txt")):
            raise SystemExit("emberps: no libpsclient: set EMBERPS_LIBPSCLIENT to its path")
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            subprocess.check_call(["cmake", "-S", os.path.join(HERE, ".."), "-B", build,
                                   "-DCMAKE_BUILD_TYPE=Release"])
        subprocess.check_call(["cmake", "--build", build, "--target", "psclient_shared",
                               "-j", str(os.cpu_count() or 1)])
    return lib


class BuildPy(build_py):
    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "emberps", SONAME)
        shutil.copyfile(os.path.realpath(find_or_build()), dst)


setup(cmdclass={"build_py": BuildPy})
