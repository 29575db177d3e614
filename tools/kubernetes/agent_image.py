#!/usr/bin/env python3
"""Builds the Shoal agent image: a self-contained `shoal` that runs inside any x86_64 Linux image.

  agent_image.py --shoal BUILD/src/cli/shoal --output shoal-agent.tar
                 [--sdk sdk/python/shoal] [--image localhost/shoal-agent:latest]
                 [--serve BUILD/src/serve/libshoal_serve_torch.so]

Writes an OCI archive (import it with `ctr -n k8s.io images import`, `podman load`, or push it
with `skopeo copy oci-archive:shoal-agent.tar docker://REGISTRY/shoal-agent:TAG`) whose
root filesystem holds

  /opt/shoal/bin/shoal      a stripped copy whose ELF interpreter is /opt/shoal/lib/ld-linux-
                            x86-64.so.2 and whose RPATH is /opt/shoal/lib (patchelf), so it
                            loads only the libraries below, never the host image's
  /opt/shoal/lib/           every library ldd lists for it, and the loader
  /opt/shoal/python/shoal/  the Python SDK (.py files), for PYTHONPATH=/opt/shoal/python
  /bin/busybox, /bin/sh, /bin/cp

The Kubernetes backend runs this image as an init container that copies /opt/shoal into an
emptyDir (its default command: cp -a /opt/shoal/. /mnt/shoal/), mounted at /opt/shoal in the
user's container, where /opt/shoal/bin/shoal agent then runs. The user's image needs nothing
of Shoal installed. With kubernetes.agent_host_path, the DaemonSet of `shoal kubernetes
agent-daemonset` runs this image's own /opt/shoal/bin/shoal kubernetes agent-install instead, once
per node. Needs strip (binutils), patchelf and ldd on this machine.

With --serve MODULE the image also runs `shoal serve` (the pods of `shoal serve
--print-manifests`, docs/serving.md "Running on Kubernetes"): it adds the TorchScript runtime
module as /opt/shoal/lib/shoal/ (where shoal looks for it beside its binary) and every library
ldd lists for it (libtorch and its ~290 dependencies, about 0.5 GB) to /opt/shoal/lib, sets
LD_LIBRARY_PATH=/opt/shoal/lib (some of them, libblas through update-alternatives, carry a
RUNPATH of their own that would otherwise hide the folder from their dependencies) and makes
`shoal serve --model-repository /models` its default command. Use another tag for it: the
agent's init container copies all of /opt/shoal into every job pod.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oci_archive  # noqa: E402

DEFAULT_IMAGE = "localhost/shoal-agent:latest"
PREFIX = "/opt/shoal"
LOADER_NAME = "ld-linux-x86-64.so.2"
BUSYBOX = "/bin/busybox"
BUSYBOX_LINKS = ("sh", "cp")
# ldd's lines: 'libfoo.so.1 => /lib/x86_64-linux-gnu/libfoo.so.1 (0x...)' for a library,
# '/lib64/ld-linux-x86-64.so.2 (0x...)' for the loader.
LDD_LIBRARY = re.compile(r"^\s*(\S+)\s+=>\s+(\S+)\s+\(0x[0-9a-f]+\)\s*$")
LDD_LOADER = re.compile(r"^\s*(/\S*ld-linux\S*)\s+\(0x[0-9a-f]+\)\s*$")


class ImageError(Exception):
    pass


PACKAGE_OF_TOOL = {"patchelf": "patchelf", "strip": "binutils", "ldd": "libc-bin"}


def run(argv):
    try:
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        package = PACKAGE_OF_TOOL.get(argv[0], argv[0])
        raise ImageError(f"'{argv[0]}' not found on PATH (apt-get install {package})")
    except subprocess.CalledProcessError as e:
        raise ImageError(f"{' '.join(argv)} failed (exit {e.returncode}): {e.stderr.strip()}")


def shared_libraries(binary):
    """{soname: path on this machine} for what ldd lists, and the loader's path."""
    libraries, loader = {}, None
    for line in run(["ldd", binary]).splitlines():
        if "not found" in line:
            raise ImageError(f"ldd {binary}: a library is missing on this machine: {line.strip()}")
        match = LDD_LIBRARY.match(line)
        if match:
            libraries[match.group(1)] = match.group(2)
            continue
        match = LDD_LOADER.match(line)
        if match:
            loader = match.group(1)
    if loader is None:
        raise ImageError(f"ldd {binary}: no ELF interpreter listed "
                         "(a static or non-x86_64 binary?)")
    return libraries, loader


def sdk_files(sdk_dir):
    """[(path, path relative to sdk_dir)] of the SDK's .py files, sorted."""
    if not os.path.isfile(os.path.join(sdk_dir, "__init__.py")):
        raise ImageError(f"--sdk {sdk_dir}: not the SDK package (no __init__.py)")
    found = []
    for root, dirs, files in os.walk(sdk_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                found.append((path, os.path.relpath(path, sdk_dir)))
    return found


def build(shoal, sdk_dir, image, output, serve_module=None):
    if not os.path.isfile(shoal) or not os.access(shoal, os.X_OK):
        raise ImageError(f"--shoal {shoal}: not an executable file")
    if serve_module is not None and not os.path.isfile(serve_module):
        raise ImageError(f"--serve {serve_module}: not a file (build the shoal_serve_torch target)")
    if not os.path.isfile(BUSYBOX):
        raise ImageError(f"{BUSYBOX} is missing (apt-get install busybox-static)")
    libraries, loader = shared_libraries(shoal)
    if serve_module is not None:
        module_libraries, _ = shared_libraries(serve_module)
        libraries.update(module_libraries)
    sources = sdk_files(sdk_dir)
    output_dir = os.path.dirname(os.path.abspath(output))
    os.makedirs(output_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".agent-image-") as work:
        patched = os.path.join(work, "shoal")
        run(["strip", "--strip-all", "-o", patched, shoal])
        # RPATH (not RUNPATH, patchelf's default) also applies to the libraries' own
        # dependencies, so none of them is looked up in the user's image.
        run(["patchelf", "--set-interpreter", f"{PREFIX}/lib/{LOADER_NAME}",
             "--force-rpath", "--set-rpath", f"{PREFIX}/lib", patched])
        module_name = None
        if serve_module is not None:
            module_name = os.path.basename(serve_module)
            patched_module = os.path.join(work, module_name)
            run(["strip", "--strip-unneeded", "-o", patched_module, serve_module])
            run(["patchelf", "--force-rpath", "--set-rpath", f"{PREFIX}/lib", patched_module])
        layer = oci_archive.LayerWriter(os.path.join(work, "layer.tar"))
        with layer:
            for directory in ("bin", "opt", "opt/shoal", "opt/shoal/bin", "opt/shoal/lib",
                              "opt/shoal/python", "opt/shoal/python/shoal", "mnt", "mnt/shoal"):
                layer.add_dir(directory)
            layer.add_dir("tmp", mode=0o1777)
            layer.add_path(patched, "opt/shoal/bin/shoal")
            for soname, path in sorted(libraries.items()):
                layer.add_path(os.path.realpath(path), f"opt/shoal/lib/{soname}")
            layer.add_path(os.path.realpath(loader), f"opt/shoal/lib/{LOADER_NAME}")
            if module_name is not None:
                layer.add_dir("opt/shoal/lib/shoal")
                layer.add_path(patched_module, f"opt/shoal/lib/shoal/{module_name}")
            added_dirs = set()
            for path, relative in sources:
                parent = os.path.dirname(relative)
                if parent and parent not in added_dirs:
                    layer.add_dir(f"opt/shoal/python/shoal/{parent}")
                    added_dirs.add(parent)
                layer.add_path(path, f"opt/shoal/python/shoal/{relative}")
            layer.add_path(os.path.realpath(BUSYBOX), "bin/busybox")
            for applet in BUSYBOX_LINKS:
                layer.add_symlink(f"bin/{applet}", "busybox")
        if module_name is None:
            cmd, env = ["/bin/cp", "-a", f"{PREFIX}/.", "/mnt/shoal/"], ["PATH=/bin"]
        else:
            cmd = [f"{PREFIX}/bin/shoal", "serve", "--model-repository", "/models"]
            env = ["PATH=/bin", f"LD_LIBRARY_PATH={PREFIX}/lib"]
        digest = oci_archive.write_archive(output, image, layer, cmd=cmd, env=env)
    return digest, sorted(libraries)


def main(argv):
    parser = argparse.ArgumentParser(
        description="Build the Shoal agent image (an OCI archive) from a shoal binary.")
    parser.add_argument("--shoal", required=True, help="the shoal binary to bundle")
    parser.add_argument("--sdk", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "..", "..", "sdk", "python", "shoal"),
                        help="the Python SDK package folder (default: this checkout's)")
    parser.add_argument("--image", default=DEFAULT_IMAGE,
                        help=f"image name and tag (default {DEFAULT_IMAGE})")
    parser.add_argument("--output", required=True, help="the OCI archive to write")
    parser.add_argument("--serve", metavar="MODULE",
                        help="also bundle this TorchScript runtime module "
                             "(BUILD/src/serve/libshoal_serve_torch.so) and its libraries, for "
                             "`shoal serve` pods")
    args = parser.parse_args(argv)
    try:
        digest, libraries = build(args.shoal, os.path.normpath(args.sdk), args.image, args.output,
                                  args.serve)
    except (ImageError, ValueError, OSError) as e:
        print(f"agent_image: error: {e}", file=sys.stderr)
        return 1
    size_mb = os.path.getsize(args.output) / 1e6
    print(f"agent_image: wrote {args.output} ({args.image}, {digest}, {size_mb:.1f} MB, "
          f"libraries: {' '.join(libraries)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
