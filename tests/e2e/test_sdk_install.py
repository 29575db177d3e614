"""The Python training SDK is a package (issue 23, defect 4).

`import shoal` used to need PYTHONPATH set by hand at sdk/python. Now sdk/python is the
distribution shoal-sdk (pyproject.toml, setuptools), `pip install` puts it into any
environment with no download, and setup.sh installs it for Debian's python3 and every framework
venv, so a task started under any of those imports it with PYTHONPATH unset.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import shoal_e2e as e2e

SDK_SOURCE = e2e.REPO_ROOT / "sdk" / "python"
VENV_ROOT = Path("/var/cache/shoal/venvs")
FRAMEWORK_VENVS = ("tensorboard", "jax", "paddle", "tensorflow", "horovod")
PIP_QUIET = ("-q", "--disable-pip-version-check", "--no-input")


def checkout_version():
    """shoal.__version__ as this checkout's sources say (read, not imported)."""
    for line in (SDK_SOURCE / "shoal" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__ = "):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("sdk/python/shoal/__init__.py sets no __version__")


def clean_env(**extra):
    """The test runner's environment without PYTHONPATH (nor any PYTHON* that moves sys.path)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def copy_of_sources(tmp_path):
    """sdk/python copied out: a build writes build/ and *.egg-info beside the sources."""
    copy = tmp_path / "sdk-src"
    shutil.copytree(SDK_SOURCE, copy,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    return copy


def run(args, **kwargs):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300,
                       **kwargs)
    assert r.returncode == 0, f"{' '.join(map(str, args))}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def import_outside_the_repo(python, cwd):
    """(version, file) of `import shoal` in `python`, run from `cwd` with PYTHONPATH unset."""
    r = run([python, "-c", "import json, shoal; print(json.dumps([shoal.__version__, "
                           "shoal.__file__]))"], cwd=cwd, env=clean_env())
    return json.loads(r.stdout)


def test_the_wheel_installs_into_a_fresh_venv_and_imports_from_anywhere(tmp_path):
    # As setup.sh does: one wheel built by Debian's python3 (its setuptools and wheel), then
    # installed with no index. A fresh venv has setuptools but not `wheel`, which setuptools 66
    # needs to build one.
    wheels = tmp_path / "wheels"
    run(["/usr/bin/python3", "-m", "pip", "wheel", *PIP_QUIET, "--no-deps", "--no-index",
         "--no-build-isolation", "-w", wheels, copy_of_sources(tmp_path)], env=clean_env())
    (wheel,) = wheels.glob("shoal_sdk-*.whl")
    venv = tmp_path / "venv"
    run(["/usr/bin/python3", "-m", "venv", venv])
    run([venv / "bin" / "pip", "install", *PIP_QUIET, "--no-deps", "--no-index", wheel],
        env=clean_env())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    version, file = import_outside_the_repo(venv / "bin" / "python", elsewhere)
    assert version == checkout_version()
    assert Path(file).is_relative_to(venv), file
    show = run([venv / "bin" / "pip", "show", "shoal-sdk"], env=clean_env()).stdout
    assert f"Version: {version}" in show.splitlines(), show


def test_pip_installs_the_source_directory_with_no_build_isolation(tmp_path):
    # A venv that sees Debian's setuptools and wheel (as the tensorboard and horovod venvs do)
    # builds straight from the source directory, downloading nothing.
    venv = tmp_path / "venv"
    run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv])
    run([venv / "bin" / "pip", "install", *PIP_QUIET, "--no-deps", "--no-index",
         "--no-build-isolation", "--ignore-installed", copy_of_sources(tmp_path)],
        env=clean_env())
    version, file = import_outside_the_repo(venv / "bin" / "python", tmp_path)
    assert version == checkout_version()
    assert Path(file).is_relative_to(venv), file


def installed_sdk(python):
    """The installed SDK for `python` must be this checkout's: setup.sh installs it. Fails,
    naming setup.sh, when it is missing or stale. Returns shoal.__file__."""
    r = subprocess.run([str(python), "-I", "-c", "import json, importlib.metadata as md, shoal; "
                        "print(json.dumps([md.version('shoal-sdk'), shoal.__file__]))"],
                       capture_output=True, text=True, timeout=60, cwd="/", env=clean_env())
    assert r.returncode == 0, (
        f"the training SDK (shoal-sdk) is not installed for {python}: run ./setup.sh, which "
        f"installs sdk/python into Debian's python3 and every venv under {VENV_ROOT}\n{r.stderr}")
    version, file = json.loads(r.stdout)
    installed = Path(file).parent
    stale = [p.name for p in sorted((SDK_SOURCE / "shoal").glob("*.py"))
             if not (installed / p.name).is_file()
             or (installed / p.name).read_bytes() != p.read_bytes()]
    assert version == checkout_version() and not stale, (
        f"{python} has shoal-sdk {version} at {installed}, which differs from this checkout's "
        f"sdk/python ({checkout_version()}; differing: {stale}): run ./setup.sh again")
    return file


def test_tasks_import_the_sdk_under_every_setup_interpreter_without_pythonpath(
        write_job, run_shoal, tmp_path):
    pythons = {"system": Path("/usr/bin/python3")}
    for name in FRAMEWORK_VENVS:
        python = VENV_ROOT / name / "bin" / "python"
        assert python.is_file(), f"{python} is missing: run ./setup.sh (it makes {VENV_ROOT}/{name})"
        pythons[name] = python
    for python in pythons.values():
        installed_sdk(python)
    roles = "".join(f"""
  with-{name}:
    command: ["{python}", "-c", "import shoal; print('imported', shoal.__version__, shoal.__file__)"]
    resources: {{cpus: 0.1}}""" for name, python in pythons.items())
    job = write_job("name: sdk-import\nroles:" + roles + "\n")
    # An empty PYTHONPATH adds nothing to sys.path, whatever the runner's environment held.
    r = run_shoal("run", job, timeout=120, env={"PYTHONPATH": ""})
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    for name in pythons:
        prefix = f"with-{name}:0 | imported "
        (line,) = [l for l in r.stdout.splitlines() if l.startswith(prefix)]
        version, file = line[len(prefix):].split(" ", 1)
        assert version == checkout_version(), line
        assert not Path(file).is_relative_to(e2e.REPO_ROOT), line
