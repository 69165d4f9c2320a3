"""Container images: the base (debootstrap + import) and one image per workload folder.

`docker/base/build-base.sh` makes `heapcast/base:bookworm` from Debian's packages (no registry
is reachable); each `docker/workloads/<image>/Dockerfile` builds `FROM` it. Building is
idempotent: a workload image carries a label with the hash of its build context and is
rebuilt only when that changes (or the base changed); the base is built only when missing.

    python -m tasks.replay.images [IMAGE...]     build the base and the named (default: all) images
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from docker.errors import APIError, BuildError, ImageNotFound
from prefect import get_run_logger, task
from pydantic import BaseModel

from tasks.core.config import PROJECT_DIR
from tasks.replay.runners.base import EngineError, RunnerUnavailable
from tasks.replay.runners.docker_runner import connect, engine_host
from tasks.replay.workloads import IMAGE_PREFIX, IMAGE_TAG, IMAGES_DIR

BASE_IMAGE = "heapcast/base:bookworm"
BASE_SCRIPT = PROJECT_DIR / "docker" / "base" / "build-base.sh"
CONTEXT_LABEL = "heapcast.context-sha256"
BASE_LABEL = "heapcast.base-id"


class ImageBuild(BaseModel):
    image: str
    tag: str
    image_id: str
    built: bool
    seconds: float


def _log(msg: str) -> None:
    try:
        get_run_logger().info(msg)
    except Exception:  # outside a flow or task run
        print(msg, file=sys.stderr)


def context_sha256(folder: Path) -> str:
    """Hash of every file's relative path, mode and bytes under a build context."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode() + b"\0")
            h.update(oct(p.stat().st_mode & 0o777).encode() + b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()


def build_base(host: str | None = None, force: bool = False) -> ImageBuild:
    """Build the base image with docker/base/build-base.sh unless it exists."""
    host = host or engine_host()
    client = connect(host)
    t0 = time.monotonic()
    try:
        if not force:
            try:
                img = client.images.get(BASE_IMAGE)
                return ImageBuild(
                    image="base", tag=BASE_IMAGE, image_id=img.id, built=False, seconds=0.0
                )
            except ImageNotFound:
                pass
        _log(f"building {BASE_IMAGE} (debootstrap minbase: about a minute or two)")
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "DOCKER_HOST": host,
        }
        if force:
            env["HEAPCAST_REBUILD"] = "1"
        proc = subprocess.run(
            [str(BASE_SCRIPT), BASE_IMAGE], env=env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{BASE_SCRIPT} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
            )
        return _built("base", BASE_IMAGE, client.images.get(BASE_IMAGE).id, t0)
    finally:
        client.close()


def _built(image: str, tag: str, image_id: str, t0: float) -> ImageBuild:
    """An image built just now, in the seconds since t0 (time.monotonic)."""
    return ImageBuild(
        image=image, tag=tag, image_id=image_id, built=True, seconds=round(time.monotonic() - t0, 1)
    )


def build_workload_image(
    image: str, base_id: str, host: str | None = None, force: bool = False
) -> ImageBuild:
    """Build docker/workloads/<image>/ as heapcast/<image>:bookworm unless it is up to date."""

    folder = IMAGES_DIR / image
    if not (folder / "Dockerfile").is_file():
        raise FileNotFoundError(f"image {image!r}: no Dockerfile at {folder / 'Dockerfile'}")
    tag = f"{IMAGE_PREFIX}{image}:{IMAGE_TAG}"
    sha = context_sha256(folder)
    client = connect(host)
    t0 = time.monotonic()
    try:
        if not force:
            try:
                img = client.images.get(tag)
                labels = img.labels or {}
                if labels.get(CONTEXT_LABEL) == sha and labels.get(BASE_LABEL) == base_id:
                    return ImageBuild(
                        image=image, tag=tag, image_id=img.id, built=False, seconds=0.0
                    )
            except ImageNotFound:
                pass
        _log(f"building {tag} from {folder}")
        try:
            # host network: apt inside the build reaches the mirror without the engine's
            # bridge (which needs iptables) being set up
            img, _logs = client.images.build(
                path=str(folder),
                tag=tag,
                rm=True,
                forcerm=True,
                network_mode="host",
                labels={CONTEXT_LABEL: sha, BASE_LABEL: base_id},
                pull=False,
            )
        except BuildError as err:
            tail = "".join(str(c.get("stream", c.get("error", ""))) for c in err.build_log)
            raise RuntimeError(
                f"image {image!r}: docker build failed: {err.msg}\n{tail[-3000:]}"
            ) from None
        except APIError as err:
            raise EngineError(f"image {image!r}: the engine failed the build: {err}") from err
        return _built(image, tag, img.id, t0)
    finally:
        client.close()


@contextmanager
def _one_builder(host: str) -> Iterator[None]:
    """One build at a time per engine on this machine: two processes that find an image missing
    (a flow beside a test, two test workers) would both run debootstrap or build the same tag;
    the second waits, then finds it up to date."""
    name = "heapcast-images-" + hashlib.sha256(host.encode()).hexdigest()[:12] + ".lock"
    fd = os.open(Path(tempfile.gettempdir()) / name, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def build_all(
    images: list[str],
    host: str | None = None,
    force: bool = False,
) -> list[ImageBuild]:
    host = host or engine_host()
    with _one_builder(host):
        return _build_all(images, host, force)


def _build_all(images: list[str], host: str, force: bool) -> list[ImageBuild]:
    base = build_base(host, force=force)
    _log(f"{base.tag}: {f'built in {base.seconds:.1f} s' if base.built else 'up to date'}")
    out = [base]
    for image in images:
        b = build_workload_image(image, base.image_id, host, force=force)
        _log(f"{b.tag}: {f'built in {b.seconds:.1f} s' if b.built else 'up to date'}")
        out.append(b)
    return out


@task(
    retries=1,
    retry_delay_seconds=10,
    retry_condition_fn=lambda task, run, state: not _is_unavailable(state),
)
def build_images(images: list[str], force: bool = False) -> list[ImageBuild]:
    """Build the base image and the named workload images (skipping what is up to date)."""
    return build_all(images, force=force)


def _is_unavailable(state) -> bool:
    try:
        state.result()
    except RunnerUnavailable:
        return True
    except Exception:
        return False
    return False


if __name__ == "__main__":
    from tasks.replay.workloads import load_catalog

    names = sys.argv[1:] or load_catalog().images()
    try:
        for b in build_all(names):
            print(
                f"{b.tag:32s} {b.image_id[:19]} {f'built {b.seconds:.1f}s' if b.built else 'cached'}"
            )
    except RunnerUnavailable as err:
        sys.exit(f"heapcast images: {err}")
