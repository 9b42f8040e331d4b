"""Real OpenAI-compatible engines for the remote-backend tests: llama-cpp-python's own
server (`python -m llama_cpp.server`), started as a child process on a free port.

On a CPU with AMX its weights are loaded as localllm's backend loads them (see
`backends.llamacpp_native.plain_cpu_buffers`): ggml's AMX kernels crash on batches there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.conftest import THREADS, ServerProcess

_LAUNCH = (
    "import runpy\n"
    "from localllm.backends.llamacpp_native import plain_cpu_buffers\n"
    "with plain_cpu_buffers():\n"
    "    runpy.run_module('llama_cpp.server', run_name='__main__', alter_sys=True)\n"
)


class LlamaCppServer(ServerProcess):
    """llama_cpp.server serving one GGUF as `alias`."""

    ready_path = "/v1/models"
    log_prefix = "llama-cpp-server"

    def __init__(self, tmp: Path, model: Path, alias: str, *, n_ctx: int = 2048,
                 port: int | None = None, threads: int = THREADS) -> None:
        self.engine_args = ["--model", str(model), "--model_alias", alias, "--n_ctx",
                            str(n_ctx), "--n_threads", str(threads), "--verbose", "false"]
        super().__init__(tmp, port=port)

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-c", _LAUNCH, *self.engine_args, "--port", str(self.port)]
