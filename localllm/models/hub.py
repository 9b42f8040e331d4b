"""Pull models from the Hugging Face hub (or the mirror HF_ENDPOINT names) into the store.

`localllm pull org/repo[:QUANT_OR_FILE]` takes one GGUF model (all shards of a split
one) or a whole MLX repository. huggingface_hub does the talking: the repository
listing with sizes and checksums, authentication (HF_TOKEN), the endpoint, its HTTP
session and error types. This module streams each file itself (resuming a dropped
connection, as huggingface_hub does) and owns where the bytes go: each file is
written to `<store>/.pull-<name>/<commit>/<file>.part`, so an interrupted pull,
even a killed process, resumes from the bytes it has; each file is checked against
the size and hash the hub lists (SHA-256 for LFS files, the git blob id for small
ones) while it downloads; only a complete, verified model is renamed into the store,
with `localllm.json` saying where it came from.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import fnmatch
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from localllm.errors import DownloadFailed, LocalLLMError
from localllm.fsguard import Root
from localllm.models import fit, projector, transfer
from localllm.models.gguf import read_meta
from localllm.models.transfer import Progress
from localllm.provenance import PROVENANCE, read_provenance
from localllm.units import format_bytes

log = logging.getLogger(__name__)

_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_HEADER_PROBES = (8 * 1024 * 1024, 64 * 1024 * 1024)  # bytes read to parse a GGUF header


@dataclass(frozen=True, slots=True)
class RemoteFile:
    path: str  # relative to the repository root
    size: int | None
    sha256: str | None  # LFS files
    blob_id: str | None  # the git object id (SHA-1 of "blob <size>\\0" + content)


@dataclass(frozen=True, slots=True)
class PullPlan:
    repo: str
    commit: str
    kind: Literal["gguf", "mlx"]
    files: tuple[RemoteFile, ...]
    name: str  # the store name it lands under
    endpoint: str
    others: tuple[tuple[str, int], ...] = ()  # the repository's other GGUF models: label, bytes

    @property
    def total(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def target(self) -> str:
        """The file llama.cpp opens (a split GGUF's first shard), or '' for a folder."""
        return self.files[0].path if self.kind == "gguf" else ""


def endpoint() -> str:
    """The hub's address: HF_ENDPOINT when set (read now, not when huggingface_hub loaded)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def split_spec(spec: str) -> tuple[str, str]:
    """'org/repo:Q4_K_M' -> ('org/repo', 'Q4_K_M')."""
    repo, _, pattern = spec.strip().partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise DownloadFailed(spec, "expected a repository as org/name, optionally :QUANT or :FILE")
    return repo, pattern


def _failure(repo: str, exc: BaseException, where: str) -> DownloadFailed:
    """One clear message for what huggingface_hub or the network raised."""
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        return DownloadFailed(
            repo,
            f"the repository is gated: accept its terms on its page at {where} "
            "and set HF_TOKEN to a token of that account",
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return DownloadFailed(
            repo,
            f"no such repository at {where} (a private one needs HF_TOKEN; check the name)",
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return DownloadFailed(repo, f"the revision was not found at {where}")
    if isinstance(exc, errors.EntryNotFoundError):
        return DownloadFailed(repo, f"a listed file is missing at {where}: {exc}")
    if isinstance(exc, errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return DownloadFailed(repo, f"{where} answered HTTP {status}")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return DownloadFailed(repo, "the disk is full; free space and pull again to resume")
    module = type(exc).__module__.split(".")[0]
    if isinstance(exc, OSError) or module in ("httpx", "httpx2", "httpcore", "requests"):
        return DownloadFailed(
            repo, f"cannot reach {where} ({type(exc).__name__}: {exc}); no network?"
        )
    return DownloadFailed(repo, f"{type(exc).__name__}: {exc}")


# -- choosing files ---------------------------------------------------------------------


def list_repo(repo: str, revision: str | None = None) -> tuple[str, list[RemoteFile]]:
    """The commit and the files (with sizes and hashes) of a model repository."""
    from huggingface_hub import HfApi

    where = endpoint()
    try:
        info = HfApi(endpoint=where, token=_token()).model_info(
            repo, revision=revision, files_metadata=True
        )
    except Exception as exc:
        raise _failure(repo, exc, where) from None
    files = [
        RemoteFile(
            s.rfilename,
            s.lfs.size if s.lfs else s.size,
            s.lfs.sha256 if s.lfs else None,
            s.blob_id if not s.lfs else None,
        )
        for s in info.siblings or []
    ]
    for f in files:
        _check_name(repo, f.path)
    return str(info.sha or revision or "main"), files


def _check_name(repo: str, name: str) -> None:
    """A file name the hub lists must stay inside the model's folder: a listing naming
    an absolute path, '..' or a backslash is a hostile one, and nothing is pulled."""
    if (
        name.startswith("/")
        or "\\" in name
        or "\x00" in name
        or any(p in ("", ".", "..") for p in name.split("/"))
    ):
        raise DownloadFailed(
            repo,
            f"the hub lists a file named {name!r}, which would land outside the model's "
            "folder; nothing was downloaded",
        )


def _group(path: str) -> str:
    """A split GGUF's shards share a group: the name without -0000N-of-0000M."""
    return _SHARD.sub(".gguf", path)


def _matches(path: str, pattern: str) -> bool:
    base = path.rsplit("/", 1)[-1]
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(base, pattern)
    if pattern.lower().endswith(".gguf"):
        return pattern in (path, base)
    # a quant name, matched as a whole part of the name: Q4_K does not pick Q4_K_M
    stem = base.lower().removesuffix(".gguf")
    wanted = pattern.lower()
    return wanted == stem or wanted in re.split(r"[-.]", stem)


def choose(
    repo: str, files: list[RemoteFile], pattern: str
) -> tuple[Literal["gguf", "mlx"], list[RemoteFile]]:
    """Which files to pull: ('gguf', one model's shards) or ('mlx', the whole repository).
    Ambiguity and absence are DownloadFailed with the choices in the message."""
    ggufs = [
        f for f in files if f.path.lower().endswith(".gguf") and not projector.is_projector(f.path)
    ]
    names = {f.path for f in files}
    is_mlx = "config.json" in names and any(p.endswith(".safetensors") for p in names)
    if not ggufs:
        if not is_mlx:
            listing = ", ".join(sorted(names)[:12]) or "none"
            raise DownloadFailed(
                repo, f"it holds no GGUF file and is not an MLX model (files: {listing})"
            )
        if pattern:
            raise DownloadFailed(repo, f"an MLX repository is pulled whole; drop ':{pattern}'")
        return "mlx", sorted(files, key=lambda f: f.path)
    groups: dict[str, list[RemoteFile]] = {}
    for f in sorted(ggufs, key=lambda f: f.path):
        groups.setdefault(_group(f.path), []).append(f)
    if pattern:
        picked = {g: fs for g, fs in groups.items() if any(_matches(f.path, pattern) for f in fs)}
    else:
        picked = groups
    if len(picked) == 1:
        return "gguf", [*next(iter(picked.values())), *_projector_of(files)]
    pool = picked or groups
    choices = "; ".join(
        f"{repo}:{_label(g)} ({format_bytes(sum(f.size or 0 for f in fs))})"
        for g, fs in sorted(pool.items())
    )
    why = f"no GGUF file matches '{pattern}'" if pattern and not picked else "several GGUF files"
    raise DownloadFailed(repo, f"{why}; choose one: {choices}")


def _projector_of(files: list[RemoteFile]) -> list[RemoteFile]:
    """The repository's projector (mmproj), pulled with the model so that it reads
    images: the full-precision one when there are several (models/projector.py)."""
    found = {f.path: f for f in files if projector.is_projector(f.path)}
    name = projector.best(found)
    return [found[name]] if name is not None else []


def _label(group: str) -> str:
    return group.rsplit("/", 1)[-1].removesuffix(".gguf")


def plan_pull(spec: str, *, name: str | None = None, revision: str | None = None) -> PullPlan:
    repo, pattern = split_spec(spec)
    commit, files = list_repo(repo, revision)
    kind, chosen = choose(repo, files, pattern)
    groups: dict[str, int] = {}
    for f in files:
        if (
            f.path.lower().endswith(".gguf")
            and f not in chosen
            and not projector.is_projector(f.path)
        ):
            label = _label(_group(f.path))
            groups[label] = groups.get(label, 0) + (f.size or 0)
    default = _label(_group(chosen[0].path)) if kind == "gguf" else repo.rsplit("/", 1)[-1]
    store_name = name or default
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", store_name):
        raise DownloadFailed(repo, f"'{store_name}' is not a usable store name (--name)")
    others = tuple(sorted(groups.items(), key=lambda kv: kv[1]))
    return PullPlan(repo, commit, kind, tuple(chosen), store_name, endpoint(), others)


# -- finding models -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HubModel:
    repo: str
    kind: Literal["gguf", "mlx"]
    downloads: int


@dataclass(frozen=True, slots=True)
class Choice:
    spec: str  # what `localllm pull` takes: org/repo:QUANT, or org/repo for MLX
    label: str  # the quantization (or "MLX")
    size: int  # bytes to download


def search(query: str, *, limit: int = 20) -> list[HubModel]:
    """Model repositories on the hub that match `query` and hold GGUF files or an MLX
    model, most downloaded first (huggingface_hub's model listing, filtered by tag)."""
    from huggingface_hub import HfApi

    where = endpoint()
    api = HfApi(endpoint=where, token=_token())
    found: list[HubModel] = []
    try:
        _connect(where)  # offline: say so at once (huggingface_hub retries for ~20 s)
        for kind in ("gguf", "mlx"):
            for info in api.list_models(search=query, filter=kind, sort="downloads", limit=limit):
                found.append(HubModel(info.id, kind, int(info.downloads or 0)))
    except Exception as exc:
        raise _failure(query, exc, where) from None
    found.sort(key=lambda m: -m.downloads)
    return found[:limit]


def _connect(url: str, timeout: float = 3.0) -> None:
    """Open and close a TCP connection to the hub (OSError when it cannot be reached)."""
    import socket
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    with socket.create_connection((parts.hostname or "", port), timeout=timeout):
        pass


def choices(repo: str) -> list[Choice]:
    """What can be pulled from `repo`: each GGUF model (its shards together) with its
    size, or the whole MLX repository."""
    _commit, files = list_repo(repo)
    groups: dict[str, int] = {}
    for f in files:
        if f.path.lower().endswith(".gguf"):
            group = _group(f.path)
            groups[group] = groups.get(group, 0) + (f.size or 0)
    if groups:
        picked = [
            Choice(f"{repo}:{label}" if len(groups) > 1 else repo, label, size)
            for label, size in ((_label(g), n) for g, n in groups.items())
        ]
        return sorted(picked, key=lambda c: c.size)
    _kind, chosen = choose(repo, files, "")  # an MLX repository, or a clear refusal
    return [Choice(repo, "MLX", sum(f.size or 0 for f in chosen))]


# -- will it fit -------------------------------------------------------------------------


def estimate_remote(plan: PullPlan, n_ctx: int | None = None) -> fit.Estimate:
    """The memory the model will need, from its header (a GGUF's first megabytes or an MLX
    config.json), fetched before the download; the weights alone when it cannot be read."""
    with tempfile.TemporaryDirectory(prefix="localllm-probe-") as tmp:
        for probe in _HEADER_PROBES if plan.kind == "gguf" else (0,):
            try:
                meta = read_meta(_fetch_head(plan, Path(tmp), probe), plan.kind)
            except LocalLLMError:
                continue  # a header longer than the probe: read more
            except Exception as exc:
                log.info("could not read %s's header before the pull: %s", plan.repo, exc)
                break
            return fit.from_meta(plan.name, meta, plan.total, n_ctx)
    return fit.from_meta(plan.name, None, plan.total, n_ctx)


def _fetch_head(plan: PullPlan, folder: Path, nbytes: int) -> Path:
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = build_hf_headers(token=_token())
    if plan.kind == "gguf":
        url = hf_hub_url(plan.repo, plan.target, revision=plan.commit, endpoint=plan.endpoint)
        headers["Range"] = f"bytes=0-{nbytes - 1}"
        out = folder / "probe.gguf"
    else:
        url = hf_hub_url(plan.repo, "config.json", revision=plan.commit, endpoint=plan.endpoint)
        out = folder / "config.json"
    response = get_session().get(url, headers=headers, follow_redirects=True, timeout=30)
    hf_raise_for_status(response)
    out.write_bytes(response.content)
    return out if plan.kind == "gguf" else folder


# -- downloading ---------------------------------------------------------------------------


def _new_digest(f: RemoteFile) -> Any:
    """The hash the hub lists for a file, ready to take its bytes."""
    if f.sha256:
        return hashlib.sha256()
    if f.blob_id and f.size is not None:
        return hashlib.sha1(f"blob {f.size}\0".encode(), usedforsecurity=False)
    return hashlib.sha256()  # nothing to compare with; computed all the same


def _download(
    plan: PullPlan, f: RemoteFile, staging: Path, progress: Progress | None = None
) -> None:
    """One file into the staging folder, resumed from its .part file, checked as it streams,
    with huggingface_hub's progress bar."""
    from huggingface_hub import hf_hub_url

    _check_name(plan.repo, f.path)
    done = staging / local_path(plan, f)
    if done.is_file():
        return  # verified by an earlier run
    part = _part(done)
    # opened beneath the staging folder, never through a link planted in it
    with os.fdopen(Root(staging).open_append(str(part.relative_to(staging))), "ab") as fh:
        have = os.fstat(fh.fileno()).st_size
        if f.size is not None and have > f.size:
            os.ftruncate(fh.fileno(), 0)
            have = 0
        digest = _new_digest(f)
        offset = 0
        while offset < have:  # the bytes an earlier run left: hashed first
            block = os.pread(fh.fileno(), min(8 << 20, have - offset), offset)
            if not block:
                break
            digest.update(block)
            offset += len(block)
        url = hf_hub_url(plan.repo, f.path, revision=plan.commit, endpoint=plan.endpoint)
        sink = transfer.HashingFile(fh, lambda: _new_digest(f), digest)
        try:
            transfer.stream(
                url,
                sink,
                token=_token(),
                have=have,
                size=f.size,
                name=f.path.rsplit("/", 1)[-1],
                progress=progress,
            )
        finally:
            got = sink.finish()
    size = part.stat().st_size
    if f.size is not None and size != f.size:
        raise DownloadFailed(plan.repo, f"{f.path}: got {size} bytes, the hub lists {f.size}")
    want = f.sha256 or f.blob_id
    if want is not None and got != want:
        part.unlink()
        kind = "SHA-256" if f.sha256 else "git blob id"
        raise DownloadFailed(
            plan.repo,
            f"{f.path}: the {kind} of the download is {got}, the hub lists {want}; "
            "the file was deleted and nothing was added to the store",
        )
    os.replace(part, done)


def local_path(plan: PullPlan, f: RemoteFile) -> str:
    """Where a file goes in the model's folder: a GGUF's files side by side (the store
    finds one GGUF per folder), an MLX repository as it is laid out."""
    return f.path.rsplit("/", 1)[-1] if plan.kind == "gguf" else f.path


def staging_dir(models_dir: Path, plan: PullPlan) -> Path:
    return models_dir / f".pull-{plan.name}" / plan.commit


def existing(models_dir: Path, plan: PullPlan) -> Path | None:
    """The store folder of an earlier pull of the same files at the same commit."""
    folder = models_dir / plan.name
    meta = (read_provenance(folder) or {}).get("source")
    if not isinstance(meta, dict):
        return None
    same = meta.get("repo") == plan.repo and meta.get("commit") == plan.commit
    return folder if same and meta.get("files") == [f.path for f in plan.files] else None


def pull(plan: PullPlan, models_dir: Path, *, progress: Progress | None = None) -> Path:
    """Download, verify and move into the store; return the model's folder. A rerun after an
    interruption resumes every partial file. Pulls of one model name at once (two
    clients, the chat and the API) take turns: the first downloads, the others wait for
    it and then find the same model in the store (or resume what it left)."""
    done = existing(models_dir, plan)
    if done is not None:
        return done
    models_dir.mkdir(parents=True, exist_ok=True)
    with _turn(models_dir / f".pull-{plan.name}.lock"):
        return _pull(plan, models_dir, progress)


@contextlib.contextmanager
def _turn(path: Path) -> Iterator[None]:
    """Held by one pull of a model name at a time (an flock: a killed pull lets go)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _pull(plan: PullPlan, models_dir: Path, progress: Progress | None) -> Path:
    done = existing(models_dir, plan)  # another pull of it finished while this one waited
    if done is not None:
        return done
    target = models_dir / plan.name
    if target.exists() or (models_dir / f"{plan.name}.gguf").exists():
        raise DownloadFailed(
            plan.repo, f"the store already has a model named {plan.name}; choose --name"
        )
    staging = staging_dir(models_dir, plan)
    staging.mkdir(parents=True, exist_ok=True)
    for old in staging.parent.iterdir():  # partial files of another commit cannot resume
        if old != staging:
            shutil.rmtree(old, ignore_errors=True)
    todo = [staging / local_path(plan, f) for f in plan.files]
    left = sum(f.size or 0 for f, path in zip(plan.files, todo, strict=True) if not path.is_file())
    left -= sum(_part(path).stat().st_size for path in todo if _part(path).is_file())
    free = shutil.disk_usage(staging).free
    if left > free:
        raise DownloadFailed(
            plan.repo,
            f"it needs {format_bytes(left)} more on disk and {format_bytes(free)} is free "
            f"at {models_dir}",
        )
    for f in plan.files:
        try:
            _download(plan, f, staging, progress)
        except LocalLLMError:
            raise
        except Exception as exc:
            raise _failure(plan.repo, exc, plan.endpoint) from None
    provenance = {
        "source": {
            "kind": "pull",
            "repo": plan.repo,
            "commit": plan.commit,
            "endpoint": plan.endpoint,
            "files": [f.path for f in plan.files],
            "sha256": {f.path: f.sha256 for f in plan.files if f.sha256},
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
    }
    (staging / PROVENANCE).write_text(json.dumps(provenance, indent=2), encoding="utf-8")
    os.replace(staging, target)  # the store sees the model only now, complete
    with contextlib.suppress(OSError):
        shutil.rmtree(staging.parent)
    return target


def _part(done: Path) -> Path:
    """Where a file's bytes gather until it is complete and checked."""
    return done.with_name(done.name + ".part")
