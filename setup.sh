#!/usr/bin/env bash
# Installs everything Shoal needs on Debian 12, builds it, and puts `shoal` on PATH.
# Idempotent: a second run installs nothing and rebuilds only what changed.
#   ./setup.sh            install + build
#   ./setup.sh --no-build install only
#   ./setup.sh --serving-peers   the Debian packages, then only the serving peers' Python
#                                environments (bench/serving_peers.py), not the rest
#   ./setup.sh --spark-peers     the same for the Spark benchmarks' TensorFlowOnSpark venv
#                                (bench/spark_recovery.py)
set -euo pipefail
cd "$(dirname "$0")"
repo=$(pwd)

# Build toolchain and libraries (C++; clang only checks the locking annotations,
# tests/thread_safety), the demo's Python stack, benchmark anchors,
# Slurm with munge (the Slurm backend's test cluster, tests/slurm/cluster.sh), and Java with
# Maven (the YARN backend's test cluster, tests/yarn/cluster.sh), and clang with its libFuzzer
# and sanitizer runtimes (the fuzz targets, fuzz/run.sh), and ccache (the sanitizer and fuzz
# builds, sanitize/run.sh), and containerd, runc, the CNI plugins, busybox and patchelf (the
# Kubernetes backend's test cluster and agent image, tests/kubernetes/cluster.sh), and Prometheus
# and Chromium (the dashboard's tests: a real scrape, and the pages in a real browser driven
# headless by Playwright, which downloads no browser of its own).
packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libyaml-cpp-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev
  libgtest-dev libgmock-dev libssl-dev libboost-dev libsimdjson-dev
  python3-dev python3-distutils python3-setuptools python3-wheel python3-psutil python3-yaml
  python3-packaging libtorch-dev libgloo-dev
  python3 python3-torch python3-sklearn python3-numpy python3-pytest python3-venv
  python3-grpcio python3-grpc-tools
  openmpi-bin python3-mpi4py hyperfine procps iproute2 prometheus chromium
  python3-fastapi python3-uvicorn gunicorn python3-uvloop python3-httptools
  munge slurm-wlm
  openjdk-17-jdk-headless maven curl
  clang-14 libclang-rt-14-dev ccache
  containerd runc containernetworking-plugins busybox-static patchelf openssl libcurl4-openssl-dev
)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
done
# Node.js and npm build the web dashboard (web/): Debian's, unless the machine has its own.
if ! command -v npm >/dev/null; then
  for p in nodejs npm; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
  done
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  # Slurm's, munge's and prometheus' packages would start their daemons with a default
  # configuration; the test cluster (tests/slurm/cluster.sh) runs its own, and the tests their
  # own prometheus. A policy-rc.d that denies starts keeps them from running, only for this
  # install and only where the machine has none of its own.
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${sudo_cmd[@]}" chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  # -q keeps one line per package: the install takes minutes and should show that it moves.
  rc=0
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}" || rc=$?
  if [ "$own_policy" = 1 ]; then "${sudo_cmd[@]}" rm -f /usr/sbin/policy-rc.d; fi
  [ "$rc" -eq 0 ] || { echo "setup: apt-get install failed (exit $rc)" >&2; exit "$rc"; }
else
  echo "setup: every Debian package is already installed"
fi

# The framework examples' Python environments (PyPI; Debian lacks these frameworks), one per
# framework in a fixed cache folder that every clone shares: made once (minutes), then reused
# while its requirements file is unchanged. SHOAL_SKIP_VENVS=1 skips them.
venv_root=/var/cache/shoal/venvs
# make_venv NAME REQUIREMENTS [--system-site-packages]
make_venv() {
  local name=$1 requirements=$repo/$2 dir=$venv_root/$1 venv_flags=${3:-}
  if [ -x "$dir/bin/python" ] && cmp -s "$requirements" "$dir/.shoal-requirements"; then
    echo "setup: Python environment $name is up to date ($dir)"
    return
  fi
  echo "setup: making the $name Python environment in $dir (pip, from $2)"
  "${sudo_cmd[@]}" mkdir -p "$venv_root"
  "${sudo_cmd[@]}" rm -rf "$dir"
  # shellcheck disable=SC2086  # venv_flags is empty or one flag
  "${sudo_cmd[@]}" /usr/bin/python3 -m venv $venv_flags "$dir"
  local pip=("${sudo_cmd[@]}" "$dir/bin/pip" install -q --disable-pip-version-check
             --progress-bar off --no-cache-dir)
  if [ "$name" = horovod ]; then
    # Horovod is a C++ sdist built against Debian's torch (seen through
    # --system-site-packages, hence no build isolation): PyTorch with gloo, no MPI. Its
    # runtime wheels go first. About 6.5 minutes on 2 cores. examples/horovod/INSTALL.md.
    local wheels
    wheels=$(mktemp)  # a file, not <(...): sudo closes inherited descriptors
    grep -v '^horovod==' "$requirements" >"$wheels"
    chmod 644 "$wheels"
    "${pip[@]}" -r "$wheels"
    rm -f "$wheels"
    "${sudo_cmd[@]}" env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
      HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_CPU_OPERATIONS=GLOO MAKEFLAGS=-j2 \
      "$dir/bin/pip" install -q --disable-pip-version-check --progress-bar off --no-cache-dir \
      --no-build-isolation "$(grep '^horovod==' "$requirements")"
  else
    "${pip[@]}" -r "$requirements"
  fi
  "${sudo_cmd[@]}" cp "$requirements" "$dir/.shoal-requirements"
}
# The serving peers of bench/serving_peers.py (TorchServe, MLServer, KServe, Ray Serve, LitServe),
# one venv each over Debian's torch 1.13 (--system-site-packages; NumPy pinned below 2 for it):
# opt-in, not part of the default setup. docs/benchmarks/serving.md#peers.
if [ "${1:-}" = "--serving-peers" ]; then
  for peer in torchserve mlserver kserve ray litserve; do
    make_venv "peer-$peer" "bench/serving/peers/requirements-$peer.txt" --system-site-packages
  done
  exit 0
fi
# TensorFlowOnSpark 2.2.5 with the TensorFlow example's TensorFlow and the Spark backend's
# PySpark, the anchor of bench/spark_recovery.py: opt-in. docs/benchmarks/spark.md.
if [ "${1:-}" = "--spark-peers" ]; then
  make_venv peer-tfos bench/spark/requirements-tfos.txt
  exit 0
fi
if [ "${SHOAL_SKIP_VENVS:-0}" != 1 ]; then
  make_venv tensorboard tools/tensorboard/requirements.txt --system-site-packages
  make_venv jax examples/jax/requirements.txt
  make_venv paddle examples/paddle/requirements.txt
  make_venv tensorflow examples/tensorflow/requirements.txt
  make_venv horovod examples/horovod/requirements.txt --system-site-packages
  make_venv browser tests/ui/requirements.txt --system-site-packages  # Playwright, for tests/e2e/test_ui_browser.py
  make_venv spark tests/spark/requirements.txt --system-site-packages  # PySpark 4.3 + pyarrow: --backend spark, Parquet datasets
fi

# The Python training SDK (import shoal; sdk/python, distribution shoal-sdk) installed as a
# package into Debian's python3 and every framework venv, so that tasks import it under any of
# them with no PYTHONPATH. A wheel is built once from a copy of sdk/python (the build writes
# build/ and *.egg-info beside its sources) with Debian's setuptools and wheel, then installed
# with --no-deps --no-index: nothing is downloaded. An interpreter whose installed shoal/*.py
# already equal this checkout's is skipped, so a second run costs one Python start per
# interpreter. Debian's python3: pip installs into /usr/local/lib/python3.*/dist-packages, which
# apt does not manage; --break-system-packages only lifts Debian's EXTERNALLY-MANAGED guard, and
# --no-deps keeps pip from touching any apt-installed module (docs/sdk.md).
sdk_wheel_dir=
sdk_current() {  # sdk_current PYTHON: is this checkout's SDK what PYTHON has installed?
  "$1" -I - "$repo/sdk/python" <<'PY'
import importlib.metadata as md, pathlib, sys
src = pathlib.Path(sys.argv[1])
try:
    files = md.distribution("shoal-sdk").files or []
except md.PackageNotFoundError:
    sys.exit(1)
have = {f.as_posix(): f.locate() for f in files if f.suffix == ".py" and f.parts[0] == "shoal"}
want = {p.relative_to(src).as_posix(): p for p in (src / "shoal").rglob("*.py")
        if "__pycache__" not in p.parts}
sys.exit(0 if have.keys() == want.keys() and all(
    pathlib.Path(have[k]).is_file() and pathlib.Path(have[k]).read_bytes() == want[k].read_bytes()
    for k in want) else 1)
PY
}
install_sdk() {  # install_sdk PYTHON [PIP FLAGS...]
  local python=$1
  shift
  if sdk_current "$python"; then
    echo "setup: the training SDK is up to date for $python"
    return
  fi
  if [ -z "$sdk_wheel_dir" ]; then
    sdk_wheel_dir=$(mktemp -d)
    cp -r "$repo/sdk/python" "$sdk_wheel_dir/src"
    rm -rf "$sdk_wheel_dir/src/build" "$sdk_wheel_dir/src/"*.egg-info
    /usr/bin/python3 -m pip wheel -q --disable-pip-version-check --no-deps --no-index \
      --no-build-isolation -w "$sdk_wheel_dir" "$sdk_wheel_dir/src" >/dev/null
    chmod -R a+rX "$sdk_wheel_dir"
  fi
  echo "setup: installing the training SDK (shoal-sdk) for $python"
  "${sudo_cmd[@]}" "$python" -m pip install -q --disable-pip-version-check --no-deps --no-index \
    --root-user-action=ignore --force-reinstall "$@" "$sdk_wheel_dir"/shoal_sdk-*.whl
}
install_sdk /usr/bin/python3 --break-system-packages
for venv in tensorboard jax paddle tensorflow horovod spark; do
  if [ -x "$venv_root/$venv/bin/python" ]; then install_sdk "$venv_root/$venv/bin/python"; fi
done
[ -z "$sdk_wheel_dir" ] || rm -rf "$sdk_wheel_dir"
# Earlier setups pointed Debian's python3 at the checkout through a .pth file instead.
for pth in "$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')/shoal-sdk.pth" \
           "$(/usr/bin/python3 -m site --user-site)/shoal-sdk.pth"; do
  if [ -e "$pth" ]; then "${sudo_cmd[@]}" rm -f "$pth"; fi
done

# The web dashboard's build tools and chart library (esbuild, TypeScript, uPlot), pinned by
# web/package-lock.json, into web/node_modules; redone only when the lock file changed.
if ! cmp -s "$repo/web/package-lock.json" "$repo/web/node_modules/.shoal-package-lock.json"; then
  echo "setup: installing the web UI's npm packages (web/package-lock.json)"
  (cd "$repo/web" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$repo/web/package-lock.json" "$repo/web/node_modules/.shoal-package-lock.json"
fi

# The YARN test cluster's jar (tests/yarn/minicluster) and the YARN backend's application master
# (src/backends/yarn/am): Hadoop's jars from Maven Central into a
# fixed Maven repository that every clone shares (about 350 MB, once), then a Maven build,
# skipped while the jar is newer than its sources. SHOAL_SKIP_YARN=1 skips it.
if [ "${SHOAL_SKIP_YARN:-0}" != 1 ]; then
  m2=/var/cache/shoal/m2
  if [ ! -w "$m2" ]; then
    "${sudo_cmd[@]}" mkdir -p "$m2"
    "${sudo_cmd[@]}" chown "$(id -u):$(id -g)" "$m2"
  fi
  SHOAL_M2_REPO=$m2 "$repo/tests/yarn/cluster.sh" build
  # Shoal's YARN application master (--backend yarn), compiled against the same Hadoop jars.
  SHOAL_M2_REPO=$m2 "$repo/src/backends/yarn/am/build.sh"
fi

# The Kubernetes test cluster's binaries (tests/kubernetes/cluster.sh build): Kubernetes and
# etcd built from the Go module proxy with the Go at /usr/local/go (Debian's is too old), about
# 6 minutes once, then cached by version under /var/cache/shoal/kubernetes.
# SHOAL_SKIP_KUBERNETES=1 skips it.
if [ "${SHOAL_SKIP_KUBERNETES:-0}" != 1 ]; then
  if [ -x /usr/local/go/bin/go ]; then
    "${sudo_cmd[@]}" "$repo/tests/kubernetes/cluster.sh" build
  else
    echo "setup: no Go at /usr/local/go: the Kubernetes test cluster cannot be built (https://go.dev/dl/)" >&2
  fi
fi

[ "${1:-}" = "--no-build" ] && exit 0

echo "setup: building (cmake + ninja, -j2) in $repo/build"
cmake -S "$repo" -B "$repo/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C "$repo/build" -j2

# Put the binary on PATH: /usr/local/bin for root, ~/.local/bin otherwise.
if [ "$(id -u)" -eq 0 ]; then bindir=/usr/local/bin; else bindir="$HOME/.local/bin"; fi
mkdir -p "$bindir"
ln -sf "$repo/build/src/cli/shoal" "$bindir/shoal"
echo "setup: done; $(command -v shoal || echo "$bindir/shoal") -> $repo/build/src/cli/shoal"
case ":$PATH:" in *":$bindir:"*) ;; *) echo "setup: add $bindir to your PATH";; esac
