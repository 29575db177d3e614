#!/usr/bin/env python3
"""Builds the Kubernetes test cluster's images as OCI archives, cached by what they hold.

  images.py pause   NAME CACHE_DIR                 the pod sandbox (pause.c, static)
  images.py busybox NAME CACHE_DIR                 Debian's static busybox with its applets
  images.py debian  NAME CACHE_DIR PACKAGE...      the installed Debian packages PACKAGE... and
                                                   everything they depend on, from this machine
  images.py spark   NAME CACHE_DIR VENV PACKAGE... a Spark executor image: `debian` of PACKAGE...
                                                   (a Java runtime among them), the virtual
                                                   environment VENV (with PySpark) at its path,
                                                   and spark_executor_entrypoint.py

Each prints the archive's path as its last line. An archive is named after the image and a
hash of its inputs (package versions, this script), so a second call only finds it; nothing
is downloaded. `debian` takes the files each package installed (dpkg-query -L) from this
machine, closed over Depends and Pre-Depends among installed packages, so the image holds
exactly the host's python3, torch, ... and needs neither a registry nor debootstrap.
"""

import hashlib
import os
import re
import stat
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "kubernetes"))
import oci_archive  # noqa: E402

PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = b"root:x:0:\nnogroup:x:65534:\n"
# Left out of `debian` images: documentation (as Debian's own minimal images do, with dpkg's
# path-exclude), and C headers and static libraries, which nothing loads at run time (about
# 270 MB of the python image, pulled in by -dev packages in python3-sklearn's closure).
SKIPPED_PREFIXES = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/info/",
                    "/usr/share/lintian/", "/usr/share/locale/", "/usr/include/")
SKIPPED_SUFFIXES = (".a",)
# Debian 12 merges /usr: these are symlinks into /usr on the host and in the image.
MERGED_USR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def log(message):
    print(f"images: {message}", file=sys.stderr, flush=True)


def die(message):
    print(f"images: error: {message}", file=sys.stderr)
    sys.exit(1)


def input_hash(*parts):
    sha = hashlib.sha256()
    for script in (__file__, oci_archive.__file__):
        with open(script, "rb") as f:
            sha.update(f.read())
    for part in parts:
        sha.update(part if isinstance(part, bytes) else str(part).encode())
        sha.update(b"\0")
    return sha.hexdigest()[:16]


def archive_slug(name):
    return name.rsplit("/", 1)[-1].replace(":", "-")


def archive_path(cache_dir, name, key):
    return os.path.join(cache_dir, f"{archive_slug(name)}-{key}.tar")


def remove_other_versions(cache_dir, name, keep):
    """An image's archives are gigabytes and one is current: the others go, so that the cache
    does not fill the disk the test cluster's containerd unpacks images onto."""
    pattern = re.compile(re.escape(archive_slug(name)) + r"-[0-9a-f]{16}\.tar")
    for entry in os.listdir(cache_dir):
        path = os.path.join(cache_dir, entry)
        if pattern.fullmatch(entry) and path != keep:
            os.unlink(path)
            log(f"{name}: removed the older archive {path}")


def build(cache_dir, name, key, fill, entrypoint=None, cmd=None, env=None):
    """Returns the cached archive for `key`, building it with fill(layer) when absent."""
    output = archive_path(cache_dir, name, key)
    if os.path.exists(output):
        log(f"{name}: cached {output}")
        remove_other_versions(cache_dir, name, output)
        return output
    os.makedirs(cache_dir, exist_ok=True)
    started = time.monotonic()
    with tempfile.NamedTemporaryFile(dir=cache_dir, prefix=".layer-", delete=True) as scratch:
        with oci_archive.LayerWriter(scratch.name) as layer:
            fill(layer)
        oci_archive.write_archive(output, name, layer, entrypoint=entrypoint, cmd=cmd, env=env)
    log(f"{name}: built {output} ({os.path.getsize(output) / 1e6:.1f} MB, "
        f"{time.monotonic() - started:.1f} s)")
    remove_other_versions(cache_dir, name, output)
    return output


def add_base_files(layer):
    layer.add_dir("etc")
    layer.add_bytes("etc/passwd", PASSWD)
    layer.add_bytes("etc/group", GROUP)
    layer.add_dir("tmp", mode=0o1777)
    layer.add_dir("root", mode=0o700)


# ------------------------------------------------------------------------------------------
# pause and busybox


def cmd_pause(name, cache_dir):
    source = os.path.join(HERE, "pause.c")
    with open(source, "rb") as f:
        key = input_hash(f.read(), compiler_version())

    def fill(layer):
        with tempfile.TemporaryDirectory() as work:
            binary = os.path.join(work, "pause")
            subprocess.run(["gcc", "-Os", "-static", "-o", binary, source], check=True)
            layer.add_path(binary, "pause")

    return build(cache_dir, name, key, fill, entrypoint=["/pause"], env=[])


def compiler_version():
    return subprocess.run(["gcc", "--version"], check=True, capture_output=True).stdout


def cmd_busybox(name, cache_dir):
    busybox = "/bin/busybox"
    if not os.path.exists(busybox):
        die(f"{busybox} is missing (apt-get install busybox-static)")
    version = package_versions(["busybox-static"])
    applets = subprocess.run([busybox, "--list"], check=True, capture_output=True,
                             text=True).stdout.split()
    key = input_hash(version, " ".join(applets))

    def fill(layer):
        add_base_files(layer)
        layer.add_dir("bin")
        layer.add_path(os.path.realpath(busybox), "bin/busybox")
        for applet in applets:
            if applet != "busybox":
                layer.add_symlink(f"bin/{applet}", "busybox")

    return build(cache_dir, name, key, fill, entrypoint=["/bin/sh"],
                 env=["PATH=/bin"])


def package_versions(packages):
    out = subprocess.run(["dpkg-query", "-W", "-f=${binary:Package}=${Version}\n", *packages],
                         capture_output=True, text=True)
    if out.returncode != 0:
        die(f"not installed: {' '.join(packages)} ({out.stderr.strip()})")
    return out.stdout


# ------------------------------------------------------------------------------------------
# debian: installed packages and their dependency closure


def installed_packages():
    """{name: {binary, version, depends, provides}} for every installed package."""
    fields = "${db:Status-Abbrev}\t${binary:Package}\t${Package}\t${Version}\t" \
             "${Pre-Depends}\t${Depends}\t${Provides}\n"
    out = subprocess.run(["dpkg-query", "-W", "-f=" + fields], check=True,
                         capture_output=True, text=True).stdout
    packages, providers = {}, {}
    for line in out.splitlines():
        status, binary, name, version, pre_depends, depends, provides = line.split("\t")
        if not status.startswith("ii"):
            continue
        packages[name] = {"binary": binary, "version": version,
                          "depends": parse_relations(pre_depends) + parse_relations(depends)}
        for alternatives in parse_relations(provides):
            for virtual in alternatives:
                providers.setdefault(virtual, []).append(name)
    return packages, providers


def parse_relations(field):
    """'a (>= 1) | b:any, c' -> [['a', 'b'], ['c']]."""
    relations = []
    for group in field.split(","):
        names = [alt.strip().split(" ", 1)[0].split(":", 1)[0] for alt in group.split("|")]
        names = [n for n in names if n]
        if names:
            relations.append(names)
    return relations


def closure(roots, packages, providers):
    missing = [r for r in roots if r not in packages]
    if missing:
        die(f"not installed on this machine: {' '.join(missing)} (setup.sh installs them)")
    chosen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in chosen:
            continue
        chosen.add(name)
        for alternatives in packages[name]["depends"]:
            # The first alternative that is installed, as a package or through Provides.
            for alt in alternatives:
                if alt in packages:
                    todo.append(alt)
                    break
                if providers.get(alt):
                    todo.extend(providers[alt])
                    break
    return sorted(chosen)


def canonical(path):
    """The path with every directory symlink resolved, the last component kept as is."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def package_files(binaries):
    out = subprocess.run(["dpkg-query", "-L", *binaries], check=True, capture_output=True,
                         text=True).stdout
    return [line for line in out.splitlines() if line.startswith("/") and line not in ("/", "/.")]


def alternative_links(alternatives_dir="/var/lib/dpkg/alternatives"):
    """[(link, /etc/alternatives/NAME)] for every master and slave link update-alternatives made.

    An administrative file holds the mode, the master link, then slave name and link pairs up
    to an empty line.
    """
    links = []
    for name in sorted(os.listdir(alternatives_dir)) if os.path.isdir(alternatives_dir) else []:
        with open(os.path.join(alternatives_dir, name)) as f:
            lines = f.read().split("\n")
        if len(lines) < 2:
            continue
        links.append((lines[1], "/etc/alternatives/" + name))
        i = 2
        while i + 1 < len(lines) and lines[i]:
            links.append((lines[i + 1], "/etc/alternatives/" + lines[i]))
            i += 2
    return links


def rootfs_paths(files):
    """Canonical paths to copy: the files, their directories, and what their symlinks name.

    dpkg does not list the links update-alternatives made (libblas.so.3 -> /etc/alternatives/
    -> openblas), so an alternative whose chosen file is in the image brings its links, and
    symlink targets are followed until every one is in the image.
    """
    paths = set(collect_paths([canonical(f) for f in files]))
    extra = [canonical(link) for link, chosen in alternative_links()
             if os.path.islink(chosen) and canonical(os.path.realpath(chosen)) in paths
             and os.path.lexists(link)]
    return sorted(collect_paths(extra, paths))


def collect_paths(todo, paths=None):
    paths = set() if paths is None else paths
    while todo:
        path = todo.pop()
        if path in paths or path == "/" or path.startswith(SKIPPED_PREFIXES):
            continue
        if path.endswith(SKIPPED_SUFFIXES) and not os.path.isdir(path):
            continue
        if not os.path.lexists(path):
            continue  # a conffile removed by the admin, or a diverted file
        paths.add(path)
        todo.append(os.path.dirname(path))
        if os.path.islink(path):
            target = os.readlink(path)
            todo.append(canonical(os.path.join(os.path.dirname(path), target)))
    return paths


def debian_closure(roots):
    """(chosen packages, their `binary=version` lines) for `roots` and their dependencies."""
    packages, providers = installed_packages()
    chosen = closure(roots, packages, providers)
    versions = "\n".join(f"{packages[p]['binary']}={packages[p]['version']}" for p in chosen)
    return [packages[p]["binary"] for p in chosen], versions


def add_debian_files(layer, name, binaries):
    """The packages' files, as on this machine, with the links and base files they need."""
    paths = rootfs_paths(package_files(binaries))
    log(f"{name}: {len(binaries)} packages, {len(paths)} paths")
    for link in MERGED_USR_LINKS:
        if os.path.islink("/" + link) and os.path.exists("/" + link):
            layer.add_symlink(link, os.readlink("/" + link))
    add_base_files(layer)
    for path in paths:
        if path in ("/etc", "/tmp", "/root") or path.lstrip("/") in MERGED_USR_LINKS:
            continue
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            continue
        layer.add_path(path, path.lstrip("/"))
    # The host's loader cache: it names these libraries where they are here; the loader
    # falls back to its default directories for any it names that the image lacks.
    if os.path.exists("/etc/ld.so.cache"):
        layer.add_path("/etc/ld.so.cache", "etc/ld.so.cache")


def cmd_debian(name, cache_dir, roots):
    binaries, versions = debian_closure(roots)
    key = input_hash(name, versions)
    return build(cache_dir, name, key, lambda layer: add_debian_files(layer, name, binaries),
                 cmd=["python3"], env=oci_archive.DEFAULT_ENV + ["LANG=C.UTF-8"])


# ------------------------------------------------------------------------------------------
# spark: a Spark executor image for Spark's Kubernetes scheduler

SPARK_ENTRYPOINT = os.path.join(HERE, "spark_executor_entrypoint.py")
SPARK_ENTRYPOINT_IN_IMAGE = "/opt/shoal-spark/entrypoint.py"


def tree_paths(root):
    """Every path under `root` (itself included), parents first, in a stable order."""
    out = [root]
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for entry in dirs + sorted(files):
            out.append(os.path.join(folder, entry))
    return out


def tree_listing(paths):
    """What changes when a file of the tree does: each path's kind, size and mtime. Not a
    folder's size and mtime: they change with any entry made in it (byte code, Spark's work
    folders), listed or not, and the listed entries are there on their own lines."""
    lines = []
    for path in paths:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            lines.append(f"{path} {stat.S_IFMT(st.st_mode)}")
        else:
            lines.append(f"{path} {stat.S_IFMT(st.st_mode)} {st.st_size} {st.st_mtime_ns}")
    return "\n".join(lines)


def venv_image_paths(venv, spark_home):
    """The venv's paths that go into the image and its hash. What Python and Spark write into
    the venv as it is used (byte code; the executors' folders that Spark's local-cluster workers
    kept under $SPARK_HOME/work before the Spark backend gave them a SPARK_HOME of their own)
    is neither needed in the image nor allowed to change its hash: each new hash cost another
    2 GB archive and import."""
    written = os.path.join(os.path.realpath(spark_home), "work")
    return [path for path in tree_paths(os.path.realpath(venv))
            if "/__pycache__" not in path and path != written
            and not path.startswith(written + "/")
            and not stat.S_ISSOCK(os.lstat(path).st_mode)]


def java_home(binaries):
    """The Java runtime's folder among the packages' files (/usr/lib/jvm/NAME/bin/java)."""
    javas = sorted(f for f in package_files(binaries)
                   if re.fullmatch(r"/usr/lib/jvm/[^/]+/bin/java", f))
    if not javas:
        die("no Java runtime among the packages (give openjdk-17-jre-headless)")
    return os.path.dirname(os.path.dirname(javas[0]))


def cmd_spark(name, cache_dir, venv, roots):
    """The packages `roots` (a Java runtime, the Python the venv was made from, whatever the
    tasks need) and the venv at its own path, so that the driver's PYSPARK_PYTHON names a
    Python with PySpark in the executors too; SPARK_HOME is PySpark's folder (its jars)."""
    python = os.path.join(venv, "bin", "python")
    if not os.access(python, os.X_OK):
        die(f"no Python at {python}: {venv} is not a virtual environment (setup.sh makes it)")
    found = subprocess.run([python, "-c", "import os, pyspark; "
                            "print(os.path.dirname(pyspark.__file__))"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        die(f"{python} cannot import pyspark: {found.stderr.strip().splitlines()[-1:]}")
    spark_home = found.stdout.strip()
    binaries, versions = debian_closure(roots)
    home = java_home(binaries)
    venv_paths = venv_image_paths(venv, spark_home)
    with open(SPARK_ENTRYPOINT, "rb") as f:
        entrypoint = f.read()
    key = input_hash(name, versions, home, tree_listing(venv_paths), entrypoint)

    def fill(layer):
        add_debian_files(layer, name, binaries)
        for path in venv_paths:
            layer.add_path(path, path.lstrip("/"))
        layer.add_dir("opt/shoal-spark")
        layer.add_bytes(SPARK_ENTRYPOINT_IN_IMAGE.lstrip("/"), entrypoint, mode=0o755)

    return build(cache_dir, name, key, fill,
                 entrypoint=["/usr/bin/python3", "-I", SPARK_ENTRYPOINT_IN_IMAGE],
                 env=oci_archive.DEFAULT_ENV + ["LANG=C.UTF-8", f"JAVA_HOME={home}",
                                                f"SPARK_HOME={spark_home}"])


def main(argv):
    if len(argv) < 3 or argv[0] not in ("pause", "busybox", "debian", "spark"):
        sys.stderr.write(__doc__)
        return 2
    kind, name, cache_dir = argv[0], argv[1], argv[2]
    if kind == "pause":
        print(cmd_pause(name, cache_dir))
    elif kind == "busybox":
        print(cmd_busybox(name, cache_dir))
    elif kind == "spark":
        if len(argv) < 5:
            die("spark needs a VENV and at least one PACKAGE")
        print(cmd_spark(name, cache_dir, argv[3], argv[4:]))
    else:
        if len(argv) < 4:
            die("debian needs at least one PACKAGE")
        print(cmd_debian(name, cache_dir, argv[3:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
