"""Writes single-layer OCI image archives (an oci-layout in a tar) without a registry or daemon.

`ctr images import`, `podman load` and `skopeo copy oci-archive:...` read what this writes.
The layer is streamed to a file beside the output while it is hashed, then copied into the
archive from disk, so an image of several gigabytes never sits in memory.

    with LayerWriter(scratch_path) as layer:
        layer.add_path("/usr/bin/python3", "usr/bin/python3")
        layer.add_bytes("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\\n")
    write_archive(output, "localhost/name:tag", layer, entrypoint=["/bin/sh"])

Stdlib only: the agent image is built on machines that have nothing but Python 3.
"""

import hashlib
import io
import json
import os
import tarfile

OCI_LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'
DEFAULT_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


class LayerWriter:
    """An uncompressed layer tar written to `path`; digest and size are known after close().

    Entries are added in the order given; a directory must be added before what it holds only
    if its mode or owner matters (runtimes create missing parents as 0755 root).
    """

    def __init__(self, path):
        self.path = path
        self.digest = None
        self.size = 0
        self._sha = hashlib.sha256()
        self._file = open(path, "wb")
        # "w|" writes a pure stream: tarfile never seeks, so every byte passes through write().
        self._tar = tarfile.open(fileobj=self, mode="w|", format=tarfile.PAX_FORMAT)

    def write(self, data):
        self._sha.update(data)
        self.size += len(data)
        return self._file.write(data)

    def add_path(self, host_path, arcname):
        """Adds one file, directory or symlink as it is on this machine (not recursively).

        Files with several links become tar hard links to the first one added.
        """
        info = self._tar.gettarinfo(host_path, arcname)
        if info.isreg():
            with open(host_path, "rb") as source:
                self._tar.addfile(info, source)
        else:
            self._tar.addfile(info)

    def add_bytes(self, arcname, data, mode=0o644):
        info = tarfile.TarInfo(arcname)
        info.size = len(data)
        info.mode = mode
        self._tar.addfile(info, io.BytesIO(data))

    def add_dir(self, arcname, mode=0o755):
        info = tarfile.TarInfo(arcname)
        info.type = tarfile.DIRTYPE
        info.mode = mode
        self._tar.addfile(info)

    def add_symlink(self, arcname, target):
        info = tarfile.TarInfo(arcname)
        info.type = tarfile.SYMTYPE
        info.linkname = target
        info.mode = 0o777
        self._tar.addfile(info)

    def close(self):
        if self.digest is None:
            self._tar.close()
            self._file.close()
            self.digest = "sha256:" + self._sha.hexdigest()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_archive(output, ref, layer, entrypoint=None, cmd=None, env=None, workdir="/"):
    """Writes the OCI archive `output` holding one image `ref` (name:tag) made of `layer`.

    `layer` is a closed LayerWriter; its file is copied in, not moved. Returns the manifest
    digest. The file appears complete or not at all (written beside, then renamed).
    """
    if ":" not in ref.rsplit("/", 1)[-1]:
        raise ValueError(f"image name '{ref}' has no tag (expected NAME:TAG)")
    layer.close()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": env if env is not None else DEFAULT_ENV, "WorkingDir": workdir},
        "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
        "history": [{"created_by": "tools/kubernetes/oci_archive.py"}],
    }
    if entrypoint is not None:
        config["config"]["Entrypoint"] = entrypoint
    if cmd is not None:
        config["config"]["Cmd"] = cmd
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer.digest, "size": layer.size}],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": len(manifest_bytes),
            "platform": {"architecture": "amd64", "os": "linux"},
            # containerd names the imported image after the first; other tools after the tag.
            "annotations": {"io.containerd.image.name": ref,
                            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]},
        }],
    }

    def blob_name(digest):
        return "blobs/sha256/" + digest.split(":", 1)[1]

    partial = output + ".partial"
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
        def add_bytes(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))

        add_bytes("oci-layout", OCI_LAYOUT)
        add_bytes("index.json", json.dumps(index, sort_keys=True).encode())
        add_bytes(blob_name(config_digest), config_bytes)
        add_bytes(blob_name(manifest_digest), manifest_bytes)
        info = tarfile.TarInfo(blob_name(layer.digest))
        info.size = layer.size
        info.mode = 0o644
        with open(layer.path, "rb") as source:
            archive.addfile(info, source)
    os.replace(partial, output)
    return manifest_digest
