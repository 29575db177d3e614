"""Publishing a trained model into a model repository that `shoal serve` watches.

    version = shoal.publish_model(model, "digits", example_inputs=torch.zeros(1, 64))

writes `<repository>/digits/<version>/model.pt` and returns the new version's number. The
repository is `repository=`, else $SHOAL_MODEL_REPOSITORY: a directory, or
hdfs://namenode[:port]/path (through WebHDFS, with its own protocol: hdfs_publish.py). The
layout is the one docs/serving.md describes: `<model>/config.yaml` (optional) and
`<model>/<n>/model.pt`.

Guarantees (docs/sdk.md, "Publishing models"):

- **Atomic**: the version is written into a hidden directory of the model
  (`.incoming-<pid>-<random>`, which the server ignores), its file and the directory fsync'd, then
  renamed to its number in one step: a server, or anyone listing the repository, sees no version
  or the whole version, never part of it. A publisher killed mid-write leaves only a hidden
  directory, removed by the next publication of that model once its writer is gone.
- **Unique numbers**: publishers of one model take `<model>/.publish.lock` (flock) while they
  choose the number and rename; the rename itself refuses an existing version, so two publishers
  (processes, tasks on one machine, or machines sharing a POSIX file system with working locks)
  never get the same number and never overwrite a version.

hdfs:// repositories give the same guarantees without a lock, which HDFS does not have: the
number is claimed by an exclusive create, the version renamed in whole (hdfs_publish.py).

Test hook: SHOAL_TEST_PUBLISH_WRITE_DELAY_S (float seconds) makes a publication sleep after
writing half of model.pt, so that a test can kill it mid-write. Not for production.
"""

import errno
import fcntl
import io
import math
import numbers
import operator
import os
import re
import secrets
import time
from typing import Any, Dict, Optional

from . import _client
from .errors import ShoalError
from .hdfs_publish import HdfsModelRepository
from .webhdfs import WEBHDFS_ENV, WebHdfsError, WebHdfsUnreachable

REPOSITORY_ENV = "SHOAL_MODEL_REPOSITORY"
KEEP_ENV = "SHOAL_MODEL_KEEP"
REMOVING_PREFIX = ".removing-"
WRITE_DELAY_ENV = "SHOAL_TEST_PUBLISH_WRITE_DELAY_S"
INCOMING_PREFIX = ".incoming-"
COMPLETE_MARKER = ".shoal-complete"  # src/serve/repository/model_repository.h
LOCK_NAME = ".publish.lock"

# What the agent takes in a `published` report (docs/sdk-protocol.md); more is refused there.
MAX_METRICS = 64
MAX_METRIC_NAME = 128

_MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]*$")
_VERSION_RE = re.compile(r"^[1-9][0-9]*$")

# torch dtype name -> the server's datatype (docs/serving.md, config.yaml).
_DATATYPES = {
    "torch.bool": "BOOL", "torch.uint8": "UINT8", "torch.int8": "INT8", "torch.int16": "INT16",
    "torch.int32": "INT32", "torch.int64": "INT64", "torch.float32": "FP32",
    "torch.float64": "FP64",
}


class PublishError(ShoalError):
    """The model could not be published: a bad argument (named), or the repository refused."""


def versions(repository: str, name: str):
    """The published version numbers of model `name`, ascending (hdfs:// repositories too)."""
    if repository.startswith("hdfs://"):
        return HdfsModelRepository(repository).versions(name)
    try:
        entries = os.listdir(os.path.join(repository, name))
    except FileNotFoundError:
        return []
    return sorted(int(e) for e in entries if _VERSION_RE.match(e))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: str, data: bytes, delay_half: bool = False) -> None:
    with open(path, "wb") as f:
        half = len(data) // 2 if delay_half else len(data)
        f.write(data[:half])
        if delay_half:
            f.flush()
            time.sleep(float(os.environ[WRITE_DELAY_ENV]))
        f.write(data[half:])
        f.flush()
        os.fsync(f.fileno())


def _replace_file(path: str, data: bytes) -> None:
    tmp = os.path.join(os.path.dirname(path), f".tmp-{os.path.basename(path)}.{os.getpid()}."
                       f"{secrets.token_hex(4)}")
    _write_file(tmp, data)
    os.rename(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_abandoned(model_dir: str) -> None:
    """Removes the hidden directories of publications whose writer is gone."""
    import shutil
    for entry in os.listdir(model_dir):
        if not entry.startswith(INCOMING_PREFIX):
            continue
        try:
            pid = int(entry[len(INCOMING_PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(os.path.join(model_dir, entry), ignore_errors=True)


def _model_bytes(model, example_inputs):
    """(TorchScript archive bytes, the scripted module or None) of what was given."""
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise PublishError(f"publish_model: cannot read the model file {path}: "
                               f"{e.strerror}") from e
        if not data.startswith(b"PK"):
            raise PublishError(f"publish_model: {path} is not a TorchScript archive "
                               "(save one with torch.jit.script(module).save(path))")
        module = None
        if example_inputs is not None:
            import torch
            module = torch.jit.load(io.BytesIO(data))
        return data, module
    try:
        import torch
    except ImportError as e:
        raise PublishError("publish_model: a module needs torch; pass the path of a saved "
                           "TorchScript file instead") from e
    if isinstance(model, torch.jit.ScriptModule):
        module = model
    elif isinstance(model, torch.nn.Module):
        try:
            module = torch.jit.script(model)
        except Exception as script_error:  # noqa: BLE001 - fall back to tracing, or say why
            if example_inputs is None:
                raise PublishError(
                    f"publish_model: torch.jit.script failed for {type(model).__name__} "
                    f"({script_error}); pass example_inputs= to trace it instead") from script_error
            inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
            module = torch.jit.trace(model, inputs)
    else:
        raise PublishError(f"publish_model: model must be a TorchScript module, an nn.Module or "
                           f"the path of a saved TorchScript file, not {type(model).__name__}")
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    return buffer.getvalue(), module


def _signature(module, example_inputs, max_batch_size: int) -> Dict[str, Any]:
    """inputs/outputs for config.yaml, from a real call of the module on example_inputs."""
    import torch
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    arguments = [a.name for a in module.forward.schema.arguments[1:]]
    with torch.no_grad():
        result = module(*inputs)

    def describe(name, tensor):
        if not isinstance(tensor, torch.Tensor):
            raise PublishError(f"publish_model: {name} is a {type(tensor).__name__}, not a tensor")
        datatype = _DATATYPES.get(str(tensor.dtype))
        if datatype is None:
            raise PublishError(f"publish_model: {name} has dtype {tensor.dtype}, which shoal "
                               f"serve does not take ({', '.join(sorted(_DATATYPES.values()))})")
        dims = list(tensor.shape[1:] if max_batch_size >= 1 else tensor.shape)
        return {"name": name, "datatype": datatype, "dims": [int(d) for d in dims]}

    signature = {"inputs": [describe(arguments[i] if i < len(arguments) else f"input_{i}", t)
                            for i, t in enumerate(inputs)]}
    if isinstance(result, torch.Tensor):
        signature["outputs"] = [describe("output", result)]
    elif isinstance(result, dict):
        signature["outputs"] = [describe(str(k), v) for k, v in result.items()]
    elif isinstance(result, (tuple, list)):
        signature["outputs"] = [describe(f"output_{i}", v) for i, v in enumerate(result)]
    else:
        raise PublishError(f"publish_model: forward returned a {type(result).__name__}; shoal "
                           "serve needs a tensor, a tuple or list of tensors, or a dict of them")
    return signature


def _warmup(inputs, max_batch_size: int):
    """Two requests of the example's shape (batch 1 when batching) on every instance before the
    version serves. TorchScript's profiling executor profiles a graph on its first run and
    optimises it on the second; without these, those slow runs fall on the first client
    requests, inside a canary's latency comparison, which then rolls back a good version.
    Filled with ones rather than zeros: a valid token id, length or mask where zero may not be
    (a failing warmup refuses the version)."""
    shape = lambda i: [1, *i["dims"]] if max_batch_size >= 1 else list(i["dims"])
    return [{"count": 2,
             "inputs": {i["name"]: {"dims": shape(i), "fill": "one"} for i in inputs}}]


def _config_text(config) -> str:
    if isinstance(config, str):
        return config if config.endswith("\n") else config + "\n"
    import yaml  # python3-yaml, a dependency of the SDK's examples; only needed for dicts
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=None)


def _keep_from_environment() -> int:
    text = os.environ.get(KEEP_ENV, "")
    if not text:
        return 0
    try:
        keep = int(text)
    except ValueError:
        keep = 0
    if keep < 1:
        raise PublishError(f"publish_model: {KEEP_ENV}={text!r} must be an integer >= 1 (the job "
                           "file's publish.keep)")
    return keep


def _prune(model_dir: str, keep: int) -> None:
    """Removes all but the newest `keep` versions: each is renamed to a hidden name first, so it
    leaves the server's view in one step, then deleted."""
    if keep < 1:
        return
    import shutil
    numbers = sorted(int(e) for e in os.listdir(model_dir) if _VERSION_RE.match(e))
    for number in numbers[:-keep]:
        hidden = os.path.join(model_dir, f"{REMOVING_PREFIX}{number}-{secrets.token_hex(4)}")
        try:
            os.rename(os.path.join(model_dir, str(number)), hidden)
        except FileNotFoundError:
            continue  # another publisher pruned it
        shutil.rmtree(hidden, ignore_errors=True)


def _hdfs_failure(repository, what, error) -> PublishError:
    """The PublishError for a WebHDFS failure: unreachable, permission denied, or as HDFS says."""
    if isinstance(error, WebHdfsUnreachable) and error.address != repository.location.base:
        return PublishError(f"publish_model: cannot {what} {repository.uri}: the DataNode at "
                            f"{error.address} that the NameNode named does not answer "
                            f"({error.reason})")
    if isinstance(error, WebHdfsUnreachable):
        return PublishError(
            f"publish_model: cannot {what} {repository.uri}: the NameNode's WebHDFS at "
            f"{repository.location.base} is unreachable ({error.reason}); if its HTTP port is not "
            f"9870, set {WEBHDFS_ENV}=http://HOST:PORT")
    if isinstance(error, WebHdfsError) and error.exception == "AccessControlException":
        return PublishError(f"publish_model: cannot {what} {repository.uri}: permission denied "
                            f"for HDFS user {repository.location.user!r} (set HADOOP_USER_NAME to "
                            f"publish as another): {error.remote_message}")
    return PublishError(f"publish_model: cannot {what} {repository.uri}: {error}")


def _hdfs_repository(uri: str) -> HdfsModelRepository:
    try:
        repository = HdfsModelRepository(uri)
    except ValueError:
        raise PublishError(f"publish_model: the repository {uri!r} must be "
                           "hdfs://namenode[:port]/path (a NameNode host, then an absolute "
                           "path)") from None
    try:
        repository.check()
    except FileNotFoundError:
        raise PublishError(f"publish_model: the repository {uri} does not exist in HDFS "
                           "(create it first, e.g. hdfs dfs -mkdir -p)") from None
    except NotADirectoryError:
        raise PublishError(f"publish_model: the repository {uri} is not a directory") from None
    except OSError as e:
        raise _hdfs_failure(repository, "reach the repository", e) from None
    return repository


def _publish_to_hdfs(repository: HdfsModelRepository, name: str, data: bytes,
                     config_text: Optional[str], keep: int) -> int:
    """The publication protocol of hdfs_publish.py (no lock: a claimed number, one rename)."""
    try:
        if config_text is not None and repository.read_config(name) != config_text:
            repository.write_config(name, config_text)
        delay = float(os.environ.get(WRITE_DELAY_ENV) or 0)
        version = repository.publish(name, {"model.pt": data}, write_delay_s=delay)
        if keep >= 1:
            repository.prune(name, keep)
        return version
    except OSError as e:
        raise _hdfs_failure(repository, f"publish {name} to", e) from None


def _checked_step(step) -> Optional[int]:
    if step is None:
        return None
    try:
        value = operator.index(step.item() if hasattr(step, "item") else step)
    except (TypeError, ValueError, RuntimeError):
        raise PublishError(f"publish_model: step must be an integer >= 0, not "
                           f"{type(step).__name__} {step!r}") from None
    if value < 0 or value >= 1 << 63:
        raise PublishError(f"publish_model: step must be an integer >= 0, not {value}")
    return value


def _checked_metrics(metrics) -> Dict[str, float]:
    """metrics as the flat {name: number} map the report carries, or PublishError naming the
    entry that is not one. A one-element tensor or a NumPy scalar is taken as its number."""
    if metrics is None:
        return {}
    if not isinstance(metrics, dict):
        raise PublishError(f"publish_model: metrics must be a dict of name -> number, not "
                           f"{type(metrics).__name__}")
    if len(metrics) > MAX_METRICS:
        raise PublishError(f"publish_model: metrics has {len(metrics)} entries; at most "
                           f"{MAX_METRICS} are recorded")
    checked = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key or len(key.encode()) > MAX_METRIC_NAME:
            raise PublishError(f"publish_model: metric name {key!r} must be a non-empty string "
                               f"of at most {MAX_METRIC_NAME} bytes")
        number = value
        if hasattr(number, "item") and not isinstance(number, numbers.Number):
            try:
                number = number.item()
            except (TypeError, ValueError, RuntimeError):
                pass
        try:
            finite = (not isinstance(number, bool) and isinstance(number, numbers.Real)
                      and math.isfinite(float(number)))
        except OverflowError:  # an int beyond a double's range
            finite = False
        if not finite:
            raise PublishError(f"publish_model: metric {key!r} must be a finite number, not "
                               f"{type(value).__name__} {value!r}")
        checked[key] = int(number) if isinstance(number, numbers.Integral) else float(number)
    return checked


def _report_published(name: str, version: int, repository: str, step, metrics) -> None:
    """Tells the agent (fire-and-forget); the master journals it and `shoal status` shows the
    last one. A no-op when not started by Shoal."""
    client = _client.client()
    if client is None:
        return
    fields = {"op": "published", "model": name, "version": version,
              "repository": repository, "metrics": metrics}
    if step is not None:
        fields["step"] = step
    client.report_alone(fields)


def publish_model(model, name: str, *, repository: Optional[str] = None,
                  example_inputs=None, config=None, step=None, metrics=None) -> int:
    """Writes a new version of model `name` into the repository and returns its number.

    `model`: a TorchScript module, an `nn.Module` (scripted for you; traced on `example_inputs`
    when scripting fails), or the path of a saved TorchScript file. `repository`: a directory
    or hdfs://namenode[:port]/path; default $SHOAL_MODEL_REPOSITORY. `config`: the model's
    config.yaml, as a dict or YAML text (docs/serving.md). With `example_inputs` (a tensor or a tuple of tensors, batch dimension
    first when the config sets `max_batch_size` >= 1) the module is run once on them and the
    config's `inputs` and `outputs` are derived from that call, unless `config` gives them;
    with derived inputs, the config also gets a `warmup` of two requests of that shape, filled
    with ones, unless it has one (`warmup: []` for none).
    The config is (re)written only when it changes. With $SHOAL_MODEL_KEEP (the job file's
    `publish.keep`) only that many newest versions of the model are left afterwards: under the
    server's default `version_policy: latest` it serves the newest that loads, so keep >= 2
    leaves the version serving while a new one loads. `step` (the training step) and `metrics`
    (a flat dict of name -> number, e.g. {"loss": 0.12}) go with the report of the publication
    to the agent, sent once the version is in place: the job's journal records it as
    `model_published` and `shoal status` shows the last one (a no-op when not run by Shoal).
    Raises PublishError naming what is wrong, before anything is written.
    """
    repository = repository or os.environ.get(REPOSITORY_ENV)
    if not repository:
        raise PublishError("publish_model: no repository: pass repository=, or set "
                           f"{REPOSITORY_ENV} (a job's `publish: {{repository: DIR}}` sets it for "
                           "every task)")
    if not isinstance(name, str) or not _MODEL_NAME_RE.match(name):
        raise PublishError(f"publish_model: model name {name!r} must be letters, digits, '_', "
                           "'-' and '.', not starting with '.' (it appears in URLs)")
    hdfs = None
    if repository.startswith("hdfs://"):
        hdfs = _hdfs_repository(repository)
    elif "://" in repository:
        raise PublishError(f"publish_model: the repository {repository} is neither a directory "
                           "nor hdfs://namenode[:port]/path")
    elif not os.path.isdir(repository):
        raise PublishError(f"publish_model: the repository {repository} is not a directory")
    keep = _keep_from_environment()
    step = _checked_step(step)
    metrics = _checked_metrics(metrics)
    data, module = _model_bytes(model, example_inputs)

    config_dict = None
    if isinstance(config, dict):
        config_dict = dict(config)
    elif config is not None and not isinstance(config, str):
        raise PublishError("publish_model: config must be a dict or YAML text")
    if example_inputs is not None:
        if isinstance(config, str):
            raise PublishError("publish_model: with example_inputs, give config as a dict, so "
                               "that the derived inputs and outputs can join it")
        config_dict = config_dict or {}
        max_batch = int(config_dict.get("max_batch_size", 0) or 0)
        signature = _signature(module, example_inputs, max_batch)
        if "inputs" not in config_dict and "warmup" not in config_dict:
            config_dict["warmup"] = _warmup(signature["inputs"], max_batch)
        for key, value in signature.items():
            config_dict.setdefault(key, value)
    config_text = _config_text(config_dict if config_dict is not None else config) \
        if (config_dict is not None or config is not None) else None

    if hdfs is not None:
        version = _publish_to_hdfs(hdfs, name, data, config_text, keep)
        _report_published(name, version, repository, step, metrics)
        return version
    model_dir = os.path.join(repository, name)
    os.makedirs(model_dir, exist_ok=True)
    lock_fd = os.open(os.path.join(model_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        _remove_abandoned(model_dir)
        if config_text is not None:
            config_path = os.path.join(model_dir, "config.yaml")
            try:
                with open(config_path) as f:
                    current = f.read()
            except FileNotFoundError:
                current = None
            if current != config_text:
                _replace_file(config_path, config_text.encode())
        incoming = os.path.join(model_dir, f"{INCOMING_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
        os.mkdir(incoming)
        try:
            _write_file(os.path.join(incoming, "model.pt"), data,
                        delay_half=bool(os.environ.get(WRITE_DELAY_ENV)))
            # Tells `shoal serve` the version appears whole, in the rename below, so it loads
            # it as soon as it sees it instead of waiting for its files to settle.
            _write_file(os.path.join(incoming, COMPLETE_MARKER), b"")
            _fsync_dir(incoming)
            existing = versions(repository, name)
            version = (existing[-1] if existing else 0) + 1
            while True:
                try:
                    # Refuses an existing non-empty version directory: a version is never
                    # overwritten, even by a publisher that does not take the lock.
                    os.rename(incoming, os.path.join(model_dir, str(version)))
                    break
                except OSError as e:
                    if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                        raise
                    version += 1
        except BaseException:
            import shutil
            shutil.rmtree(incoming, ignore_errors=True)
            raise
        _fsync_dir(model_dir)
        _prune(model_dir, keep)
    finally:
        os.close(lock_fd)  # releases the lock
    _report_published(name, version, os.path.abspath(repository), step, metrics)
    return version
