"""Images through the endpoint: localllm beside llama.cpp's own llama-server, in one run.

Both serve the starter with the same tiny LLaVA-style projector (tests/gguf_fixtures.py:
random weights, 16 image tokens per picture) on two threads, and are asked the same
things over HTTP, one server at a time, in alternating order over `--rounds` rounds, a
fresh server and fresh pictures (640x480 PNG of noise) per round:

- a new picture and a question: time to the first token (decoding the file, laying the
  prompt out, encoding the picture, reading the prompt);
- the same request again: time to the first token and the prompt's cached share (the
  picture's KV found again by its hash);
- the next turn of that conversation (the picture earlier in it): the same two figures.

The projector is tiny, so these measure the plumbing around a picture, not a vision
tower. llama-server: set LLAMA_SERVER (see benchmarks/bench_concurrency.py).
Run: python -m benchmarks.bench_vision
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.bench_concurrency import Result, stream
from benchmarks.common import Server, machine, same_kernels
from localllm.models.starter import starter_path

THREADS = 2


class LlamaServer(Server):
    def __init__(self, binary: str, mmproj: Path) -> None:
        self.binary, self.mmproj = binary, mmproj
        super().__init__()

    def command(self, *args: str) -> list[str]:
        cmd = [self.binary, "-m", str(starter_path()), "--mmproj", str(self.mmproj)]
        cmd += ["--port", str(self.port), "-t", str(THREADS), "-tb", str(THREADS)]
        return [*cmd, "-c", "16384", "-np", "4", *same_kernels(), *args]


def picture(seed: int) -> str:
    import io

    import numpy as np
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((480, 640, 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def ask(base: str, messages: list[dict[str, Any]]) -> Result:
    body = {"model": "starter", "messages": messages, "max_tokens": 8, "temperature": 0,
            "repeat_penalty": 1.0}
    return stream(base, "/v1/chat/completions", body)


def measure(base: str, seed: int) -> dict[str, float]:
    first = [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture? Describe it."},
        {"type": "image_url", "image_url": {"url": picture(seed)}}]}]
    cold = ask(base, first)
    again = ask(base, first)
    turn = [*first, {"role": "assistant", "content": cold.text},
            {"role": "user", "content": "And what colours does it have?"}]
    follow = ask(base, turn)
    return {
        "new picture: first token s": cold.ttft,
        "same again: first token s": again.ttft,
        "same again: cached share": again.cached / max(1, again.prompt_tokens),
        "next turn: first token s": follow.ttft,
        "next turn: cached share": follow.cached / max(1, follow.prompt_tokens),
    }


def main() -> None:
    from tests.gguf_fixtures import tiny_projector

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    binary = os.environ.get("LLAMA_SERVER")
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        proj = tiny_projector(Path(tmp) / "mmproj.gguf")
        names = ["localllm"] + (["llama-server"] if binary else [])
        rows: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        for rnd in range(args.rounds):
            for name in names if rnd % 2 == 0 else names[::-1]:
                server: Any = (
                    LlamaServer(str(binary), proj)
                    if name == "llama-server"
                    else Server("--threads", str(THREADS), "--parallel", "4", "--mmproj", str(proj))
                )
                try:
                    rows[name].append(measure(server.base, seed=1000 + rnd))
                finally:
                    server.stop()
                print(name, {k: round(v, 3) for k, v in rows[name][-1].items()}, flush=True)
    print(f"\nmedians over {args.rounds} rounds")
    print(f"{'':30}" + "".join(f"{n:>16}" for n in names))
    for key in rows["localllm"][0]:
        cells = [f"{statistics.median(r[key] for r in rows[n]):16.3f}" for n in names]
        print(f"{key:30}" + "".join(cells))


if __name__ == "__main__":
    main()
