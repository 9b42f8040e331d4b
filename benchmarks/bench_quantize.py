"""Quantization on the starter model: time per type, then size / speed / perplexity.

Part 1, time. F16 is made from the bundled Q4_1 starter; every other type from
that F16. `localllm` is `models.quantize` as the command runs it (checks, a
child process, staging, provenance); its peer is the same quantizer called
bare in this process: `llama_model_quantize` for the GGUF types and
`mlx_lm.convert` (on the F16's MLX import) for the MLX ones. Both sides
alternate, ROUNDS times each; the figures are medians.

Part 2, quality. For F16, Q8_0, Q4_0, Q4_1 (llama.cpp) and mlx-4bit (MLX, group
size 64): file size, greedy decode tokens/s (64 tokens), and perplexity on the
shipped held-out text in windows of 512 tokens (second halves scored, as
llama-perplexity does). llama.cpp models are scored on the whole text; MLX reads
a prompt at about 7 tokens/s on this CPU, so all five are also scored on the
first MLX_TOKENS tokens, the column the MLX row can be compared in.

    python -m benchmarks.bench_quantize [--rounds N] [--mlx-tokens N] [--skip-quality]
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine
from localllm.backends.base import ModelRef
from localllm.engine.evaluate import heldout_text, load_for_eval, perplexity
from localllm.models import quantize as q
from localllm.models.starter import starter_path
from localllm.models.store import dir_size
from localllm.units import format_bytes

THREADS = 2


def ours(source: ModelRef, target: str, models: Path, name: str) -> float:
    plan = q.plan_quantize(
        source, target, models_dir=models, name=name, allow_requantize=target != "f16"
    )
    t0 = time.perf_counter()
    q.quantize(plan, models, n_threads=THREADS)
    return time.perf_counter() - t0


def bare_gguf(source: Path, target: str, out: Path) -> float:
    import llama_cpp as ll

    params = ll.llama_model_quantize_default_params()
    params.ftype, params.nthread, params.allow_requantize = q.GGUF_TYPES[target], THREADS, True
    t0 = time.perf_counter()
    rc = ll.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params))
    elapsed = time.perf_counter() - t0
    assert rc == 0, rc
    return elapsed


def bare_mlx(import_dir: Path, target: str, out: Path) -> float:
    from mlx_lm import convert

    t0 = time.perf_counter()
    convert(str(import_dir), str(out), quantize=True, q_bits=q.MLX_TYPES[target], q_group_size=64)
    return time.perf_counter() - t0


def timing(root: Path, rounds: int) -> tuple[ModelRef, dict[str, ModelRef]]:
    models = root / "models"
    starter = ModelRef("starter", starter_path(), "gguf", "starter")  # type: ignore[arg-type]
    f16_plan = q.plan_quantize(starter, "f16", models_dir=models)
    f16 = q.quantize(f16_plan, models, n_threads=THREADS).ref
    from localllm.models.convert import ensure_import

    f16_mlx = ensure_import(f16, models)
    rows, made = [], {"f16": f16}
    for target in ("f16", "q4_0", "q4_1", "q8_0", "q4_k_m", "q5_k_m", "mlx-4bit", "mlx-8bit"):
        src = starter if target == "f16" else f16
        a, b, size = [], [], 0
        for r in range(rounds):
            name = f"{target}-{r}"
            a.append(ours(src, target, models, name))
            out = root / f"bare-{name}"
            if target in q.MLX_TYPES:
                b.append(bare_mlx(f16_mlx.path, target, out))
                shutil.rmtree(out)
            else:
                b.append(bare_gguf(src.path, target, out))
                out.unlink()
            folder = models / name
            size = size or dir_size(folder)
            if r == 0 and target != "f16":
                made[target] = _ref(folder, name)
            else:
                shutil.rmtree(folder)
        ma, mb = statistics.median(a), statistics.median(b)
        rows.append((target, src.name, ma, mb, ma / mb, size))
    print("| type | from | localllm quantize | bare quantizer | ratio | size |")
    print("|---|---|---|---|---|---|")
    for target, src_name, ma, mb, ratio, size in rows:
        sz = format_bytes(size)
        print(f"| {target} | {src_name} | {ma:.2f} s | {mb:.2f} s | {ratio:.2f} | {sz} |")
    return starter, made


def _ref(folder: Path, name: str) -> ModelRef:
    gguf = folder / f"{name}.gguf"
    if gguf.exists():
        return ModelRef(name, gguf, "gguf", "store", gguf.stat().st_size)
    return ModelRef(name, folder, "mlx", "store", dir_size(folder))


def quality(made: dict[str, ModelRef], models: Path, mlx_tokens: int) -> None:
    from localllm.engine.evaluate import decode_speed

    text = heldout_text()
    print(
        f"\n| model | backend | size | decode tok/s | perplexity, whole text | "
        f"perplexity, first {mlx_tokens} tokens |"
    )
    print("|---|---|---|---|---|---|")
    for target in ("f16", "q8_0", "q4_0", "q4_1", "mlx-4bit"):
        ref = made[target]
        model = load_for_eval(ref, models_dir=models, n_threads=THREADS)
        try:
            tps = decode_speed(model)
            short = perplexity(model, text, max_tokens=mlx_tokens)
            whole = (
                f"{perplexity(model, text).value:.3f}" if model.info.backend != "mlx" else "-"
            )
            print(
                f"| {target} | {model.info.backend} | {format_bytes(ref.size_bytes)} | "
                f"{tps:.1f} | {whole} | {short.value:.3f} ({short.scored} scored) |",
                flush=True,
            )
        finally:
            model.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mlx-tokens", type=int, default=1024)
    parser.add_argument("--skip-quality", action="store_true")
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory(prefix="bench-quantize-") as tmp:
        root = Path(tmp)
        _, made = timing(root, args.rounds)
        if not args.skip_quality:
            quality(made, root / "models", args.mlx_tokens)


if __name__ == "__main__":
    main()
