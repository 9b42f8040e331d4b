"""Typed errors that cross module boundaries.

Every error a user can cause carries the numbers that explain it, and maps to
one HTTP status and OpenAI error code at the wire (see `server/errors.py`).
"""

from __future__ import annotations

from collections.abc import Sequence


class LocalLLMError(Exception):
    """Base of every error localllm raises on purpose."""

    status: int = 500
    code: str | None = None
    error_type: str = "server_error"
    param: str | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        # what a remote client is told, where `message` names files on this machine
        self.public_message = message


class InvalidRequest(LocalLLMError):
    """A request value that is out of range or of the wrong shape."""

    status = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class ContextOverflow(LocalLLMError):
    """The prompt does not fit in the model's context window."""

    status = 400
    error_type = "invalid_request_error"
    code = "context_length_exceeded"
    param = "messages"

    def __init__(self, prompt_tokens: int, n_ctx: int, *, at_least: bool = False) -> None:
        if at_least:
            has = f"{prompt_tokens} or more tokens (judged from its size)"
        else:
            has = f"{prompt_tokens} tokens"
        super().__init__(
            f"This model's context window is {n_ctx} tokens, but the prompt has {has}; "
            f"shorten it by at least {prompt_tokens - n_ctx + 1} tokens "
            f"or load the model with a larger context."
        )
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


class ModelNotFound(LocalLLMError):
    """A model name or path that resolves to nothing local."""

    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"
    param = "model"

    def __init__(self, name: str, available: Sequence[str] = (), *, detail: str = "") -> None:
        listing = ", ".join(available) if available else "none"
        extra = f" ({detail})" if detail else ""
        super().__init__(f"Model '{name}' was not found{extra}. Local models: {listing}.")
        self.name = name
        self.available = tuple(available)


class ModelLoadError(LocalLLMError):
    """A model file exists but could not be loaded."""

    status = 500
    code = "model_load_failed"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"Could not load model {path}: {reason}")
        self.path = path
        self.reason = reason
        name = path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
        self.public_message = f"Could not load model {name}; the server's log says why."


class DamagedModel(ModelLoadError):
    """A model file whose header is damaged or malformed: the file is at fault, not the
    machine (a 400 to a client, exit code 2 from the CLI)."""

    status = 400
    error_type = "invalid_request_error"
    code = "model_damaged"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        name = path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
        self.public_message = f"The model file {name} is damaged: {reason}"


class AdapterMismatch(DamagedModel):
    """A LoRA adapter that llama.cpp refuses for the model it was loaded with (another
    architecture, tensors of other shapes): the files are at fault (a 400, exit code 2)."""

    code = "lora_mismatch"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        name = path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
        self.message = f"The LoRA adapter {path} does not fit the model: {reason}"
        self.public_message = f"The LoRA adapter {name} does not fit the model: {reason}"


class BackendUnavailable(LocalLLMError):
    """The backend a model needs is not installed or not supported here."""

    status = 400
    error_type = "invalid_request_error"
    code = "backend_unavailable"

    def __init__(self, backend: str, hint: str) -> None:
        super().__init__(f"The {backend} backend is not available: {hint}")
        self.backend = backend
        self.hint = hint


class ImportFailed(LocalLLMError):
    """A GGUF that cannot be imported into another format (an architecture, a tensor type)."""

    status = 400
    error_type = "invalid_request_error"
    code = "model_import_failed"

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"Cannot import {source}: {reason}")
        self.public_message = "Cannot import the model for MLX; the server's log says why."
        self.source = source
        self.reason = reason


class FimUnsupported(LocalLLMError):
    """`suffix` was given for a model without fill-in-the-middle tokens."""

    status = 400
    error_type = "invalid_request_error"
    code = "fim_not_supported"
    param = "suffix"

    def __init__(self, model: str) -> None:
        super().__init__(
            f"Model '{model}' has no fill-in-the-middle tokens (FIM prefix/suffix/middle), "
            "so 'suffix' cannot be used with it."
        )
        self.model = model


class QuotaExceeded(LocalLLMError):
    """An API key's tokens for the day would not cover the request's prompt."""

    status = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AdminRequired(LocalLLMError):
    """A client key asked for what changes the server for every client (server/guard.py)."""

    status = 403
    error_type = "permission_error"
    code = "admin_required"

    def __init__(self, what: str, client: str) -> None:
        super().__init__(
            f"{what} changes the server for every client: it needs an admin key, and the key "
            f"'{client}' is a client key (make an admin key with `localllm keys add NAME "
            "--admin`)."
        )


class ReaderStalled(LocalLLMError):
    """A streaming client took none of its answer for longer than its bound (or had fallen
    behind while a priority request waited for its sequence): its stream ends with this
    error, its sequence free for the next request."""

    status = 408
    error_type = "timeout_error"
    code = "client_stalled"

    def __init__(
        self, behind_s: float, bound_s: float, waiting: int, *, priority: bool = False
    ) -> None:
        if priority:
            why = (
                f"its client had taken none of the answer for {behind_s:.0f} s and a "
                "priority request needed its sequence"
            )
        else:
            why = (
                f"its client took none of the answer for {behind_s:.0f} s "
                f"(stall_timeout_s = {bound_s:g})"
            )
        more = f"; {waiting} other request(s) waited" if waiting else ""
        super().__init__(f"The stream was ended: {why}{more}.")


class BadModelOutput(LocalLLMError):
    """A model computed numbers that are not numbers (NaN or infinity: a damaged file or
    a head that overflows): a 502 naming the model and the input, never a 500 or a JSON
    body no client can parse."""

    status = 502
    code = "non_finite_output"

    def __init__(self, model: str, what: str, index: int) -> None:
        super().__init__(
            f"{model} computed a value that is not a finite number (NaN or infinity) for "
            f"{what} input {index}: the model file may be damaged, or its head overflows "
            "on this input"
        )


class ClientLeft(LocalLLMError):
    """The client went away before its answer was done: the rest was not computed (the
    status is nginx's 499, for the access log; nobody is left to read it)."""

    status = 499
    code = "client_closed_request"

    def __init__(self, done: int, total: int) -> None:
        super().__init__(f"The client left after {done} of {total} inputs were computed.")


class ServerBusy(LocalLLMError):
    """The request queue is full."""

    status = 503
    error_type = "server_error"
    code = "server_busy"

    def __init__(self, queued: int, limit: int, retry_after: int = 1) -> None:
        super().__init__(
            f"The server is busy: {queued} requests are queued (limit {limit}). "
            f"Retry in {retry_after} s."
        )
        self.queued = queued
        self.limit = limit
        self.retry_after = retry_after


class ConfigError(LocalLLMError):
    """A configuration file or environment value that cannot be used."""

    code = "config_error"


class ModelTooLarge(LocalLLMError):
    """Loading a model would take more memory than is free (unless forced)."""

    status = 400
    error_type = "invalid_request_error"
    code = "model_too_large"
    param = "model"

    def __init__(
        self, name: str, need_text: str, need: int, free_text: str, free: int, hint: str
    ) -> None:
        super().__init__(
            f"Model '{name}' needs {need_text}, but only {free_text}. Try {hint}; "
            "or load it anyway with --force (force_load = true)."
        )
        self.name, self.need, self.free, self.hint = name, need, free, hint


class DownloadFailed(LocalLLMError):
    """A pull that could not complete: a missing or gated repository, the network, the disk."""

    status = 400
    error_type = "invalid_request_error"
    code = "download_failed"

    def __init__(self, repo: str, reason: str) -> None:
        super().__init__(f"Cannot pull {repo}: {reason}")
        self.repo = repo
        self.reason = reason


class QuantizeFailed(LocalLLMError):
    """A quantization that cannot start or did not finish (nothing is left in the store)."""

    status = 400
    error_type = "invalid_request_error"
    code = "quantize_failed"

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"Cannot quantize {source}: {reason}")
        self.source = source
        self.reason = reason


class RemoteUnavailable(LocalLLMError):
    """A registered remote engine cannot answer now: unreachable, timed out, overloaded
    after retries, or marked down by its circuit breaker."""

    status = 503
    code = "remote_unavailable"

    def __init__(self, remote: str, reason: str, *, retry_after_s: float | None = None) -> None:
        hint = f"; retry in {retry_after_s:.0f} s" if retry_after_s else ""
        super().__init__(f"Remote engine '{remote}' is unavailable: {reason}{hint}")
        self.remote = remote
        self.reason = reason
        self.retry_after_s = retry_after_s


class RemoteRejected(LocalLLMError):
    """A remote engine refused the request (a 4xx of its own): its status and message
    are passed on, so the client learns what the engine said."""

    error_type = "invalid_request_error"

    def __init__(self, remote: str, status: int, message: str) -> None:
        super().__init__(f"Remote engine '{remote}' refused the request ({status}): {message}")
        self.status = status if 400 <= status < 500 else 502
        self.code = "remote_rejected"
