"""First-training-step stamp for bench/framework_launch.py, installed as `sitecustomize`.

The driver copies this file to TMP/sitecustomize.py and puts TMP first on PYTHONPATH; every
Python process that the launcher starts (and the launcher itself, when it is Python) then runs
it at interpreter start-up, before the script. It does nothing unless

  SHOAL_BENCH_FIRST_STEP_DIR      a directory to write stamps into, and
  SHOAL_BENCH_FIRST_STEP_SCRIPTS  comma-separated script file names (e.g. train.py)
  SHOAL_BENCH_FIRST_STEP_KIND     (optional) torch or keras: patch only that framework

are set and this process runs one of those scripts (sys.argv[0]'s base name): launchers written
in Python (torchrun, horovodrun, _tf_launch.py) are left alone. In a training script it writes
one JSON line to DIR/<pid>.jsonl with

  t_site   time.time() when this file ran: the interpreter has started, the script not yet;
  t_first  time.time() just after the first training step has completed (see below);
  t_fit_end (Keras only) time.time() when Model.fit returned;

plus the rank as the process sees it (RANK, HOROVOD_RANK or TF_CONFIG's task index) and the
CPUs it may run on (sched_getaffinity), to tell pinned ranks from floating ones.

What counts as the first training step:

- PyTorch (the DDP and Horovod scripts): the first `step()` of an optimizer that follows the
  process's first backward pass, timed when that step() returns. torch.autograd.backward is
  wrapped until its first call; Optimizer.__init__ gives every optimizer an instance attribute
  `step` that wraps the class's step. Horovod's broadcast_optimizer_state() makes one dummy
  step() on the inner optimizer before any backward pass (to create its momentum buffers):
  that one passes through unstamped. After the stamp every wrapper removes itself (the
  instance attribute is deleted, torch.autograd.backward and Optimizer.__init__ are put back),
  so the steps that follow run exactly the code they would run without this file.
- Keras 2.15 (TensorFlow's MultiWorkerMirroredStrategy script): Model.make_train_function's
  result is wrapped so that its first call (one training step: steps_per_execution is 1) is
  followed by context.async_wait() and the stamp, then Model.train_function is set back to the
  original function, which model.fit reads afresh at every step.

Modules are patched when they are first imported (a sys.meta_path finder that wraps the
loader's exec_module of torch.optim.optimizer / keras.src.engine.training, and removes itself
once both are patched or when the process is not a training script): nothing is imported here
that the script would not import itself. Standard library only; never raises.
"""

import json
import os
import sys
import time

_T_SITE = time.time()
_DIR = os.environ.get("SHOAL_BENCH_FIRST_STEP_DIR")
_SCRIPTS = {s for s in os.environ.get("SHOAL_BENCH_FIRST_STEP_SCRIPTS", "").split(",") if s}
_state = {"done": False, "backward_seen": False}


def _rank():
    for k in ("RANK", "HOROVOD_RANK"):
        if os.environ.get(k, "").isdigit():
            return int(os.environ[k])
    try:
        return int(json.loads(os.environ.get("TF_CONFIG") or "{}")["task"]["index"])
    except Exception:
        return None


def _write(**fields):
    try:
        rec = {"pid": os.getpid(), "rank": _rank(), "t_site": _T_SITE,
               "cpus_allowed": sorted(os.sched_getaffinity(0))}
        rec.update(fields)
        with open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
    except Exception:
        pass


def _stamp_first(kind):
    if not _state["done"]:
        _state["done"] = True
        _write(t_first=time.time(), kind=kind)


# ----------------------------------------------------------------------------------- PyTorch

def _patch_torch_optimizer(module):
    import torch.autograd as autograd

    Optimizer = module.Optimizer
    orig_init = Optimizer.__init__
    orig_backward = autograd.backward

    def backward(*args, **kwargs):
        _state["backward_seen"] = True
        autograd.backward = orig_backward  # Tensor.backward looks it up at every call
        return orig_backward(*args, **kwargs)

    def init(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        if _state["done"]:
            return

        def step(*a, **kw):
            out = type(self).step(self, *a, **kw)
            if _state["backward_seen"] and not _state["done"]:
                _stamp_first("torch")
                Optimizer.__init__ = orig_init
            if _state["done"]:
                self.__dict__.pop("step", None)
            return out

        self.__dict__["step"] = step

    autograd.backward = backward
    Optimizer.__init__ = init


# ------------------------------------------------------------------------------------- Keras

def _patch_keras_training(module):
    Model = module.Model
    orig_make = Model.make_train_function
    orig_fit = Model.fit

    def make_train_function(self, *args, **kwargs):
        fn = orig_make(self, *args, **kwargs)
        if _state["done"] or fn is None:
            return fn

        def first_call(iterator):
            out = fn(iterator)
            try:
                from tensorflow.python.eager import context
                context.async_wait()
            except Exception:
                pass
            _stamp_first("keras")
            self.train_function = fn
            Model.make_train_function = orig_make
            return out

        self.train_function = first_call
        return first_call

    def fit(self, *args, **kwargs):
        out = orig_fit(self, *args, **kwargs)
        _write(t_fit_end=time.time(), kind="keras_fit_end")
        return out

    Model.make_train_function = make_train_function
    Model.fit = fit


# ------------------------------------------------------------------------------ import hook

_TARGETS = {"torch.optim.optimizer": _patch_torch_optimizer,
            "keras.src.engine.training": _patch_keras_training}
_KIND = os.environ.get("SHOAL_BENCH_FIRST_STEP_KIND")  # torch or keras: patch only that one
if _KIND in ("torch", "keras"):
    _TARGETS = {k: v for k, v in _TARGETS.items() if k.startswith(_KIND + ".")}


class _Finder:
    """Finds nothing itself: asks the finders after it for the spec of a target module and
    wraps its loader's exec_module so that the module is patched right after it ran."""

    def find_spec(self, name, path=None, target=None):
        patch = _TARGETS.get(name)
        if patch is None:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, orig_exec = spec.loader, spec.loader.exec_module

        def exec_module(module):
            orig_exec(module)
            del _TARGETS[name]
            if not _TARGETS:
                _remove_finder()
            try:
                patch(module)
            except Exception as e:  # a failed patch only means no stamp
                _write(error=f"patching {name}: {e!r}")

        try:
            loader.exec_module = exec_module
        except Exception:
            return spec
        return spec


_FINDER = _Finder()


def _remove_finder():
    try:
        sys.meta_path.remove(_FINDER)
    except ValueError:
        pass


def _script_name():
    argv = getattr(sys, "argv", None) or []
    if argv and argv[0]:
        return os.path.basename(argv[0])
    orig = getattr(sys, "orig_argv", [])  # before sys.argv exists: [python, -u, script, ...]
    for a in orig[1:]:
        if not a.startswith("-"):
            return os.path.basename(a)
    return ""


def _chain_next_sitecustomize():
    """Runs the sitecustomize this file shadows (Debian's installs apport's hook), if any."""
    try:
        import importlib.machinery
        import importlib.util
        here = os.path.dirname(os.path.abspath(__file__))
        rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is not None and spec.origin and os.path.abspath(spec.origin) != \
                os.path.abspath(__file__):
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
    except Exception:
        pass


if _DIR and _SCRIPTS and _script_name() in _SCRIPTS:
    sys.meta_path.insert(0, _FINDER)
_chain_next_sitecustomize()
