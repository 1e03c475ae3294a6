"""`pip install ./python` into a fresh virtual environment (Debian's numpy and cffi through
--system-site-packages, offline): the installed package carries its own libpsclient.so.1 and
works from outside the source tree."""
import os
import shutil
import subprocess
import sys

from conftest import BUILD, REPO


def test_pip_install(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    src = tmp_path / "src"  # a copy: pip's build writes next to setup.py
    shutil.copytree(os.path.join(REPO, "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
    env = dict(os.environ)
    env.setdefault("EMBERPS_LIBPSCLIENT", os.path.join(BUILD, "lib", "libpsclient.so.1"))
    out = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index",
                          "--no-build-isolation", "--no-deps", "--disable-pip-version-check",
                          str(src)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    env.pop("EMBERPS_LIBPSCLIENT")
    env.pop("PYTHONPATH", None)
    code = ("import emberps; print(emberps.LIBRARY_PATH); print(emberps.LIBRARY_VERSION); "
            "print(hex(emberps.feature_key(0, 0)))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=str(tmp_path), env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lib, version, key = out.stdout.split()
    assert lib.startswith(str(venv)) and lib.endswith("emberps/libpsclient.so.1")
    assert version.startswith("1.")
    assert key == "0x9a75d1e1f3e4792e"
